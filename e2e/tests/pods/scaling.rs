//! Scaling on the node: autoscaling from zero and back, scale-ins that keep busy pods, churn
//! without loss, an HPA owning the replicas, task domains.

use super::*;

/// Autoscaling with real pods: a task at zero replicas gets pods when work is queued, the
/// queued attempts complete, and the pods go away after the window.
#[tokio::test]
async fn an_autoscaled_task_goes_from_zero_to_pods_and_back_to_zero() {
    let Some((_turn, services, cluster)) =
        cluster("an_autoscaled_task_goes_from_zero_to_pods_and_back_to_zero").await
    else {
        return;
    };
    let (namespace, name) = ("pods-autoscale", "burst");
    autoscaled_task(
        cluster,
        namespace,
        name,
        "sleep 2; printf '{\"files\": 0}' > \"$PERAGO_RESULT\"",
        2,
        5,
    );
    let client = services.kube().client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("perago.io/task={name}");
    let count = || async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .len()
    };
    assert_eq!(count().await, 0, "scaled to zero while idle");

    let (_, repository, input_ref) = seeded(services, "pods-autoscale").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let started = std::time::Instant::now();
    let mut workflows = Vec::new();
    for i in 0..3 {
        let case = format!("burst-{i}");
        workflows.push(
            start_step(
                &conductor,
                namespace,
                name,
                &case,
                &repository,
                &input_ref,
                i,
            )
            .await,
        );
    }
    let mut first = None;
    for id in &workflows {
        let finished = conductor.finished(id).await;
        assert_eq!(finished["status"], "COMPLETED", "{finished}");
        first.get_or_insert(started.elapsed());
    }
    let all = started.elapsed();
    let scaled = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.name={name},reason=Scaled"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap();
    // The three workflows start one after another, so the operator may raise the replicas in
    // steps (0 → 1 → 2): what counts is that the scale-up starts at zero and reaches 2.
    assert!(
        scaled.contains("0 → 1 executor pods") || scaled.contains("0 → 2 executor pods"),
        "no scale-up from zero: {scaled:?}"
    );
    assert!(
        scaled.contains("→ 2 executor pods"),
        "no scale-up to 2: {scaled:?}"
    );

    let back = std::time::Instant::now();
    let mut left = count().await;
    while left > 0 {
        assert!(
            back.elapsed() < Duration::from_secs(120),
            "{left} pods still run"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        left = count().await;
    }
    eprintln!(
        "autoscaling from zero: first workflow COMPLETED {:.1?} after it started, all 3 in {all:.1?}; \
         back to zero pods {:.1?} later (window 5 s, resync 10 s)",
        first.unwrap_or_default(),
        back.elapsed()
    );
}

/// Autoscaling counts the attempts running in the pods, not only the queue: a task whose queue
/// is empty keeps the pod that runs its attempt, and goes to zero once the attempt is done.
#[tokio::test]
async fn an_autoscaled_task_keeps_the_pod_that_runs_an_attempt() {
    let Some((_turn, services, cluster)) =
        cluster("an_autoscaled_task_keeps_the_pod_that_runs_an_attempt").await
    else {
        return;
    };
    let (namespace, name) = ("pods-running", "long");
    autoscaled_task(
        cluster,
        namespace,
        name,
        "echo \"body started $PERAGO_EXECUTION_ID\"; sleep 25; printf '{\"files\": 0}' > \"$PERAGO_RESULT\"",
        2,
        2,
    );
    let (_, repository, input_ref) = seeded(services, "pods-running").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "long",
        &repository,
        &input_ref,
        1,
    )
    .await;
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.unwrap();
    wait_for_log(cluster, namespace, &pod_name, "body", "body started").await;

    // The queue is empty now; the attempt runs for 25 s, longer than the window plus a resync.
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), namespace);
    let mut seen_running = false;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(18) {
        let status = tasks.get(name).await.unwrap().status.unwrap_or_default();
        seen_running |= status.running_attempts == Some(1) && status.queue_depth == Some(0);
        assert!(
            status.replicas.unwrap_or(0) >= 1,
            "scaled in while its attempt runs: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        seen_running,
        "status never showed queue 0 and 1 running attempt"
    );
    let finished = conductor.finished(&workflow).await;
    let attempts: Vec<&str> = finished["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(attempts, ["COMPLETED"], "{finished}");
    let scaled = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.name={name},reason=Scaled"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap();
    assert!(
        scaled.contains("1 → 0 executor pods: 0 queued + 0 running"),
        "went to zero only with nothing running: {scaled:?}"
    );
    assert!(!scaled.contains("queued + 1 running"), "{scaled:?}");
}

/// Scale-in removes idle pods first: before lowering replicas the operator gives the pods with
/// the fewest busy slots a deletion cost below the others', and the ReplicaSet keeps the pods
/// whose attempts run. Two
/// pods run long attempts; each round two short workflows bring two more pods, and once the
/// short ones are done the scale-in from 4 to 2 must remove the two idle pods.
/// `PERAGO_E2E_SCALE_IN_ROUNDS` sets the rounds (5).
#[tokio::test]
async fn scale_ins_remove_idle_pods_and_keep_the_busy_ones() {
    let Some((_turn, services, cluster)) =
        cluster("scale_ins_remove_idle_pods_and_keep_the_busy_ones").await
    else {
        return;
    };
    let rounds: usize = std::env::var("PERAGO_E2E_SCALE_IN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let (namespace, name) = ("pods-idle-first", "mixed");
    cluster.task_namespace(namespace).unwrap();
    // No hard cap: the long attempts run until the task is deleted. No pod at first: the
    // scale-in of a first idle pod could meet the first long attempt, taken after the queue
    // read it is decided on, which only the pod's shutdown grace period would let finish
    // (ADR 0033).
    let spec = json!({
        "workspace": {"readOnly": true},
        "controls": {"timeout": {"policy": "RETRY", "seconds": 0, "responseSeconds": 30}},
        "executor": {"replicas": 0, "autoscaling": {
            "minReplicas": 0, "maxReplicas": 4, "targetQueueDepth": 1,
            "scaleDownStabilizationSeconds": 0,
        }},
    });
    let body = r#"if grep -q '"n": *1' "$PERAGO_PARAMS"; then sleep 3600; else sleep 1; fi
printf '{"files": 0}' > "$PERAGO_RESULT""#;
    cluster
        .apply(&workspace_task_with(namespace, name, body, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (_, repository, input_ref) = seeded(services, "pods-idle-first").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let client = services.kube().client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("perago.io/task={name}");
    let live = || async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let worker_of = |wf: &serde_json::Value| {
        wf["tasks"][0]["workerId"]
            .as_str()
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
    };
    // A reconcile now rather than at the next resync: any change of the object wakes it.
    let nudge = |round: usize| {
        cluster
            .kubectl(&[
                "annotate",
                "--overwrite",
                "-n",
                namespace,
                &format!("peragotask/{name}"),
                &format!("e2e/round={round}"),
            ])
            .unwrap();
    };

    let mut busy_pods = std::collections::BTreeSet::new();
    let mut longs = Vec::new();
    for i in 0..2 {
        let long = start_step(
            &conductor,
            namespace,
            name,
            &format!("long-{i}"),
            &repository,
            &input_ref,
            1,
        )
        .await;
        let started = std::time::Instant::now();
        let worker = loop {
            if let Some(worker) = worker_of(&conductor.workflow(&long).await) {
                break worker;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "long-{i} never started"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        busy_pods.insert(worker);
        longs.push(long);
    }
    let pod_of = |worker: &str, names: &std::collections::BTreeSet<String>| {
        names.iter().find(|n| worker.contains(n.as_str())).cloned()
    };
    let busy: std::collections::BTreeSet<String> = {
        let names = live().await;
        busy_pods.iter().filter_map(|w| pod_of(w, &names)).collect()
    };
    // What removed a pod that runs a long attempt, should one be going.
    let explain = || {
        let show = |args: &[&str]| cluster.kubectl(args).unwrap_or_else(|e| format!("{e:#}"));
        let scale_log = cluster.operator_logs().map_or_else(
            |e| format!("{e:#}"),
            |log| {
                let lines = log
                    .lines()
                    .filter(|l| l.contains(name) && (l.contains("scale") || l.contains("marking")));
                lines.collect::<Vec<_>>().join("\n")
            },
        );
        format!(
            "pods:\n{}\nevents:\n{}\ntask status:\n{}\nthe operator's scale-ins:\n{scale_log}",
            show(&[
                "get",
                "pods",
                "-n",
                namespace,
                "-o",
                "custom-columns=NAME:.metadata.name,PHASE:.status.phase,READY:.status.conditions[?(@.type==\"Ready\")].status,RESTARTS:.status.containerStatuses[*].restartCount,DELETING:.metadata.deletionTimestamp,COST:.metadata.annotations.controller\\.kubernetes\\.io/pod-deletion-cost"
            ]),
            show(&["get", "events", "-n", namespace, "--sort-by=.lastTimestamp"]),
            show(&[
                "get",
                "peragotask",
                "-n",
                namespace,
                name,
                "-o",
                "jsonpath={.status}"
            ]),
        )
    };
    assert_eq!(
        busy.len(),
        2,
        "two pods run the long attempts: {busy_pods:?}\n{}",
        explain()
    );

    let mut busy_removed = 0;
    let started = std::time::Instant::now();
    for round in 0..rounds {
        let mut shorts = Vec::new();
        for i in 0..2 {
            shorts.push(
                start_step(
                    &conductor,
                    namespace,
                    name,
                    &format!("short-{round}-{i}"),
                    &repository,
                    &input_ref,
                    2,
                )
                .await,
            );
        }
        let mut idle = std::collections::BTreeSet::new();
        for id in &shorts {
            let done = conductor.finished(id).await;
            assert_eq!(done["status"], "COMPLETED", "round {round}: {done}");
            idle.extend(worker_of(&done));
        }
        nudge(round);
        let waited = std::time::Instant::now();
        let left = loop {
            let names = live().await;
            if names.len() <= 2 {
                break names;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "round {round}: never scaled in from {names:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let removed = busy.difference(&left).count();
        busy_removed += removed;
        if removed > 0 {
            // Whether the long attempts still ran where they started: a lost lease would have
            // moved them, and then the pods they left were idle.
            let mut attempts = Vec::new();
            for long in &longs {
                let tasks = conductor.workflow(long).await["tasks"].clone();
                attempts.push(tasks.as_array().map_or_else(Vec::new, |t| {
                    t.iter()
                        .map(|t| format!("{} on {}", t["status"], t["workerId"]))
                        .collect()
                }));
            }
            panic!(
                "round {round}: kept {left:?}; the long attempts run on {busy:?} ({attempts:?}); \
                 the short ones ran on {idle:?}\n{}",
                explain()
            );
        }
    }
    eprintln!(
        "{rounds} scale-ins from 4 pods (2 busy, 2 idle) to 2 in {:.1?}: {busy_removed} busy pods removed",
        started.elapsed()
    );
    cluster
        .kubectl(&[
            "delete",
            "-n",
            namespace,
            &format!("peragotask/{name}"),
            "--wait=false",
        ])
        .unwrap();
}

const CHURN_BODY: &str = r#"
set -eu
sleep 2
echo "written by $PERAGO_TASK_ID" > "$PERAGO_WORKSPACE/churn-$PERAGO_WORKFLOW_INSTANCE_ID.txt"
printf '{"files": 1}' > "$PERAGO_RESULT"
"#;

/// Many attempts while the Deployment is scaled up and down and rolled out again and again:
/// every stopping pod finishes, publishes and reports what it runs. Every workflow COMPLETED
/// with one attempt (none given up, timed out or retried after a killed pod), each branch got
/// exactly one squash commit from that attempt, and no staging branch is left.
#[tokio::test]
async fn attempts_survive_scaling_and_rollouts_without_loss_or_double_publication() {
    let Some((_turn, services, cluster)) =
        cluster("attempts_survive_scaling_and_rollouts_without_loss_or_double_publication").await
    else {
        return;
    };
    let workflows_wanted: usize = std::env::var("PERAGO_E2E_CHURN_WORKFLOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let (namespace, name) = ("pods-churn", "churn");
    cluster.task_namespace(namespace).unwrap();
    let spec = json!({
        "controls": {
            "retry": {"count": 2, "logic": "FIXED", "delaySeconds": 0},
            "timeout": {"policy": "RETRY", "seconds": 60, "responseSeconds": 30},
        },
        "executor": {"slots": 2, "replicas": 2},
    });
    cluster
        .apply(&workspace_task_with(namespace, name, CHURN_BODY, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (lake, repository, input_ref) = seeded(services, "pods-churn").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);

    // One branch per workflow, so that each publication is checked on its own history.
    let workload = Workload::start(
        &lake,
        &conductor,
        &format!("{namespace}.{name}"),
        (&repository, &input_ref),
        "churn",
        workflows_wanted,
    )
    .await
    .unwrap();
    // Meanwhile: scale between 1 and 4 pods and roll out, one change every 4 s.
    let started = std::time::Instant::now();
    let changes = [
        "scale=4", "rollout", "scale=1", "scale=3", "rollout", "scale=2", "scale=4", "rollout",
        "scale=1", "rollout",
    ];
    let mut applied = Vec::new();
    while workload.finished(&conductor).await < workflows_wanted {
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "not every workflow finished after 15 min"
        );
        let change = changes[applied.len() % changes.len()];
        match change.split_once('=') {
            Some((_, n)) => cluster.kubectl(&[
                "scale",
                "-n",
                namespace,
                &format!("peragotask/{name}"),
                &format!("--replicas={n}"),
            ]),
            None => cluster.kubectl(&[
                "rollout",
                "restart",
                "-n",
                namespace,
                &format!("deployment/{name}-perago"),
            ]),
        }
        .unwrap();
        applied.push(change);
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    let took = started.elapsed();

    let outcome = workload.outcome(&lake, &conductor).await.unwrap();
    assert!(outcome.holds_the_promises(), "{outcome}");
    assert_eq!(
        (outcome.attempts, outcome.failed_attempts),
        (workflows_wanted, 0),
        "one attempt each, none lost to a stopping pod: {outcome}"
    );
    eprintln!(
        "{outcome}, in {took:.1?}, while {} scale and rollout changes were made ({})",
        applied.len(),
        applied.join(", ")
    );
}

/// A task without `spec.executor.autoscaling` whose `/scale` the cluster's HPA controller owns
/// (the example HPA of `deploy/examples/scalers/`, aimed at this task): the HPA raises the
/// task to its `minReplicas`, the operator follows with pods, and it does not fight the HPA.
#[tokio::test]
async fn an_hpa_owns_the_replicas_of_a_task_and_the_operator_follows() {
    let Some((_turn, services, cluster)) =
        cluster("an_hpa_owns_the_replicas_of_a_task_and_the_operator_follows").await
    else {
        return;
    };
    let (namespace, name) = ("pods-hpa", "scaled-by-hpa");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task_with(
            namespace,
            name,
            PUBLISH_BODY,
            &json!({"workspace": {"readOnly": true}, "executor": {"replicas": 1}}),
        ))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();

    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/examples/scalers/hpa-external-metrics.yaml"
    ))
    .unwrap();
    let mut hpa: serde_json::Value = serde_yaml::from_str(&example).unwrap();
    hpa["metadata"]["namespace"] = json!(namespace);
    hpa["spec"]["scaleTargetRef"]["name"] = json!(name);
    hpa["spec"]["minReplicas"] = json!(3);
    cluster.apply(&hpa.to_string()).unwrap();

    let client = services.kube().client().await.unwrap();
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), namespace);
    let started = std::time::Instant::now();
    loop {
        let task = tasks.get(name).await.unwrap();
        let ready = task.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        if task.spec.executor.replicas == 3 && ready == 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the HPA's minimum never reached the pods: replicas {}, ready {ready}",
            task.spec.executor.replicas
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let followed = started.elapsed();
    // Not fought: through two of the operator's resyncs (10 s each here) it stays at 3.
    let held = std::time::Instant::now();
    while held.elapsed() < Duration::from_secs(25) {
        let d = deployments.get(&format!("{name}-perago")).await.unwrap();
        assert_eq!(
            d.spec.unwrap().replicas,
            Some(3),
            "the operator changed the HPA's replicas"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let status = cluster
        .kubectl(&[
            "get",
            "hpa",
            "-n",
            namespace,
            "features-build",
            "-o",
            "jsonpath={.status.currentReplicas}/{.status.desiredReplicas}",
        ])
        .unwrap();
    assert_eq!(status.trim(), "3/3", "the HPA's own view");
    eprintln!("HPA minReplicas 3 on a task at 1: 3 pods ready {followed:.1?} later, held for 25 s");
    cluster
        .kubectl(&["delete", "hpa", "-n", namespace, "features-build"])
        .unwrap();
}

/// Two PeragoTasks of one task type: `stable` without a domain, `canary` in the domain
/// `canary`, autoscaled from zero. A workflow routed to the domain (`taskToDomain`) scales the
/// canary up by its domain's queue and is served by its pod; one not routed is served by the
/// stable pod. A third PeragoTask of the type whose spec renders another TaskDef is not Ready,
/// names the sibling that registered it, and gets no pods.
#[tokio::test]
async fn task_domains_route_work_to_their_own_pods_and_scale_them() {
    let Some((_turn, services, cluster)) =
        cluster("task_domains_route_work_to_their_own_pods_and_scale_them").await
    else {
        return;
    };
    let namespace = "pods-domains";
    let task_type = "pods-domains.step";
    cluster.task_namespace(namespace).unwrap();
    let answer = |files: i32| format!("printf '{{\"files\": {files}}}' > \"$PERAGO_RESULT\"");
    let shared = json!({"taskName": task_type, "workspace": {"readOnly": true}});
    let apply = |name: &str, files: i32, spec: &serde_json::Value| {
        let mut spec = spec.clone();
        merge(&mut spec, &shared);
        cluster
            .apply(&workspace_task_with(namespace, name, &answer(files), &spec))
            .unwrap();
    };
    // One after the other, so that `stable` is the older sibling that registers the TaskDef.
    apply("stable", 1, &json!({}));
    cluster.wait_ready(namespace, "stable").unwrap();
    let canary = json!({
        "conductor": {"domain": "canary"},
        "executor": {"autoscaling": {"minReplicas": 0, "maxReplicas": 1, "scaleDownStabilizationSeconds": 5}},
    });
    apply("canary", 2, &canary);
    cluster.wait_ready(namespace, "canary").unwrap();

    let (_, repository, input_ref) = seeded(services, "pods-domains").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let input = json!({
        "workspace": {"repository": repository, "branch": "main", "refType": "commit", "ref": input_ref},
        "params": {"n": 0},
    });
    let started = std::time::Instant::now();
    let routed = conductor
        .start_routed(task_type, "routed", input.clone(), Some("canary"))
        .await;
    let unrouted = conductor.start(task_type, "unrouted", input).await;
    for (id, name, files) in [(routed, "canary", 2), (unrouted, "stable", 1)] {
        let finished = conductor.finished(&id).await;
        let step = &finished["tasks"][0];
        assert_eq!(step["status"], "COMPLETED", "{name}: {step}");
        assert!(served_by(step, name), "{name}: {step}");
        assert_eq!(step["outputData"]["result"]["files"], files, "{step}");
    }
    let scaled = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.name=canary,reason=Scaled",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap();
    assert!(
        scaled.contains("0 → 1"),
        "the domain's queue scaled the canary: {scaled:?}"
    );
    eprintln!(
        "task domains: the routed step scaled its domain's task from zero and both completed in {:.1?}",
        started.elapsed()
    );

    // A sibling whose spec renders another TaskDef neither registers it nor gets pods.
    apply(
        "drifted",
        3,
        &json!({"conductor": {"domain": "eu"}, "controls": {"timeout": {"seconds": 90}}}),
    );
    let client = services.kube().client().await.unwrap();
    let ready = ready_condition(&client, namespace, "drifted", &["TaskDefConflict"]).await;
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .contains("registered by the older PeragoTask pods-domains/stable")
            && ready.message.contains("(timeoutSeconds)"),
        "{}",
        ready.message
    );
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), namespace);
    assert!(
        deployments
            .get_opt("drifted-perago")
            .await
            .unwrap()
            .is_none()
    );
    let stored = conductor
        .call(
            reqwest::Method::GET,
            &format!("/metadata/taskdefs/{task_type}"),
            None,
        )
        .await;
    assert_eq!(
        stored["timeoutSeconds"], 120,
        "the registered TaskDef is untouched"
    );
}
