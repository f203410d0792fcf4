//! The Helm chart: `helm lint`, `helm template`, the chart's CRD equal to the generated one,
//! and every rendered object accepted by the real kube-apiserver (server-side apply, dry run).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use perago_e2e::process::obtain;
use perago_e2e::{Selection, shared};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/perago-operator")
}

fn helm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(obtain("helm").unwrap())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_chart_lints_and_carries_the_generated_crd() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let (ok, out, err) = helm(&[
        "lint",
        chart,
        "--strict",
        "--set",
        "conductor.url=http://conductor:8080/api",
    ]);
    assert!(ok, "{out}{err}");
    let generated = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/peragotasks.perago.io.yaml"),
    )
    .unwrap();
    let in_chart =
        std::fs::read_to_string(Path::new(chart).join("crds/peragotasks.perago.io.yaml")).unwrap();
    assert_eq!(
        in_chart, generated,
        "charts/perago-operator/crds is a copy of crds/ (make crds)"
    );
    let (ok, _, err) = helm(&["template", "t", chart, "--kube-version", "1.35.4"]);
    assert!(!ok);
    assert!(err.contains("conductor.url is required"), "{err}");

    let meta: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(Path::new(chart).join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        meta["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "the chart's appVersion (the default image tag) is the workspace version"
    );
}

#[test]
fn values_the_schema_refuses_name_the_value() {
    let chart = chart();
    for (value, message) in [
        ("replicas=two", "at '/replicas': got string, want integer"),
        (
            "metrics.serviceMonitr.enabled=true",
            "additional properties 'serviceMonitr' not allowed",
        ),
        (
            "conductor.url=conductor:8080",
            "'conductor:8080' does not match pattern",
        ),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        (
            "tracing.otlpEndpoint=otel-collector:4317",
            "'otel-collector:4317' does not match pattern",
        ),
        (
            "executorNetworkPolicy.enabled=true",
            "executorNetworkPolicy.enabled needs egress rules",
        ),
    ] {
        let (ok, _, err) = helm(&[
            "template",
            "t",
            chart.to_str().unwrap(),
            "--kube-version",
            "1.35.4",
            "--set",
            "conductor.url=http://conductor:8080/api",
            "--set",
            value,
        ]);
        assert!(!ok, "{value} accepted");
        assert!(err.contains(message), "{value}: {err}");
    }
}

#[tokio::test]
async fn rendered_chart_objects_pass_the_apiserver() {
    let services = shared(Selection {
        kube: true,
        ..Selection::default()
    })
    .await;
    let client = services.kube().client().await.unwrap();
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "perago-system"}})).unwrap();
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;

    install_monitoring_crds(&client).await;

    let chart = chart();
    for extra in [
        &[][..],
        &[
            "--set",
            "leaderElection.enabled=false",
            "--set",
            "lakefs.endpoint=http://lakefs:8000",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.podMonitor.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "grafana.dashboard.enabled=true",
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor",
            "--api-versions",
            "monitoring.coreos.com/v1/PodMonitor",
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
            "--set",
            "conductor.credentialsSecret=conductor-key",
            "--set",
            "networkPolicy.enabled=true",
            "--set-json",
            r#"networkPolicy.metricsFrom=[{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]"#,
            "--set-json",
            r#"networkPolicy.egress=[{"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 6443}]}]"#,
            "--set",
            "executorNetworkPolicy.enabled=true",
            "--set-json",
            r#"executorNetworkPolicy.egress=[{"to": [{"namespaceSelector": {}}]}]"#,
            // Client certificates for the operator and the staging-gc job, and the CA.
            "--set",
            "conductor.clientCertificateRef.name=gateway-client",
            "--set",
            "lakefs.clientCertificateRef.name=lake-client",
            "--set",
            "conductor.caBundleRef.configMap.name=corp-ca",
            "--set",
            "stagingGc.enabled=true",
            "--set",
            "stagingGc.repositories={lake-data}",
        ][..],
    ] {
        let mut args = vec![
            "template",
            "perago",
            chart.to_str().unwrap(),
            "--namespace",
            "perago-system",
            "--kube-version",
            "1.35.4",
            "--include-crds",
            "--set",
            "conductor.url=http://conductor:8080/api",
        ];
        args.extend_from_slice(extra);
        let (ok, out, err) = helm(&args);
        assert!(ok, "{err}");
        assert_eq!(
            out.contains("key: CONDUCTOR_AUTH_KEY"),
            !extra.is_empty(),
            "the operator reads the Conductor key only when a credentials Secret is named"
        );
        assert_eq!(
            out.matches("name: PERAGO_CONDUCTOR_CLIENT_CERT_FILE")
                .count(),
            if extra.is_empty() { 0 } else { 2 },
            "the operator and the staging-gc job present the client certificate when one is named"
        );
        let mut kinds = Vec::new();
        for value in perago_e2e::yaml_documents(&out) {
            let obj: DynamicObject = serde_yaml::from_value(value).unwrap();
            let types = obj.types.clone().unwrap();
            let (group, version) = types
                .api_version
                .rsplit_once('/')
                .unwrap_or(("", &types.api_version));
            let gvk = GroupVersionKind::gvk(group, version, &types.kind);
            let (resource, caps) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
            let api: Api<DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
                Api::namespaced_with(client.clone(), "perago-system", &resource)
            } else {
                Api::all_with(client.clone(), &resource)
            };
            let name = obj.metadata.name.clone().unwrap();
            api.patch(
                &name,
                &PatchParams::apply("perago-test").dry_run(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap_or_else(|e| panic!("{} {name}: {e}", types.kind));
            kinds.push(types.kind);
        }
        for expected in [
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "Deployment",
            "Role",
            "ValidatingWebhookConfiguration",
        ] {
            assert!(
                kinds.iter().any(|k| k == expected),
                "{expected} missing from {kinds:?}"
            );
        }
        assert_eq!(
            out.contains("name: perago-operator-leader\n"),
            extra.is_empty(),
            "the leader Role follows leaderElection.enabled"
        );
        assert_eq!(
            kinds.iter().any(|k| k == "NetworkPolicy"),
            !extra.is_empty(),
            "the operator's NetworkPolicy follows networkPolicy.enabled"
        );
        for monitor in ["ServiceMonitor", "PodMonitor"] {
            assert_eq!(
                kinds.iter().any(|k| k == monitor),
                !extra.is_empty(),
                "{monitor} follows its metrics.*.enabled value"
            );
        }
    }
}

/// The Prometheus Operator's ServiceMonitor and PodMonitor CRDs, Established.
async fn install_monitoring_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let dir = obtain("monitoring-crds").unwrap();
    for file in [
        "monitoring.coreos.com_servicemonitors.yaml",
        "monitoring.coreos.com_podmonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ] {
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
        perago_e2e::apply_crd(client, &crd, "perago-test")
            .await
            .unwrap();
    }
    // Discovery caches may lag the new groups by a moment.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
}

/// What a shared cluster's install needs: the chart as a subchart of an umbrella chart that
/// sets `global`; renamed objects; a PodDisruptionBudget while there is more than one replica;
/// the operator's pod placed and given environment and volumes; NOTES that say what to do.
#[tokio::test]
async fn the_chart_fits_umbrella_charts_and_shared_clusters() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let template = |extra: &[&str]| {
        let mut args = vec![
            "template",
            "t",
            chart,
            "--kube-version",
            "1.35.4",
            "--set",
            "conductor.url=http://conductor:8080/api",
        ];
        args.extend_from_slice(extra);
        let (ok, out, err) = helm(&args);
        assert!(ok, "{extra:?}: {err}");
        perago_e2e::yaml_documents(&out)
            .into_iter()
            .map(|d| serde_json::to_value(d).unwrap())
            .collect::<Vec<serde_json::Value>>()
    };
    let kinds = |objects: &[serde_json::Value]| -> Vec<String> {
        objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap().to_owned())
            .collect()
    };

    // An umbrella chart whose only dependency is this chart, with `global` set.
    let umbrella = tempfile::tempdir().unwrap();
    std::fs::write(
        umbrella.path().join("Chart.yaml"),
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n\
         dependencies: [{name: perago-operator, version: 0.1.0}]\n",
    )
    .unwrap();
    std::fs::create_dir(umbrella.path().join("charts")).unwrap();
    let sub = umbrella.path().join("charts/perago-operator");
    let copied = Command::new("cp")
        .args(["-r", chart, sub.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(copied.success());
    let (ok, out, err) = helm(&[
        "template",
        "platform",
        umbrella.path().to_str().unwrap(),
        "--kube-version",
        "1.35.4",
        "--set",
        "global.imageRegistry=registry.example.com",
        "--set",
        "perago-operator.conductor.url=http://conductor:8080/api",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("kind: Deployment"), "{out}");

    // Two replicas (the default): a PodDisruptionBudget keeps one up through a drain.
    let objects = template(&[]);
    let pdb = objects
        .iter()
        .find(|o| o["kind"] == "PodDisruptionBudget")
        .expect("a PodDisruptionBudget with two replicas");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert!(!kinds(&template(&["--set", "replicas=1"])).contains(&"PodDisruptionBudget".into()));
    assert!(
        !kinds(&template(&["--set", "podDisruptionBudget.enabled=false"]))
            .contains(&"PodDisruptionBudget".into())
    );

    // Renamed: every object of the release carries the new name.
    for object in template(&["--set", "fullnameOverride=data-perago"]) {
        let name = object["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("data-perago"), "{name}");
    }

    // Placed, labelled and given environment and volumes.
    let objects = template(&[
        "--set",
        "priorityClassName=platform-critical",
        "--set",
        "podLabels.team=data",
        "--set",
        "podAnnotations.example\\.com/owner=data-platform",
        "--set",
        "topologySpreadConstraints[0].maxSkew=1",
        "--set",
        "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "--set",
        "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "--set",
        "extraEnv[0].name=SSL_CERT_FILE",
        "--set",
        "extraEnv[0].value=/etc/proxy-ca/ca.crt",
        "--set",
        "extraVolumes[0].name=proxy-ca",
        "--set",
        "extraVolumes[0].configMap.name=proxy-ca",
        "--set",
        "extraVolumeMounts[0].name=proxy-ca",
        "--set",
        "extraVolumeMounts[0].mountPath=/etc/proxy-ca",
    ]);
    let pod = &objects.iter().find(|o| o["kind"] == "Deployment").unwrap()["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["team"], "data");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        "perago-operator"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["example.com/owner"],
        "data-platform"
    );
    let spec = &pod["spec"];
    assert_eq!(spec["priorityClassName"], "platform-critical");
    assert_eq!(
        spec["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    assert_eq!(spec["volumes"][0]["configMap"]["name"], "proxy-ca");
    let container = &spec["containers"][0];
    assert!(
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "SSL_CERT_FILE" && e["value"] == "/etc/proxy-ca/ca.crt"),
        "{container}"
    );
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/etc/proxy-ca");

    // NOTES say what was installed and what to run next (helm prints them after an install).
    let services = shared(Selection {
        kube: true,
        ..Selection::default()
    })
    .await;
    let (ok, out, err) = helm(&[
        "install",
        "notes",
        chart,
        "--dry-run=client",
        "--kubeconfig",
        services.kube().kubeconfig.to_str().unwrap(),
        "--set",
        "conductor.url=http://conductor:8080/api",
    ]);
    assert!(ok, "{err}");
    let notes = &out[out.find("NOTES:").expect("NOTES printed")..];
    for expected in [
        "2 operator replica(s) (perago-operator)",
        "kubectl -n default rollout status deployment/perago-operator",
        "lakefs.endpoint is not set",
    ] {
        assert!(
            notes.contains(expected),
            "{expected:?} missing from {notes}"
        );
    }
}

/// The chart's README lists every value with its type, default and comment; it is generated
/// (`make chart-readme`) and this fails when the committed one is stale.
#[test]
fn the_chart_readme_lists_every_value() {
    let chart = chart();
    let values = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json")).unwrap())
            .unwrap();
    let rendered =
        perago_e2e::chart_readme::render(&values, &schema).unwrap_or_else(|e| panic!("{e:#}"));
    let path = chart.join("README.md");
    if std::env::var_os("PERAGO_WRITE_CHART_README").is_some() {
        std::fs::write(&path, &rendered).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "charts/perago-operator/README.md is stale: run `make chart-readme`"
    );
}
