//! Rendering of the Conductor TaskDef document, exactly as Python Perago 0.6.1 `perago extract`
//! writes it: fixed key order, defaults always present, unset limits omitted.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::schema;
use crate::task::PeragoTaskSpec;
use crate::validate::FieldError;

/// The workspace object's schema, shared by input and output.
fn workspace_schema() -> Value {
    json!({
        "additionalProperties": false,
        "properties": {
            "repository": {"minLength": 1, "type": "string"},
            "branch": {"minLength": 1, "type": "string"},
            "refType": {"const": "commit", "type": "string"},
            "ref": {"minLength": 1, "type": "string"}
        },
        "required": ["repository", "branch", "refType", "ref"],
        "type": "object"
    })
}

fn schema_def(name: String, data: Value) -> Value {
    json!({"name": name, "version": 1, "type": "JSON", "data": data})
}

fn io_schema(workspace: bool, key: &str, business: Map<String, Value>, additional: bool) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    if workspace {
        properties.insert("workspace".into(), workspace_schema());
        required.push(Value::from("workspace"));
    }
    properties.insert(key.into(), Value::Object(business));
    required.push(Value::from(key));
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": additional
    })
}

/// Render the TaskDef. The spec must have passed [`crate::validate::validate`]; schema errors
/// are still reported here rather than panicking.
pub fn render(spec: &PeragoTaskSpec) -> Result<Value, FieldError> {
    let c = &spec.controls;
    let workspace = spec.workspace.is_some();
    let strict = spec.strict_params;
    let params = schema::transform(&spec.params_schema, !strict)
        .map_err(|e| FieldError::new("spec.paramsSchema", e.to_string()))?;
    let result = schema::transform(&spec.result_schema, false)
        .map_err(|e| FieldError::new("spec.resultSchema", e.to_string()))?;

    let mut doc = Map::new();
    doc.insert("name".into(), spec.task_name.clone().into());
    doc.insert("ownerEmail".into(), spec.owner_email.clone().into());
    if let Some(description) = &spec.description {
        doc.insert("description".into(), description.clone().into());
    }
    let mut put = |key: &str, value: Value| {
        doc.insert(key.into(), value);
    };
    put("retryCount", c.retry.count.into());
    put(
        "retryLogic",
        serde_json::to_value(c.retry.logic).unwrap_or_default(),
    );
    put("retryDelaySeconds", c.retry.delay_seconds.into());
    put("maxRetryDelaySeconds", c.retry.max_delay_seconds.into());
    put("backoffJitterMs", c.retry.jitter_ms.into());
    put("totalTimeoutSeconds", c.timeout.total_seconds.into());
    put(
        "timeoutPolicy",
        serde_json::to_value(c.timeout.policy).unwrap_or_default(),
    );
    put("timeoutSeconds", c.timeout.seconds.into());
    put("responseTimeoutSeconds", c.timeout.response_seconds.into());
    put("pollTimeoutSeconds", c.timeout.poll_seconds.into());
    for (key, value) in [
        ("concurrentExecLimit", c.limits.concurrent_exec_limit),
        (
            "rateLimitFrequencyInSeconds",
            c.limits.rate_limit_frequency_in_seconds,
        ),
        ("rateLimitPerFrequency", c.limits.rate_limit_per_frequency),
    ] {
        if let Some(v) = value {
            put(key, v.into());
        }
    }
    let (input_keys, output_keys) = if workspace {
        (
            json!(["workspace", "params"]),
            json!(["workspace", "result"]),
        )
    } else {
        (json!(["params"]), json!(["result"]))
    };
    put("inputKeys", input_keys);
    put("outputKeys", output_keys);
    // The top level of the input advertises what the runtime accepts: other top-level keys
    // are ignored only when params are not strict (Python 0.6.1 always renders `true`).
    put(
        "inputSchema",
        schema_def(
            format!("{}.input", spec.task_name),
            io_schema(workspace, "params", params, !strict),
        ),
    );
    put(
        "outputSchema",
        schema_def(
            format!("{}.output", spec.task_name),
            io_schema(workspace, "result", result, false),
        ),
    );
    Ok(Value::Object(doc))
}

/// The serialised file form: 2-space indent, non-ASCII escaped as `\uXXXX`, trailing newline.
pub fn to_file_text(doc: &Value) -> String {
    let pretty = serde_json::to_string_pretty(doc).unwrap_or_default();
    let mut out = String::with_capacity(pretty.len() + 1);
    for ch in pretty.chars() {
        if ch.is_ascii() {
            out.push(ch);
        } else {
            let mut units = [0u16; 2];
            for unit in ch.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out.push('\n');
    out
}

/// SHA-256 (hex) of the compact JSON form; recorded in status to detect drift.
pub fn hash(doc: &Value) -> String {
    let compact = serde_json::to_vec(doc).unwrap_or_default();
    Sha256::digest(&compact)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Debug, Error)]
pub enum OutputPathError {
    #[error("output must be a JSON file path, for example generated/features.build.json")]
    NotJson,
    #[error("output must be a JSON file path, not a directory")]
    Directory,
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Write the TaskDef file, creating parent directories, with `perago extract`'s path rules.
pub fn write_file(path: &Path, doc: &Value) -> Result<(), OutputPathError> {
    if !path.to_string_lossy().ends_with(".json") {
        return Err(OutputPathError::NotJson);
    }
    if path.is_dir() {
        return Err(OutputPathError::Directory);
    }
    let io = |source| OutputPathError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, to_file_text(doc)).map_err(io)
}
