//! `kubectl perago` against the real Conductor and lakeFS, on histories and staging branches
//! that real attempts of local pods made: a publication, a crash after merge and the retry
//! that superseded it, foreign commits (one with hostile metadata), a crash after stage, and
//! an attempt paused before its merge.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use perago_api::{contract, manifest, taskdef};
use perago_e2e::lake::Lake;
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, Services, shared};
use serde_json::{Value, json};

async fn services() -> &'static Services {
    shared(Selection {
        conductor: true,
        lakefs: true,
        ..Selection::default()
    })
    .await
}

/// Run `kubectl-perago` with the servers' endpoints in the environment.
fn kubectl_perago(services: &Services, args: &[&str]) -> Output {
    kubectl_perago_at(services, &services.conductor().api_url, args)
}

fn kubectl_perago_at(services: &Services, conductor: &str, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-perago"))
        .args(args)
        .env("CONDUCTOR_SERVER_URL", conductor)
        .env("LAKECTL_SERVER_ENDPOINT_URL", &services.lakefs().endpoint)
        .env("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID)
        .env(
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            LAKEFS_SECRET_ACCESS_KEY,
        )
        .output()
        .unwrap()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Register a workspace task (prefix `/`) and start a local pod for it with `env`.
async fn task_pod(
    task: &str,
    controls: &str,
    body: &str,
    env: &[(&str, &str)],
) -> (ConductorApi, Pod) {
    let services = services().await;
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: t}}
spec:
  taskName: {task}
  ownerEmail: e2e@example.com
  workspace: {{prefix: /}}
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

async fn start(
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
async fn finished(api: &ConductorApi, id: &str) -> Value {
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

async fn head(lake: &Lake, repo: &str, branch: &str) -> String {
    lake.get(&format!("/repositories/{repo}/branches/{branch}"))
        .await
        .unwrap()["commit_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn staging_branches(lake: &Lake, repo: &str) -> Vec<String> {
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

async fn wait_exit(pod: &mut Pod) {
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

/// Writes a file per attempt, so a retry's publication supersedes the earlier one.
const PER_ATTEMPT: &str = r#"echo "$PERAGO_RETRY_COUNT" > "$PERAGO_WORKSPACE/attempt-$PERAGO_RETRY_COUNT.txt"
printf '{}' > "$PERAGO_RESULT""#;

#[tokio::test]
async fn history_classifies_publications_supersessions_and_foreign_commits() {
    let services = services().await;
    let lake = Lake::new(&services.lakefs().endpoint);
    let repo = format!("kp-history-{}", std::process::id());
    let input = lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    let task = "kp.history";
    let controls = "{retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 2}}";

    // A publication whose pod dies before it reports; the retry supersedes it.
    let (api, mut crashing) = task_pod(
        task,
        controls,
        PER_ATTEMPT,
        &[("PERAGO_FAULT", "exit-after-merge")],
    )
    .await;
    let first = start(&api, task, "crash", &repo, "main", &input).await;
    wait_exit(&mut crashing).await;
    let (_, _pod) = task_pod(task, controls, PER_ATTEMPT, &[]).await;
    let wf = finished(&api, &first).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let superseding = head(&lake, &repo, "main").await;

    // A foreign commit, then a publication on top of it.
    let foreign = lake
        .post(
            &format!("/repositories/{repo}/branches/main/commits"),
            json!({"message": "nightly compaction", "allow_empty": true}),
        )
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = start(&api, task, "after-foreign", &repo, "main", &foreign).await;
    assert_eq!(finished(&api, &second).await["status"], "COMPLETED");
    let top = head(&lake, &repo, "main").await;

    let out = kubectl_perago(
        services,
        &[
            "history",
            "--repository",
            &repo,
            "--branch",
            "main",
            "--since",
            &input,
            "-o",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let view = json_of(&out);
    assert_eq!(view["head"], json!(top));
    assert_eq!(view["hard_fence"]["installed"], json!(false));
    assert_eq!(view["truncated"], json!(false));
    assert_eq!(view["problems"], json!([]));
    let commits = view["commits"].as_array().unwrap();
    let kinds: Vec<&str> = commits
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["confirm", "foreign", "confirm", "confirm"],
        "{view}"
    );
    assert_eq!(commits[0]["id"], json!(top));
    assert_eq!(commits[0]["workflow"], json!(second));
    assert_eq!(commits[0]["task_status"], "COMPLETED");
    assert_eq!(commits[1]["id"], json!(foreign));
    assert_eq!(commits[1]["message"], "nightly compaction");
    assert_eq!(commits[1]["committer"], "admin");
    assert_eq!(commits[2]["id"], json!(superseding));
    assert_eq!(commits[2]["attempt"], "1");
    assert_eq!(commits[2]["supersedes"], commits[3]["id"]);
    assert_eq!(commits[3]["superseded_by"], json!(superseding));
    assert_eq!(commits[3]["attempt"], "0");
    assert_eq!(
        commits[3]["task_status"], "TIMED_OUT",
        "the crashed attempt"
    );
    assert_eq!(commits[3]["workflow"], json!(first));

    // The table says the same for people, and warns that the hard fence is not installed.
    let table = kubectl_perago(
        services,
        &["history", "--repository", &repo, "--branch", "main"],
    );
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("hard fence: NOT installed"), "{text}");
    assert!(
        text.contains(&format!("superseded by {}", &superseding[..12])),
        "{text}"
    );
    assert!(text.contains("nightly compaction"), "{text}");

    // A limit below the history says so.
    let out = kubectl_perago(
        services,
        &[
            "history",
            "--repository",
            &repo,
            "--branch",
            "main",
            "--limit",
            "2",
            "-o",
            "yaml",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let yaml: Value = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(yaml["truncated"], json!(true));
    assert_eq!(yaml["commits"].as_array().unwrap().len(), 2);

    // A commit dressed as a publication, with a hostile message: flagged, exit status 1.
    lake.post(
        &format!("/repositories/{repo}/branches/main/commits"),
        json!({"message": "evil\n\u{1b}[31mred", "allow_empty": true,
               "metadata": {"perago.phase": "confirm", "perago.logical_task_key": "x",
                            "perago.expected_head": "not-the-parent"}}),
    )
    .await
    .unwrap();
    let out = kubectl_perago(
        services,
        &["history", "--repository", &repo, "--branch", "main"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("confirm metadata lacks"), "{text}");
    assert!(text.contains("is not its first parent"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "control characters are not printed: {text}"
    );

    // Unknown names and servers that are down: one line naming what failed, status 1.
    for (args, expected) in [
        (
            vec!["history", "--repository", &repo, "--branch", "nope"],
            "nope",
        ),
        (
            vec![
                "history",
                "--repository",
                "no-such-repo",
                "--branch",
                "main",
            ],
            "no-such-repo",
        ),
        (
            vec![
                "history",
                "--repository",
                &repo,
                "--branch",
                "main",
                "--since",
                "0123abcd",
            ],
            "--since 0123abcd",
        ),
    ] {
        let out = kubectl_perago(services, &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("error: ") && err.contains(expected),
            "{err}"
        );
    }
    let down = kubectl_perago_at(
        services,
        "http://127.0.0.1:9/api",
        &[
            "history",
            "--repository",
            &repo,
            "--branch",
            "main",
            "--since",
            &input,
        ],
    );
    assert_eq!(down.status.code(), Some(1));
    assert!(stderr(&down).contains("Conductor"), "{}", stderr(&down));
    let usage = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-perago"))
        .args(["history", "--repository", &repo, "--branch", "main"])
        .env_remove("LAKECTL_SERVER_ENDPOINT_URL")
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));
}

#[tokio::test]
async fn gc_deletes_the_branches_of_dead_attempts_and_keeps_a_live_one() {
    let services = services().await;
    let lake = Lake::new(&services.lakefs().endpoint);
    let repo = format!("kp-gc-{}", std::process::id());
    let input = lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    lake.post(
        &format!("/repositories/{repo}/branches"),
        json!({"name": "side", "source": input}),
    )
    .await
    .unwrap();

    // A pod dies between stage and merge and its task is not retried: the branch is dead.
    let dead_task = "kp.gc-dead";
    let controls = "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 2}}";
    let (api, mut crashing) = task_pod(
        dead_task,
        controls,
        PER_ATTEMPT,
        &[("PERAGO_FAULT", "exit-after-stage")],
    )
    .await;
    let dead = start(&api, dead_task, "dead", &repo, "side", &input).await;
    wait_exit(&mut crashing).await;
    assert_eq!(finished(&api, &dead).await["status"], "TIMED_OUT");
    let dead_branch = staging_branches(&lake, &repo).await;
    assert_eq!(dead_branch.len(), 1, "{dead_branch:?}");
    let dead_branch = dead_branch[0].clone();

    // An attempt paused before its merge: its task is in progress.
    let live_task = "kp.gc-live";
    let (api, pod) = task_pod(
        live_task,
        "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 60}}",
        PER_ATTEMPT,
        &[("PERAGO_FAULT", "pause-before-merge")],
    )
    .await;
    let live = start(&api, live_task, "live", &repo, "main", &input).await;
    let paused = pod.path("work/paused-before-merge");
    let started = Instant::now();
    while !paused.exists() {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", pod.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live_branch: Vec<String> = staging_branches(&lake, &repo)
        .await
        .into_iter()
        .filter(|b| *b != dead_branch)
        .collect();
    assert_eq!(live_branch.len(), 1);
    let live_branch = live_branch[0].clone();

    // A leftover whose task Conductor has never heard of (as after its archive was purged).
    let orphan = "perago-staging-gone-step-seq-1-iteration-0-task-id-00000000-0000-4000-8000-000000000000-retry-0-exec-e1";
    lake.post(
        &format!("/repositories/{repo}/branches"),
        json!({"name": orphan, "source": input}),
    )
    .await
    .unwrap();

    let verdicts = |out: &Output| -> Vec<(String, String)> {
        json_of(out)["branches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["branch"].as_str().unwrap().to_owned(),
                    b["action"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let action = |v: &[(String, String)], branch: &str| {
        v.iter()
            .find(|(b, _)| b == branch)
            .map(|(_, a)| a.clone())
            .unwrap_or_default()
    };

    // Conductor down: nothing is deleted.
    let down = kubectl_perago_at(
        services,
        "http://127.0.0.1:9/api",
        &["gc", "--repository", &repo],
    );
    assert_eq!(down.status.code(), Some(1), "{}", stderr(&down));
    assert!(stderr(&down).contains("Conductor"), "{}", stderr(&down));
    assert_eq!(staging_branches(&lake, &repo).await.len(), 3);

    let dry = kubectl_perago(
        services,
        &["gc", "--repository", &repo, "--dry-run", "-o", "json"],
    );
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    let v = verdicts(&dry);
    assert_eq!(action(&v, &dead_branch), "would delete", "{v:?}");
    assert_eq!(action(&v, &live_branch), "kept", "{v:?}");
    assert_eq!(action(&v, orphan), "kept", "young: {v:?}");
    assert_eq!(
        staging_branches(&lake, &repo).await.len(),
        3,
        "a dry run deletes nothing"
    );

    let out = kubectl_perago(services, &["gc", "--repository", &repo]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("DELETED") && text.contains("its task is TIMED_OUT"),
        "{text}"
    );
    assert!(text.contains("its task is IN_PROGRESS"), "{text}");
    let left = staging_branches(&lake, &repo).await;
    assert!(
        !left.contains(&dead_branch) && left.contains(&live_branch),
        "{left:?}"
    );

    // The live attempt publishes once released.
    std::fs::remove_file(Path::new(&paused)).unwrap();
    let wf = api.finished(&live).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", pod.log());

    let out = kubectl_perago(
        services,
        &[
            "gc",
            "--repository",
            &repo,
            "--older-than",
            "0s",
            "-o",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(action(&verdicts(&out), orphan), "deleted");
    assert_eq!(staging_branches(&lake, &repo).await, Vec::<String>::new());

    let bad = kubectl_perago(
        services,
        &["gc", "--repository", &repo, "--older-than", "soon"],
    );
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}
