//! The real lakeFS server: the calls the workspace transaction is built from.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, shared};
use serde_json::{Value, json};

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn new() -> Self {
        let services = shared(Selection {
            lakefs: true,
            ..Selection::default()
        })
        .await;
        Self {
            base: format!("{}/api/v1", services.lakefs().endpoint),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, String) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .basic_auth(LAKEFS_ACCESS_KEY_ID, Some(LAKEFS_SECRET_ACCESS_KEY));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    async fn ok(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let (status, text) = self.call(method.clone(), path, body).await;
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {text}"
        );
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    }

    async fn upload(&self, repo: &str, branch: &str, path: &str, bytes: &'static [u8]) -> Value {
        let resp = self
            .http
            .post(format!(
                "{}/repositories/{repo}/branches/{branch}/objects",
                self.base
            ))
            .query(&[("path", path)])
            .basic_auth(LAKEFS_ACCESS_KEY_ID, Some(LAKEFS_SECRET_ACCESS_KEY))
            .header("Content-Type", "application/octet-stream")
            .body(bytes)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
        resp.json().await.unwrap()
    }
}

#[tokio::test]
async fn repository_branch_upload_commit_log_and_squash_merge() {
    use reqwest::Method;
    let api = Api::new().await;
    let repo = "smoke-repo";
    api.ok(
        Method::POST,
        "/repositories",
        Some(json!({"name": repo, "storage_namespace": format!("local://{repo}-{}", std::process::id()),
                    "default_branch": "main"})),
    )
    .await;
    let base = api
        .ok(
            Method::GET,
            &format!("/repositories/{repo}/branches/main"),
            None,
        )
        .await;
    let input_ref = base["commit_id"].as_str().unwrap().to_owned();

    // A staging branch from the input commit: the create answer is the source commit as text.
    let created = api
        .ok(
            Method::POST,
            &format!("/repositories/{repo}/branches"),
            Some(json!({"name": "staging-1", "source": input_ref})),
        )
        .await;
    assert_eq!(created, Value::String(input_ref.clone()));
    let (status, body) = api
        .call(
            Method::POST,
            &format!("/repositories/{repo}/branches"),
            Some(json!({"name": "staging-1", "source": input_ref})),
        )
        .await;
    assert_eq!(status, 409, "an existing branch is a conflict: {body}");

    let stats = api
        .upload(repo, "staging-1", "audio/render/a.txt", b"hello")
        .await;
    assert_eq!(
        stats["checksum"], "5d41402abc4b2a76b9719d911017c592",
        "checksum is the content MD5"
    );
    let try_commit = api
        .ok(
            Method::POST,
            &format!("/repositories/{repo}/branches/staging-1/commits"),
            Some(json!({"message": "perago try", "metadata": {"perago.phase": "try", "perago.seq": "2"}})),
        )
        .await;
    assert_eq!(try_commit["metadata"]["perago.phase"], "try");
    let listing = api
        .ok(
            Method::GET,
            &format!("/repositories/{repo}/refs/staging-1/objects/ls?prefix=audio/render"),
            None,
        )
        .await;
    assert_eq!(listing["results"][0]["path"], "audio/render/a.txt");

    let merged = api
        .ok(
            Method::POST,
            &format!("/repositories/{repo}/refs/staging-1/merge/main"),
            Some(json!({"squash_merge": true, "metadata": {"perago.phase": "confirm", "perago.expected_head": input_ref}})),
        )
        .await;
    let confirm = merged["reference"].as_str().unwrap().to_owned();
    let head = api
        .ok(
            Method::GET,
            &format!("/repositories/{repo}/branches/main"),
            None,
        )
        .await;
    assert_eq!(head["commit_id"], confirm.as_str());

    let commit = api
        .ok(
            Method::GET,
            &format!("/repositories/{repo}/commits/{confirm}"),
            None,
        )
        .await;
    assert_eq!(
        commit["parents"],
        json!([input_ref]),
        "a squash commit's only parent is the old head"
    );
    assert_eq!(commit["metadata"]["perago.phase"], "confirm");
    assert_eq!(
        commit["metadata"]["perago.expected_head"],
        input_ref.as_str()
    );
    assert!(
        commit["metadata"].get("perago.seq").is_none(),
        "staging metadata is not copied by a squash merge"
    );
    assert_eq!(commit["metadata"][".lakefs.merge.strategy"], "default");

    let log = api
        .ok(
            Method::GET,
            &format!("/repositories/{repo}/refs/{confirm}/commits?first_parent=true&amount=1000&stop_at={input_ref}"),
            None,
        )
        .await;
    let ids: Vec<&str> = log["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![confirm.as_str(), input_ref.as_str()],
        "stop_at is inclusive"
    );
    assert_eq!(log["pagination"]["has_more"], false);

    let (status, _) = api
        .call(
            Method::DELETE,
            &format!("/repositories/{repo}/branches/staging-1"),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let (status, body) = api
        .call(
            Method::GET,
            &format!("/repositories/{repo}/branches/staging-1"),
            None,
        )
        .await;
    assert_eq!(status, 404, "{body}");
}
