//! `spec.rollout`: how a change of the executor's pods reaches them (ADR 0044), and
//! `status.rollout`: where a canary rollout stands.
//!
//! A Conductor queue is shared by every worker that polls it, so a canary's share of the work
//! is its share of the polling slots: a step is a share of the task's pods, and no traffic
//! router is needed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validate::FieldError;

/// How a change of the executor's pod template reaches the pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("self.strategy != 'Canary' || (has(self.steps) && size(self.steps) > 0 && has(self.analysis))").message("rollout.strategy Canary needs steps and an analysis"))]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// `Replace` (the default): the executor Deployment rolls all pods to the new template.
    /// `Canary`: the new template first runs in a second set of pods taking a growing share of
    /// the task's pods, step by step, judged by its attempts.
    #[serde(default)]
    pub strategy: RolloutStrategy,
    /// Canary only: the shares of the task's pods the new template takes, in order, each held
    /// for its pause once its pods are ready. After the last step the new template replaces
    /// the old one in every pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub steps: Vec<RolloutStep>,
    /// Canary only: when the canary has failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<RolloutAnalysis>,
    /// Canary only: what a failed analysis does. `Rollback` (the default) removes the canary's
    /// pods and keeps the old template; `Pause` keeps the canary at its step until a person
    /// promotes or aborts it (`kubectl perago rollout`).
    #[serde(default)]
    pub on_failure: RolloutFailurePolicy,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutStrategy {
    #[default]
    Replace,
    Canary,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutFailurePolicy {
    #[default]
    Rollback,
    Pause,
}

/// One step of a canary rollout.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStep {
    /// The canary's share of the task's pods, in percent (1–99); at least one pod while the
    /// task has any. Each step's share is larger than the one before.
    #[schemars(range(min = 1, max = 99))]
    pub weight: i32,
    /// How long the step holds once the canary's pods of this step are ready.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub pause_seconds: i64,
}

/// When a canary has failed: its attempts that failed because of the body (it exited badly,
/// was killed or ran out of memory or time, left no result, or one that breaks the result
/// schema or the post guardrails, or declared an error) over all its finished attempts. Failures
/// that are not the body's (fence refusals, lost leases, lakeFS or input errors) count neither
/// way.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAnalysis {
    /// The canary fails once this share (percent) of its finished attempts failed, counted
    /// from `minAttempts` finished attempts on. 0: any failure fails it.
    #[schemars(range(min = 0, max = 100))]
    pub max_failed_percent: i32,
    /// Finished attempts the canary needs before it is judged, and before it may replace the
    /// old template after the last step.
    #[schemars(range(min = 1))]
    pub min_attempts: i64,
}

impl RolloutSpec {
    pub fn is_canary(&self) -> bool {
        self.strategy == RolloutStrategy::Canary
    }
}

/// The rules the schema cannot say, with the field each is about.
pub fn check(rollout: &RolloutSpec) -> Result<(), FieldError> {
    if !rollout.is_canary() {
        if !rollout.steps.is_empty() || rollout.analysis.is_some() {
            return Err(FieldError::new(
                "spec.rollout.strategy",
                "steps and analysis apply to strategy: Canary only",
            ));
        }
        return Ok(());
    }
    if rollout.steps.is_empty() {
        return Err(FieldError::new(
            "spec.rollout.steps",
            "a Canary rollout needs at least one step",
        ));
    }
    let mut previous = 0;
    for (i, step) in rollout.steps.iter().enumerate() {
        if !(1..=99).contains(&step.weight) {
            return Err(FieldError::new(
                format!("spec.rollout.steps[{i}].weight"),
                format!(
                    "{}% is not a share of the pods between 1 and 99",
                    step.weight
                ),
            ));
        }
        if step.weight <= previous {
            return Err(FieldError::new(
                format!("spec.rollout.steps[{i}].weight"),
                format!(
                    "{}% does not increase on the step before ({previous}%)",
                    step.weight
                ),
            ));
        }
        if step.pause_seconds < 0 {
            return Err(FieldError::new(
                format!("spec.rollout.steps[{i}].pauseSeconds"),
                "must be >= 0",
            ));
        }
        previous = step.weight;
    }
    let Some(analysis) = &rollout.analysis else {
        return Err(FieldError::new(
            "spec.rollout.analysis",
            "a Canary rollout needs an analysis (maxFailedPercent and minAttempts)",
        ));
    };
    if !(0..=100).contains(&analysis.max_failed_percent) {
        return Err(FieldError::new(
            "spec.rollout.analysis.maxFailedPercent",
            "must be between 0 and 100",
        ));
    }
    if analysis.min_attempts < 1 {
        return Err(FieldError::new(
            "spec.rollout.analysis.minAttempts",
            "must be at least 1: a canary is judged on finished attempts",
        ));
    }
    Ok(())
}

/// Where a canary rollout stands; absent for a task that never had one.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// Where the rollout stands: `Progressing`, `Promoting`, `Completed`, `Paused`,
    /// `RolledBack` or `Aborted`.
    pub phase: RolloutPhase,
    /// The pod template the canary runs (its hash, as the Deployment records it).
    pub revision: String,
    /// The pod template the stable pods run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_revision: Option<String>,
    /// The step the canary is at (0-based); `steps` once past the last.
    #[serde(default)]
    pub step: i32,
    /// When the current step's pods were all ready: its pause counts from then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_ready_time: Option<Time>,
    /// The canary's finished attempts.
    #[serde(default)]
    pub canary: CanaryAttempts,
    /// Why the rollout stopped or what it waits for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutPhase {
    /// The canary runs and advances through the steps.
    #[default]
    Progressing,
    /// The new template replaces the old one in the stable pods; the canary goes once they are
    /// ready.
    Promoting,
    /// Every pod runs the revision.
    Completed,
    /// The analysis failed with `onFailure: Pause`: the canary stays at its step.
    Paused,
    /// The analysis failed: the canary's pods are gone and the old template runs. A new change
    /// of the pod template starts a new rollout.
    RolledBack,
    /// Aborted by hand (`kubectl perago rollout abort`): as rolled back.
    Aborted,
}

/// Attempts that the canary's pods finished, by what the analysis makes of them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryAttempts {
    /// Attempts that completed.
    pub completed: i64,
    /// Failed because of the body: these count against the canary.
    pub failed: i64,
    /// Failed for a reason that is not the body's: counted neither way.
    pub not_judged: i64,
}

impl CanaryAttempts {
    /// Attempts the analysis judges.
    pub fn judged(&self) -> i64 {
        self.completed + self.failed
    }

    /// The larger of each figure: counts that only grow, read from two sources that may each
    /// lag the other.
    pub fn max(self, other: Self) -> Self {
        Self {
            completed: self.completed.max(other.completed),
            failed: self.failed.max(other.failed),
            not_judged: self.not_judged.max(other.not_judged),
        }
    }
}

impl std::ops::Add for CanaryAttempts {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self {
            completed: self.completed + o.completed,
            failed: self.failed + o.failed,
            not_judged: self.not_judged + o.not_judged,
        }
    }
}

/// A template hash as people read it: its first 8 characters.
pub fn short(revision: &str) -> &str {
    revision.get(..8).unwrap_or(revision)
}

/// The annotation `kubectl perago rollout promote|abort` sets: `promote:<revision>` or
/// `abort:<revision>`, for the rollout of that revision only, so that an order given for one
/// rollout never acts on the next.
pub const ROLLOUT_ORDER_ANNOTATION: &str = "perago.io/rollout-order";

/// An order given by hand to the rollout of one revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutOrder {
    /// Skip the remaining steps and the analysis: replace the old template now.
    Promote,
    /// Return to the old template now.
    Abort,
}

impl RolloutOrder {
    /// The order in `annotation` if it is for `revision`.
    pub fn parse(annotation: &str, revision: &str) -> Option<Self> {
        let (order, of) = annotation.split_once(':')?;
        if of != revision {
            return None;
        }
        match order {
            "promote" => Some(Self::Promote),
            "abort" => Some(Self::Abort),
            _ => None,
        }
    }

    pub fn annotation(self, revision: &str) -> String {
        let order = match self {
            Self::Promote => "promote",
            Self::Abort => "abort",
        };
        format!("{order}:{revision}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canary(weights: &[i32]) -> RolloutSpec {
        RolloutSpec {
            strategy: RolloutStrategy::Canary,
            steps: weights
                .iter()
                .map(|&weight| RolloutStep {
                    weight,
                    pause_seconds: 60,
                })
                .collect(),
            analysis: Some(RolloutAnalysis {
                max_failed_percent: 10,
                min_attempts: 5,
            }),
            on_failure: RolloutFailurePolicy::Rollback,
        }
    }

    #[test]
    fn a_canary_needs_increasing_shares_under_100_and_an_analysis_with_a_minimum() {
        assert_eq!(check(&canary(&[10, 50])), Ok(()));
        assert_eq!(check(&RolloutSpec::default()), Ok(()));
        let refused = |spec: RolloutSpec| check(&spec).unwrap_err().to_string();
        assert_eq!(
            refused(canary(&[50, 50])),
            "spec.rollout.steps[1].weight: 50% does not increase on the step before (50%)"
        );
        assert_eq!(
            refused(canary(&[10, 120])),
            "spec.rollout.steps[1].weight: 120% is not a share of the pods between 1 and 99"
        );
        assert!(refused(canary(&[])).starts_with("spec.rollout.steps:"));
        let mut no_minimum = canary(&[10]);
        no_minimum.analysis.as_mut().unwrap().min_attempts = 0;
        assert!(refused(no_minimum).starts_with("spec.rollout.analysis.minAttempts:"));
        let mut no_analysis = canary(&[10]);
        no_analysis.analysis = None;
        assert!(refused(no_analysis).starts_with("spec.rollout.analysis:"));
        let mut replace_with_steps = canary(&[10]);
        replace_with_steps.strategy = RolloutStrategy::Replace;
        assert!(refused(replace_with_steps).starts_with("spec.rollout.strategy:"));
    }

    #[test]
    fn an_order_acts_on_the_rollout_of_its_revision_only() {
        let promote = RolloutOrder::Promote.annotation("abc");
        assert_eq!(
            RolloutOrder::parse(&promote, "abc"),
            Some(RolloutOrder::Promote)
        );
        assert_eq!(RolloutOrder::parse(&promote, "def"), None);
        assert_eq!(
            RolloutOrder::parse("abort:abc", "abc"),
            Some(RolloutOrder::Abort)
        );
        assert_eq!(RolloutOrder::parse("pause:abc", "abc"), None);
        assert_eq!(RolloutOrder::parse("garbage", "abc"), None);
    }
}
