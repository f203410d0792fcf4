//! The real kube-apiserver + etcd and Conductor of a test binary, with the CRD installed and the
//! binary's one operator process (two would race for the same objects).

#![allow(clippy::unwrap_used, dead_code)]

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use perago_api::{PeragoTask, manifest};
use perago_e2e::process::ServerProcess;
use perago_e2e::{Selection, Services, shared};

pub async fn services() -> &'static Services {
    shared(Selection {
        conductor: true,
        kube: true,
        ..Selection::default()
    })
    .await
}

/// The operator of this test binary, started once with `args` after `run`; its log is
/// `operator.log` in the servers' directory.
pub struct Operator {
    _process: ServerProcess,
    /// Its `/metrics`.
    pub metrics_url: String,
}

static OPERATOR: tokio::sync::OnceCell<Operator> = tokio::sync::OnceCell::const_new();

pub async fn start(services: &Services, args: &[&str]) -> &'static Operator {
    OPERATOR
        .get_or_init(|| async {
            install_crd(&services.kube().client().await.unwrap()).await;
            let http = format!("127.0.0.1:{}", perago_e2e::process::free_port().unwrap());
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_perago-operator"));
            command
                .args([
                    "run",
                    "--conductor-url",
                    &services.conductor().api_url,
                    "--http-addr",
                    &http,
                ])
                .args(args)
                .env("KUBECONFIG", &services.kube().kubeconfig);
            let process = ServerProcess::spawn(
                "perago-operator",
                &mut command,
                services.dir().join("operator.log"),
            )
            .unwrap();
            Operator {
                _process: process,
                metrics_url: format!("http://{http}/metrics"),
            }
        })
        .await
}

impl Operator {
    /// The value of the metric series `series` (name and labels, as exported), if present.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = reqwest::get(&self.metrics_url)
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }
}

pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/peragotasks.perago.io.yaml"
    ))
    .unwrap();
    let crd: CustomResourceDefinition = serde_yaml::from_str(&text).unwrap();
    crds.patch(
        "peragotasks.perago.io",
        &PatchParams::apply("perago-test").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    eventually("the CRD is established", || async {
        let c = crds.get("peragotasks.perago.io").await.ok()?;
        c.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
}

pub async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    within(Duration::from_secs(60), what, probe).await
}

pub async fn within<T, F, Fut>(limit: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn task(name: &str, task_name: &str, extra: &str) -> PeragoTask {
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: {name}, namespace: default}}
spec:
  taskName: {task_name}
  ownerEmail: ops@example.com
  paramsSchema: {{type: object, properties: {{n: {{type: integer}}}}}}
  resultSchema: {{type: object, properties: {{ok: {{type: boolean}}}}}}
  deletionPolicy: Delete
  executor: {{body: {{image: reg/body:1, command: [/app/run]}}}}
{extra}"#
    );
    manifest::parse(&yaml).unwrap().remove(0).task
}
