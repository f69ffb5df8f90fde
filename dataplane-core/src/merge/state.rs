//! The merge kept service by service: the members' inputs indexed by the service they belong
//! to, and what each service merged into.
//!
//! Almost all of the merge is local to one service: its Services, ServiceExports and local
//! slices in every member decide its import, its imported slices and its exports'
//! conditions. A change to one member object ([`MemberChange`]) marks that service, and
//! [`MergeState::update`] merges the marked services again, alone, so an event costs the size
//! of its service, not of the ClusterSet. [`merge`](super::merge) is the same code with every
//! service marked.
//!
//! Two things are shared between services, and both are decided by a full merge: ClusterSet
//! IPs (sticky: an import keeps the IPs it holds; in a full CIDR the holders first, then
//! namespace/name order, see `ips.rs`) and the names of imported slices (a name two services
//! want goes to the first in namespace/name order). An update keeps to that
//! order: it allocates only from the addresses no other service holds, and it falls back to a
//! full merge, with every current import's IPs kept, in the rare cases where the order
//! matters: a CIDR too small for every import, or a slice name another service wants too.
//! So an update always gives what a full merge of the same inputs gives, with the current
//! imports as the existing ones (property-tested in `merge/tests.rs`).

use std::{collections::BTreeSet, net::IpAddr, sync::Arc, time::Duration};

use foldhash::{HashMap, HashMapExt as _};

use super::{
    ClusterSetConfig, ClusterSnapshot, Diagnostic, ExportStatus, MergeOutput, conditions, exports,
    families, ips, ports, properties, slices,
};
use crate::lb::inputs::{ImportInput, SliceInput};
use crate::model::{
    ClusterId, ClusterStatus, Interner, IpFamily, LABEL_K8S_SERVICE_NAME, NamespacedName,
    ServiceImportStatus, ServiceImportType,
    by_id::ById,
    member::{ExportRecord, LocalSlice, ServiceRecord},
    name::Name,
    records::{ImportRecord, ImportedSlice},
};
use crate::policy::{AddressPolicy, RefusedEndpoint};

/// A change to one member cluster's objects, as its watches report it.
#[derive(Clone, Debug)]
pub enum MemberChange {
    /// A Service was added or modified.
    Service(ClusterId, Arc<ServiceRecord>),
    /// The Service with this namespace/name was deleted.
    ServiceDeleted(ClusterId, NamespacedName),
    /// A ServiceExport was added or modified.
    Export(ClusterId, Arc<ExportRecord>),
    /// The ServiceExport with this namespace/name was deleted.
    ExportDeleted(ClusterId, NamespacedName),
    /// A local EndpointSlice was added or modified (possibly moved to another Service).
    Slice(ClusterId, Arc<LocalSlice>),
    /// The local EndpointSlice with this namespace/name was deleted.
    SliceDeleted(ClusterId, NamespacedName),
    /// The complete list of a member's Services (a watch's first list or a re-list).
    Services(ClusterId, Vec<Arc<ServiceRecord>>),
    /// The complete list of a member's ServiceExports.
    Exports(ClusterId, Vec<Arc<ExportRecord>>),
    /// The complete list of a member's local EndpointSlices.
    Slices(ClusterId, Vec<Arc<LocalSlice>>),
    /// A member's endpoints are withdrawn (`true`: unreachable past the grace period) or
    /// back (`false`). Its Services and ServiceExports keep counting.
    Withdrawn(ClusterId, bool),
}

/// What the merge made of one service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceOutput {
    /// The import, when at least one export is valid, in the form the node files it: the
    /// node's inputs share it rather than copy it (read it with [`ServiceOutput::import`]).
    pub import: Option<ImportInput>,
    /// The imported slices, in the form the node files them (shared, like `import`).
    pub slices: Vec<SliceInput>,
    /// The conditions of the service's exports, by cluster.
    pub statuses: Vec<ExportStatus>,
    /// The endpoints of members' local slices the address policy kept out of `slices`,
    /// sorted.
    pub refused: Vec<RefusedEndpoint>,
}

impl ServiceOutput {
    /// The import, when at least one export is valid.
    pub fn import(&self) -> Option<&ImportRecord> {
        self.import.as_deref().and_then(|c| c.record())
    }

    /// The imported slices.
    pub fn slices(&self) -> impl Iterator<Item = &ImportedSlice> {
        self.slices.iter().filter_map(|c| c.record())
    }

    /// Takes `old`'s records where they equal this output's: the node holds the old ones, and
    /// keeps sharing them with the merge after a re-merge that did not change them.
    fn keep_unchanged(&mut self, old: &ServiceOutput) {
        if let (Some(new), Some(prev)) = (&mut self.import, &old.import)
            && new == prev
        {
            *new = Arc::clone(prev);
        }
        for slice in &mut self.slices {
            if let Some(prev) = old.slices.iter().find(|p| *p == slice) {
                *slice = Arc::clone(prev);
            }
        }
    }
}

/// One member's objects of one service.
#[derive(Clone, Debug, Default)]
struct Member {
    service: Option<Arc<ServiceRecord>>,
    export: Option<Arc<ExportRecord>>,
    /// Sorted by name.
    slices: Vec<Arc<LocalSlice>>,
}

impl Member {
    fn is_empty(&self) -> bool {
        self.service.is_none() && self.export.is_none() && self.slices.is_empty()
    }
}

/// The members' objects of one service, by cluster: a sorted list, since a service has a
/// handful of members (a tree node would be several times their size).
type Members = litemap::LiteMap<ClusterId, Member>;

/// Every service's members. A hashbrown map for `entry_ref`: filing an object under a service
/// that is already there (nearly every call) clones no name.
type ServiceMembers = hashbrown::HashMap<NamespacedName, Members, foldhash::fast::RandomState>;

/// A member's objects of one service as a merge reads them: its local slices are left out
/// while its endpoints are withdrawn.
type MemberInputs<'a> = (&'a ClusterId, &'a Member, &'a [Arc<LocalSlice>]);

/// The member `cluster` of `service` in `services`, filed empty if it is not there.
fn member_of<'m>(
    services: &'m mut ServiceMembers,
    service: &NamespacedName,
    cluster: &ClusterId,
) -> &'m mut Member {
    services
        .entry_ref(service)
        .or_default()
        .entry(cluster.clone())
        .or_default()
}

/// The order of a shared resource (an IP, a slice name) matters for this change: only a full
/// merge gives it out as the full merge does.
#[derive(Debug)]
struct Contention;

/// The merge of a ClusterSet for one importing cluster, kept service by service.
#[derive(Debug)]
pub struct MergeState {
    config: ClusterSetConfig,
    importing: ClusterId,
    local_families: Vec<IpFamily>,
    /// How long members may be unreachable before their endpoints are withdrawn, for the
    /// import's `Ready` message.
    grace: Duration,
    /// Which endpoints may be imported.
    policy: AddressPolicy,
    services: ServiceMembers,
    /// Every member's local slices by id, labelled or not; a slice's label says where it is
    /// filed ([`LocalSlice::service_id`]). The slices themselves are the buckets: 8 bytes each, where a map
    /// from a copy of the id to a copy of the service took 80.
    filed_slices: HashMap<ClusterId, ById<Arc<LocalSlice>>>,
    withdrawn: BTreeSet<ClusterId>,
    outputs: HashMap<NamespacedName, ServiceOutput>,
    /// Imports kept as they are while no member makes anything of their service
    /// ([`MergeState::hold`]).
    held: HashMap<NamespacedName, ImportRecord>,
    ip_owners: HashMap<IpAddr, NamespacedName>,
    /// ClusterSetIP imports a full CIDR left without IPs.
    starved: BTreeSet<NamespacedName>,
    names: SliceNames,
    /// The imported slices' port lists and port names, one allocation per distinct list or
    /// name (the clusters of a service, and most services, declare the same ports). Purged
    /// after a full merge; between them, by itself once the new lists outnumber the kept.
    port_lists: Interner,
    /// Duplicates found by the last [`MergeState::load`].
    load_diagnostics: Vec<Diagnostic>,
    /// Batches of this many services or more are merged on several threads.
    parallel_from: usize,
    /// How many: one per core unless set (tests).
    threads: Option<usize>,
}

impl MergeState {
    /// An empty ClusterSet, merged for `importing`.
    pub fn new(config: ClusterSetConfig, importing: ClusterId) -> Self {
        MergeState {
            local_families: config.supported_families(&importing),
            policy: AddressPolicy::for_cidrs(&config.cidrs),
            config,
            importing,
            grace: Duration::ZERO,
            services: ServiceMembers::default(),
            filed_slices: HashMap::new(),
            withdrawn: BTreeSet::new(),
            outputs: HashMap::new(),
            held: HashMap::new(),
            ip_owners: HashMap::new(),
            starved: BTreeSet::new(),
            names: SliceNames::default(),
            port_lists: Interner::new(),
            load_diagnostics: Vec::new(),
            parallel_from: batch::PARALLEL_FROM,
            threads: None,
        }
    }

    /// Sets the grace period the `Ready` message of imports with withdrawn members names.
    pub fn set_grace(&mut self, grace: Duration) {
        self.grace = grace;
    }

    /// Merges batches of `services` or more on `threads` threads (tests use it to take either
    /// path with small inputs, on any machine).
    #[cfg(test)]
    pub(crate) fn set_parallel(&mut self, services: usize, threads: usize) {
        self.parallel_from = services;
        self.threads = Some(threads);
    }

    /// Sets which endpoints may be imported (by default [`AddressPolicy::for_cidrs`] of the
    /// config's CIDRs); the services already merged are merged again.
    pub fn set_policy(&mut self, policy: AddressPolicy) {
        if policy != self.policy {
            self.policy = policy;
            let existing = self.current_ips();
            self.merge_everything(&existing);
            self.port_lists.purge();
        }
    }

    /// The IPs every current import holds.
    fn current_ips(&self) -> HashMap<NamespacedName, Vec<IpAddr>> {
        self.outputs
            .values()
            .filter_map(|o| o.import())
            .map(|i| (i.service.clone(), i.ips.clone()))
            .collect()
    }

    /// Replaces every member's objects with `snapshots` and merges everything, keeping the
    /// ClusterSet IPs of `existing` (the importing cluster's current imports) while valid.
    /// Snapshots of one cluster are combined, and duplicate objects within a cluster are
    /// reported (one definition is used).
    pub fn load(&mut self, snapshots: &[ClusterSnapshot], existing: &[ImportRecord]) {
        let mut diagnostics = Vec::new();
        self.services.clear();
        self.filed_slices.clear();
        // Services and exports filed straight under their service, slices by id first; a
        // second definition of an object in a cluster is reported and the smaller one kept,
        // so the choice does not depend on the input order.
        let mut seen = BTreeSet::new();
        for snap in snapshots {
            let cluster = &snap.cluster;
            if !seen.insert(cluster) {
                diagnostics.push(Diagnostic {
                    cluster: Some(cluster.clone()),
                    object: format!("cluster {cluster}"),
                    message: "given more than once; its objects are combined".into(),
                });
            }
            let dup = |kind: &str, id: &NamespacedName| Diagnostic {
                cluster: Some(cluster.clone()),
                object: format!("{kind} {id}"),
                message: super::DUPLICATE.into(),
            };
            for svc in &snap.services {
                if exports::file_once(&mut self.member(&svc.id, cluster).service, svc) {
                    diagnostics.push(dup("Service", &svc.id));
                }
            }
            for se in &snap.service_exports {
                if exports::file_once(&mut self.member(&se.id, cluster).export, se) {
                    diagnostics.push(dup("ServiceExport", &se.id));
                }
            }
            // A slice id once per cluster, whatever its label: a second definition (under
            // another service, or without a label) is a duplicate too, or the two would be
            // filed in two places and a delete would find only one.
            let filed = self.filed_slices.entry(cluster.clone()).or_default();
            for slice in &snap.endpoint_slices {
                match filed.get_mut(&slice.id) {
                    Some(existing) => {
                        diagnostics.push(dup("EndpointSlice", &slice.id));
                        if slice.duplicate_rank(existing).is_lt() {
                            *existing = Arc::clone(slice);
                        }
                    }
                    None => {
                        filed.insert(Arc::clone(slice));
                    }
                }
            }
        }
        let MergeState {
            services,
            filed_slices,
            ..
        } = self;
        for (cluster, filed) in filed_slices.iter() {
            for slice in filed.iter() {
                if let Some(service) = slice.service_id() {
                    member_of(services, &service, cluster)
                        .slices
                        .push(Arc::clone(slice));
                }
            }
        }
        for members in services.values_mut() {
            for (_, member) in members.iter_mut() {
                member.slices.sort_by(|a, b| a.id.name.cmp(&b.id.name));
            }
        }
        self.load_diagnostics = diagnostics;
        let existing: HashMap<NamespacedName, Vec<IpAddr>> = sticky_ips(existing);
        self.merge_everything(&existing);
        self.port_lists.purge();
    }

    /// Merges every service again, keeping the ClusterSet IPs of `existing` (the importing
    /// cluster's current imports) while valid; the services the merge made anything of.
    pub fn merge_all(&mut self, existing: &[ImportRecord]) -> BTreeSet<NamespacedName> {
        self.merge_everything(&sticky_ips(existing));
        self.port_lists.purge();
        self.outputs.keys().cloned().collect()
    }

    fn member(&mut self, service: &NamespacedName, cluster: &ClusterId) -> &mut Member {
        member_of(&mut self.services, service, cluster)
    }

    /// Files a member's change, adding the services whose inputs changed to `dirty`.
    pub fn apply(&mut self, change: MemberChange, dirty: &mut BTreeSet<NamespacedName>) {
        match change {
            MemberChange::Service(c, svc) => {
                let id = svc.id.clone();
                let slot = &mut self.member(&id, &c).service;
                if slot.as_ref() != Some(&svc) {
                    *slot = Some(svc);
                    dirty.insert(id);
                }
            }
            MemberChange::ServiceDeleted(c, id) => {
                if self.take(&id, &c, |m| m.service.take().is_some()) {
                    dirty.insert(id);
                }
            }
            MemberChange::Export(c, export) => {
                let id = export.id.clone();
                let slot = &mut self.member(&id, &c).export;
                if slot.as_ref() != Some(&export) {
                    *slot = Some(export);
                    dirty.insert(id);
                }
            }
            MemberChange::ExportDeleted(c, id) => {
                if self.take(&id, &c, |m| m.export.take().is_some()) {
                    dirty.insert(id);
                }
            }
            MemberChange::Slice(c, slice) => self.file_slice(c, slice, dirty),
            MemberChange::SliceDeleted(c, id) => self.unfile_slice(&c, &id, dirty),
            MemberChange::Services(c, list) => {
                let listed: BTreeSet<NamespacedName> = list.iter().map(|s| s.id.clone()).collect();
                let gone: Vec<NamespacedName> = self
                    .held_by(&c, |m| m.service.is_some())
                    .filter(|id| !listed.contains(id))
                    .collect();
                for id in gone {
                    self.apply(MemberChange::ServiceDeleted(c.clone(), id), dirty);
                }
                for svc in list {
                    self.apply(MemberChange::Service(c.clone(), svc), dirty);
                }
            }
            MemberChange::Exports(c, list) => {
                let listed: BTreeSet<NamespacedName> = list.iter().map(|e| e.id.clone()).collect();
                let gone: Vec<NamespacedName> = self
                    .held_by(&c, |m| m.export.is_some())
                    .filter(|id| !listed.contains(id))
                    .collect();
                for id in gone {
                    self.apply(MemberChange::ExportDeleted(c.clone(), id), dirty);
                }
                for export in list {
                    self.apply(MemberChange::Export(c.clone(), export), dirty);
                }
            }
            MemberChange::Slices(c, list) => {
                let listed: BTreeSet<NamespacedName> = list.iter().map(|s| s.id.clone()).collect();
                let gone: Vec<NamespacedName> = self
                    .filed_slices
                    .get(&c)
                    .into_iter()
                    .flat_map(ById::iter)
                    .filter(|s| !listed.contains(&s.id))
                    .map(|s| s.id.clone())
                    .collect();
                for id in gone {
                    self.unfile_slice(&c, &id, dirty);
                }
                for slice in list {
                    self.file_slice(c.clone(), slice, dirty);
                }
            }
            MemberChange::Withdrawn(c, out) => {
                let changed = if out {
                    self.withdrawn.insert(c.clone())
                } else {
                    self.withdrawn.remove(&c)
                };
                if changed {
                    dirty.extend(
                        self.services
                            .iter()
                            .filter(|(_, members)| members.contains_key(&c))
                            .map(|(s, _)| s.clone()),
                    );
                    // A held import's Ready message names its withdrawn clusters.
                    dirty.extend(held::naming(&self.held, &c));
                }
            }
        }
    }

    /// The services in which `cluster`'s member matches `holds`.
    fn held_by<'a>(
        &'a self,
        cluster: &'a ClusterId,
        holds: impl Fn(&Member) -> bool + 'a,
    ) -> impl Iterator<Item = NamespacedName> + 'a {
        self.services
            .iter()
            .filter(move |(_, members)| members.get(cluster).is_some_and(&holds))
            .map(|(s, _)| s.clone())
    }

    /// Applies `edit` to a member of a service, dropping what is left empty; whether it
    /// changed anything.
    fn take(
        &mut self,
        service: &NamespacedName,
        cluster: &ClusterId,
        edit: impl FnOnce(&mut Member) -> bool,
    ) -> bool {
        let Some(members) = self.services.get_mut(service) else {
            return false;
        };
        let Some(member) = members.get_mut(cluster) else {
            return false;
        };
        let changed = edit(member);
        if member.is_empty() {
            members.remove(cluster);
        }
        if members.is_empty() {
            self.services.remove(service);
        }
        changed
    }

    fn file_slice(
        &mut self,
        cluster: ClusterId,
        slice: Arc<LocalSlice>,
        dirty: &mut BTreeSet<NamespacedName>,
    ) {
        // Filed as it is: in the member's list of the service its label names (the home).
        let unchanged = self
            .filed_slices
            .get(&cluster)
            .and_then(|f| f.get(&slice.id))
            .is_some_and(|old| Arc::ptr_eq(old, &slice) || **old == *slice);
        if unchanged {
            return;
        }
        self.unfile_slice(&cluster, &slice.id, dirty);
        self.filed_slices
            .entry(cluster.clone())
            .or_default()
            .insert(Arc::clone(&slice));
        if let Some(service) = slice.service_id() {
            let slices = &mut self.member(&service, &cluster).slices;
            let at = slices.partition_point(|s| s.id.name <= slice.id.name);
            slices.insert(at, slice);
            dirty.insert(service);
        }
    }

    fn unfile_slice(
        &mut self,
        cluster: &ClusterId,
        id: &NamespacedName,
        dirty: &mut BTreeSet<NamespacedName>,
    ) {
        let Some(old) = self
            .filed_slices
            .get_mut(cluster)
            .and_then(|f| f.remove(id))
        else {
            return;
        };
        if let Some(service) = old.service_id() {
            self.take(&service, cluster, |m| {
                m.slices.retain(|s| s.id != *id);
                true
            });
            dirty.insert(service);
        }
    }

    /// Merges the services in `dirty` again and returns those whose output changed.
    pub fn update(&mut self, dirty: &BTreeSet<NamespacedName>) -> BTreeSet<NamespacedName> {
        if dirty.is_empty() {
            return BTreeSet::new();
        }
        let (changed, merged_everything) = self.update_dirty(dirty);
        // After a full merge every list the old outputs held is free (they are gone now).
        if merged_everything {
            self.port_lists.purge();
        }
        changed
    }

    /// [`Self::update`]: the services whose output changed, and whether it took a full merge.
    fn update_dirty(
        &mut self,
        dirty: &BTreeSet<NamespacedName>,
    ) -> (BTreeSet<NamespacedName>, bool) {
        let before: HashMap<NamespacedName, Option<ServiceOutput>> = dirty
            .iter()
            .map(|s| (s.clone(), self.outputs.get(s).cloned()))
            .collect();
        if self.update_batch(dirty).is_err() {
            // Every current import keeps its IPs; the order decides the rest.
            let existing: HashMap<NamespacedName, Vec<IpAddr>> = self
                .outputs
                .values()
                .chain(before.values().flatten())
                .filter_map(|o| o.import())
                .map(|i| (i.service.clone(), i.ips.clone()))
                .collect();
            let previous: HashMap<NamespacedName, ServiceOutput> =
                std::mem::take(&mut self.outputs)
                    .into_iter()
                    .chain(
                        before
                            .iter()
                            .filter_map(|(s, o)| Some((s.clone(), o.clone()?))),
                    )
                    .collect();
            self.merge_everything(&existing);
            let mut changed: BTreeSet<NamespacedName> = previous
                .iter()
                .filter(|(s, o)| self.outputs.get(*s) != Some(*o))
                .map(|(s, _)| s.clone())
                .collect();
            changed.extend(
                self.outputs
                    .keys()
                    .filter(|s| !previous.contains_key(*s))
                    .cloned(),
            );
            return (changed, true);
        }
        let changed = before
            .into_iter()
            .filter(|(s, old)| self.outputs.get(s) != old.as_ref())
            .map(|(s, _)| s)
            .collect();
        (changed, false)
    }

    /// Merges `batch` alone; `Err` when a full merge is needed instead. The outputs are then
    /// unchanged, but the slice names and IP owners may be half-updated: the caller's full
    /// merge rebuilds them. Nothing is copied to undo them, so an update costs what its batch
    /// holds, not what the whole ClusterSet does.
    fn update_batch(&mut self, batch: &BTreeSet<NamespacedName>) -> Result<(), Contention> {
        let mut existing = HashMap::with_capacity(batch.len());
        let mut releases_ips = false;
        for s in batch {
            if let Some(import) = self.outputs.get(s).and_then(|o| o.import()) {
                releases_ips |= !import.ips.is_empty();
                existing.insert(s.clone(), import.ips.clone());
            }
            // A starved import may get the addresses the batch gives up, in name order.
            if releases_ips && self.starved.iter().any(|w| !batch.contains(w)) {
                return Err(Contention);
            }
        }
        // Release what the batch holds (names first: they may be wanted by another service).
        let mut names = std::mem::take(&mut self.names);
        let mut released = Ok(());
        for s in batch {
            if let Some(out) = self.outputs.get(s) {
                released = released.and(names.release(out.slices()));
            }
        }
        self.names = names;
        released?;
        for s in batch {
            if let Some(import) = self.outputs.get(s).and_then(|o| o.import()) {
                for ip in &import.ips {
                    self.ip_owners.remove(ip);
                }
            }
        }
        for (s, out) in self.merge_batch(batch, &existing, true)? {
            self.starved.remove(&s);
            match out {
                Some(mut out) => {
                    if let Some(old) = self.outputs.get(&s) {
                        out.keep_unchanged(old);
                    }
                    self.outputs.insert(s, out);
                }
                None => {
                    self.outputs.remove(&s);
                }
            }
        }
        Ok(())
    }

    /// Forgets every output and merges every service, in namespace/name order.
    fn merge_everything(&mut self, existing: &HashMap<NamespacedName, Vec<IpAddr>>) {
        let previous = std::mem::take(&mut self.outputs);
        self.ip_owners.clear();
        self.starved.clear();
        self.names = SliceNames::default();
        let all: BTreeSet<NamespacedName> = self
            .services
            .keys()
            .chain(self.held.keys())
            .cloned()
            .collect();
        // A full merge never meets contention: it gives everything out in order.
        if let Ok(outputs) = self.merge_batch(&all, existing, false) {
            self.outputs = outputs
                .into_iter()
                .filter_map(|(s, o)| Some((s, o?)))
                .collect();
        }
        self.keep_unchanged_records(&previous);
    }

    /// Takes the records of `previous` outputs that equal the current ones (see
    /// [`ServiceOutput::keep_unchanged`]); for a state rebuilt from scratch, `previous` is the
    /// old state's outputs.
    fn keep_unchanged_records(&mut self, previous: &HashMap<NamespacedName, ServiceOutput>) {
        for (service, out) in &mut self.outputs {
            if let Some(old) = previous.get(service) {
                out.keep_unchanged(old);
            }
        }
    }

    /// [`Self::keep_unchanged_records`] of another state (the one this state replaces).
    pub fn keep_unchanged_records_of(&mut self, replaced: &MergeState) {
        self.keep_unchanged_records(&replaced.outputs);
        // The records taken back hold the other state's port lists: this state's copies of
        // them may be left unused.
        self.port_lists.purge();
    }

    /// What the merge made of `service`, when it made anything.
    pub fn service(&self, service: &NamespacedName) -> Option<&ServiceOutput> {
        self.outputs.get(service)
    }

    /// Every import and imported slice, as the node files them: the merge's own records,
    /// shared, in no particular order.
    pub fn node_inputs(&self) -> (Vec<ImportInput>, Vec<SliceInput>) {
        let imports = self.outputs.values().filter_map(|o| o.import.clone());
        let slices = self.outputs.values().flat_map(|o| o.slices.iter().cloned());
        (imports.collect(), slices.collect())
    }

    /// Every import of the importing cluster, in no particular order.
    pub fn imports(&self) -> impl Iterator<Item = &ImportRecord> {
        self.outputs.values().filter_map(|o| o.import())
    }

    /// The whole merge, every list sorted as [`MergeOutput`] documents.
    pub fn output(&self) -> MergeOutput {
        let mut services: Vec<(&NamespacedName, &ServiceOutput)> = self.outputs.iter().collect();
        services.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut out = MergeOutput {
            importing_cluster: Some(self.importing.clone()),
            ..Default::default()
        };
        for (_, o) in &services {
            out.service_imports.extend(o.import().cloned());
            out.endpoint_slices.extend(o.slices().cloned());
            out.export_statuses.extend(o.statuses.iter().cloned());
        }
        out.export_statuses
            .sort_by(|a, b| (&a.cluster, &a.service).cmp(&(&b.cluster, &b.service)));
        out.endpoint_slices.sort_unstable_by(|a, b| {
            (&a.service.namespace, &a.name).cmp(&(&b.service.namespace, &b.name))
        });
        out.diagnostics = self.diagnostics();
        out
    }

    /// What is wrong in the inputs: duplicates the last load found, local slices without a
    /// service label, the problems of the filed slices and the endpoints the address policy
    /// kept out; sorted.
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        let mut out = self.load_diagnostics.clone();
        for (cluster, filed) in &self.filed_slices {
            for s in filed.iter().filter(|s| s.service.is_none()) {
                out.push(Diagnostic {
                    cluster: Some(cluster.clone()),
                    object: format!("EndpointSlice {}", s.id),
                    message: format!("no {LABEL_K8S_SERVICE_NAME} label; ignored"),
                });
            }
        }
        for o in self.outputs.values() {
            out.extend(o.refused.iter().map(|r| Diagnostic {
                cluster: Some(r.cluster.clone()),
                object: format!("EndpointSlice {}", r.slice),
                message: format!("endpoint {} is {}; not imported", r.addr, r.why),
            }));
        }
        for members in self.services.values() {
            for (cluster, m) in members {
                for s in &m.slices {
                    out.extend(s.problems.iter().map(|message| Diagnostic {
                        cluster: Some(cluster.clone()),
                        object: format!("EndpointSlice {}", s.id),
                        message: message.clone(),
                    }));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// The IPs each of `imports` holds, one import per service (the smallest, when several).
fn sticky_ips(imports: &[ImportRecord]) -> HashMap<NamespacedName, Vec<IpAddr>> {
    let mut sorted: Vec<&ImportRecord> = imports.iter().collect();
    sorted.sort_by(|a, b| (&a.service, &a.ips).cmp(&(&b.service, &b.ips)));
    let mut out = HashMap::with_capacity(sorted.len());
    for i in sorted {
        out.entry(i.service.clone())
            .or_insert_with(|| i.ips.clone());
    }
    out
}

mod batch;
mod held;
mod names;

use names::SliceNames;
#[cfg(test)]
mod tests;
