//! The lakeFS calls of the workspace transaction. Every call has a timeout and its errors
//! name the call, the repository and the ref, then the cause: never the request URL (its
//! query can hold a whole object key), and a ref longer than [`REF_MAX`] characters is
//! shortened, so the cause survives the cut of a failure reason. Idempotent calls are retried
//! on transient answers (connection errors, 429 and every 5xx); commits and merges
//! never are, except a merge lakeFS refused outright (see [`LakeFsError::merge_refused`]),
//! which the attempt tries again within its merge budget.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::de::IgnoredAny;
use serde_json::json;

use backon::Retryable;

use perago_contract::url::path_segment as segment;

use perago_contract::text::clip_path;

mod answer;
pub mod direct;
mod error;
pub mod flags;
mod merge;
mod retry;

use answer::Page;
pub use answer::{Commit, ObjectEntry};
#[doc(hidden)] // public for the fuzz targets
pub use answer::{MergeResult, ObjectError, ObjectErrorList, Ref, decode, error_message, page};
pub use error::{Call, ErrorKind, LakeFsError, REF_MAX, request_error};
pub use merge::MergeOutcome;
pub use retry::idempotent_call as retries;

/// The largest block an upload reads from its file at once (per transfer, so memory stays
/// bounded by the transfer parallelism). 256 KiB keeps 16 transfers of 1 MiB files to a few
/// MiB of blocks in flight; 1 MiB blocks were no faster for a 1 GiB file and added up to
/// 20 MiB of peak memory (`--bench workspace`, (b) and (c)).
const UPLOAD_BLOCK: usize = 256 * 1024;

/// A file opened for an upload. Each read from a file is a trip to the blocking pool: a file
/// of at most one block is read whole in the trip that opens it, a larger one streamed a
/// block at a time.
enum Opened {
    Whole(Vec<u8>),
    Streamed(std::fs::File, u64),
}

impl Opened {
    async fn open(path: &std::path::Path) -> std::io::Result<Self> {
        use std::io::{Read, Seek};
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::open(&path)?;
            let size = file.metadata()?.len();
            match usize::try_from(size) {
                Ok(small) if small <= UPLOAD_BLOCK => {
                    // A byte more than its size shows a file still growing: streamed, then.
                    let mut bytes = Vec::with_capacity(small + 1);
                    (&mut file).take(size + 1).read_to_end(&mut bytes)?;
                    if bytes.len() <= small {
                        return Ok(Self::Whole(bytes));
                    }
                    file.seek(std::io::SeekFrom::Start(0))?;
                    let size = file.metadata()?.len();
                    Ok(Self::Streamed(file, size))
                }
                _ => Ok(Self::Streamed(file, size)),
            }
        })
        .await
        .map_err(std::io::Error::other)?
    }

    fn len(&self) -> u64 {
        match self {
            Self::Whole(bytes) => bytes.len() as u64,
            Self::Streamed(_, size) => *size,
        }
    }

    /// The request body, its bytes counted and hashed into `tally` as they are sent.
    fn into_body(self, tally: Option<direct::Tally>) -> reqwest::Body {
        use futures_util::StreamExt;
        match (self, tally) {
            (Self::Whole(bytes), tally) => {
                if let Some(t) = tally {
                    t.add(&bytes);
                }
                reqwest::Body::from(bytes)
            }
            (Self::Streamed(file, _), tally) => {
                let stream = tokio_util::io::ReaderStream::with_capacity(
                    tokio::fs::File::from_std(file),
                    UPLOAD_BLOCK,
                )
                .inspect(move |chunk| {
                    if let (Some(t), Ok(chunk)) = (&tally, chunk) {
                        t.add(chunk);
                    }
                });
                reqwest::Body::wrap_stream(stream)
            }
        }
    }
}

/// A local file an upload could not read: final, and nothing was sent.
fn unreadable_file(call: Call<'_>, file: &std::path::Path, e: std::io::Error) -> LakeFsError {
    call.error(ErrorKind::NotSent(format!(
        "reading {}: {e}",
        clip_path(file)
    )))
}

/// Why one upload try failed: the local file could not be read (final), or lakeFS refused.
enum Upload {
    Unreadable(LakeFsError),
    Refused(LakeFsError),
}

#[derive(Clone)]
pub struct LakeFsClient {
    http: reqwest::Client,
    /// Ends in `/api/v1`.
    base: String,
    access_key_id: String,
    secret_access_key: String,
    timeout: Duration,
    /// The object store hosts presigned URLs may point at, once bytes go there directly
    /// ([`direct`]); unset: every byte goes through lakeFS. Shared by the clones, so one
    /// decision, at start or later, holds for every part of the process.
    direct: std::sync::Arc<std::sync::OnceLock<direct::ObjectStoreHosts>>,
}

impl std::fmt::Debug for LakeFsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeFsClient")
            .field("base", &self.base)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
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
        Self::trusting(endpoint, access_key_id, secret_access_key, timeout, &[])
    }

    /// [`Self::new`], also trusting the certificate authorities `roots` (a private CA) beside
    /// the built-in web roots and the platform's (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the OS
    /// store).
    pub fn trusting(
        endpoint: &str,
        access_key_id: &str,
        secret_access_key: &str,
        timeout: Duration,
        roots: &[reqwest::Certificate],
    ) -> Result<Self, reqwest::Error> {
        let endpoint = endpoint.trim_end_matches('/');
        let base = if endpoint.ends_with("/api/v1") {
            endpoint.to_owned()
        } else {
            format!("{endpoint}/api/v1")
        };
        Ok(Self {
            http: roots
                .iter()
                .fold(reqwest::Client::builder(), |b, root| {
                    b.add_root_certificate(root.clone())
                })
                .connect_timeout(timeout.min(Duration::from_secs(5)))
                .build()?,
            base,
            access_key_id: access_key_id.to_owned(),
            secret_access_key: secret_access_key.to_owned(),
            timeout,
            direct: std::sync::Arc::default(),
        })
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

    /// What lakeFS says of its object store.
    pub async fn storage_config(&self) -> Result<direct::StorageConfig, LakeFsError> {
        let call = Call::new("get storage config", "", "");
        self.json_retried(call, || {
            self.request(Method::GET, "/config/storage", self.timeout)
        })
        .await
    }

    fn request(&self, method: Method, path: &str, timeout: Duration) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .basic_auth(&self.access_key_id, Some(&self.secret_access_key))
            .timeout(timeout)
    }

    /// Send once; map the answer. `Ok(body)` for success (JSON or text as a JSON string).
    async fn once(
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
    async fn json_retried<T: serde::de::DeserializeOwned>(
        &self,
        call: Call<'_>,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<T, LakeFsError> {
        Self::json(call, self.idempotent(call, build).await?).await
    }

    /// A call that is never retried (a lost answer may hide its effect) and its JSON answer.
    async fn json_once<T: serde::de::DeserializeOwned>(
        &self,
        call: Call<'_>,
        request: reqwest::RequestBuilder,
    ) -> Result<T, LakeFsError> {
        Self::json(call, self.once(call, request).await?).await
    }

    async fn json<T: serde::de::DeserializeOwned>(
        call: Call<'_>,
        response: reqwest::Response,
    ) -> Result<T, LakeFsError> {
        let bytes = response.bytes().await.map_err(|e| call.transport(e))?;
        decode(call, &bytes)
    }

    /// Up to `limit` entries of the paginated listing at `path` with `query`, following
    /// `next_offset`; the flag says lakeFS has more.
    async fn paginate<T: serde::de::DeserializeOwned>(
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
            let page: Page<T> = self
                .json_retried(call, || {
                    self.request(Method::GET, path, self.timeout)
                        .query(query)
                        .query(&[("after", after.as_str()), ("amount", amount.as_str())])
                })
                .await?;
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

    /// Every entry of a paginated listing filtered by `prefix`.
    async fn list_prefixed<T: serde::de::DeserializeOwned>(
        &self,
        call: Call<'_>,
        path: &str,
        prefix: &str,
    ) -> Result<Vec<T>, LakeFsError> {
        let (all, _) = self
            .paginate(call, path, &[("prefix", prefix)], usize::MAX)
            .await?;
        Ok(all)
    }

    /// Every object under `prefix` at `reference`, recursively, following pagination.
    pub async fn list_objects(
        &self,
        repository: &str,
        reference: &str,
        prefix: &str,
    ) -> Result<Vec<ObjectEntry>, LakeFsError> {
        let call = Call::new("list objects", repository, reference);
        let path = format!(
            "/repositories/{}/refs/{}/objects/ls",
            segment(repository),
            segment(reference)
        );
        // With the direct data path, each entry carries a URL to read its bytes from.
        let presign = if self.presigns() { "true" } else { "false" };
        let (all, _): (Vec<ObjectEntry>, _) = self
            .paginate(
                call,
                &path,
                &[("prefix", prefix), ("presign", presign)],
                usize::MAX,
            )
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
        // Never lakeFS's credentials: the URL carries its own signature.
        let response = self
            .http
            .get(url.clone())
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| direct::transport("get", repository, reference, key, e))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(direct::store_error(
                "get",
                repository,
                reference,
                key,
                Some(status),
                direct::store_message(status, &text),
            ));
        }
        match direct::etag(&response) {
            Some(etag)
                if !entry.checksum.is_empty() && !etag.eq_ignore_ascii_case(&entry.checksum) =>
            {
                Err(direct::store_error(
                    "get",
                    repository,
                    reference,
                    key,
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
        let path = format!(
            "/repositories/{}/refs/{}/objects/stat",
            segment(repository),
            segment(reference)
        );
        self.json_retried(Call::new("stat object", repository, reference), || {
            self.request(Method::GET, &path, self.timeout)
                .query(&[("path", key), ("presign", "true")])
        })
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
        let path = format!(
            "/repositories/{}/refs/{}/objects",
            segment(repository),
            segment(reference)
        );
        self.idempotent(Call::new("get object", repository, reference), || {
            self.request(Method::GET, &path, timeout)
                .query(&[("path", key)])
        })
        .await
    }

    /// The commit a branch points at.
    pub async fn branch_head(&self, repository: &str, branch: &str) -> Result<String, LakeFsError> {
        let call = Call::new("get branch", repository, branch);
        let path = format!(
            "/repositories/{}/branches/{}",
            segment(repository),
            segment(branch)
        );
        let answer: Ref = self
            .json_retried(call, || self.request(Method::GET, &path, self.timeout))
            .await?;
        answer.commit(call)
    }

    /// Create `name` from `source`; fails (409) if it exists.
    pub async fn create_branch(
        &self,
        repository: &str,
        name: &str,
        source: &str,
    ) -> Result<(), LakeFsError> {
        let path = format!("/repositories/{}/branches", segment(repository));
        let body = json!({"name": name, "source": source});
        self.once(
            Call::new("create branch", repository, name),
            self.request(Method::POST, &path, self.timeout).json(&body),
        )
        .await
        .map(drop)
    }

    pub async fn delete_branch(&self, repository: &str, name: &str) -> Result<(), LakeFsError> {
        let path = format!(
            "/repositories/{}/branches/{}",
            segment(repository),
            segment(name)
        );
        match self
            .idempotent(Call::new("delete branch", repository, name), || {
                self.request(Method::DELETE, &path, self.timeout)
            })
            .await
        {
            Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Upload a local file as `key`, streaming it; retried (the bytes are the same each time).
    /// With the direct data path the bytes of a file of [`direct::PRESIGNED_UPLOAD_MIN`] or
    /// more go to the object store and the address is linked.
    pub async fn upload(
        &self,
        repository: &str,
        branch: &str,
        key: &str,
        file: &std::path::Path,
        timeout: Duration,
    ) -> Result<ObjectEntry, LakeFsError> {
        if let Some(hosts) = self.direct.get() {
            let small = tokio::fs::metadata(file)
                .await
                .is_ok_and(|m| m.len() < direct::PRESIGNED_UPLOAD_MIN);
            if !small {
                return self
                    .upload_direct(hosts, repository, branch, key, file, timeout)
                    .await;
            }
        }
        let call = Call::new("upload object", repository, branch);
        let path = format!(
            "/repositories/{}/branches/{}/objects",
            segment(repository),
            segment(branch)
        );
        // A file that cannot be read is not retried; a transient answer from lakeFS is, with
        // the file read again from its start.
        let sent = (|| async {
            let body = Opened::open(file)
                .await
                .map_err(|e| Upload::Unreadable(unreadable_file(call, file, e)))?
                .into_body(None);
            let request = self
                .request(Method::POST, &path, timeout)
                .query(&[("path", key)])
                // A fixed content type keeps unchanged files identical to lakeFS.
                .header("Content-Type", "application/octet-stream")
                .body(body);
            self.once(call, request).await.map_err(Upload::Refused)
        })
        .retry(retries())
        .when(|e| matches!(e, Upload::Refused(e) if e.transient()))
        .await;
        match sent {
            Ok(response) => Self::json(call, response).await,
            Err(Upload::Unreadable(e) | Upload::Refused(e)) => Err(e),
        }
    }

    /// The direct upload: an address with a presigned URL from lakeFS, the file put there,
    /// the address linked as `key`. A URL the object store refuses (403: expired) is asked
    /// for again once.
    async fn upload_direct(
        &self,
        hosts: &direct::ObjectStoreHosts,
        repository: &str,
        branch: &str,
        key: &str,
        file: &std::path::Path,
        timeout: Duration,
    ) -> Result<ObjectEntry, LakeFsError> {
        let path = format!(
            "/repositories/{}/branches/{}/staging/backing",
            segment(repository),
            segment(branch)
        );
        let mut renewed = false;
        loop {
            let location: direct::StagingLocation = self
                .json_retried(
                    Call::new("get physical address", repository, branch),
                    || {
                        self.request(Method::GET, &path, self.timeout)
                            .query(&[("path", key), ("presign", "true")])
                    },
                )
                .await?;
            let Some(url) = location.presigned_url.as_deref() else {
                return Err(direct::store_error(
                    "put",
                    repository,
                    branch,
                    key,
                    None,
                    "lakeFS gave a physical address without a presigned URL".into(),
                ));
            };
            let url = direct::allowed_url(hosts, url, "put", repository, branch, key)?;
            match self
                .put_to_store(&url, repository, branch, key, file, timeout)
                .await
            {
                Ok((md5, size)) => {
                    let call = Call::new("link object", repository, branch);
                    let body = json!({
                        "staging": {"physical_address": location.physical_address},
                        "checksum": md5,
                        "size_bytes": size,
                        "content_type": "application/octet-stream",
                    });
                    // Linking the same address again is harmless: retried.
                    return self
                        .json_retried(call, || {
                            self.request(Method::PUT, &path, self.timeout)
                                .query(&[("path", key)])
                                .json(&body)
                        })
                        .await;
                }
                Err(e) if e.store_status() == Some(StatusCode::FORBIDDEN) && !renewed => {
                    renewed = true;
                    tracing::info!(error = %e, "the object store refused a presigned upload URL (expired?); asking lakeFS for a new one");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Put a file at a presigned URL; its MD5 and length, once the object store recorded
    /// the same MD5 (its ETag), else a retryable error: the address is never linked.
    async fn put_to_store(
        &self,
        url: &reqwest::Url,
        repository: &str,
        branch: &str,
        key: &str,
        file: &std::path::Path,
        timeout: Duration,
    ) -> Result<(String, u64), LakeFsError> {
        let call = Call::new("upload object", repository, branch);
        let sent = (|| async {
            let opened = Opened::open(file)
                .await
                .map_err(|e| Upload::Unreadable(unreadable_file(call, file, e)))?;
            let length = opened.len();
            let tally = direct::Tally::default();
            let response = self
                .http
                .put(url.clone())
                .timeout(timeout)
                // Object stores refuse a PUT of unknown length.
                .header(reqwest::header::CONTENT_LENGTH, length)
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(opened.into_body(Some(tally.clone())))
                .send()
                .await
                .map_err(|e| Upload::Refused(direct::transport("put", repository, branch, key, e)))?;
            let status = response.status();
            let stored = direct::etag(&response);
            if !status.is_success() {
                let text = response.text().await.unwrap_or_default();
                return Err(Upload::Refused(direct::store_error(
                    "put",
                    repository,
                    branch,
                    key,
                    Some(status),
                    direct::store_message(status, &text),
                )));
            }
            let (md5, size) = tally.finish();
            match stored {
                Some(etag) if etag.eq_ignore_ascii_case(&md5) && size == length => Ok((md5, size)),
                stored => Err(Upload::Refused(direct::store_error(
                    "put",
                    repository,
                    branch,
                    key,
                    None,
                    format!(
                        "the object store recorded ETag {} for the {size} bytes sent, whose MD5 is {md5}; not linked",
                        stored.as_deref().unwrap_or("(none)")
                    ),
                ))),
            }
        })
        .retry(retries())
        .when(|e| matches!(e, Upload::Refused(e) if e.transient()))
        .notify(|e, _| {
            if let Upload::Refused(e) = e {
                tracing::warn!(error = %e, "putting the object again");
            }
        })
        .await;
        sent.map_err(|(Upload::Unreadable(e) | Upload::Refused(e))| e)
    }

    /// Delete keys from a branch, at most 1000 per request; missing keys are not errors.
    pub async fn delete_objects(
        &self,
        repository: &str,
        branch: &str,
        keys: &[String],
    ) -> Result<(), LakeFsError> {
        let call = Call::new("delete objects", repository, branch);
        let path = format!(
            "/repositories/{}/branches/{}/objects/delete",
            segment(repository),
            segment(branch)
        );
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
        let path = format!(
            "/repositories/{}/branches/{}/commits",
            segment(repository),
            segment(branch)
        );
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
        let path = format!(
            "/repositories/{}/refs/{}/merge/{}",
            segment(repository),
            segment(source),
            segment(destination)
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
        let path = format!(
            "/repositories/{}/branches/{}/diff",
            segment(repository),
            segment(branch)
        );
        let amount = amount.clamp(1, PAGE).to_string();
        // Only counted: each change is read past, not decoded.
        let page: Page<IgnoredAny> = self
            .json_retried(call, || {
                self.request(Method::GET, &path, self.timeout)
                    .query(&[("amount", amount.as_str())])
            })
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
        let path = format!("/repositories/{}/branches", segment(repository));
        let branches: Vec<Ref> = self.list_prefixed(call, &path, prefix).await?;
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
        let path = format!(
            "/repositories/{}/commits/{}",
            segment(repository),
            segment(reference)
        );
        self.json_retried(call, || self.request(Method::GET, &path, self.timeout))
            .await
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
        let path = format!(
            "/repositories/{}/refs/{}/commits",
            segment(repository),
            segment(reference)
        );
        self.paginate(
            call,
            &path,
            &[("first_parent", "true"), ("stop_at", stop_at)],
            limit,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
