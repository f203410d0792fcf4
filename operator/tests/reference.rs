//! Differential test against the reference implementation: Python Perago 0.6.1 from PyPI.
//!
//! Each `tests/reference/tasks/<name>.py` declares a task with `@task(...)`; the matching
//! `<name>.yaml` declares the same task as a PeragoTask (its schemas are what Pydantic emits
//! for the Python models). `perago extract` and `perago-operator taskdef` must write the same
//! bytes and print the same warnings, with one stated difference: for strict tasks this project
//! closes the top level of the input schema (`additionalProperties: false`), because a strict
//! task rejects other top-level input keys, while Python 0.6.1 always renders `true` there.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const TASKS: [&str; 5] = [
    "ws_full",
    "ws_readonly",
    "free_lenient",
    "free_strict",
    "ws_root",
];

fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference")
}

/// The reference Python, obtained (and cached) by the project's obtain script.
fn reference_python() -> PathBuf {
    if let Some(python) = std::env::var_os("PERAGO_REFERENCE_PYTHON") {
        return python.into();
    }
    perago_e2e::process::obtain("perago-python").expect("obtaining perago 0.6.1 from PyPI")
}

/// Warning lines of a command's standard error, without the `warning: ` prefix.
fn warnings(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("warning: ").map(str::to_owned))
        .collect()
}

#[test]
fn taskdefs_match_python_perago_0_6_1() {
    let python = reference_python();
    let work = tempfile::tempdir().unwrap();
    for name in TASKS {
        let py_out = work.path().join(format!("{name}.py.json"));
        let rs_out = work.path().join(format!("{name}.rs.json"));
        let py = Command::new(&python)
            .args([
                "-c",
                "from perago.cli import app; app()",
                "extract",
                &format!("tasks.{name}"),
                "--output",
            ])
            .arg(&py_out)
            .env("PYTHONPATH", reference_dir())
            .env("COLUMNS", "200")
            .current_dir(work.path())
            .output()
            .unwrap();
        assert!(
            py.status.success(),
            "perago extract {name}: {}",
            String::from_utf8_lossy(&py.stderr)
        );
        let rs = Command::new(env!("CARGO_BIN_EXE_perago-operator"))
            .args(["taskdef", "-f"])
            .arg(reference_dir().join(format!("tasks/{name}.yaml")))
            .arg("--output")
            .arg(&rs_out)
            .output()
            .unwrap();
        assert!(
            rs.status.success(),
            "perago-operator taskdef {name}: {}",
            String::from_utf8_lossy(&rs.stderr)
        );
        assert_eq!(
            warnings(&rs.stderr),
            warnings(&py.stderr),
            "{name}: warnings differ"
        );

        let py_text = std::fs::read_to_string(&py_out).unwrap();
        let rs_text = std::fs::read_to_string(&rs_out).unwrap();
        let mut expected: Value = serde_json::from_str(&py_text).unwrap();
        // The file format itself (indent, escapes, newline) must be Python's.
        assert_eq!(
            perago_api::taskdef::to_file_text(&expected),
            py_text,
            "{name}: file format differs"
        );
        let manifest =
            std::fs::read_to_string(reference_dir().join(format!("tasks/{name}.yaml"))).unwrap();
        let strict = perago_api::manifest::parse(&manifest).unwrap()[0]
            .task
            .spec
            .strict_params;
        if strict {
            // The one stated difference (see the module documentation).
            expected["inputSchema"]["data"]["additionalProperties"] = Value::Bool(false);
        }
        assert_eq!(
            rs_text,
            perago_api::taskdef::to_file_text(&expected),
            "{name}: TaskDef differs from perago extract"
        );
    }
}

#[test]
fn output_path_rules_match_python_perago() {
    let work = tempfile::tempdir().unwrap();
    let manifest = reference_dir().join("tasks/free_strict.yaml");
    let dir_named_json = work.path().join("dir.json");
    std::fs::create_dir(&dir_named_json).unwrap();
    for (output, message) in [
        (
            work.path().to_path_buf(),
            "output must be a JSON file path, for example generated/features.build.json",
        ),
        (
            work.path().join("x.JSON"),
            "output must be a JSON file path, for example generated/features.build.json",
        ),
        (
            dir_named_json,
            "output must be a JSON file path, not a directory",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_perago-operator"))
            .args(["taskdef", "-f"])
            .arg(&manifest)
            .arg("--output")
            .arg(&output)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim(),
            format!("error: {message}")
        );
    }
    let nested = work.path().join("generated/deeper/util.echo.json");
    let out = Command::new(env!("CARGO_BIN_EXE_perago-operator"))
        .args(["taskdef", "-f"])
        .arg(&manifest)
        .arg("--output")
        .arg(&nested)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(std::fs::read_to_string(nested).unwrap().ends_with("}\n"));
}
