//! The operator's metrics and its `/metrics`, `/healthz` and `/readyz` endpoints.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use perago_api::PeragoTask;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub reconciles: IntCounterVec,
    pub reconcile_seconds: HistogramVec,
    /// How long tasks wait for the reconcile a change of theirs needs.
    pub waits: ReconcileWaits,
    pub conductor_calls: IntCounterVec,
    /// `/slots` requests to executor pods, by outcome (answered, unanswered) and purpose.
    pub slot_probes: IntCounterVec,
    /// Deletion-cost annotations written on executor pods before scale-ins.
    pub deletion_cost_writes: IntCounter,
    /// How long each read of a Conductor's queue sizes by the queue watch took.
    pub queue_read_seconds: HistogramVec,
    /// From the queue read an autoscaling decision was made with to the task's `/scale`,
    /// Deployment and status written with it, by direction (up, down).
    pub scale_seconds: HistogramVec,
    /// ConfigMap and Deployment applies made, and skipped because the live object held them.
    applies: IntCounterVec,
    pub leader: IntGauge,
    /// Leadership terms that ended because the lease was lost (the process then waits to lead
    /// again as a standby).
    pub leadership_lost: IntCounter,
    /// Per PeragoTask (`namespace`, `name`): for KEDA or an HPA on external metrics.
    task_queued: IntGaugeVec,
    task_running: IntGaugeVec,
    task_replicas: IntGaugeVec,
    /// 1 while the PeragoTask's `Ready` condition is True (for alerting on tasks not Ready).
    task_ready: IntGaugeVec,
    task_suspended: IntGaugeVec,
    /// The canary's pods of each task while a canary rollout runs (ADR 0044).
    task_canary_replicas: IntGaugeVec,
    /// Canary rollouts that ended, by result (completed, rolled_back, aborted).
    pub rollouts: IntCounterVec,
    /// Set once this process leads and runs the controller.
    pub ready: AtomicBool,
    /// False while the admission webhook (when enabled) does not serve yet.
    pub webhook_ready: AtomicBool,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        perago_telemetry::register_build_info(&registry)?;
        let reconciles = IntCounterVec::new(
            Opts::new(
                "perago_operator_reconciles_total",
                "Reconciles by outcome (ok, error).",
            ),
            &["outcome"],
        )?;
        let reconcile_seconds = HistogramVec::new(
            HistogramOpts::new(
                "perago_operator_reconcile_duration_seconds",
                "Seconds per reconcile.",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            &[],
        )?;
        let waits = HistogramVec::new(
            HistogramOpts::new(
                "perago_operator_reconcile_wait_seconds",
                "Seconds from the operator seeing a change that needs a task reconciled (cause: \
                 spec, a new generation or a deletion from the watch; scaling, its queue or busy \
                 pods) to the start of that reconcile: the time spent behind a reconcile of the \
                 same task still running, or in the controller's queue.",
            )
            .buckets(vec![
                0.1, 0.25, 0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
            ]),
            &["cause"],
        )?;
        let conductor_calls = IntCounterVec::new(
            Opts::new(
                "perago_operator_conductor_calls_total",
                "Conductor metadata calls by call and outcome.",
            ),
            &["call", "outcome"],
        )?;
        let slot_probes = IntCounterVec::new(
            Opts::new(
                "perago_operator_slot_probes_total",
                "Requests to executor pods' /slots by outcome (answered, unanswered) and purpose (census, reconcile, scale-in).",
            ),
            &["outcome", "purpose"],
        )?;
        let deletion_cost_writes = IntCounter::new(
            "perago_operator_deletion_cost_writes_total",
            "Deletion-cost annotations written (set or removed) on executor pods before scale-ins.",
        )?;
        let queue_read_seconds = HistogramVec::new(
            HistogramOpts::new(
                "perago_operator_queue_read_seconds",
                "Seconds per read of a Conductor's queue sizes by the queue watch (every \
                 queuePollSeconds), answered or not.",
            )
            .buckets(vec![
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0,
            ]),
            &[],
        )?;
        let scale_seconds = HistogramVec::new(
            HistogramOpts::new(
                "perago_operator_scale_seconds",
                "Seconds from the Conductor queue read an autoscaling decision was made with to \
                 the task's /scale, Deployment and status written with it, by direction (up, \
                 down): the operator's part of following a queue, after the wait for the read \
                 (queuePollSeconds).",
            )
            .buckets(vec![
                0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
            ]),
            &["direction"],
        )?;
        let applies = IntCounterVec::new(
            Opts::new(
                "perago_operator_applies_total",
                "Applies of the objects a PeragoTask renders by kind and outcome (applied, or \
                 unchanged: the live object already held everything rendered, so none was sent).",
            ),
            &["kind", "outcome"],
        )?;
        let leader = IntGauge::new(
            "perago_operator_leader",
            "1 while this process holds the leader lease.",
        )?;
        let leadership_lost = IntCounter::new(
            "perago_operator_leadership_lost_total",
            "Times this process lost the leader lease and stopped reconciling until it leads again.",
        )?;
        let per_task = |name: &str, help: &str| {
            IntGaugeVec::new(Opts::new(name, help), &["namespace", "name"])
        };
        let task_queued = per_task(
            "perago_operator_task_queued_attempts",
            "Scheduled tasks waiting in Conductor's queue for the PeragoTask's task type.",
        )?;
        let task_running = per_task(
            "perago_operator_task_running_attempts",
            "Attempts running in the PeragoTask's executor pods (their busy slots).",
        )?;
        let task_replicas = per_task(
            "perago_operator_task_replicas",
            "Executor pods the PeragoTask asks for.",
        )?;
        let task_ready = per_task(
            "perago_operator_task_ready",
            "1 while the PeragoTask's Ready condition is True, else 0.",
        )?;
        let task_suspended = per_task(
            "perago_operator_task_suspended",
            "1 while the PeragoTask is suspended (spec.suspend), else 0.",
        )?;
        let task_canary_replicas = per_task(
            "perago_operator_task_canary_replicas",
            "Executor pods of the PeragoTask's canary while a canary rollout runs, else 0.",
        )?;
        let rollouts = IntCounterVec::new(
            Opts::new(
                "perago_operator_rollouts_total",
                "Canary rollouts that ended, by result (completed, rolled_back, aborted).",
            ),
            &["result"],
        )?;
        for gauge in [
            &task_queued,
            &task_running,
            &task_replicas,
            &task_ready,
            &task_suspended,
            &task_canary_replicas,
        ] {
            registry.register(Box::new(gauge.clone()))?;
        }
        registry.register(Box::new(rollouts.clone()))?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(reconcile_seconds.clone()))?;
        registry.register(Box::new(waits.clone()))?;
        registry.register(Box::new(conductor_calls.clone()))?;
        registry.register(Box::new(slot_probes.clone()))?;
        registry.register(Box::new(deletion_cost_writes.clone()))?;
        registry.register(Box::new(scale_seconds.clone()))?;
        registry.register(Box::new(queue_read_seconds.clone()))?;
        registry.register(Box::new(applies.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(leadership_lost.clone()))?;
        Ok(Self {
            registry,
            reconciles,
            reconcile_seconds,
            waits: ReconcileWaits {
                seen: Default::default(),
                seconds: waits,
            },
            conductor_calls,
            slot_probes,
            deletion_cost_writes,
            scale_seconds,
            queue_read_seconds,
            applies,
            leader,
            leadership_lost,
            task_queued,
            task_running,
            task_replicas,
            task_ready,
            task_suspended,
            task_canary_replicas,
            rollouts,
            ready: AtomicBool::new(false),
            webhook_ready: AtomicBool::new(true),
        })
    }

    /// Forget every per-task gauge: a replica that stopped leading reports none, so only the
    /// leader's figures are scraped.
    pub fn forget_tasks(&self) {
        for gauge in [
            &self.task_queued,
            &self.task_running,
            &self.task_replicas,
            &self.task_ready,
            &self.task_suspended,
            &self.task_canary_replicas,
        ] {
            gauge.reset();
        }
    }

    pub fn task_queued(&self, task: &PeragoTask) -> IntGauge {
        self.task_queued.with_label_values(&task_labels(task))
    }

    pub fn task_running(&self, task: &PeragoTask) -> IntGauge {
        self.task_running.with_label_values(&task_labels(task))
    }

    pub fn task_replicas(&self, task: &PeragoTask) -> IntGauge {
        self.task_replicas.with_label_values(&task_labels(task))
    }

    pub fn task_ready(&self, task: &PeragoTask) -> IntGauge {
        self.task_ready.with_label_values(&task_labels(task))
    }

    pub fn task_suspended(&self, task: &PeragoTask) -> IntGauge {
        self.task_suspended.with_label_values(&task_labels(task))
    }

    pub fn task_canary_replicas(&self, task: &PeragoTask) -> IntGauge {
        self.task_canary_replicas
            .with_label_values(&task_labels(task))
    }

    pub fn applied(&self, kind: &str, sent: bool) {
        let outcome = if sent { "applied" } else { "unchanged" };
        self.applies.with_label_values(&[kind, outcome]).inc();
    }

    /// A deleted task's series go with it.
    pub fn forget_task(&self, task: &PeragoTask) {
        for gauge in [
            &self.task_queued,
            &self.task_running,
            &self.task_replicas,
            &self.task_ready,
            &self.task_suspended,
            &self.task_canary_replicas,
        ] {
            let _ = gauge.remove_label_values(&task_labels(task));
        }
    }

    fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

/// Why a task needs a reconcile, as `perago_operator_reconcile_wait_seconds` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitCause {
    /// The watch showed a generation the task's status has not observed, or its deletion.
    Spec,
    /// The queue watch or the census woke it: more pods needed, or a scale-in due.
    Scaling,
}

impl WaitCause {
    fn label(self) -> &'static str {
        match self {
            Self::Spec => "spec",
            Self::Scaling => "scaling",
        }
    }
}

/// When each task's oldest change still waiting for a reconcile was seen. kube-runtime's
/// controller does not say how long a trigger waited, so the operator measures it from both
/// ends: where it sees the change, and where the reconcile starts.
pub struct ReconcileWaits {
    seen: parking_lot::Mutex<HashMap<ObjectRef<PeragoTask>, (WaitCause, Instant)>>,
    seconds: HistogramVec,
}

impl ReconcileWaits {
    /// `task` needs a reconcile for `cause`; the first such change since its last reconcile
    /// started is the one its wait is counted from.
    pub fn seen(&self, task: ObjectRef<PeragoTask>, cause: WaitCause) {
        self.lock().entry(task).or_insert((cause, Instant::now()));
    }

    /// A reconcile of `task` starts: the wait of the change it handles ends (none when it was
    /// only a resync or a trigger of its children).
    pub fn reconcile_started(&self, task: &ObjectRef<PeragoTask>) -> Option<(WaitCause, Duration)> {
        let (cause, since) = self.lock().remove(task)?;
        let waited = since.elapsed();
        self.seconds
            .with_label_values(&[cause.label()])
            .observe(waited.as_secs_f64());
        Some((cause, waited))
    }

    fn lock(
        &self,
    ) -> parking_lot::MutexGuard<'_, HashMap<ObjectRef<PeragoTask>, (WaitCause, Instant)>> {
        self.seen.lock()
    }
}

fn task_labels(task: &PeragoTask) -> [String; 2] {
    [task.namespace().unwrap_or_default(), task.name_any()]
}

/// Ready means: leading and reconciling, or a healthy standby waiting for the lease.
#[derive(Clone)]
struct Probes(Arc<Metrics>);

impl perago_telemetry::Observed for Probes {
    fn render_metrics(&self) -> String {
        self.0.render()
    }

    fn readiness(&self) -> Result<(), &'static str> {
        if self.0.ready.load(Ordering::Relaxed) && self.0.webhook_ready.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("starting")
        }
    }
}

pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    perago_telemetry::serve(addr, perago_telemetry::router().with_state(Probes(metrics))).await
}
