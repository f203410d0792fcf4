//! The runner protocol: newline-delimited JSON over the Unix socket `perago.sock` in the
//! shared work volume. `docs/runner-protocol.md` is its user-facing description; keep both in
//! step.
//!
//! The runner connects and says [`RunnerMessage::Hello`]; the sidecar answers
//! [`SidecarMessage::Welcome`] with the connection's generation. From then on the sidecar sends
//! one [`SidecarMessage::Assign`] per attempt (never two at once on a slot) and the runner
//! answers [`RunnerMessage::Exited`] when the attempt's process ends. Everything an attempt
//! produces travels through files in its execution directory, not over the socket.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const PROTOCOL_VERSION: u32 = 1;
/// The socket's file name inside the work directory.
pub const SOCKET_NAME: &str = "perago.sock";
/// Longest line either side accepts; longer lines end the connection.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Runner → sidecar.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "camelCase", deny_unknown_fields)]
pub enum RunnerMessage {
    /// First message of a connection.
    #[serde(rename_all = "camelCase")]
    Hello { protocol: u32, pid: u32 },
    /// The attempt's process ended. `code` is its exit status, `signal` the signal that
    /// killed it; exactly one of them is set. `error` is set when it could not be started.
    /// `oomKilled` is set when the kernel's out-of-memory killer killed it (the container
    /// reached its memory limit), where the kernel tells.
    #[serde(rename_all = "camelCase")]
    Exited {
        execution_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        oom_killed: bool,
    },
    /// The body container is stopping: send no more assignments on this connection.
    Draining,
}

/// Sidecar → runner.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "camelCase", deny_unknown_fields)]
pub enum SidecarMessage {
    #[serde(rename_all = "camelCase")]
    Welcome {
        protocol: u32,
        generation: u64,
        slots: u32,
    },
    /// Run the command once with `env` added to the runner's own environment.
    #[serde(rename_all = "camelCase")]
    Assign {
        execution_id: String,
        slot: u32,
        env: BTreeMap<String, String>,
    },
    /// Kill the attempt's process (its deadline passed or the sidecar is giving up on it).
    /// The runner still answers `exited`.
    #[serde(rename_all = "camelCase")]
    Cancel { execution_id: String },
}

/// Persistent bodies (`spec.executor.body.mode: persistent`), protocol version 2 of the body's
/// side: the runner starts the command once per slot and keeps it for many attempts. The
/// process gets [`persistent::PROTOCOL_ENV`] in its environment and, as its standard input, a
/// Unix stream socket to the runner that carries newline-delimited JSON: one
/// [`persistent::ToBody::Attempt`] at a time, answered by one [`persistent::FromBody::Done`]
/// once the attempt's files are complete. Outcomes travel through the same files as in
/// version 1 (one process per attempt, which stays the default).
pub mod persistent {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    pub const PROTOCOL: u32 = 2;
    /// Set to [`PROTOCOL`] in a persistent body's environment.
    pub const PROTOCOL_ENV: &str = "PERAGO_BODY_PROTOCOL";
    /// The runner's settings, also given as its flags `--persistent`, `--max-attempts N` and
    /// `--max-memory BYTES`.
    pub const MODE_ENV: &str = "PERAGO_BODY_MODE";
    pub const MAX_ATTEMPTS_ENV: &str = "PERAGO_BODY_MAX_ATTEMPTS";
    pub const MAX_MEMORY_ENV: &str = "PERAGO_BODY_MAX_MEMORY_BYTES";

    /// Runner → persistent body.
    #[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
    #[serde(tag = "type", rename_all = "camelCase", deny_unknown_fields)]
    pub enum ToBody {
        /// Run one attempt with `env` (the variables of version 1: params, result, error,
        /// metrics, workspace, the attempt's identity).
        #[serde(rename_all = "camelCase")]
        Attempt {
            execution_id: String,
            env: BTreeMap<String, String>,
        },
    }

    /// Persistent body → runner.
    #[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
    #[serde(tag = "type", rename_all = "camelCase", deny_unknown_fields)]
    pub enum FromBody {
        /// The attempt is over and its files are complete; the process takes the next one.
        #[serde(rename_all = "camelCase")]
        Done { execution_id: String },
    }
}

/// Environment variables an attempt's process receives.
pub mod env {
    pub const PARAMS: &str = "PERAGO_PARAMS";
    pub const RESULT: &str = "PERAGO_RESULT";
    pub const ERROR: &str = "PERAGO_ERROR";
    pub const METRICS: &str = "PERAGO_METRICS";
    pub const WORKSPACE: &str = "PERAGO_WORKSPACE";
    pub const TASK_NAME: &str = "PERAGO_TASK_NAME";
    pub const TASK_ID: &str = "PERAGO_TASK_ID";
    pub const WORKFLOW_INSTANCE_ID: &str = "PERAGO_WORKFLOW_INSTANCE_ID";
    pub const RETRY_COUNT: &str = "PERAGO_RETRY_COUNT";
    pub const EXECUTION_ID: &str = "PERAGO_EXECUTION_ID";
    pub const WORKER_ID: &str = "PERAGO_WORKER_ID";
    /// W3C trace context of the attempt's `body` span; set only when the sidecar traces.
    pub const TRACEPARENT: &str = "TRACEPARENT";
}

/// File names inside an execution directory.
pub mod files {
    pub const PARAMS: &str = "params.json";
    pub const RESULT: &str = "result.json";
    pub const ERROR: &str = "error.json";
    pub const METRICS: &str = "metrics.jsonl";
    pub const WORKSPACE: &str = "workspace";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shapes_are_stable() {
        let hello = RunnerMessage::Hello {
            protocol: 1,
            pid: 7,
        };
        assert_eq!(
            serde_json::to_string(&hello).unwrap(),
            r#"{"type":"hello","protocol":1,"pid":7}"#
        );
        let exited: RunnerMessage =
            serde_json::from_str(r#"{"type":"exited","executionId":"e1","signal":9}"#).unwrap();
        assert_eq!(
            exited,
            RunnerMessage::Exited {
                execution_id: "e1".into(),
                code: None,
                signal: Some(9),
                error: None,
                oom_killed: false,
            }
        );
        let killed: RunnerMessage = serde_json::from_str(
            r#"{"type":"exited","executionId":"e1","signal":9,"oomKilled":true}"#,
        )
        .unwrap();
        assert!(matches!(
            killed,
            RunnerMessage::Exited {
                oom_killed: true,
                ..
            }
        ));
        let assign = SidecarMessage::Assign {
            execution_id: "e1".into(),
            slot: 2,
            env: BTreeMap::from([("A".into(), "b".into())]),
        };
        assert_eq!(
            serde_json::to_string(&assign).unwrap(),
            r#"{"type":"assign","executionId":"e1","slot":2,"env":{"A":"b"}}"#
        );
    }

    #[test]
    fn persistent_bodies_speak_attempt_and_done() {
        let attempt = persistent::ToBody::Attempt {
            execution_id: "e1".into(),
            env: BTreeMap::from([("PERAGO_PARAMS".into(), "/p".into())]),
        };
        assert_eq!(
            serde_json::to_string(&attempt).unwrap(),
            r#"{"type":"attempt","executionId":"e1","env":{"PERAGO_PARAMS":"/p"}}"#
        );
        assert_eq!(
            serde_json::from_str::<persistent::FromBody>(r#"{"type":"done","executionId":"e1"}"#)
                .unwrap(),
            persistent::FromBody::Done {
                execution_id: "e1".into()
            }
        );
        assert!(
            serde_json::from_str::<persistent::FromBody>(
                r#"{"type":"done","executionId":"e1","code":0}"#
            )
            .is_err()
        );
    }

    #[test]
    fn unknown_messages_and_fields_are_refused() {
        assert!(serde_json::from_str::<RunnerMessage>(r#"{"type":"bogus"}"#).is_err());
        assert!(
            serde_json::from_str::<RunnerMessage>(
                r#"{"type":"hello","protocol":1,"pid":1,"extra":1}"#
            )
            .is_err()
        );
    }
}
