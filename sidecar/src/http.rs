//! `/metrics`, `/healthz`, `/readyz` and `/slots`.
//!
//! Ready means: the TaskDef was found, a runner is connected and the sidecar is not stopping.
//! Health only says the process serves requests. `/slots` tells the operator how many attempts
//! run here, for scaling on queued plus running work (ADR 0009).

use std::net::SocketAddr;
use std::sync::Arc;

use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::routing::get;
use tokio::sync::watch;

use crate::failure::Verdict;
use crate::runner::RunnerHub;
use crate::telemetry::Metrics;

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    hub: Arc<RunnerHub>,
    stopping: watch::Receiver<bool>,
    /// The longest a `/slots` request waits for polls to be answered.
    polls_wait: Duration,
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

/// How much longer than one long poll (`PERAGO_POLL_TIMEOUT_MS`) a `/slots` request waits for
/// polls to be answered: Conductor's answer time on a loaded server. Past it the answer says
/// which polls it could not count, and the operator asks again later.
pub const POLLS_WAIT_MARGIN: Duration = Duration::from_secs(2);

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlotsQuery {
    /// Answer once every poll sent this long before the request arrived has been answered.
    count_polls_older_than_ms: Option<u64>,
}

/// `{"slots": N, "busy": M, "stopping": bool, "pollsCountedOlderThanMs": S, "finished":
/// {"completed": C, "bodyFailed": F, "notJudged": J}}`: every task that a poll sent more than S
/// ms before the request arrived brought is counted in `busy` (0: every poll sent before it).
/// With `?countPollsOlderThanMs=D` the answer waits, up to one long poll and
/// [`POLLS_WAIT_MARGIN`], until that holds for D (ADR 0033). `finished` counts this process's
/// finished attempts by verdict, for a canary's analysis (ADR 0044).
async fn slots(
    State(s): State<Shared>,
    Query(query): Query<SlotsQuery>,
) -> axum::Json<serde_json::Value> {
    let arrived = Instant::now();
    if let Some(cutoff) = query
        .count_polls_older_than_ms
        .and_then(|ms| arrived.checked_sub(Duration::from_millis(ms)))
    {
        s.hub.polls_answered(cutoff, s.polls_wait).await;
    }
    let (busy, uncounted) = s.hub.busy_and_uncounted_polls(arrived);
    // Rounded up: the claim covers a little less than measured, never more.
    let uncounted_ms = uncounted.as_micros().div_ceil(1000);
    axum::Json(serde_json::json!({
        "slots": s.metrics.slots.get(),
        "busy": busy,
        "stopping": *s.stopping.borrow(),
        "pollsCountedOlderThanMs": uncounted_ms,
        "finished": {
            "completed": verdicts(&s.metrics, Verdict::Completed),
            "bodyFailed": verdicts(&s.metrics, Verdict::BodyFailed),
            "notJudged": verdicts(&s.metrics, Verdict::NotJudged),
        },
    }))
}

fn verdicts(metrics: &Metrics, verdict: Verdict) -> u64 {
    metrics
        .attempt_verdicts
        .with_label_values(&[verdict.label()])
        .get()
}

/// Bind and serve in the background; returns the bound address (useful with port 0).
/// `polls_wait`: the longest a `/slots` request waits for polls to be answered.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    hub: Arc<RunnerHub>,
    stopping: watch::Receiver<bool>,
    polls_wait: Duration,
) -> std::io::Result<SocketAddr> {
    let app = perago_telemetry::router()
        .route("/slots", get(slots))
        .with_state(Shared {
            metrics,
            hub,
            stopping,
            polls_wait,
        });
    perago_telemetry::serve(addr, app).await
}
