//! Flux on the node: its source-controller and kustomize-controller (built by `e2e/bin/obtain
//! flux` from their Go modules) as host processes against the node's apiserver, as the
//! controller-manager and the scheduler run, with their CRDs from the same module versions;
//! and a Git server on loopback (`e2e/gitserver`: the machine's `git http-backend` behind Go's
//! CGI handler) whose repositories source-controller clones over HTTP.
//!
//! source-controller keeps its artifacts under the run's directory and serves them on a
//! loopback port, which it advertises in each artifact's URL; kustomize-controller, also on
//! this host, downloads them from there. Neither elects a leader, and both use the admin
//! kubeconfig, so no RBAC of theirs is installed. Every process stops when the [`Flux`] is
//! dropped; their logs are `source-controller.log`, `kustomize-controller.log` and
//! `gitserver.log` beside the other servers' logs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::cluster::Cluster;
use crate::process::{ServerProcess, free_port, obtain, wait_ready};

/// The namespace the controllers run for (`RUNTIME_NAMESPACE`), where the tests keep their
/// GitRepositories and Kustomizations.
pub const NAMESPACE: &str = "flux-system";

/// Flux's CRDs (`e2e/bin/obtain flux` copies each module's `config/crd/bases`).
const CRDS: &[&str] = &[
    "gitrepositories.source.toolkit.fluxcd.io",
    "kustomizations.kustomize.toolkit.fluxcd.io",
];

/// The two controllers and the Git server, running.
pub struct Flux {
    pub git: GitServer,
    _source_controller: ServerProcess,
    _kustomize_controller: ServerProcess,
}

impl Flux {
    /// Install Flux's CRDs in the cluster and start the Git server and the controllers, logging
    /// into `dir`; ready once each controller's readiness probe answers.
    pub async fn start(dir: &Path, cluster: &Cluster) -> Result<Self> {
        let built = obtain("flux")?;
        let bin = built
            .parent()
            .context("e2e/bin/obtain flux printed no directory")?
            .to_owned();
        cluster.kubectl(&[
            "apply",
            "--server-side",
            "-f",
            &bin.join("crds").to_string_lossy(),
        ])?;
        let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
        let crds: Vec<String> = CRDS.iter().map(|c| format!("crd/{c}")).collect();
        wait.extend(crds.iter().map(String::as_str));
        cluster.kubectl(&wait)?;
        cluster.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n"
        ))?;

        let home = dir.join("flux");
        std::fs::create_dir_all(&home)?;
        let git = GitServer::start(dir, &bin.join("gitserver"), &home.join("git")).await?;

        // source-controller refuses a storage path that does not exist.
        let artifacts = home.join("artifacts");
        std::fs::create_dir_all(&artifacts)?;
        let storage = free_port()?;
        let source_controller = controller(
            dir,
            cluster,
            &bin.join("source-controller"),
            &[
                format!("--storage-path={}", artifacts.display()),
                format!("--storage-addr=127.0.0.1:{storage}"),
                format!("--storage-adv-addr=127.0.0.1:{storage}"),
            ],
        )
        .await?;
        let kustomize_controller = controller(
            dir,
            cluster,
            &bin.join("kustomize-controller"),
            // Every base is in the source's own artifact, as in a locked-down cluster.
            &["--no-remote-bases=true".to_owned()],
        )
        .await?;
        Ok(Self {
            git,
            _source_controller: source_controller,
            _kustomize_controller: kustomize_controller,
        })
    }
}

/// Start one controller with the admin kubeconfig, no leader election and its metrics and
/// probes on free loopback ports; ready once its `/readyz` answers.
async fn controller(
    dir: &Path,
    cluster: &Cluster,
    binary: &Path,
    extra: &[String],
) -> Result<ServerProcess> {
    let name = binary
        .file_name()
        .context("a controller binary without a name")?
        .to_string_lossy()
        .into_owned();
    let (metrics, health) = (free_port()?, free_port()?);
    let mut cmd = Command::new(binary);
    cmd.env("KUBECONFIG", cluster.kubeconfig())
        .env("RUNTIME_NAMESPACE", NAMESPACE)
        .arg("--enable-leader-election=false")
        .arg(format!("--metrics-addr=127.0.0.1:{metrics}"))
        .arg(format!("--health-addr=127.0.0.1:{health}"))
        // No notification-controller: events go to the apiserver only.
        .arg("--events-addr=")
        .arg("--log-encoding=console")
        .args(extra);
    let mut process = ServerProcess::spawn(&name, &mut cmd, dir.join(format!("{name}.log")))?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let readyz = format!("http://127.0.0.1:{health}/readyz");
    let took = wait_ready(&mut process, Duration::from_secs(60), || {
        let probe = http.get(&readyz).send();
        async move { probe.await.is_ok_and(|r| r.status().is_success()) }
    })
    .await?;
    eprintln!("[e2e] Flux's {name} ready in {took:.1?}");
    Ok(process)
}

/// `e2e/gitserver` on a loopback port, serving the bare repositories under its root.
pub struct GitServer {
    /// `http://127.0.0.1:<port>`; a repository `NAME` is `<url>/NAME.git`.
    pub url: String,
    port: u16,
    binary: PathBuf,
    log: PathBuf,
    root: PathBuf,
    work: PathBuf,
    /// `None` while [`Self::stop`]ped.
    process: std::sync::Mutex<Option<ServerProcess>>,
}

impl GitServer {
    async fn start(dir: &Path, binary: &Path, home: &Path) -> Result<Self> {
        let root = home.join("repositories");
        let work = home.join("work");
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(&work)?;
        let port = free_port()?;
        let server = Self {
            url: format!("http://127.0.0.1:{port}"),
            port,
            binary: binary.to_owned(),
            log: dir.join("gitserver.log"),
            root,
            work,
            process: std::sync::Mutex::new(None),
        };
        server.resume().await?;
        Ok(server)
    }

    /// Stop serving, as a Git server that goes away: clones fail with the connection refused.
    pub fn stop(&self) {
        let process = self
            .process
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(process) = process {
            process.kill();
        }
    }

    /// Serve again on the same address, the repositories as they were; ready once it answers.
    pub async fn resume(&self) -> Result<()> {
        let mut cmd = Command::new(&self.binary);
        cmd.arg(format!("--listen=127.0.0.1:{}", self.port))
            .arg(format!("--root={}", self.root.display()));
        // A restart logs beside the first run, which keeps its log.
        let mut log = self.log.clone();
        for restart in 1.. {
            if !log.exists() {
                break;
            }
            log = self.log.with_extension(format!("{restart}.log"));
        }
        let mut process = ServerProcess::spawn("gitserver", &mut cmd, log)?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        wait_ready(&mut process, Duration::from_secs(30), || {
            // Any answer (404 for the root) means it serves.
            let probe = http.get(&self.url).send();
            async move { probe.await.is_ok() }
        })
        .await?;
        *self.process.lock().unwrap_or_else(|e| e.into_inner()) = Some(process);
        Ok(())
    }

    /// A new repository `name` with one branch, `main`: a bare repository the server serves and
    /// a working copy to commit in.
    pub fn repository(&self, name: &str) -> Result<Repository> {
        let bare = self.root.join(format!("{name}.git"));
        let work = self.work.join(name);
        git(
            &self.root,
            &[
                "init",
                "--quiet",
                "--bare",
                "--initial-branch=main",
                &bare.to_string_lossy(),
            ],
        )?;
        git(
            &self.work,
            &[
                "init",
                "--quiet",
                "--initial-branch=main",
                &work.to_string_lossy(),
            ],
        )?;
        Ok(Repository {
            url: format!("{}/{name}.git", self.url),
            bare,
            work,
        })
    }
}

/// A repository on the [`GitServer`] and its working copy.
pub struct Repository {
    /// What a GitRepository's `spec.url` names.
    pub url: String,
    bare: PathBuf,
    work: PathBuf,
}

impl Repository {
    /// Write `contents` to `path` in the working copy (directories made as needed).
    pub fn write(&self, path: &str, contents: &str) -> Result<()> {
        let file = self.work.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, contents).with_context(|| format!("writing {}", file.display()))
    }

    /// Remove `path` from the working copy.
    pub fn remove(&self, path: &str) -> Result<()> {
        let file = self.work.join(path);
        std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))
    }

    /// Commit everything in the working copy and push it to the served repository's `main`;
    /// the new commit's hash.
    pub fn commit(&self, message: &str) -> Result<String> {
        git(&self.work, &["add", "--all"])?;
        git(
            &self.work,
            &[
                "-c",
                "user.name=perago e2e",
                "-c",
                "user.email=e2e@example.com",
                "commit",
                "--quiet",
                "--message",
                message,
            ],
        )?;
        git(
            &self.work,
            &["push", "--quiet", &self.bare.to_string_lossy(), "main"],
        )?;
        Ok(git(&self.work, &["rev-parse", "HEAD"])?.trim().to_owned())
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        // The machine's and the user's Git configuration stay out of the test's commits.
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!(
            "git {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
