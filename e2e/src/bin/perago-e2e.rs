//! `perago-e2e up [--services all|conductor,lakefs,kube,node] [--env-file FILE]`
//!
//! Starts the real servers, prints (and optionally writes) the environment a client needs,
//! and keeps them running until interrupted (Ctrl-C or SIGTERM), then stops them all.

use anyhow::{Context, Result, bail};
use perago_e2e::{Selection, Services};

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut selection, mut env_file) = (Selection::ALL, None);
    match args.next().as_deref() {
        Some("up") => {}
        _ => bail!(
            "usage: perago-e2e up [--services all|conductor,lakefs,kube,node] [--env-file FILE]"
        ),
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--services" => {
                selection = Selection::parse(&args.next().context("--services needs a value")?)?
            }
            "--env-file" => env_file = Some(args.next().context("--env-file needs a value")?),
            other => bail!("unknown argument '{other}'"),
        }
    }
    let services = Services::start(selection).await?;
    let text: String = services
        .env()
        .iter()
        .map(|(k, v)| format!("export {k}={v}\n"))
        .collect();
    print!("{text}");
    if let Some(path) = &env_file {
        std::fs::write(path, &text).with_context(|| format!("writing {path}"))?;
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
