//! The operator at fleet scale: `PERAGO_BENCH_FLEET_TASKS` (1,000) PeragoTasks of
//! `PERAGO_BENCH_FLEET_REPLICAS` (5) executor pods each, a third of them autoscaled, on
//! `PERAGO_BENCH_FLEET_NODES` (100) simulated nodes (kwok, `perago_e2e::fleet`) beside the real
//! node, with the operator installed from the chart (one replica, queue poll 2 s, resync
//! `PERAGO_BENCH_FLEET_RESYNC_SECONDS`, 60 s).
//!
//! Phases, each timed from its change to every task's children and status being right
//! (reconcile latency per task, p50 / p99 / worst):
//! 1. the apply of every task: TaskDefs in Conductor, every task Ready, its pods ready;
//! 2. queues filled: `replicas` workflows started for each autoscaled task, which then scales
//!    from 0 to `replicas` (the fleet's pods reach tasks × replicas);
//! 3. steady state for `PERAGO_BENCH_STEADY_SECONDS` (60): nothing changes;
//! 4. queues drained: the benchmark takes and completes every queued task, and the autoscaled
//!    tasks scale in to 0 (scale-down window 0 s, so the queue watch wakes each at once);
//! 5. an image bump of a tenth of the fixed tasks;
//! 6. the deletion of the namespace.
//!
//! For each phase: the operator's CPU, the Conductor calls it made, the API server's requests
//! on the resources its reconcile reads and writes (by verb), and the `/slots` probes it sent
//! to simulated pods (answered by the fleet's stand-in: kwok's pods have no sidecar). The
//! operator's resident memory is printed at the end. Prints figures; asserts only that the
//! work it measures completed.
//!
//! The controller-manager's and the scheduler's request rates bound how fast thousands of
//! pods are made and bound: `PERAGO_E2E_CONTROLLER_MANAGER_QPS` raises both (docs/scale.md).
//! `cargo bench -p perago-e2e --bench fleet` (part of `make bench`).

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use perago_api::PeragoTask;
use perago_e2e::cluster::{Cluster, OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE};
use perago_e2e::fleet::Fleet;
use perago_e2e::measure::{counter_by, cpu_seconds, delta, peak_rss_mib, rss_mib, scrape};
use perago_e2e::node::BUSYBOX_BODY_IMAGE;
use perago_e2e::pod::ConductorApi;
use perago_e2e::{Selection, Services};
use serde_json::{Value, json};

const NAMESPACE: &str = "fleet";
/// The label of a task's executor Deployment that names the task.
const TASK_LABEL: &str = "perago.io/task";

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The fleet's tasks: every third one autoscaled (0 to `replicas`), the rest fixed.
struct Plan {
    tasks: usize,
    replicas: i32,
}

impl Plan {
    fn name(i: usize) -> String {
        format!("t-{i:04}")
    }
    fn autoscaled(i: usize) -> bool {
        i % 3 == 2
    }
    fn names(&self, autoscaled: bool) -> Vec<String> {
        (0..self.tasks)
            .filter(|&i| Self::autoscaled(i) == autoscaled)
            .map(Self::name)
            .collect()
    }
    fn task_name(name: &str) -> String {
        format!("{NAMESPACE}.{name}")
    }

    fn manifest(&self, i: usize) -> Value {
        let mut executor = json!({
            "slots": 1,
            "body": {"image": BUSYBOX_BODY_IMAGE, "command": ["sh", "-c", "printf '{}' > \"$PERAGO_RESULT\""]},
        });
        if Self::autoscaled(i) {
            executor["autoscaling"] = json!({
                "minReplicas": 0, "maxReplicas": self.replicas, "targetQueueDepth": 1,
                "scaleDownStabilizationSeconds": 0,
            });
        } else {
            executor["replicas"] = json!(self.replicas);
        }
        if let (Some(executor), Value::Object(placement)) =
            (executor.as_object_mut(), Fleet::placement())
        {
            executor.extend(placement);
        }
        json!({
            "apiVersion": "perago.io/v1alpha1",
            "kind": "PeragoTask",
            "metadata": {"name": Self::name(i), "namespace": NAMESPACE},
            "spec": {
                "taskName": Self::task_name(&Self::name(i)),
                "ownerEmail": "bench@example.com",
                "paramsSchema": {"type": "object"},
                "resultSchema": {"type": "object"},
                "executor": executor,
            },
        })
    }
}

/// The latest PeragoTasks and Deployments of the namespace, from two watches, and when each
/// task first met each goal of the phase.
#[derive(Default)]
struct Seen {
    tasks: HashMap<String, PeragoTask>,
    deployments: HashMap<String, Deployment>,
    goals: Vec<Goal>,
    met: Vec<HashMap<String, Instant>>,
}

type Goal = Box<dyn Fn(&PeragoTask, &Deployment) -> bool + Send>;

impl Seen {
    fn check(&mut self, name: &str) {
        let (Some(task), Some(deployment)) = (self.tasks.get(name), self.deployments.get(name))
        else {
            return;
        };
        for (goal, met) in self.goals.iter().zip(self.met.iter_mut()) {
            if !met.contains_key(name) && goal(task, deployment) {
                met.insert(name.to_owned(), Instant::now());
            }
        }
    }
}

#[derive(Clone)]
struct Tracker(Arc<Mutex<Seen>>);

impl Tracker {
    fn start(client: &kube::Client) -> Self {
        let tracker = Self(Arc::default());
        let seen = tracker.clone();
        let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), NAMESPACE);
        tokio::spawn(async move {
            let mut events = watcher::watcher(tasks, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(t) | watcher::Event::InitApply(t)) = event {
                    let name = t.metadata.name.clone().unwrap_or_default();
                    let mut seen = seen.lock();
                    seen.tasks.insert(name.clone(), t);
                    seen.check(&name);
                }
            }
        });
        let seen = tracker.clone();
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
        tokio::spawn(async move {
            let mut events = watcher::watcher(deployments, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = event {
                    // The Deployment of task `t` is `t-perago`; its label names the task.
                    let labels = d.metadata.labels.as_ref();
                    let Some(name) = labels.and_then(|l| l.get(TASK_LABEL)).cloned() else {
                        continue;
                    };
                    let mut seen = seen.lock();
                    seen.deployments.insert(name.clone(), d);
                    seen.check(&name);
                }
            }
        });
        tracker
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// From now on, record when each task first meets each of `goals`: the operator's part
    /// (what it writes), then the cluster's (the pods it leads to).
    fn expect(&self, goals: [Goal; 2]) {
        let mut seen = self.lock();
        seen.met = goals.iter().map(|_| HashMap::new()).collect();
        seen.goals = goals.into();
        let names: Vec<String> = seen.tasks.keys().cloned().collect();
        for name in names {
            seen.check(&name);
        }
    }

    /// Until every task of `changed` met every goal; each goal's latencies from the changes.
    async fn latencies(
        &self,
        changed: &BTreeMap<String, Instant>,
        limit: Duration,
    ) -> Vec<Vec<f64>> {
        let started = Instant::now();
        loop {
            {
                let seen = self.lock();
                let per_goal: Vec<Vec<f64>> = seen
                    .met
                    .iter()
                    .map(|met| {
                        changed
                            .iter()
                            .filter_map(|(name, at)| {
                                met.get(name)
                                    .map(|m| m.saturating_duration_since(*at).as_secs_f64())
                            })
                            .collect()
                    })
                    .collect();
                let done = per_goal.iter().map(Vec::len).min().unwrap_or(0);
                if done == changed.len() {
                    return per_goal;
                }
                assert!(
                    started.elapsed() < limit,
                    "{done} of {} tasks met the phase's goals after {limit:?}",
                    changed.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Ready replicas of every Deployment of the namespace.
    fn ready_pods(&self) -> i32 {
        let seen = self.lock();
        seen.deployments
            .values()
            .filter_map(|d| d.status.as_ref()?.ready_replicas)
            .sum()
    }
}

fn task_ready(task: &PeragoTask) -> bool {
    let Some(status) = task.status.as_ref() else {
        return false;
    };
    status.observed_generation == task.metadata.generation
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The Deployment's controller saw its latest spec and has `replicas` pods, all ready.
fn rolled_out(deployment: &Deployment, replicas: i32) -> bool {
    let spec = deployment.spec.as_ref().and_then(|s| s.replicas);
    let Some(status) = deployment.status.as_ref() else {
        return false;
    };
    spec == Some(replicas)
        && status.observed_generation >= deployment.metadata.generation
        && status.replicas.unwrap_or(0) == replicas
        && status.updated_replicas.unwrap_or(0) == replicas
        && status.ready_replicas.unwrap_or(0) == replicas
}

/// The operator has seen the task's latest spec (its status says so).
fn written(task: &PeragoTask, _: &Deployment) -> bool {
    task.status.as_ref().and_then(|s| s.observed_generation) == task.metadata.generation
}

/// The pods the Deployment asks for.
fn asked(deployment: &Deployment) -> Option<i32> {
    deployment.spec.as_ref()?.replicas
}

/// The two goals' latencies of a phase.
fn goals(per_goal: Vec<Vec<f64>>) -> [Vec<f64>; 2] {
    let mut goals = per_goal.into_iter();
    [
        goals.next().unwrap_or_default(),
        goals.next().unwrap_or_default(),
    ]
}

fn body_image(deployment: &Deployment) -> Option<&str> {
    let pod = deployment.spec.as_ref()?.template.spec.as_ref()?;
    pod.containers
        .iter()
        .find(|c| c.name == "body")
        .and_then(|c| c.image.as_deref())
}

/// p50, p99 and the worst of `values`, in seconds.
fn spread(mut values: Vec<f64>) -> String {
    if values.is_empty() {
        return "none".into();
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    format!(
        "p50 {:.1} s, p99 {:.1} s, worst {:.1} s",
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

/// What the operator, the API server and the stand-in have counted so far.
struct Counters {
    at: Instant,
    cpu: f64,
    probes: u64,
    /// The operator's own counts: reconciles by outcome, deletion-cost writes.
    reconciles: BTreeMap<String, f64>,
    /// The operator's `/slots` requests by purpose (census, reconcile, scale-in).
    probe_purposes: BTreeMap<String, f64>,
    cost_writes: f64,
    /// The operator's reconciles' seconds in all, and their count.
    reconcile_seconds: (f64, f64),
    /// `cause/le`: the operator's reconciles of a change that started within `le` seconds of
    /// it being seen (`perago_operator_reconcile_wait_seconds`).
    waits: BTreeMap<String, f64>,
    /// `direction/le`: the operator's `/scale` writes answered within `le` seconds of the
    /// queue read they were decided with (`perago_operator_scale_seconds`).
    scales: BTreeMap<String, f64>,
    /// `read/le`: the operator's reads of the queue sizes that took at most `le` seconds
    /// (`perago_operator_queue_read_seconds`).
    queue_reads: BTreeMap<String, f64>,
    conductor: BTreeMap<String, f64>,
    /// `verb/resource/subresource` on the resources of the reconcile.
    apiserver: BTreeMap<String, f64>,
    /// `mutating/le`: the API server's mutating requests (every resource, every client) that
    /// it answered within `le` seconds, against its own SLO (p99 ≤ 1 s).
    mutating: BTreeMap<String, f64>,
}

/// The verbs of `apiserver_request_duration_seconds` that change objects.
const MUTATING: [&str; 5] = ["POST", "PUT", "PATCH", "DELETE", "APPLY"];

/// The resources a PeragoTask's reconcile reads and writes.
const RESOURCES: [&str; 5] = ["peragotasks", "configmaps", "deployments", "events", "pods"];

/// Whether a request is one of the operator's writes. Server-side applies and patches of
/// tasks, ConfigMaps, Deployments and pods (deletion costs) are only the operator's; pods are
/// made and removed by the controller-manager and kwok, Deployment and pod status written by
/// them, and the Deployment's revision annotation `PUT` by the controller-manager. Events are
/// not counted: the apiserver's figures do not say who wrote them, and the scheduler and the
/// controller-manager write most of them (they are listed with the rest).
fn operators_write(key: &str) -> bool {
    let mut parts = key.split('/');
    let (Some(verb), Some(resource), Some(sub)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    match (verb, resource) {
        (_, "events") => false,
        // The user's `kubectl apply` (and the benchmark's own changes).
        ("APPLY", "peragotasks") => sub == "status",
        ("APPLY", _) => true,
        ("PATCH", "pods" | "deployments") => sub != "status",
        ("PATCH", "peragotasks" | "configmaps") => true,
        _ => false,
    }
}

async fn counters(client: &kube::Client, fleet: &Fleet, operator_metrics: &str) -> Counters {
    let operator = scrape(operator_metrics).await;
    let apiserver = Cluster::apiserver_metrics(client).await.unwrap();
    let mut mutating = BTreeMap::new();
    let durations = counter_by(
        &apiserver,
        "apiserver_request_duration_seconds_bucket",
        &["verb", "le"],
    );
    for (key, n) in durations {
        if let Some((verb, le)) = key.split_once('/')
            && MUTATING.contains(&verb)
        {
            *mutating.entry(format!("mutating/{le}")).or_insert(0.0) += n;
        }
    }
    let apiserver = counter_by(
        &apiserver,
        "apiserver_request_total",
        &["verb", "resource", "subresource"],
    )
    .into_iter()
    .filter(|(key, _)| RESOURCES.iter().any(|r| key.contains(&format!("/{r}/"))))
    .collect();
    Counters {
        at: Instant::now(),
        cpu: cpu_seconds("perago-operator"),
        probes: fleet.probes(),
        reconciles: counter_by(&operator, "perago_operator_reconciles_total", &["outcome"]),
        probe_purposes: counter_by(&operator, "perago_operator_slot_probes_total", &["purpose"]),
        cost_writes: gauge(&operator, "perago_operator_deletion_cost_writes_total"),
        reconcile_seconds: (
            gauge(&operator, "perago_operator_reconcile_duration_seconds_sum"),
            gauge(
                &operator,
                "perago_operator_reconcile_duration_seconds_count",
            ),
        ),
        waits: counter_by(
            &operator,
            "perago_operator_reconcile_wait_seconds_bucket",
            &["cause", "le"],
        ),
        scales: counter_by(
            &operator,
            "perago_operator_scale_seconds_bucket",
            &["direction", "le"],
        ),
        queue_reads: counter_by(
            &operator,
            "perago_operator_queue_read_seconds_bucket",
            &["le"],
        )
        .into_iter()
        .map(|(le, n)| (format!("reads/{le}"), n))
        .collect(),
        conductor: counter_by(
            &operator,
            "perago_operator_conductor_calls_total",
            &["call"],
        ),
        apiserver,
        mutating,
    }
}

/// The operator's Conductor queue reads so far.
async fn queue_reads(operator_metrics: &str) -> f64 {
    let text = scrape(operator_metrics).await;
    counter_by(&text, "perago_operator_conductor_calls_total", &["call"])
        .get("queue sizes")
        .copied()
        .unwrap_or(0.0)
}

/// The value of an unlabelled series in a Prometheus text exposition (0 when absent).
fn gauge(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn listed(counts: &BTreeMap<String, f64>) -> String {
    let items: Vec<String> = counts
        .iter()
        .map(|(k, n)| format!("{} {n:.0}", k.trim_end_matches('/')))
        .collect();
    items.join(", ")
}

/// A wave's counts, in all and per task.
fn print_wave(title: &str, before: &Counters, after: &Counters, tasks: usize) {
    let per_task = |n: f64| n / tasks as f64;
    let conductor = delta(&before.conductor, &after.conductor);
    let apiserver = delta(&before.apiserver, &after.apiserver);
    let writes: f64 = apiserver
        .iter()
        .filter(|(k, _)| operators_write(k))
        .map(|(_, n)| n)
        .sum();
    let conductor_calls: f64 = conductor.values().sum();
    let probes = (after.probes - before.probes) as f64;
    let purposes = delta(&before.probe_purposes, &after.probe_purposes);
    let cost_writes = after.cost_writes - before.cost_writes;
    let scale_in_probes = purposes.get("scale-in").copied().unwrap_or(0.0);
    println!(
        "  {title}: operator CPU {:.1} s, memory {:.1} MiB (peak so far {:.1} MiB); reconciles {} ({:.0} ms each on average), of a change: {}; per task: {:.2} operator writes, {:.2} Conductor calls, {:.2} /slots probes; \
         deletion-cost writes {cost_writes:.0}\n    scaled, from the queue read decided on to the /scale, Deployment and status written: {}; the queue reads: {}\n    /slots probes by purpose: {}{}\n    apiserver: {}; answered: {}\n    Conductor: {}",
        after.cpu - before.cpu,
        rss_mib("perago-operator"),
        peak_rss_mib("perago-operator"),
        listed(&delta(&before.reconciles, &after.reconciles)),
        mean_reconcile_ms(before, after),
        within("waited", &delta(&before.waits, &after.waits)),
        per_task(writes),
        per_task(conductor_calls),
        per_task(probes),
        within("written", &delta(&before.scales, &after.scales)),
        within("answered", &delta(&before.queue_reads, &after.queue_reads)),
        listed(&purposes),
        if cost_writes > 0.0 {
            format!(
                "; scale-in probes per deletion-cost write {:.2}",
                scale_in_probes / cost_writes
            )
        } else {
            String::new()
        },
        listed(&apiserver),
        within("calls", &delta(&before.mutating, &after.mutating)),
        listed(&conductor),
    );
}

/// The mean time a reconcile took between two counts, in milliseconds.
fn mean_reconcile_ms(before: &Counters, after: &Counters) -> f64 {
    let (seconds, count) = (
        after.reconcile_seconds.0 - before.reconcile_seconds.0,
        after.reconcile_seconds.1 - before.reconcile_seconds.1,
    );
    if count > 0.0 {
        seconds / count * 1000.0
    } else {
        0.0
    }
}

/// Per kind (a reconcile's cause, the API server's mutating calls), how many there were and
/// the bucket bounds their p50 and p99 fall within, from the cumulative buckets `kind/le` of
/// a wave: "spec 67 waited p50 ≤ 0.1 s, p99 ≤ 0.25 s".
fn within(verb: &str, buckets: &BTreeMap<String, f64>) -> String {
    let mut by_cause: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for (key, n) in buckets {
        let Some((cause, le)) = key.split_once('/') else {
            continue;
        };
        // `+Inf` parses as infinity too.
        let le: f64 = le.parse().unwrap_or(f64::INFINITY);
        by_cause.entry(cause).or_default().push((le, *n));
    }
    let described: Vec<String> = by_cause
        .into_iter()
        .map(|(cause, mut cumulative)| {
            cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
            let total = cumulative.last().map_or(0.0, |b| b.1);
            let within = |q: f64| {
                cumulative
                    .iter()
                    .find(|(_, n)| *n >= q * total)
                    .map_or(f64::INFINITY, |b| b.0)
            };
            format!(
                "{cause} {total:.0} {verb} p50 ≤ {} s, p99 ≤ {} s",
                within(0.5),
                within(0.99)
            )
        })
        .collect();
    if described.is_empty() {
        "none".into()
    } else {
        described.join(", ")
    }
}

/// The steady state's rates, against the goals (docs/scale.md).
fn print_steady(before: &Counters, after: &Counters, tasks: usize, pods: i32) {
    let minutes = after.at.duration_since(before.at).as_secs_f64() / 60.0;
    let apiserver = delta(&before.apiserver, &after.apiserver);
    let writes: f64 = apiserver
        .iter()
        .filter(|(k, _)| operators_write(k))
        .map(|(_, n)| n)
        .sum();
    let conductor: f64 = delta(&before.conductor, &after.conductor).values().sum();
    let probes = (after.probes - before.probes) as f64;
    println!(
        "3. steady state ({minutes:.1} min): operator CPU {:.2} s per minute; reconciles {}; \
         operator writes {:.3} per task per 10 min (goal ≤ 1); Conductor calls {:.3} per task per minute (goal ≤ 0.1); \
         /slots probes {:.2} per pod per minute\n    apiserver: {}",
        (after.cpu - before.cpu) / minutes,
        listed(&delta(&before.reconciles, &after.reconciles)),
        (writes / tasks as f64 / minutes * 10.0).max(0.0) + 0.0,
        conductor / tasks as f64 / minutes,
        probes / f64::from(pods.max(1)) / minutes,
        listed(&apiserver),
    );
}

#[tokio::main]
async fn main() {
    if perago_e2e::node_opted_out("fleet benchmark") {
        return;
    }
    let services = perago_e2e::shared(Selection::ALL).await;
    let cluster = Cluster::new(services).unwrap();
    bench(services, &cluster, |values| {
        cluster.install_operator(values).unwrap();
    })
    .await;
}

/// The benchmark on the node's cluster. `install` installs the operator with the Helm values
/// it is given (a fresh process: its peak memory is this run's), once the simulated nodes are
/// up. Deletes the namespace it makes and stops the simulated nodes' kwok.
pub async fn bench(services: &Services, cluster: &Cluster, install: impl FnOnce(&[&str])) {
    let plan = Plan {
        tasks: setting("PERAGO_BENCH_FLEET_TASKS", 1000),
        replicas: setting("PERAGO_BENCH_FLEET_REPLICAS", 5) as i32,
    };
    let nodes = setting("PERAGO_BENCH_FLEET_NODES", 100);
    let steady = Duration::from_secs(setting("PERAGO_BENCH_STEADY_SECONDS", 60) as u64);
    let limit = Duration::from_secs(setting("PERAGO_BENCH_FLEET_LIMIT_SECONDS", 1800) as u64);

    let client = services.kube().client().await.unwrap();
    let fleet = Fleet::start(
        services.dir(),
        &services.kube().kubeconfig,
        client.clone(),
        nodes,
    )
    .await
    .unwrap();
    let resync = format!(
        "resyncSeconds={}",
        setting("PERAGO_BENCH_FLEET_RESYNC_SECONDS", 60)
    );
    let queue_poll_seconds = setting("PERAGO_BENCH_FLEET_QUEUE_POLL_SECONDS", 2);
    let queue_poll = format!("queuePollSeconds={queue_poll_seconds}");
    install(&[
        "--set",
        &resync,
        "--set",
        &queue_poll,
        "--set",
        "replicas=1",
    ]);
    // A fresh install: its peak memory is this run's.
    let metrics = cluster.operator_metrics(&client).await.unwrap();
    cluster.task_namespace(NAMESPACE).unwrap();
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let tracker = Tracker::start(&client);
    let (fixed, autoscaled) = (plan.names(false), plan.names(true));
    let pods = plan.tasks * plan.replicas as usize;
    println!(
        "fleet: {} PeragoTasks ({} autoscaled 0–{r}, {} at {r} replicas) on {nodes} simulated nodes; {pods} executor pods at most; the operator's {resync}, {queue_poll}",
        plan.tasks,
        autoscaled.len(),
        fixed.len(),
        r = plan.replicas,
    );

    // 1. The apply.
    let replicas = plan.replicas;
    let wanted = move |task: &PeragoTask| {
        let name = task.metadata.name.as_deref().unwrap_or_default();
        let autoscaled = name
            .strip_prefix("t-")
            .and_then(|i| i.parse().ok())
            .is_some_and(Plan::autoscaled);
        if autoscaled { 0 } else { replicas }
    };
    tracker.expect([
        Box::new(move |task, deployment| {
            written(task, deployment) && asked(deployment) == Some(wanted(task))
        }),
        Box::new(move |task, deployment| task_ready(task) && rolled_out(deployment, wanted(task))),
    ]);
    let before = counters(&client, &fleet, &metrics).await;
    let manifest: Vec<String> = (0..plan.tasks)
        .map(|i| serde_yaml::to_string(&plan.manifest(i)).unwrap())
        .collect();
    let applied = Instant::now();
    tokio::task::block_in_place(|| cluster.apply(&manifest.join("---\n")).unwrap());
    let apply_took = applied.elapsed();
    conductor
        .wait_taskdefs(&format!("{NAMESPACE}."), plan.tasks)
        .await;
    let registered = applied.elapsed();
    let all: BTreeMap<String, Instant> =
        (0..plan.tasks).map(|i| (Plan::name(i), applied)).collect();
    let [written_at, ready] = goals(tracker.latencies(&all, limit).await);
    let after = counters(&client, &fleet, &metrics).await;
    println!(
        "1. apply: kubectl apply {:.1} s; → every TaskDef in Conductor {:.1} s; from the apply's start, per task: Deployment and status written {}; Ready with its pods {} ({} pods)",
        apply_took.as_secs_f64(),
        registered.as_secs_f64(),
        spread(written_at),
        spread(ready),
        tracker.ready_pods(),
    );
    print_wave("the apply", &before, &after, plan.tasks);

    // 2. Queues filled: `replicas` workflows per autoscaled task.
    tracker.expect([
        Box::new(move |task, deployment| {
            written(task, deployment) && asked(deployment) == Some(replicas)
        }),
        Box::new(move |_, deployment| rolled_out(deployment, replicas)),
    ]);
    let flows: Vec<Value> = autoscaled
        .iter()
        .map(|name| {
            json!({
                "name": format!("fleet-{name}"), "version": 1, "schemaVersion": 2,
                "ownerEmail": "bench@example.com",
                "tasks": [{"name": Plan::task_name(name), "taskReferenceName": "step", "type": "SIMPLE"}],
            })
        })
        .collect();
    conductor
        .call(
            reqwest::Method::PUT,
            "/metadata/workflow",
            Some(&json!(flows)),
        )
        .await;
    let before = counters(&client, &fleet, &metrics).await;
    let filling = Instant::now();
    let mut changed = BTreeMap::new();
    for name in &autoscaled {
        for _ in 0..plan.replicas {
            let start = json!({"name": format!("fleet-{name}"), "version": 1, "input": {}});
            conductor
                .call(reqwest::Method::POST, "/workflow", Some(&start))
                .await;
        }
        changed.insert(name.clone(), Instant::now());
    }
    let filled = filling.elapsed();
    let [scaled, ready] = goals(tracker.latencies(&changed, limit).await);
    let after = counters(&client, &fleet, &metrics).await;
    println!(
        "2. queues filled ({} workflows started in {:.1} s), from each task's last start: scaled to {replicas} {}; its pods ready {}; all done {:.1} s after the first start ({} pods ready)",
        autoscaled.len() * plan.replicas as usize,
        filled.as_secs_f64(),
        spread(scaled),
        spread(ready),
        filling.elapsed().as_secs_f64(),
        tracker.ready_pods(),
    );
    print_wave("queues filled", &before, &after, plan.tasks);

    // 3. Steady state (the rollouts' follow-up reconciles first).
    tokio::time::sleep(steady.min(Duration::from_secs(20))).await;
    let quiet = counters(&client, &fleet, &metrics).await;
    tokio::time::sleep(steady).await;
    let later = counters(&client, &fleet, &metrics).await;
    print_steady(&quiet, &later, plan.tasks, tracker.ready_pods());

    // 4. Queues drained: every queued task taken and completed; the autoscaled tasks scale
    // in to 0 (window 0 s: the queue watch wakes each task once its queue is empty).
    tracker.expect([
        Box::new(|task, deployment| written(task, deployment) && asked(deployment) == Some(0)),
        Box::new(|_, deployment| rolled_out(deployment, 0)),
    ]);
    let before = counters(&client, &fleet, &metrics).await;
    let draining = Instant::now();
    let mut changed = BTreeMap::new();
    for name in &autoscaled {
        let path = format!(
            "/tasks/poll/batch/{}?workerid=fleet-bench&count={}&timeout=100",
            Plan::task_name(name),
            plan.replicas
        );
        let taken = conductor.call(reqwest::Method::GET, &path, None).await;
        for task in taken.as_array().into_iter().flatten() {
            let result = json!({
                "taskId": task["taskId"], "workflowInstanceId": task["workflowInstanceId"],
                "status": "COMPLETED", "outputData": {},
            });
            conductor
                .call(reqwest::Method::POST, "/tasks", Some(&result))
                .await;
        }
        changed.insert(name.clone(), Instant::now());
    }
    let drained = draining.elapsed();
    let [scaled, gone] = goals(tracker.latencies(&changed, limit).await);
    let after = counters(&client, &fleet, &metrics).await;
    println!(
        "4. queues drained (in {:.1} s), from each task's drain: scaled to 0 {}; its pods gone {}; all done {:.1} s after the first drain ({} pods ready)",
        drained.as_secs_f64(),
        spread(scaled),
        spread(gone),
        draining.elapsed().as_secs_f64(),
        tracker.ready_pods(),
    );
    print_wave("queues drained", &before, &after, plan.tasks);

    // 4b. One queue filled at a time: the reconcile's latency after a queue change in the whole
    // fleet, without a wave of its own that saturates the control plane.
    tracker.expect([
        Box::new(move |task, deployment| {
            written(task, deployment) && asked(deployment) == Some(replicas)
        }),
        Box::new(move |_, deployment| rolled_out(deployment, replicas)),
    ]);
    let sample: Vec<&String> = autoscaled.iter().step_by(16).collect();
    let before = counters(&client, &fleet, &metrics).await;
    let (mut scaled, mut reacted) = (Vec::new(), Vec::new());
    for name in &sample {
        for i in 0..plan.replicas {
            let start = json!({"name": format!("fleet-{name}"), "version": 1, "input": {}});
            let last = i + 1 == plan.replicas;
            let reads_before = if last {
                queue_reads(&metrics).await
            } else {
                0.0
            };
            conductor
                .call(reqwest::Method::POST, "/workflow", Some(&start))
                .await;
            if last {
                let changed = Instant::now();
                // The operator's first queue read after the last start (found within 50 ms;
                // one that began just before the start is taken for it, so the operator's
                // part is if anything overstated).
                let read = loop {
                    if queue_reads(&metrics).await > reads_before {
                        break changed.elapsed();
                    }
                    assert!(
                        changed.elapsed() < limit,
                        "the operator stopped reading the queues"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                let changed_now = BTreeMap::from([((*name).clone(), changed)]);
                let [written_at, _] = goals(tracker.latencies(&changed_now, limit).await);
                reacted.extend(written_at.iter().map(|w| w - read.as_secs_f64()));
                scaled.extend(written_at);
            }
        }
    }
    println!(
        "4b. one queue filled at a time ({} tasks): scaled to {replicas}, from its last start {}; from the operator's next queue read {}",
        sample.len(),
        spread(scaled),
        spread(reacted),
    );
    let after = counters(&client, &fleet, &metrics).await;
    print_wave("one queue at a time", &before, &after, plan.tasks);

    // 5. An image bump of a tenth of the fixed tasks.
    let image = format!("{BUSYBOX_BODY_IMAGE}-bumped");
    let (new_image, new_image_too) = (image.clone(), image.clone());
    tracker.expect([
        Box::new(move |task, deployment| {
            written(task, deployment) && body_image(deployment) == Some(new_image.as_str())
        }),
        Box::new(move |task, deployment| {
            task_ready(task)
                && body_image(deployment) == Some(new_image_too.as_str())
                && rolled_out(deployment, replicas)
        }),
    ]);
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), NAMESPACE);
    let bumped: Vec<&String> = fixed.iter().step_by(10).collect();
    let before = counters(&client, &fleet, &metrics).await;
    let bumping = Instant::now();
    let mut changed = BTreeMap::new();
    for name in &bumped {
        let patch = json!({
            "apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask",
            "spec": {"executor": {"body": {"image": image}}},
        });
        tasks
            .patch(
                name,
                &PatchParams::apply("fleet-bench").force(),
                &Patch::Apply(&patch),
            )
            .await
            .unwrap();
        changed.insert((*name).clone(), Instant::now());
    }
    let [written_at, rolled] = goals(tracker.latencies(&changed, limit).await);
    let after = counters(&client, &fleet, &metrics).await;
    println!(
        "5. image bump of {} tasks, from each patch: Deployment and status written {}; rolled out and Ready {}; all done {:.1} s after the first patch",
        bumped.len(),
        spread(written_at),
        spread(rolled),
        bumping.elapsed().as_secs_f64(),
    );
    print_wave("image bump", &before, &after, plan.tasks);

    println!(
        "operator resident memory: {:.1} MiB now, {:.1} MiB at its peak",
        rss_mib("perago-operator"),
        peak_rss_mib("perago-operator")
    );
    // What failed, should a reconcile have (the goal is none).
    let logs = cluster
        .kubectl(&[
            "logs",
            "-n",
            OPERATOR_NAMESPACE,
            &format!("deploy/{OPERATOR_DEPLOYMENT}"),
        ])
        .unwrap_or_else(|e| format!("{e:#}"));
    let failed: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("reconcile failed"))
        .collect();
    println!("reconcile failures in the operator's log: {}", failed.len());
    for line in failed.iter().take(5) {
        println!("  {}", line.chars().take(600).collect::<String>());
    }

    // 6. Deletion.
    let deleting = Instant::now();
    tokio::task::block_in_place(|| {
        cluster
            .kubectl(&["delete", "namespace", NAMESPACE, "--timeout=1800s"])
            .unwrap()
    });
    println!(
        "6. kubectl delete namespace (every finalizer released, every pod gone): {:.1} s",
        deleting.elapsed().as_secs_f64()
    );
}
