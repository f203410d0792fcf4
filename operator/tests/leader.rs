//! Leader election against the real kube-apiserver: of two operator replicas one leads (holds
//! the Lease and reports `perago_operator_leader 1`), and the other takes over when it dies.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use perago_e2e::process::free_port;
use perago_e2e::{Selection, shared};
use tokio::process::{Child, Command};

fn replica(kubeconfig: &std::path::Path, name: &str, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_perago-operator"))
        .args([
            "run",
            "--conductor-url",
            "http://127.0.0.1:9/api",
            "--lease-duration-seconds",
            "3",
        ])
        .args(["--http-addr", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", name)
        .env("PERAGO_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn leader_gauge(port: u16) -> Option<String> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with("perago_operator_leader "))
        .map(|l| l[23..].to_owned())
}

#[tokio::test]
async fn one_replica_leads_and_the_other_takes_over() {
    let services = shared(Selection {
        kube: true,
        ..Selection::default()
    })
    .await;
    let client = services.kube().client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let ports = [free_port().unwrap(), free_port().unwrap()];
    let mut replicas = [
        Some(replica(&services.kube().kubeconfig, "replica-a", ports[0])),
        Some(replica(&services.kube().kubeconfig, "replica-b", ports[1])),
    ];
    let holder = |leases: Api<Lease>| async move {
        leases
            .get_opt("perago-operator")
            .await
            .ok()??
            .spec?
            .holder_identity
    };
    let started = Instant::now();
    let first = loop {
        if let Some(h) = holder(leases.clone())
            .await
            .filter(|h| h.starts_with("replica-"))
        {
            break h;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nobody took the lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (leading, standby) = if first == "replica-a" { (0, 1) } else { (1, 0) };
    // The gauges agree with the Lease.
    let started = Instant::now();
    while leader_gauge(ports[leading]).await.as_deref() != Some("1") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the holder does not report leadership"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(leader_gauge(ports[standby]).await.as_deref(), Some("0"));
    let ready = reqwest::get(format!("http://127.0.0.1:{}/readyz", ports[standby]))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "a standby is ready");

    // The leader dies without releasing the lease: the standby takes over after it expires.
    let mut dead = replicas[leading].take().unwrap();
    dead.kill().await.unwrap();
    let killed = Instant::now();
    let second = loop {
        match holder(leases.clone()).await {
            Some(h) if h != first => break h,
            _ => {}
        }
        assert!(killed.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        second,
        if standby == 0 {
            "replica-a"
        } else {
            "replica-b"
        }
    );
    let started = Instant::now();
    while leader_gauge(ports[standby]).await.as_deref() != Some("1") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the new holder does not report leadership"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("failover after {:?}", killed.elapsed());
}
