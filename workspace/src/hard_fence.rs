//! Whether the opt-in hard fence guards a target branch. Without it, a commit that lands
//! between the publish fence's head check and the merge is stacked under the publication
//! (docs/reliability.md measures that window). The sidecar checks each target branch it
//! publishes to (again after ten minutes), exports the answer as a gauge and warns once when
//! the fence is missing; `kubectl perago history` reports the same check in its header.

use std::time::Duration;

use perago_lakefs::{LakeFsClient, LakeFsError};

use crate::branch_pattern::list_applies;
use crate::publication::Key;

/// Where lakeFS reads actions from, and the metadata key the hard fence's hook compares: an
/// action whose pre-merge hook script reads it is taken for the hard fence.
pub const ACTIONS_PREFIX: &str = "_lakefs_actions/";
pub const EXPECTED_HEAD_KEY: &str = Key::ExpectedHead.wire();

/// The `on.pre-merge.branches` entries of an action file, as text (lakeFS reads scalars
/// into strings); `None` when the file has no pre-merge trigger or cannot be read.
pub fn pre_merge_branches(text: &str) -> Option<Vec<String>> {
    let action = serde_yaml::from_str::<serde_yaml::Value>(text).ok()?;
    let pre_merge = action.get("on")?.get("pre-merge")?;
    Some(
        pre_merge
            .get("branches")
            .and_then(serde_yaml::Value::as_sequence)
            .map(|b| {
                b.iter()
                    .filter_map(|v| match v {
                        serde_yaml::Value::String(s) => Some(s.clone()),
                        serde_yaml::Value::Number(n) => Some(n.to_string()),
                        serde_yaml::Value::Bool(b) => Some(b.to_string()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    )
}

/// Whether an action file's text has a hook whose script compares `perago.expected_head`.
pub fn is_hard_fence(text: &str) -> bool {
    serde_yaml::from_str::<serde_yaml::Value>(text)
        .ok()
        .and_then(|action| action.get("hooks").cloned())
        .and_then(|hooks| hooks.as_sequence().cloned())
        .is_some_and(|hooks| {
            hooks.iter().any(|h| {
                h.get("properties")
                    .and_then(|p| p.get("script"))
                    .and_then(serde_yaml::Value::as_str)
                    .is_some_and(|s| s.contains(EXPECTED_HEAD_KEY))
            })
        })
}

/// Whether an action file's text runs a pre-merge hook comparing `perago.expected_head` on
/// merges into `branch`. The `branches` entries are lakeFS's patterns
/// ([`branch_pattern`](crate::branch_pattern)): no list means every branch; an entry lakeFS
/// cannot parse, met before one that matches, makes lakeFS fail the merge instead of running
/// the hook, so it does not count as a fence.
pub fn fences_branch(text: &str, branch: &str) -> bool {
    is_hard_fence(text)
        && pre_merge_branches(text)
            .is_some_and(|entries| list_applies(&entries, branch).unwrap_or(false))
}

/// The action file at `reference` that installs the hard fence for `branch`, if any. lakeFS
/// reads every object directly under `_lakefs_actions/` (not those in folders below it),
/// whatever its name ends in, from the merge's source, which Perago stages from the target's
/// head.
pub async fn installed_by(
    lakefs: &LakeFsClient,
    repository: &str,
    reference: &str,
    branch: &str,
) -> Result<Option<String>, LakeFsError> {
    let actions = lakefs
        .list_objects(repository, reference, ACTIONS_PREFIX)
        .await?;
    for entry in actions.iter().filter(|e| {
        e.path
            .strip_prefix(ACTIONS_PREFIX)
            .is_some_and(|name| !name.is_empty() && !name.contains('/'))
    }) {
        let response = lakefs
            .get_object(repository, reference, &entry.path, Duration::from_secs(30))
            .await?;
        // An action file is small; one that cannot be read is not taken for the fence.
        let Ok(text) = response.text().await else {
            continue;
        };
        if fences_branch(&text, branch) {
            return Ok(Some(entry.path.clone()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hard_fence_is_recognised_for_its_branches_only() {
        let shipped = include_str!("../../deploy/lakefs/perago-hard-fence.yaml");
        assert!(fences_branch(shipped, "main"));
        assert!(!fences_branch(shipped, "dev"));
        let all = shipped.replace("    branches:\n      - main\n", "");
        assert!(fences_branch(&all, "dev"));
        let glob = shipped.replace("- main", "- \"run-*\"");
        assert!(fences_branch(&glob, "run-001") && !fences_branch(&glob, "main"));
        // lakeFS's patterns, not another glob dialect's.
        let braces = shipped.replace("- main", "- \"{main,dev}\"");
        assert!(!fences_branch(&braces, "main") && !fences_branch(&braces, "dev"));
        let bang = shipped.replace("- main", "- \"[!d]ev\"");
        assert!(fences_branch(&bang, "dev"));
        let broken = shipped.replace("- main", "- \"[d\"\n      - dev");
        assert!(
            !fences_branch(&broken, "dev"),
            "lakeFS fails before reaching dev"
        );
        let unquoted = shipped.replace("- main", "- 2024");
        assert!(fences_branch(&unquoted, "2024"));
        assert!(!fences_branch(
            &shipped.replace(EXPECTED_HEAD_KEY, "other"),
            "main"
        ));
        assert!(!fences_branch("not: [yaml", "main"));
    }
}
