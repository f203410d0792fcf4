//! The workspace building blocks against the real lakeFS server: the client, the download
//! (projection, pagination, parallel streaming), hostile keys, and guardrails and change
//! detection on what was downloaded.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, shared};
use perago_lakefs::LakeFsClient;
use perago_sidecar::workspace::{download, guardrails, snapshot};
use serde_json::json;

async fn client() -> LakeFsClient {
    let services = shared(Selection {
        lakefs: true,
        ..Selection::default()
    })
    .await;
    LakeFsClient::new(
        &services.lakefs().endpoint,
        LAKEFS_ACCESS_KEY_ID,
        LAKEFS_SECRET_ACCESS_KEY,
        Duration::from_secs(30),
    )
    .unwrap()
}

/// A fresh repository; returns its name.
async fn repository(name: &str) -> String {
    let services = shared(Selection {
        lakefs: true,
        ..Selection::default()
    })
    .await;
    let repo = format!("{name}-{}", std::process::id());
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/repositories", services.lakefs().endpoint))
        .basic_auth(LAKEFS_ACCESS_KEY_ID, Some(LAKEFS_SECRET_ACCESS_KEY))
        .json(&json!({"name": repo, "storage_namespace": services.lakefs().namespace(&repo), "default_branch": "main"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    repo
}

/// Upload `files` on main and commit; returns the commit id.
async fn seed(c: &LakeFsClient, repo: &str, files: &[(&str, &[u8])]) -> String {
    let dir = tempfile::tempdir().unwrap();
    for (i, (key, bytes)) in files.iter().enumerate() {
        let local = dir.path().join(i.to_string());
        std::fs::write(&local, bytes).unwrap();
        c.upload(repo, "main", key, &local, Duration::from_secs(30))
            .await
            .unwrap();
    }
    c.commit(repo, "main", "seed", &BTreeMap::new())
        .await
        .unwrap()
        .id
}

#[tokio::test]
async fn download_projects_the_prefix_in_parallel_and_guardrails_see_it() {
    let c = client().await;
    let repo = repository("ws-download").await;
    let mut files: Vec<(String, Vec<u8>)> = (0..1100)
        .map(|i| {
            (
                format!("data/part/{i:05}.txt"),
                format!("row {i}\n").into_bytes(),
            )
        })
        .collect();
    files.push(("data/raw/a.parquet".into(), vec![7u8; 300_000]));
    files.push(("data/.perago-attempt.json".into(), b"{}".to_vec()));
    files.push(("database/elsewhere.txt".into(), b"x".to_vec()));
    files.push(("other/z.txt".into(), b"z".to_vec()));
    let borrowed: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    let commit = seed(&c, &repo, &borrowed).await;

    let dir = tempfile::tempdir().unwrap();
    let manifest = download::download(
        &c,
        &repo,
        &commit,
        "data",
        dir.path(),
        16,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    // 1100 parts (more than one listing page) + the parquet; not the marker, not neighbours.
    assert_eq!(manifest.objects.len(), 1101);
    assert_eq!(
        manifest.bytes(),
        300_000
            + files[..1100]
                .iter()
                .map(|(_, v)| v.len() as u64)
                .sum::<u64>()
    );
    assert_eq!(
        std::fs::read(dir.path().join("part/00042.txt")).unwrap(),
        b"row 42\n"
    );
    assert_eq!(
        std::fs::metadata(dir.path().join("raw/a.parquet"))
            .unwrap()
            .len(),
        300_000
    );
    assert!(!dir.path().join(".perago-attempt.json").exists());
    assert!(!dir.path().join("elsewhere.txt").exists());
    let (checksum, _) = &manifest.objects["raw/a.parquet"];
    assert_eq!(
        checksum.len(),
        32,
        "lakeFS reports the MD5 of uploaded objects: {checksum}"
    );

    use perago_api::task::{Guardrail, GuardrailKind};
    let g = |kind, path: &str, min, max| Guardrail {
        kind,
        path: path.into(),
        min_count: min,
        max_count: max,
    };
    guardrails::check(
        "pre",
        &[
            g(
                GuardrailKind::RequireGlob,
                "part/*.txt",
                Some(1100),
                Some(1100),
            ),
            g(GuardrailKind::RequireFile, "raw/a.parquet", None, None),
            g(GuardrailKind::ForbidGlob, "**/*.json", None, None),
        ],
        dir.path(),
    )
    .unwrap();
    assert_eq!(
        guardrails::check(
            "pre",
            &[g(GuardrailKind::RequireGlob, "raw/**/*.csv", None, None)],
            dir.path()
        )
        .unwrap_err()
        .to_string(),
        "pre guardrail require_glob('raw/**/*.csv') matched 0 files; min_count=1"
    );
    // Change detection takes the MD5s from the listing's checksums instead of reading the
    // files: they must be the MD5s of the bytes downloaded.
    let probe = dir.path().with_extension("probe");
    let before = snapshot::Baseline::record(dir.path(), &probe, &manifest).unwrap();
    assert_eq!(before.items(), &snapshot::take(dir.path()).unwrap());
    assert_eq!(before.items().len(), 1101);
    std::fs::write(dir.path().join("part/00042.txt"), b"row 42\n").unwrap();
    assert_eq!(
        &before.after(dir.path()).unwrap(),
        before.items(),
        "same bytes, no change"
    );
    std::fs::write(dir.path().join("part/00043.txt"), b"row 44\n").unwrap();
    let after = before.after(dir.path()).unwrap();
    assert_eq!(after, snapshot::take(dir.path()).unwrap());
    assert_ne!(&after, before.items());
}

#[tokio::test]
async fn hostile_keys_and_missing_refs_fail_with_the_call_named() {
    let c = client().await;
    let repo = repository("ws-hostile").await;
    let commit = seed(
        &c,
        &repo,
        &[("data/ok.txt", b"ok"), ("data/a//b.txt", b"x")],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let err = download::download(
        &c,
        &repo,
        &commit,
        "data",
        dir.path(),
        4,
        Duration::from_secs(10),
    )
    .await
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "object key 'data/a//b.txt' cannot be projected into the workspace: it has an empty segment ('//')"
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "nothing is written before the plan is checked"
    );

    let err = download::download(
        &c,
        &repo,
        "0123456789abcdef",
        "data",
        dir.path(),
        4,
        Duration::from_secs(10),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with(&format!(
            "lakeFS list objects on {repo}@0123456789abcdef failed: HTTP 404"
        )),
        "{err}"
    );
    let err = c
        .branch_head("no-such-repo", "main")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("lakeFS get branch on no-such-repo@main failed: HTTP 404"),
        "{err}"
    );
}

/// Each kind of hostile key lakeFS stores is refused with what is wrong with that key; a
/// 300-byte file name is refused before any file is created.
#[tokio::test]
async fn every_hostile_key_is_refused_naming_what_is_wrong() {
    let c = client().await;
    let repo = repository("ws-hostile-kinds").await;
    let base = seed(&c, &repo, &[("data/ok.txt", b"ok")]).await;
    let long = format!("data/sub/{}.bin", "n".repeat(296));
    let cases = [
        ("data/a//b.txt", "it has an empty segment ('//')"),
        (
            "data/x/",
            "it ends in '/': a folder marker object, not a file",
        ),
        ("data/./x", "it has a '.' segment"),
        (
            "data/../x",
            "it has a '..' segment, which would leave the workspace",
        ),
        (
            "data/C:/x",
            "the part under the prefix starts with a drive letter ('C:')",
        ),
        (
            "data/a\\b",
            "it contains a backslash ('\\'); workspace paths use '/' separators",
        ),
        (
            long.as_str(),
            "a segment ('nnnnnnnnnnnn…nnnnnnn.bin') is 300 bytes long, more than the 255 bytes a file or directory name may have",
        ),
    ];
    for (i, (key, why)) in cases.into_iter().enumerate() {
        let branch = format!("k{i}");
        c.create_branch(&repo, &branch, &base).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("f");
        std::fs::write(&local, b"x").unwrap();
        c.upload(&repo, &branch, key, &local, Duration::from_secs(10))
            .await
            .unwrap();
        let commit = c
            .commit(&repo, &branch, "hostile", &BTreeMap::new())
            .await
            .unwrap()
            .id;
        let into = tempfile::tempdir().unwrap();
        let err = download::download(
            &c,
            &repo,
            &commit,
            "data",
            into.path(),
            4,
            Duration::from_secs(10),
        )
        .await
        .unwrap_err()
        .to_string();
        let suffix = format!("' cannot be projected into the workspace: {why}");
        if key.len() < 100 {
            assert_eq!(err, format!("object key '{key}{suffix}"));
        } else {
            assert!(
                err.starts_with("object key 'data/sub/nnnn") && err.ends_with(&suffix),
                "{err}"
            );
        }
        assert!(err.chars().count() < 400, "{err}");
        assert!(
            std::fs::read_dir(into.path()).unwrap().next().is_none(),
            "{key}: nothing is written"
        );
    }
}

#[tokio::test]
async fn branches_commits_and_first_parent_history() {
    let c = client().await;
    let repo = repository("ws-history").await;
    let base = seed(&c, &repo, &[("a.txt", b"a")]).await;
    c.create_branch(&repo, "staging-x", &base).await.unwrap();
    let err = c
        .create_branch(&repo, "staging-x", &base)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(reqwest::StatusCode::CONFLICT));
    let mut ids = vec![base.clone()];
    for i in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), format!("{i}")).unwrap();
        c.upload(
            &repo,
            "main",
            "b.txt",
            &dir.path().join("f"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        let meta = BTreeMap::from([("perago.phase".to_owned(), "confirm".to_owned())]);
        ids.push(c.commit(&repo, "main", "step", &meta).await.unwrap().id);
    }
    assert_eq!(c.branch_head(&repo, "main").await.unwrap(), ids[3]);
    let (log, more) = c
        .first_parent_log(&repo, "main", &base, 1024)
        .await
        .unwrap();
    let got: Vec<&str> = log.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        got,
        [
            ids[3].as_str(),
            ids[2].as_str(),
            ids[1].as_str(),
            ids[0].as_str()
        ]
    );
    assert!(!more);
    assert_eq!(log[0].metadata["perago.phase"], "confirm");
    let (bounded, more) = c.first_parent_log(&repo, "main", &base, 2).await.unwrap();
    assert_eq!((bounded.len(), more), (2, true));
    c.delete_objects(
        &repo,
        "main",
        &["b.txt".to_owned(), "never-there".to_owned()],
    )
    .await
    .unwrap();
    c.delete_branch(&repo, "staging-x").await.unwrap();
    c.delete_branch(&repo, "staging-x").await.unwrap();
    assert_eq!(
        c.get_commit(&repo, &ids[2]).await.unwrap().parents,
        vec![ids[1].clone()]
    );
}
