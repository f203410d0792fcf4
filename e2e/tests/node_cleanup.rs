//! The node leaves nothing behind: its owner killed with SIGKILL while pods run, the janitor
//! removes every process, mount, veth, bridge, iptables chain, `kubepods` cgroup, host
//! directory and changed sysctl, and the run's directory.

#![allow(clippy::unwrap_used)]

mod support;

use support::wait_for;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use perago_e2e::node::BUSYBOX_BODY_IMAGE;
use perago_e2e::process::{bin_dir, obtain, stdout_of};

/// What a node changes on the machine, as a comparable snapshot.
#[derive(Debug, PartialEq, Eq)]
struct MachineState {
    links: BTreeSet<String>,
    chains: BTreeSet<String>,
    kubepods_cgroups: BTreeSet<String>,
    sysctls: Vec<(String, String)>,
    host_paths: Vec<(String, bool)>,
}

fn machine_state() -> MachineState {
    let links = stdout_of(Command::new("ip").args(["-o", "link", "show"]))
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .collect();
    let mut chains = BTreeSet::new();
    for table in ["filter", "nat", "mangle"] {
        for line in stdout_of(Command::new("iptables").args(["-w", "-t", table, "-S"])).lines() {
            chains.insert(format!("{table} {line}"));
        }
    }
    let kubepods_cgroups = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .filter_map(Result::ok)
        .flat_map(|h| std::fs::read_dir(h.path()).into_iter().flatten())
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("kubepods"))
        })
        .map(|p| p.display().to_string())
        .collect();
    let sysctls = [
        "kernel.panic",
        "kernel.panic_on_oops",
        "vm.overcommit_memory",
    ]
    .iter()
    .map(|name| {
        let value = stdout_of(Command::new("sysctl").args(["-n", name]));
        ((*name).to_owned(), value.trim().to_owned())
    })
    .collect();
    let host_paths = ["/var/lib/kubelet", "/var/log/containers", "/var/log/pods"]
        .iter()
        .map(|p| ((*p).to_owned(), Path::new(p).exists()))
        .collect();
    MachineState {
        links,
        chains,
        kubepods_cgroups,
        sysctls,
        host_paths,
    }
}

/// Processes whose command line mentions `dir`.
fn processes_of(dir: &Path) -> Vec<String> {
    let needle = format!("{}/", dir.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(&needle).then_some(cmdline)
        })
        .collect()
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let needle = format!("{}/", dir.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&needle))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_killed_owner_leaves_nothing_of_the_node_behind() {
    if perago_e2e::node_opted_out("a_killed_owner_leaves_nothing_of_the_node_behind") {
        return;
    }
    // The machine as no node left it: taken while holding the node lock, so that no other
    // run's node is half up or half cleaned meanwhile, and after sweeping what a node whose
    // janitor never ran left behind (the node started below sweeps it too).
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/perago-e2e-node.lock")
        .unwrap();
    let free = wait_for(Duration::from_secs(600), || lock.try_lock().ok());
    assert!(free.is_some(), "another node held the lock for 10 minutes");
    let swept = Command::new(bin_dir().join("node-janitor"))
        .arg("--sweep")
        .status()
        .unwrap();
    assert!(swept.success(), "node-janitor --sweep: {swept}");
    let before = machine_state();
    lock.unlock().unwrap();
    let support::Up {
        child: mut up,
        state,
        ..
    } = support::up(
        env!("CARGO_BIN_EXE_perago-e2e"),
        "node",
        Duration::from_secs(300),
    );
    let kubeconfig = state.join("kube/kubeconfig");
    let kubectl = obtain("kubectl").unwrap();
    let kubectl = |args: &[&str]| {
        stdout_of(
            Command::new(&kubectl)
                .args(args)
                .env("KUBECONFIG", &kubeconfig),
        )
    };
    for name in ["sleeper-1", "sleeper-2"] {
        kubectl(&[
            "run",
            name,
            "--image",
            BUSYBOX_BODY_IMAGE,
            "--restart=Never",
            "--command",
            "--",
            "sleep",
            "3600",
        ]);
    }
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/sleeper-1",
        "pod/sleeper-2",
        "--timeout=60s",
    ]);
    let during = machine_state();
    assert!(during.links.contains("perago0"), "{during:?}");
    assert!(!during.kubepods_cgroups.is_empty(), "{during:?}");
    assert!(
        !mounts_under(&state).is_empty(),
        "the running node has mounts"
    );

    up.kill().unwrap();
    up.wait().unwrap();
    let killed = Instant::now();
    let released = wait_for(Duration::from_secs(90), || lock.try_lock().ok());
    assert!(
        released.is_some(),
        "the node's janitor still holds the lock {:.0?} after its owner was killed",
        killed.elapsed()
    );
    let took = killed.elapsed();
    lock.unlock().unwrap();

    assert_eq!(processes_of(&state), Vec::<String>::new(), "processes left");
    assert_eq!(mounts_under(&state), Vec::<String>::new(), "mounts left");
    assert!(!state.exists(), "{} still exists", state.display());
    assert_eq!(
        machine_state(),
        before,
        "the machine differs from before the node"
    );
    eprintln!("node with 2 pods cleaned up {took:.1?} after its owner's SIGKILL");
}
