//! Why a fence refused an attempt, as the failure reason Conductor keeps for it
//! (docs/design.md#failures). The sidecar formats the attempt fence's and the publish fence's
//! refusals from these types; the hard fence's refusal is formatted by its pre-merge hook
//! (deploy/lakefs/perago-hard-fence.yaml) and reaches Conductor inside lakeFS's merge refusal.
//! [`FenceRefusal::parse`] reads every one of them back for `kubectl perago explain`, and a
//! round-trip test over every variant keeps the two sides in step.

use thiserror::Error;

/// A fence refusal. `Display` is the reason text, byte for byte the reference's.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum FenceRefusal {
    /// The attempt fence: Conductor no longer shows this attempt as the current one. The
    /// reason is the task id alone.
    #[error("{task_id}")]
    NotCurrent { task_id: String },
    /// The attempt fence could not read the task again.
    #[error("broker failed to reload attempt {task_id}: {cause}")]
    Unconfirmed { task_id: String, cause: String },
    /// Something other than this task's own publications is on top of the input ref (the
    /// publish fence), or the head moved after the fence chose its base (the head check).
    #[error("{branch} advanced from {input} to {head}")]
    Advanced {
        branch: String,
        input: String,
        head: String,
    },
    /// The input ref is further back than the publish fence classifies.
    #[error("{branch} advanced beyond supported publish range ({commits} commits)")]
    BeyondRange { branch: String, commits: usize },
    /// The input ref is no longer in the branch's first-parent history.
    #[error("{branch} no longer contains workspace input ref {input}")]
    InputGone { branch: String, input: String },
    /// Nothing to publish, and the branch is no longer at the input ref.
    #[error("{branch} cannot complete no-op from input ref {input}; current head is {head}")]
    NoOpMoved {
        branch: String,
        input: String,
        head: String,
    },
    /// Python Perago 0.6.1's publish fence (read from its attempts, never written here).
    #[error("{branch} cannot publish from input ref {input}; current head is {head}")]
    PythonMoved {
        branch: String,
        input: String,
        head: String,
    },
    /// The hard fence's pre-merge hook. An empty `head` or `expected` is one its text did not
    /// give.
    #[error("{HARD_FENCE}{branch} is at {head}, expected {expected}")]
    HardFence {
        branch: String,
        head: String,
        expected: String,
    },
}

/// Which fence refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    Attempt,
    Publish,
    Hard,
}

/// How the hard fence's hook starts its error (the hook's Lua `error(...)` call).
pub const HARD_FENCE: &str = "perago hard fence: ";

impl FenceRefusal {
    pub fn fence(&self) -> Fence {
        match self {
            Self::NotCurrent { .. } | Self::Unconfirmed { .. } => Fence::Attempt,
            Self::HardFence { .. } => Fence::Hard,
            _ => Fence::Publish,
        }
    }

    /// The branch head the fence saw, when its reason names it.
    pub fn head(&self) -> Option<&str> {
        match self {
            Self::Advanced { head, .. }
            | Self::NoOpMoved { head, .. }
            | Self::PythonMoved { head, .. }
            | Self::HardFence { head, .. } => Some(head).filter(|h| !h.is_empty()),
            _ => None,
        }
        .map(String::as_str)
    }

    /// The refusal a failure reason states, for an attempt of `task_id` publishing to
    /// `branch`; `None` when no fence refused it. The hard fence's text is found anywhere in
    /// the reason (lakeFS wraps it in its own words).
    pub fn parse(reason: &str, branch: &str, task_id: &str) -> Option<Self> {
        let reason = reason.trim();
        if let Some(at) = reason.find(HARD_FENCE) {
            let said = &reason[at + HARD_FENCE.len()..];
            let (named, rest) = said.split_once(" is at ").unwrap_or(("", said));
            let head = rest.split([',', ' ', '\n']).next().unwrap_or("");
            let expected = rest
                .split_once(", expected ")
                .and_then(|(_, e)| e.split_whitespace().next())
                .unwrap_or("");
            return Some(Self::HardFence {
                branch: if named.is_empty() { branch } else { named }.to_owned(),
                head: if named.is_empty() { "" } else { head }.to_owned(),
                expected: expected.to_owned(),
            });
        }
        if !task_id.is_empty() && reason == task_id {
            return Some(Self::NotCurrent {
                task_id: task_id.to_owned(),
            });
        }
        if let Some((id, cause)) = reason
            .strip_prefix("broker failed to reload attempt ")
            .and_then(|r| r.split_once(": "))
        {
            return Some(Self::Unconfirmed {
                task_id: id.to_owned(),
                cause: cause.to_owned(),
            });
        }
        if branch.is_empty() {
            return None;
        }
        let rest = reason.strip_prefix(branch)?.strip_prefix(' ')?;
        let branch = branch.to_owned();
        if let Some(range) = rest.strip_prefix("advanced beyond supported publish range (") {
            let commits = range.strip_suffix(" commits)")?.parse().ok()?;
            return Some(Self::BeyondRange { branch, commits });
        }
        if let Some((input, head)) = rest
            .strip_prefix("advanced from ")
            .and_then(|r| r.rsplit_once(" to "))
        {
            let (input, head) = (input.to_owned(), head.to_owned());
            return Some(Self::Advanced {
                branch,
                input,
                head,
            });
        }
        if let Some(input) = rest.strip_prefix("no longer contains workspace input ref ") {
            let input = input.to_owned();
            return Some(Self::InputGone { branch, input });
        }
        let moved = |lead: &str| {
            rest.strip_prefix(lead)
                .and_then(|r| r.split_once("; current head is "))
                .map(|(input, head)| (input.to_owned(), head.to_owned()))
        };
        if let Some((input, head)) = moved("cannot complete no-op from input ref ") {
            return Some(Self::NoOpMoved {
                branch,
                input,
                head,
            });
        }
        let (input, head) = moved("cannot publish from input ref ")?;
        Some(Self::PythonMoved {
            branch,
            input,
            head,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_variant() -> Vec<FenceRefusal> {
        let (branch, input, head) = ("main".to_owned(), "a1".to_owned(), "h2".to_owned());
        vec![
            FenceRefusal::NotCurrent {
                task_id: "9b4c-1".into(),
            },
            FenceRefusal::Unconfirmed {
                task_id: "9b4c-1".into(),
                cause: "Conductor get task failed: HTTP 503: x".into(),
            },
            FenceRefusal::Advanced {
                branch: branch.clone(),
                input: input.clone(),
                head: head.clone(),
            },
            FenceRefusal::BeyondRange {
                branch: branch.clone(),
                commits: 1024,
            },
            FenceRefusal::InputGone {
                branch: branch.clone(),
                input: input.clone(),
            },
            FenceRefusal::NoOpMoved {
                branch: branch.clone(),
                input: input.clone(),
                head: head.clone(),
            },
            FenceRefusal::PythonMoved {
                branch: branch.clone(),
                input: input.clone(),
                head: head.clone(),
            },
            FenceRefusal::HardFence {
                branch,
                head,
                expected: "e3".into(),
            },
        ]
    }

    #[test]
    fn every_refusal_reads_back_as_itself() {
        for refusal in every_variant() {
            let reason = refusal.to_string();
            assert_eq!(
                FenceRefusal::parse(&reason, "main", "9b4c-1"),
                Some(refusal.clone()),
                "{reason}"
            );
        }
    }

    #[test]
    fn the_hard_fence_is_found_inside_lakefs_words_and_its_hook_writes_it() {
        let wrapped = "lakeFS merge on r@main failed: HTTP 412 Precondition Failed: update branch main: pre-merge hook aborted, run id 'x': 1 error occurred:\n\t* hook run id '0000_0000' failed on action 'perago-hard-fence' hook 'perago_expected_head': action failed: runtime error: [string \"lua\"]:5: perago hard fence: main is at H3, expected E3\nstack traceback:";
        let refusal = FenceRefusal::parse(wrapped, "main", "t").unwrap();
        assert_eq!(refusal.fence(), Fence::Hard);
        assert_eq!(refusal.head(), Some("H3"));
        let hook = include_str!("../../deploy/lakefs/perago-hard-fence.yaml");
        assert!(
            hook.contains(&format!(
                "error(\"{HARD_FENCE}\" .. action.branch_id .. \" is at \" .. tostring(head) .. \", expected \" .. expected)"
            )),
            "the hook's error text is the one parsed here"
        );
    }

    #[test]
    fn other_reasons_and_other_branches_are_no_refusal() {
        for reason in [
            "task body exited with status 3",
            "dev advanced from A to H",
            "main advanced beyond supported publish range (many commits)",
            "",
        ] {
            assert_eq!(FenceRefusal::parse(reason, "main", "t"), None, "{reason}");
        }
        assert_eq!(FenceRefusal::parse("t", "main", ""), None);
    }
}
