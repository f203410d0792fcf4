//! The answers lakeFS gives, as types (named as in lakeFS's OpenAPI document), and the rules
//! for reading them: each is decoded whole or refused as unreadable, naming the call. Kept
//! apart from the calls so that the `lakefs_response` fuzz target reads answers through the
//! same code as the client.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use perago_contract::text::{QUOTED_MAX, clip};

use crate::{Call, ErrorKind, LakeFsError};

/// Longest non-JSON error body an error quotes (lakeFS's JSON `message` is the cause and is
/// quoted whole, last).
const MESSAGE_MAX: usize = 300;

/// One object of a listing.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ObjectEntry {
    pub path: String,
    pub path_type: String,
    #[serde(default)]
    pub checksum: String,
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Where the bytes are: with `presign`, a URL to read them from until
    /// `physical_address_expiry` (seconds since the epoch).
    #[serde(default)]
    pub physical_address: String,
    #[serde(default)]
    pub physical_address_expiry: Option<i64>,
}

impl ObjectEntry {
    /// The URL to read the object from, when lakeFS presigned one.
    pub fn presigned_url(&self) -> Option<&str> {
        self.physical_address_expiry
            .is_some()
            .then_some(self.physical_address.as_str())
            .filter(|a| a.starts_with("http://") || a.starts_with("https://"))
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Commit {
    pub id: String,
    #[serde(default)]
    pub parents: Vec<String>,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub committer: String,
    /// Seconds since the epoch.
    #[serde(default)]
    pub creation_date: i64,
}

/// A branch and the commit it points at: the answer of get-branch, and each result of
/// list-branches.
#[doc(hidden)] // public for the fuzz targets
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Ref {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub commit_id: Option<String>,
}

impl Ref {
    /// The commit the branch points at. An answer without one is refused: taken for the
    /// head, an empty id made the publish fence ask lakeFS for the log of ref `""`.
    pub fn commit(self, call: Call<'_>) -> Result<String, LakeFsError> {
        self.commit_id
            .filter(|c| !c.is_empty())
            .ok_or_else(|| call.unreadable("no commit_id".into()))
    }
}

/// The answer of a merge.
#[doc(hidden)] // public for the fuzz targets
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct MergeResult {
    #[serde(default)]
    pub reference: Option<String>,
}

impl MergeResult {
    /// The merge's new commit. An answer without one is refused, and then says that lakeFS
    /// merged ([`crate::MergeOutcome::Applied`]): only a success answer is read.
    pub fn commit(self, call: Call<'_>) -> Result<String, LakeFsError> {
        self.reference
            .filter(|r| !r.is_empty())
            .ok_or_else(|| call.unreadable("the merge result has no reference".into()))
    }
}

/// The answer of delete-objects: the keys it could not delete (lakeFS writes `null` for
/// none).
#[doc(hidden)] // public for the fuzz targets
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ObjectErrorList {
    #[serde(default)]
    pub errors: Option<Vec<ObjectError>>,
}

#[doc(hidden)] // public for the fuzz targets
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ObjectError {
    #[serde(default)]
    pub status_code: Option<i64>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
}

impl ObjectErrorList {
    /// The first failure, as lakeFS's refusal of the call (a 500 when its status is none).
    pub fn check(self, call: Call<'_>) -> Result<(), LakeFsError> {
        let Some(first) = self.errors.into_iter().flatten().next() else {
            return Ok(());
        };
        let status = first
            .status_code
            .and_then(|c| u16::try_from(c).ok())
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // lakeFS's message first, then the (possibly long) key.
        let message = format!(
            "{} (object '{}')",
            first.message.as_deref().unwrap_or(""),
            clip(first.path.as_deref().unwrap_or("?"), QUOTED_MAX)
        );
        // An object's failure inside lakeFS's own answer: no gateway's page, whatever its words.
        Err(call.error(ErrorKind::Status { status, message }))
    }
}

/// The body of a failed call, as lakeFS writes it.
#[derive(Deserialize)]
struct ErrorBody {
    message: String,
}

/// The message of a failed call's answer: lakeFS's JSON `message`, else the start of the body.
#[doc(hidden)] // public for the fuzz targets
pub fn error_message(text: &str) -> String {
    serde_json::from_str::<ErrorBody>(text)
        .map(|body| body.message)
        .unwrap_or_else(|_| text.chars().take(MESSAGE_MAX).collect())
}

/// A successful call's JSON answer as `T`.
#[doc(hidden)] // public for the fuzz targets
pub fn decode<T: DeserializeOwned>(call: Call<'_>, bytes: &[u8]) -> Result<T, LakeFsError> {
    serde_json::from_slice(bytes).map_err(|e| call.unreadable(perago_contract::error_chain(&e)))
}

#[derive(Deserialize)]
pub(crate) struct Pagination {
    pub has_more: bool,
    #[serde(default)]
    pub next_offset: String,
}

/// One page of a paginated listing.
#[derive(Deserialize)]
pub(crate) struct Page<T> {
    pub pagination: Pagination,
    pub results: Vec<T>,
}

/// One page of a paginated listing, listed after the offset `after`: its results, and the
/// offset to list on from when lakeFS has more.
#[doc(hidden)] // public for the fuzz targets
pub fn page<T: DeserializeOwned>(
    call: Call<'_>,
    after: &str,
    bytes: &[u8],
) -> Result<(Vec<T>, Option<String>), LakeFsError> {
    decode::<Page<T>>(call, bytes)?.into_parts(call, after)
}

impl<T> Page<T> {
    /// A page that has more results but no new offset is refused: listing on from it would
    /// fetch the same page forever.
    pub(crate) fn into_parts(
        self,
        call: Call<'_>,
        after: &str,
    ) -> Result<(Vec<T>, Option<String>), LakeFsError> {
        if !self.pagination.has_more {
            return Ok((self.results, None));
        }
        let next = self.pagination.next_offset;
        let problem = if next.is_empty() {
            "the page has more results but no next_offset".to_owned()
        } else if next == after {
            format!(
                "the page has more results but its next_offset is the offset it was listed after ('{}')",
                clip(after, QUOTED_MAX)
            )
        } else {
            return Ok((self.results, Some(next)));
        };
        Err(call.unreadable(problem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, MergeOutcome};

    const LAKE: &str = "lake";

    /// Found by the `lakefs_response` fuzz target: an empty `commit_id` was taken for the
    /// branch's head, and the publish fence then asked lakeFS for the log of ref `""`.
    #[test]
    fn a_branch_answer_without_a_commit_is_refused() {
        let call = Call::new("get branch", LAKE, "main");
        let head = |body: &str| decode::<Ref>(call, body.as_bytes()).and_then(|r| r.commit(call));
        for answer in [
            r#"{"id": "main", "commit_id": ""}"#,
            r#"{"id": "main"}"#,
            r#"{"id": "main", "commit_id": null}"#,
        ] {
            assert_eq!(
                head(answer).expect_err("no commit").to_string(),
                "lakeFS get branch on lake@main returned an unreadable answer: no commit_id",
                "{answer}"
            );
        }
        assert_eq!(
            head(r#"{"commit_id": "c0ffee"}"#).expect("a commit"),
            "c0ffee"
        );
        let e = head(r#"{"commit_id": 7}"#).expect_err("not a string");
        assert!(matches!(e.kind, ErrorKind::Decode(_)), "{e}");
    }

    #[test]
    fn a_merge_answer_without_a_reference_says_lakefs_merged() {
        let call = Call::new("merge", LAKE, "main");
        let merged =
            |body: &str| decode::<MergeResult>(call, body.as_bytes()).and_then(|m| m.commit(call));
        assert_eq!(merged(r#"{"reference": "c1"}"#).expect("a commit"), "c1");
        for answer in [
            "{}",
            r#"{"reference": ""}"#,
            r#"{"reference": null}"#,
            "EOF",
        ] {
            let e = merged(answer).expect_err("no reference");
            assert_eq!(e.merge_outcome(), MergeOutcome::Applied, "{answer}: {e}");
        }
        assert_eq!(
            merged("{}").expect_err("no reference").to_string(),
            "lakeFS merge on lake@main returned an unreadable answer: the merge result has no reference"
        );
    }

    #[test]
    fn a_delete_answer_reports_its_first_failure_with_its_object() {
        let call = Call::new("delete objects", LAKE, "main");
        let deleted = |body: &str| {
            decode::<ObjectErrorList>(call, body.as_bytes()).and_then(|l| l.check(call))
        };
        for answer in [r#"{"errors": []}"#, r#"{"errors": null}"#, "{}"] {
            deleted(answer).expect(answer);
        }
        let e = deleted(
            r#"{"errors": [{"status_code": 403, "message": "denied", "path": "a/b"},
                           {"status_code": 500, "message": "second", "path": "c"}]}"#,
        )
        .expect_err("a failure");
        assert_eq!(
            e.to_string(),
            "lakeFS delete objects on lake@main failed: HTTP 403 Forbidden: denied (object 'a/b')"
        );
        let e = deleted(r#"{"errors": [{"status_code": -1, "message": "odd"}]}"#)
            .expect_err("a failure");
        assert_eq!(e.status(), Some(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(e.to_string().ends_with("odd (object '?')"), "{e}");
        // lakeFS's own answer, whatever an object's message says: never a gateway's refusal.
        let e = deleted(
            r#"{"errors": [{"status_code": 400, "message": "The SSL certificate error", "path": "k"}]}"#,
        )
        .expect_err("a failure");
        assert_eq!(e.status(), Some(StatusCode::BAD_REQUEST), "{e}");
    }

    #[test]
    fn a_branch_listing_reads_the_names() {
        let call = Call::new("list branches", LAKE, "perago-");
        let (branches, next) = page::<Ref>(
            call,
            "",
            br#"{"pagination": {"has_more": false}, "results": [{"id": "perago-a", "commit_id": "c"}]}"#,
        )
        .expect("a page");
        assert_eq!(next, None);
        assert_eq!(branches[0].id, "perago-a");
    }

    #[test]
    fn an_error_message_is_lakefs_message_or_the_start_of_the_body() {
        assert_eq!(
            error_message(r#"{"message": "branch not found"}"#),
            "branch not found"
        );
        assert_eq!(
            error_message("<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
        assert_eq!(error_message(r#"{"message": 5}"#), r#"{"message": 5}"#);
        let long = "x".repeat(1000);
        assert_eq!(error_message(&long).chars().count(), MESSAGE_MAX);
    }
}
