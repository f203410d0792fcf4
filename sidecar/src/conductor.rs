//! The Conductor calls the sidecar makes: TaskDef lookup, batch poll, get task and the v1
//! task update (results and lease extensions); and the workflow read `kubectl perago explain`
//! makes. Every call has a timeout; errors name the call.
//! The v2 update is never used: it leases a next task the caller did not ask for.

use std::time::Duration;

use reqwest::StatusCode;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value, json};
use thiserror::Error;

use perago_contract::url::path_segment;
use tokio::sync::Mutex;

#[derive(Debug, Error)]
pub enum ConductorError {
    #[error("Conductor {call} failed: HTTP {status}: {body}")]
    Status {
        call: &'static str,
        status: StatusCode,
        body: String,
    },
    /// `detail` holds the whole source chain: reqwest's own message lacks the cause.
    #[error("Conductor {call} failed: {detail}")]
    Transport { call: &'static str, detail: String },
    #[error("Conductor {call} returned an unreadable answer: {detail}")]
    Decode { call: &'static str, detail: String },
}

impl ConductorError {
    fn transport(call: &'static str) -> impl FnOnce(reqwest::Error) -> Self {
        move |e| Self::Transport {
            call,
            detail: request_error(e),
        }
    }

    pub fn call(&self) -> &'static str {
        match self {
            Self::Status { call, .. }
            | Self::Transport { call, .. }
            | Self::Decode { call, .. } => call,
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { status, .. } if *status == StatusCode::NOT_FOUND)
    }

    /// Worth retrying: transport errors, timeouts, 429 and 5xx.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport { .. } => true,
            Self::Status { status, .. } => {
                *status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
            }
            Self::Decode { .. } => false,
        }
    }

    pub fn is_auth(&self) -> bool {
        matches!(self, Self::Status { status, .. }
            if *status == StatusCode::UNAUTHORIZED || *status == StatusCode::FORBIDDEN)
    }
}

pub use perago_contract::ConductorCredentials as Credentials;

pub struct ConductorClient {
    http: reqwest::Client,
    /// Ends in `/api`, no trailing slash.
    base: String,
    request_timeout: Duration,
    credentials: Option<Credentials>,
    token: Mutex<Option<String>>,
}

impl ConductorClient {
    pub fn new(
        base_url: &str,
        request_timeout: Duration,
        credentials: Option<Credentials>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(request_timeout.min(Duration::from_secs(5)))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()?;
        Ok(Self {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            request_timeout,
            credentials,
            token: Mutex::new(None),
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    async fn token(&self, refresh: bool) -> Result<Option<String>, ConductorError> {
        let Some(creds) = &self.credentials else {
            return Ok(None);
        };
        let mut token = self.token.lock().await;
        if refresh || token.is_none() {
            let call = "token";
            let response = self
                .http
                .post(format!("{}/token", self.base))
                .timeout(self.request_timeout)
                .json(&json!({"keyId": creds.key, "keySecret": creds.secret}))
                .send()
                .await
                .map_err(ConductorError::transport(call))?;
            let body: Value = read(call, response).await?.unwrap_or(Value::Null);
            let fresh = body.get("token").and_then(Value::as_str).ok_or_else(|| {
                ConductorError::Decode {
                    call,
                    detail: "no token in the answer".into(),
                }
            })?;
            *token = Some(fresh.to_owned());
        }
        Ok(token.clone())
    }

    /// Send a request built by `build`, adding the auth header; on 401 the token is refreshed
    /// once. Returns the body as JSON (or a JSON string for text answers), `None` for 204.
    async fn send(
        &self,
        call: &'static str,
        timeout: Duration,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<Option<Value>, ConductorError> {
        let mut refreshed = false;
        loop {
            let mut request = build(&self.http).timeout(timeout).header("Accept", "*/*");
            if let Some(token) = self.token(refreshed).await? {
                request = request.header("X-Authorization", token);
            }
            let response = request
                .send()
                .await
                .map_err(ConductorError::transport(call))?;
            if response.status() == StatusCode::UNAUTHORIZED
                && self.credentials.is_some()
                && !refreshed
            {
                refreshed = true;
                continue;
            }
            return read(call, response).await;
        }
    }

    /// `GET /metadata/taskdefs/{name}`; `None` when it does not exist.
    pub async fn task_def(&self, name: &str) -> Result<Option<Value>, ConductorError> {
        let url = format!("{}/metadata/taskdefs/{}", self.base, path_segment(name));
        match self
            .send("get TaskDef", self.request_timeout, |h| h.get(&url))
            .await
        {
            Ok(v) => Ok(v),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET /tasks/poll/batch/{type}`; `wait` is the server-side long poll (at most 5 s).
    pub async fn batch_poll(
        &self,
        task_type: &str,
        worker_id: &str,
        count: u32,
        wait: Duration,
    ) -> Result<Vec<Value>, ConductorError> {
        let call = "batch poll";
        let wait_ms = wait.as_millis().min(5000);
        let url = format!("{}/tasks/poll/batch/{}", self.base, path_segment(task_type));
        let count = count.to_string();
        let wait_text = wait_ms.to_string();
        let answer = self
            .send(call, self.request_timeout + wait, |h| {
                h.get(&url).query(&[
                    ("workerid", worker_id),
                    ("count", count.as_str()),
                    ("timeout", wait_text.as_str()),
                ])
            })
            .await?;
        polled_tasks(answer)
    }

    /// `GET /tasks/{taskId}`.
    pub async fn task(&self, task_id: &str) -> Result<Value, ConductorError> {
        let call = "get task";
        let url = format!("{}/tasks/{}", self.base, path_segment(task_id));
        self.send(call, self.request_timeout, |h| h.get(&url))
            .await?
            .ok_or_else(|| ConductorError::Decode {
                call,
                detail: "empty answer".into(),
            })
    }

    /// `GET /workflow/{workflowId}?includeTasks=true`: the workflow with every task it has
    /// scheduled, retries included, in Conductor's order.
    pub async fn workflow(&self, workflow_id: &str) -> Result<Workflow, ConductorError> {
        let call = "get workflow";
        let url = format!("{}/workflow/{}", self.base, path_segment(workflow_id));
        let answer = self
            .send(call, self.request_timeout, |h| {
                h.get(&url).query(&[("includeTasks", "true")])
            })
            .await?
            .ok_or_else(|| ConductorError::Decode {
                call,
                detail: "empty answer".into(),
            })?;
        Workflow::deserialize(answer).map_err(|e| ConductorError::Decode {
            call,
            detail: e.to_string(),
        })
    }

    /// `POST /tasks` (v1) with a TaskResult body.
    pub async fn update_task(
        &self,
        result: &Value,
        timeout: Duration,
    ) -> Result<(), ConductorError> {
        let url = format!("{}/tasks", self.base);
        self.send("update task", timeout, |h| h.post(&url).json(result))
            .await
            .map(drop)
    }

    /// Keep an IN_PROGRESS attempt's lease alive. The worker id is always sent: a TaskResult
    /// without one erases the worker Conductor has recorded.
    pub async fn extend_lease(
        &self,
        workflow_instance_id: &str,
        task_id: &str,
        worker_id: &str,
    ) -> Result<(), ConductorError> {
        let url = format!("{}/tasks", self.base);
        let body = json!({
            "workflowInstanceId": workflow_instance_id,
            "taskId": task_id,
            "workerId": worker_id,
            "status": "IN_PROGRESS",
            "extendLease": true
        });
        self.send("extend lease", self.request_timeout, |h| {
            h.post(&url).json(&body)
        })
        .await
        .map(drop)
    }
}

/// The part of a workflow execution `GET /workflow/{id}` gives that its readers use. Missing
/// and `null` fields read as empty.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workflow {
    #[serde(default, deserialize_with = "nullable")]
    pub workflow_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub workflow_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    #[serde(default, deserialize_with = "nullable")]
    pub reason_for_incompletion: String,
    #[serde(default, deserialize_with = "nullable")]
    pub tasks: Vec<WorkflowTask>,
}

/// One task (one attempt of a step) of a [`Workflow`]. Times are milliseconds since the
/// epoch, 0 when it has not happened.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowTask {
    #[serde(default, deserialize_with = "nullable")]
    pub task_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub task_type: String,
    #[serde(default, deserialize_with = "nullable")]
    pub task_def_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub reference_task_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    #[serde(default, deserialize_with = "nullable")]
    pub reason_for_incompletion: String,
    #[serde(default, deserialize_with = "nullable")]
    pub worker_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub seq: i64,
    #[serde(default, deserialize_with = "nullable")]
    pub iteration: i64,
    #[serde(default, deserialize_with = "nullable")]
    pub retry_count: i64,
    #[serde(default, deserialize_with = "nullable")]
    pub retried_task_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub scheduled_time: i64,
    #[serde(default, deserialize_with = "nullable")]
    pub start_time: i64,
    #[serde(default, deserialize_with = "nullable")]
    pub end_time: i64,
    #[serde(default, deserialize_with = "nullable")]
    pub input_data: Map<String, Value>,
    #[serde(default, deserialize_with = "nullable")]
    pub output_data: Map<String, Value>,
}

fn nullable<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The tasks of a batch poll's answer (`None`: 204, no task).
#[doc(hidden)] // public for the fuzz targets
pub fn polled_tasks(answer: Option<Value>) -> Result<Vec<Value>, ConductorError> {
    match answer {
        None => Ok(Vec::new()),
        Some(Value::Array(tasks)) => Ok(tasks),
        Some(other) => Err(ConductorError::Decode {
            call: "batch poll",
            detail: format!("expected a JSON array, got {}", kind(&other)),
        }),
    }
}

async fn read(
    call: &'static str,
    response: reqwest::Response,
) -> Result<Option<Value>, ConductorError> {
    let status = response.status();
    let text = response
        .text()
        .await
        .map_err(ConductorError::transport(call))?;
    answer(call, status, text)
}

/// An answer's body as [`ConductorClient`] hands it on: JSON, or a JSON string for text
/// answers; `None` for 204 or an empty body; an error naming the call for a failed status.
#[doc(hidden)] // public for the fuzz targets
pub fn answer(
    call: &'static str,
    status: StatusCode,
    text: String,
) -> Result<Option<Value>, ConductorError> {
    if !status.is_success() {
        let body: String = text.chars().take(300).collect();
        return Err(ConductorError::Status { call, status, body });
    }
    if status == StatusCode::NO_CONTENT || text.is_empty() {
        return Ok(None);
    }
    // Several endpoints answer text/plain (the update returns the bare task id).
    Ok(Some(
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A failed HTTP request's text with its whole cause chain but without the request URL
/// (reqwest puts the URL, query included, before the cause; in a reason cut to
/// `PERAGO_FAILURE_REASON_MAX_LENGTH` the cause would be lost). Callers name the call instead.
pub(crate) fn request_error(e: reqwest::Error) -> String {
    perago_contract::error_chain(&e.without_url())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn transport_errors_name_the_call_and_the_cause_not_the_url() {
        // A loopback port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = ConductorClient::new(
            &format!("http://127.0.0.1:{port}/api"),
            Duration::from_secs(5),
            None,
        )
        .unwrap();
        let long_id = "t".repeat(600);
        let err = client.task(&long_id).await.unwrap_err().to_string();
        assert!(err.starts_with("Conductor get task failed: "), "{err}");
        assert!(err.contains("Connection refused"), "{err}");
        assert!(
            !err.contains("127.0.0.1") && !err.contains(&long_id),
            "{err}"
        );
        assert!(err.len() < 200, "{err}");
        let err = client.workflow("w").await.unwrap_err().to_string();
        assert!(err.starts_with("Conductor get workflow failed: "), "{err}");
    }

    #[test]
    fn a_workflow_reads_with_nulls_and_missing_fields_as_empty() {
        let wf = Workflow::deserialize(json!({
            "workflowId": "w1", "status": "RUNNING", "reasonForIncompletion": null,
            "tasks": [{"taskId": "t1", "retryCount": 2, "workerId": null, "startTime": 17,
                       "inputData": {"workspace": {"ref": "A"}}, "outputData": null}]
        }))
        .unwrap();
        assert_eq!(
            (wf.workflow_id.as_str(), wf.status.as_str()),
            ("w1", "RUNNING")
        );
        assert_eq!(wf.reason_for_incompletion, "");
        let t = &wf.tasks[0];
        assert_eq!(
            (t.task_id.as_str(), t.retry_count, t.start_time),
            ("t1", 2, 17)
        );
        assert_eq!((t.worker_id.as_str(), t.end_time), ("", 0));
        assert!(t.output_data.is_empty() && t.input_data.contains_key("workspace"));
        assert!(Workflow::deserialize(json!({"tasks": "no"})).is_err());
    }
}
