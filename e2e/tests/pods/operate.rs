//! Operating a task from its name (`kubectl perago status`, `suspend`, `resume`) on the node:
//! what `status` shows while attempts run, a suspend that lets every running attempt finish
//! and report with no poll after it, and a resume that drains the queue.

use std::process::Output;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::*;

/// A step that takes long enough for the pods to be seen busy and then suspended.
const SLOW_BODY: &str = r#"
set -eu
echo "body: working"
sleep 8
printf '{"files": 0}' > "$PERAGO_RESULT"
echo "body: done"
"#;

fn plugin(cluster: &Cluster, args: &[&str]) -> Output {
    let plugin = perago_e2e::process::release_binaries(&["kubectl-perago"], "the plugin's test")
        .unwrap()
        .join("kubectl-perago");
    let mut command = std::process::Command::new(plugin);
    command.args(args).env("KUBECONFIG", cluster.kubeconfig());
    for var in [
        "CONDUCTOR_SERVER_URL",
        "LAKECTL_SERVER_ENDPOINT_URL",
        "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
        "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
    ] {
        command.env_remove(var);
    }
    command.output().unwrap()
}

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
    let Some((services, cluster)) =
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
    let mut workflows = Vec::new();
    for i in 0..6 {
        let case = format!("operate-{i}");
        workflows.push(
            start_step(
                &conductor,
                namespace,
                name,
                &case,
                &repository,
                &input_ref,
                0,
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
    let Some((_services, cluster)) = cluster("status_says_what_it_could_not_read").await else {
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
    let Some((_services, cluster)) = cluster("the_commands_the_chart_notes_print_run").await else {
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
