//! `kubectl perago history`: a branch's first-parent history, each commit classified by the
//! rules the publish fence applies (`perago_workspace::history`), with the Conductor
//! status of each publication's task now, supersede chains, and whether the hard fence is
//! installed on the branch.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use perago_conductor::ConductorClient;
use perago_lakefs::{Commit, LakeFsClient};
use perago_workspace::history::{Entry, examine};
use perago_workspace::publication::Key;
use perago_workspace::{hard_fence, janitor};

use crate::Failure;
use crate::connect::Endpoints;
use crate::output::{Table, cell, columns, short};

#[derive(Args, Debug)]
pub struct HistoryArgs {
    #[arg(long)]
    pub repository: String,
    #[arg(long)]
    pub branch: String,
    /// Stop at this commit or ref (not shown): the history since it.
    #[arg(long)]
    pub since: Option<String>,
    /// Commits shown at most.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
}

#[derive(Debug, Serialize)]
pub struct HistoryView {
    pub repository: String,
    pub branch: String,
    pub head: String,
    pub hard_fence: HardFence,
    pub commits: Vec<CommitView>,
    /// More commits lie below the last one shown (the limit was reached before `since`).
    pub truncated: bool,
    /// Each names a commit and what is wrong with it.
    pub problems: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct HardFence {
    pub installed: bool,
    /// The action file that installs it, when it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum CommitView {
    /// A publication: the squash merge of an attempt's staging branch.
    Confirm {
        id: String,
        workflow: String,
        step: String,
        task_id: String,
        attempt: String,
        /// The task's status in Conductor now (`gone` when Conductor no longer has it,
        /// absent without a Conductor).
        #[serde(skip_serializing_if = "Option::is_none")]
        task_status: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        supersedes: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        superseded_by: Option<String>,
    },
    /// Any commit that is not a publication.
    Foreign {
        id: String,
        committer: String,
        date: i64,
        message: String,
    },
}

pub async fn run(endpoints: &Endpoints, args: &HistoryArgs) -> Result<HistoryView, Failure> {
    let lakefs = endpoints.lakefs()?;
    let conductor = endpoints.conductor()?;
    let (repo, branch) = (args.repository.as_str(), args.branch.as_str());
    let head = lakefs
        .branch_head(repo, branch)
        .await
        .map_err(anyhow::Error::from)?;
    let limit = args.limit as usize;
    let since = match &args.since {
        Some(r) => Some(
            lakefs
                .get_commit(repo, r)
                .await
                .with_context(|| format!("--since {r}"))?
                .id,
        ),
        None => None,
    };
    // One commit more than shown: the one below the last is needed to check it.
    let (log, more) = lakefs
        .first_parent_log(repo, branch, since.as_deref().unwrap_or(""), limit + 1)
        .await
        .map_err(anyhow::Error::from)?;
    let (end, truncated) = match since.as_ref().map(|s| log.iter().position(|c| &c.id == s)) {
        Some(Some(p)) => (p, false),
        Some(None) if log.len() <= limit && !more => {
            return Err(Failure::Error(anyhow::anyhow!(
                "--since {}: not on the first-parent history of {repo}@{branch}",
                args.since.as_deref().unwrap_or_default()
            )));
        }
        _ => (log.len().min(limit), log.len() > limit || more),
    };
    let mut problems = Vec::new();
    let mut commits = Vec::new();
    for (i, commit) in log[..end].iter().enumerate() {
        let (entry, found) = examine(commit, log.get(i + 1));
        problems.extend(found);
        commits.push(view(commit, entry, conductor.as_ref()).await?);
    }
    link_supersessions(&mut commits);
    let hard_fence = hard_fence(&lakefs, repo, branch, &head).await?;
    Ok(HistoryView {
        repository: repo.to_owned(),
        branch: branch.to_owned(),
        head,
        hard_fence,
        commits,
        truncated,
        problems,
    })
}

async fn view(
    commit: &Commit,
    entry: Entry,
    conductor: Option<&ConductorClient>,
) -> Result<CommitView, Failure> {
    let meta = |k: Key| k.get(&commit.metadata).unwrap_or_default().to_owned();
    Ok(match entry {
        Entry::Foreign { id } => CommitView::Foreign {
            id,
            committer: commit.committer.clone(),
            date: commit.creation_date,
            message: commit.message.clone(),
        },
        Entry::Confirm {
            id,
            task_id,
            supersedes,
            ..
        } => {
            let task_status = match conductor {
                Some(c) if !task_id.is_empty() => Some(task_status(c, &task_id).await?),
                _ => None,
            };
            CommitView::Confirm {
                id,
                workflow: meta(Key::WorkflowInstanceId),
                step: meta(Key::ReferenceTaskName),
                attempt: meta(Key::RetryCount),
                task_id,
                task_status,
                supersedes,
                superseded_by: None,
            }
        }
    })
}

/// The task's status now, `gone` when Conductor does not know it.
async fn task_status(conductor: &ConductorClient, task_id: &str) -> anyhow::Result<String> {
    Ok(janitor::task_now(conductor, task_id)
        .await?
        .map_or_else(|| "gone".to_owned(), |(status, _)| status.to_string()))
}

fn link_supersessions(commits: &mut [CommitView]) {
    let by: BTreeMap<String, String> = commits
        .iter()
        .filter_map(|c| match c {
            CommitView::Confirm {
                id,
                supersedes: Some(s),
                ..
            } => Some((s.clone(), id.clone())),
            _ => None,
        })
        .collect();
    for c in commits.iter_mut() {
        if let CommitView::Confirm {
            id, superseded_by, ..
        } = c
        {
            *superseded_by = by.get(id.as_str()).cloned();
        }
    }
}

/// Whether an action file on the branch head runs the hard fence's pre-merge hook for this
/// branch (the sidecar's own check, `workspace::hard_fence`).
pub async fn hard_fence(
    lakefs: &LakeFsClient,
    repo: &str,
    branch: &str,
    head: &str,
) -> anyhow::Result<HardFence> {
    let action = hard_fence::installed_by(lakefs, repo, head, branch).await?;
    Ok(HardFence {
        installed: action.is_some(),
        action,
    })
}

impl Table for HistoryView {
    fn table(&self) -> String {
        let mut out = format!(
            "{}@{} at {}\nhard fence: {}\n\n",
            self.repository,
            self.branch,
            short(&self.head),
            match &self.hard_fence.action {
                Some(action) => format!("installed ({action})"),
                None => "NOT installed: a commit landing between the publish fence and the merge \
                         is stacked under the publication (see kubectl perago install-fence in \
                         docs/kubectl-perago.md)"
                    .into(),
            }
        );
        let rows: Vec<Vec<String>> = self
            .commits
            .iter()
            .map(|c| match c {
                CommitView::Confirm {
                    id,
                    workflow,
                    step,
                    attempt,
                    task_status,
                    supersedes,
                    superseded_by,
                    ..
                } => vec![
                    short(id),
                    "publication".into(),
                    cell(workflow, 36),
                    cell(step, 24),
                    cell(attempt, 7),
                    task_status.clone().unwrap_or_else(|| "-".into()),
                    match (supersedes, superseded_by) {
                        (_, Some(by)) => format!("superseded by {}", short(by)),
                        (Some(s), None) => format!("supersedes {}", short(s)),
                        (None, None) => String::new(),
                    },
                ],
                CommitView::Foreign {
                    id,
                    committer,
                    message,
                    ..
                } => vec![
                    short(id),
                    "foreign".into(),
                    cell(committer, 36),
                    String::new(),
                    String::new(),
                    String::new(),
                    cell(message, 60),
                ],
            })
            .collect();
        out.push_str(&columns(
            &[
                "COMMIT", "KIND", "WORKFLOW", "STEP", "ATTEMPT", "TASK", "NOTE",
            ],
            &rows,
        ));
        if self.truncated {
            out.push_str("… older commits not shown (raise --limit or pass --since)\n");
        }
        if !self.problems.is_empty() {
            out.push_str("\nproblems:\n");
            for p in &self.problems {
                out.push_str(&format!("  {}\n", cell(p, 300)));
            }
        }
        out
    }
}
