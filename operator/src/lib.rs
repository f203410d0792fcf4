//! The PeragoTask operator as a library: the controller and its reconcile (observe what
//! exists, decide in pure functions — the status in `status`, the replicas in `scaler`, the
//! children in `render` — then apply), the Conductor metadata client, the queue watch, the
//! admission webhook, telemetry, and the command line (`app`) that `main.rs` runs.

pub mod app;
pub mod census;
pub mod cli;
pub mod conductor;
pub mod context;
pub mod controller;
pub mod events;
pub mod leadership;
pub mod lineage;
pub mod owned;
pub mod pods;
pub mod queues;
pub mod reference;
pub mod registrar;
pub mod render;
pub mod rollout;
pub mod scaler;
pub mod scaling;
pub mod scope;
pub mod selftest;
pub mod siblings;
pub mod slots;
pub mod status;
pub mod telemetry;
pub mod triggers;
pub mod webhook;

#[cfg(test)]
mod fixtures;
