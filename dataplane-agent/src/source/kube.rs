//! Kubernetes watchers → plain snapshots (the Kubernetes mode's thin edge on the input side).
//!
//! Every watched kind is a kube-runtime reflector with the default backoff: a watch that fails
//! resumes, and one that gets 410 Gone re-lists; the store swaps to the new list only when it
//! is complete (`InitDone`), so a reader never sees half a list. Each event wakes a shared
//! [`Notify`]; consumers re-read the stores when woken.
//!
//! - [`MemberWatch`]: one member cluster's Services, ServiceExports and local EndpointSlices
//!   (label `kubernetes.io/service-name`) → a [`ClusterSnapshot`], plus a probe of its API
//!   server ([`Reachability`]).
//! - [`LocalWrites`]: the objects the controller writes in the local cluster (ServiceImports
//!   and EndpointSlices with our managed-by label), to compare desired with observed.
//! - [`watch_node_inputs`]: the node role's ServiceImports and imported EndpointSlices (label
//!   `multicluster.kubernetes.io/service-name`) → [`Change`]s, event by event (no store).

use std::{
    fmt::Debug,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::StreamExt as _;
use kube::{
    Api, Client, Resource, ResourceExt as _,
    runtime::{WatchStreamExt as _, reflector, watcher},
};
use serde::de::DeserializeOwned;
use tokio::{sync::Notify, task::JoinHandle, time::Instant};
use tracing::{debug, info, warn};

use crate::{source::feed::ChangeSender, telemetry::metrics::Metrics};
use dataplane_core::{
    lb::inputs::{Change, import_input, slice_input},
    merge::ClusterSnapshot,
    model::{
        ClusterId, EndpointSlice, Interner, LABEL_APP_MANAGED_BY, LABEL_K8S_SERVICE_NAME,
        LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY, NamespacedName, Service, ServiceExport,
        ServiceImport, resource_version,
    },
};

/// Aborts a task when dropped: the watchers of a role live exactly as long as the role.
#[derive(Debug)]
pub struct AbortOnDrop(pub JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A reflector's store, with the highest resourceVersion it has seen and whether its first list
/// is complete.
pub struct Reflected<K: Resource<DynamicType = ()> + 'static> {
    store: reflector::Store<K>,
    watermark: Arc<AtomicU64>,
    ready: Arc<AtomicBool>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Reflected<K> {
    /// The objects, sorted by namespace and name.
    pub fn objects(&self) -> Vec<Arc<K>> {
        let mut all = self.store.state();
        all.sort_by_key(|o| (o.namespace(), o.name_any()));
        all
    }

    /// The highest resourceVersion of any event applied so far: every change up to it is in
    /// the store.
    pub fn watermark(&self) -> u64 {
        self.watermark.load(Ordering::Acquire)
    }

    /// Whether the first list is complete.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// Starts a reflector over `api`. Every event wakes `changed`; errors are counted as
/// `mcs_watch_restarts_total{cluster, resource}` and logged, and the watcher backs off and
/// resumes (or re-lists after 410 Gone).
pub fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    cluster: &ClusterId,
    resource: &'static str,
    metrics: Arc<Metrics>,
    changed: Arc<Notify>,
) -> (Reflected<K>, AbortOnDrop)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let watermark = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(AtomicBool::new(false));
    let (wm, rd) = (watermark.clone(), ready.clone());
    let cluster = cluster.to_string();
    let stream = watcher(api, config).default_backoff().reflect(writer);
    let task = tokio::spawn(stream.for_each(move |event| {
        let bump = |o: &K| {
            wm.fetch_max(resource_version(o.meta()), Ordering::AcqRel);
        };
        match &event {
            Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o)) => {
                bump(o)
            }
            Ok(watcher::Event::InitDone) => {
                if !rd.swap(true, Ordering::AcqRel) {
                    debug!(cluster = %cluster, resource, "initial list complete");
                }
            }
            Ok(watcher::Event::Init) => {}
            Err(e) => {
                metrics.watch_restart(&cluster, resource);
                warn!(cluster = %cluster, resource, error = %e, "watch failed; backing off and resuming");
            }
        }
        if !matches!(
            event,
            Ok(watcher::Event::Init | watcher::Event::InitApply(_))
        ) {
            changed.notify_one();
        }
        async {}
    }));
    (
        Reflected {
            store,
            watermark,
            ready,
        },
        AbortOnDrop(task),
    )
}

/// Whether a member's API server answers, from a periodic probe (`GET /version`).
#[derive(Debug, Default)]
pub struct Reachability {
    /// When the current run of failed probes started; `None` while it answers.
    since: Mutex<Option<Instant>>,
}

impl Reachability {
    /// `None` while reachable; else since when it has not been.
    pub fn unreachable_since(&self) -> Option<Instant> {
        *self.since.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a probe result; true when the state changed.
    pub fn record(&self, ok: bool) -> bool {
        let mut since = self.since.lock().unwrap_or_else(PoisonError::into_inner);
        match (ok, since.is_some()) {
            (true, true) => {
                *since = None;
                true
            }
            (false, false) => {
                *since = Some(Instant::now());
                true
            }
            _ => false,
        }
    }
}

async fn probe(
    cluster: ClusterId,
    client: Client,
    interval: Duration,
    reach: Arc<Reachability>,
    metrics: Arc<Metrics>,
    changed: Arc<Notify>,
) {
    let gauge = metrics
        .member_reachable
        .get_or_create(&crate::telemetry::metrics::ClusterLabels {
            cluster: cluster.to_string(),
        })
        .clone();
    loop {
        let result = tokio::time::timeout(
            interval.max(Duration::from_secs(1)),
            client.apiserver_version(),
        )
        .await;
        let ok = matches!(result, Ok(Ok(_)));
        gauge.set(i64::from(ok));
        if reach.record(ok) {
            if ok {
                info!(cluster = %cluster, "member API server is reachable again");
            } else {
                let why = match result {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                warn!(cluster = %cluster, error = %why, "member API server is unreachable");
            }
            changed.notify_one();
        }
        tokio::time::sleep(interval).await;
    }
}

/// One member cluster, watched.
pub struct MemberWatch {
    pub cluster: ClusterId,
    pub services: Reflected<Service>,
    pub exports: Reflected<ServiceExport>,
    pub slices: Reflected<EndpointSlice>,
    pub reachability: Arc<Reachability>,
    _tasks: Vec<AbortOnDrop>,
}

impl MemberWatch {
    /// Starts watching `cluster` through `client`, and probing it every `probe_interval`.
    pub fn start(
        cluster: ClusterId,
        client: Client,
        probe_interval: Duration,
        metrics: Arc<Metrics>,
        changed: Arc<Notify>,
    ) -> Self {
        let (services, t1) = reflect(
            Api::all(client.clone()),
            watcher::Config::default(),
            &cluster,
            "services",
            metrics.clone(),
            changed.clone(),
        );
        let (exports, t2) = reflect(
            Api::all(client.clone()),
            watcher::Config::default(),
            &cluster,
            "serviceexports",
            metrics.clone(),
            changed.clone(),
        );
        let (slices, t3) = reflect(
            Api::all(client.clone()),
            watcher::Config::default().labels(LABEL_K8S_SERVICE_NAME),
            &cluster,
            "endpointslices",
            metrics.clone(),
            changed.clone(),
        );
        let reachability = Arc::new(Reachability::default());
        let t4 = AbortOnDrop(tokio::spawn(probe(
            cluster.clone(),
            client,
            probe_interval,
            reachability.clone(),
            metrics,
            changed,
        )));
        MemberWatch {
            cluster,
            services,
            exports,
            slices,
            reachability,
            _tasks: vec![t1, t2, t3, t4],
        }
    }

    /// Whether all three initial lists are complete.
    pub fn synced(&self) -> bool {
        self.services.is_ready() && self.exports.is_ready() && self.slices.is_ready()
    }

    /// The member's objects as the merge takes them.
    pub fn snapshot(&self, names: &Interner) -> ClusterSnapshot {
        let services: Vec<Service> = owned(self.services.objects());
        let exports: Vec<ServiceExport> = owned(self.exports.objects());
        let slices: Vec<EndpointSlice> = owned(self.slices.objects());
        ClusterSnapshot::from_k8s(self.cluster.clone(), &services, &exports, &slices, names)
    }
}

fn owned<K: Clone>(objects: Vec<Arc<K>>) -> Vec<K> {
    objects.into_iter().map(|o| (*o).clone()).collect()
}

/// The label selector of the ServiceImports the controller manages.
pub fn import_selector() -> String {
    format!("{LABEL_APP_MANAGED_BY}={MANAGED_BY}")
}

/// The label selector of the EndpointSlices the controller manages.
pub fn slice_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// What the controller has written into the local cluster, as watched.
pub struct LocalWrites {
    pub imports: Reflected<ServiceImport>,
    pub slices: Reflected<EndpointSlice>,
    _tasks: Vec<AbortOnDrop>,
}

impl LocalWrites {
    pub fn start(
        cluster: &ClusterId,
        client: Client,
        metrics: Arc<Metrics>,
        changed: Arc<Notify>,
    ) -> Self {
        let (imports, t1) = reflect(
            Api::all(client.clone()),
            watcher::Config::default().labels(&import_selector()),
            cluster,
            "serviceimports",
            metrics.clone(),
            changed.clone(),
        );
        let (slices, t2) = reflect(
            Api::all(client),
            watcher::Config::default().labels(&slice_selector()),
            cluster,
            "endpointslices/imported",
            metrics,
            changed,
        );
        LocalWrites {
            imports,
            slices,
            _tasks: vec![t1, t2],
        }
    }

    pub fn synced(&self) -> bool {
        self.imports.is_ready() && self.slices.is_ready()
    }
}

/// The node role's source: sends every change of the local cluster's ServiceImports and
/// imported EndpointSlices (label `multicluster.kubernetes.io/service-name`) to the node on
/// `tx`, one watch event at a time, until the node is gone.
///
/// There is no reflector store here: the node's [`InputIndex`](dataplane_core::lb::inputs::InputIndex)
/// is the store, and each event names the object that changed, so the node updates the one
/// service it belongs to. Objects are converted into compact records as they arrive
/// ([`import_input`], [`slice_input`]) and the API objects dropped. A watch's first list and
/// every re-list (after 410 Gone) are collected until `InitDone` and sent as one complete list,
/// which prunes what was deleted meanwhile; the node writes nothing before it has both first
/// lists, so nothing is pruned after a restart before they are complete. An API server that
/// goes away leaves the last state in place (the watcher backs off and resumes).
pub async fn watch_node_inputs(
    cluster: ClusterId,
    client: Client,
    metrics: Arc<Metrics>,
    tx: ChangeSender,
) {
    let names = Arc::new(Interner::new());
    let imports = forward::<ServiceImport, _>(
        Api::all(client.clone()),
        watcher::Config::default(),
        &cluster,
        "serviceimports/node",
        metrics.clone(),
        tx.clone(),
        names.clone(),
        Kind {
            convert: import_input,
            list: Change::Imports,
            apply: Change::Import,
            delete: Change::ImportDeleted,
        },
    );
    let slices = forward::<EndpointSlice, _>(
        Api::all(client),
        watcher::Config::default().labels(LABEL_SERVICE_NAME),
        &cluster,
        "endpointslices/node",
        metrics,
        tx,
        names,
        Kind {
            convert: slice_input,
            list: Change::Slices,
            apply: Change::Slice,
            delete: Change::SliceDeleted,
        },
    );
    futures::join!(imports, slices);
}

/// How the events of one kind become [`Change`]s.
struct Kind<K, T> {
    convert: fn(&K, &Interner) -> T,
    list: fn(Vec<T>) -> Change,
    apply: fn(T) -> Change,
    delete: fn(NamespacedName) -> Change,
}

/// Watches one kind and sends its events as changes until `tx` is closed. Errors are counted
/// as `mcs_watch_restarts_total{cluster, resource}` and logged; the watcher backs off and
/// resumes (or re-lists).
#[allow(clippy::too_many_arguments)]
async fn forward<K, T>(
    api: Api<K>,
    config: watcher::Config,
    cluster: &ClusterId,
    resource: &'static str,
    metrics: Arc<Metrics>,
    tx: ChangeSender,
    names: Arc<Interner>,
    kind: Kind<K, T>,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let cluster = cluster.to_string();
    let stream = watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    // The objects of a list in progress (between Init and InitDone).
    let mut listing: Vec<T> = Vec::new();
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            () = tx.closed() => return,
        };
        let Some(event) = event else { return };
        let change = match event {
            Ok(watcher::Event::Init) => {
                listing.clear();
                None
            }
            Ok(watcher::Event::InitApply(o)) => {
                listing.push((kind.convert)(&o, &names));
                None
            }
            Ok(watcher::Event::InitDone) => {
                debug!(cluster = %cluster, resource, objects = listing.len(), "list complete");
                let change = (kind.list)(std::mem::take(&mut listing));
                names.purge();
                Some(change)
            }
            Ok(watcher::Event::Apply(o)) => Some((kind.apply)((kind.convert)(&o, &names))),
            Ok(watcher::Event::Delete(o)) => Some((kind.delete)(NamespacedName::of(o.meta()))),
            Err(e) => {
                metrics.watch_restart(&cluster, resource);
                warn!(cluster = %cluster, resource, error = %e, "watch failed; backing off and resuming");
                None
            }
        };
        if let Some(change) = change
            && tx.send(change).is_err()
        {
            return;
        }
    }
}
