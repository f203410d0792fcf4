//! The situations [`decide`](super::decide::decide) tells apart, each with the verdict it
//! finds and how that reads, and the attempts they are built from: for the tests of
//! `decide`, `words` and `table`.

use perago_conductor::TaskStatus;
use perago_lakefs::MergeOutcome;
use perago_workspace::refusal::FenceRefusal;

use super::SEARCH_LIMIT;
use super::decide::{Base, Next, Progress, SearchGap, Settlement, Staged, Verdict};
use super::view::{Attempt, Facts, SearchView, StagingView, WorkspaceView};

/// Commit ids longer than the 12 characters people read.
pub(super) const INPUT: &str = "1npu7000000000000000";
pub(super) const C: &str = "c0nf1rm00000000000aa";
pub(super) const C2: &str = "c0nf1rm22222222222bb";
pub(super) const TRY: &str = "7ry0000000000000cccc";
const OUT: &str = "0u7pu7000000000000dd";
const STAGING: &str = "perago-staging-step-task-id-t-retry-0-e";

pub(super) fn attempt(retry: i64, status: TaskStatus) -> Attempt {
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
        lineage: None,
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
    pub(super) fn worker(mut self, w: &str) -> Self {
        self.worker_id = w.into();
        self
    }
    pub(super) fn reason(mut self, r: &str) -> Self {
        self.reason = r.into();
        self
    }
    pub(super) fn output(mut self, o: &str) -> Self {
        self.output_ref = Some(o.into());
        self
    }
    pub(super) fn staged(mut self, try_commit: &str) -> Self {
        self.staging.push(StagingView {
            branch: STAGING.into(),
            head: try_commit.into(),
            try_commit: Some(try_commit.into()),
        });
        self
    }
    /// Its confirm commit, published on `expected` superseding `supersedes` ("" for none).
    pub(super) fn confirm(mut self, id: &str, expected: &str, supersedes: &str) -> Self {
        if let Some(s) = &mut self.search {
            s.confirm = Some(id.into());
        }
        self.facts.confirm = Some((id.into(), Base::of(expected.into(), supersedes.into())));
        self
    }
    pub(super) fn superseded(mut self, by: &str, retry: &str) -> Self {
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
    pub(super) fn bounded(mut self) -> Self {
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

pub(super) const TIMED_OUT_MERGE: &str =
    "lakeFS merge on r@main failed: error sending request: operation timed out";
const TIMED_OUT_CAUSE: &str = "error sending request: operation timed out";
const UNREADABLE_MERGE: &str = "lakeFS merge on r@main returned an unreadable answer: EOF";

/// One situation `decide` tells apart: the attempt, the one after it, what `decide` finds
/// and how that reads.
pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) attempt: Attempt,
    pub(super) next: Option<Attempt>,
    pub(super) verdict: Verdict,
    pub(super) words: &'static str,
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

pub(super) fn cases() -> Vec<Case> {
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
