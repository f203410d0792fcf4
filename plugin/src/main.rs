//! `kubectl-perago`: on PATH, `kubectl perago …`. See docs/kubectl-perago.md.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use perago_conductor::ConductorClient;
use perago_kubectl::cluster::{self, ClusterFlags};
use perago_kubectl::connect::Endpoints;
use perago_kubectl::output::{Format, render};
use perago_kubectl::{
    Failure, explain, fence, gc, history, logs, report, rollout, status, suspend,
};
use perago_lakefs::LakeFsClient;

#[derive(Parser)]
#[command(
    name = "kubectl-perago",
    bin_name = "kubectl perago",
    version,
    about = "Operate Perago tasks: their status, suspend and resume, canary rollouts, logs and support bundles; explain what they did to lakeFS branches, clean up after dead attempts, install the hard fence",
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
    /// Show a task's canary rollout, or promote or abort it.
    Rollout(rollout::RolloutArgs),
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
            let servers = task_servers(cli, &args.task).await?;
            let sources = status::Sources {
                client,
                namespace,
                conductor: servers.conductor.as_ref(),
                conductor_unfound: servers.unfound,
                lakefs: servers.lakefs.as_ref(),
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
            let servers = if args.workflow.is_some() || args.task_id.is_some() {
                task_servers(cli, &args.task).await?
            } else {
                TaskServers::none()
            };
            let sources = logs::Sources {
                client,
                namespace,
                conductor: servers.conductor.as_ref(),
                conductor_unfound: servers.unfound,
            };
            logs::run(&sources, args, cli.output).await
        }
        Command::Report(args) => {
            let (client, namespace) = cluster::connect(&cli.cluster, Some(timeout)).await?;
            let servers = match report::Target::of(&args.target) {
                report::Target::Task(task) => task_servers(cli, &task).await?,
                report::Target::Operator => TaskServers::none(),
            };
            let sources = report::Sources {
                client,
                namespace,
                conductor: servers.conductor.as_ref(),
                conductor_unfound: servers.unfound,
                lakefs: servers.lakefs.as_ref(),
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
        Command::Rollout(args) => {
            let (client, namespace) = cluster::connect(&cli.cluster, Some(timeout)).await?;
            let view = rollout::run(client, &namespace, args).await?;
            print!("{}", render(&view, cli.output)?);
            if view.flagged() && view.ordered.is_none() {
                Err(Failure::Flagged)
            } else {
                Ok(())
            }
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
/// The servers of PeragoTask `task`: the ones flags or variables name, else those its pods use
/// (found as `--task` finds them); why they could not be found, when they could not.
async fn task_servers(cli: &Cli, task: &str) -> Result<TaskServers, Failure> {
    let endpoints = Endpoints {
        task: cli.endpoints.task.clone().or_else(|| Some(task.to_owned())),
        ..cli.endpoints.clone()
    };
    // A task with no Deployment yet, or Secrets the user may not read, still has a status to
    // show: what could not be found is said in the view.
    let (endpoints, unfound) = match endpoints.resolved(&cli.cluster).await {
        Ok(endpoints) => (endpoints, None),
        Err(Failure::Error(e)) => (cli.endpoints.clone(), Some(format!("{e:#}"))),
        Err(other) => return Err(other),
    };
    Ok(TaskServers {
        conductor: endpoints.conductor()?,
        // lakeFS only adds the publications' metadata; its absence is said there.
        lakefs: endpoints.lakefs().ok(),
        unfound,
    })
}

struct TaskServers {
    conductor: Option<ConductorClient>,
    lakefs: Option<LakeFsClient>,
    unfound: Option<String>,
}

impl TaskServers {
    fn none() -> Self {
        Self {
            conductor: None,
            lakefs: None,
            unfound: None,
        }
    }
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
        | Command::Rollout(_)
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
