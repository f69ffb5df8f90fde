//! The ClusterSet controller role (ARCHITECTURE.md §3): while this agent holds the lease, it
//! watches every member cluster, merges, and writes the result into the local cluster.
//!
//! The decisions are pure and live in the core: the merge kept service by service
//! ([`MergeState`]) and the per-service comparison of what it wants with what the local cluster
//! holds ([`reconcile_service`]). This module is the loop around them: the watches
//! ([`crate::source::kube`]) send member changes and observed changes; a member change
//! re-merges the service it touches, and every service whose merge or observed objects changed
//! is compared and written ([`crate::sink::kube`]). So one EndpointSlice change in a member
//! costs one service's merge and writes, not the ClusterSet's. [`run_elected`] runs it only
//! while the lease is held.
//!
//! The first pass waits for the local cluster's lists and every member's (a member that does
//! not answer within the grace period is merged without endpoints, and the imports that name
//! it are held as they are, IPs included, until it is heard from: [`MergeState::hold`]), then
//! merges everything, keeping the ClusterSet IPs the imports already hold, and compares every
//! service. A member
//! whose API server or watches have failed for longer than the grace period has its endpoints
//! withdrawn (its Services and exports still count), and the imports' `Ready` message says
//! so. The answers to the controller's own writes are filed as observed at once, so a pass that
//! runs before the watch delivers them does not write them again.
//!
//! Endpoints of members' local slices that the address policy refuses (loopback, link-local,
//! ...: [`dataplane_core::policy`]) are left out of the imported slices by the merge. Each is
//! logged once with its cluster and slice, counted in
//! `mcs_refused_addresses{kind="member_endpoint"}`, and the local ServiceExport of a service
//! with refused local endpoints carries `EndpointsRefused=True` until they are gone.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use tokio::{
    sync::{Notify, mpsc, watch},
    time::Instant,
};
use tracing::{debug, info, warn};

use super::{
    namespaces::LocalNamespaces,
    retry::{Retries, sleep_until},
};
use crate::{
    sink::kube::{KubeSink, Written},
    source::kube::{AbortOnDrop, ControllerEvent, LocalWatch, MemberWatch, ObservedChange},
    telemetry::metrics::{ClusterLabels, Metrics},
};
use dataplane_core::{
    merge::{ClusterSetConfig, MemberChange, MergeState},
    model::{ClusterId, Interner, NamespacedName, records::ImportRecord},
    policy::{AddressPolicy, AddressUse, RefusedEndpoint},
    reconcile::{
        Action, DesiredService, ObservedExport, ObservedImport, ObservedIndex, ObservedKind,
        ObservedSlice, reconcile_service, reconcile_unlabelled,
    },
};

/// What the controller needs besides the member clients.
#[derive(Clone, Debug)]
pub struct ControllerSettings {
    /// The cluster this controller writes into.
    pub local: ClusterId,
    /// The ClusterSet's CIDRs, family policy and clusters' families.
    pub clusterset: ClusterSetConfig,
    /// A member unreachable longer than this has its endpoints withdrawn.
    pub unreachable_grace: Duration,
    /// How often members' API servers are probed.
    pub probe_interval: Duration,
    /// Names this agent in Events (the pod name).
    pub identity: String,
    /// Which endpoints of the members are imported.
    pub policy: AddressPolicy,
}

/// Services whose writes are built at once ([`Controller::reconcile`]).
const SERVICES_PER_WRITE_CHUNK: usize = 256;

/// What one reconcile pass did.
struct Pass {
    /// Writes attempted, and how many of them failed.
    count: usize,
    errors: usize,
    /// Whether events were filed during the pass: the next one starts without waiting for more.
    filed: bool,
}

/// The controller's state between passes.
struct Controller {
    settings: Arc<ControllerSettings>,
    metrics: Arc<Metrics>,
    state: MergeState,
    observed: ObservedIndex,
    names: Arc<Interner>,
    /// Services whose inputs changed since the last merge.
    to_merge: BTreeSet<NamespacedName>,
    /// Services whose observed objects changed.
    to_compare: BTreeSet<NamespacedName>,
    /// Services whose writes failed: compared again when their retry is due (not on every
    /// event elsewhere), or sooner when their own inputs change.
    failed: Retries<NamespacedName>,
    /// Whether a deletion of a slice without a service label failed: every pass tries those
    /// again, and one runs when this retry is due.
    unlabelled: Retries<()>,
    /// Whether the first full merge has run.
    merged: bool,
    /// The remote members.
    remote: Vec<ClusterId>,
    /// Which complete lists of each member have been filed ([`list_bit`]).
    heard: HashMap<ClusterId, u8>,
    /// The imports held for members not heard from since the start, and whom each waits for
    /// ([`MergeState::hold`]).
    holds: HashMap<NamespacedName, BTreeSet<ClusterId>>,
    withdrawn: BTreeSet<ClusterId>,
    /// The conflict reasons of each local export in conflict, for `mcs_conflicts`.
    conflicts: HashMap<NamespacedName, Vec<String>>,
    /// The refused endpoints of each service that has any, for the log and
    /// `mcs_refused_addresses`.
    refused: HashMap<NamespacedName, Vec<RefusedEndpoint>>,
    /// The local namespaces: a service is written only where its namespace exists.
    namespaces: LocalNamespaces,
}

impl Controller {
    fn file(&mut self, event: ControllerEvent) {
        match event {
            ControllerEvent::Member(change) => {
                if let Some((cluster, bit)) = list_bit(&change) {
                    *self.heard.entry(cluster.clone()).or_default() |= bit;
                }
                self.state.apply(change, &mut self.to_merge)
            }
            ControllerEvent::Observed(change) => {
                let touched: Vec<NamespacedName> = match *change {
                    ObservedChange::Imports(list) => {
                        self.observed.replace_imports(list).into_iter().collect()
                    }
                    ObservedChange::Slices(list) => {
                        self.observed.replace_slices(list).into_iter().collect()
                    }
                    ObservedChange::Exports(list) => {
                        self.observed.replace_exports(list).into_iter().collect()
                    }
                    ObservedChange::Import(o) => self.observed.put_import(o).into_iter().collect(),
                    ObservedChange::Slice(o) => self.observed.put_slice(o),
                    ObservedChange::Export(o) => self.observed.put_export(o).into_iter().collect(),
                    ObservedChange::Deleted(kind, id, rv) => self.observed.delete(kind, &id, rv),
                };
                self.to_compare.extend(touched);
            }
            ControllerEvent::Namespaces(change) => {
                let opened = self.namespaces.apply(change);
                if !opened.is_empty() {
                    let services = self.state.imports().map(|i| &i.service);
                    self.to_compare.extend(
                        services
                            .filter(|s| opened.iter().any(|n| **n == *s.namespace))
                            .cloned(),
                    );
                }
            }
        }
    }

    /// Brings the members' withdrawal in line with `withdrawn`.
    fn set_withdrawn(&mut self, withdrawn: BTreeSet<ClusterId>, watches: &[MemberWatch]) {
        if withdrawn == self.withdrawn {
            return;
        }
        for w in watches {
            let out = withdrawn.contains(&w.cluster);
            if out != self.withdrawn.contains(&w.cluster) {
                if out {
                    warn!(cluster = %w.cluster, grace_s = self.settings.unreachable_grace.as_secs_f64(),
                        "member unreachable past the grace period; withdrawing its endpoints");
                } else {
                    info!(cluster = %w.cluster, "member is back; restoring its endpoints");
                }
                self.state.apply(
                    MemberChange::Withdrawn(w.cluster.clone(), out),
                    &mut self.to_merge,
                );
            }
            self.metrics
                .member_withdrawn
                .get_or_create(&ClusterLabels {
                    cluster: w.cluster.to_string(),
                })
                .set(i64::from(out));
        }
        self.withdrawn = withdrawn;
    }

    /// Merges what changed; every service that may differ (to compare, in order) and how many
    /// the merge changed.
    fn decide(&mut self) -> (Vec<NamespacedName>, usize) {
        // The first merge logs every diagnostic, refused endpoints included.
        let log_refused = self.merged;
        let merged = if self.merged {
            self.state.update(&std::mem::take(&mut self.to_merge))
        } else {
            // The first merge: everything, keeping the IPs the imports already hold.
            self.to_merge.clear();
            let existing: Vec<_> = self.observed.imports().map(|o| o.record.clone()).collect();
            self.hold_unheard(&existing);
            self.merged = true;
            let services = self.state.merge_all(&existing);
            for d in self.state.diagnostics() {
                warn!("{d}");
            }
            services
                .into_iter()
                .chain(self.observed.services())
                .collect()
        };
        let mut services = merged.clone();
        services.extend(std::mem::take(&mut self.to_compare));
        // Compared now: a write that fails again waits longer.
        for service in &services {
            self.failed.attempt(service);
        }
        let mut refused_changed = false;
        for service in &merged {
            let refused = self.state.service(service).map_or(&[][..], |o| &o.refused);
            refused_changed |= note_refused(&mut self.refused, service, refused, log_refused);
        }
        if refused_changed {
            let mut counts = BTreeMap::new();
            for r in self.refused.values().flatten() {
                *counts
                    .entry((AddressUse::MemberEndpoint, r.why))
                    .or_insert(0) += 1;
            }
            self.metrics
                .set_refused(&[AddressUse::MemberEndpoint], &counts);
        }
        (services.into_iter().collect(), merged.len())
    }

    /// Before the first merge: holds the `existing` imports that name a member not heard from
    /// yet (a controller started during its outage), so that they keep their ClusterSet IPs
    /// instead of being deleted for want of that member's exports.
    fn hold_unheard(&mut self, existing: &[ImportRecord]) {
        let unheard: Vec<ClusterId> = (self.remote.iter())
            .filter(|c| !heard_from(&self.heard, c))
            .cloned()
            .collect();
        if unheard.is_empty() {
            return;
        }
        let mut held = Vec::new();
        for import in existing {
            let waits: BTreeSet<ClusterId> = (import.status_clusters())
                .filter_map(|c| unheard.iter().find(|u| u.as_str() == c))
                .cloned()
                .collect();
            if !waits.is_empty() {
                self.holds.insert(import.service.clone(), waits);
                held.push(import.clone());
            }
        }
        if !held.is_empty() {
            warn!(
                imports = held.len(),
                members = ?unheard,
                "members not heard from since the start: their imports are kept as they are, \
                 with their ClusterSet IPs, until they are listed"
            );
        }
        self.state.hold(held);
    }

    /// Ends the holds whose members have all been heard from, to be merged again.
    fn release_heard(&mut self) {
        let mut done = BTreeSet::new();
        let heard = &self.heard;
        self.holds.retain(|service, waits| {
            waits.retain(|c| !heard_from(heard, c));
            if waits.is_empty() {
                done.insert(service.clone());
            }
            !waits.is_empty()
        });
        if !done.is_empty() {
            info!(
                imports = done.len(),
                "members heard from: their held imports are merged again"
            );
            self.state.release(&done, &mut self.to_merge);
        }
    }

    /// The actions that make `services` agree with the merge.
    fn actions_for(&mut self, services: &[NamespacedName], now: &Time) -> Vec<Action> {
        let local = &self.settings.local;
        let mut actions = Vec::new();
        for service in services {
            let output = self.state.service(service);
            let desired = DesiredService::of(output, local);
            note_conflicts(&mut self.conflicts, &self.metrics, service, desired);
            let mut of_service =
                reconcile_service(service, desired, self.observed.service(service), now);
            // Where the namespace does not exist (or terminates), the import and its slices
            // would only fail to be created: they wait for it. Deletions, and the status of
            // and Events on a local export (which exists, so its namespace does), go ahead.
            if !self.namespaces.writable(&service.namespace) {
                let before = of_service.len();
                of_service.retain(|a| {
                    !matches!(
                        a,
                        Action::ApplyImport(_)
                            | Action::ApplyImportStatus(_)
                            | Action::ApplySlice(_)
                    )
                });
                if of_service.len() < before {
                    self.namespaces.skipped(&service.namespace);
                }
            }
            actions.extend(of_service);
        }
        actions
    }

    /// Compares `services` and writes what differs, a chunk of services at a time: the first
    /// pass writes every import and imported slice, and building all of them before writing
    /// held them all at once (several hundred MiB at 10,000 services). Then deletes the
    /// slices without a service label. The number of writes and of failed ones.
    async fn reconcile(
        &mut self,
        services: &[NamespacedName],
        now: &Time,
        sink: &KubeSink,
        events: &mut mpsc::UnboundedReceiver<ControllerEvent>,
    ) -> Pass {
        let (mut count, mut errors, mut filed) = (0, 0, false);
        for chunk in services.chunks(SERVICES_PER_WRITE_CHUNK) {
            let actions = self.actions_for(chunk, now);
            count += actions.len();
            errors += self.write(actions, sink).await;
            // The watches echo every write of a large pass (tens of thousands of converted
            // objects, held in the channel until it ends): file them as they come, so that
            // each is freed once filed. What they mark is compared or merged in the next
            // pass, as if it had come after this one.
            while let Ok(event) = events.try_recv() {
                self.file(event);
                filed = true;
            }
        }
        let actions = reconcile_unlabelled(&self.observed);
        count += actions.len();
        errors += self.write(actions, sink).await;
        Pass {
            count,
            errors,
            filed,
        }
    }

    /// Applies `actions`; the number of failed writes. What a write answered is filed as
    /// observed at once.
    async fn write(&mut self, actions: Vec<Action>, sink: &KubeSink) -> usize {
        let mut errors = 0;
        let mut failed_exports = BTreeSet::new();
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
                    self.file_written(written);
                }
                Err(e) => {
                    errors += 1;
                    self.metrics.write(kind, op, false);
                    match action.service() {
                        Some(service) => {
                            self.failed.failed(service.clone(), Instant::now());
                            if matches!(action, Action::ApplyExportStatus { .. }) {
                                failed_exports.insert(service);
                            }
                        }
                        // The deletion of a slice without a service label: retried on its own
                        // schedule.
                        None => self.unlabelled.failed((), Instant::now()),
                    }
                    warn!(error = %e, "write failed; will retry");
                }
            }
        }
        errors
    }

    fn file_written(&mut self, written: Written) {
        let names = &self.names;
        match written {
            Written::Import(o) => {
                if let Some(o) = ObservedImport::from_k8s(&o, names) {
                    self.observed.put_import(o);
                }
            }
            Written::Slice(o) => {
                self.observed.put_slice(ObservedSlice::from_k8s(&o, names));
            }
            Written::Export(o) => {
                self.observed
                    .put_export(ObservedExport::from_k8s(&o, names));
            }
            Written::DeletedImport {
                service,
                resource_version,
            } => {
                self.observed
                    .delete(ObservedKind::Import, &service, resource_version);
            }
            Written::DeletedSlice {
                slice,
                resource_version,
            } => {
                self.observed
                    .delete(ObservedKind::Slice, &slice, resource_version);
            }
            Written::Event => {}
        }
    }
}

/// Keeps `service`'s refused endpoints, logging those not refused before when `log`; whether
/// they changed.
fn note_refused(
    kept: &mut HashMap<NamespacedName, Vec<RefusedEndpoint>>,
    service: &NamespacedName,
    refused: &[RefusedEndpoint],
    log: bool,
) -> bool {
    let before = kept.get(service).map_or(&[][..], Vec::as_slice);
    if before == refused {
        return false;
    }
    if log {
        // Both sorted: the new ones are those `before` lacks.
        for r in refused.iter().filter(|r| before.binary_search(r).is_err()) {
            warn!(cluster = %r.cluster, slice = %r.slice, address = %r.addr, reason = r.why.label(),
                "endpoint {} of EndpointSlice {} is {}; not imported", r.addr, r.slice, r.why);
        }
    }
    if refused.is_empty() {
        kept.remove(service);
    } else {
        kept.insert(service.clone(), refused.to_vec());
    }
    true
}

/// Keeps the conflict reasons of `service`'s local export, and the `mcs_conflicts` gauges.
fn note_conflicts(
    conflicts: &mut HashMap<NamespacedName, Vec<String>>,
    metrics: &Metrics,
    service: &NamespacedName,
    desired: DesiredService<'_>,
) {
    let reasons: Vec<String> = desired
        .local_export
        .and_then(|s| s.conflict())
        .into_iter()
        .flat_map(|c| c.reason.split(',').map(str::to_owned))
        .collect();
    let changed = if reasons.is_empty() {
        conflicts.remove(service).is_some()
    } else {
        conflicts.insert(service.clone(), reasons.clone()) != Some(reasons)
    };
    if changed {
        let mut counts = BTreeMap::new();
        for r in conflicts.values().flatten() {
            *counts.entry(r.clone()).or_insert(0) += 1;
        }
        metrics.set_conflicts(&counts);
    }
}

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
    let names = Arc::new(Interner::new());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let changed = Arc::new(Notify::new());
    let watches: Vec<MemberWatch> = members
        .into_iter()
        .map(|(id, client)| {
            MemberWatch::start(
                id,
                client,
                settings.probe_interval,
                metrics.clone(),
                names.clone(),
                tx.clone(),
                changed.clone(),
            )
        })
        .collect();
    let local = LocalWatch::start(
        &settings.local,
        local_client.clone(),
        metrics.clone(),
        names.clone(),
        tx,
        changed.clone(),
    );
    let sink = KubeSink::new(local_client, &settings.identity);
    let mut state = MergeState::new(settings.clusterset.clone(), settings.local.clone());
    state.set_grace(settings.unreachable_grace);
    state.set_policy(settings.policy.clone());
    let mut ctl = Controller {
        settings: settings.clone(),
        metrics: metrics.clone(),
        state,
        observed: ObservedIndex::default(),
        names,
        to_merge: BTreeSet::new(),
        to_compare: BTreeSet::new(),
        failed: Retries::default(),
        unlabelled: Retries::default(),
        merged: false,
        remote: (watches.iter())
            .map(|w| w.cluster.clone())
            .filter(|c| *c != settings.local)
            .collect(),
        heard: HashMap::new(),
        holds: HashMap::new(),
        withdrawn: BTreeSet::new(),
        conflicts: HashMap::new(),
        refused: HashMap::new(),
        namespaces: LocalNamespaces::default(),
    };
    let started = Instant::now();
    let mut waiting_logged = false;
    let mut filed_during_pass = false;
    info!(local = %settings.local, members = watches.len(), "controller started");
    loop {
        let retry = [ctl.failed.deadline(), ctl.unlabelled.deadline()];
        let deadline = next_deadline(
            &watches,
            &settings,
            started,
            retry.into_iter().flatten().min(),
        );
        if std::mem::take(&mut filed_during_pass) {
            // No wait for an event, but a turn for the runtime's other tasks: under steady
            // churn this loop would otherwise run pass after pass without yielding.
            tokio::task::yield_now().await;
        } else {
            tokio::select! {
                event = rx.recv() => match event {
                    Some(event) => ctl.file(event),
                    None => return,
                },
                () = changed.notified() => {}
                () = sleep_until(deadline) => {}
            }
        }
        // Everything queued is filed before the pass: a burst costs one pass.
        while let Ok(event) = rx.try_recv() {
            ctl.file(event);
        }
        let Some(withdrawn) = gate(&watches, &local, &settings, started) else {
            if !waiting_logged {
                info!("waiting for the initial lists of every member before the first merge");
                waiting_logged = true;
            }
            continue;
        };
        // A watch counts as listed once its list was sent: what the gate saw listed is filed
        // now if it came after the drain above.
        while let Ok(event) = rx.try_recv() {
            ctl.file(event);
        }
        ctl.set_withdrawn(withdrawn, &watches);
        ctl.release_heard();
        // The failed writes are retried on their own schedules: a pass of other services
        // leaves them alone.
        let due = ctl.failed.take_due(Instant::now());
        ctl.to_compare.extend(due);
        let unlabelled_due = !ctl.unlabelled.take_due(Instant::now()).is_empty();
        if ctl.merged && ctl.to_merge.is_empty() && ctl.to_compare.is_empty() && !unlabelled_due {
            continue;
        }
        let pass_started = std::time::Instant::now();
        let now = Time(
            k8s_openapi::jiff::Timestamp::from_second(
                k8s_openapi::jiff::Timestamp::now().as_second(),
            )
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        let (services, merged) = ctl.decide();
        let Pass {
            count,
            errors,
            filed,
        } = ctl.reconcile(&services, &now, &sink, &mut rx).await;
        filed_during_pass = filed;
        // A large pass (the first one, a relist) leaves its transients in the allocator's
        // pages; hand them back, as the node does after a large sync.
        if services.len() >= crate::memory::LARGE_SYNC_SERVICES {
            crate::memory::release_freed();
        }
        metrics
            .reconcile_duration
            .observe(pass_started.elapsed().as_secs_f64());
        if count > 0 {
            info!(
                merged,
                writes = count - errors,
                errors,
                elapsed_us = pass_started.elapsed().as_micros() as u64,
                "reconciled"
            );
        }
        ctl.failed.end_pass();
        ctl.unlabelled.end_pass();
    }
}

/// Every complete list of a member: its Services, ServiceExports and local slices.
const ALL_LISTS: u8 = 0b111;

/// Whether every complete list of `member` has been filed (`heard`: [`list_bit`]s by member).
fn heard_from(heard: &HashMap<ClusterId, u8>, member: &ClusterId) -> bool {
    heard.get(member) == Some(&ALL_LISTS)
}

/// The member and kind of a complete list.
fn list_bit(change: &MemberChange) -> Option<(&ClusterId, u8)> {
    match change {
        MemberChange::Services(c, _) => Some((c, 0b001)),
        MemberChange::Exports(c, _) => Some((c, 0b010)),
        MemberChange::Slices(c, _) => Some((c, 0b100)),
        _ => None,
    }
}

/// The members whose endpoints are withdrawn, or `None` while the merge must wait: the local
/// cluster's lists are not complete, or a remote member's are not and it has been neither
/// unreachable nor slow for longer than the grace period.
fn gate(
    watches: &[MemberWatch],
    local: &LocalWatch,
    settings: &ControllerSettings,
    started: Instant,
) -> Option<BTreeSet<ClusterId>> {
    let grace = settings.unreachable_grace;
    let mut withdrawn = BTreeSet::new();
    for w in watches {
        if w.cluster == settings.local {
            if !(w.synced() && local.synced()) {
                return None;
            }
            continue;
        }
        let past_grace = w
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

/// When the gate's answer can change without a watch event: a member reaching the grace
/// period, or a retry of failed writes.
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
        .filter_map(|w| match w.unreachable_since() {
            Some(since) => since.checked_add(grace),
            None if !w.synced() => started.checked_add(grace),
            None => None,
        })
        .filter(|d| *d > now)
        .chain(retry)
        .min()
}

/// Stops the controller task, if any, and drops its gauges once it has really stopped (a pass
/// still running until its next await could set them again).
async fn stop(running: Option<AbortOnDrop>, metrics: &Metrics) {
    if let Some(mut task) = running {
        task.0.abort();
        let _ = (&mut task.0).await;
        metrics.clear_controller_gauges();
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
                stop(running.take(), &metrics).await;
            }
            _ => {}
        }
        let controller_ended = async {
            match running.as_mut() {
                Some(task) => (&mut task.0).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = leader.changed() => if changed.is_err() {
                metrics.leader.set(0);
                stop(running.take(), &metrics).await;
                return;
            },
            outcome = controller_ended => {
                // A controller that panicked must not leave this replica holding the lease
                // with nothing running: the panic goes on to the task's supervisor, which
                // fails /healthz and exits, and another replica takes over.
                if let Err(e) = outcome
                    && e.is_panic()
                {
                    metrics.leader.set(0);
                    std::panic::resume_unwind(e.into_panic());
                }
                // It ended on its own (it has nothing to do): not started again.
                while leader.changed().await.is_ok() {}
                metrics.leader.set(0);
                return;
            }
        }
    }
}
