//! The Argo CD health check and resource actions of PeragoTask
//! (`deploy/argocd/resource_customizations/perago.io/PeragoTask`), run by Argo CD's own Lua code:
//! `e2e/argocd-lua`, which `e2e/bin/obtain argocd-lua` builds against
//! github.com/argoproj/argo-cd/v3/util/lua on gopher-lua (Lua 5.1), hands the scripts to Argo CD
//! as argocd-cm's customizations and checks every case of `health_test.yaml` and
//! `actions/action_test.yaml`, in the format of Argo CD's built-in checks.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn argo_cd_reads_every_case_as_the_test_files_say() {
    let runner = perago_e2e::process::obtain("argocd-lua").unwrap();
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/argocd/resource_customizations");
    let out = Command::new(&runner).arg(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprint!("{stdout}");
    let mismatched: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        out.status.success(),
        "{} failed ({}):\n{}{}",
        runner.display(),
        out.status,
        mismatched.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every case the test files list ran: each has one inputPath.
    let listed: usize = [
        "perago.io/PeragoTask/health_test.yaml",
        "perago.io/PeragoTask/actions/action_test.yaml",
    ]
    .iter()
    .map(|file| {
        std::fs::read_to_string(dir.join(file))
            .unwrap()
            .lines()
            .filter(|l| {
                l.trim_start()
                    .trim_start_matches("- ")
                    .starts_with("inputPath:")
            })
            .count()
    })
    .sum();
    assert!(listed >= 17, "{listed} cases listed");
    assert!(
        stdout.contains(&format!("argocd-lua: {listed} cases, 0 mismatched")),
        "the runner did not report all {listed} cases"
    );
    // Each health status the check gives has a case that Argo CD read so.
    for status in ["Healthy", "Progressing", "Degraded", "Suspended"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("ok   health ") && l.contains(&format!(": {status} \""))),
            "no case reads as {status}"
        );
    }
}
