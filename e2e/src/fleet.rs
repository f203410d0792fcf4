//! Simulated nodes beside the real one, for the operator at fleet scale (`--bench fleet`).
//!
//! kwok, run outside the cluster with the admin's kubeconfig, keeps the fleet's Node objects
//! Ready (it renews their Leases) and plays the pods the scheduler binds to them
//! (`e2e/kwok/stages.yaml`): Running and Ready at once, gone at once when deleted, with no
//! containers. So everything the operator, the API server, the scheduler and the
//! controller-manager do is real, and nothing runs in the pods.
//!
//! The simulated pods' IPs come from [`POD_CIDR`], which this machine routes to itself. One
//! stand-in listening on the sidecar's port answers every pod's `/slots` as an idle sidecar
//! would, and counts the requests: they are the operator's busy-slot probes. Without it a
//! probe would fail, the pod would count as busy, and no autoscaled task could scale in.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http_body_util::Full;
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use crate::process::{ServerProcess, obtain};

/// The label and the taint (`NoSchedule`) of every simulated node: only pods that select and
/// tolerate it are placed there.
pub const SIMULATED: &str = "perago.io/simulated-node";
/// The simulated pods' IPs, routed to this machine (beside the node's 10.203/16 and 10.204/24).
pub const POD_CIDR: &str = "10.205.0.0/16";
/// The port the executor pod's sidecar serves `/slots` on (the operator's `METRICS_PORT`).
pub const SIDECAR_PORT: u16 = 9464;

pub struct Fleet {
    _kwok: ServerProcess,
    pub nodes: Vec<String>,
    probes: Arc<AtomicU64>,
    stand_in: tokio::task::JoinHandle<()>,
}

impl Fleet {
    /// Start kwok on the cluster of `kubeconfig` with `count` simulated nodes, and the
    /// stand-in that answers their pods' `/slots`; waits until every node is Ready.
    pub async fn start(
        dir: &Path,
        kubeconfig: &Path,
        client: kube::Client,
        count: usize,
    ) -> Result<Self> {
        let started = Instant::now();
        let probes = Arc::new(AtomicU64::new(0));
        let stand_in = serve_slots(probes.clone()).await?;
        route_to_this_machine()?;

        let mut cmd = Command::new(obtain("kwok")?);
        let stages = Path::new(env!("CARGO_MANIFEST_DIR")).join("kwok/stages.yaml");
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--config={}", stages.display()))
            .arg(format!(
                "--manage-nodes-with-label-selector={SIMULATED}=true"
            ))
            .arg(format!("--cidr={POD_CIDR}"))
            .arg("--node-lease-duration-seconds=40");
        let mut kwok = ServerProcess::spawn("kwok", &mut cmd, dir.join("kwok.log"))?;

        let nodes: Api<Node> = Api::all(client);
        let names: Vec<String> = (0..count).map(|i| format!("simulated-{i:03}")).collect();
        for name in &names {
            let node: Node = serde_json::from_value(node(name))?;
            match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => {}
                // A node left by an earlier run of this process's cluster is reused.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e).with_context(|| format!("creating node {name}")),
            }
        }
        let selector = ListParams::default().labels(&format!("{SIMULATED}=true"));
        loop {
            kwok.ensure_running()?;
            let ready = nodes
                .list(&selector)
                .await?
                .items
                .iter()
                .filter(|n| is_ready(n))
                .count();
            if ready >= count {
                break;
            }
            if started.elapsed() > Duration::from_secs(120) {
                bail!(
                    "{ready} of {count} simulated nodes Ready after 120 s; kwok's log:\n{}",
                    kwok.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!(
            "[e2e] {count} simulated nodes Ready in {:.1?}",
            started.elapsed()
        );
        Ok(Self {
            _kwok: kwok,
            nodes: names,
            probes,
            stand_in,
        })
    }

    /// `/slots` requests answered so far: the operator's busy-slot probes of simulated pods.
    pub fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    /// What a PeragoTask's `spec.executor` needs to run on the simulated nodes.
    pub fn placement() -> Value {
        json!({
            "nodeSelector": {SIMULATED: "true"},
            "tolerations": [{"key": SIMULATED, "operator": "Exists", "effect": "NoSchedule"}],
        })
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stand_in.abort();
        let _ = Command::new("ip")
            .args(["route", "del", "local", POD_CIDR, "dev", "lo"])
            .status();
    }
}

fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {SIMULATED: "true", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {"taints": [{"key": SIMULATED, "value": "true", "effect": "NoSchedule"}]},
    })
}

fn is_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Every address of [`POD_CIDR`] is this machine's, so a connection from the operator's pod
/// to a simulated pod reaches the stand-in.
fn route_to_this_machine() -> Result<()> {
    let status = Command::new("ip")
        .args(["route", "replace", "local", POD_CIDR, "dev", "lo"])
        .status()
        .context("running ip route")?;
    if !status.success() {
        bail!("ip route replace local {POD_CIDR} dev lo failed ({status})");
    }
    Ok(())
}

/// How long an idle sidecar's poll stays in flight: its default long poll
/// (`PERAGO_POLL_TIMEOUT_MS`).
const IDLE_POLL: u64 = 100;

/// Answers `/slots` on every address of this machine as an idle sidecar would. Asked to count
/// the polls sent before a queue read (ADR 0033), an idle sidecar waits for the poll it has in
/// flight to come back empty: the stand-in waits for the rest of one long poll, spread evenly
/// over 0 to [`IDLE_POLL`] ms.
async fn serve_slots(probes: Arc<AtomicU64>) -> Result<tokio::task::JoinHandle<()>> {
    let address = SocketAddr::from(([0, 0, 0, 0], SIDECAR_PORT));
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("the fleet's /slots stand-in cannot listen on {address}"))?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let probes = probes.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let probes = probes.clone();
                    async move {
                        let body = if request.uri().path() == "/slots" {
                            let n = probes.fetch_add(1, Ordering::Relaxed);
                            let counting = request
                                .uri()
                                .query()
                                .is_some_and(|q| q.contains("countPollsOlderThanMs="));
                            if counting {
                                let rest = (n * 37) % (IDLE_POLL + 1);
                                tokio::time::sleep(Duration::from_millis(rest)).await;
                            }
                            r#"{"slots":1,"busy":0,"stopping":false,"pollsCountedOlderThanMs":0}"#
                        } else {
                            ""
                        };
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from_static(body.as_bytes()),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    }))
}
