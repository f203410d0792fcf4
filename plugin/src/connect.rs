//! Where Conductor and lakeFS are: flags, else the variables the other tools read
//! (`CONDUCTOR_SERVER_URL`, `CONDUCTOR_AUTH_*`, `LAKECTL_*`).

use std::time::Duration;

use clap::Args;
use perago_conductor::ConductorClient;
use perago_conductor::flags::ConductorFlags;
use perago_conductor::trust::Tls;
use perago_lakefs::LakeFsClient;
use perago_lakefs::flags::LakeFsFlags;

use crate::Failure;
use crate::cluster::ClusterFlags;

#[derive(Args, Debug, Clone)]
pub struct Endpoints {
    #[command(flatten)]
    pub conductor: ConductorFlags,
    #[command(flatten)]
    pub lakefs: LakeFsFlags,
    /// PEM bundle of a private certificate authority trusted for both Conductor and lakeFS,
    /// beside the built-in and the platform's roots (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the OS
    /// store) and the `--conductor-ca-file` and `--lakefs-ca-file` bundles.
    #[arg(long, env = "PERAGO_CA_FILE", global = true)]
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate presented to both Conductor and lakeFS (to a gateway in front
    /// of them that asks for one), e.g. a `kubernetes.io/tls` Secret's `tls.crt`; the
    /// `--conductor-client-cert-file` and `--lakefs-client-cert-file` pairs win for their server.
    #[arg(long, env = "PERAGO_CLIENT_CERT_FILE", global = true)]
    pub client_cert: Option<std::path::PathBuf>,
    /// The PEM key of `--client-cert` (`tls.key`).
    #[arg(long, env = "PERAGO_CLIENT_KEY_FILE", global = true)]
    pub client_key: Option<std::path::PathBuf>,
    /// How long any one call may take, to Kubernetes, Conductor or lakeFS: `30s`, `2m`.
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse_timeout, global = true)]
    pub request_timeout: Duration,
    /// Use the Conductor and lakeFS this PeragoTask's pods use, read through your kubeconfig
    /// (in `-n`'s namespace); flags and the variables above override what it finds.
    #[arg(long, global = true)]
    pub task: Option<String>,
}

impl Endpoints {
    /// These endpoints, with what `--task` finds filling the ones not given.
    pub async fn resolved(&self, cluster: &ClusterFlags) -> Result<Self, Failure> {
        let Some(task) = &self.task else {
            return Ok(self.clone());
        };
        let env = crate::cluster::task_environment(cluster, self.timeout(), task).await?;
        let mut out = self.clone();
        let conductor = &mut out.conductor;
        let lakefs = &mut out.lakefs;
        for (field, name) in [
            (&mut conductor.conductor_url, "CONDUCTOR_SERVER_URL"),
            (&mut conductor.auth.conductor_auth_key, "CONDUCTOR_AUTH_KEY"),
            (
                &mut conductor.auth.conductor_auth_secret,
                "CONDUCTOR_AUTH_SECRET",
            ),
            (&mut lakefs.lakefs_endpoint, "LAKECTL_SERVER_ENDPOINT_URL"),
            (
                &mut lakefs.lakefs_access_key_id,
                "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
            ),
            (
                &mut lakefs.lakefs_secret_access_key,
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            ),
        ] {
            if field.as_deref().is_none_or(|v| v.trim().is_empty()) {
                *field = env.get(name).cloned();
            }
        }
        Ok(out)
    }

    pub fn timeout(&self) -> Duration {
        self.request_timeout
    }

    /// `--ca-file`'s certificates beside those of one server's own bundle, and the server's
    /// own client certificate, else `--client-cert`'s.
    fn tls(&self, own: Result<Tls, String>) -> Result<Tls, Failure> {
        let mut tls = own.map_err(Failure::Usage)?;
        tls.roots.extend(
            perago_conductor::trust::roots("--ca-file", self.ca_file.as_deref())
                .map_err(Failure::Usage)?,
        );
        if tls.identity.is_none() {
            tls.identity = perago_conductor::trust::identity_files(
                ("--client-cert", self.client_cert.as_deref()),
                ("--client-key", self.client_key.as_deref()),
            )
            .map_err(Failure::Usage)?;
        }
        Ok(tls)
    }

    pub fn lakefs(&self) -> Result<LakeFsClient, Failure> {
        let access = self
            .lakefs
            .access()
            .map_err(Failure::Usage)?
            .ok_or_else(|| {
                Failure::Usage(
                    "no lakeFS: pass --lakefs-endpoint, --lakefs-access-key-id and \
                 --lakefs-secret-access-key or set LAKECTL_SERVER_ENDPOINT_URL, \
                 LAKECTL_CREDENTIALS_ACCESS_KEY_ID and LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"
                        .into(),
                )
            })?;
        let endpoint = &access.endpoint;
        LakeFsClient::with_tls(
            endpoint,
            &access.access_key_id,
            &access.secret_access_key,
            self.timeout(),
            self.tls(self.lakefs.tls())?,
        )
        .map_err(|e| Failure::Usage(format!("lakeFS endpoint {endpoint}: {e}")))
    }

    /// The Conductor client, when a URL is given.
    pub fn conductor(&self) -> Result<Option<ConductorClient>, Failure> {
        let Some(url) = self.conductor.url().map_err(Failure::Usage)? else {
            return Ok(None);
        };
        let credentials = self.conductor.auth.credentials().map_err(Failure::Usage)?;
        let tls = self.tls(self.conductor.tls())?;
        ConductorClient::with_tls(&url, self.timeout(), credentials, tls)
            .map(Some)
            .map_err(|e| Failure::Usage(format!("Conductor URL {url}: {e}")))
    }

    /// The Conductor client, required.
    pub fn require_conductor(&self) -> Result<ConductorClient, Failure> {
        self.conductor()?.ok_or_else(|| {
            Failure::Usage("no Conductor: pass --conductor-url or set CONDUCTOR_SERVER_URL".into())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn endpoints() -> Endpoints {
        Endpoints {
            conductor: ConductorFlags::default(),
            lakefs: LakeFsFlags::default(),
            ca_file: None,
            client_cert: Some(PathBuf::from("/both/tls.crt")),
            client_key: Some(PathBuf::from("/both/tls.key")),
            request_timeout: Duration::from_secs(30),
            task: None,
        }
    }

    #[test]
    fn a_servers_own_client_certificate_wins_over_the_shared_one() {
        let shared = endpoints();
        let identity = shared.tls(shared.conductor.tls()).unwrap().identity;
        let files = identity.unwrap();
        assert_eq!(
            files.cert.to_string(),
            "--client-cert=/both/tls.crt",
            "errors name the flag"
        );
        let mut own = endpoints();
        own.lakefs.lakefs_client_cert_file = Some(PathBuf::from("/lake/tls.crt"));
        own.lakefs.lakefs_client_key_file = Some(PathBuf::from("/lake/tls.key"));
        let files = own.tls(own.lakefs.tls()).unwrap().identity.unwrap();
        assert_eq!(files.key.path, PathBuf::from("/lake/tls.key"));
        let mut half = endpoints();
        half.client_key = None;
        assert!(matches!(
            half.tls(half.conductor.tls()),
            Err(Failure::Usage(m)) if m.starts_with("--client-cert is set but --client-key is not")
        ));
    }
}
