//! Conductor and lakeFS behind an authenticating gateway: Debian's nginx terminating TLS with
//! `ssl_verify_client on` in front of the real servers. The clients pass it only with a client
//! certificate its authority signed; without one, or with another authority's, every call says
//! the gateway refused the certificate and counts as never sent. Bad certificate files stop
//! the sidecar at start with their cause, and a pod whose certificate is renewed on disk (as
//! the kubelet renews a mounted Secret) presents the new one within the reload interval while
//! its attempts go on.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use perago_conductor::ConductorClient;
use perago_contract::trust::{RELOAD_EVERY, Tls, identity_files};
use perago_e2e::gateway::Gateway;
use perago_e2e::lake::Lake;
use perago_e2e::pki::{Authority, Pair, Usage};
use perago_e2e::pod::{ConductorApi, Pod, PodBinaries};
use perago_e2e::process::{ServerProcess, free_port, wait_ready};
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::{Selection, Services, shared};
use perago_lakefs::{LakeFsClient, MergeOutcome};
use serde_json::json;

async fn services() -> &'static Services {
    shared(Selection {
        conductor: true,
        lakefs: true,
        ..Selection::default()
    })
    .await
}

/// A gateway in front of the harness's Conductor and lakeFS, the authority whose client
/// certificates it admits, and the directory of both.
struct Rig {
    gateway: Gateway,
    clients: Authority,
    /// Conductor's API through the gateway (`https://…/api`).
    conductor: String,
    /// lakeFS through the gateway.
    lakefs: String,
    dir: tempfile::TempDir,
}

impl Rig {
    async fn start() -> Self {
        let services = services().await;
        let dir = tempfile::tempdir().unwrap();
        let serving = Authority::create_named(&dir.path().join("serving"), "gateway-ca").unwrap();
        let clients = Authority::create_named(&dir.path().join("clients"), "clients-ca").unwrap();
        let conductor_upstream = services
            .conductor()
            .api_url
            .trim_end_matches("/api")
            .to_owned();
        let gateway = Gateway::start(
            &dir.path().join("gateway"),
            services.host,
            &serving,
            &clients.cert,
            &[&conductor_upstream, &services.lakefs().endpoint],
        )
        .await
        .unwrap();
        Self {
            conductor: format!("{}/api", gateway.urls[0]),
            lakefs: gateway.urls[1].clone(),
            gateway,
            clients,
            dir,
        }
    }

    /// A client certificate of the admitted authority for `cn`.
    fn certificate(&self, name: &str, cn: &str) -> Pair {
        self.clients
            .issue(name, cn, &Usage::Client { org: None })
            .unwrap()
    }

    /// Trust in the gateway, presenting `pair` when given.
    fn tls(&self, pair: Option<&Pair>) -> Tls {
        let roots = perago_contract::trust::roots("CA", Some(&self.gateway.serving_ca)).unwrap();
        let identity = pair
            .and_then(|p| identity_files(("CERT", Some(&p.cert)), ("KEY", Some(&p.key))).unwrap());
        Tls { roots, identity }
    }

    fn conductor_client(&self, pair: Option<&Pair>) -> ConductorClient {
        ConductorClient::with_tls(
            &self.conductor,
            Duration::from_secs(10),
            None,
            self.tls(pair),
        )
        .unwrap()
    }

    fn lakefs_client(&self, endpoint: &str, pair: Option<&Pair>) -> LakeFsClient {
        LakeFsClient::with_tls(
            endpoint,
            LAKEFS_ACCESS_KEY_ID,
            LAKEFS_SECRET_ACCESS_KEY,
            Duration::from_secs(10),
            self.tls(pair),
        )
        .unwrap()
    }
}

#[tokio::test]
async fn only_a_certificate_of_the_admitted_authority_passes_the_gateway() {
    let rig = Rig::start().await;
    let admitted = rig.certificate("admitted", "perago-sidecar");
    let other = Authority::create_named(&rig.dir.path().join("other"), "other-ca").unwrap();
    let stranger = other
        .issue("stranger", "perago-sidecar", &Usage::Client { org: None })
        .unwrap();

    // Conductor: the admitted certificate lists the TaskDefs; none, or a stranger's, is
    // refused by the gateway, and the error says so.
    rig.conductor_client(Some(&admitted))
        .task_defs()
        .await
        .unwrap();
    let none = rig.conductor_client(None).task_defs().await.unwrap_err();
    assert!(none.is_certificate_refused(), "{none}");
    assert_eq!(
        none.to_string(),
        "Conductor list was refused: the gateway requires a client certificate and none was \
         sent (HTTP 400: No required SSL certificate was sent)"
    );
    let refused = rig
        .conductor_client(Some(&stranger))
        .task_defs()
        .await
        .unwrap_err();
    assert!(refused.is_certificate_refused(), "{refused}");
    assert!(
        refused
            .to_string()
            .contains("the gateway refused the client certificate"),
        "{refused}"
    );

    // lakeFS: the same; a refused merge counts as never sent, so it cannot have landed.
    let lake = Lake::of(services().await.lakefs());
    let repository = format!("gateway-{}", std::process::id());
    let seed = lake
        .seed(&repository, &[("data/a.txt", "a")])
        .await
        .unwrap();
    let admitted_lakefs = rig.lakefs_client(&rig.lakefs, Some(&admitted));
    assert_eq!(
        admitted_lakefs
            .branch_head(&repository, "main")
            .await
            .unwrap(),
        seed
    );
    let merge = rig
        .lakefs_client(&rig.lakefs, None)
        .squash_merge(
            &repository,
            "main",
            "main",
            &Default::default(),
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
    assert!(merge.is_certificate_refused(), "{merge}");
    assert_eq!(merge.merge_outcome(), MergeOutcome::NotApplied);
    assert!(
        merge.to_string().starts_with(&format!(
            "lakeFS merge on {repository}@main could not be sent: the gateway requires a client \
             certificate and none was sent"
        )),
        "{merge}"
    );
    // Read back from the failure reason as `kubectl perago explain` reads it.
    assert_eq!(
        MergeOutcome::of_reason(&merge.to_string()),
        Some(MergeOutcome::NotApplied)
    );

    // The gateway saw each certificate, and passed only the admitted one's requests on.
    let requests = rig.gateway.requests();
    let verdicts: Vec<(&str, u16)> = requests
        .iter()
        .map(|r| (r.verify.as_str(), r.status))
        .collect();
    assert!(verdicts.contains(&("SUCCESS", 200)), "{requests:?}");
    assert!(verdicts.contains(&("NONE", 400)), "{requests:?}");
    assert!(
        requests
            .iter()
            .any(|r| r.verify.starts_with("FAILED:") && r.status == 400),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .filter(|r| r.verify == "SUCCESS")
            .all(|r| r.subject == "CN=perago-sidecar"),
        "{requests:?}"
    );
}

/// `openssl s_server`, which, unlike nginx, ends the TLS handshake of a client without a
/// certificate with an alert, as Envoy's `require_client_certificate` does.
struct HandshakeRefuser {
    url: String,
    _process: ServerProcess,
}

impl HandshakeRefuser {
    async fn start(dir: &Path, serving: &Authority, clients: &Authority) -> Self {
        let pair = serving
            .issue(
                "s-server",
                "s-server",
                &Usage::Server {
                    names: &["localhost"],
                    addresses: &["127.0.0.1".parse().unwrap()],
                },
            )
            .unwrap();
        let port = free_port().unwrap();
        let mut command = Command::new("openssl");
        command
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(port.to_string())
            .arg("-cert")
            .arg(&pair.cert)
            .arg("-key")
            .arg(&pair.key)
            .arg("-CAfile")
            .arg(&clients.cert)
            .args(["-Verify", "1", "-verify_return_error"]);
        let mut process =
            ServerProcess::spawn("openssl s_server", &mut command, dir.join("s_server.log"))
                .unwrap();
        wait_ready(&mut process, Duration::from_secs(10), || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await
        .unwrap();
        Self {
            url: format!("https://127.0.0.1:{port}"),
            _process: process,
        }
    }
}

#[tokio::test]
async fn a_handshake_refused_with_an_alert_names_the_certificate_and_sent_nothing() {
    let rig = Rig::start().await;
    let dir = rig.dir.path().join("s_server");
    let serving = Authority::create_named(&dir, "s-server-ca").unwrap();
    let refuser = HandshakeRefuser::start(&dir, &serving, &rig.clients).await;
    let roots = perago_contract::trust::roots("CA", Some(&serving.cert)).unwrap();
    let lakefs = LakeFsClient::with_tls(
        &refuser.url,
        LAKEFS_ACCESS_KEY_ID,
        LAKEFS_SECRET_ACCESS_KEY,
        Duration::from_secs(10),
        Tls {
            roots: roots.clone(),
            identity: None,
        },
    )
    .unwrap();
    let merge = lakefs
        .squash_merge(
            "lake",
            "source",
            "main",
            &Default::default(),
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
    assert!(merge.is_certificate_refused(), "{merge}");
    assert_eq!(merge.merge_outcome(), MergeOutcome::NotApplied);
    eprintln!("a handshake refused: {merge}");
    assert!(
        merge.to_string().starts_with(
            "lakeFS merge on lake@main could not be sent: the server ended the TLS handshake: it \
             requires a client certificate and none was sent (TLS alert "
        ),
        "{merge}"
    );
    let conductor = ConductorClient::with_tls(
        &format!("{}/api", refuser.url),
        Duration::from_secs(10),
        None,
        Tls {
            roots,
            identity: None,
        },
    )
    .unwrap();
    let poll = conductor.task_defs().await.unwrap_err();
    assert!(poll.is_certificate_refused(), "{poll}");
    assert!(
        poll.to_string()
            .starts_with("Conductor list was refused: the server ended the TLS handshake"),
        "{poll}"
    );
}

fn sidecar() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_perago-sidecar"));
    for var in [
        "CONDUCTOR_SERVER_URL",
        "LAKECTL_SERVER_ENDPOINT_URL",
        "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
        "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
        "OTEL_SERVICE_NAME",
    ] {
        c.env_remove(var);
    }
    c
}

/// The sidecar's exit code and its last line of standard error.
fn start_error(c: &mut Command) -> (Option<i32>, String) {
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default().to_owned();
    (out.status.code(), last)
}

#[tokio::test]
async fn bad_certificates_stop_the_sidecar_at_start_with_their_cause() {
    let rig = Rig::start().await;
    let api = ConductorApi::new(&services().await.conductor().api_url);
    let contract = support::register_workspace_task(&api, "gateway.start", 0, 0).await;
    let contract_file = rig.dir.path().join("contract.json");
    std::fs::write(&contract_file, serde_json::to_vec(&contract).unwrap()).unwrap();
    let good = rig.certificate("good", "perago-sidecar");
    let other = rig.certificate("other", "someone-else");
    let expired = rig
        .clients
        .issue_expired("expired", "perago-sidecar", &Usage::Client { org: None })
        .unwrap();
    let missing = rig.dir.path().join("absent/tls.key");
    let run = |conductor: &str, lakefs: &str, files: &[(&str, &Path)]| {
        let mut c = sidecar();
        c.env("PERAGO_TASK_CONTRACT", &contract_file)
            .env("PERAGO_WORK_DIR", rig.dir.path().join("work"))
            .env("PERAGO_HTTP_ADDR", "127.0.0.1:0")
            .env("CONDUCTOR_SERVER_URL", conductor)
            .env("PERAGO_CONDUCTOR_CA_FILE", &rig.gateway.serving_ca)
            .env("LAKECTL_SERVER_ENDPOINT_URL", lakefs)
            .env("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID)
            .env(
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                LAKEFS_SECRET_ACCESS_KEY,
            )
            .env("PERAGO_LAKEFS_CA_FILE", &rig.gateway.serving_ca);
        for (name, path) in files {
            c.env(name, path);
        }
        start_error(&mut c)
    };
    let cert = "PERAGO_CONDUCTOR_CLIENT_CERT_FILE";
    let key = "PERAGO_CONDUCTOR_CLIENT_KEY_FILE";
    let (direct_conductor, direct_lakefs) = (
        services().await.conductor().api_url.clone(),
        services().await.lakefs().endpoint.clone(),
    );
    let shown = |name: &str, path: &Path| format!("{name}={}", path.display());

    // A missing key file.
    let (code, error) = run(
        &rig.conductor,
        &direct_lakefs,
        &[(cert, &good.cert), (key, &missing)],
    );
    assert_eq!(code, Some(1), "{error}");
    assert!(
        error.contains(&format!(
            "{}: cannot read the client key: No such file or directory",
            shown(key, &missing)
        )),
        "{error}"
    );
    // A key of another certificate.
    let (code, error) = run(
        &rig.conductor,
        &direct_lakefs,
        &[(cert, &good.cert), (key, &other.key)],
    );
    assert_eq!(code, Some(1), "{error}");
    assert!(
        error.contains(&format!(
            "{} is not the key of the certificate in {} (CN=perago-sidecar, serial ",
            shown(key, &other.key),
            shown(cert, &good.cert)
        )),
        "{error}"
    );
    // An expired certificate.
    let (code, error) = run(
        &rig.conductor,
        &direct_lakefs,
        &[(cert, &expired.cert), (key, &expired.key)],
    );
    assert_eq!(code, Some(1), "{error}");
    assert!(
        error.contains(&format!(
            "{}: the client certificate (CN=perago-sidecar, serial ",
            shown(cert, &expired.cert)
        )) && error.contains(") expired at 2021-01-01T00:00:00Z; renew it"),
        "{error}"
    );
    // A certificate without its key.
    let (code, error) = run(&rig.conductor, &direct_lakefs, &[(cert, &good.cert)]);
    assert_eq!(code, Some(1), "{error}");
    assert_eq!(
        error,
        "error: PERAGO_CONDUCTOR_CLIENT_CERT_FILE is set but PERAGO_CONDUCTOR_CLIENT_KEY_FILE \
         is not: a client certificate needs its key"
    );

    // No certificate for the gateway in front of Conductor: refused, and where to set one.
    let (code, error) = run(&rig.conductor, &direct_lakefs, &[]);
    assert_eq!(code, Some(1), "{error}");
    eprintln!("without a certificate: {error}");
    assert_eq!(
        error,
        format!(
            "error: failed to validate Conductor TaskDef: Conductor get of TaskDef \
             'gateway.start' was refused: the gateway requires a client certificate and none \
             was sent (HTTP 400: No required SSL certificate was sent) (Conductor {}); no \
             client certificate is set (spec.conductor.tls.clientCertificateRef, \
             PERAGO_CONDUCTOR_CLIENT_CERT_FILE)",
            rig.conductor
        )
    );
    // A stranger's certificate for the gateway in front of lakeFS: refused at start too.
    let stranger = Authority::create_named(&rig.dir.path().join("stranger"), "stranger-ca")
        .unwrap()
        .issue("stranger", "perago-sidecar", &Usage::Client { org: None })
        .unwrap();
    let (code, error) = run(
        &direct_conductor,
        &rig.lakefs,
        &[
            ("PERAGO_LAKEFS_CLIENT_CERT_FILE", &stranger.cert),
            ("PERAGO_LAKEFS_CLIENT_KEY_FILE", &stranger.key),
        ],
    );
    assert_eq!(code, Some(1), "{error}");
    assert!(
        error.starts_with(
            "error: lakeFS get storage config could not be sent: the gateway refused the \
             client certificate"
        ) && error.contains("; presented the client certificate CN=perago-sidecar, serial "),
        "{error}"
    );
}

/// A Secret volume as the kubelet keeps it: `tls.crt` and `tls.key` are links through `..data`
/// to a directory of the current generation, and an update is one rename of `..data`.
struct SecretVolume {
    dir: PathBuf,
    generation: u32,
}

impl SecretVolume {
    fn new(dir: PathBuf, pair: &Pair) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let mut volume = Self { dir, generation: 0 };
        volume.update(pair);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.dir.join(name)).unwrap();
        }
        volume
    }

    fn update(&mut self, pair: &Pair) {
        self.generation += 1;
        let data = format!("..generation-{}", self.generation);
        std::fs::create_dir(self.dir.join(&data)).unwrap();
        std::fs::copy(&pair.cert, self.dir.join(&data).join("tls.crt")).unwrap();
        std::fs::copy(&pair.key, self.dir.join(&data).join("tls.key")).unwrap();
        let link = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        std::fs::rename(&link, self.dir.join("..data")).unwrap();
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

#[tokio::test]
async fn a_pod_presents_its_renewed_certificate_within_the_reload_interval() {
    let rig = Rig::start().await;
    let services = services().await;
    let api = ConductorApi::new(&services.conductor().api_url);
    let task = "gateway.rotate";
    let contract = support::register_workspace_task(&api, task, 0, 0).await;
    let first = rig.certificate("first", "perago-sidecar-1");
    let second = rig.certificate("second", "perago-sidecar-2");
    let mut volume = SecretVolume::new(rig.dir.path().join("client-cert"), &first);
    let ca = rig.gateway.serving_ca.display().to_string();
    let (cert, key) = (volume.path("tls.crt"), volume.path("tls.key"));
    let mut env = support::lakefs_env(
        &rig.lakefs,
        &[
            ("PERAGO_LAKEFS_CA_FILE", &ca),
            ("PERAGO_LAKEFS_CLIENT_CERT_FILE", &cert),
            ("PERAGO_LAKEFS_CLIENT_KEY_FILE", &key),
        ],
    );
    env.extend([
        ("PERAGO_CONDUCTOR_CA_FILE", ca.as_str()),
        ("PERAGO_CONDUCTOR_CLIENT_CERT_FILE", cert.as_str()),
        ("PERAGO_CONDUCTOR_CLIENT_KEY_FILE", key.as_str()),
    ]);
    let body = r#"echo started > "$T/started"; sleep 1
echo "$PERAGO_WORKFLOW_INSTANCE_ID" > "$PERAGO_WORKSPACE/run.txt"
printf '{"files": 1}' > "$PERAGO_RESULT"
"#;
    let bins = PodBinaries::beside(env!("CARGO_BIN_EXE_perago-sidecar"));
    let pod = Pod::start(&bins, &rig.conductor, &contract, body, &env).await;

    let lake = Lake::of(services.lakefs());
    let repository = format!("gateway-rotate-{}", std::process::id());
    let mut head = lake
        .seed(&repository, &[("data/seed.txt", "seed")])
        .await
        .unwrap();
    // Workflows one after the other, each on the head the last one published. The
    // certificate is renewed while the fourth one's body runs.
    let mut renewed_at = None;
    for run in 0..8 {
        let _ = std::fs::remove_file(pod.path("started"));
        let workflow = api
            .start(
                task,
                &format!("run{run}"),
                json!({"workspace": {"repository": repository, "branch": "main",
                       "refType": "commit", "ref": head}, "params": {}}),
            )
            .await;
        if run == 3 {
            perago_e2e::pod::wait_file(&pod.path("started")).await;
            volume.update(&second);
            renewed_at = Some(SystemTime::now());
        }
        let finished = api.finished(&workflow).await;
        let step = &finished["tasks"][0];
        assert_eq!(step["status"], "COMPLETED", "{step}\n{}", pod.log());
        head = step["outputData"]["workspace"]["ref"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    // A few more polls, for the requests after the renewal to be many.
    let settled = Instant::now();
    while settled.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let renewed_at = unix_seconds(renewed_at.unwrap());

    let requests = rig.gateway.requests();
    assert!(
        requests.iter().all(|r| r.verify == "SUCCESS"),
        "every request presented an admitted certificate: {:?}",
        requests.iter().find(|r| r.verify != "SUCCESS")
    );
    let subjects = |from: f64, to: f64| -> Vec<&str> {
        requests
            .iter()
            .filter(|r| r.time >= from && r.time < to)
            .map(|r| r.subject.as_str())
            .collect()
    };
    assert!(subjects(0.0, renewed_at).contains(&"CN=perago-sidecar-1"));
    // Requests that start RELOAD_EVERY after the renewal present the new certificate; one
    // second more for those already under way (a long poll, a merge) to end.
    let bound = renewed_at + (RELOAD_EVERY + Duration::from_secs(1)).as_secs_f64();
    let after = subjects(bound, f64::MAX);
    assert!(after.len() > 10, "{after:?}");
    assert!(
        after.iter().all(|s| *s == "CN=perago-sidecar-2"),
        "old certificate presented after {bound}: {:?}",
        requests
            .iter()
            .filter(|r| r.time >= bound && r.subject != "CN=perago-sidecar-2")
            .collect::<Vec<_>>()
    );
    let first_new = requests
        .iter()
        .find(|r| r.subject == "CN=perago-sidecar-2")
        .unwrap();
    assert!(
        first_new.time - renewed_at <= bound - renewed_at,
        "first request with the new certificate {:.3} s after the renewal",
        first_new.time - renewed_at
    );
    // The serial the gateway logged is the one the sidecar read and names in its log.
    let renewed = identity_files(("CERT", Some(&second.cert)), ("KEY", Some(&second.key)))
        .unwrap()
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(first_new.serial, renewed.serial);
    eprintln!(
        "the renewed certificate (serial {}) first presented {:.3} s after the renewal; {} requests since",
        renewed.serial,
        first_new.time - renewed_at,
        after.len()
    );
    let log = pod
        .log_with(&["the client certificate changed", &renewed.serial])
        .await;
    assert!(
        log.lines()
            .any(|l| l.contains("the client certificate changed") && l.contains(&renewed.serial)),
        "{log}"
    );
    drop(pod);
}
