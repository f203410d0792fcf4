//! The sidecar's side of the runner protocol: the slot table, runner generations and the
//! socket server.
//!
//! A slot is a stable logical identity (1..=N). A runner connection is a *generation*; the
//! slots are leasable only while a generation is connected and not draining. The broker
//! leases a slot before it polls for the task that will run there, so a task never arrives
//! without one; a draining generation still gets the assignments of slots leased before it
//! drained, and the sidecar closes its connection once none is leased. When a
//! generation disconnects, every execution waiting on it ends as lost; a slot whose execution
//! is still being reported stays busy until that dispatch releases it, so a new generation
//! never sees the old execution. Completions are matched by execution id and generation;
//! anything else is rejected.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{error, info, warn};

use crate::telemetry::Metrics;
use perago_contract::protocol::{MAX_LINE_BYTES, PROTOCOL_VERSION, RunnerMessage, SidecarMessage};

/// How an execution's process ended, as the runner reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessEnd {
    Exited {
        code: i32,
    },
    Signalled {
        signal: i32,
        /// By the kernel's out-of-memory killer, as the runner saw it.
        oom_killed: bool,
    },
    NotStarted {
        error: String,
    },
    /// The runner generation that ran it disconnected first.
    RunnerLost,
}

/// The lease's runner generation is no longer connected.
#[derive(Debug, PartialEq, Eq)]
pub struct GenerationGone;

/// A leased slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub slot: u32,
    pub generation: u64,
}

struct Waiter {
    generation: u64,
    tx: oneshot::Sender<ProcessEnd>,
}

#[derive(Default)]
struct State {
    /// Connected generation; 0 = none.
    generation: u64,
    last_generation: u64,
    draining: bool,
    sender: Option<mpsc::UnboundedSender<SidecarMessage>>,
    /// Per slot, the execution it runs or is leased for.
    busy: Vec<Option<String>>,
    /// Executions leased a slot but not yet assigned (a poll in flight, or a polled task being
    /// prepared).
    reserved: std::collections::HashSet<String>,
    /// Those of `reserved` whose poll brought a task: busy in the metrics and on `/slots`, so
    /// that the operator never takes a pod preparing an attempt for an idle one.
    taken: std::collections::HashSet<String>,
    /// Those of `reserved` whose poll is still in flight, and when their slots were leased
    /// for it (before the poll was sent).
    polling: HashMap<String, Instant>,
    waiting: HashMap<String, Waiter>,
}

impl State {
    /// Busy slots as `/slots` and the metrics count them: leased, but not for a poll in flight.
    fn busy(&self) -> usize {
        let leased = self.busy.iter().filter(|b| b.is_some()).count();
        leased.saturating_sub(self.polling.len())
    }
}

pub struct RunnerHub {
    state: Mutex<State>,
    /// Bumped on every change of slot availability.
    changed: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

impl RunnerHub {
    pub fn new(slots: u32, metrics: Arc<Metrics>) -> Arc<Self> {
        metrics.slots.set(i64::from(slots));
        Arc::new(Self {
            state: Mutex::new(State {
                busy: vec![None; slots as usize],
                ..State::default()
            }),
            changed: watch::channel(0).0,
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn bump(&self, state: &State) {
        self.metrics.set_busy(state.busy());
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The busy slots now, and how long before `arrived` the oldest poll still in flight was
    /// sent (zero when every poll sent before `arrived` has been answered): every poll sent
    /// earlier than that has been answered and what it brought is counted busy.
    pub fn busy_and_uncounted_polls(&self, arrived: Instant) -> (usize, Duration) {
        let state = self.lock();
        let oldest = state.polling.values().min().copied();
        let uncounted = oldest.map_or(Duration::ZERO, |sent| {
            arrived.saturating_duration_since(sent)
        });
        (state.busy(), uncounted)
    }

    /// Wait until every poll sent before `cutoff` has been answered and counted, for at most
    /// `limit`. A scale-in asks this of the pods it would remove: Conductor takes a task off
    /// its queue when a poll arrives, and the pod counts it busy only once the answer is back,
    /// so a figure taken in between shows the task neither queued nor running (ADR 0033).
    pub async fn polls_answered(&self, cutoff: Instant, limit: Duration) {
        let mut changes = self.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        while self.lock().polling.values().any(|sent| *sent < cutoff) {
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
    }

    /// Subscribe to availability changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn connected(&self) -> bool {
        self.lock().generation != 0
    }

    /// Slots an assignment could go to now.
    pub fn free_slots(&self) -> u32 {
        let state = self.lock();
        if state.generation == 0 || state.draining {
            return 0;
        }
        u32::try_from(state.busy.iter().filter(|b| b.is_none()).count()).unwrap_or(0)
    }

    pub fn lease(&self, execution_id: &str) -> Option<Lease> {
        let mut state = self.lock();
        if state.generation == 0 || state.draining {
            return None;
        }
        let index = state.busy.iter().position(Option::is_none)?;
        state.busy[index] = Some(execution_id.to_owned());
        state.reserved.insert(execution_id.to_owned());
        state
            .polling
            .insert(execution_id.to_owned(), Instant::now());
        let lease = Lease {
            slot: u32::try_from(index + 1).unwrap_or(u32::MAX),
            generation: state.generation,
        };
        self.bump(&state);
        Some(lease)
    }

    /// The poll brought a task for this execution's lease: its slot is busy from now on,
    /// though its body is assigned only once the input is checked and the workspace is
    /// downloaded.
    pub fn took(&self, execution_id: &str) {
        let mut state = self.lock();
        if state.reserved.contains(execution_id) {
            state.taken.insert(execution_id.to_owned());
            state.polling.remove(execution_id);
            self.bump(&state);
        }
    }

    /// Free the slot if it still runs this execution.
    pub fn release(&self, lease: Lease, execution_id: &str) {
        let mut state = self.lock();
        let index = lease.slot as usize - 1;
        if state.busy.get(index).and_then(Option::as_deref) == Some(execution_id) {
            state.busy[index] = None;
        }
        state.reserved.remove(execution_id);
        state.taken.remove(execution_id);
        state.polling.remove(execution_id);
        state.waiting.remove(execution_id);
        Self::close_if_drained(&mut state);
        self.bump(&state);
    }

    /// A draining generation whose last leased slot is free gets no more assignments: close
    /// its connection (dropping the sender ends the writer), which tells the runner to exit.
    fn close_if_drained(state: &mut State) {
        if state.draining && state.busy.iter().all(Option::is_none) {
            state.sender = None;
        }
    }

    /// Send an assignment on the connected generation. A slot leased on a generation that
    /// has gone since (the body crashed while the poll was in flight) is still held for its
    /// execution, so the assignment goes to the generation that replaced it. `Err` when no
    /// generation is connected, it drains, or the slot is no longer this execution's.
    pub fn assign(
        &self,
        lease: Lease,
        execution_id: &str,
        env: BTreeMap<String, String>,
    ) -> Result<oneshot::Receiver<ProcessEnd>, GenerationGone> {
        let mut state = self.lock();
        let index = lease.slot as usize - 1;
        let still_ours = state.busy.get(index).and_then(Option::as_deref) == Some(execution_id)
            && state.reserved.contains(execution_id);
        if state.generation == 0
            || !still_ours
            || (state.generation != lease.generation && state.draining)
        {
            return Err(GenerationGone);
        }
        let generation = state.generation;
        let sender = state.sender.clone().ok_or(GenerationGone)?;
        state.reserved.remove(execution_id);
        state.taken.remove(execution_id);
        state.polling.remove(execution_id);
        let (tx, rx) = oneshot::channel();
        state
            .waiting
            .insert(execution_id.to_owned(), Waiter { generation, tx });
        let message = SidecarMessage::Assign {
            execution_id: execution_id.to_owned(),
            slot: lease.slot,
            env,
        };
        if sender.send(message).is_err() {
            state.waiting.remove(execution_id);
            return Err(GenerationGone);
        }
        self.bump(&state);
        Ok(rx)
    }

    /// `assign`, waiting up to `patience` for a generation to connect when none is (the body
    /// is being restarted).
    pub async fn assign_when_connected(
        &self,
        lease: Lease,
        execution_id: &str,
        env: BTreeMap<String, String>,
        patience: Duration,
    ) -> Result<oneshot::Receiver<ProcessEnd>, GenerationGone> {
        let mut changes = self.subscribe();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match self.assign(lease, execution_id, env.clone()) {
                Err(GenerationGone) if !self.connected() => {
                    if tokio::time::timeout_at(deadline, changes.changed())
                        .await
                        .is_err()
                    {
                        return Err(GenerationGone);
                    }
                }
                answer => return answer,
            }
        }
    }

    /// Ask the runner to kill an execution's process (it still reports the exit).
    pub fn cancel(&self, execution_id: &str) {
        let state = self.lock();
        if state
            .waiting
            .get(execution_id)
            .is_some_and(|w| w.generation == state.generation)
            && let Some(sender) = &state.sender
        {
            let _ = sender.send(SidecarMessage::Cancel {
                execution_id: execution_id.to_owned(),
            });
        }
    }

    fn connect(&self, sender: mpsc::UnboundedSender<SidecarMessage>) -> (u64, u32) {
        let mut state = self.lock();
        if state.generation != 0 {
            let old = state.generation;
            warn!(
                generation = old,
                "a new runner connected while another was connected; the old one is dropped"
            );
            Self::lose(&mut state, old);
        }
        state.last_generation += 1;
        state.generation = state.last_generation;
        state.sender = Some(sender);
        state.draining = false;
        self.metrics.runner_connected.set(1);
        let slots = u32::try_from(state.busy.len()).unwrap_or(u32::MAX);
        let generation = state.generation;
        self.bump(&state);
        (generation, slots)
    }

    /// End a generation: waiters on it learn that their runner is gone.
    fn lose(state: &mut State, generation: u64) {
        if state.generation == generation {
            state.generation = 0;
            state.sender = None;
            state.draining = false;
        }
        let lost: Vec<String> = state
            .waiting
            .iter()
            .filter(|(_, w)| w.generation == generation)
            .map(|(id, _)| id.clone())
            .collect();
        for id in lost {
            if let Some(w) = state.waiting.remove(&id) {
                let _ = w.tx.send(ProcessEnd::RunnerLost);
            }
        }
    }

    fn disconnect(&self, generation: u64) {
        let mut state = self.lock();
        Self::lose(&mut state, generation);
        if state.generation == 0 {
            self.metrics.runner_connected.set(0);
        }
        self.bump(&state);
    }

    fn drain(&self, generation: u64) {
        let mut state = self.lock();
        if state.generation == generation {
            state.draining = true;
            Self::close_if_drained(&mut state);
        }
        self.bump(&state);
    }

    fn complete(&self, generation: u64, execution_id: &str, end: ProcessEnd) {
        let mut state = self.lock();
        match state.waiting.get(execution_id) {
            Some(w) if w.generation == generation => {
                if let Some(w) = state.waiting.remove(execution_id) {
                    let _ = w.tx.send(end);
                }
            }
            _ => {
                self.metrics.rejected_completions.inc();
                warn!(
                    execution_id,
                    generation,
                    "rejected a completion for an execution this runner generation is not running"
                );
            }
        }
    }

    /// Accept runner connections until the listener fails.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let hub = Arc::clone(&self);
                    tokio::spawn(async move { hub.connection(stream).await });
                }
                Err(e) => {
                    error!(error = %e, "accepting a runner connection failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    async fn connection(self: Arc<Self>, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::new(read);
        let hello = tokio::time::timeout(Duration::from_secs(10), read_message(&mut reader)).await;
        let pid = match hello {
            Ok(Ok(Some(RunnerMessage::Hello { protocol, pid })))
                if protocol == PROTOCOL_VERSION =>
            {
                pid
            }
            Ok(Ok(Some(RunnerMessage::Hello { protocol, .. }))) => {
                error!(
                    protocol,
                    expected = PROTOCOL_VERSION,
                    "refused a runner speaking another protocol version"
                );
                return;
            }
            other => {
                warn!(answer = ?other.map(|r| r.map_err(|e| e.to_string())), "refused a runner connection that did not start with hello");
                return;
            }
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (generation, slots) = self.connect(tx);
        info!(generation, runner_pid = pid, slots, "runner connected");
        let welcome = SidecarMessage::Welcome {
            protocol: PROTOCOL_VERSION,
            generation,
            slots,
        };
        let writer = tokio::spawn(async move {
            let mut message = welcome;
            loop {
                let mut line = serde_json::to_vec(&message).unwrap_or_default();
                line.push(b'\n');
                if write.write_all(&line).await.is_err() {
                    break;
                }
                match rx.recv().await {
                    Some(next) => message = next,
                    None => break,
                }
            }
        });
        loop {
            match read_message(&mut reader).await {
                Ok(Some(RunnerMessage::Exited {
                    execution_id,
                    code,
                    signal,
                    error,
                    oom_killed,
                })) => {
                    let end = match (error, signal, code) {
                        (Some(error), _, _) => ProcessEnd::NotStarted { error },
                        (None, Some(signal), _) => ProcessEnd::Signalled { signal, oom_killed },
                        (None, None, Some(code)) => ProcessEnd::Exited { code },
                        (None, None, None) => ProcessEnd::NotStarted {
                            error: "the runner reported neither an exit status nor a signal".into(),
                        },
                    };
                    self.complete(generation, &execution_id, end);
                }
                Ok(Some(RunnerMessage::Draining)) => {
                    info!(
                        generation,
                        "runner is draining; no more assignments go to it"
                    );
                    self.drain(generation);
                }
                Ok(Some(RunnerMessage::Hello { .. })) => {
                    warn!(generation, "ignored a repeated hello from the runner");
                }
                Ok(None) => {
                    info!(generation, "runner disconnected");
                    break;
                }
                Err(e) => {
                    warn!(generation, error = %e, "runner connection dropped after a protocol error");
                    break;
                }
            }
        }
        self.disconnect(generation);
        writer.abort();
    }
}

/// Read one message; `None` at end of stream. Lines are bounded by [`MAX_LINE_BYTES`].
#[doc(hidden)] // public for the fuzz targets
pub async fn read_message<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
) -> std::io::Result<Option<RunnerMessage>> {
    let mut line = Vec::new();
    let limit = u64::try_from(MAX_LINE_BYTES + 1).unwrap_or(u64::MAX);
    let n = (&mut *reader)
        .take(limit)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        let reason = if line.len() > MAX_LINE_BYTES {
            "message too long"
        } else {
            "connection closed mid-message"
        };
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, reason));
    }
    serde_json::from_slice(&line).map(Some).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("invalid message: {e}"),
        )
    })
}

/// Bind the socket, replacing a stale one left by an earlier sidecar.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    // The body container may run as another user of the pod's fsGroup.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o770))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(slots: u32) -> Arc<RunnerHub> {
        RunnerHub::new(slots, Arc::new(Metrics::new("t", None, "i").unwrap()))
    }

    #[test]
    fn no_slots_without_a_runner_and_none_while_draining() {
        let hub = hub(2);
        assert_eq!(hub.free_slots(), 0);
        assert!(hub.lease("e1").is_none());
        let (tx, _rx) = mpsc::unbounded_channel();
        let (generation, _) = hub.connect(tx);
        assert_eq!(hub.free_slots(), 2);
        hub.drain(generation);
        assert_eq!(hub.free_slots(), 0);
    }

    /// A slot leased for a poll in flight when the runner starts draining still gets its
    /// assignment; the connection closes once the last leased slot is free.
    #[tokio::test]
    async fn a_draining_runner_gets_the_leased_assignments_then_the_connection_closes() {
        let hub = hub(2);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (generation, _) = hub.connect(tx);
        let lease = hub.lease("polled").unwrap();
        assert_eq!(
            hub.metrics.slots_busy.get(),
            0,
            "a lease for a poll is not busy"
        );
        hub.drain(generation);
        assert!(hub.lease("later").is_none());
        hub.took("polled");
        assert_eq!(
            hub.metrics.slots_busy.get(),
            1,
            "a polled task's slot is busy before its body is assigned"
        );
        hub.assign(lease, "polled", BTreeMap::new()).unwrap();
        assert_eq!(hub.metrics.slots_busy.get(), 1);
        assert!(matches!(
            rx.recv().await,
            Some(SidecarMessage::Assign { .. })
        ));
        hub.complete(generation, "polled", ProcessEnd::Exited { code: 0 });
        hub.release(lease, "polled");
        assert!(rx.recv().await.is_none(), "closed once nothing is leased");

        // Draining with nothing leased closes at once.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (generation, _) = hub.connect(tx);
        hub.drain(generation);
        assert!(rx.recv().await.is_none());
    }

    /// `/slots?countPollsOlderThanMs=D` answers once the polls sent D ms before it arrived
    /// are answered, counting what they brought; a plain `/slots` answers at once and says how
    /// far back its count holds.
    #[tokio::test]
    async fn slots_wait_for_older_polls_and_count_what_they_brought() {
        const WAIT: Duration = Duration::from_millis(500);
        let hub = hub(2);
        let (tx, _rx) = mpsc::unbounded_channel();
        hub.connect(tx);
        let (_stop_tx, stop) = watch::channel(false);
        let address = crate::http::serve(
            "127.0.0.1:0".parse().unwrap(),
            Arc::clone(&hub.metrics),
            Arc::clone(&hub),
            stop,
            WAIT,
        )
        .await
        .unwrap();
        let get = |query: &'static str| async move {
            let url = format!("http://{address}/slots{query}");
            let answer = reqwest::get(url).await.unwrap();
            answer.json::<serde_json::Value>().await.unwrap()
        };

        let idle = get("?countPollsOlderThanMs=0").await;
        assert_eq!(
            (
                idle["busy"].as_u64(),
                idle["pollsCountedOlderThanMs"].as_u64()
            ),
            (Some(0), Some(0))
        );

        let polled = hub.lease("polled").unwrap();
        let unused = hub.lease("unused").unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let plain = get("").await;
        assert_eq!(plain["busy"], 0, "a poll in flight is not busy");
        assert!(
            plain["pollsCountedOlderThanMs"].as_u64().unwrap() >= 30,
            "the poll sent 30 ms before is not counted yet: {plain}"
        );

        let settled = tokio::spawn(get("?countPollsOlderThanMs=0"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!settled.is_finished(), "waits for the poll in flight");
        hub.release(unused, "unused");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !settled.is_finished(),
            "one poll's lease answered, the other not yet"
        );
        hub.took("polled");
        let settled = settled.await.unwrap();
        assert_eq!(
            settled["busy"], 1,
            "what the poll brought is counted: {settled}"
        );
        assert_eq!(settled["pollsCountedOlderThanMs"], 0);

        // A poll that outlasts the wait: the answer says so rather than claim it.
        hub.release(polled, "polled");
        let _late = hub.lease("late").unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = std::time::Instant::now();
        let waited = get("?countPollsOlderThanMs=0").await;
        assert!(started.elapsed() >= WAIT);
        assert!(
            waited["pollsCountedOlderThanMs"].as_u64().unwrap() >= 10,
            "{waited}"
        );
        // A poll sent after the cutoff is not waited for.
        let recent = get("?countPollsOlderThanMs=60000").await;
        assert_eq!(recent["busy"], 0);
    }

    #[tokio::test]
    async fn a_lost_generation_fails_its_executions_and_slots_return_only_with_a_new_one() {
        let hub = hub(1);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (g1, _) = hub.connect(tx);
        let lease = hub.lease("e1").unwrap();
        assert_eq!(
            lease,
            Lease {
                slot: 1,
                generation: g1
            }
        );
        assert!(hub.lease("e2").is_none(), "one slot, one execution");
        let done = hub.assign(lease, "e1", BTreeMap::new()).unwrap();
        assert!(matches!(
            rx.recv().await,
            Some(SidecarMessage::Assign { slot: 1, .. })
        ));
        hub.disconnect(g1);
        assert_eq!(done.await.unwrap(), ProcessEnd::RunnerLost);
        // A late completion from the dead generation is rejected.
        hub.complete(g1, "e1", ProcessEnd::Exited { code: 0 });
        assert_eq!(hub.metrics.rejected_completions.get(), 1);
        let (tx2, _rx2) = mpsc::unbounded_channel();
        let (g2, _) = hub.connect(tx2);
        assert!(g2 > g1);
        assert_eq!(
            hub.free_slots(),
            0,
            "still busy until the dispatch releases it"
        );
        hub.release(lease, "e1");
        assert_eq!(hub.free_slots(), 1);
        let again = hub.lease("e3").unwrap();
        assert_eq!(again.generation, g2);
        assert!(
            hub.assign(lease, "e4", BTreeMap::new()).is_err(),
            "old generation is refused"
        );
    }

    /// The body crashed while a poll was in flight: the task it brought waits for the body
    /// to connect again and runs there, and only there.
    #[tokio::test]
    async fn a_slot_leased_before_the_body_crashed_is_assigned_on_the_next_generation() {
        let hub = hub(2);
        let (tx1, _rx1) = mpsc::unbounded_channel();
        let (g1, _) = hub.connect(tx1);
        let lease = hub.lease("polled").unwrap();
        hub.disconnect(g1);
        assert!(
            hub.assign(lease, "polled", BTreeMap::new()).is_err(),
            "nobody to assign to"
        );
        let waiting = {
            let hub = Arc::clone(&hub);
            tokio::spawn(async move {
                hub.assign_when_connected(lease, "polled", BTreeMap::new(), Duration::from_secs(5))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        let (g2, _) = hub.connect(tx2);
        assert_eq!(hub.free_slots(), 1, "the carried slot stays taken");
        let done = waiting.await.unwrap().unwrap();
        assert!(matches!(
            rx2.recv().await,
            Some(SidecarMessage::Assign { slot, .. }) if slot == lease.slot
        ));
        hub.complete(g1, "polled", ProcessEnd::Exited { code: 0 });
        hub.complete(g2, "polled", ProcessEnd::Exited { code: 0 });
        assert_eq!(done.await.unwrap(), ProcessEnd::Exited { code: 0 });
        assert_eq!(hub.metrics.rejected_completions.get(), 1, "g1's is not its");

        let other = hub.lease("other").unwrap();
        hub.release(other, "other");
        assert!(
            hub.assign(other, "other", BTreeMap::new()).is_err(),
            "a released slot is not assigned"
        );
        let gone = hub
            .assign_when_connected(other, "late", BTreeMap::new(), Duration::from_millis(50))
            .await;
        assert!(gone.is_err());
    }

    #[tokio::test]
    async fn completions_match_execution_and_generation() {
        let hub = hub(2);
        let (tx, _rx) = mpsc::unbounded_channel();
        let (g, _) = hub.connect(tx);
        let a = hub.lease("a").unwrap();
        let b = hub.lease("b").unwrap();
        assert_ne!(a.slot, b.slot);
        let ra = hub.assign(a, "a", BTreeMap::new()).unwrap();
        let rb = hub.assign(b, "b", BTreeMap::new()).unwrap();
        // Completed in reverse order.
        hub.complete(g, "b", ProcessEnd::Exited { code: 3 });
        hub.complete(
            g,
            "a",
            ProcessEnd::Signalled {
                signal: 9,
                oom_killed: false,
            },
        );
        assert_eq!(rb.await.unwrap(), ProcessEnd::Exited { code: 3 });
        assert_eq!(
            ra.await.unwrap(),
            ProcessEnd::Signalled {
                signal: 9,
                oom_killed: false
            }
        );
        // A duplicate is rejected.
        hub.complete(g, "a", ProcessEnd::Exited { code: 0 });
        assert_eq!(hub.metrics.rejected_completions.get(), 1);
        hub.release(a, "a");
        hub.release(a, "a");
        assert_eq!(hub.free_slots(), 1);
    }
}
