//! A real OpenTelemetry Collector (built by `e2e/bin/obtain otelcol` from the collector's Go
//! modules with its builder: the OTLP receiver and the file exporter) that receives the
//! sidecars' attempt traces over OTLP/HTTP and writes them as JSON lines the tests read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::process::{ServerProcess, free_port, obtain, wait_ready};

/// A running collector.
pub struct Collector {
    /// The OTLP/HTTP traces URL (`http://<host>:<port>/v1/traces`).
    pub endpoint: String,
    file: PathBuf,
    _process: ServerProcess,
}

/// One span as the collector received it.
#[derive(Clone, Debug)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub start: u64,
    pub end: u64,
    /// `STATUS_CODE_ERROR` spans carry their message here.
    pub error: Option<String>,
    pub attributes: BTreeMap<String, Value>,
    pub resource: BTreeMap<String, Value>,
}

/// Whether `span` is `root` or below it, by its parents among `spans`.
fn below(spans: &[Span], span: &Span, root: &Span) -> bool {
    let mut at = span;
    for _ in 0..spans.len() + 1 {
        if at.span_id == root.span_id {
            return true;
        }
        match spans
            .iter()
            .find(|s| s.trace_id == at.trace_id && s.span_id == at.parent_span_id)
        {
            Some(parent) => at = parent,
            None => return false,
        }
    }
    false
}

impl Span {
    /// A string attribute, if the span has it.
    pub fn text(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }
}

/// OTLP/JSON attributes (`[{key, value: {stringValue|intValue|…}}]`) as a map; integers come
/// as strings in OTLP/JSON and are kept so.
fn attributes(list: &Value) -> BTreeMap<String, Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|kv| {
            let value = kv["value"].as_object()?.values().next()?.clone();
            Some((kv["key"].as_str()?.to_owned(), value))
        })
        .collect()
}

fn nanos(v: &Value) -> u64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_u64())
        .unwrap_or(0)
}

impl Collector {
    /// Start a collector whose OTLP/HTTP receiver listens on `host` (an address the senders
    /// reach: loopback for local sidecars, the node's bridge for pods), its files in `dir`.
    pub async fn start(dir: &Path, host: &str) -> Result<Self> {
        let home = dir.join("otelcol");
        std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
        let file = home.join("traces.jsonl");
        let port = free_port()?;
        let config = home.join("config.yaml");
        let document = json!({
            "receivers": {"otlp": {"protocols": {"http": {"endpoint": format!("{host}:{port}")}}}},
            "exporters": {"file": {"path": file, "format": "json", "flush_interval": "100ms"}},
            "service": {
                "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}},
                // No self-monitoring endpoint: nothing else to listen on.
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
            },
        });
        // JSON is YAML.
        std::fs::write(&config, serde_json::to_vec_pretty(&document)?)?;
        let mut cmd = Command::new(obtain("otelcol")?);
        cmd.arg(format!("--config=file:{}", config.display()))
            .current_dir(&home);
        let mut process = ServerProcess::spawn("otelcol", &mut cmd, dir.join("otelcol.log"))?;
        let endpoint = format!("http://{host}:{port}/v1/traces");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let took = wait_ready(&mut process, Duration::from_secs(60), || {
            // An empty export request: 200 once the receiver serves.
            let probe = http
                .post(&endpoint)
                .header("Content-Type", "application/json")
                .body("{}")
                .send();
            async move { probe.await.is_ok_and(|r| r.status().is_success()) }
        })
        .await?;
        eprintln!("[e2e] otelcol receiving on {endpoint} in {took:.1?}");
        Ok(Self {
            endpoint,
            file,
            _process: process,
        })
    }

    /// Every span written so far.
    pub fn spans(&self) -> Result<Vec<Span>> {
        let text = match std::fs::read_to_string(&self.file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.file.display())),
        };
        let mut spans = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let request: Value = serde_json::from_str(line).with_context(|| {
                format!("a line of {} is not JSON: {line}", self.file.display())
            })?;
            for resource_spans in request["resourceSpans"].as_array().into_iter().flatten() {
                let resource = attributes(&resource_spans["resource"]["attributes"]);
                for scope in resource_spans["scopeSpans"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    for s in scope["spans"].as_array().into_iter().flatten() {
                        let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
                        spans.push(Span {
                            trace_id: text("traceId"),
                            span_id: text("spanId"),
                            parent_span_id: text("parentSpanId"),
                            name: text("name"),
                            start: nanos(&s["startTimeUnixNano"]),
                            end: nanos(&s["endTimeUnixNano"]),
                            error: (s["status"]["code"] == 2
                                || s["status"]["code"] == "STATUS_CODE_ERROR")
                                .then(|| {
                                    s["status"]["message"]
                                        .as_str()
                                        .unwrap_or_default()
                                        .to_owned()
                                }),
                            attributes: attributes(&s["attributes"]),
                            resource: resource.clone(),
                        });
                    }
                }
            }
        }
        Ok(spans)
    }

    /// The attempts whose root span (`attempt`) has `key` = one of `values`, each as the root
    /// and the spans below it in start order (the root first), once there is one for every
    /// value (within `limit`). Attempts of one workflow share a trace; each is its own here.
    pub async fn traces_where(
        &self,
        key: &str,
        values: &[&str],
        limit: Duration,
    ) -> Result<Vec<Vec<Span>>> {
        let wanted: BTreeSet<&str> = values.iter().copied().collect();
        let started = std::time::Instant::now();
        loop {
            let spans = self.spans()?;
            let roots: Vec<&Span> = spans
                .iter()
                .filter(|s| s.name == "attempt" && s.text(key).is_some_and(|v| wanted.contains(v)))
                .collect();
            let found: BTreeSet<&str> = roots.iter().filter_map(|r| r.text(key)).collect();
            if found == wanted {
                return Ok(roots
                    .iter()
                    .map(|root| {
                        let mut trace: Vec<Span> = spans
                            .iter()
                            .filter(|s| s.trace_id == root.trace_id && below(&spans, s, root))
                            .cloned()
                            .collect();
                        // The root starts with the poll: a stable sort keeps it first.
                        trace.sort_by_key(|s| (s.start, s.name != "attempt"));
                        trace
                    })
                    .collect());
            }
            if started.elapsed() > limit {
                bail!(
                    "the collector holds root spans for {found:?} of {wanted:?} after {limit:?} ({} spans in all)",
                    spans.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
