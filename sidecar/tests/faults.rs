//! The world around the sidecar broken on purpose, many times: a local pod reaches the real
//! Conductor and lakeFS (and, on the presigned path, the object store) through the harness's
//! fault-injecting proxies, each scenario runs `PERAGO_FAULT_RUNS` (20, fewer for the slow
//! ones; `PERAGO_FAULT_SCALE` percent of that) workflows, and after each the history checker
//! explains the branch. Whatever the proxy does: every workflow ends COMPLETED (the retries are allowed to
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
use perago_lakefs::{Commit, LakeFsClient};
use perago_workspace::history;
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

/// `PERAGO_FAULT_RUNS`, else `default` (fewer for the scenarios that wait out an outage)
/// times `PERAGO_FAULT_SCALE` percent (default 100; CI runs half), rounded up.
fn runs_or(default: usize) -> usize {
    let number = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    number("PERAGO_FAULT_RUNS")
        .unwrap_or_else(|| (default * number("PERAGO_FAULT_SCALE").unwrap_or(100)).div_ceil(100))
        .max(1)
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
    /// Once the pod has given up reporting the run's result (it counts it lost).
    AfterResultLost,
}

/// Deterministic, as `docs/task-bodies.md` recommends: a retry writes what the first attempt
/// wrote. Two files, so that a stage makes more than one upload.
const BODY: &str = r#"
echo "$PERAGO_WORKFLOW_INSTANCE_ID" > "$PERAGO_WORKSPACE/run.txt"
head -c 200000 /dev/zero | tr '\0' 'x' > "$PERAGO_WORKSPACE/big.txt"
printf '{"files": 2}' > "$PERAGO_RESULT"
"#;

/// How a scenario's task and pod are set up.
struct Setup {
    slots: u32,
    retries: u32,
    /// Conductor's delay before each retry (seconds).
    retry_delay: u32,
    response_seconds: u32,
    body: String,
    /// Files of the input commit besides `data/seed.txt`.
    seed: Vec<(String, String)>,
    /// lakeFS of its own on PostgreSQL and s3proxy, its presigned URLs expiring after this
    /// long and pointing at a fault proxy in front of the object store; the pod takes the
    /// presigned data path. `None`: the binary's shared lakeFS, proxied.
    presigned: Option<Duration>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            slots: 2,
            retries: 3,
            retry_delay: 0,
            response_seconds: 10,
            body: BODY.into(),
            seed: Vec::new(),
            presigned: None,
        }
    }
}

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
    /// What a replacement pod is started with.
    contract: Value,
    body: String,
    extra_env: Vec<(&'static str, String)>,
    /// The lakeFS of a presigned setup (dropped after the pod and the proxies).
    own_lakefs: Option<(perago_e2e::services::LakeFs, tempfile::TempDir)>,
}

impl Rig {
    async fn new(task: &str, slots: u32) -> Self {
        Self::with(
            task,
            Setup {
                slots,
                ..Setup::default()
            },
        )
        .await
    }

    async fn with(task: &str, setup: Setup) -> Self {
        let services = services().await;
        let Setup {
            slots,
            retries,
            retry_delay,
            response_seconds,
            body,
            seed,
            presigned,
        } = setup;
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
  controls: {{retry: {{count: {retries}, delaySeconds: {retry_delay}}}, timeout: {{responseSeconds: {response_seconds}}}}}
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
        let own_lakefs = match presigned {
            None => None,
            Some(expiry) => {
                let dir = tempfile::Builder::new()
                    .prefix("perago-faults-s3-")
                    .tempdir()
                    .unwrap();
                let lakefs = perago_e2e::services::LakeFs::start_presigning_through_proxy(
                    dir.path(),
                    std::net::Ipv4Addr::LOCALHOST.into(),
                    expiry,
                )
                .await
                .unwrap();
                Some((lakefs, dir))
            }
        };
        let target = own_lakefs.as_ref().map_or(services.lakefs(), |(l, _)| l);
        let lakefs = FaultProxy::start(&target.endpoint).await.unwrap();
        let extra_env = match &own_lakefs {
            Some((l, _)) => vec![
                ("PERAGO_LAKEFS_DATA_PATH", "presigned".to_owned()),
                ("PERAGO_LAKEFS_OBJECT_STORE_HOSTS", l.object_store_hosts()),
            ],
            None => Vec::new(),
        };
        let pod = start_pod(&conductor, &lakefs, &contract, &body, &extra_env).await;
        let lake = Lake::of(target);
        let repository = format!("{}-{}", task.replace('.', "-"), std::process::id());
        let mut files = vec![("data/seed.txt", "seed")];
        files.extend(seed.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let input = lake.seed(&repository, &files).await.unwrap();
        let client = LakeFsClient::new(
            &target.endpoint,
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
            contract,
            body,
            extra_env,
            own_lakefs,
        }
    }

    /// The rig's own lakeFS (a presigned setup).
    fn own_lakefs(&self) -> &perago_e2e::services::LakeFs {
        &self.own_lakefs.as_ref().expect("not a presigned setup").0
    }

    /// The fault proxy in front of the object store, in a presigned setup.
    fn store(&self) -> Option<&FaultProxy> {
        self.own_lakefs
            .as_ref()
            .and_then(|(l, _)| l.object_store_proxy.as_ref())
    }

    /// Every proxy of the rig.
    fn proxies(&self) -> Vec<&FaultProxy> {
        let mut all = vec![&self.conductor, &self.lakefs];
        all.extend(self.store());
        all
    }

    /// Faults applied by every proxy since they were last cleared; then clears them.
    fn clear_faults(&self) -> usize {
        self.proxies()
            .iter()
            .map(|p| {
                let n = p.faulted().len();
                p.clear();
                n
            })
            .sum()
    }

    /// SIGKILL the pod's sidecar (its runner, re-parented, exits) and start a new pod in its
    /// place, as the kubelet restarts a killed container.
    async fn kill_and_replace(&mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pod.pid()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let _ = self.pod.child.wait().await;
        self.pod = start_pod(
            &self.conductor,
            &self.lakefs,
            &self.contract,
            &self.body,
            &self.extra_env,
        )
        .await;
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

/// A local pod that reaches Conductor and lakeFS through the proxies.
async fn start_pod(
    conductor: &FaultProxy,
    lakefs: &FaultProxy,
    contract: &Value,
    body: &str,
    extra_env: &[(&'static str, String)],
) -> Pod {
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
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
    let mut env = env.to_vec();
    env.extend(extra_env.iter().map(|(k, v)| (*k, v.as_str())));
    Pod::start(&bins, &conductor.url, contract, body, &env).await
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
    /// Attempts Conductor timed out (their pod died or lost the lease).
    timed_out: usize,
}

impl Tally {
    fn print(&self, name: &str) {
        eprintln!(
            "fault scenario {name:<34} runs {:>3}  completed {:>3}  attempts {:>3}  failed attempts {:>3}  timed out {:>3}  superseded {:>2}  faults applied {:>3}  staging left 0  unexplained commits 0",
            self.runs,
            self.completed,
            self.attempts,
            self.failed_attempts,
            self.timed_out,
            self.superseded,
            self.faults_applied
        );
    }
}

/// Run `runs` workflows; before each, `inject` sets the proxies, and `heal` says when an
/// outage ends. Checks every invariant.
async fn scenario(name: &str, runs: usize, inject: impl Fn(&Rig), heal: Heal) -> (Tally, String) {
    let (tally, rig) =
        scenario_with(name, runs, Setup::default(), Staging::Now, inject, heal).await;
    (tally, rig.pod.metrics().await)
}

/// [`scenario`] on a task set up as `setup`, with `staging` saying when the staging branches
/// must be gone; the rig stays for the caller to inspect.
async fn scenario_with(
    name: &str,
    runs: usize,
    setup: Setup,
    staging: Staging,
    inject: impl Fn(&Rig),
    heal: Heal,
) -> (Tally, Rig) {
    let rig = Rig::with(&format!("faults.{name}"), setup).await;
    let mut tally = Tally::default();
    for run in 0..runs {
        inject(&rig);
        let (id, branch) = rig.start(run).await;
        if let Heal::OutageOnHold(hold, outage) = heal {
            let started = Instant::now();
            let proxies = rig.proxies();
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
            for proxy in &proxies {
                proxy.inject(None, "", Fault::DropRequest, None);
            }
            tokio::time::sleep(outage).await;
            for proxy in &proxies {
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
                    tally.faults_applied += rig.clear_faults();
                    break;
                }
                assert!(started.elapsed() < Duration::from_secs(90), "{name}: {wf}");
                rig.api.decide(&id).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let wf = rig.finished(&id).await;
        if matches!(heal, Heal::AfterResultLost) {
            let lost = format!("perago_sidecar_results_lost_total {}", run + 1);
            let started = Instant::now();
            while !rig.pod.metrics().await.contains(&lost) {
                assert!(
                    started.elapsed() < Duration::from_secs(90),
                    "{name} run {run}: the pod never gave up reporting"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tally.faults_applied += rig.clear_faults();
        check_run(&rig, name, run, &wf, &branch, &mut tally, staging).await;
    }
    tally.print(name);
    (tally, rig)
}

async fn staging_branches(rig: &Rig) -> Value {
    rig.lake
        .get(&format!(
            "/repositories/{}/branches?prefix=perago-staging-&amount=1000",
            rig.repository
        ))
        .await
        .unwrap()
}

/// No staging branch, at once or within 10 s: the sweep of earlier attempts' staging branches
/// runs after the report.
async fn no_staging_branch(rig: &Rig, what: &str) {
    let started = Instant::now();
    let mut branches = staging_branches(rig).await;
    while !branches["results"].as_array().unwrap().is_empty()
        && started.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        branches = staging_branches(rig).await;
    }
    assert_eq!(
        branches["results"].as_array().unwrap().len(),
        0,
        "{what}: a staging branch was left: {branches}"
    );
}

/// When a run's "no staging branch" holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Staging {
    /// As soon as the workflow ended (within 10 s: the sweep of earlier attempts' branches
    /// follows the report).
    Now,
    /// Once a stale attempt still running beside the workflow's end has been fenced and has
    /// cleaned up (within 20 s).
    Settled,
    /// Checked by the caller once every concurrent run has ended.
    Later,
}

/// The invariants of one finished run (see the module doc), counted into `tally`.
async fn check_run(
    rig: &Rig,
    name: &str,
    run: usize,
    wf: &Value,
    branch: &str,
    tally: &mut Tally,
    staging: Staging,
) {
    tally.runs += 1;
    assert_eq!(wf["status"], "COMPLETED", "{name} run {run}: {wf}");
    tally.completed += 1;
    let tasks = wf["tasks"].as_array().unwrap();
    tally.attempts += tasks.len();
    for attempt in tasks {
        if attempt["status"] == "TIMED_OUT" {
            tally.timed_out += 1;
        }
        if attempt["status"] == "FAILED" {
            tally.failed_attempts += 1;
            let reason = attempt["reasonForIncompletion"].as_str().unwrap_or("");
            assert!(
                reason.contains("lakeFS ")
                    || reason.contains("Conductor ")
                    || reason.contains("object store "),
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
    let what = format!("{name} run {run}");
    match staging {
        Staging::Now => no_staging_branch(rig, &what).await,
        Staging::Settled => {
            let started = Instant::now();
            while !staging_branches(rig).await["results"]
                .as_array()
                .unwrap()
                .is_empty()
                && started.elapsed() < Duration::from_secs(20)
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            no_staging_branch(rig, &what).await;
        }
        Staging::Later => {}
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

/// The merge reaches lakeFS and lands, but its answer is lost: the attempt fails with an
/// uncertain outcome (a merge is never tried again), and the retry's publish fence finds the
/// branch at the first attempt's confirm commit. A retry whose body writes the same files
/// completes on that publication without merging; one whose body writes other files
/// publishes on top of it, superseding it.
#[tokio::test]
async fn the_merge_answer_lost_after_lakefs_merged() {
    for (case, body, superseded) in [
        ("same-files", BODY.to_owned(), 0),
        (
            "other-files",
            format!("echo \"$PERAGO_RETRY_COUNT\" > \"$PERAGO_WORKSPACE/attempt.txt\"\n{BODY}"),
            1,
        ),
    ] {
        let (t, _) = scenario_with(
            &format!("merge-answer-lost-{case}"),
            runs(),
            Setup {
                body,
                ..Setup::default()
            },
            Staging::Now,
            |rig| {
                rig.lakefs
                    .inject(Some("POST"), "/merge", Fault::DropResponse, Some(1))
            },
            Heal::Never,
        )
        .await;
        assert_eq!(
            t.failed_attempts, t.runs,
            "{case}: the first attempt fails: {t:?}"
        );
        assert_eq!(t.attempts, 2 * t.runs, "{case}: {t:?}");
        assert_eq!(t.superseded, superseded * t.runs, "{case}: {t:?}");
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

/// Every answer to the COMPLETED update dropped: Conductor took the first update, so the
/// workflow completes with its one attempt and one publication; the pod tries again five
/// times over about 20 s, then counts the result lost, fails nothing and serves the next
/// task. Three runs unless `PERAGO_FAULT_RUNS` says otherwise: each waits out the retries.
#[tokio::test]
async fn every_answer_to_the_completed_update_lost() {
    let (t, metrics) = scenario(
        "completed-update-answers-all-lost",
        runs_or(3),
        |rig| {
            rig.conductor.inject_with_body(
                Some("POST"),
                "/tasks",
                "\"COMPLETED\"",
                Fault::DropResponse,
                None,
            )
        },
        Heal::AfterResultLost,
    )
    .await;
    assert_eq!(t.attempts, t.runs, "{t:?}");
    assert_eq!(
        t.faults_applied,
        6 * t.runs,
        "one update and five retries a run: {t:?}"
    );
    assert!(
        metrics.contains(&format!("perago_sidecar_results_lost_total {}", t.runs)),
        "{metrics}"
    );
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

/// Conductor (and lakeFS) unreachable for `PERAGO_FAULT_OUTAGE_SECONDS` (10) from the moment
/// the attempt reports: the report is retried until the outage ends, or is lost and Conductor
/// times the attempt out and retries it, whose fence finds the publication already made. Five
/// runs unless `PERAGO_FAULT_RUNS` says otherwise: each waits out the outage.
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
        Heal::OutageOnHold(
            "report",
            Duration::from_secs(
                std::env::var("PERAGO_FAULT_OUTAGE_SECONDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(10),
            ),
        ),
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
                Staging::Later,
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

/// A `BODY` whose first attempt runs a second longer, for a lease to be lost or a pod to be
/// killed while it runs; it marks in the pod's directory that it started on this workflow.
fn slow_first_body(seconds: u32) -> String {
    format!(
        "touch \"$T/body-started-$PERAGO_WORKFLOW_INSTANCE_ID\"\n[ \"$PERAGO_RETRY_COUNT\" = 0 ] && sleep {seconds}\n{BODY}"
    )
}

/// Drop every lease extension the pod sends (the COMPLETED update still goes through).
fn drop_lease_extensions(rig: &Rig) {
    rig.conductor.inject_with_body(
        Some("POST"),
        "/tasks",
        "extendLease",
        Fault::DropRequest,
        None,
    );
}

/// Count the attempts the attempt fence found stale in a pod's log.
/// Stale attempts that ended without publishing: refused by their attempt fence or, when the
/// retry had completed first and swept their staging branch away, refused by lakeFS while
/// they staged on it (HTTP 404 on that branch).
fn fenced_in(log: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains("stale attempt")
                || (l.contains("attempt reported")
                    && l.contains("failed: HTTP 404 Not Found: branch 'perago-staging-"))
        })
        .count()
}

/// The attempt's lease is lost while its body runs (5 runs unless `PERAGO_FAULT_RUNS` says
/// otherwise: each waits out the timeout): the proxy drops every lease extension until
/// Conductor has timed the attempt out; the retry publishes, and the stale attempt,
/// when its body returns, is refused by the attempt fence before it stages anything.
#[tokio::test]
async fn the_lease_lost_during_the_body() {
    let (t, rig) = scenario_with(
        "lease-lost-during-body",
        runs_or(5),
        Setup {
            response_seconds: 2,
            body: slow_first_body(5),
            ..Setup::default()
        },
        Staging::Settled,
        drop_lease_extensions,
        Heal::AfterFirstAttempt,
    )
    .await;
    assert_eq!(t.timed_out, t.runs, "every first attempt timed out: {t:?}");
    settle_fenced(&rig, t.runs).await;
}

/// The attempt's lease is lost while it stages (each upload is held back 4 s, longer than the
/// 2 s response timeout; 5 runs by default): the stale attempt's second attempt fence refuses
/// the merge and its staging branch is removed, or, when the retry completes first, the
/// retry's sweep removes that branch and lakeFS refuses the stale attempt's next upload; the
/// retry publishes once.
#[tokio::test]
async fn the_lease_lost_during_stage() {
    let (t, rig) = scenario_with(
        "lease-lost-during-stage",
        runs_or(5),
        Setup {
            response_seconds: 2,
            ..Setup::default()
        },
        Staging::Settled,
        |rig| {
            drop_lease_extensions(rig);
            rig.lakefs.inject(
                Some("POST"),
                "/objects?",
                Fault::Delay(Duration::from_secs(4)),
                None,
            );
        },
        Heal::AfterFirstAttempt,
    )
    .await;
    assert_eq!(t.timed_out, t.runs, "every first attempt timed out: {t:?}");
    settle_fenced(&rig, t.runs).await;
}

/// Every stale attempt of `runs` ends without publishing (within 20 s); see [`fenced_in`].
async fn settle_fenced(rig: &Rig, runs: usize) {
    let started = Instant::now();
    while fenced_in(&rig.pod.log()) < runs && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        fenced_in(&rig.pod.log()),
        runs,
        "each stale attempt was refused by its attempt fence or by lakeFS:\n{}",
        rig.pod.log()
    );
}

/// Where a pod is killed, and how the test knows it got there.
enum KillPoint {
    /// The body runs on the workflow (its marker file exists): the download is done.
    BodyRunning,
    /// A call is held by a proxy under this name: the sidecar is just before it.
    Held {
        conductor: bool,
        method: &'static str,
        path: &'static str,
        body: Option<&'static str>,
    },
}

/// The sidecar SIGKILLed at each crash point — after download (the body running), after the
/// body (before the staging branch is made), after stage (before the merge is sent), after the
/// merge (before cleanup) and before the COMPLETED report — `PERAGO_FAULT_RUNS` times each (2
/// by default; the table's 20 are `PERAGO_FAULT_RUNS=20`). A new pod takes the killed one's
/// place; Conductor times the attempt out and the retry publishes exactly once, superseding
/// nothing (the body is deterministic), and leaves no staging branch.
#[tokio::test]
async fn the_sidecar_sigkilled_at_each_crash_point() {
    let points = [
        ("after-download", KillPoint::BodyRunning),
        (
            "after-body",
            KillPoint::Held {
                conductor: false,
                method: "POST",
                path: "/branches",
                body: Some("perago-staging"),
            },
        ),
        (
            "after-stage",
            KillPoint::Held {
                conductor: false,
                method: "POST",
                path: "/merge",
                body: None,
            },
        ),
        (
            "after-merge",
            KillPoint::Held {
                conductor: false,
                method: "DELETE",
                path: "/branches/perago-staging",
                body: None,
            },
        ),
        (
            "before-report",
            KillPoint::Held {
                conductor: true,
                method: "POST",
                path: "/tasks",
                body: Some("\"COMPLETED\""),
            },
        ),
    ];
    let runs = runs_or(2);
    let mut rig = Rig::with(
        "faults.sigkill",
        Setup {
            response_seconds: 2,
            body: slow_first_body(1),
            ..Setup::default()
        },
    )
    .await;
    let mut n = 0;
    for (name, point) in &points {
        let mut tally = Tally::default();
        for _ in 0..runs {
            if let KillPoint::Held {
                conductor,
                method,
                path,
                body,
            } = point
            {
                let proxy = if *conductor {
                    &rig.conductor
                } else {
                    &rig.lakefs
                };
                let hold = Fault::Hold("kill".into());
                match body {
                    Some(b) => proxy.inject_with_body(Some(method), path, b, hold, Some(1)),
                    None => proxy.inject(Some(method), path, hold, Some(1)),
                }
            }
            let (id, branch) = rig.start(n).await;
            let started = Instant::now();
            loop {
                let there = match point {
                    KillPoint::BodyRunning => rig.pod.path(&format!("body-started-{id}")).exists(),
                    KillPoint::Held { .. } => rig.conductor.held("kill") || rig.lakefs.held("kill"),
                };
                if there {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "{name}: the attempt never got there:\n{}",
                    rig.pod.log()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            rig.kill_and_replace().await;
            for proxy in [&rig.conductor, &rig.lakefs] {
                // The killed sidecar's call in flight never reaches the server.
                proxy.drop_held("kill");
                tally.faults_applied += proxy.faulted().len();
                proxy.clear();
            }
            let wf = rig.finished(&id).await;
            check_run(&rig, name, n, &wf, &branch, &mut tally, Staging::Now).await;
            assert_eq!(wf["tasks"][0]["status"], "TIMED_OUT", "{name}: {wf}");
            n += 1;
        }
        tally.print(&format!("sigkill-{name}"));
        assert_eq!(tally.superseded, 0, "{name}: {tally:?}");
        assert_eq!(tally.attempts, 2 * runs, "{name}: {tally:?}");
    }
}

/// What became of one foreign commit raced against a publication.
#[derive(Debug, Default)]
struct Race {
    runs: usize,
    /// The fence saw the foreign commit and failed the attempt without publishing.
    fenced: usize,
    /// The merge landed on the foreign commit: the soft fence's window.
    on_foreign_head: usize,
    /// The hard fence's pre-merge hook refused the merge.
    refused_by_hard_fence: usize,
    /// The foreign commit came after the publication.
    after: usize,
    /// Proxy arrival of the head check to arrival of the merge, per run (ms).
    windows: Vec<f64>,
    /// The foreign commit's call, per run (ms).
    commits: Vec<f64>,
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// `PERAGO_RACE_RUNS` (100 by default) foreign
/// commits, one per workflow, each made straight to lakeFS a little after the attempt's
/// staging commit, the delays spread over the time from that commit to the merge. Every
/// outcome is one of four, and the history checker flags exactly the publications that landed
/// on a foreign head.
/// An empty commit on `branch`, straight to lakeFS. lakeFS refuses a commit whose branch a
/// merge moved while it was sealing the staged changes (it does not retry that step), so the
/// foreign writer tries again, as any writer would; it then lands after the publication.
async fn foreign_commit(rig: &Rig, branch: &str) -> String {
    let path = format!("/repositories/{}/branches/{branch}/commits", rig.repository);
    let mut refused = Vec::new();
    loop {
        match rig
            .lake
            .post(
                &path,
                json!({"message": "a foreign writer", "allow_empty": true}),
            )
            .await
        {
            Ok(commit) => return commit["id"].as_str().unwrap().to_owned(),
            Err(e) if refused.len() < 5 => {
                eprintln!("the foreign commit on {branch} was refused, trying again: {e:#}");
                refused.push(e);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                panic!("the foreign commit on {branch} failed 6 times: {e:#}; before: {refused:?}")
            }
        }
    }
}

async fn race(hard: bool) -> Race {
    let runs: usize = std::env::var("PERAGO_RACE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut seed = Vec::new();
    if hard {
        let hook = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/lakefs/perago-hard-fence.yaml"
        ))
        .unwrap();
        let branches: String = (0..runs).map(|r| format!("      - run-{r:03}\n")).collect();
        assert!(hook.contains("      - main\n"));
        seed.push((
            "_lakefs_actions/perago-hard-fence.yaml".to_owned(),
            hook.replace("      - main\n", &branches),
        ));
    }
    let name = if hard { "race-hard" } else { "race-soft" };
    // Timeouts are not what this measures: 30 s of lease, so that a machine busy with other
    // suites does not time an attempt out mid-run.
    let rig = Rig::with(
        &format!("faults.{name}"),
        Setup {
            retries: 0,
            response_seconds: 30,
            seed,
            ..Setup::default()
        },
    )
    .await;
    let mut race = Race::default();
    for run in 0..runs {
        rig.lakefs.inject(
            Some("POST"),
            "/commits",
            Fault::Hold("stage".into()),
            Some(1),
        );
        let (id, branch) = rig.start(run).await;
        assert!(
            rig.lakefs
                .until_held("stage", Duration::from_secs(30))
                .await,
            "{name}: no stage"
        );
        // Spread the foreign commits over the time from the staging commit to the merge.
        let span = if race.windows.len() < 3 {
            40.0
        } else {
            median(&race.windows) + median(&race.commits) + 20.0
        };
        let delay = span * (run as f64 + 0.5) / runs as f64;
        rig.lakefs.release("stage");
        tokio::time::sleep(Duration::from_secs_f64(delay / 1000.0)).await;
        let sent = Instant::now();
        let foreign = foreign_commit(&rig, &branch).await;
        race.commits.push(sent.elapsed().as_secs_f64() * 1000.0);
        let wf = rig.finished(&id).await;
        let seen = rig.lakefs.seen();
        let head_check = seen
            .iter()
            .rfind(|s| s.method == "GET" && s.path.ends_with(&format!("/branches/{branch}")));
        let merge = seen
            .iter()
            .find(|s| s.method == "POST" && s.path.contains("/merge"));
        if let (Some(h), Some(m)) = (head_check, merge) {
            race.windows
                .push(m.at.duration_since(h.at).as_secs_f64() * 1000.0);
        }
        rig.lakefs.clear();

        let (log, _) = rig
            .client
            .first_parent_log(&rig.repository, &branch, &rig.input, 10)
            .await
            .unwrap();
        let report = history::check(&log, &rig.input, std::slice::from_ref(&foreign));
        let t = &wf["tasks"][0];
        let head = &log[0];
        race.runs += 1;
        if wf["status"] == "COMPLETED" && head.id == foreign {
            race.after += 1;
            assert!(report.problems.is_empty(), "{name} run {run}: {report:?}");
            assert_eq!(
                log[1].parents,
                std::slice::from_ref(&rig.input),
                "{name} run {run}"
            );
        } else if wf["status"] == "COMPLETED" {
            race.on_foreign_head += 1;
            assert_eq!(
                head.parents,
                std::slice::from_ref(&foreign),
                "{name} run {run}"
            );
            assert_eq!(t["outputData"]["workspace"]["ref"], json!(head.id));
            assert_eq!(
                report.problems.len(),
                1,
                "{name} run {run}: the checker flags the publication: {report:?}"
            );
            assert!(report.problems[0].contains("is not its first parent"));
        } else {
            assert_eq!(wf["status"], "FAILED", "{name} run {run}: {wf}");
            assert_eq!(head.id, foreign, "{name} run {run}: nothing published");
            assert!(report.problems.is_empty(), "{name} run {run}: {report:?}");
            let reason = t["reasonForIncompletion"].as_str().unwrap_or("");
            if reason.contains("perago hard fence") {
                race.refused_by_hard_fence += 1;
            } else {
                assert!(
                    reason.contains("advanced from"),
                    "{name} run {run}: {reason}"
                );
                race.fenced += 1;
            }
        }
        no_staging_branch(&rig, &format!("{name} run {run}")).await;
    }
    eprintln!(
        "foreign commits raced ({}): runs {}  fenced {}  published on a foreign head {}  refused by the hard fence {}  foreign after the publication {}  head check → merge median {:.1} ms  foreign commit call median {:.1} ms",
        if hard {
            "hard fence"
        } else {
            "soft fence only"
        },
        race.runs,
        race.fenced,
        race.on_foreign_head,
        race.refused_by_hard_fence,
        race.after,
        median(&race.windows),
        median(&race.commits)
    );
    race
}

/// Without the hard fence, a foreign commit that lands between the head check and the merge is
/// stacked under the publication: measured here, and flagged by the history checker.
#[tokio::test]
async fn foreign_commits_raced_into_the_fence_without_the_hard_fence() {
    let race = race(false).await;
    assert_eq!(race.refused_by_hard_fence, 0, "{race:?}");
    assert!(
        race.fenced + race.after > 0,
        "the race spans the window: {race:?}"
    );
}

/// With the hard fence installed, no publication lands on a foreign head.
#[tokio::test]
async fn foreign_commits_raced_into_the_fence_with_the_hard_fence() {
    let race = race(true).await;
    assert_eq!(race.on_foreign_head, 0, "{race:?}");
}

/// A presigned setup: lakeFS of its own on PostgreSQL and s3proxy, URLs valid for `expiry`.
fn presigned(expiry: Duration) -> Setup {
    Setup {
        presigned: Some(expiry),
        ..Setup::default()
    }
}

#[tokio::test]
async fn the_object_store_slowing_down_is_retried_within_the_attempt() {
    let (t, _) = scenario_with(
        "object-store-slow-down",
        runs_or(10),
        presigned(Duration::from_secs(900)),
        Staging::Now,
        |rig| {
            let store = rig.store().unwrap();
            // The first transfer of each run is refused twice, as S3 throttles.
            store.inject(None, "", Fault::S3Error(503, "SlowDown"), Some(2));
        },
        Heal::Never,
    )
    .await;
    assert_eq!(t.faults_applied, 2 * t.runs, "{t:?}");
    assert_eq!(t.failed_attempts, 0, "retried within the attempt: {t:?}");
}

#[tokio::test]
async fn an_upload_the_object_store_stored_corrupted_is_never_linked() {
    let (t, rig) = scenario_with(
        "object-store-corrupt-upload",
        runs_or(10),
        presigned(Duration::from_secs(900)),
        Staging::Now,
        // One byte of the first upload of each run changed on its way to the object store.
        |rig| {
            let store = rig.store().unwrap();
            store.inject(Some("PUT"), "", Fault::CorruptUpload { at: 10 }, Some(1));
        },
        Heal::Never,
    )
    .await;
    assert_eq!(t.faults_applied, t.runs, "{t:?}");
    assert_eq!(t.failed_attempts, 0, "put again within the attempt: {t:?}");
    let log = rig.pod.log();
    assert_eq!(
        log.matches("; not linked").count(),
        t.runs,
        "each corrupted upload was seen and not linked:\n{log}"
    );
    // What each run published is the body's bytes (the corrupted copy never made it in).
    for run in 0..t.runs {
        let big = rig
            .lake
            .object(&rig.repository, &format!("run-{run:03}"), "data/big.txt")
            .await
            .unwrap();
        assert!(
            big.len() == 200_000 && big.bytes().all(|b| b == b'x'),
            "run {run}"
        );
    }
}

#[tokio::test]
async fn an_object_store_unreachable_while_lakefs_is_up_fails_the_attempt_and_the_retry_publishes()
{
    let (t, rig) = scenario_with(
        "object-store-unreachable",
        runs_or(10),
        presigned(Duration::from_secs(900)),
        Staging::Now,
        |rig| {
            rig.store()
                .unwrap()
                .inject(None, "", Fault::DropRequest, None)
        },
        Heal::AfterFirstAttempt,
    )
    .await;
    assert_eq!(
        t.failed_attempts, t.runs,
        "each run's first attempt fails: {t:?}"
    );
    assert!(
        rig.pod
            .log()
            .contains("object store get of 'data/seed.txt'"),
        "the failure names the object store's call:\n{}",
        rig.pod.log()
    );
}

#[tokio::test]
async fn a_presigned_url_that_expired_while_it_waited_is_asked_for_again() {
    // URLs valid for 2 s; the first download and the first upload of each run reach the object
    // store 3 s after lakeFS signed them.
    let (t, rig) = scenario_with(
        "presigned-url-expired",
        runs_or(5),
        Setup {
            response_seconds: 30,
            ..presigned(Duration::from_secs(2))
        },
        Staging::Now,
        |rig| {
            let store = rig.store().unwrap();
            store.inject(
                Some("GET"),
                "",
                Fault::Delay(Duration::from_secs(3)),
                Some(1),
            );
            store.inject(
                Some("PUT"),
                "",
                Fault::Delay(Duration::from_secs(3)),
                Some(1),
            );
        },
        Heal::Never,
    )
    .await;
    assert_eq!(t.faults_applied, 2 * t.runs, "{t:?}");
    assert_eq!(
        t.failed_attempts, 0,
        "a fresh URL, within the attempt: {t:?}"
    );
    let log = rig.pod.log();
    let renewed = |what: &str| {
        log.matches(&format!("refused a presigned {what} URL"))
            .count()
    };
    assert_eq!(
        (renewed("download"), renewed("upload")),
        (t.runs, t.runs),
        "the object store refused each late URL and each was presigned again:\n{log}"
    );
    assert!(log.contains("AccessDenied"), "{log}");
}

#[tokio::test]
async fn a_link_refused_because_the_staging_branch_is_gone_fails_the_attempt_and_the_retry_publishes_once()
 {
    let (t, rig) = held_runs(
        "link-refused",
        retried_after(0),
        runs_or(5),
        |_| ("PUT", "/staging/backing"),
        Staging::Now,
        async |rig| {
            // The bytes are in the object store; the branch they were to be linked into goes.
            let staging = staging_branches(rig).await;
            let gone = staging["results"][0]["id"].as_str().unwrap().to_owned();
            rig.client
                .delete_branch(&rig.repository, &gone)
                .await
                .unwrap();
            rig.lakefs.release(HELD);
        },
    )
    .await;
    assert_eq!(t.failed_attempts, t.runs, "{t:?}");
    // The held link fails; so may an upload of a small file still in flight beside it, when
    // the branch goes first. Either names its lakeFS call and the missing branch.
    let log = rig.pod.log();
    let refused = log
        .lines()
        .filter(|l| l.contains("\"attempt reported\"") && l.contains("\"FAILED\""))
        .filter(|l| {
            (l.contains("lakeFS link object on") || l.contains("lakeFS upload object on"))
                && l.contains("404 Not Found: branch not found")
        })
        .count();
    assert_eq!(
        refused, t.runs,
        "each first attempt failed naming the call the missing staging branch refused:\n{log}"
    );
}

#[tokio::test]
async fn postgresql_crashing_mid_merge_loses_nothing_and_publishes_once() {
    // A cleanup refused while the database was down is tried again in the background.
    held_runs(
        "postgres-crash-mid-merge",
        retried_after(3),
        runs_or(5),
        |_| ("POST", "/merge/"),
        Staging::Settled,
        async |rig| {
            // lakeFS's database crashes, the merge reaches lakeFS while it is down, and it is
            // back a second later.
            let postgres = rig.own_lakefs().postgres.as_ref().unwrap();
            let release = async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                rig.lakefs.release(HELD);
            };
            let (restarted, ()) =
                tokio::join!(postgres.crash_and_restart(Duration::from_secs(1)), release);
            restarted.unwrap();
        },
    )
    .await;
}

#[tokio::test]
async fn lakefs_killed_mid_merge_and_mid_stage_loses_nothing_and_publishes_once() {
    // lakeFS's state is in PostgreSQL and the object store: a restarted lakeFS has it all.
    // Even runs kill it under the merge, odd ones under the link of an uploaded object.
    held_runs(
        "lakefs-killed",
        retried_after(3),
        runs_or(10),
        |run| [("POST", "/merge/"), ("PUT", "/staging/backing")][run % 2],
        Staging::Settled,
        async |rig| {
            // The call reaches lakeFS just as it is killed.
            let release = async { rig.lakefs.release(HELD) };
            let restart = rig.own_lakefs().crash_and_restart(Duration::from_secs(1));
            let (restarted, ()) = tokio::join!(restart, release);
            restarted.unwrap();
        },
    )
    .await;
}

/// The hold of [`held_runs`].
const HELD: &str = "held";

/// A presigned setup whose workflows retry `delay` seconds apart (3 s, as a production task
/// would: no retry then waits out a restart within the same second).
fn retried_after(delay: u32) -> Setup {
    Setup {
        response_seconds: 30,
        retry_delay: delay,
        ..presigned(Duration::from_secs(900))
    }
}

/// `runs` workflows, each with the first lakeFS call at `point(run)` (method, path) held under
/// [`HELD`]; once it is, `meanwhile` breaks something and releases it. Every run is then
/// checked as any scenario's.
async fn held_runs(
    name: &str,
    setup: Setup,
    runs: usize,
    point: impl Fn(usize) -> (&'static str, &'static str),
    staging: Staging,
    meanwhile: impl AsyncFn(&Rig),
) -> (Tally, Rig) {
    let rig = Rig::with(&format!("faults.{name}"), setup).await;
    let mut tally = Tally::default();
    for run in 0..runs {
        let (method, path) = point(run);
        rig.lakefs
            .inject(Some(method), path, Fault::Hold(HELD.into()), Some(1));
        let (id, branch) = rig.start(run).await;
        assert!(
            rig.lakefs.until_held(HELD, Duration::from_secs(30)).await,
            "{name}: {method} {path} never came"
        );
        meanwhile(&rig).await;
        let wf = rig.finished(&id).await;
        tally.faults_applied += rig.clear_faults();
        check_run(&rig, name, run, &wf, &branch, &mut tally, staging).await;
    }
    tally.print(name);
    (tally, rig)
}
