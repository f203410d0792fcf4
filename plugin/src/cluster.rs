//! The Kubernetes side of the plugin: kubectl's `-n`, `--context` and `--kubeconfig`, and
//! `--task`, the endpoints and credentials a PeragoTask's pods use, read through the user's
//! kubeconfig (their RBAC applies) from the executor Deployment the operator made for it and
//! the Secrets its sidecar's environment names. What flags or environment variables give
//! wins; this fills the rest.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{EnvVar, Secret};
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use perago_api::PeragoTask;

/// The sidecar container of every executor pod.
pub const SIDECAR: &str = "perago-sidecar";

/// kubectl's own flags for reaching the cluster, with kubectl's meanings.
#[derive(Args, Debug, Clone, Default)]
pub struct ClusterFlags {
    /// The namespace of the task (default: the kubeconfig context's).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig file (default: `KUBECONFIG`, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
}

/// A client of the cluster the flags name, whose every request ends within `timeout`
/// (`None`: requests that stream, such as `logs -f`), and the namespace to work in.
pub async fn connect(
    flags: &ClusterFlags,
    timeout: Option<Duration>,
) -> anyhow::Result<(kube::Client, String)> {
    let options = KubeConfigOptions {
        context: flags.context.clone(),
        ..KubeConfigOptions::default()
    };
    let mut config = match (&flags.kubeconfig, &flags.context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options).await?
        }
        (None, Some(context)) => kube::Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("reading the kubeconfig for context {context}"))?,
        (None, None) => kube::Config::infer().await.context(
            "finding a kubeconfig (KUBECONFIG, ~/.kube/config) or in-cluster credentials",
        )?,
    };
    config.connect_timeout = timeout;
    config.read_timeout = timeout;
    config.write_timeout = timeout;
    let namespace = flags
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    Ok((client, namespace))
}

/// The values of the variables the sidecar of `namespace/name`'s pods is given, by name.
pub async fn task_environment(
    cluster: &ClusterFlags,
    timeout: Duration,
    name: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let (client, namespace) = connect(cluster, Some(timeout)).await?;
    let what = format!("PeragoTask {namespace}/{name}");
    Api::<PeragoTask>::namespaced(client.clone(), &namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("reading {what}"))?
        .ok_or_else(|| anyhow!("{what} not found"))?;
    let deployment = Api::<Deployment>::namespaced(client.clone(), &namespace)
        .get_opt(&perago_api::task::object_name(name))
        .await
        .with_context(|| format!("reading the executor Deployment of {what}"))?
        .ok_or_else(|| {
            anyhow!("{what} has no executor Deployment yet (is its spec valid? kubectl describe ptask {name})")
        })?;
    let pod = deployment
        .spec
        .and_then(|s| s.template.spec)
        .ok_or_else(|| anyhow!("the executor Deployment of {what} has no pod template"))?;
    let sidecar = pod
        .init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .find(|c| c.name == SIDECAR)
        .ok_or_else(|| anyhow!("the executor Deployment of {what} has no {SIDECAR} container"))?;
    let secrets = Api::<Secret>::namespaced(client, &namespace);
    let mut read: BTreeMap<String, Secret> = BTreeMap::new();
    let mut env = BTreeMap::new();
    for var in sidecar.env.iter().flatten() {
        if let Some(value) = value_of(var, &secrets, &mut read, &namespace).await? {
            env.insert(var.name.clone(), value);
        }
    }
    Ok(env)
}

/// A variable's literal value, or the Secret key it refers to; `None` for other sources.
async fn value_of(
    var: &EnvVar,
    secrets: &Api<Secret>,
    read: &mut BTreeMap<String, Secret>,
    namespace: &str,
) -> anyhow::Result<Option<String>> {
    if let Some(value) = &var.value {
        return Ok(Some(value.clone()));
    }
    let Some(selector) = var
        .value_from
        .as_ref()
        .and_then(|f| f.secret_key_ref.as_ref())
    else {
        return Ok(None);
    };
    if !read.contains_key(&selector.name) {
        let secret = secrets
            .get_opt(&selector.name)
            .await
            .with_context(|| format!("reading Secret {namespace}/{}", selector.name))?
            .ok_or_else(|| anyhow!("Secret {namespace}/{} not found", selector.name))?;
        read.insert(selector.name.clone(), secret);
    }
    let data = read[&selector.name].data.as_ref();
    let bytes = data.and_then(|d| d.get(&selector.key)).ok_or_else(|| {
        anyhow!(
            "Secret {namespace}/{} has no key {}",
            selector.name,
            selector.key
        )
    })?;
    String::from_utf8(bytes.0.clone())
        .map(|v| Some(v.trim().to_owned()))
        .map_err(|_| {
            anyhow!(
                "Secret {namespace}/{} key {} is not text",
                selector.name,
                selector.key
            )
        })
}

/// A Kubernetes error in the user's terms: a refusal by RBAC names the permission to ask for.
pub fn explained(e: kube::Error, verb: &str, resource: &str, namespace: &str) -> anyhow::Error {
    match &e {
        kube::Error::Api(status) if status.code == 403 => anyhow!(
            "forbidden: your account may not {verb} {resource} in namespace {namespace} \
             (RBAC: ask for `{verb}` on `{resource}`): {}",
            status.message
        ),
        kube::Error::Api(status) if status.code == 401 => anyhow!(
            "unauthorized: the cluster did not accept the kubeconfig's credentials: {}",
            status.message
        ),
        _ => anyhow!("{verb} {resource} in namespace {namespace}: {e}"),
    }
}
