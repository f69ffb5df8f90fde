//! Property tests of the whole merge: input order does not matter, merging again with the
//! produced imports as the existing ones changes nothing, and no input makes it panic.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::LazyLock;

use k8s_openapi::api::discovery::v1::EndpointConditions;
use proptest::prelude::*;

use super::*;
use crate::fixtures::{
    Port, cluster, endpoint_of, endpoint_slice, export, import, local_slice, manifests, service,
    snapshot,
};
use crate::manifest::parse_documents;
use crate::model::ServiceExportSpec;

const NAMES: &[&str] = &["web", "db", "api", "web-a"];

/// A valid export of an empty Service from `cluster`, with these (normalised) ports and
/// families: the input of the step tests of [`ports`] and [`families`].
pub(super) fn bare_export(
    cluster: &ClusterId,
    ports: Vec<ServicePort>,
    families: Vec<IpFamily>,
) -> exports::Export<'_> {
    static SERVICE: LazyLock<Service> = LazyLock::new(Service::default);
    static SPEC: LazyLock<ServiceExportSpec> = LazyLock::new(ServiceExportSpec::default);
    exports::Export {
        cluster,
        service: &SERVICE,
        spec: &SPEC,
        created: None,
        ports,
        families,
        headless: false,
        local_slices: &[],
    }
}

fn arb_port() -> impl Strategy<Value = Port> {
    (
        prop::sample::select(vec![None, Some(""), Some("http"), Some("tcp"), Some("a")]),
        prop::sample::select(vec![
            None,
            Some("TCP"),
            Some("UDP"),
            Some("SCTP"),
            Some("HTTP"),
        ]),
        prop::sample::select(vec![42, 80, 8080, 0, 70000, -1]),
        prop::sample::select(vec![None, Some("h2c"), Some("")]),
    )
        .prop_map(|(name, protocol, port, app)| Port {
            name: name.map(str::to_owned),
            protocol: protocol.map(str::to_owned),
            port: Some(port),
            app_protocol: app.map(str::to_owned),
            ..Default::default()
        })
}

fn arb_service() -> impl Strategy<Value = Service> {
    (
        prop::sample::select(NAMES.to_vec()),
        prop::sample::select(vec![
            None,
            Some("ClusterIP"),
            Some("NodePort"),
            Some("ExternalName"),
            Some("Odd"),
        ]),
        any::<bool>(),
        prop::collection::vec(arb_port(), 0..3),
        prop::option::of(prop::collection::vec(
            prop::sample::select(vec!["IPv4", "IPv6", "IPv5"]),
            0..4,
        )),
        prop::sample::select(vec![None, Some("None"), Some("ClientIP")]),
        prop::option::of(prop::sample::select(vec![10, 10800, 0])),
        prop::sample::select(vec![None, Some("Cluster"), Some("Local")]),
        prop::sample::select(vec![None, Some("PreferClose"), Some("PreferSameZone")]),
    )
        .prop_map(
            |(name, type_, headless, ports, fams, aff, timeout, itp, td)| {
                let mut svc = service("demo", name)
                    .type_(type_)
                    .ports(ports)
                    .affinity(aff)
                    .internal_traffic_policy(itp)
                    .traffic_distribution(td);
                if headless {
                    svc = svc.headless();
                }
                if let Some(f) = fams {
                    svc = svc.families(&f);
                }
                if let Some(t) = timeout {
                    svc = svc.affinity_timeout(Some(t));
                }
                svc.build()
            },
        )
}

fn arb_export() -> impl Strategy<Value = ServiceExport> {
    (
        prop::sample::select(NAMES.to_vec()),
        prop::option::of(0i64..3),
        prop::sample::select(vec![None, Some("x"), Some("y")]),
    )
        .prop_map(|(name, ts, label)| {
            let mut se = export("demo", name);
            if let Some(s) = ts {
                se = se.created_at(1_700_000_000 + s);
            }
            if let Some(l) = label {
                se = se.exported_labels(&[("l", l)]);
            }
            se.build()
        })
}

fn arb_slice() -> impl Strategy<Value = EndpointSlice> {
    (
        prop::sample::select(vec!["s1", "s2", "s3"]),
        prop::option::of(prop::sample::select(NAMES.to_vec())),
        prop::sample::select(vec!["IPv4", "IPv6", "FQDN"]),
        prop::collection::vec(
            (
                prop::sample::select(vec![None, Some("http"), Some("tcp"), Some("a")]),
                prop::sample::select(vec![Some(8080), Some(0), None]),
                prop::sample::select(vec![None, Some("TCP"), Some("UDP")]),
            ),
            0..3,
        ),
        prop::collection::vec(
            (
                prop::collection::vec(
                    prop::sample::select(vec!["10.0.0.1", "10.0.0.2", "fd00::1", "bad"]),
                    0..3,
                ),
                prop::option::of(any::<bool>()),
                prop::option::of(any::<bool>()),
            ),
            0..4,
        ),
    )
        .prop_map(|(name, svc, at, ports, eps)| {
            let name = format!("{}-{name}", svc.unwrap_or("none"));
            let slice = match svc {
                Some(s) => local_slice("demo", &name, s),
                None => endpoint_slice("demo", &name),
            };
            slice
                .address_type(at)
                .ports(ports.into_iter().map(|(n, p, proto)| Port {
                    name: n.map(str::to_owned),
                    port: p,
                    protocol: proto.map(str::to_owned),
                    ..Default::default()
                }))
                .endpoints(eps.into_iter().map(|(addrs, ready, terminating)| {
                    endpoint_of(addrs).conditions((ready, None, terminating))
                }))
                .build()
        })
}

fn arb_objects() -> impl Strategy<Value = (Vec<Service>, Vec<ServiceExport>, Vec<EndpointSlice>)> {
    (
        prop::collection::vec(arb_service(), 0..4),
        prop::collection::vec(arb_export(), 0..4),
        prop::collection::vec(arb_slice(), 0..4),
    )
}

fn arb_config() -> impl Strategy<Value = ClusterSetConfig> {
    (
        prop::sample::select(vec![IpFamilyPolicy::Intersection, IpFamilyPolicy::Union]),
        prop::sample::select(vec![
            vec![],
            vec![IpFamily::IPv4],
            vec![IpFamily::IPv6, IpFamily::IPv4],
        ]),
        any::<bool>(),
    )
        .prop_map(|(policy, c0, tiny)| {
            let mut cfg = ClusterSetConfig {
                ip_family_policy: policy,
                ..Default::default()
            };
            if tiny {
                // Two usable addresses per family: exhaustion and probing get exercised.
                cfg.cidrs.ipv4 = "10.9.0.0/30".parse().unwrap_or(cfg.cidrs.ipv4);
                cfg.cidrs.ipv6 = "fd00::/126".parse().unwrap_or(cfg.cidrs.ipv6);
            }
            if !c0.is_empty() {
                cfg.clusters.insert(cluster("c0"), c0);
            }
            cfg
        })
}

fn arb_existing() -> impl Strategy<Value = Vec<ServiceImport>> {
    prop::collection::vec(
        (
            prop::sample::select(NAMES.to_vec()),
            prop::collection::vec(
                prop::sample::select(vec![
                    "241.0.0.7",
                    "10.9.0.1",
                    "10.9.0.2",
                    "fd00::1",
                    "fd00:241::9",
                    "junk",
                ]),
                0..3,
            ),
        )
            .prop_map(|(name, ips)| import("demo", name).ips(&ips).build()),
        0..4,
    )
}

type Case = (
    Vec<(Vec<Service>, Vec<ServiceExport>, Vec<EndpointSlice>)>,
    ClusterSetConfig,
    Vec<ServiceImport>,
);

fn arb_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(arb_objects(), 1..4),
        arb_config(),
        arb_existing(),
    )
}

fn snapshots(
    clusters: &[(Vec<Service>, Vec<ServiceExport>, Vec<EndpointSlice>)],
) -> Vec<ClusterSnapshot> {
    clusters
        .iter()
        .enumerate()
        .map(|(i, (s, e, sl))| ClusterSnapshot {
            cluster: cluster(&format!("c{i}")),
            services: s.clone(),
            service_exports: e.clone(),
            endpoint_slices: sl.clone(),
        })
        .collect()
}

/// Reverses or rotates every list, so the merge sees another order.
fn reorder(mut snaps: Vec<ClusterSnapshot>, rotate: usize) -> Vec<ClusterSnapshot> {
    fn turn<T>(v: &mut [T], k: usize) {
        if !v.is_empty() {
            let k = k % v.len();
            v.rotate_left(k);
            v.reverse();
        }
    }
    for s in &mut snaps {
        turn(&mut s.services, rotate);
        turn(&mut s.service_exports, rotate + 1);
        turn(&mut s.endpoint_slices, rotate + 2);
    }
    turn(&mut snaps, rotate);
    snaps
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn input_order_does_not_matter((clusters, cfg, mut existing) in arb_case(), rotate in 0usize..5) {
        let snaps = snapshots(&clusters);
        let importing = cluster("c0");
        let a = merge(&snaps, &cfg, &importing, &existing);
        existing.reverse();
        let b = merge(&reorder(snaps, rotate), &cfg, &importing, &existing);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn merging_again_with_the_produced_imports_is_stable((clusters, cfg, existing) in arb_case()) {
        let snaps = snapshots(&clusters);
        let importing = cluster("c0");
        let first = merge(&snaps, &cfg, &importing, &existing);
        let second = merge(&snaps, &cfg, &importing, &first.service_imports);
        prop_assert_eq!(&first, &second);
        // Every ClusterSetIP import that is ready has one IP per family, in order.
        for si in &first.service_imports {
            let ready = si.status.as_ref().is_some_and(|s| s.conditions.iter().all(|c| c.status == "True"));
            prop_assert!(!si.spec.ip_families.is_empty());
            if si.spec.type_ == crate::model::ServiceImportType::ClusterSetIP && ready {
                prop_assert_eq!(si.spec.ips.len(), si.spec.ip_families.len());
                for (ip, f) in si.spec.ips.iter().zip(&si.spec.ip_families) {
                    let ip: std::net::IpAddr = ip.parse().expect("ip");
                    prop_assert_eq!(IpFamily::of(&ip), *f);
                }
            } else {
                prop_assert!(si.spec.ips.is_empty());
            }
        }
        let _ = crate::lb::build(&first.service_imports, &first.endpoint_slices);
    }

    /// Every list of the plan is in its documented order: imports and slices by
    /// namespace/name, export statuses by cluster then service.
    #[test]
    fn plan_lists_are_sorted((clusters, cfg, existing) in arb_case()) {
        let snaps = snapshots(&clusters);
        let importing = cluster("c0");
        let plan = merge(&snaps, &cfg, &importing, &existing);
        let key = |m: &ObjectMeta| (m.namespace.clone(), m.name.clone());
        prop_assert!(plan.service_imports.windows(2).all(|w| key(&w[0].metadata) < key(&w[1].metadata)));
        prop_assert!(plan.endpoint_slices.windows(2).all(|w| key(&w[0].metadata) < key(&w[1].metadata)));
        prop_assert!(plan
            .export_statuses
            .windows(2)
            .all(|w| (&w[0].cluster, &w[0].service) < (&w[1].cluster, &w[1].service)));
    }

    #[test]
    fn arbitrary_manifests_never_panic(texts in prop::collection::vec(arb_yaml(), 1..4)) {
        let mut snaps = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let (objects, _errors) = parse_documents(text, Path::new("fuzz.yaml"));
            snaps.push(snapshot(&format!("c{i}")).manifests(objects).build());
        }
        let importing = cluster("c0");
        let plan = merge(&snaps, &ClusterSetConfig::default(), &importing, &[]);
        let _ = crate::lb::build(&plan.service_imports, &plan.endpoint_slices);
    }
}

/// YAML text that is often a valid object of a kind the merge reads, with random values, and
/// sometimes garbage.
fn arb_yaml() -> impl Strategy<Value = String> {
    let value = prop::sample::select(vec![
        "80",
        "0",
        "-5",
        "99999",
        "\"x\"",
        "null",
        "[]",
        "{}",
        "IPv4",
        "IPv6",
        "None",
        "TCP",
        "true",
        "\"10.0.0.1\"",
        "\"fd00::1\"",
        "[IPv4, IPv4]",
        "[IPv4, IPv6, IPv4]",
        "2026-01-01T00:00:00Z",
    ]);
    let doc = (
        prop::sample::select(vec!["Service", "ServiceExport", "EndpointSlice", "Pod"]),
        prop::sample::select(NAMES.to_vec()),
        prop::collection::vec((prop::sample::select(vec!["port", "ipFamilies", "clusterIP", "type", "addresses", "ready", "creationTimestamp"]), value), 0..5),
    )
        .prop_map(|(kind, name, fields)| {
            let api = match kind {
                "ServiceExport" => "multicluster.x-k8s.io/v1beta1",
                "EndpointSlice" => "discovery.k8s.io/v1",
                _ => "v1",
            };
            let mut f = BTreeMap::new();
            for (k, v) in fields {
                f.insert(k, v);
            }
            let get = |k: &str| f.get(k).copied().unwrap_or("null");
            match kind {
                "Service" => format!(
                    "apiVersion: {api}\nkind: Service\nmetadata: {{name: {name}, namespace: demo}}\nspec: {{type: {}, clusterIP: {}, ipFamilies: {}, ports: [{{name: http, port: {}}}]}}\n",
                    get("type"), get("clusterIP"), get("ipFamilies"), get("port")
                ),
                "ServiceExport" => format!(
                    "apiVersion: {api}\nkind: ServiceExport\nmetadata: {{name: {name}, namespace: demo, creationTimestamp: {}}}\n",
                    get("creationTimestamp")
                ),
                "EndpointSlice" => format!(
                    "apiVersion: {api}\nkind: EndpointSlice\nmetadata: {{name: {name}-x, namespace: demo, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: {}\nports: [{{name: http, port: {}}}]\nendpoints: [{{addresses: [{}], conditions: {{ready: {}}}}}]\n",
                    get("ipFamilies"), get("port"), get("addresses"), get("ready")
                ),
                _ => format!("apiVersion: {api}\nkind: {kind}\nmetadata: {{name: {name}}}\n"),
            }
        });
    prop_oneof![
        4 => prop::collection::vec(doc, 1..6).prop_map(|d| d.join("---\n")),
        1 => ".{0,200}",
    ]
}

#[test]
fn hostname_zone_and_conditions_are_copied() {
    let c1 = cluster("c1");
    let text = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {ports: [{name: http, port: 80}], ipFamilies: [IPv4]}
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata: {name: web, namespace: demo}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.0.0.2], hostname: web-1, zone: z2, nodeName: n1, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.0.0.1, "fd00::1"], hostname: web-0, zone: z1}
"#;
    let snap = snapshot("c1").manifests(manifests(text)).build();
    let plan = merge(&[snap], &ClusterSetConfig::default(), &c1, &[]);
    assert_eq!(plan.endpoint_slices.len(), 1);
    let eps = &plan.endpoint_slices[0].endpoints;
    // Sorted by address; the IPv6 address of an IPv4 slice is dropped (and reported).
    assert_eq!(eps[0].addresses, vec!["10.0.0.1"]);
    assert_eq!(
        (eps[0].hostname.as_deref(), eps[0].zone.as_deref()),
        (Some("web-0"), Some("z1"))
    );
    assert!(eps[0].conditions.is_none());
    assert_eq!(
        (eps[1].hostname.as_deref(), eps[1].zone.as_deref()),
        (Some("web-1"), Some("z2"))
    );
    assert_eq!(
        eps[1].conditions,
        Some(EndpointConditions {
            ready: Some(false),
            serving: Some(true),
            terminating: Some(true)
        })
    );
    // nodeName is not a property of the importing cluster.
    assert!(eps[1].node_name.is_none());
    assert_eq!(plan.diagnostics.len(), 1, "{:?}", plan.diagnostics);
    assert_eq!(
        plan.endpoint_slices[0].metadata.name.as_deref(),
        Some("web-c1-ipv4")
    );
}

#[test]
fn duplicate_cluster_snapshots_are_combined_and_reported() {
    let c1 = cluster("c1");
    let mut a = ClusterSnapshot::empty(c1.clone());
    a.service_exports
        .push(ServiceExport::new("web", ServiceExportSpec::default()));
    let b = ClusterSnapshot::empty(c1.clone());
    let plan = merge(&[a, b], &ClusterSetConfig::default(), &c1, &[]);
    assert_eq!(plan.export_statuses.len(), 1);
    assert_eq!(plan.export_statuses[0].conditions[0].reason, "NoService");
    assert!(plan.diagnostics[0].message.contains("given more than once"));
}

/// Slice names do not always sort like their services ("web" < "web-a", but
/// "web-a-c1-ipv4" < "web-c1-ipv4"): the plan still lists slices by name.
#[test]
fn slices_are_listed_by_name_even_when_services_sort_otherwise() {
    let c1 = cluster("c1");
    let mut text = String::new();
    for name in ["web", "web-a"] {
        text.push_str(&format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: demo}}
spec: {{ports: [{{name: http, port: 80}}], ipFamilies: [IPv4]}}
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata: {{name: {name}, namespace: demo}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: demo, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints: [{{addresses: [10.0.0.1]}}]
---
"#
        ));
    }
    let snap = snapshot("c1").manifests(manifests(&text)).build();
    let plan = merge(&[snap], &ClusterSetConfig::default(), &c1, &[]);
    let names: Vec<&str> = plan
        .endpoint_slices
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .collect();
    assert_eq!(names, vec!["web-a-c1-ipv4", "web-c1-ipv4"]);
    let imports: Vec<&str> = plan
        .service_imports
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .collect();
    assert_eq!(imports, vec!["web", "web-a"]);
}
