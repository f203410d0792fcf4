//! `perago-operator render` against the real kube-apiserver: the ConfigMap and Deployment of
//! every example PeragoTask pass the apiserver's validation (server-side dry run), including
//! the native sidecar, probes and security contexts.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use perago_e2e::process::stdout_of;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, PostParams};
use perago_e2e::{Selection, shared};

async fn client() -> Client {
    let services = shared(Selection {
        kube: true,
        ..Selection::default()
    })
    .await;
    services.kube().client().await.unwrap()
}

#[tokio::test]
async fn rendered_objects_of_every_example_pass_apiserver_validation() {
    let client = client().await;
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let mut files: Vec<_> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-task.yaml"))
        .collect();
    files.sort();
    let dry = PostParams {
        dry_run: true,
        field_manager: Some("perago-test".into()),
    };
    let mut deployments = 0;
    for file in files {
        let text = stdout_of(
            Command::new(env!("CARGO_BIN_EXE_perago-operator"))
                .args([
                    "render",
                    "--conductor-url",
                    "http://conductor:8080/api",
                    "--lakefs-endpoint",
                    "http://lakefs:8000",
                    "-f",
                ])
                .arg(&file),
        );
        for value in perago_e2e::yaml_documents(&text) {
            match value["kind"].as_str() {
                Some("ConfigMap") => {
                    let cm: ConfigMap = serde_yaml::from_value(value).unwrap();
                    Api::<ConfigMap>::namespaced(client.clone(), "default")
                        .create(&dry, &cm)
                        .await
                        .unwrap();
                }
                Some("Deployment") => {
                    let d: Deployment = serde_yaml::from_value(value).unwrap();
                    let created = Api::<Deployment>::namespaced(client.clone(), "default")
                        .create(&dry, &d)
                        .await
                        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                    let pod = created.spec.unwrap().template.spec.unwrap();
                    let sidecar = &pod.init_containers.unwrap()[0];
                    assert_eq!(
                        sidecar.restart_policy.as_deref(),
                        Some("Always"),
                        "kept by the apiserver"
                    );
                    deployments += 1;
                }
                other => panic!("unexpected document kind {other:?}"),
            }
        }
    }
    assert_eq!(deployments, 4, "one Deployment per example");
}

/// The chart's PodMonitor selects the executor pods the operator renders, on the sidecar's
/// named metrics port.
#[test]
fn the_chart_pod_monitor_selects_rendered_executor_pods() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let helm = perago_e2e::process::obtain("helm").unwrap();
    let chart = stdout_of(
        Command::new(helm)
            .arg("template")
            .arg("perago")
            .arg(repo.join("charts/perago-operator"))
            .args([
                "--kube-version",
                "1.35.4",
                "--set",
                "conductor.url=http://c/api",
                "--set",
                "metrics.podMonitor.enabled=true",
                "--api-versions",
                "monitoring.coreos.com/v1/PodMonitor",
            ]),
    );
    let monitor = perago_e2e::yaml_document(&chart, "PodMonitor").expect("a PodMonitor");

    let rendered = stdout_of(
        Command::new(env!("CARGO_BIN_EXE_perago-operator"))
            .args(["render", "--conductor-url", "http://c/api", "-f"])
            .arg(repo.join("deploy/examples/workspace-task.yaml")),
    );
    let deployment: Deployment =
        serde_yaml::from_value(perago_e2e::yaml_document(&rendered, "Deployment").unwrap())
            .unwrap();
    let template = deployment.spec.unwrap().template;
    let labels = template.metadata.unwrap().labels.unwrap();
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap();
    assert!(!selector.is_empty());
    for (key, value) in selector {
        assert_eq!(
            labels.get(key.as_str().unwrap()).map(String::as_str),
            value.as_str(),
            "pod label {key:?}"
        );
    }
    let port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
        .as_str()
        .unwrap();
    let sidecar_ports: Vec<String> = template
        .spec
        .unwrap()
        .init_containers
        .unwrap()
        .into_iter()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .flat_map(|c| c.ports.unwrap_or_default())
        .filter_map(|p| p.name)
        .collect();
    assert_eq!(sidecar_ports, [port]);
}
