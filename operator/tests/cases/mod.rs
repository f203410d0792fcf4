//! Bad PeragoTask declarations and the message each must get: shared by the offline check
//! (`cli.rs`) and the admission webhook on the real node (`admission.rs`).

#![allow(clippy::unwrap_used, dead_code)]

use std::path::Path;

use serde_yaml::Value;

/// The workspace example, the base every case changes one field of.
pub fn base() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/workspace-task.yaml");
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Set `value` at a dotted path (`spec.workspace.prefix`, list indices as numbers).
pub fn set(doc: &mut Value, path: &str, value: Value) {
    let mut node = doc;
    let parts: Vec<&str> = path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        node = match part.parse::<usize>() {
            Ok(i) => &mut node[i],
            Err(_) => &mut node[*part],
        };
    }
    let last = parts[parts.len() - 1];
    match last.parse::<usize>() {
        Ok(i) => node[i] = value,
        Err(_) => {
            node.as_mapping_mut()
                .unwrap()
                .insert(Value::from(last), value);
        }
    }
}

pub fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap()
}

/// (dotted path, value set there, the message the check gives).
pub fn bad_declarations() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        (
            "spec.taskName",
            yaml("'  '"),
            "spec.taskName: task name is required",
        ),
        (
            "spec.taskName",
            yaml("'a/b'"),
            "spec.taskName: task name must not contain path separators",
        ),
        (
            "spec.taskName",
            yaml("'a\\b'"),
            "spec.taskName: task name must not contain path separators",
        ),
        (
            "spec.ownerEmail",
            yaml("' '"),
            "spec.ownerEmail: owner_email is required",
        ),
        (
            "spec.workspace.prefix",
            yaml("'a\\b'"),
            "spec.workspace.prefix: WorkspaceSpec.prefix must use '/' separators",
        ),
        (
            "spec.workspace.prefix",
            yaml("'///'"),
            "spec.workspace.prefix: WorkspaceSpec.prefix must not be empty",
        ),
        (
            "spec.workspace.prefix",
            yaml("'../raw'"),
            "WorkspaceSpec.prefix must stay inside the repository",
        ),
        (
            "spec.workspace.prefix",
            yaml("'audio/render/'"),
            "WorkspaceSpec.prefix must stay inside the repository",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("'/raw/x'"),
            "spec.workspace.pre[0].path: guardrail paths must be relative to WorkspaceSpec(prefix=...)",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("'../raw/x'"),
            "workspace guardrail paths must be relative and must not contain '..'",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("'raw\\x'"),
            "string guardrail paths must use '/' separators",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("'C:/x'"),
            "drive-qualified guardrail paths are not allowed",
        ),
        (
            "spec.workspace.pre.0.path",
            yaml("''"),
            "workspace guardrail paths must be relative and must not contain '..'",
        ),
        (
            "spec.workspace.pre.0.maxCount",
            yaml("3"),
            "spec.workspace.pre[0].kind: require_file does not accept count bounds",
        ),
        (
            "spec.workspace.pre.1.maxCount",
            yaml("0"),
            "spec.workspace.pre[1].minCount: guardrail min_count must be <= max_count",
        ),
        (
            "spec.controls.retry.count",
            yaml("11"),
            "spec.controls.retry.count: must be between 0 and 10",
        ),
        (
            "spec.controls.limits",
            yaml("{rateLimitPerFrequency: 3}"),
            "rate_limit_frequency_in_seconds and rate_limit_per_frequency must be configured together",
        ),
        (
            "spec.controls.publishBudget.lakefsMergeTimeoutSeconds",
            yaml("29"),
            "lakefs_merge_timeout_seconds must cover observed_merge_p99_seconds plus safety_margin_seconds",
        ),
        (
            "spec.controls.timeout",
            yaml("{seconds: 300}"),
            "Conductor requires responseTimeoutSeconds (600) <= timeoutSeconds (300)",
        ),
        (
            "spec.controls.timeout",
            yaml("{seconds: 300, responseSeconds: 60, totalSeconds: 100}"),
            "Conductor requires timeoutSeconds (300) <= totalTimeoutSeconds (100)",
        ),
        (
            "spec.controls.timeout",
            yaml("{responseSeconds: 0}"),
            "Conductor requires responseTimeoutSeconds >= 1",
        ),
        (
            "spec.paramsSchema",
            yaml("{type: string}"),
            "spec.paramsSchema: schema must be a JSON Schema object",
        ),
        (
            "spec.resultSchema",
            yaml("{type: object, properties: {a: {$ref: '#/$defs/Missing'}}}"),
            "$ref '#/$defs/Missing' names no entry of $defs",
        ),
        (
            "spec.workspace.surprise",
            yaml("1"),
            "spec.workspace: unsupported fields: surprise",
        ),
        ("spec.bogus", yaml("1"), "spec: unsupported fields: bogus"),
        (
            "spec.controls.retry.count",
            yaml("'three'"),
            "spec.controls.retry.count: invalid type: string \"three\"",
        ),
        (
            "spec.workspace.pre.0.kind",
            yaml("requireSomething"),
            "spec.workspace.pre[0].kind: unknown variant `requireSomething`",
        ),
        (
            "metadata.name",
            yaml("Features_Build"),
            "metadata.name: 'Features_Build' must be a DNS-1123 label",
        ),
        (
            "apiVersion",
            yaml("perago.io/v9"),
            "apiVersion: unsupported apiVersion 'perago.io/v9'",
        ),
        (
            "spec.executor.autoscaling",
            yaml("{minReplicas: 4, maxReplicas: 3}"),
            "spec.executor.autoscaling: autoscaling.minReplicas must be <= maxReplicas",
        ),
        (
            "spec.executor.replicas",
            yaml("-1"),
            "spec.executor.replicas: must be >= 0",
        ),
        (
            "spec.executor.body.command",
            yaml("[]"),
            "spec.executor.body.command: command is required",
        ),
        (
            "spec.metrics",
            yaml("{application: [{name: rows, kind: gauge, labels: [task_id]}]}"),
            "label 'task_id' is reserved by the runtime",
        ),
        (
            "spec.executor.podTemplate",
            yaml("{hostNetwork: true}"),
            "spec.executor.podTemplate: unsupported fields: hostNetwork",
        ),
        (
            "spec.conductor",
            yaml("{tls: {caBundleRef: {configMap: {name: corp-ca}, secret: {name: corp-ca}}}}"),
            "spec.conductor.tls.caBundleRef: caBundleRef names exactly one of configMap and secret",
        ),
        (
            "spec.lakefs",
            yaml("{tls: {caBundleRef: {secret: {name: corp-ca, key: 'ca/crt'}}}}"),
            "spec.lakefs.tls.caBundleRef.key: \"ca/crt\" is not a ConfigMap or Secret key",
        ),
        (
            "spec.lakefs",
            yaml("{tls: {clientCertificateRef: {name: ' '}}}"),
            "spec.lakefs.tls.clientCertificateRef.name: name is required",
        ),
        (
            "spec.lineage",
            yaml("{openLineage: {url: 'http://:5000/api/v1/lineage'}}"),
            "spec.lineage.openLineage.url: must name a host: \"http://:5000/api/v1/lineage\", such as http://marquez:5000/api/v1/lineage",
        ),
        (
            "spec.lineage",
            yaml("{openLineage: {url: 'https://marquez:5o00/api/v1/lineage'}}"),
            "spec.lineage.openLineage.url: has a port that is not a number up to 65535: \"https://marquez:5o00/api/v1/lineage\", such as http://marquez:5000/api/v1/lineage",
        ),
        (
            "spec.lineage",
            yaml("{openLineage: {url: 'http://marquez:5000/api/v1/lineage', namespace: ' '}}"),
            "spec.lineage.openLineage.namespace: must not be blank; leave it out for the PeragoTask's namespace",
        ),
        (
            "spec.conductor",
            yaml("{domain: 'eu,us'}"),
            "spec.conductor.domain: \"eu,us\" is not a task domain",
        ),
        (
            "spec.conductor",
            yaml("{domain: NO_DOMAIN}"),
            "spec.conductor.domain: NO_DOMAIN is Conductor's word for \"no domain\": leave the domain out",
        ),
        (
            "spec.rollout",
            yaml(
                "{strategy: Canary, steps: [{weight: 50}, {weight: 50}], analysis: {maxFailedPercent: 10, minAttempts: 5}}",
            ),
            "spec.rollout.steps[1].weight: 50% does not increase on the step before (50%)",
        ),
        (
            "spec.rollout",
            yaml(
                "{strategy: Canary, steps: [{weight: 120}], analysis: {maxFailedPercent: 10, minAttempts: 5}}",
            ),
            "spec.rollout.steps[0].weight: 120% is not a share of the pods between 1 and 99",
        ),
        (
            "spec.rollout",
            yaml(
                "{strategy: Canary, steps: [{weight: 10}], analysis: {maxFailedPercent: 10, minAttempts: 0}}",
            ),
            "spec.rollout.analysis.minAttempts: must be at least 1",
        ),
        (
            "spec.rollout",
            yaml("{strategy: Canary, steps: [{weight: 10}]}"),
            "spec.rollout.analysis: a Canary rollout needs an analysis",
        ),
    ]
}
