//! Faults of the cluster itself under a real workload: many workflows in flight across several
//! executor pods while the API server is away, while containerd and the kubelet restart, while
//! the operator's leader is killed, and while the node's disk runs short. The promises are the fault suite's: every workflow
//! completes, each branch holds its one publication, no staging branch is left, and the
//! operator converges afterwards.
//!
//! The scenarios share one node and run one at a time. `PERAGO_E2E_DISRUPTION_RUNS` repeats
//! each (1 by default; docs/reliability.md gives the full count's command).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, ListParams};
use perago_e2e::cluster::{Cluster, OPERATOR_NAMESPACE};
use perago_e2e::lake::Lake;
use perago_e2e::node::{BUSYBOX_BODY_IMAGE, NODE_NAME, NodeDisk, ctr};
use perago_e2e::pod::ConductorApi;
use perago_e2e::storage::Storage;
use perago_e2e::workload::{Outcome, Workload, merge, workspace_task_with};
use perago_e2e::{Selection, Services, shared};
use serde_json::json;
use tokio::sync::{Mutex, MutexGuard, OnceCell};

static OPERATOR: OnceCell<Cluster> = OnceCell::const_new();
/// One scenario at a time: each disrupts the whole node. The test harness starts tests in the
/// order of their names and the lock is fair, so they take it in that order: the API server's
/// outage is named to come last, because after it the controller-manager and the scheduler
/// watch again only when their back-off allows (about 45 s here), and the next scenario's task
/// would wait that long for its pods.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

async fn cluster(test: &str) -> Option<(&'static Services, &'static Cluster)> {
    if perago_e2e::node_opted_out(test) {
        return None;
    }
    // lakeFS and Conductor on PostgreSQL (and lakeFS's objects in s3proxy): both keep their
    // state through the restarts below, as production servers do.
    // The node's own disk, so that filling it past the kubelet's eviction threshold takes
    // nothing from the machine's.
    let services = shared(Selection {
        storage: Storage::PostgresS3,
        node_disk_mib: Some(NODE_DISK_MIB),
        ..Selection::ALL
    })
    .await;
    let cluster = OPERATOR
        .get_or_init(|| async {
            let cluster = Cluster::new(services).unwrap();
            // Two replicas (the chart's default): one leads, one waits. Their ephemeral storage
            // is requested, as it should be, so the kubelet evicts them after pods beyond
            // their requests when the node's disk runs short.
            let took = cluster
                .install_operator(&[
                    "--set",
                    "resyncSeconds=10",
                    "--set",
                    "resources.requests.ephemeral-storage=64Mi",
                ])
                .unwrap();
            eprintln!("operator installed by helm and available in {took:.1?}");
            cluster
        })
        .await;
    Some((services, cluster))
}

/// The node's disk: the kubelet evicts pods once less than half of it is free.
const NODE_DISK_MIB: u32 = 1024;

fn runs() -> usize {
    env_number("PERAGO_E2E_DISRUPTION_RUNS", 1)
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Writes a file named by its workflow: a retry of an attempt whose publication landed finds
/// nothing to change, so a branch holds one publication whatever the faults did.
const BODY: &str = r#"
set -eu
sleep 2
echo "row of $PERAGO_WORKFLOW_INSTANCE_ID" > "$PERAGO_WORKSPACE/out.txt"
printf '{"files": 1}' > "$PERAGO_RESULT"
"#;

/// A task of pods with two slots each, retried 3 times, with `spec` merged into its spec.
async fn task_with(
    services: &Services,
    cluster: &Cluster,
    name: &str,
    spec: &serde_json::Value,
) -> (Lake, String, String) {
    let namespace = name;
    cluster.task_namespace(namespace).unwrap();
    let mut full = json!({
        "controls": {
            "retry": {"count": 3, "logic": "FIXED", "delaySeconds": 0},
            "timeout": {"policy": "RETRY", "seconds": 60, "responseSeconds": 30},
        },
        "executor": {"slots": 2},
    });
    merge(&mut full, spec);
    let applied = Instant::now();
    cluster
        .apply(&workspace_task_with(namespace, name, BODY, &full))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    eprintln!(
        "[{name}] task Ready {:.1?} after it was applied",
        applied.elapsed()
    );
    let lake = Lake::of(services.lakefs());
    let repository = format!("{name}-{}", std::process::id());
    let input_ref = lake
        .seed(&repository, &[("data/in.txt", "seed")])
        .await
        .unwrap();
    (lake, repository, input_ref)
}

/// What every scenario starts from, once no other scenario runs: the node, its task `name`
/// (two slots a pod, `spec` merged in) Ready, a repository seeded for it, and the clients.
struct Scenario {
    services: &'static Services,
    cluster: &'static Cluster,
    lake: Lake,
    repository: String,
    input_ref: String,
    conductor: ConductorApi,
    client: kube::Client,
    /// Held to the scenario's end.
    _one: Held,
}

/// The node, taken for one scenario; its drop writes how long the scenario held it.
struct Held {
    _guard: MutexGuard<'static, ()>,
    test: &'static str,
    since: Instant,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Written past libtest's capture, so that CI's log shows where the suite's time goes.
        use std::io::Write;
        let line = format!(
            "[disruptions] {} held the node {:.1?}\n",
            self.test,
            self.since.elapsed()
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// The [`Scenario`] of `test`; `None` when the developer opted out of the node's tests.
async fn scenario(test: &'static str, name: &str, spec: serde_json::Value) -> Option<Scenario> {
    let (services, cluster) = cluster(test).await?;
    let one = Held {
        _guard: ONE_AT_A_TIME.lock().await,
        test,
        since: Instant::now(),
    };
    let (lake, repository, input_ref) = task_with(services, cluster, name, &spec).await;
    Some(Scenario {
        services,
        cluster,
        lake,
        repository,
        input_ref,
        conductor: ConductorApi::new(&services.conductor().api_url),
        client: services.kube().client().await.unwrap(),
        _one: one,
    })
}

/// Start run `run`'s workload on the task `name`: `PERAGO_E2E_DISRUPTION_WORKFLOWS` workflows
/// (else `default`), each on a branch of its own.
async fn start_workload(
    (lake, conductor): (&Lake, &ConductorApi),
    name: &str,
    (repository, input_ref): (&str, &str),
    run: usize,
    default: usize,
) -> Workload {
    let count = env_number("PERAGO_E2E_DISRUPTION_WORKFLOWS", default);
    Workload::start(
        lake,
        conductor,
        &format!("{name}.{name}"),
        (repository, input_ref),
        &format!("run{run}"),
        count,
    )
    .await
    .unwrap()
}

/// The restart count of every container of the pods selected, by pod uid and container.
async fn restarts(pods: &Api<Pod>, selector: &str) -> BTreeMap<String, i32> {
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap();
    let mut counts = BTreeMap::new();
    for pod in list.items {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for status in pod
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
        {
            counts.insert(format!("{uid}/{}", status.name), status.restart_count);
        }
    }
    counts
}

/// Until `count` pods of the task run with every container ready; how long that took.
async fn wait_running(
    client: &kube::Client,
    namespace: &str,
    count: usize,
    limit: Duration,
) -> Duration {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("perago.io/task={namespace}");
    let started = Instant::now();
    loop {
        let ready = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|list| {
                list.items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        p.status
                            .as_ref()
                            .and_then(|s| s.container_statuses.as_ref())
                            .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c.ready))
                    })
                    .count()
            })
            .unwrap_or(0);
        if ready == count {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "{ready} of {count} pods of {namespace} ready after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One row of a scenario's table: the outcome, and whether it holds every promise.
fn report(scenario: &str, run: usize, outcome: &Outcome, extra: &str) {
    eprintln!("[{scenario}] run {run}: {outcome}; {extra}");
    assert!(
        outcome.holds_the_promises(),
        "[{scenario}] run {run}: {outcome}"
    );
}

/// The API server killed and kept away for a minute while workflows run on two executor
/// pods. The pods need only Conductor and lakeFS: workflows complete during the outage, and
/// no attempt fails. When the API server is back, the operator (two replicas) converges
/// without a restart of its pods and without a second Deployment: the task is Ready, and a
/// scale made afterwards is followed.
#[tokio::test]
async fn through_an_api_server_outage_executor_pods_work_and_the_operator_converges() {
    let test = "through_an_api_server_outage_executor_pods_work_and_the_operator_converges";
    let name = "api-outage";
    let replicas = json!({"executor": {"replicas": 2}});
    let Some(Scenario {
        services,
        cluster,
        lake,
        repository,
        input_ref,
        conductor,
        client,
        _one,
    }) = scenario(test, name, replicas).await
    else {
        return;
    };
    let down = Duration::from_secs(env_number("PERAGO_E2E_APISERVER_DOWN_SECONDS", 60) as u64);
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let operator = "app.kubernetes.io/name=perago-operator";
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), name);
    let selector = format!("perago.io/task={name}");

    for run in 1..=runs() {
        scale(cluster, name, 2);
        wait_running(&client, name, 2, Duration::from_secs(120)).await;
        let operator_before = restarts(&operator_pods, operator).await;
        let workload = start_workload(
            (&lake, &conductor),
            name,
            (&repository, &input_ref),
            run,
            80,
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;

        let finished_before = workload.finished(&conductor).await;
        let started = Instant::now();
        services
            .kube()
            .crash_and_restart_apiserver(down)
            .await
            .unwrap();
        let back = Instant::now();
        let finished_during = workload.finished(&conductor).await;
        eprintln!(
            "[api-outage] run {run}: API server away {:.1?}; {} workflows finished while it was",
            back - started,
            finished_during - finished_before
        );

        // The operator converges: Ready again, one Deployment, and it follows a new scale.
        // (Its pods are the cluster's own controllers' to make: theirs is a separate figure.)
        cluster.wait_ready(name, name).unwrap();
        let ready = back.elapsed();
        scale(cluster, name, 3);
        let followed = wait_deployment_replicas(&deployments, name, 3).await;
        let converged = back.elapsed();
        let logs = cluster.operator_logs().unwrap_or_default();
        eprintln!(
            "[api-outage] run {run}: task Ready {ready:.1?} after the API server was back; \
             a scale then followed in {followed:.1?}; the operator lost its Lease {} times so far",
            logs.matches("stopped reconciling").count(),
        );
        workload
            .wait_finished(&conductor, Duration::from_secs(600))
            .await
            .unwrap();
        let outcome = workload.outcome(&lake, &conductor).await.unwrap();
        let owned = deployments
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        let operator_after = restarts(&operator_pods, operator).await;
        report(
            "api-outage",
            run,
            &outcome,
            &format!(
                "{} finished during the outage; the operator converged {converged:.1?} after the API \
                 server was back",
                finished_during - finished_before
            ),
        );
        assert!(
            finished_during > finished_before,
            "the executor pods completed no workflow while the API server was away"
        );
        assert_eq!(outcome.failed_attempts, 0, "{outcome}");
        assert_eq!(owned.items.len(), 1, "one Deployment for the task");
        assert_eq!(
            operator_after, operator_before,
            "the operator's containers were not restarted"
        );
    }
}

/// containerd killed and started again, then the kubelet, while attempts run: the containers
/// keep running through both (their shims outlive containerd), no attempt fails, and every
/// workflow completes with its one publication. After the kubelet's restart, a body that
/// crashes is restarted and its attempt retried.
#[tokio::test]
async fn attempts_run_through_containerd_and_kubelet_restarts() {
    let test = "attempts_run_through_containerd_and_kubelet_restarts";
    let name = "node-restarts";
    let replicas = json!({"executor": {"replicas": 2}});
    let Some(Scenario {
        services,
        lake,
        repository,
        input_ref,
        conductor,
        client,
        _one,
        ..
    }) = scenario(test, name, replicas).await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), name);
    let selector = format!("perago.io/task={name}");
    let node = services.node();

    for run in 1..=runs() {
        wait_running(&client, name, 2, Duration::from_secs(120)).await;
        let before = restarts(&pods, &selector).await;
        let workload = start_workload(
            (&lake, &conductor),
            name,
            (&repository, &input_ref),
            run,
            40,
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        node.containerd
            .crash_and_restart(Duration::from_secs(3))
            .await
            .unwrap();
        // The containers still run: the restarted containerd lists their tasks.
        let tasks = ctr(&node.containerd.socket, &["tasks", "ls"]).unwrap();
        assert!(
            tasks.lines().filter(|l| l.contains("RUNNING")).count() >= 4,
            "the pods' containers run after containerd's restart:\n{tasks}"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        node.crash_and_restart_kubelet(Duration::from_secs(3))
            .await
            .unwrap();
        let took = workload
            .wait_finished(&conductor, Duration::from_secs(600))
            .await
            .unwrap();
        let outcome = workload.outcome(&lake, &conductor).await.unwrap();
        let after = restarts(&pods, &selector).await;
        report(
            "containerd-kubelet",
            run,
            &outcome,
            &format!("finished {took:.1?} after the kubelet was back"),
        );
        assert_eq!(outcome.failed_attempts, 0, "{outcome}");
        assert_eq!(after, before, "the pods and their containers are the same");

        // Then a body crashes mid-attempt (its container's PID 1 killed through containerd).
        // The kubelet restarts it beside the sidecar after its own restart (Kubernetes 1.35
        // left such a container dead after a kubelet restart when the sidecar had a startup
        // probe, until the fix of kubernetes#137146). The crashed body's attempt fails and is
        // retried, and every workflow completes with its one publication.
        let crash = Workload::start(
            &lake,
            &conductor,
            &format!("{name}.{name}"),
            (&repository, &input_ref),
            &format!("crash{run}"),
            4,
        )
        .await
        .unwrap();
        let (uid, body) = body_running_an_attempt(&conductor, &pods, &selector, &crash).await;
        ctr(
            &node.containerd.socket,
            &["tasks", "kill", "--signal", "SIGKILL", &body],
        )
        .unwrap();
        let killed = Instant::now();
        let crashed = format!("{uid}/body");
        while restarts(&pods, &selector).await.get(&crashed) == after.get(&crashed) {
            assert!(
                killed.elapsed() < Duration::from_secs(90),
                "the crashed body was not restarted in 90 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_running(&client, name, 2, Duration::from_secs(90)).await;
        let back = killed.elapsed();
        crash
            .wait_finished(&conductor, Duration::from_secs(300))
            .await
            .unwrap();
        let outcome = crash.outcome(&lake, &conductor).await.unwrap();
        report(
            "body-crash",
            run,
            &outcome,
            &format!(
                "the body restarted and ready {back:.1?} after the kill, every workflow done {:.1?} after it",
                killed.elapsed()
            ),
        );
        assert!(
            outcome.failed_attempts >= 1,
            "the crashed body's attempt failed: {outcome}"
        );
        let restarted: Vec<(String, i32)> = restarts(&pods, &selector)
            .await
            .into_iter()
            .filter(|(container, count)| after.get(container) != Some(count))
            .collect();
        assert_eq!(
            restarted,
            [(crashed.clone(), after[&crashed] + 1)],
            "only the crashed body restarted, once"
        );
    }
}

/// The uid of a pod of `selector` whose body runs one of `workload`'s attempts, and the id of
/// that body's container: an attempt in progress for 0.5 s has its files and runs the body
/// (whose `sleep 2` then has 1.5 s to go).
async fn body_running_an_attempt(
    conductor: &ConductorApi,
    pods: &Api<Pod>,
    selector: &str,
    workload: &Workload,
) -> (String, String) {
    let started = Instant::now();
    loop {
        for (id, _) in &workload.workflows {
            let workflow = conductor.workflow(id).await;
            let running = workflow["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["status"] == "IN_PROGRESS")
                .find_map(|t| t["workerId"].as_str().map(str::to_owned));
            let Some(worker) = running else { continue };
            tokio::time::sleep(Duration::from_millis(500)).await;
            let list = pods
                .list(&ListParams::default().labels(selector))
                .await
                .unwrap();
            let pod = list
                .items
                .into_iter()
                .find(|p| worker.contains(p.metadata.name.as_deref().unwrap_or("?")))
                .unwrap_or_else(|| panic!("no pod of {selector} runs worker {worker}"));
            let body = pod
                .status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.name == "body")
                .and_then(|c| c.container_id)
                .unwrap_or_else(|| panic!("worker {worker}'s pod has no body container"));
            return (
                pod.metadata.uid.unwrap_or_default(),
                body.trim_start_matches("containerd://").to_owned(),
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no attempt of {selector} in progress after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The node restarted under running attempts: the kubelet and containerd killed with every
/// container, as in a power cut, and started again 5 s later. The kubelet starts the pods'
/// containers again in the same pods; the attempts the restart cut are retried once Conductor's
/// response timeout (10 s here) passes, and every workflow completes with one publication.
#[tokio::test]
async fn attempts_cut_by_a_node_restart_are_retried_and_publish_once() {
    let test = "attempts_cut_by_a_node_restart_are_retried_and_publish_once";
    let name = "node-restart";
    // Conductor gives up on a cut attempt after 10 s.
    let spec = json!({
        "controls": {"timeout": {"responseSeconds": 10}},
        "executor": {"replicas": 2},
    });
    let Some(Scenario {
        services,
        lake,
        repository,
        input_ref,
        conductor,
        client,
        _one,
        ..
    }) = scenario(test, name, spec).await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), name);
    let selector = format!("perago.io/task={name}");

    for run in 1..=runs() {
        wait_running(&client, name, 2, Duration::from_secs(180)).await;
        let before = restarts(&pods, &selector).await;
        let workload = start_workload(
            (&lake, &conductor),
            name,
            (&repository, &input_ref),
            run,
            40,
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let cut = Instant::now();
        services
            .node()
            .restart(Duration::from_secs(5))
            .await
            .unwrap();
        wait_running(&client, name, 2, Duration::from_secs(180)).await;
        let ready_again = cut.elapsed();
        workload
            .wait_finished(&conductor, Duration::from_secs(600))
            .await
            .unwrap();
        let finished = cut.elapsed();
        let outcome = workload.outcome(&lake, &conductor).await.unwrap();
        let after = restarts(&pods, &selector).await;
        report(
            "node-restart",
            run,
            &outcome,
            &format!(
                "pods ready again {ready_again:.1?} after the cut; every workflow finished \
                 {finished:.1?} after it"
            ),
        );
        assert_eq!(
            after.keys().collect::<Vec<_>>(),
            before.keys().collect::<Vec<_>>(),
            "the same pods, their containers started again"
        );
        assert!(
            after.iter().all(|(container, n)| *n > before[container]),
            "every container was started again: {before:?} → {after:?}"
        );
    }
}

/// lakeFS and Conductor, the real processes, killed (SIGKILL) and started again on their state
/// while 40 workflows run on an autoscaled task (1 to 4 pods): lakeFS 3 s into the workload, Conductor 5 s later,
/// lakeFS again once Conductor is back. Whatever each kill cut (downloads, stages, merges,
/// polls, lease extensions, reports), every workflow completes with one publication.
#[tokio::test]
async fn lakefs_and_conductor_restarts_lose_nothing_and_publish_once() {
    let test = "lakefs_and_conductor_restarts_lose_nothing_and_publish_once";
    let name = "server-restarts";
    // Autoscaled: the operator sizes the task from Conductor's queue while the servers go.
    let autoscaled = json!({"executor": {"autoscaling": {
        "minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 8,
        "scaleDownStabilizationSeconds": 10,
    }}});
    let Some(Scenario {
        services,
        lake,
        repository,
        input_ref,
        conductor,
        _one,
        ..
    }) = scenario(test, name, autoscaled).await
    else {
        return;
    };

    for run in 1..=runs() {
        let workload = start_workload(
            (&lake, &conductor),
            name,
            (&repository, &input_ref),
            run,
            40,
        )
        .await;
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let lakefs = services.lakefs();
        lakefs
            .crash_and_restart(Duration::from_secs(1))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        services
            .conductor()
            .crash_and_restart(Duration::from_secs(1))
            .await
            .unwrap();
        lakefs
            .crash_and_restart(Duration::from_secs(1))
            .await
            .unwrap();
        workload
            .wait_finished(&conductor, Duration::from_secs(600))
            .await
            .unwrap();
        let outcome = workload.outcome(&lake, &conductor).await.unwrap();
        report(
            "server-restarts",
            run,
            &outcome,
            &format!(
                "every workflow done {:.1?} after the start",
                started.elapsed()
            ),
        );
    }
}

/// Evictions through the Eviction API (as `kubectl drain` makes them) while attempts run on
/// both pods of a task with the PodDisruptionBudget of `deploy/examples/disruption-budget.yaml`
/// (one pod unavailable at most): the first eviction is granted, the second is refused while
/// the first pod drains, and granted once its replacement is ready. Each evicted pod finishes,
/// publishes and reports what it runs before it exits: no attempt fails.
#[tokio::test]
async fn evictions_honour_the_budget_and_an_evicted_pod_publishes_what_it_runs() {
    let test = "evictions_honour_the_budget_and_an_evicted_pod_publishes_what_it_runs";
    let name = "evictions";
    let replicas = json!({"executor": {"replicas": 2}});
    let Some(Scenario {
        services,
        cluster,
        lake,
        repository,
        input_ref,
        conductor,
        client,
        _one,
    }) = scenario(test, name, replicas).await
    else {
        return;
    };
    let example = include_str!("../../deploy/examples/disruption-budget.yaml");
    let mut budget: serde_json::Value = serde_yaml::from_str(example).unwrap();
    budget["metadata"] = json!({"name": name, "namespace": name});
    budget["spec"]["selector"]["matchLabels"]["perago.io/task"] = json!(name);
    cluster.apply(&budget.to_string()).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), name);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), name);
    let selector = format!("perago.io/task={name}");
    // `kubectl drain` sees each 429 and decides; the client's own retries of 429 would hide it.
    let kubeconfig = kube::config::Kubeconfig::read_from(&services.kube().kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    let evicting: Api<Pod> = Api::namespaced(kube::Client::try_from(config).unwrap(), name);
    let evict = |pod: String| {
        let pods = evicting.clone();
        async move { pods.evict(&pod, &EvictParams::default()).await.map(|_| ()) }
    };

    for run in 1..=runs() {
        wait_running(&client, name, 2, Duration::from_secs(120)).await;
        wait_allowed(&budgets, name, 1).await;
        let workload = start_workload(
            (&lake, &conductor),
            name,
            (&repository, &input_ref),
            run,
            40,
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let names: Vec<String> = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        evict(names[0].clone()).await.unwrap();
        let refused = evict(names[1].clone()).await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(e)) if e.code == 429),
            "the second eviction is refused while the first pod drains: {refused:?}"
        );
        let drained = Instant::now();
        wait_gone(&pods, &names[0]).await;
        let drained = drained.elapsed();
        wait_running(&client, name, 2, Duration::from_secs(120)).await;
        wait_allowed(&budgets, name, 1).await;
        evict(names[1].clone()).await.unwrap();
        let took = workload
            .wait_finished(&conductor, Duration::from_secs(600))
            .await
            .unwrap();
        let outcome = workload.outcome(&lake, &conductor).await.unwrap();
        report(
            "evictions",
            run,
            &outcome,
            &format!("the first evicted pod drained in {drained:.1?}; all finished in {took:.1?}"),
        );
        assert_eq!(outcome.failed_attempts, 0, "{outcome}");
    }
}

/// Until the budget allows `allowed` disruptions.
async fn wait_allowed(budgets: &Api<PodDisruptionBudget>, name: &str, allowed: i32) {
    let started = Instant::now();
    loop {
        let status = budgets.get(name).await.ok().and_then(|b| b.status);
        if status
            .as_ref()
            .is_some_and(|s| s.disruptions_allowed == allowed)
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the budget {name} does not allow {allowed} disruption: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Until the pod is gone (two minutes at most).
async fn wait_gone(pods: &Api<Pod>, name: &str) {
    let started = Instant::now();
    while pods.get_opt(name).await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{name} still there after two minutes"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The operator's leader lost under a scale wave (its pod force-deleted, as when its node
/// dies: the standby takes the Lease once it expires) and under TaskDef drift repair (its
/// container SIGKILLed: the kubelet restarts it at once, and it or the standby takes the Lease
/// again). Either way the scale and the repair finish as they would without the fault, and no
/// pod beyond the ones asked for is made.
#[tokio::test]
async fn the_scale_and_the_drift_repair_finish_when_the_leader_is_killed() {
    let test = "the_scale_and_the_drift_repair_finish_when_the_leader_is_killed";
    let name = "leader-kill";
    let replicas = json!({"executor": {"replicas": 1}});
    let Some(Scenario {
        services,
        cluster,
        conductor,
        client,
        _one,
        ..
    }) = scenario(test, name, replicas).await
    else {
        return;
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let task_name = format!("{name}.{name}");
    let taskdef = format!("/metadata/taskdefs/{task_name}");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), name);

    for run in 1..=runs() {
        wait_operator_ready(&operator_pods).await;
        wait_running(&client, name, 1, Duration::from_secs(120)).await;

        // The leader's pod gone at once (force-deleted), and a scale wave from 1 to 3 pods
        // asked for while the Lease still names it: the standby takes the Lease when it
        // expires and scales.
        let dead = leader(&leases).await;
        let socket = &services.node().containerd.socket;
        let container = operator_container(&operator_pods, &dead).await;
        operator_pods
            .delete(&dead, &kube::api::DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        let killed = Instant::now();
        // The API object goes at once; the kubelet stops the container a moment later.
        while ctr(socket, &["tasks", "ls", "-q"])
            .unwrap()
            .contains(&container)
        {
            assert!(
                killed.elapsed() < Duration::from_secs(30),
                "{dead} still runs"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        scale(cluster, name, 3);
        wait_deployment_replicas(&deployments, name, 3).await;
        let scaled = killed.elapsed();
        let successor = leader(&leases).await;
        assert_ne!(successor, dead, "another replica holds the Lease");
        wait_running(&client, name, 3, Duration::from_secs(120)).await;

        // The leader's container killed (the kubelet restarts it at once), and the TaskDef's
        // retries changed behind the operator's back meanwhile.
        wait_operator_ready(&operator_pods).await;
        let killed_container =
            kill_leader_container(&leases, &operator_pods, &services.node().containerd.socket)
                .await;
        let drifted = Instant::now();
        let mut def = conductor.call(reqwest::Method::GET, &taskdef, None).await;
        let wanted = def["retryCount"].clone();
        def["retryCount"] = json!(9);
        conductor
            .call(reqwest::Method::PUT, "/metadata/taskdefs", Some(&def))
            .await;
        let repaired = loop {
            let def = conductor.call(reqwest::Method::GET, &taskdef, None).await;
            if def["retryCount"] == wanted {
                break drifted.elapsed();
            }
            assert!(
                drifted.elapsed() < Duration::from_secs(120),
                "the TaskDef's drift was not repaired: {def}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), name);
        let live = pods
            .list(&ListParams::default().labels(&format!("perago.io/task={name}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        assert_eq!(live, 3, "no pod beyond the 3 asked for");
        eprintln!(
            "[leader-kill] run {run}: leader pod {dead} deleted, then a scale asked for: followed \
             {scaled:.1?} after the deletion by {successor}; leader container {killed_container} \
             killed, then the TaskDef drifted: repaired {repaired:.1?} after the kill, {} leads",
            leader(&leases).await
        );
        scale(cluster, name, 1);
    }
}

/// `kubectl scale` the PeragoTask `name` (in its namespace of the same name).
fn scale(cluster: &Cluster, name: &str, replicas: i32) {
    cluster
        .kubectl(&[
            "scale",
            "-n",
            name,
            &format!("peragotask/{name}"),
            &format!("--replicas={replicas}"),
        ])
        .unwrap();
}

/// Until the task's Deployment asks for `replicas` pods (what the operator does on a scale);
/// how long that took.
async fn wait_deployment_replicas(
    deployments: &Api<Deployment>,
    name: &str,
    replicas: i32,
) -> Duration {
    let started = Instant::now();
    let deployment = format!("{name}-perago");
    loop {
        let asked = deployments
            .get_opt(&deployment)
            .await
            .ok()
            .flatten()
            .and_then(|d| d.spec?.replicas);
        if asked == Some(replicas) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{deployment} asks for {asked:?} replicas, not {replicas}, after two minutes"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The holder of the operator's Lease.
async fn leader(leases: &Api<Lease>) -> String {
    leases
        .get("perago-operator")
        .await
        .ok()
        .and_then(|l| l.spec?.holder_identity)
        .unwrap_or_default()
}

/// SIGKILL the operator container of the pod holding the Lease; the pod's name.
async fn kill_leader_container(
    leases: &Api<Lease>,
    pods: &Api<Pod>,
    socket: &std::path::Path,
) -> String {
    let holder = leader(leases).await;
    let container = operator_container(pods, &holder).await;
    ctr(
        socket,
        &["tasks", "kill", "--signal", "SIGKILL", &container],
    )
    .unwrap();
    holder
}

/// The containerd id of the operator container of `pod`.
async fn operator_container(pods: &Api<Pod>, pod: &str) -> String {
    pods.get(pod)
        .await
        .unwrap()
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == "operator")
        .and_then(|c| c.container_id)
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned()
}

/// Until every operator pod that has not ended runs with its containers ready. An operator
/// pod the kubelet evicted in the disk scenario stays listed, ended, beside its replacement.
async fn wait_operator_ready(pods: &Api<Pod>) {
    let started = Instant::now();
    loop {
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=perago-operator"))
            .await
            .unwrap();
        let live = list.items.iter().filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        });
        if live.clone().next().is_some()
            && live.clone().all(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|c| c.iter().all(|c| c.ready))
            })
        {
            return;
        }
        // A killed container restarts after the kubelet's back-off, which doubles with each
        // kill; the node's lanes share two cores.
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "the operator's pods are not ready 240 s after the leader was killed: {:?}",
            live.map(|p| (
                p.metadata.name.clone(),
                p.status.as_ref().and_then(|s| s.phase.clone())
            ))
            .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The node's disk filled past the kubelet's eviction threshold while workflows run, by a pod
/// that stays within its own ephemeral-storage request. The kubelet evicts the pods beyond
/// theirs first: the executor pods, which get their grace period, finish, publish and report
/// what they run, and exit. Their replacements wait out the pressure (the node is tainted);
/// once the disk is freed they start, and every workflow completes once.
#[tokio::test]
async fn a_node_short_of_disk_evicts_executor_pods_and_nothing_is_lost() {
    let test = "a_node_short_of_disk_evicts_executor_pods_and_nothing_is_lost";
    let name = "disk-pressure";
    // Each pod keeps 16 MiB of scratch in the body's /tmp: the most disk beyond its request
    // of any pod on the node (those of the other scenarios keep a few bytes), so the
    // kubelet evicts these first. Attempts of 6 s keep work in flight through the evictions.
    let body =
        format!("dd if=/dev/zero of=/tmp/scratch bs=1M count=16 2>/dev/null\nsleep 4\n{BODY}");
    // Autoscaled from two pods to four: the operator sizes the task from its queue while the
    // kubelet evicts its pods and their replacements wait.
    let spec = json!({"executor": {
        "autoscaling": {
            "minReplicas": 2, "maxReplicas": 4, "targetQueueDepth": 8,
            "scaleDownStabilizationSeconds": 10,
        },
        "body": {"command": ["sh", "-c", body]},
    }});
    let Some(Scenario {
        cluster,
        lake,
        repository,
        input_ref,
        conductor,
        client,
        _one,
        ..
    }) = scenario(test, name, spec).await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), name);
    let nodes: Api<Node> = Api::all(client.clone());
    let selector = format!("perago.io/task={name}");
    // Enough to leave less than the threshold free, within what the filler requests.
    let ballast = NODE_DISK_MIB - NodeDisk::threshold_mib(NODE_DISK_MIB) + 100;
    let filler = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: filler, namespace: {name}}}\nspec:\n  \
         restartPolicy: Never\n  \
         securityContext: {{runAsNonRoot: true, runAsUser: 65534, seccompProfile: {{type: RuntimeDefault}}}}\n  \
         containers:\n  - name: fill\n    image: {BUSYBOX_BODY_IMAGE}\n    imagePullPolicy: Never\n    \
         command: [sh, -c, 'dd if=/dev/zero of=/ballast/fill bs=1M count={ballast} && sleep 3600']\n    \
         resources: {{requests: {{ephemeral-storage: {}Mi}}}}\n    \
         securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n    \
         volumeMounts: [{{name: ballast, mountPath: /ballast}}]\n  \
         volumes: [{{name: ballast, emptyDir: {{}}}}]\n",
        ballast + 64
    );

    for run in 1..=runs() {
        wait_running(&client, name, 2, Duration::from_secs(180)).await;
        let before: Vec<String> = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        let began = Instant::now();
        let workload = start_workload(
            (&lake, &conductor),
            name,
            (&repository, &input_ref),
            run,
            40,
        )
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let filled = Instant::now();
        cluster.apply(&filler).unwrap();
        // Until the kubelet has evicted both executor pods.
        let evicted = loop {
            let evicted = before.len()
                - pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .filter(|p| p.metadata.name.as_ref().is_some_and(|n| before.contains(n)))
                    .filter(|p| !stopped_by_the_kubelet(p))
                    .count();
            if evicted == before.len() {
                break filled.elapsed();
            }
            assert!(
                filled.elapsed() < Duration::from_secs(180),
                "{evicted} of {} executor pods evicted 180 s after the disk was filled: {:?}",
                before.len(),
                pods.list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .map(|p| (
                        p.metadata.name.clone(),
                        p.status.as_ref().and_then(|s| s.phase.clone()),
                        p.status.as_ref().and_then(|s| s.conditions.clone())
                    ))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        assert!(
            disk_pressure(&nodes).await,
            "the node reports DiskPressure while the disk is full"
        );
        cluster
            .kubectl(&["delete", "pod", "-n", name, "filler", "--wait=true"])
            .unwrap();
        let freed = Instant::now();
        while disk_pressure(&nodes).await {
            assert!(
                freed.elapsed() < Duration::from_secs(120),
                "the node still reports DiskPressure 120 s after the disk was freed"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let lifted = freed.elapsed();
        workload
            .wait_finished(&conductor, Duration::from_secs(600))
            .await
            .unwrap();
        let took = began.elapsed();
        let outcome = workload.outcome(&lake, &conductor).await.unwrap();
        // The kubelet keeps the pods it stopped: remove them for the next run.
        let stopped = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(stopped_by_the_kubelet)
            .filter_map(|p| p.metadata.name)
            .collect::<Vec<_>>();
        for pod in &stopped {
            let _ = cluster.kubectl(&["delete", "pod", "-n", name, pod, "--wait=false"]);
        }
        report(
            "disk pressure",
            run,
            &outcome,
            &format!(
                "the first two pods evicted {evicted:.1?} after the fill, {} pods in all; the \
                 pressure lifted {lifted:.1?} after the disk was freed; every workflow done \
                 {took:.1?} after the start",
                stopped.len()
            ),
        );
    }
}

/// Whether the kubelet stopped the pod for the node's sake: its `DisruptionTarget` condition
/// says so, and it ended (`Failed`, or `Succeeded` when every container exited cleanly within
/// the grace period, as a drained sidecar does).
fn stopped_by_the_kubelet(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    let by_kubelet = (status.conditions.iter().flatten()).any(|c| {
        c.type_ == "DisruptionTarget" && c.reason.as_deref() == Some("TerminationByKubelet")
    });
    let ended = matches!(status.phase.as_deref(), Some("Failed" | "Succeeded"));
    by_kubelet && ended
}

/// Whether the node reports DiskPressure.
async fn disk_pressure(nodes: &Api<Node>) -> bool {
    let node = nodes.get(NODE_NAME).await.unwrap();
    node.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "DiskPressure" && c.status == "True")
}
