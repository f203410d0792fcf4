//! `--task`: the endpoints and credentials a PeragoTask's pods use, read through the user's
//! kubeconfig (their RBAC applies) from the executor Deployment the operator made for it and
//! the Secrets its sidecar's environment names. What flags or environment variables give
//! wins; this fills the rest.

use std::collections::BTreeMap;

use anyhow::{Context, anyhow};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{EnvVar, Secret};
use kube::Api;
use perago_api::PeragoTask;

/// The sidecar container of every executor pod.
const SIDECAR: &str = "perago-sidecar";

/// The values of the variables the sidecar of `namespace/name`'s pods is given, by name.
pub async fn task_environment(
    namespace: Option<&str>,
    name: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let client = kube::Client::try_default()
        .await
        .context("reading the kubeconfig for --task")?;
    let namespace = namespace.map_or_else(|| client.default_namespace().to_owned(), str::to_owned);
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
