//! Map sync: diffs the desired [`LbTable`] against what the maps hold and writes the
//! difference make-before-break, one service at a time.
//!
//! Write order for a service (the datapath invariants are in `dataplane_ebpf`'s docs):
//! 1. cluster names and new backends;
//! 2. per frontend: counters and name of a new id, the whole new backend set into the *inactive*
//!    slot bank, affinity-match entries of added backends, then one frontend write that flips
//!    `bank` and `count` together;
//! 3. only then the deletes: the old bank's slots, removed frontends (frontend entry first, then
//!    its slots), affinity-match entries of removed backends, and backends nothing points at.
//!
//! Every write of step 1-2 has an undo. If one fails (a full map, an injected fault), the writes
//! already made for that service are undone in reverse, the service is reported as failed, and
//! the maps and the mirror stay exactly as before for it. Other services are unaffected. Before
//! writing anything, the planner checks that the service's new entries fit the free room of
//! every map, so a full map normally refuses the change before the first write.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
    sync::Arc,
};

use dataplane_ebpf::{
    self as abi, AffinityMatchKey, ClusterName, FRONTEND_F_AFFINITY, FRONTEND_F_WILDCARD,
    FrontendKey4, FrontendKey6, FrontendName, SlotKey,
};
use foldhash::{HashMap, HashMapExt};
use serde::Serialize;

use super::{
    convert::{
        addr_from_words, addr_words, ip_proto, ip4_from_word, ip4_word, ip6_from_words, ip6_words,
        name_bytes, name_from_bytes, port_from_word, port_word, protocol_of,
    },
    maps::{Capacities, FeKey, MapContents, MapKind, MapOp, MapWriteError, MapWriter},
};
use dataplane_core::{
    lb::{Frontend, FrontendAddr, LbTable, Protocol},
    model::NamespacedName,
};

/// A frontend map entry: a service port, or the per-VIP wildcard that refuses other ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum FeAddr {
    Port(FrontendAddr),
    Wildcard(IpAddr),
}

impl FeAddr {
    pub fn key(&self) -> FeKey {
        let (ip, port, proto) = match *self {
            FeAddr::Port(f) => (f.ip, port_word(f.port), ip_proto(f.protocol)),
            FeAddr::Wildcard(ip) => (ip, 0, 0),
        };
        match ip {
            IpAddr::V4(v4) => FeKey::V4(FrontendKey4 {
                addr: ip4_word(v4),
                port,
                proto,
                _pad: 0,
            }),
            IpAddr::V6(v6) => FeKey::V6(FrontendKey6 {
                addr: ip6_words(v6),
                port,
                proto,
                _pad: 0,
            }),
        }
    }

    pub fn from_key(key: &FeKey) -> Option<FeAddr> {
        let (ip, port, proto) = match key {
            FeKey::V4(k) => (IpAddr::V4(ip4_from_word(k.addr)), k.port, k.proto),
            FeKey::V6(k) => (IpAddr::V6(ip6_from_words(k.addr)), k.port, k.proto),
        };
        if port == 0 && proto == 0 {
            return Some(FeAddr::Wildcard(ip));
        }
        Some(FeAddr::Port(FrontendAddr {
            ip,
            port: port_from_word(port),
            protocol: protocol_of(proto)?,
        }))
    }

    pub fn ip(&self) -> IpAddr {
        match self {
            FeAddr::Port(f) => f.ip,
            FeAddr::Wildcard(ip) => *ip,
        }
    }
}

impl fmt::Display for FeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FeAddr::Port(a) => a.fmt(f),
            FeAddr::Wildcard(IpAddr::V4(ip)) => write!(f, "{ip}:*"),
            FeAddr::Wildcard(IpAddr::V6(ip)) => write!(f, "[{ip}]:*"),
        }
    }
}

/// What makes a backend entry distinct. Keyed by cluster too, so equal addresses in two
/// clusters stay two backends, and by protocol, so TCP and UDP never share an entry.
///
/// The cluster name is shared (`Arc<str>`): the mirror keeps one identity per slot, and copies
/// cost a reference count.
///
/// Ordered by address first: the mirror's backend index holds up to a million identities, and
/// most comparisons in it then end on an integer instead of reading the cluster name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct BackendIdentity {
    pub ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    #[serde(serialize_with = "serialize_str")]
    pub cluster: Arc<str>,
}

fn serialize_str<S: serde::Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v)
}

/// A frontend as the maps should hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    pub service: NamespacedName,
    pub port_name: String,
    pub flags: u8,
    pub affinity_timeout_s: u32,
    /// In slot order.
    pub backends: Vec<BackendIdentity>,
}

/// The flags and affinity timeout of a frontend entry.
fn flags_of(fe: &Frontend) -> (u8, u32) {
    match fe.affinity_timeout_s {
        Some(t) => (FRONTEND_F_AFFINITY, t),
        None => (0, 0),
    }
}

/// The backends of a frontend as the maps hold them. The lb table never mixes families; the
/// filter keeps the ABI honest.
fn backend_identities<'a>(
    addr: &'a FrontendAddr,
    fe: &'a Frontend,
) -> impl Iterator<Item = BackendIdentity> + 'a {
    fe.backends
        .iter()
        .filter(|b| b.ip.is_ipv4() == addr.ip.is_ipv4())
        .map(|b| BackendIdentity {
            cluster: b.cluster.shared(),
            ip: b.ip,
            port: b.port,
            protocol: addr.protocol,
        })
}

/// The map entry of one frontend of the table.
fn desired_port(addr: &FrontendAddr, fe: &Frontend) -> DesiredFrontend {
    let (flags, affinity_timeout_s) = flags_of(fe);
    DesiredFrontend {
        service: fe.service.clone(),
        port_name: fe.port_name.clone(),
        flags,
        affinity_timeout_s,
        backends: backend_identities(addr, fe).collect(),
    }
}

/// The map entry of a VIP's wildcard.
fn desired_wildcard(service: &NamespacedName) -> DesiredFrontend {
    DesiredFrontend {
        service: service.clone(),
        port_name: String::new(),
        flags: FRONTEND_F_WILDCARD,
        affinity_timeout_s: 0,
        backends: Vec::new(),
    }
}

/// A port frontend of the table that is installed: its VIP belongs to its service (always so
/// in a table from `lb::build`; a frontend of someone else's VIP, or of no VIP, is not).
fn owned_port<'t>(table: &'t LbTable, addr: &FrontendAddr) -> Option<&'t Frontend> {
    table
        .frontends
        .get(addr)
        .filter(|fe| table.vips.get(&addr.ip) == Some(&fe.service))
}

/// The map entry `table` wants at `addr`, if any.
fn desired_at(table: &LbTable, addr: &FeAddr) -> Option<DesiredFrontend> {
    match addr {
        FeAddr::Port(a) => owned_port(table, a).map(|fe| desired_port(a, fe)),
        FeAddr::Wildcard(ip) => table.vips.get(ip).map(desired_wildcard),
    }
}

/// Whether `table` wants any entry at `addr`.
fn wanted_in(table: &LbTable, addr: &FeAddr) -> bool {
    match addr {
        FeAddr::Port(a) => owned_port(table, a).is_some(),
        FeAddr::Wildcard(ip) => table.vips.contains_key(ip),
    }
}

/// The entries of one VIP for its owner: its port frontends (a range of the table, which is
/// ordered by IP first) and its wildcard.
fn vip_entries<'t>(
    table: &'t LbTable,
    ip: IpAddr,
    owner: &'t NamespacedName,
) -> impl Iterator<Item = FeAddr> + 't {
    let lo = FrontendAddr {
        ip,
        port: 0,
        protocol: Protocol::Tcp,
    };
    let hi = FrontendAddr {
        ip,
        port: u16::MAX,
        protocol: Protocol::Udp,
    };
    table
        .frontends
        .range(lo..=hi)
        .filter(move |(_, fe)| fe.service == *owner)
        .map(|(a, _)| FeAddr::Port(*a))
        .chain(std::iter::once(FeAddr::Wildcard(ip)))
}

/// Converts the lb table into map entries: one per frontend and one wildcard per VIP. A
/// frontend belongs to the service that owns its VIP; one whose VIP is not its service's
/// (`lb::build` never makes one) is left out.
pub fn desired_entries(table: &LbTable) -> BTreeMap<FeAddr, DesiredFrontend> {
    let mut out = BTreeMap::new();
    for (addr, fe) in &table.frontends {
        if table.vips.get(&addr.ip) == Some(&fe.service) {
            out.insert(FeAddr::Port(*addr), desired_port(addr, fe));
        }
    }
    for (ip, service) in &table.vips {
        out.insert(FeAddr::Wildcard(*ip), desired_wildcard(service));
    }
    out
}

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

/// What one sync did.
#[derive(Debug, Default)]
pub struct SyncReport {
    pub changed: Vec<NamespacedName>,
    pub failed: Vec<SyncError>,
    /// Deletes that failed; they leave unreachable entries behind, never a broken frontend.
    pub delete_errors: Vec<MapWriteError>,
    pub writes: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct InstalledFrontend {
    id: u32,
    bank: u8,
    flags: u8,
    affinity_timeout_s: u32,
    /// Backend ids in slot order; the frontend's count is the length.
    backends: Vec<u32>,
    /// What those ids stand for, in the same order: lets a sync see that a frontend is
    /// unchanged by comparing it with the table, without looking any backend up.
    identities: Vec<BackendIdentity>,
    service: NamespacedName,
    port_name: String,
    /// Set on adoption when the maps held a frontend whose slots were incomplete: the next
    /// sync rewrites it whatever it compares to.
    broken: bool,
}

impl InstalledFrontend {
    fn affinity_set(&self) -> BTreeSet<u32> {
        if self.flags & FRONTEND_F_AFFINITY != 0 {
            self.backends.iter().copied().collect()
        } else {
            BTreeSet::new()
        }
    }

    fn abi(&self) -> abi::Frontend {
        abi::Frontend {
            id: self.id,
            count: self.backends.len() as u16,
            bank: self.bank,
            flags: self.flags,
            affinity_timeout_s: self.affinity_timeout_s,
            _pad: 0,
        }
    }

    fn name(&self) -> FrontendName {
        FrontendName {
            namespace: name_bytes(&self.service.namespace),
            name: name_bytes(&self.service.name),
            port_name: name_bytes(&self.port_name),
        }
    }
}

#[derive(Clone, Debug)]
struct InstalledBackend {
    id: u32,
    refs: u32,
}

/// Ids `1..=max`, lowest free first.
#[derive(Clone, Debug)]
struct IdPool {
    next: u32,
    free: BTreeSet<u32>,
    max: u32,
}

impl IdPool {
    fn new(max: u32) -> Self {
        IdPool {
            next: 1,
            free: BTreeSet::new(),
            max,
        }
    }

    /// The `n` ids the next allocations would return, without taking them.
    fn peek(&self, n: usize) -> Vec<u32> {
        let mut out: Vec<u32> = self.free.iter().copied().take(n).collect();
        let mut next = self.next;
        while out.len() < n && next <= self.max {
            out.push(next);
            next += 1;
        }
        out
    }

    fn take(&mut self, id: u32) {
        if !self.free.remove(&id) {
            while self.next <= id {
                if self.next != id {
                    self.free.insert(self.next);
                }
                self.next += 1;
            }
        }
    }

    fn release(&mut self, id: u32) {
        if id < self.next {
            self.free.insert(id);
        }
    }
}

/// The agent's copy of what the maps hold, kept in step with every committed write.
#[derive(Clone, Debug)]
pub struct MapSync {
    capacities: Capacities,
    frontends: BTreeMap<FeAddr, InstalledFrontend>,
    by_service: BTreeMap<NamespacedName, BTreeSet<FeAddr>>,
    /// Hashed: up to a million entries, looked up by every change; a tree would cost a cache
    /// miss per level.
    backends: HashMap<BackendIdentity, InstalledBackend>,
    backend_by_id: HashMap<u32, BackendIdentity>,
    clusters: BTreeMap<String, u32>,
    fe_ids: IdPool,
    be_ids: IdPool,
    cluster_ids: IdPool,
    used_slots: u64,
    used_affinity: u64,
    used_fe4: u64,
    used_fe6: u64,
}

/// Free room per map for one service's change.
#[derive(Default)]
struct Needs {
    fe4: u64,
    fe6: u64,
    ids: u64,
    slots: u64,
    affinity: u64,
    backends: u64,
    clusters: u64,
}

/// The writes for one service and the mirror changes they stand for.
#[derive(Default)]
struct Change {
    /// Writes with their undo, in order.
    puts: Vec<(MapOp, MapOp)>,
    deletes: Vec<MapOp>,
    upserts: Vec<(FeAddr, InstalledFrontend)>,
    removals: Vec<FeAddr>,
    new_backends: Vec<(BackendIdentity, u32)>,
    new_clusters: Vec<(String, u32)>,
    ref_delta: BTreeMap<BackendIdentity, i64>,
    freed_backends: Vec<BackendIdentity>,
    new_fe_ids: Vec<u32>,
}

impl MapSync {
    /// A mirror of empty maps.
    pub fn new(capacities: Capacities) -> Self {
        MapSync {
            capacities,
            frontends: BTreeMap::new(),
            by_service: BTreeMap::new(),
            backends: HashMap::new(),
            backend_by_id: HashMap::new(),
            clusters: BTreeMap::new(),
            fe_ids: IdPool::new(capacities.frontends),
            be_ids: IdPool::new(capacities.backends),
            cluster_ids: IdPool::new(capacities.clusters),
            used_slots: 0,
            used_affinity: 0,
            used_fe4: 0,
            used_fe6: 0,
        }
    }

    /// Adopts maps that already hold entries (an agent restart). Returns the mirror and the
    /// deletes that clear what no frontend can reach (the inactive bank, orphan backends and
    /// names left by an interrupted sync). Frontends themselves are kept until the first sync
    /// against a complete desired table decides about them.
    pub fn adopt(capacities: Capacities, contents: &MapContents) -> (MapSync, Vec<MapOp>) {
        let mut sync = MapSync::new(capacities);
        let mut cleanup = Vec::new();
        let mut cluster_by_idx: BTreeMap<u32, Arc<str>> = BTreeMap::new();
        for (idx, name) in &contents.clusters {
            let name = name_from_bytes(&name.name);
            sync.cluster_ids.take(*idx);
            cluster_by_idx.insert(*idx, name.as_str().into());
            sync.clusters.insert(name, *idx);
        }
        let mut identity_by_id = BTreeMap::new();
        for (id, be) in &contents.backends {
            let identity = addr_from_words(be.addr, be.family).and_then(|ip| {
                Some(BackendIdentity {
                    cluster: cluster_by_idx.get(&be.cluster)?.clone(),
                    ip,
                    port: port_from_word(be.port),
                    protocol: protocol_of(be.proto)?,
                })
            });
            match identity {
                Some(identity) if !sync.backends.contains_key(&identity) => {
                    sync.be_ids.take(*id);
                    identity_by_id.insert(*id, identity.clone());
                    sync.backends
                        .insert(identity, InstalledBackend { id: *id, refs: 0 });
                }
                _ => cleanup.push(MapOp::DelBackend(*id)),
            }
        }
        let mut live_slots = BTreeSet::new();
        let mut live_affinity = BTreeSet::new();
        for (key, fe) in contents.frontends() {
            let Some(addr) = FeAddr::from_key(&key) else {
                cleanup.push(MapOp::DelFrontend(key));
                continue;
            };
            let mut broken = false;
            let mut backends = Vec::new();
            let mut identities = Vec::new();
            for index in 0..fe.count {
                let slot = SlotKey {
                    frontend_id: fe.id,
                    bank: fe.bank as u16,
                    index,
                };
                match contents
                    .slots
                    .get(&slot)
                    .and_then(|b| Some((*b, identity_by_id.get(b)?)))
                {
                    Some((b, identity)) => {
                        live_slots.insert(slot);
                        backends.push(b);
                        identities.push(BackendIdentity::clone(identity));
                    }
                    None => broken = true,
                }
            }
            let (service, port_name) = match contents.names.get(&fe.id) {
                Some(n) => (
                    NamespacedName::new(name_from_bytes(&n.namespace), name_from_bytes(&n.name)),
                    name_from_bytes(&n.port_name),
                ),
                None => (NamespacedName::new("", ""), String::new()),
            };
            let installed = InstalledFrontend {
                id: fe.id,
                bank: fe.bank,
                flags: fe.flags,
                affinity_timeout_s: fe.affinity_timeout_s,
                backends,
                identities,
                service,
                port_name,
                broken,
            };
            for b in installed.affinity_set() {
                live_affinity.insert(AffinityMatchKey {
                    frontend_id: fe.id,
                    backend_id: b,
                });
            }
            if !contents.counters.contains_key(&fe.id) {
                cleanup.push(MapOp::ResetCounters(fe.id));
            }
            sync.fe_ids.take(fe.id);
            sync.insert_frontend(addr, installed);
        }
        let refs: Vec<u32> = sync
            .frontends
            .values()
            .flat_map(|f| f.backends.clone())
            .collect();
        for id in refs {
            if let Some(identity) = identity_by_id.get(&id)
                && let Some(be) = sync.backends.get_mut(identity)
            {
                be.refs += 1;
            }
        }
        let ids: BTreeSet<u32> = sync.frontends.values().map(|f| f.id).collect();
        cleanup.extend(
            contents
                .slots
                .keys()
                .filter(|s| !live_slots.contains(s))
                .map(|s| MapOp::DelSlot(*s)),
        );
        cleanup.extend(
            contents
                .affinity_match
                .iter()
                .filter(|m| !live_affinity.contains(m))
                .map(|m| MapOp::DelAffinityMatch(*m)),
        );
        cleanup.extend(
            contents
                .names
                .keys()
                .filter(|id| !ids.contains(id))
                .map(|id| MapOp::DelName(*id)),
        );
        cleanup.extend(
            contents
                .counters
                .keys()
                .filter(|id| !ids.contains(id))
                .map(|id| MapOp::DelCounters(*id)),
        );
        let mut orphans: Vec<(u32, BackendIdentity)> = sync
            .backends
            .iter()
            .filter(|(_, b)| b.refs == 0)
            .map(|(i, b)| (b.id, i.clone()))
            .collect();
        // By id, so the cleanup is the same whatever the hash order.
        orphans.sort_unstable_by_key(|(id, _)| *id);
        for (_, identity) in orphans {
            if let Some(b) = sync.backends.remove(&identity) {
                sync.be_ids.release(b.id);
                cleanup.push(MapOp::DelBackend(b.id));
            }
        }
        for (identity, b) in &sync.backends {
            sync.backend_by_id.insert(b.id, identity.clone());
        }
        (sync, cleanup)
    }

    fn insert_frontend(&mut self, addr: FeAddr, fe: InstalledFrontend) {
        if let Some(old) = self.frontends.remove(&addr) {
            self.account(&addr, &old, -1);
            if let Some(set) = self.by_service.get_mut(&old.service) {
                set.remove(&addr);
                if set.is_empty() {
                    self.by_service.remove(&old.service);
                }
            }
        }
        self.account(&addr, &fe, 1);
        self.by_service
            .entry(fe.service.clone())
            .or_default()
            .insert(addr);
        self.frontends.insert(addr, fe);
    }

    fn remove_frontend(&mut self, addr: &FeAddr) {
        if let Some(old) = self.frontends.remove(addr) {
            self.account(addr, &old, -1);
            self.fe_ids.release(old.id);
            if let Some(set) = self.by_service.get_mut(&old.service) {
                set.remove(addr);
                if set.is_empty() {
                    self.by_service.remove(&old.service);
                }
            }
        }
    }

    fn account(&mut self, addr: &FeAddr, fe: &InstalledFrontend, sign: i64) {
        let apply = |v: &mut u64, d: u64| {
            *v = if sign > 0 {
                *v + d
            } else {
                v.saturating_sub(d)
            };
        };
        match addr.ip() {
            IpAddr::V4(_) => apply(&mut self.used_fe4, 1),
            IpAddr::V6(_) => apply(&mut self.used_fe6, 1),
        }
        apply(&mut self.used_slots, fe.backends.len() as u64);
        apply(&mut self.used_affinity, fe.affinity_set().len() as u64);
    }

    /// Number of frontend entries (ports and wildcards) the mirror holds.
    pub fn frontend_count(&self) -> usize {
        self.frontends.len()
    }

    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    pub fn slot_count(&self) -> u64 {
        self.used_slots
    }

    /// The services the maps currently hold.
    pub fn services(&self) -> impl Iterator<Item = &NamespacedName> {
        self.by_service.keys()
    }

    /// Brings the maps to `table`. Services are independent: one that cannot be written is
    /// reported in [`SyncReport::failed`] and left as it was; the others are written.
    ///
    /// Every service is compared with what the mirror holds, without allocating, and only the
    /// services that differ are planned and written. When the caller knows which services
    /// changed, [`MapSync::sync_services`] skips the comparison of the others.
    pub fn sync(&mut self, table: &LbTable, maps: &mut impl MapWriter) -> SyncReport {
        let groups = entries_by_service(table, None);
        // Removals first: they free room the other services may need.
        let removed: Vec<NamespacedName> = self
            .by_service
            .keys()
            .filter(|s| !groups.contains_key(*s))
            .cloned()
            .collect();
        let mut changed: Vec<(&NamespacedName, &Vec<FeAddr>)> = groups
            .iter()
            .filter(|(service, addrs)| !self.unchanged(service, addrs, table))
            .map(|(service, addrs)| (*service, addrs))
            .collect();
        changed.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut report = SyncReport::default();
        for service in &removed {
            self.sync_service(service, &[], table, maps, &mut report);
        }
        for (service, addrs) in changed {
            self.sync_service(service, addrs, table, maps, &mut report);
        }
        report
    }

    /// Brings only `services` to what `table` says about them (a service `table` does not
    /// have is removed). The others are neither compared nor touched, so the cost follows the
    /// size of the change, not of the table: the node calls this when it knows which services
    /// an event touched. `table` is the whole desired table, as for [`MapSync::sync`].
    pub fn sync_services<'a>(
        &mut self,
        table: &LbTable,
        services: impl IntoIterator<Item = &'a NamespacedName>,
        maps: &mut impl MapWriter,
    ) -> SyncReport {
        let mut services: Vec<&NamespacedName> = services.into_iter().collect();
        services.sort_unstable();
        services.dedup();
        let groups = entries_by_service(table, Some(&services));
        let mut report = SyncReport::default();
        // Removals first, as in `sync`.
        for service in services.iter().filter(|s| !groups.contains_key(*s)) {
            if self.by_service.contains_key(*service) {
                self.sync_service(service, &[], table, maps, &mut report);
            }
        }
        for service in &services {
            if let Some(addrs) = groups.get(service)
                && !self.unchanged(service, addrs, table)
            {
                self.sync_service(service, addrs, table, maps, &mut report);
            }
        }
        report
    }

    /// Whether the maps already hold exactly `addrs` for `service`, as `table` wants them.
    /// Compares in place (no allocation); `false` only costs a full plan of the service.
    fn unchanged(&self, service: &NamespacedName, addrs: &[FeAddr], table: &LbTable) -> bool {
        let Some(installed) = self.by_service.get(service) else {
            return false;
        };
        if installed.len() != addrs.len() {
            return false;
        }
        addrs.iter().all(|addr| {
            let Some(old) = self.frontends.get(addr) else {
                return false;
            };
            if old.broken || !installed.contains(addr) || old.service != *service {
                return false;
            }
            match addr {
                FeAddr::Wildcard(_) => {
                    old.flags == FRONTEND_F_WILDCARD
                        && old.affinity_timeout_s == 0
                        && old.port_name.is_empty()
                        && old.backends.is_empty()
                }
                FeAddr::Port(a) => table.frontends.get(a).is_some_and(|fe| {
                    (old.flags, old.affinity_timeout_s) == flags_of(fe)
                        && old.port_name == fe.port_name
                        && same_backends(&old.identities, a, fe)
                }),
            }
        })
    }

    fn sync_service(
        &mut self,
        service: &NamespacedName,
        addrs: &[FeAddr],
        table: &LbTable,
        maps: &mut impl MapWriter,
        report: &mut SyncReport,
    ) {
        let desired: BTreeMap<FeAddr, DesiredFrontend> = addrs
            .iter()
            .filter_map(|a| Some((*a, desired_at(table, a)?)))
            .collect();
        let wanted: BTreeMap<FeAddr, &DesiredFrontend> =
            desired.iter().map(|(a, d)| (*a, d)).collect();
        let change = match self.plan_service(service, &wanted, table) {
            Ok(Some(change)) => change,
            Ok(None) => return,
            Err(e) => {
                report.failed.push(e);
                return;
            }
        };
        let mut done: Vec<&MapOp> = Vec::new();
        for (op, undo) in &change.puts {
            match maps.apply(op) {
                Ok(()) => {
                    report.writes += 1;
                    done.push(undo);
                }
                Err(source) => {
                    for undo in done.iter().rev() {
                        // An undo that fails leaves an unreachable entry at worst: the frontend
                        // write is the last put, and restoring it is the first undo.
                        if let Err(e) = maps.apply(undo) {
                            report.delete_errors.push(e);
                        }
                    }
                    report.failed.push(SyncError::Write {
                        service: service.clone(),
                        source,
                    });
                    return;
                }
            }
        }
        for op in &change.deletes {
            match maps.apply(op) {
                Ok(()) => report.writes += 1,
                Err(e) => report.delete_errors.push(e),
            }
        }
        self.commit(change);
        report.changed.push(service.clone());
    }

    fn commit(&mut self, change: Change) {
        for (name, idx) in change.new_clusters {
            self.cluster_ids.take(idx);
            self.clusters.insert(name, idx);
        }
        for (identity, id) in change.new_backends {
            self.be_ids.take(id);
            self.backend_by_id.insert(id, identity.clone());
            self.backends
                .insert(identity, InstalledBackend { id, refs: 0 });
        }
        for id in change.new_fe_ids {
            self.fe_ids.take(id);
        }
        for addr in &change.removals {
            self.remove_frontend(addr);
        }
        for (addr, fe) in change.upserts {
            self.insert_frontend(addr, fe);
        }
        for (identity, delta) in change.ref_delta {
            if let Some(be) = self.backends.get_mut(&identity) {
                be.refs = (be.refs as i64 + delta).max(0) as u32;
            }
        }
        for identity in change.freed_backends {
            if let Some(be) = self.backends.remove(&identity) {
                self.be_ids.release(be.id);
                self.backend_by_id.remove(&be.id);
            }
        }
    }

    /// Plans the writes that bring one service to `wanted`. `None` when nothing changes.
    fn plan_service(
        &self,
        service: &NamespacedName,
        wanted: &BTreeMap<FeAddr, &DesiredFrontend>,
        table: &LbTable,
    ) -> Result<Option<Change>, SyncError> {
        let mut change = Change::default();
        let mut needs = Needs::default();

        for (addr, d) in wanted {
            if d.backends.len() > u16::MAX as usize {
                return Err(SyncError::TooManyBackends {
                    service: service.clone(),
                    frontend: addr.to_string(),
                    count: d.backends.len(),
                });
            }
        }

        // Clusters and backends the service needs that the maps do not hold yet.
        let mut new_clusters: BTreeMap<String, u32> = BTreeMap::new();
        let mut new_backends: BTreeMap<BackendIdentity, u32> = BTreeMap::new();
        {
            let mut missing_clusters = BTreeSet::new();
            let mut missing_backends = BTreeSet::new();
            for d in wanted.values() {
                for b in &d.backends {
                    if !self.clusters.contains_key(&*b.cluster) {
                        missing_clusters.insert(b.cluster.to_string());
                    }
                    if !self.backends.contains_key(b) {
                        missing_backends.insert(b.clone());
                    }
                }
            }
            let cluster_ids = self.cluster_ids.peek(missing_clusters.len());
            needs.clusters = missing_clusters.len() as u64;
            if cluster_ids.len() < missing_clusters.len() {
                return Err(self.full(service, MapKind::ClusterNames, needs.clusters));
            }
            new_clusters.extend(missing_clusters.into_iter().zip(cluster_ids));
            let backend_ids = self.be_ids.peek(missing_backends.len());
            needs.backends = missing_backends.len() as u64;
            if backend_ids.len() < missing_backends.len() {
                return Err(self.full(service, MapKind::Backends, needs.backends));
            }
            new_backends.extend(missing_backends.into_iter().zip(backend_ids));
        }
        let backend_id = |b: &BackendIdentity| -> u32 {
            self.backends
                .get(b)
                .map(|i| i.id)
                .or_else(|| new_backends.get(b).copied())
                .unwrap_or(0)
        };
        for (name, idx) in &new_clusters {
            change.puts.push((
                MapOp::PutCluster(
                    *idx,
                    ClusterName {
                        name: name_bytes(name),
                    },
                ),
                MapOp::DelCluster(*idx),
            ));
        }
        for (identity, id) in &new_backends {
            let (addr, family) = addr_words(identity.ip);
            let cluster = self
                .clusters
                .get(&*identity.cluster)
                .or_else(|| new_clusters.get(&*identity.cluster))
                .copied()
                .unwrap_or(0);
            change.puts.push((
                MapOp::PutBackend(
                    *id,
                    abi::Backend {
                        addr,
                        port: port_word(identity.port),
                        family,
                        proto: ip_proto(identity.protocol),
                        cluster,
                    },
                ),
                MapOp::DelBackend(*id),
            ));
        }

        // Ids for frontends that are new to the maps.
        let new_addrs: Vec<&FeAddr> = wanted
            .keys()
            .filter(|a| !self.frontends.contains_key(*a))
            .collect();
        let new_ids = self.fe_ids.peek(new_addrs.len());
        needs.ids = new_addrs.len() as u64;
        if new_ids.len() < new_addrs.len() {
            return Err(self.full(service, MapKind::FrontendNames, needs.ids));
        }
        let new_id_of: BTreeMap<FeAddr, u32> = new_addrs
            .iter()
            .map(|a| **a)
            .zip(new_ids.iter().copied())
            .collect();
        change.new_fe_ids = new_ids;

        let mut deferred = Vec::new();
        for (addr, d) in wanted {
            let ids: Vec<u32> = d.backends.iter().map(backend_id).collect();
            let target_aff: BTreeSet<u32> = if d.flags & FRONTEND_F_AFFINITY != 0 {
                ids.iter().copied().collect()
            } else {
                BTreeSet::new()
            };
            for b in &d.backends {
                *change.ref_delta.entry(b.clone()).or_default() += 1;
            }
            let key = addr.key();
            match self.frontends.get(addr) {
                None => {
                    let Some(id) = new_id_of.get(addr).copied() else {
                        continue; // every new address got an id above
                    };
                    let fe = InstalledFrontend {
                        id,
                        bank: 0,
                        flags: d.flags,
                        affinity_timeout_s: d.affinity_timeout_s,
                        backends: ids.clone(),
                        identities: d.backends.clone(),
                        service: d.service.clone(),
                        port_name: d.port_name.clone(),
                        broken: false,
                    };
                    match key {
                        FeKey::V4(_) => needs.fe4 += 1,
                        FeKey::V6(_) => needs.fe6 += 1,
                    }
                    change
                        .puts
                        .push((MapOp::ResetCounters(id), MapOp::DelCounters(id)));
                    change
                        .puts
                        .push((MapOp::PutName(id, fe.name()), MapOp::DelName(id)));
                    push_bank(&mut change.puts, id, 0, &ids);
                    needs.slots += ids.len() as u64;
                    for b in &target_aff {
                        let m = AffinityMatchKey {
                            frontend_id: id,
                            backend_id: *b,
                        };
                        change
                            .puts
                            .push((MapOp::PutAffinityMatch(m), MapOp::DelAffinityMatch(m)));
                    }
                    needs.affinity += target_aff.len() as u64;
                    change
                        .puts
                        .push((MapOp::PutFrontend(key, fe.abi()), MapOp::DelFrontend(key)));
                    change.upserts.push((*addr, fe));
                }
                Some(old) => {
                    for b in &old.backends {
                        if let Some(identity) = self.identity_of(*b) {
                            *change.ref_delta.entry(identity).or_default() -= 1;
                        }
                    }
                    let mut fe = InstalledFrontend {
                        id: old.id,
                        bank: old.bank,
                        flags: d.flags,
                        affinity_timeout_s: d.affinity_timeout_s,
                        backends: ids.clone(),
                        identities: d.backends.clone(),
                        service: d.service.clone(),
                        port_name: d.port_name.clone(),
                        broken: false,
                    };
                    let set_changed = old.backends != ids || old.broken;
                    if !set_changed && fe == *old {
                        continue;
                    }
                    if fe.name() != old.name() {
                        change.puts.push((
                            MapOp::PutName(fe.id, fe.name()),
                            MapOp::PutName(old.id, old.name()),
                        ));
                    }
                    let old_aff = old.affinity_set();
                    for b in target_aff.difference(&old_aff) {
                        let m = AffinityMatchKey {
                            frontend_id: fe.id,
                            backend_id: *b,
                        };
                        change
                            .puts
                            .push((MapOp::PutAffinityMatch(m), MapOp::DelAffinityMatch(m)));
                        needs.affinity += 1;
                    }
                    if set_changed {
                        fe.bank = 1 - old.bank.min(1);
                        push_bank(&mut change.puts, fe.id, fe.bank, &ids);
                        needs.slots += ids.len() as u64;
                        for index in 0..old.backends.len() as u16 {
                            deferred.push(MapOp::DelSlot(SlotKey {
                                frontend_id: old.id,
                                bank: old.bank as u16,
                                index,
                            }));
                        }
                    }
                    if fe.abi() != old.abi() || old.broken {
                        change.puts.push((
                            MapOp::PutFrontend(key, fe.abi()),
                            MapOp::PutFrontend(key, old.abi()),
                        ));
                    }
                    for b in old_aff.difference(&target_aff) {
                        deferred.push(MapOp::DelAffinityMatch(AffinityMatchKey {
                            frontend_id: fe.id,
                            backend_id: *b,
                        }));
                    }
                    change.upserts.push((*addr, fe));
                }
            }
        }

        // Frontends of this service that nobody wants any more. Port entries sort before the
        // VIP's wildcard, so a removed VIP refuses (never passes through) until it is gone.
        if let Some(installed) = self.by_service.get(service) {
            for addr in installed {
                if wanted_in(table, addr) {
                    continue; // wanted here, or taken over by another service
                }
                let Some(old) = self.frontends.get(addr) else {
                    continue;
                };
                deferred.push(MapOp::DelFrontend(addr.key()));
                for index in 0..old.backends.len() as u16 {
                    deferred.push(MapOp::DelSlot(SlotKey {
                        frontend_id: old.id,
                        bank: old.bank as u16,
                        index,
                    }));
                }
                for b in old.affinity_set() {
                    deferred.push(MapOp::DelAffinityMatch(AffinityMatchKey {
                        frontend_id: old.id,
                        backend_id: b,
                    }));
                }
                deferred.push(MapOp::DelCounters(old.id));
                deferred.push(MapOp::DelName(old.id));
                for b in &old.backends {
                    if let Some(identity) = self.identity_of(*b) {
                        *change.ref_delta.entry(identity).or_default() -= 1;
                    }
                }
                change.removals.push(*addr);
            }
        }

        if change.upserts.is_empty() && change.removals.is_empty() {
            return Ok(None);
        }

        // Backends nothing points at after this change go last.
        for (identity, delta) in &change.ref_delta {
            let refs = self
                .backends
                .get(identity)
                .map(|b| b.refs as i64)
                .unwrap_or(0);
            if refs + delta <= 0
                && let Some(be) = self.backends.get(identity)
            {
                deferred.push(MapOp::DelBackend(be.id));
                change.freed_backends.push(identity.clone());
            }
        }
        change.new_backends = new_backends.into_iter().collect();
        change.new_clusters = new_clusters.into_iter().collect();
        change.deletes = deferred;

        self.check_room(service, &needs)?;
        Ok(Some(change))
    }

    fn identity_of(&self, backend_id: u32) -> Option<BackendIdentity> {
        self.backend_by_id.get(&backend_id).cloned()
    }

    fn full(&self, service: &NamespacedName, map: MapKind, needed: u64) -> SyncError {
        let capacity = self.capacities.of(map);
        let used = match map {
            MapKind::Frontends4 => self.used_fe4,
            MapKind::Frontends6 => self.used_fe6,
            MapKind::Slots => self.used_slots,
            MapKind::AffinityMatch => self.used_affinity,
            MapKind::Backends => self.backends.len() as u64,
            MapKind::ClusterNames => self.clusters.len() as u64,
            MapKind::Counters | MapKind::FrontendNames => self.frontends.len() as u64,
        };
        SyncError::MapFull {
            service: service.clone(),
            map,
            needed,
            free: (capacity as u64).saturating_sub(used),
            capacity,
        }
    }

    fn check_room(&self, service: &NamespacedName, needs: &Needs) -> Result<(), SyncError> {
        let checks = [
            (MapKind::Frontends4, needs.fe4, self.used_fe4),
            (MapKind::Frontends6, needs.fe6, self.used_fe6),
            (
                MapKind::FrontendNames,
                needs.ids,
                self.frontends.len() as u64,
            ),
            (MapKind::Slots, needs.slots, self.used_slots),
            (MapKind::AffinityMatch, needs.affinity, self.used_affinity),
            (
                MapKind::Backends,
                needs.backends,
                self.backends.len() as u64,
            ),
            (
                MapKind::ClusterNames,
                needs.clusters,
                self.clusters.len() as u64,
            ),
        ];
        for (map, needed, used) in checks {
            let capacity = self.capacities.of(map) as u64;
            if used + needed > capacity {
                return Err(self.full(service, map, needed));
            }
        }
        Ok(())
    }
}

/// The entries of `table` grouped by the service that owns them (see [`desired_entries`]).
/// `only` restricts it to those services; the VIPs are still all looked at, but only their
/// owner is compared, and with the name first (namespaces are mostly equal).
fn entries_by_service<'t>(
    table: &'t LbTable,
    only: Option<&[&NamespacedName]>,
) -> HashMap<&'t NamespacedName, Vec<FeAddr>> {
    let keep = |s: &NamespacedName| {
        only.is_none_or(|only| {
            only.iter()
                .any(|o| o.name == s.name && o.namespace == s.namespace)
        })
    };
    let mut out: HashMap<&NamespacedName, Vec<FeAddr>> = HashMap::new();
    for (ip, owner) in &table.vips {
        if keep(owner) {
            out.entry(owner)
                .or_default()
                .extend(vip_entries(table, *ip, owner));
        }
    }
    out
}

/// Whether `old` (installed, in slot order) are the backends the table wants for `fe`.
fn same_backends(old: &[BackendIdentity], addr: &FrontendAddr, fe: &Frontend) -> bool {
    let mut new = fe
        .backends
        .iter()
        .filter(|b| b.ip.is_ipv4() == addr.ip.is_ipv4());
    old.iter().all(|o| {
        new.next().is_some_and(|b| {
            o.ip == b.ip
                && o.port == b.port
                && o.protocol == addr.protocol
                && *o.cluster == *b.cluster.as_str()
        })
    }) && new.next().is_none()
}

/// Writes a whole backend set into one bank of a frontend's slots.
fn push_bank(puts: &mut Vec<(MapOp, MapOp)>, id: u32, bank: u8, backends: &[u32]) {
    for (index, backend) in backends.iter().enumerate() {
        let slot = SlotKey {
            frontend_id: id,
            bank: bank as u16,
            index: index as u16,
        };
        puts.push((MapOp::PutSlot(slot, *backend), MapOp::DelSlot(slot)));
    }
}

/// Decodes what the maps hold into the desired-entry form (what a reader of the datapath
/// would see), for `inspect` and for tests that compare maps with the lb table.
pub fn read_back(contents: &MapContents) -> BTreeMap<FeAddr, DesiredFrontend> {
    let clusters: BTreeMap<u32, Arc<str>> = contents
        .clusters
        .iter()
        .map(|(k, v)| (*k, name_from_bytes(&v.name).into()))
        .collect();
    let mut out = BTreeMap::new();
    for (key, fe) in contents.frontends() {
        let Some(addr) = FeAddr::from_key(&key) else {
            continue;
        };
        let mut backends = Vec::new();
        for index in 0..fe.count {
            let slot = SlotKey {
                frontend_id: fe.id,
                bank: fe.bank as u16,
                index,
            };
            let Some(be) = contents
                .slots
                .get(&slot)
                .and_then(|id| contents.backends.get(id))
            else {
                continue;
            };
            let (Some(ip), Some(protocol)) =
                (addr_from_words(be.addr, be.family), protocol_of(be.proto))
            else {
                continue;
            };
            backends.push(BackendIdentity {
                cluster: clusters
                    .get(&be.cluster)
                    .cloned()
                    .unwrap_or_else(|| "".into()),
                ip,
                port: port_from_word(be.port),
                protocol,
            });
        }
        let (service, port_name) = contents
            .names
            .get(&fe.id)
            .map(|n| {
                (
                    NamespacedName::new(name_from_bytes(&n.namespace), name_from_bytes(&n.name)),
                    name_from_bytes(&n.port_name),
                )
            })
            .unwrap_or_else(|| (NamespacedName::new("", ""), String::new()));
        out.insert(
            addr,
            DesiredFrontend {
                service,
                port_name,
                flags: fe.flags,
                affinity_timeout_s: fe.affinity_timeout_s,
                backends,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    use super::*;
    use crate::bpf::maps::MemMaps;
    use dataplane_core::{
        lb::{Backend, Frontend},
        model::ClusterId,
    };

    /// Applies writes to in-memory maps and checks the datapath invariants after every one,
    /// and that every frontend a reader can see serves either its old or its new backend set.
    struct CheckedMaps {
        maps: MemMaps,
        before: BTreeMap<FeAddr, DesiredFrontend>,
        after: BTreeMap<FeAddr, DesiredFrontend>,
        violations: Vec<String>,
    }

    impl MapWriter for CheckedMaps {
        fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
            self.maps.apply(op)?;
            if let Err(v) = self.maps.contents.check_datapath_invariants() {
                self.violations.push(format!("after {op:?}: {v}"));
            }
            for (addr, seen) in read_back(&self.maps.contents) {
                let ok = [self.before.get(&addr), self.after.get(&addr)]
                    .into_iter()
                    .flatten()
                    .any(|d| d.backends == seen.backends);
                if !ok {
                    self.violations.push(format!(
                        "after {op:?}: {addr} serves a mixed set {:?}",
                        seen.backends
                    ));
                }
            }
            Ok(())
        }
    }

    fn svc(name: &str) -> NamespacedName {
        NamespacedName::new("ns", name)
    }

    fn backend(cluster: &str, ip: IpAddr, port: u16) -> Backend {
        Backend {
            cluster: ClusterId::new(cluster).unwrap(),
            ip,
            port,
        }
    }

    /// One service of a test table: (service, vip, [(port, [backends])]).
    type ServiceSpec<'a> = (&'a str, IpAddr, Vec<(u16, Vec<Backend>)>);

    fn table(spec: &[ServiceSpec]) -> LbTable {
        let mut t = LbTable::default();
        for (name, vip, ports) in spec {
            t.vips.insert(*vip, svc(name));
            for (port, backends) in ports {
                t.frontends.insert(
                    FrontendAddr {
                        ip: *vip,
                        port: *port,
                        protocol: Protocol::Tcp,
                    },
                    Frontend {
                        service: svc(name),
                        port_name: format!("p{port}"),
                        affinity_timeout_s: None,
                        backends: backends.clone(),
                    },
                );
            }
        }
        t
    }

    fn v4(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    fn sync_checked(sync: &mut MapSync, maps: &mut MemMaps, t: &LbTable) -> SyncReport {
        checked(maps, t, |m| sync.sync(t, m))
    }

    /// [`MapSync::sync_services`] under the same checks as [`sync_checked`].
    fn sync_services_checked(
        sync: &mut MapSync,
        maps: &mut MemMaps,
        t: &LbTable,
        services: &[NamespacedName],
    ) -> SyncReport {
        checked(maps, t, |m| sync.sync_services(t, services, m))
    }

    fn checked(
        maps: &mut MemMaps,
        t: &LbTable,
        run: impl FnOnce(&mut CheckedMaps) -> SyncReport,
    ) -> SyncReport {
        let before = read_back(&maps.contents);
        let mut checked = CheckedMaps {
            maps: std::mem::take(maps),
            before,
            after: desired_entries(t),
            violations: vec![],
        };
        let report = run(&mut checked);
        assert!(checked.violations.is_empty(), "{:#?}", checked.violations);
        *maps = checked.maps;
        report
    }

    /// The services whose map entries differ between two tables.
    fn changed_services(a: &LbTable, b: &LbTable) -> Vec<NamespacedName> {
        let by_service = |t: &LbTable| {
            let mut out: BTreeMap<NamespacedName, BTreeMap<FeAddr, DesiredFrontend>> =
                BTreeMap::new();
            for (addr, d) in desired_entries(t) {
                out.entry(d.service.clone()).or_default().insert(addr, d);
            }
            out
        };
        let (a, b) = (by_service(a), by_service(b));
        let all: BTreeSet<&NamespacedName> = a.keys().chain(b.keys()).collect();
        all.into_iter()
            .filter(|s| a.get(*s) != b.get(*s))
            .cloned()
            .collect()
    }

    #[test]
    fn sync_services_touches_only_the_services_named() {
        let a = IpAddr::V4(Ipv4Addr::new(241, 0, 0, 1));
        let b = IpAddr::V4(Ipv4Addr::new(241, 0, 0, 2));
        let t1 = table(&[
            ("a", a, vec![(80, vec![backend("x", v4(1), 80)])]),
            ("b", b, vec![(80, vec![backend("x", v4(2), 80)])]),
        ]);
        let mut sync = MapSync::new(Capacities::default());
        let mut maps = MemMaps::new(Capacities::default());
        sync_checked(&mut sync, &mut maps, &t1);
        let t2 = table(&[
            ("a", a, vec![(80, vec![backend("x", v4(3), 80)])]),
            ("b", b, vec![(80, vec![backend("x", v4(4), 80)])]),
        ]);
        // Only b is named: a keeps its old backends.
        let report = sync_services_checked(&mut sync, &mut maps, &t2, &[svc("b")]);
        assert_eq!(report.changed, vec![svc("b")]);
        let got = read_back(&maps.contents);
        let port = |ip| {
            FeAddr::Port(FrontendAddr {
                ip,
                port: 80,
                protocol: Protocol::Tcp,
            })
        };
        assert_eq!(got[&port(a)], desired_entries(&t1)[&port(a)]);
        assert_eq!(got[&port(b)], desired_entries(&t2)[&port(b)]);
        // A service that is gone from the table is removed when named.
        let t3 = table(&[("a", a, vec![(80, vec![backend("x", v4(3), 80)])])]);
        sync_services_checked(&mut sync, &mut maps, &t3, &[svc("a"), svc("b")]);
        assert_eq!(read_back(&maps.contents), desired_entries(&t3));
        // Naming an unchanged or unknown service writes nothing.
        let again = sync_services_checked(&mut sync, &mut maps, &t3, &[svc("a"), svc("zz")]);
        assert_eq!((again.writes, again.changed.len()), (0, 0));
    }

    /// A frontend belongs to the service that owns its VIP; one of another service's VIP (or
    /// of no VIP) is never installed, by either sync.
    #[test]
    fn frontends_of_a_vip_another_service_owns_are_not_installed() {
        let a = IpAddr::V4(Ipv4Addr::new(241, 0, 0, 1));
        let mut t = table(&[("a", a, vec![(80, vec![backend("x", v4(1), 80)])])]);
        let stray = |ip, port| FrontendAddr {
            ip,
            port,
            protocol: Protocol::Tcp,
        };
        let fe = |name: &str| Frontend {
            service: svc(name),
            port_name: String::new(),
            affinity_timeout_s: None,
            backends: vec![backend("x", v4(9), 80)],
        };
        t.frontends.insert(stray(a, 81), fe("b"));
        t.frontends
            .insert(stray(IpAddr::V4(Ipv4Addr::new(241, 0, 0, 9)), 80), fe("c"));
        assert_eq!(desired_entries(&t).len(), 2, "a:80 and a's wildcard");
        let mut sync = MapSync::new(Capacities::default());
        let mut maps = MemMaps::new(Capacities::default());
        sync_checked(&mut sync, &mut maps, &t);
        assert_eq!(read_back(&maps.contents), desired_entries(&t));
        let mut sync2 = MapSync::new(Capacities::default());
        let mut maps2 = MemMaps::new(Capacities::default());
        sync_services_checked(&mut sync2, &mut maps2, &t, &[svc("a"), svc("b"), svc("c")]);
        assert_eq!(read_back(&maps2.contents), desired_entries(&t));
    }

    #[test]
    fn first_sync_writes_every_frontend_and_a_wildcard_per_vip() {
        let vip = IpAddr::V4(Ipv4Addr::new(241, 0, 0, 1));
        let t = table(&[(
            "web",
            vip,
            vec![
                (
                    80,
                    vec![backend("a", v4(1), 8080), backend("b", v4(2), 8080)],
                ),
                (443, vec![]),
            ],
        )]);
        let mut sync = MapSync::new(Capacities::default());
        let mut maps = MemMaps::new(Capacities::default());
        let report = sync_checked(&mut sync, &mut maps, &t);
        assert_eq!(report.changed, vec![svc("web")]);
        assert!(report.failed.is_empty());
        assert_eq!(read_back(&maps.contents), desired_entries(&t));
        assert_eq!(maps.contents.frontends4.len(), 3); // :80, :443, wildcard
        assert_eq!(maps.contents.backends.len(), 2);
        let wildcard = FeAddr::Wildcard(vip).key();
        let FeKey::V4(k) = wildcard else { panic!() };
        assert_eq!(maps.contents.frontends4[&k].flags, FRONTEND_F_WILDCARD);
        // A second sync of the same table writes nothing.
        let again = sync_checked(&mut sync, &mut maps, &t);
        assert_eq!(again.writes, 0);
        assert!(again.changed.is_empty());
    }

    #[test]
    fn a_changed_backend_set_flips_banks_and_frees_what_nothing_uses() {
        let vip = IpAddr::V4(Ipv4Addr::new(241, 0, 0, 1));
        let mut sync = MapSync::new(Capacities::default());
        let mut maps = MemMaps::new(Capacities::default());
        let t1 = table(&[(
            "web",
            vip,
            vec![(80, vec![backend("a", v4(1), 80), backend("a", v4(2), 80)])],
        )]);
        sync_checked(&mut sync, &mut maps, &t1);
        let t2 = table(&[(
            "web",
            vip,
            vec![(80, vec![backend("a", v4(2), 80), backend("b", v4(3), 80)])],
        )]);
        sync_checked(&mut sync, &mut maps, &t2);
        assert_eq!(read_back(&maps.contents), desired_entries(&t2));
        assert_eq!(maps.contents.backends.len(), 2, "10.0.0.1 is freed");
        assert_eq!(maps.contents.slots.len(), 2, "the old bank is gone");
        let FeKey::V4(k) = FeAddr::Port(FrontendAddr {
            ip: vip,
            port: 80,
            protocol: Protocol::Tcp,
        })
        .key() else {
            panic!()
        };
        assert_eq!(maps.contents.frontends4[&k].bank, 1);
        // Removing the service removes everything it owned.
        sync_checked(&mut sync, &mut maps, &LbTable::default());
        assert_eq!(
            maps.contents,
            MapContents {
                clusters: maps.contents.clusters.clone(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn a_full_map_refuses_the_service_whole_and_keeps_the_others() {
        let caps = Capacities {
            backends: 3,
            ..Capacities::default()
        };
        let mut sync = MapSync::new(caps);
        let mut maps = MemMaps::new(caps);
        let a = IpAddr::V4(Ipv4Addr::new(241, 0, 0, 1));
        let b = IpAddr::V4(Ipv4Addr::new(241, 0, 0, 2));
        let t1 = table(&[(
            "a",
            a,
            vec![(80, vec![backend("x", v4(1), 80), backend("x", v4(2), 80)])],
        )]);
        sync_checked(&mut sync, &mut maps, &t1);
        let before = maps.contents.clone();
        let mut t2 = table(&[
            (
                "a",
                a,
                vec![(80, vec![backend("x", v4(1), 80), backend("x", v4(2), 80)])],
            ),
            (
                "b",
                b,
                vec![(80, vec![backend("x", v4(3), 80), backend("x", v4(4), 80)])],
            ),
        ]);
        let report = sync_checked(&mut sync, &mut maps, &t2);
        assert_eq!(report.failed.len(), 1);
        let msg = report.failed[0].to_string();
        assert!(
            msg.contains("MCS_BACKENDS is full") && msg.contains("ns/b"),
            "{msg}"
        );
        assert_eq!(
            maps.contents, before,
            "nothing of b was written, a is untouched"
        );
        // With room again (a shrinks), the next sync installs b.
        t2 = table(&[
            ("a", a, vec![(80, vec![])]),
            (
                "b",
                b,
                vec![(80, vec![backend("x", v4(3), 80), backend("x", v4(4), 80)])],
            ),
        ]);
        let report = sync_checked(&mut sync, &mut maps, &t2);
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert_eq!(read_back(&maps.contents), desired_entries(&t2));
    }

    #[test]
    fn a_failed_write_is_undone_and_retried_by_the_next_sync() {
        let vip = IpAddr::V6("fd00::1".parse::<Ipv6Addr>().unwrap());
        let b6 = |n: u16| {
            backend(
                "c",
                IpAddr::V6(Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, n)),
                80,
            )
        };
        let t1 = table(&[("v6", vip, vec![(80, vec![b6(1)])])]);
        let t2 = table(&[("v6", vip, vec![(80, vec![b6(1), b6(2), b6(3)])])]);
        let mut sync = MapSync::new(Capacities::default());
        let mut maps = MemMaps::new(Capacities::default());
        sync_checked(&mut sync, &mut maps, &t1);
        for fail_at in 0..6 {
            let before = maps.contents.clone();
            maps.fail_write_in = Some(fail_at);
            let report = sync_checked(&mut sync, &mut maps, &t2);
            assert_eq!(report.failed.len(), 1, "fail_at {fail_at}");
            assert_eq!(maps.contents, before, "fail_at {fail_at}: undone");
        }
        maps.fail_write_in = None;
        let report = sync_checked(&mut sync, &mut maps, &t2);
        assert!(report.failed.is_empty());
        assert_eq!(read_back(&maps.contents), desired_entries(&t2));
    }

    #[test]
    fn adoption_rebuilds_the_mirror_and_clears_unreachable_entries() {
        let vip = IpAddr::V4(Ipv4Addr::new(241, 0, 0, 9));
        let t = table(&[(
            "web",
            vip,
            vec![(80, vec![backend("a", v4(1), 80), backend("b", v4(2), 81)])],
        )]);
        let mut sync = MapSync::new(Capacities::default());
        let mut maps = MemMaps::new(Capacities::default());
        sync_checked(&mut sync, &mut maps, &t);
        // Garbage an interrupted sync could leave: a slot in the inactive bank, an orphan backend.
        maps.contents.slots.insert(
            SlotKey {
                frontend_id: 1,
                bank: 1,
                index: 0,
            },
            1,
        );
        maps.contents
            .backends
            .insert(99, maps.contents.backends[&1]);
        let (mut adopted, cleanup) = MapSync::adopt(Capacities::default(), &maps.contents);
        assert!(cleanup.contains(&MapOp::DelSlot(SlotKey {
            frontend_id: 1,
            bank: 1,
            index: 0
        })));
        assert!(cleanup.contains(&MapOp::DelBackend(99)));
        for op in &cleanup {
            maps.apply(op).unwrap();
        }
        // The adopted mirror agrees with the maps: syncing the same table writes nothing.
        let report = sync_checked(&mut adopted, &mut maps, &t);
        assert_eq!(report.writes, 0, "{report:?}");
    }

    fn arb_table() -> impl Strategy<Value = LbTable> {
        // Up to 4 services, each with one VIP (v4 or v6) and up to 3 ports, each with up to 4
        // backends drawn from a small pool so sets overlap and change.
        let pooled_backend = (0u8..3, 1u8..6, prop::bool::ANY).prop_map(|(c, host, v6)| {
            let ip = if v6 {
                IpAddr::V6(Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, host as u16))
            } else {
                v4(host)
            };
            (c, ip)
        });
        let port = (
            prop::sample::select(vec![80u16, 443, 53]),
            prop::collection::vec(pooled_backend, 0..4),
            prop::bool::ANY,
        );
        let service = (0u8..6, prop::bool::ANY, prop::collection::vec(port, 1..3));
        prop::collection::vec(service, 0..4).prop_map(|services| {
            let mut t = LbTable::default();
            for (n, v6, ports) in services {
                let vip = if v6 {
                    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n as u16))
                } else {
                    IpAddr::V4(Ipv4Addr::new(241, 0, 0, n))
                };
                let name = svc(&format!("s{n}"));
                if t.vips.contains_key(&vip) {
                    continue;
                }
                t.vips.insert(vip, name.clone());
                for (port, backends, affinity) in ports {
                    let mut bs: Vec<Backend> = backends
                        .into_iter()
                        .filter(|(_, ip)| ip.is_ipv4() == vip.is_ipv4())
                        .map(|(c, ip)| backend(["a", "b", "c"][c as usize], ip, port))
                        .collect();
                    bs.sort();
                    bs.dedup();
                    t.frontends.insert(
                        FrontendAddr {
                            ip: vip,
                            port,
                            protocol: Protocol::Tcp,
                        },
                        Frontend {
                            service: name.clone(),
                            port_name: String::new(),
                            affinity_timeout_s: affinity.then_some(30),
                            backends: bs,
                        },
                    );
                }
            }
            t
        })
    }

    proptest! {
        /// Naming only the services that changed gives the same maps as a full sync, with the
        /// same per-write checks.
        #[test]
        fn sync_services_of_the_changed_services_follows_any_sequence(tables in prop::collection::vec(arb_table(), 1..6)) {
            let mut sync = MapSync::new(Capacities::default());
            let mut maps = MemMaps::new(Capacities::default());
            let mut prev = LbTable::default();
            for t in &tables {
                let changed = changed_services(&prev, t);
                let report = sync_services_checked(&mut sync, &mut maps, t, &changed);
                prop_assert!(report.failed.is_empty(), "{:?}", report.failed);
                prop_assert_eq!(read_back(&maps.contents), desired_entries(t));
                // Nothing is left for a full sync to do.
                let again = sync_checked(&mut sync, &mut maps, t);
                prop_assert_eq!(again.writes, 0);
                prev = t.clone();
            }
        }

        /// Any sequence of tables: after each sync the maps hold exactly the table, and no
        /// single write along the way breaks an invariant or shows a reader a mixed set.
        #[test]
        fn maps_follow_any_sequence_of_tables(tables in prop::collection::vec(arb_table(), 1..6)) {
            let mut sync = MapSync::new(Capacities::default());
            let mut maps = MemMaps::new(Capacities::default());
            for t in &tables {
                let report = sync_checked(&mut sync, &mut maps, t);
                prop_assert!(report.failed.is_empty(), "{:?}", report.failed);
                prop_assert_eq!(read_back(&maps.contents), desired_entries(t));
                let (_, cleanup) = MapSync::adopt(Capacities::default(), &maps.contents);
                prop_assert!(cleanup.is_empty(), "sync left garbage: {:?}", cleanup);
            }
            sync_checked(&mut sync, &mut maps, &LbTable::default());
            prop_assert!(maps.contents.frontends4.is_empty() && maps.contents.frontends6.is_empty());
            prop_assert!(maps.contents.slots.is_empty() && maps.contents.backends.is_empty());
            prop_assert!(maps.contents.affinity_match.is_empty() && maps.contents.names.is_empty());
        }

        /// With tight capacities some services are refused, but every service the report does
        /// not list as failed is exactly as desired, and failed ones are exactly as before.
        #[test]
        fn full_maps_refuse_whole_services_only(tables in prop::collection::vec(arb_table(), 1..6), cap in 2u32..8) {
            let caps = Capacities { backends: cap, slots: cap * 2, frontends: cap + 2, clusters: 8 };
            let mut sync = MapSync::new(caps);
            let mut maps = MemMaps::new(caps);
            for t in &tables {
                let before = read_back(&maps.contents);
                let report = sync_checked(&mut sync, &mut maps, t);
                let failed: BTreeSet<NamespacedName> = report.failed.iter().map(|e| match e {
                    SyncError::MapFull { service, .. } | SyncError::Write { service, .. } | SyncError::TooManyBackends { service, .. } => service.clone(),
                }).collect();
                let after = read_back(&maps.contents);
                for (addr, d) in desired_entries(t) {
                    if !failed.contains(&d.service) {
                        prop_assert_eq!(after.get(&addr), Some(&d));
                    }
                }
                for (addr, d) in &before {
                    if failed.contains(&d.service) && !desired_entries(t).contains_key(addr) {
                        prop_assert_eq!(after.get(addr), Some(d));
                    }
                }
            }
        }
    }
}
