//! `perago-operator`: the PeragoTask operator and its offline tools.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

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
}

fn main() -> ExitCode {
    // clap exits with status 2 on usage errors, as the CLI contract requires.
    let args = Args::parse();
    let outcome = match args.command {
        Command::Crd => cli::crd(),
        Command::Check { file } => cli::check(&file),
        Command::Taskdef { file, output } => cli::taskdef(&file, output.as_deref()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}
