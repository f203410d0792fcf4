//! The queue watch against the real kube-apiserver + etcd and Conductor: with a resync of an
//! hour, work queued for an autoscaled task at zero replicas scales it up within seconds, from
//! one queue read for all task types, and the figures reach the status and the metrics.

#![allow(clippy::unwrap_used)]

mod operator;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use operator::{eventually, task, within};
use perago_api::PeragoTask;
use perago_e2e::pod::ConductorApi;
use serde_json::json;

#[tokio::test]
async fn queued_work_scales_a_task_up_from_zero_without_waiting_for_its_resync() {
    let services = operator::services().await;
    let operator = operator::start(
        services,
        &["--resync-seconds", "3600", "--queue-poll-seconds", "1"],
    )
    .await;
    let client = services.kube().client().await.unwrap();
    let conductor_url = services.conductor().api_url.clone();
    let conductor = ConductorApi::new(&conductor_url);
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client, "default");
    let mut t = task("woken", "op.woken", "  controls: {retry: {count: 0}}\n");
    t.spec.executor.replicas = 0;
    t.spec.executor.autoscaling = Some(perago_api::task::AutoscalingSpec {
        min_replicas: 0,
        max_replicas: 4,
        target_queue_depth: 1,
        scale_down_stabilization_seconds: 300,
    });
    tasks
        .patch(
            "woken",
            &PatchParams::apply("perago-test").force(),
            &Patch::Apply(&t),
        )
        .await
        .unwrap();
    // No controller-manager runs here: play its status of the Deployment at zero replicas, so
    // the task is Ready and its next reconcile is the resync an hour away. After that only the
    // queue watch can wake it.
    let deployment = eventually("the Deployment exists", || async {
        deployments.get_opt("woken-perago").await.ok()?
    })
    .await;
    deployments
        .patch_status(
            "woken-perago",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"observedGeneration": deployment.metadata.generation}}),
            ),
        )
        .await
        .unwrap();
    eventually("the task is Ready at zero replicas", || async {
        let task = tasks.get("woken").await.ok()?;
        let status = task.status?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && status.queue_depth == Some(0) && status.replicas == Some(0)).then_some(())
    })
    .await;
    let queue_size_calls_before = operator
        .metric(r#"perago_operator_conductor_calls_total{call="queue size",outcome="ok"}"#)
        .await
        .unwrap_or(0.0);

    let started = Instant::now();
    for _ in 0..3 {
        conductor
            .start("op.woken", "load", json!({"params": {"n": 1}}))
            .await;
    }
    within(
        Duration::from_secs(30),
        "the queue watch scales the executor to 3",
        || async {
            let d = deployments.get_opt("woken-perago").await.ok()??;
            (d.spec?.replicas == Some(3)).then_some(())
        },
    )
    .await;
    eprintln!(
        "3 queued at zero replicas: Deployment at 3 after {:.1?} (resync 3600 s, queue poll 1 s)",
        started.elapsed()
    );
    let status = eventually("the status records the decision", || async {
        let status = tasks.get("woken").await.ok()?.status?;
        (status.queue_depth == Some(3)).then_some(status)
    })
    .await;
    let decision = status.last_scale.expect("status.lastScale");
    // One decision from zero, or (when a queue read saw only some of the three) the last of
    // a few; the one standing is the one for all three.
    assert!(decision.to == 3 && decision.from < 3, "{decision:?}");
    assert_eq!(decision.reason, "3 queued + 0 running at 1 per pod: 3 pods");
    assert_eq!(status.running_attempts, Some(0));

    let series = r#"{name="woken",namespace="default"}"#;
    assert_eq!(
        operator
            .metric(&format!("perago_operator_task_queued_attempts{series}"))
            .await,
        Some(3.0)
    );
    assert_eq!(
        operator
            .metric(&format!("perago_operator_task_replicas{series}"))
            .await,
        Some(3.0)
    );
    assert!(
        operator
            .metric(r#"perago_operator_conductor_calls_total{call="queue sizes",outcome="ok"}"#)
            .await
            .unwrap_or(0.0)
            >= 1.0
    );
    assert_eq!(
        operator
            .metric(r#"perago_operator_conductor_calls_total{call="queue size",outcome="ok"}"#)
            .await
            .unwrap_or(0.0),
        queue_size_calls_before,
        "the woken reconcile took the queue from the watch's read, not a call of its own"
    );

    tasks
        .delete("woken", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted task's series are gone", || async {
        let text = reqwest::get(&operator.metrics_url)
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        (!text.contains(r#"name="woken""#)).then_some(())
    })
    .await;
}
