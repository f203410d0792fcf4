//! Start-up checks and wiring of the sidecar, and the local mode that runs the runner beside
//! it as a second process sharing the work directory, exactly as the pod does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::process::{Child, Command};
use tokio::sync::watch;
use tracing::{info, warn};

use perago_contract::contract::{CONTRACT_VERSION, ContractWorkspace, TaskContract};

use crate::broker::{Broker, TaskRuntime};
use crate::config::{LakeFsSettings, RuntimeSettings, Settings};
use crate::execution;
use crate::input::Schemas;
use crate::lineage::{LineageSource, PodFacts};
use crate::openlineage::OpenLineage;
use crate::otlp::{self, Exporter};
use crate::runner::{self, RunnerHub};
use crate::telemetry::Metrics;
use crate::trace::Tracer;
use crate::workspace::hard_fence::HardFenceWatch;
use crate::workspace::janitor::StagingSweep;
use crate::workspace::{TransferLimits, WorkspaceRuntime};
use perago_conductor::ConductorClient;
use perago_contract::protocol::SOCKET_NAME;
use perago_lakefs::LakeFsClient;
use perago_lakefs::direct::{Chosen, DataPath, ObjectStoreHosts, StorageConfig};

/// A start-up failure; its text is printed as `error: <text>` and the process exits 1.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub fn read_contract(path: &Path) -> Result<TaskContract, StartError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        StartError(format!(
            "reading the task contract {} failed: {e}",
            path.display()
        ))
    })?;
    let contract: TaskContract = serde_json::from_str(&text).map_err(|e| {
        StartError(format!(
            "the task contract {} is invalid: {e}",
            path.display()
        ))
    })?;
    if contract.version != CONTRACT_VERSION {
        return Err(StartError(format!(
            "the task contract {} has version {}; this sidecar reads version {CONTRACT_VERSION}",
            path.display(),
            contract.version
        )));
    }
    Ok(contract)
}

/// The contract's text as read (its hash goes into each publication's lineage).
fn contract_text(path: &Path) -> Result<Vec<u8>, StartError> {
    std::fs::read(path).map_err(|e| {
        StartError(format!(
            "reading the task contract {} failed: {e}",
            path.display()
        ))
    })
}

/// What the operator put into the pod for each publication's lineage.
fn pod_facts(settings: &Settings) -> PodFacts {
    PodFacts {
        annotations: settings.pod_annotations.clone(),
        task_namespace: settings.task_namespace.clone(),
        task_name: settings.task_name.clone(),
        task_uid: settings.task_uid.clone(),
        task_generation: settings.task_generation,
        body_image: settings.body_image.clone(),
    }
}

/// Copy the `perago-runner` next to this binary to `to` (executable by every user of the pod).
/// The copy is renamed into place: a restarted sidecar installs again while the body may be
/// running the runner already there, which cannot be written to (ETXTBSY).
pub fn install_runner(to: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::PermissionsExt;
    let from = std::env::current_exe()
        .map_err(|e| StartError(format!("locating perago-runner failed: {e}")))?
        .with_file_name("perago-runner");
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| StartError(format!("creating {} failed: {e}", dir.display())))?;
    }
    let copy = to.with_extension(format!("installing-{}", std::process::id()));
    std::fs::copy(&from, &copy).map_err(|e| {
        StartError(format!(
            "copying {} to {} failed: {e}",
            from.display(),
            copy.display()
        ))
    })?;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755))
        .and_then(|()| std::fs::rename(&copy, to))
        .map_err(|e| {
            let _ = std::fs::remove_file(&copy);
            StartError(format!("installing {} failed: {e}", to.display()))
        })?;
    Ok(())
}

/// Turn SIGTERM and SIGINT into `stop = true`.
pub fn stop_on_signals() -> Result<watch::Receiver<bool>, StartError> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = watch::channel(false);
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| StartError(format!("installing the SIGTERM handler failed: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| StartError(format!("installing the SIGINT handler failed: {e}")))?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => info!(signal = "SIGTERM", "stopping"),
            _ = int.recv() => info!(signal = "SIGINT", "stopping"),
        }
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// Run the sidecar until `stop` turns true and every attempt is reported.
pub async fn run(settings: &Settings, stop: watch::Receiver<bool>) -> Result<(), StartError> {
    let checked = settings.check().map_err(StartError)?;
    std::sync::LazyLock::force(&STARTED);
    let contract = read_contract(&settings.contract)?;
    let schemas = Schemas::compile(&contract).map_err(|e| StartError(e.to_string()))?;
    let workspace = workspace_parts(&contract, &checked)?;
    let work_dir = settings.work_dir.clone();
    prepare_work_dir(&work_dir)?;

    let metrics = Arc::new(
        Metrics::new(
            &contract.task_name,
            contract.metrics.as_ref(),
            &checked.instance_id,
        )
        .map_err(|e| StartError(format!("registering metrics failed: {e}")))?,
    );
    let conductor = Arc::new(
        ConductorClient::with_tls(
            &checked.conductor_url,
            checked.request_timeout,
            checked.credentials.clone(),
            checked.conductor_tls.clone(),
        )
        .map_err(|e| StartError(format!("building the Conductor client failed: {e}")))?
        .with_trace_context(Arc::new(crate::trace::current_traceparent)),
    );
    let lakefs = workspace.as_ref().map(|parts| &parts.lakefs);
    let (task_def, lakefs) = tokio::join!(
        require_task_def(&conductor, &contract.task_name),
        check_lakefs_certificate(lakefs),
    );
    task_def?;
    lakefs?;
    let workspace = match (workspace, &checked.lakefs) {
        (Some(parts), Some(l)) => Some(parts.with_data_path(l).await?),
        (parts, _) => parts,
    };

    let hub = RunnerHub::new(contract.slots, Arc::clone(&metrics));
    let socket = work_dir.join(SOCKET_NAME);
    let listener = runner::bind(&socket)
        .map_err(|e| StartError(format!("listening on {} failed: {e}", socket.display())))?;
    tokio::spawn(Arc::clone(&hub).serve(listener));
    let http = crate::http::serve(
        settings.http_addr,
        Arc::clone(&metrics),
        Arc::clone(&hub),
        stop.clone(),
        checked.poll_wait + crate::http::POLLS_WAIT_MARGIN,
    )
    .await
    .map_err(|e| StartError(format!("listening on {} failed: {e}", settings.http_addr)))?;
    info!(
        task_name = %contract.task_name,
        worker_id = %checked.worker_id,
        slots = contract.slots,
        socket = %socket.display(),
        http = %http,
        conductor = %checked.conductor_url,
        "sidecar started"
    );
    let exporter = start_exporter(&checked, &metrics)?;
    let tracer = match checked.traces.clone() {
        None => None,
        Some(config) => {
            let endpoint = config.endpoint.clone();
            let tracer = Tracer::start(config, &checked.instance_id, metrics.traces.clone())
                .map_err(|e| StartError(format!("building the OTLP trace exporter failed: {e}")))?;
            info!(endpoint = %endpoint, "exporting a trace of every attempt over OTLP");
            Some(tracer)
        }
    };
    let lineage = match checked.openlineage.clone() {
        None => None,
        Some(config) => {
            let lakefs_endpoint = workspace
                .as_ref()
                .and(checked.lakefs.as_ref())
                .map(|l| l.endpoint.as_str());
            let sender = OpenLineage::start(
                config,
                &contract.task_name,
                lakefs_endpoint,
                metrics.openlineage.clone(),
            )
            .map_err(|e| StartError(format!("building the OpenLineage client failed: {e}")))?;
            Some(Arc::new(sender))
        }
    };
    let runtime = match workspace {
        None => TaskRuntime::WorkspaceFree,
        Some(parts) => {
            let lineage =
                LineageSource::new(pod_facts(settings), &contract_text(&settings.contract)?);
            parts.runtime(&contract.task_name, &conductor, &metrics, lineage)
        }
    };
    let instance_id = checked.instance_id.clone();
    let broker = Arc::new(Broker {
        contract,
        schemas,
        conductor,
        hub,
        metrics: Arc::clone(&metrics),
        settings: checked,
        work_dir,
        runtime,
        tracer,
        lineage,
    });
    Arc::clone(&broker).run(stop).await;
    if let Some(tracer) = &broker.tracer {
        // The last attempts' traces, each request within the export timeout.
        tracer.shutdown().await;
    }
    if let Some(lineage) = &broker.lineage {
        // The last attempts' run events, for at most twice the request timeout.
        lineage.shutdown().await;
    }
    if let Some((exporter, task)) = exporter {
        // A last export, so the final attempts are not lost with the process.
        task.abort();
        exporter
            .export(&otlp::request(
                &metrics.otlp_families(),
                &instance_id,
                *STARTED,
                SystemTime::now(),
            ))
            .await;
    }
    Ok(())
}

/// What a workspace task needs besides Conductor and the metrics: the sweep and the
/// hard-fence watch are added by [`WorkspaceParts::runtime`] once those exist.
struct WorkspaceParts {
    spec: ContractWorkspace,
    lakefs: LakeFsClient,
    limits: TransferLimits,
    sweep_period: Option<Duration>,
    gone_after: Duration,
}

/// The lakeFS client and limits of a workspace task (`None` for a workspace-free one).
fn workspace_parts(
    contract: &TaskContract,
    checked: &RuntimeSettings,
) -> Result<Option<WorkspaceParts>, StartError> {
    let (spec, l) = match (&contract.workspace, &checked.lakefs) {
        (None, _) => return Ok(None),
        (Some(_), None) => {
            return Err(StartError(
                "LakeFS config is required for workspace tasks".into(),
            ));
        }
        (Some(spec), Some(l)) => (spec, l),
    };
    let lakefs = LakeFsClient::with_tls(
        &l.endpoint,
        &l.access_key_id,
        &l.secret_access_key,
        l.timeout,
        l.tls.clone(),
    )
    .map_err(|e| StartError(format!("building the lakeFS client failed: {e}")))?
    .with_trace_context(Arc::new(crate::trace::current_traceparent));
    // A publish budget bounds the merge; otherwise the sidecar's default does.
    let merge_timeout = contract
        .publish_budget
        .as_ref()
        .and_then(|b| u64::try_from(b.lakefs_merge_timeout_seconds).ok())
        .map_or(l.merge_timeout, Duration::from_secs);
    Ok(Some(WorkspaceParts {
        spec: spec.clone(),
        lakefs,
        limits: TransferLimits {
            fault: l.fault,
            parallelism: l.parallelism,
            object_timeout: l.transfer_timeout,
            merge_timeout,
        },
        sweep_period: l.staging_sweep,
        gone_after: l.staging_gone_after,
    }))
}

impl WorkspaceParts {
    /// Choose how object bytes travel. `presigned` is checked at start: a lakeFS that cannot
    /// presign, no allowed hosts, or no answer from lakeFS stops the sidecar here, not at the
    /// first attempt. `auto` with hosts asks lakeFS too, and when lakeFS does not answer it
    /// starts on the proxied path and asks again in the background (both paths are correct,
    /// so a pod keeps working through a lakeFS outage at its start).
    async fn with_data_path(self, l: &LakeFsSettings) -> Result<Self, StartError> {
        if l.data_path == DataPath::Proxied
            || (l.data_path == DataPath::Auto && l.object_store_hosts.is_empty())
        {
            info!(data_path = "proxied", "object bytes go through lakeFS");
            return Ok(self);
        }
        match self.lakefs.storage_config().await {
            Ok(storage) => {
                let chosen = l
                    .data_path
                    .choose(&l.object_store_hosts, &storage)
                    .map_err(|e| StartError(e.to_string()))?;
                take_data_path(&self.lakefs, chosen, &storage, &l.object_store_hosts);
            }
            Err(e) if l.data_path == DataPath::Presigned => {
                return Err(StartError(format!(
                    "checking that lakeFS can presign (PERAGO_LAKEFS_DATA_PATH=presigned) failed: {e}"
                )));
            }
            Err(e) => {
                warn!(error = %e, "lakeFS did not say whether it can presign; object bytes go through lakeFS until it does");
                let (lakefs, hosts) = (self.lakefs.clone(), l.object_store_hosts.clone());
                tokio::spawn(async move {
                    let mut delay = Duration::from_secs(1);
                    loop {
                        tokio::time::sleep(delay).await;
                        if let Ok(storage) = lakefs.storage_config().await {
                            if let Ok(chosen) = DataPath::Auto.choose(&hosts, &storage) {
                                take_data_path(&lakefs, chosen, &storage, &hosts);
                            }
                            return;
                        }
                        delay = (delay * 2).min(Duration::from_secs(60));
                    }
                });
            }
        }
        Ok(self)
    }

    /// The workspace runtime, with the staging sweep started and the hard-fence watch made
    /// for tasks that publish (only they make staging branches and need the fence).
    fn runtime(
        self,
        task_name: &str,
        conductor: &Arc<ConductorClient>,
        metrics: &Metrics,
        lineage: LineageSource,
    ) -> TaskRuntime {
        let writable = !self.spec.read_only;
        let staging_sweep = self.sweep_period.filter(|_| writable).map(|period| {
            let sweep = StagingSweep::new(task_name, period, self.gone_after);
            tokio::spawn(Arc::clone(&sweep).run(
                self.lakefs.clone(),
                Arc::clone(conductor),
                metrics.staging_branches_swept.clone(),
            ));
            sweep
        });
        let hard_fence = writable.then(|| {
            HardFenceWatch::new(self.lakefs.clone(), metrics.hard_fence_installed.clone())
        });
        TaskRuntime::Workspace(Box::new(WorkspaceRuntime {
            spec: self.spec,
            lakefs: self.lakefs,
            limits: self.limits,
            staging_sweep,
            hard_fence,
            lineage,
        }))
    }
}

/// Put the client on the chosen data path, saying which.
fn take_data_path(
    lakefs: &LakeFsClient,
    chosen: Chosen,
    storage: &StorageConfig,
    hosts: &ObjectStoreHosts,
) {
    match chosen {
        Chosen::Presigned => {
            info!(data_path = "presigned", blockstore = %storage.blockstore_type,
                "object bytes go straight to the object store through presigned URLs");
            lakefs.go_direct(hosts.clone());
        }
        Chosen::Proxied(why) => {
            let reason = why.map(|w| w.to_string()).unwrap_or_default();
            info!(
                data_path = "proxied",
                reason = reason.as_str(),
                "object bytes go through lakeFS"
            );
        }
    }
}

/// Make the work volume's directory and remove the execution directories an earlier sidecar
/// of this pod left.
fn prepare_work_dir(work_dir: &Path) -> Result<(), StartError> {
    let unwritable =
        |e: std::io::Error| StartError(format!("{} is not writable: {e}", work_dir.display()));
    std::fs::create_dir_all(work_dir).map_err(unwritable)?;
    let swept = execution::sweep(work_dir).map_err(unwritable)?;
    info!(
        removed_count = swept,
        "swept abandoned attempt workspaces at startup"
    );
    Ok(())
}

/// The task's TaskDef must be registered before the sidecar polls for it.
async fn require_task_def(conductor: &ConductorClient, task_name: &str) -> Result<(), StartError> {
    match conductor.task_def(task_name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(StartError(format!(
            "Conductor TaskDef '{task_name}' is not registered; run perago extract and register it before start"
        ))),
        // The client's errors leave the URL out; a certificate or address problem needs it.
        Err(e) => {
            let presented = match e.is_certificate_refused() {
                true => presented(conductor.client_certificate(), "conductor", "CONDUCTOR"),
                false => String::new(),
            };
            Err(StartError(format!(
                "failed to validate Conductor TaskDef: {e} (Conductor {}){presented}",
                conductor.base_url()
            )))
        }
    }
}

/// A gateway in front of lakeFS that refuses this pod's client certificate, or wants one and
/// gets none, stops the start as one in front of Conductor does. Nothing else does: a pod
/// keeps working through a lakeFS outage at its start, so lakeFS not answering within 5 s is
/// no error here.
async fn check_lakefs_certificate(lakefs: Option<&LakeFsClient>) -> Result<(), StartError> {
    let Some(lakefs) = lakefs else {
        return Ok(());
    };
    match tokio::time::timeout(Duration::from_secs(5), lakefs.storage_config()).await {
        Ok(Err(e)) if e.is_certificate_refused() => Err(StartError(format!(
            "{e}{}",
            presented(lakefs.client_certificate(), "lakefs", "LAKEFS")
        ))),
        _ => Ok(()),
    }
}

/// What the start error of a refused client certificate adds: the certificate presented, or
/// where to set one for the server `spec` (`conductor`, `lakefs`; `variable` in capitals).
fn presented(
    certificate: Option<perago_contract::trust::ClientCertificate>,
    spec: &str,
    variable: &str,
) -> String {
    match certificate {
        Some(c) => format!("; presented the client certificate {}", c.describe()),
        None => format!(
            "; no client certificate is set (spec.{spec}.tls.clientCertificateRef, \
             PERAGO_{variable}_CLIENT_CERT_FILE)"
        ),
    }
}

/// The OTLP exporter and the task that exports every interval.
type Export = (Arc<Exporter>, tokio::task::JoinHandle<()>);

/// The OTLP export of the task metrics, when configured.
fn start_exporter(
    checked: &RuntimeSettings,
    metrics: &Arc<Metrics>,
) -> Result<Option<Export>, StartError> {
    let Some(config) = checked.otlp.clone() else {
        return Ok(None);
    };
    let endpoint = config.endpoint.clone();
    let exporter = Arc::new(
        Exporter::new(config)
            .map_err(|e| StartError(format!("building the OTLP exporter failed: {e}")))?,
    );
    let task = tokio::spawn(export_periodically(
        Arc::clone(&exporter),
        Arc::clone(metrics),
        checked.instance_id.clone(),
    ));
    info!(endpoint = %endpoint, interval_ms = exporter.interval().as_millis() as u64, "exporting task metrics over OTLP");
    Ok(Some((exporter, task)))
}

static STARTED: std::sync::LazyLock<SystemTime> = std::sync::LazyLock::new(SystemTime::now);

async fn export_periodically(exporter: Arc<Exporter>, metrics: Arc<Metrics>, instance_id: String) {
    let start = *STARTED;
    let mut ticks = tokio::time::interval_at(
        tokio::time::Instant::now() + exporter.interval(),
        exporter.interval(),
    );
    // An export slower than the interval skips the ticks it missed rather than bunching them.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        exporter
            .export(&otlp::request(
                &metrics.otlp_families(),
                &instance_id,
                start,
                SystemTime::now(),
            ))
            .await;
    }
}

/// Local mode: the sidecar plus `perago-runner -- <command>` as a child process, restarted
/// with back-off when it dies (as the kubelet restarts a container).
pub async fn run_local(
    settings: &Settings,
    runner_path: Option<PathBuf>,
    command: Vec<String>,
) -> Result<(), StartError> {
    let runner_path = match runner_path {
        Some(p) => p,
        None => std::env::current_exe()
            .map_err(|e| StartError(format!("locating perago-runner failed: {e}")))?
            .with_file_name("perago-runner"),
    };
    if !runner_path.is_file() {
        return Err(StartError(format!(
            "perago-runner not found at {}",
            runner_path.display()
        )));
    }
    let stop = stop_on_signals()?;
    let (runner_stop_tx, runner_stop) = watch::channel(false);
    let socket = settings.work_dir.join(SOCKET_NAME);
    let supervisor = tokio::spawn(supervise_runner(runner_path, socket, command, runner_stop));
    let result = run(settings, stop).await;
    let _ = runner_stop_tx.send(true);
    let _ = supervisor.await;
    result
}

async fn supervise_runner(
    path: PathBuf,
    socket: PathBuf,
    command: Vec<String>,
    mut stop: watch::Receiver<bool>,
) {
    let mut restarts = crate::retry::runner_restarts();
    loop {
        let child = Command::new(&path)
            .arg("--socket")
            .arg(&socket)
            .arg("--")
            .args(&command)
            .kill_on_drop(true)
            .spawn();
        let mut child: Child = match child {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, runner = %path.display(), "starting perago-runner failed");
                return;
            }
        };
        info!(runner_pid = child.id(), "perago-runner started");
        let exited = tokio::select! {
            status = child.wait() => Some(status),
            _ = stop.wait_for(|s| *s) => None,
        };
        match exited {
            Some(status) => {
                let delay = restarts.next().unwrap_or(Duration::from_secs(30));
                warn!(status = ?status.ok(), restart_in_s = delay.as_secs(), "perago-runner exited; restarting");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
            None => {
                if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                if tokio::time::timeout(Duration::from_secs(10), child.wait())
                    .await
                    .is_err()
                {
                    let _ = child.kill().await;
                }
                return;
            }
        }
    }
}
