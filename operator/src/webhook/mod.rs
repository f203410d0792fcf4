//! The validating admission webhook: the apiserver asks every replica (through the webhook
//! Service) whether a PeragoTask may be created or updated, and the answer is the check the
//! reconciler makes, with `perago-operator check`'s messages: errors refuse the object, warnings
//! come back as admission warnings (`kubectl apply` prints them).
//!
//! Objects that got in before the webhook existed still turn `Stalled/InvalidSpec` when
//! reconciled. See ADR 0008 for the failure policy and the certificates.

pub mod tls;

use std::net::SocketAddr;

use axum::routing::post;
use axum::{Json, Router};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::Status;
use perago_api::PeragoTask;

/// The path the ValidatingWebhookConfiguration calls.
pub const PATH: &str = "/validate-peragotask";

/// The answer to one review.
pub fn review(review: AdmissionReview<PeragoTask>) -> AdmissionReview<DynamicObject> {
    let request: AdmissionRequest<PeragoTask> = match review.try_into() {
        Ok(request) => request,
        Err(e) => return AdmissionResponse::invalid(e.to_string()).into_review(),
    };
    let response = AdmissionResponse::from(&request);
    let task = match (&request.operation, &request.object) {
        (Operation::Create | Operation::Update, Some(task)) => task,
        // Only create and update are registered; anything else is not ours to judge.
        _ => return response.into_review(),
    };
    // An update that leaves the spec as it was (finalizers, labels, a deletion) is let through:
    // an object stored before the webhook existed must still be reconciled (to Stalled) and
    // deleted, and only a change of the spec can make it worse.
    let unchanged = request.old_object.as_ref().is_some_and(|old| {
        serde_json::to_value(&old.spec).ok() == serde_json::to_value(&task.spec).ok()
    });
    if unchanged || task.metadata.deletion_timestamp.is_some() {
        return response.into_review();
    }
    match crate::controller::checked(&task.spec) {
        Ok((_, _, warnings)) => {
            let mut response = response;
            if !warnings.is_empty() {
                response.warnings = Some(warnings);
            }
            response.into_review()
        }
        Err(invalid) => {
            let message = invalid.to_string();
            let mut response = response.deny(&message);
            // 422, as the apiserver answers its own validation errors.
            response.result = Status::failure(&message, "Invalid").with_code(422);
            response.into_review()
        }
    }
}

async fn handle(
    Json(body): Json<AdmissionReview<PeragoTask>>,
) -> Json<AdmissionReview<DynamicObject>> {
    Json(review(body))
}

/// Serve the webhook over TLS on `addr`; `listening` runs once it accepts connections.
pub async fn serve(
    addr: SocketAddr,
    config: axum_server::tls_rustls::RustlsConfig,
    listening: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new().route(PATH, post(handle));
    let handle = axum_server::Handle::new();
    let server = axum_server::bind_rustls(addr, config).handle(handle.clone());
    tokio::spawn(async move {
        if handle.listening().await.is_some() {
            tracing::info!(%addr, "admission webhook serving");
            listening();
        }
    });
    server.serve(app.into_make_service()).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn request(spec_patch: serde_json::Value) -> AdmissionReview<PeragoTask> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/examples/workspace-task.yaml");
        let mut task: serde_json::Value =
            serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for (k, v) in spec_patch.as_object().unwrap() {
            task["spec"][k] = v.clone();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "perago.io", "version": "v1alpha1", "kind": "PeragoTask"},
                "resource": {"group": "perago.io", "version": "v1alpha1", "resource": "peragotasks"},
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "name": "features-build",
                "namespace": "data",
                "object": task,
                "dryRun": false,
            },
        }))
        .unwrap()
    }

    fn answer(review: AdmissionReview<DynamicObject>) -> serde_json::Value {
        serde_json::to_value(review).unwrap()["response"].clone()
    }

    #[test]
    fn a_valid_task_is_allowed_with_its_warnings() {
        let r = answer(review(request(serde_json::json!({
            "workspace": {"prefix": "/audio/render", "readOnly": true},
        }))));
        assert_eq!(r["uid"], "u-1");
        assert_eq!(r["allowed"], true);
        assert!(
            r["warnings"][0]
                .as_str()
                .unwrap()
                .contains("publish_budget is ignored"),
            "{r}"
        );
    }

    #[test]
    fn an_update_that_keeps_an_invalid_spec_is_let_through_and_one_that_changes_it_is_not() {
        let mut update = request(serde_json::json!({"controls": {"timeout": {"seconds": 300}}}));
        let req = update.request.as_mut().unwrap();
        req.operation = Operation::Update;
        req.old_object = req.object.clone();
        assert_eq!(answer(review(update.clone()))["allowed"], true);
        let req = update.request.as_mut().unwrap();
        if let Some(old) = req.old_object.as_mut() {
            old.spec.controls.retry.count = 1;
        }
        assert_eq!(answer(review(update))["allowed"], false);
    }

    #[test]
    fn an_invalid_task_is_refused_with_the_checks_message() {
        let r = answer(review(request(serde_json::json!({
            "controls": {"timeout": {"seconds": 300}},
        }))));
        assert_eq!(r["allowed"], false);
        assert_eq!(r["status"]["code"], 422);
        assert!(
            r["status"]["message"].as_str().unwrap().contains(
                "Conductor requires responseTimeoutSeconds (600) <= timeoutSeconds (300)"
            ),
            "{r}"
        );
    }
}
