//! The sidecar's settings: flags, each also read from its environment variable (the operator
//! sets the variables). Every default lives here and is passed down explicitly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::openlineage::OpenLineageConfig;
use crate::otlp::OtlpConfig;
use crate::trace::TraceConfig;
use perago_conductor::Credentials;
use perago_conductor::flags::ConductorFlags;
use perago_contract::setting::given;
use perago_contract::trust::Tls;
use perago_lakefs::direct::{DataPath, ObjectStoreHosts};
use perago_lakefs::flags::LakeFsFlags;

#[derive(Args, Debug, Clone)]
pub struct Settings {
    /// The task contract rendered by the operator.
    #[arg(
        long,
        env = "PERAGO_TASK_CONTRACT",
        default_value = "/etc/perago/contract.json"
    )]
    pub contract: PathBuf,
    /// The shared work volume: the runner socket and the execution directories.
    #[arg(long, env = "PERAGO_WORK_DIR", default_value = "/perago-work")]
    pub work_dir: PathBuf,
    #[command(flatten)]
    pub conductor: ConductorFlags,
    /// The task domain to poll: only work that workflows route to it with `taskToDomain`.
    #[arg(long, env = "CONDUCTOR_WORKER_DOMAIN")]
    pub conductor_domain: Option<String>,
    /// Per-request timeout of Conductor calls (seconds).
    #[arg(long, env = "PERAGO_CONDUCTOR_TIMEOUT_SECONDS", default_value_t = 10)]
    pub conductor_timeout_seconds: u64,
    /// Prefix of the Conductor-visible worker id (ASCII letters and digits).
    #[arg(long, env = "PERAGO_WORKER_ID_PREFIX")]
    pub worker_id_prefix: Option<String>,
    /// The pod's name (downward API); the host name when unset.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The pod's annotations as a downward-API volume projects them: the body image id the
    /// operator writes there goes into each publication's lineage (ADR 0042).
    #[arg(long, env = "PERAGO_POD_ANNOTATIONS")]
    pub pod_annotations: Option<PathBuf>,
    /// The PeragoTask this pod runs, for each publication's lineage: its namespace, …
    #[arg(long, env = "PERAGO_TASK_NAMESPACE")]
    pub task_namespace: Option<String>,
    /// … its name, …
    #[arg(long, env = "PERAGO_TASK_NAME")]
    pub task_name: Option<String>,
    /// … its uid, …
    #[arg(long, env = "PERAGO_TASK_UID")]
    pub task_uid: Option<String>,
    /// … and the generation of its spec that introduced this pod's template.
    #[arg(long, env = "PERAGO_TASK_GENERATION")]
    pub task_generation: Option<i64>,
    /// The body image as the task names it.
    #[arg(long, env = "PERAGO_BODY_IMAGE")]
    pub body_image: Option<String>,
    /// Longest failure reason sent to Conductor, in characters.
    #[arg(long, env = "PERAGO_FAILURE_REASON_MAX_LENGTH", default_value = "500")]
    pub failure_reason_max_length: String,
    /// Server-side long poll of each batch poll (milliseconds, at most 5000).
    #[arg(long, env = "PERAGO_POLL_TIMEOUT_MS", default_value_t = 100)]
    pub poll_timeout_ms: u64,
    /// Longest pause between polls while the queue is empty (milliseconds).
    #[arg(long, env = "PERAGO_POLL_INTERVAL_MS", default_value_t = 100)]
    pub poll_interval_ms: u64,
    /// How long in-flight attempts may run after SIGTERM before they are given up (seconds).
    #[arg(long, env = "PERAGO_SHUTDOWN_GRACE_SECONDS", default_value_t = 30)]
    pub shutdown_grace_seconds: u64,
    /// lakeFS (workspace tasks).
    #[command(flatten)]
    pub lakefs: LakeFsFlags,
    /// Per-request timeout of lakeFS calls other than transfers and the merge (seconds).
    #[arg(long, env = "PERAGO_LAKEFS_TIMEOUT_SECONDS", default_value_t = 30)]
    pub lakefs_timeout_seconds: u64,
    /// How object bytes travel: straight to and from the object store through URLs lakeFS
    /// presigns (`presigned`), through lakeFS (`proxied`), or presigned when lakeFS can and
    /// object store hosts are given (`auto`).
    #[arg(long, env = "PERAGO_LAKEFS_DATA_PATH", value_enum, default_value_t = DataPath::Auto)]
    pub lakefs_data_path: DataPath,
    /// The hosts presigned URLs may point at: `host`, `host:port`, `*.suffix`, comma-separated.
    #[arg(long, env = "PERAGO_LAKEFS_OBJECT_STORE_HOSTS")]
    pub lakefs_object_store_hosts: Option<String>,
    /// Timeout of one object download or upload (seconds).
    #[arg(long, env = "PERAGO_TRANSFER_TIMEOUT_SECONDS", default_value_t = 900)]
    pub transfer_timeout_seconds: u64,
    /// Objects transferred at once.
    #[arg(long, env = "PERAGO_TRANSFER_PARALLELISM", default_value_t = 16)]
    pub transfer_parallelism: usize,
    /// Timeout of the merge when the task has no publish budget (seconds).
    #[arg(long, env = "PERAGO_MERGE_TIMEOUT_SECONDS", default_value_t = 300)]
    pub merge_timeout_seconds: u64,
    /// How often the repositories this sidecar wrote to are swept for staging branches of its
    /// task type whose attempt can no longer publish (seconds; 0 turns the sweep off).
    #[arg(long, env = "PERAGO_STAGING_SWEEP_SECONDS", default_value_t = 600)]
    pub staging_sweep_seconds: u64,
    /// A staging branch whose task Conductor no longer has is swept once its head is this old
    /// (seconds).
    #[arg(
        long,
        env = "PERAGO_STAGING_GONE_AFTER_SECONDS",
        default_value_t = 86_400
    )]
    pub staging_gone_after_seconds: u64,
    /// Testing only: exit abruptly at a crash point (`exit-after-body`, `exit-after-stage`,
    /// `exit-after-merge`) to prove what a crash there leaves behind, or hold before the merge
    /// (`pause-before-merge`) until the file `paused-before-merge` in the work directory is
    /// removed.
    #[arg(long, env = "PERAGO_FAULT", hide = true)]
    pub fault: Option<String>,
    /// Where each attempt's OpenLineage run events are POSTed (an `http://` or `https://`
    /// URL, used as given); unset: none are sent (ADR 0043).
    #[arg(long, env = "PERAGO_OPENLINEAGE_URL")]
    pub openlineage_url: Option<String>,
    /// The namespace of the events' jobs (default: `PERAGO_TASK_NAMESPACE`, else `default`).
    #[arg(long, env = "PERAGO_OPENLINEAGE_NAMESPACE")]
    pub openlineage_namespace: Option<String>,
    /// Longest one run event's request may take (milliseconds).
    #[arg(long, env = "PERAGO_OPENLINEAGE_TIMEOUT_MS", default_value_t = 5000)]
    pub openlineage_timeout_ms: u64,
    /// Run events held at most while they wait to be sent; one that does not fit is dropped.
    #[arg(long, env = "PERAGO_OPENLINEAGE_QUEUE_SIZE", default_value_t = 1024)]
    pub openlineage_queue_size: usize,
    /// Value of the `perago_instance_id` label of `runtime_busy_slots` (default: the pod name).
    #[arg(long, env = "PERAGO_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Metrics, `/healthz` and `/readyz`.
    #[arg(long, env = "PERAGO_HTTP_ADDR", default_value = "0.0.0.0:9464")]
    pub http_addr: SocketAddr,
    /// Threads of the async runtime. 1 runs the sidecar on one thread, which costs the
    /// fewest thread wake-ups per attempt; 0 means one per CPU (ADR 0014). Filesystem walks,
    /// hashing and large removals run on the blocking pool either way.
    #[arg(long, env = "PERAGO_RUNTIME_THREADS", default_value_t = 1)]
    pub runtime_threads: usize,
}

impl Settings {
    /// The async runtime these settings ask for.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = match self.runtime_threads {
            1 => tokio::runtime::Builder::new_current_thread(),
            0 => tokio::runtime::Builder::new_multi_thread(),
            n => {
                let mut builder = tokio::runtime::Builder::new_multi_thread();
                builder.worker_threads(n);
                builder
            }
        };
        builder.enable_all().build()
    }
}

/// Testing only: where `PERAGO_FAULT` stops an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPoint {
    /// Exit after the body and the post guardrails.
    ExitAfterBody,
    /// Exit after the try commit.
    ExitAfterStage,
    /// Exit after the merge, before cleanup and the report.
    ExitAfterMerge,
    /// Hold before the merge until `paused-before-merge` in the work directory is removed.
    PauseBeforeMerge,
}

impl FaultPoint {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "exit-after-body" => Self::ExitAfterBody,
            "exit-after-stage" => Self::ExitAfterStage,
            "exit-after-merge" => Self::ExitAfterMerge,
            "pause-before-merge" => Self::PauseBeforeMerge,
            _ => return None,
        })
    }
}

/// Settings checked and turned into the values the runtime uses.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    pub conductor_url: String,
    pub credentials: Option<Credentials>,
    /// Certificate authorities trusted for Conductor beside the built-in and platform roots,
    /// and the client certificate presented to it.
    pub conductor_tls: Tls,
    /// The task domain polled; `None`: the task type's own queue.
    pub domain: Option<String>,
    pub request_timeout: Duration,
    pub worker_id: String,
    pub instance_id: String,
    pub failure_reason_max_length: usize,
    pub poll_wait: Duration,
    pub poll_interval: Duration,
    pub shutdown_grace: Duration,
    /// OTLP export of the task metrics, when `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set.
    pub otlp: Option<OtlpConfig>,
    /// OTLP export of attempt traces, when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.
    pub traces: Option<TraceConfig>,
    /// OpenLineage run events of each attempt, when `PERAGO_OPENLINEAGE_URL` is set.
    pub openlineage: Option<OpenLineageConfig>,
    pub lakefs: Option<LakeFsSettings>,
}

#[derive(Clone)]
pub struct LakeFsSettings {
    pub fault: Option<FaultPoint>,
    pub endpoint: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Certificate authorities trusted for lakeFS beside the built-in and platform roots,
    /// and the client certificate presented to it.
    pub tls: Tls,
    pub timeout: Duration,
    pub transfer_timeout: Duration,
    pub parallelism: usize,
    pub merge_timeout: Duration,
    /// The period of the sweep of dead attempts' staging branches; `None` when off.
    pub staging_sweep: Option<Duration>,
    pub staging_gone_after: Duration,
    pub data_path: DataPath,
    pub object_store_hosts: ObjectStoreHosts,
}

impl std::fmt::Debug for LakeFsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeFsSettings")
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl Settings {
    pub fn check(&self) -> Result<RuntimeSettings, String> {
        let conductor_url = self
            .conductor
            .url()?
            .ok_or("CONDUCTOR_SERVER_URL is required for perago start")?;
        let credentials = self.conductor.auth.credentials()?;
        let conductor_tls = self.conductor.tls()?;
        let domain = given("CONDUCTOR_WORKER_DOMAIN", self.conductor_domain.as_deref())?;
        if let Some(problem) = domain.as_deref().and_then(perago_contract::domain::problem) {
            return Err(format!("CONDUCTOR_WORKER_DOMAIN: {problem}"));
        }
        let prefix = match &self.worker_id_prefix {
            None => None,
            Some(raw) => {
                let p = raw.trim();
                if p.is_empty() {
                    return Err("PERAGO_WORKER_ID_PREFIX must not be empty".into());
                }
                if !p.chars().all(|c| c.is_ascii_alphanumeric()) {
                    return Err(
                        "PERAGO_WORKER_ID_PREFIX must contain only ASCII letters and digits".into(),
                    );
                }
                Some(p.to_owned())
            }
        };
        let max = self.failure_reason_max_length.trim();
        if max.is_empty() || !max.chars().all(|c| c.is_ascii_digit()) {
            return Err("PERAGO_FAILURE_REASON_MAX_LENGTH must be a positive integer".into());
        }
        let fault = match self.fault.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(name) => Some(
                FaultPoint::parse(name)
                    .ok_or_else(|| format!("PERAGO_FAULT '{name}' is not a known crash point"))?,
            ),
        };
        let lakefs = match self.lakefs.access()? {
            None => None,
            Some(access) => {
                if self.transfer_parallelism == 0 {
                    return Err("PERAGO_TRANSFER_PARALLELISM must be greater than zero".into());
                }
                let object_store_hosts = ObjectStoreHosts::parse(
                    self.lakefs_object_store_hosts.as_deref().unwrap_or(""),
                )
                .map_err(|e| format!("PERAGO_LAKEFS_OBJECT_STORE_HOSTS: {e}"))?;
                Some(LakeFsSettings {
                    data_path: self.lakefs_data_path,
                    object_store_hosts,
                    fault,
                    endpoint: access.endpoint,
                    access_key_id: access.access_key_id,
                    secret_access_key: access.secret_access_key,
                    tls: self.lakefs.tls()?,
                    timeout: Duration::from_secs(self.lakefs_timeout_seconds.max(1)),
                    transfer_timeout: Duration::from_secs(self.transfer_timeout_seconds.max(1)),
                    parallelism: self.transfer_parallelism,
                    merge_timeout: Duration::from_secs(self.merge_timeout_seconds.max(1)),
                    staging_sweep: (self.staging_sweep_seconds > 0)
                        .then(|| Duration::from_secs(self.staging_sweep_seconds)),
                    staging_gone_after: Duration::from_secs(self.staging_gone_after_seconds),
                })
            }
        };
        let otlp = OtlpConfig::from_lookup(|name| std::env::var(name).ok())?;
        let traces = TraceConfig::from_lookup(|name| std::env::var(name).ok())?;
        let openlineage = self.openlineage()?;
        let instance_id = match given("PERAGO_INSTANCE_ID", self.instance_id.as_deref())? {
            Some(id)
                if !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) =>
            {
                return Err("PERAGO_INSTANCE_ID must contain only ASCII letters, digits, dots, underscores, or hyphens".into());
            }
            other => other,
        };
        let failure_reason_max_length: usize = max.parse().unwrap_or(usize::MAX);
        if failure_reason_max_length == 0 {
            return Err("PERAGO_FAILURE_REASON_MAX_LENGTH must be greater than zero".into());
        }
        if self.poll_timeout_ms > 5000 {
            return Err(
                "PERAGO_POLL_TIMEOUT_MS must be at most 5000 (Conductor's long-poll limit)".into(),
            );
        }
        if self.conductor_timeout_seconds == 0 {
            return Err("PERAGO_CONDUCTOR_TIMEOUT_SECONDS must be greater than zero".into());
        }
        let pod = given("POD_NAME", self.pod_name.as_deref())?
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| format!("pid{}", std::process::id()));
        // The pod name plus a random suffix: a restarted sidecar in the same pod is a new worker.
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..6];
        let worker_id = match prefix {
            Some(p) => format!("{p}-{pod}-{suffix}"),
            None => format!("{pod}-{suffix}"),
        };
        Ok(RuntimeSettings {
            conductor_url,
            credentials,
            conductor_tls,
            domain,
            request_timeout: Duration::from_secs(self.conductor_timeout_seconds),
            worker_id,
            instance_id: instance_id.unwrap_or(pod),
            failure_reason_max_length,
            poll_wait: Duration::from_millis(self.poll_timeout_ms),
            poll_interval: Duration::from_millis(self.poll_interval_ms.max(1)),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_seconds),
            otlp,
            traces,
            openlineage,
            lakefs,
        })
    }

    /// The OpenLineage settings: `None` without a URL (the others are then ignored).
    fn openlineage(&self) -> Result<Option<OpenLineageConfig>, String> {
        let Some(url) = given("PERAGO_OPENLINEAGE_URL", self.openlineage_url.as_deref())? else {
            return Ok(None);
        };
        if let Some(problem) = perago_contract::url::http_url_problem(&url) {
            return Err(format!("PERAGO_OPENLINEAGE_URL {problem}"));
        }
        let namespace = given(
            "PERAGO_OPENLINEAGE_NAMESPACE",
            self.openlineage_namespace.as_deref(),
        )?
        .or_else(|| {
            self.task_namespace
                .as_deref()
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "default".into());
        if self.openlineage_timeout_ms == 0 {
            return Err("PERAGO_OPENLINEAGE_TIMEOUT_MS must be greater than zero".into());
        }
        if self.openlineage_queue_size == 0 {
            return Err("PERAGO_OPENLINEAGE_QUEUE_SIZE must be greater than zero".into());
        }
        Ok(Some(OpenLineageConfig {
            url,
            namespace,
            timeout: Duration::from_millis(self.openlineage_timeout_ms),
            queue: self.openlineage_queue_size,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: Settings,
    }

    fn check(args: &[&str]) -> Result<RuntimeSettings, String> {
        let mut all = vec!["x", "--pod-name", "pod-a"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all)
            .map_err(|e| e.to_string())?
            .settings
            .check()
    }

    #[test]
    fn messages() {
        assert_eq!(
            check(&[]).unwrap_err(),
            "CONDUCTOR_SERVER_URL is required for perago start"
        );
        assert_eq!(
            check(&["--conductor-url", "replace-me"]).unwrap_err(),
            "CONDUCTOR_SERVER_URL must be replaced with a real value"
        );
        let url = ["--conductor-url", "http://c/api"];
        for (value, message) in [
            (
                "0",
                "PERAGO_FAILURE_REASON_MAX_LENGTH must be greater than zero",
            ),
            (
                "-1",
                "PERAGO_FAILURE_REASON_MAX_LENGTH must be a positive integer",
            ),
            (
                "1.5",
                "PERAGO_FAILURE_REASON_MAX_LENGTH must be a positive integer",
            ),
        ] {
            let flag = format!("--failure-reason-max-length={value}");
            let mut args = url.to_vec();
            args.push(&flag);
            assert_eq!(check(&args).unwrap_err(), message);
        }
        let mut args = url.to_vec();
        args.extend(["--worker-id-prefix", "a-b"]);
        assert_eq!(
            check(&args).unwrap_err(),
            "PERAGO_WORKER_ID_PREFIX must contain only ASCII letters and digits"
        );
        let mut args = url.to_vec();
        args.extend(["--conductor-auth-key", "k"]);
        assert!(
            check(&args)
                .unwrap_err()
                .contains("missing CONDUCTOR_AUTH_SECRET")
        );
    }

    #[test]
    fn openlineage_settings() {
        let url = ["--conductor-url", "http://c/api"];
        assert!(check(&url).unwrap().openlineage.is_none());
        let with = |extra: &[&str]| {
            let mut args = url.to_vec();
            args.extend_from_slice(extra);
            check(&args).map(|s| s.openlineage)
        };
        let ol = with(&["--openlineage-url", "http://marquez:5000/api/v1/lineage"])
            .unwrap()
            .unwrap();
        assert_eq!(
            (ol.url.as_str(), ol.namespace.as_str(), ol.timeout, ol.queue),
            (
                "http://marquez:5000/api/v1/lineage",
                "default",
                Duration::from_secs(5),
                1024
            )
        );
        let ol = with(&[
            "--openlineage-url",
            "https://l/api/v1/lineage",
            "--task-namespace",
            "team",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(ol.namespace, "team", "the task's namespace by default");
        assert_eq!(
            with(&["--openlineage-url", "marquez:5000"]).unwrap_err(),
            "PERAGO_OPENLINEAGE_URL must be an http:// or https:// URL, not \"marquez:5000\""
        );
        assert_eq!(
            with(&[
                "--openlineage-url",
                "http://m",
                "--openlineage-timeout-ms",
                "0"
            ])
            .unwrap_err(),
            "PERAGO_OPENLINEAGE_TIMEOUT_MS must be greater than zero"
        );
    }

    #[test]
    fn worker_id_names_the_pod_and_is_unique_per_start() {
        let mut args = vec![
            "--conductor-url",
            "http://c/api",
            "--worker-id-prefix",
            "feat",
        ];
        let a = check(&args).unwrap();
        let b = check(&args).unwrap();
        assert!(a.worker_id.starts_with("feat-pod-a-"), "{}", a.worker_id);
        assert_ne!(a.worker_id, b.worker_id);
        args.truncate(2);
        assert!(check(&args).unwrap().worker_id.starts_with("pod-a-"));
        assert_eq!(check(&args).unwrap().failure_reason_max_length, 500);
    }
}
