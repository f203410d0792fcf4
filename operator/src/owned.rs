//! The objects the operator runs for its tasks, as watches keep them (ADR 0015): the executor
//! pods (busy slots, why a rollout is stuck) and the Deployments, ConfigMaps and
//! NetworkPolicies (their status, and whether an apply would change anything). A reconcile
//! reads these instead of listing pods and re-applying unchanged objects: at hundreds of tasks
//! those requests were most of what the operator asked of the apiserver. The stores keep only what is read: no
//! `managedFields`, no pod, Deployment or NetworkPolicy spec, no ConfigMap data.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use parking_lot::Mutex;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::conductor::holds;
use crate::render::TASK_LABEL;
use crate::scope::{Scope, Stores};

/// The label every object the operator renders carries; the watches select on it.
pub const MANAGED: &str = "app.kubernetes.io/managed-by=perago-operator";

pub struct Owned {
    pub pods: Stores<Pod>,
    pub deployments: Stores<Deployment>,
    pub config_maps: Stores<ConfigMap>,
    pub network_policies: Stores<NetworkPolicy>,
    /// Per object: the hash of the render last applied, and the object's version that apply
    /// made.
    applied: Arc<Mutex<HashMap<Applied, (String, Version)>>>,
    /// Per Deployment (namespace, name): the pod template hash and the generation that
    /// introduced it, as last applied (`crate::lineage`).
    templates: Arc<Mutex<HashMap<(String, String), Recorded>>>,
}

/// A pod template's hash and the generation that introduced it.
type Recorded = (String, String);

/// What fills an [`Owned`]: handed to [`Writers::watch`] once the process leads. One writer
/// per kind and watched namespace (one for all of them in the cluster scope).
pub struct Writers {
    scope: Scope,
    pods: Vec<Writer<Pod>>,
    deployments: Vec<Writer<Deployment>>,
    config_maps: Vec<Writer<ConfigMap>>,
    network_policies: Vec<Writer<NetworkPolicy>>,
}

/// A change to one of the owned objects, for the controller's triggers.
pub type Changes<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

/// The changes to the objects a controller owns, from one watched namespace (or all): each
/// wakes the task that owns the object.
pub struct Triggers {
    pub deployments: Changes<Deployment>,
    pub config_maps: Changes<ConfigMap>,
    pub network_policies: Changes<NetworkPolicy>,
}

/// A store and its writer per watch of `scope`.
fn stores<K>(scope: &Scope) -> (Stores<K>, Vec<Writer<K>>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let watches = match scope {
        Scope::Cluster => 1,
        Scope::Namespaces(namespaces) => namespaces.len(),
    };
    let (stores, writers) = (0..watches).map(|_| reflector::store()).unzip();
    (Stores::new(stores), writers)
}

impl Owned {
    pub fn new(scope: &Scope) -> (Self, Writers) {
        let (pods, pods_writers) = stores(scope);
        let (deployments, deployments_writers) = stores(scope);
        let (config_maps, config_maps_writers) = stores(scope);
        let (network_policies, network_policies_writers) = stores(scope);
        let owned = Self {
            pods,
            deployments,
            config_maps,
            network_policies,
            applied: Arc::default(),
            templates: Arc::default(),
        };
        let writers = Writers {
            scope: scope.clone(),
            pods: pods_writers,
            deployments: deployments_writers,
            config_maps: config_maps_writers,
            network_policies: network_policies_writers,
        };
        (owned, writers)
    }

    /// Watched, and nothing there: for the reconcile's unit tests.
    pub fn empty() -> Self {
        let (owned, mut writers) = Self::new(&Scope::Cluster);
        for writer in &mut writers.pods {
            writer.apply_watcher_event(&watcher::Event::InitDone);
        }
        for writer in &mut writers.deployments {
            writer.apply_watcher_event(&watcher::Event::InitDone);
        }
        for writer in &mut writers.config_maps {
            writer.apply_watcher_event(&watcher::Event::InitDone);
        }
        for writer in &mut writers.network_policies {
            writer.apply_watcher_event(&watcher::Event::InitDone);
        }
        owned
    }

    /// Once each watch has listed what exists. Before that a task's pods would look like none,
    /// and none running would let a scale-in remove busy pods.
    pub async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.pods.wait_until_ready().await?;
        self.deployments.wait_until_ready().await?;
        self.config_maps.wait_until_ready().await?;
        self.network_policies.wait_until_ready().await
    }

    /// The executor pods of task `name` in namespace `ns`.
    pub fn pods(&self, ns: &str, name: &str) -> Vec<Arc<Pod>> {
        self.pods.state_filter(|pod| {
            pod.metadata.namespace.as_deref() == Some(ns)
                && pod.labels().get(TASK_LABEL).map(String::as_str) == Some(name)
        })
    }

    /// The watched object of `rendered` when an apply of it would change nothing: this
    /// process last applied the same render, the object is still at the version that apply
    /// made or, for one with a generation, at an older one the watch has not caught up from
    /// yet (nobody changed its spec or, for a ConfigMap, anything), and its labels,
    /// annotations and owners still hold the rendered ones (those change no generation).
    /// After a restart nothing is known, and each object is applied once.
    pub fn unchanged<K>(&self, store: &Stores<K>, rendered: &K) -> Option<Arc<K>>
    where
        K: Resource<DynamicType = ()> + Clone + Serialize + 'static,
    {
        let key = ObjectRef::new(&rendered.name_any()).within(rendered.namespace().as_deref()?);
        let live = store.get(&key)?;
        let (hash, made) = self.memo().get(&Applied::of(rendered))?.clone();
        if hash != render_hash(rendered)? || !Version::of(&*live)?.unchanged_since(&made) {
            return None;
        }
        let (Ok(live_meta), Ok(rendered_meta)) = (
            serde_json::to_value(live.meta()),
            serde_json::to_value(rendered.meta()),
        ) else {
            return None;
        };
        holds(&live_meta, &rendered_meta).then_some(live)
    }

    /// `rendered` was applied and the apiserver answered with `applied`.
    pub fn applied<K: Resource<DynamicType = ()> + Serialize>(&self, rendered: &K, applied: &K) {
        let mut memo = self.memo();
        match (render_hash(rendered), Version::of(applied)) {
            (Some(hash), Some(made)) => memo.insert(Applied::of(rendered), (hash, made)),
            _ => memo.remove(&Applied::of(rendered)),
        };
    }

    /// A deleted task's objects go with it.
    pub fn forget(&self, ns: &str, name: &str) {
        self.memo()
            .retain(|object, _| !(object.namespace == ns && object.name == name));
        self.templates
            .lock()
            .remove(&(ns.to_owned(), name.to_owned()));
    }

    /// The template hash and generation this process last applied for Deployment `name`.
    pub fn template(&self, ns: &str, name: &str) -> Option<Recorded> {
        self.templates
            .lock()
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Remember the template hash and generation applied for Deployment `name`.
    pub fn record_template(&self, ns: &str, name: &str, recorded: Recorded) {
        self.templates
            .lock()
            .insert((ns.to_owned(), name.to_owned()), recorded);
    }

    fn memo(&self) -> parking_lot::MutexGuard<'_, HashMap<Applied, (String, Version)>> {
        self.applied.lock()
    }
}

/// An object the operator applied.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Applied {
    kind: String,
    namespace: String,
    name: String,
}

impl Applied {
    fn of<K: Resource<DynamicType = ()>>(object: &K) -> Self {
        Self {
            kind: K::kind(&()).into_owned(),
            namespace: object.namespace().unwrap_or_default(),
            name: object.name_any(),
        }
    }
}

fn render_hash<K: Serialize>(rendered: &K) -> Option<String> {
    let bytes = serde_json::to_vec(rendered).ok()?;
    Some(format!("{:x}", Sha256::digest(bytes)))
}

/// What changes when somebody changes the object: the generation where it has one (so the
/// Deployment controller's status writes do not count), else the resource version; with the
/// uid, so that an object deleted and made again by somebody else is not taken for it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Version {
    uid: String,
    change: Change,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Change {
    Generation(i64),
    ResourceVersion(String),
}

impl Version {
    fn of<K: Resource>(object: &K) -> Option<Self> {
        let meta = object.meta();
        let change = match (meta.generation, &meta.resource_version) {
            (Some(generation), _) => Change::Generation(generation),
            (None, Some(version)) => Change::ResourceVersion(version.clone()),
            (None, None) => return None,
        };
        Some(Self {
            uid: meta.uid.clone()?,
            change,
        })
    }

    /// Whether the watched object at this version shows no change since this process's apply
    /// made version `made`: the same version, or an older generation of the same object.
    /// Under load the watch shows the operator's own apply seconds late; a change by anybody
    /// else after it would have a higher generation, so an older one means only that the watch
    /// lags, and applying again would write the same render once per reconcile until it
    /// caught up.
    fn unchanged_since(&self, made: &Version) -> bool {
        self == made
            || matches!((&self.change, &made.change),
                (Change::Generation(older), Change::Generation(newer))
                    if self.uid == made.uid && older < newer)
    }
}

impl Writers {
    /// The watches of each watched namespace (or of all). The pods' are driven by the
    /// returned future; the others (one [`Triggers`] per watched namespace, in the order of
    /// [`Scope::apis`]) by the controller that takes them as triggers.
    pub fn watch(
        self,
        client: &Client,
    ) -> (
        impl std::future::Future<Output = ()> + Send + 'static,
        Vec<Triggers>,
    ) {
        let pods = futures_util::stream::select_all(
            self.scope
                .apis(client)
                .into_iter()
                .zip(self.pods)
                .map(|(api, writer)| reflected(api, writer, trim_pod)),
        )
        .for_each({
            let client = client.clone();
            move |pod| {
                if let Ok(pod) = pod {
                    crate::lineage::annotate_body_image_id(&client, &pod);
                }
                std::future::ready(())
            }
        });
        let deployments = (self.scope.apis(client).into_iter().zip(self.deployments))
            .map(|(api, writer)| reflected(api, writer, |d: &mut Deployment| d.spec = None));
        let config_maps =
            (self.scope.apis(client).into_iter().zip(self.config_maps)).map(|(api, writer)| {
                reflected(api, writer, |c: &mut ConfigMap| {
                    c.data = None;
                    c.binary_data = None;
                })
            });
        let network_policies = (self.scope.apis(client).into_iter())
            .zip(self.network_policies)
            .map(|(api, writer)| reflected(api, writer, |n: &mut NetworkPolicy| n.spec = None));
        let triggers = deployments
            .zip(config_maps)
            .zip(network_policies)
            .map(|((deployments, config_maps), network_policies)| Triggers {
                deployments,
                config_maps,
                network_policies,
            })
            .collect();
        (pods, triggers)
    }
}

/// A pod as the reconcile reads it (its busy slots, its deletion cost, why it cannot start,
/// whether it is starting): name, labels, creation time, the deletion-cost annotation, whether
/// it is going; of its status the phase, IP, `Ready` and `PodScheduled` conditions (the time of
/// the latter) and its containers' states; for its lineage, the body's image id and the
/// annotation that copies it. The rest (spec, owners, images, IPs, other times, other
/// annotations) is never read, and at thousands of pods it would be most of what the store
/// holds (docs/scale.md).
fn trim_pod(pod: &mut Pod) {
    pod.spec = None;
    let meta = &mut pod.metadata;
    meta.owner_references = None;
    meta.generate_name = None;
    meta.finalizers = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.retain(|key, _| {
            key == crate::scaler::DELETION_COST
                || key == perago_api::pod::BODY_IMAGE_ID_ANNOTATION
                || key == crate::rollout::REVISION_ANNOTATION
        });
    }
    let Some(status) = &mut pod.status else {
        return;
    };
    status.host_ip = None;
    status.host_ips = None;
    status.pod_ips = None;
    status.start_time = None;
    status.qos_class = None;
    status.nominated_node_name = None;
    status.ephemeral_container_statuses = None;
    status.resource_claim_statuses = None;
    if let Some(conditions) = &mut status.conditions {
        conditions.retain(|c| c.type_ == "Ready" || c.type_ == "PodScheduled");
        for c in conditions {
            c.last_probe_time = None;
            // When it was scheduled: a scale-in waits for a pod that is starting.
            if c.type_ != "PodScheduled" {
                c.last_transition_time = None;
            }
        }
    }
    let containers = (status.init_container_statuses.iter_mut().flatten())
        .chain(status.container_statuses.iter_mut().flatten());
    for c in containers {
        c.image = String::new();
        // The body's, for its pod's lineage annotation (crate::lineage).
        if c.name != "body" {
            c.image_id = String::new();
        }
        c.container_id = None;
        c.allocated_resources = None;
        c.allocated_resources_status = None;
        c.resources = None;
        c.user = None;
        c.volume_mounts = None;
    }
}

/// How long a failed watch waits before it starts again: doubling from 0.5 s to at most 5 s
/// (±20 % jitter), from the start again after a success.
///
/// kube's default (client-go's: up to 30 s, reset only after 2 min) kept the operator's caches
/// stale for more than a minute after an API server outage: a watch that failed throughout
/// the outage waited 30 s, then met "too old resource version" and waited 30 s more before it
/// listed again. With 5 s the operator follows changes within seconds of the API server's
/// return; a few watches retrying every 5 s cost an API server nothing.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: std::time::Duration,
}

impl WatchBackoff {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(500);
    const LAST: std::time::Duration = std::time::Duration::from_secs(5);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<Self::Item> {
        let delay = self.next;
        self.next = (delay * 2).min(Self::LAST);
        // Jitter from the clock's nanoseconds: replicas and watches do not retry in step.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let factor = 0.8 + f64::from(nanos % 1000) / 2500.0;
        Some(delay.mul_f64(factor))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// The watch of `api`'s managed objects into `writer`, each `trim`med of what is not read.
fn reflected<K>(api: Api<K>, writer: Writer<K>, trim: fn(&mut K)) -> Changes<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    K: serde::de::DeserializeOwned,
{
    watcher(api, watcher::Config::default().labels(MANAGED))
        .backoff(WatchBackoff::default())
        .modify(move |object| {
            object.managed_fields_mut().clear();
            trim(object);
        })
        .reflect(writer)
        .touched_objects()
        .boxed()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::runtime::watcher::Event;

    #[test]
    fn a_failed_watch_waits_at_most_five_seconds_and_starts_over_after_a_success() {
        use kube::runtime::utils::Backoff;
        let mut backoff = WatchBackoff::default();
        let delays: Vec<f64> = backoff.by_ref().take(8).map(|d| d.as_secs_f64()).collect();
        let nominal = [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0];
        for (delay, nominal) in delays.iter().zip(nominal) {
            assert!(
                (nominal * 0.8..=nominal * 1.2).contains(delay),
                "{delays:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next().unwrap().as_secs_f64() <= 0.6);
    }

    #[test]
    fn a_trimmed_pod_reads_as_the_whole_one() {
        let whole: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "t-1", "namespace": "ns", "generateName": "t-",
                "labels": {"perago.io/task": "t"},
                "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1", "other": "x",
                                "perago.io/body-image-id": "sha256:1",
                                "perago.io/rollout-revision": "r1"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "t-abc", "uid": "u"}],
                "deletionTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"containers": [{"name": "body", "image": "b"}]},
            "status": {
                "phase": "Running", "podIP": "10.0.0.7", "hostIP": "10.0.0.1",
                "conditions": [
                    {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"},
                    {"type": "Initialized", "status": "True"},
                ],
                "containerStatuses": [{
                    "name": "body", "image": "b", "imageID": "sha256:1", "ready": false, "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                    "lastState": {"terminated": {"exitCode": 2, "message": "boom"}},
                }],
            },
        }))
        .unwrap();
        let mut trimmed = whole.clone();
        trim_pod(&mut trimmed);
        assert_eq!(
            crate::pods::problem([&trimmed]),
            crate::pods::problem([&whole])
        );
        let mut alive = whole.clone();
        alive.metadata.deletion_timestamp = None;
        let mut alive_trimmed = alive.clone();
        trim_pod(&mut alive_trimmed);
        assert!(crate::pods::problem([&alive_trimmed]).is_some());
        assert_eq!(
            crate::pods::problem([&alive_trimmed]),
            crate::pods::problem([&alive])
        );
        assert_eq!(trimmed.metadata.labels, whole.metadata.labels);
        assert_eq!(
            trimmed.metadata.deletion_timestamp,
            whole.metadata.deletion_timestamp
        );
        let annotations = trimmed.metadata.annotations.clone().unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            [
                crate::scaler::DELETION_COST,
                "perago.io/body-image-id",
                crate::rollout::REVISION_ANNOTATION
            ]
        );
        assert!(crate::rollout::runs_canary(
            &{
                let mut canary = trimmed.clone();
                (canary.metadata.labels.get_or_insert_default())
                    .insert(crate::rollout::TRACK_LABEL.into(), "canary".into());
                canary
            },
            "r1"
        ));
        assert_eq!(
            crate::lineage::body_image_id(&trimmed),
            Some("sha256:1"),
            "the body's image id stays, for the pod's lineage annotation"
        );
        let status = trimmed.status.clone().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.7"));
        let types: Vec<_> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, ["Ready", "PodScheduled"]);
        assert!(trimmed.spec.is_none() && status.host_ip.is_none());
        assert!(trimmed.metadata.owner_references.is_none());
    }

    /// A scale-in waits for a starting pod (ADRs 0030, 0048): the trimmed pod keeps what
    /// says so, its creation and the time it was scheduled.
    #[test]
    fn a_trimmed_pod_says_whether_it_is_starting() {
        let now = k8s_openapi::jiff::Timestamp::now();
        let ago = |s: i64| (now - k8s_openapi::jiff::SignedDuration::from_secs(s)).to_string();
        let pending = |conditions: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "t-1", "namespace": "ns", "creationTimestamp": ago(3)},
                "status": {"phase": "Pending", "conditions": conditions},
            }))
            .unwrap()
        };
        let scheduled = pending(serde_json::json!([
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": ago(2)},
        ]));
        let unscheduled = pending(serde_json::json!([]));
        for whole in [scheduled, unscheduled] {
            let mut trimmed = whole.clone();
            trim_pod(&mut trimmed);
            assert!(crate::scaler::decide::starting(&whole, now), "{whole:?}");
            assert!(
                crate::scaler::decide::starting(&trimmed, now),
                "{trimmed:?}"
            );
        }
    }

    fn config_map(data: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t-perago", "namespace": "ns", "labels": {"a": "b"}},
            "data": {"contract.json": data},
        }))
        .unwrap()
    }

    /// `rendered` as the apiserver stores it at `version`, trimmed as the watch trims it.
    fn live(rendered: &ConfigMap, version: &str) -> ConfigMap {
        let mut live = rendered.clone();
        live.metadata.resource_version = Some(version.into());
        live.metadata.uid = Some("u".into());
        live.data = None;
        live
    }

    fn store_of(objects: Vec<ConfigMap>) -> Stores<ConfigMap> {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for o in objects {
            writer.apply_watcher_event(&Event::InitApply(o));
        }
        writer.apply_watcher_event(&Event::InitDone);
        Stores::new(vec![store])
    }

    #[test]
    fn an_apply_is_skipped_only_for_the_same_render_on_the_version_it_made() {
        let owned = Owned::empty();
        let rendered = config_map("{}");
        let store = store_of(vec![live(&rendered, "7")]);
        assert!(
            owned.unchanged(&store, &rendered).is_none(),
            "never applied by this process"
        );
        owned.applied(&rendered, &live(&rendered, "7"));
        assert!(owned.unchanged(&store, &rendered).is_some());

        assert!(
            owned.unchanged(&store_of(vec![]), &rendered).is_none(),
            "gone"
        );
        assert!(
            owned
                .unchanged(&store_of(vec![live(&rendered, "8")]), &rendered)
                .is_none(),
            "somebody wrote it since"
        );
        assert!(
            owned.unchanged(&store, &config_map("{\"x\": 1}")).is_none(),
            "the render changed"
        );
        let mut made_again = live(&rendered, "7");
        made_again.metadata.uid = Some("v".into());
        assert!(
            owned
                .unchanged(&store_of(vec![made_again]), &rendered)
                .is_none(),
            "deleted and made again by somebody else"
        );
        let mut relabelled = live(&rendered, "7");
        relabelled.metadata.labels = None;
        assert!(
            owned
                .unchanged(&store_of(vec![relabelled]), &rendered)
                .is_none(),
            "a label the operator renders is missing"
        );
        owned.forget("ns", "t-perago");
        assert!(owned.unchanged(&store, &rendered).is_none(), "forgotten");
    }

    #[test]
    fn a_watch_behind_the_operators_own_apply_is_not_a_change() {
        let at = |uid: &str, generation| Version {
            uid: uid.into(),
            change: Change::Generation(generation),
        };
        let resource = |version: &str| Version {
            uid: "u".into(),
            change: Change::ResourceVersion(version.into()),
        };
        assert!(at("u", 3).unchanged_since(&at("u", 3)));
        assert!(
            at("u", 2).unchanged_since(&at("u", 3)),
            "the watch has not caught up with the apply yet"
        );
        assert!(
            !at("u", 4).unchanged_since(&at("u", 3)),
            "somebody changed the spec since"
        );
        assert!(
            !at("v", 2).unchanged_since(&at("u", 3)),
            "another object of the same name"
        );
        assert!(
            !resource("6").unchanged_since(&resource("7")),
            "resource versions are compared for equality only"
        );
        assert!(resource("7").unchanged_since(&resource("7")));
    }
}
