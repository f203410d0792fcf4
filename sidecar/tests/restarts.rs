//! The real servers restarted under a pod: Conductor keeping its workflows and queues in
//! PostgreSQL (beside lakeFS's metadata, objects in s3proxy) is killed and started again, and
//! what it held before is served after. Nothing is lost, nothing is published twice, no
//! staging branch is left.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use perago_e2e::Services;
use perago_e2e::lake::Lake;
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries, wait_file};
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_lakefs::LakeFsClient;
use perago_workspace::history;
use serde_json::{Value, json};

use support::{lakefs_env, services};

/// Register a workspace task (retries 3 s apart) and return its contract.
async fn register(api: &ConductorApi, name: &str) -> Value {
    support::register_workspace_task(api, name, 3, 3).await
}

async fn pod(api: &ConductorApi, contract: &Value, body: &str) -> Pod {
    let services = services().await;
    let hosts = services.lakefs().object_store_hosts();
    let env = lakefs_env(
        &services.lakefs().endpoint,
        &[("PERAGO_LAKEFS_OBJECT_STORE_HOSTS", hosts.as_str())],
    );
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    Pod::start(&bins, &api.base, contract, body, &env).await
}

/// The branch's history since `input` holds exactly one publication, the reported one, and
/// the repository no staging branch.
async fn published_once(lake: &Lake, repo: &str, branch: &str, input: &str, wf: &Value) {
    let client = LakeFsClient::new(
        &services().await.lakefs().endpoint,
        LAKEFS_ACCESS_KEY_ID,
        LAKEFS_SECRET_ACCESS_KEY,
        Duration::from_secs(30),
    )
    .unwrap();
    let (log, _) = client
        .first_parent_log(repo, branch, input, 50)
        .await
        .unwrap();
    let report = history::check(&log, input, &[]);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.standing().len(), 1, "{report:?}");
    let last = wf["tasks"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["outputData"]["workspace"]["ref"], json!(log[0].id));
    let staging = lake
        .get(&format!(
            "/repositories/{repo}/branches?prefix=perago-staging-"
        ))
        .await
        .unwrap();
    assert_eq!(staging["results"].as_array().unwrap().len(), 0, "{staging}");
}

const WRITE: &str = r#"
echo "$PERAGO_WORKFLOW_INSTANCE_ID" > "$PERAGO_WORKSPACE/run.txt"
printf '{"files": 2}' > "$PERAGO_RESULT"
"#;

#[tokio::test]
async fn a_restarted_conductor_keeps_its_queued_tasks_and_takes_the_report_it_missed() {
    let services = services().await;
    let conductor = services.conductor();
    let api = ConductorApi::new(&conductor.api_url);
    let lake = Lake::of(services.lakefs());
    let repo = format!("restarts-{}", std::process::id());
    let input = lake
        .seed(&repo, &[("data/seed.txt", "seed")])
        .await
        .unwrap();
    let contract = register(&api, "restarts.conductor").await;
    let start = |branch: &'static str| {
        let (api, repo, input) = (&api, &repo, &input);
        async move {
            lake_branch(services, repo, branch, input).await;
            api.start(
                "restarts.conductor",
                branch,
                json!({"workspace": {"repository": repo, "branch": branch, "refType": "commit", "ref": input}, "params": {}}),
            )
            .await
        }
    };

    // 1. Scheduled while no pod polls, Conductor killed and started again: the task waits in
    // the queue, and the first pod to poll takes it.
    let queued = start("queued").await;
    conductor
        .crash_and_restart(Duration::from_secs(1))
        .await
        .unwrap();
    let body = format!("echo started > \"$T/started\"; sleep 2\n{WRITE}");
    let pod = pod(&api, &contract, &body).await;
    let wf = api.finished(&queued).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", pod.log());
    published_once(&lake, &repo, "queued", &input, &wf).await;

    // 2. Killed while the attempt's body runs, so that the report finds it down: the pod
    // reports again until it is back, and the one attempt completes.
    std::fs::remove_file(pod.path("started")).unwrap();
    let reported = start("reported").await;
    wait_file(&pod.path("started")).await;
    conductor
        .crash_and_restart(Duration::from_secs(1))
        .await
        .unwrap();
    let wf = api.finished(&reported).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", pod.log());
    assert_eq!(
        wf["tasks"].as_array().unwrap().len(),
        1,
        "the attempt that ran through the restart completed: {wf}"
    );
    published_once(&lake, &repo, "reported", &input, &wf).await;
    drop(pod);
}

async fn lake_branch(services: &Services, repo: &str, branch: &str, input: &str) {
    Lake::of(services.lakefs())
        .post(
            &format!("/repositories/{repo}/branches"),
            json!({"name": branch, "source": input}),
        )
        .await
        .unwrap();
}
