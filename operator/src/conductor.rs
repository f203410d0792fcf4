//! The Conductor metadata calls of the operator: read, create, update and delete a TaskDef,
//! and the queue sizes. Every call has a timeout; errors name the call and the task. With an
//! Orkes application key, each Conductor's token is fetched once and refreshed on HTTP 401.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Mutex;

pub use perago_api::ConductorCredentials as Credentials;
use perago_api::url::path_segment as segment;

/// Calls take the Conductor base URL (with `/api`): a PeragoTask may name its own Conductor.
pub struct MetadataClient {
    http: reqwest::Client,
    /// `perago_operator_conductor_calls_total{call, outcome}`.
    calls: Option<prometheus::IntCounterVec>,
    credentials: Option<Credentials>,
    /// Token per Conductor base URL.
    tokens: Mutex<HashMap<String, String>>,
}

#[derive(Debug, thiserror::Error)]
#[error("Conductor {call}{} failed: {detail}", of_task_def(.task))]
pub struct MetadataError {
    pub call: &'static str,
    pub task: String,
    pub detail: String,
}

impl MetadataClient {
    pub fn new(
        timeout: Duration,
        calls: Option<prometheus::IntCounterVec>,
        credentials: Option<Credentials>,
    ) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: reqwest::Client::builder().timeout(timeout).build()?,
            calls,
            credentials,
            tokens: Mutex::new(HashMap::new()),
        })
    }

    async fn send(
        &self,
        call: &'static str,
        task: &str,
        base: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, String), MetadataError> {
        let answer = self
            .send_authorized(base, request)
            .await
            .map_err(|detail| MetadataError {
                call,
                task: task.to_owned(),
                detail,
            });
        if let Some(calls) = &self.calls {
            let outcome = match &answer {
                Ok((status, _)) if status.is_success() => "ok",
                Ok(_) => "refused",
                Err(_) => "error",
            };
            calls.with_label_values(&[call, outcome]).inc();
        }
        answer
    }

    /// Send with the base's token, if credentials are set; an HTTP 401 refreshes the token and
    /// sends once more.
    async fn send_authorized(
        &self,
        base: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, String), String> {
        let again = request.try_clone();
        let answer = exchange(request, self.token(base, false).await?).await?;
        match again {
            Some(again) if answer.0 == StatusCode::UNAUTHORIZED && self.credentials.is_some() => {
                exchange(again, self.token(base, true).await?).await
            }
            _ => Ok(answer),
        }
    }

    async fn token(&self, base: &str, refresh: bool) -> Result<Option<String>, String> {
        let Some(credentials) = &self.credentials else {
            return Ok(None);
        };
        let mut tokens = self.tokens.lock().await;
        if refresh || !tokens.contains_key(base) {
            let (status, text) = exchange(
                self.http
                    .post(format!("{}/token", base.trim_end_matches('/')))
                    .json(&json!({"keyId": credentials.key, "keySecret": credentials.secret})),
                None,
            )
            .await
            .map_err(|e| format!("getting a token: {e}"))?;
            if !status.is_success() {
                return Err(format!(
                    "getting a token: HTTP {status}: {}",
                    text.chars().take(300).collect::<String>()
                ));
            }
            let token = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("token").and_then(Value::as_str).map(str::to_owned))
                .ok_or_else(|| "getting a token: no token in the answer".to_owned())?;
            tokens.insert(base.to_owned(), token);
        }
        Ok(tokens.get(base).cloned())
    }

    fn failed(call: &'static str, task: &str, status: StatusCode, text: &str) -> MetadataError {
        MetadataError {
            call,
            task: task.to_owned(),
            detail: format!(
                "HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            ),
        }
    }

    /// The stored TaskDef, or `None` when Conductor has none of that name.
    pub async fn get(&self, base: &str, name: &str) -> Result<Option<Value>, MetadataError> {
        let (status, text) = self
            .send(
                "get",
                name,
                base,
                self.http.get(format!(
                    "{}/metadata/taskdefs/{}",
                    base.trim_end_matches('/'),
                    segment(name)
                )),
            )
            .await?;
        match status {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => {
                serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| MetadataError {
                        call: "get",
                        task: name.to_owned(),
                        detail: format!("unreadable answer: {e}"),
                    })
            }
            s => Err(Self::failed("get", name, s, &text)),
        }
    }

    pub async fn create(&self, base: &str, name: &str, doc: &Value) -> Result<(), MetadataError> {
        let body = Value::Array(vec![doc.clone()]);
        let (status, text) = self
            .send(
                "create",
                name,
                base,
                self.http
                    .post(format!("{}/metadata/taskdefs", base.trim_end_matches('/')))
                    .json(&body),
            )
            .await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(Self::failed("create", name, status, &text))
        }
    }

    pub async fn update(&self, base: &str, name: &str, doc: &Value) -> Result<(), MetadataError> {
        let (status, text) = self
            .send(
                "update",
                name,
                base,
                self.http
                    .put(format!("{}/metadata/taskdefs", base.trim_end_matches('/')))
                    .json(doc),
            )
            .await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(Self::failed("update", name, status, &text))
        }
    }

    /// Delete; a TaskDef that is already gone is fine (Conductor 3.32 on SQL answers that with
    /// HTTP 500 "No such task definition", not 404).
    pub async fn delete(&self, base: &str, name: &str) -> Result<(), MetadataError> {
        let (status, text) = self
            .send(
                "delete",
                name,
                base,
                self.http.delete(format!(
                    "{}/metadata/taskdefs/{}",
                    base.trim_end_matches('/'),
                    segment(name)
                )),
            )
            .await?;
        if status.is_success()
            || status == StatusCode::NOT_FOUND
            || text.contains("No such task definition")
        {
            Ok(())
        } else {
            Err(Self::failed("delete", name, status, &text))
        }
    }
}

fn of_task_def(task: &str) -> String {
    if task.is_empty() {
        String::new()
    } else {
        format!(" of TaskDef '{task}'")
    }
}

impl MetadataClient {
    /// The size of every queue of this Conductor in one call (`GET /tasks/queue/all`): queue
    /// name (the task type, or `domain:type`) to scheduled tasks. A queue that never held a
    /// message is absent: its size is 0.
    pub async fn queue_sizes(&self, base: &str) -> Result<HashMap<String, i64>, MetadataError> {
        const CALL: &str = "queue sizes";
        let url = format!("{}/tasks/queue/all", base.trim_end_matches('/'));
        let (status, text) = self.send(CALL, "", base, self.http.get(url)).await?;
        if !status.is_success() {
            return Err(Self::failed(CALL, "", status, &text));
        }
        serde_json::from_str(&text).map_err(|e| MetadataError {
            call: CALL,
            task: String::new(),
            detail: format!(
                "not a map of queue sizes ({e}): {}",
                text.chars().take(100).collect::<String>()
            ),
        })
    }

    /// Scheduled tasks waiting in the queue of a task type (in-flight ones are not counted).
    pub async fn queue_depth(&self, base: &str, name: &str) -> Result<i64, MetadataError> {
        let url = format!("{}/tasks/queue/size", base.trim_end_matches('/'));
        let (status, text) = self
            .send(
                "queue size",
                name,
                base,
                self.http.get(url).query(&[("taskType", name)]),
            )
            .await?;
        if !status.is_success() {
            return Err(Self::failed("queue size", name, status, &text));
        }
        text.trim().parse().map_err(|_| MetadataError {
            call: "queue size",
            task: name.to_owned(),
            detail: format!(
                "not a number: {}",
                text.chars().take(100).collect::<String>()
            ),
        })
    }
}

/// Does `stored` hold every value of `rendered`? Conductor adds fields of its own (times,
/// defaults), so only what the operator renders is compared.
pub fn holds(stored: &Value, rendered: &Value) -> bool {
    match (stored, rendered) {
        (Value::Object(s), Value::Object(r)) => r
            .iter()
            .all(|(k, v)| s.get(k).is_some_and(|sv| holds(sv, v))),
        (Value::Array(s), Value::Array(r)) => {
            s.len() == r.len() && s.iter().zip(r).all(|(a, b)| holds(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// One request and its answer as text.
async fn exchange(
    request: reqwest::RequestBuilder,
    token: Option<String>,
) -> Result<(StatusCode, String), String> {
    let request = match token {
        Some(token) => request.header("X-Authorization", token),
        None => request,
    };
    let response = request
        .header("Accept", "*/*")
        .send()
        .await
        .map_err(|e| perago_api::error_chain(&e))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .map_err(|e| perago_api::error_chain(&e))?;
    Ok((status, text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

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
        let client = MetadataClient::new(Duration::from_secs(5), None, Some(credentials)).unwrap();
        assert!(client.get(&base, "x").await.unwrap().is_some());
        assert!(client.get(&base, "x").await.unwrap().is_some());
        assert_eq!(issued.load(Ordering::SeqCst), 1, "the token is reused");

        // Another client's token makes ours stale: one 401, one refresh, then success.
        issued.fetch_add(1, Ordering::SeqCst);
        assert!(client.get(&base, "x").await.unwrap().is_some());
        assert_eq!(issued.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn without_credentials_no_token_is_asked_for() {
        let (base, issued) = fake_orkes().await;
        let client = MetadataClient::new(Duration::from_secs(5), None, None).unwrap();
        let error = client.get(&base, "x").await.unwrap_err();
        assert!(error.to_string().contains("HTTP 401"), "{error}");
        assert_eq!(issued.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn drift_ignores_what_conductor_adds_and_sees_what_it_changed() {
        let rendered = json!({"name": "t", "retryCount": 3, "inputSchema": {"data": {"type": "object"}}, "inputKeys": ["params"]});
        let stored = json!({"name": "t", "retryCount": 3, "createTime": 1, "inputSchema": {"createTime": 0, "data": {"type": "object"}}, "inputKeys": ["params"]});
        assert!(holds(&stored, &rendered));
        let edited = json!({"name": "t", "retryCount": 5, "inputSchema": {"data": {"type": "object"}}, "inputKeys": ["params"]});
        assert!(!holds(&edited, &rendered));
        assert!(!holds(&json!({"name": "t"}), &rendered));
    }
}
