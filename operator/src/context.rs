//! What every part of the reconcile shares: the context (clients, caches, defaults), the
//! reconcile's error, and which Conductor a task belongs to. The controller and the scaler
//! both use it; neither imports the other's internals.

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
    /// Recent replica recommendations per autoscaled task, for scale-down stabilisation.
    pub recommendations:
        std::sync::Mutex<std::collections::HashMap<String, Vec<(std::time::Instant, i32)>>>,
    /// When the operator last changed a deletion cost of each autoscaled task's pods.
    pub costs_changed: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// The deletion costs this process wrote, by `namespace/pod`: what it wrote and when, until
    /// the cache of pods shows it ([`crate::scaling::cost_now`]).
    pub costs_written:
        std::sync::Mutex<std::collections::HashMap<String, (Option<String>, std::time::Instant)>>,
    /// The replicas this process last wrote through each autoscaled task's `/scale`, the
    /// task's generation before that write, and when ([`crate::scaling::scale_written`]).
    pub scales_written:
        std::sync::Mutex<std::collections::HashMap<String, crate::scaling::ScaleWritten>>,
    /// The last scale decision of each autoscaled task, until the watched task's status shows
    /// it ([`crate::scaling::last_scale`]).
    pub last_scales:
        std::sync::Mutex<std::collections::HashMap<String, perago_api::task::ScaleDecision>>,
    /// The port of the executor pods' `/slots` ([`crate::render::METRICS_PORT`]).
    pub slots_port: u16,
    /// Asks executor pods how many attempts they run (`/slots`), with a short timeout.
    pub pods_http: reqwest::Client,
    /// Permits for `/slots` requests in flight ([`crate::scaling::PROBES_AT_ONCE`]).
    pub probes: tokio::sync::Semaphore,
    /// What each running executor pod last said on `/slots`, kept by the census.
    pub slots: crate::slots::Book,
    /// Queue sizes of every Conductor, read every few seconds.
    pub queues: crate::queues::QueueWatch,
    /// The executor pods, Deployments and ConfigMaps, as the watches keep them.
    pub owned: Owned,
    /// Every watched PeragoTask, as the controllers' watches keep them (for a task's siblings).
    pub tasks: Stores<PeragoTask>,
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
