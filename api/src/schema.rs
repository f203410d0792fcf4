//! The business-schema transformation applied to `paramsSchema` and `resultSchema` before
//! they are embedded in a TaskDef (Python Perago 0.6.1 `schema_for_model`).
//!
//! 1. On the root and on every `$defs` entry of type object, keep only `$defs`,
//!    `additionalProperties`, `properties`, `required` and `type`.
//! 2. Inline every `#/$defs/<Name>` reference, overlaying the keys beside the `$ref`.
//! 3. Remove every `title` keyword (a property *named* `title` survives).
//! 4. Every object node with a `properties` map gets `additionalProperties` set to the mode's
//!    value, in place when present, else appended. Free-form maps are left alone.

use serde_json::{Map, Value};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SchemaError {
    #[error("schema must be a JSON Schema object with \"type\": \"object\"")]
    NotAnObject,
    #[error("unsupported $ref '{0}': only local '#/$defs/<Name>' references are supported")]
    UnsupportedRef(String),
    #[error("$ref '{0}' names no entry of $defs")]
    MissingDef(String),
    #[error("recursive schemas are not supported ('{0}' refers to itself)")]
    Recursive(String),
    /// The transformed schema, the one a task's contract carries, is no JSON Schema the
    /// sidecar can compile. `at` is the JSON pointer of the offending keyword in it.
    #[error("not a valid JSON Schema: {message} (at '{at}')")]
    Invalid { at: String, message: String },
}

const KEPT_MODEL_KEYS: [&str; 5] = [
    "$defs",
    "additionalProperties",
    "properties",
    "required",
    "type",
];
const DEFS_REF_PREFIX: &str = "#/$defs/";

fn is_object_type(node: &Map<String, Value>) -> bool {
    node.get("type").and_then(Value::as_str) == Some("object")
}

fn keep_model_keys(node: &mut Map<String, Value>) {
    node.retain(|k, _| KEPT_MODEL_KEYS.contains(&k.as_str()));
}

/// Transform one business schema. `allow_extra` is the `additionalProperties` value written on
/// every object node that declares `properties`.
pub fn transform(
    schema: &Map<String, Value>,
    allow_extra: bool,
) -> Result<Map<String, Value>, SchemaError> {
    if !is_object_type(schema) {
        return Err(SchemaError::NotAnObject);
    }
    let mut root = schema.clone();
    keep_model_keys(&mut root);
    let mut defs = match root.shift_remove("$defs") {
        Some(Value::Object(defs)) => defs,
        _ => Map::new(),
    };
    for def in defs.values_mut() {
        if let Value::Object(def) = def
            && is_object_type(def)
        {
            keep_model_keys(def);
        }
    }
    let mut root = Value::Object(root);
    inline_refs(&mut root, &defs, &mut Vec::new())?;
    strip_titles(&mut root, false);
    set_additional_properties(&mut root, allow_extra);
    match root {
        Value::Object(map) => Ok(map),
        _ => Err(SchemaError::NotAnObject),
    }
}

/// Check a schema can be transformed and that the result (the contract's form) compiles as
/// the sidecar compiles it, without keeping it.
#[cfg(feature = "schema-check")]
pub fn check(schema: &Map<String, Value>) -> Result<(), SchemaError> {
    let strict = Value::Object(transform(schema, false)?);
    jsonschema::validator_for(&strict)
        .map(drop)
        .map_err(|e| SchemaError::Invalid {
            at: match e.instance_path().as_str() {
                "" => "/".to_owned(),
                at => at.to_owned(),
            },
            message: e.to_string(),
        })
}

fn inline_refs(
    node: &mut Value,
    defs: &Map<String, Value>,
    stack: &mut Vec<String>,
) -> Result<(), SchemaError> {
    match node {
        Value::Object(map) => {
            if let Some(reference) = map.get("$ref").and_then(Value::as_str).map(str::to_owned) {
                let name = reference
                    .strip_prefix(DEFS_REF_PREFIX)
                    .ok_or_else(|| SchemaError::UnsupportedRef(reference.clone()))?;
                if stack.iter().any(|s| s == name) {
                    return Err(SchemaError::Recursive(reference));
                }
                let mut inlined = defs
                    .get(name)
                    .cloned()
                    .ok_or_else(|| SchemaError::MissingDef(reference.clone()))?;
                stack.push(name.to_owned());
                inline_refs(&mut inlined, defs, stack)?;
                stack.pop();
                let Value::Object(mut inlined) = inlined else {
                    return Err(SchemaError::MissingDef(reference));
                };
                for (key, mut value) in std::mem::take(map) {
                    if key != "$ref" {
                        inline_refs(&mut value, defs, stack)?;
                        inlined.insert(key, value);
                    }
                }
                *map = inlined;
            } else {
                for value in map.values_mut() {
                    inline_refs(value, defs, stack)?;
                }
            }
        }
        Value::Array(items) => {
            for value in items {
                inline_refs(value, defs, stack)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// `names` is true for maps whose keys are property names rather than keywords.
fn strip_titles(node: &mut Value, names: bool) {
    match node {
        Value::Object(map) => {
            if !names {
                map.shift_remove("title");
            }
            for (key, value) in map.iter_mut() {
                strip_titles(
                    value,
                    !names && (key == "properties" || key == "patternProperties"),
                );
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| strip_titles(v, false)),
        _ => {}
    }
}

fn set_additional_properties(node: &mut Value, allow_extra: bool) {
    match node {
        Value::Object(map) => {
            for value in map.values_mut() {
                set_additional_properties(value, allow_extra);
            }
            if is_object_type(map) && map.get("properties").is_some_and(Value::is_object) {
                // `insert` keeps an existing key's position and appends a new one.
                map.insert("additionalProperties".to_owned(), Value::Bool(allow_extra));
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| set_additional_properties(v, allow_extra)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn pydantic_shaped_schema_is_inlined_and_closed() {
        let schema = obj(json!({
            "$defs": {
                "Window": {"description": "A window.", "properties": {"start": {"title": "Start", "type": "integer"}},
                           "required": ["start"], "title": "Window", "type": "object"},
                "Color": {"enum": ["red", "blue"], "title": "Color", "type": "string"}
            },
            "description": "Params doc.",
            "properties": {
                "window": {"$ref": "#/$defs/Window", "description": "the window"},
                "color": {"$ref": "#/$defs/Color", "default": "red"},
                "title": {"default": "x", "title": "Title", "type": "string"},
                "tags": {"additionalProperties": {"type": "string"}, "type": "object"}
            },
            "required": ["window"],
            "title": "P",
            "type": "object"
        }));
        let out = transform(&schema, true).unwrap();
        let expected = json!({
            "properties": {
                "window": {"properties": {"start": {"type": "integer"}}, "required": ["start"], "type": "object",
                           "description": "the window", "additionalProperties": true},
                "color": {"enum": ["red", "blue"], "type": "string", "default": "red"},
                "title": {"default": "x", "type": "string"},
                "tags": {"additionalProperties": {"type": "string"}, "type": "object"}
            },
            "required": ["window"],
            "type": "object",
            "additionalProperties": true
        });
        assert_eq!(
            serde_json::to_string(&Value::Object(out)).unwrap(),
            serde_json::to_string(&expected).unwrap()
        );
    }

    #[test]
    fn existing_additional_properties_keeps_its_position() {
        let schema = obj(json!({"additionalProperties": true, "properties": {}, "type": "object"}));
        let out = transform(&schema, false).unwrap();
        assert_eq!(
            serde_json::to_string(&Value::Object(out)).unwrap(),
            r#"{"additionalProperties":false,"properties":{},"type":"object"}"#
        );
    }

    /// Found by the `manifest` fuzz target: a schema the transformation accepts but that is
    /// no JSON Schema passed validation, and the sidecar then refused the task's contract at
    /// start (so it never ran).
    #[test]
    #[cfg(feature = "schema-check")]
    fn schemas_that_are_no_json_schema_are_refused() {
        for (schema, at) in [
            (
                json!({"type": "object", "properties": {"tag": {"type": "ntrisg"}}}),
                "/properties/tag/type",
            ),
            (
                json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": "0"}}}),
                "/properties/n/minimum",
            ),
            (
                json!({"type": "object", "properties": {"xs": {"type": "array", "minItems": -1}}}),
                "/properties/xs/minItems",
            ),
            (
                json!({"type": "object", "properties": {"tag": {"type": "string", "pattern": "("}}}),
                "/properties/tag",
            ),
        ] {
            let err = check(&obj(schema.clone())).expect_err(&schema.to_string());
            let text = err.to_string();
            assert!(
                text.starts_with("not a valid JSON Schema") && text.contains(at),
                "{text}"
            );
        }
        check(&obj(
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0},
            "tag": {"type": "string", "pattern": "^[a-z]+$"}}}),
        ))
        .expect("a valid schema");
    }

    #[test]
    fn bad_references_and_shapes_are_refused() {
        assert_eq!(
            transform(&obj(json!({"type": "string"})), false),
            Err(SchemaError::NotAnObject)
        );
        let missing = obj(json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/X"}}}));
        assert_eq!(
            transform(&missing, false),
            Err(SchemaError::MissingDef("#/$defs/X".into()))
        );
        let remote = obj(json!({"type": "object", "properties": {"a": {"$ref": "http://x/y"}}}));
        assert_eq!(
            transform(&remote, false),
            Err(SchemaError::UnsupportedRef("http://x/y".into()))
        );
        let recursive = obj(json!({"type": "object", "$defs": {"N": {"type": "object",
            "properties": {"next": {"$ref": "#/$defs/N"}}}}, "properties": {"n": {"$ref": "#/$defs/N"}}}));
        assert_eq!(
            transform(&recursive, false),
            Err(SchemaError::Recursive("#/$defs/N".into()))
        );
    }
}
