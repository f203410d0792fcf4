//! lakeFS on its embedded storage, or on PostgreSQL with an S3 server.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY, http_client};
use crate::faults::FaultProxy;
use crate::pki::Pair;
use crate::process::{Restartable, ServerProcess, free_port, obtain, wait_ready};
use crate::storage::{
    BUCKET, ObjectStore, Postgres, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, Storage,
};

/// A running lakeFS server with an admin user, on the embedded storage or on PostgreSQL and
/// an S3 server ([`crate::storage`]).
pub struct LakeFs {
    pub endpoint: String,
    pub storage: Storage,
    /// Its log, to start it again ([`LakeFs::crash_and_restart`]).
    log: PathBuf,
    // Dropped in this order: lakeFS stops before its stores.
    server: Restartable,
    /// The S3 server, on [`Storage::PostgresS3`].
    pub object_store: Option<ObjectStore>,
    /// The fault proxy the presigned URLs point at, when lakeFS was started behind one
    /// ([`LakeFs::start_presigning_through_proxy`]).
    pub object_store_proxy: Option<FaultProxy>,
    pub postgres: Option<Arc<Postgres>>,
}

impl LakeFs {
    pub async fn start(dir: &Path, host: IpAddr) -> Result<Self> {
        Self::start_serving(dir, host, None).await
    }

    /// A lakeFS with its files in `dir`, serving HTTPS with `tls` (a certificate and its key,
    /// PEM) when given.
    pub async fn start_serving(dir: &Path, host: IpAddr, tls: Option<&Pair>) -> Result<Self> {
        Self::start_on(dir, host, tls, Storage::Embedded).await
    }

    /// A lakeFS on `storage`.
    pub async fn start_on(
        dir: &Path,
        host: IpAddr,
        tls: Option<&Pair>,
        storage: Storage,
    ) -> Result<Self> {
        Self::start_with(dir, host, tls, storage, None, None).await
    }

    /// A lakeFS on PostgreSQL and the S3 server, its metadata in `postgres` (shared with a
    /// Conductor).
    pub async fn start_sharing(dir: &Path, host: IpAddr, postgres: Arc<Postgres>) -> Result<Self> {
        Self::start_with(dir, host, None, Storage::PostgresS3, None, Some(postgres)).await
    }

    /// A lakeFS on PostgreSQL and the S3 server whose presigned URLs expire after `expiry`
    /// and point at a fault proxy in front of the S3 server ([`Self::object_store_proxy`]),
    /// through which the object store can be slowed, refused or cut off.
    pub async fn start_presigning_through_proxy(
        dir: &Path,
        host: IpAddr,
        expiry: Duration,
    ) -> Result<Self> {
        Self::start_with(dir, host, None, Storage::PostgresS3, Some(expiry), None).await
    }

    async fn start_with(
        dir: &Path,
        host: IpAddr,
        tls: Option<&Pair>,
        storage: Storage,
        proxied_expiry: Option<Duration>,
        shared: Option<Arc<Postgres>>,
    ) -> Result<Self> {
        let binary = obtain("lakefs")?;
        let port = free_port()?;
        let home = dir.join("lakefs");
        std::fs::create_dir_all(&home)?;
        let (postgres, object_store) = match storage {
            Storage::Embedded => (None, None),
            Storage::PostgresS3 => {
                let postgres = async {
                    match shared {
                        Some(postgres) => Ok(postgres),
                        None => Postgres::start(dir, host).await.map(Arc::new),
                    }
                };
                let (postgres, store) = tokio::join!(postgres, ObjectStore::start(dir, host));
                (Some(postgres?), Some(store?))
            }
        };
        let object_store_proxy = match (&object_store, proxied_expiry) {
            (Some(store), Some(_)) => Some(FaultProxy::start_keeping_host(&store.endpoint).await?),
            _ => None,
        };
        let expiry = proxied_expiry
            .unwrap_or(Duration::from_secs(900))
            .as_secs()
            .max(1);
        let stores = match (&postgres, &object_store) {
            (Some(postgres), Some(store)) => format!(
                "database: {{type: postgres, postgres: {{connection_string: \"{}\"}}}}\n\
                 blockstore: {{type: s3, s3: {{endpoint: \"{}\", force_path_style: true, \
                 region: us-east-1, discover_bucket_region: false, pre_signed_expiry: {expiry}s, \
                 pre_signed_endpoint: \"{}\", \
                 credentials: {{access_key_id: \"{S3_ACCESS_KEY_ID}\", \
                 secret_access_key: \"{S3_SECRET_ACCESS_KEY}\"}}}}}}\n",
                postgres.url,
                store.endpoint,
                object_store_proxy
                    .as_ref()
                    .map_or(&store.endpoint, |p| &p.url),
            ),
            _ => format!(
                "database: {{type: local, local: {{path: \"{home}/kv\", sync_writes: false}}}}\n\
                 blockstore: {{type: local, local: {{path: \"{home}/blocks\"}}}}\n",
                home = home.display()
            ),
        };
        let config = home.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                r#"listen_address: "{host}:{port}"
logging: {{format: text, level: WARN, output: "-"}}
{stores}committed: {{local_cache: {{dir: "{home}/cache", size_bytes: 268435456}}, sstable: {{memory: {{cache_size_bytes: 67108864}}}}}}
auth: {{encrypt: {{secret_key: "perago-e2e-only-secret"}}}}
installation: {{user_name: admin, access_key_id: "{LAKEFS_ACCESS_KEY_ID}", secret_access_key: "{LAKEFS_SECRET_ACCESS_KEY}"}}
stats: {{enabled: false}}
email_subscription: {{enabled: false}}
security: {{check_latest_version: false, audit_check_url: ""}}
ui: {{enabled: false}}
{tls}"#,
                home = home.display(),
                tls = tls.map_or(String::new(), |pair| format!(
                    "tls: {{enabled: true, cert_file: \"{}\", key_file: \"{}\"}}\n",
                    pair.cert.display(),
                    pair.key.display()
                )),
            ),
        )?;
        let mut cmd = Command::new(binary);
        cmd.arg("run").arg("-c").arg(&config).current_dir(&home);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://{host}:{port}");
        let log = dir.join("lakefs.log");
        let (process, took) = serve_lakefs(&mut cmd, &log, &endpoint).await?;
        let client = http_client();
        if storage == Storage::PostgresS3 {
            // lakeFS sets its admin up by itself only on its embedded stores.
            setup_admin(&client, &endpoint).await?;
        }
        eprintln!("[e2e] lakefs ({storage:?}) ready on {endpoint} in {took:.1?}");
        Ok(Self {
            endpoint,
            storage,
            object_store,
            object_store_proxy,
            log,
            server: Restartable::running(cmd, process),
            postgres,
        })
    }

    /// Kill the server at once (SIGKILL: a crash, every call in flight cut), leave it down for
    /// `down`, and start it again on the same stores and port; waits until it is healthy.
    pub async fn crash_and_restart(&self, down: Duration) -> Result<()> {
        self.server
            .crash_and_restart(down, async |mut command| {
                let (process, took) = serve_lakefs(&mut command, &self.log, &self.endpoint).await?;
                eprintln!("[e2e] lakefs restarted on {} in {took:.1?}", self.endpoint);
                Ok(process)
            })
            .await
    }

    /// The storage namespace of a new repository `name`.
    pub fn namespace(&self, name: &str) -> String {
        match self.storage {
            Storage::Embedded => format!("local://{name}"),
            Storage::PostgresS3 => format!("s3://{BUCKET}/{name}"),
        }
    }

    /// The hosts presigned URLs point at, as a sidecar's `PERAGO_LAKEFS_OBJECT_STORE_HOSTS`
    /// takes them; empty on the embedded storage, which cannot presign.
    pub fn object_store_hosts(&self) -> String {
        if let Some(proxy) = &self.object_store_proxy {
            return proxy.url.trim_start_matches("http://").to_owned();
        }
        self.object_store
            .as_ref()
            .map_or(String::new(), |s| s.authority.clone())
    }
}

/// Start lakeFS's command and wait until `endpoint` says it is healthy.
async fn serve_lakefs(
    command: &mut Command,
    log: &Path,
    endpoint: &str,
) -> Result<(ServerProcess, Duration)> {
    let mut process = ServerProcess::spawn("lakefs", command, log.to_owned())?;
    let client = http_client();
    let took = wait_ready(&mut process, Duration::from_secs(60), || {
        let answer = client.get(format!("{endpoint}/api/v1/healthcheck")).send();
        async move { answer.await.is_ok_and(|r| r.status().as_u16() == 204) }
    })
    .await?;
    Ok((process, took))
}

/// The harness's admin key, set through lakeFS's setup call.
async fn setup_admin(client: &reqwest::Client, endpoint: &str) -> Result<()> {
    let answer = client
        .post(format!("{endpoint}/api/v1/setup_lakefs"))
        .json(&serde_json::json!({
            "username": "admin",
            "key": {"access_key_id": LAKEFS_ACCESS_KEY_ID, "secret_access_key": LAKEFS_SECRET_ACCESS_KEY},
        }))
        .send()
        .await
        .context("setting lakeFS's admin up")?;
    let status = answer.status();
    if !status.is_success() && status != reqwest::StatusCode::CONFLICT {
        bail!(
            "setting lakeFS's admin up: HTTP {status}: {}",
            answer.text().await.unwrap_or_default()
        );
    }
    Ok(())
}
