//! A client certificate and its key, as PEM files (what a `kubernetes.io/tls` Secret mounts as
//! `tls.crt` and `tls.key`): read, checked and turned into what the HTTP client presents to a
//! gateway that asks for one. Every error names the setting and the path it is about.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A setting that names a file, shown as `NAME=path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSetting {
    pub name: String,
    pub path: PathBuf,
}

impl fmt::Display for FileSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.path.display())
    }
}

/// The files of a client certificate (the certificate, then any intermediates) and its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityFiles {
    pub cert: FileSetting,
    pub key: FileSetting,
}

/// The client certificate that the settings `cert` and `key` name, each `(setting, path)`:
/// both or neither; a blank path is unset.
pub fn identity_files(
    cert: (&str, Option<&Path>),
    key: (&str, Option<&Path>),
) -> Result<Option<IdentityFiles>, String> {
    let given = |path: Option<&Path>| {
        path.filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_owned)
    };
    match (given(cert.1), given(key.1)) {
        (None, None) => Ok(None),
        (Some(cert_path), Some(key_path)) => Ok(Some(IdentityFiles {
            cert: FileSetting {
                name: cert.0.to_owned(),
                path: cert_path,
            },
            key: FileSetting {
                name: key.0.to_owned(),
                path: key_path,
            },
        })),
        (Some(_), None) => Err(format!(
            "{} is set but {} is not: a client certificate needs its key",
            cert.0, key.0
        )),
        (None, Some(_)) => Err(format!(
            "{} is set but {} is not: a client key needs its certificate",
            key.0, cert.0
        )),
    }
}

/// A client certificate as read and checked.
#[derive(Clone)]
pub struct ClientCertificate {
    /// The two files' bytes, to tell when they change.
    pub(crate) pem: (Vec<u8>, Vec<u8>),
    pub(crate) identity: reqwest::Identity,
    /// The subject's distinguished name, e.g. `CN=perago-sidecar`.
    pub subject: String,
    /// The serial number in upper-case hexadecimal, as OpenSSL and the gateways that log it
    /// (nginx's `$ssl_client_serial`) print it.
    pub serial: String,
    pub not_after: SystemTime,
}

impl fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("subject", &self.subject)
            .field("serial", &self.serial)
            .field("not_after", &rfc3339(self.not_after))
            .finish_non_exhaustive()
    }
}

impl ClientCertificate {
    /// `subject, serial S, valid until T`, for logs and errors.
    pub fn describe(&self) -> String {
        format!(
            "{}, serial {}, valid until {}",
            self.subject,
            self.serial,
            rfc3339(self.not_after)
        )
    }
}

impl IdentityFiles {
    /// Read both files and check them now.
    pub fn load(&self) -> Result<ClientCertificate, String> {
        self.check(self.read()?, SystemTime::now())
    }

    /// The two files' bytes; an error names the file that cannot be read.
    pub(crate) fn read(&self) -> Result<(Vec<u8>, Vec<u8>), String> {
        let read = |setting: &FileSetting, what: &str| {
            std::fs::read(&setting.path).map_err(|e| {
                let hint = match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        " (in a pod: does the Secret that clientCertificateRef names exist, of \
                         type kubernetes.io/tls with tls.crt and tls.key?)"
                    }
                    _ => "",
                };
                format!("{setting}: cannot read the client {what}: {e}{hint}")
            })
        };
        Ok((read(&self.cert, "certificate")?, read(&self.key, "key")?))
    }

    /// Check what the files hold, at time `now`: a certificate, a key this client can sign
    /// with, the certificate's own key, and a certificate not yet expired.
    pub(crate) fn check(
        &self,
        pem: (Vec<u8>, Vec<u8>),
        now: SystemTime,
    ) -> Result<ClientCertificate, String> {
        let (cert, key) = (&self.cert, &self.key);
        let chain = CertificateDer::pem_slice_iter(&pem.0)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{cert}: not a PEM certificate: {e}"))?;
        let Some(leaf) = chain.first() else {
            return Err(format!(
                "{cert}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            ));
        };
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf)
            .map_err(|e| format!("{cert}: the first certificate is not X.509: {e}"))?;
        let subject = parsed.subject().to_string();
        let serial = serial_hex(parsed.tbs_certificate.raw_serial());
        let not_after = system_time(parsed.validity().not_after.timestamp());
        let described = format!("{subject}, serial {serial}");

        let private = PrivateKeyDer::from_pem_slice(&pem.1).map_err(|e| match e {
            pem::Error::NoItemsFound => format!(
                "{key}: holds no PEM private key (-----BEGIN PRIVATE KEY-----, or an RSA or EC \
                 one)"
            ),
            e => format!("{key}: not a PEM private key: {e}"),
        })?;
        let signing = rustls::crypto::ring::default_provider()
            .key_provider
            .load_private_key(private)
            .map_err(|e| format!("{key}: not a key this client can sign with: {e}"))?;
        match rustls::sign::CertifiedKey::new(chain.clone(), signing).keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                return Err(format!(
                    "{key} is not the key of the certificate in {cert} ({described}): the two \
                     files come from different Secrets or different renewals"
                ));
            }
            Err(e) => return Err(format!("{cert}: {e}")),
        }
        if not_after < now {
            return Err(format!(
                "{cert}: the client certificate ({described}) expired at {}; renew it",
                rfc3339(not_after)
            ));
        }
        // reqwest reads the certificates and the key from one PEM text.
        let mut both = pem.0.clone();
        both.push(b'\n');
        both.extend_from_slice(&pem.1);
        let identity = reqwest::Identity::from_pem(&both)
            .map_err(|e| format!("{cert} with {key}: {}", crate::error_chain(&e)))?;
        Ok(ClientCertificate {
            pem,
            identity,
            subject,
            serial,
            not_after,
        })
    }
}

/// The serial's bytes in upper-case hexadecimal without leading zero bytes (DER keeps one to
/// make a number positive).
fn serial_hex(raw: &[u8]) -> String {
    let start = raw
        .iter()
        .position(|b| *b != 0)
        .unwrap_or(raw.len().saturating_sub(1));
    raw[start..].iter().map(|b| format!("{b:02X}")).collect()
}

fn system_time(seconds: i64) -> SystemTime {
    match u64::try_from(seconds) {
        Ok(after) => UNIX_EPOCH + Duration::from_secs(after),
        Err(_) => UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs()),
    }
}

/// `time` as RFC 3339, in UTC.
pub fn rfc3339(time: SystemTime) -> String {
    time::OffsetDateTime::from(time)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| format!("{time:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    /// A self-signed certificate for `cn` valid until `not_after`, and its key, as PEM.
    fn certificate(cn: &str, not_after: time::OffsetDateTime) -> (String, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.not_before = not_after - time::Duration::days(30);
        params.not_after = not_after;
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn files(dir: &Path) -> IdentityFiles {
        identity_files(
            ("X_CERT_FILE", Some(&dir.join("tls.crt"))),
            ("X_KEY_FILE", Some(&dir.join("tls.key"))),
        )
        .unwrap()
        .unwrap()
    }

    fn write(dir: &Path, (cert, key): &(String, String)) {
        std::fs::write(dir.join("tls.crt"), cert).unwrap();
        std::fs::write(dir.join("tls.key"), key).unwrap();
    }

    fn in_days(days: i64) -> time::OffsetDateTime {
        time::OffsetDateTime::now_utc() + time::Duration::days(days)
    }

    #[test]
    fn both_files_or_neither() {
        let path = Path::new("/x/tls.crt");
        assert_eq!(
            identity_files(("C", None), ("K", Some(Path::new("")))).unwrap(),
            None
        );
        assert_eq!(
            identity_files(("C", Some(path)), ("K", None)).unwrap_err(),
            "C is set but K is not: a client certificate needs its key"
        );
        assert!(
            identity_files(("C", None), ("K", Some(path)))
                .unwrap_err()
                .starts_with("K is set but C is not")
        );
    }

    #[test]
    fn a_good_pair_loads_with_its_subject_serial_and_end() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &certificate("perago-client", in_days(10)));
        let loaded = files(dir.path()).load().unwrap();
        assert_eq!(loaded.subject, "CN=perago-client");
        assert!(!loaded.serial.is_empty(), "{loaded:?}");
        assert!(
            loaded.serial.chars().all(|c| c.is_ascii_hexdigit()),
            "{}",
            loaded.serial
        );
        assert!(loaded.not_after > SystemTime::now());
        assert!(loaded.describe().starts_with("CN=perago-client, serial "));
    }

    #[test]
    fn errors_name_the_cause_the_setting_and_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let shown = |name: &str| {
            format!(
                "{}={}",
                name,
                dir.path()
                    .join(match name {
                        "X_CERT_FILE" => "tls.crt",
                        _ => "tls.key",
                    })
                    .display()
            )
        };
        let good = certificate("perago-client", in_days(10));

        // A missing key file.
        std::fs::write(dir.path().join("tls.crt"), &good.0).unwrap();
        let missing = files(dir.path()).load().unwrap_err();
        assert!(
            missing.starts_with(&format!(
                "{}: cannot read the client key: ",
                shown("X_KEY_FILE")
            )),
            "{missing}"
        );
        assert!(missing.contains("kubernetes.io/tls"), "{missing}");

        // A key of another certificate.
        let other = certificate("someone-else", in_days(10));
        write(dir.path(), &(good.0.clone(), other.1.clone()));
        let mismatch = files(dir.path()).load().unwrap_err();
        assert!(
            mismatch.starts_with(&format!(
                "{} is not the key of the certificate in {} (CN=perago-client, serial ",
                shown("X_KEY_FILE"),
                shown("X_CERT_FILE")
            )),
            "{mismatch}"
        );

        // An expired certificate.
        write(dir.path(), &certificate("old-client", in_days(-1)));
        let expired = files(dir.path()).load().unwrap_err();
        assert!(
            expired.starts_with(&format!(
                "{}: the client certificate (CN=old-client, serial ",
                shown("X_CERT_FILE")
            )),
            "{expired}"
        );
        assert!(expired.contains(") expired at "), "{expired}");

        // Swapped files: no certificate where one belongs.
        write(dir.path(), &(good.1.clone(), good.0.clone()));
        let swapped = files(dir.path()).load().unwrap_err();
        assert!(swapped.contains("holds no PEM certificate"), "{swapped}");
        write(dir.path(), &(good.0.clone(), good.0.clone()));
        let no_key = files(dir.path()).load().unwrap_err();
        assert!(no_key.contains("holds no PEM private key"), "{no_key}");
    }

    #[test]
    fn serials_print_as_openssl_prints_them() {
        assert_eq!(serial_hex(&[0x00, 0x8a, 0x01]), "8A01");
        assert_eq!(serial_hex(&[0x00]), "00");
        assert_eq!(serial_hex(&[0x12]), "12");
    }
}
