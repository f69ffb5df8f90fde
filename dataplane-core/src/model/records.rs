//! Compact records of what the node routes from: a ServiceImport ([`ImportRecord`]) and an
//! imported EndpointSlice ([`ImportedSlice`]), converted from the Kubernetes objects at the
//! edge, as they arrive, and shared (`Arc`) from then on.
//!
//! A record keeps exactly what the lb table, DNS and the controller's writes read, with
//! addresses parsed once and names interned ([`Interner`]). An endpoint costs 5 bytes in an
//! IPv4 slice and 18 in others (its first address and its conditions); the rare extras (more
//! addresses, hostname, zone) live in a side table of its slice. What the conversion had to
//! drop (a malformed address, port or label) is kept as a warning with the record, in the
//! words the lb table reports.
//!
//! `to_k8s` turns a record back into the object it stands for (canonical address text, the
//! metadata the record keeps), for the writers and the JSON of `plan`.

use std::{collections::BTreeMap, fmt, net::IpAddr, sync::Arc};

use k8s_openapi::api::discovery::v1::{EndpointPort, EndpointSlice};

mod endpoints;

pub use endpoints::{Conditions, Endpoint, EndpointExtra, EndpointIter, EndpointRef, Endpoints};

use super::{
    ClusterId, IdRef, IpFamily, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER,
    MANAGED_BY, NamespacedName, ObjectMeta, ServiceImport, ServiceImportSpec, ServiceImportStatus,
    ServiceImportType, ServicePort, SessionAffinityConfig, key,
    name::{Interner, Name},
    parse_ip,
};

/// A Kubernetes port protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortProtocol {
    /// `TCP` (the default).
    Tcp,
    /// `UDP`.
    Udp,
    /// `SCTP`: imported and shown, never load-balanced at socket level.
    Sctp,
}

impl PortProtocol {
    /// Parses the API's protocol; `None` means TCP. Unknown values give `Err` with the value.
    pub fn parse(p: Option<&str>) -> Result<Self, String> {
        match p.unwrap_or("TCP") {
            "TCP" => Ok(PortProtocol::Tcp),
            "UDP" => Ok(PortProtocol::Udp),
            "SCTP" => Ok(PortProtocol::Sctp),
            other => Err(other.to_owned()),
        }
    }

    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PortProtocol::Tcp => "TCP",
            PortProtocol::Udp => "UDP",
            PortProtocol::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for PortProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A port of a slice: the name of the Service port it serves, its protocol and the endpoints'
/// port number.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlicePort {
    /// The Service port's name (empty for the unnamed port).
    pub name: Name,
    /// Its protocol.
    pub protocol: PortProtocol,
    /// The number the endpoints listen on, 1..=65535.
    pub port: u16,
    /// The L7 protocol hint, when given.
    pub app_protocol: Option<Name>,
}

/// An imported EndpointSlice: one source cluster's endpoints of one service and family, with
/// the ports that cluster declares identically to the merged ports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImportedSlice {
    /// The slice's object name.
    pub name: Name,
    /// The service it belongs to: its namespace and the `multicluster.kubernetes.io/service-name` label.
    pub service: NamespacedName,
    /// The `multicluster.kubernetes.io/source-cluster` label.
    pub cluster: ClusterId,
    /// The `addressType`.
    pub family: IpFamily,
    /// Each (name, protocol) once. Shared: equal lists are one allocation
    /// ([`Interner::port_list`]).
    pub ports: Arc<[SlicePort]>,
    /// Shared: the merge hands a member's endpoints on without copying them.
    pub endpoints: Arc<Endpoints>,
}

/// A record and what its conversion dropped, in the lb table's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converted<T> {
    /// The record, or the object's names when nothing usable is left. The record names its
    /// object itself, so a usable one (nearly all) carries no second copy of them.
    outcome: Result<T, Box<Unusable>>,
    /// What was dropped, and why.
    pub warnings: Box<[String]>,
}

/// The names of an object that gave no record.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Unusable {
    id: NamespacedName,
    service: Option<NamespacedName>,
}

/// What a record names of the object it stands for.
pub trait Record {
    /// The object's namespace/name.
    fn id(&self) -> IdRef<'_>;
    /// The service it belongs to.
    fn service(&self) -> &NamespacedName;
}

impl Record for ImportRecord {
    fn id(&self) -> IdRef<'_> {
        self.service.id_ref()
    }
    fn service(&self) -> &NamespacedName {
        &self.service
    }
}

impl Record for ImportedSlice {
    fn id(&self) -> IdRef<'_> {
        IdRef {
            namespace: &self.service.namespace,
            name: &self.name,
        }
    }
    fn service(&self) -> &NamespacedName {
        &self.service
    }
}

impl<T> Converted<T> {
    /// A usable record.
    pub fn new(record: T, warnings: Vec<String>) -> Self {
        Converted {
            outcome: Ok(record),
            warnings: warnings.into_boxed_slice(),
        }
    }

    /// An object that gave no record: its namespace/name and, when known, its service.
    pub fn unusable(
        id: NamespacedName,
        service: Option<NamespacedName>,
        warnings: Vec<String>,
    ) -> Self {
        Converted {
            outcome: Err(Box::new(Unusable { id, service })),
            warnings: warnings.into_boxed_slice(),
        }
    }

    /// The record, or `None` when nothing usable is left.
    pub fn record(&self) -> Option<&T> {
        self.outcome.as_ref().ok()
    }

    /// The record, taken out.
    pub fn into_record(self) -> Option<T> {
        self.outcome.ok()
    }
}

impl<T: Record> Converted<T> {
    /// The object's namespace/name.
    pub fn id(&self) -> IdRef<'_> {
        match &self.outcome {
            Ok(record) => record.id(),
            Err(unusable) => unusable.id.id_ref(),
        }
    }

    /// The service it belongs to: an import's own namespace/name, a slice's namespace and
    /// service-name label (`None` without the label).
    pub fn service(&self) -> Option<&NamespacedName> {
        match &self.outcome {
            Ok(record) => Some(record.service()),
            Err(unusable) => unusable.service.as_ref(),
        }
    }
}

impl ImportedSlice {
    /// The labels of the EndpointSlice the controller writes for it.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_SERVICE_NAME.to_owned(), self.service.name.to_string()),
            (LABEL_SOURCE_CLUSTER.to_owned(), self.cluster.to_string()),
            (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        ])
    }

    /// The port this slice gives the service port named `name` with `protocol`.
    pub fn port(&self, name: &str, protocol: PortProtocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| &*p.name == name && p.protocol == protocol)
            .map(|p| p.port)
    }

    /// Converts an imported EndpointSlice. A slice without the service-name or source-cluster
    /// label, with an invalid cluster id or an `addressType` other than IPv4/IPv6 gives no
    /// record; bad ports and addresses are dropped alone.
    pub fn from_k8s(slice: &EndpointSlice, names: &Interner) -> Converted<ImportedSlice> {
        let (namespace, slice_name) = key(&slice.metadata);
        let namespace = names.intern(namespace);
        // Not interned: a slice's name is its own (the interner's entry would cost more than
        // the name), and the record shares this one.
        let slice_name: Name = Arc::from(slice_name);
        let labels = slice.metadata.labels.as_ref();
        let service = labels
            .and_then(|l| l.get(LABEL_SERVICE_NAME))
            .map(|s| NamespacedName::new(namespace.clone(), names.intern(s)));
        let mut warnings = Vec::new();
        match Self::convert(slice, &slice_name, names, service.as_ref(), &mut warnings) {
            Some(record) => Converted::new(record, warnings),
            None => Converted::unusable(
                NamespacedName::new(namespace, slice_name),
                service,
                warnings,
            ),
        }
    }

    fn convert(
        slice: &EndpointSlice,
        slice_name: &Name,
        names: &Interner,
        service: Option<&NamespacedName>,
        warnings: &mut Vec<String>,
    ) -> Option<ImportedSlice> {
        let Some(service) = service else {
            warnings.push(format!(
                "no {LABEL_SERVICE_NAME} label; not an imported slice"
            ));
            return None;
        };
        let labels = slice.metadata.labels.as_ref();
        let Some(raw_cluster) = labels.and_then(|l| l.get(LABEL_SOURCE_CLUSTER)) else {
            warnings.push(format!("no {LABEL_SOURCE_CLUSTER} label"));
            return None;
        };
        let cluster = match ClusterId::new(raw_cluster.as_str()) {
            Ok(c) => c,
            Err(e) => {
                warnings.push(e.to_string());
                return None;
            }
        };
        let Ok(family) = slice.address_type.parse::<IpFamily>() else {
            warnings.push(format!(
                "addressType {:?} is not IPv4 or IPv6",
                slice.address_type
            ));
            return None;
        };
        let mut ports: Vec<SlicePort> = Vec::new();
        for p in slice.ports.iter().flatten() {
            let name = p.name.as_deref().unwrap_or("");
            let protocol = match PortProtocol::parse(p.protocol.as_deref()) {
                Ok(proto) => proto,
                Err(other) => {
                    warnings.push(format!(
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
                warnings.push(format!(
                    "port {name:?}: port {:?} is not in 1..65535",
                    p.port
                ));
                continue;
            };
            let port = SlicePort {
                name: names.intern(name),
                protocol,
                port: number,
                app_protocol: p.app_protocol.as_deref().map(|a| names.intern(a)),
            };
            match ports
                .iter_mut()
                .find(|q| *q.name == *name && q.protocol == protocol)
            {
                Some(existing) => {
                    *existing = port;
                    warnings.push(format!(
                        "port {name:?}/{protocol} appears twice; the last one is used"
                    ));
                }
                None => ports.push(port),
            }
        }
        let mut endpoints = Vec::with_capacity(slice.endpoints.len());
        for ep in &slice.endpoints {
            let mut addrs = Vec::with_capacity(ep.addresses.len());
            for addr in &ep.addresses {
                match parse_ip(addr) {
                    Some(ip) if IpFamily::of(&ip) == family => addrs.push(ip),
                    Some(ip) => warnings.push(format!(
                        "address {ip} does not match addressType {family}; skipped"
                    )),
                    None => {
                        warnings.push(format!("address {addr:?} is not an IP address; skipped"))
                    }
                }
            }
            let Some((&first, more)) = addrs.split_first() else {
                continue;
            };
            let extra = EndpointExtra {
                more_addresses: more.into(),
                hostname: ep.hostname.as_deref().map(|h| names.intern(h)),
                zone: ep.zone.as_deref().map(|z| names.intern(z)),
            };
            endpoints.push((
                Endpoint {
                    addr: first,
                    conditions: Conditions::of(ep.conditions.as_ref()),
                },
                Some(extra),
            ));
        }
        Some(ImportedSlice {
            name: slice_name.clone(),
            service: service.clone(),
            cluster: cluster.interned(names),
            family,
            ports: names.port_list(ports),
            endpoints: Arc::new(Endpoints::sorted(endpoints)),
        })
    }

    /// The EndpointSlice this record stands for, with the labels the controller writes.
    pub fn to_k8s(&self) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                namespace: Some(self.service.namespace.to_string()),
                labels: Some(self.labels()),
                ..Default::default()
            },
            address_type: self.family.address_type().to_owned(),
            endpoints: self.endpoints.to_k8s(),
            ports: (!self.ports.is_empty()).then(|| {
                self.ports
                    .iter()
                    .map(|p| EndpointPort {
                        name: (!p.name.is_empty()).then(|| p.name.to_string()),
                        protocol: Some(p.protocol.as_str().to_owned()),
                        port: Some(i32::from(p.port)),
                        app_protocol: p.app_protocol.as_deref().map(str::to_owned),
                    })
                    .collect()
            }),
        }
    }
}

/// Labels or annotations of a record: one pointer when there are none, as on nearly every
/// import a node files (a map per import at 10,000 services).
#[derive(Clone, Debug, Default)]
// The box is the point: 8 bytes when empty, where a map is 24.
#[allow(clippy::box_collection)]
pub struct StringMap(Option<Box<BTreeMap<String, String>>>);

static NO_STRINGS: BTreeMap<String, String> = BTreeMap::new();

impl StringMap {
    /// Sets `key` to `value`; the value it had.
    pub fn insert(&mut self, key: String, value: String) -> Option<String> {
        self.0.get_or_insert_default().insert(key, value)
    }
}

impl std::ops::Deref for StringMap {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        self.0.as_deref().unwrap_or(&NO_STRINGS)
    }
}

impl From<BTreeMap<String, String>> for StringMap {
    fn from(map: BTreeMap<String, String>) -> Self {
        StringMap((!map.is_empty()).then(|| Box::new(map)))
    }
}

impl PartialEq for StringMap {
    /// By content: no map and an empty one are equal.
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

/// A ServiceImport as the node routes it and the controller writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportRecord {
    /// Its namespace and name.
    pub service: NamespacedName,
    /// `spec.type`.
    pub type_: ServiceImportType,
    /// The ClusterSet IPs, aligned with `ip_families` (each IP's own family when that is
    /// empty). Unparseable entries were dropped with a warning.
    pub ips: Vec<IpAddr>,
    /// `spec.ipFamilies`.
    pub ip_families: Vec<IpFamily>,
    /// `spec.ports`.
    pub ports: Vec<ServicePort>,
    /// `spec.sessionAffinity`.
    pub session_affinity: Option<Name>,
    /// `spec.sessionAffinityConfig`.
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `spec.internalTrafficPolicy`.
    pub internal_traffic_policy: Option<Name>,
    /// `spec.trafficDistribution`.
    pub traffic_distribution: Option<Name>,
    /// The exported labels the import carries.
    pub labels: StringMap,
    /// The exported annotations the import carries.
    pub annotations: StringMap,
    /// `status`, when the import has one (boxed: the node's imports have none).
    pub status: Option<Box<ServiceImportStatus>>,
}

impl ImportRecord {
    /// The cluster ids of `status.clusters` (none without a status).
    pub fn status_clusters(&self) -> impl Iterator<Item = &str> {
        self.status
            .iter()
            .flat_map(|s| &s.clusters)
            .map(|c| c.cluster.as_str())
    }

    /// Converts a ServiceImport. `keep_meta` keeps its labels, annotations and status (the
    /// controller compares them); the node drops them.
    pub fn from_k8s(si: &ServiceImport, names: &Interner, keep_meta: bool) -> Converted<Self> {
        let (namespace, name) = key(&si.metadata);
        let id = NamespacedName::new(names.intern(namespace), names.intern(name));
        let mut warnings = Vec::new();
        let mut ips = Vec::with_capacity(si.spec.ips.len());
        for (i, raw) in si.spec.ips.iter().enumerate() {
            match parse_ip(raw) {
                Some(ip) => ips.push(ip),
                None => warnings.push(format!("ips[{i}] {raw:?} is not an IP address; skipped")),
            }
        }
        let text = |v: &Option<String>| v.as_deref().map(|s| names.intern(s));
        let record = ImportRecord {
            service: id.clone(),
            type_: si.spec.type_,
            ips,
            ip_families: si.spec.ip_families.clone(),
            ports: si.spec.ports.clone(),
            session_affinity: text(&si.spec.session_affinity),
            session_affinity_config: si.spec.session_affinity_config.clone(),
            internal_traffic_policy: text(&si.spec.internal_traffic_policy),
            traffic_distribution: text(&si.spec.traffic_distribution),
            labels: if keep_meta {
                si.metadata.labels.clone().unwrap_or_default().into()
            } else {
                StringMap::default()
            },
            annotations: if keep_meta {
                si.metadata.annotations.clone().unwrap_or_default().into()
            } else {
                StringMap::default()
            },
            status: if keep_meta {
                si.status.clone().map(Box::new)
            } else {
                None
            },
        };
        Converted::new(record, warnings)
    }

    /// The ServiceImport this record stands for.
    pub fn to_k8s(&self) -> ServiceImport {
        let nonempty = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());
        let text = |v: &Option<Name>| v.as_deref().map(str::to_owned);
        ServiceImport {
            metadata: ObjectMeta {
                name: Some(self.service.name.to_string()),
                namespace: Some(self.service.namespace.to_string()),
                labels: nonempty(&self.labels),
                annotations: nonempty(&self.annotations),
                ..Default::default()
            },
            spec: ServiceImportSpec {
                ports: self.ports.clone(),
                ips: self.ips.iter().map(IpAddr::to_string).collect(),
                type_: self.type_,
                session_affinity: text(&self.session_affinity),
                session_affinity_config: self.session_affinity_config.clone(),
                ip_families: self.ip_families.clone(),
                internal_traffic_policy: text(&self.internal_traffic_policy),
                traffic_distribution: text(&self.traffic_distribution),
            },
            status: self.status.as_deref().cloned(),
        }
    }
}
