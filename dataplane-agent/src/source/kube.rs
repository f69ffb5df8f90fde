//! Kubernetes watchers → compact records, event by event (the Kubernetes mode's thin edge on
//! the input side). No watched object is stored: each is converted into a record as it
//! arrives and the API object dropped; the stores are the consumers' (the node's input index,
//! the controller's merge state and observed index).
//!
//! Every watch is a kube-runtime watcher with the default backoff: a watch that fails resumes,
//! and one that gets 410 Gone re-lists. A first list and every re-list are collected until
//! `InitDone` and handed on as one complete list, which prunes what was deleted meanwhile.
//!
//! - [`watch_node_inputs`]: the node role's ServiceImports and imported EndpointSlices, with
//!   our managed-by label → the node's [`Change`]s.
//! - [`MemberWatch`]: one member cluster's Services, ServiceExports and local EndpointSlices
//!   (label `kubernetes.io/service-name`) → [`MemberChange`]s for the controller's merge, with
//!   the member's health: a probe of its API server and the state of its watches.
//! - [`LocalWatch`]: what the controller wrote in the local cluster (imports and slices with
//!   our managed-by label) and the local ServiceExports' conditions → [`ObservedChange`]s.

use std::{
    fmt::Debug,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, Resource, ResourceExt as _,
    api::{ListParams, WatchParams},
    runtime::{WatchStreamExt as _, utils::Backoff, watcher},
};
use serde::de::DeserializeOwned;
use tokio::{
    sync::{Notify, mpsc},
    task::JoinHandle,
    time::Instant,
};
use tracing::{debug, info, warn};

use crate::{
    source::feed::ChangeSender,
    telemetry::{WarnLimit, metrics::Metrics},
};
use dataplane_core::{
    lb::inputs::{Change, import_input, slice_input},
    merge::MemberChange,
    model::{
        ClusterId, EndpointSlice, Interner, LABEL_APP_MANAGED_BY, LABEL_K8S_SERVICE_NAME,
        LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY, NamespacedName, Service, ServiceExport,
        ServiceImport,
        member::{ExportRecord, LocalSlice, ServiceRecord},
        resource_version,
    },
    reconcile::{ObservedExport, ObservedImport, ObservedKind, ObservedSlice},
};

/// Aborts a task when dropped: the watchers of a role live exactly as long as the role.
#[derive(Debug)]
pub struct AbortOnDrop(pub JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Since when something has been failing, or `None` while it works.
#[derive(Debug, Default)]
pub struct Reachability {
    /// When the current run of failures started; `None` while it works.
    since: Mutex<Option<Instant>>,
}

impl Reachability {
    /// `None` while it works; else since when it has not.
    pub fn unreachable_since(&self) -> Option<Instant> {
        *self.since.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a result; true when the state changed.
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

/// How one watched kind is doing: whether its first list is complete, and since when its
/// watch has been failing.
#[derive(Debug, Default)]
pub struct WatchHealth {
    listed: AtomicBool,
    failing: Reachability,
    /// Whether a failure was logged at WARN since the watch last answered.
    warned: AtomicBool,
    /// Failures at WARN at most every 10 minutes: a watch that cannot work (RBAC without the
    /// namespaces rule, or one the member probe keeps clearing) would otherwise warn every few
    /// seconds.
    warnings: WarnLimit,
}

impl WatchHealth {
    /// Whether a failure now is to be logged at WARN (else at DEBUG).
    fn warn_now(&self) -> bool {
        let now = self.warnings.now();
        if now {
            self.warned.store(true, Ordering::Release);
        }
        now
    }

    /// Whether the first complete list has arrived.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Since when the watch has been failing (list or watch errors, nothing received since).
    pub fn failing_since(&self) -> Option<Instant> {
        self.failing.unreachable_since()
    }
}

/// Lists one page of one object of each watched kind, then opens a watch from that list's
/// version and closes it once the API server has accepted it: proof that the member answers
/// and that we may still list and watch what we watch (an API server can answer `/version`
/// while our RBAC is revoked, and RBAC, or a proxy in between, can allow lists but not
/// watches, which would leave the member's state as last listed for good). `limit=1` without a
/// resourceVersion is a cheap consistent read; the watch starts after it, so it sends next to
/// nothing.
async fn probe_lists(client: &Client) -> [Result<(), kube::Error>; 3] {
    let one = ListParams::default().limit(1);
    let services = Api::<Service>::all(client.clone());
    let exports = Api::<ServiceExport>::all(client.clone());
    let slices = Api::<EndpointSlice>::all(client.clone());
    let slice_params = one.clone().labels(LABEL_K8S_SERVICE_NAME);
    tokio::join!(
        list_and_watch(&services, &one),
        list_and_watch(&exports, &one),
        list_and_watch(&slices, &slice_params),
    )
    .into()
}

/// One list of `params` and a watch from its version, dropped once accepted.
async fn list_and_watch<K>(api: &Api<K>, params: &ListParams) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let list = api.list_metadata(params).await?;
    let version = list.metadata.resource_version.unwrap_or_default();
    let mut watch = WatchParams::default().timeout(1);
    watch.label_selector = params.label_selector.clone();
    api.watch_metadata(&watch, &version).await.map(drop)
}

/// Probes a member every `interval` (see [`probe_lists`]). A successful list also ends the
/// failure of the matching watch: a watch that resumes yields nothing until something
/// changes, so its own events cannot say that it works again.
async fn probe(
    cluster: ClusterId,
    client: Client,
    interval: Duration,
    reach: Arc<Reachability>,
    watches: [Arc<WatchHealth>; 3],
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
        let timeout = interval.max(Duration::from_secs(1));
        let failure = match tokio::time::timeout(timeout, probe_lists(&client)).await {
            Err(_) => Some("timed out".to_owned()),
            Ok(results) => {
                let mut failure = None;
                for (result, watch) in results.iter().zip(&watches) {
                    match result {
                        Ok(()) => {
                            if watch.failing.record(true) {
                                changed.notify_one();
                            }
                        }
                        Err(e) => failure = failure.or_else(|| Some(e.to_string())),
                    }
                }
                failure
            }
        };
        let ok = failure.is_none();
        gauge.set(i64::from(ok));
        if reach.record(ok) {
            match failure {
                None => info!(cluster = %cluster, "member API server is reachable again"),
                Some(why) => {
                    warn!(cluster = %cluster, error = %why, "member API server is unreachable")
                }
            }
            changed.notify_one();
        }
        tokio::time::sleep(interval).await;
    }
}

/// How long a failed watch waits before it retries: from 250 ms, doubling to 8 s, and back to
/// 250 ms once the API server answered again. client-go's default (800 ms to 30 s, reset only
/// after 2 minutes) is kinder to a struggling API server, but here it would keep a member
/// that is back counted as unreachable, and its endpoints withdrawn, for up to a minute.
#[derive(Clone, Debug)]
struct WatchBackoff {
    next: Duration,
    /// Set when the API server answered (any event but `Init`): kube-runtime resets the
    /// backoff on every event, `Init` included, which each retry sends before its request,
    /// so a list that keeps failing would otherwise be retried every 250 ms for ever.
    answered: Arc<AtomicBool>,
}

impl WatchBackoff {
    const MIN: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(8);

    fn new(answered: Arc<AtomicBool>) -> Self {
        WatchBackoff {
            next: Self::MIN,
            answered,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(wait)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        if self.answered.swap(false, Ordering::AcqRel) {
            self.next = Self::MIN;
        }
    }
}

/// Turns an API object into a record (`None`: nothing usable).
type Convert<K, T> = Box<dyn Fn(&K) -> Option<T> + Send>;

/// How the events of one watched kind become the consumer's events.
struct Kind<K, T, E> {
    convert: Convert<K, T>,
    list: Box<dyn Fn(Vec<T>) -> E + Send>,
    apply: Box<dyn Fn(T) -> E + Send>,
    delete: Box<dyn Fn(&K) -> E + Send>,
}

/// The [`Kind`] of one member resource: records made by `convert` with the shared `names`,
/// carried by the three [`MemberChange`] variants of that resource.
fn member_kind<K, R>(
    cluster: &ClusterId,
    names: &Arc<Interner>,
    convert: fn(&K, &Interner) -> R,
    list: fn(ClusterId, Vec<Arc<R>>) -> MemberChange,
    apply: fn(ClusterId, Arc<R>) -> MemberChange,
    delete: fn(ClusterId, NamespacedName) -> MemberChange,
) -> Kind<K, Arc<R>, ControllerEvent>
where
    K: kube::Resource + 'static,
    R: Send + Sync + 'static,
{
    let names = names.clone();
    let (c1, c2, c3) = (cluster.clone(), cluster.clone(), cluster.clone());
    Kind {
        convert: Box::new(move |o| Some(Arc::new(convert(o, &names)))),
        list: Box::new(move |l| ControllerEvent::Member(list(c1.clone(), l))),
        apply: Box::new(move |r| ControllerEvent::Member(apply(c2.clone(), r))),
        delete: Box::new(move |o| {
            ControllerEvent::Member(delete(c3.clone(), NamespacedName::of(o.meta())))
        }),
    }
}

/// Where one watch reports.
struct Report<E> {
    cluster: String,
    resource: &'static str,
    metrics: Arc<Metrics>,
    tx: mpsc::UnboundedSender<E>,
    health: Arc<WatchHealth>,
    /// Woken when the health changes.
    changed: Option<Arc<Notify>>,
    /// Purged after each complete list.
    names: Arc<Interner>,
}

/// The [`Report`] of each of a cluster's three watches, by resource and index in `watches`.
fn reports<'a, E>(
    cluster: &'a ClusterId,
    metrics: &'a Arc<Metrics>,
    tx: &'a mpsc::UnboundedSender<E>,
    watches: &'a [Arc<WatchHealth>; 3],
    changed: &'a Arc<Notify>,
    names: &'a Arc<Interner>,
) -> impl Fn(&'static str, usize) -> Report<E> + 'a {
    move |resource, i| Report {
        cluster: cluster.to_string(),
        resource,
        metrics: metrics.clone(),
        tx: tx.clone(),
        health: watches[i].clone(),
        changed: Some(changed.clone()),
        names: names.clone(),
    }
}

/// Watches one kind and sends its events until the receiver is gone. Errors are counted as
/// `mcs_watch_restarts_total{cluster, resource}`, logged and recorded in the health; the
/// watcher backs off and resumes (or re-lists).
async fn forward<K, T, E>(
    api: Api<K>,
    config: watcher::Config,
    report: Report<E>,
    kind: Kind<K, T, E>,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let Report {
        cluster,
        resource,
        metrics,
        tx,
        health,
        changed,
        names,
    } = report;
    // Set as each event leaves the watcher, before the backoff sees it: the backoff resets on
    // that same event.
    let answered_flag = Arc::new(AtomicBool::new(false));
    let flag = answered_flag.clone();
    let stream = watcher(api, config)
        .inspect_ok(move |event| {
            if !matches!(event, watcher::Event::Init) {
                flag.store(true, Ordering::Release);
            }
        })
        .backoff(WatchBackoff::new(answered_flag));
    futures::pin_mut!(stream);
    // The objects of a list in progress (between Init and InitDone).
    let mut listing: Vec<T> = Vec::new();
    let wake = || {
        if let Some(c) = &changed {
            c.notify_one();
        }
    };
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            () = tx.closed() => return,
        };
        let Some(event) = event else { return };
        // `Init` starts each (re)list before any request is made: only what the API server
        // sent shows that the watch works.
        let answered = matches!(&event, Ok(e) if !matches!(e, watcher::Event::Init));
        if answered {
            if health.failing.record(true) {
                wake();
            }
            // Logged here, where the watch itself answers: the member probe also clears the
            // failure (it knows when a resumed watch that sends nothing works again).
            if health.warned.swap(false, Ordering::AcqRel) {
                info!(cluster = %cluster, resource, "watch works again");
            }
        }
        let out = match event {
            Ok(watcher::Event::Init) => {
                listing.clear();
                None
            }
            Ok(watcher::Event::InitApply(o)) => {
                listing.extend((kind.convert)(&o));
                None
            }
            Ok(watcher::Event::InitDone) => {
                debug!(cluster = %cluster, resource, objects = listing.len(), "list complete");
                let list = (kind.list)(std::mem::take(&mut listing));
                names.purge();
                // The list is on its way before the watch counts as listed: a consumer that
                // waits for every first list (the controller's first merge) then has it.
                if tx.send(list).is_err() {
                    return;
                }
                if !health.listed.swap(true, Ordering::AcqRel) {
                    wake();
                }
                None
            }
            Ok(watcher::Event::Apply(o)) => Some(match (kind.convert)(&o) {
                Some(record) => (kind.apply)(record),
                None => (kind.delete)(&o),
            }),
            Ok(watcher::Event::Delete(o)) => Some((kind.delete)(&o)),
            Err(e) => {
                metrics.watch_restart(&cluster, resource);
                if health.failing.record(false) {
                    wake();
                }
                // The counter counts every failure; the log warns at most every 10 minutes.
                if health.warn_now() {
                    warn!(cluster = %cluster, resource, error = %e,
                        "watch failed; backing off and resuming (further failures within 10 minutes are logged at DEBUG)");
                } else {
                    debug!(cluster = %cluster, resource, error = %e, "watch failed again");
                }
                None
            }
        };
        if let Some(out) = out
            && tx.send(out).is_err()
        {
            return;
        }
    }
}

/// The node role's source: sends every change of the local cluster's ServiceImports and
/// imported EndpointSlices to the node on `tx`, one watch event at a time, until the node is
/// gone. Only objects with our managed-by label are watched: an import or slice someone else
/// wrote is never routed.
///
/// There is no store here: the node's input index is the store, and each event names the
/// object that changed, so the node updates the one service it belongs to. The node writes
/// nothing before it has both first lists, so nothing is pruned after a restart before they
/// are complete. An API server that goes away leaves the last state in place.
pub async fn watch_node_inputs(
    cluster: ClusterId,
    client: Client,
    metrics: Arc<Metrics>,
    tx: ChangeSender,
) {
    let names = Arc::new(Interner::new());
    let report = |resource| Report {
        cluster: cluster.to_string(),
        resource,
        metrics: metrics.clone(),
        tx: tx.clone(),
        health: Arc::default(),
        changed: None,
        names: names.clone(),
    };
    let (n1, n2) = (names.clone(), names.clone());
    let imports = forward::<ServiceImport, _, _>(
        Api::all(client.clone()),
        watcher::Config::default().labels(&import_selector()),
        report("serviceimports/node"),
        Kind {
            convert: Box::new(move |o| Some(import_input(o, &n1))),
            list: Box::new(Change::Imports),
            apply: Box::new(Change::Import),
            delete: Box::new(|o| Change::ImportDeleted(NamespacedName::of(o.meta()))),
        },
    );
    let slices = forward::<EndpointSlice, _, _>(
        Api::all(client),
        watcher::Config::default().labels(&format!("{},{LABEL_SERVICE_NAME}", slice_selector())),
        report("endpointslices/node"),
        Kind {
            convert: Box::new(move |o| Some(slice_input(o, &n2))),
            list: Box::new(Change::Slices),
            apply: Box::new(Change::Slice),
            delete: Box::new(|o| Change::SliceDeleted(NamespacedName::of(o.meta()))),
        },
    );
    futures::join!(imports, slices);
}

/// What the controller learns from its watches.
#[derive(Debug)]
pub enum ControllerEvent {
    /// A member's objects changed.
    Member(MemberChange),
    /// What the local cluster holds of the controller's writes changed.
    Observed(Box<ObservedChange>),
    /// The local cluster's namespaces changed.
    Namespaces(NamespaceChange),
}

/// A change to the local cluster's namespaces: each by name, with whether objects can be
/// written into it (not while it terminates).
#[derive(Debug)]
pub enum NamespaceChange {
    /// The complete list.
    List(Vec<(String, bool)>),
    /// A namespace was added or changed.
    Put(String, bool),
    /// A namespace is gone.
    Deleted(String),
}

/// A change to the local cluster's objects the controller compares against.
#[derive(Debug)]
pub enum ObservedChange {
    /// The complete list of our imports.
    Imports(Vec<ObservedImport>),
    /// The complete list of our imported slices.
    Slices(Vec<ObservedSlice>),
    /// The complete list of the local ServiceExports.
    Exports(Vec<ObservedExport>),
    /// An import of ours was added or changed.
    Import(ObservedImport),
    /// A slice of ours was added or changed.
    Slice(ObservedSlice),
    /// A local ServiceExport was added or changed.
    Export(ObservedExport),
    /// An object is gone, as of that resourceVersion.
    Deleted(ObservedKind, NamespacedName, u64),
}

type EventSender = mpsc::UnboundedSender<ControllerEvent>;

/// One member cluster, watched.
pub struct MemberWatch {
    /// The member.
    pub cluster: ClusterId,
    /// Whether its API server lets us list what we watch.
    pub reachability: Arc<Reachability>,
    /// Its Services', ServiceExports' and local slices' watches.
    pub watches: [Arc<WatchHealth>; 3],
    _tasks: Vec<AbortOnDrop>,
}

impl MemberWatch {
    /// Starts watching `cluster` through `client` (sending its changes on `tx`) and probing
    /// it every `probe_interval`; `changed` is woken when its health changes.
    pub fn start(
        cluster: ClusterId,
        client: Client,
        probe_interval: Duration,
        metrics: Arc<Metrics>,
        names: Arc<Interner>,
        tx: EventSender,
        changed: Arc<Notify>,
    ) -> Self {
        let watches: [Arc<WatchHealth>; 3] = Default::default();
        let report = reports(&cluster, &metrics, &tx, &watches, &changed, &names);
        let services = forward(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
            report("services", 0),
            member_kind(
                &cluster,
                &names,
                ServiceRecord::from_k8s,
                MemberChange::Services,
                MemberChange::Service,
                MemberChange::ServiceDeleted,
            ),
        );
        let exports = forward(
            Api::<ServiceExport>::all(client.clone()),
            watcher::Config::default(),
            report("serviceexports", 1),
            member_kind(
                &cluster,
                &names,
                ExportRecord::from_k8s,
                MemberChange::Exports,
                MemberChange::Export,
                MemberChange::ExportDeleted,
            ),
        );
        let slices = forward(
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default().labels(LABEL_K8S_SERVICE_NAME),
            report("endpointslices", 2),
            member_kind(
                &cluster,
                &names,
                LocalSlice::from_k8s,
                MemberChange::Slices,
                MemberChange::Slice,
                MemberChange::SliceDeleted,
            ),
        );
        let reachability = Arc::new(Reachability::default());
        let tasks = vec![
            AbortOnDrop(tokio::spawn(services)),
            AbortOnDrop(tokio::spawn(exports)),
            AbortOnDrop(tokio::spawn(slices)),
            AbortOnDrop(tokio::spawn(probe(
                cluster.clone(),
                client,
                probe_interval,
                reachability.clone(),
                watches.clone(),
                metrics.clone(),
                changed.clone(),
            ))),
        ];
        MemberWatch {
            cluster: cluster.clone(),
            reachability,
            watches: watches.clone(),
            _tasks: tasks,
        }
    }

    /// Whether all three first lists are complete.
    pub fn synced(&self) -> bool {
        self.watches.iter().all(|w| w.listed())
    }

    /// Since when the member has been unreachable: its API server not answering, or any of
    /// its watches failing. `None` while everything works.
    pub fn unreachable_since(&self) -> Option<Instant> {
        std::iter::once(self.reachability.unreachable_since())
            .chain(self.watches.iter().map(|w| w.failing_since()))
            .flatten()
            .min()
    }
}

/// The label selector of the ServiceImports the controller manages.
pub fn import_selector() -> String {
    format!("{LABEL_APP_MANAGED_BY}={MANAGED_BY}")
}

/// The label selector of the EndpointSlices the controller manages.
pub fn slice_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// The event of a local object's deletion.
fn gone<K: Resource>(kind: ObservedKind, o: &K) -> ControllerEvent {
    ControllerEvent::Observed(Box::new(ObservedChange::Deleted(
        kind,
        NamespacedName::of(o.meta()),
        resource_version(o.meta()),
    )))
}

/// What the local cluster holds of the controller's writes, its ServiceExports and its
/// namespaces, watched.
pub struct LocalWatch {
    /// The imports', slices' and exports' watches.
    pub watches: [Arc<WatchHealth>; 3],
    /// The namespaces' watch.
    pub namespaces: Arc<WatchHealth>,
    /// Whether the namespaces were once listed or failed: the gate opens once for them.
    namespaces_settled: AtomicBool,
    _tasks: Vec<AbortOnDrop>,
}

impl LocalWatch {
    /// Starts the watches of the local cluster through `client`, sending on `tx`.
    pub fn start(
        cluster: &ClusterId,
        client: Client,
        metrics: Arc<Metrics>,
        names: Arc<Interner>,
        tx: EventSender,
        changed: Arc<Notify>,
    ) -> Self {
        let watches: [Arc<WatchHealth>; 3] = Default::default();
        let report = reports(cluster, &metrics, &tx, &watches, &changed, &names);
        let observed = |change| ControllerEvent::Observed(Box::new(change));
        let n = names.clone();
        let imports = forward::<ServiceImport, _, _>(
            Api::all(client.clone()),
            watcher::Config::default().labels(&import_selector()),
            report("serviceimports/imported", 0),
            Kind {
                convert: Box::new(move |o| ObservedImport::from_k8s(o, &n)),
                list: Box::new(move |l| observed(ObservedChange::Imports(l))),
                apply: Box::new(move |r| observed(ObservedChange::Import(r))),
                delete: Box::new(|o| gone(ObservedKind::Import, o)),
            },
        );
        let n = names.clone();
        let slices = forward::<EndpointSlice, _, _>(
            Api::all(client.clone()),
            watcher::Config::default().labels(&slice_selector()),
            report("endpointslices/imported", 1),
            Kind {
                convert: Box::new(move |o| Some(ObservedSlice::from_k8s(o, &n))),
                list: Box::new(move |l| observed(ObservedChange::Slices(l))),
                apply: Box::new(move |r| observed(ObservedChange::Slice(r))),
                delete: Box::new(|o| gone(ObservedKind::Slice, o)),
            },
        );
        let n = names.clone();
        let exports = forward::<ServiceExport, _, _>(
            Api::all(client.clone()),
            watcher::Config::default(),
            report("serviceexports/status", 2),
            Kind {
                convert: Box::new(move |o| Some(ObservedExport::from_k8s(o, &n))),
                list: Box::new(move |l| observed(ObservedChange::Exports(l))),
                apply: Box::new(move |r| observed(ObservedChange::Export(r))),
                delete: Box::new(|o| gone(ObservedKind::Export, o)),
            },
        );
        let namespaces_health = Arc::new(WatchHealth::default());
        let namespaces = forward::<Namespace, _, _>(
            Api::all(client),
            watcher::Config::default(),
            Report {
                cluster: cluster.to_string(),
                resource: "namespaces",
                metrics: metrics.clone(),
                tx: tx.clone(),
                health: namespaces_health.clone(),
                changed: Some(changed.clone()),
                names: names.clone(),
            },
            Kind {
                convert: Box::new(|o: &Namespace| {
                    Some((o.name_any(), o.metadata.deletion_timestamp.is_none()))
                }),
                list: Box::new(|l| ControllerEvent::Namespaces(NamespaceChange::List(l))),
                apply: Box::new(|(name, live)| {
                    ControllerEvent::Namespaces(NamespaceChange::Put(name, live))
                }),
                delete: Box::new(|o| {
                    ControllerEvent::Namespaces(NamespaceChange::Deleted(o.name_any()))
                }),
            },
        );
        LocalWatch {
            watches: watches.clone(),
            namespaces: namespaces_health,
            namespaces_settled: AtomicBool::new(false),
            _tasks: vec![
                AbortOnDrop(tokio::spawn(imports)),
                AbortOnDrop(tokio::spawn(slices)),
                AbortOnDrop(tokio::spawn(exports)),
                AbortOnDrop(tokio::spawn(namespaces)),
            ],
        }
    }

    /// Whether all three first lists are complete, and the namespaces were listed or found
    /// not readable (then every namespace is written into, as before the controller read them:
    /// `deploy/rbac/controller.yaml` older than the namespaces rule). Once true, it stays so:
    /// a namespaces watch that recovers does not close the gate until its list completes.
    pub fn synced(&self) -> bool {
        if !self.namespaces_settled.load(Ordering::Acquire)
            && (self.namespaces.listed() || self.namespaces.failing_since().is_some())
        {
            self.namespaces_settled.store(true, Ordering::Release);
        }
        self.watches.iter().all(|w| w.listed()) && self.namespaces_settled.load(Ordering::Acquire)
    }
}
