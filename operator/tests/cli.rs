//! The offline CLI on good and bad manifests: exit codes and precise messages, never a panic.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use perago_e2e::process::stdout_of;

mod cases;
use cases::{base, set, yaml};

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

fn check_stderr(doc: &Value) -> (Option<i32>, String) {
    let out = run(&["check", "-f", "-"], &serde_yaml::to_string(doc).unwrap());
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
    let cases = cases::bad_declarations();
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
