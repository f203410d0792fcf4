//! The PeragoTask controller: validate, register the TaskDef in Conductor (and repair drift),
//! apply the contract ConfigMap and the executor Deployment, keep the status true; on delete,
//! apply the TaskDef deletion policy behind a finalizer.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::finalizer::{Error as FinalizerError, Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{debug, info, warn};

use perago_api::rollout::{CanaryAttempts, ROLLOUT_ORDER_ANNOTATION, RolloutOrder};
use perago_api::task::DeletionPolicy;
use perago_api::{FieldError, PeragoTask, PeragoTaskStatus, contract, taskdef, validate};

use crate::conductor::ConductorError;
use crate::context::{Context, Error, conductor_url};
use crate::owned;
use crate::registrar::{self, Registrar, Registration};
use crate::render::{self, TASK_LABEL};
use crate::rollout::{self, Plan};
use crate::scaler::Observed;
use crate::scope::{Scope, Stores, Wake};
use crate::telemetry::WaitCause;
use crate::{census, scaling, siblings, status, triggers};

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
    crate::events::publish(&ctx.recorder, task, type_, reason, note).await;
}

/// The status, with the task's last scale decision ([`crate::scaler::Scaler::last_scale`]);
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
    let shown = task.status.as_ref().and_then(|s| s.last_scale.as_ref());
    let task_ref = ObjectRef::from_obj(task);
    let status = PeragoTaskStatus {
        last_scale: (ctx.scaler).last_scale(&task_ref, shown, std::time::Instant::now()),
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

/// This cluster's mark on the TaskDefs `task` writes (ADR 0040).
fn registrar(ctx: &Context, task: &PeragoTask) -> Registrar {
    Registrar {
        cluster: ctx.cluster.clone(),
        task: format!(
            "{}/{}",
            task.namespace().unwrap_or_default(),
            task.name_any()
        ),
    }
}

/// Create the TaskDef, or rewrite it when it no longer holds the rendered values, unless
/// another cluster wrote it: then the other cluster's registrar and the fields that differ,
/// and nothing written.
async fn register_task_def(
    ctx: &Context,
    task: &PeragoTask,
    base: &str,
    doc: &serde_json::Value,
) -> Result<Option<(Registrar, Vec<String>)>, ConductorError> {
    let name = &task.spec.task_name;
    let conductor = ctx.conductor.at(base);
    // A listing up to half a resync old: drift shows within one and a half resyncs.
    let stored = ctx.conductor.task_def(base, name, ctx.resync / 2).await?;
    let marked = registrar::marked(doc, &registrar(ctx, task));
    match registrar::decide(stored.as_ref(), doc, &ctx.cluster) {
        Registration::Create => {
            // Absent from a listing that may be a little old: a create is an upsert, so a
            // TaskDef made since is rewritten with the same values.
            conductor.create_task_def(name, &marked).await?;
            ctx.conductor
                .wrote_task_def(base, name, Some(&marked))
                .await;
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
        Registration::Repair => {
            conductor.update_task_def(name, &marked).await?;
            ctx.conductor
                .wrote_task_def(base, name, Some(&marked))
                .await;
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
        Registration::Keep => {}
        Registration::Foreign(other, fields) => return Ok(Some((other, fields))),
    }
    Ok(None)
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
/// and the TaskDef. Ok holds both and the warnings; Err names the field that is wrong.
pub fn checked(
    spec: &perago_api::PeragoTaskSpec,
) -> Result<(contract::TaskContract, serde_json::Value, Vec<String>), FieldError> {
    let warnings = validate(spec)?;
    let contract = contract::render(spec)?;
    let doc = taskdef::render(spec)?;
    Ok((contract, doc, warnings))
}

/// What the reconcile reads before it decides: the task's executor pods and the work, running
/// in them and queued in Conductor (read after the pods, so that a task a pod has just taken
/// is not counted twice).
async fn observe(ctx: &Context, task: &Arc<PeragoTask>, base: &str) -> Result<Observed, Error> {
    let ns = task.namespace().unwrap_or_else(|| "default".into());
    ctx.owned.ready().await.map_err(|_| Error::WatchStopped)?;
    let observed = std::time::Instant::now();
    let pods = ctx.owned.pods(&ns, &task.name_any());
    let busy = census::busy_pods(ctx, task, &pods).await;
    let running: i64 = busy.iter().map(|p| p.busy).sum();
    let (queued, queue_read) = scaling::queued(ctx, base, task, running).await?;
    Ok(Observed {
        task: task.clone(),
        pods,
        busy,
        queued,
        queue_read,
        observed,
        asks: 0,
        marks_failed: false,
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
        Err(invalid) => {
            stall(ctx, &api, &task, status::INVALID_SPEC, invalid.to_string()).await?;
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
        Ok(Some((other, fields))) => {
            let message = format!(
                "TaskDef {} was registered from cluster {:?} by PeragoTask {}, and this spec \
                 renders it differently ({}); clusters that share a Conductor must render the \
                 same TaskDef for a task type, and only the cluster that registered it rewrites \
                 it (ADR 0040)",
                task.spec.task_name,
                other.cluster,
                other.task,
                fields.join(", ")
            );
            stall(ctx, &api, &task, siblings::REASON, message).await?;
            // The other cluster's change does not wake this task: look again at the resync.
            return Ok(Action::requeue(ctx.resync));
        }
        Ok(None) => observe(ctx, &task, &base).await,
        Err(e) => Err(Error::Conductor(e)),
    };
    let mut work = match work {
        Ok(work) => work,
        Err(Error::Conductor(e)) => return Err(conductor_unavailable(&api, &task, ctx, e).await),
        Err(e) => return Err(e),
    };

    // A suspended task keeps its TaskDef and its scaler's state, and has no pods: the
    // Deployment's scale-in lets each pod's sidecar stop polling and report what it runs.
    let scaled = if task.spec.suspend {
        scaling::Scaled::suspended()
    } else {
        scaling::scale(ctx, &api, &mut work).await?
    };
    let replicas = scaled.replicas;
    ctx.metrics.task_queued(&task).set(work.queued);
    ctx.metrics.task_running(&task).set(work.running());
    ctx.metrics.task_replicas(&task).set(i64::from(replicas));
    ctx.metrics
        .task_suspended(&task)
        .set(i64::from(task.spec.suspend));

    let cm = render::config_map(&task, &contract);
    let applied = async {
        apply_owned(ctx, &ns, &ctx.owned.config_maps, cm).await?;
        // Before the Deployment, so that new pods start already bound by it.
        keep_network_policy(ctx, &ns, &task).await?;
        let deployment = render::deployment(&task, &contract, &ctx.defaults, replicas);
        apply_deployments(ctx, &ns, &task, deployment, replicas, &work.pods).await
    };
    let (applied, plan) = match applied.await {
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
        running: work.running(),
        task_def_hash: taskdef::hash(&doc),
        suspended: task.spec.suspend.then_some(work.pods.len()),
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
    let was_suspended = status::says_reason(&old, "Ready", status::SUSPENDED);
    let observed = status::observed(&old, &seen);
    let in_force = !matches!(plan, Plan::Replace { .. });
    let rollout = plan.status().cloned();
    let event = rollout::event(old.rollout.as_ref(), rollout.as_ref());
    if let Some(result) = rollout::ended(old.rollout.as_ref(), rollout.as_ref()) {
        ctx.metrics.rollouts.with_label_values(&[result]).inc();
    }
    let canary = match &plan {
        Plan::Canary { split, .. } => split.canary,
        _ => 0,
    };
    ctx.metrics
        .task_canary_replicas(&task)
        .set(i64::from(canary));
    let observed = status::with_rollout(observed, &old, generation, rollout, in_force);
    patch_status(ctx, &api, &task, observed).await?;
    if let Some((warning, reason, note)) = event {
        info!(task = %task.name_any(), reason, "{note}");
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish_event(ctx, &task, type_, reason, note).await;
    }
    if task.spec.suspend != was_suspended {
        let (reason, note) = if task.spec.suspend {
            let pods = work.pods.len();
            let note = format!(
                "suspended: {pods} executor pods stop polling, finish and report their attempts, and go; the TaskDef stays"
            );
            (status::SUSPENDED, note)
        } else {
            (
                status::RESUMED,
                format!(
                    "resumed: {replicas} executor pods take the queue ({} queued)",
                    work.queued
                ),
            )
        };
        info!(task = %task.name_any(), "{note}");
        publish_event(ctx, &task, EventType::Normal, reason, note).await;
    }
    if let Some(direction) = scaled.wrote {
        ctx.metrics
            .scale_seconds
            .with_label_values(&[direction])
            .observe(work.queue_read.elapsed().as_secs_f64());
    }
    Ok(Action::requeue(if scaled.held {
        crate::scaler::decide::SCALE_IN_AFTER_COSTS
    } else if plan.runs() {
        rollout::LOOK_AGAIN
    } else if rolled_out {
        ctx.resync
    } else {
        ctx.resync.min(Duration::from_secs(15))
    }))
}

/// The executor's Deployments as the rollout's plan says (ADR 0044): the stable one (the
/// task's Deployment), and while a canary runs, the canary. Returns the stable Deployment as
/// it is now, and the plan.
async fn apply_deployments(
    ctx: &Context,
    ns: &str,
    task: &PeragoTask,
    rendered: Deployment,
    replicas: i32,
    pods: &[Arc<Pod>],
) -> Result<(Arc<Deployment>, Plan), Error> {
    let object = render::object_name(task);
    let canary_name = rollout::canary_name(&object);
    let live = |name: &str| ctx.owned.deployments.get(&ObjectRef::new(name).within(ns));
    let (live_stable, live_canary) = (live(&object), live(&canary_name));
    let spec = task.spec.rollout.clone().unwrap_or_default();
    let last = task.status.as_ref().and_then(|s| s.rollout.as_ref());
    if !spec.is_canary() && last.is_none() && live_canary.is_none() {
        let stable = apply_pinned(ctx, ns, &object, rendered).await?;
        return Ok((stable, Plan::Replace { status: None }));
    }
    let desired = crate::lineage::template_hash(&rendered).unwrap_or_default();
    // As the watch shows it: its status is then of that template.
    let stable_shown = live_stable.as_deref().and_then(crate::lineage::recorded);
    let stable_hash = (ctx.owned.template(ns, &object))
        .or_else(|| stable_shown.clone())
        .map(|(hash, _)| hash);
    let stable_rolled_out = stable_shown.is_some_and(|(hash, _)| hash == desired)
        && live_stable.as_deref().is_some_and(rollout::rolled_out);
    let canary_pods: Vec<Arc<Pod>> = (pods.iter())
        .filter(|p| rollout::runs_canary(p, &desired))
        .cloned()
        .collect();
    let attempts = if spec.is_canary() && stable_hash.as_deref() != Some(desired.as_str()) {
        census::ask_canary(ctx, task, &canary_pods, rollout::LOOK_AGAIN).await;
        let names: Vec<String> = canary_pods.iter().map(|p| p.name_any()).collect();
        (ctx.scaler).canary_attempts(&ObjectRef::from_obj(task), &desired, &names)
    } else {
        CanaryAttempts::default()
    };
    let order = (task.annotations().get(ROLLOUT_ORDER_ANNOTATION))
        .and_then(|a| RolloutOrder::parse(a, &desired));
    let canary_ready = (live_canary.as_deref())
        .and_then(|d| d.status.as_ref()?.ready_replicas)
        .unwrap_or(0);
    let plan = rollout::plan(&rollout::Seen {
        spec: &spec,
        last,
        desired: &desired,
        stable: stable_hash.as_deref(),
        canary_ready,
        stable_rolled_out,
        replicas,
        attempts,
        order,
        now: k8s_openapi::jiff::Timestamp::now(),
    });
    let stable = match &plan {
        Plan::Replace { .. } | Plan::Promote { .. } => {
            apply_pinned(ctx, ns, &object, rendered.clone()).await?
        }
        Plan::Canary { split, .. } => scale_deployment(ctx, ns, &object, split.stable).await?,
        Plan::Stable { .. } => scale_deployment(ctx, ns, &object, replicas).await?,
    };
    match &plan {
        Plan::Canary { split, .. } => {
            let canary = rollout::canary(rendered, split.canary, &desired);
            apply_pinned(ctx, ns, &canary_name, canary).await?;
        }
        // The canary's pods work on until the stable pods run their template.
        Plan::Promote { .. } => {}
        Plan::Replace { .. } | Plan::Stable { .. } if live_canary.is_some() => {
            // Its pods stop polling, finish and report what they run, and go.
            let deleted = Api::<Deployment>::namespaced(ctx.client.clone(), ns)
                .delete(&canary_name, &DeleteParams::default())
                .await;
            match deleted {
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
                Ok(_) => {}
            }
            ctx.owned.forget(ns, &canary_name);
        }
        Plan::Replace { .. } | Plan::Stable { .. } => {}
    }
    Ok((stable, plan))
}

/// `deployment` (named `name`) applied with the generation that introduced its template: as
/// this process last applied it, else as the watched Deployment records it (crate::lineage).
async fn apply_pinned(
    ctx: &Context,
    ns: &str,
    name: &str,
    mut deployment: Deployment,
) -> Result<Arc<Deployment>, Error> {
    let recorded = ctx.owned.template(ns, name).or_else(|| {
        let live = ObjectRef::new(name).within(ns);
        (ctx.owned.deployments.get(&live)).and_then(|d| crate::lineage::recorded(&d))
    });
    crate::lineage::pin_generation(&mut deployment, recorded);
    if let Some(pinned) = crate::lineage::recorded(&deployment) {
        ctx.owned.record_template(ns, name, pinned);
    }
    apply_owned(ctx, ns, &ctx.owned.deployments, deployment).await
}

/// Deployment `name` at `replicas`, its template left as it is: the stable pods while a
/// canary runs, or after it was rolled back.
async fn scale_deployment(
    ctx: &Context,
    ns: &str,
    name: &str,
    replicas: i32,
) -> Result<Arc<Deployment>, Error> {
    let patch = json!({"spec": {"replicas": replicas}});
    let scaled = Api::<Deployment>::namespaced(ctx.client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(Arc::new(scaled))
}

async fn cleanup(task: Arc<PeragoTask>, ctx: &Context) -> Result<Action, Error> {
    ctx.metrics.forget_task(&task);
    ctx.scaler.forget(&ObjectRef::from_obj(&*task));
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
        let stored = ctx.conductor.task_def(&base, name, Duration::ZERO).await?;
        if let Some(Err(other)) = stored.map(|s| registrar::may_delete(&s, &ctx.cluster)) {
            let note = format!(
                "kept TaskDef {name} (deletionPolicy: Delete): cluster {:?} registered it (PeragoTask {})",
                other.cluster, other.task
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
    let _census = AbortOnDrop(tokio::spawn(census::census(ctx.clone(), wake)));
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
