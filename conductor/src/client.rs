//! One Conductor, one client: every call has a timeout; with an Orkes application key the
//! token is fetched once and refreshed once on HTTP 401. The v2 task update is never used: it
//! leases a next task the caller did not ask for.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use perago_contract::ConductorCredentials as Credentials;
use perago_contract::trust::{Tls, TlsClient};
use perago_contract::url::path_segment;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::error::{ConductorError, ErrorKind, request_error};
use crate::workflow::Workflow;

/// How one call ended, for a metric of calls by outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// A success status.
    Ok,
    /// Conductor answered with a failure status.
    Refused,
    /// No answer.
    Error,
}

impl CallOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Refused => "refused",
            Self::Error => "error",
        }
    }
}

/// Told of every call the client makes (the token's included), with its outcome.
pub type CallObserver = Arc<dyn Fn(&'static str, CallOutcome) + Send + Sync>;

pub struct ConductorClient {
    http: TlsClient,
    /// Ends in `/api`, no trailing slash.
    base: String,
    request_timeout: Duration,
    credentials: Option<Credentials>,
    token: Mutex<Option<String>>,
    observer: Option<CallObserver>,
    trace_context: Option<TraceContext>,
}

/// Gives the W3C `traceparent` of the caller's current trace, if any; sent as the
/// `traceparent` header of every call.
pub type TraceContext = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// What a call is, for its errors and its observer.
#[derive(Clone, Copy)]
pub(crate) struct Call<'a> {
    name: &'static str,
    task_def: Option<&'a str>,
}

impl Call<'_> {
    pub(crate) fn error(self, kind: ErrorKind) -> ConductorError {
        ConductorError::new(self.name, self.task_def, kind)
    }
}

pub(crate) const fn call(name: &'static str) -> Call<'static> {
    Call {
        name,
        task_def: None,
    }
}

impl ConductorClient {
    /// A client of the Conductor whose API is at `base_url` (ending in `/api`).
    pub fn new(
        base_url: &str,
        request_timeout: Duration,
        credentials: Option<Credentials>,
    ) -> Result<Self, reqwest::Error> {
        Ok(Self::with_http(
            TlsClient::fixed(builder(request_timeout).build()?),
            base_url,
            request_timeout,
            credentials,
        ))
    }

    /// [`Self::new`], also trusting the certificate authorities of `tls` (a private CA) and
    /// presenting its client certificate, read again when its files change. The certificate
    /// is read and checked here.
    pub fn with_tls(
        base_url: &str,
        request_timeout: Duration,
        credentials: Option<Credentials>,
        tls: Tls,
    ) -> Result<Self, String> {
        Ok(Self::with_http(
            http_client(request_timeout, tls)?,
            base_url,
            request_timeout,
            credentials,
        ))
    }

    /// A client sharing `http`'s connection pool (see [`http_client`]), for a process that
    /// talks to several Conductors.
    pub fn with_http(
        http: TlsClient,
        base_url: &str,
        request_timeout: Duration,
        credentials: Option<Credentials>,
    ) -> Self {
        Self {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            request_timeout,
            credentials,
            token: Mutex::new(None),
            observer: None,
            trace_context: None,
        }
    }

    /// Send the `traceparent` `current` gives with every call.
    pub fn with_trace_context(mut self, current: TraceContext) -> Self {
        self.trace_context = Some(current);
        self
    }

    /// Tell `observer` of every call.
    pub fn observed(mut self, observer: CallObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The client certificate presented now, when there is one.
    pub fn client_certificate(&self) -> Option<perago_contract::trust::ClientCertificate> {
        self.http.certificate()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// One request and its answer's status and text; the observer hears of it.
    async fn exchange(
        &self,
        call: Call<'_>,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, String), ConductorError> {
        let request = match self.trace_context.as_ref().and_then(|current| current()) {
            Some(traceparent) => request.header("traceparent", traceparent),
            None => request,
        };
        let answer = async {
            let response = request
                .header("Accept", "*/*")
                .send()
                .await
                .map_err(|e| call.error(transport(e)))?;
            let status = response.status();
            let text = response
                .text()
                .await
                .map_err(|e| call.error(transport(e)))?;
            Ok((status, text))
        }
        .await;
        if let Some(observer) = &self.observer {
            let outcome = match &answer {
                Ok((status, _)) if status.is_success() => CallOutcome::Ok,
                Ok(_) => CallOutcome::Refused,
                Err(_) => CallOutcome::Error,
            };
            observer(call.name, outcome);
        }
        answer
    }

    async fn token(&self, refresh: bool) -> Result<Option<String>, ConductorError> {
        let Some(creds) = &self.credentials else {
            return Ok(None);
        };
        let mut token = self.token.lock().await;
        if refresh || token.is_none() {
            let call = call("token");
            let request = self
                .http
                .client()
                .post(self.url("/token"))
                .timeout(self.request_timeout)
                .json(&json!({"keyId": creds.key, "keySecret": creds.secret}));
            let (status, text) = self.exchange(call, request).await?;
            let body = answer(call.name, status, text)?.unwrap_or(Value::Null);
            let fresh = body
                .get("token")
                .and_then(Value::as_str)
                .ok_or_else(|| call.error(ErrorKind::Decode("no token in the answer".into())))?;
            *token = Some(fresh.to_owned());
        }
        Ok(token.clone())
    }

    /// Send a request built by `build` with the auth header; on 401 the token is refreshed
    /// once. Returns the answer's status and text, a failure status included.
    async fn send_raw(
        &self,
        call: Call<'_>,
        timeout: Duration,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<(StatusCode, String), ConductorError> {
        let mut refreshed = false;
        loop {
            let mut request = build(&self.http.client()).timeout(timeout);
            if let Some(token) = self.token(refreshed).await? {
                request = request.header("X-Authorization", token);
            }
            let (status, text) = self.exchange(call, request).await?;
            if status == StatusCode::UNAUTHORIZED && self.credentials.is_some() && !refreshed {
                refreshed = true;
                continue;
            }
            return Ok((status, text));
        }
    }

    /// [`Self::send_raw`], with a failure status as an error and the body read as JSON (or
    /// a JSON string for text answers); `None` for 204 or an empty body.
    async fn send(
        &self,
        call: Call<'_>,
        timeout: Duration,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<Option<Value>, ConductorError> {
        let (status, text) = self.send_raw(call, timeout, build).await?;
        answer(call.name, status, text).map_err(|e| ConductorError {
            task_def: call.task_def.map(str::to_owned),
            ..e
        })
    }

    // --- TaskDef metadata -------------------------------------------------------------

    /// `GET /metadata/taskdefs/{name}`; `None` when Conductor has none of that name.
    pub async fn task_def(&self, name: &str) -> Result<Option<Value>, ConductorError> {
        let call = Call {
            name: "get",
            task_def: Some(name),
        };
        let url = self.url(&format!("/metadata/taskdefs/{}", path_segment(name)));
        match self.send(call, self.request_timeout, |h| h.get(&url)).await {
            Ok(Some(Value::String(text))) => Err(call.error(ErrorKind::Decode(format!(
                "not a TaskDef: {}",
                clip(&text, 100)
            )))),
            Ok(v) => Ok(v),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every TaskDef of this Conductor in one call (`GET /metadata/taskdefs`), by name.
    pub async fn task_defs(&self) -> Result<HashMap<String, Value>, ConductorError> {
        let call = call("list");
        let url = self.url("/metadata/taskdefs");
        let answer = self
            .send(call, self.request_timeout, |h| h.get(&url))
            .await?;
        match answer {
            Some(Value::Array(defs)) => Ok(defs
                .into_iter()
                .filter_map(|d| Some((d.get("name")?.as_str()?.to_owned(), d)))
                .collect()),
            None => Ok(HashMap::new()),
            Some(other) => Err(call.error(ErrorKind::Decode(format!(
                "not a list of TaskDefs: {}",
                clip(&other.to_string(), 100)
            )))),
        }
    }

    /// `POST /metadata/taskdefs` with the one TaskDef `doc` named `name`.
    pub async fn create_task_def(&self, name: &str, doc: &Value) -> Result<(), ConductorError> {
        let call = Call {
            name: "create",
            task_def: Some(name),
        };
        let url = self.url("/metadata/taskdefs");
        let body = Value::Array(vec![doc.clone()]);
        self.send(call, self.request_timeout, |h| h.post(&url).json(&body))
            .await
            .map(drop)
    }

    /// `PUT /metadata/taskdefs` with the TaskDef `doc` named `name`.
    pub async fn update_task_def(&self, name: &str, doc: &Value) -> Result<(), ConductorError> {
        let call = Call {
            name: "update",
            task_def: Some(name),
        };
        let url = self.url("/metadata/taskdefs");
        self.send(call, self.request_timeout, |h| h.put(&url).json(doc))
            .await
            .map(drop)
    }

    /// `DELETE /metadata/taskdefs/{name}`; a TaskDef that is already gone is fine (Conductor
    /// 3.32 on SQL answers that with HTTP 500 "No such task definition", not 404).
    pub async fn delete_task_def(&self, name: &str) -> Result<(), ConductorError> {
        let call = Call {
            name: "delete",
            task_def: Some(name),
        };
        let url = self.url(&format!("/metadata/taskdefs/{}", path_segment(name)));
        let (status, text) = self
            .send_raw(call, self.request_timeout, |h| h.delete(&url))
            .await?;
        if status.is_success()
            || status == StatusCode::NOT_FOUND
            || text.contains("No such task definition")
        {
            return Ok(());
        }
        Err(call.error(failure(status, &text)))
    }

    // --- Queues ---------------------------------------------------------------------------

    /// The size of every queue of this Conductor in one call (`GET /tasks/queue/all`): queue
    /// name (the task type, or `domain:type`) to scheduled tasks. A queue that never held a
    /// message is absent: its size is 0.
    pub async fn queue_sizes(&self) -> Result<HashMap<String, i64>, ConductorError> {
        let call = call("queue sizes");
        let url = self.url("/tasks/queue/all");
        let answer = self
            .send(call, self.request_timeout, |h| h.get(&url))
            .await?;
        let answer = answer.unwrap_or_else(|| json!({}));
        HashMap::deserialize(&answer).map_err(|e| {
            call.error(ErrorKind::Decode(format!(
                "not a map of queue sizes ({e}): {}",
                clip(&answer.to_string(), 100)
            )))
        })
    }

    /// Scheduled tasks waiting in the queue of a task type, or of its `domain` (in-flight ones
    /// are not counted).
    pub async fn queue_size(
        &self,
        task_type: &str,
        domain: Option<&str>,
    ) -> Result<i64, ConductorError> {
        let call = Call {
            name: "queue size",
            task_def: Some(task_type),
        };
        let url = self.url("/tasks/queue/size");
        let answer = self
            .send(call, self.request_timeout, |h| {
                let h = h.get(&url).query(&[("taskType", task_type)]);
                match domain {
                    Some(domain) => h.query(&[("domain", domain)]),
                    None => h,
                }
            })
            .await?;
        answer.as_ref().and_then(Value::as_i64).ok_or_else(|| {
            let text = answer.map(|v| v.to_string()).unwrap_or_default();
            call.error(ErrorKind::Decode(format!(
                "not a number: {}",
                clip(&text, 100)
            )))
        })
    }

    // --- Tasks ----------------------------------------------------------------------------

    /// `GET /tasks/poll/batch/{type}`, from the queue of `domain` when given; `wait` is the
    /// server-side long poll (at most 5 s).
    pub async fn batch_poll(
        &self,
        task_type: &str,
        domain: Option<&str>,
        worker_id: &str,
        count: u32,
        wait: Duration,
    ) -> Result<Vec<Value>, ConductorError> {
        let wait_ms = wait.as_millis().min(5000);
        let url = self.url(&format!("/tasks/poll/batch/{}", path_segment(task_type)));
        let count = count.to_string();
        let wait_text = wait_ms.to_string();
        let (status, text) = self
            .send_raw(call("batch poll"), self.request_timeout + wait, |h| {
                let h = h.get(&url).query(&[
                    ("workerid", worker_id),
                    ("count", count.as_str()),
                    ("timeout", wait_text.as_str()),
                ]);
                match domain {
                    Some(domain) => h.query(&[("domain", domain)]),
                    None => h,
                }
            })
            .await?;
        crate::polled::polled_tasks(status, text)
    }

    /// `GET /tasks/{taskId}`.
    pub async fn task(&self, task_id: &str) -> Result<Value, ConductorError> {
        let call = call("get task");
        let url = self.url(&format!("/tasks/{}", path_segment(task_id)));
        self.send(call, self.request_timeout, |h| h.get(&url))
            .await?
            .ok_or_else(|| call.error(ErrorKind::Decode("empty answer".into())))
    }

    /// The latest `size` tasks of `task_type` by update time, as Conductor's index holds them
    /// (`GET /tasks/search-v2`): whole task records, worker id included. The index follows
    /// a task's updates, so a task still scheduled may be absent.
    pub async fn recent_tasks(
        &self,
        task_type: &str,
        size: u32,
    ) -> Result<Vec<Value>, ConductorError> {
        let call = Call {
            name: "search tasks",
            task_def: Some(task_type),
        };
        // The index's query language has no escape for a quote inside a value.
        if task_type.contains('"') {
            return Err(call.error(ErrorKind::Decode(format!(
                "task type {task_type:?} holds a quote, which a search cannot name"
            ))));
        }
        let url = self.url("/tasks/search-v2");
        let query = format!("taskType=\"{task_type}\"");
        let size = size.to_string();
        let answer = self
            .send(call, self.request_timeout, |h| {
                h.get(&url).query(&[
                    ("start", "0"),
                    ("size", size.as_str()),
                    ("sort", "updateTime:DESC"),
                    ("freeText", "*"),
                    ("query", query.as_str()),
                ])
            })
            .await?
            .unwrap_or_else(|| json!({}));
        match answer.get("results") {
            Some(Value::Array(tasks)) => Ok(tasks.clone()),
            _ => Err(call.error(ErrorKind::Decode(format!(
                "not a search result: {}",
                clip(&answer.to_string(), 100)
            )))),
        }
    }

    /// `POST /tasks` (v1) with a TaskResult body.
    pub async fn update_task(
        &self,
        result: &Value,
        timeout: Duration,
    ) -> Result<(), ConductorError> {
        let url = self.url("/tasks");
        self.send(call("update task"), timeout, |h| h.post(&url).json(result))
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
        let url = self.url("/tasks");
        let body = json!({
            "workflowInstanceId": workflow_instance_id,
            "taskId": task_id,
            "workerId": worker_id,
            "status": "IN_PROGRESS",
            "extendLease": true
        });
        self.send(call("extend lease"), self.request_timeout, |h| {
            h.post(&url).json(&body)
        })
        .await
        .map(drop)
    }

    // --- Workflows ------------------------------------------------------------------------

    /// `GET /workflow/{workflowId}?includeTasks=true`: the workflow with every task it has
    /// scheduled, retries included, in Conductor's order.
    pub async fn workflow(&self, workflow_id: &str) -> Result<Workflow, ConductorError> {
        let call = call("get workflow");
        let url = self.url(&format!("/workflow/{}", path_segment(workflow_id)));
        let answer = self
            .send(call, self.request_timeout, |h| {
                h.get(&url).query(&[("includeTasks", "true")])
            })
            .await?
            .ok_or_else(|| call.error(ErrorKind::Decode("empty answer".into())))?;
        Workflow::deserialize(answer).map_err(|e| call.error(ErrorKind::Decode(e.to_string())))
    }
}

/// The queue Conductor keeps a task type's scheduled tasks in: `domain:taskType` for a task
/// routed to a domain, else the task type (as `/tasks/queue/all` names them).
pub fn queue_name(task_type: &str, domain: Option<&str>) -> String {
    match domain {
        Some(domain) => format!("{domain}:{task_type}"),
        None => task_type.to_owned(),
    }
}

/// The HTTP client [`ConductorClient::with_tls`] makes: the connect timeout is the request
/// timeout's, at most 5 s; idle connections are kept a minute. It trusts the built-in web
/// roots, the platform's (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the OS store) and `tls.roots`, and
/// presents `tls.identity`'s certificate as its files hold it.
pub fn http_client(request_timeout: Duration, tls: Tls) -> Result<TlsClient, String> {
    TlsClient::build(tls, move || builder(request_timeout))
}

fn builder(request_timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(request_timeout.min(Duration::from_secs(5)))
        .pool_idle_timeout(Duration::from_secs(60))
}

/// A request that got no answer: a refused client certificate, or a transport failure.
fn transport(e: reqwest::Error) -> ErrorKind {
    match perago_contract::trust::refused_handshake(&e) {
        Some(refused) => ErrorKind::CertificateRefused(refused),
        None => ErrorKind::Transport(request_error(e)),
    }
}

fn clip(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

fn failure(status: StatusCode, text: &str) -> ErrorKind {
    ErrorKind::Status {
        status,
        body: clip(text, 300),
    }
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
        if let Some(refused) = perago_contract::trust::refused_by_gateway(status.as_u16(), &text) {
            return Err(ConductorError::new(
                call,
                None,
                ErrorKind::CertificateRefused(refused),
            ));
        }
        return Err(ConductorError::new(call, None, failure(status, &text)));
    }
    if status == StatusCode::NO_CONTENT || text.is_empty() {
        return Ok(None);
    }
    // Several endpoints answer text/plain (the update returns the bare task id).
    Ok(Some(
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_gateways_refusal_of_the_certificate_is_its_own_kind() {
        let page = "<html>\r\n<head><title>400 No required SSL certificate was sent</title>";
        let refused = answer("batch poll", StatusCode::BAD_REQUEST, page.into()).unwrap_err();
        assert!(refused.is_certificate_refused() && refused.is_auth());
        assert!(
            refused.is_transient(),
            "never reached Conductor: safe to try again"
        );
        assert_eq!(
            refused.to_string(),
            "Conductor batch poll was refused: the gateway requires a client certificate and \
             none was sent (HTTP 400: No required SSL certificate was sent)"
        );
        let other = answer("batch poll", StatusCode::BAD_REQUEST, "bad".into()).unwrap_err();
        assert!(!other.is_certificate_refused() && !other.is_transient());
    }

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

    /// A fake Orkes endpoint: `/api/token` hands out `t1`, `t2`, ...; TaskDef reads need the
    /// newest token, so a token outlived by a newer one gets HTTP 401.
    async fn fake_orkes() -> (String, Arc<AtomicUsize>) {
        use axum::http::HeaderMap;
        use axum::routing::{get, post};
        let issued = Arc::new(AtomicUsize::new(0));
        let (for_token, for_get) = (issued.clone(), issued.clone());
        let app = axum::Router::new()
            .route(
                "/api/token",
                post(move |body: String| async move {
                    let asked: Value = serde_json::from_str(&body).unwrap_or_default();
                    assert_eq!(asked, json!({"keyId": "k", "keySecret": "s"}));
                    let n = for_token.fetch_add(1, Ordering::SeqCst) + 1;
                    json!({"token": format!("t{n}")}).to_string()
                }),
            )
            .route(
                "/api/metadata/taskdefs/{name}",
                get(move |headers: HeaderMap| async move {
                    let newest = format!("t{}", for_get.load(Ordering::SeqCst));
                    match headers.get("X-Authorization").and_then(|v| v.to_str().ok()) {
                        Some(token) if token == newest => {
                            (StatusCode::OK, json!({"name": "x"}).to_string())
                        }
                        _ => (StatusCode::UNAUTHORIZED, String::new()),
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/api", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (base, issued)
    }

    #[tokio::test]
    async fn an_orkes_token_is_fetched_once_and_refreshed_on_401() {
        let (base, issued) = fake_orkes().await;
        let credentials = Credentials {
            key: "k".into(),
            secret: "s".into(),
        };
        let client =
            ConductorClient::new(&base, Duration::from_secs(5), Some(credentials)).unwrap();
        assert!(client.task_def("x").await.unwrap().is_some());
        assert!(client.task_def("x").await.unwrap().is_some());
        assert_eq!(issued.load(Ordering::SeqCst), 1, "the token is reused");

        // Another client's token makes ours stale: one 401, one refresh, then success.
        issued.fetch_add(1, Ordering::SeqCst);
        assert!(client.task_def("x").await.unwrap().is_some());
        assert_eq!(issued.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn the_observer_hears_every_call_with_its_outcome() {
        let (base, issued) = fake_orkes().await;
        let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = heard.clone();
        let credentials = Credentials {
            key: "k".into(),
            secret: "s".into(),
        };
        let client = ConductorClient::new(&base, Duration::from_secs(5), Some(credentials))
            .unwrap()
            .observed(Arc::new(move |call, outcome| {
                log.lock().unwrap().push((call, outcome.as_str()))
            }));
        assert!(client.task_def("x").await.unwrap().is_some());
        issued.fetch_add(1, Ordering::SeqCst);
        assert!(client.task_def("x").await.unwrap().is_some());
        assert_eq!(
            *heard.lock().unwrap(),
            [
                ("token", "ok"),
                ("get", "ok"),
                ("get", "refused"),
                ("token", "ok"),
                ("get", "ok")
            ]
        );
    }

    #[tokio::test]
    async fn without_credentials_no_token_is_asked_for() {
        let (base, issued) = fake_orkes().await;
        let client = ConductorClient::new(&base, Duration::from_secs(5), None).unwrap();
        let error = client.task_def("x").await.unwrap_err();
        assert!(error.to_string().contains("HTTP 401"), "{error}");
        assert_eq!(issued.load(Ordering::SeqCst), 0);
    }
}
