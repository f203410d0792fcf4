//! Where Conductor and lakeFS are: flags, else the variables the other tools read
//! (`CONDUCTOR_SERVER_URL`, `CONDUCTOR_AUTH_*`, `LAKECTL_*`).

use std::time::Duration;

use clap::Args;
use perago_conductor::{ConductorClient, Credentials};
use perago_lakefs::LakeFsClient;

use crate::Failure;

#[derive(Args, Debug, Clone)]
pub struct Endpoints {
    /// Conductor API base URL, including `/api`.
    #[arg(long, env = "CONDUCTOR_SERVER_URL", global = true)]
    pub conductor_url: Option<String>,
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

fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

impl Endpoints {
    /// These endpoints, with what `--task` finds filling the ones not given.
    pub async fn resolved(&self) -> Result<Self, Failure> {
        let Some(task) = &self.task else {
            return Ok(self.clone());
        };
        let env = crate::cluster::task_environment(self.namespace.as_deref(), task).await?;
        let mut out = self.clone();
        for (field, name) in [
            (&mut out.conductor_url, "CONDUCTOR_SERVER_URL"),
            (&mut out.conductor_auth_key, "CONDUCTOR_AUTH_KEY"),
            (&mut out.conductor_auth_secret, "CONDUCTOR_AUTH_SECRET"),
            (&mut out.lakefs_endpoint, "LAKECTL_SERVER_ENDPOINT_URL"),
            (
                &mut out.lakefs_access_key_id,
                "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
            ),
            (
                &mut out.lakefs_secret_access_key,
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            ),
        ] {
            if given(field).is_none() {
                *field = env.get(name).cloned();
            }
        }
        Ok(out)
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds.max(1))
    }

    pub fn lakefs(&self) -> Result<LakeFsClient, Failure> {
        let missing = |what: &str| {
            Failure::Usage(format!(
                "no lakeFS {what}: pass --lakefs-{} or set LAKECTL_{}",
                what.replace(' ', "-"),
                match what {
                    "endpoint" => "SERVER_ENDPOINT_URL",
                    "access key id" => "CREDENTIALS_ACCESS_KEY_ID",
                    _ => "CREDENTIALS_SECRET_ACCESS_KEY",
                }
            ))
        };
        let endpoint = given(&self.lakefs_endpoint).ok_or_else(|| missing("endpoint"))?;
        let key = given(&self.lakefs_access_key_id).ok_or_else(|| missing("access key id"))?;
        let secret =
            given(&self.lakefs_secret_access_key).ok_or_else(|| missing("secret access key"))?;
        LakeFsClient::new(endpoint, key, secret, self.timeout())
            .map_err(|e| Failure::Usage(format!("lakeFS endpoint {endpoint}: {e}")))
    }

    /// The Conductor client, when a URL is given.
    pub fn conductor(&self) -> Result<Option<ConductorClient>, Failure> {
        let Some(url) = given(&self.conductor_url) else {
            return Ok(None);
        };
        let credentials = match (
            given(&self.conductor_auth_key),
            given(&self.conductor_auth_secret),
        ) {
            (Some(key), Some(secret)) => Some(Credentials {
                key: key.to_owned(),
                secret: secret.to_owned(),
            }),
            (None, None) => None,
            _ => {
                return Err(Failure::Usage(
                    "CONDUCTOR_AUTH_KEY and CONDUCTOR_AUTH_SECRET go together".into(),
                ));
            }
        };
        ConductorClient::new(url, self.timeout(), credentials)
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
