//! The sidecar's retry policy: exponential backoff with jitter, so that pods failed by the
//! same outage do not come back in step. Only calls that are safe to repeat use it; lakeFS
//! calls are retried by `perago_lakefs::retries`, the same way.
//!
//! Jitter adds up to the delay again (`backon`: a delay `d` becomes one in `[d, 2d)`), so the
//! bases below are about two thirds of the schedule they stand for.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

fn policy(first: Duration, longest: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(longest)
        .with_factor(2.0)
        .with_jitter()
}

/// Reporting a result to Conductor: 5 more tries over about 30 s.
pub fn report() -> ExponentialBuilder {
    policy(Duration::from_millis(700), Duration::from_secs(11)).with_max_times(5)
}

/// Pauses between failed polls: from about 1 s up to `longest`, for as long as they fail.
pub fn poll_failures(longest: Duration) -> ExponentialBackoff {
    policy(Duration::from_millis(700), longest.mul_f32(0.67))
        .without_max_times()
        .build()
}

/// Pauses between empty polls: from 1 ms up to the poll interval.
pub fn empty_polls(longest: Duration) -> ExponentialBackoff {
    policy(Duration::from_millis(1), longest.mul_f32(0.67))
        .without_max_times()
        .build()
}

/// Restarts of a runner that died (local mode, as the kubelet restarts a container): from
/// about 1 s up to 30 s.
pub fn runner_restarts() -> ExponentialBackoff {
    policy(Duration::from_millis(700), Duration::from_secs(20))
        .without_max_times()
        .build()
}

/// A merge lakeFS refused without merging (423, 429, 500 locked), within the merge budget.
pub fn merge_refusals() -> ExponentialBackoff {
    policy(Duration::from_millis(70), Duration::from_millis(1300))
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_to_their_cap_with_jitter_that_spreads_pods() {
        let delays: Vec<Duration> = report().build().collect();
        assert_eq!(delays.len(), 5, "five more tries");
        let total: Duration = delays.iter().sum();
        assert!(
            total >= Duration::from_secs(20) && total < Duration::from_secs(45),
            "{delays:?}"
        );
        for (n, d) in delays.iter().enumerate() {
            let base = Duration::from_millis(700)
                .saturating_mul(1 << n)
                .min(Duration::from_secs(11));
            assert!(*d >= base && *d < base * 2, "{n}: {d:?}");
        }
        let mut polls = poll_failures(Duration::from_secs(120));
        let late: Vec<Duration> = polls.by_ref().skip(20).take(3).collect();
        assert!(
            late.iter().all(|d| *d < Duration::from_secs(161)),
            "{late:?}"
        );
        // Two pods failed by the same outage do not wait the same.
        let a: Vec<Duration> = poll_failures(Duration::from_secs(120)).take(8).collect();
        let b: Vec<Duration> = poll_failures(Duration::from_secs(120)).take(8).collect();
        assert_ne!(a, b);
    }
}
