//! `kubectl-perago`: on PATH, `kubectl perago …`. See docs/kubectl-perago.md.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use perago_kubectl::connect::Endpoints;
use perago_kubectl::output::{Format, render};
use perago_kubectl::{Failure, explain, fence, gc, history};

#[derive(Parser)]
#[command(
    name = "kubectl-perago",
    bin_name = "kubectl perago",
    version,
    about = "Explain what Perago tasks did to lakeFS branches, clean up after dead attempts, install the hard fence",
    after_help = "Exit status: 0 nothing to report, 1 something was flagged or a call failed, 2 usage."
)]
struct Cli {
    #[command(flatten)]
    endpoints: Endpoints,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table, global = true)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Classify a branch's first-parent history: publications, supersessions, foreign commits.
    History(history::HistoryArgs),
    /// Say what became of each attempt of a workflow's workspace steps.
    Explain(explain::ExplainArgs),
    /// Delete the staging branches of attempts that can no longer publish.
    Gc(gc::GcArgs),
    /// Commit the hard fence (a lakeFS pre-merge action) on a target branch.
    InstallFence(fence::InstallFenceArgs),
}

async fn run(cli: &Cli) -> Result<(), Failure> {
    let endpoints = cli.endpoints.resolved().await?;
    match &cli.command {
        Command::History(args) => {
            let view = history::run(&endpoints, args).await?;
            print!("{}", render(&view, cli.output)?);
            if view.problems.is_empty() {
                Ok(())
            } else {
                Err(Failure::Flagged)
            }
        }
        Command::Explain(args) => {
            let view = explain::run(&endpoints, args).await?;
            print!("{}", render(&view, cli.output)?);
            if view.needs_attention() {
                Err(Failure::Flagged)
            } else {
                Ok(())
            }
        }
        Command::Gc(args) => {
            let view = gc::run(&endpoints, args).await?;
            print!("{}", render(&view, cli.output)?);
            Ok(())
        }
        Command::InstallFence(args) => {
            let view = fence::run(&endpoints, args).await?;
            print!("{}", render(&view, cli.output)?);
            if view.outcome == fence::Outcome::Refused {
                Err(Failure::Flagged)
            } else {
                Ok(())
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            return ExitCode::from(if usage { 2 } else { 0 });
        }
    };
    match run(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Flagged) => ExitCode::from(1),
        Err(Failure::Error(e)) => {
            eprintln!("error: {}", one_line(&format!("{e:#}")));
            ExitCode::from(1)
        }
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
