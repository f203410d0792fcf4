//! docs/quickstart.md, run as written on the real node, so the page cannot drift from what
//! works: every ```sh block in order, in one bash (`set -euo pipefail`) from the repository's
//! top directory, with the harness's helm, kubectl and kubectl-perago on PATH.
//!
//! The page's first block sets the values that differ between clusters; the test skips it and
//! sets those variables itself (the release in the node's registry, the harness's Conductor and
//! lakeFS), after checking the block sets exactly the variables it provides. What else stands in
//! for a user's cluster: the registry serves plain HTTP, so `helm` is a wrapper adding
//! `--plain-http` to its `oci://` commands, and the body image the examples name (Docker Hub's
//! busybox) is the node's side-loaded busybox body image, tagged with that name.
//!
//! After the page's last block, the test checks the end state itself: the workflow completed,
//! both steps did, the published commit is `main`'s head with the step's `perago.*` metadata
//! and the counts file, the operator and the tasks are gone and the namespaces going. The page
//! installs and uninstalls its own release (`perago-operator` in `perago-system`); the test's
//! turn waits until `perago-system`, which the page deletes, is gone (the next test installs
//! there), and cleans up after a failed block.
//! To run it alone: `cargo test -p perago-e2e --test installs -- quickstart`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use perago_e2e::cluster::{Cluster, OPERATOR_NAMESPACE};
use perago_e2e::lake::Lake;
use perago_e2e::node::{BUSYBOX_BODY_IMAGE, ctr};
use perago_e2e::pod::ConductorApi;
use perago_e2e::process::{obtain, release_binaries};
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, shared};

use super::Turn;

/// How long one block of the page may take (its own waits are shorter).
const BLOCK_LIMIT: Duration = Duration::from_secs(600);
const REPOSITORY: &str = "quickstart";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One shell block of the page, with the heading it sits under.
struct Block {
    heading: String,
    line: usize,
    text: String,
}

/// The ```sh and ```bash blocks of a Markdown page, in order.
fn shell_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut heading = String::new();
    // The block being read, and whether it is a shell block (others are skipped).
    let mut open: Option<(Block, bool)> = None;
    for (n, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (open.take(), fence) {
            (Some((block, shell)), Some(_)) => {
                if shell {
                    blocks.push(block);
                }
            }
            (Some((mut block, shell)), None) => {
                block.text.push_str(line);
                block.text.push('\n');
                open = Some((block, shell));
            }
            (None, Some(info)) => {
                let block = Block {
                    heading: heading.clone(),
                    line: n + 2,
                    text: String::new(),
                };
                open = Some((block, matches!(info.trim(), "sh" | "bash")));
            }
            (None, None) if line.starts_with('#') => {
                heading = line.trim_start_matches('#').trim().into();
            }
            (None, None) => {}
        }
    }
    assert!(
        open.is_none(),
        "docs/quickstart.md has an unclosed code block"
    );
    blocks
}

/// The variables a values block sets (`export NAME=…` lines; comments and blank lines aside).
fn exported(block: &Block) -> Vec<String> {
    block
        .text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            l.strip_prefix("export ")
                .and_then(|l| l.split_once('='))
                .map(|(name, _)| name.to_owned())
                .unwrap_or_else(|| {
                    panic!(
                        "the first block of docs/quickstart.md (line {}) sets the reader's values \
                         and may hold only `export NAME=…` lines, not {l:?}",
                        block.line
                    )
                })
        })
        .collect()
}

/// Where a reference without a registry is pulled from, as containerd names it.
fn normalized(image: &str) -> String {
    let first = image.split('/').next().unwrap_or("");
    if image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost") {
        image.to_owned()
    } else if image.contains('/') {
        format!("docker.io/{image}")
    } else {
        format!("docker.io/library/{image}")
    }
}

/// A directory with the harness's kubectl, kubectl-perago and a `helm` that adds
/// `--plain-http` to commands on `oci://` references (the node's registry serves plain HTTP).
fn tools(dir: &Path) -> PathBuf {
    let bin = dir.join("quickstart-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let plugin = release_binaries(&["kubectl-perago"], "the quickstart runs kubectl perago")
        .unwrap()
        .join("kubectl-perago");
    for (name, target) in [
        ("kubectl", obtain("kubectl").unwrap()),
        ("kubectl-perago", plugin),
    ] {
        let link = bin.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target, link).unwrap();
    }
    let helm = obtain("helm").unwrap();
    let wrapper = bin.join("helm");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n# The node's registry serves plain HTTP.\ncase \" $* \" in\n  \
             *' oci://'*) exec '{helm}' \"$@\" --plain-http ;;\nesac\nexec '{helm}' \"$@\"\n",
            helm = helm.display()
        ),
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&wrapper).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&wrapper, permissions).unwrap();
    bin
}

/// A bash that runs blocks one after another, keeping its variables between them.
struct Shell {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    dir: PathBuf,
}

/// A block that failed: what the shell printed, and how it ended.
struct Failed {
    output: String,
    why: String,
}

impl Shell {
    fn start(dir: &Path, env: &[(String, String)]) -> Self {
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .current_dir(repo())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut shell = Self {
            child,
            lines,
            dir: dir.to_owned(),
        };
        shell.send("set -euo pipefail\nexec 2>&1\n");
        shell
    }

    fn send(&mut self, text: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        // A shell that has exited shows up when its output ends.
        let _ = stdin.write_all(text.as_bytes());
        let _ = stdin.flush();
    }

    /// Run block `n` (from a file, its standard input empty, so that nothing in it reads the
    /// commands that follow) and return its output.
    fn run(&mut self, n: usize, text: &str) -> Result<String, Failed> {
        let file = self.dir.join(format!("block-{n}.sh"));
        std::fs::write(&file, text).unwrap();
        let done = format!("::quickstart block {n} done::");
        self.send(&format!(
            "source '{}' </dev/null\nprintf '\\n%s\\n' '{done}'\n",
            file.display()
        ));
        let started = Instant::now();
        let mut output = String::new();
        loop {
            let left = BLOCK_LIMIT.saturating_sub(started.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == done => return Ok(output),
                Ok(line) => {
                    eprintln!("  | {line}");
                    output.push_str(&line);
                    output.push('\n');
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    return Err(Failed {
                        output,
                        why: format!("still running after {BLOCK_LIMIT:?}"),
                    });
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().unwrap();
                    return Err(Failed {
                        output,
                        why: format!("the shell exited ({status})"),
                    });
                }
            }
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn the_quickstart_runs_as_written() {
    if perago_e2e::node_opted_out("the_quickstart_runs_as_written") {
        return;
    }
    let page = std::fs::read_to_string(repo().join("docs/quickstart.md")).unwrap();
    let mut blocks = shell_blocks(&page);
    assert!(
        blocks.len() > 1,
        "docs/quickstart.md has no shell blocks to run"
    );
    let values = blocks.remove(0);
    // What the page asks of the reader's machine beside kubectl, helm and kubectl perago.
    for (tool, package) in [("curl", "curl"), ("jq", "jq"), ("bash", "bash")] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "docs/quickstart.md needs `{tool}` on PATH: install the Debian package {package}"
        );
    }

    let services = shared(Selection::ALL).await;
    let mut turn = Turn::take("quickstart::the_quickstart_runs_as_written", services).await;
    // What the page installs and makes (its first blocks), for the turn to clean up.
    turn.release("perago-operator", OPERATOR_NAMESPACE);
    turn.namespace("quickstart");
    let node = services.node();
    let cluster = Cluster::new(services).unwrap();
    let dir = services.dir().join("quickstart");
    std::fs::create_dir_all(&dir).unwrap();

    // The values of the page's first block, as this cluster has them.
    let provided = [
        ("REGISTRY", node.registry.prefix()),
        ("VERSION", node.release.version.clone()),
        ("CONDUCTOR_URL", services.conductor().api_url.clone()),
        ("LAKEFS_URL", services.lakefs().endpoint.clone()),
        ("CONDUCTOR_API", services.conductor().api_url.clone()),
        ("LAKEFS_API", services.lakefs().endpoint.clone()),
        (
            "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
            LAKEFS_ACCESS_KEY_ID.into(),
        ),
        (
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            LAKEFS_SECRET_ACCESS_KEY.into(),
        ),
        (
            "LAKEFS_STORAGE_NAMESPACE",
            services.lakefs().namespace(REPOSITORY),
        ),
    ];
    let mut documented = exported(&values);
    documented.sort();
    let mut names: Vec<String> = provided.iter().map(|(k, _)| (*k).to_owned()).collect();
    names.sort();
    assert_eq!(
        documented, names,
        "the values block of docs/quickstart.md (line {}) and the values this test provides differ",
        values.line
    );

    // The examples' body images, as the node's busybox.
    let tasks =
        std::fs::read_to_string(repo().join("deploy/examples/quickstart-tasks.yaml")).unwrap();
    for task in perago_e2e::yaml_documents(&tasks) {
        let image = task["spec"]["executor"]["body"]["image"].as_str().unwrap();
        ctr(
            &node.containerd.socket,
            &[
                "images",
                "tag",
                "--force",
                BUSYBOX_BODY_IMAGE,
                &normalized(image),
            ],
        )
        .unwrap();
    }

    let bin = tools(&dir);
    let mut env: Vec<(String, String)> = provided
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    env.push((
        "PATH".into(),
        format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    ));
    env.push((
        "KUBECONFIG".into(),
        cluster.kubeconfig().display().to_string(),
    ));

    let started = Instant::now();
    let mut shell = Shell::start(&dir, &env);
    let mut seconds = Vec::new();
    for (n, block) in blocks.iter().enumerate() {
        eprintln!(
            "[quickstart] block {} of {} ({}, line {})",
            n + 1,
            blocks.len(),
            block.heading,
            block.line
        );
        let t0 = Instant::now();
        if let Err(failed) = shell.run(n, &block.text) {
            let pods = cluster
                .kubectl(&["get", "pods", "-A", "-o", "wide"])
                .unwrap_or_default();
            panic!(
                "docs/quickstart.md's block at line {} (under \"{}\") failed: {}\n\
                 --- the block:\n{}--- its output:\n{}--- the cluster's pods:\n{pods}",
                block.line, block.heading, failed.why, block.text, failed.output
            );
        }
        seconds.push((block.line, t0.elapsed()));
    }
    let ids = shell
        .run(blocks.len(), "printf '%s\\n' \"$WORKFLOW_ID\" \"$INPUT\"\n")
        .unwrap_or_else(|f| panic!("reading the page's variables: {}\n{}", f.why, f.output));
    drop(shell);
    let took = started.elapsed();
    let mut ids = ids.lines().filter(|l| !l.is_empty());
    let (workflow_id, input) = (
        ids.next().unwrap().to_owned(),
        ids.next().unwrap().to_owned(),
    );

    // The end state, checked here and not only by the page's exit statuses.
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = conductor.workflow(&workflow_id).await;
    assert_eq!(workflow["status"], "COMPLETED", "{workflow:#}");
    let steps: Vec<_> = workflow["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["referenceTaskName"].as_str().unwrap(),
                t["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [("count_words", "COMPLETED"), ("announce", "COMPLETED")],
        "{workflow:#}"
    );
    assert_eq!(workflow["output"]["message"], "2 books, 15 words");
    let published = workflow["output"]["published"].as_str().unwrap();
    assert_ne!(published, input, "the step published nothing");

    let lake = Lake::of(services.lakefs());
    let main = lake
        .get(&format!("/repositories/{REPOSITORY}/branches/main"))
        .await
        .unwrap();
    assert_eq!(
        main["commit_id"], published,
        "main's head is not the publication"
    );
    let commit = lake
        .get(&format!("/repositories/{REPOSITORY}/commits/{published}"))
        .await
        .unwrap();
    let metadata = &commit["metadata"];
    for (key, value) in [
        ("perago.phase", "confirm"),
        ("perago.workflow_instance_id", workflow_id.as_str()),
        ("perago.task_def_name", "quickstart.word_count"),
        ("perago.reference_task_name", "count_words"),
        ("perago.input_ref", input.as_str()),
        ("perago.target_branch", "main"),
    ] {
        assert_eq!(metadata[key], value, "{key} of {published}: {commit:#}");
    }
    let counts = lake
        .object(REPOSITORY, published, "books/counts/words.txt")
        .await
        .unwrap();
    assert!(
        counts.contains("tale.txt 12") && counts.contains("moby.txt 3"),
        "{counts}"
    );

    // Uninstalled: no release, no PeragoTask, the namespaces gone or going.
    let releases = cluster.helm(&["list", "-A", "-q"]).unwrap();
    assert!(!releases.contains("perago-operator"), "{releases}");
    let tasks = cluster
        .kubectl(&["get", "peragotasks", "-A", "-o", "name"])
        .unwrap();
    assert!(tasks.trim().is_empty(), "{tasks}");
    for namespace in ["quickstart", "perago-system"] {
        let deleting = cluster.kubectl(&[
            "get",
            "namespace",
            namespace,
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ]);
        assert!(
            deleting.as_ref().map_or(true, |t| !t.is_empty()),
            "namespace {namespace} is not being deleted: {deleting:?}"
        );
    }

    let slowest: Vec<String> = seconds
        .iter()
        .map(|(line, t)| format!("line {line}: {:.1}s", t.as_secs_f64()))
        .collect();
    eprintln!(
        "[quickstart] the page ran in {:.1?} ({})",
        took,
        slowest.join(", ")
    );
}
