//! The Conductor client of the operator, the sidecar and `kubectl perago`: one client per
//! Conductor, every call with a timeout, an Orkes token fetched once and refreshed on 401,
//! percent-encoded path segments, and one error type that names the call.

mod client;
mod error;
pub mod flags;
mod polled;
mod status;
mod workflow;

pub use client::{
    CallObserver, CallOutcome, ConductorClient, TraceContext, answer, http_client, queue_name,
};
pub use error::{ConductorError, ErrorKind};
pub use perago_contract::ConductorCredentials as Credentials;
/// Reading a private CA bundle, as every client here does.
pub use perago_contract::trust;
pub use polled::{POLLED_TASK_FIELDS, polled_tasks};
pub use status::TaskStatus;
pub use workflow::{Workflow, WorkflowTask};
