//! The broker: polls Conductor for as many tasks as there are free slots, runs each as an
//! attempt while keeping its lease alive, and reports the outcome. On shutdown it stops
//! polling, lets in-flight attempts finish within the grace period, and reports them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{Instrument, error, info, info_span, warn};

use perago_api::contract::TaskContract;

use crate::attempt::{AttemptSnapshot, report_identity};
use crate::conductor::{ConductorClient, ConductorError};
use crate::config::Checked;
use crate::execution::{self, ExecutionDir, Run};
use crate::input::{self, Schemas};
use crate::lakefs::LakeFsClient;
use crate::outcome::Outcome;
use crate::runner::{Lease, RunnerHub};
use crate::telemetry::Metrics;
use crate::workspace::attempt::{Transfers, WorkspaceAttempt};
use crate::workspace::hard_fence::HardFenceWatch;
use crate::workspace::input::WorkspaceRef;
use crate::workspace::janitor::StagingSweep;

pub struct Broker {
    pub contract: TaskContract,
    pub schemas: Schemas,
    pub conductor: Arc<ConductorClient>,
    pub hub: Arc<RunnerHub>,
    pub metrics: Arc<Metrics>,
    pub settings: Checked,
    pub work_dir: std::path::PathBuf,
    /// Workspace tasks only.
    pub lakefs: Option<LakeFsClient>,
    pub transfers: Transfers,
    /// Writable workspace tasks with the sweep on: told each repository an attempt writes to.
    pub staging_sweep: Option<Arc<StagingSweep>>,
    /// Writable workspace tasks: told each target branch an attempt publishes to.
    pub hard_fence: Option<Arc<HardFenceWatch>>,
}

/// `min(base × 2ⁿ, cap)`.
fn backoff(base: Duration, n: u32, cap: Duration) -> Duration {
    base.saturating_mul(1u32 << n.min(16)).min(cap)
}

impl Broker {
    /// Poll until `stop` turns true, then drain. Returns when every attempt is reported.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let (abandon_tx, abandon) = watch::channel(false);
        let mut inflight = JoinSet::new();
        let mut slots = self.hub.subscribe();
        let mut empty_polls = 0u32;
        let mut failed_polls = 0u32;
        let task_name = self.contract.task_name.clone();
        while !*stop.borrow() {
            while inflight.try_join_next().is_some() {}
            slots.borrow_and_update();
            let free = self.hub.free_slots();
            if free == 0 {
                tokio::select! {
                    _ = slots.changed() => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            let pause = match self
                .conductor
                .batch_poll(
                    &task_name,
                    &self.settings.worker_id,
                    free,
                    self.settings.poll_wait,
                )
                .await
            {
                Ok(tasks) if tasks.is_empty() => {
                    self.metrics.polls.with_label_values(&["empty"]).inc();
                    failed_polls = 0;
                    empty_polls = empty_polls.saturating_add(1);
                    backoff(
                        Duration::from_millis(1),
                        empty_polls.min(10),
                        self.settings.poll_interval,
                    )
                }
                Ok(tasks) => {
                    self.metrics.polls.with_label_values(&["tasks"]).inc();
                    self.metrics.polled_tasks.inc_by(tasks.len() as u64);
                    empty_polls = 0;
                    failed_polls = 0;
                    for task in tasks {
                        // Lease here, not in the spawned attempt, so the next poll already
                        // counts this slot as taken.
                        let execution_id = uuid::Uuid::new_v4().simple().to_string();
                        let lease = self.hub.lease(&execution_id);
                        let broker = Arc::clone(&self);
                        let abandon = abandon.clone();
                        inflight.spawn(async move {
                            broker.attempt(task, execution_id, lease, abandon).await
                        });
                    }
                    Duration::ZERO
                }
                Err(e) => {
                    self.metrics.polls.with_label_values(&["error"]).inc();
                    self.metrics
                        .conductor_errors
                        .with_label_values(&[e.call()])
                        .inc();
                    failed_polls = failed_polls.saturating_add(1);
                    let cap = if e.is_auth() { 60 } else { 120 };
                    let pause = backoff(
                        Duration::from_secs(1),
                        failed_polls - 1,
                        Duration::from_secs(cap),
                    );
                    warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "polling Conductor failed");
                    pause
                }
            };
            if !pause.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    _ = stop.changed() => {}
                }
            }
        }
        let count = inflight.len();
        info!(
            in_flight = count,
            grace_seconds = self.settings.shutdown_grace.as_secs(),
            "stopped polling; draining in-flight attempts"
        );
        let drained = tokio::time::timeout(self.settings.shutdown_grace, async {
            while inflight.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                in_flight = inflight.len(),
                "shutdown grace period over; giving up the remaining attempts"
            );
            let _ = abandon_tx.send(true);
            while inflight.join_next().await.is_some() {}
        }
        info!("all attempts reported");
    }

    async fn attempt(
        self: Arc<Self>,
        task: Value,
        execution_id: String,
        lease: Option<Lease>,
        abandon: watch::Receiver<bool>,
    ) {
        let snapshot = match AttemptSnapshot::from_task(&task) {
            Ok(s) => s,
            Err(e) => {
                if let Some(lease) = lease {
                    self.hub.release(lease, &execution_id);
                }
                match report_identity(&task) {
                    Some((wf, id)) => {
                        let span = info_span!("attempt", workflow_instance_id = %wf, task_id = %id, execution_id = %execution_id);
                        self.report(&wf, &id, Outcome::failed(e.to_string()))
                            .instrument(span)
                            .await;
                    }
                    None => {
                        error!(error = %e, task = %task, "polled a task that cannot be reported; Conductor's timeout will handle it")
                    }
                }
                return;
            }
        };
        let span = info_span!(
            "attempt",
            workflow_instance_id = %snapshot.workflow_instance_id,
            task_id = %snapshot.task_id,
            retry_count = snapshot.retry_count,
            execution_id = %execution_id,
        );
        async move {
            let started = Instant::now();
            info!(phase = "start", reference_task_name = %snapshot.reference_task_name, "attempt started");
            let keeper = self.keep_lease(&snapshot);
            let outcome = self.execute(&snapshot, &execution_id, lease, abandon).await;
            keeper.abort();
            let _ = keeper.await;
            self.metrics.record_attempt_seconds(started.elapsed().as_secs_f64());
            self.report(&snapshot.workflow_instance_id, &snapshot.task_id, outcome).await;
        }
        .instrument(span)
        .await;
    }

    /// Extend the lease every half response timeout (and not less often than the publish
    /// budget's heartbeat interval) until aborted.
    fn keep_lease(self: &Arc<Self>, snapshot: &AttemptSnapshot) -> tokio::task::JoinHandle<()> {
        let rt = snapshot
            .response_timeout_seconds
            .unwrap_or(self.contract.response_timeout_seconds);
        let mut period = Duration::from_millis(u64::try_from(rt).unwrap_or(0).saturating_mul(500));
        if let Some(budget) = &self.contract.publish_budget {
            period = period.min(Duration::from_secs(
                u64::try_from(budget.heartbeat_interval_seconds).unwrap_or(1),
            ));
        }
        let broker = Arc::clone(self);
        let (wf, id) = (
            snapshot.workflow_instance_id.clone(),
            snapshot.task_id.clone(),
        );
        tokio::spawn(
            async move {
                if period.is_zero() {
                    return;
                }
                let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                loop {
                    ticks.tick().await;
                    match broker.conductor.extend_lease(&wf, &id, &broker.settings.worker_id).await {
                        Ok(()) => broker.metrics.lease_extensions.with_label_values(&["ok"]).inc(),
                        Err(e) => {
                            broker.metrics.lease_extensions.with_label_values(&["error"]).inc();
                            broker.metrics.conductor_errors.with_label_values(&[e.call()]).inc();
                            warn!(error = %e, "extending the lease failed; retrying at the next beat");
                        }
                    }
                }
            }
            .in_current_span(),
        )
    }

    /// Run the attempt on its leased slot and free the slot afterwards.
    async fn execute(
        &self,
        snapshot: &AttemptSnapshot,
        execution_id: &str,
        lease: Option<Lease>,
        abandon: watch::Receiver<bool>,
    ) -> Outcome {
        let Some(lease) = lease else {
            return Outcome::failed(format!(
                "no executor slot is free for task {}; the task-body runner is not connected",
                snapshot.task_id
            ));
        };
        let outcome = self
            .execute_on(snapshot, execution_id, lease, abandon)
            .await;
        self.hub.release(lease, execution_id);
        outcome
    }

    async fn execute_on(
        &self,
        snapshot: &AttemptSnapshot,
        execution_id: &str,
        lease: Lease,
        abandon: watch::Receiver<bool>,
    ) -> Outcome {
        let started = Instant::now();
        let accepted = input::accept(&self.contract, &snapshot.input_data).and_then(|accepted| {
            let workspace = match (&self.contract.workspace, &accepted.workspace) {
                (Some(_), Some(value)) => Some(WorkspaceRef::parse(value)?),
                _ => None,
            };
            let params = self
                .schemas
                .params(accepted.params, self.contract.strict_params)?;
            Ok((workspace, params))
        });
        self.metrics.observe_phase("input", started);
        let (workspace, params) = match accepted {
            Ok(p) => p,
            Err(reason) => {
                info!(phase = "input", reason = %reason, "input refused");
                return Outcome::Failed(reason);
            }
        };
        let slot_worker_id = format!("{}-{:04}", self.settings.worker_id, lease.slot);
        match ExecutionDir::create(&self.work_dir, snapshot, execution_id, &slot_worker_id) {
            Err(e) => Outcome::failed(format!("preparing the execution directory failed: {e}")),
            Ok(dir) => {
                let mut run = Run {
                    hub: &self.hub,
                    metrics: &self.metrics,
                    schemas: &self.schemas,
                    lease,
                    execution_id,
                    slot_worker_id: &slot_worker_id,
                    task_name: &self.contract.task_name,
                    deadline: u64::try_from(self.contract.timeout_seconds)
                        .ok()
                        .filter(|s| *s > 0)
                        .map(Duration::from_secs),
                    abandon,
                };
                let outcome = match (&workspace, &self.contract.workspace, &self.lakefs) {
                    (Some(ws), Some(spec), Some(lakefs)) => {
                        let outcome = WorkspaceAttempt {
                            lakefs,
                            conductor: &self.conductor,
                            spec,
                            transfers: &self.transfers,
                            worker_id: &self.settings.worker_id,
                            work_dir: &self.work_dir,
                        }
                        .run(&mut run, snapshot, &dir, ws, &params)
                        .await;
                        if let Some(sweep) = &self.staging_sweep {
                            sweep.note(&ws.repository);
                        }
                        if let Some(watch) = &self.hard_fence {
                            watch.note(&ws.repository, &ws.branch);
                        }
                        outcome
                    }
                    _ => match execution::run_body(&mut run, snapshot, &dir, &params, None).await {
                        Ok(result) => {
                            let mut output = Map::new();
                            output.insert("result".into(), result);
                            Outcome::Completed(output)
                        }
                        Err(outcome) => outcome,
                    },
                };
                dir.remove().await;
                outcome
            }
        }
    }

    /// Send the result, retrying transient failures with back-off. A result that cannot be
    /// delivered is logged loudly; Conductor's timeouts take over.
    async fn report(&self, workflow_instance_id: &str, task_id: &str, mut outcome: Outcome) {
        if let Some(original_length) =
            outcome.truncate_reason(self.settings.failure_reason_max_length)
        {
            warn!(
                original_length,
                max_length = self.settings.failure_reason_max_length,
                "truncated task failure reason"
            );
        }
        let status = outcome.status();
        let body = outcome.task_result(workflow_instance_id, task_id, &self.settings.worker_id);
        let timeout = self
            .contract
            .publish_budget
            .as_ref()
            .and_then(|b| u64::try_from(b.conductor_completion_timeout_seconds).ok())
            .map_or(self.settings.request_timeout, Duration::from_secs);
        let started = Instant::now();
        let mut last: Option<ConductorError> = None;
        for attempt in 0..6u32 {
            if attempt > 0 {
                tokio::time::sleep(backoff(
                    Duration::from_secs(1),
                    attempt - 1,
                    Duration::from_secs(16),
                ))
                .await;
            }
            match self.conductor.update_task(&body, timeout).await {
                Ok(()) => {
                    self.metrics.attempts.with_label_values(&[status]).inc();
                    self.metrics.observe_phase("report", started);
                    info!(
                        phase = "report",
                        status,
                        reason = outcome.reason().unwrap_or(""),
                        "attempt reported"
                    );
                    return;
                }
                Err(e) => {
                    self.metrics
                        .conductor_errors
                        .with_label_values(&[e.call()])
                        .inc();
                    let transient = e.is_transient();
                    warn!(error = %e, attempt = attempt + 1, transient, "reporting the result failed");
                    last = Some(e);
                    if !transient {
                        break;
                    }
                }
            }
        }
        self.metrics.results_lost.inc();
        error!(
            status,
            workflow_instance_id,
            task_id,
            error = %last.map(|e| e.to_string()).unwrap_or_default(),
            "task result LOST: Conductor did not accept it; its timeouts and retry policy decide what happens next"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let ms = |n| backoff(Duration::from_millis(1), n, Duration::from_millis(100)).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(5), ms(7), ms(10), ms(40)],
            [1, 2, 32, 100, 100, 100]
        );
        let s = |n| backoff(Duration::from_secs(1), n, Duration::from_secs(120)).as_secs();
        assert_eq!([s(0), s(3), s(6), s(7)], [1, 8, 64, 120]);
    }
}
