//! `clusterset.local` DNS, asked over UDP and TCP on loopback with hickory's client.
//!
//! The in-process tests run the agent's own server (`dns::start`) over a zone fed exactly as the
//! node feeds it (`InputIndex` changes, then `DnsZone::sync` for the services they touched),
//! from the node inputs below: every row of the MCS DNS table, dual-stack and single-stack
//! imports, a headless import across two clusters with different ports, and changes while the
//! server runs. The root tests run the agent binary (`node --from-dir`, `run
//! --clusterset-dir`) with `--dns-listen` and follow edits of its directory.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use dataplane_agent::{
    dns::{self, DnsOptions, DnsZone, server::DnsServer},
    source::manifests::{Manifest, parse_documents},
    source::node_dir::NodeInputs,
};
use dataplane_core::{
    lb::{
        LbState,
        inputs::{Change, InputIndex, import_input, slice_input},
    },
    model::{Interner, NamespacedName},
    policy::AddressPolicy,
};
use hickory_proto::{
    op::{Message, ResponseCode},
    rr::RecordType,
};
use tests::{
    agent::Agent,
    dns::{Reply, Transport, free_port, query, query_blocking, raw_udp},
    netns::Topology,
    require_root,
};

/// The node's inputs: `web` (dual-stack, http/TCP, dns/UDP and an unnamed port), `api`
/// (IPv4 only although it has an IPv6 address too) and `db` (headless: cluster `east`
/// declares `sql`, cluster `west` declares `sql` and `admin`; one pod is not ready).
const INPUTS: &str = r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: web, namespace: demo}
spec:
  type: ClusterSetIP
  ips: [241.0.0.10, "fd00:241::10"]
  ipFamilies: [IPv4, IPv6]
  ports:
  - {name: http, protocol: TCP, port: 80}
  - {name: dns, protocol: UDP, port: 53}
  - {protocol: TCP, port: 8080}
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: api, namespace: demo}
spec:
  type: ClusterSetIP
  ips: [241.0.0.20, "fd00:241::20"]
  ipFamilies: [IPv4]
  ports: [{name: grpc, protocol: TCP, port: 9000}]
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: db, namespace: demo}
spec:
  type: Headless
  ports: [{name: sql, protocol: TCP, port: 5432}, {name: admin, protocol: TCP, port: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-east
  namespace: demo
  labels: {multicluster.kubernetes.io/service-name: web, multicluster.kubernetes.io/source-cluster: east}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: [10.1.0.5]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-east
  namespace: demo
  labels: {multicluster.kubernetes.io/service-name: db, multicluster.kubernetes.io/source-cluster: east}
addressType: IPv4
ports: [{name: sql, protocol: TCP, port: 5432}]
endpoints:
- {addresses: [10.1.0.1], hostname: db-0}
- {addresses: [10.1.0.2], hostname: db-1, conditions: {ready: false}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-east-v6
  namespace: demo
  labels: {multicluster.kubernetes.io/service-name: db, multicluster.kubernetes.io/source-cluster: east}
addressType: IPv6
ports: [{name: sql, protocol: TCP, port: 5432}]
endpoints:
- {addresses: ["fd00:1::1"], hostname: db-0}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-west
  namespace: demo
  labels: {multicluster.kubernetes.io/service-name: db, multicluster.kubernetes.io/source-cluster: west}
addressType: IPv4
ports: [{name: sql, protocol: TCP, port: 15432}, {name: admin, protocol: TCP, port: 9000}]
endpoints:
- {addresses: [10.2.0.1]}
- {addresses: [10.2.0.2], hostname: db-0}
"#;

const WEB: &str = "web.demo.svc.clusterset.local.";
const API: &str = "api.demo.svc.clusterset.local.";
const DB: &str = "db.demo.svc.clusterset.local.";

fn inputs(yaml: &str) -> NodeInputs {
    let (objects, errors) = parse_documents(yaml, Path::new("inputs.yaml"));
    assert!(errors.is_empty(), "{errors:?}");
    let mut out = NodeInputs::default();
    for o in objects {
        match o {
            Manifest::ServiceImport(si) => out.imports.push(*si),
            Manifest::EndpointSlice(s) => out.slices.push(*s),
            other => panic!("unexpected {other:?}"),
        }
    }
    out
}

/// The node's side: its input index, its lb state (which service owns each VIP) and the zone
/// it feeds, as `Node::apply` does.
struct Feed {
    index: InputIndex,
    lb: LbState,
    zone: DnsZone,
    synced: bool,
    /// The node's address policy (the default: the default ClusterSet CIDRs).
    policy: AddressPolicy,
}

impl Feed {
    fn apply(&mut self, change: Change) {
        let mut dirty = BTreeSet::new();
        self.index.apply(change, &mut dirty);
        if !self.index.is_ready() {
            return;
        }
        let index = &self.index;
        let full = !self.synced;
        let changed: Vec<NamespacedName> = if full {
            self.lb = LbState::new(std::sync::Arc::new(self.policy.clone()));
            index.services().cloned().collect()
        } else {
            dirty.into_iter().collect()
        };
        let parts = self.lb.update_parts(&changed, |s| index.inputs(s));
        let rebuilt = parts.services().to_vec();
        // The parts are built and filed as the iterator is dropped.
        drop(parts);
        self.zone.sync(
            &rebuilt,
            |s| index.inputs(s),
            &self.policy,
            &self.lb.table().vips,
            full,
        );
        self.synced = true;
    }
}

/// A server on an ephemeral loopback port, its zone not fed yet.
async fn start() -> (Feed, DnsServer, SocketAddr) {
    start_with(dns::DEFAULT_MAX_TCP_CONNECTIONS as usize).await
}

/// [`start`], with at most `max_tcp_connections` TCP connections at once.
async fn start_with(max_tcp_connections: usize) -> (Feed, DnsServer, SocketAddr) {
    start_on(&["127.0.0.1:0"], max_tcp_connections).await
}

/// [`start_with`] on the `listen` addresses (the first is returned).
async fn start_on(listen: &[&str], max_tcp_connections: usize) -> (Feed, DnsServer, SocketAddr) {
    let options = DnsOptions {
        listen: listen.iter().map(|a| a.parse().unwrap()).collect(),
        ttl: 5,
        max_tcp_connections,
    };
    let (zone, server) = dns::start(&options).unwrap().unwrap();
    let addr = server.addresses[0];
    let feed = Feed {
        index: InputIndex::default(),
        lb: LbState::default(),
        zone,
        synced: false,
        policy: AddressPolicy::default(),
    };
    (feed, server, addr)
}

/// Asks over UDP and TCP, checks both agree, and returns the reply.
async fn ask(addr: SocketAddr, name: &str, rtype: RecordType) -> Reply {
    let udp = query(addr, Transport::Udp, name, rtype).await.unwrap();
    let tcp = query(addr, Transport::Tcp, name, rtype).await.unwrap();
    assert_eq!(udp, tcp, "UDP and TCP differ for {name} {rtype}");
    udp
}

async fn data(addr: SocketAddr, name: &str, rtype: RecordType) -> (ResponseCode, Vec<String>) {
    let reply = ask(addr, name, rtype).await;
    (reply.code, reply.data())
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn every_row_of_the_spec_over_udp_and_tcp() {
    let (mut feed, _server, addr) = start().await;
    // Before the first complete lists: SERVFAIL, never a wrong NXDOMAIN.
    assert_eq!(
        ask(addr, WEB, RecordType::A).await.code,
        ResponseCode::ServFail
    );
    let node = inputs(INPUTS);
    let names = Interner::new();
    feed.apply(Change::Imports(
        node.imports
            .iter()
            .map(|i| import_input(i, &names))
            .collect(),
    ));
    assert_eq!(
        ask(addr, "nope.demo.svc.clusterset.local.", RecordType::A)
            .await
            .code,
        ResponseCode::ServFail,
        "imports listed but slices not yet"
    );
    feed.apply(Change::Slices(
        node.slices.iter().map(|s| slice_input(s, &names)).collect(),
    ));

    // ClusterSetIP A/AAAA, per family in ipFamilies.
    let web_a = ask(addr, WEB, RecordType::A).await;
    assert!(web_a.authoritative);
    assert_eq!(web_a.answers, strings(&[&format!("{WEB} A 241.0.0.10")]));
    assert_eq!(
        data(addr, WEB, RecordType::AAAA).await,
        (ResponseCode::NoError, strings(&["fd00:241::10"]))
    );
    assert_eq!(
        data(addr, API, RecordType::A).await,
        (ResponseCode::NoError, strings(&["241.0.0.20"]))
    );
    // api lists IPv4 only: its IPv6 address is not answered; NOERROR, no data, SOA.
    let api_aaaa = ask(addr, API, RecordType::AAAA).await;
    assert_eq!(
        (api_aaaa.code, api_aaaa.answers.len()),
        (ResponseCode::NoError, 0)
    );
    assert!(api_aaaa.authorities[0].contains(" SOA "), "{api_aaaa:?}");
    assert!(api_aaaa.authorities[0].starts_with("clusterset.local. SOA"));

    // SRV per named port, A/AAAA of the target in the additional section.
    let srv = ask(
        addr,
        "_http._tcp.web.demo.svc.clusterset.local.",
        RecordType::SRV,
    )
    .await;
    assert_eq!(srv.data(), strings(&[&format!("0 100 80 {WEB}")]));
    assert_eq!(
        srv.additionals,
        strings(&[
            &format!("{WEB} A 241.0.0.10"),
            &format!("{WEB} AAAA fd00:241::10")
        ])
    );
    assert_eq!(
        data(
            addr,
            "_dns._udp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .await,
        (
            ResponseCode::NoError,
            strings(&[&format!("0 100 53 {WEB}")])
        )
    );
    assert_eq!(
        data(
            addr,
            "_grpc._tcp.api.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .await,
        (
            ResponseCode::NoError,
            strings(&[&format!("0 100 9000 {API}")])
        )
    );
    assert_eq!(
        ask(
            addr,
            "_dns._tcp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .await
        .code,
        ResponseCode::NXDomain
    );

    // PTR of each ClusterSet IP; an IP beyond the listed families has none.
    assert_eq!(
        data(addr, "10.0.0.241.in-addr.arpa.", RecordType::PTR).await,
        (ResponseCode::NoError, strings(&[WEB]))
    );
    let v6 = hickory_proto::rr::Name::from("fd00:241::10".parse::<std::net::IpAddr>().unwrap());
    assert_eq!(
        data(addr, &v6.to_ascii(), RecordType::PTR).await,
        (ResponseCode::NoError, strings(&[WEB]))
    );
    let api6 = hickory_proto::rr::Name::from("fd00:241::20".parse::<std::net::IpAddr>().unwrap());
    assert_eq!(
        ask(addr, &api6.to_ascii(), RecordType::PTR).await.code,
        ResponseCode::Refused
    );

    // The schema version.
    let txt = data(addr, "dns-version.clusterset.local.", RecordType::TXT).await;
    assert_eq!(txt.0, ResponseCode::NoError);
    assert_eq!(
        txt.1
            .iter()
            .map(|t| t.trim_matches('"'))
            .collect::<Vec<_>>(),
        ["1.0.0"]
    );

    // Headless: every ready endpoint across both clusters, per family.
    assert_eq!(
        data(addr, DB, RecordType::A).await,
        (
            ResponseCode::NoError,
            strings(&["10.1.0.1", "10.2.0.1", "10.2.0.2"])
        )
    );
    assert_eq!(
        data(addr, DB, RecordType::AAAA).await,
        (ResponseCode::NoError, strings(&["fd00:1::1"]))
    );
    // Per host: `<hostname>.<clusterid>`; the hostless pod by its address.
    assert_eq!(
        data(
            addr,
            "db-0.east.db.demo.svc.clusterset.local.",
            RecordType::AAAA
        )
        .await,
        (ResponseCode::NoError, strings(&["fd00:1::1"]))
    );
    assert_eq!(
        data(
            addr,
            "db-0.west.db.demo.svc.clusterset.local.",
            RecordType::A
        )
        .await,
        (ResponseCode::NoError, strings(&["10.2.0.2"]))
    );
    assert_eq!(
        data(
            addr,
            "10-2-0-1.west.db.demo.svc.clusterset.local.",
            RecordType::A
        )
        .await,
        (ResponseCode::NoError, strings(&["10.2.0.1"]))
    );
    assert_eq!(
        ask(
            addr,
            "db-1.east.db.demo.svc.clusterset.local.",
            RecordType::A
        )
        .await
        .code,
        ResponseCode::NXDomain,
        "db-1 is not ready"
    );
    // Headless SRV: the hosts of the clusters whose slices carry the port, on their port.
    assert_eq!(
        data(
            addr,
            "_sql._tcp.db.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .await,
        (
            ResponseCode::NoError,
            strings(&[
                "0 33 15432 10-2-0-1.west.db.demo.svc.clusterset.local.",
                "0 33 15432 db-0.west.db.demo.svc.clusterset.local.",
                "0 33 5432 db-0.east.db.demo.svc.clusterset.local.",
            ])
        )
    );
    let admin = ask(
        addr,
        "_admin._tcp.db.demo.svc.clusterset.local.",
        RecordType::SRV,
    )
    .await;
    assert_eq!(
        admin.data(),
        strings(&[
            "0 50 9000 10-2-0-1.west.db.demo.svc.clusterset.local.",
            "0 50 9000 db-0.west.db.demo.svc.clusterset.local.",
        ])
    );
    assert_eq!(
        admin.additionals,
        strings(&[
            "10-2-0-1.west.db.demo.svc.clusterset.local. A 10.2.0.1",
            "db-0.west.db.demo.svc.clusterset.local. A 10.2.0.2",
        ])
    );

    // No per-cluster names for ClusterSetIP imports; unknown names: NXDOMAIN.
    for name in [
        "east.web.demo.svc.clusterset.local.",
        "pod.east.web.demo.svc.clusterset.local.",
        "missing.demo.svc.clusterset.local.",
        "web.other.svc.clusterset.local.",
    ] {
        let reply = ask(addr, name, RecordType::A).await;
        assert_eq!(reply.code, ResponseCode::NXDomain, "{name}");
        assert!(reply.authoritative);
    }
    // Names outside clusterset.local: refused, never answered.
    for name in [
        "example.com.",
        "web.demo.svc.cluster.local.",
        "clusterset.local.evil.",
    ] {
        let reply = ask(addr, name, RecordType::A).await;
        assert_eq!(reply.code, ResponseCode::Refused, "{name}");
        assert!(reply.answers.is_empty());
    }
}

#[tokio::test]
async fn answers_follow_an_import_added_and_removed() {
    let (mut feed, _server, addr) = start().await;
    let node = inputs(INPUTS);
    feed.apply(node.change(&Interner::new()));
    let new = NamespacedName::new("demo", "cache");
    assert_eq!(
        ask(addr, "cache.demo.svc.clusterset.local.", RecordType::A)
            .await
            .code,
        ResponseCode::NXDomain
    );
    let cache = inputs(
        r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: cache, namespace: demo}
spec:
  type: ClusterSetIP
  ips: ["fd00:241::30"]
  ipFamilies: [IPv6]
  ports: [{name: redis, protocol: TCP, port: 6379}]
"#,
    )
    .imports
    .remove(0);
    feed.apply(Change::Import(import_input(&cache, &Interner::new())));
    assert_eq!(
        data(addr, "cache.demo.svc.clusterset.local.", RecordType::AAAA).await,
        (ResponseCode::NoError, strings(&["fd00:241::30"]))
    );
    assert_eq!(
        ask(addr, "cache.demo.svc.clusterset.local.", RecordType::A)
            .await
            .code,
        ResponseCode::NoError,
        "single-stack IPv6: A has no data"
    );
    assert_eq!(
        data(
            addr,
            "_redis._tcp.cache.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .await,
        (
            ResponseCode::NoError,
            strings(&["0 100 6379 cache.demo.svc.clusterset.local."])
        )
    );
    // A headless slice loses its last ready pod of one cluster: the SRV follows.
    let mut west = node
        .slices
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("db-west"))
        .unwrap()
        .clone();
    west.endpoints.truncate(0);
    feed.apply(Change::Slice(slice_input(&west, &Interner::new())));
    assert_eq!(
        data(
            addr,
            "_admin._tcp.db.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .await,
        (ResponseCode::NXDomain, vec![])
    );
    assert_eq!(
        data(addr, DB, RecordType::A).await,
        (ResponseCode::NoError, strings(&["10.1.0.1"]))
    );

    feed.apply(Change::ImportDeleted(NamespacedName::of(&cache.metadata)));
    assert_eq!(
        ask(addr, "cache.demo.svc.clusterset.local.", RecordType::AAAA)
            .await
            .code,
        ResponseCode::NXDomain
    );
    let v6 = hickory_proto::rr::Name::from("fd00:241::30".parse::<std::net::IpAddr>().unwrap());
    assert_eq!(
        ask(addr, &v6.to_ascii(), RecordType::PTR).await.code,
        ResponseCode::Refused
    );
    assert!(feed.index.inputs(&new).imports.is_empty());
    // The others are untouched.
    assert_eq!(
        data(addr, WEB, RecordType::A).await,
        (ResponseCode::NoError, strings(&["241.0.0.10"]))
    );
}

/// A headless import `service` in `demo` with one port (name, port, target port) and one
/// IPv4 slice of `cluster` listing `endpoints` (YAML flow mappings).
fn headless(service: &str, cluster: &str, port: (&str, u16, u16), endpoints: &[String]) -> String {
    let (name, number, target) = port;
    let mut yaml = format!(
        r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {{name: {service}, namespace: demo}}
spec:
  type: Headless
  ports: [{{name: {name}, protocol: TCP, port: {number}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-{cluster}
  namespace: demo
  labels: {{multicluster.kubernetes.io/service-name: {service}, multicluster.kubernetes.io/source-cluster: {cluster}}}
addressType: IPv4
ports: [{{name: {name}, protocol: TCP, port: {target}}}]
endpoints:
"#
    );
    for e in endpoints {
        yaml.push_str(&format!("- {e}\n"));
    }
    yaml
}

/// A server answering a headless import `service` of cluster `east` with `count` endpoints
/// `10.<net>.0.1`, ... on one port.
async fn serving_headless(
    service: &str,
    port: (&str, u16, u16),
    net: u8,
    count: u8,
) -> (Feed, DnsServer, SocketAddr) {
    let (mut feed, server, addr) = start().await;
    let endpoints: Vec<String> = (1..=count)
        .map(|i| format!("{{addresses: [10.{net}.0.{i}]}}"))
        .collect();
    feed.apply(inputs(&headless(service, "east", port, &endpoints)).change(&Interner::new()));
    (feed, server, addr)
}

#[tokio::test]
async fn large_answers_truncate_over_udp_and_come_whole_over_tcp() {
    let (_feed, _server, addr) = serving_headless("big", ("http", 80, 8080), 3, 100).await;
    let name = "big.demo.svc.clusterset.local.";
    let udp = query(addr, Transport::Udp, name, RecordType::A)
        .await
        .unwrap();
    let tcp = query(addr, Transport::Tcp, name, RecordType::A)
        .await
        .unwrap();
    assert!(udp.truncated, "100 A records do not fit in one UDP reply");
    assert!(udp.answers.len() < 100);
    // A client that offers 65,535 bytes still gets at most 1232 over UDP (no fragments).
    let mut p = packet(0x0100, &[(&wire(name), 1, 1)], Some(0));
    let payload = p.len() - 8;
    p[payload..payload + 2].copy_from_slice(&u16::MAX.to_be_bytes());
    let bytes = raw_udp(addr, &p).unwrap().expect("a reply");
    let big = Message::from_vec(&bytes).unwrap();
    assert!(bytes.len() <= 1232, "{} bytes", bytes.len());
    assert!(big.metadata.truncation && big.answers.len() < 100);
    assert!(!tcp.truncated);
    assert_eq!(tcp.answers.len(), 100);
    let srv = query(
        addr,
        Transport::Tcp,
        "_http._tcp.big.demo.svc.clusterset.local.",
        RecordType::SRV,
    )
    .await
    .unwrap();
    assert_eq!((srv.answers.len(), srv.additionals.len()), (100, 100));
}

/// An SRV answer whose records fit in a UDP reply but whose targets' addresses do not: the
/// additional addresses that do not fit are left out, without TC (RFC 2181 §9: a client would
/// otherwise ask again over TCP every time), and the OPT record stays.
#[tokio::test]
async fn additional_addresses_that_do_not_fit_are_left_out_without_truncation() {
    // 17 SRV records of about 62 bytes (their targets are not compressed) fit in 1232 bytes;
    // their 17 addresses do not fit beside them.
    let (_feed, _server, addr) = serving_headless("db", ("sql", 5432, 5432), 4, 17).await;
    let name = wire("_sql._tcp.db.demo.svc.clusterset.local.");
    for opt in [Some(0), None] {
        let bytes = raw_udp(addr, &packet(0x0100, &[(&name, 33, 1)], opt))
            .unwrap()
            .expect("a reply");
        let reply = Message::from_vec(&bytes).expect("the reply parses");
        let limit = if opt.is_some() { 1232 } else { 512 };
        assert!(bytes.len() <= limit, "{} bytes", bytes.len());
        if opt.is_none() {
            // 17 SRV records do not fit in 512 bytes: the answer itself is truncated.
            assert!(reply.metadata.truncation);
            continue;
        }
        assert!(
            !reply.metadata.truncation,
            "{opt:?}: {} bytes, {} answers, {} additionals",
            reply.to_vec().unwrap().len(),
            reply.answers.len(),
            reply.additionals.len()
        );
        assert_eq!(reply.answers.len(), 17);
        assert!(
            !reply.additionals.is_empty() && reply.additionals.len() < 17,
            "{}",
            reply.additionals.len()
        );
        assert!(reply.edns.is_some(), "the OPT record is kept");
    }
}

/// A query message: id 0x1234, flags `flags`, the given questions and an optional OPT record.
fn packet(flags: u16, questions: &[(&[u8], u16, u16)], opt_version: Option<u8>) -> Vec<u8> {
    let mut p = vec![0x12, 0x34];
    p.extend(flags.to_be_bytes());
    p.extend((questions.len() as u16).to_be_bytes());
    p.extend([0, 0, 0, 0]);
    p.extend(u16::from(opt_version.is_some()).to_be_bytes());
    for (name, qtype, class) in questions {
        p.extend(*name);
        p.extend(qtype.to_be_bytes());
        p.extend(class.to_be_bytes());
    }
    if let Some(version) = opt_version {
        // Root name, type OPT, payload 1232, extended rcode 0, version, flags 0, no data.
        p.extend([0, 0, 41, 0x04, 0xd0, 0, version, 0, 0, 0, 0]);
    }
    p
}

/// `web.demo.svc.clusterset.local.` in wire format.
fn wire(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.trim_end_matches('.').split('.') {
        out.push(label.len() as u8);
        out.extend(label.as_bytes());
    }
    out.push(0);
    out
}

fn reply_to(addr: SocketAddr, p: &[u8]) -> Option<Message> {
    raw_udp(addr, p)
        .unwrap()
        .map(|bytes| Message::from_vec(&bytes).expect("the server's reply parses"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_an_error_code_and_never_stops_the_server() {
    let (mut feed, _server, addr) = start().await;
    feed.apply(inputs(INPUTS).change(&Interner::new()));
    let web = wire(WEB);
    let raw = tokio::task::spawn_blocking(move || {
        let code = |p: &[u8]| reply_to(addr, p).map(|m| m.metadata.response_code);
        let a_web: (&[u8], u16, u16) = (&web, 1, 1);
        // A sane raw query first.
        let ok = reply_to(addr, &packet(0x0100, &[a_web], None)).unwrap();
        assert_eq!(ok.metadata.response_code, ResponseCode::NoError);
        assert_eq!(ok.metadata.id, 0x1234);
        assert_eq!(ok.answers.len(), 1);
        // Two questions: FORMERR. No question: FORMERR.
        assert_eq!(
            code(&packet(0x0100, &[a_web, a_web], None)),
            Some(ResponseCode::FormErr)
        );
        assert_eq!(
            code(&packet(0x0100, &[], None)),
            Some(ResponseCode::FormErr)
        );
        // Opcode STATUS (2) and NOTIFY (4): NOTIMP.
        assert_eq!(
            code(&packet(0x1100, &[a_web], None)),
            Some(ResponseCode::NotImp)
        );
        assert_eq!(
            code(&packet(0x2000, &[a_web], None)),
            Some(ResponseCode::NotImp)
        );
        // Class CH: refused. EDNS version 1: BADVERS.
        assert_eq!(
            code(&packet(0x0100, &[(&web, 16, 3)], None)),
            Some(ResponseCode::Refused)
        );
        let badvers = reply_to(addr, &packet(0x0100, &[a_web], Some(1))).unwrap();
        // Code 16 (BADVERS; hickory's decoder names it BADSIG, which shares the number).
        assert_eq!(u16::from(badvers.metadata.response_code), 16);
        assert!(badvers.edns.is_some());
        // Unknown type 65280 and ANY: a minimal answer.
        let unknown = reply_to(addr, &packet(0x0100, &[(&web, 65280, 1)], None)).unwrap();
        assert_eq!(
            (unknown.metadata.response_code, unknown.answers.len()),
            (ResponseCode::NoError, 0)
        );
        let any = reply_to(addr, &packet(0x0100, &[(&web, 255, 1)], None)).unwrap();
        assert_eq!(any.metadata.response_code, ResponseCode::NoError);
        assert_eq!(any.answers.len(), 1, "ANY gets one type's records");
        // AXFR: refused.
        assert_eq!(
            code(&packet(0x0100, &[(&web, 252, 1)], None)),
            Some(ResponseCode::Refused)
        );
        // A label longer than 63 bytes, a name longer than 255, a compression loop, a
        // question cut short: FORMERR or silence, never a crash.
        let mut long_label = vec![64u8];
        long_label.extend([b'a'; 64]);
        long_label.push(0);
        let mut long_name = Vec::new();
        for _ in 0..5 {
            long_name.push(63u8);
            long_name.extend([b'b'; 63]);
        }
        long_name.push(0);
        for bad in [
            packet(0x0100, &[(&long_label, 1, 1)], None),
            packet(0x0100, &[(&long_name, 1, 1)], None),
            packet(0x0100, &[(&[0xc0, 0x0c], 1, 1)], None),
            packet(0x0100, &[a_web], None)[..20].to_vec(),
        ] {
            let c = code(&bad);
            assert!(
                matches!(c, None | Some(ResponseCode::FormErr)),
                "{c:?} for {bad:?}"
            );
        }
        // Shorter than a header: no reply at all. A response: not answered (no reflection).
        assert_eq!(code(&[0x12, 0x34, 0x01]), None);
        assert_eq!(code(&packet(0x8100, &[a_web], None)), None);
        // A bounded run of random packets.
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..300 {
            let len = rng.usize(0..600);
            let mut p: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            if rng.bool() && p.len() > 12 {
                // Mostly a plausible header: a query with one question.
                p[2] &= 0x7f;
                p[4] = 0;
                p[5] = 1;
            }
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            socket.send_to(&p, addr).unwrap();
        }
        // UDP: a reply may be lost while the burst drains; a few tries, bounded.
        (0..5).find_map(|_| reply_to(addr, &packet(0x0100, &[a_web], None)))
    })
    .await
    .unwrap();
    // Still serving, with the same answer.
    let after = raw.expect("the server still answers");
    assert_eq!(after.answers.len(), 1);
    assert_eq!(
        data(addr, WEB, RecordType::A).await,
        (ResponseCode::NoError, strings(&["241.0.0.10"]))
    );
}

/// Writes `yaml` to `dir/file` atomically.
fn write(dir: &Path, file: &str, yaml: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}

/// Asks until `pred` holds for the reply, at most 100 times 100 ms apart (no timing is
/// asserted: the bound only keeps a broken agent from hanging the test).
fn eventually(
    addr: SocketAddr,
    name: &str,
    rtype: RecordType,
    agent: &Agent,
    pred: impl Fn(&Reply) -> bool,
) -> Reply {
    let mut last = None;
    for _ in 0..100 {
        if let Ok(reply) = query_blocking(addr, Transport::Udp, name, rtype) {
            if pred(&reply) {
                return reply;
            }
            last = Some(reply);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "{name} {rtype}: last reply {last:?}; agent log:\n{}",
        agent.log_text()
    );
}

#[test]
fn agent_node_serves_dns_and_follows_its_directory() {
    require_root!();
    let topo = Topology::new(&[]).unwrap();
    let dir = topo.dir.join("node");
    std::fs::create_dir_all(&dir).unwrap();
    write(&dir, "inputs.yaml", INPUTS);
    let port = free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let agent = Agent::start(
        &topo,
        &[
            "node",
            "--from-dir",
            dir.to_str().unwrap(),
            "--dns-listen",
            &listen,
        ],
    )
    .unwrap();
    let addr: SocketAddr = listen.parse().unwrap();
    let first = eventually(addr, WEB, RecordType::A, &agent, |r| {
        r.code != ResponseCode::ServFail
    });
    assert_eq!(first.data(), strings(&["241.0.0.10"]));
    for transport in [Transport::Udp, Transport::Tcp] {
        let db = query_blocking(addr, transport, DB, RecordType::A).unwrap();
        assert_eq!(db.data(), strings(&["10.1.0.1", "10.2.0.1", "10.2.0.2"]));
    }
    // An import added while the server runs.
    let started = Instant::now();
    write(
        &dir,
        "cache.yaml",
        r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: cache, namespace: demo}
spec: {type: ClusterSetIP, ips: [241.0.0.30], ipFamilies: [IPv4], ports: [{name: redis, port: 6379}]}
"#,
    );
    let added = eventually(
        addr,
        "cache.demo.svc.clusterset.local.",
        RecordType::A,
        &agent,
        |r| r.code == ResponseCode::NoError,
    );
    eprintln!("added import answered after {:?}", started.elapsed());
    assert_eq!(added.data(), strings(&["241.0.0.30"]));
    assert_eq!(
        query_blocking(
            addr,
            Transport::Tcp,
            "30.0.0.241.in-addr.arpa.",
            RecordType::PTR
        )
        .unwrap()
        .data(),
        strings(&["cache.demo.svc.clusterset.local."])
    );
    // And removed.
    std::fs::remove_file(dir.join("cache.yaml")).unwrap();
    eventually(
        addr,
        "cache.demo.svc.clusterset.local.",
        RecordType::A,
        &agent,
        |r| r.code == ResponseCode::NXDomain,
    );
    assert_eq!(
        query_blocking(addr, Transport::Udp, WEB, RecordType::A)
            .unwrap()
            .data(),
        strings(&["241.0.0.10"])
    );
}

#[test]
fn standalone_serves_the_merged_imports() {
    require_root!();
    let topo = Topology::new(&[]).unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/clusterset");
    let report = topo.dir.join("report.yaml");
    let port = free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let agent = Agent::start(
        &topo,
        &[
            "run",
            "--clusterset-dir",
            example.to_str().unwrap(),
            "--cluster",
            "cluster-a",
            "--report",
            report.to_str().unwrap(),
            "--dns-listen",
            &listen,
        ],
    )
    .unwrap();
    let addr: SocketAddr = listen.parse().unwrap();
    let v4 = eventually(addr, WEB, RecordType::A, &agent, |r| {
        r.code != ResponseCode::ServFail
    });
    // The same ClusterSet IPs as the merge wrote into the report, one per family.
    let plan = dataplane_agent::source::clusterset_dir::plan(
        &example,
        Some(&dataplane_core::model::ClusterId::new("cluster-a").unwrap()),
    )
    .unwrap();
    let web = plan
        .merged
        .merge
        .service_imports
        .iter()
        .find(|si| &*si.service.name == "web")
        .unwrap()
        .to_k8s();
    let v6 = query_blocking(addr, Transport::Tcp, WEB, RecordType::AAAA).unwrap();
    let mut got = v4.data();
    got.extend(v6.data());
    let mut want = web.spec.ips.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    // web's ports: http/TCP is declared, so it has an SRV record.
    let srv = query_blocking(
        addr,
        Transport::Udp,
        "_http._tcp.web.demo.svc.clusterset.local.",
        RecordType::SRV,
    )
    .unwrap();
    assert_eq!(srv.data(), strings(&[&format!("0 100 80 {WEB}")]));
}

/// The dual-stack listen list that docs/dns.md and the DaemonSet suggest, `0.0.0.0:P` and
/// `[::]:P`, binds both (an IPv6 wildcard would otherwise take the IPv4 port too) and answers
/// over IPv4 and IPv6, over UDP and TCP. In a network namespace of the test's own, with only
/// `lo`, so the wildcards bind nothing of the host.
#[test]
fn dual_stack_wildcard_listen_addresses_serve_both_families() {
    require_root!();
    std::thread::spawn(|| {
        // SAFETY: unshare of this thread's network namespace: the sockets below are bound in
        // a namespace that goes away with the thread.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let up = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("ip");
        assert!(up.success());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let options = DnsOptions {
                listen: vec![
                    "0.0.0.0:5353".parse().unwrap(),
                    "[::]:5353".parse().unwrap(),
                ],
                ttl: 5,
                max_tcp_connections: 16,
            };
            let (zone, _server) = dns::start(&options)
                .expect("both addresses bind")
                .expect("a server");
            let mut feed = Feed {
                index: InputIndex::default(),
                lb: LbState::default(),
                zone,
                synced: false,
                policy: AddressPolicy::default(),
            };
            feed.apply(inputs(INPUTS).change(&Interner::new()));
            for addr in ["127.0.0.1:5353", "[::1]:5353"] {
                let reply = ask(addr.parse().unwrap(), WEB, RecordType::A).await;
                assert_eq!(reply.code, ResponseCode::NoError, "{addr}");
                assert!(!reply.answers.is_empty(), "{addr}: {reply:?}");
            }
        });
    })
    .join()
    .expect("the test thread");
}

/// An address the datapath refuses gets no name either: a ClusterSet IP outside the ClusterSet
/// CIDRs has no A record and no PTR, and a headless service's endpoints on loopback or the
/// cloud metadata address are left out of its A and SRV answers (the others stay).
#[tokio::test]
async fn refused_addresses_get_no_records() {
    let (mut feed, _server, addr) = start().await;
    let endpoints = [
        "{addresses: [169.254.169.254], hostname: meta}".to_owned(),
        "{addresses: [127.0.0.1], hostname: lo}".to_owned(),
        "{addresses: [10.2.0.5], hostname: db-0}".to_owned(),
    ];
    let yaml = format!(
        r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {{name: api, namespace: demo}}
spec:
  type: ClusterSetIP
  ips: [10.96.0.1]
  ipFamilies: [IPv4]
  ports: [{{name: http, protocol: TCP, port: 80}}]
---{}"#,
        headless("db", "west", ("sql", 5432, 5432), &endpoints)
    );
    feed.apply(inputs(&yaml).change(&Interner::new()));
    assert!(
        data(addr, API, RecordType::A).await.1.is_empty(),
        "A of a refused VIP"
    );
    assert!(
        data(addr, "1.0.96.10.in-addr.arpa.", RecordType::PTR)
            .await
            .1
            .is_empty(),
        "PTR of a refused VIP"
    );
    let (code, a) = data(addr, DB, RecordType::A).await;
    assert_eq!(code, ResponseCode::NoError);
    assert_eq!(a.len(), 1, "{a:?}");
    assert!(a[0].ends_with("10.2.0.5"), "{a:?}");
    let (_, srv) = data(addr, &format!("_sql._tcp.{DB}"), RecordType::SRV).await;
    assert_eq!(srv.len(), 1, "{srv:?}");
    assert!(srv[0].contains("db-0"), "{srv:?}");
    assert_eq!(
        data(addr, &format!("meta.west.{DB}"), RecordType::A)
            .await
            .0,
        ResponseCode::NXDomain
    );
}

/// Two imports listing one ClusterSet IP (a hand-written node directory): the lb table gives
/// it to one of them, and only that one's name resolves to it; the other has no address
/// record, so its name never leads to the first's backends. Once the first drops the IP, the
/// second gets both.
#[tokio::test]
async fn a_clusterset_ip_listed_twice_resolves_only_for_its_owner() {
    let (mut feed, _server, addr) = start().await;
    let import = |name: &str, ip: &str| {
        format!(
            "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\n\
             metadata: {{name: {name}, namespace: demo}}\n\
             spec: {{type: ClusterSetIP, ips: [{ip}], ipFamilies: [IPv4], ports: [{{name: http, protocol: TCP, port: 80}}]}}\n"
        )
    };
    let names = Interner::new();
    let both = format!(
        "{}---\n{}",
        import("a", "241.0.0.10"),
        import("b", "241.0.0.10")
    );
    feed.apply(inputs(&both).change(&names));
    let a_name = "a.demo.svc.clusterset.local.";
    let b_name = "b.demo.svc.clusterset.local.";
    let (a, b) = (
        data(addr, a_name, RecordType::A).await,
        data(addr, b_name, RecordType::A).await,
    );
    let owners = usize::from(!a.1.is_empty()) + usize::from(!b.1.is_empty());
    assert_eq!(owners, 1, "one name has the address: {a:?} {b:?}");
    let (owner, other) = if a.1.is_empty() {
        (b_name, "a")
    } else {
        (a_name, "b")
    };
    assert!(data(addr, owner, RecordType::A).await.1[0].ends_with("241.0.0.10"));

    // The owner moves to another address: the other service gets this one.
    let owner_short = if owner == a_name { "a" } else { "b" };
    feed.apply(Change::Import(import_input(
        &inputs(&import(owner_short, "241.0.0.11")).imports[0],
        &names,
    )));
    let other_name = format!("{other}.demo.svc.clusterset.local.");
    let moved = data(addr, &other_name, RecordType::A).await.1;
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert!(moved[0].ends_with("241.0.0.10"), "{moved:?}");
}

/// A TCP connection from `source` (a loopback address) to `server`.
async fn tcp_from(source: &str, server: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(source.parse().unwrap(), 0))
        .unwrap();
    socket.connect(server).await.unwrap()
}

/// What became of a message sent over TCP.
#[derive(Debug, PartialEq)]
enum Over<T> {
    Answered(T),
    /// The server closed the connection (or reset it).
    Closed,
    /// No reply within [`SILENCE`], the connection still open.
    Silent,
}

/// How long a reply may take before the server counts as silent.
const SILENCE: Duration = Duration::from_secs(2);

/// Sends `message` over `stream` (length-prefixed) and says what came back.
async fn exchange(stream: &mut tokio::net::TcpStream, message: &[u8]) -> Over<Message> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut framed = (message.len() as u16).to_be_bytes().to_vec();
    framed.extend(message);
    // A closed connection may still take the write; its read then ends.
    let _ = stream.write_all(&framed).await;
    let read = async {
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.ok()?;
        let mut reply = vec![0u8; u16::from_be_bytes(len) as usize];
        stream.read_exact(&mut reply).await.ok()?;
        Some(reply)
    };
    match tokio::time::timeout(SILENCE, read).await {
        Ok(Some(reply)) => Over::Answered(Message::from_vec(&reply).expect("the reply parses")),
        Ok(None) => Over::Closed,
        Err(_) => Over::Silent,
    }
}

/// Asks `web`'s A record over `stream`: the answer's addresses, or what happened instead.
async fn ask_over(stream: &mut tokio::net::TcpStream) -> Over<Vec<String>> {
    let query = packet(0x0100, &[(&wire(WEB), 1, 1)], None);
    match exchange(stream, &query).await {
        Over::Answered(reply) => {
            Over::Answered(reply.answers.iter().map(|r| r.data.to_string()).collect())
        }
        Over::Closed => Over::Closed,
        Over::Silent => Over::Silent,
    }
}

/// Over TCP too: a message that does not parse gets FORMERR with its id, a response gets no
/// reply, and the connection goes on answering.
#[tokio::test]
async fn bad_messages_over_tcp_get_formerr_and_the_connection_goes_on() {
    let (mut feed, _server, addr) = start().await;
    feed.apply(inputs(INPUTS).change(&Interner::new()));
    let web = Over::Answered(strings(&["241.0.0.10"]));
    let mut stream = tcp_from("127.0.0.1", addr).await;
    let cut_short = packet(0x0100, &[(&wire(WEB), 1, 1)], None)[..20].to_vec();
    let Over::Answered(reply) = exchange(&mut stream, &cut_short).await else {
        panic!("no reply to a malformed query");
    };
    assert_eq!(
        (reply.metadata.id, reply.metadata.response_code),
        (0x1234, ResponseCode::FormErr)
    );
    assert_eq!(ask_over(&mut stream).await, web);
    let response = packet(0x8100, &[(&wire(WEB), 1, 1)], None);
    assert!(
        exchange(&mut stream, &response).await == Over::Silent,
        "a response is not answered, and the connection stays open"
    );
    assert_eq!(ask_over(&mut stream).await, web);
}

/// At most an eighth of the TCP connections from one client address, and the server's cap in
/// all: the connections over either are closed as they come, the admitted ones keep
/// answering, and a place comes back when its connection closes.
#[tokio::test]
async fn tcp_connections_over_the_limits_are_closed_and_their_places_come_back() {
    // 8 connections in all, 1 per client address.
    let (mut feed, _server, addr) = start_with(8).await;
    feed.apply(inputs(INPUTS).change(&Interner::new()));
    let web = Over::Answered(strings(&["241.0.0.10"]));

    let mut first = tcp_from("127.0.0.1", addr).await;
    assert_eq!(ask_over(&mut first).await, web);
    let mut second = tcp_from("127.0.0.1", addr).await;
    assert_eq!(
        ask_over(&mut second).await,
        Over::Closed,
        "a second connection from one client"
    );

    let mut others = Vec::new();
    for i in 2..=8 {
        let mut other = tcp_from(&format!("127.0.0.{i}"), addr).await;
        assert_eq!(ask_over(&mut other).await, web, "client 127.0.0.{i}");
        others.push(other);
    }
    let mut ninth = tcp_from("127.0.0.9", addr).await;
    assert_eq!(
        ask_over(&mut ninth).await,
        Over::Closed,
        "a ninth connection in all"
    );
    // The admitted ones still answer.
    assert_eq!(ask_over(&mut first).await, web);
    assert_eq!(ask_over(&mut others[6]).await, web);

    // Closing one gives its place back (once the server has seen the close).
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = tcp_from("127.0.0.1", addr).await;
        if ask_over(&mut again).await == web {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed connection's place never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The cap holds for the server, not per listen address: with two addresses, the connections
/// to both count together.
#[tokio::test]
async fn the_tcp_cap_counts_every_listen_address_together() {
    // 8 connections in all, 1 per client address.
    let (mut feed, server, _) = start_on(&["127.0.0.1:0", "127.0.0.2:0"], 8).await;
    feed.apply(inputs(INPUTS).change(&Interner::new()));
    let web = Over::Answered(strings(&["241.0.0.10"]));
    let (one, two) = (server.addresses[0], server.addresses[1]);
    let mut open = Vec::new();
    for i in 1..=8 {
        let to = if i % 2 == 0 { one } else { two };
        let mut stream = tcp_from(&format!("127.0.1.{i}"), to).await;
        assert_eq!(
            ask_over(&mut stream).await,
            web,
            "client 127.0.1.{i} to {to}"
        );
        open.push(stream);
    }
    for to in [one, two] {
        let mut over = tcp_from("127.0.1.9", to).await;
        assert_eq!(ask_over(&mut over).await, Over::Closed, "a ninth, to {to}");
    }
}
