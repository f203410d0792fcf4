//! The node's three benchmarks, `scaling`, `operator` and `fleet`, in turn on one node: each
//! target starts a node of its own, this one starts it once (CI's smoke runs it). Between
//! two benchmarks the operator is uninstalled and installed again with the next one's Helm
//! values, so that each measures a fresh operator process as it does alone, and what a
//! benchmark leaves behind is deleted first. Every `PERAGO_BENCH_*` setting means what it
//! means for the benchmark alone, and each prints the same lines.
//!
//! `cargo bench -p perago-e2e --bench node`.

#![allow(clippy::unwrap_used)]

use perago_e2e::Selection;
use perago_e2e::cluster::{Cluster, OPERATOR_NAMESPACE, RELEASE};

// Each benchmark's own `main` is not called here.
#[allow(dead_code)]
#[path = "fleet.rs"]
mod fleet;
#[allow(dead_code)]
#[path = "operator.rs"]
mod operator;
#[allow(dead_code)]
#[path = "scaling.rs"]
mod scaling;

/// The operator's pods now, as `pod/<name>`.
fn operator_pods(cluster: &Cluster) -> Vec<String> {
    cluster
        .kubectl(&[
            "get",
            "pods",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=perago-operator",
            "-o",
            "name",
        ])
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Until every one of `pods` is gone, its process with it (the operator's CPU and memory are
/// read from the processes of its name).
fn wait_gone(cluster: &Cluster, pods: &[String]) {
    if pods.is_empty() {
        return;
    }
    let mut args = vec![
        "wait",
        "-n",
        OPERATOR_NAMESPACE,
        "--for=delete",
        "--timeout=180s",
    ];
    args.extend(pods.iter().map(String::as_str));
    cluster.kubectl(&args).unwrap();
}

/// The operator uninstalled and installed again with `values`, as the benchmark alone installs
/// it (the CRDs stay). A `helm upgrade --reuse-values` to the new values costs about as much
/// (7.3 s against 8.1 s, once each on the build machine) and would carry over any value of the
/// benchmark before that the next one does not set.
fn reinstall(cluster: &Cluster, values: &[&str]) {
    let old = operator_pods(cluster);
    cluster
        .helm(&[
            "uninstall",
            RELEASE,
            "--namespace",
            OPERATOR_NAMESPACE,
            "--wait",
            "--timeout",
            "180s",
        ])
        .unwrap();
    wait_gone(cluster, &old);
    cluster.install_operator(values).unwrap();
}

#[tokio::main]
async fn main() {
    if perago_e2e::node_opted_out("node benchmarks") {
        return;
    }
    let services = perago_e2e::shared(Selection::ALL).await;
    let cluster = Cluster::new(services).unwrap();

    cluster.install_operator(&scaling::OPERATOR_VALUES).unwrap();
    scaling::bench(services, &cluster).await;
    // Its namespaces go while the operator is installed again (their pods' shutdown is most
    // of the wait): the new operator releases the tasks' finalizers, before the next
    // benchmark counts anything.
    let mut delete = vec!["delete", "namespace", "--wait=false"];
    delete.extend(scaling::NAMESPACES);
    cluster.kubectl(&delete).unwrap();
    reinstall(&cluster, &operator::OPERATOR_VALUES);
    let mut gone = vec!["wait", "--for=delete", "--timeout=600s"];
    let namespaces = scaling::NAMESPACES.map(|n| format!("namespace/{n}"));
    gone.extend(namespaces.iter().map(String::as_str));
    cluster.kubectl(&gone).unwrap();
    operator::bench(services, &cluster).await;

    fleet::bench(services, &cluster, |values| reinstall(&cluster, values)).await;
}
