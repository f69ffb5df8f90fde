//! `clusterset.local` DNS from the node agent (MCS DNS specification, schema 1.0.0).
//!
//! - [`zone`]: the answers, a pure function of plain [`zone::DnsService`]s, kept per service;
//! - [`dns_service`]: the one adapter from the node's inputs (a ServiceImport and its imported
//!   EndpointSlices) to a [`zone::DnsService`], with the lb table's rules for families, ports
//!   and readiness;
//! - [`DnsZone`]: the zone shared between the node role, which updates it from
//!   `Node::apply` for the services an input change touched, and the server;
//! - [`server`]: the hickory-server edge (UDP and TCP on each `--dns-listen` address);
//! - `tcp`: our TCP accept loop, with the connection caps; each connection is framed and
//!   timed out by hickory and answered by the same handler as UDP.

pub mod server;
mod tcp;

pub use tcp::DEFAULT_MAX_TCP_CONNECTIONS;
pub mod zone;

use std::{
    net::IpAddr,
    sync::{Arc, PoisonError, RwLock, RwLockReadGuard},
};

use tracing::warn;

use dataplane_core::{
    lb::ServiceInputs,
    model::{
        IpFamily, NamespacedName, ServiceImportType,
        records::{ImportRecord, PortProtocol},
    },
    policy::AddressPolicy,
};
use zone::{DnsEndpoint, DnsKind, DnsPort, DnsProtocol, DnsService, ServiceRecords, Zone};

/// The service each programmed ClusterSet IP belongs to (the lb table's `vips`).
pub type VipOwners = std::collections::BTreeMap<IpAddr, NamespacedName>;

/// The DNS view of one service: its import (the one the lb table uses when a directory lists
/// it twice) and its imported slices. `None` when the service has no import.
///
/// The rules are the lb table's (`lb/mod.rs`): a ClusterSet IP counts when it is `ips[i]` of
/// family `ipFamilies[i]` (each IP's own family when `ipFamilies` is empty), one per family;
/// an endpoint counts from a slice of the address's family; its ports are its slice's (the
/// ports its cluster declares like the import); a nil `ready` is ready. DNS is stricter in one
/// place: an IP beyond the listed families is left out, so a family is answered only when the
/// import lists it. A ClusterSet IP or an endpoint address that `policy` refuses is left out
/// too, as the lb table leaves it out: no name leads a client to an address the datapath
/// refuses (the cloud metadata service, loopback, an IP outside the ClusterSet CIDRs). A
/// ClusterSet IP that the lb table gave another service (`vips`: two imports listing one IP)
/// is left out too: the name would lead to that service's backends.
pub fn dns_service(
    service: &NamespacedName,
    inputs: ServiceInputs<'_>,
    policy: &AddressPolicy,
    vips: &VipOwners,
) -> Option<DnsService> {
    let mut imports = inputs.imports.iter().filter_map(|c| c.record());
    let first = imports.next()?;
    let rest: Vec<&ImportRecord> = imports.collect();
    // The lb table keeps the import with the smallest JSON of several with one name.
    let si = if rest.is_empty() {
        first
    } else {
        std::iter::once(first)
            .chain(rest)
            .min_by_key(|r| serde_json::to_string(&r.to_k8s()).unwrap_or_default())?
    };
    let ports = si
        .ports
        .iter()
        .filter_map(|p| {
            Some(DnsPort {
                name: p.name.clone().filter(|n| !n.is_empty()),
                protocol: DnsProtocol::parse(p.protocol.as_deref())?,
                port: u16::try_from(p.port).ok().filter(|n| *n > 0)?,
            })
        })
        .collect();
    let mut out = DnsService {
        namespace: service.namespace.to_string(),
        name: service.name.to_string(),
        kind: DnsKind::Headless,
        ports,
        endpoints: Vec::new(),
    };
    if si.type_ != ServiceImportType::Headless {
        let mut ips: Vec<IpAddr> = Vec::new();
        for (i, &ip) in si.ips.iter().enumerate() {
            let family = IpFamily::of(&ip);
            let listed = match si.ip_families.get(i) {
                Some(declared) => *declared == family,
                None => si.ip_families.is_empty(),
            };
            if listed
                && policy.check_vip(ip).is_ok()
                && vips.get(&ip).is_none_or(|owner| owner == service)
                && !ips.iter().any(|v| IpFamily::of(v) == family)
            {
                ips.push(ip);
            }
        }
        out.kind = DnsKind::ClusterSetIp { ips };
        return Some(out);
    }
    for slice in inputs.slices.iter().filter_map(|c| c.record()) {
        let ports: Vec<DnsPort> = slice
            .ports
            .iter()
            .map(|p| DnsPort {
                name: Some(p.name.to_string()).filter(|n| !n.is_empty()),
                protocol: match p.protocol {
                    PortProtocol::Tcp => DnsProtocol::Tcp,
                    PortProtocol::Udp => DnsProtocol::Udp,
                    PortProtocol::Sctp => DnsProtocol::Sctp,
                },
                port: p.port,
            })
            .collect();
        for ep in slice.endpoints.iter() {
            for ip in ep
                .addresses()
                .filter(|ip| policy.check_backend(&slice.cluster, *ip).is_ok())
            {
                out.endpoints.push(DnsEndpoint {
                    cluster: slice.cluster.to_string(),
                    hostname: ep.hostname().map(str::to_owned),
                    ip,
                    ready: ep.endpoint.conditions.is_ready(),
                    ports: ports.clone(),
                });
            }
        }
    }
    Some(out)
}

/// How the DNS server is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsOptions {
    /// Where to listen, on UDP and TCP each. Empty: no DNS server.
    pub listen: Vec<std::net::SocketAddr>,
    /// TTL of every answer, in seconds.
    pub ttl: u32,
    /// The most TCP connections open at once (an eighth of them from one client address).
    pub max_tcp_connections: usize,
}

impl Default for DnsOptions {
    fn default() -> Self {
        DnsOptions {
            listen: Vec::new(),
            ttl: zone::DEFAULT_TTL,
            max_tcp_connections: DEFAULT_MAX_TCP_CONNECTIONS as usize,
        }
    }
}

/// The zone, shared by the node role (the writer) and the server (the readers). Records are
/// built outside the lock; the lock is held for the splice and for one lookup.
#[derive(Clone, Debug)]
pub struct DnsZone(Arc<RwLock<Zone>>);

impl DnsZone {
    pub fn new(ttl: u32) -> DnsZone {
        DnsZone(Arc::new(RwLock::new(Zone::new(ttl))))
    }

    /// Reads the zone (a poisoned lock is still read: the zone is never left half-spliced).
    pub fn read(&self) -> RwLockReadGuard<'_, Zone> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Rebuilds `services` from `inputs` and swaps them in, with only the addresses `policy`
    /// allows; with `full`, every service not in `services` is dropped first (the first sync,
    /// after the initial lists). Marks the zone ready: the node calls this only once its
    /// inputs are complete.
    pub fn sync<'a, 'n>(
        &self,
        services: impl IntoIterator<Item = &'n NamespacedName>,
        inputs: impl Fn(&NamespacedName) -> ServiceInputs<'a>,
        policy: &AddressPolicy,
        vips: &VipOwners,
        full: bool,
    ) {
        let built: Vec<(zone::ServiceKey, Option<ServiceRecords>)> = services
            .into_iter()
            .map(|s| {
                let records = dns_service(s, inputs(s), policy, vips).and_then(|svc| {
                    zone::build_service(&svc)
                        .inspect_err(|e| warn!(service = %s, "no DNS records: {e}"))
                        .ok()
                });
                for why in records.iter().flat_map(|r| &r.skipped) {
                    warn!(service = %s, "DNS: {why}");
                }
                ((s.namespace.to_string(), s.name.to_string()), records)
            })
            .collect();
        let mut zone = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if full {
            zone.clear();
        }
        for (key, records) in built {
            zone.splice(key, records);
        }
        zone.bump_serial();
        zone.set_ready();
    }
}

/// Starts the DNS server when `options` lists addresses: the zone to hand to the node role
/// (`Node::with_dns`) and the server, which serves (from threads of its own) until dropped.
pub fn start(
    options: &DnsOptions,
) -> Result<Option<(DnsZone, server::DnsServer)>, server::DnsServerError> {
    if options.listen.is_empty() {
        return Ok(None);
    }
    let zone = DnsZone::new(options.ttl);
    let server = server::serve(&options.listen, zone.clone(), options.max_tcp_connections)?;
    Ok(Some((zone, server)))
}
