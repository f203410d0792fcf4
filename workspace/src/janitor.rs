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

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use thiserror::Error;

use perago_conductor::{ConductorClient, ConductorError, TaskStatus};
use perago_lakefs::{LakeFsClient, LakeFsError};

use crate::publication::{Key, Phase};
use crate::staging::{self, StagingBranch};

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

/// A task's status and type now; `None` when Conductor does not have it.
pub async fn task_now(
    conductor: &ConductorClient,
    task_id: &str,
) -> Result<Option<(TaskStatus, Option<String>)>, JanitorError> {
    match conductor.task(task_id).await {
        Ok(task) => Ok(Some((
            TaskStatus::from(task["status"].as_str().unwrap_or("UNKNOWN")),
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
        .list_branches(repository, staging::PREFIX)
        .await?
        .into_iter()
        .filter(|n| n.starts_with(staging::PREFIX))
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
    let try_meta = |key: Key| {
        (Phase::of(&head.metadata) == Some(Phase::Try))
            .then(|| key.get(&head.metadata))
            .flatten()
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let task_id = try_meta(Key::TaskId).or_else(|| StagingBranch::parse(branch).map(|b| b.task));
    let mut verdict = Verdict {
        branch: branch.to_owned(),
        task_id: task_id.clone(),
        task_type: try_meta(Key::TaskDefName),
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
            verdict.delete = status.is_terminal();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_people_write_them() {
        assert_eq!(human(Duration::from_secs(90)), "90s");
        assert_eq!(human(Duration::from_secs(3600)), "60m");
        assert_eq!(human(Duration::from_secs(86_400)), "24h");
        assert_eq!(human(Duration::from_secs(3 * 86_400)), "3d");
    }
}
