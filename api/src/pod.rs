//! The executor pod's parts the operator owns, and the check of what a PeragoTask adds to it
//! (`spec.executor.podTemplate`, `spec.executor.workVolume`): every Kubernetes object in the
//! template is read as its Kubernetes type, and nothing may take a name, a path or a label the
//! operator's own parts use. The operator renders the pod from the checked parts
//! ([`PodParts`]), so what it renders is exactly what was checked.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, HostAlias, PodDNSConfig, PodSecurityContext, TopologySpreadConstraint, Volume,
    VolumeMount,
};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::task::{ExecutorSpec, PodTemplate, WorkVolume};
use crate::validate::FieldError;

/// The shared volume of the sidecar and the body, and where both mount it.
pub const WORK_VOLUME: &str = "perago-work";
pub const WORK_DIR: &str = "/perago-work";
/// The body's scratch `/tmp` (its root filesystem is read-only).
pub const TMP_VOLUME: &str = "tmp";
pub const TMP_DIR: &str = "/tmp";
/// The task contract's ConfigMap volume, mounted into the sidecar.
pub const CONTRACT_VOLUME: &str = "perago-contract";
pub const CONTRACT_DIR: &str = "/etc/perago";
/// The private CA bundles of Conductor and lakeFS (`spec.*.tls.caBundleRef`), mounted into
/// the sidecar under [`CA_DIR`]`/<volume>`.
pub const CONDUCTOR_CA_VOLUME: &str = "perago-conductor-ca";
pub const LAKEFS_CA_VOLUME: &str = "perago-lakefs-ca";
pub const CA_DIR: &str = "/etc/perago-ca";
/// The client certificates presented to Conductor and lakeFS
/// (`spec.*.tls.clientCertificateRef`), mounted into the sidecar under
/// [`CLIENT_CERT_DIR`]`/<volume>`.
pub const CONDUCTOR_CLIENT_CERT_VOLUME: &str = "perago-conductor-client-cert";
pub const LAKEFS_CLIENT_CERT_VOLUME: &str = "perago-lakefs-client-cert";
pub const CLIENT_CERT_DIR: &str = "/etc/perago-client-cert";
/// The pod's own annotations as a downward-API volume projects them, mounted into the
/// sidecar under [`POD_INFO_DIR`] (workspace tasks): the body image id the operator writes
/// there goes into each publication's lineage.
pub const POD_INFO_VOLUME: &str = "perago-pod-info";
pub use perago_contract::pod_info::{
    ANNOTATIONS_DIR as POD_INFO_DIR, ANNOTATIONS_FILE, BODY_IMAGE_ID_ANNOTATION,
};
/// The label every object of a task carries; the Deployment selects its pods by it.
pub const TASK_LABEL: &str = "perago.io/task";
pub const CONTRACT_HASH_ANNOTATION: &str = "perago.io/contract-hash";
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";
/// Labels the operator sets on every object of a task, beside [`TASK_LABEL`].
pub const OWNED_LABELS: [&str; 4] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    TASK_LABEL,
];

const TEMPLATE: &str = "spec.executor.podTemplate";

/// What the checked template adds to the executor pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodParts {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub affinity: Option<Affinity>,
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    pub priority_class_name: Option<String>,
    pub runtime_class_name: Option<String>,
    pub scheduler_name: Option<String>,
    pub security_context: Option<PodSecurityContext>,
    pub volumes: Vec<Volume>,
    pub volume_mounts: Vec<VolumeMount>,
    pub host_aliases: Vec<HostAlias>,
    pub dns_config: Option<PodDNSConfig>,
}

/// `spec.executor`'s template and work volume, checked: the parts to render, or the first
/// field that cannot be used and why.
pub fn check(executor: &ExecutorSpec) -> Result<PodParts, FieldError> {
    check_work_volume(executor)?;
    let Some(template) = &executor.pod_template else {
        return Ok(PodParts::default());
    };
    let parts = typed(template)?;
    check_metadata(&parts)?;
    check_volumes(&parts)?;
    Ok(parts)
}

fn object<T: DeserializeOwned>(field: &str, value: &Map<String, Value>) -> Result<T, FieldError> {
    serde_json::from_value(Value::Object(value.clone()))
        .map_err(|e| FieldError::new(field, format!("not a valid Kubernetes object: {e}")))
}

fn objects<T: DeserializeOwned>(
    field: &str,
    values: &[Map<String, Value>],
) -> Result<Vec<T>, FieldError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| object(&format!("{field}[{i}]"), v))
        .collect()
}

fn typed(t: &PodTemplate) -> Result<PodParts, FieldError> {
    let field = |name: &str| format!("{TEMPLATE}.{name}");
    let metadata = t.metadata.clone().unwrap_or_default();
    Ok(PodParts {
        labels: metadata.labels,
        annotations: metadata.annotations,
        affinity: t
            .affinity
            .as_ref()
            .map(|a| object(&field("affinity"), a))
            .transpose()?,
        topology_spread_constraints: objects(
            &field("topologySpreadConstraints"),
            &t.topology_spread_constraints,
        )?,
        priority_class_name: t.priority_class_name.clone(),
        runtime_class_name: t.runtime_class_name.clone(),
        scheduler_name: t.scheduler_name.clone(),
        security_context: t
            .security_context
            .as_ref()
            .map(|s| object(&field("securityContext"), s))
            .transpose()?,
        volumes: objects(&field("volumes"), &t.volumes)?,
        volume_mounts: t.volume_mounts.clone(),
        host_aliases: t.host_aliases.clone(),
        dns_config: t
            .dns_config
            .as_ref()
            .map(|d| object(&field("dnsConfig"), d))
            .transpose()?,
    })
}

fn check_metadata(parts: &PodParts) -> Result<(), FieldError> {
    if let Some(key) = parts
        .labels
        .keys()
        .find(|k| OWNED_LABELS.contains(&k.as_str()))
    {
        return Err(FieldError::new(
            format!("{TEMPLATE}.metadata.labels"),
            format!("{key} is set by the operator (the Deployment selects its pods by it)"),
        ));
    }
    if let Some(key) = parts
        .annotations
        .keys()
        .find(|k| [CONTRACT_HASH_ANNOTATION, DEFAULT_CONTAINER_ANNOTATION].contains(&k.as_str()))
    {
        return Err(FieldError::new(
            format!("{TEMPLATE}.metadata.annotations"),
            format!("{key} is set by the operator"),
        ));
    }
    Ok(())
}

/// `path` is `dir` or below it (every absolute path is below `/`).
fn under(path: &str, dir: &str) -> bool {
    let (path, dir) = (path.trim_end_matches('/'), dir.trim_end_matches('/'));
    dir.is_empty() || path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

fn check_volumes(parts: &PodParts) -> Result<(), FieldError> {
    let owned = [
        WORK_VOLUME,
        TMP_VOLUME,
        CONTRACT_VOLUME,
        CONDUCTOR_CA_VOLUME,
        LAKEFS_CA_VOLUME,
        CONDUCTOR_CLIENT_CERT_VOLUME,
        LAKEFS_CLIENT_CERT_VOLUME,
        POD_INFO_VOLUME,
    ];
    let mut names = Vec::new();
    for (i, volume) in parts.volumes.iter().enumerate() {
        let field = format!("{TEMPLATE}.volumes[{i}].name");
        // The Kubernetes types read a missing name as empty.
        if volume.name.is_empty() {
            return Err(FieldError::new(field, "a volume needs a name"));
        }
        if owned.contains(&volume.name.as_str()) {
            return Err(FieldError::new(
                field,
                format!("{} is the operator's volume", volume.name),
            ));
        }
        if names.contains(&volume.name.as_str()) {
            return Err(FieldError::new(
                field,
                format!("{} is named twice", volume.name),
            ));
        }
        names.push(volume.name.as_str());
    }
    for (i, mount) in parts.volume_mounts.iter().enumerate() {
        let field = format!("{TEMPLATE}.volumeMounts[{i}]");
        if !names.contains(&mount.name.as_str()) {
            return Err(FieldError::new(
                format!("{field}.name"),
                format!(
                    "{} is not one of podTemplate.volumes ({})",
                    mount.name,
                    names.join(", ")
                ),
            ));
        }
        if !mount.mount_path.starts_with('/') {
            return Err(FieldError::new(
                format!("{field}.mountPath"),
                "must be an absolute path",
            ));
        }
        if let Some(dir) = [WORK_DIR, TMP_DIR]
            .into_iter()
            .find(|dir| under(&mount.mount_path, dir) || under(dir, &mount.mount_path))
        {
            return Err(FieldError::new(
                format!("{field}.mountPath"),
                format!(
                    "{} would cover or sit inside {dir}, which the operator mounts",
                    mount.mount_path
                ),
            ));
        }
    }
    Ok(())
}

fn check_work_volume(executor: &ExecutorSpec) -> Result<(), FieldError> {
    let Some(work) = &executor.work_volume else {
        return Ok(());
    };
    let field = "spec.executor.workVolume";
    match work {
        WorkVolume {
            empty_dir: Some(_),
            ephemeral: Some(_),
        } => Err(FieldError::new(
            field,
            "set emptyDir or ephemeral, not both",
        )),
        WorkVolume {
            ephemeral: Some(_), ..
        }
        | WorkVolume {
            empty_dir: Some(_), ..
        } if executor.work_volume_size_limit.is_some() => Err(FieldError::new(
            "spec.executor.workVolumeSizeLimit",
            "set the size in workVolume instead (emptyDir.sizeLimit or ephemeral.size)",
        )),
        WorkVolume {
            ephemeral: Some(e), ..
        } => {
            if let Some(mode) = e.access_modes.iter().find(|m| {
                !["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"].contains(&m.as_str())
            }) {
                return Err(FieldError::new(
                    format!("{field}.ephemeral.accessModes"),
                    format!(
                        "{mode}: the work volume is written, so ReadWriteOnce, ReadWriteOncePod or ReadWriteMany"
                    ),
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executor(yaml: &str) -> ExecutorSpec {
        let mut value: Value = serde_yaml::from_str(yaml).unwrap();
        value["body"] = serde_json::json!({"image": "b", "command": ["run"]});
        serde_json::from_value(value).unwrap()
    }

    fn refused(yaml: &str) -> String {
        check(&executor(yaml)).unwrap_err().to_string()
    }

    #[test]
    fn a_full_template_is_read_as_kubernetes_objects() {
        let parts = check(&executor(
            r#"
podTemplate:
  metadata: {labels: {team: data}, annotations: {sidecar.istio.io/inject: "false"}}
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [gpu]}]}]}}}
  topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}]
  priorityClassName: batch-high
  runtimeClassName: gvisor
  volumes: [{name: models, configMap: {name: reference-data}}]
  volumeMounts: [{name: models, mountPath: /models, readOnly: true}]
  hostAliases: [{ip: 10.0.0.9, hostnames: [lake.internal]}]
  dnsConfig: {options: [{name: ndots, value: "2"}]}
"#,
        ))
        .unwrap();
        assert_eq!(parts.labels["team"], "data");
        assert!(parts.affinity.unwrap().node_affinity.is_some());
        assert_eq!(parts.topology_spread_constraints[0].max_skew, 1);
        assert_eq!(
            parts.volumes[0].config_map.as_ref().unwrap().name,
            "reference-data"
        );
        assert_eq!(parts.volume_mounts[0].mount_path, "/models");
        assert_eq!(parts.dns_config.unwrap().options.unwrap().len(), 1);
        assert_eq!(check(&executor("{}")).unwrap(), PodParts::default());
    }

    #[test]
    fn what_the_operator_owns_is_refused_naming_the_field() {
        for (yaml, says) in [
            (
                "podTemplate: {volumes: [{name: perago-work, emptyDir: {}}]}",
                "spec.executor.podTemplate.volumes[0].name: perago-work is the operator's volume",
            ),
            (
                "podTemplate: {volumes: [{name: data, emptyDir: {}}], volumeMounts: [{name: data, mountPath: /perago-work}]}",
                "spec.executor.podTemplate.volumeMounts[0].mountPath: /perago-work would cover or sit inside /perago-work, which the operator mounts",
            ),
            (
                "podTemplate: {volumes: [{name: data, emptyDir: {}}], volumeMounts: [{name: data, mountPath: /}]}",
                "spec.executor.podTemplate.volumeMounts[0].mountPath: / would cover or sit inside /perago-work, which the operator mounts",
            ),
            (
                "podTemplate: {volumes: [{name: data, emptyDir: {}}], volumeMounts: [{name: data, mountPath: /tmp/x}]}",
                "spec.executor.podTemplate.volumeMounts[0].mountPath: /tmp/x would cover or sit inside /tmp, which the operator mounts",
            ),
            (
                "podTemplate: {volumeMounts: [{name: missing, mountPath: /data}]}",
                "spec.executor.podTemplate.volumeMounts[0].name: missing is not one of podTemplate.volumes ()",
            ),
            (
                "podTemplate: {volumes: [{name: a, emptyDir: {}}], volumeMounts: [{name: a, mountPath: data}]}",
                "spec.executor.podTemplate.volumeMounts[0].mountPath: must be an absolute path",
            ),
            (
                "podTemplate: {metadata: {labels: {perago.io/task: other}}}",
                "spec.executor.podTemplate.metadata.labels: perago.io/task is set by the operator (the Deployment selects its pods by it)",
            ),
            (
                "podTemplate: {metadata: {annotations: {perago.io/contract-hash: x}}}",
                "spec.executor.podTemplate.metadata.annotations: perago.io/contract-hash is set by the operator",
            ),
            (
                "workVolume: {emptyDir: {}, ephemeral: {size: 1Gi}}",
                "spec.executor.workVolume: set emptyDir or ephemeral, not both",
            ),
            (
                "{workVolumeSizeLimit: 1Gi, workVolume: {ephemeral: {size: 1Gi}}}",
                "spec.executor.workVolumeSizeLimit: set the size in workVolume instead (emptyDir.sizeLimit or ephemeral.size)",
            ),
            (
                "workVolume: {ephemeral: {size: 1Gi, accessModes: [ReadOnlyMany]}}",
                "spec.executor.workVolume.ephemeral.accessModes: ReadOnlyMany: the work volume is written, so ReadWriteOnce, ReadWriteOncePod or ReadWriteMany",
            ),
        ] {
            assert_eq!(refused(yaml), says, "{yaml}");
        }
    }

    #[test]
    fn objects_that_are_not_kubernetes_objects_are_refused() {
        let says = refused("podTemplate: {affinity: {nodeAffinity: 3}}");
        assert!(
            says.starts_with(
                "spec.executor.podTemplate.affinity: not a valid Kubernetes object: invalid type"
            ),
            "{says}"
        );
        assert_eq!(
            refused("podTemplate: {volumes: [{emptyDir: {}}]}"),
            "spec.executor.podTemplate.volumes[0].name: a volume needs a name"
        );
        let says = refused("podTemplate: {topologySpreadConstraints: [{maxSkew: many}]}");
        assert!(
            says.starts_with("spec.executor.podTemplate.topologySpreadConstraints[0]: not a valid Kubernetes object: invalid type"),
            "{says}"
        );
    }
}
