//! Object-key projection into the workspace: `paths::normalize_prefix` for the task's
//! prefix, then `download::project` for each key and `download::plan` for the listing.
//!
//! Input: `0xFF`-separated parts `prefix, key, key, …`.
//!
//! Asserts: nothing panics; a projected key yields a relative path that stays inside the
//! workspace root (no `..`, `.` or empty segments, not absolute, no backslash or NUL, each
//! name at most 255 bytes) and maps back to the same key; a key the projection hides is
//! outside the prefix or an attempt marker; a refused key fails the download with an error
//! naming the key; a planned listing has no two paths that would be a file and a directory at
//! once.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use perago_api::paths::{self, ATTEMPT_MARKER, ROOT_PREFIX};
use perago_fuzz::{parts, stays_inside};
use perago_lakefs::ObjectEntry;
use perago_contract::text::{QUOTED_MAX, clip};
use perago_sidecar::workspace::download::{self, NAME_MAX};

fn entry(path: &str) -> ObjectEntry {
    ObjectEntry {
        path: path.to_owned(),
        path_type: "object".into(),
        checksum: "d41d8cd98f00b204e9800998ecf8427e".into(),
        size_bytes: Some(0),
        ..ObjectEntry::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let parts = parts(data);
    let Some((raw_prefix, keys)) = parts.split_first() else {
        return;
    };
    let prefix = match paths::normalize_prefix(raw_prefix) {
        Ok(p) => {
            // A key prefix, not a local path: only its segments matter (`C:` is a name here).
            let clean = !p.starts_with('/')
                && !p.contains('\\')
                && !p.split('/').any(|s| matches!(s, "" | "." | ".."));
            assert!(p == ROOT_PREFIX || clean, "{p:?}");
            p
        }
        Err(e) => {
            assert!(e.to_string().starts_with("WorkspaceSpec.prefix must"));
            ROOT_PREFIX.to_owned()
        }
    };
    let mut visible = BTreeSet::new();
    for key in keys {
        match download::project(key, &prefix) {
            Ok(Some(local)) => {
                assert!(stays_inside(&local), "{key:?} projects outside: {local:?}");
                assert!(local.split('/').all(|s| s.len() <= NAME_MAX), "{local:?}");
                assert_ne!(local.rsplit('/').next(), Some(ATTEMPT_MARKER));
                assert_eq!(
                    paths::local_to_object_key(&local, &prefix).as_deref(),
                    Ok(key.as_str()),
                    "the projection does not map back"
                );
                if !download::is_reserved(key, &prefix) {
                    visible.insert(local);
                }
            }
            Ok(None) => {
                let under = prefix == ROOT_PREFIX || key.starts_with(&format!("{prefix}/"));
                let marker = key.rsplit('/').next() == Some(ATTEMPT_MARKER);
                assert!(!under || marker, "{key:?} hidden under {prefix:?}");
            }
            Err(why) => {
                assert!(!why.0.is_empty() && why.0.chars().count() < 200, "{why:?}");
                if !download::is_reserved(key, &prefix) {
                    let err = download::plan(&[entry(key)], &prefix).expect_err("refused alone");
                    assert_eq!(
                        err.to_string(),
                        format!(
                            "object key '{}' cannot be projected into the workspace: {why}",
                            clip(key, QUOTED_MAX)
                        )
                    );
                }
            }
        }
    }
    // A listing names each key once.
    let unique: BTreeSet<&String> = keys.iter().collect();
    let listing: Vec<ObjectEntry> = unique.into_iter().map(|k| entry(k)).collect();
    match download::plan(&listing, &prefix) {
        Ok(planned) => {
            let locals: BTreeSet<&str> = planned.iter().map(|(l, _)| l.as_str()).collect();
            assert_eq!(
                locals.len(),
                planned.len(),
                "two keys project onto one path"
            );
            for local in &locals {
                assert!(
                    visible.contains(*local),
                    "{local:?} planned but not projected"
                );
                let mut parent = *local;
                while let Some((p, _)) = parent.rsplit_once('/') {
                    assert!(!locals.contains(p), "{p:?} is a file and a directory");
                    parent = p;
                }
            }
            assert!(
                planned.windows(2).all(|w| w[0].1.path < w[1].1.path),
                "the plan is not in key order"
            );
        }
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.starts_with("object key '") || e.starts_with("object keys for '"),
                "{e:?}"
            )
        }
    }
});
