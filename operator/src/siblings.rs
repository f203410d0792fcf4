//! PeragoTasks of one task type on one Conductor — in several task domains, or several
//! namespaces — share the task type's one TaskDef. The oldest of them (then by namespace and
//! name) registers it; a younger one that renders a different TaskDef is not Ready and names
//! the sibling and the fields, instead of the two rewriting the TaskDef in turn.

use std::cmp::Ordering;
use std::fmt;

use kube::ResourceExt;
use serde_json::Value;

use perago_api::PeragoTask;

/// The condition reason of a task whose TaskDef differs from a sibling's.
pub const REASON: &str = "TaskDefConflict";

/// Why a task may not register its TaskDef.
#[derive(Debug, PartialEq)]
pub struct Conflict {
    pub task_def: String,
    /// `namespace/name` of the sibling that registers the TaskDef.
    pub sibling: String,
    /// The TaskDef's top-level fields the two render differently.
    pub fields: Vec<String>,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TaskDef {} is registered by the older PeragoTask {} of the same task type, and this \
             spec renders it differently ({}); PeragoTasks of one task type share its TaskDef, so \
             their specs must render the same one",
            self.task_def,
            self.sibling,
            self.fields.join(", ")
        )
    }
}

/// The live PeragoTasks other than `task` with its task type, on the Conductor at `base`.
pub fn of<'a>(
    task: &'a PeragoTask,
    base: &'a str,
    tasks: &'a [std::sync::Arc<PeragoTask>],
    base_of: impl Fn(&PeragoTask) -> String + 'a,
) -> impl Iterator<Item = &'a PeragoTask> + 'a {
    tasks.iter().map(|t| &**t).filter(move |t| {
        t.spec.task_name == task.spec.task_name
            && t.metadata.deletion_timestamp.is_none()
            && !same_object(t, task)
            && base_of(t) == base
    })
}

fn same_object(a: &PeragoTask, b: &PeragoTask) -> bool {
    match (&a.metadata.uid, &b.metadata.uid) {
        (Some(a), Some(b)) => a == b,
        _ => a.namespace() == b.namespace() && a.name_any() == b.name_any(),
    }
}

/// Older first: creation time, then namespace and name (a total order every replica of the
/// operator agrees on).
fn seniority(a: &PeragoTask, b: &PeragoTask) -> Ordering {
    let created = |t: &PeragoTask| t.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created(a)
        .cmp(&created(b))
        .then_with(|| a.namespace().cmp(&b.namespace()))
        .then_with(|| a.name_any().cmp(&b.name_any()))
}

/// Whether `task`, which renders `doc`, conflicts with the sibling that registers the TaskDef.
/// `render` gives a sibling's TaskDef, `None` for an invalid spec (which registers nothing).
pub fn conflict<'a>(
    task: &PeragoTask,
    doc: &Value,
    siblings: impl IntoIterator<Item = &'a PeragoTask>,
    render: impl Fn(&PeragoTask) -> Option<Value>,
) -> Option<Conflict> {
    let (registrar, theirs) = siblings
        .into_iter()
        .filter(|s| seniority(s, task) == Ordering::Less)
        .filter_map(|s| Some((s, render(s)?)))
        .min_by(|(a, _), (b, _)| seniority(a, b))?;
    let fields = differing_fields(doc, &theirs);
    (!fields.is_empty()).then(|| Conflict {
        task_def: task.spec.task_name.clone(),
        sibling: format!(
            "{}/{}",
            registrar.namespace().unwrap_or_default(),
            registrar.name_any()
        ),
        fields,
    })
}

fn differing_fields(ours: &Value, theirs: &Value) -> Vec<String> {
    let (Some(ours), Some(theirs)) = (ours.as_object(), theirs.as_object()) else {
        return if ours == theirs {
            Vec::new()
        } else {
            vec!["the whole document".into()]
        };
    };
    let mut fields: Vec<String> = ours
        .keys()
        .chain(theirs.keys())
        .filter(|k| ours.get(*k) != theirs.get(*k))
        .cloned()
        .collect();
    fields.sort();
    fields.dedup();
    fields
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;
    use std::sync::Arc;

    fn task(
        ns: &str,
        name: &str,
        created_s: i64,
        domain: Option<&str>,
        timeout: i64,
    ) -> PeragoTask {
        let mut t: PeragoTask = serde_json::from_value(json!({
            "apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask",
            "metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}")},
            "spec": {"taskName": "shared.step", "ownerEmail": "a@b.c",
                     "paramsSchema": {"type": "object"}, "resultSchema": {"type": "object"},
                     "controls": {"timeout": {"seconds": timeout}},
                     "conductor": domain.map(|d| json!({"domain": d})),
                     "executor": {"body": {"image": "b", "command": ["run"]}}},
        }))
        .unwrap();
        t.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created_s).unwrap(),
        ));
        t
    }

    fn render(t: &PeragoTask) -> Option<Value> {
        perago_api::taskdef::render(&t.spec).ok()
    }

    #[test]
    fn the_oldest_registers_and_a_younger_one_must_render_the_same_taskdef() {
        let old = task("a", "main", 10, None, 60);
        let canary = task("a", "canary", 20, Some("canary"), 60);
        let drifted = task("b", "eu", 30, Some("eu"), 90);
        let other_conductor = task("c", "elsewhere", 5, None, 30);
        let all: Vec<Arc<PeragoTask>> = [&old, &canary, &drifted, &other_conductor]
            .map(|t| Arc::new(t.clone()))
            .to_vec();
        let base_of = |t: &PeragoTask| {
            if t.namespace().as_deref() == Some("c") {
                "http://other/api"
            } else {
                "http://c/api"
            }
            .to_owned()
        };
        let conflict_of = |t: &PeragoTask| {
            let doc = render(t).unwrap();
            conflict(t, &doc, of(t, "http://c/api", &all, base_of), render)
        };
        assert_eq!(conflict_of(&old), None, "the oldest registers");
        assert_eq!(
            conflict_of(&canary),
            None,
            "a domain alone renders the same TaskDef"
        );
        let found = conflict_of(&drifted).unwrap();
        assert_eq!(found.sibling, "a/main", "the oldest, not the nearest");
        assert_eq!(found.fields, ["timeoutSeconds"]);
        assert!(found.to_string().contains("(timeoutSeconds)"), "{found}");
        assert_eq!(
            of(&drifted, "http://c/api", &all, base_of).count(),
            2,
            "a task on another Conductor is no sibling"
        );
    }

    #[test]
    fn equal_creation_times_are_ordered_by_namespace_then_name() {
        let a = task("a", "x", 10, None, 60);
        let b = task("b", "x", 10, None, 90);
        assert!(conflict(&a, &render(&a).unwrap(), [&b], render).is_none());
        assert!(conflict(&b, &render(&b).unwrap(), [&a], render).is_some());
        assert!(
            conflict(&b, &render(&b).unwrap(), [&a], |_| None).is_none(),
            "an invalid sibling registers nothing"
        );
    }
}
