//! What a failed merge did to its destination branch, decided once from what is known of the
//! request and what came back. The sidecar's failure metric, its warning and `kubectl perago
//! explain` all read it from here; explain reads it back from the failure reason's text.

use reqwest::StatusCode;

use crate::error::{ErrorKind, FAILED, LakeFsError, NOT_SENT, UNREADABLE};

/// What a failed merge did to its destination branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeOutcome {
    /// Never sent, or refused: a 4xx, or lakeFS's 500 for a branch locked by another merge.
    NotApplied,
    /// Sent and not answered (a timeout, a lost connection), or a 5xx that a server or a
    /// gateway in front of it may send after lakeFS acted: only the branch can tell.
    Unknown,
    /// lakeFS answered that it merged, but the answer could not be read (no `reference`).
    Applied,
}

/// lakeFS's answer to a merge on a branch another merge holds ("branch is currently locked,
/// try again later"): a 500, though it refused without merging.
fn locked(status: StatusCode, message: &str) -> bool {
    status == StatusCode::INTERNAL_SERVER_ERROR && message.contains("locked")
}

impl MergeOutcome {
    fn of_status(status: StatusCode, message: &str) -> Self {
        if status.is_server_error() && !locked(status, message) {
            Self::Unknown
        } else {
            Self::NotApplied
        }
    }

    /// The merge may have landed: only the branch's history can tell.
    pub fn may_have_landed(self) -> bool {
        self != Self::NotApplied
    }

    /// The outcome a failure reason names, when it is a merge's [`LakeFsError`] as the sidecar
    /// reports it; `None` for any other reason.
    pub fn of_reason(reason: &str) -> Option<Self> {
        let rest = reason.trim().strip_prefix("lakeFS merge on ")?;
        // Repository and branch names hold no spaces: the first of these words is the split.
        let (at, words) = [FAILED, NOT_SENT, UNREADABLE]
            .into_iter()
            .filter_map(|w| rest.find(&format!(" {w}: ")).map(|at| (at, w)))
            .min()?;
        let cause = &rest[at + words.len() + 3..];
        Some(match words {
            NOT_SENT => Self::NotApplied,
            UNREADABLE => Self::Applied,
            _ => match cause.strip_prefix("HTTP ") {
                Some(answer) => {
                    let code = answer.get(..3).and_then(|c| c.parse::<u16>().ok())?;
                    let status = StatusCode::from_u16(code).ok()?;
                    let message = answer.split_once(": ").map_or("", |(_, m)| m);
                    Self::of_status(status, message)
                }
                None => Self::Unknown,
            },
        })
    }
}

impl LakeFsError {
    /// A merge lakeFS refused without merging, so that trying again is safe: the branch was
    /// locked by another merge (423, or 500 "locked") or the caller was throttled (429). A 503
    /// is not among them: a gateway may answer it for a request lakeFS already acted on.
    pub fn merge_refused(&self) -> Option<StatusCode> {
        match &self.kind {
            ErrorKind::Status { status, message }
                if *status == StatusCode::LOCKED
                    || *status == StatusCode::TOO_MANY_REQUESTS
                    || locked(*status, message) =>
            {
                Some(*status)
            }
            _ => None,
        }
    }

    /// What this error says of a merge's effect on its destination (the merge is never
    /// retried after an answer that leaves it open).
    pub fn merge_outcome(&self) -> MergeOutcome {
        match &self.kind {
            ErrorKind::NotSent(_) | ErrorKind::CertificateRefused(_) => MergeOutcome::NotApplied,
            ErrorKind::NoAnswer(_) => MergeOutcome::Unknown,
            ErrorKind::Status { status, message } => MergeOutcome::of_status(*status, message),
            // Only a successful answer is decoded: lakeFS merged.
            ErrorKind::Decode(_) => MergeOutcome::Applied,
            // Not merge calls: nothing reached the branch.
            ErrorKind::ObjectStore { .. } | ErrorKind::UnexpectedHost { .. } => {
                MergeOutcome::NotApplied
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Call;

    /// Every merge error the client makes, formatted as the sidecar reports it and read back
    /// as explain reads it, gives the outcome the error itself names.
    #[test]
    fn merge_outcomes_survive_their_reason_text() {
        let merge = Call::new("merge", "lake", "main");
        let status = |s: u16, m: &str| {
            merge.refused(StatusCode::from_u16(s).expect("a status code"), m.into())
        };
        let cases = [
            (
                merge.error(ErrorKind::NotSent(
                    "error sending request: tcp connect error: Connection refused".into(),
                )),
                MergeOutcome::NotApplied,
            ),
            (
                merge.error(ErrorKind::NoAnswer(
                    "error sending request: operation timed out".into(),
                )),
                MergeOutcome::Unknown,
            ),
            (
                merge.error(ErrorKind::NoAnswer(
                    "connection closed before message completed; HTTP 500 failed: x".into(),
                )),
                MergeOutcome::Unknown,
            ),
            // A gateway's refusal of the client certificate: lakeFS never saw the merge.
            (
                status(
                    400,
                    "<title>400 No required SSL certificate was sent</title>",
                ),
                MergeOutcome::NotApplied,
            ),
            (
                merge.error(ErrorKind::CertificateRefused(
                    "the server ended the TLS handshake: it refused the client certificate \
                     (TLS alert BadCertificate)"
                        .into(),
                )),
                MergeOutcome::NotApplied,
            ),
            (status(409, "conflict found"), MergeOutcome::NotApplied),
            (
                status(
                    412,
                    "pre-merge hook aborted: perago hard fence: main is at H, expected E",
                ),
                MergeOutcome::NotApplied,
            ),
            (status(423, "locked"), MergeOutcome::NotApplied),
            (status(429, ""), MergeOutcome::NotApplied),
            (
                status(500, "branch is currently locked, try again later"),
                MergeOutcome::NotApplied,
            ),
            (status(500, "internal error"), MergeOutcome::Unknown),
            (status(502, "bad gateway"), MergeOutcome::Unknown),
            (status(503, ""), MergeOutcome::Unknown),
            (
                crate::decode::<crate::MergeResult>(merge, b"{}")
                    .and_then(|m| m.commit(merge))
                    .expect_err("no reference"),
                MergeOutcome::Applied,
            ),
        ];
        for (error, outcome) in cases {
            assert_eq!(error.merge_outcome(), outcome, "{error}");
            assert_eq!(
                MergeOutcome::of_reason(&error.to_string()),
                Some(outcome),
                "{error}"
            );
        }
        assert!(!MergeOutcome::NotApplied.may_have_landed());
        assert!(MergeOutcome::Unknown.may_have_landed() && MergeOutcome::Applied.may_have_landed());
        for other in [
            "lakeFS commit on lake@perago-staging-x failed: error sending request: timed out",
            "main advanced from A to H",
            "lakeFS merge on lake@main",
        ] {
            assert_eq!(MergeOutcome::of_reason(other), None, "{other}");
        }
    }

    /// A merge is tried again only when lakeFS refused it without merging.
    #[test]
    fn only_a_refused_merge_is_tried_again() {
        let merge = Call::new("merge", "lake", "main");
        let status = |s: u16, m: &str| {
            merge
                .refused(StatusCode::from_u16(s).expect("a status code"), m.into())
                .merge_refused()
                .map(|s| s.as_u16())
        };
        assert_eq!(status(423, ""), Some(423));
        assert_eq!(status(429, ""), Some(429));
        assert_eq!(
            status(500, "branch is currently locked, try again later"),
            Some(500)
        );
        assert_eq!(status(500, "internal error"), None);
        assert_eq!(status(503, ""), None);
        assert_eq!(status(409, "conflict found"), None);
        assert_eq!(
            merge
                .error(ErrorKind::NoAnswer("timed out".into()))
                .merge_refused(),
            None
        );
    }
}
