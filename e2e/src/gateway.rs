//! An authenticating gateway in front of servers that authenticate no one: Debian's nginx,
//! terminating TLS with a certificate of a test authority and admitting only clients that
//! present a certificate one of its trusted authorities signed (`ssl_verify_client on`), as a
//! platform team puts one in front of Conductor OSS. Each upstream gets a port of its own; the
//! access log records, per request, the client certificate that was presented.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::pki::{Authority, Pair, Usage};
use crate::process::{ServerProcess, free_port, wait_ready};

/// Debian's nginx, from the package `nginx` (e2e/bin/prerequisites installs it).
pub const NGINX: &str = "/usr/sbin/nginx";

/// A running gateway.
pub struct Gateway {
    /// `https://host:port` of each upstream, in the order given.
    pub urls: Vec<String>,
    /// The authority of the gateway's own serving certificate, which clients trust.
    pub serving_ca: PathBuf,
    access_log: PathBuf,
    process: ServerProcess,
}

/// One request as the gateway logged it.
#[derive(Clone, Debug, Deserialize)]
pub struct Request {
    /// Seconds since the epoch, to the millisecond, when the request ended (`$msec`).
    pub time: f64,
    /// How long it took, from its first byte (`$request_time`).
    pub duration: f64,
    /// The client's address (`$remote_addr`): on the node, the pod's.
    pub client: String,
    pub port: u16,
    /// nginx's verdict on the client certificate: `SUCCESS`, `NONE`, `FAILED:<reason>`.
    pub verify: String,
    /// The client certificate's subject (`CN=...`), empty without one.
    pub subject: String,
    /// Its serial, as OpenSSL prints it.
    pub serial: String,
    pub status: u16,
    pub request: String,
}

impl Request {
    /// When the request began, seconds since the epoch.
    pub fn started(&self) -> f64 {
        self.time - self.duration
    }
}

impl Gateway {
    /// A gateway in `dir` on `host`, one TLS port per upstream (`http://host:port`), serving a
    /// certificate of `serving` for `host`, and admitting clients whose certificate one of the
    /// authorities in the PEM bundle `client_cas` signed.
    pub async fn start(
        dir: &Path,
        host: IpAddr,
        serving: &Authority,
        client_cas: &Path,
        upstreams: &[&str],
    ) -> Result<Self> {
        if !Path::new(NGINX).exists() {
            bail!(
                "the gateway needs {NGINX}: install the Debian package nginx (e2e/bin/prerequisites does)"
            );
        }
        std::fs::create_dir_all(dir.join("temp"))
            .with_context(|| format!("creating {}", dir.display()))?;
        let server = serving.issue(
            "gateway",
            "perago-e2e-gateway",
            &Usage::Server {
                names: &["localhost"],
                addresses: &[host],
            },
        )?;
        let ports = upstreams
            .iter()
            .map(|_| free_port())
            .collect::<Result<Vec<_>>>()?;
        let access_log = dir.join("access.log");
        let config = dir.join("nginx.conf");
        std::fs::write(
            &config,
            config_text(
                dir,
                host,
                &server,
                client_cas,
                upstreams,
                &ports,
                &access_log,
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        let mut command = Command::new(NGINX);
        command
            .arg("-p")
            .arg(dir)
            .arg("-e")
            .arg("stderr")
            .arg("-c")
            .arg(&config)
            .args(["-g", "daemon off;"]);
        let mut process = ServerProcess::spawn("nginx", &mut command, dir.join("nginx.log"))?;
        let addresses: Vec<_> = ports.iter().map(|p| (host, *p)).collect();
        wait_ready(&mut process, Duration::from_secs(20), || {
            let addresses = addresses.clone();
            async move {
                for address in addresses {
                    if tokio::net::TcpStream::connect(address).await.is_err() {
                        return false;
                    }
                }
                true
            }
        })
        .await
        .context("the gateway did not listen")?;
        Ok(Self {
            urls: ports
                .iter()
                .map(|p| format!("https://{host}:{p}"))
                .collect(),
            serving_ca: serving.cert.clone(),
            access_log,
            process,
        })
    }

    /// Every request logged so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        std::fs::read_to_string(&self.access_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The gateway's own log (start-up and errors), for a failing test's message.
    pub fn log(&self) -> String {
        self.process.log_tail()
    }
}

fn config_text(
    dir: &Path,
    host: IpAddr,
    server: &Pair,
    client_cas: &Path,
    upstreams: &[&str],
    ports: &[u16],
    access_log: &Path,
) -> String {
    let temp = dir.join("temp");
    let temp = temp.display();
    let servers: String = upstreams
        .iter()
        .zip(ports)
        .map(|(upstream, port)| {
            format!(
                r#"
  server {{
    listen {host}:{port} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_client_certificate {client_cas};
    ssl_verify_client on;
    location / {{
      proxy_pass {upstream};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_request_buffering off;
      proxy_buffering off;
      proxy_read_timeout 600s;
      proxy_send_timeout 600s;
    }}
  }}
"#,
                cert = server.cert.display(),
                key = server.key.display(),
                client_cas = client_cas.display(),
            )
        })
        .collect();
    // When started as root, nginx runs its workers as `nobody` unless told otherwise; they
    // write the temporary files under the run's directory.
    let user = match nix::unistd::Uid::effective().is_root() {
        true => "user root;\n",
        false => "",
    };
    format!(
        r#"{user}worker_processes 1;
pid {pid};
events {{ worker_connections 1024; }}
http {{
  log_format gateway escape=json '{{"time":$msec,"duration":$request_time,"client":"$remote_addr","port":$server_port,"verify":"$ssl_client_verify","subject":"$ssl_client_s_dn","serial":"$ssl_client_serial","status":$status,"request":"$request"}}';
  access_log {access_log} gateway;
  client_body_temp_path {temp}/body;
  proxy_temp_path {temp}/proxy;
  fastcgi_temp_path {temp}/fastcgi;
  uwsgi_temp_path {temp}/uwsgi;
  scgi_temp_path {temp}/scgi;
  client_max_body_size 0;
  keepalive_timeout 60s;
{servers}}}
"#,
        pid = dir.join("nginx.pid").display(),
        access_log = access_log.display(),
    )
}
