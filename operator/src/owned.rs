//! The objects the operator runs for its tasks, as watches keep them (ADR 0015): the executor
//! pods (busy slots, why a rollout is stuck) and the Deployments and ConfigMaps (their status,
//! and whether an apply would change anything). A reconcile reads these instead of listing
//! pods and re-applying unchanged objects: at hundreds of tasks those requests were most of
//! what the operator asked of the apiserver.

use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::conductor::holds;
use crate::render::TASK_LABEL;

/// The label every object the operator renders carries; the watches select on it.
pub const MANAGED: &str = "app.kubernetes.io/managed-by=perago-operator";

/// The hash of what the operator last applied to an object, on the object.
pub const RENDERED: &str = "perago.io/rendered";

#[derive(Clone)]
pub struct Owned {
    pub pods: Store<Pod>,
    pub deployments: Store<Deployment>,
    pub config_maps: Store<ConfigMap>,
}

/// What fills an [`Owned`]: handed to [`Writers::watch`] once the process leads.
pub struct Writers {
    pods: Writer<Pod>,
    deployments: Writer<Deployment>,
    config_maps: Writer<ConfigMap>,
}

/// A change to one of the owned Deployments or ConfigMaps, for the controller's triggers.
pub type Changes<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

impl Owned {
    pub fn new() -> (Self, Writers) {
        let (pods, pods_writer) = reflector::store();
        let (deployments, deployments_writer) = reflector::store();
        let (config_maps, config_maps_writer) = reflector::store();
        let owned = Self {
            pods,
            deployments,
            config_maps,
        };
        let writers = Writers {
            pods: pods_writer,
            deployments: deployments_writer,
            config_maps: config_maps_writer,
        };
        (owned, writers)
    }

    /// Watched, and nothing there: for the reconcile's unit tests.
    pub fn empty() -> Self {
        let (owned, mut writers) = Self::new();
        writers.pods.apply_watcher_event(&watcher::Event::InitDone);
        writers
            .deployments
            .apply_watcher_event(&watcher::Event::InitDone);
        writers
            .config_maps
            .apply_watcher_event(&watcher::Event::InitDone);
        owned
    }

    /// Once each watch has listed what exists. Before that a task's pods would look like none,
    /// and none running would let a scale-in remove busy pods.
    pub async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.pods.wait_until_ready().await?;
        self.deployments.wait_until_ready().await?;
        self.config_maps.wait_until_ready().await
    }

    /// The executor pods of task `name` in namespace `ns`.
    pub fn pods(&self, ns: &str, name: &str) -> Vec<Arc<Pod>> {
        self.pods.state_filter(|pod| {
            pod.metadata.namespace.as_deref() == Some(ns)
                && pod.labels().get(TASK_LABEL).map(String::as_str) == Some(name)
        })
    }
}

impl Writers {
    /// The three watches. The pods' is driven by the returned future; the Deployments' and
    /// ConfigMaps' by the controller that takes their streams as triggers.
    pub fn watch(
        self,
        client: &Client,
    ) -> (
        impl std::future::Future<Output = ()> + Send + 'static,
        Changes<Deployment>,
        Changes<ConfigMap>,
    ) {
        let pods = reflected(Api::<Pod>::all(client.clone()), self.pods)
            .for_each(|_| std::future::ready(()));
        (
            pods,
            reflected(Api::all(client.clone()), self.deployments),
            reflected(Api::all(client.clone()), self.config_maps),
        )
    }
}

fn reflected<K>(api: Api<K>, writer: Writer<K>) -> Changes<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    K: serde::de::DeserializeOwned,
{
    watcher(api, watcher::Config::default().labels(MANAGED))
        .default_backoff()
        // Nothing reads who manages which field; at hundreds of objects it is most of their
        // size in memory.
        .modify(|object| object.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects()
        .boxed()
}

/// `rendered` with the [`RENDERED`] hash of its content among its annotations.
pub fn stamped<K: Resource + Serialize>(mut rendered: K) -> K {
    let hash = match serde_json::to_vec(&rendered) {
        Ok(bytes) => format!("{:x}", Sha256::digest(bytes)),
        Err(_) => return rendered,
    };
    rendered
        .annotations_mut()
        .insert(RENDERED.to_owned(), hash[..16].to_owned());
    rendered
}

/// The live object from `store`, when it already holds everything in `rendered` (a
/// [`stamped`] object): the stamp says nothing was added or removed since the operator last
/// applied, and the values say nobody changed what it applied. An apply would change nothing.
pub fn unchanged<K>(store: &Store<K>, rendered: &K) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + 'static,
{
    let key = ObjectRef::new(&rendered.name_any()).within(rendered.namespace().as_deref()?);
    let live = store.get(&key)?;
    let stamp = rendered.annotations().get(RENDERED)?;
    if live.annotations().get(RENDERED) != Some(stamp) {
        return None;
    }
    let (Ok(live_value), Ok(rendered_value)) =
        (serde_json::to_value(&*live), serde_json::to_value(rendered))
    else {
        return None;
    };
    holds(&live_value, &rendered_value).then_some(live)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::runtime::watcher::Event;

    fn config_map(data: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t-perago", "namespace": "ns", "labels": {"a": "b"}},
            "data": {"contract.json": data},
        }))
        .unwrap()
    }

    fn store_of(objects: Vec<ConfigMap>) -> Store<ConfigMap> {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for o in objects {
            writer.apply_watcher_event(&Event::InitApply(o));
        }
        writer.apply_watcher_event(&Event::InitDone);
        store
    }

    #[test]
    fn an_apply_is_skipped_only_when_the_stamp_and_every_rendered_value_are_live() {
        let rendered = stamped(config_map("{}"));
        let mut live = rendered.clone();
        live.metadata.resource_version = Some("7".into());
        live.metadata.uid = Some("u".into());
        assert!(unchanged(&store_of(vec![live.clone()]), &rendered).is_some());

        assert!(
            unchanged(&store_of(vec![]), &rendered).is_none(),
            "not made yet"
        );
        let edited = ConfigMap {
            data: config_map("{\"x\": 1}").data,
            ..live.clone()
        };
        assert!(
            unchanged(&store_of(vec![edited]), &rendered).is_none(),
            "someone changed a value"
        );
        // The render changed: a new stamp, even where the live object holds every new value
        // (a label the operator no longer renders must be removed by an apply).
        let fewer_labels = {
            let mut c = config_map("{}");
            c.metadata.labels = None;
            stamped(c)
        };
        assert!(unchanged(&store_of(vec![live]), &fewer_labels).is_none());
    }
}
