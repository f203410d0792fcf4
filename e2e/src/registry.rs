//! An OCI registry on the node's bridge (Debian's `docker-registry`: the CNCF distribution
//! server), and the release the harness pushes to it with `e2e/bin/release`, the script behind
//! `make release`. The node's containerd pulls the project's images from it and the operator is
//! installed from its chart (`helm install oci://…`), as a platform team installs from its own
//! registry; only the registry itself and the test images are side-loaded.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::process::{ServerProcess, bin_dir, free_port, obtain, release_binaries, wait_ready};

/// The path under the registry's host that releases are pushed to.
pub const REPOSITORY_PREFIX: &str = "perago";

/// A running registry, storing under the run's directory, served over plain HTTP.
pub struct Registry {
    /// `ip:port`: the host part of every reference into it.
    pub host: String,
    _process: ServerProcess,
}

impl Registry {
    pub async fn start(dir: &Path, ip: IpAddr) -> Result<Self> {
        Self::launch(dir, ip, false).await
    }

    /// A registry in maintenance mode: it serves what it holds and refuses every push, as a
    /// read-only mirror does.
    pub async fn start_read_only(dir: &Path, ip: IpAddr) -> Result<Self> {
        Self::launch(dir, ip, true).await
    }

    async fn launch(dir: &Path, ip: IpAddr, read_only: bool) -> Result<Self> {
        let name = if read_only {
            "registry-read-only"
        } else {
            "registry"
        };
        let home = dir.join(name);
        std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
        let port = free_port()?;
        let host = format!("{ip}:{port}");
        let config = home.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 {}http:\n  addr: {host}\n",
                home.join("storage").display(),
                if read_only {
                    "  maintenance:\n    readonly:\n      enabled: true\n"
                } else {
                    ""
                }
            ),
        )?;
        let binary = Path::new("/usr/bin/docker-registry");
        if !binary.exists() {
            bail!(
                "the registry needs /usr/bin/docker-registry: install the Debian package docker-registry"
            );
        }
        let mut cmd = Command::new(binary);
        cmd.arg("serve").arg(&config);
        let mut process = ServerProcess::spawn(name, &mut cmd, dir.join(format!("{name}.log")))?;
        let url = format!("http://{host}/v2/");
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        wait_ready(&mut process, Duration::from_secs(30), || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                client
                    .get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await
        .context("the registry did not answer /v2/")?;
        Ok(Self {
            host,
            _process: process,
        })
    }

    /// Where releases go: `host/perago`.
    pub fn prefix(&self) -> String {
        format!("{}/{REPOSITORY_PREFIX}", self.host)
    }
}

/// The chart's own version (`charts/perago-operator/Chart.yaml`): what the node installs.
pub fn chart_version() -> String {
    include_str!("../../charts/perago-operator/Chart.yaml")
        .lines()
        .find_map(|l| l.strip_prefix("version:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| "0.0.0".to_owned())
}

/// `crane ARGS --insecure` (the harness's registries serve plain HTTP); its standard output.
pub fn crane(args: &[&str]) -> Result<String> {
    let out = Command::new(obtain("crane")?)
        .args(args)
        .arg("--insecure")
        .output()?;
    if !out.status.success() {
        bail!(
            "crane {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Push a release of `version` to `prefix` (`host/path`), made from the static (amd64) release
/// binaries with `make release`'s script; its files go to `dir/release-<version>`.
pub fn publish(prefix: &str, dir: &Path, version: &str) -> Result<Release> {
    publish_with(prefix, dir, version, &[])
}

/// [`publish`] with more of the script's settings, e.g. `CHART_DIR` (another chart) or
/// `SOURCE_DATE_EPOCH` (images of another build date, so other digests).
pub fn publish_with(
    prefix: &str,
    dir: &Path,
    version: &str,
    settings: &[(&str, &str)],
) -> Result<Release> {
    let binaries = release_binaries(
        &[
            "perago-operator",
            "perago-sidecar",
            "perago-runner",
            "kubectl-perago",
        ],
        "the release the node installs is made from them",
    )?;
    let out = dir.join(format!("release-{version}"));
    let started = Instant::now();
    let run = Command::new(bin_dir().join("release"))
        .env("VERSION", version)
        .env("REGISTRY", prefix)
        .env("ARCHS", "amd64")
        .env("BINARIES", &binaries)
        .env("PLAIN_HTTP", "1")
        .env("OUT", &out)
        // The node's releases are not signed: e2e/tests/release.rs signs and verifies.
        .env("UNSIGNED", "1")
        .envs(settings.iter().copied())
        .output()
        .context("running e2e/bin/release")?;
    if !run.status.success() {
        bail!(
            "e2e/bin/release of {version} to {} failed ({}):\n{}",
            prefix,
            run.status,
            String::from_utf8_lossy(&run.stderr).trim()
        );
    }
    let release = Release::read(&out)?;
    eprintln!(
        "[e2e] released {version} to {prefix} in {:.1?}",
        started.elapsed()
    );
    Ok(release)
}

/// A release in the registry, as `e2e/bin/release` describes it in its `release.env`.
#[derive(Debug, Clone)]
pub struct Release {
    pub version: String,
    /// `oci://host/perago/charts/perago-operator`, for `helm install … --version`.
    pub chart: String,
    /// `host/perago/perago-operator:version@sha256:…`
    pub operator_image: String,
    pub sidecar_image: String,
    /// The release's files (layouts, chart archive, SBOMs, SHA256SUMS).
    pub dir: PathBuf,
}

impl Release {
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("release.env");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let values: HashMap<&str, &str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .collect();
        let value = |key: &str| {
            values
                .get(key)
                .map(|v| v.trim_matches('"').to_owned())
                .with_context(|| format!("{} has no {key}", path.display()))
        };
        Ok(Self {
            version: value("VERSION")?,
            chart: value("CHART")?,
            operator_image: value("OPERATOR_IMAGE")?,
            sidecar_image: value("SIDECAR_IMAGE")?,
            dir: dir.to_owned(),
        })
    }
}
