//! `kubectl perago status TASK`: one screen on a PeragoTask, from what the cluster knows (its
//! spec, conditions and executor pods, each pod's busy slots through the API server's pod
//! proxy) and what Conductor knows (the queue, the latest attempts). A part that cannot be
//! read is named under `unread`, and the rest is still shown.

use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use perago_api::PeragoTask;
use perago_api::pod::TASK_LABEL;
use perago_conductor::{ConductorClient, queue_name};
use perago_lakefs::LakeFsClient;
use perago_workspace::publication::Key;

use crate::output::{Table, cell, columns};
use perago_workspace::janitor::human as age;

/// The sidecar's port for `/metrics` and `/slots`.
const SIDECAR_PORT: u16 = 9464;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The PeragoTask, by its name in the namespace.
    pub task: String,
    /// How many of the task type's latest attempts to show.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub attempts: u32,
    /// Print the status again every 2 seconds until interrupted.
    #[arg(short = 'w', long)]
    pub watch: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    pub task: Summary,
    pub conditions: Vec<ConditionRow>,
    pub pods: Vec<PodRow>,
    /// Conductor's queue of the task type (its domain's, for a task routed to one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueRow>,
    /// The task type's latest attempts, newest first.
    pub attempts: Vec<AttemptRow>,
    /// What the latest attempts published (a workspace task's new commits), newest first.
    pub publications: Vec<PublicationRow>,
    /// What could not be read, and why.
    pub unread: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub namespace: String,
    pub name: String,
    pub task_type: String,
    pub image: String,
    pub mode: String,
    pub slots: i32,
    /// `3`, or `autoscaled 0-10 (4 queued per pod)`.
    pub replicas: String,
    /// The workspace's prefix and whether it is read-only; `none` for a workspace-free task.
    pub workspace: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    pub suspended: bool,
    pub generation: Option<i64>,
    pub observed_generation: Option<i64>,
    /// The operator's last change of replicas, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_scale: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionRow {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    /// Seconds since the last transition.
    pub age_seconds: Option<u64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRow {
    pub name: String,
    pub phase: String,
    /// Containers ready, of all (the sidecar included).
    pub ready: String,
    pub restarts: i32,
    /// Attempts running, as the pod's sidecar says (`None`: not asked or no answer).
    pub busy: Option<i64>,
    pub slots: i32,
    pub stopping: bool,
    pub age_seconds: Option<u64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueRow {
    pub name: String,
    pub queued: i64,
    /// Attempts running in the task's pods: their sidecars' count when every running pod
    /// answered, else the operator's last.
    pub running: Option<i64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRow {
    pub workflow_id: String,
    pub task_id: String,
    pub retry: i64,
    pub status: String,
    /// The worker id: the pod that ran it.
    pub worker: String,
    /// When it started (UTC), if it has.
    pub started: Option<String>,
    pub seconds: Option<f64>,
    pub reason: String,
}

/// A commit an attempt published: its output ref where it differs from its input ref.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicationRow {
    pub workflow_id: String,
    pub repository: String,
    pub branch: String,
    pub commit: String,
    /// The commit's `perago.*` metadata, as lakeFS holds it (empty when lakeFS was not read).
    pub metadata: std::collections::BTreeMap<String, String>,
}

/// What `status` reads, gathered for one view.
pub struct Sources<'a> {
    pub client: kube::Client,
    pub namespace: String,
    pub conductor: Option<&'a ConductorClient>,
    /// Why the task's own Conductor could not be found, when none was given.
    pub conductor_unfound: Option<String>,
    /// For the `perago.*` metadata of a workspace task's publications.
    pub lakefs: Option<&'a LakeFsClient>,
    pub timeout: Duration,
}

pub async fn run(sources: &Sources<'_>, args: &StatusArgs) -> anyhow::Result<StatusView> {
    let (ns, name) = (&sources.namespace, &args.task);
    let tasks: Api<PeragoTask> = Api::namespaced(sources.client.clone(), ns);
    let task = tasks
        .get_opt(name)
        .await
        .map_err(|e| crate::cluster::explained(e, "get", "peragotasks", ns))?
        .ok_or_else(|| anyhow!("PeragoTask {ns}/{name} not found (kubectl get ptask -n {ns})"))?;
    let mut unread = Vec::new();
    let pods = match pods(sources, &task).await {
        Ok(pods) => pods,
        Err(e) => {
            unread.push(format!("pods: {e:#}"));
            Vec::new()
        }
    };
    if pods
        .iter()
        .any(|p| p.busy.is_none() && !p.stopping && p.phase == "Running")
    {
        unread.push(
            "busy slots of some pods: the API server's pod proxy (pods/proxy) gave no answer"
                .into(),
        );
    }
    let (mut queue, tasks) = match sources.conductor {
        Some(conductor) => conductor_side(conductor, &task, args.attempts, &mut unread).await,
        None => {
            let why = sources
                .conductor_unfound
                .as_deref()
                .unwrap_or("give --conductor-url or CONDUCTOR_SERVER_URL");
            unread.push(format!("queue and attempts: no Conductor ({why})"));
            (None, Vec::new())
        }
    };
    let attempts = tasks.iter().map(attempt).collect();
    let publications = publications(sources.lakefs, &tasks, &mut unread).await;
    // The pods' own count is newer than the operator's, when every running pod answered.
    let answered = pods.iter().filter(|p| p.phase == "Running" && !p.stopping);
    if let (Some(q), Some(busy)) = (
        queue.as_mut(),
        answered.map(|p| p.busy).sum::<Option<i64>>(),
    ) {
        q.running = Some(busy);
    }
    Ok(StatusView {
        task: summary(&task),
        conditions: conditions(&task),
        pods,
        queue,
        attempts,
        publications,
        unread,
    })
}

/// The commits the completed attempts among `tasks` published, each with its `perago.*`
/// metadata read from lakeFS (at most one call per publication).
async fn publications(
    lakefs: Option<&LakeFsClient>,
    tasks: &[Value],
    unread: &mut Vec<String>,
) -> Vec<PublicationRow> {
    let mut rows: Vec<PublicationRow> = tasks
        .iter()
        .filter(|t| t["status"] == "COMPLETED")
        .filter_map(|t| {
            let input = &t["inputData"]["workspace"];
            let output = &t["outputData"]["workspace"];
            let commit = output["ref"].as_str()?;
            (commit != input["ref"].as_str()?).then(|| PublicationRow {
                workflow_id: t["workflowInstanceId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                repository: output["repository"].as_str().unwrap_or_default().to_owned(),
                branch: output["branch"].as_str().unwrap_or_default().to_owned(),
                commit: commit.to_owned(),
                metadata: Default::default(),
            })
        })
        .collect();
    if rows.is_empty() {
        return rows;
    }
    let Some(lakefs) = lakefs else {
        unread.push(
            "publications' metadata: no lakeFS (--lakefs-endpoint and its keys, or the task's own)"
                .into(),
        );
        return rows;
    };
    for row in &mut rows {
        match lakefs.get_commit(&row.repository, &row.commit).await {
            Ok(commit) => {
                row.metadata = commit
                    .metadata
                    .into_iter()
                    .filter(|(k, _)| k.starts_with("perago."))
                    .collect();
            }
            Err(e) => {
                unread.push(format!("publication {}: {e}", row.commit));
                break;
            }
        }
    }
    rows
}

fn summary(task: &PeragoTask) -> Summary {
    let spec = &task.spec;
    let exec = &spec.executor;
    let replicas = match &exec.autoscaling {
        Some(a) => format!(
            "autoscaled {}-{} ({} queued per pod)",
            a.min_replicas, a.max_replicas, a.target_queue_depth
        ),
        None => exec.replicas.to_string(),
    };
    let workspace = match &spec.workspace {
        Some(w) if w.read_only => format!("{} (read-only)", w.prefix),
        Some(w) => w.prefix.clone(),
        None => "none".into(),
    };
    let status = task.status.as_ref();
    Summary {
        namespace: task.namespace().unwrap_or_default(),
        name: task.name_any(),
        task_type: spec.task_name.clone(),
        image: exec.body.image.clone(),
        mode: serde_json::to_value(exec.body.mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        slots: exec.slots,
        replicas,
        workspace,
        domain: spec.domain().map(str::to_owned),
        suspended: spec.suspend,
        generation: task.metadata.generation,
        observed_generation: status.and_then(|s| s.observed_generation),
        last_scale: status.and_then(|s| s.last_scale.as_ref()).map(|d| {
            format!(
                "{} -> {} {} ago: {}",
                d.from,
                d.to,
                age_of_micro(&d.time.0).map_or_else(|| "?".into(), age),
                d.reason
            )
        }),
    }
}

fn since(time: &Time) -> Option<u64> {
    let now = k8s_openapi::jiff::Timestamp::now();
    u64::try_from(now.duration_since(time.0).as_secs()).ok()
}

fn age_of_micro(time: &k8s_openapi::jiff::Timestamp) -> Option<Duration> {
    let now = k8s_openapi::jiff::Timestamp::now();
    u64::try_from(now.duration_since(*time).as_secs())
        .ok()
        .map(Duration::from_secs)
}

fn conditions(task: &PeragoTask) -> Vec<ConditionRow> {
    let Some(status) = &task.status else {
        return Vec::new();
    };
    status
        .conditions
        .iter()
        .map(|c| ConditionRow {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            age_seconds: since(&c.last_transition_time),
        })
        .collect()
}

/// The task's executor pods, oldest first, each with its busy slots when its sidecar answers
/// through the API server's proxy.
async fn pods(sources: &Sources<'_>, task: &PeragoTask) -> anyhow::Result<Vec<PodRow>> {
    let ns = &sources.namespace;
    let api: Api<Pod> = Api::namespaced(sources.client.clone(), ns);
    let selector = format!("{TASK_LABEL}={}", task.name_any());
    let mut pods = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| crate::cluster::explained(e, "list", "pods", ns))?
        .items;
    pods.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let asks = pods.iter().map(|pod| async {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let stopping = pod.metadata.deletion_timestamp.is_some();
        let busy = if running && !stopping {
            busy(sources, &pod.name_any()).await
        } else {
            None
        };
        row(pod, busy, task.spec.executor.slots)
    });
    Ok(futures_util::future::join_all(asks).await)
}

fn row(pod: &Pod, busy: Option<i64>, slots: i32) -> PodRow {
    let status = pod.status.as_ref();
    let containers = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        // The sidecar is a native sidecar: an init container that keeps running.
        .chain(
            status
                .and_then(|s| s.init_container_statuses.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| c.name == crate::cluster::SIDECAR),
        );
    let (mut ready, mut all, mut restarts) = (0, 0, 0);
    for c in containers {
        all += 1;
        ready += i32::from(c.ready);
        restarts += c.restart_count;
    }
    PodRow {
        name: pod.name_any(),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Unknown".into()),
        ready: format!("{ready}/{all}"),
        restarts,
        busy,
        slots,
        stopping: pod.metadata.deletion_timestamp.is_some(),
        age_seconds: pod.metadata.creation_timestamp.as_ref().and_then(since),
    }
}

/// A pod's busy slots, from its sidecar's `/slots` through the API server's pod proxy.
async fn busy(sources: &Sources<'_>, pod: &str) -> Option<i64> {
    let path = format!(
        "/api/v1/namespaces/{}/pods/{pod}:{SIDECAR_PORT}/proxy/slots",
        sources.namespace
    );
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let answer = tokio::time::timeout(sources.timeout, sources.client.request_text(request))
        .await
        .ok()?
        .ok()?;
    serde_json::from_str::<Value>(&answer).ok()?["busy"].as_i64()
}

/// The queue and the latest attempts, from Conductor; what fails goes to `unread`.
async fn conductor_side(
    conductor: &ConductorClient,
    task: &PeragoTask,
    count: u32,
    unread: &mut Vec<String>,
) -> (Option<QueueRow>, Vec<Value>) {
    let task_type = &task.spec.task_name;
    let domain = task.spec.domain();
    let queue = match conductor.queue_size(task_type, domain).await {
        Ok(queued) => Some(QueueRow {
            name: queue_name(task_type, domain),
            queued,
            running: task.status.as_ref().and_then(|s| s.running_attempts),
        }),
        Err(e) => {
            unread.push(format!("queue: {e} (Conductor {})", conductor.base_url()));
            None
        }
    };
    if count == 0 {
        return (queue, Vec::new());
    }
    let attempts = match conductor.recent_tasks(task_type, count).await {
        Ok(tasks) => tasks,
        Err(e) => {
            unread.push(format!(
                "attempts: {e} (Conductor {})",
                conductor.base_url()
            ));
            Vec::new()
        }
    };
    (queue, attempts)
}

fn attempt(task: &Value) -> AttemptRow {
    let text = |key: &str| task[key].as_str().unwrap_or_default().to_owned();
    let millis = |key: &str| task[key].as_i64().filter(|ms| *ms > 0);
    let started = millis("startTime");
    let seconds = match (started, millis("endTime")) {
        #[allow(clippy::cast_precision_loss)]
        (Some(start), Some(end)) if end >= start => Some((end - start) as f64 / 1000.0),
        _ => None,
    };
    AttemptRow {
        workflow_id: text("workflowInstanceId"),
        task_id: text("taskId"),
        retry: task["retryCount"].as_i64().unwrap_or(0),
        status: text("status"),
        worker: text("workerId"),
        started: started.and_then(|ms| {
            k8s_openapi::jiff::Timestamp::from_millisecond(ms)
                .ok()
                .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        }),
        seconds,
        reason: text("reasonForIncompletion"),
    }
}

impl Table for StatusView {
    fn table(&self) -> String {
        let t = &self.task;
        let mut out = format!(
            "PeragoTask {}/{}: task type {}{}\n",
            t.namespace,
            t.name,
            t.task_type,
            t.domain
                .as_ref()
                .map_or_else(String::new, |d| format!(" (domain {d})"))
        );
        out += &format!("  body       {} ({})\n", cell(&t.image, 120), t.mode);
        out += &format!("  pods       {}, {} slots each\n", t.replicas, t.slots);
        out += &format!("  workspace  {}\n", cell(&t.workspace, 120));
        if t.suspended {
            out += "  suspended  yes: kubectl perago resume to start it again\n";
        }
        let generation = |g: Option<i64>| g.map_or_else(|| "-".into(), |g| g.to_string());
        out += &format!(
            "  generation {} (observed {})\n",
            generation(t.generation),
            generation(t.observed_generation)
        );
        if let Some(scale) = &t.last_scale {
            out += &format!("  last scale {}\n", cell(scale, 160));
        }
        out += "\nConditions:\n";
        if self.conditions.is_empty() {
            out += "  none yet: the operator has not reconciled this task (is it running?)\n";
        } else {
            let rows: Vec<Vec<String>> = self
                .conditions
                .iter()
                .map(|c| {
                    vec![
                        c.type_.clone(),
                        c.status.clone(),
                        cell(&c.reason, 40),
                        c.age_seconds
                            .map_or_else(|| "-".into(), |s| age(Duration::from_secs(s))),
                        cell(&c.message, 160),
                    ]
                })
                .collect();
            out += &indent(&columns(
                &["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
                &rows,
            ));
        }
        out += "\nPods:\n";
        if self.pods.is_empty() {
            out += "  none\n";
        } else {
            let rows: Vec<Vec<String>> = self
                .pods
                .iter()
                .map(|p| {
                    let phase = if p.stopping {
                        "Stopping".to_owned()
                    } else {
                        p.phase.clone()
                    };
                    vec![
                        cell(&p.name, 63),
                        phase,
                        p.ready.clone(),
                        p.restarts.to_string(),
                        format!(
                            "{}/{}",
                            p.busy.map_or_else(|| "-".into(), |b| b.to_string()),
                            p.slots
                        ),
                        p.age_seconds
                            .map_or_else(|| "-".into(), |s| age(Duration::from_secs(s))),
                    ]
                })
                .collect();
            out += &indent(&columns(
                &["NAME", "PHASE", "READY", "RESTARTS", "BUSY", "AGE"],
                &rows,
            ));
        }
        if let Some(q) = &self.queue {
            out += &format!(
                "\nQueue {}: {} queued, {} running\n",
                q.name,
                q.queued,
                q.running.map_or_else(|| "-".into(), |r| r.to_string())
            );
        }
        if !self.attempts.is_empty() {
            out += "\nLatest attempts:\n";
            let rows: Vec<Vec<String>> = self
                .attempts
                .iter()
                .map(|a| {
                    vec![
                        a.workflow_id.clone(),
                        a.retry.to_string(),
                        a.status.clone(),
                        cell(&a.worker, 63),
                        a.started.clone().unwrap_or_else(|| "-".into()),
                        a.seconds.map_or_else(|| "-".into(), |s| format!("{s:.1}s")),
                        cell(&a.reason, 100),
                    ]
                })
                .collect();
            out += &indent(&columns(
                &[
                    "WORKFLOW", "RETRY", "STATUS", "WORKER", "STARTED", "TOOK", "REASON",
                ],
                &rows,
            ));
        }
        if !self.publications.is_empty() {
            out += "\nLatest publications:\n";
            let rows: Vec<Vec<String>> = self
                .publications
                .iter()
                .map(|p| {
                    let meta = |k: &str| p.metadata.get(k).cloned().unwrap_or_else(|| "-".into());
                    vec![
                        crate::output::short(&p.commit),
                        cell(&format!("{}@{}", p.repository, p.branch), 80),
                        p.workflow_id.clone(),
                        meta(Key::RetryCount.wire()),
                        meta(Key::Phase.wire()),
                    ]
                })
                .collect();
            out += &indent(&columns(
                &["COMMIT", "BRANCH", "WORKFLOW", "RETRY", "PHASE"],
                &rows,
            ));
        }
        if !self.unread.is_empty() {
            out += "\nNot read:\n";
            for u in &self.unread {
                out += &format!("  {}\n", cell(u, 300));
            }
        }
        out
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// Read the view again and again, `every` apart, printing each with `print`.
pub async fn watch(
    sources: &Sources<'_>,
    args: &StatusArgs,
    mut print: impl FnMut(&StatusView) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    loop {
        let view = run(sources, args).await.context("reading the status")?;
        print(&view)?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_attempt_reads_from_a_conductor_task() {
        let row = attempt(&json!({
            "workflowInstanceId": "wf", "taskId": "t", "retryCount": 1, "status": "FAILED",
            "workerId": "pod-a", "startTime": 1_796_581_742_803_i64, "endTime": 1_796_581_743_546_i64,
            "reasonForIncompletion": "body exited 3"}));
        assert_eq!(
            (row.status.as_str(), row.worker.as_str(), row.retry),
            ("FAILED", "pod-a", 1)
        );
        assert_eq!(row.started.as_deref(), Some("2026-12-06T18:29:02Z"));
        assert_eq!(row.seconds, Some(0.743));
        let scheduled = attempt(&json!({"status": "SCHEDULED", "startTime": 0, "endTime": 0}));
        assert_eq!((scheduled.started, scheduled.seconds), (None, None));
    }
}
