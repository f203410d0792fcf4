//! Why an attempt did not complete: one variant per row of the failure table
//! (docs/design.md#failures).
//!
//! `Display` is the reason Conductor receives (the reference's texts, byte for byte);
//! [`AttemptError::terminal`] is the one place that chooses FAILED_WITH_TERMINAL_ERROR over
//! FAILED; [`AttemptError::label`] names the row in `perago_sidecar_attempt_failures_total`.
//! The fences' refusals and the merge's outcome are `perago_workspace::refusal` and
//! `perago_lakefs::MergeOutcome`, which `kubectl perago explain` reads back from the reason.

use std::path::{Path, PathBuf};

use thiserror::Error;

use perago_contract::text::clip_path;
use perago_lakefs::{LakeFsError, MergeOutcome};
use perago_workspace::attempt::SnapshotError;
use perago_workspace::refusal::FenceRefusal;

use crate::input::InputError;
use crate::outcome::Outcome;
use crate::workspace::download::DownloadError;
use crate::workspace::guardrails::GuardrailError;
use crate::workspace::publish::{FenceError, StageError};

/// A file or directory of the attempt that could not be made, written, read or removed.
#[derive(Debug, Error)]
#[error("{action} {} failed: {cause}", clip_path(.path))]
pub struct FileError {
    pub action: &'static str,
    pub path: PathBuf,
    pub cause: std::io::Error,
}

impl FileError {
    pub fn new(action: &'static str, path: &Path, cause: std::io::Error) -> Self {
        Self {
            action,
            path: path.to_owned(),
            cause,
        }
    }
}

/// What went wrong on the pod's own disk, in the execution directory or the workspace.
#[derive(Debug, Error)]
pub enum LocalError {
    #[error("preparing the execution directory failed: {0}")]
    ExecutionDirectory(FileError),
    /// Creating, writing or reading one file or directory.
    #[error(transparent)]
    File(#[from] FileError),
    #[error("serialising params failed: {0}")]
    Params(serde_json::Error),
    #[error("reading the workspace failed: {0}")]
    Workspace(std::io::Error),
    /// A task on the blocking pool ended without an answer (a panic, or the runtime stopping).
    #[error("{what} stopped: {cause}")]
    Stopped { what: &'static str, cause: String },
}

#[derive(Debug, Error)]
pub enum AttemptError {
    /// The polled task lacks a field the attempt needs.
    #[error(transparent)]
    Task(#[from] SnapshotError),
    /// Conductor handed out more tasks than the poll asked for.
    #[error("no executor slot is free for task {task_id}; the task-body runner is not connected")]
    NoSlot { task_id: String },
    /// Input validation: the top-level keys, the workspace object, the params.
    #[error(transparent)]
    Input(InputError),
    /// The execution directory, or a file the sidecar writes or reads in it.
    #[error(transparent)]
    Local(#[from] LocalError),
    /// Listing or fetching the input ref, or projecting it into the workspace.
    #[error(transparent)]
    Download(#[from] DownloadError),
    /// The input workspace breaks the task's pre guardrails: terminal.
    #[error(transparent)]
    PreGuardrail(GuardrailError),
    /// The body did not leave a result: it could not start, died, ran out of time, was given
    /// up, or left a result or an error document the sidecar cannot take.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// The body's own error document; `terminal` is its choice.
    #[error("{reason}")]
    Declared { reason: String, terminal: bool },
    #[error(transparent)]
    PostGuardrail(GuardrailError),
    /// The attempt fence: Conductor no longer shows this attempt as the current one, or the
    /// task could not be read again.
    #[error(transparent)]
    AttemptFence(FenceRefusal),
    /// The publish fence cannot explain the branch's history since the input ref, or found
    /// nothing to publish on a branch no longer at the input ref.
    #[error(transparent)]
    PublishFence(FenceError),
    /// Planning, creating the staging branch, uploading, deleting or committing the try.
    #[error(transparent)]
    Stage(#[from] StageError),
    /// The target head is no longer the base the fence chose ([`FenceRefusal::Advanced`]).
    #[error(transparent)]
    HeadMoved(FenceRefusal),
    /// Reading the target head before the merge failed.
    #[error(transparent)]
    HeadUnreadable(LakeFsError),
    /// The merge failed; [`AttemptError::merge_outcome`] says whether it may have landed.
    #[error(transparent)]
    Merge(LakeFsError),
}

/// Why the body left no result the sidecar can take: one variant per way it can end badly,
/// each its own `reason` label of the failures metric.
#[derive(Debug, Error)]
pub enum BodyError {
    #[error("task body could not be started: {0}")]
    NotStarted(String),
    /// The runner went away with the body (its container restarted, or it crashed).
    #[error("executor process for worker {worker} exited while running task {task_id}")]
    RunnerLost { worker: String, task_id: String },
    /// The runner was not connected again in time to take the assignment.
    #[error("executor pipe for worker {worker} is broken for task {task_id}")]
    PipeBroken { worker: String, task_id: String },
    #[error(
        "executor process for worker {worker} exited while running task {task_id}: the task body was killed by signal {signal}{}",
        signal_name(*.signal)
    )]
    Killed {
        worker: String,
        task_id: String,
        signal: i32,
    },
    #[error(
        "executor process for worker {worker} exited while running task {task_id}: the task body was killed by the out-of-memory killer: its container reached its memory limit"
    )]
    OutOfMemory { worker: String, task_id: String },
    /// The TaskDef's `timeoutSeconds` passed first.
    #[error("executor did not return result for task {task_id}")]
    TimedOut { task_id: String },
    /// The sidecar's shutdown grace ended first.
    #[error("the sidecar shut down before task {task_id} finished")]
    Abandoned { task_id: String },
    #[error("task body exited with status {code}")]
    Exited { code: i32 },
    #[error("task body exited with status 0 without writing a result to PERAGO_RESULT")]
    NoResult,
    #[error("task body wrote a result that is not JSON: {0}")]
    ResultNotJson(serde_json::Error),
    /// The result breaks the task's result schema.
    #[error(transparent)]
    ResultSchema(InputError),
    /// An error document the sidecar cannot take, and why.
    #[error("{0}")]
    ErrorDocument(String),
}

/// " (SIGKILL)" for a signal this platform names.
fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|name| format!(" ({name})"))
        .unwrap_or_default()
}

impl BodyError {
    /// The `reason` label of the failures metric.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotStarted(_) => "body_not_started",
            Self::RunnerLost { .. } | Self::PipeBroken { .. } => "body_runner_lost",
            Self::Killed { .. } => "body_killed",
            Self::OutOfMemory { .. } => "body_out_of_memory",
            Self::TimedOut { .. } => "body_timed_out",
            Self::Abandoned { .. } => "body_abandoned",
            Self::Exited { .. } => "body_exited",
            Self::NoResult => "result_missing",
            Self::ResultNotJson(_) => "result_not_json",
            Self::ResultSchema(_) => "result_schema",
            Self::ErrorDocument(_) => "error_document",
        }
    }
}

/// What a canary's analysis makes of a finished attempt (`spec.rollout.analysis`, ADR 0044).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Completed,
    /// Failed because of the body: the code in the pod is to blame.
    BodyFailed,
    /// Failed for a reason that is not the body's (a fence, a lost lease or shutdown, lakeFS,
    /// the input): says nothing of the code.
    NotJudged,
}

impl Verdict {
    /// The `verdict` label of `perago_sidecar_attempt_verdicts_total`, in `/slots`' order.
    pub const LABELS: [&'static str; 3] = ["completed", "body_failed", "not_judged"];

    pub fn label(self) -> &'static str {
        match self {
            Self::Completed => Self::LABELS[0],
            Self::BodyFailed => Self::LABELS[1],
            Self::NotJudged => Self::LABELS[2],
        }
    }
}

impl AttemptError {
    /// Whether the body is to blame: it could not start, died, was killed, ran out of memory
    /// or time, left no result or one the result schema or the post guardrails refuse, or
    /// declared an error. A body given up at shutdown is not to blame.
    pub fn verdict(&self) -> Verdict {
        match self {
            Self::Body(BodyError::Abandoned { .. }) => Verdict::NotJudged,
            Self::Body(_) | Self::Declared { .. } | Self::PostGuardrail(_) => Verdict::BodyFailed,
            Self::Task(_)
            | Self::NoSlot { .. }
            | Self::Input(_)
            | Self::Local(_)
            | Self::Download(_)
            | Self::PreGuardrail(_)
            | Self::AttemptFence(_)
            | Self::PublishFence(_)
            | Self::Stage(_)
            | Self::HeadMoved(_)
            | Self::HeadUnreadable(_)
            | Self::Merge(_) => Verdict::NotJudged,
        }
    }

    /// FAILED_WITH_TERMINAL_ERROR: a pre-guardrail violation, or a body that says so.
    pub fn terminal(&self) -> bool {
        matches!(
            self,
            Self::PreGuardrail(_) | Self::Declared { terminal: true, .. }
        )
    }

    /// What a failed merge did to the target; `None` for any other failure.
    pub fn merge_outcome(&self) -> Option<MergeOutcome> {
        match self {
            Self::Merge(e) => Some(e.merge_outcome()),
            _ => None,
        }
    }

    /// The failure table's row, as the `reason` label of the failures metric.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Task(_) => "task",
            Self::NoSlot { .. } => "no_slot",
            Self::Input(_) => "input",
            Self::Local(_) => "local",
            Self::Download(_) => "download",
            Self::PreGuardrail(_) => "pre_guardrail",
            Self::Body(e) => e.label(),
            Self::Declared { .. } => "body_error",
            Self::PostGuardrail(_) => "post_guardrail",
            Self::AttemptFence(_) => "attempt_fence",
            Self::PublishFence(_) => "publish_fence",
            Self::Stage(_) => "stage",
            Self::HeadMoved(_) | Self::HeadUnreadable(_) => "head_check",
            Self::Merge(e) => match e.merge_outcome() {
                MergeOutcome::NotApplied => "merge",
                MergeOutcome::Unknown => "merge_uncertain",
                MergeOutcome::Applied => "merge_unreadable",
            },
        }
    }

    /// Every `reason` label [`AttemptError::label`] gives, for the metric's help text.
    pub const LABELS: &'static [&'static str] = &[
        "task",
        "no_slot",
        "input",
        "local",
        "download",
        "pre_guardrail",
        "body_not_started",
        "body_runner_lost",
        "body_killed",
        "body_out_of_memory",
        "body_timed_out",
        "body_abandoned",
        "body_exited",
        "result_missing",
        "result_not_json",
        "result_schema",
        "error_document",
        "body_error",
        "post_guardrail",
        "attempt_fence",
        "publish_fence",
        "stage",
        "head_check",
        "merge",
        "merge_uncertain",
        "merge_unreadable",
    ];
}

impl From<AttemptError> for Outcome {
    fn from(error: AttemptError) -> Self {
        let terminal = error.terminal();
        let reason = match error {
            AttemptError::Declared { reason, .. } => reason,
            other => other.to_string(),
        };
        if terminal {
            Outcome::Terminal(reason)
        } else {
            Outcome::Failed(reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::guardrails::Violation;
    use perago_contract::spec::GuardrailKind;

    fn violation(phase: &'static str) -> GuardrailError {
        GuardrailError::Violated {
            phase,
            kind: GuardrailKind::RequireFile,
            path: "a".into(),
            violation: Violation::NoFile,
        }
    }

    #[test]
    fn only_pre_guardrails_and_declared_terminal_errors_are_terminal() {
        let terminal = |e: AttemptError| Outcome::from(e).status();
        assert_eq!(
            terminal(AttemptError::PreGuardrail(violation("pre"))),
            "FAILED_WITH_TERMINAL_ERROR"
        );
        assert_eq!(
            terminal(AttemptError::Declared {
                reason: "no".into(),
                terminal: true
            }),
            "FAILED_WITH_TERMINAL_ERROR"
        );
        for e in [
            AttemptError::PostGuardrail(violation("post")),
            AttemptError::Input(InputError::Keys("bad")),
            AttemptError::Declared {
                reason: "no".into(),
                terminal: false,
            },
            AttemptError::AttemptFence(FenceRefusal::NotCurrent {
                task_id: "t".into(),
            }),
        ] {
            assert_eq!(terminal(e), "FAILED");
        }
    }

    #[test]
    fn a_canary_is_judged_by_its_body_failures_only() {
        let verdict = |e: AttemptError| e.verdict();
        for e in [
            AttemptError::Body(BodyError::Exited { code: 1 }),
            AttemptError::Body(BodyError::NoResult),
            AttemptError::PostGuardrail(violation("post")),
            AttemptError::Declared {
                reason: "no".into(),
                terminal: false,
            },
        ] {
            assert_eq!(verdict(e), Verdict::BodyFailed);
        }
        for e in [
            AttemptError::Body(BodyError::Abandoned {
                task_id: "t".into(),
            }),
            AttemptError::AttemptFence(FenceRefusal::NotCurrent {
                task_id: "t".into(),
            }),
            AttemptError::Input(InputError::Keys("bad")),
            AttemptError::PreGuardrail(violation("pre")),
        ] {
            assert_eq!(verdict(e), Verdict::NotJudged);
        }
    }

    #[test]
    fn reasons_are_the_reference_texts() {
        let reason = |e: AttemptError| Outcome::from(e).reason().unwrap_or("").to_owned();
        assert_eq!(
            reason(AttemptError::AttemptFence(FenceRefusal::NotCurrent {
                task_id: "9b4c".into()
            })),
            "9b4c"
        );
        assert_eq!(
            reason(AttemptError::HeadMoved(FenceRefusal::Advanced {
                branch: "main".into(),
                input: "a1".into(),
                head: "b2".into()
            })),
            "main advanced from a1 to b2"
        );
        assert_eq!(
            reason(AttemptError::PublishFence(FenceError::Refused(
                FenceRefusal::NoOpMoved {
                    branch: "main".into(),
                    input: "a1".into(),
                    head: "b2".into()
                }
            ))),
            "main cannot complete no-op from input ref a1; current head is b2"
        );
        assert_eq!(
            AttemptError::NoSlot {
                task_id: "t".into()
            }
            .label(),
            "no_slot"
        );
    }

    #[test]
    fn each_body_failure_has_its_own_label_and_the_reference_text() {
        let worker = || "w-1".to_owned();
        let task_id = || "9b4c".to_owned();
        let cases = [
            (
                BodyError::Killed {
                    worker: worker(),
                    task_id: task_id(),
                    signal: 9,
                },
                "body_killed",
                "executor process for worker w-1 exited while running task 9b4c: the task body was killed by signal 9 (SIGKILL)",
            ),
            (
                BodyError::OutOfMemory {
                    worker: worker(),
                    task_id: task_id(),
                },
                "body_out_of_memory",
                "executor process for worker w-1 exited while running task 9b4c: the task body was killed by the out-of-memory killer: its container reached its memory limit",
            ),
            (
                BodyError::TimedOut { task_id: task_id() },
                "body_timed_out",
                "executor did not return result for task 9b4c",
            ),
            (
                BodyError::Exited { code: 3 },
                "body_exited",
                "task body exited with status 3",
            ),
            (
                BodyError::NoResult,
                "result_missing",
                "task body exited with status 0 without writing a result to PERAGO_RESULT",
            ),
        ];
        for (error, label, reason) in cases {
            let error = AttemptError::from(error);
            assert_eq!(error.label(), label);
            assert!(AttemptError::LABELS.contains(&label));
            assert_eq!(error.to_string(), reason);
        }
        let signal = BodyError::Killed {
            worker: worker(),
            task_id: task_id(),
            signal: 1000,
        };
        assert!(
            signal.to_string().ends_with("killed by signal 1000"),
            "{signal}"
        );
    }
}
