//! Where Conductor and lakeFS are: flags, else the variables the other tools read
//! (`CONDUCTOR_SERVER_URL`, `CONDUCTOR_AUTH_*`, `LAKECTL_*`).

use std::time::Duration;

use clap::Args;
use perago_conductor::ConductorClient;
use perago_conductor::flags::ConductorFlags;
use perago_lakefs::LakeFsClient;
use perago_lakefs::flags::LakeFsFlags;

use crate::Failure;

#[derive(Args, Debug, Clone)]
pub struct Endpoints {
    #[command(flatten)]
    pub conductor: ConductorFlags,
    #[command(flatten)]
    pub lakefs: LakeFsFlags,
    /// Timeout of every call (seconds).
    #[arg(long, default_value_t = 30, global = true)]
    pub timeout_seconds: u64,
    /// Use the Conductor and lakeFS this PeragoTask's pods use, read through your kubeconfig;
    /// flags and the variables above override what it finds.
    #[arg(long, global = true)]
    pub task: Option<String>,
    /// The namespace of `--task` (default: the kubeconfig context's).
    #[arg(short = 'n', long, global = true, requires = "task")]
    pub namespace: Option<String>,
}

impl Endpoints {
    /// These endpoints, with what `--task` finds filling the ones not given.
    pub async fn resolved(&self) -> Result<Self, Failure> {
        let Some(task) = &self.task else {
            return Ok(self.clone());
        };
        let env = crate::cluster::task_environment(self.namespace.as_deref(), task).await?;
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

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds.max(1))
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
        LakeFsClient::new(
            endpoint,
            &access.access_key_id,
            &access.secret_access_key,
            self.timeout(),
        )
        .map_err(|e| Failure::Usage(format!("lakeFS endpoint {endpoint}: {e}")))
    }

    /// The Conductor client, when a URL is given.
    pub fn conductor(&self) -> Result<Option<ConductorClient>, Failure> {
        let Some(url) = self.conductor.url().map_err(Failure::Usage)? else {
            return Ok(None);
        };
        let credentials = self.conductor.auth.credentials().map_err(Failure::Usage)?;
        ConductorClient::new(&url, self.timeout(), credentials)
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
