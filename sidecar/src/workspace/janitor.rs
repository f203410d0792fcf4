//! The running sidecar's share of the janitor (`perago_workspace::janitor` judges): every
//! period, the staging branches of the repositories its attempts wrote to are judged, and
//! those of its own task type whose attempt can no longer publish are removed.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use tracing::{info, warn};

use perago_conductor::ConductorClient;
use perago_lakefs::LakeFsClient;
use perago_workspace::janitor::judge;

/// Every `period`, judge the staging branches of the repositories this sidecar's attempts
/// have written to since it started, and remove those of its own task type whose attempt can
/// no longer publish.
pub struct StagingSweep {
    task_type: String,
    period: Duration,
    gone_older_than: Duration,
    repositories: Mutex<BTreeSet<String>>,
}

impl StagingSweep {
    pub fn new(task_type: &str, period: Duration, gone_older_than: Duration) -> Arc<Self> {
        Arc::new(Self {
            task_type: task_type.to_owned(),
            period,
            gone_older_than,
            repositories: Mutex::new(BTreeSet::new()),
        })
    }

    /// An attempt of this sidecar wrote (or tried to write) to `repository`.
    pub fn note(&self, repository: &str) {
        self.repositories.lock().insert(repository.to_owned());
    }

    /// Sweep every period until the task is dropped; `removed` counts each removal.
    pub async fn run(
        self: Arc<Self>,
        lakefs: LakeFsClient,
        conductor: Arc<ConductorClient>,
        removed: prometheus::IntCounter,
    ) {
        let mut ticks = tokio::time::interval(self.period);
        // A sweep slower than the period delays the next one rather than bunching them.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let repositories: Vec<String> = self.repositories.lock().iter().cloned().collect();
            for repository in repositories {
                removed.inc_by(self.sweep(&lakefs, &conductor, &repository).await);
            }
        }
    }

    /// One repository's sweep; how many branches it removed. Errors are logged, not returned:
    /// the next period tries again.
    pub async fn sweep(
        &self,
        lakefs: &LakeFsClient,
        conductor: &ConductorClient,
        repository: &str,
    ) -> u64 {
        let verdicts = match judge(lakefs, conductor, repository, self.gone_older_than).await {
            Ok(v) => v,
            Err(e) => {
                warn!(repository, error = %e, "judging staging branches failed; the next sweep tries again");
                return 0;
            }
        };
        let mut removed = 0;
        for v in verdicts
            .iter()
            .filter(|v| v.delete && v.task_type.as_deref() == Some(self.task_type.as_str()))
        {
            match lakefs.delete_branch(repository, &v.branch).await {
                Ok(()) => {
                    removed += 1;
                    info!(repository, staging_branch = %v.branch, why = %v.why, "removed the staging branch of an attempt that can no longer publish");
                }
                Err(e) => {
                    warn!(repository, staging_branch = %v.branch, error = %e, "removing a dead attempt's staging branch failed")
                }
            }
        }
        removed
    }
}
