//! `/metrics`, `/healthz`, `/readyz` and `/slots`.
//!
//! Ready means: the TaskDef was found, a runner is connected and the sidecar is not stopping.
//! Health only says the process serves requests. `/slots` tells the operator how many attempts
//! run here, for scaling on queued plus running work (ADR 0009).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

use crate::runner::RunnerHub;
use crate::telemetry::Metrics;

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    hub: Arc<RunnerHub>,
    stopping: watch::Receiver<bool>,
}

async fn render_metrics(State(s): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<Shared>) -> (StatusCode, &'static str) {
    if *s.stopping.borrow() {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n")
    } else if !s.hub.connected() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no task-body runner connected\n",
        )
    } else {
        (StatusCode::OK, "ok\n")
    }
}

/// `{"slots": N, "busy": M, "stopping": bool}`.
async fn slots(State(s): State<Shared>) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({
        "slots": s.metrics.slots.get(),
        "busy": s.metrics.slots_busy.get(),
        "stopping": *s.stopping.borrow(),
    }))
}

/// Bind and serve in the background; returns the bound address (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    hub: Arc<RunnerHub>,
    stopping: watch::Receiver<bool>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/slots", get(slots))
        .with_state(Shared {
            metrics,
            hub,
            stopping,
        });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    });
    Ok(bound)
}
