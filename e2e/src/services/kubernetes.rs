//! etcd and kube-apiserver, the API of the single-node cluster.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::{KUBE_ADMIN_TOKEN, LOOPBACK, http_client};
use crate::node::{BRIDGE_IP, KUBERNETES_SERVICE_IP, NodePki, SERVICE_RANGE};
use crate::pki::Usage;
use crate::process::{Restartable, ServerProcess, free_port, obtain, wait_ready};

/// A running etcd + kube-apiserver with token authentication for the admin user.
///
/// Alone (no node), it serves on loopback with a self-signed certificate, as a store and a
/// validator for the API. For the node it serves on the bridge address with the node's
/// authority, authorizes with Node + RBAC, and advertises itself for the `kubernetes` Service.
pub struct Kube {
    pub server: String,
    pub kubeconfig: PathBuf,
    pub pki: Option<NodePki>,
    // Dropped in this order: the apiserver stops before its store.
    apiserver: Restartable,
    _etcd: ServerProcess,
    log: PathBuf,
}

impl Kube {
    /// Kill the apiserver at once (SIGKILL, every watch and call cut), leave it down for
    /// `down`, and start it again on the same etcd and port; waits until it is ready. etcd
    /// keeps running, as it does when a control-plane node's apiserver restarts.
    pub async fn crash_and_restart_apiserver(&self, down: Duration) -> Result<()> {
        self.apiserver
            .crash_and_restart(down, async |mut command| {
                let (process, took) =
                    spawn_apiserver(&mut command, self.log.clone(), &self.server).await?;
                eprintln!(
                    "[e2e] kube-apiserver restarted on {} in {took:.1?}",
                    self.server
                );
                Ok(process)
            })
            .await
    }

    /// A client of this apiserver, as the admin user of its kubeconfig.
    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        Ok(kube::Client::try_from(config)?)
    }

    pub async fn start(dir: &Path, for_node: bool) -> Result<Self> {
        let etcd_bin = obtain("etcd")?;
        let apiserver_bin = obtain("kube-apiserver")?;
        let home = dir.join("kube");
        std::fs::create_dir_all(home.join("pki"))?;

        let (client_port, peer_port) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let mut etcd_cmd = Command::new(etcd_bin);
        etcd_cmd
            .arg(format!("--data-dir={}", home.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
            ))
            .arg(format!(
                "--initial-cluster=default=http://127.0.0.1:{peer_port}"
            ))
            .args(["--unsafe-no-fsync", "--log-level=warn"]);
        let mut etcd = ServerProcess::spawn("etcd", &mut etcd_cmd, dir.join("etcd.log"))?;
        let client = http_client();
        // Generous: on a 2-core machine still busy with the previous node's clean-up, etcd
        // once took over 30 s to answer its first health check.
        wait_ready(&mut etcd, Duration::from_secs(120), || {
            let client = client.clone();
            let url = format!("{etcd_url}/health");
            async move {
                client
                    .get(url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await?;

        let tokens = home.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{KUBE_ADMIN_TOKEN},admin,admin,\"system:masters\"\n"),
        )?;
        let port = free_port()?;
        let host: IpAddr = match for_node {
            true => BRIDGE_IP.into(),
            false => LOOPBACK,
        };
        let server = format!("https://{host}:{port}");
        let mut api_cmd = Command::new(apiserver_bin);
        api_cmd
            .arg(format!("--etcd-servers={etcd_url}"))
            .arg(format!("--bind-address={host}"))
            .arg(format!("--advertise-address={host}"))
            .arg(format!("--secure-port={port}"))
            .arg(format!("--service-cluster-ip-range={SERVICE_RANGE}"))
            .arg(format!("--service-account-issuer={server}"))
            .arg(format!("--token-auth-file={}", tokens.display()))
            .args([
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--max-requests-inflight=0",
                "--max-mutating-requests-inflight=0",
                "--v=0",
            ])
            // Stopped on SIGTERM, it drains its watches for over 5 s, and etcd waits for it:
            // when the harness stops them, no client is left to drain for.
            .env("PERAGO_WATCHDOG_GRACE_SECONDS", "1");
        let pki = if for_node {
            let pki = NodePki::create(&home.join("pki"))?;
            let ca = &pki.authority;
            let serving = ca.issue(
                "apiserver",
                "kube-apiserver",
                &Usage::Server {
                    names: &[
                        "kubernetes",
                        "kubernetes.default",
                        "kubernetes.default.svc",
                        "kubernetes.default.svc.cluster.local",
                        "localhost",
                    ],
                    addresses: &[BRIDGE_IP.into(), KUBERNETES_SERVICE_IP.into(), LOOPBACK],
                },
            )?;
            // Logs and exec go apiserver → kubelet; the kubelet asks the apiserver whether
            // this client may, and system:masters may.
            let kubelet_client = ca.issue(
                "apiserver-kubelet-client",
                "kube-apiserver-kubelet-client",
                &Usage::Client {
                    org: Some("system:masters"),
                },
            )?;
            // The aggregation layer (an external metrics adapter registers through it): the
            // apiserver proxies with this client certificate and the request headers below,
            // which the extension server trusts through the same authority.
            let front_proxy = ca.issue(
                "front-proxy-client",
                "front-proxy-client",
                &Usage::Client { org: None },
            )?;
            api_cmd
                .arg(format!(
                    "--requestheader-client-ca-file={}",
                    ca.cert.display()
                ))
                .arg(format!(
                    "--proxy-client-cert-file={}",
                    front_proxy.cert.display()
                ))
                .arg(format!(
                    "--proxy-client-key-file={}",
                    front_proxy.key.display()
                ))
                .args([
                    "--requestheader-allowed-names=front-proxy-client",
                    "--requestheader-username-headers=X-Remote-User",
                    "--requestheader-group-headers=X-Remote-Group",
                    "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                    // To the extension server's endpoints, not its Service's cluster IP.
                    "--enable-aggregator-routing=true",
                ]);
            api_cmd
                .arg(format!("--tls-cert-file={}", serving.cert.display()))
                .arg(format!("--tls-private-key-file={}", serving.key.display()))
                .arg(format!("--client-ca-file={}", ca.cert.display()))
                .arg(format!(
                    "--kubelet-client-certificate={}",
                    kubelet_client.cert.display()
                ))
                .arg(format!(
                    "--kubelet-client-key={}",
                    kubelet_client.key.display()
                ))
                .arg("--kubelet-preferred-address-types=InternalIP")
                .arg(format!(
                    "--service-account-key-file={}",
                    pki.service_account.cert.display()
                ))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    pki.service_account.key.display()
                ))
                .args([
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                ]);
            Some(pki)
        } else {
            // One RSA key both signs and verifies service-account tokens.
            let sa_key = home.join("pki/sa.key");
            let status = Command::new("openssl")
                .args(["genrsa", "-out"])
                .arg(&sa_key)
                .arg("2048")
                .stderr(std::process::Stdio::null())
                .status()
                .context("running openssl genrsa (install openssl)")?;
            if !status.success() {
                bail!("openssl genrsa failed");
            }
            api_cmd
                .arg(format!("--cert-dir={}", home.join("pki").display()))
                .arg(format!("--service-account-key-file={}", sa_key.display()))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    sa_key.display()
                ))
                // No controller-manager makes ServiceAccounts and no kubelet serves the
                // `kubernetes` Service here.
                .args([
                    "--authorization-mode=RBAC",
                    "--disable-admission-plugins=ServiceAccount",
                    "--endpoint-reconciler-type=none",
                ]);
            None
        };
        let log = dir.join("kube-apiserver.log");
        let (apiserver, took) = spawn_apiserver(&mut api_cmd, log.clone(), &server).await?;
        let trust = match &pki {
            Some(pki) => format!("certificate-authority: {}", pki.authority.cert.display()),
            None => "insecure-skip-tls-verify: true".to_owned(),
        };
        let kubeconfig = home.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: perago-e2e\n  cluster:\n    server: {server}\n    \
                 {trust}\nusers:\n- name: admin\n  user:\n    token: {KUBE_ADMIN_TOKEN}\n\
                 contexts:\n- name: perago-e2e\n  context:\n    cluster: perago-e2e\n    user: admin\n    \
                 namespace: default\ncurrent-context: perago-e2e\n"
            ),
        )?;
        eprintln!("[e2e] kube-apiserver ready on {server} in {took:.1?}");
        Ok(Self {
            server,
            kubeconfig,
            pki,
            apiserver: Restartable::running(api_cmd, apiserver),
            _etcd: etcd,
            log,
        })
    }
}

/// Start a kube-apiserver and wait until `server` answers `/readyz` to the admin.
async fn spawn_apiserver(
    command: &mut Command,
    log: PathBuf,
    server: &str,
) -> Result<(ServerProcess, Duration)> {
    let mut apiserver = ServerProcess::spawn("kube-apiserver", command, log)?;
    let client = http_client();
    let took = wait_ready(&mut apiserver, Duration::from_secs(120), || {
        let request = client
            .get(format!("{server}/readyz"))
            .bearer_auth(KUBE_ADMIN_TOKEN);
        async move { request.send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await?;
    Ok((apiserver, took))
}
