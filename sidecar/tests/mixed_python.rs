//! Mixed workflows: a step served by Python Perago 0.6.1 (`perago start`, from PyPI) and a
//! step served by this project's sidecar (a local pod), passing the workspace of one as the
//! input of the next on one branch of the real lakeFS, driven by the real Conductor.
//!
//! What Python 0.6.1 does, read from its source and checked here against the servers: its
//! merge commits carry no `perago.*` metadata (lakeFS's own `.lakefs.merge.strategy` only), and
//! its fence is not the publish fence of docs/design.md: with the head one commit past the input ref
//! it hard-resets the branch onto its staging commit (`perago try`, no metadata), whoever made
//! that commit, unless the branch is protected (lakeFS refuses the reset); with the head
//! further ahead it fails. This project's fence can classify none of Python's commits, so it
//! fails closed on them.
//!
//! A worker dies after its merge here as follows: this project's pod runs with
//! `PERAGO_FAULT=exit-after-merge`; for Python, the fault proxy holds its COMPLETED report and
//! the test kills the whole Python process group while the report is held. The test then ends
//! the orphaned attempt as Conductor's response timeout would (a FAILED update), and a fresh
//! worker of the same kind takes the retry.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use perago_api::{PeragoTaskSpec, contract, manifest, taskdef};
use perago_e2e::faults::{Fault, FaultProxy};
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::python::Worker;
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, Services, shared};
use perago_lakefs::{Commit, LakeFsClient};
use perago_workspace::history::{self, Entry};
use serde_json::{Value, json};

async fn services() -> &'static Services {
    shared(Selection {
        conductor: true,
        lakefs: true,
        ..Selection::default()
    })
    .await
}

/// The same declaration for both kinds of worker: root prefix, a `run` label in, a file count
/// out. The Python module below declares the same contract with Pydantic models.
fn spec(task: &str, retries: u32) -> PeragoTaskSpec {
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: t}}
spec:
  taskName: {task}
  ownerEmail: e2e@example.com
  workspace: {{prefix: /}}
  paramsSchema: {{type: object, properties: {{run: {{type: string}}}}, required: [run]}}
  resultSchema: {{type: object, properties: {{files: {{type: integer}}}}, required: [files]}}
  controls: {{retry: {{count: {retries}, delaySeconds: 0}}, timeout: {{responseSeconds: 30}}}}
  executor: {{body: {{image: body, command: [sh]}}, slots: 2}}
"#
    );
    let spec = manifest::parse(&yaml).unwrap().remove(0).task.spec;
    perago_api::validate(&spec).unwrap();
    spec
}

/// Register the TaskDef (for the Python task too: `perago start` only checks that it exists).
async fn register(api: &ConductorApi, spec: &PeragoTaskSpec) {
    api.call(
        reqwest::Method::POST,
        "/metadata/taskdefs",
        Some(&json!([taskdef::render(spec).unwrap()])),
    )
    .await;
}

/// This project's step: writes `rust.txt` naming the run and the attempt, counts the files.
const OUR_BODY: &str = r#"
run=$(sed -n 's/.*"run" *: *"\([^"]*\)".*/\1/p' "$PERAGO_PARAMS")
echo "rust $run attempt $((PERAGO_RETRY_COUNT + 1))" > "$PERAGO_WORKSPACE/rust.txt"
printf '{"files": %d}' "$(find "$PERAGO_WORKSPACE" -type f | wc -l)" > "$PERAGO_RESULT"
"#;

async fn our_pod(api: &ConductorApi, spec: &PeragoTaskSpec, extra_env: &[(&str, &str)]) -> Pod {
    let services = services().await;
    let contract = serde_json::to_value(contract::render(spec).unwrap()).unwrap();
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let mut env = vec![
        (
            "LAKECTL_SERVER_ENDPOINT_URL",
            services.lakefs().endpoint.as_str(),
        ),
        ("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID),
        (
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            LAKEFS_SECRET_ACCESS_KEY,
        ),
    ];
    env.extend_from_slice(extra_env);
    Pod::start(&bins, &api.base, &contract, OUR_BODY, &env).await
}

/// Python Perago's step: writes `python.txt` naming the run and the attempt (counted in the
/// state directory the test owns, since a Python body is not told its retry count).
const PYTHON_MODULE: &str = r#"
import os
from pathlib import Path

from pydantic import BaseModel

from perago import WorkspaceSpec, task


class Params(BaseModel):
    run: str


class Result(BaseModel):
    files: int


@task(name="TASK_NAME", owner_email="e2e@example.com", description="", workspace=WorkspaceSpec(prefix="/"))
def write(workspace: Path, params: Params) -> Result:
    counter = Path(os.environ["MIXED_STATE"]) / f"python-{params.run}"
    attempt = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(attempt))
    (workspace / "python.txt").write_text(f"python {params.run} attempt {attempt}\n")
    files = [p for p in workspace.rglob("*") if p.is_file() and p.name != ".perago-attempt.json"]
    return Result(files=len(files))
"#;

/// Python Perago's worker serving `PYTHON_MODULE` as `task`, counting attempts in `state`.
fn python_worker(services: &Services, task: &str, conductor_url: &str, state: &Path) -> Worker {
    let source = PYTHON_MODULE.replace("TASK_NAME", task);
    let state = state.to_str().unwrap();
    Worker::start(
        services,
        "mixedmod",
        &source,
        conductor_url,
        &[("MIXED_STATE", state)],
    )
    .unwrap()
}

fn lake_client(services: &Services) -> LakeFsClient {
    LakeFsClient::new(
        &services.lakefs().endpoint,
        LAKEFS_ACCESS_KEY_ID,
        LAKEFS_SECRET_ACCESS_KEY,
        Duration::from_secs(30),
    )
    .unwrap()
}

/// A repository whose main holds `seed.txt`; (name, seed commit).
async fn repository(name: &str) -> (String, String) {
    let lake = perago_e2e::lake::Lake::of(services().await.lakefs());
    let repo = format!("{name}-{}", std::process::id());
    let seed = lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    (repo, seed)
}

async fn head(client: &LakeFsClient, repo: &str) -> String {
    client.branch_head(repo, "main").await.unwrap()
}

/// Main's first-parent history from its head down to `input` (inclusive), newest first.
async fn log(client: &LakeFsClient, repo: &str, input: &str) -> Vec<Commit> {
    let (log, _) = client
        .first_parent_log(repo, "main", input, 50)
        .await
        .unwrap();
    assert_eq!(
        log.last().map(|c| c.id.as_str()),
        Some(input),
        "main's history reaches {input}: {log:?}"
    );
    log
}

fn ids(log: &[Commit]) -> Vec<&str> {
    log.iter().map(|c| c.id.as_str()).collect()
}

/// Key → content of every object at `reference`.
async fn tree(client: &LakeFsClient, repo: &str, reference: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in client.list_objects(repo, reference, "").await.unwrap() {
        let resp = client
            .get_object(repo, reference, &e.path, Duration::from_secs(30))
            .await
            .unwrap();
        out.insert(e.path, resp.text().await.unwrap());
    }
    out
}

fn files(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// No staging branch, at once or within 10 s: the sweep of earlier attempts' staging branches
/// runs after the report.
async fn assert_no_staging_branch(client: &LakeFsClient, repo: &str) {
    let started = std::time::Instant::now();
    while !client
        .list_branches(repo, "perago-staging-")
        .await
        .unwrap()
        .is_empty()
        && started.elapsed() < std::time::Duration::from_secs(10)
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        client.list_branches(repo, "perago-staging-").await.unwrap(),
        Vec::<String>::new(),
        "no staging branch is left behind"
    );
}

fn workspace(repo: &str, reference: &str) -> Value {
    json!({"repository": repo, "branch": "main", "refType": "commit", "ref": reference})
}

/// Python 0.6.1's squash merge: lakeFS's default message and lakeFS's own key, nothing else.
fn assert_python_merge(c: &Commit, parent: &str) {
    assert_eq!(c.parents, [parent], "{c:?}");
    assert_eq!(
        c.metadata,
        BTreeMap::from([(".lakefs.merge.strategy".to_owned(), "default".to_owned())]),
        "no perago.* metadata on Python's merge commit: {c:?}"
    );
    assert!(
        c.message.starts_with("Merge 'perago-staging-") && c.message.ends_with("' into 'main'"),
        "{c:?}"
    );
}

/// Python 0.6.1's hard reset: the branch now points at its staging commit, which has no
/// metadata at all.
fn assert_python_reset(c: &Commit, parent: &str) {
    assert_eq!(c.parents, [parent], "{c:?}");
    assert_eq!(c.message, "perago try", "{c:?}");
    assert!(c.metadata.is_empty(), "{c:?}");
}

/// A confirm commit of this project's step `reference` of workflow `wf`.
fn assert_our_confirm(
    c: &Commit,
    wf: &str,
    reference: &str,
    task: &str,
    (input, parent, supersedes): (&str, &str, &str),
    retry: u32,
) {
    assert_eq!(c.parents, [parent], "{c:?}");
    let m = &c.metadata;
    for (key, value) in [
        ("perago.phase", "confirm"),
        (
            "perago.logical_task_key",
            &*format!("{wf}:{reference}:0:{task}"),
        ),
        ("perago.input_ref", input),
        ("perago.expected_head", parent),
        ("perago.supersedes", supersedes),
        ("perago.retry_count", &*retry.to_string()),
        ("perago.target_branch", "main"),
        ("perago.prefix", "/"),
    ] {
        assert_eq!(m.get(key).map(String::as_str), Some(value), "{key}: {c:?}");
    }
}

/// Register and start a workflow of two steps on `repo@input`: the second step's workspace is
/// the first one's output workspace, `${<first>.output.workspace}`.
async fn start_two_steps(
    api: &ConductorApi,
    name: &str,
    (first_task, first_ref): (&str, &str),
    (second_task, second_ref): (&str, &str),
    repo: &str,
    input: &str,
) -> String {
    let wf = json!({
        "name": name, "version": 1, "schemaVersion": 2, "ownerEmail": "e2e@example.com",
        "tasks": [
            {"name": first_task, "taskReferenceName": first_ref, "type": "SIMPLE",
             "inputParameters": {"workspace": "${workflow.input.workspace}", "params": {"run": "${workflow.input.run}"}}},
            {"name": second_task, "taskReferenceName": second_ref, "type": "SIMPLE",
             "inputParameters": {"workspace": format!("${{{first_ref}.output.workspace}}"), "params": {"run": "${workflow.input.run}"}}},
        ],
        "outputParameters": {"workspace": format!("${{{second_ref}.output.workspace}}")},
    });
    api.call(
        reqwest::Method::PUT,
        "/metadata/workflow",
        Some(&json!([wf])),
    )
    .await;
    let id = api
        .call(
            reqwest::Method::POST,
            &format!("/workflow/{name}"),
            Some(&json!({"workspace": workspace(repo, input), "run": name})),
        )
        .await;
    id.as_str().unwrap().to_owned()
}

/// The attempts of step `reference`, in order.
fn attempts<'a>(wf: &'a Value, reference: &str) -> Vec<&'a Value> {
    wf["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["referenceTaskName"] == reference)
        .collect()
}

/// Poll the workflow until `done`; panics with `what` and `diag()` after 90 s.
async fn wait_until(
    api: &ConductorApi,
    id: &str,
    what: &str,
    diag: impl Fn() -> String,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let wf = api.workflow(id).await;
        if done(&wf) {
            return wf;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{what}: {} {:?}\n{}",
            wf["status"],
            summary(&wf),
            diag()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// End an attempt whose worker died, as Conductor's response timeout would.
async fn fail_attempt(api: &ConductorApi, wf: &str, task_id: &str) {
    api.call(
        reqwest::Method::POST,
        "/tasks",
        Some(&json!({"workflowInstanceId": wf, "taskId": task_id, "status": "FAILED",
                     "workerId": "e2e", "reasonForIncompletion": "its worker died after the merge"})),
    )
    .await;
}

/// (reference, status, retry count, worker) of every attempt.
fn summary(wf: &Value) -> Vec<String> {
    wf["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "{} {} retry {} worker {} reason {}",
                t["referenceTaskName"],
                t["status"],
                t["retryCount"],
                t["workerId"],
                t["reasonForIncompletion"]
            )
        })
        .collect()
}

fn status_of<'a>(list: &[&'a Value]) -> Vec<(&'a str, u64)> {
    list.iter()
        .map(|t| {
            (
                t["status"].as_str().unwrap_or(""),
                t["retryCount"].as_u64().unwrap_or(99),
            )
        })
        .collect()
}

/// Both orders on two repositories, nothing broken: each step sees the other's file, and the
/// branch holds both, one commit per step.
#[tokio::test]
async fn a_workspace_passes_between_python_perago_and_this_sidecar_in_both_orders() {
    let services = services().await;
    let api = ConductorApi::new(&services.conductor().api_url);
    let client = lake_client(services);
    let (py, ours) = ("mixed.plain.py", "mixed.plain.rs");
    let our_spec = spec(ours, 0);
    register(&api, &spec(py, 0)).await;
    register(&api, &our_spec).await;
    let state = tempfile::tempdir().unwrap();
    let python = python_worker(services, py, &services.conductor().api_url, state.path());
    let pod = our_pod(&api, &our_spec, &[]).await;
    let diag = || format!("python:\n{}\npod:\n{}", python.log(), pod.log());

    // Python first, then this sidecar.
    let (repo, a0) = repository("mixed-py-first").await;
    let id = start_two_steps(
        &api,
        "mixed.plain.pyfirst",
        (py, "python"),
        (ours, "ours"),
        &repo,
        &a0,
    )
    .await;
    let wf = wait_until(&api, &id, "python then ours", diag, |wf| {
        wf["status"] != "RUNNING"
    })
    .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", diag());
    let (p, o) = (attempts(&wf, "python"), attempts(&wf, "ours"));
    assert_eq!(status_of(&p), [("COMPLETED", 0)], "{wf}");
    assert_eq!(status_of(&o), [("COMPLETED", 0)], "{wf}");
    let head1 = head(&client, &repo).await;
    let log1 = log(&client, &repo, &a0).await;
    let p1 = log1[1].id.clone();
    assert_eq!(ids(&log1), [&*head1, &*p1, &*a0], "one commit per step");
    assert_eq!(
        p[0]["outputData"],
        json!({"workspace": workspace(&repo, &p1), "result": {"files": 2}}),
        "Python's output: the 0.6.1 wire format, its merge commit as the ref"
    );
    assert_eq!(
        o[0]["inputData"]["workspace"], p[0]["outputData"]["workspace"],
        "${{python.output.workspace}} is our input as it is"
    );
    assert_eq!(
        o[0]["outputData"],
        json!({"workspace": workspace(&repo, &head1), "result": {"files": 3}}),
        "our body saw seed.txt and python.txt"
    );
    assert_python_merge(&log1[1], &a0);
    assert_our_confirm(&log1[0], &id, "ours", ours, (&p1, &p1, ""), 0);
    let run = "mixed.plain.pyfirst";
    assert_eq!(
        tree(&client, &repo, &head1).await,
        files(&[
            ("python.txt", &format!("python {run} attempt 1\n")),
            ("rust.txt", &format!("rust {run} attempt 1\n")),
            ("seed.txt", "seed"),
        ])
    );
    // The history checker explains the branch once told which commit is Python's, and
    // reports that one otherwise: it has nothing to classify it by.
    let report = history::check(&log1, &a0, std::slice::from_ref(&p1));
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(
        matches!(&report.entries[..], [Entry::Confirm { id, .. }, Entry::Foreign { id: f }] if *id == head1 && *f == p1),
        "{report:?}"
    );
    let unexplained = history::check(&log1, &a0, &[]).problems;
    assert_eq!(unexplained.len(), 1, "{unexplained:?}");
    assert!(
        unexplained[0].starts_with(&format!("{p1}: neither a confirm commit")),
        "{unexplained:?}"
    );
    assert_no_staging_branch(&client, &repo).await;

    // This sidecar first, then Python.
    let (repo, a0) = repository("mixed-ours-first").await;
    let id = start_two_steps(
        &api,
        "mixed.plain.oursfirst",
        (ours, "ours"),
        (py, "python"),
        &repo,
        &a0,
    )
    .await;
    let wf = wait_until(&api, &id, "ours then python", diag, |wf| {
        wf["status"] != "RUNNING"
    })
    .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", diag());
    let (o, p) = (attempts(&wf, "ours"), attempts(&wf, "python"));
    assert_eq!(status_of(&o), [("COMPLETED", 0)], "{wf}");
    assert_eq!(status_of(&p), [("COMPLETED", 0)], "{wf}");
    let head2 = head(&client, &repo).await;
    let log2 = log(&client, &repo, &a0).await;
    let c1 = log2[1].id.clone();
    assert_eq!(ids(&log2), [&*head2, &*c1, &*a0], "one commit per step");
    assert_eq!(
        o[0]["outputData"],
        json!({"workspace": workspace(&repo, &c1), "result": {"files": 2}})
    );
    assert_eq!(
        p[0]["inputData"]["workspace"], o[0]["outputData"]["workspace"],
        "Python takes our output workspace as it is"
    );
    assert_eq!(
        p[0]["outputData"],
        json!({"workspace": workspace(&repo, &head2), "result": {"files": 3}}),
        "Python's body saw seed.txt and rust.txt"
    );
    assert_our_confirm(&log2[1], &id, "ours", ours, (&a0, &a0, ""), 0);
    assert_python_merge(&log2[0], &c1);
    let run = "mixed.plain.oursfirst";
    assert_eq!(
        tree(&client, &repo, &head2).await,
        files(&[
            ("python.txt", &format!("python {run} attempt 1\n")),
            ("rust.txt", &format!("rust {run} attempt 1\n")),
            ("seed.txt", "seed"),
        ])
    );
    let report = history::check(&log2, &a0, std::slice::from_ref(&head2));
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.standing().len(), 1, "{report:?}");
    assert_no_staging_branch(&client, &repo).await;
}

/// Wait until the proxy holds Python's COMPLETED report; the head Python merged.
async fn python_report_held(
    proxy: &FaultProxy,
    hold: &str,
    python: &Worker,
    client: &LakeFsClient,
    repo: &str,
) -> String {
    let started = Instant::now();
    while !proxy.held(hold) {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "Python never reported:\n{}",
            python.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    head(client, repo).await
}

/// A dead worker's last long poll may still be open on the server, which would hand it the
/// retry; wait until any such poll (100 ms for both kinds of worker) has long expired.
async fn let_dead_polls_expire() {
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// Wait for the crashing pod to exit right after its merge (status 86).
async fn crashed(pod: &mut Pod) {
    let status = tokio::time::timeout(Duration::from_secs(90), pod.child.wait())
        .await
        .unwrap_or_else(|_| panic!("the pod never crashed:\n{}", pod.log()))
        .unwrap();
    assert_eq!(
        status.code(),
        Some(86),
        "the sidecar crashed after the merge:\n{}",
        pod.log()
    );
    let_dead_polls_expire().await;
}

/// Python first, then this sidecar; the first attempt of each step dies after its merge.
/// Python's retry hard-resets main past its own lost publication; ours supersedes its own.
#[tokio::test]
async fn python_then_ours_each_retried_after_its_publication() {
    let services = services().await;
    let api = ConductorApi::new(&services.conductor().api_url);
    let client = lake_client(services);
    let (py, ours) = ("mixed.retry1.py", "mixed.retry1.rs");
    let our_spec = spec(ours, 1);
    register(&api, &spec(py, 1)).await;
    register(&api, &our_spec).await;
    let proxy = FaultProxy::start(&services.conductor().api_url)
        .await
        .unwrap();
    proxy.inject_with_body(
        Some("POST"),
        "/tasks",
        "COMPLETED",
        Fault::Hold("python-report".into()),
        Some(1),
    );
    let state = tempfile::tempdir().unwrap();
    let python = python_worker(services, py, &proxy.url, state.path());
    let mut crashing = our_pod(&api, &our_spec, &[("PERAGO_FAULT", "exit-after-merge")]).await;
    let (repo, a0) = repository("mixed-retry-py-first").await;
    let name = "mixed.retry1.wf";
    let id = start_two_steps(&api, name, (py, "python"), (ours, "ours"), &repo, &a0).await;

    // Python's first attempt merges; its report is held and its processes die with it.
    let p1 = python_report_held(&proxy, "python-report", &python, &client, &repo).await;
    assert_python_merge(&client.get_commit(&repo, &p1).await.unwrap(), &a0);
    drop(python);
    proxy.drop_held("python-report");
    let_dead_polls_expire().await;
    let wf = api.workflow(&id).await;
    let first = attempts(&wf, "python")[0];
    assert_eq!(first["status"], "IN_PROGRESS", "{wf}");
    fail_attempt(&api, &id, first["taskId"].as_str().unwrap()).await;

    // A fresh Python worker takes the retry: main is one commit past its input, so Python
    // hard-resets main onto its staging commit. Then our crashing pod merges and dies.
    let python = python_worker(services, py, &proxy.url, state.path());
    crashed(&mut crashing).await;
    let wf = api.workflow(&id).await;
    let p = attempts(&wf, "python");
    assert_eq!(
        status_of(&p),
        [("FAILED", 0), ("COMPLETED", 1)],
        "{wf}\n{}",
        python.log()
    );
    let s2 = p[1]["outputData"]["workspace"]["ref"]
        .as_str()
        .unwrap()
        .to_owned();
    let o = attempts(&wf, "ours");
    assert_eq!(o[0]["status"], "IN_PROGRESS", "{wf}");
    assert_eq!(o[0]["inputData"]["workspace"], workspace(&repo, &s2));
    let c1 = head(&client, &repo).await;
    fail_attempt(&api, &id, o[0]["taskId"].as_str().unwrap()).await;

    // A fresh pod takes our retry and supersedes our lost publication.
    let pod = our_pod(&api, &our_spec, &[]).await;
    let wf = wait_until(
        &api,
        &id,
        "the retries",
        || format!("python:\n{}\npod:\n{}", python.log(), pod.log()),
        |wf| wf["status"] != "RUNNING",
    )
    .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", pod.log());
    let o = attempts(&wf, "ours");
    assert_eq!(status_of(&o), [("FAILED", 0), ("COMPLETED", 1)], "{wf}");
    assert_eq!(o[1]["inputData"]["workspace"], workspace(&repo, &s2));
    let c2 = head(&client, &repo).await;
    assert_eq!(o[1]["outputData"]["workspace"], workspace(&repo, &c2));

    let history = log(&client, &repo, &a0).await;
    assert_eq!(
        ids(&history),
        [&*c2, &*c1, &*s2, &*a0],
        "Python's lost merge {p1} is no longer on main"
    );
    assert_python_reset(&history[2], &a0);
    assert_our_confirm(&history[1], &id, "ours", ours, (&s2, &s2, ""), 0);
    assert_our_confirm(&history[0], &id, "ours", ours, (&s2, &c1, &c1), 1);
    assert_eq!(
        tree(&client, &repo, &c2).await,
        files(&[
            ("python.txt", &format!("python {name} attempt 2\n")),
            ("rust.txt", &format!("rust {name} attempt 2\n")),
            ("seed.txt", "seed"),
        ]),
        "each prefix is its retry's workspace"
    );
    let report = history::check(&history, &a0, std::slice::from_ref(&s2));
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.publications().values().sum::<usize>(), 2);
    assert!(
        matches!(report.standing()[..], [Entry::Confirm { id, .. }] if *id == c2),
        "{report:?}"
    );
    assert_no_staging_branch(&client, &repo).await;
}

/// This sidecar first, then Python; the first attempt of each step dies after its merge.
#[tokio::test]
async fn ours_then_python_each_retried_after_its_publication() {
    let services = services().await;
    let api = ConductorApi::new(&services.conductor().api_url);
    let client = lake_client(services);
    let (py, ours) = ("mixed.retry2.py", "mixed.retry2.rs");
    let our_spec = spec(ours, 1);
    register(&api, &spec(py, 1)).await;
    register(&api, &our_spec).await;
    let proxy = FaultProxy::start(&services.conductor().api_url)
        .await
        .unwrap();
    proxy.inject_with_body(
        Some("POST"),
        "/tasks",
        "COMPLETED",
        Fault::Hold("python-report".into()),
        Some(1),
    );
    let state = tempfile::tempdir().unwrap();
    let python = python_worker(services, py, &proxy.url, state.path());
    let mut crashing = our_pod(&api, &our_spec, &[("PERAGO_FAULT", "exit-after-merge")]).await;
    let (repo, a0) = repository("mixed-retry-ours-first").await;
    let name = "mixed.retry2.wf";
    let id = start_two_steps(&api, name, (ours, "ours"), (py, "python"), &repo, &a0).await;

    crashed(&mut crashing).await;
    let c1 = head(&client, &repo).await;
    let wf = api.workflow(&id).await;
    let o = attempts(&wf, "ours");
    assert_eq!(o[0]["status"], "IN_PROGRESS", "{wf}");
    fail_attempt(&api, &id, o[0]["taskId"].as_str().unwrap()).await;
    let pod = our_pod(&api, &our_spec, &[]).await;

    // Our retry supersedes C1 with C2; Python's first attempt merges on C2 and dies.
    let p1 = python_report_held(&proxy, "python-report", &python, &client, &repo).await;
    drop(python);
    proxy.drop_held("python-report");
    let_dead_polls_expire().await;
    let wf = api.workflow(&id).await;
    let o = attempts(&wf, "ours");
    assert_eq!(status_of(&o), [("FAILED", 0), ("COMPLETED", 1)], "{wf}");
    let c2 = o[1]["outputData"]["workspace"]["ref"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_python_merge(&client.get_commit(&repo, &p1).await.unwrap(), &c2);
    let p = attempts(&wf, "python");
    assert_eq!(p[0]["status"], "IN_PROGRESS", "{wf}");
    assert_eq!(p[0]["inputData"]["workspace"], workspace(&repo, &c2));
    fail_attempt(&api, &id, p[0]["taskId"].as_str().unwrap()).await;

    let python = python_worker(services, py, &proxy.url, state.path());
    let wf = wait_until(
        &api,
        &id,
        "the retries",
        || format!("python:\n{}\npod:\n{}", python.log(), pod.log()),
        |wf| wf["status"] != "RUNNING",
    )
    .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", python.log());
    let p = attempts(&wf, "python");
    assert_eq!(status_of(&p), [("FAILED", 0), ("COMPLETED", 1)], "{wf}");
    let s2 = head(&client, &repo).await;
    assert_eq!(p[1]["outputData"]["workspace"], workspace(&repo, &s2));
    assert_eq!(wf["output"]["workspace"], workspace(&repo, &s2));

    let history = log(&client, &repo, &a0).await;
    assert_eq!(
        ids(&history),
        [&*s2, &*c2, &*c1, &*a0],
        "Python's lost merge {p1} is no longer on main"
    );
    assert_python_reset(&history[0], &c2);
    assert_our_confirm(&history[1], &id, "ours", ours, (&a0, &c1, &c1), 1);
    assert_our_confirm(&history[2], &id, "ours", ours, (&a0, &a0, ""), 0);
    assert_eq!(
        tree(&client, &repo, &s2).await,
        files(&[
            ("python.txt", &format!("python {name} attempt 2\n")),
            ("rust.txt", &format!("rust {name} attempt 2\n")),
            ("seed.txt", "seed"),
        ])
    );
    let report = history::check(&history, &a0, std::slice::from_ref(&s2));
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(
        matches!(report.standing()[..], [Entry::Confirm { id, .. }] if *id == c2),
        "{report:?}"
    );
    assert_no_staging_branch(&client, &repo).await;
}

/// Run a one-step workflow of `task` on `repo@input`; the finished workflow's only attempt.
async fn one_step(api: &ConductorApi, task: &str, case: &str, repo: &str, input: &str) -> Value {
    let id = api
        .start(
            task,
            case,
            json!({"workspace": workspace(repo, input), "params": {"run": case}}),
        )
        .await;
    let wf = api.finished(&id).await;
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{wf}");
    tasks[0].clone()
}

/// Wait until lakeFS enforces the new protection rule (it reads its settings through a
/// cache): an empty commit on main is refused as protected (403) rather than as empty (400).
async fn protection_in_force(lake: &perago_e2e::lake::Lake, endpoint: &str, repo: &str) {
    let started = Instant::now();
    loop {
        let probe = lake
            .send(
                reqwest::Client::new()
                    .post(format!(
                        "{endpoint}/api/v1/repositories/{repo}/branches/main/commits"
                    ))
                    .json(&json!({"message": "probe"})),
            )
            .await;
        let answer = probe
            .expect_err("an empty commit is refused either way")
            .to_string();
        if answer.contains("403") {
            return;
        }
        assert!(
            answer.contains("400") && started.elapsed() < Duration::from_secs(30),
            "{answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each fence on the other side's commits, on one branch. Ours fails closed on any Python
/// commit; Python's fails closed two commits ahead, but one commit ahead it hard-resets over
/// whatever is there, unless the branch is protected.
#[tokio::test]
async fn each_fence_on_the_other_sides_commits() {
    let services = services().await;
    let api = ConductorApi::new(&services.conductor().api_url);
    let client = lake_client(services);
    let (py, ours) = ("mixed.fence.py", "mixed.fence.rs");
    let our_spec = spec(ours, 0);
    register(&api, &spec(py, 0)).await;
    register(&api, &our_spec).await;
    let state = tempfile::tempdir().unwrap();
    let python = python_worker(services, py, &services.conductor().api_url, state.path());
    let pod = our_pod(&api, &our_spec, &[]).await;
    let (repo, a0) = repository("mixed-fence").await;

    // A workflow of this sidecar publishes C1 on A0.
    let t = one_step(&api, ours, "c1", &repo, &a0).await;
    assert_eq!(t["status"], "COMPLETED", "{t}\n{}", pod.log());
    let c1 = head(&client, &repo).await;

    // Python, given A0 with main one (foreign) commit ahead: it does not fail closed, it
    // hard-resets main onto its staging commit, and C1 with its file leaves main.
    let t = one_step(&api, py, "s1", &repo, &a0).await;
    assert_eq!(t["status"], "COMPLETED", "{t}\n{}", python.log());
    let s1 = head(&client, &repo).await;
    assert_eq!(t["outputData"]["workspace"], workspace(&repo, &s1));
    let history = log(&client, &repo, &a0).await;
    assert_eq!(ids(&history), [&*s1, &*a0], "{c1} is gone from main");
    assert_python_reset(&history[0], &a0);
    assert_eq!(
        tree(&client, &repo, &s1).await,
        files(&[
            ("python.txt", "python s1 attempt 1\n"),
            ("seed.txt", "seed")
        ]),
        "C1's rust.txt is gone with it"
    );

    // Ours, given A0 with Python's commit on top: it cannot classify it, so it fails closed.
    let t = one_step(&api, ours, "refused", &repo, &a0).await;
    assert_eq!(t["status"], "FAILED", "{t}");
    assert_eq!(
        t["reasonForIncompletion"],
        format!("main advanced from {a0} to {s1}")
    );
    assert_eq!(head(&client, &repo).await, s1, "nothing was published");

    // Ours publishes C2 on S1; Python, given A0 two commits behind, fails closed.
    let t = one_step(&api, ours, "c2", &repo, &s1).await;
    assert_eq!(t["status"], "COMPLETED", "{t}");
    let c2 = head(&client, &repo).await;
    let t = one_step(&api, py, "stale", &repo, &a0).await;
    assert_eq!(t["status"], "FAILED", "{t}");
    assert_eq!(
        t["reasonForIncompletion"],
        format!("main cannot publish from input ref {a0}; current head is {c2}")
    );
    assert_eq!(head(&client, &repo).await, c2, "nothing was published");

    // With main protected, Python's hard reset over C2 (given S1, one commit behind) is
    // refused, and C2 stays; this sidecar's squash merges still publish.
    let lake = perago_e2e::lake::Lake::of(services.lakefs());
    lake.send(
        reqwest::Client::new()
            .put(format!(
                "{}/api/v1/repositories/{repo}/settings/branch_protection",
                services.lakefs().endpoint
            ))
            .json(&json!([{"pattern": "main"}])),
    )
    .await
    .unwrap();
    protection_in_force(&lake, &services.lakefs().endpoint, &repo).await;
    let t = one_step(&api, py, "protected", &repo, &s1).await;
    assert_eq!(t["status"], "FAILED", "{t}");
    assert!(
        t["reasonForIncompletion"]
            .as_str()
            .unwrap()
            .contains("protected branch"),
        "{t}"
    );
    assert_eq!(head(&client, &repo).await, c2, "C2 stays");
    let t = one_step(&api, ours, "c3", &repo, &c2).await;
    assert_eq!(t["status"], "COMPLETED", "{t}\n{}", pod.log());
    let c3 = head(&client, &repo).await;

    // Python's squash merge publishes on the protected branch too; ours, given C3 with only
    // that merge commit on top, cannot classify it either and fails closed.
    let t = one_step(&api, py, "p", &repo, &c3).await;
    assert_eq!(t["status"], "COMPLETED", "{t}\n{}", python.log());
    let p = head(&client, &repo).await;
    assert_python_merge(&client.get_commit(&repo, &p).await.unwrap(), &c3);
    let t = one_step(&api, ours, "refused-merge", &repo, &c3).await;
    assert_eq!(t["status"], "FAILED", "{t}");
    assert_eq!(
        t["reasonForIncompletion"],
        format!("main advanced from {c3} to {p}")
    );
    assert_eq!(head(&client, &repo).await, p, "nothing was published");

    let history = log(&client, &repo, &a0).await;
    assert_eq!(ids(&history), [&*p, &*c3, &*c2, &*s1, &*a0]);
    let report = history::check(&history, &a0, &[s1.clone(), p.clone()]);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.publications().len(), 2, "C2 and C3: {report:?}");
    assert_no_staging_branch(&client, &repo).await;
}

/// A Python Perago task module as its users write it: Pydantic models, a workspace with
/// guardrails, a terminal error for input that cannot work, files written and deleted.
const MIGRATED_MODULE: &str = r#"
from pathlib import Path

from pydantic import BaseModel, Field

from perago import (RetryPolicy, TaskControls, TaskTerminalError, TimeoutPolicy, WorkspaceSpec,
                    forbid_glob, require_file, task)


class Params(BaseModel):
    words: list[str]
    upper: bool = False


class Result(BaseModel):
    files: int = Field(ge=0)
    size: int


@task(
    name="TASK_NAME",
    owner_email="e2e@example.com",
    description="Writes one file per word",
    workspace=WorkspaceSpec(prefix="/docs", pre=[require_file("seed.txt")], post=[forbid_glob("**/*.tmp")]),
    controls=TaskControls(retry=RetryPolicy(count=0), timeout=TimeoutPolicy(response_seconds=30)),
)
def write(workspace: Path, params: Params) -> Result:
    if not params.words:
        raise TaskTerminalError("no words to write")
    out = workspace / "out"
    out.mkdir(exist_ok=True)
    for i, word in enumerate(params.words):
        (out / f"{i}.txt").write_text(word.upper() if params.upper else word)
    (workspace / "seed.txt").unlink()
    files = [p for p in workspace.rglob("*") if p.is_file() and p.name != ".perago-attempt.json"]
    return Result(files=len(files), size=sum(p.stat().st_size for p in files))
"#;

/// One Python Perago module, unchanged, served by Python Perago's own worker and, as the
/// PeragoTask `perago-k8s manifest` writes for it, by this project's sidecar with
/// `python -m perago_k8s run` as its body: the same outcome, result and files on the branch.
#[tokio::test]
async fn a_python_perago_module_runs_unchanged_as_a_peragotask() {
    let services = services().await;
    let api = ConductorApi::new(&services.conductor().api_url);
    let client = lake_client(services);
    let pid = std::process::id();
    let (py_task, rs_task) = (format!("migrate-py-{pid}"), format!("migrate-rs-{pid}"));

    // The PeragoTask, generated from the module as a user would.
    let modules = tempfile::tempdir().unwrap();
    std::fs::write(
        modules.path().join("migrated.py"),
        MIGRATED_MODULE.replace("TASK_NAME", &rs_task),
    )
    .unwrap();
    let spec = perago_e2e::python::manifest(modules.path(), "migrated");
    assert_eq!(
        spec.executor.body.command,
        ["python", "-m", "perago_k8s", "run", "migrated:write"]
    );
    register(&api, &spec).await;
    let mut py_spec = spec.clone();
    py_spec.task_name = py_task.clone();
    register(&api, &py_spec).await;

    let python_worker = Worker::start(
        services,
        "migrated",
        &MIGRATED_MODULE.replace("TASK_NAME", &py_task),
        &services.conductor().api_url,
        &[],
    )
    .unwrap();
    let contract = serde_json::to_value(contract::render(&spec).unwrap()).unwrap();
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let python = perago_e2e::process::obtain("perago-python").unwrap();
    let python_path = perago_e2e::python::path_with(modules.path());
    let (python, python_path) = (python.to_str().unwrap(), python_path.to_str().unwrap());
    let pod = Pod::start(
        &bins,
        &api.base,
        &contract,
        r#"exec "$PERAGO_PYTHON" -m perago_k8s run migrated:write"#,
        &[
            (
                "LAKECTL_SERVER_ENDPOINT_URL",
                services.lakefs().endpoint.as_str(),
            ),
            ("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID),
            (
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                LAKEFS_SECRET_ACCESS_KEY,
            ),
            ("PERAGO_PYTHON", python),
            ("PYTHONPATH", python_path),
        ],
    )
    .await;

    let lake = perago_e2e::lake::Lake::of(services.lakefs());
    let seed = [
        ("docs/seed.txt", "seed"),
        ("docs/keep.txt", "kept"),
        ("other.txt", "x"),
    ];
    for (case, params) in [
        (
            "words",
            json!({"words": ["alpha", "beta"], "upper": true, "ignored": 1}),
        ),
        ("none", json!({"words": []})),
    ] {
        let mut outcomes = Vec::new();
        for task in [&py_task, &rs_task] {
            let repo = format!("{task}-{case}");
            let input = lake.seed(&repo, &seed).await.unwrap();
            let id = api
                .start(
                    task,
                    case,
                    json!({"workspace": workspace(&repo, &input), "params": params}),
                )
                .await;
            let wf = api.finished(&id).await;
            let step = attempts(&wf, "step")[0].clone();
            let files = tree(&client, &repo, &head(&client, &repo).await).await;
            assert_no_staging_branch(&client, &repo).await;
            outcomes.push((step, files));
        }
        let diag = || format!("python: {}\nsidecar: {}", python_worker.log(), pod.log());
        let [(py, py_files), (rs, rs_files)] = &outcomes[..] else {
            unreachable!()
        };
        assert_eq!(py["status"], rs["status"], "{case}: {py}\n{rs}\n{}", diag());
        assert_eq!(
            py["outputData"]["result"],
            rs["outputData"]["result"],
            "{case}: {}",
            diag()
        );
        assert_eq!(py_files, rs_files, "{case}: the files on the branch");
        let py_reason = py["reasonForIncompletion"].as_str().unwrap_or_default();
        let rs_reason = rs["reasonForIncompletion"].as_str().unwrap_or_default();
        assert!(
            rs_reason.contains(py_reason),
            "{case}: {py_reason:?} vs {rs_reason:?}"
        );
        match case {
            "words" => {
                assert_eq!(py["status"], "COMPLETED", "{}", diag());
                assert_eq!(py["outputData"]["result"], json!({"files": 3, "size": 13}));
                assert_eq!(
                    *rs_files,
                    files(&[
                        ("docs/keep.txt", "kept"),
                        ("docs/out/0.txt", "ALPHA"),
                        ("docs/out/1.txt", "BETA"),
                        ("other.txt", "x"),
                    ])
                );
            }
            _ => {
                assert_eq!(py["status"], "FAILED_WITH_TERMINAL_ERROR", "{}", diag());
                assert_eq!(py_reason, "no words to write");
            }
        }
    }
}
