//! Canary rollouts of a task's pod template (`spec.rollout`, ADR 0044), decided as data.
//!
//! The stable pods are the task's Deployment, as always; a rollout adds a second Deployment,
//! `<task>-canary`, with the new template and a share of the task's pods. [`plan`] reads what
//! the reconcile saw and says which template each Deployment runs, how the task's replicas
//! are split, and what the status says; `controller` applies it.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use perago_api::rollout::{
    CanaryAttempts, RolloutFailurePolicy, RolloutOrder, RolloutPhase, RolloutSpec, RolloutStatus,
};

use crate::render::TASK_LABEL;

/// How soon a reconcile looks again at a rollout that moves, and how old a canary pod's
/// figure may be for its analysis.
pub const LOOK_AGAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The label that tells a canary's pods (and its Deployment's selector) from the stable ones.
pub const TRACK_LABEL: &str = "perago.io/track";

/// The canary Deployment's name.
pub fn canary_name(object: &str) -> String {
    format!("{object}-canary")
}

/// `rendered` (the task's Deployment) as its canary: its own name, and its own track in the
/// selector and the pods' labels, so that neither Deployment counts the other's pods.
/// The pod annotation naming the template (its hash) a canary pod runs, so that the analysis
/// counts only the pods of the rollout it judges.
pub const REVISION_ANNOTATION: &str = "perago.io/rollout-revision";

/// `rendered` (the task's Deployment, with template `revision`) as its canary: its own name,
/// and its own track in the selector and the pods' labels, so that neither Deployment counts
/// the other's pods.
pub fn canary(mut rendered: Deployment, replicas: i32, revision: &str) -> Deployment {
    let name = canary_name(rendered.metadata.name.as_deref().unwrap_or_default());
    rendered.metadata.name = Some(name);
    if let Some(spec) = rendered.spec.as_mut() {
        spec.replicas = Some(replicas);
        let selector = spec.selector.match_labels.get_or_insert_default();
        selector.insert(TRACK_LABEL.into(), "canary".into());
        let meta = spec.template.metadata.get_or_insert_default();
        meta.labels
            .get_or_insert_default()
            .insert(TRACK_LABEL.into(), "canary".into());
        meta.annotations
            .get_or_insert_default()
            .insert(REVISION_ANNOTATION.into(), revision.into());
    }
    rendered
}

/// Whether `pod` is one of the task's canary pods of `revision`.
pub fn runs_canary(pod: &k8s_openapi::api::core::v1::Pod, revision: &str) -> bool {
    let meta = &pod.metadata;
    let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key));
    let annotation = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION_ANNOTATION));
    label(TRACK_LABEL).map(String::as_str) == Some("canary")
        && label(TASK_LABEL).is_some()
        && annotation.map(String::as_str) == Some(revision)
}

/// Whether every pod of `d` runs its template, ready, as the watch last showed it.
pub fn rolled_out(d: &Deployment) -> bool {
    let Some(s) = d.status.as_ref() else {
        return false;
    };
    s.observed_generation >= d.metadata.generation
        && s.updated_replicas.unwrap_or(0) == s.replicas.unwrap_or(0)
        && s.ready_replicas.unwrap_or(0) >= s.updated_replicas.unwrap_or(0)
}

/// The task's `total` pods split between the canary and the stable pods at `weight` percent:
/// the canary's share rounded up, at least one pod, and at least one stable pod left. A task
/// of one pod gets one more for the canary while the rollout runs: there is no share of one.
pub fn split(total: i32, weight: i32) -> Split {
    match total {
        t if t <= 0 => Split {
            canary: 0,
            stable: 0,
        },
        1 => Split {
            canary: 1,
            stable: 1,
        },
        t => {
            let share = (i64::from(t) * i64::from(weight) + 99) / 100;
            let canary = i32::try_from(share).unwrap_or(t).clamp(1, t - 1);
            Split {
                canary,
                stable: t - canary,
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub canary: i32,
    pub stable: i32,
}

/// What the reconcile saw, for [`plan`].
pub struct Seen<'a> {
    pub spec: &'a RolloutSpec,
    /// The last rollout, as the status says.
    pub last: Option<&'a RolloutStatus>,
    /// The hash of the pod template the spec renders.
    pub desired: &'a str,
    /// The hash of the template the stable Deployment runs; `None` before it exists.
    pub stable: Option<&'a str>,
    /// The canary Deployment's ready pods.
    pub canary_ready: i32,
    /// Whether the stable Deployment runs the desired template in all its pods, ready.
    pub stable_rolled_out: bool,
    /// The task's replicas, as decided (fixed, or by the autoscaler).
    pub replicas: i32,
    /// The canary's finished attempts, as counted by its pods.
    pub attempts: CanaryAttempts,
    /// The order `kubectl perago rollout` left on the task, if any.
    pub order: Option<RolloutOrder>,
    pub now: Timestamp,
}

/// What to run, and the status of the rollout.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// The rendered template in the stable Deployment at the task's replicas; no canary. A task
    /// with no rollout, a first Deployment, or a template the stable pods already run.
    Replace { status: Option<RolloutStatus> },
    /// The stable Deployment keeps its template; the canary runs the rendered one.
    Canary { split: Split, status: RolloutStatus },
    /// The rendered template in the stable Deployment at the task's replicas; the canary stays
    /// until the stable pods run it, ready.
    Promote { status: RolloutStatus },
    /// The stable Deployment keeps its template at the task's replicas; no canary.
    Stable { status: RolloutStatus },
}

impl Plan {
    pub fn status(&self) -> Option<&RolloutStatus> {
        match self {
            Self::Replace { status } => status.as_ref(),
            Self::Canary { status, .. } | Self::Promote { status } | Self::Stable { status } => {
                Some(status)
            }
        }
    }

    /// Whether the rollout moves on by itself: the reconcile looks again soon.
    pub fn runs(&self) -> bool {
        matches!(self, Self::Canary { status, .. } if status.phase == RolloutPhase::Progressing)
            || matches!(self, Self::Promote { .. })
    }
}

/// What changed between two statuses that deserves an event: (warning, reason, note).
pub fn event(
    before: Option<&RolloutStatus>,
    after: Option<&RolloutStatus>,
) -> Option<(bool, &'static str, String)> {
    let after = after?;
    let same_rollout = before.is_some_and(|b| b.revision == after.revision);
    let moved =
        !same_rollout || before.is_some_and(|b| b.phase != after.phase || b.step != after.step);
    if !moved {
        return None;
    }
    let revision = short(&after.revision);
    Some(match after.phase {
        RolloutPhase::Progressing if !same_rollout => (
            false,
            "RolloutStarted",
            format!(
                "canary rollout of template {revision} started: {}",
                after.message
            ),
        ),
        RolloutPhase::Progressing => (
            false,
            "RolloutStep",
            format!("canary of template {revision}: {}", after.message),
        ),
        RolloutPhase::Promoting => (
            false,
            "RolloutPromoting",
            format!(
                "template {revision} replaces the stable pods: {}",
                after.message
            ),
        ),
        RolloutPhase::Completed => (
            false,
            "RolloutCompleted",
            format!("every executor pod runs template {revision}"),
        ),
        RolloutPhase::Paused => (
            true,
            "RolloutPaused",
            format!("canary of template {revision} paused: {}", after.message),
        ),
        RolloutPhase::RolledBack => (
            true,
            "RolledBack",
            format!(
                "canary of template {revision} rolled back: {}",
                after.message
            ),
        ),
        RolloutPhase::Aborted => (
            true,
            "RolloutAborted",
            format!("canary of template {revision} aborted: {}", after.message),
        ),
    })
}

/// The `result` of `perago_operator_rollouts_total` when a rollout ends between two statuses.
pub fn ended(
    before: Option<&RolloutStatus>,
    after: Option<&RolloutStatus>,
) -> Option<&'static str> {
    let after = after?;
    let was = before
        .filter(|b| b.revision == after.revision)
        .map(|b| b.phase);
    (was != Some(after.phase))
        .then_some(match after.phase {
            RolloutPhase::Completed => Some("completed"),
            RolloutPhase::RolledBack => Some("rolled_back"),
            RolloutPhase::Aborted => Some("aborted"),
            _ => None,
        })
        .flatten()
}

pub use perago_api::rollout::short;

/// The rollout's next state, from what the reconcile saw.
pub fn plan(seen: &Seen<'_>) -> Plan {
    let last = seen.last.filter(|l| l.revision == seen.desired);
    let Some(stable) = seen.stable else {
        // The first Deployment: nothing to compare a canary with.
        return Plan::Replace {
            status: seen.last.cloned(),
        };
    };
    if !seen.spec.is_canary() || stable == seen.desired {
        // Nothing to roll out, or `Replace`: a promotion ends once the stable pods run the
        // template; a rollout the spec no longer asks for ends too.
        let running = |l: &RolloutStatus| {
            matches!(
                l.phase,
                RolloutPhase::Progressing | RolloutPhase::Paused | RolloutPhase::Promoting
            )
        };
        let status = match seen.last {
            Some(l) if running(l) && l.revision == seen.desired => {
                let mut status = l.clone();
                if stable != seen.desired || !seen.stable_rolled_out {
                    // Promoting, or the strategy became `Replace`: the stable pods take it.
                    status.phase = RolloutPhase::Promoting;
                    return Plan::Promote { status };
                }
                status.phase = RolloutPhase::Completed;
                status.message = String::new();
                Some(status)
            }
            Some(l) if running(l) => Some(RolloutStatus {
                phase: RolloutPhase::Aborted,
                message: format!(
                    "the spec no longer asks for template {}",
                    short(&l.revision)
                ),
                ..l.clone()
            }),
            other => other.cloned(),
        };
        return Plan::Replace { status };
    }
    let mut status = match last {
        Some(l) => l.clone(),
        None => RolloutStatus {
            phase: RolloutPhase::Progressing,
            revision: seen.desired.to_owned(),
            stable_revision: Some(stable.to_owned()),
            step: 0,
            step_ready_time: None,
            canary: CanaryAttempts::default(),
            message: String::new(),
        },
    };
    status.canary = status.canary.max(seen.attempts);
    match status.phase {
        RolloutPhase::RolledBack | RolloutPhase::Aborted => return Plan::Stable { status },
        RolloutPhase::Completed | RolloutPhase::Promoting => {
            status.phase = RolloutPhase::Promoting;
            return Plan::Promote { status };
        }
        RolloutPhase::Progressing | RolloutPhase::Paused => {}
    }
    match seen.order {
        Some(RolloutOrder::Abort) => {
            status.phase = RolloutPhase::Aborted;
            status.message = format!(
                "aborted by hand at step {}; {}",
                status.step + 1,
                tally(&status.canary)
            );
            return Plan::Stable { status };
        }
        Some(RolloutOrder::Promote) => {
            status.phase = RolloutPhase::Promoting;
            status.message = format!(
                "promoted by hand at step {}; {}",
                status.step + 1,
                tally(&status.canary)
            );
            return Plan::Promote { status };
        }
        None => {}
    }
    let steps = &seen.spec.steps;
    let Some(analysis) = &seen.spec.analysis else {
        // The webhook refuses a canary without one; a task that got past it replaces.
        return Plan::Replace {
            status: seen.last.cloned(),
        };
    };
    let weight = |step: i32| {
        usize::try_from(step)
            .ok()
            .and_then(|i| steps.get(i))
            .or(steps.last())
            .map_or(100, |s| s.weight)
    };
    if status.phase == RolloutPhase::Paused {
        return Plan::Canary {
            split: split(seen.replicas, weight(status.step)),
            status,
        };
    }
    let judged = status.canary.judged();
    let failed_share_over =
        status.canary.failed * 100 > i64::from(analysis.max_failed_percent) * judged;
    if judged >= analysis.min_attempts && failed_share_over {
        let why = format!(
            "{} of {} finished attempts failed in the body, more than {}%",
            status.canary.failed, judged, analysis.max_failed_percent
        );
        status.step_ready_time = None;
        return match seen.spec.on_failure {
            RolloutFailurePolicy::Rollback => {
                status.phase = RolloutPhase::RolledBack;
                status.message = format!("{why}; the stable pods run template {}", short(stable));
                Plan::Stable { status }
            }
            RolloutFailurePolicy::Pause => {
                status.phase = RolloutPhase::Paused;
                status.message = format!("{why}; promote or abort it (kubectl perago rollout)");
                Plan::Canary {
                    split: split(seen.replicas, weight(status.step)),
                    status,
                }
            }
        };
    }
    let count = i32::try_from(steps.len()).unwrap_or(i32::MAX);
    let mut at = split(seen.replicas, weight(status.step));
    let ready = at.canary > 0 && seen.canary_ready >= at.canary;
    if ready && status.step_ready_time.is_none() {
        status.step_ready_time = Some(Time(seen.now));
    }
    let pause = usize::try_from(status.step)
        .ok()
        .and_then(|i| steps.get(i))
        .map_or(0, |s| s.pause_seconds);
    let held = status
        .step_ready_time
        .as_ref()
        .is_some_and(|t| seen.now.duration_since(t.0) >= SignedDuration::from_secs(pause));
    if held && status.step < count {
        status.step += 1;
        status.step_ready_time = None;
        at = split(seen.replicas, weight(status.step));
    }
    if status.step >= count {
        if judged >= analysis.min_attempts {
            status.phase = RolloutPhase::Promoting;
            status.message = format!("every step passed; {}", tally(&status.canary));
            return Plan::Promote { status };
        }
        status.message = format!(
            "every step passed; waiting for {} finished attempts to judge ({})",
            analysis.min_attempts,
            tally(&status.canary)
        );
    } else {
        let step = status.step + 1;
        let waiting = match &status.step_ready_time {
            None if seen.replicas == 0 => "waiting for work: the task has no pods".to_owned(),
            None => format!("waiting for {} canary pods to be ready", at.canary),
            Some(_) => format!("holding {pause} s"),
        };
        status.message = format!(
            "step {step}/{count} at {}%: {} canary and {} stable pods, {waiting}; {}",
            weight(status.step),
            at.canary,
            at.stable,
            tally(&status.canary)
        );
    }
    Plan::Canary { split: at, status }
}

fn tally(a: &CanaryAttempts) -> String {
    format!(
        "{} attempts judged, {} failed in the body ({} not judged)",
        a.judged(),
        a.failed,
        a.not_judged
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use perago_api::rollout::{RolloutAnalysis, RolloutStep, RolloutStrategy};

    fn spec(on_failure: RolloutFailurePolicy) -> RolloutSpec {
        RolloutSpec {
            strategy: RolloutStrategy::Canary,
            steps: vec![
                RolloutStep {
                    weight: 25,
                    pause_seconds: 60,
                },
                RolloutStep {
                    weight: 50,
                    pause_seconds: 60,
                },
            ],
            analysis: Some(RolloutAnalysis {
                max_failed_percent: 20,
                min_attempts: 5,
            }),
            on_failure,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn attempts(completed: i64, failed: i64) -> CanaryAttempts {
        CanaryAttempts {
            completed,
            failed,
            not_judged: 0,
        }
    }

    fn seen<'a>(spec: &'a RolloutSpec, last: Option<&'a RolloutStatus>, now: i64) -> Seen<'a> {
        Seen {
            spec,
            last,
            desired: "new00000aaaa",
            stable: Some("old00000bbbb"),
            canary_ready: 0,
            stable_rolled_out: true,
            replicas: 4,
            attempts: CanaryAttempts::default(),
            order: None,
            now: at(now),
        }
    }

    fn status_of(plan: &Plan) -> RolloutStatus {
        plan.status().cloned().unwrap()
    }

    #[test]
    fn shares_round_up_and_keep_a_pod_on_each_side() {
        assert_eq!(
            split(4, 10),
            Split {
                canary: 1,
                stable: 3
            }
        );
        assert_eq!(
            split(4, 50),
            Split {
                canary: 2,
                stable: 2
            }
        );
        assert_eq!(
            split(4, 99),
            Split {
                canary: 3,
                stable: 1
            }
        );
        assert_eq!(
            split(10, 25),
            Split {
                canary: 3,
                stable: 7
            }
        );
        assert_eq!(
            split(1, 10),
            Split {
                canary: 1,
                stable: 1
            },
            "one more pod for a task of one"
        );
        assert_eq!(
            split(0, 50),
            Split {
                canary: 0,
                stable: 0
            }
        );
    }

    #[test]
    fn no_rollout_without_a_canary_strategy_a_first_deployment_or_a_change() {
        let replace = RolloutSpec::default();
        assert_eq!(
            plan(&seen(&replace, None, 0)),
            Plan::Replace { status: None }
        );
        let canary = spec(RolloutFailurePolicy::Rollback);
        let mut first = seen(&canary, None, 0);
        first.stable = None;
        assert_eq!(plan(&first), Plan::Replace { status: None });
        let mut same = seen(&canary, None, 0);
        same.stable = Some("new00000aaaa");
        assert_eq!(plan(&same), Plan::Replace { status: None });
    }

    #[test]
    fn a_healthy_canary_holds_each_step_from_its_pods_ready_then_promotes() {
        let canary = spec(RolloutFailurePolicy::Rollback);
        // Started: 1 of 4 pods, not ready yet.
        let plan0 = plan(&seen(&canary, None, 0));
        assert_eq!(
            plan0,
            Plan::Canary {
                split: Split {
                    canary: 1,
                    stable: 3
                },
                status: status_of(&plan0)
            }
        );
        let s0 = status_of(&plan0);
        assert_eq!(
            (s0.phase, s0.step, s0.step_ready_time.as_ref()),
            (RolloutPhase::Progressing, 0, None)
        );
        assert_eq!(s0.stable_revision.as_deref(), Some("old00000bbbb"));
        assert!(
            s0.message.contains("waiting for 1 canary pods"),
            "{}",
            s0.message
        );
        // Ready at 10 s: the pause counts from then.
        let mut ready = seen(&canary, Some(&s0), 10);
        ready.canary_ready = 1;
        let s1 = status_of(&plan(&ready));
        assert_eq!(s1.step_ready_time, Some(Time(at(10))));
        let mut early = seen(&canary, Some(&s1), 69);
        early.canary_ready = 1;
        assert_eq!(status_of(&plan(&early)).step, 0, "59 s of a 60 s pause");
        // 60 s later: step 2 at 50%.
        let mut next = seen(&canary, Some(&s1), 70);
        next.canary_ready = 1;
        next.attempts = attempts(3, 0);
        let p2 = plan(&next);
        let s2 = status_of(&p2);
        assert_eq!((s2.step, s2.step_ready_time.as_ref()), (1, None));
        assert!(matches!(
            p2,
            Plan::Canary {
                split: Split {
                    canary: 2,
                    stable: 2
                },
                ..
            }
        ));
        // Past the last step with too few attempts judged: it waits.
        let past = RolloutStatus {
            step: 1,
            step_ready_time: Some(Time(at(100))),
            ..s2.clone()
        };
        let mut wait = seen(&canary, Some(&past), 200);
        wait.canary_ready = 2;
        wait.attempts = attempts(4, 0);
        let s3 = status_of(&plan(&wait));
        assert_eq!((s3.phase, s3.step), (RolloutPhase::Progressing, 2));
        assert!(
            s3.message.contains("waiting for 5 finished attempts"),
            "{}",
            s3.message
        );
        // The fifth attempt: promote.
        let mut judged = seen(&canary, Some(&s3), 201);
        judged.canary_ready = 2;
        judged.attempts = attempts(5, 0);
        let promote = plan(&judged);
        assert!(matches!(promote, Plan::Promote { .. }), "{promote:?}");
        // Promoting until the stable pods run the template; then completed.
        let s4 = status_of(&promote);
        let mut rolling = seen(&canary, Some(&s4), 210);
        rolling.stable = Some("new00000aaaa");
        rolling.stable_rolled_out = false;
        assert!(matches!(plan(&rolling), Plan::Promote { .. }));
        rolling.stable_rolled_out = true;
        let done = plan(&rolling);
        assert_eq!(status_of(&done).phase, RolloutPhase::Completed);
        assert!(matches!(done, Plan::Replace { .. }));
    }

    #[test]
    fn a_failing_canary_rolls_back_once_judged_and_stays_back_for_its_template() {
        let canary = spec(RolloutFailurePolicy::Rollback);
        let s0 = status_of(&plan(&seen(&canary, None, 0)));
        let mut few = seen(&canary, Some(&s0), 5);
        few.attempts = attempts(0, 4);
        assert_eq!(
            status_of(&plan(&few)).phase,
            RolloutPhase::Progressing,
            "4 of 5 judged"
        );
        let mut judged = seen(&canary, Some(&s0), 6);
        judged.attempts = CanaryAttempts {
            completed: 3,
            failed: 2,
            not_judged: 7,
        };
        let back = plan(&judged);
        let s1 = status_of(&back);
        assert!(matches!(back, Plan::Stable { .. }));
        assert_eq!(s1.phase, RolloutPhase::RolledBack);
        assert_eq!(
            s1.message,
            "2 of 5 finished attempts failed in the body, more than 20%; the stable pods run template old00000"
        );
        // The same template stays rolled back; a new one starts a new rollout.
        assert!(matches!(
            plan(&seen(&canary, Some(&s1), 100)),
            Plan::Stable { .. }
        ));
        let mut newer = seen(&canary, Some(&s1), 100);
        newer.desired = "third000cccc";
        let s2 = status_of(&plan(&newer));
        assert_eq!(
            (s2.phase, s2.revision.as_str(), s2.canary),
            (
                RolloutPhase::Progressing,
                "third000cccc",
                CanaryAttempts::default()
            )
        );
    }

    #[test]
    fn a_paused_canary_waits_for_an_order() {
        let canary = spec(RolloutFailurePolicy::Pause);
        let s0 = status_of(&plan(&seen(&canary, None, 0)));
        let mut failing = seen(&canary, Some(&s0), 5);
        failing.attempts = attempts(0, 5);
        let paused = plan(&failing);
        let s1 = status_of(&paused);
        assert_eq!(s1.phase, RolloutPhase::Paused);
        assert!(matches!(
            paused,
            Plan::Canary {
                split: Split {
                    canary: 1,
                    stable: 3
                },
                ..
            }
        ));
        let mut later = seen(&canary, Some(&s1), 500);
        later.canary_ready = 1;
        assert_eq!(
            status_of(&plan(&later)).phase,
            RolloutPhase::Paused,
            "time alone does not move it"
        );
        later.order = Some(RolloutOrder::Abort);
        assert_eq!(status_of(&plan(&later)).phase, RolloutPhase::Aborted);
        later.order = Some(RolloutOrder::Promote);
        assert!(matches!(plan(&later), Plan::Promote { .. }));
    }

    #[test]
    fn a_rollout_the_spec_no_longer_asks_for_ends() {
        let canary = spec(RolloutFailurePolicy::Rollback);
        let s0 = status_of(&plan(&seen(&canary, None, 0)));
        // Reverted to the stable template.
        let mut reverted = seen(&canary, Some(&s0), 5);
        reverted.desired = "old00000bbbb";
        let ended = plan(&reverted);
        assert_eq!(status_of(&ended).phase, RolloutPhase::Aborted);
        assert!(matches!(ended, Plan::Replace { .. }));
        // The strategy became Replace: the stable pods take the template, then it is done.
        let replace = RolloutSpec::default();
        assert!(matches!(
            plan(&seen(&replace, Some(&s0), 5)),
            Plan::Promote { .. }
        ));
    }

    #[test]
    fn counts_never_go_back_after_an_operator_restart() {
        let canary = spec(RolloutFailurePolicy::Rollback);
        let mut s0 = status_of(&plan(&seen(&canary, None, 0)));
        s0.canary = attempts(4, 0);
        let mut restarted = seen(&canary, Some(&s0), 5);
        restarted.attempts = attempts(1, 0);
        assert_eq!(status_of(&plan(&restarted)).canary, attempts(4, 0));
    }

    #[test]
    fn events_follow_phases_and_steps() {
        let canary = spec(RolloutFailurePolicy::Rollback);
        let s0 = status_of(&plan(&seen(&canary, None, 0)));
        let (warning, reason, _) = event(None, Some(&s0)).unwrap();
        assert_eq!((warning, reason), (false, "RolloutStarted"));
        assert_eq!(event(Some(&s0), Some(&s0)), None);
        let back = RolloutStatus {
            phase: RolloutPhase::RolledBack,
            ..s0.clone()
        };
        assert_eq!(
            event(Some(&s0), Some(&back)).map(|e| (e.0, e.1)),
            Some((true, "RolledBack"))
        );
    }
}
