//! A long-lived body that speaks the runner protocol itself (`docs/examples/long_lived_body.py`)
//! in place of `perago-runner`, against the real Conductor: one process serves many attempts,
//! and when it crashes in the middle of one, that attempt fails with the runner's reason, the
//! body is started again (as the kubelet restarts a container) and the next attempts complete
//! in the new process.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use perago_api::{contract, manifest, taskdef};
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::{Selection, shared};
use serde_json::{Value, json};

const TASK: &str = "e2e.long_lived";

fn long_lived_body() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/examples/long_lived_body.py"
    ))
}

async fn conductor() -> ConductorApi {
    let services = shared(Selection {
        conductor: true,
        ..Selection::default()
    })
    .await;
    ConductorApi::new(&services.conductor().api_url)
}

async fn declare(api: &ConductorApi) -> Value {
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: t}}
spec:
  taskName: {TASK}
  ownerEmail: e2e@example.com
  paramsSchema: {{type: object, properties: {{n: {{type: integer}}, crash: {{type: boolean}}}}, required: [n]}}
  resultSchema: {{type: object, properties: {{total: {{type: integer}}, pid: {{type: integer}}}}, required: [total, pid]}}
  controls: {{retry: {{count: 0}}, timeout: {{responseSeconds: 30}}}}
  executor: {{body: {{image: body, command: [python3, /app/long_lived_body.py]}}, slots: 2}}
"#
    );
    let spec = manifest::parse(&yaml).unwrap().remove(0).task.spec;
    api.call(
        reqwest::Method::POST,
        "/metadata/taskdefs",
        Some(&json!([taskdef::render(&spec).unwrap()])),
    )
    .await;
    serde_json::to_value(contract::render(&spec).unwrap()).unwrap()
}

/// One one-step workflow per params, 4 at a time; their final states in order.
async fn run(api: &ConductorApi, case: &str, params: &[Value]) -> Vec<Value> {
    let mut finished = Vec::new();
    for batch in params.chunks(4) {
        let mut ids = Vec::new();
        for p in batch {
            ids.push(api.start(TASK, case, json!({"params": p})).await);
        }
        for id in ids {
            finished.push(api.finished(&id).await);
        }
    }
    finished
}

fn pid_of(wf: &Value) -> u64 {
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    wf["tasks"][0]["outputData"]["result"]["pid"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn a_long_lived_body_serves_many_attempts_and_survives_its_own_crash() {
    let api = conductor().await;
    let contract = declare(&api).await;
    let bins = PodBinaries {
        runner: long_lived_body(),
        ..PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"))
    };
    let pod = Pod::start(&bins, &api.base, &contract, "", &[]).await;

    let many: Vec<Value> = (0..12).map(|n| json!({"n": n})).collect();
    let first = run(&api, "many", &many).await;
    for (n, wf) in first.iter().enumerate() {
        assert_eq!(
            wf["tasks"][0]["outputData"]["result"]["total"],
            2 * n as u64,
            "{wf}"
        );
    }
    let pids: BTreeSet<u64> = first.iter().map(pid_of).collect();
    assert_eq!(
        pids.len(),
        1,
        "one process served all 12 attempts: {pids:?}"
    );

    let crashed = run(&api, "crash", &[json!({"n": 1, "crash": true})]).await;
    let task = &crashed[0]["tasks"][0];
    assert_eq!(task["status"], "FAILED", "{}", crashed[0]);
    let reason = task["reasonForIncompletion"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("executor process for worker ")
            && reason.contains(" exited while running task "),
        "{reason}"
    );

    let after = run(&api, "after", &many[..4]).await;
    let new_pids: BTreeSet<u64> = after.iter().map(pid_of).collect();
    assert_eq!(new_pids.len(), 1, "{new_pids:?}");
    assert!(
        new_pids.is_disjoint(&pids),
        "a new process served the attempts after the crash: {new_pids:?} vs {pids:?}\n{}",
        pod.log()
    );
    pod.stop().await;
}
