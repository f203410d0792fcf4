//! The three results an attempt can end in, and the payload-shape rules that go with them
//! (COMPLETED carries output and no reason; failures carry a reason and no output).

use serde_json::{Map, Value, json};

#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Completed(Map<String, Value>),
    /// Retryable by Conductor's policy.
    Failed(String),
    /// `FAILED_WITH_TERMINAL_ERROR`: pre-guardrail violations and explicit terminal errors.
    Terminal(String),
}

impl Outcome {
    pub fn status(&self) -> &'static str {
        match self {
            Self::Completed(_) => "COMPLETED",
            Self::Failed(_) => "FAILED",
            Self::Terminal(_) => "FAILED_WITH_TERMINAL_ERROR",
        }
    }

    pub fn failed(reason: impl Into<String>) -> Self {
        Self::Failed(reason.into())
    }

    /// The failure reason, if any.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Completed(_) => None,
            Self::Failed(r) | Self::Terminal(r) => Some(r),
        }
    }

    /// Cut a failure reason to `max_chars` Unicode scalar values. Returns the original length
    /// when it was cut, so the caller can log it (the text itself is not logged).
    pub fn truncate_reason(&mut self, max_chars: usize) -> Option<usize> {
        let reason = match self {
            Self::Completed(_) => return None,
            Self::Failed(r) | Self::Terminal(r) => r,
        };
        let length = reason.chars().count();
        if length <= max_chars {
            return None;
        }
        let cut = reason
            .char_indices()
            .nth(max_chars)
            .map_or(reason.len(), |(i, _)| i);
        reason.truncate(cut);
        Some(length)
    }

    /// The Conductor v1 TaskResult body.
    pub fn task_result(&self, workflow_instance_id: &str, task_id: &str, worker_id: &str) -> Value {
        let mut body = json!({
            "workflowInstanceId": workflow_instance_id,
            "taskId": task_id,
            "workerId": worker_id,
            "status": self.status(),
        });
        match self {
            Self::Completed(output) => body["outputData"] = Value::Object(output.clone()),
            Self::Failed(reason) | Self::Terminal(reason) => {
                body["reasonForIncompletion"] = Value::String(reason.clone());
            }
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_shapes() {
        let done = Outcome::Completed(
            json!({"result": {"valid": true}})
                .as_object()
                .cloned()
                .unwrap(),
        );
        assert_eq!(
            done.task_result("w", "t", "pod-1"),
            json!({"workflowInstanceId": "w", "taskId": "t", "workerId": "pod-1",
                   "status": "COMPLETED", "outputData": {"result": {"valid": true}}})
        );
        let failed = Outcome::Terminal("pre guardrail".into());
        assert_eq!(
            failed.task_result("w", "t", "pod-1"),
            json!({"workflowInstanceId": "w", "taskId": "t", "workerId": "pod-1",
                   "status": "FAILED_WITH_TERMINAL_ERROR", "reasonForIncompletion": "pre guardrail"})
        );
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        let mut o = Outcome::failed("abcdef");
        assert_eq!(o.truncate_reason(3), Some(6));
        assert_eq!(o.reason(), Some("abc"));
        let mut o = Outcome::failed("éé漢字x");
        assert_eq!(o.truncate_reason(4), Some(5));
        assert_eq!(o.reason(), Some("éé漢字"));
        let mut o = Outcome::failed("short");
        assert_eq!(o.truncate_reason(500), None);
        let mut o = Outcome::failed("executor process for worker x exited");
        o.truncate_reason(8);
        assert_eq!(o.reason(), Some("executor"));
    }
}
