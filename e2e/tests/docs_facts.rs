//! What the documentation names exists in the code, so that a renamed setting cannot leave a
//! guide behind:
//! - every `PERAGO_…` environment variable named in the README, CONTRIBUTING, `docs/` or the
//!   chart's README is named in the source tree (the crates, scripts, chart, Makefile, CI);
//! - every `--flag` given to `perago-operator`, `perago-sidecar` or `kubectl perago` in those
//!   documents, and every flag in the inline code of the three binaries' own pages, is defined
//!   by the Rust sources of the binaries and the crates they use;
//! - where a document gives the CRD's size ("the CRD is about N KB"), it is within a tenth of
//!   the committed CRD's;
//! - the ADR index lists every record with the `Status:` line the record carries, and each
//!   record amended or superseded by another is named by that one's `Amends:` line.
//!
//! The CHANGELOG is not read: release notes may name what a release removed.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn relative(path: &Path) -> String {
    let root = root().canonicalize().unwrap();
    let path = path.canonicalize().unwrap();
    path.strip_prefix(&root)
        .unwrap_or(&path)
        .display()
        .to_string()
}

/// Files under `dir`, without build output, hidden directories or Python caches.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !(name == "target" || name == "__pycache__" || name.starts_with('.')) {
                    dirs.push(path);
                }
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_markdown(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "md")
}

/// The documents a user reads.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("CONTRIBUTING.md"),
        root().join("charts/perago-operator/README.md"),
    ];
    files.extend(
        files_under(&root().join("docs"))
            .into_iter()
            .filter(|p| is_markdown(p)),
    );
    files.retain(|p| p.exists());
    files
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned()
}

/// The source tree: everything but Markdown, under the directories that hold code, scripts,
/// the chart and the deployment files, and the top-level build files. This file is left out:
/// its own examples must not count as definitions.
fn source_files() -> Vec<PathBuf> {
    let dirs = [
        "api",
        "conductor",
        "contract",
        "lakefs",
        "operator",
        "plugin",
        "runner",
        "sidecar",
        "telemetry",
        "workspace",
        "e2e",
        "python",
        "fuzz",
        "deploy",
        "charts",
        "crds",
        ".ci",
        ".cargo",
    ];
    let mut files: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| files_under(&root().join(d)))
        .filter(|p| !is_markdown(p) && !p.ends_with("e2e/tests/docs_facts.rs"))
        .collect();
    for top in ["Makefile", "Dockerfile", "Cargo.toml"] {
        files.push(root().join(top));
    }
    files
}

/// The Rust sources of the three binaries and the crates whose flags they take.
fn flag_sources() -> String {
    [
        "operator",
        "sidecar",
        "plugin",
        "runner",
        "lakefs",
        "conductor",
        "telemetry",
        "workspace",
        "contract",
        "api",
    ]
    .iter()
    .flat_map(|d| files_under(&root().join(d).join("src")))
    .filter(|p| p.extension().is_some_and(|e| e == "rs"))
    .map(|p| read(&p))
    .collect::<Vec<_>>()
    .join("\n")
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// A name found in a text: `PERAGO_X_Y`, or a prefix (`PERAGO_BENCH_` in `PERAGO_BENCH_*`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone)]
enum Variable {
    Name(String),
    Prefix(String),
}

/// Every `PERAGO_…` name in `text` with the (1-based) line it is on. `PERAGO_` alone (a
/// placeholder such as `PERAGO_…`) is not a name.
fn variables(text: &str) -> Vec<(usize, Variable)> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find("PERAGO_") {
            let start = from + at;
            from = start + "PERAGO_".len();
            if line[..start].chars().next_back().is_some_and(is_word) {
                continue;
            }
            let rest: String = line[from..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            from += rest.len();
            if rest.trim_matches('_').is_empty() {
                continue;
            }
            let name = format!("PERAGO_{}", rest.trim_end_matches('_'));
            out.push((
                number + 1,
                if rest.ends_with('_') {
                    Variable::Prefix(name)
                } else {
                    Variable::Name(name)
                },
            ));
        }
    }
    out
}

#[test]
fn every_environment_variable_the_docs_name_is_in_the_code() {
    let defined: BTreeSet<String> = source_files()
        .iter()
        .flat_map(|p| variables(&read(p)))
        .filter_map(|(_, v)| match v {
            Variable::Name(name) => Some(name),
            Variable::Prefix(_) => None,
        })
        .collect();
    assert!(
        defined.contains("PERAGO_CONDUCTOR_URL"),
        "the source tree was not read: {} names",
        defined.len()
    );
    let mut missing = Vec::new();
    for doc in documents() {
        for (line, variable) in variables(&read(&doc)) {
            let (known, name) = match &variable {
                Variable::Name(name) => (defined.contains(name), name.clone()),
                Variable::Prefix(prefix) => (
                    defined.iter().any(|d| d.starts_with(&format!("{prefix}_"))),
                    format!("{prefix}_*"),
                ),
            };
            if !known {
                missing.push(format!("{}:{line}: {name}", relative(&doc)));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "environment variables the docs name but no source file does (renamed or removed? fix \
         the doc):\n{}",
        missing.join("\n")
    );
}

/// The code of a Markdown line: the whole line inside a fenced block, else its inline code
/// spans.
fn code_segments(text: &str) -> Vec<(usize, bool, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            out.push((number + 1, true, line.to_owned()));
        } else {
            for span in line.split('`').skip(1).step_by(2) {
                out.push((number + 1, false, span.to_owned()));
            }
        }
    }
    out
}

/// The flag a token names: `--queue-poll-seconds` of `--queue-poll-seconds=2]`.
fn flag(token: &str) -> Option<String> {
    let token = token.trim_start_matches(['[', '(']);
    let name = token.strip_prefix("--")?;
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return None;
    }
    Some(
        name.chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect::<String>()
            .trim_end_matches('-')
            .to_owned(),
    )
}

/// The three binaries as commands, and their packages (for `cargo run -p … --`).
const BINARIES: [&str; 5] = [
    "perago-operator",
    "perago-sidecar",
    "kubectl-perago",
    "kubectl perago",
    "perago-kubectl",
];

/// The flags given to one of the three binaries in a line of code: what follows the binary's
/// name up to the end of its command (a pipe, `&&`, `;`, or `--` before a body's command). The
/// name counts as a command where it starts the line, a prompt, a subshell or a pipe, and as
/// the package of `cargo run -p … --`; not as an argument (`helm install perago-operator`,
/// `cargo test -p perago-sidecar`).
fn invoked_flags(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for binary in BINARIES {
        let mut from = 0;
        while let Some(at) = code[from..].find(binary) {
            let start = from + at;
            from = start + binary.len();
            if code[from..]
                .chars()
                .next()
                .is_some_and(|c| !c.is_whitespace())
            {
                continue;
            }
            // A path to the binary (`target/release/perago-operator`) starts where the path does.
            let mut before = &code[..start];
            if before.ends_with('/') {
                before = before.trim_end_matches(|c: char| !c.is_whitespace() && c != '(');
            }
            let before = before.trim_end();
            let mut tokens = code[from..].split_whitespace().peekable();
            let command = if before.ends_with("-p") && before.contains("cargo run") {
                // `cargo run -p perago-operator -- check …`: the binary's flags follow `--`.
                tokens.next_if_eq(&"--").is_some()
            } else {
                before.is_empty()
                    || before.ends_with(['$', '(', '|', ';'])
                    || before.ends_with("&&")
            };
            if !command {
                continue;
            }
            for token in tokens {
                if token == "--" || token.starts_with(['|', ';', ')']) || token.starts_with("&&") {
                    break;
                }
                out.extend(flag(token));
            }
        }
    }
    out
}

fn defines_flag(sources: &str, name: &str) -> bool {
    if sources.contains(&format!("\"{name}\"")) || sources.contains(&format!("--{name}")) {
        return true;
    }
    let ident = name.replace('-', "_");
    let mut from = 0;
    while let Some(at) = sources[from..].find(&ident) {
        let start = from + at;
        from = start + ident.len();
        let before = sources[..start].chars().next_back();
        let after = sources[from..].chars().next();
        if !before.is_some_and(is_word) && !after.is_some_and(is_word) {
            return true;
        }
    }
    false
}

#[test]
fn every_flag_the_docs_give_a_binary_is_defined() {
    let sources = flag_sources();
    assert!(defines_flag(&sources, "queue-poll-seconds"));
    // The binaries' own pages: every flag in their inline code is theirs.
    let pages = [
        "docs/operator.md",
        "docs/sidecar.md",
        "docs/kubectl-perago.md",
    ];
    let mut missing = BTreeSet::new();
    let mut checked = 0;
    for doc in documents() {
        let own_page = pages.iter().any(|p| doc.ends_with(p));
        for (line, fenced, code) in code_segments(&read(&doc)) {
            let mut flags = invoked_flags(&code);
            if own_page && !fenced {
                flags.extend(code.split_whitespace().filter_map(flag));
            }
            for name in flags {
                checked += 1;
                if !defines_flag(&sources, &name) {
                    missing.insert(format!("{}:{line}: --{name}", relative(&doc)));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} flags found in the docs");
    assert!(
        missing.is_empty(),
        "flags the docs give perago-operator, perago-sidecar or kubectl perago that their \
         sources do not define (renamed or removed? fix the doc):\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_crd_size_the_docs_give_is_the_crds() {
    let size = std::fs::metadata(root().join("crds/peragotasks.perago.io.yaml"))
        .unwrap()
        .len();
    let mut wrong = Vec::new();
    for doc in documents() {
        for (number, line) in read(&doc).lines().enumerate() {
            let Some(at) = line.find("CRD is about ") else {
                continue;
            };
            let figure: String = line[at + "CRD is about ".len()..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let Ok(kb) = figure.parse::<f64>() else {
                continue;
            };
            let actual = size as f64 / 1000.0;
            if (kb - actual).abs() > actual / 10.0 {
                wrong.push(format!(
                    "{}:{}: about {kb} KB, but crds/ holds {size} bytes",
                    relative(&doc),
                    number + 1
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the CRD's size in the docs:\n{}",
        wrong.join("\n")
    );
}

/// The ADR numbers linked in a line (`[0027](0027-….md)`).
fn adr_numbers(line: &str) -> BTreeSet<String> {
    line.split('[')
        .skip(1)
        .filter_map(|part| {
            let number = part.split(']').next()?;
            (number.len() == 4 && number.chars().all(|c| c.is_ascii_digit()))
                .then(|| number.to_owned())
        })
        .collect()
}

#[test]
fn the_adr_index_lists_every_record_with_its_status() {
    let dir = root().join("docs/adr");
    let index = read(&dir.join("README.md"));
    let listed: BTreeMap<String, String> = index
        .lines()
        .filter(|l| l.starts_with("| ["))
        .map(|l| {
            let cells: Vec<&str> = l.trim().trim_matches('|').split(" | ").collect();
            let file = cells[0]
                .split("](")
                .nth(1)
                .unwrap()
                .trim_end_matches(')')
                .to_owned();
            (file, cells.last().unwrap().trim().to_owned())
        })
        .collect();
    let mut problems = Vec::new();
    let mut amended_by: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut amends: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let records: Vec<PathBuf> = files_under(&dir)
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_string_lossy().as_bytes()[0].is_ascii_digit())
        .collect();
    assert!(records.len() >= 33, "{} records", records.len());
    for path in &records {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let number = file[..4].to_owned();
        let text = read(path);
        let head: Vec<&str> = text.lines().take(6).collect();
        if !head[0].starts_with(&format!("# ADR {number}: ")) {
            problems.push(format!("{file}: the title is not `# ADR {number}: …`"));
        }
        let Some(status) = head.iter().find_map(|l| l.strip_prefix("Status: ")) else {
            problems.push(format!("{file}: no `Status:` line under the title"));
            continue;
        };
        if !["Accepted", "Amended by ", "Superseded by "]
            .iter()
            .any(|s| status.starts_with(s))
        {
            problems.push(format!(
                "{file}: status `{status}` is not Accepted, Amended by or Superseded by"
            ));
        }
        amended_by.insert(number.clone(), adr_numbers(status));
        if let Some(line) = head.iter().find_map(|l| l.strip_prefix("Amends: ")) {
            amends.insert(number.clone(), adr_numbers(line));
        }
        match listed.get(&file) {
            None => problems.push(format!("{file}: not in docs/adr/README.md")),
            Some(indexed) if indexed != status => problems.push(format!(
                "{file}: the index says `{indexed}`, the record `{status}`"
            )),
            Some(_) => {}
        }
    }
    for file in listed.keys() {
        if !dir.join(file).exists() {
            problems.push(format!(
                "docs/adr/README.md lists {file}, which does not exist"
            ));
        }
    }
    for (earlier, later) in &amended_by {
        for number in later {
            if !amends.get(number).is_some_and(|a| a.contains(earlier)) {
                problems.push(format!(
                    "ADR {earlier} is amended or superseded by {number}, whose `Amends:` line \
                     does not name {earlier}"
                ));
            }
        }
    }
    for (later, earlier) in &amends {
        for number in earlier {
            if !amended_by.get(number).is_some_and(|a| a.contains(later)) {
                problems.push(format!(
                    "ADR {later} amends {number}, whose `Status:` line does not name {later}"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "ADR statuses:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_scanners_read_what_they_should() {
    assert_eq!(
        variables("set `PERAGO_A_B=1` or PERAGO_BENCH_* but not XPERAGO_C, `PERAGO_…`"),
        [
            (1, Variable::Name("PERAGO_A_B".into())),
            (1, Variable::Prefix("PERAGO_BENCH".into()))
        ]
    );
    assert_eq!(
        invoked_flags("cargo run -p perago-operator -- render -f x.yaml --conductor-url http://c"),
        ["conductor-url"]
    );
    assert_eq!(
        invoked_flags("kubectl perago gc --repository R [--older-than 24h] | head --lines 2"),
        ["repository", "older-than"]
    );
    assert_eq!(
        invoked_flags("perago-sidecar local --runner r -- sh --not-ours"),
        ["runner"]
    );
    assert!(invoked_flags("helm install perago-operator --wait").is_empty());
    assert!(invoked_flags("cargo test -p perago-sidecar --test faults").is_empty());
    assert!(invoked_flags("cargo run -p perago-kubectl --release").is_empty());
    assert_eq!(
        invoked_flags("./target/release/perago-operator run --http-addr=0.0.0.0:8080"),
        ["http-addr"]
    );
    assert!(defines_flag(
        "#[arg(long)]\n    watch_namespaces: Vec<String>,",
        "watch-namespaces"
    ));
    assert!(!defines_flag(
        "let watch_namespaces_all = 1;",
        "watch-namespaces"
    ));
    assert_eq!(
        adr_numbers("Amended by [0027](0027-x.md), [0030](0030-y.md)"),
        ["0027".to_owned(), "0030".to_owned()].into_iter().collect()
    );
}

/// The images are built with the toolchain every other build uses (rust-toolchain.toml), and
/// the crates claim that toolchain as their minimum.
#[test]
fn the_dockerfile_and_the_crates_name_the_pinned_toolchain() {
    let pinned = read(&root().join("rust-toolchain.toml"));
    let channel = pinned
        .lines()
        .find_map(|l| l.strip_prefix("channel = "))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_else(|| panic!("rust-toolchain.toml names no channel"));
    let dockerfile = read(&root().join("Dockerfile"));
    assert!(
        dockerfile.contains(&format!("ARG RUST_VERSION={channel}\n")),
        "the Dockerfile's RUST_VERSION is not {channel}, the channel of rust-toolchain.toml"
    );
    let minor: String = channel.split('.').take(2).collect::<Vec<_>>().join(".");
    let manifest = read(&root().join("Cargo.toml"));
    assert!(
        manifest.contains(&format!("rust-version = \"{minor}\"\n")),
        "Cargo.toml's rust-version is not {minor}, the toolchain rust-toolchain.toml pins"
    );
}

/// The commands the README's quickstart shows are the quickstart's own, which a node test
/// runs as written (e2e/tests/installs/quickstart.rs); `make release` is this repository's.
#[test]
fn the_readmes_quickstart_commands_are_the_quickstarts() {
    let readme = read(&root().join("README.md"));
    let quickstart = read(&root().join("docs/quickstart.md"));
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Quickstart"))
        .unwrap_or_else(|| panic!("README.md has no Quickstart section"));
    let mut in_block = false;
    let mut drifted = Vec::new();
    for line in section.lines() {
        match line.trim() {
            "```sh" => in_block = true,
            "```" => in_block = false,
            command
                if in_block
                    && !command.starts_with("make release")
                    && !quickstart.lines().any(|l| l == line) =>
            {
                drifted.push(line.to_owned());
            }
            _ => {}
        }
    }
    assert!(
        drifted.is_empty(),
        "README.md's quickstart shows lines docs/quickstart.md does not have:\n{}",
        drifted.join("\n")
    );
}
