//! The map entries the lb table wants, service by service: a pure function of the table (and,
//! backwards, of what the maps hold, for `inspect` and the tests).
//!
//! A service owns its VIPs; each VIP has one frontend entry per service port (its backends in
//! slot order) and one wildcard entry that refuses every other port. The writer
//! ([`super::sync::MapSync`]) takes these one service at a time, so the node can hand them in
//! as it builds them, without a second copy of the table.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    hash::{Hash, Hasher},
    net::IpAddr,
    sync::Arc,
};

use dataplane_core::{
    lb::{Frontend, FrontendAddr, LbTable, Protocol, ServicePart},
    model::NamespacedName,
};
use dataplane_ebpf::{
    FRONTEND_F_AFFINITY, FRONTEND_F_INLINE, FRONTEND_F_WILDCARD, FrontendKey4, FrontendKey6, Slot,
};
use serde::Serialize;

use super::{
    convert::{
        addr_from_words, ip_proto, ip4_from_word, ip4_word, ip6_from_words, ip6_words,
        name_from_bytes, port_from_word, port_word, protocol_of,
    },
    maps::{FeKey, MapContents},
};

/// A frontend map entry: a service port, or the per-VIP wildcard that refuses other ports.
/// Ordered so that a VIP's port entries come before its wildcard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum FeAddr {
    Port(FrontendAddr),
    Wildcard(IpAddr),
}

impl FeAddr {
    /// The port and protocol as `inspect` and the metrics show them: 0 and `*` for the
    /// wildcard.
    pub fn port_and_protocol(&self) -> (u16, String) {
        match self {
            FeAddr::Port(p) => (p.port, p.protocol.to_string()),
            FeAddr::Wildcard(_) => (0, "*".to_owned()),
        }
    }

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

/// One backend of a frontend, as a slot holds it (the protocol is the frontend's).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DesiredBackend {
    pub ip: IpAddr,
    pub port: u16,
    /// The member cluster, shared with the lb table.
    #[serde(serialize_with = "serialize_str")]
    pub cluster: Arc<str>,
}

fn serialize_str<S: serde::Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v)
}

/// A frontend entry as the maps should hold it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DesiredFrontend {
    pub port_name: String,
    pub flags: u8,
    pub affinity_timeout_s: u32,
    /// In slot order.
    pub backends: Vec<DesiredBackend>,
}

impl DesiredFrontend {
    /// The VIP's wildcard entry: refuses every port the service does not declare.
    pub fn wildcard() -> Self {
        DesiredFrontend {
            port_name: String::new(),
            flags: FRONTEND_F_WILDCARD,
            affinity_timeout_s: 0,
            backends: Vec::new(),
        }
    }

    /// The entry of one frontend of the table. The lb table never mixes families; the filter
    /// keeps the ABI honest (a slot's address is read in the frontend's family).
    pub fn of(addr: &FrontendAddr, fe: &Frontend) -> Self {
        let (flags, affinity_timeout_s) = match fe.affinity_timeout_s {
            Some(t) => (FRONTEND_F_AFFINITY, t),
            None => (0, 0),
        };
        DesiredFrontend {
            port_name: fe.port_name.clone(),
            flags,
            affinity_timeout_s,
            backends: fe
                .backends
                .iter()
                .filter(|b| b.ip.is_ipv4() == addr.ip.is_ipv4())
                .map(|b| DesiredBackend {
                    ip: b.ip,
                    port: b.port,
                    cluster: b.cluster.shared(),
                })
                .collect(),
        }
    }

    /// A 64-bit digest of the backends, in slot order. The writer keeps the digest instead of
    /// the backends (a collision, odds 2^-64 per change, would leave one change of a backend
    /// set unwritten until the set changes again).
    pub fn digest(&self) -> u64 {
        // SipHash with fixed keys: the same in every run, which adoption relies on (it digests
        // what the maps hold and compares it with the digest of the table).
        let mut h = std::hash::DefaultHasher::new();
        self.backends.hash(&mut h);
        h.finish()
    }
}

/// Everything one service wants in the maps: its frontend entries, sorted by address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredService {
    pub service: NamespacedName,
    pub frontends: Vec<(FeAddr, DesiredFrontend)>,
}

impl DesiredService {
    /// The entries of a service's part of the table ([`LbState::update_parts`]): its
    /// frontends and each VIP's wildcard. The part is consumed, so its backends are freed as
    /// the writer takes one service after another.
    ///
    /// [`LbState::update_parts`]: dataplane_core::lb::LbState::update_parts
    pub fn from_part(service: NamespacedName, part: ServicePart) -> Self {
        let mut frontends: Vec<(FeAddr, DesiredFrontend)> = part
            .frontends
            .iter()
            .map(|(addr, fe)| (FeAddr::Port(*addr), DesiredFrontend::of(addr, fe)))
            .chain(
                part.vips
                    .iter()
                    .map(|&ip| (FeAddr::Wildcard(ip), DesiredFrontend::wildcard())),
            )
            .collect();
        frontends.sort_by_key(|a| a.0);
        DesiredService { service, frontends }
    }
}

/// The entries of one service: the frontends of each VIP it owns (a range of the table, which
/// is ordered by IP first) and each VIP's wildcard.
fn service_entries(table: &LbTable, service: &NamespacedName, vips: &[IpAddr]) -> DesiredService {
    let mut frontends = Vec::new();
    for &ip in vips {
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
        for (addr, fe) in table.frontends.range(lo..=hi) {
            if fe.service == *service {
                frontends.push((FeAddr::Port(*addr), DesiredFrontend::of(addr, fe)));
            }
        }
        frontends.push((FeAddr::Wildcard(ip), DesiredFrontend::wildcard()));
    }
    frontends.sort_by_key(|a| a.0);
    DesiredService {
        service: service.clone(),
        frontends,
    }
}

/// The services of the table (all, or those in `only`), built one at a time as the iterator
/// is drained. A frontend belongs to the service that owns its VIP; one whose VIP is not its
/// service's (`lb::build` never makes one) is left out.
pub fn services<'t>(
    table: &'t LbTable,
    only: Option<&'t BTreeSet<NamespacedName>>,
) -> impl Iterator<Item = DesiredService> + 't {
    let mut vips: BTreeMap<&NamespacedName, Vec<IpAddr>> = BTreeMap::new();
    for (ip, owner) in &table.vips {
        if only.is_none_or(|only| only.contains(owner)) {
            vips.entry(owner).or_default().push(*ip);
        }
    }
    vips.into_iter()
        .map(move |(service, ips)| service_entries(table, service, &ips))
}

/// Every entry the table wants, by address, with its service.
pub fn entries(table: &LbTable) -> BTreeMap<FeAddr, (NamespacedName, DesiredFrontend)> {
    services(table, None)
        .flat_map(|s| {
            let service = s.service;
            s.frontends
                .into_iter()
                .map(move |(addr, d)| (addr, (service.clone(), d)))
        })
        .collect()
}

/// Decodes what the maps hold into the desired form (what a reader of the datapath would see),
/// for `inspect` and for tests that compare the maps with the lb table. A frontend whose range
/// a reader would refuse (a slot without the frontend's id) is shown with no backends.
pub fn read_back(contents: &MapContents) -> BTreeMap<FeAddr, (NamespacedName, DesiredFrontend)> {
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
        let family = match addr.ip() {
            IpAddr::V4(_) => dataplane_ebpf::AF_INET,
            IpAddr::V6(_) => dataplane_ebpf::AF_INET6,
        };
        let slots = contents.range(fe).unwrap_or_default();
        let cluster = |slot: &Slot| {
            clusters
                .get(&u32::from(slot.cluster))
                .cloned()
                .unwrap_or_else(|| "".into())
        };
        let backends = if fe.flags & FRONTEND_F_INLINE != 0 {
            // What the programs read: the entry's copies that carry its id (the cluster,
            // which they do not need, from the slots).
            fe.inline
                .iter()
                .take(usize::from(fe.count))
                .enumerate()
                .filter(|(_, b)| b.frontend_tag == dataplane_ebpf::frontend_tag(fe.id))
                .map(|(i, b)| DesiredBackend {
                    ip: IpAddr::V4(ip4_from_word(b.addr)),
                    port: port_from_word(b.port),
                    cluster: slots.get(i).map_or_else(|| "".into(), cluster),
                })
                .collect()
        } else {
            slots
                .iter()
                .filter_map(|slot| {
                    Some(DesiredBackend {
                        ip: addr_from_words(slot.addr, family)?,
                        port: port_from_word(slot.port),
                        cluster: cluster(slot),
                    })
                })
                .collect()
        };
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
            (
                service,
                DesiredFrontend {
                    port_name,
                    flags: fe.flags & !FRONTEND_F_INLINE,
                    affinity_timeout_s: fe.affinity_timeout_s,
                    backends,
                },
            ),
        );
    }
    out
}
