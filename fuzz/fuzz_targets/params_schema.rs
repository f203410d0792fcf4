//! Params and result acceptance against a task's schemas: `input::accept` (the top-level key
//! set of `inputData`), `Schemas::params` (strict and non-strict), `Schemas::result`, and the
//! error document a body may write (`execution::error_document`).
//!
//! Input: `0xFF`-separated parts `flags, paramsSchema, inputData, resultSchema, result`. The
//! schemas go through the operator's transformation (`schema::transform`) as a contract's do;
//! a schema it refuses is compiled as given, so the sidecar's own checks see any shape.
//!
//! Asserts: nothing panics; compile errors name the schema; accepted input has the keys the
//! mode requires; params are accepted exactly when the JSON Schema validator accepts them
//! (after the non-strict mode's stripping) and every refusal is `invalid params: params…`;
//! the same for results; an error document always ends in a failure with a reason, cut to
//! any length on a character boundary.
#![no_main]

use libfuzzer_sys::fuzz_target;
use perago_api::contract::{ContractWorkspace, TaskContract};
use perago_api::schema;
use perago_fuzz::{part, parts};
use perago_sidecar::execution::error_document;
use perago_sidecar::input::{self, Schemas};
use perago_sidecar::outcome::Outcome;
use serde_json::{Map, Value};

fn object(text: &str) -> Option<Map<String, Value>> {
    match serde_json::from_str(text) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

/// The contract form of a business schema: transformed when the operator would accept it.
fn contract_schema(raw: Map<String, Value>) -> Map<String, Value> {
    match schema::transform(&raw, false) {
        Ok(strict) => strict,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            raw
        }
    }
}

fn valid(schema: &Map<String, Value>, value: &Value) -> bool {
    jsonschema::validator_for(&Value::Object(schema.clone()))
        .expect("compiled once already")
        .is_valid(value)
}

fn check_refusal(message: &str, what: &str) {
    let head = format!("invalid {what}: ");
    let rest = message
        .strip_prefix(&head)
        .unwrap_or_else(|| panic!("{message:?} does not start with {head:?}"));
    assert!(!rest.is_empty(), "{message:?} names no problem");
}

fuzz_target!(|data: &[u8]| {
    let parts = parts(data);
    let flags = parts.first().and_then(|p| p.bytes().next()).unwrap_or(0);
    let strict = flags & 1 != 0;
    let workspace_task = flags & 2 != 0;
    let Some(params_schema) = object(part(&parts, 1, r#"{"type":"object"}"#)) else {
        return;
    };
    let result_schema = object(part(&parts, 3, r#"{"type":"object"}"#)).unwrap_or_else(Map::new);
    let contract = TaskContract {
        version: 1,
        task_name: "fuzz.task".into(),
        workspace: workspace_task.then(|| ContractWorkspace {
            prefix: "/".into(),
            read_only: true,
            pre: Vec::new(),
            post: Vec::new(),
        }),
        strict_params: strict,
        params_schema: contract_schema(params_schema),
        result_schema: contract_schema(result_schema),
        metrics: None,
        slots: 1,
        response_timeout_seconds: 30,
        timeout_seconds: 0,
        publish_budget: None,
    };
    let schemas = match Schemas::compile(&contract) {
        Ok(s) => s,
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.starts_with("task contract paramsSchema is not a valid JSON Schema: ")
                    || e.starts_with("task contract resultSchema is not a valid JSON Schema: "),
                "{e}"
            );
            return;
        }
    };

    if let Some(input_data) = object(part(&parts, 2, r#"{"params":{}}"#)) {
        match input::accept(&contract, &input_data) {
            Ok(accepted) => {
                assert!(input_data.contains_key("params"));
                assert_eq!(accepted.params, input_data["params"]);
                assert_eq!(accepted.workspace.as_ref(), input_data.get("workspace"));
                assert!(!workspace_task || accepted.workspace.is_some());
                if strict {
                    assert_eq!(input_data.len(), 1 + usize::from(workspace_task));
                }
                let judged = if strict {
                    accepted.params.clone()
                } else {
                    let mut stripped = accepted.params.clone();
                    input::strip_undeclared(
                        &Value::Object(contract.params_schema.clone()),
                        &mut stripped,
                    );
                    stripped
                };
                let accepted_by_validator = valid(&contract.params_schema, &judged);
                match schemas.params(accepted.params, strict) {
                    Ok(_) => assert!(accepted_by_validator, "params accepted against the schema"),
                    Err(e) => {
                        assert!(
                            !accepted_by_validator,
                            "params refused that the schema accepts: {e}"
                        );
                        check_refusal(&e.to_string(), "params");
                    }
                }
            }
            Err(e) => assert!(
                [
                    "workspace task input must contain only workspace and params",
                    "workspace task input must contain workspace and params",
                    "workspace-free task input must contain only params",
                    "workspace-free task input must contain params",
                ]
                .contains(&e.to_string().as_str()),
                "{e}"
            ),
        }
    }

    let result_text = part(&parts, 4, "{}");
    if let Ok(result) = serde_json::from_str::<Value>(result_text) {
        let accepted_by_validator = valid(&contract.result_schema, &result);
        match schemas.result(&result) {
            Ok(()) => assert!(accepted_by_validator, "result accepted against the schema"),
            Err(e) => {
                assert!(
                    !accepted_by_validator,
                    "result refused that the schema accepts: {e}"
                );
                check_refusal(&e.to_string(), "result");
            }
        }
    }
    let mut outcome = Outcome::from(error_document(result_text.as_bytes()));
    let reason = outcome
        .reason()
        .expect("an error document is a failure")
        .to_owned();
    assert!(matches!(outcome, Outcome::Failed(_) | Outcome::Terminal(_)));
    let max = usize::from(flags >> 2);
    let cut = outcome.truncate_reason(max);
    let kept = outcome.reason().unwrap_or_default();
    match cut {
        Some(length) => {
            assert_eq!(length, reason.chars().count());
            assert_eq!(kept.chars().count(), max);
            assert!(reason.starts_with(kept));
        }
        None => {
            assert!(reason.chars().count() <= max);
            assert_eq!(kept, reason);
        }
    }
});
