//! Where object bytes travel, side by side on one lakeFS on PostgreSQL and an S3 server
//! (s3proxy): every byte through the lakeFS server (`proxied`) against straight to the object
//! store on URLs lakeFS presigns (`presigned`), with 1 and with 4 pods at once. Each pod runs
//! one attempt per run, on a branch of its own, that downloads the workload and stages it
//! rewritten (its body appends a byte to every file), so the attempt moves the workload twice:
//! - (a) 2,000 files of about 1 KB;
//! - (c) one file of 1 GiB.
//!
//! Per case it prints the wall time of the run, the pods' own download and stage seconds (their
//! `runtime_workspace_io_duration_seconds`, the slowest pod's), the throughput (bytes moved
//! over those seconds),
//! lakeFS's CPU seconds per GiB moved (its process accounting) and the pods' peak memory; then
//! presigned against proxied: lakeFS CPU per GiB (goal at most 1/10), throughput (goal at least
//! equal), peak memory (goal unchanged). Each figure is the worst of the runs, with the spread.
//! Asserts only that every attempt completed.
//!
//! PERAGO_BENCH_SCALE (percent, default 100) scales the file count and the large file,
//! PERAGO_BENCH_RUNS (default 3) the runs of each case, PERAGO_BENCH_WORKLOADS (default `ac`),
//! PERAGO_BENCH_PODS (default `1,4`) the pods at once.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use perago_e2e::lake::Lake;
use perago_e2e::measure::{ProcessTree, counter_by, cpu_seconds_below};
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::storage::Storage;
use perago_e2e::{Selection, Services};
use perago_lakefs::LakeFsClient;
use perago_lakefs::direct::ObjectStoreHosts;
use perago_sidecar::workspace::{publish, snapshot};
use serde_json::json;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const TASK: &str = "bench.data_path";
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Appends a byte to every file of the workspace: every object is staged again.
const BODY: &str = r#"
find "$PERAGO_WORKSPACE" -type f -exec sh -c 'for f; do printf x >> "$f"; done' _ {} +
printf '{"ok": true}' > "$PERAGO_RESULT"
"#;

struct Workload {
    key: &'static str,
    /// (path, size in bytes) of every file.
    files: Vec<(String, u64)>,
}

impl Workload {
    fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, size)| size).sum()
    }
}

fn workloads(scale: u64, wanted: &str) -> Vec<Workload> {
    let small = (2000 * scale / 100).max(10);
    let mut all = Vec::new();
    if wanted.contains('a') {
        all.push(Workload {
            key: "a",
            files: (0..small)
                .map(|i| (format!("part-{}/{i}.csv", i / 100), 1024))
                .collect(),
        });
    }
    if wanted.contains('c') {
        all.push(Workload {
            key: "c",
            files: vec![("large.bin".to_owned(), (1024 * scale / 100).max(1) << 20)],
        });
    }
    all
}

/// The workload's seed commit in a repository of its own.
async fn seed(lake: &Lake, client: &LakeFsClient, namespace: &str, workload: &Workload) -> String {
    let repo = format!("bench-data-path-{}", workload.key);
    lake.post(
        "/repositories",
        json!({"name": repo, "storage_namespace": namespace, "default_branch": "main"}),
    )
    .await
    .unwrap();
    let src = tempfile::tempdir().unwrap();
    for (path, size) in &workload.files {
        let file = src.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let block: Vec<u8> = (0..(*size).min(1 << 20))
            .map(|i| (i as u8).wrapping_mul(31))
            .collect();
        let mut out = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
        let mut left = *size;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            std::io::Write::write_all(&mut out, &block[..n]).unwrap();
            left -= n as u64;
        }
    }
    let items = snapshot::take(src.path()).unwrap();
    let plan = publish::plan(&items, &BTreeMap::new(), "/").unwrap();
    let timeout = Duration::from_secs(900);
    publish::apply(client, &repo, "main", &plan, src.path(), 16, timeout)
        .await
        .unwrap();
    client
        .commit(&repo, "main", "seed", &BTreeMap::new())
        .await
        .unwrap()
        .id
}

/// One case's figures of one run.
#[derive(Clone, Copy, Default)]
struct Run {
    wall_s: f64,
    download_s: f64,
    stage_s: f64,
    lakefs_cpu_s: f64,
    moved_bytes: f64,
    peak_mib: f64,
}

impl Run {
    /// Bytes moved over the transfer phases' seconds (the slowest pod's).
    fn throughput_mib_s(&self) -> f64 {
        self.moved_bytes / (1024.0 * 1024.0) / (self.download_s + self.stage_s)
    }

    fn lakefs_cpu_per_gib(&self) -> f64 {
        self.lakefs_cpu_s / (self.moved_bytes / GIB)
    }
}

/// This benchmark's own lakeFS (a run of the test suites beside it has its own).
fn lakefs_cpu() -> f64 {
    cpu_seconds_below(std::process::id(), "lakefs")
}

fn io_sums(metrics: &str) -> BTreeMap<String, f64> {
    counter_by(
        metrics,
        "runtime_workspace_io_duration_seconds_sum",
        &["operation"],
    )
}

struct Case<'a> {
    api: &'a ConductorApi,
    repo: String,
    input: &'a str,
    workload: &'a Workload,
    pods: Vec<Pod>,
}

impl Case<'_> {
    /// Each pod's seconds in each workspace phase so far.
    async fn io_sums(&self) -> Vec<BTreeMap<String, f64>> {
        futures_util::future::join_all(self.pods.iter().map(|p| p.metrics()))
            .await
            .iter()
            .map(|m| io_sums(m))
            .collect()
    }

    /// One attempt on every pod at once.
    async fn run(&mut self, run: usize, case: &str) -> Run {
        let lake_before = lakefs_cpu();
        let before = self.io_sums().await;
        let mut trees: Vec<ProcessTree> = self
            .pods
            .iter()
            .map(|p| {
                let mut t = ProcessTree::new(p.pid() as u32);
                t.reset_peaks();
                t
            })
            .collect();
        let started = Instant::now();
        let mut ids = Vec::new();
        for pod in 0..self.pods.len() {
            let branch = format!("{case}-r{run}-p{pod}");
            let input = json!({
                "workspace": {"repository": self.repo, "branch": branch, "refType": "commit", "ref": self.input},
                "params": {},
            });
            ids.push(
                self.api
                    .start(TASK, &format!("{case}-{run}-{pod}"), input)
                    .await,
            );
        }
        let mut left: Vec<String> = ids;
        while !left.is_empty() {
            for t in &mut trees {
                t.sample();
            }
            let mut still = Vec::new();
            for id in left {
                let wf = self.api.workflow(&id).await;
                match wf["status"].as_str().unwrap_or("") {
                    "COMPLETED" => {}
                    "RUNNING" if started.elapsed() < Duration::from_secs(3600) => still.push(id),
                    _ => panic!("{case}: an attempt did not complete: {wf}"),
                }
            }
            left = still;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let wall_s = started.elapsed().as_secs_f64();
        let after = self.io_sums().await;
        let phase = |name: &str| {
            before
                .iter()
                .zip(&after)
                .map(|(b, a)| a.get(name).unwrap_or(&0.0) - b.get(name).unwrap_or(&0.0))
                .fold(0.0_f64, f64::max)
        };
        Run {
            wall_s,
            download_s: phase("download"),
            stage_s: phase("upload"),
            lakefs_cpu_s: lakefs_cpu() - lake_before,
            // Downloaded, then staged again with one more byte per file.
            moved_bytes: (self.pods.len() as u64 * 2 * self.workload.bytes()) as f64,
            peak_mib: trees.iter().map(ProcessTree::peak_mib).fold(0.0, f64::max),
        }
    }
}

/// The worst of the runs and the spread (worst - best), by `key` where larger is worse.
fn worst(runs: &[Run], key: impl Fn(&Run) -> f64) -> (f64, f64) {
    let values: Vec<f64> = runs.iter().map(key).collect();
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    (max, max - min)
}

#[tokio::main]
async fn main() {
    let scale = env_number("PERAGO_BENCH_SCALE", 100);
    let runs = env_number("PERAGO_BENCH_RUNS", 3).max(1) as usize;
    let wanted = std::env::var("PERAGO_BENCH_WORKLOADS").unwrap_or_else(|_| "ac".into());
    let pod_counts: Vec<usize> = std::env::var("PERAGO_BENCH_PODS")
        .unwrap_or_else(|_| "1,4".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .filter(|n| *n > 0)
        .collect();
    let services = Services::start(Selection {
        conductor: true,
        lakefs: true,
        storage: Storage::PostgresS3,
        ..Selection::default()
    })
    .await
    .unwrap();
    let lakefs = services.lakefs();
    let lake = Lake::of(lakefs);
    let hosts = lakefs.object_store_hosts();
    let client = LakeFsClient::new(
        &lakefs.endpoint,
        LAKEFS_ACCESS_KEY_ID,
        LAKEFS_SECRET_ACCESS_KEY,
        Duration::from_secs(60),
    )
    .unwrap();
    client.go_direct(ObjectStoreHosts::parse(&hosts).unwrap());
    let api = ConductorApi::new(&services.conductor().api_url);
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: bench}}
spec:
  taskName: {TASK}
  ownerEmail: bench@example.com
  workspace: {{prefix: /}}
  paramsSchema: {{type: object}}
  resultSchema: {{type: object, properties: {{ok: {{type: boolean}}}}, required: [ok]}}
  controls: {{retry: {{count: 0}}, timeout: {{seconds: 3600, responseSeconds: 3600}}}}
  metrics: {{workspaceIo: true}}
  executor: {{body: {{image: body, command: [sh]}}, slots: 1}}
"#
    );
    let contract = api.register_task(&yaml).await;
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    println!(
        "data path bench: lakeFS {} on PostgreSQL + s3proxy, {runs} run(s) per case, scale {scale}%",
        services.lakefs().endpoint
    );
    for workload in workloads(scale, &wanted) {
        let repo = format!("bench-data-path-{}", workload.key);
        let input = seed(&lake, &client, &lakefs.namespace(&repo), &workload).await;
        let mut results: BTreeMap<(usize, &str), Vec<Run>> = BTreeMap::new();
        for &pods in &pod_counts {
            for path in ["proxied", "presigned"] {
                let env = [
                    ("LAKECTL_SERVER_ENDPOINT_URL", lakefs.endpoint.as_str()),
                    ("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID),
                    (
                        "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                        LAKEFS_SECRET_ACCESS_KEY,
                    ),
                    ("PERAGO_LAKEFS_DATA_PATH", path),
                    ("PERAGO_LAKEFS_OBJECT_STORE_HOSTS", hosts.as_str()),
                    ("PERAGO_TRANSFER_TIMEOUT_SECONDS", "3600"),
                ];
                let mut started = Vec::new();
                for _ in 0..pods {
                    started.push(Pod::start(&bins, &api.base, &contract, BODY, &env).await);
                }
                let mut case = Case {
                    api: &api,
                    repo: repo.clone(),
                    input: &input,
                    workload: &workload,
                    pods: started,
                };
                let name = format!("{}-{path}-{pods}", workload.key);
                for run in 0..runs {
                    for pod in 0..pods {
                        client
                            .create_branch(&repo, &format!("{name}-r{run}-p{pod}"), &input)
                            .await
                            .unwrap();
                    }
                    let r = case.run(run, &name).await;
                    println!(
                        "  ({}) {path:<9} pods {pods}  run {run}: wall {:7.2} s  {:8.1} MiB/s  download {:6.2} s  stage {:6.2} s  lakeFS CPU {:6.2} s/GiB  peak {:6.1} MiB",
                        workload.key,
                        r.wall_s,
                        r.throughput_mib_s(),
                        r.download_s,
                        r.stage_s,
                        r.lakefs_cpu_per_gib(),
                        r.peak_mib
                    );
                    results.entry((pods, path)).or_default().push(r);
                }
            }
        }
        println!(
            "({}) {} files, {:.1} MiB; worst of {runs} (spread):",
            workload.key,
            workload.files.len(),
            workload.bytes() as f64 / 1048576.0
        );
        for &pods in &pod_counts {
            let proxied = &results[&(pods, "proxied")];
            let presigned = &results[&(pods, "presigned")];
            let (cpu_x, cpu_xs) = worst(proxied, Run::lakefs_cpu_per_gib);
            let (cpu_d, cpu_ds) = worst(presigned, Run::lakefs_cpu_per_gib);
            // Throughput: the worst is the lowest.
            let (tp_x, tp_xs) = worst(proxied, |r| -r.throughput_mib_s());
            let (tp_d, tp_ds) = worst(presigned, |r| -r.throughput_mib_s());
            let (mem_x, _) = worst(proxied, |r| r.peak_mib);
            let (mem_d, _) = worst(presigned, |r| r.peak_mib);
            println!(
                "  pods {pods}: lakeFS CPU/GiB proxied {cpu_x:.2} (±{cpu_xs:.2}) presigned {cpu_d:.3} (±{cpu_ds:.3}) → presigned/proxied {:.3} (goal ≤ 0.100)",
                cpu_d / cpu_x
            );
            println!(
                "  pods {pods}: throughput MiB/s proxied {:.1} (±{tp_xs:.1}) presigned {:.1} (±{tp_ds:.1}) → presigned/proxied {:.2} (goal ≥ 1.00)",
                -tp_x,
                -tp_d,
                tp_d / tp_x
            );
            println!(
                "  pods {pods}: peak sidecar MiB proxied {mem_x:.1} presigned {mem_d:.1} → {:.2}",
                mem_d / mem_x
            );
        }
    }
}
