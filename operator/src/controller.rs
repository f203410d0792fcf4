//! The PeragoTask controller: validate, register the TaskDef in Conductor (and repair drift),
//! apply the contract ConfigMap and the executor Deployment, keep the status true; on delete,
//! apply the TaskDef deletion policy behind a finalizer.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Error as FinalizerError, Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{Instrument, debug, info, warn};

use perago_api::task::{DeletionPolicy, ScaleDecision};
use perago_api::{PeragoTask, PeragoTaskStatus, contract, taskdef, validate};

use crate::conductor::{ConductorError, holds};
use crate::context::{Context, Error, conductor_url};
use crate::owned;
use crate::render::{self, TASK_LABEL};
use crate::scope::{Scope, Stores, Wake};
use crate::telemetry::WaitCause;
use crate::{scaling, siblings, slots, status, triggers};

pub const FINALIZER: &str = "perago.io/taskdef";
const MANAGER: &str = "perago-operator";
/// The longest a reconcile may take: its Conductor calls have their own 10 s timeouts and a
/// healthy one takes well under a second.
const RECONCILE_DEADLINE: Duration = Duration::from_secs(60);

async fn publish_event(
    ctx: &Context,
    task: &PeragoTask,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = event(type_, reason, note);
    send_event(ctx.recorder.clone(), task.object_ref(&()), event).await;
}

fn event(type_: EventType, reason: &str, note: String) -> Event {
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

async fn send_event(recorder: Recorder, reference: ObjectReference, event: Event) {
    if let Err(e) = recorder.publish(&event, &reference).await {
        warn!(error = %e, "publishing an event failed");
    }
}

/// The status, with the task's last scale decision ([`scaling::last_scale`]);
/// `perago_operator_task_ready` follows its Ready condition.
async fn patch_status(
    ctx: &Context,
    api: &Api<PeragoTask>,
    task: &PeragoTask,
    status: PeragoTaskStatus,
) -> Result<(), Error> {
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ctx.metrics.task_ready(task).set(i64::from(ready));
    let status = PeragoTaskStatus {
        last_scale: scaling::last_scale(ctx, task),
        ..status
    };
    // Nothing new: no write. Besides the request saved, a reconcile sees the cached object,
    // which may lag the operator's own last write by one event; writing what it computed from
    // it anyway flipped the stored status back and forth (a condition's transition time), each
    // write waking the next reconcile. The watch event of the last write still comes, and the
    // reconcile it wakes writes if anything differs.
    if task.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let patch = json!({"apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask", "status": status});
    api.patch_status(
        &task.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// Create the TaskDef, or rewrite it when it no longer holds the rendered values.
async fn register_task_def(
    ctx: &Context,
    task: &PeragoTask,
    base: &str,
    doc: &serde_json::Value,
) -> Result<(), ConductorError> {
    let name = &task.spec.task_name;
    let conductor = ctx.conductor.at(base);
    // A listing up to half a resync old: drift shows within one and a half resyncs.
    match ctx.conductor.task_def(base, name, ctx.resync / 2).await? {
        None => {
            // Absent from a listing that may be a little old: a create is an upsert, so a
            // TaskDef made since is rewritten with the same values.
            conductor.create_task_def(name, doc).await?;
            ctx.conductor.wrote_task_def(base, name, Some(doc)).await;
            info!(task_def = %name, "registered the TaskDef");
            publish_event(
                ctx,
                task,
                EventType::Normal,
                "TaskDefRegistered",
                format!("registered TaskDef {name} in Conductor"),
            )
            .await;
        }
        Some(stored) if !holds(&stored, doc) => {
            conductor.update_task_def(name, doc).await?;
            ctx.conductor.wrote_task_def(base, name, Some(doc)).await;
            info!(task_def = %name, "repaired the TaskDef");
            publish_event(
                ctx,
                task,
                EventType::Normal,
                "TaskDefRepaired",
                format!("TaskDef {name} differed from the PeragoTask in Conductor; rewrote it"),
            )
            .await;
        }
        Some(_) => {}
    }
    Ok(())
}

/// `rendered` applied under the operator's field manager, unless the watched object in `store`
/// already holds it (ADR 0015); the object as it is now, either way.
async fn apply_owned<K>(
    ctx: &Context,
    ns: &str,
    store: &Stores<K>,
    rendered: K,
) -> Result<Arc<K>, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    K: Clone + std::fmt::Debug + Serialize + DeserializeOwned + 'static,
{
    let kind = K::kind(&());
    if let Some(live) = ctx.owned.unchanged(store, &rendered) {
        ctx.metrics.applied(&kind, false);
        return Ok(live);
    }
    let applied = Api::<K>::namespaced(ctx.client.clone(), ns)
        .patch(
            &rendered.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&rendered),
        )
        .await?;
    ctx.owned.applied(&rendered, &applied);
    ctx.metrics.applied(&kind, true);
    Ok(Arc::new(applied))
}

/// The task's NetworkPolicy applied when it wants one, else removed if the operator made one.
async fn keep_network_policy(ctx: &Context, ns: &str, task: &PeragoTask) -> Result<(), Error> {
    if let Some(policy) = render::network_policy(task, &ctx.defaults) {
        return apply_owned(ctx, ns, &ctx.owned.network_policies, policy)
            .await
            .map(drop);
    }
    let name = render::object_name(task);
    if ctx
        .owned
        .network_policies
        .get(&ObjectRef::new(&name).within(ns))
        .is_none()
    {
        return Ok(());
    }
    match Api::<NetworkPolicy>::namespaced(ctx.client.clone(), ns)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A failed Conductor call: say so in the status and once per distinct message in a Warning
/// event; the error policy retries.
async fn conductor_unavailable(
    api: &Api<PeragoTask>,
    task: &PeragoTask,
    ctx: &Context,
    error: ConductorError,
) -> Error {
    // The client's errors leave the URL out (a pod's failure reasons are cut to a length);
    // here the server is named, so a wrong `spec.conductor.url` shows.
    let message = format!("{error} (Conductor {})", conductor_url(task, ctx));
    let old = task.status.clone().unwrap_or_default();
    let reason = status::CONDUCTOR_UNAVAILABLE;
    let repeated = status::says(&old, "Ready", Some(reason), &message);
    let unavailable = status::conductor_unavailable(&old, task.metadata.generation, &message);
    if let Err(e) = patch_status(ctx, api, task, unavailable).await {
        warn!(error = %e, "recording the Conductor failure in the status failed");
    }
    if !repeated {
        publish_event(ctx, task, EventType::Warning, reason, message).await;
    }
    Error::Conductor(error)
}

/// The reason of the conditions while the API server refuses the ConfigMap or Deployment.
const APPLY_REFUSED: &str = "ApplyRefused";

/// A refusal that repeating the same request will not change (an admission webhook or policy,
/// RBAC, an invalid object), unlike a conflict, throttling or a server error.
fn refused(status: &kube::core::Status) -> bool {
    (400..500).contains(&status.code) && ![404, 408, 409, 429].contains(&status.code)
}

/// A task that cannot go on until something changes: the status says so (Stalled, for
/// `reason`), and a Warning event does once per message.
async fn stall(
    ctx: &Context,
    api: &Api<PeragoTask>,
    task: &PeragoTask,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let old = task.status.clone().unwrap_or_default();
    let was_stalled = status::says(&old, "Stalled", Some(reason), &message);
    let blocked = status::blocked(&old, task.metadata.generation, reason, &message);
    patch_status(ctx, api, task, blocked).await?;
    if !was_stalled {
        warn!(task = %task.name_any(), reason, detail = %message, "the task cannot go on");
        publish_event(ctx, task, EventType::Warning, reason, message).await;
    }
    Ok(())
}

/// Everything checked before acting on a spec, by the reconciler and the admission webhook
/// alike: the rules (`perago-operator check`'s messages), then rendering the sidecar's contract
/// and the TaskDef. Ok holds both and the warnings.
pub fn checked(
    spec: &perago_api::PeragoTaskSpec,
) -> Result<(contract::TaskContract, serde_json::Value, Vec<String>), String> {
    let warnings = validate(spec).map_err(|e| e.to_string())?;
    let contract = contract::render(spec).map_err(|e| e.to_string())?;
    let doc = taskdef::render(spec).map_err(|e| e.to_string())?;
    Ok((contract, doc, warnings))
}

/// What the reconcile reads before it decides: the task's executor pods and the work, running
/// in them and queued in Conductor (read after the pods, so that a task a pod has just taken
/// is not counted twice).
struct Work {
    pods: Vec<Arc<Pod>>,
    busy: Vec<scaling::BusyPod>,
    running: i64,
    queued: i64,
    /// When the queue was read.
    queue_read: std::time::Instant,
    /// When the reconcile began to look: a pod asked since has a figure of now.
    observed: std::time::Instant,
    /// The direction of the `/scale` write this reconcile made, if it made one.
    scaled: Option<&'static str>,
}

async fn observe(ctx: &Context, task: &PeragoTask, base: &str) -> Result<Work, Error> {
    let ns = task.namespace().unwrap_or_else(|| "default".into());
    ctx.owned.ready().await.map_err(|_| Error::WatchStopped)?;
    let observed = std::time::Instant::now();
    let pods = ctx.owned.pods(&ns, &task.name_any());
    let busy = slots::busy_pods(ctx, task, &pods).await;
    let running: i64 = busy.iter().map(|p| p.busy).sum();
    let (queued, queue_read) = scaling::queued(ctx, base, task, running).await?;
    Ok(Work {
        pods,
        busy,
        running,
        queued,
        queue_read,
        observed,
        scaled: None,
    })
}

/// The reconcile of a live task: an invalid spec only says so; a valid one has its TaskDef
/// registered, its replicas decided, its ConfigMap and Deployment applied, and its status
/// decided from what came back.
async fn apply(task: Arc<PeragoTask>, ctx: &Context) -> Result<Action, Error> {
    let ns = task.namespace().unwrap_or_else(|| "default".into());
    let api: Api<PeragoTask> = Api::namespaced(ctx.client.clone(), &ns);
    let generation = task.metadata.generation;
    let old = task.status.clone().unwrap_or_default();

    let (contract, doc) = match checked(&task.spec) {
        Ok((contract, doc, _)) => (contract, doc),
        Err(message) => {
            stall(ctx, &api, &task, status::INVALID_SPEC, message).await?;
            return Ok(Action::await_change());
        }
    };

    let base = conductor_url(&task, ctx);
    let tasks = ctx.tasks.state();
    let siblings = siblings::of(&task, &base, &tasks, |t| conductor_url(t, ctx));
    let rendered = |t: &PeragoTask| checked(&t.spec).ok().map(|(_, doc, _)| doc);
    if let Some(conflict) = siblings::conflict(&task, &doc, siblings, rendered) {
        stall(ctx, &api, &task, siblings::REASON, conflict.to_string()).await?;
        // A sibling's change does not wake this task: look again at the resync.
        return Ok(Action::requeue(ctx.resync));
    }
    let work = match register_task_def(ctx, &task, &base, &doc).await {
        Ok(()) => observe(ctx, &task, &base).await,
        Err(e) => Err(Error::Conductor(e)),
    };
    let mut work = match work {
        Ok(work) => work,
        Err(Error::Conductor(e)) => return Err(conductor_unavailable(&api, &task, ctx, e).await),
        Err(e) => return Err(e),
    };

    let (replicas, scale_in_deferred) = scale(ctx, &api, &task, &mut work).await?;
    ctx.metrics.task_queued(&task).set(work.queued);
    ctx.metrics.task_running(&task).set(work.running);
    ctx.metrics.task_replicas(&task).set(i64::from(replicas));

    let cm = render::config_map(&task, &contract);
    let applied = async {
        apply_owned(ctx, &ns, &ctx.owned.config_maps, cm).await?;
        // Before the Deployment, so that new pods start already bound by it.
        keep_network_policy(ctx, &ns, &task).await?;
        let deployment = render::deployment(&task, &contract, &ctx.defaults, replicas);
        apply_owned(ctx, &ns, &ctx.owned.deployments, deployment).await
    };
    let applied = match applied.await {
        Ok(applied) => applied,
        Err(Error::Kube(kube::Error::Api(refusal))) if refused(&refusal) => {
            let message = format!(
                "the API server refused the executor's objects ({} {}): {}",
                refusal.code, refusal.reason, refusal.message
            );
            stall(ctx, &api, &task, APPLY_REFUSED, message).await?;
            return Ok(Action::requeue(ctx.resync));
        }
        Err(e) => return Err(e),
    };

    let deployment_status = applied.status.clone().unwrap_or_default();
    let problem = crate::pods::problem(work.pods.iter().map(|p| &**p))
        .or_else(|| crate::pods::replica_failure(&deployment_status));
    let seen = status::Observed {
        generation,
        deployment_generation: applied.metadata.generation,
        deployment: &deployment_status,
        replicas,
        problem: problem.as_ref(),
        selector: format!("{TASK_LABEL}={}", task.name_any()),
        queued: work.queued,
        running: work.running,
        task_def_hash: taskdef::hash(&doc),
    };
    let rolled_out = seen.rolled_out();
    if let Some(p) = problem.as_ref().filter(|_| !rolled_out) {
        let reported = old
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.message.ends_with(&p.message));
        if !reported {
            warn!(task = %task.name_any(), problem = %p.message, "executor pods are not starting");
            let note = p.message.clone();
            publish_event(ctx, &task, EventType::Warning, "ExecutorPodFailing", note).await;
        }
    }
    patch_status(ctx, &api, &task, status::observed(&old, &seen)).await?;
    if let Some(direction) = work.scaled {
        ctx.metrics
            .scale_seconds
            .with_label_values(&[direction])
            .observe(work.queue_read.elapsed().as_secs_f64());
    }
    Ok(Action::requeue(if scale_in_deferred {
        scaling::SCALE_IN_AFTER_COSTS
    } else if rolled_out {
        ctx.resync
    } else {
        ctx.resync.min(Duration::from_secs(15))
    }))
}

/// The replicas of this pass: the spec's (which an HPA or KEDA may drive through /scale), or
/// for an autoscaled task the scaler's decision, written through /scale with an event and
/// `status.lastScale`. A scale-in to fewer pods, not to zero, first sets the pods' deletion
/// costs and is deferred (the flag) to a later pass: the ReplicaSet controller picks victims
/// from its own cache of pods, which must already hold the new costs.
async fn scale(
    ctx: &Context,
    api: &Api<PeragoTask>,
    task: &PeragoTask,
    work: &mut Work,
) -> Result<(i32, bool), Error> {
    let Some(auto) = &task.spec.executor.autoscaling else {
        return Ok((task.spec.executor.replicas, false));
    };
    // This process's last decision, when the watched task does not show it yet, is what the
    // task has: a scale-up builds on it at once; anything else waits for the watch.
    let written = scaling::scale_written(ctx, task);
    let replicas = written.unwrap_or(task.spec.executor.replicas);
    let window =
        Duration::from_secs(u64::try_from(auto.scale_down_stabilization_seconds).unwrap_or(0));
    let decide = |work: &Work, again: bool| {
        let wanted = scaling::recommended(work.queued + work.running, auto);
        let mut all = ctx
            .recommendations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let history = all.entry(scaling::task_key(task)).or_default();
        if again {
            scaling::restabilised(history, replicas, wanted)
        } else {
            scaling::stabilised(history, std::time::Instant::now(), window, replicas, wanted)
        }
    };
    let mut next = decide(work, false);
    if written.is_some() && next <= replicas {
        return Ok((replicas, false));
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    if next < replicas
        && let Some(pod) = work.pods.iter().find(|p| scaling::starting(p, now))
    {
        debug!(from = replicas, to = next, pod = %pod.name_any(), "the scale-in waits for a starting pod");
        return Ok((replicas, true));
    }
    if next < replicas && scaling::pods_unseen(ctx, task, &work.pods, replicas, now) {
        debug!(
            from = replicas,
            to = next,
            "the scale-in waits for pods the watch does not show yet"
        );
        return Ok((replicas, true));
    }
    if next < replicas {
        // The book's figures may be a census period old. The scale-in marks its pods from them
        // and waits until the ReplicaSet's cache has seen the marks; only then are the pods it
        // would remove asked again, and the decision made again with their answers, until each
        // has answered during this reconcile counting every task its polls took from the
        // queue read. So a pod is asked once, when the scale-in is about to remove it; should
        // one have turned busy, the marks move and the scale-in waits again (ADR 0030). A
        // scale-in to zero removes every pod, so it marks none (ADR 0033).
        let removals = |next: i32| usize::try_from(replicas - next).unwrap_or(0);
        if next > 0
            && let Some(why) = mark_for_scale_in(ctx, task, &work.busy, removals(next)).await
        {
            debug!(from = replicas, to = next, %why, "the scale-in waits");
            return Ok((replicas, true));
        }
        let mut asks = 0;
        while next < replicas {
            let (read, observed) = (work.queue_read, work.observed);
            let stale = scaling::unconfirmed_removals(&work.busy, removals(next), read, observed);
            if stale.is_empty() {
                break;
            }
            match asks {
                0 => {}
                // A sidecar that does not say which polls it counts is trusted from then, and
                // a poll a loaded Conductor is slow to answer may be answered by then.
                1 => tokio::time::sleep_until((read + scaling::QUEUE_SETTLE).into()).await,
                _ => {
                    debug!(
                        from = replicas,
                        to = next,
                        "the scale-in waits for pods whose polls from before the queue read are not answered yet"
                    );
                    return Ok((replicas, true));
                }
            }
            slots::ask_again(ctx, task, &mut work.busy, &stale, read).await;
            asks += 1;
            work.running = work.busy.iter().map(|p| p.busy).sum();
            next = decide(work, true);
        }
        if next < replicas
            && next > 0
            && let Some(why) = mark_for_scale_in(ctx, task, &work.busy, removals(next)).await
        {
            debug!(from = replicas, to = next, %why, "the scale-in waits");
            return Ok((replicas, true));
        }
    }
    if next == replicas {
        return Ok((replicas, false));
    }
    let (queued, running) = (work.queued, work.running);
    api.patch_scale(
        &task.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": next}})),
    )
    .await?;
    work.scaled = Some(if next > replicas { "up" } else { "down" });
    scaling::wrote_scale(ctx, task, next);
    let reason = scaling::reason(queued, running, auto, next);
    info!(queued, running, from = replicas, to = next, %reason, "scaled the executor");
    let note = format!("{replicas} → {next} executor pods: {reason}");
    // The event is not waited for: in a wave every write of the reconcile waits its turn at the
    // API server, and the Deployment and status that follow matter more.
    let event = event(EventType::Normal, "Scaled", note);
    let sent = send_event(ctx.recorder.clone(), task.object_ref(&()), event);
    tokio::spawn(sent.in_current_span());
    scaling::decided(
        ctx,
        task,
        ScaleDecision {
            time: MicroTime(k8s_openapi::jiff::Timestamp::now()),
            from: replicas,
            to: next,
            reason,
        },
    );
    Ok((next, false))
}

/// Set the deletion costs that make the ReplicaSet remove `count` of `pods` (ADR 0027), and
/// say why the scale-in must still wait, if it must ([`scaling::scale_in_waits`]).
async fn mark_for_scale_in(
    ctx: &Context,
    task: &PeragoTask,
    pods: &[scaling::BusyPod],
    count: usize,
) -> Option<String> {
    let ns = task.namespace().unwrap_or_else(|| "default".into());
    let key = scaling::task_key(task);
    let now = std::time::Instant::now();
    let mut costs_changed = ctx
        .costs_changed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&key)
        .copied();
    if scaling::mark_deletion_costs(ctx, &ns, pods, count).await > 0 {
        costs_changed = Some(now);
        ctx.costs_changed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, now);
    }
    scaling::scale_in_waits(pods, costs_changed, now)
}

async fn cleanup(task: Arc<PeragoTask>, ctx: &Context) -> Result<Action, Error> {
    ctx.metrics.forget_task(&task);
    let key = scaling::task_key(&task);
    ctx.recommendations
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&key);
    ctx.costs_changed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&key);
    ctx.scales_written
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&key);
    ctx.last_scales
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&key);
    ctx.owned.forget(
        task.namespace().as_deref().unwrap_or("default"),
        &render::object_name(&task),
    );
    if task.spec.deletion_policy == DeletionPolicy::Delete {
        let base = conductor_url(&task, ctx);
        let name = &task.spec.task_name;
        let tasks = ctx.tasks.state();
        let sibling = siblings::of(&task, &base, &tasks, |t| conductor_url(t, ctx)).next();
        if let Some(sibling) = sibling {
            let note = format!(
                "kept TaskDef {name} (deletionPolicy: Delete): PeragoTask {}/{} still uses it",
                sibling.namespace().unwrap_or_default(),
                sibling.name_any()
            );
            info!(task_def = %name, "{note}");
            publish_event(ctx, &task, EventType::Normal, "TaskDefKept", note).await;
            return Ok(Action::await_change());
        }
        ctx.conductor.at(&base).delete_task_def(name).await?;
        ctx.conductor.wrote_task_def(&base, name, None).await;
        info!(task_def = %task.spec.task_name, "deleted the TaskDef (deletionPolicy: Delete)");
    }
    Ok(Action::await_change())
}

async fn reconcile(task: Arc<PeragoTask>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    if let Some((cause, waited)) = ctx
        .metrics
        .waits
        .reconcile_started(&ObjectRef::from_obj(&*task))
    {
        debug!(task = %task.name_any(), ?cause, waited_ms = waited.as_millis(), "reconcile of a change starts");
    }
    let ns = task.namespace().unwrap_or_else(|| "default".into());
    let api: Api<PeragoTask> = Api::namespaced(ctx.client.clone(), &ns);
    let name = task.name_any();
    let reconciled = finalizer(&api, FINALIZER, task, |event| async {
        match event {
            Finalizer::Apply(task) => apply(task, &ctx).await,
            Finalizer::Cleanup(task) => cleanup(task, &ctx).await,
        }
    });
    // A reconcile holds its task: one that never ends would leave the task unreconciled for
    // good (Kubernetes API calls wait up to kube's 295 s read timeout). Past the deadline it
    // is dropped at its await point and retried; every step of it is idempotent.
    let result = match tokio::time::timeout(RECONCILE_DEADLINE, reconciled).await {
        Err(_) => Err(Error::Deadline(RECONCILE_DEADLINE)),
        Ok(Err(
            FinalizerError::AddFinalizer(kube::Error::Api(refusal))
            | FinalizerError::RemoveFinalizer(kube::Error::Api(refusal)),
        )) if refusal.code == 422 => {
            // kube-runtime's finalizer patch tests the finalizers this reconcile read, and
            // the apiserver refuses it when they changed since: under load, because an earlier
            // reconcile's own finalizer write has not reached the watch yet. Nothing failed,
            // and the watch's event of that write reconciles the task again.
            debug!(task = %name, "the task's finalizers changed since they were read; looking again");
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Ok(result) => result.map_err(|e| Error::Finalizer(Box::new(e))),
    };
    let m = &ctx.metrics;
    m.reconcile_seconds
        .with_label_values::<&str>(&[])
        .observe(started.elapsed().as_secs_f64());
    m.reconciles
        .with_label_values(&[if result.is_ok() { "ok" } else { "error" }])
        .inc();
    result
}

fn error_policy(task: Arc<PeragoTask>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(task = %task.name_any(), error = %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

/// A spec the status has not observed yet, or a deletion the finalizer still holds: what a
/// user waits for the operator to act on.
fn spec_unobserved(task: &PeragoTask) -> bool {
    if task.metadata.deletion_timestamp.is_some() {
        return !task.finalizers().is_empty();
    }
    task.status.as_ref().and_then(|s| s.observed_generation) != task.metadata.generation
}

/// Run the controllers until SIGTERM/SIGINT: one for all namespaces, or one per watched
/// namespace (`scope`), all on one context; `writers` fill `ctx.owned`.
pub async fn run(ctx: Context, writers: owned::Writers, scope: &Scope) {
    let (pod_watch, triggers) = writers.watch(&ctx.client);
    // Aborted when this future is dropped too (a leadership term that ends).
    let _pod_watch = AbortOnDrop(tokio::spawn(pod_watch));
    info!(?scope, "perago-operator controller started");
    let controllers: Vec<_> = scope
        .apis::<PeragoTask>(&ctx.client)
        .into_iter()
        .zip(triggers)
        .map(|(tasks, children)| {
            // kube's reflector, fed by a watch whose tasks lose their `managedFields`: never
            // read, and at a thousand tasks memory held for nothing (docs/scale.md).
            let (store, writer) = reflector::store();
            let metrics = ctx.metrics.clone();
            let tasks = watcher(tasks, watcher::Config::default())
                .backoff(owned::WatchBackoff::default())
                .modify(|task: &mut PeragoTask| task.managed_fields_mut().clear())
                .reflect(writer)
                .applied_objects()
                .predicate_filter(triggers::task_changes(), Default::default())
                .inspect_ok(move |task| {
                    if spec_unobserved(task) {
                        let task = ObjectRef::from_obj(task);
                        metrics.waits.seen(task, WaitCause::Spec);
                    }
                });
            // No debounce: a change to the task starts its reconcile at once, and the
            // children's bursts are gathered before they get here (crate::triggers).
            Controller::for_stream(tasks, store)
                .trigger_backoff(owned::WatchBackoff::default())
                .reconcile_on(triggers::children(children))
        })
        .collect();
    let ctx = Arc::new(Context {
        tasks: Stores::new(controllers.iter().map(Controller::store).collect()),
        ..ctx
    });
    let (senders, receivers): (Vec<_>, Vec<_>) = controllers
        .iter()
        .map(|_| tokio::sync::mpsc::channel(1024))
        .unzip();
    let wake = Wake::new(scope.clone(), senders, ctx.metrics.clone());
    let _queue_watch = AbortOnDrop(tokio::spawn(scaling::watch_queues(
        ctx.clone(),
        wake.clone(),
    )));
    let _census = AbortOnDrop(tokio::spawn(slots::census(ctx.clone(), wake)));
    let runs = controllers
        .into_iter()
        .zip(receivers)
        .map(|(controller, woken)| {
            let woken = futures_util::stream::unfold(woken, |mut woken| async move {
                woken.recv().await.map(|task| (task, woken))
            });
            controller
                .reconcile_on(woken)
                .shutdown_on_signal()
                .run(reconcile, error_policy, ctx.clone())
                .for_each(|result| async move {
                    match result {
                        Ok((object, _)) => tracing::debug!(task = %object.name, "reconciled"),
                        Err(e) => warn!(error = %e, "reconcile error"),
                    }
                })
        });
    futures_util::future::join_all(runs).await;
}

/// A spawned task that is aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub fn reporter() -> Reporter {
    Reporter {
        controller: MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::Method;

    use crate::fixtures::{mocked_context, task};

    /// The requests a `/slots` stand-in was sent (their request lines), and its port.
    struct Sidecar {
        requests: Arc<std::sync::Mutex<Vec<String>>>,
        port: u16,
    }

    impl Sidecar {
        fn asked(&self) -> usize {
            self.requests.lock().unwrap().len()
        }
    }

    /// A `/slots` endpoint at `ip` and `port` (0: any) that answers idle, counting every poll.
    async fn idle_sidecar(ip: &str, port: u16) -> Sidecar {
        sidecar_answering(ip, port, &[0], Some(0)).await
    }

    /// A `/slots` endpoint at `ip` and `port` (0: any) whose `n`th answer has `busy[n]` busy
    /// slots (the last one from then on), and says that polls sent `uncounted` ms before
    /// the request may not be counted (`None`: says nothing, as a sidecar older than
    /// ADR 0033).
    async fn sidecar_answering(
        ip: &str,
        port: u16,
        busy: &'static [i64],
        uncounted: Option<u64>,
    ) -> Sidecar {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind((ip, port))
            .await
            .unwrap_or_else(|e| panic!("binding {ip}:{port}: {e}"));
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0; 1024];
                let read = stream.read(&mut request).await.unwrap_or(0);
                let text = String::from_utf8_lossy(&request[..read]);
                let line = text.lines().next().unwrap_or_default().to_owned();
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(line);
                    seen.len() - 1
                };
                let busy = busy[n.min(busy.len() - 1)];
                let body = match uncounted {
                    Some(ms) => format!(r#"{{"busy":{busy},"pollsCountedOlderThanMs":{ms}}}"#),
                    None => format!(r#"{{"busy":{busy}}}"#),
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        Sidecar { requests, port }
    }

    /// [`scale`] where the API server never answers: the decision, or a failure when it sent
    /// a request.
    async fn scale_sending_nothing(
        ctx: &Context,
        task: &PeragoTask,
        work: &mut Work,
    ) -> (i32, bool) {
        let tasks: Api<PeragoTask> = Api::namespaced(ctx.client.clone(), "default");
        tokio::time::timeout(Duration::from_secs(5), scale(ctx, &tasks, task, work))
            .await
            .expect("the scale-in made a request to the API server")
            .unwrap()
    }

    /// A new pod's sidecar may poll before the kubelet reports the pod Running, when the pod
    /// has no figure in the book yet: the scale-in its poll would trigger (its queue now empty)
    /// waits for it, and makes no request, rather than count none of its work.
    #[tokio::test]
    async fn a_scale_in_waits_for_a_pod_that_is_starting() {
        let (ctx, _api_server) = mocked_context();
        let task = Arc::new(task(
            "{name: t, namespace: default, uid: u-1, generation: 1}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 1, autoscaling: {minReplicas: 0, maxReplicas: 5, targetQueueDepth: 1, scaleDownStabilizationSeconds: 0}, body: {image: b, command: [run]}}}",
        ));
        let starting: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p-new", "namespace": "default"},
            "status": {"phase": "Pending",
                       "conditions": [{"type": "PodScheduled", "status": "True",
                                       "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string()}]},
        }))
        .unwrap();
        let mut work = Work {
            pods: vec![Arc::new(starting)],
            busy: Vec::new(),
            running: 0,
            queued: 0,
            queue_read: std::time::Instant::now() - scaling::QUEUE_SETTLE,
            observed: std::time::Instant::now(),
            scaled: None,
        };
        let decided = scale_sending_nothing(&ctx, &task, &mut work).await;
        assert_eq!(decided, (1, true), "the scale-in waits");
    }

    /// A scale-in of an autoscaled task at the HTTP level (ADR 0030): from the book's figures
    /// it marks the pods it removes and waits, asking no pod; while the marks settle it asks
    /// and writes nothing; once they have, it asks each pod it removes once, and scales.
    #[tokio::test]
    async fn a_scale_in_asks_each_pod_it_removes_once_when_about_to_remove_it() {
        let (mut ctx, mut api_server) = mocked_context();
        let task = Arc::new(task(
            "{name: t, namespace: default, uid: u-1, generation: 1}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 3, autoscaling: {minReplicas: 0, maxReplicas: 5, targetQueueDepth: 1, scaleDownStabilizationSeconds: 0}, body: {image: b, command: [run]}}}",
        ));
        let ips = ["127.86.33.1", "127.86.33.2", "127.86.33.3"];
        let first = idle_sidecar(ips[0], 0).await;
        let port = first.port;
        let mut sidecars = vec![first];
        for ip in &ips[1..] {
            sidecars.push(idle_sidecar(ip, port).await);
        }
        Arc::get_mut(&mut ctx).unwrap().slots_port = port;
        let total = || sidecars.iter().map(Sidecar::asked).collect::<Vec<_>>();
        // The book, a resync old: a and b idle, c running the one attempt.
        let long_ago = std::time::Instant::now() - Duration::from_secs(50);
        let work = |ctx: &Context| {
            let busy = [("p-a", 0), ("p-b", 0), ("p-c", 1)]
                .into_iter()
                .zip(ips)
                .map(|((name, busy), ip)| {
                    let figure = slots::Figure {
                        busy,
                        answered: true,
                        at: long_ago,
                        polls_counted_before: Some(long_ago),
                    };
                    running_pod(ctx, name, ip, figure)
                })
                .collect();
            Work {
                pods: Vec::new(),
                busy,
                running: 1,
                queued: 0,
                queue_read: long_ago,
                observed: std::time::Instant::now(),
                scaled: None,
            }
        };
        let tasks: Api<PeragoTask> = Api::namespaced(ctx.client.clone(), "default");

        // 1. Marks from the book (written side by side), no question asked, and a wait.
        let server = tokio::spawn(async move {
            let mut marked = std::collections::BTreeSet::new();
            for _ in 0..2 {
                let (path, patch, answer) = api_server.next_call(Method::PATCH).await;
                let pod = path
                    .strip_prefix("/api/v1/namespaces/default/pods/")
                    .unwrap_or_else(|| panic!("a pod's patch, not {path}"))
                    .to_owned();
                assert_eq!(
                    patch["metadata"]["annotations"][scaling::DELETION_COST],
                    "-1"
                );
                answer.send(200, &json!({"metadata": {"name": pod}}));
                marked.insert(pod);
            }
            assert_eq!(marked, ["p-a".to_owned(), "p-b".to_owned()].into());
            api_server
        });
        let decided = scale(&ctx, &tasks, &task, &mut work(&ctx)).await.unwrap();
        let api_server = server.await.unwrap();
        assert_eq!(decided, (3, true), "the scale-in waits for its marks");
        assert_eq!(
            total(),
            [0, 0, 0],
            "no pod is asked before its marks settle"
        );

        // 2. While the marks settle: nothing asked, nothing written.
        let decided = scale(&ctx, &tasks, &task, &mut work(&ctx)).await.unwrap();
        assert_eq!(decided, (3, true));
        assert_eq!(total(), [0, 0, 0]);

        // 3. Settled: the two pods it removes are asked once, and the task scales to 1.
        ctx.costs_changed.lock().unwrap().insert(
            "default/t".into(),
            std::time::Instant::now() - scaling::SCALE_IN_AFTER_COSTS,
        );
        let server = answer_a_scale(api_server, 3, 1);
        let decided = scale(&ctx, &tasks, &task, &mut work(&ctx)).await.unwrap();
        server.await.unwrap();
        assert_eq!(decided, (1, false));
        assert_eq!(
            total(),
            [1, 1, 0],
            "each pod removed asked once, the one kept not at all"
        );
    }

    /// A scale-in to zero marks no pod (they all go) and asks each pod, at once, to count every
    /// task its polls took before the queue read that shows the queue empty (ADR 0033).
    #[tokio::test]
    async fn a_scale_in_to_zero_marks_nothing_and_asks_each_pod_to_count_its_polls() {
        let (mut ctx, api_server) = mocked_context();
        let task = Arc::new(task(
            "{name: t, namespace: default, uid: u-1, generation: 1}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 2, autoscaling: {minReplicas: 0, maxReplicas: 5, targetQueueDepth: 1, scaleDownStabilizationSeconds: 0}, body: {image: b, command: [run]}}}",
        ));
        let ips = ["127.86.35.1", "127.86.35.2"];
        let a = idle_sidecar(ips[0], 0).await;
        let b = idle_sidecar(ips[1], a.port).await;
        Arc::get_mut(&mut ctx).unwrap().slots_port = a.port;
        // Asked just before the queue read: idle, but a poll in flight may have taken the
        // queue's last task.
        let observed = std::time::Instant::now();
        let mut work = {
            let busy = [("p-a", ips[0]), ("p-b", ips[1])]
                .into_iter()
                .map(|(name, ip)| {
                    let figure = slots::Figure {
                        busy: 0,
                        answered: true,
                        at: observed,
                        polls_counted_before: Some(observed - Duration::from_millis(1)),
                    };
                    running_pod(&ctx, name, ip, figure)
                })
                .collect();
            Work {
                pods: Vec::new(),
                busy,
                running: 0,
                queued: 0,
                queue_read: observed,
                observed,
                scaled: None,
            }
        };
        let tasks: Api<PeragoTask> = Api::namespaced(ctx.client.clone(), "default");

        // Both still idle: no pod's deletion cost is written, only the scale.
        let server = answer_a_scale(api_server, 2, 0);
        let decided = scale(&ctx, &tasks, &task, &mut work).await.unwrap();
        server.await.unwrap();
        assert_eq!(decided, (0, false));
        assert_eq!((a.asked(), b.asked()), (1, 1));
        let request = a.requests.lock().unwrap()[0].clone();
        assert!(
            request.starts_with("GET /slots?countPollsOlderThanMs="),
            "{request}"
        );
        assert!(
            observed.elapsed() < scaling::QUEUE_SETTLE,
            "no wait for a sidecar that counts its polls"
        );
    }

    /// A running, Ready executor pod `name` at `ip`, with `figure` from the book.
    fn running_pod(ctx: &Context, name: &str, ip: &str, figure: slots::Figure) -> scaling::BusyPod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        scaling::BusyPod::new(ctx, &pod, ip.into(), figure)
    }

    /// [`scale_sending_nothing`] of a task whose one pod, at `ip`, was found idle just before
    /// the queue read that shows the queue empty, without saying which polls it counted; its
    /// `/slots` answers as [`sidecar_answering`] with `busy` and `uncounted`. The decision, the
    /// sidecar, and when the queue was read.
    async fn scale_in_of_one_pod(
        ip: &str,
        busy: &'static [i64],
        uncounted: Option<u64>,
    ) -> ((i32, bool), Sidecar, std::time::Instant) {
        let (mut ctx, _api_server) = mocked_context();
        let task = Arc::new(task(
            "{name: t, namespace: default, uid: u-1, generation: 1}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 1, autoscaling: {minReplicas: 0, maxReplicas: 5, targetQueueDepth: 1, scaleDownStabilizationSeconds: 0}, body: {image: b, command: [run]}}}",
        ));
        let sidecar = sidecar_answering(ip, 0, busy, uncounted).await;
        Arc::get_mut(&mut ctx).unwrap().slots_port = sidecar.port;
        let read = std::time::Instant::now();
        let idle = slots::Figure {
            busy: 0,
            answered: true,
            at: read,
            polls_counted_before: None,
        };
        let mut work = Work {
            pods: Vec::new(),
            busy: vec![running_pod(&ctx, "p-a", ip, idle)],
            running: 0,
            queued: 0,
            queue_read: read,
            observed: read,
            scaled: None,
        };
        let decided = scale_sending_nothing(&ctx, &task, &mut work).await;
        (decided, sidecar, read)
    }

    /// A sidecar older than ADR 0033 does not say which polls it counts: a pod asked just
    /// after the queue read that shows its queue empty may have taken the queue's last task
    /// without counting it yet, so the scale-in asks it again once the read is
    /// [`scaling::QUEUE_SETTLE`] old, and keeps it when it then says it is busy.
    #[tokio::test]
    async fn a_scale_in_asks_an_older_sidecar_again_once_the_queue_read_has_settled() {
        let (decided, sidecar, read) = scale_in_of_one_pod("127.86.34.1", &[0, 1], None).await;
        assert_eq!(decided, (1, false), "the pod is kept");
        assert_eq!(sidecar.asked(), 2);
        assert!(
            read.elapsed() >= scaling::QUEUE_SETTLE,
            "asked again only once the read had settled"
        );
    }

    /// A pod whose poll from before the queue read has still not come back when asked twice
    /// (a Conductor slower than the sidecar's wait) defers the scale-in to a later pass, with
    /// a new read, and nothing is written.
    #[tokio::test]
    async fn a_scale_in_waits_for_a_pod_whose_old_poll_is_still_in_flight() {
        let (decided, sidecar, _) = scale_in_of_one_pod("127.86.36.1", &[0], Some(5_000)).await;
        assert_eq!(decided, (1, true), "the scale-in waits");
        assert_eq!(sidecar.asked(), 2);
    }

    /// Answers the calls of a scale of task `t` from `from` to `to` pods: its `/scale` patch
    /// and its `Scaled` event, and asserts there are no others; the `lastScale` it decided is
    /// for the reconcile's status write.
    fn answer_a_scale(
        mut api_server: crate::fixtures::ApiServer,
        from: i32,
        to: i32,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let (patch, answer) = api_server
                .expect(Method::PATCH, "/namespaces/default/peragotasks/t/scale")
                .await;
            assert_eq!(patch["spec"]["replicas"], to);
            answer.send(200, &json!({"spec": {"replicas": to}}));
            let (event, answer) = api_server
                .expect(Method::POST, "/namespaces/default/events")
                .await;
            assert_eq!(event["reason"], "Scaled");
            assert!(
                event["note"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&format!("{from} → {to} executor pods"))),
                "{event}"
            );
            answer.send(201, &json!({}));
            api_server.expect_no_more().await;
        })
    }

    /// The queue grew while the watch did not show the operator's last `/scale` write yet: the
    /// scale-up builds on that write at once (one `/scale` patch to 5), and a decision at or
    /// below it makes no request.
    #[tokio::test]
    async fn a_scale_up_builds_on_a_write_the_watch_does_not_show_yet() {
        let (ctx, api_server) = mocked_context();
        let task = Arc::new(task(
            "{name: t, namespace: default, uid: u-1, generation: 2}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 0, autoscaling: {minReplicas: 0, maxReplicas: 5, targetQueueDepth: 1, scaleDownStabilizationSeconds: 0}, body: {image: b, command: [run]}}}",
        ));
        scaling::wrote_scale(&ctx, &task, 1);
        let work = |queued| Work {
            pods: Vec::new(),
            busy: Vec::new(),
            running: 0,
            queued,
            queue_read: std::time::Instant::now(),
            observed: std::time::Instant::now(),
            scaled: None,
        };
        let tasks: Api<PeragoTask> = Api::namespaced(ctx.client.clone(), "default");
        let decided = scale(&ctx, &tasks, &task, &mut work(1)).await.unwrap();
        assert_eq!(decided, (1, false), "the write stands, nothing is sent");

        let server = answer_a_scale(api_server, 1, 5);
        let decided = scale(&ctx, &tasks, &task, &mut work(5)).await.unwrap();
        server.await.unwrap();
        assert_eq!(decided, (5, false));
        assert_eq!(
            scaling::scale_written(&ctx, &task),
            Some(5),
            "the second write stands until the watch shows both"
        );
        let last = scaling::last_scale(&ctx, &task).expect("the status carries the decision");
        assert_eq!((last.from, last.to), (1, 5));
    }

    fn invalid_task() -> PeragoTask {
        task(
            "{name: broken, namespace: default, uid: u-1, generation: 3, finalizers: [perago.io/taskdef]}",
            "{taskName: op.broken, ownerEmail: a@b.c, workspace: {prefix: /data, pre: [{kind: requireFile, path: '../etc'}]}, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {body: {image: b, command: [run]}}}",
        )
    }

    /// The reconcile of an invalid spec, at the HTTP level: one status patch saying Stalled
    /// with the message, one Warning event, and no other call (no Deployment, no ConfigMap).
    #[tokio::test]
    async fn an_invalid_spec_only_patches_status_and_emits_a_warning() {
        let (context, mut api) = mocked_context();
        let server = tokio::spawn(async move {
            let (patch, answer) = api
                .expect(
                    Method::PATCH,
                    "/apis/perago.io/v1alpha1/namespaces/default/peragotasks/broken/status",
                )
                .await;
            let status = &patch["status"];
            assert_eq!(status["observedGeneration"], 3);
            let stalled = status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "Stalled")
                .unwrap();
            assert_eq!(
                (stalled["status"].as_str(), stalled["reason"].as_str()),
                (Some("True"), Some("InvalidSpec"))
            );
            assert!(
                stalled["message"]
                    .as_str()
                    .unwrap()
                    .contains("must be relative and must not contain '..'")
            );
            let mut echoed = serde_json::to_value(invalid_task()).unwrap();
            echoed["status"] = status.clone();
            answer.send(200, &echoed);

            let (event, answer) = api.expect(Method::POST, "/namespaces/default/events").await;
            assert_eq!(
                (event["type"].as_str(), event["reason"].as_str()),
                (Some("Warning"), Some("InvalidSpec"))
            );
            answer.send(201, &event);
            api
        });
        let action = reconcile(Arc::new(invalid_task()), context).await.unwrap();
        assert_eq!(action, Action::await_change());
        server.await.unwrap().expect_no_more().await;
    }

    /// A finalizer patch refused because the finalizers changed since the reconcile read them
    /// (its own earlier write, not yet watched) is no failure: the task is looked at again.
    #[tokio::test]
    async fn a_finalizer_written_since_the_read_is_not_a_failure() {
        let (context, mut api) = mocked_context();
        let mut task = invalid_task();
        task.metadata.finalizers = None;
        let server = tokio::spawn(async move {
            let (patch, answer) = api
                .expect(
                    Method::PATCH,
                    "/apis/perago.io/v1alpha1/namespaces/default/peragotasks/broken",
                )
                .await;
            assert_eq!(patch[0]["op"], "test", "{patch}");
            answer.send(
                422,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "Invalid", "code": 422, "message": "test failed"}),
            );
            api.expect_no_more().await;
        });
        let action = reconcile(Arc::new(task), context.clone()).await.unwrap();
        server.await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(1)));
        let reconciles = &context.metrics.reconciles;
        assert_eq!(reconciles.with_label_values(&["ok"]).get(), 1);
        assert_eq!(reconciles.with_label_values(&["error"]).get(), 0);
    }

    /// Deleting a task with the default Retain policy: no Conductor call, and the only API call
    /// removes the finalizer.
    #[tokio::test]
    async fn retain_on_delete_only_releases_the_finalizer() {
        let (context, mut api) = mocked_context();
        let mut task = invalid_task();
        task.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let server = tokio::spawn(async move {
            let (patch, answer) = api
                .expect(
                    Method::PATCH,
                    "/apis/perago.io/v1alpha1/namespaces/default/peragotasks/broken",
                )
                .await;
            assert_eq!(patch[1]["op"], "remove", "{patch}");
            assert_eq!(patch[1]["path"], "/metadata/finalizers/0");
            let mut released = serde_json::to_value(invalid_task()).unwrap();
            released["metadata"]["finalizers"] = json!([]);
            answer.send(200, &released);
            api
        });
        let action = reconcile(Arc::new(task), context).await.unwrap();
        assert_eq!(action, Action::await_change());
        server.await.unwrap().expect_no_more().await;
    }
}
