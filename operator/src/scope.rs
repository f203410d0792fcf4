//! Where the operator looks: every namespace (the default), or only the namespaces it is given
//! (`--watch-namespaces`, the chart's `watchNamespaces`), where it holds Roles instead of
//! ClusterRoles. A watch of several namespaces is one watch per namespace, each with its own
//! store (a reflector's store is made whole by its own listing, so two listings cannot share
//! one), and the reconcile reads them together through [`Stores`].

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use tokio::sync::mpsc;

/// The namespaces the operator watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Cluster,
    Namespaces(Vec<String>),
}

impl Scope {
    /// From the flag's comma-separated list: empty means every namespace.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut namespaces: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        if namespaces.is_empty() {
            return Ok(Self::Cluster);
        }
        for namespace in &namespaces {
            let valid = namespace.len() <= 63
                && namespace
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !namespace.starts_with('-')
                && !namespace.ends_with('-');
            if !valid {
                return Err(format!(
                    "watch namespaces: {namespace:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
                ));
            }
        }
        namespaces.sort();
        namespaces.dedup();
        Ok(Self::Namespaces(namespaces))
    }

    /// One API per watch: all namespaces, or each given one.
    pub fn apis<K>(&self, client: &Client) -> Vec<Api<K>>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match self {
            Self::Cluster => vec![Api::all(client.clone())],
            Self::Namespaces(namespaces) => namespaces
                .iter()
                .map(|ns| Api::namespaced(client.clone(), ns))
                .collect(),
        }
    }

    /// The watched namespace that holds `namespace`'s objects: its index in [`Self::apis`].
    pub fn watch_of(&self, namespace: &str) -> Option<usize> {
        match self {
            Self::Cluster => Some(0),
            Self::Namespaces(namespaces) => namespaces.iter().position(|n| n == namespace),
        }
    }
}

/// The stores of one kind's watches, read as one.
pub struct Stores<K: Resource<DynamicType = ()> + Clone + 'static> {
    stores: Vec<Store<K>>,
    /// Held while waiting for the stores to be ready; see [`Self::wait_until_ready`].
    one_waiter: tokio::sync::Mutex<()>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Stores<K> {
    pub fn new(stores: Vec<Store<K>>) -> Self {
        Self {
            stores,
            one_waiter: tokio::sync::Mutex::new(()),
        }
    }

    pub fn state(&self) -> Vec<Arc<K>> {
        self.stores.iter().flat_map(Store::state).collect()
    }

    pub fn state_filter(&self, keep: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        self.stores
            .iter()
            .flat_map(|s| s.state_filter(&keep))
            .collect()
    }

    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        self.stores.iter().find_map(|s| s.get(key))
    }

    /// Once every watch has listed what exists.
    ///
    /// One caller at a time waits on the stores themselves, the others on a lock: kube's
    /// `Store::wait_until_ready` keeps the waker of the last future that polled it, so of
    /// several reconciles waiting at once only one was woken when the store became ready and
    /// the others waited for good (seen right after a leader handover, when the first
    /// reconciles run before the owned watches have listed).
    pub async fn wait_until_ready(
        &self,
    ) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
        let _one_waiter = self.one_waiter.lock().await;
        for store in &self.stores {
            store.wait_until_ready().await?;
        }
        Ok(())
    }
}

/// Wakes the reconcile of a task in the controller that watches its namespace.
#[derive(Clone)]
pub struct Wake {
    scope: Scope,
    senders: Vec<mpsc::Sender<ObjectRef<perago_api::PeragoTask>>>,
    metrics: std::sync::Arc<crate::telemetry::Metrics>,
}

impl Wake {
    pub fn new(
        scope: Scope,
        senders: Vec<mpsc::Sender<ObjectRef<perago_api::PeragoTask>>>,
        metrics: std::sync::Arc<crate::telemetry::Metrics>,
    ) -> Self {
        Self {
            scope,
            senders,
            metrics,
        }
    }

    /// Ask for a reconcile. Should the channel be full (1,024 wake-ups not taken yet), this
    /// one is dropped, and the task's resync still comes.
    pub fn wake(&self, task: ObjectRef<perago_api::PeragoTask>) {
        let index = task
            .namespace
            .as_deref()
            .and_then(|ns| self.scope.watch_of(ns));
        if let Some(sender) = index.and_then(|i| self.senders.get(i)) {
            self.metrics
                .waits
                .seen(task.clone(), crate::telemetry::WaitCause::Scaling);
            let _ = sender.try_send(task);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn not_ready() -> (
        Arc<Stores<k8s_openapi::api::core::v1::ConfigMap>>,
        kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::ConfigMap>,
    ) {
        let (store, writer) = kube::runtime::reflector::store();
        (Arc::new(Stores::new(vec![store])), writer)
    }

    #[tokio::test]
    async fn every_waiter_is_woken_when_the_stores_are_ready() {
        let (stores, mut writer) = not_ready();
        let waiters = [(); 2].map(|()| {
            let stores = stores.clone();
            tokio::spawn(async move { stores.wait_until_ready().await.is_ok() })
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        for waiter in waiters {
            let woken = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await;
            assert!(matches!(woken, Ok(Ok(true))), "a waiter was never woken");
        }
    }

    /// Why [`Stores::wait_until_ready`] lets one caller wait at a time: kube's own wait wakes
    /// only the last of several waiters. When this fails, kube has fixed it and the lock can go.
    #[tokio::test]
    async fn kube_store_readiness_wakes_only_its_last_waiter() {
        let (store, mut writer) =
            kube::runtime::reflector::store::<k8s_openapi::api::core::v1::ConfigMap>();
        let waiters = [(); 2].map(|()| {
            let store = store.clone();
            tokio::spawn(async move { store.wait_until_ready().await.is_ok() })
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        let mut woken = 0;
        for waiter in waiters {
            if let Ok(Ok(true)) =
                tokio::time::timeout(std::time::Duration::from_secs(2), waiter).await
            {
                woken += 1;
            }
        }
        assert_eq!(woken, 1, "kube woke {woken} of 2 waiters");
    }

    #[test]
    fn the_flag_names_namespaces_or_none() {
        assert_eq!(Scope::parse("").unwrap(), Scope::Cluster);
        assert_eq!(Scope::parse(" , ").unwrap(), Scope::Cluster);
        assert_eq!(
            Scope::parse("team-b, team-a,team-b").unwrap(),
            Scope::Namespaces(vec!["team-a".into(), "team-b".into()])
        );
        for bad in ["Team", "a_b", "-a", "a-", &"a".repeat(64)] {
            assert!(
                Scope::parse(bad)
                    .unwrap_err()
                    .contains("is not a namespace name"),
                "{bad}"
            );
        }
        let scope = Scope::parse("team-a,team-b").unwrap();
        assert_eq!(scope.watch_of("team-b"), Some(1));
        assert_eq!(scope.watch_of("elsewhere"), None);
        assert_eq!(Scope::Cluster.watch_of("anywhere"), Some(0));
    }
}
