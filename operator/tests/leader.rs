//! Leader election against the real kube-apiserver: of two operator replicas one leads (holds
//! the Lease and reports `perago_operator_leader 1`), and the other takes over when it dies.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use perago_e2e::process::free_port;
use perago_e2e::{Selection, shared};
use tokio::process::{Child, Command};

/// One test at a time: one of them stops the API server the others use.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An operator replica whose Lease is in `namespace`.
fn replica(kubeconfig: &std::path::Path, name: &str, port: u16, namespace: &str) -> Child {
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
        .env("POD_NAMESPACE", namespace)
        .env("PERAGO_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn leader_gauge(port: u16) -> Option<String> {
    metric(port, "perago_operator_leader").await
}

/// The value of a metric without labels, as the replica on `port` serves it.
async fn metric(port: u16, name: &str) -> Option<String> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(str::to_owned)
}

#[tokio::test]
async fn one_replica_leads_and_the_other_takes_over() {
    let _one = ONE_AT_A_TIME.lock().await;
    let services = shared(Selection {
        kube: true,
        ..Selection::default()
    })
    .await;
    let client = services.kube().client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let ports = [free_port().unwrap(), free_port().unwrap()];
    let mut replicas = [
        Some(replica(
            &services.kube().kubeconfig,
            "replica-a",
            ports[0],
            "default",
        )),
        Some(replica(
            &services.kube().kubeconfig,
            "replica-b",
            ports[1],
            "default",
        )),
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

/// Another holder takes the Lease from the leader (as a replica that renewed while this one
/// could not reach the API server would): the leader stops reconciling and stays up as a
/// standby, and leads again once that holder's Lease expires. The process never exits.
#[tokio::test]
async fn a_replica_that_loses_the_lease_stays_up_and_leads_again() {
    let _one = ONE_AT_A_TIME.lock().await;
    let namespace = "lease-loss";
    let (client, port, mut replica) = leading_alone("replica-c", namespace).await;

    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let taken = serde_json::json!({"spec": {
        "holderIdentity": "another-replica",
        "leaseDurationSeconds": 3,
        "acquireTime": now,
        "renewTime": now,
    }});
    leases
        .patch(
            "perago-operator",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&taken),
        )
        .await
        .unwrap();
    let taken_at = Instant::now();
    wait_metric_within(port, "perago_operator_leader", "0", Duration::from_secs(10)).await;
    let stepped_down = taken_at.elapsed();
    assert_eq!(
        metric(port, "perago_operator_leadership_lost_total")
            .await
            .as_deref(),
        Some("1")
    );
    // The other holder never renews: replica-c takes the Lease again once it expires.
    wait_metric_within(port, "perago_operator_leader", "1", Duration::from_secs(10)).await;
    assert!(
        replica.try_wait().unwrap().is_none(),
        "replica-c exited when it lost the lease"
    );
    println!(
        "stood down {stepped_down:.1?} after the Lease was taken, led again {:.1?} after",
        taken_at.elapsed()
    );
}

/// The API server killed and kept away three lease durations while a replica leads: the
/// replica stops reconciling once its Lease expires by the last renewal it saw (it cannot
/// read that it lost it), stays up, and leads again once the API server is back.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stands_down_when_its_lease_expires() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (_, port, mut replica) = leading_alone("replica-d", "lease-outage").await;
    let services = shared(Selection {
        kube: true,
        ..Selection::default()
    })
    .await;

    let cut = Instant::now();
    let outage = services
        .kube()
        .crash_and_restart_apiserver(Duration::from_secs(9));
    let stood_down = async {
        wait_metric_within(port, "perago_operator_leader", "0", Duration::from_secs(8)).await;
        cut.elapsed()
    };
    let (restarted, stood_down) = tokio::join!(outage, stood_down);
    restarted.unwrap();
    let back = Instant::now();
    wait_metric_within(port, "perago_operator_leader", "1", Duration::from_secs(20)).await;
    assert!(
        replica.try_wait().unwrap().is_none(),
        "replica-d exited during the outage"
    );
    println!(
        "stood down {stood_down:.1?} after the API server went, led again {:.1?} after it was back",
        back.elapsed()
    );
}

/// One replica `name` with its Lease in a new `namespace`, once it leads: a client of the API
/// server, the replica's metrics port, and the replica.
async fn leading_alone(name: &str, namespace: &str) -> (kube::Client, u16, Child) {
    let services = shared(Selection {
        kube: true,
        ..Selection::default()
    })
    .await;
    let client = services.kube().client().await.unwrap();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})).unwrap();
    namespaces.create(&Default::default(), &ns).await.unwrap();
    let port = free_port().unwrap();
    let replica = replica(&services.kube().kubeconfig, name, port, namespace);
    wait_metric_within(port, "perago_operator_leader", "1", Duration::from_secs(10)).await;
    (client, port, replica)
}

/// Until the replica on `port` serves `value` for `name`, `limit` at most.
async fn wait_metric_within(port: u16, name: &str, value: &str, limit: Duration) {
    let started = Instant::now();
    while metric(port, name).await.as_deref() != Some(value) {
        assert!(
            started.elapsed() < limit,
            "{name} is not {value} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
