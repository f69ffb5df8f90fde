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
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use foldhash::{HashMap, HashMapExt};
use serde::Serialize;

use crate::model::{
    ClusterId, DEFAULT_AFFINITY_TIMEOUT_S, EndpointSlice, IpFamily, Key, LABEL_SERVICE_NAME,
    LABEL_SOURCE_CLUSTER, NamespacedName, ServiceImport, ServiceImportType, key, parse_ip,
};

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
}

/// A usable endpoint of one slice, before port selection.
#[derive(Clone, Copy)]
struct SliceEndpoint {
    ip: IpAddr,
    ready: bool,
    serving_terminating: bool,
}

/// An imported slice reduced to what routing needs. Port names borrow from the input.
struct ImportedSlice<'a> {
    cluster: ClusterId,
    family: IpFamily,
    /// (name, protocol, number), each (name, protocol) once. A handful per slice, so a list
    /// scanned in order beats a map.
    ports: Vec<(&'a str, Protocol, u16)>,
    endpoints: Vec<SliceEndpoint>,
    /// Whether any endpoint is ready: decides the serving+terminating fallback cheaply.
    any_ready: bool,
}

impl ImportedSlice<'_> {
    /// The slice's port number for a frontend port of this name and protocol.
    fn port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|(n, p, _)| *n == name && *p == protocol)
            .map(|(_, _, number)| *number)
    }
}

fn parse_family(address_type: &str) -> Option<IpFamily> {
    address_type.parse().ok()
}

/// The slices of each service (namespace, service-name label), borrowed from the input.
type SlicesByService<'a> = HashMap<Key<'a>, Vec<ImportedSlice<'a>>>;

/// Reads the slices of every service, skipping (and reporting) malformed ones.
fn index_slices<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    warnings: &mut Vec<LbWarning>,
) -> SlicesByService<'a> {
    let slices = slices.into_iter();
    let mut by_service: SlicesByService<'a> = HashMap::with_capacity(slices.size_hint().0);
    // Each source-cluster label value is checked and turned into a ClusterId once; the
    // backends then share it.
    let mut clusters: HashMap<&'a str, Result<ClusterId, String>> = HashMap::new();
    for slice in slices {
        let (namespace, slice_name) = key(&slice.metadata);
        // The object is only named when something is wrong: no formatting on the good path.
        let mut warn = |message: String| {
            warnings.push(LbWarning {
                object: format!("EndpointSlice {namespace}/{slice_name}"),
                message,
            })
        };
        let labels = slice.metadata.labels.as_ref();
        let Some(service) = labels.and_then(|l| l.get(LABEL_SERVICE_NAME)) else {
            warn(format!(
                "no {LABEL_SERVICE_NAME} label; not an imported slice"
            ));
            continue;
        };
        let Some(raw_cluster) = labels.and_then(|l| l.get(LABEL_SOURCE_CLUSTER)) else {
            warn(format!("no {LABEL_SOURCE_CLUSTER} label"));
            continue;
        };
        let cluster = match clusters
            .entry(raw_cluster.as_str())
            .or_insert_with(|| ClusterId::new(raw_cluster.as_str()).map_err(|e| e.to_string()))
        {
            Ok(c) => c.clone(),
            Err(e) => {
                warn(e.clone());
                continue;
            }
        };
        let Some(family) = parse_family(&slice.address_type) else {
            warn(format!(
                "addressType {:?} is not IPv4 or IPv6",
                slice.address_type
            ));
            continue;
        };
        let mut ports: Vec<(&str, Protocol, u16)> = Vec::new();
        for p in slice.ports.iter().flatten() {
            let name = p.name.as_deref().unwrap_or("");
            let protocol = match Protocol::parse(p.protocol.as_deref()) {
                Ok(proto) => proto,
                Err(other) => {
                    warn(format!(
                        "port {name:?}: protocol {other} is not load-balanced at socket level"
                    ));
                    continue;
                }
            };
            let Some(number) = p
                .port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
            else {
                warn(format!(
                    "port {name:?}: port {:?} is not in 1..65535",
                    p.port
                ));
                continue;
            };
            match ports
                .iter_mut()
                .find(|(n, proto, _)| *n == name && *proto == protocol)
            {
                Some(existing) => {
                    existing.2 = number;
                    warn(format!(
                        "port {name:?}/{protocol} appears twice; the last one is used"
                    ));
                }
                None => ports.push((name, protocol, number)),
            }
        }
        let mut endpoints = Vec::with_capacity(slice.endpoints.len());
        for ep in &slice.endpoints {
            let cond = ep.conditions.as_ref();
            // EndpointConditions: a nil `ready` means ready, a nil `serving` means `ready`.
            let ready = cond.and_then(|c| c.ready).unwrap_or(true);
            let serving = cond.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
            for addr in &ep.addresses {
                match parse_ip(addr) {
                    Some(ip) if IpFamily::of(&ip) == family => endpoints.push(SliceEndpoint {
                        ip,
                        ready,
                        serving_terminating: serving && terminating,
                    }),
                    Some(ip) => warn(format!(
                        "address {ip} does not match addressType {family}; skipped"
                    )),
                    None => warn(format!("address {addr:?} is not an IP address; skipped")),
                }
            }
        }
        // In address order: with the slices of a service in cluster order (below), a frontend's
        // backends then usually come out sorted, and sorting them is a single check.
        endpoints.sort_unstable_by_key(|e| e.ip);
        by_service
            .entry((namespace, service.as_str()))
            .or_default()
            .push(ImportedSlice {
                cluster,
                family,
                ports,
                any_ready: endpoints.iter().any(|e| e.ready),
                endpoints,
            });
    }
    for slices in by_service.values_mut() {
        slices.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    }
    by_service
}

/// One import per namespace/name, sorted by it. Of several imports with one namespace/name the
/// one whose JSON is smallest is used (and the duplicate reported), so the choice does not
/// depend on the input order.
fn unique_imports<'a>(
    imports: impl IntoIterator<Item = &'a ServiceImport>,
    warnings: &mut Vec<LbWarning>,
) -> Vec<(Key<'a>, &'a ServiceImport)> {
    let mut sorted: Vec<(Key<'a>, &'a ServiceImport)> = imports
        .into_iter()
        .map(|si| (key(&si.metadata), si))
        .collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let json = |si: &ServiceImport| serde_json::to_string(si).unwrap_or_default();
    let mut out: Vec<(Key<'a>, &'a ServiceImport)> = Vec::with_capacity(sorted.len());
    for (k, si) in sorted {
        match out.last_mut() {
            Some((last, kept)) if *last == k => {
                warnings.push(LbWarning {
                    object: format!("ServiceImport {}/{}", k.0, k.1),
                    message: "defined more than once; one definition is used".into(),
                });
                if json(si) < json(kept) {
                    *kept = si;
                }
            }
            _ => out.push((k, si)),
        }
    }
    out
}

/// Builds the table. The result depends only on the set of inputs, not on their order.
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
    let mut table = LbTable::default();
    let slices_by_service = index_slices(slices, &mut table.warnings);
    // Reused across frontends: the slices that serve the current one, with their port.
    let mut serving: Vec<(&ImportedSlice<'_>, u16)> = Vec::new();

    // Sorted, so a VIP claimed twice goes to the same import whatever the input order.
    for ((namespace, name), si) in unique_imports(imports, &mut table.warnings) {
        let service_slices = slices_by_service
            .get(&(namespace, name))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let _claimed = build_import(
            (namespace, name),
            si,
            service_slices,
            &mut table.vips,
            &mut table.warnings,
            &mut serving,
            |addr, fe| {
                table.frontends.insert(addr, fe);
            },
        );
    }
    table.warnings.sort();
    table.warnings.dedup();
    table
}

/// The frontends and VIPs of one import (the one kept for its namespace/name), given the
/// slices of its service. A VIP already in `claimed` (claimed by an import earlier in sorted
/// order) is skipped; the VIPs this import gets are added to `claimed` and returned, and every
/// frontend is handed to `emit`.
fn build_import<'s, 'a: 's>(
    (namespace, name): Key<'_>,
    si: &ServiceImport,
    service_slices: &'s [ImportedSlice<'a>],
    claimed: &mut BTreeMap<IpAddr, NamespacedName>,
    warnings: &mut Vec<LbWarning>,
    serving: &mut Vec<(&'s ImportedSlice<'a>, u16)>,
    mut emit: impl FnMut(FrontendAddr, Frontend),
) -> Vec<(IpFamily, IpAddr)> {
    if si.spec.type_ == ServiceImportType::Headless {
        return Vec::new();
    }
    let mut warn = |message: String| {
        warnings.push(LbWarning {
            object: format!("ServiceImport {namespace}/{name}"),
            message,
        })
    };
    let affinity_timeout_s = (si.spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        si.spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_S)
    });
    // ips[i] is the VIP of ipFamilies[i]; when ipFamilies is empty each IP's own family counts.
    let mut vips: Vec<(IpFamily, IpAddr)> = Vec::new();
    for (i, raw) in si.spec.ips.iter().enumerate() {
        let Some(ip) = parse_ip(raw) else {
            warn(format!("ips[{i}] {raw:?} is not an IP address; skipped"));
            continue;
        };
        let family = IpFamily::of(&ip);
        if let Some(declared) = si.spec.ip_families.get(i)
            && *declared != family
        {
            warn(format!(
                "ips[{i}] {ip} is not of ipFamilies[{i}] {declared}; skipped"
            ));
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

    // (name, protocol, number); a Service has a handful of ports, so a list is enough to
    // find the (number, protocol) listed twice.
    let mut ports: Vec<(&str, Protocol, u16)> = Vec::with_capacity(si.spec.ports.len());
    for p in &si.spec.ports {
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
        if ports
            .iter()
            .any(|(_, pr, n)| *n == number && *pr == protocol)
        {
            warn(format!("port {number}/{protocol} is listed twice; skipped"));
            continue;
        }
        ports.push((port_name, protocol, number));
    }

    if vips.is_empty() {
        return vips;
    }
    let service = NamespacedName::new(namespace, name);
    for &(family, vip) in &vips {
        claimed.insert(vip, service.clone());
        for (port_name, protocol, number) in &ports {
            serving.clear();
            serving.extend(
                service_slices
                    .iter()
                    .filter(|s| s.family == family)
                    .filter_map(|s| Some((s, s.port(port_name, *protocol)?))),
            );
            // Ready endpoints; only when none is ready, the serving and terminating ones.
            let any_ready = serving.iter().any(|(s, _)| s.any_ready);
            let mut backends: Vec<Backend> =
                Vec::with_capacity(serving.iter().map(|(s, _)| s.endpoints.len()).sum());
            for (slice, target) in serving.iter() {
                for ep in &slice.endpoints {
                    let usable = if any_ready {
                        ep.ready
                    } else {
                        ep.serving_terminating
                    };
                    if usable {
                        backends.push(Backend {
                            cluster: slice.cluster.clone(),
                            ip: ep.ip,
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

pub use incremental::{LbState, ServiceInputs, ServicePart, build_services};

#[cfg(test)]
mod tests;
