//! Scaling figures on the real node, with the operator installed from the chart:
//! - scale from zero, over `PERAGO_BENCH_RUNS` (20) runs: the operator's decision (workflow
//!   started → replicas raised), the pod's share (decision → first poll), the attempt (first
//!   poll → COMPLETED) and the whole path, p50 and p95; and the pod's share step by step, as
//!   a watch of the task's pods sees each step (the API's own timestamps are whole seconds);
//! - the drain of a pod deleted while its 4 slots are busy.
//!
//! The operator with hundreds of tasks is the `operator` benchmark.
//!
//! It prints figures; it asserts only that the work it measures completed.
//! `cargo bench -p perago-e2e --bench scaling` (part of `make bench`).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use perago_api::PeragoTask;
use perago_e2e::cluster::Cluster;
use perago_e2e::node::BUSYBOX_BODY_IMAGE;
use perago_e2e::pod::ConductorApi;
use perago_e2e::{Selection, Services};
use serde_json::{Value, json};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A workspace-free task on busybox whose body runs `script`, with `executor` merged in.
fn task(namespace: &str, name: &str, script: &str, executor: Value) -> Value {
    let mut spec_executor = json!({
        "slots": 1,
        "body": {"image": BUSYBOX_BODY_IMAGE, "command": ["sh", "-c", script]},
    });
    for (key, value) in executor.as_object().unwrap() {
        spec_executor[key] = value.clone();
    }
    json!({
        "apiVersion": "perago.io/v1alpha1",
        "kind": "PeragoTask",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "taskName": format!("{namespace}.{name}"),
            "ownerEmail": "bench@example.com",
            "paramsSchema": {"type": "object"},
            "resultSchema": {"type": "object"},
            "controls": {"retry": {"count": 0}, "timeout": {"policy": "TIME_OUT_WF", "seconds": 120, "responseSeconds": 60}},
            "executor": spec_executor,
        },
    })
}

const DONE: &str = "printf '{}' > \"$PERAGO_RESULT\"";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summary(name: &str, mut values: Vec<f64>) {
    values.sort_by(f64::total_cmp);
    println!(
        "  {name:<44} p50 {:>6.2} s   p95 {:>6.2} s   max {:>6.2} s",
        percentile(&values, 50.0),
        percentile(&values, 95.0),
        values.last().copied().unwrap_or(f64::NAN)
    );
}

fn millis(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN) / 1000.0
}

async fn pods(client: &kube::Client, namespace: &str, name: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("perago.io/task={name}")))
        .await
        .unwrap()
        .items
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The steps of a pod's start, in order: the first two as a watch of the task's pods sees
/// them, the other two from the sidecar's log (its clock is this machine's). The kubelet
/// reports container states only at its next relist of the runtime, up to a second late, so
/// the pod's own log times its containers.
const STEPS: [&str; 4] = [
    "pod created",
    "scheduled",
    "sidecar serving",
    "runner connected",
];

/// When the first pod of the task since [`Steps::reset`] was first seen, and scheduled; and
/// its name.
#[derive(Clone, Default)]
struct Steps(std::sync::Arc<std::sync::Mutex<Seen>>);

/// The pod's name and when it was first seen, and scheduled.
type Seen = (Option<String>, [Option<f64>; 2]);

impl Steps {
    fn watch(&self, client: &kube::Client, namespace: &str, name: &str) {
        use futures_util::StreamExt;
        use kube::runtime::watcher::{Config, Event, watcher};
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let config = Config::default().labels(&format!("perago.io/task={name}"));
        let seen = self.clone();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, config));
            while let Some(event) = events.next().await {
                let (Event::Apply(pod) | Event::InitApply(pod)) = event.unwrap() else {
                    continue;
                };
                let at = now();
                let mut state = seen.0.lock().unwrap();
                if state.0.is_none() {
                    state.0 = pod.metadata.name.clone();
                }
                if state.0 != pod.metadata.name {
                    continue;
                }
                let scheduled = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
                for (step, reached) in [true, scheduled].into_iter().enumerate() {
                    if reached && state.1[step].is_none() {
                        state.1[step] = Some(at);
                    }
                }
            }
        });
    }

    fn reset(&self) {
        *self.0.lock().unwrap() = (None, [None; 2]);
    }

    /// Every step's time, the log's from `cluster`; the pod must have been seen.
    fn taken(&self, cluster: &Cluster, namespace: &str) -> [f64; 4] {
        let (pod, seen) = self.0.lock().unwrap().clone();
        let pod = pod.expect("no pod of the task was seen");
        let log = cluster
            .kubectl(&["logs", "-n", namespace, &pod, "-c", "perago-sidecar"])
            .unwrap();
        let logged = |message: &str| {
            log.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| v["message"] == message || v["fields"]["message"] == message)
                .and_then(|v| {
                    v["timestamp"]
                        .as_str()?
                        .parse::<k8s_openapi::jiff::Timestamp>()
                        .ok()
                })
                .map(|t| t.as_microsecond() as f64 / 1e6)
                .unwrap_or_else(|| panic!("{pod}: no '{message}' in its sidecar's log:\n{log}"))
        };
        [
            seen[0].expect("the pod was seen"),
            seen[1].unwrap_or_else(|| panic!("{pod} was not seen scheduled")),
            logged("sidecar started"),
            logged("runner connected"),
        ]
    }
}

async fn scale_from_zero(services: &Services, cluster: &Cluster, runs: usize) {
    let (namespace, name) = (NAMESPACES[0], "cold");
    cluster.task_namespace(namespace).unwrap();
    let mut manifest = task(namespace, name, DONE, json!({}));
    manifest["spec"]["executor"]["autoscaling"] = json!({
        "minReplicas": 0, "maxReplicas": 1, "targetQueueDepth": 1,
        "scaleDownStabilizationSeconds": 0,
    });
    cluster.apply(&manifest.to_string()).unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let client = services.kube().client().await.unwrap();
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), namespace);
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let (mut decision, mut pod, mut attempt, mut to_poll, mut total) =
        (vec![], vec![], vec![], vec![], vec![]);
    let steps = Steps::default();
    steps.watch(&client, namespace, name);
    // Per step: seconds from the step before (the decision before the first), and from the
    // last step to the first poll.
    let mut step_seconds: Vec<Vec<f64>> = vec![vec![]; STEPS.len() + 1];
    for run in 0..runs {
        // At zero: no pod left from the run before.
        let idle = Instant::now();
        while !pods(&client, namespace, name).await.is_empty() {
            assert!(idle.elapsed() < Duration::from_secs(120), "pods stay");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Work arrives at any moment, not in step with the operator's queue reads.
        let jitter = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
            / 400_000;
        tokio::time::sleep(Duration::from_millis(u64::from(jitter))).await;
        steps.reset();
        let id = conductor
            .start(
                &format!("{namespace}.{name}"),
                &format!("run-{run}"),
                json!({"params": {}}),
            )
            .await;
        // The decision is the scale-up from zero that follows the start; a later scale-in
        // replaces it in the status, so it is caught while the run goes on.
        let begun = now();
        let mut decided = None;
        let workflow = loop {
            if decided.is_none() {
                let status = tasks.get(name).await.unwrap().status.unwrap_or_default();
                decided = status
                    .last_scale
                    .filter(|s| s.from == 0 && s.to >= 1)
                    .map(|s| s.time.0.as_millisecond() as f64 / 1000.0)
                    .filter(|t| *t >= begun - 1.0);
            }
            let workflow = conductor.workflow(&id).await;
            if decided.is_some() && workflow["status"] != "RUNNING" {
                break workflow;
            }
            assert!(
                now() - begun < 120.0,
                "run {run}: no scale-up from zero recorded, or no end: {workflow}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(workflow["status"], "COMPLETED", "{workflow}");
        let step = &workflow["tasks"][0];
        let scheduled = millis(&step["scheduledTime"]);
        let polled = millis(&step["startTime"]);
        let ended = millis(&step["endTime"]);
        let decided = decided.unwrap();
        let mut before = decided;
        for (i, at) in steps.taken(cluster, namespace).into_iter().enumerate() {
            step_seconds[i].push(at - before);
            before = at;
        }
        step_seconds[STEPS.len()].push(polled - before);
        decision.push(decided - scheduled);
        pod.push(polled - decided);
        attempt.push(ended - polled);
        to_poll.push(polled - scheduled);
        total.push(ended - scheduled);
    }
    println!(
        "scale from zero ({runs} runs, the chart's queuePollSeconds, one pod, workspace-free body):"
    );
    summary("decision (scheduled→scaled)", decision);
    summary("pod (scaled→first poll)", pod);
    let mut from = "scaled";
    for (i, seconds) in step_seconds.into_iter().enumerate() {
        let to = STEPS.get(i).copied().unwrap_or("first poll");
        summary(&format!("  {from} → {to}"), seconds);
        from = to;
    }
    summary("attempt (poll→COMPLETED)", attempt);
    summary("whole path (→first poll)", to_poll);
    summary("to COMPLETED", total);
}

async fn drain(services: &Services, cluster: &Cluster) {
    let (namespace, name) = (NAMESPACES[1], "busy");
    cluster.task_namespace(namespace).unwrap();
    let body = format!("sleep 5; {DONE}");
    let manifest = task(namespace, name, &body, json!({"slots": 4, "replicas": 1}));
    cluster.apply(&manifest.to_string()).unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let client = services.kube().client().await.unwrap();
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            conductor
                .start(
                    &format!("{namespace}.{name}"),
                    &format!("d{i}"),
                    json!({"params": {}}),
                )
                .await,
        );
    }
    let the_pod = pods(&client, namespace, name).await.remove(0);
    let ip = the_pod.status.unwrap().pod_ip.unwrap();
    let slots = format!("http://{ip}:9464/slots");
    let busy = Instant::now();
    loop {
        let answer: Value = reqwest::get(&slots).await.unwrap().json().await.unwrap();
        if answer["busy"] == 4 {
            break;
        }
        assert!(busy.elapsed() < Duration::from_secs(60), "{answer}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pod_name = the_pod.metadata.name.unwrap();
    let deleted = Instant::now();
    let deleted_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    cluster
        .kubectl(&["delete", "pod", "-n", namespace, &pod_name, "--wait=false"])
        .unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    while api.get_opt(&pod_name).await.unwrap().is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone = deleted.elapsed().as_secs_f64();
    let mut last_end = 0f64;
    for id in &ids {
        let workflow = conductor.finished(id).await;
        assert_eq!(workflow["status"], "COMPLETED", "{workflow}");
        let attempts = workflow["tasks"].as_array().unwrap().len();
        assert_eq!(attempts, 1, "one attempt each: {workflow}");
        last_end = last_end.max(millis(&workflow["tasks"][0]["endTime"]));
    }
    println!("drain of a pod deleted with 4 busy slots (5 s bodies):");
    println!(
        "  last attempt COMPLETED {:.2} s after the delete; pod gone {gone:.2} s after it; 4/4 attempts reported by the stopping pod, none retried",
        last_end - deleted_at
    );
}

/// The Helm values the benchmark installs the operator with: the scale-down after each run
/// waits for a resync, so a short one.
pub const OPERATOR_VALUES: [&str; 4] = ["--set", "resyncSeconds=3", "--set", "replicas=1"];

/// The namespaces the benchmark leaves behind, with their tasks.
pub const NAMESPACES: [&str; 2] = ["bench-zero", "bench-drain"];

/// The benchmark on the node's cluster, the operator installed with [`OPERATOR_VALUES`].
pub async fn bench(services: &Services, cluster: &Cluster) {
    cluster.wait_for_webhook().unwrap();
    let runs = setting("PERAGO_BENCH_RUNS", 20);
    scale_from_zero(services, cluster, runs).await;
    drain(services, cluster).await;
}

#[tokio::main]
async fn main() {
    if perago_e2e::node_opted_out("scaling benchmark") {
        return;
    }
    let services = perago_e2e::shared(Selection::ALL).await;
    let cluster = Cluster::new(services).unwrap();
    cluster.install_operator(&OPERATOR_VALUES).unwrap();
    bench(services, &cluster).await;
}
