//! Uploads, streamed from a local file: through lakeFS, or with the direct data path to a
//! URL lakeFS presigns and then linked. Both are retried on transient answers with the file
//! read again from its start (the bytes are the same each time); a file that cannot be read
//! is final. A put whose ETag is not the MD5 of the bytes sent is never linked.

use std::path::Path;
use std::time::Duration;

use backon::Retryable;
use reqwest::{Method, StatusCode};
use serde_json::json;

use perago_contract::text::clip_path;

use crate::{Call, ErrorKind, LakeFsClient, LakeFsError, ObjectEntry, direct, retries};

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
    async fn open(path: &Path) -> std::io::Result<Self> {
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
fn unreadable_file(call: Call<'_>, file: &Path, e: std::io::Error) -> LakeFsError {
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

impl LakeFsClient {
    /// Upload a local file as `key`, streaming it; retried (the bytes are the same each time).
    /// With the direct data path the bytes of a file of [`direct::PRESIGNED_UPLOAD_MIN`] or
    /// more go to the object store and the address is linked.
    pub async fn upload(
        &self,
        repository: &str,
        branch: &str,
        key: &str,
        file: &Path,
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
        let path = call.path("branches", "/objects");
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
        file: &Path,
        timeout: Duration,
    ) -> Result<ObjectEntry, LakeFsError> {
        let address = Call::new("get physical address", repository, branch);
        let path = address.path("branches", "/staging/backing");
        let mut renewed = false;
        loop {
            let location: direct::StagingLocation = self
                .get(address, &path, &[("path", key), ("presign", "true")])
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
        file: &Path,
        timeout: Duration,
    ) -> Result<(String, u64), LakeFsError> {
        let call = Call::new("upload object", repository, branch);
        let failed =
            |status, detail| direct::store_error("put", repository, branch, key, status, detail);
        let sent = (|| async {
            let opened = Opened::open(file)
                .await
                .map_err(|e| Upload::Unreadable(unreadable_file(call, file, e)))?;
            let length = opened.len();
            let tally = direct::Tally::default();
            let response = self
                .http
                .client()
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
                return Err(Upload::Refused(failed(
                    Some(status),
                    direct::store_message(status, &text),
                )));
            }
            let (md5, size) = tally.finish();
            match stored {
                Some(etag) if etag.eq_ignore_ascii_case(&md5) && size == length => Ok((md5, size)),
                stored => Err(Upload::Refused(failed(
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
}
