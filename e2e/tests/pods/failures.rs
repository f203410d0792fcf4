//! What goes wrong in a pod and what the task and Conductor then say: a stopping pod, a body
//! killed by its memory limit, a sidecar killed mid-attempt, pods that cannot start, a full
//! work volume, a Deployment the API server refuses.

use super::*;

const SLOW_BODY: &str = r#"
set -eu
echo "body started $PERAGO_EXECUTION_ID"
sleep 8
echo "written while the pod was stopping" > "$PERAGO_WORKSPACE/drained-$PERAGO_TASK_ID.txt"
printf '{"files": 1}' > "$PERAGO_RESULT"
echo "body finished $PERAGO_EXECUTION_ID"
"#;

/// A pod told to stop (scale-in, then a rollout) stops polling, finishes the attempt it runs,
/// publishes and reports it, and only then exits, within the grace period the operator set.
#[tokio::test]
async fn a_stopping_pod_publishes_and_reports_its_attempt_before_it_exits() {
    let Some((_turn, services, cluster)) =
        cluster("a_stopping_pod_publishes_and_reports_its_attempt_before_it_exits").await
    else {
        return;
    };
    let (namespace, name) = ("pods-drain", "drain");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task(namespace, name, SLOW_BODY))
        .unwrap();
    let client = services.kube().client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let (lake, repository, mut head) = seeded(services, "pods-drain").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);

    for (case, stop) in [("scale-in", "scale"), ("rollout", "patch")] {
        cluster.wait_ready(namespace, name).unwrap();
        let pod = task_pod(&client, namespace, name).await;
        let pod_name = pod.metadata.name.clone().unwrap();
        let grace = pod
            .spec
            .as_ref()
            .unwrap()
            .termination_grace_period_seconds
            .unwrap();
        let workflow = start_step(&conductor, namespace, name, case, &repository, &head, 1).await;
        wait_for_log(cluster, namespace, &pod_name, "body", "body started").await;
        let told = std::time::SystemTime::now();
        match stop {
            "scale" => cluster.kubectl(&[
                "scale",
                "-n",
                namespace,
                &format!("peragotask/{name}"),
                "--replicas=0",
            ]),
            _ => cluster.kubectl(&[
                "patch",
                "-n",
                namespace,
                &format!("peragotask/{name}"),
                "--type=merge",
                "-p",
                r#"{"spec":{"executor":{"body":{"env":[{"name":"ROLLED","value":"1"}]}}}}"#,
            ]),
        }
        .unwrap();
        let gone = wait_gone(
            &pods,
            &pod_name,
            Duration::from_secs(u64::try_from(grace).unwrap() + 15),
        )
        .await;
        let finished = conductor.finished(&workflow).await;
        let tasks = finished["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 1, "{case}: one attempt, no retry: {finished}");
        let step = &tasks[0];
        assert_eq!(step["status"], "COMPLETED", "{case}: {step}");
        assert!(
            step["workerId"].as_str().unwrap().contains(&pod_name),
            "{case}: {step}"
        );
        let reported =
            std::time::UNIX_EPOCH + Duration::from_millis(step["endTime"].as_u64().unwrap());
        assert!(
            reported <= gone,
            "{case}: reported at {reported:?}, after the pod was gone at {gone:?}"
        );
        let stopping = gone.duration_since(told).unwrap();
        assert!(
            stopping < Duration::from_secs(u64::try_from(grace).unwrap()),
            "{case}: the pod took {stopping:?} to stop, beyond its grace of {grace} s"
        );
        eprintln!(
            "{case}: pod {pod_name} told to stop during its attempt; COMPLETED {:.1?} and gone {stopping:.1?} after (grace {grace} s)",
            reported.duration_since(told).unwrap_or_default(),
        );

        // Published once: one squash commit on the previous head, holding the file.
        let new_head = step["outputData"]["workspace"]["ref"]
            .as_str()
            .unwrap()
            .to_owned();
        let commit = lake
            .get(&format!("/repositories/{repository}/commits/{new_head}"))
            .await
            .unwrap();
        assert_eq!(commit["parents"], json!([head]), "{case}: {commit}");
        let task_id = step["taskId"].as_str().unwrap();
        assert!(
            lake.tree(&repository, &new_head)
                .await
                .unwrap()
                .contains_key(&format!("data/drained-{task_id}.txt"))
        );
        head = new_head;
        if stop == "scale" {
            cluster
                .kubectl(&[
                    "scale",
                    "-n",
                    namespace,
                    &format!("peragotask/{name}"),
                    "--replicas=1",
                ])
                .unwrap();
        }
    }
    let branches = lake
        .get(&format!("/repositories/{repository}/branches"))
        .await
        .unwrap();
    assert_eq!(
        branches["results"].as_array().unwrap().len(),
        1,
        "{branches}"
    );
}

const GREEDY_BODY: &str = r#"
set -eu
if [ "$PERAGO_RETRY_COUNT" = 0 ]; then
  echo "body: holding 200 MB in a 48 MiB container"
  greedy=$(yes | head -c 200000000)
  echo "never reached ${#greedy}"
fi
echo "retry $PERAGO_RETRY_COUNT fits" > "$PERAGO_WORKSPACE/fits.txt"
printf '{"files": 1}' > "$PERAGO_RESULT"
"#;

/// A body its container's memory limit kills: the attempt fails saying so, the retry
/// publishes once.
#[tokio::test]
async fn a_body_killed_by_its_memory_limit_fails_saying_so_and_the_retry_publishes_once() {
    let Some((_turn, services, cluster)) =
        cluster("a_body_killed_by_its_memory_limit_fails_saying_so_and_the_retry_publishes_once")
            .await
    else {
        return;
    };
    let (namespace, name) = ("pods-oom", "greedy");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task_with(
            namespace,
            name,
            GREEDY_BODY,
            &json!({"executor": {"body": {"resources": {
                "requests": {"memory": "48Mi"}, "limits": {"memory": "48Mi"}
            }}}}),
        ))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (lake, repository, input_ref) = seeded(services, "pods-oom").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "oom",
        &repository,
        &input_ref,
        1,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    let tasks = finished["tasks"].as_array().unwrap();
    let statuses: Vec<&str> = tasks
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["FAILED", "COMPLETED"], "{finished}");
    let reason = tasks[0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.contains("exited while running task")
            && reason.ends_with(
                "the task body was killed by the out-of-memory killer: its container reached \
                 its memory limit"
            ),
        "{reason}"
    );
    let head = tasks[1]["outputData"]["workspace"]["ref"].as_str().unwrap();
    let commit = lake
        .get(&format!("/repositories/{repository}/commits/{head}"))
        .await
        .unwrap();
    assert_eq!(commit["parents"], json!([input_ref]), "published once");
    assert_eq!(commit["metadata"]["perago.retry_count"], "1");
    assert_eq!(
        lake.object(&repository, head, "data/fits.txt")
            .await
            .unwrap(),
        "retry 1 fits\n"
    );
    // The container itself was not restarted: the runner, its PID 1, survived the kill.
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let body = pod
        .status
        .unwrap()
        .container_statuses
        .unwrap()
        .into_iter()
        .find(|c| c.name == "body")
        .unwrap();
    assert_eq!(body.restart_count, 0, "{body:?}");
    eprintln!("OOM-killed attempt reported as: {reason}");
}

/// The sidecar container killed mid-attempt (SIGKILL through containerd, as a crash would):
/// the kubelet restarts it, the orphaned attempt times out in Conductor, and the retry the
/// restarted sidecar takes publishes once, with no staging branch left behind.
#[tokio::test]
async fn a_sidecar_killed_mid_attempt_is_retried_and_publishes_once() {
    let Some((_turn, services, cluster)) =
        cluster("a_sidecar_killed_mid_attempt_is_retried_and_publishes_once").await
    else {
        return;
    };
    let (namespace, name) = ("pods-sidecar-kill", "orphan");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task_with(
            namespace,
            name,
            SLOW_BODY,
            &json!({"controls": {"timeout": {"seconds": 60, "responseSeconds": 5}}}),
        ))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    let (lake, repository, input_ref) = seeded(services, "pods-sidecar-kill").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "sidecar-kill",
        &repository,
        &input_ref,
        1,
    )
    .await;
    wait_for_log(cluster, namespace, &pod_name, "body", "body started").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let sidecar_id = pods
        .get(&pod_name)
        .await
        .unwrap()
        .status
        .unwrap()
        .init_container_statuses
        .unwrap()
        .into_iter()
        .find(|c| c.name == "perago-sidecar")
        .and_then(|c| c.container_id)
        .unwrap();
    let sidecar_id = sidecar_id.trim_start_matches("containerd://");
    ctr(
        &services.node().containerd.socket,
        &["tasks", "kill", "--signal", "SIGKILL", sidecar_id],
    )
    .unwrap();

    let finished = conductor.finished(&workflow).await;
    let tasks = finished["tasks"].as_array().unwrap();
    let statuses: Vec<&str> = tasks
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses.last(),
        Some(&"COMPLETED"),
        "{statuses:?}: {finished}"
    );
    assert!(
        statuses.len() >= 2
            && statuses[..statuses.len() - 1]
                .iter()
                .all(|s| *s != "COMPLETED"),
        "the killed attempt did not complete: {statuses:?}"
    );
    eprintln!(
        "sidecar killed mid-attempt: attempts {statuses:?}, first reason {}",
        tasks[0]["reasonForIncompletion"]
    );
    let last = tasks.last().unwrap();
    let head = last["outputData"]["workspace"]["ref"].as_str().unwrap();
    let commit = lake
        .get(&format!("/repositories/{repository}/commits/{head}"))
        .await
        .unwrap();
    assert_eq!(commit["parents"], json!([input_ref]), "published once");
    let branches = lake
        .get(&format!("/repositories/{repository}/branches"))
        .await
        .unwrap();
    assert_eq!(
        branches["results"].as_array().unwrap().len(),
        1,
        "no staging branch left: {branches}"
    );
    let sidecar = pods
        .get(&pod_name)
        .await
        .unwrap()
        .status
        .unwrap()
        .init_container_statuses
        .unwrap()
        .into_iter()
        .find(|c| c.name == "perago-sidecar")
        .unwrap();
    assert_eq!(
        sidecar.restart_count, 1,
        "the kubelet restarted the sidecar: {sidecar:?}"
    );
}

/// Executor pods that cannot start (image missing, sidecar crash-looping on bad settings,
/// unschedulable, refused by Pod Security admission) show in the PeragoTask's status and events with the pod's own reason.
#[tokio::test]
async fn pods_that_cannot_start_show_in_the_task_status_and_events() {
    let Some((_turn, services, cluster)) =
        cluster("pods_that_cannot_start_show_in_the_task_status_and_events").await
    else {
        return;
    };
    let namespace = "pods-failing";
    cluster.task_namespace(namespace).unwrap();
    // A lakeFS Secret whose keys are empty: the sidecar refuses to start without them.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: empty-lakefs\n  namespace: {namespace}\n\
             stringData:\n  LAKECTL_CREDENTIALS_ACCESS_KEY_ID: \"\"\n  LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY: \"\"\n"
        ))
        .unwrap();
    let cases: [(&str, serde_json::Value, &[&str], &str); 5] = [
        (
            "missing-image",
            json!({"executor": {"body": {"image": "localhost/perago/absent:e2e"}}}),
            &["ErrImagePull", "ImagePullBackOff"],
            "container body: ",
        ),
        (
            "bad-settings",
            json!({"lakefs": {"credentialsSecret": "empty-lakefs"}}),
            &["CrashLoopBackOff"],
            "LakeFS config is incomplete",
        ),
        (
            // The node's lakeFS keeps its objects in its local blockstore, which cannot presign.
            "cannot-presign",
            json!({"lakefs": {"dataPath": "presigned", "objectStoreHosts": ["objects.example.com:9000"]}}),
            &["CrashLoopBackOff"],
            "dataPath is presigned, but lakeFS cannot presign URLs for its 'local' blockstore",
        ),
        (
            "unschedulable",
            json!({"executor": {"body": {"resources": {"requests": {"cpu": "64"}}}}}),
            &["Unschedulable"],
            "Insufficient cpu",
        ),
        (
            // The namespace enforces Pod Security `restricted`: no pod is even created.
            "privileged",
            json!({"executor": {"body": {"securityContext": {"privileged": true}}}}),
            &["FailedCreate"],
            "violates PodSecurity \"restricted:latest\"",
        ),
    ];
    for (name, spec, _, _) in &cases {
        cluster
            .apply(&workspace_task_with(namespace, name, PUBLISH_BODY, spec))
            .unwrap();
    }
    let client = services.kube().client().await.unwrap();
    for (name, _, reasons, text) in &cases {
        let ready = ready_condition(&client, namespace, name, reasons).await;
        assert_eq!(ready.status, "False", "{name}: {ready:?}");
        assert!(ready.message.contains(text), "{name}: {}", ready.message);
        let events = cluster
            .kubectl(&[
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                &format!(
                    "involvedObject.kind=PeragoTask,involvedObject.name={name},reason=ExecutorPodFailing"
                ),
                "-o",
                "jsonpath={.items[*].message}",
            ])
            .unwrap();
        assert!(
            events.contains(text),
            "{name}: no ExecutorPodFailing event saying {text:?}: {events:?}"
        );
        eprintln!("{name}: Ready=False {}: {}", ready.reason, ready.message);
    }
}

/// A workspace larger than the pod's work volume (a 16 MiB tmpfs, as the kubelet mounts a
/// memory emptyDir with its size limit): the download fails naming the write and the full
/// device, nothing is published and no staging branch is made, the attempt's files are
/// removed, and the same pod then publishes a workspace that fits.
#[tokio::test]
async fn a_full_work_volume_fails_the_download_and_the_pod_serves_on() {
    let Some((_turn, services, cluster)) =
        cluster("a_full_work_volume_fails_the_download_and_the_pod_serves_on").await
    else {
        return;
    };
    let (namespace, name) = ("pods-full", "full");
    cluster.task_namespace(namespace).unwrap();
    let spec = json!({
        "controls": {"retry": {"count": 0, "logic": "FIXED", "delaySeconds": 0}},
        "executor": {"workVolume": {"emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}},
    });
    cluster
        .apply(&workspace_task_with(namespace, name, PUBLISH_BODY, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let lake = Lake::of(services.lakefs());
    let repository = format!("pods-full-{}", std::process::id());
    let big = "x".repeat(24 << 20);
    let too_big = lake
        .seed(
            &repository,
            &[("data/in.txt", "seed"), ("data/big.bin", &big)],
        )
        .await
        .unwrap();
    let conductor = ConductorApi::new(&services.conductor().api_url);

    let failed = start_step(
        &conductor,
        namespace,
        name,
        "full",
        &repository,
        &too_big,
        1,
    )
    .await;
    let finished = conductor.finished(&failed).await;
    assert_eq!(finished["status"], "FAILED", "{finished}");
    let reason = finished["tasks"][0]["reasonForIncompletion"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("No space left on device") && reason.contains("big.bin"),
        "the reason names the write and the full device: {reason}"
    );
    let head = lake
        .get(&format!("/repositories/{repository}/branches/main"))
        .await
        .unwrap();
    assert_eq!(head["commit_id"], json!(too_big), "nothing published");
    let staging = lake
        .get(&format!(
            "/repositories/{repository}/branches?prefix=perago-staging-"
        ))
        .await
        .unwrap();
    assert_eq!(
        staging["results"],
        json!([]),
        "no staging branch: {staging}"
    );

    // The same pod serves on: the failed attempt's files are gone, and a workspace that fits
    // is published.
    let (lake, small, input_ref) = seeded(services, "pods-full-small").await;
    let ok = start_step(&conductor, namespace, name, "fits", &small, &input_ref, 2).await;
    let done = conductor.finished(&ok).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(
        done["tasks"][0]["workerId"], finished["tasks"][0]["workerId"],
        "the same pod"
    );
    let head = done["tasks"][0]["outputData"]["workspace"]["ref"]
        .as_str()
        .unwrap();
    assert_eq!(
        lake.object(&small, head, "data/out/part-1.txt")
            .await
            .unwrap(),
        "row 1 of seed\n"
    );
}

/// An admission policy that refuses the executor's Deployment: the task is not Ready and says
/// what refused it, in the API server's words; once the policy goes, the task becomes Ready
/// without a change of its own.
#[tokio::test]
async fn a_deployment_the_api_server_refuses_shows_in_the_task_status() {
    let Some((_turn, services, cluster)) =
        cluster("a_deployment_the_api_server_refuses_shows_in_the_task_status").await
    else {
        return;
    };
    let namespace = "pods-refused";
    cluster.task_namespace(namespace).unwrap();
    let policy = "perago-e2e-frozen-deployments";
    cluster
        .apply(&format!(
            r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {policy}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {{apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments]}}
  validations:
  - {{expression: "false", message: "deployments are frozen in this namespace"}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {policy}}}
spec:
  policyName: {policy}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {{kubernetes.io/metadata.name: {namespace}}}
"#
        ))
        .unwrap();
    // A policy is enforced a moment after it is stored: wait until it refuses a dry run.
    let probe = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: probe, namespace: {namespace}}}\n\
         spec:\n  selector: {{matchLabels: {{a: b}}}}\n  template:\n    metadata: {{labels: {{a: b}}}}\n    \
         spec: {{containers: [{{name: c, image: {BUSYBOX_BODY_IMAGE}}}]}}\n"
    );
    let probe_path = std::env::temp_dir().join(format!("perago-probe-{}.yaml", std::process::id()));
    std::fs::write(&probe_path, probe).unwrap();
    let path = probe_path.to_string_lossy().into_owned();
    let mut enforced = false;
    for _ in 0..100 {
        if cluster
            .kubectl(&["apply", "--dry-run=server", "-f", &path])
            .is_err()
        {
            enforced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = std::fs::remove_file(&probe_path);
    assert!(enforced, "the admission policy never refused a Deployment");

    let name = "frozen";
    cluster
        .apply(&workspace_task(namespace, name, "true"))
        .unwrap();
    let client = services.kube().client().await.unwrap();
    let ready = ready_condition(&client, namespace, name, &["ApplyRefused"]).await;
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .contains("deployments are frozen in this namespace"),
        "{}",
        ready.message
    );
    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.name={name},reason=ApplyRefused"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap();
    assert!(events.contains("deployments are frozen"), "{events:?}");

    cluster
        .kubectl(&["delete", "validatingadmissionpolicybinding", policy])
        .unwrap();
    cluster
        .kubectl(&["delete", "validatingadmissionpolicy", policy])
        .unwrap();
    let ready = ready_condition(&client, namespace, name, &["Available"]).await;
    eprintln!(
        "after the policy went: Ready={} {}",
        ready.status, ready.message
    );
}
