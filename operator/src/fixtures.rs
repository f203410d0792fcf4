//! Test fixtures for the reconcile's unit tests, as controller-rs keeps them: tasks from YAML,
//! the operator's context on a mocked Kubernetes API, and a verifier that answers the calls a
//! reconcile makes at the HTTP level and asserts there are no others.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use kube::runtime::events::Recorder;
use perago_api::PeragoTask;
use serde_json::Value;
use tower_test::mock::{Handle, SendResponse};

use crate::conductor::Conductors;
use crate::context::Context;
use crate::controller::reporter;
use crate::queues::QueueWatch;
use crate::render::Defaults;

/// A PeragoTask from the YAML of its `metadata` and `spec` mappings (flow style).
pub fn task(metadata: &str, spec: &str) -> PeragoTask {
    let yaml = format!(
        "apiVersion: perago.io/v1alpha1\nkind: PeragoTask\nmetadata: {metadata}\nspec: {spec}\n"
    );
    perago_api::manifest::parse(&yaml).unwrap().remove(0).task
}

/// The cluster defaults the rendering tests use.
pub fn defaults() -> Defaults {
    Defaults {
        sidecar_image: "ghcr.io/perago/sidecar:0.1.0".into(),
        conductor_url: Some("http://conductor:8080/api".into()),
        conductor_credentials_secret: None,
        lakefs_endpoint: Some("http://lakefs:8000".into()),
        lakefs_credentials_secret: Some("default-lake".into()),
        lakefs_object_store_hosts: vec!["minio.storage:9000".into()],
        traces_endpoint: None,
        executor_network_policy: Default::default(),
    }
}

/// The Kubernetes API the context of [`mocked_context`] talks to.
pub struct ApiServer(Handle<Request<Body>, Response<Body>>);

/// A context whose Kubernetes API is an [`ApiServer`]; Conductor points at a closed port (the
/// paths tested with it must not call Conductor).
pub fn mocked_context() -> (Arc<Context>, ApiServer) {
    mocked_context_with(None)
}

/// As [`mocked_context`], with the queue watch on, reading every `queue_period`.
pub fn mocked_context_with(queue_period: Option<Duration>) -> (Arc<Context>, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let context = Context {
        recorder: Recorder::new(client.clone(), reporter()),
        client,
        conductor: Conductors::new(Duration::from_millis(200), None, None, Default::default())
            .unwrap(),
        defaults: Defaults {
            conductor_url: Some("http://127.0.0.1:9/api".into()),
            lakefs_endpoint: None,
            lakefs_credentials_secret: None,
            ..defaults()
        },
        resync: Duration::from_secs(60),
        metrics: Arc::new(crate::telemetry::Metrics::new().unwrap()),
        pods: crate::slots::SlotsClient::at_port(crate::render::METRICS_PORT as u16),
        scaler: Default::default(),
        queues: QueueWatch::new(queue_period),
        owned: crate::owned::Owned::empty(),
        tasks: crate::scope::Stores::new(vec![kube::runtime::reflector::store().0]),
        cluster: "test".into(),
    };
    (Arc::new(context), ApiServer(handle))
}

impl ApiServer {
    /// The next call must be `method` on a path ending in `path`; returns its JSON body and
    /// the means to answer it.
    pub async fn expect(&mut self, method: Method, path: &str) -> (Value, Answer) {
        let (called, body, answer) = self.next_call(method.clone()).await;
        assert!(
            called.ends_with(path),
            "expected {method} …{path}, got {called}"
        );
        (body, answer)
    }

    /// The next call must be `method`; returns its path, its JSON body and the means to
    /// answer it (for calls a client makes side by side, in any order).
    pub async fn next_call(&mut self, method: Method) -> (String, Value, Answer) {
        let (request, respond) = self
            .0
            .next_request()
            .await
            .unwrap_or_else(|| panic!("expected a {method} call, but the client stopped"));
        assert_eq!(request.method(), method, "{}", request.uri());
        let path = request.uri().path().to_owned();
        let body = request.into_body().collect_bytes().await.unwrap();
        (
            path,
            serde_json::from_slice(&body).unwrap(),
            Answer(respond),
        )
    }

    /// No further call comes within 100 ms (the channel ends or stays silent).
    pub async fn expect_no_more(mut self) {
        let next = tokio::time::timeout(Duration::from_millis(100), self.0.next_request()).await;
        assert!(!matches!(next, Ok(Some(_))), "an unexpected API call");
    }
}

/// The answer to one call the [`ApiServer`] received.
pub struct Answer(SendResponse<Response<Body>>);

impl Answer {
    pub fn send(self, status: u16, body: &Value) {
        self.0.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(body).unwrap()))
                .unwrap(),
        );
    }
}
