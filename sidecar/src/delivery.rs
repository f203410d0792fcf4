//! Delivery that never holds an attempt up, shared by the attempt traces (OTLP) and the
//! OpenLineage run events: an attempt hands what it has to a bounded queue and goes on; a
//! background task sends what is queued, each request within its own timeout. What does not
//! fit in the queue, or is not accepted, is dropped and counted by reason (`queue_full`,
//! `export_failed`).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::{IntCounter, IntCounterVec};
use tokio::sync::{Notify, watch};
use tracing::warn;

/// Counters of one kind of export.
#[derive(Clone)]
pub struct ExportCounters {
    /// Items the endpoint accepted.
    pub exported: IntCounter,
    /// Items dropped, by reason: `queue_full`, `export_failed`.
    pub dropped: IntCounterVec,
}

/// Items waiting to be sent, at most `capacity` of them.
pub(crate) struct BoundedQueue<T> {
    items: Mutex<VecDeque<T>>,
    capacity: usize,
    /// Items per send.
    batch: usize,
    /// A full batch is waiting.
    full: Notify,
    pub(crate) counters: ExportCounters,
}

impl<T> BoundedQueue<T> {
    pub(crate) fn new(capacity: usize, batch: usize, counters: ExportCounters) -> Self {
        Self {
            items: Mutex::new(VecDeque::new()),
            capacity,
            batch: batch.max(1),
            full: Notify::new(),
            counters,
        }
    }

    /// Queue `items` whole, or drop them all and count them when they do not fit (never
    /// waits): a trace is kept or dropped as one.
    pub(crate) fn push(&self, items: Vec<T>) {
        let n = items.len();
        let mut queue = self.items.lock();
        if queue.len() + n > self.capacity {
            drop(queue);
            self.counters
                .dropped
                .with_label_values(&["queue_full"])
                .inc_by(n as u64);
            return;
        }
        queue.extend(items);
        let full = queue.len() >= self.batch;
        drop(queue);
        if full {
            self.full.notify_one();
        }
    }

    /// The next batch, oldest first; empty when nothing waits.
    pub(crate) fn take(&self) -> Vec<T> {
        let mut queue = self.items.lock();
        let n = queue.len().min(self.batch);
        queue.drain(..n).collect()
    }
}

/// Why a batch was not accepted; the text is logged.
pub(crate) type SendError = String;

/// The background sender of a queue, and how to stop it.
pub(crate) struct Background {
    stop: watch::Sender<bool>,
    sender: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Background {
    /// Start sending what `queue` holds: when a full batch waits, else every `delay`. `send`
    /// delivers one batch (within its own timeout); `what` names the items in the log.
    pub(crate) fn start<T, F, Fut>(
        queue: Arc<BoundedQueue<T>>,
        delay: Duration,
        what: &'static str,
        endpoint: String,
        mut send: F,
    ) -> Self
    where
        T: Send + 'static,
        F: FnMut(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), SendError>> + Send,
    {
        let (stop, mut stopped) = watch::channel(false);
        let sender = tokio::spawn(async move {
            loop {
                let stopping = tokio::select! {
                    () = tokio::time::sleep(delay) => false,
                    () = queue.full.notified() => false,
                    _ = stopped.wait_for(|s| *s) => true,
                };
                loop {
                    let items = queue.take();
                    if items.is_empty() {
                        break;
                    }
                    let n = items.len() as u64;
                    match send(items).await {
                        Ok(()) => queue.counters.exported.inc_by(n),
                        Err(e) => {
                            queue
                                .counters
                                .dropped
                                .with_label_values(&["export_failed"])
                                .inc_by(n);
                            warn!(error = %e, endpoint = %endpoint, count = n, "exporting {what} failed; they are dropped");
                        }
                    }
                }
                if stopping {
                    return;
                }
            }
        });
        Self {
            stop,
            sender: tokio::sync::Mutex::new(Some(sender)),
        }
    }

    /// Send what is queued, then stop the sender; `limit` bounds the wait (what is still
    /// queued then is not sent).
    pub(crate) async fn shutdown(&self, limit: Option<Duration>) {
        let _ = self.stop.send(true);
        let Some(mut sender) = self.sender.lock().await.take() else {
            return;
        };
        match limit {
            None => {
                let _ = sender.await;
            }
            Some(limit) => {
                if tokio::time::timeout(limit, &mut sender).await.is_err() {
                    sender.abort();
                    warn!(
                        limit_ms = limit.as_millis() as u64,
                        "the exports still queued at shutdown are not sent"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn counters() -> ExportCounters {
        ExportCounters {
            exported: IntCounter::new("e", "e").unwrap(),
            dropped: IntCounterVec::new(prometheus::Opts::new("d", "d"), &["reason"]).unwrap(),
        }
    }

    #[test]
    fn a_full_queue_drops_whole_groups_and_counts_them() {
        let queue = BoundedQueue::new(5, 4, counters());
        queue.push(vec![1, 2, 3]);
        queue.push(vec![4, 5, 6]);
        queue.push(vec![7, 8]);
        assert_eq!(queue.take(), [1, 2, 3, 7], "a batch at most, oldest first");
        assert_eq!(queue.take(), [8]);
        assert!(queue.take().is_empty());
        assert_eq!(
            queue
                .counters
                .dropped
                .with_label_values(&["queue_full"])
                .get(),
            3
        );
    }

    /// Items are sent in the order they were queued; what fails is counted, and a shutdown
    /// that cannot finish within its limit gives up.
    #[tokio::test]
    async fn the_sender_sends_in_order_and_counts_failures() {
        let queue = Arc::new(BoundedQueue::new(10, 1, counters()));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&sent);
        let background = Background::start(
            Arc::clone(&queue),
            Duration::from_secs(60),
            "items",
            "test".into(),
            move |items: Vec<i32>| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock().extend(items.iter().copied());
                    if items == [2] {
                        Err("refused".to_owned())
                    } else {
                        Ok(())
                    }
                }
            },
        );
        queue.push(vec![1]);
        queue.push(vec![2]);
        queue.push(vec![3]);
        background.shutdown(None).await;
        assert_eq!(*sent.lock(), [1, 2, 3]);
        assert_eq!(queue.counters.exported.get(), 2);
        assert_eq!(
            queue
                .counters
                .dropped
                .with_label_values(&["export_failed"])
                .get(),
            1
        );

        let stuck = Arc::new(BoundedQueue::new(10, 1, counters()));
        let background = Background::start(
            Arc::clone(&stuck),
            Duration::from_secs(60),
            "items",
            "test".into(),
            |_: Vec<i32>| std::future::pending::<Result<(), SendError>>(),
        );
        stuck.push(vec![1]);
        let started = std::time::Instant::now();
        background.shutdown(Some(Duration::from_millis(100))).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
