//! Two clusters, one Conductor (ADR 0040): two real API servers (etcd + kube-apiserver, no
//! kubelet), each with its own operator process named by default (the UID of its
//! `kube-system`), and the test binary's Conductor. Each cluster holds a PeragoTask of the
//! same task type.
//!
//! - Identical specs: the first cluster registers the TaskDef, with its mark; over many
//!   resyncs of both operators nothing is written again.
//! - A spec that renders a different TaskDef in the second cluster: it is Stalled for
//!   `TaskDefConflict`, naming the first cluster and its task, and still nothing is written.
//! - The same two operators under one cluster name, as every cluster was before names: they
//!   rewrite the TaskDef in turn, which shows the test can see what the names prevent.

#![allow(clippy::unwrap_used)]

mod operator;

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use operator::{eventually, install_crd, task};
use perago_api::PeragoTask;
use perago_e2e::pod::ConductorApi;
use perago_e2e::process::{ServerProcess, free_port};
use perago_e2e::services::Kube;
use serde_json::Value;

const TASK_TYPE: &str = "clusters.load";

/// One cluster's API server and operator.
struct Cluster {
    tasks: Api<PeragoTask>,
    kube: Kube,
    metrics_url: String,
    operator: Option<ServerProcess>,
}

impl Cluster {
    async fn start(dir: &std::path::Path, conductor: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let kube = Kube::start(dir, false).await.unwrap();
        let client = kube.client().await.unwrap();
        install_crd(&client).await;
        let mut cluster = Self {
            tasks: Api::namespaced(client, "default"),
            kube,
            metrics_url: String::new(),
            operator: None,
        };
        cluster.run_operator(dir, conductor, None);
        cluster
    }

    /// (Re)start the operator, named `name` or by default.
    fn run_operator(&mut self, dir: &std::path::Path, conductor: &str, name: Option<&str>) {
        if let Some(old) = self.operator.take() {
            old.kill();
        }
        let http = format!("127.0.0.1:{}", free_port().unwrap());
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_perago-operator"));
        command
            .args(["run", "--conductor-url", conductor, "--http-addr", &http])
            .args(["--resync-seconds", "1", "--leader-election", "false"])
            .env("KUBECONFIG", &self.kube.kubeconfig);
        if let Some(name) = name {
            command.args(["--cluster-name", name]);
        }
        let log = dir.join(format!("operator-{}.log", free_port().unwrap()));
        self.operator = Some(ServerProcess::spawn("perago-operator", &mut command, log).unwrap());
        self.metrics_url = format!("http://{http}/metrics");
    }

    /// The TaskDef writes this cluster's operator made (creates and updates) since it started.
    async fn writes(&self) -> u64 {
        let text = match reqwest::get(&self.metrics_url).await {
            Ok(answer) => answer.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        ["create", "update"]
            .iter()
            .filter_map(|call| {
                let series = format!(
                    r#"perago_operator_conductor_calls_total{{call="{call}",outcome="ok"}} "#
                );
                text.lines()
                    .find_map(|l| l.strip_prefix(series.as_str())?.parse::<u64>().ok())
            })
            .sum()
    }

    async fn apply(&self, task: &PeragoTask) {
        self.tasks
            .patch(
                "load",
                &PatchParams::apply("perago-test").force(),
                &Patch::Apply(task),
            )
            .await
            .unwrap();
    }

    /// The task's Stalled condition, once the status is of its current generation.
    async fn stalled(&self) -> Option<(String, String, String)> {
        let live = self.tasks.get("load").await.ok()?;
        let status = live.status.as_ref()?;
        (status.observed_generation == live.metadata.generation).then_some(())?;
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "Stalled")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }
}

async fn taskdef(conductor: &ConductorApi) -> Value {
    conductor
        .call(
            reqwest::Method::GET,
            &format!("/metadata/taskdefs/{TASK_TYPE}"),
            None,
        )
        .await
}

#[tokio::test]
async fn clusters_sharing_a_conductor_leave_each_others_taskdef_alone() {
    let services = operator::services().await;
    let url = &services.conductor().api_url;
    let conductor = ConductorApi::new(url);
    let dir = services.dir().to_owned();
    let (dir_a, dir_b) = (dir.join("cluster-a"), dir.join("cluster-b"));
    let (mut a, mut b) = tokio::join!(Cluster::start(&dir_a, url), Cluster::start(&dir_b, url));
    let spec = task("load", TASK_TYPE, "");

    // Identical specs: the first cluster registers, and no one writes again.
    a.apply(&spec).await;
    eventually("cluster a registered the TaskDef", || async {
        (a.writes().await >= 1).then_some(())
    })
    .await;
    b.apply(&spec).await;
    eventually("cluster b's task is not stalled", || async {
        let (status, ..) = b.stalled().await?;
        (status == "False").then_some(())
    })
    .await;
    let registered = taskdef(&conductor).await;
    let mark = registered["description"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        mark.starts_with("Registered by Perago for Kubernetes from cluster ")
            && mark.ends_with(", PeragoTask default/load."),
        "the TaskDef names the cluster that registered it: {mark:?}"
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (writes_a, writes_b) = (a.writes().await, b.writes().await);
    eprintln!("identical specs, 8 s of 1 s resyncs: {writes_a} writes from a, {writes_b} from b");
    assert_eq!(
        (writes_a, writes_b),
        (1, 0),
        "identical renders are written once"
    );
    assert_eq!(
        taskdef(&conductor).await["updateTime"],
        registered["updateTime"],
        "the TaskDef was rewritten"
    );

    // A spec that renders another TaskDef in cluster b: Stalled, naming cluster a's task.
    let mut changed = spec.clone();
    changed.spec.controls.retry.count = 7;
    b.apply(&changed).await;
    let (_, reason, message) = eventually("cluster b's task is stalled", || async {
        let stalled = b.stalled().await?;
        (stalled.0 == "True").then_some(stalled)
    })
    .await;
    eprintln!("conflicting specs: cluster b says {reason}: {message}");
    assert_eq!(reason, "TaskDefConflict", "{message}");
    assert!(
        message.contains("PeragoTask default/load")
            && message.contains("registered from cluster")
            && message.contains("(retryCount)"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (writes_a, writes_b) = (a.writes().await, b.writes().await);
    eprintln!("conflicting specs, 8 s more: {writes_a} writes from a, {writes_b} from b");
    assert_eq!((writes_a, writes_b), (1, 0), "a conflict writes nothing");
    let stored = taskdef(&conductor).await;
    assert_eq!(
        stored["retryCount"], registered["retryCount"],
        "cluster a's TaskDef stands"
    );

    // The control: both operators under one name, and the TaskDef registered afresh. They
    // rewrite it in turn.
    a.run_operator(&dir_a, url, Some("one-name"));
    b.run_operator(&dir_b, url, Some("one-name"));
    conductor
        .call(
            reqwest::Method::DELETE,
            &format!("/metadata/taskdefs/{TASK_TYPE}"),
            None,
        )
        .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (writes_a, writes_b) = (a.writes().await, b.writes().await);
    eprintln!("one name for both, 8 s: {writes_a} writes from a, {writes_b} from b");
    assert!(
        writes_a >= 2 && writes_b >= 2,
        "without names the two clusters should have rewritten the TaskDef in turn: {writes_a}, {writes_b}"
    );
}
