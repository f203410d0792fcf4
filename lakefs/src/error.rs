//! What went wrong with one lakeFS call: the call, the repository and ref it acted on, and a
//! kind that says what is known of the request (never sent, sent without an answer, refused,
//! answered unreadably), so that a caller can tell whether lakeFS may have acted on it.
//!
//! The text names the call, the repository and the ref, then the cause with its whole chain;
//! never the request URL (its query can hold a whole object key), and a ref longer than
//! [`REF_MAX`] characters is shortened, so that the cause survives the cut of a failure reason.

use std::fmt;

use reqwest::StatusCode;

use perago_contract::text::clip;

/// Longest ref (commit id or branch name) an error quotes in full; a commit id (64
/// characters) always fits, long branch names keep their start and end.
pub const REF_MAX: usize = 80;

/// One failed lakeFS call, or one failed transfer with the object store for it.
#[derive(Debug)]
pub struct LakeFsError {
    /// The call's name (`merge`, `list objects`, …); for a transfer with the object store
    /// through a presigned URL, its verb (`get`, `put`).
    pub call: &'static str,
    /// Empty for a call on the server itself (its configuration).
    pub repository: String,
    /// The ref (commit id or branch name) the call acted on, shortened to [`REF_MAX`].
    pub reference: String,
    pub kind: ErrorKind,
}

/// What came of the request, split as smithy-rs splits `SdkError`: by what is known about
/// whether it reached lakeFS.
#[derive(Debug)]
pub enum ErrorKind {
    /// Never sent (no connection, a request that could not be built, a local file an upload
    /// could not read): lakeFS cannot have acted on it.
    NotSent(String),
    /// Sent, and no whole answer came (a timeout, a lost connection): lakeFS may have acted.
    NoAnswer(String),
    /// lakeFS answered with a failure status; `message` is its JSON `message`, else the start
    /// of the body.
    Status { status: StatusCode, message: String },
    /// lakeFS answered with success, but not in a form this client reads.
    Decode(String),
    /// A transfer with the object store through a presigned URL failed: it answered
    /// `status`, or (`None`) it could not be reached or the bytes were not what was sent.
    ObjectStore {
        key: String,
        status: Option<StatusCode>,
        detail: String,
    },
    /// lakeFS presigned a URL on `host`, which the object store hosts do not allow: never
    /// followed.
    UnexpectedHost { key: String, host: String },
    /// A TLS gateway in front of lakeFS refused this client's certificate (none was sent, or
    /// one it does not accept), in the handshake or with a page of its own: the request never
    /// reached lakeFS, so lakeFS cannot have acted on it.
    CertificateRefused(String),
}

/// The words between a failed call's ref and its cause, by what came back;
/// [`crate::MergeOutcome::of_reason`] reads them back from the text.
pub(crate) const FAILED: &str = "failed";
pub(crate) const NOT_SENT: &str = "could not be sent";
pub(crate) const UNREADABLE: &str = "returned an unreadable answer";

impl fmt::Display for LakeFsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            call,
            repository,
            reference,
            kind,
        } = self;
        // Where the call acted: nothing for a call on the server itself.
        let on = if repository.is_empty() {
            String::new()
        } else {
            format!(" on {repository}@{reference}")
        };
        match kind {
            ErrorKind::NotSent(detail) | ErrorKind::CertificateRefused(detail) => {
                write!(f, "lakeFS {call}{on} {NOT_SENT}: {detail}")
            }
            ErrorKind::NoAnswer(detail) => write!(f, "lakeFS {call}{on} {FAILED}: {detail}"),
            ErrorKind::Status { status, message } => {
                write!(f, "lakeFS {call}{on} {FAILED}: HTTP {status}: {message}")
            }
            ErrorKind::Decode(detail) => write!(f, "lakeFS {call}{on} {UNREADABLE}: {detail}"),
            ErrorKind::ObjectStore { key, detail, .. } => write!(
                f,
                "object store {call} of '{key}' for {repository}@{reference} failed: {detail}"
            ),
            ErrorKind::UnexpectedHost { key, host } => write!(
                f,
                "lakeFS presigned a URL for '{key}' at {repository}@{reference} on {host}, \
                 which is not an allowed object store host (spec.lakefs.objectStoreHosts); \
                 not followed"
            ),
        }
    }
}

impl std::error::Error for LakeFsError {}

impl LakeFsError {
    /// lakeFS's failure status, when it answered one.
    pub fn status(&self) -> Option<StatusCode> {
        match &self.kind {
            ErrorKind::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A TLS gateway refused the client certificate.
    pub fn is_certificate_refused(&self) -> bool {
        matches!(self.kind, ErrorKind::CertificateRefused(_))
    }

    /// The object store's answer to a direct transfer.
    pub fn store_status(&self) -> Option<StatusCode> {
        match &self.kind {
            ErrorKind::ObjectStore { status, .. } => *status,
            _ => None,
        }
    }

    /// Worth trying again, for a call that is safe to repeat. A refused client certificate
    /// is: a renewed one may be read before the next try.
    pub(crate) fn transient(&self) -> bool {
        let busy = |s: StatusCode| s == StatusCode::TOO_MANY_REQUESTS || s.is_server_error();
        match &self.kind {
            ErrorKind::NotSent(_) | ErrorKind::NoAnswer(_) | ErrorKind::CertificateRefused(_) => {
                true
            }
            // Any 5xx, as the AWS SDKs classify them: lakeFS answers 500 when its database
            // does not (a restart, a failover), and a repeated read or upload is harmless.
            ErrorKind::Status { status, .. } => busy(*status),
            ErrorKind::Decode(_) | ErrorKind::UnexpectedHost { .. } => false,
            ErrorKind::ObjectStore { status, .. } => status.is_none_or(busy),
        }
    }
}

/// One lakeFS call, as its errors name it: what, in which repository, at which ref.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub name: &'static str,
    pub repository: &'a str,
    pub reference: &'a str,
}

impl<'a> Call<'a> {
    pub fn new(name: &'static str, repository: &'a str, reference: &'a str) -> Self {
        Self {
            name,
            repository,
            reference,
        }
    }

    pub(crate) fn error(self, kind: ErrorKind) -> LakeFsError {
        LakeFsError {
            call: self.name,
            repository: self.repository.to_owned(),
            reference: clip(self.reference, REF_MAX).into_owned(),
            kind,
        }
    }

    /// A request that got no answer.
    pub(crate) fn transport(self, e: reqwest::Error) -> LakeFsError {
        // A TLS alert refusing the certificate ends the handshake before the server reads a
        // request, even when the client, under TLS 1.3, had written one already.
        if let Some(refused) = perago_contract::trust::refused_handshake(&e) {
            return self.error(ErrorKind::CertificateRefused(refused));
        }
        // No connection, so no request: lakeFS cannot have acted on it.
        let sent = !(e.is_connect() || e.is_builder());
        let detail = request_error(e);
        self.error(if sent {
            ErrorKind::NoAnswer(detail)
        } else {
            ErrorKind::NotSent(detail)
        })
    }

    /// lakeFS's failure status with its message, or a gateway's refusal of the client
    /// certificate, which lakeFS never saw.
    pub(crate) fn refused(self, status: StatusCode, message: String) -> LakeFsError {
        match perago_contract::trust::refused_by_gateway(status.as_u16(), &message) {
            Some(refused) => self.error(ErrorKind::CertificateRefused(refused)),
            None => self.error(ErrorKind::Status { status, message }),
        }
    }

    pub(crate) fn unreadable(self, detail: String) -> LakeFsError {
        self.error(ErrorKind::Decode(detail))
    }
}

/// A failed HTTP request's text with its whole cause chain but without the request URL
/// (reqwest puts the URL, query included, before the cause; in a reason cut to
/// `PERAGO_FAILURE_REASON_MAX_LENGTH` the cause would be lost). Callers name the call instead.
pub fn request_error(e: reqwest::Error) -> String {
    perago_contract::error_chain(&e.without_url())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// lakeFS's answer `status` with `message` to `call` on lake@main.
    fn refused(call: &'static str, status: u16, message: &str) -> LakeFsError {
        Call::new(call, "lake", "main").refused(
            StatusCode::from_u16(status).expect("a status code"),
            message.into(),
        )
    }

    #[test]
    fn transient_answers() {
        let status = |s: u16, m: &str| refused("c", s, m);
        assert!(status(429, "").transient());
        assert!(status(503, "").transient());
        assert!(status(500, "branch is currently locked, try again later").transient());
        assert!(
            status(500, "postgres get: unexpected EOF").transient(),
            "lakeFS's database was away"
        );
        assert!(status(502, "").transient());
        assert!(!status(404, "").transient());
        assert_eq!(
            status(404, "branch not found").to_string(),
            "lakeFS c on lake@main failed: HTTP 404 Not Found: branch not found"
        );
    }

    #[test]
    fn a_call_on_the_server_names_no_repository_and_refs_are_shortened() {
        let config = Call::new("get storage config", "", "").unreadable("EOF".into());
        assert_eq!(
            config.to_string(),
            "lakeFS get storage config returned an unreadable answer: EOF"
        );
        let long = format!("perago-staging-{}", "b".repeat(300));
        let e = Call::new("commit", "lake", &long).error(ErrorKind::NotSent("x".into()));
        assert!(e.reference.chars().count() <= REF_MAX, "{e}");
        assert!(e.to_string().ends_with(" could not be sent: x"), "{e}");
    }

    #[test]
    fn object_store_errors_name_the_transfer_and_the_key() {
        let store = Call::new("put", "lake", "main").error(ErrorKind::ObjectStore {
            key: "data/a.txt".into(),
            status: Some(StatusCode::SERVICE_UNAVAILABLE),
            detail: "HTTP 503 Service Unavailable: SlowDown".into(),
        });
        assert_eq!(
            store.to_string(),
            "object store put of 'data/a.txt' for lake@main failed: HTTP 503 Service Unavailable: SlowDown"
        );
        assert!(store.transient());
        assert_eq!(store.store_status(), Some(StatusCode::SERVICE_UNAVAILABLE));
        let host = Call::new("get", "lake", "main").error(ErrorKind::UnexpectedHost {
            key: "data/a.txt".into(),
            host: "http://elsewhere:80".into(),
        });
        assert_eq!(
            host.to_string(),
            "lakeFS presigned a URL for 'data/a.txt' at lake@main on http://elsewhere:80, which \
             is not an allowed object store host (spec.lakefs.objectStoreHosts); not followed"
        );
        assert!(!host.transient());
    }

    /// The text carries the cause's whole chain (reqwest's, serde's) and `source()` names
    /// none, so a chain printer (`error_chain`, anyhow's `{:#}`) prints each cause once.
    #[tokio::test]
    async fn the_cause_chain_is_in_the_text_once() {
        // A loopback port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let refused = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await
            .expect_err("nothing listens");
        let mut innermost: &dyn std::error::Error = &refused;
        while let Some(cause) = innermost.source() {
            innermost = cause;
        }
        let innermost = innermost.to_string();
        let sent = Call::new("get commit", "lake", "main").transport(refused);
        let text = sent.to_string();
        assert!(text.ends_with(&innermost), "{text}");
        assert!(std::error::Error::source(&sent).is_none(), "{text}");
        assert_eq!(perago_contract::error_chain(&sent), text);

        let call = Call::new("get commit", "lake", "main");
        let unreadable = crate::decode::<crate::Commit>(call, b"{").expect_err("not JSON");
        let cause = serde_json::from_slice::<crate::Commit>(b"{")
            .expect_err("not JSON")
            .to_string();
        let text = unreadable.to_string();
        assert!(text.ends_with(&cause), "{text}");
        assert_eq!(perago_contract::error_chain(&unreadable), text);
    }
}
