//! `kubectl perago logs TASK`: the lines of one attempt, or of every pod of a task, with the
//! kubelet's timestamps. An attempt (`--workflow`, `--task-id`) is found in Conductor; its
//! worker id names the pod that ran it; its lines are the sidecar's JSON lines that name its
//! task id and the body's lines from the runner's `starting execution` line that names the
//! task to the runner's `execution … ended` line (or to the attempt's end in Conductor),
//! merged in time order. Without a selector, the sidecar lines of every pod of the task.
//! `-f` prints what is there and then follows.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use futures_util::io::AsyncBufReadExt;
use futures_util::stream::{self, LocalBoxStream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, LogParams};
use kube::{Api, ResourceExt};
use serde::{Deserialize, Serialize};

use perago_api::PeragoTask;
use perago_api::pod::TASK_LABEL;
use perago_conductor::{ConductorClient, WorkflowTask};

use crate::Failure;
use crate::cluster::{SIDECAR, explained};
use crate::output::Format;

/// The task body's container in every executor pod.
pub const BODY: &str = "body";

/// What the runner writes before each of its own lines in the body's log.
const RUNNER: &str = "perago-runner: ";

/// How far before the attempt's start in Conductor its pod's logs are read (the kubelet's and
/// Conductor's clocks may differ).
const BEFORE_START: SignedDuration = SignedDuration::from_secs(30);

/// How long after its end in Conductor a body line may still be the attempt's (a persistent
/// body's attempts are not closed by a runner line).
const AFTER_END_MS: i64 = 2_000;

#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The PeragoTask, by its name in the namespace.
    pub task: String,
    /// The attempts of this workflow that ran the task (its steps of the task's type).
    #[arg(long, conflicts_with = "task_id")]
    pub workflow: Option<String>,
    /// The attempt with this Conductor task id.
    #[arg(long = "task-id", value_name = "ID")]
    pub task_id: Option<String>,
    /// With --workflow: only the attempt with this retry count (0 is the first).
    #[arg(long, value_name = "N", requires = "workflow")]
    pub attempt: Option<i64>,
    /// Print what is there, then follow: the attempt until its sidecar reports it, the pods
    /// until interrupted.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only lines newer than this: `10m`, `1h` (default: from 30 s before the attempt's
    /// start; without a selector, the whole log).
    #[arg(long, value_parser = crate::duration::parse)]
    pub since: Option<Duration>,
    /// Without a selector: the last N lines of each pod's sidecar.
    #[arg(long, value_name = "N", conflicts_with_all = ["workflow", "task_id"])]
    pub tail: Option<i64>,
}

impl LogsArgs {
    fn selected(&self) -> bool {
        self.workflow.is_some() || self.task_id.is_some()
    }
}

/// One line of a container's log.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogLine {
    /// The kubelet's timestamp of the line (RFC 3339, UTC).
    pub time: String,
    pub pod: String,
    pub container: String,
    /// The attempt the line belongs to, when an attempt was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    pub text: String,
    #[serde(skip)]
    pub at: Option<Timestamp>,
}

/// A line of a log read with `timestamps=true`, split into its time and its text.
pub fn stamped(line: &str) -> (Option<Timestamp>, &str, &str) {
    match line.split_once(' ') {
        Some((time, text)) => match time.parse::<Timestamp>() {
            Ok(at) => (Some(at), time, text),
            Err(_) => (None, "", line),
        },
        None => match line.parse::<Timestamp>() {
            Ok(at) => (Some(at), line, ""),
            Err(_) => (None, "", line),
        },
    }
}

/// The pod a worker id names: Conductor's worker id is the pod's name, a `-` and six
/// characters that tell the sidecar's starts apart (optionally after a prefix and a `-`).
pub fn pod_of_worker<'a>(worker: &str, pods: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let stem = worker_stem(worker);
    pods.into_iter()
        .filter(|pod| stem == *pod || stem.ends_with(&format!("-{pod}")))
        .max_by_key(|pod| pod.len())
}

/// A worker id without its start suffix: the pod's name, when no prefix is set.
pub fn worker_stem(worker: &str) -> &str {
    match worker.rsplit_once('-') {
        Some((stem, suffix))
            if suffix.len() == 6 && suffix.chars().all(|c| c.is_ascii_alphanumeric()) =>
        {
            stem
        }
        _ => worker,
    }
}

/// Whether a sidecar line belongs to the attempt: it names the task id.
pub fn sidecar_line_of(text: &str, task_id: &str) -> bool {
    !task_id.is_empty() && text.contains(task_id)
}

/// Whether a sidecar line says the attempt is over: its result reported, or lost.
pub fn reports(text: &str) -> bool {
    text.contains("\"attempt reported\"") || text.contains("task result LOST")
}

/// The runner's line that starts an attempt's process: its slot and execution id.
fn start_marker<'a>(text: &'a str, task_id: Option<&str>) -> Option<(&'a str, &'a str)> {
    let rest = text.strip_prefix(RUNNER)?.strip_prefix("slot ")?;
    let (slot, rest) = rest.split_once(": starting execution ")?;
    let (execution, rest) = rest.split_once(' ')?;
    match task_id {
        Some(id) if !rest.contains(&format!("task {id},")) => None,
        _ => Some((slot, execution)),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Before,
    Inside,
    /// The runner said the process ended (at that time): the process's last output may
    /// still follow, since the container runtime reads its stdout and the runner's stderr
    /// apart.
    Closing(Option<i64>),
    After,
}

/// How long after the runner's end line the process's own output may still come.
const AFTER_EXIT_MS: i64 = 1_000;

/// Which of a body's lines are an attempt's: from the runner's line that starts the
/// attempt's process to the one that says it ended (and the process's output the runtime
/// wrote just after it), the runner's lines about other executions left out. A later start
/// on the same slot, or a line well after the attempt's end in Conductor, also closes it (a
/// persistent body).
#[derive(Clone, Debug)]
pub struct BodyWindow {
    task_id: String,
    end_ms: Option<i64>,
    slot: String,
    execution: String,
    place: Place,
    /// Another slot started an attempt while this one ran: the body's lines of that time may
    /// be either's.
    pub shared: bool,
}

impl BodyWindow {
    pub fn new(task_id: &str, end_ms: i64) -> Self {
        Self {
            task_id: task_id.to_owned(),
            end_ms: (end_ms > 0).then_some(end_ms),
            slot: String::new(),
            execution: String::new(),
            place: Place::Before,
            shared: false,
        }
    }

    /// Whether the runner's start line of the attempt was seen.
    pub fn marked(&self) -> bool {
        self.place != Place::Before
    }

    /// Whether the line (in log order) is the attempt's.
    pub fn take(&mut self, at: Option<Timestamp>, text: &str) -> bool {
        let ms = at.map(|t| t.as_millisecond());
        match self.place {
            Place::Before => match start_marker(text, Some(&self.task_id)) {
                Some((slot, execution)) => {
                    (self.slot, self.execution) = (slot.to_owned(), execution.to_owned());
                    self.place = Place::Inside;
                    true
                }
                None => false,
            },
            Place::Inside => {
                if let (Some(end), Some(ms)) = (self.end_ms, ms)
                    && ms > end + AFTER_END_MS
                {
                    self.place = Place::After;
                    return false;
                }
                let Some(rest) = text.strip_prefix(RUNNER) else {
                    return true;
                };
                let ours = format!("execution {}", self.execution);
                if rest.starts_with(&format!("{ours} ")) || rest.starts_with(&format!("{ours}:")) {
                    self.place = Place::Closing(ms);
                    return true;
                }
                if let Some((slot, execution)) = start_marker(text, None)
                    && execution != self.execution
                {
                    if slot == self.slot {
                        self.place = Place::After;
                    } else {
                        self.shared = true;
                    }
                    return false;
                }
                rest.contains(&self.execution)
            }
            Place::Closing(ended) => {
                let late = match (ended, ms) {
                    (Some(ended), Some(ms)) => ms > ended + AFTER_EXIT_MS,
                    _ => true,
                };
                if late || start_marker(text, None).is_some() {
                    self.place = Place::After;
                    return false;
                }
                !text.starts_with(RUNNER)
            }
            Place::After => false,
        }
    }
}

/// An attempt's body lines from a whole log (in log order): by the runner's lines, else (the
/// start line was cut off or rotated away) by the attempt's start and end in Conductor.
/// The indices of the lines taken, and whether the runner's lines were found.
pub fn body_lines(
    lines: &[(Option<Timestamp>, String)],
    task_id: &str,
    start_ms: i64,
    end_ms: i64,
) -> (Vec<usize>, BodyWindow) {
    let mut window = BodyWindow::new(task_id, end_ms);
    let mut taken: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, (at, text))| window.take(*at, text))
        .map(|(i, _)| i)
        .collect();
    if window.marked() {
        // The runner writes its lines to stderr, the body mostly to stdout, and the runtime
        // reads the two pipes apart: the body's first lines can reach the log before the
        // runner's start line. Those just before it, after the runner's previous line and not
        // older than the attempt in Conductor, are the attempt's.
        let started = taken.first().copied().unwrap_or(0);
        let early = lines[..started]
            .iter()
            .enumerate()
            .rev()
            .take_while(|(_, (at, text))| {
                !text.starts_with(RUNNER)
                    && start_ms > 0
                    && at.is_some_and(|t| t.as_millisecond() >= start_ms)
            })
            .map(|(i, _)| i)
            .collect::<Vec<_>>();
        taken.splice(0..0, early.into_iter().rev());
        return (taken, window);
    }
    let inside = |at: &Option<Timestamp>| {
        at.is_some_and(|t| {
            let ms = t.as_millisecond();
            start_ms > 0 && ms >= start_ms && (end_ms <= 0 || ms <= end_ms + AFTER_END_MS)
        })
    };
    let by_time = lines
        .iter()
        .enumerate()
        .filter(|(_, (at, text))| inside(at) && !text.starts_with(RUNNER))
        .map(|(i, _)| i)
        .collect();
    (by_time, window)
}

/// Where `logs` reads from.
pub struct Sources<'a> {
    pub client: kube::Client,
    pub namespace: String,
    pub conductor: Option<&'a ConductorClient>,
    /// Why the task's own Conductor could not be found, when none was given.
    pub conductor_unfound: Option<String>,
}

pub async fn run(sources: &Sources<'_>, args: &LogsArgs, format: Format) -> Result<(), Failure> {
    if matches!(format, Format::Yaml) {
        return Err(Failure::Usage(
            "logs prints lines: -o table (the default) or -o json (one JSON object a line)".into(),
        ));
    }
    let ns = &sources.namespace;
    let task = Api::<PeragoTask>::namespaced(sources.client.clone(), ns)
        .get_opt(&args.task)
        .await
        .map_err(|e| explained(e, "get", "peragotasks", ns))?
        .ok_or_else(|| {
            anyhow!(
                "PeragoTask {ns}/{} not found (kubectl get ptask -n {ns})",
                args.task
            )
        })?;
    let pods: Api<Pod> = Api::namespaced(sources.client.clone(), ns);
    let selector = format!("{TASK_LABEL}={}", task.name_any());
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| explained(e, "list", "pods", ns))?
        .items;
    let out = Printer { format };
    if !args.selected() {
        return task_pods(&pods, &task, listed, args, &out).await;
    }
    let conductor = sources.conductor.ok_or_else(|| {
        let why = sources
            .conductor_unfound
            .as_deref()
            .unwrap_or("give --conductor-url or set CONDUCTOR_SERVER_URL");
        Failure::Error(anyhow!("no Conductor to find the attempt in ({why})"))
    })?;
    let attempts = attempts(conductor, &task.spec.task_name, args).await?;
    let mut gone = Vec::new();
    for attempt in &attempts {
        if attempt.worker_id.is_empty() {
            eprintln!(
                "attempt {} of step {} (task {}) is {}: no pod has taken it yet",
                attempt.retry_count,
                attempt.reference_task_name,
                attempt.task_id,
                attempt.status.as_str()
            );
            continue;
        }
        let names = listed.iter().filter_map(|p| p.metadata.name.as_deref());
        let name = pod_of_worker(&attempt.worker_id, names)
            .unwrap_or_else(|| worker_stem(&attempt.worker_id))
            .to_owned();
        let pod = match listed
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(&name))
        {
            Some(pod) => Some(pod.clone()),
            None => pods
                .get_opt(&name)
                .await
                .map_err(|e| explained(e, "get", "pods", ns))?,
        };
        let Some(pod) = pod else {
            gone.push(format!(
                "pod {name}, which ran attempt {} of step {} (task {}), is gone: its lines are \
                 no longer readable from the cluster; look for them in the cluster's log store \
                 (namespace {ns}, pod {name}, containers {SIDECAR} and {BODY})",
                attempt.retry_count, attempt.reference_task_name, attempt.task_id
            ));
            continue;
        };
        attempt_logs(&pods, &pod, attempt, args, &out).await?;
    }
    match gone.as_slice() {
        [] => Ok(()),
        [one] if attempts.len() == 1 => Err(Failure::Error(anyhow!("{one}"))),
        many => {
            for g in many {
                eprintln!("error: {g}");
            }
            Err(Failure::Flagged)
        }
    }
}

/// The attempts the selector names, in Conductor's order.
async fn attempts(
    conductor: &ConductorClient,
    task_type: &str,
    args: &LogsArgs,
) -> anyhow::Result<Vec<WorkflowTask>> {
    if let Some(id) = &args.task_id {
        let found = conductor.task(id).await.map_err(|e| {
            if e.is_not_found() {
                anyhow!("Conductor has no task {id} ({})", conductor.base_url())
            } else {
                anyhow!("{e} (Conductor {})", conductor.base_url())
            }
        })?;
        let attempt = WorkflowTask::deserialize(found)
            .with_context(|| format!("reading task {id} from Conductor"))?;
        if attempt.task_type != task_type {
            return Err(anyhow!(
                "task {id} is a step of task type {:?}, not of this PeragoTask's {task_type:?}",
                attempt.task_type
            ));
        }
        return Ok(vec![attempt]);
    }
    let Some(id) = &args.workflow else {
        return Ok(Vec::new());
    };
    let workflow = conductor.workflow(id).await.map_err(|e| {
        if e.is_not_found() {
            anyhow!("Conductor has no workflow {id} ({})", conductor.base_url())
        } else {
            anyhow!("{e} (Conductor {})", conductor.base_url())
        }
    })?;
    let ours: Vec<WorkflowTask> = workflow
        .tasks
        .into_iter()
        .filter(|t| t.task_type == task_type)
        .collect();
    if ours.is_empty() {
        return Err(anyhow!(
            "workflow {id} has no step of task type {task_type} (yet)"
        ));
    }
    let Some(n) = args.attempt else {
        return Ok(ours);
    };
    let retries: BTreeSet<i64> = ours.iter().map(|t| t.retry_count).collect();
    let picked: Vec<WorkflowTask> = ours.into_iter().filter(|t| t.retry_count == n).collect();
    if picked.is_empty() {
        let have: Vec<String> = retries.iter().map(ToString::to_string).collect();
        return Err(anyhow!(
            "workflow {id} has no attempt {n} of task type {task_type} (it has {})",
            have.join(", ")
        ));
    }
    Ok(picked)
}

/// How the lines are printed: `TIME  LABEL  TEXT`, or one JSON object a line.
struct Printer {
    format: Format,
}

impl Printer {
    fn line(&self, line: &LogLine, label: &str, width: usize) {
        match self.format {
            Format::Json => {
                if let Ok(json) = serde_json::to_string(line) {
                    println!("{json}");
                }
            }
            _ => {
                let time = line
                    .at
                    .map_or_else(|| line.time.clone(), |t| format!("{t:.3}"));
                println!("{time}  {label:<width$}  {}", line.text);
            }
        }
    }

    /// A heading or a note, in table output only (JSON lines carry the attempt's task id).
    fn note(&self, text: &str) {
        match self.format {
            Format::Json => eprintln!("{text}"),
            _ => println!("{text}"),
        }
    }
}

/// The label of a container's lines next to an attempt's.
fn label(container: &str) -> &str {
    if container == SIDECAR {
        "sidecar"
    } else {
        container
    }
}

/// How a container has restarted: its previous instance's log is read too.
fn restarted(pod: &Pod, container: &str) -> bool {
    let status = pod.status.as_ref();
    status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .chain(status.and_then(|s| s.init_container_statuses.as_ref()))
        .flatten()
        .any(|c| c.name == container && c.restart_count > 0)
}

/// The parameters of a read from `since` (or the whole log), with timestamps.
fn params(container: &str, since: Since, tail: Option<i64>, follow: bool) -> LogParams {
    let mut params = LogParams {
        container: Some(container.to_owned()),
        timestamps: true,
        tail_lines: tail,
        follow,
        ..LogParams::default()
    };
    match since {
        Since::All => {}
        Since::Seconds(s) => params.since_seconds = Some(s),
        Since::Time(t) => params.since_time = Some(t),
    }
    params
}

#[derive(Clone, Copy, Debug)]
enum Since {
    All,
    Seconds(i64),
    Time(Timestamp),
}

impl Since {
    fn of(flag: Option<Duration>, otherwise: Self) -> Self {
        match flag {
            Some(d) => Self::Seconds(i64::try_from(d.as_secs()).unwrap_or(i64::MAX).max(1)),
            None => otherwise,
        }
    }
}

/// A container's log lines (its previous instance's first, when it restarted), timestamped.
async fn read(
    pods: &Api<Pod>,
    pod: &Pod,
    container: &str,
    since: Since,
    tail: Option<i64>,
) -> Result<Vec<(Option<Timestamp>, String)>, kube::Error> {
    let name = pod.name_any();
    let mut text = String::new();
    if restarted(pod, container) {
        let mut previous = params(container, since, tail, false);
        previous.previous = true;
        // The previous instance's log may be gone already; the current one is what counts.
        if let Ok(log) = pods.logs(&name, &previous).await {
            text = log;
        }
    }
    text += &pods
        .logs(&name, &params(container, since, tail, false))
        .await?;
    Ok(text
        .lines()
        .map(|l| {
            let (at, time, rest) = stamped(l);
            let rest = if time.is_empty() { l } else { rest };
            (at, rest.to_owned())
        })
        .collect())
}

fn stamp(at: Option<Timestamp>) -> String {
    at.map(|t| t.to_string()).unwrap_or_default()
}

/// Why a container's log could not be read, in the user's terms.
fn unreadable(e: kube::Error, pod: &str, container: &str, ns: &str) -> anyhow::Error {
    match &e {
        kube::Error::Api(s) if s.code == 403 => explained(e, "get", "pods/log", ns),
        _ => anyhow!("reading the log of {pod} container {container}: {e}"),
    }
}

/// One attempt's lines: the sidecar's that name it and the body's, in time order; then, with
/// `-f` and the attempt not yet reported, what comes until it is.
async fn attempt_logs(
    pods: &Api<Pod>,
    pod: &Pod,
    attempt: &WorkflowTask,
    args: &LogsArgs,
    out: &Printer,
) -> Result<(), Failure> {
    let ns = pods_namespace(pod);
    let name = pod.name_any();
    let task_id = attempt.task_id.as_str();
    out.note(&format!(
        "== attempt {} of step {} (task {}): {} on pod {name}",
        attempt.retry_count,
        attempt.reference_task_name,
        task_id,
        if attempt.status.as_str().is_empty() {
            "?"
        } else {
            attempt.status.as_str()
        }
    ));
    let from = Timestamp::from_millisecond(attempt.start_time)
        .ok()
        .filter(|_| attempt.start_time > 0)
        .and_then(|t| t.checked_sub(BEFORE_START).ok())
        .map_or(Since::All, Since::Time);
    let since = Since::of(args.since, from);
    let sidecar = read(pods, pod, SIDECAR, since, None)
        .await
        .map_err(|e| unreadable(e, &name, SIDECAR, &ns))?;
    let body = read(pods, pod, BODY, since, None)
        .await
        .map_err(|e| unreadable(e, &name, BODY, &ns))?;
    let line = |container: &str, (at, text): &(Option<Timestamp>, String)| {
        // The sidecar's own time of a line, when it has one: the kubelet's is when the runtime
        // read it, which under load trails by more than the body's lines do.
        let at = if container == SIDECAR {
            emitted(text).or(*at)
        } else {
            *at
        };
        LogLine {
            time: stamp(at),
            pod: name.clone(),
            container: container.to_owned(),
            task_id: Some(task_id.to_owned()),
            text: text.clone(),
            at,
        }
    };
    let mut lines: Vec<LogLine> = sidecar
        .iter()
        .filter(|(_, text)| sidecar_line_of(text, task_id))
        .map(|l| line(SIDECAR, l))
        .collect();
    let reported = lines.iter().any(|l| reports(&l.text));
    let (taken, mut window) = body_lines(&body, task_id, attempt.start_time, attempt.end_time);
    lines.extend(taken.iter().map(|&i| line(BODY, &body[i])));
    lines.sort_by_key(|l| l.at);
    for l in &lines {
        out.line(l, label(&l.container), 7);
    }
    if !window.marked() && !taken.is_empty() {
        out.note(&format!(
            "-- the runner's start line of this attempt is not in the {BODY} log read: its {BODY} \
             lines are those between the attempt's start and end in Conductor"
        ));
    }
    if window.shared {
        out.note(&format!(
            "-- other attempts ran on this pod at the same time: some {BODY} lines above may be \
             theirs (a body's output does not name its attempt)"
        ));
    }
    if !args.follow || reported || attempt.status.is_terminal() {
        return Ok(());
    }
    // Follow from the last line read; what was printed is not printed again.
    let last = |lines: &[(Option<Timestamp>, String)]| lines.iter().rev().find_map(|(at, _)| *at);
    let mut streams = Vec::new();
    for (container, seen) in [(SIDECAR, last(&sidecar)), (BODY, last(&body))] {
        let since = seen
            .and_then(|t| t.checked_sub(SignedDuration::from_secs(1)).ok())
            .map_or(since, Since::Time);
        let stream = pods
            .log_stream(&name, &params(container, since, None, true))
            .await
            .map_err(|e| unreadable(e, &name, container, &ns))?;
        let lines = stream
            .lines()
            .filter_map(move |l| async move { l.ok() })
            .filter(move |l| {
                let newer = stamped(l).0.is_some_and(|at| seen.is_none_or(|s| at > s));
                async move { newer }
            })
            .map(move |l| (container, l));
        streams.push(lines.boxed_local());
    }
    let mut merged = stream::select_all(streams);
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut held = Held::default();
    loop {
        // Wake for the next line, for the oldest held line to come of age, or at the end.
        let wake = [held.due(), deadline].into_iter().flatten().min();
        let next = match wake {
            Some(w) => match tokio::time::timeout_at(w, merged.next()).await {
                Ok(next) => next,
                Err(_) if deadline.is_some_and(|d| d <= tokio::time::Instant::now()) => break,
                Err(_) => {
                    for l in held.ready(tokio::time::Instant::now()) {
                        out.line(&l, label(&l.container), 7);
                    }
                    continue;
                }
            },
            None => merged.next().await,
        };
        let Some((container, raw)) = next else { break };
        let (at, _, text) = stamped(&raw);
        let keep = if container == SIDECAR {
            sidecar_line_of(text, task_id)
        } else {
            window.take(at, text)
        };
        if !keep {
            continue;
        }
        if container == SIDECAR && reports(text) && deadline.is_none() {
            // The body's last lines may still be on their way.
            deadline = Some(tokio::time::Instant::now() + Duration::from_secs(2));
        }
        let now = tokio::time::Instant::now();
        held.push(now, line(container, &(at, text.to_owned())));
        for l in held.ready(now) {
            out.line(&l, label(&l.container), 7);
        }
    }
    for l in held.rest() {
        out.line(&l, label(&l.container), 7);
    }
    Ok(())
}

/// How long a followed line is held before it is printed: the kubelet streams each container's
/// log on its own, and under load the body's trails the sidecar's by a moment, so lines
/// printed as they arrive would put a body's last output after the sidecar's report of it.
const FOLLOW_HOLD: Duration = Duration::from_secs(1);

/// Followed lines not printed yet, in time order, each with when it arrived: printed once held
/// [`FOLLOW_HOLD`], and what is left at the end.
#[derive(Default)]
struct Held(Vec<(tokio::time::Instant, LogLine)>);

impl Held {
    fn push(&mut self, arrived: tokio::time::Instant, line: LogLine) {
        self.0.push((arrived, line));
        self.0.sort_by_key(|(_, l)| l.at);
    }

    /// When the first held line in time order comes of age: the lines after it wait for it,
    /// so nothing can be printed before.
    fn due(&self) -> Option<tokio::time::Instant> {
        self.0.first().map(|(arrived, _)| *arrived + FOLLOW_HOLD)
    }

    /// The lines to print at `now`, in time order: those before the first line in time order
    /// that has not been held long enough, since a line held that long may still be
    /// preceded by one on its way.
    fn ready(&mut self, now: tokio::time::Instant) -> Vec<LogLine> {
        let young = (self.0.iter()).position(|(arrived, _)| *arrived + FOLLOW_HOLD > now);
        let ready = young.unwrap_or(self.0.len());
        self.0.drain(..ready).map(|(_, l)| l).collect()
    }

    fn rest(self) -> Vec<LogLine> {
        self.0.into_iter().map(|(_, l)| l).collect()
    }
}

/// The `timestamp` of a sidecar's JSON log line.
fn emitted(text: &str) -> Option<Timestamp> {
    #[derive(Deserialize)]
    struct Stamped {
        timestamp: Timestamp,
    }
    serde_json::from_str::<Stamped>(text)
        .ok()
        .map(|s| s.timestamp)
}

fn pods_namespace(pod: &Pod) -> String {
    pod.namespace().unwrap_or_default()
}

/// Every pod's sidecar lines, merged in time order and labelled by pod; then, with `-f`,
/// what comes, until interrupted.
async fn task_pods(
    pods: &Api<Pod>,
    task: &PeragoTask,
    mut listed: Vec<Pod>,
    args: &LogsArgs,
    out: &Printer,
) -> Result<(), Failure> {
    let ns = task.namespace().unwrap_or_default();
    if listed.is_empty() {
        return Err(Failure::Error(anyhow!(
            "PeragoTask {ns}/{} has no pods now (suspended, or scaled to zero): the lines of the \
             pods it had are no longer readable from the cluster; look for them in the cluster's \
             log store (namespace {ns}, pods {}-…, container {SIDECAR})",
            task.name_any(),
            perago_api::task::object_name(&task.name_any())
        )));
    }
    listed.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let width = listed.iter().map(|p| p.name_any().len()).max().unwrap_or(0);
    let since = Since::of(args.since, Since::All);
    let mut lines = Vec::new();
    let mut last = Vec::new();
    let mut unread = Vec::new();
    for pod in &listed {
        let name = pod.name_any();
        match read(pods, pod, SIDECAR, since, args.tail).await {
            Ok(read) => {
                last.push((pod, read.iter().rev().find_map(|(at, _)| *at)));
                lines.extend(read.into_iter().map(|(at, text)| LogLine {
                    time: stamp(at),
                    pod: name.clone(),
                    container: SIDECAR.to_owned(),
                    task_id: None,
                    text,
                    at,
                }));
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                return Err(Failure::Error(explained(
                    kube::Error::Api(s),
                    "get",
                    "pods/log",
                    &ns,
                )));
            }
            Err(e) => unread.push(format!("{name}: {e}")),
        }
    }
    lines.sort_by_key(|l| l.at);
    for l in &lines {
        out.line(l, &l.pod, width);
    }
    for u in &unread {
        eprintln!("not read: the {SIDECAR} log of {u}");
    }
    if !args.follow {
        return if unread.is_empty() {
            Ok(())
        } else {
            Err(Failure::Flagged)
        };
    }
    let mut streams = Vec::new();
    for (pod, seen) in last {
        let name = pod.name_any();
        let from = seen
            .and_then(|t| t.checked_sub(SignedDuration::from_secs(1)).ok())
            .map_or(since, Since::Time);
        let stream = pods
            .log_stream(&name, &params(SIDECAR, from, None, true))
            .await
            .map_err(|e| unreadable(e, &name, SIDECAR, &ns))?;
        let lines = stream
            .lines()
            .filter_map(move |l| async move { l.ok() })
            .filter(move |l| {
                let newer = stamped(l).0.is_some_and(|at| seen.is_none_or(|s| at > s));
                async move { newer }
            })
            .map(move |l| (name.clone(), l));
        streams.push(lines.boxed_local());
    }
    let mut merged: LocalBoxStream<'_, (String, String)> =
        stream::select_all(streams).boxed_local();
    while let Some((pod, raw)) = merged.next().await {
        let (at, time, text) = stamped(&raw);
        let line = LogLine {
            time: time.to_owned(),
            pod: pod.clone(),
            container: SIDECAR.to_owned(),
            task_id: None,
            text: text.to_owned(),
            at,
        };
        out.line(&line, &pod, width);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Option<Timestamp> {
        Some(s.parse().unwrap())
    }

    /// A followed line is printed once held a moment, in time order: a body's last line that
    /// arrives after the sidecar's later report still comes first.
    #[test]
    fn followed_lines_are_printed_in_time_order_once_held() {
        let line = |container: &str, time: &str, text: &str| LogLine {
            time: time.into(),
            pod: "p".into(),
            container: container.into(),
            task_id: None,
            text: text.into(),
            at: at(time),
        };
        let t0 = tokio::time::Instant::now();
        let mut held = Held::default();
        held.push(
            t0,
            line(SIDECAR, "2026-12-07T15:26:24.420Z", "attempt reported"),
        );
        assert!(held.ready(t0).is_empty(), "held");
        assert_eq!(held.due(), Some(t0 + FOLLOW_HOLD));
        let late = t0 + Duration::from_millis(300);
        held.push(late, line(BODY, "2026-12-07T15:26:24.123Z", "body: done"));
        assert!(
            held.ready(t0 + FOLLOW_HOLD).is_empty(),
            "the report waits for the earlier line held less long"
        );
        assert_eq!(
            held.due(),
            Some(late + FOLLOW_HOLD),
            "woken when that line is of age"
        );
        let texts = |lines: Vec<LogLine>| lines.into_iter().map(|l| l.text).collect::<Vec<_>>();
        assert_eq!(
            texts(held.ready(late + FOLLOW_HOLD)),
            ["body: done", "attempt reported"]
        );
        held.push(late, line(BODY, "2026-12-07T15:26:25.000Z", "after"));
        assert_eq!(texts(held.rest()), ["after"], "the end prints what is held");
    }

    #[test]
    fn a_timestamped_line_splits_into_its_time_and_text() {
        let (t, time, text) = stamped("2026-12-06T18:42:23.412345678Z body: hello world");
        assert_eq!(
            (time, text),
            ("2026-12-06T18:42:23.412345678Z", "body: hello world")
        );
        assert_eq!(format!("{:.3}", t.unwrap()), "2026-12-06T18:42:23.412Z");
        assert_eq!(stamped("no time here").2, "no time here");
        assert!(stamped("2026-12-06T18:42:23Z").0.is_some());
    }

    #[test]
    fn a_worker_id_names_its_pod() {
        let pods = [
            "steady-perago-694467ccf-k9f9n",
            "steady-perago-694467ccf-5l9h4",
        ];
        assert_eq!(
            pod_of_worker("steady-perago-694467ccf-k9f9n-4385bb", pods),
            Some("steady-perago-694467ccf-k9f9n")
        );
        assert_eq!(
            pod_of_worker("feat-steady-perago-694467ccf-5l9h4-2cd83a", pods),
            Some("steady-perago-694467ccf-5l9h4")
        );
        assert_eq!(pod_of_worker("other-pod-abcdef", pods), None);
        assert_eq!(
            worker_stem("steady-perago-694467ccf-k9f9n-4385bb"),
            "steady-perago-694467ccf-k9f9n"
        );
        assert_eq!(worker_stem("plain"), "plain");
    }

    fn body(lines: &[(&str, &str)]) -> Vec<(Option<Timestamp>, String)> {
        lines
            .iter()
            .map(|(t, l)| (at(t), (*l).to_owned()))
            .collect()
    }

    #[test]
    fn the_body_lines_of_an_attempt_run_from_the_runners_start_line_to_its_end_line() {
        let log = body(&[
            (
                "2026-12-06T18:00:00Z",
                "perago-runner: connected: generation 1, 2 slot(s), protocol 1",
            ),
            (
                "2026-12-06T18:00:01Z",
                "perago-runner: slot 0: starting execution e1 (workflow w, task t-1, retry 0)",
            ),
            ("2026-12-06T18:00:01.5Z", "body: other attempt"),
            (
                "2026-12-06T18:00:01.6Z",
                "perago-runner: execution e1 ended: exit status: 0",
            ),
            (
                "2026-12-06T18:00:02Z",
                "perago-runner: slot 0: starting execution e2 (workflow w, task t-2, retry 1)",
            ),
            ("2026-12-06T18:00:03Z", "body: params {\"n\": 3}"),
            ("2026-12-06T18:00:04Z", "body: done"),
            (
                "2026-12-06T18:00:05Z",
                "perago-runner: execution e2 ended: exit status: 0",
            ),
            ("2026-12-06T18:00:07Z", "body: later"),
        ]);
        let (taken, window) = body_lines(&log, "t-2", 0, 0);
        assert_eq!(taken, [4, 5, 6, 7]);
        assert!(window.marked() && !window.shared);
    }

    #[test]
    fn a_sidecar_line_carries_its_own_time() {
        let line = r#"{"timestamp":"2026-12-07T00:07:58.412112Z","level":"INFO","message":"attempt started"}"#;
        assert_eq!(emitted(line), at("2026-12-07T00:07:58.412112Z"));
        assert_eq!(emitted("body: hello"), None);
    }

    #[test]
    fn the_bodys_first_output_may_come_before_the_runners_start_line() {
        let log = body(&[
            (
                "2026-12-06T18:00:00.900Z",
                "perago-runner: execution e0 ended: exit status: 0",
            ),
            ("2026-12-06T18:00:00.950Z", "body: e0's last line"),
            ("2026-12-06T18:00:01.013Z", "body: hello"),
            ("2026-12-06T18:00:01.014Z", "body: token"),
            (
                "2026-12-06T18:00:01.023Z",
                "perago-runner: slot 1: starting execution e1 (workflow w, task t-1, retry 0)",
            ),
            (
                "2026-12-06T18:00:01.023Z",
                "perago-runner: execution e1 ended: exit status: 0",
            ),
        ]);
        // Conductor started the attempt at 18:00:01.000.
        let start = at("2026-12-06T18:00:01.000Z").unwrap().as_millisecond();
        let (taken, window) = body_lines(&log, "t-1", start, 0);
        assert_eq!(taken, [2, 3, 4, 5]);
        assert!(window.marked());
        // Without the attempt's start in Conductor, nothing before the runner's line is taken.
        assert_eq!(body_lines(&log, "t-1", 0, 0).0, [4, 5]);
    }

    #[test]
    fn the_processs_last_output_may_follow_the_runners_end_line() {
        let log = body(&[
            (
                "2026-12-06T18:00:01.000Z",
                "perago-runner: slot 1: starting execution e1 (workflow w, task t-1, retry 0)",
            ),
            (
                "2026-12-06T18:00:01.006Z",
                "perago-runner: execution e1 ended: exit status: 0",
            ),
            ("2026-12-06T18:00:01.007Z", "body: hello"),
            ("2026-12-06T18:00:01.008Z", "body: done"),
            (
                "2026-12-06T18:00:01.009Z",
                "perago-runner: connected: generation 2, 1 slot(s), protocol 1",
            ),
            ("2026-12-06T18:00:03.000Z", "body: much later"),
        ]);
        let (taken, _) = body_lines(&log, "t-1", 0, 0);
        assert_eq!(taken, [0, 1, 2, 3]);
        let next = body(&[
            (
                "2026-12-06T18:00:01.000Z",
                "perago-runner: slot 1: starting execution e1 (workflow w, task t-1, retry 0)",
            ),
            (
                "2026-12-06T18:00:01.006Z",
                "perago-runner: execution e1 ended: exit status: 0",
            ),
            (
                "2026-12-06T18:00:01.100Z",
                "perago-runner: slot 1: starting execution e2 (workflow w, task t-2, retry 0)",
            ),
            ("2026-12-06T18:00:01.200Z", "body: the next one's"),
        ]);
        let (taken, _) = body_lines(&next, "t-1", 0, 0);
        assert_eq!(taken, [0, 1]);
    }

    #[test]
    fn another_slot_marks_the_lines_shared_and_the_same_slot_ends_a_persistent_attempt() {
        let log = body(&[
            (
                "2026-12-06T18:00:01Z",
                "perago-runner: slot 0: starting execution e1 (workflow w, task t-1, retry 0)",
            ),
            ("2026-12-06T18:00:02Z", "one"),
            (
                "2026-12-06T18:00:03Z",
                "perago-runner: slot 1: starting execution e2 (workflow w, task t-2, retry 0)",
            ),
            ("2026-12-06T18:00:04Z", "two"),
            (
                "2026-12-06T18:00:05Z",
                "perago-runner: slot 0: starting execution e3 (workflow w, task t-3, retry 0)",
            ),
            ("2026-12-06T18:00:06Z", "three"),
        ]);
        let (taken, window) = body_lines(&log, "t-1", 0, 0);
        assert_eq!(taken, [0, 1, 3]);
        assert!(window.shared);
        // Closed by the attempt's end in Conductor, with two seconds' grace.
        let end = "2026-12-06T18:00:02Z"
            .parse::<Timestamp>()
            .unwrap()
            .as_millisecond();
        let (taken, _) = body_lines(&log, "t-1", 0, end);
        assert_eq!(taken, [0, 1, 3]);
        let end = "2026-12-06T18:00:01Z"
            .parse::<Timestamp>()
            .unwrap()
            .as_millisecond();
        let (taken, _) = body_lines(&log, "t-1", 0, end);
        assert_eq!(taken, [0, 1]);
    }

    #[test]
    fn without_the_runners_start_line_the_attempts_times_decide() {
        let log = body(&[
            ("2026-12-06T18:00:00Z", "before"),
            ("2026-12-06T18:00:02Z", "inside"),
            (
                "2026-12-06T18:00:03Z",
                "perago-runner: execution e9 ended: exit status: 0",
            ),
            ("2026-12-06T18:00:09Z", "after"),
        ]);
        let ms = |s: &str| s.parse::<Timestamp>().unwrap().as_millisecond();
        let (taken, window) = body_lines(
            &log,
            "t-9",
            ms("2026-12-06T18:00:01Z"),
            ms("2026-12-06T18:00:04Z"),
        );
        assert_eq!(taken, [1]);
        assert!(!window.marked());
    }

    #[test]
    fn sidecar_lines_name_the_task_and_say_when_it_is_reported() {
        let line = r#"{"timestamp":"2026-12-06T18:00:05Z","level":"INFO","phase":"report","status":"COMPLETED","message":"attempt reported","span":{"task_id":"t-2","workflow_instance_id":"w"}}"#;
        assert!(sidecar_line_of(line, "t-2") && reports(line));
        assert!(!sidecar_line_of(line, "t-3"));
        assert!(!sidecar_line_of(line, ""));
    }
}
