//! The world around the sidecar broken on purpose, many times: a local pod reaches the real
//! Conductor and lakeFS through the harness's fault-injecting proxies, each scenario runs
//! `PERAGO_FAULT_RUNS` (20) workflows, and after each the history checker explains the
//! branch. Whatever the proxy does: every workflow ends COMPLETED (the retries are allowed to
//! fail), exactly one publication stands per workflow, no staging branch is left, and every
//! FAILED attempt's reason names the call that failed.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use perago_api::{contract, manifest, taskdef};
use perago_e2e::faults::{Fault, FaultProxy};
use perago_e2e::lake::Lake;
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, Services, shared};
use perago_sidecar::lakefs::{Commit, LakeFsClient};
use perago_sidecar::workspace::history;
use serde_json::{Value, json};

async fn services() -> &'static Services {
    shared(Selection {
        conductor: true,
        lakefs: true,
        ..Selection::default()
    })
    .await
}

fn runs() -> usize {
    runs_or(20)
}

/// `PERAGO_FAULT_RUNS`, else `default` (fewer for the scenarios that wait out an outage).
fn runs_or(default: usize) -> usize {
    std::env::var("PERAGO_FAULT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// When a scenario's outage ends within a run.
#[derive(Clone, Copy)]
enum Heal {
    /// The injected rules run their course.
    Never,
    /// Once the first attempt has ended: the retry finds the servers again.
    AfterFirstAttempt,
    /// Once the proxy has held the first call to this path, everything is refused for this
    /// long, then the servers are back.
    OutageOnHold(&'static str, Duration),
}

/// Deterministic, as `docs/task-bodies.md` recommends: a retry writes what the first attempt
/// wrote. Two files, so that a stage makes more than one upload.
const BODY: &str = r#"
echo "$PERAGO_WORKFLOW_INSTANCE_ID" > "$PERAGO_WORKSPACE/run.txt"
head -c 200000 /dev/zero | tr '\0' 'x' > "$PERAGO_WORKSPACE/big.txt"
printf '{"files": 2}' > "$PERAGO_RESULT"
"#;

/// A pod whose Conductor and lakeFS are the proxies, for a task of its own with retries.
struct Rig {
    conductor: FaultProxy,
    lakefs: FaultProxy,
    api: ConductorApi,
    lake: Lake,
    client: LakeFsClient,
    task: String,
    repository: String,
    input: String,
    pod: Pod,
}

impl Rig {
    async fn new(task: &str, slots: u32) -> Self {
        let services = services().await;
        let yaml = format!(
            r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: t}}
spec:
  taskName: {task}
  ownerEmail: e2e@example.com
  workspace: {{prefix: /data}}
  paramsSchema: {{type: object}}
  resultSchema: {{type: object, properties: {{files: {{type: integer}}}}, required: [files]}}
  controls: {{retry: {{count: 3, delaySeconds: 0}}, timeout: {{responseSeconds: 10}}}}
  executor: {{body: {{image: body, command: [sh]}}, slots: {slots}}}
"#
        );
        let spec = manifest::parse(&yaml).unwrap().remove(0).task.spec;
        let api = ConductorApi::new(&services.conductor().api_url);
        api.call(
            reqwest::Method::POST,
            "/metadata/taskdefs",
            Some(&json!([taskdef::render(&spec).unwrap()])),
        )
        .await;
        let contract = serde_json::to_value(contract::render(&spec).unwrap()).unwrap();
        let conductor = FaultProxy::start(&services.conductor().api_url)
            .await
            .unwrap();
        let lakefs = FaultProxy::start(&services.lakefs().endpoint)
            .await
            .unwrap();
        let bins = PodBinaries {
            sidecar: env!("CARGO_BIN_EXE_perago-sidecar").into(),
            runner: env!("CARGO_BIN_EXE_perago-runner").into(),
        };
        let env = [
            ("LAKECTL_SERVER_ENDPOINT_URL", lakefs.url.as_str()),
            ("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID),
            (
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                LAKEFS_SECRET_ACCESS_KEY,
            ),
            // Short enough for the scenarios' outages to be retried within a run.
            ("PERAGO_LAKEFS_TIMEOUT_SECONDS", "5"),
            ("PERAGO_TRANSFER_TIMEOUT_SECONDS", "10"),
        ];
        let pod = Pod::start(&bins, &conductor.url, &contract, BODY, &env).await;
        let lake = Lake::new(&services.lakefs().endpoint);
        let repository = format!("{}-{}", task.replace('.', "-"), std::process::id());
        let input = lake
            .seed(&repository, &[("data/seed.txt", "seed")])
            .await
            .unwrap();
        let client = LakeFsClient::new(
            &services.lakefs().endpoint,
            LAKEFS_ACCESS_KEY_ID,
            LAKEFS_SECRET_ACCESS_KEY,
            Duration::from_secs(30),
        )
        .unwrap();
        Self {
            conductor,
            lakefs,
            api,
            lake,
            client,
            task: task.to_owned(),
            repository,
            input,
            pod,
        }
    }

    /// A workflow on a branch of its own, made from the input commit.
    async fn start(&self, run: usize) -> (String, String) {
        let branch = format!("run-{run:03}");
        self.lake
            .post(
                &format!("/repositories/{}/branches", self.repository),
                json!({"name": branch, "source": self.input}),
            )
            .await
            .unwrap();
        let id = self
            .api
            .start(
                &self.task,
                &format!("r{run:03}"),
                json!({"workspace": {"repository": self.repository, "branch": branch,
                                     "refType": "commit", "ref": self.input},
                       "params": {}}),
            )
            .await;
        (id, branch)
    }

    /// Decide until the workflow ends (Conductor's own sweep of timed-out attempts is slow).
    async fn finished(&self, id: &str) -> Value {
        let started = Instant::now();
        loop {
            let wf = self.api.workflow(id).await;
            if wf["status"] != "RUNNING" {
                return wf;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "not finished: {wf}"
            );
            self.api.decide(id).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// What the runs of one scenario came to.
#[derive(Default, Debug)]
struct Tally {
    runs: usize,
    completed: usize,
    attempts: usize,
    failed_attempts: usize,
    superseded: usize,
    faults_applied: usize,
}

/// Run `runs` workflows; before each, `inject` sets the proxies, and `heal` says when an
/// outage ends. Checks every invariant.
async fn scenario(name: &str, runs: usize, inject: impl Fn(&Rig), heal: Heal) -> (Tally, String) {
    let rig = Rig::new(&format!("faults.{name}"), 2).await;
    let mut tally = Tally::default();
    for run in 0..runs {
        inject(&rig);
        let (id, branch) = rig.start(run).await;
        if let Heal::OutageOnHold(hold, outage) = heal {
            let started = Instant::now();
            let proxies = [&rig.conductor, &rig.lakefs];
            while !proxies.iter().any(|p| {
                p.faulted()
                    .iter()
                    .any(|s| s.fault.as_deref() == Some(&*format!("hold-{hold}")))
            }) {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "{name}: nothing held"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            for proxy in proxies {
                proxy.inject(None, "", Fault::DropRequest, None);
            }
            tokio::time::sleep(outage).await;
            for proxy in proxies {
                tally.faults_applied += proxy.faulted().len();
                proxy.clear();
            }
        }
        if matches!(heal, Heal::AfterFirstAttempt) {
            let started = Instant::now();
            loop {
                let wf = rig.api.workflow(&id).await;
                let first_done = wf["tasks"][0]["status"]
                    .as_str()
                    .is_some_and(|s| !matches!(s, "SCHEDULED" | "IN_PROGRESS"));
                if first_done || wf["status"] != "RUNNING" {
                    // The outage ends; the retry finds the servers again.
                    tally.faults_applied +=
                        rig.conductor.faulted().len() + rig.lakefs.faulted().len();
                    rig.conductor.clear();
                    rig.lakefs.clear();
                    break;
                }
                assert!(started.elapsed() < Duration::from_secs(90), "{name}: {wf}");
                rig.api.decide(&id).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let wf = rig.finished(&id).await;
        tally.faults_applied += rig.conductor.faulted().len() + rig.lakefs.faulted().len();
        rig.conductor.clear();
        rig.lakefs.clear();
        check_run(&rig, name, run, &wf, &branch, &mut tally, false).await;
    }
    eprintln!(
        "fault scenario {name:<34} runs {:>3}  completed {:>3}  attempts {:>3}  failed attempts {:>3}  superseded {:>2}  faults applied {:>3}  staging left 0  unexplained commits 0",
        tally.runs,
        tally.completed,
        tally.attempts,
        tally.failed_attempts,
        tally.superseded,
        tally.faults_applied
    );
    (tally, rig.pod.metrics().await)
}

async fn no_staging_branch(rig: &Rig, what: &str) {
    let branches = rig
        .lake
        .get(&format!(
            "/repositories/{}/branches?prefix=perago-staging-&amount=1000",
            rig.repository
        ))
        .await
        .unwrap();
    assert_eq!(
        branches["results"].as_array().unwrap().len(),
        0,
        "{what}: a staging branch was left: {branches}"
    );
}

/// The invariants of one finished run (see the module doc), counted into `tally`; the check
/// for staging branches waits, for `concurrent` runs, until all of them have finished.
async fn check_run(
    rig: &Rig,
    name: &str,
    run: usize,
    wf: &Value,
    branch: &str,
    tally: &mut Tally,
    concurrent: bool,
) {
    tally.runs += 1;
    assert_eq!(wf["status"], "COMPLETED", "{name} run {run}: {wf}");
    tally.completed += 1;
    let tasks = wf["tasks"].as_array().unwrap();
    tally.attempts += tasks.len();
    for attempt in tasks {
        if attempt["status"] == "FAILED" {
            tally.failed_attempts += 1;
            let reason = attempt["reasonForIncompletion"].as_str().unwrap_or("");
            assert!(
                reason.contains("lakeFS ") || reason.contains("Conductor "),
                "{name} run {run}: a FAILED reason that names no call: {reason:?}"
            );
        }
    }
    let last = tasks.last().unwrap();
    assert_eq!(last["status"], "COMPLETED", "{name} run {run}: {wf}");

    // The branch: explained, and one standing publication, the one reported.
    let (log, _) = rig
        .client
        .first_parent_log(&rig.repository, branch, &rig.input, 50)
        .await
        .unwrap();
    let report = history::check(&log, &rig.input, &[]);
    assert!(
        report.problems.is_empty(),
        "{name} run {run}: {:?}",
        report.problems
    );
    let standing = report.standing();
    assert_eq!(standing.len(), 1, "{name} run {run}: {report:?}");
    tally.superseded += report.entries.len() - 1;
    let head: &Commit = &log[0];
    assert_eq!(
        last["outputData"]["workspace"]["ref"],
        json!(head.id),
        "{name} run {run}: the reported ref is the branch head"
    );
    // The repository's staging branches: none while no other workflow of this rig runs.
    if !concurrent {
        no_staging_branch(rig, &format!("{name} run {run}")).await;
    }
}

#[tokio::test]
async fn a_download_reset_mid_stream() {
    let (t, _) = scenario(
        "download-reset",
        runs(),
        |rig| {
            rig.lakefs.inject(
                Some("GET"),
                "/objects?",
                Fault::ResetDownload { after: 2 },
                Some(1),
            )
        },
        Heal::Never,
    )
    .await;
    assert_eq!(t.faults_applied, t.runs, "one reset per run");
    assert_eq!(
        t.failed_attempts, 0,
        "the broken download is fetched again: {t:?}"
    );
}

#[tokio::test]
async fn an_upload_reset_mid_stream() {
    let (t, _) = scenario(
        "upload-reset",
        runs(),
        |rig| {
            rig.lakefs.inject(
                Some("POST"),
                "/objects?",
                Fault::ResetUpload { after: 1000 },
                Some(1),
            )
        },
        Heal::Never,
    )
    .await;
    assert_eq!(t.faults_applied, t.runs, "one reset per run");
}

/// 423 (branch locked by another merge) and 429 (throttled) say lakeFS did not merge: the
/// sidecar tries again within the merge budget, so the attempt completes, and counts it. A
/// 503 may come from a gateway after lakeFS acted: the attempt fails and the retry's fence
/// classifies the branch.
#[tokio::test]
async fn a_merge_refused_with_503_423_and_429() {
    for code in [423, 429, 503] {
        let (t, metrics) = scenario(
            &format!("merge-{code}"),
            runs(),
            |rig| {
                rig.lakefs
                    .inject(Some("POST"), "/merge", Fault::Status(code), Some(1))
            },
            Heal::Never,
        )
        .await;
        let refusals = format!(
            "perago_sidecar_merge_refusals_total{{status=\"{code}\"}} {}",
            t.runs
        );
        if code == 503 {
            assert_eq!(t.failed_attempts, t.runs, "merge-503: {t:?}");
            assert!(
                !metrics.contains("merge_refusals_total{status=\"503\"}"),
                "{metrics}"
            );
        } else {
            assert_eq!(
                t.failed_attempts, 0,
                "merge-{code}: retried in the attempt: {t:?}"
            );
            assert!(
                metrics.contains(&refusals),
                "merge-{code}: {refusals} missing"
            );
        }
    }
}

#[tokio::test]
async fn the_answer_to_the_completed_update_lost() {
    scenario(
        "completed-update-answer-lost",
        runs(),
        |rig| {
            rig.conductor
                .inject(Some("POST"), "/tasks", Fault::DropResponse, Some(1))
        },
        Heal::Never,
    )
    .await;
}

#[tokio::test]
async fn lakefs_unreachable_during_stage() {
    scenario(
        "lakefs-down-during-stage",
        runs(),
        |rig| {
            rig.lakefs
                .inject(Some("POST"), "/objects?", Fault::DropRequest, None)
        },
        Heal::AfterFirstAttempt,
    )
    .await;
}

/// Conductor (and lakeFS) unreachable for 10 s from the moment the attempt reports: the
/// report is retried until the outage ends, or is lost and Conductor times the attempt out and
/// retries it, whose fence finds the publication already made. Five runs unless
/// `PERAGO_FAULT_RUNS` says otherwise: each waits out the outage.
#[tokio::test]
async fn conductor_down_around_the_report() {
    scenario(
        "conductor-down-around-the-report",
        runs_or(5),
        |rig| {
            rig.conductor.inject(
                Some("POST"),
                "/tasks",
                Fault::Hold("report".into()),
                Some(1),
            )
        },
        Heal::OutageOnHold("report", Duration::from_secs(10)),
    )
    .await;
}

/// Eight attempts of one pod merging into eight branches of one repository at once, round
/// after round (`PERAGO_FAULT_RUNS` rounds, 5 by default): all publish once, and none that
/// merged is reported failed. lakeFS's refusals of concurrent merges, if any, are retried
/// within the merge budget and counted.
#[tokio::test]
async fn eight_concurrent_merges_into_one_repository() {
    let rig = Rig::new("faults.concurrent-merges", 8).await;
    let mut tally = Tally::default();
    let rounds = runs_or(5);
    for round in 0..rounds {
        let mut started = Vec::new();
        for i in 0..8 {
            started.push(rig.start(round * 8 + i).await);
        }
        for (run, (id, branch)) in started.iter().enumerate() {
            let wf = rig.finished(id).await;
            check_run(
                &rig,
                "concurrent-merges",
                round * 8 + run,
                &wf,
                branch,
                &mut tally,
                true,
            )
            .await;
        }
        no_staging_branch(&rig, &format!("concurrent merges round {round}")).await;
    }
    let metrics = rig.pod.metrics().await;
    let refusals: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("perago_sidecar_merge_refusals_total"))
        .collect();
    assert_eq!(tally.failed_attempts, 0, "{tally:?}");
    eprintln!(
        "concurrent merges: {rounds} rounds of 8 into one repository: {} workflows COMPLETED, {} attempts, merge refusals retried: {refusals:?}",
        tally.completed, tally.attempts
    );
}
