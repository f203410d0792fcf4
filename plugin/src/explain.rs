//! `kubectl perago explain`: what became of each attempt of a workflow's workspace steps. For
//! every attempt it sets Conductor's record beside what lakeFS holds (the attempt's staging
//! branch and try commit while they exist, its confirm commit on the target branch's
//! first-parent history) and gives one verdict. It only reads: an uncertain attempt is settled
//! by the next attempt's publish fence, or by the operator starting a new workflow from the
//! branch head; never by this command.

use std::collections::BTreeMap;

use anyhow::anyhow;
use clap::Args;
use serde::Serialize;
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
            .any(|a| a.verdict.needs_attention)
    }
}

#[derive(Debug, Serialize)]
pub struct StepView {
    /// The referenceTaskName.
    pub step: String,
    pub task_type: String,
    pub attempts: Vec<AttemptView>,
}

#[derive(Debug, Serialize)]
pub struct AttemptView {
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
    pub verdict: Verdict,
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

#[derive(Debug, Serialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    /// The verdict in words.
    pub summary: String,
    /// The commit the verdict names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceKind>,
    /// The branch head the refusing fence saw, when its reason says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// Nothing will settle this attempt by itself: no later attempt of its step exists.
    pub needs_attention: bool,
}

/// What the verdict is decided from, beyond the view's own fields.
#[derive(Debug, Default)]
struct Facts {
    branch: String,
    input_ref: Option<String>,
    /// A later confirm commit that supersedes this attempt's: (id, its retry count).
    superseded_by: Option<(String, String)>,
    /// The output ref is an earlier attempt's publication: its retry count.
    reported_publication_of: Option<String>,
    /// This attempt's confirm commit: `perago.expected_head` and `perago.supersedes`.
    confirm_base: Option<(String, String)>,
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
        for i in 0..attempts.len() {
            let (done, rest) = attempts.split_at_mut(i + 1);
            let this = &mut done[i];
            this.verdict = decide(this, rest.first());
        }
        steps.push(StepView {
            step: name.to_owned(),
            task_type: tasks
                .first()
                .map(|t| t.task_type.clone())
                .unwrap_or_default(),
            attempts,
        });
    }
    Ok(ExplainView {
        workflow_id: workflow.workflow_id.clone(),
        workflow_name: workflow.workflow_name.clone(),
        status: workflow.status.clone(),
        steps,
    })
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

/// lakeFS reads, each made once per command.
struct Reader<'a> {
    lakefs: &'a LakeFsClient,
    branches: BTreeMap<(String, String), Result<Vec<String>, String>>,
    logs: BTreeMap<(String, String, String), Result<std::rc::Rc<Log>, String>>,
}

impl Reader<'_> {
    async fn step_branches(
        &mut self,
        repo: &str,
        prefix: &str,
    ) -> Result<Result<Vec<String>, String>, Failure> {
        let key = (repo.to_owned(), prefix.to_owned());
        if let Some(found) = self.branches.get(&key) {
            return Ok(found.clone());
        }
        let answer = match self.lakefs.list_branches(repo, prefix).await {
            Ok(names) => Ok(names),
            Err(e) if absent(&e) => Err(e.to_string()),
            Err(e) => return Err(anyhow::Error::from(e).into()),
        };
        self.branches.insert(key, answer.clone());
        Ok(answer)
    }

    async fn log(
        &mut self,
        ws: &WorkspaceRef,
    ) -> Result<Result<std::rc::Rc<Log>, String>, Failure> {
        let key = (
            ws.repository.clone(),
            ws.branch.clone(),
            ws.reference.clone(),
        );
        if let Some(found) = self.logs.get(&key) {
            return Ok(found.clone());
        }
        let answer = match self
            .lakefs
            .first_parent_log(&ws.repository, &ws.branch, &ws.reference, SEARCH_LIMIT + 1)
            .await
        {
            Ok((mut commits, more)) => {
                let end = commits.iter().position(|c| c.id == ws.reference);
                let bounded = end.is_none() && (commits.len() > SEARCH_LIMIT || more);
                commits.truncate(end.unwrap_or(SEARCH_LIMIT));
                Ok(std::rc::Rc::new(Log {
                    range: commits,
                    reached: end.is_some(),
                    bounded,
                }))
            }
            Err(e) if absent(&e) => Err(e.to_string()),
            Err(e) => return Err(anyhow::Error::from(e).into()),
        };
        self.logs.insert(key, answer.clone());
        Ok(answer)
    }

    async fn attempt(
        &mut self,
        wf: &Workflow,
        task: &WorkflowTask,
    ) -> Result<AttemptView, Failure> {
        let output_ref = task
            .output_data
            .get("workspace")
            .and_then(|w| w.get("ref"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut view = AttemptView {
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
            verdict: Verdict::new(VerdictKind::NotPublished, String::new()),
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
            Ok(names) => {
                for name in names.iter().filter(|n| {
                    StagingBranch::parse(n).is_some_and(|b| {
                        b.is_of_step(&snapshot)
                            && b.task == ours.task
                            && b.retry_count == ours.retry_count
                    })
                }) {
                    match self.lakefs.get_commit(&ws.repository, name).await {
                        Ok(head) => {
                            let is_try = Phase::of(&head.metadata) == Some(Phase::Try)
                                && Key::TaskId.get(&head.metadata) == Some(task.task_id.as_str());
                            view.staging.push(StagingView {
                                branch: name.clone(),
                                try_commit: is_try.then(|| head.id.clone()),
                                head: head.id,
                            });
                        }
                        // Deleted since it was listed.
                        Err(e) if absent(&e) => {}
                        Err(e) => return Err(anyhow::Error::from(e).into()),
                    }
                }
            }
            Err(e) => notes.push(e),
        }

        // The confirm commit, on the target's first-parent history above the input ref.
        match self.log(&ws).await? {
            Ok(log) => {
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
                view.facts.confirm_base =
                    confirm.map(|c| (meta(c, Key::ExpectedHead), meta(c, Key::Supersedes)));
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
            Err(e) => notes.push(e),
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

impl Verdict {
    fn new(kind: VerdictKind, summary: String) -> Self {
        Self {
            kind,
            summary,
            commit: None,
            superseded_by: None,
            fence: None,
            head: None,
            needs_attention: false,
        }
    }

    fn naming(mut self, commit: &str) -> Self {
        self.commit = Some(commit.to_owned());
        self
    }
}

/// A fence refusal read from a failure reason: which fence, the head it saw (when the reason
/// says), and the refusal in words.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub fence: FenceKind,
    pub head: Option<String>,
    pub words: String,
}

/// The fence that refused an attempt, from its reason (read by `perago_workspace::refusal`,
/// beside the types the sidecar formats it from). `branch` is the attempt's target.
pub fn refusal(reason: &str, branch: &str, task_id: &str) -> Option<Refusal> {
    let refused = FenceRefusal::parse(reason, branch, task_id)?;
    let head = refused.head().map(str::to_owned);
    let words = match &refused {
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
    };
    let fence = match refused.fence() {
        Fence::Attempt => FenceKind::Attempt,
        Fence::Publish => FenceKind::Publish,
        Fence::Hard => FenceKind::Hard,
    };
    Some(Refusal { fence, head, words })
}

fn decide(a: &AttemptView, next: Option<&AttemptView>) -> Verdict {
    let f = &a.facts;
    let branch = f.branch.as_str();
    let search = a.search.as_ref();
    let confirm = search.and_then(|s| s.confirm.as_deref());
    let try_commit = a.staging.iter().find_map(|s| s.try_commit.as_deref());
    let staged = || {
        a.staging.iter().find(|s| s.try_commit.is_some()).map(|s| {
            format!(
                "staged {} on {}",
                short(s.try_commit.as_deref().unwrap_or("")),
                s.branch
            )
        })
    };
    let next_name = next.map(|n| format!("retry {}", n.attempt));

    if a.status.is_running() {
        let mut words = format!("still running ({}", a.status);
        if !a.worker_id.is_empty() {
            words.push_str(&format!(" on {}", a.worker_id));
        }
        words.push(')');
        if let Some(c) = confirm {
            words.push_str(&format!(
                "; its merge already landed as {}, not reported yet",
                short(c)
            ));
        } else if let Some(s) = staged() {
            words.push_str(&format!("; {s}, not merged yet"));
        }
        let v = Verdict::new(VerdictKind::StillRunning, words);
        return match confirm {
            Some(c) => v.naming(c),
            None => v,
        };
    }

    if a.status == TaskStatus::Completed {
        let input = f.input_ref.as_deref();
        return match (a.output_ref.as_deref(), confirm) {
            (Some(out), _) if Some(out) == input => Verdict::new(
                VerdictKind::CompletedWithoutPublishing,
                format!(
                    "completed without publishing: read-only or nothing changed; its output ref is the input ref {}",
                    short(out)
                ),
            ),
            (Some(out), Some(c)) if out == c => Verdict::new(
                VerdictKind::PublishedAndReported,
                format!(
                    "published and reported: {} on {branch}, its confirm commit and output ref",
                    short(c)
                ),
            )
            .naming(c),
            (Some(out), _) => {
                let words = match &f.reported_publication_of {
                    Some(n) => format!(
                        "published and reported: its workspace was already on {branch} as {}, the publication of attempt {n}, which it reported as its output ref",
                        short(out)
                    ),
                    None => format!(
                        "published and reported: Conductor has {} as its output ref, but no confirm commit of it is on {branch}{}",
                        short(out),
                        search_gap(search)
                    ),
                };
                Verdict::new(VerdictKind::PublishedAndReported, words).naming(out)
            }
            (None, _) => Verdict::new(
                VerdictKind::CompletedWithoutPublishing,
                "completed without publishing: Conductor has no workspace ref as its output".into(),
            ),
        };
    }

    // Over without completing.
    let last = next.is_none();
    if let Some(c) = confirm {
        let after = match (&f.superseded_by, next) {
            (Some((by, retry)), _) => format!(
                "retry {retry} superseded it with {} (perago.supersedes)",
                short(by)
            ),
            (None, Some(n)) if n.output_ref.as_deref() == Some(c) => format!(
                "{} completed on it: its workspace was already there",
                next_name.clone().unwrap_or_default()
            ),
            (None, Some(n)) if n.status.is_running() => format!(
                "{} is {}: its publish fence will find this commit and publish on top of it",
                next_name.clone().unwrap_or_default(),
                n.status
            ),
            (None, Some(n)) => format!(
                "{} ({}) did not supersede it",
                next_name.clone().unwrap_or_default(),
                n.status
            ),
            (None, None) => format!(
                "no later attempt of this step exists, so it stands on {branch} without a reported result (docs/operations.md, section A merge timed out)"
            ),
        };
        let mut v = Verdict::new(
            VerdictKind::PublishedNotReported,
            format!(
                "published but not reported: {} landed on {branch}, but Conductor has the attempt {}; {after}",
                short(c),
                a.status
            ),
        )
        .naming(c);
        v.superseded_by = f.superseded_by.as_ref().map(|(id, _)| id.clone());
        v.needs_attention = last;
        return v;
    }

    if let Some(outcome) = MergeOutcome::of_reason(&a.reason).filter(|o| o.may_have_landed()) {
        let cause = a
            .reason
            .split_once(": ")
            .map_or(a.reason.as_str(), |(_, c)| c);
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
        let staging = match try_commit {
            Some(t) => format!("its staging commit is {}", short(t)),
            None => "its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit)".into(),
        };
        let settles = match next {
            Some(n) => match n.search.as_ref().and_then(|s| s.confirm.as_deref()) {
                Some(c2) => {
                    let on = n
                        .facts
                        .confirm_base
                        .as_ref()
                        .map(|(expected, supersedes)| {
                            if supersedes.is_empty() {
                                format!(
                                    "on {} superseding nothing, so this merge had not landed when it looked",
                                    short(expected)
                                )
                            } else {
                                format!("on top of {}", short(supersedes))
                            }
                        })
                        .unwrap_or_default();
                    format!(
                        "the next attempt's publish fence: {} published {} {on}; run explain again to see whether this merge landed since",
                        next_name.clone().unwrap_or_default(),
                        short(c2)
                    )
                }
                None if n.status.is_running() => format!(
                    "the next attempt's publish fence, when {} reaches it, or running explain again",
                    next_name.clone().unwrap_or_default()
                ),
                None => format!(
                    "{} ended {} without publishing; run explain again",
                    next_name.clone().unwrap_or_default(),
                    n.status
                ),
            },
            None => "no later attempt will run its publish fence: run explain again (a confirm commit of this task on the branch means the merge landed) and see docs/operations.md, section A merge timed out".into(),
        };
        let mut v = Verdict::new(
            VerdictKind::OutcomeUncertain,
            format!(
                "outcome uncertain: {ended} ({}) and no confirm commit of it is on {branch}{}; {staging}; {lands}. What settles it: {settles}",
                cell(cause, 120),
                search_gap(search)
            ),
        );
        v.commit = try_commit.map(str::to_owned);
        v.needs_attention = last;
        return v;
    }

    if let Some(r) = refusal(&a.reason, branch, &a.task_id) {
        let name = match r.fence {
            FenceKind::Publish => "the publish fence",
            FenceKind::Hard => "the hard fence",
            FenceKind::Attempt => "the attempt fence",
        };
        let mut v = Verdict::new(
            VerdictKind::RefusedByFence,
            format!("refused by {name}: {}; nothing was published", r.words),
        );
        v.fence = Some(r.fence);
        v.head = r.head;
        return v;
    }

    let mut words = if a.reason.is_empty() {
        format!(
            "not published: Conductor has it {} with no reason",
            a.status
        )
    } else {
        format!("not published: {}", a.reason)
    };
    if a.status == TaskStatus::FailedWithTerminalError {
        words.push_str(" (terminal: the body did not run and Conductor does not retry it)");
    }
    if let Some(s) = staged() {
        words.push_str(&format!("; it {s} and never merged"));
    }
    Verdict::new(VerdictKind::NotPublished, words)
}

/// Why "no confirm commit" may not be the last word.
fn search_gap(search: Option<&SearchView>) -> String {
    match search {
        Some(s) if s.bounded => format!(
            " (only the newest {SEARCH_LIMIT} commits were searched: the input ref is further down)"
        ),
        Some(s) if !s.reached_input_ref => {
            " (the input ref is no longer on the branch's first-parent history)".into()
        }
        Some(_) => String::new(),
        None => " (lakeFS could not be searched)".into(),
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
                .find_map(|a| match &a.workspace {
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
                .map(|a| {
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
            for a in &step.attempts {
                out.push_str(&format!(
                    "  attempt {}: {}\n",
                    a.attempt,
                    cell(&a.verdict.summary, 700)
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
                if !a.reason.is_empty() && a.verdict.kind != VerdictKind::NotPublished {
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

    #[test]
    fn refusals_name_their_fence_and_the_head_they_saw() {
        let r = refusal("main advanced from A1 to H1", "main", "t").unwrap();
        assert_eq!(
            (r.fence, r.head.as_deref()),
            (FenceKind::Publish, Some("H1"))
        );
        let r = refusal(
            "main cannot complete no-op from input ref A1; current head is H2",
            "main",
            "t",
        )
        .unwrap();
        assert_eq!(
            (r.fence, r.head.as_deref()),
            (FenceKind::Publish, Some("H2"))
        );
        let r = refusal(
            "main no longer contains workspace input ref A1",
            "main",
            "t",
        )
        .unwrap();
        assert_eq!((r.fence, r.head), (FenceKind::Publish, None));
        assert!(r.words.contains("no longer contains"));
        let r = refusal(
            "main advanced beyond supported publish range (1024 commits)",
            "main",
            "t",
        )
        .unwrap();
        assert_eq!(r.fence, FenceKind::Publish);
        let hard = "lakeFS merge on r@main failed: HTTP 412 Precondition Failed: update branch main: pre-merge hook aborted, run id 'x': 1 error occurred:\n\t* hook run id '0000_0000' failed on action 'perago-hard-fence' hook 'perago_expected_head': action failed: runtime error: [string \"lua\"]:5: perago hard fence: main is at H3, expected E3\nstack traceback:";
        let r = refusal(hard, "main", "t").unwrap();
        assert_eq!((r.fence, r.head.as_deref()), (FenceKind::Hard, Some("H3")));
        assert!(r.words.contains("E3"), "{}", r.words);
        assert_eq!(
            MergeOutcome::of_reason(hard),
            Some(MergeOutcome::NotApplied)
        );
        let r = refusal("t-1", "main", "t-1").unwrap();
        assert_eq!(r.fence, FenceKind::Attempt);
        let r = refusal(
            "broker failed to reload attempt t-1: Conductor get task failed: x",
            "main",
            "t-1",
        )
        .unwrap();
        assert_eq!(r.fence, FenceKind::Attempt);
        assert_eq!(refusal("task body exited with status 3", "main", "t"), None);
        assert_eq!(refusal("dev advanced from A to H", "main", "t"), None);
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
        }
    }

    /// Commit ids longer than the 12 characters people read.
    const INPUT: &str = "1npu7000000000000000";
    const C: &str = "c0nf1rm00000000000aa";
    const C2: &str = "c0nf1rm22222222222bb";
    const TRY: &str = "7ry0000000000000cccc";
    const OUT: &str = "0u7pu7000000000000dd";
    const STAGING: &str = "perago-staging-step-task-id-t-retry-0-e";

    fn attempt(retry: i64, status: TaskStatus) -> AttemptView {
        AttemptView {
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
            verdict: Verdict::new(VerdictKind::NotPublished, String::new()),
            facts: Facts {
                branch: "main".into(),
                input_ref: Some(INPUT.into()),
                ..Facts::default()
            },
        }
    }

    /// How each case is built: the attempt's own facts, set one by one.
    impl AttemptView {
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
            self.facts.confirm_base = Some((expected.into(), supersedes.into()));
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
    const UNREADABLE_MERGE: &str = "lakeFS merge on r@main returned an unreadable answer: EOF";

    /// Every case `decide` tells apart, as (name, the attempt, the next one, the words).
    fn cases() -> Vec<(&'static str, AttemptView, Option<AttemptView>, &'static str)> {
        use TaskStatus::*;
        vec![
            (
                "running on a worker",
                attempt(0, InProgress).worker("w-1"),
                None,
                "still running (IN_PROGRESS on w-1)",
            ),
            (
                "scheduled, staged",
                attempt(0, Scheduled).staged(TRY),
                None,
                "still running (SCHEDULED); staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e, not merged yet",
            ),
            (
                "running, merged",
                attempt(0, InProgress).worker("w-1").staged(TRY).confirm(C, INPUT, ""),
                None,
                "still running (IN_PROGRESS on w-1); its merge already landed as c0nf1rm00000, not reported yet",
            ),
            (
                "completed on its input ref",
                attempt(0, Completed).output(INPUT),
                None,
                "completed without publishing: read-only or nothing changed; its output ref is the input ref 1npu70000000",
            ),
            (
                "published and reported",
                attempt(0, Completed).confirm(C, INPUT, "").output(C),
                None,
                "published and reported: c0nf1rm00000 on main, its confirm commit and output ref",
            ),
            (
                "reported an earlier publication",
                attempt(1, Completed).output(OUT).reports_publication_of("0"),
                None,
                "published and reported: its workspace was already on main as 0u7pu7000000, the publication of attempt 0, which it reported as its output ref",
            ),
            (
                "reported, no confirm commit",
                attempt(0, Completed).output(OUT),
                None,
                "published and reported: Conductor has 0u7pu7000000 as its output ref, but no confirm commit of it is on main",
            ),
            (
                "reported, no confirm commit in the newest searched",
                attempt(0, Completed).output(OUT).bounded(),
                None,
                "published and reported: Conductor has 0u7pu7000000 as its output ref, but no confirm commit of it is on main (only the newest 1000 commits were searched: the input ref is further down)",
            ),
            (
                "reported, the input ref gone",
                attempt(0, Completed).output(OUT).input_gone(),
                None,
                "published and reported: Conductor has 0u7pu7000000 as its output ref, but no confirm commit of it is on main (the input ref is no longer on the branch's first-parent history)",
            ),
            (
                "reported, lakeFS not searched",
                attempt(0, Completed).output(OUT).unsearched(),
                None,
                "published and reported: Conductor has 0u7pu7000000 as its output ref, but no confirm commit of it is on main (lakeFS could not be searched)",
            ),
            (
                "completed with no output",
                attempt(0, Completed),
                None,
                "completed without publishing: Conductor has no workspace ref as its output",
            ),
            (
                "unreported, superseded",
                attempt(0, TimedOut).confirm(C, INPUT, "").superseded(C2, "1"),
                Some(attempt(1, Completed).confirm(C2, C, C).output(C2)),
                "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 superseded it with c0nf1rm22222 (perago.supersedes)",
            ),
            (
                "unreported, the retry completed on it",
                attempt(0, TimedOut).confirm(C, INPUT, ""),
                Some(attempt(1, Completed).output(C)),
                "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 completed on it: its workspace was already there",
            ),
            (
                "unreported, the retry running",
                attempt(0, TimedOut).confirm(C, INPUT, ""),
                Some(attempt(1, InProgress)),
                "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 is IN_PROGRESS: its publish fence will find this commit and publish on top of it",
            ),
            (
                "unreported, the retry failed",
                attempt(0, Failed).confirm(C, INPUT, ""),
                Some(attempt(1, Failed).reason("x")),
                "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt FAILED; retry 1 (FAILED) did not supersede it",
            ),
            (
                "unreported, no retry",
                attempt(0, TimedOut).confirm(C, INPUT, ""),
                None,
                "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; no later attempt of this step exists, so it stands on main without a reported result (docs/operations.md, section A merge timed out)",
            ),
            (
                "uncertain, the retry published superseding nothing",
                attempt(0, Failed).reason(TIMED_OUT_MERGE).staged(TRY),
                Some(attempt(1, Completed).confirm(C2, INPUT, "").output(C2)),
                "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main; its staging commit is 7ry000000000; the merge may still land. What settles it: the next attempt's publish fence: retry 1 published c0nf1rm22222 on 1npu70000000 superseding nothing, so this merge had not landed when it looked; run explain again to see whether this merge landed since",
            ),
            (
                "uncertain, answered, the retry published on top of it",
                attempt(0, Failed).reason(UNREADABLE_MERGE),
                Some(attempt(1, Completed).confirm(C2, C, C).output(C2)),
                "outcome uncertain: lakeFS answered its merge with success but the answer could not be read (EOF) and no confirm commit of it is on main; its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge landed. What settles it: the next attempt's publish fence: retry 1 published c0nf1rm22222 on top of c0nf1rm00000; run explain again to see whether this merge landed since",
            ),
            (
                "uncertain, the retry running",
                attempt(0, Failed).reason(TIMED_OUT_MERGE).bounded(),
                Some(attempt(1, Scheduled)),
                "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main (only the newest 1000 commits were searched: the input ref is further down); its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: the next attempt's publish fence, when retry 1 reaches it, or running explain again",
            ),
            (
                "uncertain, the retry failed",
                attempt(0, Failed).reason(TIMED_OUT_MERGE).unsearched(),
                Some(attempt(1, Canceled)),
                "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main (lakeFS could not be searched); its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: retry 1 ended CANCELED without publishing; run explain again",
            ),
            (
                "uncertain, no retry",
                attempt(0, Failed).reason(TIMED_OUT_MERGE),
                None,
                "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main; its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: no later attempt will run its publish fence: run explain again (a confirm commit of this task on the branch means the merge landed) and see docs/operations.md, section A merge timed out",
            ),
            (
                "refused by the publish fence",
                attempt(0, Failed).reason(&format!("main advanced from {INPUT} to {C2}")),
                None,
                "refused by the publish fence: main had moved from the input ref 1npu70000000 to c0nf1rm22222, which is not this step's publication; nothing was published",
            ),
            (
                "refused by the hard fence",
                attempt(0, Failed).reason(&format!("lakeFS merge on r@main failed: HTTP 412 Precondition Failed: perago hard fence: main is at {C2}, expected {INPUT}")),
                None,
                "refused by the hard fence: lakeFS's pre-merge hook found main at c0nf1rm22222 while the publication expected 1npu70000000; nothing was published",
            ),
            (
                "refused by the attempt fence",
                attempt(0, Failed).reason("t-0"),
                None,
                "refused by the attempt fence: Conductor no longer had it as the current attempt when it was about to publish; nothing was published",
            ),
            (
                "not published, staged",
                attempt(0, Failed).reason("task body exited with status 3").staged(TRY),
                None,
                "not published: task body exited with status 3; it staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e and never merged",
            ),
            (
                "not published, no reason",
                attempt(0, Canceled),
                None,
                "not published: Conductor has it CANCELED with no reason",
            ),
            (
                "not published, a merge lakeFS refused",
                attempt(0, Failed).reason("lakeFS merge on r@main failed: HTTP 409 Conflict: conflict"),
                Some(attempt(1, Completed)),
                "not published: lakeFS merge on r@main failed: HTTP 409 Conflict: conflict",
            ),
            (
                "terminal",
                attempt(0, FailedWithTerminalError).reason("pre guardrail failed"),
                None,
                "not published: pre guardrail failed (terminal: the body did not run and Conductor does not retry it)",
            ),
            (
                "terminal, no reason",
                attempt(0, FailedWithTerminalError).staged(TRY),
                None,
                "not published: Conductor has it FAILED_WITH_TERMINAL_ERROR with no reason (terminal: the body did not run and Conductor does not retry it); it staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e and never merged",
            ),
        ]
    }

    /// A step whose attempts are given their verdicts as `run` does.
    fn step(name: &str, mut attempts: Vec<AttemptView>) -> StepView {
        for i in 0..attempts.len() {
            let (done, rest) = attempts.split_at_mut(i + 1);
            done[i].verdict = decide(&done[i], rest.first());
        }
        StepView {
            step: name.into(),
            task_type: "kx.task".into(),
            attempts,
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
    fn every_case_keeps_its_words() {
        for (name, a, next, words) in cases() {
            assert_eq!(decide(&a, next.as_ref()).summary, words, "{name}");
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
        for (name, a, next, _) in cases() {
            let mut shown = serde_json::to_value(decide(&a, next.as_ref())).unwrap();
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
            assert_eq!(decide(&refused, None).summary, words, "{reason}");
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
