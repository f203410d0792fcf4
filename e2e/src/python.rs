//! The repository's Python package (`python/`, `perago-k8s`) under the reference Python
//! (Python Perago 0.6.1's interpreter, which has its dependencies).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use perago_api::PeragoTaskSpec;

/// The `python/` directory of the repository.
pub fn package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../python")
}

/// A `PYTHONPATH` holding the package and `modules`.
pub fn path_with(modules: &Path) -> OsString {
    std::env::join_paths([package_dir().as_path(), modules]).expect("paths without ':'")
}

/// The PeragoTask `perago-k8s manifest MODULE --image tasks:1` writes for `module` in
/// `modules`, validated.
pub fn manifest(modules: &Path, module: &str) -> PeragoTaskSpec {
    let python = crate::process::obtain("perago-python").expect("the reference Python");
    let out = std::process::Command::new(python)
        .args(["-m", "perago_k8s", "manifest", module, "--image", "tasks:1"])
        .env("PYTHONPATH", path_with(modules))
        .output()
        .expect("running perago-k8s manifest");
    assert!(
        out.status.success(),
        "perago-k8s manifest {module}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).expect("UTF-8 YAML");
    let spec = perago_api::manifest::parse(&yaml)
        .expect("a PeragoTask")
        .remove(0)
        .task
        .spec;
    perago_api::validate(&spec).expect("a valid PeragoTask");
    spec
}

/// `perago start MODULE -j 2` of Python Perago 0.6.1 (process mode) under the harness's
/// watchdog, for a module's source written as `MODULE.py` in a directory of its own, against
/// `conductor_url` and the harness's lakeFS; in a process group of its own, which dropping it
/// kills at once. `perago start` only checks that the TaskDef exists: register it first.
pub struct Worker {
    child: tokio::process::Child,
    dir: tempfile::TempDir,
}

impl Worker {
    pub fn start(
        services: &crate::Services,
        module: &str,
        source: &str,
        conductor_url: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        use crate::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
        use anyhow::Context;
        let python = crate::process::obtain("perago-python")?;
        let dir = tempfile::Builder::new()
            .prefix("perago-python-")
            .tempdir()?;
        std::fs::write(dir.path().join(format!("{module}.py")), source)?;
        let out = std::fs::File::create(dir.path().join("out.log"))?;
        let child = tokio::process::Command::new(crate::process::bin_dir().join("watchdog"))
            .arg(std::process::id().to_string())
            .arg("--")
            .arg(python)
            .args([
                "-c",
                "from perago.cli import app; app()",
                "start",
                module,
                "-j",
                "2",
            ])
            .env("PYTHONPATH", dir.path())
            .env("CONDUCTOR_SERVER_URL", conductor_url)
            .env("LAKECTL_SERVER_ENDPOINT_URL", &services.lakefs().endpoint)
            .env("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID)
            .env(
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                LAKEFS_SECRET_ACCESS_KEY,
            )
            .env("PERAGO_WORKSPACE_ROOT", dir.path().join("workspaces"))
            .env("PERAGO_LOG_ROOT", dir.path().join("logs"))
            .envs(env.iter().copied())
            .process_group(0)
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .context("starting perago start")?;
        Ok(Self { child, dir })
    }

    /// Its output and its log files (the last 30,000 bytes), for failure messages.
    pub fn log(&self) -> String {
        fn walk(dir: &Path, out: &mut String) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            let mut paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
            paths.sort();
            for path in paths {
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "log" || e == "jsonl") {
                    out.push_str(&format!("--- {}\n", path.display()));
                    out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
                }
            }
        }
        let mut out = String::new();
        walk(self.dir.path(), &mut out);
        let cut = out.len().saturating_sub(30_000);
        let cut = (cut..out.len())
            .find(|i| out.is_char_boundary(*i))
            .unwrap_or(0);
        out[cut..].to_owned()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let group = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}
