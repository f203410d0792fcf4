//! `make release` (e2e/bin/release) against a real OCI registry (Debian's docker-registry):
//! what it pushes, that the same input gives the same digests, that a released version never
//! changes, and that bad settings stop it before it builds anything. The real node installs
//! every release it runs from such a registry (e2e/src/registry.rs); the arm64 half of a
//! release is checked by the script itself, under qemu (docs/release.md).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use perago_e2e::process::{bin_dir, free_port, obtain, release_binaries};
use perago_e2e::registry::{Registry, Release};
use serde_json::Value;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const VERSION: &str = "1.2.3-rc.1";

fn binaries() -> PathBuf {
    release_binaries(
        &[
            "perago-operator",
            "perago-sidecar",
            "perago-runner",
            "kubectl-perago",
        ],
        "the release packages them",
    )
    .unwrap()
}

/// e2e/bin/release with `env` (and nothing of the caller's release settings).
fn release(env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin_dir().join("release"));
    for key in [
        "VERSION",
        "REGISTRY",
        "ARCHS",
        "BINARIES",
        "PLAIN_HTTP",
        "OUT",
        "SOURCE_DATE_EPOCH",
        "COSIGN_KEY",
        "COSIGN_PASSWORD",
        "UNSIGNED",
    ] {
        cmd.env_remove(key);
    }
    cmd.envs(env.iter().copied()).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn crane(args: &[&str]) -> String {
    perago_e2e::registry::crane(args).unwrap()
}

fn helm(args: &[&str]) -> Vec<u8> {
    let out = Command::new(obtain("helm").unwrap())
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "helm {args:?}: {}", stderr(&out));
    out.stdout
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split(' ')
        .next()
        .unwrap()
        .to_owned()
}

const PASSWORD: &str = "perago-e2e";

/// A cosign key pair in `dir`: (private key, public key).
fn key_pair(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let made = Command::new(obtain("cosign").unwrap())
        .args(["generate-key-pair", "--output-key-prefix", "cosign"])
        .env("COSIGN_PASSWORD", PASSWORD)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    (dir.join("cosign.key"), dir.join("cosign.pub"))
}

/// `cosign verify` of `reference` with the public key `public` (no transparency log: the
/// release is signed with a key, offline).
fn verify(public: &Path, reference: &str) -> Output {
    Command::new(obtain("cosign").unwrap())
        .args(["verify", "--key"])
        .arg(public)
        .args([
            "--insecure-ignore-tlog",
            "--allow-insecure-registry",
            "--allow-http-registry",
            "--output",
            "json",
            reference,
        ])
        .output()
        .unwrap()
}

#[tokio::test]
async fn bad_settings_and_unusable_registries_stop_the_release_before_it_builds() {
    let dir = tempfile::tempdir().unwrap();
    let read_only = Registry::start_read_only(dir.path(), LOOPBACK)
        .await
        .unwrap();
    let out = dir.path().join("out");
    let out_str = out.to_str().unwrap().to_owned();
    let bins = binaries();
    let bins = bins.to_str().unwrap();
    let read_only_prefix = read_only.prefix();
    let closed = format!("127.0.0.1:{}/perago", free_port().unwrap());
    let base = [
        ("OUT", out_str.as_str()),
        ("BINARIES", bins),
        ("ARCHS", "amd64"),
        ("PLAIN_HTTP", "1"),
        ("UNSIGNED", "1"),
    ];
    let registry = Registry::start(dir.path(), LOOPBACK).await.unwrap();
    let prefix = registry.prefix();
    let cases: [(&[(&str, &str)], &str); 9] = [
        (&[("REGISTRY", "r.example/p")], "VERSION is not set"),
        (
            &[("VERSION", "v1.2"), ("REGISTRY", "r.example/p")],
            "VERSION=v1.2 is not MAJOR.MINOR.PATCH",
        ),
        (&[("VERSION", VERSION)], "REGISTRY is not set"),
        (
            &[("VERSION", VERSION), ("REGISTRY", "https://r.example/p")],
            "is not host[:port]/path",
        ),
        (
            &[
                ("VERSION", VERSION),
                ("REGISTRY", "r.example/p"),
                ("ARCHS", "s390x"),
            ],
            "'s390x' is not amd64 or arm64",
        ),
        (
            &[("VERSION", VERSION), ("REGISTRY", &closed)],
            "did not answer",
        ),
        (
            &[("VERSION", VERSION), ("REGISTRY", &read_only_prefix)],
            "refuses a push",
        ),
        (
            &[
                ("VERSION", VERSION),
                ("REGISTRY", &prefix),
                ("UNSIGNED", ""),
            ],
            "COSIGN_KEY is not set",
        ),
        (
            &[
                ("VERSION", VERSION),
                ("REGISTRY", &prefix),
                ("UNSIGNED", ""),
                ("COSIGN_KEY", "/nonexistent/cosign.key"),
            ],
            "cannot be read",
        ),
    ];
    for (env, says) in cases {
        let mut all: Vec<(&str, &str)> = base.to_vec();
        all.retain(|(k, _)| !env.iter().any(|(e, _)| e == k));
        all.extend(env.iter().filter(|(_, v)| !v.is_empty()));
        let run = release(&all);
        assert!(!run.status.success(), "{env:?} was released");
        assert!(stderr(&run).contains(says), "{env:?}: {}", stderr(&run));
        assert!(
            !out.exists(),
            "{env:?}: the release wrote {out_str} before it stopped"
        );
    }
}

#[tokio::test]
async fn a_release_is_reproducible_immutable_and_installable_from_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start(dir.path(), LOOPBACK).await.unwrap();
    let prefix = registry.prefix();
    let bins = binaries();
    let (key, public) = key_pair(&dir.path().join("signer"));
    let key = key.to_str().unwrap().to_owned();
    let run = |out: &Path, epoch: Option<&str>| {
        let out = out.to_str().unwrap().to_owned();
        let mut env = vec![
            ("COSIGN_KEY", key.as_str()),
            ("COSIGN_PASSWORD", PASSWORD),
            ("VERSION", VERSION),
            ("REGISTRY", prefix.as_str()),
            ("ARCHS", "amd64"),
            ("BINARIES", bins.to_str().unwrap()),
            ("PLAIN_HTTP", "1"),
            ("KREW_BASE_URL", "https://downloads.example/v1.2.3-rc.1"),
        ];
        if let Some(epoch) = epoch {
            env.push(("SOURCE_DATE_EPOCH", epoch));
        }
        env.push(("OUT", &out));
        release(&env)
    };

    // The first release pushes; the same release again is accepted and changes nothing.
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    let pushed = run(&first, None);
    assert!(pushed.status.success(), "{}", stderr(&pushed));
    let again = run(&second, None);
    assert!(again.status.success(), "{}", stderr(&again));
    let sums = std::fs::read_to_string(first.join("SHA256SUMS")).unwrap();
    assert_eq!(
        sums,
        std::fs::read_to_string(second.join("SHA256SUMS")).unwrap(),
        "two releases of the same binaries differ"
    );
    let check = Command::new("sha256sum")
        .args(["--check", "--quiet", "SHA256SUMS"])
        .current_dir(&first)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", stderr(&check));
    let release = Release::read(&first).unwrap();
    assert_eq!(release.version, VERSION);
    assert_eq!(
        release.chart,
        format!("oci://{prefix}/charts/perago-operator")
    );

    // Signed: the two images and the chart verify with the release's public key, by digest,
    // and not with another key.
    assert_eq!(
        std::fs::read(first.join("cosign.pub")).unwrap(),
        std::fs::read(&public).unwrap()
    );
    let (_, stranger) = key_pair(&dir.path().join("stranger"));
    let chart_reference = format!(
        "{prefix}/charts/perago-operator@{}",
        crane(&[
            "digest",
            &format!("{prefix}/charts/perago-operator:{VERSION}")
        ])
        .trim()
    );
    for reference in [
        &release.operator_image,
        &release.sidecar_image,
        &chart_reference,
    ] {
        let verified = verify(&public, reference);
        assert!(
            verified.status.success(),
            "{reference}: {}",
            stderr(&verified)
        );
        let claims: Value = serde_json::from_slice(&verified.stdout).unwrap();
        let digest = reference.rsplit_once('@').unwrap().1;
        assert_eq!(
            claims[0]["critical"]["image"]["docker-manifest-digest"],
            digest
        );
        assert!(
            !verify(&stranger, reference).status.success(),
            "{reference} verified with another key"
        );
    }

    // Each image is an index over its platform, pinned by digest in release.env.
    for (image, reference) in [
        ("perago-operator", &release.operator_image),
        ("perago-sidecar", &release.sidecar_image),
    ] {
        let tagged = format!("{prefix}/{image}:{VERSION}");
        let digest = crane(&["digest", &tagged]).trim().to_owned();
        assert_eq!(reference, &format!("{tagged}@{digest}"));
        let index: Value = serde_json::from_str(&crane(&["manifest", &tagged])).unwrap();
        assert_eq!(
            index["mediaType"], "application/vnd.oci.image.index.v1+json",
            "{image}"
        );
        assert_eq!(index["manifests"][0]["platform"]["architecture"], "amd64");
        assert_eq!(index["manifests"].as_array().unwrap().len(), 1);

        // Its SBOM refers to it: the referrers tag lists one CycloneDX artifact.
        let referrers: Value = serde_json::from_str(&crane(&[
            "manifest",
            &format!("{prefix}/{image}:{}", digest.replace(':', "-")),
        ]))
        .unwrap();
        let artifact = &referrers["manifests"][0];
        assert_eq!(artifact["artifactType"], "application/vnd.cyclonedx+json");
        let manifest: Value = serde_json::from_str(&crane(&[
            "manifest",
            &format!("{prefix}/{image}@{}", artifact["digest"].as_str().unwrap()),
        ]))
        .unwrap();
        assert_eq!(manifest["subject"]["digest"], digest.as_str());
        let sbom: Value = serde_json::from_str(&crane(&[
            "blob",
            &format!(
                "{prefix}/{image}@{}",
                manifest["layers"][0]["digest"].as_str().unwrap()
            ),
        ]))
        .unwrap();
        assert_eq!(sbom["bomFormat"], "CycloneDX");
        assert_eq!(sbom["metadata"]["component"]["name"], image);
        assert_eq!(sbom["metadata"]["component"]["type"], "container");
        let names: Vec<&str> = sbom["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        let (own, dependency) = match image {
            "perago-operator" => (["perago-operator", "perago-kubectl"], "kube-runtime"),
            _ => (["perago-sidecar", "perago-runner"], "reqwest"),
        };
        for name in own.iter().chain([&dependency]) {
            assert!(names.contains(name), "{image}'s SBOM lists no {name}");
        }
        let text = serde_json::to_string(&sbom).unwrap();
        assert!(
            !text.contains(env!("CARGO_MANIFEST_DIR")),
            "{image}'s SBOM names the checkout's path"
        );
    }

    // The chart in the registry is the archive, and its images are the release's, by digest.
    let pulled = dir.path().join("pulled");
    std::fs::create_dir(&pulled).unwrap();
    helm(&[
        "pull",
        &release.chart,
        "--version",
        VERSION,
        "--plain-http",
        "--destination",
        pulled.to_str().unwrap(),
    ]);
    let archive = format!("perago-operator-{VERSION}.tgz");
    assert_eq!(
        std::fs::read(pulled.join(&archive)).unwrap(),
        std::fs::read(first.join(&archive)).unwrap()
    );
    let values: serde_yaml::Value = serde_yaml::from_slice(&helm(&[
        "show",
        "values",
        &release.chart,
        "--version",
        VERSION,
        "--plain-http",
    ]))
    .unwrap();
    let (operator_repo, operator_digest) = release
        .operator_image
        .split_once(&format!(":{VERSION}@"))
        .unwrap();
    assert_eq!(values["image"]["repository"], operator_repo);
    assert_eq!(values["image"]["digest"], operator_digest);
    let (sidecar_repo, sidecar_digest) = release
        .sidecar_image
        .split_once(&format!(":{VERSION}@"))
        .unwrap();
    assert_eq!(values["sidecarImage"]["repository"], sidecar_repo);
    assert_eq!(values["sidecarImage"]["digest"], sidecar_digest);
    let chart: serde_yaml::Value = serde_yaml::from_slice(&helm(&[
        "show",
        "chart",
        &release.chart,
        "--version",
        VERSION,
        "--plain-http",
    ]))
    .unwrap();
    assert_eq!(chart["version"], VERSION);
    assert_eq!(chart["appVersion"], VERSION);

    // kubectl-perago for krew: the manifest's checksum is the archive's.
    let krew: serde_yaml::Value =
        serde_yaml::from_slice(&std::fs::read(first.join("kubectl-perago.yaml")).unwrap()).unwrap();
    let platform = &krew["spec"]["platforms"][0];
    let krew_archive = format!("kubectl-perago-v{VERSION}-linux-amd64.tar.gz");
    assert_eq!(
        platform["uri"],
        format!("https://downloads.example/v1.2.3-rc.1/{krew_archive}").as_str()
    );
    assert_eq!(
        platform["sha256"],
        sha256(&first.join(&krew_archive)).as_str()
    );

    // The perago-k8s wheel installs (pip, no dependencies) and says the release's version.
    let wheel = first.join("python/perago_k8s-1.2.3_rc.1-py3-none-any.whl");
    let python = perago_e2e::process::obtain("perago-python").unwrap();
    let installed = dir.path().join("wheel");
    let pip = std::process::Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .arg("--target")
        .arg(&installed)
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(
        pip.status.success(),
        "{}",
        String::from_utf8_lossy(&pip.stderr)
    );
    let version = std::process::Command::new(&python)
        .args(["-m", "perago_k8s", "--version"])
        .env("PYTHONPATH", &installed)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("perago-k8s {VERSION}")
    );

    // A different build of a released version is refused, and the registry keeps the first.
    let operator_before = crane(&["digest", &format!("{prefix}/perago-operator:{VERSION}")]);
    let changed = run(&dir.path().join("changed"), Some("1"));
    assert!(
        !changed.status.success(),
        "a changed build replaced {VERSION}"
    );
    assert!(
        stderr(&changed).contains("A released version never changes"),
        "{}",
        stderr(&changed)
    );
    assert_eq!(
        crane(&["digest", &format!("{prefix}/perago-operator:{VERSION}")]),
        operator_before
    );
}
