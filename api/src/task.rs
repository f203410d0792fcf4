//! The `PeragoTask` custom resource: what a user declares about one Conductor task type.
//!
//! Field names follow Kubernetes conventions (camelCase); the semantics follow the Python
//! Perago 0.6.1 task declaration (`@task(...)`, `WorkspaceSpec`, `TaskControls`, `MetricSpec`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvFromSource, EnvVar, HostAlias, LocalObjectReference, ResourceRequirements, SecurityContext,
    Toleration, VolumeMount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyIngressRule};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use perago_contract::spec::{
    ApplicationMetric, ApplicationMetricKind, Guardrail, GuardrailKind, MetricSpec, PublishBudget,
};

/// API group of every Perago resource.
pub const GROUP: &str = "perago.io";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";

/// The name of the ConfigMap and the executor Deployment the operator makes for the
/// PeragoTask `task_name` (in its namespace).
pub fn object_name(task_name: &str) -> String {
    format!("{task_name}-perago")
}

/// A Conductor task type whose steps run in a Perago executor pod.
///
/// The operator registers the task's Conductor TaskDef, renders the sidecar's task contract,
/// and runs and scales a Deployment of executor pods for it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
// Each printcolumn repeats `type_`; clippy mistakes that for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    doc = "A Conductor task type whose steps run in Perago executor pods: the operator registers its TaskDef, renders the sidecar's task contract, and runs and scales the pods; each attempt works on a lakeFS workspace that is published only if the attempt is still current.",
    group = "perago.io",
    version = "v1alpha1",
    kind = "PeragoTask",
    plural = "peragotasks",
    singular = "peragotask",
    shortname = "ptask",
    category = "perago",
    namespaced,
    status = "PeragoTaskStatus",
    scale(
        spec_replicas_path = ".spec.executor.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Task", type_ = "string", json_path = ".spec.taskName"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.readyReplicas"
    ),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(name = "Queue", type_ = "integer", json_path = ".status.queueDepth"),
    printcolumn(
        name = "Running",
        type_ = "integer",
        json_path = ".status.runningAttempts"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"Ready\")].message"
    )
)]
#[x_kube(validation = Rule::new("!has(self.controls) || !has(self.controls.publishBudget) || has(self.workspace)").message("publish_budget requires workspace=WorkspaceSpec(...)"))]
#[serde(rename_all = "camelCase")]
pub struct PeragoTaskSpec {
    /// The Conductor task name (TaskDef name). Must not contain `/` or `\`.
    #[schemars(length(min = 1, max = 255))]
    pub task_name: String,
    /// Owner e-mail recorded on the TaskDef.
    #[schemars(length(min = 1, max = 255))]
    pub owner_email: String,
    /// TaskDef description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The lakeFS workspace the body works on. Absent for a workspace-free task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceSpec>,
    /// JSON Schema (object) of the task's `params`.
    #[schemars(schema_with = "crate::task::free_form_object")]
    pub params_schema: Map<String, Value>,
    /// JSON Schema (object) of the task's `result`.
    #[schemars(schema_with = "crate::task::free_form_object")]
    pub result_schema: Map<String, Value>,
    /// Strict (default): inputs with other top-level keys, or params with undeclared fields,
    /// fail. Non-strict: other top-level keys are ignored and undeclared params fields are
    /// dropped at every level before the body sees them.
    #[serde(default = "default_true")]
    pub strict_params: bool,
    /// Runtime metric switches and the application metrics the body may record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricSpec>,
    /// Retry, timeout, limits and publish budget.
    #[serde(default)]
    pub controls: TaskControls,
    /// The executor pods.
    pub executor: ExecutorSpec,
    /// Where Conductor is; falls back to the operator's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conductor: Option<ConductorConnection>,
    /// Where lakeFS is; falls back to the operator's defaults. Workspace tasks only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lakefs: Option<LakeFsConnection>,
    /// Where the executor pods report each attempt as lineage. Absent: nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<LineageSpec>,
    /// What happens to the Conductor TaskDef when the PeragoTask is deleted.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Stop the task without deleting it: its executor pods stop polling, finish and report
    /// the attempts they run, and go; the TaskDef stays registered, autoscaling holds and the
    /// queue waits. `false` (or absent) resumes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// How a change of the executor's pod template reaches the pods: replace them all (the
    /// default), or a canary judged by its attempts (docs/rollouts.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::RolloutSpec>,
}

fn default_true() -> bool {
    true
}

/// Schema of an arbitrary JSON object kept verbatim by the apiserver.
pub(crate) fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema of a list of arbitrary JSON objects kept verbatim by the apiserver.
pub(crate) fn free_form_objects(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

impl PeragoTaskSpec {
    /// The Conductor task domain the executor pods poll, if any.
    pub fn domain(&self) -> Option<&str> {
        self.conductor.as_ref().and_then(|c| c.domain.as_deref())
    }
}

/// The workspace a task body gets: a projection of one lakeFS commit under `prefix`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpec {
    /// lakeFS object-key prefix that becomes the local workspace root; `/` is the repository root.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// A read-only task never publishes.
    #[serde(default)]
    pub read_only: bool,
    /// Checked after download, before the body. A failure is terminal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub pre: Vec<Guardrail>,
    /// Checked after the body and result validation, before anything is published.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub post: Vec<Guardrail>,
}

fn default_prefix() -> String {
    "/".to_owned()
}

impl Default for WorkspaceSpec {
    fn default() -> Self {
        Self {
            prefix: default_prefix(),
            read_only: false,
            pre: Vec::new(),
            post: Vec::new(),
        }
    }
}

/// Conductor and lakeFS behaviour controls.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskControls {
    /// What Conductor does when an attempt fails (the TaskDef's retry fields).
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Time limits of an attempt and of the whole task (the TaskDef's timeout fields).
    #[serde(default)]
    pub timeout: TimeoutPolicy,
    /// Conductor's limits on how many steps of this task type run at once or per period.
    #[serde(default)]
    pub limits: ExecutionLimits,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_budget: Option<PublishBudget>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    /// Retries after a failed attempt (`retryCount`); 0: none.
    #[serde(default = "default_retry_count")]
    #[schemars(range(min = 0, max = 10))]
    pub count: i64,
    /// How the delay between attempts grows (`retryLogic`).
    #[serde(default)]
    pub logic: RetryLogic,
    /// Delay before a retry (`retryDelaySeconds`).
    #[serde(default = "default_retry_delay")]
    #[schemars(range(min = 0))]
    pub delay_seconds: i64,
    /// Longest delay a growing back-off reaches (`maxRetryDelaySeconds`); 0: no cap.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub max_delay_seconds: i64,
    /// Random delay up to this many milliseconds added to each retry (`backoffJitterMs`).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub jitter_ms: i64,
}

fn default_retry_count() -> i64 {
    3
}
fn default_retry_delay() -> i64 {
    60
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            count: default_retry_count(),
            logic: RetryLogic::default(),
            delay_seconds: default_retry_delay(),
            max_delay_seconds: 0,
            jitter_ms: 0,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RetryLogic {
    #[default]
    Fixed,
    ExponentialBackoff,
    LinearBackoff,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimeoutPolicy {
    /// What a timed-out attempt does to its workflow (`timeoutPolicy`): retry it, time the
    /// workflow out, or only alert.
    #[serde(default)]
    pub policy: TimeoutPolicyKind,
    /// Hard cap per attempt, from the first poll; 0 means none. Without a publish budget it is
    /// also the drain time a stopping pod gives its running attempts (30 s when 0), and the
    /// pod's `terminationGracePeriodSeconds` is 15 s more.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub seconds: i64,
    /// Longest gap between lease extensions before Conductor times the attempt out.
    #[serde(default = "default_response_seconds")]
    #[schemars(range(min = 0))]
    pub response_seconds: i64,
    /// Longest a scheduled step waits to be polled before it times out (`pollTimeoutSeconds`);
    /// 0: no limit.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub poll_seconds: i64,
    /// Wall-clock budget across all attempts; 0 means none.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub total_seconds: i64,
}

fn default_response_seconds() -> i64 {
    600
}

impl Default for TimeoutPolicy {
    fn default() -> Self {
        Self {
            policy: TimeoutPolicyKind::default(),
            seconds: 0,
            response_seconds: default_response_seconds(),
            poll_seconds: 0,
            total_seconds: 0,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TimeoutPolicyKind {
    Retry,
    #[default]
    TimeOutWf,
    AlertOnly,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionLimits {
    /// Steps of this task type running at once across all workflows (`concurrentExecLimit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub concurrent_exec_limit: Option<i64>,
    /// The period of `rateLimitPerFrequency`, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub rate_limit_frequency_in_seconds: Option<i64>,
    /// Steps started per period at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub rate_limit_per_frequency: Option<i64>,
}

/// The executor Deployment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorSpec {
    /// The task-body container. Its command is run by `perago-runner` once per attempt.
    pub body: BodyContainer,
    /// Attempts one pod runs at once.
    #[serde(default = "default_slots")]
    #[schemars(range(min = 1, max = 64))]
    pub slots: i32,
    /// Number of pods; the field behind the `/scale` subresource, so an HPA or KEDA may own
    /// it. Always present, because the apiserver's `/scale` needs it.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Built-in autoscaling from the Conductor queue depth of the task type; when set, the
    /// operator owns `replicas` (do not also point an HPA at this PeragoTask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
    /// Size limit of the shared `perago-work` volume (default 10Gi). The same as
    /// `workVolume.emptyDir.sizeLimit`; set one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_volume_size_limit: Option<Quantity>,
    /// The shared `perago-work` volume: an emptyDir (the default), or a generic ephemeral
    /// volume, a PersistentVolumeClaim per pod from a storage class, for workspaces larger than
    /// a node's disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_volume: Option<WorkVolume>,
    /// Pod-level settings merged into every executor pod: metadata, placement, priority,
    /// runtime class, DNS, volumes and the body's mounts of them (docs/executor-pods.md).
    /// Checked by the operator; what it owns (its containers, the work volume and its mount,
    /// the labels it selects on) cannot be set here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplate>,
    /// The executor pods' ServiceAccount (default: the namespace's `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Nodes the executor pods may run on, by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the executor pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Secrets for pulling the body's and the sidecar's images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Overrides for the sidecar container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<SidecarOverrides>,
    /// The NetworkPolicy the operator keeps for the executor pods (docs/executor-pods.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<ExecutorNetworkPolicy>,
}

/// A NetworkPolicy for the task's executor pods. It lets in the operator's busy-slot probes
/// and lets out DNS, plus the operator's rules for every task (its chart's
/// `executorNetworkPolicy`: Conductor, lakeFS, the object store) and the rules given here.
/// Anything else is refused, to the body and the sidecar alike: they share the pod's address.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorNetworkPolicy {
    /// Whether the operator keeps the NetworkPolicy. Unset: as the operator's
    /// `executorNetworkPolicy.enabled` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Where else this task's pods may connect, e.g. a service its body calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub egress: Vec<NetworkPolicyEgressRule>,
    /// Who else may connect to this task's pods, e.g. Prometheus scraping the sidecar's
    /// port 9464.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub ingress: Vec<NetworkPolicyIngressRule>,
}

/// The work volume: exactly one of `emptyDir` and `ephemeral` (none: an emptyDir).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("!(has(self.emptyDir) && has(self.ephemeral))").message("workVolume: set emptyDir or ephemeral, not both"))]
#[serde(rename_all = "camelCase")]
pub struct WorkVolume {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<WorkEmptyDir>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<WorkEphemeral>,
}

/// An emptyDir on the node's disk, or in memory (counted against the pod's memory limit).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkEmptyDir {
    /// Default 10Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<Quantity>,
    /// `Memory` for a tmpfs; unset for the node's disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<WorkMedium>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum WorkMedium {
    Memory,
}

/// A generic ephemeral volume: Kubernetes makes a PersistentVolumeClaim for each pod and
/// deletes it with the pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkEphemeral {
    /// The claim's storage class (the cluster's default class when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// The storage requested.
    pub size: Quantity,
    /// Default `[ReadWriteOnce]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<String>,
}

/// Pod-level settings for the executor pods. The fields that hold Kubernetes objects (affinity,
/// topology spread constraints, the pod security context, volumes, the DNS config) are kept as
/// given by the API server and checked by the operator against the Kubernetes types, which
/// keeps the CRD small (ADR 0017).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Labels and annotations added to each pod (cost allocation, mesh injection, agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PodMetadata>,
    /// A Kubernetes `Affinity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::task::free_form_object")]
    pub affinity: Option<Map<String, Value>>,
    /// Kubernetes `TopologySpreadConstraint`s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::task::free_form_objects")]
    pub topology_spread_constraints: Vec<Map<String, Value>>,
    /// The pods' PriorityClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// For example gVisor's or Kata's RuntimeClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// The scheduler that places the pods (default: the cluster's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// A Kubernetes `PodSecurityContext`; replaces the operator's (non-root user 65532, group
    /// 65532, RuntimeDefault seccomp) as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::task::free_form_object")]
    pub security_context: Option<Map<String, Value>>,
    /// Kubernetes `Volume`s for the body (ConfigMaps, Secrets, PVCs, CSI volumes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::task::free_form_objects")]
    pub volumes: Vec<Map<String, Value>>,
    /// Mounts of `volumes` into the body container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Extra `/etc/hosts` entries of the pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_aliases: Vec<HostAlias>,
    /// A Kubernetes `PodDNSConfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::task::free_form_object")]
    pub dns_config: Option<Map<String, Value>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodMetadata {
    /// Added to each pod's labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Added to each pod's annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

fn default_slots() -> i32 {
    1
}
fn default_replicas() -> i32 {
    1
}

/// The user's task-body container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BodyContainer {
    /// The body's image; it needs no Perago software (the runner is copied in).
    pub image: String,
    /// `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// The command run for each attempt (required: the runner wraps it).
    #[schemars(length(min = 1))]
    pub command: Vec<String>,
    /// Arguments after `command`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The body's environment (beside the `PERAGO_*` variables each attempt sets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// ConfigMaps and Secrets whose keys become the body's environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<EnvFromSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The body's working directory (default: the image's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Defaults to the restricted profile when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    /// `perAttempt` (the default): the command runs as a fresh process for every attempt.
    /// `persistent`: one process per slot stays up and takes attempt after attempt over the
    /// runner protocol's version 2, so what it loads once stays loaded (docs/runner-protocol.md).
    #[serde(default, skip_serializing_if = "BodyMode::is_per_attempt")]
    pub mode: BodyMode,
    /// When a persistent body process is replaced by a fresh one, besides crashing or its
    /// attempt being cancelled (`mode: persistent` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<PersistentBody>,
}

/// How the body's command runs: a process per attempt, or one that serves many.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BodyMode {
    #[default]
    PerAttempt,
    Persistent,
}

impl BodyMode {
    fn is_per_attempt(&self) -> bool {
        *self == Self::PerAttempt
    }
}

/// Limits of a persistent body process; past one, it is replaced between attempts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentBody {
    /// Attempts one process serves before it is replaced (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_attempts: Option<u32>,
    /// Resident memory (a quantity, such as `512Mi`) past which the process is replaced after
    /// its attempt ends (default: no limit; the container's memory limit still applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory: Option<Quantity>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarOverrides {
    /// The sidecar's image (default: the operator's `--sidecar-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Replicas follow `ceil((queueDepth + runningAttempts) / targetQueueDepth)`, clamped to
/// `[minReplicas, maxReplicas]`: queued work and the attempts running in the task's pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("autoscaling.minReplicas must be <= maxReplicas"))]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingSpec {
    /// May be 0: no pods while the queue is empty.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_replicas: i32,
    /// Most pods the autoscaler asks for.
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
    /// Work items per pod the autoscaler aims for: queued tasks plus attempts running.
    #[serde(default = "default_target_queue_depth")]
    #[schemars(range(min = 1))]
    pub target_queue_depth: i32,
    /// How long the desired count must stay lower before pods are removed.
    #[serde(default = "default_stabilization")]
    #[schemars(range(min = 0))]
    pub scale_down_stabilization_seconds: i32,
}

fn default_target_queue_depth() -> i32 {
    1
}
fn default_stabilization() -> i32 {
    300
}

/// Conductor endpoint and credentials.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConductorConnection {
    /// API base URL including `/api`, e.g. `http://conductor:8080/api`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Secret with keys `CONDUCTOR_AUTH_KEY` and `CONDUCTOR_AUTH_SECRET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// Task domain the executor pods poll: they serve only the work of workflows that route
    /// this task type to it (`taskToDomain`), and autoscaling reads the domain's queue.
    /// PeragoTasks of one task type in several domains share its TaskDef and must render the
    /// same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        pattern(r"^[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?$")
    )]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
}

/// How the sidecar verifies the server's certificate, and the certificate it presents.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSettings {
    /// The certificate authorities that sign the server's certificate (a private CA), as a
    /// PEM bundle in a ConfigMap or Secret key of the task's namespace (what trust-manager
    /// and cert-manager write). Mounted into the sidecar only, and trusted beside the
    /// built-in web roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle_ref: Option<CaBundleRef>,
    /// The client certificate the sidecar presents to the server, for a gateway in front of
    /// it that admits only clients with one (nginx `ssl_verify_client`, Envoy
    /// `require_client_certificate`): a Secret of type `kubernetes.io/tls` in the task's
    /// namespace (`tls.crt`, `tls.key`; what cert-manager writes). Mounted into the sidecar
    /// only, never the body, so a body sharing the pod's network cannot pass the gateway. A
    /// renewed Secret is used without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_ref: Option<ClientCertificateRef>,
}

/// A Secret of type `kubernetes.io/tls` in the task's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificateRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// One key of a ConfigMap or of a Secret: exactly one of the two.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.configMap) != has(self.secret)").message("caBundleRef names exactly one of configMap and secret"))]
#[serde(rename_all = "camelCase")]
pub struct CaBundleRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<KeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<KeyRef>,
}

/// A key of a ConfigMap or Secret in the task's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// The ConfigMap's or Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Default `ca.crt`.
    #[serde(default = "default_ca_key")]
    #[schemars(length(min = 1, max = 253), pattern(r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

fn default_ca_key() -> String {
    "ca.crt".into()
}

/// Where an executor pod reports each attempt as lineage.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LineageSpec {
    /// OpenLineage run events of every attempt: START when the body starts, then COMPLETE
    /// with the input and published lakeFS commits as datasets, or FAIL with the reason
    /// (ADR 0043). Sent in the background: an endpoint that is down or slow never holds an
    /// attempt up; what cannot be sent is dropped and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_lineage: Option<OpenLineageSpec>,
}

/// An OpenLineage HTTP endpoint, and the namespace of the task's job there.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenLineageSpec {
    /// The `http://` or `https://` URL each run event is POSTed to as given, e.g.
    /// `http://marquez:5000/api/v1/lineage`.
    #[schemars(length(min = 1, max = 2048), pattern(r"^https?://"))]
    pub url: String,
    /// The namespace of the job (the task type) and of the workflow's parent job. Default:
    /// the PeragoTask's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub namespace: Option<String>,
}

impl PeragoTaskSpec {
    /// The OpenLineage endpoint of the task, if it has one.
    pub fn open_lineage(&self) -> Option<&OpenLineageSpec> {
        self.lineage.as_ref().and_then(|l| l.open_lineage.as_ref())
    }
}

/// lakeFS endpoint and credentials.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LakeFsConnection {
    /// lakeFS server URL, e.g. `http://lakefs:8000`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Secret with keys `LAKECTL_CREDENTIALS_ACCESS_KEY_ID` and
    /// `LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
    /// How object bytes travel between executor pods and the object store. Default `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_path: Option<DataPath>,
    /// The object store hosts that URLs presigned by lakeFS may point at: `host`,
    /// `host:port`, `*.suffix` or `*.suffix:port`. A URL on any other host is never followed.
    /// Empty: the operator's default (`lakefs.objectStoreHosts` of its chart).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 261), pattern(r"^((\*\.)?[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$")))]
    pub object_store_hosts: Vec<String>,
}

/// How object bytes travel between executor pods and the object store.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DataPath {
    /// Straight to the object store through URLs lakeFS presigns, when lakeFS can presign
    /// and object store hosts are given; through the lakeFS server otherwise.
    #[default]
    Auto,
    /// Always through presigned URLs: an executor pod whose lakeFS cannot presign, or that
    /// has no object store hosts, does not start, and the task's Ready condition says why.
    Presigned,
    /// Every byte through the lakeFS server.
    Proxied,
}

impl DataPath {
    /// The sidecar's `PERAGO_LAKEFS_DATA_PATH`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Presigned => "presigned",
            Self::Proxied => "proxied",
        }
    }
}

/// Whether deleting the PeragoTask also deletes its Conductor TaskDef.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Keep the TaskDef: running workflows may still reference it.
    #[default]
    Retain,
    Delete,
}

/// Observed state, kept by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeragoTaskStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Reconciling` and `Stalled`, as kstatus reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Desired executor pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Executor pods ready: the runner connected and the sidecar polling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Label selector of the executor pods (for `/scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Scheduled tasks waiting in Conductor's queue for this task type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<i64>,
    /// Attempts running in the task's executor pods (their busy slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_attempts: Option<i64>,
    /// The operator's last change of an autoscaled task's replicas, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale: Option<ScaleDecision>,
    /// SHA-256 of the TaskDef document registered in Conductor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_def_hash: Option<String>,
    /// The last canary rollout of the executor's pod template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::RolloutStatus>,
}

/// One change of replicas by the operator's autoscaling.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleDecision {
    /// When the operator changed the replicas (microseconds).
    pub time: MicroTime,
    /// Replicas before.
    pub from: i32,
    /// Replicas after.
    pub to: i32,
    /// The figures behind it, e.g. `3 queued + 1 running at 2 per pod: 2 pods`.
    pub reason: String,
}

/// The CustomResourceDefinition as YAML, as committed under `crds/`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let body = serde_yaml::to_string(&PeragoTask::crd()).unwrap_or_default();
    format!("# Generated by `perago-operator crd`; do not edit.\n{body}")
}
