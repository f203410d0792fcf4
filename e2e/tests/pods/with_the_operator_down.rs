//! The GitOps race (`pods/gitops.rs` has the other scenarios and the helpers): with the operator
//! scaled to zero, a task applied through a new commit has no status. Flux's default (kstatus)
//! health check takes it for Current and reports the Kustomization Ready at once; with the
//! shipped expressions Flux waits until the operator is back and the task is Ready.
//!
//! It takes the binary alone while the operator is down, so it is named to run last: libtest
//! starts a binary's tests in the order of their names. Taken mid-run, the wait to be alone
//! stalled every other test until each one then running had ended (about a minute).

use std::time::{Duration, Instant};

use super::gitops::{
    OperatorHeld, applied, condition, describe, example_task, flux_objects, kustomizations,
    request_reconcile, scale_operator, setup, shipped_health_checks, tasks, watch,
};

/// With the operator down, a new task has no status: without health expressions Flux reports
/// the Kustomization Ready before the operator has looked; with the shipped ones it waits for
/// the operator to come back and the task to be Ready.
#[tokio::test]
async fn flux_waits_only_with_the_shipped_health_checks() {
    let Some(scenario) = setup("flux_waits_only_with_the_shipped_health_checks").await else {
        return;
    };
    let setup = &scenario;
    let (name, namespace) = ("race", "gitops-race");
    let (_cleanup, repository) = setup.repository(name, namespace);
    let write_task = |task: &str| {
        repository
            .write(
                &format!("tasks/{task}.yaml"),
                &example_task("workspace-free-task.yaml", namespace, task),
            )
            .unwrap();
    };
    let limit = Duration::from_secs(240);

    // A first task, with the operator up and Flux's default health checks.
    write_task("first");
    let commit = repository.commit("A first task").unwrap();
    setup
        .cluster
        .apply(&flux_objects(name, &repository, namespace, None))
        .unwrap();
    let seen = watch(setup, name, &commit, namespace, &["first"], limit, |seen| {
        seen.flux_ready.is_some() && seen.tasks_ready.contains_key("first")
    })
    .await;
    assert!(
        seen.flux_ready.is_some() && seen.tasks_ready.contains_key("first"),
        "the first task and its Kustomization were not Ready\n{}",
        describe(setup, name, namespace)
    );
    // Not asserted: whether Flux's first health check comes before the operator's first status.
    eprintln!(
        "race with the operator up, without health expressions: Flux Ready {:.1} s after the \
         apply (the task then: {}), the task Ready at {:.1} s",
        seen.after(seen.flux_ready).unwrap(),
        seen.not_ready_at_flux_ready
            .first()
            .map_or("Ready", |(_, conditions)| conditions.as_str()),
        seen.after(seen.tasks_ready.get("first").copied()).unwrap(),
    );

    // Without health expressions: the operator scaled to zero, a second task committed. The
    // other tests wait on the operator, so from here they wait for this one.
    setup.alone().await;
    let installed = OperatorHeld::take(setup.cluster);
    scale_operator(setup.cluster, 0).unwrap();
    write_task("second");
    let commit = repository.commit("A second task").unwrap();
    request_reconcile(setup.cluster, name);
    let seen = watch(
        setup,
        name,
        &commit,
        namespace,
        &["second"],
        limit,
        |seen| seen.flux_ready.is_some(),
    )
    .await;
    let Some(flux_ready) = seen.flux_ready else {
        panic!(
            "without health expressions the Kustomization was not Ready with {commit}\n{}",
            describe(setup, name, namespace)
        );
    };
    let second = tasks(&setup.client, namespace).get("second").await.unwrap();
    assert!(
        second.data["status"]["conditions"].is_null(),
        "the operator is down, yet the second task has conditions: {:#}",
        second.data["status"]
    );
    // Some seconds more with the operator down: Flux keeps calling it Ready.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let ks = kustomizations(&setup.client).get(name).await.unwrap();
    assert!(
        applied(&ks, &commit),
        "{}",
        describe(setup, name, namespace)
    );
    let operator_back = Instant::now();
    scale_operator(setup.cluster, installed.replicas).unwrap();
    let back = watch(
        setup,
        name,
        &commit,
        namespace,
        &["second"],
        limit,
        |seen| seen.tasks_ready.contains_key("second"),
    )
    .await;
    let Some(second_ready) = back.tasks_ready.get("second").copied() else {
        panic!(
            "the second task was not Ready after the operator came back\n{}",
            describe(setup, name, namespace)
        );
    };
    let without = second_ready.duration_since(flux_ready).as_secs_f64();
    eprintln!(
        "race without health expressions: Flux reported Ready {:.1} s after the reconcile request, \
         with the task unseen by the operator; the task was Ready {without:.1} s later ({:.1} s \
         after the operator was scaled back up)",
        seen.after(Some(flux_ready)).unwrap(),
        second_ready.duration_since(operator_back).as_secs_f64(),
    );

    // With the shipped expressions: set while the operator is up, then the operator down again
    // and a third task committed.
    let checks = shipped_health_checks();
    setup
        .cluster
        .apply(&flux_objects(name, &repository, namespace, Some(&checks)))
        .unwrap();
    let seen = watch(
        setup,
        name,
        &commit,
        namespace,
        &["first", "second"],
        limit,
        |seen| seen.flux_ready.is_some(),
    )
    .await;
    assert!(
        seen.flux_ready.is_some(),
        "the Kustomization with health expressions was not Ready\n{}",
        describe(setup, name, namespace)
    );
    scale_operator(setup.cluster, 0).unwrap();
    write_task("third");
    let commit = repository.commit("A third task").unwrap();
    request_reconcile(setup.cluster, name);
    // Longer than the two health-check polls (every 5 s) Flux would need to call it Ready.
    let hold = Duration::from_secs(20);
    let held = watch(setup, name, &commit, namespace, &["third"], hold, |seen| {
        seen.flux_ready.is_some()
    })
    .await;
    assert!(
        held.flux_ready.is_none(),
        "with the health expressions Flux reported Ready while the operator was down\n{}",
        describe(setup, name, namespace)
    );
    let ks = kustomizations(&setup.client).get(name).await.unwrap();
    let message = condition(&ks, "Ready").map(|c| c["message"].clone());
    eprintln!("race with health expressions: while the operator is down, Flux says {message:?}");
    let operator_back = Instant::now();
    scale_operator(setup.cluster, installed.replicas).unwrap();
    let seen = watch(setup, name, &commit, namespace, &["third"], limit, |seen| {
        seen.flux_ready.is_some() && seen.tasks_ready.contains_key("third")
    })
    .await;
    let (Some(flux_ready), Some(third_ready)) =
        (seen.flux_ready, seen.tasks_ready.get("third").copied())
    else {
        panic!(
            "after the operator came back, the Kustomization or the third task was not Ready\n{}",
            describe(setup, name, namespace)
        );
    };
    assert!(
        seen.not_ready_at_flux_ready.is_empty() && flux_ready >= third_ready,
        "Flux reported Ready before the third task was\n{}",
        describe(setup, name, namespace)
    );
    eprintln!(
        "race with health expressions: the task Ready {:.1} s after the operator was scaled back \
         up, Flux Ready {:.1} s after the task (Flux held for {:.0} s with the operator down)",
        third_ready.duration_since(operator_back).as_secs_f64(),
        flux_ready.duration_since(third_ready).as_secs_f64(),
        hold.as_secs_f64(),
    );
}
