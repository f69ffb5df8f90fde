//! The load-balancing table: a pure function from the local cluster's ServiceImports and
//! imported EndpointSlices to frontends and their ordered backends.
//!
//! This implements ARCHITECTURE.md §4. For a ServiceImport S, merged port P and family F in
//! `S.spec.ipFamilies`, the frontend is (S's ClusterSet IP of family F, P.port, P.protocol), and
//! its backends are the endpoints that
//! - are in an imported EndpointSlice of S (label `multicluster.kubernetes.io/service-name`, same
//!   namespace) from cluster C (label `multicluster.kubernetes.io/source-cluster`) whose
//!   `addressType` is F;
//! - sit in a slice that carries a port with P's name and protocol. The merge writes into C's
//!   slices only the ports that C's Service declares identically to a merged port, so this is the
//!   "C declares P" test. Unnamed ports match unnamed ports only, never everything;
//! - are ready, or, when no endpoint of the frontend is ready, serving and terminating;
//!
//! and the backend port is that slice port's number. Two Service ports that share a targetPort
//! are two slice ports with different names, so each keeps its backends.
//!
//! Problems in the input never abort the build: the offending object or port is skipped and
//! reported in [`LbTable::warnings`], and every other service is built as usual.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fmt,
    net::IpAddr,
};

use serde::Serialize;

use crate::model::{
    ClusterId, DEFAULT_AFFINITY_TIMEOUT_S, EndpointSlice, IpFamily, NamespacedName, ServiceImport,
    ServiceImportType,
    records::{Converted, Endpoint, ImportRecord, ImportedSlice, PortProtocol, Record},
};
use crate::policy::{AddressPolicy, AddressUse, Refusal};

/// An L4 protocol the socket load balancer translates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    /// TCP, as in `protocol: TCP` or no protocol at all.
    Tcp,
    /// UDP, as in `protocol: UDP`.
    Udp,
}

impl Protocol {
    /// Parses a Kubernetes protocol; `None` means TCP. SCTP and unknown values are not
    /// translated at socket level and give `Err` with the value.
    pub fn parse(p: Option<&str>) -> Result<Self, String> {
        match p.unwrap_or("TCP") {
            "TCP" => Ok(Protocol::Tcp),
            "UDP" => Ok(Protocol::Udp),
            other => Err(other.to_owned()),
        }
    }
}

impl Protocol {
    /// The Kubernetes port protocol it is.
    pub fn port_protocol(self) -> PortProtocol {
        match self {
            Protocol::Tcp => PortProtocol::Tcp,
            Protocol::Udp => PortProtocol::Udp,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        })
    }
}

/// Where clients connect: a ClusterSet IP, a port and a protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct FrontendAddr {
    /// The ClusterSet IP.
    pub ip: IpAddr,
    /// The service port clients connect to.
    pub port: u16,
    /// The protocol; one IP and port may serve TCP and UDP as two frontends.
    pub protocol: Protocol,
}

impl fmt::Display for FrontendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}/{}", self.port, self.protocol),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}/{}", self.port, self.protocol),
        }
    }
}

/// One endpoint a frontend forwards to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Backend {
    /// The member cluster the endpoint runs in.
    pub cluster: ClusterId,
    /// The endpoint's address, of the frontend's family.
    pub ip: IpAddr,
    /// The port connections go to: the imported slice's number for the frontend's port.
    pub port: u16,
}

/// A frontend and what it forwards to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Frontend {
    /// The import the frontend belongs to.
    pub service: NamespacedName,
    /// The merged port's name ("" for an unnamed port).
    pub port_name: String,
    /// ClientIP affinity timeout in seconds, when the import has ClientIP affinity.
    pub affinity_timeout_s: Option<u32>,
    /// Sorted by (cluster, ip, port), without duplicates. Empty means "refuse".
    pub backends: Vec<Backend>,
}

/// Something in the input that was skipped, with the object it concerns.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct LbWarning {
    /// `ServiceImport ns/name` or `EndpointSlice ns/name`.
    pub object: String,
    /// What was wrong, and what was skipped because of it.
    pub message: String,
}

impl fmt::Display for LbWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}

/// The whole desired load-balancing state of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LbTable {
    /// Every frontend of every import, by address.
    pub frontends: BTreeMap<FrontendAddr, Frontend>,
    /// Every ClusterSet IP, with the service that owns it. Ports a VIP does not serve are refused.
    pub vips: BTreeMap<IpAddr, NamespacedName>,
    /// What the build skipped, sorted, without duplicates.
    pub warnings: Vec<LbWarning>,
}

impl LbTable {
    /// The services present in the table (owners of a VIP).
    pub fn services(&self) -> BTreeSet<&NamespacedName> {
        self.vips.values().collect()
    }

    /// How many backends its frontends list in all (an endpoint serving two ports counts
    /// twice).
    pub fn backend_count(&self) -> usize {
        self.frontends.values().map(|f| f.backends.len()).sum()
    }
}

/// The slices of one service, in cluster order (stable, so equal inputs give equal tables).
fn by_cluster<'a>(slices: impl IntoIterator<Item = &'a ImportedSlice>) -> Vec<&'a ImportedSlice> {
    let mut out: Vec<&ImportedSlice> = slices.into_iter().collect();
    out.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    out
}

/// Builds the table from the API objects (what `explain` does from a node directory):
/// converts them into records and builds every service. The result depends only on the set of
/// inputs, not on their order.
///
/// ```
/// use dataplane_core::lb;
/// use dataplane_core::model::{EndpointSlice, ServiceImport};
///
/// let import: ServiceImport = serde_yaml::from_str(
///     "metadata: {name: web, namespace: demo}
/// spec: {type: ClusterSetIP, ips: [241.0.0.10], ports: [{port: 80}]}",
/// )
/// .unwrap();
/// let slice: EndpointSlice = serde_yaml::from_str(
///     "metadata:
///   name: web-c1
///   namespace: demo
///   labels:
///     multicluster.kubernetes.io/service-name: web
///     multicluster.kubernetes.io/source-cluster: c1
/// addressType: IPv4
/// ports: [{port: 8080}]
/// endpoints: [{addresses: [10.0.0.1]}]",
/// )
/// .unwrap();
///
/// let table = lb::build(&[import], &[slice]);
/// let (addr, frontend) = table.frontends.iter().next().unwrap();
/// assert_eq!(addr.to_string(), "241.0.0.10:80/TCP");
/// assert_eq!(frontend.backends[0].ip.to_string(), "10.0.0.1");
/// assert_eq!(frontend.backends[0].port, 8080);
/// ```
pub fn build(imports: &[ServiceImport], slices: &[EndpointSlice]) -> LbTable {
    build_with(imports, slices, &AddressPolicy::default())
}

/// [`build`] under `policy` (the node's: its ClusterSet CIDRs and backend rules).
pub fn build_with(
    imports: &[ServiceImport],
    slices: &[EndpointSlice],
    policy: &AddressPolicy,
) -> LbTable {
    let names = crate::model::Interner::new();
    let mut unfiled = Vec::new();
    let mut filed = Vec::with_capacity(slices.len());
    for slice in slices {
        let converted = inputs::slice_input(slice, &names);
        if converted.service().is_none() {
            // A slice of no service: reported here, as no service's part carries it.
            unfiled.extend(warnings_of(&converted, "EndpointSlice"));
        } else {
            filed.push(converted);
        }
    }
    let imports = imports
        .iter()
        .map(|si| inputs::import_input(si, &names))
        .collect();
    build_inputs(imports, filed, unfiled, policy)
}

/// Builds the table from records (what `plan` does with a merge's output), under the default
/// policy.
pub fn build_records(imports: &[ImportRecord], slices: &[ImportedSlice]) -> LbTable {
    build_records_with(imports, slices, &AddressPolicy::default())
}

/// [`build_records`] under `policy`.
pub fn build_records_with(
    imports: &[ImportRecord],
    slices: &[ImportedSlice],
    policy: &AddressPolicy,
) -> LbTable {
    build_inputs(
        imports.iter().cloned().map(inputs::record_input).collect(),
        slices.iter().cloned().map(inputs::record_input).collect(),
        Vec::new(),
        policy,
    )
}

/// Builds the table from the records a node files, shared rather than copied (what a daemon
/// does with a merge's records, [`crate::merge::MergeState::node_inputs`]).
pub fn build_shared(imports: Vec<inputs::ImportInput>, slices: Vec<inputs::SliceInput>) -> LbTable {
    build_inputs(imports, slices, Vec::new(), &AddressPolicy::default())
}

fn build_inputs(
    imports: Vec<inputs::ImportInput>,
    slices: Vec<inputs::SliceInput>,
    warnings: Vec<LbWarning>,
    policy: &AddressPolicy,
) -> LbTable {
    let mut index = inputs::InputIndex::default();
    let mut dirty = BTreeSet::new();
    index.apply(inputs::Change::Snapshot { imports, slices }, &mut dirty);
    let mut state = LbState::new(std::sync::Arc::new(policy.clone()));
    state.update(index.services(), |s| index.inputs(s));
    let mut table = state.into_table();
    table.warnings.extend(warnings);
    table.warnings.sort();
    table.warnings.dedup();
    table
}

/// The warnings of a converted object, named `kind namespace/name`.
fn warnings_of<'a, T: Record>(
    c: &'a Converted<T>,
    kind: &str,
) -> impl Iterator<Item = LbWarning> + 'a {
    // Named only when there is something to say: nearly every object has no warning.
    let object = if c.warnings.is_empty() {
        String::new()
    } else {
        format!("{kind} {}", c.id())
    };
    c.warnings.iter().map(move |message| LbWarning {
        object: object.clone(),
        message: message.clone(),
    })
}

/// A slice's port numbers by (name, protocol).
type SlicePorts<'a> = HashMap<(&'a str, PortProtocol), u16>;

/// The frontends and VIPs of one import (the one kept for its namespace/name), given the
/// slices of its service in cluster order. A VIP already in `claimed` (claimed by an import
/// earlier in sorted order) is skipped; the VIPs this import gets are added to `claimed` and
/// returned, and every frontend is handed to `emit`. `refused_backends` are the endpoints of
/// `service_slices` (by cluster and address) that the policy refuses.
#[allow(clippy::too_many_arguments)] // the build's scratch state, threaded through
fn build_import<'s>(
    si: &ImportRecord,
    service_slices: &[&'s ImportedSlice],
    policy: &AddressPolicy,
    refused_backends: &[(ClusterId, IpAddr)],
    refused: &mut Vec<(AddressUse, Refusal)>,
    claimed: &mut BTreeMap<IpAddr, NamespacedName>,
    warnings: &mut Vec<LbWarning>,
    serving: &mut Vec<(&'s ImportedSlice, u16)>,
    mut emit: impl FnMut(FrontendAddr, Frontend),
) -> Vec<(IpFamily, IpAddr)> {
    if si.type_ == ServiceImportType::Headless {
        return Vec::new();
    }
    let service = &si.service;
    let mut warn = |message: String| {
        warnings.push(LbWarning {
            object: format!("ServiceImport {service}"),
            message,
        })
    };
    let affinity_timeout_s = (si.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        si.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_S)
    });
    // ips[i] is the VIP of ipFamilies[i]; when ipFamilies is empty each IP's own family counts.
    let mut vips: Vec<(IpFamily, IpAddr)> = Vec::new();
    for (i, &ip) in si.ips.iter().enumerate() {
        let family = IpFamily::of(&ip);
        if let Some(declared) = si.ip_families.get(i)
            && *declared != family
        {
            warn(format!(
                "ips[{i}] {ip} is not of ipFamilies[{i}] {declared}; skipped"
            ));
            continue;
        }
        if let Err(why) = policy.check_vip(ip) {
            warn(format!("ClusterSet IP {ip} is {why}; not programmed"));
            refused.push((AddressUse::ClusterSetIp, why));
            continue;
        }
        if vips.iter().any(|(f, _)| *f == family) {
            warn(format!("a second {family} ClusterSet IP {ip}; skipped"));
            continue;
        }
        if let Some(owner) = claimed.get(&ip) {
            warn(format!(
                "ClusterSet IP {ip} already belongs to {owner}; skipped"
            ));
            continue;
        }
        vips.push((family, ip));
    }

    // (name, protocol, number). An import has a handful of ports, so a scan of the list finds
    // the (number, protocol) listed twice; a set does beyond that (a hand-written import may
    // list thousands).
    let mut ports: Vec<(&str, Protocol, u16)> = Vec::with_capacity(si.ports.len());
    let mut listed: Option<HashSet<(Protocol, u16)>> = (si.ports.len() > 16).then(Default::default);
    for p in &si.ports {
        let port_name = p.name_or_empty();
        let protocol = match Protocol::parse(p.protocol.as_deref()) {
            Ok(proto) => proto,
            Err(other) => {
                warn(format!(
                    "port {port_name:?}: protocol {other} is not load-balanced at socket level"
                ));
                continue;
            }
        };
        let Some(number) = u16::try_from(p.port).ok().filter(|n| *n > 0) else {
            warn(format!("port {port_name:?}: {} is not in 1..65535", p.port));
            continue;
        };
        let twice = match &mut listed {
            Some(set) => !set.insert((protocol, number)),
            None => ports
                .iter()
                .any(|(_, pr, n)| *n == number && *pr == protocol),
        };
        if twice {
            warn(format!("port {number}/{protocol} is listed twice; skipped"));
            continue;
        }
        ports.push((port_name, protocol, number));
    }

    if vips.is_empty() {
        return vips;
    }
    // Each slice's port numbers by (name, protocol), for a slice with many ports (the API
    // allows 20,000): a scan of each slice per frontend would be quadratic in the ports.
    let port_maps: Option<Vec<Option<SlicePorts<'_>>>> =
        service_slices.iter().any(|s| s.ports.len() > 16).then(|| {
            service_slices
                .iter()
                .map(|s| {
                    (s.ports.len() > 16).then(|| {
                        let mut map = HashMap::with_capacity(s.ports.len());
                        for p in s.ports.iter() {
                            // The first of a (name, protocol) listed twice, as the scan finds it.
                            map.entry((&*p.name, p.protocol)).or_insert(p.port);
                        }
                        map
                    })
                })
                .collect()
        });
    for &(family, vip) in &vips {
        claimed.insert(vip, service.clone());
        for (port_name, protocol, number) in &ports {
            let key = (*port_name, protocol.port_protocol());
            serving.clear();
            serving.extend(
                service_slices
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.family == family)
                    .filter_map(|(i, s)| {
                        let map = port_maps.as_ref().and_then(|maps| maps[i].as_ref());
                        let port = match map {
                            Some(map) => map.get(&key).copied(),
                            None => s.port(key.0, key.1),
                        };
                        Some((*s, port?))
                    }),
            );
            // Ready endpoints; only when none is ready, the serving and terminating ones.
            let allowed = |s: &ImportedSlice, ep: &Endpoint| {
                !refused_backends
                    .iter()
                    .any(|(cluster, ip)| *ip == ep.addr && *cluster == s.cluster)
            };
            let any_ready = serving.iter().any(|(s, _)| {
                s.endpoints
                    .list()
                    .any(|ep| ep.conditions.is_ready() && allowed(s, &ep))
            });
            let mut backends: Vec<Backend> =
                Vec::with_capacity(serving.iter().map(|(s, _)| s.endpoints.len()).sum());
            for (slice, target) in serving.iter() {
                for ep in slice.endpoints.list() {
                    let usable = allowed(slice, &ep)
                        && if any_ready {
                            ep.conditions.is_ready()
                        } else {
                            ep.conditions.is_serving_terminating()
                        };
                    if usable {
                        backends.push(Backend {
                            cluster: slice.cluster.clone(),
                            ip: ep.addr,
                            port: *target,
                        });
                    }
                }
            }
            // The same endpoint may be listed by two slices.
            backends.sort_unstable();
            backends.dedup();
            emit(
                FrontendAddr {
                    ip: vip,
                    port: *number,
                    protocol: *protocol,
                },
                Frontend {
                    service: service.clone(),
                    port_name: (*port_name).to_owned(),
                    affinity_timeout_s,
                    backends,
                },
            );
        }
    }
    vips
}

mod incremental;
pub mod inputs;

pub use incremental::{LbState, Parts, ServiceInputs, ServicePart, build_services};

#[cfg(test)]
mod tests;
