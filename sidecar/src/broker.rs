//! The broker: polls Conductor for tasks while slots are free, runs each as an attempt while
//! keeping its lease alive, and reports the outcome. On shutdown it stops
//! polling, lets in-flight attempts finish within the grace period, and reports them.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use backon::Retryable;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{Instrument, error, info, info_span, warn};

use perago_contract::contract::TaskContract;

use crate::config::RuntimeSettings;
use crate::failure::{AttemptError, Verdict};
use crate::input::Schemas;
use crate::outcome::Outcome;
use crate::pipeline::{Attempt, Completion, Sweep};
use crate::retry;
use crate::runner::{Lease, RunnerHub};
use crate::telemetry::Metrics;
use crate::trace::{AttemptTrace, RunTrace, TraceOutcome, Tracer};
use crate::workspace::{WorkspaceRuntime, publish};
use perago_conductor::{ConductorClient, ConductorError};
use perago_workspace::attempt::{AttemptSnapshot, report_identity};

pub struct Broker {
    pub contract: TaskContract,
    pub schemas: Schemas,
    pub conductor: Arc<ConductorClient>,
    pub hub: Arc<RunnerHub>,
    pub metrics: Arc<Metrics>,
    pub settings: RuntimeSettings,
    pub work_dir: std::path::PathBuf,
    pub runtime: TaskRuntime,
    /// Exports a trace of every attempt; `None` when tracing is off.
    pub tracer: Option<Tracer>,
    /// Sends OpenLineage run events of every attempt; `None` when not configured.
    pub lineage: Option<Arc<crate::openlineage::OpenLineage>>,
}

/// The two kinds of task, decided once at start-up from the contract.
pub enum TaskRuntime {
    /// The body runs on its params alone.
    WorkspaceFree,
    Workspace(Box<WorkspaceRuntime>),
}

/// The pause after each poll: none after a poll that brought tasks; growing ones after empty
/// polls (up to the poll interval) and after failed ones (up to about a minute when Conductor
/// refused the credentials, two otherwise). A poll with tasks starts both series again, an
/// empty one the failures'.
struct PollPacing {
    interval: Duration,
    empty: backon::ExponentialBackoff,
    failures: Option<backon::ExponentialBackoff>,
}

impl PollPacing {
    fn new(interval: Duration) -> Self {
        Self {
            interval,
            empty: retry::empty_polls(interval),
            failures: None,
        }
    }

    fn after_tasks(&mut self) -> Duration {
        self.empty = retry::empty_polls(self.interval);
        self.failures = None;
        Duration::ZERO
    }

    fn after_empty(&mut self) -> Duration {
        self.failures = None;
        self.empty.next().unwrap_or(self.interval)
    }

    fn after_failure(&mut self, refused_credentials: bool) -> Duration {
        let longest = Duration::from_secs(if refused_credentials { 60 } else { 120 });
        self.failures
            .get_or_insert_with(|| retry::poll_failures(longest))
            .next()
            .unwrap_or(longest)
    }
}

/// What a poll asks Conductor for: how many tasks, and how long the server may wait for them.
#[derive(Debug, PartialEq, Eq)]
struct PollAsk {
    count: u32,
    wait: Duration,
}

/// The next poll, for `free` slots (at least one). Conductor's SQL queues (SQLite, PostgreSQL)
/// answer a batch poll once they hold `count` tasks or its long poll is over, so a poll that
/// waits asks for one task: asking for more would keep the tasks already queued until the
/// wait ends. More than one is asked for only without waiting, right after a poll that
/// brought tasks, when the queue may hold more (ADR 0052).
fn next_poll(free: u32, queue_had_tasks: bool, wait: Duration) -> PollAsk {
    if free > 1 && queue_had_tasks {
        PollAsk {
            count: free,
            wait: Duration::ZERO,
        }
    } else {
        PollAsk { count: 1, wait }
    }
}

impl Broker {
    /// Poll until `stop` turns true, then drain. Returns when every attempt is reported.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let (abandon_tx, abandon) = watch::channel(false);
        let mut inflight = JoinSet::new();
        let mut slots = self.hub.subscribe();
        let mut pacing = PollPacing::new(self.settings.poll_interval);
        let mut queue_had_tasks = false;
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
            let ask = next_poll(free, queue_had_tasks, self.settings.poll_wait);
            // Lease the slots before the poll: a task the poll brings always has one, even if
            // the runner starts draining while the poll is in flight.
            let mut leases: Vec<(String, Lease)> = (0..ask.count)
                .map_while(|_| {
                    let execution_id = uuid::Uuid::new_v4().simple().to_string();
                    let lease = self.hub.lease(&execution_id)?;
                    Some((execution_id, lease))
                })
                .collect();
            if leases.is_empty() {
                continue;
            }
            let poll_started = SystemTime::now();
            let polled = self
                .conductor
                .batch_poll(
                    &task_name,
                    self.settings.domain.as_deref(),
                    &self.settings.worker_id,
                    u32::try_from(leases.len()).unwrap_or(1),
                    ask.wait,
                )
                .await;
            let poll = (poll_started, SystemTime::now());
            let taken = polled.as_ref().map_or(0, Vec::len).min(leases.len());
            for (execution_id, lease) in leases.split_off(taken) {
                self.hub.release(lease, &execution_id);
            }
            queue_had_tasks = matches!(&polled, Ok(tasks) if !tasks.is_empty());
            let pause = match polled {
                Ok(tasks) if tasks.is_empty() => {
                    self.metrics.polls.with_label_values(&["empty"]).inc();
                    // An empty poll that did not wait is followed at once by one that does.
                    if ask.wait < self.settings.poll_wait {
                        Duration::ZERO
                    } else {
                        pacing.after_empty()
                    }
                }
                Ok(tasks) => {
                    self.metrics.polls.with_label_values(&["tasks"]).inc();
                    self.metrics.polled_tasks.inc_by(tasks.len() as u64);
                    let mut leases = leases.into_iter();
                    for task in tasks {
                        // More tasks than asked for would find no slot (Conductor never does
                        // this); they fail at once rather than wait unseen.
                        let (execution_id, lease) = match leases.next() {
                            Some((id, lease)) => {
                                self.hub.took(&id);
                                (id, Some(lease))
                            }
                            None => (uuid::Uuid::new_v4().simple().to_string(), None),
                        };
                        let broker = Arc::clone(&self);
                        let abandon = abandon.clone();
                        inflight.spawn(async move {
                            broker
                                .attempt(task, poll, execution_id, lease, abandon)
                                .await
                        });
                    }
                    pacing.after_tasks()
                }
                Err(e) => {
                    self.metrics.polls.with_label_values(&["error"]).inc();
                    self.metrics
                        .conductor_errors
                        .with_label_values(&[e.call()])
                        .inc();
                    let pause = pacing.after_failure(e.is_auth());
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
        poll: (SystemTime, SystemTime),
        execution_id: String,
        lease: Option<Lease>,
        abandon: watch::Receiver<bool>,
    ) {
        let trace = self.tracer.as_ref().map_or_else(AttemptTrace::off, |t| {
            t.attempt(poll, &self.contract.task_name, RunTrace::of(&task))
        });
        trace.note_attempt("perago.execution.id", &execution_id);
        trace.note_attempt("perago.worker.id", &self.settings.worker_id);
        let snapshot = match AttemptSnapshot::from_task(&task) {
            Ok(s) => s,
            Err(e) => {
                if let Some(lease) = lease {
                    self.hub.release(lease, &execution_id);
                }
                match report_identity(&task) {
                    Some((wf, id)) => {
                        let span = info_span!("attempt", workflow_instance_id = %wf, task_id = %id, execution_id = %execution_id);
                        trace.note_attempt("perago.workflow.id", &wf);
                        trace.note_attempt("perago.task.id", &id);
                        let error = AttemptError::from(e);
                        let reason = error.label();
                        self.metrics
                            .attempt_failures
                            .with_label_values(&[reason])
                            .inc();
                        let outcome = Outcome::from(error);
                        let status = outcome.status();
                        self.report(&wf, &id, outcome, &trace)
                            .instrument(span)
                            .await;
                        self.finish_trace(trace, status, Some(reason));
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
        trace.note_attempt("perago.workflow.id", &snapshot.workflow_instance_id);
        trace.note_attempt("perago.task.id", &snapshot.task_id);
        trace.note_attempt("perago.task.reference_name", &snapshot.reference_task_name);
        trace.note_attempt("perago.attempt.retry_count", snapshot.retry_count);
        let lineage = self
            .lineage
            .as_ref()
            .map_or_else(crate::openlineage::RunEvents::off, |l| l.run(&task));
        // Its calls to Conductor and lakeFS send the attempt's root span as `traceparent`.
        let traceparent = trace.root_traceparent();
        let attempt = async move {
            let started = Instant::now();
            info!(phase = "start", reference_task_name = %snapshot.reference_task_name, "attempt started");
            let keeper = self.keep_lease(&snapshot);
            let done = self.execute(&snapshot, &execution_id, lease, abandon, (&trace, &lineage)).await;
            keeper.abort();
            let _ = keeper.await;
            self.metrics.record_attempt_seconds(started.elapsed().as_secs_f64());
            let (outcome, sweep, reason, verdict) = match done {
                Ok(completion) => (
                    Outcome::Completed(completion.output),
                    completion.sweep,
                    None,
                    Verdict::Completed,
                ),
                Err(error) => {
                    let reason = error.label();
                    self.metrics.attempt_failures.with_label_values(&[reason]).inc();
                    let verdict = error.verdict();
                    (Outcome::from(error), None, Some(reason), verdict)
                }
            };
            self.metrics
                .attempt_verdicts
                .with_label_values(&[verdict.label()])
                .inc();
            let status = outcome.status();
            self.report(&snapshot.workflow_instance_id, &snapshot.task_id, outcome, &trace).await;
            if let Some(sweep) = sweep {
                trace.mark("sweep");
                self.sweep_after_report(&snapshot, sweep).await;
            }
            self.finish_trace(trace, status, reason);
        }
        .instrument(span);
        crate::trace::calls_traced(traceparent, attempt).await;
    }

    fn finish_trace(&self, trace: AttemptTrace, status: &str, reason: Option<&str>) {
        if let Some(tracer) = &self.tracer {
            tracer.finish(trace, &TraceOutcome { status, reason });
        }
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
                // After a slow extension, the next one comes a period later, not at once.
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
        (trace, lineage): (&AttemptTrace, &crate::openlineage::RunEvents),
    ) -> Result<Completion, AttemptError> {
        let Some(lease) = lease else {
            return Err(AttemptError::NoSlot {
                task_id: snapshot.task_id.clone(),
            });
        };
        let attempt = Attempt {
            broker: self,
            snapshot,
            execution_id,
            lease,
            abandon,
            trace,
            lineage,
        };
        let done = attempt.run().await;
        self.hub.release(lease, execution_id);
        done
    }

    /// Remove the staging branches earlier attempts of this step left behind (a pod that died
    /// between stage or merge and cleanup). After the report, so it never delays it.
    async fn sweep_after_report(&self, snapshot: &AttemptSnapshot, sweep: Sweep) {
        let TaskRuntime::Workspace(runtime) = &self.runtime else {
            return;
        };
        let removed = publish::sweep_step_branches(
            &runtime.lakefs,
            &sweep.repository,
            snapshot,
            sweep.ours.as_deref(),
        )
        .await;
        if removed > 0 {
            info!(
                removed_count = removed,
                "removed staging branches earlier attempts of this step left behind"
            );
        }
    }

    /// Send the result, retrying transient failures with back-off. A result that cannot be
    /// delivered is logged loudly; Conductor's timeouts take over.
    async fn report(
        &self,
        workflow_instance_id: &str,
        task_id: &str,
        mut outcome: Outcome,
        trace: &AttemptTrace,
    ) {
        trace.mark("report");
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
        let sent = (|| self.conductor.update_task(&body, timeout))
            .retry(retry::report())
            .when(ConductorError::is_transient)
            .notify(|e, pause| {
                self.metrics
                    .conductor_errors
                    .with_label_values(&[e.call()])
                    .inc();
                warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "reporting the result failed; trying again");
            })
            .await;
        let last = match sent {
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
                warn!(error = %e, transient = e.is_transient(), "reporting the result failed");
                e
            }
        };
        self.metrics.results_lost.inc();
        trace.fail("result_lost", &last);
        error!(
            status,
            workflow_instance_id,
            task_id,
            error = %last,
            "task result LOST: Conductor did not accept it; its timeouts and retry policy decide what happens next"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_that_waits_asks_for_one_task() {
        let wait = Duration::from_millis(100);
        let long_poll = PollAsk { count: 1, wait };
        // An idle pod, or one slot free: one task, with the long poll.
        assert_eq!(next_poll(4, false, wait), long_poll);
        assert_eq!(next_poll(1, false, wait), long_poll);
        assert_eq!(next_poll(1, true, wait), long_poll);
        // Right after a poll brought tasks: every free slot's worth, without waiting.
        assert_eq!(
            next_poll(3, true, wait),
            PollAsk {
                count: 3,
                wait: Duration::ZERO
            }
        );
    }

    #[test]
    fn polls_pause_by_what_the_last_one_brought() {
        let interval = Duration::from_millis(100);
        let mut pacing = PollPacing::new(interval);
        // Empty polls: from a millisecond or two up to about the interval (with jitter).
        let empty: Vec<Duration> = (0..12).map(|_| pacing.after_empty()).collect();
        assert!(empty[0] < Duration::from_millis(3), "{empty:?}");
        assert!(empty.windows(2).take(5).all(|w| w[1] > w[0]), "{empty:?}");
        assert!(empty.iter().all(|d| *d < interval * 2), "{empty:?}");
        // Tasks: no pause, and the empty series starts again.
        assert_eq!(pacing.after_tasks(), Duration::ZERO);
        assert!(pacing.after_empty() < Duration::from_millis(3));
        // Failures: from about a second, growing, bounded by the cause's ceiling.
        let failures: Vec<Duration> = (0..20).map(|_| pacing.after_failure(false)).collect();
        assert!(failures[0] >= Duration::from_millis(700) && failures[0] < Duration::from_secs(2));
        assert!(
            failures.iter().all(|d| *d < Duration::from_secs(161)),
            "{failures:?}"
        );
        assert!(failures[19] > Duration::from_secs(60), "{failures:?}");
        // An empty poll means Conductor answers again: the next failure starts low.
        pacing.after_empty();
        assert!(pacing.after_failure(false) < Duration::from_secs(2));
        let mut refused = PollPacing::new(interval);
        let late = (0..20).map(|_| refused.after_failure(true)).last().unwrap();
        assert!(
            late < Duration::from_secs(81) && late >= Duration::from_secs(40),
            "{late:?}"
        );
    }
}
