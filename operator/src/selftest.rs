//! `perago-operator selftest`: what the chart's `helm test` runs in a pod of the release
//! namespace. It checks, as the cluster sees them, the three things an install must give:
//!
//! 1. the PeragoTask API is served (API discovery lists `peragotasks` in `perago.io/v1alpha1`);
//! 2. an operator replica answers `/readyz` on its Service, reached through the apiserver's
//!    service proxy (the path the apiserver also takes to the webhook: no cluster DNS needed);
//! 3. the admission webhook answers: a server-side dry run of a PeragoTask whose
//!    `paramsSchema` is not a JSON Schema must be refused by it, with its message.
//!
//! Each check is retried until `timeout`; the first that never passes ends the run with what
//! was seen.

use std::time::{Duration, Instant};

use http::Request;
use kube::Api;
use kube::api::PostParams;
use perago_api::PeragoTask;

/// Where to find the release's objects.
pub struct Target {
    pub namespace: String,
    /// The operator's metrics Service (port `http`).
    pub service: String,
    /// Whether the chart installed the admission webhook.
    pub webhook: bool,
    pub timeout: Duration,
}

pub fn run(target: Target) -> Result<(), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| format!("starting the async runtime failed: {e}"))?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("connecting to Kubernetes failed: {e}"))?;
        check("the PeragoTask API is served", target.timeout, || {
            api_served(&client)
        })
        .await?;
        check(
            &format!(
                "the operator answers /readyz on Service {}/{}",
                target.namespace, target.service
            ),
            target.timeout,
            || operator_ready(&client, &target),
        )
        .await?;
        if target.webhook {
            check(
                "the admission webhook refuses an invalid PeragoTask",
                target.timeout,
                || webhook_refuses(&client, &target.namespace),
            )
            .await?;
        }
        Ok(())
    })
}

/// Run `attempt` until it passes or `timeout` has passed; prints the outcome.
async fn check<F, Fut>(what: &str, timeout: Duration, mut attempt: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let started = Instant::now();
    loop {
        match attempt().await {
            Ok(seen) => {
                println!("ok: {what} ({seen})");
                return Ok(());
            }
            Err(e) if started.elapsed() >= timeout => {
                println!("FAILED: {what}: {e}");
                return Err(format!("{what}: {e} (for {} s)", timeout.as_secs()));
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
}

async fn api_served(client: &kube::Client) -> Result<String, String> {
    let resources = client
        .list_api_group_resources("perago.io/v1alpha1")
        .await
        .map_err(|e| format!("API discovery of perago.io/v1alpha1 failed: {e}"))?;
    if resources.resources.iter().any(|r| r.name == "peragotasks") {
        Ok("perago.io/v1alpha1 lists peragotasks".into())
    } else {
        Err("perago.io/v1alpha1 does not list peragotasks: is the CRD installed?".into())
    }
}

async fn operator_ready(client: &kube::Client, target: &Target) -> Result<String, String> {
    let path = format!(
        "/api/v1/namespaces/{}/services/{}:http/proxy/readyz",
        target.namespace, target.service
    );
    let request = Request::get(&path)
        .body(Vec::new())
        .map_err(|e| format!("building GET {path}: {e}"))?;
    client
        .request_text(request)
        .await
        .map(|body| format!("GET {path}: {}", body.trim()))
        .map_err(|e| format!("GET {path} failed: {e}"))
}

async fn webhook_refuses(client: &kube::Client, namespace: &str) -> Result<String, String> {
    let probe: PeragoTask = serde_json::from_value(serde_json::json!({
        "apiVersion": "perago.io/v1alpha1",
        "kind": "PeragoTask",
        "metadata": {"name": "perago-selftest-probe", "namespace": namespace},
        "spec": {
            "taskName": "perago.selftest.probe",
            "ownerEmail": "selftest@example.com",
            "paramsSchema": {"type": "object", "properties": {"x": {"type": "no-such-type"}}},
            "resultSchema": {"type": "object"},
            "executor": {"body": {"image": "busybox", "command": ["sh"]}},
        },
    }))
    .map_err(|e| format!("the probe PeragoTask does not parse: {e}"))?;
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match Api::<PeragoTask>::namespaced(client.clone(), namespace)
        .create(&params, &probe)
        .await
    {
        Err(kube::Error::Api(status)) if status.message.contains("not a valid JSON Schema") => {
            Ok(format!("refused: {}", status.message))
        }
        Err(e) => Err(format!("the dry run failed otherwise: {e}")),
        Ok(_) => Err("the dry run was admitted: no webhook judged it (is it registered?)".into()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use http::Response;
    use kube::client::Body;
    use serde_json::json;

    use super::*;

    /// Run `check` against an API that answers its one call with `status` and `body`; returns
    /// the check's outcome and the path it called.
    async fn against<F, Fut>(
        status: u16,
        body: serde_json::Value,
        check: F,
    ) -> (Result<String, String>, String)
    where
        F: FnOnce(kube::Client) -> Fut,
        Fut: std::future::Future<Output = Result<String, String>>,
    {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "perago-system");
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.unwrap();
            let body = match &body {
                serde_json::Value::String(text) => text.clone().into_bytes(),
                other => serde_json::to_vec(other).unwrap(),
            };
            respond.send_response(
                Response::builder()
                    .status(status)
                    .body(Body::from(body))
                    .unwrap(),
            );
            request.uri().to_string()
        });
        let outcome = check(client).await;
        (outcome, server.await.unwrap())
    }

    fn status(code: u16, message: &str) -> serde_json::Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code})
    }

    fn target() -> Target {
        Target {
            namespace: "perago-system".into(),
            service: "perago-operator-metrics".into(),
            webhook: true,
            timeout: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn the_api_is_served_only_when_discovery_lists_peragotasks() {
        let listed = json!({"kind": "APIResourceList", "groupVersion": "perago.io/v1alpha1", "resources": [
            {"name": "peragotasks", "singularName": "peragotask", "namespaced": true, "kind": "PeragoTask", "verbs": ["get"]}]});
        let (ok, path) = against(200, listed, |c| async move { api_served(&c).await }).await;
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(path, "/apis/perago.io/v1alpha1");
        let empty = json!({"kind": "APIResourceList", "groupVersion": "perago.io/v1alpha1", "resources": []});
        let (missing, _) = against(200, empty, |c| async move { api_served(&c).await }).await;
        assert!(missing.unwrap_err().contains("is the CRD installed?"));
        let (absent, _) = against(404, status(404, "not found"), |c| async move {
            api_served(&c).await
        })
        .await;
        assert!(
            absent
                .unwrap_err()
                .contains("API discovery of perago.io/v1alpha1 failed")
        );
    }

    #[tokio::test]
    async fn the_operator_is_asked_through_the_service_proxy() {
        let (ok, path) = against(200, json!("ok"), |c| async move {
            operator_ready(&c, &target()).await
        })
        .await;
        assert_eq!(
            ok.unwrap(),
            "GET /api/v1/namespaces/perago-system/services/perago-operator-metrics:http/proxy/readyz: ok"
        );
        assert_eq!(
            path,
            "/api/v1/namespaces/perago-system/services/perago-operator-metrics:http/proxy/readyz"
        );
        let no_endpoints = status(
            503,
            "no endpoints available for service \"perago-operator-metrics:http\"",
        );
        let (down, _) = against(503, no_endpoints, |c| async move {
            operator_ready(&c, &target()).await
        })
        .await;
        assert!(down.unwrap_err().contains("no endpoints available"));
    }

    #[tokio::test]
    async fn only_the_webhooks_own_refusal_passes() {
        let refused = status(
            422,
            "admission webhook \"validate.perago.io\" denied the request: spec.paramsSchema: not a valid JSON Schema: ...",
        );
        let (ok, path) = against(422, refused, |c| async move {
            webhook_refuses(&c, "perago-system").await
        })
        .await;
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(
            path,
            "/apis/perago.io/v1alpha1/namespaces/perago-system/peragotasks?&dryRun=All"
        );
        let unreachable = status(
            500,
            "Internal error occurred: failed calling webhook \"validate.perago.io\": connection refused",
        );
        let (down, _) = against(500, unreachable, |c| async move {
            webhook_refuses(&c, "perago-system").await
        })
        .await;
        assert!(down.unwrap_err().contains("failed calling webhook"));
        let stored = json!({"apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask",
            "metadata": {"name": "perago-selftest-probe", "namespace": "perago-system"},
            "spec": {"taskName": "perago.selftest.probe", "ownerEmail": "selftest@example.com",
                "paramsSchema": {"type": "object"}, "resultSchema": {"type": "object"},
                "executor": {"body": {"image": "busybox", "command": ["sh"]}}}});
        let (admitted, _) = against(201, stored, |c| async move {
            webhook_refuses(&c, "perago-system").await
        })
        .await;
        assert!(admitted.unwrap_err().contains("no webhook judged it"));
    }

    #[tokio::test]
    async fn a_check_that_never_passes_ends_with_what_was_seen() {
        let failed = check("the thing", Duration::from_millis(10), || async {
            Err::<String, _>("still broken".into())
        })
        .await;
        assert_eq!(failed.unwrap_err(), "the thing: still broken (for 0 s)");
    }
}
