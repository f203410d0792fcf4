//! The typed lakeFS client of the workspace transaction. Every call has a timeout and its
//! errors name the call, the repository and the ref, then the cause: never the request URL
//! (its query can hold a whole object key), and a ref longer than [`REF_MAX`] characters is
//! shortened, so the cause survives the cut of a failure reason. Idempotent calls are retried
//! on transient answers (connection errors, 429 and every 5xx); commits and merges
//! never are, except a merge lakeFS refused outright (see [`LakeFsError::merge_refused`]),
//! which the attempt tries again within its merge budget.

mod answer;
mod client;
pub mod direct;
mod error;
pub mod flags;
mod merge;
mod retry;
mod upload;

pub use answer::{Commit, ObjectEntry};
#[doc(hidden)] // public for the fuzz targets
pub use answer::{MergeResult, ObjectError, ObjectErrorList, Ref, decode, error_message, page};
pub use client::{LakeFsClient, TraceContext};
pub use error::{Call, ErrorKind, LakeFsError, REF_MAX, request_error};
pub use merge::MergeOutcome;
pub use retry::idempotent_call as retries;
