//! Persistent bodies (`spec.executor.body.mode: persistent`, runner protocol 2) against the
//! real Conductor: an unchanged Python Perago task function, run by `python -m perago_k8s run`
//! under `perago-runner --persistent`, serves many attempts per process; a process that
//! crashes or hangs fails only the attempt it held and the next attempt gets a fresh one; the
//! attempt and memory limits replace a process between attempts.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use perago_api::{contract, taskdef};
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::{Selection, shared};
use serde_json::{Value, json};

const MODULE: &str = r#"
import os
import time

from pydantic import BaseModel

from perago import RetryPolicy, TaskControls, TimeoutPolicy, task

SERVED = []


class Params(BaseModel):
    n: int
    crash: bool = False
    sleep: float = 0


class Result(BaseModel):
    total: int
    pid: int
    served: int


@task(
    name="TASK_NAME",
    owner_email="e2e@example.com",
    controls=TaskControls(retry=RetryPolicy(count=0), timeout=TimeoutPolicy(seconds=15, response_seconds=10)),
)
def double(params: Params) -> Result:
    if params.crash:
        os._exit(7)
    time.sleep(params.sleep)
    SERVED.append(params.n)
    return Result(total=2 * params.n, pid=os.getpid(), served=len(SERVED))
"#;

async fn conductor() -> ConductorApi {
    let services = shared(Selection {
        conductor: true,
        ..Selection::default()
    })
    .await;
    ConductorApi::new(&services.conductor().api_url)
}

/// The task of `MODULE` as `perago-k8s manifest` declares it, with two slots, registered; a
/// pod serving it with a persistent body and `limits` (the runner's variables).
struct Served {
    task: String,
    pod: Pod,
    _modules: tempfile::TempDir,
}

async fn serve(api: &ConductorApi, task: &str, limits: &[(&str, &str)]) -> Served {
    let python = perago_e2e::process::obtain("perago-python").unwrap();
    let modules = tempfile::tempdir().unwrap();
    std::fs::write(
        modules.path().join("doubler.py"),
        MODULE.replace("TASK_NAME", task),
    )
    .unwrap();
    let python_path = perago_e2e::python::path_with(modules.path());
    let mut spec = perago_e2e::python::manifest(modules.path(), "doubler");
    spec.executor.slots = 2;
    api.call(
        reqwest::Method::POST,
        "/metadata/taskdefs",
        Some(&json!([taskdef::render(&spec).unwrap()])),
    )
    .await;
    let contract = serde_json::to_value(contract::render(&spec).unwrap()).unwrap();
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let mut env = vec![
        ("PERAGO_PYTHON", python.to_str().unwrap()),
        ("PYTHONPATH", python_path.to_str().unwrap()),
        ("PERAGO_BODY_MODE", "persistent"),
    ];
    env.extend_from_slice(limits);
    let body = r#"exec "$PERAGO_PYTHON" -m perago_k8s run doubler:double"#;
    let pod = Pod::start(&bins, &api.base, &contract, body, &env).await;
    Served {
        task: task.to_owned(),
        pod,
        _modules: modules,
    }
}

/// One one-step workflow per params, 4 at a time; their steps' final states in order.
async fn run(api: &ConductorApi, task: &str, case: &str, params: &[Value]) -> Vec<Value> {
    let mut finished = Vec::new();
    for batch in params.chunks(4) {
        let mut ids = Vec::new();
        for p in batch {
            ids.push(api.start(task, case, json!({"params": p})).await);
        }
        for id in ids {
            finished.push(api.finished(&id).await["tasks"][0].clone());
        }
    }
    finished
}

/// (pid, attempts that process had served) of each completed step.
fn served_by(steps: &[Value], pod: &Pod) -> Vec<(u64, u64)> {
    steps
        .iter()
        .map(|step| {
            assert_eq!(step["status"], "COMPLETED", "{step}\n{}", pod.log());
            let result = &step["outputData"]["result"];
            (
                result["pid"].as_u64().unwrap(),
                result["served"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn pids(served: &[(u64, u64)]) -> BTreeSet<u64> {
    served.iter().map(|(pid, _)| *pid).collect()
}

#[tokio::test]
async fn a_persistent_python_body_serves_many_attempts_and_is_replaced_when_it_fails() {
    let api = conductor().await;
    let task = format!("e2e.persistent.{}", std::process::id());
    let served = serve(&api, &task, &[("PERAGO_BODY_MAX_ATTEMPTS", "6")]).await;
    let pod = &served.pod;

    let many: Vec<Value> = (0..12).map(|n| json!({"n": n})).collect();
    let steps = run(&api, &served.task, "many", &many).await;
    for (n, step) in steps.iter().enumerate() {
        assert_eq!(
            step["outputData"]["result"]["total"],
            2 * n as u64,
            "{step}"
        );
    }
    let first = served_by(&steps, pod);
    // Two slots, at most six attempts per process: 12 attempts in two to four processes, and
    // each process counts its own attempts (the module was imported once in each).
    let mut by_pid: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (pid, count) in &first {
        by_pid.entry(*pid).or_default().push(*count);
    }
    assert!((2..=4).contains(&by_pid.len()), "{by_pid:?}");
    for counts in by_pid.values_mut() {
        counts.sort_unstable();
    }
    for counts in by_pid.values() {
        let expected: Vec<u64> = (1..=counts.len() as u64).collect();
        assert!(*counts == expected && counts.len() <= 6, "{by_pid:?}");
    }

    let crashed = &run(
        &api,
        &served.task,
        "crash",
        &[json!({"n": 1, "crash": true})],
    )
    .await[0];
    assert_eq!(crashed["status"], "FAILED", "{crashed}");
    assert_eq!(
        crashed["reasonForIncompletion"], "task body exited with status 7",
        "{crashed}"
    );
    let hung = &run(&api, &served.task, "hang", &[json!({"n": 1, "sleep": 60})]).await[0];
    assert_eq!(hung["status"], "FAILED", "{hung}");
    let reason = hung["reasonForIncompletion"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("executor did not return result for task"),
        "{reason}"
    );

    // Both failures took their process with them; the next attempts get fresh ones.
    served_by(&run(&api, &served.task, "after", &many[..4]).await, pod);
    let log = pod.log();
    assert!(
        log.contains("replacing the persistent body") && log.contains("it served 6 attempts"),
        "{log}"
    );
}

#[tokio::test]
async fn a_persistent_body_past_its_memory_limit_is_replaced_after_each_attempt() {
    let api = conductor().await;
    let task = format!("e2e.persistent.memory.{}", std::process::id());
    // One byte: any Python process is past it after every attempt.
    let served = serve(&api, &task, &[("PERAGO_BODY_MAX_MEMORY_BYTES", "1")]).await;
    let params: Vec<Value> = (0..6).map(|n| json!({"n": n})).collect();
    let steps = run(&api, &served.task, "memory", &params).await;
    let each = served_by(&steps, &served.pod);
    assert!(each.iter().all(|(_, n)| *n == 1), "{each:?}");
    assert_eq!(pids(&each).len(), 6, "{each:?}");
    assert!(served.pod.log().contains("above its limit"));
}
