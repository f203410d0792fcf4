//! The executor pods' busy slots (ADR 0030). The operator keeps a book of what each running
//! executor pod last answered on `/slots`, and a census keeps it: every pod is asked about once
//! per resync, spread over it, whatever the reconciles do. A reconcile reads the book and asks
//! only the pods it lacks; a scale-in asks again only the pods it is about to remove. So the
//! requests follow the pods and the clock, not the reconciles, and a scale-in costs requests in
//! proportion to the pods it removes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use perago_api::PeragoTask;

use crate::context::{Context, conductor_url};
use crate::render::TASK_LABEL;
use crate::scaling::BusyPod;
use crate::scope::Wake;
use perago_conductor::queue_name;

/// What a pod last said about its slots.
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
}

/// The figures of the running executor pods, by `namespace/name`.
#[derive(Default)]
pub struct Book(Mutex<HashMap<String, Figure>>);

impl Book {
    fn figures(&self) -> std::sync::MutexGuard<'_, HashMap<String, Figure>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get(&self, pod: &str) -> Option<Figure> {
        self.figures().get(pod).copied()
    }

    fn put(&self, pod: String, figure: Figure) {
        self.figures().insert(pod, figure);
    }

    fn forget(&self, pod: &str) {
        self.figures().remove(pod);
    }

    /// The pods whose figures the census renews now ([`due`], [`budget`]).
    fn due(&self, now: Instant, period: Duration) -> Vec<String> {
        let figures = self.figures();
        let ages = figures
            .iter()
            .map(|(pod, f)| (pod, now.saturating_duration_since(f.at)));
        due(ages, period, budget(figures.len(), period))
            .into_iter()
            .cloned()
            .collect()
    }
}

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

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// A running pod's IP; `None` for a pod not running yet, or going.
fn address(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let running =
        status.phase.as_deref() == Some("Running") && pod.metadata.deletion_timestamp.is_none();
    running.then(|| status.pod_ip.clone()).flatten()
}

/// Ask `pod` now how many of its `slots` are busy, and write the answer in the book. A pod that
/// does not answer counts as fully busy, so that a slow or unreachable sidecar never makes the
/// operator remove pods that may be working (ADR 0009). With `read`, the pod answers once every
/// poll it sent before that queue read has been answered (ADR 0033).
async fn ask(
    ctx: &Context,
    pod: String,
    ip: &str,
    slots: i64,
    purpose: Purpose,
    read: Option<Instant>,
) -> Figure {
    let url = format!("http://{ip}:{}/slots", ctx.slots_port);
    let answer = async {
        // Closed only when the process ends; a failed acquire is not an answer either.
        let _permit = ctx.probes.acquire().await;
        let sent = Instant::now();
        let mut request = ctx.pods_http.get(&url);
        if let Some(read) = read {
            // Rounded down: the pod counts polls from a little after the read, never before.
            let older_than = sent.saturating_duration_since(read).as_millis();
            request = request
                .query(&[("countPollsOlderThanMs", older_than)])
                .timeout(SETTLED_ASK_TIMEOUT);
        }
        let response = request.send().await?;
        let value = response
            .error_for_status()?
            .json::<serde_json::Value>()
            .await?;
        Ok::<_, reqwest::Error>((value, sent))
    };
    let figure = match answer.await {
        Ok((v, sent)) => Figure {
            busy: v["busy"].as_i64().unwrap_or(slots),
            answered: true,
            at: Instant::now(),
            polls_counted_before: v["pollsCountedOlderThanMs"]
                .as_u64()
                .and_then(|ms| sent.checked_sub(Duration::from_millis(ms))),
        },
        Err(e) => {
            tracing::debug!(%url, error = %perago_api::error_chain(&e), "a pod did not say how busy it is; counting it as busy");
            let at = Instant::now();
            // Fully busy is the most a poll could have added.
            Figure {
                busy: slots,
                answered: false,
                at,
                polls_counted_before: Some(at),
            }
        }
    };
    let outcome = if figure.answered {
        "answered"
    } else {
        "unanswered"
    };
    ctx.metrics
        .slot_probes
        .with_label_values(&[outcome, purpose.label()])
        .inc();
    ctx.slots.put(pod, figure);
    figure
}

/// How long a pod asked to count its polls may take to answer: the sidecar waits at most one
/// long poll (5 s at most, as Conductor allows) and 2 s more, and the client's second for the
/// answer comes on top.
const SETTLED_ASK_TIMEOUT: Duration = Duration::from_secs(8);

/// The task's running pods and their busy slots: from the book, asking only the pods it has no
/// figure of (new pods) or a figure older than two census periods (a census that fell behind).
pub async fn busy_pods(ctx: &Context, task: &PeragoTask, pods: &[Arc<Pod>]) -> Vec<BusyPod> {
    let slots = i64::from(task.spec.executor.slots);
    let running = pods.iter().filter_map(|pod| Some((pod, address(pod)?)));
    futures_util::future::join_all(running.map(|(pod, ip)| async move {
        let figure = match ctx.slots.get(&key(pod)) {
            Some(figure) if figure.at.elapsed() < 2 * ctx.resync => figure,
            _ => ask(ctx, key(pod), &ip, slots, Purpose::Reconcile, None).await,
        };
        BusyPod::new(ctx, pod, ip, figure)
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
    let slots = i64::from(task.spec.executor.slots);
    let ns = task.namespace().unwrap_or_else(|| "default".into());
    let asks = which.iter().filter_map(|&i| {
        let pod = pods.get(i)?;
        let (key, ip) = (format!("{ns}/{}", pod.name), pod.ip.clone());
        Some(async move {
            let figure = ask(ctx, key, &ip, slots, Purpose::ScaleIn, Some(read)).await;
            (i, figure)
        })
    });
    for (i, figure) in futures_util::future::join_all(asks).await {
        if let Some(pod) = pods.get_mut(i) {
            pod.update(figure);
        }
    }
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

/// A pod of the book that still runs: its IP and its task.
fn still_running(ctx: &Context, pod: &str) -> Option<(String, Arc<PeragoTask>)> {
    let (ns, name) = pod.split_once('/')?;
    let pod = ctx.owned.pods.get(&ObjectRef::new(name).within(ns))?;
    let ip = address(&pod)?;
    let task = pod.labels().get(TASK_LABEL)?;
    let task = ctx.tasks.get(&ObjectRef::new(task).within(ns))?;
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
        let due = ctx.slots.due(Instant::now(), ctx.resync);
        let asks = due.into_iter().map(|pod| {
            let ctx = &ctx;
            async move {
                let Some((ip, task)) = still_running(ctx, &pod) else {
                    ctx.slots.forget(&pod);
                    return None;
                };
                let before = ctx.slots.get(&pod);
                let slots = i64::from(task.spec.executor.slots);
                let after = ask(ctx, pod, &ip, slots, Purpose::Census, None).await;
                let went_idle = before.is_some_and(|b| b.busy > 0) && after.busy == 0;
                (went_idle && scale_in_may_follow(ctx, &task)).then(|| ObjectRef::from_obj(&*task))
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
