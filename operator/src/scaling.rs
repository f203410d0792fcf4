//! Autoscaling's I/O: the queue watch that starts pods within seconds of work arriving
//! instead of at the task's next resync (ADR 0010), the queue read of a reconcile, and the
//! applier that carries out the scaler's steps ([`crate::scaler::decide`]): deletion costs
//! written, pods asked again, the `/scale` written with its event and `status.lastScale`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, debug, info, warn};

use perago_api::PeragoTask;

use crate::conductor::ConductorError;
use crate::context::{Context, Error, conductor_url};
use crate::scaler::decide::{self, Mark};
use crate::scaler::{DELETION_COST, Now, Observed, ScaleStep};
use perago_conductor::queue_name;

/// What a scale came to in one reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scaled {
    /// The replicas of this pass.
    pub replicas: i32,
    /// A scale-in waits: look again [`SCALE_IN_AFTER_COSTS`] from now.
    pub held: bool,
    /// The direction of the `/scale` write this pass made, if it made one.
    pub wrote: Option<&'static str>,
}

impl Scaled {
    /// A suspended task's pass: no pods, and no decision of the scaler.
    pub fn suspended() -> Self {
        Self {
            replicas: 0,
            held: false,
            wrote: None,
        }
    }
}

#[cfg(test)]
impl Scaled {
    /// The replicas and whether the scale-in waits.
    fn pair(self) -> (i32, bool) {
        (self.replicas, self.held)
    }
}

/// The most steps one pass takes: a mark, two asks and their outcome. More means a step that
/// does not change what the next decision sees; the scale-in then waits for a later pass.
const STEPS_PER_PASS: usize = 6;

/// The replicas of this pass: the spec's (which an HPA or KEDA may drive through /scale), or
/// for an autoscaled task the scaler's, reached by carrying out its steps one after another
/// ([`crate::scaler::decide::decide`]); a scale is written through /scale with an event and
/// `status.lastScale`.
pub async fn scale(
    ctx: &Context,
    api: &Api<PeragoTask>,
    seen: &mut Observed,
) -> Result<Scaled, Error> {
    let task = seen.task.clone();
    let key = ObjectRef::from_obj(&*task);
    let done = |replicas, held| Scaled {
        replicas,
        held,
        wrote: None,
    };
    for _ in 0..STEPS_PER_PASS {
        let now = Now::read();
        match ctx.scaler.decide(seen, now) {
            ScaleStep::Keep(replicas) => {
                ctx.scaler.record(seen);
                return Ok(done(replicas, false));
            }
            ScaleStep::Hold { replicas, why } => {
                debug!(task = %task.name_any(), from = replicas, %why, "the scale-in waits");
                ctx.scaler.record(seen);
                return Ok(done(replicas, true));
            }
            ScaleStep::Mark(marks) => {
                let ns = task.namespace().unwrap_or_else(|| "default".into());
                info!(
                    task = %task.name_any(),
                    marks = %describe_marks(&marks),
                    figures = %describe_figures(&seen.busy, now.instant),
                    "marking the pods a scale-in removes"
                );
                for (mark, written) in write_marks(ctx, &ns, marks).await {
                    if !written {
                        seen.marks_failed = true;
                        continue;
                    }
                    let cost = mark.cost.map(str::to_owned);
                    ctx.scaler
                        .marked(&key, &mark.pod, cost.clone(), now.instant);
                    if let Some(p) = seen.busy.iter_mut().find(|p| p.name == mark.pod) {
                        p.cost = cost;
                    }
                }
            }
            ScaleStep::Ask { pods, not_before } => {
                if let Some(at) = not_before {
                    tokio::time::sleep_until(at.into()).await;
                }
                let read = seen.queue_read;
                crate::census::ask_again(ctx, &task, &mut seen.busy, &pods, read).await;
                seen.asks += 1;
            }
            ScaleStep::Scale { from, to } => {
                ctx.scaler.record(seen);
                write_scale(ctx, api, seen, from, to, now).await?;
                let direction = if to > from { "up" } else { "down" };
                return Ok(Scaled {
                    replicas: to,
                    held: false,
                    wrote: Some(direction),
                });
            }
        }
    }
    let replicas = ctx
        .scaler
        .scale_written(&key, task.metadata.generation, Instant::now())
        .unwrap_or(task.spec.executor.replicas);
    warn!(task = %task.name_any(), "the scale took more steps than a pass allows; it waits");
    Ok(done(replicas, true))
}

/// `pod=-1 other=removed`: the deletion costs a scale-in writes, for its log line.
fn describe_marks(marks: &[Mark]) -> String {
    let cost = |m: &Mark| m.cost.unwrap_or("removed");
    let marks = marks.iter().map(|m| format!("{}={}", m.pod, cost(m)));
    marks.collect::<Vec<_>>().join(" ")
}

/// `pod=busy/age` for the running pods, the first [`FIGURES_LOGGED`] of them: the figures a
/// scale-in chose by, for its log line.
fn describe_figures(pods: &[decide::BusyPod], now: Instant) -> String {
    let figure = |p: &decide::BusyPod| {
        let age = now.saturating_duration_since(p.asked).as_millis();
        let answered = if p.answered { "" } else { " unanswered" };
        format!("{}={}/{age}ms{answered}", p.name, p.busy)
    };
    let mut text: Vec<String> = pods.iter().take(FIGURES_LOGGED).map(figure).collect();
    if pods.len() > FIGURES_LOGGED {
        text.push(format!("and {} more", pods.len() - FIGURES_LOGGED));
    }
    text.join(" ")
}

/// The most pods whose figures one log line of a scale shows.
const FIGURES_LOGGED: usize = 16;

/// Write `to` through the task's `/scale`, remember it until the watch shows it, and say so in
/// a `Scaled` event and the decision `status.lastScale` carries.
async fn write_scale(
    ctx: &Context,
    api: &Api<PeragoTask>,
    seen: &Observed,
    from: i32,
    to: i32,
    now: Now,
) -> Result<(), Error> {
    let task = &seen.task;
    let key = ObjectRef::from_obj(&**task);
    api.patch_scale(
        &task.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": to}})),
    )
    .await?;
    ctx.scaler
        .wrote_scale(&key, task.metadata.generation, to, now.instant);
    let decision = decide::decision(seen, from, to, now);
    let (queued, running) = (seen.queued, seen.running());
    let figures = describe_figures(&seen.busy, now.instant);
    let name = task.name_any();
    info!(task = %name, queued, running, from, to, reason = %decision.reason, %figures, "scaled the executor");
    let note = format!("{from} → {to} executor pods: {}", decision.reason);
    // The event is not waited for: in a wave every write of the reconcile waits its turn at the
    // API server, and the Deployment and status that follow matter more.
    let event = crate::events::event(EventType::Normal, "Scaled", note);
    let sent = crate::events::send(ctx.recorder.clone(), task.object_ref(&()), event);
    tokio::spawn(sent.in_current_span());
    ctx.scaler.decided(&key, decision, now.instant);
    Ok(())
}

/// Write the deletion costs `marks` of pods in `ns`, side by side; each with whether it was
/// written.
async fn write_marks(ctx: &Context, ns: &str, marks: Vec<Mark>) -> Vec<(Mark, bool)> {
    use futures_util::StreamExt;
    let api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    let writes = marks.into_iter().map(|mark| write_mark(ctx, &api, mark));
    // Under load each write waits its turn at the API server, and a scale-in waits for all.
    futures_util::stream::iter(writes)
        .buffer_unordered(MARKS_AT_ONCE)
        .collect()
        .await
}

async fn write_mark(ctx: &Context, api: &Api<Pod>, mark: Mark) -> (Mark, bool) {
    let (pod, cost) = (&mark.pod, mark.cost);
    let patch = json!({"metadata": {"annotations": {DELETION_COST: cost}}});
    // Only the metadata comes back: thousands of whole pods at once in a wave of scale-ins
    // would be most of the operator's memory.
    let written = api
        .patch_metadata(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    match &written {
        Ok(_) => ctx.metrics.deletion_cost_writes.inc(),
        Err(e) => warn!(%pod, error = %e, "setting the pod's deletion cost failed"),
    }
    let written = written.is_ok();
    (mark, written)
}

/// Deletion-cost writes of one scale-in in flight at once.
const MARKS_AT_ONCE: usize = 8;

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
    decide::recommended(queued + running, auto) > replicas
}

/// Every `period`, one `GET /tasks/queue/all` per Conductor: keep the figures for the
/// reconciles and the queued-attempts metric, and wake the reconcile of each autoscaled task
/// whose queue needs more pods than it has, so that scaling up (from zero above all) waits
/// for the next tick and not for the task's resync; and each whose queue stayed empty for its
/// scale-down window (ADR 0028).
pub async fn watch_queues(ctx: Arc<Context>, wake: crate::scope::Wake) {
    let Some(period) = ctx.queues.period else {
        return;
    };
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut failing = HashSet::new();
    loop {
        ticker.tick().await;
        let mut by_conductor: BTreeMap<String, Vec<Arc<PeragoTask>>> = BTreeMap::new();
        let tasks = ctx.tasks.state();
        for task in &tasks {
            if task.metadata.deletion_timestamp.is_none() {
                by_conductor
                    .entry(conductor_url(task, &ctx))
                    .or_default()
                    .push(task.clone());
            }
        }
        ctx.scaler
            .retain(&tasks.iter().map(|t| ObjectRef::from_obj(&**t)).collect());
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
            for task in take_read(&ctx, &base, sizes, &tasks, now) {
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
    now: Instant,
) -> Vec<ObjectRef<PeragoTask>> {
    let mut woken = Vec::new();
    for task in tasks {
        let key = ObjectRef::from_obj(&**task);
        let queue = queue_name(&task.spec.task_name, task.spec.domain());
        let queued = sizes.get(&queue).copied().unwrap_or(0);
        ctx.metrics.task_queued(task).set(queued);
        let replicas = (ctx.scaler)
            .scale_written(&key, task.metadata.generation, now)
            .unwrap_or(task.spec.executor.replicas);
        if needs_more_pods(task, replicas, queued) || ctx.scaler.drained(task, queued, now) {
            woken.push(key);
        }
    }
    ctx.queues.record(base, sizes);
    woken
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use std::time::Duration;

    use http::Method;

    use crate::fixtures::{mocked_context, task};
    use crate::scaler::decide::{CHOSEN, QUEUE_SETTLE, SCALE_IN_AFTER_COSTS};
    use crate::scaler::{BusyPod, Figure};
    use crate::slots::SlotsClient;

    /// Task `t` of namespace `default`, as the tests' scaler keys it.
    fn task_ref() -> ObjectRef<PeragoTask> {
        ObjectRef::new("t").within("default")
    }

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
    async fn scale_sending_nothing(ctx: &Context, work: &mut Observed) -> (i32, bool) {
        let tasks: Api<PeragoTask> = Api::namespaced(ctx.client.clone(), "default");
        tokio::time::timeout(Duration::from_secs(5), scale(ctx, &tasks, work))
            .await
            .expect("the scale-in made a request to the API server")
            .unwrap()
            .pair()
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
        let mut work = Observed {
            task: task.clone(),
            pods: vec![Arc::new(starting)],
            busy: Vec::new(),
            queued: 0,
            queue_read: Instant::now() - QUEUE_SETTLE,
            observed: Instant::now(),
            asks: 0,
            marks_failed: false,
        };
        let decided = scale_sending_nothing(&ctx, &mut work).await;
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
        Arc::get_mut(&mut ctx).unwrap().pods = SlotsClient::at_port(port);
        let total = || sidecars.iter().map(Sidecar::asked).collect::<Vec<_>>();
        // The book, a resync old: a and b idle, c running the one attempt.
        let long_ago = Instant::now() - Duration::from_secs(50);
        let work = |ctx: &Context| {
            let busy = [("p-a", 0), ("p-b", 0), ("p-c", 1)]
                .into_iter()
                .zip(ips)
                .map(|((name, busy), ip)| {
                    let figure = Figure {
                        busy,
                        answered: true,
                        at: long_ago,
                        polls_counted_before: Some(long_ago),
                        finished: None,
                    };
                    running_pod(ctx, name, ip, figure)
                })
                .collect();
            Observed {
                task: task.clone(),
                pods: Vec::new(),
                busy,
                queued: 0,
                queue_read: long_ago,
                observed: Instant::now(),
                asks: 0,
                marks_failed: false,
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
                assert_eq!(patch["metadata"]["annotations"][DELETION_COST], "-1");
                answer.send(200, &json!({"metadata": {"name": pod}}));
                marked.insert(pod);
            }
            assert_eq!(marked, ["p-a".to_owned(), "p-b".to_owned()].into());
            api_server
        });
        let decided = scale(&ctx, &tasks, &mut work(&ctx)).await.unwrap().pair();
        let api_server = server.await.unwrap();
        assert_eq!(decided, (3, true), "the scale-in waits for its marks");
        assert_eq!(
            total(),
            [0, 0, 0],
            "no pod is asked before its marks settle"
        );

        // 2. While the marks settle: nothing asked, nothing written.
        let decided = scale(&ctx, &tasks, &mut work(&ctx)).await.unwrap().pair();
        assert_eq!(decided, (3, true));
        assert_eq!(total(), [0, 0, 0]);

        // 3. Settled: the two pods it removes are asked once, and the task scales to 1.
        let settled = Instant::now() - SCALE_IN_AFTER_COSTS;
        ctx.scaler
            .marked(&task_ref(), "p-a", Some(CHOSEN.into()), settled);
        let server = answer_a_scale(api_server, 3, 1);
        let decided = scale(&ctx, &tasks, &mut work(&ctx)).await.unwrap().pair();
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
        Arc::get_mut(&mut ctx).unwrap().pods = SlotsClient::at_port(a.port);
        // Asked just before the queue read: idle, but a poll in flight may have taken the
        // queue's last task.
        let observed = Instant::now();
        let mut work = {
            let busy = [("p-a", ips[0]), ("p-b", ips[1])]
                .into_iter()
                .map(|(name, ip)| {
                    let figure = Figure {
                        busy: 0,
                        answered: true,
                        at: observed,
                        polls_counted_before: Some(observed - Duration::from_millis(1)),
                        finished: None,
                    };
                    running_pod(&ctx, name, ip, figure)
                })
                .collect();
            Observed {
                task: task.clone(),
                pods: Vec::new(),
                busy,
                queued: 0,
                queue_read: observed,
                observed,
                asks: 0,
                marks_failed: false,
            }
        };
        let tasks: Api<PeragoTask> = Api::namespaced(ctx.client.clone(), "default");

        // Both still idle: no pod's deletion cost is written, only the scale.
        let server = answer_a_scale(api_server, 2, 0);
        let decided = scale(&ctx, &tasks, &mut work).await.unwrap().pair();
        server.await.unwrap();
        assert_eq!(decided, (0, false));
        assert_eq!((a.asked(), b.asked()), (1, 1));
        let request = a.requests.lock().unwrap()[0].clone();
        assert!(
            request.starts_with("GET /slots?countPollsOlderThanMs="),
            "{request}"
        );
        assert!(
            observed.elapsed() < QUEUE_SETTLE,
            "no wait for a sidecar that counts its polls"
        );
    }

    /// A running, Ready executor pod `name` at `ip`, with `figure` from the book.
    fn running_pod(ctx: &Context, name: &str, ip: &str, figure: Figure) -> BusyPod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        let cost = ctx.scaler.cost(&task_ref(), name, None, Instant::now());
        BusyPod::new(&pod, ip.into(), figure, cost)
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
        Arc::get_mut(&mut ctx).unwrap().pods = SlotsClient::at_port(sidecar.port);
        let read = Instant::now();
        let idle = Figure {
            busy: 0,
            answered: true,
            at: read,
            polls_counted_before: None,
            finished: None,
        };
        let mut work = Observed {
            task: task.clone(),
            pods: Vec::new(),
            busy: vec![running_pod(&ctx, "p-a", ip, idle)],
            queued: 0,
            queue_read: read,
            observed: read,
            asks: 0,
            marks_failed: false,
        };
        let decided = scale_sending_nothing(&ctx, &mut work).await;
        (decided, sidecar, read)
    }

    /// A sidecar older than ADR 0033 does not say which polls it counts: a pod asked just
    /// after the queue read that shows its queue empty may have taken the queue's last task
    /// without counting it yet, so the scale-in asks it again once the read is
    /// [`QUEUE_SETTLE`] old, and keeps it when it then says it is busy.
    #[tokio::test]
    async fn a_scale_in_asks_an_older_sidecar_again_once_the_queue_read_has_settled() {
        let (decided, sidecar, read) = scale_in_of_one_pod("127.86.34.1", &[0, 1], None).await;
        assert_eq!(decided, (1, false), "the pod is kept");
        assert_eq!(sidecar.asked(), 2);
        assert!(
            read.elapsed() >= QUEUE_SETTLE,
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
        let generation = task.metadata.generation;
        (ctx.scaler).wrote_scale(&task_ref(), generation, 1, Instant::now());
        let work = |queued| Observed {
            task: task.clone(),
            pods: Vec::new(),
            busy: Vec::new(),
            queued,
            queue_read: Instant::now(),
            observed: Instant::now(),
            asks: 0,
            marks_failed: false,
        };
        let tasks: Api<PeragoTask> = Api::namespaced(ctx.client.clone(), "default");
        let decided = scale(&ctx, &tasks, &mut work(1)).await.unwrap().pair();
        assert_eq!(decided, (1, false), "the write stands, nothing is sent");

        let server = answer_a_scale(api_server, 1, 5);
        let decided = scale(&ctx, &tasks, &mut work(5)).await.unwrap().pair();
        server.await.unwrap();
        assert_eq!(decided, (5, false));
        assert_eq!(
            (ctx.scaler).scale_written(&task_ref(), generation, Instant::now()),
            Some(5),
            "the second write stands until the watch shows both"
        );
        let last = (ctx.scaler)
            .last_scale(&task_ref(), None, Instant::now())
            .expect("the status carries the decision");
        assert_eq!((last.from, last.to), (1, 5));
    }

    /// A read of the queues records its sizes before it names the tasks to wake, whose
    /// reconciles start at once and read them; and a task the operator already scaled, the
    /// watch not showing it yet, is not woken again.
    #[tokio::test]
    async fn a_read_records_the_sizes_before_it_wakes_anyone() {
        let base = "http://conductor:8080/api";
        let (ctx, _api) = crate::fixtures::mocked_context_with(Some(Duration::from_secs(2)));
        let task = Arc::new(task(
            "{name: t, namespace: default, uid: u-1, generation: 1}",
            "{taskName: op.t, ownerEmail: a@b.c, paramsSchema: {type: object}, resultSchema: {type: object}, executor: {replicas: 0, autoscaling: {minReplicas: 0, maxReplicas: 5, targetQueueDepth: 1, scaleDownStabilizationSeconds: 0}, body: {image: b, command: [run]}}}",
        ));
        let read = |queued: i64| HashMap::from([("op.t".to_owned(), queued)]);
        let tasks = [task.clone()];

        let woken = take_read(&ctx, base, read(3), &tasks, Instant::now());
        assert_eq!(woken, [task_ref()]);
        assert_eq!(
            ctx.queues.fresh(base, "op.t").map(|(size, _)| size),
            Some(3),
            "recorded before the wake-up"
        );

        (ctx.scaler).wrote_scale(&task_ref(), Some(1), 3, Instant::now());
        let woken = take_read(&ctx, base, read(3), &tasks, Instant::now());
        assert!(woken.is_empty(), "scaled to 3 already");
        let woken = take_read(&ctx, base, read(5), &tasks, Instant::now());
        assert_eq!(woken.len(), 1, "5 queued need more than the 3 written");
    }

    #[test]
    fn the_watch_wakes_a_task_only_when_it_needs_more_pods() {
        let yaml = "apiVersion: perago.io/v1alpha1\nkind: PeragoTask\nmetadata: {name: t}\nspec:\n  taskName: t\n  ownerEmail: a@b.c\n  paramsSchema: {type: object}\n  resultSchema: {type: object}\n  executor: {body: {image: b, command: [run]}}\n";
        let mut task = perago_api::manifest::parse(yaml).unwrap().remove(0).task;
        assert!(!needs_more_pods(&task, 0, 10), "not autoscaled");
        task.spec.executor.autoscaling = Some(perago_api::task::AutoscalingSpec {
            min_replicas: 0,
            max_replicas: 5,
            target_queue_depth: 4,
            scale_down_stabilization_seconds: 60,
        });
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

    /// A mark is a metadata patch of the pod's deletion cost; one the API server refuses is
    /// reported as not written.
    #[tokio::test]
    async fn marks_are_metadata_patches_and_refusals_are_reported() {
        let (ctx, mut api) = mocked_context();
        let marks = vec![Mark {
            pod: "b".into(),
            cost: Some(CHOSEN),
        }];
        let written = tokio::spawn({
            let ctx = ctx.clone();
            async move { write_marks(&ctx, "ns", marks).await }
        });
        let (patch, answer) = api.expect(Method::PATCH, "/namespaces/ns/pods/b").await;
        assert_eq!(patch["metadata"]["annotations"][DELETION_COST], CHOSEN);
        answer.send(200, &json!({"metadata": {"name": "b"}}));
        let written = written.await.unwrap();
        assert_eq!(written.len(), 1);
        assert!(written[0].1, "written");

        let marks = vec![Mark {
            pod: "c".into(),
            cost: None,
        }];
        let refused = tokio::spawn({
            let ctx = ctx.clone();
            async move { write_marks(&ctx, "ns", marks).await }
        });
        let (patch, answer) = api.expect(Method::PATCH, "/namespaces/ns/pods/c").await;
        assert!(
            patch["metadata"]["annotations"][DELETION_COST].is_null(),
            "removed"
        );
        answer.send(
            403,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Forbidden", "code": 403, "message": "no"}),
        );
        assert!(!refused.await.unwrap()[0].1, "not written");
        api.expect_no_more().await;
    }
}
