//! The workflow reads of `kubectl perago explain`: a workflow and its tasks, as far as they
//! are read.

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::TaskStatus;

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
    pub status: TaskStatus,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
