//! The task contract: everything the sidecar needs to run attempts of one task, rendered by
//! the operator from a `PeragoTask` into a ConfigMap (`perago_api::contract::render`) and read
//! by the sidecar at start.
//!
//! It carries the *strict* forms of the business schemas (`additionalProperties: false` on
//! every object with properties): params are validated against it in strict mode, and in
//! non-strict mode undeclared fields are dropped first, then the same schema applies.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::spec::{Guardrail, MetricSpec, PublishBudget};

/// The contract format version; the sidecar refuses others.
pub const CONTRACT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskContract {
    pub version: u32,
    pub task_name: String,
    /// Absent for a workspace-free task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<ContractWorkspace>,
    pub strict_params: bool,
    pub params_schema: Map<String, Value>,
    pub result_schema: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricSpec>,
    /// Attempts one pod runs at once.
    pub slots: u32,
    /// The TaskDef's `responseTimeoutSeconds`: the lease the sidecar keeps extending.
    pub response_timeout_seconds: i64,
    /// The TaskDef's `timeoutSeconds` (0 = none): the longest an attempt may run.
    pub timeout_seconds: i64,
    /// Writable workspace tasks only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_budget: Option<PublishBudget>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContractWorkspace {
    /// The normalised prefix (`/` for the repository root, else `a/b` without slashes around).
    pub prefix: String,
    pub read_only: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre: Vec<Guardrail>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post: Vec<Guardrail>,
}

impl TaskContract {
    pub fn is_workspace_task(&self) -> bool {
        self.workspace.is_some()
    }
}
