//! `kubectl perago report TASK|operator`: a support bundle, a `.tar.gz` (or a directory)
//! that can be attached to a ticket. For a task: the PeragoTask, its executor Deployment,
//! ReplicaSets and pods, their events, each container's recent log, each sidecar's
//! `/metrics`, the TaskDef Conductor has, the `status` view and the versions; for the
//! operator: its Deployment, ReplicaSets, pods, logs, events and metrics, and every
//! PeragoTask's status. Everything is collected first and redacted ([`crate::redact`]) before
//! anything is written: Secrets are never collected, only named.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, LogParams};
use kube::{Api, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use perago_api::PeragoTask;
use perago_api::pod::TASK_LABEL;
use perago_conductor::ConductorClient;
use perago_lakefs::LakeFsClient;

use crate::Failure;
use crate::cluster::explained;
use crate::output::{Table, cell};
use crate::redact::{self, Counts, Redactor};

/// The sidecar's port for `/metrics`.
const SIDECAR_PORT: u16 = 9464;
/// The operator's metrics port when its container names none `http`.
const OPERATOR_PORT: u16 = 8080;
/// At most this much of one container's log.
const LOG_BYTES: i64 = 10 << 20;
/// The operator's variables that name the credential Secrets of the task namespaces; the
/// first is in the operator's namespace too (its own TaskDef calls).
const OPERATOR_SECRET_VARS: [&str; 2] = [
    "PERAGO_CONDUCTOR_CREDENTIALS_SECRET",
    "PERAGO_LAKEFS_CREDENTIALS_SECRET",
];
/// The variable only the operator's container has.
const OPERATOR_MARK: &str = "PERAGO_SIDECAR_IMAGE";

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A PeragoTask's name, or `operator` for the operator (a task named operator:
    /// `ptask/operator`).
    pub target: String,
    /// Write the bundle to this `.tar.gz` file (default: `perago-report-…-<UTC time>.tar.gz` in
    /// the current directory).
    #[arg(long, value_name = "FILE", conflicts_with = "output_dir")]
    pub output_file: Option<PathBuf>,
    /// Write the bundle's files into this directory instead (made if missing; it must be
    /// empty).
    #[arg(short = 'O', long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Only log lines newer than this: `30m`, `6h`.
    #[arg(long, value_parser = crate::duration::parse)]
    pub since: Option<Duration>,
    /// At most this many of the last lines of each container's log.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub tail: i64,
    /// The namespace the operator is installed in.
    #[arg(long, value_name = "NS", default_value = "perago-system")]
    pub operator_namespace: String,
}

/// What the bundle is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Task(String),
    Operator,
}

impl Target {
    pub fn of(text: &str) -> Self {
        match text.split_once('/') {
            Some(("ptask" | "peragotask" | "peragotasks", name)) => Self::Task(name.to_owned()),
            _ if text == "operator" => Self::Operator,
            _ => Self::Task(text.to_owned()),
        }
    }
}

/// How a collected object is laid out in its file.
#[derive(Clone, Copy, Debug)]
enum Layout {
    Yaml,
    Json,
}

#[derive(Debug)]
enum Content {
    Object(Value, Layout),
    Text(String),
}

#[derive(Debug)]
struct Entry {
    path: String,
    about: String,
    content: Content,
}

/// What was collected, before it is redacted and written.
#[derive(Debug, Default)]
pub struct Bundle {
    /// The top directory's name inside the archive, and the default file's stem.
    name: String,
    title: String,
    entries: Vec<Entry>,
    /// What could not be collected, and why.
    unread: Vec<String>,
    /// Redactions that could not be done.
    unredacted: Vec<String>,
    /// Facts for the README (a Secret that does not exist, a TaskDef Conductor lacks).
    notes: Vec<String>,
    /// The Secrets the objects refer to, as `namespace/name`, and whether their values were
    /// read for redaction.
    secrets: BTreeMap<String, SecretState>,
    redactor: Redactor,
}

impl Bundle {
    fn object(&mut self, path: &str, about: &str, value: Value, layout: Layout) {
        self.entries.push(Entry {
            path: path.to_owned(),
            about: about.to_owned(),
            content: Content::Object(value, layout),
        });
    }

    fn text(&mut self, path: &str, about: &str, text: String) {
        self.entries.push(Entry {
            path: path.to_owned(),
            about: about.to_owned(),
            content: Content::Text(text),
        });
    }
}

/// The bundle as written.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportView {
    pub path: String,
    pub files: Vec<FileRow>,
    pub redacted: Counts,
    /// The Secrets referenced, by name only, and whether their values were searched for.
    pub secrets: BTreeMap<String, SecretState>,
    pub not_collected: Vec<String>,
    pub not_redacted: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct FileRow {
    pub path: String,
    pub bytes: usize,
}

impl Table for ReportView {
    fn table(&self) -> String {
        let bytes: usize = self.files.iter().map(|f| f.bytes).sum();
        let mut out = format!(
            "wrote {} ({} files, {} KiB before compression)\n",
            self.path,
            self.files.len(),
            bytes.div_ceil(1024)
        );
        let r = &self.redacted;
        out += &format!(
            "redacted: {} credential env values, {} URL user-infos, {} credential assignments, \
             {} occurrences of Secret values\n",
            r.env_values, r.url_user_info, r.assignments, r.secret_values
        );
        if !self.secrets.is_empty() {
            let names: Vec<String> = self
                .secrets
                .iter()
                .map(|(name, state)| match state {
                    SecretState::Read => name.clone(),
                    SecretState::Missing => format!("{name} (does not exist)"),
                    SecretState::Unreadable => format!("{name} (values NOT read)"),
                })
                .collect();
            out += &format!(
                "Secrets referenced (named only, never collected): {}\n",
                names.join(", ")
            );
        }
        for (title, items) in [
            ("Not redacted", &self.not_redacted),
            ("Not collected", &self.not_collected),
        ] {
            if !items.is_empty() {
                out += &format!("{title}:\n");
                for i in items {
                    out += &format!("  {}\n", cell(i, 400));
                }
            }
        }
        out
    }
}

/// What became of a Secret the collected objects refer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SecretState {
    /// Its values were read and searched for.
    Read,
    /// It does not exist: it has no values to leak.
    Missing,
    /// Its values could not be read: they are not redacted.
    Unreadable,
}

impl SecretState {
    fn says(self) -> &'static str {
        match self {
            Self::Read => "its values were read and searched for",
            Self::Missing => "it does not exist",
            Self::Unreadable => "its values could NOT be read and were not searched for",
        }
    }
}

/// What `report` reads from.
pub struct Sources<'a> {
    pub client: kube::Client,
    pub namespace: String,
    pub conductor: Option<&'a ConductorClient>,
    pub conductor_unfound: Option<String>,
    pub lakefs: Option<&'a LakeFsClient>,
    pub timeout: Duration,
    /// The kubeconfig context used, for the README.
    pub context: Option<String>,
}

pub async fn run(sources: &Sources<'_>, args: &ReportArgs) -> Result<ReportView, Failure> {
    if let Some(file) = &args.output_file
        && file
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("zip"))
    {
        return Err(Failure::Usage(format!(
            "{}: a bundle is a .tar.gz file (or a directory with -O DIR), not a zip",
            file.display()
        )));
    }
    let now = Timestamp::now();
    let stamp = now.strftime("%Y%m%dT%H%M%SZ").to_string();
    let mut bundle = match Target::of(&args.target) {
        Target::Task(name) => {
            let mut b = Bundle {
                name: format!("perago-report-{}-{name}-{stamp}", sources.namespace),
                title: format!("PeragoTask {}/{name}", sources.namespace),
                ..Bundle::default()
            };
            task(sources, args, &name, &mut b).await?;
            b
        }
        Target::Operator => {
            let mut b = Bundle {
                name: format!("perago-report-operator-{stamp}"),
                title: format!(
                    "the Perago operator in namespace {}",
                    args.operator_namespace
                ),
                ..Bundle::default()
            };
            operator(sources, args, &mut b).await?;
            b
        }
    };
    versions(sources, args, &mut bundle).await;
    let files = redacted(bundle, sources.context.as_deref(), now);
    let path = write(&files, args)?;
    let view = ReportView {
        path: path.display().to_string(),
        files: files
            .files
            .iter()
            .map(|(p, t)| FileRow {
                path: p.clone(),
                bytes: t.len(),
            })
            .collect(),
        redacted: files.counts,
        secrets: files.secrets,
        not_collected: files.unread,
        not_redacted: files.unredacted,
    };
    Ok(view)
}

/// A Kubernetes object as JSON, without its managed fields.
fn tidy<T: Serialize>(object: &T) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    strip_managed_fields(&mut value);
    value
}

fn strip_managed_fields(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(meta)) = map.get_mut("metadata") {
                meta.remove("managedFields");
            }
            map.values_mut().for_each(strip_managed_fields);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_managed_fields),
        _ => {}
    }
}

fn list_of(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

fn why(e: kube::Error, verb: &str, resource: &str, ns: &str) -> String {
    format!("{:#}", explained(e, verb, resource, ns))
}

/// The task's part of the bundle.
async fn task(
    sources: &Sources<'_>,
    args: &ReportArgs,
    name: &str,
    b: &mut Bundle,
) -> Result<(), Failure> {
    let ns = sources.namespace.as_str();
    let client = &sources.client;
    let task = Api::<PeragoTask>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| explained(e, "get", "peragotasks", ns))?
        .ok_or_else(|| anyhow!("PeragoTask {ns}/{name} not found (kubectl get ptask -n {ns})"))?;
    let task_json = tidy(&task);
    let mut referring = vec![task_json.clone()];
    b.object(
        "peragotask.yaml",
        "the PeragoTask, spec and status",
        task_json,
        Layout::Yaml,
    );
    let selector = ListParams::default().labels(&format!("{TASK_LABEL}={name}"));
    let deployment_name = perago_api::task::object_name(name);
    match Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(&deployment_name)
        .await
    {
        Ok(Some(d)) => {
            let d = tidy(&d);
            referring.push(d.clone());
            b.object(
                "deployment.yaml",
                "the executor Deployment the operator made",
                d,
                Layout::Yaml,
            );
        }
        Ok(None) => b.notes.push(format!(
            "PeragoTask {ns}/{name} has no executor Deployment {deployment_name}"
        )),
        Err(e) => b.unread.push(format!(
            "the executor Deployment: {}",
            why(e, "get", "deployments", ns)
        )),
    }
    let mut involved: BTreeSet<String> = [name.to_owned(), deployment_name].into();
    match Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&selector)
        .await
    {
        Ok(list) => {
            involved.extend(list.items.iter().map(ResourceExt::name_any));
            let items = list.items.iter().map(tidy).collect();
            b.object(
                "replicasets.yaml",
                "the executor Deployment's ReplicaSets",
                list_of(items),
                Layout::Yaml,
            );
        }
        Err(e) => b.unread.push(format!(
            "ReplicaSets: {}",
            why(e, "list", "replicasets", ns)
        )),
    }
    let pods = match Api::<Pod>::namespaced(client.clone(), ns)
        .list(&selector)
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            b.unread
                .push(format!("pods: {}", why(e, "list", "pods", ns)));
            Vec::new()
        }
    };
    involved.extend(pods.iter().map(ResourceExt::name_any));
    let pod_values: Vec<Value> = pods.iter().map(tidy).collect();
    referring.extend(pod_values.iter().cloned());
    b.object(
        "pods.yaml",
        "the executor pods",
        list_of(pod_values),
        Layout::Yaml,
    );
    events(client, ns, Some(&involved), b).await;
    for pod in &pods {
        logs(client, pod, args, b).await;
        metrics(sources, pod, SIDECAR_PORT, b).await;
    }
    let names: BTreeSet<String> = referring.iter().flat_map(redact::secret_names).collect();
    secret_values(client, ns, &names, b).await;
    match sources.conductor {
        Some(conductor) => match conductor.task_def(&task.spec.task_name).await {
            Ok(Some(def)) => b.object(
                "taskdef.json",
                "the TaskDef registered in Conductor",
                def,
                Layout::Json,
            ),
            Ok(None) => b.notes.push(format!(
                "Conductor ({}) has no TaskDef {}",
                conductor.base_url(),
                task.spec.task_name
            )),
            Err(e) => b.unread.push(format!(
                "the TaskDef: {e} (Conductor {})",
                conductor.base_url()
            )),
        },
        None => b.unread.push(format!(
            "the TaskDef: no Conductor ({})",
            sources
                .conductor_unfound
                .as_deref()
                .unwrap_or("give --conductor-url or CONDUCTOR_SERVER_URL")
        )),
    }
    let status_sources = crate::status::Sources {
        client: client.clone(),
        namespace: ns.to_owned(),
        conductor: sources.conductor,
        conductor_unfound: sources.conductor_unfound.clone(),
        lakefs: sources.lakefs,
        timeout: sources.timeout,
    };
    let status_args = crate::status::StatusArgs {
        task: name.to_owned(),
        attempts: 20,
        watch: false,
    };
    match crate::status::run(&status_sources, &status_args).await {
        Ok(view) => match serde_json::to_value(&view) {
            Ok(v) => b.object(
                "status.json",
                "kubectl perago status TASK -o json",
                v,
                Layout::Json,
            ),
            Err(e) => b.unread.push(format!("status: {e}")),
        },
        Err(e) => b.unread.push(format!("status: {e:#}")),
    }
    Ok(())
}

/// The operator's part of the bundle.
async fn operator(sources: &Sources<'_>, args: &ReportArgs, b: &mut Bundle) -> Result<(), Failure> {
    let ns = args.operator_namespace.as_str();
    let client = &sources.client;
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| explained(e, "list", "deployments", ns))?
        .items;
    let ours: Vec<&Deployment> = deployments.iter().filter(|d| is_operator(d)).collect();
    if ours.is_empty() {
        return Err(Failure::Error(anyhow!(
            "no Perago operator Deployment in namespace {ns} (the namespace it is installed \
             in: --operator-namespace)"
        )));
    }
    let mut referring = Vec::new();
    let mut involved = BTreeSet::new();
    let mut pods = Vec::new();
    let mut replica_sets = Vec::new();
    for d in &ours {
        involved.insert(d.name_any());
        referring.push(tidy(d));
        let labels = d
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default();
        let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let params = ListParams::default().labels(&selector.join(","));
        match Api::<ReplicaSet>::namespaced(client.clone(), ns)
            .list(&params)
            .await
        {
            Ok(list) => replica_sets.extend(list.items),
            Err(e) => b.unread.push(format!(
                "ReplicaSets: {}",
                why(e, "list", "replicasets", ns)
            )),
        }
        match Api::<Pod>::namespaced(client.clone(), ns)
            .list(&params)
            .await
        {
            Ok(list) => pods.extend(list.items),
            Err(e) => b
                .unread
                .push(format!("pods: {}", why(e, "list", "pods", ns))),
        }
    }
    let deployments: Vec<Value> = ours.iter().map(tidy).collect();
    b.object(
        "deployment.yaml",
        "the operator's Deployment",
        list_of(deployments),
        Layout::Yaml,
    );
    involved.extend(replica_sets.iter().map(ResourceExt::name_any));
    b.object(
        "replicasets.yaml",
        "the operator's ReplicaSets",
        list_of(replica_sets.iter().map(tidy).collect()),
        Layout::Yaml,
    );
    involved.extend(pods.iter().map(ResourceExt::name_any));
    let pod_values: Vec<Value> = pods.iter().map(tidy).collect();
    referring.extend(pod_values.iter().cloned());
    b.object(
        "pods.yaml",
        "the operator's pods",
        list_of(pod_values),
        Layout::Yaml,
    );
    // Every event of the operator's namespace: its pods, its Deployment, its webhook's
    // certificate, its lease.
    events(client, ns, None, b).await;
    for pod in &pods {
        logs(client, pod, args, b).await;
        metrics(sources, pod, operator_port(pod), b).await;
    }
    // The credential Secrets it names: the Conductor one here, both in every task's namespace.
    let env: Vec<(String, String)> = ours.iter().flat_map(|d| operator_env(d)).collect();
    let named_as = |var: &str| {
        env.iter()
            .filter(|(k, _)| k == var)
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>()
    };
    let named: BTreeSet<String> = OPERATOR_SECRET_VARS
        .iter()
        .flat_map(|v| named_as(v))
        .collect();
    let mut names: BTreeSet<String> = referring.iter().flat_map(redact::secret_names).collect();
    names.extend(named_as(OPERATOR_SECRET_VARS[0]));
    secret_values(client, ns, &names, b).await;
    match Api::<PeragoTask>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => {
            let mut by_namespace: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            let mut rows = Vec::new();
            let mut table =
                String::from("NAMESPACE\tNAME\tTASK TYPE\tSUSPEND\tREADY\tREASON\tMESSAGE\n");
            for t in &list.items {
                let tns = t.namespace().unwrap_or_default();
                let value = tidy(t);
                let refs = by_namespace.entry(tns.clone()).or_default();
                refs.extend(redact::secret_names(&value));
                refs.extend(named.iter().cloned());
                let ready = t
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
                table += &format!(
                    "{tns}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                    t.name_any(),
                    t.spec.task_name,
                    t.spec.suspend,
                    ready.map_or("-", |c| c.status.as_str()),
                    ready.map_or("-", |c| c.reason.as_str()),
                    ready.map_or("", |c| c.message.as_str()),
                );
                rows.push(json!({
                    "namespace": tns,
                    "name": t.name_any(),
                    "taskName": t.spec.task_name,
                    "suspend": t.spec.suspend,
                    "generation": t.metadata.generation,
                    "status": value.get("status").cloned().unwrap_or(Value::Null),
                }));
            }
            b.object(
                "peragotasks.yaml",
                "every PeragoTask's name, task type and status",
                Value::Array(rows),
                Layout::Yaml,
            );
            b.text(
                "peragotasks.txt",
                "every PeragoTask's Ready condition, tab-separated",
                table,
            );
            for (tns, names) in by_namespace {
                if tns != ns {
                    secret_values(client, &tns, &names, b).await;
                }
            }
        }
        Err(e) => b.unread.push(format!(
            "PeragoTasks: {}",
            why(e, "list", "peragotasks", "(all namespaces)")
        )),
    }
    Ok(())
}

/// Whether a Deployment runs the Perago operator (its container has the variable only the
/// operator has), whatever the release named it.
fn is_operator(d: &Deployment) -> bool {
    operator_env(d).iter().any(|(k, _)| k == OPERATOR_MARK)
}

/// The literal variables of a Deployment's containers.
fn operator_env(d: &Deployment) -> Vec<(String, String)> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| {
            p.containers
                .iter()
                .flat_map(|c| c.env.iter().flatten())
                .filter_map(|v| Some((v.name.clone(), v.value.clone()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn operator_port(pod: &Pod) -> u16 {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("http"))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(OPERATOR_PORT)
}

/// The namespace's events, those about `involved` only when given: as YAML and as a table
/// in time order.
async fn events(
    client: &kube::Client,
    ns: &str,
    involved: Option<&BTreeSet<String>>,
    b: &mut Bundle,
) {
    let list = match Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            b.unread
                .push(format!("events: {}", why(e, "list", "events", ns)));
            return;
        }
    };
    let mut ours: Vec<Event> = list
        .into_iter()
        .filter(|e| {
            involved.is_none_or(|names| {
                e.involved_object
                    .name
                    .as_ref()
                    .is_some_and(|n| names.contains(n))
            })
        })
        .collect();
    let when = |e: &Event| -> Option<Timestamp> {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    ours.sort_by_key(when);
    let mut table = String::from("TIME\tTYPE\tREASON\tOBJECT\tCOUNT\tMESSAGE\n");
    for e in &ours {
        let o = &e.involved_object;
        table += &format!(
            "{}\t{}\t{}\t{}/{}\t{}\t{}\n",
            when(e).map(|t| t.to_string()).unwrap_or_default(),
            e.type_.as_deref().unwrap_or(""),
            e.reason.as_deref().unwrap_or(""),
            o.kind.as_deref().unwrap_or("").to_lowercase(),
            o.name.as_deref().unwrap_or(""),
            e.count.unwrap_or(1),
            e.message.as_deref().unwrap_or("").replace('\n', " "),
        );
    }
    b.text(
        "events.txt",
        "the events, oldest first, tab-separated",
        table,
    );
    b.object(
        "events.yaml",
        "the events, as the API server has them",
        list_of(ours.iter().map(tidy).collect()),
        Layout::Yaml,
    );
}

/// Every container's recent log (and its previous instance's, when it restarted).
async fn logs(client: &kube::Client, pod: &Pod, args: &ReportArgs, b: &mut Bundle) {
    let name = pod.name_any();
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let Some(spec) = &pod.spec else { return };
    let status = pod.status.as_ref();
    let statuses: Vec<_> = status
        .and_then(|s| s.init_container_statuses.clone())
        .into_iter()
        .chain(status.and_then(|s| s.container_statuses.clone()))
        .flatten()
        .collect();
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| c.name.clone());
    for container in containers {
        let Some(state) = statuses.iter().find(|s| s.name == container) else {
            continue;
        };
        let started = state.state.as_ref().is_some_and(|s| s.waiting.is_none())
            || state
                .last_state
                .as_ref()
                .is_some_and(|s| s.terminated.is_some());
        if !started {
            b.notes.push(format!(
                "pod {name} container {container} has not started: no log"
            ));
            continue;
        }
        let mut instances = vec![false];
        if state.restart_count > 0 {
            instances.insert(0, true);
        }
        for previous in instances {
            let params = LogParams {
                container: Some(container.clone()),
                timestamps: true,
                previous,
                tail_lines: Some(args.tail),
                limit_bytes: Some(LOG_BYTES),
                since_seconds: args
                    .since
                    .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX).max(1)),
                ..LogParams::default()
            };
            let file = if previous {
                format!("logs/{name}/{container}.previous.log")
            } else {
                format!("logs/{name}/{container}.log")
            };
            match api.logs(&name, &params).await {
                Ok(text) => b.text(
                    &file,
                    &format!(
                        "the log of pod {name} container {container}{}, with the kubelet's timestamps",
                        if previous { " before its last restart" } else { "" }
                    ),
                    text,
                ),
                // The previous instance's log may be gone already.
                Err(_) if previous => {}
                Err(e) => b.unread.push(format!(
                    "the log of pod {name} container {container}: {}",
                    why(e, "get", "pods/log", &ns)
                )),
            }
        }
    }
}

/// A running pod's `/metrics` through the API server's pod proxy.
async fn metrics(sources: &Sources<'_>, pod: &Pod, port: u16, b: &mut Bundle) {
    let name = pod.name_any();
    let ns = pod.namespace().unwrap_or_default();
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    if !running || pod.metadata.deletion_timestamp.is_some() {
        return;
    }
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}:{port}/proxy/metrics");
    let Ok(request) = http::Request::get(&path).body(Vec::new()) else {
        return;
    };
    match tokio::time::timeout(sources.timeout, sources.client.request_text(request)).await {
        Ok(Ok(text)) => b.text(
            &format!("metrics/{name}.txt"),
            &format!("pod {name}'s /metrics on port {port}, through the API server's pod proxy"),
            text,
        ),
        Ok(Err(e)) => b.unread.push(format!(
            "the metrics of pod {name}: {}",
            why(e, "get", "pods/proxy", &ns)
        )),
        Err(_) => b.unread.push(format!(
            "the metrics of pod {name}: no answer through the pod proxy within {}",
            crate::duration::show(sources.timeout)
        )),
    }
}

/// Read each named Secret of `ns` and search for its values from now on. Only the values'
/// search strings are kept, in memory; the Secret is never written.
async fn secret_values(client: &kube::Client, ns: &str, names: &BTreeSet<String>, b: &mut Bundle) {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    for name in names {
        let key = format!("{ns}/{name}");
        if b.secrets.contains_key(&key) {
            continue;
        }
        match api.get_opt(name).await {
            Ok(Some(secret)) => {
                for (k, v) in secret.data.iter().flatten() {
                    match std::str::from_utf8(&v.0) {
                        Ok(text) => {
                            let needles = redact::secret_needles(text);
                            if needles.is_empty() && !text.trim().is_empty() {
                                b.notes.push(format!(
                                    "Secret {key} key {k}: its value is shorter than {} \
                                     characters and is not searched for",
                                    redact::SEARCH_MIN
                                ));
                            }
                            needles.iter().for_each(|n| b.redactor.know(n));
                        }
                        Err(_) => b
                            .notes
                            .push(format!("Secret {key} key {k}: not text, not searched for")),
                    }
                }
                b.secrets.insert(key, SecretState::Read);
            }
            Ok(None) => {
                b.secrets.insert(key, SecretState::Missing);
            }
            Err(e) => {
                b.unredacted.push(format!(
                    "Secret {key}: wherever its values appear, they are in the bundle as they \
                     are, since they could not be read: {}",
                    why(e, "get", "secrets", ns)
                ));
                b.secrets.insert(key, SecretState::Unreadable);
            }
        }
    }
}

/// The plugin's, the API server's, the operator's and the pods' versions.
async fn versions(sources: &Sources<'_>, args: &ReportArgs, b: &mut Bundle) {
    let mut v = json!({
        "plugin": {
            "version": env!("CARGO_PKG_VERSION"),
            "revision": option_env!("PERAGO_REVISION").unwrap_or("unknown"),
        },
    });
    match sources.client.apiserver_version().await {
        Ok(info) => v["apiServer"] = json!(info),
        Err(e) => b
            .unread
            .push(format!("the API server's version (/version): {e}")),
    }
    let ns = args.operator_namespace.as_str();
    match Api::<Deployment>::namespaced(sources.client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => {
            let operators: Vec<Value> = list
                .items
                .iter()
                .filter(|d| is_operator(d))
                .map(|d| {
                    let spec = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
                    let images: Vec<&str> = spec
                        .iter()
                        .flat_map(|s| &s.containers)
                        .filter_map(|c| c.image.as_deref())
                        .collect();
                    let sidecar = operator_env(d)
                        .into_iter()
                        .find(|(k, _)| k == OPERATOR_MARK)
                        .map(|(_, v)| v);
                    json!({
                        "namespace": ns,
                        "deployment": d.name_any(),
                        "images": images,
                        "sidecarImage": sidecar,
                        "chart": d.labels().get("helm.sh/chart"),
                        "appVersion": d.labels().get("app.kubernetes.io/version"),
                    })
                })
                .collect();
            if operators.is_empty() {
                b.notes.push(format!(
                    "no Perago operator Deployment in namespace {ns} (--operator-namespace)"
                ));
            }
            v["operator"] = Value::Array(operators);
        }
        Err(e) => b.unread.push(format!(
            "the operator's version: {}",
            why(e, "list", "deployments", ns)
        )),
    }
    b.object(
        "versions.json",
        "the plugin's, the API server's and the operator's versions",
        v,
        Layout::Json,
    );
}

/// The bundle's files once redacted, and what was done.
#[derive(Debug)]
struct Redacted {
    name: String,
    files: Vec<(String, String)>,
    counts: Counts,
    secrets: BTreeMap<String, SecretState>,
    unread: Vec<String>,
    unredacted: Vec<String>,
}

/// Redact every entry (the env values first, so that they are searched for in every file),
/// add the README, and lay the objects out.
fn redacted(mut b: Bundle, context: Option<&str>, now: Timestamp) -> Redacted {
    let mut counts = Counts::default();
    for entry in &mut b.entries {
        if let Content::Object(value, _) = &mut entry.content {
            let taken = redact::env_values(value);
            counts.env_values += taken.len();
            taken.iter().for_each(|t| b.redactor.know(t));
            redact_last_applied(value, &mut b.redactor, &mut counts);
        }
    }
    let mut files = Vec::new();
    for entry in &mut b.entries {
        let text = match &mut entry.content {
            Content::Object(value, layout) => {
                counts.secret_values += b.redactor.json(value);
                match layout {
                    Layout::Yaml => serde_yaml::to_string(value).unwrap_or_default(),
                    Layout::Json => serde_json::to_string_pretty(value).unwrap_or_default() + "\n",
                }
            }
            Content::Text(text) => std::mem::take(text),
        };
        let (text, c) = b.redactor.text(&text);
        counts.add(c);
        files.push((entry.path.clone(), text));
    }
    let clean = |items: &[String], r: &Redactor| -> Vec<String> {
        items.iter().map(|i| r.text(i).0).collect()
    };
    let unread = clean(&b.unread, &b.redactor);
    let unredacted = clean(&b.unredacted, &b.redactor);
    let notes = clean(&b.notes, &b.redactor);
    let readme = readme(
        &b,
        context,
        now,
        &files,
        counts,
        (&unread, &unredacted, &notes),
    );
    files.insert(0, ("README.md".to_owned(), b.redactor.text(&readme).0));
    Redacted {
        name: b.name,
        files,
        counts,
        secrets: b.secrets,
        unread,
        unredacted,
    }
}

/// The env values of the copy of an object kubectl keeps in an annotation.
fn redact_last_applied(value: &mut Value, redactor: &mut Redactor, counts: &mut Counts) {
    const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(meta)) = map.get_mut("metadata")
                && let Some(Value::Object(annotations)) = meta.get_mut("annotations")
                && let Some(Value::String(applied)) = annotations.get_mut(LAST_APPLIED)
                && let Ok(mut doc) = serde_json::from_str::<Value>(applied)
            {
                let taken = redact::env_values(&mut doc);
                if !taken.is_empty() {
                    counts.env_values += taken.len();
                    taken.iter().for_each(|t| redactor.know(t));
                    *applied = doc.to_string();
                }
            }
            for child in map.values_mut() {
                redact_last_applied(child, redactor, counts);
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| redact_last_applied(v, redactor, counts)),
        _ => {}
    }
}

fn readme(
    b: &Bundle,
    context: Option<&str>,
    now: Timestamp,
    files: &[(String, String)],
    counts: Counts,
    (unread, unredacted, notes): (&[String], &[String], &[String]),
) -> String {
    let mut out = format!("# Perago support bundle: {}\n\n", b.title);
    out += &format!(
        "Made by kubectl-perago {} at {} (UTC), context {}.\n\n",
        env!("CARGO_PKG_VERSION"),
        now.strftime("%Y-%m-%d %H:%M:%S"),
        context.unwrap_or("(the current one)")
    );
    out += "## Files\n\n";
    for ((path, text), entry) in files.iter().zip(&b.entries) {
        out += &format!("- `{path}` ({} bytes): {}\n", text.len(), entry.about);
    }
    out += "\n## Redaction\n\n";
    out += "Every file was redacted before it was written:\n\n";
    out += &format!(
        "- {} literal values of environment variables whose name looks like a credential (holds \
         KEY, SECRET, TOKEN, PASSWORD, PASSWD, CREDENTIAL or AUTH) became `REDACTED`; variables \
         from a Secret or a ConfigMap only name it and are kept\n",
        counts.env_values
    );
    out += &format!(
        "- {} URLs' user-info (the `user:password@` before the host) became `REDACTED@`\n",
        counts.url_user_info
    );
    out += &format!(
        "- {} values of `NAME=value` with such a NAME, and of `Bearer` tokens, became `REDACTED`\n",
        counts.assignments
    );
    out += &format!(
        "- {} occurrences of a value of the Secrets below (and of the credential values above) \
         became `REDACTED`: values of {} characters or more wherever they occur, shorter ones \
         as whole words\n",
        counts.secret_values,
        redact::SUBSTRING_MIN
    );
    out += "\nSecrets are never collected. Those the collected objects refer to, by name:\n\n";
    if b.secrets.is_empty() {
        out += "- none\n";
    }
    for (name, state) in &b.secrets {
        out += &format!("- {name}: {}\n", state.says());
    }
    out += "\nNot redacted: credentials in commands, arguments or files that are neither a \
            Secret's value, a URL's user-info nor a `NAME=value` of a credential's name.\n";
    for (title, items) in [
        ("Redactions not done", unredacted),
        ("Not collected", unread),
        ("Notes", notes),
    ] {
        if !items.is_empty() {
            out += &format!("\n## {title}\n\n");
            for i in items {
                out += &format!("- {i}\n");
            }
        }
    }
    out
}

/// Write the files: into `-O DIR`, or as a `.tar.gz` with a top directory. Returns where.
fn write(files: &Redacted, args: &ReportArgs) -> anyhow::Result<PathBuf> {
    if let Some(dir) = &args.output_dir {
        if dir.exists()
            && std::fs::read_dir(dir)
                .with_context(|| format!("reading {}", dir.display()))?
                .next()
                .is_some()
        {
            return Err(anyhow!(
                "{} is not empty: give a new or an empty directory",
                dir.display()
            ));
        }
        std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
        private_dir(dir)?;
        for (path, text) in &files.files {
            let target = dir.join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("making {}", parent.display()))?;
                private_dir(parent)?;
            }
            new_file(&target)?.write_all(text.as_bytes())?;
        }
        return Ok(dir.clone());
    }
    let path = args
        .output_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.tar.gz", files.name)));
    let file = new_file(&path)?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mtime = u64::try_from(Timestamp::now().as_second()).unwrap_or(0);
    for (name, text) in &files.files {
        let mut header = tar::Header::new_gnu();
        header.set_size(u64::try_from(text.len()).unwrap_or(u64::MAX));
        header.set_mode(0o600);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(
            &mut header,
            format!("{}/{name}", files.name),
            text.as_bytes(),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    tar.into_inner()
        .and_then(flate2::write::GzEncoder::finish)
        .and_then(|mut f| f.flush())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// A new file only its owner reads; an existing one is not overwritten.
fn new_file(path: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))
}

fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_a_task_or_the_operator() {
        assert_eq!(Target::of("operator"), Target::Operator);
        assert_eq!(Target::of("steady"), Target::Task("steady".into()));
        assert_eq!(
            Target::of("ptask/operator"),
            Target::Task("operator".into())
        );
        assert_eq!(
            Target::of("peragotask/operator"),
            Target::Task("operator".into())
        );
    }

    #[test]
    fn managed_fields_go_and_the_last_applied_copy_is_redacted_too() {
        let applied = json!({"spec": {"executor": {"body": {"env": [
            {"name": "API_TOKEN", "value": "tok-in-the-annotation"}]}}}});
        let mut value = json!({
            "metadata": {"name": "t", "managedFields": [{"manager": "kubectl"}],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied.to_string()}},
            "spec": {"executor": {"body": {"env": [{"name": "API_TOKEN", "value": "tok-in-the-annotation"}]}}},
        });
        strip_managed_fields(&mut value);
        assert!(value["metadata"].get("managedFields").is_none());
        let mut redactor = Redactor::default();
        let mut counts = Counts::default();
        redact_last_applied(&mut value, &mut redactor, &mut counts);
        assert_eq!(counts.env_values, 1);
        let text = value.to_string();
        assert!(!text.contains("tok-in-the-annotation\\\""), "{text}");
        // The spec's own copy goes with the env pass, and anywhere else with the known value.
        assert_eq!(redact::env_values(&mut value), ["tok-in-the-annotation"]);
        assert!(!value.to_string().contains("tok-in-the-annotation"));
    }

    #[test]
    fn a_bundle_is_redacted_everywhere_and_its_readme_says_what_was_done() {
        let mut b = Bundle {
            name: "perago-report-ns-t-20261206T000000Z".into(),
            title: "PeragoTask ns/t".into(),
            ..Bundle::default()
        };
        b.object(
            "pods.yaml",
            "pods",
            json!({"spec": {"containers": [{"env": [
                {"name": "DB_PASSWORD", "value": "literal-password-1"},
                {"name": "LAKECTL_SERVER_ENDPOINT_URL", "value": "http://admin:pw@lakefs:8000"}]}]}}),
            Layout::Yaml,
        );
        b.text(
            "logs/p/body.log",
            "log",
            "2026-12-06T00:00:00Z connecting with literal-password-1 and wJalrXUtnFEMI/K7MDENG/bPxRfiCYPERAGOKEY0\n"
                .into(),
        );
        b.redactor.know("wJalrXUtnFEMI/K7MDENG/bPxRfiCYPERAGOKEY0");
        b.secrets
            .insert("ns/lakefs-credentials".into(), SecretState::Read);
        b.secrets
            .insert("ns/hidden".into(), SecretState::Unreadable);
        b.unredacted
            .push("Secret ns/hidden: wherever its values appear, they are in the bundle".into());
        let files = redacted(b, None, Timestamp::UNIX_EPOCH);
        let all: String = files.files.iter().map(|(_, t)| t.as_str()).collect();
        for secret in [
            "literal-password-1",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPERAGOKEY0",
            "admin:pw",
        ] {
            assert!(!all.contains(secret), "{secret} in\n{all}");
        }
        assert_eq!(files.counts.env_values, 1);
        assert_eq!(files.counts.url_user_info, 1);
        assert_eq!(files.counts.secret_values, 2);
        let readme = &files.files[0];
        assert_eq!(readme.0, "README.md");
        assert!(
            readme.1.contains("ns/hidden: its values could NOT be read"),
            "{}",
            readme.1
        );
        assert!(readme.1.contains("## Redactions not done"), "{}", readme.1);
        assert!(readme.1.contains("`logs/p/body.log`"), "{}", readme.1);
        assert!(
            readme.1.contains("(the `user:password@` before the host)"),
            "{}",
            readme.1
        );
    }

    #[test]
    fn a_bundle_is_written_as_a_private_directory_or_archive_never_over_a_file() {
        let files = Redacted {
            name: "perago-report-x".into(),
            files: vec![
                ("README.md".into(), "hello\n".into()),
                ("logs/p/c.log".into(), "line\n".into()),
            ],
            counts: Counts::default(),
            secrets: BTreeMap::new(),
            unread: Vec::new(),
            unredacted: Vec::new(),
        };
        let tmp = tempfile::tempdir().unwrap();
        let mut args = ReportArgs {
            target: "t".into(),
            output_file: None,
            output_dir: Some(tmp.path().join("dir")),
            since: None,
            tail: 10,
            operator_namespace: "perago-system".into(),
        };
        let dir = write(&files, &args).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("logs/p/c.log")).unwrap(),
            "line\n"
        );
        assert!(
            write(&files, &args)
                .unwrap_err()
                .to_string()
                .contains("not empty")
        );
        args.output_dir = None;
        args.output_file = Some(tmp.path().join("b.tar.gz"));
        let archive = write(&files, &args).unwrap();
        assert!(write(&files, &args).is_err(), "an existing file is kept");
        let gz = flate2::read::GzDecoder::new(std::fs::File::open(archive).unwrap());
        let names: Vec<String> = tar::Archive::new(gz)
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            ["perago-report-x/README.md", "perago-report-x/logs/p/c.log"]
        );
    }
}
