//! The offline CLI on good and bad manifests: exit codes and precise messages, never a panic.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use perago_e2e::process::stdout_of;

use serde_yaml::Value;

fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_perago-operator"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn base() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/workspace-task.yaml");
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Set `value` at a dotted path (`spec.workspace.prefix`, list indices as numbers).
fn set(doc: &mut Value, path: &str, value: Value) {
    let mut node = doc;
    let parts: Vec<&str> = path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        node = match part.parse::<usize>() {
            Ok(i) => &mut node[i],
            Err(_) => &mut node[*part],
        };
    }
    let last = parts[parts.len() - 1];
    match last.parse::<usize>() {
        Ok(i) => node[i] = value,
        Err(_) => {
            node.as_mapping_mut()
                .unwrap()
                .insert(Value::from(last), value);
        }
    }
}

fn check_stderr(doc: &Value) -> (Option<i32>, String) {
    let out = run(&["check", "-f", "-"], &serde_yaml::to_string(doc).unwrap());
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap()
}

#[test]
fn examples_pass_check() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        // The directory also holds its kustomization.yaml.
        if !path.to_string_lossy().ends_with("-task.yaml") {
            continue;
        }
        checked += 1;
        let out = stdout_of(
            Command::new(env!("CARGO_BIN_EXE_perago-operator"))
                .args(["check", "-f"])
                .arg(&path),
        );
        assert!(out.starts_with("ok: "), "{out}");
    }
    assert_eq!(checked, 4);
}

#[test]
fn bad_declarations_name_the_field_and_use_the_reference_messages() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "spec.taskName",
            yaml("'  '"),
            "spec.taskName: task name is required",
        ),
        (
            "spec.taskName",
            yaml("'a/b'"),
            "spec.taskName: task name must not contain path separators",
        ),
        (
            "spec.taskName",
            yaml("'a\\b'"),
            "spec.taskName: task name must not contain path separators",
        ),
        (
            "spec.ownerEmail",
            yaml("' '"),
            "spec.ownerEmail: owner_email is required",
        ),
        (
            "spec.workspace.prefix",
            yaml("'a\\b'"),
            "spec.workspace.prefix: WorkspaceSpec.prefix must use '/' separators",
        ),
        (
            "spec.workspace.prefix",
            yaml("'///'"),
            "spec.workspace.prefix: WorkspaceSpec.prefix must not be empty",
        ),
        (
            "spec.workspace.prefix",
            yaml("'../raw'"),
            "WorkspaceSpec.prefix must stay inside the repository",
        ),
        (
            "spec.workspace.prefix",
            yaml("'audio/render/'"),
            "WorkspaceSpec.prefix must stay inside the repository",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("'/raw/x'"),
            "spec.workspace.pre[0].path: guardrail paths must be relative to WorkspaceSpec(prefix=...)",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("'../raw/x'"),
            "workspace guardrail paths must be relative and must not contain '..'",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("'raw\\x'"),
            "string guardrail paths must use '/' separators",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("'C:/x'"),
            "drive-qualified guardrail paths are not allowed",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("''"),
            "workspace guardrail paths must be relative and must not contain '..'",
        ),
        (
            "spec.workspace.pre.0.maxCount",
            yaml("3"),
            "spec.workspace.pre[0].kind: require_file does not accept count bounds",
        ),
        (
            "spec.workspace.pre.1.maxCount",
            yaml("0"),
            "spec.workspace.pre[1].minCount: guardrail min_count must be <= max_count",
        ),
        (
            "spec.controls.retry.count",
            yaml("11"),
            "spec.controls.retry.count: must be between 0 and 10",
        ),
        (
            "spec.controls.limits",
            yaml("{rateLimitPerFrequency: 3}"),
            "rate_limit_frequency_in_seconds and rate_limit_per_frequency must be configured together",
        ),
        (
            "spec.controls.publishBudget.lakefsMergeTimeoutSeconds",
            yaml("29"),
            "lakefs_merge_timeout_seconds must cover observed_merge_p99_seconds plus safety_margin_seconds",
        ),
        (
            "spec.controls.timeout",
            yaml("{seconds: 300}"),
            "Conductor requires responseTimeoutSeconds (600) <= timeoutSeconds (300)",
        ),
        (
            "spec.controls.timeout",
            yaml("{seconds: 300, responseSeconds: 60, totalSeconds: 100}"),
            "Conductor requires timeoutSeconds (300) <= totalTimeoutSeconds (100)",
        ),
        (
            "spec.controls.timeout",
            yaml("{responseSeconds: 0}"),
            "Conductor requires responseTimeoutSeconds >= 1",
        ),
        (
            "spec.paramsSchema",
            yaml("{type: string}"),
            "spec.paramsSchema: schema must be a JSON Schema object",
        ),
        (
            "spec.resultSchema",
            yaml("{type: object, properties: {a: {$ref: '#/$defs/Missing'}}}"),
            "$ref '#/$defs/Missing' names no entry of $defs",
        ),
        (
            "spec.workspace.surprise",
            yaml("1"),
            "spec.workspace: unsupported fields: surprise",
        ),
        ("spec.bogus", yaml("1"), "spec: unsupported fields: bogus"),
        (
            "spec.controls.retry.count",
            yaml("'three'"),
            "spec.controls.retry.count: invalid type: string \"three\"",
        ),
        (
            "spec.workspace.pre.0.kind",
            yaml("requireSomething"),
            "spec.workspace.pre[0].kind: unknown variant `requireSomething`",
        ),
        (
            "metadata.name",
            yaml("Features_Build"),
            "metadata.name: 'Features_Build' must be a DNS-1123 label",
        ),
        (
            "apiVersion",
            yaml("perago.io/v9"),
            "apiVersion: unsupported apiVersion 'perago.io/v9'",
        ),
        (
            "spec.executor.autoscaling",
            yaml("{minReplicas: 4, maxReplicas: 3}"),
            "spec.executor.autoscaling: autoscaling.minReplicas must be <= maxReplicas",
        ),
        (
            "spec.executor.replicas",
            yaml("-1"),
            "spec.executor.replicas: must be >= 0",
        ),
        (
            "spec.executor.body.command",
            yaml("[]"),
            "spec.executor.body.command: command is required",
        ),
        (
            "spec.metrics",
            yaml("{application: [{name: rows, kind: gauge, labels: [task_id]}]}"),
            "label 'task_id' is reserved by the runtime",
        ),
    ];
    for (path, value, expected) in cases {
        let mut doc = base();
        set(&mut doc, path, value);
        let (code, stderr) = check_stderr(&doc);
        assert_eq!(code, Some(1), "{path}: {stderr}");
        assert!(stderr.starts_with("error: "), "{path}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{path}: expected {expected:?} in {stderr:?}"
        );
    }
}

#[test]
fn workspace_free_task_with_budget_is_rejected() {
    let mut doc = base();
    doc["spec"].as_mapping_mut().unwrap().remove("workspace");
    let (code, stderr) = check_stderr(&doc);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(
            "spec.controls.publishBudget: publish_budget requires workspace=WorkspaceSpec(...)"
        ),
        "{stderr}"
    );
}

#[test]
fn budget_warnings_are_printed_once() {
    let mut doc = base();
    set(
        &mut doc,
        "spec.controls.timeout.responseSeconds",
        yaml("60"),
    );
    let (code, stderr) = check_stderr(&doc);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stderr,
        "warning: Task 'features.build' has TaskControls.timeout.response_seconds=60 which is shorter than \
         publish_budget.response_timeout_seconds=100; responseTimeoutSeconds will use timeout.response_seconds\n"
    );
    set(&mut doc, "spec.workspace.readOnly", yaml("true"));
    let (code, stderr) = check_stderr(&doc);
    assert_eq!(code, Some(0));
    assert_eq!(
        stderr,
        "warning: WorkspaceSpec(read_only=True) disables workspace publication; TaskControls.publish_budget is ignored.\n"
    );
}

#[test]
fn malformed_input_and_usage_errors() {
    let out = run(&["check", "-f", "-"], "spec: [unclosed");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: document 1: malformed YAML"));
    let out = run(&["check", "-f", "-"], "apiVersion: v1\nkind: ConfigMap\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no PeragoTask"));
    let out = run(&["check", "-f", "/nonexistent/manifest.yaml"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/manifest.yaml")
    );
    let out = run(&["check"], "");
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["taskdef", "-f", "-", "--bogus"], "");
    assert_eq!(out.status.code(), Some(2));
    let two = format!(
        "{}---\n{}",
        serde_yaml::to_string(&base()).unwrap(),
        serde_yaml::to_string(&base()).unwrap()
    );
    let out = run(&["taskdef", "-f", "-"], &two);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("the manifest holds 2 PeragoTasks; taskdef renders exactly one")
    );
}

#[test]
fn taskdef_prints_to_stdout_without_output() {
    let out = run(
        &["taskdef", "-f", "-"],
        &serde_yaml::to_string(&base()).unwrap(),
    );
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["name"], "features.build");
    assert_eq!(doc["inputKeys"], serde_json::json!(["workspace", "params"]));
}

#[test]
fn contract_prints_what_the_configmap_holds() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/workspace-task.yaml");
    let run = |args: &[&str]| {
        stdout_of(
            Command::new(env!("CARGO_BIN_EXE_perago-operator"))
                .args(args)
                .arg(&path),
        )
    };
    let contract: serde_json::Value = serde_json::from_str(&run(&["contract", "-f"])).unwrap();
    assert_eq!(contract["taskName"], "features.build");
    assert_eq!(contract["workspace"]["prefix"], "audio/render");
    let rendered = run(&["render", "--conductor-url", "http://c/api", "-f"]);
    let config_map = perago_e2e::yaml_document(&rendered, "ConfigMap").unwrap();
    let held: serde_json::Value =
        serde_json::from_str(config_map["data"]["contract.json"].as_str().unwrap()).unwrap();
    assert_eq!(contract, held);
}
