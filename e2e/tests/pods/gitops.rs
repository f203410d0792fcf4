//! Flux pulling PeragoTasks from Git on the real node: Flux's own source-controller and
//! kustomize-controller (host processes, `perago_e2e::flux`) clone a repository from a Git
//! server on this machine and apply the example tasks with `wait: true` and `prune: true`, while
//! the operator, installed from the chart, reconciles them.
//!
//! - The Kustomization, with the health checks of `deploy/flux/peragotasks-kustomization.yaml`,
//!   turns Ready only once every PeragoTask it applied is Ready; a task removed from Git is
//!   pruned, its pods drained and its TaskDef deleted or kept as its `deletionPolicy` says.
//! - Bad commits on top of a running task fail the Kustomization in Flux's words, naming the
//!   task, and leave the running task's pods alone: an image that cannot be pulled (the health
//!   check times out), a sibling whose TaskDef conflicts (Stalled, so Failed at once), a task
//!   the webhook refuses. With the Git server gone the task runs on.
//! - The race (`pods/with_the_operator_down.rs`, which uses the helpers here): with the
//!   operator scaled to zero, a task applied through a new commit has no status. Flux's default
//!   (kstatus) health check takes it for Current and reports the Kustomization Ready at once;
//!   with the shipped expressions Flux waits until the operator is back and the task is Ready.
//!   The test prints both figures, and also whether, with the operator up, Flux's first health
//!   check of a new task came before the operator's first status (not asserted: it is a race).
//!
//! The scenarios run on the operator and the node of the rest of this binary, Flux started by the
//! first of them. The race has the binary alone once it stops the operator, and then sets the
//! webhook's `failurePolicy` to `Ignore`, so that a task can be applied while no operator replica
//! serves it (the chart's values say that is what Ignore is for); afterwards it puts back the
//! installed replicas and `Fail`, as the other tests expect them ([`OperatorHeld`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use perago_e2e::cluster::{
    Cluster, OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE, WEBHOOK_CONFIGURATION,
};
use perago_e2e::flux::{self, Flux, Repository};
use perago_e2e::node::BUSYBOX_BODY_IMAGE;
use perago_e2e::pod::ConductorApi;
use perago_e2e::{Selection, shared};
use serde_json::{Value, json};
use tokio::sync::RwLock;

use super::{FLUX, TURNS, Turn, operator};

/// The scenarios share the Git server; the one that stops it (the lost Git server) has it
/// alone. Taken after a turn of `TURNS`, and let go before waiting to be alone there.
static GIT: RwLock<()> = RwLock::const_new(());

/// One test's view of the node, the operator and Flux.
pub(super) struct Scenario {
    pub(super) cluster: &'static Cluster,
    pub(super) flux: &'static Flux,
    /// A client of this test's own runtime (one made on another test's would stop with it).
    pub(super) client: kube::Client,
    /// Held (never read) for the whole test: its turns on the operator and on the Git server.
    node: Turn,
    git: Turn,
}

impl Scenario {
    /// The test's task namespace and its Git repository `name`, and what removes them and
    /// Flux's objects of `name` when the test ends.
    pub(super) fn repository(
        &self,
        name: &'static str,
        namespace: &'static str,
    ) -> (Cleanup, Repository) {
        self.cluster.task_namespace(namespace).unwrap();
        let cleanup = Cleanup {
            cluster: self.cluster,
            name,
            namespace,
        };
        (cleanup, self.flux.git.repository(name).unwrap())
    }

    /// From now on, no other test of the binary runs until this one ends: the operator may
    /// stop. Nor does any other scenario, so the Git server is this one's too.
    pub(super) async fn alone(&self) {
        // The turn on the Git server goes first: a test waiting to be alone with it holds a
        // turn on the operator, which this one waits for.
        self.git.release().await;
        self.node.alone().await;
    }

    /// From now on, no other GitOps scenario runs until this one ends: the Git server may stop.
    async fn alone_with_git(&self) {
        self.git.alone().await;
    }
}

/// A scenario's Flux objects and namespace, deleted when the scenario ends (also when it fails),
/// without waiting: every executor pod requests a share of the node's CPU, and the other tests
/// of the binary need theirs.
pub(super) struct Cleanup {
    cluster: &'static Cluster,
    name: &'static str,
    namespace: &'static str,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let flux_objects = [
            format!("kustomization/{}", self.name),
            format!("gitrepository/{}", self.name),
        ];
        for args in [
            vec![
                "delete",
                "-n",
                flux::NAMESPACE,
                &flux_objects[0],
                &flux_objects[1],
            ],
            vec!["delete", "namespace", self.namespace],
        ] {
            let args = [args.as_slice(), &["--ignore-not-found", "--wait=false"]].concat();
            if let Err(e) = self.cluster.kubectl(&args) {
                eprintln!("{}: {e:#}", args.join(" "));
            }
        }
    }
}

pub(super) async fn setup(test: &str) -> Option<Scenario> {
    let (services, cluster) = operator(test).await?;
    let flux = FLUX
        .get_or_init(|| async {
            let started = Instant::now();
            let flux = Flux::start(services.dir(), cluster).await.unwrap();
            eprintln!(
                "Flux's CRDs, controllers and Git server ready in {:.1?}",
                started.elapsed()
            );
            flux
        })
        .await;
    let node = Turn::shared(&TURNS, Some(test)).await;
    let git = Turn::shared(&GIT, None).await;
    Some(Scenario {
        cluster,
        flux,
        client: services.kube().client().await.unwrap(),
        node,
        git,
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The health checks `deploy/flux/peragotasks-kustomization.yaml` ships.
pub(super) fn shipped_health_checks() -> Value {
    let text =
        std::fs::read_to_string(repo().join("deploy/flux/peragotasks-kustomization.yaml")).unwrap();
    let kustomization: Value = serde_yaml::from_str(&text).unwrap();
    let checks = kustomization["spec"]["healthCheckExprs"].clone();
    assert!(
        checks.as_array().is_some_and(|c| !c.is_empty()),
        "deploy/flux/peragotasks-kustomization.yaml has no healthCheckExprs"
    );
    checks
}

/// An example task of `deploy/examples`, runnable on the node: named `name`, its Conductor
/// task `<namespace>.<name>`, the node's busybox as its body image, no resource requests.
pub(super) fn example_task(file: &str, namespace: &str, name: &str) -> String {
    let text = std::fs::read_to_string(repo().join("deploy/examples").join(file)).unwrap();
    let mut task: Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(task["kind"], "PeragoTask", "deploy/examples/{file}");
    task["metadata"] = json!({"name": name});
    task["spec"]["taskName"] = json!(format!("{namespace}.{name}"));
    let body = &mut task["spec"]["executor"]["body"];
    body["image"] = json!(BUSYBOX_BODY_IMAGE);
    body["command"] = json!(["sh", "-c", "echo body"]);
    if let Some(body) = body.as_object_mut() {
        body.remove("args");
        body.remove("resources");
    }
    serde_yaml::to_string(&task).unwrap()
}

pub(super) fn kustomizations(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("kustomize.toolkit.fluxcd.io", "v1", "Kustomization");
    Api::namespaced_with(
        client.clone(),
        flux::NAMESPACE,
        &ApiResource::from_gvk(&gvk),
    )
}

pub(super) fn tasks(client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("perago.io", "v1alpha1", "PeragoTask");
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
}

/// The object's condition `kind`, if it is for the object's current generation.
pub(super) fn condition<'a>(object: &'a DynamicObject, kind: &str) -> Option<&'a Value> {
    let generation = object.metadata.generation;
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .filter(|c| {
            c["observedGeneration"]
                .as_i64()
                .is_none_or(|g| Some(g) == generation)
        })
}

/// A task's conditions in a few words: `Ready=False (RollingOut), Reconciling=True, ...`.
fn conditions(task: Option<&DynamicObject>) -> String {
    let Some(task) = task else {
        return "absent".into();
    };
    match task.data["status"]["conditions"].as_array() {
        None => "no conditions".into(),
        Some(conditions) => conditions
            .iter()
            .map(|c| {
                let reason = c["reason"].as_str().unwrap_or_default();
                format!(
                    "{}={} ({reason})",
                    c["type"].as_str().unwrap_or_default(),
                    c["status"].as_str().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn is_ready(object: &DynamicObject) -> bool {
    condition(object, "Ready").is_some_and(|c| c["status"] == "True")
}

/// Whether the Kustomization is Ready with `commit` applied, for its current spec.
pub(super) fn applied(kustomization: &DynamicObject, commit: &str) -> bool {
    let status = &kustomization.data["status"];
    is_ready(kustomization)
        && status["observedGeneration"].as_i64() == kustomization.metadata.generation
        && status["lastAppliedRevision"]
            .as_str()
            .is_some_and(|r| r.ends_with(commit))
}

/// A GitRepository of `repository` and a Kustomization of its `./tasks` into `namespace`,
/// with `wait` and `prune`, and `health_checks` when given.
pub(super) fn flux_objects(
    name: &str,
    repository: &Repository,
    namespace: &str,
    health_checks: Option<&Value>,
) -> String {
    let mut kustomization = json!({
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1",
        "kind": "Kustomization",
        "metadata": {"name": name, "namespace": flux::NAMESPACE},
        "spec": {
            "interval": "10m",
            "sourceRef": {"kind": "GitRepository", "name": name},
            "path": "./tasks",
            "targetNamespace": namespace,
            "prune": true,
            "wait": true,
            "timeout": "3m",
        },
    });
    if let Some(checks) = health_checks {
        kustomization["spec"]["healthCheckExprs"] = checks.clone();
    }
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": "GitRepository",
            "metadata": {"name": name, "namespace": flux::NAMESPACE},
            // Long: each commit is followed by a reconcile request, as `flux reconcile` makes.
            "spec": {"url": repository.url, "ref": {"branch": "main"}, "interval": "10m"},
        },
        kustomization,
    ]})
    .to_string()
}

/// Ask source-controller to fetch the GitRepository `name` now (what `flux reconcile source
/// git` does); kustomize-controller follows the new revision.
pub(super) fn request_reconcile(cluster: &Cluster, name: &str) {
    let stamp = format!(
        "reconcile.fluxcd.io/requestedAt={}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    cluster
        .kubectl(&[
            "annotate",
            "--overwrite",
            "-n",
            flux::NAMESPACE,
            &format!("gitrepository/{name}"),
            &stamp,
        ])
        .unwrap();
}

/// What was seen, polling every 200 ms from `started`: when the Kustomization was first Ready
/// with `commit` applied, and when each task was first Ready.
pub(super) struct Seen {
    started: Instant,
    pub(super) flux_ready: Option<Instant>,
    pub(super) tasks_ready: BTreeMap<String, Instant>,
    /// The tasks that were not Ready when the Kustomization was first seen Ready (read right
    /// after it), each with the conditions it had then.
    pub(super) not_ready_at_flux_ready: Vec<(String, String)>,
}

impl Seen {
    pub(super) fn after(&self, at: Option<Instant>) -> Option<f64> {
        at.map(|t| t.duration_since(self.started).as_secs_f64())
    }
}

/// Poll the Kustomization `name` and the tasks `names` until `until` holds of what was seen or
/// `limit` passes.
pub(super) async fn watch(
    setup: &Scenario,
    name: &str,
    commit: &str,
    namespace: &str,
    names: &[&str],
    limit: Duration,
    until: impl Fn(&Seen) -> bool,
) -> Seen {
    let (kustomizations, tasks) = (
        kustomizations(&setup.client),
        tasks(&setup.client, namespace),
    );
    let mut seen = Seen {
        started: Instant::now(),
        flux_ready: None,
        tasks_ready: BTreeMap::new(),
        not_ready_at_flux_ready: Vec::new(),
    };
    while seen.started.elapsed() < limit && !until(&seen) {
        let ks = kustomizations.get(name).await.unwrap();
        let now = Instant::now();
        let first = seen.flux_ready.is_none() && applied(&ks, commit);
        if first {
            seen.flux_ready = Some(now);
        }
        for task in names {
            let object = tasks.get_opt(task).await.unwrap();
            if object.as_ref().is_some_and(is_ready) {
                seen.tasks_ready.entry((*task).to_owned()).or_insert(now);
            } else if first {
                seen.not_ready_at_flux_ready
                    .push(((*task).to_owned(), conditions(object.as_ref())));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    seen
}

pub(super) fn describe(setup: &Scenario, name: &str, namespace: &str) -> String {
    let get = |args: &[&str]| {
        setup
            .cluster
            .kubectl(args)
            .unwrap_or_else(|e| format!("{e:#}"))
    };
    format!(
        "--- the Kustomization:\n{}\n--- the GitRepository:\n{}\n--- the tasks:\n{}\n--- pods:\n{}",
        get(&[
            "get",
            "-n",
            flux::NAMESPACE,
            "kustomization",
            name,
            "-o",
            "yaml"
        ]),
        get(&[
            "get",
            "-n",
            flux::NAMESPACE,
            "gitrepository",
            name,
            "-o",
            "yaml"
        ]),
        get(&["get", "-n", namespace, "peragotasks", "-o", "wide"]),
        get(&["get", "-n", namespace, "pods", "-o", "wide"]),
    )
}

pub(super) fn scale_operator(cluster: &Cluster, replicas: u32) -> anyhow::Result<()> {
    cluster.kubectl(&[
        "scale",
        "-n",
        OPERATOR_NAMESPACE,
        &format!("deployment/{OPERATOR_DEPLOYMENT}"),
        &format!("--replicas={replicas}"),
    ])?;
    if replicas == 0 {
        cluster.kubectl(&[
            "wait",
            "-n",
            OPERATOR_NAMESPACE,
            "--for=delete",
            "pod",
            "-l",
            "app.kubernetes.io/name=perago-operator",
            "--timeout=120s",
        ])?;
    }
    Ok(())
}

fn set_failure_policy(cluster: &Cluster, policy: &str) -> anyhow::Result<()> {
    let patch = json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": policy}]);
    cluster.kubectl(&[
        "patch",
        "validatingwebhookconfiguration",
        WEBHOOK_CONFIGURATION,
        "--type=json",
        "-p",
        &patch.to_string(),
    ])?;
    Ok(())
}

/// The operator as the race may stop it: while this lives the webhook's `failurePolicy` is
/// `Ignore`; dropped, also when the test fails, it puts back the replicas and the policy the
/// operator was installed with and waits until the webhook answers, as the other tests expect.
pub(super) struct OperatorHeld {
    cluster: &'static Cluster,
    /// The Deployment's replicas as installed.
    pub(super) replicas: u32,
    policy: String,
}

impl OperatorHeld {
    pub(super) fn take(cluster: &'static Cluster) -> Self {
        let replicas = cluster
            .kubectl(&[
                "get",
                "-n",
                OPERATOR_NAMESPACE,
                &format!("deployment/{OPERATOR_DEPLOYMENT}"),
                "-o",
                "jsonpath={.spec.replicas}",
            ])
            .unwrap();
        let policy = cluster
            .kubectl(&[
                "get",
                "validatingwebhookconfiguration",
                WEBHOOK_CONFIGURATION,
                "-o",
                "jsonpath={.webhooks[0].failurePolicy}",
            ])
            .unwrap();
        set_failure_policy(cluster, "Ignore").unwrap();
        Self {
            cluster,
            replicas: replicas.trim().parse().unwrap(),
            policy: policy.trim().to_owned(),
        }
    }

    fn restore(&self) -> anyhow::Result<()> {
        scale_operator(self.cluster, self.replicas)?;
        self.cluster.kubectl(&[
            "rollout",
            "status",
            "-n",
            OPERATOR_NAMESPACE,
            &format!("deployment/{OPERATOR_DEPLOYMENT}"),
            "--timeout=180s",
        ])?;
        set_failure_policy(self.cluster, &self.policy)?;
        self.cluster.wait_for_webhook()
    }
}

impl Drop for OperatorHeld {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            let said = format!(
                "the operator was not put back as installed ({} replicas, failurePolicy {}): {e:#}",
                self.replicas, self.policy
            );
            if std::thread::panicking() {
                eprintln!("{said}");
            } else {
                panic!("{said}");
            }
        }
    }
}

/// The example tasks through Git: Ready only once every task is; a task removed from Git is
/// pruned, the others stay.
#[tokio::test]
async fn a_kustomization_waits_for_every_task_and_prunes_one_removed_from_git() {
    let Some(scenario) =
        setup("a_kustomization_waits_for_every_task_and_prunes_one_removed_from_git").await
    else {
        return;
    };
    let setup = &scenario;
    let (name, namespace) = ("examples", "gitops-examples");
    let (_cleanup, repository) = setup.repository(name, namespace);
    let examples = [
        ("workspace-task.yaml", "features-build"),
        ("read-only-task.yaml", "features-validate"),
        ("workspace-free-task.yaml", "notify-owner"),
    ];
    // The task removed later deletes its TaskDef; the others keep theirs (the default).
    let (removed_file, removed) = examples[1];
    for (file, task) in examples {
        let mut manifest: Value =
            serde_yaml::from_str(&example_task(file, namespace, task)).unwrap();
        if task == removed {
            manifest["spec"]["deletionPolicy"] = json!("Delete");
        }
        repository
            .write(
                &format!("tasks/{file}"),
                &serde_yaml::to_string(&manifest).unwrap(),
            )
            .unwrap();
    }
    // A task suspended in Git is a desired state reached, not one to wait for.
    let suspended = "notify-paused";
    let mut paused: Value = serde_yaml::from_str(&example_task(
        "workspace-free-task.yaml",
        namespace,
        suspended,
    ))
    .unwrap();
    paused["spec"]["suspend"] = json!(true);
    repository
        .write(
            "tasks/suspended-task.yaml",
            &serde_yaml::to_string(&paused).unwrap(),
        )
        .unwrap();
    let commit = repository.commit("The example tasks").unwrap();
    setup
        .cluster
        .apply(&flux_objects(
            name,
            &repository,
            namespace,
            Some(&shipped_health_checks()),
        ))
        .unwrap();
    let names: Vec<&str> = examples.iter().map(|(_, task)| *task).collect();
    let seen = watch(
        setup,
        name,
        &commit,
        namespace,
        &names,
        Duration::from_secs(240),
        |seen| seen.flux_ready.is_some(),
    )
    .await;
    let Some(flux_ready) = seen.flux_ready else {
        panic!(
            "the Kustomization was not Ready with {commit} after 240 s\n{}",
            describe(setup, name, namespace)
        );
    };
    assert!(
        seen.not_ready_at_flux_ready.is_empty(),
        "Flux reported the Kustomization Ready while {:?} were not\n{}",
        seen.not_ready_at_flux_ready,
        describe(setup, name, namespace)
    );
    let paused = tasks(&setup.client, namespace)
        .get(suspended)
        .await
        .unwrap();
    let ready = condition(&paused, "Ready");
    assert_eq!(
        ready.and_then(|c| c["reason"].as_str()),
        Some("Suspended"),
        "{suspended}: {ready:?}"
    );
    let last_task = seen.tasks_ready.values().max().copied();
    eprintln!(
        "examples: Kustomization Ready {:.1} s after it was applied; the last of {} tasks Ready at {:.1} s",
        seen.after(Some(flux_ready)).unwrap(),
        names.len(),
        seen.after(last_task).unwrap_or(f64::NAN),
    );

    // The read-only task (deletionPolicy Delete) and the suspended one (Retain) removed from
    // Git: pruned, their pods drained and their TaskDefs deleted or kept as their policies
    // say; the others kept.
    let conductor = ConductorApi::new(&shared(Selection::ALL).await.conductor().api_url);
    let taskdef = |task: &str| format!("/metadata/taskdefs/{namespace}.{task}");
    assert!(
        !pods_of(setup, namespace, removed).trim().is_empty(),
        "{removed} has no pods"
    );
    repository.remove(&format!("tasks/{removed_file}")).unwrap();
    repository.remove("tasks/suspended-task.yaml").unwrap();
    let commit = repository
        .commit("Remove the read-only and the suspended task")
        .unwrap();
    let started = Instant::now();
    request_reconcile(setup.cluster, name);
    let kept: Vec<&str> = names.iter().copied().filter(|n| *n != removed).collect();
    let seen = watch(
        setup,
        name,
        &commit,
        namespace,
        &kept,
        Duration::from_secs(120),
        |seen| seen.flux_ready.is_some(),
    )
    .await;
    assert!(
        seen.flux_ready.is_some(),
        "the Kustomization was not Ready with {commit} after 120 s\n{}",
        describe(setup, name, namespace)
    );
    let tasks = tasks(&setup.client, namespace);
    loop {
        let gone = tasks.get_opt(removed).await.unwrap().is_none()
            && tasks.get_opt(suspended).await.unwrap().is_none();
        if gone && pods_of(setup, namespace, removed).trim().is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{removed} and {suspended} were not pruned and drained 60 s after their removal \
             from Git\n{}",
            describe(setup, name, namespace)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "prune: {removed} and {suspended} gone, pods drained, {:.1?} after the commit that \
         removed them",
        started.elapsed()
    );
    let deleted = conductor.status_of(&taskdef(removed)).await;
    assert_eq!(
        deleted, 404,
        "{removed} (deletionPolicy Delete): its TaskDef is still there"
    );
    let retained = conductor.status_of(&taskdef(suspended)).await;
    assert_eq!(retained, 200, "{suspended} (Retain): its TaskDef is gone");
    for task in kept {
        let task = tasks.get(task).await.unwrap();
        assert!(
            is_ready(&task),
            "{:?} is not Ready after the prune",
            task.metadata.name
        );
    }
}

/// Commits of one bad task at a time to a Kustomization's repository.
struct BadCommits<'a> {
    setup: &'a Scenario,
    repository: &'a Repository,
    /// The GitRepository's and the Kustomization's.
    name: &'a str,
    namespace: &'a str,
}

impl BadCommits<'_> {
    /// Commit `task` as `tasks/<file>.yaml` (in place of the bad task `previous`, if any) with
    /// `message`, and wait for the Kustomization to fail on that commit: the reason and message
    /// of its `Ready=False`, and how long after the reconcile request.
    async fn commit(
        &self,
        previous: Option<&str>,
        file: &str,
        task: &Value,
        message: &str,
    ) -> (String, String, Duration) {
        if let Some(previous) = previous {
            self.repository
                .remove(&format!("tasks/{previous}.yaml"))
                .unwrap();
        }
        self.repository
            .write(
                &format!("tasks/{file}.yaml"),
                &serde_yaml::to_string(task).unwrap(),
            )
            .unwrap();
        let commit = self.repository.commit(message).unwrap();
        let started = Instant::now();
        request_reconcile(self.setup.cluster, self.name);
        let kustomizations = kustomizations(&self.setup.client);
        loop {
            let ks = kustomizations.get(self.name).await.unwrap();
            let attempted = ks.data["status"]["lastAttemptedRevision"]
                .as_str()
                .is_some_and(|r| r.ends_with(&commit));
            if let Some(ready) = condition(&ks, "Ready").filter(|c| c["status"] == "False")
                && attempted
            {
                let text = |key: &str| ready[key].as_str().unwrap_or_default().to_owned();
                let (reason, said) = (text("reason"), text("message"));
                let took = started.elapsed();
                eprintln!(
                    "{message}: the Kustomization {reason} {took:.1?} after the commit: {said}"
                );
                return (reason, said, took);
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the Kustomization did not fail on {commit} ({message}) within 120 s\n{}",
                describe(self.setup, self.name, self.namespace)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The running task's pods as `name uid restarts`, to show a failed commit left them alone.
fn pods_of(setup: &Scenario, namespace: &str, task: &str) -> String {
    setup
        .cluster
        .kubectl(&[
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            &format!("perago.io/task={task}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.status.containerStatuses[*].restartCount}{\"\\n\"}{end}",
        ])
        .unwrap()
}

/// Run one step of the workspace-free task `task` to completion.
async fn notify_once(task: &str, case: &str) {
    let services = shared(Selection::ALL).await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let id = conductor
        .start(
            task,
            case,
            json!({"params": {"owner": "data-platform", "message": "published"}}),
        )
        .await;
    let done = conductor.finished(&id).await;
    assert_eq!(done["status"], "COMPLETED", "{task} {case}: {done}");
    assert_eq!(
        done["tasks"][0]["outputData"]["result"]["delivered"], true,
        "{task} {case}: {done}"
    );
}

/// Bad commits on top of a running task, each reported by Flux in its own words and none
/// touching the running task: an image that cannot be pulled (the health check times out
/// naming the task), a sibling whose TaskDef conflicts (Failed at once, naming it), a task the
/// webhook refuses (the apply fails with the webhook's message); then the Git server goes away
/// and the task runs on.
#[tokio::test]
async fn bad_commits_and_a_lost_git_server_leave_the_running_task_alone() {
    let Some(scenario) =
        setup("bad_commits_and_a_lost_git_server_leave_the_running_task_alone").await
    else {
        return;
    };
    let setup = &scenario;
    let (name, namespace) = ("failures", "gitops-failures");
    let (_cleanup, repository) = setup.repository(name, namespace);
    let running = "notify-owner";
    let step = format!("{namespace}.{running}");
    let mut notify: Value = serde_yaml::from_str(&example_task(
        "workspace-free-task.yaml",
        namespace,
        running,
    ))
    .unwrap();
    notify["spec"]["executor"]["body"]["command"] = json!([
        "sh",
        "-c",
        r#"printf '{"delivered": true}' > "$PERAGO_RESULT""#
    ]);
    repository
        .write(
            "tasks/notify.yaml",
            &serde_yaml::to_string(&notify).unwrap(),
        )
        .unwrap();
    let commit = repository.commit("A task that runs").unwrap();
    let checks = shipped_health_checks();
    setup
        .cluster
        .apply(&flux_objects(name, &repository, namespace, Some(&checks)))
        .unwrap();
    let seen = watch(
        setup,
        name,
        &commit,
        namespace,
        &[running],
        Duration::from_secs(180),
        |seen| seen.flux_ready.is_some(),
    )
    .await;
    assert!(
        seen.flux_ready.is_some() && seen.not_ready_at_flux_ready.is_empty(),
        "the Kustomization was not Ready with the running task\n{}",
        describe(setup, name, namespace)
    );
    notify_once(&step, "first").await;
    let pods = pods_of(setup, namespace, running);
    assert!(!pods.trim().is_empty(), "{running} has no pods");
    // Health checks time out within seconds from here, so that a commit that cannot become
    // healthy fails fast enough to test.
    let timeout = Duration::from_secs(20);
    setup
        .cluster
        .kubectl(&[
            "patch",
            "-n",
            flux::NAMESPACE,
            &format!("kustomization/{name}"),
            "--type=merge",
            "-p",
            &json!({"spec": {"timeout": format!("{}s", timeout.as_secs())}}).to_string(),
        ])
        .unwrap();
    let untouched = |after: &str| {
        assert_eq!(
            pods_of(setup, namespace, running),
            pods,
            "{after}: the running task's pods changed\n{}",
            describe(setup, name, namespace)
        );
    };

    // An image that cannot be pulled: the operator says so (Reconciling), Flux times out.
    let mut unpullable: Value = serde_yaml::from_str(&example_task(
        "workspace-free-task.yaml",
        namespace,
        "unpullable",
    ))
    .unwrap();
    unpullable["spec"]["executor"]["body"]["image"] = json!("localhost/perago/absent:e2e");
    let bad = BadCommits {
        setup,
        repository: &repository,
        name,
        namespace,
    };
    let (reason, message, _) = bad
        .commit(
            None,
            "unpullable",
            &unpullable,
            "A task whose image is absent",
        )
        .await;
    // Flux names what it waited for, unless its deadline passed while its client waited for
    // its own rate limiter: then it says only that (seen in a loaded run).
    let named = message.contains("PeragoTask/") && message.contains("unpullable");
    assert!(
        reason == "HealthCheckFailed" && (named || message.contains("context deadline")),
        "{reason}: {message}"
    );
    untouched("an absent image");

    // A sibling of the running task's task type whose TaskDef differs: Stalled, so Failed.
    let mut twin = notify.clone();
    twin["metadata"]["name"] = json!("notify-twin");
    twin["spec"]["controls"] = json!({"retry": {"count": 7}});
    let (reason, message, took) = bad
        .commit(
            Some("unpullable"),
            "twin",
            &twin,
            "A sibling whose TaskDef conflicts",
        )
        .await;
    assert!(
        reason == "HealthCheckFailed"
            && message.contains("notify-twin")
            && message.contains("Failed"),
        "{reason}: {message}"
    );
    assert!(
        took < timeout,
        "Flux waited out its {timeout:?} timeout for a Stalled task ({took:?}): {message}"
    );
    let unpullable_gone = tasks(&setup.client, namespace)
        .get_opt("unpullable")
        .await
        .unwrap()
        .is_none();
    assert!(unpullable_gone, "the task removed from Git was not pruned");
    untouched("a conflicting sibling");

    // A task the webhook refuses: the apply fails, with the webhook's message.
    let mut refused = notify.clone();
    refused["metadata"]["name"] = json!("refused");
    refused["spec"]["taskName"] = json!(format!("{namespace}.refused"));
    refused["spec"]["controls"] = json!({"timeout": {"seconds": 300}});
    let (reason, message, _) = bad
        .commit(
            Some("twin"),
            "refused",
            &refused,
            "A task the webhook refuses",
        )
        .await;
    assert!(
        message.contains("denied the request") && message.contains("responseTimeoutSeconds"),
        "{reason}: {message}"
    );
    untouched("a refused task");

    // Back to the running task alone, then the Git server goes away.
    repository.remove("tasks/refused.yaml").unwrap();
    let commit = repository.commit("The running task alone").unwrap();
    request_reconcile(setup.cluster, name);
    let seen = watch(
        setup,
        name,
        &commit,
        namespace,
        &[running],
        Duration::from_secs(120),
        |seen| seen.flux_ready.is_some(),
    )
    .await;
    assert!(
        seen.flux_ready.is_some(),
        "the Kustomization did not recover\n{}",
        describe(setup, name, namespace)
    );
    for sibling in ["notify-twin", "refused"] {
        let gone = tasks(&setup.client, namespace)
            .get_opt(sibling)
            .await
            .unwrap()
            .is_none();
        assert!(gone, "{sibling} is still there");
    }
    // The other scenarios pull from the same Git server.
    setup.alone_with_git().await;
    setup.flux.git.stop();
    let sources = Api::<DynamicObject>::namespaced_with(
        setup.client.clone(),
        flux::NAMESPACE,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "source.toolkit.fluxcd.io",
            "v1",
            "GitRepository",
        )),
    );
    request_reconcile(setup.cluster, name);
    let started = Instant::now();
    let message = loop {
        let source = sources.get(name).await.unwrap();
        if let Some(ready) = condition(&source, "Ready").filter(|c| c["status"] == "False") {
            break ready["message"].as_str().unwrap_or_default().to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "source-controller did not notice the Git server gone\n{}",
            describe(setup, name, namespace)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "the Git server gone: the GitRepository not Ready {:.1?} after a reconcile request: {message}",
        started.elapsed()
    );
    notify_once(&step, "without-git").await;
    let task = tasks(&setup.client, namespace).get(running).await.unwrap();
    assert!(is_ready(&task), "{}", conditions(Some(&task)));
    untouched("the Git server gone");
    setup.flux.git.resume().await.unwrap();
}
