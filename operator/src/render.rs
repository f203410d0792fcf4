//! What the operator creates for a PeragoTask: the ConfigMap holding the sidecar's task
//! contract, the executor Deployment (the sidecar as a native sidecar that installs the
//! runner, the body wrapped by the runner, the shared `perago-work` volume, and what the
//! task's pod template adds), and the executor pods' NetworkPolicy when one is wanted. Pure
//! functions of the PeragoTask and the operator's defaults.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort,
    DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    EphemeralVolumeSource, ExecAction, HTTPGetAction, KeyToPath, Lifecycle, LifecycleHandler,
    ObjectFieldSelector, PersistentVolumeClaimSpec, PersistentVolumeClaimTemplate,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    SecretKeySelector, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use perago_api::contract::TaskContract;
use perago_api::pod;
use perago_api::task::{BodyContainer, BodyMode, ExecutorNetworkPolicy, ExecutorSpec};
use perago_api::{PeragoTask, PeragoTaskSpec};

pub use perago_api::pod::{CONTRACT_DIR, CONTRACT_HASH_ANNOTATION, TASK_LABEL, WORK_DIR};
pub const CONTRACT_KEY: &str = "contract.json";
pub const METRICS_PORT: i32 = 9464;

/// Cluster-wide defaults of the operator (flags of `perago-operator run`).
#[derive(Clone, Debug)]
pub struct Defaults {
    pub sidecar_image: String,
    pub conductor_url: Option<String>,
    pub conductor_credentials_secret: Option<String>,
    pub lakefs_endpoint: Option<String>,
    pub lakefs_credentials_secret: Option<String>,
    /// The object store hosts for workspace tasks that name none (`objectStoreHosts`).
    pub lakefs_object_store_hosts: Vec<String>,
    /// Where every sidecar sends its attempt traces (OTLP/HTTP); `None`: no traces.
    pub traces_endpoint: Option<String>,
    /// Whether executor pods get a NetworkPolicy when their task does not say, and the rules
    /// every such policy holds (`executorNetworkPolicy` of the chart).
    pub executor_network_policy: ExecutorNetworkPolicy,
}

pub fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_owned(),
            "perago-task".to_owned(),
        ),
        ("app.kubernetes.io/instance".to_owned(), name.to_owned()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "perago-operator".to_owned(),
        ),
        (TASK_LABEL.to_owned(), name.to_owned()),
    ])
}

pub fn owner_reference(task: &PeragoTask) -> OwnerReference {
    OwnerReference {
        api_version: format!("{}/{}", perago_api::task::GROUP, perago_api::task::VERSION),
        kind: "PeragoTask".into(),
        name: task.metadata.name.clone().unwrap_or_default(),
        uid: task.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn metadata(task: &PeragoTask, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: task.metadata.namespace.clone(),
        labels: Some(labels(&task.metadata.name.clone().unwrap_or_default())),
        // Offline renders have no uid to point at.
        owner_references: task
            .metadata
            .uid
            .is_some()
            .then(|| vec![owner_reference(task)]),
        ..ObjectMeta::default()
    }
}

/// Name of the ConfigMap and the Deployment of a task.
pub fn object_name(task: &PeragoTask) -> String {
    perago_api::task::object_name(task.metadata.name.as_deref().unwrap_or_default())
}

pub fn contract_text(contract: &TaskContract) -> String {
    serde_json::to_string_pretty(contract).unwrap_or_default()
}

pub fn config_map(task: &PeragoTask, contract: &TaskContract) -> ConfigMap {
    ConfigMap {
        metadata: metadata(task, object_name(task)),
        data: Some(BTreeMap::from([(
            CONTRACT_KEY.to_owned(),
            contract_text(contract),
        )])),
        ..ConfigMap::default()
    }
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn secret_env(name: &str, secret: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: name.into(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// The restricted profile: non-root, read-only root filesystem, no privileges.
fn restricted() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

/// How long a probe of the sidecar waits for its answer. The kubelet's default, one second, is
/// short for a loaded node: a restart of the sidecar ends the attempts it runs, and a pod not
/// Ready is the first a scale-in removes.
const PROBE_TIMEOUT_SECONDS: i32 = 5;

fn quantity(text: &str) -> Quantity {
    Quantity(text.into())
}

/// A probe of the sidecar's HTTP port, answered within [`PROBE_TIMEOUT_SECONDS`].
fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        timeout_seconds: Some(PROBE_TIMEOUT_SECONDS),
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

fn work_mount() -> VolumeMount {
    VolumeMount {
        name: pod::WORK_VOLUME.into(),
        mount_path: WORK_DIR.into(),
        ..VolumeMount::default()
    }
}

/// Shutdown grace of the sidecar and the pod's termination grace period (seconds). The
/// publish budget's `workerShutdownGraceSeconds` when the task declares one (the budget
/// measured on the task's lakeFS, docs/design.md#what-is-not-promised); else the attempt's
/// hard cap `controls.timeout.seconds`, publication included, so that an attempt that has
/// just started can still finish when its pod is told to stop; 30 s when neither is set. The
/// pod gets 15 s more so the sidecar can report the last attempt.
pub fn grace_seconds(spec: &PeragoTaskSpec, contract: &TaskContract) -> (i64, i64) {
    let grace = match (&contract.publish_budget, spec.controls.timeout.seconds) {
        (Some(budget), _) => budget.worker_shutdown_grace_seconds,
        (None, cap) if cap > 0 => cap,
        (None, _) => 30,
    };
    (grace, grace + 15)
}

pub fn contract_hash(contract: &TaskContract) -> String {
    let digest = Sha256::digest(contract_text(contract).as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The executor Deployment. `replicas` is decided by the caller (fixed or autoscaled).
pub fn deployment(
    task: &PeragoTask,
    contract: &TaskContract,
    defaults: &Defaults,
    replicas: i32,
) -> Deployment {
    let name = task.metadata.name.clone().unwrap_or_default();
    let exec = &task.spec.executor;
    let (grace, termination) = grace_seconds(&task.spec, contract);
    let overrides = exec.sidecar.clone().unwrap_or_default();
    let sidecar_image = overrides
        .image
        .clone()
        .unwrap_or_else(|| defaults.sidecar_image.clone());

    // Validated with the task; an unchecked template renders without its additions rather
    // than with half of them.
    let parts = pod::check(exec).unwrap_or_default();
    let selector = BTreeMap::from([(TASK_LABEL.to_owned(), name.clone())]);
    // The template's metadata first, the operator's over it (collisions are refused).
    let mut pod_labels = parts.labels.clone();
    pod_labels.extend(labels(&name));
    let mut annotations = parts.annotations.clone();
    annotations.extend([
        (CONTRACT_HASH_ANNOTATION.to_owned(), contract_hash(contract)),
        (
            pod::DEFAULT_CONTAINER_ANNOTATION.to_owned(),
            "body".to_owned(),
        ),
    ]);
    let mut bundles = ca_bundles(task, contract);
    bundles.extend(client_certificates(task, contract));
    bundles.extend(pod_info(task, contract));
    let mut volumes = volumes(task);
    volumes.extend(bundles.iter().map(|b| b.volume.clone()));
    volumes.extend(parts.volumes);
    let mut sidecar_env = sidecar_env(task, contract, defaults, grace);
    sidecar_env.extend(bundles.iter().flat_map(|b| b.env.clone()));
    Deployment {
        metadata: metadata(task, object_name(task)),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    init_containers: Some(vec![sidecar_container(
                        sidecar_image,
                        overrides.resources,
                        sidecar_env,
                        bundles.into_iter().map(|b| b.mount),
                    )]),
                    containers: vec![body_container(&exec.body, parts.volume_mounts)],
                    volumes: Some(volumes),
                    termination_grace_period_seconds: Some(termination),
                    security_context: Some(parts.security_context.unwrap_or_else(pod_security)),
                    affinity: parts.affinity,
                    topology_spread_constraints: (!parts.topology_spread_constraints.is_empty())
                        .then_some(parts.topology_spread_constraints),
                    priority_class_name: parts.priority_class_name,
                    runtime_class_name: parts.runtime_class_name,
                    scheduler_name: parts.scheduler_name,
                    host_aliases: (!parts.host_aliases.is_empty()).then_some(parts.host_aliases),
                    dns_config: parts.dns_config,
                    service_account_name: exec.service_account_name.clone(),
                    // Neither container calls the Kubernetes API: no token unless the task
                    // names a ServiceAccount for its body (which then decides).
                    automount_service_account_token: exec
                        .service_account_name
                        .is_none()
                        .then_some(false),
                    node_selector: exec.node_selector.clone(),
                    tolerations: exec.tolerations.clone(),
                    image_pull_secrets: exec.image_pull_secrets.clone(),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// The Conductor a task registers with: its own `spec.conductor.url`, else the default.
pub fn conductor_url(task: &PeragoTask, defaults: &Defaults) -> String {
    task.spec
        .conductor
        .as_ref()
        .and_then(|c| c.url.clone())
        .or_else(|| defaults.conductor_url.clone())
        .unwrap_or_default()
}

/// The sidecar's settings: where its contract, work volume and HTTP server are, its shutdown
/// grace, and where Conductor (and for workspace tasks lakeFS) are, with the Secrets of their
/// credentials.
fn sidecar_env(
    task: &PeragoTask,
    contract: &TaskContract,
    defaults: &Defaults,
    grace: i64,
) -> Vec<EnvVar> {
    let spec = &task.spec;
    let mut sidecar_env = vec![
        EnvVar {
            name: "POD_NAME".into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
        },
        env(
            "PERAGO_TASK_CONTRACT",
            format!("{CONTRACT_DIR}/{CONTRACT_KEY}"),
        ),
        env("PERAGO_WORK_DIR", WORK_DIR),
        env("PERAGO_HTTP_ADDR", format!("0.0.0.0:{METRICS_PORT}")),
        env("PERAGO_SHUTDOWN_GRACE_SECONDS", grace.to_string()),
        env("CONDUCTOR_SERVER_URL", conductor_url(task, defaults)),
    ];
    if let Some(domain) = spec.domain() {
        sidecar_env.push(env("CONDUCTOR_WORKER_DOMAIN", domain));
    }
    if let Some(endpoint) = &defaults.traces_endpoint {
        sidecar_env.push(env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint));
    }
    // OpenLineage run events of each attempt (ADR 0043), in the task's namespace unless it
    // names another.
    if let Some(open_lineage) = spec.open_lineage() {
        sidecar_env.push(env("PERAGO_OPENLINEAGE_URL", open_lineage.url.clone()));
        let namespace = open_lineage
            .namespace
            .clone()
            .or_else(|| task.metadata.namespace.clone())
            .unwrap_or_else(|| "default".into());
        sidecar_env.push(env("PERAGO_OPENLINEAGE_NAMESPACE", namespace));
    }
    if let Some(secret) = spec
        .conductor
        .as_ref()
        .and_then(|c| c.credentials_secret.clone())
        .or_else(|| defaults.conductor_credentials_secret.clone())
    {
        sidecar_env.push(secret_env("CONDUCTOR_AUTH_KEY", &secret));
        sidecar_env.push(secret_env("CONDUCTOR_AUTH_SECRET", &secret));
    }
    if contract.workspace.is_some() {
        let endpoint = spec
            .lakefs
            .as_ref()
            .and_then(|l| l.endpoint.clone())
            .or_else(|| defaults.lakefs_endpoint.clone())
            .unwrap_or_default();
        sidecar_env.push(env("LAKECTL_SERVER_ENDPOINT_URL", endpoint));
        if let Some(secret) = spec
            .lakefs
            .as_ref()
            .and_then(|l| l.credentials_secret.clone())
            .or_else(|| defaults.lakefs_credentials_secret.clone())
        {
            sidecar_env.push(secret_env("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", &secret));
            sidecar_env.push(secret_env("LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", &secret));
        }
        let lakefs = spec.lakefs.as_ref();
        if let Some(path) = lakefs.and_then(|l| l.data_path) {
            sidecar_env.push(env("PERAGO_LAKEFS_DATA_PATH", path.as_str()));
        }
        let hosts = lakefs
            .map(|l| &l.object_store_hosts)
            .filter(|h| !h.is_empty())
            .unwrap_or(&defaults.lakefs_object_store_hosts);
        if !hosts.is_empty() {
            sidecar_env.push(env("PERAGO_LAKEFS_OBJECT_STORE_HOSTS", hosts.join(",")));
        }
    }
    sidecar_env
}

/// The sidecar, a native sidecar (an init container that always restarts): started before the
/// body, stopped after it.
fn sidecar_container(
    image: String,
    resources: Option<ResourceRequirements>,
    env: Vec<EnvVar>,
    mounts: impl IntoIterator<Item = VolumeMount>,
) -> Container {
    let resources = resources.unwrap_or_else(|| ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), quantity("50m")),
            ("memory".to_owned(), quantity("64Mi")),
        ])),
        limits: Some(BTreeMap::from([("memory".to_owned(), quantity("256Mi"))])),
        ..ResourceRequirements::default()
    });
    Container {
        name: "perago-sidecar".into(),
        image: Some(image),
        args: Some(vec!["run".into()]),
        // The runner is put where the body runs it by this hook, which the kubelet finishes
        // before it starts the body. No init container and no startup probe: the kubelet
        // would notice the one's exit and pass the other only at a later relist or tick,
        // a second or two of every pod's start (ADR 0046).
        lifecycle: Some(Lifecycle {
            post_start: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec![
                        "/usr/local/bin/perago-sidecar".into(),
                        "install-runner".into(),
                        "--to".into(),
                        format!("{WORK_DIR}/bin/perago-runner"),
                    ]),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        restart_policy: Some("Always".into()),
        // A sidecar that exits on bad settings says why in its log: that tail becomes the
        // container's termination message, which the PeragoTask's status then quotes.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: METRICS_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(http_probe("/healthz", 10, 3)),
        // Three misses, not one: the ReplicaSet removes a pod that is not Ready before any
        // deletion cost, so one probe that times out on a loaded node would make a scale-in
        // remove a busy pod. Readiness gates no traffic here; it only ranks and reports.
        readiness_probe: Some(http_probe("/readyz", 5, 3)),
        volume_mounts: Some(
            [
                work_mount(),
                VolumeMount {
                    name: pod::CONTRACT_VOLUME.into(),
                    mount_path: CONTRACT_DIR.into(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                },
            ]
            .into_iter()
            .chain(mounts)
            .collect(),
        ),
        resources: Some(resources),
        security_context: Some(restricted()),
        ..Container::default()
    }
}

/// The user's body, started through `perago-runner`, which takes its assignments from the
/// sidecar; `mounts` are the template's, after the operator's.
fn body_container(body: &BodyContainer, mounts: Vec<VolumeMount>) -> Container {
    let mut command = vec![format!("{WORK_DIR}/bin/perago-runner")];
    if body.mode == BodyMode::Persistent {
        command.push("--persistent".into());
        let limits = body.persistent.clone().unwrap_or_default();
        if let Some(n) = limits.max_attempts {
            command.extend(["--max-attempts".into(), n.to_string()]);
        }
        // Validation refused a quantity that is not a number of bytes.
        if let Some(bytes) = limits
            .max_memory
            .as_ref()
            .and_then(perago_api::quantity::bytes)
        {
            command.extend(["--max-memory".into(), bytes.to_string()]);
        }
    }
    command.push("--".into());
    command.extend(body.command.iter().cloned());
    command.extend(body.args.iter().cloned());
    Container {
        name: "body".into(),
        image: Some(body.image.clone()),
        image_pull_policy: body.image_pull_policy.clone(),
        command: Some(command),
        env: (!body.env.is_empty()).then(|| body.env.clone()),
        env_from: (!body.env_from.is_empty()).then(|| body.env_from.clone()),
        resources: body.resources.clone(),
        working_dir: body.working_dir.clone(),
        // The root filesystem is read-only: /tmp is a scratch emptyDir of its own.
        volume_mounts: Some(
            [
                work_mount(),
                VolumeMount {
                    name: pod::TMP_VOLUME.into(),
                    mount_path: pod::TMP_DIR.into(),
                    ..VolumeMount::default()
                },
            ]
            .into_iter()
            .chain(mounts)
            .collect(),
        ),
        security_context: Some(body.security_context.clone().unwrap_or_else(restricted)),
        ..Container::default()
    }
}

/// The shared work volume, the body's /tmp, and the contract ConfigMap.
fn volumes(task: &PeragoTask) -> Vec<Volume> {
    vec![
        work_volume(&task.spec.executor),
        Volume {
            name: pod::TMP_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
        Volume {
            name: pod::CONTRACT_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: object_name(task),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
    ]
}

/// Files for the sidecar alone (a private CA bundle, a client certificate): the volume of
/// their ConfigMap or Secret, where the sidecar mounts it, and the variables that point the
/// client at them.
struct SidecarFiles {
    volume: Volume,
    mount: VolumeMount,
    env: Vec<EnvVar>,
}

/// What a workspace task's sidecar writes into each publication's lineage (ADR 0042): the
/// PeragoTask, the generation of its spec (pinned by the controller to the one that
/// introduced this template, see `crate::lineage`), the body image as named, and the pod's
/// annotations as the kubelet projects them, where the operator writes the body image id
/// once the kubelet reports it.
fn pod_info(task: &PeragoTask, contract: &TaskContract) -> Option<SidecarFiles> {
    contract.workspace.as_ref()?;
    let meta = &task.metadata;
    let mut vars = vec![
        env(
            "PERAGO_POD_ANNOTATIONS",
            format!("{}/{}", pod::POD_INFO_DIR, pod::ANNOTATIONS_FILE),
        ),
        env(
            "PERAGO_TASK_NAMESPACE",
            meta.namespace.clone().unwrap_or_default(),
        ),
        env("PERAGO_TASK_NAME", meta.name.clone().unwrap_or_default()),
        env("PERAGO_BODY_IMAGE", task.spec.executor.body.image.clone()),
    ];
    // Offline renders have neither.
    if let Some(uid) = &meta.uid {
        vars.push(env("PERAGO_TASK_UID", uid.clone()));
    }
    if let Some(generation) = meta.generation {
        vars.push(env(GENERATION_ENV, generation.to_string()));
    }
    Some(SidecarFiles {
        volume: Volume {
            name: pod::POD_INFO_VOLUME.into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: pod::ANNOTATIONS_FILE.into(),
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.annotations".into(),
                        api_version: None,
                    }),
                    ..DownwardAPIVolumeFile::default()
                }]),
                ..DownwardAPIVolumeSource::default()
            }),
            ..Volume::default()
        },
        mount: VolumeMount {
            name: pod::POD_INFO_VOLUME.into(),
            mount_path: pod::POD_INFO_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
        env: vars,
    })
}

/// The sidecar's variable holding the PeragoTask generation.
pub const GENERATION_ENV: &str = "PERAGO_TASK_GENERATION";

/// The CA bundles of Conductor and (for workspace tasks) lakeFS that the task names. The key
/// is optional in the volume: a missing one leaves the file absent, and the sidecar's start
/// then says which setting and path, where a missing key would hold the pod in
/// `ContainerCreating` with the reason only in an event.
fn ca_bundles(task: &PeragoTask, contract: &TaskContract) -> Vec<SidecarFiles> {
    let spec = &task.spec;
    let conductor = spec.conductor.as_ref().and_then(|c| c.tls.as_ref());
    let lakefs = spec
        .lakefs
        .as_ref()
        .and_then(|l| l.tls.as_ref())
        .filter(|_| contract.workspace.is_some());
    [
        (
            conductor,
            pod::CONDUCTOR_CA_VOLUME,
            "PERAGO_CONDUCTOR_CA_FILE",
        ),
        (lakefs, pod::LAKEFS_CA_VOLUME, "PERAGO_LAKEFS_CA_FILE"),
    ]
    .into_iter()
    .filter_map(|(tls, volume, variable)| {
        let bundle = tls?.ca_bundle_ref.as_ref()?;
        let dir = format!("{}/{volume}", pod::CA_DIR);
        let item = |key: &str| {
            Some(vec![KeyToPath {
                key: key.to_owned(),
                path: CA_FILE.to_owned(),
                mode: None,
            }])
        };
        let volume = Volume {
            name: volume.to_owned(),
            config_map: bundle.config_map.as_ref().map(|r| ConfigMapVolumeSource {
                name: r.name.clone(),
                items: item(&r.key),
                optional: Some(true),
                ..ConfigMapVolumeSource::default()
            }),
            secret: bundle.secret.as_ref().map(|r| SecretVolumeSource {
                secret_name: Some(r.name.clone()),
                items: item(&r.key),
                optional: Some(true),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        };
        Some(SidecarFiles {
            mount: VolumeMount {
                name: volume.name.clone(),
                mount_path: dir.clone(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            env: vec![env(variable, format!("{dir}/{CA_FILE}"))],
            volume,
        })
    })
    .collect()
}

/// The file name of a CA bundle in its mount.
const CA_FILE: &str = "ca.crt";

/// The client certificates of Conductor and (for workspace tasks) lakeFS that the task names:
/// each `kubernetes.io/tls` Secret mounted whole into the sidecar alone, with no `subPath`,
/// so that the kubelet's update of a renewed Secret reaches the files the sidecar reads again.
/// Optional in the volume, as the CA bundles are: a missing Secret leaves the files absent,
/// and the sidecar's start names the setting and the path.
fn client_certificates(task: &PeragoTask, contract: &TaskContract) -> Vec<SidecarFiles> {
    let spec = &task.spec;
    let conductor = spec.conductor.as_ref().and_then(|c| c.tls.as_ref());
    let lakefs = spec
        .lakefs
        .as_ref()
        .and_then(|l| l.tls.as_ref())
        .filter(|_| contract.workspace.is_some());
    [
        (conductor, pod::CONDUCTOR_CLIENT_CERT_VOLUME, "CONDUCTOR"),
        (lakefs, pod::LAKEFS_CLIENT_CERT_VOLUME, "LAKEFS"),
    ]
    .into_iter()
    .filter_map(|(tls, volume, server)| {
        let secret = tls?.client_certificate_ref.as_ref()?;
        let dir = format!("{}/{volume}", pod::CLIENT_CERT_DIR);
        let items = [TLS_CERT_FILE, TLS_KEY_FILE]
            .map(|key| KeyToPath {
                key: key.to_owned(),
                path: key.to_owned(),
                mode: None,
            })
            .to_vec();
        let volume = Volume {
            name: volume.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.name.clone()),
                items: Some(items),
                optional: Some(true),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        };
        Some(SidecarFiles {
            mount: VolumeMount {
                name: volume.name.clone(),
                mount_path: dir.clone(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            env: vec![
                env(
                    &format!("PERAGO_{server}_CLIENT_CERT_FILE"),
                    format!("{dir}/{TLS_CERT_FILE}"),
                ),
                env(
                    &format!("PERAGO_{server}_CLIENT_KEY_FILE"),
                    format!("{dir}/{TLS_KEY_FILE}"),
                ),
            ],
            volume,
        })
    })
    .collect()
}

/// The keys of a `kubernetes.io/tls` Secret, and their file names in its mount.
const TLS_CERT_FILE: &str = "tls.crt";
const TLS_KEY_FILE: &str = "tls.key";

/// The work volume: an emptyDir bounded at 10Gi unless the task says otherwise, in memory
/// when asked, or a generic ephemeral volume (a PersistentVolumeClaim per pod).
fn work_volume(exec: &ExecutorSpec) -> Volume {
    let work = exec.work_volume.clone().unwrap_or_default();
    if let Some(e) = work.ephemeral {
        let access_modes = if e.access_modes.is_empty() {
            vec!["ReadWriteOnce".to_owned()]
        } else {
            e.access_modes
        };
        return Volume {
            name: pod::WORK_VOLUME.into(),
            ephemeral: Some(EphemeralVolumeSource {
                volume_claim_template: Some(PersistentVolumeClaimTemplate {
                    metadata: None,
                    spec: PersistentVolumeClaimSpec {
                        access_modes: Some(access_modes),
                        storage_class_name: e.storage_class_name,
                        resources: Some(VolumeResourceRequirements {
                            requests: Some(BTreeMap::from([("storage".to_owned(), e.size)])),
                            ..VolumeResourceRequirements::default()
                        }),
                        ..PersistentVolumeClaimSpec::default()
                    },
                }),
            }),
            ..Volume::default()
        };
    }
    let empty = work.empty_dir.unwrap_or_default();
    let size_limit = empty
        .size_limit
        .or_else(|| exec.work_volume_size_limit.clone())
        .unwrap_or_else(|| quantity("10Gi"));
    Volume {
        name: pod::WORK_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: empty.medium.map(|_| "Memory".to_owned()),
            size_limit: Some(size_limit),
        }),
        ..Volume::default()
    }
}

fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        // Body images often default to root, which runAsNonRoot refuses: run as the
        // distroless `nonroot` user unless the body says otherwise.
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        // Both containers share the emptyDir through this group.
        fs_group: Some(65532),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    }
}

/// The NetworkPolicy of the task's executor pods, when the task (or else the operator's
/// default) wants one. Only listed traffic passes: in, the operator's rules (its busy-slot
/// probes) and the task's; out, DNS, the operator's rules (Conductor, lakeFS, the object
/// store) and the task's. The kubelet's probes come from the node, which policies do not
/// govern.
pub fn network_policy(task: &PeragoTask, defaults: &Defaults) -> Option<NetworkPolicy> {
    let common = &defaults.executor_network_policy;
    let own = task
        .spec
        .executor
        .network_policy
        .clone()
        .unwrap_or_default();
    if !own.enabled.or(common.enabled).unwrap_or(false) {
        return None;
    }
    let name = task.metadata.name.clone().unwrap_or_default();
    let dns = ["UDP", "TCP"].map(|protocol| NetworkPolicyPort {
        port: Some(IntOrString::Int(53)),
        protocol: Some(protocol.to_owned()),
        end_port: None,
    });
    let egress = std::iter::once(NetworkPolicyEgressRule {
        ports: Some(dns.to_vec()),
        to: None,
    })
    .chain(common.egress.iter().cloned())
    .chain(own.egress)
    .collect();
    let ingress = (common.ingress.iter().cloned())
        .chain(own.ingress)
        .collect();
    Some(NetworkPolicy {
        metadata: metadata(task, object_name(task)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(TASK_LABEL.to_owned(), name)])),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(ingress),
            egress: Some(egress),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, defaults};
    use perago_api::contract;

    fn task(yaml_spec: &str) -> PeragoTask {
        let metadata = "{name: features-build, namespace: data, uid: u-1}";
        fixtures::task(metadata, &format!("\n{yaml_spec}"))
    }

    const SPEC: &str = r#"  taskName: features.build
  ownerEmail: a@b.c
  workspace: {prefix: /features}
  paramsSchema: {type: object}
  resultSchema: {type: object}
  controls: {publishBudget: {observedMergeP99Seconds: 5, safetyMarginSeconds: 5, lakefsMergeTimeoutSeconds: 20, conductorCompletionTimeoutSeconds: 10, workerShutdownGraceSeconds: 60, heartbeatIntervalSeconds: 10}}
  conductor: {domain: canary, tls: {caBundleRef: {configMap: {name: corp-ca}}, clientCertificateRef: {name: gateway-client}}}
  lakefs: {credentialsSecret: lake-creds, tls: {caBundleRef: {secret: {name: lake-tls, key: bundle.pem}}, clientCertificateRef: {name: lake-client}}}
  executor:
    replicas: 2
    body: {image: reg/features:1, command: [python, -m, app], args: [--fast]}
"#;

    #[test]
    fn a_persistent_body_is_started_by_the_runner_with_its_limits() {
        let mut t = task(SPEC);
        let c = contract::render(&t.spec).unwrap();
        let body = &mut t.spec.executor.body;
        body.mode = BodyMode::Persistent;
        let command = |t: &PeragoTask| {
            let d = deployment(t, &c, &defaults(), 1);
            let pod = d.spec.unwrap().template.spec.unwrap();
            pod.containers[0].command.clone().unwrap()
        };
        assert_eq!(
            command(&t)[..3],
            ["/perago-work/bin/perago-runner", "--persistent", "--"]
        );
        t.spec.executor.body.persistent = Some(perago_api::task::PersistentBody {
            max_attempts: Some(100),
            max_memory: Some(quantity("512Mi")),
        });
        assert_eq!(
            command(&t)[..7],
            [
                "/perago-work/bin/perago-runner",
                "--persistent",
                "--max-attempts",
                "100",
                "--max-memory",
                "536870912",
                "--"
            ]
        );
    }

    /// `spec.lineage.openLineage` reaches the sidecar; the job namespace is the task's own
    /// namespace unless the task names one.
    #[test]
    fn the_sidecar_gets_the_tasks_openlineage_endpoint_and_namespace() {
        let sidecar_env = |extra: &str| -> BTreeMap<String, Option<String>> {
            let t = task(&format!("{SPEC}  lineage: {{openLineage: {extra}}}\n"));
            let c = contract::render(&t.spec).unwrap();
            let pod = deployment(&t, &c, &defaults(), 1)
                .spec
                .unwrap()
                .template
                .spec
                .unwrap();
            pod.init_containers.unwrap()[0]
                .env
                .clone()
                .unwrap()
                .into_iter()
                .map(|e| (e.name, e.value))
                .collect()
        };
        let env = sidecar_env("{url: 'http://marquez:5000/api/v1/lineage'}");
        assert_eq!(
            env["PERAGO_OPENLINEAGE_URL"].as_deref(),
            Some("http://marquez:5000/api/v1/lineage")
        );
        assert_eq!(env["PERAGO_OPENLINEAGE_NAMESPACE"].as_deref(), Some("data"));
        let env = sidecar_env("{url: 'https://lineage.example/api/v1/lineage', namespace: teams}");
        assert_eq!(
            env["PERAGO_OPENLINEAGE_NAMESPACE"].as_deref(),
            Some("teams")
        );
    }

    #[test]
    fn the_pod_has_the_runner_the_native_sidecar_and_the_wrapped_body() {
        let t = task(SPEC);
        let c = contract::render(&t.spec).unwrap();
        let traced = Defaults {
            traces_endpoint: Some("http://otel:4318/v1/traces".into()),
            ..defaults()
        };
        let d = deployment(&t, &c, &traced, 2);
        assert_eq!(d.metadata.name.as_deref(), Some("features-build-perago"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("data"));
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("PeragoTask", "u-1", Some(true))
        );
        let spec = d.spec.unwrap();
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.unwrap();
        let init = pod.init_containers.unwrap();
        assert_eq!(init.len(), 1, "the sidecar alone comes before the body");
        assert_eq!(init[0].args.as_ref().unwrap(), &["run"]);
        let install = init[0].lifecycle.as_ref().unwrap().post_start.as_ref();
        assert_eq!(
            install
                .unwrap()
                .exec
                .as_ref()
                .unwrap()
                .command
                .as_ref()
                .unwrap(),
            &[
                "/usr/local/bin/perago-sidecar",
                "install-runner",
                "--to",
                "/perago-work/bin/perago-runner"
            ]
        );
        assert!(init[0].startup_probe.is_none());
        assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));
        let env: BTreeMap<_, _> = init[0]
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e))
            .collect();
        assert_eq!(
            env["CONDUCTOR_SERVER_URL"].value.as_deref(),
            Some("http://conductor:8080/api")
        );
        assert_eq!(
            env["PERAGO_SHUTDOWN_GRACE_SECONDS"].value.as_deref(),
            Some("60")
        );
        assert_eq!(
            env["LAKECTL_SERVER_ENDPOINT_URL"].value.as_deref(),
            Some("http://lakefs:8000")
        );
        assert!(
            !env.contains_key("PERAGO_LAKEFS_DATA_PATH"),
            "auto is the sidecar's own default"
        );
        assert_eq!(
            env["PERAGO_LAKEFS_OBJECT_STORE_HOSTS"].value.as_deref(),
            Some("minio.storage:9000"),
            "the operator's default hosts"
        );
        let secret = env["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"]
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            secret.name, "lake-creds",
            "the task's secret wins over the default"
        );
        assert!(!env.contains_key("CONDUCTOR_AUTH_KEY"));
        assert_eq!(
            env["CONDUCTOR_WORKER_DOMAIN"].value.as_deref(),
            Some("canary")
        );
        assert_eq!(
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].value.as_deref(),
            Some("http://otel:4318/v1/traces")
        );
        assert!(
            !env.contains_key("PERAGO_OPENLINEAGE_URL"),
            "no lineage unless the task asks"
        );
        // The CA bundles reach the sidecar alone, each key as ca.crt in a mount of its own.
        assert_eq!(
            env["PERAGO_CONDUCTOR_CA_FILE"].value.as_deref(),
            Some("/etc/perago-ca/perago-conductor-ca/ca.crt")
        );
        assert_eq!(
            env["PERAGO_LAKEFS_CA_FILE"].value.as_deref(),
            Some("/etc/perago-ca/perago-lakefs-ca/ca.crt")
        );
        let volumes = pod.volumes.as_ref().unwrap();
        let conductor_ca = volumes
            .iter()
            .find(|v| v.name == "perago-conductor-ca")
            .unwrap();
        let source = conductor_ca.config_map.as_ref().unwrap();
        assert_eq!(source.name, "corp-ca");
        let item = &source.items.as_ref().unwrap()[0];
        assert_eq!(
            (item.key.as_str(), item.path.as_str()),
            ("ca.crt", "ca.crt")
        );
        let lakefs_ca = volumes
            .iter()
            .find(|v| v.name == "perago-lakefs-ca")
            .unwrap();
        let source = lakefs_ca.secret.as_ref().unwrap();
        assert_eq!(source.secret_name.as_deref(), Some("lake-tls"));
        assert_eq!(source.items.as_ref().unwrap()[0].key, "bundle.pem");
        let mounts: Vec<&str> = init[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert!(mounts.contains(&"perago-conductor-ca") && mounts.contains(&"perago-lakefs-ca"));
        // The client certificates too: each Secret whole, without subPath, so that a renewal
        // reaches the files.
        for (server, secret) in [("CONDUCTOR", "gateway-client"), ("LAKEFS", "lake-client")] {
            let volume = format!("perago-{}-client-cert", server.to_lowercase());
            let dir = format!("/etc/perago-client-cert/{volume}");
            assert_eq!(
                env[format!("PERAGO_{server}_CLIENT_CERT_FILE").as_str()]
                    .value
                    .as_deref(),
                Some(format!("{dir}/tls.crt").as_str())
            );
            assert_eq!(
                env[format!("PERAGO_{server}_CLIENT_KEY_FILE").as_str()]
                    .value
                    .as_deref(),
                Some(format!("{dir}/tls.key").as_str())
            );
            let source = volumes
                .iter()
                .find(|v| v.name == volume)
                .unwrap()
                .secret
                .as_ref()
                .unwrap();
            assert_eq!(source.secret_name.as_deref(), Some(secret));
            assert_eq!(source.optional, Some(true));
            let mount = init[0]
                .volume_mounts
                .iter()
                .flatten()
                .find(|m| m.name == volume)
                .unwrap();
            assert_eq!(
                (mount.mount_path.as_str(), mount.sub_path.as_deref()),
                (dir.as_str(), None)
            );
        }
        assert_eq!(
            pod.containers[0].command.as_ref().unwrap(),
            &[
                "/perago-work/bin/perago-runner",
                "--",
                "python",
                "-m",
                "app",
                "--fast"
            ]
        );
        assert!(
            pod.containers[0].env.is_none(),
            "the body never sees credentials"
        );
        assert_eq!(pod.termination_grace_period_seconds, Some(75));
        let sc = init[0].security_context.as_ref().unwrap();
        assert_eq!(
            (sc.run_as_non_root, sc.read_only_root_filesystem),
            (Some(true), Some(true))
        );
        let work = &pod.volumes.as_ref().unwrap()[0];
        assert_eq!(
            work.empty_dir.as_ref().unwrap().size_limit,
            Some(quantity("10Gi"))
        );
        let mounts: Vec<_> = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(mounts, [("perago-work", "/perago-work"), ("tmp", "/tmp")]);
    }

    #[test]
    fn the_pod_template_adds_to_what_the_operator_owns() {
        let t = task(&format!(
            "{SPEC}{}",
            r#"    workVolume: {ephemeral: {storageClassName: local-work, size: 50Gi}}
    podTemplate:
      metadata: {labels: {team: data}, annotations: {sidecar.istio.io/inject: "false"}}
      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [gpu]}]}]}}}
      priorityClassName: batch-high
      runtimeClassName: gvisor
      securityContext: {runAsNonRoot: true, runAsUser: 1000, fsGroup: 1000}
      volumes: [{name: models, configMap: {name: reference-data}}]
      volumeMounts: [{name: models, mountPath: /models, readOnly: true}]
"#
        ));
        let c = contract::render(&t.spec).unwrap();
        let template = deployment(&t, &c, &defaults(), 1).spec.unwrap().template;
        let meta = template.metadata.unwrap();
        let labels = meta.labels.unwrap();
        assert_eq!(
            (labels["team"].as_str(), labels[TASK_LABEL].as_str()),
            ("data", "features-build")
        );
        let annotations = meta.annotations.unwrap();
        assert_eq!(annotations["sidecar.istio.io/inject"], "false");
        assert!(annotations.contains_key(CONTRACT_HASH_ANNOTATION));
        let pod = template.spec.unwrap();
        assert!(pod.affinity.unwrap().node_affinity.is_some());
        assert_eq!(pod.priority_class_name.as_deref(), Some("batch-high"));
        assert_eq!(pod.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(pod.security_context.unwrap().run_as_user, Some(1000));
        let volumes = pod.volumes.unwrap();
        let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "perago-work",
                "tmp",
                "perago-contract",
                "perago-conductor-ca",
                "perago-lakefs-ca",
                "perago-conductor-client-cert",
                "perago-lakefs-client-cert",
                "perago-pod-info",
                "models"
            ],
            "the operator's volumes, then the template's"
        );
        let claim = volumes[0].ephemeral.as_ref().unwrap();
        let spec = &claim.volume_claim_template.as_ref().unwrap().spec;
        assert_eq!(spec.storage_class_name.as_deref(), Some("local-work"));
        assert_eq!(
            spec.access_modes.as_deref(),
            Some(&["ReadWriteOnce".to_owned()][..])
        );
        assert_eq!(
            spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"],
            quantity("50Gi")
        );
        let mounts: Vec<_> = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("perago-work", "/perago-work"),
                ("tmp", "/tmp"),
                ("models", "/models")
            ]
        );
        let sidecar_mounts = pod.init_containers.unwrap()[0]
            .volume_mounts
            .clone()
            .unwrap();
        assert!(
            sidecar_mounts.iter().all(|m| m.name != "models"),
            "the template's volumes are the body's"
        );

        let memory = task(&format!(
            "{SPEC}    workVolume: {{emptyDir: {{medium: Memory, sizeLimit: 2Gi}}}}\n"
        ));
        let c = contract::render(&memory.spec).unwrap();
        let pod = deployment(&memory, &c, &defaults(), 1)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let work = pod.volumes.unwrap()[0].empty_dir.clone().unwrap();
        assert_eq!(
            (work.medium.as_deref(), work.size_limit),
            (Some("Memory"), Some(quantity("2Gi")))
        );
        assert_eq!(pod.security_context.unwrap().run_as_user, Some(65532));
    }

    #[test]
    fn a_contract_change_changes_the_pod_template() {
        let t = task(SPEC);
        let c = contract::render(&t.spec).unwrap();
        let t2 = task(&SPEC.replace("prefix: /features", "prefix: /features/v2"));
        let c2 = contract::render(&t2.spec).unwrap();
        let hash = |d: Deployment| {
            d.spec
                .unwrap()
                .template
                .metadata
                .unwrap()
                .annotations
                .unwrap()[CONTRACT_HASH_ANNOTATION]
                .clone()
        };
        assert_ne!(
            hash(deployment(&t, &c, &defaults(), 1)),
            hash(deployment(&t2, &c2, &defaults(), 1))
        );
        assert_eq!(
            hash(deployment(&t, &c, &defaults(), 1)),
            hash(deployment(&t, &c, &defaults(), 3)),
            "scaling is no rollout"
        );
        let cm = config_map(&t, &c);
        let stored: TaskContract = serde_json::from_str(&cm.data.unwrap()[CONTRACT_KEY]).unwrap();
        assert_eq!(stored, c);
    }

    #[test]
    fn a_task_names_its_data_path_and_object_store_hosts() {
        let t = task(&SPEC.replace(
            "  lakefs: {credentialsSecret: lake-creds,",
            "  lakefs: {dataPath: presigned, objectStoreHosts: ['*.s3.eu-west-1.amazonaws.com', '10.0.0.7:9000'], credentialsSecret: lake-creds,",
        ));
        let c = contract::render(&t.spec).unwrap();
        let pod = deployment(&t, &c, &defaults(), 1)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let init = pod.init_containers.unwrap();
        let value = |name: &str| {
            init[0]
                .env
                .as_ref()
                .unwrap()
                .iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            value("PERAGO_LAKEFS_DATA_PATH").as_deref(),
            Some("presigned")
        );
        assert_eq!(
            value("PERAGO_LAKEFS_OBJECT_STORE_HOSTS").as_deref(),
            Some("*.s3.eu-west-1.amazonaws.com,10.0.0.7:9000"),
            "the task's hosts win over the operator's"
        );
    }

    #[test]
    fn workspace_free_tasks_get_no_lakefs_settings() {
        let t = task(&SPEC.replace("  workspace: {prefix: /features}\n", "").replace("  controls: {publishBudget: {observedMergeP99Seconds: 5, safetyMarginSeconds: 5, lakefsMergeTimeoutSeconds: 20, conductorCompletionTimeoutSeconds: 10, workerShutdownGraceSeconds: 60, heartbeatIntervalSeconds: 10}}\n", ""));
        let c = contract::render(&t.spec).unwrap();
        let pod = deployment(&t, &c, &defaults(), 1)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let init = pod.init_containers.unwrap();
        assert!(
            init[0]
                .env
                .as_ref()
                .unwrap()
                .iter()
                .all(|e| !e.name.starts_with("LAKECTL_") && !e.name.starts_with("PERAGO_LAKEFS_"))
        );
        assert_eq!(pod.termination_grace_period_seconds, Some(45));
    }

    #[test]
    fn the_drain_grace_comes_from_the_budget_else_the_attempt_cap() {
        let budget = task(SPEC);
        let grace = |t: &PeragoTask| grace_seconds(&t.spec, &contract::render(&t.spec).unwrap());
        assert_eq!(
            grace(&budget),
            (60, 75),
            "the budget's workerShutdownGraceSeconds"
        );
        let none = SPEC.replace("  controls: {publishBudget: {observedMergeP99Seconds: 5, safetyMarginSeconds: 5, lakefsMergeTimeoutSeconds: 20, conductorCompletionTimeoutSeconds: 10, workerShutdownGraceSeconds: 60, heartbeatIntervalSeconds: 10}}\n", "");
        assert_eq!(grace(&task(&none)), (30, 45), "no cap, no budget");
        let capped =
            format!("{none}  controls: {{timeout: {{seconds: 900, responseSeconds: 60}}}}\n");
        assert_eq!(
            grace(&task(&capped)),
            (900, 915),
            "an attempt may run its whole cap"
        );
    }

    #[test]
    fn a_network_policy_is_kept_when_the_task_or_else_the_operator_wants_one() {
        let operator_on = Defaults {
            executor_network_policy: serde_json::from_value(serde_json::json!({
                "enabled": true,
                "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 8080}]}],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "perago-operator"}}}], "ports": [{"port": 9464}]}],
            }))
            .unwrap(),
            ..defaults()
        };
        let plain = task(SPEC);
        assert!(
            network_policy(&plain, &defaults()).is_none(),
            "off by default"
        );

        let policy = network_policy(&plain, &operator_on).unwrap();
        assert_eq!(
            policy.metadata.name.as_deref(),
            Some("features-build-perago")
        );
        assert_eq!(policy.metadata.owner_references.unwrap()[0].uid, "u-1");
        let spec = policy.spec.unwrap();
        assert_eq!(
            spec.pod_selector.unwrap().match_labels.unwrap(),
            BTreeMap::from([(TASK_LABEL.to_owned(), "features-build".to_owned())]),
            "the Deployment's selector"
        );
        assert_eq!(spec.policy_types.unwrap(), ["Ingress", "Egress"]);
        let egress = spec.egress.unwrap();
        assert_eq!(egress.len(), 2, "DNS, then the operator's rule");
        assert!(egress[0].to.is_none(), "DNS to any resolver");
        let dns = egress[0].ports.as_ref().unwrap();
        assert_eq!(
            dns.iter()
                .map(|p| (p.port.clone(), p.protocol.as_deref()))
                .collect::<Vec<_>>(),
            [
                (Some(IntOrString::Int(53)), Some("UDP")),
                (Some(IntOrString::Int(53)), Some("TCP"))
            ]
        );
        assert_eq!(spec.ingress.unwrap().len(), 1);

        let own = |enabled: &str| {
            task(&format!(
                "{SPEC}    networkPolicy:\n      {enabled}egress: [{{to: [{{ipBlock: {{cidr: 192.0.2.7/32}}}}], ports: [{{port: 443}}]}}]\n      ingress: [{{from: [{{namespaceSelector: {{matchLabels: {{team: obs}}}}}}]}}]\n"
            ))
        };
        let spec = network_policy(&own(""), &operator_on)
            .unwrap()
            .spec
            .unwrap();
        let egress = spec.egress.unwrap();
        assert_eq!(egress.len(), 3, "DNS, the operator's, the task's");
        assert_eq!(
            egress[2].to.as_ref().unwrap()[0]
                .ip_block
                .as_ref()
                .unwrap()
                .cidr,
            "192.0.2.7/32"
        );
        assert_eq!(spec.ingress.unwrap().len(), 2);
        assert!(
            network_policy(&own(""), &defaults()).is_none(),
            "enabled unset: the operator's default, off"
        );
        assert!(network_policy(&own("enabled: true\n      "), &defaults()).is_some());
        assert!(network_policy(&own("enabled: false\n      "), &operator_on).is_none());
    }
}
