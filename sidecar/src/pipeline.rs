//! One attempt, in the order of docs/design.md#the-attempt-in-order: [`Attempt::run`] and
//! [`Attempt::transaction`] are the whole of it, and each step is a short method below them.
//!
//! accept input → execution directory → download → pre guardrails → snapshot → body →
//! result → post guardrails → (read-only exit) → change detection → attempt fence → publish
//! fence → (no-op exit) → stage → attempt fence → head check → merge; then, whatever
//! happened, the staging branch and the execution directory are removed. The broker reports
//! the outcome and only then sweeps the staging branches earlier attempts of the step left
//! behind, so the sweep never delays COMPLETED.
//!
//! The publish fence runs before staging, so that the try is staged on the base the merge
//! will use (ADR 0004). Read-only tasks stop after the post guardrails and complete with the
//! input ref; a writable attempt that changed nothing completes with the input ref when the
//! head is still the input ref, and never makes an empty commit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use backon::Retryable;

use serde_json::{Map, Value};
use tokio::sync::watch;
use tracing::{info, warn};

use perago_lakefs::{LakeFsError, MergeOutcome};
use perago_workspace::attempt::AttemptSnapshot;
use perago_workspace::publication::{Confirmation, Publication};
use perago_workspace::reference::WorkspaceRef;
use perago_workspace::refusal::FenceRefusal;
use perago_workspace::staging::StagingBranch;

use crate::broker::{Broker, TaskRuntime};
use crate::config::FaultPoint;
use crate::execution::{self, Dispatch, ExecutionDir};
use crate::failure::{AttemptError, FileError, LocalError};
use crate::input;
use crate::openlineage::{RunEnd, RunEvents};
use crate::runner::Lease;
use crate::trace::AttemptTrace;
use crate::workspace::download::{self, Manifest};
use crate::workspace::guardrails::GuardrailError;
use crate::workspace::publish::{self, FenceError, PublishBase, StageError};
use crate::workspace::snapshot::{self, Baseline, Item, Snapshot};
use crate::workspace::{WorkspaceRuntime, guardrails};
use perago_contract::protocol::files;

/// What a completed attempt reports, and the sweep that follows the report.
pub struct Completion {
    pub output: Map<String, Value>,
    pub sweep: Option<Sweep>,
}

/// Staging branches of earlier attempts of the step to remove after the report: every
/// writable completion has shown, through the attempt fence, that this attempt is the current
/// one, so the earlier ones are over.
pub struct Sweep {
    pub repository: String,
    /// This attempt's own staging branch, which cleanup has already deleted.
    pub ours: Option<String>,
}

/// The accepted input of an attempt.
enum Accepted<'a> {
    WorkspaceFree {
        params: Value,
    },
    Workspace {
        params: Value,
        ws: WorkspaceRef,
        runtime: &'a WorkspaceRuntime,
    },
}

/// The try commit on the staging branch.
struct Staged {
    branch: String,
    commit: String,
    publication: Publication,
}

pub struct Attempt<'a> {
    pub broker: &'a Broker,
    pub snapshot: &'a AttemptSnapshot,
    pub execution_id: &'a str,
    pub lease: Lease,
    /// Turns true when the sidecar gives up on in-flight work (shutdown grace over).
    pub abandon: watch::Receiver<bool>,
    /// The attempt's phases, for its trace.
    pub trace: &'a AttemptTrace,
    /// The attempt's OpenLineage run events.
    pub lineage: &'a RunEvents,
}

impl Attempt<'_> {
    /// The attempt, then its last run event: COMPLETE naming what it published, or FAIL
    /// saying why (queued, never waited on).
    pub async fn run(&self) -> Result<Completion, AttemptError> {
        let completion = self.attempt().await;
        let prefix = match &self.broker.runtime {
            TaskRuntime::Workspace(rt) => rt.spec.prefix.as_str(),
            TaskRuntime::WorkspaceFree => "/",
        };
        match &completion {
            Ok(c) => {
                let published = c
                    .output
                    .get("workspace")
                    .and_then(|v| WorkspaceRef::parse(v).ok());
                self.lineage.finish(
                    &RunEnd::Completed {
                        published: published.as_ref(),
                    },
                    prefix,
                );
            }
            Err(e) => {
                let mut message = e.to_string();
                let max = self.broker.settings.failure_reason_max_length;
                if let Some((cut, _)) = message.char_indices().nth(max) {
                    message.truncate(cut);
                }
                self.lineage
                    .finish(&RunEnd::Failed { message: &message }, prefix);
            }
        }
        completion
    }

    /// Accept the input, run the transaction in a fresh execution directory, then remove the
    /// staging branch and the directory whatever happened.
    async fn attempt(&self) -> Result<Completion, AttemptError> {
        self.trace.mark("input");
        let (accepted, dir) = self
            .accept_input()
            .and_then(|accepted| Ok((accepted, self.execution_directory()?)))
            .inspect_err(|e| self.failed(e))?;
        let target = match &accepted {
            Accepted::Workspace { ws, runtime, .. } => Some((ws.clone(), *runtime)),
            Accepted::WorkspaceFree { .. } => None,
        };
        let mut staging = None;
        let completion = self.transaction(&dir, accepted, &mut staging).await;
        if let Err(e) = &completion {
            self.failed(e);
        }
        self.trace.mark("cleanup");
        if let (Some((ws, runtime)), Some(branch)) = (&target, &staging) {
            remove_staging_branch(runtime, &ws.repository, branch).await;
        }
        dir.remove().await;
        if let Some((ws, runtime)) = &target {
            if let Some(sweep) = &runtime.staging_sweep {
                sweep.note(&ws.repository);
            }
            if let Some(watch) = &runtime.hard_fence {
                watch.note(&ws.repository, &ws.branch);
            }
        }
        completion
    }

    async fn transaction(
        &self,
        dir: &ExecutionDir,
        accepted: Accepted<'_>,
        staging: &mut Option<String>,
    ) -> Result<Completion, AttemptError> {
        let (params, ws, rt) = match accepted {
            Accepted::WorkspaceFree { params } => {
                self.lineage.start();
                let result = self.body(dir, &params, None).await?;
                return Ok(completion(None, result, None));
            }
            Accepted::Workspace {
                params,
                ws,
                runtime,
            } => (params, ws, runtime),
        };
        self.trace
            .note_attempt("perago.lakefs.repository", &ws.repository);
        self.trace.note_attempt("perago.lakefs.branch", &ws.branch);
        self.trace
            .note_attempt("perago.lakefs.input_ref", &ws.reference);
        self.lineage.input(&ws, &rt.spec.prefix);
        let (root, downloaded) = self.download(rt, dir, &ws).await?;
        self.guardrails(rt, Phase::Pre, &root).await?;
        let before = if rt.spec.read_only {
            None
        } else {
            Some(self.baseline(dir, &root, downloaded).await?)
        };
        self.lineage.start();
        let result = self.body(dir, &params, Some(&root)).await?;
        self.guardrails(rt, Phase::Post, &root).await?;
        crash_point(rt, FaultPoint::ExitAfterBody);
        let Some(before) = before else {
            return Ok(completion(Some(&ws), result, None));
        };
        let (before, mut after) = self.changes(before, &root).await?;
        // An unread file counts as a change until its upload has read it (ADR 0045).
        let changed = after != *before.items();
        let base = self.fences(rt, &ws, &before, &after, &root).await?;
        let sweep = |ours| {
            Some(Sweep {
                repository: ws.repository.clone(),
                ours,
            })
        };
        if !changed && base.supersedes.is_none() {
            info!(
                phase = "publish",
                "workspace unchanged; completing with the input ref"
            );
            return Ok(completion(Some(&ws), result, sweep(None)));
        }
        let _publishing = self.metrics().time_phase("publish");
        let staged = self.stage(rt, &ws, &root, &mut after, &base, staging).await;
        let Some(staged) = staged? else {
            // The base (an earlier publication of this step) already holds exactly this
            // workspace: nothing to stage, nothing to merge.
            info!(phase = "publish", base = %base.base, "the base already holds this workspace");
            return Ok(completion(Some(&ws.at(&base.base)), result, sweep(None)));
        };
        crash_point(rt, FaultPoint::ExitAfterStage);
        self.trace.mark("fence");
        self.attempt_fence().await?;
        let merging = Instant::now();
        self.head_check(rt, &ws, &base).await?;
        pause_point(rt, &self.broker.work_dir).await;
        let merged = self.merge(rt, &ws, &base, &staged).await;
        self.metrics()
            .record_workspace_io("publish", merging.elapsed().as_secs_f64(), None);
        let reference = merged?;
        self.trace.note_attempt("perago.lakefs.commit", &reference);
        crash_point(rt, FaultPoint::ExitAfterMerge);
        info!(phase = "publish", reference = %reference, supersedes = base.supersedes.as_deref().unwrap_or(""), "workspace published");
        Ok(completion(
            Some(&ws.at(&reference)),
            result,
            sweep(Some(staged.branch)),
        ))
    }

    fn metrics(&self) -> &crate::telemetry::Metrics {
        &self.broker.metrics
    }

    /// The current phase of the trace failed with `error`.
    fn failed(&self, error: &AttemptError) {
        self.trace.fail(error.label(), error);
    }

    /// The top-level keys, the workspace object and the params.
    fn accept_input(&self) -> Result<Accepted<'_>, AttemptError> {
        let _timer = self.metrics().time_phase("input");
        let contract = &self.broker.contract;
        let accepted = input::accept(contract, &self.snapshot.input_data).and_then(|accepted| {
            let params = self
                .broker
                .schemas
                .params(accepted.params, contract.strict_params);
            Ok(match &self.broker.runtime {
                TaskRuntime::WorkspaceFree => Accepted::WorkspaceFree { params: params? },
                TaskRuntime::Workspace(runtime) => {
                    // `input::accept` refuses a workspace task's input without `workspace`.
                    let ws = WorkspaceRef::parse(&accepted.workspace.unwrap_or_default())?;
                    Accepted::Workspace {
                        params: params?,
                        ws,
                        runtime,
                    }
                }
            })
        });
        accepted.map_err(|reason| {
            info!(phase = "input", reason = %reason, "input refused");
            AttemptError::Input(reason)
        })
    }

    /// A workspace attempt's own directory, which holds its workspace; a workspace-free
    /// attempt's files in its slot's directory (ADR 0049).
    fn execution_directory(&self) -> Result<ExecutionDir, AttemptError> {
        let (work, id, worker) = (
            &self.broker.work_dir,
            self.execution_id,
            self.slot_worker_id(),
        );
        let dir = match self.broker.runtime {
            TaskRuntime::Workspace(_) => ExecutionDir::create(work, self.snapshot, id, &worker),
            TaskRuntime::WorkspaceFree => ExecutionDir::in_slot(work, self.lease.slot, id, &worker),
        };
        dir.map_err(|e| LocalError::ExecutionDirectory(e).into())
    }

    fn slot_worker_id(&self) -> String {
        format!("{}-{:04}", self.broker.settings.worker_id, self.lease.slot)
    }

    /// Project the input ref into `<dir>/workspace`; what was downloaded.
    async fn download(
        &self,
        rt: &WorkspaceRuntime,
        dir: &ExecutionDir,
        ws: &WorkspaceRef,
    ) -> Result<(PathBuf, Manifest), AttemptError> {
        let root = dir.file(files::WORKSPACE);
        tokio::fs::create_dir(&root)
            .await
            .map_err(|e| LocalError::from(FileError::new("creating", &root, e)))?;
        self.trace.mark("download");
        let _timer = self.metrics().time_phase("download");
        let started = Instant::now();
        let downloaded = download::download(
            &rt.lakefs,
            &ws.repository,
            &ws.reference,
            &rt.spec.prefix,
            &root,
            rt.limits.parallelism,
            rt.limits.object_timeout,
        )
        .await;
        let seconds = started.elapsed().as_secs_f64();
        let manifest = downloaded.map_err(|e| {
            self.metrics()
                .record_workspace_io("download", seconds, None);
            AttemptError::Download(e)
        })?;
        self.metrics()
            .record_workspace_io("download", seconds, Some(manifest.bytes()));
        self.trace
            .note("perago.workspace.objects", manifest.objects.len());
        self.trace.note("perago.workspace.bytes", manifest.bytes());
        info!(
            phase = "download",
            objects = manifest.objects.len(),
            bytes = manifest.bytes(),
            seconds,
            "workspace downloaded"
        );
        Ok((root, manifest))
    }

    /// One phase's guardrails, off the async runtime (they walk the whole tree).
    async fn guardrails(
        &self,
        rt: &WorkspaceRuntime,
        phase: Phase,
        root: &Path,
    ) -> Result<(), AttemptError> {
        let (name, list, error): (_, _, fn(GuardrailError) -> AttemptError) = match phase {
            Phase::Pre => ("pre", &rt.spec.pre, AttemptError::PreGuardrail),
            Phase::Post => ("post", &rt.spec.post, AttemptError::PostGuardrail),
        };
        if list.is_empty() {
            return Ok(());
        }
        let (list, root) = (list.clone(), root.to_owned());
        tokio::task::spawn_blocking(move || guardrails::check(name, &list, &root))
            .await
            .map_err(|e| GuardrailError::Stopped {
                phase: name,
                cause: e.to_string(),
            })
            .and_then(|checked| checked)
            .map_err(error)
    }

    /// The workspace as the body receives it (change detection), off the async runtime.
    async fn baseline(
        &self,
        dir: &ExecutionDir,
        root: &Path,
        downloaded: Manifest,
    ) -> Result<Baseline, AttemptError> {
        let (root, probe) = (root.to_owned(), dir.file(CLOCK_PROBE));
        blocking(move || Baseline::record(&root, &probe, &downloaded)).await
    }

    /// The workspace's files and their checksums after the body, reading only what the
    /// baseline cannot vouch for; large files to be read are left to their uploads.
    async fn changes(
        &self,
        before: Baseline,
        root: &Path,
    ) -> Result<(Baseline, Snapshot), AttemptError> {
        let root = root.to_owned();
        blocking(move || {
            let after = before.after_reading_later(&root, snapshot::READ_LATER_MIN)?;
            Ok((before, after))
        })
        .await
    }

    /// Whether the body left the workspace as it received it, reading the files left unread
    /// (only a refused publication asks before the uploads have read them).
    async fn unchanged(
        &self,
        before: &Baseline,
        after: &Snapshot,
        root: &Path,
    ) -> Result<bool, AttemptError> {
        if !after.iter().any(Item::is_unread) {
            return Ok(after == before.items());
        }
        let (root, mut after, before) = (root.to_owned(), after.clone(), before.items().clone());
        blocking(move || {
            snapshot::read_unread(&root, &mut after)?;
            Ok(after == before)
        })
        .await
    }

    /// Run the body once on the validated params and read its result.
    async fn body(
        &self,
        dir: &ExecutionDir,
        params: &Value,
        workspace: Option<&Path>,
    ) -> Result<Value, AttemptError> {
        let contract = &self.broker.contract;
        let slot_worker_id = self.slot_worker_id();
        let run = Dispatch {
            hub: &self.broker.hub,
            metrics: &self.broker.metrics,
            schemas: &self.broker.schemas,
            lease: self.lease,
            execution_id: self.execution_id,
            slot_worker_id: &slot_worker_id,
            task_name: &contract.task_name,
            deadline: u64::try_from(contract.timeout_seconds)
                .ok()
                .filter(|s| *s > 0)
                .map(Duration::from_secs),
            abandon: self.abandon.clone(),
            trace: self.trace,
        };
        execution::run_body(&run, self.snapshot, dir, params, workspace).await
    }

    /// Attempt fence, then publish fence: the attempt must still be Conductor's current one,
    /// and the target's history since the input ref must be explainable. Nothing to publish
    /// from a moved branch is the reference's no-op refusal, naming the head.
    async fn fences(
        &self,
        rt: &WorkspaceRuntime,
        ws: &WorkspaceRef,
        before: &Baseline,
        after: &Snapshot,
        root: &Path,
    ) -> Result<PublishBase, AttemptError> {
        let _timer = self.metrics().time_phase("fence");
        self.trace.mark("fence");
        self.attempt_fence().await?;
        let lakefs = &rt.lakefs;
        match publish::publish_fence(lakefs, ws, &self.snapshot.logical_task_key()).await {
            Ok(base) => Ok(base),
            Err(reason) if self.unchanged(before, after, root).await? => {
                match lakefs.branch_head(&ws.repository, &ws.branch).await {
                    Ok(head) => Err(AttemptError::PublishFence(FenceError::Refused(
                        FenceRefusal::NoOpMoved {
                            branch: ws.branch.clone(),
                            input: ws.reference.clone(),
                            head,
                        },
                    ))),
                    Err(_) => Err(AttemptError::PublishFence(reason)),
                }
            }
            Err(reason) => Err(AttemptError::PublishFence(reason)),
        }
    }

    /// The attempt fence: a fresh read of the task must show it still ours and running.
    /// Also compares the worker id and poll count (Conductor can lease one task id twice;
    /// docs/design.md#attempt-fence).
    async fn attempt_fence(&self) -> Result<(), AttemptError> {
        let polled = self.snapshot;
        let unreadable = |cause: String| {
            AttemptError::AttemptFence(FenceRefusal::Unconfirmed {
                task_id: polled.task_id.clone(),
                cause,
            })
        };
        // Conductor away for a moment (a restart) is waited for, as a report is: the fence
        // only holds the attempt until Conductor can say whether it is still ours.
        let conductor = &self.broker.conductor;
        let fresh = (|| conductor.task(&polled.task_id))
            .retry(crate::retry::report())
            .when(perago_conductor::ConductorError::is_transient)
            .notify(|e, _| warn!(error = %e, "reading the attempt for the attempt fence failed; trying again"))
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        let fresh = AttemptSnapshot::from_task(&fresh).map_err(|e| unreadable(e.to_string()))?;
        if still_current(polled, &fresh, &self.broker.settings.worker_id) {
            Ok(())
        } else {
            info!(phase = "fence", status = %fresh.status, "stale attempt");
            Err(AttemptError::AttemptFence(FenceRefusal::NotCurrent {
                task_id: polled.task_id.clone(),
            }))
        }
    }

    /// Mirror the workspace onto a staging branch made from the base and commit the try.
    /// `None` when the base already holds exactly this workspace. `staging` learns the
    /// branch as soon as it exists, so that cleanup removes it whatever follows.
    async fn stage(
        &self,
        rt: &WorkspaceRuntime,
        ws: &WorkspaceRef,
        root: &Path,
        workspace: &mut Snapshot,
        base: &PublishBase,
        staging: &mut Option<String>,
    ) -> Result<Option<Staged>, AttemptError> {
        self.trace.mark("stage");
        let lakefs = &rt.lakefs;
        let prefix = rt.spec.prefix.as_str();
        let started = Instant::now();
        let base_objects = publish::base_objects(lakefs, &ws.repository, &base.base, prefix)
            .await
            .map_err(StageError::from)?;
        let plan = publish::plan(workspace, &base_objects, prefix)?;
        if plan.is_empty() {
            return Ok(None);
        }
        let branch = StagingBranch::of(self.snapshot, self.execution_id).to_string();
        lakefs
            .create_branch(&ws.repository, &branch, &base.base)
            .await
            .map_err(StageError::from)?;
        *staging = Some(branch.clone());
        let applied = publish::apply(
            lakefs,
            &ws.repository,
            &branch,
            &plan,
            root,
            rt.limits.parallelism,
            rt.limits.object_timeout,
        )
        .await;
        let uploaded = match applied {
            Ok(uploaded) => uploaded,
            Err(e) => {
                self.metrics()
                    .record_workspace_io("upload", started.elapsed().as_secs_f64(), None);
                return Err(StageError::from(e).into());
            }
        };
        if workspace.iter().any(Item::is_unread) {
            publish::read_from_uploads(workspace, &uploaded);
            if workspace.iter().any(Item::is_unread) {
                let (dir, mut read) = (root.to_owned(), std::mem::take(workspace));
                *workspace =
                    blocking(move || snapshot::read_unread(&dir, &mut read).map(|()| read)).await?;
            }
            // Files rewritten with the bytes the base holds: their staged copies are
            // dropped, so the commit is what it would have been had they been read first.
            let settled = publish::plan(workspace, &base_objects, prefix)?;
            if settled.is_empty() {
                return Ok(None);
            }
            let needed: BTreeSet<&String> = settled.uploads.iter().map(|(key, _)| key).collect();
            for (key, _) in plan.uploads.iter().filter(|(key, _)| !needed.contains(key)) {
                lakefs
                    .reset_object(&ws.repository, &branch, key)
                    .await
                    .map_err(StageError::from)?;
            }
        }
        let publication =
            Publication::of_attempt(self.snapshot, ws, prefix, rt.lineage.read().await);
        let commit = lakefs
            .commit(
                &ws.repository,
                &branch,
                "perago try",
                &publication.to_metadata(),
            )
            .await
            .map_err(StageError::from)?
            .id;
        let total: u64 = workspace.iter().map(|i| i.size).sum();
        self.metrics()
            .record_workspace_io("upload", started.elapsed().as_secs_f64(), Some(total));
        self.trace.note("perago.lakefs.staging_branch", &branch);
        self.trace.note("perago.lakefs.staging_commit", &commit);
        self.trace
            .note("perago.workspace.uploads", plan.uploads.len());
        self.trace
            .note("perago.workspace.deletes", plan.deletes.len());
        self.trace
            .note("perago.workspace.upload_bytes", plan.upload_bytes);
        info!(
            phase = "stage",
            staging_branch = %branch,
            staging_commit = %commit,
            uploads = plan.uploads.len(),
            deletes = plan.deletes.len(),
            upload_bytes = plan.upload_bytes,
            "workspace staged"
        );
        Ok(Some(Staged {
            branch,
            commit,
            publication,
        }))
    }

    /// The target head must still be the base the publish fence chose.
    async fn head_check(
        &self,
        rt: &WorkspaceRuntime,
        ws: &WorkspaceRef,
        base: &PublishBase,
    ) -> Result<(), AttemptError> {
        let head = rt
            .lakefs
            .branch_head(&ws.repository, &ws.branch)
            .await
            .map_err(AttemptError::HeadUnreadable)?;
        if head == base.base {
            Ok(())
        } else {
            Err(AttemptError::HeadMoved(FenceRefusal::Advanced {
                branch: ws.branch.clone(),
                input: ws.reference.clone(),
                head,
            }))
        }
    }

    /// Squash-merge the try into the target with the confirm metadata. A merge lakeFS refused
    /// without merging is tried again while the merge budget lasts; any other failure ends
    /// the attempt, and an uncertain one is left to the next attempt's publish fence.
    async fn merge(
        &self,
        rt: &WorkspaceRuntime,
        ws: &WorkspaceRef,
        base: &PublishBase,
        staged: &Staged,
    ) -> Result<String, AttemptError> {
        self.trace.mark("merge");
        let lakefs = &rt.lakefs;
        let confirm = staged
            .publication
            .confirmed(Confirmation {
                staging_branch: staged.branch.clone(),
                staging_commit: staged.commit.clone(),
                expected_head: base.base.clone(),
                supersedes: base.supersedes.clone(),
            })
            .to_metadata();
        let deadline = Instant::now() + rt.limits.merge_timeout;
        let mut pauses = crate::retry::merge_refusals();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let merged = lakefs
                .squash_merge(
                    &ws.repository,
                    &staged.branch,
                    &ws.branch,
                    &confirm,
                    left.max(Duration::from_secs(1)),
                )
                .await;
            let pause = pauses.next().unwrap_or(Duration::from_secs(2));
            match merged.as_ref().err().and_then(LakeFsError::merge_refused) {
                Some(status) if Instant::now() + pause < deadline => {
                    self.metrics()
                        .merge_refusals
                        .with_label_values(&[status.as_str()])
                        .inc();
                    warn!(
                        phase = "publish",
                        status = status.as_u16(),
                        retry_in_ms = pause.as_millis() as u64,
                        "lakeFS refused the merge without merging; trying again within the merge budget"
                    );
                    tokio::time::sleep(pause).await;
                }
                _ => {
                    let error = match merged {
                        Ok(reference) => return Ok(reference),
                        Err(e) => AttemptError::Merge(e),
                    };
                    match error.merge_outcome() {
                        Some(MergeOutcome::Unknown) => {
                            warn!(phase = "publish", error = %error, staging_commit = %staged.commit,
                            "the merge outcome is uncertain; the next attempt's publish fence classifies the branch")
                        }
                        Some(MergeOutcome::Applied) => {
                            warn!(phase = "publish", error = %error, staging_commit = %staged.commit,
                            "lakeFS merged but its answer could not be read; the next attempt's publish fence finds the publication")
                        }
                        _ => {}
                    }
                    return Err(error);
                }
            }
        }
    }
}

/// A workspace scan off the async runtime; a scan that fails or stops is a local failure.
async fn blocking<T: Send + 'static>(
    scan: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, AttemptError> {
    tokio::task::spawn_blocking(scan)
        .await
        .map_err(|e| LocalError::Stopped {
            what: "a workspace scan",
            cause: e.to_string(),
        })?
        .map_err(|e| LocalError::Workspace(e).into())
}

/// Where the change detection's baseline reads the file system's clock: a file of the
/// execution directory, beside the workspace, that exists only for that moment.
const CLOCK_PROBE: &str = "clock-probe";

/// The attempt fence's test: a fresh read of the task (`fresh`) still shows the attempt this
/// worker polled as the running one. The poll count catches Conductor leasing one task id a
/// second time to this same worker (docs/design.md#attempt-fence); a task polled without one
/// is compared without it.
fn still_current(polled: &AttemptSnapshot, fresh: &AttemptSnapshot, worker_id: &str) -> bool {
    fresh.status == perago_conductor::TaskStatus::InProgress
        && fresh.workflow_instance_id == polled.workflow_instance_id
        && fresh.task_id == polled.task_id
        && fresh.retry_count == polled.retry_count
        && fresh.worker_id.as_deref() == Some(worker_id)
        && (polled.poll_count.is_none() || fresh.poll_count == polled.poll_count)
}

/// Cleanup (the cancel phase, docs/design.md#phases): a failure is logged and never changes
/// the outcome. The branch is then removed in the background, tried again for about a minute
/// (a lakeFS outage at this moment should not leave it until the periodic sweep).
async fn remove_staging_branch(rt: &WorkspaceRuntime, repository: &str, branch: &str) {
    let Err(e) = rt.lakefs.delete_branch(repository, branch).await else {
        return;
    };
    warn!(staging_branch = %branch, error = %e, "failed to clean staging workspace; trying again in the background");
    let (lakefs, repository, branch) =
        (rt.lakefs.clone(), repository.to_owned(), branch.to_owned());
    tokio::spawn(async move {
        for delay in [2, 4, 8, 16, 30] {
            tokio::time::sleep(Duration::from_secs(delay)).await;
            match lakefs.delete_branch(&repository, &branch).await {
                Ok(()) => {
                    info!(staging_branch = %branch, "removed the staging workspace on a later try");
                    return;
                }
                Err(e) => {
                    warn!(staging_branch = %branch, error = %e, "failed to clean staging workspace again")
                }
            }
        }
        warn!(staging_branch = %branch, "the staging workspace stays for the periodic sweep");
    });
}

/// Testing only: exit at once if this crash point was asked for (`PERAGO_FAULT`).
fn crash_point(rt: &WorkspaceRuntime, point: FaultPoint) {
    if rt.limits.fault == Some(point) {
        tracing::error!(point = ?point, "fault injected: exiting without cleanup or report");
        std::process::exit(86);
    }
}

/// Testing only: hold until the marker file is removed (the window between the fence and the
/// merge).
async fn pause_point(rt: &WorkspaceRuntime, work_dir: &Path) {
    if rt.limits.fault != Some(FaultPoint::PauseBeforeMerge) {
        return;
    }
    let marker = work_dir.join("paused-before-merge");
    if std::fs::write(&marker, b"").is_err() {
        return;
    }
    warn!(
        point = "pause-before-merge",
        "fault injected: holding until {} is removed",
        marker.display()
    );
    for _ in 0..1200 {
        if !marker.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Clone, Copy)]
enum Phase {
    Pre,
    Post,
}

fn completion(ws: Option<&WorkspaceRef>, result: Value, sweep: Option<Sweep>) -> Completion {
    let mut output = Map::new();
    if let Some(ws) = ws {
        output.insert("workspace".into(), ws.to_value());
    }
    output.insert("result".into(), result);
    Completion { output, sweep }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn polled() -> AttemptSnapshot {
        AttemptSnapshot::from_task(&json!({
            "workflowInstanceId": "wf", "taskId": "t-1", "retryCount": 2, "taskDefName": "d",
            "referenceTaskName": "r", "seq": 1, "status": "IN_PROGRESS", "inputData": {},
            "workerId": "w-1", "pollCount": 1
        }))
        .unwrap()
    }

    #[test]
    fn the_attempt_fence_passes_only_the_attempt_this_worker_still_runs() {
        let now = polled();
        assert!(still_current(&now, &polled(), "w-1"));
        let changed = |change: fn(&mut AttemptSnapshot)| {
            let mut fresh = polled();
            change(&mut fresh);
            still_current(&now, &fresh, "w-1")
        };
        // Timed out, cancelled or completed by someone else.
        assert!(!changed(|f| f.status = "TIMED_OUT".into()));
        assert!(!changed(|f| f.status = "CANCELED".into()));
        // A retry of the step is another attempt.
        assert!(!changed(|f| f.retry_count = 3));
        // Leased to another worker, or to this one a second time.
        assert!(!changed(|f| f.worker_id = Some("w-2".into())));
        assert!(!changed(|f| f.worker_id = None));
        assert!(!changed(|f| f.poll_count = Some(2)));
        assert!(!changed(|f| f.task_id = "t-2".into()));
        assert!(!still_current(&now, &polled(), "w-2"));
        // A task polled without a poll count is compared without it.
        let mut without = polled();
        without.poll_count = None;
        let mut fresh = polled();
        fresh.poll_count = Some(7);
        assert!(still_current(&without, &fresh, "w-1"));
    }
}
