//! How a binary is told where lakeFS is and who it is there: the flags (each also read from
//! the variable `lakectl` reads) that the sidecar and `kubectl perago` share, and the one set
//! of rules for their values.

use clap::Args;
use perago_contract::setting::given;
use perago_contract::trust::{IdentityFiles, Tls, identity_files};

/// lakeFS's endpoint and the access key pair to call it with.
#[derive(Args, Clone, Debug, Default)]
pub struct LakeFsFlags {
    /// lakeFS endpoint.
    #[arg(long, env = "LAKECTL_SERVER_ENDPOINT_URL", global = true)]
    pub lakefs_endpoint: Option<String>,
    #[arg(
        long,
        env = "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
        hide_env_values = true,
        global = true
    )]
    pub lakefs_access_key_id: Option<String>,
    #[arg(
        long,
        env = "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
        hide_env_values = true,
        global = true
    )]
    pub lakefs_secret_access_key: Option<String>,
    /// PEM bundle of the certificate authorities that sign lakeFS's certificate, trusted
    /// beside the built-in and the platform's roots (a private CA).
    #[arg(long, env = "PERAGO_LAKEFS_CA_FILE", global = true)]
    pub lakefs_ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate presented to lakeFS (to a gateway in front of it that asks for
    /// one), e.g. a `kubernetes.io/tls` Secret's `tls.crt`; read again when it changes.
    #[arg(long, env = "PERAGO_LAKEFS_CLIENT_CERT_FILE", global = true)]
    pub lakefs_client_cert_file: Option<std::path::PathBuf>,
    /// The PEM key of `--lakefs-client-cert-file` (`tls.key`).
    #[arg(long, env = "PERAGO_LAKEFS_CLIENT_KEY_FILE", global = true)]
    pub lakefs_client_key_file: Option<std::path::PathBuf>,
}

/// Where lakeFS is and the key pair, all three given.
#[derive(Clone)]
pub struct LakeFsAccess {
    pub endpoint: String,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for LakeFsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeFsAccess")
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

impl LakeFsFlags {
    /// The certificates of the CA bundle, when one is given.
    pub fn roots(&self) -> Result<Vec<reqwest::Certificate>, String> {
        perago_contract::trust::roots("PERAGO_LAKEFS_CA_FILE", self.lakefs_ca_file.as_deref())
    }

    /// The client certificate's files, when they are given (both or neither).
    pub fn identity(&self) -> Result<Option<IdentityFiles>, String> {
        identity_files(
            (
                "PERAGO_LAKEFS_CLIENT_CERT_FILE",
                self.lakefs_client_cert_file.as_deref(),
            ),
            (
                "PERAGO_LAKEFS_CLIENT_KEY_FILE",
                self.lakefs_client_key_file.as_deref(),
            ),
        )
    }

    /// The CA bundle and the client certificate's files.
    pub fn tls(&self) -> Result<Tls, String> {
        Ok(Tls {
            roots: self.roots()?,
            identity: self.identity()?,
        })
    }

    /// All three settings, or none (`None`); some but not all is an error naming the missing
    /// variables.
    pub fn access(&self) -> Result<Option<LakeFsAccess>, String> {
        let settings = [
            ("LAKECTL_SERVER_ENDPOINT_URL", &self.lakefs_endpoint),
            (
                "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
                &self.lakefs_access_key_id,
            ),
            (
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                &self.lakefs_secret_access_key,
            ),
        ];
        let mut values = Vec::with_capacity(3);
        let mut missing = Vec::new();
        for (name, value) in settings {
            match given(name, value.as_deref())? {
                Some(v) => values.push(v),
                None => missing.push(name),
            }
        }
        match (values.as_slice(), missing.len()) {
            ([endpoint, access_key_id, secret_access_key], 0) => Ok(Some(LakeFsAccess {
                endpoint: endpoint.clone(),
                access_key_id: access_key_id.clone(),
                secret_access_key: secret_access_key.clone(),
            })),
            (_, 3) => Ok(None),
            _ => Err(format!(
                "LakeFS config is incomplete; missing {}",
                missing.join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(endpoint: Option<&str>, key: Option<&str>, secret: Option<&str>) -> LakeFsFlags {
        LakeFsFlags {
            lakefs_endpoint: endpoint.map(str::to_owned),
            lakefs_access_key_id: key.map(str::to_owned),
            lakefs_secret_access_key: secret.map(str::to_owned),
            ..LakeFsFlags::default()
        }
    }

    #[test]
    fn all_three_or_none() {
        assert!(flags(None, None, None).access().unwrap().is_none());
        let access = flags(Some("http://l:8000 "), Some("k"), Some("s"))
            .access()
            .unwrap()
            .unwrap();
        assert_eq!(access.endpoint, "http://l:8000");
        assert!(
            !format!("{access:?}").contains("\"s\""),
            "the secret never prints"
        );
        assert_eq!(
            flags(Some("http://l"), None, Some(" "))
                .access()
                .unwrap_err(),
            "LakeFS config is incomplete; missing LAKECTL_CREDENTIALS_ACCESS_KEY_ID, LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"
        );
        assert_eq!(
            flags(Some("replace-me"), Some("k"), Some("s"))
                .access()
                .unwrap_err(),
            "LAKECTL_SERVER_ENDPOINT_URL must be replaced with a real value"
        );
    }
}
