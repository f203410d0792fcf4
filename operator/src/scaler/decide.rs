//! The scale of an autoscaled task as a pure state machine: from what a reconcile observed
//! and what the scaler keeps of the task, [`decide`] names the next step: keep the replicas,
//! hold a scale-in back and say why, write deletion costs, ask pods again, or write the scale.
//! The reconcile carries the step out, folds its result into the observation and decides
//! again (`crate::scaling::scale`), so every rule of ADRs 0009, 0010, 0027, 0030, 0032 and
//! 0033 is a table test here rather than a branch inside an async loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use perago_api::PeragoTask;
use perago_api::task::{AutoscalingSpec, ScaleDecision};

use super::{Drain, Figure, TaskScale};

/// How long a scale-in waits after the pods' deletion costs changed: the ReplicaSet
/// controller picks its victims from its own cache of pods, which must hold the new costs.
pub const SCALE_IN_AFTER_COSTS: Duration = Duration::from_secs(2);

/// How long after a queue read the busy figure of a pod that does not say which polls it
/// counts (a sidecar older than ADR 0033) must be taken for a scale-in to trust the two
/// together. Conductor takes a task off the queue when a pod polls, and the pod counts it busy
/// only once the poll's answer arrives: a figure taken in between shows the task in neither.
/// The window is Conductor's answer time: milliseconds on a quiet server, over a second on a
/// loaded one. A pod scaled in within it despite this still finishes the attempt in its grace
/// period, or Conductor retries it.
pub const QUEUE_SETTLE: Duration = Duration::from_secs(2);

/// How long after it was scheduled a pod still Pending is waited for as starting. A pod that
/// takes longer (a slow image pull, a volume that does not mount) holds no scale-in back.
pub const STARTING_LIMIT: SignedDuration = SignedDuration::from_secs(60);

/// The deletion cost of the pods a scale-in chose: below every other pod's (unset is 0).
pub const CHOSEN: &str = "-1";

/// The clock, read once per step: the process's for the scaler's own records, the wall's for
/// the times the API server keeps.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub instant: Instant,
    pub time: Timestamp,
}

impl Now {
    /// Both clocks, now.
    pub fn read() -> Self {
        Self {
            instant: Instant::now(),
            time: Timestamp::now(),
        }
    }
}

/// A running executor pod, its busy figure and its deletion cost.
#[derive(Clone, Debug)]
pub struct BusyPod {
    pub name: String,
    pub ip: String,
    pub busy: i64,
    /// When the pod was asked.
    pub asked: Instant,
    /// Its figure counts every task a poll sent before this brought ([`Figure`]).
    pub polls_counted_before: Option<Instant>,
    /// Its `controller.kubernetes.io/pod-deletion-cost` now, this process's write included.
    pub cost: Option<String>,
    /// Its sidecar answered (a pod that does not counts as fully busy).
    pub answered: bool,
    /// Its `Ready` condition is true.
    pub ready: bool,
}

impl BusyPod {
    pub fn new(pod: &Pod, ip: String, figure: Figure, cost: Option<String>) -> Self {
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        Self {
            name: pod.name_any(),
            ip,
            busy: figure.busy,
            asked: figure.at,
            polls_counted_before: figure.polls_counted_before,
            cost,
            answered: figure.answered,
            ready: conditions
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        }
    }

    pub fn update(&mut self, figure: Figure) {
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

/// What one reconcile of a task has seen so far: the task, its pods and their busy figures,
/// its queue; and what the scale has done in this pass.
pub struct Observed {
    pub task: Arc<PeragoTask>,
    /// The task's executor pods, as the watch shows them.
    pub pods: Vec<Arc<Pod>>,
    /// The running ones, with their figures.
    pub busy: Vec<BusyPod>,
    pub queued: i64,
    /// When the queue was read.
    pub queue_read: Instant,
    /// When the reconcile began to look: a pod asked since has a figure of now.
    pub observed: Instant,
    /// How often this pass asked pods again.
    pub asks: u8,
    /// A deletion cost this pass tried to write was not written.
    pub marks_failed: bool,
}

impl Observed {
    /// Attempts running in the task's pods.
    pub fn running(&self) -> i64 {
        self.busy.iter().map(|p| p.busy).sum()
    }

    /// The replicas the work asks for now, before the window.
    pub fn wanted(&self, auto: &AutoscalingSpec) -> i32 {
        recommended(self.queued + self.running(), auto)
    }
}

/// Why a scale-in waits for a later pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// A pod is starting: its sidecar may have taken work no figure shows yet.
    Starting(String),
    /// The operator scaled up lately and the watch shows fewer pods than that.
    PodsUnseen,
    /// The deletion costs changed this long ago; the ReplicaSet's cache may not hold them.
    CostsSettling(Duration),
    /// These pods say they are busy but are not Ready: the ReplicaSet removes those first.
    BusyUnready(Vec<String>),
    /// A deletion cost could not be written.
    MarksFailed,
    /// A pod it would remove still has a poll from before the queue read unanswered.
    PollsInFlight,
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Starting(pod) => write!(f, "pod {pod} is starting"),
            Self::PodsUnseen => {
                f.write_str("the watch does not show every pod of the last scale-up yet")
            }
            Self::CostsSettling(since) => {
                write!(f, "deletion costs changed {} ms ago", since.as_millis())
            }
            Self::BusyUnready(pods) => write!(f, "busy pods not Ready yet: {}", pods.join(", ")),
            Self::MarksFailed => f.write_str("a deletion cost could not be written"),
            Self::PollsInFlight => {
                f.write_str("a pod's polls from before the queue read are not answered yet")
            }
        }
    }
}

/// A deletion cost to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub pod: String,
    /// [`CHOSEN`], or `None` to remove the annotation.
    pub cost: Option<&'static str>,
}

/// The next step of a task's scale.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScaleStep {
    /// The replicas stand: not autoscaled, nothing to change, or this process's own last write
    /// the watch does not show yet.
    Keep(i32),
    /// A scale-in waits for a later pass, [`SCALE_IN_AFTER_COSTS`] from now.
    Hold { replicas: i32, why: Hold },
    /// Write these deletion costs, then decide again.
    Mark(Vec<Mark>),
    /// Ask these pods (indexes into [`Observed::busy`]) again to count every poll sent before
    /// the queue read, not before `not_before`, then decide again.
    Ask {
        pods: Vec<usize>,
        not_before: Option<Instant>,
    },
    /// Write the scale.
    Scale { from: i32, to: i32 },
}

/// The next step of the scale of `seen`'s task, whose scaler state is `state`.
///
/// A scale-up is written at once. A scale-in waits while a pod is starting or the watch does
/// not show the pods of the last scale-up. To fewer pods, not to zero, it first marks the pods
/// it removes (ADR 0027) and waits for the ReplicaSet to see the marks; a scale-in to zero
/// removes every pod, so it marks none. Then it asks each pod it would remove, once, to count
/// every poll it sent before the queue read, and decides again with their answers (ADR 0030,
/// ADR 0033).
pub fn decide(seen: &Observed, state: &TaskScale, now: Now) -> ScaleStep {
    let task = &seen.task;
    let Some(auto) = &task.spec.executor.autoscaling else {
        return ScaleStep::Keep(task.spec.executor.replicas);
    };
    // This process's last write, when the watched task does not show it yet, is what the task
    // has: a scale-up builds on it at once; anything else waits for the watch.
    let written = state.scale_written(task.metadata.generation, now.instant);
    let replicas = written.unwrap_or(task.spec.executor.replicas);
    let next = state.stabilised(seen.observed, window(auto), replicas, seen.wanted(auto));
    if next > replicas {
        return ScaleStep::Scale {
            from: replicas,
            to: next,
        };
    }
    if written.is_some() || next == replicas {
        return ScaleStep::Keep(replicas);
    }
    let hold = |why| ScaleStep::Hold { replicas, why };
    if let Some(pod) = seen.pods.iter().find(|p| starting(p, now.time)) {
        return hold(Hold::Starting(pod.name_any()));
    }
    let shown = task.status.as_ref().and_then(|s| s.last_scale.as_ref());
    let last_scale = state.last_scale(shown, now.instant);
    if pods_unseen(&seen.pods, replicas, last_scale.as_ref(), now.time) {
        return hold(Hold::PodsUnseen);
    }
    let removals = usize::try_from(replicas - next).unwrap_or(0);
    if next > 0 {
        let marks = deletion_marks(&seen.busy, removals);
        if !marks.is_empty() {
            if seen.marks_failed {
                return hold(Hold::MarksFailed);
            }
            let marks = marks.into_iter().map(|(pod, cost)| Mark {
                pod: pod.to_owned(),
                cost,
            });
            return ScaleStep::Mark(marks.collect());
        }
        if let Some(why) = scale_in_waits(&seen.busy, state.costs_changed(), now.instant) {
            return hold(why);
        }
    }
    let stale = unconfirmed_removals(&seen.busy, removals, seen.queue_read, seen.observed);
    if stale.is_empty() {
        return ScaleStep::Scale {
            from: replicas,
            to: next,
        };
    }
    match seen.asks {
        0 => ScaleStep::Ask {
            pods: stale,
            not_before: None,
        },
        // A sidecar that does not say which polls it counts is trusted from then, and a poll
        // a loaded Conductor is slow to answer may be answered by then.
        1 => ScaleStep::Ask {
            pods: stale,
            not_before: Some(seen.queue_read + QUEUE_SETTLE),
        },
        _ => hold(Hold::PollsInFlight),
    }
}

/// The scale-down window of `auto`.
pub fn window(auto: &AutoscalingSpec) -> Duration {
    Duration::from_secs(u64::try_from(auto.scale_down_stabilization_seconds).unwrap_or(0))
}

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

/// The decision of a scale from `from` to `to` pods, for `status.lastScale`.
pub fn decision(seen: &Observed, from: i32, to: i32, now: Now) -> ScaleDecision {
    let reason = match &seen.task.spec.executor.autoscaling {
        Some(auto) => reason(seen.queued, seen.running(), auto, to),
        None => String::new(),
    };
    ScaleDecision {
        time: k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now.time),
        from,
        to,
        reason,
    }
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
) -> Option<Hold> {
    if let Some(at) = costs_changed {
        let since = now.saturating_duration_since(at);
        if since < SCALE_IN_AFTER_COSTS {
            return Some(Hold::CostsSettling(since));
        }
    }
    let unready: Vec<String> = pods
        .iter()
        .filter(|p| p.answered && p.busy > 0 && !p.ready)
        .map(|p| p.name.clone())
        .collect();
    (!unready.is_empty()).then_some(Hold::BusyUnready(unready))
}

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

/// Whether `pod` may have taken work that no figure shows yet: not running in the watched
/// pods, neither going nor stuck, and scheduled less than [`STARTING_LIMIT`] before `now`, or
/// not looked at by the scheduler yet and created that recently. Its sidecar polls as soon as
/// it starts, and the kubelet reports the pod Running a moment later; a scale-in decided in
/// between would count none of its work, and could remove it. Under load the watch shows a pod
/// seconds behind: still unscheduled when its sidecar has already taken work. A pod that
/// cannot start (unschedulable, its image not pulled, a crash loop) takes no work and is not
/// waited for.
pub fn starting(pod: &Pod, now: Timestamp) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let recent = |t: Option<&Time>| t.is_some_and(|t| now.duration_since(t.0) < STARTING_LIMIT);
    let scheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled");
    let lately = match scheduled {
        Some(c) => c.status == "True" && recent(c.last_transition_time.as_ref()),
        None => recent(pod.metadata.creation_timestamp.as_ref()),
    };
    pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref() == Some("Pending")
        && lately
        && crate::pods::pod_problem(pod).is_none()
}

/// Whether the task has pods the watch of pods does not show yet: fewer pods than `replicas`
/// within [`STARTING_LIMIT`] of the last scale-up (`last_scale`). Under load the watch shows a
/// new pod seconds late, while its sidecar may already have taken work; a scale-in decided
/// then would count none of it. A pod that never comes (a quota, a refusing webhook) holds
/// scale-ins back for that long at most.
pub fn pods_unseen(
    pods: &[Arc<Pod>],
    replicas: i32,
    last_scale: Option<&ScaleDecision>,
    now: Timestamp,
) -> bool {
    let seen = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .count();
    let scaled_up_lately =
        last_scale.is_some_and(|s| s.to > s.from && now.duration_since(s.time.0) < STARTING_LIMIT);
    scaled_up_lately && seen < usize::try_from(replicas).unwrap_or(0)
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
    if drain.woken
        || task.spec.executor.replicas <= auto.min_replicas
        || now.saturating_duration_since(since) < window(auto)
    {
        return false;
    }
    drain.woken = true;
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use crate::scaler::{ScaleWritten, Unwatched};
    use serde_json::json;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn spec() -> AutoscalingSpec {
        AutoscalingSpec {
            min_replicas: 0,
            max_replicas: 5,
            target_queue_depth: 4,
            scale_down_stabilization_seconds: 60,
        }
    }

    /// An autoscaled task at `replicas` and `generation`: one attempt per pod, no window.
    fn task(replicas: i32, generation: i64) -> Arc<PeragoTask> {
        Arc::new(crate::fixtures::task(
            &format!("{{name: t, namespace: default, uid: u-1, generation: {generation}}}"),
            &format!(
                "{{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {{type: object}}, resultSchema: {{type: object}}, executor: {{replicas: {replicas}, autoscaling: {{minReplicas: 0, maxReplicas: 5, targetQueueDepth: 1, scaleDownStabilizationSeconds: 0}}, body: {{image: b, command: [run]}}}}}}"
            ),
        ))
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

    fn idle(name: &str) -> BusyPod {
        pod(name, 0, true, true)
    }

    fn chosen(mut pod: BusyPod) -> BusyPod {
        pod.cost = Some(CHOSEN.into());
        pod
    }

    /// Figures taken before the queue read: a scale-in asks these pods again.
    fn asked_before(mut pod: BusyPod, read: Instant) -> BusyPod {
        pod.asked = read - secs(30);
        pod.polls_counted_before = Some(read - secs(30));
        pod
    }

    /// What a reconcile saw of `task`: the queue read and the look began `now`, and `busy`.
    fn seen(task: &Arc<PeragoTask>, busy: Vec<BusyPod>, queued: i64, now: Instant) -> Observed {
        Observed {
            task: task.clone(),
            pods: Vec::new(),
            busy,
            queued,
            queue_read: now - Duration::from_millis(1),
            observed: now - Duration::from_millis(1),
            asks: 0,
            marks_failed: false,
        }
    }

    fn now_at(instant: Instant) -> Now {
        Now {
            instant,
            time: Timestamp::now(),
        }
    }

    fn hold(replicas: i32, why: Hold) -> ScaleStep {
        ScaleStep::Hold { replicas, why }
    }

    fn mark(pod: &str, cost: Option<&'static str>) -> Mark {
        Mark {
            pod: pod.into(),
            cost,
        }
    }

    /// Every step of the scale, one row per rule of ADRs 0009, 0027, 0030, 0032 and 0033.
    #[test]
    fn each_observation_leads_to_its_step() {
        let t = Instant::now();
        let now = now_at(t);
        let none = TaskScale::default();

        let plain = Arc::new(crate::fixtures::task(
            "{name: t, namespace: default, generation: 1}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 3, body: {image: b, command: [run]}}}",
        ));
        let rows: Vec<(&str, Observed, &TaskScale, ScaleStep)> = vec![
            (
                "not autoscaled: the spec's replicas, whatever the queue",
                seen(&plain, vec![], 40, t),
                &none,
                ScaleStep::Keep(3),
            ),
            (
                "queued work scales up at once",
                seen(&task(1, 1), vec![pod("a", 1, true, true)], 2, t),
                &none,
                ScaleStep::Scale { from: 1, to: 3 },
            ),
            (
                "to the maximum at most",
                seen(&task(0, 1), vec![], 400, t),
                &none,
                ScaleStep::Scale { from: 0, to: 5 },
            ),
            (
                "the work fits: nothing to do",
                seen(
                    &task(2, 1),
                    vec![pod("a", 1, true, true), pod("b", 1, true, true)],
                    0,
                    t,
                ),
                &none,
                ScaleStep::Keep(2),
            ),
            (
                "a scale-in to zero of confirmed idle pods marks nothing (ADR 0033)",
                seen(&task(2, 1), vec![idle("a"), idle("b")], 0, t),
                &none,
                ScaleStep::Scale { from: 2, to: 0 },
            ),
            (
                "a scale-in to fewer pods marks those it removes first (ADR 0027)",
                seen(
                    &task(3, 1),
                    vec![idle("a"), idle("b"), pod("c", 1, true, true)],
                    0,
                    t,
                ),
                &none,
                ScaleStep::Mark(vec![mark("a", Some(CHOSEN)), mark("b", Some(CHOSEN))]),
            ),
            (
                "marked and confirmed: the scale-in is written",
                seen(
                    &task(3, 1),
                    vec![
                        chosen(idle("a")),
                        chosen(idle("b")),
                        pod("c", 1, true, true),
                    ],
                    0,
                    t,
                ),
                &none,
                ScaleStep::Scale { from: 3, to: 1 },
            ),
            (
                "a pod that turned busy loses its mark to an idle one",
                seen(
                    &task(2, 1),
                    vec![chosen(pod("a", 1, true, true)), idle("b")],
                    0,
                    t,
                ),
                &none,
                ScaleStep::Mark(vec![mark("b", Some(CHOSEN)), mark("a", None)]),
            ),
            (
                "a busy pod not Ready yet would go first: wait",
                seen(
                    &task(2, 1),
                    vec![chosen(idle("a")), pod("b", 1, true, false)],
                    0,
                    t,
                ),
                &none,
                hold(2, Hold::BusyUnready(vec!["b".into()])),
            ),
            (
                "a pod that does not answer counts as busy and holds nothing back",
                seen(
                    &task(2, 1),
                    vec![chosen(idle("a")), pod("b", 1, false, false)],
                    0,
                    t,
                ),
                &none,
                ScaleStep::Scale { from: 2, to: 1 },
            ),
        ];
        for (why, seen, state, step) in rows {
            assert_eq!(decide(&seen, state, now), step, "{why}");
        }
    }

    /// The window keeps pods a drained queue no longer needs (ADR 0009).
    #[test]
    fn a_scale_in_waits_out_the_window() {
        let t = Instant::now();
        let mut task = (*task(3, 1)).clone();
        task.spec
            .executor
            .autoscaling
            .as_mut()
            .unwrap()
            .scale_down_stabilization_seconds = 60;
        let task = Arc::new(task);
        let mut state = TaskScale::default();
        state.record(t - secs(30), secs(60), 3);
        let idle3 = || vec![chosen(idle("a")), chosen(idle("b")), chosen(idle("c"))];
        let step = decide(&seen(&task, idle3(), 0, t), &state, now_at(t));
        assert_eq!(step, ScaleStep::Keep(3), "3 recommended 30 s ago");
        let later = t + secs(31);
        let step = decide(&seen(&task, idle3(), 0, later), &state, now_at(later));
        assert!(
            matches!(step, ScaleStep::Ask { ref pods, .. } if pods.len() == 3),
            "out of the window, the scale-in to zero goes on: {step:?}"
        );
    }

    /// A write of this process the watch does not show yet is what the task has (ADR 0032):
    /// a scale-up builds on it; anything else waits for the watch.
    #[test]
    fn a_write_the_watch_does_not_show_yet_stands() {
        let t = Instant::now();
        let task = task(0, 2);
        let written = ScaleWritten {
            shown_at: 3,
            replicas: 2,
        };
        let state = TaskScale {
            written: Some(Unwatched::new(written, t)),
            ..TaskScale::default()
        };
        assert_eq!(
            decide(&seen(&task, vec![], 5, t), &state, now_at(t)),
            ScaleStep::Scale { from: 2, to: 5 }
        );
        assert_eq!(
            decide(&seen(&task, vec![], 1, t), &state, now_at(t)),
            ScaleStep::Keep(2),
            "no scale-in from a write the watch does not show"
        );
        assert_eq!(
            decide(&seen(&task, vec![], 0, t), &state, now_at(t)),
            ScaleStep::Keep(2)
        );
    }

    /// Marks written this pass: the scale-in waits for the ReplicaSet to see them; a mark
    /// that could not be written holds it back too.
    #[test]
    fn a_scale_in_waits_for_its_marks() {
        let t = Instant::now();
        let task = task(2, 1);
        let mut state = TaskScale {
            costs_changed: Some(t - Duration::from_millis(300)),
            ..TaskScale::default()
        };
        let marked = vec![chosen(idle("a")), pod("b", 1, true, true)];
        assert_eq!(
            decide(&seen(&task, marked.clone(), 0, t), &state, now_at(t)),
            hold(2, Hold::CostsSettling(Duration::from_millis(300)))
        );
        state.costs_changed = Some(t - SCALE_IN_AFTER_COSTS);
        assert_eq!(
            decide(&seen(&task, marked, 0, t), &state, now_at(t)),
            ScaleStep::Scale { from: 2, to: 1 }
        );

        let mut failed = seen(&task, vec![idle("a"), pod("b", 1, true, true)], 0, t);
        failed.marks_failed = true;
        assert_eq!(
            decide(&failed, &state, now_at(t)),
            hold(2, Hold::MarksFailed)
        );
    }

    /// The pods a scale-in removes are asked again, twice at most, the second time once the
    /// queue read has settled; a pod that turns out busy is kept (ADR 0030, ADR 0033).
    #[test]
    fn a_scale_in_asks_the_pods_it_removes_until_they_confirm() {
        let t = Instant::now();
        let task = task(1, 1);
        let state = TaskScale::default();
        let mut seen = seen(&task, vec![], 0, t);
        seen.busy = vec![asked_before(idle("a"), seen.queue_read)];
        let read = seen.queue_read;
        assert_eq!(
            decide(&seen, &state, now_at(t)),
            ScaleStep::Ask {
                pods: vec![0],
                not_before: None
            }
        );
        seen.asks = 1;
        assert_eq!(
            decide(&seen, &state, now_at(t)),
            ScaleStep::Ask {
                pods: vec![0],
                not_before: Some(read + QUEUE_SETTLE)
            },
            "a poll from before the read may still be in flight"
        );
        seen.asks = 2;
        assert_eq!(
            decide(&seen, &state, now_at(t)),
            hold(1, Hold::PollsInFlight)
        );

        // The pod answers that it took an attempt just now: it stays.
        seen.busy[0].update(Figure {
            busy: 1,
            answered: true,
            at: Instant::now(),
            polls_counted_before: Some(Instant::now()),
            finished: None,
        });
        assert_eq!(decide(&seen, &state, now_at(t)), ScaleStep::Keep(1));
        // It answers idle, counting every poll since the read: it goes.
        seen.busy[0].update(Figure {
            busy: 0,
            answered: true,
            at: Instant::now(),
            polls_counted_before: Some(read),
            finished: None,
        });
        assert_eq!(
            decide(&seen, &state, now_at(t)),
            ScaleStep::Scale { from: 1, to: 0 }
        );
    }

    /// A pod the watch shows starting, or one the watch does not show yet after the
    /// operator's own scale-up, may have taken work no figure shows: the scale-in waits.
    #[test]
    fn a_scale_in_waits_for_pods_that_may_have_taken_work() {
        let t = Instant::now();
        let now = now_at(t);
        let task = task(1, 1);
        let state = TaskScale::default();
        let starting: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p-new", "namespace": "default"},
            "status": {"phase": "Pending",
                       "conditions": [{"type": "PodScheduled", "status": "True",
                                       "lastTransitionTime": now.time.to_string()}]},
        }))
        .unwrap();
        let mut with_starting = seen(&task, vec![], 0, t);
        with_starting.pods = vec![Arc::new(starting)];
        assert_eq!(
            decide(&with_starting, &state, now),
            hold(1, Hold::Starting("p-new".into()))
        );

        let up = ScaleDecision {
            time: MicroTime(now.time),
            from: 0,
            to: 1,
            reason: String::new(),
        };
        let scaled_up = TaskScale {
            decision: Some(Unwatched::new(up, t)),
            ..TaskScale::default()
        };
        assert_eq!(
            decide(&seen(&task, vec![], 0, t), &scaled_up, now),
            hold(1, Hold::PodsUnseen)
        );
        let later = Now {
            instant: t,
            time: now.time + STARTING_LIMIT,
        };
        assert_eq!(
            decide(&seen(&task, vec![], 0, t), &scaled_up, later),
            ScaleStep::Scale { from: 1, to: 0 },
            "not waited for longer than a pod takes to start"
        );
    }

    #[test]
    fn recommendations_clamp_to_the_bounds() {
        let spec = spec();
        assert_eq!(
            [0, 1, 4, 5, 400].map(|d| recommended(d, &spec)),
            [0, 1, 1, 2, 5]
        );
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
                pod.metadata.deletion_timestamp = Some(Time(now));
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
        // Not looked at by the scheduler yet, as a loaded watch may still show a pod whose
        // sidecar already polls: starting for a minute from its creation.
        let created = |ago: i64| {
            serde_json::from_value::<Pod>(json!({
                "metadata": {"name": "t-perago-new", "creationTimestamp": scheduled(ago)},
                "status": {"phase": "Pending"},
            }))
            .unwrap()
        };
        assert!(starting(&created(1), now), "unscheduled, just created");
        assert!(
            !starting(&created(61), now),
            "unscheduled for over a minute"
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
            pod.asked = observed - secs(30);
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
        pods[0].update(Figure {
            busy: 2,
            answered: true,
            at: now,
            polls_counted_before: Some(now),
            finished: None,
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
    fn holds_say_why_in_words() {
        let now = Instant::now();
        let settled = Some(now - SCALE_IN_AFTER_COSTS);
        let pods = [pod("idle", 0, true, false), pod("busy", 1, true, true)];
        assert_eq!(scale_in_waits(&pods, settled, now), None);
        assert_eq!(scale_in_waits(&pods, None, now), None);
        let fresh = Some(now - Duration::from_millis(300));
        assert_eq!(
            scale_in_waits(&pods, fresh, now)
                .map(|h| h.to_string())
                .as_deref(),
            Some("deletion costs changed 300 ms ago")
        );
        let pods = [pod("idle", 0, true, true), pod("new", 1, true, false)];
        assert_eq!(
            scale_in_waits(&pods, settled, now)
                .map(|h| h.to_string())
                .as_deref(),
            Some("busy pods not Ready yet: new")
        );
        assert_eq!(Hold::Starting("p".into()).to_string(), "pod p is starting");
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

    #[test]
    fn an_emptied_queue_wakes_its_task_once_after_the_window() {
        let yaml = "apiVersion: perago.io/v1alpha1\nkind: PeragoTask\nmetadata: {name: t}\nspec:\n  taskName: t\n  ownerEmail: a@b.c\n  paramsSchema: {type: object}\n  resultSchema: {type: object}\n  executor: {body: {image: b, command: [run]}}\n";
        let mut task = perago_api::manifest::parse(yaml).unwrap().remove(0).task;
        let t0 = Instant::now();
        let at = |s: u64| t0 + secs(s);
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
}
