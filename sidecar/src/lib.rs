//! The Perago executor sidecar: it polls Conductor for one task type, runs each attempt in
//! the task-body container through `perago-runner`, and reports the result.

pub mod app;
pub mod broker;
pub mod config;
pub mod delivery;
pub mod execution;
pub mod failure;
pub mod http;
pub mod input;
pub mod lineage;
pub mod openlineage;
pub mod otlp;
pub mod outcome;
pub mod pipeline;
pub mod retry;
pub mod runner;
pub mod telemetry;
pub mod trace;
pub mod workspace;
