//! The sidecar runtime against the real Conductor server: each test declares a PeragoTask,
//! registers the TaskDef the operator would render, runs the pod locally (`perago-sidecar
//! local`: the sidecar plus `perago-runner` as a second process sharing the work directory),
//! starts a workflow and asserts the final Conductor state, reasons included.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use perago_api::{contract, manifest, taskdef};
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries, wait_file};
use perago_e2e::{Selection, shared};
use serde_json::{Value, json};
use tokio::process::Command;

async fn conductor() -> ConductorApi {
    let services = shared(Selection {
        conductor: true,
        ..Selection::default()
    })
    .await;
    ConductorApi::new(&services.conductor().api_url)
}

fn binaries() -> PodBinaries {
    PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"))
}

async fn pod(
    c: &ConductorApi,
    contract: &contract::TaskContract,
    body: &str,
    env: &[(&str, &str)],
) -> Pod {
    Pod::start(
        &binaries(),
        &c.base,
        &serde_json::to_value(contract).unwrap(),
        body,
        env,
    )
    .await
}

/// A task declared as a PeragoTask manifest, its TaskDef registered.
async fn declare(conductor: &ConductorApi, name: &str, extra_spec: &str) -> contract::TaskContract {
    declare_slots(conductor, name, extra_spec, 1).await
}

const PARAMS_SCHEMA: &str = r#"
    type: object
    properties:
      n: {type: integer}
      mode: {type: string}
      inner: {type: object, properties: {q: {type: string}, depth: {type: integer, default: 1}}}
    required: [n]"#;

async fn declare_slots(
    conductor: &ConductorApi,
    name: &str,
    extra_spec: &str,
    slots: u32,
) -> contract::TaskContract {
    declare_with(conductor, name, PARAMS_SCHEMA, extra_spec, slots).await
}

/// A task with its own params schema (YAML, indented under `paramsSchema:`).
async fn declare_with(
    conductor: &ConductorApi,
    name: &str,
    params_schema: &str,
    extra_spec: &str,
    slots: u32,
) -> contract::TaskContract {
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: t}}
spec:
  taskName: {name}
  ownerEmail: e2e@example.com
  paramsSchema:{params_schema}
  resultSchema:
    type: object
    properties:
      total: {{type: integer}}
      seen: {{type: object, additionalProperties: true}}
    required: [total]
  executor: {{body: {{image: body, command: [sh]}}, slots: {slots}}}
{extra_spec}"#
    );
    let spec = manifest::parse(&yaml).unwrap().remove(0).task.spec;
    perago_api::validate(&spec).unwrap();
    let def = taskdef::render(&spec).unwrap();
    conductor
        .call(
            reqwest::Method::POST,
            "/metadata/taskdefs",
            Some(&json!([def])),
        )
        .await;
    contract::render(&spec).unwrap()
}

const DEFAULT_CONTROLS: &str =
    "  controls: {retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}\n";

fn kill(pid: &str, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(pid.parse().unwrap());
    nix::sys::signal::kill(pid, signal).unwrap();
}

fn only_task(wf: &Value) -> &Value {
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "expected exactly one attempt: {wf}");
    &tasks[0]
}

/// Reads `n` with Python (present wherever the tests run) and doubles it.
const DOUBLE: &str = r#"
python3 - <<'EOF'
import json, os
p = json.load(open(os.environ["PERAGO_PARAMS"]))
json.dump({"total": p["n"] * 2, "seen": p}, open(os.environ["PERAGO_RESULT"], "w"))
with open(os.environ["PERAGO_METRICS"], "a") as m:
    m.write(json.dumps({"kind": "histogram", "name": "items", "value": p["n"]}) + "\n")
    m.write(json.dumps({"kind": "gauge", "name": "undeclared", "value": 1}) + "\n")
EOF
"#;

#[tokio::test]
async fn success_reports_exactly_the_result_and_exports_metrics() {
    let c = conductor().await;
    let task = "rt.success";
    let controls = format!(
        "{DEFAULT_CONTROLS}  metrics: {{application: [{{name: items, kind: histogram}}]}}\n"
    );
    let contract = declare(&c, task, &controls).await;
    let pod = pod(&c, &contract, DOUBLE, &[]).await;
    let wf = c.start(task, "ok", json!({"params": {"n": 21}})).await;
    let wf = c.finished(&wf).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let t = only_task(&wf);
    assert_eq!(t["status"], "COMPLETED");
    assert_eq!(
        t["outputData"],
        json!({"result": {"total": 42, "seen": {"n": 21}}})
    );
    assert!(t.get("reasonForIncompletion").is_none(), "{t}");
    let worker = t["workerId"].as_str().unwrap();
    assert!(worker.starts_with("e2e-pod-under-test-"), "{worker}");
    let expected = [
        "perago_sidecar_attempts_total{status=\"COMPLETED\"} 1",
        "app_items_sum{task_name=\"rt.success\"} 21",
        "runtime_task_attempt_duration_seconds_count{task_name=\"rt.success\"} 1",
        "runtime_busy_slots{perago_instance_id=\"pod-under-test\",task_name=\"rt.success\"} 0",
    ];
    let metrics = pod.metrics_with(&expected).await;
    for line in expected {
        assert!(metrics.contains(line), "missing {line}:\n{metrics}");
    }
    assert!(!metrics.contains("undeclared"));
    let log = pod.log();
    assert!(
        log.contains("ignored application metric the task does not declare"),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("\"attempt reported\"")
            && l.contains("\"execution_id\"")
            && l.contains("\"retry_count\":0")),
        "attempt lines carry the attempt identity:\n{log}"
    );
    // A workspace-free attempt's files are in its slot's directory, emptied but for the
    // slot's marker and the params' file, kept for the next attempt's (ADR 0049, 0051),
    // once the attempt is over.
    let slots: Vec<_> = std::fs::read_dir(pod.path("work/executions"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(slots.len(), 1, "{slots:?}");
    assert!(slots[0].ends_with("slot-0001"), "{slots:?}");
    let mut left: Vec<_> = std::fs::read_dir(&slots[0])
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [".perago-attempt.json", "params.spare"],
        "the attempt's files are removed"
    );
}

#[tokio::test]
async fn body_failures_map_to_their_statuses_and_reasons() {
    let c = conductor().await;
    let task = "rt.failures";
    let contract = declare(&c, task, DEFAULT_CONTROLS).await;
    let body = r#"
mode=$(python3 -c 'import json,os; print(json.load(open(os.environ["PERAGO_PARAMS"])).get("mode", ""))')
case "$mode" in
  exit3) echo "boom" >&2; exit 3 ;;
  terminal) printf '{"reason": "input partition is missing", "terminal": true}' > "$PERAGO_ERROR"; exit 1 ;;
  retryable) printf '{"reason": "upstream busy"}' > "$PERAGO_ERROR"; exit 0 ;;
  badresult) printf '{"total": "x", "extra": 1}' > "$PERAGO_RESULT" ;;
  noresult) exit 0 ;;
esac
"#;
    let _pod = pod(&c, &contract, body, &[]).await;
    let cases = [
        (
            "exit3",
            "FAILED",
            "FAILED",
            "task body exited with status 3".to_owned(),
        ),
        (
            "terminal",
            "FAILED_WITH_TERMINAL_ERROR",
            "FAILED",
            "input partition is missing".to_owned(),
        ),
        ("retryable", "FAILED", "FAILED", "upstream busy".to_owned()),
        (
            "noresult",
            "FAILED",
            "FAILED",
            "task body exited with status 0 without writing a result to PERAGO_RESULT".to_owned(),
        ),
    ];
    let mut started = Vec::new();
    for (mode, ..) in &cases {
        started.push(
            c.start(task, mode, json!({"params": {"n": 1, "mode": mode}}))
                .await,
        );
    }
    for ((mode, task_status, wf_status, reason), id) in cases.iter().zip(&started) {
        let wf = c.finished(id).await;
        let t = only_task(&wf);
        assert_eq!(
            (wf["status"].as_str(), t["status"].as_str()),
            (Some(*wf_status), Some(*task_status)),
            "{mode}: {wf}"
        );
        assert_eq!(
            t["reasonForIncompletion"].as_str(),
            Some(reason.as_str()),
            "{mode}"
        );
        assert!(
            t["outputData"].as_object().is_none_or(|o| o.is_empty()),
            "{mode}: failures carry no output: {t}"
        );
    }
    let wf = c
        .finished(
            &c.start(
                task,
                "badresult",
                json!({"params": {"n": 1, "mode": "badresult"}}),
            )
            .await,
        )
        .await;
    let reason = only_task(&wf)["reasonForIncompletion"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.starts_with("invalid result: "), "{reason}");
    assert!(
        reason.contains("result.extra: Extra inputs are not permitted"),
        "{reason}"
    );
    assert!(reason.contains("result.total"), "{reason}");
}

#[tokio::test]
async fn strict_input_is_refused_before_the_body_runs() {
    let c = conductor().await;
    let task = "rt.strict";
    let contract = declare(&c, task, DEFAULT_CONTROLS).await;
    let pod = pod(&c, &contract, "touch \"$T/ran\"\n", &[]).await;
    let cases = [
        (
            "extra",
            json!({"params": {"n": 1, "zzz": 2, "inner": {"q": "a", "r": 1}}}),
            "invalid params: params.inner.r: Extra inputs are not permitted; params.zzz: Extra inputs are not permitted",
        ),
        (
            "workspace",
            json!({"params": {"n": 1}, "workspace": {"repository": "r"}}),
            "workspace-free task input must contain only params",
        ),
        (
            "missing",
            json!({"params": {}}),
            "invalid params: params.n: Field required",
        ),
    ];
    for (case, input, reason) in cases {
        let wf = c.finished(&c.start(task, case, input).await).await;
        let t = only_task(&wf);
        assert_eq!(t["status"], "FAILED", "{case}: {wf}");
        assert_eq!(t["reasonForIncompletion"].as_str(), Some(reason), "{case}");
    }
    assert!(!pod.path("ran").exists(), "the body never ran");
}

/// Invalid params read as Python Perago 0.6.1's Pydantic v2 messages, and the failure is an
/// ordinary (retryable) FAILED: Conductor retries it per the TaskDef, and the retry fails the
/// same way.
#[tokio::test]
async fn invalid_params_fail_retryably_with_pydantic_messages() {
    let c = conductor().await;
    let task = "rt.invalid";
    let schema = r#"
    type: object
    properties:
      name: {type: string, minLength: 1, pattern: '^[a-z]+$'}
      count: {type: integer, minimum: 0, maximum: 10}
      ratio: {type: number, exclusiveMinimum: 0}
      mode: {enum: [fast, exact]}
      flag: {type: boolean}
      tags: {type: array, items: {type: string}, minItems: 1, maxItems: 2}
      inner: {type: object, properties: {q: {type: string}}}
    required: [name, count]"#;
    let controls =
        "  controls: {retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 30}}\n";
    let contract = declare_with(&c, task, schema, controls, 1).await;
    let pod = pod(&c, &contract, "touch \"$T/ran\"\n", &[]).await;
    let cases = [
        (
            json!({"name": 5, "count": 1}),
            "invalid params: params.name: Input should be a valid string",
        ),
        (
            json!({"name": "a", "count": "5"}),
            "invalid params: params.count: Input should be a valid integer",
        ),
        (
            json!({"name": "a", "count": 11}),
            "invalid params: params.count: Input should be less than or equal to 10",
        ),
        (
            json!({"name": "a", "count": -1}),
            "invalid params: params.count: Input should be greater than or equal to 0",
        ),
        (
            json!({"name": "a", "count": 1.5}),
            "invalid params: params.count: Input should be a valid integer, got a number with a fractional part",
        ),
        (
            json!({"name": "a", "count": 1, "ratio": 0}),
            "invalid params: params.ratio: Input should be greater than 0",
        ),
        (
            json!({"name": "a", "count": 1, "mode": "slow"}),
            "invalid params: params.mode: Input should be 'fast' or 'exact'",
        ),
        (
            json!({"name": "a", "count": 1, "flag": "yes"}),
            "invalid params: params.flag: Input should be a valid boolean",
        ),
        (
            json!({"name": "", "count": 1}),
            "invalid params: params.name: String should have at least 1 character",
        ),
        (
            json!({"name": "A", "count": 1}),
            "invalid params: params.name: String should match pattern '^[a-z]+$'",
        ),
        (
            json!({"name": "a", "count": 1, "tags": ["x", "y", "z"]}),
            "invalid params: params.tags: List should have at most 2 items after validation, not 3",
        ),
        (
            json!({"name": "a", "count": 1, "tags": [1]}),
            "invalid params: params.tags.0: Input should be a valid string",
        ),
        (
            json!({"name": "a", "count": 1, "inner": []}),
            "invalid params: params.inner: Input should be a valid dictionary",
        ),
        (
            json!({"count": 1, "zzz": 2}),
            "invalid params: params.name: Field required; params.zzz: Extra inputs are not permitted",
        ),
    ];
    let mut cases: Vec<(Value, &str)> = cases
        .into_iter()
        .map(|(params, reason)| (json!({"params": params}), reason))
        .collect();
    // An extra top-level key (the task is strict) is no different.
    cases.push((
        json!({"params": {"name": "a", "count": 1}, "other": 1}),
        "workspace-free task input must contain only params",
    ));
    let mut started = Vec::new();
    for (i, (input, _)) in cases.iter().enumerate() {
        started.push(c.start(task, &format!("c{i}"), input.clone()).await);
    }
    for ((params, reason), id) in cases.iter().zip(&started) {
        let wf = c.finished(id).await;
        assert_eq!(wf["status"], "FAILED", "{params}: {wf}");
        let tasks = wf["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 2, "retried once: {wf}");
        for t in tasks {
            assert_eq!(t["status"], "FAILED", "{params}: {wf}");
            assert_eq!(
                t["reasonForIncompletion"].as_str(),
                Some(*reason),
                "{params}"
            );
        }
    }
    assert!(!pod.path("ran").exists(), "the body never ran");
}

#[tokio::test]
async fn lenient_input_drops_undeclared_fields_before_the_body_sees_them() {
    let c = conductor().await;
    let task = "rt.lenient";
    let contract = declare(
        &c,
        task,
        &format!("{DEFAULT_CONTROLS}  strictParams: false\n"),
    )
    .await;
    let _pod = pod(&c, &contract, DOUBLE, &[]).await;
    let input = json!({"params": {"n": 2, "zzz": 1, "inner": {"q": "a", "r": 1}}, "workspace": {"x": 1}, "other": 3});
    let wf = c.finished(&c.start(task, "lenient", input).await).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    assert_eq!(
        only_task(&wf)["outputData"],
        json!({"result": {"total": 4, "seen": {"n": 2, "inner": {"q": "a", "depth": 1}}}}),
        "undeclared fields dropped, the declared default filled in"
    );
    let wf = c
        .finished(&c.start(task, "noparams", json!({"other": 1})).await)
        .await;
    assert_eq!(
        only_task(&wf)["reasonForIncompletion"],
        "workspace-free task input must contain params"
    );
}

const SLEEPER: &str = r#"
echo $$ > "$T/body.pid.tmp"; echo $PPID > "$T/runner.pid.tmp"
mv "$T/body.pid.tmp" "$T/body.pid"; mv "$T/runner.pid.tmp" "$T/runner.pid"
mode=$(python3 -c 'import json,os; print(json.load(open(os.environ["PERAGO_PARAMS"])).get("mode", ""))')
if [ "$mode" = sleep ]; then sleep 30; fi
if [ "$mode" = nap ]; then sleep 3; fi
printf '{"total": 1}' > "$PERAGO_RESULT"
"#;

fn executor_exited(reason: &str, task_id: &str) -> bool {
    reason.starts_with("executor process for worker e2e-pod-under-test-")
        && reason.contains(&format!("-0001 exited while running task {task_id}"))
}

#[tokio::test]
async fn a_killed_body_fails_the_attempt_with_the_executor_exited_reason() {
    let c = conductor().await;
    let task = "rt.bodykill";
    let contract = declare(&c, task, DEFAULT_CONTROLS).await;
    let pod = pod(&c, &contract, SLEEPER, &[]).await;
    let id = c
        .start(task, "kill", json!({"params": {"n": 1, "mode": "sleep"}}))
        .await;
    kill(
        &wait_file(&pod.path("body.pid")).await,
        nix::sys::signal::Signal::SIGKILL,
    );
    let wf = c.finished(&id).await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "FAILED");
    let reason = t["reasonForIncompletion"].as_str().unwrap();
    assert!(
        executor_exited(reason, t["taskId"].as_str().unwrap()),
        "{reason}"
    );
    assert!(
        reason.ends_with(": the task body was killed by signal 9 (SIGKILL)"),
        "the reason says how the body died: {reason}"
    );
}

#[tokio::test]
async fn a_killed_runner_fails_the_attempt_and_its_slot_returns_with_the_next_generation() {
    let c = conductor().await;
    let task = "rt.runnerkill";
    let contract = declare(&c, task, DEFAULT_CONTROLS).await;
    let pod = pod(&c, &contract, SLEEPER, &[]).await;
    let id = c
        .start(task, "kill", json!({"params": {"n": 1, "mode": "sleep"}}))
        .await;
    let body_pid = wait_file(&pod.path("body.pid")).await;
    let runner_pid = wait_file(&pod.path("runner.pid")).await;
    std::fs::remove_file(pod.path("body.pid")).unwrap();
    kill(&runner_pid, nix::sys::signal::Signal::SIGKILL);
    let wf = c.finished(&id).await;
    // The orphaned body of the dead runner is not ours to report; stop it.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(body_pid.parse().unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    );
    let t = only_task(&wf);
    assert_eq!(t["status"], "FAILED");
    let reason = t["reasonForIncompletion"].as_str().unwrap();
    assert!(
        executor_exited(reason, t["taskId"].as_str().unwrap())
            && reason.ends_with(&format!(
                "exited while running task {}",
                t["taskId"].as_str().unwrap()
            )),
        "{reason}"
    );
    // The local supervisor restarts the runner; the slot serves the new generation.
    pod.wait_ready().await;
    let wf = c
        .finished(&c.start(task, "after", json!({"params": {"n": 1}})).await)
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let new_runner = wait_file(&pod.path("runner.pid")).await;
    assert_ne!(new_runner, runner_pid);
    let log = pod.log();
    assert!(
        log.contains("\"generation\":2"),
        "a second generation connected:\n{log}"
    );
}

#[tokio::test]
async fn lease_extension_keeps_an_attempt_longer_than_the_response_timeout() {
    let c = conductor().await;
    let task = "rt.lease";
    let contract = declare(
        &c,
        task,
        "  controls: {retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 2, policy: RETRY}}\n",
    )
    .await;
    let pod = pod(&c, &contract, &SLEEPER.replace("sleep 3", "sleep 6"), &[]).await;
    let id = c
        .start(task, "long", json!({"params": {"n": 1, "mode": "nap"}}))
        .await;
    wait_file(&pod.path("body.pid")).await;
    // Make the decider look at timeouts while the body runs, twice past the response timeout.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        c.decide(&id).await;
    }
    let wf = c.finished(&id).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let t = only_task(&wf);
    assert_eq!(t["retryCount"], 0);
    assert!(
        pod.metrics()
            .await
            .contains("perago_sidecar_lease_extensions_total{outcome=\"ok\"}")
    );
}

#[tokio::test]
async fn sigterm_lets_the_attempt_in_flight_finish_and_report() {
    let c = conductor().await;
    let task = "rt.sigterm";
    let contract = declare(&c, task, DEFAULT_CONTROLS).await;
    let mut pod = pod(&c, &contract, SLEEPER, &[]).await;
    let id = c
        .start(task, "drain", json!({"params": {"n": 1, "mode": "nap"}}))
        .await;
    wait_file(&pod.path("body.pid")).await;
    kill(&pod.pid().to_string(), nix::sys::signal::Signal::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(30), pod.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit {status:?}:\n{}", pod.log());
    let wf = c.workflow(&id).await;
    assert_eq!(wf["status"], "COMPLETED", "reported before exit: {wf}");
    assert!(
        pod.log()
            .contains("stopped polling; draining in-flight attempts")
    );
}

#[tokio::test]
async fn failure_reasons_are_truncated_to_the_configured_length() {
    let c = conductor().await;
    let task = "rt.truncate";
    let contract = declare(&c, task, DEFAULT_CONTROLS).await;
    let pod = pod(
        &c,
        &contract,
        "exit 3\n",
        &[("PERAGO_FAILURE_REASON_MAX_LENGTH", "8")],
    )
    .await;
    let wf = c
        .finished(&c.start(task, "cut", json!({"params": {"n": 1}})).await)
        .await;
    assert_eq!(only_task(&wf)["reasonForIncompletion"], "task bod");
    assert!(pod.log().contains("truncated task failure reason"));
}

#[tokio::test]
async fn a_missing_taskdef_stops_the_sidecar_at_start() {
    let c = conductor().await;
    let yaml_contract = json!({
        "version": 1, "taskName": "rt.never.registered", "strictParams": true,
        "paramsSchema": {"type": "object"}, "resultSchema": {"type": "object"},
        "slots": 1, "responseTimeoutSeconds": 10, "timeoutSeconds": 0
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("contract.json");
    std::fs::write(&path, yaml_contract.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_perago-sidecar"))
        .env("PERAGO_TASK_CONTRACT", &path)
        .env("PERAGO_WORK_DIR", dir.path().join("work"))
        .env("CONDUCTOR_SERVER_URL", &c.base)
        .env("PERAGO_HTTP_ADDR", "127.0.0.1:0")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: Conductor TaskDef 'rt.never.registered' is not registered; run perago extract and register it before start"),
        "{stderr}"
    );
}

#[tokio::test]
async fn slots_run_attempts_concurrently_and_may_finish_in_any_order() {
    let c = conductor().await;
    let task = "rt.slots";
    let contract = declare_slots(&c, task, DEFAULT_CONTROLS, 4).await;
    assert_eq!(contract.slots, 4);
    let body = r#"
n=$(python3 -c 'import json,os; print(json.load(open(os.environ["PERAGO_PARAMS"]))["n"])')
sleep "$n"
printf '{"total": %d, "seen": {"worker": "%s"}}' "$n" "$PERAGO_WORKER_ID" > "$PERAGO_RESULT"
"#;
    let _pod = pod(&c, &contract, body, &[]).await;
    let mut ids = Vec::new();
    for n in [3, 2, 1, 0] {
        ids.push(
            c.start(task, &format!("s{n}"), json!({"params": {"n": n}}))
                .await,
        );
    }
    let (mut starts, mut ends) = (Vec::new(), Vec::new());
    let mut workers = std::collections::BTreeSet::new();
    for id in &ids {
        let wf = c.finished(id).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf}");
        let t = only_task(&wf);
        starts.push(t["startTime"].as_i64().unwrap());
        ends.push(t["endTime"].as_i64().unwrap());
        workers.insert(
            t["outputData"]["result"]["seen"]["worker"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // Concurrency from Conductor's own times, not the wall clock of a busy machine: every
    // attempt was polled before the 3 s one ended (one slot would run them one after another).
    assert!(
        starts.iter().all(|s| *s < ends[0]),
        "every attempt started while the first still ran: starts {starts:?}, ends {ends:?}"
    );
    assert_eq!(workers.len(), 4, "four distinct slots: {workers:?}");
    assert!(
        ends[0] > ends[3],
        "the longest, started first, finished last: {ends:?}"
    );
}

/// A pod with free slots takes a lone task as soon as it is queued, even with Conductor's
/// longest long poll: a poll that waits asks for one task, since Conductor would hold the one
/// it has until the wait ends when asked for more (ADR 0052). Before that, each of these
/// tasks waited for what was left of a 5 s poll.
#[tokio::test]
async fn a_pod_with_free_slots_takes_a_lone_task_at_once() {
    let c = conductor().await;
    let task = "rt.lone";
    let contract = declare_slots(&c, task, DEFAULT_CONTROLS, 4).await;
    let body = r#"printf '{"total": 1}' > "$PERAGO_RESULT""#;
    let pod = pod(&c, &contract, body, &[("PERAGO_POLL_TIMEOUT_MS", "5000")]).await;
    let mut waits = Vec::new();
    for i in 0..3 {
        let id = c
            .start(task, &format!("lone{i}"), json!({"params": {"n": i}}))
            .await;
        let wf = c.finished(&id).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf}");
        let t = only_task(&wf);
        // Queued to polled, by Conductor's own clock.
        waits.push(t["startTime"].as_i64().unwrap() - t["scheduledTime"].as_i64().unwrap());
    }
    eprintln!("queued → polled: {waits:?} ms");
    assert!(
        waits.iter().all(|ms| *ms < 1000),
        "each lone task was polled within a second of being queued: {waits:?} ms\n{}",
        pod.log()
    );
}

/// Task metrics reach an OTLP/HTTP endpoint as 0.6.1 sends them: protobuf, the URL as given,
/// `app.` and `runtime.` names, unit `1`.
#[tokio::test]
async fn task_metrics_are_exported_over_otlp() {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use prost::Message;
    use std::sync::{Arc, Mutex};

    type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;
    let received: Received = Arc::default();
    let sink = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/custom/path",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let sink = Arc::clone(&sink);
                async move {
                    let content_type = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    sink.lock().unwrap().push((content_type, body.to_vec()));
                    ""
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/custom/path", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let c = conductor().await;
    let task = "rt.otlp";
    let controls = format!(
        "{DEFAULT_CONTROLS}  metrics: {{application: [{{name: items, kind: histogram}}]}}\n"
    );
    let contract = declare(&c, task, &controls).await;
    let pod = pod(
        &c,
        &contract,
        DOUBLE,
        &[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    )
    .await;
    let wf = c
        .finished(&c.start(task, "otlp", json!({"params": {"n": 5}})).await)
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    assert!(pod.stop().await.success());
    let bodies = received.lock().unwrap().clone();
    let (content_type, last) = bodies.last().expect("at least one export");
    assert_eq!(content_type, "application/x-protobuf");
    let request = ExportMetricsServiceRequest::decode(last.as_slice()).unwrap();
    let metrics = &request.resource_metrics[0].scope_metrics[0].metrics;
    let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
    for expected in [
        "app.items",
        "runtime.task_attempt_duration_seconds",
        "runtime.busy_slots",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let items = metrics.iter().find(|m| m.name == "app.items").unwrap();
    assert_eq!(items.unit, "1");
    let Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Histogram(h)) = &items.data
    else {
        panic!("app.items is not a histogram: {items:?}");
    };
    assert_eq!(
        (h.data_points[0].count, h.data_points[0].sum),
        (1, Some(5.0))
    );
}

/// A traces endpoint that accepts connections and never answers: the attempts complete all the
/// same, and the spans the sidecar could not send are dropped and counted; it still stops at
/// once when told to.
#[tokio::test]
async fn a_traces_endpoint_that_never_answers_costs_the_attempts_nothing() {
    // Connections queue in the listen backlog and no request is ever read.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}/v1/traces", silent.local_addr().unwrap());
    let c = conductor().await;
    let task = "rt.tracesilent";
    let contract = declare(&c, task, DEFAULT_CONTROLS).await;
    let pod = pod(
        &c,
        &contract,
        DOUBLE,
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "300"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    )
    .await;
    for case in ["a", "b"] {
        let wf = c
            .finished(&c.start(task, case, json!({"params": {"n": 1}})).await)
            .await;
        assert_eq!(only_task(&wf)["status"], "COMPLETED", "{wf}\n{}", pod.log());
    }
    // Two workspace-free attempts of 7 spans each, neither accepted.
    let dropped = "perago_sidecar_trace_spans_dropped_total{reason=\"export_failed\"} 14";
    let metrics = pod.metrics_with(&[dropped]).await;
    assert!(metrics.contains(dropped), "{metrics}\n{}", pod.log());
    assert!(
        metrics.contains("perago_sidecar_trace_spans_exported_total 0"),
        "{metrics}"
    );
    assert!(
        pod.log().contains("exporting spans over OTLP failed"),
        "{}",
        pod.log()
    );
    let stopping = std::time::Instant::now();
    assert!(pod.stop().await.success());
    eprintln!(
        "stopped in {:.1?} with the endpoint silent",
        stopping.elapsed()
    );
    drop(silent);
}

/// The `perago-runner` the local pod's sidecar started, if one runs now.
fn runner_of(sidecar: i32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`; comm may hold spaces, so split after its last ')'.
        let (head, rest) = stat.rsplit_once(") ")?;
        let ppid: i32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == sidecar && head.ends_with("(perago-runner")).then_some(pid)
    })
}

/// The runner is told to stop while the sidecar's long poll is in flight: the task that poll
/// brings already holds a slot, runs on the stopping runner and completes with one attempt;
/// the runner exits once the sidecar lets it go, and a new one takes over.
#[tokio::test]
async fn a_task_polled_while_the_runner_stops_still_runs_there() {
    let c = conductor().await;
    let task = "rt.drainrace";
    let contract = declare(&c, task, DEFAULT_CONTROLS).await;
    // 3 s long polls: a poll is nearly always in flight when the runner is told to stop.
    let pod = pod(
        &c,
        &contract,
        SLEEPER,
        &[("PERAGO_POLL_TIMEOUT_MS", "3000")],
    )
    .await;
    let mut stopped = Vec::new();
    for round in 0..3 {
        let started = std::time::Instant::now();
        let runner = loop {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "round {round}: no new runner:\n{}",
                pod.log()
            );
            match runner_of(pod.pid()) {
                Some(pid) if !stopped.contains(&pid) => break pid,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        pod.wait_ready().await;
        kill(&runner.to_string(), nix::sys::signal::Signal::SIGTERM);
        stopped.push(runner);
        // Its `draining` reaches the sidecar (the runner looks at its signals every 200 ms).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let id = c
            .start(task, &format!("race-{round}"), json!({"params": {"n": 1}}))
            .await;
        let wf = c.finished(&id).await;
        let t = only_task(&wf);
        assert_eq!(
            t["status"],
            "COMPLETED",
            "round {round}: {wf}\n{}",
            pod.log()
        );
    }
    let log = pod.log();
    assert!(
        log.matches("runner is draining; no more assignments go to it")
            .count()
            >= 3,
        "{log}"
    );
}

/// A pod given a task domain serves the workflows that route the task type to it, and leaves
/// the task type's own queue to the pods without one.
#[tokio::test]
async fn a_pod_in_a_task_domain_serves_only_the_work_routed_to_it() {
    let c = conductor().await;
    let task = "rt.domain";
    let contract = declare(&c, task, DEFAULT_CONTROLS).await;
    let _pod = pod(
        &c,
        &contract,
        DOUBLE,
        &[("CONDUCTOR_WORKER_DOMAIN", "canary")],
    )
    .await;
    let unrouted = c.start(task, "unrouted", json!({"params": {"n": 3}})).await;
    let routed = c
        .start_routed(task, "routed", json!({"params": {"n": 2}}), Some("canary"))
        .await;

    let wf = c.finished(&routed).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let t = only_task(&wf);
    assert_eq!(t["domain"], "canary", "{t}");
    assert_eq!(t["outputData"]["result"]["total"], 4);

    // The pod polled all along; the unrouted step is still in the task type's own queue.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting = only_task(&c.workflow(&unrouted).await).clone();
    assert_eq!(waiting["status"], "SCHEDULED", "{waiting}");
    assert_eq!(waiting["pollCount"].as_i64().unwrap_or(0), 0, "{waiting}");
    let size = |domain: Option<&str>| {
        let query = domain.map_or(String::new(), |d| format!("&domain={d}"));
        let c = &c;
        async move {
            c.call(
                reqwest::Method::GET,
                &format!("/tasks/queue/size?taskType={task}{query}"),
                None,
            )
            .await
        }
    };
    assert_eq!(size(None).await, 1);
    assert_eq!(size(Some("canary")).await, 0);
    c.call(
        reqwest::Method::DELETE,
        &format!("/workflow/{unrouted}?reason=test%20done"),
        None,
    )
    .await;
}

/// Every attempt of one workflow run joins one trace (ADR 0041): a workflow of three steps,
/// each task type served by a pod of its own, the second failing its first attempt. Without a
/// `traceparent` the trace id is the workflow id without its dashes; with one in the step's
/// input (from the workflow's input) every attempt continues it; a malformed one is left out
/// with a warning.
#[tokio::test]
async fn a_workflow_run_is_one_trace_across_pods_and_retries() {
    let services = shared(Selection {
        conductor: true,
        ..Selection::default()
    })
    .await;
    let dir = services
        .dir()
        .join(format!("run-traces-{}", std::process::id()));
    let collector = perago_e2e::collector::Collector::start(&dir, "127.0.0.1")
        .await
        .unwrap();
    let c = conductor().await;
    let steps = ["rt.run.first", "rt.run.second", "rt.run.third"];
    let controls =
        "  controls: {retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 30}}\n";
    let env = [
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            collector.endpoint.as_str(),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    // The second step fails the first attempt of each run, marked by a file per workflow.
    let flaky = format!(
        "marker={}/failed-$(python3 -c 'import json,os; print(json.load(open(os.environ[\"PERAGO_PARAMS\"]))[\"n\"])')\n\
         if [ ! -e \"$marker\" ]; then touch \"$marker\"; exit 3; fi\n{DOUBLE}",
        dir.display()
    );
    let mut pods = Vec::new();
    for (step, body) in steps.iter().zip([DOUBLE, flaky.as_str(), DOUBLE]) {
        let contract = declare(&c, step, controls).await;
        pods.push(pod(&c, &contract, body, &env).await);
    }
    let tasks: Vec<Value> = steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            json!({"name": step, "taskReferenceName": format!("s{i}"), "type": "SIMPLE",
                   "inputParameters": {"params": {"n": "${workflow.input.n}"},
                                       "traceparent": "${workflow.input.traceparent}"}})
        })
        .collect();
    let wf = json!({"name": "rt.run", "version": 1, "schemaVersion": 2,
                    "ownerEmail": "e2e@example.com", "tasks": tasks});
    c.call(
        reqwest::Method::PUT,
        "/metadata/workflow",
        Some(&json!([wf])),
    )
    .await;
    let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut runs = Vec::new();
    for (n, traceparent) in [(1, None), (2, Some(given)), (3, Some("00-nonsense-01"))] {
        let mut input = json!({"n": n});
        if let Some(traceparent) = traceparent {
            input["traceparent"] = json!(traceparent);
        }
        let id = c
            .call(
                reqwest::Method::POST,
                "/workflow",
                Some(&json!({"name": "rt.run", "version": 1, "input": input})),
            )
            .await;
        let done = c.finished(id.as_str().unwrap()).await;
        assert_eq!(done["status"], "COMPLETED", "{done}");
        runs.push(done);
    }
    let task_ids: Vec<&str> = runs
        .iter()
        .flat_map(|wf| wf["tasks"].as_array().unwrap())
        .map(|t| t["taskId"].as_str().unwrap())
        .collect();
    assert_eq!(task_ids.len(), 12, "three steps and one retry per run");
    let attempts = collector
        .traces_where("perago.task.id", &task_ids, Duration::from_secs(30))
        .await
        .unwrap();
    for (run, expected) in runs.iter().zip([None, Some(given), None]) {
        let workflow = run["workflowId"].as_str().unwrap();
        let roots: Vec<&perago_e2e::collector::Span> = attempts
            .iter()
            .map(|a| &a[0])
            .filter(|root| root.text("perago.workflow.id") == Some(workflow))
            .collect();
        assert_eq!(roots.len(), 4, "{workflow}: {roots:#?}");
        let (trace_id, parent) = match expected {
            Some(traceparent) => {
                let parts: Vec<&str> = traceparent.split('-').collect();
                (parts[1].to_owned(), parts[2].to_owned())
            }
            None => (workflow.replace('-', ""), String::new()),
        };
        for root in &roots {
            assert_eq!(root.trace_id, trace_id, "{workflow}: {root:#?}");
            assert_eq!(root.parent_span_id, parent, "{workflow}: {root:#?}");
        }
        let workers: std::collections::BTreeSet<&str> = roots
            .iter()
            .filter_map(|r| r.text("perago.worker.id"))
            .collect();
        assert_eq!(workers.len(), 3, "three pods ran the run: {workers:?}");
        let second: Vec<Option<&str>> = roots
            .iter()
            .filter(|r| r.text("perago.task.type") == Some(steps[1]))
            .map(|r| r.text("perago.attempt.status"))
            .collect();
        assert_eq!(
            second,
            [Some("FAILED"), Some("COMPLETED")],
            "{workflow}: both attempts of the retried step"
        );
        eprintln!("run {workflow}: 4 attempts in 3 pods, one trace {trace_id} (parent {parent:?})");
    }
    let warned = pods[0].log_with(&["is not a W3C traceparent"]).await;
    assert!(
        warned.contains("00-nonsense-01"),
        "the malformed traceparent is named in a warning: {warned}"
    );
}
