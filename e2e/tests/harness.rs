//! The harness cleans up after itself: a process that started servers and then died without
//! stopping them (SIGKILL here; a test binary's shared servers are never dropped either)
//! leaves neither a server nor its state directory behind.

#![allow(clippy::unwrap_used)]

mod support;

use support::wait_for;

use std::time::{Duration, Instant};

#[test]
fn a_killed_owner_leaves_no_server_and_no_state_directory() {
    let support::Up {
        child: mut up,
        state,
        env,
        ..
    } = support::up(
        env!("CARGO_BIN_EXE_perago-e2e"),
        "lakefs",
        Duration::from_secs(120),
    );
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
