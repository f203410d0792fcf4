//! Many one-step workflows in flight, each publishing to a lakeFS branch of its own, and what
//! became of them: the promises every fault scenario on the real node checks (nothing lost,
//! nothing published twice, no staging branch left).

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::lake::Lake;
use crate::node::BUSYBOX_BODY_IMAGE;
use crate::pod::ConductorApi;

/// Workflows of one task, started on branches made from one input commit.
pub struct Workload {
    pub repository: String,
    pub input_ref: String,
    /// Each workflow's id and its branch.
    pub workflows: Vec<(String, String)>,
}

impl Workload {
    /// Start `count` workflows of `task` (params `{"n": i}`), the i-th on the branch
    /// `<case>-<i>` made from `input_ref`.
    pub async fn start(
        lake: &Lake,
        conductor: &ConductorApi,
        task: &str,
        (repository, input_ref): (&str, &str),
        case: &str,
        count: usize,
    ) -> Result<Self> {
        let mut workflows = Vec::with_capacity(count);
        for i in 0..count {
            let branch = format!("{case}-{i:03}");
            lake.post(
                &format!("/repositories/{repository}/branches"),
                json!({"name": branch, "source": input_ref}),
            )
            .await?;
            let id = conductor
                .start(
                    task,
                    &branch,
                    json!({
                        "workspace": {"repository": repository, "branch": branch, "refType": "commit", "ref": input_ref},
                        "params": {"n": i},
                    }),
                )
                .await;
            workflows.push((id, branch));
        }
        Ok(Self {
            repository: repository.to_owned(),
            input_ref: input_ref.to_owned(),
            workflows,
        })
    }

    /// How many workflows are no longer running.
    pub async fn finished(&self, conductor: &ConductorApi) -> usize {
        let mut finished = 0;
        for (id, _) in &self.workflows {
            finished += usize::from(conductor.workflow(id).await["status"] != "RUNNING");
        }
        finished
    }

    /// Wait until every workflow finished; how long that took.
    pub async fn wait_finished(
        &self,
        conductor: &ConductorApi,
        limit: Duration,
    ) -> Result<Duration> {
        let started = Instant::now();
        loop {
            let finished = self.finished(conductor).await;
            if finished == self.workflows.len() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > limit {
                bail!(
                    "{finished} of {} workflows finished after {limit:?}",
                    self.workflows.len()
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// What became of the workflows, once they finished. A workflow is lost unless it
    /// COMPLETED; it is duplicated unless its branch holds exactly one commit on the input and
    /// the workflow's output names that commit (a retry that finds its result already
    /// published completes on it without a second commit).
    pub async fn outcome(&self, lake: &Lake, conductor: &ConductorApi) -> Result<Outcome> {
        let mut outcome = Outcome {
            workflows: self.workflows.len(),
            ..Outcome::default()
        };
        for (id, branch) in &self.workflows {
            let workflow = conductor.workflow(id).await;
            let tasks = workflow["tasks"].as_array().cloned().unwrap_or_default();
            outcome.attempts += tasks.len();
            outcome.failed_attempts += tasks.iter().filter(|t| t["status"] != "COMPLETED").count();
            for task in &tasks {
                if let Some(worker) = task["workerId"].as_str() {
                    outcome.workers.insert(worker.to_owned());
                }
            }
            if workflow["status"] != "COMPLETED" {
                outcome
                    .lost
                    .push(format!("{branch}: {}", workflow["status"]));
                continue;
            }
            outcome.completed += 1;
            let log = lake
                .get(&format!(
                    "/repositories/{}/refs/{branch}/commits?amount=3",
                    self.repository
                ))
                .await?;
            let commits = log["results"].as_array().cloned().unwrap_or_default();
            let head = commits.first().map_or(&Value::Null, |c| &c["id"]);
            let output = tasks
                .last()
                .map_or(&Value::Null, |t| &t["outputData"]["workspace"]["ref"]);
            let once = commits
                .get(1)
                .is_some_and(|c| c["id"] == json!(self.input_ref))
                && commits[0]["parents"] == json!([self.input_ref])
                && output == head;
            if !once {
                outcome
                    .duplicated
                    .push(format!("{branch}: output {output}, history {log}"));
            }
        }
        let staging = lake
            .get(&format!(
                "/repositories/{}/branches?prefix=perago-staging-&amount=1000",
                self.repository
            ))
            .await?;
        outcome.staging_left = staging["results"].as_array().map_or(0, Vec::len);
        Ok(outcome)
    }
}

/// What became of a [`Workload`].
#[derive(Debug, Default)]
pub struct Outcome {
    pub workflows: usize,
    pub completed: usize,
    pub attempts: usize,
    /// Attempts that did not complete (failed, timed out, cancelled).
    pub failed_attempts: usize,
    /// Workflows that did not complete, with their status.
    pub lost: Vec<String>,
    /// Workflows whose branch does not hold exactly their one publication.
    pub duplicated: Vec<String>,
    pub staging_left: usize,
    /// The executor pods (worker ids) that ran attempts.
    pub workers: BTreeSet<String>,
}

impl Outcome {
    /// Nothing lost, nothing published twice, no staging branch left.
    pub fn holds_the_promises(&self) -> bool {
        self.lost.is_empty() && self.duplicated.is_empty() && self.staging_left == 0
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} workflows, {} completed, {} attempts ({} failed or timed out), {} lost, {} duplicated, \
             {} staging branches left, {} pods",
            self.workflows,
            self.completed,
            self.attempts,
            self.failed_attempts,
            self.lost.len(),
            self.duplicated.len(),
            self.staging_left,
            self.workers.len()
        )?;
        for line in self.lost.iter().chain(&self.duplicated) {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

/// A workspace task whose body is `sh -c script` on busybox, with `spec` merged into its spec.
pub fn workspace_task_with(
    namespace: &str,
    name: &str,
    script: &str,
    spec: &serde_json::Value,
) -> String {
    let mut task = json!({
        "apiVersion": "perago.io/v1alpha1",
        "kind": "PeragoTask",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "taskName": format!("{namespace}.{name}"),
            "ownerEmail": "e2e@example.com",
            "workspace": {"prefix": "/data"},
            "paramsSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            "resultSchema": {"type": "object", "properties": {"files": {"type": "integer"}}, "required": ["files"]},
            "controls": {
                "retry": {"count": 2, "logic": "FIXED", "delaySeconds": 0},
                "timeout": {"policy": "RETRY", "seconds": 120, "responseSeconds": 30},
            },
            "executor": {
                "slots": 1,
                "body": {"image": BUSYBOX_BODY_IMAGE, "command": ["sh", "-c", script]},
            },
        },
    });
    merge(&mut task["spec"], spec);
    task.to_string()
}

/// JSON merge patch (RFC 7386) of `patch` into `target`.
pub fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match patch.as_object() {
        Some(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (key, value) in fields {
                if value.is_null() {
                    if let Some(target) = target.as_object_mut() {
                        target.remove(key);
                    }
                } else {
                    merge(&mut target[key], value);
                }
            }
        }
        None => *target = patch.clone(),
    }
}
