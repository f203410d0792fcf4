//! When a lakeFS call is tried again: only calls that are safe to repeat (reads, uploads of
//! the same bytes, branch creation and deletion), with exponential backoff and jitter, so that
//! pods failed by the same outage do not come back in step. Commits and merges are never
//! retried here: an unanswered one may have happened.

use std::time::Duration;

use backon::ExponentialBuilder;

/// An idempotent lakeFS call, an upload, or a download that broke off: 3 more tries, the
/// first after 130–260 ms (jitter adds up to the delay again), at most 4 s apart.
pub fn idempotent_call() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(130))
        .with_max_delay(Duration::from_secs(2))
        .with_factor(2.0)
        .with_jitter()
        .with_max_times(3)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use backon::BackoffBuilder;

    #[test]
    fn three_more_tries_with_jitter() {
        let delays: Vec<Duration> = super::idempotent_call().build().collect();
        assert_eq!(delays.len(), 3);
        for (n, d) in delays.iter().enumerate() {
            let base = Duration::from_millis(130) * (1 << n);
            assert!(*d >= base && *d < base * 2, "{n}: {d:?}");
        }
    }
}
