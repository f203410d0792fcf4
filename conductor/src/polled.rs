//! A batch poll's answer, read for what a worker uses of each task.
//!
//! Conductor sends every polled task whole: besides the fields an attempt needs, its copy of
//! the workflow task and of the TaskDef (each with its own maps and schemas), and some forty
//! timestamps, flags and counters. Parsed into a `Value`, each is a map entry and a string to
//! allocate and then drop, for every task of every poll. Only [`POLLED_TASK_FIELDS`] are kept;
//! the rest is skipped by the parser without being built.

use std::fmt;

use reqwest::StatusCode;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::client::{answer, call, kind};
use crate::error::{ConductorError, ErrorKind};

/// The fields of a polled task that the sidecar reads: the attempt snapshot's, the report's,
/// the trace's and the lineage's. A polled task holds no others.
pub const POLLED_TASK_FIELDS: [&str; 14] = [
    "workflowInstanceId",
    "workflowType",
    "taskId",
    "retryCount",
    "taskDefName",
    "referenceTaskName",
    "seq",
    "iteration",
    "status",
    "inputData",
    "retriedTaskId",
    "responseTimeoutSeconds",
    "workerId",
    "pollCount",
];

/// The tasks of a batch poll's answer, each an object of [`POLLED_TASK_FIELDS`] only (an
/// element that is no object stays as it is, for the snapshot to refuse); none for 204 or an
/// empty body. A failed status is the error [`answer`] makes of it.
pub fn polled_tasks(status: StatusCode, text: String) -> Result<Vec<Value>, ConductorError> {
    if !status.is_success() || status == StatusCode::NO_CONTENT || text.is_empty() {
        return answer("batch poll", status, text).map(|_| Vec::new());
    }
    let mut parser = serde_json::Deserializer::from_str(&text);
    let parsed = parser.deserialize_seq(Tasks).and_then(|tasks| {
        parser.end()?;
        Ok(tasks)
    });
    parsed.map_err(|_| {
        // Rare: say what the answer was instead, as a full parse reads it.
        let whole = serde_json::from_str(&text).unwrap_or(Value::String(text));
        call("batch poll").error(ErrorKind::Decode(format!(
            "expected a JSON array, got {}",
            kind(&whole)
        )))
    })
}

/// A JSON array of tasks.
struct Tasks;

impl<'de> Visitor<'de> for Tasks {
    type Value = Vec<Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut tasks = Vec::with_capacity(seq.size_hint().unwrap_or(1));
        while let Some(task) = seq.next_element_seed(Task)? {
            tasks.push(task);
        }
        Ok(tasks)
    }
}

/// One element of the array: an object trimmed to [`POLLED_TASK_FIELDS`], anything else whole.
struct Task;

impl<'de> DeserializeSeed<'de> for Task {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Task {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a task")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut kept = Map::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if POLLED_TASK_FIELDS.contains(&key.as_ref()) {
                kept.insert(key.into_owned(), map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Value::Object(kept))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        serde::Deserialize::deserialize(de::value::SeqAccessDeserializer::new(seq))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn polled(text: &str) -> Result<Vec<Value>, ConductorError> {
        polled_tasks(StatusCode::OK, text.to_owned())
    }

    #[test]
    fn a_task_keeps_only_the_fields_a_worker_reads() {
        let full = json!({
            "taskType": "demo", "status": "IN_PROGRESS", "inputData": {"params": {"n": 1}, "workspace": null},
            "referenceTaskName": "step", "retryCount": 0, "seq": 1, "pollCount": 1,
            "taskDefName": "demo", "workflowInstanceId": "wf", "workflowType": "flow", "taskId": "t1",
            "workerId": "pod-a", "responseTimeoutSeconds": 30, "iteration": 0,
            "workflowTask": {"name": "demo", "inputParameters": {"a": [1, 2, {"b": null}]}},
            "taskDefinition": {"name": "demo", "inputKeys": ["params"], "timeoutSeconds": 60.5},
            "callbackAfterSeconds": 0, "outputData": {}, "retried": false
        });
        let tasks = polled(&json!([full.clone(), full]).to_string()).unwrap();
        assert_eq!(tasks.len(), 2);
        for task in tasks {
            let keys: Vec<&str> = task
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            assert!(
                keys.iter().all(|k| POLLED_TASK_FIELDS.contains(k)),
                "{keys:?}"
            );
            assert_eq!(keys.len(), 13, "every one but retriedTaskId: {keys:?}");
            assert_eq!(
                task["inputData"],
                json!({"params": {"n": 1}, "workspace": null})
            );
            assert_eq!(task["workflowType"], "flow");
        }
    }

    #[test]
    fn elements_that_are_no_object_stay_whole_and_no_task_is_none() {
        let tasks = polled(r#"[1, -2, 2.5, "x", null, true, [{"taskId": "t"}]]"#).unwrap();
        assert_eq!(
            tasks,
            vec![
                json!(1),
                json!(-2),
                json!(2.5),
                json!("x"),
                Value::Null,
                json!(true),
                json!([{"taskId": "t"}])
            ]
        );
        assert!(polled("[]").unwrap().is_empty());
        assert!(polled("").unwrap().is_empty());
        assert!(
            polled_tasks(StatusCode::NO_CONTENT, String::new())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn an_answer_that_is_no_array_is_named() {
        for (text, what) in [
            ("{}", "an object"),
            ("7", "a number"),
            ("no json", "a string"),
            ("[1,", "a string"),
            ("[] []", "a string"),
        ] {
            assert_eq!(
                polled(text).unwrap_err().to_string(),
                format!(
                    "Conductor batch poll returned an unreadable answer: expected a JSON array, got {what}"
                )
            );
        }
        let refused = polled_tasks(StatusCode::BAD_GATEWAY, "down".into()).unwrap_err();
        assert!(refused.is_transient(), "{refused}");
    }
}
