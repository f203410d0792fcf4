//! What a Perago publication is, shared by the sidecar, which makes publications, and by
//! `kubectl perago`, which reads them back: the attempt a Conductor task stands for, the
//! workspace reference of its input, its staging branch's name, the `perago.*` metadata of
//! its commits, the walk that explains a branch's history, the janitor's verdict on a
//! staging branch, and the texts of the hard fence. No Kubernetes, no telemetry: the plugin
//! links only this, the lakeFS client and the Conductor client.

pub mod attempt;
pub mod branch_pattern;
pub mod hard_fence;
pub mod history;
pub mod janitor;
pub mod publication;
pub mod reference;
pub mod refusal;
pub mod staging;
