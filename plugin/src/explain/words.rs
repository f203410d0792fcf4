//! The verdict in words: its English, which the table prints and JSON carries as `summary`,
//! and the JSON object scripts read.

use std::fmt;

use serde::{Serialize, Serializer};

use perago_conductor::TaskStatus;
use perago_lakefs::MergeOutcome;
use perago_workspace::refusal::{Fence, FenceRefusal};

use super::SEARCH_LIMIT;
use super::decide::{
    Base, FenceKind, Next, Progress, SearchGap, Settlement, Staged, Verdict, VerdictKind,
};
use crate::output::{cell, short};

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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use super::*;
    use crate::explain::cases::{C2, Case, INPUT, attempt, cases};
    use crate::explain::decide::decide;

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
}
