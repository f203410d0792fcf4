//! `kubectl perago gc`: delete the staging branches whose attempt can no longer publish, by
//! the verdicts of `perago_workspace::janitor` (the same the running sidecars sweep
//! with). Every verdict is made before the first deletion: a Conductor or lakeFS that fails
//! stops the command with nothing deleted.

use std::time::Duration;

use clap::Args;
use serde::Serialize;

use perago_workspace::janitor;

use crate::Failure;
use crate::connect::Endpoints;
use crate::output::{Table, cell, columns};

#[derive(Args, Debug)]
pub struct GcArgs {
    /// A lakeFS repository to clean (repeat for more).
    #[arg(long = "repository", required = true)]
    pub repositories: Vec<String>,
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
    pub repositories: Vec<String>,
    pub dry_run: bool,
    pub branches: Vec<BranchAction>,
}

#[derive(Debug, Serialize)]
pub struct BranchAction {
    pub repository: String,
    pub branch: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// `deleted`, `would delete`, `kept` or `delete failed`.
    pub action: String,
    pub why: String,
}

pub async fn run(endpoints: &Endpoints, args: &GcArgs) -> Result<GcView, Failure> {
    let lakefs = endpoints.lakefs()?;
    let conductor = endpoints.require_conductor()?;
    // Every verdict, in every repository, before the first deletion.
    let mut judged = Vec::new();
    for repo in &args.repositories {
        let verdicts = janitor::judge(&lakefs, &conductor, repo, args.older_than)
            .await
            .map_err(anyhow::Error::from)?;
        judged.extend(verdicts.into_iter().map(|v| (repo.clone(), v)));
    }
    let mut branches = Vec::new();
    let mut failed = false;
    for (repository, v) in judged {
        let (action, why) = match (v.delete, args.dry_run) {
            (false, _) => ("kept", v.why),
            (true, true) => ("would delete", v.why),
            (true, false) => match lakefs.delete_branch(&repository, &v.branch).await {
                Ok(()) => ("deleted", v.why),
                Err(e) => {
                    failed = true;
                    ("delete failed", e.to_string())
                }
            },
        };
        branches.push(BranchAction {
            repository,
            branch: v.branch,
            task_id: v.task_id,
            action: action.into(),
            why,
        });
    }
    let view = GcView {
        repositories: args.repositories.clone(),
        dry_run: args.dry_run,
        branches,
    };
    if failed {
        print!("{}", view.table());
        return Err(Failure::Flagged);
    }
    Ok(view)
}

impl Table for GcView {
    fn table(&self) -> String {
        if self.branches.is_empty() {
            return format!("{}: no staging branches\n", self.repositories.join(", "));
        }
        let rows: Vec<Vec<String>> = self
            .branches
            .iter()
            .map(|b| {
                vec![
                    b.action.to_uppercase(),
                    cell(&b.repository, 40),
                    cell(&b.branch, 250),
                    cell(&b.why, 200),
                ]
            })
            .collect();
        columns(&["ACTION", "REPOSITORY", "BRANCH", "WHY"], &rows)
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
}
