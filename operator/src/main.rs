//! `perago-operator`: the PeragoTask operator and its offline tools.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;
mod conductor;
mod controller;
mod render;

#[derive(Parser)]
#[command(
    name = "perago-operator",
    version,
    about = "Perago for Kubernetes operator"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the PeragoTask CustomResourceDefinition as YAML.
    Crd,
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

/// The operator's cluster-wide defaults.
#[derive(clap::Args)]
struct DefaultsArgs {
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
}

impl DefaultsArgs {
    fn defaults(self) -> render::Defaults {
        render::Defaults {
            sidecar_image: self.sidecar_image,
            conductor_url: self.conductor_url,
            conductor_credentials_secret: self.conductor_credentials_secret,
            lakefs_endpoint: self.lakefs_endpoint,
            lakefs_credentials_secret: self.lakefs_credentials_secret,
        }
    }
}

fn run(defaults: render::Defaults, timeout: u64, resync: u64) -> Result<(), String> {
    let _ = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            std::env::var("PERAGO_LOG").unwrap_or_else(|_| "info".into()),
        ))
        .with_writer(std::io::stderr)
        .try_init();
    if defaults.conductor_url.is_none() {
        return Err("--conductor-url (PERAGO_CONDUCTOR_URL) is required: tasks without spec.conductor.url are registered there".into());
    }
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| format!("starting the async runtime failed: {e}"))?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("connecting to Kubernetes failed: {e}"))?;
        let conductor =
            conductor::MetadataClient::new(std::time::Duration::from_secs(timeout.max(1)))
                .map_err(|e| format!("building the Conductor client failed: {e}"))?;
        let recorder = kube::runtime::events::Recorder::new(client.clone(), controller::reporter());
        controller::run(controller::Context {
            client,
            conductor,
            defaults,
            recorder,
            resync: std::time::Duration::from_secs(resync.max(1)),
            recommendations: Default::default(),
        })
        .await;
        Ok(())
    })
}

fn main() -> ExitCode {
    // clap exits with status 2 on usage errors, as the CLI contract requires.
    let args = Args::parse();
    let outcome = match args.command {
        Command::Crd => cli::crd(),
        Command::Check { file } => cli::check(&file),
        Command::Taskdef { file, output } => cli::taskdef(&file, output.as_deref()),
        Command::Render { file, defaults } => cli::render(&file, &defaults.defaults()),
        Command::Run {
            defaults,
            conductor_timeout_seconds,
            resync_seconds,
        } => run(
            defaults.defaults(),
            conductor_timeout_seconds,
            resync_seconds,
        ),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}
