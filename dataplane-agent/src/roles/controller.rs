//! The ClusterSet controller role (ARCHITECTURE.md §3): while this agent holds the lease, it
//! watches every member cluster, merges, and writes the result into the local cluster.
//!
//! The decisions are pure and live in [`dataplane_core::reconcile`]: [`desired`] (the merge
//! for the local cluster, withdrawn members' endpoints left out) and [`reconcile`] (merge
//! output and observed objects to the [`Action`]s that make them agree). This module is the
//! thin loop around them: watchers ([`crate::source::kube`]) wake it, it calls the core and
//! applies the actions ([`crate::sink::kube`]). [`run_elected`] runs it only while the lease
//! is held.
//!
//! Writes the watches have not delivered yet are remembered (with their resourceVersion) until
//! the watch catches up, so a pass that runs in between does not write them again.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Client, Resource};
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tracing::{debug, info, warn};

use crate::{
    sink::kube::{KubeSink, Written},
    source::kube::{AbortOnDrop, LocalWrites, MemberWatch, Reflected},
    telemetry::metrics::{ClusterLabels, Metrics},
};
use dataplane_core::{
    merge::{ClusterSetConfig, ClusterSnapshot},
    model::{
        ClusterId, EndpointSlice, Interner, NamespacedName, ServiceExport, ServiceImport,
        records::ImportRecord, resource_version,
    },
    reconcile::{Action, Observed, conflict_counts, desired, reconcile},
};

/// Writes that the watches may not have delivered yet: (resourceVersion, object or `None` for a
/// deletion), until the watch's watermark reaches that resourceVersion.
struct Overlay<K> {
    entries: HashMap<NamespacedName, (u64, Option<Arc<K>>)>,
}

impl<K> Default for Overlay<K> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Overlay<K> {
    fn written(&mut self, obj: K) {
        let id = NamespacedName::of(obj.meta());
        self.entries
            .insert(id, (resource_version(obj.meta()), Some(Arc::new(obj))));
    }

    fn deleted(&mut self, id: NamespacedName, rv: u64) {
        self.entries.insert(id, (rv, None));
    }

    /// The store's objects with the writes it has not seen yet laid over them.
    fn view(&mut self, store: &Reflected<K>) -> Vec<Arc<K>> {
        let watermark = store.watermark();
        self.entries.retain(|_, (rv, _)| *rv > watermark);
        let mut all: BTreeMap<NamespacedName, Arc<K>> = store
            .objects()
            .into_iter()
            .map(|o| (NamespacedName::of(o.meta()), o))
            .collect();
        for (id, (_, obj)) in &self.entries {
            match obj {
                Some(o) => {
                    all.insert(id.clone(), o.clone());
                }
                None => {
                    all.remove(id);
                }
            }
        }
        all.into_values().collect()
    }
}

/// What the controller needs besides the member clients.
#[derive(Clone, Debug)]
pub struct ControllerSettings {
    pub local: ClusterId,
    pub clusterset: ClusterSetConfig,
    /// A member unreachable longer than this has its endpoints withdrawn.
    pub unreachable_grace: Duration,
    pub probe_interval: Duration,
    /// Names this agent in Events (the pod name).
    pub identity: String,
}

/// How long to let a burst of watch events settle into one pass.
const SETTLE: Duration = Duration::from_millis(10);
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Runs the controller until the task is dropped or aborted: watches `members` (which include
/// the local cluster), merges and writes into the local cluster.
pub async fn run(
    settings: Arc<ControllerSettings>,
    members: Vec<(ClusterId, Client)>,
    metrics: Arc<Metrics>,
) {
    let Some(local_client) = members
        .iter()
        .find(|(id, _)| id == &settings.local)
        .map(|(_, c)| c.clone())
    else {
        warn!(local = %settings.local, "the local cluster is not a member; the controller does nothing");
        return;
    };
    let changed = Arc::new(Notify::new());
    let watches: Vec<MemberWatch> = members
        .into_iter()
        .map(|(id, client)| {
            MemberWatch::start(
                id,
                client,
                settings.probe_interval,
                metrics.clone(),
                changed.clone(),
            )
        })
        .collect();
    let writes = LocalWrites::start(
        &settings.local,
        local_client.clone(),
        metrics.clone(),
        changed.clone(),
    );
    let sink = KubeSink::new(local_client, &settings.identity);
    let mut pass = Pass {
        settings: settings.clone(),
        metrics: metrics.clone(),
        imports: Overlay::default(),
        slices: Overlay::default(),
        exports: Overlay::default(),
        diagnostics: BTreeSet::new(),
        withdrawn: BTreeSet::new(),
    };
    let started = Instant::now();
    let mut retry: Option<(Instant, Duration)> = None;
    let mut waiting_logged = false;
    info!(local = %settings.local, members = watches.len(), "controller started");
    loop {
        let deadline = next_deadline(&watches, &settings, started, retry.map(|r| r.0));
        tokio::select! {
            () = changed.notified() => {}
            () = sleep_until(deadline) => {}
        }
        tokio::time::sleep(SETTLE).await;
        let Some(withdrawn) = gate(&watches, &writes, &settings, started) else {
            if !waiting_logged {
                info!("waiting for the initial lists of every member before the first merge");
                waiting_logged = true;
            }
            continue;
        };
        let errors = pass.run(&watches, &writes, &sink, withdrawn).await;
        retry = match (errors, retry) {
            (0, _) => None,
            (_, None) => Some((
                Instant::now() + Duration::from_secs(1),
                Duration::from_secs(1),
            )),
            (_, Some((_, backoff))) => {
                let backoff = (backoff * 2).min(MAX_RETRY);
                Some((Instant::now() + backoff, backoff))
            }
        };
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The members whose endpoints are withdrawn, or `None` while the merge must wait: the local
/// cluster's lists are not complete, or a remote member's are not and it has been neither
/// unreachable nor slow for longer than the grace period.
fn gate(
    watches: &[MemberWatch],
    writes: &LocalWrites,
    settings: &ControllerSettings,
    started: Instant,
) -> Option<BTreeSet<ClusterId>> {
    let grace = settings.unreachable_grace;
    let mut withdrawn = BTreeSet::new();
    for w in watches {
        if w.cluster == settings.local {
            if !(w.synced() && writes.synced()) {
                return None;
            }
            continue;
        }
        let past_grace = w
            .reachability
            .unreachable_since()
            .is_some_and(|since| since.elapsed() >= grace);
        if past_grace || (!w.synced() && started.elapsed() >= grace) {
            withdrawn.insert(w.cluster.clone());
        } else if !w.synced() {
            return None;
        }
    }
    Some(withdrawn)
}

/// When the gate's answer can change without a watch event: a member reaching the grace period.
fn next_deadline(
    watches: &[MemberWatch],
    settings: &ControllerSettings,
    started: Instant,
    retry: Option<Instant>,
) -> Option<Instant> {
    let now = Instant::now();
    let grace = settings.unreachable_grace;
    watches
        .iter()
        .filter(|w| w.cluster != settings.local)
        .filter_map(|w| match w.reachability.unreachable_since() {
            Some(since) => Some(since + grace),
            None if !w.synced() => Some(started + grace),
            None => None,
        })
        .filter(|d| *d > now)
        .chain(retry)
        .min()
}

/// One controller pass and the state kept between passes.
struct Pass {
    settings: Arc<ControllerSettings>,
    metrics: Arc<Metrics>,
    imports: Overlay<ServiceImport>,
    slices: Overlay<EndpointSlice>,
    exports: Overlay<ServiceExport>,
    /// Diagnostics already logged.
    diagnostics: BTreeSet<String>,
    withdrawn: BTreeSet<ClusterId>,
}

impl Pass {
    /// Merges, compares and writes; returns the number of failed writes.
    async fn run(
        &mut self,
        watches: &[MemberWatch],
        writes: &LocalWrites,
        sink: &KubeSink,
        withdrawn: BTreeSet<ClusterId>,
    ) -> usize {
        let started = std::time::Instant::now();
        let settings = self.settings.clone();
        if withdrawn != self.withdrawn {
            for w in watches {
                let out = withdrawn.contains(&w.cluster);
                if out != self.withdrawn.contains(&w.cluster) {
                    if out {
                        warn!(cluster = %w.cluster, grace_s = settings.unreachable_grace.as_secs_f64(),
                            "member unreachable past the grace period; withdrawing its endpoints");
                    } else {
                        info!(cluster = %w.cluster, "member is back; restoring its endpoints");
                    }
                }
                self.metrics
                    .member_withdrawn
                    .get_or_create(&ClusterLabels {
                        cluster: w.cluster.to_string(),
                    })
                    .set(i64::from(out));
            }
            self.withdrawn = withdrawn.clone();
        }
        let names = Interner::new();
        let snapshots: Vec<ClusterSnapshot> = watches.iter().map(|w| w.snapshot(&names)).collect();
        let Some(local) = watches.iter().find(|w| w.cluster == settings.local) else {
            return 0;
        };
        let observed = Observed {
            imports: self.imports.view(&writes.imports),
            slices: self.slices.view(&writes.slices),
            exports: self.exports.view(&local.exports),
        };
        let existing: Vec<ImportRecord> = observed
            .imports
            .iter()
            .filter_map(|o| ImportRecord::from_k8s(o, &names, false).record)
            .collect();
        let plan = desired(
            &snapshots,
            &settings.clusterset,
            &settings.local,
            &existing,
            &withdrawn,
            settings.unreachable_grace,
        );
        let diagnostics: BTreeSet<String> =
            plan.diagnostics.iter().map(ToString::to_string).collect();
        for d in diagnostics.difference(&self.diagnostics) {
            warn!("{d}");
        }
        self.diagnostics = diagnostics;
        self.metrics
            .set_conflicts(&conflict_counts(&plan, &settings.local));
        let now = Time(
            k8s_openapi::jiff::Timestamp::from_second(
                k8s_openapi::jiff::Timestamp::now().as_second(),
            )
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        let actions = reconcile(&plan, &settings.local, &observed, &now);
        let mut errors = 0;
        let mut failed_exports = HashSet::new();
        for action in &actions {
            if let Action::Event { export, .. } = action
                && failed_exports.contains(export)
            {
                continue;
            }
            let (kind, op) = action.label();
            match sink.apply(action).await {
                Ok(written) => {
                    self.metrics.write(kind, op, true);
                    if let Action::Event { reason, .. } = action {
                        self.metrics
                            .events
                            .get_or_create(&crate::telemetry::metrics::ReasonLabels {
                                reason: reason.clone(),
                            })
                            .inc();
                    }
                    debug!(kind, op, object = %action.object(), "written");
                    match written {
                        Written::Import(o) => self.imports.written(o),
                        Written::Slice(o) => self.slices.written(o),
                        Written::Export(o) => self.exports.written(o),
                        Written::DeletedImport {
                            service,
                            resource_version,
                        } => self.imports.deleted(service, resource_version),
                        Written::DeletedSlice {
                            slice,
                            resource_version,
                        } => self.slices.deleted(slice, resource_version),
                        Written::Event => {}
                    }
                }
                Err(e) => {
                    errors += 1;
                    self.metrics.write(kind, op, false);
                    if let Action::ApplyExportStatus { service, .. } = action {
                        failed_exports.insert(service.clone());
                    }
                    warn!(error = %e, "write failed; will retry");
                }
            }
        }
        self.metrics
            .reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        if !actions.is_empty() {
            info!(
                imports = plan.service_imports.len(),
                slices = plan.endpoint_slices.len(),
                writes = actions.len() - errors,
                errors,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "reconciled"
            );
        }
        errors
    }
}

/// Runs the controller while `leader` says this agent holds the lease, and stops it (dropping
/// its watches) as soon as it does not. Returns when `leader` closes.
pub async fn run_elected(
    settings: Arc<ControllerSettings>,
    members: Vec<(ClusterId, Client)>,
    metrics: Arc<Metrics>,
    mut leader: watch::Receiver<bool>,
) {
    let mut running: Option<AbortOnDrop> = None;
    loop {
        let is_leader = *leader.borrow_and_update();
        metrics.leader.set(i64::from(is_leader));
        match (is_leader, running.is_some()) {
            (true, false) => {
                info!(identity = %settings.identity, "acquired the controller lease");
                running = Some(AbortOnDrop(tokio::spawn(run(
                    settings.clone(),
                    members.clone(),
                    metrics.clone(),
                ))));
            }
            (false, true) => {
                info!(identity = %settings.identity, "lost the controller lease; stopping the controller");
                running = None;
            }
            _ => {}
        }
        if leader.changed().await.is_err() {
            metrics.leader.set(0);
            return;
        }
    }
}
