//! Executor pods on a real kubelet: the operator installed by Helm in the cluster, a
//! PeragoTask applied, and a workflow step run and published by the pod the operator made.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use perago_e2e::cluster::Cluster;
use perago_e2e::lake::Lake;
use perago_e2e::node::BUSYBOX_BODY_IMAGE;
use perago_e2e::pod::ConductorApi;
use perago_e2e::{Selection, Services, shared};
use serde_json::json;
use tokio::sync::OnceCell;

static OPERATOR: OnceCell<Cluster> = OnceCell::const_new();

/// The node, with the operator installed from the chart (once per test binary).
async fn cluster() -> (&'static Services, &'static Cluster) {
    let services = shared(Selection::ALL).await;
    let cluster = OPERATOR
        .get_or_init(|| async {
            let cluster = Cluster::new(services).unwrap();
            let took = cluster.install_operator(&[]).unwrap();
            eprintln!("operator installed by helm and available in {took:.1?}");
            cluster
        })
        .await;
    (services, cluster)
}

fn workspace_task(namespace: &str, name: &str, script: &str) -> String {
    let task = json!({
        "apiVersion": "perago.io/v1alpha1",
        "kind": "PeragoTask",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "taskName": format!("{namespace}.{name}"),
            "ownerEmail": "e2e@example.com",
            "workspace": {"prefix": "/data"},
            "paramsSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            "resultSchema": {"type": "object", "properties": {"files": {"type": "integer"}}, "required": ["files"]},
            "controls": {
                "retry": {"count": 2, "logic": "FIXED", "delaySeconds": 0},
                "timeout": {"policy": "RETRY", "seconds": 120, "responseSeconds": 30},
            },
            "executor": {
                "slots": 1,
                "body": {"image": BUSYBOX_BODY_IMAGE, "command": ["sh", "-c", script]},
            },
        },
    });
    serde_json::to_string(&task).unwrap()
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
    let (services, cluster) = cluster().await;
    let (namespace, name) = ("pods-publish", "publish");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task(namespace, name, PUBLISH_BODY))
        .unwrap();
    let ready = cluster.kubectl(&[
        "wait",
        "-n",
        namespace,
        "--for=condition=Ready",
        &format!("peragotask/{name}"),
        "--timeout=120s",
    ]);
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    if let Err(e) = ready {
        let describe = cluster
            .kubectl(&["describe", "pod", "-n", namespace, &pod_name])
            .unwrap_or_default();
        panic!("{e:#}\n{describe}");
    }

    let lake = Lake::new(&services.lakefs().endpoint);
    let repository = format!("pods-publish-{}", std::process::id());
    let input_ref = lake
        .seed(
            &repository,
            &[("data/in.txt", "seed"), ("other/keep.txt", "x")],
        )
        .await
        .unwrap();
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = conductor
        .start(
            &format!("{namespace}.{name}"),
            "real-pod",
            json!({
                "workspace": {"repository": repository, "branch": "main", "refType": "commit", "ref": input_ref},
                "params": {"n": 3},
            }),
        )
        .await;
    let finished = conductor.finished(&workflow).await;
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
    let operator_logs = cluster.operator_logs().unwrap();
    assert!(
        !operator_logs.to_lowercase().contains("forbidden"),
        "the operator was refused by RBAC:\n{operator_logs}"
    );
}
