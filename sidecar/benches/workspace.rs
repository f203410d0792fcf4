//! Workspace transfer figures against the real lakeFS: download, stage and publish of a
//! workspace of 2,000 small files with 1% changed, and of a few large files, with the objects
//! and bytes uploaded; parallel against one-at-a-time download; and the peak resident memory
//! while a 1 GiB file is downloaded and staged. Prints figures; asserts nothing.
//!
//! PERAGO_BENCH_LARGE_MIB (default 1024) sets the size of the large file,
//! PERAGO_BENCH_PARALLELISM (default 16, the sidecar's default) the transfers at once.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, Services};
use perago_sidecar::lakefs::LakeFsClient;
use perago_sidecar::workspace::{download, publish, snapshot};
use serde_json::json;

fn parallelism() -> usize {
    std::env::var("PERAGO_BENCH_PARALLELISM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
}
const TIMEOUT: Duration = Duration::from_secs(900);

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn repository(endpoint: &str, name: &str) -> String {
    let resp = reqwest::Client::new()
        .post(format!("{endpoint}/api/v1/repositories"))
        .basic_auth(LAKEFS_ACCESS_KEY_ID, Some(LAKEFS_SECRET_ACCESS_KEY))
        .json(&json!({"name": name, "storage_namespace": format!("local://{name}"), "default_branch": "main"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    name.to_owned()
}

/// Upload a local tree to main in parallel and commit it; returns the commit.
async fn seed(c: &LakeFsClient, repo: &str, dir: &Path) -> String {
    let items = snapshot::take(dir).unwrap();
    let plan = publish::plan(&items, &BTreeMap::new(), "/").unwrap();
    publish::apply(c, repo, "main", &plan, dir, parallelism(), TIMEOUT)
        .await
        .unwrap();
    c.commit(repo, "main", "seed", &BTreeMap::new())
        .await
        .unwrap()
        .id
}

struct Figures {
    download_s: f64,
    stage_s: f64,
    publish_s: f64,
    uploads: usize,
    deletes: usize,
    upload_bytes: u64,
}

/// Download `input`, let `change` edit the workspace, stage on a branch and merge into main.
async fn transaction(
    c: &LakeFsClient,
    repo: &str,
    input: &str,
    change: impl FnOnce(&Path),
) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    download::download(c, repo, input, "/", dir.path(), parallelism(), TIMEOUT)
        .await
        .unwrap();
    let download_s = started.elapsed().as_secs_f64();
    change(dir.path());
    let started = Instant::now();
    let path = dir.path().to_owned();
    let items = tokio::task::spawn_blocking(move || snapshot::take(&path))
        .await
        .unwrap()
        .unwrap();
    let base = publish::base_objects(c, repo, input, "/").await.unwrap();
    let plan = publish::plan(&items, &base, "/").unwrap();
    let branch = format!("bench-staging-{}", uuid::Uuid::new_v4().simple());
    c.create_branch(repo, &branch, input).await.unwrap();
    publish::apply(c, repo, &branch, &plan, dir.path(), parallelism(), TIMEOUT)
        .await
        .unwrap();
    c.commit(repo, &branch, "perago try", &BTreeMap::new())
        .await
        .unwrap();
    let stage_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    c.squash_merge(repo, &branch, "main", &BTreeMap::new(), TIMEOUT)
        .await
        .unwrap();
    let publish_s = started.elapsed().as_secs_f64();
    c.delete_branch(repo, &branch).await.unwrap();
    Figures {
        download_s,
        stage_s,
        publish_s,
        uploads: plan.uploads.len(),
        deletes: plan.deletes.len(),
        upload_bytes: plan.upload_bytes,
    }
}

fn print(label: &str, f: &Figures) {
    println!(
        "{label:<34} download {:>6.2} s, stage {:>6.2} s ({} uploads, {} deletes, {} bytes), publish {:>5.2} s",
        f.download_s, f.stage_s, f.uploads, f.deletes, f.upload_bytes, f.publish_s
    );
}

fn write_file(path: &Path, bytes: u64, seed: u8) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let block: Vec<u8> = (0..1024 * 1024)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
}

#[tokio::main]
async fn main() {
    let large_mib: u64 = std::env::var("PERAGO_BENCH_LARGE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let services = Services::start(Selection {
        lakefs: true,
        ..Selection::default()
    })
    .await
    .unwrap();
    let endpoint = services.lakefs().endpoint.clone();
    let c = LakeFsClient::new(
        &endpoint,
        LAKEFS_ACCESS_KEY_ID,
        LAKEFS_SECRET_ACCESS_KEY,
        Duration::from_secs(60),
    )
    .unwrap();
    let run = std::process::id();

    // 2,000 small files, 1% changed.
    let repo = repository(&endpoint, &format!("bench-small-{run}")).await;
    let src = tempfile::tempdir().unwrap();
    for i in 0..2000 {
        let dir = src.path().join(format!("part-{:02}", i % 20));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("{i:05}.csv")),
            format!("{i},{}\n", "x".repeat(1000)),
        )
        .unwrap();
    }
    let input = seed(&c, &repo, src.path()).await;
    let sequential = {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        download::download(&c, &repo, &input, "/", dir.path(), 1, TIMEOUT)
            .await
            .unwrap();
        started.elapsed().as_secs_f64()
    };
    let small = transaction(&c, &repo, &input, |dir| {
        for i in (0..2000).step_by(100) {
            std::fs::write(
                dir.join(format!("part-{:02}/{i:05}.csv", i % 20)),
                format!("{i},changed\n"),
            )
            .unwrap();
        }
    })
    .await;

    // A few large files, one changed.
    let repo = repository(&endpoint, &format!("bench-large-{run}")).await;
    let src = tempfile::tempdir().unwrap();
    for i in 0..4u8 {
        write_file(&src.path().join(format!("model-{i}.bin")), 64 << 20, i);
    }
    let input = seed(&c, &repo, src.path()).await;
    let large = transaction(&c, &repo, &input, |dir| {
        write_file(&dir.join("model-2.bin"), 64 << 20, 99)
    })
    .await;

    // One large file downloaded and staged, memory measured.
    let repo = repository(&endpoint, &format!("bench-huge-{run}")).await;
    let src = tempfile::tempdir().unwrap();
    write_file(&src.path().join("huge.bin"), large_mib << 20, 1);
    let input = seed(&c, &repo, src.path()).await;
    drop(src);
    let before = peak_rss_mb();
    let huge = transaction(&c, &repo, &input, |dir| {
        write_file(&dir.join("huge.bin"), large_mib << 20, 2)
    })
    .await;
    let after = peak_rss_mb();

    println!(
        "lakeFS on this machine (local blockstore), transfer parallelism {}",
        parallelism()
    );
    print("2,000 files x 1 KB, 1% changed", &small);
    println!(
        "  download one at a time {sequential:.2} s vs parallel {:.2} s: {:.1}x (target >= 4x: {})",
        small.download_s,
        sequential / small.download_s,
        if sequential / small.download_s >= 4.0 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "  only the changed objects are uploaded: {} of 2000 ({})",
        small.uploads,
        if small.uploads == 20 && small.deletes == 0 {
            "met"
        } else {
            "MISSED"
        }
    );
    print("4 files x 64 MiB, 1 changed", &large);
    print(&format!("1 file x {large_mib} MiB, rewritten"), &huge);
    println!(
        "  peak RSS of this process: {before:.1} MB before, {after:.1} MB after the {large_mib} MiB transaction (target < 64 MB: {})",
        if after < 64.0 { "met" } else { "MISSED" }
    );
}
