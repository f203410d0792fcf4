//! One lakeFS, one client: its calls, each with a timeout, retried when it is safe to repeat
//! (reads, branch creation and deletion, the link of an uploaded address) and sent once
//! when a lost answer may hide its effect (commits, merges). Uploads are in [`crate::upload`];
//! the presigned data path's rules in [`crate::direct`].

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use backon::Retryable;
use reqwest::{Method, StatusCode};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::json;

use perago_contract::trust::{Tls, TlsClient};
use perago_contract::url::path_segment as segment;

use crate::answer::{Commit, MergeResult, ObjectEntry, ObjectErrorList, Page, Ref};
use crate::{Call, LakeFsError, decode, direct, error_message, retries};

#[derive(Clone)]
pub struct LakeFsClient {
    pub(crate) http: TlsClient,
    /// Ends in `/api/v1`.
    base: String,
    access_key_id: String,
    secret_access_key: String,
    pub(crate) timeout: Duration,
    /// The object store hosts presigned URLs may point at, once bytes go there directly
    /// ([`direct`]); unset: every byte goes through lakeFS. Shared by the clones, so one
    /// decision, at start or later, holds for every part of the process.
    pub(crate) direct: Arc<OnceLock<direct::ObjectStoreHosts>>,
    /// The W3C `traceparent` to send with each call, when the caller is in a trace.
    trace_context: Option<TraceContext>,
}

/// Gives the W3C `traceparent` of the caller's current trace, if any; sent as the
/// `traceparent` header of every lakeFS call (not of presigned object-store requests).
pub type TraceContext = Arc<dyn Fn() -> Option<String> + Send + Sync>;

impl std::fmt::Debug for LakeFsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeFsClient")
            .field("base", &self.base)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Every client's HTTP settings: the connect timeout is the call timeout's, at most 5 s.
fn builder(timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder().connect_timeout(timeout.min(Duration::from_secs(5)))
}

/// Largest page lakeFS serves.
const PAGE: u32 = 1000;

impl LakeFsClient {
    pub fn new(
        endpoint: &str,
        access_key_id: &str,
        secret_access_key: &str,
        timeout: Duration,
    ) -> Result<Self, reqwest::Error> {
        let http = TlsClient::fixed(builder(timeout).build()?);
        Ok(Self::with_http(
            http,
            endpoint,
            access_key_id,
            secret_access_key,
            timeout,
        ))
    }

    /// [`Self::new`], also trusting the certificate authorities of `tls` (a private CA)
    /// beside the built-in web roots and the platform's (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the
    /// OS store), and presenting its client certificate, read again when its files change.
    /// The certificate is read and checked here.
    pub fn with_tls(
        endpoint: &str,
        access_key_id: &str,
        secret_access_key: &str,
        timeout: Duration,
        tls: Tls,
    ) -> Result<Self, String> {
        let http = TlsClient::build(tls, move || builder(timeout))?;
        Ok(Self::with_http(
            http,
            endpoint,
            access_key_id,
            secret_access_key,
            timeout,
        ))
    }

    fn with_http(
        http: TlsClient,
        endpoint: &str,
        access_key_id: &str,
        secret_access_key: &str,
        timeout: Duration,
    ) -> Self {
        let endpoint = endpoint.trim_end_matches('/');
        let base = if endpoint.ends_with("/api/v1") {
            endpoint.to_owned()
        } else {
            format!("{endpoint}/api/v1")
        };
        Self {
            http,
            base,
            access_key_id: access_key_id.to_owned(),
            secret_access_key: secret_access_key.to_owned(),
            timeout,
            direct: Arc::default(),
            trace_context: None,
        }
    }

    /// The client certificate presented now, when there is one.
    pub fn client_certificate(&self) -> Option<perago_contract::trust::ClientCertificate> {
        self.http.certificate()
    }

    /// From now on, this client and its clones move object bytes straight to and from the
    /// object store through URLs lakeFS presigns, on `hosts` only. Transfers already under
    /// way finish on the path they started on; a second call changes nothing.
    pub fn go_direct(&self, hosts: direct::ObjectStoreHosts) {
        let _ = self.direct.set(hosts);
    }

    /// Object bytes go to the object store directly.
    pub fn presigns(&self) -> bool {
        self.direct.get().is_some()
    }
}

// How every call is sent and its answer read.
impl LakeFsClient {
    pub(crate) fn request(
        &self,
        method: Method,
        path: &str,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let request = self
            .http
            .client()
            .request(method, format!("{}{path}", self.base))
            .basic_auth(&self.access_key_id, Some(&self.secret_access_key))
            .timeout(timeout);
        match self.trace_context.as_ref().and_then(|current| current()) {
            Some(traceparent) => request.header("traceparent", traceparent),
            None => request,
        }
    }

    /// Send the `traceparent` `current` gives with every lakeFS call.
    pub fn with_trace_context(mut self, current: TraceContext) -> Self {
        self.trace_context = Some(current);
        self
    }

    /// Send once; a failure status is lakeFS's refusal, with its message.
    pub(crate) async fn once(
        &self,
        call: Call<'_>,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, LakeFsError> {
        let response = request.send().await.map_err(|e| call.transport(e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        Err(call.refused(status, error_message(&text)))
    }

    /// Send with retries on transient answers (idempotent calls only).
    async fn idempotent(
        &self,
        call: Call<'_>,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, LakeFsError> {
        (|| self.once(call, build()))
            .retry(retries())
            .when(LakeFsError::transient)
            .await
    }

    /// An idempotent call (retried on transient answers) and its JSON answer.
    pub(crate) async fn json_retried<T: DeserializeOwned>(
        &self,
        call: Call<'_>,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<T, LakeFsError> {
        Self::json(call, self.idempotent(call, build).await?).await
    }

    /// A read: GET `path` with `query`, retried on transient answers, and its JSON answer.
    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        call: Call<'_>,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<T, LakeFsError> {
        self.json_retried(call, || {
            self.request(Method::GET, path, self.timeout).query(query)
        })
        .await
    }

    /// A call that is never retried (a lost answer may hide its effect) and its JSON answer.
    async fn json_once<T: DeserializeOwned>(
        &self,
        call: Call<'_>,
        request: reqwest::RequestBuilder,
    ) -> Result<T, LakeFsError> {
        Self::json(call, self.once(call, request).await?).await
    }

    pub(crate) async fn json<T: DeserializeOwned>(
        call: Call<'_>,
        response: reqwest::Response,
    ) -> Result<T, LakeFsError> {
        let bytes = response.bytes().await.map_err(|e| call.transport(e))?;
        decode(call, &bytes)
    }

    /// Up to `limit` entries of the paginated listing at `path` with `query`, following
    /// `next_offset`; the flag says lakeFS has more.
    async fn paginate<T: DeserializeOwned>(
        &self,
        call: Call<'_>,
        path: &str,
        query: &[(&str, &str)],
        limit: usize,
    ) -> Result<(Vec<T>, bool), LakeFsError> {
        let mut after = String::new();
        let mut all = Vec::new();
        loop {
            let amount = (limit - all.len()).clamp(1, PAGE as usize).to_string();
            let mut paged = query.to_vec();
            paged.extend([("after", after.as_str()), ("amount", amount.as_str())]);
            let page: Page<T> = self.get(call, path, &paged).await?;
            let (results, next) = page.into_parts(call, &after)?;
            all.extend(results);
            match next {
                Some(next) if all.len() < limit => after = next,
                _ => {
                    all.truncate(limit);
                    return Ok((all, next.is_some()));
                }
            }
        }
    }
}

impl Call<'_> {
    /// `/repositories/{repository}/{collection}/{reference}{rest}`: the path of a call on the
    /// ref its errors name, the names percent-encoded.
    pub(crate) fn path(self, collection: &str, rest: &str) -> String {
        format!(
            "/repositories/{}/{collection}/{}{rest}",
            segment(self.repository),
            segment(self.reference)
        )
    }
}

/// `/repositories/{repository}{rest}`, for a call whose path names no ref or another one.
fn repository_path(repository: &str, rest: &str) -> String {
    format!("/repositories/{}{rest}", segment(repository))
}

// The calls.
impl LakeFsClient {
    /// What lakeFS says of its object store.
    pub async fn storage_config(&self) -> Result<direct::StorageConfig, LakeFsError> {
        let call = Call::new("get storage config", "", "");
        self.get(call, "/config/storage", &[]).await
    }

    /// Every object under `prefix` at `reference`, recursively, following pagination.
    pub async fn list_objects(
        &self,
        repository: &str,
        reference: &str,
        prefix: &str,
    ) -> Result<Vec<ObjectEntry>, LakeFsError> {
        let call = Call::new("list objects", repository, reference);
        // With the direct data path, each entry carries a URL to read its bytes from.
        let presign = if self.presigns() { "true" } else { "false" };
        let query = [("prefix", prefix), ("presign", presign)];
        let (all, _): (Vec<ObjectEntry>, _) = self
            .paginate(call, &call.path("refs", "/objects/ls"), &query, usize::MAX)
            .await?;
        Ok(all
            .into_iter()
            .filter(|e| e.path_type == "object")
            .collect())
    }

    /// Stream the bytes of a listed object: from the URL lakeFS presigned for it with the
    /// direct data path, through lakeFS otherwise. `timeout` bounds the whole transfer.
    pub async fn open_object(
        &self,
        repository: &str,
        reference: &str,
        entry: &ObjectEntry,
        timeout: Duration,
    ) -> Result<reqwest::Response, LakeFsError> {
        let (Some(hosts), Some(url)) = (self.direct.get(), entry.presigned_url()) else {
            return self
                .get_object(repository, reference, &entry.path, timeout)
                .await;
        };
        let key = entry.path.as_str();
        let mut url = direct::allowed_url(hosts, url, "get", repository, reference, key)?;
        let mut renewed = false;
        loop {
            let got = (|| self.get_from_store(&url, repository, reference, entry, timeout))
                .retry(retries())
                .when(LakeFsError::transient)
                .await;
            match got {
                // A URL that expired before its turn came (a long download): asked again once.
                Err(e) if e.store_status() == Some(StatusCode::FORBIDDEN) && !renewed => {
                    renewed = true;
                    tracing::info!(error = %e, "the object store refused a presigned download URL (expired?); asking lakeFS for a new one");
                    let fresh = self.stat_presigned(repository, reference, key).await?;
                    let Some(fresh) = fresh.presigned_url() else {
                        return Err(e);
                    };
                    url = direct::allowed_url(hosts, fresh, "get", repository, reference, key)?;
                }
                other => return other,
            }
        }
    }

    /// One GET of a presigned URL; the object store's ETag must be lakeFS's checksum.
    async fn get_from_store(
        &self,
        url: &reqwest::Url,
        repository: &str,
        reference: &str,
        entry: &ObjectEntry,
        timeout: Duration,
    ) -> Result<reqwest::Response, LakeFsError> {
        let key = entry.path.as_str();
        let failed =
            |status, detail| direct::store_error("get", repository, reference, key, status, detail);
        // Never lakeFS's credentials: the URL carries its own signature.
        let response = self
            .http
            .client()
            .get(url.clone())
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| direct::transport("get", repository, reference, key, e))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(failed(Some(status), direct::store_message(status, &text)));
        }
        match direct::etag(&response) {
            Some(etag)
                if !entry.checksum.is_empty() && !etag.eq_ignore_ascii_case(&entry.checksum) =>
            {
                Err(failed(
                    None,
                    format!(
                        "the object store holds ETag {etag} there, lakeFS recorded checksum {}",
                        entry.checksum
                    ),
                ))
            }
            _ => Ok(response),
        }
    }

    /// An object's entry with a freshly presigned URL.
    async fn stat_presigned(
        &self,
        repository: &str,
        reference: &str,
        key: &str,
    ) -> Result<ObjectEntry, LakeFsError> {
        let call = Call::new("stat object", repository, reference);
        let query = [("path", key), ("presign", "true")];
        self.get(call, &call.path("refs", "/objects/stat"), &query)
            .await
    }

    /// Stream an object's bytes. `timeout` bounds the whole transfer.
    pub async fn get_object(
        &self,
        repository: &str,
        reference: &str,
        key: &str,
        timeout: Duration,
    ) -> Result<reqwest::Response, LakeFsError> {
        let call = Call::new("get object", repository, reference);
        let path = call.path("refs", "/objects");
        self.idempotent(call, || {
            self.request(Method::GET, &path, timeout)
                .query(&[("path", key)])
        })
        .await
    }

    /// The commit a branch points at.
    pub async fn branch_head(&self, repository: &str, branch: &str) -> Result<String, LakeFsError> {
        let call = Call::new("get branch", repository, branch);
        let answer: Ref = self.get(call, &call.path("branches", ""), &[]).await?;
        answer.commit(call)
    }

    /// Create `name` from `source`; fails (409) if it exists.
    pub async fn create_branch(
        &self,
        repository: &str,
        name: &str,
        source: &str,
    ) -> Result<(), LakeFsError> {
        let call = Call::new("create branch", repository, name);
        let path = repository_path(repository, "/branches");
        let body = json!({"name": name, "source": source});
        self.once(
            call,
            self.request(Method::POST, &path, self.timeout).json(&body),
        )
        .await
        .map(drop)
    }

    /// Delete a branch; one that is already gone is not an error.
    pub async fn delete_branch(&self, repository: &str, name: &str) -> Result<(), LakeFsError> {
        let call = Call::new("delete branch", repository, name);
        let path = call.path("branches", "");
        match self
            .idempotent(call, || self.request(Method::DELETE, &path, self.timeout))
            .await
        {
            Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Drop the uncommitted change of `key` on a branch: it reads as in the branch's head
    /// commit again. Retried (resetting twice is resetting once).
    pub async fn reset_object(
        &self,
        repository: &str,
        branch: &str,
        key: &str,
    ) -> Result<(), LakeFsError> {
        let call = Call::new("reset object", repository, branch);
        let path = call.path("branches", "");
        let body = json!({"type": "object", "path": key});
        self.idempotent(call, || {
            self.request(Method::PUT, &path, self.timeout).json(&body)
        })
        .await
        .map(drop)
    }

    /// Delete keys from a branch, at most 1000 per request; missing keys are not errors.
    pub async fn delete_objects(
        &self,
        repository: &str,
        branch: &str,
        keys: &[String],
    ) -> Result<(), LakeFsError> {
        let call = Call::new("delete objects", repository, branch);
        let path = call.path("branches", "/objects/delete");
        for chunk in keys.chunks(PAGE as usize) {
            let body = json!({"paths": chunk});
            let answer: ObjectErrorList = self
                .json_retried(call, || {
                    self.request(Method::POST, &path, self.timeout).json(&body)
                })
                .await?;
            answer.check(call)?;
        }
        Ok(())
    }

    /// Commit what is staged on a branch. Never retried: a lost answer may hide a commit.
    pub async fn commit(
        &self,
        repository: &str,
        branch: &str,
        message: &str,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Commit, LakeFsError> {
        let call = Call::new("commit", repository, branch);
        let path = call.path("branches", "/commits");
        let body = json!({"message": message, "metadata": metadata});
        self.json_once(
            call,
            self.request(Method::POST, &path, self.timeout).json(&body),
        )
        .await
    }

    /// Squash-merge `source` into `destination` with `metadata` on the merge commit; returns
    /// the new commit. Never retried: a timeout leaves the outcome uncertain.
    pub async fn squash_merge(
        &self,
        repository: &str,
        source: &str,
        destination: &str,
        metadata: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<String, LakeFsError> {
        let call = Call::new("merge", repository, destination);
        let path = repository_path(
            repository,
            &format!("/refs/{}/merge/{}", segment(source), segment(destination)),
        );
        let body = json!({"metadata": metadata, "squash_merge": true});
        let answer: MergeResult = self
            .json_once(call, self.request(Method::POST, &path, timeout).json(&body))
            .await?;
        answer.commit(call)
    }

    /// How many uncommitted changes `branch` holds, reading at most `amount`; the flag says
    /// there are more.
    pub async fn uncommitted(
        &self,
        repository: &str,
        branch: &str,
        amount: u32,
    ) -> Result<(usize, bool), LakeFsError> {
        let call = Call::new("diff branch", repository, branch);
        let amount = amount.clamp(1, PAGE).to_string();
        // Only counted: each change is read past, not decoded.
        let page: Page<IgnoredAny> = self
            .get(
                call,
                &call.path("branches", "/diff"),
                &[("amount", &amount)],
            )
            .await?;
        Ok((page.results.len(), page.pagination.has_more))
    }

    /// Branch names starting with `prefix`.
    pub async fn list_branches(
        &self,
        repository: &str,
        prefix: &str,
    ) -> Result<Vec<String>, LakeFsError> {
        let call = Call::new("list branches", repository, prefix);
        let path = repository_path(repository, "/branches");
        let (branches, _): (Vec<Ref>, _) = self
            .paginate(call, &path, &[("prefix", prefix)], usize::MAX)
            .await?;
        // An entry without a name is no branch to act on.
        Ok(branches
            .into_iter()
            .map(|b| b.id)
            .filter(|id| !id.is_empty())
            .collect())
    }

    pub async fn get_commit(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<Commit, LakeFsError> {
        let call = Call::new("get commit", repository, reference);
        self.get(call, &call.path("commits", ""), &[]).await
    }

    /// Up to `limit` commits of the first-parent history from `reference`, newest first,
    /// stopping after `stop_at` (inclusive) when it is met.
    pub async fn first_parent_log(
        &self,
        repository: &str,
        reference: &str,
        stop_at: &str,
        limit: usize,
    ) -> Result<(Vec<Commit>, bool), LakeFsError> {
        let call = Call::new("log commits", repository, reference);
        let query = [("first_parent", "true"), ("stop_at", stop_at)];
        self.paginate(call, &call.path("refs", "/commits"), &query, limit)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MergeOutcome;

    #[test]
    fn the_base_url_gets_the_api_path_once() {
        let a = LakeFsClient::new("http://l:8000", "k", "s", Duration::from_secs(1)).unwrap();
        let b =
            LakeFsClient::new("http://l:8000/api/v1/", "k", "s", Duration::from_secs(1)).unwrap();
        assert_eq!(a.base, "http://l:8000/api/v1");
        assert_eq!(b.base, a.base);
        assert!(
            !format!("{a:?}").contains("\"s\""),
            "the secret never prints"
        );
    }

    #[tokio::test]
    async fn transport_errors_keep_the_cause_and_leave_out_the_url() {
        // A loopback port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = LakeFsClient::new(
            &format!("http://127.0.0.1:{port}"),
            "k",
            "s",
            Duration::from_secs(5),
        )
        .unwrap();
        let long_ref = format!("perago-staging-{}", "b".repeat(300));
        let prefix = "p/".repeat(300);
        let err = c
            .list_objects("repo", &long_ref, &prefix)
            .await
            .unwrap_err();
        // Nothing listens: no request went out.
        assert_eq!(err.merge_outcome(), MergeOutcome::NotApplied);
        let text = err.to_string();
        assert!(
            text.starts_with("lakeFS list objects on repo@perago-staging-bbb"),
            "{text}"
        );
        assert!(text.contains("b…b"), "the long ref is shortened: {text}");
        assert!(
            text.contains("b could not be sent: error sending request"),
            "{text}"
        );
        assert!(
            text.ends_with("Connection refused (os error 111)"),
            "{text}"
        );
        assert!(
            !text.contains("127.0.0.1") && !text.contains("p/p/"),
            "{text}"
        );
        assert!(text.chars().count() < 250, "{text}");
    }

    /// A lakeFS stand-in answering every request with `body`.
    async fn answering(body: &'static str) -> LakeFsClient {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(move || async move { ([("content-type", "application/json")], body) });
        tokio::spawn(async move { axum::serve(listener, app).await });
        LakeFsClient::new(
            &format!("http://{address}"),
            "k",
            "s",
            Duration::from_secs(5),
        )
        .unwrap()
    }

    /// Found by the `lakefs_response` fuzz target: a page that says it has more results but
    /// gives no new offset made the listing fetch the same page forever, growing without
    /// bound.
    #[tokio::test]
    async fn a_page_with_more_results_but_no_new_offset_ends_the_listing() {
        for (body, why) in [
            (
                r#"{"pagination":{"has_more":true},"results":[{"path":"a","path_type":"object"}]}"#,
                "the page has more results but no next_offset",
            ),
            (
                r#"{"pagination":{"has_more":true,"next_offset":"a"},"results":[{"path":"a","path_type":"object"}]}"#,
                "the page has more results but its next_offset is the offset it was listed after ('a')",
            ),
        ] {
            let c = answering(body).await;
            let listed =
                tokio::time::timeout(Duration::from_secs(10), c.list_objects("repo", "main", ""))
                    .await
                    .expect("the listing ends");
            assert_eq!(
                listed.unwrap_err().to_string(),
                format!("lakeFS list objects on repo@main returned an unreadable answer: {why}")
            );
            let logged = tokio::time::timeout(
                Duration::from_secs(10),
                c.first_parent_log("repo", "main", "c0", 5000),
            )
            .await
            .expect("the log ends");
            assert!(logged.is_err(), "{logged:?}");
        }
    }

    /// A lakeFS stand-in answering `{}` to every request, keeping each as `METHOD path?query`.
    async fn recording() -> (LakeFsClient, Arc<std::sync::Mutex<Vec<String>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = seen.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(move |method: Method, uri: axum::http::Uri| {
            let kept = kept.clone();
            async move {
                kept.lock().unwrap().push(format!("{method} {uri}"));
                ([("content-type", "application/json")], "{}")
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = LakeFsClient::new(
            &format!("http://{address}"),
            "k",
            "s",
            Duration::from_secs(5),
        )
        .unwrap();
        (client, seen)
    }

    /// Each call goes to lakeFS's path for it, every name percent-encoded, once: `{}` is no
    /// answer most calls can read, and an unreadable answer is not asked for again.
    #[tokio::test]
    async fn every_call_goes_to_its_path_with_its_names_encoded() {
        let (c, seen) = recording().await;
        let t = Duration::from_secs(5);
        let m = BTreeMap::new();
        let file = std::env::temp_dir().join(format!("perago-lakefs-paths-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        let _ = c.storage_config().await;
        let _ = c.list_objects("r", "a/b", "p/").await;
        let _ = c.get_object("r", "main", "k 1", t).await;
        let _ = c.stat_presigned("r", "main", "k").await;
        let _ = c.branch_head("r", "main").await;
        let _ = c.create_branch("r", "x", "main").await;
        let _ = c.delete_branch("r", "x").await;
        let _ = c.upload("r", "x", "k", &file, t).await;
        let _ = c.delete_objects("r", "x", &["k".into()]).await;
        let _ = c.commit("r", "x", "m", &m).await;
        let _ = c.squash_merge("r", "x", "main", &m, t).await;
        let _ = c.uncommitted("r", "x", 5).await;
        let _ = c.list_branches("r", "perago-").await;
        let _ = c.get_commit("r", "c0").await;
        let _ = c.first_parent_log("r", "main", "c0", 10).await;
        std::fs::remove_file(&file).unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                "GET /api/v1/config/storage",
                "GET /api/v1/repositories/r/refs/a%2Fb/objects/ls?prefix=p%2F&presign=false&after=&amount=1000",
                "GET /api/v1/repositories/r/refs/main/objects?path=k+1",
                "GET /api/v1/repositories/r/refs/main/objects/stat?path=k&presign=true",
                "GET /api/v1/repositories/r/branches/main",
                "POST /api/v1/repositories/r/branches",
                "DELETE /api/v1/repositories/r/branches/x",
                "POST /api/v1/repositories/r/branches/x/objects?path=k",
                "POST /api/v1/repositories/r/branches/x/objects/delete",
                "POST /api/v1/repositories/r/branches/x/commits",
                "POST /api/v1/repositories/r/refs/x/merge/main",
                "GET /api/v1/repositories/r/branches/x/diff?amount=5",
                "GET /api/v1/repositories/r/branches?prefix=perago-&after=&amount=1000",
                "GET /api/v1/repositories/r/commits/c0",
                "GET /api/v1/repositories/r/refs/main/commits?first_parent=true&stop_at=c0&after=&amount=10",
            ]
        );
    }
}
