//! OpenLineage run events of each attempt (ADR 0043), when `PERAGO_OPENLINEAGE_URL` is set.
//!
//! An attempt is one run of the job named by its task type: START when its body starts, then
//! COMPLETE or FAIL when it ends. An attempt that ends before its body starts sends START
//! right before its FAIL, so every run is START and then one of the two. The input dataset is
//! the lakeFS commit the workspace was projected from; the output dataset the commit the
//! attempt published (none when it published nothing: a read-only task, an unchanged
//! workspace). A FAIL carries the failure as an `errorMessage` run facet, and every event a
//! `parent` run facet naming the workflow run, whose id is derived from the workflow instance
//! id as the run's trace id is (ADR 0041).
//!
//! Delivery never holds an attempt up ([`crate::delivery`]): events go to a bounded queue
//! and a background task POSTs them one by one, in order, each within the timeout; what does
//! not fit or is not accepted is dropped and counted
//! (`perago_sidecar_openlineage_events_dropped_total`).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tracing::info;

use crate::delivery::{Background, BoundedQueue, ExportCounters};
use perago_workspace::reference::WorkspaceRef;

/// The OpenLineage spec version the events follow.
pub const SCHEMA_URL: &str = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent";
/// The facets' schemas.
pub const PARENT_FACET_SCHEMA_URL: &str =
    "https://openlineage.io/spec/facets/1-2-0/ParentRunFacet.json#/$defs/ParentRunFacet";
pub const ERROR_FACET_SCHEMA_URL: &str = "https://openlineage.io/spec/facets/1-0-1/ErrorMessageRunFacet.json#/$defs/ErrorMessageRunFacet";

/// This sidecar, as the `producer` of its events and facets: the project's repository at
/// the release the sidecar is.
pub fn producer() -> String {
    format!(
        "https://github.com/perago/perago-k8s/tree/v{}/sidecar",
        env!("CARGO_PKG_VERSION")
    )
}

/// The settings (see [`crate::config::Settings`]).
#[derive(Clone, Debug, PartialEq)]
pub struct OpenLineageConfig {
    /// Where each event is POSTed, as given.
    pub url: String,
    /// The namespace of the jobs: the task type's and the workflow's.
    pub namespace: String,
    /// Longest one request may take.
    pub timeout: Duration,
    /// Events held at most.
    pub queue: usize,
}

/// Sends the run events of this sidecar's attempts.
pub struct OpenLineage {
    namespace: String,
    job: String,
    /// The namespace of lakeFS datasets: `lakefs://<host>[:<port>]` of the lakeFS server;
    /// `None` for a workspace-free task.
    datasets: Option<String>,
    queue: Arc<BoundedQueue<Value>>,
    sender: Background,
    /// Longest wait for the queue to empty at shutdown.
    timeout: Duration,
}

/// The namespace of the datasets of the lakeFS server at `endpoint` (its URL as configured):
/// `lakefs://` and the URL's host and port, as OpenLineage names a datasource by its scheme
/// and authority.
pub fn lakefs_namespace(endpoint: &str) -> String {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    format!("lakefs://{}", authority.to_ascii_lowercase())
}

impl OpenLineage {
    /// Start the background sender. `task_type` is the job's name; `lakefs_endpoint` the
    /// lakeFS server of a workspace task.
    pub fn start(
        config: OpenLineageConfig,
        task_type: &str,
        lakefs_endpoint: Option<&str>,
        counters: ExportCounters,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder().timeout(config.timeout).build()?;
        // One event per request, sent as soon as it is queued.
        let queue = Arc::new(BoundedQueue::new(config.queue, 1, counters));
        let url = config.url.clone();
        let sender = Background::start(
            Arc::clone(&queue),
            Duration::from_secs(1),
            "OpenLineage run events",
            config.url.clone(),
            move |events: Vec<Value>| {
                let (http, url) = (http.clone(), url.clone());
                async move {
                    for event in events {
                        match http.post(&url).json(&event).send().await {
                            Ok(r) if r.status().is_success() => {}
                            Ok(r) => return Err(format!("the endpoint answered {}", r.status())),
                            Err(e) => return Err(perago_contract::error_chain(&e)),
                        }
                    }
                    Ok(())
                }
            },
        );
        info!(url = %config.url, namespace = %config.namespace, "sending OpenLineage run events of every attempt");
        Ok(Self {
            namespace: config.namespace,
            job: task_type.to_owned(),
            datasets: lakefs_endpoint.map(lakefs_namespace),
            queue,
            sender,
            timeout: config.timeout,
        })
    }

    /// The run of one attempt: `task` as polled (its ids and workflow).
    pub fn run(self: &Arc<Self>, task: &Value) -> RunEvents {
        let text = |key: &str| task.get(key).and_then(Value::as_str).unwrap_or_default();
        let workflow_id = text("workflowInstanceId");
        let workflow = match text("workflowType") {
            "" => workflow_id,
            name => name,
        };
        RunEvents(Some(Run {
            sender: Arc::clone(self),
            run_id: attempt_run_id(text("taskId")),
            parent: json!({
                "_producer": producer(),
                "_schemaURL": PARENT_FACET_SCHEMA_URL,
                "run": {"runId": workflow_run_id(workflow_id)},
                "job": {"namespace": self.namespace, "name": workflow},
            }),
            state: Mutex::new(State::default()),
        }))
    }

    /// Send what is queued, then stop; the wait is bounded by twice the request timeout, and
    /// what is still queued then is not sent.
    pub async fn shutdown(&self) {
        self.sender.shutdown(Some(self.timeout * 2)).await;
    }
}

/// The run id of an attempt: the name-based (MD5) UUID of `perago:conductor-task:<taskId>`
/// in the URL namespace, `uuid.uuid3(uuid.NAMESPACE_URL, "perago:conductor-task:" + id)` in
/// Python; the same for every event of the attempt, whoever sends it.
pub fn attempt_run_id(task_id: &str) -> String {
    use md5::Digest;
    let mut hash = md5::Md5::new();
    hash.update(uuid::Uuid::NAMESPACE_URL.as_bytes());
    hash.update(format!("perago:conductor-task:{task_id}").as_bytes());
    let bytes: [u8; 16] = hash.finalize().into();
    uuid::Builder::from_md5_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// The run id of a workflow run: the 16 bytes of its trace id (ADR 0041), so a Conductor
/// workflow id, a UUID, is its own run id.
pub fn workflow_run_id(workflow_id: &str) -> String {
    let bytes = crate::trace::workflow_trace_id(workflow_id);
    let bytes: [u8; 16] = bytes.try_into().unwrap_or_default();
    uuid::Uuid::from_bytes(bytes).hyphenated().to_string()
}

/// One attempt's events; off (every call returns at once) when lineage is not configured.
pub struct RunEvents(Option<Run>);

struct Run {
    sender: Arc<OpenLineage>,
    run_id: String,
    /// The `parent` run facet.
    parent: Value,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    started: bool,
    inputs: Vec<Value>,
}

/// How an attempt ended, for its last event.
pub enum RunEnd<'a> {
    /// Completed; `published` is the workspace its output names, if any.
    Completed { published: Option<&'a WorkspaceRef> },
    /// Failed, timed out or refused: the reason as reported.
    Failed { message: &'a str },
}

impl RunEvents {
    /// The events of an attempt that is not reported anywhere.
    pub fn off() -> Self {
        Self(None)
    }

    /// The attempt works on `ws` (projected from `prefix`): its input dataset.
    pub fn input(&self, ws: &WorkspaceRef, prefix: &str) {
        let Some(run) = &self.0 else { return };
        if let Some(dataset) = run.dataset(ws, prefix) {
            run.state.lock().inputs = vec![dataset];
        }
    }

    /// The body starts: START (once).
    pub fn start(&self) {
        let Some(run) = &self.0 else { return };
        run.start();
    }

    /// The attempt ended: START if it was not sent, then COMPLETE or FAIL.
    pub fn finish(&self, end: &RunEnd<'_>, prefix: &str) {
        let Some(run) = &self.0 else { return };
        run.start();
        let inputs = run.state.lock().inputs.clone();
        let mut facets = Map::new();
        facets.insert("parent".into(), run.parent.clone());
        let (event_type, outputs) = match end {
            RunEnd::Completed { published } => {
                let outputs: Vec<Value> = published
                    .and_then(|ws| run.dataset(ws, prefix))
                    .filter(|output| !inputs.contains(output))
                    .into_iter()
                    .collect();
                ("COMPLETE", outputs)
            }
            RunEnd::Failed { message } => {
                facets.insert(
                    "errorMessage".into(),
                    json!({
                        "_producer": producer(),
                        "_schemaURL": ERROR_FACET_SCHEMA_URL,
                        "message": message,
                        // The failure may be the body's, in whatever language it is written;
                        // the sidecar that reports it does not know that language.
                        "programmingLanguage": "unknown",
                    }),
                );
                ("FAIL", Vec::new())
            }
        };
        run.send(event_type, facets, inputs, outputs);
    }
}

impl Run {
    fn start(&self) {
        let inputs = {
            let mut state = self.state.lock();
            if state.started {
                return;
            }
            state.started = true;
            state.inputs.clone()
        };
        let mut facets = Map::new();
        facets.insert("parent".into(), self.parent.clone());
        self.send("START", facets, inputs, Vec::new());
    }

    /// The dataset of a workspace: `<repository>/<ref>`, and the prefix below the
    /// repository root when there is one, in the lakeFS server's namespace.
    fn dataset(&self, ws: &WorkspaceRef, prefix: &str) -> Option<Value> {
        let namespace = self.sender.datasets.as_ref()?;
        let mut name = format!("{}/{}", ws.repository, ws.reference);
        let below = prefix.trim_matches('/');
        if !below.is_empty() {
            name.push('/');
            name.push_str(below);
        }
        Some(json!({"namespace": namespace, "name": name}))
    }

    fn send(
        &self,
        event_type: &str,
        facets: Map<String, Value>,
        inputs: Vec<Value>,
        outputs: Vec<Value>,
    ) {
        let event = json!({
            "eventType": event_type,
            "eventTime": now(),
            "producer": producer(),
            "schemaURL": SCHEMA_URL,
            "run": {"runId": self.run_id, "facets": facets},
            "job": {"namespace": self.sender.namespace, "name": self.sender.job},
            "inputs": inputs,
            "outputs": outputs,
        });
        self.sender.queue.push(vec![event]);
    }
}

/// Now, in RFC 3339 UTC with milliseconds.
fn now() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_derived_from_the_conductor_ids() {
        // uuid.uuid3(uuid.NAMESPACE_URL, "perago:conductor-task:t-1") in Python.
        let id = attempt_run_id("t-1");
        assert_eq!(id, "e680bae4-0700-3833-be2f-895b41755a99");
        assert_ne!(id, attempt_run_id("t-2"));
        let parsed = uuid::Uuid::parse_str(&id).unwrap();
        assert_eq!(parsed.get_version_num(), 3);
        // A Conductor workflow id is its own run id, as it is its own trace id.
        assert_eq!(
            workflow_run_id("8c1c5f0e-3f6e-4f0a-9d61-2b7c1f9a0b42"),
            "8c1c5f0e-3f6e-4f0a-9d61-2b7c1f9a0b42"
        );
        let other = workflow_run_id("wf-1");
        assert_eq!(other, workflow_run_id("wf-1"));
        assert_eq!(
            other.replace('-', ""),
            crate::trace::workflow_trace_id("wf-1")
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
    }

    #[test]
    fn lakefs_datasets_are_named_by_the_server() {
        assert_eq!(
            lakefs_namespace("http://LakeFS.data:8000/api/v1"),
            "lakefs://lakefs.data:8000"
        );
        assert_eq!(
            lakefs_namespace("https://lakefs.example"),
            "lakefs://lakefs.example"
        );
        assert!(now().ends_with('Z') && now().len() == "2026-12-07T04:03:48.123Z".len());
    }

    fn counters() -> ExportCounters {
        ExportCounters {
            exported: prometheus::IntCounter::new("e", "e").unwrap(),
            dropped: prometheus::IntCounterVec::new(prometheus::Opts::new("d", "d"), &["reason"])
                .unwrap(),
        }
    }

    /// START once, then the end: the datasets name the commits, the parent the workflow.
    #[tokio::test]
    async fn an_attempt_is_start_then_its_end() {
        let config = OpenLineageConfig {
            // Nothing listens there: nothing is sent, the queue is read below.
            url: "http://127.0.0.1:9/lineage".into(),
            namespace: "team".into(),
            timeout: Duration::from_millis(100),
            queue: 16,
        };
        let sender = Arc::new(
            OpenLineage::start(config, "ws.task", Some("http://lakefs:8000"), counters()).unwrap(),
        );
        sender.sender.shutdown(None).await;
        let task = json!({"taskId": "t-1", "workflowInstanceId": "wf-1", "workflowType": "flow"});
        let ws = |reference: &str| {
            WorkspaceRef::parse(&json!({"repository": "repo", "branch": "main", "refType": "commit", "ref": reference}))
                .unwrap()
        };
        let run = sender.run(&task);
        run.input(&ws("c1"), "/data/");
        run.start();
        run.start();
        let published = ws("c2");
        run.finish(
            &RunEnd::Completed {
                published: Some(&published),
            },
            "/data/",
        );
        let failed = sender.run(&json!({"taskId": "t-2", "workflowInstanceId": "wf-1"}));
        failed.finish(&RunEnd::Failed { message: "boom" }, "/");
        let events = std::iter::from_fn(|| sender.queue.take().pop()).collect::<Vec<_>>();
        let types: Vec<&str> = events
            .iter()
            .map(|e| e["eventType"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["START", "COMPLETE", "START", "FAIL"]);
        let complete = &events[1];
        assert_eq!(
            complete["inputs"],
            json!([{"namespace": "lakefs://lakefs:8000", "name": "repo/c1/data"}])
        );
        assert_eq!(
            complete["outputs"],
            json!([{"namespace": "lakefs://lakefs:8000", "name": "repo/c2/data"}])
        );
        assert_eq!(
            complete["job"],
            json!({"namespace": "team", "name": "ws.task"})
        );
        assert_eq!(complete["run"]["runId"], attempt_run_id("t-1"));
        let parent = &complete["run"]["facets"]["parent"];
        assert_eq!(parent["job"], json!({"namespace": "team", "name": "flow"}));
        assert_eq!(parent["run"]["runId"], workflow_run_id("wf-1"));
        let fail = &events[3];
        assert_eq!(fail["run"]["facets"]["errorMessage"]["message"], "boom");
        assert_eq!(
            fail["run"]["facets"]["parent"]["job"]["name"], "wf-1",
            "no workflow name: its id"
        );
        assert_eq!(fail["inputs"], json!([]));
        let off = RunEvents::off();
        off.start();
        off.finish(&RunEnd::Failed { message: "x" }, "/");
    }
}
