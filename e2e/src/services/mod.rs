//! The real servers: Conductor OSS, lakeFS, and etcd + kube-apiserver, each on free loopback
//! ports with its state in a per-run temporary directory.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::node::{BRIDGE_IP, Containerd, Machine, Node};
use crate::registry::{Registry, chart_version};
use crate::storage::{Postgres, Storage};

mod conductor;
mod kubernetes;
mod lakefs;

pub use conductor::Conductor;
pub(crate) use conductor::java;
pub use kubernetes::Kube;
pub use lakefs::LakeFs;

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// lakeFS admin credentials set at start-up (test-only values).
pub const LAKEFS_ACCESS_KEY_ID: &str = "AKIAIOSFODNN7PERAGO0";
pub const LAKEFS_SECRET_ACCESS_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPERAGOKEY0";
/// Bearer token of the apiserver's `admin` user (group `system:masters`).
pub const KUBE_ADMIN_TOKEN: &str = "perago-e2e-admin-token";

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap_or_default()
}
/// Which servers to start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selection {
    pub conductor: bool,
    pub lakefs: bool,
    pub kube: bool,
    /// The whole single-node cluster (implies `kube`); every server then listens on the pod
    /// bridge's address, where pods reach it.
    pub node: bool,
    /// lakeFS's storage; `PERAGO_E2E_STORAGE` picks it when this is the default.
    pub storage: Storage,
    /// The node's own disk of this many MiB (see [`crate::node::NodeDisk`]); `None`: the
    /// host's, with no evictions for disk.
    pub node_disk_mib: Option<u32>,
}

impl Selection {
    /// Conductor, lakeFS and the whole node.
    pub const ALL: Self = Self {
        conductor: true,
        lakefs: true,
        kube: true,
        node: true,
        storage: Storage::Embedded,
        node_disk_mib: None,
    };

    /// Parse `all` or a comma-separated list of `conductor`, `lakefs`, `kube` (the API alone),
    /// `node` (the API and the node), `s3` (lakeFS on PostgreSQL and an S3 server).
    pub fn parse(text: &str) -> Result<Self> {
        let mut s = Self::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => s = Self::ALL,
                "conductor" => s.conductor = true,
                "lakefs" => s.lakefs = true,
                "kube" => s.kube = true,
                "node" => (s.kube, s.node) = (true, true),
                "s3" => (s.lakefs, s.storage) = (true, Storage::PostgresS3),
                other => {
                    bail!("unknown service '{other}' (conductor, lakefs, kube, node, s3, all)")
                }
            }
        }
        Ok(s)
    }
}

/// A set of running servers sharing one temporary directory; dropping it stops them all and
/// removes the directory (and so does the janitor, when the process exits without dropping it),
/// unless `PERAGO_E2E_KEEP` is set, for looking at the servers' files afterwards.
pub struct Services {
    pub conductor: Option<Conductor>,
    pub lakefs: Option<LakeFs>,
    pub kube: Option<Kube>,
    pub node: Option<Node>,
    /// Where the servers listen: loopback, or the pod bridge's address with a node.
    pub host: IpAddr,
    // Dropped last: the node's janitor must outlive every server.
    dir: tempfile::TempDir,
    _janitor: Option<std::process::Child>,
    _machine: Option<Machine>,
}

impl Services {
    /// Start the selected servers concurrently and wait until each is healthy.
    pub async fn start(selection: Selection) -> Result<Self> {
        let keep = std::env::var_os("PERAGO_E2E_KEEP").is_some();
        let dir = tempfile::Builder::new()
            .prefix("perago-e2e-")
            // With a node the directory holds mounts: only the node's janitor removes it,
            // after unmounting them.
            .disable_cleanup(keep || selection.node)
            .tempdir()?;
        let path = dir.path();
        let (machine, janitor) = match (selection.node, keep) {
            // Waiting for another run's node blocks: off the async runtime's threads.
            (true, _) => {
                let owned = path.to_owned();
                let machine =
                    tokio::task::spawn_blocking(move || crate::node::claim_machine(&owned))
                        .await
                        .context("claiming the machine for the node")??;
                (Some(machine), None)
            }
            (false, true) => (None, None),
            (false, false) => (None, Some(crate::process::remove_after_exit(path)?)),
        };
        let host = match selection.node {
            true => BRIDGE_IP.into(),
            false => LOOPBACK,
        };
        let storage = match selection.storage {
            Storage::Embedded => Storage::from_env()?,
            chosen => chosen,
        };
        // On PostgreSQL and S3, Conductor keeps its state in PostgreSQL too (the same server
        // as lakeFS's when both run).
        let postgres = match storage {
            Storage::PostgresS3 if selection.lakefs || selection.conductor => {
                Some(Arc::new(Postgres::start(path, host).await?))
            }
            _ => None,
        };
        // The cluster (the apiserver, then the node) starts beside Conductor and lakeFS: the
        // node needs neither, and Conductor's start is the longest.
        let cluster = async {
            let (kube, containerd) = tokio::join!(
                async {
                    if selection.kube || selection.node {
                        Kube::start(path, selection.node).await.map(Some)
                    } else {
                        Ok(None)
                    }
                },
                async {
                    if !selection.node {
                        return anyhow::Ok(None);
                    }
                    // The release the node installs, pushed as `make release` pushes one.
                    // Nothing of the node's start needs it: it is published meanwhile.
                    let registry = Registry::start(path, host).await?;
                    let (owned, prefix) = (path.to_owned(), registry.prefix());
                    let publishing = tokio::task::spawn_blocking(move || {
                        crate::registry::publish(&prefix, &owned, &chart_version())
                    });
                    let owned = path.to_owned();
                    let images =
                        tokio::task::spawn_blocking(move || crate::node::build_images(&owned))
                            .await
                            .context("assembling the node's images")??;
                    let containerd = Containerd::start(path, &images, &registry.host).await?;
                    Ok(Some((containerd, registry, publishing)))
                },
            );
            let (kube, containerd) = (kube?, containerd?);
            let node = match (&kube, containerd) {
                (Some(kube), Some((containerd, registry, publishing))) => {
                    let pki = kube
                        .pki
                        .as_ref()
                        .context("the node's apiserver has no PKI")?;
                    let client = kube.client().await?;
                    let release = async { publishing.await.context("publishing the release")? };
                    let node = Node::start(
                        path,
                        pki,
                        (&kube.server, client),
                        containerd,
                        (registry, release),
                        selection.node_disk_mib,
                    );
                    Some(node.await?)
                }
                _ => None,
            };
            anyhow::Ok((kube, node))
        };
        let (conductor, lakefs, cluster) = tokio::join!(
            async {
                match (selection.conductor, &postgres) {
                    (false, _) => Ok(None),
                    (true, None) => Conductor::start(path, host).await.map(Some),
                    (true, Some(postgres)) => {
                        Conductor::start_on_postgres(path, host, Arc::clone(postgres))
                            .await
                            .map(Some)
                    }
                }
            },
            async {
                match (selection.lakefs, &postgres) {
                    (false, _) => Ok(None),
                    (true, None) => LakeFs::start_on(path, host, None, storage).await.map(Some),
                    (true, Some(postgres)) => {
                        LakeFs::start_sharing(path, host, Arc::clone(postgres))
                            .await
                            .map(Some)
                    }
                }
            },
            cluster,
        );
        let (kube, node) = cluster?;
        Ok(Self {
            conductor: conductor?,
            lakefs: lakefs?,
            kube,
            node,
            host,
            dir,
            _janitor: janitor,
            _machine: machine,
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The environment a client needs, as `KEY=value` pairs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(c) = &self.conductor {
            env.push(("CONDUCTOR_SERVER_URL", c.api_url.clone()));
        }
        if let Some(l) = &self.lakefs {
            env.push(("LAKECTL_SERVER_ENDPOINT_URL", l.endpoint.clone()));
            env.push((
                "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
                LAKEFS_ACCESS_KEY_ID.to_owned(),
            ));
            env.push((
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                LAKEFS_SECRET_ACCESS_KEY.to_owned(),
            ));
            if l.object_store.is_some() {
                env.push(("PERAGO_LAKEFS_OBJECT_STORE_HOSTS", l.object_store_hosts()));
            }
        }
        if let Some(k) = &self.kube {
            env.push(("KUBECONFIG", k.kubeconfig.display().to_string()));
        }
        env
    }

    pub fn conductor(&self) -> &Conductor {
        self.conductor.as_ref().expect("Conductor was not selected")
    }

    pub fn lakefs(&self) -> &LakeFs {
        self.lakefs.as_ref().expect("lakeFS was not selected")
    }

    pub fn kube(&self) -> &Kube {
        self.kube.as_ref().expect("kube-apiserver was not selected")
    }

    pub fn node(&self) -> &Node {
        self.node.as_ref().expect("the node was not selected")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_names_its_servers_and_lakefs_storage() {
        let s = Selection::parse("conductor, s3").unwrap();
        assert!(s.conductor && s.lakefs && !s.kube && !s.node);
        assert_eq!(s.storage, Storage::PostgresS3);
        let s = Selection::parse("all").unwrap();
        assert!(s.node && s.kube && s.lakefs);
        assert_eq!(s.storage, Storage::Embedded);
        assert!(
            Selection::parse("lakefs,minio")
                .unwrap_err()
                .to_string()
                .contains("unknown service 'minio'")
        );
    }
}
