//! A real Prometheus (Debian's `prometheus` package) for the monitoring tests, and the scrape
//! jobs the Prometheus Operator generates from a ServiceMonitor or a PodMonitor: the chart's
//! monitors, rendered by Helm, become the jobs this Prometheus runs, with the same relabeling,
//! so what users query is what the tests query.
//!
//! Two stand-ins, both said in docs/operations.md: the Prometheus Operator itself is not run
//! (building it from its Go module costs more than the cold CI budget has left), and Debian
//! builds Prometheus without its Kubernetes discovery, so [`Discovery`] lists the targets that
//! discovery would find (the Endpoints' and the pods' ports, with the same
//! `__meta_kubernetes_*` labels) into the files a `file_sd` job reads.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::process::{ServerProcess, free_port, wait_ready};

/// A running Prometheus with the jobs it was given.
pub struct Prometheus {
    pub url: String,
    http: reqwest::Client,
    _process: ServerProcess,
}

/// The Prometheus binary: `PERAGO_PROMETHEUS`, else Debian's.
fn binary() -> Result<PathBuf> {
    let path = std::env::var_os("PERAGO_PROMETHEUS")
        .map_or_else(|| PathBuf::from("/usr/bin/prometheus"), PathBuf::from);
    if !path.exists() {
        bail!(
            "{} is missing: run e2e/bin/prerequisites (Debian's prometheus package)",
            path.display()
        );
    }
    Ok(path)
}

impl Prometheus {
    /// Start Prometheus with `scrape_configs`, scraping every second, its data in
    /// `dir/prometheus`.
    pub async fn start(dir: &Path, scrape_configs: Vec<Value>) -> Result<Self> {
        let home = dir.join("prometheus");
        std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
        let config = home.join("prometheus.yml");
        let document = json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": scrape_configs,
        });
        // JSON is YAML.
        std::fs::write(&config, serde_json::to_vec_pretty(&document)?)?;
        let port = free_port()?;
        let mut cmd = Command::new(binary()?);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                home.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .current_dir(&home);
        let mut process = ServerProcess::spawn("prometheus", &mut cmd, dir.join("prometheus.log"))?;
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        let took = wait_ready(&mut process, Duration::from_secs(60), || {
            let ready = http.get(format!("{url}/-/ready")).send();
            async move { ready.await.is_ok_and(|r| r.status().is_success()) }
        })
        .await?;
        eprintln!("[e2e] prometheus ready on {url} in {took:.1?}");
        Ok(Self {
            url,
            http,
            _process: process,
        })
    }

    /// The series of an instant query (`data.result`).
    pub async fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let answer: Value = self
            .http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", promql)])
            .send()
            .await?
            .json()
            .await?;
        if answer["status"] != "success" {
            bail!("query {promql:?} failed: {answer}");
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// Once an instant query returns one series of value `expected` (a minute at most): each
    /// job scrapes on its own clock, and discovery takes a few seconds to start.
    pub async fn expect(&self, promql: &str, expected: f64) -> Result<()> {
        let mut last = Vec::new();
        for _ in 0..300 {
            last = self.query(promql).await?;
            if let [series] = last.as_slice()
                && let Some(value) = series["value"][1].as_str()
                && value.parse::<f64>()? == expected
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("{promql:?} did not return one series of {expected} within a minute; last {last:?}")
    }

    /// The series of an instant query once it returns any (a minute at most).
    pub async fn answered(&self, promql: &str) -> Result<Vec<Value>> {
        for _ in 0..300 {
            let series = self.query(promql).await?;
            if !series.is_empty() {
                return Ok(series);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("{promql:?} returned no series within a minute")
    }

    /// The active targets, as `/api/v1/targets` lists them.
    pub async fn targets(&self) -> Result<Vec<Value>> {
        let answer: Value = self
            .http
            .get(format!("{}/api/v1/targets", self.url))
            .send()
            .await?
            .json()
            .await?;
        Ok(answer["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

/// A Kubernetes label name as a Prometheus label name (`app.kubernetes.io/name` →
/// `app_kubernetes_io_name`).
fn sanitized(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn relabel(source: &[&str], target: &str) -> Value {
    json!({"source_labels": source, "target_label": target})
}

/// `keep` the targets whose object (`service` or `pod`) carries every label of `matchLabels`.
fn keep_selected(object: &str, match_labels: &Value) -> Vec<Value> {
    match_labels
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, value)| {
            let key = sanitized(key);
            json!({
                "action": "keep",
                "source_labels": [
                    format!("__meta_kubernetes_{object}_label_{key}"),
                    format!("__meta_kubernetes_{object}_labelpresent_{key}"),
                ],
                "regex": format!("({});true", value.as_str().unwrap_or_default()),
            })
        })
        .collect()
}

/// The monitor's namespaces as Kubernetes discovery would restrict them: none with
/// `namespaceSelector.any`, else the listed ones or the monitor's own.
fn keep_namespaces(monitor: &Value) -> Option<Value> {
    let selector = &monitor["spec"]["namespaceSelector"];
    if selector["any"] == true {
        return None;
    }
    let names: Vec<String> = match selector["matchNames"].as_array() {
        Some(names) => names
            .iter()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect(),
        None => vec![
            monitor["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ],
    };
    Some(
        json!({"action": "keep", "source_labels": ["__meta_kubernetes_namespace"],
                "regex": format!("({})", names.join("|"))}),
    )
}

/// The jobs the Prometheus Operator makes of a ServiceMonitor (one per endpoint), reading the
/// targets of the `endpoints` role from `discovery`.
pub fn service_monitor_jobs(monitor: &Value, discovery: &Discovery) -> Vec<Value> {
    monitor_jobs(monitor, Role::Endpoints, discovery, |port| {
        vec![
            relabel(&["__meta_kubernetes_namespace"], "namespace"),
            relabel(&["__meta_kubernetes_service_name"], "service"),
            relabel(&["__meta_kubernetes_pod_name"], "pod"),
            relabel(&["__meta_kubernetes_pod_container_name"], "container"),
            relabel(&["__meta_kubernetes_service_name"], "job"),
            json!({"replacement": port, "target_label": "endpoint"}),
        ]
    })
}

/// The jobs the Prometheus Operator makes of a PodMonitor (one per endpoint), reading the
/// targets of the `pod` role from `discovery`.
pub fn pod_monitor_jobs(monitor: &Value, discovery: &Discovery) -> Vec<Value> {
    let namespace = monitor["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let name = monitor["metadata"]["name"].as_str().unwrap_or_default();
    let job = format!("{namespace}/{name}");
    monitor_jobs(monitor, Role::Pod, discovery, |port| {
        vec![
            relabel(&["__meta_kubernetes_namespace"], "namespace"),
            relabel(&["__meta_kubernetes_pod_container_name"], "container"),
            relabel(&["__meta_kubernetes_pod_name"], "pod"),
            json!({"replacement": job, "target_label": "job"}),
            json!({"replacement": port, "target_label": "endpoint"}),
        ]
    })
}

/// One job per endpoint of a ServiceMonitor (`role` endpoints) or a PodMonitor (`role` pod):
/// keep the monitor's namespaces, its selected objects and the endpoint's port, then set the
/// kind's `target_labels` for that port.
fn monitor_jobs(
    monitor: &Value,
    role: Role,
    discovery: &Discovery,
    target_labels: impl Fn(&str) -> Vec<Value>,
) -> Vec<Value> {
    let namespace = monitor["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let name = monitor["metadata"]["name"].as_str().unwrap_or_default();
    let spec = &monitor["spec"];
    let (kind, endpoints, object, port_name) = match role {
        Role::Endpoints => (
            "serviceMonitor",
            "endpoints",
            "service",
            "__meta_kubernetes_endpoint_port_name",
        ),
        Role::Pod => (
            "podMonitor",
            "podMetricsEndpoints",
            "pod",
            "__meta_kubernetes_pod_container_port_name",
        ),
    };
    let endpoints = spec[endpoints].as_array().cloned().unwrap_or_default();
    endpoints
        .iter()
        .enumerate()
        .map(|(i, endpoint)| {
            let port = endpoint["port"].as_str().unwrap_or_default();
            let mut relabels: Vec<Value> = keep_namespaces(monitor).into_iter().collect();
            relabels.extend(keep_selected(object, &spec["selector"]["matchLabels"]));
            relabels.push(json!({"action": "keep", "source_labels": [port_name], "regex": port}));
            relabels.extend(target_labels(port));
            scrape_job(
                format!("{kind}/{namespace}/{name}/{i}"),
                discovery.file(role),
                endpoint,
                relabels,
            )
        })
        .collect()
}

fn scrape_job(job: String, targets: PathBuf, endpoint: &Value, relabels: Vec<Value>) -> Value {
    json!({
        "job_name": job,
        "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
        "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
        "scheme": endpoint["scheme"].as_str().unwrap_or("http"),
        "file_sd_configs": [{"files": [targets], "refresh_interval": "1s"}],
        "relabel_configs": relabels,
    })
}

/// Kubernetes discovery's roles that monitors use.
#[derive(Clone, Copy)]
pub enum Role {
    Endpoints,
    Pod,
}

/// The targets Prometheus's Kubernetes discovery would find, kept in `file_sd` files and
/// refreshed every second from the API server until dropped.
pub struct Discovery {
    dir: PathBuf,
    refresh: tokio::task::JoinHandle<()>,
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self.refresh.abort();
    }
}

impl Discovery {
    /// Start listing into `dir` (the first listing is written before this returns).
    pub async fn start(dir: &Path, client: kube::Client) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = {
            let dir = dir.to_owned();
            move |client: kube::Client| {
                let dir = dir.clone();
                async move {
                    let (endpoints, pods) = (endpoint_targets(&client), pod_targets(&client));
                    for (role, targets) in [
                        (Role::Endpoints, endpoints.await?),
                        (Role::Pod, pods.await?),
                    ] {
                        // Renamed into place: Prometheus never reads half a file.
                        let path = role_file(&dir, role);
                        let partial = path.with_extension("tmp");
                        std::fs::write(&partial, serde_json::to_vec(&targets)?)?;
                        std::fs::rename(&partial, &path)?;
                    }
                    anyhow::Ok(())
                }
            }
        };
        write(client.clone()).await?;
        let refresh = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Err(e) = write(client.clone()).await {
                    eprintln!("[e2e] listing the scrape targets failed: {e:#}");
                }
            }
        });
        Ok(Self {
            dir: dir.to_owned(),
            refresh,
        })
    }

    fn file(&self, role: Role) -> PathBuf {
        role_file(&self.dir, role)
    }
}

fn role_file(dir: &Path, role: Role) -> PathBuf {
    dir.join(match role {
        Role::Endpoints => "endpoints.json",
        Role::Pod => "pods.json",
    })
}

/// `__meta_kubernetes_<object>_label_*` and `_labelpresent_*` of `labels`.
fn object_labels(
    object: &str,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for (key, value) in labels.into_iter().flatten() {
        let key = sanitized(key);
        out.insert(
            format!("__meta_kubernetes_{object}_label_{key}"),
            json!(value),
        );
        out.insert(
            format!("__meta_kubernetes_{object}_labelpresent_{key}"),
            json!("true"),
        );
    }
    out
}

/// The `endpoints` role: one target per address and port of every Endpoints object.
async fn endpoint_targets(client: &kube::Client) -> Result<Vec<Value>> {
    use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
    let list = kube::api::ListParams::default();
    let endpoints = kube::Api::<Endpoints>::all(client.clone())
        .list(&list)
        .await?;
    let services = kube::Api::<Service>::all(client.clone())
        .list(&list)
        .await?;
    let pods = kube::Api::<Pod>::all(client.clone()).list(&list).await?;
    let mut targets = Vec::new();
    for object in &endpoints.items {
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let name = object.metadata.name.clone().unwrap_or_default();
        let service = services.items.iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(&namespace)
                && s.metadata.name.as_deref() == Some(&name)
        });
        for subset in object.subsets.iter().flatten() {
            for address in subset.addresses.iter().flatten() {
                let target = address.target_ref.as_ref();
                let pod = target
                    .filter(|t| t.kind.as_deref() == Some("Pod"))
                    .and_then(|t| {
                        pods.items.iter().find(|p| {
                            p.metadata.namespace.as_deref() == Some(&namespace)
                                && p.metadata.name == t.name
                        })
                    });
                for port in subset.ports.iter().flatten() {
                    let mut labels =
                        object_labels("service", service.and_then(|s| s.metadata.labels.as_ref()));
                    labels.extend([
                        ("__meta_kubernetes_namespace".into(), json!(namespace)),
                        ("__meta_kubernetes_service_name".into(), json!(name)),
                        (
                            "__meta_kubernetes_endpoint_port_name".into(),
                            json!(port.name.clone().unwrap_or_default()),
                        ),
                        (
                            "__meta_kubernetes_endpoint_address_target_kind".into(),
                            json!(target.and_then(|t| t.kind.clone()).unwrap_or_default()),
                        ),
                        (
                            "__meta_kubernetes_endpoint_address_target_name".into(),
                            json!(target.and_then(|t| t.name.clone()).unwrap_or_default()),
                        ),
                    ]);
                    if let Some(pod) = pod {
                        labels.insert(
                            "__meta_kubernetes_pod_name".into(),
                            json!(pod.metadata.name.clone().unwrap_or_default()),
                        );
                        // The container that declares the port, as discovery names it.
                        let container =
                            pod.spec.iter().flat_map(|s| s.containers.iter()).find(|c| {
                                c.ports
                                    .iter()
                                    .flatten()
                                    .any(|p| p.container_port == port.port)
                            });
                        if let Some(c) = container {
                            labels.insert(
                                "__meta_kubernetes_pod_container_name".into(),
                                json!(c.name),
                            );
                        }
                    }
                    targets.push(json!({"targets": [format!("{}:{}", address.ip, port.port)], "labels": labels}));
                }
            }
        }
    }
    Ok(targets)
}

/// The `pod` role: one target per declared port of every container, init containers (and so
/// native sidecars) included, of every pod with an IP.
async fn pod_targets(client: &kube::Client) -> Result<Vec<Value>> {
    use k8s_openapi::api::core::v1::Pod;
    let pods = kube::Api::<Pod>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await?;
    let mut targets = Vec::new();
    for pod in &pods.items {
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let Some(spec) = &pod.spec else { continue };
        let containers = spec
            .containers
            .iter()
            .map(|c| (c, false))
            .chain(spec.init_containers.iter().flatten().map(|c| (c, true)));
        for (container, init) in containers {
            for port in container.ports.iter().flatten() {
                let mut labels = object_labels("pod", pod.metadata.labels.as_ref());
                labels.extend([
                    (
                        "__meta_kubernetes_namespace".into(),
                        json!(pod.metadata.namespace.clone().unwrap_or_default()),
                    ),
                    (
                        "__meta_kubernetes_pod_name".into(),
                        json!(pod.metadata.name.clone().unwrap_or_default()),
                    ),
                    (
                        "__meta_kubernetes_pod_container_name".into(),
                        json!(container.name),
                    ),
                    (
                        "__meta_kubernetes_pod_container_init".into(),
                        json!(init.to_string()),
                    ),
                    (
                        "__meta_kubernetes_pod_container_port_name".into(),
                        json!(port.name.clone().unwrap_or_default()),
                    ),
                    (
                        "__meta_kubernetes_pod_container_port_number".into(),
                        json!(port.container_port.to_string()),
                    ),
                ]);
                targets.push(
                    json!({"targets": [format!("{ip}:{}", port.container_port)], "labels": labels}),
                );
            }
        }
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_service_monitor_becomes_the_prometheus_operators_job() {
        let monitor = json!({
            "metadata": {"name": "perago-operator", "namespace": "perago-system"},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "perago-operator"}},
                     "endpoints": [{"port": "http", "honorLabels": true}]},
        });
        let discovery = Discovery {
            dir: PathBuf::from("/sd"),
            refresh: tokio::spawn(async {}),
        };
        let job = &service_monitor_jobs(&monitor, &discovery)[0];
        assert_eq!(
            job["job_name"],
            "serviceMonitor/perago-system/perago-operator/0"
        );
        assert_eq!(job["honor_labels"], true);
        assert_eq!(job["file_sd_configs"][0]["files"][0], "/sd/endpoints.json");
        let relabels = job["relabel_configs"].as_array().unwrap();
        assert_eq!(
            relabels[0]["regex"], "(perago-system)",
            "its own namespace only"
        );
        assert_eq!(
            relabels[1]["source_labels"][0],
            "__meta_kubernetes_service_label_app_kubernetes_io_name"
        );
    }
}
