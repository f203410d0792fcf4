//! How platform teams install, on the real node, from releases in the node's registry:
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
//!
//! Both install operators that would see each other's tasks: they take turns.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use tokio::sync::Mutex;

use perago_e2e::cluster::{Cluster, OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE, RELEASE};
use perago_e2e::node::BUSYBOX_BODY_IMAGE;
use perago_e2e::registry::{Release, publish_with};
use perago_e2e::{Selection, shared};

const NAMESPACE: &str = "upgrade";
const PREVIOUS: &str = "0.0.9";

/// One install at a time on the shared node.
static INSTALLS: Mutex<()> = Mutex::const_new(());

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
    let _turn = INSTALLS.lock().await;
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
    let _turn = INSTALLS.lock().await;
    let release = &services.node().release;
    let cluster = Cluster::new(services).unwrap();
    let teams = [("team-a", "tasks-a"), ("team-b", "tasks-b")];
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
}
