//! `kubectl perago logs` and `kubectl perago report` on the node: an attempt's lines found
//! from its workflow (the body's output and the sidecar's publication in order, a follow that
//! ends with the attempt, a pod that is gone), and support bundles of a task and of the
//! operator that hold what they should and none of the harness's secrets.

use std::io::Read;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use perago_e2e::cluster::LAKEFS_SECRET;
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use serde_json::{Value, json};

use super::*;

/// A step that says who it is, sleeps `n` seconds, publishes one file and says it is done;
/// its environment holds a literal token, the lakeFS key from the namespace's Secret and a
/// URL with a password, which it prints.
const TALKING_BODY: &str = r#"
set -eu
n=$(sed -n 's/.*"n": *\([0-9]*\).*/\1/p' "$PERAGO_PARAMS")
echo "body: hello from $PERAGO_TASK_ID"
echo "body: token $API_TOKEN, key $LAKE_KEY, store $STORE_URL"
sleep "$n"
mkdir -p "$PERAGO_WORKSPACE/out"
echo "slept $n" > "$PERAGO_WORKSPACE/out/slept.txt"
printf '{"files": 1}' > "$PERAGO_RESULT"
echo "body: done"
"#;

const LITERAL_TOKEN: &str = "literal-token-5e1f0c2a";
const URL_PASSWORD: &str = "pa55-in-a-url-77";

/// A task whose body prints credentials: a literal, a Secret's value, a URL's user-info.
fn talking_task(cluster: &Cluster, namespace: &str, name: &str) {
    cluster.task_namespace(namespace).unwrap();
    let env = json!([
        {"name": "API_TOKEN", "value": LITERAL_TOKEN},
        {"name": "LAKE_KEY", "valueFrom": {"secretKeyRef": {
            "name": LAKEFS_SECRET, "key": "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"}}},
        {"name": "STORE_URL", "value": format!("https://reader:{URL_PASSWORD}@store.example/bucket")},
    ]);
    let spec = json!({"executor": {"body": {"env": env}}});
    cluster
        .apply(&workspace_task_with(namespace, name, TALKING_BODY, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The position of the first line holding `needle`, after line `from`.
fn line_of(lines: &[&str], needle: &str, from: usize) -> usize {
    lines
        .iter()
        .skip(from)
        .position(|l| l.contains(needle))
        .map(|i| i + from)
        .unwrap_or_else(|| {
            panic!(
                "no line with {needle:?} after line {from}:\n{}",
                lines.join("\n")
            )
        })
}

/// `logs --workflow`: the attempt's sidecar and body lines in time order, labelled, the
/// sidecar's publish line after the body's output; the same by `--task-id` and as JSON; the
/// pods' sidecar lines without a selector; `-f` on a running attempt ends once its sidecar
/// reports it; and once the pod is gone, one line saying where its lines could be.
#[tokio::test]
async fn logs_show_an_attempts_body_and_sidecar_lines_in_order() {
    let Some((_turn, services, cluster)) =
        cluster("logs_show_an_attempts_body_and_sidecar_lines_in_order").await
    else {
        return;
    };
    let (namespace, name) = ("pods-logs", "talker");
    talking_task(cluster, namespace, name);
    let (_lake, repository, input_ref) = seeded(services, "pods-logs").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "logs",
        &repository,
        &input_ref,
        0,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    let step = &finished["tasks"][0];
    assert_eq!(step["status"], "COMPLETED", "{step}");
    let task_id = step["taskId"].as_str().unwrap();

    let started = Instant::now();
    let out = plugin(
        cluster,
        &["logs", name, "-n", namespace, "--workflow", &workflow],
    );
    let took = started.elapsed();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    eprintln!("kubectl perago logs {name} --workflow {workflow} ({took:.1?}):\n{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "== attempt 0 of step {} (task {task_id}): COMPLETED on pod {name}-perago-",
            step["referenceTaskName"].as_str().unwrap()
        )),
        "{stdout}"
    );
    let start = line_of(&lines, "\"attempt started\"", 1);
    let hello = line_of(&lines, &format!("body: hello from {task_id}"), 1);
    let done = line_of(&lines, "body: done", 1);
    let published = line_of(&lines, "\"workspace published\"", 1);
    let reported = line_of(&lines, "\"attempt reported\"", 1);
    // The body's lines carry the time the runtime read them, which under load may trail the
    // sidecar's own publish and report: those two are not ordered against the body's.
    assert!(
        start < hello && hello < done && start < published && published < reported,
        "not in order (start {start}, hello {hello}, done {done}, published {published}, \
         reported {reported}):\n{stdout}"
    );
    for (i, label) in [(start, "sidecar"), (hello, "body"), (published, "sidecar")] {
        assert_eq!(
            lines[i].split_whitespace().nth(1),
            Some(label),
            "{}",
            lines[i]
        );
    }
    // Every sidecar line shown is the attempt's; the body's lines are the runner's window.
    for l in &lines[1..] {
        let label = l.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            label == "body" || l.contains(task_id),
            "a line not of the attempt: {l}"
        );
    }
    assert!(
        lines.iter().any(|l| l.contains(": starting execution ")
            && l.contains(&format!("task {task_id}, retry 0)"))),
        "{stdout}"
    );

    // By task id, and as JSON lines.
    let by_id = plugin(
        cluster,
        &["logs", name, "-n", namespace, "--task-id", task_id],
    );
    assert_eq!(text(&by_id).0, stdout);
    let json_out = plugin(
        cluster,
        &[
            "logs",
            name,
            "-n",
            namespace,
            "--workflow",
            &workflow,
            "--attempt",
            "0",
            "-o",
            "json",
        ],
    );
    let (json_text, json_err) = text(&json_out);
    assert_eq!(json_out.status.code(), Some(0), "{json_text}{json_err}");
    let records: Vec<Value> = json_text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), lines.len() - 1, "{json_text}");
    assert!(
        records.iter().all(|r| r["taskId"] == task_id),
        "{json_text}"
    );
    assert!(
        records
            .iter()
            .any(|r| r["container"] == "body" && r["text"] == "body: done"),
        "{json_text}"
    );
    let missing = plugin(
        cluster,
        &[
            "logs",
            name,
            "-n",
            namespace,
            "--workflow",
            &workflow,
            "--attempt",
            "5",
        ],
    );
    let (_, err) = text(&missing);
    assert_eq!(missing.status.code(), Some(1), "{err}");
    assert!(
        err.contains("has no attempt 5") && err.contains("(it has 0)"),
        "{err}"
    );

    // Without a selector: every pod's sidecar lines, labelled by pod.
    let pods_out = plugin(cluster, &["logs", name, "-n", namespace, "--tail", "50"]);
    let (pods_text, pods_err) = text(&pods_out);
    assert_eq!(pods_out.status.code(), Some(0), "{pods_text}{pods_err}");
    let pod = task_pod(&services.kube().client().await.unwrap(), namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    assert!(
        pods_text
            .lines()
            .all(|l| l.split_whitespace().nth(1) == Some(pod_name.as_str())),
        "{pods_text}"
    );
    assert!(pods_text.contains(task_id), "{pods_text}");
    eprintln!("kubectl perago logs {name} --tail 50:\n{pods_text}");

    // Follow a running attempt (on the head the first one published): the command ends once
    // the sidecar has reported it.
    let slow = start_step(
        &conductor,
        namespace,
        name,
        "follow",
        &repository,
        step["outputData"]["workspace"]["ref"].as_str().unwrap(),
        4,
    )
    .await;
    let began = Instant::now();
    loop {
        let wf = conductor.workflow(&slow).await;
        if wf["tasks"][0]["status"] == "IN_PROGRESS" && wf["tasks"][0]["workerId"].is_string() {
            break;
        }
        assert!(began.elapsed() < Duration::from_secs(60), "{wf}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let followed = plugin(
        cluster,
        &["logs", name, "-n", namespace, "--workflow", &slow, "-f"],
    );
    let follow_took = began.elapsed();
    let (follow_text, follow_err) = text(&followed);
    assert_eq!(followed.status.code(), Some(0), "{follow_text}{follow_err}");
    eprintln!(
        "kubectl perago logs -f ended {follow_took:.1?} after the step started:\n{follow_text}"
    );
    let flines: Vec<&str> = follow_text.lines().collect();
    let fdone = line_of(&flines, "body: done", 1);
    let freported = line_of(&flines, "\"attempt reported\"", 1);
    assert!(fdone < freported, "{follow_text}");
    assert_eq!(
        follow_text.matches("body: done").count(),
        1,
        "a line printed twice:\n{follow_text}"
    );
    assert_eq!(conductor.finished(&slow).await["status"], "COMPLETED");

    // The pod gone: its lines are no longer in the cluster, and the error says where else.
    cluster
        .kubectl(&["delete", "pod", "-n", namespace, &pod_name, "--wait=true"])
        .unwrap();
    let gone = plugin(
        cluster,
        &["logs", name, "-n", namespace, "--workflow", &workflow],
    );
    let (gone_out, gone_err) = text(&gone);
    assert_eq!(gone.status.code(), Some(1), "{gone_out}{gone_err}");
    eprintln!("once the pod is gone:\n{gone_err}");
    assert_eq!(gone_err.lines().count(), 1, "{gone_err}");
    for needle in [
        pod_name.as_str(),
        "is gone",
        "no longer readable from the cluster",
        "log store",
    ] {
        assert!(gone_err.contains(needle), "{needle:?} not in {gone_err}");
    }
}

/// Every file of an extracted bundle, by its path under the top directory.
fn files_of(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let relative = path.strip_prefix(root).unwrap().display().to_string();
                out.push((relative, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// The files of a `.tar.gz` bundle, with the top directory it holds them in.
fn unpacked(archive: &Path) -> (String, Vec<(String, String)>) {
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(archive).unwrap());
    let mut tar = tar::Archive::new(gz);
    let mut top = String::new();
    let mut out = Vec::new();
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        let (head, rest) = path.split_once('/').unwrap();
        top = head.to_owned();
        let mut text = String::new();
        entry.read_to_string(&mut text).unwrap();
        out.push((rest.to_owned(), text));
    }
    out.sort();
    (top, out)
}

fn file<'a>(files: &'a [(String, String)], path: &str) -> &'a str {
    files
        .iter()
        .find(|(p, _)| p == path)
        .map(|(_, t)| t.as_str())
        .unwrap_or_else(|| {
            let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
            panic!("no {path} in the bundle: {names:?}")
        })
}

/// No file of the bundle holds one of the harness's real secrets, nor the credentials the
/// task's body was given.
fn assert_no_secret(files: &[(String, String)]) {
    for (path, text) in files {
        for secret in [
            LAKEFS_SECRET_ACCESS_KEY,
            LAKEFS_ACCESS_KEY_ID,
            LITERAL_TOKEN,
            URL_PASSWORD,
        ] {
            assert!(!text.contains(secret), "{path} holds {secret}:\n{text}");
        }
    }
}

/// `report TASK` writes the task, its Deployment, pods, events, logs, metrics, TaskDef,
/// status and versions, with the lakeFS key (read from the namespace's Secret), a literal
/// token and a URL's password redacted in every file; `report operator` writes the
/// operator's part; `-O DIR` writes the same files into a directory.
#[tokio::test]
async fn report_writes_a_task_and_the_operator_without_their_secrets() {
    let Some((_turn, services, cluster)) =
        cluster("report_writes_a_task_and_the_operator_without_their_secrets").await
    else {
        return;
    };
    let (namespace, name) = ("pods-report", "reported");
    talking_task(cluster, namespace, name);
    let (_lake, repository, input_ref) = seeded(services, "pods-report").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "report",
        &repository,
        &input_ref,
        0,
    )
    .await;
    let step = conductor.finished(&workflow).await["tasks"][0].clone();
    assert_eq!(step["status"], "COMPLETED", "{step}");
    let task_id = step["taskId"].as_str().unwrap();
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("task.tar.gz");
    let started = Instant::now();
    let out = plugin(
        cluster,
        &[
            "report",
            name,
            "-n",
            namespace,
            "--output-file",
            archive.to_str().unwrap(),
        ],
    );
    let took = started.elapsed();
    let (stdout, stderr) = text(&out);
    eprintln!("kubectl perago report {name} ({took:.1?}):\n{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(&format!("wrote {}", archive.display())),
        "{stdout}"
    );
    let (top, files) = unpacked(&archive);
    assert!(
        top.starts_with(&format!("perago-report-{namespace}-{name}-")),
        "{top}"
    );
    let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    eprintln!("the bundle's files: {names:?}");
    assert_no_secret(&files);

    let task = file(&files, "peragotask.yaml");
    assert!(
        task.contains("kind: PeragoTask") && task.contains(&format!("name: {name}")),
        "{task}"
    );
    assert!(!task.contains("managedFields"), "{task}");
    let pods = file(&files, "pods.yaml");
    assert!(
        pods.contains(&pod_name) && pods.contains("value: REDACTED"),
        "{pods}"
    );
    assert!(file(&files, "deployment.yaml").contains(&format!("name: {name}-perago")));
    let events = file(&files, "events.txt");
    for reason in ["TaskDefRegistered", "Scheduled", "Started"] {
        assert!(events.contains(reason), "no {reason} event:\n{events}");
    }
    let body = file(&files, &format!("logs/{pod_name}/body.log"));
    eprintln!("logs/{pod_name}/body.log:\n{body}");
    assert!(
        body.contains(&format!("body: hello from {task_id}")),
        "{body}"
    );
    assert!(
        body.contains(
            "body: token REDACTED, key REDACTED, store https://REDACTED@store.example/bucket"
        ),
        "{body}"
    );
    let sidecar = file(&files, &format!("logs/{pod_name}/perago-sidecar.log"));
    assert!(
        sidecar.contains(task_id) && sidecar.contains("workspace published"),
        "{sidecar}"
    );
    let metrics = file(&files, &format!("metrics/{pod_name}.txt"));
    assert!(
        metrics.contains("perago_sidecar_attempts_total"),
        "{metrics}"
    );
    let taskdef: Value = serde_json::from_str(file(&files, "taskdef.json")).unwrap();
    assert_eq!(taskdef["name"], format!("{namespace}.{name}"));
    let status: Value = serde_json::from_str(file(&files, "status.json")).unwrap();
    assert_eq!(status["task"]["name"], name, "{status}");
    assert_eq!(status["unread"], json!([]), "{status}");
    let versions: Value = serde_json::from_str(file(&files, "versions.json")).unwrap();
    assert!(
        versions["apiServer"]["gitVersion"].is_string(),
        "{versions}"
    );
    assert_eq!(
        versions["operator"][0]["deployment"],
        perago_e2e::cluster::OPERATOR_DEPLOYMENT,
        "{versions}"
    );
    let readme = file(&files, "README.md");
    eprintln!("README.md:\n{readme}");
    assert!(
        readme.contains(&format!(
            "{namespace}/{LAKEFS_SECRET}: its values were read"
        )),
        "{readme}"
    );
    assert!(!readme.contains("## Redactions not done"), "{readme}");

    // The same into a directory.
    let into = dir.path().join("task-dir");
    let out = plugin(
        cluster,
        &[
            "report",
            name,
            "-n",
            namespace,
            "-O",
            into.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let in_dir = files_of(&into);
    assert_no_secret(&in_dir);
    let dir_names: Vec<&str> = in_dir.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(dir_names, names);

    // The operator.
    let operator_archive = dir.path().join("operator.tar.gz");
    let started = Instant::now();
    let out = plugin(
        cluster,
        &[
            "report",
            "operator",
            "--output-file",
            operator_archive.to_str().unwrap(),
        ],
    );
    let took = started.elapsed();
    let (stdout, stderr) = text(&out);
    eprintln!("kubectl perago report operator ({took:.1?}):\n{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let (top, files) = unpacked(&operator_archive);
    assert!(top.starts_with("perago-report-operator-"), "{top}");
    assert_no_secret(&files);
    assert!(file(&files, "deployment.yaml").contains(perago_e2e::cluster::OPERATOR_DEPLOYMENT));
    let logs: Vec<&(String, String)> = files
        .iter()
        .filter(|(p, _)| p.starts_with("logs/") && p.ends_with("/operator.log"))
        .collect();
    assert!(
        !logs.is_empty() && logs.iter().all(|(_, t)| !t.is_empty()),
        "{:?}",
        files.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    assert!(
        files
            .iter()
            .any(|(p, t)| p.starts_with("metrics/") && t.contains("perago_operator_")),
        "no operator metrics"
    );
    let tasks = file(&files, "peragotasks.txt");
    assert!(
        tasks.contains(&format!("{namespace}\t{name}\t{namespace}.{name}")),
        "{tasks}"
    );

    // An account that may not read Secrets: the bundle is written, and both its README and
    // the command say which Secret's values were not searched for (exit 1).
    let kubeconfig = secretless_kubeconfig(cluster, namespace, "support-reader", dir.path());
    let limited = dir.path().join("limited.tar.gz");
    let out = plugin(
        cluster,
        &[
            "report",
            name,
            "--kubeconfig",
            &kubeconfig,
            "--output-file",
            limited.to_str().unwrap(),
        ],
    );
    let (stdout, stderr) = text(&out);
    eprintln!("kubectl perago report {name}, by an account without Secrets:\n{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let not_redacted = stdout.split("Not redacted:").nth(1).unwrap_or_default();
    assert!(
        not_redacted.contains(&format!(
            "Secret {namespace}/{LAKEFS_SECRET}: wherever its values appear, they are in the \
             bundle as they are, since they could not be read"
        )) && not_redacted.contains("RBAC: ask for `get` on `secrets`"),
        "{stdout}"
    );
    let (_, files) = unpacked(&limited);
    let readme = file(&files, "README.md");
    assert!(
        readme.contains("## Redactions not done")
            && readme.contains(&format!(
                "{namespace}/{LAKEFS_SECRET}: its values could NOT be read"
            )),
        "{readme}"
    );
    // The literal token is still taken out: it is in the objects this account reads.
    assert!(files.iter().all(|(_, t)| !t.contains(LITERAL_TOKEN)));
}

/// A kubeconfig for the ServiceAccount `account` of `namespace`, bound to a Role that may read
/// everything a task's bundle holds but Secrets.
fn secretless_kubeconfig(cluster: &Cluster, namespace: &str, account: &str, dir: &Path) -> String {
    let rules = json!([
        {"apiGroups": ["perago.io"], "resources": ["peragotasks"], "verbs": ["get", "list"]},
        {"apiGroups": ["apps"], "resources": ["deployments", "replicasets"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/proxy", "events"], "verbs": ["get", "list"]},
    ]);
    account_kubeconfig(cluster, namespace, account, &rules, dir)
}

/// Bad input says what is wrong in one line: a task that does not exist (exit 1), a zip
/// (exit 2).
#[tokio::test]
async fn logs_and_report_of_a_task_that_does_not_exist_say_so_in_one_line() {
    let Some((_turn, _services, cluster)) =
        cluster("logs_and_report_of_a_task_that_does_not_exist_say_so_in_one_line").await
    else {
        return;
    };
    let namespace = "pods-report-missing";
    cluster.task_namespace(namespace).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("b.tar.gz");
    for args in [
        vec!["logs", "nope", "-n", namespace],
        vec!["logs", "nope", "-n", namespace, "--workflow", "w"],
        vec![
            "report",
            "nope",
            "-n",
            namespace,
            "--output-file",
            archive.to_str().unwrap(),
        ],
    ] {
        let out = plugin(cluster, &args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stdout}{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("PeragoTask {namespace}/nope not found")),
            "{args:?}: {stderr}"
        );
    }
    assert!(
        !archive.exists(),
        "a bundle was written for a task that does not exist"
    );
    let zip = plugin(
        cluster,
        &[
            "report",
            "nope",
            "-n",
            namespace,
            "--output-file",
            "bundle.zip",
        ],
    );
    let (_, stderr) = text(&zip);
    assert_eq!(zip.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a zip"), "{stderr}");
}
