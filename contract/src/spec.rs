//! The parts of a `PeragoTask`'s spec the task contract carries to the sidecar: guardrails,
//! metrics and the publish budget. They are defined here, without Kubernetes types, so the
//! sidecar and the runner need no Kubernetes crates; the CRD's schema is derived from the same
//! types when the `schemars` feature is on.

use serde::{Deserialize, Serialize};

/// Application metric label keys the runtime sets itself.
pub const RESERVED_METRIC_LABELS: [&str; 5] = [
    "task_name",
    "task_id",
    "workflow_instance_id",
    "execution_id",
    "worker_id",
];

fn default_true() -> bool {
    true
}

/// One check of the workspace's file shape.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Guardrail {
    /// `requireFile`, `requireDir`, `requireGlob` or `forbidGlob`.
    pub kind: GuardrailKind,
    /// Path (requireFile, requireDir) or glob pattern (requireGlob, forbidGlob), relative to the
    /// workspace root.
    pub path: String,
    /// requireGlob only: fewest matches allowed (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 0)))]
    pub min_count: Option<i64>,
    /// requireGlob only: most matches allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 0)))]
    pub max_count: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum GuardrailKind {
    RequireFile,
    RequireDir,
    RequireGlob,
    ForbidGlob,
}

impl GuardrailKind {
    /// The name used in guardrail messages, as Python Perago spells it.
    pub fn message_name(self) -> &'static str {
        match self {
            Self::RequireFile => "require_file",
            Self::RequireDir => "require_dir",
            Self::RequireGlob => "require_glob",
            Self::ForbidGlob => "forbid_glob",
        }
    }
}

/// Metrics the sidecar exports for this task.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MetricSpec {
    /// `task_attempt_duration_seconds`.
    #[serde(default = "default_true")]
    pub attempts: bool,
    /// `workspace_io_duration_seconds` and `workspace_io_bytes` (workspace tasks only).
    #[serde(default = "default_true")]
    pub workspace_io: bool,
    /// `busy_slots`.
    #[serde(default = "default_true")]
    pub worker_capacity: bool,
    /// Application metrics the body may record; anything else it records is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schemars", schemars(length(max = 64)))]
    pub application: Vec<ApplicationMetric>,
}

impl Default for MetricSpec {
    fn default() -> Self {
        Self {
            attempts: true,
            workspace_io: true,
            worker_capacity: true,
            application: Vec::new(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApplicationMetric {
    /// Name without the `app_` prefix the sidecar adds.
    pub name: String,
    /// `histogram`, `gauge` or `timer` (a histogram of seconds).
    pub kind: ApplicationMetricKind,
    /// Label keys the body may set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schemars", schemars(length(max = 16)))]
    pub labels: Vec<String>,
    /// The metric's help text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ApplicationMetricKind {
    Histogram,
    Gauge,
    /// A histogram of durations in seconds.
    Timer,
}

/// Time budget of one publication; all six fields are required.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PublishBudget {
    /// The 99th percentile of the merges measured on this lakeFS (what the budget is sized for).
    #[cfg_attr(feature = "schemars", schemars(range(min = 0)))]
    pub observed_merge_p99_seconds: i64,
    /// Time added to the observed merge for the rest of the publication.
    #[cfg_attr(feature = "schemars", schemars(range(min = 0)))]
    pub safety_margin_seconds: i64,
    /// Per-request timeout of the lakeFS merge.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub lakefs_merge_timeout_seconds: i64,
    /// Per-request timeout of the Conductor result update.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub conductor_completion_timeout_seconds: i64,
    /// Drain time a stopping pod gives its running attempts (the sidecar's shutdown grace);
    /// the pod's `terminationGracePeriodSeconds` is 15 s more, for the last report.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub worker_shutdown_grace_seconds: i64,
    /// Upper bound of the lease-extension interval.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub heartbeat_interval_seconds: i64,
}

impl PublishBudget {
    /// The response timeout the budget needs: merge + completion + shutdown grace + heartbeat.
    pub fn response_timeout_seconds(&self) -> i64 {
        self.lakefs_merge_timeout_seconds
            + self.conductor_completion_timeout_seconds
            + self.worker_shutdown_grace_seconds
            + self.heartbeat_interval_seconds
    }
}
