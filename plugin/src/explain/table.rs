//! The explain view as the table `kubectl perago explain` prints.

use super::decide::VerdictKind;
use super::view::{AttemptView, ExplainView, WorkspaceView};
use crate::output::{Table, cell, columns, short};

fn commits(n: usize) -> String {
    if n == 1 {
        "1 commit".into()
    } else {
        format!("{n} commits")
    }
}

impl Table for ExplainView {
    fn table(&self) -> String {
        let mut out = format!(
            "workflow {} ({}): {}\n",
            cell(&self.workflow_id, 80),
            cell(&self.workflow_name, 80),
            cell(&self.status, 40)
        );
        for step in &self.steps {
            let target = step
                .attempts
                .iter()
                .find_map(|a| match &a.record.workspace {
                    WorkspaceView::Valid {
                        repository, branch, ..
                    } => Some(format!(" on {repository}@{branch}")),
                    WorkspaceView::Invalid { .. } => None,
                })
                .unwrap_or_default();
            out.push_str(&format!(
                "\nstep {} ({}){}\n",
                cell(&step.step, 80),
                cell(&step.task_type, 80),
                cell(&target, 200)
            ));
            let rows: Vec<Vec<String>> = step
                .attempts
                .iter()
                .map(|AttemptView { record: a, .. }| {
                    vec![
                        a.attempt.to_string(),
                        cell(a.status.as_str(), 30),
                        cell(&a.task_id, 40),
                        cell(&a.worker_id, 40),
                        a.started.clone().unwrap_or_else(|| "-".into()),
                        a.ended.clone().unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            out.push_str(&columns(
                &["ATTEMPT", "STATUS", "TASK", "WORKER", "STARTED", "ENDED"],
                &rows,
            ));
            for AttemptView { record: a, verdict } in &step.attempts {
                out.push_str(&format!(
                    "  attempt {}: {}\n",
                    a.attempt,
                    cell(&verdict.to_string(), 700)
                ));
                match &a.workspace {
                    WorkspaceView::Valid { input_ref, .. } => {
                        out.push_str(&format!("    input    {}\n", short(input_ref)));
                    }
                    WorkspaceView::Invalid { invalid } => {
                        out.push_str(&format!("    input    {}\n", cell(invalid, 200)));
                    }
                }
                if let Some(o) = &a.output_ref {
                    out.push_str(&format!("    output   {}\n", cell(&short(o), 12)));
                }
                // A verdict of not published quotes the reason already.
                if !a.reason.is_empty() && verdict.kind() != VerdictKind::NotPublished {
                    out.push_str(&format!("    reason   {}\n", cell(&a.reason, 300)));
                }
                if matches!(a.workspace, WorkspaceView::Valid { .. }) && a.note.is_none() {
                    if a.staging.is_empty() {
                        out.push_str("    staging  none left\n");
                    }
                    for s in &a.staging {
                        out.push_str(&format!(
                            "    staging  {} at {}{}\n",
                            s.branch,
                            short(&s.head),
                            if s.try_commit.is_some() {
                                " (its try commit)"
                            } else {
                                " (nothing staged)"
                            }
                        ));
                    }
                }
                if let Some(s) = &a.search {
                    let found = match &s.confirm {
                        Some(c) => format!("{} on {}", short(c), s.branch),
                        None => format!("none on {}", s.branch),
                    };
                    let how = if s.reached_input_ref {
                        format!("{} above the input ref searched", commits(s.searched))
                    } else if s.bounded {
                        format!(
                            "the newest {} searched, the input ref not reached",
                            commits(s.searched)
                        )
                    } else {
                        format!(
                            "{} searched, the input ref is not on the branch",
                            commits(s.searched)
                        )
                    };
                    out.push_str(&format!("    confirm  {found} ({how})\n"));
                }
                if let Some(l) = &a.lineage {
                    out.push_str(&format!("    code     {}\n", l.summary()));
                }
                if let Some(n) = &a.note {
                    out.push_str(&format!("    lakeFS   {}\n", cell(n, 300)));
                }
            }
        }
        if self.needs_attention() {
            out.push_str(
                "\nneeds attention: an attempt above is uncertain or published without a report, and no later attempt will settle it\n",
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use perago_conductor::TaskStatus;

    use super::*;
    use crate::explain::cases::{C, C2, INPUT, TIMED_OUT_MERGE, TRY, attempt};
    use crate::explain::judged;
    use crate::explain::view::{Attempt, StepView, utc};
    use crate::output::{Format, render};

    /// A step whose attempts are given their verdicts as `run` does.
    fn step(name: &str, attempts: Vec<Attempt>) -> StepView {
        StepView {
            step: name.into(),
            task_type: "kx.task".into(),
            attempts: judged(attempts),
        }
    }

    /// An attempt's publication names the code that produced it on a line of its own.
    #[test]
    fn the_code_of_a_publication_is_shown() {
        let mut published = attempt(0, TaskStatus::Completed)
            .confirm(C, INPUT, "")
            .output(C);
        let metadata = std::collections::BTreeMap::from(
            [
                ("perago.phase", "confirm"),
                ("perago.body_image", "registry.local/body:1"),
                (
                    "perago.body_image_id",
                    "registry.local/body@sha256:9f86d081884c7d65",
                ),
                ("perago.peragotask_namespace", "team"),
                ("perago.peragotask_name", "build"),
                ("perago.peragotask_generation", "4"),
                ("perago.contract_hash", "c0ffee"),
                ("perago.sidecar_version", "0.1.0"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        published.lineage = crate::history::LineageView::of(&metadata);
        let view = ExplainView {
            workflow_id: "wf".into(),
            workflow_name: "kx.one".into(),
            status: "COMPLETED".into(),
            steps: vec![step("step", vec![published])],
        };
        let table = view.table();
        assert!(
            table.contains(
                "    code     registry.local/body@sha256:9f86d081884c7d65, PeragoTask team/build \
                 generation 4, contract c0ffee, sidecar 0.1.0\n"
            ),
            "{table}"
        );
        let json = render(&view, Format::Json).unwrap();
        assert!(
            json.contains(r#""digest": "sha256:9f86d081884c7d65""#),
            "{json}"
        );
    }

    /// Two steps: a publication nobody reported that its retry superseded; a failure that
    /// staged, then a merge that timed out with no retry after it.
    fn sample() -> ExplainView {
        let mut crashed = attempt(0, TaskStatus::TimedOut)
            .confirm(C, INPUT, "")
            .superseded(C2, "1")
            .reason("responseTimeout: 2 exceeded")
            .worker("w-0");
        crashed.started = utc(1_000);
        crashed.ended = utc(3_000);
        let retry = attempt(1, TaskStatus::Completed)
            .confirm(C2, C, C)
            .output(C2)
            .staged(TRY);
        let mut staged = attempt(0, TaskStatus::Failed)
            .reason("task body exited with status 3")
            .staged(TRY);
        staged.note = Some("lakeFS get commit: HTTP 404".into());
        let timed_out = attempt(1, TaskStatus::Failed)
            .reason(TIMED_OUT_MERGE)
            .bounded();
        ExplainView {
            workflow_id: "wf".into(),
            workflow_name: "kx.crash".into(),
            status: "FAILED".into(),
            steps: vec![
                step("step", vec![crashed, retry]),
                step("build__2", vec![staged, timed_out]),
            ],
        }
    }

    #[test]
    fn the_view_prints_as_before() {
        let view = sample();
        assert_eq!(
            render(&view, Format::Json).unwrap(),
            r#"{
  "workflow_id": "wf",
  "workflow_name": "kx.crash",
  "status": "FAILED",
  "steps": [
    {
      "step": "step",
      "task_type": "kx.task",
      "attempts": [
        {
          "attempt": 0,
          "task_id": "t-0",
          "status": "TIMED_OUT",
          "reason": "responseTimeout: 2 exceeded",
          "worker_id": "w-0",
          "started": "1970-01-01T00:00:01Z",
          "ended": "1970-01-01T00:00:03Z",
          "workspace": {
            "repository": "r",
            "branch": "main",
            "input_ref": "1npu7000000000000000"
          },
          "staging": [],
          "search": {
            "branch": "main",
            "searched": 1,
            "reached_input_ref": true,
            "bounded": false,
            "confirm": "c0nf1rm00000000000aa",
            "superseded_by": "c0nf1rm22222222222bb"
          },
          "verdict": {
            "kind": "published_not_reported",
            "summary": "published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 superseded it with c0nf1rm22222 (perago.supersedes)",
            "commit": "c0nf1rm00000000000aa",
            "superseded_by": "c0nf1rm22222222222bb",
            "needs_attention": false
          }
        },
        {
          "attempt": 1,
          "task_id": "t-1",
          "status": "COMPLETED",
          "workspace": {
            "repository": "r",
            "branch": "main",
            "input_ref": "1npu7000000000000000"
          },
          "output_ref": "c0nf1rm22222222222bb",
          "staging": [
            {
              "branch": "perago-staging-step-task-id-t-retry-0-e",
              "head": "7ry0000000000000cccc",
              "try_commit": "7ry0000000000000cccc"
            }
          ],
          "search": {
            "branch": "main",
            "searched": 1,
            "reached_input_ref": true,
            "bounded": false,
            "confirm": "c0nf1rm22222222222bb"
          },
          "verdict": {
            "kind": "published_and_reported",
            "summary": "published and reported: c0nf1rm22222 on main, its confirm commit and output ref",
            "commit": "c0nf1rm22222222222bb",
            "needs_attention": false
          }
        }
      ]
    },
    {
      "step": "build__2",
      "task_type": "kx.task",
      "attempts": [
        {
          "attempt": 0,
          "task_id": "t-0",
          "status": "FAILED",
          "reason": "task body exited with status 3",
          "workspace": {
            "repository": "r",
            "branch": "main",
            "input_ref": "1npu7000000000000000"
          },
          "staging": [
            {
              "branch": "perago-staging-step-task-id-t-retry-0-e",
              "head": "7ry0000000000000cccc",
              "try_commit": "7ry0000000000000cccc"
            }
          ],
          "search": {
            "branch": "main",
            "searched": 1,
            "reached_input_ref": true,
            "bounded": false
          },
          "note": "lakeFS get commit: HTTP 404",
          "verdict": {
            "kind": "not_published",
            "summary": "not published: task body exited with status 3; it staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e and never merged",
            "needs_attention": false
          }
        },
        {
          "attempt": 1,
          "task_id": "t-1",
          "status": "FAILED",
          "reason": "lakeFS merge on r@main failed: error sending request: operation timed out",
          "workspace": {
            "repository": "r",
            "branch": "main",
            "input_ref": "1npu7000000000000000"
          },
          "staging": [],
          "search": {
            "branch": "main",
            "searched": 1000,
            "reached_input_ref": false,
            "bounded": true
          },
          "verdict": {
            "kind": "outcome_uncertain",
            "summary": "outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main (only the newest 1000 commits were searched: the input ref is further down); its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: no later attempt will run its publish fence: run explain again (a confirm commit of this task on the branch means the merge landed) and see docs/operations.md, section A merge timed out",
            "needs_attention": true
          }
        }
      ]
    }
  ]
}
"#
        );
        assert_eq!(
            view.table(),
            r#"workflow wf (kx.crash): FAILED

step step (kx.task) on r@main
ATTEMPT  STATUS     TASK  WORKER  STARTED               ENDED
0        TIMED_OUT  t-0   w-0     1970-01-01T00:00:01Z  1970-01-01T00:00:03Z
1        COMPLETED  t-1           -                     -
  attempt 0: published but not reported: c0nf1rm00000 landed on main, but Conductor has the attempt TIMED_OUT; retry 1 superseded it with c0nf1rm22222 (perago.supersedes)
    input    1npu70000000
    reason   responseTimeout: 2 exceeded
    staging  none left
    confirm  c0nf1rm00000 on main (1 commit above the input ref searched)
  attempt 1: published and reported: c0nf1rm22222 on main, its confirm commit and output ref
    input    1npu70000000
    output   c0nf1rm22222
    staging  perago-staging-step-task-id-t-retry-0-e at 7ry000000000 (its try commit)
    confirm  c0nf1rm22222 on main (1 commit above the input ref searched)

step build__2 (kx.task) on r@main
ATTEMPT  STATUS  TASK  WORKER  STARTED  ENDED
0        FAILED  t-0           -        -
1        FAILED  t-1           -        -
  attempt 0: not published: task body exited with status 3; it staged 7ry000000000 on perago-staging-step-task-id-t-retry-0-e and never merged
    input    1npu70000000
    confirm  none on main (1 commit above the input ref searched)
    lakeFS   lakeFS get commit: HTTP 404
  attempt 1: outcome uncertain: its merge ended without an answer (error sending request: operation timed out) and no confirm commit of it is on main (only the newest 1000 commits were searched: the input ref is further down); its staging branch is gone, so its staging commit is named only in the sidecar's log (`the merge outcome is uncertain`, staging_commit); the merge may still land. What settles it: no later attempt will run its publish fence: run explain again (a confirm commit of this task on the branch means the merge landed) and see docs/operations.md, section A merge timed out
    input    1npu70000000
    reason   lakeFS merge on r@main failed: error sending request: operation timed out
    staging  none left
    confirm  none on main (the newest 1000 commits searched, the input ref not reached)

needs attention: an attempt above is uncertain or published without a report, and no later attempt will settle it
"#
        );
    }
}
