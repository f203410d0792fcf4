//! How a binary is told where Conductor is and who it is there: the flags (each also read
//! from the variable Conductor's own tools read) that the sidecar, the operator and `kubectl
//! perago` share, and the one set of rules for their values.

use clap::Args;

use perago_contract::setting::given;
use perago_contract::trust::{IdentityFiles, Tls, identity_files};

use crate::Credentials;

/// Conductor's API and the access key pair to call it with.
#[derive(Args, Clone, Debug, Default)]
pub struct ConductorFlags {
    /// Conductor API base URL, including `/api`.
    #[arg(long, env = "CONDUCTOR_SERVER_URL", global = true)]
    pub conductor_url: Option<String>,
    /// PEM bundle of the certificate authorities that sign Conductor's certificate, trusted
    /// beside the built-in and the platform's roots (a private CA).
    #[arg(long, env = "PERAGO_CONDUCTOR_CA_FILE", global = true)]
    pub conductor_ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate presented to Conductor (to a gateway in front of it that asks
    /// for one), e.g. a `kubernetes.io/tls` Secret's `tls.crt`; read again when it changes.
    #[arg(long, env = "PERAGO_CONDUCTOR_CLIENT_CERT_FILE", global = true)]
    pub conductor_client_cert_file: Option<std::path::PathBuf>,
    /// The PEM key of `--conductor-client-cert-file` (`tls.key`).
    #[arg(long, env = "PERAGO_CONDUCTOR_CLIENT_KEY_FILE", global = true)]
    pub conductor_client_key_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub auth: ConductorAuthFlags,
}

/// The access key pair alone (Orkes; Conductor OSS needs none): for a binary that learns the
/// URL some other way.
#[derive(Args, Clone, Debug, Default)]
pub struct ConductorAuthFlags {
    #[arg(
        long,
        env = "CONDUCTOR_AUTH_KEY",
        hide_env_values = true,
        global = true
    )]
    pub conductor_auth_key: Option<String>,
    #[arg(
        long,
        env = "CONDUCTOR_AUTH_SECRET",
        hide_env_values = true,
        global = true
    )]
    pub conductor_auth_secret: Option<String>,
}

impl ConductorFlags {
    /// The URL, when given.
    pub fn url(&self) -> Result<Option<String>, String> {
        given("CONDUCTOR_SERVER_URL", self.conductor_url.as_deref()).map_err(String::from)
    }

    /// The certificates of the CA bundle, when one is given.
    pub fn roots(&self) -> Result<Vec<reqwest::Certificate>, String> {
        perago_contract::trust::roots(
            "PERAGO_CONDUCTOR_CA_FILE",
            self.conductor_ca_file.as_deref(),
        )
    }

    /// The client certificate's files, when they are given (both or neither).
    pub fn identity(&self) -> Result<Option<IdentityFiles>, String> {
        identity_files(
            (
                "PERAGO_CONDUCTOR_CLIENT_CERT_FILE",
                self.conductor_client_cert_file.as_deref(),
            ),
            (
                "PERAGO_CONDUCTOR_CLIENT_KEY_FILE",
                self.conductor_client_key_file.as_deref(),
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
}

impl ConductorAuthFlags {
    /// Both halves of the key pair, or neither.
    pub fn credentials(&self) -> Result<Option<Credentials>, String> {
        let key = given("CONDUCTOR_AUTH_KEY", self.conductor_auth_key.as_deref())?;
        let secret = given(
            "CONDUCTOR_AUTH_SECRET",
            self.conductor_auth_secret.as_deref(),
        )?;
        match (key, secret) {
            (Some(key), Some(secret)) => Ok(Some(Credentials { key, secret })),
            (None, None) => Ok(None),
            (None, Some(_)) => {
                Err("Conductor credentials are incomplete; missing CONDUCTOR_AUTH_KEY".into())
            }
            (Some(_), None) => {
                Err("Conductor credentials are incomplete; missing CONDUCTOR_AUTH_SECRET".into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(key: Option<&str>, secret: Option<&str>) -> ConductorAuthFlags {
        ConductorAuthFlags {
            conductor_auth_key: key.map(str::to_owned),
            conductor_auth_secret: secret.map(str::to_owned),
        }
    }

    #[test]
    fn values_are_trimmed_blank_is_unset_and_placeholders_are_refused() {
        let url = |u: &str| ConductorFlags {
            conductor_url: Some(u.to_owned()),
            ..ConductorFlags::default()
        };
        assert_eq!(
            url(" http://c/api ").url().unwrap().as_deref(),
            Some("http://c/api")
        );
        assert_eq!(url("  ").url().unwrap(), None);
        assert_eq!(
            url("replace-me").url().unwrap_err(),
            "CONDUCTOR_SERVER_URL must be replaced with a real value"
        );
        assert_eq!(
            auth(Some("replace-me"), Some("s"))
                .credentials()
                .unwrap_err(),
            "CONDUCTOR_AUTH_KEY must be replaced with a real value"
        );
    }

    #[test]
    fn the_key_pair_goes_together() {
        assert!(auth(None, None).credentials().unwrap().is_none());
        assert!(auth(Some("k"), Some("s")).credentials().unwrap().is_some());
        assert!(
            auth(Some("k"), None)
                .credentials()
                .unwrap_err()
                .ends_with("missing CONDUCTOR_AUTH_SECRET")
        );
        assert!(
            auth(None, Some("s"))
                .credentials()
                .unwrap_err()
                .ends_with("missing CONDUCTOR_AUTH_KEY")
        );
        assert!(auth(Some("k"), Some(" ")).credentials().is_err());
    }
}
