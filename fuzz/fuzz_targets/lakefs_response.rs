//! lakeFS response decoding: every answer the sidecar reads, through the types the client
//! decodes it into (`lakefs::decode`, `lakefs::page` for the paginated listings, `Ref`,
//! `MergeResult`, `ObjectErrorList`, `error_message` for failed calls), and the publish
//! fence's reading of the first-parent log (`publish::classify`).
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
    Call, Commit, ErrorKind, LakeFsError, MergeResult, ObjectEntry, ObjectErrorList, Ref,
    error_message,
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

/// The body decoded as the answer of `call`, or refused naming the call.
fn answer<T: serde::de::DeserializeOwned>(call: Call<'_>, body: &[u8]) -> Option<T> {
    perago_lakefs::decode::<T>(call, body)
        .map_err(|e| refused(call.name, &e))
        .ok()
}

/// The value at `name` of the body, when it is a JSON object that has one.
fn field(body: &[u8], name: &str) -> Option<Value> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .get(name)
        .cloned()
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
            page::<Ref>("list branches", body);
        }
        3 => {
            let call = Call::new("get branch", REPO, REF);
            if let Some(answer) = answer::<Ref>(call, body) {
                match answer.commit(call) {
                    Ok(id) => {
                        assert!(!id.is_empty(), "an empty commit id");
                        if let Some(stated) = field(body, "commit_id") {
                            assert_eq!(stated, id.as_str());
                        }
                    }
                    Err(e) => refused("get branch", &e),
                }
            }
        }
        4 => {
            answer::<Commit>(Call::new("commit", REPO, REF), body);
        }
        5 => {
            let call = Call::new("merge", REPO, REF);
            if let Some(answer) = answer::<MergeResult>(call, body) {
                match answer.commit(call) {
                    Ok(r) => {
                        assert!(!r.is_empty(), "an empty merge reference");
                        if let Some(stated) = field(body, "reference") {
                            assert_eq!(stated, r.as_str());
                        }
                    }
                    Err(e) => refused("merge", &e),
                }
            }
        }
        6 => {
            answer::<ObjectEntry>(Call::new("upload object", REPO, REF), body);
        }
        7 => {
            let call = Call::new("delete objects", REPO, REF);
            if let Some(answer) = answer::<ObjectErrorList>(call, body) {
                let failures = answer.errors.as_ref().map_or(0, Vec::len);
                match answer.check(call) {
                    Ok(()) => assert_eq!(failures, 0),
                    Err(e) => {
                        assert!(failures > 0);
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
            let start = message.chars().count() <= 300 && text.starts_with(&message);
            let json = serde_json::from_str::<Value>(&text).ok();
            match json.as_ref().and_then(|v| v.get("message")?.as_str()) {
                // A key given twice is refused by the typed decoding: the body's start, then.
                Some(m) => assert!(message == m || start, "{message:?}"),
                // Not lakeFS's message: the body's start, unless the body is JSON whose
                // fields come as a sequence (serde reads a struct from either).
                None => assert!(start || json.is_some_and(|v| v.is_array()), "{message:?}"),
            }
        }
    }
});
