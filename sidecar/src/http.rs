//! `/metrics`, `/healthz`, `/readyz` and `/slots`.
//!
//! Ready means: the TaskDef was found, a runner is connected and the sidecar is not stopping.
//! Health only says the process serves requests. `/slots` tells the operator how many attempts
//! run here, for scaling on queued plus running work (ADR 0009).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
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

impl perago_telemetry::Observed for Shared {
    fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    fn readiness(&self) -> Result<(), &'static str> {
        if *self.stopping.borrow() {
            Err("stopping")
        } else if !self.hub.connected() {
            Err("no task-body runner connected")
        } else {
            Ok(())
        }
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
    let app = perago_telemetry::router()
        .route("/slots", get(slots))
        .with_state(Shared {
            metrics,
            hub,
            stopping,
        });
    perago_telemetry::serve(addr, app).await
}
