//! What went wrong with one Conductor call, named by the call (and the TaskDef it was about).

use reqwest::StatusCode;
use thiserror::Error;

#[derive(Debug, Error)]
#[error("Conductor {call}{} {kind}", of_task_def(.task_def.as_deref()))]
pub struct ConductorError {
    /// The call's name, as in metrics and logs (`batch poll`, `get`, `update task`, …).
    pub call: &'static str,
    /// The TaskDef a metadata call was about.
    pub task_def: Option<String>,
    pub kind: ErrorKind,
}

#[derive(Debug, Error)]
pub enum ErrorKind {
    /// Conductor answered with a failure status; `body` is the answer's start.
    #[error("failed: HTTP {status}: {body}")]
    Status { status: StatusCode, body: String },
    /// The request did not get an answer; the text holds the whole cause chain (reqwest's
    /// own message lacks the cause) but not the URL.
    #[error("failed: {0}")]
    Transport(String),
    #[error("returned an unreadable answer: {0}")]
    Decode(String),
    /// A TLS gateway in front of Conductor refused this client's certificate (none was sent,
    /// or one it does not accept), in the handshake or with a page of its own: the request
    /// never reached Conductor.
    #[error("was refused: {0}")]
    CertificateRefused(String),
}

fn of_task_def(task_def: Option<&str>) -> String {
    task_def.map_or_else(String::new, |name| format!(" of TaskDef '{name}'"))
}

impl ConductorError {
    pub(crate) fn new(call: &'static str, task_def: Option<&str>, kind: ErrorKind) -> Self {
        Self {
            call,
            task_def: task_def.map(str::to_owned),
            kind,
        }
    }

    pub fn call(&self) -> &'static str {
        self.call
    }

    pub fn status(&self) -> Option<StatusCode> {
        match &self.kind {
            ErrorKind::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND)
    }

    /// Worth retrying: transport errors, timeouts, 429 and 5xx, and a refused client
    /// certificate (the request never reached Conductor, and a renewed certificate may be
    /// read before the next try).
    pub fn is_transient(&self) -> bool {
        match &self.kind {
            ErrorKind::Transport(_) | ErrorKind::CertificateRefused(_) => true,
            ErrorKind::Status { status, .. } => {
                *status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
            }
            ErrorKind::Decode(_) => false,
        }
    }

    /// Who the client is was refused: HTTP 401 or 403 from Conductor, or a refused client
    /// certificate.
    pub fn is_auth(&self) -> bool {
        self.is_certificate_refused()
            || matches!(
                self.status(),
                Some(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
            )
    }

    /// A TLS gateway refused the client certificate.
    pub fn is_certificate_refused(&self) -> bool {
        matches!(self.kind, ErrorKind::CertificateRefused(_))
    }
}

/// A failed HTTP request's text with its whole cause chain but without the request URL
/// (reqwest puts the URL, query included, before the cause; in a failure reason cut to its
/// maximum length the cause would be lost). Callers name the call instead.
pub(crate) fn request_error(e: reqwest::Error) -> String {
    perago_contract::error_chain(&e.without_url())
}
