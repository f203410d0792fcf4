//! The harness cleans up after itself: a process that started servers and then died without
//! stopping them (SIGKILL here; a test binary's shared servers are never dropped either)
//! leaves neither a server nor its state directory behind.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn wait_for<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(value) = probe() {
            return Some(value);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

#[test]
fn a_killed_owner_leaves_no_server_and_no_state_directory() {
    let scratch = tempfile::tempdir().unwrap();
    let env_file = scratch.path().join("env");
    let log = scratch.path().join("up.log");
    let mut up = Command::new(env!("CARGO_BIN_EXE_perago-e2e"))
        .args(["up", "--services", "lakefs", "--env-file"])
        .arg(&env_file)
        .env_remove("PERAGO_E2E_KEEP")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();

    let state: PathBuf = wait_for(Duration::from_secs(120), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let rest = text.split("(state in ").nth(1)?;
        Some(PathBuf::from(rest.split(')').next()?))
    })
    .unwrap_or_else(|| {
        let _ = up.kill();
        panic!(
            "perago-e2e up did not start lakeFS:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let env = std::fs::read_to_string(&env_file).unwrap();
    let endpoint = env
        .lines()
        .find_map(|l| l.strip_prefix("export LAKECTL_SERVER_ENDPOINT_URL="))
        .unwrap()
        .to_owned();
    let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        state.is_dir(),
        "{} should hold the servers' state",
        state.display()
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());

    up.kill().unwrap();
    up.wait().unwrap();
    let killed = Instant::now();

    let server_gone = wait_for(Duration::from_secs(15), || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .is_err()
            .then_some(())
    });
    assert!(server_gone.is_some(), "lakeFS still listens on {port}");
    let dir_gone = wait_for(Duration::from_secs(20), || (!state.exists()).then_some(()));
    assert!(
        dir_gone.is_some(),
        "{} still exists {:.0?} after its owner was killed",
        state.display(),
        killed.elapsed()
    );
    eprintln!(
        "server and state directory gone {:.1?} after SIGKILL",
        killed.elapsed()
    );
}
