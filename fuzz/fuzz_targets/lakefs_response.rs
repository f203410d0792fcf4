//! lakeFS response decoding: every answer the sidecar reads (`lakefs::decode`,
//! `lakefs::page` for the paginated listings, `branch_commit`, `merge_reference`,
//! `delete_failure`, `error_message` for failed calls), and the publish fence's reading of
//! the first-parent log (`publish::classify`).
//!
//! Input: one byte choosing the call, then the answer's body.
//!
//! Asserts: nothing panics; a body that is no answer of the call is refused with an error
//! naming the call, repository and ref; a page that says it has more gives a next offset
//! to list on from (else the listing would fetch the same page forever); a decoded commit id
//! or merge reference is not empty; a delete failure is reported with its object; an error
//! body's message is lakeFS's `message` or at most 300 characters of the body; the fence
//! only builds on the input ref or on the head when every commit since is this step's own
//! confirmed publication.
#![no_main]

use libfuzzer_sys::fuzz_target;
use perago_lakefs::{
    Call, Commit, ErrorKind, LakeFsError, ObjectEntry, branch_commit, delete_failure,
    error_message, merge_reference,
};
use perago_sidecar::workspace::{download, publish};
use serde_json::Value;

const REPO: &str = "lake";
const REF: &str = "main";
const KEY: &str = "wf-1:build:0:features.build";

fn refused(call: &str, e: &LakeFsError) {
    let text = e.to_string();
    let head = format!("lakeFS {call} on {REPO}@{REF} ");
    assert!(text.starts_with(&head), "{text}");
    assert!(matches!(e.kind, ErrorKind::Decode(_)), "{text}");
}

/// A page listed from the start, then the same page listed after an offset.
fn page<T: serde::de::DeserializeOwned>(call: &'static str, body: &[u8]) -> Option<Vec<T>> {
    let mut first = None;
    for after in ["", "data/raw/a.wav"] {
        match perago_lakefs::page::<T>(Call::new(call, REPO, REF), after, body) {
            Ok((results, next)) => {
                if let Some(next) = next {
                    assert!(
                        !next.is_empty() && next != after,
                        "a page that lists itself again"
                    );
                }
                first.get_or_insert(results);
            }
            Err(e) => refused(call, &e),
        }
    }
    first
}

fn value(call: &'static str, body: &[u8]) -> Option<Value> {
    perago_lakefs::decode::<Value>(Call::new(call, REPO, REF), body)
        .map_err(|e| refused(call, &e))
        .ok()
}

fn fence(commits: &[Commit], more: bool) {
    let (Some(head), Some(input)) = (commits.first(), commits.last()) else {
        return;
    };
    let (head, input) = (head.id.as_str(), input.id.as_str());
    match publish::classify(REF, input, head, commits, more, KEY) {
        Ok(base) => {
            if base.base == input && head == input {
                assert_eq!(base.supersedes, None);
                return;
            }
            assert_eq!(base.base, head);
            assert_eq!(base.supersedes.as_deref(), Some(head));
            let end = commits
                .iter()
                .position(|c| c.id == input)
                .expect("the input ref");
            for c in &commits[..end] {
                assert_eq!(
                    c.metadata.get("perago.phase").map(String::as_str),
                    Some("confirm")
                );
                assert_eq!(
                    c.metadata
                        .get("perago.logical_task_key")
                        .map(String::as_str),
                    Some(KEY)
                );
            }
        }
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with(REF), "{e}")
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [call, body @ ..] = data else {
        return;
    };
    match call % 9 {
        0 => {
            if let Some(entries) = page::<ObjectEntry>("list objects", body) {
                let objects: Vec<ObjectEntry> = entries
                    .into_iter()
                    .filter(|e| e.path_type == "object")
                    .collect();
                let _ = download::plan(&objects, "data");
            }
        }
        1 => {
            if let Some(commits) = page::<Commit>("log commits", body) {
                fence(&commits, false);
                fence(&commits, true);
            }
        }
        2 => {
            page::<Value>("list branches", body);
        }
        3 => {
            if let Some(answer) = value("get branch", body) {
                match branch_commit(REPO, REF, &answer) {
                    Ok(id) => {
                        assert_eq!(answer["commit_id"], id.as_str());
                        assert!(!id.is_empty(), "an empty commit id");
                    }
                    Err(e) => refused("get branch", &e),
                }
            }
        }
        4 => {
            if let Err(e) = perago_lakefs::decode::<Commit>(Call::new("commit", REPO, REF), body) {
                refused("commit", &e);
            }
        }
        5 => {
            if let Some(answer) = value("merge", body) {
                match merge_reference(REPO, REF, &answer) {
                    Ok(r) => assert!(!r.is_empty() && answer["reference"] == r.as_str()),
                    Err(e) => refused("merge", &e),
                }
            }
        }
        6 => {
            if let Err(e) =
                perago_lakefs::decode::<ObjectEntry>(Call::new("upload object", REPO, REF), body)
            {
                refused("upload object", &e);
            }
        }
        7 => {
            if let Some(answer) = value("delete objects", body) {
                let first = answer
                    .get("errors")
                    .and_then(Value::as_array)
                    .and_then(|e| e.first());
                match delete_failure(REPO, REF, &answer) {
                    Ok(()) => assert!(first.is_none()),
                    Err(e) => {
                        assert!(first.is_some());
                        assert!(matches!(e.kind, ErrorKind::Status { .. }));
                        let text = e.to_string();
                        assert!(
                            text.starts_with("lakeFS delete objects on lake@main failed: HTTP "),
                            "{text}"
                        );
                        assert!(text.contains(" (object '"), "{text}");
                    }
                }
            }
        }
        _ => {
            let text = String::from_utf8_lossy(body);
            let message = error_message(&text);
            let json = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned));
            match json {
                Some(m) => assert_eq!(message, m),
                None => assert!(message.chars().count() <= 300 && text.starts_with(&message)),
            }
        }
    }
});
