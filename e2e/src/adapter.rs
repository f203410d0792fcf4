//! prometheus-adapter (built by `e2e/bin/obtain prometheus-adapter` from its Go module) as a
//! host process on the node's bridge, registered with the node's apiserver as the external
//! metrics API: an HPA's `External` metric is then answered from the real Prometheus, as in a
//! cluster that runs the adapter's chart.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::node::BRIDGE_IP;
use crate::process::{ServerProcess, free_port, obtain, wait_ready};

/// The APIService the adapter serves.
const API_SERVICE: &str = "v1beta1.external.metrics.k8s.io";

/// A running, registered adapter; its drop unregisters the API, then stops the adapter (an
/// APIService nobody serves fails the apiserver's discovery, which keeps namespaces from being
/// deleted).
pub struct PrometheusAdapter {
    process: ServerProcess,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Drop for PrometheusAdapter {
    fn drop(&mut self) {
        let deleted = Command::new(&self.kubectl)
            .args(["delete", "apiservice", API_SERVICE, "--ignore-not-found"])
            .env("KUBECONFIG", &self.kubeconfig)
            .output();
        match deleted {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "[e2e] deleting the APIService {API_SERVICE}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => eprintln!("[e2e] deleting the APIService {API_SERVICE}: {e}"),
        }
    }
}

impl PrometheusAdapter {
    /// Start the adapter with `external_rules` (the adapter's `externalRules`) over the
    /// Prometheus at `prometheus_url`, register it in `namespace` (a Service without a
    /// selector, its Endpoints on the bridge, and the APIService), and wait until the apiserver
    /// reports the API available.
    pub async fn start(
        dir: &Path,
        kubeconfig: &Path,
        cluster: &Cluster,
        namespace: &str,
        prometheus_url: &str,
        external_rules: &Value,
    ) -> Result<Self> {
        let home = dir.join("prometheus-adapter");
        std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
        let config = home.join("config.yaml");
        // JSON is YAML.
        std::fs::write(
            &config,
            serde_json::to_vec_pretty(&json!({"externalRules": external_rules}))?,
        )?;
        let port = free_port()?;
        let mut cmd = Command::new(obtain("prometheus-adapter")?);
        cmd.arg(format!("--lister-kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--authentication-kubeconfig={}",
                kubeconfig.display()
            ))
            .arg(format!(
                "--authorization-kubeconfig={}",
                kubeconfig.display()
            ))
            .arg(format!("--bind-address={BRIDGE_IP}"))
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", home.join("certs").display()))
            .arg(format!("--prometheus-url={prometheus_url}"))
            .arg(format!("--config={}", config.display()))
            // Series that appear after the start are found within seconds (default 10 min).
            .arg("--metrics-relist-interval=5s")
            .arg("--v=1");
        let mut process = ServerProcess::spawn(
            "prometheus-adapter",
            &mut cmd,
            dir.join("prometheus-adapter.log"),
        )?;
        // Its own certificate is self-signed: the probe and the APIService skip verification.
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(5))
            .build()?;
        let healthz = format!("https://{BRIDGE_IP}:{port}/healthz");
        let took = wait_ready(&mut process, Duration::from_secs(60), || {
            let probe = http.get(&healthz).send();
            async move { probe.await.is_ok_and(|r| r.status().is_success()) }
        })
        .await?;
        eprintln!("[e2e] prometheus-adapter serving on {BRIDGE_IP}:{port} in {took:.1?}");

        // From here on, a failure unregisters the API as it stops the adapter.
        let adapter = Self {
            process,
            kubectl: obtain("kubectl")?,
            kubeconfig: kubeconfig.to_owned(),
        };
        let registration = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "prometheus-adapter", "namespace": namespace},
             "spec": {"ports": [{"port": 443, "targetPort": port}]}},
            {"apiVersion": "v1", "kind": "Endpoints",
             "metadata": {"name": "prometheus-adapter", "namespace": namespace},
             "subsets": [{"addresses": [{"ip": BRIDGE_IP.to_string()}], "ports": [{"port": port}]}]},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": API_SERVICE},
             "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                      "service": {"name": "prometheus-adapter", "namespace": namespace, "port": 443},
                      "insecureSkipTLSVerify": true,
                      "groupPriorityMinimum": 100, "versionPriority": 100}},
        ]});
        cluster.apply(&registration.to_string())?;
        let started = Instant::now();
        loop {
            let available = cluster.kubectl(&[
                "get",
                "apiservice",
                API_SERVICE,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
            ])?;
            if available.trim() == "True" {
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                let status = cluster.kubectl(&["get", "apiservice", API_SERVICE, "-o", "yaml"])?;
                bail!(
                    "the external metrics API is not available after 60 s:\n{status}\n{}",
                    adapter.process.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!(
            "[e2e] {API_SERVICE} available {:.1?} after the adapter started",
            started.elapsed()
        );
        Ok(adapter)
    }
}
