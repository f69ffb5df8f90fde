use std::str::FromStr as _;

use super::*;

fn port(name: Option<&str>, protocol: DnsProtocol, number: u16) -> DnsPort {
    DnsPort {
        name: name.map(str::to_owned),
        protocol,
        port: number,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn clusterset_ip(name: &str, ips: &[&str], ports: Vec<DnsPort>) -> DnsService {
    DnsService {
        namespace: "demo".into(),
        name: name.into(),
        kind: DnsKind::ClusterSetIp {
            ips: ips.iter().map(|s| ip(s)).collect(),
        },
        ports,
        endpoints: Vec::new(),
    }
}

fn endpoint(
    cluster: &str,
    hostname: Option<&str>,
    addr: &str,
    ready: bool,
    ports: &[DnsPort],
) -> DnsEndpoint {
    DnsEndpoint {
        cluster: cluster.into(),
        hostname: hostname.map(str::to_owned),
        ip: ip(addr),
        ready,
        ports: ports.to_vec(),
    }
}

/// A headless `demo/db` over two clusters: `a` declares `sql` only (5432 on its pods), `b`
/// declares `sql` and `admin` (on 15432 and 9000); one pod of `a` is not ready.
fn headless() -> DnsService {
    let sql = port(Some("sql"), DnsProtocol::Tcp, 5432);
    let admin = port(Some("admin"), DnsProtocol::Tcp, 9000);
    let b_sql = port(Some("sql"), DnsProtocol::Tcp, 15432);
    DnsService {
        namespace: "demo".into(),
        name: "db".into(),
        kind: DnsKind::Headless,
        ports: vec![sql.clone(), admin.clone()],
        endpoints: vec![
            endpoint(
                "a",
                Some("db-0"),
                "10.1.0.1",
                true,
                std::slice::from_ref(&sql),
            ),
            endpoint(
                "a",
                Some("db-1"),
                "10.1.0.2",
                false,
                std::slice::from_ref(&sql),
            ),
            endpoint("a", Some("db-0"), "fd00:1::1", true, &[sql]),
            endpoint("b", None, "10.2.0.1", true, &[b_sql.clone(), admin.clone()]),
            endpoint("b", Some("db-0"), "10.2.0.2", true, &[b_sql, admin]),
        ],
    }
}

/// The SRV answer of `demo/db`'s port `sql`.
fn sql_srv(zone: &Zone) -> (ResponseCode, Vec<String>) {
    ask(
        zone,
        "_sql._tcp.db.demo.svc.clusterset.local.",
        RecordType::SRV,
    )
}

fn zone_of(services: &[DnsService]) -> Zone {
    let mut zone = Zone::new(DEFAULT_TTL);
    for s in services {
        let records = build_service(s).unwrap();
        zone.splice((s.namespace.clone(), s.name.clone()), Some(records));
    }
    zone.set_ready();
    zone
}

fn name(s: &str) -> LowerName {
    LowerName::from_str(s).unwrap()
}

/// The response code and the answer section's data, sorted.
fn ask(zone: &Zone, qname: &str, rtype: RecordType) -> (ResponseCode, Vec<String>) {
    let answer = zone.answer(&name(qname), rtype);
    let mut data: Vec<String> = answer
        .answers()
        .iter()
        .map(|r| r.data.to_string())
        .collect();
    data.sort();
    (answer.code, data)
}

fn additional(zone: &Zone, qname: &str, rtype: RecordType) -> Vec<String> {
    let mut out: Vec<String> = zone
        .answer(&name(qname), rtype)
        .additionals()
        .iter()
        .map(|r| format!("{} {}", r.name, r.data))
        .collect();
    out.sort();
    out
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const WEB: &str = "web.demo.svc.clusterset.local.";

fn web() -> DnsService {
    clusterset_ip(
        "web",
        &["241.0.0.10", "fd00:241::10"],
        vec![
            port(Some("http"), DnsProtocol::Tcp, 80),
            port(Some("dns"), DnsProtocol::Udp, 53),
            port(None, DnsProtocol::Tcp, 8080),
        ],
    )
}

#[test]
fn clusterset_ip_answers_each_listed_family() {
    let v4only = clusterset_ip(
        "api",
        &["241.0.0.20"],
        vec![port(Some("grpc"), DnsProtocol::Tcp, 9000)],
    );
    let zone = zone_of(&[web(), v4only]);
    assert_eq!(
        ask(&zone, WEB, RecordType::A),
        (ResponseCode::NoError, strings(&["241.0.0.10"]))
    );
    assert_eq!(
        ask(&zone, WEB, RecordType::AAAA),
        (ResponseCode::NoError, strings(&["fd00:241::10"]))
    );
    let api = "api.demo.svc.clusterset.local.";
    assert_eq!(
        ask(&zone, api, RecordType::A),
        (ResponseCode::NoError, strings(&["241.0.0.20"]))
    );
    // The other family: the name exists, with no data, and the SOA for negative caching.
    let nodata = zone.answer(&name(api), RecordType::AAAA);
    assert_eq!(nodata.code, ResponseCode::NoError);
    assert!(nodata.answers().is_empty() && nodata.authoritative);
    assert_eq!(nodata.authorities().len(), 1);
    assert_eq!(nodata.authorities()[0].record_type(), RecordType::SOA);
    assert_eq!(nodata.authorities()[0].ttl, DEFAULT_TTL);
    // TTLs are the zone's.
    let a = zone.answer(&name(WEB), RecordType::A);
    assert!(a.answers().iter().all(|r| r.ttl == DEFAULT_TTL));
}

#[test]
fn srv_per_named_port_with_addresses_in_additional() {
    let zone = zone_of(&[web()]);
    assert_eq!(
        ask(
            &zone,
            "_http._tcp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        ),
        (
            ResponseCode::NoError,
            strings(&[&format!("0 100 80 {WEB}")])
        )
    );
    assert_eq!(
        ask(
            &zone,
            "_dns._udp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        ),
        (
            ResponseCode::NoError,
            strings(&[&format!("0 100 53 {WEB}")])
        )
    );
    assert_eq!(
        additional(
            &zone,
            "_http._tcp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        ),
        strings(&[&format!("{WEB} 241.0.0.10"), &format!("{WEB} fd00:241::10")])
    );
    // A named port under another protocol, or a name no port has: no such name.
    assert_eq!(
        ask(
            &zone,
            "_http._udp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .0,
        ResponseCode::NXDomain
    );
    assert_eq!(
        ask(
            &zone,
            "_8080._tcp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .0,
        ResponseCode::NXDomain
    );
    // `_tcp.<svc>` exists because the SRV name below it does.
    assert_eq!(
        ask(
            &zone,
            "_tcp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        ),
        (ResponseCode::NoError, vec![])
    );
    // The unnamed port has no SRV: the only _tcp record is http's.
    let mut srv_names: Vec<String> = build_service(&web())
        .unwrap()
        .names()
        .iter()
        .map(|n| n.to_string())
        .filter(|n| n.starts_with("_") && !n.starts_with("_tcp") && !n.starts_with("_udp"))
        .collect();
    srv_names.sort();
    assert_eq!(
        srv_names,
        [
            "_dns._udp.web.demo.svc.clusterset.local.",
            "_http._tcp.web.demo.svc.clusterset.local."
        ]
    );
}

#[test]
fn ptr_of_each_clusterset_ip() {
    let zone = zone_of(&[web()]);
    assert_eq!(
        ask(&zone, "10.0.0.241.in-addr.arpa.", RecordType::PTR),
        (ResponseCode::NoError, strings(&[WEB]))
    );
    let v6 = Name::from(ip("fd00:241::10")).to_string();
    assert_eq!(
        ask(&zone, &v6, RecordType::PTR),
        (ResponseCode::NoError, strings(&[WEB]))
    );
    // Another address is not this server's to answer for.
    assert_eq!(
        ask(&zone, "11.0.0.241.in-addr.arpa.", RecordType::PTR).0,
        ResponseCode::Refused
    );
    assert_eq!(
        ask(&zone, "0.241.in-addr.arpa.", RecordType::PTR).0,
        ResponseCode::Refused
    );
}

#[test]
fn version_txt_is_the_spec_schema() {
    let zone = zone_of(&[]);
    assert_eq!(
        ask(&zone, "dns-version.clusterset.local.", RecordType::TXT),
        (ResponseCode::NoError, strings(&["1.0.0"]))
    );
    assert_eq!(
        ask(&zone, "dns-version.clusterset.local.", RecordType::A),
        (ResponseCode::NoError, vec![])
    );
    let soa = ask(&zone, "clusterset.local.", RecordType::SOA);
    assert_eq!(soa.0, ResponseCode::NoError);
    assert!(soa.1[0].starts_with("ns.dns.clusterset.local. hostmaster.clusterset.local."));
}

#[test]
fn headless_answers_ready_endpoints_and_hosts() {
    let zone = zone_of(&[headless()]);
    let db = "db.demo.svc.clusterset.local.";
    assert_eq!(
        ask(&zone, db, RecordType::A),
        (
            ResponseCode::NoError,
            strings(&["10.1.0.1", "10.2.0.1", "10.2.0.2"])
        )
    );
    assert_eq!(
        ask(&zone, db, RecordType::AAAA),
        (ResponseCode::NoError, strings(&["fd00:1::1"]))
    );
    // Per host: hostname and source cluster; a pod without hostname by its IP.
    assert_eq!(
        ask(&zone, "db-0.a.db.demo.svc.clusterset.local.", RecordType::A),
        (ResponseCode::NoError, strings(&["10.1.0.1"]))
    );
    assert_eq!(
        ask(
            &zone,
            "db-0.a.db.demo.svc.clusterset.local.",
            RecordType::AAAA
        ),
        (ResponseCode::NoError, strings(&["fd00:1::1"]))
    );
    assert_eq!(
        ask(&zone, "db-0.b.db.demo.svc.clusterset.local.", RecordType::A),
        (ResponseCode::NoError, strings(&["10.2.0.2"]))
    );
    assert_eq!(
        ask(
            &zone,
            "10-2-0-1.b.db.demo.svc.clusterset.local.",
            RecordType::A
        ),
        (ResponseCode::NoError, strings(&["10.2.0.1"]))
    );
    // Not ready: no name.
    assert_eq!(
        ask(&zone, "db-1.a.db.demo.svc.clusterset.local.", RecordType::A).0,
        ResponseCode::NXDomain
    );
    // The cluster level exists (no data); an unknown cluster does not.
    assert_eq!(
        ask(&zone, "a.db.demo.svc.clusterset.local.", RecordType::A),
        (ResponseCode::NoError, vec![])
    );
    assert_eq!(
        ask(&zone, "c.db.demo.svc.clusterset.local.", RecordType::A).0,
        ResponseCode::NXDomain
    );
}

#[test]
fn headless_srv_follows_the_per_port_rule() {
    let zone = zone_of(&[headless()]);
    // sql: every ready host of both clusters, each on its slice's port.
    assert_eq!(
        sql_srv(&zone),
        (
            ResponseCode::NoError,
            strings(&[
                "0 33 15432 10-2-0-1.b.db.demo.svc.clusterset.local.",
                "0 33 15432 db-0.b.db.demo.svc.clusterset.local.",
                "0 33 5432 db-0.a.db.demo.svc.clusterset.local.",
            ])
        )
    );
    // admin: only cluster b's slices carry it.
    assert_eq!(
        ask(
            &zone,
            "_admin._tcp.db.demo.svc.clusterset.local.",
            RecordType::SRV
        ),
        (
            ResponseCode::NoError,
            strings(&[
                "0 50 9000 10-2-0-1.b.db.demo.svc.clusterset.local.",
                "0 50 9000 db-0.b.db.demo.svc.clusterset.local.",
            ])
        )
    );
    assert_eq!(
        additional(
            &zone,
            "_admin._tcp.db.demo.svc.clusterset.local.",
            RecordType::SRV
        ),
        strings(&[
            "10-2-0-1.b.db.demo.svc.clusterset.local. 10.2.0.1",
            "db-0.b.db.demo.svc.clusterset.local. 10.2.0.2",
        ])
    );
    // Both families of a dual-stack host go into the additional section.
    assert!(
        additional(
            &zone,
            "_sql._tcp.db.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .contains(&"db-0.a.db.demo.svc.clusterset.local. fd00:1::1".to_owned())
    );
}

/// A port named with capitals (hand-written files; DNS names are case-insensitive) answers
/// under its lowercase SRV name with the endpoints whose slices carry it.
#[test]
fn an_uppercase_port_name_gets_its_srv_targets() {
    let sql = port(Some("SQL"), DnsProtocol::Tcp, 5432);
    let db = DnsService {
        namespace: "demo".into(),
        name: "db".into(),
        kind: DnsKind::Headless,
        ports: vec![sql.clone()],
        endpoints: vec![endpoint("a", Some("db-0"), "10.1.0.1", true, &[sql])],
    };
    let zone = zone_of(&[db]);
    assert_eq!(
        sql_srv(&zone),
        (
            ResponseCode::NoError,
            strings(&["0 100 5432 db-0.a.db.demo.svc.clusterset.local."])
        )
    );
}

#[test]
fn headless_without_ready_endpoints_is_nxdomain() {
    let mut db = headless();
    for ep in &mut db.endpoints {
        ep.ready = false;
    }
    let zone = zone_of(&[db]);
    for t in [RecordType::A, RecordType::AAAA] {
        assert_eq!(
            ask(&zone, "db.demo.svc.clusterset.local.", t).0,
            ResponseCode::NXDomain
        );
    }
    assert_eq!(
        ask(
            &zone,
            "_sql._tcp.db.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .0,
        ResponseCode::NXDomain
    );
    // The namespace still holds a service.
    assert_eq!(
        ask(&zone, "demo.svc.clusterset.local.", RecordType::A),
        (ResponseCode::NoError, vec![])
    );
}

#[test]
fn no_per_cluster_names_for_clusterset_ip_and_unknown_names() {
    let zone = zone_of(&[web()]);
    for n in [
        "a.web.demo.svc.clusterset.local.",
        "pod.a.web.demo.svc.clusterset.local.",
        "nope.demo.svc.clusterset.local.",
        "web.other.svc.clusterset.local.",
        "web.demo.clusterset.local.",
    ] {
        assert_eq!(
            ask(&zone, n, RecordType::A).0,
            ResponseCode::NXDomain,
            "{n}"
        );
        let answer = zone.answer(&name(n), RecordType::A);
        assert!(answer.authoritative);
        assert_eq!(answer.authorities()[0].record_type(), RecordType::SOA);
    }
    assert_eq!(
        ask(&zone, "demo.svc.clusterset.local.", RecordType::A),
        (ResponseCode::NoError, vec![])
    );
    assert_eq!(
        ask(&zone, "svc.clusterset.local.", RecordType::A),
        (ResponseCode::NoError, vec![])
    );
}

#[test]
fn names_outside_the_zone_are_refused_and_nothing_answers_before_ready() {
    let mut zone = Zone::new(DEFAULT_TTL);
    zone.splice(
        ("demo".into(), "web".into()),
        Some(build_service(&web()).unwrap()),
    );
    assert_eq!(
        ask(&zone, WEB, RecordType::A).0,
        ResponseCode::ServFail,
        "not ready yet"
    );
    assert_eq!(
        ask(&zone, "nope.demo.svc.clusterset.local.", RecordType::A).0,
        ResponseCode::ServFail,
        "never a wrong NXDOMAIN"
    );
    assert_eq!(
        ask(&zone, "10.0.0.241.in-addr.arpa.", RecordType::PTR).0,
        ResponseCode::ServFail
    );
    for outside in [
        "example.com.",
        "cluster.local.",
        "web.demo.svc.cluster.local.",
        "clusterset.local.example.",
        ".",
    ] {
        assert_eq!(
            ask(&zone, outside, RecordType::A).0,
            ResponseCode::Refused,
            "{outside}"
        );
    }
    zone.set_ready();
    assert_eq!(ask(&zone, WEB, RecordType::A).0, ResponseCode::NoError);
    assert_eq!(
        ask(&zone, "example.com.", RecordType::A).0,
        ResponseCode::Refused
    );
}

#[test]
fn any_unknown_and_meta_types() {
    let zone = zone_of(&[web()]);
    // ANY: one type's records, a minimal answer.
    assert_eq!(
        ask(&zone, WEB, RecordType::ANY),
        (ResponseCode::NoError, strings(&["241.0.0.10"]))
    );
    assert_eq!(
        ask(&zone, "dns-version.clusterset.local.", RecordType::ANY),
        (ResponseCode::NoError, strings(&["1.0.0"]))
    );
    for t in [RecordType::MX, RecordType::CAA, RecordType::Unknown(65280)] {
        assert_eq!(ask(&zone, WEB, t), (ResponseCode::NoError, vec![]), "{t:?}");
    }
    assert_eq!(ask(&zone, WEB, RecordType::AXFR).0, ResponseCode::Refused);
    assert_eq!(ask(&zone, WEB, RecordType::IXFR).0, ResponseCode::Refused);
    assert_eq!(ask(&zone, WEB, RecordType::OPT).0, ResponseCode::FormErr);
    assert_eq!(
        ask(&zone, WEB, RecordType::Unknown(254)).0,
        ResponseCode::NotImp
    );
}

#[test]
fn names_are_case_insensitive() {
    let zone = zone_of(&[web()]);
    assert_eq!(
        ask(&zone, "WEB.Demo.SVC.ClusterSet.Local.", RecordType::A),
        (ResponseCode::NoError, strings(&["241.0.0.10"]))
    );
    assert_eq!(
        ask(
            &zone,
            "_HTTP._Tcp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .1
        .len(),
        1
    );
}

#[test]
fn splicing_replaces_one_service_and_moves_ptr() {
    let mut zone = zone_of(&[web()]);
    let serial = zone.serial();
    // A second import claims web's IPv4 address: web keeps the PTR ("demo/web" < "demo/www").
    let www = clusterset_ip("www", &["241.0.0.10"], vec![]);
    zone.splice(
        ("demo".into(), "www".into()),
        Some(build_service(&www).unwrap()),
    );
    zone.bump_serial();
    assert_ne!(zone.serial(), serial);
    assert_eq!(
        ask(&zone, "10.0.0.241.in-addr.arpa.", RecordType::PTR).1,
        strings(&[WEB])
    );
    // web goes: its names and PTRs go, www gets the contested PTR.
    zone.splice(("demo".into(), "web".into()), None);
    assert_eq!(ask(&zone, WEB, RecordType::A).0, ResponseCode::NXDomain);
    assert_eq!(
        ask(
            &zone,
            "_http._tcp.web.demo.svc.clusterset.local.",
            RecordType::SRV
        )
        .0,
        ResponseCode::NXDomain
    );
    assert_eq!(
        ask(&zone, "10.0.0.241.in-addr.arpa.", RecordType::PTR).1,
        strings(&["www.demo.svc.clusterset.local."])
    );
    let v6 = Name::from(ip("fd00:241::10")).to_string();
    assert_eq!(ask(&zone, &v6, RecordType::PTR).0, ResponseCode::Refused);
    // web comes back single-stack on a new address.
    let web2 = clusterset_ip("web", &["241.0.0.11"], vec![]);
    zone.splice(
        ("demo".into(), "web".into()),
        Some(build_service(&web2).unwrap()),
    );
    assert_eq!(ask(&zone, WEB, RecordType::A).1, strings(&["241.0.0.11"]));
    assert_eq!(
        ask(&zone, WEB, RecordType::AAAA),
        (ResponseCode::NoError, vec![])
    );
    // The last service of the namespace goes: so does the namespace.
    zone.splice(("demo".into(), "web".into()), None);
    zone.splice(("demo".into(), "www".into()), None);
    assert_eq!(
        ask(&zone, "demo.svc.clusterset.local.", RecordType::A).0,
        ResponseCode::NXDomain
    );
    assert_eq!(
        ask(&zone, "10.0.0.241.in-addr.arpa.", RecordType::PTR).0,
        ResponseCode::Refused
    );
    assert_eq!(zone.service_count(), 0);
}

#[test]
fn bad_names_leave_out_only_what_is_bad() {
    let mut bad_ns = web();
    bad_ns.namespace = "Not_A_Label".into();
    assert!(matches!(
        build_service(&bad_ns),
        Err(ZoneError::BadLabel {
            what: "namespace",
            ..
        })
    ));
    let mut long = web();
    long.name = "x".repeat(64);
    assert!(build_service(&long).is_err());
    // Names are case-insensitive in DNS: an uppercase name would share `web`'s. It gets no
    // records, and a change to it leaves `web`'s alone.
    let mut upper = web();
    upper.name = "Web".into();
    assert!(matches!(
        build_service(&upper),
        Err(ZoneError::BadLabel { what: "name", .. })
    ));
    let mut zone = zone_of(&[web()]);
    zone.splice(("demo".into(), "Web".into()), None);
    assert_eq!(
        ask(&zone, "web.demo.svc.clusterset.local.", RecordType::A).0,
        ResponseCode::NoError
    );
    assert!(
        !ask(&zone, "web.demo.svc.clusterset.local.", RecordType::A)
            .1
            .is_empty()
    );
    // A bad port name loses its SRV only; a bad cluster id loses its endpoints only.
    let mut svc = web();
    svc.ports.push(port(Some("bad.name"), DnsProtocol::Tcp, 81));
    let records = build_service(&svc).unwrap();
    assert_eq!(records.skipped.len(), 1);
    let zone = zone_of(&[svc]);
    assert_eq!(ask(&zone, WEB, RecordType::A).1, strings(&["241.0.0.10"]));
    let mut db = headless();
    db.endpoints[0].cluster = "bad.cluster".into();
    let records = build_service(&db).unwrap();
    assert_eq!(records.skipped.len(), 1);
    let zone = zone_of(&[db]);
    assert_eq!(
        ask(&zone, "db.demo.svc.clusterset.local.", RecordType::A).1,
        strings(&["10.2.0.1", "10.2.0.2"])
    );
}

#[test]
fn records_do_not_depend_on_input_order() {
    let db = headless();
    let mut reversed = db.clone();
    reversed.endpoints.reverse();
    reversed.ports.reverse();
    let a = build_service(&db).unwrap();
    let b = build_service(&reversed).unwrap();
    assert_eq!(a.names(), b.names());
    assert_eq!(a, b);
    let (za, zb) = (zone_of(&[db]), zone_of(&[reversed]));
    for n in a.names() {
        for t in [RecordType::A, RecordType::AAAA, RecordType::SRV] {
            let n = n.to_string();
            assert_eq!(ask(&za, &n, t), ask(&zb, &n, t), "{n} {t}");
        }
    }
}

/// A leading `*` is a label like any other: `*.clusterset.local` is not the apex, and `*.F`
/// is not F (it names nothing).
#[test]
fn a_leading_star_is_a_label() {
    let zone = zone_of(&[web()]);
    assert_eq!(
        ask(&zone, "*.clusterset.local.", RecordType::SOA).0,
        ResponseCode::NXDomain
    );
    assert_eq!(
        ask(&zone, &format!("*.{WEB}"), RecordType::A),
        (ResponseCode::NXDomain, vec![])
    );
}

/// Only an address's own reverse name gets its PTR: hickory also parses `010` as an octet,
/// a name that does not exist.
#[test]
fn only_canonical_reverse_names_are_answered() {
    let zone = zone_of(&[web()]);
    assert_eq!(
        ask(&zone, "10.0.0.241.in-addr.arpa.", RecordType::PTR)
            .1
            .len(),
        1
    );
    for q in ["010.0.0.241.in-addr.arpa.", "10.00.0.241.in-addr.arpa."] {
        assert_eq!(
            ask(&zone, q, RecordType::PTR).0,
            ResponseCode::Refused,
            "{q}"
        );
    }
}
