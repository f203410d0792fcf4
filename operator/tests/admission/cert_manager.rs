//! The admission webhook with its certificate from a real cert-manager (v1.21.2's controllers
//! and CA injector, run as host processes against the node's apiserver): the chart's
//! `webhook.certManager.enabled=true` makes a self-signed Issuer and a Certificate,
//! cert-manager issues the Secret, its injector writes the `caBundle`, and the apiserver calls
//! the webhook over that chain, so an invalid task is refused with the check's message.
//!
//! A test of the `admission` binary: it takes its [`Turn`] on the node like the other, and
//! leaves the cluster as found, cert-manager's controllers stopped and its CRDs deleted.

use std::time::{Duration, Instant};

use perago_e2e::cluster::{Cluster, OPERATOR_NAMESPACE};
use perago_e2e::process::ServerProcess;
use perago_e2e::{Selection, shared};

use super::{DENIED, Turn, apply_in, cases};

const NAMESPACE: &str = "admission-cert-manager";

#[tokio::test]
async fn with_cert_manager_the_webhook_serves_the_certificate_cert_manager_issued() {
    if perago_e2e::node_opted_out(
        "with_cert_manager_the_webhook_serves_the_certificate_cert_manager_issued",
    ) {
        return;
    }
    let services = shared(Selection::ALL).await;
    let mut turn = Turn::take(
        "with_cert_manager_the_webhook_serves_the_certificate_cert_manager_issued",
        services,
    )
    .await;
    let cluster = Cluster::new(services).unwrap();
    let controller = perago_e2e::process::obtain("cert-manager").unwrap();
    let dir = controller.parent().unwrap().to_owned();
    let crds = dir.join("cert-manager.crds.yaml");
    turn.manifests.push(crds.clone());
    cluster
        .kubectl(&["apply", "--server-side", "-f", crds.to_str().unwrap()])
        .unwrap();
    cluster
        .kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/certificates.cert-manager.io",
            "crd/issuers.cert-manager.io",
            "crd/certificaterequests.cert-manager.io",
            "--timeout=60s",
        ])
        .unwrap();
    turn.namespaces.push("cert-manager".to_owned());
    cluster
        .kubectl(&["create", "namespace", "cert-manager"])
        .unwrap();
    let kubeconfig = services.kube().kubeconfig.clone();
    turn.processes.push(
        ServerProcess::spawn(
            "cert-manager controller",
            std::process::Command::new(&controller)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["--cluster-resource-namespace", "cert-manager"]),
            services.dir().join("cert-manager-controller.log"),
        )
        .unwrap(),
    );
    turn.processes.push(
        ServerProcess::spawn(
            "cert-manager cainjector",
            std::process::Command::new(dir.join("cainjector"))
                .arg("--kubeconfig")
                .arg(&kubeconfig),
            services.dir().join("cert-manager-cainjector.log"),
        )
        .unwrap(),
    );

    // The operator becomes available only once it serves the webhook, with the issued pair.
    let took = cluster
        .install_operator(&["--set", "webhook.certManager.enabled=true"])
        .unwrap();
    eprintln!("operator with a cert-manager certificate available in {took:.1?}");
    let get = |args: &[&str]| cluster.kubectl(args).unwrap();
    let ready = get(&[
        "get",
        "certificate",
        "-n",
        OPERATOR_NAMESPACE,
        "perago-operator-webhook",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ]);
    assert_eq!(ready, "True", "the chart's Certificate is issued");
    let ca = get(&[
        "get",
        "secret",
        "-n",
        OPERATOR_NAMESPACE,
        "perago-operator-webhook-tls",
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ]);
    assert!(!ca.is_empty(), "cert-manager wrote ca.crt");
    let bundle_of = || {
        get(&[
            "get",
            "validatingwebhookconfiguration",
            "perago-operator",
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ])
    };
    // The injector's caches sync slowly on a loaded machine: up to two minutes.
    let started = Instant::now();
    while bundle_of() != ca {
        if started.elapsed() > Duration::from_secs(120) {
            let log = std::fs::read_to_string(services.dir().join("cert-manager-cainjector.log"))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "cert-manager's injector never wrote the Secret's CA as the caBundle; its log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let logs = cluster.operator_logs().unwrap();
    assert!(
        !logs.contains("made the webhook's certificate authority"),
        "with cert-manager the operator makes no certificate of its own:\n{logs}"
    );

    // The apiserver trusts the webhook through cert-manager's chain: refusals and admissions.
    cluster.task_namespace(NAMESPACE).unwrap();
    let (path, value, expected) = cases::bad_declarations()
        .into_iter()
        .find(|(path, _, _)| path.starts_with("spec.workspace"))
        .unwrap();
    let mut bad = cases::base();
    cases::set(&mut bad, path, value);
    let refused = apply_in(&cluster, NAMESPACE, &[], &bad).expect_err(path);
    assert!(
        refused.contains(DENIED) && refused.contains(expected),
        "{path}: {refused}"
    );
    let mut good = cases::base();
    cases::set(&mut good, "spec.taskName", "admission.cert-manager".into());
    apply_in(&cluster, NAMESPACE, &[], &good).unwrap();
    eprintln!("with cert-manager: {path} refused with the check's message, a valid task stored");
    turn.leave();
}
