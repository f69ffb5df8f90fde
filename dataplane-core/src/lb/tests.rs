//! Table tests of the routing rule (ARCHITECTURE.md §4) and property tests of [`build`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use proptest::prelude::*;

use super::*;
use crate::fixtures::{
    Conditions, NOT_READY, Port, TERMINATING, endpoint, endpoint_of, endpoint_slice, frontend_addr,
    import, imported_slice,
};
use crate::model::{
    ClientIpConfig, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, ObjectMeta, ServicePort,
    SessionAffinityConfig,
};

use IpFamily::{IPv4, IPv6};

const V4: &str = "241.0.0.1";
const V6: &str = "fd00:241::1";

/// A port as (name, protocol, number); `""` is the unnamed port, `None`-like values are
/// spelled out where a test needs them.
type P<'a> = (&'a str, &'a str, i32);

/// The common case: `ns/web`, one IPv4 VIP, the given ports.
fn web(ports: &[P<'_>]) -> ServiceImport {
    import("ns", "web")
        .ips([V4])
        .families(&[IPv4])
        .ports(ports)
        .build()
}

/// The backends of a frontend as `cluster/ip:port`, in table order; panics when the frontend is
/// missing.
fn backends(t: &LbTable, ip: &str, port: u16, protocol: Protocol) -> Vec<String> {
    let f = t
        .frontends
        .get(&frontend_addr(ip, port, protocol))
        .unwrap_or_else(|| panic!("no frontend {ip}:{port}/{protocol} in {t:#?}"));
    f.backends
        .iter()
        .map(|b| match b.ip {
            IpAddr::V4(ip) => format!("{}/{ip}:{}", b.cluster, b.port),
            IpAddr::V6(ip) => format!("{}/[{ip}]:{}", b.cluster, b.port),
        })
        .collect()
}

fn has_warning(t: &LbTable, object: &str, needle: &str) -> bool {
    t.warnings
        .iter()
        .any(|w| w.object == object && w.message.contains(needle))
}

use Protocol::{Tcp, Udp};

#[test]
fn ready_endpoints_serve_and_others_do_not_while_one_is_ready() {
    let t = build(
        &[web(&[("http", "TCP", 80)])],
        &[imported_slice("ns", "s", "web", "c1")
            .port(("http", "TCP", 8080))
            .endpoints([
                endpoint("10.0.0.1").ready(),
                endpoint("10.0.0.2").conditions(TERMINATING),
                endpoint("10.0.0.3").conditions(NOT_READY),
            ])
            .build()],
    );
    assert_eq!(backends(&t, V4, 80, Tcp), vec!["c1/10.0.0.1:8080"]);
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
}

/// The fallback endpoints met before the first ready one (a lower address in its slice, an
/// earlier cluster's slice) are dropped once it is seen.
#[test]
fn a_ready_endpoint_listed_last_still_excludes_the_fallback_ones() {
    let t = build(
        &[web(&[("http", "TCP", 80)])],
        &[
            imported_slice("ns", "a", "web", "c1")
                .port(("http", "TCP", 8080))
                .endpoint(endpoint("10.0.0.1").conditions(TERMINATING))
                .build(),
            imported_slice("ns", "b", "web", "c2")
                .port(("http", "TCP", 8080))
                .endpoints([
                    endpoint("10.0.1.1").conditions(TERMINATING),
                    endpoint("10.0.1.2").ready(),
                    endpoint("10.0.1.3").conditions(TERMINATING),
                ])
                .build(),
        ],
    );
    assert_eq!(backends(&t, V4, 80, Tcp), vec!["c2/10.0.1.2:8080"]);
}

/// Each row is one endpoint alone in its frontend (so "no endpoint is ready" holds exactly when
/// the row is not ready): whether it is used.
#[test]
fn endpoint_conditions_table() {
    let cases: &[(Option<Conditions>, bool, &str)] = &[
        (None, true, "no conditions: ready"),
        (Some((None, None, None)), true, "nil ready is ready"),
        (
            Some((None, None, Some(true))),
            true,
            "nil ready is ready, even terminating",
        ),
        (Some((Some(true), None, None)), true, "ready"),
        (
            Some((Some(true), Some(false), Some(true))),
            true,
            "ready wins",
        ),
        (
            Some((Some(false), Some(true), Some(true))),
            true,
            "serving+terminating fallback",
        ),
        (
            Some((Some(false), None, Some(true))),
            false,
            "nil serving is ready=false",
        ),
        (
            Some((Some(false), Some(true), Some(false))),
            false,
            "serving, not terminating",
        ),
        (
            Some((Some(false), Some(true), None)),
            false,
            "nil terminating is false",
        ),
        (
            Some((Some(false), Some(false), Some(true))),
            false,
            "terminating, not serving",
        ),
        (Some((Some(false), None, None)), false, "not ready"),
    ];
    for (cond, used, why) in cases {
        let t = build(
            &[web(&[("http", "TCP", 80)])],
            &[imported_slice("ns", "s", "web", "c1")
                .port(("http", "TCP", 8080))
                .endpoint(endpoint("10.0.0.1").conditions(*cond))
                .build()],
        );
        let want: Vec<String> = if *used {
            vec!["c1/10.0.0.1:8080".into()]
        } else {
            vec![]
        };
        assert_eq!(backends(&t, V4, 80, Tcp), want, "{why}: {cond:?}");
    }
}

/// The fallback is decided per frontend: one port with a ready endpoint in some cluster uses
/// only ready endpoints; another port whose clusters have none ready falls back.
#[test]
fn fallback_is_per_frontend() {
    let t = build(
        &[web(&[("http", "TCP", 80), ("alt", "TCP", 81)])],
        &[
            imported_slice("ns", "a", "web", "c1")
                .port(("http", "TCP", 8080))
                .endpoint(endpoint("10.0.0.1").ready())
                .build(),
            imported_slice("ns", "b", "web", "c2")
                .ports([("http", "TCP", 8080), ("alt", "TCP", 8081)])
                .endpoints([
                    endpoint("10.0.1.1").conditions(TERMINATING),
                    endpoint("10.0.1.2").conditions(NOT_READY),
                ])
                .build(),
        ],
    );
    // http: c1 is ready, so c2's terminating endpoint is not used.
    assert_eq!(backends(&t, V4, 80, Tcp), vec!["c1/10.0.0.1:8080"]);
    // alt: only c2 declares it and none of its endpoints is ready.
    assert_eq!(backends(&t, V4, 81, Tcp), vec!["c2/10.0.1.1:8081"]);
}

/// The backend port is the slice port with the frontend's name *and* protocol.
#[test]
fn backend_port_comes_from_the_slice_port_of_the_same_name_and_protocol() {
    let t = build(
        &[web(&[
            ("dns", "UDP", 53),
            ("dns-tcp", "TCP", 53),
            ("http", "TCP", 80),
        ])],
        &[imported_slice("ns", "s", "web", "c1")
            .ports([
                ("dns", "TCP", 5300), // same name, other protocol: not the UDP port
                ("dns", "UDP", 5353),
                ("dns-tcp", "TCP", 5354),
                ("other", "TCP", 7000),
                ("http", "TCP", 8080),
            ])
            .endpoint(endpoint("10.0.0.1").ready())
            .build()],
    );
    assert_eq!(backends(&t, V4, 53, Udp), vec!["c1/10.0.0.1:5353"]);
    assert_eq!(backends(&t, V4, 53, Tcp), vec!["c1/10.0.0.1:5354"]);
    assert_eq!(backends(&t, V4, 80, Tcp), vec!["c1/10.0.0.1:8080"]);
    assert_eq!(t.frontends.len(), 3);
}

/// An unnamed frontend port matches only an unnamed slice port, and a named one never matches
/// an unnamed slice port: no "match all".
#[test]
fn unnamed_ports_match_unnamed_ports_only() {
    let t = build(
        &[
            web(&[("", "TCP", 80)]),
            import("ns", "api")
                .ips(["241.0.0.2"])
                .families(&[IPv4])
                .port(("http", "TCP", 80))
                .build(),
        ],
        &[
            imported_slice("ns", "web-1", "web", "c1")
                .port(("", "TCP", 8080))
                .endpoint(endpoint("10.0.0.1").ready())
                .build(),
            imported_slice("ns", "web-2", "web", "c2")
                .port(("http", "TCP", 8080))
                .endpoint(endpoint("10.0.0.2").ready())
                .build(),
            imported_slice("ns", "api-1", "api", "c1")
                .port(("", "TCP", 8080))
                .endpoint(endpoint("10.0.0.3").ready())
                .build(),
        ],
    );
    assert_eq!(backends(&t, V4, 80, Tcp), vec!["c1/10.0.0.1:8080"]);
    assert_eq!(t.frontends[&frontend_addr(V4, 80, Tcp)].port_name, "");
    assert!(backends(&t, "241.0.0.2", 80, Tcp).is_empty());
}

/// Two Service ports with the same targetPort are two slice ports of different names; each
/// frontend keeps its backends (cilium#45109). A cluster whose slice lacks a port gets no
/// backends for it.
#[test]
fn ports_sharing_a_target_port_keep_their_backends() {
    let t = build(
        &[web(&[("http", "TCP", 80), ("alt", "TCP", 8081)])],
        &[
            imported_slice("ns", "a", "web", "c1")
                .ports([("http", "TCP", 8080), ("alt", "TCP", 8080)])
                .endpoints([endpoint("10.0.0.1").ready(), endpoint("10.0.0.2").ready()])
                .build(),
            imported_slice("ns", "b", "web", "c2")
                .port(("http", "TCP", 8080))
                .endpoint(endpoint("10.0.1.1").ready())
                .build(),
        ],
    );
    assert_eq!(
        backends(&t, V4, 80, Tcp),
        vec!["c1/10.0.0.1:8080", "c1/10.0.0.2:8080", "c2/10.0.1.1:8080"]
    );
    assert_eq!(
        backends(&t, V4, 8081, Tcp),
        vec!["c1/10.0.0.1:8080", "c1/10.0.0.2:8080"]
    );
    assert_eq!(t.frontends[&frontend_addr(V4, 80, Tcp)].port_name, "http");
    assert_eq!(t.frontends[&frontend_addr(V4, 8081, Tcp)].port_name, "alt");
}

#[test]
fn a_cluster_whose_slice_lacks_the_port_gets_no_backends_for_it() {
    let t = build(
        &[web(&[("http", "TCP", 80)])],
        &[imported_slice("ns", "s", "web", "c1")
            .port(("metrics", "TCP", 9090))
            .endpoint(endpoint("10.0.0.1").ready())
            .build()],
    );
    // The frontend exists and refuses: the VIP declares the port, nobody serves it.
    assert!(backends(&t, V4, 80, Tcp).is_empty());
    assert!(!t.frontends.contains_key(&frontend_addr(V4, 9090, Tcp)));
}

/// Families: an IPv6 slice never feeds the IPv4 frontend and the reverse; an address of the
/// wrong family inside a slice is skipped with a warning.
#[test]
fn families_never_mix() {
    let t = build(
        &[import("ns", "web")
            .ips([V4, V6])
            .families(&[IPv4, IPv6])
            .port(("http", "TCP", 80))
            .build()],
        &[
            imported_slice("ns", "v4", "web", "c1")
                .port(("http", "TCP", 8080))
                .endpoints([endpoint("10.0.0.1").ready(), endpoint("fd01::9").ready()])
                .build(),
            imported_slice("ns", "v6", "web", "c1")
                .address_type("IPv6")
                .port(("http", "TCP", 8080))
                .endpoints([endpoint("fd01::1").ready(), endpoint("10.0.0.9").ready()])
                .build(),
            // A v6-only cluster: feeds only the v6 frontend.
            imported_slice("ns", "v6b", "web", "c2")
                .address_type("IPv6")
                .port(("http", "TCP", 8080))
                .endpoint(endpoint("fd01::2").ready())
                .build(),
        ],
    );
    assert_eq!(backends(&t, V4, 80, Tcp), vec!["c1/10.0.0.1:8080"]);
    assert_eq!(
        backends(&t, V6, 80, Tcp),
        vec!["c1/[fd01::1]:8080", "c2/[fd01::2]:8080"]
    );
    assert!(has_warning(&t, "EndpointSlice ns/v4", "fd01::9"));
    assert!(has_warning(&t, "EndpointSlice ns/v6", "10.0.0.9"));
    assert_eq!(t.vips.len(), 2);
}

#[test]
fn headless_imports_get_no_vip_and_no_frontends() {
    let mut si = web(&[("http", "TCP", 80)]);
    si.spec.type_ = ServiceImportType::Headless;
    let t = build(
        &[si],
        &[imported_slice("ns", "s", "web", "c1")
            .port(("http", "TCP", 8080))
            .endpoint(endpoint("10.0.0.1").ready())
            .build()],
    );
    assert!(t.frontends.is_empty() && t.vips.is_empty(), "{t:#?}");
}

#[test]
fn vips_that_do_not_match_their_family_are_skipped_with_a_warning() {
    /// (ips, ipFamilies, the VIPs kept, a warning to expect or "").
    type Case<'a> = (&'a [&'a str], &'a [IpFamily], &'a [&'a str], &'a str);
    let cases: &[Case<'_>] = &[
        // ips[i] must be of ipFamilies[i]
        (&[V6], &[IPv4], &[], "is not of ipFamilies[0]"),
        (&[V6, V4], &[IPv4, IPv6], &[], "is not of ipFamilies"),
        // a second VIP of one family
        (
            &[V4, "241.0.0.9"],
            &[],
            &[V4],
            "a second IPv4 ClusterSet IP",
        ),
        // not an IP
        (&["nope", V4], &[], &[V4], "is not an IP address"),
        // no ipFamilies: each IP's own family counts
        (&[V6, V4], &[], &[V6, V4], ""),
    ];
    for (ips, families, want, warning) in cases {
        let t = build(
            &[import("ns", "web")
                .ips(*ips)
                .families(families)
                .port(("http", "TCP", 80))
                .build()],
            &[],
        );
        let got: Vec<String> = t.vips.keys().map(|ip| ip.to_string()).collect();
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort_by_key(|s| s.parse::<IpAddr>().expect("ip"));
        assert_eq!(got, want, "{ips:?} {families:?}");
        assert_eq!(t.frontends.len(), want.len(), "{ips:?} {families:?}");
        if warning.is_empty() {
            assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        } else {
            assert!(
                has_warning(&t, "ServiceImport ns/web", warning),
                "{:?}",
                t.warnings
            );
        }
    }
}

/// A VIP claimed by two imports goes to the first in namespace/name order, whatever the input
/// order; the other import is warned about and loses only that VIP.
#[test]
fn duplicate_vips_go_to_the_first_import_by_name() {
    let a = import("ns", "a")
        .ips([V4, V6])
        .families(&[IPv4, IPv6])
        .port(("http", "TCP", 80))
        .build();
    let b = import("ns", "b")
        .ips([V4])
        .families(&[IPv4])
        .port(("http", "TCP", 80))
        .build();
    let one = build(&[a.clone(), b.clone()], &[]);
    let two = build(&[b, a], &[]);
    assert_eq!(one, two);
    assert_eq!(
        one.vips[&V4.parse::<IpAddr>().expect("ip")].name,
        "a".into()
    );
    assert_eq!(
        one.frontends[&frontend_addr(V4, 80, Tcp)].service.name,
        "a".into()
    );
    assert!(has_warning(
        &one,
        "ServiceImport ns/b",
        "already belongs to ns/a"
    ));
    assert_eq!(one.frontends.len(), 2);
}

/// The same namespace/name given twice: one definition is used, the same whatever the order,
/// and the duplicate is reported.
#[test]
fn duplicate_imports_are_resolved_independently_of_order() {
    let a = import("ns", "web")
        .ips([V4])
        .families(&[IPv4])
        .port(("http", "TCP", 80))
        .build();
    let b = import("ns", "web")
        .ips(["241.0.0.2"])
        .families(&[IPv4])
        .port(("http", "TCP", 81))
        .build();
    let one = build(&[a.clone(), b.clone()], &[]);
    let two = build(&[b, a], &[]);
    assert_eq!(one, two);
    assert_eq!(one.vips.len(), 1);
    assert!(has_warning(&one, "ServiceImport ns/web", "more than once"));
}

#[test]
fn bad_import_ports_are_skipped_with_warnings() {
    let t = build(
        &[web(&[
            ("sctp", "SCTP", 80),
            ("odd", "HTTP", 81),
            ("zero", "TCP", 0),
            ("big", "TCP", 70000),
            ("neg", "TCP", -1),
            ("http", "TCP", 82),
            ("again", "TCP", 82), // same number and protocol
            ("udp", "UDP", 82),   // same number, other protocol: fine
        ])],
        &[],
    );
    let ports: Vec<(u16, Protocol)> = t.frontends.keys().map(|f| (f.port, f.protocol)).collect();
    assert_eq!(ports, vec![(82, Tcp), (82, Udp)]);
    assert_eq!(t.frontends[&frontend_addr(V4, 82, Tcp)].port_name, "http");
    let o = "ServiceImport ns/web";
    for needle in [
        "protocol SCTP",
        "protocol HTTP",
        "0 is not in 1..65535",
        "70000 is not in",
        "-1 is not in",
        "82/TCP is listed twice",
    ] {
        assert!(has_warning(&t, o, needle), "{needle}: {:?}", t.warnings);
    }
}

/// An import and slices with many ports (the API allows thousands) are built as short ones
/// are: the port listed twice is found, and each frontend gets its slices' number for it.
#[test]
fn many_ports_are_built_as_a_few_are() {
    let names: Vec<String> = (1..=40).map(|n| format!("p{n}")).collect();
    let mut ports: Vec<P<'_>> = (1..=40)
        .map(|n| (names[n - 1].as_str(), "TCP", n as i32))
        .collect();
    ports.push(("again", "TCP", 7));
    // c1's slice carries every port (at 1000 + n), c2's only p7 (at 2007).
    let slice_ports: Vec<P<'_>> = (1..=40)
        .map(|n| (names[n - 1].as_str(), "TCP", 1000 + n as i32))
        .collect();
    let slices = [
        imported_slice("ns", "a", "web", "c1")
            .ports(&slice_ports)
            .endpoints([endpoint("10.0.0.1").ready()])
            .build(),
        imported_slice("ns", "b", "web", "c2")
            .ports([("p7", "TCP", 2007)])
            .endpoints([endpoint("10.0.0.2").ready()])
            .build(),
    ];
    let t = build(&[web(&ports)], &slices);
    assert_eq!(t.frontends.len(), 40);
    assert_eq!(t.frontends[&frontend_addr(V4, 7, Tcp)].port_name, "p7");
    assert_eq!(
        backends(&t, V4, 7, Tcp),
        ["c1/10.0.0.1:1007", "c2/10.0.0.2:2007"]
    );
    assert_eq!(backends(&t, V4, 33, Tcp), ["c1/10.0.0.1:1033"]);
    assert!(
        has_warning(&t, "ServiceImport ns/web", "7/TCP is listed twice"),
        "{:?}",
        t.warnings
    );
}

#[test]
fn bad_slices_are_skipped_with_warnings_and_never_panic() {
    let good_ports: &[P<'_>] = &[("http", "TCP", 8080)];
    let no_service = endpoint_slice("ns", "no-svc")
        .label(LABEL_SOURCE_CLUSTER, "c1")
        .ports(good_ports)
        .endpoint(endpoint("10.0.0.1").ready())
        .build();
    let no_cluster = endpoint_slice("ns", "no-cluster")
        .label(LABEL_SERVICE_NAME, "web")
        .ports(good_ports)
        .endpoint(endpoint("10.0.0.2").ready())
        .build();
    let no_ports = imported_slice("ns", "no-ports", "web", "c3")
        .endpoint(endpoint("10.0.3.1").ready())
        .build();
    let mut port_none = imported_slice("ns", "port-none", "web", "c4")
        .ports(good_ports)
        .endpoint(endpoint("10.0.4.1").ready())
        .build();
    if let Some(p) = port_none.ports.as_mut() {
        p[0].port = None;
    }
    let slices = vec![
        no_service,
        no_cluster,
        no_ports,
        port_none,
        imported_slice("ns", "bad-cluster", "web", "Not_A_Label")
            .ports(good_ports)
            .endpoint(endpoint("10.0.0.3").ready())
            .build(),
        imported_slice("ns", "fqdn", "web", "c1")
            .address_type("FQDN")
            .ports(good_ports)
            .endpoint(endpoint("a.example").ready())
            .build(),
        imported_slice("ns", "bad-ports", "web", "c1")
            .ports([
                ("http", "SCTP", 8080),
                ("http", "TCP", 0),
                ("x", "TCP", 70000),
                ("y", "TCP", -3),
            ])
            .endpoint(endpoint("10.0.0.4").ready())
            .build(),
        imported_slice("ns", "bad-addrs", "web", "c2")
            .ports(good_ports)
            .endpoints([
                endpoint("not-an-ip").ready(),
                endpoint("10.0.2.1").ready(),
                endpoint("").ready(),
            ])
            .build(),
        imported_slice("ns", "twice", "web", "c5")
            .ports([("http", "TCP", 1), ("http", "TCP", 8080)])
            .endpoint(endpoint("10.0.5.1").ready())
            .build(),
    ];
    let t = build(&[web(&[("http", "TCP", 80)])], &slices);
    // Only the clean endpoints of otherwise usable slices serve; the last duplicate port wins.
    assert_eq!(
        backends(&t, V4, 80, Tcp),
        vec!["c2/10.0.2.1:8080", "c5/10.0.5.1:8080"]
    );
    for (object, needle) in [
        ("EndpointSlice ns/no-svc", "not an imported slice"),
        ("EndpointSlice ns/no-cluster", LABEL_SOURCE_CLUSTER),
        ("EndpointSlice ns/bad-cluster", "invalid cluster id"),
        ("EndpointSlice ns/fqdn", "addressType \"FQDN\""),
        ("EndpointSlice ns/bad-ports", "protocol SCTP"),
        ("EndpointSlice ns/bad-ports", "Some(0) is not in 1..65535"),
        ("EndpointSlice ns/bad-ports", "Some(70000)"),
        ("EndpointSlice ns/bad-ports", "Some(-3)"),
        ("EndpointSlice ns/port-none", "None is not in 1..65535"),
        (
            "EndpointSlice ns/bad-addrs",
            "\"not-an-ip\" is not an IP address",
        ),
        ("EndpointSlice ns/bad-addrs", "\"\" is not an IP address"),
        ("EndpointSlice ns/twice", "appears twice"),
    ] {
        assert!(
            has_warning(&t, object, needle),
            "{object}: {needle}: {:#?}",
            t.warnings
        );
    }
}

/// The same endpoint in two slices of one cluster is one backend; the same address in two
/// clusters is two backends (they are different pods).
#[test]
fn the_same_endpoint_in_two_slices_is_one_backend() {
    let p: &[P<'_>] = &[("http", "TCP", 8080)];
    let slice = |name, cluster, ips: &[&str]| {
        imported_slice("ns", name, "web", cluster)
            .ports(p)
            .endpoints(ips.iter().map(|ip| endpoint(ip).ready()))
            .build()
    };
    let t = build(
        &[web(&[("http", "TCP", 80)])],
        &[
            slice("a", "c1", &["10.0.0.1", "10.0.0.2"]),
            slice("b", "c1", &["10.0.0.1"]),
            slice("c", "c2", &["10.0.0.1"]),
            // one endpoint listed twice within a slice
            slice("d", "c2", &["10.0.0.3", "10.0.0.3"]),
        ],
    );
    assert_eq!(
        backends(&t, V4, 80, Tcp),
        vec![
            "c1/10.0.0.1:8080",
            "c1/10.0.0.2:8080",
            "c2/10.0.0.1:8080",
            "c2/10.0.0.3:8080"
        ]
    );
}

/// Slices feed only the import of their namespace and service-name label.
#[test]
fn slices_feed_only_their_own_service() {
    let slice = |namespace, name, service, ip| {
        imported_slice(namespace, name, service, "c1")
            .port(("http", "TCP", 8080))
            .endpoint(endpoint(ip).ready())
            .build()
    };
    let t = build(
        &[web(&[("http", "TCP", 80)])],
        &[
            slice("other", "x", "web", "10.0.0.9"),
            slice("ns", "y", "api", "10.0.0.8"),
            slice("ns", "z", "web", "10.0.0.1"),
        ],
    );
    assert_eq!(backends(&t, V4, 80, Tcp), vec!["c1/10.0.0.1:8080"]);
}

#[test]
fn affinity_timeout() {
    /// (sessionAffinity, sessionAffinityConfig.clientIP.timeoutSeconds, the frontend's timeout).
    type Case<'a> = (Option<&'a str>, Option<Option<i32>>, Option<u32>);
    let cases: &[Case<'_>] = &[
        (None, None, None),
        (Some("None"), Some(Some(60)), None),
        (Some("ClientIP"), None, Some(DEFAULT_AFFINITY_TIMEOUT_S)),
        (
            Some("ClientIP"),
            Some(None),
            Some(DEFAULT_AFFINITY_TIMEOUT_S),
        ),
        (Some("ClientIP"), Some(Some(60)), Some(60)),
        (
            Some("ClientIP"),
            Some(Some(0)),
            Some(DEFAULT_AFFINITY_TIMEOUT_S),
        ),
        (
            Some("ClientIP"),
            Some(Some(-5)),
            Some(DEFAULT_AFFINITY_TIMEOUT_S),
        ),
    ];
    for (affinity, timeout, want) in cases {
        let mut si = web(&[("http", "TCP", 80)]);
        si.spec.session_affinity = affinity.map(str::to_owned);
        si.spec.session_affinity_config = timeout.map(|t| SessionAffinityConfig {
            client_ip: Some(ClientIpConfig { timeout_seconds: t }),
        });
        let t = build(&[si], &[]);
        assert_eq!(
            t.frontends[&frontend_addr(V4, 80, Tcp)].affinity_timeout_s,
            *want,
            "{affinity:?} {timeout:?}"
        );
    }
}

// ---- properties

/// A small deterministic shuffle (Fisher-Yates driven by a xorshift), so a failing case
/// shrinks to a seed.
fn shuffle<T>(v: &mut [T], seed: &mut u64) {
    for i in (1..v.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let j = (*seed % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

fn arb_import() -> impl Strategy<Value = ServiceImport> {
    let port = (
        prop::sample::select(vec![None, Some(""), Some("http"), Some("dns")]),
        prop::sample::select(vec![None, Some("TCP"), Some("UDP"), Some("SCTP")]),
        prop::sample::select(vec![80, 53, 8080, 0, -1, 70000]),
    )
        .prop_map(|(name, protocol, port)| Port {
            name: name.map(str::to_owned),
            protocol: protocol.map(str::to_owned),
            port: Some(port),
            ..Default::default()
        });
    (
        prop::sample::select(vec!["a", "b", "c"]),
        prop::sample::select(vec!["ns", "other"]),
        any::<bool>(),
        prop::collection::vec(
            prop::sample::select(vec![V4, "241.0.0.2", V6, "fd00:241::2", "bad", ""]),
            0..3,
        ),
        prop::collection::vec(prop::sample::select(vec![IPv4, IPv6]), 0..3),
        prop::collection::vec(port, 0..4),
        prop::sample::select(vec![None, Some("ClientIP"), Some("None")]),
        prop::option::of(prop::sample::select(vec![
            None,
            Some(0),
            Some(60),
            Some(-5),
        ])),
    )
        .prop_map(
            |(name, ns, headless, ips, families, ports, affinity, timeout)| {
                let mut si = import(ns, name)
                    .ips(&ips)
                    .families(&families)
                    .ports(ports)
                    .affinity(affinity);
                if headless {
                    si = si.headless();
                }
                if let Some(t) = timeout {
                    si = si.affinity_timeout(t);
                }
                si.build()
            },
        )
}

fn arb_slice() -> impl Strategy<Value = EndpointSlice> {
    let port = (
        prop::sample::select(vec![None, Some(""), Some("http"), Some("dns")]),
        prop::sample::select(vec![None, Some("TCP"), Some("UDP"), Some("SCTP")]),
        prop::sample::select(vec![Some(8080), Some(53), Some(0), None, Some(70000)]),
    )
        .prop_map(|(name, protocol, port)| Port {
            name: name.map(str::to_owned),
            protocol: protocol.map(str::to_owned),
            port,
            ..Default::default()
        });
    let cond = prop::option::of((
        prop::option::of(any::<bool>()),
        prop::option::of(any::<bool>()),
        prop::option::of(any::<bool>()),
    ));
    let endpoint = (
        prop::collection::vec(
            prop::sample::select(vec!["10.0.0.1", "10.0.0.2", "fd01::1", "bogus"]),
            0..3,
        ),
        cond,
    )
        .prop_map(|(addrs, cond)| endpoint_of(addrs).conditions(cond).build());
    (
        prop::sample::select(vec!["s1", "s2", "s3"]),
        prop::sample::select(vec!["ns", "other"]),
        prop::option::of(prop::sample::select(vec!["a", "b", "c"])),
        prop::option::of(prop::sample::select(vec!["c1", "c2", "Bad_Id"])),
        prop::sample::select(vec!["IPv4", "IPv6", "FQDN"]),
        prop::option::of(prop::collection::vec(port, 0..3)),
        prop::collection::vec(endpoint, 0..4),
    )
        .prop_map(|(name, ns, service, cluster, at, ports, endpoints)| {
            let labels: Vec<(&str, &str)> = [
                service.map(|s| (LABEL_SERVICE_NAME, s)),
                cluster.map(|c| (LABEL_SOURCE_CLUSTER, c)),
            ]
            .into_iter()
            .flatten()
            .collect();
            let mut slice = endpoint_slice(ns, name)
                .labels(&labels)
                .address_type(at)
                .endpoints(endpoints);
            if let Some(ports) = ports {
                slice = slice.ports(ports);
            }
            slice.build()
        })
}

/// Checks what every table promises, whatever the input.
fn well_formed(t: &LbTable) -> Result<(), TestCaseError> {
    for (addr, f) in &t.frontends {
        prop_assert_eq!(
            t.vips.get(&addr.ip),
            Some(&f.service),
            "{} has no VIP owner",
            addr
        );
        let mut sorted = f.backends.clone();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(&sorted, &f.backends, "{} backends not sorted/unique", addr);
        for b in &f.backends {
            prop_assert_eq!(b.ip.is_ipv4(), addr.ip.is_ipv4(), "{} mixes families", addr);
            prop_assert!(b.port > 0);
        }
    }
    let mut warnings = t.warnings.clone();
    warnings.sort();
    warnings.dedup();
    prop_assert_eq!(&warnings, &t.warnings);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The table depends on the set of imports and slices only: not on the order of imports,
    /// of slices, of endpoints within a slice or of addresses within an endpoint.
    #[test]
    fn input_order_does_not_matter(
        imports in prop::collection::vec(arb_import(), 0..5),
        slices in prop::collection::vec(arb_slice(), 0..6),
        seed in 1u64..,
    ) {
        let a = build(&imports, &slices);
        well_formed(&a)?;
        let mut seed = seed;
        let mut imports = imports;
        let mut slices = slices;
        shuffle(&mut imports, &mut seed);
        shuffle(&mut slices, &mut seed);
        for s in &mut slices {
            shuffle(&mut s.endpoints, &mut seed);
            for e in &mut s.endpoints {
                shuffle(&mut e.addresses, &mut seed);
            }
        }
        let b = build(&imports, &slices);
        prop_assert_eq!(a, b);
    }

    /// Garbage everywhere (any text, any number) gives warnings, never a panic, and the table
    /// stays well formed.
    #[test]
    fn garbage_never_panics(
        imports in prop::collection::vec(
            (
                "\\PC{0,6}",
                prop::collection::vec(prop_oneof!["\\PC{0,16}", Just(V4.to_owned()), Just(V6.to_owned())], 0..4),
                prop::collection::vec(prop::sample::select(vec![IPv4, IPv6]), 0..4),
                prop::collection::vec((prop::option::of("\\PC{0,4}"), prop::option::of("\\PC{0,4}|TCP|UDP"), any::<i32>()), 0..4),
                prop::option::of("\\PC{0,8}|ClientIP"),
                prop::option::of(any::<i32>()),
            ),
            0..4,
        ),
        slices in prop::collection::vec(
            (
                prop::option::of("\\PC{0,6}"),
                prop::option::of("\\PC{0,6}"),
                prop::option::of("\\PC{0,6}"),
                "\\PC{0,6}|IPv4|IPv6",
                prop::option::of(prop::collection::vec((prop::option::of("\\PC{0,4}"), prop::option::of("\\PC{0,4}|TCP|UDP"), prop::option::of(any::<i32>())), 0..4)),
                prop::collection::vec((prop::collection::vec("\\PC{0,16}|10\\.0\\.0\\.[0-9]{1,3}|fd01::[0-9a-f]{1,4}", 0..3), prop::option::of((prop::option::of(any::<bool>()), prop::option::of(any::<bool>()), prop::option::of(any::<bool>())))), 0..4),
            ),
            0..4,
        ),
    ) {
        let imports: Vec<ServiceImport> = imports
            .into_iter()
            .map(|(name, ips, families, ports, affinity, timeout)| {
                let mut si = ServiceImport::default();
                si.metadata.name = Some(name);
                si.spec.ips = ips;
                si.spec.ip_families = families;
                si.spec.ports = ports
                    .into_iter()
                    .map(|(name, protocol, port)| ServicePort { name, protocol, app_protocol: None, port })
                    .collect();
                si.spec.session_affinity = affinity;
                si.spec.session_affinity_config = Some(SessionAffinityConfig {
                    client_ip: Some(ClientIpConfig { timeout_seconds: timeout }),
                });
                si
            })
            .collect();
        let slices: Vec<EndpointSlice> = slices
            .into_iter()
            .map(|(name, service, cluster, at, ports, eps)| {
                let mut labels = BTreeMap::new();
                if let Some(s) = service {
                    labels.insert(LABEL_SERVICE_NAME.to_owned(), s);
                }
                if let Some(c) = cluster {
                    labels.insert(LABEL_SOURCE_CLUSTER.to_owned(), c);
                }
                EndpointSlice {
                    metadata: ObjectMeta { name, labels: Some(labels), ..Default::default() },
                    address_type: at,
                    ports: ports.map(|ps| {
                        ps.into_iter()
                            .map(|(name, protocol, port)| EndpointPort { name, protocol, port, app_protocol: None })
                            .collect()
                    }),
                    endpoints: eps
                        .into_iter()
                        .map(|(addresses, cond)| Endpoint {
                            addresses,
                            conditions: cond.map(|(ready, serving, terminating)| EndpointConditions { ready, serving, terminating }),
                            ..Default::default()
                        })
                        .collect(),
                }
            })
            .collect();
        let t = build(&imports, &slices);
        well_formed(&t)?;
    }
}

// ---- incremental build (LbState) and the input index

mod incremental {
    use std::collections::BTreeSet;

    use super::*;
    use crate::lb::inputs::{Change, InputIndex, import_input, slice_input};
    use crate::model::Interner;

    fn labelled(slices: &[EndpointSlice]) -> Vec<EndpointSlice> {
        slices
            .iter()
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(LABEL_SERVICE_NAME))
            })
            .cloned()
            .collect()
    }

    fn snapshot(imports: &[ServiceImport], slices: &[EndpointSlice]) -> Change {
        Change::snapshot(imports, slices, &Interner::new())
    }

    fn imports_change(imports: &[ServiceImport]) -> Change {
        let names = Interner::new();
        Change::Imports(imports.iter().map(|si| import_input(si, &names)).collect())
    }

    fn slices_change(slices: &[EndpointSlice]) -> Change {
        let names = Interner::new();
        Change::Slices(slices.iter().map(|s| slice_input(s, &names)).collect())
    }

    fn import_change(si: &ServiceImport) -> Change {
        Change::Import(import_input(si, &Interner::new()))
    }

    fn slice_change(s: &EndpointSlice) -> Change {
        Change::Slice(slice_input(s, &Interner::new()))
    }

    /// Files `change` and updates `lb` with what it touched.
    fn apply(index: &mut InputIndex, lb: &mut LbState, change: Change) -> BTreeSet<NamespacedName> {
        let mut dirty = BTreeSet::new();
        index.apply(change, &mut dirty);
        lb.update(&dirty, |s| index.inputs(s));
        dirty
    }

    /// A state that keeps no frontends ([`LbState::update_parts`]) and the frontends its
    /// parts hand out, kept the way the map writer keeps them: replaced service by service.
    #[derive(Default)]
    struct Lean {
        lb: LbState,
        frontends: BTreeMap<FrontendAddr, Frontend>,
    }

    impl Lean {
        fn update(&mut self, index: &InputIndex, dirty: &BTreeSet<NamespacedName>) {
            for (service, part) in self.lb.update_parts(dirty, |s| index.inputs(s)) {
                self.frontends.retain(|_, fe| fe.service != service);
                self.frontends.extend(part.frontends);
            }
        }

        /// The same table as a state that keeps it.
        fn matches(&self, full: &LbState) -> bool {
            self.frontends == full.table().frontends
                && self.lb.table().vips == full.table().vips
                && self.lb.table().warnings == full.table().warnings
                && self.lb.table().frontends.is_empty()
                && self.lb.refused() == full.refused()
        }
    }

    fn ns(name: &str) -> NamespacedName {
        NamespacedName::new("ns", name)
    }

    fn si(name: &str, ips: &[&str]) -> ServiceImport {
        import("ns", name)
            .ips(ips)
            .port(("http", "TCP", 80))
            .build()
    }

    fn es(name: &str, service: &str, addr: &str) -> EndpointSlice {
        imported_slice("ns", name, service, "c1")
            .port(("http", "TCP", 8080))
            .endpoint(endpoint(addr))
            .build()
    }

    #[test]
    fn nothing_is_ready_before_both_lists() {
        let mut index = InputIndex::default();
        let mut dirty = BTreeSet::new();
        index.apply(import_change(&si("a", &[V4])), &mut dirty);
        index.apply(Change::Imports(vec![]), &mut dirty);
        assert!(!index.is_ready());
        index.apply(Change::Slices(vec![]), &mut dirty);
        assert!(index.is_ready());
    }

    #[test]
    fn a_relabelled_slice_dirties_both_services_and_moves() {
        let mut index = InputIndex::default();
        let mut lb = LbState::default();
        let imports = [si("a", &[V4]), si("b", &["241.0.0.2"])];
        let slices = [es("s1", "a", "10.0.0.1")];
        apply(&mut index, &mut lb, snapshot(&imports, &slices));
        let moved = es("s1", "b", "10.0.0.1");
        let dirty = apply(&mut index, &mut lb, slice_change(&moved));
        assert_eq!(dirty, BTreeSet::from([ns("a"), ns("b")]));
        assert_eq!(lb.table(), &build(&imports, &[moved]));
        assert!(backends(lb.table(), V4, 80, Protocol::Tcp).is_empty());
        // The same object again changes nothing.
        let again = apply(
            &mut index,
            &mut lb,
            slice_change(&es("s1", "b", "10.0.0.1")),
        );
        assert!(again.is_empty());
    }

    #[test]
    fn a_state_kept_by_parts_builds_its_whole_table_again_when_updated() {
        let mut index = InputIndex::default();
        let imports = [si("a", &[V4]), si("b", &["241.0.0.2"])];
        let slices = [es("s1", "a", "10.0.0.1"), es("s2", "b", "10.0.0.2")];
        let mut dirty = BTreeSet::new();
        index.apply(snapshot(&imports, &slices), &mut dirty);
        let mut lb = LbState::default();
        let parts: Vec<_> = lb.update_parts(&dirty, |s| index.inputs(s)).collect();
        assert_eq!(parts.len(), 2);
        assert!(lb.table().frontends.is_empty());
        // Only a changed, but the table gets b's frontends back too.
        lb.update([&ns("a")], |s| index.inputs(s));
        assert_eq!(lb.table(), &build(&imports, &slices));
    }

    #[test]
    fn a_relist_prunes_what_was_deleted_meanwhile_and_only_dirties_differences() {
        let mut index = InputIndex::default();
        let mut lb = LbState::default();
        let imports = [si("a", &[V4]), si("b", &["241.0.0.2"])];
        let slices = [es("s1", "a", "10.0.0.1"), es("s2", "b", "10.0.0.2")];
        apply(&mut index, &mut lb, imports_change(&imports));
        apply(&mut index, &mut lb, slices_change(&slices));
        // Re-lists (new objects, equal or not): b's import and a's slice are gone.
        let d1 = apply(&mut index, &mut lb, imports_change(&imports[..1]));
        assert_eq!(d1, BTreeSet::from([ns("b")]));
        let d2 = apply(&mut index, &mut lb, slices_change(&slices[1..2]));
        assert_eq!(d2, BTreeSet::from([ns("a")]));
        assert_eq!(lb.table(), &build(&imports[..1], &slices[1..]));
        assert!(index.inputs(&ns("a")).slices.is_empty());
        assert!(index.inputs(&ns("b")).imports.is_empty());
    }

    #[test]
    fn a_released_vip_goes_to_the_next_claimant() {
        let mut index = InputIndex::default();
        let mut lb = LbState::default();
        let imports = [si("a", &[V4]), si("b", &[V4]), si("c", &["241.0.0.3"])];
        apply(&mut index, &mut lb, snapshot(&imports, &[]));
        assert_eq!(lb.table().vips.get(&V4.parse().unwrap()), Some(&ns("a")));
        let a = NamespacedName::of(&imports[0].metadata);
        let dirty = apply(&mut index, &mut lb, Change::ImportDeleted(a));
        assert_eq!(dirty, BTreeSet::from([ns("a")]));
        assert_eq!(lb.table().vips.get(&V4.parse().unwrap()), Some(&ns("b")));
        assert_eq!(lb.table(), &build(&imports[1..], &[]));
        // And back: a takes it again, b loses it.
        apply(&mut index, &mut lb, import_change(&imports[0]));
        assert_eq!(lb.table(), &build(&imports, &[]));
    }

    /// The records keep only what routing reads: metadata, hostnames and node names of the
    /// objects change nothing in the table.
    #[test]
    fn metadata_the_table_does_not_read_changes_nothing() {
        let imports = vec![si("a", &[V4])];
        let slices = vec![es("s1", "a", "10.0.0.1")];
        let plain = build(&imports, &slices);
        let mut decorated_imports = imports.clone();
        decorated_imports[0].metadata.annotations =
            Some(BTreeMap::from([("x".into(), "y".into())]));
        decorated_imports[0].metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        let mut decorated_slices = slices.clone();
        decorated_slices[0].endpoints[0].hostname = Some("pod".into());
        decorated_slices[0].endpoints[0].node_name = Some("node".into());
        assert_eq!(build(&decorated_imports, &decorated_slices), plain);
    }

    /// One edit of the inputs, as a watch event would report it.
    #[derive(Clone, Debug)]
    enum Edit {
        Import(ServiceImport),
        DeleteImport(usize),
        Slice(EndpointSlice),
        DeleteSlice(usize),
    }

    fn arb_edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            arb_import().prop_map(Edit::Import),
            any::<usize>().prop_map(Edit::DeleteImport),
            arb_slice().prop_map(Edit::Slice),
            any::<usize>().prop_map(Edit::DeleteSlice),
        ]
    }

    type ObjKey = (String, String);

    fn obj_key(meta: &ObjectMeta) -> ObjKey {
        let (ns, name) = crate::model::key(meta);
        (ns.to_owned(), name.to_owned())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The table kept by LbState is the one `build` makes from the same inputs: after a
        /// full snapshot (in any order), and after every one of a sequence of single-object
        /// edits (adds, changes, deletes, slices moving between services by label, imports
        /// contending for the same ClusterSet IP), each applied to only the services it touches.
        #[test]
        fn incremental_equals_full_build(
            imports in prop::collection::vec(arb_import(), 0..6),
            slices in prop::collection::vec(arb_slice(), 0..8),
            edits in prop::collection::vec(arb_edit(), 1..12),
        ) {
            let mut index = InputIndex::default();
            let mut lb = LbState::default();
            let mut lean = Lean::default();
            let dirty = apply(&mut index, &mut lb, snapshot(&imports, &slices));
            lean.update(&index, &dirty);
            prop_assert_eq!(lb.table(), &build(&imports, &labelled(&slices)));
            prop_assert!(lean.matches(&lb));

            // From here on, one object per namespace/name, as in an API server.
            let mut imports: BTreeMap<ObjKey, ServiceImport> =
                imports.into_iter().map(|s| (obj_key(&s.metadata), s)).collect();
            let mut slices: BTreeMap<ObjKey, EndpointSlice> =
                slices.into_iter().map(|s| (obj_key(&s.metadata), s)).collect();
            let all_imports: Vec<_> = imports.values().cloned().collect();
            let all_slices: Vec<_> = slices.values().cloned().collect();
            let dirty = apply(&mut index, &mut lb, snapshot(&all_imports, &all_slices));
            lean.update(&index, &dirty);
            prop_assert_eq!(lb.table(), &build(&all_imports, &labelled(&all_slices)));
            prop_assert!(lean.matches(&lb));

            for edit in edits {
                let change = match edit {
                    Edit::Import(si) => {
                        imports.insert(obj_key(&si.metadata), si.clone());
                        import_change(&si)
                    }
                    Edit::DeleteImport(i) => {
                        let Some(k) = imports.keys().nth(i % imports.len().max(1)).cloned() else {
                            continue;
                        };
                        let si = imports.remove(&k).expect("present");
                        Change::ImportDeleted(NamespacedName::of(&si.metadata))
                    }
                    Edit::Slice(s) => {
                        slices.insert(obj_key(&s.metadata), s.clone());
                        slice_change(&s)
                    }
                    Edit::DeleteSlice(i) => {
                        let Some(k) = slices.keys().nth(i % slices.len().max(1)).cloned() else {
                            continue;
                        };
                        let s = slices.remove(&k).expect("present");
                        Change::SliceDeleted(NamespacedName::of(&s.metadata))
                    }
                };
                let dirty = apply(&mut index, &mut lb, change);
                lean.update(&index, &dirty);
                prop_assert!(lean.matches(&lb), "a state without frontends hands out the same parts");
                let all_imports: Vec<_> = imports.values().cloned().collect();
                let all_slices: Vec<_> = labelled(&slices.values().cloned().collect::<Vec<_>>());
                let full = build(&all_imports, &all_slices);
                prop_assert_eq!(lb.table(), &full);
                for (service, part) in build_services(full.services().into_iter().map(|s| (s, index.inputs(s))), &Default::default()) {
                    // Each part holds the service's own frontends only.
                    prop_assert!(part.frontends.iter().all(|(_, fe)| &fe.service == service));
                }
            }
        }
    }
}

#[test]
fn hostile_backends_are_dropped_alone_and_counted() {
    let hostile = [
        "127.0.0.1",
        "169.254.169.254",
        "0.0.0.0",
        "224.0.0.1",
        "241.0.0.9",
        "168.63.129.16",
    ];
    let slice = imported_slice("ns", "s", "web", "c1")
        .port(("http", "TCP", 8080))
        .endpoints(
            hostile
                .iter()
                .map(|ip| endpoint(ip).ready())
                .chain([endpoint("10.0.0.1").ready()]),
        )
        .build();
    let inputs = [(
        NamespacedName::new("ns", "web"),
        web(&[("http", "TCP", 80)]),
        slice,
    )];
    let names = crate::model::Interner::new();
    let mut index = inputs::InputIndex::default();
    let mut dirty = BTreeSet::new();
    index.apply(
        inputs::Change::snapshot([&inputs[0].1], [&inputs[0].2], &names),
        &mut dirty,
    );
    let mut state = LbState::default();
    state.update(index.services(), |s| index.inputs(s));
    let t = state.table();
    // The good endpoint still serves: only the bad ones are dropped.
    assert_eq!(backends(t, V4, 80, Tcp), vec!["c1/10.0.0.1:8080"]);
    for ip in hostile {
        assert!(
            has_warning(t, "EndpointSlice ns/s", &format!("endpoint {ip} ")),
            "{ip}: {:?}",
            t.warnings
        );
    }
    let refused: usize = state
        .refused()
        .iter()
        .filter(|((kind, _), _)| *kind == AddressUse::Backend)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(refused, hostile.len());
    assert_eq!(
        state
            .refused()
            .get(&(AddressUse::Backend, Refusal::Loopback)),
        Some(&1)
    );

    // A ready but refused endpoint does not make the terminating fallback go away, nor count
    // as ready: with only refused endpoints ready, nothing is served.
    let only_bad = imported_slice("ns", "s", "web", "c1")
        .port(("http", "TCP", 8080))
        .endpoints([endpoint("127.0.0.1").ready()])
        .build();
    let t = build(&[web(&[("http", "TCP", 80)])], &[only_bad]);
    assert!(backends(&t, V4, 80, Tcp).is_empty());

    // Removing the slice clears the counts.
    index.apply(
        inputs::Change::SliceDeleted(NamespacedName::new("ns", "s")),
        &mut dirty,
    );
    state.update(&dirty, |s| index.inputs(s));
    assert!(state.refused().is_empty(), "{:?}", state.refused());
}

#[test]
fn a_clusterset_ip_outside_the_clusterset_cidrs_is_never_programmed() {
    // kube-dns's address as a "ClusterSet IP": refused, so DNS is not intercepted.
    let capture = || {
        import("ns", "evil")
            .ips(["10.96.0.10"])
            .families(&[IPv4])
            .ports([("dns", "UDP", 53)])
            .build()
    };
    let t = build(&[capture(), web(&[("http", "TCP", 80)])], &[]);
    assert!(
        t.frontends.keys().all(|a| a.ip.to_string() == V4),
        "{:?}",
        t.frontends.keys()
    );
    assert!(
        !t.vips
            .contains_key(&"10.96.0.10".parse::<IpAddr>().expect("ip"))
    );
    assert!(has_warning(
        &t,
        "ServiceImport ns/evil",
        "ClusterSet IP 10.96.0.10 is outside the ClusterSet's CIDRs"
    ));

    // With the range configured, the same import is programmed.
    let mut policy = AddressPolicy::default();
    policy
        .clusterset_cidrs
        .push("10.96.0.0/12".parse().expect("cidr"));
    let evil = capture();
    let names = crate::model::Interner::new();
    let mut index = inputs::InputIndex::default();
    let mut dirty = BTreeSet::new();
    index.apply(inputs::Change::snapshot([&evil], [], &names), &mut dirty);
    let mut state = LbState::new(std::sync::Arc::new(policy));
    state.update(index.services(), |s| index.inputs(s));
    assert!(
        state
            .table()
            .frontends
            .contains_key(&frontend_addr("10.96.0.10", 53, Udp))
    );
}
