//! `kubectl-perago`: on PATH, `kubectl perago …`. See docs/kubectl-perago.md.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use perago_conductor::ConductorClient;
use perago_kubectl::cluster::{self, ClusterFlags};
use perago_kubectl::connect::Endpoints;
use perago_kubectl::output::{Format, render};
use perago_kubectl::{Failure, explain, fence, gc, history, logs, report, status, suspend};

#[derive(Parser)]
#[command(
    name = "kubectl-perago",
    bin_name = "kubectl perago",
    version,
    about = "Operate Perago tasks: their status, suspend and resume, logs and support bundles; explain what they did to lakeFS branches, clean up after dead attempts, install the hard fence",
    after_help = "Exit status: 0 nothing to report, 1 something was flagged or a call failed, 2 usage.\n\nStart from a task: kubectl perago status TASK -n NAMESPACE"
)]
struct Cli {
    #[command(flatten)]
    cluster: ClusterFlags,
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
    /// Show a task on one screen: spec, conditions, pods and their busy slots, the queue and
    /// the latest attempts.
    Status(status::StatusArgs),
    /// Stop a task without deleting it: its pods finish and report what they run, and go.
    Suspend(suspend::SuspendArgs),
    /// Start a suspended task again.
    Resume(suspend::SuspendArgs),
    /// Print an attempt's lines, its sidecar's and its body's in time order, or the sidecar
    /// lines of every pod of a task.
    Logs(logs::LogsArgs),
    /// Write a redacted support bundle of a task, or of the operator.
    Report(report::ReportArgs),
    /// Classify a branch's first-parent history: publications, supersessions, foreign commits.
    History(history::HistoryArgs),
    /// Say what became of each attempt of a workflow's workspace steps.
    Explain(explain::ExplainArgs),
    /// Delete the staging branches of attempts that can no longer publish.
    Gc(gc::GcArgs),
    /// Commit the hard fence (a lakeFS pre-merge action) on a target branch.
    InstallFence(fence::InstallFenceArgs),
    /// Print a shell completion script: `source <(kubectl perago completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

async fn run(cli: &Cli) -> Result<(), Failure> {
    let timeout = cli.endpoints.timeout();
    match &cli.command {
        Command::Status(args) => {
            let (client, namespace) = cluster::connect(&cli.cluster, Some(timeout)).await?;
            // The task's own Conductor, unless one is given.
            let endpoints = Endpoints {
                task: cli
                    .endpoints
                    .task
                    .clone()
                    .or_else(|| Some(args.task.clone())),
                ..cli.endpoints.clone()
            };
            // A task with no Deployment yet, or Secrets the user may not read, still has a
            // status to show.
            let (endpoints, unread) = match endpoints.resolved(&cli.cluster).await {
                Ok(endpoints) => (endpoints, None),
                Err(Failure::Error(e)) => (cli.endpoints.clone(), Some(format!("{e:#}"))),
                Err(other) => return Err(other),
            };
            let conductor = endpoints.conductor()?;
            // lakeFS only for the publications of a workspace task; its absence is said there.
            let lakefs = endpoints.lakefs().ok();
            let sources = status::Sources {
                client,
                namespace,
                conductor: conductor.as_ref(),
                conductor_unfound: unread,
                lakefs: lakefs.as_ref(),
                timeout,
            };
            let clear = args.watch
                && matches!(cli.output, Format::Table)
                && std::io::stdout().is_terminal();
            let print = |view: &status::StatusView| -> anyhow::Result<()> {
                if clear {
                    print!("\x1b[H\x1b[2J");
                }
                print!("{}", render(view, cli.output)?);
                Ok(())
            };
            if args.watch {
                status::watch(&sources, args, print).await?;
                return Ok(());
            }
            let view = status::run(&sources, args).await?;
            print(&view)?;
            if view.unread.is_empty() {
                Ok(())
            } else {
                Err(Failure::Flagged)
            }
        }
        Command::Logs(args) => {
            // A follow streams for as long as it is asked to: no read timeout then.
            let read = (!args.follow).then_some(timeout);
            let (client, namespace) = cluster::connect(&cli.cluster, read).await?;
            // Conductor is only asked which pod ran an attempt.
            let (conductor, conductor_unfound) =
                if args.workflow.is_some() || args.task_id.is_some() {
                    task_conductor(cli, &args.task).await?
                } else {
                    (None, None)
                };
            let sources = logs::Sources {
                client,
                namespace,
                conductor: conductor.as_ref(),
                conductor_unfound,
            };
            logs::run(&sources, args, cli.output).await
        }
        Command::Report(args) => {
            let (client, namespace) = cluster::connect(&cli.cluster, Some(timeout)).await?;
            let (conductor, conductor_unfound) = match report::Target::of(&args.target) {
                report::Target::Task(task) => task_conductor(cli, &task).await?,
                report::Target::Operator => (None, None),
            };
            let sources = report::Sources {
                client,
                namespace,
                conductor: conductor.as_ref(),
                conductor_unfound,
                timeout,
                context: cli.cluster.context.clone(),
            };
            let view = report::run(&sources, args).await?;
            print!("{}", render(&view, cli.output)?);
            if view.not_collected.is_empty() && view.not_redacted.is_empty() {
                Ok(())
            } else {
                Err(Failure::Flagged)
            }
        }
        Command::Suspend(args) | Command::Resume(args) => {
            let suspend = matches!(cli.command, Command::Suspend(_));
            let (client, namespace) = cluster::connect(&cli.cluster, Some(timeout)).await?;
            let view = suspend::run(client, &namespace, args, suspend).await?;
            print!("{}", render(&view, cli.output)?);
            Ok(())
        }
        Command::Completion { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(
                *shell,
                &mut command,
                "kubectl-perago",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        command => {
            let endpoints = cli.endpoints.resolved(&cli.cluster).await?;
            recovery(command, &endpoints, cli.output).await
        }
    }
}

/// The task's own Conductor (found as `--task` finds it), unless flags or variables give one;
/// when it cannot be found, why.
async fn task_conductor(
    cli: &Cli,
    task: &str,
) -> Result<(Option<ConductorClient>, Option<String>), Failure> {
    let endpoints = Endpoints {
        task: cli.endpoints.task.clone().or_else(|| Some(task.to_owned())),
        ..cli.endpoints.clone()
    };
    let (endpoints, unread) = match endpoints.resolved(&cli.cluster).await {
        Ok(endpoints) => (endpoints, None),
        Err(Failure::Error(e)) => (cli.endpoints.clone(), Some(format!("{e:#}"))),
        Err(other) => return Err(other),
    };
    Ok((endpoints.conductor()?, unread))
}

/// The commands that work on lakeFS branches and workflows.
async fn recovery(command: &Command, endpoints: &Endpoints, output: Format) -> Result<(), Failure> {
    match command {
        Command::History(args) => {
            let view = history::run(endpoints, args).await?;
            print!("{}", render(&view, output)?);
            if view.problems.is_empty() {
                Ok(())
            } else {
                Err(Failure::Flagged)
            }
        }
        Command::Explain(args) => {
            let view = explain::run(endpoints, args).await?;
            print!("{}", render(&view, output)?);
            if view.needs_attention() {
                Err(Failure::Flagged)
            } else {
                Ok(())
            }
        }
        Command::Gc(args) => {
            let view = gc::run(endpoints, args).await?;
            print!("{}", render(&view, output)?);
            Ok(())
        }
        Command::InstallFence(args) => {
            let view = fence::run(endpoints, args).await?;
            print!("{}", render(&view, output)?);
            if view.outcome == fence::Outcome::Refused {
                Err(Failure::Flagged)
            } else {
                Ok(())
            }
        }
        Command::Status(_)
        | Command::Suspend(_)
        | Command::Resume(_)
        | Command::Logs(_)
        | Command::Report(_)
        | Command::Completion { .. } => {
            unreachable!("handled by run")
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
