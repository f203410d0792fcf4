//! The staging branch of an attempt. Its name says which attempt made it, so that the next
//! attempt of the same step, the janitor and `kubectl perago explain` can tell whose it is
//! without reading it:
//!
//! `perago-staging-<workflow>-<step>-seq-<seq>-iteration-<i>-task-id-<task>-retry-<n>-exec-<execution>`
//!
//! Each text is one segment: `[A-Za-z0-9_-]` kept, other runs become `-`, `-`/`_` trimmed, and
//! a segment longer than 48 characters is cut and keeps a hash of the whole, so names stay
//! unique and within lakeFS's limits. The workflow and step segments cannot be told apart
//! again (either may hold `-`), so a parsed name keeps them together; the task and execution
//! segments are read from the right, where Conductor's task ids and the sidecar's execution
//! ids (neither holds a marker such as `-retry-`) stand.

use std::fmt;

use sha2::{Digest, Sha256};

use perago_contract::text::sanitized;

use crate::attempt::AttemptSnapshot;

/// How every staging branch's name starts.
pub const PREFIX: &str = "perago-staging-";

/// Longest segment kept whole.
const SEGMENT_MAX: usize = 48;

/// One attempt's staging branch, segment by segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagingBranch {
    /// `<workflow>-<step>`: the workflow instance's and the reference task name's segments.
    pub step: String,
    pub seq: i64,
    pub iteration: i64,
    /// The Conductor task id's segment.
    pub task: String,
    pub retry_count: i64,
    /// The sidecar execution's segment.
    pub execution: String,
}

impl StagingBranch {
    /// The staging branch of attempt `a` in execution `execution_id`.
    pub fn of(a: &AttemptSnapshot, execution_id: &str) -> Self {
        Self {
            step: step(a),
            seq: a.seq,
            iteration: a.iteration,
            task: segment(&a.task_id),
            retry_count: a.retry_count,
            execution: segment(execution_id),
        }
    }

    /// The staging branch a name stands for; `None` for any other name.
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix(PREFIX)?;
        // The rightmost `-exec-` that a retry count precedes (matches may overlap, as in
        // `-exec-exec-1`).
        const EXEC: &str = "-exec-";
        let (left, execution, retry_count) = (0..rest.len())
            .rev()
            .filter(|&at| rest.get(at..).is_some_and(|tail| tail.starts_with(EXEC)))
            .find_map(|at| {
                let (left, retry) = rest[..at].rsplit_once("-retry-")?;
                Some((left, &rest[at + EXEC.len()..], retry.parse().ok()?))
            })?;
        let (left, task) = left.rsplit_once("-task-id-")?;
        let (left, iteration) = left.rsplit_once("-iteration-")?;
        let (step, seq) = left.rsplit_once("-seq-")?;
        let named = |s: &str| !s.is_empty();
        if !(named(step) && named(task) && named(execution)) {
            return None;
        }
        Some(Self {
            step: step.to_owned(),
            seq: seq.parse().ok()?,
            iteration: iteration.parse().ok()?,
            task: task.to_owned(),
            retry_count,
            execution: execution.to_owned(),
        })
    }

    /// Whether this branch belongs to an attempt of `a`'s workflow step (any retry, any
    /// execution). A step whose reference name extends this one's (`build` and `build-seq`)
    /// does not match.
    pub fn is_of_step(&self, a: &AttemptSnapshot) -> bool {
        self.step == step(a) && self.iteration == a.iteration
    }
}

impl fmt::Display for StagingBranch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}-seq-{}-iteration-{}-task-id-{}-retry-{}-exec-{}",
            self.step, self.seq, self.iteration, self.task, self.retry_count, self.execution
        )
    }
}

/// How every staging branch of `a`'s workflow step starts, whatever the attempt: the listing
/// prefix of a sweep (followed by [`StagingBranch::is_of_step`]).
pub fn step_prefix(a: &AttemptSnapshot) -> String {
    format!("{PREFIX}{}-seq-", step(a))
}

/// Whether `name` is the staging branch of an attempt of `a`'s workflow step.
pub fn is_step_branch(name: &str, a: &AttemptSnapshot) -> bool {
    StagingBranch::parse(name).is_some_and(|b| b.is_of_step(a))
}

fn step(a: &AttemptSnapshot) -> String {
    format!(
        "{}-{}",
        segment(&a.workflow_instance_id),
        segment(&a.reference_task_name)
    )
}

/// One text as a name segment (see the module's documentation).
fn segment(text: &str) -> String {
    let keep = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let segment = sanitized(text, keep, '-', ['-', '_']).unwrap_or_else(|| "unknown".to_owned());
    if segment.len() <= SEGMENT_MAX {
        return segment;
    }
    let digest = Sha256::digest(text.as_bytes());
    let short: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}-{short}", &segment[..SEGMENT_MAX - 9])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn attempt(task_id: &str) -> AttemptSnapshot {
        AttemptSnapshot::from_task(&json!({
            "workflowInstanceId": "wf-7f3d", "taskId": task_id, "retryCount": 3, "taskDefName": "features.build",
            "referenceTaskName": "build", "seq": 2, "status": "IN_PROGRESS", "inputData": {}
        }))
        .unwrap()
    }

    #[test]
    fn names_follow_the_reference_and_stay_bounded() {
        let branch = StagingBranch::of(&attempt("task/9b4c"), "exec-1");
        assert_eq!(
            branch.to_string(),
            "perago-staging-wf-7f3d-build-seq-2-iteration-0-task-id-task-9b4c-retry-3-exec-exec-1"
        );
        assert_eq!(StagingBranch::parse(&branch.to_string()), Some(branch));
        assert_eq!(segment("///"), "unknown");
        assert_eq!(segment("___"), "unknown");
        assert_eq!(segment("exec/42"), "exec-42");
        let name = StagingBranch::of(&attempt("t"), "e").to_string();
        assert!(name.starts_with(&step_prefix(&attempt("other"))));
        assert!(is_step_branch(&name, &attempt("other")));
        let long = "x".repeat(300);
        let a = segment(&long);
        let b = segment(&format!("{long}y"));
        assert_eq!(a.len(), SEGMENT_MAX);
        assert_ne!(a, b, "cut segments keep a hash of the whole");
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        );
    }

    #[test]
    fn the_task_id_is_read_from_the_name() {
        let name = "perago-staging-wf-1-step-seq-1-iteration-0-task-id-5f0c-aa-retry-2-exec-e1";
        let parsed = StagingBranch::parse(name).unwrap();
        assert_eq!((parsed.task.as_str(), parsed.retry_count), ("5f0c-aa", 2));
        assert_eq!(parsed.step, "wf-1-step");
        for other in [
            "perago-staging-x",
            "main",
            "perago-staging-wf-step-seq-1-iteration-0-task-id-5f0c-retry-x-exec-e",
            "perago-staging-wf-step-seq-1-iteration-0-task-id--retry-2-exec-e",
            "perago-staging-wf-step-seq-1-iteration-0-task-id-5f0c-retry-2-exec-",
        ] {
            assert_eq!(StagingBranch::parse(other), None, "{other}");
        }
    }

    #[test]
    fn a_sweep_matches_only_its_steps_branches() {
        let a = attempt("t1");
        let other_step = |reference: &str, iteration: u32| {
            AttemptSnapshot::from_task(&json!({
                "workflowInstanceId": "wf-7f3d", "taskId": "x", "retryCount": 0, "taskDefName": "features.build",
                "referenceTaskName": reference, "seq": 9, "iteration": iteration, "status": "IN_PROGRESS", "inputData": {}
            }))
            .unwrap()
        };
        let name = |a: &AttemptSnapshot, e: &str| StagingBranch::of(a, e).to_string();
        for (name, ours) in [
            (name(&attempt("t0"), "e0"), true),
            (name(&other_step("build", 0), "e1"), true),
            (name(&other_step("build-seq", 0), "e2"), false),
            (name(&other_step("build", 1), "e3"), false),
            (name(&other_step("build2", 0), "e4"), false),
            ("perago-staging-wf-7f3d-build-seq-x".to_owned(), false),
        ] {
            assert_eq!(is_step_branch(&name, &a), ours, "{name}");
        }
    }

    proptest! {
        /// Name from an attempt, attempt from the name: workflow ids and step names of any
        /// text; task ids as Conductor makes them (hexadecimal and `-`), execution ids as the
        /// sidecar does (letters and digits).
        #[test]
        fn a_name_parses_back_to_its_branch(
            workflow in ".{0,80}",
            reference in ".{0,80}",
            task in "[0-9a-f-]{1,60}",
            execution in "[0-9a-z]{1,40}",
            seq in any::<i64>(),
            iteration in any::<i64>(),
            retry in any::<i64>(),
        ) {
            let a = AttemptSnapshot::from_task(&json!({
                "workflowInstanceId": workflow, "taskId": task, "retryCount": retry,
                "taskDefName": "t", "referenceTaskName": reference, "seq": seq,
                "iteration": iteration, "status": "IN_PROGRESS", "inputData": {}
            }))
            .unwrap();
            let branch = StagingBranch::of(&a, &execution);
            let name = branch.to_string();
            prop_assert!(name.starts_with(&step_prefix(&a)));
            prop_assert!(is_step_branch(&name, &a));
            prop_assert_eq!(StagingBranch::parse(&name), Some(branch));
        }
    }
}
