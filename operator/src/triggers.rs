//! What wakes a task's reconcile, and how soon (ADR 0032).
//!
//! A change a user or the operator made to the task itself — a new generation, its
//! finalizers, labels or annotations, its deletion — and a wake-up from the queue watch or the
//! census start the reconcile at once. The task's status changes are the operator's own
//! writes and wake nothing. The changes of the objects a task owns come in bursts (the
//! reconcile's own applies, a rollout's run of Deployment status updates): those of one task
//! within [`CHILDREN_WINDOW`] of the first make one reconcile, at the window's end.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use kube::runtime::controller::trigger_owners;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Predicate, predicates};
use tokio::time::Instant;
use tracing::warn;

use perago_api::PeragoTask;

use crate::owned::Triggers;

/// How long a task's children's changes are gathered into one reconcile.
pub const CHILDREN_WINDOW: Duration = Duration::from_millis(500);

/// What of a task, when it changes, needs a reconcile: everything but its status.
pub fn task_changes() -> impl Predicate<PeragoTask> {
    predicates::generation
        .combine(predicates::finalizers)
        .combine(predicates::labels)
        .combine(predicates::annotations)
}

/// The tasks whose Deployments, ConfigMaps or NetworkPolicies changed, gathered per task over
/// [`CHILDREN_WINDOW`]. A failing watch is logged here; it retries on its own backoff.
pub fn children(triggers: Triggers) -> impl Stream<Item = ObjectRef<PeragoTask>> + Send {
    let owners = futures_util::stream::select_all([
        trigger_owners::<PeragoTask, _>(triggers.deployments, (), ()).boxed(),
        trigger_owners::<PeragoTask, _>(triggers.config_maps, (), ()).boxed(),
        trigger_owners::<PeragoTask, _>(triggers.network_policies, (), ()).boxed(),
    ])
    .filter_map(|owner| async move {
        owner
            .map_err(|e| warn!(error = %e, "a watch of the tasks' children failed; retrying"))
            .ok()
            .map(|request| request.obj_ref)
    });
    gathered(owners, CHILDREN_WINDOW)
}

/// Each task of `changes` once per `window`: its first change opens a window, the changes
/// within it are absorbed, and the task comes out when it closes. A window never restarts, so
/// a task whose children change all the time is still reconciled every `window`.
pub fn gathered<S>(changes: S, window: Duration) -> impl Stream<Item = ObjectRef<PeragoTask>> + Send
where
    S: Stream<Item = ObjectRef<PeragoTask>> + Send + 'static,
{
    struct Windows<S> {
        changes: std::pin::Pin<Box<S>>,
        open: HashSet<ObjectRef<PeragoTask>>,
        /// Every window is as long, so they close in the order they opened.
        closing: VecDeque<(Instant, ObjectRef<PeragoTask>)>,
        ended: bool,
    }
    let windows = Windows {
        changes: Box::pin(changes),
        open: HashSet::new(),
        closing: VecDeque::new(),
        ended: false,
    };
    futures_util::stream::unfold(windows, move |mut w| async move {
        loop {
            let next = w.closing.front().map(|(at, _)| *at);
            if w.ended && next.is_none() {
                return None;
            }
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    if let Some((_, task)) = w.closing.pop_front() {
                        w.open.remove(&task);
                        return Some((task, w));
                    }
                }
                change = w.changes.next(), if !w.ended => match change {
                    Some(task) => {
                        if w.open.insert(task.clone()) {
                            w.closing.push_back((Instant::now() + window, task));
                        }
                    }
                    None => w.ended = true,
                },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use kube::ResourceExt;

    fn task(name: &str) -> ObjectRef<PeragoTask> {
        ObjectRef::new(name).within("default")
    }

    /// Changes of tasks `a` and `b` sent at the given milliseconds come out gathered: the
    /// milliseconds each task came out at.
    #[tokio::test(start_paused = true)]
    async fn a_tasks_changes_within_a_window_make_one_trigger_at_its_end() {
        let sent = [
            (0, "a"),
            (100, "a"),
            (300, "b"),
            (450, "a"),
            (600, "a"),
            (1_000, "b"),
        ];
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let start = Instant::now();
        tokio::spawn(async move {
            for (at, name) in sent {
                tokio::time::sleep_until(start + Duration::from_millis(at)).await;
                tx.send(task(name)).await.unwrap();
            }
        });
        let changes =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|t| (t, rx)) },
            );
        let out: Vec<(u128, String)> = gathered(changes, Duration::from_millis(500))
            .map(|t| (start.elapsed().as_millis(), t.name))
            .collect()
            .await;
        let out: Vec<(u128, &str)> = out.iter().map(|(at, n)| (*at, n.as_str())).collect();
        assert_eq!(
            out,
            [(500, "a"), (800, "b"), (1_100, "a"), (1_500, "b")],
            "a's changes at 0, 100 and 450 ms make one trigger; the one at 600 opens the next window"
        );
    }

    #[test]
    fn only_a_change_beside_the_status_needs_a_reconcile() {
        let task: PeragoTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask",
            "metadata": {"name": "t", "namespace": "default", "uid": "u", "generation": 1},
            "spec": {"taskName": "op.t", "ownerEmail": "a@b.c",
                     "paramsSchema": {"type": "object"}, "resultSchema": {"type": "object"},
                     "executor": {"body": {"image": "b", "command": ["run"]}}},
        }))
        .unwrap();
        let hash = |t: &PeragoTask| task_changes().hash_property(t);
        let mut status = task.clone();
        status.status = Some(Default::default());
        assert_eq!(hash(&task), hash(&status), "a status write");
        let mut spec = task.clone();
        spec.metadata.generation = Some(2);
        assert_ne!(hash(&task), hash(&spec), "a new generation");
        let mut finalized = task.clone();
        finalized.finalizers_mut().push("perago.io/cleanup".into());
        assert_ne!(hash(&task), hash(&finalized), "a finalizer added");
        let mut labelled = task.clone();
        labelled.labels_mut().insert("team".into(), "data".into());
        assert_ne!(hash(&task), hash(&labelled), "a label");
    }
}
