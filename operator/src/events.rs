//! Kubernetes events about a task, through kube-runtime's recorder.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

use perago_api::PeragoTask;

/// Publish an event about `task`; a failure is logged, never the reconcile's.
pub async fn publish(
    recorder: &Recorder,
    task: &PeragoTask,
    type_: EventType,
    reason: &str,
    note: String,
) {
    send(
        recorder.clone(),
        task.object_ref(&()),
        event(type_, reason, note),
    )
    .await;
}

/// The event with `note`, under an action of its own.
pub fn event(type_: EventType, reason: &str, note: String) -> Event {
    // kube-runtime folds events with the same type, reason and action into one series that
    // keeps the first note: a later `Scaled 0 → 2` would show as the earlier `1 → 0`. An
    // action per distinct note keeps each message and still folds true repeats.
    let note: String = note.chars().take(1000).collect();
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&note, &mut hasher);
    Event {
        type_,
        reason: reason.into(),
        action: format!("Reconcile-{:016x}", std::hash::Hasher::finish(&hasher)),
        note: Some(note),
        secondary: None,
    }
}

pub async fn send(recorder: Recorder, reference: ObjectReference, event: Event) {
    if let Err(e) = recorder.publish(&event, &reference).await {
        warn!(error = %e, "publishing an event failed");
    }
}
