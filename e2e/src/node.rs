//! A real single-node Kubernetes for the tests and the demo: containerd (built from its module
//! by `e2e/bin/obtain`, running Debian's runc) with a run-private root, state and socket; the
//! controller-manager and the scheduler; a kubelet; kube-proxy, so pods reach the apiserver
//! through the `kubernetes` Service as in any cluster; and a bridge pod network that exists
//! only on this machine.
//!
//! The bridge, the iptables chains, the sysctls and the `kubepods` cgroups are machine-wide,
//! so there is one node per machine at a time: [`claim_machine`] takes a lock that
//! `e2e/bin/node-janitor` holds until it has undone everything the node did, however its owner
//! exits. ADR 0007 says why it is built this way; each unusual setting says why beside it.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node as NodeObject, ServiceAccount};

use crate::pki::{Authority, Usage};
use crate::process::{Restartable, ServerProcess, bin_dir, free_port, obtain, wait_ready};
use crate::registry::{Registry, Release};

/// The pod network's bridge, made by the harness; its address is where pods reach the servers.
pub const BRIDGE: &str = "perago0";
pub const BRIDGE_IP: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 1);
pub const POD_SUBNET: &str = "10.203.0.0/16";
/// Cluster IPs of Services; the first is the `kubernetes` Service.
pub const SERVICE_RANGE: &str = "10.204.0.0/24";
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 204, 0, 1);
pub const NODE_NAME: &str = "perago-e2e-node";
/// The machine-wide lock of the one node; a file in /run, so a reboot clears it.
const LOCK: &str = "/run/perago-e2e-node.lock";
/// How long to wait for another run's node (and its clean-up) to finish.
const LOCK_WAIT: Duration = Duration::from_secs(20 * 60);

/// The test images the node's containerd holds, by the name tests use (the project's own
/// images are pulled from the release in the node's registry: `crate::registry`).
pub const PAUSE_IMAGE: &str = "localhost/perago/pause:e2e";
pub const BUSYBOX_BODY_IMAGE: &str = "localhost/perago/body-busybox:e2e";
pub const COMPILED_BODY_IMAGE: &str = "localhost/perago/body-compiled:e2e";

/// This machine, claimed for one node: the lock is held (by this process and by the node's
/// janitor) and the bridge exists.
pub struct Machine {
    _lock: File,
    _janitor: Child,
}

/// Check the host can run a node, take the machine's node lock, remove what an earlier node
/// left behind, start the janitor that undoes this one, and make the pod network's bridge.
pub fn claim_machine(dir: &Path) -> Result<Machine> {
    check_host()?;
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .read(true)
        .open(LOCK)
        .with_context(|| format!("opening the node lock {LOCK}"))?;
    let started = Instant::now();
    let mut told = false;
    loop {
        match lock.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(LOCK).unwrap_or_default();
                if !told {
                    eprintln!(
                        "[e2e] waiting for the node of another run to stop ({LOCK} held by pid {})",
                        holder.trim()
                    );
                    told = true;
                }
                if started.elapsed() > LOCK_WAIT {
                    bail!(
                        "another run's node still holds {LOCK} (pid {}) after {LOCK_WAIT:?}; one \
                         node runs per machine",
                        holder.trim()
                    );
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {LOCK}"));
            }
        }
    }
    if told {
        eprintln!(
            "[e2e] the node of the other run stopped {:.1?} later",
            started.elapsed()
        );
    }
    std::fs::write(LOCK, format!("{}\n", std::process::id()))?;
    let janitor = bin_dir().join("node-janitor");
    run(
        Command::new(&janitor).arg("--sweep"),
        "removing an earlier node's leftovers",
    )?;
    run(
        Command::new(&janitor).arg("--record").arg(dir),
        "recording the machine's state",
    )?;
    // The janitor inherits the lock as its standard input: the open file keeps the lock held
    // after this process is gone, until the janitor has cleaned up and exits.
    let janitor = Command::new(&janitor)
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(lock.try_clone()?)
        .stdout(Stdio::null())
        .stderr(File::create(dir.join("node-janitor.log"))?)
        .process_group(0)
        .spawn()
        .context("starting the node janitor")?;
    let cidr = format!("{BRIDGE_IP}/16");
    run(
        Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"]),
        "creating the pod bridge",
    )?;
    run(
        Command::new("ip").args(["addr", "add", &cidr, "dev", BRIDGE]),
        "addressing the pod bridge",
    )?;
    run(
        Command::new("ip").args(["link", "set", BRIDGE, "up"]),
        "bringing the pod bridge up",
    )?;
    Ok(Machine {
        _lock: lock,
        _janitor: janitor,
    })
}

/// A host that cannot run the node fails here with what is missing, never with a skip.
fn check_host() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the node needs root (containerd, the kubelet, a bridge and iptables rules)");
    }
    // containerd itself is built from its module (e2e/bin/obtain); runc is Debian's.
    for (tool, package) in [
        ("runc", "runc"),
        ("iptables", "iptables"),
        ("ip", "iproute2"),
        ("umoci", "umoci"),
    ] {
        if which(tool).is_none() {
            bail!("the node needs `{tool}` on PATH: install the Debian package {package}");
        }
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        if !Path::new("/usr/lib/cni").join(plugin).exists() {
            bail!(
                "the node needs the CNI plugin /usr/lib/cni/{plugin}: install the Debian package \
                 containernetworking-plugins"
            );
        }
    }
    if !Path::new("/sys/fs/cgroup/memory").is_dir()
        && !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
    {
        bail!("the node needs cgroups with the memory controller under /sys/fs/cgroup");
    }
    Ok(())
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

fn run(command: &mut Command, what: &str) -> Result<()> {
    let out = command
        .output()
        .with_context(|| format!("{what}: running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{what}: {command:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(())
}

/// containerd with everything it keeps inside the run's directory, the test images imported,
/// and pulling from the harness's registry over plain HTTP.
pub struct Containerd {
    pub socket: PathBuf,
    process: Restartable,
    log: PathBuf,
}

impl Containerd {
    /// Start containerd again after [`Node::restart`] stopped it.
    async fn start_again(&self) -> Result<()> {
        self.process
            .start(async |mut command| {
                spawn_containerd(&mut command, self.log.clone(), &self.socket).await
            })
            .await
    }

    /// Kill containerd alone at once (SIGKILL), leave it down for `down`, and start it again
    /// on the same state; the shims and the containers they run keep running, as they do
    /// when a node's containerd restarts.
    pub async fn crash_and_restart(&self, down: Duration) -> Result<()> {
        self.process
            .crash_alone_and_restart(down, async |mut command| {
                let started = Instant::now();
                let process =
                    spawn_containerd(&mut command, self.log.clone(), &self.socket).await?;
                eprintln!("[e2e] containerd restarted in {:.1?}", started.elapsed());
                Ok(process)
            })
            .await
    }

    /// Import OCI archives (`e2e/bin/images`) as the images they name, the way a node is
    /// side-loaded, and check containerd lists each.
    pub fn import(&self, images: &[(String, PathBuf)]) -> Result<()> {
        for (reference, archive) in images {
            let archive = archive.to_string_lossy();
            ctr(&self.socket, &["images", "import", "--no-unpack", &archive])
                .with_context(|| format!("importing {reference} from {archive}"))?;
        }
        let listed = ctr(&self.socket, &["images", "ls", "-q"])?;
        for (reference, _) in images {
            if !listed.lines().any(|l| l == reference) {
                bail!("containerd does not list {reference} after its import; it lists:\n{listed}");
            }
        }
        Ok(())
    }

    pub async fn start(dir: &Path, images: &[(String, PathBuf)], registry: &str) -> Result<Self> {
        let home = dir.join("containerd");
        // The registry's hosts.toml: containerd reaches it over plain HTTP, as it would a
        // platform team's mirror configured the same way.
        let hosts = home.join("certs.d").join(registry);
        std::fs::create_dir_all(&hosts)?;
        std::fs::write(
            hosts.join("hosts.toml"),
            format!(
                "server = \"http://{registry}\"\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )?;
        let cni = dir.join("cni");
        std::fs::create_dir_all(cni.join("net.d"))?;
        std::fs::create_dir_all(&home)?;
        let socket = home.join("containerd.sock");
        let config = home.join("config.toml");
        std::fs::write(
            &config,
            format!(
                r#"# containerd 2.3's own version, read as written (an older one is migrated at each start).
version = 4
root = "{home}/root"
state = "{home}/state"
[plugins.'io.containerd.server.v1.grpc']
  address = "{socket}"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "{home}/ttrpc.sock"
[plugins.'io.containerd.internal.v1.opt']
  path = "{home}/opt"
# The node runs no NRI plugins; enabled, NRI would listen on a machine-wide socket in /var/run/nri.
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{home}/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  # These machines drop CAP_SYS_RESOURCE from every bounding set: runc cannot lower
  # oom_score_adj, and without this every sandbox fails with "can't get final child's PID".
  restrict_oom_score_adj = true
  disable_apparmor = true
  # Pod network namespaces live in the run's directory, so clean-up finds them.
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{home}/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni}/net.d"
"#,
                home = home.display(),
                socket = socket.display(),
                cni = cni.display(),
            ),
        )?;
        // The bridge plugin attaches pods to the harness's bridge; the gateway address is the
        // bridge's own, set by the harness (isGateway false), and the one route pods get
        // beyond their subnet is to the Service range, which kube-proxy serves on this host.
        std::fs::write(
            cni.join("net.d/10-perago.conflist"),
            serde_json::to_string_pretty(&serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "perago-e2e",
                "plugins": [{
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": false,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": cni.join("ipam"),
                        "ranges": [[{
                            "subnet": POD_SUBNET,
                            "rangeStart": "10.203.1.1",
                            "gateway": BRIDGE_IP.to_string(),
                        }]],
                        // Services, and the simulated pods of a fleet (crate::fleet), whose
                        // addresses this machine answers for.
                        "routes": [
                            {"dst": SERVICE_RANGE, "gw": BRIDGE_IP.to_string()},
                            {"dst": crate::fleet::POD_CIDR, "gw": BRIDGE_IP.to_string()},
                        ],
                    },
                }],
            }))?,
        )?;
        let bin = containerd_dir()?;
        let mut cmd = Command::new(bin.join("containerd"));
        cmd.arg("--config").arg(&config);
        // containerd looks for its runc shim on PATH before beside itself: the build's own
        // shim goes first, ahead of any a distribution's containerd put in /usr/bin.
        let path = std::env::var_os("PATH").unwrap_or_default();
        cmd.env(
            "PATH",
            std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path)))?,
        );
        let log = dir.join("containerd.log");
        let process = spawn_containerd(&mut cmd, log.clone(), &socket).await?;
        let started = Instant::now();
        let containerd = Self {
            socket,
            process: Restartable::running(cmd, process),
            log,
        };
        containerd.import(images)?;
        eprintln!(
            "[e2e] containerd ready, {} images imported in {:.1?}",
            images.len(),
            started.elapsed()
        );
        Ok(containerd)
    }
}

/// Start containerd and wait until it answers on `socket`.
async fn spawn_containerd(
    command: &mut Command,
    log: PathBuf,
    socket: &Path,
) -> Result<ServerProcess> {
    let mut process = ServerProcess::spawn("containerd", command, log)?;
    wait_ready(&mut process, Duration::from_secs(30), || {
        let socket = socket.to_owned();
        async move { ctr(&socket, &["version"]).is_ok() }
    })
    .await?;
    Ok(process)
}

/// The directory of the node's containerd build (`e2e/bin/obtain containerd`): `containerd`,
/// `ctr` and the runc shim.
fn containerd_dir() -> Result<PathBuf> {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir.clone());
    }
    let containerd = obtain("containerd")?;
    let dir = containerd
        .parent()
        .with_context(|| format!("{} has no directory", containerd.display()))?;
    Ok(DIR.get_or_init(|| dir.to_owned()).clone())
}

/// `ctr --address <socket> -n k8s.io <args>` of the node's containerd build, its standard output.
pub fn ctr(socket: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(containerd_dir()?.join("ctr"))
        .arg("--address")
        .arg(socket)
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .context("running ctr")?;
    if !out.status.success() {
        bail!(
            "ctr {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Assemble the test images (`e2e/bin/images`: the pod sandbox and the task bodies).
pub fn build_images(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    images(dir, "e2e", &[])
}

/// The body image of this machine's Python, with the reference Python's packages (Python
/// Perago and its dependencies) and perago-k8s, built into `dir`: its reference and archive.
pub fn build_python_body_image(dir: &Path) -> Result<(String, PathBuf)> {
    let python = crate::process::obtain("perago-python")?;
    let venv = python
        .parent()
        .and_then(Path::parent)
        .context("the reference Python is not in a venv's bin/")?;
    images(dir, "python", &[("PYTHON_VENV", venv)])?
        .pop()
        .context("e2e/bin/images made no body-python image")
}

/// `e2e/bin/images` with `IMAGE_SET=set` into `dir/images`: each image's reference and archive.
fn images(dir: &Path, set: &str, env: &[(&str, &Path)]) -> Result<Vec<(String, PathBuf)>> {
    let out = dir.join("images");
    let started = Instant::now();
    let output = Command::new(bin_dir().join("images"))
        .env("IMAGE_SET", set)
        .envs(env.iter().copied())
        .arg(dir)
        .arg(&out)
        .stderr(Stdio::inherit())
        .output()
        .context("running e2e/bin/images")?;
    if !output.status.success() {
        bail!(
            "e2e/bin/images failed ({}; see its output above)",
            output.status
        );
    }
    let images: Vec<(String, PathBuf)> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(r, p)| (r.to_owned(), PathBuf::from(p)))
        .collect();
    eprintln!(
        "[e2e] {} images assembled in {:.1?}",
        images.len(),
        started.elapsed()
    );
    Ok(images)
}

/// The node's certificates, made by the apiserver's start.
pub struct NodePki {
    pub authority: Authority,
    pub service_account: crate::pki::Pair,
}

impl NodePki {
    pub fn create(dir: &Path) -> Result<Self> {
        let authority = Authority::create(dir)?;
        let service_account = authority.key_pair("service-account")?;
        Ok(Self {
            authority,
            service_account,
        })
    }
}

/// Writes a kubeconfig for a component: (file name, user, group) → its path.
type KubeconfigFor<'a> = &'a dyn Fn(&str, &str, Option<&str>) -> Result<PathBuf>;

/// The node's processes beside the apiserver.
pub struct Node {
    _controller_manager: ServerProcess,
    _scheduler: ServerProcess,
    kubelet: Restartable,
    /// The kubelet's health endpoint and log, to start it again.
    kubelet_healthz: String,
    kubelet_log: PathBuf,
    _proxy: ServerProcess,
    pub containerd: Containerd,
    /// The registry the node pulls the project's images from, and the release pushed to it.
    pub registry: Registry,
    pub release: Release,
}

/// A disk of the node's own: an ext4 file system in a file of the run's directory, mounted
/// (loop) as the kubelet's root, where the pods' emptyDirs live. The kubelet evicts pods once
/// less than half of it is free, so a test fills it past that without the host's disk ever
/// being short. The node's janitor unmounts it with the rest of the run's mounts, which frees
/// the loop device.
pub struct NodeDisk {
    mib: u32,
}

impl NodeDisk {
    /// The kubelet's soft eviction threshold, in MiB free.
    pub fn threshold_mib(mib: u32) -> u32 {
        mib / 2
    }

    fn mount(home: &Path, root: &Path, mib: u32) -> Result<Self> {
        let image = home.join("kubelet-disk.img");
        let file = std::fs::File::create(&image)?;
        file.set_len(u64::from(mib) << 20)?;
        drop(file);
        let what = "the node's own disk (loop devices and mkfs.ext4)";
        run(
            Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image),
            what,
        )?;
        run(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(root),
            what,
        )?;
        Ok(Self { mib })
    }

    /// The kubelet's settings for it: soft eviction at half of it free, pods given up to 60 s
    /// to stop, usage measured every 10 s, and the pressure lifted 10 s after it ends.
    fn eviction(&self) -> String {
        let threshold = Self::threshold_mib(self.mib);
        format!(
            "evictionSoft: {{nodefs.available: \"{threshold}Mi\"}}\n\
             evictionSoftGracePeriod: {{nodefs.available: \"1s\"}}\n\
             evictionMaxPodGracePeriod: 60\n\
             evictionPressureTransitionPeriod: 10s\n\
             volumeStatsAggPeriod: 10s\n"
        )
    }
}

impl Node {
    /// Start the rest of the cluster on `apiserver` (reachable on the bridge address) and wait
    /// until the node is Ready, the `default` ServiceAccount exists and `release` (being
    /// pushed to `registry` meanwhile) is there.
    pub async fn start(
        dir: &Path,
        pki: &NodePki,
        (apiserver, client): (&str, kube::Client),
        containerd: Containerd,
        (registry, release): (Registry, impl std::future::Future<Output = Result<Release>>),
        disk_mib: Option<u32>,
    ) -> Result<Self> {
        let started = Instant::now();
        let home = dir.join("node");
        std::fs::create_dir_all(&home)?;
        let ca = &pki.authority;
        let kubeconfig = |name: &str, cn: &str, org: Option<&str>| -> Result<PathBuf> {
            let pair = ca.issue(name, cn, &Usage::Client { org })?;
            let path = home.join(format!("{name}.kubeconfig"));
            ca.kubeconfig(&path, apiserver, &pair)?;
            Ok(path)
        };

        let port = free_port()?;
        let mut cmd = Command::new(obtain("kube-controller-manager")?);
        cmd.arg(format!(
            "--kubeconfig={}",
            kubeconfig("controller-manager", "system:kube-controller-manager", None)?.display()
        ))
        .args(["--bind-address=127.0.0.1", "--leader-elect=false", "--v=1"])
        .arg(format!("--secure-port={port}"))
        .arg(format!(
            "--cert-dir={}",
            home.join("controller-manager").display()
        ))
        // Each controller acts as its own ServiceAccount, as in a real cluster, so RBAC
        // applies to what it does.
        .arg("--use-service-account-credentials")
        .arg(format!(
            "--service-account-private-key-file={}",
            pki.service_account.key.display()
        ))
        .arg(format!("--root-ca-file={}", ca.cert.display()))
        .arg(format!("--cluster-signing-cert-file={}", ca.cert.display()))
        .arg(format!("--cluster-signing-key-file={}", ca.key.display()))
        .arg(format!("--service-cluster-ip-range={SERVICE_RANGE}"))
        .arg("--allocate-node-cidrs=false");
        // The controllers' request rate (default 20 per second each, as in kubeadm): what
        // bounds how fast hundreds of new Deployments are observed (the operator benchmark).
        if let Some(qps) = controller_manager_qps() {
            cmd.arg(format!("--kube-api-qps={qps}"))
                .arg(format!("--kube-api-burst={}", qps.saturating_mul(2)));
        }
        let mut controller_manager = ServerProcess::spawn(
            "kube-controller-manager",
            &mut cmd,
            dir.join("kube-controller-manager.log"),
        )?;
        let healthz = format!("https://127.0.0.1:{port}/healthz");
        wait_healthy(&mut controller_manager, &healthz, Duration::from_secs(60)).await?;

        let port = free_port()?;
        let mut cmd = Command::new(obtain("kube-scheduler")?);
        cmd.arg(format!(
            "--kubeconfig={}",
            kubeconfig("scheduler", "system:kube-scheduler", None)?.display()
        ))
        .args(["--bind-address=127.0.0.1", "--leader-elect=false", "--v=1"])
        .arg(format!("--secure-port={port}"))
        .arg(format!("--cert-dir={}", home.join("scheduler").display()));
        // The same setting raises the scheduler's request rate (50 per second by default),
        // which bounds how fast thousands of pods are bound (the fleet benchmark).
        if let Some(qps) = controller_manager_qps() {
            cmd.arg(format!("--kube-api-qps={qps}"))
                .arg(format!("--kube-api-burst={}", qps.saturating_mul(2)));
        }
        let mut scheduler =
            ServerProcess::spawn("kube-scheduler", &mut cmd, dir.join("kube-scheduler.log"))?;
        let healthz = format!("https://127.0.0.1:{port}/healthz");
        wait_healthy(&mut scheduler, &healthz, Duration::from_secs(60)).await?;

        let (kubelet, kubelet_healthz) =
            Self::start_kubelet(dir, &home, pki, &containerd, &kubeconfig, disk_mib).await?;
        let proxy = Self::start_proxy(dir, &home, &kubeconfig).await?;

        // The versions the node reports, so a run's log says which Kubernetes and runtime it ran.
        let versions = wait_for_api(Duration::from_secs(60), "the node to be Ready", || {
            let client = client.clone();
            async move {
                let nodes: kube::Api<NodeObject> = kube::Api::all(client);
                let status = nodes.get_opt(NODE_NAME).await.ok().flatten()?.status?;
                let ready = status
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let info = status.node_info?;
                ready.then(|| {
                    format!(
                        "kubelet {}, {}",
                        info.kubelet_version, info.container_runtime_version
                    )
                })
            }
        })
        .await
        .with_context(|| tail(&dir.join("kubelet.log")))?;
        wait_for_api(
            Duration::from_secs(60),
            "the default ServiceAccount",
            || {
                let client = client.clone();
                async move {
                    let accounts: kube::Api<ServiceAccount> =
                        kube::Api::namespaced(client, "default");
                    accounts.get_opt("default").await.ok().flatten().map(|_| ())
                }
            },
        )
        .await
        .with_context(|| tail(&dir.join("kube-controller-manager.log")))?;
        eprintln!(
            "[e2e] node {NODE_NAME} Ready in {:.1?} ({versions})",
            started.elapsed()
        );
        let release = release.await?;
        Ok(Self {
            _controller_manager: controller_manager,
            _scheduler: scheduler,
            kubelet,
            kubelet_healthz,
            kubelet_log: dir.join("kubelet.log"),
            _proxy: proxy,
            containerd,
            registry,
            release,
        })
    }

    async fn start_kubelet(
        dir: &Path,
        home: &Path,
        pki: &NodePki,
        containerd: &Containerd,
        kubeconfig: KubeconfigFor<'_>,
        disk_mib: Option<u32>,
    ) -> Result<(Restartable, String)> {
        let ca = &pki.authority;
        let serving = ca.issue(
            "kubelet-serving",
            NODE_NAME,
            &Usage::Server {
                names: &[NODE_NAME],
                addresses: &[IpAddr::V4(BRIDGE_IP)],
            },
        )?;
        let root = home.join("kubelet");
        std::fs::create_dir_all(&root)?;
        let disk = match disk_mib {
            Some(mib) => NodeDisk::mount(home, &root, mib)?.eviction(),
            None => String::new(),
        };
        let (port, healthz_port) = (free_port()?, free_port()?);
        let config = home.join("kubelet.yaml");
        std::fs::write(
            &config,
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# 1.35 refuses cgroup v1 hosts unless told; these machines have the v1 hierarchy.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
address: {BRIDGE_IP}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: Webhook
# Local images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# No cluster DNS: pods get the host's resolver only with dnsPolicy Default.
resolvConf: ""
podLogsDir: {logs}
volumePluginDir: {plugins}
# A shared build machine's disk and memory are not this node's to guard.
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
{disk}serializeImagePulls: false
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
"#,
                socket = containerd.socket.display(),
                cert = serving.cert.display(),
                key = serving.key.display(),
                ca = ca.cert.display(),
                logs = home.join("pod-logs").display(),
                plugins = home.join("volume-plugins").display(),
            ),
        )?;
        let mut cmd = Command::new(obtain("kubelet")?);
        cmd.arg(format!("--config={}", config.display()))
            .arg(format!(
                "--kubeconfig={}",
                kubeconfig(
                    "kubelet",
                    &format!("system:node:{NODE_NAME}"),
                    Some("system:nodes")
                )?
                .display()
            ))
            .arg(format!("--root-dir={}", root.display()))
            .arg(format!("--cert-dir={}", home.join("kubelet-pki").display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            // The kubelet refuses a loopback node address; the bridge's is the node's.
            .arg(format!("--node-ip={BRIDGE_IP}"))
            .arg("--v=1");
        let healthz = format!("http://127.0.0.1:{healthz_port}/healthz");
        let kubelet = spawn_kubelet(&mut cmd, dir.join("kubelet.log"), &healthz).await?;
        Ok((Restartable::running(cmd, kubelet), healthz))
    }

    /// The node restarted: the kubelet and containerd killed (SIGKILL) and every container
    /// with them, down for `down`, then containerd and the kubelet started again on the same
    /// state, as after a power cut. The kubelet then starts every pod's containers again in new
    /// sandboxes; what the pods kept on the node's disk (their emptyDirs) is still there.
    /// kube-proxy keeps running: its rules would be made again the same.
    pub async fn restart(&self, down: Duration) -> Result<()> {
        self.kubelet.crash().await?;
        self.containerd.process.crash_alone().await?;
        // Every container goes with its shim, unseen by containerd: the shims of this node's
        // containerd and everything below them.
        let address = format!("-address\0{}\0", self.containerd.socket.display());
        for shim in crate::measure::processes("containerd-shim") {
            let cmdline = std::fs::read(format!("/proc/{shim}/cmdline")).unwrap_or_default();
            if !String::from_utf8_lossy(&cmdline).contains(&address) {
                continue;
            }
            for pid in crate::measure::ProcessTree::new(shim).members() {
                let pid = nix::unistd::Pid::from_raw(pid as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        tokio::time::sleep(down).await;
        let started = Instant::now();
        self.containerd.start_again().await?;
        self.kubelet
            .start(async |mut command| {
                spawn_kubelet(
                    &mut command,
                    self.kubelet_log.clone(),
                    &self.kubelet_healthz,
                )
                .await
            })
            .await?;
        eprintln!(
            "[e2e] node restarted (containerd and the kubelet) in {:.1?}",
            started.elapsed()
        );
        Ok(())
    }

    /// Kill the kubelet at once (SIGKILL), leave it down for `down`, and start it again on
    /// the same state; waits until it is healthy. The pods' containers keep running.
    pub async fn crash_and_restart_kubelet(&self, down: Duration) -> Result<()> {
        self.kubelet
            .crash_and_restart(down, async |mut command| {
                let started = Instant::now();
                let kubelet = spawn_kubelet(
                    &mut command,
                    self.kubelet_log.clone(),
                    &self.kubelet_healthz,
                )
                .await?;
                eprintln!("[e2e] kubelet restarted in {:.1?}", started.elapsed());
                Ok(kubelet)
            })
            .await
    }

    async fn start_proxy(
        dir: &Path,
        home: &Path,
        kubeconfig: KubeconfigFor<'_>,
    ) -> Result<ServerProcess> {
        let (healthz_port, metrics_port) = (free_port()?, free_port()?);
        let config = home.join("kube-proxy.yaml");
        std::fs::write(
            &config,
            format!(
                r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {NODE_NAME}
bindAddress: {BRIDGE_IP}
healthzBindAddress: 127.0.0.1:{healthz_port}
metricsBindAddress: 127.0.0.1:{metrics_port}
mode: iptables
clusterCIDR: {POD_SUBNET}
# Leave the machine's conntrack settings alone.
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
# NodePorts on loopback would need route_localnet; NodePorts serve the bridge address only.
iptables: {{localhostNodePorts: false}}
nodePortAddresses: ["{BRIDGE_IP}/32"]
"#,
                kubeconfig = kubeconfig("kube-proxy", "system:kube-proxy", None)?.display(),
            ),
        )?;
        let mut cmd = Command::new(obtain("kube-proxy")?);
        cmd.arg(format!("--config={}", config.display()))
            .arg("--v=1");
        let mut proxy = ServerProcess::spawn("kube-proxy", &mut cmd, dir.join("kube-proxy.log"))?;
        let healthz = format!("http://127.0.0.1:{healthz_port}/healthz");
        wait_healthy(&mut proxy, &healthz, Duration::from_secs(60)).await?;
        Ok(proxy)
    }
}

/// Start the kubelet and wait until it is healthy. A kubelet that exits during start-up is
/// started again after a pause, as systemd restarts a node's kubelet: it exits when
/// containerd answers but its CRI service is not initialized yet, which after a whole-node
/// restart (every container killed) can take a few seconds longer than containerd's API.
async fn spawn_kubelet(
    command: &mut Command,
    log: PathBuf,
    healthz: &str,
) -> Result<ServerProcess> {
    const STARTS: u32 = 5;
    let mut start = 1;
    loop {
        let mut kubelet = ServerProcess::spawn("kubelet", command, log.clone())?;
        match wait_healthy(&mut kubelet, healthz, Duration::from_secs(60)).await {
            Ok(()) => return Ok(kubelet),
            Err(e) if start < STARTS && kubelet.ensure_running().is_err() => {
                let why = format!("{e:#}");
                let why = why.lines().rev().find(|l| l.contains("command failed"));
                eprintln!(
                    "[e2e] the kubelet exited during start-up ({}); starting it again in 2 s",
                    why.unwrap_or("see its log")
                );
                tokio::time::sleep(Duration::from_secs(2)).await;
                start += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn wait_healthy(server: &mut ServerProcess, url: &str, limit: Duration) -> Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .danger_accept_invalid_certs(true)
        .build()?;
    wait_ready(server, limit, || {
        let request = client.get(url);
        async move { request.send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await?;
    Ok(())
}

/// Poll an API condition until it holds.
/// `PERAGO_E2E_CONTROLLER_MANAGER_QPS`: the controller-manager's and the scheduler's request
/// rate, when set.
fn controller_manager_qps() -> Option<u32> {
    std::env::var("PERAGO_E2E_CONTROLLER_MANAGER_QPS")
        .ok()
        .and_then(|v| v.parse().ok())
}

async fn wait_for_api<T, F, Fut>(limit: Duration, what: &str, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        if started.elapsed() > limit {
            bail!("waited {limit:?} for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "last lines of {}:\n{}",
        log.display(),
        lines[lines.len().saturating_sub(30)..].join("\n")
    )
}
