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
use perago_workspace::publication::{Key, Lineage};
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
        /// Which code produced it; absent for a publication of Python Perago or of a sidecar
        /// before lineage.
        #[serde(skip_serializing_if = "Option::is_none")]
        lineage: Option<Box<LineageView>>,
    },
    /// Any commit that is not a publication.
    Foreign {
        id: String,
        committer: String,
        date: i64,
        message: String,
    },
}

/// Which code produced a publication, as its metadata says (ADR 0042).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LineageView {
    /// `namespace/name` of the PeragoTask.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_uid: Option<String>,
    /// The generation of the task's spec that introduced the pod template that ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The body image as the task named it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The body image as it ran (the kubelet's `imageID`); `pending` when the pod's
    /// annotation had not reached the sidecar yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// The digest of `image_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contract_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sidecar_version: Option<String>,
}

/// The PENDING word of an image id the sidecar did not know yet.
pub const PENDING: &str = "pending";

impl LineageView {
    /// The lineage of `metadata`; `None` when it has none.
    pub fn of(metadata: &BTreeMap<String, String>) -> Option<Self> {
        let lineage = Lineage::from_metadata(metadata).unwrap_or_default();
        (lineage != Lineage::default()).then(|| Self {
            task: lineage.task(),
            task_uid: lineage.task_uid.clone(),
            generation: lineage.task_generation,
            image: lineage.body_image.clone(),
            image_id: if lineage.body_image_pending() {
                Some(PENDING.to_owned())
            } else {
                lineage.body_image_id.clone()
            },
            digest: lineage.body_digest().map(str::to_owned),
            contract_hash: lineage.contract_hash.clone(),
            sidecar_version: lineage.sidecar_version.clone(),
        })
    }

    /// One line: the image as it ran (or as named, while pending), the task and its
    /// generation, the contract and the sidecar.
    pub fn summary(&self) -> String {
        let image = match (&self.image_id, &self.image) {
            (Some(id), Some(named)) if id == PENDING => format!("{named} (digest pending)"),
            (Some(id), _) => id.clone(),
            (None, Some(named)) => named.clone(),
            (None, None) => "image unknown".into(),
        };
        let mut parts = vec![image];
        if let Some(task) = &self.task {
            parts.push(match self.generation {
                Some(g) => format!("PeragoTask {task} generation {g}"),
                None => format!("PeragoTask {task}"),
            });
        }
        if let Some(h) = &self.contract_hash {
            parts.push(format!("contract {h}"));
        }
        if let Some(v) = &self.sidecar_version {
            parts.push(format!("sidecar {v}"));
        }
        cell(&parts.join(", "), 300)
    }

    /// The body image in a table cell: its digest shortened (`sha256:9f86d081884c`),
    /// `pending`, or the id as it stands when it holds no digest.
    pub fn image_cell(&self) -> String {
        match (&self.digest, &self.image_id) {
            (Some(d), _) => d.chars().take(19).collect(),
            (None, Some(id)) => cell(id, 24),
            (None, None) => "-".into(),
        }
    }
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
                lineage: LineageView::of(&commit.metadata).map(Box::new),
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
                    lineage,
                    ..
                } => vec![
                    short(id),
                    "publication".into(),
                    cell(workflow, 36),
                    cell(step, 24),
                    cell(attempt, 7),
                    task_status.clone().unwrap_or_else(|| "-".into()),
                    lineage
                        .as_ref()
                        .map_or_else(|| "-".into(), |l| l.image_cell()),
                    lineage
                        .as_ref()
                        .and_then(|l| l.generation)
                        .map_or_else(|| "-".into(), |g| g.to_string()),
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
                    String::new(),
                    String::new(),
                    cell(message, 60),
                ],
            })
            .collect();
        out.push_str(&columns(
            &[
                "COMMIT", "KIND", "WORKFLOW", "STEP", "ATTEMPT", "TASK", "IMAGE", "GEN", "NOTE",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn lineage_reads_as_digest_pending_or_nothing() {
        let known = LineageView::of(&metadata(&[
            ("perago.body_image", "r/body:1"),
            (
                "perago.body_image_id",
                "r/body@sha256:9f86d081884c7d659a2feaa0c55ad015",
            ),
            ("perago.peragotask_generation", "2"),
        ]))
        .unwrap();
        assert_eq!(known.image_cell(), "sha256:9f86d081884c");
        assert_eq!(
            known.digest.as_deref(),
            Some("sha256:9f86d081884c7d659a2feaa0c55ad015")
        );
        let pending = LineageView::of(&metadata(&[
            ("perago.body_image", "r/body:1"),
            ("perago.body_image_id", ""),
        ]))
        .unwrap();
        assert_eq!(pending.image_cell(), "pending");
        assert_eq!(pending.summary(), "r/body:1 (digest pending)");
        assert_eq!(
            LineageView::of(&metadata(&[
                ("perago.phase", "confirm"),
                ("perago.seq", "1")
            ])),
            None,
            "Python Perago's publications have none"
        );
    }

    #[test]
    fn the_table_has_the_image_and_generation_of_each_publication() {
        let confirm = |id: &str, lineage| CommitView::Confirm {
            id: id.into(),
            workflow: "wf".into(),
            step: "step".into(),
            task_id: "t".into(),
            attempt: "0".into(),
            task_status: None,
            supersedes: None,
            superseded_by: None,
            lineage,
        };
        let view = HistoryView {
            repository: "r".into(),
            branch: "main".into(),
            head: "c1".into(),
            hard_fence: HardFence {
                installed: true,
                action: Some("_lakefs_actions/perago.yaml".into()),
            },
            commits: vec![
                confirm(
                    "c1",
                    LineageView::of(&metadata(&[
                        ("perago.body_image_id", "sha256:00ff00ff00ff00ff00ff"),
                        ("perago.peragotask_generation", "7"),
                    ]))
                    .map(Box::new),
                ),
                confirm("c0", None),
            ],
            truncated: false,
            problems: vec![],
        };
        let table = view.table();
        let lines: Vec<&str> = table.lines().skip(3).collect();
        assert!(
            lines[0].starts_with("COMMIT  KIND         WORKFLOW  STEP  ATTEMPT  TASK  IMAGE"),
            "{table}"
        );
        assert!(lines[1].contains("sha256:00ff00ff00ff  7"), "{table}");
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["c0", "publication", "wf", "step", "0", "-", "-", "-"],
            "a publication without lineage"
        );
    }
}
