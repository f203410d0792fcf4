//! The real Conductor server: the HTTP calls the operator and sidecar rely on, and the server
//! facts the fences depend on (see docs/conductor-facts.md).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use perago_e2e::{Selection, shared};
use serde_json::{Value, json};

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn new() -> Self {
        let services = shared(Selection {
            conductor: true,
            ..Selection::default()
        })
        .await;
        Self {
            base: services.conductor().api_url.clone(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, String) {
        let resp = req.header("Accept", "*/*").send().await.unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    async fn get(&self, path: &str) -> (u16, String) {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, String) {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }

    async fn put(&self, path: &str, body: Option<&Value>) -> (u16, String) {
        let req = self.http.put(format!("{}{path}", self.base));
        self.send(match body {
            Some(b) => req.json(b),
            None => req,
        })
        .await
    }

    async fn json(&self, path: &str) -> Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Register a one-task workflow around `task` and start it; returns the workflow id.
    async fn start_workflow(&self, task: &str, input: Value) -> String {
        let wf = json!({
            "name": format!("{task}.wf"), "version": 1, "schemaVersion": 2, "ownerEmail": "e2e@example.com",
            "tasks": [{"name": task, "taskReferenceName": "step", "type": "SIMPLE",
                       "inputParameters": {"params": "${workflow.input.params}"}}],
        });
        let (status, body) = self.put("/metadata/workflow", Some(&json!([wf]))).await;
        assert_eq!(status, 200, "register workflow: {body}");
        let (status, id) = self.post(&format!("/workflow/{task}.wf"), &input).await;
        assert_eq!(status, 200, "start workflow: {id}");
        id
    }

    /// Register `task` with the given response timeout, start its workflow and poll the first
    /// attempt as `worker`; returns the workflow id and the polled task.
    async fn begin(&self, task: &str, response_seconds: i64, worker: &str) -> (String, Value) {
        let (status, body) = self
            .post(
                "/metadata/taskdefs",
                &json!([taskdef(task, response_seconds)]),
            )
            .await;
        assert_eq!(status, 200, "register {task}: {body}");
        let wf = self.start_workflow(task, json!({"params": {}})).await;
        (wf, self.poll_one(task, worker).await)
    }

    async fn poll(&self, task: &str, worker: &str) -> Vec<Value> {
        let path = format!("/tasks/poll/batch/{task}?workerid={worker}&count=1&timeout=1000");
        serde_json::from_str(&self.get(&path).await.1).unwrap()
    }

    async fn poll_one(&self, task: &str, worker: &str) -> Value {
        let started = Instant::now();
        loop {
            if let Some(t) = self.poll(task, worker).await.pop() {
                return t;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no task of type {task} was scheduled"
            );
        }
    }

    async fn update(
        &self,
        task: &Value,
        status: &str,
        worker: &str,
        output: Value,
    ) -> (u16, String) {
        self.post(
            "/tasks",
            &json!({"workflowInstanceId": task["workflowInstanceId"], "taskId": task["taskId"],
                    "status": status, "workerId": worker, "outputData": output}),
        )
        .await
    }
}

fn taskdef(name: &str, response_seconds: i64) -> Value {
    json!({"name": name, "ownerEmail": "e2e@example.com", "retryCount": 2, "retryLogic": "FIXED",
           "retryDelaySeconds": 0, "timeoutPolicy": "RETRY", "timeoutSeconds": 0,
           "responseTimeoutSeconds": response_seconds, "inputKeys": ["params"], "outputKeys": ["result"]})
}

#[tokio::test]
async fn taskdef_crud_poll_and_complete() {
    let api = Api::new().await;
    let name = "e2e.smoke";
    let (status, body) = api
        .post("/metadata/taskdefs", &json!([taskdef(name, 30)]))
        .await;
    assert_eq!(status, 200, "{body}");
    let stored = api.json(&format!("/metadata/taskdefs/{name}")).await;
    assert_eq!(stored["responseTimeoutSeconds"], 30);
    let (status, body) = api.get("/metadata/taskdefs/e2e.absent").await;
    assert_eq!(status, 404, "{body}");

    let wf = api.start_workflow(name, json!({"params": {"n": 1}})).await;
    let task = api.poll_one(name, "smoke-worker").await;
    assert_eq!(task["status"], "IN_PROGRESS");
    assert_eq!(task["workerId"], "smoke-worker");
    assert_eq!(task["inputData"]["params"]["n"], 1);
    let (status, body) = api
        .update(
            &task,
            "COMPLETED",
            "smoke-worker",
            json!({"result": {"ok": true}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        task["taskId"].as_str().unwrap(),
        "v1 update answers the task id as text"
    );
    let workflow = api.json(&format!("/workflow/{wf}?includeTasks=true")).await;
    assert_eq!(workflow["status"], "COMPLETED");
    assert_eq!(workflow["tasks"][0]["outputData"]["result"]["ok"], true);
    assert_eq!(workflow["tasks"][0]["workerId"], "smoke-worker");
}

/// What a response-timeout retry does to the attempt identity, and that an update to a task
/// that is no longer IN_PROGRESS is accepted silently.
#[tokio::test]
async fn response_timeout_retry_identity_and_silent_late_update() {
    let api = Api::new().await;
    let name = "e2e.retry-facts";
    let (wf, first) = api.begin(name, 2, "stale-worker").await;

    // Let the lease lapse; the decide call evaluates timeouts at once (SQL queues otherwise
    // re-sweep only every 60-120 s).
    let timed_out_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, body) = api.put(&format!("/workflow/decide/{wf}"), None).await;
    assert!(status == 200 || status == 204, "decide: {status} {body}");
    let old = api
        .json(&format!("/tasks/{}", first["taskId"].as_str().unwrap()))
        .await;
    assert_eq!(old["status"], "TIMED_OUT");
    let workflow = api.json(&format!("/workflow/{wf}?includeTasks=true")).await;
    let tasks = workflow["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "the retry is a second task: {tasks:#?}");
    let retry = &tasks[1];
    assert_eq!(retry["status"], "SCHEDULED");
    assert_ne!(retry["taskId"], first["taskId"], "a retry has a new taskId");
    assert_eq!(retry["retryCount"], 1);
    assert_eq!(retry["retriedTaskId"], first["taskId"]);
    assert_ne!(retry["seq"], first["seq"], "a retry has a new seq");
    assert_eq!(retry["referenceTaskName"], first["referenceTaskName"]);
    assert_eq!(retry["taskDefName"], first["taskDefName"]);
    assert_eq!(retry["workflowInstanceId"], first["workflowInstanceId"]);
    assert_eq!(
        retry.get("iteration").and_then(Value::as_i64).unwrap_or(0),
        0
    );
    eprintln!(
        "retry scheduled {:.1?} after the lease lapsed (with decide)",
        timed_out_at.elapsed()
    );

    // The stale worker's completion is answered 200 and changes nothing.
    let (status, body) = api
        .update(
            &first,
            "COMPLETED",
            "stale-worker",
            json!({"result": {"late": true}}),
        )
        .await;
    assert_eq!(status, 200, "late update is accepted silently: {body}");
    let old = api
        .json(&format!("/tasks/{}", first["taskId"].as_str().unwrap()))
        .await;
    assert_eq!(old["status"], "TIMED_OUT");
    assert!(
        old["outputData"].get("result").is_none(),
        "late output was not stored: {old}"
    );

    let second = api.poll_one(name, "live-worker").await;
    assert_eq!(second["taskId"], retry["taskId"]);
    let (status, _) = api
        .update(
            &second,
            "COMPLETED",
            "live-worker",
            json!({"result": {"ok": true}}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        api.json(&format!("/workflow/{wf}")).await["status"],
        "COMPLETED"
    );
}

/// Lease extension keeps an attempt alive past responseTimeoutSeconds.
#[tokio::test]
async fn lease_extension_keeps_the_attempt() {
    let api = Api::new().await;
    let (wf, task) = api.begin("e2e.lease", 2, "leasing-worker").await;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (status, body) = api
            .post(
                "/tasks",
                &json!({"workflowInstanceId": task["workflowInstanceId"], "taskId": task["taskId"],
                        "status": "IN_PROGRESS", "extendLease": true, "workerId": "leasing-worker"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        api.put(&format!("/workflow/decide/{wf}"), None).await;
    }
    let fresh = api
        .json(&format!("/tasks/{}", task["taskId"].as_str().unwrap()))
        .await;
    assert_eq!(
        fresh["status"], "IN_PROGRESS",
        "4 s > 2 s response timeout, kept alive by extensions"
    );
    assert_eq!(fresh["workerId"], "leasing-worker");
    let (status, _) = api
        .update(&task, "COMPLETED", "leasing-worker", json!({"result": {}}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        api.json(&format!("/workflow/{wf}")).await["status"],
        "COMPLETED"
    );
}

/// Without the decide call, the SQLite-queued server notices a lapsed lease only on its own
/// sweep; this measures how long that takes (docs/conductor-facts.md).
#[tokio::test]
async fn sweeper_alone_reschedules_a_lapsed_attempt() {
    let api = Api::new().await;
    let (wf, first) = api.begin("e2e.sweeper", 2, "silent-worker").await;
    let polled = Instant::now();
    loop {
        let workflow = api.json(&format!("/workflow/{wf}?includeTasks=true")).await;
        if workflow["tasks"].as_array().map_or(0, Vec::len) > 1 {
            assert_eq!(workflow["tasks"][1]["retriedTaskId"], first["taskId"]);
            eprintln!(
                "sweeper rescheduled the attempt {:.0?} after the poll (responseTimeoutSeconds=2)",
                polled.elapsed()
            );
            break;
        }
        assert!(
            polled.elapsed() < Duration::from_secs(240),
            "no retry within 240 s of the poll"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
