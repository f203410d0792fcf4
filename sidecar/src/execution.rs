//! One execution of the task body: the execution directory, the assignment to the runner,
//! waiting for the process to end, and turning what it left behind into an outcome.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long an assignment waits for the body to connect again after a crash.
const RECONNECT_PATIENCE: Duration = Duration::from_secs(30);

use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::failure::{AttemptError, BodyError, FileError, LocalError};
use crate::input::Schemas;
use crate::runner::{Lease, ProcessEnd, RunnerHub};
use crate::telemetry::Metrics;
use crate::trace::AttemptTrace;
use perago_contract::protocol::{env, files};
use perago_workspace::attempt::AttemptSnapshot;

/// Name of the attempt marker, kept in the execution directory beside (never inside) the
/// workspace the body sees.
pub const MARKER: &str = perago_contract::paths::ATTEMPT_MARKER;
/// Subdirectory of the work volume holding execution directories.
pub const EXECUTIONS: &str = "executions";

/// `[A-Za-z0-9_.=-]` kept, other runs replaced by `_`, `.`/`_` trimmed at both ends.
pub fn safe(text: &str) -> String {
    let keep = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '=' | '-');
    perago_contract::text::sanitized(text, keep, '_', ['.', '_'])
        .unwrap_or_else(|| "unknown".into())
}

/// Where one attempt's files are: a directory of its own, or its slot's (ADR 0049).
pub struct ExecutionDir {
    pub path: PathBuf,
    /// In a slot's directory, the execution id that begins the attempt's file names; `None`
    /// for a directory of the attempt's own.
    execution_id: Option<String>,
}

impl ExecutionDir {
    /// A directory of the attempt's own, created fresh (a collision fails the attempt) and
    /// removed after it: a workspace attempt's, which holds the workspace.
    pub fn create(
        work_dir: &Path,
        snapshot: &AttemptSnapshot,
        execution_id: &str,
        worker_id: &str,
    ) -> Result<Self, FileError> {
        let path = work_dir.join(EXECUTIONS).join(format!(
            "task_id={}-exec={}",
            safe(&snapshot.task_id),
            safe(execution_id)
        ));
        std::fs::create_dir(&path).map_err(|e| FileError::new("creating", &path, e))?;
        let marker = json!({
            "execution_id": execution_id,
            "owner_pid": std::process::id(),
            "owner_token": execution_id,
            "owner_worker_id": worker_id,
            "retry_count": snapshot.retry_count,
            "started_at": now_rfc3339(),
            "task_def_name": snapshot.task_def_name,
            "task_id": snapshot.task_id,
            "workflow_instance_id": snapshot.workflow_instance_id,
        });
        Self::mark(&path, &marker)?;
        Ok(Self {
            path,
            execution_id: None,
        })
    }

    /// The directory of `slot`, made with its marker by the slot's first attempt and kept for
    /// the next ones: a workspace-free attempt's files are its params and what the body
    /// writes, each named after `execution_id`, and emptied after it. Making and removing a
    /// directory for each attempt was two thirds of a workspace-free attempt's file work.
    pub fn in_slot(
        work_dir: &Path,
        slot: u32,
        execution_id: &str,
        worker_id: &str,
    ) -> Result<Self, FileError> {
        let path = work_dir.join(EXECUTIONS).join(format!("slot-{slot:04}"));
        match std::fs::create_dir(&path) {
            Ok(()) => {
                let marker = json!({
                    "owner_pid": std::process::id(),
                    "owner_worker_id": worker_id,
                    "slot": slot,
                    "started_at": now_rfc3339(),
                });
                Self::mark(&path, &marker)?;
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(FileError::new("creating", &path, e)),
        }
        Ok(Self {
            path,
            execution_id: Some(execution_id.to_owned()),
        })
    }

    /// Write the marker into the new directory at `path`, or remove the directory: cleanup
    /// only removes directories that carry the marker.
    fn mark(path: &Path, marker: &Value) -> Result<(), FileError> {
        let marker_path = path.join(MARKER);
        std::fs::write(&marker_path, marker.to_string()).map_err(|e| {
            let _ = std::fs::remove_dir_all(path);
            FileError::new("writing", &marker_path, e)
        })
    }

    /// The path of the attempt's file `name`.
    pub fn file(&self, name: &str) -> PathBuf {
        match &self.execution_id {
            Some(id) => self.path.join(format!("{id}.{name}")),
            None => self.path.join(name),
        }
    }

    /// Write the attempt's params. In a slot's directory they go into the file that held the
    /// slot's last params, renamed: allocating an inode for each attempt was, on a file system
    /// without a journal, where ext4 passes over every inode freed in the last minute to find
    /// one, up to half of the sidecar's CPU (docs/benchmarks.md#the-params-files-inode).
    async fn write_params(&self, text: Vec<u8>) -> std::io::Result<()> {
        let path = self.file(files::PARAMS);
        if text.len() > PARAMS_WRITTEN_IN_PLACE {
            return tokio::task::spawn_blocking(move || std::fs::write(path, text))
                .await
                .map_err(std::io::Error::other)?;
        }
        if self.execution_id.is_some() && rewrite_spare(&self.path.join(PARAMS_SPARE), &text) {
            return std::fs::rename(self.path.join(PARAMS_SPARE), path);
        }
        std::fs::write(path, text)
    }

    /// Remove the attempt's files (a slot's directory: every entry but the marker, what
    /// earlier attempts' stray processes left included) or its directory: in place when it
    /// holds only a few small files (a workspace-free attempt's params and the body's files),
    /// which takes less than the trip to the blocking pool and back; else off the async
    /// runtime (a workspace, or whatever a body left, may hold many files or large ones).
    pub async fn remove(self) {
        if self.holds_only_small_files() {
            self.cleanup();
            return;
        }
        let _ = tokio::task::spawn_blocking(move || self.cleanup()).await;
    }

    fn holds_only_small_files(&self) -> bool {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return false;
        };
        let mut count = 0;
        for entry in entries {
            count += 1;
            let small = entry
                .and_then(|e| e.metadata())
                .is_ok_and(|m| m.is_file() && m.len() <= SMALL_FILE);
            if !small || count > SMALL_DIRECTORY_ENTRIES {
                return false;
            }
        }
        true
    }

    /// Remove the attempt's directory, or empty its slot's, if it carries the marker; errors
    /// are logged, never returned.
    pub fn cleanup(&self) {
        if !self.path.join(MARKER).exists() {
            warn!(dir = %self.path.display(), "{} is not a Perago attempt workspace", self.path.display());
            return;
        }
        let removed = match self.execution_id {
            Some(_) => {
                keep_as_spare(&self.file(files::PARAMS), &self.path.join(PARAMS_SPARE));
                empty(&self.path)
            }
            None => std::fs::remove_dir_all(&self.path),
        };
        if let Err(e) = removed {
            warn!(dir = %self.path.display(), error = %e, "removing the execution directory failed");
        }
    }
}

/// The name, in a slot's directory, of the file that held the slot's last params, kept for
/// the next attempt's.
const PARAMS_SPARE: &str = "params.spare";

/// Keep the attempt's params file as the slot's spare: renamed, if it is still a plain file
/// of one link (the body may have replaced it with anything).
fn keep_as_spare(params: &Path, spare: &Path) {
    let plain = std::fs::symlink_metadata(params).is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.file_type().is_file() && m.nlink() == 1
    });
    if plain {
        let _ = std::fs::rename(params, spare);
    }
}

/// Overwrite the spare with `text`; false (and the spare removed) when it is not a plain
/// file of one link: never follows a symbolic link, never waits on a pipe.
fn rewrite_spare(spare: &Path, text: &[u8]) -> bool {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(spare);
    let written = opened.and_then(|mut file| {
        use std::os::unix::fs::MetadataExt;
        let found = file.metadata()?;
        if !found.is_file() || found.nlink() != 1 {
            return Err(ErrorKind::InvalidInput.into());
        }
        file.write_all(text)?;
        file.set_len(text.len() as u64)
    });
    match written {
        Ok(()) => true,
        Err(e) => {
            if e.kind() != ErrorKind::NotFound {
                let _ = std::fs::remove_file(spare);
            }
            false
        }
    }
}

/// Remove every entry of `dir` but its marker and the params spare.
fn empty(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let is_dir = entry.file_type()?.is_dir();
        if entry.file_name() == MARKER || (entry.file_name() == PARAMS_SPARE && !is_dir) {
            continue;
        }
        if is_dir {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Now in UTC to the second, as Python's `isoformat()` writes an aware UTC time (the marker's
/// readers compare Python Perago's and this sidecar's markers as text).
fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}+00:00",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    )
}

/// What an execution needs besides the snapshot.
pub struct Dispatch<'a> {
    pub hub: &'a RunnerHub,
    pub metrics: &'a Metrics,
    pub schemas: &'a Schemas,
    pub lease: Lease,
    pub execution_id: &'a str,
    pub slot_worker_id: &'a str,
    pub task_name: &'a str,
    /// Longest the process may run (from the TaskDef's `timeoutSeconds`); `None` = no limit.
    pub deadline: Option<Duration>,
    /// Turns true when the sidecar gives up on in-flight work (shutdown grace over).
    pub abandon: watch::Receiver<bool>,
    /// The attempt's phases, for its trace.
    pub trace: &'a AttemptTrace,
}

/// Run the body once on validated params and return its result. `workspace` is the
/// directory the body sees as `PERAGO_WORKSPACE`, if any.
pub async fn run_body(
    run: &Dispatch<'_>,
    snapshot: &AttemptSnapshot,
    dir: &ExecutionDir,
    params: &Value,
    workspace: Option<&Path>,
) -> Result<Value, AttemptError> {
    let params_path = dir.file(files::PARAMS);
    let text = serde_json::to_vec(params).map_err(LocalError::Params)?;
    dir.write_params(text)
        .await
        .map_err(|e| LocalError::from(FileError::new("writing", &params_path, e)))?;
    let mut vars = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        vars.insert(k.to_owned(), v);
    };
    put(env::PARAMS, params_path.display().to_string());
    put(env::RESULT, dir.file(files::RESULT).display().to_string());
    put(env::ERROR, dir.file(files::ERROR).display().to_string());
    put(env::METRICS, dir.file(files::METRICS).display().to_string());
    if let Some(ws) = workspace {
        put(env::WORKSPACE, ws.display().to_string());
    }
    put(env::TASK_NAME, run.task_name.to_owned());
    put(env::TASK_ID, snapshot.task_id.clone());
    put(
        env::WORKFLOW_INSTANCE_ID,
        snapshot.workflow_instance_id.clone(),
    );
    put(env::RETRY_COUNT, snapshot.retry_count.to_string());
    put(env::EXECUTION_ID, run.execution_id.to_owned());
    put(env::WORKER_ID, run.slot_worker_id.to_owned());
    run.trace.mark("body");
    // A traced attempt: the body may continue the trace from its `body` span.
    if let Some(parent) = run.trace.traceparent() {
        put(env::TRACEPARENT, parent);
    }

    let task_id = &snapshot.task_id;
    // A body restarting after a crash gets the assignment once it connects again; the
    // kubelet's first restart comes within seconds.
    let done = run
        .hub
        .assign_when_connected(run.lease, run.execution_id, vars, RECONNECT_PATIENCE)
        .await
        .map_err(|_| BodyError::PipeBroken {
            worker: run.slot_worker_id.to_owned(),
            task_id: task_id.clone(),
        })?;
    info!(
        phase = "body",
        slot = run.lease.slot,
        "assigned to the runner"
    );
    let started = std::time::Instant::now();
    let end = wait(run, done).await;
    run.metrics.observe_phase("body", started);
    let left = BodyFiles::read(dir).await;
    record_application_metrics(run.metrics, &left.metrics);
    let end = match end {
        Waited::Ended(end) => end,
        Waited::Deadline => {
            let task_id = task_id.clone();
            return Err(BodyError::TimedOut { task_id }.into());
        }
        Waited::Abandoned => {
            let task_id = task_id.clone();
            return Err(BodyError::Abandoned { task_id }.into());
        }
    };
    info!(phase = "body", end = ?end, "task body ended");
    let (worker, task_id) = (run.slot_worker_id.to_owned(), task_id.clone());
    Err(match end {
        ProcessEnd::Exited { code } => {
            // A body that failed (an exit code or its own error document) fails its own
            // span; a result is checked in `validate`.
            if code == 0 && matches!(left.error, Ok(None)) {
                run.trace.mark("validate");
            }
            return outcome(run.schemas, left, code);
        }
        ProcessEnd::RunnerLost => BodyError::RunnerLost { worker, task_id },
        ProcessEnd::Signalled {
            oom_killed: true, ..
        } => BodyError::OutOfMemory { worker, task_id },
        ProcessEnd::Signalled { signal, .. } => BodyError::Killed {
            worker,
            task_id,
            signal,
        },
        ProcessEnd::NotStarted { error } => BodyError::NotStarted(error),
    }
    .into())
}

enum Waited {
    Ended(ProcessEnd),
    Deadline,
    Abandoned,
}

async fn wait(run: &Dispatch<'_>, done: tokio::sync::oneshot::Receiver<ProcessEnd>) -> Waited {
    let deadline = async {
        match run.deadline {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let mut abandon = run.abandon.clone();
    let abandoned = async move {
        let _ = abandon.wait_for(|a| *a).await;
    };
    tokio::pin!(done);
    let early = tokio::select! {
        end = &mut done => return Waited::Ended(end.unwrap_or(ProcessEnd::RunnerLost)),
        () = deadline => Waited::Deadline,
        () = abandoned => Waited::Abandoned,
    };
    // Give up on the process: have the runner kill it and wait briefly for the exit so the
    // slot is not reused while it still runs.
    run.hub.cancel(run.execution_id);
    let _ = tokio::time::timeout(Duration::from_secs(10), done).await;
    early
}

/// Params up to this size are written in place, on the async runtime: page-cache writes of
/// this size take microseconds, less than the trip to the blocking pool and back.
const PARAMS_WRITTEN_IN_PLACE: usize = 1 << 20;

/// Files up to this size are read, and removed, in place on the async runtime, as params
/// are written: that takes microseconds, less than the trip to the blocking pool.
const SMALL_FILE: u64 = 1 << 20;
/// An execution directory of at most this many small files is removed in place.
const SMALL_DIRECTORY_ENTRIES: usize = 8;

/// The files a body leaves for the sidecar: read in place when they are small (the usual
/// case), else in one trip to the blocking pool (each trip is two thread wake-ups, which cost
/// more than reading a small file).
struct BodyFiles {
    metrics: Result<Option<Vec<u8>>, AttemptError>,
    error: Result<Option<Vec<u8>>, AttemptError>,
    result: Result<Option<Vec<u8>>, AttemptError>,
}

impl BodyFiles {
    fn read_now(paths: [PathBuf; 3]) -> Self {
        let [metrics, error, result] = paths.map(|path| read_optional(&path));
        Self {
            metrics,
            error,
            result,
        }
    }

    async fn read(dir: &ExecutionDir) -> Self {
        let paths = [files::METRICS, files::ERROR, files::RESULT].map(|name| dir.file(name));
        // Only regular files are read in place: a FIFO or a device the body left in their
        // place would block the thread. What cannot be looked at is read in the pool, where
        // its error is reported.
        let small = paths.iter().all(|path| match std::fs::metadata(path) {
            Ok(meta) => meta.is_file() && meta.len() <= SMALL_FILE,
            Err(e) => e.kind() == ErrorKind::NotFound,
        });
        if small {
            return Self::read_now(paths);
        }
        let read = tokio::task::spawn_blocking(move || Self::read_now(paths)).await;
        read.unwrap_or_else(|e| {
            let stopped = || {
                Err(LocalError::Stopped {
                    what: "reading the body's files",
                    cause: e.to_string(),
                }
                .into())
            };
            Self {
                metrics: stopped(),
                error: stopped(),
                result: stopped(),
            }
        })
    }
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, AttemptError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LocalError::from(FileError::new("reading", path, e)).into()),
    }
}

/// The body's result from its exit status and files: an error document wins, then the exit
/// status, then the result document.
fn outcome(schemas: &Schemas, left: BodyFiles, code: i32) -> Result<Value, AttemptError> {
    if let Some(bytes) = left.error? {
        return Err(error_document(&bytes));
    }
    if code != 0 {
        return Err(BodyError::Exited { code }.into());
    }
    let bytes = left.result?.ok_or(BodyError::NoResult)?;
    let result: Value = serde_json::from_slice(&bytes).map_err(BodyError::ResultNotJson)?;
    schemas.result(&result).map_err(BodyError::ResultSchema)?;
    Ok(result)
}

/// `{"reason": "...", "terminal": true|false}`: the body's own failure, terminal if it says
/// so. A document that breaks these rules fails the attempt saying how.
pub fn error_document(bytes: &[u8]) -> AttemptError {
    let invalid = |why: &str| AttemptError::from(BodyError::ErrorDocument(why.to_owned()));
    let doc: Map<String, Value> = match serde_json::from_slice(bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return invalid("task body wrote an error document that is not a JSON object"),
        Err(e) => {
            return invalid(&format!(
                "task body wrote an error document that is not JSON: {e}"
            ));
        }
    };
    if let Some(key) = doc
        .keys()
        .find(|k| !matches!(k.as_str(), "reason" | "terminal"))
    {
        return invalid(&format!(
            "task body wrote an error document with unknown field {key}"
        ));
    }
    let reason = match doc.get("reason") {
        Some(Value::String(r)) => r.clone(),
        _ => return invalid("reason must be str"),
    };
    match doc.get("terminal") {
        Some(Value::Bool(terminal)) => AttemptError::Declared {
            reason,
            terminal: *terminal,
        },
        None => AttemptError::Declared {
            reason,
            terminal: false,
        },
        Some(_) => {
            invalid("task body wrote an error document whose terminal field is not a boolean")
        }
    }
}

fn record_application_metrics(metrics: &Metrics, file: &Result<Option<Vec<u8>>, AttemptError>) {
    match file {
        Ok(Some(bytes)) => {
            metrics.record_application(&String::from_utf8_lossy(bytes));
        }
        Ok(None) => {}
        Err(e) => warn!(error = %e, "reading the body's metrics file failed"),
    }
}

/// Remove execution directories left by an earlier sidecar of this pod (their attempts can
/// no longer be reported). Only directories carrying the marker are removed.
pub fn sweep(work_dir: &Path) -> std::io::Result<usize> {
    let root = work_dir.join(EXECUTIONS);
    std::fs::create_dir_all(&root)?;
    let mut removed = 0;
    for entry in std::fs::read_dir(&root)? {
        let path = entry?.path();
        if path.join(MARKER).is_file() {
            std::fs::remove_dir_all(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_names() {
        assert_eq!(safe("9b4c"), "9b4c");
        assert_eq!(safe("a/b::c"), "a_b_c");
        assert_eq!(safe("..x.."), "x");
        assert_eq!(safe("///"), "unknown");
    }

    #[test]
    fn error_documents() {
        use crate::outcome::Outcome;
        let outcome = |bytes: &[u8]| Outcome::from(error_document(bytes));
        assert_eq!(
            outcome(br#"{"reason":"bad","terminal":true}"#),
            Outcome::Terminal("bad".into())
        );
        assert_eq!(
            outcome(br#"{"reason":"bad"}"#),
            Outcome::Failed("bad".into())
        );
        assert_eq!(
            outcome(br#"{"reason":1}"#),
            Outcome::failed("reason must be str")
        );
        for (bytes, says) in [
            (&b"nope"[..], "not JSON"),
            (br#"{"reason":"x","extra":1}"#, "unknown field extra"),
            (br#"{"reason":"x","terminal":"yes"}"#, "not a boolean"),
        ] {
            assert!(outcome(bytes).reason().unwrap().contains(says), "{says}");
            assert_eq!(error_document(bytes).label(), "error_document");
        }
    }

    #[test]
    fn the_marker_time_is_written_as_python_writes_it() {
        let now = now_rfc3339();
        assert_eq!(now.len(), "2026-11-29T08:05:09+00:00".len(), "{now}");
        assert!(
            now.ends_with("+00:00") && now.as_bytes()[10] == b'T',
            "{now}"
        );
    }

    fn snapshot() -> AttemptSnapshot {
        AttemptSnapshot::from_task(&json!({
            "workflowInstanceId": "wf", "taskId": "9b4c", "retryCount": 0, "taskDefName": "t",
            "referenceTaskName": "r", "seq": 1, "status": "IN_PROGRESS", "inputData": {}
        }))
        .unwrap()
    }

    fn execution_dir(work: &Path, id: &str) -> ExecutionDir {
        std::fs::create_dir_all(work.join(EXECUTIONS)).unwrap();
        ExecutionDir::create(work, &snapshot(), id, "w").unwrap()
    }

    #[test]
    fn only_a_few_small_plain_files_are_removed_in_place() {
        let work = tempfile::tempdir().unwrap();
        let dir = execution_dir(work.path(), "small");
        std::fs::write(dir.file(files::PARAMS), "{}").unwrap();
        std::fs::write(dir.file(files::RESULT), "{}").unwrap();
        assert!(dir.holds_only_small_files());

        let many = execution_dir(work.path(), "many");
        for i in 0..SMALL_DIRECTORY_ENTRIES {
            std::fs::write(many.file(&format!("f{i}")), "x").unwrap();
        }
        assert!(!many.holds_only_small_files(), "more than 8 entries");

        let workspace = execution_dir(work.path(), "workspace");
        std::fs::create_dir(workspace.file("workspace")).unwrap();
        assert!(!workspace.holds_only_small_files(), "a subdirectory");

        let large = execution_dir(work.path(), "large");
        let file = std::fs::File::create(large.file("big")).unwrap();
        file.set_len(SMALL_FILE + 1).unwrap();
        assert!(!large.holds_only_small_files(), "a file over 1 MiB");

        let fifo = execution_dir(work.path(), "fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(fifo.file(files::RESULT))
            .status()
            .unwrap();
        assert!(made.success());
        assert!(!fifo.holds_only_small_files(), "a FIFO");
    }

    #[tokio::test]
    async fn what_a_body_leaves_in_place_of_a_file_is_reported_not_waited_on() {
        let work = tempfile::tempdir().unwrap();
        let dir = execution_dir(work.path(), "odd");
        std::fs::write(dir.file(files::ERROR), br#"{"reason":"r"}"#).unwrap();
        std::os::unix::fs::symlink(dir.file(files::ERROR), dir.file(files::METRICS)).unwrap();
        std::fs::create_dir(dir.file(files::RESULT)).unwrap();
        let left = BodyFiles::read(&dir).await;
        assert_eq!(left.error.unwrap().unwrap(), br#"{"reason":"r"}"#);
        assert_eq!(
            left.metrics.unwrap().unwrap(),
            br#"{"reason":"r"}"#,
            "a symlink is followed"
        );
        let result = left.result.unwrap_err().to_string();
        assert!(result.contains(files::RESULT), "{result}");
        dir.remove().await;
        assert!(
            !work
                .path()
                .join(EXECUTIONS)
                .join("task_id=9b4c-exec=odd")
                .exists()
        );
    }

    /// A workspace-free attempt's files live in its slot's directory, named after the
    /// attempt: a stray process of an earlier attempt writes only into that attempt's names,
    /// which the next one never reads, and each attempt's end empties the directory but for
    /// its marker (ADR 0049).
    #[tokio::test]
    async fn a_slot_directory_outlives_its_attempts_and_is_emptied_after_each() {
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(work.path().join(EXECUTIONS)).unwrap();
        let first = ExecutionDir::in_slot(work.path(), 2, "e1", "w-0002").unwrap();
        assert!(first.path.ends_with("executions/slot-0002"));
        assert_eq!(first.file(files::RESULT), first.path.join("e1.result.json"));
        let marker: Value =
            serde_json::from_slice(&std::fs::read(first.path.join(MARKER)).unwrap()).unwrap();
        assert_eq!(
            (marker["slot"].as_u64(), marker["owner_worker_id"].as_str()),
            (Some(2), Some("w-0002"))
        );
        std::fs::write(first.file(files::PARAMS), "{}").unwrap();
        std::fs::write(first.file(files::RESULT), "{}").unwrap();
        std::fs::create_dir(first.path.join("scratch")).unwrap();
        std::fs::write(first.path.join("scratch/part"), "x").unwrap();
        let path = first.path.clone();
        first.remove().await;
        let mut left: Vec<_> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [MARKER, PARAMS_SPARE],
            "only the marker and the params' inode are kept"
        );

        let second = ExecutionDir::in_slot(work.path(), 2, "e2", "w-0002").unwrap();
        assert_eq!(second.path, path);
        // The first attempt's process, still running, writes its result late.
        std::fs::write(path.join("e1.result.json"), br#"{"late": true}"#).unwrap();
        let left = BodyFiles::read(&second).await;
        assert!(
            left.result.unwrap().is_none(),
            "the second attempt reads only its own names"
        );
        second.remove().await;
        assert!(
            !path.join("e1.result.json").exists(),
            "what strays leave goes at the next end"
        );
        assert_eq!(
            sweep(work.path()).unwrap(),
            1,
            "a slot's directory carries the marker"
        );
    }

    #[tokio::test]
    async fn a_slots_params_reuse_one_inode_and_never_follow_what_the_body_left() {
        use std::os::unix::fs::MetadataExt;
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(work.path().join(EXECUTIONS)).unwrap();
        let attempt = |id: &str| ExecutionDir::in_slot(work.path(), 1, id, "w-0001").unwrap();
        let first = attempt("e1");
        first
            .write_params(br#"{"n": 12345}"#.to_vec())
            .await
            .unwrap();
        let first_params = first.file(files::PARAMS);
        let inode = std::fs::metadata(&first_params).unwrap().ino();
        first.remove().await;
        // Shorter params in the same inode: nothing of the longer ones is left.
        let second = attempt("e2");
        second.write_params(br#"{"n": 1}"#.to_vec()).await.unwrap();
        let params = second.file(files::PARAMS);
        assert_eq!(std::fs::read(&params).unwrap(), br#"{"n": 1}"#);
        assert_eq!(std::fs::metadata(&params).unwrap().ino(), inode);
        assert!(!first_params.exists());

        // The body replaced its params, or the spare itself, with a link to a file of the
        // sidecar's, a pipe, a second link or a directory: the next params go to a file of
        // their own, and the target is untouched.
        let outside = work.path().join("secret");
        std::fs::write(&outside, "kept").unwrap();
        let hard = work.path().join("hard");
        let kinds = ["symlink", "fifo", "hardlink", "dir"];
        for (n, (replace, at_spare)) in kinds
            .into_iter()
            .flat_map(|k| [(k, false), (k, true)])
            .enumerate()
        {
            let last = attempt("last");
            let planted = if at_spare {
                last.path.join(PARAMS_SPARE)
            } else {
                last.file(files::PARAMS)
            };
            let _ = std::fs::remove_file(&planted);
            match replace {
                "symlink" => std::os::unix::fs::symlink(&outside, &planted).unwrap(),
                "fifo" => {
                    let made = std::process::Command::new("mkfifo").arg(&planted).status();
                    assert!(made.unwrap().success());
                }
                "hardlink" => {
                    std::fs::write(&hard, "kept").unwrap();
                    std::fs::hard_link(&hard, &planted).unwrap();
                }
                _ => std::fs::create_dir(&planted).unwrap(),
            }
            if !at_spare {
                last.remove().await;
            }
            let next = attempt(&format!("n{n}"));
            let text = format!(r#"{{"after": "{replace}"}}"#);
            next.write_params(text.clone().into_bytes()).await.unwrap();
            let written = std::fs::symlink_metadata(next.file(files::PARAMS)).unwrap();
            assert!(written.is_file(), "{replace} at the spare: {at_spare}");
            assert_eq!(
                std::fs::read_to_string(next.file(files::PARAMS)).unwrap(),
                text
            );
            assert_eq!(
                std::fs::read_to_string(&outside).unwrap(),
                "kept",
                "{replace}"
            );
            if replace == "hardlink" {
                assert_eq!(std::fs::read_to_string(&hard).unwrap(), "kept");
            }
            next.remove().await;
        }
    }

    #[test]
    fn directory_lifecycle_and_sweep() {
        let work = tempfile::tempdir().unwrap();
        let snap = snapshot();
        let dir = execution_dir(work.path(), "exec-1");
        assert!(dir.path.ends_with("executions/task_id=9b4c-exec=exec-1"));
        let marker: Value =
            serde_json::from_slice(&std::fs::read(dir.file(MARKER)).unwrap()).unwrap();
        assert_eq!(marker.as_object().unwrap().len(), 9);
        assert!(
            ExecutionDir::create(work.path(), &snap, "exec-1", "w").is_err(),
            "collision fails"
        );
        let other = ExecutionDir::create(work.path(), &snap, "exec-2", "w").unwrap();
        std::fs::create_dir(work.path().join(EXECUTIONS).join("foreign")).unwrap();
        dir.cleanup();
        assert!(!dir.path.exists());
        assert_eq!(sweep(work.path()).unwrap(), 1);
        assert!(!other.path.exists());
        assert!(
            work.path().join(EXECUTIONS).join("foreign").exists(),
            "unmarked directories stay"
        );
    }
}
