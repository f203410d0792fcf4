//! `perago-e2e up [--services all|conductor,lakefs,kube,node,s3] [--fleet N] [--env-file FILE]`
//!
//! Starts the real servers (with `--fleet`, also N simulated nodes beside the real one), prints (and optionally writes) the environment a client needs,
//! and keeps them running until interrupted (Ctrl-C or SIGTERM), then stops them all.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use perago_e2e::fleet::Fleet;
use perago_e2e::{Selection, Services};

#[derive(Parser)]
#[command(
    name = "perago-e2e",
    about = "The project's real servers for tests and local use"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the servers, print their environment, and keep them until Ctrl-C or SIGTERM.
    Up {
        /// Which servers: `all`, or a comma-separated list of conductor, lakefs, kube, node.
        #[arg(long, default_value = "all", value_parser = Selection::parse)]
        services: Selection,
        /// Also write the environment to this file (removed when the servers stop).
        #[arg(long)]
        env_file: Option<PathBuf>,
        /// Simulated nodes (kwok) beside the real one, for pods that select and tolerate
        /// `perago.io/simulated-node` (needs the node).
        #[arg(long, default_value_t = 0)]
        fleet: usize,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    let Command::Up {
        services: selection,
        env_file,
        fleet,
    } = Cli::parse().command;
    if fleet > 0 && !selection.node {
        bail!("--fleet needs the node (--services all, or a list with node)");
    }
    let services = Services::start(selection).await?;
    let fleet = match fleet {
        0 => None,
        count => Some(
            Fleet::start(
                services.dir(),
                &services.kube().kubeconfig,
                services.kube().client().await?,
                count,
            )
            .await?,
        ),
    };
    let text: String = services
        .env()
        .iter()
        .map(|(k, v)| format!("export {k}={v}\n"))
        .collect();
    print!("{text}");
    if let Some(path) = &env_file {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!(
        "[e2e] servers running (state in {}); stop with Ctrl-C or SIGTERM",
        services.dir().display()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    if let Some(path) = &env_file {
        let _ = std::fs::remove_file(path);
    }
    drop(fleet);
    drop(services);
    eprintln!("[e2e] servers stopped");
    Ok(())
}
