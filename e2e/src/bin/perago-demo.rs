//! `make demo`: a workflow step that writes files, from PeragoTask to lakeFS commit, on the real
//! servers.
//!
//! 1. Starts Conductor, lakeFS and a Kubernetes control plane (etcd + kube-apiserver), and the
//!    operator (`perago-operator run`) against that apiserver.
//! 2. `kubectl apply`s the CRD, a lakeFS credentials Secret and the example PeragoTasks of
//!    `deploy/examples/`; the operator registers each TaskDef in Conductor and renders each
//!    task's contract ConfigMap and executor Deployment.
//! 3. There is no kubelet here, so the `features-build` pod is played locally: the sidecar and
//!    `perago-runner` as two processes sharing a directory, with the contract from the
//!    operator's ConfigMap and the sidecar environment from its Deployment. A shell script
//!    stands in for the body image.
//! 4. Seeds a lakeFS repository, runs a Conductor workflow whose step turns `raw/*.wav` into
//!    `features/*.parquet`, and prints the task result, the squash commit with its `perago.*`
//!    metadata, and the files.
//! 5. Deletes the PeragoTasks (the operator's finalizer runs) and stops everything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use perago_api::PeragoTask;
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::process::{ServerProcess, free_port, obtain};
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, Services};
use serde_json::{Value, json};

const NAMESPACE: &str = "demo";
const TASK: &str = "features-build";
/// Environment the local pod sets itself (paths and ports of this machine, not the pod's).
const LOCAL_ENV: [&str; 4] = [
    "PERAGO_TASK_CONTRACT",
    "PERAGO_WORK_DIR",
    "PERAGO_HTTP_ADDR",
    "POD_NAME",
];

/// Stand-in for the `features:1.4.0` image's `python -m features.build`: one feature file per
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

#[tokio::main]
async fn main() -> Result<()> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let started = Instant::now();
    let bins = build_dir()?;

    section("real servers");
    let services = Services::start(Selection {
        conductor: true,
        lakefs: true,
        kube: true,
    })
    .await?;
    println!("Conductor      {}", services.conductor().api_url);
    println!("lakeFS         {}", services.lakefs().endpoint);
    println!("kube-apiserver {}", services.kube().server);
    let kubectl = Kubectl {
        binary: obtain("kubectl")?,
        kubeconfig: services.kube().kubeconfig.clone(),
        repo: repo.clone(),
    };
    let client = services.kube().client().await?;

    section("operator");
    let operator = start_operator(&bins, &services)?;
    println!(
        "perago-operator run (log: {})",
        operator.log_path().display()
    );

    section("kubectl apply");
    kubectl.run(&[
        "apply",
        "--server-side",
        "-f",
        "crds/peragotasks.perago.io.yaml",
    ])?;
    kubectl.run(&[
        "wait",
        "--for=condition=Established",
        "crd/peragotasks.perago.io",
        "--timeout=60s",
    ])?;
    kubectl.run(&["create", "namespace", NAMESPACE])?;
    kubectl.run(&[
        "create",
        "secret",
        "generic",
        "lakefs-credentials",
        "-n",
        NAMESPACE,
        &format!("--from-literal=LAKECTL_CREDENTIALS_ACCESS_KEY_ID={LAKEFS_ACCESS_KEY_ID}"),
        &format!("--from-literal=LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY={LAKEFS_SECRET_ACCESS_KEY}"),
    ])?;
    kubectl.run(&[
        "apply",
        "--server-side",
        "-k",
        "deploy/examples",
        "-n",
        NAMESPACE,
    ])?;

    section("what the operator made of them");
    let tasks: Api<PeragoTask> = Api::namespaced(client.clone(), NAMESPACE);
    let conductor = ConductorApi::new(&services.conductor().api_url);
    for task in wait_registered(&tasks, &operator).await? {
        let name = task.metadata.name.clone().unwrap_or_default();
        let status = task.status.clone().unwrap_or_default();
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
        let def = conductor
            .call(
                reqwest::Method::GET,
                &format!("/metadata/taskdefs/{}", task.spec.task_name),
                None,
            )
            .await;
        println!(
            "{name}: TaskDef {} in Conductor (retryCount {}, responseTimeoutSeconds {}, sha256 {}…); \
             Deployment replicas {}; Ready={} {}",
            task.spec.task_name,
            def["retryCount"],
            def["responseTimeoutSeconds"],
            status
                .task_def_hash
                .as_deref()
                .unwrap_or("")
                .get(..12)
                .unwrap_or(""),
            status.replicas.unwrap_or_default(),
            ready.map_or("?", |c| c.status.as_str()),
            ready.map_or("", |c| c.reason.as_str()),
        );
    }
    println!("(Ready=False: no kubelet runs pods here; the features-build pod is played locally)");

    section("lakeFS input");
    let lake = Lake::new(&services.lakefs().endpoint);
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

    section("the pod, played locally");
    println!(
        "Deployment {TASK}-perago as rendered; played as perago-sidecar local + perago-runner \
         with the contract of ConfigMap {TASK}-perago and the sidecar's environment:"
    );
    let pod = start_pod(&client, &bins, &services).await?;

    section("Conductor workflow");
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
    if step["status"] != "COMPLETED" {
        println!("{}", pod.log());
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
    let metrics = pod
        .metrics_with(&["perago_sidecar_attempts_total{status=\"COMPLETED\"} 1"])
        .await;
    for line in metrics.lines().filter(|l| {
        l.starts_with("perago_sidecar_attempts_total")
            || l.starts_with("perago_sidecar_phase_duration_seconds_count")
            || l.starts_with("runtime_workspace_io_bytes_sum")
    }) {
        println!("  metric {line}");
    }

    section("cleanup");
    pod.stop().await;
    kubectl.run(&[
        "delete",
        "-k",
        "deploy/examples",
        "-n",
        NAMESPACE,
        "--wait",
        "--timeout=60s",
    ])?;
    println!("PeragoTasks deleted (deletionPolicy Retain: the TaskDefs stay in Conductor)");
    drop(operator);
    drop(services);
    println!("finished in {:.1?}", started.elapsed());
    Ok(())
}

/// The directory of this binary, where `make demo` built the operator and sidecar binaries.
fn build_dir() -> Result<PathBuf> {
    let dir = std::env::current_exe()?
        .parent()
        .context("locating the build directory")?
        .to_owned();
    for bin in ["perago-operator", "perago-sidecar", "perago-runner"] {
        if !dir.join(bin).is_file() {
            bail!("{bin} is not built: run `make demo` (it builds the operator and the sidecar)");
        }
    }
    Ok(dir)
}

fn start_operator(bins: &Path, services: &Services) -> Result<ServerProcess> {
    let http = free_port()?;
    let mut command = Command::new(bins.join("perago-operator"));
    command
        .arg("run")
        .env("KUBECONFIG", &services.kube().kubeconfig)
        .env("PERAGO_CONDUCTOR_URL", &services.conductor().api_url)
        .env("PERAGO_LAKEFS_ENDPOINT", &services.lakefs().endpoint)
        .env("PERAGO_LAKEFS_CREDENTIALS_SECRET", "lakefs-credentials")
        .env("PERAGO_LEADER_ELECTION", "false")
        .env("PERAGO_RESYNC_SECONDS", "2")
        .env("PERAGO_HTTP_ADDR", format!("127.0.0.1:{http}"));
    ServerProcess::spawn(
        "perago-operator",
        &mut command,
        services.dir().join("operator.log"),
    )
}

/// Every PeragoTask of the namespace once the operator has registered its TaskDef.
async fn wait_registered(
    tasks: &Api<PeragoTask>,
    operator: &ServerProcess,
) -> Result<Vec<PeragoTask>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = tasks.list(&Default::default()).await?.items;
        if !list.is_empty()
            && list
                .iter()
                .all(|t| t.status.as_ref().is_some_and(|s| s.task_def_hash.is_some()))
        {
            return Ok(list);
        }
        if Instant::now() > deadline {
            bail!(
                "the operator registered no TaskDef within 60 s; its log:\n{}",
                operator.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The `features-build` pod as the operator rendered it: contract from the ConfigMap, sidecar
/// environment from the Deployment (Secret references resolved), local paths and ports.
async fn start_pod(client: &kube::Client, bins: &Path, services: &Services) -> Result<Pod> {
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .get(&format!("{TASK}-perago"))
        .await?;
    let contract: Value = serde_json::from_str(
        config_map
            .data
            .as_ref()
            .and_then(|d| d.get("contract.json"))
            .context("the ConfigMap holds no contract.json")?,
    )?;
    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(&format!("{TASK}-perago"))
        .await?;
    let pod_spec = deployment
        .spec
        .and_then(|s| s.template.spec)
        .context("the Deployment has no pod template")?;
    let inits = pod_spec.init_containers.unwrap_or_default();
    for c in &inits {
        let kind = if c.restart_policy.as_deref() == Some("Always") {
            "native sidecar"
        } else {
            "init container"
        };
        println!("  {kind} {}: {}", c.name, command_line(c));
    }
    for c in &pod_spec.containers {
        println!("  container {}: {}", c.name, command_line(c));
    }
    let sidecar = inits
        .into_iter()
        .find(|c| c.restart_policy.as_deref() == Some("Always"))
        .context("the Deployment has no native sidecar")?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let mut env = Vec::new();
    for var in sidecar.env.unwrap_or_default() {
        if LOCAL_ENV.contains(&var.name.as_str()) {
            continue;
        }
        let value = match (var.value, var.value_from.and_then(|v| v.secret_key_ref)) {
            (Some(value), _) => value,
            (None, Some(reference)) => {
                let secret = secrets.get(&reference.name).await?;
                let bytes = secret
                    .data
                    .and_then(|mut d| d.remove(&reference.key))
                    .with_context(|| {
                        format!("Secret {} has no {}", reference.name, reference.key)
                    })?;
                String::from_utf8(bytes.0)?
            }
            _ => continue,
        };
        env.push((var.name, value));
    }
    env.push(("POD_NAME".into(), format!("{TASK}-local")));
    env.push(("PERAGO_WORKER_ID_PREFIX".into(), "demo".into()));
    env.push(("PERAGO_LOG".into(), "warn".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let binaries = PodBinaries {
        sidecar: bins.join("perago-sidecar"),
        runner: bins.join("perago-runner"),
    };
    Ok(Pod::start(
        &binaries,
        &services.conductor().api_url,
        &contract,
        FEATURES_BODY,
        &env,
    )
    .await)
}

fn command_line(container: &k8s_openapi::api::core::v1::Container) -> String {
    let words: Vec<&str> = [&container.command, &container.args]
        .into_iter()
        .flatten()
        .flatten()
        .map(String::as_str)
        .collect();
    format!(
        "{} {}",
        container.image.as_deref().unwrap_or(""),
        words.join(" ")
    )
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

struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
    repo: PathBuf,
}

impl Kubectl {
    /// Run kubectl in the repository, echoing the command and its output.
    fn run(&self, args: &[&str]) -> Result<()> {
        let shown: Vec<&str> = args
            .iter()
            .map(|a| {
                if a.contains("SECRET_ACCESS_KEY=") {
                    "--from-literal=…"
                } else {
                    a
                }
            })
            .collect();
        println!("$ kubectl {}", shown.join(" "));
        let out = Command::new(&self.binary)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .current_dir(&self.repo)
            .output()?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("  {line}");
        }
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                shown.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

/// The few lakeFS calls the demo makes as a user would, with the harness's admin key.
struct Lake {
    endpoint: String,
    http: reqwest::Client,
}

impl Lake {
    fn new(endpoint: &str) -> Self {
        Self {
            endpoint: format!("{endpoint}/api/v1"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap_or_default(),
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<String> {
        let resp = request
            .basic_auth(LAKEFS_ACCESS_KEY_ID, Some(LAKEFS_SECRET_ACCESS_KEY))
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("lakeFS answered {status}: {text}");
        }
        Ok(text)
    }

    async fn get(&self, path: &str) -> Result<Value> {
        let text = self
            .send(self.http.get(format!("{}{path}", self.endpoint)))
            .await?;
        Ok(serde_json::from_str(&text)?)
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        let text = self
            .send(
                self.http
                    .post(format!("{}{path}", self.endpoint))
                    .json(&body),
            )
            .await?;
        Ok(serde_json::from_str(&text)?)
    }

    /// A repository whose main holds `files`; returns the seed commit.
    async fn seed(&self, repository: &str, files: &[(&str, &str)]) -> Result<String> {
        self.post(
            "/repositories",
            json!({"name": repository, "storage_namespace": format!("local://{repository}"),
                   "default_branch": "main"}),
        )
        .await?;
        for (key, text) in files {
            self.send(
                self.http
                    .post(format!(
                        "{}/repositories/{repository}/branches/main/objects",
                        self.endpoint
                    ))
                    .query(&[("path", key)])
                    .header("Content-Type", "application/octet-stream")
                    .body(text.to_string()),
            )
            .await?;
        }
        let commit = self
            .post(
                &format!("/repositories/{repository}/branches/main/commits"),
                json!({"message": "raw renders"}),
            )
            .await?;
        commit["id"]
            .as_str()
            .map(str::to_owned)
            .context("lakeFS returned a commit without an id")
    }

    /// Key → size of every object at `reference`.
    async fn tree(&self, repository: &str, reference: &str) -> Result<BTreeMap<String, u64>> {
        let listing = self
            .get(&format!(
                "/repositories/{repository}/refs/{reference}/objects/ls?amount=1000"
            ))
            .await?;
        Ok(listing["results"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| Some((o["path"].as_str()?.to_owned(), o["size_bytes"].as_u64()?)))
            .collect())
    }

    async fn object(&self, repository: &str, reference: &str, key: &str) -> Result<String> {
        self.send(
            self.http
                .get(format!(
                    "{}/repositories/{repository}/refs/{reference}/objects",
                    self.endpoint
                ))
                .query(&[("path", key)]),
        )
        .await
    }
}
