//! `kubectl perago` against the real Conductor and lakeFS, on histories and staging branches
//! that real attempts of local pods made: a publication, a crash after merge and the retry
//! that superseded it, foreign commits (one with hostile metadata), a crash after stage, and
//! an attempt paused before its merge.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use perago_e2e::lake::Lake;
use serde_json::{Value, json};
use support::*;

#[tokio::test]
async fn history_classifies_publications_supersessions_and_foreign_commits() {
    let services = services().await;
    let lake = Lake::of(services.lakefs());
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
    // The sidecar names itself and its contract; a sidecar outside a pod has no image id.
    let lineage = &commits[0]["lineage"];
    assert_eq!(
        lineage["sidecar_version"],
        env!("CARGO_PKG_VERSION"),
        "{view}"
    );
    assert_eq!(lineage["contract_hash"].as_str().map(str::len), Some(32));
    assert_eq!(lineage.get("image_id"), None);
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
    let lake = Lake::of(services.lakefs());
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
    // lakeFS refusing the credentials: one line naming the call and the status, nothing deleted.
    let refused = kubectl_perago_with(
        services,
        &["gc", "--repository", &repo],
        &[("LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", "not-the-secret")],
    );
    assert_one_line_error(&refused, "HTTP 401");
    assert!(stderr(&refused).contains("lakeFS"), "{}", stderr(&refused));
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

const ACTION: &str = "_lakefs_actions/perago-hard-fence.yaml";

/// `install-fence` on an unprotected branch: a dry run changes nothing; the install commits the
/// action for that branch only; `history` then says installed, a second run commits nothing,
/// and a merge onto a head that moved after the publish fence is refused by lakeFS (and
/// `explain` names the hard fence and the head it saw). A branch with uncommitted changes is
/// refused, so they are not committed along.
#[tokio::test]
async fn install_fence_guards_a_branch_once_and_lakefs_then_refuses_a_merge_onto_a_moved_head() {
    let services = services().await;
    let lake = Lake::of(services.lakefs());
    let repo = format!("kp-fence-{}", std::process::id());
    let input = lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    lake.post(
        &format!("/repositories/{repo}/branches"),
        json!({"name": "prod", "source": input}),
    )
    .await
    .unwrap();
    let install = |extra: &[&str]| {
        let mut args = vec!["install-fence", "--repository", &repo, "--branch", "prod"];
        args.extend_from_slice(extra);
        kubectl_perago(services, &args)
    };

    let dry = install(&["--dry-run", "-o", "json"]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    let view = json_of(&dry);
    assert_eq!(view["outcome"], "would_install");
    assert_eq!(view["pre_merge_branches"], json!(["prod"]));
    assert!(
        view["action_text"]
            .as_str()
            .unwrap()
            .contains("      - 'prod'\n"),
        "{view}"
    );
    assert_eq!(
        head(&lake, &repo, "prod").await,
        input,
        "a dry run commits nothing"
    );

    let out = install(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let installed = head(&lake, &repo, "prod").await;
    assert_ne!(installed, input);
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!(
            "{repo}@prod: installed the hard fence\n  commit   {} \"Install the Perago hard fence\", on top of {}",
            short(&installed),
            short(&input)
        )),
        "{text}"
    );
    let action = lake.object(&repo, &installed, ACTION).await.unwrap();
    assert!(
        action.contains("    branches:\n      - 'prod'\nhooks:"),
        "{action}"
    );
    assert_eq!(
        head(&lake, &repo, "main").await,
        input,
        "main is not touched"
    );

    let history = kubectl_perago(
        services,
        &[
            "history",
            "--repository",
            &repo,
            "--branch",
            "prod",
            "-o",
            "json",
        ],
    );
    assert_eq!(history.status.code(), Some(0), "{}", stderr(&history));
    let view = json_of(&history);
    assert_eq!(
        view["hard_fence"],
        json!({"installed": true, "action": ACTION})
    );
    assert_eq!(
        view["commits"][0]["message"],
        "Install the Perago hard fence"
    );
    let main = kubectl_perago(
        services,
        &[
            "history",
            "--repository",
            &repo,
            "--branch",
            "main",
            "-o",
            "json",
        ],
    );
    assert_eq!(json_of(&main)["hard_fence"]["installed"], json!(false));

    let again = install(&["-o", "json"]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(json_of(&again)["outcome"], "already_installed");
    assert_eq!(json_of(&again)["action"], ACTION);
    assert_eq!(
        head(&lake, &repo, "prod").await,
        installed,
        "no second commit"
    );
    assert!(
        stdout(&install(&[])).contains("the hard fence is already installed"),
        "the table says so too"
    );

    // A publication paused between the publish fence and the merge; a writer moves the head.
    let (api, pod) = task_pod(
        "kp.fence",
        "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}",
        PER_ATTEMPT,
        &[("PERAGO_FAULT", "pause-before-merge")],
    )
    .await;
    let id = start(&api, "kp.fence", "fenced", &repo, "prod", &installed).await;
    let paused = pod.path("work/paused-before-merge");
    wait_path(&paused, &pod).await;
    let moved = commit_files(&lake, &repo, "prod", &[("x.txt", "x")], "concurrent writer").await;
    std::fs::remove_file(&paused).unwrap();
    let wf = finished(&api, &id).await;
    let reason = wf["tasks"][0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("lakeFS merge on {repo}@prod failed: HTTP 412"))
            && reason.contains("perago hard fence"),
        "{reason}"
    );
    assert_eq!(
        head(&lake, &repo, "prod").await,
        moved,
        "the merge did not land"
    );
    let explained = kubectl_perago(services, &["explain", &id, "-o", "json"]);
    assert_eq!(explained.status.code(), Some(0), "{}", stderr(&explained));
    let verdict = &json_of(&explained)["steps"][0]["attempts"][0]["verdict"];
    assert_eq!(verdict["kind"], "refused_by_fence");
    assert_eq!(verdict["fence"], "hard");
    assert_eq!(verdict["head"], json!(moved), "{verdict}");

    // Uncommitted changes on the branch are not committed along.
    upload(&lake, &repo, "main", "staged.txt", "not mine")
        .await
        .unwrap();
    let dirty = kubectl_perago(
        services,
        &[
            "install-fence",
            "--repository",
            &repo,
            "--branch",
            "main",
            "-o",
            "json",
        ],
    );
    assert_eq!(dirty.status.code(), Some(1), "{}", stderr(&dirty));
    let view = json_of(&dirty);
    assert_eq!(view["outcome"], "refused");
    assert!(
        view["why"]
            .as_str()
            .unwrap()
            .starts_with("main has uncommitted changes (1)"),
        "{view}"
    );
    assert_eq!(head(&lake, &repo, "main").await, input);

    let missing = kubectl_perago(
        services,
        &["install-fence", "--repository", &repo, "--branch", "nope"],
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).starts_with(&format!(
            "error: lakeFS get branch on {repo}@nope failed: HTTP 404"
        )),
        "{}",
        stderr(&missing)
    );
}

/// A protected branch takes no direct commit: `install-fence` changes nothing, says why and
/// prints the steps through a branch; following them installs the fence.
#[tokio::test]
async fn install_fence_on_a_protected_branch_prints_the_manual_steps_and_they_work() {
    let services = services().await;
    let lake = Lake::of(services.lakefs());
    let repo = format!("kp-protected-{}", std::process::id());
    let input = lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    let endpoint = &services.lakefs().endpoint;
    lake.send(
        reqwest::Client::new()
            .put(format!(
                "{endpoint}/api/v1/repositories/{repo}/settings/branch_protection"
            ))
            .json(&json!([{"pattern": "main"}])),
    )
    .await
    .unwrap();
    // lakeFS may take a moment to enforce the rule. The probe leaves nothing behind, whatever
    // happens: a probe upload that lakeFS took could not always be deleted again (the
    // deletion's path may see the rule first), and main then held an uncommitted change.
    let started = Instant::now();
    loop {
        let refused = match lake
            .post(
                &format!("/repositories/{repo}/branches/main/objects/delete"),
                json!({"paths": ["no-such-probe.txt"]}),
            )
            .await
        {
            Err(e) => e.to_string().contains("protected"),
            Ok(answer) => answer.to_string().contains("protected"),
        };
        if refused {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never enforced"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // lakeFS caches the rules for a while per code path: let every cache see the new rule, and
    // make sure writes are still refused.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        upload(&lake, &repo, "main", "probe.txt", "p")
            .await
            .is_err()
    );

    let out = kubectl_perago(
        services,
        &["install-fence", "--repository", &repo, "--branch", "main"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!(
            "{repo}@main: NOT installed: main is protected (lakeFS: cannot write to protected branch)"
        )),
        "{text}"
    );
    for step in [
        format!(
            "  2. lakectl branch create lakefs://{repo}/perago-install-hard-fence --source lakefs://{repo}/main\n"
        ),
        format!(
            "  5. lakectl merge lakefs://{repo}/perago-install-hard-fence lakefs://{repo}/main\n"
        ),
        "--- perago-hard-fence.yaml ---\n# Perago hard fence".to_owned(),
    ] {
        assert!(text.contains(&step), "{step:?} in {text}");
    }
    assert_eq!(head(&lake, &repo, "main").await, input, "nothing committed");
    let diff = lake
        .get(&format!("/repositories/{repo}/branches/main/diff"))
        .await
        .unwrap();
    assert_eq!(diff["results"], json!([]), "nothing left staged");

    // The steps, as the API calls lakectl makes.
    let view = json_of(&kubectl_perago(
        services,
        &[
            "install-fence",
            "--repository",
            &repo,
            "--branch",
            "main",
            "-o",
            "json",
        ],
    ));
    assert_eq!(view["outcome"], "refused");
    assert_eq!(view["steps"].as_array().unwrap().len(), 7);
    let via = "perago-install-hard-fence";
    lake.post(
        &format!("/repositories/{repo}/branches"),
        json!({"name": via, "source": "main"}),
    )
    .await
    .unwrap();
    commit_files(
        &lake,
        &repo,
        via,
        &[(ACTION, view["action_text"].as_str().unwrap())],
        "Install the Perago hard fence",
    )
    .await;
    lake.post(
        &format!("/repositories/{repo}/refs/{via}/merge/main"),
        json!({}),
    )
    .await
    .unwrap();
    let history = kubectl_perago(
        services,
        &[
            "history",
            "--repository",
            &repo,
            "--branch",
            "main",
            "--limit",
            "1",
            "-o",
            "json",
        ],
    );
    assert_eq!(
        json_of(&history)["hard_fence"],
        json!({"installed": true, "action": ACTION})
    );
    let again = kubectl_perago(
        services,
        &[
            "install-fence",
            "--repository",
            &repo,
            "--branch",
            "main",
            "-o",
            "json",
        ],
    );
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(json_of(&again)["outcome"], "already_installed");
}

/// What lakeFS (the harness's 1.84) does with an action's `on.pre-merge.branches` entries, by
/// merging into branches named to tell the readings apart: the entries are `path.Match`
/// patterns (globs, but without `{a,b}`, with `[^…]` and not `[!…]` negating), and a malformed
/// entry makes lakeFS refuse the merge outright. `history`'s reading agrees on every case.
#[tokio::test]
async fn lakefs_reads_pre_merge_branches_as_path_match_patterns_and_history_agrees() {
    #[derive(Debug, PartialEq)]
    enum Seen {
        HookRan,
        Merged,
        Refused,
    }
    let services = services().await;
    let lake = Lake::of(services.lakefs());
    let repo = format!("kp-patterns-{}", std::process::id());
    lake.seed(&repo, &[("seed.txt", "seed")]).await.unwrap();
    let cases = [
        ("main", "main", Seen::HookRan),
        ("run-*", "run-001", Seen::HookRan),
        ("run-*", "runner", Seen::Merged),
        ("prod", "production", Seen::Merged),
        ("de?1", "dev1", Seen::HookRan),
        ("a[b-d]x", "acx", Seen::HookRan),
        ("{dev2,rel}", "dev2", Seen::Merged),
        ("[!d]ev3", "dev3", Seen::HookRan),
        ("[!x]ev4", "dev4", Seen::Merged),
        ("[^x]ev5", "dev5", Seen::HookRan),
        ("d\\ev6", "dev6", Seen::HookRan),
        ("**", "dev7", Seen::HookRan),
        ("[dev8", "dev8", Seen::Refused),
    ];
    for (i, (pattern, target, expected)) in cases.into_iter().enumerate() {
        let action = format!(
            "name: probe\non:\n  pre-merge:\n    branches:\n      - '{}'\nhooks:\n  - id: probe\n    type: lua\n    properties:\n      script: |\n        -- reads perago.expected_head, as the hard fence does\n        error(\"probe hook ran\")\n",
            pattern.replace('\'', "''")
        );
        if target != "main" {
            lake.post(
                &format!("/repositories/{repo}/branches"),
                json!({"name": target, "source": "main"}),
            )
            .await
            .unwrap();
        }
        let source = format!("probe-{i}");
        lake.post(
            &format!("/repositories/{repo}/branches"),
            json!({"name": source, "source": target}),
        )
        .await
        .unwrap();
        commit_files(
            &lake,
            &repo,
            &source,
            &[
                ("_lakefs_actions/probe.yaml", &action),
                ("data.txt", &source),
            ],
            "probe",
        )
        .await;
        let seen = match lake
            .post(
                &format!("/repositories/{repo}/refs/{source}/merge/{target}"),
                json!({}),
            )
            .await
        {
            Ok(_) => Seen::Merged,
            Err(e) if e.to_string().contains("probe hook ran") => Seen::HookRan,
            Err(e) if e.to_string().contains("syntax error in pattern") => Seen::Refused,
            Err(e) => panic!("{pattern} into {target}: {e}"),
        };
        assert_eq!(seen, expected, "lakeFS on {pattern:?} for {target}");
        assert_eq!(
            perago_workspace::hard_fence::fences_branch(&action, target),
            seen == Seen::HookRan,
            "history's reading of {pattern:?} for {target}"
        );
    }

    // lakeFS runs an action file whatever its name ends in; so does `history` take it.
    let action = "name: probe\non:\n  pre-merge:\n    branches: ['named']\nhooks:\n  - id: probe\n    type: lua\n    properties:\n      script: |\n        -- perago.expected_head\n        error(\"probe hook ran\")\n";
    lake.post(
        &format!("/repositories/{repo}/branches"),
        json!({"name": "named", "source": "main"}),
    )
    .await
    .unwrap();
    commit_files(
        &lake,
        &repo,
        "named",
        &[("_lakefs_actions/fence", action)],
        "no extension",
    )
    .await;
    let history = kubectl_perago(
        services,
        &[
            "history",
            "--repository",
            &repo,
            "--branch",
            "named",
            "--limit",
            "1",
            "-o",
            "json",
        ],
    );
    assert_eq!(
        json_of(&history)["hard_fence"],
        json!({"installed": true, "action": "_lakefs_actions/fence"})
    );
    lake.post(
        &format!("/repositories/{repo}/branches"),
        json!({"name": "named-source", "source": "named"}),
    )
    .await
    .unwrap();
    commit_files(&lake, &repo, "named-source", &[("data.txt", "d")], "change").await;
    let merged = lake
        .post(
            &format!("/repositories/{repo}/refs/named-source/merge/named"),
            json!({}),
        )
        .await;
    assert!(
        merged
            .as_ref()
            .is_err_and(|e| e.to_string().contains("probe hook ran")),
        "{merged:?}"
    );
}
