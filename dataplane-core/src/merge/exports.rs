//! Name mapping, validation and precedence of exports.
//!
//! An export is a ServiceExport plus the Service of the same namespace/name in the same
//! cluster. An export is invalid (`Valid=False`, `Ready=False/Pending`, no `Conflict`, left out
//! of the merge) when:
//!
//! | reason | when |
//! |---|---|
//! | `NoService` | no Service of that namespace/name in the cluster |
//! | `InvalidServiceType` | `type: ExternalName`, or a type Kubernetes does not define |
//! | `InvalidServicePorts` | a port outside 1..65535, a protocol other than TCP/UDP/SCTP, two ports with one name (the empty name included) or with one (protocol, port) |
//! | `InvalidIPFamilies` | more than two `ipFamilies`, a family twice, or a value other than IPv4/IPv6 |
//!
//! Several of the last two are joined with a comma (`InvalidServicePorts,InvalidIPFamilies`).
//! Problems in local EndpointSlices (bad addresses, an address that does not match the
//! `addressType`, an unknown `addressType`) do not invalidate the export: the bad addresses are
//! skipped and reported as [`Diagnostic`]s, so the other endpoints keep working.
//!
//! Precedence: `creationTimestamp` ascending (a missing one counts as the oldest), ties broken by
//! cluster id ascending.

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt};
use std::net::IpAddr;

use k8s_openapi::jiff::Timestamp;

use super::{Diagnostic, ExportStatus, conditions};
use crate::model::{
    ClusterId, EndpointSlice, IpFamily, Key, LABEL_K8S_SERVICE_NAME, NamespacedName, Service,
    ServiceExport, ServiceExportSpec, ServicePort, is_ipv4, key,
};

/// Reason of `Valid=False` for a Service whose ports are malformed.
pub const REASON_INVALID_SERVICE_PORTS: &str = "InvalidServicePorts";
/// Reason of `Valid=False` for a Service whose `ipFamilies` are malformed.
pub const REASON_INVALID_IP_FAMILIES: &str = "InvalidIPFamilies";
/// Reason of `Valid=False` for a missing Service (MCS API).
pub const REASON_NO_SERVICE: &str = "NoService";
/// Reason of `Valid=False` for a Service type that cannot be exported (MCS API).
pub const REASON_INVALID_SERVICE_TYPE: &str = "InvalidServiceType";

/// The objects of one cluster, keyed and deduplicated.
pub(crate) struct ClusterObjects<'a> {
    pub services: HashMap<Key<'a>, &'a Service>,
    pub exports: HashMap<Key<'a>, &'a ServiceExport>,
    /// Local slices by the Service they belong to, sorted by slice name.
    pub slices: HashMap<Key<'a>, Vec<LocalSlice<'a>>>,
}

/// A local EndpointSlice and whether every address in it is an IP of its `addressType`
/// (checked once here, so the import does not parse the addresses again).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalSlice<'a> {
    pub slice: &'a EndpointSlice,
    pub clean: bool,
}

/// A valid export, ready to merge.
#[derive(Debug)]
pub(crate) struct Export<'a> {
    pub cluster: &'a ClusterId,
    pub service: &'a Service,
    pub spec: &'a ServiceExportSpec,
    pub created: Option<Timestamp>,
    /// Normalised: no empty names or appProtocols, protocol always set.
    pub ports: Vec<ServicePort>,
    /// The Service's `ipFamilies`, else the address types of its local slices; may be empty
    /// when neither says anything.
    pub families: Vec<IpFamily>,
    pub headless: bool,
    pub local_slices: &'a [LocalSlice<'a>],
}

impl Export<'_> {
    /// The precedence key: older first, then by cluster id.
    pub fn precedence(&self) -> (Option<Timestamp>, &ClusterId) {
        (self.created, self.cluster)
    }
}

/// Picks one of several objects with the same key, independently of their order: the one
/// whose JSON is smallest. Only duplicates pay for the serialisation.
fn pick_duplicate<'a, T: serde::Serialize>(existing: &mut &'a T, new: &'a T) {
    let key = |o: &T| serde_json::to_string(o).unwrap_or_default();
    if key(new) < key(existing) {
        *existing = new;
    }
}

/// Keys every cluster's objects, combining snapshots of one cluster and reporting duplicates and
/// malformed local EndpointSlices.
pub(crate) fn index_clusters<'a>(
    snapshots: &'a [super::ClusterSnapshot],
    diagnostics: &mut Vec<Diagnostic>,
) -> BTreeMap<&'a ClusterId, ClusterObjects<'a>> {
    let mut out: BTreeMap<&ClusterId, ClusterObjects<'_>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for snap in snapshots {
        if !seen.insert(&snap.cluster) {
            diagnostics.push(Diagnostic {
                cluster: Some(snap.cluster.clone()),
                object: format!("cluster {}", snap.cluster),
                message: "given more than once; its objects are combined".into(),
            });
        }
        let objs = out.entry(&snap.cluster).or_insert_with(|| ClusterObjects {
            services: HashMap::new(),
            exports: HashMap::new(),
            slices: HashMap::new(),
        });
        // Sized up front: growing a table of 10,000 keys rehashes it a dozen times.
        objs.services.reserve(snap.services.len());
        objs.exports.reserve(snap.service_exports.len());
        objs.slices.reserve(snap.endpoint_slices.len());
        let dup = |kind: &str, (ns, name): Key<'_>| Diagnostic {
            cluster: Some(snap.cluster.clone()),
            object: format!("{kind} {ns}/{name}"),
            message: "defined more than once; one definition is used".into(),
        };
        for svc in &snap.services {
            let id = key(&svc.metadata);
            match objs.services.get_mut(&id) {
                Some(existing) => {
                    diagnostics.push(dup("Service", id));
                    pick_duplicate(existing, svc);
                }
                None => {
                    objs.services.insert(id, svc);
                }
            }
        }
        for se in &snap.service_exports {
            let id = key(&se.metadata);
            match objs.exports.get_mut(&id) {
                Some(existing) => {
                    diagnostics.push(dup("ServiceExport", id));
                    pick_duplicate(existing, se);
                }
                None => {
                    objs.exports.insert(id, se);
                }
            }
        }
        for slice in &snap.endpoint_slices {
            let id = key(&slice.metadata);
            let object = || format!("EndpointSlice {}/{}", id.0, id.1);
            let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_K8S_SERVICE_NAME))
            else {
                diagnostics.push(Diagnostic {
                    cluster: Some(snap.cluster.clone()),
                    object: object(),
                    message: format!("no {LABEL_K8S_SERVICE_NAME} label; ignored"),
                });
                continue;
            };
            let (problems, clean) = check_slice(slice);
            for message in problems {
                diagnostics.push(Diagnostic {
                    cluster: Some(snap.cluster.clone()),
                    object: object(),
                    message,
                });
            }
            let list = objs.slices.entry((id.0, svc.as_str())).or_default();
            // Same namespace (part of the key), so the name identifies the slice.
            match list
                .iter_mut()
                .find(|s| s.slice.metadata.name == slice.metadata.name)
            {
                Some(existing) => {
                    diagnostics.push(dup("EndpointSlice", id));
                    let before = existing.slice;
                    pick_duplicate(&mut existing.slice, slice);
                    if !std::ptr::eq(before, existing.slice) {
                        existing.clean = clean;
                    }
                }
                None => list.push(LocalSlice { slice, clean }),
            }
        }
    }
    for objs in out.values_mut() {
        for list in objs.slices.values_mut() {
            list.sort_by(|a, b| a.slice.metadata.name.cmp(&b.slice.metadata.name));
        }
    }
    out
}

/// The family of a local slice's `addressType`, `None` for FQDN and unknown types.
pub fn slice_family(slice: &EndpointSlice) -> Option<IpFamily> {
    slice.address_type.parse().ok()
}

/// Problems of a local EndpointSlice (the bad addresses are skipped by the merge), and whether
/// all its addresses are good.
fn check_slice(slice: &EndpointSlice) -> (Vec<String>, bool) {
    let Some(family) = slice_family(slice) else {
        let problem = format!(
            "addressType {:?} is not imported (only IPv4 and IPv6 are)",
            slice.address_type
        );
        return (vec![problem], false);
    };
    let mut problems = Vec::new();
    for ep in &slice.endpoints {
        for addr in &ep.addresses {
            if family == IpFamily::IPv4 && is_ipv4(addr) {
                continue;
            }
            match addr.parse::<IpAddr>() {
                Ok(ip) if IpFamily::of(&ip) != family => problems.push(format!(
                    "address {addr} does not match addressType {family}; skipped"
                )),
                Ok(_) => {}
                Err(_) => problems.push(format!("address {addr:?} is not an IP address; skipped")),
            }
        }
    }
    let clean = problems.is_empty();
    for p in slice.ports.iter().flatten() {
        if !p.port.is_some_and(|n| (1..=65535).contains(&n)) {
            problems.push(format!(
                "port {:?}: {:?} is not in 1..65535; skipped",
                p.name.as_deref().unwrap_or(""),
                p.port
            ));
        }
    }
    (problems, clean)
}

/// An address of a local slice that the merge may import: an IP of the slice's family.
pub fn usable_address(addr: &str, family: IpFamily) -> bool {
    (family == IpFamily::IPv4 && is_ipv4(addr))
        || addr
            .parse::<IpAddr>()
            .is_ok_and(|ip| IpFamily::of(&ip) == family)
}

/// Valid exports by service, sorted by namespace/name (each list in precedence order, oldest
/// first), and the statuses of the invalid ones (unsorted).
pub(crate) fn collect<'a>(
    clusters: &'a BTreeMap<&'a ClusterId, ClusterObjects<'a>>,
) -> (Vec<(Key<'a>, Vec<Export<'a>>)>, Vec<ExportStatus>) {
    // Grouped by hash, then only the services are sorted (not every export).
    // At least as many services as the largest cluster exports.
    let mut by_service: HashMap<Key<'a>, Vec<Export<'a>>> = HashMap::with_capacity(
        clusters
            .values()
            .map(|o| o.exports.len())
            .max()
            .unwrap_or(0),
    );
    let mut statuses = Vec::new();
    for (cluster, objs) in clusters {
        for (k, se) in &objs.exports {
            let slices: &[LocalSlice<'_>] = objs.slices.get(k).map(Vec::as_slice).unwrap_or(&[]);
            match validate(cluster, objs.services.get(k).copied(), se, slices) {
                Ok(export) => by_service.entry(*k).or_default().push(export),
                Err((reason, message)) => statuses.push(ExportStatus {
                    cluster: (*cluster).clone(),
                    service: NamespacedName::new(k.0, k.1),
                    conditions: conditions::invalid_export(&reason, &message),
                }),
            }
        }
    }
    let mut by_service: Vec<(Key<'a>, Vec<Export<'a>>)> = by_service.into_iter().collect();
    by_service.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (_, exports) in &mut by_service {
        exports.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
    }
    (by_service, statuses)
}

/// Checks one export; `Err((reason, message))` makes it `Valid=False`.
fn validate<'a>(
    cluster: &'a ClusterId,
    service: Option<&'a Service>,
    se: &'a ServiceExport,
    local_slices: &'a [LocalSlice<'a>],
) -> Result<Export<'a>, (String, String)> {
    let Some(service) = service else {
        return Err((
            REASON_NO_SERVICE.into(),
            "No Service of the same namespace/name exists in this cluster.".into(),
        ));
    };
    let no_spec = k8s_openapi::api::core::v1::ServiceSpec::default();
    let spec = service.spec.as_ref().unwrap_or(&no_spec);
    match spec.type_.as_deref() {
        None | Some("ClusterIP") | Some("NodePort") | Some("LoadBalancer") => {}
        Some("ExternalName") => {
            return Err((
                REASON_INVALID_SERVICE_TYPE.into(),
                "Service type ExternalName cannot be exported.".into(),
            ));
        }
        Some(other) => {
            return Err((
                REASON_INVALID_SERVICE_TYPE.into(),
                format!("Service type {other:?} is not a Kubernetes Service type."),
            ));
        }
    }
    let mut reasons = Vec::new();
    let mut messages = Vec::new();
    let ports = match normalize_ports(spec.ports.as_deref().unwrap_or(&[])) {
        Ok(p) => p,
        Err(problems) => {
            reasons.push(REASON_INVALID_SERVICE_PORTS);
            messages.push(format!("Invalid ports: {}.", problems.join("; ")));
            Vec::new()
        }
    };
    let declared = match parse_families(spec.ip_families.as_deref().unwrap_or(&[])) {
        Ok(f) => f,
        Err(problem) => {
            reasons.push(REASON_INVALID_IP_FAMILIES);
            messages.push(format!("Invalid ipFamilies: {problem}."));
            Vec::new()
        }
    };
    if !reasons.is_empty() {
        return Err((reasons.join(","), messages.join(" ")));
    }
    let families = if declared.is_empty() {
        // No declared families: the address types of the Service's own slices say what it
        // serves. Sorted, so the result does not depend on the slices' order.
        let set: BTreeSet<IpFamily> = local_slices
            .iter()
            .filter_map(|s| slice_family(s.slice))
            .collect();
        set.into_iter().collect()
    } else {
        declared
    };
    let headless = spec.cluster_ip.as_deref() == Some("None");
    Ok(Export {
        cluster,
        service,
        spec: &se.spec,
        created: se.metadata.creation_timestamp.as_ref().map(|t| t.0),
        ports,
        families,
        headless,
        local_slices,
    })
}

/// Normalises a Service's ports, or lists every problem.
pub fn normalize_ports(
    ports: &[k8s_openapi::api::core::v1::ServicePort],
) -> Result<Vec<ServicePort>, Vec<String>> {
    let mut out: Vec<ServicePort> = Vec::with_capacity(ports.len());
    let mut problems = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let shown = p.name.as_deref().unwrap_or("");
        let protocol = p.protocol.as_deref().unwrap_or("TCP");
        if !matches!(protocol, "TCP" | "UDP" | "SCTP") {
            problems.push(format!(
                "port {shown:?} has protocol {protocol:?} (expected TCP, UDP or SCTP)"
            ));
        }
        if !(1..=65535).contains(&p.port) {
            problems.push(format!(
                "port {shown:?} has number {} (expected 1..65535)",
                p.port
            ));
        }
        // A Service has a handful of ports: looking back over them beats building sets.
        let earlier = &ports[..i];
        if earlier
            .iter()
            .any(|q| q.name.as_deref().unwrap_or("") == shown)
        {
            problems.push(format!("port name {shown:?} is used twice"));
        }
        if earlier
            .iter()
            .any(|q| q.port == p.port && q.protocol.as_deref().unwrap_or("TCP") == protocol)
        {
            problems.push(format!("{}/{protocol} is declared twice", p.port));
        }
        out.push(ServicePort {
            name: (!shown.is_empty()).then(|| shown.to_owned()),
            protocol: Some(protocol.to_owned()),
            app_protocol: p.app_protocol.clone().filter(|a| !a.is_empty()),
            port: p.port,
        });
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// Parses `ipFamilies`: at most two, no duplicates, IPv4/IPv6 only.
pub fn parse_families(raw: &[String]) -> Result<Vec<IpFamily>, String> {
    if raw.len() > 2 {
        return Err(format!(
            "{} families given, at most 2 are allowed",
            raw.len()
        ));
    }
    let mut out = Vec::new();
    for f in raw {
        let family: IpFamily = f.parse()?;
        if out.contains(&family) {
            return Err(format!("{family} is listed twice"));
        }
        out.push(family);
    }
    Ok(out)
}
