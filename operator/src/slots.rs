//! Asking an executor pod how many of its slots are busy (`GET /slots` on its sidecar,
//! ADR 0030): the client, its bounds, and how an answer, or its absence, becomes a
//! [`Figure`]. Who asks and when is the census's business (`crate::census`).

use std::time::{Duration, Instant};

use serde::Deserialize;

use perago_api::rollout::CanaryAttempts;

use crate::scaler::Figure;

/// `/slots` requests in flight at once, across every reconcile and the census: after a restart
/// every task reconciles at once, and a fleet of thousands of pods must not be asked all
/// together.
pub const PROBES_AT_ONCE: usize = 64;

/// How long a pod asked to count its polls may take to answer: the sidecar waits at most one
/// long poll (5 s at most, as Conductor allows) and 2 s more, and the client's second for the
/// answer comes on top.
const SETTLED_ASK_TIMEOUT: Duration = Duration::from_secs(8);

/// How long a plain ask may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// The sidecar's answer.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slots {
    busy: Option<i64>,
    /// Every task a poll sent more than this long before the request brought is counted
    /// (ADR 0033); absent from sidecars older than that.
    polls_counted_older_than_ms: Option<u64>,
    /// The pod's finished attempts by verdict (ADR 0044); absent from older sidecars.
    finished: Option<Finished>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Finished {
    completed: i64,
    body_failed: i64,
    not_judged: i64,
}

/// Asks executor pods on their metrics port, a bounded number at once.
pub struct SlotsClient {
    http: reqwest::Client,
    port: u16,
    probes: tokio::sync::Semaphore,
}

impl SlotsClient {
    pub fn new(port: u16) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(ASK_TIMEOUT)
            // A pod is asked about once a resync: a connection kept open to each of thousands
            // of pods held about 50 KiB apiece (docs/scale.md).
            .pool_max_idle_per_host(0)
            .build()?;
        Ok(Self {
            http,
            port,
            probes: tokio::sync::Semaphore::new(PROBES_AT_ONCE),
        })
    }

    /// Ask the pod at `ip`, which has `slots` slots, how many are busy. A pod that does not
    /// answer counts as fully busy, so that a slow or unreachable sidecar never makes the
    /// operator remove pods that may be working (ADR 0009). With `read`, the pod answers once
    /// every poll it sent before that queue read has been answered (ADR 0033).
    pub async fn ask(&self, ip: &str, slots: i64, read: Option<Instant>) -> Figure {
        let url = format!("http://{ip}:{}/slots", self.port);
        let answer = async {
            // Closed only when the process ends; a failed acquire is not an answer either.
            let _permit = self.probes.acquire().await;
            let sent = Instant::now();
            let mut request = self.http.get(&url);
            if let Some(read) = read {
                // Rounded down: the pod counts polls from a little after the read, never before.
                let older_than = sent.saturating_duration_since(read).as_millis();
                request = request
                    .query(&[("countPollsOlderThanMs", older_than)])
                    .timeout(SETTLED_ASK_TIMEOUT);
            }
            let answer: Slots = request.send().await?.error_for_status()?.json().await?;
            Ok::<_, reqwest::Error>((answer, sent))
        };
        match answer.await {
            Ok((answer, sent)) => Figure {
                busy: answer.busy.unwrap_or(slots),
                answered: true,
                at: Instant::now(),
                polls_counted_before: answer
                    .polls_counted_older_than_ms
                    .and_then(|ms| sent.checked_sub(Duration::from_millis(ms))),
                finished: answer.finished.map(|f| CanaryAttempts {
                    completed: f.completed,
                    failed: f.body_failed,
                    not_judged: f.not_judged,
                }),
            },
            Err(e) => {
                tracing::debug!(%url, error = %perago_api::error_chain(&e), "a pod did not say how busy it is; counting it as busy");
                let at = Instant::now();
                // Fully busy is the most a poll could have added.
                Figure {
                    busy: slots,
                    answered: false,
                    at,
                    polls_counted_before: Some(at),
                    finished: None,
                }
            }
        }
    }

    /// The client for the unit tests, on `port`.
    #[cfg(test)]
    pub fn at_port(port: u16) -> Self {
        Self::new(port).unwrap_or_else(|e| panic!("building the pods' client: {e}"))
    }
}
