//! `make demo`: a workflow step that writes files, from PeragoTask to lakeFS commit, on the real
//! servers and a real single-node Kubernetes.
//!
//! 1. Starts Conductor, lakeFS and the node (etcd, kube-apiserver, controller-manager,
//!    scheduler, containerd, kubelet, kube-proxy) and an OCI registry, to which the project is
//!    released as `make release` does it (amd64).
//! 2. `helm install`s the operator from the released chart (`oci://…`); its pod pulls the
//!    images from the registry and reaches the API through the `kubernetes` Service.
//! 3. `kubectl apply`s the example PeragoTasks of `deploy/examples/` into a namespace that
//!    enforces Pod Security `restricted`. Their body images are placeholders
//!    (`registry.example.com/...`), so the demo runs them on a busybox image, with a shell
//!    script for `features-build`'s body. The operator registers each TaskDef in Conductor and
//!    runs each task's executor pods; `kubectl wait` sees the tasks Ready.
//! 4. Seeds a lakeFS repository, runs a Conductor workflow whose step turns `raw/*.wav` into
//!    `features/*.parquet` in the `features-build` executor pod, and prints the task result, the
//!    squash commit with its `perago.*` metadata, the files and the pod's logs.
//! 5. Deletes the PeragoTasks (the operator's finalizer runs), uninstalls the operator and stops
//!    everything.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use perago_e2e::cluster::{Cluster, OPERATOR_NAMESPACE, RELEASE};
use perago_e2e::lake::Lake;
use perago_e2e::node::BUSYBOX_BODY_IMAGE;
use perago_e2e::pod::ConductorApi;
use perago_e2e::{Selection, Services};
use serde_json::json;

const NAMESPACE: &str = "demo";
const TASK: &str = "features-build";

/// Stand-in for the `features:1.4.0` image's `python -m features.build`, run by busybox's `sh`: one feature file per
/// raw render inside the requested window, then the result the task declares.
const FEATURES_BODY: &str = r#"
set -eu
cd "$PERAGO_WORKSPACE"
mkdir -p features
rows=0; files=""
for wav in raw/*.wav; do
  name=$(basename "$wav" .wav)
  printf 'features of %s: %s bytes\n' "$name" "$(wc -c < "$wav")" > "features/$name.parquet"
  rows=$((rows + 1)); files="$files${files:+,}\"features/$name.parquet\""
done
echo "features.build: $rows renders, params $(cat "$PERAGO_PARAMS")" >&2
printf '{"rows": %d, "files": [%s]}' "$rows" "$files" > "$PERAGO_RESULT"
"#;

fn section(title: &str) {
    println!("\n== {title}");
}

/// Print a command as a user would type it, then its output.
fn shown(cluster: &Cluster, args: &[&str]) -> Result<()> {
    println!("$ kubectl {}", args.join(" "));
    for line in cluster.kubectl(args)?.lines() {
        println!("  {line}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let started = Instant::now();

    section("real servers and a single-node Kubernetes");
    let services = Services::start(Selection::ALL).await?;
    println!("Conductor      {}", services.conductor().api_url);
    println!("lakeFS         {}", services.lakefs().endpoint);
    println!("kube-apiserver {}", services.kube().server);
    println!("(servers listen on the pod bridge's address; the pods reach them there)");
    let cluster = Cluster::new(&services)?;
    shown(&cluster, &["get", "nodes", "-o", "wide"])?;

    section("helm install");
    println!(
        "$ helm install {RELEASE} charts/perago-operator -n {OPERATOR_NAMESPACE} --set conductor.url=… --wait"
    );
    let took = cluster.install_operator(&[])?;
    println!("operator available in {took:.1?}");
    shown(&cluster, &["get", "pods", "-n", OPERATOR_NAMESPACE])?;

    section("kubectl apply -k deploy/examples");
    cluster.task_namespace(NAMESPACE)?;
    println!(
        "namespace {NAMESPACE} (Pod Security restricted) with Secret lakefs-credentials; the \
         examples' body images are placeholders, run here on {BUSYBOX_BODY_IMAGE}"
    );
    let examples = cluster.kubectl(&["kustomize", "deploy/examples"])?;
    let mut manifests = Vec::new();
    for mut task in perago_e2e::yaml_documents(&examples) {
        let name = task["metadata"]["name"].as_str().unwrap_or("").to_owned();
        task["metadata"]["namespace"] = NAMESPACE.into();
        if task["kind"] != "PeragoTask" {
            // The examples' PodDisruptionBudget, as it is.
            manifests.push(serde_yaml::to_string(&task)?);
            continue;
        }
        let body = &mut task["spec"]["executor"]["body"];
        body["image"] = BUSYBOX_BODY_IMAGE.into();
        if name == TASK {
            body["command"] = serde_yaml::to_value(["sh", "-c", FEATURES_BODY])?;
            // The shell needs far less than the Python image the example sizes it for.
            body["resources"] = serde_yaml::to_value(json!({
                "requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}
            }))?;
        }
        manifests.push(serde_yaml::to_string(&task)?);
    }
    for line in cluster.apply(&manifests.join("---\n"))?.lines() {
        println!("  {line}");
    }
    let waited = Instant::now();
    let ready = cluster.kubectl(&[
        "wait",
        "-n",
        NAMESPACE,
        "--for=condition=Ready",
        "peragotask",
        "--all",
        "--timeout=180s",
    ]);
    if let Err(e) = ready {
        let pods = cluster.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "wide"])?;
        let events = cluster.kubectl(&["get", "events", "-n", NAMESPACE])?;
        bail!("{e:#}\n{pods}\n{events}");
    }
    println!("all PeragoTasks Ready in {:.1?}", waited.elapsed());
    shown(&cluster, &["get", "peragotasks", "-n", NAMESPACE])?;
    shown(&cluster, &["get", "pods", "-n", NAMESPACE, "-o", "wide"])?;

    section("lakeFS input");
    let lake = Lake::of(services.lakefs());
    let repository = format!("audio-{}", std::process::id());
    let input_ref = lake
        .seed(
            &repository,
            &[
                (
                    "audio/render/raw/manifest.json",
                    r#"{"renders": ["intro", "outro"]}"#,
                ),
                ("audio/render/raw/intro.wav", "RIFF intro samples"),
                ("audio/render/raw/outro.wav", "RIFF outro samples, longer"),
                ("audio/other/untouched.txt", "outside the task's prefix"),
            ],
        )
        .await?;
    println!("repository {repository}, main at {input_ref}");
    for (key, size) in lake.tree(&repository, &input_ref).await? {
        println!("  {key} ({size} bytes)");
    }

    section("Conductor workflow");
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = run_workflow(&conductor, &repository, &input_ref).await;
    let finished = conductor.finished(&workflow).await;
    let step = &finished["tasks"][0];
    println!(
        "workflow {workflow}: {}; task {} ({}) by worker {}",
        finished["status"], step["taskType"], step["status"], step["workerId"]
    );
    println!(
        "task output: {}",
        serde_json::to_string_pretty(&step["outputData"])?
    );
    let pod = cluster.kubectl(&[
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        &format!("perago.io/task={TASK}"),
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])?;
    if step["status"] != "COMPLETED" {
        bail!(
            "the demo task did not complete: {}",
            step["reasonForIncompletion"]
        );
    }

    section("lakeFS after the step");
    let head = step["outputData"]["workspace"]["ref"]
        .as_str()
        .context("the task output names no workspace ref")?
        .to_owned();
    let commit = lake
        .get(&format!("/repositories/{repository}/commits/{head}"))
        .await?;
    println!(
        "commit {head} on main: \"{}\" by {}, parents {}",
        commit["message"].as_str().unwrap_or(""),
        commit["committer"].as_str().unwrap_or(""),
        commit["parents"]
    );
    if let Some(metadata) = commit["metadata"].as_object() {
        for (key, value) in metadata.iter().filter(|(k, _)| k.starts_with("perago.")) {
            println!("  {key} = {}", value.as_str().unwrap_or(""));
        }
    }
    println!("files at {head}:");
    for (key, size) in lake.tree(&repository, &head).await? {
        let text = if key.contains("/features/") {
            format!(
                ": {}",
                lake.object(&repository, &head, &key).await?.trim_end()
            )
        } else {
            String::new()
        };
        println!("  {key} ({size} bytes){text}");
    }
    let branches = lake
        .get(&format!("/repositories/{repository}/branches"))
        .await?;
    println!(
        "branches: {} (the execution's staging branch is gone)",
        branches["results"]
            .as_array()
            .map(|b| b
                .iter()
                .filter_map(|b| b["id"].as_str())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );

    section("the executor pod that ran the step");
    if !pod.is_empty() {
        println!("$ kubectl logs -n {NAMESPACE} {pod} -c perago-sidecar | grep {workflow}");
        let log = cluster.kubectl(&["logs", "-n", NAMESPACE, &pod, "-c", "perago-sidecar"])?;
        for line in log.lines().filter(|l| l.contains(&workflow)).take(8) {
            println!("  {line}");
        }
        shown(&cluster, &["logs", "-n", NAMESPACE, &pod, "-c", "body"])?;
    }

    section("cleanup");
    shown(
        &cluster,
        &[
            "delete",
            "peragotasks",
            "--all",
            "-n",
            NAMESPACE,
            "--wait",
            "--timeout=120s",
        ],
    )?;
    println!("PeragoTasks deleted (deletionPolicy Retain: the TaskDefs stay in Conductor)");
    cluster.helm(&["uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait"])?;
    println!("operator uninstalled");
    drop(services);
    println!(
        "finished in {:.1?} (the node is cleaned up in the background)",
        started.elapsed()
    );
    Ok(())
}

/// A one-step workflow whose step reads the workspace and params from the workflow input.
async fn run_workflow(conductor: &ConductorApi, repository: &str, input_ref: &str) -> String {
    let workflow = json!({
        "name": "audio_features", "version": 1, "schemaVersion": 2,
        "ownerEmail": "data-platform@example.com",
        "tasks": [{"name": "features.build", "taskReferenceName": "build_features", "type": "SIMPLE",
                   "inputParameters": {"workspace": "${workflow.input.workspace}",
                                       "params": "${workflow.input.params}"}}],
    });
    conductor
        .call(
            reqwest::Method::PUT,
            "/metadata/workflow",
            Some(&json!([workflow])),
        )
        .await;
    let input = json!({
        "workspace": {"repository": repository, "branch": "main", "refType": "commit", "ref": input_ref},
        "params": {"window": {"start": 0, "end": 60}, "mode": "exact"},
    });
    println!("start audio_features with input {input}");
    let id = conductor
        .call(
            reqwest::Method::POST,
            "/workflow/audio_features",
            Some(&input),
        )
        .await;
    id.as_str().unwrap_or_default().to_owned()
}
