//! Reading PeragoTask manifests offline, as `kubectl apply --validate=strict` would see them:
//! YAML documents, unknown fields checked against the CRD's own schema, then typed decoding
//! with the path of any type error.

use kube::CustomResourceExt;
use serde_json::Value;
use thiserror::Error;

use crate::task::{GROUP, PeragoTask, VERSION};
use crate::validate::FieldError;

#[derive(Debug, Error)]
pub enum ManifestError {
    #[error("document {doc}: malformed YAML: {message}")]
    Yaml { doc: usize, message: String },
    #[error("document {doc} ({name}): {error}")]
    Field {
        doc: usize,
        name: String,
        error: FieldError,
    },
    #[error("no PeragoTask ({GROUP}/{VERSION}) found in the manifest")]
    Empty,
}

/// One PeragoTask read from a manifest, with its position for messages.
#[derive(Debug, Clone)]
pub struct ManifestTask {
    pub doc: usize,
    pub task: PeragoTask,
}

impl ManifestTask {
    /// `namespace/name`, or `name` when no namespace is given.
    pub fn display_name(&self) -> String {
        let meta = &self.task.metadata;
        let name = meta.name.clone().unwrap_or_default();
        match &meta.namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name,
        }
    }
}

/// Parse every PeragoTask of a (multi-document) YAML manifest. Documents of other kinds are
/// skipped; empty documents are ignored.
pub fn parse(text: &str) -> Result<Vec<ManifestTask>, ManifestError> {
    let schema = crd_schema();
    let mut tasks = Vec::new();
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let doc = i + 1;
        let yaml: serde_yaml::Value =
            serde::Deserialize::deserialize(document).map_err(|e| ManifestError::Yaml {
                doc,
                message: e.to_string(),
            })?;
        if yaml.is_null() {
            continue;
        }
        let value: Value = serde_json::to_value(&yaml).map_err(|e| ManifestError::Yaml {
            doc,
            message: e.to_string(),
        })?;
        let is_task = value.get("kind").and_then(Value::as_str) == Some("PeragoTask")
            && value
                .get("apiVersion")
                .and_then(Value::as_str)
                .is_some_and(|v| v.starts_with(&format!("{GROUP}/")));
        if !is_task {
            continue;
        }
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("<unnamed>")
            .to_owned();
        let field_error = |error: FieldError| ManifestError::Field {
            doc,
            name: name.clone(),
            error,
        };
        check_header(&value).map_err(field_error)?;
        if let Some(unknown) = unknown_fields(&value, &schema) {
            return Err(field_error(unknown));
        }
        let task: PeragoTask = serde_path_to_error::deserialize(&value).map_err(|e| {
            field_error(FieldError::new(e.path().to_string(), e.inner().to_string()))
        })?;
        tasks.push(ManifestTask { doc, task });
    }
    if tasks.is_empty() {
        return Err(ManifestError::Empty);
    }
    Ok(tasks)
}

fn check_header(value: &Value) -> Result<(), FieldError> {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if api_version != format!("{GROUP}/{VERSION}") {
        return Err(FieldError::new(
            "apiVersion",
            format!(
                "unsupported apiVersion '{api_version}'; this version serves {GROUP}/{VERSION}"
            ),
        ));
    }
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !is_dns1123_label(name) || name.len() > 52 {
        return Err(FieldError::new(
            "metadata.name",
            format!(
                "'{name}' must be a DNS-1123 label of at most 52 characters (lower-case letters, digits and '-', \
                 starting and ending with a letter or digit), so that the executor's objects can be named after it"
            ),
        ));
    }
    Ok(())
}

pub(crate) fn is_dns1123_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// The CRD's structural schema as JSON.
fn crd_schema() -> Value {
    let crd = PeragoTask::crd();
    crd.spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null)
}

/// Report the first object that carries fields the schema does not declare, with every such
/// field of that object, sorted.
fn unknown_fields(value: &Value, schema: &Value) -> Option<FieldError> {
    fn walk(value: &Value, schema: &Value, path: &str) -> Option<FieldError> {
        if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
            return None;
        }
        match value {
            Value::Object(map) => {
                if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                    let mut unknown: Vec<&str> = map
                        .keys()
                        .filter(|k| {
                            let envelope = path.is_empty()
                                && ["apiVersion", "kind", "metadata"].contains(&k.as_str());
                            !(props.contains_key(*k) || envelope)
                        })
                        .map(String::as_str)
                        .collect();
                    if !unknown.is_empty() {
                        unknown.sort_unstable();
                        let field = if path.is_empty() { "<root>" } else { path };
                        return Some(FieldError::new(
                            field,
                            format!("unsupported fields: {}", unknown.join(", ")),
                        ));
                    }
                    for (key, child) in map {
                        if let Some(child_schema) = props.get(key) {
                            let child_path = if path.is_empty() {
                                key.clone()
                            } else {
                                format!("{path}.{key}")
                            };
                            if let Some(e) = walk(child, child_schema, &child_path) {
                                return Some(e);
                            }
                        }
                    }
                } else if let Some(values) =
                    schema.get("additionalProperties").filter(|v| v.is_object())
                {
                    for (key, child) in map {
                        if let Some(e) = walk(child, values, &format!("{path}.{key}")) {
                            return Some(e);
                        }
                    }
                }
                None
            }
            Value::Array(items) => {
                let item_schema = schema.get("items")?;
                items
                    .iter()
                    .enumerate()
                    .find_map(|(i, item)| walk(item, item_schema, &format!("{path}[{i}]")))
            }
            _ => None,
        }
    }
    walk(value, schema, "")
}
