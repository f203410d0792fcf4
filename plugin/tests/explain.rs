//! `kubectl perago explain` against the real Conductor and lakeFS, on workflows whose attempts
//! local pods really ran: a publication; a crash after merge, explained while the dead
//! attempt still looks in progress and again after the retry superseded it; a foreign commit
//! the publish fence refused; a merge that timed out, with and without a retry after it; a
//! pre guardrail's terminal failure and a no-op; and a failure with a hostile reason.

#![allow(clippy::unwrap_used)]

mod support;

use perago_e2e::lake::Lake;
use serde_json::{Value, json};
use support::*;

fn explain_json(services: &perago_e2e::Services, id: &str, code: i32) -> Value {
    let out = kubectl_perago(services, &["explain", id, "-o", "json"]);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    json_of(&out)
}

/// The attempts of the one step of a workflow's view.
fn attempts(view: &Value) -> &Vec<Value> {
    let steps = view["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{view:#}");
    assert_eq!(steps[0]["step"], "step");
    steps[0]["attempts"].as_array().unwrap()
}

#[tokio::test]
async fn a_publication_and_a_crash_after_merge_superseded_by_its_retry() {
    let services = services().await;
    let lake = Lake::of(services.lakefs());
    let controls = "{retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 2}}";

    // A publication, reported.
    let repo = format!("kx-pub-{}", std::process::id());
    let input = lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    let (api, _pod) = task_pod("kx.pub", controls, PER_ATTEMPT, &[]).await;
    let id = start(&api, "kx.pub", "pub", &repo, "main", &input).await;
    assert_eq!(finished(&api, &id).await["status"], "COMPLETED");
    let published = head(&lake, &repo, "main").await;
    let view = explain_json(services, &id, 0);
    assert_eq!(view["workflow_id"], json!(id));
    assert_eq!(view["status"], "COMPLETED");
    let a = &attempts(&view)[0];
    assert_eq!(attempts(&view).len(), 1);
    assert_eq!(a["attempt"], 0);
    assert_eq!(a["status"], "COMPLETED");
    assert_eq!(a["workspace"]["input_ref"], json!(input));
    assert_eq!(a["output_ref"], json!(published));
    assert!(a["worker_id"].as_str().unwrap().starts_with("e2e"), "{a}");
    assert!(a["started"].as_str().unwrap().ends_with('Z'), "{a}");
    assert_eq!(a["staging"], json!([]));
    assert_eq!(a["search"]["confirm"], json!(published));
    assert_eq!(a["search"]["searched"], 1);
    assert_eq!(a["search"]["reached_input_ref"], true);
    assert_eq!(a["verdict"]["kind"], "published_and_reported");
    assert_eq!(a["verdict"]["commit"], json!(published));
    assert_eq!(a["verdict"]["needs_attention"], false);
    let table = kubectl_perago(services, &["explain", &id]);
    assert_eq!(table.status.code(), Some(0), "{}", stderr(&table));
    let text = stdout(&table);
    assert!(
        text.contains(&format!(
            "attempt 0: published and reported: {} on main",
            short(&published)
        )),
        "{text}"
    );
    assert!(text.contains("    staging  none left\n"), "{text}");
    assert!(
        text.contains(&format!(
            "    confirm  {} on main (1 commit above the input ref searched)",
            short(&published)
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("step step (kx.pub) on {repo}@main")),
        "{text}"
    );

    // Wrong names and servers that are down: one line naming what failed, status 1.
    let unknown = kubectl_perago(services, &["explain", "no-such-workflow"]);
    assert_one_line_error(&unknown, "Conductor has no workflow no-such-workflow");
    let step = kubectl_perago(services, &["explain", &id, "--step", "nope"]);
    assert_one_line_error(
        &step,
        "has no workspace step nope (its workspace steps: step)",
    );
    let yaml = kubectl_perago(services, &["explain", &id, "--step", "step", "-o", "yaml"]);
    assert_eq!(yaml.status.code(), Some(0), "{}", stderr(&yaml));
    let yaml: Value = serde_yaml::from_slice(&yaml.stdout).unwrap();
    assert_eq!(attempts(&yaml)[0]["verdict"]["commit"], json!(published));
    let down = kubectl_perago_at(services, "http://127.0.0.1:9/api", &["explain", &id]);
    assert_one_line_error(&down, "Conductor get workflow failed: ");
    let lake_down = kubectl_perago_with(
        services,
        &["explain", &id],
        &[("LAKECTL_SERVER_ENDPOINT_URL", "http://127.0.0.1:9")],
    );
    assert_one_line_error(&lake_down, &format!("lakeFS list branches on {repo}@"));
    assert!(
        stderr(&lake_down).contains("Connection refused"),
        "{}",
        stderr(&lake_down)
    );
    let usage = kubectl_perago_with(services, &["explain", &id], &[("CONDUCTOR_SERVER_URL", "")]);
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));

    // A pod dies right after its merge: Conductor still has the attempt in progress.
    let repo = format!("kx-crash-{}", std::process::id());
    let input = lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    let (api, mut crashing) = task_pod(
        "kx.crash",
        controls,
        PER_ATTEMPT,
        &[("PERAGO_FAULT", "exit-after-merge")],
    )
    .await;
    let id = start(&api, "kx.crash", "crash", &repo, "main", &input).await;
    wait_exit(&mut crashing).await;
    let first = head(&lake, &repo, "main").await;
    let view = explain_json(services, &id, 0);
    let a = &attempts(&view)[0];
    assert_eq!(a["status"], "IN_PROGRESS", "{a}");
    assert_eq!(a["verdict"]["kind"], "still_running");
    assert_eq!(a["verdict"]["commit"], json!(first));
    let staging = a["staging"].as_array().unwrap();
    assert_eq!(staging.len(), 1, "{a}");
    assert_eq!(
        json!(staging_branches(&lake, &repo).await),
        json!([staging[0]["branch"]])
    );
    let try_commit = staging[0]["try_commit"].as_str().unwrap().to_owned();
    assert_eq!(staging[0]["head"], json!(try_commit));
    assert_eq!(a["search"]["confirm"], json!(first));
    let text = stdout(&kubectl_perago(services, &["explain", &id]));
    assert!(
        text.contains(&format!(
            "its merge already landed as {}, not reported yet",
            short(&first)
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("at {} (its try commit)", short(&try_commit))),
        "{text}"
    );

    // The retry supersedes the unreported publication.
    let (_, _retry_pod) = task_pod("kx.crash", controls, PER_ATTEMPT, &[]).await;
    assert_eq!(finished(&api, &id).await["status"], "COMPLETED");
    let second = head(&lake, &repo, "main").await;
    let view = explain_json(services, &id, 0);
    let list = attempts(&view);
    assert_eq!(list.len(), 2, "{view:#}");
    let (a0, a1) = (&list[0], &list[1]);
    assert_eq!(
        (a0["status"].as_str(), a1["status"].as_str()),
        (Some("TIMED_OUT"), Some("COMPLETED"))
    );
    assert_eq!(a0["verdict"]["kind"], "published_not_reported");
    assert_eq!(a0["verdict"]["commit"], json!(first));
    assert_eq!(a0["verdict"]["superseded_by"], json!(second));
    assert_eq!(a0["verdict"]["needs_attention"], false);
    assert_eq!(a0["staging"], json!([]), "the retry removed it");
    let summary = a0["verdict"]["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("retry 1 superseded it with {}", short(&second))),
        "{summary}"
    );
    assert_eq!(a1["verdict"]["kind"], "published_and_reported");
    assert_eq!(a1["verdict"]["commit"], json!(second));
    assert_eq!(a1["search"]["searched"], 2);
}

#[tokio::test]
async fn a_foreign_commit_is_refused_by_the_publish_fence() {
    let services = services().await;
    let lake = Lake::of(services.lakefs());
    let repo = format!("kx-foreign-{}", std::process::id());
    let input = lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    let body = format!(
        "echo up > \"$T/started\"\nwhile [ ! -f \"$T/go\" ]; do sleep 0.05; done\n{PER_ATTEMPT}"
    );
    let (api, pod) = task_pod(
        "kx.foreign",
        "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}",
        &body,
        &[],
    )
    .await;
    let id = start(&api, "kx.foreign", "foreign", &repo, "main", &input).await;
    wait_path(&pod.path("started"), &pod).await;
    let foreign = commit_files(&lake, &repo, "main", &[("x.txt", "x")], "someone else").await;
    std::fs::write(pod.path("go"), "").unwrap();
    let wf = finished(&api, &id).await;
    assert_eq!(
        wf["tasks"][0]["reasonForIncompletion"],
        json!(format!("main advanced from {input} to {foreign}"))
    );
    let view = explain_json(services, &id, 0);
    let a = &attempts(&view)[0];
    assert_eq!(a["verdict"]["kind"], "refused_by_fence");
    assert_eq!(a["verdict"]["fence"], "publish");
    assert_eq!(a["verdict"]["head"], json!(foreign));
    assert_eq!(a["staging"], json!([]), "refused before staging");
    assert_eq!(a["search"]["confirm"], Value::Null);
    assert_eq!(a["search"]["searched"], 1, "the foreign commit");
    let text = stdout(&kubectl_perago(services, &["explain", &id]));
    eprintln!("kubectl perago explain:\n{text}");
    assert!(
        text.contains(&format!(
            "refused by the publish fence: main had moved from the input ref {} to {}",
            short(&input),
            short(&foreign)
        )),
        "{text}"
    );
    assert!(text.contains("    confirm  none on main"), "{text}");
}

/// A pre-merge action that is slow for first attempts and then refuses them, so their merge
/// call times out and the merge never lands; a retry's merge is not slowed.
const SLOW_FIRST_MERGE: &str = r#"name: slow-first-merge
on:
  pre-merge:
    branches: [main]
hooks:
  - id: slow
    type: lua
    properties:
      script: |
        if action.commit.metadata["perago.retry_count"] == "0" then
          local x = 0
          for i = 1, 60000000 do x = x + i end
          error("the first merge is refused after a while")
        end
"#;

fn budget(retries: u32) -> String {
    format!(
        "{{retry: {{count: {retries}, delaySeconds: 0}}, timeout: {{responseSeconds: 30}}, publishBudget: {{observedMergeP99Seconds: 0, safetyMarginSeconds: 0, lakefsMergeTimeoutSeconds: 1, conductorCompletionTimeoutSeconds: 5, workerShutdownGraceSeconds: 5, heartbeatIntervalSeconds: 5}}}}"
    )
}

#[tokio::test]
async fn a_merge_timeout_is_uncertain_until_a_retry_publishes() {
    let services = services().await;
    let lake = Lake::of(services.lakefs());
    let files = [
        ("keep.txt", "keep"),
        ("_lakefs_actions/slow.yaml", SLOW_FIRST_MERGE),
    ];
    let (repo, last_repo) = (
        format!("kx-timeout-{}", std::process::id()),
        format!("kx-timeout-last-{}", std::process::id()),
    );
    let input = lake.seed(&repo, &files).await.unwrap();
    let last_input = lake.seed(&last_repo, &files).await.unwrap();
    let (api, _pod) = task_pod("kx.timeout", &budget(1), PER_ATTEMPT, &[]).await;
    let (_, _last_pod) = task_pod("kx.timeout-last", &budget(0), PER_ATTEMPT, &[]).await;
    let id = start(&api, "kx.timeout", "retried", &repo, "main", &input).await;
    let last = start(
        &api,
        "kx.timeout-last",
        "last",
        &last_repo,
        "main",
        &last_input,
    )
    .await;

    // With a retry: the retry's publish fence settled it.
    let wf = finished(&api, &id).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let published = head(&lake, &repo, "main").await;
    let view = explain_json(services, &id, 0);
    let list = attempts(&view);
    assert_eq!(list.len(), 2, "{view:#}");
    let a0 = &list[0];
    let reason = a0["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("lakeFS merge on {repo}@main failed: ")),
        "{reason}"
    );
    assert_eq!(a0["verdict"]["kind"], "outcome_uncertain", "{a0:#}");
    assert_eq!(a0["verdict"]["needs_attention"], false);
    assert_eq!(a0["search"]["confirm"], Value::Null);
    let summary = a0["verdict"]["summary"].as_str().unwrap();
    for part in [
        "the merge may still land".to_owned(),
        "its staging branch is gone".to_owned(),
        format!(
            "What settles it: the next attempt's publish fence: retry 1 published {} on {} superseding nothing",
            short(&published),
            short(&input)
        ),
    ] {
        assert!(summary.contains(&part), "{part:?} in {summary}");
    }
    assert_eq!(list[1]["verdict"]["kind"], "published_and_reported");
    assert_eq!(list[1]["verdict"]["commit"], json!(published));

    // Without one, nothing settles it: flagged, status 1.
    let wf = finished(&api, &last).await;
    assert_eq!(wf["status"], "FAILED", "{wf}");
    let view = explain_json(services, &last, 1);
    let a = &attempts(&view)[0];
    assert_eq!(a["verdict"]["kind"], "outcome_uncertain");
    assert_eq!(a["verdict"]["needs_attention"], true);
    assert!(
        a["verdict"]["summary"]
            .as_str()
            .unwrap()
            .contains("no later attempt will run its publish fence"),
        "{a:#}"
    );
    assert_eq!(head(&lake, &last_repo, "main").await, last_input);
    let table = kubectl_perago(services, &["explain", &last]);
    assert_eq!(table.status.code(), Some(1));
    assert!(
        stdout(&table).contains("\nneeds attention: "),
        "{}",
        stdout(&table)
    );
}

#[tokio::test]
async fn a_terminal_pre_guardrail_failure_a_no_op_and_a_hostile_reason() {
    let services = services().await;
    let lake = Lake::of(services.lakefs());
    let repo = format!("kx-guard-{}", std::process::id());
    let bare = lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    let (api, _pod) = task_pod_with(
        "kx.guard",
        "{prefix: /, pre: [{kind: requireFile, path: needed.txt}]}",
        "{retry: {count: 2, delaySeconds: 0}, timeout: {responseSeconds: 30}}",
        r#"printf '{}' > "$PERAGO_RESULT""#,
        &[],
    )
    .await;

    // The input lacks the file the task needs: terminal, never retried.
    let id = start(&api, "kx.guard", "terminal", &repo, "main", &bare).await;
    assert_eq!(finished(&api, &id).await["status"], "FAILED");
    let view = explain_json(services, &id, 0);
    let list = attempts(&view);
    assert_eq!(list.len(), 1, "not retried: {view:#}");
    assert_eq!(list[0]["status"], "FAILED_WITH_TERMINAL_ERROR");
    assert_eq!(list[0]["verdict"]["kind"], "not_published");
    assert_eq!(
        list[0]["verdict"]["summary"],
        "not published: pre guardrail require_file('needed.txt') did not find a file (terminal: the body did not run and Conductor does not retry it)"
    );

    // With the file there, the body changes nothing: completed on the input ref.
    let with = commit_files(&lake, &repo, "main", &[("needed.txt", "n")], "add needed").await;
    let id = start(&api, "kx.guard", "noop", &repo, "main", &with).await;
    assert_eq!(finished(&api, &id).await["status"], "COMPLETED");
    let view = explain_json(services, &id, 0);
    let a = &attempts(&view)[0];
    assert_eq!(a["verdict"]["kind"], "completed_without_publishing");
    assert_eq!(a["output_ref"], json!(with));
    assert_eq!(
        head(&lake, &repo, "main").await,
        with,
        "nothing was written"
    );

    // A failure reported with a hostile reason and worker id, for a repository lakeFS lacks.
    let (api, _) = register(
        "kx.hostile",
        "{prefix: /}",
        "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}",
    )
    .await;
    let missing = format!("kx-missing-{}", std::process::id());
    let id = start(&api, "kx.hostile", "hostile", &missing, "main", &bare).await;
    let task_id = api.workflow(&id).await["tasks"][0]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let reason = format!("main advanced from {bare} to \u{1b}[31mfake\nhead\r\u{7}");
    api.call(
        reqwest::Method::POST,
        "/tasks",
        Some(
            &json!({"workflowInstanceId": id, "taskId": task_id, "status": "FAILED",
                     "workerId": "w\u{1b}[2J\nx", "reasonForIncompletion": reason}),
        ),
    )
    .await;
    assert_eq!(finished(&api, &id).await["status"], "FAILED");
    let view = explain_json(services, &id, 0);
    let a = &attempts(&view)[0];
    assert_eq!(a["reason"], json!(reason), "JSON keeps the text as it is");
    assert_eq!(a["verdict"]["kind"], "refused_by_fence");
    assert!(
        a["note"].as_str().unwrap().contains("HTTP 404"),
        "lakeFS lacks the repository: {a:#}"
    );
    let out = kubectl_perago(services, &["explain", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        !text.contains(['\u{1b}', '\r', '\u{7}']),
        "no control characters: {text:?}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(&task_id) && l.contains("FAILED") && l.contains("w [2J x")),
        "the attempt's row stays one line: {text}"
    );
    assert!(
        text.contains(&format!("    lakeFS   lakeFS list branches on {missing}@")),
        "{text}"
    );
}
