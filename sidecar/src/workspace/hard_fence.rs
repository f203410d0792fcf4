//! The sidecar's watch over the opt-in hard fence (`perago_workspace::hard_fence`): it checks
//! each target branch it publishes to (again after ten minutes), exports the answer as a
//! gauge and warns once when the fence is missing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use prometheus::IntGaugeVec;
use tracing::{info, warn};

use perago_lakefs::LakeFsClient;
use perago_workspace::hard_fence::installed_by;

/// How long an answer stands before a publication to the branch checks again, so that an
/// install (or a removal) shows without a restart.
const RECHECK: Duration = Duration::from_secs(600);

type Target = (String, String);

/// The target branches this sidecar has checked, and when.
pub struct HardFenceWatch {
    lakefs: LakeFsClient,
    installed: IntGaugeVec,
    checked: Mutex<BTreeMap<Target, Instant>>,
    /// Branches already warned about: the warning is logged once per branch.
    warned: Mutex<BTreeSet<Target>>,
}

impl HardFenceWatch {
    pub fn new(lakefs: LakeFsClient, installed: IntGaugeVec) -> Arc<Self> {
        Arc::new(Self {
            lakefs,
            installed,
            checked: Mutex::new(BTreeMap::new()),
            warned: Mutex::new(BTreeSet::new()),
        })
    }

    /// An attempt publishes to `repository@branch`: the first time, and then at most every
    /// ten minutes, check it in the background (the attempt does not wait).
    pub fn note(self: &Arc<Self>, repository: &str, branch: &str) {
        let target = (repository.to_owned(), branch.to_owned());
        let due = {
            let mut checked = self.checked.lock();
            let due = checked
                .get(&target)
                .is_none_or(|at| at.elapsed() >= RECHECK);
            if due {
                checked.insert(target.clone(), Instant::now());
            }
            due
        };
        if due {
            let watch = Arc::clone(self);
            tokio::spawn(async move { watch.check(target).await });
        }
    }

    async fn check(&self, target: Target) {
        let (repository, branch) = (target.0.as_str(), target.1.as_str());
        let gauge = self.installed.with_label_values(&[repository, branch]);
        match installed_by(&self.lakefs, repository, branch, branch).await {
            Ok(Some(action)) => {
                gauge.set(1);
                info!(
                    repository,
                    branch, action, "the hard fence guards this target branch"
                );
            }
            Ok(None) => {
                gauge.set(0);
                let first = self.warned.lock().insert(target.clone());
                if first {
                    warn!(
                        repository,
                        branch,
                        "the hard fence is not installed on this target branch: a commit landing between the publish fence and the merge is stacked under the publication (kubectl perago install-fence installs it)"
                    );
                }
            }
            Err(e) => {
                // Unknown for now: the gauge keeps its last value and the next publication
                // checks again.
                self.checked.lock().remove(&target);
                warn!(repository, branch, error = %e, "checking for the hard fence failed; the next publication checks again");
            }
        }
    }
}
