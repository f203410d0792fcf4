//! The kustomize manifests: the base is what the chart renders, and `kubectl apply -k` of the
//! base, the example overlay and the example PeragoTasks is accepted by the real
//! kube-apiserver (server-side apply, dry run first, then for real).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use perago_e2e::process::{obtain, stdout_of};
use perago_e2e::{Selection, shared};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs kubectl against the test apiserver; returns (success, stdout, stderr).
async fn kubectl(args: &[&str]) -> (bool, String, String) {
    let services = shared(Selection {
        kube: true,
        ..Selection::default()
    })
    .await;
    let out = Command::new(obtain("kubectl").unwrap())
        .args(args)
        .env("KUBECONFIG", &services.kube().kubeconfig)
        .current_dir(repo())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn must(args: &[&str]) -> String {
    let (ok, out, err) = kubectl(args).await;
    assert!(ok, "kubectl {}: {err}{out}", args.join(" "));
    out
}

#[test]
fn the_base_is_the_chart_rendered_for_perago_system() {
    let helm = obtain("helm").unwrap();
    let generated = stdout_of(
        Command::new("bash")
            .arg(repo().join("deploy/kustomize/generate"))
            .arg(helm),
    );
    let committed =
        std::fs::read_to_string(repo().join("deploy/kustomize/base/perago-operator.yaml")).unwrap();
    assert!(
        generated == committed,
        "deploy/kustomize/base/perago-operator.yaml differs from the chart: run `make manifests`"
    );
}

#[tokio::test]
async fn kubectl_apply_k_installs_the_operator_and_the_examples() {
    // The namespace must exist before namespaced objects can be dry-run.
    must(&[
        "apply",
        "--server-side",
        "-f",
        "deploy/kustomize/base/namespace.yaml",
    ])
    .await;

    for dir in ["deploy/kustomize/base", "deploy/kustomize/overlay-example"] {
        let out = must(&["apply", "--server-side", "--dry-run=server", "-k", dir]).await;
        for object in [
            "namespace/perago-system",
            "customresourcedefinition.apiextensions.k8s.io/peragotasks.perago.io",
            "serviceaccount/perago-operator",
            "clusterrole.rbac.authorization.k8s.io/perago-operator",
            "clusterrolebinding.rbac.authorization.k8s.io/perago-operator",
            "role.rbac.authorization.k8s.io/perago-operator-leader",
            "rolebinding.rbac.authorization.k8s.io/perago-operator-leader",
            "service/perago-operator-metrics",
            "service/perago-operator-webhook",
            "role.rbac.authorization.k8s.io/perago-operator-webhook",
            "validatingwebhookconfiguration.admissionregistration.k8s.io/perago-operator",
            "deployment.apps/perago-operator",
        ] {
            assert!(
                out.contains(&format!("{object} serverside-applied (server dry run)")),
                "{dir}: {object} missing from:\n{out}"
            );
        }
    }

    // For real: the overlay's settings reach the operator Deployment.
    must(&[
        "apply",
        "--server-side",
        "-k",
        "deploy/kustomize/overlay-example",
    ])
    .await;
    let env = must(&[
        "get",
        "deployment",
        "perago-operator",
        "-n",
        "perago-system",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].env}",
    ])
    .await;
    assert!(
        env.contains("http://conductor.conductor.svc.cluster.local:8080/api"),
        "{env}"
    );
    must(&[
        "wait",
        "--for=condition=Established",
        "crd/peragotasks.perago.io",
        "--timeout=30s",
    ])
    .await;
    // No operator runs on this API-only server, so its webhook could only fail every apply
    // below; the real node's tests (operator/tests/admission.rs) cover the webhook.
    must(&[
        "delete",
        "validatingwebhookconfiguration",
        "perago-operator",
    ])
    .await;

    must(&["create", "namespace", "data-pipelines"]).await;
    let out = must(&[
        "apply",
        "--server-side",
        "--dry-run=server",
        "-k",
        "deploy/examples",
        "-n",
        "data-pipelines",
    ])
    .await;
    for name in [
        "features-build",
        "features-validate",
        "notify-owner",
        "transcode-render",
    ] {
        assert!(
            out.contains(&format!(
                "peragotask.perago.io/{name} serverside-applied (server dry run)"
            )),
            "{name} missing from:\n{out}"
        );
    }
    must(&[
        "apply",
        "--server-side",
        "-k",
        "deploy/examples",
        "-n",
        "data-pipelines",
    ])
    .await;
    let names = must(&[
        "get",
        "peragotasks",
        "-n",
        "data-pipelines",
        "-o",
        "jsonpath={.items[*].spec.taskName}",
    ])
    .await;
    assert_eq!(names.split(' ').count(), 4, "{names}");

    // The HPA example scales one of them through its /scale subresource.
    let out = must(&[
        "apply",
        "--server-side",
        "--dry-run=server",
        "-n",
        "data-pipelines",
        "-f",
        "deploy/examples/scalers/hpa-external-metrics.yaml",
    ])
    .await;
    assert!(
        out.contains("horizontalpodautoscaler.autoscaling/features-build serverside-applied"),
        "{out}"
    );
    // A manifest the CRD's rules refuse is refused by `apply -k` too, with the rule's message.
    let (ok, _, err) = kubectl(&[
        "apply",
        "--server-side",
        "--dry-run=server",
        "-n",
        "data-pipelines",
        "-f",
        "e2e/tests/fixtures/autoscaling-min-above-max.yaml",
    ])
    .await;
    assert!(!ok);
    assert!(
        err.contains("autoscaling.minReplicas must be <= maxReplicas"),
        "{err}"
    );
}
