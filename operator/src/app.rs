//! The `perago-operator` command line: its subcommands, the controller's flags, and how
//! `run` starts the controller, the webhook, the metrics server and leader election.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use perago_api::task::ExecutorNetworkPolicy;
use perago_conductor::flags::ConductorAuthFlags;

use crate::{
    cli, conductor, context, controller, leadership, owned, reference, render, selftest, telemetry,
    webhook,
};

#[derive(Parser)]
#[command(
    name = "perago-operator",
    version,
    about = "Perago for Kubernetes operator"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of `Run` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Print the PeragoTask CustomResourceDefinition as YAML.
    Crd,
    /// Print the PeragoTask reference document (Markdown), generated from the CRD.
    Reference,
    /// Validate the PeragoTasks of a manifest offline.
    Check {
        /// Manifest file (YAML, several documents allowed); `-` reads standard input.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
    },
    /// Render the Conductor TaskDef of the one PeragoTask in a manifest.
    Taskdef {
        /// Manifest file (YAML); `-` reads standard input.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        /// Write the TaskDef to this `.json` file instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Run the controller (in the cluster, or with the kubeconfig of KUBECONFIG).
    Run {
        #[command(flatten)]
        defaults: DefaultsArgs,
        /// Per-request timeout of Conductor calls (seconds).
        #[arg(long, env = "PERAGO_CONDUCTOR_TIMEOUT_SECONDS", default_value_t = 10)]
        conductor_timeout_seconds: u64,
        /// How often a ready task is checked again, TaskDef drift included (seconds).
        #[arg(long, env = "PERAGO_RESYNC_SECONDS", default_value_t = 60)]
        resync_seconds: u64,
        /// How often the queues of all task types are read (one Conductor call per Conductor),
        /// so that an autoscaled task scales up within this many seconds of work arriving; 0
        /// turns it off (each task's queue is then read at its resync).
        #[arg(long, env = "PERAGO_QUEUE_POLL_SECONDS", default_value_t = 1)]
        queue_poll_seconds: u64,
        #[command(flatten)]
        process: ProcessArgs,
        #[command(flatten)]
        auth: ConductorAuthFlags,
        /// PEM bundle of the certificate authorities that sign the Conductors' certificates,
        /// trusted beside the built-in and the platform's roots (a private CA).
        #[arg(long, env = "PERAGO_CONDUCTOR_CA_FILE")]
        conductor_ca_file: Option<std::path::PathBuf>,
        /// PEM client certificate presented to the Conductors (to a gateway in front of them
        /// that asks for one), e.g. a `kubernetes.io/tls` Secret's `tls.crt`; read again when
        /// it changes.
        #[arg(long, env = "PERAGO_CONDUCTOR_CLIENT_CERT_FILE")]
        conductor_client_cert_file: Option<std::path::PathBuf>,
        /// The PEM key of `--conductor-client-cert-file` (`tls.key`).
        #[arg(long, env = "PERAGO_CONDUCTOR_CLIENT_KEY_FILE")]
        conductor_client_key_file: Option<std::path::PathBuf>,
        #[command(flatten)]
        webhook: WebhookArgs,
    },
    /// Print the sidecar's task contract of the one PeragoTask in a manifest (JSON).
    Contract {
        /// Manifest file (YAML); `-` reads standard input.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
    },
    /// Check an installation from inside the cluster (the chart's `helm test`): the PeragoTask
    /// API is served, the operator answers on its Service, the admission webhook judges.
    Selftest {
        /// The release's namespace.
        #[arg(long, env = "POD_NAMESPACE")]
        namespace: String,
        /// The operator's metrics Service (its port `http` serves /readyz).
        #[arg(long, default_value = "perago-operator-metrics")]
        service: String,
        /// Also check the admission webhook (false when the chart installs none).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        webhook: bool,
        /// How long each check is retried (seconds).
        #[arg(long, default_value_t = 60)]
        timeout_seconds: u64,
    },
    /// Print the ConfigMap and Deployment the operator creates for each PeragoTask.
    Render {
        /// Manifest file (YAML, several documents allowed); `-` reads standard input.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        #[command(flatten)]
        defaults: DefaultsArgs,
    },
}

/// How the operator process runs.
#[derive(clap::Args)]
pub struct ProcessArgs {
    /// `/metrics`, `/healthz`, `/readyz`.
    #[arg(long, env = "PERAGO_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: std::net::SocketAddr,
    /// Reconcile only while holding the Lease `perago-operator` (run several replicas safely).
    #[arg(long, env = "PERAGO_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// Namespace of the leader Lease (the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Seconds a leader holds the Lease without renewing it.
    #[arg(long, env = "PERAGO_LEASE_DURATION_SECONDS", default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Watch only these namespaces (comma-separated) for PeragoTasks and the objects made for
    /// them; unset or empty: every namespace.
    #[arg(long, env = "PERAGO_WATCH_NAMESPACES", default_value = "", value_parser = crate::scope::Scope::parse)]
    watch_namespaces: crate::scope::Scope,
    /// This cluster's name in the TaskDefs it registers, so that clusters sharing a Conductor
    /// do not rewrite each other's (ADR 0040). Unset: the UID of the namespace `kube-system`.
    #[arg(long, env = "PERAGO_CLUSTER_NAME")]
    cluster_name: Option<String>,
}

/// The validating admission webhook (ADR 0008).
#[derive(clap::Args)]
pub struct WebhookArgs {
    /// Serve the admission webhook over HTTPS here (the chart sets `0.0.0.0:9443`); unset
    /// disables it.
    #[arg(long, env = "PERAGO_WEBHOOK_ADDR")]
    webhook_addr: Option<std::net::SocketAddr>,
    /// Secret (in the operator's namespace) holding the webhook's certificate.
    #[arg(
        long,
        env = "PERAGO_WEBHOOK_SECRET",
        default_value = "perago-operator-webhook-tls"
    )]
    webhook_secret: String,
    /// The Service the apiserver calls the webhook through (the certificate's name).
    #[arg(
        long,
        env = "PERAGO_WEBHOOK_SERVICE",
        default_value = "perago-operator-webhook"
    )]
    webhook_service: String,
    /// The ValidatingWebhookConfiguration whose caBundle the operator keeps.
    #[arg(
        long,
        env = "PERAGO_WEBHOOK_CONFIGURATION",
        default_value = "perago-operator"
    )]
    webhook_configuration: String,
    /// Make, renew and publish the certificate; false when cert-manager does.
    #[arg(long, env = "PERAGO_WEBHOOK_MANAGE_CERTIFICATE", default_value_t = true, action = clap::ArgAction::Set)]
    webhook_manage_certificate: bool,
    /// Seconds between looks at the certificate: renewed when due, reloaded when the Secret
    /// changed, the caBundle mended.
    #[arg(
        long,
        env = "PERAGO_WEBHOOK_CERTIFICATE_CHECK_SECONDS",
        default_value_t = 60
    )]
    webhook_certificate_check_seconds: u64,
}

/// Start the webhook in the background: it serves once its certificate is there (a
/// cert-manager Secret may come later), and readiness waits for it.
fn start_webhook(
    client: &kube::Client,
    args: WebhookArgs,
    namespace: &str,
    metrics: &std::sync::Arc<telemetry::Metrics>,
) {
    let Some(addr) = args.webhook_addr else {
        return;
    };
    let settings = webhook::tls::Settings {
        namespace: namespace.to_owned(),
        secret: args.webhook_secret,
        service: args.webhook_service,
        configuration: args.webhook_configuration,
        manage: args.webhook_manage_certificate,
        check_every: std::time::Duration::from_secs(args.webhook_certificate_check_seconds.max(1)),
    };
    let (client, metrics) = (client.clone(), metrics.clone());
    metrics
        .webhook_ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    tokio::spawn(async move {
        let (pem, config) = loop {
            match webhook::tls::prepare(&client, &settings).await {
                Ok(ready) => break ready,
                Err(e) => {
                    tracing::warn!(error = %e, "the admission webhook cannot serve yet; retrying in 5 s");
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
            }
        };
        tokio::spawn(webhook::tls::keep_fresh(
            client,
            settings,
            config.clone(),
            pem,
        ));
        let listening = move || {
            metrics
                .webhook_ready
                .store(true, std::sync::atomic::Ordering::Relaxed);
        };
        if let Err(e) = webhook::serve(addr, config, listening).await {
            tracing::error!(error = %e, %addr, "the admission webhook stopped");
        }
    });
}

/// The operator's cluster-wide defaults.
#[derive(clap::Args)]
pub struct DefaultsArgs {
    /// Image of the sidecar (also carries perago-runner).
    #[arg(long, env = "PERAGO_SIDECAR_IMAGE", default_value = concat!("ghcr.io/perago/perago-sidecar:", env!("CARGO_PKG_VERSION")))]
    sidecar_image: String,
    /// Conductor API URL for tasks that do not set `spec.conductor.url`.
    #[arg(long, env = "PERAGO_CONDUCTOR_URL")]
    conductor_url: Option<String>,
    /// Secret with CONDUCTOR_AUTH_KEY / CONDUCTOR_AUTH_SECRET for tasks that set none.
    #[arg(long, env = "PERAGO_CONDUCTOR_CREDENTIALS_SECRET")]
    conductor_credentials_secret: Option<String>,
    /// lakeFS URL for workspace tasks that do not set `spec.lakefs.endpoint`.
    #[arg(long, env = "PERAGO_LAKEFS_ENDPOINT")]
    lakefs_endpoint: Option<String>,
    /// Secret with the LAKECTL_CREDENTIALS_* keys for workspace tasks that set none.
    #[arg(long, env = "PERAGO_LAKEFS_CREDENTIALS_SECRET")]
    lakefs_credentials_secret: Option<String>,
    /// Object store hosts (comma-separated `host[:port]`, `*.suffix`) that URLs presigned by
    /// lakeFS may point at, for workspace tasks that name none.
    #[arg(long, env = "PERAGO_LAKEFS_OBJECT_STORE_HOSTS", value_delimiter = ',')]
    lakefs_object_store_hosts: Vec<String>,
    /// OTLP/HTTP URL (`…/v1/traces`) every sidecar sends a trace of each attempt to
    /// (its `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); unset: no traces.
    #[arg(long, env = "PERAGO_SIDECAR_OTLP_TRACES_ENDPOINT", value_parser = otlp_url)]
    sidecar_otlp_traces_endpoint: Option<String>,
    /// The executor pods' NetworkPolicy, as JSON: `{"enabled": true, "egress": [...],
    /// "ingress": [...]}` (NetworkPolicy rules). `enabled` holds for tasks whose
    /// `spec.executor.networkPolicy.enabled` is unset; the rules are in every task's policy.
    #[arg(long, env = "PERAGO_EXECUTOR_NETWORK_POLICY", value_parser = network_policy)]
    executor_network_policy: Option<ExecutorNetworkPolicy>,
}

/// The executor pods' common NetworkPolicy rules, refused at start when they do not parse.
fn network_policy(value: &str) -> Result<ExecutorNetworkPolicy, String> {
    serde_json::from_str(value).map_err(|e| {
        format!(
            "must be JSON of {{\"enabled\", \"egress\", \"ingress\"}} with NetworkPolicy rules: {e}"
        )
    })
}

/// An OTLP/HTTP endpoint: the sidecar refuses anything else at start, so the operator does
/// before it renders it into every pod.
fn otlp_url(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.starts_with("http://") || value.starts_with("https://") {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "must be an http:// or https:// URL (OTLP/HTTP), not {value:?}"
        ))
    }
}

impl DefaultsArgs {
    fn defaults(self) -> render::Defaults {
        render::Defaults {
            sidecar_image: self.sidecar_image,
            conductor_url: self.conductor_url,
            conductor_credentials_secret: self.conductor_credentials_secret,
            lakefs_endpoint: self.lakefs_endpoint,
            lakefs_credentials_secret: self.lakefs_credentials_secret,
            lakefs_object_store_hosts: self
                .lakefs_object_store_hosts
                .into_iter()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
                .collect(),
            traces_endpoint: self.sidecar_otlp_traces_endpoint.filter(|e| !e.is_empty()),
            executor_network_policy: self.executor_network_policy.unwrap_or_default(),
        }
    }
}

/// The cluster's name in the TaskDefs it registers: the one given, else the UID of
/// `kube-system`, which every cluster has and no two share. Unreadable (the operator may not
/// read that namespace): unnamed, as every cluster was before names, with a warning.
async fn cluster_name(client: &kube::Client, given: Option<&str>) -> String {
    if let Some(name) = given.map(str::trim).filter(|n| !n.is_empty()) {
        return name.to_owned();
    }
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    match tokio::time::timeout(
        std::time::Duration::from_secs(10),
        namespaces.get("kube-system"),
    )
    .await
    {
        Ok(Ok(namespace)) => {
            let uid = namespace.metadata.uid.unwrap_or_default();
            tracing::info!(cluster = %uid, "named the cluster by the UID of kube-system");
            uid
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not read the namespace kube-system to name the cluster; set --cluster-name (clusterName) when clusters share a Conductor");
            String::new()
        }
        Err(_) => {
            tracing::warn!("reading the namespace kube-system timed out; the cluster is unnamed");
            String::new()
        }
    }
}

fn run(
    defaults: render::Defaults,
    timeout: u64,
    resync: u64,
    queue_poll: u64,
    process: ProcessArgs,
    (credentials, tls): (Option<conductor::Credentials>, perago_conductor::trust::Tls),
    webhook: WebhookArgs,
) -> Result<(), String> {
    perago_telemetry::init_logging();
    // rustls is built without a default crypto provider: ring, as for the Kubernetes client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if defaults.conductor_url.is_none() {
        return Err("--conductor-url (PERAGO_CONDUCTOR_URL) is required: tasks without spec.conductor.url are registered there".into());
    }
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| format!("starting the async runtime failed: {e}"))?;
    runtime.block_on(async {
        let metrics = std::sync::Arc::new(
            telemetry::Metrics::new().map_err(|e| format!("registering metrics failed: {e}"))?,
        );
        telemetry::serve(process.http_addr, metrics.clone())
            .await
            .map_err(|e| format!("listening on {} failed: {e}", process.http_addr))?;
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("connecting to Kubernetes failed: {e}"))?;
        start_webhook(&client, webhook, &process.lease_namespace, &metrics);
        let cluster = cluster_name(&client, process.cluster_name.as_deref()).await;
        // What one leadership term reconciles with: made afresh each term, so the caches of
        // a term that ended (its watches stopped) are never read by the next.
        let term = || -> Result<(context::Context, owned::Writers), String> {
            let conductor = conductor::Conductors::new(
                std::time::Duration::from_secs(timeout.max(1)),
                Some(metrics.conductor_calls.clone()),
                credentials.clone(),
                tls.clone(),
            )
            .map_err(|e| format!("building the Conductor client failed: {e}"))?;
            let recorder =
                kube::runtime::events::Recorder::new(client.clone(), controller::reporter());
            let (owned, writers) = owned::Owned::new(&process.watch_namespaces);
            let context = context::Context {
                client: client.clone(),
                conductor,
                defaults: defaults.clone(),
                recorder,
                resync: std::time::Duration::from_secs(resync.max(1)),
                metrics: metrics.clone(),
                pods: crate::slots::SlotsClient::new(crate::render::METRICS_PORT as u16)
                    .map_err(|e| format!("building the pods' HTTP client failed: {e}"))?,
                scaler: Default::default(),
                queues: crate::queues::QueueWatch::new(
                    (queue_poll > 0).then(|| std::time::Duration::from_secs(queue_poll)),
                ),
                owned,
                // The controllers' own stores, once `controller::run` has made the controllers.
                tasks: crate::scope::Stores::new(Vec::new()),
                cluster: cluster.clone(),
            };
            Ok((context, writers))
        };
        metrics
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if !process.leader_election {
            metrics.leader.set(1);
            let (context, writers) = term()?;
            controller::run(context, writers, &process.watch_namespaces).await;
            return Ok(());
        }
        let identity = std::env::var("POD_NAME")
            .unwrap_or_else(|_| format!("perago-operator-{}", std::process::id()));
        let manager =
            kube_lease_manager::LeaseManagerBuilder::new(client.clone(), leadership::LEASE)
                .with_namespace(process.lease_namespace.clone())
                .with_identity(identity.clone())
                .with_duration(process.lease_duration_seconds.max(2))
                .with_grace((process.lease_duration_seconds / 3).max(1))
                .build()
                .await
                .map_err(|e| format!("preparing the leader Lease failed: {e}"))?;
        let (mut leading, _task) = manager.watch().await;
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(client.clone(), &process.lease_namespace);
        // A standby has no controller to stop on a signal: without this it would wait out the
        // pod's whole grace period, and every rollout or scale-in of the operator with it.
        let mut stop = std::pin::pin!(stop_signal());
        loop {
            tracing::info!(identity = %identity, "waiting for the leader lease");
            tokio::select! {
                waited = leading.wait_for(|l| *l) => {
                    if waited.is_err() {
                        return Err("the leader election stopped".into());
                    }
                }
                () = &mut stop => {
                    tracing::info!(identity = %identity, "stopping: a signal while standing by");
                    return Ok(());
                }
            }
            // The library may still say "leading" from before an outage: lead only once the
            // Lease, read now, is this replica's.
            tokio::select! {
                () = leadership::confirmed(&leases, &identity) => {}
                _ = leading.wait_for(|l| !*l) => continue,
                () = &mut stop => return Ok(()),
            }
            metrics.leader.set(1);
            tracing::info!(identity = %identity, "leading; reconciling");
            let (context, writers) = term()?;
            // The term's controllers, watches and reconciles in flight are dropped when it
            // ends, at once: another replica may already reconcile. This one stays up as a
            // standby (an API server outage longer than the lease must not leave every
            // replica in a crash-loop back-off when it ends).
            let why = tokio::select! {
                () = controller::run(context, writers, &process.watch_namespaces) => return Ok(()),
                () = leadership::lapsed(&leases, &identity) => {
                    "the leader lease expired unrenewed (the API server out of reach?)"
                }
                _ = leading.wait_for(|l| !*l) => "lost the leader lease",
            };
            metrics.leader.set(0);
            metrics.leadership_lost.inc();
            metrics.forget_tasks();
            tracing::warn!(identity = %identity, "{why}; stopped reconciling");
        }
    })
}

/// SIGTERM (the kubelet stopping the pod) or Ctrl-C. A leader's controllers stop on their
/// own (`shutdown_on_signal`), after the reconciles in flight.
async fn stop_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// Carry out one parsed command line; the error is the one line printed after `error: `.
pub fn execute(args: Args) -> Result<(), String> {
    match args.command {
        Command::Crd => cli::crd(),
        Command::Reference => reference::print(),
        Command::Check { file } => cli::check(&file),
        Command::Taskdef { file, output } => cli::taskdef(&file, output.as_deref()),
        Command::Contract { file } => cli::contract(&file),
        Command::Render { file, defaults } => cli::render(&file, &defaults.defaults()),
        Command::Selftest {
            namespace,
            service,
            webhook,
            timeout_seconds,
        } => selftest::run(selftest::Target {
            namespace,
            service,
            webhook,
            timeout: std::time::Duration::from_secs(timeout_seconds),
        }),
        Command::Run {
            defaults,
            conductor_timeout_seconds,
            resync_seconds,
            queue_poll_seconds,
            process,
            auth,
            conductor_ca_file,
            conductor_client_cert_file,
            conductor_client_key_file,
            webhook,
        } => {
            let credentials = auth.credentials()?;
            let tls = perago_conductor::trust::Tls {
                roots: perago_conductor::trust::roots(
                    "PERAGO_CONDUCTOR_CA_FILE",
                    conductor_ca_file.as_deref(),
                )?,
                identity: perago_conductor::trust::identity_files(
                    (
                        "PERAGO_CONDUCTOR_CLIENT_CERT_FILE",
                        conductor_client_cert_file.as_deref(),
                    ),
                    (
                        "PERAGO_CONDUCTOR_CLIENT_KEY_FILE",
                        conductor_client_key_file.as_deref(),
                    ),
                )?,
            };
            // A missing, mismatched or expired certificate is said before anything starts.
            if let Some(files) = &tls.identity {
                files.load()?;
            }
            run(
                defaults.defaults(),
                conductor_timeout_seconds,
                resync_seconds,
                queue_poll_seconds,
                process,
                (credentials, tls),
                webhook,
            )
        }
    }
}
