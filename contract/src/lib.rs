//! What the Perago sidecar and `perago-runner` share with the operator without needing
//! Kubernetes: the task contract and the spec types it carries, the runner protocol, the
//! workspace path rules, and the small helpers every client uses (error chains, quoted values,
//! names, URL segments). `perago-api` re-exports all of it beside the `PeragoTask` resource.

pub mod contract;
pub mod credentials;
pub mod domain;
pub mod errors;
#[cfg(feature = "tls")]
pub mod identity;
pub mod paths;
pub mod pod_info;
pub mod protocol;
pub mod setting;
pub mod spec;
pub mod text;
#[cfg(feature = "tls")]
pub mod trust;
pub mod url;

pub use credentials::ConductorCredentials;
pub use errors::error_chain;
