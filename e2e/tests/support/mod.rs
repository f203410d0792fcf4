//! Shared by the tests that run `perago-e2e up` as a child process and kill it.

#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn wait_for<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(value) = probe() {
            return Some(value);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// `perago-e2e up --services <services>` in the background, once it says where its state is.
pub struct Up {
    pub child: Child,
    /// The servers' state directory.
    pub state: PathBuf,
    /// The environment it wrote (`export KEY=value` lines).
    pub env: String,
    _scratch: tempfile::TempDir,
}

pub fn up(binary: &str, services: &str, limit: Duration) -> Up {
    let scratch = tempfile::tempdir().unwrap();
    let env_file = scratch.path().join("env");
    let log = scratch.path().join("up.log");
    let mut child = Command::new(binary)
        .args(["up", "--services", services, "--env-file"])
        .arg(&env_file)
        .env_remove("PERAGO_E2E_KEEP")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let state = wait_for(limit, || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let rest = text.split("(state in ").nth(1)?;
        Some(PathBuf::from(rest.split(')').next()?))
    })
    .unwrap_or_else(|| {
        let _ = child.kill();
        panic!(
            "perago-e2e up --services {services} did not start:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let env = std::fs::read_to_string(&env_file).unwrap();
    Up {
        child,
        state,
        env,
        _scratch: scratch,
    }
}
