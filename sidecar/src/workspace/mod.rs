//! The workspace transaction's building blocks: the download (projection of a lakeFS
//! commit), guardrails, change detection, the publication, and the sidecar's watches (the
//! staging sweep, the hard fence). What a publication is lives in `perago_workspace`.

pub mod download;
pub mod guardrails;
pub mod hard_fence;
pub mod janitor;
pub mod publish;
pub mod snapshot;
mod tree;

use std::sync::Arc;

use perago_contract::contract::ContractWorkspace;

use perago_lakefs::LakeFsClient;

/// What a workspace task needs at run time, built once at start-up.
pub struct WorkspaceRuntime {
    pub spec: ContractWorkspace,
    pub lakefs: LakeFsClient,
    pub limits: TransferLimits,
    /// Writable tasks with the sweep on: told each repository an attempt writes to.
    pub staging_sweep: Option<Arc<janitor::StagingSweep>>,
    /// Writable tasks: told each target branch an attempt publishes to.
    pub hard_fence: Option<Arc<hard_fence::HardFenceWatch>>,
    /// Which code produced each publication.
    pub lineage: crate::lineage::LineageSource,
}

/// Limits of the lakeFS transfers of an attempt.
pub struct TransferLimits {
    /// Testing only: the crash point to exit at (see `PERAGO_FAULT`).
    pub fault: Option<crate::config::FaultPoint>,
    pub parallelism: usize,
    pub object_timeout: std::time::Duration,
    pub merge_timeout: std::time::Duration,
}
