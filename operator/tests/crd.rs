//! The committed CRD under `crds/` is exactly what `perago-operator crd` prints, and it stays
//! small enough for client-side `kubectl apply` (whose last-applied annotation holds 256 KiB).

#![allow(clippy::unwrap_used)]

use std::process::Command;

const ANNOTATION_LIMIT: usize = 262_144;

#[test]
fn committed_crd_has_no_drift_and_fits_client_side_apply() {
    let out = Command::new(env!("CARGO_BIN_EXE_perago-operator"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    let generated = String::from_utf8(out.stdout).unwrap();
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/peragotasks.perago.io.yaml");
    let committed = std::fs::read_to_string(&path).unwrap();
    assert!(
        generated == committed,
        "crds/ is stale: run `make crds` (perago-operator crd > crds/peragotasks.perago.io.yaml)"
    );
    // The annotation stores the object as JSON, so measure that form.
    let crd: serde_json::Value = serde_yaml::from_str(&generated).unwrap();
    let json_size = serde_json::to_vec(&crd).unwrap().len();
    println!(
        "CRD size: {} bytes YAML, {json_size} bytes JSON (limit {ANNOTATION_LIMIT})",
        generated.len()
    );
    assert!(
        json_size < ANNOTATION_LIMIT / 2,
        "CRD is {json_size} bytes as JSON; keep it well under {ANNOTATION_LIMIT}"
    );
    for subresource in ["status", "scale"] {
        assert!(
            crd["spec"]["versions"][0]["subresources"]
                .get(subresource)
                .is_some(),
            "{subresource} subresource"
        );
    }
}

/// `kubectl explain peragotask --recursive` documents every field: each property of the
/// schema has a description, and the root says what a PeragoTask is.
#[test]
fn every_field_is_described() {
    fn undescribed(node: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        for (name, property) in node["properties"].as_object().into_iter().flatten() {
            let here = format!("{path}.{name}");
            if property["description"].as_str().is_none_or(str::is_empty) {
                out.push(here.clone());
            }
            undescribed(property, &here, out);
            undescribed(&property["items"], &format!("{here}[]"), out);
        }
    }
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/peragotasks.perago.io.yaml");
    let crd: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let root = schema["description"].as_str().unwrap();
    assert!(root.starts_with("A Conductor task type"), "{root}");
    let mut missing = Vec::new();
    undescribed(schema, "", &mut missing);
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:?}"
    );
}
