//! The chart's alerts (`metrics.prometheusRule`), as Helm renders them: valid rules for
//! `promtool check rules`, each with a unit test in `alerts/rules.test.yaml` that
//! `promtool test rules` passes, and a runbook section in docs/operations.md.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use perago_e2e::process::obtain;
use serde_yaml::Value;

fn promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool (Debian's prometheus package: e2e/bin/prerequisites)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn every_alert_is_valid_unit_tested_and_has_a_runbook() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let helm = obtain("helm").unwrap();
    let out = Command::new(helm)
        .arg("template")
        .arg("perago")
        .arg(repo.join("charts/perago-operator"))
        .args([
            "--kube-version",
            "1.35.4",
            "--set",
            "conductor.url=http://c/api",
        ])
        .args(["--set", "metrics.prometheusRule.enabled=true"])
        .args(["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"])
        .args(["--show-only", "templates/prometheusrule.yaml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rule: Value = serde_yaml::from_slice(&out.stdout).unwrap();
    let groups = &rule["spec"]["groups"];

    let dir = tempfile::tempdir().unwrap();
    let rules = serde_yaml::to_string(&serde_yaml::Mapping::from_iter([(
        Value::from("groups"),
        groups.clone(),
    )]))
    .unwrap();
    std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
    let tests = std::fs::read_to_string(repo.join("e2e/tests/alerts/rules.test.yaml")).unwrap();
    std::fs::write(dir.path().join("rules.test.yaml"), &tests).unwrap();
    let checked = promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    let tested = promtool(dir.path(), &["test", "rules", "rules.test.yaml"]);
    eprintln!("{checked}{tested}");

    let alerts: BTreeSet<String> = groups
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect();
    let tests: Value = serde_yaml::from_str(&tests).unwrap();
    let mut fired = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for case in tests["tests"].as_sequence().unwrap() {
        for check in case["alert_rule_test"].as_sequence().unwrap() {
            let name = check["alertname"].as_str().unwrap().to_owned();
            if check["exp_alerts"]
                .as_sequence()
                .is_some_and(|a| !a.is_empty())
            {
                fired.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    assert_eq!(fired, alerts, "every alert has a case that fires it");
    assert_eq!(
        silent, alerts,
        "every alert has a case where it stays quiet"
    );

    let runbook = std::fs::read_to_string(repo.join("docs/operations.md")).unwrap();
    for alert in &alerts {
        assert!(
            runbook.contains(&format!("### {alert}\n")),
            "docs/operations.md has no runbook section for {alert}"
        );
    }
    eprintln!(
        "{} alerts, each fired and kept quiet by a promtool test",
        alerts.len()
    );
}

/// Monitoring objects enabled on a cluster that does not serve their kind fail the install
/// with a message naming the missing CRD.
#[test]
fn monitoring_objects_without_their_crds_fail_the_install_naming_them() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let helm = obtain("helm").unwrap();
    for (value, kind) in [
        ("metrics.serviceMonitor.enabled", "ServiceMonitor"),
        ("metrics.podMonitor.enabled", "PodMonitor"),
        ("metrics.prometheusRule.enabled", "PrometheusRule"),
    ] {
        let out = Command::new(&helm)
            .arg("template")
            .arg("perago")
            .arg(repo.join("charts/perago-operator"))
            .args([
                "--kube-version",
                "1.35.4",
                "--set",
                "conductor.url=http://c/api",
            ])
            .args(["--set", &format!("{value}=true")])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{value}");
        assert!(
            stderr.contains(&format!(
                "{value} needs the Prometheus Operator's {kind} CRD"
            )),
            "{stderr}"
        );
    }
}
