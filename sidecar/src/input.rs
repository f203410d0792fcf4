//! Input acceptance and the params/result checks against the contract's JSON Schemas.
//!
//! Strict tasks accept exactly the declared top-level keys and refuse undeclared params
//! fields. Non-strict tasks (Python Perago 0.6.1's default) ignore other top-level keys and
//! drop undeclared params fields at every level before the body sees them. Results always
//! refuse undeclared fields: the contract's schemas say `additionalProperties: false` on every
//! object that declares properties.

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{JsonType, Validator};
use serde_json::{Map, Value};

use perago_contract::contract::TaskContract;

/// Why a task's input (or a body's result) was refused, in Python Perago 0.6.1's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The top-level keys of `inputData`.
    #[error("{0}")]
    Keys(&'static str),
    /// A value breaks its schema (`what`: params, result, workspace); one problem per field.
    #[error("invalid {what}: {}", .problems.join("; "))]
    Invalid {
        what: &'static str,
        problems: Vec<String>,
    },
}

impl From<perago_workspace::reference::InvalidWorkspace> for InputError {
    fn from(e: perago_workspace::reference::InvalidWorkspace) -> Self {
        Self::Invalid {
            what: "workspace",
            problems: e.problems,
        }
    }
}

/// A schema of the task contract does not compile (the sidecar refuses to start).
#[derive(Debug, thiserror::Error)]
#[error("task contract {which} is not a valid JSON Schema: {cause}")]
pub struct SchemaError {
    which: &'static str,
    cause: String,
}

/// The compiled schemas of one contract.
pub struct Schemas {
    params_schema: Value,
    params: Validator,
    result: Validator,
}

impl Schemas {
    pub fn compile(contract: &TaskContract) -> Result<Self, SchemaError> {
        let invalid = |which| {
            move |e: jsonschema::ValidationError| SchemaError {
                which,
                cause: e.to_string(),
            }
        };
        let params_schema = Value::Object(contract.params_schema.clone());
        let params = jsonschema::validator_for(&params_schema).map_err(invalid("paramsSchema"))?;
        let result = jsonschema::validator_for(&Value::Object(contract.result_schema.clone()))
            .map_err(invalid("resultSchema"))?;
        Ok(Self {
            params_schema,
            params,
            result,
        })
    }

    /// Validate params; in non-strict mode undeclared fields are dropped first.
    pub fn params(&self, mut params: Value, strict: bool) -> Result<Value, InputError> {
        if !strict {
            strip_undeclared(&self.params_schema, &mut params);
        }
        check(&self.params, &params, "params")?;
        fill_defaults(&self.params_schema, &mut params);
        Ok(params)
    }

    pub fn result(&self, result: &Value) -> Result<(), InputError> {
        check(&self.result, result, "result")
    }
}

/// The accepted parts of a task input.
#[derive(Debug, PartialEq)]
pub struct AcceptedInput {
    pub workspace: Option<Value>,
    pub params: Value,
}

/// Top-level input keys the runtime reads itself, beside the contract's: the W3C trace context
/// an attempt's trace continues (ADR 0041). Accepted in strict mode too; the body never sees
/// them.
pub const RUNTIME_KEYS: &[&str] = &["traceparent"];

/// Check the top-level key set of `inputData`.
pub fn accept(
    contract: &TaskContract,
    input: &Map<String, Value>,
) -> Result<AcceptedInput, InputError> {
    let workspace_task = contract.is_workspace_task();
    let expected: &[&str] = if workspace_task {
        &["workspace", "params"]
    } else {
        &["params"]
    };
    let all_present = expected.iter().all(|k| input.contains_key(*k));
    let only_these = input
        .keys()
        .all(|k| expected.contains(&k.as_str()) || RUNTIME_KEYS.contains(&k.as_str()));
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
        return Err(InputError::Keys(if contract.strict_params {
            strict_text
        } else {
            lenient_text
        }));
    }
    Ok(AcceptedInput {
        workspace: input.get("workspace").cloned(),
        params: input.get("params").cloned().unwrap_or(Value::Null),
    })
}

fn check(validator: &Validator, value: &Value, what: &'static str) -> Result<(), InputError> {
    let mut problems = Vec::new();
    // Pydantic stops at a value's first failing constraint: one problem per value.
    let mut judged = std::collections::HashSet::new();
    for error in validator.iter_errors(value) {
        let path = dotted(what, error.instance_path().as_str());
        match error.kind() {
            ValidationErrorKind::AdditionalProperties { unexpected }
            | ValidationErrorKind::UnevaluatedProperties { unexpected } => {
                for key in unexpected {
                    problems.push(format!("{path}.{key}: {EXTRA}"));
                }
            }
            ValidationErrorKind::Required { property } => {
                let name = property
                    .as_str()
                    .map_or_else(|| property.to_string(), str::to_owned);
                problems.push(format!("{path}.{name}: Field required"));
            }
            kind => {
                if !judged.insert(path.clone()) {
                    continue;
                }
                let text = pydantic_text(kind, error.instance())
                    .unwrap_or_else(|| error.masked_with("Input").to_string());
                problems.push(format!("{path}: {text}"));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(InputError::Invalid { what, problems })
    }
}

const EXTRA: &str = "Extra inputs are not permitted";

/// The Pydantic v2 message (Python Perago 0.6.1 validates with Pydantic) for the common
/// JSON Schema failures; `None` for the rest, which keep the validator's own text with the
/// value left out (`Input is not valid under any of the schemas listed in the 'anyOf'
/// keyword`).
fn pydantic_text(kind: &ValidationErrorKind, instance: &Value) -> Option<String> {
    let text = match kind {
        ValidationErrorKind::Type { kind } => {
            let single = match kind {
                TypeKind::Single(t) => *t,
                // `Optional[X]`: Pydantic reports X's error.
                TypeKind::Multiple(set) => {
                    let mut others = set.iter().filter(|t| *t != JsonType::Null);
                    match (others.next(), others.next()) {
                        (Some(t), None) => t,
                        _ => return None,
                    }
                }
            };
            match single {
                JsonType::String => "Input should be a valid string".to_owned(),
                JsonType::Integer if instance.as_f64().is_some_and(|f| f.fract() != 0.0) => {
                    "Input should be a valid integer, got a number with a fractional part"
                        .to_owned()
                }
                JsonType::Integer => "Input should be a valid integer".to_owned(),
                JsonType::Number => "Input should be a valid number".to_owned(),
                JsonType::Boolean => "Input should be a valid boolean".to_owned(),
                JsonType::Object => "Input should be a valid dictionary".to_owned(),
                JsonType::Array => "Input should be a valid list".to_owned(),
                JsonType::Null => "Input should be None".to_owned(),
            }
        }
        ValidationErrorKind::Enum { options } => {
            let options: Vec<String> = options
                .as_array()
                .map(|o| o.iter().map(python_repr).collect())
                .unwrap_or_else(|| vec![python_repr(options)]);
            format!("Input should be {}", one_of(&options))
        }
        ValidationErrorKind::Constant { expected_value } => {
            format!("Input should be {}", python_repr(expected_value))
        }
        ValidationErrorKind::Minimum { limit } => {
            format!("Input should be greater than or equal to {limit}")
        }
        ValidationErrorKind::Maximum { limit } => {
            format!("Input should be less than or equal to {limit}")
        }
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            format!("Input should be greater than {limit}")
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            format!("Input should be less than {limit}")
        }
        ValidationErrorKind::MultipleOf { multiple_of } => {
            format!("Input should be a multiple of {multiple_of}")
        }
        ValidationErrorKind::MinLength { limit } => {
            format!(
                "String should have at least {}",
                counted(*limit, "character")
            )
        }
        ValidationErrorKind::MaxLength { limit } => {
            format!(
                "String should have at most {}",
                counted(*limit, "character")
            )
        }
        ValidationErrorKind::Pattern { pattern } => {
            format!("String should match pattern '{pattern}'")
        }
        ValidationErrorKind::MinItems { limit } => format!(
            "List should have at least {} after validation, not {}",
            counted(*limit, "item"),
            instance.as_array().map_or(0, Vec::len)
        ),
        ValidationErrorKind::MaxItems { limit } => format!(
            "List should have at most {} after validation, not {}",
            counted(*limit, "item"),
            instance.as_array().map_or(0, Vec::len)
        ),
        ValidationErrorKind::MinProperties { limit } => format!(
            "Dictionary should have at least {} after validation, not {}",
            counted(*limit, "item"),
            instance.as_object().map_or(0, Map::len)
        ),
        ValidationErrorKind::MaxProperties { limit } => format!(
            "Dictionary should have at most {} after validation, not {}",
            counted(*limit, "item"),
            instance.as_object().map_or(0, Map::len)
        ),
        _ => return None,
    };
    Some(text)
}

/// `1 item`, `2 items` (Pydantic's plural rule).
fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("{n} {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `'a'`, `'a' or 'b'`, `'a', 'b' or 'c'` (Pydantic's literal and enum lists).
fn one_of(options: &[String]) -> String {
    match options {
        [] => String::new(),
        [only] => only.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// A JSON value as Python's `repr` shows the decoded value: `'text'`, `True`, `None`, `5`.
fn python_repr(v: &Value) -> String {
    match v {
        Value::String(s) if s.contains('\'') && !s.contains('"') => {
            format!("\"{}\"", s.replace('\\', "\\\\"))
        }
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::Null => "None".to_owned(),
        other => other.to_string(),
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
    each_declared_object(schema, value, &|properties, map| {
        map.retain(|k, _| properties.contains_key(k));
    });
}

/// Fill in the schema's `default` of every declared property the value lacks, at every level
/// (as a Pydantic model hands defaults to Python Perago's task functions), so bodies in any
/// language see the same params. Runs after validation; defaults are taken as declared.
pub fn fill_defaults(schema: &Value, value: &mut Value) {
    each_declared_object(schema, value, &|properties, map| {
        for (key, sub) in properties {
            if let Some(default) = sub.get("default")
                && !map.contains_key(key)
            {
                map.insert(key.clone(), default.clone());
            }
        }
    });
}

/// Call `at` with each object of `value` whose schema declares properties (and those
/// properties), deepest first, following the schema as validation does: declared properties,
/// list items, map values and the best-fitting branch of an `anyOf`/`oneOf`.
fn each_declared_object(
    schema: &Value,
    value: &mut Value,
    at: &impl Fn(&Map<String, Value>, &mut Map<String, Value>),
) {
    let Some(schema) = schema.as_object() else {
        return;
    };
    if let Some(branch) = union_branch(schema, value) {
        return each_declared_object(branch, value, at);
    }
    match value {
        Value::Object(map) => {
            if let Some(properties) = declared_properties(schema) {
                for (key, item) in map.iter_mut() {
                    if let Some(sub) = properties.get(key) {
                        each_declared_object(sub, item, at);
                    }
                }
                at(&properties, map);
            } else if let Some(values) =
                schema.get("additionalProperties").filter(|v| v.is_object())
            {
                for item in map.values_mut() {
                    each_declared_object(values, item, at);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    each_declared_object(item_schema, item, at);
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
            accept(&strict, &extra).unwrap_err().to_string(),
            "workspace-free task input must contain only params"
        );
        assert_eq!(accept(&lenient, &extra).unwrap().params, json!({"n": 1}));
        assert_eq!(
            accept(&lenient, &input(json!({"x": 1})))
                .unwrap_err()
                .to_string(),
            "workspace-free task input must contain params"
        );
        let ws_strict = contract(true, true);
        assert_eq!(
            accept(&ws_strict, &input(json!({"params": {}})))
                .unwrap_err()
                .to_string(),
            "workspace task input must contain only workspace and params"
        );
        assert_eq!(
            accept(&contract(false, true), &input(json!({"params": {}})))
                .unwrap_err()
                .to_string(),
            "workspace task input must contain workspace and params"
        );
        // The trace context is the runtime's own key, in either mode; the body gets params.
        let traced = input(json!({"params": {"n": 1}, "traceparent": "00-x"}));
        assert_eq!(accept(&strict, &traced).unwrap().params, json!({"n": 1}));
        let traced_ws = input(json!({"params": {}, "workspace": {}, "traceparent": "00-x"}));
        assert!(accept(&ws_strict, &traced_ws).is_ok());
        assert!(accept(&strict, &input(json!({"traceparent": "00-x"}))).is_err());
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
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("invalid params: "), "{err}");
        for part in [
            "params.zzz: Extra inputs are not permitted",
            "params.inner.r: Extra inputs are not permitted",
            "params.lst.0.q: Extra inputs are not permitted",
        ] {
            assert!(err.contains(part), "{err} lacks {part}");
        }
        let err = s.params(json!({}), true).unwrap_err().to_string();
        assert_eq!(err, "invalid params: params.n: Field required");
        let err = s.params(json!({"n": -1}), true).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid params: params.n: Input should be greater than or equal to 0"
        );
    }

    /// Every mapped kind gives Pydantic v2's text; others keep the validator's, without the
    /// value.
    #[test]
    fn violations_read_as_pydantic_v2_messages() {
        let schema = json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "name": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^[a-z]+$"},
                "one": {"type": "string", "minLength": 1},
                "count": {"type": "integer", "minimum": 0, "maximum": 10},
                "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1.5},
                "step": {"type": "integer", "multipleOf": 5},
                "flag": {"type": "boolean"},
                "inner": {"type": "object", "minProperties": 1, "maxProperties": 1},
                "tags": {"type": "array", "minItems": 2, "maxItems": 3},
                "single": {"type": "array", "minItems": 1},
                "mode": {"enum": ["fast", "exact", "it's"]},
                "pair": {"enum": [1, true, null]},
                "kind": {"const": "commit"},
                "maybe": {"type": ["integer", "null"]},
                "either": {"type": ["integer", "string"]},
                "nothing": {"type": "null"},
                "any": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "when": {"type": "string", "format": "date"}
            }
        });
        let contract: TaskContract = serde_json::from_value(json!({
            "version": 1, "taskName": "t", "strictParams": true, "workspace": null,
            "paramsSchema": schema, "resultSchema": {"type": "object"}, "slots": 1,
            "responseTimeoutSeconds": 10, "timeoutSeconds": 0
        }))
        .unwrap();
        let s = Schemas::compile(&contract).unwrap();
        let one = |field: &str, value: Value| -> String {
            let mut params = Map::new();
            params.insert(field.to_owned(), value);
            s.params(Value::Object(params), true)
                .unwrap_err()
                .to_string()
        };
        for (field, value, message) in [
            ("name", json!(5), "Input should be a valid string"),
            (
                "name",
                json!("a"),
                "String should have at least 2 characters",
            ),
            ("one", json!(""), "String should have at least 1 character"),
            (
                "name",
                json!("abcde"),
                "String should have at most 4 characters",
            ),
            (
                "name",
                json!("AB"),
                "String should match pattern '^[a-z]+$'",
            ),
            ("count", json!("5"), "Input should be a valid integer"),
            (
                "count",
                json!(1.5),
                "Input should be a valid integer, got a number with a fractional part",
            ),
            (
                "count",
                json!(-1),
                "Input should be greater than or equal to 0",
            ),
            (
                "count",
                json!(11),
                "Input should be less than or equal to 10",
            ),
            ("ratio", json!("x"), "Input should be a valid number"),
            ("ratio", json!(0), "Input should be greater than 0"),
            ("ratio", json!(1.5), "Input should be less than 1.5"),
            ("step", json!(7), "Input should be a multiple of 5"),
            ("flag", json!("yes"), "Input should be a valid boolean"),
            ("inner", json!([]), "Input should be a valid dictionary"),
            (
                "inner",
                json!({}),
                "Dictionary should have at least 1 item after validation, not 0",
            ),
            (
                "inner",
                json!({"a": 1, "b": 2}),
                "Dictionary should have at most 1 item after validation, not 2",
            ),
            ("tags", json!("a"), "Input should be a valid list"),
            (
                "tags",
                json!(["a"]),
                "List should have at least 2 items after validation, not 1",
            ),
            (
                "single",
                json!([]),
                "List should have at least 1 item after validation, not 0",
            ),
            (
                "tags",
                json!([1, 2, 3, 4]),
                "List should have at most 3 items after validation, not 4",
            ),
            (
                "mode",
                json!("slow"),
                "Input should be 'fast', 'exact' or \"it's\"",
            ),
            ("pair", json!(2), "Input should be 1, True or None"),
            ("kind", json!("branch"), "Input should be 'commit'"),
            ("maybe", json!("x"), "Input should be a valid integer"),
            ("nothing", json!(1), "Input should be None"),
            (
                "either",
                json!(1.5),
                "Input is not of types \"integer\", \"string\"",
            ),
            (
                "any",
                json!(1.5),
                "Input is not valid under any of the schemas listed in the 'anyOf' keyword",
            ),
        ] {
            assert_eq!(
                one(field, value.clone()),
                format!("invalid params: params.{field}: {message}"),
                "{field} = {value}"
            );
        }
        // One problem per value: the first failing constraint.
        assert_eq!(
            one("name", json!("A")),
            "invalid params: params.name: String should have at least 2 characters"
        );
        assert_eq!(
            one("mode", json!(5)),
            "invalid params: params.mode: Input should be 'fast', 'exact' or \"it's\""
        );
        // Several problems, each with its path, in one reason: fields in schema order, then
        // the undeclared ones (Pydantic's order).
        assert_eq!(
            s.params(json!({"name": 5, "count": 11, "zzz": 1}), true)
                .unwrap_err()
                .to_string(),
            "invalid params: params.name: Input should be a valid string; params.count: Input should be less than or equal to 10; params.zzz: Extra inputs are not permitted"
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
            s.result(&json!({"total": 3, "extra": 1}))
                .unwrap_err()
                .to_string(),
            "invalid result: result.extra: Extra inputs are not permitted"
        );
        assert!(
            s.result(&json!({"total": "3"}))
                .unwrap_err()
                .to_string()
                .contains("result.total")
        );
    }
}
