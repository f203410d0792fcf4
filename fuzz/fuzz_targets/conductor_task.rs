//! Conductor task decoding: an answer's body (`conductor::answer`), a batch poll's task list
//! (`conductor::polled_tasks`, each task trimmed to the fields a worker reads), each task's attempt snapshot (`AttemptSnapshot::from_task`,
//! `attempt::report_identity`) and the names derived from it (the execution directory, the
//! staging branch).
//!
//! Input: one byte choosing the HTTP status (mostly 200; 0 is 204; from 0xF0 any code), one
//! more for the code, then the body.
//!
//! Asserts: nothing panics; a failed status is an error naming the call, quoting at most
//! 300 characters of the body, or a gateway's refusal of the client certificate (400, 495,
//! 496 with the gateway's words); a success is the body's JSON (or the body as a JSON string),
//! none for 204 or an empty body; a poll answer that is no array is refused, and each polled
//! task is the answer's, trimmed to the fields a worker reads; a snapshot
//! carries the task's own fields, and a refusal names the missing or mistyped field; the
//! execution directory's name stays one plain name; the staging branch is a valid lakeFS
//! branch name that the step's sweep recognises, and no other iteration's sweep does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use perago_conductor::{ConductorError, ErrorKind, POLLED_TASK_FIELDS, answer, polled_tasks};
use perago_fuzz::stays_inside;
use perago_sidecar::execution::safe;
use perago_workspace::attempt::{AttemptSnapshot, report_identity};
use perago_workspace::staging::{StagingBranch, is_step_branch};
use reqwest::StatusCode;
use serde_json::Value;

const EXECUTION_ID: &str = "0b9a7c3e5d1f4a2b8c6d0e1f2a3b4c5d";

const FIELDS: [&str; 11] = [
    "workflow_instance_id",
    "task_id",
    "retry_count",
    "task_def_name",
    "reference_task_name",
    "seq",
    "iteration",
    "status",
    "input_data",
    "retried_task_id",
    "response_timeout_seconds",
];

fn check_safe_name(text: &str) {
    let name = safe(text);
    assert!(!name.is_empty());
    assert!(
        name.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '=' | '-')),
        "{name:?}"
    );
    assert!(
        !name.starts_with(['.', '_']) && !name.ends_with(['.', '_']),
        "{name:?}"
    );
}

fn is_branch_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn check_task(task: &Value) {
    let identity = report_identity(task);
    match AttemptSnapshot::from_task(task) {
        Ok(s) => {
            assert_eq!(task["workflowInstanceId"], s.workflow_instance_id.as_str());
            assert_eq!(task["taskId"], s.task_id.as_str());
            assert_eq!(task["taskDefName"], s.task_def_name.as_str());
            assert_eq!(task["referenceTaskName"], s.reference_task_name.as_str());
            assert_eq!(task["status"], s.status.as_str());
            assert_eq!(task["inputData"].as_object(), Some(&s.input_data));
            assert_eq!(
                identity,
                Some((s.workflow_instance_id.clone(), s.task_id.clone()))
            );
            check_safe_name(&s.task_id);
            let dir = format!("task_id={}-exec={}", safe(&s.task_id), safe(EXECUTION_ID));
            assert!(stays_inside(&dir) && !dir.contains('/'), "{dir:?}");
            let branch = StagingBranch::of(&s, EXECUTION_ID).to_string();
            assert!(is_branch_name(&branch), "{branch:?}");
            assert!(is_step_branch(&branch, &s), "the sweep misses {branch:?}");
            if let Some(other) = s.iteration.checked_add(1) {
                let next = AttemptSnapshot {
                    iteration: other,
                    ..s.clone()
                };
                assert!(
                    !is_step_branch(&branch, &next),
                    "{branch:?} is also iteration {other}'s"
                );
            }
            assert!(s.logical_task_key().starts_with(&s.workflow_instance_id));
        }
        Err(e) => {
            let text = e.to_string();
            assert!(text.starts_with("Conductor task "), "{text}");
            assert!(FIELDS.iter().any(|f| text.contains(f)), "{text}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [s0, s1, body @ ..] = data else {
        return;
    };
    let status = match *s0 {
        0 => StatusCode::NO_CONTENT,
        0xF0.. => StatusCode::from_u16(100 + (u16::from(*s1) * 16 + u16::from(*s0 & 0x0F)) % 900)
            .unwrap_or(StatusCode::OK),
        _ => StatusCode::OK,
    };
    let text = String::from_utf8_lossy(body).into_owned();
    let decoded = match answer("get task", status, text.clone()) {
        Err(ConductorError {
            call,
            task_def: None,
            kind: ErrorKind::Status { status: s, body },
        }) => {
            assert!(!status.is_success());
            assert_eq!((call, s), ("get task", status));
            assert!(body.chars().count() <= 300 && text.starts_with(&body));
            return;
        }
        // A TLS gateway's page refusing the client certificate is its own kind (the request
        // never reached Conductor).
        Err(ConductorError {
            call,
            task_def: None,
            kind: ErrorKind::CertificateRefused(refused),
        }) => {
            assert!(matches!(status.as_u16(), 400 | 495 | 496), "{status}");
            assert_eq!(call, "get task");
            assert!(
                refused.contains(&format!("HTTP {}", status.as_u16())),
                "{refused}"
            );
            return;
        }
        Err(e) => panic!("only a status is an error here: {e}"),
        Ok(decoded) => decoded,
    };
    assert!(status.is_success());
    match &decoded {
        None => assert!(status == StatusCode::NO_CONTENT || text.is_empty()),
        Some(v) => match serde_json::from_str::<Value>(&text) {
            Ok(parsed) => assert_eq!(&parsed, v),
            Err(_) => assert_eq!(v, &Value::String(text.clone())),
        },
    }
    // The poll keeps only the fields a worker reads of each task; the rest is skipped
    // unparsed, so an answer whose skipped parts no full parse accepts may still be read.
    let parsed_whole = text.is_empty() || serde_json::from_str::<Value>(&text).is_ok();
    match (polled_tasks(status, text.clone()), &decoded) {
        (Ok(tasks), None) => assert!(tasks.is_empty()),
        (Ok(tasks), Some(Value::Array(whole))) => {
            assert_eq!(tasks.len(), whole.len());
            for (task, whole) in tasks.iter().zip(whole) {
                match whole {
                    Value::Object(fields) => {
                        let kept: serde_json::Map<String, Value> = fields
                            .iter()
                            .filter(|(k, _)| POLLED_TASK_FIELDS.contains(&k.as_str()))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        assert_eq!(task, &Value::Object(kept));
                    }
                    other => assert_eq!(task, other),
                }
                check_task(task);
            }
        }
        (Ok(tasks), Some(_)) => {
            assert!(
                !parsed_whole,
                "a poll answer that is no array was read: {text:?}"
            );
            tasks.iter().for_each(check_task);
        }
        (Err(e), _) => {
            assert!(!matches!(decoded, None | Some(Value::Array(_))), "{e}");
            let text = e.to_string();
            assert!(
                text.starts_with("Conductor batch poll returned an unreadable answer: expected a JSON array, got "),
                "{text}"
            );
        }
    }
    if let Some(task) = &decoded {
        check_task(task);
    }
});
