//! Types and rules shared by the Perago operator and sidecar: the `PeragoTask` custom
//! resource, its validation, Conductor TaskDef rendering, and workspace path rules.

pub mod contract;
pub mod credentials;
pub mod errors;
pub mod manifest;
pub mod paths;
pub mod schema;
pub mod task;
pub mod taskdef;
pub mod url;
pub mod validate;

pub use credentials::ConductorCredentials;
pub use errors::error_chain;
pub use task::{PeragoTask, PeragoTaskSpec, PeragoTaskStatus};
pub use validate::{FieldError, validate};
