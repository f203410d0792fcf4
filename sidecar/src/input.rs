//! Input acceptance and the params/result checks against the contract's JSON Schemas.
//!
//! Strict tasks accept exactly the declared top-level keys and refuse undeclared params
//! fields. Non-strict tasks (Python Perago 0.6.1's default) ignore other top-level keys and
//! drop undeclared params fields at every level before the body sees them. Results always
//! refuse undeclared fields: the contract's schemas say `additionalProperties: false` on every
//! object that declares properties.

use jsonschema::Validator;
use jsonschema::error::ValidationErrorKind;
use serde_json::{Map, Value};

use perago_api::contract::TaskContract;

/// The compiled schemas of one contract.
pub struct Schemas {
    params_schema: Value,
    params: Validator,
    result: Validator,
}

impl Schemas {
    pub fn compile(contract: &TaskContract) -> Result<Self, String> {
        let params_schema = Value::Object(contract.params_schema.clone());
        let params = jsonschema::validator_for(&params_schema)
            .map_err(|e| format!("task contract paramsSchema is not a valid JSON Schema: {e}"))?;
        let result = jsonschema::validator_for(&Value::Object(contract.result_schema.clone()))
            .map_err(|e| format!("task contract resultSchema is not a valid JSON Schema: {e}"))?;
        Ok(Self {
            params_schema,
            params,
            result,
        })
    }

    /// Validate params; in non-strict mode undeclared fields are dropped first.
    pub fn params(&self, mut params: Value, strict: bool) -> Result<Value, String> {
        if !strict {
            strip_undeclared(&self.params_schema, &mut params);
        }
        check(&self.params, &params, "params")?;
        fill_defaults(&self.params_schema, &mut params);
        Ok(params)
    }

    pub fn result(&self, result: &Value) -> Result<(), String> {
        check(&self.result, result, "result")
    }
}

/// The accepted parts of a task input.
#[derive(Debug, PartialEq)]
pub struct AcceptedInput {
    pub workspace: Option<Value>,
    pub params: Value,
}

/// Check the top-level key set of `inputData`.
pub fn accept(
    contract: &TaskContract,
    input: &Map<String, Value>,
) -> Result<AcceptedInput, String> {
    let workspace_task = contract.is_workspace_task();
    let expected: &[&str] = if workspace_task {
        &["workspace", "params"]
    } else {
        &["params"]
    };
    let all_present = expected.iter().all(|k| input.contains_key(*k));
    let only_these = input.len() == expected.len();
    let ok = all_present && (only_these || !contract.strict_params);
    if !ok {
        let (strict_text, lenient_text) = if workspace_task {
            (
                "workspace task input must contain only workspace and params",
                "workspace task input must contain workspace and params",
            )
        } else {
            (
                "workspace-free task input must contain only params",
                "workspace-free task input must contain params",
            )
        };
        return Err(if contract.strict_params {
            strict_text
        } else {
            lenient_text
        }
        .to_owned());
    }
    Ok(AcceptedInput {
        workspace: input.get("workspace").cloned(),
        params: input.get("params").cloned().unwrap_or(Value::Null),
    })
}

fn check(validator: &Validator, value: &Value, what: &str) -> Result<(), String> {
    let mut problems = Vec::new();
    for error in validator.iter_errors(value) {
        let path = dotted(what, error.instance_path().as_str());
        match error.kind() {
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                for key in unexpected {
                    problems.push(format!("{path}.{key}: Extra inputs are not permitted"));
                }
            }
            ValidationErrorKind::Required { property } => {
                let name = property
                    .as_str()
                    .map_or_else(|| property.to_string(), str::to_owned);
                problems.push(format!("{path}.{name}: Field required"));
            }
            _ => problems.push(format!("{path}: {error}")),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("invalid {what}: {}", problems.join("; ")))
    }
}

/// `params` + JSON pointer `/inner/0/q` → `params.inner.0.q`.
fn dotted(root: &str, pointer: &str) -> String {
    let mut out = root.to_owned();
    for segment in pointer.split('/').skip(1) {
        out.push('.');
        out.push_str(&segment.replace("~1", "/").replace("~0", "~"));
    }
    out
}

/// Drop object keys the schema does not declare, at every level: inside nested objects,
/// list items, map values and the branch of an `anyOf`/`oneOf` that fits the value best.
/// Free-form maps (objects without `properties`) keep their keys.
pub fn strip_undeclared(schema: &Value, value: &mut Value) {
    let Some(schema) = schema.as_object() else {
        return;
    };
    if let Some(branch) = union_branch(schema, value) {
        strip_undeclared(branch, value);
        return;
    }
    match value {
        Value::Object(map) => {
            let properties = declared_properties(schema);
            if let Some(properties) = properties {
                map.retain(|k, _| properties.contains_key(k));
                for (key, item) in map.iter_mut() {
                    if let Some(sub) = properties.get(key) {
                        strip_undeclared(sub, item);
                    }
                }
            } else if let Some(values) =
                schema.get("additionalProperties").filter(|v| v.is_object())
            {
                for item in map.values_mut() {
                    strip_undeclared(values, item);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    strip_undeclared(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

/// Fill in the schema's `default` of every declared property the value lacks, at every level
/// (as a Pydantic model hands defaults to Python Perago's task functions), so bodies in any
/// language see the same params. Runs after validation; defaults are taken as declared.
pub fn fill_defaults(schema: &Value, value: &mut Value) {
    let Some(schema) = schema.as_object() else {
        return;
    };
    if let Some(branch) = union_branch(schema, value) {
        fill_defaults(branch, value);
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(properties) = declared_properties(schema) {
                for (key, sub) in &properties {
                    match map.get_mut(key) {
                        Some(item) => fill_defaults(sub, item),
                        None => {
                            if let Some(default) = sub.get("default") {
                                map.insert(key.clone(), default.clone());
                            }
                        }
                    }
                }
            } else if let Some(values) =
                schema.get("additionalProperties").filter(|v| v.is_object())
            {
                for item in map.values_mut() {
                    fill_defaults(values, item);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    fill_defaults(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

/// `properties`, merged with those of `allOf` members.
fn declared_properties(schema: &Map<String, Value>) -> Option<Map<String, Value>> {
    let mut merged: Option<Map<String, Value>> =
        schema.get("properties").and_then(Value::as_object).cloned();
    for member in schema
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(props) = member.get("properties").and_then(Value::as_object) {
            merged.get_or_insert_with(Map::new).extend(props.clone());
        }
    }
    merged
}

/// The `anyOf`/`oneOf` branch to strip with: among branches that accept the value's JSON
/// type, the one whose required keys are all present and that declares most of the value's
/// keys.
fn union_branch<'s>(schema: &'s Map<String, Value>, value: &Value) -> Option<&'s Value> {
    let branches = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)?;
    let fits = |branch: &Value| -> Option<usize> {
        let b = branch.as_object()?;
        match (b.get("type").and_then(Value::as_str), value) {
            (Some("object") | None, Value::Object(map)) => {
                let required_ok = b
                    .get("required")
                    .and_then(Value::as_array)
                    .is_none_or(|req| {
                        req.iter()
                            .filter_map(Value::as_str)
                            .all(|k| map.contains_key(k))
                    });
                let props = declared_properties(b)?;
                required_ok.then(|| map.keys().filter(|k| props.contains_key(*k)).count())
            }
            (Some("array") | None, Value::Array(_)) if b.contains_key("items") => Some(0),
            _ => None,
        }
    };
    branches
        .iter()
        .filter_map(|b| fits(b).map(|score| (score, b)))
        .max_by_key(|(score, _)| *score)
        .map(|(_, b)| b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn contract(strict: bool, workspace: bool) -> TaskContract {
        let params = json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "n": {"type": "integer", "minimum": 0},
                "inner": {"type": "object", "additionalProperties": false,
                          "properties": {"q": {"type": "string"}}},
                "lst": {"type": "array", "items": {"type": "object", "additionalProperties": false,
                        "properties": {"a": {"type": "integer"}}}},
                "map": {"type": "object", "additionalProperties": {"type": "object",
                        "additionalProperties": false, "properties": {"b": {"type": "integer"}}}},
                "opt": {"anyOf": [{"type": "object", "additionalProperties": false,
                        "properties": {"c": {"type": "integer"}}}, {"type": "null"}]}
            },
            "required": ["n"]
        });
        let result = json!({"type": "object", "additionalProperties": false,
            "properties": {"total": {"type": "integer"}}, "required": ["total"]});
        serde_json::from_value(json!({
            "version": 1, "taskName": "t", "strictParams": strict,
            "workspace": if workspace { json!({"prefix": "/", "readOnly": false}) } else { Value::Null },
            "paramsSchema": params, "resultSchema": result, "slots": 1,
            "responseTimeoutSeconds": 10, "timeoutSeconds": 0
        }))
        .unwrap()
    }

    fn input(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn key_sets_per_mode() {
        let strict = contract(true, false);
        let lenient = contract(false, false);
        let extra = input(json!({"params": {"n": 1}, "workspace": {}}));
        assert_eq!(
            accept(&strict, &extra).unwrap_err(),
            "workspace-free task input must contain only params"
        );
        assert_eq!(accept(&lenient, &extra).unwrap().params, json!({"n": 1}));
        assert_eq!(
            accept(&lenient, &input(json!({"x": 1}))).unwrap_err(),
            "workspace-free task input must contain params"
        );
        let ws_strict = contract(true, true);
        assert_eq!(
            accept(&ws_strict, &input(json!({"params": {}}))).unwrap_err(),
            "workspace task input must contain only workspace and params"
        );
        assert_eq!(
            accept(&contract(false, true), &input(json!({"params": {}}))).unwrap_err(),
            "workspace task input must contain workspace and params"
        );
    }

    #[test]
    fn strict_params_refuse_undeclared_fields_with_paths() {
        let c = contract(true, false);
        let s = Schemas::compile(&c).unwrap();
        let err = s
            .params(
                json!({"n": 1, "zzz": 2, "inner": {"q": "x", "r": 1}, "lst": [{"a": 1, "q": 2}]}),
                true,
            )
            .unwrap_err();
        assert!(err.starts_with("invalid params: "), "{err}");
        for part in [
            "params.zzz: Extra inputs are not permitted",
            "params.inner.r: Extra inputs are not permitted",
            "params.lst.0.q: Extra inputs are not permitted",
        ] {
            assert!(err.contains(part), "{err} lacks {part}");
        }
        let err = s.params(json!({}), true).unwrap_err();
        assert_eq!(err, "invalid params: params.n: Field required");
        let err = s.params(json!({"n": -1}), true).unwrap_err();
        assert!(
            err.contains("params.n: -1 is less than the minimum of 0"),
            "{err}"
        );
    }

    #[test]
    fn lenient_params_drop_undeclared_fields_at_every_level() {
        let c = contract(false, false);
        let s = Schemas::compile(&c).unwrap();
        let params = s
            .params(
                json!({"n": 1, "zzz": 2, "inner": {"q": "x", "r": 1}, "lst": [{"a": 1, "q": 2}],
                       "map": {"k": {"b": 1, "drop": true}}, "opt": {"c": 3, "d": 4}}),
                false,
            )
            .unwrap();
        assert_eq!(
            params,
            json!({"n": 1, "inner": {"q": "x"}, "lst": [{"a": 1}], "map": {"k": {"b": 1}}, "opt": {"c": 3}})
        );
        // Constraints still apply.
        assert!(s.params(json!({"n": "x", "zzz": 1}), false).is_err());
    }

    #[test]
    fn absent_params_get_their_declared_defaults_at_every_level() {
        let schema = json!({"type": "object", "properties": {
            "mode": {"type": "string", "default": "fast"},
            "given": {"type": "integer", "default": 1},
            "window": {"type": "object", "properties": {
                "start": {"type": "integer", "default": 0},
                "end": {"type": "integer"}}},
            "rows": {"type": "array", "items": {"type": "object", "properties": {
                "w": {"type": "number", "default": 1.5}}}},
            "maybe": {"anyOf": [{"type": "object", "properties": {"k": {"default": "v"}}}, {"type": "null"}]}}});
        let mut params =
            json!({"given": 7, "window": {"end": 9}, "rows": [{}, {"w": 2}], "maybe": {}});
        fill_defaults(&schema, &mut params);
        assert_eq!(
            params,
            json!({"mode": "fast", "given": 7, "window": {"start": 0, "end": 9},
                   "rows": [{"w": 1.5}, {"w": 2}], "maybe": {"k": "v"}})
        );
    }

    #[test]
    fn results_refuse_undeclared_fields_in_every_mode() {
        let s = Schemas::compile(&contract(false, false)).unwrap();
        s.result(&json!({"total": 3})).unwrap();
        assert_eq!(
            s.result(&json!({"total": 3, "extra": 1})).unwrap_err(),
            "invalid result: result.extra: Extra inputs are not permitted"
        );
        assert!(
            s.result(&json!({"total": "3"}))
                .unwrap_err()
                .contains("result.total")
        );
    }
}
