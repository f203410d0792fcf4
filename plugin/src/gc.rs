//! `kubectl perago gc`: delete the staging branches whose attempt can no longer publish. An
//! attempt's task is read from its try commit's metadata, else from the branch name; the
//! branch goes when Conductor has the task in a terminal status, or no longer has it and the
//! branch is older than `--older-than`. A task that is scheduled or in progress keeps its
//! branch, and so does anything that cannot be decided. Every lookup is made before the first
//! deletion: a Conductor or lakeFS that fails stops the command with nothing deleted.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde::Serialize;

use perago_sidecar::conductor::ConductorClient;
use perago_sidecar::lakefs::LakeFsClient;

use crate::Failure;
use crate::connect::Endpoints;
use crate::history::task_status;
use crate::output::{Table, cell, columns};

pub const STAGING_PREFIX: &str = "perago-staging-";

/// Conductor's statuses from which a task never runs again.
const TERMINAL: [&str; 7] = [
    "COMPLETED",
    "COMPLETED_WITH_ERRORS",
    "FAILED",
    "FAILED_WITH_TERMINAL_ERROR",
    "TIMED_OUT",
    "CANCELED",
    "SKIPPED",
];

#[derive(Args, Debug)]
pub struct GcArgs {
    #[arg(long)]
    pub repository: String,
    /// How old a branch whose task Conductor no longer has must be to go: `90s`, `30m`,
    /// `12h`, `7d`.
    #[arg(long, default_value = "24h", value_parser = parse_age)]
    pub older_than: Duration,
    /// Print what would be deleted and delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not an age such as 90s, 30m, 12h or 7d"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit is one of s, m, h, d")),
    };
    n.checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[derive(Debug, Serialize)]
pub struct GcView {
    pub repository: String,
    pub dry_run: bool,
    pub branches: Vec<BranchVerdict>,
}

#[derive(Debug, Serialize)]
pub struct BranchVerdict {
    pub branch: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// `deleted`, `would delete`, `kept` or `delete failed`.
    pub action: String,
    pub why: String,
}

/// The task id a staging branch's name carries: `…-task-id-<id>-retry-<n>-exec-<e>`.
pub fn task_id_from_name(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(STAGING_PREFIX)?;
    let (_, after) = rest.split_once("-task-id-")?;
    let at = after.rfind("-retry-")?;
    let (id, tail) = after.split_at(at);
    let tail = tail.strip_prefix("-retry-")?;
    let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
    (digits > 0 && tail[digits..].starts_with("-exec-") && !id.is_empty()).then_some(id)
}

struct Plan {
    branch: String,
    task_id: Option<String>,
    delete: bool,
    why: String,
}

pub async fn run(endpoints: &Endpoints, args: &GcArgs) -> Result<GcView, Failure> {
    let lakefs = endpoints.lakefs()?;
    let conductor = endpoints.require_conductor()?;
    let repo = args.repository.as_str();
    let names = lakefs
        .list_branches(repo, STAGING_PREFIX)
        .await
        .map_err(anyhow::Error::from)?;
    let mut plans = Vec::new();
    for name in names.iter().filter(|n| n.starts_with(STAGING_PREFIX)) {
        plans.push(decide(&lakefs, &conductor, repo, name, args.older_than).await?);
    }
    let mut branches = Vec::new();
    let mut failed = false;
    for plan in plans {
        let action = match (plan.delete, args.dry_run) {
            (false, _) => "kept".to_owned(),
            (true, true) => "would delete".to_owned(),
            (true, false) => match lakefs.delete_branch(repo, &plan.branch).await {
                Ok(()) => "deleted".to_owned(),
                Err(e) => {
                    failed = true;
                    branches.push(BranchVerdict {
                        branch: plan.branch,
                        task_id: plan.task_id,
                        action: "delete failed".into(),
                        why: e.to_string(),
                    });
                    continue;
                }
            },
        };
        branches.push(BranchVerdict {
            branch: plan.branch,
            task_id: plan.task_id,
            action,
            why: plan.why,
        });
    }
    let view = GcView {
        repository: repo.to_owned(),
        dry_run: args.dry_run,
        branches,
    };
    if failed {
        print!("{}", view.table());
        return Err(Failure::Flagged);
    }
    Ok(view)
}

async fn decide(
    lakefs: &LakeFsClient,
    conductor: &ConductorClient,
    repo: &str,
    branch: &str,
    older_than: Duration,
) -> Result<Plan, Failure> {
    let head = lakefs
        .get_commit(repo, branch)
        .await
        .map_err(anyhow::Error::from)?;
    // The try commit names its task; before the stage committed, only the name does.
    let from_commit = (head.metadata.get("perago.phase").map(String::as_str) == Some("try"))
        .then(|| head.metadata.get("perago.task_id").cloned())
        .flatten()
        .filter(|id| !id.is_empty());
    let task_id = from_commit.or_else(|| task_id_from_name(branch).map(str::to_owned));
    let plan = |delete: bool, why: String| Plan {
        branch: branch.to_owned(),
        task_id: task_id.clone(),
        delete,
        why,
    };
    let Some(id) = &task_id else {
        return Ok(plan(false, "names no task".into()));
    };
    let status = task_status(conductor, id).await?;
    if TERMINAL.contains(&status.as_str()) {
        return Ok(plan(true, format!("its task is {status}")));
    }
    if status != "gone" {
        return Ok(plan(false, format!("its task is {status}")));
    }
    // Conductor no longer has the task (archived or removed): age decides. The head commit is
    // the try commit, or the base the branch was made from, so the age is at least this.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let age = Duration::from_secs(now.saturating_sub(head.creation_date).max(0) as u64);
    Ok(if age >= older_than {
        plan(
            true,
            format!(
                "Conductor no longer has its task and its head is {} old",
                human(age)
            ),
        )
    } else {
        plan(
            false,
            format!(
                "Conductor no longer has its task, but its head is only {} old (--older-than {})",
                human(age),
                human(older_than)
            ),
        )
    })
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

impl Table for GcView {
    fn table(&self) -> String {
        if self.branches.is_empty() {
            return format!("{}: no staging branches\n", self.repository);
        }
        let rows: Vec<Vec<String>> = self
            .branches
            .iter()
            .map(|b| {
                vec![
                    b.action.to_uppercase(),
                    cell(&b.branch, 120),
                    cell(&b.why, 200),
                ]
            })
            .collect();
        columns(&["ACTION", "BRANCH", "WHY"], &rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_age("7").unwrap_err().contains("unit"));
        assert!(parse_age("h").unwrap_err().contains("not an age"));
        assert!(parse_age("99999999999999999999d").is_err());
    }

    #[test]
    fn the_task_id_is_read_from_the_branch_name() {
        let name =
            "perago-staging-wf-1-step-seq-1-iteration-0-task-id-5f0c-aa-retry-2-exec-x-retry-1";
        assert_eq!(
            task_id_from_name(name),
            None,
            "exec must follow the retry count"
        );
        let name = "perago-staging-wf-1-step-seq-1-iteration-0-task-id-5f0c-aa-retry-2-exec-e1";
        assert_eq!(task_id_from_name(name), Some("5f0c-aa"));
        assert_eq!(task_id_from_name("perago-staging-x"), None);
        assert_eq!(task_id_from_name("main"), None);
    }
}
