//! The real kube-apiserver: the committed CRD installs, and a PeragoTask round-trips through
//! server-side apply with its defaults, CEL rules and subresources.

#![allow(clippy::unwrap_used)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use perago_api::PeragoTask;
use perago_e2e::{Selection, shared};

async fn client() -> Client {
    let services = shared(Selection {
        kube: true,
        ..Selection::default()
    })
    .await;
    services.kube().client().await.unwrap()
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path),
    )
    .unwrap()
}

async fn install_crd(client: &Client) {
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&repo_file("crds/peragotasks.perago.io.yaml")).unwrap();
    perago_e2e::apply_crd(client, &crd, "perago-e2e")
        .await
        .unwrap();
}

#[tokio::test]
async fn crd_installs_and_peragotask_round_trips_with_server_side_apply() {
    let client = client().await;
    install_crd(&client).await;
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), "default");

    let manifest = repo_file("deploy/examples/read-only-task.yaml");
    let task = perago_api::manifest::parse(&manifest)
        .unwrap()
        .remove(0)
        .task;
    let applied = tasks
        .patch(
            "features-validate",
            &PatchParams::apply("perago-e2e").force(),
            &Patch::Apply(&task),
        )
        .await
        .unwrap();
    let read = tasks.get("features-validate").await.unwrap();
    assert_eq!(
        read.spec, task.spec,
        "the spec survives the apiserver unchanged"
    );
    assert!(applied.spec.strict_params);
    assert_eq!(read.spec.controls.retry.count, 3);
    let managers: Vec<_> = read
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&"perago-e2e".to_owned()));

    // Status and scale subresources exist.
    let status = tasks.get_status("features-validate").await.unwrap();
    assert!(status.status.is_none());
    let scale = tasks.get_scale("features-validate").await.unwrap();
    assert_eq!(
        scale.spec.and_then(|s| s.replicas),
        Some(1),
        "replicas default to 1"
    );

    // An HPA or KEDA scales through /scale.
    let patched = tasks
        .patch_scale(
            "features-validate",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.and_then(|s| s.replicas), Some(3));
    assert_eq!(
        tasks
            .get("features-validate")
            .await
            .unwrap()
            .spec
            .executor
            .replicas,
        3
    );
}

/// Create the workspace-free example, changed by `mutate`, and expect the apiserver to refuse
/// it with `expected` in the message.
async fn assert_rejected(
    tasks: &Api<PeragoTask>,
    name: &str,
    mutate: impl FnOnce(&mut PeragoTask),
    expected: &str,
) {
    let manifest = repo_file("deploy/examples/workspace-free-task.yaml");
    let mut task = perago_api::manifest::parse(&manifest)
        .unwrap()
        .remove(0)
        .task;
    task.metadata.name = Some(name.into());
    mutate(&mut task);
    let err = tasks
        .create(&PostParams::default(), &task)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(expected), "{name}: {err}");
}

#[tokio::test]
async fn cel_rules_reject_what_the_schema_cannot_express() {
    let client = client().await;
    install_crd(&client).await;
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), "default");
    let budget = |t: &mut PeragoTask| {
        t.spec.controls.publish_budget = Some(perago_api::task::PublishBudget {
            observed_merge_p99_seconds: 1,
            safety_margin_seconds: 1,
            lakefs_merge_timeout_seconds: 5,
            conductor_completion_timeout_seconds: 5,
            worker_shutdown_grace_seconds: 5,
            heartbeat_interval_seconds: 5,
        })
    };
    assert_rejected(
        &tasks,
        "cel-budget",
        budget,
        "publish_budget requires workspace=WorkspaceSpec(...)",
    )
    .await;
    let scaling = |t: &mut PeragoTask| {
        t.spec.executor.autoscaling = Some(perago_api::task::AutoscalingSpec {
            min_replicas: 4,
            max_replicas: 3,
            target_queue_depth: 1,
            scale_down_stabilization_seconds: 60,
        })
    };
    assert_rejected(
        &tasks,
        "cel-scaling",
        scaling,
        "autoscaling.minReplicas must be <= maxReplicas",
    )
    .await;
    let retry = |t: &mut PeragoTask| t.spec.controls.retry.count = 11;
    assert_rejected(&tasks, "cel-retry", retry, "spec.controls.retry.count").await;
}
