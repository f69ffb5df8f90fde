//! `clusterset.local` DNS from the node agent (MCS DNS specification, schema 1.0.0).
//!
//! - [`zone`]: the answers, a pure function of plain [`zone::DnsService`]s, kept per service;
//! - [`dns_service`]: the one adapter from the node's inputs (a ServiceImport and its imported
//!   EndpointSlices) to a [`zone::DnsService`], with the lb table's rules for families, ports
//!   and readiness;
//! - [`DnsZone`]: the zone shared between the node role, which updates it from
//!   `Node::apply` for the services an input change touched, and the server;
//! - [`server`]: the hickory-server edge (UDP and TCP on each `--dns-listen` address).

pub mod server;
pub mod zone;

use std::{
    net::IpAddr,
    sync::{Arc, PoisonError, RwLock, RwLockReadGuard},
};

use tracing::warn;

use crate::{
    lb::ServiceInputs,
    merge::exports::parse_ip,
    model::{
        ClusterId, IpFamily, LABEL_SOURCE_CLUSTER, NamespacedName, ServiceImport, ServiceImportType,
    },
};
use zone::{DnsEndpoint, DnsKind, DnsPort, DnsProtocol, DnsService, ServiceRecords, Zone};

/// The DNS view of one service: its import (the one the lb table uses when a directory lists
/// it twice) and its imported slices. `None` when the service has no import.
///
/// The rules are the lb table's (`lb/mod.rs`): a ClusterSet IP counts when it is `ips[i]` of
/// family `ipFamilies[i]` (each IP's own family when `ipFamilies` is empty), one per family;
/// an endpoint counts from a slice with a valid source cluster whose `addressType` is the
/// address's family; its ports are its slice's (the ports its cluster declares like the
/// import); a nil `ready` is ready. DNS is stricter in one place: an IP beyond the listed
/// families is left out, so a family is answered only when the import lists it.
pub fn dns_service(service: &NamespacedName, inputs: ServiceInputs<'_>) -> Option<DnsService> {
    // The lb table keeps the import with the smallest JSON of several with one name.
    let si: &ServiceImport = match inputs.imports {
        [] => return None,
        [one] => one,
        several => several
            .iter()
            .min_by_key(|si| serde_json::to_string(&***si).unwrap_or_default())?,
    };
    let ports = si
        .spec
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
        namespace: service.namespace.clone(),
        name: service.name.clone(),
        kind: DnsKind::Headless,
        ports,
        endpoints: Vec::new(),
    };
    if si.spec.type_ != ServiceImportType::Headless {
        let mut ips: Vec<IpAddr> = Vec::new();
        for (i, raw) in si.spec.ips.iter().enumerate() {
            let Some(ip) = parse_ip(raw) else { continue };
            let family = IpFamily::of(&ip);
            let listed = match si.spec.ip_families.get(i) {
                Some(declared) => *declared == family,
                None => si.spec.ip_families.is_empty(),
            };
            if listed && !ips.iter().any(|v| IpFamily::of(v) == family) {
                ips.push(ip);
            }
        }
        out.kind = DnsKind::ClusterSetIp { ips };
        return Some(out);
    }
    for slice in inputs.slices {
        let Some(cluster) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SOURCE_CLUSTER))
            .filter(|c| ClusterId::new(c.as_str()).is_ok())
        else {
            continue;
        };
        let Ok(family) = slice.address_type.parse::<IpFamily>() else {
            continue;
        };
        let ports: Vec<DnsPort> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(DnsPort {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    protocol: DnsProtocol::parse(p.protocol.as_deref())?,
                    port: p
                        .port
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|n| *n > 0)?,
                })
            })
            .collect();
        for ep in &slice.endpoints {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            for ip in ep.addresses.iter().filter_map(|a| parse_ip(a)) {
                if IpFamily::of(&ip) == family {
                    out.endpoints.push(DnsEndpoint {
                        cluster: cluster.clone(),
                        hostname: ep.hostname.clone(),
                        ip,
                        ready,
                        ports: ports.clone(),
                    });
                }
            }
        }
    }
    Some(out)
}

/// The DNS names of a service port, for `explain` and `inspect`:
/// `<svc>.<ns>.svc.clusterset.local.` and, for a named port,
/// `_<port>._<protocol>.<svc>.<ns>.svc.clusterset.local.` (`protocol` as Kubernetes spells it).
pub fn dns_names(namespace: &str, name: &str, port_name: &str, protocol: &str) -> Vec<String> {
    let port = DnsProtocol::parse(Some(protocol)).map(|protocol| DnsPort {
        name: Some(port_name.to_owned()).filter(|n| !n.is_empty()),
        protocol,
        port: 0,
    });
    zone::port_names(namespace, name, port.as_ref())
}

/// How the DNS server is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsOptions {
    /// Where to listen, on UDP and TCP each. Empty: no DNS server.
    pub listen: Vec<std::net::SocketAddr>,
    /// TTL of every answer, in seconds.
    pub ttl: u32,
}

impl Default for DnsOptions {
    fn default() -> Self {
        DnsOptions {
            listen: Vec::new(),
            ttl: zone::DEFAULT_TTL,
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

    /// Rebuilds `services` from `inputs` and swaps them in; with `full`, every service not in
    /// `services` is dropped first (the first sync, after the initial lists). Marks the zone
    /// ready: the node calls this only once its inputs are complete.
    pub fn sync<'a, 'n>(
        &self,
        services: impl IntoIterator<Item = &'n NamespacedName>,
        inputs: impl Fn(&NamespacedName) -> ServiceInputs<'a>,
        full: bool,
    ) {
        let built: Vec<(zone::ServiceKey, Option<ServiceRecords>)> = services
            .into_iter()
            .map(|s| {
                let records = dns_service(s, inputs(s)).and_then(|svc| {
                    zone::build_service(&svc)
                        .inspect_err(|e| warn!(service = %s, "no DNS records: {e}"))
                        .ok()
                });
                for why in records.iter().flat_map(|r| &r.skipped) {
                    warn!(service = %s, "DNS: {why}");
                }
                ((s.namespace.clone(), s.name.clone()), records)
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
    let server = server::serve(&options.listen, zone.clone())?;
    Ok(Some((zone, server)))
}
