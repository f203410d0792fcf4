//! Starting third-party servers as watched child processes, and waiting for them to be ready.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The repository's `e2e/bin` directory (scripts the harness calls).
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bin")
}

/// Path of a cached third-party build, obtaining (building or downloading) it when missing.
pub fn obtain(component: &str) -> Result<PathBuf> {
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(bin_dir().join("obtain"))
        .arg(component)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running e2e/bin/obtain {component}"))?;
    if !out.status.success() {
        bail!("e2e/bin/obtain {component} failed (see its output above)");
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let path = line
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("e2e/bin/obtain {component} printed {line:?}"))?;
    if started.elapsed() > Duration::from_secs(5) {
        eprintln!("[e2e] obtained {component} in {:.0?}", started.elapsed());
    }
    Ok(PathBuf::from(path))
}

/// Run a command that must succeed and return its standard output. For tests: a failure
/// panics with the command line, its exit status and its standard error.
pub fn stdout_of(command: &mut Command) -> String {
    let shown = format!("{command:?}");
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A free TCP port. The port is released before returning; the short window in which another
/// process could take it is acceptable for tests.
///
/// It is free on every address (the wildcard is bound, so a server already listening on the
/// node's bridge address keeps its port), and one process never hands the same port out twice:
/// servers started together pick their ports before any of them binds.
pub fn free_port() -> Result<u16> {
    static HANDED_OUT: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    for _ in 0..64 {
        let listener = TcpListener::bind("0.0.0.0:0").context("binding an ephemeral TCP port")?;
        let port = listener.local_addr()?.port();
        if HANDED_OUT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(port)
        {
            return Ok(port);
        }
    }
    bail!("no ephemeral TCP port that this process has not handed out already")
}

/// Start `e2e/bin/janitor`, which removes `dir` once this process has exited, however it
/// exits. It runs in its own process group, so a Ctrl-C of the test run does not stop it.
pub fn remove_after_exit(dir: &Path) -> Result<Child> {
    Command::new(bin_dir().join("janitor"))
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting the janitor of {}", dir.display()))
}

/// A command again: the same program, arguments, environment and directory.
fn copy_of(command: &Command) -> Command {
    let mut copy = Command::new(command.get_program());
    copy.args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => copy.env(key, value),
            None => copy.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        copy.current_dir(dir);
    }
    copy
}

/// A server that can be crashed and started again: the command it runs, and its process
/// while it is up. Dropping it stops the process.
pub struct Restartable {
    command: Command,
    process: std::sync::Mutex<Option<ServerProcess>>,
}

impl Restartable {
    /// A server whose every start runs `command` (it is not started here).
    pub fn new(command: Command) -> Self {
        Self {
            command,
            process: std::sync::Mutex::new(None),
        }
    }

    /// A server `command` started as `process`.
    pub fn running(command: Command, process: ServerProcess) -> Self {
        Self {
            command,
            process: std::sync::Mutex::new(Some(process)),
        }
    }

    /// Start the server: `start` spawns a copy of the command and waits until it serves.
    pub async fn start(
        &self,
        start: impl AsyncFnOnce(Command) -> Result<ServerProcess>,
    ) -> Result<()> {
        let process = start(copy_of(&self.command)).await?;
        *self.slot() = Some(process);
        Ok(())
    }

    /// Kill the server at once (SIGKILL: a crash, every call in flight cut), leave it down for
    /// `down`, and [`start`](Self::start) it again.
    pub async fn crash_and_restart(
        &self,
        down: Duration,
        start: impl AsyncFnOnce(Command) -> Result<ServerProcess>,
    ) -> Result<()> {
        self.restart(ServerProcess::kill, down, start).await
    }

    /// As [`crash_and_restart`](Self::crash_and_restart), but what the server started and
    /// let go of keeps running: containerd's shims and their containers outlive a containerd
    /// restart on a real node.
    pub async fn crash_alone_and_restart(
        &self,
        down: Duration,
        start: impl AsyncFnOnce(Command) -> Result<ServerProcess>,
    ) -> Result<()> {
        self.restart(ServerProcess::kill_alone, down, start).await
    }

    /// Kill the server at once (SIGKILL) and leave it down until [`start`](Self::start).
    pub async fn crash(&self) -> Result<()> {
        self.stop(ServerProcess::kill).await
    }

    /// As [`crash`](Self::crash), what the server started living on.
    pub async fn crash_alone(&self) -> Result<()> {
        self.stop(ServerProcess::kill_alone).await
    }

    async fn stop(&self, kill: fn(ServerProcess)) -> Result<()> {
        let process = self.slot().take();
        if let Some(process) = process {
            tokio::task::spawn_blocking(move || kill(process)).await?;
        }
        Ok(())
    }

    async fn restart(
        &self,
        kill: fn(ServerProcess),
        down: Duration,
        start: impl AsyncFnOnce(Command) -> Result<ServerProcess>,
    ) -> Result<()> {
        self.stop(kill).await?;
        tokio::time::sleep(down).await;
        self.start(start).await
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<ServerProcess>> {
        self.process
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A server process. It runs under `e2e/bin/watchdog`, which stops it when this process dies
/// in any way; dropping the handle stops it at once.
pub struct ServerProcess {
    name: String,
    watchdog: Child,
    log: PathBuf,
}

impl ServerProcess {
    pub fn spawn(name: &str, command: &mut Command, log: PathBuf) -> Result<Self> {
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let program = command.get_program().to_owned();
        let args: Vec<_> = command.get_args().map(ToOwned::to_owned).collect();
        let mut watched = Command::new(bin_dir().join("watchdog"));
        watched
            .arg(std::process::id().to_string())
            .arg("--")
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => watched.env(key, value),
                None => watched.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            watched.current_dir(dir);
        }
        let watchdog = watched
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Self {
            name: name.to_owned(),
            watchdog,
            log,
        })
    }

    /// Kill the server and everything it started at once (SIGKILL), as a crash would; the
    /// watchdog then ends.
    pub fn kill(mut self) {
        let watchdog = self.watchdog.id();
        for pid in crate::measure::ProcessTree::new(watchdog).members() {
            if pid != watchdog {
                let pid = nix::unistd::Pid::from_raw(pid as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        let _ = self.watchdog.wait();
    }

    /// Kill the server alone at once (SIGKILL): the processes it started live on.
    pub fn kill_alone(mut self) {
        let watchdog = self.watchdog.id();
        let children =
            std::fs::read_to_string(format!("/proc/{watchdog}/task/{watchdog}/children"))
                .unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.watchdog.wait();
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last lines of the server's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Fail if the server already exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(status) = self.watchdog.try_wait()? {
            bail!(
                "{} exited ({status}) during start-up; log {}:\n{}",
                self.name,
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if matches!(self.watchdog.try_wait(), Ok(Some(_))) {
            return; // already gone (killed)
        }
        // SIGTERM lets the watchdog stop the server gracefully (then SIGKILL after 5 s).
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.watchdog.id().to_string())
            .status();
        let _ = self.watchdog.wait();
    }
}

/// Poll `probe` until it returns true, failing after `limit` or if the server exits.
pub async fn wait_ready<F, Fut>(
    server: &mut ServerProcess,
    limit: Duration,
    mut probe: F,
) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        server.ensure_running()?;
        if probe().await {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            bail!(
                "{} was not ready after {limit:?}; log {}:\n{}",
                server.name,
                server.log.display(),
                server.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The directory of the static release binaries (`make release-binaries`, which `make test`
/// and `make demo` run; `PERAGO_RELEASE_BINARIES` overrides), checked to hold `names`; `why`
/// says in the error what needs them.
pub fn release_binaries(names: &[&str], why: &str) -> Result<PathBuf> {
    let dir = std::env::var_os("PERAGO_RELEASE_BINARIES").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release-binaries"),
        PathBuf::from,
    );
    for name in names {
        if !dir.join(name).is_file() {
            bail!(
                "{} has no {name} ({why}); run `make release-binaries` (make test and make demo do)",
                dir.display()
            );
        }
    }
    Ok(dir)
}
