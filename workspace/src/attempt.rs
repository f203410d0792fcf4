//! The typed attempt snapshot of a Conductor task, built from the raw task JSON with the
//! reference's required-field rules, and the identities derived from it.

use perago_conductor::TaskStatus;
use serde_json::{Map, Value};
use thiserror::Error;

#[derive(Clone, Debug, PartialEq)]
pub struct AttemptSnapshot {
    pub workflow_instance_id: String,
    pub task_id: String,
    pub retry_count: i64,
    pub task_def_name: String,
    pub reference_task_name: String,
    pub seq: i64,
    pub iteration: i64,
    pub status: TaskStatus,
    pub input_data: Map<String, Value>,
    pub retried_task_id: Option<String>,
    pub response_timeout_seconds: Option<i64>,
    /// Beyond what the attempt fence must compare: used to harden it (docs/design.md#attempt-fence).
    pub worker_id: Option<String>,
    pub poll_count: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SnapshotError {
    #[error("Conductor task is missing required field {0}")]
    Missing(&'static str),
    #[error("Conductor task field input_data must be a mapping")]
    InputNotMapping,
    #[error("Conductor task field {0} has the wrong type")]
    WrongType(&'static str),
}

fn string(
    task: &Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<String, SnapshotError> {
    match task.get(key) {
        None | Some(Value::Null) => Err(SnapshotError::Missing(name)),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(SnapshotError::WrongType(name)),
    }
}

/// An integer, also accepted as a numeric string (Conductor clients differ).
fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn required_int(
    task: &Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<i64, SnapshotError> {
    match task.get(key) {
        None | Some(Value::Null) => Err(SnapshotError::Missing(name)),
        Some(v) => integer(v).ok_or(SnapshotError::WrongType(name)),
    }
}

fn optional_int(
    task: &Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<Option<i64>, SnapshotError> {
    match task.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => integer(v).map(Some).ok_or(SnapshotError::WrongType(name)),
    }
}

impl AttemptSnapshot {
    /// Map a task as `GET /tasks/{id}` or a poll returns it. Fields are checked in the
    /// reference's order, so the first missing one is named.
    pub fn from_task(task: &Value) -> Result<Self, SnapshotError> {
        let empty = Map::new();
        let task = task.as_object().unwrap_or(&empty);
        let workflow_instance_id = string(task, "workflowInstanceId", "workflow_instance_id")?;
        let task_id = string(task, "taskId", "task_id")?;
        let retry_count = required_int(task, "retryCount", "retry_count")?;
        let task_def_name = string(task, "taskDefName", "task_def_name")?;
        let reference_task_name = string(task, "referenceTaskName", "reference_task_name")?;
        let seq = required_int(task, "seq", "seq")?;
        let iteration = optional_int(task, "iteration", "iteration")?.unwrap_or(0);
        let status = TaskStatus::from(string(task, "status", "status")?.as_str());
        let input_data = match task.get("inputData") {
            None | Some(Value::Null) => return Err(SnapshotError::Missing("input_data")),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Err(SnapshotError::InputNotMapping),
        };
        let retried_task_id = match task.get("retriedTaskId") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(_) => return Err(SnapshotError::WrongType("retried_task_id")),
        };
        Ok(Self {
            workflow_instance_id,
            task_id,
            retry_count,
            task_def_name,
            reference_task_name,
            seq,
            iteration,
            status,
            input_data,
            retried_task_id,
            response_timeout_seconds: optional_int(
                task,
                "responseTimeoutSeconds",
                "response_timeout_seconds",
            )?,
            worker_id: task
                .get("workerId")
                .and_then(Value::as_str)
                .map(str::to_owned),
            poll_count: task.get("pollCount").and_then(integer),
        })
    }

    /// The key of the workflow step this attempt belongs to, equal for every retry of it.
    /// Conductor gives a retry a new task id and a new `seq`, so neither may be part of it.
    pub fn logical_task_key(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.workflow_instance_id, self.reference_task_name, self.iteration, self.task_def_name
        )
    }
}

/// The identity a result can be reported under even when the snapshot could not be built:
/// Conductor needs both ids to accept an update.
pub fn report_identity(task: &Value) -> Option<(String, String)> {
    let id = task.get("taskId")?.as_str()?.to_owned();
    let wf = task.get("workflowInstanceId")?.as_str()?.to_owned();
    Some((wf, id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task() -> Value {
        json!({
            "workflowInstanceId": "wf", "taskId": "t1", "retryCount": 2, "taskDefName": "demo",
            "referenceTaskName": "step", "seq": 4, "status": "IN_PROGRESS",
            "inputData": {"params": {}}, "retriedTaskId": "t0", "responseTimeoutSeconds": "30",
            "workerId": "pod-a", "pollCount": 1
        })
    }

    #[test]
    fn maps_a_full_task() {
        let s = AttemptSnapshot::from_task(&task()).unwrap();
        assert_eq!(s.retry_count, 2);
        assert_eq!(s.iteration, 0);
        assert_eq!(s.retried_task_id.as_deref(), Some("t0"));
        assert_eq!(s.response_timeout_seconds, Some(30));
        assert_eq!(s.logical_task_key(), "wf:step:0:demo");
    }

    #[test]
    fn names_the_first_missing_field_in_reference_order() {
        for (key, name) in [
            ("workflowInstanceId", "workflow_instance_id"),
            ("taskId", "task_id"),
            ("retryCount", "retry_count"),
            ("taskDefName", "task_def_name"),
            ("referenceTaskName", "reference_task_name"),
            ("seq", "seq"),
            ("status", "status"),
            ("inputData", "input_data"),
        ] {
            let mut t = task();
            t.as_object_mut().unwrap().remove(key);
            let err = AttemptSnapshot::from_task(&t).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("Conductor task is missing required field {name}")
            );
            t[key] = Value::Null;
            assert_eq!(AttemptSnapshot::from_task(&t).unwrap_err(), err);
        }
    }

    #[test]
    fn input_must_be_a_mapping_and_iteration_defaults_to_zero() {
        let mut t = task();
        t["inputData"] = json!([1]);
        assert_eq!(
            AttemptSnapshot::from_task(&t).unwrap_err().to_string(),
            "Conductor task field input_data must be a mapping"
        );
        let mut t = task();
        t["iteration"] = json!(3);
        t["retriedTaskId"] = json!(17);
        let s = AttemptSnapshot::from_task(&t).unwrap();
        assert_eq!((s.iteration, s.retried_task_id.as_deref()), (3, Some("17")));
    }

    #[test]
    fn the_logical_key_survives_a_retry() {
        let first = AttemptSnapshot::from_task(&task()).unwrap();
        let mut t = task();
        t["taskId"] = json!("t2");
        t["seq"] = json!(9);
        t["retryCount"] = json!(3);
        let retry = AttemptSnapshot::from_task(&t).unwrap();
        assert_eq!(first.logical_task_key(), retry.logical_task_key());
    }
}
