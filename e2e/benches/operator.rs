//! The operator at scale, on the real node with the operator installed from the chart
//! (resync 60 s, queue poll 2 s, one replica): `PERAGO_BENCH_TASKS` (500) PeragoTasks applied
//! at once, first autoscaled (idle at zero), then with a fixed `replicas: 0`, each on a
//! fresh operator process (the install's, then a restarted one). For each it prints the time
//! until every TaskDef is in Conductor and every task Ready, the operator's peak resident
//! memory and CPU, the Conductor calls, apiserver requests and the operator's applies (sent,
//! or skipped as unchanged) of the apply, then the same per minute over
//! `PERAGO_BENCH_STEADY_SECONDS` (60) in which nothing changes, and the time to delete them.
//!
//! `PERAGO_E2E_CONTROLLER_MANAGER_QPS` raises the node's controller-manager request rate (20
//! per second per controller by default), which bounds how soon 500 new Deployments are
//! observed and so when the tasks turn Ready.
//!
//! It prints figures; it asserts only that the work it measures completed.
//! `cargo bench -p perago-e2e --bench operator` (part of `make bench`).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use perago_e2e::cluster::Cluster;
use perago_e2e::measure::{counter_by, cpu_seconds, delta, peak_rss_mib, rss_mib, scrape};
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

fn task(namespace: &str, name: &str, autoscaled: bool) -> Value {
    let mut executor = json!({
        "slots": 1,
        "body": {"image": BUSYBOX_BODY_IMAGE, "command": ["sh", "-c", "printf '{}' > \"$PERAGO_RESULT\""]},
    });
    if autoscaled {
        executor["autoscaling"] =
            json!({"minReplicas": 0, "maxReplicas": 2, "targetQueueDepth": 1});
    } else {
        executor["replicas"] = json!(0);
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
            "executor": executor,
        },
    })
}

/// What the operator and the apiserver have counted so far.
struct Counters {
    at: Instant,
    cpu: f64,
    conductor: BTreeMap<String, f64>,
    apiserver: BTreeMap<String, f64>,
    /// ConfigMap and Deployment applies sent, and skipped as unchanged.
    applies: BTreeMap<String, f64>,
}

/// The resources a PeragoTask's reconcile reads and writes (the apiserver requests counted).
const RESOURCES: [&str; 5] = ["peragotasks", "configmaps", "deployments", "events", "pods"];

async fn counters(client: &kube::Client, operator_metrics: &str) -> Counters {
    let operator = scrape(operator_metrics).await;
    let apiserver = Cluster::apiserver_metrics(client).await.unwrap();
    let apiserver = counter_by(&apiserver, "apiserver_request_total", &["verb", "resource"])
        .into_iter()
        .filter(|(k, _)| RESOURCES.iter().any(|r| k.ends_with(&format!("/{r}"))))
        .collect();
    Counters {
        at: Instant::now(),
        cpu: cpu_seconds("perago-operator"),
        conductor: counter_by(
            &operator,
            "perago_operator_conductor_calls_total",
            &["call"],
        ),
        apiserver,
        applies: counter_by(
            &operator,
            "perago_operator_applies_total",
            &["kind", "outcome"],
        ),
    }
}

fn print_counts(title: &str, before: &Counters, after: &Counters, per_minute: bool, tasks: usize) {
    let minutes = after.at.duration_since(before.at).as_secs_f64() / 60.0;
    let scale = if per_minute { 1.0 / minutes } else { 1.0 };
    let unit = if per_minute { "/min" } else { "" };
    println!(
        "  {title}: operator CPU {:.2} s{unit}",
        (after.cpu - before.cpu) * scale
    );
    for (what, before, after) in [
        ("Conductor calls", &before.conductor, &after.conductor),
        ("apiserver requests", &before.apiserver, &after.apiserver),
        ("operator applies", &before.applies, &after.applies),
    ] {
        let counted = delta(before, after);
        let all: f64 = counted.values().fold(0.0, |a, b| a + b) * scale;
        let listed: Vec<String> = counted
            .iter()
            .map(|(key, n)| format!("{key} {:.0}", n * scale))
            .collect();
        println!(
            "    {what}{unit}: {all:.0} ({:.2} per task): {}",
            all / tasks as f64,
            listed.join(", ")
        );
    }
}

async fn run(services: &Services, cluster: &Cluster, count: usize, autoscaled: bool) {
    let namespace = if autoscaled {
        "bench-auto"
    } else {
        "bench-fixed"
    };
    let what = if autoscaled {
        "autoscaled, idle at zero"
    } else {
        "replicas: 0, no autoscaling"
    };
    cluster.task_namespace(namespace).unwrap();
    let client = services.kube().client().await.unwrap();
    // A fresh process for each run, so that its peak memory is that run's: the first run
    // has the one just installed.
    let metrics = if autoscaled {
        cluster.operator_metrics(&client).await.unwrap()
    } else {
        cluster.restart_operator(&client).await.unwrap()
    };
    let manifests: Vec<String> = (0..count)
        .map(|i| serde_yaml::to_string(&task(namespace, &format!("t-{i:04}"), autoscaled)).unwrap())
        .collect();
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let before = counters(&client, &metrics).await;
    let applied = Instant::now();
    let progress = tokio::spawn(watch_progress(client.clone(), namespace, count, applied));
    let manifest = manifests.join("---\n");
    // The watch above goes on in another of the runtime's threads meanwhile.
    let apply_took = tokio::task::block_in_place(|| {
        cluster.apply(&manifest).unwrap();
        applied.elapsed()
    });
    conductor
        .wait_taskdefs(&format!("{namespace}."), count)
        .await;
    let registered = applied.elapsed();
    let progress = progress.await.unwrap();
    let reconciled = counters(&client, &metrics).await;
    println!("operator with {count} PeragoTasks ({what}):");
    println!(
        "  kubectl apply {:.1} s; applied → every TaskDef in Conductor {:.1} s; → every Deployment made {:.1} s; → every Deployment observed by the controller-manager {:.1} s; → all Ready {:.1} s ({:.1} tasks/s)",
        apply_took.as_secs_f64(),
        registered.as_secs_f64(),
        progress.deployments_made.as_secs_f64(),
        progress.deployments_observed.as_secs_f64(),
        progress.ready.as_secs_f64(),
        count as f64 / progress.ready.as_secs_f64()
    );
    print_counts("the apply", &before, &reconciled, false, count);
    // Nothing changes now (after the follow-up reconciles of the rollout); the resyncs and
    // the queue watch go on.
    let steady = Duration::from_secs(setting("PERAGO_BENCH_STEADY_SECONDS", 60) as u64);
    tokio::time::sleep(steady.min(Duration::from_secs(20))).await;
    let quiet = counters(&client, &metrics).await;
    tokio::time::sleep(steady).await;
    let later = counters(&client, &metrics).await;
    print_counts("steady state", &quiet, &later, true, count);
    println!(
        "  operator resident memory: {:.1} MiB now, {:.1} MiB at its peak",
        rss_mib("perago-operator"),
        peak_rss_mib("perago-operator")
    );
    let deleting = Instant::now();
    cluster
        .kubectl(&["delete", "namespace", namespace, "--timeout=1200s"])
        .unwrap();
    println!(
        "  kubectl delete namespace (every finalizer released): {:.1} s",
        deleting.elapsed().as_secs_f64()
    );
}

/// When each stage of the apply was first complete for every task, from `applied`.
struct Progress {
    deployments_made: Duration,
    /// The controller-manager has seen each Deployment's generation: the operator's Ready
    /// waits for this, so the controller-manager's own request rate bounds it.
    deployments_observed: Duration,
    ready: Duration,
}

/// Lists the namespace's PeragoTasks and Deployments every second until every task is Ready
/// for its generation. These two LISTs a second are in the apiserver counts of the apply.
async fn watch_progress(
    client: kube::Client,
    namespace: &str,
    count: usize,
    applied: Instant,
) -> Progress {
    use k8s_openapi::api::apps::v1::Deployment;
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(client, namespace);
    let (mut made, mut observed) = (None, None);
    loop {
        let listed = deployments.list(&ListParams::default()).await.unwrap();
        if listed.items.len() >= count {
            made.get_or_insert_with(|| applied.elapsed());
            let seen = listed.items.iter().all(|d| {
                d.status.as_ref().and_then(|s| s.observed_generation) >= d.metadata.generation
            });
            if seen {
                observed.get_or_insert_with(|| applied.elapsed());
            }
        }
        let ready = tasks
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|t| {
                let status = t.status.as_ref();
                status.and_then(|s| s.observed_generation) == t.metadata.generation
                    && status.is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    })
            })
            .count();
        if ready >= count {
            let ready = applied.elapsed();
            return Progress {
                deployments_made: made.unwrap_or(ready),
                deployments_observed: observed.unwrap_or(ready),
                ready,
            };
        }
        assert!(
            applied.elapsed() < Duration::from_secs(1200),
            "{ready} of {count} tasks Ready after 20 minutes"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The Helm values the benchmark installs the operator with.
pub const OPERATOR_VALUES: [&str; 4] = ["--set", "resyncSeconds=60", "--set", "replicas=1"];

/// The benchmark on the node's cluster, the operator just installed with [`OPERATOR_VALUES`]
/// (its first run measures that process). Deletes the namespaces it makes.
pub async fn bench(services: &Services, cluster: &Cluster) {
    let count = setting("PERAGO_BENCH_TASKS", 500);
    run(services, cluster, count, true).await;
    run(services, cluster, count, false).await;
}

#[tokio::main]
async fn main() {
    if perago_e2e::node_opted_out("operator benchmark") {
        return;
    }
    let services = perago_e2e::shared(Selection::ALL).await;
    let cluster = Cluster::new(services).unwrap();
    cluster.install_operator(&OPERATOR_VALUES).unwrap();
    bench(services, &cluster).await;
}
