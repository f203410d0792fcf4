//! What the operator and the sidecar share to be observed: one JSON log setup, the build's
//! metric, and the HTTP server of `/metrics`, `/healthz` and `/readyz` each binary adds its
//! own routes to.

use std::net::SocketAddr;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tracing_subscriber::EnvFilter;

/// Install the JSON log subscriber on standard error. `PERAGO_LOG` (else `RUST_LOG`, else
/// `info`) sets the filter; each event carries the span it happened in.
pub fn init_logging() {
    let filter = std::env::var("PERAGO_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".into());
    let _ = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .with_target(false)
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}

/// The source revision this build was made from: `PERAGO_REVISION` when it was compiled
/// (`make release-binaries` sets the commit), else `unknown`.
pub const REVISION: &str = match option_env!("PERAGO_REVISION") {
    Some(revision) => revision,
    None => "unknown",
};

/// Register `perago_build_info{version, revision}`, always 1: which build a process runs.
pub fn register_build_info(registry: &prometheus::Registry) -> prometheus::Result<()> {
    let info = prometheus::IntGaugeVec::new(
        prometheus::Opts::new(
            "perago_build_info",
            "Always 1, labelled with the version and the source revision of this build.",
        ),
        &["version", "revision"],
    )?;
    info.with_label_values(&[env!("CARGO_PKG_VERSION"), REVISION])
        .set(1);
    registry.register(Box::new(info))
}

/// What a binary tells its probes and scrapes.
pub trait Observed: Clone + Send + Sync + 'static {
    /// The Prometheus text exposition of every metric.
    fn render_metrics(&self) -> String;
    /// `Err(why)` while not ready, e.g. `"stopping"`.
    fn readiness(&self) -> Result<(), &'static str>;
}

/// `/metrics`, `/healthz` (the process serves requests) and `/readyz` over `state`; add a
/// binary's own routes with [`Router::route`] before [`serve`].
pub fn router<S: Observed>() -> Router<S> {
    Router::new()
        .route("/metrics", get(metrics::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz::<S>))
}

async fn metrics<S: Observed>(
    axum::extract::State(s): axum::extract::State<S>,
) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.render_metrics(),
    )
}

async fn readyz<S: Observed>(
    axum::extract::State(s): axum::extract::State<S>,
) -> (StatusCode, String) {
    match s.readiness() {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// Bind and serve `app` in the background; returns the bound address (useful with port 0).
pub async fn serve(addr: SocketAddr, app: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    });
    Ok(bound)
}
