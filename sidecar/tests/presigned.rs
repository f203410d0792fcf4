//! The direct data path against the real servers: lakeFS on PostgreSQL with an S3 server
//! (s3proxy) that serves the URLs lakeFS presigns. The bytes of a download and of a stage go
//! between the sidecar and the object store; lakeFS, behind a proxy that records every call,
//! sees metadata calls and the uploads of small files. A `presigned` setting lakeFS cannot honour stops the sidecar at
//! start, and a URL on a host that is not allowed is never followed.

#![allow(clippy::unwrap_used)]

mod support;

use perago_e2e::faults::FaultProxy;
use perago_e2e::lake::Lake;
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::services::LakeFs;
use perago_e2e::storage::Storage;
use serde_json::{Value, json};

use support::{lakefs_env, services};

async fn register(api: &ConductorApi, name: &str) -> Value {
    support::register_workspace_task(api, name, 0, 0).await
}

fn input(repo: &str, reference: &str) -> Value {
    json!({"workspace": {"repository": repo, "branch": "main", "refType": "commit", "ref": reference}, "params": {}})
}

/// 3 MiB of a pattern: streamed (more than one block) both ways.
fn large() -> String {
    (0..3 * 1024 * 1024)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect()
}

/// The body: rewrites `big.txt` (one byte changed at its end), adds `new.txt`, deletes
/// `gone.txt`, keeps `same.txt`.
const EDIT: &str = r#"
w="$PERAGO_WORKSPACE"
printf 'Z' >> "$w/big.txt"
echo "fresh" > "$w/new.txt"
rm "$w/gone.txt"
printf '{"files": %d}' "$(find "$w" -type f | wc -l)" > "$PERAGO_RESULT"
"#;

#[tokio::test]
async fn object_bytes_bypass_lakefs_and_the_branch_holds_exactly_the_workspace() {
    let services = services().await;
    let lakefs = services.lakefs();
    let lake = Lake::of(lakefs);
    let repo = format!("presigned-{}", std::process::id());
    let big = large();
    let seed = lake
        .seed(
            &repo,
            &[
                ("data/big.txt", big.as_str()),
                ("data/same.txt", "unchanged\n"),
                ("data/gone.txt", "to be deleted\n"),
                ("elsewhere/keep.txt", "outside the prefix\n"),
            ],
        )
        .await
        .unwrap();
    // Every lakeFS call of the pod goes through this proxy, which records it.
    let proxy = FaultProxy::start(&lakefs.endpoint).await.unwrap();
    let api = ConductorApi::new(&services.conductor().api_url);
    let contract = register(&api, "presigned_edit").await;
    let hosts = lakefs.object_store_hosts();
    let env = lakefs_env(
        &proxy.url,
        &[
            ("PERAGO_LAKEFS_DATA_PATH", "presigned"),
            ("PERAGO_LAKEFS_OBJECT_STORE_HOSTS", hosts.as_str()),
        ],
    );
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let pod = Pod::start(&bins, &api.base, &contract, EDIT, &env).await;
    let id = api
        .start("presigned_edit", "edit", input(&repo, &seed))
        .await;
    let wf = api.finished(&id).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", pod.log());
    assert_eq!(wf["tasks"][0]["outputData"]["result"]["files"], 3);
    assert!(
        pod.log().contains(r#""data_path":"presigned""#),
        "the sidecar says which data path it took:\n{}",
        pod.log()
    );

    // The branch is the workspace, byte for byte, and the rest of the repository untouched.
    let tree = lake.tree(&repo, "main").await.unwrap();
    let keys: Vec<&str> = tree.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "data/big.txt",
            "data/new.txt",
            "data/same.txt",
            "elsewhere/keep.txt"
        ]
    );
    assert_eq!(
        lake.object(&repo, "main", "data/big.txt").await.unwrap(),
        format!("{big}Z")
    );
    assert_eq!(
        lake.object(&repo, "main", "data/new.txt").await.unwrap(),
        "fresh\n"
    );

    // lakeFS served listings, addresses and links, and the bytes of the one small upload
    // (new.txt: one call costs lakeFS less than an address and a link); never a download's
    // bytes, never the large file's.
    let seen = proxy.seen();
    let calls: Vec<String> = seen
        .iter()
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    let bytes_calls: Vec<&String> = calls
        .iter()
        .filter(|c| {
            let path = c.split('?').next().unwrap_or("");
            path.ends_with("/objects") && (c.starts_with("GET") || c.starts_with("POST"))
        })
        .collect();
    assert_eq!(bytes_calls.len(), 1, "{bytes_calls:#?}");
    assert!(
        bytes_calls[0].starts_with("POST") && bytes_calls[0].contains("path=data%2Fnew.txt"),
        "{bytes_calls:#?}"
    );
    let links: Vec<&String> = calls
        .iter()
        .filter(|c| c.starts_with("PUT") && c.contains("/staging/backing?"))
        .collect();
    assert_eq!(links.len(), 1, "one link, big.txt's: {calls:#?}");
    assert!(links[0].contains("path=data%2Fbig.txt"), "{links:?}");
    assert!(
        seen.iter()
            .any(|s| s.path.contains("/objects/ls") && s.path.contains("presign=true")),
        "the download lists with presigned URLs: {calls:#?}"
    );
    drop(pod);
}

#[tokio::test]
async fn a_presigned_setting_lakefs_cannot_honour_stops_the_sidecar_at_start() {
    let services = services().await;
    let api = ConductorApi::new(&services.conductor().api_url);
    let contract = register(&api, "presigned_refused").await;
    let dir = tempfile::tempdir().unwrap();
    let contract_path = dir.path().join("contract.json");
    std::fs::write(&contract_path, serde_json::to_vec(&contract).unwrap()).unwrap();
    // lakeFS on its embedded storage: its local blockstore cannot presign.
    let embedded = LakeFs::start_on(
        dir.path(),
        std::net::Ipv4Addr::LOCALHOST.into(),
        None,
        Storage::Embedded,
    )
    .await
    .unwrap();
    let run = |endpoint: &str, hosts: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_perago-sidecar"))
            .env("PERAGO_TASK_CONTRACT", &contract_path)
            .env("PERAGO_WORK_DIR", dir.path().join("work"))
            .env("CONDUCTOR_SERVER_URL", &api.base)
            .env("PERAGO_HTTP_ADDR", "127.0.0.1:0")
            .env("PERAGO_LAKEFS_DATA_PATH", "presigned")
            .env("PERAGO_LAKEFS_OBJECT_STORE_HOSTS", hosts)
            .envs(lakefs_env(endpoint, &[]))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&embedded.endpoint, "127.0.0.1:9000");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "dataPath is presigned, but lakeFS cannot presign URLs for its 'local' blockstore"
        ),
        "{err}"
    );
    let (code, err) = run(&services.lakefs().endpoint, "");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("dataPath is presigned, but no object store hosts are allowed"),
        "{err}"
    );
    let (code, err) = run(&services.lakefs().endpoint, "http://minio:9000");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("PERAGO_LAKEFS_OBJECT_STORE_HOSTS: object store host 'http://minio:9000' must be host or host:port"),
        "{err}"
    );
}

#[tokio::test]
async fn a_url_on_a_host_not_allowed_is_never_followed() {
    let services = services().await;
    let lakefs = services.lakefs();
    let lake = Lake::of(lakefs);
    let repo = format!("presigned-host-{}", std::process::id());
    let seed = lake.seed(&repo, &[("data/a.txt", "a\n")]).await.unwrap();
    let api = ConductorApi::new(&services.conductor().api_url);
    let contract = register(&api, "presigned_host").await;
    // Presigning is on (a host is given), but not the host lakeFS presigns for.
    let env = lakefs_env(
        &lakefs.endpoint,
        &[(
            "PERAGO_LAKEFS_OBJECT_STORE_HOSTS",
            "objects.example.com:9000",
        )],
    );
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let pod = Pod::start(&bins, &api.base, &contract, EDIT, &env).await;
    let id = api
        .start("presigned_host", "host", input(&repo, &seed))
        .await;
    let wf = api.finished(&id).await;
    assert_eq!(wf["status"], "FAILED", "{wf}");
    let reason = wf["tasks"][0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.contains("lakeFS presigned a URL for 'data/a.txt'")
            && reason.contains(&format!("on http://{}", lakefs.object_store_hosts()))
            && reason.contains("which is not an allowed object store host"),
        "{reason}"
    );
    assert!(
        !reason.contains("X-Amz-Signature"),
        "no signature is quoted: {reason}"
    );
    assert_eq!(lake.tree(&repo, "main").await.unwrap().len(), 1);
    // Failed at the download: no staging branch was made.
    let branches = lake
        .get(&format!("/repositories/{repo}/branches"))
        .await
        .unwrap();
    assert_eq!(
        branches["results"].as_array().unwrap().len(),
        1,
        "{branches}"
    );
    drop(pod);
}
