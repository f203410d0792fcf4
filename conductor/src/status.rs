//! A Conductor task's status, as the server names it. The sets that matter to a worker, the
//! statuses a task never leaves and those of a task not over yet, are defined here once.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    Scheduled,
    InProgress,
    Completed,
    CompletedWithErrors,
    Failed,
    FailedWithTerminalError,
    TimedOut,
    Canceled,
    Skipped,
    /// The server gave none.
    #[default]
    Unnamed,
    /// A status this client does not know, as the server wrote it (a newer server).
    Other(String),
}

impl TaskStatus {
    /// The status as Conductor writes it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Scheduled => "SCHEDULED",
            Self::InProgress => "IN_PROGRESS",
            Self::Completed => "COMPLETED",
            Self::CompletedWithErrors => "COMPLETED_WITH_ERRORS",
            Self::Failed => "FAILED",
            Self::FailedWithTerminalError => "FAILED_WITH_TERMINAL_ERROR",
            Self::TimedOut => "TIMED_OUT",
            Self::Canceled => "CANCELED",
            Self::Skipped => "SKIPPED",
            Self::Unnamed => "",
            Self::Other(status) => status,
        }
    }

    /// A status the task never leaves: it runs no more.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Completed
                | Self::CompletedWithErrors
                | Self::Failed
                | Self::FailedWithTerminalError
                | Self::TimedOut
                | Self::Canceled
                | Self::Skipped
        )
    }

    /// Waiting for a worker, or held by one: the attempt is not over.
    pub fn is_running(&self) -> bool {
        matches!(self, Self::Scheduled | Self::InProgress)
    }
}

impl From<&str> for TaskStatus {
    fn from(status: &str) -> Self {
        match status {
            "SCHEDULED" => Self::Scheduled,
            "IN_PROGRESS" => Self::InProgress,
            "COMPLETED" => Self::Completed,
            "COMPLETED_WITH_ERRORS" => Self::CompletedWithErrors,
            "FAILED" => Self::Failed,
            "FAILED_WITH_TERMINAL_ERROR" => Self::FailedWithTerminalError,
            "TIMED_OUT" => Self::TimedOut,
            "CANCELED" => Self::Canceled,
            "SKIPPED" => Self::Skipped,
            "" => Self::Unnamed,
            other => Self::Other(other.to_owned()),
        }
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TaskStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TaskStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self::from(String::deserialize(d)?.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every status Conductor names, an empty one, and one it may name some day.
    const NAMES: [&str; 11] = [
        "SCHEDULED",
        "IN_PROGRESS",
        "COMPLETED",
        "COMPLETED_WITH_ERRORS",
        "FAILED",
        "FAILED_WITH_TERMINAL_ERROR",
        "TIMED_OUT",
        "CANCELED",
        "SKIPPED",
        "",
        "PAUSED_BY_A_NEWER_SERVER",
    ];

    #[test]
    fn every_status_reads_back_as_written_and_unknown_ones_are_kept() {
        for name in NAMES {
            assert_eq!(TaskStatus::from(name).as_str(), name);
        }
        assert_eq!(
            TaskStatus::from("PAUSED_BY_A_NEWER_SERVER"),
            TaskStatus::Other("PAUSED_BY_A_NEWER_SERVER".into())
        );
    }

    #[test]
    fn terminal_and_running_statuses() {
        let terminal: Vec<&str> = NAMES
            .into_iter()
            .filter(|s| TaskStatus::from(*s).is_terminal())
            .collect();
        assert_eq!(terminal, NAMES[2..9]);
        let running: Vec<&str> = NAMES
            .into_iter()
            .filter(|s| TaskStatus::from(*s).is_running())
            .collect();
        assert_eq!(running, ["SCHEDULED", "IN_PROGRESS"]);
    }

    #[test]
    fn it_reads_and_writes_json_as_a_string() {
        let s: TaskStatus = serde_json::from_str("\"TIMED_OUT\"").unwrap_or_default();
        assert_eq!(s, TaskStatus::TimedOut);
        assert_eq!(
            serde_json::to_string(&TaskStatus::InProgress)
                .ok()
                .as_deref(),
            Some("\"IN_PROGRESS\"")
        );
    }
}
