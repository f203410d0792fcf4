//! The try/confirm publication: the sweep of a step's leftover staging branches, the publish
//! fence (which base the publication goes on), staging on that base, and the squash merge.
//! What the branches are called and what the commits carry is `perago_workspace`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;

use perago_contract::paths::{PathError, listing_prefix, local_to_object_key};

use perago_contract::text::{QUOTED_MAX, clip};
use perago_lakefs::{Commit, LakeFsClient, LakeFsError, ObjectEntry};
use perago_workspace::attempt::AttemptSnapshot;
use perago_workspace::history::confirm_of;
use perago_workspace::reference::WorkspaceRef;
use perago_workspace::refusal::FenceRefusal;
use perago_workspace::staging;

use crate::workspace::download;
use crate::workspace::snapshot::{self, Kind, Snapshot};

/// Longest first-parent range the fence classifies.
pub const PUBLISH_RANGE: usize = 1024;

/// Delete the staging branches earlier attempts of this step left behind (a crash between
/// stage and cleanup), all but `ours`. Called whenever an attempt of the step completes: by
/// then those attempts are over. Every removal is logged with the branch name, and so is every
/// branch that cannot be removed; errors are never returned. Returns how many were removed.
pub async fn sweep_step_branches(
    client: &LakeFsClient,
    repository: &str,
    a: &AttemptSnapshot,
    ours: Option<&str>,
) -> usize {
    let names = match client
        .list_branches(repository, &staging::step_prefix(a))
        .await
    {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "listing leftover staging branches failed; they stay until an attempt of this step completes again");
            return 0;
        }
    };
    let mut removed = 0;
    for name in names
        .iter()
        .filter(|n| Some(n.as_str()) != ours && staging::is_step_branch(n, a))
    {
        match client.delete_branch(repository, name).await {
            Ok(()) => {
                removed += 1;
                tracing::info!(staging_branch = %name, "removed a staging branch an earlier attempt of this step left behind");
            }
            Err(e) => {
                tracing::warn!(staging_branch = %name, error = %e, "failed to clean staging workspace an earlier attempt of this step left behind")
            }
        }
    }
    removed
}

/// Where the publication goes on top of, as the fence chose it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishBase {
    pub base: String,
    pub supersedes: Option<String>,
}

/// Why the publish fence cannot explain the target branch's history since the input ref.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error(transparent)]
    LakeFs(#[from] LakeFsError),
    /// [`FenceRefusal::BeyondRange`], [`FenceRefusal::InputGone`] or
    /// [`FenceRefusal::Advanced`] (something other than this logical task's confirm commits
    /// is on top of the input ref); the no-op refusal, [`FenceRefusal::NoOpMoved`], when
    /// nothing changed.
    #[error(transparent)]
    Refused(FenceRefusal),
}

/// Why the workspace could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    LakeFs(#[from] LakeFsError),
    #[error("workspace publication does not support symlinks: {path}")]
    Symlink { path: String },
    #[error("workspace path '{}' cannot be published: {cause}", clip(.path, QUOTED_MAX))]
    Unpublishable { path: String, cause: PathError },
    #[error(
        "workspace path '{path}' cannot be published: {} is reserved for lakeFS actions",
        download::ACTIONS_DIR
    )]
    Reserved { path: String },
}

/// Classify the first-parent history from head `head` (newest first, as lakeFS returns it,
/// stopping at the input ref inclusive). `more` says lakeFS had more commits to give.
pub fn classify(
    branch: &str,
    input_ref: &str,
    head: &str,
    history: &[Commit],
    more: bool,
    logical_key: &str,
) -> Result<PublishBase, FenceError> {
    if head == input_ref {
        return Ok(PublishBase {
            base: input_ref.to_owned(),
            supersedes: None,
        });
    }
    let beyond_range = || {
        FenceError::Refused(FenceRefusal::BeyondRange {
            branch: branch.to_owned(),
            commits: PUBLISH_RANGE,
        })
    };
    let reached = history.iter().position(|c| c.id == input_ref);
    let range = match reached {
        Some(i) if i <= PUBLISH_RANGE => &history[..i],
        Some(_) => return Err(beyond_range()),
        None if history.len() > PUBLISH_RANGE || more => return Err(beyond_range()),
        None => {
            return Err(FenceError::Refused(FenceRefusal::InputGone {
                branch: branch.to_owned(),
                input: input_ref.to_owned(),
            }));
        }
    };
    let same_task = |c: &Commit| confirm_of(c) == Some(logical_key);
    if range.first().is_some_and(|c| c.id == head) && range.iter().all(same_task) {
        Ok(PublishBase {
            base: head.to_owned(),
            supersedes: Some(head.to_owned()),
        })
    } else {
        Err(FenceError::Refused(FenceRefusal::Advanced {
            branch: branch.to_owned(),
            input: input_ref.to_owned(),
            head: head.to_owned(),
        }))
    }
}

/// Read the target head and run the publish fence.
pub async fn publish_fence(
    client: &LakeFsClient,
    ws: &WorkspaceRef,
    logical_key: &str,
) -> Result<PublishBase, FenceError> {
    let head = client.branch_head(&ws.repository, &ws.branch).await?;
    if head == ws.reference {
        return classify(&ws.branch, &ws.reference, &head, &[], false, logical_key);
    }
    // The range, plus the input ref itself, plus one to tell "over the bound" apart.
    let (history, more) = client
        .first_parent_log(&ws.repository, &head, &ws.reference, PUBLISH_RANGE + 2)
        .await?;
    classify(
        &ws.branch,
        &ws.reference,
        &head,
        &history,
        more,
        logical_key,
    )
}

/// What staging must change on the base to mirror the workspace.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StagePlan {
    /// (object key, local relative path)
    pub uploads: Vec<(String, String)>,
    pub deletes: Vec<String>,
    pub upload_bytes: u64,
}

impl StagePlan {
    /// Nothing to change: the base already holds the workspace.
    pub fn is_empty(&self) -> bool {
        self.uploads.is_empty() && self.deletes.is_empty()
    }
}

/// Compare the workspace with the base's objects under the prefix (`base`: object key →
/// checksum). Symlinks refuse publication. Only objects whose content differs are uploaded,
/// and every unread file (its digest is known once its upload has read it).
pub fn plan(
    workspace: &Snapshot,
    base: &BTreeMap<String, String>,
    prefix: &str,
) -> Result<StagePlan, StageError> {
    let mut plan = StagePlan::default();
    let mut local_keys = BTreeSet::new();
    for item in workspace {
        if item.kind == Kind::Symlink {
            return Err(StageError::Symlink {
                path: item.path.clone(),
            });
        }
        let key =
            local_to_object_key(&item.path, prefix).map_err(|cause| StageError::Unpublishable {
                path: item.path.clone(),
                cause,
            })?;
        if download::is_reserved(&key, prefix) {
            return Err(StageError::Reserved {
                path: item.path.clone(),
            });
        }
        if base.get(&key) != Some(&item.digest) {
            plan.uploads.push((key.clone(), item.path.clone()));
            plan.upload_bytes += item.size;
        }
        local_keys.insert(key);
    }
    plan.deletes = base
        .keys()
        .filter(|k| !local_keys.contains(*k))
        .cloned()
        .collect();
    Ok(plan)
}

/// The base's visible objects under the prefix: object key → checksum.
pub async fn base_objects(
    client: &LakeFsClient,
    repository: &str,
    base: &str,
    prefix: &str,
) -> Result<BTreeMap<String, String>, LakeFsError> {
    let entries = client
        .list_objects(repository, base, listing_prefix(prefix))
        .await?;
    let mut out = BTreeMap::new();
    for e in entries {
        // Keys outside the prefix, marker files and keys the projection refuses are never
        // touched by the mirror.
        if download::is_reserved(&e.path, prefix) {
            continue;
        }
        if let Ok(Some(_)) = download::project(&e.path, prefix) {
            out.insert(e.path, e.checksum);
        }
    }
    Ok(out)
}

/// What lakeFS recorded for each upload of a plan: local relative path → its object.
pub type Uploaded = BTreeMap<String, ObjectEntry>;

/// Apply a plan to the staging branch (deletes, then uploads in parallel).
pub async fn apply(
    client: &LakeFsClient,
    repository: &str,
    staging: &str,
    plan: &StagePlan,
    workspace_dir: &Path,
    parallelism: usize,
    object_timeout: Duration,
) -> Result<Uploaded, LakeFsError> {
    client
        .delete_objects(repository, staging, &plan.deletes)
        .await?;
    let mut uploads =
        // Owned keys: a stream of futures borrowing the plan is not `Send` to the compiler.
        futures_util::stream::iter(plan.uploads.clone().into_iter().map(|(key, local)| {
            let file = workspace_dir.join(&local);
            async move {
                let entry = client
                    .upload(repository, staging, &key, &file, object_timeout)
                    .await?;
                Ok::<_, LakeFsError>((local, entry))
            }
        }))
        .buffer_unordered(parallelism.max(1));
    let mut uploaded = Uploaded::new();
    while let Some(done) = uploads.next().await {
        let (local, entry) = done?;
        uploaded.insert(local, entry);
    }
    Ok(uploaded)
}

/// Give each unread file of `workspace` the digest and size of the bytes its upload sent,
/// as lakeFS recorded them. A file whose checksum is not an MD5 stays unread.
pub fn read_from_uploads(workspace: &mut Snapshot, uploaded: &Uploaded) {
    for item in workspace.iter_mut().filter(|i| i.is_unread()) {
        let Some(entry) = uploaded.get(&item.path) else {
            continue;
        };
        if snapshot::is_md5(&entry.checksum) {
            item.digest.clone_from(&entry.checksum);
            item.size = entry.size_bytes.unwrap_or(item.size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::snapshot::Item;
    use perago_workspace::publication::Key;

    fn commit(id: &str, phase: &str, key: &str) -> Commit {
        let mut metadata = BTreeMap::new();
        if !phase.is_empty() {
            metadata.insert(Key::Phase.wire().to_owned(), phase.to_owned());
            metadata.insert(Key::LogicalTaskKey.wire().to_owned(), key.to_owned());
        }
        Commit {
            id: id.into(),
            parents: vec![],
            metadata,
            ..Commit::default()
        }
    }

    #[test]
    fn the_fence_accepts_only_the_two_designed_states() {
        let k = "wf:build:0:features.build";
        assert_eq!(
            classify("main", "A", "A", &[], false, k).unwrap(),
            PublishBase {
                base: "A".into(),
                supersedes: None
            }
        );
        let chain = [
            commit("H2", "confirm", k),
            commit("H1", "confirm", k),
            commit("A", "", ""),
        ];
        assert_eq!(
            classify("main", "A", "H2", &chain, false, k).unwrap(),
            PublishBase {
                base: "H2".into(),
                supersedes: Some("H2".into())
            }
        );
        let foreign = [commit("H", "confirm", "other"), commit("A", "", "")];
        assert_eq!(
            classify("main", "A", "H", &foreign, false, k)
                .unwrap_err()
                .to_string(),
            "main advanced from A to H"
        );
        let mixed = [
            commit("H2", "confirm", k),
            commit("H1", "", ""),
            commit("A", "", ""),
        ];
        assert_eq!(
            classify("main", "A", "H2", &mixed, false, k)
                .unwrap_err()
                .to_string(),
            "main advanced from A to H2"
        );
        let try_commit = [commit("H", "try", k), commit("A", "", "")];
        assert!(
            classify("main", "A", "H", &try_commit, false, k).is_err(),
            "only confirm commits count"
        );
        let lost = [commit("H", "confirm", k), commit("root", "", "")];
        assert_eq!(
            classify("main", "A", "H", &lost, false, k)
                .unwrap_err()
                .to_string(),
            "main no longer contains workspace input ref A"
        );
        let mut long: Vec<Commit> = (0..=PUBLISH_RANGE)
            .map(|i| commit(&format!("C{i}"), "confirm", k))
            .collect();
        long.push(commit("A", "", ""));
        assert_eq!(
            classify("main", "A", "C0", &long, false, k)
                .unwrap_err()
                .to_string(),
            "main advanced beyond supported publish range (1024 commits)"
        );
        long.remove(0);
        assert!(
            classify("main", "A", "C1", &long, false, k).is_ok(),
            "exactly 1024 is within range"
        );
        assert!(
            classify("main", "A", "C1", &long[..10], true, k)
                .unwrap_err()
                .to_string()
                .contains("beyond")
        );
    }

    #[test]
    fn an_unread_file_is_uploaded_and_then_known_by_its_checksum() {
        let unread = Item {
            path: "big".into(),
            kind: Kind::File,
            digest: String::new(),
            size: 10,
        };
        let same = "0123456789abcdef0123456789abcdef";
        let base = BTreeMap::from([("data/big".to_owned(), same.to_owned())]);
        let mut workspace = vec![unread.clone()];
        assert_eq!(plan(&workspace, &base, "data").unwrap().uploads.len(), 1);
        let entry = |checksum: &str| ObjectEntry {
            checksum: checksum.into(),
            size_bytes: Some(12),
            ..ObjectEntry::default()
        };
        // A checksum that is not an MD5 says nothing of the bytes.
        read_from_uploads(
            &mut workspace,
            &Uploaded::from([("big".to_owned(), entry("etag-2"))]),
        );
        assert!(workspace[0].is_unread());
        read_from_uploads(
            &mut workspace,
            &Uploaded::from([("big".to_owned(), entry(same))]),
        );
        assert_eq!(
            (workspace[0].digest.as_str(), workspace[0].size),
            (same, 12)
        );
        assert!(plan(&workspace, &base, "data").unwrap().is_empty());
    }

    #[test]
    fn staging_uploads_only_what_differs_and_mirrors_deletes() {
        let item = |p: &str, md5: &str| Item {
            path: p.into(),
            kind: Kind::File,
            digest: md5.into(),
            size: 10,
        };
        let workspace = vec![
            item("a.txt", "m1"),
            item("b.txt", "m2-new"),
            item("new.txt", "m3"),
        ];
        let base = BTreeMap::from([
            ("data/a.txt".to_owned(), "m1".to_owned()),
            ("data/b.txt".to_owned(), "m2".to_owned()),
            ("data/gone.txt".to_owned(), "m4".to_owned()),
        ]);
        let p = plan(&workspace, &base, "data").unwrap();
        assert_eq!(
            p.uploads,
            [
                ("data/b.txt".to_owned(), "b.txt".to_owned()),
                ("data/new.txt".to_owned(), "new.txt".to_owned())
            ]
        );
        assert_eq!(p.deletes, ["data/gone.txt"]);
        assert_eq!(p.upload_bytes, 20);
        let link = vec![Item {
            path: "l".into(),
            kind: Kind::Symlink,
            digest: "a".into(),
            size: 0,
        }];
        assert_eq!(
            plan(&link, &base, "data").unwrap_err().to_string(),
            "workspace publication does not support symlinks: l"
        );
    }
}
