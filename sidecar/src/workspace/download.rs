//! Download: project the input commit's objects under the prefix into the attempt's
//! workspace directory. Keys are mapped with the projection rules (hostile keys fail the
//! attempt, marker files and keys outside the prefix are invisible); objects are streamed to
//! disk in parallel, so memory is bounded by the parallelism, not by object sizes; sizes are
//! checked against the listing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use perago_api::paths::{listing_prefix, object_key_to_local};

use crate::lakefs::{LakeFsClient, ObjectEntry};

/// What was downloaded: per local path, the object's lakeFS checksum and size.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub objects: BTreeMap<String, (String, u64)>,
}

impl Manifest {
    pub fn bytes(&self) -> u64 {
        self.objects.values().map(|(_, size)| size).sum()
    }
}

/// lakeFS action files (`_lakefs_actions/` at the repository root) are the repository's
/// configuration, not workspace data: never projected, uploaded or deleted, so a task whose
/// prefix is the root cannot remove the hard fence by mirroring its workspace.
pub const ACTIONS_DIR: &str = "_lakefs_actions/";

pub fn is_reserved(key: &str, prefix: &str) -> bool {
    prefix == perago_api::paths::ROOT_PREFIX && key.starts_with(ACTIONS_DIR)
}

/// The local paths of a listing, in sorted key order, refusing hostile keys and
/// file-versus-directory collisions (keys `a` and `a/b`).
pub fn plan(entries: &[ObjectEntry], prefix: &str) -> Result<Vec<(String, ObjectEntry)>, String> {
    let mut sorted: Vec<&ObjectEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut out = Vec::with_capacity(sorted.len());
    for entry in sorted {
        if is_reserved(&entry.path, prefix) {
            continue;
        }
        match object_key_to_local(&entry.path, prefix) {
            Ok(Some(local)) => out.push((local, entry.clone())),
            Ok(None) => {}
            Err(e) => {
                return Err(format!(
                    "object key '{}' cannot be projected into the workspace: {e}",
                    entry.path
                ));
            }
        }
    }
    let files: BTreeSet<&str> = out.iter().map(|(l, _)| l.as_str()).collect();
    for (local, _) in &out {
        let mut parent = local.as_str();
        while let Some((p, _)) = parent.rsplit_once('/') {
            if files.contains(p) {
                return Err(format!(
                    "object keys for '{p}' and '{local}' collide: one would be a file and a directory at once"
                ));
            }
            parent = p;
        }
    }
    Ok(out)
}

/// Download the workspace at `reference` into `dir` (which must exist and be empty).
pub async fn download(
    client: &LakeFsClient,
    repository: &str,
    reference: &str,
    prefix: &str,
    dir: &Path,
    parallelism: usize,
    object_timeout: Duration,
) -> Result<Manifest, String> {
    let entries = client
        .list_objects(repository, reference, listing_prefix(prefix))
        .await
        .map_err(|e| e.to_string())?;
    let planned = plan(&entries, prefix)?;
    for (local, _) in &planned {
        if let Some(parent) = Path::new(local)
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
        {
            tokio::fs::create_dir_all(dir.join(parent))
                .await
                .map_err(|e| format!("creating {} failed: {e}", dir.join(parent).display()))?;
        }
    }
    let mut manifest = Manifest::default();
    let mut transfers = futures_util::stream::iter(planned.into_iter().map(|(local, entry)| {
        let target = dir.join(&local);
        async move {
            let size = fetch(
                client,
                repository,
                reference,
                &entry,
                &target,
                object_timeout,
            )
            .await?;
            Ok::<_, String>((local, entry.checksum, size))
        }
    }))
    .buffer_unordered(parallelism.max(1));
    while let Some(done) = transfers.next().await {
        let (local, checksum, size) = done?;
        manifest.objects.insert(local, (checksum, size));
    }
    Ok(manifest)
}

async fn fetch(
    client: &LakeFsClient,
    repository: &str,
    reference: &str,
    entry: &ObjectEntry,
    target: &PathBuf,
    timeout: Duration,
) -> Result<u64, String> {
    let mut response = client
        .get_object(repository, reference, &entry.path, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(target)
        .await
        .map_err(|e| format!("creating {} failed: {e}", target.display()))?;
    let mut written = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(|e| {
        format!(
            "lakeFS get object on {repository}@{reference} failed while reading '{}': {e}",
            entry.path
        )
    })? {
        written += chunk.len() as u64;
        file.write_all(&chunk)
            .await
            .map_err(|e| format!("writing {} failed: {e}", target.display()))?;
    }
    file.flush()
        .await
        .map_err(|e| format!("writing {} failed: {e}", target.display()))?;
    if let Some(expected) = entry.size_bytes
        && expected != written
    {
        return Err(format!(
            "object '{}' at {repository}@{reference} was {written} bytes, the listing said {expected}",
            entry.path
        ));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str) -> ObjectEntry {
        ObjectEntry {
            path: path.into(),
            path_type: "object".into(),
            checksum: "c".into(),
            size_bytes: Some(1),
        }
    }

    #[test]
    fn projection_refuses_hostile_keys_and_hides_markers_and_neighbours() {
        let listing = [
            entry("data/b.txt"),
            entry("data/a.txt"),
            entry("data/x/.perago-attempt.json"),
            entry("datafile"),
            entry("data2/c"),
        ];
        let planned = plan(&listing, "data").unwrap();
        let locals: Vec<&str> = planned.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(locals, ["a.txt", "b.txt"]);
        for bad in [
            "data/../etc/passwd",
            "data//x",
            "/abs",
            "data/C:/x",
            "data/dir/",
            "data/a\\b",
        ] {
            let err = plan(&[entry(bad)], "data").unwrap_err();
            assert!(
                err.starts_with(&format!("object key '{bad}' cannot be projected")),
                "{err}"
            );
        }
        let err = plan(&[entry("a"), entry("a/b")], "/").unwrap_err();
        assert!(err.contains("collide"), "{err}");
    }
}
