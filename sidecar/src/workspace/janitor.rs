//! Staging branches of attempts that can no longer publish: judged and removed. A crash
//! between stage and cleanup leaves an attempt's staging branch behind; the next attempt of
//! the same step removes it, but a step that never runs again would keep it forever. The
//! verdict is the same for `kubectl perago gc` and for the sweep each running sidecar makes
//! of the repositories it has written to:
//!
//! - the attempt's task is read from its try commit's metadata, else from the branch name;
//! - Conductor has the task in a terminal status: the branch goes;
//! - Conductor no longer has it (archived or purged): the branch goes once its head commit is
//!   older than a given age;
//! - scheduled, in progress, unknown, or naming no task: the branch stays.
//!
//! Every verdict is made before the first deletion, so a server that fails mid-way deletes
//! nothing.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use thiserror::Error;
use tracing::{info, warn};

use crate::lakefs::{LakeFsClient, LakeFsError};
use perago_conductor::{ConductorClient, ConductorError};

/// Every staging branch's name starts so (see `publish::staging_branch`).
pub const STAGING_PREFIX: &str = "perago-staging-";

/// Conductor's statuses from which a task never runs again.
const TERMINAL: [&str; 7] = [
    "COMPLETED",
    "COMPLETED_WITH_ERRORS",
    "FAILED",
    "FAILED_WITH_TERMINAL_ERROR",
    "TIMED_OUT",
    "CANCELED",
    "SKIPPED",
];

#[derive(Debug, Error)]
pub enum JanitorError {
    #[error(transparent)]
    LakeFs(#[from] LakeFsError),
    #[error("{source} (task {task_id})")]
    Conductor {
        task_id: String,
        source: ConductorError,
    },
}

/// What becomes of one staging branch, and why.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Verdict {
    pub branch: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The task's type, when Conductor or the try commit says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_type: Option<String>,
    pub delete: bool,
    pub why: String,
}

/// The task id a staging branch's name carries: `…-task-id-<id>-retry-<n>-exec-<e>`.
pub fn task_id_from_name(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(STAGING_PREFIX)?;
    let (_, after) = rest.split_once("-task-id-")?;
    let at = after.rfind("-retry-")?;
    let (id, tail) = after.split_at(at);
    let tail = tail.strip_prefix("-retry-")?;
    let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
    (digits > 0 && tail[digits..].starts_with("-exec-") && !id.is_empty()).then_some(id)
}

/// A task's status and type now; `None` when Conductor does not have it.
pub async fn task_now(
    conductor: &ConductorClient,
    task_id: &str,
) -> Result<Option<(String, Option<String>)>, JanitorError> {
    match conductor.task(task_id).await {
        Ok(task) => Ok(Some((
            task["status"].as_str().unwrap_or("UNKNOWN").to_owned(),
            task["taskDefName"]
                .as_str()
                .or_else(|| task["taskType"].as_str())
                .map(str::to_owned),
        ))),
        Err(e) if e.is_not_found() => Ok(None),
        Err(source) => Err(JanitorError::Conductor {
            task_id: task_id.to_owned(),
            source,
        }),
    }
}

/// The verdict on every staging branch of `repository`.
pub async fn judge(
    lakefs: &LakeFsClient,
    conductor: &ConductorClient,
    repository: &str,
    gone_older_than: Duration,
) -> Result<Vec<Verdict>, JanitorError> {
    let mut verdicts = Vec::new();
    for branch in lakefs
        .list_branches(repository, STAGING_PREFIX)
        .await?
        .into_iter()
        .filter(|n| n.starts_with(STAGING_PREFIX))
    {
        verdicts.push(judge_one(lakefs, conductor, repository, &branch, gone_older_than).await?);
    }
    Ok(verdicts)
}

async fn judge_one(
    lakefs: &LakeFsClient,
    conductor: &ConductorClient,
    repository: &str,
    branch: &str,
    gone_older_than: Duration,
) -> Result<Verdict, JanitorError> {
    let head = lakefs.get_commit(repository, branch).await?;
    // The try commit names its task; before the stage committed, only the branch name does.
    let try_meta = |key: &str| {
        (head.metadata.get("perago.phase").map(String::as_str) == Some("try"))
            .then(|| head.metadata.get(key).cloned())
            .flatten()
            .filter(|v| !v.is_empty())
    };
    let task_id =
        try_meta("perago.task_id").or_else(|| task_id_from_name(branch).map(str::to_owned));
    let mut verdict = Verdict {
        branch: branch.to_owned(),
        task_id: task_id.clone(),
        task_type: try_meta("perago.task_def_name"),
        delete: false,
        why: String::new(),
    };
    let Some(id) = &task_id else {
        verdict.why = "names no task".into();
        return Ok(verdict);
    };
    match task_now(conductor, id).await? {
        Some((status, task_type)) => {
            verdict.task_type = task_type.or(verdict.task_type);
            verdict.delete = TERMINAL.contains(&status.as_str());
            verdict.why = format!("its task is {status}");
        }
        None => {
            // The head is the try commit, or the commit the branch was made from: the branch
            // is at least this old.
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let age = Duration::from_secs(
                now.saturating_sub(u64::try_from(head.creation_date).unwrap_or(u64::MAX)),
            );
            verdict.delete = age >= gone_older_than;
            verdict.why = if verdict.delete {
                format!(
                    "Conductor no longer has its task and its head is {} old",
                    human(age)
                )
            } else {
                format!(
                    "Conductor no longer has its task, but its head is only {} old (at least {} before it goes)",
                    human(age),
                    human(gone_older_than)
                )
            };
        }
    }
    Ok(verdict)
}

/// `90s`, `12m`, `5h`, `3d`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The running sidecar's share: every `period`, judge the staging branches of the
/// repositories its attempts have written to since it started, and remove those of its own
/// task type whose attempt can no longer publish.
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
        self.repositories
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(repository.to_owned());
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
            let repositories: Vec<String> = self
                .repositories
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .cloned()
                .collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_id_is_read_from_the_branch_name() {
        let name = "perago-staging-wf-1-step-seq-1-iteration-0-task-id-5f0c-aa-retry-2-exec-e1";
        assert_eq!(task_id_from_name(name), Some("5f0c-aa"));
        let name = "perago-staging-wf-step-seq-1-iteration-0-task-id-5f0c-retry-2-exec-x-retry-1";
        assert_eq!(
            task_id_from_name(name),
            None,
            "exec must follow the retry count"
        );
        assert_eq!(task_id_from_name("perago-staging-x"), None);
        assert_eq!(task_id_from_name("main"), None);
    }

    #[test]
    fn ages_read_as_people_write_them() {
        assert_eq!(human(Duration::from_secs(90)), "90s");
        assert_eq!(human(Duration::from_secs(3600)), "60m");
        assert_eq!(human(Duration::from_secs(86_400)), "24h");
        assert_eq!(human(Duration::from_secs(3 * 86_400)), "3d");
    }
}
