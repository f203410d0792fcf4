//! `kubectl perago install-fence`: commit the hard fence (`deploy/lakefs/perago-hard-fence.yaml`)
//! as `_lakefs_actions/perago-hard-fence.yaml` on a target branch, with that branch in its
//! `on.pre-merge.branches`. A branch the fence already guards gets no commit. A branch that
//! holds uncommitted changes is refused (the commit would take them along), and so is a
//! protected one, which lakeFS lets change only by merges: for it the manual steps through a
//! branch are printed. Every read is made before the first write.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use clap::Args;
use serde::Serialize;

use perago_lakefs::{ErrorKind, LakeFsClient, LakeFsError};
use perago_workspace::hard_fence::{fences_branch, is_hard_fence, pre_merge_branches};

use crate::Failure;
use crate::connect::Endpoints;
use crate::history::hard_fence;
use crate::output::{Table, cell, short};

pub const ACTION_PATH: &str = "_lakefs_actions/perago-hard-fence.yaml";
pub const MESSAGE: &str = "Install the Perago hard fence";
const SHIPPED: &str = include_str!("../../deploy/lakefs/perago-hard-fence.yaml");
/// The branch the manual steps install through.
const INSTALL_BRANCH: &str = "perago-install-hard-fence";

#[derive(Args, Debug)]
pub struct InstallFenceArgs {
    #[arg(long)]
    pub repository: String,
    /// The target branch to guard.
    #[arg(long)]
    pub branch: String,
    /// Print what would be committed and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Installed,
    AlreadyInstalled,
    WouldInstall,
    /// Nothing was changed; `why` and `steps` say what to do.
    Refused,
}

#[derive(Debug, Serialize)]
pub struct FenceView {
    pub repository: String,
    pub branch: String,
    /// The branch head before the command.
    pub head: String,
    pub outcome: Outcome,
    /// The action file that guards the branch, or would.
    pub action: String,
    /// The commit made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The `on.pre-merge.branches` list of the file written (or to write).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pre_merge_branches: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// The manual way, when the branch refuses direct writes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<String>,
    /// The file's text, when it was not committed here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_text: Option<String>,
}

/// The shipped action with its `branches` list set to `branches`, comments kept. Entries are
/// written single-quoted, so no name reads as a number, a boolean or YAML syntax.
pub fn render(branches: &[String]) -> anyhow::Result<String> {
    let lines: Vec<&str> = SHIPPED.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_end() == "    branches:")
        .context("the shipped hard fence has no pre-merge branches list")?;
    let mut out: Vec<String> = lines[..=at].iter().map(|l| (*l).to_owned()).collect();
    for b in branches {
        out.push(format!("      - '{}'", b.replace('\'', "''")));
    }
    out.extend(
        lines[at + 1..]
            .iter()
            .skip_while(|l| l.starts_with("      - "))
            .map(|l| (*l).to_owned()),
    );
    Ok(out.join("\n") + "\n")
}

pub async fn run(endpoints: &Endpoints, args: &InstallFenceArgs) -> Result<FenceView, Failure> {
    let lakefs = endpoints.lakefs()?;
    let (repo, branch) = (args.repository.as_str(), args.branch.as_str());
    let head = lakefs
        .branch_head(repo, branch)
        .await
        .map_err(anyhow::Error::from)?;
    let view = |outcome: Outcome, action: &str| FenceView {
        repository: repo.to_owned(),
        branch: branch.to_owned(),
        head: head.clone(),
        outcome,
        action: action.to_owned(),
        commit: None,
        pre_merge_branches: Vec::new(),
        why: String::new(),
        steps: Vec::new(),
        action_text: None,
    };
    if let Some(action) = hard_fence(&lakefs, repo, branch, &head).await?.action {
        return Ok(view(Outcome::AlreadyInstalled, &action));
    }

    // A hard fence already at the path (for other branches) keeps its entries.
    let existing = match lakefs
        .get_object(repo, &head, ACTION_PATH, Duration::from_secs(30))
        .await
    {
        Ok(response) => Some(
            response
                .text()
                .await
                .with_context(|| format!("reading {ACTION_PATH}"))?,
        ),
        Err(e) if e.status().is_some_and(|s| s.as_u16() == 404) => None,
        Err(e) => return Err(anyhow::Error::from(e).into()),
    };
    let mut branches = Vec::new();
    if let Some(text) = &existing {
        if !is_hard_fence(text) {
            return Err(anyhow!(
                "{repo}@{branch} already has a {ACTION_PATH} that is not the Perago hard fence; move it away first"
            )
            .into());
        }
        branches = pre_merge_branches(text).unwrap_or_default();
    }
    if !branches.iter().any(|b| b == branch) {
        branches.push(branch.to_owned());
    }
    let text = render(&branches)?;
    if !fences_branch(&text, branch) {
        return Err(anyhow!(
            "the rendered hard fence would not guard {branch} (its branches list: {})",
            branches.join(", ")
        )
        .into());
    }
    let mut planned = view(Outcome::WouldInstall, ACTION_PATH);
    planned.pre_merge_branches = branches;

    if let Some(changes) = uncommitted(&lakefs, repo, branch).await? {
        planned.outcome = Outcome::Refused;
        planned.why = format!(
            "{branch} has uncommitted changes ({changes}), which a commit would take along; commit or reset them first, or install through a branch"
        );
        planned.steps = manual_steps(repo, branch);
        planned.action_text = Some(text);
        return Ok(planned);
    }
    if args.dry_run {
        planned.action_text = Some(text);
        return Ok(planned);
    }

    match write(&lakefs, repo, branch, &text).await {
        Ok(commit) => {
            planned.outcome = Outcome::Installed;
            planned.commit = Some(commit);
            Ok(planned)
        }
        Err(Write::Protected(message)) => {
            planned.outcome = Outcome::Refused;
            planned.why = format!(
                "{branch} is protected (lakeFS: {message}): lakeFS changes it only by merges, so nothing was changed"
            );
            planned.steps = manual_steps(repo, branch);
            planned.action_text = Some(text);
            Ok(planned)
        }
        Err(Write::Failed(e)) => Err(e.into()),
    }
}

enum Write {
    Protected(String),
    Failed(anyhow::Error),
}

fn protected(e: &LakeFsError) -> Option<String> {
    match &e.kind {
        ErrorKind::Status { status, message }
            if status.as_u16() == 403 && message.contains("protected") =>
        {
            Some(message.clone())
        }
        _ => None,
    }
}

/// Upload the action and commit it; a commit lakeFS refuses leaves nothing staged behind.
async fn write(
    lakefs: &LakeFsClient,
    repo: &str,
    branch: &str,
    text: &str,
) -> Result<String, Write> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let local = std::env::temp_dir().join(format!(
        "perago-hard-fence-{}-{nanos}.yaml",
        std::process::id()
    ));
    std::fs::write(&local, text)
        .with_context(|| format!("writing {}", local.display()))
        .map_err(Write::Failed)?;
    let uploaded = lakefs
        .upload(repo, branch, ACTION_PATH, &local, Duration::from_secs(30))
        .await;
    let _ = std::fs::remove_file(&local);
    if let Err(e) = uploaded {
        return Err(match protected(&e) {
            Some(m) => Write::Protected(m),
            None => Write::Failed(e.into()),
        });
    }
    match lakefs
        .commit(repo, branch, MESSAGE, &Default::default())
        .await
    {
        Ok(c) => Ok(c.id),
        Err(e) => {
            // Take the upload back, so the branch is left as it was found.
            let undone = lakefs
                .delete_objects(repo, branch, &[ACTION_PATH.to_owned()])
                .await;
            let undone = match undone {
                Ok(()) => "the uploaded action was removed again".to_owned(),
                Err(u) => format!("{ACTION_PATH} stays uncommitted on {branch}: {u}"),
            };
            Err(match protected(&e) {
                Some(m) => Write::Protected(m),
                None => Write::Failed(anyhow::Error::from(e).context(undone)),
            })
        }
    }
}

/// How many changes the branch has that are not committed, when it has any.
async fn uncommitted(
    lakefs: &LakeFsClient,
    repo: &str,
    branch: &str,
) -> anyhow::Result<Option<String>> {
    let (results, more) = lakefs.uncommitted(repo, branch, 100).await?;
    Ok((results > 0).then(|| {
        if more {
            format!("more than {results}")
        } else {
            results.to_string()
        }
    }))
}

/// Through a branch: lakeFS lets a protected branch change by a merge.
fn manual_steps(repo: &str, branch: &str) -> Vec<String> {
    let via = INSTALL_BRANCH;
    vec![
        "save the action printed below as perago-hard-fence.yaml".into(),
        format!("lakectl branch create lakefs://{repo}/{via} --source lakefs://{repo}/{branch}"),
        format!("lakectl fs upload lakefs://{repo}/{via}/{ACTION_PATH} -s perago-hard-fence.yaml"),
        format!("lakectl commit lakefs://{repo}/{via} -m \"{MESSAGE}\""),
        format!("lakectl merge lakefs://{repo}/{via} lakefs://{repo}/{branch}"),
        format!("lakectl branch delete lakefs://{repo}/{via} --yes"),
        format!(
            "kubectl perago history --repository {repo} --branch {branch} --limit 1   (its header says: hard fence: installed)"
        ),
    ]
}

impl Table for FenceView {
    fn table(&self) -> String {
        let at = format!("{}@{}", self.repository, self.branch);
        let list = self.pre_merge_branches.join(", ");
        match self.outcome {
            Outcome::AlreadyInstalled => format!(
                "{at}: the hard fence is already installed ({}); nothing committed\n",
                cell(&self.action, 200)
            ),
            Outcome::Installed => format!(
                "{at}: installed the hard fence\n  commit   {} \"{MESSAGE}\", on top of {}\n  action   {} (pre-merge branches: {})\n  note     attempts whose input ref is older than this commit are refused by the publish fence: install while no workflow writes {}\n",
                short(self.commit.as_deref().unwrap_or("")),
                short(&self.head),
                self.action,
                cell(&list, 200),
                self.branch
            ),
            Outcome::WouldInstall => format!(
                "{at}: would commit {} (pre-merge branches: {}) on top of {}, message \"{MESSAGE}\" (dry run: nothing changed; a protected branch is found out only by the write)\n\n{}",
                self.action,
                cell(&list, 200),
                short(&self.head),
                self.action_text.as_deref().unwrap_or("")
            ),
            Outcome::Refused => {
                let mut out = format!("{at}: NOT installed: {}\n\n", cell(&self.why, 400));
                out.push_str(
                    "Install it through a branch (lakeFS merges into a protected branch):\n",
                );
                for (i, step) in self.steps.iter().enumerate() {
                    out.push_str(&format!("  {}. {step}\n", i + 1));
                }
                out.push_str("\n--- perago-hard-fence.yaml ---\n");
                out.push_str(self.action_text.as_deref().unwrap_or(""));
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rendered_fence_guards_its_branches_only() {
        let one = render(&["prod".into()]).unwrap();
        assert!(one.contains("      - 'prod'\nhooks:"), "{one}");
        assert!(!one.contains("- main"), "{one}");
        assert!(one.starts_with("# Perago hard fence"), "comments are kept");
        assert!(fences_branch(&one, "prod") && !fences_branch(&one, "main"));
        let two = render(&["main".into(), "2024".into(), "it's".into()]).unwrap();
        assert!(fences_branch(&two, "main") && fences_branch(&two, "2024"));
        assert_eq!(
            pre_merge_branches(&two).unwrap(),
            ["main", "2024", "it's"],
            "{two}"
        );
        assert_eq!(
            render(&["main".into()]).unwrap(),
            SHIPPED.replace("      - main", "      - 'main'")
        );
    }
}
