//! `kubectl perago explain`: what became of each attempt of a workflow's workspace steps. For
//! every attempt it sets Conductor's record beside what lakeFS holds (the attempt's staging
//! branch and try commit while they exist, its confirm commit on the target branch's
//! first-parent history) and gives one verdict. It only reads: an uncertain attempt is settled
//! by the next attempt's publish fence, or by the operator starting a new workflow from the
//! branch head; never by this command.

use std::collections::BTreeMap;
use std::fmt;
use std::rc::Rc;

use anyhow::anyhow;
use clap::Args;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use perago_conductor::{TaskStatus, Workflow, WorkflowTask};
use perago_lakefs::{Commit, LakeFsClient, LakeFsError, MergeOutcome};
use perago_workspace::attempt::AttemptSnapshot;
use perago_workspace::history::confirm_of;
use perago_workspace::publication::{Key, Phase};
use perago_workspace::reference::WorkspaceRef;
use perago_workspace::refusal::{Fence, FenceRefusal};
use perago_workspace::staging::{self, StagingBranch};

use crate::Failure;
use crate::connect::Endpoints;

use crate::output::{Table, cell, columns, short};

/// How many commits of the target branch's first-parent history are searched for an
/// attempt's confirm commit, from the head down to the attempt's input ref.
pub const SEARCH_LIMIT: usize = 1000;

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// The Conductor workflow id.
    pub workflow_id: String,
    /// Only this step: its referenceTaskName (inside a loop, every iteration of it).
    #[arg(long)]
    pub step: Option<String>,
}

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

/// One attempt as Conductor and lakeFS show it: what [`decide`] reads.
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
    /// What lakeFS could not tell (a repository, branch or commit it does not have).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(skip)]
    facts: Facts,
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

/// A verdict's `kind` in JSON: what scripts match on, coarser than [`Verdict`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    PublishedAndReported,
    PublishedNotReported,
    CompletedWithoutPublishing,
    NotPublished,
    OutcomeUncertain,
    RefusedByFence,
    StillRunning,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceKind {
    /// The publish fence (or its re-check of the head right before the merge).
    Publish,
    /// lakeFS's pre-merge hook, `deploy/lakefs/perago-hard-fence.yaml`.
    Hard,
    /// Conductor no longer had the attempt as current.
    Attempt,
}

/// What became of one attempt: the situation [`decide`] found, with the facts that tell it.
/// Its words are its `Display`; in JSON it is a [`VerdictKind`], those words and the commit,
/// fence and head a script needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Conductor has it scheduled, or held by a worker.
    StillRunning {
        status: TaskStatus,
        worker: Option<String>,
        progress: Progress,
    },
    /// Completed, and its output ref is its confirm commit.
    Published { commit: String, branch: String },
    /// Completed on an earlier attempt's publication, which already held its workspace and
    /// which it reported as its output ref. `retry` is that attempt's `perago.retry_count`.
    ReportedEarlier {
        commit: String,
        branch: String,
        retry: String,
    },
    /// Completed with an output ref that no confirm commit found on the branch is.
    ReportedUnconfirmed {
        output_ref: String,
        branch: String,
        gap: Option<SearchGap>,
    },
    /// Completed on its input ref: read-only, or nothing changed.
    CompletedOnInput { input_ref: String },
    /// Completed with no workspace ref as its output.
    CompletedWithoutOutput,
    /// Over without completing though its confirm commit is on the branch (the pod died after
    /// the merge), and retry `retry` published `by` on top of it (`perago.supersedes`).
    Superseded {
        commit: String,
        branch: String,
        status: TaskStatus,
        by: String,
        retry: String,
    },
    /// Over without completing though its confirm commit is on the branch, and nothing
    /// superseded it. `next` is what the next attempt of its step did; `None`, there is none.
    Unreported {
        commit: String,
        branch: String,
        status: TaskStatus,
        next: Option<Next>,
    },
    /// Its merge got no answer that could be read and no confirm commit of it is on the
    /// branch: only the branch can tell whether it landed. `cause` is the reason after its
    /// first `: `; `settles` is what the next attempt did about it, `None` when there is none.
    Uncertain {
        outcome: MergeOutcome,
        cause: String,
        branch: String,
        gap: Option<SearchGap>,
        try_commit: Option<String>,
        settles: Option<Settlement>,
    },
    /// A fence refused it, before anything was published. `branch` is its target.
    Refused {
        refusal: FenceRefusal,
        branch: String,
    },
    /// Failed before publishing. `reason` is `None` when Conductor has none.
    NotPublished {
        status: TaskStatus,
        reason: Option<String>,
        staged: Option<Staged>,
    },
    /// Failed with a terminal error: the body did not run and Conductor does not retry it.
    Terminal {
        reason: Option<String>,
        staged: Option<Staged>,
    },
}

/// How far a running attempt's publication got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    Nothing,
    Staged(Staged),
    /// Its confirm commit is on the branch.
    Merged {
        commit: String,
    },
}

/// A `perago try` commit left at the head of the attempt's staging branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    pub commit: String,
    pub branch: String,
}

/// Why finding no confirm commit may not be the last word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchGap {
    /// The search stopped at [`SEARCH_LIMIT`] before the input ref.
    Bounded,
    /// The input ref is no longer on the branch's first-parent history.
    InputRefGone,
    /// lakeFS could not be searched.
    NotSearched,
}

/// What the next attempt did with an unreported publication it did not supersede.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// It completed on it: its workspace was already there.
    CompletedOnIt {
        retry: i64,
    },
    /// Its publish fence will find the publication and publish on top of it.
    Running {
        retry: i64,
        status: TaskStatus,
    },
    Ended {
        retry: i64,
        status: TaskStatus,
    },
}

/// What the next attempt did about an uncertain merge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// Its publish fence ran and it published `commit` on `on`.
    Published {
        retry: i64,
        commit: String,
        on: Base,
    },
    /// Its publish fence has not run yet.
    Pending { retry: i64 },
    /// It ended without publishing.
    Ended { retry: i64, status: TaskStatus },
}

/// What a publication was made on, from its confirm commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Base {
    /// The head its publish fence expected (`perago.expected_head`), superseding nothing.
    Head(String),
    /// An earlier attempt's unreported publication (`perago.supersedes`).
    Superseding(String),
}

impl Base {
    fn of(expected_head: String, supersedes: String) -> Self {
        if supersedes.is_empty() {
            Self::Head(expected_head)
        } else {
            Self::Superseding(supersedes)
        }
    }
}

impl SearchGap {
    fn of(search: Option<&SearchView>) -> Option<Self> {
        match search {
            Some(s) if s.bounded => Some(Self::Bounded),
            Some(s) if !s.reached_input_ref => Some(Self::InputRefGone),
            Some(_) => None,
            None => Some(Self::NotSearched),
        }
    }
}

impl Verdict {
    pub fn kind(&self) -> VerdictKind {
        match self {
            Self::StillRunning { .. } => VerdictKind::StillRunning,
            Self::Published { .. }
            | Self::ReportedEarlier { .. }
            | Self::ReportedUnconfirmed { .. } => VerdictKind::PublishedAndReported,
            Self::CompletedOnInput { .. } | Self::CompletedWithoutOutput => {
                VerdictKind::CompletedWithoutPublishing
            }
            Self::Superseded { .. } | Self::Unreported { .. } => VerdictKind::PublishedNotReported,
            Self::Uncertain { .. } => VerdictKind::OutcomeUncertain,
            Self::Refused { .. } => VerdictKind::RefusedByFence,
            Self::NotPublished { .. } | Self::Terminal { .. } => VerdictKind::NotPublished,
        }
    }

    /// Nothing will settle this attempt by itself: no later attempt of its step exists.
    pub fn needs_attention(&self) -> bool {
        matches!(
            self,
            Self::Unreported { next: None, .. } | Self::Uncertain { settles: None, .. }
        )
    }

    /// The commit the verdict names.
    pub fn commit(&self) -> Option<&str> {
        match self {
            Self::StillRunning {
                progress: Progress::Merged { commit },
                ..
            }
            | Self::Published { commit, .. }
            | Self::ReportedEarlier { commit, .. }
            | Self::ReportedUnconfirmed {
                output_ref: commit, ..
            }
            | Self::Superseded { commit, .. }
            | Self::Unreported { commit, .. } => Some(commit),
            Self::Uncertain { try_commit, .. } => try_commit.as_deref(),
            _ => None,
        }
    }

    pub fn superseded_by(&self) -> Option<&str> {
        match self {
            Self::Superseded { by, .. } => Some(by),
            _ => None,
        }
    }

    pub fn fence(&self) -> Option<FenceKind> {
        match self {
            Self::Refused { refusal, .. } => Some(match refusal.fence() {
                Fence::Attempt => FenceKind::Attempt,
                Fence::Publish => FenceKind::Publish,
                Fence::Hard => FenceKind::Hard,
            }),
            _ => None,
        }
    }

    /// The branch head the refusing fence saw, when its reason says.
    pub fn head(&self) -> Option<&str> {
        match self {
            Self::Refused { refusal, .. } => refusal.head(),
            _ => None,
        }
    }
}

impl Serialize for Verdict {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        /// The verdict as scripts read it, field by field as it always was.
        #[derive(Serialize)]
        struct Shown<'a> {
            kind: VerdictKind,
            /// The verdict in words.
            summary: String,
            #[serde(skip_serializing_if = "Option::is_none")]
            commit: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            superseded_by: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            fence: Option<FenceKind>,
            #[serde(skip_serializing_if = "Option::is_none")]
            head: Option<&'a str>,
            needs_attention: bool,
        }
        Shown {
            kind: self.kind(),
            summary: self.to_string(),
            commit: self.commit(),
            superseded_by: self.superseded_by(),
            fence: self.fence(),
            head: self.head(),
            needs_attention: self.needs_attention(),
        }
        .serialize(s)
    }
}

/// What the verdict is decided from, beyond the view's own fields.
#[derive(Debug, Default)]
struct Facts {
    branch: String,
    input_ref: Option<String>,
    /// This attempt's confirm commit, and what it was published on.
    confirm: Option<(String, Base)>,
    /// A later confirm commit that supersedes this attempt's: (id, its retry count).
    superseded_by: Option<(String, String)>,
    /// The output ref is an earlier attempt's publication: its retry count.
    reported_publication_of: Option<String>,
}

pub async fn run(endpoints: &Endpoints, args: &ExplainArgs) -> Result<ExplainView, Failure> {
    let conductor = endpoints.require_conductor()?;
    let id = args.workflow_id.as_str();
    let workflow = match conductor.workflow(id).await {
        Ok(w) => w,
        Err(e) if e.is_not_found() => {
            return Err(anyhow!("Conductor has no workflow {id} (get workflow: HTTP 404)").into());
        }
        Err(e) => {
            return Err(anyhow::Error::from(e)
                .context(format!("workflow {id}"))
                .into());
        }
    };
    let workspace_tasks: Vec<&WorkflowTask> = workflow
        .tasks
        .iter()
        .filter(|t| t.input_data.get("workspace").is_some_and(Value::is_object))
        .collect();
    let mut order: Vec<&str> = Vec::new();
    for t in &workspace_tasks {
        if !order.contains(&t.reference_task_name.as_str()) {
            order.push(&t.reference_task_name);
        }
    }
    let chosen: Vec<&str> = match &args.step {
        None => order.clone(),
        Some(step) => order
            .iter()
            .copied()
            .filter(|name| is_step(name, step))
            .collect(),
    };
    if chosen.is_empty() {
        let known = if order.is_empty() {
            "it has none".to_owned()
        } else {
            format!("its workspace steps: {}", order.join(", "))
        };
        return Err(match &args.step {
            Some(step) => anyhow!("workflow {id} has no workspace step {step} ({known})"),
            None => anyhow!("workflow {id} has no workspace step: no task input has a workspace"),
        }
        .into());
    }
    let lakefs = endpoints.lakefs()?;
    let mut reader = Reader {
        lakefs: &lakefs,
        branches: BTreeMap::new(),
        logs: BTreeMap::new(),
    };
    let mut steps = Vec::new();
    for name in chosen {
        let tasks: Vec<&WorkflowTask> = workspace_tasks
            .iter()
            .copied()
            .filter(|t| t.reference_task_name == name)
            .collect();
        let mut attempts = Vec::new();
        for task in &tasks {
            attempts.push(reader.attempt(&workflow, task).await?);
        }
        steps.push(StepView {
            step: name.to_owned(),
            task_type: tasks
                .first()
                .map(|t| t.task_type.clone())
                .unwrap_or_default(),
            attempts: judged(attempts),
        });
    }
    Ok(ExplainView {
        workflow_id: workflow.workflow_id.clone(),
        workflow_name: workflow.workflow_name.clone(),
        status: workflow.status.clone(),
        steps,
    })
}

/// A step's attempts, in order, each with its verdict.
fn judged(attempts: Vec<Attempt>) -> Vec<AttemptView> {
    let verdicts: Vec<Verdict> = (0..attempts.len())
        .map(|i| decide(&attempts[i], attempts.get(i + 1)))
        .collect();
    attempts
        .into_iter()
        .zip(verdicts)
        .map(|(record, verdict)| AttemptView { record, verdict })
        .collect()
}

/// `--step build` also selects the iterations of `build` inside a loop (`build__2`).
fn is_step(name: &str, step: &str) -> bool {
    name == step
        || name
            .strip_prefix(step)
            .and_then(|rest| rest.strip_prefix("__"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
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
struct Reader<'a> {
    lakefs: &'a LakeFsClient,
    branches: BTreeMap<(String, String), Lookup<Vec<String>>>,
    logs: BTreeMap<(String, String, String), Lookup<Rc<Log>>>,
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

    async fn attempt(&mut self, wf: &Workflow, task: &WorkflowTask) -> Result<Attempt, Failure> {
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

/// The verdict on attempt `a`, given the attempt of its step that came after it (`None` for
/// the last). Facts only: the words are [`Verdict`]'s `Display`.
fn decide(a: &Attempt, next: Option<&Attempt>) -> Verdict {
    if a.status.is_running() {
        running(a)
    } else if a.status == TaskStatus::Completed {
        completed(a)
    } else if let Some((commit, _)) = &a.facts.confirm {
        unreported(a, commit, next)
    } else if let Some(outcome) = MergeOutcome::of_reason(&a.reason).filter(|o| o.may_have_landed())
    {
        uncertain(a, outcome, next)
    } else {
        failed(a)
    }
}

impl Attempt {
    /// The `perago try` commit it left at the head of a staging branch, if any.
    fn staged_commit(&self) -> Option<Staged> {
        self.staging.iter().find_map(|s| {
            Some(Staged {
                commit: s.try_commit.clone()?,
                branch: s.branch.clone(),
            })
        })
    }
}

fn running(a: &Attempt) -> Verdict {
    let progress = match (&a.facts.confirm, a.staged_commit()) {
        (Some((commit, _)), _) => Progress::Merged {
            commit: commit.clone(),
        },
        (None, Some(staged)) => Progress::Staged(staged),
        (None, None) => Progress::Nothing,
    };
    Verdict::StillRunning {
        status: a.status.clone(),
        worker: Some(a.worker_id.clone()).filter(|w| !w.is_empty()),
        progress,
    }
}

fn completed(a: &Attempt) -> Verdict {
    let f = &a.facts;
    let branch = f.branch.clone();
    let Some(out) = a.output_ref.clone() else {
        return Verdict::CompletedWithoutOutput;
    };
    if Some(&out) == f.input_ref.as_ref() {
        return Verdict::CompletedOnInput { input_ref: out };
    }
    if f.confirm.as_ref().is_some_and(|(commit, _)| *commit == out) {
        return Verdict::Published {
            commit: out,
            branch,
        };
    }
    match f.reported_publication_of.clone() {
        Some(retry) => Verdict::ReportedEarlier {
            commit: out,
            branch,
            retry,
        },
        None => Verdict::ReportedUnconfirmed {
            output_ref: out,
            branch,
            gap: SearchGap::of(a.search.as_ref()),
        },
    }
}

/// Over without completing, though its confirm commit `commit` is on the branch.
fn unreported(a: &Attempt, commit: &str, next: Option<&Attempt>) -> Verdict {
    let (commit, branch, status) = (commit.to_owned(), a.facts.branch.clone(), a.status.clone());
    if let Some((by, retry)) = a.facts.superseded_by.clone() {
        return Verdict::Superseded {
            commit,
            branch,
            status,
            by,
            retry,
        };
    }
    let next = next.map(|n| {
        let (retry, status) = (n.attempt, n.status.clone());
        if n.output_ref.as_ref() == Some(&commit) {
            Next::CompletedOnIt { retry }
        } else if status.is_running() {
            Next::Running { retry, status }
        } else {
            Next::Ended { retry, status }
        }
    });
    Verdict::Unreported {
        commit,
        branch,
        status,
        next,
    }
}

/// Over without completing, no confirm commit of it found, and a merge that may have landed.
fn uncertain(a: &Attempt, outcome: MergeOutcome, next: Option<&Attempt>) -> Verdict {
    let settles = next.map(|n| {
        let (retry, status) = (n.attempt, n.status.clone());
        match &n.facts.confirm {
            Some((commit, on)) => Settlement::Published {
                retry,
                commit: commit.clone(),
                on: on.clone(),
            },
            None if status.is_running() => Settlement::Pending { retry },
            None => Settlement::Ended { retry, status },
        }
    });
    // The sidecar's reason opens with the call ("lakeFS merge on r@main failed"), which the
    // words say their own way.
    let cause = a
        .reason
        .split_once(": ")
        .map_or(a.reason.as_str(), |(_, c)| c);
    Verdict::Uncertain {
        outcome,
        cause: cause.to_owned(),
        branch: a.facts.branch.clone(),
        gap: SearchGap::of(a.search.as_ref()),
        try_commit: a.staged_commit().map(|s| s.commit),
        settles,
    }
}

/// Over without completing, and nothing of it on the branch: refused, or failed.
fn failed(a: &Attempt) -> Verdict {
    let branch = &a.facts.branch;
    if let Some(refusal) = FenceRefusal::parse(&a.reason, branch, &a.task_id) {
        return Verdict::Refused {
            refusal,
            branch: branch.clone(),
        };
    }
    let (reason, staged) = (
        Some(a.reason.clone()).filter(|r| !r.is_empty()),
        a.staged_commit(),
    );
    if a.status == TaskStatus::FailedWithTerminalError {
        Verdict::Terminal { reason, staged }
    } else {
        Verdict::NotPublished {
            status: a.status.clone(),
            reason,
            staged,
        }
    }
}

// The verdict in words: what the table prints and JSON's `summary`. A change of wording
// belongs here and nowhere in `decide`.

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StillRunning {
                status,
                worker,
                progress,
            } => {
                write!(f, "still running ({status}")?;
                if let Some(worker) = worker {
                    write!(f, " on {worker}")?;
                }
                f.write_str(")")?;
                match progress {
                    Progress::Merged { commit } => write!(
                        f,
                        "; its merge already landed as {}, not reported yet",
                        short(commit)
                    ),
                    Progress::Staged(staged) => write!(f, "; {staged}, not merged yet"),
                    Progress::Nothing => Ok(()),
                }
            }
            Self::Published { commit, branch } => write!(
                f,
                "published and reported: {} on {branch}, its confirm commit and output ref",
                short(commit)
            ),
            Self::ReportedEarlier {
                commit,
                branch,
                retry,
            } => write!(
                f,
                "published and reported: its workspace was already on {branch} as {}, the publication of attempt {retry}, which it reported as its output ref",
                short(commit)
            ),
            Self::ReportedUnconfirmed {
                output_ref,
                branch,
                gap,
            } => write!(
                f,
                "published and reported: Conductor has {} as its output ref, but no confirm commit of it is on {branch}{}",
                short(output_ref),
                Gap(*gap)
            ),
            Self::CompletedOnInput { input_ref } => write!(
                f,
                "completed without publishing: read-only or nothing changed; its output ref is the input ref {}",
                short(input_ref)
            ),
            Self::CompletedWithoutOutput => f.write_str(
                "completed without publishing: Conductor has no workspace ref as its output",
            ),
            Self::Superseded {
                commit,
                branch,
                status,
                by,
                retry,
            } => write!(
                f,
                "{}retry {retry} superseded it with {} (perago.supersedes)",
                Landed(commit, branch, status),
                short(by)
            ),
            Self::Unreported {
                commit,
                branch,
                status,
                next,
            } => {
                write!(f, "{}", Landed(commit, branch, status))?;
                match next {
                    Some(next) => write!(f, "{next}"),
                    None => write!(
                        f,
                        "no later attempt of this step exists, so it stands on {branch} without a reported result (docs/operations.md, section A merge timed out)"
                    ),
                }
            }
            Self::Uncertain {
                outcome,
                cause,
                branch,
                gap,
                try_commit,
                settles,
            } => {
                let (ended, lands) = match outcome {
                    MergeOutcome::Applied => (
                        "lakeFS answered its merge with success but the answer could not be read",
                        "the merge landed",
                    ),
                    _ => (
                        "its merge ended without an answer",
                        "the merge may still land",
                    ),
                };
                write!(
                    f,
                    "outcome uncertain: {ended} ({}) and no confirm commit of it is on {branch}{}; ",
                    cell(cause, 120),
                    Gap(*gap)
                )?;
                match try_commit {
                    Some(t) => write!(f, "its staging commit is {}", short(t))?,
                    None => f.write_str(
                        "its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit)",
                    )?,
                }
                write!(f, "; {lands}. What settles it: ")?;
                match settles {
                    Some(settles) => write!(f, "{settles}"),
                    None => f.write_str(
                        "no later attempt will run its publish fence: run explain again (a confirm commit of this task on the branch means the merge landed) and see docs/operations.md, section A merge timed out",
                    ),
                }
            }
            Self::Refused { refusal, branch } => {
                let name = match refusal.fence() {
                    Fence::Publish => "the publish fence",
                    Fence::Hard => "the hard fence",
                    Fence::Attempt => "the attempt fence",
                };
                write!(
                    f,
                    "refused by {name}: {}; nothing was published",
                    refusal_words(refusal, branch)
                )
            }
            Self::NotPublished {
                status,
                reason,
                staged,
            } => not_published(f, status, reason.as_deref(), false, staged.as_ref()),
            Self::Terminal { reason, staged } => not_published(
                f,
                &TaskStatus::FailedWithTerminalError,
                reason.as_deref(),
                true,
                staged.as_ref(),
            ),
        }
    }
}

impl fmt::Display for Next {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CompletedOnIt { retry } => write!(
                f,
                "retry {retry} completed on it: its workspace was already there"
            ),
            Self::Running { retry, status } => write!(
                f,
                "retry {retry} is {status}: its publish fence will find this commit and publish on top of it"
            ),
            Self::Ended { retry, status } => {
                write!(f, "retry {retry} ({status}) did not supersede it")
            }
        }
    }
}

impl fmt::Display for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Published { retry, commit, on } => write!(
                f,
                "the next attempt's publish fence: retry {retry} published {} {on}; run explain again to see whether this merge landed since",
                short(commit)
            ),
            Self::Pending { retry } => write!(
                f,
                "the next attempt's publish fence, when retry {retry} reaches it, or running explain again"
            ),
            Self::Ended { retry, status } => write!(
                f,
                "retry {retry} ended {status} without publishing; run explain again"
            ),
        }
    }
}

impl fmt::Display for Base {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Head(expected) => write!(
                f,
                "on {} superseding nothing, so this merge had not landed when it looked",
                short(expected)
            ),
            Self::Superseding(earlier) => write!(f, "on top of {}", short(earlier)),
        }
    }
}

impl fmt::Display for Staged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "staged {} on {}", short(&self.commit), self.branch)
    }
}

/// Why "no confirm commit" may not be the last word, in words, as a parenthesis.
struct Gap(Option<SearchGap>);

impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(SearchGap::Bounded) => write!(
                f,
                " (only the newest {SEARCH_LIMIT} commits were searched: the input ref is further down)"
            ),
            Some(SearchGap::InputRefGone) => {
                f.write_str(" (the input ref is no longer on the branch's first-parent history)")
            }
            Some(SearchGap::NotSearched) => f.write_str(" (lakeFS could not be searched)"),
            None => Ok(()),
        }
    }
}

/// The opening of a publication nobody reported, up to what became of it.
struct Landed<'a>(&'a str, &'a str, &'a TaskStatus);

impl fmt::Display for Landed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self(commit, branch, status) = self;
        write!(
            f,
            "published but not reported: {} landed on {branch}, but Conductor has the attempt {status}; ",
            short(commit)
        )
    }
}

fn not_published(
    f: &mut fmt::Formatter<'_>,
    status: &TaskStatus,
    reason: Option<&str>,
    terminal: bool,
    staged: Option<&Staged>,
) -> fmt::Result {
    match reason {
        Some(reason) => write!(f, "not published: {reason}")?,
        None => write!(f, "not published: Conductor has it {status} with no reason")?,
    }
    if terminal {
        f.write_str(" (terminal: the body did not run and Conductor does not retry it)")?;
    }
    match staged {
        Some(staged) => write!(f, "; it {staged} and never merged"),
        None => Ok(()),
    }
}

/// A fence's refusal in words. `branch` is the attempt's target.
fn refusal_words(refusal: &FenceRefusal, branch: &str) -> String {
    match refusal {
        FenceRefusal::HardFence { head, expected, .. }
            if !head.is_empty() && !expected.is_empty() =>
        {
            format!(
                "lakeFS's pre-merge hook found {branch} at {} while the publication expected {}",
                short(head),
                short(expected)
            )
        }
        FenceRefusal::HardFence { .. } => {
            format!("lakeFS's pre-merge hook refused the merge into {branch}")
        }
        FenceRefusal::Advanced { input, head, .. } => format!(
            "{branch} had moved from the input ref {} to {}, which is not this step's publication",
            short(input),
            short(head)
        ),
        FenceRefusal::BeyondRange { .. } => {
            format!("{branch} had moved too far past the input ref to classify")
        }
        FenceRefusal::InputGone { input, .. } => format!(
            "{branch} no longer contains the input ref {} (reset or rewritten)",
            short(input)
        ),
        FenceRefusal::NoOpMoved { input, head, .. } => format!(
            "nothing changed, but {branch} had moved from the input ref {} to {}",
            short(input),
            short(head)
        ),
        FenceRefusal::PythonMoved { input, head, .. } => format!(
            "Python Perago's fence: {branch} had moved from the input ref {} to {}",
            short(input),
            short(head)
        ),
        FenceRefusal::NotCurrent { .. } => {
            "Conductor no longer had it as the current attempt when it was about to publish"
                .to_owned()
        }
        FenceRefusal::Unconfirmed { .. } => {
            "Conductor could not confirm it was still the current attempt".to_owned()
        }
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

fn commits(n: usize) -> String {
    if n == 1 {
        "1 commit".into()
    } else {
        format!("{n} commits")
    }
}

impl Table for ExplainView {
    fn table(&self) -> String {
        let mut out = format!(
            "workflow {} ({}): {}\n",
            cell(&self.workflow_id, 80),
            cell(&self.workflow_name, 80),
            cell(&self.status, 40)
        );
        for step in &self.steps {
            let target = step
                .attempts
                .iter()
                .find_map(|a| match &a.record.workspace {
                    WorkspaceView::Valid {
                        repository, branch, ..
                    } => Some(format!(" on {repository}@{branch}")),
                    WorkspaceView::Invalid { .. } => None,
                })
                .unwrap_or_default();
            out.push_str(&format!(
                "\nstep {} ({}){}\n",
                cell(&step.step, 80),
                cell(&step.task_type, 80),
                cell(&target, 200)
            ));
            let rows: Vec<Vec<String>> = step
                .attempts
                .iter()
                .map(|AttemptView { record: a, .. }| {
                    vec![
                        a.attempt.to_string(),
                        cell(a.status.as_str(), 30),
                        cell(&a.task_id, 40),
                        cell(&a.worker_id, 40),
                        a.started.clone().unwrap_or_else(|| "-".into()),
                        a.ended.clone().unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            out.push_str(&columns(
                &["ATTEMPT", "STATUS", "TASK", "WORKER", "STARTED", "ENDED"],
                &rows,
            ));
            for AttemptView { record: a, verdict } in &step.attempts {
                out.push_str(&format!(
                    "  attempt {}: {}\n",
                    a.attempt,
                    cell(&verdict.to_string(), 700)
                ));
                match &a.workspace {
                    WorkspaceView::Valid { input_ref, .. } => {
                        out.push_str(&format!("    input    {}\n", short(input_ref)));
                    }
                    WorkspaceView::Invalid { invalid } => {
                        out.push_str(&format!("    input    {}\n", cell(invalid, 200)));
                    }
                }
                if let Some(o) = &a.output_ref {
                    out.push_str(&format!("    output   {}\n", cell(&short(o), 12)));
                }
                // A verdict of not published quotes the reason already.
                if !a.reason.is_empty() && verdict.kind() != VerdictKind::NotPublished {
                    out.push_str(&format!("    reason   {}\n", cell(&a.reason, 300)));
                }
                if matches!(a.workspace, WorkspaceView::Valid { .. }) && a.note.is_none() {
                    if a.staging.is_empty() {
                        out.push_str("    staging  none left\n");
                    }
                    for s in &a.staging {
                        out.push_str(&format!(
                            "    staging  {} at {}{}\n",
                            s.branch,
                            short(&s.head),
                            if s.try_commit.is_some() {
                                " (its try commit)"
                            } else {
                                " (nothing staged)"
                            }
                        ));
                    }
                }
                if let Some(s) = &a.search {
                    let found = match &s.confirm {
                        Some(c) => format!("{} on {}", short(c), s.branch),
                        None => format!("none on {}", s.branch),
                    };
                    let how = if s.reached_input_ref {
                        format!("{} above the input ref searched", commits(s.searched))
                    } else if s.bounded {
                        format!(
                            "the newest {} searched, the input ref not reached",
                            commits(s.searched)
                        )
                    } else {
                        format!(
                            "{} searched, the input ref is not on the branch",
                            commits(s.searched)
                        )
                    };
                    out.push_str(&format!("    confirm  {found} ({how})\n"));
                }
                if let Some(n) = &a.note {
                    out.push_str(&format!("    lakeFS   {}\n", cell(n, 300)));
                }
            }
        }
        if self.needs_attention() {
            out.push_str(
                "\nneeds attention: an attempt above is uncertain or published without a report, and no later attempt will settle it\n",
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::output::{Format, render};

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

    /// The verdict on a failed attempt with this reason, publishing to main.
    fn failed(reason: &str) -> Verdict {
        decide(&attempt(1, TaskStatus::Failed).reason(reason), None)
    }

    #[test]
    fn refusals_name_their_fence_and_the_head_they_saw() {
        let seen = |v: Verdict| (v.fence(), v.head().map(str::to_owned));
        let head = |h: &str| Some(h.to_owned());
        let publish = Some(FenceKind::Publish);
        assert_eq!(
            seen(failed("main advanced from A1 to H1")),
            (publish, head("H1"))
        );
        assert_eq!(
            seen(failed(
                "main cannot complete no-op from input ref A1; current head is H2"
            )),
            (publish, head("H2"))
        );
        let gone = failed("main no longer contains workspace input ref A1");
        assert!(gone.to_string().contains("no longer contains"), "{gone}");
        assert_eq!(seen(gone), (publish, None));
        assert_eq!(
            failed("main advanced beyond supported publish range (1024 commits)").fence(),
            publish
        );
        let hard = "lakeFS merge on r@main failed: HTTP 412 Precondition Failed: update branch main: pre-merge hook aborted, run id 'x': 1 error occurred:\n\t* hook run id '0000_0000' failed on action 'perago-hard-fence' hook 'perago_expected_head': action failed: runtime error: [string \"lua\"]:5: perago hard fence: main is at H3, expected E3\nstack traceback:";
        let refused = failed(hard);
        assert!(refused.to_string().contains("E3"), "{refused}");
        assert_eq!(seen(refused), (Some(FenceKind::Hard), head("H3")));
        assert_eq!(
            MergeOutcome::of_reason(hard),
            Some(MergeOutcome::NotApplied)
        );
        let attempt_fence = Some(FenceKind::Attempt);
        assert_eq!(failed("t-1").fence(), attempt_fence);
        assert_eq!(
            failed("broker failed to reload attempt t-1: Conductor get task failed: x").fence(),
            attempt_fence
        );
        for not_a_refusal in ["task body exited with status 3", "dev advanced from A to H"] {
            let v = failed(not_a_refusal);
            assert_eq!(v.kind(), VerdictKind::NotPublished, "{not_a_refusal}");
        }
    }

    #[test]
    fn only_merges_without_an_answer_are_uncertain() {
        for (reason, uncertain) in [
            (
                "lakeFS merge on r@main failed: error sending request: operation timed out",
                true,
            ),
            (
                "lakeFS merge on r@main failed: HTTP 503 Service Unavailable: x",
                true,
            ),
            (
                "lakeFS merge on r@main returned an unreadable answer: EOF",
                true,
            ),
            (
                "lakeFS merge on r@main failed: HTTP 409 Conflict: conflict",
                false,
            ),
            (
                "lakeFS merge on r@main failed: HTTP 423 Locked: locked",
                false,
            ),
            (
                "lakeFS commit on r@perago-staging-x failed: timed out",
                false,
            ),
            ("main advanced from A to H", false),
        ] {
            let may_have_landed =
                MergeOutcome::of_reason(reason).is_some_and(MergeOutcome::may_have_landed);
            assert_eq!(may_have_landed, uncertain, "{reason}");
            let v = failed(reason);
            assert_eq!(v.kind() == VerdictKind::OutcomeUncertain, uncertain, "{v}");
        }
    }

    /// Commit ids longer than the 12 characters people read.
    const INPUT: &str = "1npu7000000000000000";
    const C: &str = "c0nf1rm00000000000aa";
    const C2: &str = "c0nf1rm22222222222bb";
    const TRY: &str = "7ry0000000000000cccc";
    const OUT: &str = "0u7pu7000000000000dd";
    const STAGING: &str = "perago-staging-step-task-id-t-retry-0-e";

    fn attempt(retry: i64, status: TaskStatus) -> Attempt {
        Attempt {
            attempt: retry,
            task_id: format!("t-{retry}"),
            status,
            reason: String::new(),
            worker_id: String::new(),
            started: None,
            ended: None,
            workspace: WorkspaceView::Valid {
                repository: "r".into(),
                branch: "main".into(),
                input_ref: INPUT.into(),
            },
            output_ref: None,
            staging: Vec::new(),
            search: Some(SearchView {
                branch: "main".into(),
                searched: 1,
                reached_input_ref: true,
                bounded: false,
                confirm: None,
                superseded_by: None,
            }),
            note: None,
            facts: Facts {
                branch: "main".into(),
                input_ref: Some(INPUT.into()),
                ..Facts::default()
            },
        }
    }

    /// How each case is built: the attempt's own facts, set one by one.
    impl Attempt {
        fn worker(mut self, w: &str) -> Self {
            self.worker_id = w.into();
            self
        }
        fn reason(mut self, r: &str) -> Self {
            self.reason = r.into();
            self
        }
        fn output(mut self, o: &str) -> Self {
            self.output_ref = Some(o.into());
            self
        }
        fn staged(mut self, try_commit: &str) -> Self {
            self.staging.push(StagingView {
                branch: STAGING.into(),
                head: try_commit.into(),
                try_commit: Some(try_commit.into()),
            });
            self
        }
        /// Its confirm commit, published on `expected` superseding `supersedes` ("" for none).
        fn confirm(mut self, id: &str, expected: &str, supersedes: &str) -> Self {
            if let Some(s) = &mut self.search {
                s.confirm = Some(id.into());
            }
            self.facts.confirm = Some((id.into(), Base::of(expected.into(), supersedes.into())));
            self
        }
        fn superseded(mut self, by: &str, retry: &str) -> Self {
            if let Some(s) = &mut self.search {
                s.superseded_by = Some(by.into());
            }
            self.facts.superseded_by = Some((by.into(), retry.into()));
            self
        }
        fn reports_publication_of(mut self, retry: &str) -> Self {
            self.facts.reported_publication_of = Some(retry.into());
            self
        }
        fn bounded(mut self) -> Self {
            if let Some(s) = &mut self.search {
                (s.searched, s.reached_input_ref, s.bounded) = (SEARCH_LIMIT, false, true);
            }
            self
        }
        fn input_gone(mut self) -> Self {
            if let Some(s) = &mut self.search {
                s.reached_input_ref = false;
            }
            self
        }
        fn unsearched(mut self) -> Self {
            self.search = None;
            self
        }
    }

    const TIMED_OUT_MERGE: &str =
        "lakeFS merge on r@main failed: error sending request: operation timed out";
    const TIMED_OUT_CAUSE: &str = "error sending request: operation timed out";
    const UNREADABLE_MERGE: &str = "lakeFS merge on r@main returned an unreadable answer: EOF";

    /// One situation `decide` tells apart: the attempt, the one after it, what `decide` finds
    /// and how that reads.
    struct Case {
        name: &'static str,
        attempt: Attempt,
        next: Option<Attempt>,
        verdict: Verdict,
        words: &'static str,
    }

    fn staged() -> Staged {
        Staged {
            commit: TRY.into(),
            branch: STAGING.into(),
        }
    }

    fn reported_unconfirmed(gap: Option<SearchGap>) -> Verdict {
        Verdict::ReportedUnconfirmed {
            output_ref: OUT.into(),
            branch: "main".into(),
            gap,
        }
    }

    fn unreported_with(status: TaskStatus, next: Option<Next>) -> Verdict {
        Verdict::Unreported {
            commit: C.into(),
            branch: "main".into(),
            status,
            next,
        }
    }

    fn refused_by(refusal: FenceRefusal) -> Verdict {
        Verdict::Refused {
            refusal,
            branch: "main".into(),
        }
    }

    fn cases() -> Vec<Case> {
        use TaskStatus::*;
        vec![
            Case {
                name: "running on a worker",
                attempt: attempt(0, InProgress).worker("w-1"),
                next: None,
                verdict: Verdict::StillRunning {
                    status: InProgress,
                    worker: Some("w-1".into()),
                    progress: Progress::Nothing,
                },
                words: "still running (IN_PROGRESS on w-1)",
            },
            Case {
                name: "scheduled, staged",
                attempt: attempt(0, Scheduled).staged(TRY),
                next: None,
                verdict: Verdict::StillRunning {
                    status: Scheduled,
                    worker: None,
                    progress: Progress::Staged(staged()),
                },
                words: "still running (SCHEDULED); staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e, not merged yet",
            },
            Case {
                name: "running, merged",
                attempt: attempt(0, InProgress).worker("w-1").staged(TRY).confirm(C, INPUT, ""),
                next: None,
                verdict: Verdict::StillRunning {
                    status: InProgress,
                    worker: Some("w-1".into()),
                    progress: Progress::Merged { commit: C.into() },
                },
                words: "still running (IN_PROGRESS on w-1); its merge already landed as c0nf1rm00000, not reported yet",
            },
            Case {
                name: "completed on its input ref",
                attempt: attempt(0, Completed).output(INPUT),
                next: None,
                verdict: Verdict::CompletedOnInput {
                    input_ref: INPUT.into(),
                },
                words: "completed without publishing: read-only or nothing changed; its output ref is the input ref 1npu70000000",
            },
            Case {
                name: "published and reported",
                attempt: attempt(0, Completed).confirm(C, INPUT, "").output(C),
                next: None,
                verdict: Verdict::Published {
                    commit: C.into(),
                    branch: "main".into(),
                },
                words: "published and reported: c0nf1rm00000 on main, its confirm commit and output ref",
            },
            Case {
                name: "reported an earlier publication",
                attempt: attempt(1, Completed).output(OUT).reports_publication_of("0"),
                next: None,
                verdict: Verdict::ReportedEarlier {
                    commit: OUT.into(),
                    branch: "main".into(),
                    retry: "0".into(),
                },
                words: "published and reported: its workspace was already on main as 0u7pu7000000, the publication of attempt 0, which it reported as its output ref",
            },
            Case {
                name: "reported, no confirm commit",
                attempt: attempt(0, Completed).output(OUT),
                next: None,
                verdict: reported_unconfirmed(None),
                words: "published and reported: Conductor has 0u7pu7000000 as its output ref, but no confirm commit of it is on main",
            },
            Case {
                name: "reported, no confirm commit in the newest searched",
                attempt: attempt(0, Completed).output(OUT).bounded(),
                next: None,
                verdict: reported_unconfirmed(Some(SearchGap::Bounded)),
                words: "published and reported: Conductor has 0u7pu7000000 as its output ref, but no confirm commit of it is on main (only the newest 1000 commits were searched: the input ref is further down)",
            },
            Case {
                name: "reported, the input ref gone",
                attempt: attempt(0, Completed).output(OUT).input_gone(),
                next: None,
                verdict: reported_unconfirmed(Some(SearchGap::InputRefGone)),
                words: "published and reported: Conductor has 0u7pu7000000 as its output ref, but no confirm commit of it is on main (the input ref is no longer on the branch's first-parent history)",
            },
            Case {
                name: "reported, lakeFS not searched",
                attempt: attempt(0, Completed).output(OUT).unsearched(),
                next: None,
                verdict: reported_unconfirmed(Some(SearchGap::NotSearched)),
                words: "published and reported: Conductor has 0u7pu7000000 as its output ref, but no confirm commit of it is on main (lakeFS could not be searched)",
            },
            Case {
                name: "completed with no output",
                attempt: attempt(0, Completed),
                next: None,
                verdict: Verdict::CompletedWithoutOutput,
                words: "completed without publishing: Conductor has no workspace ref as its output",
            },
            Case {
                name: "unreported, superseded",
                attempt: attempt(0, TimedOut).confirm(C, INPUT, "").superseded(C2, "1"),
                next: Some(attempt(1, Completed).confirm(C2, C, C).output(C2)),
                verdict: Verdict::Superseded {
                    commit: C.into(),
                    branch: "main".into(),
                    status: TimedOut,
                    by: C2.into(),
                    retry: "1".into(),
                },
                words: "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 superseded it with c0nf1rm22222 (perago.supersedes)",
            },
            Case {
                name: "unreported, the retry completed on it",
                attempt: attempt(0, TimedOut).confirm(C, INPUT, ""),
                next: Some(attempt(1, Completed).output(C)),
                verdict: unreported_with(TimedOut, Some(Next::CompletedOnIt { retry: 1 })),
                words: "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 completed on it: its workspace was already there",
            },
            Case {
                name: "unreported, the retry running",
                attempt: attempt(0, TimedOut).confirm(C, INPUT, ""),
                next: Some(attempt(1, InProgress)),
                verdict: unreported_with(
                    TimedOut,
                    Some(Next::Running {
                        retry: 1,
                        status: InProgress,
                    }),
                ),
                words: "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 is IN_PROGRESS: its publish fence will find this commit and publish on top of it",
            },
            Case {
                name: "unreported, the retry failed",
                attempt: attempt(0, Failed).confirm(C, INPUT, ""),
                next: Some(attempt(1, Failed).reason("x")),
                verdict: unreported_with(
                    Failed,
                    Some(Next::Ended {
                        retry: 1,
                        status: Failed,
                    }),
                ),
                words: "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt FAILED; retry 1 (FAILED) did not supersede it",
            },
            Case {
                name: "unreported, no retry",
                attempt: attempt(0, TimedOut).confirm(C, INPUT, ""),
                next: None,
                verdict: unreported_with(TimedOut, None),
                words: "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; no later attempt of this step exists, so it stands on main without a reported result (docs/operations.md, section A merge timed out)",
            },
            Case {
                name: "uncertain, the retry published superseding nothing",
                attempt: attempt(0, Failed).reason(TIMED_OUT_MERGE).staged(TRY),
                next: Some(attempt(1, Completed).confirm(C2, INPUT, "").output(C2)),
                verdict: Verdict::Uncertain {
                    outcome: MergeOutcome::Unknown,
                    cause: TIMED_OUT_CAUSE.into(),
                    branch: "main".into(),
                    gap: None,
                    try_commit: Some(TRY.into()),
                    settles: Some(Settlement::Published {
                        retry: 1,
                        commit: C2.into(),
                        on: Base::Head(INPUT.into()),
                    }),
                },
                words: "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main; its staging commit is 7ry000000000; the merge may still land. What settles it: the next attempt's publish fence: retry 1 published c0nf1rm22222 on 1npu70000000 superseding nothing, so this merge had not landed when it looked; run explain again to see whether this merge landed since",
            },
            Case {
                name: "uncertain, answered, the retry published on top of it",
                attempt: attempt(0, Failed).reason(UNREADABLE_MERGE),
                next: Some(attempt(1, Completed).confirm(C2, C, C).output(C2)),
                verdict: Verdict::Uncertain {
                    outcome: MergeOutcome::Applied,
                    cause: "EOF".into(),
                    branch: "main".into(),
                    gap: None,
                    try_commit: None,
                    settles: Some(Settlement::Published {
                        retry: 1,
                        commit: C2.into(),
                        on: Base::Superseding(C.into()),
                    }),
                },
                words: "outcome uncertain: lakeFS answered its merge with success but the answer could not be read (EOF) and no confirm commit of it is on main; its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge landed. What settles it: the next attempt's publish fence: retry 1 published c0nf1rm22222 on top of c0nf1rm00000; run explain again to see whether this merge landed since",
            },
            Case {
                name: "uncertain, the retry running",
                attempt: attempt(0, Failed).reason(TIMED_OUT_MERGE).bounded(),
                next: Some(attempt(1, Scheduled)),
                verdict: Verdict::Uncertain {
                    outcome: MergeOutcome::Unknown,
                    cause: TIMED_OUT_CAUSE.into(),
                    branch: "main".into(),
                    gap: Some(SearchGap::Bounded),
                    try_commit: None,
                    settles: Some(Settlement::Pending { retry: 1 }),
                },
                words: "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main (only the newest 1000 commits were searched: the input ref is further down); its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: the next attempt's publish fence, when retry 1 reaches it, or running explain again",
            },
            Case {
                name: "uncertain, the retry failed",
                attempt: attempt(0, Failed).reason(TIMED_OUT_MERGE).unsearched(),
                next: Some(attempt(1, Canceled)),
                verdict: Verdict::Uncertain {
                    outcome: MergeOutcome::Unknown,
                    cause: TIMED_OUT_CAUSE.into(),
                    branch: "main".into(),
                    gap: Some(SearchGap::NotSearched),
                    try_commit: None,
                    settles: Some(Settlement::Ended {
                        retry: 1,
                        status: Canceled,
                    }),
                },
                words: "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main (lakeFS could not be searched); its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: retry 1 ended CANCELED without publishing; run explain again",
            },
            Case {
                name: "uncertain, no retry",
                attempt: attempt(0, Failed).reason(TIMED_OUT_MERGE),
                next: None,
                verdict: Verdict::Uncertain {
                    outcome: MergeOutcome::Unknown,
                    cause: TIMED_OUT_CAUSE.into(),
                    branch: "main".into(),
                    gap: None,
                    try_commit: None,
                    settles: None,
                },
                words: "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main; its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: no later attempt will run its publish fence: run explain again (a confirm commit of this task on the branch means the merge landed) and see docs/operations.md, section A merge timed out",
            },
            Case {
                name: "refused by the publish fence",
                attempt: attempt(0, Failed).reason(&format!("main advanced from {INPUT} to {C2}")),
                next: None,
                verdict: refused_by(FenceRefusal::Advanced {
                    branch: "main".into(),
                    input: INPUT.into(),
                    head: C2.into(),
                }),
                words: "refused by the publish fence: main had moved from the input ref 1npu70000000 to c0nf1rm22222, which is not this step's publication; nothing was published",
            },
            Case {
                name: "refused by the hard fence",
                attempt: attempt(0, Failed).reason(&format!("lakeFS merge on r@main failed: HTTP 412 Precondition Failed: perago hard fence: main is at {C2}, expected {INPUT}")),
                next: None,
                verdict: refused_by(FenceRefusal::HardFence {
                    branch: "main".into(),
                    head: C2.into(),
                    expected: INPUT.into(),
                }),
                words: "refused by the hard fence: lakeFS's pre-merge hook found main at c0nf1rm22222 while the publication expected 1npu70000000; nothing was published",
            },
            Case {
                name: "refused by the attempt fence",
                attempt: attempt(0, Failed).reason("t-0"),
                next: None,
                verdict: refused_by(FenceRefusal::NotCurrent {
                    task_id: "t-0".into(),
                }),
                words: "refused by the attempt fence: Conductor no longer had it as the current attempt when it was about to publish; nothing was published",
            },
            Case {
                name: "not published, staged",
                attempt: attempt(0, Failed).reason("task body exited with status 3").staged(TRY),
                next: None,
                verdict: Verdict::NotPublished {
                    status: Failed,
                    reason: Some("task body exited with status 3".into()),
                    staged: Some(staged()),
                },
                words: "not published: task body exited with status 3; it staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e and never merged",
            },
            Case {
                name: "not published, no reason",
                attempt: attempt(0, Canceled),
                next: None,
                verdict: Verdict::NotPublished {
                    status: Canceled,
                    reason: None,
                    staged: None,
                },
                words: "not published: Conductor has it CANCELED with no reason",
            },
            Case {
                name: "not published, a merge lakeFS refused",
                attempt: attempt(0, Failed).reason("lakeFS merge on r@main failed: HTTP 409 Conflict: conflict"),
                next: Some(attempt(1, Completed)),
                verdict: Verdict::NotPublished {
                    status: Failed,
                    reason: Some(
                        "lakeFS merge on r@main failed: HTTP 409 Conflict: conflict".into(),
                    ),
                    staged: None,
                },
                words: "not published: lakeFS merge on r@main failed: HTTP 409 Conflict: conflict",
            },
            Case {
                name: "terminal",
                attempt: attempt(0, FailedWithTerminalError).reason("pre guardrail failed"),
                next: None,
                verdict: Verdict::Terminal {
                    reason: Some("pre guardrail failed".into()),
                    staged: None,
                },
                words: "not published: pre guardrail failed (terminal: the body did not run and Conductor does not retry it)",
            },
            Case {
                name: "terminal, no reason",
                attempt: attempt(0, FailedWithTerminalError).staged(TRY),
                next: None,
                verdict: Verdict::Terminal {
                    reason: None,
                    staged: Some(staged()),
                },
                words: "not published: Conductor has it FAILED_WITH_TERMINAL_ERROR with no reason (terminal: the body did not run and Conductor does not retry it); it staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e and never merged",
            },
        ]
    }

    /// A step whose attempts are given their verdicts as `run` does.
    fn step(name: &str, attempts: Vec<Attempt>) -> StepView {
        StepView {
            step: name.into(),
            task_type: "kx.task".into(),
            attempts: judged(attempts),
        }
    }

    /// Two steps: a publication nobody reported that its retry superseded; a failure that
    /// staged, then a merge that timed out with no retry after it.
    fn sample() -> ExplainView {
        let mut crashed = attempt(0, TaskStatus::TimedOut)
            .confirm(C, INPUT, "")
            .superseded(C2, "1")
            .reason("responseTimeout: 2 exceeded")
            .worker("w-0");
        crashed.started = utc(1_000);
        crashed.ended = utc(3_000);
        let retry = attempt(1, TaskStatus::Completed)
            .confirm(C2, C, C)
            .output(C2)
            .staged(TRY);
        let mut staged = attempt(0, TaskStatus::Failed)
            .reason("task body exited with status 3")
            .staged(TRY);
        staged.note = Some("lakeFS get commit: HTTP 404".into());
        let timed_out = attempt(1, TaskStatus::Failed)
            .reason(TIMED_OUT_MERGE)
            .bounded();
        ExplainView {
            workflow_id: "wf".into(),
            workflow_name: "kx.crash".into(),
            status: "FAILED".into(),
            steps: vec![
                step("step", vec![crashed, retry]),
                step("build__2", vec![staged, timed_out]),
            ],
        }
    }

    #[test]
    fn decide_finds_each_situation() {
        for Case {
            name,
            attempt,
            next,
            verdict,
            ..
        } in cases()
        {
            assert_eq!(decide(&attempt, next.as_ref()), verdict, "{name}");
        }
    }

    /// Adding a variant breaks this match, and the count below asks for a case of it.
    fn variant(v: &Verdict) -> &'static str {
        match v {
            Verdict::StillRunning { .. } => "still running",
            Verdict::Published { .. } => "published",
            Verdict::ReportedEarlier { .. } => "reported earlier",
            Verdict::ReportedUnconfirmed { .. } => "reported unconfirmed",
            Verdict::CompletedOnInput { .. } => "completed on input",
            Verdict::CompletedWithoutOutput => "completed without output",
            Verdict::Superseded { .. } => "superseded",
            Verdict::Unreported { .. } => "unreported",
            Verdict::Uncertain { .. } => "uncertain",
            Verdict::Refused { .. } => "refused",
            Verdict::NotPublished { .. } => "not published",
            Verdict::Terminal { .. } => "terminal",
        }
    }

    #[test]
    fn the_cases_cover_every_verdict() {
        let covered: std::collections::BTreeSet<&str> =
            cases().iter().map(|c| variant(&c.verdict)).collect();
        assert_eq!(covered.len(), 12, "{covered:?}");
    }

    #[test]
    fn every_case_keeps_its_words() {
        for Case {
            name,
            verdict,
            words,
            ..
        } in cases()
        {
            assert_eq!(verdict.to_string(), words, "{name}");
        }
    }

    #[test]
    fn every_case_keeps_its_json_fields() {
        let fields: BTreeMap<&str, Value> = [
            ("running on a worker", json!({"kind":"still_running","needs_attention":false})),
            ("scheduled, staged", json!({"kind":"still_running","needs_attention":false})),
            ("running, merged", json!({"kind":"still_running","needs_attention":false,"commit":"c0nf1rm00000000000aa"})),
            ("completed on its input ref", json!({"kind":"completed_without_publishing","needs_attention":false})),
            ("published and reported", json!({"kind":"published_and_reported","needs_attention":false,"commit":"c0nf1rm00000000000aa"})),
            ("reported an earlier publication", json!({"kind":"published_and_reported","needs_attention":false,"commit":"0u7pu7000000000000dd"})),
            ("reported, no confirm commit", json!({"kind":"published_and_reported","needs_attention":false,"commit":"0u7pu7000000000000dd"})),
            ("reported, no confirm commit in the newest searched", json!({"kind":"published_and_reported","needs_attention":false,"commit":"0u7pu7000000000000dd"})),
            ("reported, the input ref gone", json!({"kind":"published_and_reported","needs_attention":false,"commit":"0u7pu7000000000000dd"})),
            ("reported, lakeFS not searched", json!({"kind":"published_and_reported","needs_attention":false,"commit":"0u7pu7000000000000dd"})),
            ("completed with no output", json!({"kind":"completed_without_publishing","needs_attention":false})),
            ("unreported, superseded", json!({"kind":"published_not_reported","needs_attention":false,"commit":"c0nf1rm00000000000aa","superseded_by":"c0nf1rm22222222222bb"})),
            ("unreported, the retry completed on it", json!({"kind":"published_not_reported","needs_attention":false,"commit":"c0nf1rm00000000000aa"})),
            ("unreported, the retry running", json!({"kind":"published_not_reported","needs_attention":false,"commit":"c0nf1rm00000000000aa"})),
            ("unreported, the retry failed", json!({"kind":"published_not_reported","needs_attention":false,"commit":"c0nf1rm00000000000aa"})),
            ("unreported, no retry", json!({"kind":"published_not_reported","needs_attention":true,"commit":"c0nf1rm00000000000aa"})),
            ("uncertain, the retry published superseding nothing", json!({"kind":"outcome_uncertain","needs_attention":false,"commit":"7ry0000000000000cccc"})),
            ("uncertain, answered, the retry published on top of it", json!({"kind":"outcome_uncertain","needs_attention":false})),
            ("uncertain, the retry running", json!({"kind":"outcome_uncertain","needs_attention":false})),
            ("uncertain, the retry failed", json!({"kind":"outcome_uncertain","needs_attention":false})),
            ("uncertain, no retry", json!({"kind":"outcome_uncertain","needs_attention":true})),
            ("refused by the publish fence", json!({"kind":"refused_by_fence","needs_attention":false,"fence":"publish","head":"c0nf1rm22222222222bb"})),
            ("refused by the hard fence", json!({"kind":"refused_by_fence","needs_attention":false,"fence":"hard","head":"c0nf1rm22222222222bb"})),
            ("refused by the attempt fence", json!({"kind":"refused_by_fence","needs_attention":false,"fence":"attempt"})),
            ("not published, staged", json!({"kind":"not_published","needs_attention":false})),
            ("not published, no reason", json!({"kind":"not_published","needs_attention":false})),
            ("not published, a merge lakeFS refused", json!({"kind":"not_published","needs_attention":false})),
            ("terminal", json!({"kind":"not_published","needs_attention":false})),
            ("terminal, no reason", json!({"kind":"not_published","needs_attention":false})),
        ]
        .into();
        for Case { name, verdict, .. } in cases() {
            let mut shown = serde_json::to_value(verdict).unwrap();
            shown.as_object_mut().unwrap().remove("summary");
            assert_eq!(Some(&shown), fields.get(name), "{name}");
        }
        assert_eq!(fields.len(), cases().len());
    }

    #[test]
    fn refusals_keep_their_words() {
        for (reason, words) in [
            (
                "main advanced beyond supported publish range (1024 commits)".to_owned(),
                "refused by the publish fence: main had moved too far past the input ref to classify; nothing was published",
            ),
            (
                format!("main no longer contains workspace input ref {INPUT}"),
                "refused by the publish fence: main no longer contains the input ref 1npu70000000 (reset or rewritten); nothing was published",
            ),
            (
                format!("main cannot complete no-op from input ref {INPUT}; current head is {C2}"),
                "refused by the publish fence: nothing changed, but main had moved from the input ref 1npu70000000 to c0nf1rm22222; nothing was published",
            ),
            (
                format!("main cannot publish from input ref {INPUT}; current head is {C2}"),
                "refused by the publish fence: Python Perago's fence: main had moved from the input ref 1npu70000000 to c0nf1rm22222; nothing was published",
            ),
            (
                "broker failed to reload attempt t-0: Conductor get task failed: x".to_owned(),
                "refused by the attempt fence: Conductor could not confirm it was still the current attempt; nothing was published",
            ),
            (
                "lakeFS merge on r@main failed: HTTP 412: perago hard fence: unreadable".to_owned(),
                "refused by the hard fence: lakeFS's pre-merge hook refused the merge into main; nothing was published",
            ),
        ] {
            let refused = attempt(0, TaskStatus::Failed).reason(&reason);
            assert_eq!(decide(&refused, None).to_string(), words, "{reason}");
        }
    }

    #[test]
    fn the_view_prints_as_before() {
        let view = sample();
        assert_eq!(
            render(&view, Format::Json).unwrap(),
            r#"{
  "workflow_id": "wf",
  "workflow_name": "kx.crash",
  "status": "FAILED",
  "steps": [
    {
      "step": "step",
      "task_type": "kx.task",
      "attempts": [
        {
          "attempt": 0,
          "task_id": "t-0",
          "status": "TIMED_OUT",
          "reason": "responseTimeout: 2 exceeded",
          "worker_id": "w-0",
          "started": "1970-01-01T00:00:01Z",
          "ended": "1970-01-01T00:00:03Z",
          "workspace": {
            "repository": "r",
            "branch": "main",
            "input_ref": "1npu7000000000000000"
          },
          "staging": [],
          "search": {
            "branch": "main",
            "searched": 1,
            "reached_input_ref": true,
            "bounded": false,
            "confirm": "c0nf1rm00000000000aa",
            "superseded_by": "c0nf1rm22222222222bb"
          },
          "verdict": {
            "kind": "published_not_reported",
            "summary": "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 superseded it with c0nf1rm22222 (perago.supersedes)",
            "commit": "c0nf1rm00000000000aa",
            "superseded_by": "c0nf1rm22222222222bb",
            "needs_attention": false
          }
        },
        {
          "attempt": 1,
          "task_id": "t-1",
          "status": "COMPLETED",
          "workspace": {
            "repository": "r",
            "branch": "main",
            "input_ref": "1npu7000000000000000"
          },
          "output_ref": "c0nf1rm22222222222bb",
          "staging": [
            {
              "branch": "perago-staging-step-task-id-t-retry-0-e",
              "head": "7ry0000000000000cccc",
              "try_commit": "7ry0000000000000cccc"
            }
          ],
          "search": {
            "branch": "main",
            "searched": 1,
            "reached_input_ref": true,
            "bounded": false,
            "confirm": "c0nf1rm22222222222bb"
          },
          "verdict": {
            "kind": "published_and_reported",
            "summary": "published and reported: c0nf1rm22222 on main, its confirm commit and output ref",
            "commit": "c0nf1rm22222222222bb",
            "needs_attention": false
          }
        }
      ]
    },
    {
      "step": "build__2",
      "task_type": "kx.task",
      "attempts": [
        {
          "attempt": 0,
          "task_id": "t-0",
          "status": "FAILED",
          "reason": "task body exited with status 3",
          "workspace": {
            "repository": "r",
            "branch": "main",
            "input_ref": "1npu7000000000000000"
          },
          "staging": [
            {
              "branch": "perago-staging-step-task-id-t-retry-0-e",
              "head": "7ry0000000000000cccc",
              "try_commit": "7ry0000000000000cccc"
            }
          ],
          "search": {
            "branch": "main",
            "searched": 1,
            "reached_input_ref": true,
            "bounded": false
          },
          "note": "lakeFS get commit: HTTP 404",
          "verdict": {
            "kind": "not_published",
            "summary": "not published: task body exited with status 3; it staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e and never merged",
            "needs_attention": false
          }
        },
        {
          "attempt": 1,
          "task_id": "t-1",
          "status": "FAILED",
          "reason": "lakeFS merge on r@main failed: error sending request: operation timed out",
          "workspace": {
            "repository": "r",
            "branch": "main",
            "input_ref": "1npu7000000000000000"
          },
          "staging": [],
          "search": {
            "branch": "main",
            "searched": 1000,
            "reached_input_ref": false,
            "bounded": true
          },
          "verdict": {
            "kind": "outcome_uncertain",
            "summary": "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main (only the newest 1000 commits were searched: the input ref is further down); its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: no later attempt will run its publish fence: run explain again (a confirm commit of this task on the branch means the merge landed) and see docs/operations.md, section A merge timed out",
            "needs_attention": true
          }
        }
      ]
    }
  ]
}
"#
        );
        assert_eq!(
            view.table(),
            r#"workflow wf (kx.crash): FAILED

step step (kx.task) on r@main
ATTEMPT  STATUS     TASK  WORKER  STARTED               ENDED
0        TIMED_OUT  t-0   w-0     1970-01-01T00:00:01Z  1970-01-01T00:00:03Z
1        COMPLETED  t-1           -                     -
  attempt 0: published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 superseded it with c0nf1rm22222 (perago.supersedes)
    input    1npu70000000
    reason   responseTimeout: 2 exceeded
    staging  none left
    confirm  c0nf1rm00000 on main (1 commit above the input ref searched)
  attempt 1: published and reported: c0nf1rm22222 on main, its confirm commit and output ref
    input    1npu70000000
    output   c0nf1rm22222
    staging  perago-staging-step-task-id-t-retry-0-e at 7ry000000000 (its try commit)
    confirm  c0nf1rm22222 on main (1 commit above the input ref searched)

step build__2 (kx.task) on r@main
ATTEMPT  STATUS  TASK  WORKER  STARTED  ENDED
0        FAILED  t-0           -        -
1        FAILED  t-1           -        -
  attempt 0: not published: task body exited with status 3; it staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e and never merged
    input    1npu70000000
    confirm  none on main (1 commit above the input ref searched)
    lakeFS   lakeFS get commit: HTTP 404
  attempt 1: outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main (only the newest 1000 commits were searched: the input ref is further down); its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: no later attempt will run its publish fence: run explain again (a confirm commit of this task on the branch means the merge landed) and see docs/operations.md, section A merge timed out
    input    1npu70000000
    reason   lakeFS merge on r@main failed: error sending request: operation timed out
    staging  none left
    confirm  none on main (the newest 1000 commits searched, the input ref not reached)

needs attention: an attempt above is uncertain or published without a report, and no later attempt will settle it
"#
        );
    }

    #[test]
    fn steps_select_their_loop_iterations() {
        assert!(is_step("build", "build"));
        assert!(is_step("build__2", "build"));
        assert!(!is_step("build__x", "build"));
        assert!(!is_step("build2", "build"));
    }
}
