//! `perago-runner -- <command> [args]`: the task-body container's entry point.
//!
//! It connects to the sidecar's socket on the shared volume and starts `<command>` as a fresh
//! process for every assignment, with the assignment's environment added, then reports how the
//! process ended. It never talks to Conductor or lakeFS. Plain threads, no async runtime: it
//! stays a few megabytes.
//!
//! - Sidecar gone: every running process is killed (its result could not be reported) and the
//!   runner reconnects; the sidecar treats the new connection as a new generation.
//! - SIGTERM/SIGINT: the runner tells the sidecar it is draining, runs what the sidecar had
//!   already taken, lets running processes finish and report, and exits 0 when the sidecar
//!   closes the connection.
//! - Re-parented (its starter died; only outside a container): it exits.
//! - `--persistent` (`spec.executor.body.mode: persistent`): the command is started once per
//!   slot and takes attempt after attempt over a socket ([`persistent`]).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use perago_contract::protocol::persistent::{MAX_ATTEMPTS_ENV, MAX_MEMORY_ENV, MODE_ENV};
use perago_contract::protocol::{
    MAX_LINE_BYTES, PROTOCOL_VERSION, RunnerMessage, SOCKET_NAME, SidecarMessage,
};

mod persistent;

struct Args {
    socket: PathBuf,
    command: Vec<String>,
    /// Persistent bodies and when to replace them; `None`: a process per attempt.
    persistent: Option<persistent::Limits>,
}

const USAGE: &str = "usage: perago-runner [--socket PATH] [--persistent [--max-attempts N] [--max-memory BYTES]] -- COMMAND [ARGS...] | --version";

/// A positive whole number of a flag or variable.
fn positive<T: std::str::FromStr + PartialOrd + Default>(
    name: &str,
    value: &str,
) -> Result<T, String> {
    value
        .parse::<T>()
        .ok()
        .filter(|n| *n > T::default())
        .ok_or_else(|| format!("{name} must be a positive whole number, not {value:?}"))
}

fn parse_args() -> Result<Args, String> {
    let mut socket = std::env::var_os("PERAGO_SOCKET").map(PathBuf::from);
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut persistent = match var(MODE_ENV).as_deref() {
        None | Some("perAttempt") => false,
        Some("persistent") => true,
        Some(other) => {
            return Err(format!(
                "{MODE_ENV} must be perAttempt or persistent, not {other:?}"
            ));
        }
    };
    let mut limits = persistent::Limits {
        max_attempts: var(MAX_ATTEMPTS_ENV)
            .map(|v| positive(MAX_ATTEMPTS_ENV, &v))
            .transpose()?,
        max_memory: var(MAX_MEMORY_ENV)
            .map(|v| positive(MAX_MEMORY_ENV, &v))
            .transpose()?,
    };
    let mut args = std::env::args_os().skip(1);
    let mut command = Vec::new();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .map(|v| v.to_string_lossy().into_owned())
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match arg.to_str() {
            Some("--socket") => socket = Some(value("--socket")?.into()),
            Some("--persistent") => persistent = true,
            Some("--max-attempts") => {
                limits.max_attempts = Some(positive("--max-attempts", &value("--max-attempts")?)?);
            }
            Some("--max-memory") => {
                limits.max_memory = Some(positive("--max-memory", &value("--max-memory")?)?);
            }
            Some("--") => {
                command = args
                    .by_ref()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect();
            }
            Some("-h" | "--help") => return Err(USAGE.into()),
            // After `--` every argument is the task body's: this is the runner's own.
            Some("--version") => {
                println!("perago-runner {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            _ => {
                return Err(format!(
                    "unexpected argument {}\n{USAGE}",
                    arg.to_string_lossy()
                ));
            }
        }
    }
    if command.is_empty() {
        return Err(format!("no task-body command given\n{USAGE}"));
    }
    // Default: the socket beside the volume's bin/ directory this binary was copied into.
    let socket = match socket {
        Some(s) => s,
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent()?.parent().map(|vol| vol.join(SOCKET_NAME)))
            .ok_or("cannot locate the sidecar socket; pass --socket")?,
    };
    Ok(Args {
        socket,
        command,
        persistent: persistent.then_some(limits),
    })
}

/// Longest a stopping, idle runner waits for the sidecar to close the connection.
const DRAIN_BACKSTOP: Duration = Duration::from_secs(30);

pub(crate) fn log(message: &str) {
    eprintln!("perago-runner: {message}");
}

type Writer = Arc<Mutex<UnixStream>>;

fn send(writer: &Writer, message: &RunnerMessage) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    // std's lock, as the runner links nothing beyond its contract (ADR 0013); a writer that
    // panicked mid-line leaves at worst a line the sidecar refuses, so the next one is sent.
    let mut stream = writer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    stream.write_all(&line)
}

pub(crate) enum Event {
    Message(SidecarMessage),
    Closed(String),
    Ended(String),
    /// A persistent body finished the attempt it held.
    BodyDone {
        slot: u32,
        pid: i32,
        execution_id: String,
    },
    /// A persistent body's process ended.
    BodyExited {
        slot: u32,
        pid: i32,
        status: std::io::Result<std::process::ExitStatus>,
    },
}

/// How many processes of this container the kernel's out-of-memory killer has killed, where
/// the container's cgroup tells: `memory.events` (cgroup v2) or `memory.oom_control` (v1).
pub(crate) fn oom_kills() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.events",
        "/sys/fs/cgroup/memory/memory.oom_control",
    ]
    .iter()
    .filter_map(|path| std::fs::read_to_string(path).ok())
    .find_map(|text| {
        text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("oom_kill")).then(|| words.next()?.parse().ok())?
        })
    })
}

/// Runs one connection; returns when it ends.
fn serve(args: &Args, stream: UnixStream, terminating: &AtomicBool) -> std::io::Result<bool> {
    let writer: Writer = Arc::new(Mutex::new(stream.try_clone()?));
    send(
        &writer,
        &RunnerMessage::Hello {
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
        },
    )?;
    let (tx, rx) = mpsc::channel::<Event>();
    let reader_tx = tx.clone();
    thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        loop {
            let mut line = Vec::new();
            let limit = u64::try_from(MAX_LINE_BYTES + 1).unwrap_or(u64::MAX);
            match (&mut reader).take(limit).read_until(b'\n', &mut line) {
                Ok(0) => {
                    let _ =
                        reader_tx.send(Event::Closed("the sidecar closed the connection".into()));
                    return;
                }
                Ok(_) if line.last() != Some(&b'\n') => {
                    let _ = reader_tx.send(Event::Closed("oversized or truncated message".into()));
                    return;
                }
                Ok(_) => match serde_json::from_slice::<SidecarMessage>(&line) {
                    Ok(m) => {
                        if reader_tx.send(Event::Message(m)).is_err() {
                            return;
                        }
                    }
                    Err(e) => log(&format!("ignored an invalid message: {e}")),
                },
                Err(e) => {
                    let _ = reader_tx.send(Event::Closed(format!("reading failed: {e}")));
                    return;
                }
            }
        }
    });

    let mut running: HashMap<String, i32> = HashMap::new();
    let mut bodies = args
        .persistent
        .map(|limits| persistent::Bodies::new(args.command.clone(), limits));
    let mut drained_at: Option<Instant> = None;
    loop {
        if terminating.load(Ordering::SeqCst) {
            // The sidecar may have leased a slot for a poll in flight: its assignment can
            // still come. The sidecar closes the connection once nothing is leased; the
            // backstop only covers a sidecar that never does.
            let since = *drained_at.get_or_insert_with(|| {
                log("stopping: finishing running executions and those the sidecar already took");
                let _ = send(&writer, &RunnerMessage::Draining);
                Instant::now()
            });
            if running.is_empty() && since.elapsed() > DRAIN_BACKSTOP {
                log("the sidecar kept the connection open after draining; exiting");
                return Ok(true);
            }
        }
        let event = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Ok(false),
        };
        match event {
            Event::Message(SidecarMessage::Welcome {
                generation,
                slots,
                protocol,
            }) => {
                log(&format!(
                    "connected: generation {generation}, {slots} slot(s), protocol {protocol}"
                ));
                if let Some(bodies) = bodies.as_mut() {
                    bodies.warm(slots, &tx);
                }
            }
            Event::Message(SidecarMessage::Assign {
                execution_id,
                env,
                slot,
            }) => {
                // The container's log is where a user looks first: name the attempt there.
                let field = |key: &str| env.get(key).map_or("?", String::as_str);
                log(&format!(
                    "slot {slot}: starting execution {execution_id} (workflow {}, task {}, retry {})",
                    field(perago_contract::protocol::env::WORKFLOW_INSTANCE_ID),
                    field(perago_contract::protocol::env::TASK_ID),
                    field(perago_contract::protocol::env::RETRY_COUNT),
                ));
                if let Some(bodies) = bodies.as_mut() {
                    match bodies.assign(slot, &execution_id, env, &tx) {
                        Ok(pid) => {
                            running.insert(execution_id, pid);
                        }
                        Err(error) => {
                            let error = error.to_string();
                            let _ = send(&writer, &not_started(execution_id, error));
                        }
                    }
                    continue;
                }
                let spawned = Command::new(&args.command[0])
                    .args(&args.command[1..])
                    .envs(&env)
                    .process_group(0)
                    .spawn();
                match spawned {
                    Err(e) => {
                        let error = format!("{}: {e}", args.command[0]);
                        let _ = send(&writer, &not_started(execution_id, error));
                    }
                    Ok(mut child) => {
                        let pid = i32::try_from(child.id()).unwrap_or(0);
                        let oom_kills_before = oom_kills();
                        running.insert(execution_id.clone(), pid);
                        let writer = Arc::clone(&writer);
                        let tx = tx.clone();
                        thread::spawn(move || {
                            let waited = child.wait();
                            match &waited {
                                Ok(status) => {
                                    log(&format!("execution {execution_id} ended: {status}"))
                                }
                                Err(e) => log(&format!("execution {execution_id}: {e}")),
                            }
                            let message = match waited {
                                Ok(status) => RunnerMessage::Exited {
                                    execution_id: execution_id.clone(),
                                    code: status.code(),
                                    signal: status.signal(),
                                    error: None,
                                    // A SIGKILL while the container's OOM-kill count rose.
                                    oom_killed: status.signal() == Some(9)
                                        && oom_kills() > oom_kills_before,
                                },
                                Err(e) => not_started(
                                    execution_id.clone(),
                                    format!("waiting for the process failed: {e}"),
                                ),
                            };
                            if let Err(e) = send(&writer, &message) {
                                log(&format!("could not report execution {execution_id}: {e}"));
                            }
                            let _ = tx.send(Event::Ended(execution_id));
                        });
                    }
                }
            }
            Event::Message(SidecarMessage::Cancel { execution_id }) => {
                if let Some(pid) = running.get(&execution_id) {
                    log(&format!(
                        "killing execution {execution_id} on the sidecar's request"
                    ));
                    let _ = killpg(Pid::from_raw(*pid), Signal::SIGKILL);
                }
            }
            Event::Ended(execution_id) => {
                running.remove(&execution_id);
            }
            Event::BodyDone {
                slot,
                pid,
                execution_id,
            } => {
                let reply = bodies
                    .as_mut()
                    .and_then(|b| b.done(slot, pid, execution_id, &tx));
                report(&writer, &mut running, reply);
            }
            Event::BodyExited { slot, pid, status } => {
                let reply = bodies.as_mut().and_then(|b| b.exited(slot, pid, status));
                report(&writer, &mut running, reply);
            }
            Event::Closed(why) => {
                if !running.is_empty() {
                    log(&format!(
                        "{why}; killing {} running execution(s) whose results cannot be reported",
                        running.len()
                    ));
                    for pid in running.values() {
                        let _ = killpg(Pid::from_raw(*pid), Signal::SIGKILL);
                    }
                } else {
                    log(&why);
                }
                return Ok(terminating.load(Ordering::SeqCst));
            }
        }
    }
}

/// The `exited` of an execution that has no exit status: `error` says why.
pub(crate) fn not_started(execution_id: String, error: String) -> RunnerMessage {
    RunnerMessage::Exited {
        execution_id,
        code: None,
        signal: None,
        error: Some(error),
        oom_killed: false,
    }
}

/// Send a persistent body's `exited`, and forget its execution.
fn report(writer: &Writer, running: &mut HashMap<String, i32>, reply: Option<RunnerMessage>) {
    let Some(message) = reply else { return };
    if let RunnerMessage::Exited { execution_id, .. } = &message {
        log(&format!(
            "execution {execution_id} ended in the persistent body"
        ));
        running.remove(execution_id);
    }
    if let Err(e) = send(writer, &message) {
        log(&format!("could not report an execution: {e}"));
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("perago-runner: {e}");
            return ExitCode::from(2);
        }
    };
    let terminating = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(signal, Arc::clone(&terminating)) {
            log(&format!("installing the signal handler failed: {e}"));
            return ExitCode::FAILURE;
        }
    }
    // In a container the runner is process 1 (parent 0) and this never fires; run locally,
    // it stops a runner whose supervisor died instead of leaving it behind.
    let parent = std::os::unix::process::parent_id();
    let mut waiting_since: Option<Instant> = None;
    loop {
        if terminating.load(Ordering::SeqCst) {
            return ExitCode::SUCCESS;
        }
        if std::os::unix::process::parent_id() != parent {
            log("the process that started this runner is gone; exiting");
            return ExitCode::FAILURE;
        }
        match UnixStream::connect(&args.socket) {
            Ok(stream) => {
                waiting_since = None;
                match serve(&args, stream, &terminating) {
                    Ok(true) => return ExitCode::SUCCESS,
                    Ok(false) => {}
                    Err(e) => log(&format!("connection failed: {e}")),
                }
            }
            Err(e) => {
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() < Duration::from_millis(300) {
                    log(&format!(
                        "waiting for the sidecar at {}: {e}",
                        args.socket.display()
                    ));
                }
            }
        }
        thread::sleep(Duration::from_millis(250));
    }
}
