//! Rendering the task contract (`perago_contract::contract`) from a `PeragoTask`'s spec.

pub use perago_contract::contract::*;

use crate::paths;
use crate::schema;
use crate::task::PeragoTaskSpec;
use crate::validate::FieldError;

/// Render the contract. The spec must have passed [`crate::validate::validate`]; errors are
/// still reported rather than panicking.
pub fn render(spec: &PeragoTaskSpec) -> Result<TaskContract, FieldError> {
    let params_schema = schema::transform(&spec.params_schema, false)
        .map_err(|e| FieldError::new("spec.paramsSchema", e.to_string()))?;
    let result_schema = schema::transform(&spec.result_schema, false)
        .map_err(|e| FieldError::new("spec.resultSchema", e.to_string()))?;
    let workspace = match &spec.workspace {
        Some(ws) => Some(ContractWorkspace {
            prefix: paths::normalize_prefix(&ws.prefix)
                .map_err(|e| FieldError::new("spec.workspace.prefix", e.to_string()))?,
            read_only: ws.read_only,
            pre: ws.pre.clone(),
            post: ws.post.clone(),
        }),
        None => None,
    };
    let writable = workspace.as_ref().is_some_and(|ws| !ws.read_only);
    let timeout = &spec.controls.timeout;
    Ok(TaskContract {
        version: CONTRACT_VERSION,
        task_name: spec.task_name.clone(),
        workspace,
        strict_params: spec.strict_params,
        params_schema,
        result_schema,
        metrics: spec.metrics.clone(),
        slots: u32::try_from(spec.executor.slots.max(1)).unwrap_or(1),
        response_timeout_seconds: timeout.response_seconds,
        timeout_seconds: timeout.seconds,
        publish_budget: if writable {
            spec.controls.publish_budget.clone()
        } else {
            None
        },
    })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::manifest;

    fn spec(yaml: &str) -> PeragoTaskSpec {
        let tasks = manifest::parse(yaml).expect("manifest parses");
        tasks[0].task.spec.clone()
    }

    const BASE: &str = r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {name: t}
spec:
  taskName: demo.count
  ownerEmail: a@b.c
  paramsSchema:
    type: object
    properties:
      n: {type: integer}
      inner: {type: object, properties: {q: {type: string}}}
  resultSchema: {type: object, properties: {total: {type: integer}}, required: [total]}
  strictParams: false
  controls: {timeout: {seconds: 120, responseSeconds: 30}}
  executor: {body: {image: busybox, command: [sh]}, slots: 4}
"#;

    #[test]
    fn workspace_free_contract_carries_strict_schemas_and_timeouts() {
        let c = render(&spec(BASE)).expect("renders");
        assert_eq!(c.version, CONTRACT_VERSION);
        assert!(!c.is_workspace_task());
        assert!(!c.strict_params);
        assert_eq!(c.slots, 4);
        assert_eq!((c.response_timeout_seconds, c.timeout_seconds), (30, 120));
        assert_eq!(c.params_schema["additionalProperties"], Value::Bool(false));
        assert_eq!(
            c.params_schema["properties"]["inner"]["additionalProperties"],
            Value::Bool(false)
        );
        let text = serde_json::to_string(&c).expect("serialises");
        let back: TaskContract = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, c);
    }

    #[test]
    fn read_only_workspace_drops_the_budget_and_normalises_the_prefix() {
        let yaml = BASE.replace(
            "  strictParams: false\n",
            "  strictParams: false\n  workspace: {prefix: '/data/raw', readOnly: true}\n",
        );
        let c = render(&spec(&yaml)).expect("renders");
        let ws = c.workspace.expect("workspace");
        assert_eq!(ws.prefix, "data/raw");
        assert!(ws.read_only);
        assert!(c.publish_budget.is_none());
    }

    /// Found by the `manifest` fuzz target: the operator accepted a task whose contract the
    /// sidecar then refused at start.
    #[test]
    fn a_spec_whose_schemas_the_sidecar_cannot_compile_is_refused() {
        let yaml = BASE.replace("n: {type: integer}", "n: {type: integr}");
        let err = crate::validate(&spec(&yaml)).expect_err("refused");
        assert_eq!(err.field, "spec.paramsSchema");
        assert_eq!(
            err.message,
            r#"not a valid JSON Schema: "integr" is not valid under any of the schemas listed in the 'anyOf' keyword (at '/properties/n/type')"#
        );
        let yaml = BASE.replace("required: [total]", "required: total");
        let err = crate::validate(&spec(&yaml)).expect_err("refused");
        assert_eq!(err.field, "spec.resultSchema");
        crate::validate(&spec(BASE)).expect("the base spec is valid");
    }

    #[test]
    fn network_policy_rules_that_are_switched_off_are_warned_about() {
        let with = |policy: &str| {
            let yaml = BASE.replace("slots: 4}", &format!("slots: 4, networkPolicy: {policy}}}"));
            crate::validate(&spec(&yaml)).expect("valid")
        };
        assert!(with("{enabled: false}").is_empty());
        assert!(with("{egress: [{ports: [{port: 443}]}]}").is_empty());
        assert_eq!(
            with("{enabled: false, egress: [{ports: [{port: 443}]}]}"),
            [crate::validate::NETWORK_POLICY_OFF_WARNING]
        );
    }

    #[test]
    fn persistent_body_limits_are_checked() {
        let with = |body: &str| {
            let yaml = BASE.replace("command: [sh]}", &format!("command: [sh], {body}}}"));
            crate::validate(&spec(&yaml))
                .map(|_| ())
                .map_err(|e| (e.field, e.message))
        };
        assert_eq!(with("mode: persistent"), Ok(()));
        assert_eq!(
            with("mode: persistent, persistent: {maxAttempts: 100, maxMemory: 1Gi}"),
            Ok(())
        );
        assert_eq!(
            with("persistent: {maxAttempts: 3}"),
            Err((
                "spec.executor.body.persistent".into(),
                "applies to mode: persistent only".into()
            ))
        );
        assert_eq!(
            with("mode: persistent, persistent: {maxAttempts: 0}")
                .unwrap_err()
                .0,
            "spec.executor.body.persistent.maxAttempts"
        );
        assert_eq!(
            with("mode: persistent, persistent: {maxMemory: lots}"),
            Err((
                "spec.executor.body.persistent.maxMemory".into(),
                r#""lots" is not a positive memory quantity (such as 512Mi)"#.into()
            ))
        );
    }

    #[test]
    fn unknown_contract_fields_are_refused() {
        let c = render(&spec(BASE)).expect("renders");
        let mut v = serde_json::to_value(&c).expect("value");
        v["surprise"] = Value::Bool(true);
        let err = serde_json::from_value::<TaskContract>(v).expect_err("refused");
        assert!(err.to_string().contains("surprise"), "{err}");
    }
}
