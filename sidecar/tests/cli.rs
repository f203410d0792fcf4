//! Start-up errors and the sidecar's `install-runner`, without servers.

#![allow(clippy::unwrap_used)]

use std::process::Command;

fn sidecar() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_perago-sidecar"));
    for var in [
        "CONDUCTOR_SERVER_URL",
        "LAKECTL_SERVER_ENDPOINT_URL",
        "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
        "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
        "OTEL_SERVICE_NAME",
    ] {
        c.env_remove(var);
    }
    c
}

fn stderr_of(c: &mut Command) -> (Option<i32>, String) {
    let out = c.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn install_runner_copies_an_executable_runner() {
    // install-runner copies the runner beside the sidecar's binary, as in the image.
    perago_e2e::pod::PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("bin/perago-runner");
    let (code, err) = stderr_of(sidecar().args(["install-runner", "--to"]).arg(&to));
    assert_eq!(code, Some(0), "{err}");
    let out = Command::new(&to).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: perago-runner"));
}

/// The install again over a runner that is running (the hook of a restarted sidecar beside a
/// running body), whose file cannot be written to.
#[test]
fn install_runner_replaces_a_running_runner() {
    perago_e2e::pod::PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("bin/perago-runner");
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy("/bin/sleep", &to).unwrap();
    let mut running = Command::new(&to).arg("30").spawn().unwrap();
    let (code, err) = stderr_of(sidecar().args(["install-runner", "--to"]).arg(&to));
    running.kill().unwrap();
    running.wait().unwrap();
    assert_eq!(code, Some(0), "{err}");
    let out = Command::new(&to).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("usage: perago-runner"),
        "the runner replaced the running file"
    );
    let left: Vec<_> = std::fs::read_dir(to.parent().unwrap()).unwrap().collect();
    assert_eq!(left.len(), 1, "no copy is left beside it");
}

#[test]
fn start_up_errors_are_clear_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let contract = dir.path().join("contract.json");
    std::fs::write(
        &contract,
        r#"{"version":1,"taskName":"t","strictParams":true,"paramsSchema":{"type":"object"},"resultSchema":{"type":"object"},"slots":1,"responseTimeoutSeconds":10,"timeoutSeconds":0,"workspace":{"prefix":"/","readOnly":false}}"#,
    )
    .unwrap();
    let base = |c: &mut Command| {
        c.env("PERAGO_TASK_CONTRACT", &contract)
            .env("PERAGO_WORK_DIR", dir.path().join("work"));
    };
    let cases: [(&[(&str, &str)], &str); 5] = [
        (
            &[],
            "error: CONDUCTOR_SERVER_URL is required for perago start",
        ),
        (
            &[("CONDUCTOR_SERVER_URL", "replace-me")],
            "error: CONDUCTOR_SERVER_URL must be replaced with a real value",
        ),
        (
            &[
                ("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api"),
                ("LAKECTL_SERVER_ENDPOINT_URL", "http://l"),
            ],
            "error: LakeFS config is incomplete; missing LAKECTL_CREDENTIALS_ACCESS_KEY_ID, LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
        ),
        (
            &[
                ("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api"),
                ("OTEL_SERVICE_NAME", "svc"),
            ],
            "error: OTEL_SERVICE_NAME is not supported by Perago metrics v1",
        ),
        (
            &[
                ("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api"),
                ("PERAGO_WORKER_ID_PREFIX", ""),
            ],
            "error: PERAGO_WORKER_ID_PREFIX must not be empty",
        ),
    ];
    for (env, message) in cases {
        let mut c = sidecar();
        base(&mut c);
        c.envs(env.iter().copied());
        let (code, err) = stderr_of(&mut c);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.lines().any(|l| l == message), "{message} not in {err}");
    }
    // A workspace task needs lakeFS before anything is contacted.
    let mut c = sidecar();
    base(&mut c);
    c.env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api");
    let (code, err) = stderr_of(&mut c);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("error: LakeFS config is required for workspace tasks"),
        "{err}"
    );
    // Conductor down: the TaskDef check names the failure.
    let mut c = sidecar();
    base(&mut c);
    c.env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api")
        .env("PERAGO_CONDUCTOR_TIMEOUT_SECONDS", "2")
        .env("LAKECTL_SERVER_ENDPOINT_URL", "http://127.0.0.1:9")
        .env("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", "k")
        .env("LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", "s");
    let (code, err) = stderr_of(&mut c);
    assert_eq!(code, Some(1));
    assert!(
        err.contains(
            "error: failed to validate Conductor TaskDef: Conductor get of TaskDef 't' failed: "
        ),
        "{err}"
    );
    assert!(err.contains("(Conductor http://127.0.0.1:9/api)"), "{err}");
    // A CA bundle that is not one: the setting and the path, before any call.
    let mut c = sidecar();
    base(&mut c);
    c.env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api")
        .env("PERAGO_CONDUCTOR_CA_FILE", &contract);
    let (code, err) = stderr_of(&mut c);
    assert_eq!(code, Some(1));
    assert!(
        err.contains(&format!(
            "error: PERAGO_CONDUCTOR_CA_FILE={}: holds no PEM certificate",
            contract.display()
        )),
        "{err}"
    );
    // A broken contract.
    std::fs::write(&contract, "{").unwrap();
    let mut c = sidecar();
    base(&mut c);
    c.env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api");
    let (_, err) = stderr_of(&mut c);
    assert!(
        err.contains(&format!(
            "error: the task contract {} is invalid",
            contract.display()
        )),
        "{err}"
    );
}
