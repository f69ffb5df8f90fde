//! The map operations the sync issues, and an in-memory implementation of the maps.
//!
//! Map sync talks to the maps only through [`MapWriter`], so the same writer drives the kernel
//! maps ([`super::kernel::KernelMaps`]) and [`MemMaps`], which tests use to check the datapath
//! invariants after every single write.

use std::collections::{BTreeMap, BTreeSet};

use dataplane_ebpf::{
    AffinityMatchKey, ClusterName, Counters, FRONTEND_F_INLINE, Frontend, FrontendKey4,
    FrontendKey6, FrontendName, Slot,
};

pub use dataplane_ebpf::defaults;

use super::sync::inline_backends;

/// The maps the agent writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapKind {
    Frontends4,
    Frontends6,
    Slots,
    AffinityMatch,
    Counters,
    FrontendNames,
    ClusterNames,
}

impl MapKind {
    /// Every map the agent writes, in the order metrics list them.
    pub const ALL: [MapKind; 7] = [
        MapKind::Frontends4,
        MapKind::Frontends6,
        MapKind::Slots,
        MapKind::AffinityMatch,
        MapKind::Counters,
        MapKind::FrontendNames,
        MapKind::ClusterNames,
    ];

    /// The map's name in the object and in bpffs.
    pub fn map_name(self) -> &'static str {
        use dataplane_ebpf::map_names::*;
        match self {
            MapKind::Frontends4 => FRONTENDS4,
            MapKind::Frontends6 => FRONTENDS6,
            MapKind::Slots => SLOTS,
            MapKind::AffinityMatch => AFFINITY_MATCH,
            MapKind::Counters => COUNTERS,
            MapKind::FrontendNames => FRONTEND_NAMES,
            MapKind::ClusterNames => CLUSTER_NAMES,
        }
    }
}

/// A key of either frontend map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FeKey {
    V4(FrontendKey4),
    V6(FrontendKey6),
}

impl FeKey {
    pub fn map(self) -> MapKind {
        match self {
            FeKey::V4(_) => MapKind::Frontends4,
            FeKey::V6(_) => MapKind::Frontends6,
        }
    }
}

/// One map write.
#[derive(Clone, Debug, PartialEq)]
pub enum MapOp {
    /// Boxed: a frontend entry is the largest value, and every op of a sync's plan is as large
    /// as the largest.
    PutFrontend(FeKey, Box<Frontend>),
    DelFrontend(FeKey),
    /// Writes `slots` into `MCS_SLOTS` from index `base` on.
    PutSlots(u32, Vec<Slot>),
    PutAffinityMatch(AffinityMatchKey),
    DelAffinityMatch(AffinityMatchKey),
    /// Zeroes the counters of a frontend id on every CPU (a new id starts from zero).
    ResetCounters(u32),
    PutName(u32, Box<FrontendName>),
    DelName(u32),
    PutCluster(u32, ClusterName),
    DelCluster(u32),
}

impl MapOp {
    pub fn map(&self) -> MapKind {
        match self {
            MapOp::PutFrontend(k, _) | MapOp::DelFrontend(k) => k.map(),
            MapOp::PutSlots(..) => MapKind::Slots,
            MapOp::PutAffinityMatch(_) | MapOp::DelAffinityMatch(_) => MapKind::AffinityMatch,
            MapOp::ResetCounters(_) => MapKind::Counters,
            MapOp::PutName(..) | MapOp::DelName(_) => MapKind::FrontendNames,
            MapOp::PutCluster(..) | MapOp::DelCluster(_) => MapKind::ClusterNames,
        }
    }

    pub fn is_delete(&self) -> bool {
        matches!(
            self,
            MapOp::DelFrontend(_)
                | MapOp::DelAffinityMatch(_)
                | MapOp::DelName(_)
                | MapOp::DelCluster(_)
        )
    }

    /// How many map entries the op writes (a batch of slots writes several).
    pub fn entries(&self) -> usize {
        match self {
            MapOp::PutSlots(_, slots) => slots.len(),
            _ => 1,
        }
    }
}

/// A map write the kernel (or the in-memory maps) refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("writing {map} failed: {message}", map = .map.map_name())]
pub struct MapWriteError {
    pub map: MapKind,
    /// errno, when the failure came from a syscall.
    pub errno: Option<i32>,
    pub message: String,
}

impl MapWriteError {
    /// Whether the map had no room (E2BIG from a full hash map, or ENOSPC/ENOMEM).
    pub fn is_full(&self) -> bool {
        matches!(self.errno, Some(libc::E2BIG | libc::ENOSPC | libc::ENOMEM))
    }
}

/// Applies map writes, and reads back what the writer needs. Deleting a key that is absent
/// succeeds: deletes are idempotent.
pub trait MapWriter {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError>;

    /// Applies `ops` in order and stops at the first failure, returning its index. The kernel
    /// maps put runs of updates of one map into one syscall (`BPF_MAP_UPDATE_BATCH`).
    fn apply_all(&mut self, ops: &[MapOp]) -> Result<(), (usize, MapWriteError)> {
        for (i, op) in ops.iter().enumerate() {
            self.apply(op).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// The slots `base..base + count`.
    fn read_slots(&self, base: u32, count: u16) -> Result<Vec<Slot>, MapWriteError>;

    /// Returns once no program run that started before the call is still running (an RCU
    /// grace period): slot ranges freed before the call may then be written again.
    fn quiesce(&mut self) -> Result<(), MapWriteError>;
}

/// Everything the agent-owned maps hold (counters summed over CPUs; slots that were never
/// written, `frontend_id == 0`, left out).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MapContents {
    pub frontends4: BTreeMap<FrontendKey4, Frontend>,
    pub frontends6: BTreeMap<FrontendKey6, Frontend>,
    pub slots: BTreeMap<u32, Slot>,
    pub affinity_match: BTreeSet<AffinityMatchKey>,
    /// Frontend ids with any non-zero counter.
    pub counters: BTreeMap<u32, Counters>,
    pub names: BTreeMap<u32, FrontendName>,
    pub clusters: BTreeMap<u32, ClusterName>,
}

impl MapContents {
    pub fn frontends(&self) -> impl Iterator<Item = (FeKey, &Frontend)> {
        self.frontends4
            .iter()
            .map(|(k, v)| (FeKey::V4(*k), v))
            .chain(self.frontends6.iter().map(|(k, v)| (FeKey::V6(*k), v)))
    }

    /// Entries in use: for the slots, those of the frontends' ranges.
    pub fn len(&self, map: MapKind) -> usize {
        match map {
            MapKind::Frontends4 => self.frontends4.len(),
            MapKind::Frontends6 => self.frontends6.len(),
            MapKind::Slots => self.frontends().map(|(_, f)| f.count as usize).sum(),
            MapKind::AffinityMatch => self.affinity_match.len(),
            MapKind::Counters => self.counters.len(),
            MapKind::FrontendNames => self.names.len(),
            MapKind::ClusterNames => self.clusters.len(),
        }
    }

    /// The backends of a frontend as a reader sees them: its range, `None` when a slot of the
    /// range does not carry the frontend's id (a reader would refuse, never misroute).
    pub fn range(&self, fe: &Frontend) -> Option<Vec<Slot>> {
        (0..fe.count as u32)
            .map(|i| {
                let slot = fe.base.checked_add(i).and_then(|i| self.slots.get(&i))?;
                (slot.frontend_id == fe.id).then_some(*slot)
            })
            .collect()
    }

    /// Checks what the datapath relies on (see the invariants in `dataplane_ebpf`): frontend ids
    /// are unique, every slot of every frontend's range carries the frontend's id, ranges do
    /// not overlap, and a frontend that carries copies of its backends carries those of its
    /// slots. Returns the first violation.
    pub fn check_datapath_invariants(&self) -> Result<(), String> {
        let mut ids = BTreeSet::new();
        let mut owner: BTreeMap<u32, u32> = BTreeMap::new();
        for (key, fe) in self.frontends() {
            if !ids.insert(fe.id) {
                return Err(format!("frontend id {} used twice ({key:?})", fe.id));
            }
            let Some(slots) = self.range(fe) else {
                return Err(format!(
                    "{key:?}: a slot of {}..+{} does not carry id {}",
                    fe.base, fe.count, fe.id
                ));
            };
            if fe.flags & FRONTEND_F_INLINE != 0 {
                // What the writer derives from these slots: every copy, tagged, the rest zero.
                let copies_are_the_slots = inline_backends(
                    matches!(key, FeKey::V4(_)),
                    fe.id,
                    slots.iter().map(|s| (s.addr, s.port)),
                )
                .is_some_and(|copies| *copies == fe.inline);
                if !copies_are_the_slots {
                    return Err(format!(
                        "{key:?}: the entry's copies {:?} are not its slots {slots:?}",
                        fe.inline
                    ));
                }
            }
            for i in 0..fe.count as u32 {
                if let Some(other) = owner.insert(fe.base + i, fe.id) {
                    return Err(format!(
                        "slot {} is in the ranges of frontends {other} and {}",
                        fe.base + i,
                        fe.id
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Capacities of the maps (`max_entries`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities {
    /// Entries per frontend map; frontend ids run `1..=frontends`.
    pub frontends: u32,
    pub slots: u32,
    /// Cluster ids run `1..=clusters` (at most `u16::MAX`).
    pub clusters: u32,
}

impl Default for Capacities {
    fn default() -> Self {
        Capacities {
            frontends: defaults::MAX_FRONTENDS,
            slots: defaults::MAX_SLOTS,
            clusters: defaults::MAX_CLUSTERS,
        }
    }
}

impl Capacities {
    pub fn of(&self, map: MapKind) -> u32 {
        match map {
            MapKind::Frontends4
            | MapKind::Frontends6
            | MapKind::Counters
            | MapKind::FrontendNames => self.frontends,
            MapKind::Slots | MapKind::AffinityMatch => self.slots,
            MapKind::ClusterNames => self.clusters,
        }
    }
}

/// In-memory maps with the kernel's capacity semantics (inserting a new key into a full hash
/// map fails with E2BIG; writing past the slot array fails with E2BIG too). Used by tests.
#[derive(Clone, Debug, Default)]
pub struct MemMaps {
    pub contents: MapContents,
    pub capacities: Capacities,
    /// Fails the n-th write from now (0 = the next one) with EIO, to test rollback.
    pub fail_write_in: Option<usize>,
    /// Fails every write of this frontend entry with EIO.
    pub refuse_frontend: Option<FeKey>,
    /// Fails this many deletes of this frontend entry with EBUSY (as a bucket lock held by a
    /// program on the same CPU does).
    pub fail_deletes: Option<(FeKey, usize)>,
    /// Successful writes so far.
    pub writes: usize,
    /// Calls of [`MapWriter::quiesce`] so far.
    pub grace_periods: usize,
}

impl MemMaps {
    pub fn new(capacities: Capacities) -> Self {
        MemMaps {
            capacities,
            ..Default::default()
        }
    }
}

fn put<K: Ord, V>(
    map: &mut BTreeMap<K, V>,
    cap: u32,
    k: K,
    v: V,
    err: impl FnOnce() -> MapWriteError,
) -> Result<(), MapWriteError> {
    if !map.contains_key(&k) && map.len() >= cap as usize {
        return Err(err());
    }
    map.insert(k, v);
    Ok(())
}

impl MapWriter for MemMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
        if let Some(n) = self.fail_write_in {
            if n == 0 {
                self.fail_write_in = None;
                return Err(MapWriteError {
                    map: op.map(),
                    errno: Some(libc::EIO),
                    message: "injected failure".into(),
                });
            }
            self.fail_write_in = Some(n - 1);
        }
        if let (MapOp::DelFrontend(k), Some((key, n))) = (op, &mut self.fail_deletes)
            && k == key
            && *n > 0
        {
            *n -= 1;
            return Err(MapWriteError {
                map: op.map(),
                errno: Some(libc::EBUSY),
                message: "injected delete failure".into(),
            });
        }
        if let MapOp::PutFrontend(k, _) = op
            && self.refuse_frontend == Some(*k)
        {
            return Err(MapWriteError {
                map: op.map(),
                errno: Some(libc::EIO),
                message: "refused entry".into(),
            });
        }
        let caps = self.capacities;
        let map = op.map();
        let full = || MapWriteError {
            map,
            errno: Some(libc::E2BIG),
            message: format!("map is full ({} entries)", caps.of(map)),
        };
        let c = &mut self.contents;
        match op {
            MapOp::PutFrontend(FeKey::V4(k), v) => {
                put(&mut c.frontends4, caps.frontends, *k, **v, full)?
            }
            MapOp::PutFrontend(FeKey::V6(k), v) => {
                put(&mut c.frontends6, caps.frontends, *k, **v, full)?
            }
            MapOp::DelFrontend(FeKey::V4(k)) => {
                c.frontends4.remove(k);
            }
            MapOp::DelFrontend(FeKey::V6(k)) => {
                c.frontends6.remove(k);
            }
            MapOp::PutSlots(base, slots) => {
                let end = u64::from(*base) + slots.len() as u64;
                if end > u64::from(caps.slots) {
                    return Err(full());
                }
                for (i, slot) in (*base..).zip(slots) {
                    c.slots.insert(i, *slot);
                }
            }
            MapOp::PutAffinityMatch(k) => {
                if !c.affinity_match.contains(k) && c.affinity_match.len() >= caps.slots as usize {
                    return Err(full());
                }
                c.affinity_match.insert(*k);
            }
            MapOp::DelAffinityMatch(k) => {
                c.affinity_match.remove(k);
            }
            MapOp::ResetCounters(k) => {
                if *k > caps.frontends {
                    return Err(full());
                }
                c.counters.remove(k);
            }
            MapOp::PutName(k, v) => put(&mut c.names, caps.frontends, *k, **v, full)?,
            MapOp::DelName(k) => {
                c.names.remove(k);
            }
            MapOp::PutCluster(k, v) => put(&mut c.clusters, caps.clusters, *k, *v, full)?,
            MapOp::DelCluster(k) => {
                c.clusters.remove(k);
            }
        }
        self.writes += 1;
        Ok(())
    }

    fn read_slots(&self, base: u32, count: u16) -> Result<Vec<Slot>, MapWriteError> {
        Ok((0..count as u32)
            .map(|i| {
                base.checked_add(i)
                    .and_then(|i| self.contents.slots.get(&i))
                    .copied()
                    .unwrap_or_default()
            })
            .collect())
    }

    fn quiesce(&mut self) -> Result<(), MapWriteError> {
        self.grace_periods += 1;
        Ok(())
    }
}
