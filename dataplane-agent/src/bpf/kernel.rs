//! The kernel maps behind [`MapWriter`]: typed aya handles on the pinned maps.

use std::path::Path;

use aya::maps::{HashMap, Map, MapData, MapError, PerCpuHashMap, PerCpuValues};
use dataplane_ebpf::{
    AffinityMatchKey, Backend, ClusterName, Counters, Frontend, FrontendKey4, FrontendKey6,
    FrontendName, Slot, SlotKey, map_names,
};

use super::maps::{Capacities, FeKey, MapContents, MapKind, MapOp, MapWriteError, MapWriter};

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
    #[error("cannot count CPUs: {0}")]
    Cpus(String),
}

/// Handles on every agent-owned map.
pub struct KernelMaps {
    fe4: HashMap<MapData, FrontendKey4, Frontend>,
    fe6: HashMap<MapData, FrontendKey6, Frontend>,
    slots: HashMap<MapData, SlotKey, Slot>,
    backends: HashMap<MapData, u32, Backend>,
    affinity_match: HashMap<MapData, AffinityMatchKey, u32>,
    counters: PerCpuHashMap<MapData, u32, Counters>,
    names: HashMap<MapData, u32, FrontendName>,
    clusters: HashMap<MapData, u32, ClusterName>,
    nr_cpus: usize,
    capacities: Capacities,
    /// Kernel ids of the maps, by name, for `inspect` and restart checks.
    pub ids: Vec<(&'static str, u32)>,
}

fn open(dir: &Path, name: &'static str) -> Result<Map, KernelMapError> {
    let path = dir.join(name);
    let data = MapData::from_pin(&path).map_err(|source| KernelMapError::Open {
        path: path.display().to_string(),
        source,
    })?;
    Map::from_map_data(data).map_err(|source| KernelMapError::Layout { name, source })
}

fn typed<T: TryFrom<Map, Error = MapError>>(
    map: Map,
    name: &'static str,
) -> Result<T, KernelMapError> {
    T::try_from(map).map_err(|source| KernelMapError::Layout { name, source })
}

fn map_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::HashMap(d) | Map::PerCpuHashMap(d) | Map::LruHashMap(d) | Map::SkStorage(d) => Some(d),
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
        let backends = open(maps_dir, map_names::BACKENDS)?;
        let clusters = open(maps_dir, map_names::CLUSTER_NAMES)?;
        let capacities = Capacities {
            frontends: max_entries(&fe4),
            backends: max_entries(&backends),
            slots: max_entries(&slots),
            clusters: max_entries(&clusters),
        };
        let nr_cpus = aya::util::nr_cpus()
            .map_err(|(what, e)| KernelMapError::Cpus(format!("{what}: {e}")))?;
        Ok(KernelMaps {
            fe4: typed(fe4, map_names::FRONTENDS4)?,
            fe6: typed(
                open(maps_dir, map_names::FRONTENDS6)?,
                map_names::FRONTENDS6,
            )?,
            slots: typed(slots, map_names::SLOTS)?,
            backends: typed(backends, map_names::BACKENDS)?,
            affinity_match: typed(
                open(maps_dir, map_names::AFFINITY_MATCH)?,
                map_names::AFFINITY_MATCH,
            )?,
            counters: typed(open(maps_dir, map_names::COUNTERS)?, map_names::COUNTERS)?,
            names: typed(
                open(maps_dir, map_names::FRONTEND_NAMES)?,
                map_names::FRONTEND_NAMES,
            )?,
            clusters: typed(clusters, map_names::CLUSTER_NAMES)?,
            nr_cpus,
            capacities,
            ids,
        })
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

    /// Reads every map. Entries that vanish while iterating are skipped.
    pub fn read_all(&self) -> Result<MapContents, KernelMapError> {
        fn collect<K: aya::Pod + Ord, V: aya::Pod>(
            map: &HashMap<MapData, K, V>,
            name: &'static str,
        ) -> Result<std::collections::BTreeMap<K, V>, KernelMapError> {
            let mut out = std::collections::BTreeMap::new();
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
        let mut counters = std::collections::BTreeMap::new();
        for kv in self.counters.iter() {
            match kv {
                Ok((k, per_cpu)) => {
                    let mut sum = Counters::default();
                    for c in per_cpu.iter() {
                        sum.translations += c.translations;
                        sum.affinity_hits += c.affinity_hits;
                        sum.rejects += c.rejects;
                    }
                    counters.insert(k, sum);
                }
                Err(MapError::KeyNotFound) => continue,
                Err(source) => {
                    return Err(KernelMapError::Read {
                        name: map_names::COUNTERS,
                        source,
                    });
                }
            }
        }
        Ok(MapContents {
            frontends4: collect(&self.fe4, map_names::FRONTENDS4)?,
            frontends6: collect(&self.fe6, map_names::FRONTENDS6)?,
            slots: collect(&self.slots, map_names::SLOTS)?
                .into_iter()
                .map(|(k, v)| (k, v.backend_id))
                .collect(),
            backends: collect(&self.backends, map_names::BACKENDS)?,
            affinity_match: collect(&self.affinity_match, map_names::AFFINITY_MATCH)?
                .into_keys()
                .collect(),
            counters,
            names: collect(&self.names, map_names::FRONTEND_NAMES)?,
            clusters: collect(&self.clusters, map_names::CLUSTER_NAMES)?,
        })
    }
}

fn write_error(map: MapKind, e: MapError) -> MapWriteError {
    let errno = match &e {
        MapError::SyscallError(s) => s.io_error.raw_os_error(),
        _ => None,
    };
    let detail = match &e {
        MapError::SyscallError(s) => format!("{} failed: {}", s.call, s.io_error),
        other => other.to_string(),
    };
    let message = match errno {
        Some(libc::E2BIG) => format!("map is full ({detail})"),
        _ => detail,
    };
    MapWriteError {
        map,
        errno,
        message,
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

impl MapWriter for KernelMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
        const ANY: u64 = 0;
        let r = match op {
            MapOp::PutFrontend(FeKey::V4(k), v) => self.fe4.insert(k, v, ANY),
            MapOp::PutFrontend(FeKey::V6(k), v) => self.fe6.insert(k, v, ANY),
            MapOp::DelFrontend(FeKey::V4(k)) => absent_ok(self.fe4.remove(k)),
            MapOp::DelFrontend(FeKey::V6(k)) => absent_ok(self.fe6.remove(k)),
            MapOp::PutSlot(k, b) => self.slots.insert(k, Slot { backend_id: *b }, ANY),
            MapOp::DelSlot(k) => absent_ok(self.slots.remove(k)),
            MapOp::PutBackend(k, v) => self.backends.insert(k, v, ANY),
            MapOp::DelBackend(k) => absent_ok(self.backends.remove(k)),
            MapOp::PutAffinityMatch(k) => self.affinity_match.insert(k, 1, ANY),
            MapOp::DelAffinityMatch(k) => absent_ok(self.affinity_match.remove(k)),
            MapOp::ResetCounters(k) => {
                match PerCpuValues::try_from(vec![Counters::default(); self.nr_cpus]) {
                    Ok(zeros) => self.counters.insert(k, zeros, ANY),
                    Err(e) => Err(MapError::SyscallError(aya::sys::SyscallError {
                        call: "nr_cpus",
                        io_error: e,
                    })),
                }
            }
            MapOp::DelCounters(k) => absent_ok(self.counters.remove(k)),
            MapOp::PutName(k, v) => self.names.insert(k, v, ANY),
            MapOp::DelName(k) => absent_ok(self.names.remove(k)),
            MapOp::PutCluster(k, v) => self.clusters.insert(k, v, ANY),
            MapOp::DelCluster(k) => absent_ok(self.clusters.remove(k)),
        };
        r.map_err(|e| write_error(op.map(), e))
    }
}
