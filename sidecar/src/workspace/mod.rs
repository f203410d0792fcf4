//! The workspace transaction's building blocks: the workspace reference of the input and
//! output, the download (projection of a lakeFS commit), guardrails and change detection.

pub mod attempt;
pub mod branch_pattern;
pub mod download;
pub mod guardrails;
pub mod hard_fence;
pub mod history;
pub mod input;
pub mod janitor;
pub mod publish;
pub mod snapshot;
