//! The history checker: is every first-parent commit of a branch since a workflow's input ref
//! explained? Each must be a confirm commit of a publication, with complete metadata, whose
//! `expected_head` is its first parent and whose non-empty `supersedes` names that parent, a
//! confirm commit of the same logical task; or a commit the caller knows to be foreign.
//! The reliability tests run it after every scenario.

use std::collections::BTreeMap;

use perago_lakefs::Commit;

use crate::publication::{Key, Phase};

/// One explained commit, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Confirm {
        id: String,
        logical_task_key: String,
        task_id: String,
        /// The earlier confirm commit of the same logical task this one replaced.
        supersedes: Option<String>,
    },
    Foreign {
        id: String,
    },
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    pub entries: Vec<Entry>,
    /// Each a sentence naming the commit and what is wrong with it.
    pub problems: Vec<String>,
}

impl Report {
    /// Confirm commits per logical task key.
    pub fn publications(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for entry in &self.entries {
            if let Entry::Confirm {
                logical_task_key, ..
            } = entry
            {
                *out.entry(logical_task_key.clone()).or_insert(0) += 1;
            }
        }
        out
    }

    /// Confirm commits that no later one superseded: the publications that stand.
    pub fn standing(&self) -> Vec<&Entry> {
        let superseded: Vec<&str> = self
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::Confirm {
                    supersedes: Some(s),
                    ..
                } => Some(s.as_str()),
                _ => None,
            })
            .collect();
        self.entries
            .iter()
            .filter(
                |e| matches!(e, Entry::Confirm { id, .. } if !superseded.contains(&id.as_str())),
            )
            .collect()
    }
}

/// The logical task whose confirm commit `commit` is, if it is one. The publish fence and the
/// history checker both classify commits by this.
pub fn confirm_of(commit: &Commit) -> Option<&str> {
    (Phase::of(&commit.metadata) == Some(Phase::Confirm))
        .then(|| Key::LogicalTaskKey.get(&commit.metadata).unwrap_or(""))
}

/// Explain one commit of a first-parent history given the commit below it (`None` when the
/// caller did not read that far): a confirm commit, checked for complete and consistent
/// metadata, or a foreign one. Problems are sentences naming the commit.
pub fn examine(commit: &Commit, below: Option<&Commit>) -> (Entry, Vec<String>) {
    let id = &commit.id;
    let mut problems = Vec::new();
    let parent = commit.parents.first().map(String::as_str).unwrap_or("");
    if below.is_some_and(|next| next.id != parent) {
        problems.push(format!(
            "{id}: the log's next commit is not its first parent {parent}"
        ));
    }
    let Some(key) = confirm_of(commit) else {
        return (Entry::Foreign { id: id.clone() }, problems);
    };
    let meta = |key: Key| key.get(&commit.metadata);
    let missing: Vec<&str> = Key::CONFIRM
        .into_iter()
        .filter(|k| meta(*k).is_none() || (*k != Key::Supersedes && meta(*k) == Some("")))
        .map(Key::name)
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{id}: confirm metadata lacks {}",
            missing.join(", ")
        ));
    }
    if meta(Key::ExpectedHead) != Some(parent) {
        problems.push(format!(
            "{id}: expected_head {:?} is not its first parent {parent}",
            meta(Key::ExpectedHead)
        ));
    }
    let supersedes = meta(Key::Supersedes)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    if let Some(s) = &supersedes {
        if s != parent {
            problems.push(format!(
                "{id}: supersedes {s}, which is not its first parent {parent}"
            ));
        } else if let Some(below) = below.filter(|b| b.id == *s)
            && confirm_of(below) != Some(key)
        {
            problems.push(format!(
                "{id}: supersedes {s}, which is not a confirm commit of logical task {key}"
            ));
        }
    }
    let entry = Entry::Confirm {
        id: id.clone(),
        logical_task_key: key.to_owned(),
        task_id: meta(Key::TaskId).unwrap_or_default().to_owned(),
        supersedes,
    };
    (entry, problems)
}

/// Check `history` (first-parent, newest first, as lakeFS's log gives it) down to
/// `input_ref`. `foreign` lists the commits the caller made itself on purpose; any other
/// commit that is not a confirm commit is a problem.
pub fn check(history: &[Commit], input_ref: &str, foreign: &[String]) -> Report {
    let mut report = Report::default();
    let Some(end) = history.iter().position(|c| c.id == input_ref) else {
        report.problems.push(format!(
            "the history does not reach the input ref {input_ref}"
        ));
        return report;
    };
    for (i, commit) in history[..end].iter().enumerate() {
        let (entry, problems) = examine(commit, history.get(i + 1));
        report.problems.extend(problems);
        if matches!(entry, Entry::Foreign { .. }) && !foreign.contains(&commit.id) {
            report.problems.push(format!(
                "{}: neither a confirm commit nor a known foreign commit (message {:?})",
                commit.id, commit.message
            ));
            continue;
        }
        report.entries.push(entry);
    }
    report
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn commit(id: &str, parent: &str, meta: &[(&str, &str)]) -> Commit {
        Commit {
            id: id.into(),
            parents: vec![parent.into()],
            message: format!("commit {id}"),
            metadata: meta
                .iter()
                .map(|(k, v)| (format!("perago.{k}"), (*v).to_owned()))
                .collect(),
            ..Commit::default()
        }
    }

    fn confirm(id: &str, parent: &str, key: &str, supersedes: &str) -> Commit {
        let mut meta: Vec<(&str, &str)> = Key::CONFIRM.iter().map(|k| (k.name(), "x")).collect();
        meta.retain(|(k, _)| !matches!(*k, "logical_task_key" | "expected_head" | "supersedes"));
        meta.extend([
            ("phase", "confirm"),
            ("logical_task_key", key),
            ("expected_head", parent),
            ("supersedes", supersedes),
        ]);
        commit(id, parent, &meta)
    }

    #[test]
    fn a_publication_and_its_supersession_are_explained() {
        let log = [
            confirm("c2", "c1", "wf/step", "c1"),
            confirm("c1", "in", "wf/step", ""),
            commit("in", "root", &[]),
        ];
        let report = check(&log, "in", &[]);
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert_eq!(report.publications()["wf/step"], 2);
        assert_eq!(report.standing().len(), 1);
    }

    #[test]
    fn foreign_incomplete_and_inconsistent_commits_are_problems() {
        let mut incomplete = confirm("c1", "in", "a", "");
        incomplete.metadata.remove("perago.task_id");
        let log = [
            commit("f2", "c3", &[]),
            confirm("c3", "f1", "b", "f1"),
            commit("f1", "c2", &[]),
            confirm("c2", "c1", "b", "c1"),
            incomplete,
            commit("in", "root", &[]),
        ];
        let report = check(&log, "in", &["f1".to_owned()]);
        let problems = report.problems.join("\n");
        assert!(
            problems.contains("f2: neither a confirm commit"),
            "{problems}"
        );
        assert!(
            problems.contains("c3: supersedes f1, which is not a confirm commit of logical task b"),
            "{problems}"
        );
        assert!(
            problems.contains("c2: supersedes c1, which is not a confirm commit of logical task b"),
            "{problems}"
        );
        assert!(
            problems.contains("c1: confirm metadata lacks task_id"),
            "{problems}"
        );
        assert!(!problems.contains("f1:"), "f1 is known: {problems}");
        let mut wrong_head = confirm("c1", "in", "a", "");
        wrong_head
            .metadata
            .insert("perago.expected_head".into(), "other".into());
        let report = check(&[wrong_head, commit("in", "r", &[])], "in", &[]);
        assert!(
            report.problems[0].contains("expected_head"),
            "{:?}",
            report.problems
        );
        assert!(check(&[commit("x", "y", &[])], "in", &[]).problems[0].contains("does not reach"));
    }
}
