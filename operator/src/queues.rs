//! The latest queue sizes of each Conductor, as the queue watch (`scaling::watch_queues`)
//! reads them: the reconciles read their task's queue from here while it is fresh.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Queue name to size, as Conductor's `/tasks/queue/all` answers, and when it was read.
type QueueRead = (Instant, HashMap<String, i64>);

/// The latest queue sizes of each Conductor, read by `scaling::watch_queues` every `period`.
pub struct QueueWatch {
    /// `None`: the watch is off, and each reconcile asks for its task's queue.
    pub period: Option<Duration>,
    /// Per Conductor base URL.
    sizes: Mutex<HashMap<String, QueueRead>>,
}

impl QueueWatch {
    pub fn new(period: Option<Duration>) -> Self {
        Self {
            period,
            sizes: Mutex::default(),
        }
    }

    /// The queue's size from a read no older than two periods, and when it was read.
    pub fn fresh(&self, base: &str, queue: &str) -> Option<(i64, Instant)> {
        let period = self.period?;
        let sizes = self.sizes.lock();
        let (at, sizes) = sizes.get(base)?;
        (at.elapsed() <= 2 * period).then(|| (sizes.get(queue).copied().unwrap_or(0), *at))
    }

    pub fn record(&self, base: &str, sizes: HashMap<String, i64>) {
        self.sizes
            .lock()
            .insert(base.to_owned(), (Instant::now(), sizes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_sizes_expire_after_two_periods() {
        let watch = QueueWatch::new(Some(Duration::from_millis(20)));
        watch.record("c", HashMap::from([("a".to_owned(), 3)]));
        let size = |queue| watch.fresh("c", queue).map(|(size, _)| size);
        assert_eq!(size("a"), Some(3));
        assert_eq!(size("b"), Some(0), "absent queue is empty");
        assert_eq!(watch.fresh("other", "a"), None);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(size("a"), None);
        assert_eq!(QueueWatch::new(None).fresh("c", "a"), None, "watch off");
    }
}
