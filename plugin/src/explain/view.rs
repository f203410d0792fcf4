//! The attempt view: each attempt of a step as Conductor records it, set beside what lakeFS
//! holds of it (its staging branches and try commit, its confirm commit on the target's
//! first-parent history), with the facts [`decide`](super::decide::decide) reads.

use std::collections::BTreeMap;
use std::rc::Rc;

use serde::Serialize;
use serde_json::{Map, Value};

use perago_conductor::{TaskStatus, Workflow, WorkflowTask};
use perago_lakefs::{Commit, LakeFsClient, LakeFsError};
use perago_workspace::attempt::AttemptSnapshot;
use perago_workspace::history::confirm_of;
use perago_workspace::publication::{Key, Phase};
use perago_workspace::reference::WorkspaceRef;
use perago_workspace::staging::{self, StagingBranch};

use super::SEARCH_LIMIT;
use super::decide::{Base, Verdict};
use crate::Failure;
use crate::history::LineageView;

#[derive(Debug, Serialize)]
pub struct ExplainView {
    pub workflow_id: String,
    pub workflow_name: String,
    pub status: String,
    pub steps: Vec<StepView>,
}

impl ExplainView {
    /// Whether an attempt is left in a state nothing settles by itself.
    pub fn needs_attention(&self) -> bool {
        self.steps
            .iter()
            .flat_map(|s| &s.attempts)
            .any(|a| a.verdict.needs_attention())
    }
}

#[derive(Debug, Serialize)]
pub struct StepView {
    /// The referenceTaskName.
    pub step: String,
    pub task_type: String,
    pub attempts: Vec<AttemptView>,
}

/// An attempt and its verdict, printed as one object.
#[derive(Debug, Serialize)]
pub struct AttemptView {
    #[serde(flatten)]
    pub record: Attempt,
    pub verdict: Verdict,
}

/// One attempt as Conductor and lakeFS show it: what `decide` reads.
#[derive(Debug, Serialize)]
pub struct Attempt {
    /// Conductor's retryCount.
    pub attempt: i64,
    pub task_id: String,
    pub status: TaskStatus,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub worker_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// The attempt's `workspace` input, or why it is not one.
    pub workspace: WorkspaceView,
    /// The `workspace.ref` Conductor has as the attempt's output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_ref: Option<String>,
    /// Staging branches of this attempt that still exist.
    pub staging: Vec<StagingView>,
    /// Where the confirm commit was looked for, and what was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchView>,
    /// Which code produced the attempt's publication, as its confirm commit (else its try
    /// commit) says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lineage: Option<LineageView>,
    /// What lakeFS could not tell (a repository, branch or commit it does not have).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(skip)]
    pub(super) facts: Facts,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum WorkspaceView {
    Valid {
        repository: String,
        branch: String,
        input_ref: String,
    },
    Invalid {
        invalid: String,
    },
}

#[derive(Debug, Serialize)]
pub struct StagingView {
    pub branch: String,
    pub head: String,
    /// The head, when it is this attempt's `perago try` commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub try_commit: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SearchView {
    pub branch: String,
    /// First-parent commits above the input ref that were looked at.
    pub searched: usize,
    pub reached_input_ref: bool,
    /// The search stopped at [`SEARCH_LIMIT`] before the input ref.
    pub bounded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirm: Option<String>,
    /// The confirm commit of a later attempt whose `perago.supersedes` names this one's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
}

/// What the verdict is decided from, beyond the view's own fields.
#[derive(Debug, Default)]
pub(super) struct Facts {
    pub(super) branch: String,
    pub(super) input_ref: Option<String>,
    /// This attempt's confirm commit, and what it was published on.
    pub(super) confirm: Option<(String, Base)>,
    /// A later confirm commit that supersedes this attempt's: (id, its retry count).
    pub(super) superseded_by: Option<(String, String)>,
    /// The output ref is an earlier attempt's publication: its retry count.
    pub(super) reported_publication_of: Option<String>,
}

/// A lakeFS answer that says the thing asked about is not there (or cannot be named): a fact
/// about the attempt, not a failure of the command.
fn absent(e: &LakeFsError) -> bool {
    e.status()
        .is_some_and(|s| s.as_u16() == 404 || s.as_u16() == 400)
}

/// The newest commits of a branch's first-parent history down to an input ref.
struct Log {
    /// Above the input ref, newest first.
    range: Vec<Commit>,
    reached: bool,
    bounded: bool,
}

/// A lakeFS read that lakeFS answered: what it found, or its answer that it has no such
/// thing, kept as the attempt's note rather than failing the command.
#[derive(Clone)]
enum Lookup<T> {
    Found(T),
    Missing(String),
}

impl<T> Lookup<T> {
    fn of(answer: Result<T, LakeFsError>) -> Result<Self, Failure> {
        match answer {
            Ok(found) => Ok(Self::Found(found)),
            Err(e) if absent(&e) => Ok(Self::Missing(e.to_string())),
            Err(e) => Err(anyhow::Error::from(e).into()),
        }
    }

    fn map<U>(self, f: impl FnOnce(T) -> U) -> Lookup<U> {
        match self {
            Self::Found(found) => Lookup::Found(f(found)),
            Self::Missing(note) => Lookup::Missing(note),
        }
    }
}

/// lakeFS reads, each made once per command.
pub(super) struct Reader<'a> {
    lakefs: &'a LakeFsClient,
    branches: BTreeMap<(String, String), Lookup<Vec<String>>>,
    logs: BTreeMap<(String, String, String), Lookup<Rc<Log>>>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(lakefs: &'a LakeFsClient) -> Self {
        Self {
            lakefs,
            branches: BTreeMap::new(),
            logs: BTreeMap::new(),
        }
    }
}

impl Reader<'_> {
    async fn step_branches(
        &mut self,
        repo: &str,
        prefix: &str,
    ) -> Result<Lookup<Vec<String>>, Failure> {
        let key = (repo.to_owned(), prefix.to_owned());
        if let Some(found) = self.branches.get(&key) {
            return Ok(found.clone());
        }
        let answer = Lookup::of(self.lakefs.list_branches(repo, prefix).await)?;
        self.branches.insert(key, answer.clone());
        Ok(answer)
    }

    async fn log(&mut self, ws: &WorkspaceRef) -> Result<Lookup<Rc<Log>>, Failure> {
        let key = (
            ws.repository.clone(),
            ws.branch.clone(),
            ws.reference.clone(),
        );
        if let Some(found) = self.logs.get(&key) {
            return Ok(found.clone());
        }
        let answer = Lookup::of(
            self.lakefs
                .first_parent_log(&ws.repository, &ws.branch, &ws.reference, SEARCH_LIMIT + 1)
                .await,
        )?
        .map(|(mut commits, more)| {
            let end = commits.iter().position(|c| c.id == ws.reference);
            let bounded = end.is_none() && (commits.len() > SEARCH_LIMIT || more);
            commits.truncate(end.unwrap_or(SEARCH_LIMIT));
            Rc::new(Log {
                range: commits,
                reached: end.is_some(),
                bounded,
            })
        });
        self.logs.insert(key, answer.clone());
        Ok(answer)
    }

    pub(super) async fn attempt(
        &mut self,
        wf: &Workflow,
        task: &WorkflowTask,
    ) -> Result<Attempt, Failure> {
        let output_ref = task
            .output_data
            .get("workspace")
            .and_then(|w| w.get("ref"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut view = Attempt {
            attempt: task.retry_count,
            task_id: task.task_id.clone(),
            status: task.status.clone(),
            reason: task.reason_for_incompletion.clone(),
            worker_id: task.worker_id.clone(),
            started: utc(task.start_time),
            ended: utc(task.end_time),
            workspace: WorkspaceView::Invalid {
                invalid: String::new(),
            },
            output_ref,
            staging: Vec::new(),
            search: None,
            lineage: None,
            note: None,
            facts: Facts::default(),
        };
        let ws = match WorkspaceRef::parse(&task.input_data["workspace"]) {
            Ok(ws) => ws,
            Err(e) => {
                view.workspace = WorkspaceView::Invalid {
                    invalid: e.to_string(),
                };
                return Ok(view);
            }
        };
        view.workspace = WorkspaceView::Valid {
            repository: ws.repository.clone(),
            branch: ws.branch.clone(),
            input_ref: ws.reference.clone(),
        };
        view.facts.branch = ws.branch.clone();
        view.facts.input_ref = Some(ws.reference.clone());
        let mut notes = Vec::new();

        // Staging branches: the step's, then this attempt's by its task id and retry count.
        let snapshot = snapshot(wf, task);
        let ours = StagingBranch::of(&snapshot, "");
        match self
            .step_branches(&ws.repository, &staging::step_prefix(&snapshot))
            .await?
        {
            Lookup::Found(names) => {
                for name in names.iter().filter(|n| {
                    StagingBranch::parse(n).is_some_and(|b| {
                        b.is_of_step(&snapshot)
                            && b.task == ours.task
                            && b.retry_count == ours.retry_count
                    })
                }) {
                    match Lookup::of(self.lakefs.get_commit(&ws.repository, name).await)? {
                        Lookup::Found(head) => {
                            let is_try = Phase::of(&head.metadata) == Some(Phase::Try)
                                && Key::TaskId.get(&head.metadata) == Some(task.task_id.as_str());
                            if is_try && view.lineage.is_none() {
                                view.lineage = LineageView::of(&head.metadata);
                            }
                            view.staging.push(StagingView {
                                branch: name.clone(),
                                try_commit: is_try.then(|| head.id.clone()),
                                head: head.id,
                            });
                        }
                        // Deleted since it was listed.
                        Lookup::Missing(_) => {}
                    }
                }
            }
            Lookup::Missing(note) => notes.push(note),
        }

        // The confirm commit, on the target's first-parent history above the input ref.
        match self.log(&ws).await? {
            Lookup::Found(log) => {
                let is_ours = |c: &&Commit| {
                    confirm_of(c).is_some()
                        && Key::TaskId.get(&c.metadata) == Some(task.task_id.as_str())
                };
                let confirm = log.range.iter().find(is_ours);
                let meta = |c: &Commit, k: Key| k.get(&c.metadata).unwrap_or_default().to_owned();
                let superseded_by = confirm.and_then(|ours| {
                    log.range.iter().find(|c| {
                        confirm_of(c).is_some()
                            && Key::Supersedes.get(&c.metadata) == Some(ours.id.as_str())
                    })
                });
                view.facts.superseded_by =
                    superseded_by.map(|c| (c.id.clone(), meta(c, Key::RetryCount)));
                if let Some(c) = confirm {
                    view.lineage = LineageView::of(&c.metadata).or(view.lineage.take());
                }
                view.facts.confirm = confirm.map(|c| {
                    let on = Base::of(meta(c, Key::ExpectedHead), meta(c, Key::Supersedes));
                    (c.id.clone(), on)
                });
                if let Some(out) = &view.output_ref
                    && confirm.is_none_or(|c| &c.id != out)
                {
                    view.facts.reported_publication_of = log
                        .range
                        .iter()
                        .find(|c| &c.id == out && confirm_of(c).is_some())
                        .map(|c| meta(c, Key::RetryCount));
                }
                view.search = Some(SearchView {
                    branch: ws.branch.clone(),
                    searched: log.range.len(),
                    reached_input_ref: log.reached,
                    bounded: log.bounded,
                    confirm: confirm.map(|c| c.id.clone()),
                    superseded_by: superseded_by.map(|c| c.id.clone()),
                });
            }
            Lookup::Missing(note) => notes.push(note),
        }
        if !notes.is_empty() {
            view.note = Some(notes.join("; "));
        }
        Ok(view)
    }
}

/// The attempt as the sidecar named its staging branch.
fn snapshot(wf: &Workflow, t: &WorkflowTask) -> AttemptSnapshot {
    AttemptSnapshot {
        workflow_instance_id: wf.workflow_id.clone(),
        task_id: t.task_id.clone(),
        retry_count: t.retry_count,
        task_def_name: t.task_def_name.clone(),
        reference_task_name: t.reference_task_name.clone(),
        seq: t.seq,
        iteration: t.iteration,
        status: t.status.clone(),
        input_data: Map::new(),
        retried_task_id: None,
        response_timeout_seconds: None,
        worker_id: None,
        poll_count: None,
    }
}

/// A Conductor time (milliseconds since the epoch; 0 for never) in UTC, RFC 3339.
pub fn utc(ms: i64) -> Option<String> {
    if ms <= 0 {
        return None;
    }
    time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000))
        .ok()?
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_in_utc() {
        assert_eq!(utc(0), None);
        assert_eq!(utc(1_000).as_deref(), Some("1970-01-01T00:00:01Z"));
        assert_eq!(
            utc(951_782_400_000).as_deref(),
            Some("2000-02-29T00:00:00Z")
        );
        assert_eq!(
            utc(1_796_148_573_241).as_deref(),
            Some("2026-12-01T18:09:33Z")
        );
    }
}
