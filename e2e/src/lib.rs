//! The real-services harness: obtains (builds once, then caches) and starts Conductor OSS,
//! lakeFS, etcd and kube-apiserver on loopback for tests and the demo, and on demand a whole
//! single-node cluster (controller-manager, scheduler, containerd, kubelet, kube-proxy) whose
//! pods reach those servers on a bridge of this machine.
//!
//! Every server runs under `e2e/bin/watchdog`, which stops it when the starting process exits
//! in any way, so a failed or interrupted test run leaves no server behind.

pub mod adapter;
pub mod chart_readme;
pub mod cluster;
pub mod collector;
pub mod faults;
pub mod fleet;
pub mod flux;
pub mod gateway;
pub mod lake;
pub mod measure;
pub mod node;
pub mod pki;
pub mod pod;
pub mod policies;
pub mod process;
pub mod prometheus;
pub mod python;
pub mod registry;
pub mod services;
pub mod storage;
pub mod workload;

pub use services::{Selection, Services};

use tokio::sync::OnceCell;

static SHARED: OnceCell<Services> = OnceCell::const_new();

/// Servers shared by every test of one test binary, started on first use. The selection of
/// the first caller wins, so a test binary should always ask for the same set.
pub async fn shared(selection: Selection) -> &'static Services {
    SHARED
        .get_or_try_init(|| Services::start(selection))
        .await
        .unwrap_or_else(|e| panic!("starting the real servers failed: {e:#}"))
}

/// Whether a developer opted out of the node's tests on this machine (`PERAGO_E2E_SKIP_NODE=1`,
/// e.g. without root). Prints one line naming the skipped test. CI never sets it: a host that
/// cannot run the node fails those tests with the component's own error instead.
pub fn node_opted_out(test: &str) -> bool {
    let opted_out = std::env::var_os("PERAGO_E2E_SKIP_NODE").is_some_and(|v| !v.is_empty());
    if opted_out {
        // Straight to the file descriptor: the test harness captures `eprintln!` of passing
        // tests, and a skip must be seen.
        let line = format!(
            "SKIPPED {test}: it needs the single-node cluster and PERAGO_E2E_SKIP_NODE is set\n"
        );
        match std::fs::OpenOptions::new().append(true).open("/dev/stderr") {
            Ok(mut stderr) => drop(std::io::Write::write_all(&mut stderr, line.as_bytes())),
            Err(_) => eprint!("{line}"),
        }
    }
    opted_out
}

/// The documents of a multi-document YAML stream (empty ones skipped), as `kubectl`, `helm
/// template` and `perago-operator render` print them.
pub fn yaml_documents(text: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(text)
        .filter_map(|doc| serde::Deserialize::deserialize(doc).ok())
        .filter(|v: &serde_yaml::Value| !v.is_null())
        .collect()
}

/// The first document of `kind` in a multi-document YAML stream.
pub fn yaml_document(text: &str, kind: &str) -> Option<serde_yaml::Value> {
    yaml_documents(text).into_iter().find(|d| d["kind"] == kind)
}

/// Apply a CustomResourceDefinition server-side and wait (at most 30 s) until the apiserver
/// has it Established.
pub async fn apply_crd(
    client: &kube::Client,
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    manager: &str,
) -> anyhow::Result<()> {
    use kube::api::{Api, Patch, PatchParams};
    use kube::runtime::wait::{await_condition, conditions};
    let crds: Api<_> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    crds.patch(
        &name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(crd),
    )
    .await?;
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        await_condition(crds, &name, conditions::is_crd_established()),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the CRD {name} was not Established within 30 s"))??;
    Ok(())
}
