//! What the tests of `kubectl-perago` share: the real servers, running the binary against
//! them, local pods of workspace tasks, and a few lakeFS and Conductor reads.

#![allow(clippy::unwrap_used, dead_code)]

use std::process::Output;
use std::time::{Duration, Instant};

use perago_api::{contract, manifest, taskdef};
use perago_e2e::lake::Lake;
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, Services, shared};
use serde_json::{Value, json};

pub async fn services() -> &'static Services {
    shared(Selection {
        conductor: true,
        lakefs: true,
        ..Selection::default()
    })
    .await
}

/// Run `kubectl-perago` with the servers' endpoints in the environment.
pub fn kubectl_perago(services: &Services, args: &[&str]) -> Output {
    kubectl_perago_with(services, args, &[])
}

pub fn kubectl_perago_at(services: &Services, conductor: &str, args: &[&str]) -> Output {
    kubectl_perago_with(services, args, &[("CONDUCTOR_SERVER_URL", conductor)])
}

/// [`kubectl_perago`] with some variables set otherwise.
pub fn kubectl_perago_with(services: &Services, args: &[&str], env: &[(&str, &str)]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-perago"))
        .args(args)
        .env("CONDUCTOR_SERVER_URL", &services.conductor().api_url)
        .env("LAKECTL_SERVER_ENDPOINT_URL", &services.lakefs().endpoint)
        .env("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID)
        .env(
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            LAKEFS_SECRET_ACCESS_KEY,
        )
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

pub fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A failure as the commands print it: exit status 1 and one line on stderr.
pub fn assert_one_line_error(out: &Output, expected: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}{}", stdout(out));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains(expected),
        "{expected:?} in {err}"
    );
}

/// Register a workspace task (prefix `/`) and start a local pod for it with `env`.
pub async fn task_pod(
    task: &str,
    controls: &str,
    body: &str,
    env: &[(&str, &str)],
) -> (ConductorApi, Pod) {
    task_pod_with(task, "{prefix: /}", controls, body, env).await
}

/// Register the TaskDef of a workspace task declared with `workspace` and `controls`.
pub async fn register(task: &str, workspace: &str, controls: &str) -> (ConductorApi, Value) {
    let services = services().await;
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: t}}
spec:
  taskName: {task}
  ownerEmail: e2e@example.com
  workspace: {workspace}
  paramsSchema: {{type: object}}
  resultSchema: {{type: object}}
  controls: {controls}
  executor: {{body: {{image: body, command: [sh]}}, slots: 2}}
"#
    );
    let spec = manifest::parse(&yaml).unwrap().remove(0).task.spec;
    let api = ConductorApi::new(&services.conductor().api_url);
    api.call(
        reqwest::Method::POST,
        "/metadata/taskdefs",
        Some(&json!([taskdef::render(&spec).unwrap()])),
    )
    .await;
    let contract = serde_json::to_value(contract::render(&spec).unwrap()).unwrap();
    (api, contract)
}

/// [`task_pod`] with the task's `workspace` declaration given.
pub async fn task_pod_with(
    task: &str,
    workspace: &str,
    controls: &str,
    body: &str,
    env: &[(&str, &str)],
) -> (ConductorApi, Pod) {
    let services = services().await;
    let (api, contract) = register(task, workspace, controls).await;
    let lake = &services.lakefs().endpoint;
    let mut all = vec![
        ("LAKECTL_SERVER_ENDPOINT_URL", lake.as_str()),
        ("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID),
        (
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            LAKEFS_SECRET_ACCESS_KEY,
        ),
    ];
    all.extend_from_slice(env);
    let pod = Pod::start(&PodBinaries::release(), &api.base, &contract, body, &all).await;
    (api, pod)
}

pub async fn start(
    api: &ConductorApi,
    task: &str,
    case: &str,
    repo: &str,
    branch: &str,
    input: &str,
) -> String {
    api.start(
        task,
        case,
        json!({"workspace": {"repository": repo, "branch": branch, "refType": "commit", "ref": input},
               "params": {}}),
    )
    .await
}

/// Decide until the workflow ends (Conductor is slow to time out the attempt of a dead pod).
pub async fn finished(api: &ConductorApi, id: &str) -> Value {
    let started = Instant::now();
    loop {
        api.decide(id).await;
        let wf = api.workflow(id).await;
        if wf["status"] != "RUNNING" {
            return wf;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "{wf}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub async fn head(lake: &Lake, repo: &str, branch: &str) -> String {
    lake.get(&format!("/repositories/{repo}/branches/{branch}"))
        .await
        .unwrap()["commit_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub async fn staging_branches(lake: &Lake, repo: &str) -> Vec<String> {
    lake.get(&format!(
        "/repositories/{repo}/branches?prefix=perago-staging-&amount=1000"
    ))
    .await
    .unwrap()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Commit `files` (key, text) on `branch`; the new commit.
pub async fn commit_files(
    lake: &Lake,
    repo: &str,
    branch: &str,
    files: &[(&str, &str)],
    message: &str,
) -> String {
    for (key, text) in files {
        upload(lake, repo, branch, key, text).await.unwrap();
    }
    lake.post(
        &format!("/repositories/{repo}/branches/{branch}/commits"),
        json!({"message": message, "allow_empty": true}),
    )
    .await
    .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Upload one object to a branch, leaving it uncommitted.
pub async fn upload(
    lake: &Lake,
    repo: &str,
    branch: &str,
    key: &str,
    text: &str,
) -> anyhow::Result<String> {
    let endpoint = &services().await.lakefs().endpoint;
    lake.send(
        reqwest::Client::new()
            .post(format!(
                "{endpoint}/api/v1/repositories/{repo}/branches/{branch}/objects"
            ))
            .query(&[("path", key)])
            .header("Content-Type", "application/octet-stream")
            .body(text.to_owned()),
    )
    .await
}

pub async fn wait_exit(pod: &mut Pod) {
    let status = tokio::time::timeout(Duration::from_secs(60), pod.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.code(),
        Some(86),
        "the crash point was reached:\n{}",
        pod.log()
    );
}

pub async fn wait_path(path: &std::path::Path, pod: &Pod) {
    let started = Instant::now();
    while !path.exists() {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", pod.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes a file per attempt, so a retry's publication supersedes the earlier one.
pub const PER_ATTEMPT: &str = r#"echo "$PERAGO_RETRY_COUNT" > "$PERAGO_WORKSPACE/attempt-$PERAGO_RETRY_COUNT.txt"
printf '{}' > "$PERAGO_RESULT""#;

/// The first 12 characters of an id, as the tables print it.
pub fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}
