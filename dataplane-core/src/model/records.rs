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

use k8s_openapi::api::discovery::v1::{
    Endpoint as K8sEndpoint, EndpointConditions, EndpointPort, EndpointSlice,
};

use super::{
    ClusterId, IdRef, IpFamily, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER,
    MANAGED_BY, NamespacedName, ObjectMeta, ServiceImport, ServiceImportSpec, ServiceImportStatus,
    ServiceImportType, ServicePort, SessionAffinityConfig, key,
    name::{Interner, Name},
    parse_ip,
};

/// An endpoint's `ready`, `serving` and `terminating`, each unset, false or true, in one byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Conditions(u8);

impl Conditions {
    /// Packs the three optional conditions of the API.
    pub fn new(ready: Option<bool>, serving: Option<bool>, terminating: Option<bool>) -> Self {
        let code = |v: Option<bool>| match v {
            None => 0u8,
            Some(false) => 1,
            Some(true) => 2,
        };
        Conditions(code(ready) | code(serving) << 2 | code(terminating) << 4)
    }

    fn get(self, shift: u8) -> Option<bool> {
        match (self.0 >> shift) & 3 {
            1 => Some(false),
            2 => Some(true),
            _ => None,
        }
    }

    /// `ready` as the API has it.
    pub fn ready(self) -> Option<bool> {
        self.get(0)
    }

    /// `serving` as the API has it.
    pub fn serving(self) -> Option<bool> {
        self.get(2)
    }

    /// `terminating` as the API has it.
    pub fn terminating(self) -> Option<bool> {
        self.get(4)
    }

    /// Whether no condition is set (the API's `conditions` is then absent or empty).
    pub fn is_unset(self) -> bool {
        self.0 == 0
    }

    /// Whether the endpoint takes new connections (a nil `ready` means ready).
    pub fn is_ready(self) -> bool {
        self.ready().unwrap_or(true)
    }

    /// Whether it is serving while terminating: kube-proxy's fallback when no endpoint of a
    /// frontend is ready (a nil `serving` means `ready`).
    pub fn is_serving_terminating(self) -> bool {
        self.serving().unwrap_or(self.is_ready()) && self.terminating().unwrap_or(false)
    }

    fn of(c: Option<&EndpointConditions>) -> Self {
        c.map(|c| Conditions::new(c.ready, c.serving, c.terminating))
            .unwrap_or_default()
    }

    fn to_k8s(self) -> Option<EndpointConditions> {
        (!self.is_unset()).then(|| EndpointConditions {
            ready: self.ready(),
            serving: self.serving(),
            terminating: self.terminating(),
        })
    }
}

/// One endpoint: its first address (the one clients are sent to) and its conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// The endpoint's address.
    pub addr: IpAddr,
    /// Its `ready`, `serving` and `terminating`.
    pub conditions: Conditions,
}

/// The parts of an endpoint that few endpoints have.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointExtra {
    /// Addresses after the first one (the API allows up to 100; they are fungible).
    pub more_addresses: Box<[IpAddr]>,
    /// The endpoint's hostname, which headless DNS answers use.
    pub hostname: Option<Name>,
    /// The endpoint's zone.
    pub zone: Option<Name>,
}

impl EndpointExtra {
    fn is_empty(&self) -> bool {
        self.more_addresses.is_empty() && self.hostname.is_none() && self.zone.is_none()
    }
}

/// One endpoint with its extras, as [`Endpoints::iter`] yields it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointRef<'a> {
    /// The address and conditions.
    pub endpoint: Endpoint,
    /// More addresses, hostname and zone, when it has any.
    pub extra: Option<&'a EndpointExtra>,
}

impl EndpointRef<'_> {
    /// Every address of the endpoint, the first one first.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        std::iter::once(self.endpoint.addr).chain(
            self.extra
                .into_iter()
                .flat_map(|e| e.more_addresses.iter().copied()),
        )
    }

    /// The hostname, when the endpoint has one.
    pub fn hostname(&self) -> Option<&str> {
        self.extra.and_then(|e| e.hostname.as_deref())
    }
}

/// An IPv4 endpoint as [`Endpoints`] stores it: 5 bytes instead of [`Endpoint`]'s 18.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Ipv4Endpoint([u8; 4], Conditions);

impl Ipv4Endpoint {
    fn widen(&self) -> Endpoint {
        Endpoint {
            addr: IpAddr::from(self.0),
            conditions: self.1,
        }
    }
}

/// The endpoints' addresses and conditions. Nearly every slice holds one family, and IPv4
/// ones are most of a cluster set's endpoints: they are stored in a third of the room.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum EndpointList {
    /// Every address is IPv4.
    Ipv4(Box<[Ipv4Endpoint]>),
    /// Any addresses.
    Any(Box<[Endpoint]>),
}

impl Default for EndpointList {
    /// What [`EndpointList::new`] makes of no endpoints, so that equal lists compare equal.
    fn default() -> Self {
        EndpointList::Ipv4(Box::default())
    }
}

impl EndpointList {
    fn new(list: Vec<Endpoint>) -> Self {
        let ipv4: Option<Box<[Ipv4Endpoint]>> = list
            .iter()
            .map(|e| match e.addr {
                IpAddr::V4(a) => Some(Ipv4Endpoint(a.octets(), e.conditions)),
                IpAddr::V6(_) => None,
            })
            .collect();
        match ipv4 {
            Some(ipv4) => EndpointList::Ipv4(ipv4),
            None => EndpointList::Any(list.into_boxed_slice()),
        }
    }

    fn iter(&self) -> EndpointIter<'_> {
        match self {
            EndpointList::Ipv4(l) => EndpointIter(EndpointIterInner::Ipv4(l.iter())),
            EndpointList::Any(l) => EndpointIter(EndpointIterInner::Any(l.iter())),
        }
    }
}

/// The endpoints of a slice, as [`Endpoints::list`] yields them.
#[derive(Clone, Debug)]
pub struct EndpointIter<'a>(EndpointIterInner<'a>);

#[derive(Clone, Debug)]
enum EndpointIterInner<'a> {
    Ipv4(std::slice::Iter<'a, Ipv4Endpoint>),
    Any(std::slice::Iter<'a, Endpoint>),
}

impl Iterator for EndpointIter<'_> {
    type Item = Endpoint;

    fn next(&mut self) -> Option<Endpoint> {
        match &mut self.0 {
            EndpointIterInner::Ipv4(i) => i.next().map(Ipv4Endpoint::widen),
            EndpointIterInner::Any(i) => i.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            EndpointIterInner::Ipv4(i) => i.size_hint(),
            EndpointIterInner::Any(i) => i.size_hint(),
        }
    }
}

impl ExactSizeIterator for EndpointIter<'_> {}

/// The endpoints of a slice, in a stable order, with the extras of the few endpoints that have
/// any in a side table (by index).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Endpoints {
    list: EndpointList,
    /// Sorted by index.
    extras: Box<[(u32, EndpointExtra)]>,
}

impl Endpoints {
    /// Collects endpoints (with their extras) in the order given.
    pub fn new(endpoints: impl IntoIterator<Item = (Endpoint, Option<EndpointExtra>)>) -> Self {
        let mut list = Vec::new();
        let mut extras = Vec::new();
        for (i, (endpoint, extra)) in endpoints.into_iter().enumerate() {
            list.push(endpoint);
            if let Some(extra) = extra.filter(|e| !e.is_empty()) {
                extras.push((u32::try_from(i).unwrap_or(u32::MAX), extra));
            }
        }
        Endpoints {
            list: EndpointList::new(list),
            extras: extras.into_boxed_slice(),
        }
    }

    /// Sorts and deduplicates endpoints (by address, extras, then conditions), so the result
    /// does not depend on the order they came in.
    pub fn sorted(endpoints: impl IntoIterator<Item = (Endpoint, Option<EndpointExtra>)>) -> Self {
        let mut all: Vec<(Endpoint, Option<EndpointExtra>)> = endpoints
            .into_iter()
            .map(|(e, x)| (e, x.filter(|x| !x.is_empty())))
            .collect();
        all.sort_unstable_by(|a, b| {
            (a.0.addr, &a.1, a.0.conditions).cmp(&(b.0.addr, &b.1, b.0.conditions))
        });
        all.dedup();
        Self::new(all)
    }

    /// The endpoints' addresses and conditions, without the extras, in order.
    pub fn list(&self) -> EndpointIter<'_> {
        self.list.iter()
    }

    /// Every endpoint with its extras, in order.
    pub fn iter(&self) -> impl Iterator<Item = EndpointRef<'_>> + '_ {
        let mut extras = self.extras.iter().peekable();
        self.list().enumerate().map(move |(i, endpoint)| {
            let extra = extras
                .next_if(|(at, _)| *at as usize == i)
                .map(|(_, extra)| extra);
            EndpointRef { endpoint, extra }
        })
    }

    /// How many endpoints there are.
    pub fn len(&self) -> usize {
        self.list().len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.list().len() == 0
    }

    /// Whether any endpoint is ready.
    pub fn any_ready(&self) -> bool {
        self.list().any(|e| e.conditions.is_ready())
    }

    /// The endpoints as the API has them.
    pub fn to_k8s(&self) -> Vec<K8sEndpoint> {
        self.iter()
            .map(|e| K8sEndpoint {
                addresses: e.addresses().map(|a| a.to_string()).collect(),
                conditions: e.endpoint.conditions.to_k8s(),
                hostname: e.hostname().map(str::to_owned),
                zone: e.extra.and_then(|x| x.zone.as_deref()).map(str::to_owned),
                ..Default::default()
            })
            .collect()
    }
}

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
