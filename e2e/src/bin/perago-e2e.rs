//! `perago-e2e up [--services all|conductor,lakefs,kube,node,s3] [--env-file FILE]`
//!
//! Starts the real servers, prints (and optionally writes) the environment a client needs,
//! and keeps them running until interrupted (Ctrl-C or SIGTERM), then stops them all.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
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
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    let Command::Up {
        services: selection,
        env_file,
    } = Cli::parse().command;
    let services = Services::start(selection).await?;
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
    drop(services);
    eprintln!("[e2e] servers stopped");
    Ok(())
}
