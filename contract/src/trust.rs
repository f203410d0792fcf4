//! How a client trusts servers and proves who it is to them. Trust: certificate authorities
//! beyond the built-in web roots and the platform's (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the OS
//! store, which every client reads as well), a company's own CA given as a PEM bundle file.
//! Proof: a client certificate for a server behind a gateway that asks for one, read again
//! while the process runs so that a renewed Secret is used without a restart (ADR 0036).

use std::path::Path;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

pub use crate::identity::{ClientCertificate, FileSetting, IdentityFiles, identity_files};

/// The certificates of the PEM bundle at `path`, given by the setting `setting` (named in
/// every error, with the path).
pub fn ca_bundle(setting: &str, path: &Path) -> Result<Vec<reqwest::Certificate>, String> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound => {
                " (in a pod: is the key in the ConfigMap or Secret that the caBundleRef names?)"
            }
            _ => "",
        };
        format!("{setting}={shown}: cannot read the CA bundle: {e}{hint}")
    })?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("{setting}={shown}: not a PEM certificate bundle: {e}"))?;
    if certificates.is_empty() {
        return Err(format!(
            "{setting}={shown}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(certificates)
}

/// The certificates of the bundle that the setting `setting` (a `*_CA_FILE` flag or variable)
/// names; none when it is unset or blank.
pub fn roots(setting: &str, path: Option<&Path>) -> Result<Vec<reqwest::Certificate>, String> {
    match path.filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => ca_bundle(setting, path),
        None => Ok(Vec::new()),
    }
}

/// How a client verifies servers and what it presents to them.
#[derive(Clone, Default)]
pub struct Tls {
    /// Certificate authorities trusted beside the built-in and the platform's roots.
    pub roots: Vec<reqwest::Certificate>,
    /// The client certificate presented to a server (a gateway) that asks for one.
    pub identity: Option<IdentityFiles>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("roots", &self.roots.len())
            .field("identity", &self.identity)
            .finish()
    }
}

/// How often the files of a client certificate are read again. A request that starts this
/// long after they change presents the new certificate; requests already under way finish on
/// the connections they started on (ADR 0036).
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// An HTTP client that presents the client certificate its files hold now: it is read at most
/// every [`RELOAD_EVERY`], and when it changed, a new client (with a new connection pool) is
/// built with it. A new certificate that fails its checks is not taken: the one in use stays,
/// and the problem is logged once. Clones share the client.
#[derive(Clone)]
pub struct TlsClient {
    inner: Arc<Inner>,
}

type Builder = Box<dyn Fn() -> reqwest::ClientBuilder + Send + Sync>;

/// The bytes of a certificate's file and its key's.
type Pem = (Vec<u8>, Vec<u8>);

struct Inner {
    tls: Tls,
    builder: Builder,
    state: Mutex<State>,
}

struct State {
    client: reqwest::Client,
    certificate: Option<ClientCertificate>,
    checked: Instant,
    /// The files last refused, and whether that was logged: their problem is logged once.
    refused: Option<(Pem, bool)>,
    /// The certificate in use was seen expired, and said so.
    expired_said: bool,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("tls", &self.inner.tls)
            .finish_non_exhaustive()
    }
}

impl TlsClient {
    /// The client that `builder` makes, trusting `tls.roots` and presenting `tls.identity`,
    /// whose files are read and checked now: an unreadable, mismatched or expired certificate
    /// is an error here.
    pub fn build(
        tls: Tls,
        builder: impl Fn() -> reqwest::ClientBuilder + Send + Sync + 'static,
    ) -> Result<Self, String> {
        let certificate = tls.identity.as_ref().map(IdentityFiles::load).transpose()?;
        let builder: Builder = Box::new(builder);
        let client = make(&builder, &tls, certificate.as_ref())?;
        if let (Some(files), Some(c)) = (&tls.identity, &certificate) {
            tracing::info!(setting = %files.cert, certificate = %c.describe(), "presenting a client certificate");
        }
        Ok(Self {
            inner: Arc::new(Inner {
                tls,
                builder,
                state: Mutex::new(State {
                    client,
                    certificate,
                    checked: Instant::now(),
                    refused: None,
                    expired_said: false,
                }),
            }),
        })
    }

    /// A client made once, with no certificate to read again.
    pub fn fixed(client: reqwest::Client) -> Self {
        let builder: Builder = Box::new(reqwest::Client::builder);
        Self {
            inner: Arc::new(Inner {
                tls: Tls::default(),
                builder,
                state: Mutex::new(State {
                    client,
                    certificate: None,
                    checked: Instant::now(),
                    refused: None,
                    expired_said: false,
                }),
            }),
        }
    }

    /// The client to send a request with: the one presenting the certificate the files held
    /// when they were last read.
    pub fn client(&self) -> reqwest::Client {
        let Some(files) = &self.inner.tls.identity else {
            return self.state().client.clone();
        };
        let mut state = self.state();
        if state.checked.elapsed() >= RELOAD_EVERY {
            state.checked = Instant::now();
            // Two small files of a Secret volume (a tmpfs), read at most once a second:
            // short enough to read in place, even on the sidecar's one thread.
            self.reload(files, &mut state);
        }
        state.client.clone()
    }

    /// The certificate presented now, when there is one.
    pub fn certificate(&self) -> Option<ClientCertificate> {
        self.state().certificate.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock()
    }

    fn reload(&self, files: &IdentityFiles, state: &mut State) {
        // An unreadable pair is kept as empty bytes: refused like a wrong one.
        let (pem, read) = match files.read() {
            Ok(pem) => (pem, Ok(())),
            Err(e) => ((Vec::new(), Vec::new()), Err(e)),
        };
        if state.certificate.as_ref().is_some_and(|c| c.pem == pem) {
            state.refused = None;
            if let Some(c) = &state.certificate
                && c.not_after < SystemTime::now()
                && !state.expired_said
            {
                state.expired_said = true;
                tracing::warn!(setting = %files.cert, certificate = %c.describe(), "the client certificate in use has expired and its files hold no renewal; a gateway that checks it refuses every request");
            }
            return;
        }
        if matches!(&state.refused, Some((p, true)) if *p == pem) {
            return;
        }
        let taken = read
            .and_then(|()| files.check(pem.clone(), SystemTime::now()))
            .and_then(|c| make(&self.inner.builder, &self.inner.tls, Some(&c)).map(|m| (c, m)));
        match taken {
            Ok((certificate, client)) => {
                tracing::info!(setting = %files.cert, certificate = %certificate.describe(), "the client certificate changed; new connections present the new one");
                state.client = client;
                state.certificate = Some(certificate);
                state.refused = None;
                state.expired_said = false;
            }
            // A kubelet swaps a Secret's files at once, but a pair written by other means can
            // be caught half-written: only a pair that fails twice in a row is worth a warning.
            Err(e) => match &mut state.refused {
                Some((p, said)) if *p == pem => {
                    *said = true;
                    tracing::warn!(error = %e, "the client certificate's files changed but fail their checks; the one read before stays in use");
                }
                _ => state.refused = Some((pem, false)),
            },
        }
    }
}

/// The client `builder` makes with `tls`'s roots and `certificate`.
fn make(
    builder: &Builder,
    tls: &Tls,
    certificate: Option<&ClientCertificate>,
) -> Result<reqwest::Client, String> {
    let mut b = tls
        .roots
        .iter()
        .fold(builder(), |b, root| b.add_root_certificate(root.clone()));
    if let Some(c) = certificate {
        b = b.identity(c.identity.clone());
    }
    b.build().map_err(|e| {
        format!(
            "building the HTTP client failed: {}",
            crate::error_chain(&e)
        )
    })
}

/// What a server said of this client's certificate by ending the TLS handshake with an alert,
/// found among `error`'s causes. Such a server read no request: whatever was written after
/// the handshake, it was never acted on.
pub fn refused_handshake(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        let tls = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::AlertReceived(alert)) = tls
            && let Some(said) = refusal(*alert)
        {
            return Some(format!(
                "the server ended the TLS handshake: {said} (TLS alert {alert:?})"
            ));
        }
        next = e.source();
    }
    None
}

/// What a TLS alert says of the client's certificate; `None` for alerts about other things.
fn refusal(alert: rustls::AlertDescription) -> Option<&'static str> {
    use rustls::AlertDescription as A;
    Some(match alert {
        A::CertificateRequired | A::NoCertificate => {
            "it requires a client certificate and none was sent"
        }
        A::UnknownCA => "it does not trust the authority that signed the client certificate",
        A::CertificateExpired => "it found the client certificate expired",
        A::CertificateRevoked => "it found the client certificate revoked",
        A::BadCertificate | A::UnsupportedCertificate | A::CertificateUnknown => {
            "it refused the client certificate"
        }
        A::AccessDenied => "it refused the identity of the client certificate",
        A::HandshakeFailure => {
            "it refused the handshake (a missing or refused client certificate, or no cipher in common)"
        }
        _ => return None,
    })
}

/// The answer of a gateway that completes the TLS handshake and then refuses a missing or
/// unaccepted client certificate with a page of its own: nginx's `ssl_verify_client`, and
/// the ingress controllers built on it, answer HTTP 400 (495 and 496 inside). The request went
/// no further than the gateway.
pub fn refused_by_gateway(status: u16, body: &str) -> Option<String> {
    const REQUIRED: &str = "No required SSL certificate was sent";
    const REFUSED: &str = "The SSL certificate error";
    let (said, page) = match status {
        400 | 496 if body.contains(REQUIRED) => (
            "the gateway requires a client certificate and none was sent",
            REQUIRED,
        ),
        400 | 495 if body.contains(REFUSED) => (
            "the gateway refused the client certificate (an authority it does not trust, \
             expired or revoked)",
            REFUSED,
        ),
        _ => return None,
    };
    Some(format!("{said} (HTTP {status}: {page})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_bundles_name_the_setting_and_the_path() {
        let dir = std::env::temp_dir().join(format!("perago-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = ca_bundle("X_CA_FILE", &dir.join("absent.crt")).unwrap_err();
        assert!(missing.starts_with("X_CA_FILE="), "{missing}");
        assert!(
            missing.contains("is the key in the ConfigMap or Secret"),
            "{missing}"
        );
        let empty = dir.join("empty.crt");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let refused = ca_bundle("X_CA_FILE", &empty).unwrap_err();
        assert!(refused.contains("holds no PEM certificate"), "{refused}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A self-signed certificate for `cn`, valid for a day, and its key, as PEM.
    fn pair(cn: &str) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Write `pair` as a kubelet updates a Secret volume: into a new directory, then one
    /// rename of the `..data` link that `tls.crt` and `tls.key` point through.
    fn publish(dir: &Path, generation: u32, (cert, key): &(String, String)) {
        let data = dir.join(format!("..{generation}"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("tls.crt"), cert).unwrap();
        std::fs::write(data.join("tls.key"), key).unwrap();
        let link = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("..{generation}"), &link).unwrap();
        std::fs::rename(&link, dir.join("..data")).unwrap();
        for name in ["tls.crt", "tls.key"] {
            if std::fs::symlink_metadata(dir.join(name)).is_err() {
                std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
            }
        }
    }

    #[test]
    fn a_renewed_certificate_is_taken_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        publish(dir.path(), 1, &pair("first"));
        let identity = identity_files(
            ("X_CERT_FILE", Some(&dir.path().join("tls.crt"))),
            ("X_KEY_FILE", Some(&dir.path().join("tls.key"))),
        )
        .unwrap();
        let client = TlsClient::build(
            Tls {
                roots: Vec::new(),
                identity,
            },
            reqwest::Client::builder,
        )
        .unwrap();
        let subject = |c: &TlsClient| c.certificate().map(|c| c.subject).unwrap_or_default();
        assert_eq!(subject(&client), "CN=first");

        publish(dir.path(), 2, &pair("second"));
        let _ = client.client();
        assert_eq!(
            subject(&client),
            "CN=first",
            "read at most every {RELOAD_EVERY:?}"
        );
        std::thread::sleep(RELOAD_EVERY + Duration::from_millis(100));
        let _ = client.client();
        assert_eq!(subject(&client), "CN=second");

        // A key of another certificate: the one in use stays.
        let (third, fourth) = (pair("third"), pair("fourth"));
        publish(dir.path(), 3, &(third.0, fourth.1));
        std::thread::sleep(RELOAD_EVERY + Duration::from_millis(100));
        let _ = client.client();
        assert_eq!(subject(&client), "CN=second");
    }

    #[test]
    fn refusals_name_the_certificate() {
        let nginx = "<html>\r\n<head><title>400 No required SSL certificate was sent</title>";
        assert_eq!(
            refused_by_gateway(400, nginx).unwrap(),
            "the gateway requires a client certificate and none was sent (HTTP 400: No \
             required SSL certificate was sent)"
        );
        assert!(
            refused_by_gateway(400, "<title>400 The SSL certificate error</title>")
                .unwrap()
                .starts_with("the gateway refused the client certificate")
        );
        assert_eq!(refused_by_gateway(400, "{\"message\": \"bad\"}"), None);
        assert_eq!(refused_by_gateway(500, nginx), None);

        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        assert_eq!(
            refused_handshake(&alert).unwrap(),
            "the server ended the TLS handshake: it requires a client certificate and none \
             was sent (TLS alert CertificateRequired)"
        );
        let other = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::DecodeError),
        );
        assert_eq!(refused_handshake(&other), None);
    }
}
