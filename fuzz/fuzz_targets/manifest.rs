//! PeragoTask manifest parsing and validation, as `perago check` and the operator see a
//! manifest: `manifest::parse`, then `validate`, then the contract and TaskDef renderings.
//!
//! Asserts: parsing and validation never panic; every error names its document (parse) or
//! its `spec.` field (validation); a spec that validates renders its contract and TaskDef,
//! the contract survives its JSON round trip (the ConfigMap the sidecar reads), and the
//! sidecar compiles the contract's schemas (so a task the operator accepts never stops the
//! sidecar from starting).
#![no_main]

use libfuzzer_sys::fuzz_target;
use perago_api::contract::{self, TaskContract};
use perago_api::manifest::{self, ManifestError};
use perago_api::{taskdef, validate};
use perago_sidecar::input::Schemas;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let tasks = match manifest::parse(text) {
        Ok(tasks) => tasks,
        Err(e) => {
            let message = e.to_string();
            match e {
                ManifestError::Yaml { doc, .. } | ManifestError::Field { doc, .. } => {
                    assert!(doc >= 1);
                    assert!(message.starts_with(&format!("document {doc}")), "{message}");
                }
                ManifestError::Empty => assert!(message.contains("no PeragoTask")),
            }
            return;
        }
    };
    assert!(!tasks.is_empty(), "an Ok parse has a task");
    for t in &tasks {
        let name = t.task.metadata.name.as_deref().unwrap_or_default();
        assert!(
            !name.is_empty() && name.len() <= 52,
            "the name check let {name:?} through"
        );
        let spec = &t.task.spec;
        let warnings = match validate(spec) {
            Ok(w) => w,
            Err(e) => {
                assert!(e.field.starts_with("spec."), "{e}");
                assert!(!e.message.is_empty(), "{e}");
                continue;
            }
        };
        assert!(warnings.iter().all(|w| !w.is_empty()));
        let c = contract::render(spec).expect("a valid spec renders its contract");
        let text = serde_json::to_string(&c).expect("a contract serialises");
        let back: TaskContract = serde_json::from_str(&text).expect("a contract parses back");
        assert_eq!(back, c, "the contract changes in its JSON round trip");
        taskdef::render(spec).expect("a valid spec renders its TaskDef");
        if let Err(e) = Schemas::compile(&c) {
            panic!("the operator accepts a spec whose contract the sidecar refuses: {e}");
        }
    }
});
