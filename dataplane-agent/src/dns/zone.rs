//! The `clusterset.local` zone: DNS answers computed from the node's imports, per the MCS DNS
//! specification (KEP-1645, schema 1.0.0). Pure: no sockets, no async, no server types; records
//! are hickory-proto's.
//!
//! The zone is built per service from plain [`DnsService`]s (made from the node's inputs by
//! [`super::dns_service`]). [`build_service`] reduces one service to compact [`ServiceRecords`]
//! (its name, ClusterSet IPs, named ports; for a headless import its ready hosts), and
//! [`Zone::splice`] swaps them in: a change to one service costs the size of that service. A
//! lookup ([`Zone::answer`]) is one hash lookup by the service's name (or, for PTR, by the IP)
//! and a scan of that service's ports or hosts; the records are made for each answer, so the
//! zone holds a few hundred bytes per ClusterSetIP import.
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

use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

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
    #[error("service {namespace}/{name}: {what} {value:?} is not a lowercase DNS label")]
    BadLabel {
        namespace: String,
        name: String,
        what: &'static str,
        value: String,
    },
    #[error("service {namespace}/{name}: its DNS name is too long")]
    NameTooLong { namespace: String, name: String },
}

/// A named port's SRV label pair: `_<name>` and the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SrvPort {
    /// `_<name>`, lowercase.
    label: Box<str>,
    protocol: DnsProtocol,
    /// The port number in the SRV record (ClusterSetIP: the service port).
    port: u16,
}

/// A ready pod of a headless import: `<label>.<cluster>.<svc>...`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Host {
    cluster: Arc<str>,
    label: Box<str>,
    v4: Vec<std::net::Ipv4Addr>,
    v6: Vec<std::net::Ipv6Addr>,
}

/// The hosts of a headless import that serve one named port, with their port numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HeadlessPort {
    label: Box<str>,
    protocol: DnsProtocol,
    /// (index into `hosts`, port number of the host's slice), sorted by host name.
    targets: Vec<(u32, u16)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    ClusterSetIp {
        v4: Option<std::net::Ipv4Addr>,
        v6: Option<std::net::Ipv6Addr>,
        ports: Box<[SrvPort]>,
    },
    Headless {
        /// Sorted by (cluster, label).
        hosts: Box<[Host]>,
        /// Every ready address, each once, sorted.
        v4: Box<[std::net::Ipv4Addr]>,
        v6: Box<[std::net::Ipv6Addr]>,
        ports: Box<[HeadlessPort]>,
    },
}

/// One service in the zone: its name and the compact data its answers are made from (records
/// are made per query, so the zone holds a few hundred bytes per ClusterSetIP import).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRecords {
    /// `<svc>.<ns>.svc.clusterset.local.`
    fqdn: Name,
    kind: Kind,
    /// Ports and endpoints left out because their names are not DNS labels.
    pub skipped: Vec<String>,
}

impl ServiceRecords {
    /// `<svc>.<ns>.svc.clusterset.local.`
    pub fn fqdn(&self) -> &Name {
        &self.fqdn
    }

    /// The ClusterSet IPs (for PTR).
    fn ips(&self) -> Vec<IpAddr> {
        match &self.kind {
            Kind::ClusterSetIp { v4, v6, .. } => v4
                .map(IpAddr::V4)
                .into_iter()
                .chain(v6.map(IpAddr::V6))
                .collect(),
            Kind::Headless { .. } => Vec::new(),
        }
    }

    /// Whether the service's name exists (a headless import with no ready pod has none).
    fn exists(&self) -> bool {
        !matches!(&self.kind, Kind::Headless { hosts, .. } if hosts.is_empty())
    }

    /// Every owner name with records, sorted (SRV names, hosts and the service itself).
    pub fn names(&self) -> Vec<Name> {
        if !self.exists() {
            return Vec::new();
        }
        let mut out = vec![self.fqdn.clone()];
        let mut push = |a: &str, b: &str| {
            if let Some(n) = labels_name([a, b]).and_then(|n| n.append_domain(&self.fqdn).ok()) {
                out.push(n);
            }
        };
        match &self.kind {
            Kind::ClusterSetIp { ports, .. } => {
                for p in ports.iter() {
                    push(&p.label, p.protocol.label());
                }
            }
            Kind::Headless { hosts, ports, .. } => {
                for p in ports.iter() {
                    push(&p.label, p.protocol.label());
                }
                for h in hosts.iter() {
                    push(&h.label, &h.cluster);
                }
            }
        }
        out.sort();
        out
    }

    fn host_name(&self, host: &Host) -> Option<Name> {
        labels_name([&*host.label, &*host.cluster])?
            .append_domain(&self.fqdn)
            .ok()
    }
}

/// A service's identity in the zone: namespace and name.
pub type ServiceKey = (String, String);

/// The answer to one query: a response code and its records.
#[derive(Clone, Debug)]
pub struct Answer {
    pub code: ResponseCode,
    /// Whether the answer comes from this zone's data (the AA flag).
    pub authoritative: bool,
    answers: Vec<Record>,
    authorities: Vec<Record>,
    additionals: Vec<Record>,
}

impl Answer {
    fn code(code: ResponseCode) -> Self {
        Answer {
            code,
            authoritative: false,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
        }
    }

    /// The answer section.
    pub fn answers(&self) -> &[Record] {
        &self.answers
    }

    /// The additional section: the addresses of SRV targets.
    pub fn additionals(&self) -> &[Record] {
        &self.additionals
    }

    /// The authority section: the SOA when the answer is empty (NXDOMAIN or no data).
    pub fn authorities(&self) -> &[Record] {
        &self.authorities
    }
}

/// Every service of the zone, by name and by ClusterSet IP.
#[derive(Debug)]
pub struct Zone {
    ttl: u32,
    ready: bool,
    serial: u32,
    origin: LowerName,
    soa: Record,
    ns: Record,
    version: Record,
    /// `<svc>.<ns>.svc.clusterset.local.` → the service.
    services: HashMap<LowerName, Arc<ServiceRecords>>,
    /// Namespace → how many services it holds (`<ns>.svc.clusterset.local.` exists while any).
    namespaces: HashMap<Box<str>, usize>,
    /// ClusterSet IP → the services listing it, by name: the first one gets the PTR.
    ptr: HashMap<IpAddr, Vec<Arc<ServiceRecords>>>,
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

use dataplane_core::model::dns::is_label;

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

fn record(name: &Name, ttl: u32, data: RData) -> Record {
    Record::from_rdata(name.clone(), ttl, data)
}

/// Weight of each of `n` equal SRV records (they share 100).
fn weight(n: usize) -> u16 {
    u16::try_from(100 / n.max(1)).unwrap_or(1).max(1)
}

fn fixed_name(s: &str) -> Name {
    // The constants below are valid names; the root is a harmless fallback.
    Name::from_ascii(s).unwrap_or_else(|_| Name::root())
}

fn soa_record(ttl: u32, serial: u32) -> Record {
    let soa = SOA::new(
        fixed_name("ns.dns.clusterset.local."),
        fixed_name("hostmaster.clusterset.local."),
        serial,
        7200,
        1800,
        86400,
        ttl,
    );
    record(&fixed_name(ZONE), ttl, RData::SOA(soa))
}

/// Every address of a name, A records then AAAA (the additional section of an SRV answer).
fn both_families(
    name: &Name,
    v4: &[std::net::Ipv4Addr],
    v6: &[std::net::Ipv6Addr],
    ttl: u32,
    out: &mut Vec<Record>,
) {
    out.extend(v4.iter().map(|ip| record(name, ttl, RData::A(A(*ip)))));
    out.extend(
        v6.iter()
            .map(|ip| record(name, ttl, RData::AAAA(AAAA(*ip)))),
    );
}

/// The port of `ports` that `_<port>._<proto>` names, and that SRV owner name under `fqdn`.
fn find_srv<'p, P>(
    ports: &'p [P],
    key: impl Fn(&P) -> (&str, DnsProtocol),
    port: &[u8],
    proto: &[u8],
    fqdn: &Name,
) -> Option<(&'p P, Name)> {
    let found = ports.iter().find(|p| {
        let (label, protocol) = key(p);
        label.as_bytes() == port && protocol.label().as_bytes() == proto
    })?;
    let (label, protocol) = key(found);
    let owner = labels_name([label, protocol.label()])?
        .append_domain(fqdn)
        .ok()?;
    Some((found, owner))
}

/// The records of one service at one owner name below its name (`prefix`: the labels before
/// `<svc>.<ns>.svc.clusterset.local.`, nearest first), or `None` when no such name exists.
fn service_answer(
    svc: &ServiceRecords,
    prefix: &[&[u8]],
    rtype: RecordType,
    ttl: u32,
    out: &mut Answer,
) -> bool {
    let fqdn = &svc.fqdn;
    let addresses = |name: &Name,
                     v4: &[std::net::Ipv4Addr],
                     v6: &[std::net::Ipv6Addr],
                     rtype: RecordType,
                     out: &mut Vec<Record>| {
        if matches!(rtype, RecordType::A | RecordType::ANY) {
            out.extend(v4.iter().map(|ip| record(name, ttl, RData::A(A(*ip)))));
        }
        if rtype == RecordType::AAAA || (rtype == RecordType::ANY && v4.is_empty()) {
            out.extend(
                v6.iter()
                    .map(|ip| record(name, ttl, RData::AAAA(AAAA(*ip)))),
            );
        }
    };
    let is_srv = matches!(rtype, RecordType::SRV | RecordType::ANY);
    match (&svc.kind, prefix) {
        (Kind::Headless { hosts, .. }, _) if hosts.is_empty() => false,
        (Kind::ClusterSetIp { v4, v6, .. }, []) => {
            addresses(fqdn, v4.as_slice(), v6.as_slice(), rtype, &mut out.answers);
            true
        }
        (Kind::Headless { v4, v6, .. }, []) => {
            addresses(fqdn, v4, v6, rtype, &mut out.answers);
            true
        }
        // `_<proto>.<svc>...`: exists while a named port of that protocol has SRV records.
        (Kind::ClusterSetIp { ports, .. }, [proto]) => ports
            .iter()
            .any(|p| p.protocol.label().as_bytes() == *proto),
        (Kind::Headless { ports, hosts, .. }, [label]) => {
            ports
                .iter()
                .any(|p| p.protocol.label().as_bytes() == *label)
                || hosts.iter().any(|h| h.cluster.as_bytes() == *label)
        }
        (Kind::ClusterSetIp { v4, v6, ports }, [port, proto]) => {
            let Some((p, owner)) = find_srv(ports, |p| (&p.label, p.protocol), port, proto, fqdn)
            else {
                return false;
            };
            if is_srv {
                out.answers.push(record(
                    &owner,
                    ttl,
                    RData::SRV(SRV::new(0, 100, p.port, fqdn.clone())),
                ));
                both_families(
                    fqdn,
                    v4.as_slice(),
                    v6.as_slice(),
                    ttl,
                    &mut out.additionals,
                );
            }
            true
        }
        (Kind::Headless { hosts, ports, .. }, [port, proto]) if port.starts_with(b"_") => {
            let Some((p, owner)) = find_srv(ports, |p| (&p.label, p.protocol), port, proto, fqdn)
            else {
                return false;
            };
            if is_srv {
                let w = weight(p.targets.len());
                for (i, number) in &p.targets {
                    let Some(host) = hosts.get(*i as usize) else {
                        continue;
                    };
                    let Some(target) = svc.host_name(host) else {
                        continue;
                    };
                    out.answers.push(record(
                        &owner,
                        ttl,
                        RData::SRV(SRV::new(0, w, *number, target.clone())),
                    ));
                    addresses(&target, &host.v4, &[], RecordType::A, &mut out.additionals);
                    addresses(
                        &target,
                        &[],
                        &host.v6,
                        RecordType::AAAA,
                        &mut out.additionals,
                    );
                }
            }
            true
        }
        (Kind::Headless { hosts, .. }, [host, cluster]) => {
            let Some(h) = hosts
                .iter()
                .find(|h| h.label.as_bytes() == *host && h.cluster.as_bytes() == *cluster)
            else {
                return false;
            };
            if let Some(name) = svc.host_name(h) {
                addresses(&name, &h.v4, &h.v6, rtype, &mut out.answers);
            }
            true
        }
        _ => false,
    }
}

impl Zone {
    /// An empty zone, not ready, answering with `ttl`.
    pub fn new(ttl: u32) -> Zone {
        let origin = fixed_name(ZONE);
        let version = fixed_name("dns-version.clusterset.local.");
        Zone {
            ttl,
            ready: false,
            serial: 1,
            soa: soa_record(ttl, 1),
            ns: record(
                &origin,
                ttl,
                RData::NS(NS(fixed_name("ns.dns.clusterset.local."))),
            ),
            version: record(
                &version,
                VERSION_TTL,
                RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_owned()])),
            ),
            origin: LowerName::new(&origin),
            services: HashMap::new(),
            namespaces: HashMap::new(),
            ptr: HashMap::new(),
        }
    }

    /// The TTL of the answers.
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

    /// How many services are in the zone.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// Marks a batch of changes: a new SOA serial.
    pub fn bump_serial(&mut self) {
        self.serial = self.serial.wrapping_add(1).max(1);
        self.soa = soa_record(self.ttl, self.serial);
    }

    /// Removes every service.
    pub fn clear(&mut self) {
        self.services.clear();
        self.namespaces.clear();
        self.ptr.clear();
    }

    /// Replaces service `key` with `records` (`None`: the service is gone).
    pub fn splice(&mut self, key: ServiceKey, records: Option<ServiceRecords>) {
        // A name with uppercase letters never has records (`build_service`), and its
        // case-insensitive name is another service's: nothing of its own to replace.
        if key
            .0
            .bytes()
            .chain(key.1.bytes())
            .any(|b| b.is_ascii_uppercase())
        {
            return;
        }
        let Some(fqdn) = service_fqdn(&key.0, &key.1) else {
            return;
        };
        let fqdn = LowerName::new(&fqdn);
        if let Some(old) = self.services.remove(&fqdn) {
            let namespace = key.0.to_ascii_lowercase();
            if let Some(count) = self.namespaces.get_mut(namespace.as_str()) {
                *count -= 1;
                if *count == 0 {
                    self.namespaces.remove(namespace.as_str());
                }
            }
            for ip in old.ips() {
                if let Some(list) = self.ptr.get_mut(&ip) {
                    list.retain(|s| !Arc::ptr_eq(s, &old));
                    if list.is_empty() {
                        self.ptr.remove(&ip);
                    }
                }
            }
        }
        let Some(records) = records else {
            return;
        };
        let records = Arc::new(records);
        *self
            .namespaces
            .entry(key.0.to_ascii_lowercase().into())
            .or_default() += 1;
        for ip in records.ips() {
            let list = self.ptr.entry(ip).or_default();
            let at = list.partition_point(|s| s.fqdn < records.fqdn);
            list.insert(at, records.clone());
        }
        self.services.insert(fqdn, records);
    }

    /// The answer to a query for `name` and `rtype` (class IN).
    pub fn answer(&self, name: &LowerName, rtype: RecordType) -> Answer {
        let in_zone = self.origin.zone_of(name);
        let reverse = if in_zone {
            None
        } else {
            match name.parse_arpa_name() {
                // Only an address's own reverse name: hickory also parses `010` or `+10`.
                Ok(net)
                    if net.prefix_len() == net.max_prefix_len()
                        && LowerName::from(Name::from(net.addr())) == *name =>
                {
                    Some(net.addr())
                }
                // Not clusterset.local and not one address's reverse name: not ours.
                _ => return Answer::code(ResponseCode::Refused),
            }
        };
        match rtype {
            // Zone transfers are not offered.
            RecordType::AXFR | RecordType::IXFR => return Answer::code(ResponseCode::Refused),
            // A pseudo-record is not something to ask for.
            RecordType::OPT | RecordType::TSIG => return Answer::code(ResponseCode::FormErr),
            // MAILB, MAILA: obsolete meta-queries.
            RecordType::Unknown(253 | 254) => return Answer::code(ResponseCode::NotImp),
            _ => {}
        }
        if !self.ready {
            return Answer::code(ResponseCode::ServFail);
        }
        let mut out = Answer {
            code: ResponseCode::NoError,
            authoritative: true,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
        };
        if let Some(ip) = reverse {
            // Only the reverse names of ClusterSet IPs are answered.
            let Some(owner) = self.ptr.get(&ip).and_then(|l| l.first()) else {
                return Answer::code(ResponseCode::Refused);
            };
            if matches!(rtype, RecordType::PTR | RecordType::ANY) {
                out.answers.push(record(
                    &Name::from(ip),
                    self.ttl,
                    RData::PTR(PTR(owner.fqdn.clone())),
                ));
            }
            return out;
        }
        if !self.lookup(name, rtype, &mut out) {
            out.code = ResponseCode::NXDomain;
        }
        if out.answers.is_empty() {
            out.authorities.push(self.soa.clone());
        }
        out
    }

    /// Fills `out` for a name of the zone; `false` when the name does not exist.
    fn lookup(&self, name: &LowerName, rtype: RecordType, out: &mut Answer) -> bool {
        // Labels nearest first: [..., <svc>, <ns>, svc, clusterset, local].
        let mut labels: [&[u8]; 8] = [&[]; 8];
        // Every label: `num_labels` leaves out a leading `*`, which `iter` and `trim_to` count.
        let n = name.iter().count();
        if n > labels.len() {
            return false;
        }
        for (slot, label) in labels.iter_mut().zip(name.iter()) {
            *slot = label;
        }
        let any = rtype == RecordType::ANY;
        match n {
            2 => {
                match rtype {
                    RecordType::SOA | RecordType::ANY => out.answers.push(self.soa.clone()),
                    RecordType::NS => out.answers.push(self.ns.clone()),
                    _ => {}
                }
                true
            }
            3 if labels[0] == b"dns-version" => {
                if rtype == RecordType::TXT || any {
                    out.answers.push(self.version.clone());
                }
                true
            }
            3 => labels[0] == b"svc",
            _ if labels[n - 3] != b"svc" => false,
            4 => std::str::from_utf8(labels[0]).is_ok_and(|ns| self.namespaces.contains_key(ns)),
            _ => {
                let fqdn = LowerName::new(&name.trim_to(5));
                match self.services.get(&fqdn) {
                    Some(svc) => service_answer(svc, &labels[..n - 5], rtype, self.ttl, out),
                    None => false,
                }
            }
        }
    }
}

mod build;
pub use build::build_service;

#[cfg(test)]
mod tests;
