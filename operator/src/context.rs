//! What every part of the reconcile shares: the context (clients, the watched stores, the
//! scaler's state, defaults), the reconcile's error, and which Conductor a task belongs to.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::runtime::events::Recorder;

use perago_api::PeragoTask;

use crate::conductor::{ConductorError, Conductors};
use crate::owned::Owned;
use crate::render::Defaults;
use crate::scope::Stores;

pub struct Context {
    pub client: Client,
    pub conductor: Conductors,
    /// The task's `spec.conductor.url` wins over the default in `defaults`.
    pub defaults: Defaults,
    pub recorder: Recorder,
    /// How often a healthy task is looked at again (drift of the TaskDef in Conductor, queue
    /// depth of autoscaled tasks).
    pub resync: Duration,
    pub metrics: Arc<crate::telemetry::Metrics>,
    /// Asks executor pods how many attempts they run (`/slots`).
    pub pods: crate::slots::SlotsClient,
    /// Every autoscaled task's scaling state, the book of busy slots included.
    pub scaler: crate::scaler::Scaler,
    /// Queue sizes of every Conductor, read every few seconds.
    pub queues: crate::queues::QueueWatch,
    /// The executor pods, Deployments and ConfigMaps, as the watches keep them.
    pub owned: Owned,
    /// Every watched PeragoTask, as the controllers' watches keep them (for a task's siblings).
    pub tasks: Stores<PeragoTask>,
    /// This cluster's name in the TaskDefs it registers (ADR 0040); empty when unnamed.
    pub cluster: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Conductor(#[from] ConductorError),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Adding or removing the finalizer failed, or the apply or cleanup inside it did.
    #[error(transparent)]
    Finalizer(#[from] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("the watch of the executor pods, Deployments and ConfigMaps stopped")]
    WatchStopped,
    #[error("the reconcile did not end within {} s; it was dropped and is retried", .0.as_secs())]
    Deadline(std::time::Duration),
}

/// The Conductor a task registers with: its own `spec.conductor.url`, else the default.
pub fn conductor_url(task: &PeragoTask, ctx: &Context) -> String {
    crate::render::conductor_url(task, &ctx.defaults)
}
