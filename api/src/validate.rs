//! Validation of a `PeragoTaskSpec`, shared by the operator and the offline CLI.
//!
//! The rules and messages are Python Perago's declaration checks, plus Conductor's own TaskDef
//! rules that Python Perago does not check (so registration never fails late). Checks run in
//! a fixed order and the first failure wins, as in `perago check`.

use std::fmt;

use crate::paths::{self, PathError};
#[cfg(feature = "schema-check")]
use crate::schema;
use crate::task::{ApplicationMetric, Guardrail, GuardrailKind, PeragoTaskSpec};

/// A definition error, naming the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path from the resource root, e.g. `spec.workspace.prefix`.
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for FieldError {}

/// The warning printed once per check for a read-only task that declares a publish budget.
pub const READ_ONLY_BUDGET_WARNING: &str = "WorkspaceSpec(read_only=True) disables workspace publication; TaskControls.publish_budget is ignored.";

pub use perago_contract::spec::RESERVED_METRIC_LABELS;

/// Validate a spec. On success, returns the warnings to show (each once).
pub fn validate(spec: &PeragoTaskSpec) -> Result<Vec<String>, FieldError> {
    if spec.task_name.trim().is_empty() {
        return Err(FieldError::new("spec.taskName", "task name is required"));
    }
    if spec.task_name.contains(['/', '\\']) {
        return Err(FieldError::new(
            "spec.taskName",
            "task name must not contain path separators",
        ));
    }
    if spec.owner_email.trim().is_empty() {
        return Err(FieldError::new(
            "spec.ownerEmail",
            "owner_email is required",
        ));
    }
    let budget = spec.controls.publish_budget.as_ref();
    if spec.workspace.is_none() && budget.is_some() {
        return Err(FieldError::new(
            "spec.controls.publishBudget",
            "publish_budget requires workspace=WorkspaceSpec(...)",
        ));
    }
    if let Some(ws) = &spec.workspace {
        paths::normalize_prefix(&ws.prefix)
            .map_err(|e| FieldError::new("spec.workspace.prefix", e.to_string()))?;
        check_guardrails(&ws.pre, "spec.workspace.pre")?;
        check_guardrails(&ws.post, "spec.workspace.post")?;
    }
    check_controls(spec)?;
    #[cfg(feature = "schema-check")]
    {
        schema::check(&spec.params_schema)
            .map_err(|e| FieldError::new("spec.paramsSchema", e.to_string()))?;
        schema::check(&spec.result_schema)
            .map_err(|e| FieldError::new("spec.resultSchema", e.to_string()))?;
    }
    if let Some(metrics) = &spec.metrics {
        check_application_metrics(&metrics.application)?;
    }
    check_executor(spec)?;
    if let Some(rollout) = &spec.rollout {
        crate::rollout::check(rollout)?;
    }
    if let Some(problem) = spec.domain().and_then(perago_contract::domain::problem) {
        return Err(FieldError::new("spec.conductor.domain", problem));
    }
    let conductor_tls = spec.conductor.as_ref().and_then(|c| c.tls.as_ref());
    let lakefs_tls = spec.lakefs.as_ref().and_then(|l| l.tls.as_ref());
    for (field, tls) in [
        ("spec.conductor.tls.caBundleRef", conductor_tls),
        ("spec.lakefs.tls.caBundleRef", lakefs_tls),
    ] {
        if let Some(bundle) = tls.and_then(|t| t.ca_bundle_ref.as_ref()) {
            check_ca_bundle(field, bundle)?;
        }
    }
    for (field, tls) in [
        (
            "spec.conductor.tls.clientCertificateRef.name",
            conductor_tls,
        ),
        ("spec.lakefs.tls.clientCertificateRef.name", lakefs_tls),
    ] {
        if let Some(secret) = tls.and_then(|t| t.client_certificate_ref.as_ref())
            && secret.name.trim().is_empty()
        {
            return Err(FieldError::new(field, "name is required"));
        }
    }
    if let Some(open_lineage) = spec.open_lineage() {
        check_open_lineage(open_lineage)?;
    }

    let mut warnings = Vec::new();
    if let (Some(ws), Some(budget)) = (&spec.workspace, budget) {
        if ws.read_only {
            warnings.push(READ_ONLY_BUDGET_WARNING.to_owned());
        } else {
            let derived = budget.response_timeout_seconds();
            let response = spec.controls.timeout.response_seconds;
            if response < derived {
                warnings.push(format!(
                    "Task '{}' has TaskControls.timeout.response_seconds={response} which is shorter than \
                     publish_budget.response_timeout_seconds={derived}; responseTimeoutSeconds will use \
                     timeout.response_seconds",
                    spec.task_name
                ));
            }
        }
    }
    if let Some(policy) = &spec.executor.network_policy
        && policy.enabled == Some(false)
        && !(policy.egress.is_empty() && policy.ingress.is_empty())
    {
        warnings.push(NETWORK_POLICY_OFF_WARNING.to_owned());
    }
    Ok(warnings)
}

pub const NETWORK_POLICY_OFF_WARNING: &str =
    "spec.executor.networkPolicy.enabled is false: its egress and ingress rules are not used";

fn check_guardrails(guardrails: &[Guardrail], field: &str) -> Result<(), FieldError> {
    for (i, g) in guardrails.iter().enumerate() {
        let at = |name: &str| format!("{field}[{i}].{name}");
        paths::canonical_path(&g.path)
            .map_err(|e: PathError| FieldError::new(at("path"), e.to_string()))?;
        let has_bounds = g.min_count.is_some() || g.max_count.is_some();
        match g.kind {
            GuardrailKind::RequireFile | GuardrailKind::RequireDir | GuardrailKind::ForbidGlob
                if has_bounds =>
            {
                return Err(FieldError::new(
                    at("kind"),
                    format!("{} does not accept count bounds", g.kind.message_name()),
                ));
            }
            _ => {}
        }
        for (name, value) in [("minCount", g.min_count), ("maxCount", g.max_count)] {
            if value.is_some_and(|v| v < 0) {
                return Err(FieldError::new(at(name), "guardrail counts must be >= 0"));
            }
        }
        if let (Some(max), min) = (g.max_count, g.min_count.unwrap_or(1))
            && min > max
        {
            return Err(FieldError::new(
                at("minCount"),
                "guardrail min_count must be <= max_count",
            ));
        }
    }
    Ok(())
}

fn non_negative(field: &str, value: i64) -> Result<(), FieldError> {
    if value < 0 {
        return Err(FieldError::new(field, "must be >= 0"));
    }
    Ok(())
}

fn check_controls(spec: &PeragoTaskSpec) -> Result<(), FieldError> {
    let c = &spec.controls;
    let r = &c.retry;
    if !(0..=10).contains(&r.count) {
        return Err(FieldError::new(
            "spec.controls.retry.count",
            "must be between 0 and 10",
        ));
    }
    non_negative("spec.controls.retry.delaySeconds", r.delay_seconds)?;
    non_negative("spec.controls.retry.maxDelaySeconds", r.max_delay_seconds)?;
    non_negative("spec.controls.retry.jitterMs", r.jitter_ms)?;
    let t = &c.timeout;
    non_negative("spec.controls.timeout.seconds", t.seconds)?;
    non_negative("spec.controls.timeout.responseSeconds", t.response_seconds)?;
    non_negative("spec.controls.timeout.pollSeconds", t.poll_seconds)?;
    non_negative("spec.controls.timeout.totalSeconds", t.total_seconds)?;
    let l = &c.limits;
    for (field, value) in [
        (
            "spec.controls.limits.concurrentExecLimit",
            l.concurrent_exec_limit,
        ),
        (
            "spec.controls.limits.rateLimitFrequencyInSeconds",
            l.rate_limit_frequency_in_seconds,
        ),
        (
            "spec.controls.limits.rateLimitPerFrequency",
            l.rate_limit_per_frequency,
        ),
    ] {
        if let Some(v) = value {
            non_negative(field, v)?;
        }
    }
    if l.rate_limit_frequency_in_seconds.is_some() != l.rate_limit_per_frequency.is_some() {
        return Err(FieldError::new(
            "spec.controls.limits",
            "rate_limit_frequency_in_seconds and rate_limit_per_frequency must be configured together",
        ));
    }
    if let Some(b) = &c.publish_budget {
        let f = |name: &str| format!("spec.controls.publishBudget.{name}");
        non_negative(&f("observedMergeP99Seconds"), b.observed_merge_p99_seconds)?;
        non_negative(&f("safetyMarginSeconds"), b.safety_margin_seconds)?;
        for (name, value) in [
            ("lakefsMergeTimeoutSeconds", b.lakefs_merge_timeout_seconds),
            (
                "conductorCompletionTimeoutSeconds",
                b.conductor_completion_timeout_seconds,
            ),
            (
                "workerShutdownGraceSeconds",
                b.worker_shutdown_grace_seconds,
            ),
            ("heartbeatIntervalSeconds", b.heartbeat_interval_seconds),
        ] {
            if value < 1 {
                return Err(FieldError::new(f(name), "must be >= 1"));
            }
        }
        if b.lakefs_merge_timeout_seconds < b.observed_merge_p99_seconds + b.safety_margin_seconds {
            return Err(FieldError::new(
                f("lakefsMergeTimeoutSeconds"),
                "lakefs_merge_timeout_seconds must cover observed_merge_p99_seconds plus safety_margin_seconds",
            ));
        }
    }
    // Conductor's own TaskDef constraints, which would otherwise fail only at registration.
    if t.response_seconds < 1 {
        return Err(FieldError::new(
            "spec.controls.timeout.responseSeconds",
            "Conductor requires responseTimeoutSeconds >= 1",
        ));
    }
    if t.seconds > 0 && t.response_seconds > t.seconds {
        return Err(FieldError::new(
            "spec.controls.timeout.responseSeconds",
            format!(
                "Conductor requires responseTimeoutSeconds ({}) <= timeoutSeconds ({}) when timeoutSeconds is set",
                t.response_seconds, t.seconds
            ),
        ));
    }
    if t.seconds > 0 && t.total_seconds > 0 && t.seconds > t.total_seconds {
        return Err(FieldError::new(
            "spec.controls.timeout.seconds",
            format!(
                "Conductor requires timeoutSeconds ({}) <= totalTimeoutSeconds ({}) when both are set",
                t.seconds, t.total_seconds
            ),
        ));
    }
    Ok(())
}

/// Metric and label names become Prometheus names, so they use its portable alphabet.
fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 200
}

fn check_application_metrics(metrics: &[ApplicationMetric]) -> Result<(), FieldError> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, m) in metrics.iter().enumerate() {
        let at = |name: &str| format!("spec.metrics.application[{i}].{name}");
        if !is_metric_name(&m.name) {
            return Err(FieldError::new(
                at("name"),
                format!("metric name '{}' must match [A-Za-z][A-Za-z0-9_]*", m.name),
            ));
        }
        if !seen.insert(m.name.as_str()) {
            return Err(FieldError::new(
                at("name"),
                format!("metric '{}' is declared twice", m.name),
            ));
        }
        for label in &m.labels {
            if !is_metric_name(label) {
                return Err(FieldError::new(
                    at("labels"),
                    format!("label '{label}' must match [A-Za-z][A-Za-z0-9_]*"),
                ));
            }
            if RESERVED_METRIC_LABELS.contains(&label.as_str()) {
                return Err(FieldError::new(
                    at("labels"),
                    format!("label '{label}' is reserved by the runtime"),
                ));
            }
        }
    }
    Ok(())
}

/// `spec.lineage.openLineage`: an `http://` or `https://` URL naming a host, and a namespace
/// that is not blank when given.
fn check_open_lineage(spec: &crate::task::OpenLineageSpec) -> Result<(), FieldError> {
    const FIELD: &str = "spec.lineage.openLineage.url";
    if let Some(problem) = perago_contract::url::http_url_problem(&spec.url) {
        return Err(FieldError::new(
            FIELD,
            format!("{problem}, such as http://marquez:5000/api/v1/lineage"),
        ));
    }
    if spec
        .namespace
        .as_deref()
        .is_some_and(|n| n.trim().is_empty())
    {
        return Err(FieldError::new(
            "spec.lineage.openLineage.namespace",
            "must not be blank; leave it out for the PeragoTask's namespace",
        ));
    }
    Ok(())
}

fn check_ca_bundle(field: &str, bundle: &crate::task::CaBundleRef) -> Result<(), FieldError> {
    let key_ref = match (&bundle.config_map, &bundle.secret) {
        (Some(r), None) | (None, Some(r)) => r,
        _ => {
            return Err(FieldError::new(
                field,
                "caBundleRef names exactly one of configMap and secret",
            ));
        }
    };
    if key_ref.name.trim().is_empty() {
        return Err(FieldError::new(format!("{field}.name"), "name is required"));
    }
    let key_ok = !key_ref.key.is_empty()
        && key_ref
            .key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if !key_ok {
        return Err(FieldError::new(
            format!("{field}.key"),
            format!(
                "{:?} is not a ConfigMap or Secret key (letters, digits, '-', '.', '_')",
                key_ref.key
            ),
        ));
    }
    Ok(())
}

fn check_executor(spec: &PeragoTaskSpec) -> Result<(), FieldError> {
    let e = &spec.executor;
    if e.body.image.trim().is_empty() {
        return Err(FieldError::new(
            "spec.executor.body.image",
            "image is required",
        ));
    }
    if e.body.command.is_empty() {
        return Err(FieldError::new(
            "spec.executor.body.command",
            "command is required: perago-runner starts it once per attempt",
        ));
    }
    match (&e.body.mode, &e.body.persistent) {
        (crate::task::BodyMode::PerAttempt, Some(_)) => {
            return Err(FieldError::new(
                "spec.executor.body.persistent",
                "applies to mode: persistent only",
            ));
        }
        (_, Some(limits)) => {
            if limits.max_attempts == Some(0) {
                return Err(FieldError::new(
                    "spec.executor.body.persistent.maxAttempts",
                    "must be at least 1",
                ));
            }
            if let Some(q) = &limits.max_memory
                && crate::quantity::bytes(q).is_none_or(|b| b == 0)
            {
                return Err(FieldError::new(
                    "spec.executor.body.persistent.maxMemory",
                    format!(
                        "{:?} is not a positive memory quantity (such as 512Mi)",
                        q.0
                    ),
                ));
            }
        }
        _ => {}
    }
    if !(1..=64).contains(&e.slots) {
        return Err(FieldError::new(
            "spec.executor.slots",
            "must be between 1 and 64",
        ));
    }
    if e.replicas < 0 {
        return Err(FieldError::new("spec.executor.replicas", "must be >= 0"));
    }
    if let Some(a) = &e.autoscaling {
        if a.min_replicas < 0
            || a.max_replicas < 1
            || a.target_queue_depth < 1
            || a.scale_down_stabilization_seconds < 0
        {
            return Err(FieldError::new(
                "spec.executor.autoscaling",
                "minReplicas >= 0, maxReplicas >= 1, targetQueueDepth >= 1 and scaleDownStabilizationSeconds >= 0 are required",
            ));
        }
        if a.min_replicas > a.max_replicas {
            return Err(FieldError::new(
                "spec.executor.autoscaling",
                "autoscaling.minReplicas must be <= maxReplicas",
            ));
        }
    }
    crate::pod::check(e)?;
    Ok(())
}
