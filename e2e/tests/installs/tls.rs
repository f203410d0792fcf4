//! Conductor and lakeFS behind a private certificate authority, on the real node: both servers
//! serve HTTPS themselves with a certificate from an authority this test makes, and the
//! operator is installed trusting it (`conductor.caBundleRef`). An executor pod trusts the
//! servers only with the task's `tls.caBundleRef`; `kubectl perago` only with `--ca-file` or
//! the platform's `SSL_CERT_FILE`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use perago_e2e::cluster::{Cluster, OPERATOR_NAMESPACE, RELEASE};
use perago_e2e::lake::Lake;
use perago_e2e::node::BUSYBOX_BODY_IMAGE;
use perago_e2e::pki::{Authority, Usage};
use perago_e2e::pod::ConductorApi;
use perago_e2e::services::{Conductor, LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY, LakeFs};
use perago_e2e::{Selection, shared};
use serde_json::json;

use super::{Turn, delete_tasks, uninstall};

const NAMESPACE: &str = "tls";

/// A ConfigMap `corp-ca` holding the authority's certificate as `ca.crt`, as trust-manager
/// would write it.
fn ca_config_map(namespace: &str, pem: &str) -> String {
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "corp-ca", "namespace": namespace},
        "data": {"ca.crt": pem},
    }))
    .unwrap()
}

/// A workspace task on the HTTPS servers; `tls` is merged into both connections.
fn task(name: &str, conductor: &str, lakefs: &str, tls: serde_json::Value) -> String {
    let script = "echo trusted > \"$PERAGO_WORKSPACE/out.txt\"; printf '{\"files\": 1}' > \"$PERAGO_RESULT\"";
    serde_json::to_string(&json!({
        "apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "taskName": format!("{NAMESPACE}.{name}"),
            "ownerEmail": "e2e@example.com",
            "workspace": {"prefix": "/data"},
            "paramsSchema": {"type": "object"},
            "resultSchema": {"type": "object", "properties": {"files": {"type": "integer"}}},
            "controls": {"retry": {"count": 0}, "timeout": {"responseSeconds": 30}},
            "conductor": {"url": conductor, "tls": tls},
            "lakefs": {"endpoint": lakefs, "tls": tls},
            "executor": {"body": {"image": BUSYBOX_BODY_IMAGE, "command": ["sh", "-c", script]}},
        },
    }))
    .unwrap()
}

/// The PeragoTask's `Ready` condition once its message contains `text`.
async fn ready_saying(client: &kube::Client, name: &str, text: &str) -> Condition {
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), NAMESPACE);
    let mut last = None;
    for _ in 0..1200 {
        let task = tasks.get(name).await.unwrap();
        last = task
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"));
        if let Some(c) = last.as_ref().filter(|c| c.message.contains(text)) {
            return c.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{NAMESPACE}/{name}: Ready never said {text:?}; last {last:?}");
}

#[tokio::test]
async fn servers_behind_a_private_ca_are_trusted_with_its_bundle_only() {
    if perago_e2e::node_opted_out("servers_behind_a_private_ca_are_trusted_with_its_bundle_only") {
        return;
    }
    let services = shared(Selection::ALL).await;
    let mut turn = Turn::take(
        "tls::servers_behind_a_private_ca_are_trusted_with_its_bundle_only",
        services,
    )
    .await;
    turn.release(RELEASE, OPERATOR_NAMESPACE);
    let dir = services.dir().join("private-ca");
    let authority = Authority::create(&dir.join("pki")).unwrap();
    let serving = authority
        .issue(
            "servers",
            "perago-e2e-servers",
            &Usage::Server {
                names: &["localhost"],
                addresses: &[services.host],
            },
        )
        .unwrap();
    let (conductor, lakefs) = tokio::join!(
        Conductor::start_serving(&dir, services.host, Some(&serving)),
        LakeFs::start_serving(&dir, services.host, Some(&serving)),
    );
    let (conductor, lakefs) = (conductor.unwrap(), lakefs.unwrap());
    let pem = std::fs::read_to_string(&authority.cert).unwrap();

    let cluster = Cluster::new(services).unwrap();
    cluster.restricted_namespace(OPERATOR_NAMESPACE).unwrap();
    cluster
        .apply(&ca_config_map(OPERATOR_NAMESPACE, &pem))
        .unwrap();
    cluster
        .install_operator(&["--set", "conductor.caBundleRef.configMap.name=corp-ca"])
        .unwrap();
    cluster.task_namespace(NAMESPACE).unwrap();
    cluster.apply(&ca_config_map(NAMESPACE, &pem)).unwrap();
    let client = services.kube().client().await.unwrap();
    let bundle = |key: &str| json!({"caBundleRef": {"configMap": {"name": "corp-ca", "key": key}}});

    // Without the bundle the sidecar cannot verify Conductor: the task says so.
    let (https_conductor, https_lakefs) = (&conductor.api_url, &lakefs.endpoint);
    cluster
        .apply(&task("untrusted", https_conductor, https_lakefs, json!({})))
        .unwrap();
    // A key the ConfigMap does not have: the sidecar names the setting and the path.
    cluster
        .apply(&task(
            "missing-key",
            https_conductor,
            https_lakefs,
            bundle("absent.crt"),
        ))
        .unwrap();
    cluster
        .apply(&task(
            "trusted",
            https_conductor,
            https_lakefs,
            bundle("ca.crt"),
        ))
        .unwrap();

    let untrusted = ready_saying(&client, "untrusted", "certificate").await;
    assert_eq!(untrusted.status, "False");
    assert!(
        untrusted
            .message
            .contains(https_conductor.trim_end_matches("/api"))
            || untrusted.message.contains("Conductor"),
        "names the endpoint: {}",
        untrusted.message
    );
    eprintln!("without the bundle: {}", untrusted.message);
    let missing = ready_saying(&client, "missing-key", "PERAGO_CONDUCTOR_CA_FILE=").await;
    assert!(
        missing.message.contains("cannot read the CA bundle"),
        "{}",
        missing.message
    );
    eprintln!("a missing key: {}", missing.message);

    cluster.wait_ready(NAMESPACE, "trusted").unwrap();
    let lake = Lake::new(https_lakefs);
    let repository = format!("tls-{}", std::process::id());
    let input_ref = lake
        .seed(&repository, &[("data/in.txt", "seed")])
        .await
        .unwrap();
    let api = ConductorApi::new(https_conductor);
    let workflow = api
        .start(
            &format!("{NAMESPACE}.trusted"),
            "https",
            json!({
                "workspace": {"repository": repository, "branch": "main", "refType": "commit", "ref": input_ref},
                "params": {},
            }),
        )
        .await;
    let finished = api.finished(&workflow).await;
    let step = &finished["tasks"][0];
    assert_eq!(step["status"], "COMPLETED", "{step}");
    let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
    assert_eq!(
        lake.object(&repository, head, "data/out.txt")
            .await
            .unwrap(),
        "trusted\n"
    );

    // kubectl perago trusts the authority with --ca-file, and only then.
    let plugin = perago_e2e::process::release_binaries(&["kubectl-perago"], "the plugin's test")
        .unwrap()
        .join("kubectl-perago");
    let history = |trust: Option<(&str, &std::path::Path)>| {
        let mut command = std::process::Command::new(&plugin);
        command
            .args(["history", "--repository", &repository, "--branch", "main"])
            .args(["-o", "json"])
            .env("LAKECTL_SERVER_ENDPOINT_URL", https_lakefs)
            .env("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID)
            .env(
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                LAKEFS_SECRET_ACCESS_KEY,
            )
            .env_remove("CONDUCTOR_SERVER_URL")
            .env_remove("PERAGO_CA_FILE")
            .env_remove("SSL_CERT_FILE")
            .env_remove("SSL_CERT_DIR");
        match trust {
            Some(("--ca-file", path)) => command.arg("--ca-file").arg(path),
            Some((variable, path)) => command.env(variable, path),
            None => &mut command,
        };
        command.output().unwrap()
    };
    let refused = history(None);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("certificate"), "{stderr}");
    // The flag, or the platform's own bundle variable (read with the OS store's roots).
    for trust in ["--ca-file", "SSL_CERT_FILE"] {
        let trusted = history(Some((trust, &authority.cert)));
        assert_eq!(
            trusted.status.code(),
            Some(0),
            "{trust}: {}",
            String::from_utf8_lossy(&trusted.stderr)
        );
        let view: serde_json::Value = serde_json::from_slice(&trusted.stdout).unwrap();
        assert_eq!(view["head"], json!(head), "{trust}: {view}");
    }

    // Leave the cluster as found: the tasks go while their operator runs (its finalizer
    // applies the TaskDef deletion policy on this Conductor, still serving), then the
    // release; the HTTPS servers stop after them, and the turn deletes the namespaces (the
    // operator's with its `corp-ca` ConfigMap).
    delete_tasks(&cluster, NAMESPACE);
    uninstall(&cluster, RELEASE, OPERATOR_NAMESPACE);
    drop((conductor, lakefs));
}
