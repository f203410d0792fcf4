//! Helpers for tests, benchmarks and the demo that drive a real Conductor and a local pod
//! (`perago-sidecar local`: the sidecar plus `perago-runner` as two processes sharing a
//! work directory, as the emptyDir is shared in a pod). They panic on failure: they are for
//! tests.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::process::free_port;

/// A Conductor client for driving workflows.
pub const TERMINAL: [&str; 4] = ["COMPLETED", "FAILED", "TERMINATED", "TIMED_OUT"];

pub struct ConductorApi {
    pub base: String,
    http: reqwest::Client,
}

impl ConductorApi {
    pub fn new(api_url: &str) -> Self {
        Self {
            base: api_url.to_owned(),
            // The tests' own driver, which also starts workflows on the Conductor that serves a
            // private authority's certificate: what is under test verifies certificates.
            http: reqwest::Client::builder()
                .danger_accept_invalid_certs(true)
                .timeout(Duration::from_secs(15))
                .build()
                .unwrap(),
        }
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .header("Accept", "*/*");
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    }

    /// The HTTP status of `GET path`: whether Conductor holds what it names.
    pub async fn status_of(&self, path: &str) -> u16 {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        resp.status().as_u16()
    }

    /// Terminate a workflow a test is done with; one that already finished is fine (409).
    pub async fn terminate(&self, id: &str) {
        let resp = self
            .http
            .delete(format!("{}/workflow/{id}?reason=test%20done", self.base))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        assert!(
            status.is_success() || status == reqwest::StatusCode::CONFLICT,
            "terminating workflow {id}: {status} {}",
            resp.text().await.unwrap_or_default()
        );
    }

    /// Register the TaskDef of a PeragoTask manifest (`yaml`, one task) as the operator would;
    /// the task's contract, for a pod of it.
    pub async fn register_task(&self, yaml: &str) -> Value {
        let spec = perago_api::manifest::parse(yaml)
            .unwrap()
            .remove(0)
            .task
            .spec;
        self.call(
            reqwest::Method::POST,
            "/metadata/taskdefs",
            Some(&json!([perago_api::taskdef::render(&spec).unwrap()])),
        )
        .await;
        serde_json::to_value(perago_api::contract::render(&spec).unwrap()).unwrap()
    }

    /// Register a one-step workflow whose step gets `task_input` verbatim, and start it.
    pub async fn start(&self, task: &str, case: &str, task_input: Value) -> String {
        self.start_routed(task, case, task_input, None).await
    }

    /// [`Self::start`], the step routed to the task domain `domain` (`taskToDomain`).
    pub async fn start_routed(
        &self,
        task: &str,
        case: &str,
        task_input: Value,
        domain: Option<&str>,
    ) -> String {
        let name = format!("{task}.{case}");
        let wf = json!({
            "name": name, "version": 1, "schemaVersion": 2, "ownerEmail": "e2e@example.com",
            "tasks": [{"name": task, "taskReferenceName": "step", "type": "SIMPLE",
                       "inputParameters": task_input}],
        });
        self.call(
            reqwest::Method::PUT,
            "/metadata/workflow",
            Some(&json!([wf])),
        )
        .await;
        let mut request = json!({"name": name, "version": 1, "input": {}});
        if let Some(domain) = domain {
            request["taskToDomain"] = json!({task: domain});
        }
        let id = self
            .call(reqwest::Method::POST, "/workflow", Some(&request))
            .await;
        id.as_str().unwrap().to_owned()
    }

    /// Until Conductor holds at least `count` TaskDefs whose names start with `prefix`.
    pub async fn wait_taskdefs(&self, prefix: &str, count: usize) {
        loop {
            let defs = self
                .call(reqwest::Method::GET, "/metadata/taskdefs", None)
                .await;
            let registered = defs.as_array().map_or(0, |all| {
                all.iter()
                    .filter(|d| d["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
                    .count()
            });
            if registered >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub async fn workflow(&self, id: &str) -> Value {
        self.call(
            reqwest::Method::GET,
            &format!("/workflow/{id}?includeTasks=true"),
            None,
        )
        .await
    }

    pub async fn finished(&self, id: &str) -> Value {
        let started = Instant::now();
        loop {
            let wf = self.workflow(id).await;
            if TERMINAL.contains(&wf["status"].as_str().unwrap_or("")) {
                return wf;
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "workflow {id} did not finish: {wf}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Let the decider evaluate timeouts now rather than at its next sweep.
    pub async fn decide(&self, id: &str) {
        self.call(
            reqwest::Method::PUT,
            &format!("/workflow/decide/{id}"),
            None,
        )
        .await;
    }
}

/// Paths of the two binaries of a pod.
#[derive(Clone, Debug)]
pub struct PodBinaries {
    pub sidecar: PathBuf,
    pub runner: PathBuf,
}

impl PodBinaries {
    /// The sidecar a test or bench of the sidecar's crate was built with
    /// (`env!("CARGO_BIN_EXE_perago-sidecar")`) and the runner beside it. The runner is a crate
    /// of its own, so cargo does not build it for the sidecar's tests: it is built here, once
    /// per process, in the same target directory and profile (a no-op when it is current).
    pub fn beside(sidecar: &str) -> Self {
        static RUNNER: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
        let sidecar = PathBuf::from(sidecar);
        let runner = RUNNER.get_or_init(|| build_runner_beside(&sidecar));
        match runner {
            Ok(runner) => Self {
                sidecar,
                runner: runner.clone(),
            },
            Err(e) => panic!("{e}"),
        }
    }

    /// The static release binaries, for tests outside the sidecar's crate.
    pub fn release() -> Self {
        let dir = crate::process::release_binaries(
            &["perago-sidecar", "perago-runner"],
            "local pods outside the sidecar crate's tests run them",
        )
        .unwrap();
        Self {
            sidecar: dir.join("perago-sidecar"),
            runner: dir.join("perago-runner"),
        }
    }
}

/// `cargo build -p perago-runner` into the directory of `sidecar`, which is
/// `<target-dir>/[<triple>/]<profile>/perago-sidecar`.
fn build_runner_beside(sidecar: &Path) -> Result<PathBuf, String> {
    let profile_dir = sidecar
        .parent()
        .ok_or_else(|| format!("{} has no directory", sidecar.display()))?;
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug");
    let above = profile_dir.parent().unwrap_or(Path::new("."));
    let mut cargo =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo.args([
        "build",
        "-q",
        "-p",
        "perago-runner",
        "--bin",
        "perago-runner",
    ]);
    // A target directory holds CACHEDIR.TAG; otherwise `above` is a `--target` triple's directory.
    if above.join("CACHEDIR.TAG").exists() {
        cargo.arg("--target-dir").arg(above);
    } else {
        let triple = above
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        cargo
            .arg("--target-dir")
            .arg(above.parent().unwrap_or(Path::new(".")));
        cargo.args(["--target", triple]);
    }
    match profile {
        "debug" => {}
        "release" => {
            cargo.arg("--release");
        }
        other => {
            cargo.args(["--profile", other]);
        }
    }
    let status = cargo
        .status()
        .map_err(|e| format!("running {cargo:?} failed: {e}"))?;
    if !status.success() {
        return Err(format!("{cargo:?} failed: {status}"));
    }
    Ok(profile_dir.join("perago-runner"))
}

/// A pod run locally.
pub struct Pod {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub http: u16,
}

impl Pod {
    /// Start `perago-sidecar local -- sh body.sh` with `body` as the script. The body sees the
    /// pod's directory as `$T`. Waits until the pod is ready.
    pub async fn start(
        bins: &PodBinaries,
        conductor_url: &str,
        contract: &Value,
        body: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("perago-pod-")
            .tempdir()
            .unwrap();
        let contract_path = dir.path().join("contract.json");
        std::fs::write(&contract_path, serde_json::to_vec(contract).unwrap()).unwrap();
        std::fs::write(dir.path().join("body.sh"), body).unwrap();
        let http = free_port().unwrap();
        let log = std::fs::File::create(dir.path().join("pod.log")).unwrap();
        let mut command = Command::new(&bins.sidecar);
        command
            .arg("local")
            .arg("--runner")
            .arg(&bins.runner)
            .env("PERAGO_TASK_CONTRACT", &contract_path)
            .env("PERAGO_WORK_DIR", dir.path().join("work"))
            .env("CONDUCTOR_SERVER_URL", conductor_url)
            .env("PERAGO_HTTP_ADDR", format!("127.0.0.1:{http}"))
            .env("POD_NAME", "pod-under-test")
            .env("PERAGO_WORKER_ID_PREFIX", "e2e")
            .env("PERAGO_LOG", "info")
            .env("T", dir.path())
            .envs(env.iter().copied())
            .args(["--", "sh"])
            .arg(dir.path().join("body.sh"))
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let child = command.spawn().unwrap();
        let pod = Self { child, dir, http };
        pod.wait_ready().await;
        pod
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("pod.log")).unwrap_or_default()
    }

    /// The log once a line holds every one of `words`, or after 10 s (what follows the report,
    /// such as the sweep of earlier attempts' staging branches, may log after the workflow
    /// is seen finished).
    pub async fn log_with(&self, words: &[&str]) -> String {
        let started = Instant::now();
        loop {
            let log = self.log();
            if log.lines().any(|l| words.iter().all(|w| l.contains(w)))
                || started.elapsed() > Duration::from_secs(10)
            {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let resp = reqwest::get(format!("http://127.0.0.1:{}{path}", self.http))
            .await
            .ok()?;
        Some((resp.status().as_u16(), resp.text().await.ok()?))
    }

    pub async fn wait_ready(&self) {
        let started = Instant::now();
        while self.get("/readyz").await.map(|r| r.0) != Some(200) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "pod not ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.unwrap().1
    }

    /// The metrics once every line of `expected` is in them (they trail Conductor: an attempt
    /// is counted when the sidecar has the answer to its report, which may come after the
    /// workflow is seen finished).
    pub async fn metrics_with(&self, expected: &[&str]) -> String {
        let started = Instant::now();
        loop {
            let metrics = self.metrics().await;
            if expected.iter().all(|l| metrics.contains(l))
                || started.elapsed() > Duration::from_secs(10)
            {
                return metrics;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id().unwrap()).unwrap()
    }

    /// Stop the pod as Kubernetes would (SIGTERM, then wait). Dropping a pod kills it at once
    /// instead, and a sidecar killed during a long poll can lose the tasks Conductor pops for
    /// it: they stay IN_PROGRESS until their response timeout.
    pub async fn stop(mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("the pod stops within a minute of SIGTERM")
            .unwrap()
    }
}

/// Wait for a file the body writes (its pid, say) and return its trimmed content.
pub async fn wait_file(path: &Path) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text.trim().to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
