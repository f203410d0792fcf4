//! Why an attempt did not complete: one variant per row of the failure table
//! (docs/design.md#failures).
//!
//! `Display` is the reason Conductor receives (the reference's texts, byte for byte);
//! [`AttemptError::terminal`] is the one place that chooses FAILED_WITH_TERMINAL_ERROR over
//! FAILED; [`AttemptError::label`] names the row in `perago_sidecar_attempt_failures_total`.

use std::path::{Path, PathBuf};

use thiserror::Error;

use perago_contract::text::clip_path;
use perago_lakefs::LakeFsError;
use perago_workspace::attempt::SnapshotError;

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
    #[error("{0}")]
    Local(String),
    /// Listing or fetching the input ref, or projecting it into the workspace.
    #[error(transparent)]
    Download(#[from] DownloadError),
    /// The input workspace breaks the task's pre guardrails: terminal.
    #[error(transparent)]
    PreGuardrail(GuardrailError),
    /// The body could not start, died, ran out of time, was given up, or exited without a
    /// result.
    #[error("{0}")]
    Body(String),
    /// The body's own error document; `terminal` is its choice.
    #[error("{reason}")]
    Declared { reason: String, terminal: bool },
    /// The body's result breaks the result schema.
    #[error(transparent)]
    Result(InputError),
    #[error("task body wrote a result that is not JSON: {0}")]
    ResultNotJson(serde_json::Error),
    #[error(transparent)]
    PostGuardrail(GuardrailError),
    /// The attempt fence: Conductor no longer shows this attempt as the current one. The
    /// reason is the task id alone, as in the reference.
    #[error("{task_id}")]
    Stale { task_id: String },
    /// The attempt fence could not read the task again.
    #[error("broker failed to reload attempt {task_id}: {cause}")]
    FenceUnreadable { task_id: String, cause: String },
    /// The publish fence cannot explain the branch's history since the input ref.
    #[error(transparent)]
    PublishFence(FenceError),
    /// Nothing to publish, and the branch is no longer at the input ref.
    #[error("{branch} cannot complete no-op from input ref {input}; current head is {head}")]
    NoOpMoved {
        branch: String,
        input: String,
        head: String,
    },
    /// Planning, creating the staging branch, uploading, deleting or committing the try.
    #[error(transparent)]
    Stage(#[from] StageError),
    /// The target head is no longer the base the fence chose.
    #[error("{branch} advanced from {input} to {head}")]
    HeadMoved {
        branch: String,
        input: String,
        head: String,
    },
    /// Reading the target head before the merge failed.
    #[error(transparent)]
    HeadUnreadable(LakeFsError),
    /// The merge failed; [`AttemptError::merge_uncertain`] says whether it may have landed.
    #[error(transparent)]
    Merge(LakeFsError),
}

impl AttemptError {
    /// FAILED_WITH_TERMINAL_ERROR: a pre-guardrail violation, or a body that says so.
    pub fn terminal(&self) -> bool {
        matches!(
            self,
            Self::PreGuardrail(_) | Self::Declared { terminal: true, .. }
        )
    }

    /// The merge may have landed: only the next attempt's publish fence can tell.
    pub fn merge_uncertain(&self) -> bool {
        matches!(self, Self::Merge(e) if e.outcome_uncertain())
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
            Self::Body(_) => "body",
            Self::Declared { .. } => "body_error",
            Self::Result(_) | Self::ResultNotJson(_) => "result",
            Self::PostGuardrail(_) => "post_guardrail",
            Self::Stale { .. } | Self::FenceUnreadable { .. } => "attempt_fence",
            Self::PublishFence(_) | Self::NoOpMoved { .. } => "publish_fence",
            Self::Stage(_) => "stage",
            Self::HeadMoved { .. } | Self::HeadUnreadable(_) => "head_check",
            Self::Merge(_) if self.merge_uncertain() => "merge_uncertain",
            Self::Merge(_) => "merge",
        }
    }
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
            AttemptError::Stale {
                task_id: "t".into(),
            },
        ] {
            assert_eq!(terminal(e), "FAILED");
        }
    }

    #[test]
    fn reasons_are_the_reference_texts() {
        let reason = |e: AttemptError| Outcome::from(e).reason().unwrap_or("").to_owned();
        assert_eq!(
            reason(AttemptError::Stale {
                task_id: "9b4c".into()
            }),
            "9b4c"
        );
        assert_eq!(
            reason(AttemptError::HeadMoved {
                branch: "main".into(),
                input: "a1".into(),
                head: "b2".into()
            }),
            "main advanced from a1 to b2"
        );
        assert_eq!(
            reason(AttemptError::NoOpMoved {
                branch: "main".into(),
                input: "a1".into(),
                head: "b2".into()
            }),
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
}
