//! Operating tasks on the node: from a task's name (`kubectl perago status`, `suspend`,
//! `resume`, `--task`), what `status` shows while attempts run, a suspend that lets every
//! running attempt finish and report with no poll after it, a resume that drains the queue,
//! the commands the chart's NOTES print, Flux's kstatus on task states, and the chart's
//! staging-gc CronJob.

use std::process::Output;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::*;

/// A step that takes `params.n` seconds (8 without it): long enough for the pods to be seen
/// busy and then suspended.
const SLOW_BODY: &str = r#"
set -eu
echo "body: working"
seconds=$(sed -n 's/.*"n": *\([0-9][0-9]*\).*/\1/p' "$PERAGO_PARAMS")
sleep "${seconds:-8}"
printf '{"files": 0}' > "$PERAGO_RESULT"
echo "body: done"
"#;

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Conductor's status of the step of each workflow.
async fn step_statuses(conductor: &ConductorApi, workflows: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for id in workflows {
        let wf = conductor.workflow(id).await;
        out.push(
            wf["tasks"][0]["status"]
                .as_str()
                .unwrap_or("NONE")
                .to_owned(),
        );
    }
    out
}

/// Two pods of two slots and six steps: `status` shows both pods busy and the queue; a
/// suspend lets the four running attempts finish and report, and no pod polls after it;
/// `kubectl get` and `status` show it suspended; a resume drains the two queued steps.
#[tokio::test]
async fn status_suspend_and_resume_operate_a_task_from_its_name() {
    let Some((_turn, services, cluster)) =
        cluster("status_suspend_and_resume_operate_a_task_from_its_name").await
    else {
        return;
    };
    let (namespace, name) = ("pods-operate", "steady");
    let task_type = format!("{namespace}.{name}");
    cluster.task_namespace(namespace).unwrap();
    let spec = json!({"workspace": {"readOnly": true}, "executor": {"replicas": 2, "slots": 2}});
    cluster
        .apply(&workspace_task_with(namespace, name, SLOW_BODY, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (_lake, repository, input_ref) = seeded(services, "pods-operate").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    // The queue hands out the first four first: those run for 20 s, enough for the status
    // reads and the suspend to reach the pods while they work on a busy machine; the two
    // left queued take a second once resumed.
    let mut workflows = Vec::new();
    for i in 0..6 {
        let case = format!("operate-{i}");
        let seconds = if i < 4 { 20 } else { 1 };
        workflows.push(
            start_step(
                &conductor,
                namespace,
                name,
                &case,
                &repository,
                &input_ref,
                seconds,
            )
            .await,
        );
    }

    // While four attempts run: both pods busy, two queued, the attempts listed.
    let started = Instant::now();
    let status = loop {
        let out = plugin(cluster, &["status", name, "-n", namespace, "-o", "json"]);
        let view = json_of(&out);
        let busy: i64 = view["pods"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["busy"].as_i64())
            .sum();
        if busy == 4 && view["queue"]["queued"] == json!(2) {
            assert_eq!(out.status.code(), Some(0), "{view}");
            break view;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "status never showed 4 busy slots and 2 queued: {view}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(status["pods"].as_array().unwrap().len(), 2, "{status}");
    assert_eq!(status["task"]["taskType"], json!(task_type), "{status}");
    assert_eq!(status["queue"]["name"], json!(task_type), "{status}");
    assert!(status["unread"].as_array().unwrap().is_empty(), "{status}");
    let table = plugin(cluster, &["status", name, "-n", namespace]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    eprintln!("kubectl perago status {name} -n {namespace}:\n{table}");
    for expected in [
        "Conditions:",
        "Pods:",
        "2/2",
        &format!("Queue {task_type}: 2 queued"),
    ] {
        assert!(table.contains(expected), "{expected:?} not in\n{table}");
    }

    // Suspend: the four running attempts finish and are reported by their pods, and nothing
    // polls once the pods are gone.
    let suspended = plugin(
        cluster,
        &[
            "suspend",
            name,
            "-n",
            namespace,
            "--wait",
            "--timeout",
            "2m",
        ],
    );
    let said = String::from_utf8_lossy(&suspended.stdout).into_owned();
    assert_eq!(
        suspended.status.code(),
        Some(0),
        "{said}{}",
        String::from_utf8_lossy(&suspended.stderr)
    );
    assert!(
        said.contains(&format!("peragotask/{name} suspended")),
        "{said}"
    );
    let gone = now_ms();
    let statuses = step_statuses(&conductor, &workflows).await;
    let completed = statuses.iter().filter(|s| *s == "COMPLETED").count();
    let scheduled = statuses.iter().filter(|s| *s == "SCHEDULED").count();
    assert_eq!((completed, scheduled), (4, 2), "{statuses:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let polls = conductor
        .call(
            reqwest::Method::GET,
            &format!("/tasks/queue/polldata?taskType={task_type}"),
            None,
        )
        .await;
    for poll in polls.as_array().unwrap() {
        assert!(
            poll["lastPollTime"].as_i64().unwrap() <= gone,
            "a poll after the pods were gone: {poll}"
        );
    }
    assert_eq!(step_statuses(&conductor, &workflows).await, statuses);
    let got = cluster
        .kubectl(&["get", "ptask", name, "-n", namespace, "-o", "wide"])
        .unwrap();
    assert!(
        got.lines()
            .nth(1)
            .is_some_and(|l| l.contains("true") && l.contains("Suspended")),
        "{got}"
    );
    let view = json_of(&plugin(
        cluster,
        &["status", name, "-n", namespace, "-o", "json"],
    ));
    let ready = view["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["reason"], "Suspended", "{view}");
    assert_eq!(
        (view["task"]["suspended"].clone(), view["pods"].clone()),
        (json!(true), json!([]))
    );

    // Resume: the queue drains.
    let resumed = plugin(
        cluster,
        &["resume", name, "-n", namespace, "--wait", "--timeout", "2m"],
    );
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    for id in &workflows {
        let wf = conductor.finished(id).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf}");
    }
    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.name={name}"),
        ])
        .unwrap();
    assert!(
        events.contains("Suspended") && events.contains("Resumed"),
        "{events}"
    );
}

/// What `status` says when a part cannot be read: a task that does not exist is one line;
/// with Conductor unreachable, the cluster's side is still shown and the Conductor part is
/// named under "Not read" (exit 1).
#[tokio::test]
async fn status_says_what_it_could_not_read() {
    let Some((_turn, _services, cluster)) = cluster("status_says_what_it_could_not_read").await
    else {
        return;
    };
    let (namespace, name) = ("pods-operate-unread", "lonely");
    cluster.task_namespace(namespace).unwrap();
    let spec = json!({"workspace": {"readOnly": true}});
    cluster
        .apply(&workspace_task_with(namespace, name, SLOW_BODY, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();

    let missing = plugin(cluster, &["status", "nope", "-n", namespace]);
    let stderr = String::from_utf8_lossy(&missing.stderr).into_owned();
    assert_eq!(missing.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("PeragoTask {namespace}/nope not found")),
        "{stderr}"
    );
    // The hint it gives runs.
    let hint = stderr
        .split_once("(kubectl ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(hint, _)| hint)
        .unwrap_or_else(|| panic!("no kubectl hint in {stderr}"));
    let listed = cluster
        .kubectl(&hint.split_whitespace().collect::<Vec<_>>())
        .unwrap();
    assert!(listed.contains(name), "{hint}: {listed}");

    // An account RBAC lets do nothing here: the message names the permission to ask for.
    let dir = tempfile::tempdir().unwrap();
    let nobody = account_kubeconfig(cluster, namespace, "nobody", &json!([]), dir.path());
    let out = plugin(
        cluster,
        &["status", name, "-n", namespace, "--kubeconfig", &nobody],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("forbidden") && stderr.contains("RBAC: ask for `get` on `peragotasks`"),
        "{stderr}"
    );

    let out = plugin(
        cluster,
        &[
            "status",
            name,
            "-n",
            namespace,
            "--conductor-url",
            "http://127.0.0.1:9/api",
            "--request-timeout",
            "5s",
        ],
    );
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(
        table.contains("Pods:") && table.contains("Running"),
        "{table}"
    );
    let unread = table.split("Not read:").nth(1).unwrap_or_default();
    assert!(
        unread.contains("queue:") && unread.contains("http://127.0.0.1:9/api"),
        "{table}"
    );
}

/// Every command the chart's NOTES print after `helm install` runs as printed, with the
/// placeholders filled: the operator's rollout, declaring a task, listing it, its status.
#[tokio::test]
async fn the_commands_the_chart_notes_print_run() {
    let Some((_turn, _services, cluster)) = cluster("the_commands_the_chart_notes_print_run").await
    else {
        return;
    };
    let (namespace, name) = ("pods-notes", "noted");
    cluster.task_namespace(namespace).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("my-task.yaml");
    let spec = json!({"workspace": {"readOnly": true}});
    std::fs::write(
        &manifest,
        workspace_task_with(namespace, name, SLOW_BODY, &spec),
    )
    .unwrap();
    let notes = cluster
        .helm(&[
            "get",
            "notes",
            perago_e2e::cluster::RELEASE,
            "-n",
            perago_e2e::cluster::OPERATOR_NAMESPACE,
        ])
        .unwrap();
    let mut ran = Vec::new();
    for line in notes
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kubectl "))
    {
        let words: Vec<String> = line
            .split_whitespace()
            .skip(1)
            .map(|w| match w {
                "<task>" => name.to_owned(),
                "<namespace>" => namespace.to_owned(),
                "my-task.yaml" => manifest.display().to_string(),
                w => w.to_owned(),
            })
            .collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        if words.first() == Some(&"perago") {
            // The task's status has a Conductor to read once its pods exist.
            cluster.wait_ready(namespace, name).unwrap();
            let out = plugin(cluster, &words[1..]);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{line}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            cluster
                .kubectl(&words)
                .unwrap_or_else(|e| panic!("{line}: {e:#}"));
        }
        ran.push(line.to_owned());
    }
    assert!(
        ran.iter().any(|l| l.starts_with("kubectl perago status")) && ran.len() >= 4,
        "the NOTES' commands: {ran:?}\n{notes}"
    );
}

/// Flux's own status library (kstatus, from sigs.k8s.io/cli-utils) reads a Ready PeragoTask as
/// Current, one whose pods are still coming as InProgress and an invalid one as Failed.
#[tokio::test]
async fn flux_kstatus_reads_ready_rolling_out_invalid_and_suspended_tasks() {
    let Some((_turn, services, cluster)) =
        cluster("flux_kstatus_reads_ready_rolling_out_invalid_and_suspended_tasks").await
    else {
        return;
    };
    let namespace = "pods-kstatus";
    cluster.task_namespace(namespace).unwrap();
    let kstatus = perago_e2e::process::obtain("kstatus").unwrap();
    let verdict = |name: &str| {
        let object = cluster
            .kubectl(&["get", "-n", namespace, "peragotask", name, "-o", "json"])
            .unwrap();
        let mut child = std::process::Command::new(&kstatus)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), object.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "kstatus failed on {name}");
        String::from_utf8(out.stdout).unwrap()
    };
    let cases = [
        ("ready", json!({}), "Current"),
        (
            "rolling-out",
            json!({"executor": {"body": {"image": "localhost/perago/absent:e2e"}}}),
            "InProgress",
        ),
        (
            "invalid",
            json!({"workspace": {"pre": [{"kind": "requireFile", "path": "../outside"}]}}),
            "Failed",
        ),
        // A desired state reached (ADR 0035).
        ("suspended", json!({"suspend": true}), "Current"),
    ];
    // The admission webhook refuses the invalid one: it plays an object stored before the
    // webhook existed (the other tasks this binary applies meanwhile are valid).
    let manifests: Vec<String> = cases
        .iter()
        .map(|(name, spec, _)| workspace_task_with(namespace, name, PUBLISH_BODY, spec))
        .collect();
    cluster.apply_without_webhook(&manifests).unwrap();
    let client = services.kube().client().await.unwrap();
    ready_condition(&client, namespace, "ready", &["Available"]).await;
    ready_condition(
        &client,
        namespace,
        "rolling-out",
        &["ErrImagePull", "ImagePullBackOff"],
    )
    .await;
    ready_condition(&client, namespace, "invalid", &["InvalidSpec"]).await;
    ready_condition(&client, namespace, "suspended", &["Suspended"]).await;
    for (name, _, expected) in &cases {
        let line = verdict(name);
        assert!(
            line.starts_with(&format!("{expected} ")),
            "{name}: kstatus says {line}"
        );
        eprintln!("kstatus {name}: {}", line.trim());
    }
}

/// The chart's staging-branch CronJob, run once on the node: `kubectl perago gc` in the
/// operator's image deletes the staging branch of an attempt whose task is terminal and keeps
/// the one whose task is still scheduled.
#[tokio::test]
async fn the_staging_gc_cronjob_removes_dead_attempts_branches() {
    let Some((_turn, services, cluster)) =
        cluster("the_staging_gc_cronjob_removes_dead_attempts_branches").await
    else {
        return;
    };
    let (lake, repository, input_ref) = seeded(services, "pods-staging-gc").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let task = "pods.staging-gc";
    conductor
        .call(
            reqwest::Method::POST,
            "/metadata/taskdefs",
            Some(&json!([{"name": task, "ownerEmail": "e2e@example.com",
                           "retryCount": 0, "responseTimeoutSeconds": 60}])),
        )
        .await;
    // Two workflows nobody works on: one terminated (its task CANCELED), one left scheduled.
    let mut branches = Vec::new();
    for case in ["dead", "scheduled"] {
        let id = conductor.start(task, case, json!({})).await;
        if case == "dead" {
            conductor
                .call(
                    reqwest::Method::DELETE,
                    &format!("/workflow/{id}?reason=test"),
                    None,
                )
                .await;
        }
        let wf = conductor.workflow(&id).await;
        let task_id = wf["tasks"][0]["taskId"].as_str().unwrap().to_owned();
        let branch = format!(
            "perago-staging-{id}-step-seq-1-iteration-0-task-id-{task_id}-retry-0-exec-e2e"
        );
        lake.post(
            &format!("/repositories/{repository}/branches"),
            json!({"name": branch, "source": input_ref}),
        )
        .await
        .unwrap();
        branches.push((id, branch));
    }
    let log = cluster
        .run_staging_gc("staging-gc-now", &[&repository])
        .unwrap();
    eprintln!("staging-gc job:\n{log}");
    let left: Vec<String> = lake
        .get(&format!(
            "/repositories/{repository}/branches?prefix=perago-staging-"
        ))
        .await
        .unwrap()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, [branches[1].1.clone()], "{log}");
    assert!(log.contains("DELETED") && log.contains("CANCELED"), "{log}");
    assert!(log.contains("KEPT") && log.contains("SCHEDULED"), "{log}");
    conductor
        .call(
            reqwest::Method::DELETE,
            &format!("/workflow/{}?reason=test", branches[1].0),
            None,
        )
        .await;
}

/// `kubectl perago --task`: the plugin finds Conductor and lakeFS the way the task's pods do,
/// through the kubeconfig, with the credentials from the Secret in the task's namespace; a
/// flag still wins, and a task that does not exist is one line naming it.
#[tokio::test]
async fn kubectl_perago_finds_the_servers_of_a_task() {
    let Some((_turn, services, cluster)) =
        cluster("kubectl_perago_finds_the_servers_of_a_task").await
    else {
        return;
    };
    let (namespace, name) = ("pods-plugin", "found");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task(namespace, name, PUBLISH_BODY))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (_lake, repository, input_ref) = seeded(services, "pods-plugin").await;
    let plugin = perago_e2e::process::release_binaries(&["kubectl-perago"], "the plugin's test")
        .unwrap()
        .join("kubectl-perago");
    let run = |args: &[&str]| {
        let mut command = std::process::Command::new(&plugin);
        command.args(args).env("KUBECONFIG", cluster.kubeconfig());
        for var in [
            "CONDUCTOR_SERVER_URL",
            "CONDUCTOR_AUTH_KEY",
            "CONDUCTOR_AUTH_SECRET",
            "LAKECTL_SERVER_ENDPOINT_URL",
            "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
        ] {
            command.env_remove(var);
        }
        command.output().unwrap()
    };
    let history = [
        "history",
        "--repository",
        &repository,
        "--branch",
        "main",
        "-o",
        "json",
    ];
    let mut args = vec!["--task", name, "-n", namespace];
    args.extend(history);
    let out = run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["head"], json!(input_ref), "{view}");

    let mut overridden = args.clone();
    overridden.extend(["--lakefs-endpoint", "http://127.0.0.1:9"]);
    let out = run(&overridden);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lakeFS"),
        "the flag wins: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut missing = vec!["--task", "nope", "-n", namespace];
    missing.extend(history);
    let out = run(&missing);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("PeragoTask {namespace}/nope not found")),
        "{stderr}"
    );

    // A published step: `status` shows its commit with the confirm metadata lakeFS holds,
    // read with the credentials the task's pods use.
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "status-publication",
        &repository,
        &input_ref,
        1,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    assert_eq!(finished["status"], "COMPLETED", "{finished}");
    let published = finished["tasks"][0]["outputData"]["workspace"]["ref"].clone();
    let view: serde_json::Value = {
        let started = std::time::Instant::now();
        loop {
            let out = run(&["status", name, "-n", namespace, "-o", "json"]);
            let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            // Conductor's index follows a task's updates a moment later.
            if view["publications"]
                .as_array()
                .is_some_and(|p| !p.is_empty())
            {
                assert_eq!(out.status.code(), Some(0), "{view}");
                break view;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no publication in {view}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let publication = &view["publications"][0];
    assert_eq!(publication["commit"], published, "{view}");
    assert_eq!(publication["workflowId"], json!(workflow), "{view}");
    assert_eq!(publication["metadata"]["perago.phase"], "confirm", "{view}");
    assert_eq!(
        publication["metadata"]["perago.workflow_instance_id"],
        json!(workflow),
        "{view}"
    );
}
