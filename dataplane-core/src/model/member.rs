//! Compact records of what a member cluster exports: its Services ([`ServiceRecord`]),
//! ServiceExports ([`ExportRecord`]) and local EndpointSlices ([`LocalSlice`]), converted from
//! the Kubernetes objects as they arrive and shared from then on.
//!
//! A record keeps what the merge reads, nothing more, with the Service's fields as the user
//! wrote them (the merge validates and normalises them, and names what is wrong in the
//! export's conditions). A local slice's addresses are parsed once, here; what cannot be
//! imported (an address of the other family, a non-IP, a port out of range, an unknown
//! `addressType`) is recorded as a problem in the merge's words.

use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::Timestamp,
};

use super::{
    IpFamily, LABEL_K8S_SERVICE_NAME, NamespacedName, ServiceExport, is_ipv4, key,
    name::{Interner, Name},
    parse_ip,
    records::{Conditions, Endpoint, EndpointExtra, Endpoints},
};

/// A Service port as the user wrote it (validated by the merge).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortSpec {
    /// `name`, when set.
    pub name: Option<Name>,
    /// `protocol`, when set (TCP by default).
    pub protocol: Option<Name>,
    /// `port`.
    pub port: i32,
    /// `appProtocol`, when set.
    pub app_protocol: Option<Name>,
}

/// A member cluster's Service, as the merge reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceRecord {
    /// Its namespace and name.
    pub id: NamespacedName,
    /// `spec.type`, when set.
    pub type_: Option<Name>,
    /// Whether `spec.clusterIP` is `None` (a headless Service).
    pub headless: bool,
    /// `spec.ports`.
    pub ports: Box<[ServicePortSpec]>,
    /// `spec.ipFamilies`, as written.
    pub ip_families: Box<[Name]>,
    /// `spec.sessionAffinity`, when set.
    pub session_affinity: Option<Name>,
    /// `spec.sessionAffinityConfig.clientIP.timeoutSeconds`, when set.
    pub affinity_timeout: Option<i32>,
    /// `spec.internalTrafficPolicy`, when set.
    pub internal_traffic_policy: Option<Name>,
    /// `spec.trafficDistribution`, when set.
    pub traffic_distribution: Option<Name>,
}

impl ServiceRecord {
    /// Converts a Service.
    pub fn from_k8s(svc: &Service, names: &Interner) -> Self {
        let (namespace, name) = key(&svc.metadata);
        let text = |v: &Option<String>| v.as_deref().map(|s| names.intern(s));
        let Some(spec) = svc.spec.as_ref() else {
            return ServiceRecord {
                id: NamespacedName::new(names.intern(namespace), names.intern(name)),
                ..Default::default()
            };
        };
        ServiceRecord {
            id: NamespacedName::new(names.intern(namespace), names.intern(name)),
            type_: text(&spec.type_),
            headless: spec.cluster_ip.as_deref() == Some("None"),
            ports: spec
                .ports
                .iter()
                .flatten()
                .map(|p| ServicePortSpec {
                    name: text(&p.name),
                    protocol: text(&p.protocol),
                    port: p.port,
                    app_protocol: text(&p.app_protocol),
                })
                .collect(),
            ip_families: spec
                .ip_families
                .iter()
                .flatten()
                .map(|f| names.intern(f))
                .collect(),
            session_affinity: text(&spec.session_affinity),
            affinity_timeout: spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds),
            internal_traffic_policy: text(&spec.internal_traffic_policy),
            traffic_distribution: text(&spec.traffic_distribution),
        }
    }
}

/// A member cluster's ServiceExport, as the merge reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExportRecord {
    /// Its namespace and name (those of the Service it exports).
    pub id: NamespacedName,
    /// `metadata.creationTimestamp`: older exports win conflicts.
    pub created: Option<Timestamp>,
    /// `spec.exportedLabels`.
    pub exported_labels: BTreeMap<String, String>,
    /// `spec.exportedAnnotations`.
    pub exported_annotations: BTreeMap<String, String>,
}

impl ExportRecord {
    /// Converts a ServiceExport.
    pub fn from_k8s(se: &ServiceExport, names: &Interner) -> Self {
        let (namespace, name) = key(&se.metadata);
        ExportRecord {
            id: NamespacedName::new(names.intern(namespace), names.intern(name)),
            created: se.metadata.creation_timestamp.as_ref().map(|t| t.0),
            exported_labels: se.spec.exported_labels.clone(),
            exported_annotations: se.spec.exported_annotations.clone(),
        }
    }
}

/// A port of a local EndpointSlice as written.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalSlicePort {
    /// `name`, when set.
    pub name: Option<Name>,
    /// `protocol`, when set.
    pub protocol: Option<Name>,
    /// `port`, when set and in 1..=65535 (others are dropped with a problem).
    pub port: u16,
    /// `appProtocol`, when set.
    pub app_protocol: Option<Name>,
}

/// A member cluster's own EndpointSlice of a Service (label `kubernetes.io/service-name`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LocalSlice {
    /// Its namespace and name.
    pub id: NamespacedName,
    /// The Service it belongs to (the `kubernetes.io/service-name` label), when labelled.
    pub service: Option<Name>,
    /// The `addressType`, or the text of one that is not IPv4/IPv6.
    pub family: Result<IpFamily, Name>,
    /// The ports with a number in range.
    pub ports: Box<[LocalSlicePort]>,
    /// The endpoints with their usable addresses (of the slice's family), sorted; endpoints
    /// left with no address are dropped.
    pub endpoints: Arc<Endpoints>,
    /// What was dropped, in the merge's words.
    pub problems: Box<[String]>,
}

impl LocalSlice {
    /// The Service it belongs to: its namespace and `kubernetes.io/service-name` label.
    pub fn service_id(&self) -> Option<NamespacedName> {
        let service = self.service.as_ref()?;
        Some(NamespacedName::new(
            self.id.namespace.clone(),
            Name::clone(service),
        ))
    }

    /// The IP family, when the `addressType` is IPv4 or IPv6.
    pub fn ip_family(&self) -> Option<IpFamily> {
        self.family.as_ref().ok().copied()
    }

    /// Which of two definitions of one slice (in two files) is used: `Less` for `self`. A
    /// usable one (a service label, an IPv4 or IPv6 `addressType`) before one that is not, so
    /// that a broken copy never hides a good one; then the smallest debug text (slices have
    /// no order of their own).
    pub fn duplicate_rank(&self, other: &Self) -> std::cmp::Ordering {
        let key = |s: &Self| (s.service.is_none(), s.family.is_err(), format!("{s:?}"));
        key(self).cmp(&key(other))
    }

    /// Converts a local EndpointSlice.
    pub fn from_k8s(slice: &EndpointSlice, names: &Interner) -> Self {
        let (namespace, name) = key(&slice.metadata);
        let mut problems = Vec::new();
        let family = slice.address_type.parse::<IpFamily>();
        let mut endpoints = Vec::with_capacity(slice.endpoints.len());
        match family {
            Err(_) => problems.push(format!(
                "addressType {:?} is not imported (only IPv4 and IPv6 are)",
                slice.address_type
            )),
            Ok(family) => {
                for ep in &slice.endpoints {
                    let mut addrs: Vec<IpAddr> = Vec::with_capacity(ep.addresses.len());
                    for addr in &ep.addresses {
                        let parsed = if family == IpFamily::IPv4 && is_ipv4(addr) {
                            parse_ip(addr)
                        } else {
                            addr.parse::<IpAddr>().ok()
                        };
                        match parsed {
                            Some(ip) if IpFamily::of(&ip) == family => addrs.push(ip),
                            Some(_) => problems.push(format!(
                                "address {addr} does not match addressType {family}; skipped"
                            )),
                            None => problems
                                .push(format!("address {addr:?} is not an IP address; skipped")),
                        }
                    }
                    let Some((&first, more)) = addrs.split_first() else {
                        continue;
                    };
                    let conditions = ep
                        .conditions
                        .as_ref()
                        .map(|c| Conditions::new(c.ready, c.serving, c.terminating))
                        .unwrap_or_default();
                    endpoints.push((
                        Endpoint {
                            addr: first,
                            conditions,
                        },
                        Some(EndpointExtra {
                            more_addresses: more.into(),
                            hostname: ep.hostname.as_deref().map(|h| names.intern(h)),
                            zone: ep.zone.as_deref().map(|z| names.intern(z)),
                        }),
                    ));
                }
            }
        }
        let mut ports = Vec::new();
        // A slice of another address type is not imported: its ports do not matter.
        let slice_ports = if family.is_ok() {
            slice.ports.as_deref().unwrap_or(&[])
        } else {
            &[]
        };
        for p in slice_ports {
            match p
                .port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
            {
                Some(port) => ports.push(LocalSlicePort {
                    name: p.name.as_deref().map(|n| names.intern(n)),
                    protocol: p.protocol.as_deref().map(|n| names.intern(n)),
                    port,
                    app_protocol: p.app_protocol.as_deref().map(|a| names.intern(a)),
                }),
                None => problems.push(format!(
                    "port {:?}: {:?} is not in 1..65535; skipped",
                    p.name.as_deref().unwrap_or(""),
                    p.port
                )),
            }
        }
        LocalSlice {
            id: NamespacedName::new(names.intern(namespace), names.intern(name)),
            service: slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_K8S_SERVICE_NAME))
                .map(|s| names.intern(s)),
            family: family.map_err(|_| names.intern(&slice.address_type)),
            ports: ports.into_boxed_slice(),
            endpoints: Arc::new(Endpoints::sorted(endpoints)),
            problems: problems.into_boxed_slice(),
        }
    }
}
