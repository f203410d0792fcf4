//! Which code produced a publication (ADR 0042): what the operator fixed in the pod
//! template (the PeragoTask, the generation of its spec, the body image as named), what the
//! sidecar knows of itself (the contract it runs, its version), and the digest of the body
//! image as it runs, which the operator writes into a pod annotation once the kubelet reports
//! it and the kubelet projects into a file of the sidecar. That file is read at each
//! publication; until the annotation is there the image id is written empty (pending), and
//! no attempt ever waits for it.

use std::path::PathBuf;

use tracing::debug;

use perago_contract::pod_info::{BODY_IMAGE_ID_ANNOTATION, parse_annotations};
use perago_workspace::publication::{Lineage, contract_hash};

/// Where each publication's lineage comes from.
#[derive(Clone, Debug, Default)]
pub struct LineageSource {
    /// Every fact but the body image id.
    fixed: Lineage,
    /// The pod's annotations as the kubelet projects them; `None` outside a pod that has
    /// them (`perago-sidecar local` without the setting): the image id is then left out.
    annotations: Option<PathBuf>,
}

/// What the operator sets in the sidecar's environment (see [`crate::config::Settings`]).
#[derive(Clone, Debug, Default)]
pub struct PodFacts {
    pub annotations: Option<PathBuf>,
    pub task_namespace: Option<String>,
    pub task_name: Option<String>,
    pub task_uid: Option<String>,
    pub task_generation: Option<i64>,
    pub body_image: Option<String>,
}

impl LineageSource {
    pub fn new(pod: PodFacts, contract_text: &[u8]) -> Self {
        let nonempty = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        Self {
            fixed: Lineage {
                body_image: nonempty(pod.body_image),
                body_image_id: None,
                task_namespace: nonempty(pod.task_namespace),
                task_name: nonempty(pod.task_name),
                task_uid: nonempty(pod.task_uid),
                task_generation: pod.task_generation,
                contract_hash: Some(contract_hash(contract_text)),
                sidecar_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            },
            annotations: pod.annotations,
        }
    }

    /// The lineage of a publication now. A missing or unreadable annotations file, or one
    /// without the image id yet, gives a pending (empty) image id.
    pub async fn read(&self) -> Lineage {
        let Some(path) = &self.annotations else {
            return self.fixed.clone();
        };
        let image_id = match tokio::fs::read_to_string(path).await {
            Ok(text) => parse_annotations(&text)
                .remove(BODY_IMAGE_ID_ANNOTATION)
                .unwrap_or_default(),
            Err(e) => {
                debug!(path = %path.display(), error = %e, "the pod's annotations are not readable; the body image id is pending");
                String::new()
            }
        };
        Lineage {
            body_image_id: Some(image_id.trim().to_owned()),
            ..self.fixed.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn facts(annotations: Option<PathBuf>) -> PodFacts {
        PodFacts {
            annotations,
            task_namespace: Some("team".into()),
            task_name: Some("t".into()),
            task_uid: Some("u".into()),
            task_generation: Some(3),
            body_image: Some(" ".into()),
        }
    }

    #[tokio::test]
    async fn the_image_id_is_pending_until_the_annotation_is_projected() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("annotations");
        let source = LineageSource::new(facts(Some(file.clone())), b"{}");
        let pending = source.read().await;
        assert_eq!(pending.body_image_id.as_deref(), Some(""), "no file yet");
        assert_eq!(pending.body_image, None, "a blank setting is no fact");
        assert_eq!(pending.task().as_deref(), Some("team/t"));
        assert_eq!(pending.task_generation, Some(3));
        assert_eq!(
            pending.contract_hash.as_deref(),
            Some("44136fa355b3678a1146ad16f7e8649e"),
            "the first half of the SHA-256 of the contract's text"
        );
        std::fs::write(&file, "perago.io/contract-hash=\"x\"").unwrap();
        assert_eq!(source.read().await.body_image_id.as_deref(), Some(""));
        std::fs::write(
            &file,
            "perago.io/body-image-id=\"r/body@sha256:00ff\"\nperago.io/contract-hash=\"x\"",
        )
        .unwrap();
        let known = source.read().await;
        assert_eq!(known.body_digest(), Some("sha256:00ff"));
        let outside = LineageSource::new(facts(None), b"{}").read().await;
        assert_eq!(outside.body_image_id, None, "no pod, no key");
    }
}
