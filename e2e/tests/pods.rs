//! Executor pods on a real kubelet: the operator installed by Helm in the cluster once, and
//! each test's PeragoTasks run by the pods the operator makes. The tests are grouped by what
//! they show (`pods/publish.rs`, `failures.rs`, `scaling.rs`, `security.rs`, `gateway.rs`,
//! `operate.rs`, `lineage.rs`, `support_bundle.rs`, `gitops.rs`, `with_the_operator_down.rs`);
//! this file holds the cluster and the steps they share.
//!
//! Every test holds a [`Turn`] for its whole run: shared with the others, or alone, with no
//! other test running, for one that stops the operator (the GitOps race scales it to zero).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use perago_e2e::cluster::Cluster;
use perago_e2e::lake::Lake;
use perago_e2e::node::{BUSYBOX_BODY_IMAGE, ctr};
use perago_e2e::pod::ConductorApi;
use perago_e2e::policies::PolicyEnforcer;
use perago_e2e::workload::{Workload, merge, workspace_task_with};
use perago_e2e::{Selection, Services, shared};
use serde_json::json;
use tokio::sync::{Mutex, OnceCell, RwLock, RwLockReadGuard, RwLockWriteGuard};

#[path = "pods/failures.rs"]
mod failures;
#[path = "pods/gateway.rs"]
mod gateway;
#[path = "pods/gitops.rs"]
mod gitops;
#[path = "pods/lineage.rs"]
mod lineage;
#[path = "pods/operate.rs"]
mod operate;
#[path = "pods/publish.rs"]
mod publish;
#[path = "pods/scaling.rs"]
mod scaling;
#[path = "pods/security.rs"]
mod security;
#[path = "pods/support_bundle.rs"]
mod support_bundle;
#[path = "pods/with_the_operator_down.rs"]
mod with_the_operator_down;

static OPERATOR: OnceCell<Cluster> = OnceCell::const_new();
static POLICIES: OnceCell<PolicyEnforcer> = OnceCell::const_new();
/// Flux's controllers and Git server, started by the first GitOps scenario (`pods/gitops.rs`).
static FLUX: OnceCell<perago_e2e::flux::Flux> = OnceCell::const_new();
/// The Python body image (`e2e/bin/images`, `IMAGE_SET=python`), built and imported into the
/// node by the first test that runs a Python body.
static PYTHON_BODY: OnceCell<String> = OnceCell::const_new();
/// The tests' turns on the operator: shared, or one test alone while it stops the operator.
/// tokio's lock is fair: a test waiting to be alone waits only for the turns taken before it.
static TURNS: RwLock<()> = RwLock::const_new(());

/// A test's turn on a lock of the binary, held (never read) until the test ends.
struct Turn {
    lock: &'static RwLock<()>,
    guard: Mutex<Option<Guard>>,
    /// The test's name, and when its turn began: the lane's log says how long each test held
    /// its turn, which is where the binary's time goes.
    test: Option<(String, std::time::Instant)>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some((test, since)) = &self.test else {
            return;
        };
        // The test's namespaces go, without waiting: the node's 2 CPUs hold about 35 executor
        // pods, and those a test leaves running would keep later tests' pods Pending.
        if let Some(cluster) = OPERATOR.get() {
            for namespace in perago_e2e::cluster::namespaces_made_here() {
                let args = [
                    "delete",
                    "namespace",
                    &namespace,
                    "--ignore-not-found",
                    "--wait=false",
                ];
                if let Err(e) = cluster.kubectl(&args) {
                    eprintln!("{}: {e:#}", args.join(" "));
                }
            }
        }
        // Written past libtest's capture, so that it shows for a test that passes too.
        use std::io::Write;
        let line = format!("[pods] {test} held its turn {:.1?}\n", since.elapsed());
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

#[allow(dead_code)]
enum Guard {
    Shared(RwLockReadGuard<'static, ()>),
    Alone(RwLockWriteGuard<'static, ()>),
}

impl Turn {
    /// A turn shared with the other tests of `lock`, for the test named `test` if given.
    async fn shared(lock: &'static RwLock<()>, test: Option<&str>) -> Self {
        let guard = Guard::Shared(lock.read().await);
        Self {
            lock,
            guard: Mutex::new(Some(guard)),
            test: test.map(|t| (t.to_owned(), std::time::Instant::now())),
        }
    }

    /// Let the turn go before the test ends.
    async fn release(&self) {
        *self.guard.lock().await = None;
    }

    /// From now on, no other test of this lock runs until this one ends.
    async fn alone(&self) {
        let mut guard = self.guard.lock().await;
        if let Some(Guard::Shared(_)) = *guard {
            // The shared turn goes first, or the wait to be alone would never end.
            *guard = None;
            *guard = Some(Guard::Alone(self.lock.write().await));
        }
    }
}

/// The node, with the operator installed from the chart (once per test binary); `None` when
/// the developer opted out of the node's tests. NetworkPolicies are enforced, and every
/// executor pod and the operator run under the chart's (`Cluster::network_policy_values`):
/// each test here shows they let through what a task needs. No turn is taken: [`cluster`]
/// takes one.
async fn operator(test: &str) -> Option<(&'static Services, &'static Cluster)> {
    if perago_e2e::node_opted_out(test) {
        return None;
    }
    let services = shared(Selection::ALL).await;
    let cluster = OPERATOR
        .get_or_init(|| async {
            let cluster = Cluster::new(services).unwrap();
            POLICIES
                .get_or_init(|| async {
                    PolicyEnforcer::start(services.dir(), &services.kube().kubeconfig)
                        .await
                        .unwrap()
                })
                .await;
            // A 10 s resync bounds how long a task scaled to zero waits for the operator to
            // see its queue (the chart's default is 60 s).
            let mut values = vec!["--set".to_owned(), "resyncSeconds=10".to_owned()];
            values.extend(cluster.network_policy_values().unwrap());
            // Tasks of `pods/gateway.rs` are on Conductor behind an authenticating gateway,
            // where the operator registers them with a certificate of its own.
            values.extend(gateway::operator_values(
                &cluster,
                gateway::rig(services).await,
            ));
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            let took = cluster.install_operator(&values).unwrap();
            eprintln!("operator installed by helm and available in {took:.1?}");
            cluster
        })
        .await;
    Some((services, cluster))
}

/// [`operator`], with a turn shared with the other tests, to hold until the test ends.
async fn cluster(test: &str) -> Option<(Turn, &'static Services, &'static Cluster)> {
    let (services, cluster) = operator(test).await?;
    Some((Turn::shared(&TURNS, Some(test)).await, services, cluster))
}

/// The Python body image's reference, once it is in the node's containerd.
async fn python_body_image(services: &'static Services) -> &'static str {
    PYTHON_BODY
        .get_or_init(|| async {
            let started = std::time::Instant::now();
            let (image, archive) =
                perago_e2e::node::build_python_body_image(&services.dir().join("python-body"))
                    .unwrap();
            services
                .node()
                .containerd
                .import(&[(image.clone(), archive)])
                .unwrap();
            eprintln!(
                "Python body image built and imported in {:.1?}",
                started.elapsed()
            );
            image
        })
        .await
}

fn workspace_task(namespace: &str, name: &str, script: &str) -> String {
    workspace_task_with(namespace, name, script, &json!({}))
}

/// A lakeFS repository for one test, its main holding `data/in.txt`: the client, the
/// repository's name and the seed commit.
async fn seeded(services: &Services, prefix: &str) -> (Lake, String, String) {
    Lake::seeded(services.lakefs(), prefix).await.unwrap()
}

/// Start a one-step workflow of the task `<namespace>.<name>` on `reference`, with params `n`.
async fn start_step(
    conductor: &ConductorApi,
    namespace: &str,
    name: &str,
    case: &str,
    repository: &str,
    reference: &str,
    n: i64,
) -> String {
    conductor
        .start(
            &format!("{namespace}.{name}"),
            case,
            json!({
                "workspace": {"repository": repository, "branch": "main", "refType": "commit", "ref": reference},
                "params": {"n": n},
            }),
        )
        .await
}

/// A read-only task autoscaled from zero to `max` pods (one work item per pod, a `window`
/// second scale-down window) in a restricted namespace of its own, once Ready.
fn autoscaled_task(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    script: &str,
    max: i32,
    window: i32,
) {
    cluster.task_namespace(namespace).unwrap();
    let spec = json!({
        "workspace": {"readOnly": true},
        "executor": {"autoscaling": {
            "minReplicas": 0, "maxReplicas": max, "targetQueueDepth": 1,
            "scaleDownStabilizationSeconds": window,
        }},
    });
    cluster
        .apply(&workspace_task_with(namespace, name, script, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
}

/// The task's one pod, once it exists.
async fn task_pod(client: &kube::Client, namespace: &str, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("perago.io/task={name}");
    for _ in 0..600 {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        if let Some(pod) = list.items.into_iter().next() {
            return pod;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no pod of {namespace}/{name} after 60 s");
}

const PUBLISH_BODY: &str = r#"
set -eu
echo "body: params $(cat "$PERAGO_PARAMS")"
n=$(sed -n 's/.*"n": *\([0-9]*\).*/\1/p' "$PERAGO_PARAMS")
mkdir -p "$PERAGO_WORKSPACE/out"
i=0
while [ "$i" -lt "$n" ]; do
  echo "row $i of $(cat "$PERAGO_WORKSPACE/in.txt")" > "$PERAGO_WORKSPACE/out/part-$i.txt"
  i=$((i + 1))
done
printf '{"files": %d}' "$n" > "$PERAGO_RESULT"
"#;

async fn wait_for_log(
    cluster: &Cluster,
    namespace: &str,
    pod: &str,
    container: &str,
    needle: &str,
) {
    for _ in 0..300 {
        let log = cluster
            .kubectl(&["logs", "-n", namespace, pod, "-c", container])
            .unwrap_or_default();
        if log.contains(needle) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{namespace}/{pod} {container} never logged {needle:?}");
}

/// Wait until the pod is gone from the API; the time it went.
async fn wait_gone(pods: &Api<Pod>, name: &str, limit: Duration) -> std::time::SystemTime {
    let started = std::time::Instant::now();
    while pods.get_opt(name).await.unwrap().is_some() {
        assert!(
            started.elapsed() < limit,
            "pod {name} still exists after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::time::SystemTime::now()
}

/// The PeragoTask's `Ready` condition once its reason is one of `reasons`.
async fn ready_condition(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    reasons: &[&str],
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), namespace);
    let mut last = None;
    for _ in 0..900 {
        let task = tasks.get(name).await.unwrap();
        last = task
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"));
        if let Some(c) = &last
            && reasons.contains(&c.reason.as_str())
        {
            return c.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{namespace}/{name}: Ready never had a reason among {reasons:?}; last {last:?}");
}

/// The task's pods' Conductor worker ids start with `<name>-perago-` (the Deployment's pods).
fn served_by(step: &serde_json::Value, name: &str) -> bool {
    step["workerId"]
        .as_str()
        .is_some_and(|w| w.starts_with(&format!("{name}-perago-")))
}

/// A kubeconfig for the ServiceAccount `account` of `namespace` (made here), bound to a Role
/// with `rules` (none: the account may do nothing in the namespace); its path.
fn account_kubeconfig(
    cluster: &Cluster,
    namespace: &str,
    account: &str,
    rules: &serde_json::Value,
    dir: &std::path::Path,
) -> String {
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": account, "namespace": namespace},
        "rules": rules,
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": account, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    });
    let account_object = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": account, "namespace": namespace}});
    for object in [account_object, role, binding] {
        cluster.apply(&object.to_string()).unwrap();
    }
    let token = cluster
        .kubectl(&["create", "token", account, "-n", namespace])
        .unwrap();
    let admin = std::fs::read_to_string(cluster.kubeconfig()).unwrap();
    let mut config: serde_yaml::Value = serde_yaml::from_str(&admin).unwrap();
    let cluster_name = config["clusters"][0]["name"].clone();
    config["users"] =
        serde_yaml::to_value(json!([{"name": account, "user": {"token": token.trim()}}])).unwrap();
    config["contexts"] = serde_yaml::to_value(json!([{"name": account, "context": {
        "cluster": cluster_name, "user": account, "namespace": namespace}}]))
    .unwrap();
    config["current-context"] = account.into();
    let path = dir.join(format!("{account}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path.display().to_string()
}

/// `kubectl perago ARGS` (the release binary) with the cluster's kubeconfig, and none of the
/// server variables of the environment: what it finds, it finds from the cluster.
fn plugin(cluster: &Cluster, args: &[&str]) -> std::process::Output {
    let plugin = perago_e2e::process::release_binaries(&["kubectl-perago"], "the plugin's test")
        .unwrap()
        .join("kubectl-perago");
    let mut command = std::process::Command::new(plugin);
    command.args(args).env("KUBECONFIG", cluster.kubeconfig());
    for var in [
        "CONDUCTOR_SERVER_URL",
        "LAKECTL_SERVER_ENDPOINT_URL",
        "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
        "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
    ] {
        command.env_remove(var);
    }
    command.output().unwrap()
}
