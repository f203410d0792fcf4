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
    #[arg(long, default_value = "24h", value_parser = crate::duration::parse)]
    pub older_than: Duration,
    /// Print what would be deleted and delete nothing.
    #[arg(long)]
    pub dry_run: bool,
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
