//! What a publication writes into lakeFS commit metadata: the try commit on the staging
//! branch names the attempt, and the confirm commit the squash merge makes on the target
//! branch adds the staging facts and the publish fence's choice. This module is the one
//! place that spells the `perago.*` keys: the sidecar writes them through [`Publication`],
//! and the history walk, the janitor and `kubectl perago` read them through [`Key`].

use std::collections::BTreeMap;

use crate::attempt::AttemptSnapshot;
use crate::reference::WorkspaceRef;

/// One metadata key of a publication's commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    Phase,
    LogicalTaskKey,
    WorkflowInstanceId,
    TaskDefName,
    ReferenceTaskName,
    Seq,
    Iteration,
    InputRef,
    TargetBranch,
    Prefix,
    TaskId,
    RetryCount,
    /// Empty when the attempt is not a retry.
    RetriedTaskId,
    StagingBranch,
    StagingCommit,
    ExpectedHead,
    /// Empty when the publication replaced nothing.
    Supersedes,
    /// The body image as the pod spec names it (a tag may have moved since).
    BodyImage,
    /// The body image as it ran: the kubelet's `imageID` (with its digest). Empty while the
    /// pod's annotation has not reached the sidecar yet.
    BodyImageId,
    PeragoTaskNamespace,
    PeragoTaskName,
    PeragoTaskUid,
    /// The PeragoTask generation whose spec introduced the pod template that ran.
    PeragoTaskGeneration,
    /// The hash of the task contract the sidecar ran (the pod's `perago.io/contract-hash`).
    ContractHash,
    SidecarVersion,
}

impl Key {
    /// What a confirm commit carries; only `supersedes` may be empty.
    pub const CONFIRM: [Key; 11] = [
        Key::LogicalTaskKey,
        Key::WorkflowInstanceId,
        Key::TaskId,
        Key::RetryCount,
        Key::InputRef,
        Key::TargetBranch,
        Key::Prefix,
        Key::StagingBranch,
        Key::StagingCommit,
        Key::ExpectedHead,
        Key::Supersedes,
    ];

    /// The key as it stands in the metadata.
    pub const fn wire(self) -> &'static str {
        match self {
            Key::Phase => "perago.phase",
            Key::LogicalTaskKey => "perago.logical_task_key",
            Key::WorkflowInstanceId => "perago.workflow_instance_id",
            Key::TaskDefName => "perago.task_def_name",
            Key::ReferenceTaskName => "perago.reference_task_name",
            Key::Seq => "perago.seq",
            Key::Iteration => "perago.iteration",
            Key::InputRef => "perago.input_ref",
            Key::TargetBranch => "perago.target_branch",
            Key::Prefix => "perago.prefix",
            Key::TaskId => "perago.task_id",
            Key::RetryCount => "perago.retry_count",
            Key::RetriedTaskId => "perago.retried_task_id",
            Key::StagingBranch => "perago.staging_branch",
            Key::StagingCommit => "perago.staging_commit",
            Key::ExpectedHead => "perago.expected_head",
            Key::Supersedes => "perago.supersedes",
            Key::BodyImage => "perago.body_image",
            Key::BodyImageId => "perago.body_image_id",
            Key::PeragoTaskNamespace => "perago.peragotask_namespace",
            Key::PeragoTaskName => "perago.peragotask_name",
            Key::PeragoTaskUid => "perago.peragotask_uid",
            Key::PeragoTaskGeneration => "perago.peragotask_generation",
            Key::ContractHash => "perago.contract_hash",
            Key::SidecarVersion => "perago.sidecar_version",
        }
    }

    /// The key without its `perago.` prefix, as messages name it.
    pub fn name(self) -> &'static str {
        let wire = self.wire();
        &wire[wire.find('.').map_or(0, |dot| dot + 1)..]
    }

    /// Its value in `metadata`, if set.
    pub fn get(self, metadata: &BTreeMap<String, String>) -> Option<&str> {
        metadata.get(self.wire()).map(String::as_str)
    }
}

/// Which commit of a publication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The staging branch's commit.
    Try,
    /// The squash merge's commit on the target branch.
    Confirm,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Try => "try",
            Phase::Confirm => "confirm",
        }
    }

    /// The phase `metadata` names; `None` for a commit that is not a publication's.
    pub fn of(metadata: &BTreeMap<String, String>) -> Option<Self> {
        match Key::Phase.get(metadata)? {
            "try" => Some(Phase::Try),
            "confirm" => Some(Phase::Confirm),
            _ => None,
        }
    }
}

/// A publication's metadata, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    pub logical_task_key: String,
    pub workflow_instance_id: String,
    pub task_def_name: String,
    pub reference_task_name: String,
    pub seq: i64,
    pub iteration: i64,
    pub input_ref: String,
    pub target_branch: String,
    pub prefix: String,
    pub task_id: String,
    pub retry_count: i64,
    pub retried_task_id: Option<String>,
    /// Which code produced the publication; on both commits.
    pub lineage: Lineage,
    /// Set on the confirm commit.
    pub confirm: Option<Confirmation>,
}

/// Which code produced a publication: the body image as it ran, the PeragoTask and the
/// generation of its spec, the contract and the sidecar. `None` is a fact the writer did not
/// know (its key is absent); every one is `None` on the commits of Python Perago.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lineage {
    /// The body image as the pod spec names it, tag and all.
    pub body_image: Option<String>,
    /// The kubelet's `imageID` of the body container: the digest that ran. `Some("")` while
    /// it is pending (the operator has not annotated the pod yet, or the kubelet has not
    /// refreshed the sidecar's copy of the annotations).
    pub body_image_id: Option<String>,
    pub task_namespace: Option<String>,
    pub task_name: Option<String>,
    pub task_uid: Option<String>,
    pub task_generation: Option<i64>,
    pub contract_hash: Option<String>,
    pub sidecar_version: Option<String>,
}

impl Lineage {
    /// The digest part of the body's image id (`sha256:…`), when it has one.
    pub fn body_digest(&self) -> Option<&str> {
        image_digest(self.body_image_id.as_deref()?)
    }

    /// Whether the body image id is still pending (the writer knew lineage, not the id yet).
    pub fn body_image_pending(&self) -> bool {
        self.body_image_id.as_deref() == Some("")
    }

    /// `namespace/name` of the PeragoTask, when known.
    pub fn task(&self) -> Option<String> {
        match (&self.task_namespace, &self.task_name) {
            (Some(ns), Some(name)) if !name.is_empty() => Some(if ns.is_empty() {
                name.clone()
            } else {
                format!("{ns}/{name}")
            }),
            _ => None,
        }
    }

    fn write(&self, put: &mut impl FnMut(Key, String)) {
        let texts = [
            (Key::BodyImage, &self.body_image),
            (Key::BodyImageId, &self.body_image_id),
            (Key::PeragoTaskNamespace, &self.task_namespace),
            (Key::PeragoTaskName, &self.task_name),
            (Key::PeragoTaskUid, &self.task_uid),
            (Key::ContractHash, &self.contract_hash),
            (Key::SidecarVersion, &self.sidecar_version),
        ];
        for (k, v) in texts {
            if let Some(v) = v {
                put(k, v.clone());
            }
        }
        if let Some(g) = self.task_generation {
            put(Key::PeragoTaskGeneration, g.to_string());
        }
    }

    /// The lineage `metadata` names; nothing is missing from a publication without it.
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Result<Self, MetadataError> {
        let text = |k: Key| k.get(metadata).map(str::to_owned);
        let task_generation = match Key::PeragoTaskGeneration.get(metadata) {
            None => None,
            Some(v) => Some(v.parse().map_err(|_| MetadataError::NotANumber {
                key: Key::PeragoTaskGeneration,
                value: v.to_owned(),
            })?),
        };
        Ok(Self {
            body_image: text(Key::BodyImage),
            body_image_id: text(Key::BodyImageId),
            task_namespace: text(Key::PeragoTaskNamespace),
            task_name: text(Key::PeragoTaskName),
            task_uid: text(Key::PeragoTaskUid),
            task_generation,
            contract_hash: text(Key::ContractHash),
            sidecar_version: text(Key::SidecarVersion),
        })
    }
}

/// The hash of a task contract's text as publications and the operator's
/// `perago.io/contract-hash` pod annotation spell it: the first 16 bytes of its SHA-256, in hex.
pub fn contract_hash(text: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text)
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The digest in an image reference or image id: `sha256:…` after an `@`, or the whole id
/// when it is a bare digest (an image the runtime knows by its configuration digest only).
pub fn image_digest(image: &str) -> Option<&str> {
    let digest = image.rsplit_once('@').map_or(image, |(_, d)| d);
    let (algorithm, hex) = digest.split_once(':')?;
    let hex_ok = !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit());
    let algorithm_ok = !algorithm.is_empty()
        && algorithm
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+._-".contains(c));
    (hex_ok && algorithm_ok && !digest.contains('/')).then_some(digest)
}

/// What the confirm commit adds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confirmation {
    pub staging_branch: String,
    pub staging_commit: String,
    /// The target head the publish fence chose to publish on.
    pub expected_head: String,
    /// The earlier confirm commit of the same logical task this one replaces.
    pub supersedes: Option<String>,
}

/// Why metadata is not a publication's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("not a publication's commit ({} is neither try nor confirm)", Key::Phase.name())]
    NotAPublication,
    #[error("publication metadata lacks {}", .0.iter().map(|k| k.name()).collect::<Vec<_>>().join(", "))]
    Missing(Vec<Key>),
    #[error("publication metadata {} is not a number: {value:?}", .key.name())]
    NotANumber { key: Key, value: String },
}

impl Publication {
    /// The try commit's metadata of attempt `a` publishing `prefix` of workspace `ws`, made
    /// by the code `lineage` names.
    pub fn of_attempt(
        a: &AttemptSnapshot,
        ws: &WorkspaceRef,
        prefix: &str,
        lineage: Lineage,
    ) -> Self {
        Self {
            logical_task_key: a.logical_task_key(),
            workflow_instance_id: a.workflow_instance_id.clone(),
            task_def_name: a.task_def_name.clone(),
            reference_task_name: a.reference_task_name.clone(),
            seq: a.seq,
            iteration: a.iteration,
            input_ref: ws.reference.clone(),
            target_branch: ws.branch.clone(),
            prefix: prefix.to_owned(),
            task_id: a.task_id.clone(),
            retry_count: a.retry_count,
            retried_task_id: a.retried_task_id.clone(),
            lineage,
            confirm: None,
        }
    }

    /// The confirm commit's metadata of this publication.
    pub fn confirmed(&self, confirmation: Confirmation) -> Self {
        Self {
            confirm: Some(confirmation),
            ..self.clone()
        }
    }

    pub fn phase(&self) -> Phase {
        if self.confirm.is_some() {
            Phase::Confirm
        } else {
            Phase::Try
        }
    }

    /// The metadata, every key set (an absent optional value is written empty).
    pub fn to_metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let mut put = |k: Key, v: String| {
            m.insert(k.wire().to_owned(), v);
        };
        put(Key::Phase, self.phase().as_str().to_owned());
        put(Key::LogicalTaskKey, self.logical_task_key.clone());
        put(Key::WorkflowInstanceId, self.workflow_instance_id.clone());
        put(Key::TaskDefName, self.task_def_name.clone());
        put(Key::ReferenceTaskName, self.reference_task_name.clone());
        put(Key::Seq, self.seq.to_string());
        put(Key::Iteration, self.iteration.to_string());
        put(Key::InputRef, self.input_ref.clone());
        put(Key::TargetBranch, self.target_branch.clone());
        put(Key::Prefix, self.prefix.clone());
        put(Key::TaskId, self.task_id.clone());
        put(Key::RetryCount, self.retry_count.to_string());
        put(
            Key::RetriedTaskId,
            self.retried_task_id.clone().unwrap_or_default(),
        );
        if let Some(c) = &self.confirm {
            put(Key::StagingBranch, c.staging_branch.clone());
            put(Key::StagingCommit, c.staging_commit.clone());
            put(Key::ExpectedHead, c.expected_head.clone());
            put(Key::Supersedes, c.supersedes.clone().unwrap_or_default());
        }
        self.lineage.write(&mut put);
        m
    }

    /// The publication `metadata` describes; every missing key is named.
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Result<Self, MetadataError> {
        let phase = Phase::of(metadata).ok_or(MetadataError::NotAPublication)?;
        let mut missing = Vec::new();
        let mut text = |k: Key| {
            k.get(metadata).map(str::to_owned).unwrap_or_else(|| {
                missing.push(k);
                String::new()
            })
        };
        let logical_task_key = text(Key::LogicalTaskKey);
        let workflow_instance_id = text(Key::WorkflowInstanceId);
        let task_def_name = text(Key::TaskDefName);
        let reference_task_name = text(Key::ReferenceTaskName);
        let seq = text(Key::Seq);
        let iteration = text(Key::Iteration);
        let input_ref = text(Key::InputRef);
        let target_branch = text(Key::TargetBranch);
        let prefix = text(Key::Prefix);
        let task_id = text(Key::TaskId);
        let retry_count = text(Key::RetryCount);
        let retried_task_id = text(Key::RetriedTaskId);
        let confirm = (phase == Phase::Confirm).then(|| Confirmation {
            staging_branch: text(Key::StagingBranch),
            staging_commit: text(Key::StagingCommit),
            expected_head: text(Key::ExpectedHead),
            supersedes: Some(text(Key::Supersedes)).filter(|s| !s.is_empty()),
        });
        if !missing.is_empty() {
            return Err(MetadataError::Missing(missing));
        }
        let lineage = Lineage::from_metadata(metadata)?;
        let number = |k: Key, v: String| {
            v.parse()
                .map_err(|_| MetadataError::NotANumber { key: k, value: v })
        };
        Ok(Self {
            logical_task_key,
            workflow_instance_id,
            task_def_name,
            reference_task_name,
            seq: number(Key::Seq, seq)?,
            iteration: number(Key::Iteration, iteration)?,
            input_ref,
            target_branch,
            prefix,
            task_id,
            retry_count: number(Key::RetryCount, retry_count)?,
            retried_task_id: Some(retried_task_id).filter(|s| !s.is_empty()),
            lineage,
            confirm,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn attempt() -> AttemptSnapshot {
        AttemptSnapshot::from_task(&json!({
            "workflowInstanceId": "wf-7f3d", "taskId": "t1", "retryCount": 3, "taskDefName": "features.build",
            "referenceTaskName": "build", "seq": 2, "status": "IN_PROGRESS", "inputData": {}
        }))
        .unwrap()
    }

    /// The wire format, spelled out: Python Perago 0.6.1 and every published commit use it.
    #[test]
    fn the_confirm_commit_carries_every_key() {
        let ws = WorkspaceRef::parse(
            &json!({"repository": "r", "branch": "main", "refType": "commit", "ref": "A"}),
        )
        .unwrap();
        let tried = Publication::of_attempt(&attempt(), &ws, "data", Lineage::default());
        let t = tried.to_metadata();
        let c = tried
            .confirmed(Confirmation {
                staging_branch: "perago-staging-x".into(),
                staging_commit: "S".into(),
                expected_head: "A".into(),
                supersedes: None,
            })
            .to_metadata();
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
        assert_eq!(Key::Supersedes.name(), "supersedes");
    }

    #[test]
    fn missing_and_malformed_metadata_is_named() {
        let mut m = BTreeMap::new();
        assert_eq!(
            Publication::from_metadata(&m),
            Err(MetadataError::NotAPublication)
        );
        m.insert("perago.phase".into(), "confirm".into());
        let err = Publication::from_metadata(&m).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("publication metadata lacks logical_task_key, workflow_instance_id,"),
            "{err}"
        );
        let ws = WorkspaceRef::parse(
            &json!({"repository": "r", "branch": "main", "refType": "commit", "ref": "A"}),
        )
        .unwrap();
        let mut m = Publication::of_attempt(&attempt(), &ws, "", Lineage::default()).to_metadata();
        m.insert("perago.seq".into(), "two".into());
        assert_eq!(
            Publication::from_metadata(&m).unwrap_err().to_string(),
            "publication metadata seq is not a number: \"two\""
        );
    }

    /// Lineage adds its keys beside the Python-compatible ones, only those it knows, and a
    /// pending image id is written empty.
    #[test]
    fn lineage_is_written_beside_the_python_keys_and_read_back() {
        let ws = WorkspaceRef::parse(
            &json!({"repository": "r", "branch": "main", "refType": "commit", "ref": "A"}),
        )
        .unwrap();
        let python = Publication::of_attempt(&attempt(), &ws, "data", Lineage::default());
        let lineage = Lineage {
            body_image: Some("registry.local/body:1".into()),
            body_image_id: Some("registry.local/body@sha256:0a1b".into()),
            task_namespace: Some("team".into()),
            task_name: Some("t".into()),
            task_uid: Some("5f0c".into()),
            task_generation: Some(7),
            contract_hash: Some("c0ffee".into()),
            sidecar_version: Some("0.1.0".into()),
        };
        let ours = Publication::of_attempt(&attempt(), &ws, "data", lineage.clone()).to_metadata();
        let mut added: Vec<(&str, &str)> = ours
            .iter()
            .filter(|(k, _)| !python.to_metadata().contains_key(*k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        added.sort();
        assert_eq!(
            added,
            [
                ("perago.body_image", "registry.local/body:1"),
                ("perago.body_image_id", "registry.local/body@sha256:0a1b"),
                ("perago.contract_hash", "c0ffee"),
                ("perago.peragotask_generation", "7"),
                ("perago.peragotask_name", "t"),
                ("perago.peragotask_namespace", "team"),
                ("perago.peragotask_uid", "5f0c"),
                ("perago.sidecar_version", "0.1.0"),
            ]
        );
        for (k, v) in python.to_metadata() {
            assert_eq!(ours[&k], v, "{k} keeps its value");
        }
        let back = Publication::from_metadata(&ours).unwrap();
        assert_eq!(back.lineage, lineage);
        assert_eq!(back.lineage.body_digest(), Some("sha256:0a1b"));
        assert_eq!(back.lineage.task().as_deref(), Some("team/t"));
        assert_eq!(
            Publication::from_metadata(&python.to_metadata())
                .unwrap()
                .lineage,
            Lineage::default(),
            "a Python commit has no lineage"
        );
        let pending = Lineage {
            body_image_id: Some(String::new()),
            ..Lineage::default()
        };
        let m = Publication::of_attempt(&attempt(), &ws, "data", pending).to_metadata();
        assert_eq!(m["perago.body_image_id"], "");
        let back = Publication::from_metadata(&m).unwrap().lineage;
        assert!(back.body_image_pending());
        assert_eq!(back.body_digest(), None);
        let mut bad = ours.clone();
        bad.insert("perago.peragotask_generation".into(), "x".into());
        assert_eq!(
            Publication::from_metadata(&bad).unwrap_err().to_string(),
            "publication metadata peragotask_generation is not a number: \"x\""
        );
    }

    #[test]
    fn image_digests_are_found_in_ids_and_references() {
        let d = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        assert_eq!(
            image_digest(&format!("registry.local:5000/body@{d}")),
            Some(d)
        );
        assert_eq!(image_digest(d), Some(d));
        assert_eq!(image_digest("registry.local:5000/body:1"), None);
        assert_eq!(image_digest("body"), None);
        assert_eq!(image_digest("docker.io/library/body@sha256:"), None);
        assert_eq!(image_digest(""), None);
    }

    fn optional() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(".{1,40}")
    }

    prop_compose! {
        fn confirmation()(
            staging_branch in ".{0,40}", staging_commit in "[0-9a-f]{0,64}",
            expected_head in "[0-9a-f]{0,64}", supersedes in optional(),
        ) -> Confirmation {
            Confirmation { staging_branch, staging_commit, expected_head, supersedes }
        }
    }

    fn maybe() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(".{0,40}")
    }

    prop_compose! {
        fn lineage()(
            body_image in maybe(), body_image_id in maybe(), task_namespace in maybe(),
            task_name in maybe(), task_uid in maybe(),
            task_generation in proptest::option::of(any::<i64>()),
            contract_hash in maybe(), sidecar_version in maybe(),
        ) -> Lineage {
            Lineage {
                body_image, body_image_id, task_namespace, task_name, task_uid,
                task_generation, contract_hash, sidecar_version,
            }
        }
    }

    prop_compose! {
        fn publication()(
            texts in proptest::collection::vec(".{0,40}", 9),
            numbers in proptest::array::uniform3(any::<i64>()),
            retried_task_id in optional(),
            lineage in lineage(),
            confirm in proptest::option::of(confirmation()),
        ) -> Publication {
            let [seq, iteration, retry_count] = numbers;
            let mut texts = texts.into_iter();
            let mut text = || texts.next().unwrap_or_default();
            Publication {
                logical_task_key: text(), workflow_instance_id: text(), task_def_name: text(),
                reference_task_name: text(), seq, iteration, input_ref: text(),
                target_branch: text(), prefix: text(), task_id: text(), retry_count,
                retried_task_id, lineage, confirm,
            }
        }
    }

    proptest! {
        #[test]
        fn metadata_parses_back_to_its_publication(p in publication()) {
            let metadata = p.to_metadata();
            prop_assert!(metadata.keys().all(|k| k.starts_with("perago.")));
            prop_assert_eq!(Phase::of(&metadata), Some(p.phase()));
            prop_assert_eq!(Publication::from_metadata(&metadata), Ok(p));
        }
    }
}
