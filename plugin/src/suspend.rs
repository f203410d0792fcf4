//! `kubectl perago suspend|resume TASK`: set or clear `spec.suspend`. Suspended, the task's
//! pods stop polling, finish and report what they run, and go; the TaskDef stays. `--wait`
//! waits until the operator says it is done: no pods left, or every pod ready again.

use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use serde_json::json;

use perago_api::PeragoTask;

use crate::output::Table;

#[derive(Args, Debug)]
pub struct SuspendArgs {
    /// The PeragoTask, by its name in the namespace.
    pub task: String,
    /// Wait until the operator reports it done: suspended with no pods left, or Ready again.
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits: `5m`, `90s`.
    #[arg(long, default_value = "5m", value_parser = crate::duration::parse_timeout)]
    pub timeout: Duration,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SuspendView {
    pub namespace: String,
    pub name: String,
    pub suspend: bool,
    /// False when the spec already said so and nothing was written.
    pub changed: bool,
    /// The Ready condition's message once `--wait` saw it done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
}

impl Table for SuspendView {
    fn table(&self) -> String {
        let what = if self.suspend { "suspended" } else { "resumed" };
        let mut out = format!(
            "peragotask/{} {}{}\n",
            self.name,
            what,
            if self.changed {
                ""
            } else {
                " (it already was)"
            }
        );
        if let Some(ready) = &self.ready {
            out += &format!("{ready}\n");
        }
        out
    }
}

pub async fn run(
    client: kube::Client,
    namespace: &str,
    args: &SuspendArgs,
    suspend: bool,
) -> anyhow::Result<SuspendView> {
    let api: Api<PeragoTask> = Api::namespaced(client, namespace);
    let name = &args.task;
    let task = api
        .get_opt(name)
        .await
        .map_err(|e| crate::cluster::explained(e, "get", "peragotasks", namespace))?
        .ok_or_else(|| anyhow!("PeragoTask {namespace}/{name} not found"))?;
    let changed = task.spec.suspend != suspend;
    let mut generation = task.metadata.generation;
    if changed {
        // A merge patch of the one field: whoever manages the rest of the spec (Helm, Argo
        // CD, Flux) keeps it, and `null` removes the field on resume.
        let value = if suspend { json!(true) } else { json!(null) };
        let patched = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"suspend": value}})),
            )
            .await
            .map_err(|e| crate::cluster::explained(e, "patch", "peragotasks", namespace))?;
        generation = patched.metadata.generation;
    }
    let ready = if args.wait {
        Some(wait(&api, name, generation, suspend, args.timeout).await?)
    } else {
        None
    };
    Ok(SuspendView {
        namespace: namespace.to_owned(),
        name: name.clone(),
        suspend,
        changed,
        ready,
    })
}

/// Wait until the status of `generation` says the task is done suspending (Suspended, not
/// reconciling) or resuming (Ready); the Ready condition's message.
async fn wait(
    api: &Api<PeragoTask>,
    name: &str,
    generation: Option<i64>,
    suspend: bool,
    timeout: Duration,
) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("no status yet");
    while tokio::time::Instant::now() < deadline {
        if let Some(status) = api.get(name).await?.status {
            let condition = |t: &str| status.conditions.iter().find(|c| c.type_ == t);
            let current = status.observed_generation >= generation;
            let ready = condition("Ready");
            let reconciling = condition("Reconciling").is_some_and(|c| c.status == "True");
            if let Some(ready) = ready {
                last = format!("{}: {}", ready.reason, ready.message);
                let done = if suspend {
                    ready.reason == "Suspended" && !reconciling
                } else {
                    ready.status == "True"
                };
                if current && done {
                    return Ok(ready.message.clone());
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(anyhow!(
        "PeragoTask {name} was not {} within {}; the operator last said {last}",
        if suspend { "suspended" } else { "ready" },
        crate::duration::show(timeout)
    ))
}
