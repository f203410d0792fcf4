//! The `workspace` object of a task's input: `WorkspaceRef::parse`, as the sidecar applies it
//! to `inputData.workspace` (after `input::accept` for a workspace task).
//!
//! Asserts: nothing panics; a refusal starts `invalid workspace: ` and names each problem
//! with its `workspace…` field; an accepted workspace has exactly the four fields, none blank,
//! `refType` `commit`, and survives its own JSON round trip (the output's `workspace`) and
//! `at` (the published commit).
#![no_main]

use libfuzzer_sys::fuzz_target;
use perago_workspace::reference::WorkspaceRef;
use serde_json::Value;

const FIELDS: [&str; 4] = ["repository", "branch", "refType", "ref"];

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    // A whole `inputData` is tried as well as the value itself.
    let candidates = [Some(&value), value.get("workspace")];
    for v in candidates.into_iter().flatten() {
        match WorkspaceRef::parse(v) {
            Ok(w) => {
                let map = v.as_object().expect("only an object is accepted");
                assert_eq!(map.len(), 4, "{v}");
                for field in [&w.repository, &w.branch, &w.reference] {
                    assert!(!field.trim().is_empty(), "blank field accepted: {v}");
                }
                assert_eq!(w.ref_type, "commit");
                assert_eq!(map["repository"], w.repository.as_str());
                assert_eq!(map["branch"], w.branch.as_str());
                assert_eq!(map["ref"], w.reference.as_str());
                let out = w.to_value();
                assert_eq!(&out, v, "the output workspace differs from the input");
                assert_eq!(WorkspaceRef::parse(&out).as_ref(), Ok(&w));
                let published = w.at("c0ffee");
                assert_eq!(published.reference, "c0ffee");
                assert_eq!(WorkspaceRef::parse(&published.to_value()), Ok(published));
            }
            Err(e) => {
                let e = e.to_string();
                assert!(e.starts_with("invalid workspace: workspace"), "{e:?}");
                let Some(map) = v.as_object() else {
                    continue;
                };
                let named =
                    |problem: String| assert!(e.contains(&problem), "{e:?} lacks {problem:?}");
                for key in map.keys().filter(|k| !FIELDS.contains(&k.as_str())) {
                    named(format!("workspace.{key}: Extra inputs are not permitted"));
                }
                for field in FIELDS {
                    match map.get(field) {
                        None => named(format!("workspace.{field}: Field required")),
                        Some(Value::String(_)) => {}
                        Some(_) => {
                            named(format!("workspace.{field}: Input should be a valid string"))
                        }
                    }
                }
            }
        }
    }
});
