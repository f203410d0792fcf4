//! What a PeragoTask's status says, decided from what the reconcile observed: pure functions,
//! unit-tested without an API server. The three conditions kstatus reads (`Ready`,
//! `Reconciling`, `Stalled`) are built in [`conditions`] alone; the reconcile writes the
//! result in one place (`controller::patch_status`).

use k8s_openapi::api::apps::v1::DeploymentStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use perago_api::PeragoTaskStatus;
use perago_api::rollout::{RolloutPhase, RolloutStatus};

use crate::pods::PodProblem;

/// One condition's status, reason and message.
struct Said<'a> {
    status: bool,
    reason: &'a str,
    message: &'a str,
}

fn said<'a>(status: bool, reason: &'a str, message: &'a str) -> Said<'a> {
    Said {
        status,
        reason,
        message,
    }
}

/// `Ready`, `Reconciling` and `Stalled` for `generation`, each keeping its transition time
/// from `old` when its status did not change.
fn conditions(
    old: &[Condition],
    generation: Option<i64>,
    [ready, reconciling, stalled]: [Said<'_>; 3],
) -> Vec<Condition> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    [
        ("Ready", ready),
        ("Reconciling", reconciling),
        ("Stalled", stalled),
    ]
    .into_iter()
    .map(|(type_, s)| {
        let status = if s.status { "True" } else { "False" };
        let since = old
            .iter()
            .find(|o| o.type_ == type_ && o.status == status)
            .map_or_else(|| now.clone(), |o| o.last_transition_time.clone());
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: s.reason.into(),
            message: s.message.into(),
            observed_generation: generation,
            last_transition_time: since,
        }
    })
    .collect()
}

/// Whether `old` already says `type_` with `message` (so its event was already published).
pub fn says(old: &PeragoTaskStatus, type_: &str, reason: Option<&str>, message: &str) -> bool {
    old.conditions.iter().any(|c| {
        c.type_ == type_
            && (c.type_ != "Stalled" || c.status == "True")
            && reason.is_none_or(|r| c.reason == r)
            && c.message == message
    })
}

/// Whether `old`'s `type_` condition has `reason`.
pub fn says_reason(old: &PeragoTaskStatus, type_: &str, reason: &str) -> bool {
    old.conditions
        .iter()
        .any(|c| c.type_ == type_ && c.reason == reason)
}

/// The reason of the conditions of a suspended task (`spec.suspend`), and of its event.
pub const SUSPENDED: &str = "Suspended";
/// The reason of the event of a task that is no longer suspended.
pub const RESUMED: &str = "Resumed";

/// The reason of the conditions of an invalid spec.
pub const INVALID_SPEC: &str = "InvalidSpec";

/// A task that cannot go on until something changes (an invalid spec, a TaskDef a sibling
/// renders differently, an object the API server refuses): stalled, for `reason`; nothing
/// else of the status moves.
pub fn blocked(
    old: &PeragoTaskStatus,
    generation: Option<i64>,
    reason: &str,
    message: &str,
) -> PeragoTaskStatus {
    PeragoTaskStatus {
        observed_generation: generation,
        conditions: conditions(
            &old.conditions,
            generation,
            [
                said(false, reason, message),
                said(false, reason, ""),
                said(true, reason, message),
            ],
        ),
        ..old.clone()
    }
}

/// The reason of the conditions while a Conductor call fails.
pub const CONDUCTOR_UNAVAILABLE: &str = "ConductorUnavailable";

/// A failed Conductor call: not Ready and still reconciling (it is transient, so not Stalled).
pub fn conductor_unavailable(
    old: &PeragoTaskStatus,
    generation: Option<i64>,
    message: &str,
) -> PeragoTaskStatus {
    PeragoTaskStatus {
        observed_generation: generation,
        conditions: conditions(
            &old.conditions,
            generation,
            [
                said(false, CONDUCTOR_UNAVAILABLE, message),
                said(true, CONDUCTOR_UNAVAILABLE, message),
                said(false, "Valid", ""),
            ],
        ),
        ..old.clone()
    }
}

/// What the reconcile saw of a valid task whose TaskDef is registered.
pub struct Observed<'a> {
    pub generation: Option<i64>,
    /// The Deployment's generation and status, as the apply returned it.
    pub deployment_generation: Option<i64>,
    pub deployment: &'a DeploymentStatus,
    /// The replicas decided for this pass.
    pub replicas: i32,
    /// The first executor pod that cannot start, if any.
    pub problem: Option<&'a PodProblem>,
    pub selector: String,
    pub queued: i64,
    pub running: i64,
    pub task_def_hash: String,
    /// `spec.suspend`: the executor pods still there, stopping ones included.
    pub suspended: Option<usize>,
}

impl Observed<'_> {
    /// Every desired pod is updated and ready, and the Deployment controller has seen the
    /// latest spec.
    pub fn rolled_out(&self) -> bool {
        let ds = self.deployment;
        ds.observed_generation >= self.deployment_generation
            && ds.updated_replicas.unwrap_or(0) >= self.replicas
            && ds.ready_replicas.unwrap_or(0) >= self.replicas
    }
}

/// The status of a valid task: Ready once rolled out; otherwise why not (a stuck pod in its
/// own words, or still rolling out), and Stalled once the Deployment's progress deadline
/// passed. `lastScale` is the scaler's ([`crate::scaler::Scaler::last_scale`]).
pub fn observed(old: &PeragoTaskStatus, seen: &Observed<'_>) -> PeragoTaskStatus {
    if let Some(pods) = seen.suspended {
        return suspended(old, seen, pods);
    }
    let replicas = seen.replicas;
    let ready_replicas = seen.deployment.ready_replicas.unwrap_or(0);
    let rolled_out = seen.rolled_out();
    let problem = seen.problem.filter(|_| !rolled_out);
    let (reason, message) = match problem {
        _ if rolled_out => (
            "Available",
            format!("TaskDef registered; {ready_replicas}/{replicas} executor pods ready"),
        ),
        Some(p) => (
            p.reason.as_str(),
            format!(
                "TaskDef registered; executor pods not ready ({ready_replicas}/{replicas}): {}",
                p.message
            ),
        ),
        None => (
            "RollingOut",
            format!(
                "TaskDef registered; waiting for executor pods ({ready_replicas}/{replicas} ready)"
            ),
        ),
    };
    let deadline = seen.deployment.conditions.iter().flatten().find(|c| {
        c.type_ == "Progressing"
            && c.status == "False"
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    let stalled_message = match (deadline, problem) {
        (Some(_), Some(p)) => p.message.clone(),
        (Some(c), None) => c.message.clone().unwrap_or_default(),
        (None, _) => String::new(),
    };
    let stalled = match deadline {
        Some(_) => said(true, "ProgressDeadlineExceeded", &stalled_message),
        None => said(false, "Valid", ""),
    };
    PeragoTaskStatus {
        observed_generation: seen.generation,
        conditions: conditions(
            &old.conditions,
            seen.generation,
            [
                said(rolled_out, reason, &message),
                said(
                    !rolled_out && deadline.is_none(),
                    reason,
                    if rolled_out { "" } else { &message },
                ),
                stalled,
            ],
        ),
        replicas: Some(replicas),
        ready_replicas: Some(ready_replicas),
        selector: Some(seen.selector.clone()),
        queue_depth: Some(seen.queued),
        running_attempts: Some(seen.running),
        last_scale: None,
        task_def_hash: Some(seen.task_def_hash.clone()),
        rollout: old.rollout.clone(),
    }
}

/// `status` with what a canary rollout in force says (ADR 0044): in progress, Reconciling; a
/// canary paused by its analysis, Stalled until a person orders; rolled back or aborted, Ready
/// once the stable pods are, saying why the new template does not run.
pub fn with_rollout(
    mut status: PeragoTaskStatus,
    old: &PeragoTaskStatus,
    generation: Option<i64>,
    rollout: Option<RolloutStatus>,
    in_force: bool,
) -> PeragoTaskStatus {
    let Some(r) = rollout.as_ref().filter(|_| in_force) else {
        status.rollout = rollout;
        return status;
    };
    let message = r.message.as_str();
    let said3 = match r.phase {
        RolloutPhase::Progressing => Some([
            said(false, ROLLOUT_PROGRESSING, message),
            said(true, ROLLOUT_PROGRESSING, message),
            said(false, "Valid", ""),
        ]),
        RolloutPhase::Promoting => Some([
            said(false, ROLLOUT_PROMOTING, message),
            said(true, ROLLOUT_PROMOTING, message),
            said(false, "Valid", ""),
        ]),
        RolloutPhase::Paused => Some([
            said(false, ROLLOUT_PAUSED, message),
            said(false, ROLLOUT_PAUSED, ""),
            said(true, ROLLOUT_PAUSED, message),
        ]),
        RolloutPhase::RolledBack | RolloutPhase::Aborted => {
            let ready = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")
                .map(|c| c.message.clone());
            if let Some(ready) = ready {
                let reason = if r.phase == RolloutPhase::RolledBack {
                    "RolledBack"
                } else {
                    "RolloutAborted"
                };
                let text = format!(
                    "{ready}; template {} does not run: {message}",
                    crate::rollout::short(&r.revision)
                );
                status.conditions = conditions(
                    &old.conditions,
                    generation,
                    [
                        said(true, reason, &text),
                        said(false, reason, ""),
                        said(false, "Valid", ""),
                    ],
                );
            }
            None
        }
        RolloutPhase::Completed => None,
    };
    if let Some(said3) = said3 {
        status.conditions = conditions(&old.conditions, generation, said3);
    }
    status.rollout = rollout;
    status
}

/// The reasons of the conditions while a canary rollout runs, promotes or waits for an order.
pub const ROLLOUT_PROGRESSING: &str = "RolloutProgressing";
pub const ROLLOUT_PROMOTING: &str = "RolloutPromoting";
pub const ROLLOUT_PAUSED: &str = "RolloutPaused";

/// The status of a suspended task, for `Suspended`: reconciling and not Ready while `pods`
/// executor pods are still finishing their attempts; once they are gone, a desired state
/// reached, so Ready (ADR 0035): kstatus reads a False Ready as in progress, and Flux and
/// `kubectl wait` would wait for it forever. Argo CD reads it as Suspended by its reason.
fn suspended(old: &PeragoTaskStatus, seen: &Observed<'_>, pods: usize) -> PeragoTaskStatus {
    let message = if pods > 0 {
        format!("Suspended: {pods} executor pods finishing their attempts")
    } else {
        format!(
            "Suspended: no executor pods; the TaskDef stays registered, {} queued",
            seen.queued
        )
    };
    PeragoTaskStatus {
        observed_generation: seen.generation,
        conditions: conditions(
            &old.conditions,
            seen.generation,
            [
                said(pods == 0, SUSPENDED, &message),
                said(pods > 0, SUSPENDED, if pods > 0 { &message } else { "" }),
                said(false, SUSPENDED, ""),
            ],
        ),
        replicas: Some(0),
        ready_replicas: Some(seen.deployment.ready_replicas.unwrap_or(0)),
        selector: Some(seen.selector.clone()),
        queue_depth: Some(seen.queued),
        running_attempts: Some(seen.running),
        last_scale: None,
        task_def_hash: Some(seen.task_def_hash.clone()),
        rollout: old.rollout.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentCondition;

    fn condition<'a>(status: &'a PeragoTaskStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    fn brief(status: &PeragoTaskStatus) -> Vec<(String, String, String)> {
        status
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    }

    fn seen<'a>(deployment: &'a DeploymentStatus, problem: Option<&'a PodProblem>) -> Observed<'a> {
        Observed {
            generation: Some(4),
            deployment_generation: Some(2),
            deployment,
            replicas: 2,
            problem,
            selector: "perago.io/task=t".into(),
            queued: 3,
            running: 1,
            task_def_hash: "h".into(),
            suspended: None,
        }
    }

    fn owned(v: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
        v.iter()
            .map(|(a, b, c)| ((*a).into(), (*b).into(), (*c).into()))
            .collect()
    }

    #[test]
    fn rolled_out_is_ready_and_counts_the_work() {
        let ds = DeploymentStatus {
            observed_generation: Some(2),
            updated_replicas: Some(2),
            ready_replicas: Some(2),
            ..DeploymentStatus::default()
        };
        let status = observed(&PeragoTaskStatus::default(), &seen(&ds, None));
        assert_eq!(
            brief(&status),
            owned(&[
                ("Ready", "True", "Available"),
                ("Reconciling", "False", "Available"),
                ("Stalled", "False", "Valid"),
            ])
        );
        assert_eq!(
            condition(&status, "Ready").message,
            "TaskDef registered; 2/2 executor pods ready"
        );
        assert_eq!(condition(&status, "Reconciling").message, "");
        assert_eq!(
            (
                status.observed_generation,
                status.queue_depth,
                status.running_attempts
            ),
            (Some(4), Some(3), Some(1))
        );
    }

    #[test]
    fn a_suspended_task_reconciles_until_its_pods_are_gone_then_is_ready() {
        let ds = DeploymentStatus::default();
        let draining = Observed {
            replicas: 0,
            suspended: Some(2),
            ..seen(&ds, None)
        };
        let status = observed(&PeragoTaskStatus::default(), &draining);
        assert_eq!(
            brief(&status),
            owned(&[
                ("Ready", "False", "Suspended"),
                ("Reconciling", "True", "Suspended"),
                ("Stalled", "False", "Suspended"),
            ])
        );
        assert_eq!(
            condition(&status, "Ready").message,
            "Suspended: 2 executor pods finishing their attempts"
        );
        let gone = Observed {
            suspended: Some(0),
            ..draining
        };
        let status = observed(&status, &gone);
        assert_eq!(
            brief(&status),
            owned(&[
                ("Ready", "True", "Suspended"),
                ("Reconciling", "False", "Suspended"),
                ("Stalled", "False", "Suspended"),
            ])
        );
        assert_eq!(
            condition(&status, "Ready").message,
            "Suspended: no executor pods; the TaskDef stays registered, 3 queued"
        );
        assert_eq!((status.replicas, status.queue_depth), (Some(0), Some(3)));
        assert!(says_reason(&status, "Ready", SUSPENDED));
    }

    #[test]
    fn a_stuck_pod_is_named_and_a_passed_deadline_stalls() {
        let problem = PodProblem {
            reason: "ImagePullBackOff".into(),
            message: "pod p-1: container body: ImagePullBackOff: no such image".into(),
        };
        let mut ds = DeploymentStatus {
            observed_generation: Some(2),
            ready_replicas: Some(0),
            ..DeploymentStatus::default()
        };
        let status = observed(&PeragoTaskStatus::default(), &seen(&ds, Some(&problem)));
        assert_eq!(
            brief(&status),
            owned(&[
                ("Ready", "False", "ImagePullBackOff"),
                ("Reconciling", "True", "ImagePullBackOff"),
                ("Stalled", "False", "Valid"),
            ])
        );
        assert!(
            condition(&status, "Ready")
                .message
                .ends_with("no such image")
        );
        ds.conditions = Some(vec![DeploymentCondition {
            type_: "Progressing".into(),
            status: "False".into(),
            reason: Some("ProgressDeadlineExceeded".into()),
            message: Some("ReplicaSet has timed out progressing".into()),
            ..DeploymentCondition::default()
        }]);
        let stalled = observed(&status, &seen(&ds, Some(&problem)));
        assert_eq!(
            brief(&stalled)[1..],
            owned(&[
                ("Reconciling", "False", "ImagePullBackOff"),
                ("Stalled", "True", "ProgressDeadlineExceeded"),
            ])[..]
        );
        assert_eq!(condition(&stalled, "Stalled").message, problem.message);
        let rolling = observed(&PeragoTaskStatus::default(), &seen(&ds, None));
        assert_eq!(
            condition(&rolling, "Stalled").message,
            "ReplicaSet has timed out progressing"
        );
        assert_eq!(condition(&rolling, "Ready").reason, "RollingOut");
    }

    #[test]
    fn invalid_and_unavailable_keep_the_rest_of_the_status() {
        let old = PeragoTaskStatus {
            replicas: Some(3),
            queue_depth: Some(9),
            ..PeragoTaskStatus::default()
        };
        let status = blocked(
            &old,
            Some(5),
            INVALID_SPEC,
            "spec.taskName: must not be empty",
        );
        assert_eq!(
            brief(&status),
            owned(&[
                ("Ready", "False", "InvalidSpec"),
                ("Reconciling", "False", "InvalidSpec"),
                ("Stalled", "True", "InvalidSpec"),
            ])
        );
        assert_eq!((status.replicas, status.queue_depth), (Some(3), Some(9)));
        assert!(says(
            &status,
            "Stalled",
            None,
            "spec.taskName: must not be empty"
        ));
        let status = conductor_unavailable(&old, Some(5), "connection refused");
        assert_eq!(
            brief(&status),
            owned(&[
                ("Ready", "False", CONDUCTOR_UNAVAILABLE),
                ("Reconciling", "True", CONDUCTOR_UNAVAILABLE),
                ("Stalled", "False", "Valid"),
            ])
        );
        assert!(says(
            &status,
            "Ready",
            Some(CONDUCTOR_UNAVAILABLE),
            "connection refused"
        ));
        assert!(
            !says(&status, "Stalled", None, ""),
            "a False Stalled says nothing"
        );
    }

    #[test]
    fn transition_times_survive_unchanged_statuses() {
        let first = blocked(&PeragoTaskStatus::default(), Some(1), INVALID_SPEC, "x");
        let mut old = first.clone();
        for c in &mut old.conditions {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        }
        let again = blocked(&old, Some(2), INVALID_SPEC, "y");
        assert!(
            again
                .conditions
                .iter()
                .all(|c| c.last_transition_time == Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
        );
        assert_eq!(condition(&again, "Ready").message, "y");
        let moved = conductor_unavailable(&old, Some(2), "z");
        assert_ne!(
            condition(&moved, "Reconciling").last_transition_time,
            Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            "Reconciling turned True: a new transition"
        );
    }
}
