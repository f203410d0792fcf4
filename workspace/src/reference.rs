//! The `workspace` object of a task's input and output: `{repository, branch, refType, ref}`,
//! the wire format of Python Perago 0.6.1. Unknown keys are refused whatever `strictParams`
//! says.

use serde::Serialize;
use serde_json::{Map, Value};

/// A `workspace` value that is not one: every problem, each naming its field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid workspace: {}", .problems.join("; "))]
pub struct InvalidWorkspace {
    pub problems: Vec<String>,
}

const BLANK: &str = "workspace repository, branch, and ref must not be blank";
const FIELDS: [&str; 4] = ["repository", "branch", "refType", "ref"];

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkspaceRef {
    pub repository: String,
    pub branch: String,
    #[serde(rename = "refType")]
    pub ref_type: &'static str,
    #[serde(rename = "ref")]
    pub reference: String,
}

impl WorkspaceRef {
    /// Check a `workspace` input value; the error names every problem with its field.
    pub fn parse(value: &Value) -> Result<Self, InvalidWorkspace> {
        let invalid = |problems| InvalidWorkspace { problems };
        let Some(map) = value.as_object() else {
            return Err(invalid(vec![
                "workspace: Input should be a valid dictionary".into(),
            ]));
        };
        let mut problems = Vec::new();
        for key in map.keys().filter(|k| !FIELDS.contains(&k.as_str())) {
            problems.push(format!("workspace.{key}: Extra inputs are not permitted"));
        }
        let text = |map: &Map<String, Value>, key: &str, problems: &mut Vec<String>| -> String {
            match map.get(key) {
                None => {
                    problems.push(format!("workspace.{key}: Field required"));
                    String::new()
                }
                Some(Value::String(s)) => s.clone(),
                Some(_) => {
                    problems.push(format!("workspace.{key}: Input should be a valid string"));
                    String::new()
                }
            }
        };
        let repository = text(map, "repository", &mut problems);
        let branch = text(map, "branch", &mut problems);
        let ref_type = text(map, "refType", &mut problems);
        let reference = text(map, "ref", &mut problems);
        if map.contains_key("refType")
            && matches!(map.get("refType"), Some(Value::String(_)))
            && ref_type != "commit"
        {
            problems.push("workspace.refType: Input should be 'commit'".into());
        }
        if problems.is_empty()
            && [&repository, &branch, &reference]
                .iter()
                .any(|v| v.trim().is_empty())
        {
            problems.push(format!("workspace: Value error, {BLANK}"));
        }
        if !problems.is_empty() {
            return Err(invalid(problems));
        }
        Ok(Self {
            repository,
            branch,
            ref_type: "commit",
            reference,
        })
    }

    /// The same workspace at another commit (the published one).
    pub fn at(&self, commit: &str) -> Self {
        Self {
            reference: commit.to_owned(),
            ..self.clone()
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepts_the_0_6_1_shape_and_round_trips_it() {
        let v = json!({"repository": "lake", "branch": "main", "refType": "commit", "ref": "abc"});
        let w = WorkspaceRef::parse(&v).unwrap();
        assert_eq!(w.to_value(), v);
        assert_eq!(w.at("def").to_value()["ref"], "def");
    }

    #[test]
    fn every_malformed_shape_has_its_message() {
        let cases = [
            (
                json!("x"),
                "invalid workspace: workspace: Input should be a valid dictionary",
            ),
            (
                json!({"repository": "lake", "branch": "main", "ref_type": "commit", "ref": "abc"}),
                "invalid workspace: workspace.ref_type: Extra inputs are not permitted; workspace.refType: Field required",
            ),
            (
                json!({"repository": "lake", "branch": "main", "refType": "branch", "ref": "abc"}),
                "invalid workspace: workspace.refType: Input should be 'commit'",
            ),
            (
                json!({"repository": " ", "branch": "main", "refType": "commit", "ref": "abc"}),
                "invalid workspace: workspace: Value error, workspace repository, branch, and ref must not be blank",
            ),
            (
                json!({"repository": "lake", "branch": 3, "refType": "commit", "ref": "abc", "prefix": "x"}),
                "invalid workspace: workspace.prefix: Extra inputs are not permitted; workspace.branch: Input should be a valid string",
            ),
        ];
        for (value, message) in cases {
            assert_eq!(
                WorkspaceRef::parse(&value).unwrap_err().to_string(),
                message,
                "{value}"
            );
        }
    }
}
