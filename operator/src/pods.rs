//! Why a task's executor pods are not ready, in the kubelet's and the scheduler's own words,
//! for the PeragoTask's `Ready` condition and a Warning event: a user who applied a task
//! should not have to go looking at pods to learn that its image is missing.

use k8s_openapi::api::apps::v1::DeploymentStatus;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// A pod that cannot start or keep running, as its status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProblem {
    /// The kubelet's or scheduler's reason: `ImagePullBackOff`, `CrashLoopBackOff`,
    /// `Unschedulable`, …; used as the condition's reason.
    pub reason: String,
    /// `pod <name>: container <c>: <reason>: <message>`.
    pub message: String,
}

/// Waiting reasons that mean the container will not start without a change (or a retry of
/// something outside the pod), rather than "still starting".
const STUCK: [&str; 9] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    // The sidecar's hook that installs the runner failed (a full work volume): the kubelet's
    // message carries the hook's output.
    "PostStartHookError",
];

/// The first problem among `pods` (sorted by name, so the report is stable), if any.
pub fn problem<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Option<PodProblem> {
    let mut pods: Vec<&Pod> = pods.into_iter().collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pods.into_iter().find_map(pod_problem)
}

/// The Deployment's pods cannot even be created (its `ReplicaFailure` condition): refused by
/// Pod Security admission, a quota or a policy, in the API server's words.
pub fn replica_failure(deployment: &DeploymentStatus) -> Option<PodProblem> {
    let c = deployment
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")?;
    let reason = c.reason.clone().unwrap_or_else(|| "ReplicaFailure".into());
    Some(PodProblem {
        message: format!("{reason}: {}", c.message.as_deref().unwrap_or("")),
        reason,
    })
}

pub(crate) fn pod_problem(pod: &Pod) -> Option<PodProblem> {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if let Some(c) = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    }) {
        return Some(PodProblem {
            reason: "Unschedulable".into(),
            message: format!(
                "pod {name}: Unschedulable: {}",
                c.message.as_deref().unwrap_or("")
            ),
        });
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    containers
        .into_iter()
        .find_map(|c| container_problem(name, c))
}

fn container_problem(pod: &str, c: &ContainerStatus) -> Option<PodProblem> {
    let waiting = c.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    if !STUCK.contains(&reason) {
        return None;
    }
    let mut message = format!("pod {pod}: container {}: {reason}", c.name);
    if let Some(text) = waiting.message.as_deref().filter(|m| !m.is_empty()) {
        message.push_str(": ");
        message.push_str(text);
    }
    // A crash loop's cause is in the last run: its exit code and, with
    // FallbackToLogsOnError, the tail of what it printed.
    if let Some(last) = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()) {
        message.push_str(&format!("; last exit code {}", last.exit_code));
        if let Some(text) = last
            .message
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            message.push_str(": ");
            message.push_str(&tail.join(" | "));
        }
    }
    Some(PodProblem {
        reason: reason.to_owned(),
        message,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t-perago-abc"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn pods_the_api_server_refuses_to_create_say_why() {
        let status: DeploymentStatus = serde_json::from_value(serde_json::json!({
            "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                            "message": "pods \"t-perago-5d\" is forbidden: violates PodSecurity \"restricted:latest\": privileged"}],
        }))
        .unwrap();
        let p = replica_failure(&status).unwrap();
        assert_eq!(p.reason, "FailedCreate");
        assert!(
            p.message.starts_with(
                "FailedCreate: pods \"t-perago-5d\" is forbidden: violates PodSecurity"
            ),
            "{}",
            p.message
        );
        assert_eq!(replica_failure(&DeploymentStatus::default()), None);
    }

    #[test]
    fn a_missing_image_names_the_container_and_the_kubelets_message() {
        let p = problem(&[pod(serde_json::json!({"containerStatuses": [{
            "name": "body", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"x\""}},
        }]}))])
        .unwrap();
        assert_eq!(p.reason, "ImagePullBackOff");
        assert_eq!(
            p.message,
            "pod t-perago-abc: container body: ImagePullBackOff: Back-off pulling image \"x\""
        );
    }

    #[test]
    fn a_crash_loop_carries_the_last_exit_and_the_tail_of_its_log() {
        let p = problem(&[pod(serde_json::json!({"initContainerStatuses": [{
            "name": "perago-sidecar", "image": "s", "imageID": "", "ready": false, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
            "lastState": {"terminated": {"exitCode": 1, "message": "starting\nerror: LakeFS config is incomplete\n"}},
        }]}))])
        .unwrap();
        assert_eq!(p.reason, "CrashLoopBackOff");
        assert_eq!(
            p.message,
            "pod t-perago-abc: container perago-sidecar: CrashLoopBackOff: back-off 40s; last exit \
             code 1: starting | error: LakeFS config is incomplete"
        );
    }

    #[test]
    fn a_failed_runner_install_says_what_the_hook_printed() {
        // The status the kubelet (1.35) gives a native sidecar whose postStart hook failed.
        let hook = "Exec lifecycle hook ([/usr/local/bin/perago-sidecar install-runner --to \
                    /perago-work/bin/perago-runner]) for Container \"perago-sidecar\" in Pod \
                    \"t-perago-abc_data(u-1)\" failed - error: command '...' exited with 1: \
                    error: copying ...: No space left on device (os error 28)\n, message: \"...\"";
        let p = problem(&[pod(serde_json::json!({"initContainerStatuses": [{
            "name": "perago-sidecar", "image": "s", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "PostStartHookError", "message": hook}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}},
        }]}))])
        .unwrap();
        assert_eq!(p.reason, "PostStartHookError");
        assert!(
            p.message.starts_with(
                "pod t-perago-abc: container perago-sidecar: PostStartHookError: Exec lifecycle hook"
            ) && p.message.contains("No space left on device"),
            "{}",
            p.message
        );
    }

    #[test]
    fn unschedulable_pods_say_why_and_starting_pods_are_no_problem() {
        let p = problem(&[pod(serde_json::json!({"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 Insufficient cpu.",
        }]}))])
        .unwrap();
        assert_eq!(p.reason, "Unschedulable");
        assert!(
            p.message
                .ends_with("Unschedulable: 0/1 nodes are available: 1 Insufficient cpu.")
        );
        let starting = pod(serde_json::json!({"containerStatuses": [{
            "name": "body", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}},
        }]}));
        assert_eq!(problem(&[starting]), None);
    }
}
