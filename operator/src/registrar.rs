//! Which cluster registered a TaskDef (ADR 0040). Clusters that share a Conductor each have
//! their own oldest sibling of a task type (ADR 0018), and each would repair the TaskDef to its
//! own render at every resync. So every TaskDef the operator writes ends its description with
//! a line naming the cluster and the PeragoTask that wrote it, and an operator rewrites a
//! TaskDef that differs from its render only when that line names its own cluster, or no
//! cluster: drift from an edit in Conductor is repaired, another cluster's TaskDef is not.
//! A TaskDef that holds the render, mark aside, is never written.

use serde_json::Value;

use crate::conductor::holds;

/// How the mark's line begins.
const MARK: &str = "Registered by Perago for Kubernetes from cluster ";

/// Who wrote a TaskDef: a cluster's name and a PeragoTask's `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registrar {
    pub cluster: String,
    pub task: String,
}

impl Registrar {
    fn line(&self) -> String {
        format!("{MARK}{:?}, PeragoTask {}.", self.cluster, self.task)
    }

    fn parse(line: &str) -> Option<Self> {
        let rest = line.strip_prefix(MARK)?;
        let (cluster, task) = rest.rsplit_once(", PeragoTask ")?;
        let cluster: String = serde_json::from_str(cluster).ok()?;
        Some(Self {
            cluster,
            task: task.strip_suffix('.')?.to_owned(),
        })
    }
}

/// `doc`, a rendered TaskDef, with `registrar`'s line at the end of its description.
pub fn marked(doc: &Value, registrar: &Registrar) -> Value {
    let mut doc = doc.clone();
    if let Some(fields) = doc.as_object_mut() {
        let line = registrar.line();
        let description = match fields.get("description").and_then(Value::as_str) {
            Some(own) if !own.is_empty() => format!("{own}\n\n{line}"),
            _ => line,
        };
        fields.insert("description".into(), description.into());
    }
    doc
}

/// The registrar a stored TaskDef names, and the TaskDef without its line (with no
/// description when the line was all of it).
pub fn read(stored: &Value) -> (Option<Registrar>, Value) {
    let mut plain = stored.clone();
    let Some(fields) = plain.as_object_mut() else {
        return (None, plain);
    };
    let Some(description) = fields.get("description").and_then(Value::as_str) else {
        return (None, plain);
    };
    let (own, last) = match description.rsplit_once('\n') {
        Some((own, last)) => (own.trim_end_matches('\n'), last),
        None => ("", description),
    };
    let Some(registrar) = Registrar::parse(last) else {
        return (None, plain);
    };
    if own.is_empty() {
        fields.remove("description");
    } else {
        let own = own.to_owned();
        fields.insert("description".into(), own.into());
    }
    (Some(registrar), plain)
}

/// What to do with a task type's TaskDef, for the cluster `cluster` whose render is
/// `rendered` (unmarked).
#[derive(Debug, PartialEq, Eq)]
pub enum Registration {
    /// Absent: create it.
    Create,
    /// It holds the render: write nothing, whoever wrote it.
    Keep,
    /// It differs, and was written from this cluster or by no operator: rewrite it.
    Repair,
    /// It differs, in these top-level fields, and another cluster wrote it: write nothing,
    /// and say so.
    Foreign(Registrar, Vec<String>),
}

pub fn decide(stored: Option<&Value>, rendered: &Value, cluster: &str) -> Registration {
    let Some(stored) = stored else {
        return Registration::Create;
    };
    let (registrar, plain) = read(stored);
    if holds(&plain, rendered) {
        return Registration::Keep;
    }
    match registrar {
        Some(other) if other.cluster != cluster => {
            let fields = rendered.as_object().map_or_else(Vec::new, |fields| {
                fields
                    .iter()
                    .filter(|(k, v)| !plain.get(*k).is_some_and(|s| holds(s, v)))
                    .map(|(k, _)| k.clone())
                    .collect()
            });
            Registration::Foreign(other, fields)
        }
        _ => Registration::Repair,
    }
}

/// Whether a cluster may delete the stored TaskDef for `deletionPolicy: Delete`: it wrote it,
/// or no operator did.
pub fn may_delete(stored: &Value, cluster: &str) -> Result<(), Registrar> {
    match read(stored).0 {
        Some(other) if other.cluster != cluster => Err(other),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from(cluster: &str) -> Registrar {
        Registrar {
            cluster: cluster.into(),
            task: "etl/load".into(),
        }
    }

    /// What Conductor hands back: the document with fields of its own.
    fn stored(doc: &Value) -> Value {
        let mut stored = doc.clone();
        stored["createTime"] = json!(1);
        stored
    }

    #[test]
    fn the_mark_round_trips_with_and_without_a_description() {
        for doc in [
            json!({"name": "etl.load", "retryCount": 3}),
            json!({"name": "etl.load", "description": "Loads.\nTwo lines.", "retryCount": 3}),
        ] {
            let marked = marked(&doc, &from("eu-west"));
            let (registrar, plain) = read(&marked);
            assert_eq!(registrar, Some(from("eu-west")));
            assert_eq!(plain, doc);
        }
        let odd = Registrar {
            cluster: "a \"quoted\", PeragoTask x/y.".into(),
            task: "ns/name".into(),
        };
        assert_eq!(
            read(&marked(&json!({}), &odd)).0,
            Some(odd),
            "a cluster name with the line's own words in it"
        );
        assert_eq!(read(&json!({"description": "Registered by hand."})).0, None);
    }

    #[test]
    fn identical_renders_are_kept_whoever_wrote_them() {
        let doc = json!({"name": "etl.load", "retryCount": 3});
        let theirs = stored(&marked(&doc, &from("us-east")));
        assert_eq!(decide(Some(&theirs), &doc, "eu-west"), Registration::Keep);
        assert_eq!(decide(Some(&theirs), &doc, "us-east"), Registration::Keep);
        assert_eq!(decide(None, &doc, "eu-west"), Registration::Create);
    }

    #[test]
    fn a_different_taskdef_is_repaired_only_from_its_own_cluster_or_when_unmarked() {
        let ours = json!({"name": "etl.load", "retryCount": 3});
        let theirs = json!({"name": "etl.load", "retryCount": 5});
        let written = stored(&marked(&theirs, &from("us-east")));
        assert_eq!(
            decide(Some(&written), &ours, "eu-west"),
            Registration::Foreign(from("us-east"), vec!["retryCount".into()])
        );
        assert_eq!(
            decide(Some(&written), &ours, "us-east"),
            Registration::Repair,
            "an edit in Conductor of this cluster's TaskDef"
        );
        assert_eq!(
            decide(Some(&stored(&theirs)), &ours, "eu-west"),
            Registration::Repair,
            "a TaskDef no operator marked (made by hand, or before marks)"
        );
        assert_eq!(may_delete(&written, "eu-west"), Err(from("us-east")));
        assert_eq!(may_delete(&written, "us-east"), Ok(()));
        assert_eq!(may_delete(&stored(&theirs), "eu-west"), Ok(()));
    }

    #[test]
    fn unnamed_clusters_are_one_cluster_as_before() {
        let ours = json!({"name": "etl.load", "retryCount": 3});
        let written = stored(&marked(
            &json!({"name": "etl.load", "retryCount": 5}),
            &from(""),
        ));
        assert_eq!(decide(Some(&written), &ours, ""), Registration::Repair);
        assert_eq!(
            decide(Some(&written), &ours, "eu-west"),
            Registration::Foreign(from(""), vec!["retryCount".into()])
        );
    }
}
