//! Map sync: the one writer of the maps. It takes the desired entries one service at a time
//! ([`DesiredService`], from [`super::desired`]) and writes what differs from what the maps
//! hold, make-before-break.
//!
//! # The mirror
//!
//! The writer remembers one small record per frontend entry ([`Installed`]: its id, slot
//! range, flags, port name, owner and a 64-bit digest of its backends), the free slot space
//! and the cluster ids. It keeps no copy of the backends: whether a frontend changed is a
//! digest comparison, and the few changes that need the old backends (the affinity matches of
//! a frontend with session affinity) read them back from the slot array. That is a few bytes
//! per slot (the record of a frontend divided by its backends), whatever the number of
//! backends.
//!
//! # Write order (the datapath invariants are in `dataplane_ebpf`'s docs)
//!
//! For each changed frontend, in three phases:
//! 1. *puts*: new cluster names, the new backend set into a free slot range, a new id's
//!    counters and name, the affinity matches of added backends;
//! 2. *flips*: one frontend update that points at the new range (`base` and `count` together);
//! 3. *deletes*: removed frontends (a VIP's ports before its wildcard, so a VIP that goes away
//!    refuses until it is gone), the affinity matches of removed backends, names of freed ids,
//!    and cluster names no frontend uses any more.
//!
//! The old range goes to quarantine and is reused only after a grace period (see
//! [`super::ids::SlotSpace`]). Services are planned one by one and written in batches: all the
//! puts of a batch, then all its flips, then all its deletes, each phase in as few syscalls as
//! the kernel allows. Every put and flip has an undo: if one fails, what the batch wrote is
//! undone, the mirror is rolled back, and the batch is redone one service at a time, so one
//! service that cannot be written (a full map, a kernel error) is reported and left as it was
//! while the others are written. Before planning a service's writes, the writer checks that
//! they fit the free room of every map, so a full map normally refuses the change before the
//! first write.
//!
//! A VIP that moves between services in one sync is written over: the new owner's flip
//! replaces the old owner's entry in one update, and the old owner's delete of that key is
//! dropped, so the VIP never goes missing from the maps. A flush before the end of the sync (a
//! full batch, or a failed batch redone service by service) holds its frontend deletes back
//! until the sync's end, for a later change that takes the key over. (Unless the maps are
//! full: a new owner that only fits once the old owner's removal has made room is written
//! after it, and the VIP is absent in between; `SyncReport::retried` counts those services.)

use std::{collections::BTreeSet, sync::Arc};

use dataplane_core::{lb::LbTable, model::NamespacedName};
use dataplane_ebpf::{self as abi, FRONTEND_F_AFFINITY, FrontendName};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::{
    convert::name_bytes,
    desired::{self, DesiredFrontend, DesiredService, FeAddr},
    flush::Hold,
    ids::{Clusters, IdPool, SlotRange, SlotSpace},
    maps::{Capacities, FeKey, MapKind, MapOp, MapWriteError, MapWriter},
};

/// Slot entries a batch collects before it is written (other entries count one each).
const BATCH_ENTRIES: usize = 1 << 16;

/// Why a service's change was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    #[error(
        "{map} is full: service {service} needs {needed} new entries but only {free} of {capacity} are free; the service is left as it was",
        map = .map.map_name()
    )]
    MapFull {
        service: NamespacedName,
        map: MapKind,
        needed: u64,
        free: u64,
        capacity: u32,
    },
    #[error(
        "{map} has no run of {needed} free slots for service {service} (the longest is {longest}; {free} of {capacity} are free); the service is left as it was",
        map = dataplane_ebpf::map_names::SLOTS
    )]
    NoSlotRange {
        service: NamespacedName,
        needed: u32,
        longest: u32,
        free: u64,
        capacity: u32,
    },
    #[error(
        "service {service}: frontend {frontend} has {count} backends, more than the 65535 slots a frontend can hold; the service is left as it was"
    )]
    TooManyBackends {
        service: NamespacedName,
        frontend: String,
        count: usize,
    },
    #[error(
        "service {service}: {source}; its writes were undone and the service is left as it was"
    )]
    Write {
        service: NamespacedName,
        #[source]
        source: MapWriteError,
    },
}

impl SyncError {
    pub fn service(&self) -> &NamespacedName {
        match self {
            SyncError::MapFull { service, .. }
            | SyncError::NoSlotRange { service, .. }
            | SyncError::TooManyBackends { service, .. }
            | SyncError::Write { service, .. } => service,
        }
    }
}

/// What one sync did.
#[derive(Debug, Default)]
pub struct SyncReport {
    pub changed: Vec<NamespacedName>,
    pub failed: Vec<SyncError>,
    /// Deletes that failed twice. They leave unreachable entries behind, or a removed frontend
    /// that still serves its old backends (its id and slots stay taken); never a broken one.
    pub delete_errors: Vec<MapWriteError>,
    /// Services with a removed frontend still in the maps (its delete failed twice): the
    /// mirror keeps it as theirs, so the next sync of the service deletes it again.
    pub undeleted: Vec<NamespacedName>,
    /// Map entries written (and deleted).
    pub writes: usize,
    /// Services tried again once this sync's removals had made room in full maps. A VIP that
    /// one of them took over from a removed service was absent from the maps in between.
    pub retried: usize,
}

/// A sync under way: its report, the services that failed with what they wanted, and the
/// frontend deletes flushes held back (service, entry).
#[derive(Default)]
pub(super) struct Outcome {
    pub(super) report: SyncReport,
    pub(super) failed: Vec<(DesiredService, SyncError)>,
    pub(super) held: Vec<(NamespacedName, FeAddr)>,
}

/// Which services a sync brings up to date.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Every service: what the maps hold for a service the desired entries do not name is
    /// removed.
    All,
    /// Only these: each is brought to its desired entries, and removed when there are none.
    /// Others are neither compared nor touched.
    Services(&'a BTreeSet<NamespacedName>),
}

/// What the maps hold for one frontend entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Installed {
    pub id: u32,
    pub range: SlotRange,
    pub flags: u8,
    pub affinity_timeout_s: u32,
    /// [`DesiredFrontend::digest`] of the backends the entry's range holds.
    pub digest: u64,
    pub service: NamespacedName,
    pub port_name: Arc<str>,
    /// The cluster ids its slots name, sorted, unique: one reference each.
    pub clusters: Box<[u16]>,
    /// Set on adoption when a reader would refuse the entry (a slot without its id): the next
    /// sync rewrites it whatever it compares to.
    pub broken: bool,
    /// Set on adoption when the entry's range is whole but its value is not what the mirror
    /// would write (copies that are not its slots'): the next sync writes the value again,
    /// keeping the range.
    pub value_differs: bool,
    /// The copies of its slots that the entry carries ([`inline_backends`]), as the entry
    /// holds them; none when the programs read the slots. Boxed: most entries of a large
    /// table have none, and the mirror keeps one of these per entry.
    pub inline: Option<Box<[abi::InlineBackend; abi::INLINE_BACKENDS]>>,
}

/// The copies of a frontend's backends (slot address and port words, in slot order) that the
/// entry of frontend `id` carries: all of them for an IPv4 frontend of `1..=INLINE_BACKENDS`,
/// else none.
pub(super) fn inline_backends(
    v4: bool,
    id: u32,
    slots: impl ExactSizeIterator<Item = ([u32; 4], u16)>,
) -> Option<Box<[abi::InlineBackend; abi::INLINE_BACKENDS]>> {
    if !v4 || slots.len() == 0 || slots.len() > abi::INLINE_BACKENDS {
        return None;
    }
    let mut copies = Box::new([abi::InlineBackend::default(); abi::INLINE_BACKENDS]);
    for (copy, (addr, port)) in copies.iter_mut().zip(slots) {
        *copy = abi::InlineBackend {
            addr: addr[0],
            port,
            frontend_tag: abi::frontend_tag(id),
        };
    }
    Some(copies)
}

impl Installed {
    pub fn abi(&self) -> abi::Frontend {
        abi::Frontend {
            id: self.id,
            base: self.range.base,
            count: self.range.len as u16,
            flags: match self.inline {
                Some(_) => self.flags | abi::FRONTEND_F_INLINE,
                None => self.flags,
            },
            _pad: 0,
            affinity_timeout_s: self.affinity_timeout_s,
            inline: self.inline.as_deref().copied().unwrap_or_default(),
        }
    }

    pub fn affinity(&self) -> bool {
        self.flags & FRONTEND_F_AFFINITY != 0
    }

    pub fn name(&self) -> Box<FrontendName> {
        Box::new(FrontendName {
            namespace: name_bytes(&self.service.namespace),
            name: name_bytes(&self.service.name),
            port_name: name_bytes(&self.port_name),
        })
    }

    /// Whether the entry is exactly `d` of `service` (`digest` is `d`'s).
    pub fn same_as(&self, service: &NamespacedName, d: &DesiredFrontend, digest: u64) -> bool {
        !self.broken
            && !self.value_differs
            && self.digest == digest
            && self.flags == d.flags
            && self.affinity_timeout_s == d.affinity_timeout_s
            && self.service == *service
            && *self.port_name == *d.port_name
    }
}

/// The writes of one service and how to take them back.
#[derive(Debug, Default)]
pub(super) struct Change {
    pub(super) desired: Option<DesiredService>,
    pub(super) service: NamespacedName,
    /// (write, undo); phase 1.
    pub(super) puts: Vec<(MapOp, Option<MapOp>)>,
    /// (frontend update, undo); phase 2.
    pub(super) flips: Vec<(MapOp, MapOp)>,
    /// Phase 3.
    pub(super) deletes: Vec<MapOp>,
    /// Mirror entries as they were before the change, in the order they were changed.
    pub(super) was: Vec<(FeAddr, Option<Installed>)>,
    pub(super) was_owned: Vec<(NamespacedName, Option<Vec<FeAddr>>)>,
    pub(super) new_ids: Vec<u32>,
    pub(super) new_ranges: Vec<SlotRange>,
    pub(super) new_clusters: Vec<u16>,
    /// (cluster, +1 or -1) as applied to the counts.
    pub(super) cluster_refs: Vec<(u16, i8)>,
    /// (family map, +1 or -1) as applied to the entry counts: removals count at the end.
    pub(super) fe_added: Vec<MapKind>,
    pub(super) affinity_added: u64,
    /// Given back once the change is written: ids after the deletes, ranges to quarantine.
    pub(super) freed_ids: Vec<u32>,
    pub(super) freed_ranges: Vec<SlotRange>,
    pub(super) fe_removed: Vec<MapKind>,
    pub(super) affinity_removed: u64,
}

impl Change {
    pub fn keys_written(&self) -> impl Iterator<Item = FeKey> + '_ {
        self.flips.iter().filter_map(|(op, _)| match op {
            MapOp::PutFrontend(k, _) => Some(*k),
            _ => None,
        })
    }

    fn entries(&self) -> usize {
        self.puts.iter().map(|(op, _)| op.entries()).sum::<usize>()
            + self.flips.len()
            + self.deletes.len()
    }
}

/// The mirror's frontend entries by map key.
pub(super) type FrontendTable = indexmap::IndexMap<FeAddr, Installed, foldhash::fast::RandomState>;

/// The one writer of the maps, with its mirror of what they hold.
#[derive(Clone, Debug)]
pub struct MapSync {
    pub(super) caps: Capacities,
    /// Every frontend entry. An index map: its hash buckets hold indices, not the ~120-byte
    /// entries, so the half-empty buckets of a table just past a power of two cost little.
    pub(super) frontends: FrontendTable,
    /// The entries each service owns, sorted.
    pub(super) by_service: HashMap<NamespacedName, Vec<FeAddr>>,
    pub(super) fe_ids: IdPool,
    pub(super) slots: SlotSpace,
    pub(super) clusters: Clusters,
    pub(super) used_fe4: u64,
    pub(super) used_fe6: u64,
    pub(super) used_affinity: u64,
}

/// What the mirror holds, for memory accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MirrorSize {
    pub frontends: usize,
    pub services: usize,
    pub slots: u64,
    pub free_runs: usize,
    pub clusters: usize,
}

impl MapSync {
    /// The bytes of one frontend entry in the mirror's table, key and record (their heap parts,
    /// the port name and the cluster ids, come on top): the unit of the mirror's memory, which
    /// keeps nothing per slot.
    pub const ENTRY_BYTES: usize = std::mem::size_of::<(FeAddr, Installed)>();

    /// A mirror of empty maps.
    pub fn new(caps: Capacities) -> Self {
        MapSync {
            caps,
            frontends: FrontendTable::default(),
            by_service: HashMap::new(),
            fe_ids: IdPool::new(caps.frontends),
            slots: SlotSpace::new(caps.slots),
            clusters: Clusters::new(caps.clusters),
            used_fe4: 0,
            used_fe6: 0,
            used_affinity: 0,
        }
    }

    pub fn capacities(&self) -> Capacities {
        self.caps
    }

    /// Files `installed` as the entry of `addr`. The table's entries grow by doubling, exactly:
    /// left to itself, the index map grows them to its hash table's capacity, up to 1.9 times
    /// the entries, which at 30,000 frontends is 3.5 MB of room nobody uses.
    pub(super) fn install(&mut self, addr: FeAddr, installed: Installed) {
        let table = &mut self.frontends;
        if table.len() == table.capacity() && !table.contains_key(&addr) {
            table.reserve_exact(table.len().max(64));
        }
        table.insert(addr, installed);
    }

    /// Number of frontend entries (ports and wildcards) the mirror holds.
    pub fn frontend_count(&self) -> usize {
        self.frontends.len()
    }

    /// Slots the frontends use.
    pub fn slot_count(&self) -> u64 {
        self.frontends
            .values()
            .map(|f| u64::from(f.range.len))
            .sum()
    }

    /// The services the maps currently hold.
    pub fn services(&self) -> impl Iterator<Item = &NamespacedName> {
        self.by_service.keys()
    }

    pub fn size(&self) -> MirrorSize {
        MirrorSize {
            frontends: self.frontends.len(),
            services: self.by_service.len(),
            slots: self.slot_count(),
            free_runs: self.slots.runs(),
            clusters: self.clusters.len(),
        }
    }

    /// [`MapSync::sync`] of every service of an lb table.
    pub fn sync_table(&mut self, table: &LbTable, maps: &mut impl MapWriter) -> SyncReport {
        self.sync(Scope::All, desired::services(table, None), maps)
    }

    /// [`MapSync::sync`] of `services` as an lb table has them (removed when it has none).
    pub fn sync_table_services(
        &mut self,
        table: &LbTable,
        services: &BTreeSet<NamespacedName>,
        maps: &mut impl MapWriter,
    ) -> SyncReport {
        self.sync(
            Scope::Services(services),
            desired::services(table, Some(services)),
            maps,
        )
    }

    /// Brings the services of `scope` to `desired` (one [`DesiredService`] per service, in any
    /// order, each at most once; services outside the scope are skipped). Services are
    /// independent: one that cannot be written is reported in [`SyncReport::failed`] and left
    /// as it was, except that a VIP of it the maps do not know yet gets its wildcard entry, so
    /// the VIP is refused rather than passed through unrouted; the others are written. A
    /// service refused for lack of room is tried again after the removals of this sync, which
    /// may have made room.
    pub fn sync(
        &mut self,
        scope: Scope<'_>,
        desired: impl IntoIterator<Item = DesiredService>,
        maps: &mut impl MapWriter,
    ) -> SyncReport {
        let mut out = Outcome::default();
        let mut seen: HashSet<NamespacedName> = HashSet::new();
        let mut batch: Vec<Change> = Vec::new();
        let mut retry = Vec::new();
        for d in desired {
            if let Scope::Services(only) = scope
                && !only.contains(&d.service)
            {
                continue;
            }
            if !seen.insert(d.service.clone()) || self.unchanged(&d) {
                continue;
            }
            self.stage(d, &mut batch, &mut retry, maps, &mut out);
        }
        let removed: Vec<NamespacedName> = match scope {
            Scope::All => self
                .by_service
                .keys()
                .filter(|s| !seen.contains(*s))
                .cloned()
                .collect(),
            Scope::Services(only) => only
                .iter()
                .filter(|s| !seen.contains(*s) && self.by_service.contains_key(*s))
                .cloned()
                .collect(),
        };
        for service in removed {
            let gone = DesiredService {
                service,
                frontends: Vec::new(),
            };
            self.stage(gone, &mut batch, &mut retry, maps, &mut out);
        }
        self.flush(std::mem::take(&mut batch), maps, &mut out, Hold::Nothing);
        self.drop_held(maps, &mut out);
        // Room may have been made by the removals: one more try, then report.
        for (d, _) in retry {
            out.report.retried += 1;
            let mut full = Vec::new();
            self.stage(d, &mut batch, &mut full, maps, &mut out);
            out.failed.extend(full);
        }
        self.flush(batch, maps, &mut out, Hold::Nothing);
        self.drop_held(maps, &mut out);
        let Outcome {
            mut report, failed, ..
        } = out;
        for (d, e) in failed {
            report.failed.push(e);
            self.refuse(&d, maps, &mut report);
        }
        report
    }

    /// Gives the VIPs of a service that could not be written, and that the maps do not know
    /// yet, their wildcard entry: the VIP refuses instead of passing through unrouted. When
    /// even that cannot be written, the VIP stays unknown to the maps.
    fn refuse(&mut self, d: &DesiredService, maps: &mut impl MapWriter, report: &mut SyncReport) {
        let change = match self.plan_refusal(d, maps) {
            Ok(Some(mut change)) => {
                change.desired = Some(DesiredService {
                    service: d.service.clone(),
                    frontends: Vec::new(),
                });
                change
            }
            Ok(None) | Err(_) => return,
        };
        let mut out = Outcome::default();
        self.flush(vec![change], maps, &mut out, Hold::Nothing);
        report.writes += out.report.writes;
        report.delete_errors.extend(out.report.delete_errors);
        report.undeleted.extend(out.report.undeleted);
    }

    /// Plans one service into the batch (flushing first when it would conflict with it).
    fn stage(
        &mut self,
        d: DesiredService,
        batch: &mut Vec<Change>,
        retry: &mut Vec<(DesiredService, SyncError)>,
        maps: &mut impl MapWriter,
        out: &mut Outcome,
    ) {
        match self.plan(&d, maps) {
            Ok(None) => {}
            Ok(Some(mut change)) => {
                // A frontend this change writes that an earlier change of the batch deletes (a
                // VIP moving between services): the write replaces the old owner's entry in one
                // update, so that delete is dropped. Deleting first would leave the key absent,
                // and connects to it unrouted, until the write.
                let written: HashSet<FeKey> = change.keys_written().collect();
                for earlier in batch.iter_mut() {
                    earlier
                        .deletes
                        .retain(|op| !matches!(op, MapOp::DelFrontend(k) if written.contains(k)));
                }
                // Until the write, the maps hold the old owner's entry: its undo puts that back.
                for (op, undo) in &mut change.flips {
                    let MapOp::PutFrontend(k, _) = op else {
                        continue;
                    };
                    if !matches!(undo, MapOp::DelFrontend(_)) {
                        continue;
                    }
                    if let Some((_, old)) = batch.iter().rev().find_map(|c| c.removed(*k)) {
                        *undo = MapOp::PutFrontend(*k, Box::new(old.abi()));
                    }
                }
                change.desired = Some(d);
                batch.push(change);
                if batch.iter().map(Change::entries).sum::<usize>() >= BATCH_ENTRIES {
                    // A later batch may take over what this one removes.
                    self.flush(std::mem::take(batch), maps, out, Hold::All);
                }
            }
            Err(e @ (SyncError::MapFull { .. } | SyncError::NoSlotRange { .. })) => {
                retry.push((d, e))
            }
            Err(e) => out.failed.push((d, e)),
        }
    }

    /// Whether the maps already hold exactly what `d` wants (no allocation).
    fn unchanged(&self, d: &DesiredService) -> bool {
        let Some(owned) = self.by_service.get(&d.service) else {
            return d.frontends.is_empty();
        };
        owned.len() == d.frontends.len()
            && d.frontends.iter().zip(owned).all(|((addr, fe), o)| {
                addr == o
                    && self
                        .frontends
                        .get(addr)
                        .is_some_and(|i| i.same_as(&d.service, fe, fe.digest()))
            })
    }
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "sync_fault_tests.rs"]
mod fault_tests;
