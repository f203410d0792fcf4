//! The real servers: Conductor OSS, lakeFS, and etcd + kube-apiserver, each on free loopback
//! ports with its state in a per-run temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::process::{ServerProcess, free_port, obtain, wait_ready};

/// lakeFS admin credentials set at start-up (test-only values).
pub const LAKEFS_ACCESS_KEY_ID: &str = "AKIAIOSFODNN7PERAGO0";
pub const LAKEFS_SECRET_ACCESS_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPERAGOKEY0";
/// Bearer token of the apiserver's `admin` user (group `system:masters`).
pub const KUBE_ADMIN_TOKEN: &str = "perago-e2e-admin-token";

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap_or_default()
}

/// A running Conductor OSS server.
pub struct Conductor {
    /// API base URL including `/api`.
    pub api_url: String,
    pub version: String,
    _process: ServerProcess,
}

/// The Java runtime for Conductor 3.32 (Java 21 bytecode): `PERAGO_JAVA`, else a JDK 21+
/// under /usr/lib/jvm.
fn java() -> Result<PathBuf> {
    if let Some(java) = std::env::var_os("PERAGO_JAVA") {
        return Ok(java.into());
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/jvm")
        .context("listing /usr/lib/jvm (set PERAGO_JAVA to a Java 21+ binary)")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin/java")))
        .filter(|p| p.exists())
        .filter(|p| {
            let name = p.to_string_lossy();
            ["-21", "-22", "-23", "-24", "-25", "-26"]
                .iter()
                .any(|v| name.contains(v))
        })
        .collect();
    candidates.sort();
    candidates
        .pop()
        .context("no Java 21+ runtime under /usr/lib/jvm; set PERAGO_JAVA")
}

impl Conductor {
    pub async fn start(dir: &Path) -> Result<Self> {
        let jar = obtain("conductor")?;
        let port = free_port()?;
        let db = dir.join("conductor.db");
        // Tomcat and Conductor's payload store write under java.io.tmpdir: keep that in the
        // run's directory, which the harness removes.
        let tmp = dir.join("conductor-tmp");
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut cmd = Command::new(java()?);
        cmd.current_dir(dir)
            .arg(format!("-Djava.io.tmpdir={}", tmp.display()))
            .args([
                "-Xms256m",
                "-Xmx1g",
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                "-jar",
            ])
            .arg(&jar)
            .arg(format!("--server.port={port}"))
            .arg("--server.address=127.0.0.1")
            .arg(format!(
                "--spring.datasource.url=jdbc:sqlite:{}?busy_timeout=15000&journal_mode=WAL",
                db.display()
            ))
            .args([
                "--conductor.db.type=sqlite",
                "--conductor.queue.type=sqlite",
                "--conductor.indexing.type=sqlite",
                "--conductor.app.ownerEmailMandatory=false",
                "--conductor.app.taskExecutionPostponeDuration=1s",
                "--conductor.app.sweeperThreadCount=1",
                "--conductor.integrations.ai.enabled=false",
                "--conductor.scheduler.enabled=false",
                "--conductor.metrics-prometheus.enabled=false",
            ]);
        let mut process = ServerProcess::spawn("conductor", &mut cmd, dir.join("conductor.log"))?;
        let base = format!("http://127.0.0.1:{port}");
        let client = http_client();
        let took = wait_ready(&mut process, Duration::from_secs(240), || {
            let client = client.clone();
            let url = format!("{base}/health");
            async move {
                match client.get(url).send().await {
                    Ok(r) => r
                        .text()
                        .await
                        .is_ok_and(|t| t.replace(' ', "").contains("\"healthy\":true")),
                    Err(_) => false,
                }
            }
        })
        .await?;
        let version = client
            .get(format!("{base}/api/version"))
            .send()
            .await?
            .text()
            .await
            .unwrap_or_default();
        eprintln!("[e2e] conductor {version} ready on {base} in {took:.1?}");
        Ok(Self {
            api_url: format!("{base}/api"),
            version,
            _process: process,
        })
    }
}

/// A running lakeFS server with an admin user.
pub struct LakeFs {
    pub endpoint: String,
    _process: ServerProcess,
}

impl LakeFs {
    pub async fn start(dir: &Path) -> Result<Self> {
        let binary = obtain("lakefs")?;
        let port = free_port()?;
        let home = dir.join("lakefs");
        std::fs::create_dir_all(&home)?;
        let config = home.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                r#"listen_address: "127.0.0.1:{port}"
logging: {{format: text, level: WARN, output: "-"}}
database: {{type: local, local: {{path: "{home}/kv", sync_writes: false}}}}
blockstore: {{type: local, local: {{path: "{home}/blocks"}}}}
committed: {{local_cache: {{dir: "{home}/cache", size_bytes: 268435456}}, sstable: {{memory: {{cache_size_bytes: 67108864}}}}}}
auth: {{encrypt: {{secret_key: "perago-e2e-only-secret"}}}}
installation: {{user_name: admin, access_key_id: "{LAKEFS_ACCESS_KEY_ID}", secret_access_key: "{LAKEFS_SECRET_ACCESS_KEY}"}}
stats: {{enabled: false}}
email_subscription: {{enabled: false}}
security: {{check_latest_version: false, audit_check_url: ""}}
ui: {{enabled: false}}
"#,
                home = home.display()
            ),
        )?;
        let mut cmd = Command::new(binary);
        cmd.arg("run").arg("-c").arg(&config).current_dir(&home);
        let mut process = ServerProcess::spawn("lakefs", &mut cmd, dir.join("lakefs.log"))?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let client = http_client();
        let took = wait_ready(&mut process, Duration::from_secs(60), || {
            let client = client.clone();
            let url = format!("{endpoint}/api/v1/healthcheck");
            async move {
                client
                    .get(url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().as_u16() == 204)
            }
        })
        .await?;
        eprintln!("[e2e] lakefs ready on {endpoint} in {took:.1?}");
        Ok(Self {
            endpoint,
            _process: process,
        })
    }
}

/// A running etcd + kube-apiserver with token authentication.
pub struct Kube {
    pub server: String,
    pub kubeconfig: PathBuf,
    _etcd: ServerProcess,
    _apiserver: ServerProcess,
}

impl Kube {
    /// A client of this apiserver, as the admin user of its kubeconfig.
    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        Ok(kube::Client::try_from(config)?)
    }

    pub async fn start(dir: &Path) -> Result<Self> {
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
        wait_ready(&mut etcd, Duration::from_secs(30), || {
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
        let tokens = home.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{KUBE_ADMIN_TOKEN},admin,admin,\"system:masters\"\n"),
        )?;

        let port = free_port()?;
        let server = format!("https://127.0.0.1:{port}");
        let mut api_cmd = Command::new(apiserver_bin);
        api_cmd
            .arg(format!("--etcd-servers={etcd_url}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", home.join("pki").display()))
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg(format!("--service-account-issuer={server}"))
            .arg(format!("--service-account-key-file={}", sa_key.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa_key.display()
            ))
            .arg("--authorization-mode=RBAC")
            .arg(format!("--token-auth-file={}", tokens.display()))
            .args([
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
                "--max-requests-inflight=0",
                "--max-mutating-requests-inflight=0",
                "--v=0",
            ]);
        let mut apiserver = ServerProcess::spawn(
            "kube-apiserver",
            &mut api_cmd,
            dir.join("kube-apiserver.log"),
        )?;
        let took = wait_ready(&mut apiserver, Duration::from_secs(120), || {
            let client = client.clone();
            let url = format!("{server}/readyz");
            async move {
                client
                    .get(url)
                    .bearer_auth(KUBE_ADMIN_TOKEN)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await?;
        let kubeconfig = home.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: perago-e2e\n  cluster:\n    server: {server}\n    \
                 insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {KUBE_ADMIN_TOKEN}\n\
                 contexts:\n- name: perago-e2e\n  context:\n    cluster: perago-e2e\n    user: admin\n    \
                 namespace: default\ncurrent-context: perago-e2e\n"
            ),
        )?;
        eprintln!("[e2e] kube-apiserver ready on {server} in {took:.1?}");
        Ok(Self {
            server,
            kubeconfig,
            _etcd: etcd,
            _apiserver: apiserver,
        })
    }
}

/// Which servers to start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selection {
    pub conductor: bool,
    pub lakefs: bool,
    pub kube: bool,
}

impl Selection {
    pub const ALL: Self = Self {
        conductor: true,
        lakefs: true,
        kube: true,
    };

    /// Parse `all` or a comma-separated list of `conductor`, `lakefs`, `kube`.
    pub fn parse(text: &str) -> Result<Self> {
        let mut s = Self::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => s = Self::ALL,
                "conductor" => s.conductor = true,
                "lakefs" => s.lakefs = true,
                "kube" => s.kube = true,
                other => bail!("unknown service '{other}' (conductor, lakefs, kube, all)"),
            }
        }
        Ok(s)
    }
}

/// A set of running servers sharing one temporary directory; dropping it stops them all and
/// removes the directory (and so does the janitor, when the process exits without dropping it),
/// unless `PERAGO_E2E_KEEP` is set, for looking at the servers' files afterwards.
pub struct Services {
    pub conductor: Option<Conductor>,
    pub lakefs: Option<LakeFs>,
    pub kube: Option<Kube>,
    dir: tempfile::TempDir,
    _janitor: Option<std::process::Child>,
}

impl Services {
    /// Start the selected servers concurrently and wait until each is healthy.
    pub async fn start(selection: Selection) -> Result<Self> {
        let keep = std::env::var_os("PERAGO_E2E_KEEP").is_some();
        let dir = tempfile::Builder::new()
            .prefix("perago-e2e-")
            .disable_cleanup(keep)
            .tempdir()?;
        let janitor = match keep {
            true => None,
            false => Some(crate::process::remove_after_exit(dir.path())?),
        };
        let path = dir.path();
        let (conductor, lakefs, kube) = tokio::join!(
            async {
                if selection.conductor {
                    Conductor::start(path).await.map(Some)
                } else {
                    Ok(None)
                }
            },
            async {
                if selection.lakefs {
                    LakeFs::start(path).await.map(Some)
                } else {
                    Ok(None)
                }
            },
            async {
                if selection.kube {
                    Kube::start(path).await.map(Some)
                } else {
                    Ok(None)
                }
            },
        );
        Ok(Self {
            conductor: conductor?,
            lakefs: lakefs?,
            kube: kube?,
            dir,
            _janitor: janitor,
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The environment a client needs, as `KEY=value` pairs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(c) = &self.conductor {
            env.push(("CONDUCTOR_SERVER_URL", c.api_url.clone()));
        }
        if let Some(l) = &self.lakefs {
            env.push(("LAKECTL_SERVER_ENDPOINT_URL", l.endpoint.clone()));
            env.push((
                "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
                LAKEFS_ACCESS_KEY_ID.to_owned(),
            ));
            env.push((
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                LAKEFS_SECRET_ACCESS_KEY.to_owned(),
            ));
        }
        if let Some(k) = &self.kube {
            env.push(("KUBECONFIG", k.kubeconfig.display().to_string()));
        }
        env
    }

    pub fn conductor(&self) -> &Conductor {
        self.conductor.as_ref().expect("Conductor was not selected")
    }

    pub fn lakefs(&self) -> &LakeFs {
        self.lakefs.as_ref().expect("lakeFS was not selected")
    }

    pub fn kube(&self) -> &Kube {
        self.kube.as_ref().expect("kube-apiserver was not selected")
    }
}
