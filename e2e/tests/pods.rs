//! Executor pods on a real kubelet: the operator installed by Helm in the cluster, a
//! PeragoTask applied, and a workflow step run and published by the pod the operator made.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use perago_e2e::cluster::Cluster;
use perago_e2e::lake::Lake;
use perago_e2e::node::{BUSYBOX_BODY_IMAGE, ctr};
use perago_e2e::pod::ConductorApi;
use perago_e2e::policies::PolicyEnforcer;
use perago_e2e::workload::{Workload, merge, workspace_task_with};
use perago_e2e::{Selection, Services, shared};
use serde_json::json;
use tokio::sync::OnceCell;

#[path = "pods/operate.rs"]
mod operate;

static OPERATOR: OnceCell<Cluster> = OnceCell::const_new();
static POLICIES: OnceCell<PolicyEnforcer> = OnceCell::const_new();

/// The node, with the operator installed from the chart (once per test binary); `None` when
/// the developer opted out of the node's tests. NetworkPolicies are enforced, and every
/// executor pod and the operator run under the chart's (`Cluster::network_policy_values`):
/// each test here shows they let through what a task needs.
async fn cluster(test: &str) -> Option<(&'static Services, &'static Cluster)> {
    if perago_e2e::node_opted_out(test) {
        return None;
    }
    let services = shared(Selection::ALL).await;
    let cluster = OPERATOR
        .get_or_init(|| async {
            let cluster = Cluster::new(services).unwrap();
            POLICIES
                .get_or_init(|| async {
                    PolicyEnforcer::start(services.dir(), &services.kube().kubeconfig)
                        .await
                        .unwrap()
                })
                .await;
            // A 10 s resync bounds how long a task scaled to zero waits for the operator to
            // see its queue (the chart's default is 60 s).
            let mut values = vec!["--set".to_owned(), "resyncSeconds=10".to_owned()];
            values.extend(cluster.network_policy_values().unwrap());
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            let took = cluster.install_operator(&values).unwrap();
            eprintln!("operator installed by helm and available in {took:.1?}");
            cluster
        })
        .await;
    Some((services, cluster))
}

fn workspace_task(namespace: &str, name: &str, script: &str) -> String {
    workspace_task_with(namespace, name, script, &json!({}))
}

/// A lakeFS repository for one test, its main holding `data/in.txt`: the client, the
/// repository's name and the seed commit.
async fn seeded(services: &Services, prefix: &str) -> (Lake, String, String) {
    let lake = Lake::of(services.lakefs());
    let repository = format!("{prefix}-{}", std::process::id());
    let input_ref = lake
        .seed(&repository, &[("data/in.txt", "seed")])
        .await
        .unwrap();
    (lake, repository, input_ref)
}

/// Start a one-step workflow of the task `<namespace>.<name>` on `reference`, with params `n`.
async fn start_step(
    conductor: &ConductorApi,
    namespace: &str,
    name: &str,
    case: &str,
    repository: &str,
    reference: &str,
    n: i64,
) -> String {
    conductor
        .start(
            &format!("{namespace}.{name}"),
            case,
            json!({
                "workspace": {"repository": repository, "branch": "main", "refType": "commit", "ref": reference},
                "params": {"n": n},
            }),
        )
        .await
}

/// A read-only task autoscaled from zero to `max` pods (one work item per pod, a `window`
/// second scale-down window) in a restricted namespace of its own, once Ready.
fn autoscaled_task(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    script: &str,
    max: i32,
    window: i32,
) {
    cluster.task_namespace(namespace).unwrap();
    let spec = json!({
        "workspace": {"readOnly": true},
        "executor": {"autoscaling": {
            "minReplicas": 0, "maxReplicas": max, "targetQueueDepth": 1,
            "scaleDownStabilizationSeconds": window,
        }},
    });
    cluster
        .apply(&workspace_task_with(namespace, name, script, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
}

/// The task's one pod, once it exists.
async fn task_pod(client: &kube::Client, namespace: &str, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("perago.io/task={name}");
    for _ in 0..600 {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        if let Some(pod) = list.items.into_iter().next() {
            return pod;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no pod of {namespace}/{name} after 60 s");
}

const PUBLISH_BODY: &str = r#"
set -eu
echo "body: params $(cat "$PERAGO_PARAMS")"
n=$(sed -n 's/.*"n": *\([0-9]*\).*/\1/p' "$PERAGO_PARAMS")
mkdir -p "$PERAGO_WORKSPACE/out"
i=0
while [ "$i" -lt "$n" ]; do
  echo "row $i of $(cat "$PERAGO_WORKSPACE/in.txt")" > "$PERAGO_WORKSPACE/out/part-$i.txt"
  i=$((i + 1))
done
printf '{"files": %d}' "$n" > "$PERAGO_RESULT"
"#;

#[tokio::test]
async fn a_workspace_step_is_published_by_a_real_executor_pod() {
    let Some((services, cluster)) =
        cluster("a_workspace_step_is_published_by_a_real_executor_pod").await
    else {
        return;
    };
    let (namespace, name) = ("pods-publish", "publish");
    cluster.task_namespace(namespace).unwrap();
    let applied = std::time::Instant::now();
    cluster
        .apply(&workspace_task(namespace, name, PUBLISH_BODY))
        .unwrap();
    let ready = cluster.wait_ready(namespace, name);
    let took = applied.elapsed();
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    if let Err(e) = ready {
        let describe = cluster
            .kubectl(&["describe", "pod", "-n", namespace, &pod_name])
            .unwrap_or_default();
        panic!("{e:#}\n{describe}");
    }

    let lake = Lake::of(services.lakefs());
    let repository = format!("pods-publish-{}", std::process::id());
    let input_ref = lake
        .seed(
            &repository,
            &[("data/in.txt", "seed"), ("other/keep.txt", "x")],
        )
        .await
        .unwrap();
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let started = std::time::Instant::now();
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "real-pod",
        &repository,
        &input_ref,
        3,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    eprintln!(
        "PeragoTask applied → Ready (TaskDef, Deployment, pod scheduled, runner installed, \
         sidecar started) in {took:.1?}; workflow started → finished in {:.1?}",
        started.elapsed()
    );
    let step = &finished["tasks"][0];
    let logs = |container: &str| {
        cluster
            .kubectl(&["logs", "-n", namespace, &pod_name, "-c", container])
            .unwrap_or_else(|e| format!("{e:#}"))
    };
    assert_eq!(
        step["status"],
        "COMPLETED",
        "{step}\nsidecar:\n{}\nbody:\n{}",
        logs("perago-sidecar"),
        logs("body")
    );
    assert_eq!(step["outputData"]["result"], json!({"files": 3}));
    assert!(
        step["workerId"].as_str().unwrap().contains(&pod_name),
        "the worker id names the pod: {}",
        step["workerId"]
    );

    // The squash commit on main, with the audit metadata, holding exactly the workspace.
    let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
    let commit = lake
        .get(&format!("/repositories/{repository}/commits/{head}"))
        .await
        .unwrap();
    assert_eq!(commit["parents"], json!([input_ref]));
    let metadata = &commit["metadata"];
    assert_eq!(metadata["perago.workflow_instance_id"], workflow.as_str());
    assert_eq!(metadata["perago.task_id"], step["taskId"]);
    assert_eq!(metadata["perago.retry_count"], "0");
    let tree = lake.tree(&repository, head).await.unwrap();
    let keys: Vec<&str> = tree.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "data/in.txt",
            "data/out/part-0.txt",
            "data/out/part-1.txt",
            "data/out/part-2.txt",
            "other/keep.txt"
        ]
    );
    assert_eq!(
        lake.object(&repository, head, "data/out/part-2.txt")
            .await
            .unwrap(),
        "row 2 of seed\n"
    );
    let branches = lake
        .get(&format!("/repositories/{repository}/branches"))
        .await
        .unwrap();
    assert_eq!(
        branches["results"].as_array().unwrap().len(),
        1,
        "only main is left: {branches}"
    );

    // The pod as the kubelet ran it: the native sidecar started before the body, the body
    // holds no Conductor or lakeFS credential, and the logs name the attempt.
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods.get(&pod_name).await.unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let status = pod.status.as_ref().unwrap();
    let started_at = |statuses: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>,
                      container: &str| {
        statuses
            .iter()
            .flatten()
            .find(|s| s.name == container)
            .and_then(|s| s.state.as_ref()?.running.as_ref()?.started_at.clone())
            .unwrap_or_else(|| panic!("{container} is not running: {status:?}"))
    };
    let sidecar_started = started_at(&status.init_container_statuses, "perago-sidecar");
    let body_started = started_at(&status.container_statuses, "body");
    assert!(
        sidecar_started.0 <= body_started.0,
        "sidecar started {sidecar_started:?}, body {body_started:?}"
    );
    let install = status
        .init_container_statuses
        .iter()
        .flatten()
        .find(|s| s.name == "install-runner")
        .unwrap();
    assert_eq!(
        install
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(0),
        "the runner was installed: {install:?}"
    );
    let body = spec.containers.iter().find(|c| c.name == "body").unwrap();
    for var in body.env.iter().flatten() {
        assert!(
            !var.name.starts_with("CONDUCTOR") && !var.name.starts_with("LAKECTL"),
            "the body sees {}",
            var.name
        );
        assert!(
            var.value_from
                .as_ref()
                .is_none_or(|v| v.secret_key_ref.is_none()),
            "the body reads a Secret through {}",
            var.name
        );
    }
    assert!(body.env_from.is_none(), "the body imports an environment");
    let mounts: Vec<&str> = body
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(
        mounts,
        ["/perago-work", "/tmp"],
        "the body mounts the work volume and /tmp only (no service-account token)"
    );
    let body_env = cluster
        .kubectl(&[
            "exec", "-n", namespace, &pod_name, "-c", "body", "--", "env",
        ])
        .unwrap();
    for secret in ["CONDUCTOR", "LAKECTL", "LAKEFS", "KUBERNETES_TOKEN"] {
        assert!(
            !body_env.contains(secret),
            "the body's process environment holds {secret}:\n{body_env}"
        );
    }
    let sidecar_log = logs("perago-sidecar");
    assert!(
        sidecar_log.contains(&workflow) && sidecar_log.contains(step["taskId"].as_str().unwrap()),
        "the sidecar's log names the attempt:\n{sidecar_log}"
    );
    let body_log = logs("body");
    assert!(
        body_log.contains("body: params") && body_log.contains(&workflow),
        "the body's output and the attempt's identity reach kubectl logs:\n{body_log}"
    );

    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.name={pod_name}"),
            "-o",
            "custom-columns=REASON:.reason,MESSAGE:.message",
        ])
        .unwrap();
    for reason in ["Scheduled", "Started"] {
        assert!(events.contains(reason), "no {reason} event:\n{events}");
    }
    // Both namespaces enforce Pod Security `restricted`, which admitted the operator's and the
    // executor's pods: a pod that breaks it is refused there.
    for ns in [namespace, perago_e2e::cluster::OPERATOR_NAMESPACE] {
        let refused = cluster.kubectl(&[
            "run",
            "privileged",
            "-n",
            ns,
            "--image",
            BUSYBOX_BODY_IMAGE,
            "--privileged",
            "--restart=Never",
        ]);
        let error = format!("{:#}", refused.unwrap_err());
        assert!(
            error.contains("violates PodSecurity \"restricted:latest\""),
            "{ns}: {error}"
        );
    }
    // RBAC's refusal names the operator's ServiceAccount; other tests here have admission
    // policies and Pod Security refuse objects on purpose, and the operator logs those.
    let operator_logs = cluster.operator_logs().unwrap();
    assert!(
        !operator_logs.contains("forbidden: User \"system:serviceaccount:"),
        "the operator was refused by RBAC:\n{operator_logs}"
    );
}

/// Poll `kubectl logs` of a container until it holds `needle`.
/// A platform team's pod template on the real node: node affinity to a label the node carries,
/// a PriorityClass, a pod annotation, a ConfigMap the body reads and publishes, and an
/// in-memory work volume. A template that takes the operator's work volume is refused at
/// `kubectl apply` naming the field.
#[tokio::test]
async fn a_pod_template_places_the_pod_and_gives_the_body_its_volumes() {
    let Some((services, cluster)) =
        cluster("a_pod_template_places_the_pod_and_gives_the_body_its_volumes").await
    else {
        return;
    };
    let (namespace, name) = ("pods-template", "template");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .kubectl(&[
            "label",
            "node",
            perago_e2e::node::NODE_NAME,
            "perago-e2e/pool=reference",
            "--overwrite",
        ])
        .unwrap();
    cluster
        .apply(
            &json!({
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "perago-e2e-batch"}, "value": 1000,
            })
            .to_string(),
        )
        .unwrap();
    cluster
        .apply(
            &json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "reference-data", "namespace": namespace},
                "data": {"lookup.txt": "from the reference ConfigMap\n"},
            })
            .to_string(),
        )
        .unwrap();
    let template = json!({"executor": {
        "workVolume": {"emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        "podTemplate": {
            "metadata": {"annotations": {"example.com/cost-center": "4711"}},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "perago-e2e/pool", "operator": "In", "values": ["reference"]}]}]}}},
            "priorityClassName": "perago-e2e-batch",
            "volumes": [{"name": "reference", "configMap": {"name": "reference-data"}}],
            "volumeMounts": [{"name": "reference", "mountPath": "/reference", "readOnly": true}],
        },
    }});
    let body = r#"
set -eu
cp /reference/lookup.txt "$PERAGO_WORKSPACE/lookup.txt"
printf '{"files": 1}' > "$PERAGO_RESULT"
"#;
    cluster
        .apply(&workspace_task_with(namespace, name, body, &template))
        .unwrap();
    let ready = cluster.wait_ready(namespace, name);
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    if let Err(e) = ready {
        let describe = cluster
            .kubectl(&["describe", "pod", "-n", namespace, &pod_name])
            .unwrap_or_default();
        panic!("{e:#}\n{describe}");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods.get(&pod_name).await.unwrap();
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        (spec.priority_class_name.as_deref(), spec.priority),
        (Some("perago-e2e-batch"), Some(1000)),
        "the API server resolved the PriorityClass"
    );
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()["example.com/cost-center"],
        "4711"
    );
    assert_eq!(
        spec.node_name.as_deref(),
        Some(perago_e2e::node::NODE_NAME),
        "scheduled onto the labelled node"
    );
    let work = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "perago-work")
        .unwrap();
    assert_eq!(
        work.empty_dir.as_ref().unwrap().medium.as_deref(),
        Some("Memory")
    );

    let (lake, repository, input_ref) = seeded(services, "pods-template").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "template",
        &repository,
        &input_ref,
        1,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    let step = &finished["tasks"][0];
    assert_eq!(step["status"], "COMPLETED", "{step}");
    let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
    assert_eq!(
        lake.object(&repository, head, "data/lookup.txt")
            .await
            .unwrap(),
        "from the reference ConfigMap\n",
        "the body read the template's volume and published what it found"
    );

    // A template that takes the operator's work volume never reaches the cluster.
    let clash = json!({"executor": {"podTemplate": {
        "volumes": [{"name": "perago-work", "emptyDir": {}}],
    }}});
    let refused = cluster
        .apply(&workspace_task_with(namespace, "clash", body, &clash))
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains(
            "spec.executor.podTemplate.volumes[0].name: perago-work is the operator's volume"
        ),
        "{refused:#}"
    );
    let _ = cluster.kubectl(&["delete", "priorityclass", "perago-e2e-batch"]);
}

async fn wait_for_log(
    cluster: &Cluster,
    namespace: &str,
    pod: &str,
    container: &str,
    needle: &str,
) {
    for _ in 0..300 {
        let log = cluster
            .kubectl(&["logs", "-n", namespace, pod, "-c", container])
            .unwrap_or_default();
        if log.contains(needle) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{namespace}/{pod} {container} never logged {needle:?}");
}

/// Wait until the pod is gone from the API; the time it went.
async fn wait_gone(pods: &Api<Pod>, name: &str, limit: Duration) -> std::time::SystemTime {
    let started = std::time::Instant::now();
    while pods.get_opt(name).await.unwrap().is_some() {
        assert!(
            started.elapsed() < limit,
            "pod {name} still exists after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::time::SystemTime::now()
}

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
    let Some((services, cluster)) =
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
    let Some((services, cluster)) =
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
    let Some((services, cluster)) =
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

/// The PeragoTask's `Ready` condition once its reason is one of `reasons`.
async fn ready_condition(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    reasons: &[&str],
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), namespace);
    let mut last = None;
    for _ in 0..900 {
        let task = tasks.get(name).await.unwrap();
        last = task
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"));
        if let Some(c) = &last
            && reasons.contains(&c.reason.as_str())
        {
            return c.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{namespace}/{name}: Ready never had a reason among {reasons:?}; last {last:?}");
}

/// Executor pods that cannot start (image missing, sidecar crash-looping on bad settings,
/// unschedulable, refused by Pod Security admission) show in the PeragoTask's status and events with the pod's own reason.
#[tokio::test]
async fn pods_that_cannot_start_show_in_the_task_status_and_events() {
    let Some((services, cluster)) =
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

/// Autoscaling with real pods: a task at zero replicas gets pods when work is queued, the
/// queued attempts complete, and the pods go away after the window.
#[tokio::test]
async fn an_autoscaled_task_goes_from_zero_to_pods_and_back_to_zero() {
    let Some((services, cluster)) =
        cluster("an_autoscaled_task_goes_from_zero_to_pods_and_back_to_zero").await
    else {
        return;
    };
    let (namespace, name) = ("pods-autoscale", "burst");
    autoscaled_task(
        cluster,
        namespace,
        name,
        "sleep 2; printf '{\"files\": 0}' > \"$PERAGO_RESULT\"",
        2,
        5,
    );
    let client = services.kube().client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("perago.io/task={name}");
    let count = || async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .len()
    };
    assert_eq!(count().await, 0, "scaled to zero while idle");

    let (_, repository, input_ref) = seeded(services, "pods-autoscale").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let started = std::time::Instant::now();
    let mut workflows = Vec::new();
    for i in 0..3 {
        let case = format!("burst-{i}");
        workflows.push(
            start_step(
                &conductor,
                namespace,
                name,
                &case,
                &repository,
                &input_ref,
                i,
            )
            .await,
        );
    }
    let mut first = None;
    for id in &workflows {
        let finished = conductor.finished(id).await;
        assert_eq!(finished["status"], "COMPLETED", "{finished}");
        first.get_or_insert(started.elapsed());
    }
    let all = started.elapsed();
    let scaled = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.name={name},reason=Scaled"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap();
    assert!(
        scaled.contains("0 → 2"),
        "no scale-up from zero to 2: {scaled:?}"
    );

    let back = std::time::Instant::now();
    let mut left = count().await;
    while left > 0 {
        assert!(
            back.elapsed() < Duration::from_secs(120),
            "{left} pods still run"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        left = count().await;
    }
    eprintln!(
        "autoscaling from zero: first workflow COMPLETED {:.1?} after it started, all 3 in {all:.1?}; \
         back to zero pods {:.1?} later (window 5 s, resync 10 s)",
        first.unwrap_or_default(),
        back.elapsed()
    );
}

/// Flux's own status library (kstatus, from sigs.k8s.io/cli-utils) reads a Ready PeragoTask as
/// Current, one whose pods are still coming as InProgress and an invalid one as Failed.
#[tokio::test]
async fn flux_kstatus_reads_ready_rolling_out_and_invalid_tasks() {
    let Some((services, cluster)) =
        cluster("flux_kstatus_reads_ready_rolling_out_and_invalid_tasks").await
    else {
        return;
    };
    let namespace = "pods-kstatus";
    cluster.task_namespace(namespace).unwrap();
    let kstatus = perago_e2e::process::obtain("kstatus").unwrap();
    let verdict = |name: &str| {
        let object = cluster
            .kubectl(&["get", "-n", namespace, "peragotask", name, "-o", "json"])
            .unwrap();
        let mut child = std::process::Command::new(&kstatus)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), object.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "kstatus failed on {name}");
        String::from_utf8(out.stdout).unwrap()
    };
    let cases = [
        ("ready", json!({}), "Current"),
        (
            "rolling-out",
            json!({"executor": {"body": {"image": "localhost/perago/absent:e2e"}}}),
            "InProgress",
        ),
        (
            "invalid",
            json!({"workspace": {"pre": [{"kind": "requireFile", "path": "../outside"}]}}),
            "Failed",
        ),
    ];
    // The admission webhook refuses the invalid one: it plays an object stored before the
    // webhook existed (the other tasks this binary applies meanwhile are valid).
    let manifests: Vec<String> = cases
        .iter()
        .map(|(name, spec, _)| workspace_task_with(namespace, name, PUBLISH_BODY, spec))
        .collect();
    cluster.apply_without_webhook(&manifests).unwrap();
    let client = services.kube().client().await.unwrap();
    ready_condition(&client, namespace, "ready", &["Available"]).await;
    ready_condition(
        &client,
        namespace,
        "rolling-out",
        &["ErrImagePull", "ImagePullBackOff"],
    )
    .await;
    ready_condition(&client, namespace, "invalid", &["InvalidSpec"]).await;
    for (name, _, expected) in &cases {
        let line = verdict(name);
        assert!(
            line.starts_with(&format!("{expected} ")),
            "{name}: kstatus says {line}"
        );
        eprintln!("kstatus {name}: {}", line.trim());
    }
}

/// A body image with no shell and nothing of ours: a static program in a compiled language.
/// The init container's static runner starts it, and its workspace is published.
#[tokio::test]
async fn a_compiled_body_in_an_image_without_a_shell_is_published() {
    let Some((services, cluster)) =
        cluster("a_compiled_body_in_an_image_without_a_shell_is_published").await
    else {
        return;
    };
    let (namespace, name) = ("pods-compiled", "compiled");
    cluster.task_namespace(namespace).unwrap();
    let mut task: serde_json::Value =
        serde_json::from_str(&workspace_task_with(namespace, name, "", &json!({}))).unwrap();
    task["spec"]["resultSchema"] = json!({
        "type": "object", "properties": {"greeting": {"type": "string"}}, "required": ["greeting"],
    });
    task["spec"]["executor"]["body"] = json!({
        "image": perago_e2e::node::COMPILED_BODY_IMAGE,
        "command": ["/usr/local/bin/perago-body-compiled"],
    });
    cluster.apply(&task.to_string()).unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (lake, repository, input_ref) = seeded(services, "pods-compiled").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "compiled",
        &repository,
        &input_ref,
        1,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    let step = &finished["tasks"][0];
    assert_eq!(step["status"], "COMPLETED", "{step}");
    assert_eq!(
        step["outputData"]["result"],
        json!({"greeting": "hello from a compiled body"})
    );
    let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
    assert_eq!(
        lake.object(&repository, head, "data/compiled/hello.txt")
            .await
            .unwrap(),
        "hello\n"
    );
}

/// Autoscaling counts the attempts running in the pods, not only the queue: a task whose queue
/// is empty keeps the pod that runs its attempt, and goes to zero once the attempt is done.
#[tokio::test]
async fn an_autoscaled_task_keeps_the_pod_that_runs_an_attempt() {
    let Some((services, cluster)) =
        cluster("an_autoscaled_task_keeps_the_pod_that_runs_an_attempt").await
    else {
        return;
    };
    let (namespace, name) = ("pods-running", "long");
    autoscaled_task(
        cluster,
        namespace,
        name,
        "echo \"body started $PERAGO_EXECUTION_ID\"; sleep 25; printf '{\"files\": 0}' > \"$PERAGO_RESULT\"",
        2,
        2,
    );
    let (_, repository, input_ref) = seeded(services, "pods-running").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "long",
        &repository,
        &input_ref,
        1,
    )
    .await;
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.unwrap();
    wait_for_log(cluster, namespace, &pod_name, "body", "body started").await;

    // The queue is empty now; the attempt runs for 25 s, longer than the window plus a resync.
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), namespace);
    let mut seen_running = false;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(18) {
        let status = tasks.get(name).await.unwrap().status.unwrap_or_default();
        seen_running |= status.running_attempts == Some(1) && status.queue_depth == Some(0);
        assert!(
            status.replicas.unwrap_or(0) >= 1,
            "scaled in while its attempt runs: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        seen_running,
        "status never showed queue 0 and 1 running attempt"
    );
    let finished = conductor.finished(&workflow).await;
    let attempts: Vec<&str> = finished["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(attempts, ["COMPLETED"], "{finished}");
    let scaled = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.name={name},reason=Scaled"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap();
    assert!(
        scaled.contains("1 → 0 executor pods: 0 queued + 0 running"),
        "went to zero only with nothing running: {scaled:?}"
    );
    assert!(!scaled.contains("queued + 1 running"), "{scaled:?}");
}

/// Scale-in removes idle pods first: before lowering replicas the operator gives the pods with
/// the fewest busy slots a deletion cost below the others', and the ReplicaSet keeps the pods
/// whose attempts run. Two
/// pods run long attempts; each round two short workflows bring two more pods, and once the
/// short ones are done the scale-in from 4 to 2 must remove the two idle pods.
/// `PERAGO_E2E_SCALE_IN_ROUNDS` sets the rounds (5).
#[tokio::test]
async fn scale_ins_remove_idle_pods_and_keep_the_busy_ones() {
    let Some((services, cluster)) =
        cluster("scale_ins_remove_idle_pods_and_keep_the_busy_ones").await
    else {
        return;
    };
    let rounds: usize = std::env::var("PERAGO_E2E_SCALE_IN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let (namespace, name) = ("pods-idle-first", "mixed");
    cluster.task_namespace(namespace).unwrap();
    // No hard cap: the long attempts run until the task is deleted.
    let spec = json!({
        "workspace": {"readOnly": true},
        "controls": {"timeout": {"policy": "RETRY", "seconds": 0, "responseSeconds": 30}},
        "executor": {"autoscaling": {
            "minReplicas": 0, "maxReplicas": 4, "targetQueueDepth": 1,
            "scaleDownStabilizationSeconds": 0,
        }},
    });
    let body = r#"if grep -q '"n": *1' "$PERAGO_PARAMS"; then sleep 3600; else sleep 1; fi
printf '{"files": 0}' > "$PERAGO_RESULT""#;
    cluster
        .apply(&workspace_task_with(namespace, name, body, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (_, repository, input_ref) = seeded(services, "pods-idle-first").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let client = services.kube().client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("perago.io/task={name}");
    let live = || async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let worker_of = |wf: &serde_json::Value| {
        wf["tasks"][0]["workerId"]
            .as_str()
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
    };
    // A reconcile now rather than at the next resync: any change of the object wakes it.
    let nudge = |round: usize| {
        cluster
            .kubectl(&[
                "annotate",
                "--overwrite",
                "-n",
                namespace,
                &format!("peragotask/{name}"),
                &format!("e2e/round={round}"),
            ])
            .unwrap();
    };

    let mut busy_pods = std::collections::BTreeSet::new();
    for i in 0..2 {
        let long = start_step(
            &conductor,
            namespace,
            name,
            &format!("long-{i}"),
            &repository,
            &input_ref,
            1,
        )
        .await;
        let started = std::time::Instant::now();
        let worker = loop {
            if let Some(worker) = worker_of(&conductor.workflow(&long).await) {
                break worker;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "long-{i} never started"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        busy_pods.insert(worker);
    }
    let pod_of = |worker: &str, names: &std::collections::BTreeSet<String>| {
        names.iter().find(|n| worker.contains(n.as_str())).cloned()
    };
    let busy: std::collections::BTreeSet<String> = {
        let names = live().await;
        busy_pods.iter().filter_map(|w| pod_of(w, &names)).collect()
    };
    // What removed a pod that runs a long attempt, should one be going.
    let explain = || {
        let show = |args: &[&str]| cluster.kubectl(args).unwrap_or_else(|e| format!("{e:#}"));
        format!(
            "pods:\n{}\nevents:\n{}\ntask status:\n{}",
            show(&[
                "get",
                "pods",
                "-n",
                namespace,
                "-o",
                "custom-columns=NAME:.metadata.name,PHASE:.status.phase,DELETING:.metadata.deletionTimestamp,COST:.metadata.annotations.controller\\.kubernetes\\.io/pod-deletion-cost"
            ]),
            show(&["get", "events", "-n", namespace, "--sort-by=.lastTimestamp"]),
            show(&[
                "get",
                "peragotask",
                "-n",
                namespace,
                name,
                "-o",
                "jsonpath={.status}"
            ]),
        )
    };
    assert_eq!(
        busy.len(),
        2,
        "two pods run the long attempts: {busy_pods:?}\n{}",
        explain()
    );

    let mut busy_removed = 0;
    let started = std::time::Instant::now();
    for round in 0..rounds {
        let mut shorts = Vec::new();
        for i in 0..2 {
            shorts.push(
                start_step(
                    &conductor,
                    namespace,
                    name,
                    &format!("short-{round}-{i}"),
                    &repository,
                    &input_ref,
                    2,
                )
                .await,
            );
        }
        let mut idle = std::collections::BTreeSet::new();
        for id in &shorts {
            let done = conductor.finished(id).await;
            assert_eq!(done["status"], "COMPLETED", "round {round}: {done}");
            idle.extend(worker_of(&done));
        }
        nudge(round);
        let waited = std::time::Instant::now();
        let left = loop {
            let names = live().await;
            if names.len() <= 2 {
                break names;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "round {round}: never scaled in from {names:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let removed = busy.difference(&left).count();
        busy_removed += removed;
        assert_eq!(
            removed, 0,
            "round {round}: kept {left:?}; the long attempts run on {busy:?}; the short ones ran on {idle:?}"
        );
    }
    eprintln!(
        "{rounds} scale-ins from 4 pods (2 busy, 2 idle) to 2 in {:.1?}: {busy_removed} busy pods removed",
        started.elapsed()
    );
    cluster
        .kubectl(&[
            "delete",
            "-n",
            namespace,
            &format!("peragotask/{name}"),
            "--wait=false",
        ])
        .unwrap();
}

/// A workspace larger than the pod's work volume (a 16 MiB tmpfs, as the kubelet mounts a
/// memory emptyDir with its size limit): the download fails naming the write and the full
/// device, nothing is published and no staging branch is made, the attempt's files are
/// removed, and the same pod then publishes a workspace that fits.
#[tokio::test]
async fn a_full_work_volume_fails_the_download_and_the_pod_serves_on() {
    let Some((services, cluster)) =
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

const CHURN_BODY: &str = r#"
set -eu
sleep 2
echo "written by $PERAGO_TASK_ID" > "$PERAGO_WORKSPACE/churn-$PERAGO_WORKFLOW_INSTANCE_ID.txt"
printf '{"files": 1}' > "$PERAGO_RESULT"
"#;

/// Many attempts while the Deployment is scaled up and down and rolled out again and again:
/// every stopping pod finishes, publishes and reports what it runs. Every workflow COMPLETED
/// with one attempt (none given up, timed out or retried after a killed pod), each branch got
/// exactly one squash commit from that attempt, and no staging branch is left.
#[tokio::test]
async fn attempts_survive_scaling_and_rollouts_without_loss_or_double_publication() {
    let Some((services, cluster)) =
        cluster("attempts_survive_scaling_and_rollouts_without_loss_or_double_publication").await
    else {
        return;
    };
    let workflows_wanted: usize = std::env::var("PERAGO_E2E_CHURN_WORKFLOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let (namespace, name) = ("pods-churn", "churn");
    cluster.task_namespace(namespace).unwrap();
    let spec = json!({
        "controls": {
            "retry": {"count": 2, "logic": "FIXED", "delaySeconds": 0},
            "timeout": {"policy": "RETRY", "seconds": 60, "responseSeconds": 30},
        },
        "executor": {"slots": 2, "replicas": 2},
    });
    cluster
        .apply(&workspace_task_with(namespace, name, CHURN_BODY, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (lake, repository, input_ref) = seeded(services, "pods-churn").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);

    // One branch per workflow, so that each publication is checked on its own history.
    let workload = Workload::start(
        &lake,
        &conductor,
        &format!("{namespace}.{name}"),
        (&repository, &input_ref),
        "churn",
        workflows_wanted,
    )
    .await
    .unwrap();
    // Meanwhile: scale between 1 and 4 pods and roll out, one change every 4 s.
    let started = std::time::Instant::now();
    let changes = [
        "scale=4", "rollout", "scale=1", "scale=3", "rollout", "scale=2", "scale=4", "rollout",
        "scale=1", "rollout",
    ];
    let mut applied = Vec::new();
    while workload.finished(&conductor).await < workflows_wanted {
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "not every workflow finished after 15 min"
        );
        let change = changes[applied.len() % changes.len()];
        match change.split_once('=') {
            Some((_, n)) => cluster.kubectl(&[
                "scale",
                "-n",
                namespace,
                &format!("peragotask/{name}"),
                &format!("--replicas={n}"),
            ]),
            None => cluster.kubectl(&[
                "rollout",
                "restart",
                "-n",
                namespace,
                &format!("deployment/{name}-perago"),
            ]),
        }
        .unwrap();
        applied.push(change);
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    let took = started.elapsed();

    let outcome = workload.outcome(&lake, &conductor).await.unwrap();
    assert!(outcome.holds_the_promises(), "{outcome}");
    assert_eq!(
        (outcome.attempts, outcome.failed_attempts),
        (workflows_wanted, 0),
        "one attempt each, none lost to a stopping pod: {outcome}"
    );
    eprintln!(
        "{outcome}, in {took:.1?}, while {} scale and rollout changes were made ({})",
        applied.len(),
        applied.join(", ")
    );
}

/// A task without `spec.executor.autoscaling` whose `/scale` the cluster's HPA controller owns
/// (the example HPA of `deploy/examples/scalers/`, aimed at this task): the HPA raises the
/// task to its `minReplicas`, the operator follows with pods, and it does not fight the HPA.
#[tokio::test]
async fn an_hpa_owns_the_replicas_of_a_task_and_the_operator_follows() {
    let Some((services, cluster)) =
        cluster("an_hpa_owns_the_replicas_of_a_task_and_the_operator_follows").await
    else {
        return;
    };
    let (namespace, name) = ("pods-hpa", "scaled-by-hpa");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task_with(
            namespace,
            name,
            PUBLISH_BODY,
            &json!({"workspace": {"readOnly": true}, "executor": {"replicas": 1}}),
        ))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();

    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/examples/scalers/hpa-external-metrics.yaml"
    ))
    .unwrap();
    let mut hpa: serde_json::Value = serde_yaml::from_str(&example).unwrap();
    hpa["metadata"]["namespace"] = json!(namespace);
    hpa["spec"]["scaleTargetRef"]["name"] = json!(name);
    hpa["spec"]["minReplicas"] = json!(3);
    cluster.apply(&hpa.to_string()).unwrap();

    let client = services.kube().client().await.unwrap();
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), namespace);
    let started = std::time::Instant::now();
    loop {
        let task = tasks.get(name).await.unwrap();
        let ready = task.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        if task.spec.executor.replicas == 3 && ready == 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the HPA's minimum never reached the pods: replicas {}, ready {ready}",
            task.spec.executor.replicas
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let followed = started.elapsed();
    // Not fought: through two of the operator's resyncs (10 s each here) it stays at 3.
    let held = std::time::Instant::now();
    while held.elapsed() < Duration::from_secs(25) {
        let d = deployments.get(&format!("{name}-perago")).await.unwrap();
        assert_eq!(
            d.spec.unwrap().replicas,
            Some(3),
            "the operator changed the HPA's replicas"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let status = cluster
        .kubectl(&[
            "get",
            "hpa",
            "-n",
            namespace,
            "features-build",
            "-o",
            "jsonpath={.status.currentReplicas}/{.status.desiredReplicas}",
        ])
        .unwrap();
    assert_eq!(status.trim(), "3/3", "the HPA's own view");
    eprintln!("HPA minReplicas 3 on a task at 1: 3 pods ready {followed:.1?} later, held for 25 s");
    cluster
        .kubectl(&["delete", "hpa", "-n", namespace, "features-build"])
        .unwrap();
}

/// The chart's staging-branch CronJob, run once on the node: `kubectl perago gc` in the
/// operator's image deletes the staging branch of an attempt whose task is terminal and keeps
/// the one whose task is still scheduled.
#[tokio::test]
async fn the_staging_gc_cronjob_removes_dead_attempts_branches() {
    let Some((services, cluster)) =
        cluster("the_staging_gc_cronjob_removes_dead_attempts_branches").await
    else {
        return;
    };
    let (lake, repository, input_ref) = seeded(services, "pods-staging-gc").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let task = "pods.staging-gc";
    conductor
        .call(
            reqwest::Method::POST,
            "/metadata/taskdefs",
            Some(&json!([{"name": task, "ownerEmail": "e2e@example.com",
                           "retryCount": 0, "responseTimeoutSeconds": 60}])),
        )
        .await;
    // Two workflows nobody works on: one terminated (its task CANCELED), one left scheduled.
    let mut branches = Vec::new();
    for case in ["dead", "scheduled"] {
        let id = conductor.start(task, case, json!({})).await;
        if case == "dead" {
            conductor
                .call(
                    reqwest::Method::DELETE,
                    &format!("/workflow/{id}?reason=test"),
                    None,
                )
                .await;
        }
        let wf = conductor.workflow(&id).await;
        let task_id = wf["tasks"][0]["taskId"].as_str().unwrap().to_owned();
        let branch = format!(
            "perago-staging-{id}-step-seq-1-iteration-0-task-id-{task_id}-retry-0-exec-e2e"
        );
        lake.post(
            &format!("/repositories/{repository}/branches"),
            json!({"name": branch, "source": input_ref}),
        )
        .await
        .unwrap();
        branches.push((id, branch));
    }
    let log = cluster
        .run_staging_gc("staging-gc-now", &[&repository])
        .unwrap();
    eprintln!("staging-gc job:\n{log}");
    let left: Vec<String> = lake
        .get(&format!(
            "/repositories/{repository}/branches?prefix=perago-staging-"
        ))
        .await
        .unwrap()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, [branches[1].1.clone()], "{log}");
    assert!(log.contains("DELETED") && log.contains("CANCELED"), "{log}");
    assert!(log.contains("KEPT") && log.contains("SCHEDULED"), "{log}");
    conductor
        .call(
            reqwest::Method::DELETE,
            &format!("/workflow/{}?reason=test", branches[1].0),
            None,
        )
        .await;
}

/// `kubectl perago --task`: the plugin finds Conductor and lakeFS the way the task's pods do,
/// through the kubeconfig, with the credentials from the Secret in the task's namespace; a
/// flag still wins, and a task that does not exist is one line naming it.
#[tokio::test]
async fn kubectl_perago_finds_the_servers_of_a_task() {
    let Some((services, cluster)) = cluster("kubectl_perago_finds_the_servers_of_a_task").await
    else {
        return;
    };
    let (namespace, name) = ("pods-plugin", "found");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task(namespace, name, PUBLISH_BODY))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (_lake, repository, input_ref) = seeded(services, "pods-plugin").await;
    let plugin = perago_e2e::process::release_binaries(&["kubectl-perago"], "the plugin's test")
        .unwrap()
        .join("kubectl-perago");
    let run = |args: &[&str]| {
        let mut command = std::process::Command::new(&plugin);
        command.args(args).env("KUBECONFIG", cluster.kubeconfig());
        for var in [
            "CONDUCTOR_SERVER_URL",
            "CONDUCTOR_AUTH_KEY",
            "CONDUCTOR_AUTH_SECRET",
            "LAKECTL_SERVER_ENDPOINT_URL",
            "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
        ] {
            command.env_remove(var);
        }
        command.output().unwrap()
    };
    let history = [
        "history",
        "--repository",
        &repository,
        "--branch",
        "main",
        "-o",
        "json",
    ];
    let mut args = vec!["--task", name, "-n", namespace];
    args.extend(history);
    let out = run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["head"], json!(input_ref), "{view}");

    let mut overridden = args.clone();
    overridden.extend(["--lakefs-endpoint", "http://127.0.0.1:9"]);
    let out = run(&overridden);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lakeFS"),
        "the flag wins: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut missing = vec!["--task", "nope", "-n", namespace];
    missing.extend(history);
    let out = run(&missing);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("PeragoTask {namespace}/nope not found")),
        "{stderr}"
    );
}

/// The task's pods' Conductor worker ids start with `<name>-perago-` (the Deployment's pods).
fn served_by(step: &serde_json::Value, name: &str) -> bool {
    step["workerId"]
        .as_str()
        .is_some_and(|w| w.starts_with(&format!("{name}-perago-")))
}

/// Two PeragoTasks of one task type: `stable` without a domain, `canary` in the domain
/// `canary`, autoscaled from zero. A workflow routed to the domain (`taskToDomain`) scales the
/// canary up by its domain's queue and is served by its pod; one not routed is served by the
/// stable pod. A third PeragoTask of the type whose spec renders another TaskDef is not Ready,
/// names the sibling that registered it, and gets no pods.
#[tokio::test]
async fn task_domains_route_work_to_their_own_pods_and_scale_them() {
    let Some((services, cluster)) =
        cluster("task_domains_route_work_to_their_own_pods_and_scale_them").await
    else {
        return;
    };
    let namespace = "pods-domains";
    let task_type = "pods-domains.step";
    cluster.task_namespace(namespace).unwrap();
    let answer = |files: i32| format!("printf '{{\"files\": {files}}}' > \"$PERAGO_RESULT\"");
    let shared = json!({"taskName": task_type, "workspace": {"readOnly": true}});
    let apply = |name: &str, files: i32, spec: &serde_json::Value| {
        let mut spec = spec.clone();
        merge(&mut spec, &shared);
        cluster
            .apply(&workspace_task_with(namespace, name, &answer(files), &spec))
            .unwrap();
    };
    // One after the other, so that `stable` is the older sibling that registers the TaskDef.
    apply("stable", 1, &json!({}));
    cluster.wait_ready(namespace, "stable").unwrap();
    let canary = json!({
        "conductor": {"domain": "canary"},
        "executor": {"autoscaling": {"minReplicas": 0, "maxReplicas": 1, "scaleDownStabilizationSeconds": 5}},
    });
    apply("canary", 2, &canary);
    cluster.wait_ready(namespace, "canary").unwrap();

    let (_, repository, input_ref) = seeded(services, "pods-domains").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let input = json!({
        "workspace": {"repository": repository, "branch": "main", "refType": "commit", "ref": input_ref},
        "params": {"n": 0},
    });
    let started = std::time::Instant::now();
    let routed = conductor
        .start_routed(task_type, "routed", input.clone(), Some("canary"))
        .await;
    let unrouted = conductor.start(task_type, "unrouted", input).await;
    for (id, name, files) in [(routed, "canary", 2), (unrouted, "stable", 1)] {
        let finished = conductor.finished(&id).await;
        let step = &finished["tasks"][0];
        assert_eq!(step["status"], "COMPLETED", "{name}: {step}");
        assert!(served_by(step, name), "{name}: {step}");
        assert_eq!(step["outputData"]["result"]["files"], files, "{step}");
    }
    let scaled = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.name=canary,reason=Scaled",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap();
    assert!(
        scaled.contains("0 → 1"),
        "the domain's queue scaled the canary: {scaled:?}"
    );
    eprintln!(
        "task domains: the routed step scaled its domain's task from zero and both completed in {:.1?}",
        started.elapsed()
    );

    // A sibling whose spec renders another TaskDef neither registers it nor gets pods.
    apply(
        "drifted",
        3,
        &json!({"conductor": {"domain": "eu"}, "controls": {"timeout": {"seconds": 90}}}),
    );
    let client = services.kube().client().await.unwrap();
    let ready = ready_condition(&client, namespace, "drifted", &["TaskDefConflict"]).await;
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .contains("registered by the older PeragoTask pods-domains/stable")
            && ready.message.contains("(timeoutSeconds)"),
        "{}",
        ready.message
    );
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), namespace);
    assert!(
        deployments
            .get_opt("drifted-perago")
            .await
            .unwrap()
            .is_none()
    );
    let stored = conductor
        .call(
            reqwest::Method::GET,
            &format!("/metadata/taskdefs/{task_type}"),
            None,
        )
        .await;
    assert_eq!(
        stored["timeoutSeconds"], 120,
        "the registered TaskDef is untouched"
    );
}

/// An admission policy that refuses the executor's Deployment: the task is not Ready and says
/// what refused it, in the API server's words; once the policy goes, the task becomes Ready
/// without a change of its own.
#[tokio::test]
async fn a_deployment_the_api_server_refuses_shows_in_the_task_status() {
    let Some((services, cluster)) =
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

/// A generic ephemeral work volume from a storage class: the pod's PersistentVolumeClaim is
/// bound to a local PersistentVolume the test provides (a class without a provisioner, bound
/// when the pod is scheduled), the workspace step runs and publishes through it, and the
/// claim goes away with the pod.
#[tokio::test]
async fn an_ephemeral_work_volume_from_a_storage_class_carries_the_workspace() {
    let Some((services, cluster)) =
        cluster("an_ephemeral_work_volume_from_a_storage_class_carries_the_workspace").await
    else {
        return;
    };
    let (namespace, name) = ("pods-ephemeral", "claimed");
    cluster.task_namespace(namespace).unwrap();
    // The volume's directory on the node, writable by the pod's non-root users as an
    // emptyDir is.
    let disk = tempfile::Builder::new()
        .prefix("perago-local-pv-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(
        disk.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let (class, volume) = (
        "perago-e2e-local",
        format!("perago-e2e-work-{}", std::process::id()),
    );
    cluster
        .apply(&format!(
            r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {class}}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {volume}}}
spec:
  capacity: {{storage: 2Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: {class}
  local: {{path: {path}}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]
"#,
            path = disk.path().display(),
            node = perago_e2e::node::NODE_NAME,
        ))
        .unwrap();
    let spec = json!({"executor": {"workVolume": {"ephemeral": {"storageClassName": class, "size": "1Gi"}}}});
    cluster
        .apply(&workspace_task_with(namespace, name, PUBLISH_BODY, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();

    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), namespace);
    let claim = claims
        .get(&format!("{pod_name}-{}", perago_api::pod::WORK_VOLUME))
        .await
        .unwrap();
    assert_eq!(
        claim.spec.as_ref().unwrap().volume_name.as_deref(),
        Some(volume.as_str()),
        "the pod's claim is bound to the test's volume"
    );
    assert!(
        disk.path().join("bin/perago-runner").exists(),
        "the init container installed the runner on the claimed volume"
    );

    let (lake, repository, input_ref) = seeded(services, "pods-ephemeral").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "ephemeral",
        &repository,
        &input_ref,
        2,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    let step = &finished["tasks"][0];
    assert_eq!(step["status"], "COMPLETED", "{step}");
    let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
    assert_eq!(
        lake.object(&repository, head, "data/out/part-1.txt")
            .await
            .unwrap(),
        "row 1 of seed\n"
    );

    // The claim is the pod's: deleting the task deletes the pod, and the claim with it.
    cluster
        .kubectl(&["delete", "peragotask", "-n", namespace, name, "--wait"])
        .unwrap();
    wait_gone(
        &Api::namespaced(client.clone(), namespace),
        &pod_name,
        Duration::from_secs(120),
    )
    .await;
    let mut claim_left = true;
    for _ in 0..300 {
        claim_left = !claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty();
        if !claim_left {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!claim_left, "the pod's claim outlived it");
    let _ = cluster.kubectl(&["delete", "persistentvolume", &volume, "--wait=false"]);
    let _ = cluster.kubectl(&["delete", "storageclass", class]);
}

/// A Python Perago task module, unchanged, as a user moves it: `perago-k8s manifest` writes its
/// PeragoTask; the body image holds Python, Python Perago and perago-k8s; the module reaches
/// the body from a ConfigMap. Python Perago's own worker runs it first, for comparison.
const PYTHON_MODULE: &str = r#"
import os
from pathlib import Path

from pydantic import BaseModel

from perago import WorkspaceSpec, task


class Params(BaseModel):
    n: int


class Result(BaseModel):
    files: int
    pid: int


@task(name="pods-python.split", owner_email="e2e@example.com", description="", workspace=WorkspaceSpec(prefix="/data"))
def split(workspace: Path, params: Params) -> Result:
    source = (workspace / "in.txt").read_text()
    out = workspace / "out"
    out.mkdir(exist_ok=True)
    for i in range(params.n):
        (out / f"part-{i}.txt").write_text(f"row {i} of {source}\n")
    return Result(files=params.n, pid=os.getpid())
"#;

#[tokio::test]
async fn a_python_perago_module_runs_unchanged_in_a_persistent_body_on_the_node() {
    let Some((services, cluster)) =
        cluster("a_python_perago_module_runs_unchanged_in_a_persistent_body_on_the_node").await
    else {
        return;
    };
    let (namespace, name) = ("pods-python", "split");
    let started = std::time::Instant::now();
    let (image, archive) =
        perago_e2e::node::build_python_body_image(&services.dir().join("python-body")).unwrap();
    services
        .node()
        .containerd
        .import(&[(image.clone(), archive)])
        .unwrap();
    eprintln!(
        "Python body image built and imported in {:.1?}",
        started.elapsed()
    );

    let modules = tempfile::tempdir().unwrap();
    std::fs::write(modules.path().join("splitter.py"), PYTHON_MODULE).unwrap();
    let spec = perago_e2e::python::manifest(modules.path(), "splitter");
    assert_eq!(spec.task_name, format!("{namespace}.{name}"));

    // First Python Perago's own worker on this host, against the same Conductor and lakeFS
    // (`perago start` needs the TaskDef registered; the operator's is the same, byte for byte).
    let conductor = ConductorApi::new(&services.conductor().api_url);
    conductor
        .call(
            reqwest::Method::POST,
            "/metadata/taskdefs",
            Some(&json!([perago_api::taskdef::render(&spec).unwrap()])),
        )
        .await;
    let (lake, python_repository, python_input) = seeded(services, "pods-python-worker").await;
    let by_python = {
        let worker = perago_e2e::python::Worker::start(
            services,
            "splitter",
            PYTHON_MODULE,
            &services.conductor().api_url,
            &[],
        )
        .unwrap();
        let workflow = start_step(
            &conductor,
            namespace,
            name,
            "python-worker",
            &python_repository,
            &python_input,
            2,
        )
        .await;
        let finished = conductor.finished(&workflow).await;
        let step = finished["tasks"][0].clone();
        assert_eq!(step["status"], "COMPLETED", "{step}\n{}", worker.log());
        step
        // The worker stops here, before the PeragoTask's pod polls the same task type.
    };

    let mut spec = serde_json::to_value(&spec).unwrap();
    merge(
        &mut spec,
        &json!({"executor": {
            "slots": 1,
            "body": {
                "image": image,
                "mode": "persistent",
                "env": [{"name": "PYTHONPATH", "value": "/modules"}],
            },
            "podTemplate": {
                "volumes": [{"name": "modules", "configMap": {"name": "python-modules"}}],
                "volumeMounts": [{"name": "modules", "mountPath": "/modules", "readOnly": true}],
            },
        }}),
    );
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(
            &json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "python-modules", "namespace": namespace},
                "data": {"splitter.py": PYTHON_MODULE},
            })
            .to_string(),
        )
        .unwrap();
    cluster
        .apply(
            &json!({
                "apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            })
            .to_string(),
        )
        .unwrap();
    let client = services.kube().client().await.unwrap();
    if let Err(e) = cluster.wait_ready(namespace, name) {
        let pod = task_pod(&client, namespace, name).await;
        let describe = cluster
            .kubectl(&[
                "describe",
                "pod",
                "-n",
                namespace,
                &pod.metadata.name.unwrap(),
            ])
            .unwrap_or_default();
        panic!("{e:#}\n{describe}");
    }

    let (_, repository, input_ref) = seeded(services, "pods-python").await;
    let mut steps = Vec::new();
    // The second run starts from the first one's commit: its step fences on the branch's head.
    let mut input_ref = input_ref;
    for n in [2, 3] {
        let workflow = start_step(
            &conductor,
            namespace,
            name,
            &format!("python-{n}"),
            &repository,
            &input_ref,
            n,
        )
        .await;
        let finished = conductor.finished(&workflow).await;
        let step = &finished["tasks"][0];
        if step["status"] != "COMPLETED" {
            let pod = task_pod(&client, namespace, name)
                .await
                .metadata
                .name
                .unwrap();
            let logs = cluster
                .kubectl(&["logs", "-n", namespace, &pod, "--all-containers"])
                .unwrap_or_else(|e| format!("{e:#}"));
            panic!("{step}\n{logs}");
        }
        let result = &step["outputData"]["result"];
        assert_eq!(result["files"], n, "{step}");
        let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
        for i in 0..n {
            assert_eq!(
                lake.object(&repository, head, &format!("data/out/part-{i}.txt"))
                    .await
                    .unwrap(),
                format!("row {i} of seed\n")
            );
        }
        assert!(
            lake.object(&repository, head, &format!("data/out/part-{n}.txt"))
                .await
                .is_err(),
            "no part beyond the runs' n"
        );
        input_ref = head.to_owned();
        steps.push(step.clone());
    }
    // The same module from the same input: the same result and the same files on the branch
    // as Python Perago's worker made.
    let result =
        |step: &serde_json::Value, field: &str| step["outputData"]["result"][field].clone();
    let head = |step: &serde_json::Value| {
        step["outputData"]["workspace"]["ref"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        result(&steps[0], "files"),
        result(&by_python, "files"),
        "{by_python}"
    );
    let (python_head, k8s_head) = (head(&by_python), head(&steps[0]));
    let python_tree = lake.tree(&python_repository, &python_head).await.unwrap();
    assert_eq!(
        python_tree,
        lake.tree(&repository, &k8s_head).await.unwrap(),
        "the branches after Python Perago's worker and after the PeragoTask"
    );
    for key in python_tree.keys() {
        assert_eq!(
            lake.object(&python_repository, &python_head, key)
                .await
                .unwrap(),
            lake.object(&repository, &k8s_head, key).await.unwrap(),
            "{key}"
        );
    }
    assert!(result(&steps[0], "pid").is_i64(), "{}", steps[0]);
    assert_eq!(
        result(&steps[0], "pid"),
        result(&steps[1], "pid"),
        "one slot's persistent body ran both attempts"
    );
}

/// What a body can read, printed to its log: its environment, every process it can see (with
/// its command line and environment), the files of the work volume and of /etc/perago, and
/// whether a ServiceAccount token is mounted. The section markers are printed with `printf`,
/// so that the script's own command line, which the report holds, does not contain them.
const SNOOPING_BODY: &str = r#"
printf "== %s\n" environment
env
printf "== %s\n" processes
for p in /proc/[0-9]*; do
  echo "-- $p: $(cat "$p/cmdline" 2>/dev/null)"
  cat "$p/environ" 2>/dev/null
  echo
done
dump() {
  for f in "$1"/* "$1"/.[!.]*; do
    if [ "$f" = /perago-work/bin/perago-runner ]; then
      echo "-- $f (the runner)"
    elif [ -L "$f" ]; then
      echo "-- $f (link)"
    elif [ -d "$f" ]; then
      dump "$f"
    elif [ -f "$f" ]; then
      echo "-- $f"
      head -c 65536 "$f" 2>&1
      echo
    elif [ -e "$f" ]; then
      echo "-- $f (not a file)"
    fi
  done
}
printf "== %s\n" files
dump /perago-work
dump /etc/perago
dump /var/run/secrets
printf "== %s\n" end
printf '{"files": 0}' > "$PERAGO_RESULT"
"#;

/// The threat model's promise (docs/threat-model.md): the body container cannot read the
/// lakeFS credentials the sidecar holds: not in its environment, not through the processes it
/// can see, not in the shared work volume, and it has no ServiceAccount token.
#[tokio::test]
async fn the_body_cannot_read_the_sidecars_credentials() {
    let Some((services, cluster)) = cluster("the_body_cannot_read_the_sidecars_credentials").await
    else {
        return;
    };
    let (namespace, name) = ("pods-snoop", "snoop");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task(namespace, name, SNOOPING_BODY))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (_lake, repository, input_ref) = seeded(services, "pods-snoop").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "snoop",
        &repository,
        &input_ref,
        0,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    assert_eq!(finished["tasks"][0]["status"], "COMPLETED", "{finished}");
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name)
        .await
        .metadata
        .name
        .unwrap();
    let log = cluster
        .kubectl(&["logs", "-n", namespace, &pod, "-c", "body"])
        .unwrap();
    let seen = log
        .split_once("== environment")
        .and_then(|(_, rest)| rest.split_once("== end"))
        .map(|(seen, _)| seen)
        .unwrap_or_else(|| panic!("the body's report is incomplete:\n{log}"));
    // The report works: the body sees its own environment, its own processes and the attempt's
    // files in the work volume.
    for own in [
        "PERAGO_WORKSPACE=",
        "perago-runner",
        "/perago-work/",
        "in.txt",
    ] {
        assert!(seen.contains(own), "the report lacks {own:?}:\n{seen}");
    }
    // And none of it is the sidecar's: not its credentials, not its process.
    let secret = perago_e2e::services::LAKEFS_SECRET_ACCESS_KEY;
    for hidden in [secret, "LAKECTL_CREDENTIALS", "serviceaccount/token"] {
        assert!(
            !seen.contains(hidden),
            "the body can read {hidden:?}:\n{seen}"
        );
    }
    let processes = seen
        .split_once("== processes")
        .and_then(|(_, rest)| rest.split_once("== files"))
        .unwrap()
        .0;
    assert!(
        !processes.contains("perago-sidecar"),
        "the body sees the sidecar's process:\n{processes}"
    );
}

/// What a pod reaches: `open` when an HTTP server answered on the host and port, `closed`
/// when the connection was refused or timed out.
const REACH: &str = r#"reach() {
  if printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$1" "$2" 2>/dev/null | head -c 12 | grep -q HTTP; then
    echo open
  else
    echo closed
  fi
}
"#;

/// Host and port of an `http(s)://host:port/…` URL.
fn address(url: &str) -> (String, u16) {
    let url = reqwest::Url::parse(url).unwrap();
    (
        url.host_str().unwrap().to_owned(),
        url.port_or_known_default().unwrap(),
    )
}

/// Under the chart's NetworkPolicies (enforced on the node by kube-router), an executor pod
/// reaches lakeFS and Conductor and publishes, but neither the API server nor the operator;
/// only pods of a scraper namespace read the operator's metrics. A task that switches its
/// policy off gets it removed, and its pods reach the API server again.
#[tokio::test]
async fn network_policies_confine_executor_pods_and_the_operator() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use perago_e2e::cluster::{OPERATOR_NAMESPACE, SCRAPER_LABEL};

    let Some((services, cluster)) =
        cluster("network_policies_confine_executor_pods_and_the_operator").await
    else {
        return;
    };
    let (namespace, name) = ("pods-netpol", "netpol");
    cluster.task_namespace(namespace).unwrap();
    let client = services.kube().client().await.unwrap();
    let operator = Api::<Pod>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/name=perago-operator"))
        .await
        .unwrap()
        .items
        .into_iter()
        .find_map(|p| p.status.and_then(|s| s.pod_ip))
        .expect("an operator pod with an IP");
    let (lakefs_host, lakefs_port) = address(&services.lakefs().endpoint);
    let (api_host, api_port) = address(&services.kube().server);
    let script = format!(
        "{REACH}printf '{{\"lakefs\": \"%s\", \"apiserver\": \"%s\", \"operator\": \"%s\"}}' \
         \"$(reach {lakefs_host} {lakefs_port})\" \"$(reach {api_host} {api_port})\" \
         \"$(reach {operator} 8080)\" > \"$PERAGO_RESULT\"\n"
    );
    let task = workspace_task_with(
        namespace,
        name,
        &script,
        &json!({"resultSchema": {
            "properties": {
                "files": null,
                "lakefs": {"type": "string"},
                "apiserver": {"type": "string"},
                "operator": {"type": "string"},
            },
            "required": ["lakefs", "apiserver", "operator"],
        }}),
    );
    cluster.apply(&task).unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), namespace);
    let policy = policies.get("netpol-perago").await.unwrap();
    assert_eq!(
        policy.spec.unwrap().policy_types.unwrap(),
        ["Ingress", "Egress"]
    );

    let (_lake, repository, input_ref) = seeded(services, "pods-netpol").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let reached = async |case: &str| {
        let workflow = start_step(
            &conductor,
            namespace,
            name,
            case,
            &repository,
            &input_ref,
            1,
        )
        .await;
        let finished = conductor.finished(&workflow).await;
        let step = &finished["tasks"][0];
        assert_eq!(step["status"], "COMPLETED", "{step}");
        step["outputData"]["result"].clone()
    };
    assert_eq!(
        reached("confined").await,
        json!({"lakefs": "open", "apiserver": "closed", "operator": "closed"}),
        "the executor pod, under its NetworkPolicy"
    );

    // The operator's metrics: read from a pod of a scraper namespace, refused to one elsewhere.
    let scrapers = "pods-netpol-scraper";
    let (label, value) = SCRAPER_LABEL;
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {scrapers}\n  labels: {{{label}: \"{value}\"}}\n"
        ))
        .unwrap();
    for ns in [scrapers, namespace] {
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: scraper, namespace: {ns}}}\nspec:\n  \
                 securityContext: {{runAsNonRoot: true, runAsUser: 65534, seccompProfile: {{type: RuntimeDefault}}}}\n  \
                 containers:\n  - name: c\n    image: {BUSYBOX_BODY_IMAGE}\n    imagePullPolicy: Never\n    \
                 command: [sleep, '3600']\n    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n"
            ))
            .unwrap();
    }
    let probe = format!("{REACH}reach {operator} 8080");
    let read_from = |ns: &str| {
        cluster
            .kubectl(&["exec", "-n", ns, "scraper", "--", "sh", "-c", &probe])
            .unwrap()
            .trim()
            .to_owned()
    };
    for ns in [scrapers, namespace] {
        cluster
            .kubectl(&[
                "wait",
                "-n",
                ns,
                "--for=condition=Ready",
                "pod/scraper",
                "--timeout=60s",
            ])
            .unwrap();
    }
    // The enforcer adds a new pod's address to the policy's allowed sources on its own time,
    // after the pod is Ready: the scraper is let in within a bound, not at once.
    let ready = std::time::Instant::now();
    while read_from(scrapers) != "open" {
        assert!(
            ready.elapsed() < Duration::from_secs(30),
            "a pod of {scrapers} still cannot read the operator's metrics 30 s after it was Ready"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "the scraper read the operator's metrics {:.1?} after it was Ready",
        ready.elapsed()
    );
    assert_eq!(
        read_from(namespace),
        "closed",
        "the operator's metrics from {namespace}, not a scraper namespace"
    );

    // Switched off: the operator removes the policy, and the pod reaches the API server (the
    // operator's own policy still refuses it).
    cluster
        .kubectl(&[
            "patch",
            "peragotask",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            r#"{"spec": {"executor": {"networkPolicy": {"enabled": false}}}}"#,
        ])
        .unwrap();
    let started = std::time::Instant::now();
    while policies.get_opt("netpol-perago").await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the NetworkPolicy is still there 30 s after the task switched it off"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let removed = started.elapsed();
    // The enforcer follows the deletion on its own time: until the body's container reaches
    // the API server, the next attempt would not.
    let pod = task_pod(&client, namespace, name).await;
    let pod = pod.metadata.name.unwrap();
    let probe = format!("{REACH}reach {api_host} {api_port}");
    loop {
        let out = cluster
            .kubectl(&[
                "exec", "-n", namespace, &pod, "-c", "body", "--", "sh", "-c", &probe,
            ])
            .unwrap();
        if out.trim() == "open" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the pod still cannot reach the API server 60 s after its task switched its \
             NetworkPolicy off"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "NetworkPolicy removed {removed:.1?} after the task switched it off, lifted on the node \
         {:.1?} after that",
        started.elapsed() - removed
    );
    assert_eq!(
        reached("unconfined").await,
        json!({"lakefs": "open", "apiserver": "open", "operator": "closed"}),
        "the executor pod, without its NetworkPolicy"
    );
    for ns in [scrapers, namespace] {
        let _ = cluster.kubectl(&["delete", "pod", "-n", ns, "scraper", "--wait=false"]);
    }
}
