//! One workspace attempt, in the seeds' order:
//!
//! download → pre guardrails → body → result → post guardrails → change detection →
//! attempt fence 1 → publish fence (choose the base) → stage (Try) on that base →
//! attempt fence 2 → head still equals the base → squash merge (Confirm) → cleanup (Cancel).
//!
//! Read-only tasks stop after the post guardrails and complete with the input ref. A writable
//! attempt that changed nothing completes with the input ref when the head is still the input
//! ref, and never creates an empty commit. Every writable completion (merged, on an earlier
//! publication of the step that already holds the workspace, or no-op) removes the staging
//! branches earlier attempts of the step left behind.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tracing::{info, warn};

use perago_api::contract::ContractWorkspace;

use crate::attempt::AttemptSnapshot;
use crate::conductor::ConductorClient;
use crate::execution::{self, ExecutionDir, Run};
use crate::lakefs::{LakeFsClient, LakeFsError};
use crate::outcome::Outcome;
use crate::protocol::files;
use crate::workspace::input::WorkspaceRef;
use crate::workspace::publish::{self, PublishBase};
use crate::workspace::{download, guardrails, snapshot};

/// The lakeFS side of the runtime's settings.
pub struct Transfers {
    /// Testing only: the crash point to exit at (see `PERAGO_FAULT`).
    pub fault: Option<String>,
    pub parallelism: usize,
    pub object_timeout: Duration,
    pub merge_timeout: Duration,
}

pub struct WorkspaceAttempt<'a> {
    pub lakefs: &'a LakeFsClient,
    pub conductor: &'a ConductorClient,
    pub spec: &'a ContractWorkspace,
    pub transfers: &'a Transfers,
    /// The Conductor worker id the attempt was polled with.
    pub worker_id: &'a str,
    /// The shared work volume (for the test-only pause point).
    pub work_dir: &'a Path,
}

/// Exit at once if this crash point was asked for (tests of what a crash leaves behind).
fn crash_point(transfers: &Transfers, point: &str) {
    if transfers.fault.as_deref() == Some(point) {
        tracing::error!(point, "fault injected: exiting without cleanup or report");
        std::process::exit(86);
    }
}

/// Hold until the marker file is removed (tests of the window between fence and merge).
async fn pause_point(transfers: &Transfers, point: &str, work_dir: &Path) {
    if transfers.fault.as_deref() != Some(point) {
        return;
    }
    let marker = work_dir.join("paused-before-merge");
    if std::fs::write(&marker, b"").is_err() {
        return;
    }
    tracing::warn!(
        point,
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

fn completed(ws: &WorkspaceRef, result: Value) -> Outcome {
    let mut output = Map::new();
    output.insert("workspace".into(), ws.to_value());
    output.insert("result".into(), result);
    Outcome::Completed(output)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("a workspace scan stopped: {e}"))?
        .map_err(|e| format!("reading the workspace failed: {e}"))
}

impl WorkspaceAttempt<'_> {
    /// The attempt fence: a fresh read of the task must show it still ours and running.
    /// Stricter than the seeds by the worker id and poll count (Conductor can lease one task
    /// id twice).
    async fn attempt_fence(&self, polled: &AttemptSnapshot) -> Result<(), String> {
        let fresh = self
            .conductor
            .task(&polled.task_id)
            .await
            .map_err(|e| format!("broker failed to reload attempt {}: {e}", polled.task_id))?;
        let fresh = AttemptSnapshot::from_task(&fresh)
            .map_err(|e| format!("broker failed to reload attempt {}: {e}", polled.task_id))?;
        let same = fresh.status == "IN_PROGRESS"
            && fresh.workflow_instance_id == polled.workflow_instance_id
            && fresh.task_id == polled.task_id
            && fresh.retry_count == polled.retry_count
            && fresh.worker_id.as_deref() == Some(self.worker_id)
            && (polled.poll_count.is_none() || fresh.poll_count == polled.poll_count);
        if same {
            Ok(())
        } else {
            info!(phase = "fence", status = %fresh.status, "stale attempt");
            Err(polled.task_id.clone())
        }
    }

    /// Remove the staging branches earlier attempts of this step left behind (a pod that died
    /// between stage or merge and cleanup), but `ours`. Runs on every path a writable attempt
    /// completes on: after its merge, when the base (an earlier publication of the step)
    /// already holds its workspace, and on a no-op. By then the attempt fence has shown this
    /// attempt current, so the earlier ones are over.
    async fn sweep_leftovers(
        &self,
        ws: &WorkspaceRef,
        snapshot: &AttemptSnapshot,
        ours: Option<&str>,
    ) {
        let removed =
            publish::sweep_step_branches(self.lakefs, &ws.repository, snapshot, ours).await;
        if removed > 0 {
            info!(
                removed_count = removed,
                "removed staging branches earlier attempts of this step left behind"
            );
        }
    }

    /// Run one phase's guardrails off the async runtime (they walk the whole tree).
    async fn guardrails(&self, phase: &'static str, root: &Path) -> Result<(), String> {
        let list = if phase == "pre" {
            &self.spec.pre
        } else {
            &self.spec.post
        };
        if list.is_empty() {
            return Ok(());
        }
        let (list, root) = (list.clone(), root.to_owned());
        tokio::task::spawn_blocking(move || guardrails::check(phase, &list, &root))
            .await
            .map_err(|e| format!("{phase} guardrails stopped: {e}"))?
    }

    /// Run the attempt; the outcome carries `{workspace, result}` on success.
    pub async fn run(
        &self,
        run: &mut Run<'_>,
        snapshot: &AttemptSnapshot,
        dir: &ExecutionDir,
        ws: &WorkspaceRef,
        params: &Value,
    ) -> Outcome {
        let root = dir.file(files::WORKSPACE);
        if let Err(e) = tokio::fs::create_dir(&root).await {
            return Outcome::failed(format!(
                "creating {} failed: {e}",
                crate::outcome::clip_path(&root)
            ));
        }
        let prefix = self.spec.prefix.as_str();

        // Download the input ref.
        let started = Instant::now();
        let downloaded = download::download(
            self.lakefs,
            &ws.repository,
            &ws.reference,
            prefix,
            &root,
            self.transfers.parallelism,
            self.transfers.object_timeout,
        )
        .await;
        let seconds = started.elapsed().as_secs_f64();
        run.metrics.observe_phase("download", started);
        let manifest = match downloaded {
            Ok(m) => {
                run.metrics
                    .record_workspace_io("download", seconds, Some(m.bytes()));
                m
            }
            Err(e) => {
                run.metrics.record_workspace_io("download", seconds, None);
                return Outcome::Failed(e);
            }
        };
        info!(
            phase = "download",
            objects = manifest.objects.len(),
            bytes = manifest.bytes(),
            seconds,
            "workspace downloaded"
        );

        if let Err(e) = self.guardrails("pre", &root).await {
            return Outcome::Terminal(e);
        }
        let before = if self.spec.read_only {
            None
        } else {
            let r = root.clone();
            match blocking(move || snapshot::take(&r)).await {
                Ok(s) => Some(s),
                Err(e) => return Outcome::Failed(e),
            }
        };

        let result = match execution::run_body(run, snapshot, dir, params, Some(&root)).await {
            Ok(r) => r,
            Err(outcome) => return outcome,
        };
        if let Err(e) = self.guardrails("post", &root).await {
            return Outcome::Failed(e);
        }
        crash_point(self.transfers, "exit-after-body");
        let Some(before) = before else {
            return completed(ws, result);
        };

        let r = root.clone();
        let after = match blocking(move || snapshot::take(&r)).await {
            Ok(s) => s,
            Err(e) => return Outcome::Failed(e),
        };
        let changed = after != before;
        let fencing = Instant::now();
        if let Err(reason) = self.attempt_fence(snapshot).await {
            run.metrics.observe_phase("fence", fencing);
            return Outcome::Failed(reason);
        }
        let logical_key = snapshot.logical_task_key();
        let fenced = publish::publish_fence(self.lakefs, ws, &logical_key).await;
        run.metrics.observe_phase("fence", fencing);
        let base = match fenced {
            Ok(b) => b,
            // Nothing to publish and the branch is no longer where the input was: the
            // reference's no-op refusal, naming the head.
            Err(e) if !changed => {
                let reason = match self.lakefs.branch_head(&ws.repository, &ws.branch).await {
                    Ok(head) => format!(
                        "{} cannot complete no-op from input ref {}; current head is {head}",
                        ws.branch, ws.reference
                    ),
                    Err(_) => e,
                };
                return Outcome::Failed(reason);
            }
            Err(e) => return Outcome::Failed(e),
        };
        if !changed && base.supersedes.is_none() {
            info!(
                phase = "publish",
                "workspace unchanged; completing with the input ref"
            );
            self.sweep_leftovers(ws, snapshot, None).await;
            return completed(ws, result);
        }
        let mut staging = Staging { branch: None };
        let publishing = Instant::now();
        let outcome = self
            .publish(
                run,
                snapshot,
                ws,
                &root,
                &after,
                &base,
                result,
                &mut staging,
            )
            .await;
        staging.cleanup(self.lakefs, &ws.repository).await;
        run.metrics.observe_phase("publish", publishing);
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    async fn publish(
        &self,
        run: &mut Run<'_>,
        snapshot: &AttemptSnapshot,
        ws: &WorkspaceRef,
        root: &Path,
        workspace: &snapshot::Snapshot,
        base: &PublishBase,
        result: Value,
        staging: &mut Staging,
    ) -> Outcome {
        let prefix = self.spec.prefix.as_str();
        let started = Instant::now();
        let base_objects =
            match publish::base_objects(self.lakefs, &ws.repository, &base.base, prefix).await {
                Ok(o) => o,
                Err(e) => return Outcome::Failed(e),
            };
        let plan = match publish::plan(workspace, &base_objects, prefix) {
            Ok(p) => p,
            Err(e) => return Outcome::Failed(e),
        };
        if plan.uploads.is_empty() && plan.deletes.is_empty() {
            // The base (an earlier publication of this step) already holds exactly this
            // workspace: nothing to stage, nothing to merge.
            info!(phase = "publish", base = %base.base, "the base already holds this workspace");
            self.sweep_leftovers(ws, snapshot, None).await;
            return completed(&ws.at(&base.base), result);
        }
        let branch = publish::staging_branch(snapshot, run.execution_id);
        if let Err(e) = self
            .lakefs
            .create_branch(&ws.repository, &branch, &base.base)
            .await
        {
            return Outcome::Failed(e.to_string());
        }
        staging.branch = Some(branch.clone());
        let try_metadata = publish::try_metadata(snapshot, ws, prefix);
        let applied = publish::apply(
            self.lakefs,
            &ws.repository,
            &branch,
            &plan,
            root,
            self.transfers.parallelism,
            self.transfers.object_timeout,
        )
        .await;
        if let Err(e) = applied {
            run.metrics
                .record_workspace_io("upload", started.elapsed().as_secs_f64(), None);
            return Outcome::Failed(e);
        }
        let staging_commit = match self
            .lakefs
            .commit(&ws.repository, &branch, "perago try", &try_metadata)
            .await
        {
            Ok(c) => c.id,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        let total: u64 = workspace.iter().map(|i| i.size).sum();
        run.metrics
            .record_workspace_io("upload", started.elapsed().as_secs_f64(), Some(total));
        info!(
            phase = "stage",
            staging_branch = %branch,
            staging_commit = %staging_commit,
            uploads = plan.uploads.len(),
            deletes = plan.deletes.len(),
            upload_bytes = plan.upload_bytes,
            "workspace staged"
        );

        crash_point(self.transfers, "exit-after-stage");
        if let Err(reason) = self.attempt_fence(snapshot).await {
            return Outcome::Failed(reason);
        }
        let started = Instant::now();
        match self.lakefs.branch_head(&ws.repository, &ws.branch).await {
            Ok(head) if head == base.base => {}
            Ok(head) => {
                return Outcome::Failed(format!(
                    "{} advanced from {} to {head}",
                    ws.branch, ws.reference
                ));
            }
            Err(e) => return Outcome::Failed(e.to_string()),
        }
        pause_point(self.transfers, "pause-before-merge", self.work_dir).await;
        let confirm = publish::confirm_metadata(&try_metadata, &branch, &staging_commit, base);
        // A merge lakeFS refused without merging is tried again while the merge budget lasts;
        // any other failure ends the attempt (an uncertain one is left to the next fence).
        let deadline = Instant::now() + self.transfers.merge_timeout;
        let mut pause = Duration::from_millis(100);
        let merged = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let merged = self
                .lakefs
                .squash_merge(
                    &ws.repository,
                    &branch,
                    &ws.branch,
                    &confirm,
                    left.max(Duration::from_secs(1)),
                )
                .await;
            match merged.as_ref().err().and_then(LakeFsError::merge_refused) {
                Some(status) if Instant::now() + pause < deadline => {
                    run.metrics
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
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                _ => break merged,
            }
        };
        run.metrics
            .record_workspace_io("publish", started.elapsed().as_secs_f64(), None);
        match merged {
            Ok(reference) => {
                crash_point(self.transfers, "exit-after-merge");
                self.sweep_leftovers(ws, snapshot, Some(&branch)).await;
                info!(phase = "publish", reference = %reference, supersedes = base.supersedes.as_deref().unwrap_or(""), "workspace published");
                completed(&ws.at(&reference), result)
            }
            Err(e) => {
                if e.outcome_uncertain() {
                    warn!(phase = "publish", error = %e, staging_commit = %staging_commit,
                        "the merge outcome is uncertain; the next attempt's publish fence classifies the branch");
                }
                Outcome::Failed(e.to_string())
            }
        }
    }
}

/// The staging branch of an attempt, deleted whenever it was created.
struct Staging {
    branch: Option<String>,
}

impl Staging {
    async fn cleanup(&self, lakefs: &LakeFsClient, repository: &str) {
        if let Some(branch) = &self.branch
            && let Err(e) = lakefs.delete_branch(repository, branch).await
        {
            warn!(staging_branch = %branch, error = %e, "failed to clean staging workspace");
        }
    }
}
