//! lakeFS's storage as production runs it: metadata in PostgreSQL (Debian's server, one
//! cluster per run) and objects in an S3 server (s3proxy, from Maven Central, on its
//! file-system backend), addressed path-style and presigning URLs. The embedded profile
//! (Badger metadata, local blockstore) stays the default: it starts in a second and cannot
//! presign.
//!
//! `PERAGO_E2E_STORAGE=s3` runs every suite's lakeFS on this profile, with Conductor keeping its
//! workflows and queues in the same PostgreSQL; `perago-e2e up --services all,s3` starts it by
//! hand.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::process::{Restartable, ServerProcess, free_port, obtain, wait_ready};

/// The S3 key pair of the object store (test-only values).
pub const S3_ACCESS_KEY_ID: &str = "AKIAPERAGOS3PROXY000";
pub const S3_SECRET_ACCESS_KEY: &str = "perago/e2e/only/s3/secret/key/000000000";
/// The bucket lakeFS keeps its repositories in.
pub const BUCKET: &str = "perago";

/// Where lakeFS keeps metadata and objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Storage {
    /// Badger and the local blockstore, in the run's directory.
    #[default]
    Embedded,
    /// PostgreSQL and an S3 server.
    PostgresS3,
}

impl Storage {
    /// `PERAGO_E2E_STORAGE`: `embedded` (or unset) or `s3`.
    pub fn from_env() -> Result<Self> {
        match std::env::var("PERAGO_E2E_STORAGE")
            .as_deref()
            .map(str::trim)
        {
            Err(_) | Ok("" | "embedded") => Ok(Self::Embedded),
            Ok("s3") => Ok(Self::PostgresS3),
            Ok(other) => bail!("PERAGO_E2E_STORAGE is '{other}'; it takes embedded or s3"),
        }
    }
}

/// A PostgreSQL server of its own, its data in memory (/dev/shm) when the machine has it: the
/// harness's lakeFS is thrown away with its run.
pub struct Postgres {
    /// `postgres://…` of the `postgres` database, for lakeFS's `connection_string`.
    pub url: String,
    bin: PathBuf,
    log: PathBuf,
    host: IpAddr,
    port: u16,
    // The server stops before its directory goes.
    server: Restartable,
    _data: tempfile::TempDir,
}

/// The newest PostgreSQL under /usr/lib/postgresql (Debian's `postgresql` package).
fn postgres_bin() -> Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("listing /usr/lib/postgresql: install Debian's postgresql package (e2e/bin/prerequisites does)")?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .context("no PostgreSQL server under /usr/lib/postgresql/*/bin")
}

/// PostgreSQL refuses to run as root: as root, its commands run as the `postgres` user that
/// Debian's package made, on a directory that user owns.
fn as_server_user(program: &Path, data: &Path) -> Result<Command> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(Command::new(program));
    }
    let user = nix::unistd::User::from_name("postgres")?
        .context("running as root, PostgreSQL needs the 'postgres' user (Debian's postgresql package makes it)")?;
    std::os::unix::fs::chown(data, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
        .with_context(|| format!("giving {} to the postgres user", data.display()))?;
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .arg("--clear-groups")
        .arg(program);
    Ok(command)
}

impl Postgres {
    pub async fn start(dir: &Path, host: IpAddr) -> Result<Self> {
        let bin = postgres_bin()?;
        let shm = Path::new("/dev/shm");
        let parent = if shm.is_dir() && std::env::var_os("PERAGO_E2E_KEEP").is_none() {
            shm
        } else {
            dir
        };
        let data = tempfile::Builder::new()
            .prefix("perago-e2e-postgres-")
            .tempdir_in(parent)
            .context("making PostgreSQL's directory")?;
        crate::process::remove_after_exit(data.path())?;
        let cluster = data.path().join("cluster");
        std::fs::create_dir(&cluster)?;
        let started = std::time::Instant::now();
        let initdb = as_server_user(&bin.join("initdb"), &cluster)?
            .args(["-D"])
            .arg(&cluster)
            .args(["-U", "perago", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .context("running initdb")?;
        if !initdb.status.success() {
            bail!(
                "initdb failed ({}): {}",
                initdb.status,
                String::from_utf8_lossy(&initdb.stderr)
            );
        }
        // initdb trusts loopback only; on the node the servers reach it on the bridge address.
        let hba = cluster.join("pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba).context("reading pg_hba.conf")?;
        rules.push_str(&format!("host all all {host}/32 trust\n"));
        std::fs::write(&hba, rules).context("writing pg_hba.conf")?;
        let port = free_port()?;
        let mut command = as_server_user(&bin.join("postgres"), &cluster)?;
        command
            .arg("-D")
            .arg(&cluster)
            .args(["-h", &host.to_string(), "-p", &port.to_string()])
            // No socket file: TCP only. A commit is written to the kernel before it is
            // answered (synchronous_commit stays on), so a crash of the server loses nothing
            // it confirmed; only the machine's own crash could, which no test makes, so nothing
            // is synced to the disk.
            .args(["-c", "unix_socket_directories=", "-c", "fsync=off"])
            .args(["-c", "full_page_writes=off"]);
        let postgres = Self {
            url: format!("postgres://perago@{host}:{port}/postgres?sslmode=disable"),
            bin,
            log: dir.join("postgres.log"),
            host,
            port,
            server: Restartable::new(command),
            _data: data,
        };
        postgres
            .server
            .start(async |c| postgres.serve(c).await)
            .await?;
        eprintln!(
            "[e2e] postgres ready on {host}:{port} in {:.1?}",
            started.elapsed()
        );
        Ok(postgres)
    }

    /// Run the server's command and wait until it takes connections.
    async fn serve(&self, mut command: Command) -> Result<ServerProcess> {
        let mut process = ServerProcess::spawn("postgres", &mut command, self.log.clone())?;
        let (host, port) = (self.host, self.port);
        wait_ready(&mut process, Duration::from_secs(60), || async move {
            tokio::net::TcpStream::connect((host, port)).await.is_ok()
        })
        .await?;
        Ok(process)
    }

    /// A new database `name` on this server; its JDBC URL.
    pub async fn database(&self, name: &str) -> Result<String> {
        let out = tokio::process::Command::new(self.bin.join("createdb"))
            .args(["-h", &self.host.to_string(), "-p", &self.port.to_string()])
            .args(["-U", "perago", name])
            .output()
            .await
            .context("running createdb")?;
        if !out.status.success() {
            bail!(
                "createdb {name} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(format!(
            "jdbc:postgresql://{}:{}/{name}",
            self.host, self.port
        ))
    }

    /// Kill the server at once (SIGKILL: a crash, every connection cut), leave it down for
    /// `down`, and start it again on the same data and port.
    pub async fn crash_and_restart(&self, down: Duration) -> Result<()> {
        self.server
            .crash_and_restart(down, async |c| self.serve(c).await)
            .await
    }
}

/// An S3 server: s3proxy on its file-system backend, with [`BUCKET`] made.
pub struct ObjectStore {
    /// `http://host:port`.
    pub endpoint: String,
    /// `host:port`, as presigned URLs carry it.
    pub authority: String,
    /// The directory of [`BUCKET`]'s objects.
    pub bucket_dir: PathBuf,
    _process: ServerProcess,
}

impl ObjectStore {
    pub async fn start(dir: &Path, host: IpAddr) -> Result<Self> {
        let jar = obtain("s3proxy")?;
        let port = free_port()?;
        let home = dir.join("s3proxy");
        let base = home.join("data");
        let bucket_dir = base.join(BUCKET);
        std::fs::create_dir_all(&bucket_dir)?;
        let authority = format!("{host}:{port}");
        let endpoint = format!("http://{authority}");
        let properties = home.join("s3proxy.properties");
        std::fs::write(
            &properties,
            format!(
                "s3proxy.endpoint={endpoint}\n\
                 s3proxy.authorization=aws-v2-or-v4\n\
                 s3proxy.identity={S3_ACCESS_KEY_ID}\n\
                 s3proxy.credential={S3_SECRET_ACCESS_KEY}\n\
                 jclouds.provider=filesystem-nio2\n\
                 jclouds.filesystem.basedir={}\n",
                base.display()
            ),
        )?;
        let mut command = Command::new(crate::services::java()?);
        command
            .current_dir(&home)
            .args([
                "-Xms64m",
                "-Xmx512m",
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
            ])
            .arg(format!("-Djava.io.tmpdir={}", home.display()))
            .arg("-jar")
            .arg(&jar)
            .arg("--properties")
            .arg(&properties);
        let mut process = ServerProcess::spawn("s3proxy", &mut command, dir.join("s3proxy.log"))?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        // Any S3 answer (403 to an unsigned request) means it serves.
        let took = wait_ready(&mut process, Duration::from_secs(60), || {
            let answer = client.get(&endpoint).send();
            async move { answer.await.is_ok() }
        })
        .await?;
        eprintln!("[e2e] s3proxy ready on {endpoint} in {took:.1?}");
        Ok(Self {
            endpoint,
            authority,
            bucket_dir,
            _process: process,
        })
    }
}
