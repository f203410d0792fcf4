//! The krew package: `deploy/krew/manifest` archives the binary and prints a plugin manifest
//! whose sha256, URI and bin name match what it archived.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn the_krew_manifest_names_the_archive_it_made() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/krew/manifest");
    let binary = Path::new(env!("CARGO_BIN_EXE_kubectl-perago"));
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(&script)
        .args(["v1.2.3"])
        .arg(out.path())
        .arg("https://example.com/releases/v1.2.3")
        .arg(format!("amd64={}", binary.parent().unwrap().display()))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let manifest: serde_yaml::Value = serde_yaml::from_slice(&run.stdout).unwrap();
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "perago");
    assert_eq!(manifest["spec"]["version"], "v1.2.3");
    assert_eq!(
        manifest["spec"]["platforms"].as_sequence().unwrap().len(),
        1
    );
    let platform = &manifest["spec"]["platforms"][0];
    assert_eq!(platform["bin"], "kubectl-perago");
    let archive = out.path().join("kubectl-perago-v1.2.3-linux-amd64.tar.gz");
    assert!(
        platform["uri"]
            .as_str()
            .unwrap()
            .ends_with("/v1.2.3/kubectl-perago-v1.2.3-linux-amd64.tar.gz")
    );
    let sha = Command::new("sha256sum").arg(&archive).output().unwrap();
    let sha = String::from_utf8_lossy(&sha.stdout);
    assert_eq!(
        platform["sha256"].as_str().unwrap(),
        sha.split(' ').next().unwrap()
    );
    let listing = Command::new("tar")
        .arg("-tzf")
        .arg(&archive)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&listing.stdout), "kubectl-perago\n");

    for bad in [
        vec![
            "1.2".to_owned(),
            format!("amd64={}", binary.parent().unwrap().display()),
        ],
        vec![
            "v1.2.3".to_owned(),
            format!("s390x={}", binary.parent().unwrap().display()),
        ],
        vec!["v1.2.3".to_owned()],
    ] {
        let run = Command::new(&script)
            .arg(&bad[0])
            .arg(out.path())
            .arg("https://example.com")
            .args(&bad[1..])
            .output()
            .unwrap();
        assert_eq!(run.status.code(), Some(2), "{bad:?}");
    }
}
