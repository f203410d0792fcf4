//! The executor pods' busy slots (ADR 0030). The scaler keeps a book of what each running
//! executor pod last answered on `/slots`, and the census keeps it: every pod is asked about
//! once per resync, spread over it, whatever the reconciles do. A reconcile reads the book and
//! asks only the pods it lacks; a scale-in asks again only the pods it is about to remove. So
//! the requests follow the pods and the clock, not the reconciles, and a scale-in costs
//! requests in proportion to the pods it removes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use perago_api::PeragoTask;

use crate::context::{Context, conductor_url};
use crate::render::TASK_LABEL;
use crate::scaler::{BusyPod, DELETION_COST, Figure};
use crate::scope::Wake;
use perago_conductor::queue_name;

/// Why a pod is asked: the `purpose` of `perago_operator_slot_probes_total`.
#[derive(Clone, Copy)]
enum Purpose {
    /// The census renews a figure.
    Census,
    /// A reconcile found a pod the book has no figure of.
    Reconcile,
    /// A scale-in asks again a pod it would remove.
    ScaleIn,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Self::Census => "census",
            Self::Reconcile => "reconcile",
            Self::ScaleIn => "scale-in",
        }
    }
}

/// How often the census looks for pods to ask.
const CENSUS_TICK: Duration = Duration::from_secs(1);

/// A running pod's IP; `None` for a pod not running yet, or going.
fn address(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let running =
        status.phase.as_deref() == Some("Running") && pod.metadata.deletion_timestamp.is_none();
    running.then(|| status.pod_ip.clone()).flatten()
}

/// Ask `pod` of `task` ([`crate::slots::SlotsClient::ask`]), count the ask, and write the
/// answer in the book.
async fn ask(
    ctx: &Context,
    task: &PeragoTask,
    pod: &str,
    ip: &str,
    purpose: Purpose,
    read: Option<Instant>,
) -> Figure {
    let slots = i64::from(task.spec.executor.slots);
    let figure = ctx.pods.ask(ip, slots, read).await;
    let outcome = if figure.answered {
        "answered"
    } else {
        "unanswered"
    };
    ctx.metrics
        .slot_probes
        .with_label_values(&[outcome, purpose.label()])
        .inc();
    ctx.scaler
        .put_figure(&ObjectRef::from_obj(task), pod, figure);
    figure
}

/// The task's running pods and their busy slots: from the book, asking only the pods it has no
/// figure of (new pods) or a figure older than two census periods (a census that fell behind).
pub async fn busy_pods(ctx: &Context, task: &PeragoTask, pods: &[Arc<Pod>]) -> Vec<BusyPod> {
    let key = ObjectRef::from_obj(task);
    let running = pods.iter().filter_map(|pod| Some((pod, address(pod)?)));
    futures_util::future::join_all(running.map(|(pod, ip)| {
        let key = &key;
        async move {
            let name = pod.name_any();
            let figure = match ctx.scaler.figure(key, &name) {
                Some(figure) if figure.at.elapsed() < 2 * ctx.resync => figure,
                _ => ask(ctx, task, &name, &ip, Purpose::Reconcile, None).await,
            };
            let cached = pod.annotations().get(DELETION_COST).map(String::as_str);
            let cost = ctx.scaler.cost(key, &name, cached, Instant::now());
            BusyPod::new(pod, ip, figure, cost)
        }
    }))
    .await
}

/// Ask the pods `which` of `pods` again, now, to count every task their polls took before the
/// queue `read`, and update them with their answers.
pub async fn ask_again(
    ctx: &Context,
    task: &PeragoTask,
    pods: &mut [BusyPod],
    which: &[usize],
    read: Instant,
) {
    let asks = which.iter().filter_map(|&i| {
        let pod = pods.get(i)?;
        let (name, ip) = (pod.name.clone(), pod.ip.clone());
        Some(async move {
            let figure = ask(ctx, task, &name, &ip, Purpose::ScaleIn, Some(read)).await;
            (i, figure)
        })
    });
    for (i, figure) in futures_util::future::join_all(asks).await {
        if let Some(pod) = pods.get_mut(i) {
            pod.update(figure);
        }
    }
}

/// Ask `pods` (a canary's) again when their figures are older than `max_age`: a canary's
/// analysis reads their finished attempts, and should see failures within seconds, not once a
/// resync (ADR 0044).
pub async fn ask_canary(ctx: &Context, task: &PeragoTask, pods: &[Arc<Pod>], max_age: Duration) {
    let key = ObjectRef::from_obj(task);
    let asks = pods.iter().filter_map(|pod| {
        let ip = address(pod)?;
        let name = pod.name_any();
        let fresh = (ctx.scaler.figure(&key, &name)).is_some_and(|f| f.at.elapsed() < max_age);
        (!fresh).then_some(async move {
            ask(ctx, task, &name, &ip, Purpose::Reconcile, None).await;
        })
    });
    futures_util::future::join_all(asks).await;
}

/// The figures the census renews in one tick: those at least `period` old, oldest first; at
/// most `budget`.
fn due<K>(
    ages: impl IntoIterator<Item = (K, Duration)>,
    period: Duration,
    budget: usize,
) -> Vec<K> {
    let mut due: Vec<(K, Duration)> = ages.into_iter().filter(|(_, age)| *age >= period).collect();
    due.sort_by_key(|(_, age)| std::cmp::Reverse(*age));
    due.truncate(budget);
    due.into_iter().map(|(key, _)| key).collect()
}

/// Asks per tick so that `pods` figures are each renewed once per `period`: twice the even
/// share, so that figures that all came due at once (a term's first reconciles ask every pod)
/// spread out within a period.
fn budget(pods: usize, period: Duration) -> usize {
    let ticks = (period.as_secs_f64() / CENSUS_TICK.as_secs_f64()).max(1.0);
    ((2 * pods) as f64 / ticks).ceil() as usize
}

/// Whether a pod of `task` going idle may let it scale in: autoscaled, above its minimum, and
/// its queue read empty lately.
fn scale_in_may_follow(ctx: &Context, task: &PeragoTask) -> bool {
    let Some(auto) = &task.spec.executor.autoscaling else {
        return false;
    };
    let queue = queue_name(&task.spec.task_name, task.spec.domain());
    task.spec.executor.replicas > auto.min_replicas
        && ctx
            .queues
            .fresh(&conductor_url(task, ctx), &queue)
            .is_some_and(|(size, _)| size == 0)
}

/// Pod `name` of `task`, while both still run: the pod's IP and the task.
fn still_running(
    ctx: &Context,
    task: &ObjectRef<PeragoTask>,
    name: &str,
) -> Option<(String, Arc<PeragoTask>)> {
    let ns = task.namespace.as_deref()?;
    let pod = ctx.owned.pods.get(&ObjectRef::new(name).within(ns))?;
    let ip = address(&pod)?;
    (pod.labels().get(TASK_LABEL) == Some(&task.name)).then_some(())?;
    let task = ctx.tasks.get(task)?;
    task.metadata
        .deletion_timestamp
        .is_none()
        .then_some((ip, task))
}

/// The census, for one leadership term: every [`CENSUS_TICK`], ask again the pods whose
/// figures are due (new pods get theirs from the reconcile that first sees them running), and
/// forget those that no longer run. A task whose pod went idle is woken when a scale-in may
/// follow, so that the scale-in does not wait for the task's resync. A tick reads the book,
/// not every pod: its cost follows the pods it asks.
pub async fn census(ctx: Arc<Context>, wake: Wake) {
    let mut ticker = tokio::time::interval(CENSUS_TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticker.tick().await;
        if ctx.owned.ready().await.is_err() {
            return;
        }
        let ages = ctx.scaler.figure_ages(Instant::now());
        let budget = budget(ages.len(), ctx.resync);
        let asks = due(ages, ctx.resync, budget)
            .into_iter()
            .map(|(task, pod)| {
                let ctx = &ctx;
                async move {
                    let Some((ip, spec)) = still_running(ctx, &task, &pod) else {
                        ctx.scaler.forget_figure(&task, &pod);
                        return None;
                    };
                    let before = ctx.scaler.figure(&task, &pod);
                    let after = ask(ctx, &spec, &pod, &ip, Purpose::Census, None).await;
                    let went_idle = before.is_some_and(|b| b.busy > 0) && after.busy == 0;
                    (went_idle && scale_in_may_follow(ctx, &spec)).then_some(task)
                }
            });
        for task in futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
        {
            wake.wake(task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_census_renews_the_oldest_figures_due() {
        let period = Duration::from_secs(60);
        let ages = [
            (0, secs(10)),
            (2, secs(90)),
            (3, secs(60)),
            (5, secs(59)),
            (6, secs(61)),
        ];
        assert_eq!(due(ages, period, 10), [2, 6, 3], "0 and 5 are not due");
        assert_eq!(due(ages, period, 2), [2, 6], "at most the budget");
        assert!(due([(0, secs(1))], period, 10).is_empty());
    }

    #[test]
    fn the_census_budget_renews_every_figure_within_a_period() {
        let minute = Duration::from_secs(60);
        assert_eq!(budget(0, minute), 0);
        assert_eq!(budget(1, minute), 1);
        assert_eq!(budget(5_000, minute), 167, "twice 5,000 pods over 60 ticks");
        assert_eq!(
            budget(3, Duration::from_millis(500)),
            6,
            "a period under a tick"
        );
    }
}
