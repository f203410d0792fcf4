//! The validating admission webhook on a real cluster, the operator installed by Helm. The
//! binary holds two tests:
//!
//! - `the_webhook_refuses_what_the_check_refuses` (here): every bad declaration of the offline
//!   check refused at `kubectl apply` (by the webhook with the check's message, or earlier by
//!   the CRD's own schema), warnings printed, a server-side dry run refused the same way, the
//!   certificate renewed under the same authority, the failure policy while no replica serves,
//!   and objects stored before the webhook existed still reconciled to Stalled.
//! - `cert_manager::with_cert_manager_the_webhook_serves_the_certificate_cert_manager_issued`
//!   (`admission/cert_manager.rs`): the webhook serving the certificate a real cert-manager
//!   issued, its injector writing the `caBundle`.
//!
//! They share one node start, where each was a binary with a start of its own. Both install the
//! operator as the release `perago` in `perago-system`, so they take turns: a test holds a
//! [`Turn`] for its whole run and leaves the cluster as it found it ([`Turn::leave`]): its
//! PeragoTasks deleted while its operator runs (their finalizers), its release uninstalled and
//! the operator's pods gone, the host processes it started stopped, its namespaces deleted
//! (`perago-system` too: the webhook's Secret and the leader's Lease are not the release's),
//! and the cluster-wide objects it applied (cert-manager's CRDs) deleted. The PeragoTask CRD
//! stays, as Helm leaves it; both install the same.

#![allow(clippy::unwrap_used)]

mod cases;

#[path = "admission/cert_manager.rs"]
mod cert_manager;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use perago_e2e::cluster::{Cluster, OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE, RELEASE};
use perago_e2e::process::ServerProcess;
use perago_e2e::{Selection, Services, shared};
use serde_yaml::Value;
use tokio::sync::{Mutex, MutexGuard};

/// One operator release at a time on the node.
static INSTALLS: Mutex<()> = Mutex::const_new(());

/// A test's turn on the node ([`INSTALLS`]), held until the test ends. The test ends it with
/// [`Turn::leave`]; a test that fails before that leaves the clean-up to the turn's drop, best
/// effort, each failed step written out (tokio's lock is not poisoned, and the next test's
/// `helm install` would fail on the release left behind). Its drop writes how long the test
/// held the node.
struct Turn {
    _guard: MutexGuard<'static, ()>,
    cluster: Cluster,
    test: &'static str,
    since: Instant,
    /// The task namespaces the test made (`Cluster::task_namespace`).
    tasks: Vec<String>,
    /// Host processes the test started, stopped once its release is gone.
    processes: Vec<ServerProcess>,
    /// Namespaces the test made other than with `Cluster::task_namespace`.
    namespaces: Vec<String>,
    /// Manifests of the cluster-wide objects the test applied, deleted last.
    manifests: Vec<PathBuf>,
    /// How long [`Turn::leave`] took, once it cleaned up.
    left: Option<Duration>,
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
            tasks: Vec::new(),
            processes: Vec::new(),
            namespaces: Vec::new(),
            manifests: Vec::new(),
            left: None,
        }
    }

    /// Leave the cluster as the test found it; a step that fails fails the test.
    fn leave(&mut self) {
        let started = Instant::now();
        self.clean_up(true);
        self.left = Some(started.elapsed());
    }

    /// A step that failed: the test's (`strict`), or written out by a drop that must not panic.
    fn failed(&self, strict: bool, what: &str) {
        if strict {
            panic!("leaving the cluster as found: {what}");
        }
        note(&format!("{}: {what}", self.test));
    }

    fn clean_up(&mut self, strict: bool) {
        self.tasks
            .extend(perago_e2e::cluster::namespaces_made_here());
        // The tasks first, while their operator runs to take its finalizers off.
        for namespace in &self.tasks {
            let timeout = if strict {
                "--timeout=120s"
            } else {
                "--timeout=60s"
            };
            let args = [
                "delete",
                "peragotasks",
                "--all",
                "-n",
                namespace,
                "--wait",
                timeout,
            ];
            let Err(e) = self.cluster.kubectl(&args) else {
                continue;
            };
            if strict {
                let tasks = self
                    .cluster
                    .kubectl(&["get", "peragotasks", "-n", namespace, "-o", "yaml"])
                    .unwrap_or_default();
                let logs = self.cluster.operator_logs().unwrap_or_default();
                self.failed(strict, &format!("{e:#}\n{tasks}\n{logs}"));
            }
            // No operator took them off (a test that failed with it scaled to zero): dropped.
            note(&format!(
                "{}: {e:#}; dropping the finalizers of what is left",
                self.test
            ));
            let left = self
                .cluster
                .kubectl(&["get", "peragotasks", "-n", namespace, "-o", "name"])
                .unwrap_or_default();
            for task in left.lines().filter(|l| !l.is_empty()) {
                let patched = self.cluster.kubectl(&[
                    "patch",
                    task,
                    "-n",
                    namespace,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
                if let Err(e) = patched {
                    self.failed(strict, &format!("{e:#}"));
                }
            }
        }
        let installed = strict
            || self
                .cluster
                .helm(&["status", RELEASE, "-n", OPERATOR_NAMESPACE])
                .is_ok();
        if installed {
            let uninstalled =
                self.cluster
                    .helm(&["uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait"]);
            if let Err(e) = uninstalled {
                self.failed(strict, &format!("{e:#}"));
            }
        }
        // Its host processes stop (on drop) once the release they serve is gone.
        self.processes.clear();
        let mut namespaces = self.tasks.clone();
        namespaces.extend(self.namespaces.iter().cloned());
        namespaces.push(OPERATOR_NAMESPACE.to_owned());
        for namespace in &namespaces {
            let deleted = self.cluster.kubectl(&[
                "delete",
                "namespace",
                namespace,
                "--ignore-not-found",
                "--wait=false",
            ]);
            if let Err(e) = deleted {
                self.failed(strict, &format!("{e:#}"));
            }
        }
        // Helm waits for the Deployment, not for its pods, and a terminating operator keeps its
        // open watches (as in e2e's `installs`): gone before the next test installs its own.
        // Their preStop's 5 s pass while the namespaces terminate.
        let gone = self.cluster.kubectl(&[
            "wait",
            "--for=delete",
            "pod",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=perago-operator,pod-template-hash",
            "--timeout=120s",
        ]);
        if let Err(e) = gone {
            self.failed(strict, &format!("{e:#}"));
        }
        let names: Vec<String> = namespaces
            .iter()
            .map(|n| format!("namespace/{n}"))
            .collect();
        let mut args = vec!["wait", "--for=delete", "--timeout=180s"];
        args.extend(names.iter().map(String::as_str));
        if let Err(e) = self.cluster.kubectl(&args) {
            self.failed(strict, &format!("{e:#}"));
        }
        for manifest in &self.manifests {
            let deleted = self.cluster.kubectl(&[
                "delete",
                "--ignore-not-found",
                "--wait",
                "--timeout=60s",
                "-f",
                manifest.to_str().unwrap_or_default(),
            ]);
            if let Err(e) = deleted {
                self.failed(strict, &format!("{e:#}"));
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(leaving) = self.left else {
            note(&format!(
                "{} failed: deleting its PeragoTasks, release and namespaces",
                self.test
            ));
            self.clean_up(false);
            note(&format!(
                "{} held the node {:.1?}",
                self.test,
                self.since.elapsed()
            ));
            return;
        };
        note(&format!(
            "{} held the node {:.1?}, {leaving:.1?} of it leaving the cluster as found",
            self.test,
            self.since.elapsed()
        ));
    }
}

/// A line written past libtest's capture, so that the lane's log shows it for a test that
/// passes too: where the binary's time goes, and what a failed test's turn cleaned up.
fn note(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("[admission] {line}\n").as_bytes());
}

const NAMESPACE: &str = "admission";
const DENIED: &str = "admission webhook \"validate.peragotasks.perago.io\" denied the request: ";

/// `doc` in `namespace`, as YAML.
fn manifest_in(namespace: &str, doc: &Value) -> String {
    let mut doc = doc.clone();
    doc["metadata"]["namespace"] = namespace.into();
    serde_yaml::to_string(&doc).unwrap()
}

/// `kubectl apply` of `doc` in this suite's namespace (extra args first).
fn apply(cluster: &Cluster, extra: &[&str], doc: &Value) -> Result<String, String> {
    apply_in(cluster, NAMESPACE, extra, doc)
}

/// `kubectl apply --server-side` of `doc` in `namespace` (extra args first): Ok(stderr) or
/// Err(stderr).
fn apply_in(
    cluster: &Cluster,
    namespace: &str,
    extra: &[&str],
    doc: &Value,
) -> Result<String, String> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), manifest_in(namespace, doc)).unwrap();
    let path = file.path().to_str().unwrap().to_owned();
    let mut args = vec!["apply", "--server-side"];
    args.extend(extra);
    args.extend(["-f", &path]);
    let out = std::process::Command::new(perago_e2e::process::obtain("kubectl").unwrap())
        .args(&args)
        .env("KUBECONFIG", cluster.kubeconfig())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(stderr)
    } else {
        Err(stderr)
    }
}

/// One test: the sections change the operator (scaled to zero) and must not overlap.
#[tokio::test]
async fn the_webhook_refuses_what_the_check_refuses() {
    if perago_e2e::node_opted_out("the_webhook_refuses_what_the_check_refuses") {
        return;
    }
    let services = shared(Selection::ALL).await;
    let mut turn = Turn::take("the_webhook_refuses_what_the_check_refuses", services).await;
    let cluster = Cluster::new(services).unwrap();
    // The certificate looked at every 2 s, so its renewal below is not a minute's wait.
    cluster
        .install_operator(&[
            "--set",
            "extraEnv[0].name=PERAGO_WEBHOOK_CERTIFICATE_CHECK_SECONDS",
            "--set-string",
            "extraEnv[0].value=2",
        ])
        .unwrap();
    cluster.task_namespace(NAMESPACE).unwrap();
    // Both replicas serve, the standby as well as the leader.
    let logs = cluster.operator_logs().unwrap();
    let serving: std::collections::BTreeSet<&str> = logs
        .lines()
        .filter(|l| l.contains("admission webhook serving"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        serving.len(),
        2,
        "replicas serving the webhook: {serving:?}\n{logs}"
    );

    // Every bad declaration is refused: by the webhook with the check's message, or before it
    // by the CRD's schema (types, unknown fields, CEL rules, names).
    let mut by_webhook = Vec::new();
    let mut by_schema = Vec::new();
    // Eight at a time: each is two kubectl processes, and one after another they took most of
    // this test's minute on a loaded machine. None is stored, so they cannot meet.
    let cases = cases::bad_declarations();
    let refusals: Vec<(&str, &str, String, String)> = std::thread::scope(|scope| {
        let cluster = &cluster;
        let workers: Vec<_> = cases
            .chunks(cases.len().div_ceil(8))
            .map(|chunk| {
                scope.spawn(move || {
                    let refuse = |(path, value, expected): &(&'static str, Value, &'static str)| {
                        let mut doc = cases::base();
                        cases::set(&mut doc, path, value.clone());
                        // A server-side dry run (what Argo CD and Flux run before syncing) is
                        // refused alike.
                        let dry = apply(cluster, &["--dry-run=server"], &doc).expect_err(path);
                        let refused = apply(cluster, &[], &doc).expect_err(path);
                        (*path, *expected, dry, refused)
                    };
                    chunk.iter().map(refuse).collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    for (path, expected, dry, refused) in refusals {
        assert_eq!(
            dry.contains(DENIED),
            refused.contains(DENIED),
            "{path}: {dry} / {refused}"
        );
        if refused.contains(DENIED) {
            assert!(
                refused.contains(expected),
                "{path}: the webhook's message is not the check's {expected:?}: {refused}"
            );
            by_webhook.push(path);
        } else {
            by_schema.push(format!("{path}: {}", refused.trim()));
        }
    }
    eprintln!(
        "refused by the webhook with the check's message: {}; by the CRD schema first: {}",
        by_webhook.len(),
        by_schema.len()
    );
    for line in &by_schema {
        eprintln!("  schema: {line}");
    }
    assert!(
        by_webhook.len() >= 20,
        "only {by_webhook:?} reached the webhook"
    );

    // A valid task with warnings is stored and the warnings are printed.
    let mut doc = cases::base();
    cases::set(&mut doc, "metadata.name", "warned".into());
    cases::set(&mut doc, "spec.taskName", "admission.warned".into());
    cases::set(&mut doc, "spec.workspace.readOnly", true.into());
    let printed = apply(&cluster, &[], &doc).unwrap();
    assert!(
        printed.contains("Warning: WorkspaceSpec(read_only=True) disables workspace publication"),
        "{printed}"
    );

    // Renewal: a certificate due for renewal is replaced within a minute, under the same
    // authority, and the webhook keeps answering.
    let get = |args: &[&str]| cluster.kubectl(args).unwrap();
    let secret = [
        "get",
        "secret",
        "-n",
        OPERATOR_NAMESPACE,
        "perago-operator-webhook-tls",
    ];
    let cert_of = || get(&[&secret[..], &["-o", "jsonpath={.data.tls\\.crt}"]].concat());
    let bundle_of = || {
        get(&[
            "get",
            "validatingwebhookconfiguration",
            "perago-operator",
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ])
    };
    let (cert, bundle) = (cert_of(), bundle_of());
    assert!(!bundle.is_empty(), "the operator wrote no caBundle");
    get(&[
        "annotate",
        "secret",
        "-n",
        OPERATOR_NAMESPACE,
        "perago-operator-webhook-tls",
        "perago.io/not-after=0",
        "--overwrite",
    ]);
    let due = Instant::now();
    while cert_of() == cert {
        assert!(
            due.elapsed() < Duration::from_secs(90),
            "the certificate was not renewed"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "webhook certificate renewed {:.0?} after it fell due",
        due.elapsed()
    );
    assert_eq!(bundle_of(), bundle, "renewal changed the caBundle");
    let mut renewed = cases::base();
    cases::set(&mut renewed, "metadata.name", "after-renewal".into());
    cases::set(&mut renewed, "spec.taskName", "admission.renewed".into());
    cases::set(
        &mut renewed,
        "spec.controls.timeout",
        cases::yaml("{seconds: 300}"),
    );
    let refused = apply(&cluster, &[], &renewed).expect_err("an invalid task after renewal");
    assert!(
        refused.contains(DENIED) && refused.contains("responseTimeoutSeconds (600)"),
        "{refused}"
    );

    // Stored before the webhook existed: the operator still reconciles it to Stalled (its
    // finalizer update keeps the spec, so the webhook lets it through), and it can be deleted.
    let mut old = cases::base();
    cases::set(&mut old, "metadata.name", "from-before".into());
    cases::set(&mut old, "spec.taskName", "admission.before".into());
    cases::set(&mut old, "spec.controls.retry.count", 7.into());
    cases::set(&mut old, "spec.workspace.pre.0.path", "../outside".into());
    cluster
        .apply_without_webhook(&[manifest_in(NAMESPACE, &old)])
        .unwrap();
    let stalled = cluster.kubectl(&[
        "wait",
        "-n",
        NAMESPACE,
        "--for=condition=Stalled",
        "peragotask/from-before",
        "--timeout=60s",
    ]);
    assert!(stalled.is_ok(), "{stalled:?}");
    cases::set(&mut old, "spec.controls.retry.count", 8.into());
    let refused = apply(&cluster, &[], &old).expect_err("a changed invalid spec");
    assert!(refused.contains(DENIED), "{refused}");
    cluster
        .kubectl(&[
            "delete",
            "-n",
            NAMESPACE,
            "peragotask",
            "from-before",
            "--timeout=60s",
        ])
        .unwrap();

    // A task someone holds with a finalizer of their own, deleted: it stays, being deleted.
    let mut held = cases::base();
    cases::set(&mut held, "metadata.name", "held".into());
    cases::set(&mut held, "spec.taskName", "admission.held".into());
    cases::set(
        &mut held,
        "metadata.finalizers",
        cases::yaml("[example.com/hold]"),
    );
    apply(&cluster, &[], &held).unwrap();
    cluster
        .kubectl(&[
            "delete",
            "-n",
            NAMESPACE,
            "peragotask",
            "held",
            "--wait=false",
        ])
        .unwrap();

    // With no replica serving, the documented failurePolicy (Fail) refuses spec writes.
    cluster
        .kubectl(&[
            "scale",
            "-n",
            OPERATOR_NAMESPACE,
            &format!("deployment/{OPERATOR_DEPLOYMENT}"),
            "--replicas=0",
        ])
        .unwrap();
    let started = Instant::now();
    while !cluster
        .kubectl(&["get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "name"])
        .unwrap()
        .trim()
        .is_empty()
    {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "operator pods still there"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The 5 s preStop, then both replicas stop on SIGTERM, the standby too: not the 30 s grace
    // period's SIGKILL.
    let stopped = started.elapsed();
    assert!(
        stopped < Duration::from_secs(25),
        "the operator's replicas took {stopped:?} to stop"
    );
    eprintln!("both operator replicas gone {stopped:.1?} after the scale to zero");
    let mut valid = cases::base();
    cases::set(&mut valid, "metadata.name", "while-down".into());
    cases::set(&mut valid, "spec.taskName", "admission.down".into());
    let refused = apply(&cluster, &[], &valid).expect_err("applied with no webhook serving");
    assert!(
        refused.contains("failed calling webhook \"validate.peragotasks.perago.io\""),
        "{refused}"
    );
    eprintln!("operator at 0 replicas: {}", refused.trim());
    // What does not write a spec is not sent to the webhook (its matchConditions): a label on
    // a task, and the finalizers of a task being deleted, which then goes.
    cluster
        .kubectl(&[
            "label",
            "-n",
            NAMESPACE,
            "peragotask",
            "warned",
            "team=data",
        ])
        .unwrap();
    cluster
        .kubectl(&[
            "patch",
            "-n",
            NAMESPACE,
            "peragotask",
            "held",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ])
        .unwrap();
    cluster
        .kubectl(&[
            "wait",
            "-n",
            NAMESPACE,
            "--for=delete",
            "peragotask/held",
            "--timeout=30s",
        ])
        .unwrap();
    cluster
        .kubectl(&[
            "scale",
            "-n",
            OPERATOR_NAMESPACE,
            &format!("deployment/{OPERATOR_DEPLOYMENT}"),
            "--replicas=2",
        ])
        .unwrap();
    cluster
        .kubectl(&[
            "rollout",
            "status",
            "-n",
            OPERATOR_NAMESPACE,
            &format!("deployment/{OPERATOR_DEPLOYMENT}"),
            "--timeout=120s",
        ])
        .unwrap();
    // Ready pods reach the Service's endpoints and kube-proxy's rules a moment later.
    let back = Instant::now();
    while let Err(e) = apply(&cluster, &[], &valid) {
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "still refused: {e}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "operator back: the webhook served again {:.1?} after its rollout completed",
        back.elapsed()
    );
    turn.leave();
}
