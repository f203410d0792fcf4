//! NetworkPolicies enforced on the node. The harness's network plugin (the CNI `bridge`)
//! enforces none, so beside it runs kube-router's network policy controller alone: no
//! routing, no service proxy. From the cluster's NetworkPolicies it programs iptables chains
//! and ipsets for the node's pods, and keeps them while it runs. The node's janitor removes
//! them with the node's own chains.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Result;

use crate::node::{NODE_NAME, SERVICE_RANGE};
use crate::process::{ServerProcess, obtain, wait_ready};

/// kube-router's policy controller on the node, until dropped (or this process ends).
pub struct PolicyEnforcer {
    _process: ServerProcess,
}

impl PolicyEnforcer {
    /// Start it on the cluster of `kubeconfig`, logging into `dir`; ready once its chains are
    /// in the host's `filter` table.
    pub async fn start(dir: &Path, kubeconfig: &Path) -> Result<Self> {
        let mut cmd = Command::new(obtain("kube-router")?);
        cmd.arg("--run-firewall=true")
            .arg("--run-router=false")
            .arg("--run-service-proxy=false")
            .arg("--enable-cni=false")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--service-cluster-ip-range={SERVICE_RANGE}"))
            .arg("--health-port=0")
            .arg("--iptables-sync-period=1m");
        let mut process =
            ServerProcess::spawn("kube-router", &mut cmd, dir.join("kube-router.log"))?;
        let took = wait_ready(&mut process, Duration::from_secs(60), || async {
            tokio::process::Command::new("iptables")
                .args(["-w", "-t", "filter", "-S", "KUBE-ROUTER-FORWARD"])
                .output()
                .await
                .is_ok_and(|out| out.status.success())
        })
        .await?;
        eprintln!("[e2e] NetworkPolicies enforced on the node (kube-router) in {took:.1?}");
        Ok(Self { _process: process })
    }
}
