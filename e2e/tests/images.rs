//! The e2e images that `e2e/bin/images` assembles without a container engine. The operator and
//! sidecar images declare what the Dockerfile's `operator` and `sidecar` stages declare (user,
//! entrypoint, cmd, exposed ports, the files they copy to /usr/local/bin) and carry the release
//! binaries byte for byte, so the images the e2e cluster runs cannot drift from the ones users
//! get. The test images (pause, busybox and compiled task bodies) are checked too, and the two
//! compiled programs are run.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use perago_e2e::process::{bin_dir, remove_after_exit, stdout_of};
use serde_json::Value;
use sha2::{Digest, Sha256};

const BINARIES: [&str; 4] = [
    "perago-operator",
    "perago-sidecar",
    "perago-runner",
    "kubectl-perago",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What one run of e2e/bin/images made.
struct Built {
    release: PathBuf,
    /// Image reference → archive, as the script printed them.
    archives: BTreeMap<String, PathBuf>,
    /// Removes the output directory once the test binary has exited.
    _janitor: std::process::Child,
}

/// The release binaries (built with `make release-binaries` when missing) and the images made
/// from them, once per test binary.
fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let release = repo().join("target/release-binaries");
        if BINARIES.iter().any(|b| !release.join(b).is_file()) {
            eprintln!("[images] building the release binaries: make release-binaries (minutes)");
            let status = Command::new("make")
                .arg("release-binaries")
                .current_dir(repo())
                .stdout(Stdio::inherit())
                .status()
                .expect("running make release-binaries");
            assert!(status.success(), "make release-binaries failed ({status})");
        }
        let out = tempfile::Builder::new()
            .prefix("perago-e2e-images-")
            .tempdir()
            .expect("creating the output directory")
            .keep();
        let janitor =
            remove_after_exit(&out).expect("starting the janitor of the output directory");
        let started = Instant::now();
        let printed = stdout_of(
            Command::new("bash")
                .arg(bin_dir().join("images"))
                .arg(&release)
                .arg(&out),
        );
        eprintln!("[images] assembled in {:.1?}", started.elapsed());
        let archives = printed
            .lines()
            .map(|line| {
                let (image, archive) = line
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("e2e/bin/images printed {line:?}"));
                (image.to_owned(), PathBuf::from(archive))
            })
            .collect();
        Built {
            release,
            archives,
            _janitor: janitor,
        }
    })
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(String),
}

#[derive(Debug, Clone)]
struct Entry {
    kind: Kind,
    uid: u64,
    gid: u64,
    mode: u32,
}

/// One image of an OCI archive: its config, and the files of each layer (paths without a
/// leading slash), read as containerd reads them, digests checked.
struct Image {
    config: Value,
    layers: Vec<BTreeMap<String, Entry>>,
}

impl Image {
    /// The image's file system: the layers applied in order (the builder writes no whiteouts).
    fn files(&self) -> BTreeMap<String, Entry> {
        self.layers
            .iter()
            .flatten()
            .map(|(p, e)| (p.clone(), e.clone()))
            .collect()
    }

    fn file(&self, path: &str) -> Entry {
        self.files()
            .remove(path)
            .unwrap_or_else(|| panic!("/{path} is not in the image"))
    }

    fn config_field(&self, field: &str) -> &Value {
        &self.config["config"][field]
    }

    fn strings(&self, field: &str) -> Option<Vec<String>> {
        let value = self.config_field(field);
        (!value.is_null()).then(|| {
            serde_json::from_value(value.clone())
                .unwrap_or_else(|e| panic!("config {field} is {value}: {e}"))
        })
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// The image named `reference` as e2e/bin/images archived it.
fn image(reference: &str) -> Image {
    let archive = built()
        .archives
        .get(reference)
        .unwrap_or_else(|| panic!("e2e/bin/images printed no {reference}"));
    let file = std::fs::File::open(archive).unwrap();
    let mut blobs = HashMap::new();
    let mut names = Vec::new();
    for entry in tar::Archive::new(file).entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        names.push(path.clone());
        if entry.header().entry_type().is_file() {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            blobs.insert(path, bytes);
        }
    }
    assert_eq!(
        names.first().map(String::as_str),
        Some("index.json"),
        "{}: the archive starts with index.json",
        archive.display()
    );
    assert!(
        blobs.contains_key("oci-layout"),
        "{}: no oci-layout",
        archive.display()
    );
    let blob = |descriptor: &Value| -> &Vec<u8> {
        let digest = descriptor["digest"].as_str().unwrap();
        let bytes = blobs
            .get(&format!("blobs/{}", digest.replacen(':', "/", 1)))
            .unwrap_or_else(|| panic!("{}: no blob {digest}", archive.display()));
        assert_eq!(sha256(bytes), digest, "blob digest");
        assert_eq!(
            descriptor["size"].as_u64(),
            Some(bytes.len() as u64),
            "blob size"
        );
        bytes
    };
    let index: Value = serde_json::from_slice(&blobs["index.json"]).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(
        manifests.len(),
        1,
        "{}: one image per archive",
        archive.display()
    );
    // `ctr images import` names the image after this annotation when it is a full reference.
    assert_eq!(
        manifests[0]["annotations"]["org.opencontainers.image.ref.name"].as_str(),
        Some(reference)
    );
    let manifest: Value = serde_json::from_slice(blob(&manifests[0])).unwrap();
    let config: Value = serde_json::from_slice(blob(&manifest["config"])).unwrap();
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), diff_ids.len(), "one diff_id per layer");
    let layers = layers
        .iter()
        .zip(diff_ids)
        .map(|(layer, diff_id)| {
            assert_eq!(
                layer["mediaType"],
                "application/vnd.oci.image.layer.v1.tar+gzip"
            );
            let mut tar = Vec::new();
            flate2::read::GzDecoder::new(&blob(layer)[..])
                .read_to_end(&mut tar)
                .unwrap();
            assert_eq!(
                Some(sha256(&tar).as_str()),
                diff_id.as_str(),
                "layer diff_id"
            );
            layer_files(&tar)
        })
        .collect();
    Image { config, layers }
}

fn layer_files(tar: &[u8]) -> BTreeMap<String, Entry> {
    let mut files = BTreeMap::new();
    for entry in tar::Archive::new(tar).entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let path = path.trim_start_matches("./").trim_matches('/').to_owned();
        let name = path.rsplit('/').next().unwrap_or_default();
        assert!(!name.starts_with(".wh."), "a whiteout in a layer: {path}");
        let header = entry.header().clone();
        let kind = match header.entry_type() {
            tar::EntryType::Regular => {
                let mut bytes = Vec::new();
                entry.read_to_end(&mut bytes).unwrap();
                Kind::File(bytes)
            }
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink => Kind::Symlink(
                entry
                    .link_name()
                    .unwrap()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            ),
            other => panic!("{path}: unexpected tar entry type {other:?}"),
        };
        if path.is_empty() {
            continue;
        }
        files.insert(
            path,
            Entry {
                kind,
                uid: header.uid().unwrap(),
                gid: header.gid().unwrap(),
                mode: header.mode().unwrap() & 0o7777,
            },
        );
    }
    files
}

/// One final stage of the Dockerfile, as far as the images are concerned.
#[derive(Debug, Default)]
struct Stage {
    from: String,
    /// (source, destination file) of each `COPY --from=build`.
    copies: Vec<(String, String)>,
    user: Option<String>,
    expose: BTreeSet<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
}

/// The stages of the Dockerfile by name. Build instructions of the stages other than `build`
/// that this test does not model fail it, so e2e/bin/images is updated with the Dockerfile.
fn dockerfile() -> BTreeMap<String, Stage> {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(trimmed);
                instructions.push(std::mem::take(&mut pending));
            }
        }
    }
    let mut stages = BTreeMap::new();
    let mut current: Option<String> = None;
    for instruction in instructions {
        let (keyword, rest) = instruction
            .split_once(char::is_whitespace)
            .unwrap_or_default();
        let keyword = keyword.to_ascii_uppercase();
        let rest = rest.trim();
        if keyword == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let (from, name) = match words.as_slice() {
                [from, as_, name] if as_.eq_ignore_ascii_case("as") => (*from, *name),
                _ => panic!("Dockerfile: FROM without a stage name: {instruction}"),
            };
            current = Some(name.to_owned());
            stages.insert(
                name.to_owned(),
                Stage {
                    from: from.to_owned(),
                    ..Stage::default()
                },
            );
            continue;
        }
        let Some(name) = &current else { continue };
        if name == "build" {
            continue;
        }
        let stage = stages.get_mut(name).unwrap();
        let exec_form = |what: &str| -> Vec<String> {
            serde_json::from_str(rest).unwrap_or_else(|e| {
                panic!("Dockerfile stage {name}: {what} is not in exec (JSON) form: {rest}: {e}")
            })
        };
        match keyword.as_str() {
            "COPY" => {
                let mut words: Vec<&str> = rest.split_whitespace().collect();
                assert_eq!(
                    words.first(),
                    Some(&"--from=build"),
                    "Dockerfile stage {name}: only COPY --from=build is modelled: {instruction}"
                );
                words.remove(0);
                let dest = words.pop().unwrap();
                assert!(
                    !words.is_empty() && words.iter().all(|w| !w.starts_with("--")),
                    "Dockerfile stage {name}: unmodelled COPY: {instruction}"
                );
                for source in words {
                    let file = match dest.strip_suffix('/') {
                        Some(dir) => format!("{dir}/{}", source.rsplit('/').next().unwrap()),
                        None => dest.to_owned(),
                    };
                    stage.copies.push((source.to_owned(), file));
                }
            }
            "USER" => stage.user = Some(rest.to_owned()),
            "EXPOSE" => {
                stage.expose.extend(
                    rest.split_whitespace()
                        .map(|port| match port.contains('/') {
                            true => port.to_owned(),
                            false => format!("{port}/tcp"),
                        }),
                )
            }
            "ENTRYPOINT" => stage.entrypoint = Some(exec_form("ENTRYPOINT")),
            "CMD" => stage.cmd = Some(exec_form("CMD")),
            other => panic!(
                "Dockerfile stage {name}: e2e/bin/images does not model {other} ({instruction}); \
                 update it and this test"
            ),
        }
    }
    stages
}

/// The image of a Dockerfile stage declares and holds what the stage does.
fn assert_mirrors_stage(stage_name: &str, reference: &str) {
    let stages = dockerfile();
    let stage = stages
        .get(stage_name)
        .unwrap_or_else(|| panic!("the Dockerfile has no stage {stage_name}"));
    // The builder's base layer stands for this base image.
    assert!(
        stage.from.starts_with("gcr.io/distroless/static") && stage.from.ends_with(":nonroot"),
        "stage {stage_name} is FROM {}; e2e/bin/images imitates distroless static:nonroot",
        stage.from
    );
    let image = image(reference);
    let user = image.config_field("User").as_str().map(str::to_owned);
    assert_eq!(user, stage.user, "{reference}: USER of stage {stage_name}");
    assert_eq!(
        image.strings("Entrypoint"),
        stage.entrypoint,
        "{reference}: ENTRYPOINT of stage {stage_name}"
    );
    assert_eq!(
        image.strings("Cmd"),
        stage.cmd,
        "{reference}: CMD of stage {stage_name}"
    );
    let exposed: BTreeSet<String> = image
        .config_field("ExposedPorts")
        .as_object()
        .map(|ports| ports.keys().cloned().collect())
        .unwrap_or_default();
    assert_eq!(
        exposed, stage.expose,
        "{reference}: EXPOSE of stage {stage_name}"
    );

    // What the stage copies, and nothing else, is in /usr/local/bin and above the base layer.
    let copied: BTreeSet<String> = stage
        .copies
        .iter()
        .map(|(_, dest)| dest.trim_start_matches('/').to_owned())
        .collect();
    let files = image.files();
    let in_bin: BTreeSet<String> = files
        .iter()
        .filter(|(path, e)| path.starts_with("usr/local/bin/") && e.kind != Kind::Dir)
        .map(|(path, _)| path.clone())
        .collect();
    let copied_to_bin: BTreeSet<String> = copied
        .iter()
        .filter(|p| p.starts_with("usr/local/bin/"))
        .cloned()
        .collect();
    assert_eq!(
        in_bin, copied_to_bin,
        "{reference}: /usr/local/bin of stage {stage_name}"
    );
    let above_base: BTreeSet<String> = image.layers[1..]
        .iter()
        .flatten()
        .filter(|(_, e)| e.kind != Kind::Dir)
        .map(|(path, _)| path.clone())
        .collect();
    assert_eq!(above_base, copied, "{reference}: the files the stage adds");

    for (source, dest) in &stage.copies {
        let name = source
            .strip_prefix("/out/")
            .unwrap_or_else(|| panic!("stage {stage_name} copies {source}, not a release binary"));
        let release = std::fs::read(built().release.join(name)).unwrap();
        let entry = &files[dest.trim_start_matches('/')];
        assert!(
            entry.kind == Kind::File(release),
            "{reference}: {dest} is not the release binary {name}"
        );
        assert_eq!(
            (entry.uid, entry.gid, entry.mode),
            (0, 0, 0o755),
            "{reference}: {dest} is root:root 0755"
        );
    }
    assert_distroless_base(&image, reference);
    assert_eq!(
        image.config_field("WorkingDir").as_str(),
        Some("/home/nonroot"),
        "{reference}: distroless nonroot's working directory"
    );
}

/// The base layer that stands for distroless static:nonroot.
fn assert_distroless_base(image: &Image, reference: &str) {
    let base = &image.layers[0];
    let get = |path: &str| {
        base.get(path)
            .unwrap_or_else(|| panic!("{reference}: base layer has no /{path}"))
    };
    let text = |path: &str| match &get(path).kind {
        Kind::File(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        other => panic!("{reference}: /{path} is {other:?}"),
    };
    assert!(
        text("etc/passwd")
            .lines()
            .any(|l| l == "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin"),
        "{reference}: /etc/passwd has nonroot"
    );
    assert!(text("etc/passwd").starts_with("root:x:0:0:"));
    assert!(text("etc/group").lines().any(|l| l == "nonroot:x:65532:"));
    assert!(text("etc/ssl/certs/ca-certificates.crt").contains("BEGIN CERTIFICATE"));
    let tmp = get("tmp");
    assert_eq!((tmp.kind.clone(), tmp.mode), (Kind::Dir, 0o1777), "/tmp");
    let home = get("home/nonroot");
    assert_eq!((home.uid, home.gid), (65532, 65532), "/home/nonroot");
    for (path, entry) in base {
        if path != "home/nonroot" {
            assert_eq!((entry.uid, entry.gid), (0, 0), "{reference}: /{path} owner");
        }
    }
    let env = image.strings("Env").unwrap_or_default();
    for var in [
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
    ] {
        assert!(
            env.iter().any(|e| e == var),
            "{reference}: Env {env:?} lacks {var}"
        );
    }
}

#[test]
fn the_operator_image_is_the_dockerfile_operator_stage() {
    assert_mirrors_stage("operator", "localhost/perago/perago-operator:e2e");
}

#[test]
fn the_sidecar_image_is_the_dockerfile_sidecar_stage() {
    assert_mirrors_stage("sidecar", "localhost/perago/perago-sidecar:e2e");
}

#[test]
fn the_script_makes_exactly_the_e2e_images() {
    let names: Vec<&str> = built().archives.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "localhost/perago/body-busybox:e2e",
            "localhost/perago/body-compiled:e2e",
            "localhost/perago/pause:e2e",
            "localhost/perago/perago-operator:e2e",
            "localhost/perago/perago-sidecar:e2e",
        ]
    );
}

/// A root-owned 0755 regular file of the image, its bytes.
fn executable(image: &Image, path: &str) -> Vec<u8> {
    let entry = image.file(path);
    assert_eq!((entry.uid, entry.gid, entry.mode), (0, 0, 0o755), "/{path}");
    match entry.kind {
        Kind::File(bytes) => bytes,
        other => panic!("/{path} is {other:?}"),
    }
}

/// Write an executable out of an image, to run it on this machine.
fn extract(bytes: &[u8], dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn wait_with_limit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn terminate(child: &std::process::Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

#[test]
fn the_pause_image_pauses_until_sigterm() {
    let image = image("localhost/perago/pause:e2e");
    assert_eq!(image.strings("Entrypoint"), Some(vec!["/pause".to_owned()]));
    assert_eq!(image.strings("Cmd"), None);
    let files = image.files();
    assert_eq!(files.keys().collect::<Vec<_>>(), ["pause"], "pause alone");
    let dir = tempfile::tempdir().unwrap();
    let pause = extract(&executable(&image, "pause"), dir.path(), "pause");
    let version = stdout_of(Command::new(&pause).arg("--version"));
    assert_eq!(version.trim(), "perago e2e pause");
    let mut child = Command::new(&pause).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "pause exited by itself"
    );
    terminate(&child);
    let status = wait_with_limit(&mut child, Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "pause exits 0 on SIGTERM");
}

#[test]
fn the_busybox_body_image_has_a_shell_for_the_nonroot_user() {
    let image = image("localhost/perago/body-busybox:e2e");
    assert_distroless_base(&image, "body-busybox");
    assert_eq!(image.config_field("User"), "65532:65532");
    assert_eq!(image.strings("Entrypoint"), None, "pods give the command");
    executable(&image, "bin/busybox");
    for applet in [
        "sh",
        "cat",
        "echo",
        "mkdir",
        "sleep",
        "printf",
        "ls",
        "wc",
        "head",
        "sha256sum",
        "dd",
        "env",
        "test",
        "[",
    ] {
        assert_eq!(
            image.file(&format!("bin/{applet}")).kind,
            Kind::Symlink("busybox".into()),
            "/bin/{applet}"
        );
    }
}

#[test]
fn the_compiled_body_follows_the_runner_protocol() {
    let image = image("localhost/perago/body-compiled:e2e");
    assert_distroless_base(&image, "body-compiled");
    assert_eq!(image.config_field("User"), "65532:65532");
    let path = "/usr/local/bin/perago-body-compiled";
    assert_eq!(image.strings("Entrypoint"), Some(vec![path.to_owned()]));
    let dir = tempfile::tempdir().unwrap();
    let body = extract(
        &executable(&image, path.trim_start_matches('/')),
        dir.path(),
        "body",
    );
    let params = dir.path().join("params.json");
    std::fs::write(&params, "{}").unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let result = dir.path().join("result.json");
    let run = |params: &Path, result: &Path| {
        Command::new(&body)
            .env_clear()
            .env("PERAGO_PARAMS", params)
            .env("PERAGO_RESULT", result)
            .env("PERAGO_WORKSPACE", &workspace)
            .output()
            .unwrap()
    };

    let out = run(&params, &result);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    assert_eq!(
        written,
        serde_json::json!({"greeting": "hello from a compiled body"})
    );
    let hello = std::fs::read_to_string(workspace.join("compiled/hello.txt")).unwrap();
    assert_eq!(hello, "hello\n");

    let out = run(&dir.path().join("missing.json"), &result);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read the params file"), "{err}");

    // Opening a FIFO for writing blocks until a reader comes: SIGTERM arrives meanwhile.
    let fifo = dir.path().join("result.fifo");
    stdout_of(Command::new("mkfifo").arg(&fifo));
    let mut child = Command::new(&body)
        .env_clear()
        .env("PERAGO_PARAMS", &params)
        .env("PERAGO_RESULT", &fifo)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    terminate(&child);
    let status = wait_with_limit(&mut child, Duration::from_secs(5));
    assert_eq!(status.code(), Some(143), "the body exits 143 on SIGTERM");
}
