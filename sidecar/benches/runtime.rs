//! Workspace-free throughput of the sidecar against the real Conductor, beside a bare
//! poll-and-complete loop and Python Perago 0.6.1 (`perago start`, from PyPI) on the same
//! server, and the resident memory of each. Prints figures and ratios; asserts nothing. Run
//! with `make bench`.
//!
//! PERAGO_BENCH_TASKS (default 300) sets the tasks per run.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use perago_api::{contract, manifest, taskdef};
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
  resultSchema: {{type: object, properties: {{total: {{type: integer}}}}, required: [total]}}
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
    latencies_ms: Vec<f64>,
    /// First poll to last completion, from Conductor's task timestamps: the same clock for
    /// every runtime, whatever its start-up time.
    server_seconds: f64,
}

impl Figures {
    fn rate(&self, n: usize) -> f64 {
        n as f64 / self.seconds
    }

    fn server_rate(&self, n: usize) -> f64 {
        n as f64 / self.server_seconds
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

/// Poll → COMPLETED per task (ms) and the span from the first poll to the last completion
/// (s), from Conductor's own start and end times.
async fn server_times(api: &ConductorApi, ids: &[String]) -> (Vec<f64>, f64) {
    let mut latencies = Vec::new();
    let (mut first, mut last) = (f64::MAX, 0f64);
    for id in ids {
        let wf = api.workflow(id).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf}");
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

async fn figures(api: &ConductorApi, ids: &[String], seconds: f64) -> Figures {
    let (latencies_ms, server_seconds) = server_times(api, ids).await;
    Figures {
        seconds,
        latencies_ms,
        server_seconds,
    }
}

/// The ceiling: `workers` loops that batch-poll one task and complete it at once.
async fn bare_loop(api: &Arc<ConductorApi>, n: usize, workers: usize) -> Figures {
    let ids = fill(api, n).await;
    let done = Arc::new(AtomicUsize::new(0));
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
    figures(api, &ids, started.elapsed().as_secs_f64()).await
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

struct PodRun {
    figures: Figures,
    sidecar_peak_mb: f64,
    runner_peak_mb: f64,
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
    let (sidecar, runner) = (pod.pid() as u32, runner_pid(&pod));
    let (mut sidecar_peak, mut runner_peak) = (0f64, 0f64);
    loop {
        let (done, failed) = reported(&pod).await;
        assert_eq!(failed, 0, "attempts failed:\n{}", pod.log());
        if done >= n {
            break;
        }
        sidecar_peak = sidecar_peak.max(rss_mb(sidecar));
        runner_peak = runner_peak.max(rss_mb(runner));
        if started.elapsed() > Duration::from_secs(120) {
            panic!(
                "the run did not finish:\n{}\n{}",
                pod.log(),
                pod.metrics().await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    pod.stop().await;
    PodRun {
        figures: figures(api, &ids, seconds).await,
        sidecar_peak_mb: sidecar_peak,
        runner_peak_mb: runner_peak,
    }
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

fn stop_group(pgid: u32) {
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(pgid).unwrap());
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
}

struct PythonRun {
    figures: Figures,
    peak_mb: f64,
}

async fn python_run(api: &Arc<ConductorApi>, n: usize, slots: u32) -> PythonRun {
    let dir = tempfile::tempdir().unwrap();
    let ids = fill(api, n).await;
    let child = start_python(&api.base, dir.path(), slots);
    let pgid = child.id().unwrap();
    let started = Instant::now();
    let mut peak = 0f64;
    for id in &ids {
        loop {
            let wf = api.workflow(id).await;
            if wf["status"] == "COMPLETED" {
                break;
            }
            assert!(
                wf["status"] == "RUNNING" && started.elapsed() < Duration::from_secs(300),
                "Python Perago did not complete {id}: {wf}"
            );
            peak = peak.max(group_rss_mb(pgid));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    peak = peak.max(group_rss_mb(pgid));
    stop_group(pgid);
    PythonRun {
        figures: figures(api, &ids, seconds).await,
        peak_mb: peak,
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

#[tokio::main]
async fn main() {
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
        stop_group(pgid);
        idle
    };

    eprintln!("bare loop, 1 worker");
    let bare1 = bare_loop(&api, n, 1).await;
    eprintln!("bare loop, 4 workers");
    let bare4 = bare_loop(&api, n, 4).await;
    eprintln!("sidecar, 1 slot");
    let one = sidecar_run(&api, &bins, n, 1).await;
    eprintln!("sidecar, 4 slots");
    let four = sidecar_run(&api, &bins, n, 4).await;
    eprintln!("Python Perago, -j 1");
    let py1 = python_run(&api, n, 1).await;
    eprintln!("Python Perago, -j 4");
    let py4 = python_run(&api, n, 4).await;

    println!(
        "Conductor {} (SQLite) on this machine, {n} tasks per run",
        services.conductor().version
    );
    println!("{}", bare1.line("bare loop, 1 worker", n));
    println!("{}", bare4.line("bare loop, 4 workers", n));
    println!("{}", one.figures.line("sidecar, 1 slot", n));
    println!("{}", four.figures.line("sidecar, 4 slots", n));
    let ratio1 = one.figures.rate(n) / bare1.rate(n);
    let ratio4 = four.figures.rate(n) / bare4.rate(n);
    println!(
        "ratio sidecar/bare: 1 slot {:.0}%, 4 slots {:.0}% (target ≥ 80% at 4: {})",
        ratio1 * 100.0,
        ratio4 * 100.0,
        verdict(ratio4 >= 0.8)
    );
    println!(
        "sidecar RSS: idle {idle_sidecar:.1} MB (target < 30: {}), 4 busy slots peak {:.1} MB (target < 60: {})",
        verdict(idle_sidecar < 30.0),
        four.sidecar_peak_mb,
        verdict(four.sidecar_peak_mb < 60.0)
    );
    let runner_peak = one.runner_peak_mb.max(four.runner_peak_mb).max(idle_runner);
    println!(
        "runner RSS: idle {idle_runner:.1} MB, peak {runner_peak:.1} MB (target < 8: {})",
        verdict(runner_peak < 8.0)
    );

    println!("\nbeside Python Perago 0.6.1 (perago start; rates from Conductor's task timestamps)");
    for (label, ours, theirs) in [
        ("1 slot / -j 1", &one, &py1),
        ("4 slots / -j 4", &four, &py4),
    ] {
        println!(
            "{label:<15} sidecar {:>6.1} tasks/s, p50 {:>5.1} ms | Python {:>6.1} tasks/s, p50 {:>5.1} ms | throughput ×{:.2}",
            ours.figures.server_rate(n),
            ours.figures.percentile(0.5),
            theirs.figures.server_rate(n),
            theirs.figures.percentile(0.5),
            ours.figures.server_rate(n) / theirs.figures.server_rate(n)
        );
    }
    let ours_idle = idle_sidecar + idle_runner;
    let ours_busy = four.sidecar_peak_mb + four.runner_peak_mb;
    println!(
        "memory, 4 slots: sidecar + runner idle {ours_idle:.1} MB, busy {ours_busy:.1} MB | Python (supervisor, broker, 4 executors) idle {python_idle:.1} MB, busy {:.1} MB | {:.0}% of Python's",
        py4.peak_mb,
        100.0 * ours_busy / py4.peak_mb
    );
}
