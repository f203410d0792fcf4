//! `kubectl perago`: a task's status, suspend and resume, its logs and support bundle, and the
//! recovery steps of docs/design.md as commands. `status` shows a PeragoTask on one screen;
//! `suspend` and `resume` set its `spec.suspend`; `rollout` shows and orders its canary rollout; `logs` prints an attempt's or a task's
//! lines; `report` writes a redacted support bundle; `history` classifies a branch's
//! first-parent history with the same rules as the publish fence; `explain` says what became
//! of each attempt of a workflow's workspace steps; `gc` removes the staging branches of
//! attempts that can no longer publish; `install-fence` commits the hard fence on a branch.
//! Each command builds a view first and prints it as a table, JSON or YAML; nothing is changed
//! before every lookup has succeeded.

pub mod cluster;
pub mod connect;
pub mod duration;
pub mod explain;
pub mod fence;
pub mod gc;
pub mod history;
pub mod logs;
pub mod output;
pub mod redact;
pub mod report;
pub mod rollout;
pub mod status;
pub mod suspend;

/// How a command ended, as its exit status: 0 nothing to report, 1 something was flagged or
/// failed (the message says what), 2 the command line was wrong.
#[derive(Debug)]
pub enum Failure {
    /// Problems were found and printed with the view.
    Flagged,
    /// A call failed or an input was refused: one line naming what failed.
    Error(anyhow::Error),
    /// The command line cannot be used.
    Usage(String),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Self::Error(e)
    }
}
