//! What the operator does so that each publication names the code that produced it
//! (ADR 0042), beside what the pod template carries (`render::pod_info`):
//!
//! - The body image as it runs, by digest: the kubelet reports it as the body container's
//!   `imageID` once the container starts; [`body_image_id_patch`] copies it into the pod's
//!   `perago.io/body-image-id` annotation, which the kubelet projects into the sidecar's
//!   downward-API file. Driven by the pod watch, so it follows a start (or a restart on a
//!   moved tag) within a watch event.
//! - The PeragoTask generation: every spec change bumps it, a replicas change (the
//!   autoscaler's `/scale` writes) included, so the pod template cannot carry the current
//!   one without rolling every pod on each scale. [`pin_generation`] keeps the generation
//!   that introduced the template instead: the Deployment records the template's hash and
//!   that generation, and a render whose template hash is unchanged keeps the recorded one.
//!   The operator remembers what it last applied too, so a reconcile that runs before the
//!   watch shows its own apply does not take the current generation for a new template.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::render::GENERATION_ENV;
use perago_api::pod::BODY_IMAGE_ID_ANNOTATION;

/// On the Deployment: the hash of its pod template (the generation variable left out)…
pub const TEMPLATE_HASH_ANNOTATION: &str = "perago.io/template-hash";
/// …and the PeragoTask generation that introduced that template.
pub const TEMPLATE_GENERATION_ANNOTATION: &str = "perago.io/template-generation";

/// The body container's name in every executor pod.
const BODY: &str = "body";

/// The template hash and generation a Deployment records, when it records both.
pub fn recorded(d: &Deployment) -> Option<(String, String)> {
    let a = d.metadata.annotations.as_ref()?;
    let hash = a.get(TEMPLATE_HASH_ANNOTATION)?;
    let generation = a.get(TEMPLATE_GENERATION_ANNOTATION)?;
    generation
        .parse::<i64>()
        .is_ok()
        .then(|| (hash.clone(), generation.clone()))
}

/// Keep the generation in `rendered`'s template at the one that introduced the template when
/// `recorded` (the template hash and generation this process last applied, else the ones the
/// watched Deployment carries) is of the same template; record the template's hash and
/// generation on `rendered` either way. A render without the generation variable (a task that
/// never publishes, an offline render) is left as it is.
pub fn pin_generation(rendered: &mut Deployment, recorded: Option<(String, String)>) {
    let Some(current) = generation_env(rendered).and_then(|v| v.clone()) else {
        return;
    };
    let Some(hash) = template_hash(rendered) else {
        return;
    };
    let generation = recorded
        .filter(|(h, _)| *h == hash)
        .map_or(current, |(_, g)| g);
    if let Some(value) = generation_env(rendered) {
        *value = Some(generation.clone());
    }
    let annotations = rendered.metadata.annotations.get_or_insert_default();
    annotations.insert(TEMPLATE_HASH_ANNOTATION.into(), hash);
    annotations.insert(TEMPLATE_GENERATION_ANNOTATION.into(), generation);
}

/// The value of the sidecar's generation variable in `d`'s template.
fn generation_env(d: &mut Deployment) -> Option<&mut Option<String>> {
    let spec = d.spec.as_mut()?.template.spec.as_mut()?;
    spec.init_containers
        .iter_mut()
        .flatten()
        .flat_map(|c| c.env.iter_mut().flatten())
        .find(|e| e.name == GENERATION_ENV)
        .map(|e| &mut e.value)
}

/// The hash of `d`'s pod template with the generation variable blanked.
pub fn template_hash(d: &Deployment) -> Option<String> {
    let mut blank = d.clone();
    if let Some(value) = generation_env(&mut blank) {
        *value = None;
    }
    let template = serde_json::to_vec(&blank.spec?.template).ok()?;
    Some(
        Sha256::digest(template)
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// The body container's `imageID` as the kubelet reports it, once it does.
pub fn body_image_id(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == BODY)
        .map(|c| c.image_id.as_str())
        .filter(|id| !id.is_empty())
}

/// The merge patch that brings `pod`'s annotation up to the body's reported image id; `None`
/// while the kubelet has not reported one, when the annotation already says it, or for a pod
/// that is going.
pub fn body_image_id_patch(pod: &Pod) -> Option<Value> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let id = body_image_id(pod)?;
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BODY_IMAGE_ID_ANNOTATION));
    (annotated.map(String::as_str) != Some(id))
        .then(|| json!({"metadata": {"annotations": {BODY_IMAGE_ID_ANNOTATION: id}}}))
}

/// Copy `pod`'s body image id into its annotation when it is not there yet, in the
/// background: the pod watch never waits for the write, and a write that fails is tried again
/// at the pod's next change.
pub fn annotate_body_image_id(client: &kube::Client, pod: &Pod) {
    use kube::api::{Api, Patch, PatchParams};
    let (Some(patch), Some(ns), Some(name)) = (
        body_image_id_patch(pod),
        pod.metadata.namespace.clone(),
        pod.metadata.name.clone(),
    ) else {
        return;
    };
    let api = Api::<Pod>::namespaced(client.clone(), &ns);
    tokio::spawn(async move {
        match api
            .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => tracing::debug!(pod = %name, namespace = %ns, "annotated the body image id"),
            Err(e) => tracing::warn!(pod = %name, namespace = %ns, error = %e,
                "annotating the body image id failed; publications say it is pending"),
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::render;

    fn task(generation: i64, replicas: i32, image: &str) -> perago_api::PeragoTask {
        let mut t = crate::fixtures::task(
            "{name: t, namespace: team, uid: 5f0c}",
            &format!(
                "{{taskName: features.build, ownerEmail: o@example.com, workspace: {{prefix: /data}}, \
                 paramsSchema: {{type: object}}, resultSchema: {{type: object}}, \
                 executor: {{replicas: {replicas}, body: {{image: \"{image}\", command: [run]}}}}}}"
            ),
        );
        t.metadata.generation = Some(generation);
        t
    }

    fn render(t: &perago_api::PeragoTask, live: Option<&Deployment>) -> Deployment {
        let contract = perago_api::contract::render(&t.spec).unwrap();
        let replicas = t.spec.executor.replicas;
        let mut d = render::deployment(t, &contract, &crate::fixtures::defaults(), replicas);
        pin_generation(&mut d, live.and_then(recorded));
        d
    }

    fn env(d: &Deployment, name: &str) -> Option<String> {
        let spec = d.spec.as_ref()?.template.spec.as_ref()?;
        spec.init_containers
            .iter()
            .flatten()
            .flat_map(|c| c.env.iter().flatten())
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    }

    /// A replicas change bumps the generation but keeps the template, so the pods do not
    /// roll and keep naming the generation that introduced their template; a new image does
    /// roll them, and they name the new generation.
    #[test]
    fn the_generation_changes_the_template_only_with_the_template() {
        let first = render(&task(1, 1, "body:1"), None);
        assert_eq!(env(&first, GENERATION_ENV).as_deref(), Some("1"));
        assert_eq!(env(&first, "PERAGO_TASK_UID").as_deref(), Some("5f0c"));
        assert_eq!(
            env(&first, "PERAGO_TASK_NAMESPACE").as_deref(),
            Some("team")
        );
        assert_eq!(env(&first, "PERAGO_BODY_IMAGE").as_deref(), Some("body:1"));
        let pod = first.spec.as_ref().unwrap().template.spec.clone().unwrap();
        let info = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "perago-pod-info")
            .unwrap();
        let items = info.downward_api.as_ref().unwrap().items.clone().unwrap();
        assert_eq!(
            (
                items[0].path.as_str(),
                items[0].field_ref.as_ref().unwrap().field_path.as_str()
            ),
            ("annotations", "metadata.annotations")
        );
        let sidecar = &pod.init_containers.as_ref().unwrap()[0];
        assert!(
            sidecar
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "perago-pod-info"
                    && m.mount_path == "/etc/perago-pod"
                    && m.read_only == Some(true))
        );
        assert!(
            pod.containers[0]
                .volume_mounts
                .iter()
                .flatten()
                .all(|m| m.name != "perago-pod-info"),
            "the sidecar's alone"
        );
        assert_eq!(
            env(&first, "PERAGO_POD_ANNOTATIONS").as_deref(),
            Some("/etc/perago-pod/annotations")
        );
        let recorded = first.metadata.annotations.clone().unwrap();
        assert_eq!(recorded[TEMPLATE_GENERATION_ANNOTATION], "1");

        let scaled = render(&task(2, 3, "body:1"), Some(&first));
        assert_eq!(
            scaled.spec.as_ref().unwrap().template,
            first.spec.as_ref().unwrap().template,
            "a replicas change rolls no pod"
        );
        assert_eq!(scaled.metadata.annotations, first.metadata.annotations);

        let moved = render(&task(3, 3, "body:2"), Some(&scaled));
        assert_eq!(env(&moved, GENERATION_ENV).as_deref(), Some("3"));
        let annotations = moved.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[TEMPLATE_GENERATION_ANNOTATION], "3");
        assert_ne!(
            annotations[TEMPLATE_HASH_ANNOTATION],
            recorded[TEMPLATE_HASH_ANNOTATION]
        );
        // The operator restarted, or the watch lost the Deployment: the current generation.
        let unknown = render(&task(4, 3, "body:2"), None);
        assert_eq!(env(&unknown, GENERATION_ENV).as_deref(), Some("4"));
    }

    #[test]
    fn the_body_image_id_is_copied_once_the_kubelet_reports_it() {
        let pod = |annotations: Value, id: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "t-1", "annotations": annotations},
                "status": {"containerStatuses": [
                    {"name": "body", "image": "body:1", "imageID": id, "ready": true, "restartCount": 0},
                ]},
            }))
            .unwrap()
        };
        let id = "registry.local/body@sha256:00ff";
        assert_eq!(
            body_image_id_patch(&pod(json!({}), "")),
            None,
            "not started"
        );
        assert_eq!(
            body_image_id_patch(&pod(json!({}), id)).unwrap(),
            json!({"metadata": {"annotations": {"perago.io/body-image-id": id}}})
        );
        assert_eq!(
            body_image_id_patch(&pod(json!({"perago.io/body-image-id": id}), id)),
            None
        );
        let moved = "registry.local/body@sha256:11ee";
        assert!(
            body_image_id_patch(&pod(json!({"perago.io/body-image-id": id}), moved)).is_some(),
            "a restart that pulled a moved tag"
        );
        let mut going = pod(json!({}), id);
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert_eq!(body_image_id_patch(&going), None);
    }
}
