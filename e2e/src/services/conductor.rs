//! Conductor OSS from its boot jar, on SQLite in memory or PostgreSQL.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::{LOOPBACK, http_client};
use crate::pki::Pair;
use crate::process::{Restartable, ServerProcess, free_port, obtain, wait_ready};
use crate::storage::Postgres;

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
