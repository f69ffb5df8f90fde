//! Property tests of the whole merge: input order does not matter, merging again with the
//! produced imports as the existing ones changes nothing, and no input makes it panic.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{ServicePort as K8sPort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;

use super::*;
use crate::manifest::parse_documents;
use crate::model::{
    Interner, LABEL_K8S_SERVICE_NAME, ObjectMeta, ServiceExportSpec,
    member::ExportRecord,
    records::{ImportRecord, ImportedSlice},
};

const NAMES: &[&str] = &["web", "db", "api", "web-a"];

fn arb_port() -> impl Strategy<Value = K8sPort> {
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
        .prop_map(|(name, protocol, port, app)| K8sPort {
            name: name.map(str::to_owned),
            protocol: protocol.map(str::to_owned),
            port,
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
            |(name, type_, headless, ports, fams, aff, timeout, itp, td)| Service {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some("demo".into()),
                    ..Default::default()
                },
                spec: Some(ServiceSpec {
                    type_: type_.map(str::to_owned),
                    cluster_ip: headless.then(|| "None".to_owned()),
                    ports: Some(ports),
                    ip_families: fams.map(|f| f.into_iter().map(str::to_owned).collect()),
                    session_affinity: aff.map(str::to_owned),
                    session_affinity_config: timeout.map(|t| {
                        k8s_openapi::api::core::v1::SessionAffinityConfig {
                            client_ip: Some(k8s_openapi::api::core::v1::ClientIPConfig {
                                timeout_seconds: Some(t),
                            }),
                        }
                    }),
                    internal_traffic_policy: itp.map(str::to_owned),
                    traffic_distribution: td.map(str::to_owned),
                    ..Default::default()
                }),
                status: None,
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
            let mut se = ServiceExport::new(
                name,
                ServiceExportSpec {
                    exported_labels: label
                        .map(|l| BTreeMap::from([("l".to_owned(), l.to_owned())]))
                        .unwrap_or_default(),
                    ..Default::default()
                },
            );
            se.metadata.namespace = Some("demo".into());
            se.metadata.creation_timestamp = ts.and_then(|s| {
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + s)
                    .ok()
                    .map(Time)
            });
            se
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
        .prop_map(|(name, svc, at, ports, eps)| EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{}-{name}", svc.unwrap_or("none"))),
                namespace: Some("demo".into()),
                labels: svc
                    .map(|s| BTreeMap::from([(LABEL_K8S_SERVICE_NAME.to_owned(), s.to_owned())])),
                ..Default::default()
            },
            address_type: at.into(),
            ports: Some(
                ports
                    .into_iter()
                    .map(|(n, p, proto)| EndpointPort {
                        name: n.map(str::to_owned),
                        port: p,
                        protocol: proto.map(str::to_owned),
                        app_protocol: None,
                    })
                    .collect(),
            ),
            endpoints: eps
                .into_iter()
                .map(|(addrs, ready, terminating)| Endpoint {
                    addresses: addrs.into_iter().map(str::to_owned).collect(),
                    conditions: Some(EndpointConditions {
                        ready,
                        serving: None,
                        terminating,
                    }),
                    ..Default::default()
                })
                .collect(),
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
                cfg.clusters.insert(ClusterId::new("c0").expect("id"), c0);
            }
            cfg
        })
}

fn arb_existing() -> impl Strategy<Value = Vec<ImportRecord>> {
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
            .prop_map(|(name, ips)| {
                let mut si = crate::model::ServiceImport::default();
                si.metadata.name = Some(name.into());
                si.metadata.namespace = Some("demo".into());
                si.spec.ips = ips.into_iter().map(str::to_owned).collect();
                ImportRecord::from_k8s(&si, &Interner::new(), false)
                    .record
                    .expect("an import always converts")
            }),
        0..4,
    )
}

type Case = (
    Vec<(Vec<Service>, Vec<ServiceExport>, Vec<EndpointSlice>)>,
    ClusterSetConfig,
    Vec<ImportRecord>,
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
        .map(|(i, (s, e, sl))| {
            ClusterSnapshot::from_k8s(
                ClusterId::new(format!("c{i}")).expect("id"),
                s,
                e,
                sl,
                &Interner::new(),
            )
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
        let importing = ClusterId::new("c0").expect("id");
        let a = merge(&snaps, &cfg, &importing, &existing);
        existing.reverse();
        let b = merge(&reorder(snaps, rotate), &cfg, &importing, &existing);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn merging_again_with_the_produced_imports_is_stable((clusters, cfg, existing) in arb_case()) {
        let snaps = snapshots(&clusters);
        let importing = ClusterId::new("c0").expect("id");
        let first = merge(&snaps, &cfg, &importing, &existing);
        let second = merge(&snaps, &cfg, &importing, &first.service_imports);
        prop_assert_eq!(&first, &second);
        // Every ClusterSetIP import that is ready has one IP per family, in order.
        for si in &first.service_imports {
            let ready = si.status.as_ref().is_some_and(|s| s.conditions.iter().all(|c| c.status == "True"));
            prop_assert!(!si.ip_families.is_empty());
            if si.type_ == crate::model::ServiceImportType::ClusterSetIP && ready {
                prop_assert_eq!(si.ips.len(), si.ip_families.len());
                for (ip, f) in si.ips.iter().zip(&si.ip_families) {
                    prop_assert_eq!(IpFamily::of(ip), *f);
                }
            } else {
                prop_assert!(si.ips.is_empty());
            }
        }
        let _ = crate::lb::build_records(&first.service_imports, &first.endpoint_slices);
    }

    /// Every list of the plan is in its documented order: imports and slices by
    /// namespace/name, export statuses by cluster then service.
    #[test]
    fn plan_lists_are_sorted((clusters, cfg, existing) in arb_case()) {
        let snaps = snapshots(&clusters);
        let importing = ClusterId::new("c0").expect("id");
        let plan = merge(&snaps, &cfg, &importing, &existing);
        prop_assert!(plan.service_imports.windows(2).all(|w| w[0].service < w[1].service));
        let key = |s: &ImportedSlice| (s.service.namespace.clone(), s.name.clone());
        prop_assert!(plan.endpoint_slices.windows(2).all(|w| key(&w[0]) < key(&w[1])));
        prop_assert!(plan
            .export_statuses
            .windows(2)
            .all(|w| (&w[0].cluster, &w[0].service) < (&w[1].cluster, &w[1].service)));
    }

    #[test]
    fn arbitrary_manifests_never_panic(texts in prop::collection::vec(arb_yaml(), 1..4)) {
        let mut snaps = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let mut snap = ClusterSnapshot::empty(ClusterId::new(format!("c{i}")).expect("id"));
            let (objects, _errors) = parse_documents(text, Path::new("fuzz.yaml"));
            let names = Interner::new();
            for m in objects {
                snap.add_manifest(m, &names);
            }
            snaps.push(snap);
        }
        let importing = ClusterId::new("c0").expect("id");
        let plan = merge(&snaps, &ClusterSetConfig::default(), &importing, &[]);
        let _ = crate::lb::build_records(&plan.service_imports, &plan.endpoint_slices);
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
    let c1 = ClusterId::new("c1").expect("id");
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
    let (objects, errors) = parse_documents(text, Path::new("t.yaml"));
    assert!(errors.is_empty(), "{errors:?}");
    let mut snap = ClusterSnapshot::empty(c1.clone());
    let names = Interner::new();
    for m in objects {
        snap.add_manifest(m, &names);
    }
    let plan = merge(&[snap], &ClusterSetConfig::default(), &c1, &[]);
    assert_eq!(plan.endpoint_slices.len(), 1);
    let eps = &plan.endpoint_slices[0].to_k8s().endpoints;
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
    assert_eq!(&*plan.endpoint_slices[0].name, "web-c1-ipv4");
}

#[test]
fn duplicate_cluster_snapshots_are_combined_and_reported() {
    let c1 = ClusterId::new("c1").expect("id");
    let mut a = ClusterSnapshot::empty(c1.clone());
    a.service_exports.push(Arc::new(ExportRecord::from_k8s(
        &ServiceExport::new("web", ServiceExportSpec::default()),
        &Interner::new(),
    )));
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
    let c1 = ClusterId::new("c1").expect("id");
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
    let (objects, errors) = parse_documents(&text, Path::new("t.yaml"));
    assert!(errors.is_empty(), "{errors:?}");
    let mut snap = ClusterSnapshot::empty(c1.clone());
    let names = Interner::new();
    for m in objects {
        snap.add_manifest(m, &names);
    }
    let plan = merge(&[snap], &ClusterSetConfig::default(), &c1, &[]);
    let names: Vec<&str> = plan.endpoint_slices.iter().map(|s| &*s.name).collect();
    assert_eq!(names, vec!["web-a-c1-ipv4", "web-c1-ipv4"]);
    let imports: Vec<&str> = plan
        .service_imports
        .iter()
        .map(|s| &*s.service.name)
        .collect();
    assert_eq!(imports, vec!["web", "web-a"]);
}
