//! The Argo CD health check (`deploy/argocd/peragotask-health.lua`) run by a Lua 5.4 VM, as
//! Argo CD runs it, against status fixtures.

#![allow(clippy::unwrap_used)]

use mlua::{Lua, LuaSerdeExt};
use serde_json::{Value, json};

fn health(obj: &Value) -> (String, String) {
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/argocd/peragotask-health.lua"
    ))
    .unwrap();
    let lua = Lua::new();
    lua.globals()
        .set("obj", lua.to_value(obj).unwrap())
        .unwrap();
    let result: mlua::Table = lua.load(&script).eval().unwrap();
    (
        result.get("status").unwrap(),
        result
            .get::<Option<String>>("message")
            .unwrap()
            .unwrap_or_default(),
    )
}

/// A PeragoTask as Argo CD sees it; a null status is left out (absent fields are nil in Lua).
fn task(generation: i64, status: Value) -> Value {
    let mut obj = json!({"apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask",
                         "metadata": {"name": "t", "generation": generation}});
    if !status.is_null() {
        obj["status"] = status;
    }
    obj
}

fn cond(t: &str, s: &str, message: &str) -> Value {
    json!({"type": t, "status": s, "reason": "R", "message": message})
}

#[test]
fn health_follows_the_conditions() {
    assert_eq!(health(&task(1, Value::Null)).0, "Progressing");
    let ready = json!({"observedGeneration": 2, "conditions": [
        cond("Ready", "True", "TaskDef registered; 2/2 executor pods ready"), cond("Reconciling", "False", ""), cond("Stalled", "False", "")]});
    assert_eq!(
        health(&task(2, ready.clone())),
        (
            "Healthy".into(),
            "TaskDef registered; 2/2 executor pods ready".into()
        )
    );
    assert_eq!(
        health(&task(3, ready)).0,
        "Progressing",
        "an unobserved generation is not healthy yet"
    );
    let rolling = json!({"observedGeneration": 1, "conditions": [
        cond("Ready", "False", "waiting for executor pods (0/1 ready)"), cond("Reconciling", "True", "x"), cond("Stalled", "False", "")]});
    assert_eq!(
        health(&task(1, rolling)),
        (
            "Progressing".into(),
            "waiting for executor pods (0/1 ready)".into()
        )
    );
    let stalled = json!({"observedGeneration": 1, "conditions": [
        cond("Ready", "False", "m"), cond("Stalled", "True", "spec.workspace.pre[0].path: workspace guardrail paths must be relative and must not contain '..'")]});
    let (status, message) = health(&task(1, stalled));
    assert_eq!(status, "Degraded");
    assert!(message.contains("must not contain '..'"));
}
