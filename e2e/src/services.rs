//! The real servers: Conductor OSS, lakeFS, and etcd + kube-apiserver, each on free loopback
//! ports with its state in a per-run temporary directory.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::faults::FaultProxy;
use crate::node::{
    BRIDGE_IP, Containerd, KUBERNETES_SERVICE_IP, Machine, Node, NodePki, SERVICE_RANGE,
};
use crate::pki::{Pair, Usage};
use crate::process::{Restartable, ServerProcess, free_port, obtain, wait_ready};
use crate::registry::{Registry, chart_version};
use crate::storage::{
    BUCKET, ObjectStore, Postgres, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, Storage,
};

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

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
    /// Its directory and URL, to start it again ([`Conductor::crash_and_restart`]).
    dir: PathBuf,
    base: String,
    // Dropped in this order: the server stops before its database goes.
    server: Restartable,
    _database: Option<tempfile::TempDir>,
    _postgres: Option<Arc<Postgres>>,
}

impl Conductor {
    /// Kill the server at once (SIGKILL: a crash, every call in flight cut), leave it down for
    /// `down`, and start it again on the same state and port; waits until it is healthy.
    /// Only a Conductor on PostgreSQL keeps its workflows and queues through this (SQLite's
    /// database is in memory).
    pub async fn crash_and_restart(&self, down: Duration) -> Result<()> {
        self.server
            .crash_and_restart(down, async |mut command| {
                let (process, took) =
                    spawn_healthy("conductor", &mut command, &self.dir, &self.base).await?;
                eprintln!("[e2e] conductor restarted on {} in {took:.1?}", self.base);
                Ok(process)
            })
            .await
    }
}

/// Where a Conductor keeps its state.
enum ConductorStore<'a> {
    /// SQLite files in this directory.
    Sqlite(&'a Path),
    /// This JDBC URL of a PostgreSQL database.
    Postgres(&'a str),
}

/// The Java runtime for Conductor 3.32 (Java 21 bytecode): `PERAGO_JAVA`, else a JDK 21+
/// under /usr/lib/jvm.
pub(crate) fn java() -> Result<PathBuf> {
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
    pub async fn start(dir: &Path, host: IpAddr) -> Result<Self> {
        Self::start_serving(dir, host, None).await
    }

    /// A Conductor with its files in `dir`, serving HTTPS with `tls` (a certificate and its
    /// key, PEM) when given.
    pub async fn start_serving(dir: &Path, host: IpAddr, tls: Option<&Pair>) -> Result<Self> {
        Self::start_with(dir, host, tls, None).await
    }

    /// A Conductor whose workflows, queues and index live in a database of `postgres`, so that
    /// a restarted server keeps them.
    pub async fn start_on_postgres(
        dir: &Path,
        host: IpAddr,
        postgres: Arc<Postgres>,
    ) -> Result<Self> {
        Self::start_with(dir, host, None, Some(postgres)).await
    }

    async fn start_with(
        dir: &Path,
        host: IpAddr,
        tls: Option<&Pair>,
        postgres: Option<Arc<Postgres>>,
    ) -> Result<Self> {
        let jar = obtain("conductor")?;
        let java = java()?;
        let options: Vec<String> = class_archive(&java, &jar, dir)
            .await
            .map(|archive| {
                // Checked against its checksum: a damaged archive is left unused, not mapped.
                vec![
                    "-XX:+VerifySharedSpaces".to_owned(),
                    format!("-XX:SharedArchiveFile={}", archive.display()),
                ]
            })
            .unwrap_or_default();
        let (database, jdbc) = match &postgres {
            Some(postgres) => (None, Some(postgres.database("conductor").await?)),
            None => (database_in_memory()?, None),
        };
        let store = match &jdbc {
            Some(url) => ConductorStore::Postgres(url),
            None => ConductorStore::Sqlite(database.as_ref().map_or(dir, |d| d.path())),
        };
        let port = free_port()?;
        let mut cmd = conductor_command(&java, &jar, dir, store, host, port, &options)?;
        let scheme = match tls {
            Some(pair) => {
                cmd.arg("--server.ssl.enabled=true")
                    .arg(format!(
                        "--server.ssl.certificate=file:{}",
                        pair.cert.display()
                    ))
                    .arg(format!(
                        "--server.ssl.certificate-private-key=file:{}",
                        pair.key.display()
                    ));
                "https"
            }
            None => "http",
        };
        let base = format!("{scheme}://{host}:{port}");
        let (process, took) = spawn_healthy("conductor", &mut cmd, dir, &base).await?;
        let client = http_client();
        let version = client
            .get(format!("{base}/api/version"))
            .send()
            .await?
            .text()
            .await
            .unwrap_or_default();
        let on = if postgres.is_some() {
            " (PostgreSQL)"
        } else {
            ""
        };
        eprintln!("[e2e] conductor {version}{on} ready on {base} in {took:.1?}");
        Ok(Self {
            api_url: format!("{base}/api"),
            version,
            dir: dir.to_owned(),
            base,
            server: Restartable::running(cmd, process),
            _database: database,
            _postgres: postgres,
        })
    }
}

/// A directory in memory (tmpfs) for Conductor's SQLite database, when the machine has
/// /dev/shm and the run's files are not kept (`PERAGO_E2E_KEEP`). SQLite syncs every commit,
/// and on a disk that the node's suites keep busy (containerd unpacking images, etcd) one
/// sync can outlast a task's 10 s response timeout; the harness's Conductor is thrown away
/// with its run, so its durability buys nothing. Removed on drop, or by the janitor once this
/// process is gone (servers shared by a test binary are never dropped).
fn database_in_memory() -> Result<Option<tempfile::TempDir>> {
    let shm = Path::new("/dev/shm");
    if std::env::var_os("PERAGO_E2E_KEEP").is_some() || !shm.is_dir() {
        return Ok(None);
    }
    let database = tempfile::Builder::new()
        .prefix("perago-e2e-conductor-")
        .tempdir_in(shm)
        .context("making Conductor's database directory in /dev/shm")?;
    crate::process::remove_after_exit(database.path())?;
    Ok(Some(database))
}

/// The command of a Conductor server with its files in `dir` and its state in `store`,
/// listening on `host:port`; `jvm_options` go before `-jar`.
fn conductor_command(
    java: &Path,
    jar: &Path,
    dir: &Path,
    store: ConductorStore<'_>,
    host: IpAddr,
    port: u16,
    jvm_options: &[String],
) -> Result<Command> {
    // Tomcat and Conductor's payload store write under java.io.tmpdir: keep that in the
    // run's directory, which the harness removes.
    let tmp = dir.join("conductor-tmp");
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut cmd = Command::new(java);
    cmd.current_dir(dir)
        .arg(format!("-Djava.io.tmpdir={}", tmp.display()))
        .args([
            "-Xms256m",
            "-Xmx1g",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
        ])
        .args(jvm_options)
        .arg("-jar")
        .arg(jar)
        .arg(format!("--server.port={port}"))
        .arg(format!("--server.address={host}"));
    match store {
        ConductorStore::Sqlite(database_dir) => cmd
            .arg(format!(
                "--spring.datasource.url=jdbc:sqlite:{}?busy_timeout=15000&journal_mode=WAL",
                database_dir.join("conductor.db").display()
            ))
            .args([
                "--conductor.db.type=sqlite",
                "--conductor.queue.type=sqlite",
                "--conductor.indexing.type=sqlite",
            ]),
        ConductorStore::Postgres(url) => cmd.arg(format!("--spring.datasource.url={url}")).args([
            "--spring.datasource.username=perago",
            "--spring.datasource.password=",
            "--conductor.db.type=postgres",
            "--conductor.queue.type=postgres",
            "--conductor.indexing.type=postgres",
            "--conductor.elasticsearch.version=0",
            // TaskDefs are cached for 60 s by default: tests register and use them at once.
            "--conductor.postgres.taskDefCacheRefreshInterval=1s",
        ]),
    };
    cmd.args([
        "--conductor.app.ownerEmailMandatory=false",
        "--conductor.app.taskExecutionPostponeDuration=1s",
        "--conductor.app.sweeperThreadCount=1",
        "--conductor.integrations.ai.enabled=false",
        "--conductor.scheduler.enabled=false",
        "--conductor.metrics-prometheus.enabled=false",
    ]);
    Ok(cmd)
}

/// Start a Conductor command (its log `conductor.log` in `dir`) and wait until the server at
/// `base` says it is healthy; also how long that took.
async fn spawn_healthy(
    name: &str,
    cmd: &mut Command,
    dir: &Path,
    base: &str,
) -> Result<(ServerProcess, Duration)> {
    let mut process = ServerProcess::spawn(name, cmd, dir.join("conductor.log"))?;
    let client = http_client();
    let url = format!("{base}/health");
    let took = wait_ready(&mut process, Duration::from_secs(240), || {
        let answer = client.get(&url).send();
        async move {
            match answer.await {
                Ok(r) => r
                    .text()
                    .await
                    .is_ok_and(|t| t.replace(' ', "").contains("\"healthy\":true")),
                Err(_) => false,
            }
        }
    })
    .await?;
    Ok((process, took))
}

/// The class-data archive of Conductor for this JVM (`cds-<JDK>.jsa` beside the extracted
/// server), made on first use by one start of the server that writes the classes it loaded
/// when it stops. With it the JVM maps those classes instead of loading and verifying them
/// again: with the extracted jar, Conductor starts in about 4 s instead of 15, at every start
/// of every test binary.
/// `None` (and one line saying why) when it cannot be made; the server then starts without.
async fn class_archive(java: &Path, jar: &Path, dir: &Path) -> Option<PathBuf> {
    let jdk = java
        .parent()?
        .parent()?
        .file_name()?
        .to_string_lossy()
        .into_owned();
    let archive = jar.parent()?.parent()?.join(format!("cds-{jdk}.jsa"));
    if archive.is_file() {
        return Some(archive);
    }
    let started = std::time::Instant::now();
    match train_class_archive(java, jar, &dir.join("conductor-cds"), &archive).await {
        Ok(()) => {
            eprintln!(
                "[e2e] made Conductor's class-data archive {} in {:.0?}",
                archive.display(),
                started.elapsed()
            );
            Some(archive)
        }
        Err(e) => {
            eprintln!("[e2e] Conductor starts without a class-data archive: {e:#}");
            None
        }
    }
}

async fn train_class_archive(java: &Path, jar: &Path, dir: &Path, archive: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Written under a name of this process, then renamed: a run stopped half-way, or two
    // making it at once, never leave a partial archive under the final name.
    let partial = archive.with_extension(format!("jsa.{}", std::process::id()));
    let port = free_port()?;
    let host = LOOPBACK;
    let options = [
        "-XX:+VerifySharedSpaces".to_owned(),
        format!("-XX:ArchiveClassesAtExit={}", partial.display()),
    ];
    let mut cmd = conductor_command(
        java,
        jar,
        dir,
        ConductorStore::Sqlite(dir),
        host,
        port,
        &options,
    )?;
    // The archive is written as the JVM exits: give it time to after the SIGTERM.
    cmd.env("PERAGO_WATCHDOG_GRACE_SECONDS", "120");
    let base = format!("http://{host}:{port}");
    let (process, _) = spawn_healthy(
        "conductor (making its class-data archive)",
        &mut cmd,
        dir,
        &base,
    )
    .await?;
    // Dropping the server stops it (SIGTERM, then the grace above), which writes the archive.
    let log = process.log_path().to_owned();
    tokio::task::spawn_blocking(move || drop(process)).await?;
    if !std::fs::metadata(&partial).is_ok_and(|m| m.len() > 0) {
        let _ = std::fs::remove_file(&partial);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        bail!(
            "the training start wrote no archive; end of {}:\n{}",
            log.display(),
            lines[lines.len().saturating_sub(20)..].join("\n")
        );
    }
    std::fs::rename(&partial, archive)
        .with_context(|| format!("renaming {} to {}", partial.display(), archive.display()))
}

/// A running lakeFS server with an admin user, on the embedded storage or on PostgreSQL and
/// an S3 server ([`crate::storage`]).
pub struct LakeFs {
    pub endpoint: String,
    pub storage: Storage,
    /// Its log, to start it again ([`LakeFs::crash_and_restart`]).
    log: PathBuf,
    // Dropped in this order: lakeFS stops before its stores.
    server: Restartable,
    /// The S3 server, on [`Storage::PostgresS3`].
    pub object_store: Option<ObjectStore>,
    /// The fault proxy the presigned URLs point at, when lakeFS was started behind one
    /// ([`LakeFs::start_presigning_through_proxy`]).
    pub object_store_proxy: Option<FaultProxy>,
    pub postgres: Option<Arc<Postgres>>,
}

impl LakeFs {
    pub async fn start(dir: &Path, host: IpAddr) -> Result<Self> {
        Self::start_serving(dir, host, None).await
    }

    /// A lakeFS with its files in `dir`, serving HTTPS with `tls` (a certificate and its key,
    /// PEM) when given.
    pub async fn start_serving(dir: &Path, host: IpAddr, tls: Option<&Pair>) -> Result<Self> {
        Self::start_on(dir, host, tls, Storage::Embedded).await
    }

    /// A lakeFS on `storage`.
    pub async fn start_on(
        dir: &Path,
        host: IpAddr,
        tls: Option<&Pair>,
        storage: Storage,
    ) -> Result<Self> {
        Self::start_with(dir, host, tls, storage, None, None).await
    }

    /// A lakeFS on PostgreSQL and the S3 server, its metadata in `postgres` (shared with a
    /// Conductor).
    pub async fn start_sharing(dir: &Path, host: IpAddr, postgres: Arc<Postgres>) -> Result<Self> {
        Self::start_with(dir, host, None, Storage::PostgresS3, None, Some(postgres)).await
    }

    /// A lakeFS on PostgreSQL and the S3 server whose presigned URLs expire after `expiry`
    /// and point at a fault proxy in front of the S3 server ([`Self::object_store_proxy`]),
    /// through which the object store can be slowed, refused or cut off.
    pub async fn start_presigning_through_proxy(
        dir: &Path,
        host: IpAddr,
        expiry: Duration,
    ) -> Result<Self> {
        Self::start_with(dir, host, None, Storage::PostgresS3, Some(expiry), None).await
    }

    async fn start_with(
        dir: &Path,
        host: IpAddr,
        tls: Option<&Pair>,
        storage: Storage,
        proxied_expiry: Option<Duration>,
        shared: Option<Arc<Postgres>>,
    ) -> Result<Self> {
        let binary = obtain("lakefs")?;
        let port = free_port()?;
        let home = dir.join("lakefs");
        std::fs::create_dir_all(&home)?;
        let (postgres, object_store) = match storage {
            Storage::Embedded => (None, None),
            Storage::PostgresS3 => {
                let postgres = async {
                    match shared {
                        Some(postgres) => Ok(postgres),
                        None => Postgres::start(dir, host).await.map(Arc::new),
                    }
                };
                let (postgres, store) = tokio::join!(postgres, ObjectStore::start(dir, host));
                (Some(postgres?), Some(store?))
            }
        };
        let object_store_proxy = match (&object_store, proxied_expiry) {
            (Some(store), Some(_)) => Some(FaultProxy::start_keeping_host(&store.endpoint).await?),
            _ => None,
        };
        let expiry = proxied_expiry
            .unwrap_or(Duration::from_secs(900))
            .as_secs()
            .max(1);
        let stores = match (&postgres, &object_store) {
            (Some(postgres), Some(store)) => format!(
                "database: {{type: postgres, postgres: {{connection_string: \"{}\"}}}}\n\
                 blockstore: {{type: s3, s3: {{endpoint: \"{}\", force_path_style: true, \
                 region: us-east-1, discover_bucket_region: false, pre_signed_expiry: {expiry}s, \
                 pre_signed_endpoint: \"{}\", \
                 credentials: {{access_key_id: \"{S3_ACCESS_KEY_ID}\", \
                 secret_access_key: \"{S3_SECRET_ACCESS_KEY}\"}}}}}}\n",
                postgres.url,
                store.endpoint,
                object_store_proxy
                    .as_ref()
                    .map_or(&store.endpoint, |p| &p.url),
            ),
            _ => format!(
                "database: {{type: local, local: {{path: \"{home}/kv\", sync_writes: false}}}}\n\
                 blockstore: {{type: local, local: {{path: \"{home}/blocks\"}}}}\n",
                home = home.display()
            ),
        };
        let config = home.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                r#"listen_address: "{host}:{port}"
logging: {{format: text, level: WARN, output: "-"}}
{stores}committed: {{local_cache: {{dir: "{home}/cache", size_bytes: 268435456}}, sstable: {{memory: {{cache_size_bytes: 67108864}}}}}}
auth: {{encrypt: {{secret_key: "perago-e2e-only-secret"}}}}
installation: {{user_name: admin, access_key_id: "{LAKEFS_ACCESS_KEY_ID}", secret_access_key: "{LAKEFS_SECRET_ACCESS_KEY}"}}
stats: {{enabled: false}}
email_subscription: {{enabled: false}}
security: {{check_latest_version: false, audit_check_url: ""}}
ui: {{enabled: false}}
{tls}"#,
                home = home.display(),
                tls = tls.map_or(String::new(), |pair| format!(
                    "tls: {{enabled: true, cert_file: \"{}\", key_file: \"{}\"}}\n",
                    pair.cert.display(),
                    pair.key.display()
                )),
            ),
        )?;
        let mut cmd = Command::new(binary);
        cmd.arg("run").arg("-c").arg(&config).current_dir(&home);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://{host}:{port}");
        let log = dir.join("lakefs.log");
        let (process, took) = serve_lakefs(&mut cmd, &log, &endpoint).await?;
        let client = http_client();
        if storage == Storage::PostgresS3 {
            // lakeFS sets its admin up by itself only on its embedded stores.
            setup_admin(&client, &endpoint).await?;
        }
        eprintln!("[e2e] lakefs ({storage:?}) ready on {endpoint} in {took:.1?}");
        Ok(Self {
            endpoint,
            storage,
            object_store,
            object_store_proxy,
            log,
            server: Restartable::running(cmd, process),
            postgres,
        })
    }

    /// Kill the server at once (SIGKILL: a crash, every call in flight cut), leave it down for
    /// `down`, and start it again on the same stores and port; waits until it is healthy.
    pub async fn crash_and_restart(&self, down: Duration) -> Result<()> {
        self.server
            .crash_and_restart(down, async |mut command| {
                let (process, took) = serve_lakefs(&mut command, &self.log, &self.endpoint).await?;
                eprintln!("[e2e] lakefs restarted on {} in {took:.1?}", self.endpoint);
                Ok(process)
            })
            .await
    }

    /// The storage namespace of a new repository `name`.
    pub fn namespace(&self, name: &str) -> String {
        match self.storage {
            Storage::Embedded => format!("local://{name}"),
            Storage::PostgresS3 => format!("s3://{BUCKET}/{name}"),
        }
    }

    /// The hosts presigned URLs point at, as a sidecar's `PERAGO_LAKEFS_OBJECT_STORE_HOSTS`
    /// takes them; empty on the embedded storage, which cannot presign.
    pub fn object_store_hosts(&self) -> String {
        if let Some(proxy) = &self.object_store_proxy {
            return proxy.url.trim_start_matches("http://").to_owned();
        }
        self.object_store
            .as_ref()
            .map_or(String::new(), |s| s.authority.clone())
    }
}

/// Start lakeFS's command and wait until `endpoint` says it is healthy.
async fn serve_lakefs(
    command: &mut Command,
    log: &Path,
    endpoint: &str,
) -> Result<(ServerProcess, Duration)> {
    let mut process = ServerProcess::spawn("lakefs", command, log.to_owned())?;
    let client = http_client();
    let took = wait_ready(&mut process, Duration::from_secs(60), || {
        let answer = client.get(format!("{endpoint}/api/v1/healthcheck")).send();
        async move { answer.await.is_ok_and(|r| r.status().as_u16() == 204) }
    })
    .await?;
    Ok((process, took))
}

/// The harness's admin key, set through lakeFS's setup call.
async fn setup_admin(client: &reqwest::Client, endpoint: &str) -> Result<()> {
    let answer = client
        .post(format!("{endpoint}/api/v1/setup_lakefs"))
        .json(&serde_json::json!({
            "username": "admin",
            "key": {"access_key_id": LAKEFS_ACCESS_KEY_ID, "secret_access_key": LAKEFS_SECRET_ACCESS_KEY},
        }))
        .send()
        .await
        .context("setting lakeFS's admin up")?;
    let status = answer.status();
    if !status.is_success() && status != reqwest::StatusCode::CONFLICT {
        bail!(
            "setting lakeFS's admin up: HTTP {status}: {}",
            answer.text().await.unwrap_or_default()
        );
    }
    Ok(())
}

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

/// Which servers to start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selection {
    pub conductor: bool,
    pub lakefs: bool,
    pub kube: bool,
    /// The whole single-node cluster (implies `kube`); every server then listens on the pod
    /// bridge's address, where pods reach it.
    pub node: bool,
    /// lakeFS's storage; `PERAGO_E2E_STORAGE` picks it when this is the default.
    pub storage: Storage,
    /// The node's own disk of this many MiB (see [`crate::node::NodeDisk`]); `None`: the
    /// host's, with no evictions for disk.
    pub node_disk_mib: Option<u32>,
}

impl Selection {
    /// Conductor, lakeFS and the whole node.
    pub const ALL: Self = Self {
        conductor: true,
        lakefs: true,
        kube: true,
        node: true,
        storage: Storage::Embedded,
        node_disk_mib: None,
    };

    /// Parse `all` or a comma-separated list of `conductor`, `lakefs`, `kube` (the API alone),
    /// `node` (the API and the node), `s3` (lakeFS on PostgreSQL and an S3 server).
    pub fn parse(text: &str) -> Result<Self> {
        let mut s = Self::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => s = Self::ALL,
                "conductor" => s.conductor = true,
                "lakefs" => s.lakefs = true,
                "kube" => s.kube = true,
                "node" => (s.kube, s.node) = (true, true),
                "s3" => (s.lakefs, s.storage) = (true, Storage::PostgresS3),
                other => {
                    bail!("unknown service '{other}' (conductor, lakefs, kube, node, s3, all)")
                }
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
    pub node: Option<Node>,
    /// Where the servers listen: loopback, or the pod bridge's address with a node.
    pub host: IpAddr,
    // Dropped last: the node's janitor must outlive every server.
    dir: tempfile::TempDir,
    _janitor: Option<std::process::Child>,
    _machine: Option<Machine>,
}

impl Services {
    /// Start the selected servers concurrently and wait until each is healthy.
    pub async fn start(selection: Selection) -> Result<Self> {
        let keep = std::env::var_os("PERAGO_E2E_KEEP").is_some();
        let dir = tempfile::Builder::new()
            .prefix("perago-e2e-")
            // With a node the directory holds mounts: only the node's janitor removes it,
            // after unmounting them.
            .disable_cleanup(keep || selection.node)
            .tempdir()?;
        let path = dir.path();
        let (machine, janitor) = match (selection.node, keep) {
            // Waiting for another run's node blocks: off the async runtime's threads.
            (true, _) => {
                let owned = path.to_owned();
                let machine =
                    tokio::task::spawn_blocking(move || crate::node::claim_machine(&owned))
                        .await
                        .context("claiming the machine for the node")??;
                (Some(machine), None)
            }
            (false, true) => (None, None),
            (false, false) => (None, Some(crate::process::remove_after_exit(path)?)),
        };
        let host = match selection.node {
            true => BRIDGE_IP.into(),
            false => LOOPBACK,
        };
        let storage = match selection.storage {
            Storage::Embedded => Storage::from_env()?,
            chosen => chosen,
        };
        // On PostgreSQL and S3, Conductor keeps its state in the same PostgreSQL as lakeFS.
        let postgres = match (storage, selection.lakefs) {
            (Storage::PostgresS3, true) => Some(Arc::new(Postgres::start(path, host).await?)),
            _ => None,
        };
        // The cluster (the apiserver, then the node) starts beside Conductor and lakeFS: the
        // node needs neither, and Conductor's start is the longest.
        let cluster = async {
            let (kube, containerd) = tokio::join!(
                async {
                    if selection.kube || selection.node {
                        Kube::start(path, selection.node).await.map(Some)
                    } else {
                        Ok(None)
                    }
                },
                async {
                    if !selection.node {
                        return anyhow::Ok(None);
                    }
                    // The release the node installs, pushed as `make release` pushes one.
                    // Nothing of the node's start needs it: it is published meanwhile.
                    let registry = Registry::start(path, host).await?;
                    let (owned, prefix) = (path.to_owned(), registry.prefix());
                    let publishing = tokio::task::spawn_blocking(move || {
                        crate::registry::publish(&prefix, &owned, &chart_version())
                    });
                    let owned = path.to_owned();
                    let images =
                        tokio::task::spawn_blocking(move || crate::node::build_images(&owned))
                            .await
                            .context("assembling the node's images")??;
                    let containerd = Containerd::start(path, &images, &registry.host).await?;
                    Ok(Some((containerd, registry, publishing)))
                },
            );
            let (kube, containerd) = (kube?, containerd?);
            let node = match (&kube, containerd) {
                (Some(kube), Some((containerd, registry, publishing))) => {
                    let pki = kube
                        .pki
                        .as_ref()
                        .context("the node's apiserver has no PKI")?;
                    let client = kube.client().await?;
                    let release = async { publishing.await.context("publishing the release")? };
                    let node = Node::start(
                        path,
                        pki,
                        (&kube.server, client),
                        containerd,
                        (registry, release),
                        selection.node_disk_mib,
                    );
                    Some(node.await?)
                }
                _ => None,
            };
            anyhow::Ok((kube, node))
        };
        let (conductor, lakefs, cluster) = tokio::join!(
            async {
                match (selection.conductor, &postgres) {
                    (false, _) => Ok(None),
                    (true, None) => Conductor::start(path, host).await.map(Some),
                    (true, Some(postgres)) => {
                        Conductor::start_on_postgres(path, host, Arc::clone(postgres))
                            .await
                            .map(Some)
                    }
                }
            },
            async {
                match (selection.lakefs, &postgres) {
                    (false, _) => Ok(None),
                    (true, None) => LakeFs::start_on(path, host, None, storage).await.map(Some),
                    (true, Some(postgres)) => {
                        LakeFs::start_sharing(path, host, Arc::clone(postgres))
                            .await
                            .map(Some)
                    }
                }
            },
            cluster,
        );
        let (kube, node) = cluster?;
        Ok(Self {
            conductor: conductor?,
            lakefs: lakefs?,
            kube,
            node,
            host,
            dir,
            _janitor: janitor,
            _machine: machine,
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
            if l.object_store.is_some() {
                env.push(("PERAGO_LAKEFS_OBJECT_STORE_HOSTS", l.object_store_hosts()));
            }
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

    pub fn node(&self) -> &Node {
        self.node.as_ref().expect("the node was not selected")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_names_its_servers_and_lakefs_storage() {
        let s = Selection::parse("conductor, s3").unwrap();
        assert!(s.conductor && s.lakefs && !s.kube && !s.node);
        assert_eq!(s.storage, Storage::PostgresS3);
        let s = Selection::parse("all").unwrap();
        assert!(s.node && s.kube && s.lakefs);
        assert_eq!(s.storage, Storage::Embedded);
        assert!(
            Selection::parse("lakefs,minio")
                .unwrap_err()
                .to_string()
                .contains("unknown service 'minio'")
        );
    }
}
