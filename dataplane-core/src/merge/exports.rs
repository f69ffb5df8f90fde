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

use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::jiff::Timestamp;

use crate::model::{
    ClusterId, IpFamily, ServicePort,
    member::{ExportRecord, LocalSlice, ServicePortSpec, ServiceRecord},
    name::Name,
};

/// Reason of `Valid=False` for a Service whose ports are malformed.
pub const REASON_INVALID_SERVICE_PORTS: &str = "InvalidServicePorts";
/// Reason of `Valid=False` for a Service whose `ipFamilies` are malformed.
pub const REASON_INVALID_IP_FAMILIES: &str = "InvalidIPFamilies";
/// Reason of `Valid=False` for a missing Service (MCS API).
pub const REASON_NO_SERVICE: &str = "NoService";
/// Reason of `Valid=False` for a Service type that cannot be exported (MCS API).
pub const REASON_INVALID_SERVICE_TYPE: &str = "InvalidServiceType";

/// A valid export, ready to merge.
#[derive(Debug)]
pub(crate) struct Export<'a> {
    /// The exporting cluster.
    pub cluster: &'a ClusterId,
    /// Its Service.
    pub service: &'a ServiceRecord,
    /// Its ServiceExport.
    pub spec: &'a ExportRecord,
    /// The ServiceExport's creation time: older exports win.
    pub created: Option<Timestamp>,
    /// Normalised: no empty names or appProtocols, protocol always set.
    pub ports: Vec<ServicePort>,
    /// The Service's `ipFamilies`, else the address types of its local slices; may be empty
    /// when neither says anything.
    pub families: Vec<IpFamily>,
    /// Whether the Service is headless.
    pub headless: bool,
    /// The Service's local slices, sorted by name.
    pub local_slices: &'a [Arc<LocalSlice>],
}

impl Export<'_> {
    /// The precedence key: older first, then by cluster id.
    pub fn precedence(&self) -> (Option<Timestamp>, &ClusterId) {
        (self.created, self.cluster)
    }
}

/// Files `new` in `kept`. When a record is there already (a duplicate: returns `true`), the
/// smaller of the two stays, so the choice does not depend on the input order.
pub(crate) fn file_once<T: Ord>(kept: &mut Option<Arc<T>>, new: &Arc<T>) -> bool {
    match kept {
        Some(existing) => {
            if new < existing {
                *existing = Arc::clone(new);
            }
            true
        }
        None => {
            *kept = Some(Arc::clone(new));
            false
        }
    }
}

/// Checks one export; `Err((reason, message))` makes it `Valid=False`.
pub(crate) fn validate<'a>(
    cluster: &'a ClusterId,
    service: Option<&'a ServiceRecord>,
    se: &'a ExportRecord,
    local_slices: &'a [Arc<LocalSlice>],
) -> Result<Export<'a>, (String, String)> {
    let Some(service) = service else {
        return Err((
            REASON_NO_SERVICE.into(),
            "No Service of the same namespace/name exists in this cluster.".into(),
        ));
    };
    match service.type_.as_deref() {
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
    let ports = match normalize_ports(&service.ports) {
        Ok(p) => p,
        Err(problems) => {
            reasons.push(REASON_INVALID_SERVICE_PORTS);
            messages.push(format!("Invalid ports: {}.", problems.join("; ")));
            Vec::new()
        }
    };
    let declared = match parse_families(&service.ip_families) {
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
        let set: BTreeSet<IpFamily> = local_slices.iter().filter_map(|s| s.ip_family()).collect();
        set.into_iter().collect()
    } else {
        declared
    };
    Ok(Export {
        cluster,
        service,
        spec: se,
        created: se.created,
        ports,
        families,
        headless: service.headless,
        local_slices,
    })
}

/// Normalises a Service's ports, or lists every problem.
pub fn normalize_ports(ports: &[ServicePortSpec]) -> Result<Vec<ServicePort>, Vec<String>> {
    let mut out: Vec<ServicePort> = Vec::with_capacity(ports.len());
    let mut problems = Vec::new();
    // Each port is compared with the earlier ones: by a scan for the usual handful, in sets
    // for a long list (a Service may have thousands of ports).
    let mut seen = (ports.len() > 16).then(|| {
        (
            std::collections::HashSet::with_capacity(ports.len()),
            std::collections::HashSet::with_capacity(ports.len()),
        )
    });
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
        let earlier = &ports[..i];
        let (name_twice, number_twice) = match &mut seen {
            Some((names, numbers)) => (!names.insert(shown), !numbers.insert((p.port, protocol))),
            None => (
                earlier
                    .iter()
                    .any(|q| q.name.as_deref().unwrap_or("") == shown),
                earlier.iter().any(|q| {
                    q.port == p.port && q.protocol.as_deref().unwrap_or("TCP") == protocol
                }),
            ),
        };
        if name_twice {
            problems.push(format!("port name {shown:?} is used twice"));
        }
        if number_twice {
            problems.push(format!("{}/{protocol} is declared twice", p.port));
        }
        out.push(ServicePort {
            name: (!shown.is_empty()).then(|| shown.to_owned()),
            protocol: Some(protocol.to_owned()),
            app_protocol: p
                .app_protocol
                .as_deref()
                .filter(|a| !a.is_empty())
                .map(str::to_owned),
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
pub fn parse_families(raw: &[Name]) -> Result<Vec<IpFamily>, String> {
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
