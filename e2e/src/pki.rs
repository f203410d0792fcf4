//! The node's own certificate authority: serving certificates for the apiserver and the kubelet,
//! client certificates for each component, the service-account signing key, and kubeconfigs.
//! ECDSA P-256 throughout: generating the whole set takes milliseconds.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its key, written as PEM files.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The authority, kept in memory to sign with and on disk for the components.
pub struct Authority {
    dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What a certificate is for.
pub enum Usage<'a> {
    /// A server answering for these names and addresses.
    Server {
        names: &'a [&'a str],
        addresses: &'a [IpAddr],
    },
    /// A client authenticated as user `cn` in group `org`.
    Client { org: Option<&'a str> },
}

impl Authority {
    pub fn create(dir: &Path) -> Result<Self> {
        Self::create_named(dir, "perago-e2e-ca")
    }

    /// An authority whose certificate names `cn` (authorities of one test tell apart by it).
    pub fn create_named(dir: &Path, cn: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate()?;
        let key_pem = key.serialize_pem();
        let issuer = CertifiedIssuer::self_signed(params, key)?;
        let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        write(&cert, &issuer.pem())?;
        write(&key, &key_pem)?;
        Ok(Self {
            dir: dir.to_owned(),
            issuer,
            cert,
            key,
        })
    }

    /// Issue `<name>.crt` / `<name>.key` for subject `cn`.
    pub fn issue(&self, name: &str, cn: &str, usage: &Usage<'_>) -> Result<Pair> {
        self.issue_with(
            name,
            cn,
            usage,
            CertificateParams::new(Vec::<String>::new())?,
        )
    }

    /// [`Self::issue`], of a certificate that expired on 1 January 2021.
    pub fn issue_expired(&self, name: &str, cn: &str, usage: &Usage<'_>) -> Result<Pair> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        self.issue_with(name, cn, usage, params)
    }

    fn issue_with(
        &self,
        name: &str,
        cn: &str,
        usage: &Usage<'_>,
        mut params: CertificateParams,
    ) -> Result<Pair> {
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        match usage {
            Usage::Server { names, addresses } => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                for n in *names {
                    params
                        .subject_alt_names
                        .push(SanType::DnsName((*n).try_into()?));
                }
                for a in *addresses {
                    params.subject_alt_names.push(SanType::IpAddress(*a));
                }
            }
            Usage::Client { org } => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                if let Some(org) = org {
                    params
                        .distinguished_name
                        .push(DnType::OrganizationName, *org);
                }
            }
        }
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let pair = Pair {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        write(&pair.cert, &cert.pem())?;
        write(&pair.key, &key.serialize_pem())?;
        Ok(pair)
    }

    /// A bare key pair (the service-account token signer), as `<name>.key` (PKCS#8) and
    /// `<name>.pub`.
    pub fn key_pair(&self, name: &str) -> Result<Pair> {
        let key = KeyPair::generate()?;
        let pair = Pair {
            cert: self.dir.join(format!("{name}.pub")),
            key: self.dir.join(format!("{name}.key")),
        };
        write(&pair.cert, &key.public_key_pem())?;
        write(&pair.key, &key.serialize_pem())?;
        Ok(pair)
    }

    /// A kubeconfig for `server` trusting this authority, authenticating with `client`.
    pub fn kubeconfig(&self, path: &Path, server: &str, client: &Pair) -> Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: perago-e2e\n  cluster:\n    server: {server}\n    \
             certificate-authority: {ca}\nusers:\n- name: user\n  user:\n    client-certificate: {cert}\n    \
             client-key: {key}\ncontexts:\n- name: perago-e2e\n  context:\n    cluster: perago-e2e\n    user: user\n\
             current-context: perago-e2e\n",
            ca = self.cert.display(),
            cert = client.cert.display(),
            key = client.key.display(),
        );
        write(path, &text)
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
