//! Attempt traces over OTLP/HTTP (protobuf), when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.
//!
//! One trace per attempt: a root span `attempt` and a child per phase, in the order they ran
//! (poll, input, download, body, validate, fence, stage, fence, merge, cleanup, report,
//! sweep; a phase that did not run has no span). The phases of an attempt run one after
//! another, so an [`AttemptTrace`] is a timeline of marks: each mark ends the phase before
//! it. With tracing off every attempt carries a disabled timeline whose marks return at once.
//!
//! Export never holds an attempt up: a finished trace goes to a bounded queue of spans, a
//! background task sends batches of it, and what does not fit or is not accepted is dropped
//! and counted (`perago_sidecar_trace_spans_dropped_total`).

use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span, status,
};
use prost::Message;
use serde_json::Value;
use tracing::warn;

use crate::delivery::{Background, BoundedQueue, ExportCounters};
use crate::otlp::{ExportSettingError, nanos, post, string_attribute};
use perago_contract::setting::given;

/// The export settings: the OpenTelemetry variables for traces and the batch span processor.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceConfig {
    pub endpoint: String,
    pub gzip: bool,
    /// Longest one export request may take.
    pub timeout: Duration,
    /// Longest a finished span waits before it is sent.
    pub delay: Duration,
    /// Spans held at most; a trace that does not fit is dropped.
    pub queue: usize,
}

/// Spans per export request.
const BATCH: usize = 512;

fn positive(
    name: &'static str,
    value: Option<String>,
    default: u64,
) -> Result<u64, ExportSettingError> {
    match given(name, value.as_deref())? {
        None => Ok(default),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(ExportSettingError::NotPositive(name)),
        },
    }
}

impl TraceConfig {
    /// `None` when no traces endpoint is set (the other settings are then ignored).
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is the full URL, used as given (`…/v1/traces`).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, ExportSettingError> {
        let Some(endpoint) = given(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            lookup("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").as_deref(),
        )?
        else {
            return Ok(None);
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ExportSettingError::NotHttp(endpoint));
        }
        let gzip = match given(
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            lookup("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION").as_deref(),
        )?
        .map(|v| v.to_ascii_lowercase())
        .as_deref()
        {
            None | Some("none") => false,
            Some("gzip") => true,
            Some(_) => {
                return Err(ExportSettingError::Compression {
                    name: "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
                    allowed: "'gzip' or 'none'",
                });
            }
        };
        let ms = |name: &'static str, default| {
            positive(name, lookup(name), default).map(Duration::from_millis)
        };
        let queue = positive(
            "OTEL_BSP_MAX_QUEUE_SIZE",
            lookup("OTEL_BSP_MAX_QUEUE_SIZE"),
            2048,
        )?;
        Ok(Some(Self {
            endpoint,
            gzip,
            timeout: ms("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 10_000)?,
            delay: ms("OTEL_BSP_SCHEDULE_DELAY", 5_000)?,
            queue: usize::try_from(queue).unwrap_or(usize::MAX),
        }))
    }
}

/// Counters of the export: spans accepted, and dropped by reason.
pub type TraceCounters = ExportCounters;

/// Takes finished traces and sends them in the background.
pub struct Tracer {
    queue: Arc<BoundedQueue<Span>>,
    sender: Background,
}

impl Tracer {
    /// Start the background sender. `instance_id` names this sidecar in the resource.
    pub fn start(
        config: TraceConfig,
        instance_id: &str,
        counters: TraceCounters,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder().timeout(config.timeout).build()?;
        let queue = Arc::new(BoundedQueue::new(config.queue, BATCH, counters));
        let resource = Resource {
            attributes: vec![
                string_attribute("service.name", "perago-sidecar"),
                string_attribute("service.version", env!("CARGO_PKG_VERSION")),
                string_attribute("service.instance.id", instance_id),
            ],
            ..Resource::default()
        };
        let (endpoint, gzip) = (config.endpoint.clone(), config.gzip);
        let sender = Background::start(
            Arc::clone(&queue),
            config.delay,
            "spans over OTLP",
            config.endpoint,
            move |spans: Vec<Span>| {
                let request = ExportTraceServiceRequest {
                    resource_spans: vec![ResourceSpans {
                        resource: Some(resource.clone()),
                        scope_spans: vec![ScopeSpans {
                            scope: Some(InstrumentationScope {
                                name: "perago".into(),
                                version: env!("CARGO_PKG_VERSION").into(),
                                ..InstrumentationScope::default()
                            }),
                            spans,
                            ..ScopeSpans::default()
                        }],
                        ..ResourceSpans::default()
                    }],
                };
                let (http, endpoint) = (http.clone(), endpoint.clone());
                async move {
                    post(&http, &endpoint, gzip, request.encode_to_vec())
                        .await
                        .map_err(|e| e.to_string())
                }
            },
        );
        Ok(Self { queue, sender })
    }

    /// A new attempt's timeline in `run`'s trace; it starts with the poll that brought the
    /// task.
    pub fn attempt(
        &self,
        poll: (SystemTime, SystemTime),
        task_type: &str,
        run: RunTrace,
    ) -> AttemptTrace {
        AttemptTrace::started(poll, task_type, run)
    }

    /// Queue a finished attempt's spans (never waits).
    pub fn finish(&self, trace: AttemptTrace, outcome: &TraceOutcome<'_>) {
        if let Some(spans) = trace.into_spans(outcome) {
            self.queue.push(spans);
        }
    }

    /// Send what is queued, then stop the sender; each request within the export timeout.
    pub async fn shutdown(&self) {
        self.sender.shutdown(None).await;
    }
}

/// How the attempt ended, for the root span.
pub struct TraceOutcome<'a> {
    /// The status reported to Conductor (`COMPLETED`, `FAILED`, …).
    pub status: &'a str,
    /// The failure's `reason` label, if it failed.
    pub reason: Option<&'a str>,
}

tokio::task_local! {
    /// The `traceparent` of the attempt this task runs, for the calls it makes.
    static ATTEMPT_TRACEPARENT: String;
}

/// The `traceparent` of the attempt the current task runs (its root span), if it is traced:
/// what the Conductor and lakeFS clients send with each call of the attempt.
pub fn current_traceparent() -> Option<String> {
    ATTEMPT_TRACEPARENT.try_with(Clone::clone).ok()
}

/// Run `attempt` with `traceparent` as the one its calls send (none: they send none).
pub async fn calls_traced<F: std::future::Future>(
    traceparent: Option<String>,
    attempt: F,
) -> F::Output {
    match traceparent {
        Some(t) => ATTEMPT_TRACEPARENT.scope(t, attempt).await,
        None => attempt.await,
    }
}

/// One attempt's timeline; disabled (every call returns at once) when tracing is off.
pub struct AttemptTrace(Option<Mutex<Timeline>>);

struct Timeline {
    trace_id: Vec<u8>,
    root: Span,
    done: Vec<Span>,
    open: Option<Span>,
}

/// The trace an attempt joins: its workflow run's (ADR 0041). Every attempt of one workflow
/// instance is in one trace, so a run of several steps, in several pods, and its retries read
/// as one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunTrace {
    trace_id: Vec<u8>,
    /// The span the attempt's root continues: the caller's, from a `traceparent`.
    parent_span_id: Vec<u8>,
}

impl RunTrace {
    /// The run of `task` (a polled Conductor task): the W3C `traceparent` of its input
    /// parameter `traceparent` when it has a valid one, else a trace id of its workflow
    /// instance id, which needs nothing from the workflow. A malformed `traceparent` is left
    /// out with a warning; a task with no workflow id gets a trace of its own.
    pub fn of(task: &Value) -> Self {
        // Null is what a workflow's `${workflow.input.traceparent}` gives when its input has none.
        if let Some(given) = task
            .pointer("/inputData/traceparent")
            .filter(|v| !v.is_null())
        {
            match given.as_str().and_then(parse_traceparent) {
                Some((trace_id, parent_span_id)) => {
                    return Self {
                        trace_id,
                        parent_span_id,
                    };
                }
                None => warn!(
                    traceparent = %given,
                    "the task's input parameter traceparent is not a W3C traceparent; the attempt joins its workflow's trace instead"
                ),
            }
        }
        let trace_id = match task.get("workflowInstanceId").and_then(Value::as_str) {
            Some(workflow) if !workflow.is_empty() => workflow_trace_id(workflow),
            _ => random_id(16),
        };
        Self {
            trace_id,
            parent_span_id: Vec::new(),
        }
    }
}

/// The trace id of a workflow instance: its UUID's 16 bytes, so that the trace id is the
/// workflow id without its dashes; for an id that is not a UUID, the MD5 of it.
pub fn workflow_trace_id(workflow: &str) -> Vec<u8> {
    match uuid::Uuid::parse_str(workflow) {
        Ok(id) if !id.is_nil() => id.as_bytes().to_vec(),
        _ => {
            use md5::Digest;
            md5::Md5::digest(format!("perago-workflow:{workflow}")).to_vec()
        }
    }
}

/// The trace id and span id of a W3C `traceparent` (version 00): `None` unless it is one,
/// with neither id all zeros.
fn parse_traceparent(value: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if parts.next().is_some()
        || version != "00"
        || !lower_hex(trace, 32)
        || !lower_hex(span, 16)
        || !lower_hex(flags, 2)
    {
        return None;
    }
    let bytes = |s: &str| -> Option<Vec<u8>> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
            .collect()
    };
    let (trace, span) = (bytes(trace)?, bytes(span)?);
    let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
    (!zero(&trace) && !zero(&span)).then_some((trace, span))
}

fn random_id(bytes: usize) -> Vec<u8> {
    // A version-4 UUID is 122 random bits; a span id takes 8 of its bytes.
    uuid::Uuid::new_v4().as_bytes()[16 - bytes..].to_vec()
}

/// A W3C version-00 `traceparent`, sampled.
fn traceparent(trace_id: &[u8], span_id: &[u8]) -> String {
    format!("00-{}-{}-01", hex(trace_id), hex(span_id))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An attribute value a span can carry.
pub enum AttrValue<'a> {
    Str(&'a str),
    Int(i64),
}

impl<'a> From<&'a str> for AttrValue<'a> {
    fn from(v: &'a str) -> Self {
        Self::Str(v)
    }
}
impl<'a> From<&'a String> for AttrValue<'a> {
    fn from(v: &'a String) -> Self {
        Self::Str(v)
    }
}
impl From<i64> for AttrValue<'_> {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}
impl From<usize> for AttrValue<'_> {
    fn from(v: usize) -> Self {
        Self::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<u64> for AttrValue<'_> {
    fn from(v: u64) -> Self {
        Self::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

fn key_value(key: &str, value: AttrValue<'_>) -> KeyValue {
    let value = match value {
        AttrValue::Str(s) => any_value::Value::StringValue(s.to_owned()),
        AttrValue::Int(i) => any_value::Value::IntValue(i),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

/// Calls to Conductor are client spans; the rest is the sidecar's own work.
fn kind(phase: &str) -> span::SpanKind {
    match phase {
        "poll" | "report" => span::SpanKind::Client,
        _ => span::SpanKind::Internal,
    }
}

impl Timeline {
    fn child(&self, name: &str, start: SystemTime) -> Span {
        Span {
            trace_id: self.trace_id.clone(),
            span_id: random_id(8),
            parent_span_id: self.root.span_id.clone(),
            name: name.to_owned(),
            kind: kind(name) as i32,
            start_time_unix_nano: nanos(start),
            ..Span::default()
        }
    }

    fn close(&mut self, at: SystemTime) {
        if let Some(mut span) = self.open.take() {
            span.end_time_unix_nano = nanos(at);
            self.done.push(span);
        }
    }
}

fn error(message: String) -> Option<Status> {
    Some(Status {
        code: status::StatusCode::Error as i32,
        message,
    })
}

impl AttemptTrace {
    /// The timeline of an attempt that is not traced.
    pub fn off() -> Self {
        Self(None)
    }

    fn started(
        (polled, answered): (SystemTime, SystemTime),
        task_type: &str,
        run: RunTrace,
    ) -> Self {
        let trace_id = run.trace_id;
        let root = Span {
            trace_id: trace_id.clone(),
            span_id: random_id(8),
            parent_span_id: run.parent_span_id,
            name: "attempt".into(),
            kind: span::SpanKind::Consumer as i32,
            start_time_unix_nano: nanos(polled),
            attributes: vec![key_value("perago.task.type", task_type.into())],
            ..Span::default()
        };
        let mut timeline = Timeline {
            trace_id,
            root,
            done: Vec::new(),
            open: None,
        };
        timeline.open = Some(timeline.child("poll", polled));
        timeline.close(answered);
        Self(Some(Mutex::new(timeline)))
    }

    fn with(&self, f: impl FnOnce(&mut Timeline)) {
        if let Some(timeline) = &self.0 {
            f(&mut timeline.lock());
        }
    }

    /// The next phase starts now; the one before it ends.
    pub fn mark(&self, phase: &'static str) {
        self.with(|t| {
            let now = SystemTime::now();
            t.close(now);
            t.open = Some(t.child(phase, now));
        });
    }

    /// An attribute of the current phase.
    pub fn note<'a>(&self, key: &str, value: impl Into<AttrValue<'a>>) {
        self.with(|t| {
            if let Some(span) = &mut t.open {
                span.attributes.push(key_value(key, value.into()));
            }
        });
    }

    /// An attribute of the whole attempt (the root span).
    pub fn note_attempt<'a>(&self, key: &str, value: impl Into<AttrValue<'a>>) {
        self.with(|t| t.root.attributes.push(key_value(key, value.into())));
    }

    /// The current phase failed: `reason` is the failure's label, `message` what happened.
    pub fn fail(&self, reason: &str, message: &dyn std::fmt::Display) {
        self.with(|t| {
            if let Some(span) = &mut t.open {
                span.attributes
                    .push(key_value("perago.failure.reason", reason.into()));
                span.status = error(message.to_string());
            }
        });
    }

    /// The W3C `traceparent` of the attempt's root span, for the calls the attempt makes.
    pub fn root_traceparent(&self) -> Option<String> {
        let timeline = self.0.as_ref()?;
        let t = timeline.lock();
        Some(traceparent(&t.trace_id, &t.root.span_id))
    }

    /// The W3C `traceparent` of the current phase, for the body to continue the trace.
    pub fn traceparent(&self) -> Option<String> {
        let timeline = self.0.as_ref()?;
        let t = timeline.lock();
        let span = t.open.as_ref()?;
        Some(traceparent(&t.trace_id, &span.span_id))
    }

    /// End the attempt now: the root span last, with the outcome.
    fn into_spans(self, outcome: &TraceOutcome<'_>) -> Option<Vec<Span>> {
        let mut t = self.0?.into_inner();
        let now = SystemTime::now();
        t.close(now);
        t.root.end_time_unix_nano = nanos(now);
        t.root
            .attributes
            .push(key_value("perago.attempt.status", outcome.status.into()));
        if let Some(reason) = outcome.reason {
            t.root
                .attributes
                .push(key_value("perago.failure.reason", reason.into()));
            t.root.status = error(format!("{}: {reason}", outcome.status));
        }
        let mut spans = t.done;
        spans.push(t.root);
        Some(spans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn configuration() {
        assert_eq!(TraceConfig::from_lookup(lookup(&[])), Ok(None));
        let ep = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces",
        );
        let c = TraceConfig::from_lookup(lookup(&[ep])).unwrap().unwrap();
        assert_eq!(
            c,
            TraceConfig {
                endpoint: "http://c:4318/v1/traces".into(),
                gzip: false,
                timeout: Duration::from_secs(10),
                delay: Duration::from_secs(5),
                queue: 2048,
            }
        );
        let c = TraceConfig::from_lookup(lookup(&[
            ep,
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "GZIP"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "64"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.gzip, c.delay, c.queue),
            (true, Duration::from_millis(200), 64)
        );
        for (vars, message) in [
            (
                vec![("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "c:4317")],
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT must be an http:// or https:// URL (OTLP/HTTP), not \"c:4317\"",
            ),
            (
                vec![ep, ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "zstd")],
                "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION must be 'gzip' or 'none'",
            ),
            (
                vec![ep, ("OTEL_BSP_MAX_QUEUE_SIZE", "0")],
                "OTEL_BSP_MAX_QUEUE_SIZE must be a positive integer",
            ),
            (
                vec![ep, ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1.5")],
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT must be a positive integer",
            ),
        ] {
            assert_eq!(
                TraceConfig::from_lookup(lookup(&vars)).map_err(String::from),
                Err(message.to_owned())
            );
        }
    }

    #[test]
    fn an_attempt_joins_the_trace_its_task_names_or_its_workflows() {
        let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let task =
            serde_json::json!({"workflowInstanceId": "wf-1", "inputData": {"traceparent": given}});
        let run = RunTrace::of(&task);
        assert_eq!(hex(&run.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&run.parent_span_id), "00f067aa0ba902b7");
        // Two attempts of one workflow: one trace, whatever pod runs them.
        let attempt = serde_json::json!({"workflowInstanceId": "wf-1", "taskId": "a"});
        let retry = serde_json::json!({"workflowInstanceId": "wf-1", "taskId": "b"});
        assert_eq!(RunTrace::of(&attempt), RunTrace::of(&retry));
        assert_eq!(RunTrace::of(&attempt).trace_id.len(), 16);
        assert_ne!(
            RunTrace::of(&attempt),
            RunTrace::of(&serde_json::json!({"workflowInstanceId": "wf-2"}))
        );
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "garbage",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
            let task = serde_json::json!({"workflowInstanceId": "wf-1", "inputData": {"traceparent": bad}});
            assert_eq!(RunTrace::of(&task), RunTrace::of(&attempt), "{bad}");
        }
        for other in [serde_json::json!(7), serde_json::Value::Null] {
            let task = serde_json::json!({"workflowInstanceId": "wf-1", "inputData": {"traceparent": other}});
            assert_eq!(RunTrace::of(&task), RunTrace::of(&attempt));
        }
    }

    #[test]
    fn a_timeline_becomes_one_trace_of_sequential_phases() {
        let polled = SystemTime::now();
        let run = RunTrace::of(&serde_json::json!({
            "workflowInstanceId": "8c1c5f0e-3f6e-4f0a-9d61-2b7c1f9a0b42",
        }));
        let trace = AttemptTrace::started((polled, polled + Duration::from_millis(3)), "t", run);
        trace.mark("input");
        trace.mark("body");
        let parent = trace.traceparent().unwrap();
        trace.note("perago.body.exit_code", 1i64);
        trace.fail("body_exited", &"exit code 1");
        trace.mark("report");
        trace.note_attempt("perago.workflow.id", "wf");
        let spans = trace
            .into_spans(&TraceOutcome {
                status: "FAILED",
                reason: Some("body_exited"),
            })
            .unwrap();
        let names: Vec<_> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["poll", "input", "body", "report", "attempt"]);
        let root = &spans[4];
        assert_eq!(hex(&root.trace_id), "8c1c5f0e3f6e4f0a9d612b7c1f9a0b42");
        assert!(root.parent_span_id.is_empty());
        assert!(spans.iter().all(|s| s.trace_id == root.trace_id));
        assert!(spans[..4].iter().all(|s| s.parent_span_id == root.span_id));
        // Each phase ends where the next begins; the root spans them all.
        for w in spans[1..4].windows(2) {
            assert_eq!(w[0].end_time_unix_nano, w[1].start_time_unix_nano);
        }
        assert_eq!(root.start_time_unix_nano, spans[0].start_time_unix_nano);
        assert!(root.end_time_unix_nano >= spans[3].end_time_unix_nano);
        let body = &spans[2];
        assert_eq!(
            parent,
            format!("00-{}-{}-01", hex(&root.trace_id), hex(&body.span_id))
        );
        assert_eq!(parent.len(), 55);
        assert_eq!(
            body.status.as_ref().unwrap().code,
            status::StatusCode::Error as i32
        );
        assert_eq!(spans[3].status, None);
        assert_eq!(root.status.as_ref().unwrap().message, "FAILED: body_exited");
        assert_eq!(spans[0].kind, span::SpanKind::Client as i32);
    }

    /// The calls of a traced attempt send its root span as their `traceparent`; calls made
    /// outside an attempt, or by an attempt that is not traced, send none.
    #[tokio::test]
    async fn an_attempts_calls_carry_its_root_span() {
        let polled = SystemTime::now();
        let run = RunTrace::of(&serde_json::json!({
            "workflowInstanceId": "8c1c5f0e-3f6e-4f0a-9d61-2b7c1f9a0b42",
        }));
        let trace = AttemptTrace::started((polled, polled), "t", run);
        trace.mark("body");
        let root = trace.root_traceparent().unwrap();
        assert!(
            root.starts_with("00-8c1c5f0e3f6e4f0a9d612b7c1f9a0b42-") && root.ends_with("-01"),
            "{root}"
        );
        assert_eq!(
            parse_traceparent(&root).map(|(t, _)| hex(&t)).as_deref(),
            Some("8c1c5f0e3f6e4f0a9d612b7c1f9a0b42")
        );
        assert_ne!(
            Some(&root),
            trace.traceparent().as_ref(),
            "the root, not the phase"
        );
        assert_eq!(current_traceparent(), None);
        let seen = calls_traced(trace.root_traceparent(), async {
            tokio::task::yield_now().await;
            current_traceparent()
        })
        .await;
        assert_eq!(seen.as_deref(), Some(root.as_str()));
        assert_eq!(
            calls_traced(AttemptTrace::off().root_traceparent(), async {
                current_traceparent()
            })
            .await,
            None
        );
        let spans = trace
            .into_spans(&TraceOutcome {
                status: "COMPLETED",
                reason: None,
            })
            .unwrap();
        let attempt = spans.last().unwrap();
        assert_eq!(
            root,
            format!("00-{}-{}-01", hex(&attempt.trace_id), hex(&attempt.span_id))
        );
    }

    #[test]
    fn off_records_nothing() {
        let trace = AttemptTrace::off();
        trace.mark("input");
        trace.note("k", "v");
        assert_eq!(trace.traceparent(), None);
        let outcome = TraceOutcome {
            status: "COMPLETED",
            reason: None,
        };
        assert!(trace.into_spans(&outcome).is_none());
    }
}
