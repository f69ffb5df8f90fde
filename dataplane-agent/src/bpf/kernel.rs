//! The kernel maps behind [`MapWriter`]: typed aya handles on the pinned maps, with batched
//! writes ([`super::sys`]) for runs of updates of one map.

use std::{collections::BTreeMap, os::fd::AsFd as _, path::Path};

use aya::maps::{Array, HashMap, IterableMap as _, Map, MapData, MapError};
use dataplane_ebpf::{
    AffinityMatchKey, ClusterName, Counters, Frontend, FrontendKey4, FrontendKey6, FrontendName,
    Slot, map_names,
};

use super::{
    counters::{CounterRows, possible_cpus},
    maps::{Capacities, FeKey, MapContents, MapKind, MapOp, MapWriteError, MapWriter},
    sys::{self as batch, Elems, bytes_of},
};

/// Entries one batch syscall carries at most.
const BATCH_MAX: usize = 8192;

/// Errors opening or reading the pinned maps.
#[derive(Debug, thiserror::Error)]
pub enum KernelMapError {
    #[error("cannot open pinned map {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: MapError,
    },
    #[error("pinned map {name} has an unexpected type or layout: {source}")]
    Layout {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("reading map {name}: {source}")]
    Read {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("reading map {name}: {source}")]
    ReadSlots {
        name: &'static str,
        #[source]
        source: MapWriteError,
    },
    #[error("cannot count CPUs: {0}")]
    Cpus(String),
    #[error(
        "pinned map MCS_COUNTERS: {0}; remove the old pins with `dataplane-agent uninstall --pin-dir DIR`"
    )]
    CounterLayout(String),
}

/// Entries `start..start + count` of an array map of `T`, in batch lookups; entries past the
/// end of the array are left at their default.
pub(super) fn read_array<T: aya::Pod + Default>(
    fd: std::os::fd::BorrowedFd<'_>,
    start: u32,
    count: usize,
) -> std::io::Result<Vec<T>> {
    let mut out = vec![T::default(); count];
    let mut filled = 0usize;
    while filled < out.len() {
        let want = (out.len() - filled).min(BATCH_MAX);
        let from = start
            .checked_add(filled as u32)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let dst = &mut out[filled..filled + want];
        // SAFETY: `T` is plain data (`aya::Pod`): any bytes the kernel writes into the buffer
        // make a valid `T`, and the buffer covers exactly `dst`.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                dst.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(dst),
            )
        };
        let n = batch::lookup_array(&fd, from, bytes, size_of::<T>(), want as u32)?;
        if n == 0 {
            break; // past the end of the array
        }
        filled += n as usize;
    }
    Ok(out)
}

/// Handles on every agent-owned map.
pub struct KernelMaps {
    fe4: HashMap<MapData, FrontendKey4, Frontend>,
    fe6: HashMap<MapData, FrontendKey6, Frontend>,
    slots: Array<MapData, Slot>,
    affinity_match: HashMap<MapData, AffinityMatchKey, u32>,
    counters: CounterRows,
    names: HashMap<MapData, u32, FrontendName>,
    clusters: HashMap<MapData, u32, ClusterName>,
    capacities: Capacities,
    /// Kernel ids of the maps, by name, for `inspect` and restart checks.
    pub ids: Vec<(&'static str, u32)>,
    /// The pin directory's lock, held by the agent that writes the maps.
    lock: Option<std::os::fd::OwnedFd>,
}

fn open_data(dir: &Path, name: &'static str) -> Result<MapData, KernelMapError> {
    let path = dir.join(name);
    MapData::from_pin(&path).map_err(|source| KernelMapError::Open {
        path: path.display().to_string(),
        source,
    })
}

fn open(dir: &Path, name: &'static str) -> Result<Map, KernelMapError> {
    Map::from_map_data(open_data(dir, name)?)
        .map_err(|source| KernelMapError::Layout { name, source })
}

fn typed<T: TryFrom<Map, Error = MapError>>(
    map: Map,
    name: &'static str,
) -> Result<T, KernelMapError> {
    T::try_from(map).map_err(|source| KernelMapError::Layout { name, source })
}

fn map_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::HashMap(d)
        | Map::PerCpuHashMap(d)
        | Map::LruHashMap(d)
        | Map::Array(d)
        | Map::PerCpuArray(d)
        | Map::SkStorage(d) => Some(d),
        _ => None,
    }
}

fn max_entries(map: &Map) -> u32 {
    map_data(map)
        .and_then(|d| d.info().ok())
        .map_or(0, |i| i.max_entries())
}

fn map_id(map: &Map) -> u32 {
    map_data(map)
        .and_then(|d| d.info().ok())
        .map_or(0, |i| i.id())
}

fn syscall_error(map: MapKind, call: &str, e: std::io::Error) -> MapWriteError {
    let errno = e.raw_os_error();
    let detail = format!("{call} failed: {e}");
    MapWriteError {
        map,
        errno,
        message: match errno {
            Some(libc::E2BIG) => format!("map is full ({detail})"),
            _ => detail,
        },
    }
}

/// A failed `BPF_MAP_LOOKUP_BATCH` of the map `name`, as a read error.
fn batch_read_error(name: &'static str) -> impl FnOnce(std::io::Error) -> KernelMapError {
    move |io_error| KernelMapError::Read {
        name,
        source: MapError::SyscallError(aya::sys::SyscallError {
            call: "BPF_MAP_LOOKUP_BATCH",
            io_error,
        }),
    }
}

fn write_error(map: MapKind, e: MapError) -> MapWriteError {
    match e {
        MapError::SyscallError(s) => syscall_error(map, s.call, s.io_error),
        other => MapWriteError {
            map,
            errno: None,
            message: other.to_string(),
        },
    }
}

/// A delete of an absent key is a success: deletes are idempotent.
fn absent_ok(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(MapError::KeyNotFound | MapError::ElementNotFound) => Ok(()),
        other => other,
    }
}

/// Every entry of a hash map (entries that vanish while iterating are skipped).
fn collect<K: aya::Pod + Ord, V: aya::Pod>(
    map: &HashMap<MapData, K, V>,
    name: &'static str,
) -> Result<BTreeMap<K, V>, KernelMapError> {
    let mut out = BTreeMap::new();
    for kv in map.iter() {
        match kv {
            Ok((k, v)) => {
                out.insert(k, v);
            }
            Err(MapError::KeyNotFound) => continue,
            Err(source) => return Err(KernelMapError::Read { name, source }),
        }
    }
    Ok(out)
}

/// What [`KernelMaps::read_for_metrics`] reads.
#[derive(Debug)]
pub struct MetricsRead<L> {
    /// The frontends, their counters (only when labels were asked for) and the cluster names
    /// (no slots, names or affinity matches).
    pub contents: MapContents,
    /// Each named frontend's label, by frontend id.
    pub labels: BTreeMap<u32, L>,
    /// Entries of the frontend-name map.
    pub names: usize,
    /// Entries of the affinity-match map.
    pub affinity_matches: usize,
}

impl KernelMaps {
    /// Opens the maps pinned in `maps_dir` (`<pin dir>/maps`).
    pub fn open_pinned(maps_dir: &Path) -> Result<Self, KernelMapError> {
        let mut ids = Vec::new();
        for name in map_names::ALL {
            if let Ok(map) = open(maps_dir, name) {
                ids.push((name, map_id(&map)));
            }
        }
        let fe4 = open(maps_dir, map_names::FRONTENDS4)?;
        let slots = open(maps_dir, map_names::SLOTS)?;
        let clusters = open(maps_dir, map_names::CLUSTER_NAMES)?;
        let capacities = Capacities {
            frontends: max_entries(&fe4),
            slots: max_entries(&slots),
            clusters: max_entries(&clusters),
        };
        Ok(KernelMaps {
            fe4: typed(fe4, map_names::FRONTENDS4)?,
            fe6: typed(
                open(maps_dir, map_names::FRONTENDS6)?,
                map_names::FRONTENDS6,
            )?,
            slots: typed(slots, map_names::SLOTS)?,
            affinity_match: typed(
                open(maps_dir, map_names::AFFINITY_MATCH)?,
                map_names::AFFINITY_MATCH,
            )?,
            counters: CounterRows::new(
                open_data(maps_dir, map_names::COUNTERS)?,
                possible_cpus()?,
            )?,
            names: typed(
                open(maps_dir, map_names::FRONTEND_NAMES)?,
                map_names::FRONTEND_NAMES,
            )?,
            clusters: typed(clusters, map_names::CLUSTER_NAMES)?,
            capacities,
            ids,
            lock: None,
        })
    }

    /// Keeps the pin directory's lock for as long as these maps are written.
    pub fn hold_lock(&mut self, lock: std::os::fd::OwnedFd) {
        self.lock = Some(lock);
    }

    /// The maps' `max_entries`, as created (an adopted map keeps the size it was created with).
    pub fn capacities(&self) -> Capacities {
        self.capacities
    }

    /// Looks up one frontend entry (one syscall): cheap enough to poll, unlike [`Self::read_all`].
    pub fn frontend(&self, key: &FeKey) -> Result<Option<Frontend>, KernelMapError> {
        let found = match key {
            FeKey::V4(k) => self.fe4.get(k, 0),
            FeKey::V6(k) => self.fe6.get(k, 0),
        };
        match found {
            Ok(v) => Ok(Some(v)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(KernelMapError::Read {
                name: match key {
                    FeKey::V4(_) => map_names::FRONTENDS4,
                    FeKey::V6(_) => map_names::FRONTENDS6,
                },
                source,
            }),
        }
    }

    /// Reads every map but the slot array and the counters (what adoption needs; the slots
    /// are read per frontend). Entries that vanish while iterating are skipped.
    pub fn read_entries(&self) -> Result<MapContents, KernelMapError> {
        let mut contents = self.read_frontends()?;
        contents.names = collect(&self.names, map_names::FRONTEND_NAMES)?;
        contents.affinity_match = collect(&self.affinity_match, map_names::AFFINITY_MATCH)?
            .into_keys()
            .collect();
        Ok(contents)
    }

    /// The frontends, their names and the cluster names.
    fn read_frontends(&self) -> Result<MapContents, KernelMapError> {
        Ok(MapContents {
            frontends4: collect(&self.fe4, map_names::FRONTENDS4)?,
            frontends6: collect(&self.fe6, map_names::FRONTENDS6)?,
            clusters: collect(&self.clusters, map_names::CLUSTER_NAMES)?,
            ..MapContents::default()
        })
    }

    /// Reads every map: the entries, each frontend's slots and counters (summed over CPUs).
    pub fn read_all(&self) -> Result<MapContents, KernelMapError> {
        let mut contents = self.read_entries()?;
        let fes: Vec<Frontend> = contents.frontends().map(|(_, f)| *f).collect();
        for fe in fes {
            let slots =
                self.read_slots(fe.base, fe.count)
                    .map_err(|source| KernelMapError::ReadSlots {
                        name: map_names::SLOTS,
                        source,
                    })?;
            for (i, slot) in (fe.base..).zip(slots) {
                if slot.frontend_id != 0 {
                    contents.slots.insert(i, slot);
                }
            }
        }
        self.read_counters(&mut contents)?;
        Ok(contents)
    }

    /// What the metrics encode: the frontends, and how many entries the name and
    /// affinity-match maps hold; with a `label`, also each frontend's name as `label` makes it
    /// of its `MCS_FE_NAMES` entry (by frontend id) and its counters (without, the names are
    /// only counted and the counters not read). No slot, affinity match or whole name is
    /// kept: at 10,000 services the slots alone are a million entries, the names 30,000 of
    /// ~380 bytes, and the metrics are read every few seconds. The names are read right after
    /// the frontends (an id freed and reused in between would label the old entry with the
    /// new name until the next reading).
    pub fn read_for_metrics<L>(
        &self,
        label: Option<impl FnMut(&FrontendName) -> L>,
    ) -> Result<MetricsRead<L>, KernelMapError> {
        let mut contents = self.read_frontends()?;
        let Some(mut label) = label else {
            // By id, as below: a walk that meets a deletion starts over.
            let mut ids = Vec::new();
            for key in self.names.keys() {
                ids.push(key.map_err(|source| KernelMapError::Read {
                    name: map_names::FRONTEND_NAMES,
                    source,
                })?);
            }
            ids.sort_unstable();
            ids.dedup();
            let names = ids.len();
            return Ok(MetricsRead {
                contents,
                labels: BTreeMap::new(),
                names,
                affinity_matches: self.count_affinity_matches()?,
            });
        };
        // By id: a walk that meets a deletion starts over, and the map keeps each id once.
        let mut labels = BTreeMap::new();
        for entry in self.names.iter() {
            match entry {
                Ok((id, name)) => {
                    labels.insert(id, label(&name));
                }
                // Deleted between its key and its value.
                Err(MapError::KeyNotFound) => continue,
                Err(source) => {
                    return Err(KernelMapError::Read {
                        name: map_names::FRONTEND_NAMES,
                        source,
                    });
                }
            }
        }
        self.read_counters(&mut contents)?;
        Ok(MetricsRead {
            contents,
            names: labels.len(),
            labels,
            affinity_matches: self.count_affinity_matches()?,
        })
    }

    /// The entries of the affinity-match map: up to 2 million keys, counted in batches of
    /// 4,096 (a key-by-key walk took a syscall per key on every metrics reading), and capped
    /// at its capacity.
    fn count_affinity_matches(&self) -> Result<usize, KernelMapError> {
        let n = batch::count_hash(
            &self.affinity_match.map().fd().as_fd(),
            size_of::<AffinityMatchKey>(),
            size_of::<u32>(),
            4096,
        )
        .map_err(batch_read_error(map_names::AFFINITY_MATCH))?;
        Ok(n.min(self.capacities().of(MapKind::AffinityMatch) as usize))
    }

    /// Adds each frontend's counters, summed over CPUs, where any is non-zero.
    fn read_counters(&self, contents: &mut MapContents) -> Result<(), KernelMapError> {
        let ids: Vec<u32> = contents.frontends().map(|(_, f)| f.id).collect();
        let sums = self
            .counters
            .sums(&ids)
            .map_err(batch_read_error(map_names::COUNTERS))?;
        contents
            .counters
            .extend(sums.into_iter().filter(|(_, c)| *c != Counters::default()));
        Ok(())
    }

    /// Applies a run of updates of one map (`ops[..n]`, all of `ops[0]`'s kind and batchable)
    /// in batch syscalls. Returns how many ops it applied, and the error of the one it stopped at.
    fn apply_run(&mut self, ops: &[MapOp]) -> (usize, Option<MapWriteError>) {
        let kind = ops[0].map();
        // (op index, keys, values) per element, flattened as the kernel wants them.
        let mut keys: Vec<u8> = Vec::new();
        let mut values: Vec<u8> = Vec::new();
        let mut op_of_elem: Vec<usize> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match op {
                MapOp::PutFrontend(FeKey::V4(k), v) => {
                    keys.extend_from_slice(bytes_of(std::slice::from_ref(k)));
                    values.extend_from_slice(bytes_of(std::slice::from_ref(&**v)));
                    op_of_elem.push(i);
                }
                MapOp::PutFrontend(FeKey::V6(k), v) => {
                    keys.extend_from_slice(bytes_of(std::slice::from_ref(k)));
                    values.extend_from_slice(bytes_of(std::slice::from_ref(&**v)));
                    op_of_elem.push(i);
                }
                MapOp::PutSlots(base, slots) => {
                    for (index, slot) in (*base..).zip(slots) {
                        keys.extend_from_slice(&index.to_ne_bytes());
                        values.extend_from_slice(bytes_of(std::slice::from_ref(slot)));
                        op_of_elem.push(i);
                    }
                }
                MapOp::ResetCounters(id) => {
                    // The id's entry in every CPU's row.
                    for index in self.counters.entries_of(*id) {
                        keys.extend_from_slice(&index.to_ne_bytes());
                        values.extend_from_slice(bytes_of(&[Counters::default()]));
                        op_of_elem.push(i);
                    }
                }
                MapOp::PutName(id, name) => {
                    keys.extend_from_slice(&id.to_ne_bytes());
                    values.extend_from_slice(bytes_of(std::slice::from_ref(&**name)));
                    op_of_elem.push(i);
                }
                _ => return (0, None),
            }
        }
        let fd = match kind {
            MapKind::Frontends4 => self.fe4.map().fd().as_fd(),
            MapKind::Frontends6 => self.fe6.map().fd().as_fd(),
            MapKind::Slots => self.slots.map().fd().as_fd(),
            MapKind::Counters => self.counters.fd(),
            MapKind::FrontendNames => self.names.map().fd().as_fd(),
            _ => return (0, None),
        };
        let n = op_of_elem.len();
        let (key_size, value_size) = (keys.len() / n.max(1), values.len() / n.max(1));
        let mut done = 0usize;
        while done < n {
            let count = (n - done).min(BATCH_MAX);
            let elems = Elems {
                keys: &keys[done * key_size..(done + count) * key_size],
                values: &values[done * value_size..(done + count) * value_size],
                count: count as u32,
            };
            if let Err((applied, e)) = batch::update(&fd, &elems) {
                let failed_elem = done + applied as usize;
                let op = op_of_elem.get(failed_elem).copied().unwrap_or(ops.len());
                return (op, Some(syscall_error(kind, "BPF_MAP_UPDATE_BATCH", e)));
            }
            done += count;
        }
        (ops.len(), None)
    }
}

/// Whether consecutive ops `a` then `b` can share a batch syscall.
fn batchable(a: &MapOp, b: &MapOp) -> bool {
    use MapOp::*;
    matches!(
        (a, b),
        (PutFrontend(FeKey::V4(_), _), PutFrontend(FeKey::V4(_), _))
            | (PutFrontend(FeKey::V6(_), _), PutFrontend(FeKey::V6(_), _))
            | (PutSlots(..), PutSlots(..))
            | (ResetCounters(_), ResetCounters(_))
            | (PutName(..), PutName(..))
    )
}

impl MapWriter for KernelMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
        const ANY: u64 = 0;
        let r = match op {
            MapOp::PutFrontend(FeKey::V4(k), v) => self.fe4.insert(k, **v, ANY),
            MapOp::PutFrontend(FeKey::V6(k), v) => self.fe6.insert(k, **v, ANY),
            MapOp::DelFrontend(FeKey::V4(k)) => absent_ok(self.fe4.remove(k)),
            MapOp::DelFrontend(FeKey::V6(k)) => absent_ok(self.fe6.remove(k)),
            MapOp::PutSlots(..) => {
                return match self.apply_run(std::slice::from_ref(op)) {
                    (_, Some(e)) => Err(e),
                    (_, None) => Ok(()),
                };
            }
            MapOp::PutAffinityMatch(k) => self.affinity_match.insert(k, 1, ANY),
            MapOp::DelAffinityMatch(k) => absent_ok(self.affinity_match.remove(k)),
            MapOp::ResetCounters(_) => {
                return match self.apply_run(std::slice::from_ref(op)) {
                    (_, Some(e)) => Err(e),
                    (_, None) => Ok(()),
                };
            }
            MapOp::PutName(k, v) => self.names.insert(k, **v, ANY),
            MapOp::DelName(k) => absent_ok(self.names.remove(k)),
            MapOp::PutCluster(k, v) => self.clusters.insert(k, v, ANY),
            MapOp::DelCluster(k) => absent_ok(self.clusters.remove(k)),
        };
        r.map_err(|e| write_error(op.map(), e))
    }

    fn apply_all(&mut self, ops: &[MapOp]) -> Result<(), (usize, MapWriteError)> {
        let mut i = 0;
        while i < ops.len() {
            let mut end = i + 1;
            while end < ops.len() && batchable(&ops[i], &ops[end]) {
                end += 1;
            }
            let run_is_batch = end > i + 1 || matches!(ops[i], MapOp::PutSlots(..));
            if run_is_batch {
                match self.apply_run(&ops[i..end]) {
                    (_, None) => {}
                    (applied, Some(e)) => return Err((i + applied, e)),
                }
            } else {
                self.apply(&ops[i]).map_err(|e| (i, e))?;
            }
            i = end;
        }
        Ok(())
    }

    fn read_slots(&self, base: u32, count: u16) -> Result<Vec<Slot>, MapWriteError> {
        read_array(self.slots.map().fd().as_fd(), base, count as usize)
            .map_err(|e| syscall_error(MapKind::Slots, "BPF_MAP_LOOKUP_BATCH", e))
    }

    fn quiesce(&mut self) -> Result<(), MapWriteError> {
        super::grace::wait().map_err(|e| syscall_error(MapKind::Slots, "membarrier", e))
    }
}

use std::mem::size_of;
