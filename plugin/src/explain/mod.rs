//! `kubectl perago explain`: what became of each attempt of a workflow's workspace steps. For
//! every attempt it sets Conductor's record beside what lakeFS holds (the attempt's staging
//! branch and try commit while they exist, its confirm commit on the target branch's
//! first-parent history) and gives one verdict. It only reads: an uncertain attempt is settled
//! by the next attempt's publish fence, or by the operator starting a new workflow from the
//! branch head; never by this command.
//!
//! The command reads the workflow from Conductor ([`run`]), sets each attempt's record beside
//! what lakeFS holds (`view`), decides its verdict as data (`decide`) and words it: the
//! verdict's English and JSON (`words`), the whole view as a table (`table`).

use anyhow::anyhow;
use clap::Args;
use serde_json::Value;

use perago_conductor::WorkflowTask;

use crate::Failure;
use crate::connect::Endpoints;

#[cfg(test)]
mod cases;
mod decide;
mod table;
mod view;
mod words;

pub use decide::{
    Base, FenceKind, Next, Progress, SearchGap, Settlement, Staged, Verdict, VerdictKind,
};
pub use view::{
    Attempt, AttemptView, ExplainView, SearchView, StagingView, StepView, WorkspaceView, utc,
};

use decide::decide;
use view::Reader;

/// How many commits of the target branch's first-parent history are searched for an
/// attempt's confirm commit, from the head down to the attempt's input ref.
pub const SEARCH_LIMIT: usize = 1000;

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// The Conductor workflow id.
    pub workflow_id: String,
    /// Only this step: its referenceTaskName (inside a loop, every iteration of it).
    #[arg(long)]
    pub step: Option<String>,
}

pub async fn run(endpoints: &Endpoints, args: &ExplainArgs) -> Result<ExplainView, Failure> {
    let conductor = endpoints.require_conductor()?;
    let id = args.workflow_id.as_str();
    let workflow = match conductor.workflow(id).await {
        Ok(w) => w,
        Err(e) if e.is_not_found() => {
            return Err(anyhow!("Conductor has no workflow {id} (get workflow: HTTP 404)").into());
        }
        Err(e) => {
            return Err(anyhow::Error::from(e)
                .context(format!("workflow {id}"))
                .into());
        }
    };
    let workspace_tasks: Vec<&WorkflowTask> = workflow
        .tasks
        .iter()
        .filter(|t| t.input_data.get("workspace").is_some_and(Value::is_object))
        .collect();
    let mut order: Vec<&str> = Vec::new();
    for t in &workspace_tasks {
        if !order.contains(&t.reference_task_name.as_str()) {
            order.push(&t.reference_task_name);
        }
    }
    let chosen: Vec<&str> = match &args.step {
        None => order.clone(),
        Some(step) => order
            .iter()
            .copied()
            .filter(|name| is_step(name, step))
            .collect(),
    };
    if chosen.is_empty() {
        let known = if order.is_empty() {
            "it has none".to_owned()
        } else {
            format!("its workspace steps: {}", order.join(", "))
        };
        return Err(match &args.step {
            Some(step) => anyhow!("workflow {id} has no workspace step {step} ({known})"),
            None => anyhow!("workflow {id} has no workspace step: no task input has a workspace"),
        }
        .into());
    }
    let lakefs = endpoints.lakefs()?;
    let mut reader = Reader::new(&lakefs);
    let mut steps = Vec::new();
    for name in chosen {
        let tasks: Vec<&WorkflowTask> = workspace_tasks
            .iter()
            .copied()
            .filter(|t| t.reference_task_name == name)
            .collect();
        let mut attempts = Vec::new();
        for task in &tasks {
            attempts.push(reader.attempt(&workflow, task).await?);
        }
        steps.push(StepView {
            step: name.to_owned(),
            task_type: tasks
                .first()
                .map(|t| t.task_type.clone())
                .unwrap_or_default(),
            attempts: judged(attempts),
        });
    }
    Ok(ExplainView {
        workflow_id: workflow.workflow_id.clone(),
        workflow_name: workflow.workflow_name.clone(),
        status: workflow.status.clone(),
        steps,
    })
}

/// A step's attempts, in order, each with its verdict.
fn judged(attempts: Vec<Attempt>) -> Vec<AttemptView> {
    let verdicts: Vec<Verdict> = (0..attempts.len())
        .map(|i| decide(&attempts[i], attempts.get(i + 1)))
        .collect();
    attempts
        .into_iter()
        .zip(verdicts)
        .map(|(record, verdict)| AttemptView { record, verdict })
        .collect()
}

/// `--step build` also selects the iterations of `build` inside a loop (`build__2`).
fn is_step(name: &str, step: &str) -> bool {
    name == step
        || name
            .strip_prefix(step)
            .and_then(|rest| rest.strip_prefix("__"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_select_their_loop_iterations() {
        assert!(is_step("build", "build"));
        assert!(is_step("build__2", "build"));
        assert!(!is_step("build__x", "build"));
        assert!(!is_step("build2", "build"));
    }
}
