//! `make demo`: the examples of `deploy/examples/` against the real servers.
//!
//! Starts Conductor and a Kubernetes control plane (etcd + kube-apiserver), installs the
//! PeragoTask CRD, applies every example PeragoTask, renders each one's TaskDef, registers it
//! in Conductor and reads it back. Then it runs the workspace-free example `notify-owner` as a
//! local pod (`perago-sidecar local`: the sidecar and `perago-runner` as two processes sharing
//! a directory) with a shell stand-in for its body, starts a workflow and prints the Conductor
//! result and the pod's metrics, and stops everything.

use std::path::Path;

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use perago_api::{PeragoTask, contract, taskdef, validate};
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::{Selection, Services};
use serde_json::json;

const MANAGER: &str = "perago-demo";

#[tokio::main]
async fn main() -> Result<()> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let started = std::time::Instant::now();
    let services = Services::start(Selection {
        conductor: true,
        kube: true,
        ..Selection::default()
    })
    .await?;
    let client = services.kube().client().await?;

    let crd: CustomResourceDefinition = serde_yaml::from_str(&std::fs::read_to_string(
        repo.join("crds/peragotasks.perago.io.yaml"),
    )?)?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "peragotasks.perago.io",
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await?;
    crds.get("peragotasks.perago.io").await?;
    println!(
        "installed CRD peragotasks.perago.io on {}",
        services.kube().server
    );
    // Give the apiserver a moment to serve the new resource.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;

    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()?;
    let conductor = &services.conductor().api_url;
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), "default");
    let mut examples: Vec<_> = std::fs::read_dir(repo.join("deploy/examples"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    examples.sort();
    for path in examples {
        let text = std::fs::read_to_string(&path)?;
        for item in
            perago_api::manifest::parse(&text).with_context(|| path.display().to_string())?
        {
            let task = item.task;
            let name = task.metadata.name.clone().unwrap_or_default();
            for warning in validate(&task.spec).map_err(|e| anyhow::anyhow!("{name}: {e}"))? {
                println!("  warning: {warning}");
            }
            tasks
                .patch(
                    &name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&task),
                )
                .await?;
            let doc = taskdef::render(&task.spec).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            let resp = http
                .post(format!("{conductor}/metadata/taskdefs"))
                .json(&[&doc])
                .send()
                .await?;
            if !resp.status().is_success() {
                bail!(
                    "registering {}: {} {}",
                    task.spec.task_name,
                    resp.status(),
                    resp.text().await?
                );
            }
            let stored: serde_json::Value = http
                .get(format!(
                    "{conductor}/metadata/taskdefs/{}",
                    task.spec.task_name
                ))
                .send()
                .await?
                .json()
                .await?;
            println!(
                "{name}: applied to kube-apiserver; TaskDef {} registered in Conductor (sha256 {}…, \
                 responseTimeoutSeconds={}, retryCount={}, inputKeys={})",
                task.spec.task_name,
                &taskdef::hash(&doc)[..12],
                stored["responseTimeoutSeconds"],
                stored["retryCount"],
                stored["inputKeys"],
            );
        }
    }
    run_workspace_free_example(&repo, conductor).await?;
    let listed = tasks.list(&Default::default()).await?;
    println!(
        "{} PeragoTasks stored in the apiserver; finished in {:.1?}",
        listed.items.len(),
        started.elapsed()
    );
    drop(services);
    Ok(())
}

/// Stand-in for `/app/notify`: reads params, records a metric, returns `delivered`.
const NOTIFY_BODY: &str = r#"
owner=$(python3 -c 'import json,os; print(json.load(open(os.environ["PERAGO_PARAMS"]))["owner"])')
echo "notify: telling $owner" >&2
printf '{"kind": "histogram", "name": "notifications_sent", "value": 1, "labels": {"channel": "email"}}\n' >> "$PERAGO_METRICS"
printf '{"delivered": true}' > "$PERAGO_RESULT"
"#;

async fn run_workspace_free_example(repo: &Path, conductor: &str) -> Result<()> {
    let text = std::fs::read_to_string(repo.join("deploy/examples/workspace-free-task.yaml"))?;
    let task = perago_api::manifest::parse(&text)?.remove(0).task;
    let contract = contract::render(&task.spec).map_err(|e| anyhow::anyhow!("{e}"))?;
    let dir = std::env::current_exe()?
        .parent()
        .context("locating the build directory")?
        .to_owned();
    let bins = PodBinaries {
        sidecar: dir.join("perago-sidecar"),
        runner: dir.join("perago-runner"),
    };
    if !bins.sidecar.is_file() || !bins.runner.is_file() {
        bail!("build the sidecar first: cargo build -p perago-sidecar");
    }
    let pod = Pod::start(
        &bins,
        conductor,
        &serde_json::to_value(&contract)?,
        NOTIFY_BODY,
        &[("PERAGO_LOG", "warn")],
    )
    .await;
    let api = ConductorApi::new(conductor);
    let input = json!({"params": {"owner": "data-platform", "message": "orders refreshed",
                                  "priority": "undeclared, dropped"}});
    let workflow = api.start(&task.spec.task_name, "demo", input).await;
    let finished = api.finished(&workflow).await;
    let step = &finished["tasks"][0];
    println!(
        "notify-owner: workflow {workflow} {}; task {} by worker {} with output {}",
        finished["status"], step["status"], step["workerId"], step["outputData"]
    );
    let metrics = pod
        .metrics_with(&["perago_sidecar_attempts_total{status=\"COMPLETED\"} 1"])
        .await;
    for line in metrics.lines().filter(|l| {
        l.starts_with("app_notifications_sent_count")
            || l.starts_with("perago_sidecar_attempts_total")
            || l.starts_with("runtime_task_attempt_duration_seconds_count")
    }) {
        println!("  metric {line}");
    }
    pod.stop().await;
    Ok(())
}
