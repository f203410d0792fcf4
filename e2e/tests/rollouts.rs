//! Canary rollouts of a task's pod template (`spec.rollout`, docs/rollouts.md) on the real
//! node: a canary whose body fails every attempt is rolled back by its analysis while a queue
//! of workflows runs, and every workflow completes on the stable pods; a healthy canary goes
//! through its steps and replaces the old pods; `kubectl perago rollout promote` and `abort`
//! act at once, and a change during a rollout starts it over.
//!
//! A binary of its own, with the operator installed once: the heavy tests bring up to eight
//! pods and a queue of workspace steps, and beside the `pods` binary's tests on the node's two
//! cores, new pods of either were seen to wait minutes before they polled.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use perago_api::PeragoTask;
use perago_api::rollout::{RolloutPhase, RolloutStatus};
use perago_e2e::cluster::Cluster;
use perago_e2e::lake::Lake;
use perago_e2e::pod::ConductorApi;
use perago_e2e::workload::{Workload, workspace_task_with};
use perago_e2e::{Selection, Services, shared};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

static OPERATOR: OnceCell<Cluster> = OnceCell::const_new();

/// The node, with the operator installed from the chart (once per test binary); `None` when
/// the developer opted out of the node's tests. A 10 s resync, as in `pods`.
async fn cluster(test: &str) -> Option<(&'static Services, &'static Cluster)> {
    if perago_e2e::node_opted_out(test) {
        return None;
    }
    let services = shared(Selection::ALL).await;
    let cluster = OPERATOR
        .get_or_init(|| async {
            let cluster = Cluster::new(services).unwrap();
            let took = cluster
                .install_operator(&["--set", "resyncSeconds=10"])
                .unwrap();
            eprintln!("operator installed by helm and available in {took:.1?}");
            cluster
        })
        .await;
    Some((services, cluster))
}

/// A lakeFS repository for one test, its main holding `data/in.txt`: the client, the
/// repository's name and the seed commit.
async fn seeded(services: &Services, prefix: &str) -> (Lake, String, String) {
    Lake::seeded(services.lakefs(), prefix).await.unwrap()
}

/// A body that works a second, writes its file and its result; `version` tells templates apart.
fn good_body(version: &str) -> String {
    format!(
        r#"
set -eu
sleep 1
echo "written by $PERAGO_TASK_ID with body {version}" > "$PERAGO_WORKSPACE/canary-$PERAGO_WORKFLOW_INSTANCE_ID.txt"
printf '{{"files": 1}}' > "$PERAGO_RESULT"
"#
    )
}

/// A broken build: works a second, then fails every attempt.
const BAD_BODY: &str = r#"
set -eu
sleep 1
echo "broken build" >&2
exit 3
"#;

/// A workspace task at `replicas` pods × `slots`, retried up to four times, with `rollout`.
fn canary_task(
    namespace: &str,
    name: &str,
    script: &str,
    (replicas, slots): (i32, i32),
    rollout: &Value,
) -> String {
    let spec = json!({
        "controls": {
            "retry": {"count": 4, "logic": "FIXED", "delaySeconds": 1},
            "timeout": {"policy": "RETRY", "seconds": 120, "responseSeconds": 30},
        },
        "executor": {"slots": slots, "replicas": replicas},
        "rollout": rollout,
    });
    workspace_task_with(namespace, name, script, &spec)
}

/// A test's namespace, deleted when the test ends (also when it fails), and waited for: its
/// executor pods request a share of the node's two CPUs, and the node lane's next binaries
/// need theirs to be scheduled.
struct NamespaceGone {
    cluster: &'static Cluster,
    namespace: &'static str,
}

impl Drop for NamespaceGone {
    fn drop(&mut self) {
        let args = [
            "delete",
            "namespace",
            self.namespace,
            "--ignore-not-found",
            "--timeout=180s",
        ];
        if let Err(e) = self.cluster.kubectl(&args) {
            eprintln!("{}: {e:#}", args.join(" "));
        }
    }
}

/// `full` workflows, or `PERAGO_E2E_ROLLOUT_WORKFLOWS` (CI's smaller size) when set.
fn workflows(full: usize) -> usize {
    std::env::var("PERAGO_E2E_ROLLOUT_WORKFLOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(full)
}

fn deployment_name(task: &str) -> String {
    perago_api::task::object_name(task)
}

fn canary_name(task: &str) -> String {
    format!("{}-canary", deployment_name(task))
}

/// The body command of `deployment`'s template.
fn body_script(deployment: &Deployment) -> String {
    let spec = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref());
    spec.and_then(|s| s.containers.iter().find(|c| c.name == "body"))
        .and_then(|c| c.command.as_ref()?.last().cloned())
        .unwrap_or_default()
}

/// What the poll of [`until`] sees.
struct Look {
    task: PeragoTask,
    rollout: Option<RolloutStatus>,
    canary: Option<Deployment>,
}

/// Look at the task and its canary every 250 ms until `done` says so; every look goes to
/// `seen` too.
async fn until(
    tasks: &Api<PeragoTask>,
    deployments: &Api<Deployment>,
    name: &str,
    limit: Duration,
    mut seen: impl FnMut(&Look),
    done: impl Fn(&Look) -> bool,
) -> Look {
    let started = Instant::now();
    loop {
        let look = look(tasks, deployments, name).await;
        seen(&look);
        if done(&look) {
            return look;
        }
        assert!(
            started.elapsed() < limit,
            "{name}: not there after {limit:?}; rollout {:?}, conditions {:?}",
            look.rollout,
            look.task.status.as_ref().map(|s| &s.conditions)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn look(tasks: &Api<PeragoTask>, deployments: &Api<Deployment>, name: &str) -> Look {
    let task = tasks.get(name).await.unwrap();
    let rollout = task.status.as_ref().and_then(|s| s.rollout.clone());
    let canary = deployments.get_opt(&canary_name(name)).await.unwrap();
    Look {
        task,
        rollout,
        canary,
    }
}

/// Run `work` while recording the rollout's path every 250 ms: a step can pass while the
/// workflows start, which takes seconds on a loaded machine.
async fn recording<T>(
    tasks: &Api<PeragoTask>,
    deployments: &Api<Deployment>,
    name: &str,
    path: &mut Vec<(RolloutPhase, i32, i32)>,
    work: impl std::future::Future<Output = T>,
) -> T {
    let mut work = std::pin::pin!(work);
    loop {
        let observe = async {
            record(path, &look(tasks, deployments, name).await);
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        tokio::select! {
            out = &mut work => return out,
            () = observe => {}
        }
    }
}

/// Add the rollout's (phase, step, the canary's pods) to `path` when it changed.
fn record(path: &mut Vec<(RolloutPhase, i32, i32)>, look: &Look) {
    let Some(r) = &look.rollout else { return };
    let pods = (look.canary.as_ref())
        .and_then(|d| d.spec.as_ref()?.replicas)
        .unwrap_or(0);
    let now = (r.phase, r.step, pods);
    if path.last() != Some(&now) {
        path.push(now);
    }
}

/// A rollout in progress whose current step's canary pods are ready.
fn step_ready(look: &Look) -> bool {
    look.rollout
        .as_ref()
        .is_some_and(|r| r.phase == RolloutPhase::Progressing && r.step_ready_time.is_some())
}

fn phase(look: &Look) -> Option<RolloutPhase> {
    look.rollout.as_ref().map(|r| r.phase)
}

fn ready_condition(task: &PeragoTask) -> (String, String, String) {
    let status = task.status.as_ref().unwrap();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    (
        ready.status.clone(),
        ready.reason.clone(),
        ready.message.clone(),
    )
}

fn events(cluster: &Cluster, namespace: &str, reason: &str) -> String {
    cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("reason={reason}"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap()
}

/// A new image whose body fails every attempt, applied while a queue of workflows runs on
/// 4 pods × 2 slots: the canary takes its step's share (1 pod), its analysis rolls it back
/// after its first `minAttempts` judged attempts, every workflow completes (the failed attempts
/// retried on the stable pods) and publishes once, and the task ends on the old template, Ready
/// with the reason `RolledBack`, a Warning event saying why.
#[tokio::test]
async fn a_failing_canary_is_rolled_back_and_every_workflow_completes() {
    let Some((services, cluster)) =
        cluster("a_failing_canary_is_rolled_back_and_every_workflow_completes").await
    else {
        return;
    };
    let workflows_wanted = workflows(200);
    let (namespace, name) = ("pods-canary-bad", "canary-bad");
    let _gone = NamespaceGone { cluster, namespace };
    let min_attempts = 6;
    let rollout = json!({
        "strategy": "Canary",
        "steps": [{"weight": 25, "pauseSeconds": 600}, {"weight": 50, "pauseSeconds": 600}],
        "analysis": {"maxFailedPercent": 20, "minAttempts": min_attempts},
    });
    cluster.task_namespace(namespace).unwrap();
    let good = good_body("1");
    cluster
        .apply(&canary_task(namespace, name, &good, (4, 2), &rollout))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (lake, repository, input_ref) = seeded(services, "pods-canary-bad").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let client = services.kube().client().await.unwrap();
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(client, namespace);

    // The new template first, then the queue once its canary is ready: the canary takes its
    // share of the queue from the first workflow, whatever the queue's length.
    cluster
        .apply(&canary_task(namespace, name, BAD_BODY, (4, 2), &rollout))
        .unwrap();
    // The canary's pods at most, as long as it is seen.
    let mut canary_pods = 0;
    let mut count = |look: &Look| {
        let replicas = look.canary.as_ref().and_then(|d| d.spec.as_ref()?.replicas);
        canary_pods = canary_pods.max(replicas.unwrap_or(0));
    };
    until(
        &tasks,
        &deployments,
        name,
        Duration::from_secs(180),
        &mut count,
        step_ready,
    )
    .await;
    let started = Instant::now();
    let workload = Workload::start(
        &lake,
        &conductor,
        &format!("{namespace}.{name}"),
        (&repository, &input_ref),
        "bad",
        workflows_wanted,
    )
    .await
    .unwrap();
    let back = until(
        &tasks,
        &deployments,
        name,
        Duration::from_secs(300),
        &mut count,
        |look| phase(look) == Some(RolloutPhase::RolledBack) && look.canary.is_none(),
    )
    .await;
    let rolled_back = started.elapsed();
    let judged = back.rollout.clone().unwrap();
    assert_eq!(canary_pods, 1, "25% of 4 pods");
    assert!(
        judged.canary.failed >= min_attempts,
        "rolled back on {:?}",
        judged.canary
    );
    assert!(
        judged.message.contains("failed in the body"),
        "{}",
        judged.message
    );

    workload
        .wait_finished(&conductor, Duration::from_secs(900))
        .await
        .unwrap();
    let outcome = workload.outcome(&lake, &conductor).await.unwrap();
    assert!(outcome.holds_the_promises(), "{outcome}");

    // On the old template, Ready, saying why.
    let stable = deployments.get(&deployment_name(name)).await.unwrap();
    assert_eq!(
        body_script(&stable),
        good,
        "the stable pods run the old body"
    );
    cluster.wait_ready(namespace, name).unwrap();
    let (ready, reason, message) = ready_condition(&tasks.get(name).await.unwrap());
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("True", "RolledBack"),
        "{message}"
    );
    assert!(message.contains("does not run"), "{message}");
    let warned = events(cluster, namespace, "RolledBack");
    assert!(warned.contains("failed in the body"), "events: {warned:?}");
    eprintln!(
        "canary rolled back {rolled_back:.1?} after the queue started, on {} completed, {} failed in the \
         body, {} not judged; {outcome}",
        judged.canary.completed, judged.canary.failed, judged.canary.not_judged
    );
}

/// A healthy new template on 4 pods × 2 slots with a queue of workflows: the canary takes 1
/// pod, then 2, then replaces the old template in every pod and goes; every workflow completes
/// with one attempt (the old pods drained and reported everything they ran) and publishes once.
#[tokio::test]
async fn a_healthy_canary_goes_through_its_steps_and_replaces_the_old_pods() {
    let Some((services, cluster)) =
        cluster("a_healthy_canary_goes_through_its_steps_and_replaces_the_old_pods").await
    else {
        return;
    };
    let healthy_workflows = workflows(120);
    let (namespace, name) = ("pods-canary-good", "canary-good");
    let _gone = NamespaceGone { cluster, namespace };
    let rollout = json!({
        "strategy": "Canary",
        "steps": [{"weight": 25, "pauseSeconds": 4}, {"weight": 50, "pauseSeconds": 4}],
        "analysis": {"maxFailedPercent": 20, "minAttempts": 4},
    });
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&canary_task(
            namespace,
            name,
            &good_body("1"),
            (4, 2),
            &rollout,
        ))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (lake, repository, input_ref) = seeded(services, "pods-canary-good").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let client = services.kube().client().await.unwrap();
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(client, namespace);

    // The queue starts once the first step's canary is ready, so that the steps, the
    // analysis and the old pods' drain all happen under work, whatever the queue's length.
    let started = Instant::now();
    let new = good_body("2");
    cluster
        .apply(&canary_task(namespace, name, &new, (4, 2), &rollout))
        .unwrap();
    // (phase, step, the canary's pods), each change once, from the change on.
    let mut path: Vec<(RolloutPhase, i32, i32)> = Vec::new();
    until(
        &tasks,
        &deployments,
        name,
        Duration::from_secs(180),
        |look| record(&mut path, look),
        step_ready,
    )
    .await;
    let task_type = format!("{namespace}.{name}");
    let start = Workload::start(
        &lake,
        &conductor,
        &task_type,
        (&repository, &input_ref),
        "good",
        healthy_workflows,
    );
    let workload = recording(&tasks, &deployments, name, &mut path, start)
        .await
        .unwrap();
    let done = until(
        &tasks,
        &deployments,
        name,
        Duration::from_secs(300),
        |look| record(&mut path, look),
        |look| phase(look) == Some(RolloutPhase::Completed) && look.canary.is_none(),
    )
    .await;
    let took = started.elapsed();
    let stepped = |step: i32, pods: i32| {
        path.iter()
            .any(|&(p, s, n)| p == RolloutPhase::Progressing && s == step && n == pods)
    };
    assert!(
        stepped(0, 1) && stepped(1, 2),
        "25% then 50% of 4 pods: {path:?}"
    );
    let stable = deployments.get(&deployment_name(name)).await.unwrap();
    assert_eq!(body_script(&stable), new, "every pod runs the new body");
    let judged = done.rollout.unwrap().canary;
    assert!(judged.completed >= 4 && judged.failed == 0, "{judged:?}");

    workload
        .wait_finished(&conductor, Duration::from_secs(600))
        .await
        .unwrap();
    let outcome = workload.outcome(&lake, &conductor).await.unwrap();
    assert!(outcome.holds_the_promises(), "{outcome}");
    assert_eq!(
        (outcome.attempts, outcome.failed_attempts),
        (healthy_workflows, 0),
        "one attempt each: {outcome}"
    );
    cluster.wait_ready(namespace, name).unwrap();
    eprintln!("canary went through {path:?} and completed in {took:.1?}; {outcome}");
}

/// `kubectl perago rollout promote` replaces the old template at once (the steps and the
/// analysis skipped); a change during a rollout starts it over from the new template; `abort`
/// returns to the stable template at once; orders for no rollout in progress are refused.
#[tokio::test]
async fn promote_and_abort_act_at_once_and_a_change_starts_over() {
    let Some((services, cluster)) =
        cluster("promote_and_abort_act_at_once_and_a_change_starts_over").await
    else {
        return;
    };
    let (namespace, name) = ("pods-canary-orders", "canary-orders");
    let _gone = NamespaceGone { cluster, namespace };
    // It never promotes by itself: an hour's step, a thousand attempts to judge.
    let rollout = json!({
        "strategy": "Canary",
        "steps": [{"weight": 50, "pauseSeconds": 3600}],
        "analysis": {"maxFailedPercent": 20, "minAttempts": 1000},
    });
    cluster.task_namespace(namespace).unwrap();
    let apply = |version: &str| {
        cluster
            .apply(&canary_task(
                namespace,
                name,
                &good_body(version),
                (2, 1),
                &rollout,
            ))
            .unwrap();
    };
    apply("1");
    cluster.wait_ready(namespace, name).unwrap();
    let plugin = perago_e2e::process::release_binaries(&["kubectl-perago"], "the rollout test")
        .unwrap()
        .join("kubectl-perago");
    let order = |verb: &str| {
        let out = std::process::Command::new(&plugin)
            .args(["rollout", verb, name, "-n", namespace])
            .env("KUBECONFIG", cluster.kubeconfig())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let client = services.kube().client().await.unwrap();
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(client, namespace);
    let limit = Duration::from_secs(180);
    let in_step = step_ready;

    // Promote: the new template everywhere, the canary gone.
    apply("2");
    until(&tasks, &deployments, name, limit, |_| {}, in_step).await;
    let (code, stdout, stderr) = order("promote");
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    until(
        &tasks,
        &deployments,
        name,
        limit,
        |_| {},
        |look| phase(look) == Some(RolloutPhase::Completed) && look.canary.is_none(),
    )
    .await;
    let stable = deployments.get(&deployment_name(name)).await.unwrap();
    assert_eq!(body_script(&stable), good_body("2"));

    // A change during a rollout starts it over from the new template.
    apply("3");
    let third = until(&tasks, &deployments, name, limit, |_| {}, in_step).await;
    let third = third.rollout.unwrap().revision;
    apply("4");
    let fourth = until(
        &tasks,
        &deployments,
        name,
        limit,
        |_| {},
        |look| in_step(look) && look.rollout.as_ref().is_some_and(|r| r.revision != third),
    )
    .await;
    let fourth = fourth.rollout.unwrap();
    assert_eq!(fourth.step, 0, "started over: {fourth:?}");
    let canary = deployments.get(&canary_name(name)).await.unwrap();
    assert_eq!(body_script(&canary), good_body("4"));

    // Abort: back to the stable template, the canary gone, Ready saying why.
    let (code, stdout, stderr) = order("abort");
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let aborted = until(
        &tasks,
        &deployments,
        name,
        limit,
        |_| {},
        |look| phase(look) == Some(RolloutPhase::Aborted) && look.canary.is_none(),
    )
    .await;
    assert_eq!(aborted.rollout.unwrap().revision, fourth.revision);
    let stable = deployments.get(&deployment_name(name)).await.unwrap();
    assert_eq!(
        body_script(&stable),
        good_body("2"),
        "the stable template stays"
    );
    cluster.wait_ready(namespace, name).unwrap();
    let (_, reason, message) = ready_condition(&tasks.get(name).await.unwrap());
    assert_eq!(reason, "RolloutAborted", "{message}");

    let (code, stdout, _) = order("status");
    assert_eq!(code, Some(0), "an aborted rollout is not flagged: {stdout}");
    assert!(stdout.contains("Aborted"), "{stdout}");
    let (code, _, stderr) = order("promote");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no canary rollout in progress"), "{stderr}");
}
