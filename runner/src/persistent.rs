//! Persistent bodies: one long-lived body process per slot, taking attempt after attempt over
//! the socket on its standard input (protocol 2, `perago_contract::protocol::persistent`).
//!
//! A body process is replaced when it exits (a crash fails the attempt it held, as a
//! per-attempt process's would), when the sidecar cancels its attempt (it is killed), after
//! `max_attempts` attempts, or when its resident memory passes `max_memory` after an attempt
//! (a leak is cut off between attempts, not in the middle of one).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::thread;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use perago_contract::protocol::persistent::{FromBody, PROTOCOL, PROTOCOL_ENV, ToBody};
use perago_contract::protocol::{MAX_LINE_BYTES, RunnerMessage};

use crate::{Event, log, not_started, oom_kills};

/// When a body process is replaced by a fresh one, besides crashing or being cancelled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_attempts: Option<u32>,
    pub max_memory: Option<u64>,
}

/// Why an attempt could not be handed to a persistent body: the text becomes the attempt's
/// `exited` error, which the sidecar reports as the body not starting.
#[derive(Debug)]
pub enum AssignError {
    /// The attempt could not be written as a line of the protocol.
    Encode(serde_json::Error),
    /// The socket pair between the runner and a new body could not be made.
    SocketPair(std::io::Error),
    /// The body's command could not be started.
    Spawn {
        command: String,
        source: std::io::Error,
    },
    /// The runner's end of a new body's socket could not be shared with its reader.
    Reader(std::io::Error),
    /// Neither the slot's body nor its one replacement took the attempt.
    NotTaken,
}

// The text holds each cause (an I/O or encoding error) in full, as the attempt's error
// always did, so the error names no separate source.
impl fmt::Display for AssignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Encode(e) => write!(f, "{e}"),
            Self::SocketPair(e) => write!(f, "socketpair: {e}"),
            Self::Spawn { command, source } => write!(f, "{command}: {source}"),
            Self::Reader(e) => write!(f, "{e}"),
            Self::NotTaken => f.write_str("the persistent body could not be given the attempt"),
        }
    }
}

impl std::error::Error for AssignError {}

/// How long a body told to stop (its socket closed) has before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

struct Body {
    pid: i32,
    socket: UnixStream,
    /// Cleared once its process has been reaped, so that its pid is never signalled after.
    alive: Arc<AtomicBool>,
    served: u32,
    /// The attempt it runs, and the container's OOM-kill count when it started.
    current: Option<(String, Option<u64>)>,
}

impl Body {
    fn kill(&self) {
        if self.alive.load(Ordering::SeqCst) {
            let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
    }

    /// Close its socket: a well-behaved body exits; one that does not is killed after the grace.
    fn retire(self) {
        let _ = self.socket.shutdown(Shutdown::Both);
        let (pid, alive) = (self.pid, self.alive);
        thread::spawn(move || {
            thread::sleep(STOP_GRACE);
            if alive.load(Ordering::SeqCst) {
                log(&format!(
                    "the persistent body (pid {pid}) did not exit when told to; killing it"
                ));
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
        });
    }
}

/// The body processes of one connection, by slot.
pub struct Bodies {
    command: Vec<String>,
    limits: Limits,
    by_slot: HashMap<u32, Body>,
}

impl Bodies {
    pub fn new(command: Vec<String>, limits: Limits) -> Self {
        Self {
            command,
            limits,
            by_slot: HashMap::new(),
        }
    }

    /// Start a body for every slot that has none, so that the first attempts do not wait for
    /// what the body loads at its start. A slot whose body crashed is filled at its next
    /// attempt instead, so that a body that cannot start does not restart in a loop.
    pub fn warm(&mut self, slots: u32, events: &Sender<Event>) {
        for slot in 1..=slots {
            if self.by_slot.contains_key(&slot) {
                continue;
            }
            match self.start(slot, events) {
                Ok(body) => {
                    self.by_slot.insert(slot, body);
                }
                Err(e) => log(&format!(
                    "slot {slot}: starting a persistent body failed: {e}"
                )),
            }
        }
    }

    /// Hand the attempt to the slot's body, starting one if the slot has none; its pid.
    pub fn assign(
        &mut self,
        slot: u32,
        execution_id: &str,
        env: BTreeMap<String, String>,
        events: &Sender<Event>,
    ) -> Result<i32, AssignError> {
        let message = ToBody::Attempt {
            execution_id: execution_id.to_owned(),
            env,
        };
        let mut line = serde_json::to_vec(&message).map_err(AssignError::Encode)?;
        line.push(b'\n');
        // A body that died since its last attempt (its exit event not read yet) gets one
        // replacement before the attempt fails.
        for _ in 0..2 {
            if !self.by_slot.contains_key(&slot) {
                let body = self.start(slot, events)?;
                self.by_slot.insert(slot, body);
            }
            let Some(body) = self.by_slot.get_mut(&slot) else {
                continue;
            };
            match body.socket.write_all(&line) {
                Ok(()) => {
                    body.current = Some((execution_id.to_owned(), oom_kills()));
                    return Ok(body.pid);
                }
                Err(e) => {
                    log(&format!(
                        "slot {slot}: the persistent body (pid {}) cannot take the attempt ({e}); starting another",
                        body.pid
                    ));
                    if let Some(body) = self.by_slot.remove(&slot) {
                        body.kill();
                    }
                }
            }
        }
        Err(AssignError::NotTaken)
    }

    fn start(&self, slot: u32, events: &Sender<Event>) -> Result<Body, AssignError> {
        let (ours, theirs) = UnixStream::pair().map_err(AssignError::SocketPair)?;
        let mut child = Command::new(&self.command[0])
            .args(&self.command[1..])
            .env(PROTOCOL_ENV, PROTOCOL.to_string())
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .process_group(0)
            .spawn()
            .map_err(|source| AssignError::Spawn {
                command: self.command[0].clone(),
                source,
            })?;
        let pid = i32::try_from(child.id()).unwrap_or(0);
        log(&format!(
            "slot {slot}: started a persistent body (pid {pid})"
        ));
        let reader = ours.try_clone().map_err(AssignError::Reader)?;
        let alive = Arc::new(AtomicBool::new(true));
        let (events, reaped) = (events.clone(), Arc::clone(&alive));
        thread::spawn(move || {
            read_answers(slot, pid, reader, &events);
            let status = child.wait();
            reaped.store(false, Ordering::SeqCst);
            let _ = events.send(Event::BodyExited { slot, pid, status });
        });
        Ok(Body {
            pid,
            socket: ours,
            alive,
            served: 0,
            current: None,
        })
    }

    /// The body says an attempt is over: the `exited` to report, if it was the attempt it held.
    pub fn done(
        &mut self,
        slot: u32,
        pid: i32,
        execution_id: String,
        events: &Sender<Event>,
    ) -> Option<RunnerMessage> {
        let body = self.by_slot.get_mut(&slot).filter(|b| b.pid == pid)?;
        if body.current.as_ref().map(|(id, _)| id) != Some(&execution_id) {
            log(&format!(
                "slot {slot}: the persistent body (pid {pid}) reported {execution_id}, which it does not hold; ignored"
            ));
            return None;
        }
        body.current = None;
        body.served += 1;
        if let Some(why) = self.limit_reached(slot) {
            log(&format!(
                "slot {slot}: replacing the persistent body (pid {pid}): {why}"
            ));
            if let Some(body) = self.by_slot.remove(&slot) {
                body.retire();
            }
            match self.start(slot, events) {
                Ok(body) => {
                    self.by_slot.insert(slot, body);
                }
                Err(e) => log(&format!(
                    "slot {slot}: starting a persistent body failed: {e}"
                )),
            }
        }
        Some(RunnerMessage::Exited {
            execution_id,
            code: Some(0),
            signal: None,
            error: None,
            oom_killed: false,
        })
    }

    fn limit_reached(&self, slot: u32) -> Option<String> {
        let body = self.by_slot.get(&slot)?;
        if let Some(max) = self.limits.max_attempts
            && body.served >= max
        {
            return Some(format!("it served {} attempts (max {max})", body.served));
        }
        let max = self.limits.max_memory?;
        let rss = resident_bytes(body.pid)?;
        (rss > max).then(|| {
            format!(
                "its resident memory is {} MiB, above its limit of {} MiB",
                rss >> 20,
                max >> 20
            )
        })
    }

    /// A body process ended: the `exited` of the attempt it held, if any.
    pub fn exited(
        &mut self,
        slot: u32,
        pid: i32,
        status: std::io::Result<ExitStatus>,
    ) -> Option<RunnerMessage> {
        let body = self.by_slot.get(&slot).filter(|b| b.pid == pid)?;
        let held = body.current.clone();
        self.by_slot.remove(&slot);
        match &status {
            Ok(s) => log(&format!(
                "slot {slot}: the persistent body (pid {pid}) ended: {s}"
            )),
            Err(e) => log(&format!(
                "slot {slot}: waiting for the persistent body (pid {pid}) failed: {e}"
            )),
        }
        let (execution_id, oom_before) = held?;
        Some(match status {
            Ok(status) => RunnerMessage::Exited {
                execution_id,
                // As a per-attempt process's end: the files decide, then the status.
                code: status.code(),
                signal: status.signal(),
                error: None,
                oom_killed: status.signal() == Some(9) && oom_kills() > oom_before,
            },
            Err(e) => not_started(
                execution_id,
                format!("waiting for the persistent body failed: {e}"),
            ),
        })
    }
}

impl Drop for Bodies {
    /// The connection is over: every body is told to stop.
    fn drop(&mut self) {
        for (_, body) in self.by_slot.drain() {
            body.retire();
        }
    }
}

/// Forward the body's `done` lines until it closes its side or breaks the protocol (then it
/// is killed: a body that says something else cannot be trusted with the next attempt).
fn read_answers(slot: u32, pid: i32, socket: UnixStream, events: &Sender<Event>) {
    let mut reader = BufReader::new(socket);
    let limit = u64::try_from(MAX_LINE_BYTES + 1).unwrap_or(u64::MAX);
    loop {
        let mut line = Vec::new();
        let broke = match (&mut reader).take(limit).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line.last() != Some(&b'\n') => "an oversized or truncated line".to_owned(),
            Ok(_) => match serde_json::from_slice::<FromBody>(&line) {
                Ok(FromBody::Done { execution_id }) => {
                    let _ = events.send(Event::BodyDone {
                        slot,
                        pid,
                        execution_id,
                    });
                    continue;
                }
                Err(e) => format!("an invalid message ({e})"),
            },
        };
        log(&format!(
            "slot {slot}: the persistent body (pid {pid}) sent {broke}; killing it"
        ));
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        return;
    }
}

/// `VmRSS` of a process, from `/proc/<pid>/status`.
fn resident_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_that_cannot_start_names_its_command() {
        let bodies = Bodies::new(vec!["/nonexistent/perago-body".into()], Limits::default());
        let (events, _) = std::sync::mpsc::channel();
        let Err(e) = bodies.start(1, &events) else {
            panic!("a command that does not exist started");
        };
        assert!(
            matches!(&e, AssignError::Spawn { command, .. } if command == "/nonexistent/perago-body"),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with("/nonexistent/perago-body: "),
            "{e}"
        );
    }
}
