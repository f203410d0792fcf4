//! Download: project the input commit's objects under the prefix into the attempt's
//! workspace directory. Keys are mapped with the projection rules (hostile keys fail the
//! attempt, marker files and keys outside the prefix are invisible); objects are streamed to
//! disk in parallel, so memory is bounded by the parallelism, not by object sizes; sizes are
//! checked against the listing.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use backon::BackoffBuilder;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use perago_contract::paths::{PathError, listing_prefix, object_key_to_local};

use crate::failure::FileError;
use perago_contract::text::{QUOTED_MAX, clip};
use perago_lakefs::{LakeFsClient, LakeFsError, ObjectEntry, REF_MAX, request_error};

/// Why the input ref could not be projected into the workspace.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// Listing the ref or asking for an object failed.
    #[error(transparent)]
    LakeFs(#[from] LakeFsError),
    #[error("object key '{}' cannot be projected into the workspace: {why}", clip(.key, QUOTED_MAX))]
    Unprojectable { key: String, why: KeyProblem },
    #[error(
        "object keys for '{}' and '{}' collide: one would be a file and a directory at once",
        clip(.file, QUOTED_MAX),
        clip(.inside, QUOTED_MAX)
    )]
    Collision { file: String, inside: String },
    /// A directory or file of the workspace could not be made, written or removed.
    #[error(transparent)]
    Local(#[from] FileError),
    /// The object's body broke off while it was read.
    #[error(
        "lakeFS get object on {}@{} failed while reading '{}': {cause}",
        .object.repository,
        clip(&.object.reference, REF_MAX),
        clip(&.object.key, QUOTED_MAX)
    )]
    BrokeOff { object: ObjectAt, cause: String },
    /// Fewer or more bytes arrived than the listing announced.
    #[error(
        "object '{}' at {}@{} was {written} bytes, the listing said {expected}",
        clip(&.object.key, QUOTED_MAX),
        .object.repository,
        clip(&.object.reference, REF_MAX)
    )]
    WrongSize {
        object: ObjectAt,
        written: u64,
        expected: u64,
    },
}

/// One object of the input ref.
#[derive(Debug)]
pub struct ObjectAt {
    pub repository: String,
    pub reference: String,
    pub key: String,
}

impl DownloadError {
    /// The download of one object broke off: an object at a commit never changes, so
    /// fetching it again from the start is safe.
    fn interrupted(&self) -> bool {
        matches!(self, Self::BrokeOff { .. } | Self::WrongSize { .. })
    }

    fn local(action: &'static str, path: &Path, cause: std::io::Error) -> Self {
        Self::Local(FileError::new(action, path, cause))
    }
}

/// What is wrong with an object key that cannot be a workspace path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyProblem(pub String);

/// Longest file or directory name Linux allows (`NAME_MAX`), in bytes.
pub const NAME_MAX: usize = 255;

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
    prefix == perago_contract::paths::ROOT_PREFIX && key.starts_with(ACTIONS_DIR)
}

/// What makes an object key unusable as a workspace path, named precisely (the guardrail
/// path texts of the shared canonicalisation would call all of these "`..`").
fn key_problem(key: &str) -> Option<String> {
    let bytes = key.as_bytes();
    let problem = if key.is_empty() {
        "the key is empty".to_owned()
    } else if key.contains('\0') {
        "it contains a NUL character".to_owned()
    } else if key.contains('\\') {
        "it contains a backslash ('\\'); workspace paths use '/' separators".to_owned()
    } else if key.ends_with('/') {
        "it ends in '/': a folder marker object, not a file".to_owned()
    } else if key.starts_with('/') {
        "it starts with '/': an absolute path".to_owned()
    } else if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
        format!("it starts with a drive letter ('{}')", &key[..2])
    } else if key.split('/').any(str::is_empty) {
        "it has an empty segment ('//')".to_owned()
    } else if key.split('/').any(|s| s == ".") {
        "it has a '.' segment".to_owned()
    } else if key.split('/').any(|s| s == "..") {
        "it has a '..' segment, which would leave the workspace".to_owned()
    } else {
        return None;
    };
    Some(problem)
}

/// Project one object key onto its workspace-relative path: `Ok(None)` when the key is not
/// part of the workspace (outside the prefix, an attempt marker), `Err` naming what is wrong
/// with a key that fails the attempt.
pub fn project(key: &str, prefix: &str) -> Result<Option<String>, KeyProblem> {
    if let Some(problem) = key_problem(key) {
        return Err(KeyProblem(problem));
    }
    let local = match object_key_to_local(key, prefix) {
        Ok(Some(local)) => local,
        Ok(None) => return Ok(None),
        // The whole key is clean, so only the part under the prefix can still be refused.
        Err(PathError::DriveQualified) => {
            return Err(KeyProblem(format!(
                "the part under the prefix starts with a drive letter ('{}')",
                key.get(prefix.len() + 1..prefix.len() + 3).unwrap_or("?:")
            )));
        }
        Err(e) => return Err(KeyProblem(e.to_string())),
    };
    if let Some(segment) = local.split('/').find(|s| s.len() > NAME_MAX) {
        return Err(KeyProblem(format!(
            "a segment ('{}') is {} bytes long, more than the {NAME_MAX} bytes a file or directory name may have",
            clip(segment, 24),
            segment.len()
        )));
    }
    Ok(Some(local))
}

/// The local paths of a listing, in sorted key order, refusing hostile keys and
/// file-versus-directory collisions (keys `a` and `a/b`).
pub fn plan(
    entries: &[ObjectEntry],
    prefix: &str,
) -> Result<Vec<(String, ObjectEntry)>, DownloadError> {
    let mut sorted: Vec<&ObjectEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut out = Vec::with_capacity(sorted.len());
    for entry in sorted {
        if is_reserved(&entry.path, prefix) {
            continue;
        }
        match project(&entry.path, prefix) {
            Ok(Some(local)) => out.push((local, entry.clone())),
            Ok(None) => {}
            Err(why) => {
                return Err(DownloadError::Unprojectable {
                    key: entry.path.clone(),
                    why,
                });
            }
        }
    }
    let files: BTreeSet<&str> = out.iter().map(|(l, _)| l.as_str()).collect();
    for (local, _) in &out {
        let mut parent = local.as_str();
        while let Some((p, _)) = parent.rsplit_once('/') {
            if files.contains(p) {
                return Err(DownloadError::Collision {
                    file: p.to_owned(),
                    inside: local.clone(),
                });
            }
            parent = p;
        }
    }
    Ok(out)
}

/// The planned files, each directory's in turn: the transfers at once make their files in
/// different directories where there are several. Making a file takes its directory's lock,
/// so transfers into one directory wait on each other (and, on a file system that checks
/// recently freed inodes, spin on the lock while it does).
fn by_turns(planned: Vec<(String, ObjectEntry)>) -> impl Iterator<Item = (String, ObjectEntry)> {
    let mut directories: Vec<VecDeque<(String, ObjectEntry)>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (local, entry) in planned {
        let parent = local.rsplit_once('/').map_or("", |(p, _)| p).to_owned();
        let at = *index.entry(parent).or_insert_with(|| {
            directories.push(VecDeque::new());
            directories.len() - 1
        });
        directories[at].push_back((local, entry));
    }
    let mut turn = 0;
    std::iter::from_fn(move || {
        while !directories.is_empty() {
            turn %= directories.len();
            if let Some(next) = directories[turn].pop_front() {
                turn += 1;
                return Some(next);
            }
            directories.swap_remove(turn);
        }
        None
    })
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
) -> Result<Manifest, DownloadError> {
    let mut steps = Steps::start();
    let entries = client
        .list_objects(repository, reference, listing_prefix(prefix))
        .await?;
    steps.listing = steps.lap();
    let planned = plan(&entries, prefix)?;
    steps.plan = steps.lap();
    create_directories(dir, &planned).await?;
    steps.directories = steps.lap();
    let mut manifest = Manifest::default();
    let source = Source {
        client,
        repository,
        reference,
        timeout: object_timeout,
    };
    let source = &source;
    let mut transfers = futures_util::stream::iter(by_turns(planned).map(|(local, entry)| {
        let target = dir.join(&local);
        async move {
            let size = source.fetch(&entry, &target).await?;
            Ok::<_, DownloadError>((local, entry.checksum, size))
        }
    }))
    .buffer_unordered(parallelism.max(1));
    while let Some(done) = transfers.next().await {
        let (local, checksum, size) = done?;
        let at = std::time::Instant::now();
        manifest.objects.insert(local, (checksum, size));
        steps.manifest += at.elapsed();
    }
    steps.transfers = steps.lap();
    steps.log(manifest.objects.len());
    Ok(manifest)
}

/// How long each step of a download took: what the sidecar does beside the transfers (the
/// projection's checks of every key, the manifest change detection starts from) on its own.
struct Steps {
    at: std::time::Instant,
    listing: Duration,
    plan: Duration,
    directories: Duration,
    /// All the transfers, the manifest's inserts included.
    transfers: Duration,
    manifest: Duration,
}

impl Steps {
    fn start() -> Self {
        Self {
            at: std::time::Instant::now(),
            listing: Duration::ZERO,
            plan: Duration::ZERO,
            directories: Duration::ZERO,
            transfers: Duration::ZERO,
            manifest: Duration::ZERO,
        }
    }

    /// The time since the last lap.
    fn lap(&mut self) -> Duration {
        let now = std::time::Instant::now();
        now - std::mem::replace(&mut self.at, now)
    }

    fn log(&self, objects: usize) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        tracing::debug!(
            objects,
            listing_ms = ms(self.listing),
            projection_and_reserved_paths_ms = ms(self.plan),
            directories_ms = ms(self.directories),
            transfers_ms = ms(self.transfers),
            manifest_ms = ms(self.manifest),
            "workspace download steps"
        );
    }
}

/// Every directory the planned files go in, made in one trip to the blocking pool (one per
/// file would cost a thread hand-off per file before any transfer starts).
async fn create_directories(
    dir: &Path,
    planned: &[(String, ObjectEntry)],
) -> Result<(), DownloadError> {
    let parents: BTreeSet<PathBuf> = planned
        .iter()
        .filter_map(|(local, _)| Path::new(local).parent())
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| dir.join(p))
        .collect();
    if parents.is_empty() {
        return Ok(());
    }
    tokio::task::spawn_blocking(move || {
        // In sorted order a parent comes before its children, so each call makes one level.
        for parent in &parents {
            std::fs::create_dir_all(parent)
                .map_err(|e| DownloadError::local("creating", parent, e))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| DownloadError::local("creating directories in", dir, std::io::Error::other(e)))?
}

/// The largest block a download writes at once (per transfer, so memory stays bounded by
/// the transfer parallelism). An object of at most this size is gathered whole and written
/// in one trip to the blocking pool: create, write and close, instead of one trip each.
const WRITE_BLOCK: usize = 1024 * 1024;

/// Where the objects of one download come from.
struct Source<'a> {
    client: &'a LakeFsClient,
    repository: &'a str,
    reference: &'a str,
    /// Per object.
    timeout: Duration,
}

impl Source<'_> {
    /// Fetch an object into `target`; a download that broke off is fetched again (3 more times,
    /// with the retry policy's backoff) from the start.
    async fn fetch(&self, entry: &ObjectEntry, target: &Path) -> Result<u64, DownloadError> {
        let mut delays = perago_lakefs::retries().build();
        let mut retries = 0u32;
        loop {
            match self.fetch_once(entry, target).await {
                Ok(written) => return Ok(written),
                Err(e) if e.interrupted() => {
                    let Some(delay) = delays.next() else {
                        return Err(e);
                    };
                    retries += 1;
                    tracing::warn!(object = %clip(&entry.path, QUOTED_MAX), retry = retries, error = %e,
                    "the download of an object broke off; fetching it again");
                    // A small object is written only once it has arrived whole: there may be
                    // no file to remove.
                    match tokio::fs::remove_file(target).await {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(DownloadError::local("removing", target, e));
                        }
                        _ => {}
                    }
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn fetch_once(&self, entry: &ObjectEntry, target: &Path) -> Result<u64, DownloadError> {
        let mut response = self
            .client
            .open_object(self.repository, self.reference, entry, self.timeout)
            .await?;
        match entry.size_bytes.and_then(|s| usize::try_from(s).ok()) {
            Some(size) if size <= WRITE_BLOCK => {
                self.write_small(entry, response, size, target).await
            }
            _ => self.write_streamed(entry, &mut response, target).await,
        }
    }

    /// An object the listing says is small: its bytes (never more than announced, plus one
    /// chunk) are gathered, then written in one blocking call.
    async fn write_small(
        &self,
        entry: &ObjectEntry,
        mut response: reqwest::Response,
        size: usize,
        target: &Path,
    ) -> Result<u64, DownloadError> {
        let mut bytes = Vec::with_capacity(size);
        while let Some(chunk) = self.chunk(entry, &mut response).await? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() > size {
                break;
            }
        }
        let written = bytes.len() as u64;
        if written != size as u64 {
            return Err(DownloadError::WrongSize {
                object: self.object(entry),
                written,
                expected: size as u64,
            });
        }
        let path = target.to_owned();
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| DownloadError::local("creating", &path, e))?;
            file.write_all(&bytes)
                .map_err(|e| DownloadError::local("writing", &path, e))
        })
        .await
        .map_err(|e| DownloadError::local("writing", target, std::io::Error::other(e)))??;
        Ok(written)
    }

    /// The next chunk of an object's body; `None` at its end.
    async fn chunk(
        &self,
        entry: &ObjectEntry,
        response: &mut reqwest::Response,
    ) -> Result<Option<bytes::Bytes>, DownloadError> {
        response.chunk().await.map_err(|e| DownloadError::BrokeOff {
            object: self.object(entry),
            cause: request_error(e),
        })
    }

    /// A large object (or one of unknown size), streamed to disk in blocks of up to 1 MiB.
    async fn write_streamed(
        &self,
        entry: &ObjectEntry,
        response: &mut reqwest::Response,
        target: &Path,
    ) -> Result<u64, DownloadError> {
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .await
            .map_err(|e| DownloadError::local("creating", target, e))?;
        // Each write to a tokio file is a trip to the blocking pool; the response's chunks
        // are a few KiB, so they are written in blocks of 1 MiB instead.
        let mut file = tokio::io::BufWriter::with_capacity(WRITE_BLOCK, file);
        let written_failed = |e| DownloadError::local("writing", target, e);
        let mut written = 0u64;
        while let Some(chunk) = self.chunk(entry, response).await? {
            written += chunk.len() as u64;
            file.write_all(&chunk).await.map_err(written_failed)?;
        }
        file.flush().await.map_err(written_failed)?;
        if let Some(expected) = entry.size_bytes
            && expected != written
        {
            return Err(DownloadError::WrongSize {
                object: self.object(entry),
                written,
                expected,
            });
        }
        Ok(written)
    }

    fn object(&self, entry: &ObjectEntry) -> ObjectAt {
        ObjectAt {
            repository: self.repository.to_owned(),
            reference: self.reference.to_owned(),
            key: entry.path.clone(),
        }
    }
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
            ..ObjectEntry::default()
        }
    }

    #[test]
    fn the_transfers_take_the_directories_in_turn_and_miss_no_file() {
        let keys = ["a/1", "a/2", "a/3", "b/1", "c/1", "c/2", "top"].map(|k| format!("d/{k}"));
        let planned = plan(&keys.map(|k| entry(&k)), "d").unwrap();
        let order: Vec<String> = by_turns(planned).map(|(local, _)| local).collect();
        assert_eq!(order, ["a/1", "b/1", "c/1", "top", "a/2", "c/2", "a/3"]);
        assert!(by_turns(Vec::new()).next().is_none());
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
        let long_name = format!("data/{}.txt", "n".repeat(296));
        for (bad, why) in [
            (
                "data/../etc/passwd",
                "it has a '..' segment, which would leave the workspace",
            ),
            ("data//x", "it has an empty segment ('//')"),
            ("data/./x", "it has a '.' segment"),
            ("/abs", "it starts with '/': an absolute path"),
            ("C:/x", "it starts with a drive letter ('C:')"),
            (
                "data/C:/x",
                "the part under the prefix starts with a drive letter ('C:')",
            ),
            (
                "data/dir/",
                "it ends in '/': a folder marker object, not a file",
            ),
            (
                "data/a\\b",
                "it contains a backslash ('\\'); workspace paths use '/' separators",
            ),
            ("data/a\0b", "it contains a NUL character"),
            ("", "the key is empty"),
            (
                long_name.as_str(),
                "a segment ('nnnnnnnnnnnn…nnnnnnn.txt') is 300 bytes long, more than the 255 bytes a file or directory name may have",
            ),
        ] {
            let err = plan(&[entry(bad)], "data").unwrap_err().to_string();
            let quoted = clip(bad, QUOTED_MAX);
            assert_eq!(
                err,
                format!("object key '{quoted}' cannot be projected into the workspace: {why}"),
                "{bad:?}"
            );
            assert!(err.chars().count() < 350, "{err}");
        }
        // Hostile keys outside the prefix still fail (the whole key is checked first); long
        // names outside it are simply not part of the workspace.
        assert!(plan(&[entry("other//x")], "data").is_err());
        let long_outside = format!("other/{}", "n".repeat(300));
        assert!(plan(&[entry(&long_outside)], "data").unwrap().is_empty());
        // A name of exactly 255 bytes is a valid file name.
        let max_name = format!("data/{}", "n".repeat(255));
        assert_eq!(plan(&[entry(&max_name)], "data").unwrap().len(), 1);
        let err = plan(&[entry("a"), entry("a/b")], "/")
            .unwrap_err()
            .to_string();
        assert!(err.contains("collide"), "{err}");
    }
}
