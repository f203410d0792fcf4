//! The direct data path: object bytes travel between this process and the object store
//! through URLs that lakeFS presigns, and lakeFS serves only the metadata calls (listing,
//! addresses, links, commits). A download reads each object from the presigned URL of its
//! listing entry; an upload asks lakeFS for a physical address with an upload URL, puts the
//! file there, and links the address into the branch.
//!
//! A presigned URL is only followed to a host the operator of the task allowed
//! ([`ObjectStoreHosts`]): a lakeFS that presigns for another host would otherwise send the
//! workspace's bytes, or take them from, wherever it says.

use std::fmt;
use std::sync::{Arc, Mutex};

use md5::Digest;
use reqwest::{StatusCode, Url};
use serde::Deserialize;

use perago_contract::text::{QUOTED_MAX, clip};

use crate::{Call, ErrorKind, LakeFsError, request_error};

/// The smallest file an upload puts on a presigned URL. A smaller one goes through lakeFS:
/// there it is one call, where the direct path makes two (an address, then a link), and its
/// bytes cost lakeFS less than the extra call (`cargo bench --bench data_path`: a call costs
/// lakeFS about 0.4 to 0.8 ms of CPU, proxied bytes about 2.5 ms per MiB).
pub const PRESIGNED_UPLOAD_MIN: u64 = 128 * 1024;

/// How object bytes travel (`spec.lakefs.dataPath`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DataPath {
    /// Presigned URLs when lakeFS offers them and the object store's hosts are given,
    /// through lakeFS otherwise.
    #[default]
    Auto,
    /// Presigned URLs only: a lakeFS that cannot presign, or no allowed hosts, is a
    /// configuration error found at start.
    Presigned,
    /// Every byte through the lakeFS server.
    Proxied,
}

/// What the lakeFS server says of its object store (`GET /config/storage`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct StorageConfig {
    #[serde(default)]
    pub blockstore_type: String,
    #[serde(default)]
    pub pre_sign_support: bool,
}

/// The data path chosen at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chosen {
    Presigned,
    /// Through lakeFS, and why when presigning was possible in principle.
    Proxied(Option<NoPresigning>),
}

/// Why object bytes cannot travel on presigned URLs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoPresigning {
    /// lakeFS does not presign for its blockstore (`local`, for one).
    Unsupported { blockstore: String },
    /// No object store host is allowed, so no presigned URL could be followed.
    NoHosts,
}

impl fmt::Display for NoPresigning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported { blockstore } => {
                write!(
                    f,
                    "lakeFS cannot presign URLs for its '{blockstore}' blockstore"
                )
            }
            Self::NoHosts => f.write_str(
                "no object store hosts are allowed (PERAGO_LAKEFS_OBJECT_STORE_HOSTS, \
                 spec.lakefs.objectStoreHosts)",
            ),
        }
    }
}

/// `dataPath: presigned` where presigning is impossible: a configuration error found at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PresignedImpossible(pub NoPresigning);

impl fmt::Display for PresignedImpossible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dataPath is presigned, but {}", self.0)
    }
}

impl std::error::Error for PresignedImpossible {}

impl DataPath {
    /// The path a process takes with this setting, the allowed hosts and what lakeFS offers;
    /// `Err` names what makes `presigned` impossible.
    pub fn choose(
        self,
        hosts: &ObjectStoreHosts,
        storage: &StorageConfig,
    ) -> Result<Chosen, PresignedImpossible> {
        let cannot = if !storage.pre_sign_support {
            Some(NoPresigning::Unsupported {
                blockstore: storage.blockstore_type.clone(),
            })
        } else if hosts.is_empty() {
            Some(NoPresigning::NoHosts)
        } else {
            None
        };
        match (self, cannot) {
            (Self::Proxied, _) => Ok(Chosen::Proxied(None)),
            (_, None) => Ok(Chosen::Presigned),
            (Self::Presigned, Some(why)) => Err(PresignedImpossible(why)),
            (Self::Auto, Some(why)) => Ok(Chosen::Proxied(Some(why))),
        }
    }
}

/// The hosts presigned URLs may point at: `host`, `host:port`, `*.suffix` or `*.suffix:port`
/// (a wildcard stands for one or more leading labels; without a port any port matches).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectStoreHosts(Vec<HostPattern>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct HostPattern {
    /// Lower case; a leading `*.` matches any labels before the rest.
    host: String,
    port: Option<u16>,
}

/// A host pattern [`ObjectStoreHosts::parse`] refuses: the pattern as given (shortened to
/// [`QUOTED_MAX`]) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPatternError {
    pub pattern: String,
    pub problem: HostProblem,
}

/// What is wrong with a host pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostProblem {
    /// A URL or a path, where a host is wanted.
    NotAHost,
    /// An IPv6 address opened with `[` and never closed.
    UnclosedBracket,
    /// The port is not a number from 1 to 65535.
    BadPort,
    /// No host name, or a `*` elsewhere than as a leading `*.`.
    NoHostName,
}

impl fmt::Display for HostPatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.problem {
            HostProblem::NotAHost => "must be host or host:port, without a scheme or a path",
            HostProblem::UnclosedBracket => "has an unclosed '['",
            HostProblem::BadPort => "has a port that is not a number from 1 to 65535",
            HostProblem::NoHostName => "needs a host name; a '*' may only stand first, as '*.'",
        };
        write!(f, "object store host '{}' {why}", self.pattern)
    }
}

impl std::error::Error for HostPatternError {}

impl ObjectStoreHosts {
    /// Comma- or space-separated patterns.
    pub fn parse(text: &str) -> Result<Self, HostPatternError> {
        text.split([',', ' ', '\n'])
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(HostPattern::parse)
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The URL is http(s) on an allowed host and port.
    pub fn allows(&self, url: &Url) -> bool {
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        matches!(url.scheme(), "http" | "https")
            && self.0.iter().any(|p| {
                p.port.is_none_or(|p| p == port)
                    && match p.host.strip_prefix("*.") {
                        Some(suffix) => host
                            .strip_suffix(suffix)
                            .is_some_and(|labels| labels.len() > 1 && labels.ends_with('.')),
                        None => host.eq_ignore_ascii_case(&p.host),
                    }
            })
    }
}

impl HostPattern {
    fn parse(text: &str) -> Result<Self, HostPatternError> {
        let bad = |problem| {
            Err(HostPatternError {
                pattern: clip(text, QUOTED_MAX).into_owned(),
                problem,
            })
        };
        if text.contains("://") || text.contains('/') {
            return bad(HostProblem::NotAHost);
        }
        let (host, port) = match text.strip_prefix('[') {
            // [v6]:port or [v6]
            Some(rest) => match rest.split_once(']') {
                Some((host, "")) => (host, None),
                Some((host, port)) => (host, Some(port.strip_prefix(':').unwrap_or(port))),
                None => return bad(HostProblem::UnclosedBracket),
            },
            None => match text.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            },
        };
        let port = match port {
            Some(p) => match p.parse::<u16>() {
                Ok(p) if p > 0 => Some(p),
                _ => return bad(HostProblem::BadPort),
            },
            None => None,
        };
        let name = host.strip_prefix("*.").unwrap_or(host);
        if name.is_empty() || name.contains('*') {
            return bad(HostProblem::NoHostName);
        }
        Ok(Self {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// Where an upload goes: lakeFS's answer to get-physical-address with `presign`.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct StagingLocation {
    pub physical_address: String,
    #[serde(default)]
    pub presigned_url: Option<String>,
}

/// A failure of one transfer with the object store.
pub(crate) fn store_error(
    verb: &'static str,
    repository: &str,
    reference: &str,
    key: &str,
    status: Option<StatusCode>,
    detail: String,
) -> LakeFsError {
    Call::new(verb, repository, reference).error(ErrorKind::ObjectStore {
        key: clip(key, QUOTED_MAX).into_owned(),
        status,
        detail,
    })
}

/// The presigned URL of a lakeFS answer, refused unless it is on an allowed host. Only the
/// host is ever quoted: the query holds the signature.
pub(crate) fn allowed_url(
    hosts: &ObjectStoreHosts,
    url: &str,
    verb: &'static str,
    repository: &str,
    reference: &str,
    key: &str,
) -> Result<Url, LakeFsError> {
    let parsed = Url::parse(url).map_err(|e| {
        store_error(
            verb,
            repository,
            reference,
            key,
            None,
            format!("lakeFS presigned a URL that does not parse: {e}"),
        )
    })?;
    if hosts.allows(&parsed) {
        return Ok(parsed);
    }
    Err(
        Call::new(verb, repository, reference).error(ErrorKind::UnexpectedHost {
            key: clip(key, QUOTED_MAX).into_owned(),
            host: format!(
                "{}://{}:{}",
                parsed.scheme(),
                parsed.host_str().unwrap_or("?"),
                parsed.port_or_known_default().unwrap_or(0)
            ),
        }),
    )
}

/// The S3 error code of an object store's answer (`<Code>…</Code>`), else the start of it.
pub(crate) fn store_message(status: StatusCode, body: &str) -> String {
    let code = body
        .split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(code, _)| code);
    let message = body
        .split_once("<Message>")
        .and_then(|(_, rest)| rest.split_once("</Message>"))
        .map(|(m, _)| m);
    match (code, message) {
        (Some(code), Some(message)) => format!("HTTP {status}: {code}: {}", clip(message, 200)),
        (Some(code), None) => format!("HTTP {status}: {code}"),
        _ => format!("HTTP {status}: {}", clip(body.trim(), 200)),
    }
}

/// The ETag of a response without its quotes.
pub(crate) fn etag(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get(reqwest::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().trim_matches('"').to_owned())
}

/// The MD5 (hex) and length of the bytes a body stream carried, filled in as it is read.
#[derive(Clone, Default)]
pub(crate) struct Tally(Arc<Mutex<(md5::Md5, u64)>>);

impl Tally {
    pub fn add(&self, bytes: &[u8]) {
        if let Ok(mut t) = self.0.lock() {
            t.0.update(bytes);
            t.1 += bytes.len() as u64;
        }
    }

    pub fn finish(&self) -> (String, u64) {
        let (md5, size) = self.0.lock().map(|t| t.clone()).unwrap_or_default();
        let digest = md5.finalize();
        (digest.iter().map(|b| format!("{b:02x}")).collect(), size)
    }
}

/// A request to the object store that could not be completed, as a transfer failure.
pub(crate) fn transport(
    verb: &'static str,
    repository: &str,
    reference: &str,
    key: &str,
    e: reqwest::Error,
) -> LakeFsError {
    store_error(verb, repository, reference, key, None, request_error(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(text: &str) -> ObjectStoreHosts {
        ObjectStoreHosts::parse(text).unwrap()
    }

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn hosts_match_by_name_port_and_wildcard() {
        let h = hosts("minio.storage:9000, *.s3.eu-west-1.amazonaws.com 10.0.0.7 [::1]:9000");
        assert!(h.allows(&url("http://minio.storage:9000/b/k?X-Amz-Signature=1")));
        assert!(h.allows(&url("http://MINIO.storage:9000/b/k")));
        assert!(!h.allows(&url("http://minio.storage:9001/b/k")));
        assert!(h.allows(&url("https://bucket.s3.eu-west-1.amazonaws.com/k")));
        assert!(
            !h.allows(&url("https://s3.eu-west-1.amazonaws.com/k")),
            "'*.' needs a label"
        );
        assert!(!h.allows(&url("https://evils3.eu-west-1.amazonaws.com/k")));
        assert!(
            h.allows(&url("http://10.0.0.7:1234/k")),
            "no port: any port"
        );
        assert!(h.allows(&url("http://[::1]:9000/k")));
        assert!(!h.allows(&url("ftp://10.0.0.7/k")));
        assert!(!h.allows(&url("http://elsewhere:9000/k")));
        assert!(!ObjectStoreHosts::default().allows(&url("http://minio.storage:9000/k")));
    }

    #[test]
    fn bad_host_patterns_are_named() {
        for (text, problem, why) in [
            (
                "http://minio:9000",
                HostProblem::NotAHost,
                "without a scheme",
            ),
            (
                "minio:9000/bucket",
                HostProblem::NotAHost,
                "without a scheme or a path",
            ),
            (
                "minio:http",
                HostProblem::BadPort,
                "port that is not a number",
            ),
            ("minio:0", HostProblem::BadPort, "port that is not a number"),
            ("*", HostProblem::NoHostName, "needs a host name"),
            ("a.*.com", HostProblem::NoHostName, "may only stand first"),
            ("[::1", HostProblem::UnclosedBracket, "unclosed"),
        ] {
            let e = ObjectStoreHosts::parse(text).unwrap_err();
            assert_eq!(e.problem, problem, "{text}");
            let words = e.to_string();
            assert!(words.contains(why), "{text}: {words}");
            assert!(
                words.starts_with(&format!("object store host '{text}' ")),
                "{words}"
            );
        }
        assert!(ObjectStoreHosts::parse(" , ").unwrap().is_empty());
        let long = format!("{}:x", "h".repeat(500));
        let clipped = ObjectStoreHosts::parse(&long).unwrap_err();
        assert!(clipped.pattern.chars().count() <= QUOTED_MAX, "{clipped}");
    }

    #[test]
    fn the_data_path_is_chosen_at_start_and_presigned_says_why_not() {
        let s3 = StorageConfig {
            blockstore_type: "s3".into(),
            pre_sign_support: true,
        };
        let local = StorageConfig {
            blockstore_type: "local".into(),
            pre_sign_support: false,
        };
        let some = hosts("minio:9000");
        let none = ObjectStoreHosts::default();
        assert_eq!(DataPath::Auto.choose(&some, &s3), Ok(Chosen::Presigned));
        assert_eq!(
            DataPath::Presigned.choose(&some, &s3),
            Ok(Chosen::Presigned)
        );
        assert_eq!(
            DataPath::Proxied.choose(&some, &s3),
            Ok(Chosen::Proxied(None))
        );
        assert_eq!(
            DataPath::Auto.choose(&none, &s3),
            Ok(Chosen::Proxied(Some(NoPresigning::NoHosts)))
        );
        assert_eq!(
            DataPath::Presigned
                .choose(&some, &local)
                .unwrap_err()
                .to_string(),
            "dataPath is presigned, but lakeFS cannot presign URLs for its 'local' blockstore"
        );
        assert_eq!(
            DataPath::Presigned
                .choose(&none, &s3)
                .unwrap_err()
                .to_string(),
            "dataPath is presigned, but no object store hosts are allowed \
             (PERAGO_LAKEFS_OBJECT_STORE_HOSTS, spec.lakefs.objectStoreHosts)"
        );
    }

    #[test]
    fn object_store_answers_say_their_code() {
        let body = "<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>";
        assert_eq!(
            store_message(StatusCode::SERVICE_UNAVAILABLE, body),
            "HTTP 503 Service Unavailable: SlowDown: Reduce your request rate."
        );
        assert_eq!(
            store_message(StatusCode::BAD_GATEWAY, "upstream gone"),
            "HTTP 502 Bad Gateway: upstream gone"
        );
    }

    #[test]
    fn a_tally_is_the_md5_and_length_of_what_passed() {
        let t = Tally::default();
        t.add(b"hello ");
        t.add(b"world");
        assert_eq!(
            t.finish(),
            ("5eb63bbbe01eeed093cb22bb8f5acdc3".to_owned(), 11)
        );
    }
}
