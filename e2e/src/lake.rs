//! A lakeFS client for tests and the demo: the few calls a user makes, as the admin user.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};

/// The few lakeFS calls a user makes, with the harness's admin key.
pub struct Lake {
    endpoint: String,
    /// What a repository's storage namespace starts with.
    namespaces: String,
    http: reqwest::Client,
}

impl Lake {
    /// The harness's lakeFS, on whichever storage it runs.
    pub fn of(lakefs: &crate::services::LakeFs) -> Self {
        Self {
            namespaces: lakefs.namespace(""),
            ..Self::new(&lakefs.endpoint)
        }
    }

    /// A repository for one test, `<prefix>-<process id>`, its main holding `data/in.txt`:
    /// the client, the repository's name and the seed commit.
    pub async fn seeded(
        lakefs: &crate::services::LakeFs,
        prefix: &str,
    ) -> Result<(Self, String, String)> {
        let lake = Self::of(lakefs);
        let repository = format!("{prefix}-{}", std::process::id());
        let input_ref = lake.seed(&repository, &[("data/in.txt", "seed")]).await?;
        Ok((lake, repository, input_ref))
    }

    /// A lakeFS at `endpoint` on the embedded storage.
    pub fn new(endpoint: &str) -> Self {
        Self {
            endpoint: format!("{endpoint}/api/v1"),
            namespaces: "local://".to_owned(),
            // The tests' own driver: what is under test verifies certificates; this one also
            // seeds and reads the lakeFS that serves a private authority's certificate.
            http: reqwest::Client::builder()
                .danger_accept_invalid_certs(true)
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap_or_default(),
        }
    }

    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<String> {
        let resp = request
            .basic_auth(LAKEFS_ACCESS_KEY_ID, Some(LAKEFS_SECRET_ACCESS_KEY))
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("lakeFS answered {status}: {text}");
        }
        Ok(text)
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        let text = self
            .send(self.http.get(format!("{}{path}", self.endpoint)))
            .await?;
        Ok(serde_json::from_str(&text)?)
    }

    pub async fn post(&self, path: &str, body: Value) -> Result<Value> {
        let text = self
            .send(
                self.http
                    .post(format!("{}{path}", self.endpoint))
                    .json(&body),
            )
            .await?;
        // Some calls answer plain text (creating a branch gives its ref).
        Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// A repository whose main holds `files`; returns the seed commit.
    pub async fn seed(&self, repository: &str, files: &[(&str, &str)]) -> Result<String> {
        self.post(
            "/repositories",
            json!({"name": repository, "storage_namespace": format!("{}{repository}", self.namespaces),
                   "default_branch": "main"}),
        )
        .await?;
        for (key, text) in files {
            self.send(
                self.http
                    .post(format!(
                        "{}/repositories/{repository}/branches/main/objects",
                        self.endpoint
                    ))
                    .query(&[("path", key)])
                    .header("Content-Type", "application/octet-stream")
                    .body(text.to_string()),
            )
            .await?;
        }
        let commit = self
            .post(
                &format!("/repositories/{repository}/branches/main/commits"),
                json!({"message": "raw renders"}),
            )
            .await?;
        commit["id"]
            .as_str()
            .map(str::to_owned)
            .context("lakeFS returned a commit without an id")
    }

    /// Key → size of every object at `reference`.
    pub async fn tree(&self, repository: &str, reference: &str) -> Result<BTreeMap<String, u64>> {
        let listing = self
            .get(&format!(
                "/repositories/{repository}/refs/{reference}/objects/ls?amount=1000"
            ))
            .await?;
        Ok(listing["results"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| Some((o["path"].as_str()?.to_owned(), o["size_bytes"].as_u64()?)))
            .collect())
    }

    pub async fn object(&self, repository: &str, reference: &str, key: &str) -> Result<String> {
        self.send(
            self.http
                .get(format!(
                    "{}/repositories/{repository}/refs/{reference}/objects",
                    self.endpoint
                ))
                .query(&[("path", key)]),
        )
        .await
    }
}
