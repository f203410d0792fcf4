//! Every suite that installs the operator its own way, on the real node, from releases in the
//! node's registry. They share one node: one start (the node, Conductor, lakeFS and the
//! release push) for them all, where each was a binary of its own and paid its own. This file
//! holds the two below and the turn they all take; the others are files of their own under
//! `installs/`.
//!
//! - Upgrading the way docs/install.md#upgrading says: the previous release (an older CRD
//!   without `spec.executor.workVolume`, images of another build) is installed with
//!   `helm install oci://…`, a PeragoTask made under it keeps running, the new CRD is applied
//!   (Helm never upgrades `crds/`), `helm upgrade` rolls the operator to the new images, the
//!   new field is accepted, and `helm test` passes. The new leader takes over right after the
//!   upgrade, with reconciles starting while its watches still list: none may need the
//!   reconcile deadline.
//! - Namespaced mode: two releases in two namespaces of one cluster, each watching its own
//!   task namespace with Roles only, each reconciling and judging only its own PeragoTasks.
//! - `installs/tls.rs`: Conductor and lakeFS behind a private certificate authority, the
//!   operator installed trusting it.
//! - `installs/monitoring.rs`: a real Prometheus and OpenTelemetry Collector on what the
//!   chart's monitors and tracing give, and the HPA example scaling a task.
//! - `installs/quickstart.rs`: docs/quickstart.md run as written, its own install and
//!   uninstall included.
//!
//! Each installs an operator that would see the others' tasks: they take turns. A test holds
//! a [`Turn`] for its whole run and leaves the cluster as it found it: its PeragoTasks deleted
//! while its operator runs (their finalizers), its release uninstalled and the operator's pods
//! gone ([`delete_tasks`], [`uninstall`]), its namespaces deleted (by the turn). The CRD stays,
//! as Helm leaves it; the upgrade test deletes it first.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Instant;

use tokio::sync::{Mutex, MutexGuard};

use perago_e2e::cluster::{Cluster, OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE, RELEASE};
use perago_e2e::node::BUSYBOX_BODY_IMAGE;
use perago_e2e::registry::{Release, publish_with};
use perago_e2e::{Selection, Services, shared};

#[path = "installs/monitoring.rs"]
mod monitoring;
#[path = "installs/quickstart.rs"]
mod quickstart;
#[path = "installs/tls.rs"]
mod tls;

const NAMESPACE: &str = "upgrade";
const PREVIOUS: &str = "0.0.9";

/// One install at a time on the shared node.
static INSTALLS: Mutex<()> = Mutex::const_new(());

/// A test's turn on the node ([`INSTALLS`]), held until the test ends. The test cleans up
/// after itself; the turn then deletes the namespaces the test made (its task namespaces and
/// those it names) and those of the releases it names. It waits until the releases' are gone,
/// since the next test installs in `perago-system` again; the task namespaces go meanwhile, as
/// in `pods` (an executor pod may take its body's run to stop: half a minute in the monitoring
/// suite). Its drop writes how long the test held the node.
///
/// A test that fails before its own cleanup leaves it to the turn (tokio's lock is not
/// poisoned, and the next test would otherwise fail on what this one left: a release of the
/// same name, a terminating namespace, PeragoTasks whose finalizers keep the upgrade test's
/// CRD deletion waiting): its tasks are deleted, their finalizers dropped if no operator takes
/// them off, and its releases uninstalled, best effort, each step's failure written out.
struct Turn {
    _guard: MutexGuard<'static, ()>,
    cluster: Cluster,
    test: &'static str,
    since: Instant,
    /// Helm releases (name, namespace) the test installs.
    releases: Vec<(String, String)>,
    /// Namespaces the test makes other than with `Cluster::task_namespace`.
    namespaces: Vec<String>,
}

impl Turn {
    /// Wait for the node, for the test named `test`.
    async fn take(test: &'static str, services: &'static Services) -> Self {
        let guard = INSTALLS.lock().await;
        Self {
            _guard: guard,
            cluster: Cluster::new(services).unwrap(),
            test,
            since: Instant::now(),
            releases: Vec::new(),
            namespaces: Vec::new(),
        }
    }

    /// The test installs Helm release `name` in `namespace`.
    fn release(&mut self, name: &str, namespace: &str) {
        self.releases.push((name.to_owned(), namespace.to_owned()));
    }

    /// The test makes `namespace` (other than with `Cluster::task_namespace`).
    fn namespace(&mut self, namespace: &str) {
        self.namespaces.push(namespace.to_owned());
    }

    /// Run `kubectl`, writing out a failure instead of panicking (a drop must not).
    fn kubectl(&self, args: &[&str]) -> Option<String> {
        self.cluster
            .kubectl(args)
            .inspect_err(|e| note(&format!("{}: {e:#}", self.test)))
            .ok()
    }

    /// What a failed test left: its tasks deleted while an operator may still take their
    /// finalizers off (else the finalizers dropped), then its releases uninstalled.
    fn clean_up_after_a_failure(&self, namespaces: &[String]) {
        note(&format!(
            "{} failed: deleting its PeragoTasks and uninstalling its releases",
            self.test
        ));
        for namespace in namespaces {
            let deleted = self.cluster.kubectl(&[
                "delete",
                "peragotasks",
                "--all",
                "-n",
                namespace,
                "--wait",
                "--timeout=60s",
            ]);
            if deleted.is_ok() {
                continue;
            }
            let left = self
                .kubectl(&["get", "peragotasks", "-n", namespace, "-o", "name"])
                .unwrap_or_default();
            for task in left.lines().filter(|l| !l.is_empty()) {
                self.kubectl(&[
                    "patch",
                    task,
                    "-n",
                    namespace,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
            }
        }
        for (release, namespace) in &self.releases {
            let installed = self
                .cluster
                .helm(&["status", release, "-n", namespace])
                .is_ok();
            if installed {
                let uninstalled =
                    self.cluster
                        .helm(&["uninstall", release, "-n", namespace, "--wait"]);
                if let Err(e) = uninstalled {
                    note(&format!("{}: {e:#}", self.test));
                }
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut namespaces = perago_e2e::cluster::namespaces_made_here();
        namespaces.extend(self.namespaces.iter().cloned());
        if std::thread::panicking() {
            self.clean_up_after_a_failure(&namespaces);
        }
        let mut operators: Vec<String> = self.releases.iter().map(|(_, n)| n.clone()).collect();
        operators.sort();
        operators.dedup();
        namespaces.retain(|n| !operators.contains(n));
        for namespace in operators.iter().chain(&namespaces) {
            // A namespace already terminating (the quickstart's page deletes its own) answers
            // with a conflict: it is going already.
            let _ = self.cluster.kubectl(&[
                "delete",
                "namespace",
                namespace,
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
        let waited = Instant::now();
        if !operators.is_empty() {
            let mut args = vec!["wait", "--for=delete", "--timeout=180s"];
            let names: Vec<String> = operators.iter().map(|n| format!("namespace/{n}")).collect();
            args.extend(names.iter().map(String::as_str));
            self.kubectl(&args);
        }
        note(&format!(
            "{} held the node {:.1?} (its operator namespaces went in {:.1?})",
            self.test,
            self.since.elapsed(),
            waited.elapsed()
        ));
    }
}

/// A line written past libtest's capture, so that CI's log shows it for a test that passes
/// too: where the binary's time goes, and what a failed test's turn cleaned up.
fn note(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("[installs] {line}\n").as_bytes());
}

fn task(name: &str, work_volume: bool) -> String {
    task_in(NAMESPACE, name, work_volume)
}

fn task_in(namespace: &str, name: &str, work_volume: bool) -> String {
    let volume = if work_volume {
        "\n    workVolume: {emptyDir: {sizeLimit: 64Mi}}"
    } else {
        ""
    };
    format!(
        "apiVersion: perago.io/v1alpha1\nkind: PeragoTask\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
         spec:\n  taskName: {namespace}.{name}\n  ownerEmail: e2e@example.com\n  \
         paramsSchema: {{type: object}}\n  resultSchema: {{type: object}}\n  executor:\n    \
         body: {{image: {BUSYBOX_BODY_IMAGE}, command: [sh, -c, 'printf {{}} > \"$PERAGO_RESULT\"']}}{volume}\n"
    )
}

/// The repository's chart as the previous release had it: its CRD without
/// `spec.executor.workVolume`.
fn previous_chart(dir: &Path) -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/perago-operator");
    let chart = dir.join("previous-chart");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(&source)
        .arg(&chart)
        .status()
        .unwrap();
    assert!(copied.success());
    let crd_path = chart.join("crds/peragotasks.perago.io.yaml");
    let mut crd: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&crd_path).unwrap()).unwrap();
    let executor = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]["executor"]["properties"];
    let removed = executor
        .as_mapping_mut()
        .unwrap()
        .remove("workVolume")
        .is_some();
    assert!(removed, "the CRD has no spec.executor.workVolume to remove");
    std::fs::write(&crd_path, serde_yaml::to_string(&crd).unwrap()).unwrap();
    chart
}

fn deployment_image(cluster: &Cluster) -> String {
    cluster
        .kubectl(&[
            "get",
            "deployment",
            "-n",
            OPERATOR_NAMESPACE,
            OPERATOR_DEPLOYMENT,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
        .unwrap()
}

#[tokio::test]
async fn an_upgrade_applies_the_new_crd_first_and_helm_test_passes_after_it() {
    if perago_e2e::node_opted_out(
        "an_upgrade_applies_the_new_crd_first_and_helm_test_passes_after_it",
    ) {
        return;
    }
    let services = shared(Selection::ALL).await;
    let mut turn = Turn::take(
        "an_upgrade_applies_the_new_crd_first_and_helm_test_passes_after_it",
        services,
    )
    .await;
    turn.release(RELEASE, OPERATOR_NAMESPACE);
    let node = services.node();
    let dir = services.dir().join("upgrade");
    std::fs::create_dir_all(&dir).unwrap();
    let chart = previous_chart(&dir);
    let previous: Release = publish_with(
        &node.registry.prefix(),
        &dir,
        PREVIOUS,
        &[
            ("CHART_DIR", chart.to_str().unwrap()),
            ("SOURCE_DATE_EPOCH", "1"),
        ],
    )
    .unwrap();
    let current = &node.release;
    assert_ne!(previous.operator_image, current.operator_image);

    // The previous release on a cluster without the CRD (an earlier test may have left the
    // current one: Helm would keep it), and a task made under it.
    let cluster = Cluster::new(services).unwrap();
    cluster
        .kubectl(&[
            "delete",
            "crd",
            "peragotasks.perago.io",
            "--ignore-not-found",
            "--wait",
            "--timeout=120s",
        ])
        .unwrap();
    cluster.install_release(&previous, &[]).unwrap();
    assert_eq!(deployment_image(&cluster), previous.operator_image);
    cluster.task_namespace(NAMESPACE).unwrap();
    cluster.apply(&task("before", false)).unwrap();
    ready(&cluster, NAMESPACE, "before");
    let refused = cluster.apply(&task("after", true)).unwrap_err().to_string();
    assert!(
        refused.contains("workVolume"),
        "the previous CRD took spec.executor.workVolume: {refused}"
    );

    // Helm installs `crds/` once and never upgrades them, so the documented step comes first:
    // the new release's CRDs, applied server-side; then `helm upgrade`.
    let upgrade = [
        "upgrade",
        RELEASE,
        &current.chart,
        "--version",
        &current.version,
        "--plain-http",
        "--namespace",
        OPERATOR_NAMESPACE,
        // Not --reuse-values: it keeps the previous chart's defaults, the old image digests.
        "--reset-then-reuse-values",
        "--wait",
        "--timeout",
        "180s",
    ];
    let crds = cluster
        .helm(&[
            "show",
            "crds",
            &current.chart,
            "--version",
            &current.version,
            "--plain-http",
        ])
        .unwrap();
    // Helm installed the CRD and owns its fields: the apply takes them over.
    let crds_file = dir.join("crds.yaml");
    std::fs::write(&crds_file, crds).unwrap();
    cluster
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crds_file.to_str().unwrap(),
        ])
        .unwrap();
    cluster.helm(&upgrade).unwrap();
    assert_eq!(deployment_image(&cluster), current.operator_image);
    cluster.wait_for_webhook().unwrap();

    // The task made before the upgrade is reconciled by the new operator (a changed spec,
    // observed and Ready); the new field is accepted now.
    cluster
        .apply(&task("before", false).replace("e2e@example.com", "owner@example.com"))
        .unwrap();
    let observed = cluster.kubectl(&[
        "wait",
        "-n",
        NAMESPACE,
        "--for=jsonpath={.status.observedGeneration}=2",
        "peragotask/before",
        "--timeout=150s",
    ]);
    if let Err(e) = observed {
        panic!(
            "before was not reconciled: {e:#}\n{}",
            explain(&cluster, NAMESPACE)
        );
    }
    ready(&cluster, NAMESPACE, "before");
    cluster.apply(&task("after", true)).unwrap();
    ready(&cluster, NAMESPACE, "after");
    // A reconcile cut at its deadline is retried, and the above would pass anyway: the new
    // leader's first reconciles must end on their own (they once waited for good on the owned
    // watches' readiness, operator/src/scope.rs).
    let logs = cluster.operator_logs().unwrap_or_default();
    assert!(
        !logs.contains("did not end within"),
        "a reconcile was cut at its deadline after the handover:\n{logs}"
    );

    // `helm test`: the release checks itself from inside the cluster.
    let tested = cluster
        .helm(&[
            "test",
            RELEASE,
            "--namespace",
            OPERATOR_NAMESPACE,
            "--logs",
            "--timeout",
            "180s",
        ])
        .unwrap();
    for check in [
        "ok: the PeragoTask API is served",
        "ok: the operator answers /readyz",
        "ok: the admission webhook refuses an invalid PeragoTask",
    ] {
        assert!(
            tested.contains(check),
            "helm test printed no {check:?}:\n{tested}"
        );
    }
    assert!(tested.contains("Succeeded"), "{tested}");

    // Leave the cluster as found: the tasks go while their operator runs (finalizers), then
    // the release.
    delete_tasks(&cluster, NAMESPACE);
    uninstall(&cluster, RELEASE, OPERATOR_NAMESPACE);
}

/// `helm uninstall --wait`, then wait until the operator's pods are gone too: Helm waits for
/// the Deployment, not for its pods, and a terminating cluster-wide operator keeps its open
/// watches after its RBAC is removed. The next test's tasks would otherwise be reconciled by
/// it (their TaskDef registered, but its event refused) before their own operator sees them.
fn uninstall(cluster: &Cluster, release: &str, namespace: &str) {
    let started = Instant::now();
    cluster
        .helm(&["uninstall", release, "-n", namespace, "--wait"])
        .unwrap();
    cluster
        .kubectl(&[
            "wait",
            "--for=delete",
            "pod",
            "-n",
            namespace,
            "-l",
            // The Deployment's pods, not `helm test`'s (kept until its next run).
            "app.kubernetes.io/name=perago-operator,pod-template-hash",
            "--timeout=120s",
        ])
        .unwrap();
    eprintln!(
        "uninstalled {release} and its operator's pods went in {:.1?}",
        started.elapsed()
    );
}

/// Wait until `namespace/name` is Ready; on a timeout, the task and the operators' logs say why.
fn ready(cluster: &Cluster, namespace: &str, name: &str) {
    if let Err(e) = cluster.wait_ready(namespace, name) {
        panic!(
            "{namespace}/{name} is not Ready: {e:#}\n{}",
            explain(cluster, namespace)
        );
    }
}

/// The PeragoTasks of `namespace` and the last lines of every operator's log.
fn explain(cluster: &Cluster, namespace: &str) -> String {
    let tasks = cluster
        .kubectl(&["get", "peragotasks", "-n", namespace, "-o", "yaml"])
        .unwrap_or_default();
    let pods = cluster
        .kubectl(&["get", "pods", "-A", "-o", "wide"])
        .unwrap_or_default();
    let mut logs = cluster.operator_logs().unwrap_or_default();
    for team in ["team-a", "team-b"] {
        logs += &cluster
            .kubectl(&[
                "logs",
                "-n",
                team,
                "-l",
                "app.kubernetes.io/name=perago-operator",
                "--tail=80",
                "--prefix",
            ])
            .unwrap_or_default();
    }
    format!("{tasks}\n{pods}\n{logs}")
}

/// Delete every PeragoTask of `namespace` and wait until they are gone (their operator removes
/// its finalizer); on a timeout, the tasks and the operators' logs say why.
fn delete_tasks(cluster: &Cluster, namespace: &str) {
    let started = Instant::now();
    let deleted = cluster.kubectl(&[
        "delete",
        "peragotasks",
        "--all",
        "-n",
        namespace,
        "--wait",
        "--timeout=120s",
    ]);
    if let Err(e) = deleted {
        panic!(
            "deleting the tasks of {namespace}: {e:#}\n{}",
            explain(cluster, namespace)
        );
    }
    eprintln!(
        "the PeragoTasks of {namespace} went in {:.1?}",
        started.elapsed()
    );
}

/// The `reportingInstance` of the `TaskDefRegistered` event of `namespace/name`: the operator
/// pod that reconciled it.
fn registered_by(cluster: &Cluster, namespace: &str, name: &str) -> String {
    let events: serde_json::Value = serde_json::from_str(
        &cluster
            .kubectl(&["get", "events.events.k8s.io", "-n", namespace, "-o", "json"])
            .unwrap(),
    )
    .unwrap();
    events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["regarding"]["name"] == name && e["reason"] == "TaskDefRegistered")
        .and_then(|e| e["reportingInstance"].as_str())
        .unwrap_or_else(|| panic!("{namespace}/{name} has no TaskDefRegistered event: {events}"))
        .to_owned()
}

#[tokio::test]
async fn two_namespaced_releases_each_manage_only_their_own_namespace() {
    if perago_e2e::node_opted_out("two_namespaced_releases_each_manage_only_their_own_namespace") {
        return;
    }
    let services = shared(Selection::ALL).await;
    let mut turn = Turn::take(
        "two_namespaced_releases_each_manage_only_their_own_namespace",
        services,
    )
    .await;
    let release = &services.node().release;
    let cluster = Cluster::new(services).unwrap();
    let teams = [("team-a", "tasks-a"), ("team-b", "tasks-b")];
    for (team, _) in teams {
        turn.release(team, team);
    }
    for (team, tasks) in teams {
        cluster.task_namespace(tasks).unwrap();
        let watch = format!("watchNamespaces={{{tasks}}}");
        cluster
            .install_as(
                team,
                team,
                release,
                &["--set", &watch, "--set", "replicas=1"],
            )
            .unwrap();
    }
    cluster.task_namespace("tasks-c").unwrap();
    for (_, tasks) in teams {
        cluster.apply(&task_in(tasks, "job", false)).unwrap();
    }
    cluster.apply(&task_in("tasks-c", "job", false)).unwrap();
    for (team, tasks) in teams {
        ready(&cluster, tasks, "job");
        let pods = cluster
            .kubectl(&[
                "get",
                "pods",
                "-n",
                team,
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ])
            .unwrap();
        let reconciler = registered_by(&cluster, tasks, "job");
        assert!(
            pods.split(' ').any(|p| p == reconciler),
            "{tasks}/job was registered by {reconciler}, not by {team}'s operator ({pods})"
        );
        // Each operator holds Roles in its own task namespace only.
        let account = format!("--as=system:serviceaccount:{team}:perago-operator");
        let own = cluster
            .kubectl(&[
                "auth",
                "can-i",
                "list",
                "peragotasks",
                "-n",
                tasks,
                &account,
            ])
            .unwrap();
        assert_eq!(own.trim(), "yes");
        for other in ["tasks-a", "tasks-b", "tasks-c"]
            .iter()
            .filter(|n| **n != tasks)
        {
            let denied = cluster.kubectl(&[
                "auth",
                "can-i",
                "list",
                "peragotasks",
                "-n",
                other,
                &account,
            ]);
            assert!(denied.is_err(), "{team} may list PeragoTasks in {other}");
        }
    }
    // Nobody watches tasks-c: its task gets no status, and no webhook judges it there, while
    // team-a's refuses the same invalid task in tasks-a.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let status = cluster
        .kubectl(&[
            "get",
            "peragotask",
            "-n",
            "tasks-c",
            "job",
            "-o",
            "jsonpath={.status}",
        ])
        .unwrap();
    assert_eq!(
        status, "",
        "a task in an unwatched namespace was reconciled"
    );
    let invalid = |namespace: &str| {
        task_in(namespace, "bad", false).replace(
            "paramsSchema: {type: object}",
            "paramsSchema: {type: object, properties: {x: {type: no-such-type}}}",
        )
    };
    let path = services.dir().join("invalid-task.yaml");
    std::fs::write(&path, invalid("tasks-c")).unwrap();
    cluster
        .kubectl(&["apply", "--dry-run=server", "-f", path.to_str().unwrap()])
        .unwrap();
    std::fs::write(&path, invalid("tasks-a")).unwrap();
    let refused = cluster
        .kubectl(&["apply", "--dry-run=server", "-f", path.to_str().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(refused.contains("not a valid JSON Schema"), "{refused}");

    for (team, tasks) in teams {
        delete_tasks(&cluster, tasks);
        uninstall(&cluster, team, team);
    }
    // Never reconciled, so no finalizer: it goes at once (the quickstart's test finds no
    // PeragoTask of another test).
    delete_tasks(&cluster, "tasks-c");
}
