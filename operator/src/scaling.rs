//! Autoscaling: replicas from queued plus running attempts (ADR 0009), the scale-down window,
//! idle pods first on a scale-in, and the queue watch that starts pods within seconds of work
//! arriving instead of at the task's next resync (ADR 0010).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::{info, warn};

use perago_api::PeragoTask;
use perago_api::task::{AutoscalingSpec, ScaleDecision};

use crate::conductor::ConductorError;
use crate::context::{Context, conductor_url};
use perago_conductor::queue_name;

/// A running executor pod and the attempts it runs, as the book of busy slots has it
/// ([`crate::slots`]).
pub struct BusyPod {
    pub name: String,
    pub ip: String,
    pub busy: i64,
    /// When the pod was asked.
    pub asked: Instant,
    /// Its figure counts every task a poll sent before this brought ([`crate::slots::Figure`]).
    polls_counted_before: Option<Instant>,
    /// Its `controller.kubernetes.io/pod-deletion-cost` now.
    cost: Option<String>,
    /// Its sidecar answered (a pod that does not counts as fully busy).
    answered: bool,
    /// Its `Ready` condition is true.
    ready: bool,
}

impl BusyPod {
    pub fn new(ctx: &Context, pod: &Pod, ip: String, figure: crate::slots::Figure) -> Self {
        Self {
            name: pod.name_any(),
            ip,
            busy: figure.busy,
            asked: figure.at,
            polls_counted_before: figure.polls_counted_before,
            cost: cost_now(ctx, pod),
            answered: figure.answered,
            ready: is_ready(pod),
        }
    }

    pub fn update(&mut self, figure: crate::slots::Figure) {
        self.busy = figure.busy;
        self.answered = figure.answered;
        self.asked = figure.at;
        self.polls_counted_before = figure.polls_counted_before;
    }

    /// Whether the figure counts every task the pod took from the queue that `read` saw, and
    /// was taken since `observed`: the pod said so, or, for a sidecar that does not say, was
    /// asked [`QUEUE_SETTLE`] after the read.
    fn confirms(&self, read: Instant, observed: Instant) -> bool {
        let counted = match self.polls_counted_before {
            Some(before) => before >= read,
            None => self.asked >= read + QUEUE_SETTLE,
        };
        counted && self.asked >= observed
    }
}

pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// How long a scale-in waits after the pods' deletion costs changed.
pub const SCALE_IN_AFTER_COSTS: Duration = Duration::from_secs(2);

/// `/slots` requests in flight at once, across every reconcile and the census: after a restart
/// every task reconciles at once, and a fleet of thousands of pods must not be asked all
/// together.
pub const PROBES_AT_ONCE: usize = 64;

/// How long a deletion cost or a scale this process wrote outranks the watched objects. Under
/// load the watches show the operator's own writes seconds late, and a scale-in deferred until
/// then wrote the same marks again (docs/scale.md); after this long, the watch is believed.
const OWN_WRITE_TRUSTED: Duration = Duration::from_secs(30);

/// A `/scale` write of this process that the watch of tasks may not show yet.
#[derive(Clone, Copy, Debug)]
pub struct ScaleWritten {
    /// The task's generation once the watch shows this write: one more than the generation
    /// the decision was made on, or than the write before it that the watch did not show yet.
    shown_at: i64,
    replicas: i32,
    at: Instant,
}

/// The replicas this process last wrote for `task` while the watched task does not show the
/// write yet (for at most [`OWN_WRITE_TRUSTED`]): the task is still below the generation the
/// write makes. Under load the watch shows the operator's own writes seconds late; deciding
/// again from the older replicas would scale in again (more `/slots` requests and deletion
/// costs, another `/scale` write), as the fleet benchmark showed on a loaded machine, or hold
/// a scale-up back until the watch caught up (up to 20 s in a wave). Once the watch shows the
/// write, the task's own replicas hold.
pub fn scale_written(ctx: &Context, task: &PeragoTask) -> Option<i32> {
    let mut written = ctx
        .scales_written
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = task_key(task);
    let w = *written.get(&key)?;
    if task.metadata.generation.is_some_and(|g| g < w.shown_at)
        && w.at.elapsed() <= OWN_WRITE_TRUSTED
    {
        return Some(w.replicas);
    }
    written.remove(&key);
    None
}

/// `task`, as the watch showed it, was scaled to `replicas` by this process: on top of its
/// own last write when the watch does not show that one yet.
pub fn wrote_scale(ctx: &Context, task: &PeragoTask, replicas: i32) {
    let Some(generation) = task.metadata.generation else {
        return;
    };
    let mut all = ctx
        .scales_written
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    all.retain(|_, w| w.at.elapsed() <= OWN_WRITE_TRUSTED);
    let key = task_key(task);
    let base = (all.get(&key))
        .filter(|w| generation < w.shown_at)
        .map_or(generation, |w| w.shown_at);
    let written = ScaleWritten {
        shown_at: base + 1,
        replicas,
        at: Instant::now(),
    };
    all.insert(key, written);
}

/// `pod`'s deletion cost: the one this process last wrote while the cache does not show it
/// yet (for at most [`OWN_WRITE_TRUSTED`]), else the cached annotation.
pub fn cost_now(ctx: &Context, pod: &Pod) -> Option<String> {
    let cached = pod.annotations().get(DELETION_COST).cloned();
    let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    let mut written = ctx
        .costs_written
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some((cost, at)) = written.get(&key) else {
        return cached;
    };
    if *cost == cached || at.elapsed() > OWN_WRITE_TRUSTED {
        written.remove(&key);
        return cached;
    }
    cost.clone()
}

fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Why a scale-in whose deletion costs are in place must still wait, if it must.
///
/// - The ReplicaSet controller reads the costs from its own cache of pods, so a scale-in waits
///   [`SCALE_IN_AFTER_COSTS`] after the operator last changed one, whatever woke the reconcile.
/// - It ranks a pod that is not Ready before any deletion cost. A sidecar starts taking work
///   before the kubelet's first readiness probe marks its pod Ready, so a pod that says it is
///   busy but is not Ready yet would be removed first. Only pods that answered count here: one
///   that does not answer may never become Ready, and must not hold every scale-in back.
pub fn scale_in_waits(
    pods: &[BusyPod],
    costs_changed: Option<Instant>,
    now: Instant,
) -> Option<String> {
    if let Some(at) = costs_changed {
        let since = now.saturating_duration_since(at);
        if since < SCALE_IN_AFTER_COSTS {
            return Some(format!(
                "deletion costs changed {} ms ago",
                since.as_millis()
            ));
        }
    }
    let unready: Vec<&str> = pods
        .iter()
        .filter(|p| p.answered && p.busy > 0 && !p.ready)
        .map(|p| p.name.as_str())
        .collect();
    (!unready.is_empty()).then(|| format!("busy pods not Ready yet: {}", unready.join(", ")))
}

/// The deletion cost of the pods a scale-in chose: below every other pod's (unset is 0).
const CHOSEN: &str = "-1";

/// The deletion-cost writes that make the ReplicaSet remove `count` pods with the fewest busy
/// slots (ADR 0027): each chosen pod gets [`CHOSEN`], and a pod an earlier scale-in chose
/// that is not chosen now loses its cost. Pods that did not answer count as fully busy, so
/// they go last. Only those pods are written: a scale-in writes in proportion to the pods it
/// removes, not to the task's pods. `None` removes the annotation.
pub fn deletion_marks(pods: &[BusyPod], count: usize) -> Vec<(&str, Option<&'static str>)> {
    let ranked: Vec<&BusyPod> = ranked(pods)
        .into_iter()
        .filter_map(|i| pods.get(i))
        .collect();
    let (chosen, kept) = ranked.split_at(count.min(ranked.len()));
    let choose = chosen
        .iter()
        .filter(|p| p.cost.as_deref() != Some(CHOSEN))
        .map(|p| (p.name.as_str(), Some(CHOSEN)));
    let release = kept
        .iter()
        .filter(|p| p.cost.as_deref() == Some(CHOSEN))
        .map(|p| (p.name.as_str(), None));
    choose.chain(release).collect()
}

/// The pods in the order a scale-in removes them, as indexes into `pods`: fewest busy slots
/// first; among equals, one already chosen (no write), then by name.
fn ranked(pods: &[BusyPod]) -> Vec<usize> {
    let mut ranked: Vec<usize> = (0..pods.len()).collect();
    ranked.sort_by_key(|&i| {
        let p = &pods[i];
        (p.busy, p.cost.as_deref() != Some(CHOSEN), p.name.as_str())
    });
    ranked
}

/// The pods a scale-in by `count` would remove whose figures were taken before the reconcile
/// began to look (`observed`) or may miss a task taken from the queue `read`: those it asks
/// again before acting (ADR 0030, ADR 0033).
pub fn unconfirmed_removals(
    pods: &[BusyPod],
    count: usize,
    read: Instant,
    observed: Instant,
) -> Vec<usize> {
    ranked(pods)
        .into_iter()
        .take(count)
        .filter(|&i| !pods[i].confirms(read, observed))
        .collect()
}

/// Since when an autoscaled task's queue has been empty, and whether the queue watch has
/// woken the task for it.
#[derive(Debug, Default)]
pub struct Drain {
    since: Option<Instant>,
    woken: bool,
}

/// How long after it was scheduled a pod still Pending is waited for as starting. A pod that
/// takes longer (a slow image pull, a volume that does not mount) holds no scale-in back.
pub const STARTING_LIMIT: SignedDuration = SignedDuration::from_secs(60);

/// Whether `pod` may have taken work that no figure shows yet: scheduled less than
/// [`STARTING_LIMIT`] before `now`, neither going nor stuck, and not running in the watched
/// pods. Its sidecar polls as soon as it starts, and the kubelet reports the pod Running a
/// moment later; a scale-in decided in between would count none of its work, and could remove
/// it. A pod that cannot start (unschedulable, its image not pulled, a crash loop) takes no
/// work and is not waited for.
pub fn starting(pod: &Pod, now: Timestamp) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let recently_scheduled = status.conditions.iter().flatten().any(|c| {
        c.type_ == "PodScheduled"
            && c.status == "True"
            && c.last_transition_time
                .as_ref()
                .is_some_and(|t| now.duration_since(t.0) < STARTING_LIMIT)
    });
    pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref() == Some("Pending")
        && recently_scheduled
        && crate::pods::pod_problem(pod).is_none()
}

/// Whether the task has pods the watch of pods does not show yet: fewer pods than `replicas`
/// within [`STARTING_LIMIT`] of the operator's last scale-up. Under load the watch shows a new
/// pod seconds late, while its sidecar may already have taken work; a scale-in decided then
/// would count none of it. A pod that never comes (a quota, a refusing webhook) holds scale-ins
/// back for that long at most.
pub fn pods_unseen(
    ctx: &Context,
    task: &PeragoTask,
    pods: &[Arc<Pod>],
    replicas: i32,
    now: Timestamp,
) -> bool {
    let seen = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .count();
    let scaled_up_lately = last_scale(ctx, task)
        .is_some_and(|s| s.to > s.from && now.duration_since(s.time.0) < STARTING_LIMIT);
    scaled_up_lately && seen < usize::try_from(replicas).unwrap_or(0)
}

/// The key of a task's entries in the scaler's per-task state.
pub fn task_key(task: &PeragoTask) -> String {
    let ns = task.namespace().unwrap_or_else(|| "default".into());
    format!("{ns}/{}", task.name_any())
}

/// Whether an empty queue should wake `task` for a scale-in (ADR 0028): autoscaled, above its
/// minimum, and its queue empty for its whole scale-down window; once each time the queue
/// empties. A queue that keeps refilling never stays empty that long, so it wakes nothing.
pub fn drained(task: &PeragoTask, queued: i64, drain: &mut Drain, now: Instant) -> bool {
    if queued > 0 {
        *drain = Drain::default();
        return false;
    }
    let since = *drain.since.get_or_insert(now);
    let Some(auto) = &task.spec.executor.autoscaling else {
        return false;
    };
    let window =
        Duration::from_secs(u64::try_from(auto.scale_down_stabilization_seconds).unwrap_or(0));
    if drain.woken
        || task.spec.executor.replicas <= auto.min_replicas
        || now.saturating_duration_since(since) < window
    {
        return false;
    }
    drain.woken = true;
    true
}

/// Before a scale-in by `count` pods: writes [`deletion_marks`]. Returns how many changed.
pub async fn mark_deletion_costs(ctx: &Context, ns: &str, pods: &[BusyPod], count: usize) -> usize {
    use futures_util::StreamExt;
    let api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    let api = &api;
    // Side by side: under load each write waits its turn at the API server, and a scale-in
    // waits for all of them.
    let write = |name: &str, cost: Option<&'static str>| {
        let name = name.to_owned();
        async move {
            let patch = json!({"metadata": {"annotations": {DELETION_COST: cost}}});
            // Only the metadata comes back: thousands of whole pods at once in a wave of
            // scale-ins would be most of the operator's memory.
            let written = api
                .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            match written {
                Ok(_) => {
                    ctx.metrics.deletion_cost_writes.inc();
                    let mut written = ctx
                        .costs_written
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    // Entries of pods gone since (a scale-in removes them) are never read again.
                    written.retain(|_, (_, at)| at.elapsed() <= OWN_WRITE_TRUSTED);
                    written.insert(
                        format!("{ns}/{name}"),
                        (cost.map(str::to_owned), Instant::now()),
                    );
                    true
                }
                Err(e) => {
                    warn!(pod = %name, error = %e, "setting the pod's deletion cost failed");
                    false
                }
            }
        }
    };
    let writes: Vec<_> = deletion_marks(pods, count)
        .into_iter()
        .map(|(name, cost)| write(name, cost))
        .collect();
    let written: Vec<bool> = futures_util::stream::iter(writes)
        .buffer_unordered(MARKS_AT_ONCE)
        .collect()
        .await;
    written.into_iter().filter(|w| *w).count()
}

/// Deletion-cost writes of one scale-in in flight at once.
const MARKS_AT_ONCE: usize = 8;

/// `ceil(work / target)` clamped to `[min, max]`.
pub fn recommended(work: i64, spec: &AutoscalingSpec) -> i32 {
    i32::try_from(unclamped(work, spec))
        .unwrap_or(i32::MAX)
        .clamp(spec.min_replicas, spec.max_replicas.max(spec.min_replicas))
}

fn unclamped(work: i64, spec: &AutoscalingSpec) -> i64 {
    let target = i64::from(spec.target_queue_depth.max(1));
    (work.max(0) + target - 1) / target
}

/// Scale up at once; scale down only to the highest recommendation of the stabilisation
/// window (as the HPA does), so a queue that drains for a moment does not remove pods.
pub fn stabilised(
    history: &mut Vec<(Instant, i32)>,
    now: Instant,
    window: Duration,
    current: i32,
    wanted: i32,
) -> i32 {
    history.retain(|(at, _)| now.duration_since(*at) <= window);
    history.push((now, wanted));
    window_highest(history, current, wanted)
}

/// [`stabilised`] again after the figures behind its last recommendation changed: `wanted`
/// replaces that recommendation.
pub fn restabilised(history: &mut [(Instant, i32)], current: i32, wanted: i32) -> i32 {
    if let Some(last) = history.last_mut() {
        last.1 = wanted;
    }
    window_highest(history, current, wanted)
}

fn window_highest(history: &[(Instant, i32)], current: i32, wanted: i32) -> i32 {
    if wanted >= current {
        wanted
    } else {
        history
            .iter()
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(wanted)
            .min(current)
    }
}

/// Why `next` pods, in the words of the status and the `Scaled` event.
pub fn reason(queued: i64, running: i64, spec: &AutoscalingSpec, next: i32) -> String {
    let raw = unclamped(queued + running, spec);
    let wanted = recommended(queued + running, spec);
    let mut text = format!(
        "{queued} queued + {running} running at {} per pod: {raw} pods",
        spec.target_queue_depth.max(1)
    );
    if i64::from(wanted) != raw {
        text.push_str(&format!(
            ", {wanted} within {}..{}",
            spec.min_replicas,
            spec.max_replicas.max(spec.min_replicas)
        ));
    }
    if next > wanted {
        text.push_str(&format!(
            ", {next} kept by the {} s scale-down window",
            spec.scale_down_stabilization_seconds
        ));
    }
    text
}

/// This process decided `decision` for `task`: its status carries it from now on
/// ([`last_scale`]).
pub fn decided(ctx: &Context, task: &PeragoTask, decision: ScaleDecision) {
    ctx.last_scales
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(task_key(task), decision);
}

/// `status.lastScale` of `task`: this process's last decision while the watched task does not
/// show it yet, else the watched one. The status is written from the watched task, which under
/// load shows the operator's own writes late; writing its older decision back would undo the
/// newer one.
pub fn last_scale(ctx: &Context, task: &PeragoTask) -> Option<ScaleDecision> {
    let shown = task.status.as_ref().and_then(|s| s.last_scale.clone());
    let mut all = ctx
        .last_scales
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = task_key(task);
    let Some(decided) = all.get(&key) else {
        return shown;
    };
    // The status keeps microseconds.
    let micros = |d: &ScaleDecision| d.time.0.as_microsecond();
    if shown.as_ref().is_some_and(|s| micros(s) >= micros(decided)) {
        all.remove(&key);
        return shown;
    }
    Some(decided.clone())
}

/// Scheduled tasks in the task's queue (its domain's, when it has one), and when they were
/// read: from the queue watch when it read them lately and no attempt runs, else from
/// Conductor. With attempts running, a read up to two periods old may still count a task a pod
/// has since taken, which the running count then counts again.
pub async fn queued(
    ctx: &Context,
    base: &str,
    task: &PeragoTask,
    running: i64,
) -> Result<(i64, Instant), ConductorError> {
    let (task_type, domain) = (&task.spec.task_name, task.spec.domain());
    match ctx.queues.fresh(base, &queue_name(task_type, domain)) {
        Some((size, at)) if running == 0 || size == 0 => Ok((size, at)),
        _ => {
            let size = ctx.conductor.at(base).queue_size(task_type, domain).await?;
            // Conductor may have handed a task out at any moment until it answered.
            Ok((size, Instant::now()))
        }
    }
}

/// How long after a queue read the busy figure of a pod that does not say which polls it
/// counts (a sidecar older than ADR 0033) must be taken for a scale-in to trust the two
/// together. Conductor takes a task off the queue when a pod polls, and the pod counts it busy
/// only once the poll's answer arrives: a figure taken in between shows the task in neither.
/// The window is Conductor's answer time: milliseconds on a quiet server, over a second on a
/// loaded one. A pod scaled in within it despite this still finishes the attempt in its grace
/// period, or Conductor retries it.
pub const QUEUE_SETTLE: Duration = Duration::from_secs(2);

/// Would the work now queued (plus what the task last ran) need more pods than it has, or
/// than this process last gave it when the watch does not show that yet?
fn needs_more_pods(task: &PeragoTask, replicas: i32, queued: i64) -> bool {
    let Some(auto) = &task.spec.executor.autoscaling else {
        return false;
    };
    let running = task
        .status
        .as_ref()
        .and_then(|s| s.running_attempts)
        .unwrap_or(0);
    recommended(queued + running, auto) > replicas
}

/// Every `period`, one `GET /tasks/queue/all` per Conductor: keep the figures for the
/// reconciles and the queued-attempts metric, and wake the reconcile of each autoscaled task
/// whose queue needs more pods than it has, so that scaling up (from zero above all) waits
/// for the next tick and not for the task's resync. Scaling down still happens on resync, where
/// the scale-down window is applied.
pub async fn watch_queues(ctx: Arc<Context>, wake: crate::scope::Wake) {
    let Some(period) = ctx.queues.period else {
        return;
    };
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut failing = HashSet::new();
    let mut drains: HashMap<String, Drain> = HashMap::new();
    loop {
        ticker.tick().await;
        let mut by_conductor: BTreeMap<String, Vec<Arc<PeragoTask>>> = BTreeMap::new();
        for task in ctx.tasks.state() {
            if task.metadata.deletion_timestamp.is_none() {
                by_conductor
                    .entry(conductor_url(&task, &ctx))
                    .or_default()
                    .push(task);
            }
        }
        let reads = by_conductor.into_iter().map(|(base, tasks)| {
            let ctx = &ctx;
            async move {
                let started = Instant::now();
                let sizes = ctx.conductor.at(&base).queue_sizes().await;
                ctx.metrics
                    .queue_read_seconds
                    .with_label_values::<&str>(&[])
                    .observe(started.elapsed().as_secs_f64());
                (sizes, base, tasks)
            }
        });
        let now = Instant::now();
        let keys: HashSet<String> = ctx.tasks.state().iter().map(|t| task_key(t)).collect();
        drains.retain(|key, _| keys.contains(key));
        for (sizes, base, tasks) in futures_util::future::join_all(reads).await {
            let sizes = match sizes {
                Ok(sizes) => sizes,
                Err(e) => {
                    if failing.insert(base.clone()) {
                        warn!(conductor = %base, error = %e, "reading the queue sizes failed; autoscaling waits for each task's resync until it works");
                    }
                    continue;
                }
            };
            if failing.remove(&base) {
                info!(conductor = %base, "reading the queue sizes works again");
            }
            for task in take_read(&ctx, &base, sizes, &tasks, &mut drains, now) {
                wake.wake(task);
            }
        }
    }
}

/// One read of the queues of the Conductor at `base`, whose tasks are `tasks`: record the
/// sizes and the queued-attempts metric, and return the tasks to wake. The caller wakes them
/// only then: their reconciles start at once and read the recorded sizes, which must be
/// these, not the previous read's.
fn take_read(
    ctx: &Context,
    base: &str,
    sizes: HashMap<String, i64>,
    tasks: &[Arc<PeragoTask>],
    drains: &mut HashMap<String, Drain>,
    now: Instant,
) -> Vec<ObjectRef<PeragoTask>> {
    let mut woken = Vec::new();
    for task in tasks {
        let queue = queue_name(&task.spec.task_name, task.spec.domain());
        let queued = sizes.get(&queue).copied().unwrap_or(0);
        ctx.metrics.task_queued(task).set(queued);
        let drain = drains.entry(task_key(task)).or_default();
        let replicas = scale_written(ctx, task).unwrap_or(task.spec.executor.replicas);
        if needs_more_pods(task, replicas, queued) || drained(task, queued, drain, now) {
            woken.push(ObjectRef::from_obj(&**task));
        }
    }
    ctx.queues.record(base, sizes);
    woken
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scale_written_stands_until_the_watched_task_shows_it() {
        let (ctx, _api) = crate::fixtures::mocked_context();
        let at = |generation: i64| {
            crate::fixtures::task(
                &format!("{{name: t, namespace: ns, generation: {generation}}}"),
                "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 5, body: {image: b, command: [run]}}}",
            )
        };
        assert_eq!(scale_written(&ctx, &at(3)), None, "nothing written");
        wrote_scale(&ctx, &at(3), 0);
        assert_eq!(
            scale_written(&ctx, &at(3)),
            Some(0),
            "the watch still shows the generation the write was decided on"
        );
        assert_eq!(scale_written(&ctx, &at(4)), None, "the watch caught up");
        assert_eq!(
            scale_written(&ctx, &at(3)),
            None,
            "forgotten once caught up"
        );

        // A scale-up on top of a write the watch does not show yet (generation 3 → 4 → 5).
        wrote_scale(&ctx, &at(3), 1);
        wrote_scale(&ctx, &at(3), 5);
        assert_eq!(scale_written(&ctx, &at(3)), Some(5), "neither write shown");
        assert_eq!(
            scale_written(&ctx, &at(4)),
            Some(5),
            "the watch shows the first write only"
        );
        assert_eq!(scale_written(&ctx, &at(5)), None, "both shown");
    }

    fn spec() -> AutoscalingSpec {
        AutoscalingSpec {
            min_replicas: 0,
            max_replicas: 5,
            target_queue_depth: 4,
            scale_down_stabilization_seconds: 60,
        }
    }

    #[test]
    fn recommendations_and_stabilisation() {
        let spec = spec();
        assert_eq!(
            [0, 1, 4, 5, 400].map(|d| recommended(d, &spec)),
            [0, 1, 1, 2, 5]
        );
        let t0 = Instant::now();
        let w = Duration::from_secs(60);
        let mut h = Vec::new();
        assert_eq!(stabilised(&mut h, t0, w, 1, 4), 4, "up at once");
        assert_eq!(
            stabilised(&mut h, t0 + Duration::from_secs(10), w, 4, 0),
            4,
            "down waits"
        );
        assert_eq!(stabilised(&mut h, t0 + Duration::from_secs(30), w, 4, 1), 4);
        assert_eq!(
            stabilised(&mut h, t0 + Duration::from_secs(65), w, 4, 0),
            1,
            "to the window's highest"
        );
        assert_eq!(
            stabilised(&mut h, t0 + Duration::from_secs(100), w, 1, 0),
            0
        );
        assert_eq!(
            restabilised(&mut h, 1, 1),
            1,
            "the pods asked again were busy: the last recommendation is theirs"
        );
        assert_eq!(h.last().map(|(_, r)| *r), Some(1));
    }

    #[test]
    fn a_scheduled_pod_not_running_yet_is_starting_unless_it_is_stuck_going_or_late() {
        let now = Timestamp::now();
        let scheduled = |ago: i64| (now - SignedDuration::from_secs(ago)).to_string();
        let pod = |phase: &str, scheduled: (&str, &str), waiting: Option<&str>, going: bool| {
            let mut pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "t-perago-abc"},
                "status": {
                    "phase": phase,
                    "conditions": [{
                        "type": "PodScheduled", "status": scheduled.0,
                        "lastTransitionTime": scheduled.1,
                    }],
                    "containerStatuses": waiting.map(|reason| json!([{
                        "name": "body", "image": "", "imageID": "", "ready": false,
                        "restartCount": 0, "state": {"waiting": {"reason": reason}},
                    }])),
                },
            }))
            .unwrap();
            if going {
                pod.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
            }
            pod
        };
        let just = scheduled(2);
        assert!(starting(&pod("Pending", ("True", &just), None, false), now));
        assert!(starting(
            &pod("Pending", ("True", &just), Some("ContainerCreating"), false),
            now
        ));
        assert!(
            !starting(&pod("Running", ("True", &just), None, false), now),
            "running: asked"
        );
        assert!(
            !starting(&pod("Pending", ("False", &just), None, false), now),
            "not scheduled"
        );
        assert!(
            !starting(
                &pod("Pending", ("True", &just), Some("ImagePullBackOff"), false),
                now
            ),
            "stuck"
        );
        assert!(
            !starting(&pod("Pending", ("True", &just), None, true), now),
            "going"
        );
        assert!(
            !starting(
                &pod(
                    "Pending",
                    ("True", &scheduled(61)),
                    Some("ContainerCreating"),
                    false
                ),
                now
            ),
            "scheduled over a minute ago: no longer waited for"
        );
    }

    fn pod(name: &str, busy: i64, answered: bool, ready: bool) -> BusyPod {
        BusyPod {
            name: name.into(),
            ip: String::new(),
            asked: Instant::now(),
            polls_counted_before: Some(Instant::now()),
            busy,
            cost: None,
            answered,
            ready,
        }
    }

    fn chosen(mut pod: BusyPod) -> BusyPod {
        pod.cost = Some(CHOSEN.into());
        pod
    }

    #[test]
    fn a_scale_in_writes_only_the_pods_it_removes_and_those_it_no_longer_does() {
        let pods = [
            pod("a", 1, true, true),
            pod("b", 0, true, true),
            chosen(pod("c", 0, true, true)),
            pod("d", 4, false, true),
            pod("e", 0, true, true),
        ];
        assert_eq!(
            deletion_marks(&pods, 2),
            [("b", Some(CHOSEN))],
            "c is chosen already and is idle, so only b is written"
        );
        assert_eq!(
            deletion_marks(&pods, 4),
            [
                ("b", Some(CHOSEN)),
                ("e", Some(CHOSEN)),
                ("a", Some(CHOSEN))
            ],
            "fewest busy slots first; the pod that did not answer goes last"
        );
        let busy_now = [chosen(pod("c", 2, true, true)), pod("f", 0, true, true)];
        assert_eq!(
            deletion_marks(&busy_now, 1),
            [("f", Some(CHOSEN)), ("c", None)],
            "an earlier choice that is busy now is released"
        );
        assert!(deletion_marks(&pods, 0).iter().all(|(_, c)| c.is_none()));
        assert_eq!(
            deletion_marks(&pods, 9).len(),
            4,
            "more than the pods: all of them"
        );
    }

    #[test]
    fn a_scale_in_asks_again_only_the_pods_it_would_remove() {
        let observed = Instant::now();
        let read = observed - Duration::from_millis(5);
        let old = |mut pod: BusyPod| {
            pod.asked = observed - Duration::from_secs(30);
            pod
        };
        let mut pods = vec![
            old(pod("a", 0, true, true)),
            pod("b", 0, true, true),
            old(pod("c", 2, true, true)),
            old(pod("d", 1, true, true)),
            old(pod("e", 2, true, true)),
        ];
        assert_eq!(
            unconfirmed_removals(&pods, 2, read, observed),
            [0],
            "a and b would go; b was asked during this reconcile"
        );
        assert!(unconfirmed_removals(&pods, 0, read, observed).is_empty());
        // a answers busy: the next pod in line, d, is the one to ask next.
        let now = Instant::now();
        pods[0].update(crate::slots::Figure {
            busy: 2,
            answered: true,
            at: now,
            polls_counted_before: Some(now),
        });
        assert_eq!(unconfirmed_removals(&pods, 2, read, observed), [3]);
        assert_eq!(
            unconfirmed_removals(&pods, 5, read, observed),
            [3, 2, 4],
            "every pod but those asked since"
        );

        // b was asked since, but a poll it sent before the read may not be counted yet.
        pods[1].polls_counted_before = Some(read - Duration::from_millis(1));
        assert_eq!(unconfirmed_removals(&pods, 1, read, observed), [1]);
        // A sidecar that does not say which polls it counts: trusted once asked
        // QUEUE_SETTLE after the read.
        pods[1].polls_counted_before = None;
        assert_eq!(unconfirmed_removals(&pods, 1, read, observed), [1]);
        pods[1].asked = read + QUEUE_SETTLE;
        assert!(unconfirmed_removals(&pods, 1, read, observed).is_empty());
    }

    #[test]
    fn a_scale_in_waits_for_the_costs_to_settle_and_for_busy_pods_to_be_ready() {
        let now = Instant::now();
        let settled = Some(now - SCALE_IN_AFTER_COSTS);
        let pods = [pod("idle", 0, true, false), pod("busy", 1, true, true)];
        assert_eq!(scale_in_waits(&pods, settled, now), None);
        assert_eq!(scale_in_waits(&pods, None, now), None);
        let fresh = Some(now - Duration::from_millis(300));
        assert_eq!(
            scale_in_waits(&pods, fresh, now).as_deref(),
            Some("deletion costs changed 300 ms ago")
        );
        let pods = [pod("idle", 0, true, true), pod("new", 1, true, false)];
        assert_eq!(
            scale_in_waits(&pods, settled, now).as_deref(),
            Some("busy pods not Ready yet: new")
        );
        let silent = [pod("idle", 0, true, true), pod("crashing", 1, false, false)];
        assert_eq!(
            scale_in_waits(&silent, settled, now),
            None,
            "a pod that does not answer holds nothing back"
        );
    }

    #[test]
    fn reasons_give_the_figures_the_clamp_and_the_window() {
        let spec = spec();
        assert_eq!(
            reason(3, 2, &spec, 2),
            "3 queued + 2 running at 4 per pod: 2 pods"
        );
        assert_eq!(
            reason(400, 0, &spec, 5),
            "400 queued + 0 running at 4 per pod: 100 pods, 5 within 0..5"
        );
        assert_eq!(
            reason(0, 0, &spec, 3),
            "0 queued + 0 running at 4 per pod: 0 pods, 3 kept by the 60 s scale-down window"
        );
    }

    /// A read of the queues records its sizes before it names the tasks to wake, whose
    /// reconciles start at once and read them; and a task the operator already scaled, the
    /// watch not showing it yet, is not woken again.
    #[tokio::test]
    async fn a_read_records_the_sizes_before_it_wakes_anyone() {
        let base = "http://conductor:8080/api";
        let (ctx, _api) = crate::fixtures::mocked_context_with(Some(Duration::from_secs(2)));
        let task = Arc::new(crate::fixtures::task(
            "{name: t, namespace: default, uid: u-1, generation: 1}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 0, autoscaling: {minReplicas: 0, maxReplicas: 5, targetQueueDepth: 1, scaleDownStabilizationSeconds: 0}, body: {image: b, command: [run]}}}",
        ));
        let mut drains = HashMap::new();
        let read = |queued: i64| HashMap::from([("op.t".to_owned(), queued)]);
        let tasks = [task.clone()];

        let woken = take_read(&ctx, base, read(3), &tasks, &mut drains, Instant::now());
        assert_eq!(woken, [ObjectRef::from_obj(&*task)]);
        assert_eq!(
            ctx.queues.fresh(base, "op.t").map(|(size, _)| size),
            Some(3),
            "recorded before the wake-up"
        );

        wrote_scale(&ctx, &task, 3);
        let woken = take_read(&ctx, base, read(3), &tasks, &mut drains, Instant::now());
        assert!(woken.is_empty(), "scaled to 3 already");
        let woken = take_read(&ctx, base, read(5), &tasks, &mut drains, Instant::now());
        assert_eq!(woken.len(), 1, "5 queued need more than the 3 written");
    }

    /// Pods the watch does not show yet hold a scale-in back only for a while after the
    /// operator's own scale-up.
    #[tokio::test]
    async fn a_scale_up_lately_with_pods_unseen_holds_a_scale_in_back() {
        let (ctx, _api) = crate::fixtures::mocked_context();
        let task = crate::fixtures::task(
            "{name: t, namespace: default, uid: u-1, generation: 1}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 1, body: {image: b, command: [run]}}}",
        );
        let now = Timestamp::now();
        let pod: Arc<Pod> = Arc::new(
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": "p", "namespace": "default"}}),
            )
            .unwrap(),
        );
        let scaled = |at: Timestamp| ScaleDecision {
            time: k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(at),
            from: 0,
            to: 1,
            reason: String::new(),
        };
        assert!(
            !pods_unseen(&ctx, &task, &[], 1, now),
            "no scale-up of its own"
        );
        decided(&ctx, &task, scaled(now));
        assert!(
            pods_unseen(&ctx, &task, &[], 1, now),
            "its pod not seen yet"
        );
        assert!(!pods_unseen(&ctx, &task, &[pod], 1, now), "seen");
        let later = now + STARTING_LIMIT;
        assert!(
            !pods_unseen(&ctx, &task, &[], 1, later),
            "not waited for longer"
        );
    }

    /// The status carries the operator's last decision until the watched task shows it, and
    /// never an older one the watch still shows; once shown, the watched one is the truth.
    #[tokio::test]
    async fn the_last_decision_stands_until_the_watched_status_shows_it() {
        let (ctx, _api) = crate::fixtures::mocked_context();
        let decision = |from, to| ScaleDecision {
            time: k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now()),
            from,
            to,
            reason: String::new(),
        };
        let mut task = crate::fixtures::task(
            "{name: t, namespace: default, uid: u-1, generation: 1}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 2, body: {image: b, command: [run]}}}",
        );
        assert!(last_scale(&ctx, &task).is_none());
        let older = decision(0, 1);
        task.status = Some(perago_api::PeragoTaskStatus {
            last_scale: Some(older.clone()),
            ..Default::default()
        });
        assert_eq!(
            last_scale(&ctx, &task),
            Some(older.clone()),
            "the watched one"
        );

        let newer = decision(1, 2);
        decided(&ctx, &task, newer.clone());
        assert_eq!(
            last_scale(&ctx, &task),
            Some(newer.clone()),
            "not the older one"
        );

        // The status round-trips through the API server at microseconds.
        let mut shown = newer.clone();
        shown.time.0 = Timestamp::from_microsecond(newer.time.0.as_microsecond()).unwrap();
        task.status.as_mut().unwrap().last_scale = Some(shown.clone());
        assert_eq!(last_scale(&ctx, &task), Some(shown.clone()));
        assert!(
            ctx.last_scales.lock().unwrap().is_empty(),
            "forgotten once shown"
        );
    }

    #[test]
    fn the_watch_wakes_a_task_only_when_it_needs_more_pods() {
        let yaml = "apiVersion: perago.io/v1alpha1\nkind: PeragoTask\nmetadata: {name: t}\nspec:\n  taskName: t\n  ownerEmail: a@b.c\n  paramsSchema: {type: object}\n  resultSchema: {type: object}\n  executor: {body: {image: b, command: [run]}}\n";
        let mut task = perago_api::manifest::parse(yaml).unwrap().remove(0).task;
        assert!(!needs_more_pods(&task, 0, 10), "not autoscaled");
        task.spec.executor.autoscaling = Some(spec());
        assert!(!needs_more_pods(&task, 0, 0));
        assert!(needs_more_pods(&task, 0, 1), "from zero");
        assert!(!needs_more_pods(&task, 2, 8));
        task.status = Some(perago_api::PeragoTaskStatus {
            running_attempts: Some(1),
            ..Default::default()
        });
        assert!(needs_more_pods(&task, 2, 8), "8 queued + 1 running need 3");
        assert!(!needs_more_pods(&task, 5, 400), "at the maximum");
    }

    #[test]
    fn an_emptied_queue_wakes_its_task_once_after_the_window() {
        let yaml = "apiVersion: perago.io/v1alpha1\nkind: PeragoTask\nmetadata: {name: t}\nspec:\n  taskName: t\n  ownerEmail: a@b.c\n  paramsSchema: {type: object}\n  resultSchema: {type: object}\n  executor: {body: {image: b, command: [run]}}\n";
        let mut task = perago_api::manifest::parse(yaml).unwrap().remove(0).task;
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut drain = Drain::default();
        task.spec.executor.replicas = 3;
        assert!(!drained(&task, 0, &mut drain, at(100)), "not autoscaled");

        task.spec.executor.autoscaling = Some(spec()); // window 60 s, minimum 0
        let mut drain = Drain::default();
        assert!(!drained(&task, 2, &mut drain, at(0)));
        assert!(!drained(&task, 0, &mut drain, at(2)), "empty since 2 s");
        assert!(
            !drained(&task, 0, &mut drain, at(61)),
            "not for the whole window"
        );
        assert!(drained(&task, 0, &mut drain, at(62)));
        assert!(!drained(&task, 0, &mut drain, at(64)), "once");
        assert!(!drained(&task, 1, &mut drain, at(66)), "refilled");
        assert!(!drained(&task, 0, &mut drain, at(68)));
        assert!(
            drained(&task, 0, &mut drain, at(128)),
            "emptied again, a window later"
        );

        let mut drain = Drain::default();
        task.spec.executor.replicas = 0;
        assert!(!drained(&task, 0, &mut drain, at(0)));
        assert!(!drained(&task, 0, &mut drain, at(100)), "at its minimum");

        let mut drain = Drain::default();
        task.spec.executor.replicas = 2;
        task.spec.executor.autoscaling = Some(AutoscalingSpec {
            scale_down_stabilization_seconds: 0,
            ..spec()
        });
        assert!(
            drained(&task, 0, &mut drain, at(0)),
            "no window: at the first empty read"
        );
    }

    #[tokio::test]
    async fn a_cost_it_wrote_is_not_written_again_while_the_cache_lags() {
        let (ctx, mut api) = crate::fixtures::mocked_context();
        let cached = |cost: Option<&str>| -> Pod {
            let mut pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "b", "namespace": "ns"},
            }))
            .unwrap();
            if let Some(cost) = cost {
                pod.metadata.annotations =
                    Some([(DELETION_COST.to_owned(), cost.to_owned())].into());
            }
            pod
        };
        let pods = [pod("a", 1, true, true), pod("b", 0, true, true)];
        let written = tokio::spawn({
            let ctx = ctx.clone();
            async move { mark_deletion_costs(&ctx, "ns", &pods, 1).await }
        });
        let (patch, answer) = api
            .expect(http::Method::PATCH, "/namespaces/ns/pods/b")
            .await;
        assert_eq!(patch["metadata"]["annotations"][DELETION_COST], CHOSEN);
        answer.send(200, &serde_json::to_value(cached(Some(CHOSEN))).unwrap());
        assert_eq!(written.await.unwrap(), 1);

        // The cache does not show the write yet: the pod counts as chosen, so the next pass
        // writes nothing.
        assert_eq!(cost_now(&ctx, &cached(None)).as_deref(), Some(CHOSEN));
        let mut b = pod("b", 0, true, true);
        b.cost = cost_now(&ctx, &cached(None));
        assert!(deletion_marks(&[pod("a", 1, true, true), b], 1).is_empty());
        // Once it does, the cache is believed again (and then changes by others count).
        assert_eq!(
            cost_now(&ctx, &cached(Some(CHOSEN))).as_deref(),
            Some(CHOSEN)
        );
        assert_eq!(cost_now(&ctx, &cached(None)), None);
        api.expect_no_more().await;
    }
}
