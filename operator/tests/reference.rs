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

/// `perago-operator SUBCOMMAND -f MANIFEST` to standard output.
fn operator_output(subcommand: &str, manifest: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_perago-operator"))
        .args([subcommand, "-f"])
        .arg(manifest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "perago-operator {subcommand} -f {}: {}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `perago-k8s manifest` turns each reference module into a PeragoTask whose TaskDef and task
/// contract are those of the hand-written declaration, whose TaskDef the test above holds
/// against `perago extract`.
#[test]
fn manifests_generated_from_the_modules_declare_the_same_tasks() {
    let python = reference_python();
    let work = tempfile::tempdir().unwrap();
    let path = perago_e2e::python::path_with(&reference_dir());
    for name in TASKS {
        let generated = work.path().join(format!("{name}.yaml"));
        let out = Command::new(&python)
            .args(["-m", "perago_k8s", "manifest", &format!("tasks.{name}")])
            .args(["--image", "registry.example.com/tasks:1.0", "--output"])
            .arg(&generated)
            .env("PYTHONPATH", &path)
            .current_dir(work.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "perago-k8s manifest tasks.{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&generated).unwrap();
        let task = &perago_api::manifest::parse(&text).unwrap()[0].task;
        perago_api::validate(&task.spec).unwrap();
        assert_eq!(
            task.spec.executor.body.command,
            ["python", "-m", "perago_k8s", "run"]
                .map(str::to_owned)
                .into_iter()
                .chain([format!(
                    "tasks.{name}:{}",
                    function_of(&reference_dir().join(format!("tasks/{name}.py")))
                )])
                .collect::<Vec<_>>()
        );
        let hand_written = reference_dir().join(format!("tasks/{name}.yaml"));
        for subcommand in ["taskdef", "contract"] {
            assert_eq!(
                operator_output(subcommand, &generated),
                operator_output(subcommand, &hand_written),
                "{name}: the generated manifest's {subcommand} differs from the declared one's"
            );
        }
    }
}

/// The name of the first function a module defines.
fn function_of(module: &Path) -> String {
    let source = std::fs::read_to_string(module).unwrap();
    source
        .lines()
        .find_map(|l| l.strip_prefix("def ")?.split('(').next().map(str::to_owned))
        .unwrap()
}

/// The package's own tests (`python/tests`), under the reference Python and its pytest.
#[test]
fn the_python_package_passes_its_own_tests() {
    let out = Command::new(reference_python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .env("PYTHONPATH", perago_e2e::python::package_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(perago_e2e::python::package_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pytest python/tests:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
