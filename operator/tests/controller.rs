//! The controller against the real kube-apiserver + etcd and the real Conductor: apply a
//! PeragoTask and watch the TaskDef, the ConfigMap, the Deployment and the status follow;
//! repair an edited TaskDef; report an invalid spec; apply the deletion policy.

#![allow(clippy::unwrap_used)]

mod operator;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use operator::{eventually, task, within};
use perago_api::{PeragoTask, taskdef};
use perago_e2e::Services;
use perago_e2e::pod::ConductorApi;
use serde_json::{Value, json};

/// The servers, with the CRD installed and the test binary's operator running (a 1 s resync).
async fn setup() -> (&'static Services, Client) {
    let services = operator::services().await;
    operator::start(services, &["--resync-seconds", "1"]).await;
    (services, services.kube().client().await.unwrap())
}

fn condition(t: &PeragoTask, type_: &str) -> Option<(String, String, String)> {
    t.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn a_peragotask_becomes_a_taskdef_a_contract_and_a_deployment() {
    let (services, client) = setup().await;
    let conductor_url = services.conductor().api_url.clone();
    let conductor = ConductorApi::new(&conductor_url);
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), "default");
    let apply = PatchParams::apply("perago-test").force();

    let t = task("notify", "op.notify", "");
    tasks
        .patch("notify", &apply, &Patch::Apply(&t))
        .await
        .unwrap();
    let live = eventually("the status carries the TaskDef hash", || async {
        let live = tasks.get("notify").await.ok()?;
        live.status.as_ref()?.task_def_hash.as_ref()?;
        Some(live)
    })
    .await;
    // The apiserver returns the schemas with sorted keys; the operator renders what it reads.
    let rendered = taskdef::render(&live.spec).unwrap();
    assert_eq!(
        rendered,
        taskdef::render(&t.spec).unwrap(),
        "the same document, key order aside"
    );
    let status = live.status.clone().unwrap();
    assert_eq!(
        status.task_def_hash.as_deref(),
        Some(taskdef::hash(&rendered).as_str())
    );
    assert_eq!(status.observed_generation, live.metadata.generation);
    assert_eq!(status.selector.as_deref(), Some("perago.io/task=notify"));
    assert_eq!(condition(&live, "Stalled").unwrap().0, "False");
    // No kubelet here: the pods never become ready, so the task is still rolling out.
    let ready = condition(&live, "Ready").unwrap();
    assert_eq!(
        (ready.0.as_str(), ready.1.as_str()),
        ("False", "RollingOut")
    );
    assert_eq!(condition(&live, "Reconciling").unwrap().0, "True");
    assert!(
        live.metadata
            .finalizers
            .unwrap()
            .contains(&"perago.io/taskdef".to_owned())
    );

    let stored = conductor
        .call(reqwest::Method::GET, "/metadata/taskdefs/op.notify", None)
        .await;
    for (key, value) in rendered.as_object().unwrap() {
        if key != "inputSchema" && key != "outputSchema" {
            assert_eq!(&stored[key], value, "{key}");
        }
    }
    assert_eq!(
        stored["inputSchema"]["data"],
        rendered["inputSchema"]["data"]
    );

    let uid = live.metadata.uid.clone().unwrap();
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .get("notify-perago")
        .await
        .unwrap();
    let contract: Value = serde_json::from_str(&cm.data.unwrap()["contract.json"]).unwrap();
    assert_eq!(contract["taskName"], "op.notify");
    assert_eq!(cm.metadata.owner_references.unwrap()[0].uid, uid);
    let d = Api::<Deployment>::namespaced(client.clone(), "default")
        .get("notify-perago")
        .await
        .unwrap();
    assert_eq!(d.metadata.owner_references.unwrap()[0].uid, uid);
    assert_eq!(d.spec.unwrap().replicas, Some(1));

    // Reconciles that would change nothing send no apply: the live objects, as the apiserver
    // stores them, hold everything rendered.
    let unchanged = r#"perago_operator_applies_total{kind="Deployment",outcome="unchanged"}"#;
    let operator = operator::start(services, &[]).await;
    let before = operator.metric(unchanged).await.unwrap_or(0.0);
    eventually("resyncs skip the unchanged Deployment", || async {
        (operator.metric(unchanged).await? >= before + 2.0).then_some(())
    })
    .await;
    // Drift is looked for in one listing of every TaskDef, not a read per task.
    let listed = r#"perago_operator_conductor_calls_total{call="list",outcome="ok"}"#;
    assert!(operator.metric(listed).await.unwrap_or(0.0) >= 1.0);
    let read = r#"perago_operator_conductor_calls_total{call="get",outcome="ok"}"#;
    assert_eq!(
        operator.metric(read).await,
        None,
        "no TaskDef read one by one"
    );
    // Someone edits what the operator applied: the watch sees it and the apply puts it back.
    let deployments = Api::<Deployment>::namespaced(client.clone(), "default");
    let edit = json!({"spec": {"template": {"spec": {"containers": [{"name": "body", "image": "reg/other:2"}]}}}});
    deployments
        .patch(
            "notify-perago",
            &PatchParams::default(),
            &Patch::Strategic(&edit),
        )
        .await
        .unwrap();
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    config_maps
        .patch(
            "notify-perago",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"contract.json": "{}"}})),
        )
        .await
        .unwrap();
    eventually(
        "the edited Deployment and ConfigMap are repaired",
        || async {
            let d = deployments.get("notify-perago").await.ok()?;
            let body = d
                .spec?
                .template
                .spec?
                .containers
                .into_iter()
                .find(|c| c.name == "body")?;
            let cm = config_maps.get("notify-perago").await.ok()?;
            (body.image.as_deref() == Some("reg/body:1")
                && cm.data?["contract.json"].contains("op.notify"))
            .then_some(())
        },
    )
    .await;

    // Someone edits the TaskDef in Conductor: the operator puts it back.
    let mut edited = stored.clone();
    edited["retryCount"] = json!(9);
    conductor
        .call(reqwest::Method::PUT, "/metadata/taskdefs", Some(&edited))
        .await;
    eventually("the edited TaskDef is repaired", || async {
        let now = conductor
            .call(reqwest::Method::GET, "/metadata/taskdefs/op.notify", None)
            .await;
        (now["retryCount"] == rendered["retryCount"]).then_some(())
    })
    .await;

    // A spec change is observed and registered.
    let changed = task("notify", "op.notify", "  controls: {retry: {count: 1}}\n");
    tasks
        .patch("notify", &apply, &Patch::Apply(&changed))
        .await
        .unwrap();
    eventually("the new generation is observed", || async {
        let live = tasks.get("notify").await.ok()?;
        (live.status?.observed_generation == live.metadata.generation).then_some(())
    })
    .await;
    eventually("the new retry count is registered", || async {
        let now = conductor
            .call(reqwest::Method::GET, "/metadata/taskdefs/op.notify", None)
            .await;
        (now["retryCount"] == json!(1)).then_some(())
    })
    .await;

    // An invalid spec stalls with the validation message and touches nothing.
    let invalid = task(
        "broken",
        "op.broken",
        "  workspace: {prefix: /data, pre: [{kind: requireFile, path: '../etc'}]}\n",
    );
    tasks
        .patch("broken", &apply, &Patch::Apply(&invalid))
        .await
        .unwrap();
    let stalled = eventually("the invalid task is stalled", || async {
        let live = tasks.get("broken").await.ok()?;
        condition(&live, "Stalled").filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(stalled.1, "InvalidSpec");
    assert!(
        stalled
            .2
            .contains("workspace guardrail paths must be relative and must not contain '..'"),
        "{}",
        stalled.2
    );
    assert!(
        Api::<Deployment>::namespaced(client.clone(), "default")
            .get_opt("broken-perago")
            .await
            .unwrap()
            .is_none()
    );

    // Delete with deletionPolicy: Delete removes the TaskDef, then the finalizer.
    tasks
        .delete("notify", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the PeragoTask is gone", || async {
        tasks.get_opt("notify").await.ok()?.is_none().then_some(())
    })
    .await;
    let resp = reqwest::get(format!("{conductor_url}/metadata/taskdefs/op.notify"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "the TaskDef was deleted");
    tasks
        .delete("broken", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn autoscaling_follows_the_queue_depth_with_a_scale_down_window() {
    let (services, client) = setup().await;
    let conductor_url = services.conductor().api_url.clone();
    let conductor = ConductorApi::new(&conductor_url);
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let t = task("scaled", "op.scaled", "  controls: {retry: {count: 0}}\n");
    let mut t = t;
    t.spec.executor.replicas = 0;
    t.spec.executor.autoscaling = Some(perago_api::task::AutoscalingSpec {
        min_replicas: 0,
        max_replicas: 3,
        target_queue_depth: 2,
        scale_down_stabilization_seconds: 3,
    });
    tasks
        .patch(
            "scaled",
            &PatchParams::apply("perago-test").force(),
            &Patch::Apply(&t),
        )
        .await
        .unwrap();
    eventually("the TaskDef is registered", || async {
        reqwest::get(format!("{conductor_url}/metadata/taskdefs/op.scaled"))
            .await
            .ok()?
            .status()
            .is_success()
            .then_some(())
    })
    .await;

    // Five scheduled tasks at two per pod: three pods (the maximum).
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            conductor
                .start("op.scaled", "load", json!({"params": {"n": 1}}))
                .await,
        );
    }
    eventually("the executor scales to 3", || async {
        let d = deployments.get_opt("scaled-perago").await.ok()??;
        (d.spec?.replicas == Some(3)).then_some(())
    })
    .await;
    let live = tasks.get("scaled").await.unwrap();
    assert_eq!(
        live.spec.executor.replicas, 3,
        "through the /scale subresource"
    );
    // The status is written at the end of the reconcile that scaled the Deployment.
    eventually("the status shows the queue", || async {
        let status = tasks.get("scaled").await.ok()?.status?;
        (status.queue_depth == Some(5) && status.running_attempts == Some(0)).then_some(())
    })
    .await;

    // Drain the queue (a worker takes every task): back to the minimum after the window.
    for _ in 0..5 {
        let polled = eventually("a task is polled", || async {
            let batch = conductor
                .call(
                    reqwest::Method::GET,
                    "/tasks/poll/batch/op.scaled?workerid=drain&count=5&timeout=500",
                    None,
                )
                .await;
            batch.as_array().filter(|b| !b.is_empty()).cloned()
        })
        .await;
        for t in &polled {
            conductor
                .call(
                    reqwest::Method::POST,
                    "/tasks",
                    Some(&json!({"workflowInstanceId": t["workflowInstanceId"], "taskId": t["taskId"],
                                 "workerId": "drain", "status": "COMPLETED", "outputData": {"result": {"ok": true}}})),
                )
                .await;
        }
        if polled.len() >= 5 {
            break;
        }
        let depth = conductor
            .call(
                reqwest::Method::GET,
                "/tasks/queue/size?taskType=op.scaled",
                None,
            )
            .await;
        if depth == json!(0) {
            break;
        }
    }
    let drained = Instant::now();
    // No controller-manager runs here, so the executor's pods never appear, and a scale-in
    // within a minute of the operator's own scale-up waits for the pods the watch does not
    // show yet (ADR 0032): the scale to 0 comes about a minute after the scale to 3.
    within(
        Duration::from_secs(120),
        "the executor scales to 0",
        || async {
            let d = deployments.get_opt("scaled-perago").await.ok()??;
            (d.spec?.replicas == Some(0)).then_some(())
        },
    )
    .await;
    assert!(
        drained.elapsed() >= Duration::from_secs(2),
        "the scale-down waited for the window: {:?}",
        drained.elapsed()
    );
    tasks
        .delete("scaled", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn retained_taskdefs_survive_and_an_hpa_owns_replicas_through_scale() {
    let (services, client) = setup().await;
    let conductor_url = services.conductor().api_url.clone();
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let mut t = task("kept", "op.kept", "");
    t.spec.deletion_policy = perago_api::task::DeletionPolicy::Retain;
    tasks
        .patch(
            "kept",
            &PatchParams::apply("perago-test").force(),
            &Patch::Apply(&t),
        )
        .await
        .unwrap();
    eventually("the Deployment exists", || async {
        deployments.get_opt("kept-perago").await.ok()?
    })
    .await;

    // Something else (an HPA, KEDA, kubectl scale) drives /scale: the operator follows it.
    tasks
        .patch_scale(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    eventually("the Deployment follows /scale", || async {
        let d = deployments.get_opt("kept-perago").await.ok()??;
        (d.spec?.replicas == Some(4)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        tasks.get("kept").await.unwrap().spec.executor.replicas,
        4,
        "not fought back"
    );
    let scale = tasks.get_scale("kept").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(4));

    tasks
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the PeragoTask is gone", || async {
        tasks.get_opt("kept").await.ok()?.is_none().then_some(())
    })
    .await;
    let resp = reqwest::get(format!("{conductor_url}/metadata/taskdefs/op.kept"))
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        200,
        "deletionPolicy: Retain keeps the TaskDef"
    );
}

#[tokio::test]
async fn an_unreachable_conductor_is_reported_and_the_task_recovers_when_it_is_reachable() {
    let (services, client) = setup().await;
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), "default");
    let apply = PatchParams::apply("perago-test").force();
    let nowhere = format!(
        "http://127.0.0.1:{}/api",
        perago_e2e::process::free_port().unwrap()
    );
    let t = task(
        "offline",
        "op.offline",
        &format!("  conductor: {{url: \"{nowhere}\"}}\n"),
    );
    tasks
        .patch("offline", &apply, &Patch::Apply(&t))
        .await
        .unwrap();
    let ready = eventually("Ready=False ConductorUnavailable", || async {
        let live = tasks.get("offline").await.ok()?;
        condition(&live, "Ready").filter(|c| c.1 == "ConductorUnavailable")
    })
    .await;
    assert_eq!(ready.0, "False");
    assert!(
        ready.2.contains("127.0.0.1"),
        "names the server: {}",
        ready.2
    );
    let live = tasks.get("offline").await.unwrap();
    assert_eq!(condition(&live, "Reconciling").unwrap().0, "True");
    assert_eq!(condition(&live, "Stalled").unwrap().0, "False", "transient");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let warned = eventually("a ConductorUnavailable Warning event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("ConductorUnavailable")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("offline")
        })
    })
    .await;
    assert_eq!(warned.type_.as_deref(), Some("Warning"));
    assert!(
        Api::<Deployment>::namespaced(client.clone(), "default")
            .get_opt("offline-perago")
            .await
            .unwrap()
            .is_none(),
        "no executor pods for a task whose TaskDef is not registered"
    );

    // Pointed at a reachable Conductor, the task registers and rolls out.
    let fixed = task(
        "offline",
        "op.offline",
        &format!(
            "  conductor: {{url: \"{}\"}}\n",
            services.conductor().api_url
        ),
    );
    tasks
        .patch("offline", &apply, &Patch::Apply(&fixed))
        .await
        .unwrap();
    let ready = eventually("Ready=False RollingOut after recovery", || async {
        let live = tasks.get("offline").await.ok()?;
        live.status.as_ref()?.task_def_hash.as_ref()?;
        condition(&live, "Ready").filter(|c| c.1 == "RollingOut")
    })
    .await;
    assert_eq!(ready.0, "False");
    tasks
        .delete("offline", &DeleteParams::default())
        .await
        .unwrap();
}

/// No kubelet or controller-manager runs here, so the test reports the Deployment's rollout
/// through its `/status` subresource, as the Deployment controller would: the task turns
/// Ready only once every replica of the current generation is updated and ready.
#[tokio::test]
async fn a_rolled_out_deployment_makes_the_task_ready() {
    let (_, client) = setup().await;
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let apply = PatchParams::apply("perago-test").force();
    let mut t = task("rollout", "op.rollout", "");
    t.spec.executor.replicas = 2;
    tasks
        .patch("rollout", &apply, &Patch::Apply(&t))
        .await
        .unwrap();
    let generation = eventually("the Deployment exists", || async {
        deployments
            .get("rollout-perago")
            .await
            .ok()?
            .metadata
            .generation
    })
    .await;

    let report = |ready: i32| {
        json!({"status": {"observedGeneration": generation, "replicas": 2,
                          "updatedReplicas": 2, "readyReplicas": ready, "availableReplicas": ready}})
    };
    deployments
        .patch_status(
            "rollout-perago",
            &PatchParams::default(),
            &Patch::Merge(&report(1)),
        )
        .await
        .unwrap();
    let live = eventually("readyReplicas 1 in the status", || async {
        let live = tasks.get("rollout").await.ok()?;
        (live.status.as_ref()?.ready_replicas == Some(1)).then_some(live)
    })
    .await;
    let ready = condition(&live, "Ready").unwrap();
    assert_eq!(
        (ready.0.as_str(), ready.1.as_str()),
        ("False", "RollingOut")
    );

    deployments
        .patch_status(
            "rollout-perago",
            &PatchParams::default(),
            &Patch::Merge(&report(2)),
        )
        .await
        .unwrap();
    let live = eventually("Ready=True once both replicas are ready", || async {
        let live = tasks.get("rollout").await.ok()?;
        condition(&live, "Ready")
            .filter(|c| c.0 == "True")
            .map(|_| live)
    })
    .await;
    let status = live.status.clone().unwrap();
    assert_eq!((status.replicas, status.ready_replicas), (Some(2), Some(2)));
    assert_eq!(condition(&live, "Reconciling").unwrap().0, "False");
    assert_eq!(condition(&live, "Stalled").unwrap().0, "False");
    assert_eq!(status.observed_generation, live.metadata.generation);

    tasks
        .delete("rollout", &DeleteParams::default())
        .await
        .unwrap();
}
