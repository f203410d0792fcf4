//! The PeragoTask operator as a library: the controller and its reconcile, the Conductor
//! metadata client, the rendering of contracts and executor Deployments, autoscaling, the
//! admission webhook, telemetry, and the command line (`app`) that `main.rs` runs.

pub mod app;
pub mod cli;
pub mod conductor;
pub mod controller;
pub mod owned;
pub mod pods;
pub mod reference;
pub mod render;
pub mod scaling;
pub mod telemetry;
pub mod webhook;

#[cfg(test)]
mod fixtures;
