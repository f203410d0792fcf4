//! The operator's metrics and its `/metrics`, `/healthz` and `/readyz` endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::get;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub reconciles: IntCounterVec,
    pub reconcile_seconds: HistogramVec,
    pub conductor_calls: IntCounterVec,
    pub leader: IntGauge,
    /// Set once this process leads and runs the controller.
    pub ready: AtomicBool,
    /// False while the admission webhook (when enabled) does not serve yet.
    pub webhook_ready: AtomicBool,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new(
                "perago_operator_reconciles_total",
                "Reconciles by outcome (ok, error).",
            ),
            &["outcome"],
        )?;
        let reconcile_seconds = HistogramVec::new(
            HistogramOpts::new(
                "perago_operator_reconcile_duration_seconds",
                "Seconds per reconcile.",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            &[],
        )?;
        let conductor_calls = IntCounterVec::new(
            Opts::new(
                "perago_operator_conductor_calls_total",
                "Conductor metadata calls by call and outcome.",
            ),
            &["call", "outcome"],
        )?;
        let leader = IntGauge::new(
            "perago_operator_leader",
            "1 while this process holds the leader lease.",
        )?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(reconcile_seconds.clone()))?;
        registry.register(Box::new(conductor_calls.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(Self {
            registry,
            reconciles,
            reconcile_seconds,
            conductor_calls,
            leader,
            ready: AtomicBool::new(false),
            webhook_ready: AtomicBool::new(true),
        })
    }

    fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

async fn metrics(State(m): State<Arc<Metrics>>) -> impl axum::response::IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
}

/// Ready means: leading and reconciling, or a healthy standby waiting for the lease.
async fn readyz(State(m): State<Arc<Metrics>>) -> (StatusCode, &'static str) {
    if m.ready.load(Ordering::Relaxed) && m.webhook_ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

pub async fn serve(addr: SocketAddr, metrics_: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(metrics_);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    });
    Ok(bound)
}
