//! `kubectl perago rollout status|promote|abort TASK`: where a task's canary rollout stands
//! (`status.rollout`, docs/rollouts.md), and the two orders a person gives it. An order is the
//! `perago.io/rollout-order` annotation naming the template it is for, so that it never acts on
//! a later rollout; the operator carries it out at its next reconcile.

use anyhow::anyhow;
use clap::{Args, Subcommand};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use serde_json::json;

use perago_api::PeragoTask;
use perago_api::rollout::{
    CanaryAttempts, ROLLOUT_ORDER_ANNOTATION, RolloutOrder, RolloutPhase, RolloutStatus, short,
};

use crate::output::Table;

#[derive(Args, Debug)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub action: RolloutAction,
}

#[derive(Subcommand, Debug)]
pub enum RolloutAction {
    /// Where the task's canary rollout stands: its phase, step, the canary's attempts and why
    /// it stopped. Exit status 1 when it waits for a person or was rolled back.
    Status(RolloutTask),
    /// Skip the remaining steps and the analysis: the new template replaces the old one now.
    Promote(RolloutTask),
    /// Return to the old template now: the canary's pods finish, report and go.
    Abort(RolloutTask),
}

#[derive(Args, Debug)]
pub struct RolloutTask {
    /// The PeragoTask, by its name in the namespace.
    pub task: String,
}

impl RolloutAction {
    fn task(&self) -> &str {
        match self {
            Self::Status(t) | Self::Promote(t) | Self::Abort(t) => &t.task,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutView {
    pub namespace: String,
    pub name: String,
    /// `Replace` or `Canary`.
    pub strategy: String,
    /// The canary steps' shares, in percent.
    pub steps: Vec<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// The order written, for `promote` and `abort`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordered: Option<String>,
}

impl RolloutView {
    /// Whether the rollout waits for a person, or was rolled back: the exit status says so.
    pub fn flagged(&self) -> bool {
        self.rollout
            .as_ref()
            .is_some_and(|r| matches!(r.phase, RolloutPhase::Paused | RolloutPhase::RolledBack))
    }
}

fn attempts(a: &CanaryAttempts) -> String {
    format!(
        "{} completed, {} failed in the body, {} not judged",
        a.completed, a.failed, a.not_judged
    )
}

impl Table for RolloutView {
    fn table(&self) -> String {
        let mut out = format!(
            "peragotask/{} (namespace {}), strategy {}",
            self.name, self.namespace, self.strategy
        );
        if !self.steps.is_empty() {
            let steps: Vec<String> = self.steps.iter().map(|w| format!("{w}%")).collect();
            out += &format!(", steps {}", steps.join(" → "));
        }
        out += "\n";
        if let Some(order) = &self.ordered {
            out += &format!("ordered: {order}\n");
        }
        let Some(r) = &self.rollout else {
            out += "no canary rollout on record\n";
            return out;
        };
        let step = match r.phase {
            RolloutPhase::Progressing | RolloutPhase::Paused => {
                format!(
                    ", step {}/{}",
                    (r.step + 1).min(self.steps.len() as i32),
                    self.steps.len()
                )
            }
            _ => String::new(),
        };
        out += &format!(
            "phase:    {:?}{step}\ncanary:   template {}\nstable:   template {}\nattempts: {}\n",
            r.phase,
            short(&r.revision),
            r.stable_revision.as_deref().map_or("-", short),
            attempts(&r.canary),
        );
        if !r.message.is_empty() {
            out += &format!("message:  {}\n", r.message);
        }
        out
    }
}

pub async fn run(
    client: kube::Client,
    namespace: &str,
    args: &RolloutArgs,
) -> anyhow::Result<RolloutView> {
    let api: Api<PeragoTask> = Api::namespaced(client, namespace);
    let name = args.action.task();
    let task = api
        .get_opt(name)
        .await
        .map_err(|e| crate::cluster::explained(e, "get", "peragotasks", namespace))?
        .ok_or_else(|| anyhow!("PeragoTask {namespace}/{name} not found"))?;
    let spec = task.spec.rollout.clone().unwrap_or_default();
    let rollout = task.status.and_then(|s| s.rollout);
    let order = match &args.action {
        RolloutAction::Status(_) => None,
        RolloutAction::Promote(_) => Some(RolloutOrder::Promote),
        RolloutAction::Abort(_) => Some(RolloutOrder::Abort),
    };
    let ordered = match order {
        None => None,
        Some(order) => {
            let Some(r) = rollout
                .as_ref()
                .filter(|r| matches!(r.phase, RolloutPhase::Progressing | RolloutPhase::Paused))
            else {
                let last = rollout.as_ref().map_or_else(
                    || "none on record".to_owned(),
                    |r| {
                        format!(
                            "the last one, of template {}, is {:?}",
                            short(&r.revision),
                            r.phase
                        )
                    },
                );
                return Err(anyhow!(
                    "PeragoTask {namespace}/{name} has no canary rollout in progress to {} ({last})",
                    if order == RolloutOrder::Promote {
                        "promote"
                    } else {
                        "abort"
                    },
                ));
            };
            let value = order.annotation(&r.revision);
            // A merge patch of the one annotation: whoever manages the rest keeps it.
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {ROLLOUT_ORDER_ANNOTATION: value}}}),
                ),
            )
            .await
            .map_err(|e| crate::cluster::explained(e, "patch", "peragotasks", namespace))?;
            Some(format!(
                "{} the rollout of template {}; the operator carries it out at its next reconcile",
                if order == RolloutOrder::Promote {
                    "promote"
                } else {
                    "abort"
                },
                short(&r.revision)
            ))
        }
    };
    Ok(RolloutView {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        strategy: format!("{:?}", spec.strategy),
        steps: spec.steps.iter().map(|s| s.weight).collect(),
        rollout,
        ordered,
    })
}
