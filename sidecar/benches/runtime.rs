//! Workspace-free throughput of the sidecar against the real Conductor, beside a bare
//! poll-and-complete loop and Python Perago 0.6.1 (`perago start`, from PyPI) on the same
//! server, and the resident memory of each. Prints figures and ratios; asserts nothing. Run
//! with `make bench`.
//!
//! CPU per task is each process tree's user + system time over the run (sidecar, runner and
//! the bodies; supervisor, broker and executors), divided by the tasks it completed.
//!
//! Python Perago's own task module also runs unchanged as the body (`python -m perago_k8s
//! run`, the repository's `python/` package): one process per slot for many attempts
//! (persistent bodies), and, on fewer tasks, one process per attempt. A compiled persistent
//! body (this executable, run with `--compiled-persistent-body`) shows what the sidecar and the
//! runner cost when the body costs next to nothing; it runs once more with the work volume on
//! a tmpfs (`/dev/shm`, as `workVolume.emptyDir.medium: Memory`), which shows what the disk's
//! inode work costs each attempt's files.
//!
//! Every stack is watched the same way, through Conductor's workflow reads, so that watching
//! costs none of them CPU; the bare loop is measured in every run, since the server's speed
//! drifts over a benchmark as its database grows.
//!
//! PERAGO_BENCH_TASKS (default 300) sets the tasks per run, PERAGO_BENCH_RUNS (default 3) the
//! runs of each stack beside the other, whose spread is printed. `PERAGO_E2E_STORAGE=s3` runs
//! Conductor on PostgreSQL instead of SQLite, which serializes every write.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use perago_api::{contract, manifest, taskdef};
use perago_e2e::measure::ProcessTree;
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::{Selection, Services};
use serde_json::{Value, json};

const TASK: &str = "bench.noop";
const BODY: &str = "printf '{\"total\": 1}' > \"$PERAGO_RESULT\"\n";

fn spec(slots: u32) -> perago_api::PeragoTaskSpec {
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: bench}}
spec:
  taskName: {TASK}
  ownerEmail: bench@example.com
  paramsSchema: {{type: object, properties: {{n: {{type: integer}}}}}}
  resultSchema: {{type: object, properties: {{total: {{type: integer}}, pid: {{type: integer}}}}, required: [total]}}
  controls: {{retry: {{count: 0}}, timeout: {{responseSeconds: 60}}}}
  executor: {{body: {{image: body, command: [sh]}}, slots: {slots}}}
"#
    );
    manifest::parse(&yaml).unwrap().remove(0).task.spec
}

/// Start `n` one-step workflows, 8 at a time; returns their ids.
async fn fill(api: &Arc<ConductorApi>, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    let mut pending = tokio::task::JoinSet::new();
    for i in 0..n {
        if pending.len() >= 8 {
            ids.push(pending.join_next().await.unwrap().unwrap());
        }
        let api = Arc::clone(api);
        pending.spawn(async move {
            let id = api
                .call(
                    reqwest::Method::POST,
                    &format!("/workflow/{TASK}.wf"),
                    Some(&json!({})),
                )
                .await;
            let _ = i;
            id.as_str().unwrap().to_owned()
        });
    }
    while let Some(id) = pending.join_next().await {
        ids.push(id.unwrap());
    }
    ids
}

struct Figures {
    seconds: f64,
    /// Tasks that ended COMPLETED (the rest are counted in `lost`).
    completed: usize,
    lost: usize,
    cpu_seconds: f64,
    latencies_ms: Vec<f64>,
    /// First poll to last completion, from Conductor's task timestamps: the same clock for
    /// every runtime, whatever its start-up time.
    server_seconds: f64,
}

impl Figures {
    fn rate(&self, n: usize) -> f64 {
        n as f64 / self.seconds
    }

    fn server_rate(&self) -> f64 {
        self.completed as f64 / self.server_seconds
    }

    fn cpu_ms_per_task(&self) -> f64 {
        1000.0 * self.cpu_seconds / self.completed.max(1) as f64
    }

    fn percentile(&self, p: f64) -> f64 {
        let mut v = self.latencies_ms.clone();
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    }

    fn line(&self, label: &str, n: usize) -> String {
        format!(
            "{label:<26} {n} tasks in {:>6.2} s = {:>7.1} tasks/s; poll→COMPLETED p50 {:>6.1} ms, p95 {:>6.1} ms",
            self.seconds,
            self.rate(n),
            self.percentile(0.5),
            self.percentile(0.95)
        )
    }
}

/// Poll → COMPLETED per completed task (ms) and the span from the first poll to the last
/// completion (s), from Conductor's own start and end times.
async fn server_times(api: &ConductorApi, ids: &[String]) -> (Vec<f64>, f64) {
    let mut latencies = Vec::new();
    let (mut first, mut last) = (f64::MAX, 0f64);
    for id in ids {
        let wf = api.workflow(id).await;
        if wf["status"] != "COMPLETED" {
            continue;
        }
        let t = &wf["tasks"][0];
        let (start, end) = (
            t["startTime"].as_f64().unwrap(),
            t["endTime"].as_f64().unwrap(),
        );
        latencies.push(end - start);
        first = first.min(start);
        last = last.max(end);
    }
    (latencies, (last - first) / 1000.0)
}

async fn figures(api: &ConductorApi, ids: &[String], seconds: f64, cpu_seconds: f64) -> Figures {
    let (latencies_ms, server_seconds) = server_times(api, ids).await;
    Figures {
        seconds,
        completed: latencies_ms.len(),
        lost: ids.len() - latencies_ms.len(),
        cpu_seconds,
        latencies_ms,
        server_seconds,
    }
}

/// CPU seconds (user + system) of this process, without its children: during a bare loop,
/// what its client spends polling and completing, an upper bound since the process's other
/// tasks (the servers' log readers) run beside it.
fn own_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    // utime and stime, in ticks of 10 ms.
    (11..=12)
        .filter_map(|i| fields.get(i)?.parse::<f64>().ok())
        .sum::<f64>()
        / 100.0
}

/// The ceiling: `workers` loops that batch-poll one task and complete it at once. Its CPU is
/// its client's ([`own_cpu_seconds`]): what two HTTP calls per task cost at the least.
async fn bare_loop(api: &Arc<ConductorApi>, n: usize, workers: usize) -> Figures {
    let ids = fill(api, n).await;
    let done = Arc::new(AtomicUsize::new(0));
    let cpu_before = own_cpu_seconds();
    let started = Instant::now();
    let mut loops = tokio::task::JoinSet::new();
    for w in 0..workers {
        let api = Arc::clone(api);
        let done = Arc::clone(&done);
        loops.spawn(async move {
            let worker = format!("bare-{w}");
            while done.load(Ordering::SeqCst) < n {
                let tasks = api
                    .call(
                        reqwest::Method::GET,
                        &format!("/tasks/poll/batch/{TASK}?workerid={worker}&count=1&timeout=100"),
                        None,
                    )
                    .await;
                for t in tasks.as_array().cloned().unwrap_or_default() {
                    let result = json!({"workflowInstanceId": t["workflowInstanceId"], "taskId": t["taskId"],
                        "workerId": worker, "status": "COMPLETED", "outputData": {"result": {"total": 1}}});
                    api.call(reqwest::Method::POST, "/tasks", Some(&result)).await;
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
    while loops.join_next().await.is_some() {}
    let seconds = started.elapsed().as_secs_f64();
    figures(api, &ids, seconds, own_cpu_seconds() - cpu_before).await
}

fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn runner_pid(pod: &Pod) -> u32 {
    pod.log()
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "runner connected")
        .find_map(|v| v["runner_pid"].as_u64())
        .and_then(|p| u32::try_from(p).ok())
        .unwrap()
}

/// Attempts the pod reported, and how many of them did not complete.
async fn reported(pod: &Pod) -> (usize, usize) {
    let metrics = pod.metrics().await;
    let mut all = (0, 0);
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("perago_sidecar_attempts_total{"))
    {
        let count: usize = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        all.0 += count;
        if !line.contains("COMPLETED") {
            all.1 += count;
        }
    }
    all
}

/// Watch the workflows `ids` until every one has ended, or none has for 10 s (a task a stack
/// left behind is then counted as lost rather than waited for until Conductor times it out);
/// returns when the last end was seen. Every stack is watched this way, through Conductor,
/// so that watching costs none of them CPU: one workflow read per pass (they end roughly in
/// start order), a full pass only when the oldest stalls. `each_pass` samples the stack.
async fn watch_until_ended(
    api: &ConductorApi,
    ids: &[String],
    mut each_pass: impl FnMut(),
) -> Instant {
    let mut pending: std::collections::VecDeque<&String> = ids.iter().collect();
    let (mut progress, mut last_end) = (Instant::now(), Instant::now());
    while let Some(oldest) = pending.front() {
        if api.workflow(oldest).await["status"] != "RUNNING" {
            pending.pop_front();
            (progress, last_end) = (Instant::now(), Instant::now());
            continue;
        }
        if progress.elapsed() > Duration::from_secs(10) {
            let before = pending.len();
            let mut still = std::collections::VecDeque::new();
            for id in pending {
                if api.workflow(id).await["status"] == "RUNNING" {
                    still.push_back(id);
                }
            }
            pending = still;
            if pending.len() == before {
                break;
            }
            progress = Instant::now();
        }
        each_pass();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    last_end
}

/// The pod reported `n` attempts, every one COMPLETED.
async fn all_completed(pod: &Pod, n: usize) {
    let (done, failed) = reported(pod).await;
    assert!(
        done >= n && failed == 0,
        "{done} attempts reported, {failed} of them not COMPLETED, of {n}:\n{}",
        pod.log()
    );
}

struct PodRun {
    figures: Figures,
    sidecar_peak_mb: f64,
    runner_peak_mb: f64,
    /// Recorded for bodies under the runner (zero otherwise).
    cpu_ms_per_task: CpuSplit,
    /// Mean milliseconds per attempt of each phase the sidecar times, from its own
    /// `perago_sidecar_phase_duration_seconds` (recorded for bodies under the runner).
    phases_ms: Vec<(String, f64)>,
}

/// Each phase's mean duration in milliseconds, from the sums and counts of the sidecar's
/// phase histogram in `metrics` (Prometheus' text format).
fn phase_means_ms(metrics: &str) -> Vec<(String, f64)> {
    const FAMILY: &str = "perago_sidecar_phase_duration_seconds";
    let series = |suffix: &str| -> BTreeMap<String, f64> {
        let prefix = format!("{FAMILY}_{suffix}{{phase=\"");
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|l| {
                let (phase, value) = l.split_once("\"} ")?;
                Some((phase.to_owned(), value.trim().parse().ok()?))
            })
            .collect()
    };
    let (sums, counts) = (series("sum"), series("count"));
    sums.into_iter()
        .filter_map(|(phase, sum)| {
            let count = *counts.get(&phase).filter(|c| **c > 0.0)?;
            Some((phase, 1000.0 * sum / count))
        })
        .collect()
}

async fn start_pod(bins: &PodBinaries, url: &str, slots: u32) -> Pod {
    let contract = serde_json::to_value(contract::render(&spec(slots)).unwrap()).unwrap();
    Pod::start(
        bins,
        url,
        &contract,
        BODY,
        &[("PERAGO_LOG", "warn,perago_sidecar::runner=info")],
    )
    .await
}

async fn sidecar_run(api: &Arc<ConductorApi>, bins: &PodBinaries, n: usize, slots: u32) -> PodRun {
    let ids = fill(api, n).await;
    let pod = start_pod(bins, &api.base, slots).await;
    let started = Instant::now();
    let tree = ProcessTree::new(pod.pid() as u32);
    let cpu_before = tree.cpu_seconds();
    let (sidecar, runner) = (pod.pid() as u32, runner_pid(&pod));
    let profile = profiler("sidecar", &[sidecar, runner], slots);
    let (mut sidecar_peak, mut runner_peak) = (0f64, 0f64);
    let last_end = watch_until_ended(api, &ids, || {
        sidecar_peak = sidecar_peak.max(rss_mb(sidecar));
        runner_peak = runner_peak.max(rss_mb(runner));
    })
    .await;
    let seconds = (last_end - started).as_secs_f64();
    let cpu = tree.cpu_seconds() - cpu_before;
    all_completed(&pod, n).await;
    if let Some(perf) = profile {
        signal_group(perf.id().unwrap(), nix::sys::signal::Signal::SIGINT);
        let _ = perf.wait_with_output().await;
    }
    pod.stop().await;
    PodRun {
        figures: figures(api, &ids, seconds, cpu).await,
        sidecar_peak_mb: sidecar_peak,
        runner_peak_mb: runner_peak,
        cpu_ms_per_task: CpuSplit::default(),
        phases_ms: Vec::new(),
    }
}

/// With PERAGO_BENCH_PERF=<dir>, the first 4-slot run of one stack is recorded by `perf record`
/// (call graphs from DWARF, so the `profiling` build's line tables are enough) into
/// <dir>/<stack>.perf.data: the sidecar with a fresh `sh` per attempt (`sidecar`, the default)
/// or with persistent Python bodies (`persistent`, sidecar, runner and bodies), as
/// PERAGO_BENCH_PERF_STACK says. `cargo bench --profile profiling -p perago-sidecar --bench
/// runtime`, then `perf report -i`.
fn profiler(stack: &str, pids: &[u32], slots: u32) -> Option<tokio::process::Child> {
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let dir = std::env::var_os("PERAGO_BENCH_PERF")?;
    let wanted = std::env::var("PERAGO_BENCH_PERF_STACK").unwrap_or_else(|_| "sidecar".into());
    if slots != 4 || stack != wanted || TAKEN.swap(true, Ordering::SeqCst) {
        return None;
    }
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let out = std::path::Path::new(&dir).join(format!("{stack}.perf.data"));
    let child = tokio::process::Command::new("perf")
        .args(["record", "-F", "999", "--call-graph", "dwarf", "-p"])
        .arg(pids.join(","))
        .arg("-o")
        .arg(&out)
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("perf record starts (PERAGO_BENCH_PERF is set)");
    eprintln!("recording {} with perf", out.display());
    Some(child)
}

/// Resident memory of every process in process group `pgid` (MB).
fn group_rss_mb(pgid: u32) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // Field 5 of /proc/<pid>/stat, after the parenthesised command name.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = stat.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pgid)
        })
        .map(rss_mb)
        .sum()
}

/// The same task in Python Perago 0.6.1: a Pydantic model in, a Pydantic model out.
const PYTHON_MODULE: &str = r#"
from typing import Optional
from pydantic import BaseModel
from perago import task

class Params(BaseModel):
    n: Optional[int] = None

class Result(BaseModel):
    total: int

@task(name="bench.noop", owner_email="bench@example.com", description="")
def noop(params: Params) -> Result:
    return Result(total=1)
"#;

/// `perago start benchmod -j <slots>` in its own process group (supervisor, broker, executors).
fn start_python(url: &str, dir: &std::path::Path, slots: u32) -> tokio::process::Child {
    use std::process::Stdio;
    let python = perago_e2e::process::obtain("perago-python").unwrap();
    std::fs::write(dir.join("benchmod.py"), PYTHON_MODULE).unwrap();
    tokio::process::Command::new(python)
        .args([
            "-c",
            "from perago.cli import app; app()",
            "start",
            "benchmod",
            "-j",
        ])
        .arg(slots.to_string())
        .env("PYTHONPATH", dir)
        .env("CONDUCTOR_SERVER_URL", url)
        .env("PERAGO_WORKSPACE_ROOT", dir.join("workspaces"))
        .env("PERAGO_LOG_ROOT", dir.join("logs"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn signal_group(pgid: u32, signal: nix::sys::signal::Signal) {
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(pgid).unwrap());
    let _ = nix::sys::signal::killpg(pgid, signal);
}

/// Kill the group, then let Conductor drop its long polls: Conductor holds a dead worker's
/// poll open for up to 5 s and would hand it the next run's tasks, to time out unreported.
async fn stop_group(pgid: u32) {
    signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
    tokio::time::sleep(Duration::from_secs(6)).await;
}

/// How long a stack stopped to fill its queue waits before the filling starts: longer than
/// Conductor holds the poll it may have left in flight (both sides ask for at most 100 ms), so
/// that no task goes to a stopped worker and counts the filling as its latency. (Without it,
/// the tasks a poll in flight took waited out the filling, over a second, and the run's rate
/// fell by half when a stop came during a poll.)
const POLLS_IN_FLIGHT_END: Duration = Duration::from_secs(1);

/// Until the tree used less than 50 ms of CPU in the last second (at least 2 s, at most 30).
async fn wait_idle(tree: &ProcessTree) {
    let started = Instant::now();
    let mut last = tree.cpu_seconds();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = tree.cpu_seconds();
        let idle = now - last < 0.05;
        last = now;
        if (idle && started.elapsed() >= Duration::from_secs(2))
            || started.elapsed() > Duration::from_secs(30)
        {
            return;
        }
    }
}

struct PythonRun {
    figures: Figures,
    peak_mb: f64,
}

async fn python_run(api: &Arc<ConductorApi>, n: usize, slots: u32) -> PythonRun {
    let dir = tempfile::tempdir().unwrap();
    // Python's start-up (imports in the supervisor, the broker and each executor) costs
    // seconds of CPU that no task causes: start it on an empty queue, wait until it idles,
    // and hold it stopped while the queue fills.
    let child = start_python(&api.base, dir.path(), slots);
    let pgid = child.id().unwrap();
    let tree = ProcessTree::new(pgid);
    wait_idle(&tree).await;
    signal_group(pgid, nix::sys::signal::Signal::SIGSTOP);
    tokio::time::sleep(POLLS_IN_FLIGHT_END).await;
    let ids = fill(api, n).await;
    let cpu_before = tree.cpu_seconds();
    signal_group(pgid, nix::sys::signal::Signal::SIGCONT);
    let started = Instant::now();
    let (mut peak, mut cpu) = (0f64, 0f64);
    let last_end = watch_until_ended(api, &ids, || {
        peak = peak.max(group_rss_mb(pgid));
        cpu = tree.cpu_seconds() - cpu_before;
    })
    .await;
    cpu = cpu.max(tree.cpu_seconds() - cpu_before);
    let seconds = (last_end - started).as_secs_f64();
    peak = peak.max(group_rss_mb(pgid));
    stop_group(pgid).await;
    PythonRun {
        figures: figures(api, &ids, seconds, cpu).await,
        peak_mb: peak,
    }
}

/// A body served by `perago-runner` under the sidecar, beside the fresh `sh` per attempt.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Body {
    /// The Python module above, `python -m perago_k8s run benchmod:noop` (the repository's
    /// `python/` package), one process per attempt.
    PythonPerAttempt,
    /// The same, one process per slot (runner protocol 2).
    PythonPersistent,
    /// [`compiled_body`], one process per slot: what the sidecar and the runner cost with a
    /// body that costs next to nothing.
    CompiledPersistent,
}

/// `body` in a pod. The pod starts on an empty queue and is measured once it idles, so
/// persistent bodies' start (the Python imports) is not counted, as Python Perago's start-up
/// is not; the queue is then filled with the sidecar stopped.
async fn body_run(
    api: &Arc<ConductorApi>,
    bins: &PodBinaries,
    n: usize,
    slots: u32,
    body: Body,
    work: Work,
) -> PodRun {
    let dir = tempfile::tempdir().unwrap();
    // The work volume on a tmpfs, as `workVolume.emptyDir.medium: Memory` gives a pod.
    let in_memory = match work {
        Work::Disk => None,
        Work::Memory => Some(
            tempfile::Builder::new()
                .prefix("perago-work-")
                .tempdir_in("/dev/shm")
                .expect("a tmpfs at /dev/shm"),
        ),
    };
    let work_dir = in_memory.as_ref().map(|d| d.path().join("work"));
    std::fs::write(dir.path().join("benchmod.py"), PYTHON_MODULE).unwrap();
    let python = perago_e2e::process::obtain("perago-python").unwrap();
    let package = concat!(env!("CARGO_MANIFEST_DIR"), "/../python");
    let path = std::env::join_paths([std::path::Path::new(package), dir.path()]).unwrap();
    let contract = serde_json::to_value(contract::render(&spec(slots)).unwrap()).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut env = vec![
        ("PERAGO_LOG", "warn,perago_sidecar::runner=info"),
        ("PERAGO_PYTHON", python.to_str().unwrap()),
        ("PYTHONPATH", path.to_str().unwrap()),
        ("PERAGO_BENCH_EXE", exe.to_str().unwrap()),
    ];
    if let Some(work_dir) = &work_dir {
        env.push(("PERAGO_WORK_DIR", work_dir.to_str().unwrap()));
    }
    if body != Body::PythonPerAttempt {
        env.push(("PERAGO_BODY_MODE", "persistent"));
    }
    let command = if body == Body::CompiledPersistent {
        format!(r#"exec "$PERAGO_BENCH_EXE" {COMPILED_BODY}"#)
    } else {
        r#"exec "$PERAGO_PYTHON" -m perago_k8s run benchmod:noop"#.to_owned()
    };
    let pod = Pod::start(bins, &api.base, &contract, &command, &env).await;
    let tree = ProcessTree::new(pod.pid() as u32);
    wait_idle(&tree).await;
    // The queue is filled while the sidecar is stopped, as for the other stacks: a pod
    // polling a queue being filled would measure the filling.
    let sidecar = nix::unistd::Pid::from_raw(pod.pid());
    nix::sys::signal::kill(sidecar, nix::sys::signal::Signal::SIGSTOP).unwrap();
    tokio::time::sleep(POLLS_IN_FLIGHT_END).await;
    let ids = fill(api, n).await;
    let runner = runner_pid(&pod);
    let cpu_before = tree.cpu_seconds_by_member();
    let profile = match body {
        Body::PythonPersistent => profiler("persistent", &tree.members(), slots),
        Body::CompiledPersistent => profiler("compiled", &tree.members(), slots),
        Body::PythonPerAttempt => None,
    };
    nix::sys::signal::kill(sidecar, nix::sys::signal::Signal::SIGCONT).unwrap();
    let started = Instant::now();
    let mut sidecar_peak = 0f64;
    let last_end = watch_until_ended(api, &ids, || {
        sidecar_peak = sidecar_peak.max(rss_mb(pod.pid() as u32));
    })
    .await;
    let seconds = (last_end - started).as_secs_f64();
    // Each process's share: the sidecar (the tree's root), the runner, the bodies (the rest,
    // with the per-attempt processes the runner reaped counted as the runner's).
    let mut split = CpuSplit::default();
    for (pid, after) in tree.cpu_seconds_by_member() {
        let used = after - cpu_before.get(&pid).copied().unwrap_or(0.0);
        match pid {
            p if p == pod.pid() as u32 => split.sidecar += used,
            p if p == runner => split.runner += used,
            _ => split.bodies += used,
        }
    }
    let cpu = split.sidecar + split.runner + split.bodies;
    if let Some(perf) = profile {
        signal_group(perf.id().unwrap(), nix::sys::signal::Signal::SIGINT);
        let _ = perf.wait_with_output().await;
    }
    all_completed(&pod, n).await;
    let phases_ms = phase_means_ms(&pod.metrics().await);
    pod.stop().await;
    let figures = figures(api, &ids, seconds, cpu).await;
    let per_task = 1000.0 / figures.completed.max(1) as f64;
    PodRun {
        figures,
        sidecar_peak_mb: sidecar_peak,
        // Not reported for these runs.
        runner_peak_mb: 0.0,
        cpu_ms_per_task: CpuSplit {
            sidecar: split.sidecar * per_task,
            runner: split.runner * per_task,
            bodies: split.bodies * per_task,
        },
        phases_ms,
    }
}

/// CPU of a pod's processes, apart.
#[derive(Default)]
struct CpuSplit {
    sidecar: f64,
    runner: f64,
    bodies: f64,
}

/// Where a pod's work volume (its execution directories) lives.
#[derive(Clone, Copy)]
enum Work {
    /// The machine's disk, as an emptyDir's default medium.
    Disk,
    /// A tmpfs, as `medium: Memory`.
    Memory,
}

/// A change measured against the sidecar before it (`PERAGO_BENCH_BASELINE_SIDECAR`, the path
/// of its binary; `PERAGO_BENCH_SIDECAR` in place of this build's), on a noisy machine: the compiled persistent body at 1 and 4 slots, each run
/// of this build beside one of the baseline, in alternating order, and the ratios of each
/// pair. A ratio is the worst of the runs, with its spread.
async fn paired(
    api: &Arc<ConductorApi>,
    bins: &PodBinaries,
    baseline: &PodBinaries,
    n: usize,
    runs: usize,
) {
    for slots in [1, 4] {
        let (mut cpu, mut rate) = (vec![], vec![]);
        for run in 1..=runs {
            let mut pair = [(bins, None), (baseline, None)];
            if run % 2 == 0 {
                pair.reverse();
            }
            for (binaries, figures) in &mut pair {
                let body = Body::CompiledPersistent;
                *figures = Some(body_run(api, binaries, n, slots, body, Work::Disk).await);
            }
            if run % 2 == 0 {
                pair.reverse();
            }
            let [(_, Some(this)), (_, Some(before))] = pair else {
                unreachable!("both sides ran")
            };
            let side = |r: &PodRun| {
                format!(
                    "{:.1} tasks/s, p50 {:.1} ms, CPU {:.2} ms/task (sidecar {:.2}), sidecar peak {:.1} MB",
                    r.figures.server_rate(),
                    r.figures.percentile(0.5),
                    r.figures.cpu_ms_per_task(),
                    r.cpu_ms_per_task.sidecar,
                    r.sidecar_peak_mb
                )
            };
            println!(
                "run {run}, {slots} slot(s): this build {} | baseline {}",
                side(&this),
                side(&before)
            );
            cpu.push(this.figures.cpu_ms_per_task() / before.figures.cpu_ms_per_task());
            rate.push(this.figures.server_rate() / before.figures.server_rate());
        }
        let spread = |v: &[f64]| {
            let (lo, hi) = (
                v.iter().copied().fold(f64::INFINITY, f64::min),
                v.iter().copied().fold(0.0, f64::max),
            );
            format!("×{lo:.2}–{hi:.2}")
        };
        println!(
            "{slots} slot(s), this build against the baseline over {runs} pairs: CPU per task {}, throughput {}",
            spread(&cpu),
            spread(&rate)
        );
    }
}

/// The argument that makes this benchmark's executable the compiled persistent body.
const COMPILED_BODY: &str = "--compiled-persistent-body";

/// The compiled persistent body (runner protocol 2): for each attempt the runner sends on the
/// socket that is its standard input, read and parse the params and write the result, as the
/// Python body does, then answer `done`. Runs until the runner closes the socket.
fn compiled_body() -> std::io::Result<()> {
    use perago_contract::protocol::env;
    use perago_contract::protocol::persistent::{FromBody, ToBody};
    use std::io::{BufRead, Write};
    use std::os::fd::AsFd;

    let socket =
        std::os::unix::net::UnixStream::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let mut answers = socket.try_clone()?;
    for line in std::io::BufReader::new(socket).lines() {
        let ToBody::Attempt {
            execution_id,
            env: vars,
        } = serde_json::from_str(&line?)?;
        let path = |name: &str| {
            vars.get(name)
                .ok_or_else(|| std::io::Error::other(format!("{name} is not set")))
        };
        let params: Value = serde_json::from_slice(&std::fs::read(path(env::PARAMS)?)?)?;
        let total = params["n"].as_i64().unwrap_or(1);
        std::fs::write(path(env::RESULT)?, json!({ "total": total }).to_string())?;
        let mut done = serde_json::to_vec(&FromBody::Done { execution_id })?;
        done.push(b'\n');
        answers.write_all(&done)?;
    }
    Ok(())
}

/// One run of a persistent body against the anchors of the same run, for the goals of
/// docs/benchmarks.md#the-goals-run-by-run.
struct Goals {
    slots: u32,
    /// Throughput against the bare loop's at as many workers.
    to_bare: f64,
    p50_at_most_python: bool,
    /// The stack's CPU per task as a share of Python Perago's.
    cpu_share: f64,
    /// The same, less what the bare loop's client spends on the two Conductor calls.
    beyond_the_calls: f64,
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some(COMPILED_BODY) {
        if let Err(e) = compiled_body() {
            eprintln!("the compiled body failed: {e}");
            std::process::exit(1);
        }
        return;
    }
    tokio::runtime::Runtime::new().unwrap().block_on(bench());
}

async fn bench() {
    let n: usize = std::env::var("PERAGO_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let services = Services::start(Selection {
        conductor: true,
        ..Selection::default()
    })
    .await
    .unwrap();
    let api = Arc::new(ConductorApi::new(&services.conductor().api_url));
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let def = taskdef::render(&spec(1)).unwrap();
    api.call(
        reqwest::Method::POST,
        "/metadata/taskdefs",
        Some(&json!([def])),
    )
    .await;
    let wf = json!({"name": format!("{TASK}.wf"), "version": 1, "schemaVersion": 2, "ownerEmail": "bench@example.com",
        "tasks": [{"name": TASK, "taskReferenceName": "step", "type": "SIMPLE", "inputParameters": {"params": {"n": 1}}}]});
    api.call(
        reqwest::Method::PUT,
        "/metadata/workflow",
        Some(&json!([wf])),
    )
    .await;

    // Warm the server (JIT, connection pools) before measuring anything.
    eprintln!("warming up");
    bare_loop(&api, 50, 4).await;
    eprintln!("measuring idle memory");

    let idle = start_pod(&bins, &api.base, 4).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (idle_sidecar, idle_runner) = (rss_mb(idle.pid() as u32), rss_mb(runner_pid(&idle)));
    idle.stop().await;

    let python_idle = {
        let dir = tempfile::tempdir().unwrap();
        let child = start_python(&api.base, dir.path(), 4);
        let pgid = child.id().unwrap();
        tokio::time::sleep(Duration::from_secs(8)).await;
        let idle = group_rss_mb(pgid);
        stop_group(pgid).await;
        idle
    };

    let runs: usize = std::env::var("PERAGO_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    if let Some(baseline) = std::env::var_os("PERAGO_BENCH_BASELINE_SIDECAR") {
        let binary = |sidecar: std::ffi::OsString| PodBinaries {
            sidecar: sidecar.into(),
            ..bins.clone()
        };
        // Another binary in place of this build's: the release's static one, say.
        let this = std::env::var_os("PERAGO_BENCH_SIDECAR").map_or_else(|| bins.clone(), binary);
        paired(&api, &this, &binary(baseline), n, runs).await;
        return;
    }
    // The same task served by one long-lived Python process that speaks the runner protocol
    // itself (docs/examples/long_lived_body.py), in place of a fresh `sh` per attempt.
    let long_lived = PodBinaries {
        runner: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/examples/long_lived_body.py"
        )
        .into(),
        ..bins.clone()
    };
    let (mut ones, mut fours, mut py1s, mut py4s) = (vec![], vec![], vec![], vec![]);
    let (mut bare1s, mut bare4s, mut lived) = (vec![], vec![], vec![]);
    // A Python body per attempt pays the interpreter and its imports each time (seconds of
    // CPU): fewer tasks.
    let cold_n = (n / 8).max(4);
    let (mut warm1s, mut warm4s, mut colds) = (vec![], vec![], vec![]);
    let (mut compiled1s, mut compiled4s, mut compiled4_memory) = (vec![], vec![], vec![]);
    // The bare loop runs in every run, just before the persistent bodies it is the ceiling
    // for: the server's speed drifts over a benchmark as its database grows.
    for run in 1..=runs {
        eprintln!("run {run}/{runs}: sidecar, 1 slot");
        ones.push(sidecar_run(&api, &bins, n, 1).await);
        eprintln!("run {run}/{runs}: sidecar, 4 slots");
        fours.push(sidecar_run(&api, &bins, n, 4).await);
        eprintln!("run {run}/{runs}: sidecar, 4 slots, a long-lived body");
        lived.push(sidecar_run(&api, &long_lived, n, 4).await);
        eprintln!("run {run}/{runs}: bare loop, 1 worker");
        bare1s.push(bare_loop(&api, n, 1).await);
        eprintln!("run {run}/{runs}: sidecar, a persistent Python body, 1 slot");
        warm1s.push(body_run(&api, &bins, n, 1, Body::PythonPersistent, Work::Disk).await);
        eprintln!("run {run}/{runs}: sidecar, a persistent compiled body, 1 slot");
        compiled1s.push(body_run(&api, &bins, n, 1, Body::CompiledPersistent, Work::Disk).await);
        eprintln!("run {run}/{runs}: bare loop, 4 workers");
        bare4s.push(bare_loop(&api, n, 4).await);
        eprintln!("run {run}/{runs}: sidecar, a persistent Python body, 4 slots");
        warm4s.push(body_run(&api, &bins, n, 4, Body::PythonPersistent, Work::Disk).await);
        eprintln!("run {run}/{runs}: sidecar, a persistent compiled body, 4 slots");
        compiled4s.push(body_run(&api, &bins, n, 4, Body::CompiledPersistent, Work::Disk).await);
        eprintln!(
            "run {run}/{runs}: sidecar, a persistent compiled body, 4 slots, work volume in memory"
        );
        compiled4_memory
            .push(body_run(&api, &bins, n, 4, Body::CompiledPersistent, Work::Memory).await);
        eprintln!("run {run}/{runs}: sidecar, a Python body per attempt, 4 slots ({cold_n} tasks)");
        colds.push(body_run(&api, &bins, cold_n, 4, Body::PythonPerAttempt, Work::Disk).await);
        eprintln!("run {run}/{runs}: Python Perago, -j 1");
        py1s.push(python_run(&api, n, 1).await);
        eprintln!("run {run}/{runs}: Python Perago, -j 4");
        py4s.push(python_run(&api, n, 4).await);
    }
    let (bare1, bare4) = (&bare1s[0], &bare4s[0]);

    println!(
        "Conductor {} ({}) on this machine, {n} tasks per run, {runs} runs",
        services.conductor().version,
        match perago_e2e::storage::Storage::from_env() {
            Ok(perago_e2e::storage::Storage::PostgresS3) => "PostgreSQL",
            _ => "SQLite",
        }
    );
    println!("{}", bare1.line("bare loop, 1 worker", n));
    println!("{}", bare4.line("bare loop, 4 workers", n));
    let (one, four) = (&ones[0], &fours[0]);
    println!("{}", one.figures.line("sidecar, 1 slot (run 1)", n));
    println!("{}", four.figures.line("sidecar, 4 slots (run 1)", n));
    let ratio1 = one.figures.rate(n) / bare1.rate(n);
    let ratio4 = four.figures.rate(n) / bare4.rate(n);
    println!(
        "ratio sidecar/bare: 1 slot {:.0}%, 4 slots {:.0}% (target ≥ 80% at 4: {})",
        ratio1 * 100.0,
        ratio4 * 100.0,
        verdict(ratio4 >= 0.8)
    );
    let sidecar_peak = fours.iter().map(|r| r.sidecar_peak_mb).fold(0.0, f64::max);
    println!(
        "sidecar RSS: idle {idle_sidecar:.1} MB (target < 30: {}), 4 busy slots peak {sidecar_peak:.1} MB (target < 60: {})",
        verdict(idle_sidecar < 30.0),
        verdict(sidecar_peak < 60.0)
    );
    let runner_peak = ones
        .iter()
        .chain(&fours)
        .map(|r| r.runner_peak_mb)
        .fold(idle_runner, f64::max);
    println!(
        "runner RSS: idle {idle_runner:.1} MB, peak {runner_peak:.1} MB (target < 8: {})",
        verdict(runner_peak < 8.0)
    );

    println!(
        "\nbeside Python Perago 0.6.1 (perago start; rates from Conductor's task timestamps; CPU of each process tree per completed task)"
    );
    let mut worst_ratio4 = f64::INFINITY;
    for run in 0..runs {
        for (label, ours, theirs) in [
            ("1 slot / -j 1", &ones[run].figures, &py1s[run].figures),
            ("4 slots / -j 4", &fours[run].figures, &py4s[run].figures),
        ] {
            let ratio = ours.server_rate() / theirs.server_rate();
            if label.starts_with('4') {
                worst_ratio4 = worst_ratio4.min(ratio);
            }
            println!(
                "run {} {label:<15} sidecar {:>6.1} tasks/s, p50 {:>5.1} ms, CPU {:>5.2} ms/task | Python {:>6.1} tasks/s, p50 {:>5.1} ms, CPU {:>5.2} ms/task{} | throughput ×{ratio:.2}, CPU {:.0}% of Python's",
                run + 1,
                ours.server_rate(),
                ours.percentile(0.5),
                ours.cpu_ms_per_task(),
                theirs.server_rate(),
                theirs.percentile(0.5),
                theirs.cpu_ms_per_task(),
                if theirs.lost > 0 {
                    format!(" ({} of {n} not completed)", theirs.lost)
                } else {
                    String::new()
                },
                100.0 * ours.cpu_ms_per_task() / theirs.cpu_ms_per_task(),
            );
        }
    }
    let median = |v: Vec<f64>| {
        let mut v = v;
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let p50 = |runs: &[&Figures]| median(runs.iter().map(|f| f.percentile(0.5)).collect());
    let cpu = |runs: &[&Figures]| median(runs.iter().map(|f| f.cpu_ms_per_task()).collect());
    let (ours1, ours4): (Vec<&Figures>, Vec<&Figures>) = (
        ones.iter().map(|r| &r.figures).collect(),
        fours.iter().map(|r| &r.figures).collect(),
    );
    let (theirs1, theirs4): (Vec<&Figures>, Vec<&Figures>) = (
        py1s.iter().map(|r| &r.figures).collect(),
        py4s.iter().map(|r| &r.figures).collect(),
    );
    println!(
        "targets: 4-slot throughput ≥ 1.2× Python's in every run: worst ×{worst_ratio4:.2} {}; p50 at or below Python's (medians): 1 slot {:.1} vs {:.1} ms {}, 4 slots {:.1} vs {:.1} ms {}; CPU per task ≤ 1/3 of Python's (medians): 1 slot {:.2} vs {:.2} ms {}, 4 slots {:.2} vs {:.2} ms {}",
        verdict(worst_ratio4 >= 1.2),
        p50(&ours1),
        p50(&theirs1),
        verdict(p50(&ours1) <= p50(&theirs1)),
        p50(&ours4),
        p50(&theirs4),
        verdict(p50(&ours4) <= p50(&theirs4)),
        cpu(&ours1),
        cpu(&theirs1),
        verdict(cpu(&ours1) * 3.0 <= cpu(&theirs1)),
        cpu(&ours4),
        cpu(&theirs4),
        verdict(cpu(&ours4) * 3.0 <= cpu(&theirs4)),
    );
    println!("\nwhat a body costs, 4 slots (median of {runs} runs)");
    for (label, runs) in [
        ("a fresh sh per attempt (perago-runner)", &fours),
        ("one long-lived Python process (the protocol)", &lived),
    ] {
        let figures: Vec<&Figures> = runs.iter().map(|r| &r.figures).collect();
        println!(
            "{label:<46} {:>6.1} tasks/s, p50 {:>5.1} ms, CPU {:>5.2} ms/task (sidecar + body), body peak {:.1} MB",
            median(figures.iter().map(|f| f.server_rate()).collect()),
            p50(&figures),
            cpu(&figures),
            runs.iter().map(|r| r.runner_peak_mb).fold(0.0, f64::max),
        );
    }

    println!(
        "\nan unchanged Python Perago task function as the body (python -m perago_k8s run), beside Python Perago and the bare loop"
    );
    let cold4: Vec<&Figures> = colds.iter().map(|r| &r.figures).collect();
    println!(
        "{:<46} {:>6.1} tasks/s, p50 {:>7.1} ms, CPU {:>7.2} ms/task (sidecar + bodies), {cold_n} tasks per run",
        "a Python process per attempt, 4 slots",
        median(cold4.iter().map(|f| f.server_rate()).collect()),
        p50(&cold4),
        cpu(&cold4),
    );
    // Each run against the bare loop and Python Perago of the same run.
    for (kind, one_slot, four_slots) in [
        ("Python", &warm1s, &warm4s),
        ("compiled", &compiled1s, &compiled4s),
    ] {
        let mut goals = Vec::new();
        for (slots, label, warm, theirs, bare) in [
            (1, "1 slot / -j 1", one_slot, &theirs1, &bare1s),
            (4, "4 slots / -j 4", four_slots, &theirs4, &bare4s),
        ] {
            let runs = warm.iter().zip(theirs).zip(bare.iter());
            for (run, ((pod, theirs), bare)) in runs.enumerate() {
                let ours = &pod.figures;
                let (to_bare, to_python) = (
                    ours.server_rate() / bare.server_rate(),
                    ours.server_rate() / theirs.server_rate(),
                );
                let cpu_share = ours.cpu_ms_per_task() / theirs.cpu_ms_per_task();
                println!(
                    "run {} persistent {kind}, {label:<15} {:>6.1} tasks/s, p50 {:>5.1} ms, p99 {:>5.1} ms, CPU {:>5.2} ms/task (sidecar {:.2}, runner {:.2}, bodies {:.2}) | ×{to_bare:.2} the bare loop ({:.1} tasks/s, its client {:.2} ms/task), ×{to_python:.2} Python (p50 {:.1} ms, CPU {:.2} ms/task), CPU {:.0}% of Python's",
                    run + 1,
                    ours.server_rate(),
                    ours.percentile(0.5),
                    ours.percentile(0.99),
                    ours.cpu_ms_per_task(),
                    pod.cpu_ms_per_task.sidecar,
                    pod.cpu_ms_per_task.runner,
                    pod.cpu_ms_per_task.bodies,
                    bare.server_rate(),
                    bare.cpu_ms_per_task(),
                    theirs.percentile(0.5),
                    theirs.cpu_ms_per_task(),
                    100.0 * cpu_share,
                );
                let phases: Vec<String> = pod
                    .phases_ms
                    .iter()
                    .map(|(phase, ms)| format!("{phase} {ms:.2}"))
                    .collect();
                println!(
                    "      the sidecar's phases, mean ms per attempt: {}",
                    phases.join(", ")
                );
                goals.push(Goals {
                    slots,
                    to_bare,
                    p50_at_most_python: ours.percentile(0.5) <= theirs.percentile(0.5),
                    cpu_share,
                    beyond_the_calls: (ours.cpu_ms_per_task() - bare.cpu_ms_per_task())
                        / theirs.cpu_ms_per_task(),
                });
            }
        }
        let range = |slots: Option<u32>, f: fn(&Goals) -> f64| {
            let values = goals
                .iter()
                .filter(|g| slots.is_none_or(|s| g.slots == s))
                .map(f);
            values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
        };
        let (cpu, beyond) = (
            range(None, |g| g.cpu_share),
            range(None, |g| g.beyond_the_calls),
        );
        let to_bare = range(Some(4), |g| g.to_bare);
        let p50 = goals
            .iter()
            .filter(|g| g.slots == 1)
            .all(|g| g.p50_at_most_python);
        println!(
            "goals for persistent {kind} bodies, every run: CPU per task ≤ 1/3 of Python's: {:.0}–{:.0}% {} (beyond the bare loop's client, which makes the same two Conductor calls: {:.0}–{:.0}%); throughput at 4 slots ≥ 0.9× the bare loop: ×{:.2}–{:.2} {}; p50 at 1 slot ≤ Python's: {}",
            100.0 * cpu.0,
            100.0 * cpu.1,
            verdict(cpu.1 * 3.0 <= 1.0),
            100.0 * beyond.0,
            100.0 * beyond.1,
            to_bare.0,
            to_bare.1,
            verdict(to_bare.0 >= 0.9),
            verdict(p50),
        );
    }
    // What the goal of a third of Python's CPU leaves a stack once Conductor's two calls per
    // task are paid: the bare loop's client does nothing else.
    let floor: Vec<f64> = (bare1s.iter().zip(&theirs1))
        .chain(bare4s.iter().zip(&theirs4))
        .map(|(bare, theirs)| bare.cpu_ms_per_task() / theirs.cpu_ms_per_task())
        .collect();
    println!(
        "the bare loop's client alone (a poll and a completion per task, nothing else): {:.0}–{:.0}% of Python Perago's CPU per task",
        100.0 * floor.iter().copied().fold(f64::INFINITY, f64::min),
        100.0 * floor.iter().copied().fold(0.0, f64::max),
    );
    // The per-attempt files on a tmpfs: what the disk's inode work costs each attempt.
    for (run, ((memory, disk), theirs)) in compiled4_memory
        .iter()
        .zip(&compiled4s)
        .zip(&theirs4)
        .enumerate()
    {
        let (ours, cpu) = (&memory.figures, &memory.cpu_ms_per_task);
        println!(
            "run {} persistent compiled, 4 slots, work volume in memory: {:>6.1} tasks/s, p50 {:>5.1} ms, CPU {:>5.2} ms/task (sidecar {:.2}, runner {:.2}, bodies {:.2}), CPU {:.0}% of Python's | on disk: {:.1} tasks/s, p50 {:.1} ms, CPU {:.2} ms/task",
            run + 1,
            ours.server_rate(),
            ours.percentile(0.5),
            ours.cpu_ms_per_task(),
            cpu.sidecar,
            cpu.runner,
            cpu.bodies,
            100.0 * ours.cpu_ms_per_task() / theirs.cpu_ms_per_task(),
            disk.figures.server_rate(),
            disk.figures.percentile(0.5),
            disk.figures.cpu_ms_per_task(),
        );
    }
    let ours_idle = idle_sidecar + idle_runner;
    let ours_busy = sidecar_peak + fours.iter().map(|r| r.runner_peak_mb).fold(0.0, f64::max);
    let python_busy = py4s.iter().map(|r| r.peak_mb).fold(0.0, f64::max);
    println!(
        "memory, 4 slots: sidecar + runner idle {ours_idle:.1} MB, busy {ours_busy:.1} MB | Python (supervisor, broker, 4 executors) idle {python_idle:.1} MB, busy {python_busy:.1} MB | {:.0}% of Python's",
        100.0 * ours_busy / python_busy
    );
}
