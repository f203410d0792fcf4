//! The try/confirm publication: staging branch names, the `perago.*` metadata, the publish
//! fence (the seeds' metadata protocol), staging on the chosen base, and the squash merge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use perago_contract::paths::{PathError, listing_prefix, local_to_object_key};

use crate::attempt::AttemptSnapshot;
use crate::lakefs::{Commit, LakeFsClient, LakeFsError};
use crate::outcome::{QUOTED_MAX, clip};
use crate::workspace::download;
use crate::workspace::input::WorkspaceRef;
use crate::workspace::snapshot::{Kind, Snapshot};

/// Longest first-parent range the fence classifies.
pub const PUBLISH_RANGE: usize = 1024;

/// `[A-Za-z0-9_-]` kept, other runs become `-`, `-`/`_` trimmed; long segments are cut and
/// keep a hash of the whole, so names stay unique and within lakeFS's limits.
fn branch_segment(text: &str) -> String {
    let keep = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let segment = crate::names::sanitized(text, keep, '-', ['-', '_'])
        .unwrap_or_else(|| "unknown".to_owned());
    const MAX: usize = 48;
    if segment.len() <= MAX {
        return segment;
    }
    let digest = Sha256::digest(text.as_bytes());
    let short: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}-{short}", &segment[..MAX - 9])
}

/// `perago-staging-<wf>-<ref>-seq-<seq>-iteration-<i>-task-id-<id>-retry-<n>-exec-<exec>`.
pub fn staging_branch(a: &AttemptSnapshot, execution_id: &str) -> String {
    format!(
        "perago-staging-{}-{}-seq-{}-iteration-{}-task-id-{}-retry-{}-exec-{}",
        branch_segment(&a.workflow_instance_id),
        branch_segment(&a.reference_task_name),
        a.seq,
        a.iteration,
        branch_segment(&a.task_id),
        a.retry_count,
        branch_segment(execution_id)
    )
}

/// The start every staging branch of this workflow step shares, whatever the attempt.
pub fn step_branch_prefix(a: &AttemptSnapshot) -> String {
    format!(
        "perago-staging-{}-{}-seq-",
        branch_segment(&a.workflow_instance_id),
        branch_segment(&a.reference_task_name)
    )
}

/// Whether `name` is a staging branch of an attempt of this workflow step (any retry, any
/// execution): the step's prefix, then `<seq>-iteration-<iteration>-task-id-`. A step whose
/// reference name extends this one's (`build` and `build-seq`) does not match.
pub fn is_step_branch(name: &str, a: &AttemptSnapshot) -> bool {
    let Some(rest) = name.strip_prefix(&step_branch_prefix(a)) else {
        return false;
    };
    let unsigned = rest.strip_prefix('-').unwrap_or(rest);
    let digits = unsigned.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && unsigned[digits..].starts_with(&format!("-iteration-{}-task-id-", a.iteration))
}

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
        .list_branches(repository, &step_branch_prefix(a))
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
        .filter(|n| Some(n.as_str()) != ours && is_step_branch(n, a))
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

/// The try metadata; the confirm metadata adds the staging and fence facts.
pub fn try_metadata(
    a: &AttemptSnapshot,
    ws: &WorkspaceRef,
    prefix: &str,
) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(format!("perago.{k}"), v);
    };
    put("phase", "try".into());
    put("logical_task_key", a.logical_task_key());
    put("workflow_instance_id", a.workflow_instance_id.clone());
    put("task_def_name", a.task_def_name.clone());
    put("reference_task_name", a.reference_task_name.clone());
    put("seq", a.seq.to_string());
    put("iteration", a.iteration.to_string());
    put("input_ref", ws.reference.clone());
    put("target_branch", ws.branch.clone());
    put("prefix", prefix.to_owned());
    put("task_id", a.task_id.clone());
    put("retry_count", a.retry_count.to_string());
    put(
        "retried_task_id",
        a.retried_task_id.clone().unwrap_or_default(),
    );
    m
}

pub fn confirm_metadata(
    try_metadata: &BTreeMap<String, String>,
    staging_branch: &str,
    staging_commit: &str,
    base: &PublishBase,
) -> BTreeMap<String, String> {
    let mut m = try_metadata.clone();
    m.insert("perago.phase".into(), "confirm".into());
    m.insert("perago.staging_branch".into(), staging_branch.into());
    m.insert("perago.staging_commit".into(), staging_commit.into());
    m.insert("perago.expected_head".into(), base.base.clone());
    m.insert(
        "perago.supersedes".into(),
        base.supersedes.clone().unwrap_or_default(),
    );
    m
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
    #[error("{branch} advanced beyond supported publish range ({PUBLISH_RANGE} commits)")]
    BeyondRange { branch: String },
    #[error("{branch} no longer contains workspace input ref {input}")]
    InputGone { branch: String, input: String },
    /// Something other than this logical task's confirm commits is on top of the input ref.
    #[error("{branch} advanced from {input} to {head}")]
    Advanced {
        branch: String,
        input: String,
        head: String,
    },
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
    let reached = history.iter().position(|c| c.id == input_ref);
    let range = match reached {
        Some(i) if i <= PUBLISH_RANGE => &history[..i],
        Some(_) => {
            return Err(FenceError::BeyondRange {
                branch: branch.to_owned(),
            });
        }
        None if history.len() > PUBLISH_RANGE || more => {
            return Err(FenceError::BeyondRange {
                branch: branch.to_owned(),
            });
        }
        None => {
            return Err(FenceError::InputGone {
                branch: branch.to_owned(),
                input: input_ref.to_owned(),
            });
        }
    };
    let same_task = |c: &Commit| super::history::confirm_of(c) == Some(logical_key);
    if range.first().is_some_and(|c| c.id == head) && range.iter().all(same_task) {
        Ok(PublishBase {
            base: head.to_owned(),
            supersedes: Some(head.to_owned()),
        })
    } else {
        Err(FenceError::Advanced {
            branch: branch.to_owned(),
            input: input_ref.to_owned(),
            head: head.to_owned(),
        })
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

/// Compare the workspace with the base's objects under the prefix (`base`: object key →
/// checksum). Symlinks refuse publication. Only objects whose content differs are uploaded.
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
        if base.get(&key) != Some(&item.md5) {
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

/// Apply a plan to the staging branch (deletes, then uploads in parallel).
pub async fn apply(
    client: &LakeFsClient,
    repository: &str,
    staging: &str,
    plan: &StagePlan,
    workspace_dir: &Path,
    parallelism: usize,
    object_timeout: Duration,
) -> Result<(), LakeFsError> {
    client
        .delete_objects(repository, staging, &plan.deletes)
        .await?;
    let mut uploads =
        futures_util::stream::iter(plan.uploads.clone().into_iter().map(|(key, local)| {
            let file = workspace_dir.join(local);
            async move {
                client
                    .upload(repository, staging, &key, &file, object_timeout)
                    .await
                    .map(drop)
            }
        }))
        .buffer_unordered(parallelism.max(1));
    while let Some(done) = uploads.next().await {
        done?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::snapshot::Item;
    use serde_json::json;

    fn attempt(task_id: &str) -> AttemptSnapshot {
        AttemptSnapshot::from_task(&json!({
            "workflowInstanceId": "wf-7f3d", "taskId": task_id, "retryCount": 3, "taskDefName": "features.build",
            "referenceTaskName": "build", "seq": 2, "status": "IN_PROGRESS", "inputData": {}
        }))
        .unwrap()
    }

    #[test]
    fn staging_names_follow_the_reference_and_stay_bounded() {
        assert_eq!(
            staging_branch(&attempt("task/9b4c"), "exec-1"),
            "perago-staging-wf-7f3d-build-seq-2-iteration-0-task-id-task-9b4c-retry-3-exec-exec-1"
        );
        assert_eq!(branch_segment("///"), "unknown");
        assert_eq!(branch_segment("___"), "unknown");
        assert_eq!(branch_segment("exec/42"), "exec-42");
        assert!(
            staging_branch(&attempt("t"), "e").starts_with(&step_branch_prefix(&attempt("other")))
        );
        assert!(is_step_branch(
            &staging_branch(&attempt("t"), "e"),
            &attempt("other")
        ));
        let long = "x".repeat(300);
        let a = branch_segment(&long);
        let b = branch_segment(&format!("{long}y"));
        assert_eq!(a.len(), 48);
        assert_ne!(a, b, "cut segments keep a hash of the whole");
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        );
    }

    #[test]
    fn the_sweep_matches_only_this_steps_branches() {
        let a = attempt("t1");
        let other_step = |reference: &str, iteration: u32| {
            AttemptSnapshot::from_task(&json!({
                "workflowInstanceId": "wf-7f3d", "taskId": "x", "retryCount": 0, "taskDefName": "features.build",
                "referenceTaskName": reference, "seq": 9, "iteration": iteration, "status": "IN_PROGRESS", "inputData": {}
            }))
            .unwrap()
        };
        for (name, ours) in [
            (staging_branch(&attempt("t0"), "e0"), true),
            (staging_branch(&other_step("build", 0), "e1"), true),
            (staging_branch(&other_step("build-seq", 0), "e2"), false),
            (staging_branch(&other_step("build", 1), "e3"), false),
            (staging_branch(&other_step("build2", 0), "e4"), false),
            ("perago-staging-wf-7f3d-build-seq-x".to_owned(), false),
        ] {
            assert_eq!(is_step_branch(&name, &a), ours, "{name}");
        }
    }

    fn commit(id: &str, phase: &str, key: &str) -> Commit {
        let mut metadata = BTreeMap::new();
        if !phase.is_empty() {
            metadata.insert("perago.phase".to_owned(), phase.to_owned());
            metadata.insert("perago.logical_task_key".to_owned(), key.to_owned());
        }
        Commit {
            id: id.into(),
            parents: vec![],
            metadata,
            ..Commit::default()
        }
    }

    #[test]
    fn the_fence_accepts_only_the_seeds_states() {
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
    fn staging_uploads_only_what_differs_and_mirrors_deletes() {
        let item = |p: &str, md5: &str| Item {
            path: p.into(),
            kind: Kind::File,
            digest: String::new(),
            md5: md5.into(),
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
            md5: String::new(),
            size: 0,
        }];
        assert_eq!(
            plan(&link, &base, "data").unwrap_err().to_string(),
            "workspace publication does not support symlinks: l"
        );
    }

    #[test]
    fn metadata_carries_every_key() {
        let a = attempt("t1");
        let ws = WorkspaceRef::parse(
            &json!({"repository": "r", "branch": "main", "refType": "commit", "ref": "A"}),
        )
        .unwrap();
        let t = try_metadata(&a, &ws, "data");
        let c = confirm_metadata(
            &t,
            "perago-staging-x",
            "S",
            &PublishBase {
                base: "A".into(),
                supersedes: None,
            },
        );
        let keys: Vec<&str> = c.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "perago.expected_head",
                "perago.input_ref",
                "perago.iteration",
                "perago.logical_task_key",
                "perago.phase",
                "perago.prefix",
                "perago.reference_task_name",
                "perago.retried_task_id",
                "perago.retry_count",
                "perago.seq",
                "perago.staging_branch",
                "perago.staging_commit",
                "perago.supersedes",
                "perago.target_branch",
                "perago.task_def_name",
                "perago.task_id",
                "perago.workflow_instance_id"
            ]
        );
        assert_eq!(
            (c["perago.phase"].as_str(), t["perago.phase"].as_str()),
            ("confirm", "try")
        );
        assert_eq!(c["perago.supersedes"], "");
        assert_eq!(
            c["perago.logical_task_key"],
            "wf-7f3d:build:0:features.build"
        );
    }
}
