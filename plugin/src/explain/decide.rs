//! The verdict on an attempt, as data: the situation [`decide`] finds in the attempt's view
//! and the next attempt of its step, with the facts that tell it. Its words are in
//! [`words`](super::words).

use serde::Serialize;

use perago_conductor::TaskStatus;
use perago_lakefs::MergeOutcome;
use perago_workspace::refusal::{Fence, FenceRefusal};

use super::view::{Attempt, SearchView};

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

/// What became of one attempt: the situation `decide` found, with the facts that tell it.
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
    /// The search stopped at [`SEARCH_LIMIT`](super::SEARCH_LIMIT) before the input ref.
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
    pub(super) fn of(expected_head: String, supersedes: String) -> Self {
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

/// The verdict on attempt `a`, given the attempt of its step that came after it (`None` for
/// the last). Facts only: the words are [`Verdict`]'s `Display`.
pub(super) fn decide(a: &Attempt, next: Option<&Attempt>) -> Verdict {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::cases::{Case, attempt, cases};

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
}
