//! Logs and metrics.
//!
//! Logs are one JSON object per line on stderr with RFC 3339 UTC timestamps; every line of an
//! attempt carries its span (workflow instance, task id, retry count, execution id).
//!
//! Metrics: the sidecar's own (`perago_sidecar_*`), the runtime metrics of Python Perago 0.6.1
//! (`runtime_*`, each family switchable by the task's `metrics` spec) and the application
//! metrics the body records (`app_*`, only those the task declares).

use std::collections::HashMap;

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use serde::Deserialize;
use serde_json::Value;
use tracing::warn;

use crate::delivery::ExportCounters;
use crate::failure::AttemptError;
use crate::trace::TraceCounters;
use perago_contract::spec::RESERVED_METRIC_LABELS;
use perago_contract::spec::{ApplicationMetricKind, MetricSpec};

const DURATION_BUCKETS: [f64; 17] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0,
    3600.0,
];

fn bytes_buckets() -> Vec<f64> {
    // 1 KiB .. 64 GiB, ×4 per bucket.
    (0..14).map(|i| 1024.0 * 4f64.powi(i)).collect()
}

/// Every metric the sidecar exports.
pub struct Metrics {
    registry: Registry,
    pub polls: IntCounterVec,
    pub polled_tasks: IntCounter,
    pub attempts: IntCounterVec,
    phase_seconds: HistogramVec,
    pub slots: IntGauge,
    pub slots_busy: IntGauge,
    pub runner_connected: IntGauge,
    pub conductor_errors: IntCounterVec,
    pub rejected_completions: IntCounter,
    pub results_lost: IntCounter,
    pub lease_extensions: IntCounterVec,
    pub merge_refusals: IntCounterVec,
    pub attempt_failures: IntCounterVec,
    pub attempt_verdicts: IntCounterVec,
    pub staging_branches_swept: IntCounter,
    pub hard_fence_installed: IntGaugeVec,
    pub traces: TraceCounters,
    pub openlineage: ExportCounters,
    runtime: RuntimeMetrics,
    application: HashMap<String, AppMetric>,
    task_name: String,
    /// Prometheus family name → OTLP name, for the task metrics exported over OTLP.
    otlp_names: HashMap<String, String>,
}

struct RuntimeMetrics {
    attempt_seconds: Option<HistogramVec>,
    io_seconds: Option<HistogramVec>,
    io_bytes: Option<HistogramVec>,
    busy_slots: Option<GaugeVec>,
    instance_id: String,
}

struct AppMetric {
    family: AppFamily,
    labels: Vec<String>,
    kind: ApplicationMetricKind,
}

enum AppFamily {
    Histogram(HistogramVec),
    Gauge(GaugeVec),
}

/// One sample a body wrote to its metrics file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sample {
    kind: String,
    name: String,
    value: f64,
    #[serde(default)]
    labels: serde_json::Map<String, Value>,
}

/// Prometheus names allow `[a-zA-Z0-9_:]`; declared names may also use `.` and `-`.
fn prometheus_name(prefix: &str, name: &str) -> String {
    let mut out = String::from(prefix);
    out.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        }
    }));
    out
}

type RegisterResult<T> = Result<T, prometheus::Error>;

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
    labels: &[&str],
) -> RegisterResult<HistogramVec> {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)?;
    registry.register(Box::new(h.clone()))?;
    Ok(h)
}

fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> RegisterResult<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

fn counter1(registry: &Registry, name: &str, help: &str) -> RegisterResult<IntCounter> {
    let c = IntCounter::new(name, help)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge1(registry: &Registry, name: &str, help: &str) -> RegisterResult<IntGauge> {
    let g = IntGauge::new(name, help)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    pub fn new(
        task_name: &str,
        spec: Option<&MetricSpec>,
        instance_id: &str,
    ) -> RegisterResult<Self> {
        let registry = Registry::new();
        perago_telemetry::register_build_info(&registry)?;
        let r = &registry;
        let on = |pick: fn(&MetricSpec) -> bool| spec.is_some_and(pick);
        let runtime = RuntimeMetrics {
            attempt_seconds: on(|s| s.attempts)
                .then(|| {
                    histogram(
                        r,
                        "runtime_task_attempt_duration_seconds",
                        "Seconds around one whole attempt, reporting excluded.",
                        DURATION_BUCKETS.to_vec(),
                        &["task_name"],
                    )
                })
                .transpose()?,
            io_seconds: on(|s| s.workspace_io)
                .then(|| {
                    histogram(
                        r,
                        "runtime_workspace_io_duration_seconds",
                        "Seconds of workspace download, upload and publish.",
                        DURATION_BUCKETS.to_vec(),
                        &["task_name", "operation"],
                    )
                })
                .transpose()?,
            io_bytes: on(|s| s.workspace_io)
                .then(|| {
                    histogram(
                        r,
                        "runtime_workspace_io_bytes",
                        "Bytes of the workspace downloaded or staged.",
                        bytes_buckets(),
                        &["task_name", "operation"],
                    )
                })
                .transpose()?,
            busy_slots: on(|s| s.worker_capacity)
                .then(|| -> RegisterResult<GaugeVec> {
                    let g = GaugeVec::new(
                        Opts::new("runtime_busy_slots", "Body slots running an attempt."),
                        &["task_name", "perago_instance_id"],
                    )?;
                    r.register(Box::new(g.clone()))?;
                    Ok(g)
                })
                .transpose()?,
            instance_id: instance_id.to_owned(),
        };
        let mut otlp_names: HashMap<String, String> = [
            "task_attempt_duration_seconds",
            "workspace_io_duration_seconds",
            "workspace_io_bytes",
            "busy_slots",
        ]
        .iter()
        .map(|n| (format!("runtime_{n}"), format!("runtime.{n}")))
        .collect();
        let mut application = HashMap::new();
        for declared in spec.map(|s| s.application.as_slice()).unwrap_or_default() {
            let name = prometheus_name("app_", &declared.name);
            otlp_names.insert(name.clone(), format!("app.{}", declared.name));
            let mut labels: Vec<&str> = vec!["task_name"];
            labels.extend(
                declared
                    .labels
                    .iter()
                    .map(String::as_str)
                    .filter(|l| !RESERVED_METRIC_LABELS.contains(l)),
            );
            let help = declared
                .description
                .clone()
                .unwrap_or_else(|| format!("Application metric {}.", declared.name));
            let family = match declared.kind {
                ApplicationMetricKind::Gauge => {
                    let g = GaugeVec::new(Opts::new(name, help), &labels)?;
                    registry.register(Box::new(g.clone()))?;
                    AppFamily::Gauge(g)
                }
                ApplicationMetricKind::Histogram | ApplicationMetricKind::Timer => {
                    AppFamily::Histogram(histogram(
                        r,
                        &name,
                        &help,
                        DURATION_BUCKETS.to_vec(),
                        &labels,
                    )?)
                }
            };
            application.insert(
                declared.name.clone(),
                AppMetric {
                    family,
                    labels: labels.iter().skip(1).map(|s| (*s).to_owned()).collect(),
                    kind: declared.kind,
                },
            );
        }
        Ok(Self {
            polls: counter(
                r,
                "perago_sidecar_polls_total",
                "Conductor batch polls by outcome (tasks, empty, error).",
                &["outcome"],
            )?,
            polled_tasks: counter1(
                r,
                "perago_sidecar_polled_tasks_total",
                "Tasks received from Conductor.",
            )?,
            attempts: counter(
                r,
                "perago_sidecar_attempts_total",
                "Finished attempts by reported status.",
                &["status"],
            )?,
            phase_seconds: histogram(
                r,
                "perago_sidecar_phase_duration_seconds",
                "Seconds spent per attempt phase.",
                DURATION_BUCKETS.to_vec(),
                &["phase"],
            )?,
            slots: gauge1(r, "perago_sidecar_slots", "Body slots of this pod.")?,
            slots_busy: gauge1(
                r,
                "perago_sidecar_slots_busy",
                "Body slots running an attempt.",
            )?,
            runner_connected: gauge1(
                r,
                "perago_sidecar_runner_connected",
                "1 while a perago-runner is connected.",
            )?,
            conductor_errors: counter(
                r,
                "perago_sidecar_conductor_errors_total",
                "Failed Conductor calls by call.",
                &["call"],
            )?,
            rejected_completions: counter1(
                r,
                "perago_sidecar_rejected_completions_total",
                "Runner completions for unknown or stale executions.",
            )?,
            results_lost: counter1(
                r,
                "perago_sidecar_results_lost_total",
                "Results that could not be delivered to Conductor.",
            )?,
            lease_extensions: counter(
                r,
                "perago_sidecar_lease_extensions_total",
                "Lease extensions by outcome (ok, error).",
                &["outcome"],
            )?,
            attempt_failures: counter(
                r,
                "perago_sidecar_attempt_failures_total",
                &format!(
                    "Attempts that did not complete, by the failure table's row ({}).",
                    AttemptError::LABELS.join(", ")
                ),
                &["reason"],
            )?,
            attempt_verdicts: counter(
                r,
                "perago_sidecar_attempt_verdicts_total",
                "Finished attempts by what a canary analysis makes of them (completed, body_failed, not_judged).",
                &["verdict"],
            )?,
            merge_refusals: counter(
                r,
                "perago_sidecar_merge_refusals_total",
                "Merges lakeFS refused without merging (retried within the merge budget), by HTTP status.",
                &["status"],
            )?,
            staging_branches_swept: counter1(
                r,
                "perago_sidecar_staging_branches_swept_total",
                "Staging branches of dead attempts of this task type removed by the periodic sweep.",
            )?,
            hard_fence_installed: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "perago_sidecar_hard_fence_installed",
                        "1 when the hard fence guards the target branch this pod publishes to, 0 when only the soft fence does.",
                    ),
                    &["repository", "branch"],
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            traces: TraceCounters {
                exported: counter1(
                    r,
                    "perago_sidecar_trace_spans_exported_total",
                    "Attempt spans the OTLP traces endpoint accepted.",
                )?,
                dropped: counter(
                    r,
                    "perago_sidecar_trace_spans_dropped_total",
                    "Attempt spans dropped, by reason (queue_full, export_failed).",
                    &["reason"],
                )?,
            },
            openlineage: ExportCounters {
                exported: counter1(
                    r,
                    "perago_sidecar_openlineage_events_sent_total",
                    "OpenLineage run events the endpoint accepted.",
                )?,
                dropped: counter(
                    r,
                    "perago_sidecar_openlineage_events_dropped_total",
                    "OpenLineage run events dropped, by reason (queue_full, export_failed).",
                    &["reason"],
                )?,
            },
            runtime,
            application,
            task_name: task_name.to_owned(),
            otlp_names,
            registry,
        })
    }

    /// The task metrics (runtime and application) with their OTLP names.
    pub fn otlp_families(&self) -> Vec<(String, prometheus::proto::MetricFamily)> {
        self.registry
            .gather()
            .into_iter()
            .filter_map(|f| self.otlp_names.get(f.name()).map(|n| (n.clone(), f)))
            .collect()
    }

    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }

    /// One attempt phase (input, download, body, fence, publish, report) took since `started`.
    pub fn observe_phase(&self, phase: &str, started: std::time::Instant) {
        self.phase_seconds
            .with_label_values(&[phase])
            .observe(started.elapsed().as_secs_f64());
    }

    /// Time a phase until the returned guard is dropped, on every path out of it.
    pub fn time_phase(&self, phase: &'static str) -> PhaseTimer<'_> {
        PhaseTimer {
            metrics: self,
            phase,
            started: std::time::Instant::now(),
        }
    }

    pub fn record_attempt_seconds(&self, seconds: f64) {
        if let Some(h) = &self.runtime.attempt_seconds {
            h.with_label_values(&[self.task_name.as_str()])
                .observe(seconds);
        }
    }

    pub fn record_workspace_io(&self, operation: &str, seconds: f64, bytes: Option<u64>) {
        if let Some(h) = &self.runtime.io_seconds {
            h.with_label_values(&[self.task_name.as_str(), operation])
                .observe(seconds);
        }
        if let (Some(h), Some(bytes)) = (&self.runtime.io_bytes, bytes) {
            #[allow(clippy::cast_precision_loss)]
            h.with_label_values(&[self.task_name.as_str(), operation])
                .observe(bytes as f64);
        }
    }

    pub fn set_busy(&self, busy: usize) {
        let busy = i64::try_from(busy).unwrap_or(i64::MAX);
        self.slots_busy.set(busy);
        if let Some(g) = &self.runtime.busy_slots {
            #[allow(clippy::cast_precision_loss)]
            g.with_label_values(&[self.task_name.as_str(), self.runtime.instance_id.as_str()])
                .set(busy as f64);
        }
    }

    /// Record the samples of a body's metrics file (one JSON object per line). Anything not
    /// declared is refused with a warning; returns how many samples were recorded.
    pub fn record_application(&self, text: &str) -> usize {
        let mut recorded = 0;
        for (number, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let sample: Sample = match serde_json::from_str(line) {
                Ok(s) => s,
                Err(e) => {
                    warn!(line = number + 1, error = %e, "ignored unreadable application metric sample");
                    continue;
                }
            };
            if self.record_sample(&sample) {
                recorded += 1;
            }
        }
        recorded
    }

    fn record_sample(&self, sample: &Sample) -> bool {
        let full_name = format!("app.{}", sample.name);
        let Some(metric) = self.application.get(&sample.name) else {
            warn!(metric_name = %full_name, "ignored application metric the task does not declare");
            return false;
        };
        let kind_ok = matches!(
            (metric.kind, sample.kind.as_str()),
            (ApplicationMetricKind::Gauge, "gauge")
                | (ApplicationMetricKind::Histogram, "histogram")
                | (ApplicationMetricKind::Timer, "timer" | "histogram")
        );
        if !kind_ok || !sample.value.is_finite() {
            warn!(metric_name = %full_name, kind = %sample.kind, value = sample.value, "ignored application metric sample of the wrong kind or with a non-finite value");
            return false;
        }
        let mut values: Vec<String> = vec![String::new(); metric.labels.len()];
        for (key, value) in &sample.labels {
            let text = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            if RESERVED_METRIC_LABELS.contains(&key.as_str()) {
                let perago_value = if key == "task_name" {
                    self.task_name.as_str()
                } else {
                    "<reserved>"
                };
                warn!(
                    "metric_name={full_name} label_key={key} perago_label_value={perago_value} ignored_user_label_value={text}"
                );
                continue;
            }
            match metric.labels.iter().position(|l| l == key) {
                Some(i) => values[i] = text,
                None => {
                    warn!(metric_name = %full_name, label_key = %key, "ignored application metric label the task does not declare")
                }
            }
        }
        let mut all: Vec<&str> = vec![self.task_name.as_str()];
        all.extend(values.iter().map(String::as_str));
        match &metric.family {
            AppFamily::Histogram(h) => h.with_label_values(&all).observe(sample.value),
            AppFamily::Gauge(g) => g.with_label_values(&all).set(sample.value),
        }
        true
    }
}

/// Observes its phase's duration in `perago_sidecar_phase_duration_seconds` when dropped.
pub struct PhaseTimer<'a> {
    metrics: &'a Metrics,
    phase: &'static str,
    started: std::time::Instant,
}

impl Drop for PhaseTimer<'_> {
    fn drop(&mut self) {
        self.metrics.observe_phase(self.phase, self.started);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perago_contract::spec::ApplicationMetric;

    fn spec() -> MetricSpec {
        MetricSpec {
            application: vec![
                ApplicationMetric {
                    name: "items".into(),
                    kind: ApplicationMetricKind::Histogram,
                    labels: vec![],
                    description: None,
                },
                ApplicationMetric {
                    name: "compute_seconds".into(),
                    kind: ApplicationMetricKind::Timer,
                    labels: vec!["stage".into()],
                    description: None,
                },
                ApplicationMetric {
                    name: "last.total".into(),
                    kind: ApplicationMetricKind::Gauge,
                    labels: vec![],
                    description: None,
                },
            ],
            ..MetricSpec::default()
        }
    }

    #[test]
    fn application_samples_follow_the_declaration() {
        let m = Metrics::new("demo.count", Some(&spec()), "pod-a").unwrap();
        let text = [
            r#"{"kind":"histogram","name":"items","value":4}"#,
            r#"{"kind":"timer","name":"compute_seconds","value":0.25,"labels":{"stage":"sum","other":"x"}}"#,
            r#"{"kind":"gauge","name":"last.total","value":6,"labels":{"task_id":"x","task_name":"y"}}"#,
            r#"{"kind":"gauge","name":"undeclared","value":1}"#,
            r#"{"kind":"gauge","name":"items","value":1}"#,
            "not json",
        ]
        .join("\n");
        assert_eq!(m.record_application(&text), 3);
        let out = m.render();
        assert!(
            out.contains(r#"app_items_count{task_name="demo.count"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(r#"app_compute_seconds_sum{stage="sum",task_name="demo.count"} 0.25"#),
            "{out}"
        );
        assert!(
            out.contains(r#"app_last_total{task_name="demo.count"} 6"#),
            "{out}"
        );
        assert!(!out.contains("undeclared"));
    }

    #[test]
    fn runtime_families_follow_the_switches() {
        let off = MetricSpec {
            attempts: false,
            workspace_io: false,
            worker_capacity: true,
            application: vec![],
        };
        let m = Metrics::new("t", Some(&off), "pod-a").unwrap();
        m.record_attempt_seconds(1.0);
        m.set_busy(2);
        let out = m.render();
        assert!(!out.contains("runtime_task_attempt_duration_seconds"));
        assert!(
            out.contains(r#"runtime_busy_slots{perago_instance_id="pod-a",task_name="t"} 2"#),
            "{out}"
        );
        let none = Metrics::new("t", None, "pod-a").unwrap();
        none.set_busy(1);
        assert!(!none.render().contains("runtime_busy_slots"));
        assert!(none.render().contains("perago_sidecar_slots_busy 1"));
    }
}
