//! The workspace transaction against the real Conductor and lakeFS: a workflow is started,
//! the local pod runs the attempt, and the final Conductor and lakeFS states are asserted,
//! including that no staging branch is left behind.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use perago_api::{contract, manifest, taskdef};
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries, wait_file};
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, Services, shared};
use perago_lakefs::LakeFsClient;
use serde_json::{Value, json};

async fn services() -> &'static Services {
    shared(Selection {
        conductor: true,
        lakefs: true,
        ..Selection::default()
    })
    .await
}

struct Lake {
    client: LakeFsClient,
    endpoint: String,
    http: reqwest::Client,
}

impl Lake {
    async fn new() -> Self {
        let endpoint = services().await.lakefs().endpoint.clone();
        Self {
            client: LakeFsClient::new(
                &endpoint,
                LAKEFS_ACCESS_KEY_ID,
                LAKEFS_SECRET_ACCESS_KEY,
                Duration::from_secs(30),
            )
            .unwrap(),
            endpoint,
            http: reqwest::Client::new(),
        }
    }

    async fn api(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}/api/v1{path}", self.endpoint))
            .basic_auth(LAKEFS_ACCESS_KEY_ID, Some(LAKEFS_SECRET_ACCESS_KEY));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    }

    /// A repository whose main holds `files`; returns (name, commit).
    async fn repository(&self, name: &str, files: &[(&str, &str)]) -> (String, String) {
        let repo = format!("{name}-{}", std::process::id());
        self.api(
            reqwest::Method::POST,
            "/repositories",
            Some(json!({"name": repo, "storage_namespace": services().await.lakefs().namespace(&repo), "default_branch": "main"})),
        )
        .await;
        let commit = self.write(&repo, files, &[], "seed", BTreeMap::new()).await;
        (repo, commit)
    }

    /// Upload and delete on main, commit; returns the commit.
    async fn write(
        &self,
        repo: &str,
        files: &[(&str, &str)],
        deletes: &[&str],
        message: &str,
        metadata: BTreeMap<String, String>,
    ) -> String {
        let dir = tempfile::tempdir().unwrap();
        for (i, (key, text)) in files.iter().enumerate() {
            let local = dir.path().join(i.to_string());
            std::fs::write(&local, text).unwrap();
            self.client
                .upload(repo, "main", key, &local, Duration::from_secs(30))
                .await
                .unwrap();
        }
        let deletes: Vec<String> = deletes.iter().map(|d| (*d).to_owned()).collect();
        self.client
            .delete_objects(repo, "main", &deletes)
            .await
            .unwrap();
        self.client
            .commit(repo, "main", message, &metadata)
            .await
            .unwrap()
            .id
    }

    async fn head(&self, repo: &str) -> String {
        self.client.branch_head(repo, "main").await.unwrap()
    }

    /// Key → content of every object under `prefix` at `reference`.
    async fn tree(&self, repo: &str, reference: &str, prefix: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for e in self
            .client
            .list_objects(repo, reference, prefix)
            .await
            .unwrap()
        {
            let resp = self
                .client
                .get_object(repo, reference, &e.path, Duration::from_secs(30))
                .await
                .unwrap();
            out.insert(e.path, resp.text().await.unwrap());
        }
        out
    }

    async fn branches(&self, repo: &str) -> Vec<String> {
        let list = self
            .api(
                reqwest::Method::GET,
                &format!("/repositories/{repo}/branches?amount=1000"),
                None,
            )
            .await;
        list["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Only `main` is left, at once or within 10 s: the sweep of earlier attempts' staging
    /// branches runs after the report.
    async fn assert_no_staging_branch(&self, repo: &str) {
        let started = std::time::Instant::now();
        let mut branches = self.branches(repo).await;
        while branches != ["main"] && started.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            branches = self.branches(repo).await;
        }
        assert_eq!(branches, ["main"], "no staging branch is left behind");
    }
}

fn workspace(repo: &str, reference: &str) -> Value {
    json!({"repository": repo, "branch": "main", "refType": "commit", "ref": reference})
}

/// Start a one-step workflow on `repo@input` with empty params; its id.
async fn start_on(api: &ConductorApi, task: &str, case: &str, repo: &str, input: &str) -> String {
    let input = json!({"workspace": workspace(repo, input), "params": {}});
    api.start(task, case, input).await
}

/// [`start_on`], then wait until the workflow finishes.
async fn run_on(api: &ConductorApi, task: &str, case: &str, repo: &str, input: &str) -> Value {
    api.finished(&start_on(api, task, case, repo, input).await)
        .await
}

/// Declare a workspace task without retries, register its TaskDef, and start its pod.
async fn task_pod(name: &str, workspace_spec: &str, body: &str) -> (ConductorApi, Pod) {
    let controls = "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}";
    task_pod_with(name, workspace_spec, controls, body, &[]).await
}

fn only_task(wf: &Value) -> &Value {
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "expected exactly one attempt: {wf}");
    &tasks[0]
}

const COUNT_FILES: &str =
    r#"printf '{"files": %d}' "$(find "$PERAGO_WORKSPACE" -type f | wc -l)" > "$PERAGO_RESULT""#;

#[tokio::test]
async fn a_changed_workspace_is_published_with_complete_metadata() {
    let lake = Lake::new().await;
    let (repo, input) = lake
        .repository(
            "ws-publish",
            &[
                ("data/a.txt", "a"),
                ("data/old.txt", "old"),
                ("other/keep.txt", "keep"),
            ],
        )
        .await;
    let body = format!(
        "echo new > \"$PERAGO_WORKSPACE/new.txt\"\nrm \"$PERAGO_WORKSPACE/old.txt\"\nmkdir -p \"$PERAGO_WORKSPACE/sub\"\necho deep > \"$PERAGO_WORKSPACE/sub/d.txt\"\n{COUNT_FILES}\n"
    );
    let (api, pod) = task_pod("ws.publish", "{prefix: /data}", &body).await;
    let wf = api
        .finished(
            &api.start(
                "ws.publish",
                "ok",
                json!({"workspace": workspace(&repo, &input), "params": {"n": 1}}),
            )
            .await,
        )
        .await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "COMPLETED", "{wf}\n{}", pod.log());
    let head = lake.head(&repo).await;
    assert_ne!(head, input);
    assert_eq!(
        t["outputData"],
        json!({"workspace": workspace(&repo, &head), "result": {"files": 3}})
    );
    assert_eq!(
        lake.tree(&repo, &head, "").await,
        BTreeMap::from([
            ("data/a.txt".to_owned(), "a".to_owned()),
            ("data/new.txt".to_owned(), "new\n".to_owned()),
            ("data/sub/d.txt".to_owned(), "deep\n".to_owned()),
            ("other/keep.txt".to_owned(), "keep".to_owned()),
        ]),
        "the prefix mirrors the workspace (the deletion included); other keys are untouched"
    );
    let commit = lake.client.get_commit(&repo, &head).await.unwrap();
    assert_eq!(
        commit.parents,
        vec![input.clone()],
        "a squash merge: one parent"
    );
    let m = &commit.metadata;
    let task_id = t["taskId"].as_str().unwrap();
    for (key, value) in [
        ("perago.phase", "confirm"),
        ("perago.input_ref", input.as_str()),
        ("perago.expected_head", input.as_str()),
        ("perago.supersedes", ""),
        ("perago.target_branch", "main"),
        ("perago.prefix", "data"),
        ("perago.task_id", task_id),
        ("perago.retry_count", "0"),
    ] {
        assert_eq!(m.get(key).map(String::as_str), Some(value), "{key}: {m:?}");
    }
    let wf_id = wf["workflowId"].as_str().unwrap();
    assert_eq!(
        m["perago.logical_task_key"],
        format!("{wf_id}:step:0:ws.publish")
    );
    let staging_commit = lake
        .client
        .get_commit(&repo, &m["perago.staging_commit"])
        .await
        .unwrap();
    assert_eq!(staging_commit.metadata["perago.phase"], "try");
    assert_eq!(staging_commit.message, "perago try");
    assert!(m["perago.staging_branch"].starts_with("perago-staging-"));
    lake.assert_no_staging_branch(&repo).await;
    let phases: Vec<String> = ["input", "download", "body", "fence", "publish", "report"]
        .iter()
        .map(|p| format!("perago_sidecar_phase_duration_seconds_count{{phase=\"{p}\"}} 1"))
        .collect();
    let expected: Vec<&str> = phases.iter().map(String::as_str).collect();
    let metrics = pod.metrics_with(&expected).await;
    for line in expected {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
}

/// Write the pod's annotations as the kubelet does into a downward-API volume: a new
/// timestamped directory, `..data` switched to it, and `annotations` a link through `..data`.
fn project_annotations(dir: &std::path::Path, lines: &str, generation: u32) {
    let fresh = dir.join(format!("..2026_12_07_{generation}"));
    std::fs::create_dir_all(&fresh).unwrap();
    std::fs::write(fresh.join("annotations"), lines).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(fresh.file_name().unwrap(), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join("annotations");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/annotations", &link).unwrap();
    }
}

/// Each publication names the code that produced it: the task, its generation, the contract
/// and the sidecar from the pod's settings, and the body image id from the pod's annotations
/// as the kubelet projects them, read at each publication: pending before the operator has
/// written it, then the digest, with no restart of the sidecar.
#[tokio::test]
async fn publications_carry_the_lineage_the_pod_annotations_give() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-lineage", &[("a.txt", "a")]).await;
    let projected = tempfile::tempdir().unwrap();
    let annotations = projected.path().join("annotations");
    let body = format!("date +%s%N > \"$PERAGO_WORKSPACE/run.txt\"\n{COUNT_FILES}\n");
    let (api, pod) = task_pod_with(
        "ws.lineage",
        "{prefix: /}",
        "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}",
        &body,
        &[
            ("PERAGO_POD_ANNOTATIONS", annotations.to_str().unwrap()),
            ("PERAGO_TASK_NAMESPACE", "team"),
            ("PERAGO_TASK_NAME", "lineage"),
            ("PERAGO_TASK_UID", "0b5e-uid"),
            ("PERAGO_TASK_GENERATION", "4"),
            ("PERAGO_BODY_IMAGE", "registry.local:5000/body:1"),
        ],
    )
    .await;
    let contract = std::fs::read(pod.path("contract.json")).unwrap();
    let contract_hash = perago_workspace::publication::contract_hash(&contract);

    let wf = run_on(&api, "ws.lineage", "pending", &repo, &input).await;
    assert_eq!(only_task(&wf)["status"], "COMPLETED", "{wf}\n{}", pod.log());
    let first = lake.head(&repo).await;
    let m = lake
        .client
        .get_commit(&repo, &first)
        .await
        .unwrap()
        .metadata;
    for (key, value) in [
        ("perago.body_image_id", ""),
        ("perago.body_image", "registry.local:5000/body:1"),
        ("perago.peragotask_namespace", "team"),
        ("perago.peragotask_name", "lineage"),
        ("perago.peragotask_uid", "0b5e-uid"),
        ("perago.peragotask_generation", "4"),
        ("perago.contract_hash", contract_hash.as_str()),
        ("perago.sidecar_version", env!("CARGO_PKG_VERSION")),
        ("perago.task_def_name", "ws.lineage"),
    ] {
        assert_eq!(m.get(key).map(String::as_str), Some(value), "{key}: {m:?}");
    }

    let image_id = "registry.local:5000/body@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    project_annotations(
        projected.path(),
        &format!(
            "kubectl.kubernetes.io/default-container=\"body\"\nperago.io/body-image-id=\"{image_id}\"\nperago.io/contract-hash=\"{contract_hash}\""
        ),
        1,
    );
    let wf = run_on(&api, "ws.lineage", "known", &repo, &first).await;
    assert_eq!(only_task(&wf)["status"], "COMPLETED", "{wf}\n{}", pod.log());
    let head = lake.head(&repo).await;
    let confirm = lake.client.get_commit(&repo, &head).await.unwrap();
    assert_eq!(confirm.metadata["perago.body_image_id"], image_id);
    let try_commit = lake
        .client
        .get_commit(&repo, &confirm.metadata["perago.staging_commit"])
        .await
        .unwrap();
    assert_eq!(
        try_commit.metadata["perago.body_image_id"], image_id,
        "the try commit carries the same lineage"
    );
    let publication =
        perago_workspace::publication::Publication::from_metadata(&confirm.metadata).unwrap();
    assert_eq!(
        publication.lineage.body_digest(),
        Some("sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
    );
    assert_eq!(publication.lineage.task_generation, Some(4));
}

/// With tracing on, the calls an attempt makes to lakeFS and Conductor carry its trace as a
/// W3C `traceparent` (its root span, in its workflow run's trace, ADR 0041); the polls, made
/// for no attempt, carry none. Both servers ignore it: the attempt publishes as ever.
#[tokio::test]
async fn an_attempts_calls_to_lakefs_and_conductor_carry_its_traceparent() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-traced", &[("a.txt", "a")]).await;
    let conductor_url = services().await.conductor().api_url.clone();
    let conductor = perago_e2e::faults::FaultProxy::start(&conductor_url)
        .await
        .unwrap();
    let lakefs = perago_e2e::faults::FaultProxy::start(&lake.endpoint)
        .await
        .unwrap();
    // Nothing listens there: the exports fail and are counted, the attempts are not held up.
    let dead = format!(
        "http://127.0.0.1:{}/v1/traces",
        perago_e2e::process::free_port().unwrap()
    );
    let (api, pod) = task_pod_with(
        "ws.traced",
        "{prefix: /}",
        "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}",
        &format!("echo x > \"$PERAGO_WORKSPACE/b.txt\"\n{COUNT_FILES}\n"),
        &[
            ("CONDUCTOR_SERVER_URL", conductor.url.as_str()),
            ("LAKECTL_SERVER_ENDPOINT_URL", lakefs.url.as_str()),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", dead.as_str()),
        ],
    )
    .await;
    let wf = run_on(&api, "ws.traced", "traced", &repo, &input).await;
    assert_eq!(only_task(&wf)["status"], "COMPLETED", "{wf}\n{}", pod.log());
    let trace_id = wf["workflowId"].as_str().unwrap().replace('-', "");
    let traced = |seen: Vec<perago_e2e::faults::Seen>, what: &str| -> Vec<String> {
        let mut paths = Vec::new();
        for s in seen {
            if let Some(t) = &s.traceparent {
                let parts: Vec<&str> = t.split('-').collect();
                assert_eq!(parts.len(), 4, "{what} {} {}: {t}", s.method, s.path);
                assert_eq!(
                    (parts[0], parts[1], parts[3]),
                    ("00", trace_id.as_str(), "01"),
                    "{what} {} {}: the attempt's trace",
                    s.method,
                    s.path
                );
                paths.push(format!("{} {}", s.method, s.path));
            }
        }
        paths
    };
    let lakefs_calls = traced(lakefs.seen(), "lakeFS");
    for call in ["/commits", "/merge/"] {
        assert!(
            lakefs_calls.iter().any(|p| p.contains(call)),
            "a lakeFS call to {call} with the attempt's traceparent: {lakefs_calls:?}"
        );
    }
    let conductor_seen = conductor.seen();
    let polls: Vec<_> = conductor_seen
        .iter()
        .filter(|s| s.path.contains("/tasks/poll"))
        .collect();
    assert!(!polls.is_empty() && polls.iter().all(|s| s.traceparent.is_none()));
    let conductor_calls = traced(conductor_seen, "Conductor");
    assert!(
        conductor_calls
            .iter()
            .any(|p| p.starts_with("POST") && p.ends_with("/tasks")),
        "the report carries it: {conductor_calls:?}"
    );
}

#[tokio::test]
async fn read_only_and_unchanged_workspaces_complete_with_the_input_ref_and_write_nothing() {
    let lake = Lake::new().await;
    let (repo, input) = lake
        .repository("ws-noop", &[("a.txt", "a"), ("b/c.txt", "c")])
        .await;
    let body = format!(
        "cat \"$PERAGO_WORKSPACE/a.txt\" > /dev/null\nmkdir \"$PERAGO_WORKSPACE/empty\"\n{COUNT_FILES}\n"
    );
    let (api, _pod) = task_pod("ws.noop", "{prefix: /}", &body).await;
    let wf = run_on(&api, "ws.noop", "noop", &repo, &input).await;
    assert_eq!(
        only_task(&wf)["outputData"],
        json!({"workspace": workspace(&repo, &input), "result": {"files": 2}}),
        "{wf}"
    );
    let (api, _pod) = task_pod(
        "ws.readonly",
        "{prefix: /, readOnly: true}",
        &format!("echo x > \"$PERAGO_WORKSPACE/a.txt\"\n{COUNT_FILES}\n"),
    )
    .await;
    let wf = run_on(&api, "ws.readonly", "ro", &repo, &input).await;
    assert_eq!(
        only_task(&wf)["outputData"]["workspace"],
        workspace(&repo, &input),
        "{wf}"
    );
    assert_eq!(
        lake.head(&repo).await,
        input,
        "no commit, empty or otherwise"
    );
    lake.assert_no_staging_branch(&repo).await;
}

#[tokio::test]
async fn guardrails_and_symlinks_fail_without_touching_the_target() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-guard", &[("raw/a.csv", "a")]).await;
    let spec = "{prefix: /, pre: [{kind: requireGlob, path: 'raw/**/*.parquet'}]}";
    let (api, pod) = task_pod("ws.pre", spec, "touch \"$T/ran\"\n").await;
    let wf = run_on(&api, "ws.pre", "pre", &repo, &input).await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "FAILED_WITH_TERMINAL_ERROR", "{wf}");
    assert_eq!(
        t["reasonForIncompletion"],
        "pre guardrail require_glob('raw/**/*.parquet') matched 0 files; min_count=1"
    );
    assert!(!pod.path("ran").exists(), "the body never ran");

    let spec = "{prefix: /, post: [{kind: requireFile, path: out/result.parquet}]}";
    let (api, _pod) = task_pod(
        "ws.post",
        spec,
        &format!("echo changed > \"$PERAGO_WORKSPACE/raw/a.csv\"\n{COUNT_FILES}\n"),
    )
    .await;
    let wf = run_on(&api, "ws.post", "post", &repo, &input).await;
    let t = only_task(&wf);
    assert_eq!(
        (t["status"].as_str(), t["reasonForIncompletion"].as_str()),
        (
            Some("FAILED"),
            Some("post guardrail require_file('out/result.parquet') did not find a file")
        )
    );

    let (api, _pod) = task_pod(
        "ws.symlink",
        "{prefix: /}",
        &format!("ln -s raw \"$PERAGO_WORKSPACE/link\"\n{COUNT_FILES}\n"),
    )
    .await;
    let wf = run_on(&api, "ws.symlink", "link", &repo, &input).await;
    let t = only_task(&wf);
    assert_eq!(
        t["reasonForIncompletion"], "workspace publication does not support symlinks: link",
        "{wf}"
    );
    assert_eq!(lake.head(&repo).await, input);
    lake.assert_no_staging_branch(&repo).await;
}

#[tokio::test]
async fn a_foreign_commit_on_the_target_fails_the_publication_closed() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-foreign", &[("a.txt", "a")]).await;
    // n = 1: an unchanged workspace (a no-op); otherwise the body adds b.txt after a pause.
    let body = format!(
        "if grep -q '\"n\": *1' \"$PERAGO_PARAMS\"; then {COUNT_FILES}; exit 0; fi\necho $$ > \"$T/started\"\nsleep 2\necho b > \"$PERAGO_WORKSPACE/b.txt\"\n{COUNT_FILES}\n"
    );
    let (api, pod) = task_pod("ws.foreign", "{prefix: /}", &body).await;
    let id = start_on(&api, "ws.foreign", "foreign", &repo, &input).await;
    wait_file(&pod.path("started")).await;
    let foreign = lake
        .write(
            &repo,
            &[("x.txt", "someone else")],
            &[],
            "foreign",
            BTreeMap::new(),
        )
        .await;
    let wf = api.finished(&id).await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "FAILED");
    assert_eq!(
        t["reasonForIncompletion"],
        format!("main advanced from {input} to {foreign}")
    );
    assert_eq!(lake.head(&repo).await, foreign, "the target is untouched");
    lake.assert_no_staging_branch(&repo).await;

    // A no-op attempt from the old input ref cannot complete either: its output would claim
    // a ref the branch has left.
    let wf = api
        .finished(
            &api.start(
                "ws.foreign",
                "foreign-noop",
                json!({"workspace": workspace(&repo, &input), "params": {"n": 1}}),
            )
            .await,
        )
        .await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "FAILED", "{wf}");
    assert_eq!(
        t["reasonForIncompletion"],
        format!("main cannot complete no-op from input ref {input}; current head is {foreign}")
    );
    assert_eq!(lake.head(&repo).await, foreign, "the target is untouched");
    lake.assert_no_staging_branch(&repo).await;
}

/// Files of 8 MiB or more whose stamp changed are hashed by their upload, not before it
/// (ADR 0045); the outcomes are those of reading them first. n = 1 rewrites `big.bin` with
/// the bytes it had, n = 2 does that and changes `small.txt`, n = 3 changes one byte of
/// `big.bin`.
#[tokio::test]
async fn large_files_read_while_they_upload_publish_only_real_changes() {
    use md5::Digest;
    let lake = Lake::new().await;
    let big: String = (0..8usize << 20)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let (repo, _) = lake.repository("ws-large", &[("small.txt", "s")]).await;
    // Put with a content type of its own: a staged copy of the same bytes would differ from
    // it in lakeFS (an upload's type is application/octet-stream).
    let put = lake
        .http
        .post(format!(
            "{}/api/v1/repositories/{repo}/branches/main/objects?path=big.bin",
            lake.endpoint
        ))
        .basic_auth(LAKEFS_ACCESS_KEY_ID, Some(LAKEFS_SECRET_ACCESS_KEY))
        .header("Content-Type", "text/plain")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    let input = lake
        .client
        .commit(&repo, "main", "big", &BTreeMap::new())
        .await
        .unwrap()
        .id;
    let body = format!(
        r#"ws="$PERAGO_WORKSPACE"
if grep -q '"n": *[12]' "$PERAGO_PARAMS"; then
  cp "$ws/big.bin" "$T/big.$$"; cat "$T/big.$$" > "$ws/big.bin"; rm "$T/big.$$"
fi
if grep -q '"n": *2' "$PERAGO_PARAMS"; then echo changed > "$ws/small.txt"; fi
if grep -q '"n": *3' "$PERAGO_PARAMS"; then printf X | dd of="$ws/big.bin" bs=1 count=1 conv=notrunc 2>/dev/null; fi
{COUNT_FILES}
"#
    );
    let (api, pod) = task_pod("ws.large", "{prefix: /}", &body).await;
    let run = |n: u32, from: String| {
        let api = &api;
        let repo = &repo;
        async move {
            let input = json!({"workspace": workspace(repo, &from), "params": {"n": n}});
            api.finished(&api.start("ws.large", &format!("large-{n}"), input).await)
                .await
        }
    };
    let stat = |reference: String| {
        let lake = &lake;
        let repo = &repo;
        async move {
            lake.api(
                reqwest::Method::GET,
                &format!("/repositories/{repo}/refs/{reference}/objects/stat?path=big.bin"),
                None,
            )
            .await
        }
    };

    let wf = run(1, input.clone()).await;
    assert_eq!(
        only_task(&wf)["outputData"]["workspace"],
        workspace(&repo, &input),
        "the same bytes are no change: {wf}\n{}",
        pod.log()
    );
    assert_eq!(lake.head(&repo).await, input, "no commit");
    lake.assert_no_staging_branch(&repo).await;

    let wf = run(2, input.clone()).await;
    let published = only_task(&wf)["outputData"]["workspace"]["ref"]
        .as_str()
        .unwrap_or_else(|| panic!("published: {wf}\n{}", pod.log()))
        .to_owned();
    let diff = lake
        .api(
            reqwest::Method::GET,
            &format!("/repositories/{repo}/refs/{input}/diff/{published}"),
            None,
        )
        .await;
    let changed: Vec<&str> = diff["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert_eq!(changed, ["small.txt"], "{diff}");
    let (kept, was) = (stat(published.clone()).await, stat(input.clone()).await);
    assert_eq!(
        (&kept["physical_address"], &kept["content_type"]),
        (&was["physical_address"], &json!("text/plain")),
        "big.bin's staged copy was dropped: the commit keeps the base's object"
    );

    let wf = run(3, published.clone()).await;
    let changed_ref = only_task(&wf)["outputData"]["workspace"]["ref"]
        .as_str()
        .unwrap_or_else(|| panic!("published: {wf}\n{}", pod.log()))
        .to_owned();
    let mut expected = big.clone().into_bytes();
    expected[0] = b'X';
    let md5: String = md5::Md5::digest(&expected)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let stored = stat(changed_ref).await;
    assert_eq!(
        (stored["checksum"].as_str(), stored["size_bytes"].as_u64()),
        (Some(md5.as_str()), Some(8 << 20)),
        "{stored}"
    );

    // From a ref the branch has left, the same bytes are still a no-op, and refused as one:
    // the refusal reads the file its upload would have read.
    let head = lake.head(&repo).await;
    let wf = run(1, input.clone()).await;
    assert_eq!(
        only_task(&wf)["reasonForIncompletion"],
        format!("main cannot complete no-op from input ref {input}; current head is {head}"),
        "{wf}"
    );
    lake.assert_no_staging_branch(&repo).await;
}

#[tokio::test]
async fn malformed_workspace_input_is_refused_before_any_download() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-input", &[("a.txt", "a")]).await;
    let (api, pod) = task_pod("ws.input", "{prefix: /}", "touch \"$T/ran\"\n").await;
    let mut bad = workspace(&repo, &input);
    bad["ref_type"] = json!("commit");
    bad.as_object_mut().unwrap().remove("refType");
    let cases = [
        (json!({"workspace": bad, "params": {}}), "invalid workspace: workspace.ref_type: Extra inputs are not permitted; workspace.refType: Field required".to_owned()),
        (json!({"params": {}}), "workspace task input must contain only workspace and params".to_owned()),
        (json!({"workspace": workspace(&repo, "0000deadbeef"), "params": {}}), format!("lakeFS list objects on {repo}@0000deadbeef failed: HTTP 404 Not Found")),
    ];
    for (i, (input, reason)) in cases.into_iter().enumerate() {
        let wf = api
            .finished(&api.start("ws.input", &format!("c{i}"), input).await)
            .await;
        let got = only_task(&wf)["reasonForIncompletion"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(got.starts_with(&reason), "{got}");
    }
    assert!(!pod.path("ran").exists());
}

/// Declare a workspace task with `controls`, register its TaskDef, and start its pod (two
/// slots) with `body` and `extra_env`.
async fn task_pod_with(
    name: &str,
    workspace_spec: &str,
    controls: &str,
    body: &str,
    extra_env: &[(&str, &str)],
) -> (ConductorApi, Pod) {
    let services = services().await;
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: t}}
spec:
  taskName: {name}
  ownerEmail: e2e@example.com
  workspace: {workspace_spec}
  paramsSchema: {{type: object, properties: {{n: {{type: integer}}}}}}
  resultSchema: {{type: object, properties: {{files: {{type: integer}}}}, required: [files]}}
  controls: {controls}
  executor: {{body: {{image: body, command: [sh]}}, slots: 2}}
"#
    );
    let spec = manifest::parse(&yaml).unwrap().remove(0).task.spec;
    perago_api::validate(&spec).unwrap();
    let api = ConductorApi::new(&services.conductor().api_url);
    api.call(
        reqwest::Method::POST,
        "/metadata/taskdefs",
        Some(&json!([taskdef::render(&spec).unwrap()])),
    )
    .await;
    let contract = serde_json::to_value(contract::render(&spec).unwrap()).unwrap();
    let lake = &services.lakefs().endpoint;
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let hosts = services.lakefs().object_store_hosts();
    let mut env = vec![
        ("LAKECTL_SERVER_ENDPOINT_URL", lake.as_str()),
        ("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID),
        (
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            LAKEFS_SECRET_ACCESS_KEY,
        ),
        // On the PostgreSQL + S3 profile the bytes go to the object store (auto).
        ("PERAGO_LAKEFS_OBJECT_STORE_HOSTS", hosts.as_str()),
    ];
    env.extend_from_slice(extra_env);
    let pod = Pod::start(&bins, &api.base, &contract, body, &env).await;
    (api, pod)
}

/// Writes different files on the first attempt and on its retry.
const PER_ATTEMPT: &str = r#"
if [ "$PERAGO_RETRY_COUNT" = 0 ]; then
  echo first > "$PERAGO_WORKSPACE/shared.txt"; echo x > "$PERAGO_WORKSPACE/only-first.txt"
else
  echo second > "$PERAGO_WORKSPACE/shared.txt"; echo y > "$PERAGO_WORKSPACE/only-second.txt"
fi
printf '{"files": 0}' > "$PERAGO_RESULT"
"#;

/// Have Conductor decide the workflow until it is no longer running (its sweeper is slow to
/// time out an attempt whose pod died); the final workflow.
async fn after_the_timeout(api: &ConductorApi, id: &str) -> Value {
    let started = std::time::Instant::now();
    loop {
        api.call(
            reqwest::Method::PUT,
            &format!("/workflow/decide/{id}"),
            None,
        )
        .await;
        let wf = api.workflow(id).await;
        if wf["status"] != "RUNNING" {
            return wf;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "no retry: {wf}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Start a workflow on a pod that dies at `fault`; wait for the crash (exit status 86).
async fn start_crashing(
    task: &str,
    controls: &str,
    body: &str,
    fault: &str,
    repo: &str,
    input: &str,
) -> (ConductorApi, String) {
    let (api, mut crashing) = task_pod_with(
        task,
        "{prefix: /}",
        controls,
        body,
        &[("PERAGO_FAULT", fault)],
    )
    .await;
    let id = start_on(&api, task, "crash", repo, input).await;
    let status = tokio::time::timeout(Duration::from_secs(60), crashing.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.code(),
        Some(86),
        "the sidecar crashed at {fault}:\n{}",
        crashing.log()
    );
    (api, id)
}

/// The one staging branch a crashed attempt left behind.
async fn the_leftover(lake: &Lake, repo: &str) -> String {
    let branches = lake.branches(repo).await;
    let staging: Vec<&String> = branches
        .iter()
        .filter(|b| b.starts_with("perago-staging-"))
        .collect();
    assert_eq!(staging.len(), 1, "{branches:?}");
    staging[0].clone()
}

/// The same files on every attempt, as docs/task-bodies.md recommends.
const DETERMINISTIC: &str = r#"
echo same > "$PERAGO_WORKSPACE/shared.txt"; echo out > "$PERAGO_WORKSPACE/out.txt"
printf '{"files": 0}' > "$PERAGO_RESULT"
"#;

/// The pod dies after its merge landed, before cleanup; the retry's body writes the same
/// files, so the retry completes on that publication without merging. It must still remove
/// the staging branch the crash left behind, and say so.
#[tokio::test]
async fn a_deterministic_retry_after_a_crash_after_merge_publishes_once_and_leaves_no_staging_branch()
 {
    let lake = Lake::new().await;
    let (repo, input) = lake
        .repository("ws-crash-same", &[("keep.txt", "keep")])
        .await;
    let controls = "{retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 2}}";
    let (api, id) = start_crashing(
        "ws.crashsame",
        controls,
        DETERMINISTIC,
        "exit-after-merge",
        &repo,
        &input,
    )
    .await;
    let first = lake.head(&repo).await;
    assert_ne!(first, input, "the first attempt's merge happened");
    let leftover = the_leftover(&lake, &repo).await;

    let (_, pod) = task_pod_with("ws.crashsame", "{prefix: /}", controls, DETERMINISTIC, &[]).await;
    let wf = after_the_timeout(&api, &id).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", pod.log());
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{wf}");
    assert_eq!(tasks[1]["retryCount"], 1);
    assert_eq!(
        tasks[1]["outputData"],
        json!({"workspace": workspace(&repo, &first), "result": {"files": 0}}),
        "the retry completes on the earlier publication"
    );
    assert_eq!(lake.head(&repo).await, first, "no second publication");
    let history = lake
        .client
        .first_parent_log(&repo, &first, &input, 10)
        .await
        .unwrap()
        .0;
    assert_eq!(
        history.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [first.as_str(), input.as_str()],
        "exactly one publication above the input ref"
    );
    assert_eq!(history[0].metadata["perago.retry_count"], "0");
    lake.assert_no_staging_branch(&repo).await;
    let removed = "removed a staging branch an earlier attempt of this step left behind";
    let log = pod.log_with(&[removed, &leftover]).await;
    assert!(
        log.lines()
            .any(|l| l.contains(removed) && l.contains(&leftover)),
        "the removal names the branch:\n{log}"
    );
}

/// The pod dies between stage and merge; the retry's body changes nothing, so it completes
/// as a no-op (the head is still the input ref). The staging branch is removed there too.
#[tokio::test]
async fn a_no_op_retry_after_a_crash_after_stage_leaves_no_staging_branch() {
    let lake = Lake::new().await;
    let (repo, input) = lake
        .repository("ws-crash-noop", &[("keep.txt", "keep")])
        .await;
    let controls = "{retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 2}}";
    let body = r#"
if [ "$PERAGO_RETRY_COUNT" = 0 ]; then echo x > "$PERAGO_WORKSPACE/only-first.txt"; fi
printf '{"files": 0}' > "$PERAGO_RESULT"
"#;
    let (api, id) = start_crashing(
        "ws.crashnoop",
        controls,
        body,
        "exit-after-stage",
        &repo,
        &input,
    )
    .await;
    assert_eq!(lake.head(&repo).await, input, "nothing was merged");
    let leftover = the_leftover(&lake, &repo).await;

    let (_, pod) = task_pod_with("ws.crashnoop", "{prefix: /}", controls, body, &[]).await;
    let wf = after_the_timeout(&api, &id).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", pod.log());
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(
        tasks[1]["outputData"]["workspace"],
        workspace(&repo, &input),
        "{wf}"
    );
    assert_eq!(lake.head(&repo).await, input);
    lake.assert_no_staging_branch(&repo).await;
    let log = pod.log_with(&[&leftover]).await;
    assert!(log.contains(&leftover), "{log}");
}

/// A step that never runs again keeps its crashed attempt's staging branch until a pod of the
/// same task type, having written to the repository, sweeps it: here within a 1 s sweep
/// period once the task timed out. A dead branch of another task type stays for its own pods.
#[tokio::test]
async fn the_periodic_sweep_removes_dead_staging_branches_of_its_task_type_only() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-sweep", &[("keep.txt", "keep")]).await;
    let controls = "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 2}}";
    let mut dead = Vec::new();
    for task in ["ws.sweep", "ws.sweep-other"] {
        let (api, id) = start_crashing(
            task,
            controls,
            DETERMINISTIC,
            "exit-after-stage",
            &repo,
            &input,
        )
        .await;
        assert_eq!(after_the_timeout(&api, &id).await["status"], "TIMED_OUT");
        let branches = lake.branches(&repo).await;
        dead.push(
            branches
                .into_iter()
                .find(|b| b.starts_with("perago-staging-") && !dead.contains(b))
                .unwrap(),
        );
    }
    let (api, pod) = task_pod_with(
        "ws.sweep",
        "{prefix: /}",
        controls,
        DETERMINISTIC,
        &[("PERAGO_STAGING_SWEEP_SECONDS", "1")],
    )
    .await;
    // Another workflow of the same task type writes to the repository (a branch of its own).
    lake.client
        .create_branch(&repo, "other", &input)
        .await
        .unwrap();
    let id = api
        .start(
            "ws.sweep",
            "writer",
            json!({"workspace": {"repository": repo, "branch": "other", "refType": "commit", "ref": input},
                   "params": {}}),
        )
        .await;
    assert_eq!(api.finished(&id).await["status"], "COMPLETED");
    let started = std::time::Instant::now();
    while lake.branches(&repo).await.contains(&dead[0]) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "not swept:\n{}",
            pod.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = pod
        .metrics_with(&["perago_sidecar_staging_branches_swept_total 1"])
        .await;
    assert!(metrics.contains("perago_sidecar_staging_branches_swept_total 1"));
    assert!(
        pod.log()
            .lines()
            .any(|l| l.contains("can no longer publish") && l.contains(&dead[0])),
        "{}",
        pod.log()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        lake.branches(&repo).await.contains(&dead[1]),
        "another task type's branch is left to its own pods"
    );
}

#[tokio::test]
async fn a_crash_after_merge_is_superseded_by_the_retry_and_the_prefix_equals_its_workspace() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-crash", &[("keep.txt", "keep")]).await;
    let controls = "{retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 2}}";
    let (api, mut crashing) = task_pod_with(
        "ws.crash",
        "{prefix: /}",
        controls,
        PER_ATTEMPT,
        &[("PERAGO_FAULT", "exit-after-merge")],
    )
    .await;
    let id = start_on(&api, "ws.crash", "crash", &repo, &input).await;
    let status = tokio::time::timeout(Duration::from_secs(60), crashing.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.code(),
        Some(86),
        "the sidecar crashed after the merge:\n{}",
        crashing.log()
    );
    let first = lake.head(&repo).await;
    assert_ne!(first, input, "the first attempt's merge happened");
    assert_eq!(
        lake.branches(&repo).await.len(),
        2,
        "and its staging branch was left behind"
    );

    // A fresh pod takes the retry once Conductor has timed the first attempt out.
    let (_, _pod) = task_pod_with("ws.crash", "{prefix: /}", controls, PER_ATTEMPT, &[]).await;
    let wf = after_the_timeout(&api, &id).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{wf}");
    assert_eq!(tasks[1]["retryCount"], 1);
    let head = lake.head(&repo).await;
    assert_eq!(tasks[1]["outputData"]["workspace"]["ref"], head.as_str());
    let commit = lake.client.get_commit(&repo, &head).await.unwrap();
    assert_eq!(
        commit.parents,
        vec![first.clone()],
        "published on top of the superseded commit"
    );
    assert_eq!(commit.metadata["perago.supersedes"], first);
    assert_eq!(commit.metadata["perago.expected_head"], first);
    assert_eq!(commit.metadata["perago.retry_count"], "1");
    assert_eq!(
        lake.client
            .get_commit(&repo, &first)
            .await
            .unwrap()
            .metadata["perago.logical_task_key"],
        commit.metadata["perago.logical_task_key"]
    );
    assert_eq!(
        lake.tree(&repo, &head, "").await,
        BTreeMap::from([
            ("keep.txt".to_owned(), "keep".to_owned()),
            ("only-second.txt".to_owned(), "y\n".to_owned()),
            ("shared.txt".to_owned(), "second\n".to_owned()),
        ]),
        "exactly the retry's workspace: the first attempt's own file is gone"
    );
    lake.assert_no_staging_branch(&repo).await;
}

#[tokio::test]
async fn a_stale_attempt_is_fenced_and_the_retry_publishes_once() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-stale", &[("keep.txt", "keep")]).await;
    let controls = "{retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 30}}";
    let body = format!(
        "if [ \"$PERAGO_RETRY_COUNT\" = 0 ]; then echo $$ > \"$T/first\"; while [ ! -f \"$T/go\" ]; do sleep 0.1; done; fi\n{PER_ATTEMPT}"
    );
    let (api, pod) = task_pod_with("ws.stale", "{prefix: /}", controls, &body, &[]).await;
    let id = start_on(&api, "ws.stale", "stale", &repo, &input).await;
    wait_file(&pod.path("first")).await;
    // The attempt stops being current while its body runs (as a timeout would end it).
    let wf = api.workflow(&id).await;
    let first = wf["tasks"][0]["taskId"].as_str().unwrap().to_owned();
    api.call(
        reqwest::Method::POST,
        "/tasks",
        Some(&json!({"workflowInstanceId": id, "taskId": first, "status": "FAILED", "workerId": "operator", "reasonForIncompletion": "timed out"})),
    )
    .await;
    let wf = api.finished(&id).await;
    assert_eq!(
        wf["status"], "COMPLETED",
        "the retry completed on the second slot: {wf}"
    );
    let published = lake.head(&repo).await;
    std::fs::write(pod.path("go"), "").unwrap();
    // The stale attempt reaches its fence and gives up without publishing.
    let started = std::time::Instant::now();
    while !pod.log().contains(&format!("\"reason\":\"{first}\"")) {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", pod.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lake.head(&repo).await, published, "published once");
    let log = lake
        .client
        .first_parent_log(&repo, &published, &input, 10)
        .await
        .unwrap()
        .0;
    assert_eq!(log.len(), 2, "one confirm commit above the input ref");
    assert_eq!(log[0].metadata["perago.retry_count"], "1");
    lake.assert_no_staging_branch(&repo).await;
}

#[tokio::test]
async fn histories_the_fence_cannot_classify_fail_closed() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-range", &[("a.txt", "a")]).await;
    let body = format!(
        "while [ ! -f \"$T/go\" ]; do sleep 0.1; done\necho b > \"$PERAGO_WORKSPACE/b.txt\"\n{COUNT_FILES}\n"
    );
    let (api, pod) = task_pod("ws.range", "{prefix: /}", &body).await;
    let id = start_on(&api, "ws.range", "range", &repo, &input).await;
    let key = format!("{id}:step:0:ws.range");
    for i in 0..1025 {
        lake.api(
            reqwest::Method::POST,
            &format!("/repositories/{repo}/branches/main/commits"),
            Some(
                json!({"message": format!("earlier publication {i}"), "allow_empty": true,
                        "metadata": {"perago.phase": "confirm", "perago.logical_task_key": key}}),
            ),
        )
        .await;
    }
    let head = lake.head(&repo).await;
    std::fs::write(pod.path("go"), "").unwrap();
    let wf = api.finished(&id).await;
    assert_eq!(
        only_task(&wf)["reasonForIncompletion"],
        "main advanced beyond supported publish range (1024 commits)"
    );
    assert_eq!(lake.head(&repo).await, head);

    // An input ref that is not in the target's history.
    let (repo, input) = lake.repository("ws-lost", &[("a.txt", "a")]).await;
    lake.client
        .create_branch(&repo, "side", &input)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s"), "side").unwrap();
    lake.client
        .upload(
            &repo,
            "side",
            "side.txt",
            &dir.path().join("s"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let side = lake
        .client
        .commit(&repo, "side", "side", &BTreeMap::new())
        .await
        .unwrap()
        .id;
    let wf = api
        .finished(
            &api.start(
                "ws.range",
                "lost",
                json!({"workspace": workspace(&repo, &side), "params": {}}),
            )
            .await,
        )
        .await;
    assert_eq!(
        only_task(&wf)["reasonForIncompletion"],
        format!("main no longer contains workspace input ref {side}")
    );
    lake.client.delete_branch(&repo, "side").await.unwrap();
    lake.assert_no_staging_branch(&repo).await;
}

/// The opt-in hard fence: with the pre-merge action installed, a branch that moves between the
/// publish fence and the merge makes lakeFS refuse the merge; without it the merge would land
/// on the moved head (the soft fence's window).
#[tokio::test]
async fn the_hard_fence_refuses_a_concurrent_advancement() {
    let lake = Lake::new().await;
    let hook = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/lakefs/perago-hard-fence.yaml"
    ))
    .unwrap();
    let body = format!("echo b > \"$PERAGO_WORKSPACE/b.txt\"\n{COUNT_FILES}\n");
    let (api, pod) = task_pod_with(
        "ws.hardfence",
        "{prefix: /}",
        "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}",
        &body,
        &[("PERAGO_FAULT", "pause-before-merge")],
    )
    .await;
    let paused = pod.path("work/paused-before-merge");
    let mut repos = Vec::new();
    for (guarded, case) in [(true, "guarded"), (false, "unguarded")] {
        let mut files = vec![("a.txt", "a")];
        if guarded {
            files.push(("_lakefs_actions/perago-hard-fence.yaml", hook.as_str()));
        }
        let (repo, input) = lake.repository(&format!("ws-hard-{case}"), &files).await;
        repos.push(repo.clone());
        let id = start_on(&api, "ws.hardfence", case, &repo, &input).await;
        wait_file_exists(&paused).await;
        let foreign = lake
            .write(
                &repo,
                &[("x.txt", "concurrent writer")],
                &[],
                "concurrent",
                BTreeMap::new(),
            )
            .await;
        std::fs::remove_file(&paused).unwrap();
        let wf = api.finished(&id).await;
        let t = only_task(&wf);
        if guarded {
            assert_eq!(t["status"], "FAILED", "{wf}");
            let reason = t["reasonForIncompletion"].as_str().unwrap();
            assert!(
                reason.starts_with(&format!("lakeFS merge on {repo}@main failed: HTTP 412")),
                "{reason}"
            );
            assert!(reason.contains("perago hard fence"), "{reason}");
            assert_eq!(lake.head(&repo).await, foreign, "the target is untouched");
            assert_eq!(t["outputData"]["result"]["files"], Value::Null);
        } else {
            assert_eq!(t["status"], "COMPLETED", "{wf}");
            let head = lake.head(&repo).await;
            assert_eq!(
                lake.client.get_commit(&repo, &head).await.unwrap().parents,
                vec![foreign.clone()]
            );
        }
        lake.assert_no_staging_branch(&repo).await;
    }
    // The pod learnt which target branch the hard fence guards, and warned about the other.
    let expected = [
        format!(
            "perago_sidecar_hard_fence_installed{{branch=\"main\",repository=\"{}\"}} 1",
            repos[0]
        ),
        format!(
            "perago_sidecar_hard_fence_installed{{branch=\"main\",repository=\"{}\"}} 0",
            repos[1]
        ),
    ];
    let metrics = pod
        .metrics_with(&expected.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    for line in &expected {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    let log = pod.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the hard fence is not installed"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains(&repos[1]), "{}", warnings[0]);
}

async fn wait_file_exists(path: &std::path::Path) {
    let started = std::time::Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A merge slower than the publish budget's merge timeout: the attempt fails with an uncertain
/// outcome, and the retry's publish fence classifies the branch whatever the first merge did.
#[tokio::test]
async fn a_merge_timeout_is_uncertain_and_the_retry_classifies_the_branch() {
    let lake = Lake::new().await;
    // A pre-merge action that is slow for first attempts only.
    let slow = r#"name: slow-first-merge
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
        end
"#;
    let (repo, input) = lake
        .repository(
            "ws-timeout",
            &[("keep.txt", "keep"), ("_lakefs_actions/slow.yaml", slow)],
        )
        .await;
    let controls = "{retry: {count: 1, delaySeconds: 0}, timeout: {responseSeconds: 30}, publishBudget: {observedMergeP99Seconds: 0, safetyMarginSeconds: 0, lakefsMergeTimeoutSeconds: 1, conductorCompletionTimeoutSeconds: 5, workerShutdownGraceSeconds: 5, heartbeatIntervalSeconds: 5}}";
    let (api, pod) = task_pod_with("ws.timeout", "{prefix: /}", controls, PER_ATTEMPT, &[]).await;
    let id = start_on(&api, "ws.timeout", "timeout", &repo, &input).await;
    let wf = api.finished(&id).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", pod.log());
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{wf}");
    let reason = tasks[0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("lakeFS merge on {repo}@main failed: ")),
        "{reason}"
    );
    assert!(
        pod.log().contains("the merge outcome is uncertain"),
        "{}",
        pod.log()
    );
    let head = lake.head(&repo).await;
    let commit = lake.client.get_commit(&repo, &head).await.unwrap();
    assert_eq!(commit.metadata["perago.retry_count"], "1");
    // Whether the first merge landed decides the base the retry chose; both are classified.
    let first_landed = commit.parents[0] != input;
    if first_landed {
        assert_eq!(commit.metadata["perago.supersedes"], commit.parents[0]);
    } else {
        assert_eq!(commit.metadata["perago.supersedes"], "");
    }
    let tree = lake.tree(&repo, &head, "").await;
    assert_eq!(tree.get("shared.txt").map(String::as_str), Some("second\n"));
    assert!(
        !tree.contains_key("only-first.txt"),
        "the prefix equals the retry's workspace: {tree:?}"
    );
    println!("first merge landed despite the timeout: {first_landed}");
}

/// A small tmpfs mounted for the length of a test, to play a work volume that fills up.
struct SmallVolume {
    dir: tempfile::TempDir,
}

impl SmallVolume {
    fn mount(size: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("perago-full-")
            .tempdir()
            .unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "perago-full"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs as the work volume failed (the full-disk test mounts one, \
             so it runs as root, as CI does): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Fill the volume to the last byte but `leave`.
    fn fill_leaving(&self, leave: u64) {
        let filler = self.path().join("filler");
        let err = std::fs::write(&filler, vec![0u8; 64 << 20]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull, "{err}");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&filler)
            .unwrap();
        let full = file.metadata().unwrap().len();
        file.set_len(full - leave).unwrap();
    }

    /// Every path in the volume, relative and sorted.
    fn entries(&self) -> Vec<String> {
        fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                out.push(path.strip_prefix(root).unwrap().display().to_string());
                if path.is_dir() && !path.is_symlink() {
                    walk(&path, root, out);
                }
            }
        }
        let mut names = Vec::new();
        walk(self.path(), self.path(), &mut names);
        names.sort();
        names
    }
}

impl Drop for SmallVolume {
    fn drop(&mut self) {
        // Lazily, so that a pod still holding its socket does not keep the mount.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[tokio::test]
async fn a_full_work_volume_fails_the_attempt_cleanly_and_the_workflow_retry_publishes() {
    let volume = SmallVolume::mount("4m");
    let lake = Lake::new().await;
    let big = "x".repeat(1 << 20);
    let (repo, input) = lake
        .repository(
            "ws-full",
            &[
                ("data/a.txt", "a"),
                ("data/b.txt", "b"),
                ("data/big.bin", &big),
            ],
        )
        .await;
    let body = format!("touch \"$T/ran\"\necho c > \"$PERAGO_WORKSPACE/c.txt\"\n{COUNT_FILES}\n");
    let work = volume.path().display().to_string();
    let controls = "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}";
    let (api, pod) = task_pod_with(
        "ws.full",
        "{prefix: /data}",
        controls,
        &body,
        &[("PERAGO_WORK_DIR", &work)],
    )
    .await;
    let idle = volume.entries();
    let mut idle_and_filler = idle.clone();
    idle_and_filler.push("filler".into());
    idle_and_filler.sort();
    let assert_untouched = async |why: &str| {
        assert!(!pod.path("ran").exists(), "{why}: the body never ran");
        assert_eq!(
            lake.head(&repo).await,
            input,
            "{why}: nothing was published"
        );
        lake.assert_no_staging_branch(&repo).await;
        assert_eq!(
            volume.entries(),
            idle_and_filler,
            "{why}: the attempt's directory is removed from the volume"
        );
    };

    // Full to the last byte: the execution directory cannot be made.
    volume.fill_leaving(0);

    let id = start_on(&api, "ws.full", "full", &repo, &input).await;
    let wf = api.finished(&id).await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "FAILED", "{wf}\n{}", pod.log());
    let reason = t["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.contains(&work) && reason.contains("No space left on device"),
        "the reason names the path and the OS error: {reason}"
    );
    assert_untouched("full volume").await;

    // Room for the directory and the small files, not for big.bin: the download fails.
    std::fs::remove_file(volume.path().join("filler")).unwrap();
    volume.fill_leaving(256 << 10);
    let retry = async || {
        api.call(
            reqwest::Method::POST,
            &format!("/workflow/{id}/retry"),
            None,
        )
        .await;
        api.finished(&id).await
    };
    let wf = retry().await;
    let last = wf["tasks"].as_array().unwrap().last().unwrap();
    assert_eq!(last["status"], "FAILED", "{wf}\n{}", pod.log());
    let reason = last["reasonForIncompletion"].as_str().unwrap();
    // Files download concurrently: once big.bin has taken the room, whichever write comes
    // next is the one that fails, a small file's as well.
    let names_a_download = ["a.txt", "b.txt", "big.bin"]
        .iter()
        .any(|file| reason.contains(&format!("workspace/{file} failed")));
    assert!(
        names_a_download && reason.contains("No space left on device"),
        "the reason names the file and the OS error: {reason}"
    );
    assert_untouched("volume filling up during the download").await;

    // Space is freed; retrying the workflow (what an operator does) publishes once.
    std::fs::remove_file(volume.path().join("filler")).unwrap();
    let wf = retry().await;
    let tasks = wf["tasks"].as_array().unwrap();
    let statuses: Vec<&str> = tasks
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["FAILED", "FAILED", "COMPLETED"],
        "{wf}\n{}",
        pod.log()
    );
    let head = lake.head(&repo).await;
    let commit = lake.client.get_commit(&repo, &head).await.unwrap();
    assert_eq!(commit.parents, vec![input.clone()], "one publication");
    assert_eq!(
        lake.tree(&repo, &head, "data/")
            .await
            .keys()
            .collect::<Vec<_>>(),
        ["data/a.txt", "data/b.txt", "data/big.bin", "data/c.txt"]
    );
    lake.assert_no_staging_branch(&repo).await;
    assert_eq!(
        volume.entries(),
        idle,
        "the volume is back to its idle state"
    );
    drop(pod);
}

#[tokio::test]
async fn an_unreachable_lakefs_fails_the_attempt_naming_the_call() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-down", &[("a.txt", "a")]).await;
    // A loopback port nothing listens on.
    let closed = format!(
        "http://127.0.0.1:{}",
        perago_e2e::process::free_port().unwrap()
    );
    let controls = "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}";
    let (api, pod) = task_pod_with(
        "ws.down",
        "{prefix: /}",
        controls,
        &format!("touch \"$T/ran\"\n{COUNT_FILES}\n"),
        &[("LAKECTL_SERVER_ENDPOINT_URL", &closed)],
    )
    .await;
    let wf = run_on(&api, "ws.down", "down", &repo, &input).await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "FAILED", "{wf}\n{}", pod.log());
    let reason = t["reasonForIncompletion"].as_str().unwrap();
    assert!(
        // Nothing listens: the reason says the request never went out.
        reason.starts_with(&format!(
            "lakeFS list objects on {repo}@{input} could not be sent: "
        )) && reason.contains("Connection refused"),
        "the reason names the call, the repository and ref, and the cause: {reason}"
    );
    assert!(!pod.path("ran").exists(), "the body never ran");
    let executions = pod.path("work/executions");
    assert_eq!(
        std::fs::read_dir(&executions).unwrap().count(),
        0,
        "no execution directory is left in {}",
        executions.display()
    );
    assert_eq!(lake.head(&repo).await, input);
}

/// Hostile object keys fail the attempt before the body runs, with a reason that says what
/// is wrong with the key and stays short enough for the cut to 500 characters to keep it.
#[tokio::test]
async fn hostile_object_keys_fail_the_attempt_naming_what_is_wrong() {
    let lake = Lake::new().await;
    let controls = "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}";
    let (api, pod) = task_pod_with(
        "ws.hostile",
        "{prefix: /data}",
        controls,
        &format!("touch \"$T/ran\"\n{COUNT_FILES}\n"),
        &[],
    )
    .await;
    let long = format!("data/{}.txt", "n".repeat(296));
    let cases = [
        (
            long.as_str(),
            "a segment ('nnnnnnnnnnnn…nnnnnnn.txt') is 300 bytes long, more than the 255 bytes a file or directory name may have",
        ),
        (
            "data/dir/",
            "it ends in '/': a folder marker object, not a file",
        ),
        ("data/a//b.txt", "it has an empty segment ('//')"),
        ("data/./x.txt", "it has a '.' segment"),
    ];
    for (i, (key, why)) in cases.into_iter().enumerate() {
        let (repo, input) = lake
            .repository(
                &format!("ws-hostile-{i}"),
                &[("data/ok.txt", "ok"), (key, "x")],
            )
            .await;
        let wf = run_on(&api, "ws.hostile", &format!("k{i}"), &repo, &input).await;
        let t = only_task(&wf);
        assert_eq!(t["status"], "FAILED", "{key}: {wf}");
        let reason = t["reasonForIncompletion"].as_str().unwrap();
        let suffix = format!("' cannot be projected into the workspace: {why}");
        if key.len() < 100 {
            assert_eq!(reason, format!("object key '{key}{suffix}"));
        } else {
            assert!(
                reason.starts_with("object key 'data/nnnn") && reason.ends_with(&suffix),
                "{reason}"
            );
        }
        assert!(
            !pod.log().contains("truncated task failure reason"),
            "{}",
            pod.log()
        );
    }
    assert!(!pod.path("ran").exists(), "the body never ran");
}

/// Reasons whose ref or prefix is long keep the cause: the lakeFS call is named with the
/// repository and a shortened ref, never with the request URL and its query.
#[tokio::test]
async fn a_long_reason_keeps_its_cause() {
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-long", &[("a.txt", "a")]).await;
    let controls = "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}";
    let body = format!("touch \"$T/ran\"\n{COUNT_FILES}\n");

    // A ref lakeFS does not know, 450 characters long.
    let (api, pod) = task_pod_with("ws.longref", "{prefix: /}", controls, &body, &[]).await;
    let unknown = "f".repeat(450);
    let wf = run_on(&api, "ws.longref", "ref", &repo, &unknown).await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "FAILED", "{wf}");
    let reason = t["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("lakeFS list objects on {repo}@ffff"))
            && reason.contains("f…f")
            && reason.contains("f failed: HTTP 404 Not Found"),
        "{reason}"
    );
    assert!(!pod.log().contains("truncated task failure reason"));

    // lakeFS unreachable, the listing's query holding a 500-character prefix.
    let closed = format!(
        "http://127.0.0.1:{}",
        perago_e2e::process::free_port().unwrap()
    );
    let prefix = format!("/{}/{}", "d".repeat(250), "e".repeat(250));
    let (api, pod) = task_pod_with(
        "ws.longprefix",
        &format!("{{prefix: {prefix}}}"),
        controls,
        &body,
        &[("LAKECTL_SERVER_ENDPOINT_URL", &closed)],
    )
    .await;
    let wf = run_on(&api, "ws.longprefix", "down", &repo, &input).await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "FAILED", "{wf}");
    let reason = t["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!(
            "lakeFS list objects on {repo}@{input} could not be sent: "
        )) && reason.ends_with("Connection refused (os error 111)"),
        "the cause survives: {reason}"
    );
    // Not "ddd": the input commit's id is hexadecimal and may hold that.
    assert!(
        !reason.contains(&"d".repeat(20)) && !reason.contains("127.0.0.1"),
        "no URL: {reason}"
    );
    assert!(!pod.path("ran").exists(), "the body never ran");
}

/// lakeFS refuses to delete staging branches here (a pre-delete-branch hook): the publication
/// stands, the task reports COMPLETED with it, and the failed cleanup is only logged.
#[tokio::test]
async fn a_failed_staging_cleanup_keeps_the_completed_result() {
    let lake = Lake::new().await;
    let keep_staging = r#"
name: keep-staging
on:
  pre-delete-branch:
    branches:
      - perago-staging-*
hooks:
  - id: refuse
    type: lua
    properties:
      script: error("staging branches are kept in this repository")
"#;
    let (repo, input) = lake
        .repository(
            "ws-keep",
            &[
                ("data/a.txt", "a"),
                ("_lakefs_actions/keep-staging.yaml", keep_staging),
            ],
        )
        .await;
    let body = format!("echo b > \"$PERAGO_WORKSPACE/b.txt\"\n{COUNT_FILES}\n");
    let (api, pod) = task_pod("ws.keep", "{prefix: /data}", &body).await;
    let wf = run_on(&api, "ws.keep", "keep", &repo, &input).await;
    let t = only_task(&wf);
    assert_eq!(t["status"], "COMPLETED", "{wf}\n{}", pod.log());
    let head = lake.head(&repo).await;
    assert_ne!(head, input);
    assert_eq!(
        t["outputData"],
        json!({"workspace": workspace(&repo, &head), "result": {"files": 2}})
    );
    let branches = lake.branches(&repo).await;
    assert_eq!(branches.len(), 2, "{branches:?}");
    assert!(
        branches.iter().any(|b| b.starts_with("perago-staging-")),
        "{branches:?}"
    );
    let log = pod.log();
    assert!(
        log.lines()
            .any(|l| l.contains("failed to clean staging workspace")
                && l.contains("staging branches are kept in this repository")),
        "the refused deletion is logged with lakeFS's reason:\n{log}"
    );
}

/// With a traces endpoint, each attempt is one trace in a real OpenTelemetry Collector: the
/// root span with the attempt's identity and outcome, and a span per phase in the order the
/// phases ran, the failed phase marked. The body continues the trace from `TRACEPARENT`.
#[tokio::test]
async fn each_attempt_is_one_trace_of_its_phases_in_the_collector() {
    let dir = services()
        .await
        .dir()
        .join(format!("traces-{}", std::process::id()));
    let collector = perago_e2e::collector::Collector::start(&dir, "127.0.0.1")
        .await
        .unwrap();
    let lake = Lake::new().await;
    let (repo, input) = lake.repository("ws-traces", &[("data/a.txt", "a")]).await;
    let body = format!(
        "echo \"$TRACEPARENT\" > \"$PERAGO_WORKSPACE/traceparent.txt\"\n\
         grep -q '\"n\":0' \"$PERAGO_PARAMS\" && exit 3\n{COUNT_FILES}\n"
    );
    let controls = "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}";
    let (api, pod) = task_pod_with(
        "ws.traces",
        "{prefix: /data}",
        controls,
        &body,
        &[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                collector.endpoint.as_str(),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    let mut runs = Vec::new();
    for (case, n) in [("published", 1), ("failed", 0)] {
        let input = json!({"workspace": workspace(&repo, &input), "params": {"n": n}});
        runs.push(
            api.finished(&api.start("ws.traces", case, input).await)
                .await,
        );
    }
    let (published, failed) = (only_task(&runs[0]), only_task(&runs[1]));
    assert_eq!(published["status"], "COMPLETED", "{}", pod.log());
    assert_eq!(failed["status"], "FAILED", "{}", pod.log());
    let ids: Vec<&str> = runs
        .iter()
        .map(|wf| wf["workflowId"].as_str().unwrap())
        .collect();
    let traces = collector
        .traces_where("perago.workflow.id", &ids, Duration::from_secs(30))
        .await
        .unwrap();
    let trace_of = |id: &str| {
        traces
            .iter()
            .find(|t| t[0].text("perago.workflow.id") == Some(id))
            .unwrap()
    };
    let names = |trace: &[perago_e2e::collector::Span]| -> Vec<String> {
        trace.iter().map(|s| s.name.clone()).collect()
    };

    let ok = trace_of(ids[0]);
    assert_eq!(
        names(ok),
        [
            "attempt", "poll", "input", "download", "body", "validate", "fence", "stage", "fence",
            "merge", "cleanup", "report", "sweep"
        ],
        "{ok:#?}"
    );
    let root = &ok[0];
    let head = lake.head(&repo).await;
    for (key, value) in [
        ("perago.task.type", "ws.traces"),
        ("perago.task.id", published["taskId"].as_str().unwrap()),
        ("perago.attempt.status", "COMPLETED"),
        ("perago.lakefs.repository", repo.as_str()),
        ("perago.lakefs.branch", "main"),
        ("perago.lakefs.input_ref", input.as_str()),
        ("perago.lakefs.commit", head.as_str()),
    ] {
        assert_eq!(root.text(key), Some(value), "{key}: {root:#?}");
    }
    assert_eq!(root.attributes["perago.attempt.retry_count"], "0");
    assert_eq!(root.resource["service.name"], "perago-sidecar");
    assert_eq!(root.error, None);
    // One trace; the phases are the root's children and follow one another.
    for span in &ok[1..] {
        assert_eq!(span.trace_id, root.trace_id);
        assert_eq!(span.parent_span_id, root.span_id, "{span:#?}");
        assert!(
            span.start >= root.start && span.end <= root.end,
            "{span:#?}"
        );
        assert_eq!(span.error, None, "{span:#?}");
    }
    for pair in ok[1..].windows(2) {
        assert!(pair[0].end <= pair[1].start, "{pair:#?}");
    }
    let download = &ok[3];
    assert_eq!(download.attributes["perago.workspace.objects"], "1");
    let stage = &ok[7];
    assert!(
        stage
            .text("perago.lakefs.staging_branch")
            .is_some_and(|b| b.starts_with("perago-staging-")),
        "{stage:#?}"
    );
    // The body saw its own span as the parent to continue from.
    let body_span = &ok[4];
    assert_eq!(
        lake.tree(&repo, &head, "data/").await["data/traceparent.txt"],
        format!("00-{}-{}-01\n", root.trace_id, body_span.span_id)
    );

    // The failed attempt: its body span and its root say why; no publication phases.
    let bad = trace_of(ids[1]);
    assert_eq!(
        names(bad),
        [
            "attempt", "poll", "input", "download", "body", "cleanup", "report"
        ],
        "{bad:#?}"
    );
    assert_eq!(bad[0].text("perago.attempt.status"), Some("FAILED"));
    assert_eq!(bad[0].text("perago.failure.reason"), Some("body_exited"));
    assert_eq!(bad[0].error.as_deref(), Some("FAILED: body_exited"));
    assert_eq!(bad[4].text("perago.failure.reason"), Some("body_exited"));
    assert!(
        bad[4].error.as_deref().is_some_and(|m| m.contains("3")),
        "{:#?}",
        bad[4]
    );
    assert!(
        bad[1..]
            .iter()
            .filter(|s| s.name != "body")
            .all(|s| s.error.is_none())
    );

    let metrics = pod
        .metrics_with(&["perago_sidecar_trace_spans_exported_total 20"])
        .await;
    assert!(
        metrics.contains("perago_sidecar_trace_spans_exported_total 20"),
        "{metrics}"
    );
    assert!(pod.stop().await.success());
}

/// An OpenLineage receiver the test owns: it takes every run event the sidecar POSTs,
/// validates it against the OpenLineage 2-0-2 JSON schema and the schemas of its facets (the
/// spec's own files, kept in e2e/openlineage), and answers 400 to one that is not valid.
struct LineageReceiver {
    url: String,
    received: std::sync::Arc<parking_lot::Mutex<Received>>,
}

#[derive(Default)]
struct Received {
    events: Vec<Value>,
    invalid: Vec<String>,
}

struct LineageSchemas {
    event: jsonschema::Validator,
    /// By `_schemaURL`.
    facets: BTreeMap<String, jsonschema::Validator>,
}

impl LineageSchemas {
    fn load() -> Self {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/openlineage");
        let documents: Vec<Value> = [
            "OpenLineage.json",
            "facets/ParentRunFacet.json",
            "facets/ErrorMessageRunFacet.json",
        ]
        .iter()
        .map(|f| serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap())
        .collect();
        let compile = |reference: &str| {
            let mut options = jsonschema::options().should_validate_formats(true);
            for d in &documents {
                options = options.with_resource(
                    d["$id"].as_str().unwrap(),
                    jsonschema::Resource::from_contents(d.clone()),
                );
            }
            options
                .build(&json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": reference}))
                .unwrap()
        };
        let event = compile(perago_sidecar::openlineage::SCHEMA_URL);
        let facets = [
            perago_sidecar::openlineage::PARENT_FACET_SCHEMA_URL,
            perago_sidecar::openlineage::ERROR_FACET_SCHEMA_URL,
        ]
        .into_iter()
        .map(|url| (url.to_owned(), compile(url)))
        .collect();
        Self { event, facets }
    }

    /// What makes `event` invalid, if anything.
    fn problems(&self, event: &Value) -> Vec<String> {
        let mut problems: Vec<String> = self
            .event
            .iter_errors(event)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        let facets = event["run"]["facets"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for (name, facet) in facets {
            let url = facet["_schemaURL"].as_str().unwrap_or_default();
            match self.facets.get(url) {
                None => problems.push(format!("facet {name}: no schema {url:?}")),
                Some(schema) => problems.extend(
                    schema
                        .iter_errors(&facet)
                        .map(|e| format!("facet {name} {}: {e}", e.instance_path())),
                ),
            }
        }
        problems
    }
}

impl LineageReceiver {
    async fn start() -> Self {
        use axum::http::StatusCode;
        let schemas = std::sync::Arc::new(LineageSchemas::load());
        // The validator is not vacuous: an event without a run id is refused.
        assert!(!schemas.problems(&json!({"eventType": "START"})).is_empty());
        let received = std::sync::Arc::new(parking_lot::Mutex::new(Received::default()));
        let state = (
            std::sync::Arc::clone(&schemas),
            std::sync::Arc::clone(&received),
        );
        let app = axum::Router::new()
            .route(
                "/api/v1/lineage",
                axum::routing::post(
                    |axum::extract::State((schemas, received)): axum::extract::State<(
                        std::sync::Arc<LineageSchemas>,
                        std::sync::Arc<parking_lot::Mutex<Received>>,
                    )>,
                     body: axum::body::Bytes| async move {
                        let event: Value = match serde_json::from_slice(&body) {
                            Ok(v) => v,
                            Err(e) => {
                                received.lock().invalid.push(format!("not JSON: {e}"));
                                return StatusCode::BAD_REQUEST;
                            }
                        };
                        let problems = schemas.problems(&event);
                        let mut r = received.lock();
                        let status = if problems.is_empty() {
                            StatusCode::CREATED
                        } else {
                            r.invalid.push(format!("{event}: {problems:?}"));
                            StatusCode::BAD_REQUEST
                        };
                        r.events.push(event);
                        status
                    },
                ),
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api/v1/lineage", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, received }
    }

    /// The events of run `run_id` in the order they came, once `count` of them have come (or
    /// after 30 s).
    async fn run(&self, run_id: &str, count: usize) -> Vec<Value> {
        let started = std::time::Instant::now();
        loop {
            let events: Vec<Value> = self
                .received
                .lock()
                .events
                .iter()
                .filter(|e| e["run"]["runId"] == run_id)
                .cloned()
                .collect();
            if events.len() >= count || started.elapsed() > Duration::from_secs(30) {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// With an OpenLineage endpoint, each attempt is a run of the job its task type names, in the
/// workflow run's parent: START when the body starts, then COMPLETE naming the input and the
/// published commits, or FAIL saying why. Every event is valid against the OpenLineage schema.
#[tokio::test]
async fn each_attempt_is_an_openlineage_run_of_its_task_type() {
    let receiver = LineageReceiver::start().await;
    let lake = Lake::new().await;
    let (repo, input) = lake
        .repository("ws-openlineage", &[("data/a.txt", "a")])
        .await;
    let body = format!(
        "grep -q '\"n\":0' \"$PERAGO_PARAMS\" && exit 3\n\
         echo x > \"$PERAGO_WORKSPACE/b.txt\"\n{COUNT_FILES}\n"
    );
    let controls = "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}";
    let (api, pod) = task_pod_with(
        "ws.openlineage",
        "{prefix: /data}",
        controls,
        &body,
        &[
            ("PERAGO_OPENLINEAGE_URL", receiver.url.as_str()),
            ("PERAGO_OPENLINEAGE_NAMESPACE", "perago-e2e"),
        ],
    )
    .await;
    let mut runs = Vec::new();
    for (case, n) in [("published", 1), ("failed", 0)] {
        let input = json!({"workspace": workspace(&repo, &input), "params": {"n": n}});
        runs.push(
            api.finished(&api.start("ws.openlineage", case, input).await)
                .await,
        );
    }
    let (published, failed) = (only_task(&runs[0]), only_task(&runs[1]));
    assert_eq!(published["status"], "COMPLETED", "{}", pod.log());
    assert_eq!(failed["status"], "FAILED", "{}", pod.log());
    let head = lake.head(&repo).await;
    assert_ne!(head, input);
    let namespace = lake.endpoint.replacen("http://", "lakefs://", 1);
    let dataset =
        |commit: &str| json!([{"namespace": namespace, "name": format!("{repo}/{commit}/data")}]);
    let run_id = |task: &Value| {
        perago_sidecar::openlineage::attempt_run_id(task["taskId"].as_str().unwrap())
    };

    let ok = receiver.run(&run_id(published), 2).await;
    let types = |events: &[Value]| -> Vec<String> {
        events
            .iter()
            .map(|e| e["eventType"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(types(&ok), ["START", "COMPLETE"], "{ok:#?}\n{}", pod.log());
    for event in &ok {
        assert_eq!(
            event["job"],
            json!({"namespace": "perago-e2e", "name": "ws.openlineage"})
        );
        assert_eq!(event["inputs"], dataset(&input), "{event:#}");
        let parent = &event["run"]["facets"]["parent"];
        assert_eq!(
            parent["job"],
            json!({"namespace": "perago-e2e", "name": "ws.openlineage.published"})
        );
        assert_eq!(parent["run"]["runId"], runs[0]["workflowId"], "{event:#}");
    }
    assert_eq!(ok[0]["outputs"], json!([]));
    assert_eq!(ok[1]["outputs"], dataset(&head), "the published commit");

    let bad = receiver.run(&run_id(failed), 2).await;
    assert_eq!(types(&bad), ["START", "FAIL"], "{bad:#?}");
    let error = &bad[1]["run"]["facets"]["errorMessage"];
    assert!(
        error["message"].as_str().is_some_and(|m| m.contains('3')),
        "the failure's reason: {error:#}"
    );
    assert_eq!(
        bad[1]["run"]["facets"]["parent"]["run"]["runId"],
        runs[1]["workflowId"]
    );
    assert_eq!(bad[1]["outputs"], json!([]));
    let invalid = receiver.received.lock().invalid.clone();
    assert!(invalid.is_empty(), "{invalid:#?}");
    let metrics = pod
        .metrics_with(&["perago_sidecar_openlineage_events_sent_total 4"])
        .await;
    assert!(
        metrics.contains("perago_sidecar_openlineage_events_sent_total 4"),
        "{metrics}"
    );
    assert!(pod.stop().await.success());
}

/// An OpenLineage endpoint that takes connections and never answers holds no attempt up:
/// the attempts complete as ever, and the events that could not be sent are counted.
#[tokio::test]
async fn an_openlineage_endpoint_that_never_answers_holds_no_attempt_up() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/api/v1/lineage", listener.local_addr().unwrap());
    // Accept and keep every connection, read nothing, answer nothing.
    let held = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let holder = std::sync::Arc::clone(&held);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            holder.lock().push(stream);
        }
    });
    let lake = Lake::new().await;
    let (repo, input) = lake
        .repository("ws-openlineage-down", &[("a.txt", "a")])
        .await;
    let (api, pod) = task_pod_with(
        "ws.openlineage.down",
        "{prefix: /}",
        "{retry: {count: 0, delaySeconds: 0}, timeout: {responseSeconds: 30}}",
        &format!("echo \"$PERAGO_TASK_ID\" > \"$PERAGO_WORKSPACE/b.txt\"\n{COUNT_FILES}\n"),
        &[
            ("PERAGO_OPENLINEAGE_URL", url.as_str()),
            ("PERAGO_OPENLINEAGE_TIMEOUT_MS", "300"),
            ("PERAGO_OPENLINEAGE_QUEUE_SIZE", "2"),
        ],
    )
    .await;
    // One after another, each on the commit the one before published.
    let started = std::time::Instant::now();
    let mut reference = input;
    for case in ["one", "two", "three"] {
        let wf = run_on(&api, "ws.openlineage.down", case, &repo, &reference).await;
        assert_eq!(only_task(&wf)["status"], "COMPLETED", "{wf}\n{}", pod.log());
        reference = lake.head(&repo).await;
    }
    let took = started.elapsed();
    let metrics = pod
        .metrics_with(&[
            "perago_sidecar_openlineage_events_dropped_total{reason=\"export_failed\"}",
        ])
        .await;
    let dropped: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("perago_sidecar_openlineage_events_dropped_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(dropped > 0, "{metrics}");
    assert!(
        metrics.contains("perago_sidecar_openlineage_events_sent_total 0"),
        "{metrics}"
    );
    assert!(!held.lock().is_empty(), "the sidecar did try the endpoint");
    println!("three attempts with the endpoint not answering: {took:?}, {dropped} events dropped");
    // A stop waits for the queue at most twice the request timeout.
    let stopping = std::time::Instant::now();
    assert!(pod.stop().await.success());
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopping.elapsed()
    );
}
