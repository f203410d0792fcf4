//! Types and rules shared by the Perago operator and sidecar: the `PeragoTask` custom
//! resource, its validation, Conductor TaskDef rendering, and (re-exported from
//! `perago-contract`) the task contract and workspace path rules.

pub mod contract;
pub mod manifest;
pub mod pod;
pub mod quantity;
pub mod rollout;
pub mod schema;
pub mod task;
pub mod taskdef;
pub mod validate;

pub use perago_contract::{ConductorCredentials, credentials, error_chain, errors, paths, url};
pub use task::{PeragoTask, PeragoTaskSpec, PeragoTaskStatus};
pub use validate::{FieldError, validate};
