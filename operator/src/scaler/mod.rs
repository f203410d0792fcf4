//! The scaler's state: one [`TaskScale`] per autoscaled task, owned by the [`Scaler`] and
//! removed as one unit ([`Scaler::forget`]). The decisions made from it are pure
//! ([`decide`]); the reconcile applies them (`crate::scaling`), the census keeps the busy
//! figures (`crate::census`), the queue watch the drains. ADR 0034 says why it is shaped so.

pub mod decide;

use perago_api::rollout::CanaryAttempts;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;

use perago_api::PeragoTask;
use perago_api::task::ScaleDecision;

pub use decide::{BusyPod, Hold, Now, Observed, ScaleStep};

/// The annotation the ReplicaSet controller ranks pods by on a scale-in (ADR 0027).
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// How long a write of this process outranks what the watches show of it ([`Unwatched`]).
/// Under load the watches show the operator's own writes seconds late; after this long, the
/// watch is believed.
pub const OWN_WRITE_TRUSTED: Duration = Duration::from_secs(30);

/// A write of this process that the watches may not show yet. A decision made from the
/// watched object alone would undo it or make it again: a scale-in decided from the older
/// replicas, a deletion cost written twice, an older `lastScale` written back. It stands until
/// the watch shows it, or for [`OWN_WRITE_TRUSTED`] at most.
#[derive(Clone, Debug)]
pub struct Unwatched<T> {
    value: T,
    at: Instant,
}

impl<T> Unwatched<T> {
    pub fn new(value: T, at: Instant) -> Self {
        Self { value, at }
    }

    /// The write, while it is recent and `shown` says the watch does not show it yet.
    pub fn standing(&self, now: Instant, shown: impl FnOnce(&T) -> bool) -> Option<&T> {
        let recent = now.saturating_duration_since(self.at) <= OWN_WRITE_TRUSTED;
        (recent && !shown(&self.value)).then_some(&self.value)
    }
}

/// The standing write of `slot` ([`Unwatched::standing`]); the slot is emptied once it no
/// longer stands, so that a later read does not look at it again.
fn standing<T: Clone>(
    slot: &mut Option<Unwatched<T>>,
    now: Instant,
    shown: impl FnOnce(&T) -> bool,
) -> Option<T> {
    let value = slot.as_ref()?.standing(now, shown).cloned();
    if value.is_none() {
        *slot = None;
    }
    value
}

/// A `/scale` write of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleWritten {
    /// The task's generation once the watch shows this write: one more than the generation
    /// the decision was made on, or than the write before it that the watch did not show yet.
    pub shown_at: i64,
    pub replicas: i32,
}

impl ScaleWritten {
    /// Whether the watched task at `generation` shows this write. A task without a
    /// generation (never from the API server) is taken as showing it.
    fn shown_by(&self, generation: Option<i64>) -> bool {
        generation.is_none_or(|g| g >= self.shown_at)
    }
}

/// What one executor pod last said about its slots (`/slots`, ADR 0030).
#[derive(Clone, Copy, Debug)]
pub struct Figure {
    /// Attempts running; a pod that did not answer counts as fully busy.
    pub busy: i64,
    pub answered: bool,
    /// When it was asked.
    pub at: Instant,
    /// Every task a poll sent before this instant brought is counted in `busy`, as the pod
    /// said (ADR 0033). `None`: the pod did not say (a sidecar older than the operator).
    pub polls_counted_before: Option<Instant>,
    /// The pod's finished attempts by verdict, for a canary's analysis (ADR 0044); `None`
    /// from a pod that did not answer or a sidecar older than the operator.
    pub finished: Option<perago_api::rollout::CanaryAttempts>,
}

/// Since when a task's queue has been empty, and whether the queue watch has woken the task
/// for it (ADR 0028).
#[derive(Clone, Debug, Default)]
pub struct Drain {
    since: Option<Instant>,
    woken: bool,
}

/// Everything the scaler keeps of one task between reconciles.
#[derive(Clone, Debug, Default)]
pub struct TaskScale {
    /// Replica recommendations of the scale-down window (ADR 0009), oldest first.
    history: Vec<(Instant, i32)>,
    /// This process's last `/scale` write.
    written: Option<Unwatched<ScaleWritten>>,
    /// This process's last decision, for `status.lastScale`.
    decision: Option<Unwatched<ScaleDecision>>,
    /// When this process last changed a deletion cost of the task's pods.
    costs_changed: Option<Instant>,
    /// The deletion costs this process wrote, by pod name (`None`: removed).
    marks: HashMap<String, Unwatched<Option<String>>>,
    /// The busy figures of the task's running pods, by pod name: the census's book.
    figures: HashMap<String, Figure>,
    drain: Drain,
    /// The canary's finished attempts by pod, for the revision it runs (ADR 0044): each pod's
    /// largest figure, kept after the pod goes.
    canary: Option<(String, HashMap<String, CanaryAttempts>)>,
}

impl TaskScale {
    /// The replicas this process last wrote, while the watched task at `generation` does not
    /// show the write yet. Under load the watch shows the operator's own writes seconds late;
    /// deciding again from the older replicas would scale in again, or hold a scale-up back
    /// until the watch caught up (up to 20 s in a wave, docs/scale.md).
    pub fn scale_written(&self, generation: Option<i64>, now: Instant) -> Option<i32> {
        let written = self.written.as_ref()?;
        (written.standing(now, |w| w.shown_by(generation))).map(|w| w.replicas)
    }

    /// The task's last scale decision: this process's while the watched one (`shown`) is
    /// older, else the watched one.
    pub fn last_scale(&self, shown: Option<&ScaleDecision>, now: Instant) -> Option<ScaleDecision> {
        let own = self.decision.as_ref();
        own.and_then(|d| d.standing(now, |d| shows(shown, d)))
            .or(shown)
            .cloned()
    }

    /// The highest recommendation of the window before `at` and `wanted` itself, as the
    /// HPA stabilises: up at once, down only to that highest, never above `current`.
    pub fn stabilised(&self, at: Instant, window: Duration, current: i32, wanted: i32) -> i32 {
        if wanted >= current {
            return wanted;
        }
        let recent = self
            .history
            .iter()
            .filter(|(t, _)| at.saturating_duration_since(*t) <= window)
            .map(|(_, r)| *r);
        recent.fold(wanted, i32::max).min(current)
    }

    pub fn costs_changed(&self) -> Option<Instant> {
        self.costs_changed
    }

    fn record(&mut self, at: Instant, window: Duration, wanted: i32) {
        self.history
            .retain(|(t, _)| at.saturating_duration_since(*t) <= window);
        self.history.push((at, wanted));
    }
}

/// Whether the watched decision `shown` is `own` or newer (the status keeps microseconds).
fn shows(shown: Option<&ScaleDecision>, own: &ScaleDecision) -> bool {
    let micros = |d: &ScaleDecision| d.time.0.as_microsecond();
    shown.is_some_and(|s| micros(s) >= micros(own))
}

/// The scaler's state of every task, behind one lock taken only for moments: reconciles of
/// different tasks, the census and the queue watch all read and write it, and none holds it
/// across an await.
#[derive(Default)]
pub struct Scaler(Mutex<HashMap<ObjectRef<PeragoTask>, TaskScale>>);

impl Scaler {
    /// `f` on the task's state, made empty when the task has none.
    fn with<R>(&self, task: &ObjectRef<PeragoTask>, f: impl FnOnce(&mut TaskScale) -> R) -> R {
        f(self.0.lock().entry(task.clone()).or_default())
    }

    /// The next step of the scale of `seen`'s task ([`decide::decide`]).
    pub fn decide(&self, seen: &Observed, now: Now) -> ScaleStep {
        let task = ObjectRef::from_obj(&*seen.task);
        self.with(&task, |state| decide::decide(seen, state, now))
    }

    /// The pass `seen` ends: its recommendation joins the window.
    pub fn record(&self, seen: &Observed) {
        let Some(auto) = &seen.task.spec.executor.autoscaling else {
            return;
        };
        let (window, wanted) = (decide::window(auto), seen.wanted(auto));
        let task = ObjectRef::from_obj(&*seen.task);
        self.with(&task, |state| state.record(seen.observed, window, wanted));
    }

    /// This process wrote `replicas` through the `/scale` of `task` at `generation`, as the
    /// watch showed it: on top of its own last write when the watch does not show that one.
    pub fn wrote_scale(
        &self,
        task: &ObjectRef<PeragoTask>,
        generation: Option<i64>,
        replicas: i32,
        now: Instant,
    ) {
        let Some(generation) = generation else {
            return;
        };
        self.with(task, |state| {
            let base = (state.written.as_ref())
                .and_then(|w| w.standing(now, |w| w.shown_by(Some(generation))))
                .map_or(generation, |w| w.shown_at);
            let written = ScaleWritten {
                shown_at: base + 1,
                replicas,
            };
            state.written = Some(Unwatched::new(written, now));
        });
    }

    /// The replicas this process last wrote for `task` at `generation`, while the watch does
    /// not show the write yet ([`TaskScale::scale_written`]).
    pub fn scale_written(
        &self,
        task: &ObjectRef<PeragoTask>,
        generation: Option<i64>,
        now: Instant,
    ) -> Option<i32> {
        self.with(task, |state| {
            standing(&mut state.written, now, |w| w.shown_by(generation)).map(|w| w.replicas)
        })
    }

    /// This process decided `decision` for `task`: `status.lastScale` carries it from now on.
    pub fn decided(&self, task: &ObjectRef<PeragoTask>, decision: ScaleDecision, now: Instant) {
        self.with(task, |state| {
            state.decision = Some(Unwatched::new(decision, now));
        });
    }

    /// `status.lastScale` of `task`, whose watched one is `shown`: this process's last
    /// decision while the watch does not show it yet. The status is written from the watched
    /// task; writing its older decision back would undo the newer one.
    pub fn last_scale(
        &self,
        task: &ObjectRef<PeragoTask>,
        shown: Option<&ScaleDecision>,
        now: Instant,
    ) -> Option<ScaleDecision> {
        self.with(task, |state| {
            standing(&mut state.decision, now, |own| shows(shown, own)).or_else(|| shown.cloned())
        })
    }

    /// This process set the deletion cost of `pod` of `task` to `cost` (`None`: removed).
    pub fn marked(
        &self,
        task: &ObjectRef<PeragoTask>,
        pod: &str,
        cost: Option<String>,
        now: Instant,
    ) {
        self.with(task, |state| {
            // Marks of pods gone since (a scale-in removes them) are never read again.
            state
                .marks
                .retain(|_, mark| mark.standing(now, |_| false).is_some());
            state
                .marks
                .insert(pod.to_owned(), Unwatched::new(cost, now));
            state.costs_changed = Some(now);
        });
    }

    /// The deletion cost of `pod` of `task`: the one this process last wrote while the
    /// watched annotation `cached` does not show it yet, else `cached`.
    pub fn cost(
        &self,
        task: &ObjectRef<PeragoTask>,
        pod: &str,
        cached: Option<&str>,
        now: Instant,
    ) -> Option<String> {
        self.with(task, |state| {
            let own = (state.marks.get(pod)).and_then(|mark| {
                mark.standing(now, |cost| cost.as_deref() == cached)
                    .cloned()
            });
            if own.is_none() {
                state.marks.remove(pod);
            }
            own.unwrap_or_else(|| cached.map(str::to_owned))
        })
    }

    pub fn figure(&self, task: &ObjectRef<PeragoTask>, pod: &str) -> Option<Figure> {
        self.0.lock().get(task)?.figures.get(pod).copied()
    }

    pub fn put_figure(&self, task: &ObjectRef<PeragoTask>, pod: &str, figure: Figure) {
        self.with(task, |state| state.figures.insert(pod.to_owned(), figure));
    }

    /// The finished attempts of the canary of `revision`: `pods` (its pods now) as the book
    /// last heard them, added to what its pods that went last said. Counts only grow: a
    /// sidecar that restarted counts from zero again, and what it said before stands.
    pub fn canary_attempts(
        &self,
        task: &ObjectRef<PeragoTask>,
        revision: &str,
        pods: &[String],
    ) -> CanaryAttempts {
        self.with(task, |state| {
            if state.canary.as_ref().is_none_or(|(r, _)| r != revision) {
                state.canary = Some((revision.to_owned(), HashMap::new()));
            }
            let figures = &state.figures;
            let Some((_, tally)) = state.canary.as_mut() else {
                return CanaryAttempts::default();
            };
            for pod in pods {
                if let Some(now) = figures.get(pod).and_then(|f| f.finished) {
                    let kept = tally.entry(pod.clone()).or_default();
                    *kept = kept.max(now);
                }
            }
            tally
                .values()
                .fold(CanaryAttempts::default(), |sum, a| sum + *a)
        })
    }

    pub fn forget_figure(&self, task: &ObjectRef<PeragoTask>, pod: &str) {
        if let Some(state) = self.0.lock().get_mut(task) {
            state.figures.remove(pod);
        }
    }

    /// Every figure with its task and pod, and how old it is at `now`: for the census.
    pub fn figure_ages(&self, now: Instant) -> Vec<((ObjectRef<PeragoTask>, String), Duration)> {
        let all = self.0.lock();
        let figures = all.iter().flat_map(|(task, state)| {
            state.figures.iter().map(move |(pod, figure)| {
                let age = now.saturating_duration_since(figure.at);
                ((task.clone(), pod.clone()), age)
            })
        });
        figures.collect()
    }

    /// Whether an empty queue should wake `task` for a scale-in (ADR 0028): autoscaled, above
    /// its minimum, and its queue empty for its whole scale-down window; once each time the
    /// queue empties. A queue that keeps refilling never stays empty that long.
    pub fn drained(&self, task: &PeragoTask, queued: i64, now: Instant) -> bool {
        self.with(&ObjectRef::from_obj(task), |state| {
            decide::drained(task, queued, &mut state.drain, now)
        })
    }

    /// A deleted task's state goes with it, as one unit.
    pub fn forget(&self, task: &ObjectRef<PeragoTask>) {
        self.0.lock().remove(task);
    }

    /// Only the state of `tasks` is kept: that of tasks gone without a cleanup of their own
    /// (their finalizer removed by hand, or deleted under another leader) goes too.
    pub fn retain(&self, tasks: &HashSet<ObjectRef<PeragoTask>>) {
        self.0.lock().retain(|task, _| tasks.contains(task));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    fn task() -> ObjectRef<PeragoTask> {
        ObjectRef::new("t").within("ns")
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_scale_written_stands_until_the_watched_task_shows_it() {
        let scaler = Scaler::default();
        let now = Instant::now();
        let written = |generation| scaler.scale_written(&task(), Some(generation), now);
        assert_eq!(written(3), None, "nothing written");
        scaler.wrote_scale(&task(), Some(3), 0, now);
        assert_eq!(
            written(3),
            Some(0),
            "the watch still shows the generation the write was decided on"
        );
        assert_eq!(written(4), None, "the watch caught up");
        assert_eq!(written(3), None, "forgotten once caught up");

        // A scale-up on top of a write the watch does not show yet (generation 3 → 4 → 5).
        scaler.wrote_scale(&task(), Some(3), 1, now);
        scaler.wrote_scale(&task(), Some(3), 5, now);
        assert_eq!(written(3), Some(5), "neither write shown");
        assert_eq!(written(4), Some(5), "the watch shows the first write only");
        assert_eq!(written(5), None, "both shown");

        scaler.wrote_scale(&task(), Some(3), 2, now);
        let later = now + OWN_WRITE_TRUSTED + secs(1);
        assert_eq!(
            scaler.scale_written(&task(), Some(3), later),
            None,
            "the watch is believed after a while"
        );
    }

    fn decision(from: i32, to: i32) -> ScaleDecision {
        ScaleDecision {
            time: MicroTime(Timestamp::now()),
            from,
            to,
            reason: String::new(),
        }
    }

    /// The status carries the operator's last decision until the watched task shows it, and
    /// never an older one the watch still shows; once shown, the watched one is the truth.
    #[test]
    fn the_last_decision_stands_until_the_watched_status_shows_it() {
        let scaler = Scaler::default();
        let now = Instant::now();
        assert!(scaler.last_scale(&task(), None, now).is_none());
        let older = decision(0, 1);
        assert_eq!(
            scaler.last_scale(&task(), Some(&older), now),
            Some(older.clone()),
            "the watched one"
        );
        let newer = decision(1, 2);
        scaler.decided(&task(), newer.clone(), now);
        assert_eq!(
            scaler.last_scale(&task(), Some(&older), now),
            Some(newer.clone()),
            "not the older one"
        );
        // The status round-trips through the API server at microseconds.
        let mut shown = newer.clone();
        shown.time.0 = Timestamp::from_microsecond(newer.time.0.as_microsecond()).unwrap();
        assert_eq!(
            scaler.last_scale(&task(), Some(&shown), now),
            Some(shown.clone())
        );
        assert_eq!(
            scaler.last_scale(&task(), Some(&older), now),
            Some(older),
            "forgotten once shown: the watch is the truth again"
        );
    }

    /// Scale up at once; down only to the highest recommendation of the window, as the HPA.
    #[test]
    fn recommendations_stabilise_over_the_window() {
        let mut state = TaskScale::default();
        let t0 = Instant::now();
        let w = secs(60);
        let at = |s| t0 + secs(s);
        assert_eq!(state.stabilised(at(0), w, 1, 4), 4, "up at once");
        state.record(at(0), w, 4);
        assert_eq!(state.stabilised(at(10), w, 4, 0), 4, "down waits");
        state.record(at(10), w, 0);
        state.record(at(30), w, 1);
        assert_eq!(
            state.stabilised(at(65), w, 4, 0),
            1,
            "to the window's highest"
        );
        state.record(at(65), w, 0);
        assert_eq!(state.stabilised(at(100), w, 1, 0), 0);
        assert_eq!(
            state.history.len(),
            3,
            "the window keeps only its own: 10, 30, 65 s"
        );
    }

    /// A deletion cost this process wrote counts while the cache of pods lags, and no longer
    /// once the cache shows it: then changes by others count.
    #[test]
    fn a_cost_it_wrote_stands_while_the_cache_lags() {
        let scaler = Scaler::default();
        let now = Instant::now();
        scaler.marked(&task(), "b", Some("-1".into()), now);
        assert_eq!(scaler.cost(&task(), "b", None, now).as_deref(), Some("-1"));
        assert_eq!(scaler.cost(&task(), "a", None, now), None, "another pod");
        assert_eq!(
            scaler.cost(&task(), "b", Some("-1"), now).as_deref(),
            Some("-1")
        );
        assert_eq!(
            scaler.cost(&task(), "b", None, now),
            None,
            "shown, then changed"
        );
        scaler.marked(&task(), "c", None, now);
        assert_eq!(
            scaler.cost(&task(), "c", Some("-1"), now),
            None,
            "a removal counts too"
        );
        assert_eq!(
            scaler
                .cost(&task(), "c", Some("-1"), now + OWN_WRITE_TRUSTED + secs(1))
                .as_deref(),
            Some("-1"),
            "the cache is believed after a while"
        );
    }

    /// Forgetting a task drops all it had, and nothing of another task.
    #[test]
    fn a_canarys_attempts_keep_what_its_pods_said_before_they_went() {
        use perago_api::rollout::CanaryAttempts;
        let scaler = Scaler::default();
        let said = |pod: &str, completed, failed| {
            let figure = Figure {
                busy: 0,
                answered: true,
                at: Instant::now(),
                polls_counted_before: None,
                finished: Some(CanaryAttempts {
                    completed,
                    failed,
                    not_judged: 0,
                }),
            };
            scaler.put_figure(&task(), pod, figure);
        };
        let pods = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        said("a", 2, 1);
        said("b", 1, 0);
        let sum = scaler.canary_attempts(&task(), "r1", &pods(&["a", "b"]));
        assert_eq!((sum.completed, sum.failed), (3, 1));
        // `a` went; `b` restarted its sidecar and counts from zero again.
        scaler.forget_figure(&task(), "a");
        said("b", 0, 1);
        let sum = scaler.canary_attempts(&task(), "r1", &pods(&["b"]));
        assert_eq!(
            (sum.completed, sum.failed),
            (3, 2),
            "the largest figure of each pod"
        );
        // Another revision starts from nothing.
        let sum = scaler.canary_attempts(&task(), "r2", &pods(&[]));
        assert_eq!(sum, CanaryAttempts::default());
    }

    #[test]
    fn a_task_is_forgotten_as_one_unit() {
        let scaler = Scaler::default();
        let now = Instant::now();
        let other = ObjectRef::new("u").within("ns");
        let figure = Figure {
            busy: 1,
            answered: true,
            at: now,
            polls_counted_before: None,
            finished: None,
        };
        for task in [task(), other.clone()] {
            scaler.wrote_scale(&task, Some(1), 3, now);
            scaler.decided(&task, decision(1, 3), now);
            scaler.marked(&task, "p", Some("-1".into()), now);
            scaler.put_figure(&task, "p", figure);
        }
        scaler.forget(&task());
        assert_eq!(scaler.figure_ages(now).len(), 1);
        assert!(scaler.figure(&task(), "p").is_none());
        assert_eq!(scaler.scale_written(&task(), Some(1), now), None);
        assert_eq!(scaler.cost(&task(), "p", None, now), None);
        assert!(scaler.last_scale(&task(), None, now).is_none());
        assert_eq!(scaler.scale_written(&other, Some(1), now), Some(3));
        assert!(scaler.figure(&other, "p").is_some());

        scaler.retain(&HashSet::new());
        assert!(
            scaler.figure_ages(now).is_empty(),
            "tasks gone from the watch"
        );
    }
}
