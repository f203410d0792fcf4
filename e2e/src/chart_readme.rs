//! The chart's README (`charts/perago-operator/README.md`): every value of `values.yaml` with
//! its type (from `values.schema.json`), its default and the comment above it or beside it.
//! `make chart-readme` writes it; `e2e/tests/chart.rs` fails when the committed file differs.

use anyhow::{Result, bail};
use serde_json::Value;

/// One value of the file: its dotted path, default as written, and its comment.
#[derive(Debug, PartialEq)]
pub struct Entry {
    pub path: String,
    pub default: String,
    pub comment: String,
}

/// The text of an inline comment (`value   # text`), and where its `#` is.
fn split_comment(rest: &str) -> (&str, Option<(usize, &str)>) {
    // A `#` starts a comment only after whitespace (URLs and anchors keep theirs).
    let mut previous = ' ';
    let mut quoted = None;
    for (i, c) in rest.char_indices() {
        match (quoted, c) {
            (Some(q), _) if c == q => quoted = None,
            (None, '"' | '\'') => quoted = Some(c),
            (None, '#') if previous.is_whitespace() => {
                return (rest[..i].trim(), Some((i, rest[i + 1..].trim())));
            }
            _ => {}
        }
        previous = c;
    }
    (rest.trim(), None)
}

/// Every key of `values.yaml`, in file order. A key with a value on its line is a value; a key
/// without one opens a section. A comment block applies to the key right below it; a comment
/// beside a value (and the comment lines aligned under it) to that value. A section's comment
/// is kept for its first value that has none of its own.
pub fn entries(values: &str) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut pending: Vec<String> = Vec::new();
    // The column of the last value's inline comment, for comment lines continuing it.
    let mut continuing: Option<usize> = None;
    // A section's own comment block and its indentation, until a value of it takes it.
    let mut section_comment: Option<(usize, String)> = None;
    for (number, line) in values.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            pending.clear();
            continuing = None;
            continue;
        }
        if let Some(text) = trimmed.strip_prefix('#') {
            match (continuing, out.last_mut()) {
                (Some(column), Some(Entry { comment, .. })) if column == indent => {
                    comment.push(' ');
                    comment.push_str(text.trim());
                }
                _ => {
                    continuing = None;
                    pending.push(text.trim().to_owned());
                }
            }
            continue;
        }
        let Some((key, rest)) = trimmed.split_once(':') else {
            bail!("values.yaml line {}: not a key: {line}", number + 1);
        };
        if key.starts_with('-') || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            bail!(
                "values.yaml line {}: write lists and maps inline (`[]`, `{{}}`) so each value is one line: {line}",
                number + 1
            );
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        if section_comment.as_ref().is_some_and(|(i, _)| *i >= indent) {
            section_comment = None;
        }
        let path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).chain([key]).collect();
        let path = path.join(".");
        let (default, inline) = split_comment(rest);
        let above = (!pending.is_empty()).then(|| pending.join(" "));
        pending.clear();
        if default.is_empty() {
            if let Some(text) = above {
                section_comment = Some((indent, text));
            }
            stack.push((indent, key.to_owned()));
            continuing = None;
            continue;
        }
        let mut comment: Vec<String> = Vec::new();
        comment.extend(above.or_else(|| section_comment.take().map(|(_, text)| text)));
        if let Some((column, text)) = inline {
            comment.push(text.to_owned());
            continuing = Some(indent + key.len() + 1 + column);
        } else {
            continuing = None;
        }
        out.push(Entry {
            path,
            default: default.to_owned(),
            comment: comment.join(" "),
        });
    }
    Ok(out)
}

/// `node`, or what its `$ref`s lead to in `schema`'s definitions.
fn resolve<'a>(schema: &'a Value, mut node: &'a Value) -> &'a Value {
    while let Some(reference) = node["$ref"].as_str() {
        let name = reference.trim_start_matches("#/definitions/");
        node = &schema["definitions"][name];
    }
    node
}

/// The schema's type of a dotted path (`string`, `integer`, …), following `$ref`s.
fn schema_type(schema: &Value, path: &str) -> String {
    let mut node = resolve(schema, schema);
    for key in path.split('.') {
        node = resolve(schema, &node["properties"][key]);
    }
    match &node["type"] {
        Value::String(t) => t.clone(),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => String::new(),
    }
}

/// The README, from the chart's `values.yaml` and `values.schema.json`.
pub fn render(values: &str, schema: &Value) -> Result<String> {
    let entries = entries(values)?;
    let undocumented: Vec<&str> = entries
        .iter()
        .filter(|e| e.comment.is_empty())
        .map(|e| e.path.as_str())
        .collect();
    if !undocumented.is_empty() {
        bail!("values.yaml: values without a comment: {undocumented:?}");
    }
    let mut out = String::from(
        "# perago-operator\n\n\
         The Perago for Kubernetes operator: the PeragoTask CRD, the operator that registers each\n\
         task's Conductor TaskDef and runs and scales its executor pods, and the admission\n\
         webhook. Install, upgrade and operate it with [docs/install.md](../../docs/install.md).\n\n\
         ```sh\n\
         helm install perago-operator charts/perago-operator --namespace perago-system \\\n  \
         --create-namespace --set conductor.url=http://conductor.conductor:8080/api\n\
         ```\n\n\
         ## Values\n\n\
         Generated from `values.yaml` and `values.schema.json` by `make chart-readme`.\n\n\
         | Value | Type | Default | |\n| --- | --- | --- | --- |\n",
    );
    for e in &entries {
        let default = e.default.replace('|', "\\|");
        let comment = e.comment.replace('|', "\\|");
        out.push_str(&format!(
            "| `{}` | {} | `{default}` | {comment} |\n",
            e.path,
            schema_type(schema, &e.path)
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_above_beside_and_continued_go_to_their_value() {
        let values = [
            "# Section.",
            "image:",
            "  repository: r   # where",
            "  tag: \"\"  # the tag,",
            "           # continued",
            "other: 1",
            "# Above.",
            "url: http://x/#a # anchor kept",
        ]
        .join("\n");
        let values = values.as_str();
        let got = entries(values).unwrap();
        assert_eq!(
            got,
            [
                Entry {
                    path: "image.repository".into(),
                    default: "r".into(),
                    comment: "Section. where".into()
                },
                Entry {
                    path: "image.tag".into(),
                    default: "\"\"".into(),
                    comment: "the tag, continued".into()
                },
                Entry {
                    path: "other".into(),
                    default: "1".into(),
                    comment: String::new()
                },
                Entry {
                    path: "url".into(),
                    default: "http://x/#a".into(),
                    comment: "Above. anchor kept".into()
                },
            ]
        );
        assert!(entries("list:\n  - a\n").is_err());
    }
}
