//! Scaling figures on the real node, with the operator installed from the chart:
//! - scale from zero, over `PERAGO_BENCH_RUNS` (20) runs: the operator's decision (workflow
//!   started → replicas raised), the pod's share (decision → first poll), the attempt (first
//!   poll → COMPLETED) and the whole path, p50 and p95;
//! - the drain of a pod deleted while its 4 slots are busy;
//! - the operator with `PERAGO_BENCH_TASKS` (200) autoscaled PeragoTasks idle: time until all
//!   are Ready, then its CPU and its Conductor calls per minute (0 skips it).
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
        "  {name:<28} p50 {:>6.2} s   p95 {:>6.2} s   max {:>6.2} s",
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

async fn scale_from_zero(services: &Services, cluster: &Cluster, runs: usize) {
    let (namespace, name) = ("bench-zero", "cold");
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
        let id = conductor
            .start(
                &format!("{namespace}.{name}"),
                &format!("run-{run}"),
                json!({"params": {}}),
            )
            .await;
        // The decision is the scale-up from zero that follows the start; a later scale-in
        // replaces it in the status, so it is caught while the run goes on.
        let begun = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
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
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs_f64()
                    - begun
                    < 120.0,
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
        decision.push(decided - scheduled);
        pod.push(polled - decided);
        attempt.push(ended - polled);
        to_poll.push(polled - scheduled);
        total.push(ended - scheduled);
    }
    println!("scale from zero ({runs} runs, queuePollSeconds 2, one pod, workspace-free body):");
    summary("decision (scheduled→scaled)", decision);
    summary("pod (scaled→first poll)", pod);
    summary("attempt (poll→COMPLETED)", attempt);
    summary("whole path (→first poll)", to_poll);
    summary("to COMPLETED", total);
}

async fn drain(services: &Services, cluster: &Cluster) {
    let (namespace, name) = ("bench-drain", "busy");
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

/// utime + stime of every process named `comm`, in seconds.
fn cpu_seconds(comm: &str) -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let path = entry.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if name.trim() != comm {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        // Fields after the `(comm)`: state is the 3rd field, utime the 14th, stime the 15th.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let utime: f64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0.0);
        let stime: f64 = fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0.0);
        total += (utime + stime) / ticks;
    }
    total
}

/// `perago_operator_conductor_calls_total` by call, from the leading operator pod.
async fn conductor_calls(metrics_url: &str) -> std::collections::BTreeMap<String, f64> {
    let text = reqwest::get(metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut calls = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("perago_operator_conductor_calls_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let call = labels
            .split(',')
            .find_map(|l| l.strip_prefix("call=\""))
            .map(|c| c.trim_end_matches('"').to_owned())
            .unwrap_or_default();
        *calls.entry(call).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    calls
}

async fn idle_tasks(services: &Services, cluster: &Cluster, count: usize) {
    let namespace = "bench-idle";
    cluster.task_namespace(namespace).unwrap();
    let manifests: Vec<String> = (0..count)
        .map(|i| {
            let mut t = task(namespace, &format!("idle-{i:03}"), DONE, json!({}));
            t["spec"]["executor"]["autoscaling"] = json!({
                "minReplicas": 0, "maxReplicas": 2, "targetQueueDepth": 1,
            });
            serde_yaml::to_string(&t).unwrap()
        })
        .collect();
    let applied = Instant::now();
    cluster.apply(&manifests.join("---\n")).unwrap();
    cluster
        .kubectl(&[
            "wait",
            "-n",
            namespace,
            "--for=condition=Ready",
            "peragotask",
            "--all",
            "--timeout=900s",
        ])
        .unwrap();
    let ready = applied.elapsed();
    let client = services.kube().client().await.unwrap();
    let operator = Api::<Pod>::namespaced(client, "perago-system")
        .list(&ListParams::default().labels("app.kubernetes.io/name=perago-operator"))
        .await
        .unwrap()
        .items
        .remove(0);
    let metrics = format!(
        "http://{}:8080/metrics",
        operator.status.unwrap().pod_ip.unwrap()
    );
    // Settle: the reconciles of the apply are done once every task is Ready.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let window = Duration::from_secs(60);
    let (cpu0, calls0) = (
        cpu_seconds("perago-operator"),
        conductor_calls(&metrics).await,
    );
    tokio::time::sleep(window).await;
    let (cpu1, calls1) = (
        cpu_seconds("perago-operator"),
        conductor_calls(&metrics).await,
    );
    let minutes = window.as_secs_f64() / 60.0;
    println!(
        "operator with {count} autoscaled PeragoTasks idle at zero (resync 60 s, queue poll 2 s):"
    );
    println!(
        "  applied → all Ready: {:.1} s ({:.1} tasks/s)",
        ready.as_secs_f64(),
        count as f64 / ready.as_secs_f64()
    );
    println!(
        "  operator CPU: {:.2} s per minute ({:.1} % of one core)",
        (cpu1 - cpu0) / minutes,
        (cpu1 - cpu0) / window.as_secs_f64() * 100.0
    );
    let mut all = 0.0;
    for (call, after) in &calls1 {
        let per_minute = (after - calls0.get(call).copied().unwrap_or(0.0)) / minutes;
        all += per_minute;
        println!("  Conductor {call:<14} {per_minute:>7.1} calls/min");
    }
    println!("  Conductor calls in all  {all:>7.1} calls/min");
    cluster
        .kubectl(&["delete", "namespace", namespace, "--wait=false"])
        .unwrap();
}

/// After a `helm upgrade`: until the admission webhook answers through its Service again.
fn wait_for_webhook(cluster: &Cluster) {
    let probe = task("default", "webhook-probe", DONE, json!({})).to_string();
    let path = std::env::temp_dir().join(format!("perago-bench-probe-{}.json", std::process::id()));
    std::fs::write(&path, probe).unwrap();
    let started = Instant::now();
    while cluster
        .kubectl(&["apply", "--dry-run=server", "-f", path.to_str().unwrap()])
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the webhook never answered"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = std::fs::remove_file(path);
}

#[tokio::main]
async fn main() {
    if perago_e2e::node_opted_out("scaling benchmark") {
        return;
    }
    let services = perago_e2e::shared(Selection::ALL).await;
    let cluster = Cluster::new(services).unwrap();
    cluster
        .install_operator(&["--set", "resyncSeconds=60", "--set", "replicas=1"])
        .unwrap();
    // The scale-down after each run waits for a resync: a short one for that part.
    let runs = setting("PERAGO_BENCH_RUNS", 20);
    cluster
        .helm(&[
            "upgrade",
            perago_e2e::cluster::RELEASE,
            "charts/perago-operator",
            "--namespace",
            "perago-system",
            "--reuse-values",
            "--set",
            "resyncSeconds=3",
            "--wait",
        ])
        .unwrap();
    wait_for_webhook(&cluster);
    scale_from_zero(services, &cluster, runs).await;
    drain(services, &cluster).await;
    cluster
        .helm(&[
            "upgrade",
            perago_e2e::cluster::RELEASE,
            "charts/perago-operator",
            "--namespace",
            "perago-system",
            "--reuse-values",
            "--set",
            "resyncSeconds=60",
            "--wait",
        ])
        .unwrap();
    let tasks = setting("PERAGO_BENCH_TASKS", 200);
    if tasks > 0 {
        wait_for_webhook(&cluster);
        idle_tasks(services, &cluster, tasks).await;
    }
}
