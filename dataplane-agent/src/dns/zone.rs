//! The `clusterset.local` zone: DNS answers computed from the node's imports, per the MCS DNS
//! specification (KEP-1645, schema 1.0.0). Pure: no sockets, no async, no server types; records
//! are hickory-proto's.
//!
//! The zone is built per service from plain [`DnsService`]s (made from the node's inputs by
//! [`super::dns_service`]). [`build_service`] turns one service into its [`ServiceRecords`]
//! (every owner name it answers for, with the records ready to send), and [`Zone::splice`] swaps
//! them in: a change to one service costs the size of that service. Every lookup is one hash
//! lookup by the query name ([`Zone::answer`]).
//!
//! What is served, for a service `<svc>.<ns>.svc.clusterset.local.` (F):
//!
//! | name | ClusterSetIP import | Headless import |
//! |---|---|---|
//! | F | A/AAAA: the ClusterSet IP of each family the import lists | A/AAAA: every ready endpoint; no name at all (NXDOMAIN) when none is ready |
//! | `_<port>._<proto>.`F | SRV to F for each named port, A/AAAA of F in the additional section | SRV to each ready host of the clusters whose slices carry that port, their A/AAAA in the additional section |
//! | `<host>.<cluster>.`F | (NXDOMAIN: no per-cluster names) | A/AAAA of that endpoint |
//! | reverse name of a ClusterSet IP | PTR F | |
//!
//! plus `dns-version.clusterset.local. TXT "1.0.0"` and the apex SOA and NS. A name that exists
//! without records of the asked type gets NOERROR with no answer and the SOA in the authority
//! section (RFC 2308); a name that does not exist gets NXDOMAIN. Names outside
//! `clusterset.local` (other than the reverse names of ClusterSet IPs) are refused, and until the
//! node's inputs are complete ([`Zone::set_ready`]) every name of the zone gets SERVFAIL, never a
//! wrong NXDOMAIN.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use foldhash::{HashMap, HashMapExt as _};
use hickory_proto::{
    op::ResponseCode,
    rr::{
        LowerName, Name, RData, Record, RecordType,
        domain::Label,
        rdata::{A, AAAA, NS, PTR, SOA, SRV, TXT},
    },
};

/// The zone this server is authoritative for.
pub const ZONE: &str = "clusterset.local.";
/// The schema version answered at `dns-version.clusterset.local` (TXT).
pub const SCHEMA_VERSION: &str = "1.0.0";
/// Default TTL of every answer, in seconds (the CoreDNS `multicluster` plugin's).
pub const DEFAULT_TTL: u32 = 5;
/// TTL of the version record (the specification's example).
pub const VERSION_TTL: u32 = 28800;

/// A transport protocol of a service port, as SRV names spell it (`_tcp`, `_udp`, `_sctp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DnsProtocol {
    Tcp,
    Udp,
    Sctp,
}

impl DnsProtocol {
    /// A Kubernetes protocol (`None` is TCP); `None` for an unknown one.
    pub fn parse(protocol: Option<&str>) -> Option<Self> {
        match protocol.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The SRV label: `_tcp`, `_udp` or `_sctp`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Tcp => "_tcp",
            Self::Udp => "_udp",
            Self::Sctp => "_sctp",
        }
    }
}

/// A port of a service or of an endpoint's slice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DnsPort {
    /// The port's name; unnamed ports get no SRV records.
    pub name: Option<String>,
    pub protocol: DnsProtocol,
    pub port: u16,
}

/// What kind of import a service is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsKind {
    /// A ClusterSetIP import with its ClusterSet IPs, at most one per family, only of the
    /// families the import lists.
    ClusterSetIp { ips: Vec<IpAddr> },
    /// A headless import: answered with its endpoints.
    Headless,
}

/// An endpoint address of a headless import.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsEndpoint {
    /// The slice's source cluster.
    pub cluster: String,
    /// The endpoint's hostname; when absent (or not a DNS label) a name is made from the IP.
    pub hostname: Option<String>,
    pub ip: IpAddr,
    pub ready: bool,
    /// The ports of the endpoint's slice: the ports its cluster declares like the import.
    pub ports: Vec<DnsPort>,
}

/// One import, reduced to what DNS answers need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsService {
    pub namespace: String,
    pub name: String,
    pub kind: DnsKind,
    /// The import's merged ports.
    pub ports: Vec<DnsPort>,
    /// Endpoints (headless imports only; ClusterSetIP imports are answered with their IPs).
    pub endpoints: Vec<DnsEndpoint>,
}

/// Why a service has no records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZoneError {
    #[error("service {namespace}/{name}: {what} {value:?} is not a DNS label")]
    BadLabel {
        namespace: String,
        name: String,
        what: &'static str,
        value: String,
    },
    #[error("service {namespace}/{name}: its DNS name is too long")]
    NameTooLong { namespace: String, name: String },
}

/// The records at one owner name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    a: Vec<Record>,
    aaaa: Vec<Record>,
    srv: Vec<Record>,
    /// The A/AAAA records of the SRV targets (the additional section of an SRV answer).
    srv_targets: Vec<Record>,
    ptr: Vec<Record>,
    txt: Vec<Record>,
    soa: Vec<Record>,
    ns: Vec<Record>,
}

impl Node {
    fn records(&self, rtype: RecordType) -> &[Record] {
        match rtype {
            RecordType::A => &self.a,
            RecordType::AAAA => &self.aaaa,
            RecordType::SRV => &self.srv,
            RecordType::PTR => &self.ptr,
            RecordType::TXT => &self.txt,
            RecordType::SOA => &self.soa,
            RecordType::NS => &self.ns,
            _ => &[],
        }
    }

    /// What an ANY query gets: the records of one type only, a minimal answer (RFC 8482).
    fn any_type(&self) -> Option<RecordType> {
        [
            RecordType::A,
            RecordType::AAAA,
            RecordType::SRV,
            RecordType::PTR,
            RecordType::TXT,
            RecordType::SOA,
        ]
        .into_iter()
        .find(|t| !self.records(*t).is_empty())
    }
}

/// The answer to one query: a response code and where its records come from. The records are
/// shared with the zone (no copy per query).
#[derive(Clone, Debug)]
pub struct Answer {
    pub code: ResponseCode,
    /// Whether the answer comes from this zone's data (the AA flag).
    pub authoritative: bool,
    node: Option<Arc<Node>>,
    rtype: RecordType,
    /// The apex, whose SOA goes into the authority section of a negative answer.
    apex: Option<Arc<Node>>,
}

impl Answer {
    fn code(code: ResponseCode) -> Self {
        Answer {
            code,
            authoritative: false,
            node: None,
            rtype: RecordType::NULL,
            apex: None,
        }
    }

    /// The answer section.
    pub fn answers(&self) -> &[Record] {
        self.node.as_ref().map_or(&[], |n| n.records(self.rtype))
    }

    /// The additional section: the addresses of SRV targets.
    pub fn additionals(&self) -> &[Record] {
        match &self.node {
            Some(n) if self.rtype == RecordType::SRV => &n.srv_targets,
            _ => &[],
        }
    }

    /// The authority section: the SOA when the answer is empty (NXDOMAIN or no data).
    pub fn authorities(&self) -> &[Record] {
        match &self.apex {
            Some(apex) if self.answers().is_empty() => &apex.soa,
            _ => &[],
        }
    }
}

/// The owner names and records of one service, built by [`build_service`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceRecords {
    /// `<svc>.<ns>.svc.clusterset.local.`
    pub fqdn: Option<Name>,
    /// Every owner name of the service with its records (empty nodes are names that exist
    /// only because names below them do).
    names: Vec<(LowerName, Node)>,
    /// The ClusterSet IPs, for PTR.
    ips: Vec<IpAddr>,
    /// Ports and endpoints left out because their names are not DNS labels.
    pub skipped: Vec<String>,
}

impl ServiceRecords {
    /// The owner names this service answers for, in order.
    pub fn names(&self) -> impl Iterator<Item = &LowerName> {
        self.names.iter().map(|(n, _)| n)
    }
}

/// A service's identity in the zone: namespace and name.
pub type ServiceKey = (String, String);

/// What the zone remembers of a spliced service.
#[derive(Debug)]
struct Spliced {
    names: Vec<LowerName>,
    ips: Vec<IpAddr>,
    fqdn: Option<Name>,
}

/// Every answer of the zone, indexed by owner name.
#[derive(Debug)]
pub struct Zone {
    ttl: u32,
    ready: bool,
    serial: u32,
    origin: LowerName,
    apex_name: LowerName,
    in_addr_arpa: LowerName,
    ip6_arpa: LowerName,
    apex: Arc<Node>,
    /// Names that exist in every zone: the apex, `svc.`, `dns-version.`.
    fixed: HashMap<LowerName, Arc<Node>>,
    /// Every owner name of every service.
    names: HashMap<LowerName, Arc<Node>>,
    services: HashMap<ServiceKey, Spliced>,
    /// `<ns>.svc.clusterset.local.` → how many services it holds (an empty non-terminal).
    namespaces: HashMap<LowerName, usize>,
    /// ClusterSet IP → the services listing it, sorted: the first one gets the PTR.
    claims: HashMap<IpAddr, BTreeSet<ServiceKey>>,
    /// Reverse name → its PTR node.
    reverse: HashMap<LowerName, Arc<Node>>,
}

/// A name from labels checked to be DNS labels (letters, digits, `-`, `_`; 1 to 63 bytes).
fn labels_name<'a>(labels: impl IntoIterator<Item = &'a str>) -> Option<Name> {
    let mut out = Vec::new();
    for l in labels {
        let ok = !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return None;
        }
        out.push(Label::from_ascii(&l.to_ascii_lowercase()).ok()?);
    }
    Name::from_labels(out).ok()
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The name of an endpoint without a usable hostname: its IP with `.` and `:` as `-`
/// (`10-0-0-1`, `fd00--1`).
pub fn ip_label(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

/// The host label of an endpoint: its hostname when that is a DNS label, else [`ip_label`].
pub fn host_label(hostname: Option<&str>, ip: IpAddr) -> String {
    match hostname {
        Some(h) if is_label(h) => h.to_ascii_lowercase(),
        _ => ip_label(ip),
    }
}

/// `<svc>.<ns>.svc.clusterset.local.` for a namespace and service name, if they are DNS labels.
pub fn service_fqdn(namespace: &str, name: &str) -> Option<Name> {
    if !is_label(namespace) || !is_label(name) {
        return None;
    }
    labels_name([name, namespace, "svc", "clusterset", "local"])
}

/// The DNS names of a service port, for `explain` and `inspect`: the service's name and, for a
/// named port, its SRV name (`_<port>._<proto>.<svc>.<ns>.svc.clusterset.local.`).
pub fn port_names(namespace: &str, name: &str, port: Option<&DnsPort>) -> Vec<String> {
    let Some(fqdn) = service_fqdn(namespace, name) else {
        return Vec::new();
    };
    let mut out = vec![fqdn.to_ascii()];
    if let Some(DnsPort {
        name: Some(port_name),
        protocol,
        ..
    }) = port
        && !port_name.is_empty()
        && let Some(srv) = srv_name(port_name, *protocol, &fqdn)
    {
        out.push(srv.to_ascii());
    }
    out
}

fn srv_name(port_name: &str, protocol: DnsProtocol, fqdn: &Name) -> Option<Name> {
    let port_label = format!("_{port_name}");
    labels_name([port_label.as_str(), protocol.label()])?
        .append_domain(fqdn)
        .ok()
}

fn record(name: &Name, ttl: u32, data: RData) -> Record {
    Record::from_rdata(name.clone(), ttl, data)
}

fn address(name: &Name, ttl: u32, ip: IpAddr) -> Record {
    match ip {
        IpAddr::V4(v4) => record(name, ttl, RData::A(A(v4))),
        IpAddr::V6(v6) => record(name, ttl, RData::AAAA(AAAA(v6))),
    }
}

/// Adds an address record to a node once.
fn push_address(node: &mut Node, name: &Name, ttl: u32, ip: IpAddr) {
    let rec = address(name, ttl, ip);
    let set = match ip {
        IpAddr::V4(_) => &mut node.a,
        IpAddr::V6(_) => &mut node.aaaa,
    };
    if !set.contains(&rec) {
        set.push(rec);
    }
}

/// Weight of each of `n` equal SRV records (they share 100).
fn weight(n: usize) -> u16 {
    u16::try_from(100 / n.max(1)).unwrap_or(1).max(1)
}

/// Builds every record of one service. An error means the service has no usable DNS name (a
/// namespace, name or port name that is not a DNS label); it is then left out of the zone.
pub fn build_service(svc: &DnsService, ttl: u32) -> Result<ServiceRecords, ZoneError> {
    let bad = |what: &'static str, value: &str| ZoneError::BadLabel {
        namespace: svc.namespace.clone(),
        name: svc.name.clone(),
        what,
        value: value.to_owned(),
    };
    if !is_label(&svc.namespace) {
        return Err(bad("namespace", &svc.namespace));
    }
    if !is_label(&svc.name) {
        return Err(bad("name", &svc.name));
    }
    let too_long = || ZoneError::NameTooLong {
        namespace: svc.namespace.clone(),
        name: svc.name.clone(),
    };
    let fqdn = service_fqdn(&svc.namespace, &svc.name).ok_or_else(too_long)?;
    let mut skipped = Vec::new();
    // Named ports, each (name, protocol) once, in order.
    let mut named: Vec<(&str, DnsProtocol, u16)> = Vec::new();
    for p in &svc.ports {
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            if !is_label(n) {
                skipped.push(format!(
                    "port name {n:?} is not a DNS label: no SRV records"
                ));
                continue;
            }
            if !named.iter().any(|(m, pr, _)| *m == n && *pr == p.protocol) {
                named.push((n, p.protocol, p.port));
            }
        }
    }
    // Owner name → node, sorted, so the result does not depend on the input order.
    let mut nodes: BTreeMap<Name, Node> = BTreeMap::new();
    let mut ips = Vec::new();
    match &svc.kind {
        DnsKind::ClusterSetIp { ips: vips } => {
            let mut top = Node::default();
            for ip in vips {
                push_address(&mut top, &fqdn, ttl, *ip);
                if !ips.contains(ip) {
                    ips.push(*ip);
                }
            }
            let targets: Vec<Record> = top.a.iter().chain(&top.aaaa).cloned().collect();
            for (port_name, protocol, number) in &named {
                let owner = srv_name(port_name, *protocol, &fqdn).ok_or_else(too_long)?;
                let node = nodes.entry(owner.clone()).or_default();
                node.srv.push(record(
                    &owner,
                    ttl,
                    RData::SRV(SRV::new(0, 100, *number, fqdn.clone())),
                ));
                node.srv_targets.clone_from(&targets);
                nodes.entry(owner.base_name()).or_default();
            }
            nodes.insert(fqdn.clone(), top);
        }
        DnsKind::Headless => {
            // (cluster, host) → the host's name and addresses; only ready endpoints count.
            let mut hosts: BTreeMap<(String, String), (Name, Node)> = BTreeMap::new();
            let mut top = Node::default();
            for ep in svc.endpoints.iter().filter(|e| e.ready) {
                if !is_label(&ep.cluster) {
                    skipped.push(format!(
                        "endpoint {}: cluster id {:?} is not a DNS label; left out",
                        ep.ip, ep.cluster
                    ));
                    continue;
                }
                let host = host_label(ep.hostname.as_deref(), ep.ip);
                let entry = match hosts.entry((ep.cluster.clone(), host)) {
                    std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::btree_map::Entry::Vacant(v) => {
                        let (cluster, host) = v.key();
                        let name = labels_name([host.as_str(), cluster.as_str()])
                            .and_then(|n| n.append_domain(&fqdn).ok())
                            .ok_or_else(too_long)?;
                        v.insert((name, Node::default()))
                    }
                };
                push_address(&mut entry.1, &entry.0, ttl, ep.ip);
                push_address(&mut top, &fqdn, ttl, ep.ip);
            }
            if hosts.is_empty() {
                // No ready endpoint: the name does not exist (NXDOMAIN).
                return Ok(ServiceRecords {
                    fqdn: Some(fqdn),
                    skipped,
                    ..Default::default()
                });
            }
            for (port_name, protocol, _) in &named {
                // Each host once, on the port number of its slice's port of that name.
                let mut targets: BTreeMap<&Name, (u16, &Node)> = BTreeMap::new();
                for ep in svc.endpoints.iter().filter(|e| e.ready) {
                    let Some(p) = ep
                        .ports
                        .iter()
                        .find(|p| p.protocol == *protocol && p.name.as_deref() == Some(*port_name))
                    else {
                        continue;
                    };
                    let key = (
                        ep.cluster.clone(),
                        host_label(ep.hostname.as_deref(), ep.ip),
                    );
                    if let Some((name, node)) = hosts.get(&key) {
                        targets.entry(name).or_insert((p.port, node));
                    }
                }
                if targets.is_empty() {
                    continue;
                }
                let owner = srv_name(port_name, *protocol, &fqdn).ok_or_else(too_long)?;
                let w = weight(targets.len());
                let mut node = Node::default();
                for (target, (number, host)) in &targets {
                    node.srv.push(record(
                        &owner,
                        ttl,
                        RData::SRV(SRV::new(0, w, *number, (*target).clone())),
                    ));
                    node.srv_targets
                        .extend(host.a.iter().chain(&host.aaaa).cloned());
                }
                nodes.entry(owner.base_name()).or_default();
                nodes.insert(owner, node);
            }
            for (name, node) in hosts.into_values() {
                // `<cluster>.<svc>...` exists (with no records) because its hosts do.
                nodes.entry(name.base_name()).or_default();
                nodes.insert(name, node);
            }
            nodes.insert(fqdn.clone(), top);
        }
    }
    Ok(ServiceRecords {
        fqdn: Some(fqdn),
        names: nodes
            .into_iter()
            .map(|(n, node)| (LowerName::new(&n), node))
            .collect(),
        ips,
        skipped,
    })
}

fn fixed_name(s: &str) -> LowerName {
    // The constants below are valid names; the root is a harmless fallback.
    LowerName::new(&Name::from_ascii(s).unwrap_or_else(|_| Name::root()))
}

impl Zone {
    /// An empty zone, not ready, answering with `ttl`.
    pub fn new(ttl: u32) -> Zone {
        let origin = fixed_name(ZONE);
        let version = Name::from(&fixed_name("dns-version.clusterset.local."));
        let mut fixed = HashMap::new();
        fixed.insert(
            LowerName::new(&version),
            Arc::new(Node {
                txt: vec![record(
                    &version,
                    VERSION_TTL,
                    RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_owned()])),
                )],
                ..Default::default()
            }),
        );
        fixed.insert(fixed_name("svc.clusterset.local."), Arc::default());
        let mut zone = Zone {
            ttl,
            ready: false,
            serial: 1,
            apex_name: origin.clone(),
            origin,
            in_addr_arpa: fixed_name("in-addr.arpa."),
            ip6_arpa: fixed_name("ip6.arpa."),
            apex: Arc::default(),
            fixed,
            names: HashMap::new(),
            services: HashMap::new(),
            namespaces: HashMap::new(),
            claims: HashMap::new(),
            reverse: HashMap::new(),
        };
        zone.set_apex();
        zone
    }

    /// The TTL the zone's records are built with.
    pub fn ttl(&self) -> u32 {
        self.ttl
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// The node's inputs are complete: answer from now on.
    pub fn set_ready(&mut self) {
        self.ready = true;
    }

    /// The SOA serial: it changes with every batch of changes ([`Zone::bump_serial`]).
    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// How many services have records.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    fn set_apex(&mut self) {
        let apex = Name::from(&self.apex_name);
        let ns = Name::from(&fixed_name("ns.dns.clusterset.local."));
        let mbox = Name::from(&fixed_name("hostmaster.clusterset.local."));
        let ttl = self.ttl;
        let soa = SOA::new(ns.clone(), mbox, self.serial, 7200, 1800, 86400, ttl);
        self.apex = Arc::new(Node {
            soa: vec![record(&apex, ttl, RData::SOA(soa))],
            ns: vec![record(&apex, ttl, RData::NS(NS(ns)))],
            ..Default::default()
        });
    }

    /// Marks a batch of changes: a new SOA serial.
    pub fn bump_serial(&mut self) {
        self.serial = self.serial.wrapping_add(1).max(1);
        self.set_apex();
    }

    /// Removes every service.
    pub fn clear(&mut self) {
        self.names.clear();
        self.services.clear();
        self.namespaces.clear();
        self.claims.clear();
        self.reverse.clear();
    }

    /// Replaces the records of service `key` with `records` (`None`: the service is gone).
    pub fn splice(&mut self, key: ServiceKey, records: Option<ServiceRecords>) {
        if let Some(old) = self.services.remove(&key) {
            for name in &old.names {
                self.names.remove(name);
            }
            if let Some(fqdn) = &old.fqdn {
                self.leave_namespace(fqdn);
            }
            for ip in &old.ips {
                if let Some(claims) = self.claims.get_mut(ip) {
                    claims.remove(&key);
                }
                self.set_ptr(*ip);
            }
        }
        let Some(records) = records else {
            return;
        };
        let mut spliced = Spliced {
            names: Vec::with_capacity(records.names.len()),
            ips: records.ips,
            fqdn: records.fqdn,
        };
        for (name, node) in records.names {
            self.names.insert(name.clone(), Arc::new(node));
            spliced.names.push(name);
        }
        if let Some(fqdn) = &spliced.fqdn {
            *self
                .namespaces
                .entry(LowerName::new(&fqdn.base_name()))
                .or_default() += 1;
        }
        for ip in &spliced.ips {
            self.claims.entry(*ip).or_default().insert(key.clone());
        }
        let ips = spliced.ips.clone();
        self.services.insert(key, spliced);
        for ip in ips {
            self.set_ptr(ip);
        }
    }

    fn leave_namespace(&mut self, fqdn: &Name) {
        let ns = LowerName::new(&fqdn.base_name());
        if let Some(count) = self.namespaces.get_mut(&ns) {
            *count -= 1;
            if *count == 0 {
                self.namespaces.remove(&ns);
            }
        }
    }

    /// Points the PTR of `ip` at the first service (in order) that lists it, or removes it.
    fn set_ptr(&mut self, ip: IpAddr) {
        let reverse = LowerName::new(&Name::from(ip));
        let owner = self
            .claims
            .get(&ip)
            .and_then(|c| c.first())
            .and_then(|k| self.services.get(k))
            .and_then(|s| s.fqdn.clone());
        match owner {
            Some(target) => {
                let name = Name::from(ip);
                let node = Node {
                    ptr: vec![record(&name, self.ttl, RData::PTR(PTR(target)))],
                    ..Default::default()
                };
                self.reverse.insert(reverse, Arc::new(node));
            }
            None => {
                self.claims.remove(&ip);
                self.reverse.remove(&reverse);
            }
        }
    }

    /// The answer to a query for `name` and `rtype` (class IN).
    pub fn answer(&self, name: &LowerName, rtype: RecordType) -> Answer {
        let in_zone = self.origin.zone_of(name);
        let reverse = !in_zone && self.is_reverse(name);
        if !in_zone && !reverse {
            return Answer::code(ResponseCode::Refused);
        }
        match rtype {
            // Zone transfers are not offered.
            RecordType::AXFR | RecordType::IXFR => return Answer::code(ResponseCode::Refused),
            // A pseudo-record is not something to ask for.
            RecordType::OPT | RecordType::TSIG => {
                return Answer::code(ResponseCode::FormErr);
            }
            RecordType::Unknown(253 | 254) => return Answer::code(ResponseCode::NotImp),
            _ => {}
        }
        if !self.ready {
            return Answer::code(ResponseCode::ServFail);
        }
        let node = if reverse {
            match self.reverse.get(name) {
                Some(node) => node,
                // Not a ClusterSet IP: not this server's name to answer for.
                None => return Answer::code(ResponseCode::Refused),
            }
        } else if *name == self.apex_name {
            &self.apex
        } else if let Some(node) = self.names.get(name).or_else(|| self.fixed.get(name)) {
            node
        } else if self.namespaces.contains_key(name) {
            // `<ns>.svc.clusterset.local.`: exists because services do.
            return self.negative(ResponseCode::NoError);
        } else {
            return self.negative(ResponseCode::NXDomain);
        };
        let rtype = if rtype == RecordType::ANY {
            node.any_type().unwrap_or(RecordType::A)
        } else {
            rtype
        };
        Answer {
            code: ResponseCode::NoError,
            authoritative: true,
            node: Some(node.clone()),
            rtype,
            apex: (!reverse).then(|| self.apex.clone()),
        }
    }

    /// Whether `name` is a full-length reverse name (`d.c.b.a.in-addr.arpa.`, or the 32 nibbles
    /// under `ip6.arpa.`): the name of one address.
    fn is_reverse(&self, name: &LowerName) -> bool {
        match name.num_labels() {
            6 => self.in_addr_arpa.zone_of(name),
            34 => self.ip6_arpa.zone_of(name),
            _ => false,
        }
    }

    fn negative(&self, code: ResponseCode) -> Answer {
        Answer {
            code,
            authoritative: true,
            node: None,
            rtype: RecordType::NULL,
            apex: Some(self.apex.clone()),
        }
    }
}

#[cfg(test)]
mod tests;
