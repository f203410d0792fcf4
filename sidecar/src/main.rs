//! `perago-sidecar`: the executor sidecar of a Perago task pod.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use perago_sidecar::app;
use perago_sidecar::config::Settings;

#[derive(Parser)]
#[command(
    name = "perago-sidecar",
    version,
    about = "Polls Conductor, runs attempts through perago-runner and reports them"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Mode>,
    #[command(flatten)]
    settings: Settings,
}

#[derive(Subcommand)]
enum Mode {
    /// Run as the pod's sidecar (the default).
    Run,
    /// Copy `perago-runner` (installed next to this binary) into the shared volume; the
    /// sidecar container's postStart hook runs this, which the kubelet finishes before it
    /// starts the body, so the body image needs nothing of ours.
    InstallRunner {
        /// Destination, e.g. `/perago-work/bin/perago-runner`.
        #[arg(long)]
        to: PathBuf,
    },
    /// Run the whole pod locally: this sidecar plus `perago-runner -- COMMAND` as a second
    /// process sharing the work directory.
    Local {
        /// The perago-runner binary (default: next to this one).
        #[arg(long)]
        runner: Option<PathBuf>,
        /// The task body's command.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Mode::InstallRunner { to }) = &cli.command {
        return match app::install_runner(to) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    perago_telemetry::init_logging();
    let runtime = match cli.settings.runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            None | Some(Mode::Run) => {
                let stop = app::stop_on_signals()?;
                app::run(&cli.settings, stop).await
            }
            Some(Mode::Local { runner, command }) => {
                app::run_local(&cli.settings, runner, command).await
            }
            Some(Mode::InstallRunner { .. }) => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sidecar failed to start");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
