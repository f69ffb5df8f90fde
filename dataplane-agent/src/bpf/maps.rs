//! The map operations the sync issues, and an in-memory implementation of the maps.
//!
//! Map sync talks to the maps only through [`MapWriter`], so the same planner drives the kernel
//! maps ([`super::kernel::KernelMaps`]) and [`MemMaps`], which tests use to check the datapath
//! invariants after every single write.

use std::collections::{BTreeMap, BTreeSet};

use dataplane_ebpf::{
    AffinityMatchKey, Backend, ClusterName, Counters, Frontend, FrontendKey4, FrontendKey6,
    FrontendName, SlotKey,
};

pub use dataplane_ebpf::defaults;

/// The maps the agent writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapKind {
    Frontends4,
    Frontends6,
    Slots,
    Backends,
    AffinityMatch,
    Counters,
    FrontendNames,
    ClusterNames,
}

impl MapKind {
    /// The map's name in the object and in bpffs.
    pub fn map_name(self) -> &'static str {
        use dataplane_ebpf::map_names::*;
        match self {
            MapKind::Frontends4 => FRONTENDS4,
            MapKind::Frontends6 => FRONTENDS6,
            MapKind::Slots => SLOTS,
            MapKind::Backends => BACKENDS,
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
    PutFrontend(FeKey, Frontend),
    DelFrontend(FeKey),
    PutSlot(SlotKey, u32),
    DelSlot(SlotKey),
    PutBackend(u32, Backend),
    DelBackend(u32),
    PutAffinityMatch(AffinityMatchKey),
    DelAffinityMatch(AffinityMatchKey),
    /// Creates (or zeroes) the per-CPU counters of a frontend id.
    ResetCounters(u32),
    DelCounters(u32),
    PutName(u32, FrontendName),
    DelName(u32),
    PutCluster(u32, ClusterName),
    DelCluster(u32),
}

impl MapOp {
    pub fn map(&self) -> MapKind {
        match self {
            MapOp::PutFrontend(k, _) | MapOp::DelFrontend(k) => k.map(),
            MapOp::PutSlot(..) | MapOp::DelSlot(_) => MapKind::Slots,
            MapOp::PutBackend(..) | MapOp::DelBackend(_) => MapKind::Backends,
            MapOp::PutAffinityMatch(_) | MapOp::DelAffinityMatch(_) => MapKind::AffinityMatch,
            MapOp::ResetCounters(_) | MapOp::DelCounters(_) => MapKind::Counters,
            MapOp::PutName(..) | MapOp::DelName(_) => MapKind::FrontendNames,
            MapOp::PutCluster(..) | MapOp::DelCluster(_) => MapKind::ClusterNames,
        }
    }

    pub fn is_delete(&self) -> bool {
        matches!(
            self,
            MapOp::DelFrontend(_)
                | MapOp::DelSlot(_)
                | MapOp::DelBackend(_)
                | MapOp::DelAffinityMatch(_)
                | MapOp::DelCounters(_)
                | MapOp::DelName(_)
                | MapOp::DelCluster(_)
        )
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

/// Applies map writes. Deleting a key that is absent succeeds: deletes are idempotent.
pub trait MapWriter {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError>;
}

/// Everything the agent-owned maps hold (counters summed over CPUs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MapContents {
    pub frontends4: BTreeMap<FrontendKey4, Frontend>,
    pub frontends6: BTreeMap<FrontendKey6, Frontend>,
    pub slots: BTreeMap<SlotKey, u32>,
    pub backends: BTreeMap<u32, Backend>,
    pub affinity_match: BTreeSet<AffinityMatchKey>,
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

    pub fn len(&self, map: MapKind) -> usize {
        match map {
            MapKind::Frontends4 => self.frontends4.len(),
            MapKind::Frontends6 => self.frontends6.len(),
            MapKind::Slots => self.slots.len(),
            MapKind::Backends => self.backends.len(),
            MapKind::AffinityMatch => self.affinity_match.len(),
            MapKind::Counters => self.counters.len(),
            MapKind::FrontendNames => self.names.len(),
            MapKind::ClusterNames => self.clusters.len(),
        }
    }

    /// Checks what the datapath relies on (see the invariants in `dataplane_ebpf`): every
    /// active slot of every frontend exists and names a backend that exists, and every
    /// affinity-match entry names an existing backend. Returns the first violation.
    pub fn check_datapath_invariants(&self) -> Result<(), String> {
        let mut ids = BTreeSet::new();
        for (key, fe) in self.frontends() {
            if !ids.insert(fe.id) {
                return Err(format!("frontend id {} used twice ({key:?})", fe.id));
            }
            for index in 0..fe.count {
                let slot = SlotKey {
                    frontend_id: fe.id,
                    bank: fe.bank as u16,
                    index,
                };
                let Some(backend) = self.slots.get(&slot) else {
                    return Err(format!("{key:?}: active slot {slot:?} is missing"));
                };
                if !self.backends.contains_key(backend) {
                    return Err(format!(
                        "{key:?}: slot {slot:?} names missing backend {backend}"
                    ));
                }
            }
        }
        for m in &self.affinity_match {
            if !self.backends.contains_key(&m.backend_id) {
                return Err(format!("affinity match {m:?} names a missing backend"));
            }
        }
        Ok(())
    }
}

/// Capacities of the maps (`max_entries`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities {
    pub frontends: u32,
    pub backends: u32,
    pub slots: u32,
    pub clusters: u32,
}

impl Default for Capacities {
    fn default() -> Self {
        Capacities {
            frontends: defaults::MAX_FRONTENDS,
            backends: defaults::MAX_BACKENDS,
            slots: defaults::MAX_SLOTS,
            clusters: CLUSTER_NAMES_MAX,
        }
    }
}

/// `max_entries` of the cluster-name map (fixed in the object).
pub const CLUSTER_NAMES_MAX: u32 = 1024;

impl Capacities {
    pub fn of(&self, map: MapKind) -> u32 {
        match map {
            MapKind::Frontends4
            | MapKind::Frontends6
            | MapKind::Counters
            | MapKind::FrontendNames => self.frontends,
            MapKind::Backends => self.backends,
            MapKind::Slots | MapKind::AffinityMatch => self.slots,
            MapKind::ClusterNames => self.clusters,
        }
    }
}

/// In-memory maps with the kernel's capacity semantics (inserting a new key into a full map
/// fails with E2BIG). Used by tests and by `plan`-style dry runs.
#[derive(Clone, Debug, Default)]
pub struct MemMaps {
    pub contents: MapContents,
    pub capacities: Capacities,
    /// Fails the n-th write from now (0 = the next one) with EIO, to test rollback.
    pub fail_write_in: Option<usize>,
    /// Called after every successful write; tests use it to check invariants at each step.
    pub writes: usize,
}

impl MemMaps {
    pub fn new(capacities: Capacities) -> Self {
        MemMaps {
            capacities,
            ..Default::default()
        }
    }

    fn full(&self, map: MapKind) -> MapWriteError {
        MapWriteError {
            map,
            errno: Some(libc::E2BIG),
            message: format!("map is full ({} entries)", self.capacities.of(map)),
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
                put(&mut c.frontends4, caps.frontends, *k, *v, full)?
            }
            MapOp::PutFrontend(FeKey::V6(k), v) => {
                put(&mut c.frontends6, caps.frontends, *k, *v, full)?
            }
            MapOp::DelFrontend(FeKey::V4(k)) => {
                c.frontends4.remove(k);
            }
            MapOp::DelFrontend(FeKey::V6(k)) => {
                c.frontends6.remove(k);
            }
            MapOp::PutSlot(k, v) => put(&mut c.slots, caps.slots, *k, *v, full)?,
            MapOp::DelSlot(k) => {
                c.slots.remove(k);
            }
            MapOp::PutBackend(k, v) => put(&mut c.backends, caps.backends, *k, *v, full)?,
            MapOp::DelBackend(k) => {
                c.backends.remove(k);
            }
            MapOp::PutAffinityMatch(k) => {
                if !c.affinity_match.contains(k) && c.affinity_match.len() >= caps.slots as usize {
                    return Err(self.full(map));
                }
                c.affinity_match.insert(*k);
            }
            MapOp::DelAffinityMatch(k) => {
                c.affinity_match.remove(k);
            }
            MapOp::ResetCounters(k) => put(
                &mut c.counters,
                caps.frontends,
                *k,
                Counters::default(),
                full,
            )?,
            MapOp::DelCounters(k) => {
                c.counters.remove(k);
            }
            MapOp::PutName(k, v) => put(&mut c.names, caps.frontends, *k, *v, full)?,
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
}
