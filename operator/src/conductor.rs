//! The Conductor metadata calls of the operator: read, create, update and delete a TaskDef.
//! Every call has a timeout; errors name the call and the task.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

/// Calls take the Conductor base URL (with `/api`): a PeragoTask may name its own Conductor.
pub struct MetadataClient {
    http: reqwest::Client,
    /// `perago_operator_conductor_calls_total{call, outcome}`.
    calls: Option<prometheus::IntCounterVec>,
}

#[derive(Debug, thiserror::Error)]
#[error("Conductor {call} of TaskDef '{task}' failed: {detail}")]
pub struct MetadataError {
    pub call: &'static str,
    pub task: String,
    pub detail: String,
}

impl MetadataClient {
    pub fn new(
        timeout: Duration,
        calls: Option<prometheus::IntCounterVec>,
    ) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: reqwest::Client::builder().timeout(timeout).build()?,
            calls,
        })
    }

    async fn send(
        &self,
        call: &'static str,
        task: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, String), MetadataError> {
        let error = |detail: String| MetadataError {
            call,
            task: task.to_owned(),
            detail,
        };
        let answer = async {
            let response = request
                .header("Accept", "*/*")
                .send()
                .await
                .map_err(|e| error(e.to_string()))?;
            let status = response.status();
            let text = response.text().await.map_err(|e| error(e.to_string()))?;
            Ok((status, text))
        }
        .await;
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

impl MetadataClient {
    /// Scheduled tasks waiting in the queue of a task type (in-flight ones are not counted).
    pub async fn queue_depth(&self, base: &str, name: &str) -> Result<i64, MetadataError> {
        let url = format!("{}/tasks/queue/size", base.trim_end_matches('/'));
        let (status, text) = self
            .send(
                "queue size",
                name,
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

fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
