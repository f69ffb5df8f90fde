//! Property tests of the whole merge: input order does not matter, merging again with the
//! produced imports as the existing ones changes nothing, and no input makes it panic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::discovery::v1::EndpointConditions;
use proptest::prelude::*;

use super::*;
use crate::fixtures::{
    Port, cluster, endpoint_of, endpoint_slice, export, import, local_slice, manifests, service,
    snapshot,
};
use crate::manifest::parse_documents;
use crate::model::{
    Interner, ObjectMeta, ServiceExportSpec,
    member::{ExportRecord, ServiceRecord},
    records::{ImportRecord, ImportedSlice},
};

const NAMES: &[&str] = &["web", "db", "api", "web-a"];

/// A valid export of an empty Service from `cluster`, with these (normalised) ports and
/// families: the input of the step tests of [`ports`] and [`families`].
pub(super) fn bare_export(
    cluster: &ClusterId,
    ports: Vec<ServicePort>,
    families: Vec<IpFamily>,
) -> exports::Export<'_> {
    static SERVICE: LazyLock<ServiceRecord> = LazyLock::new(ServiceRecord::default);
    static SPEC: LazyLock<ExportRecord> = LazyLock::new(ExportRecord::default);
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
                ImportRecord::from_k8s(
                    &import("demo", name).ips(&ips).build(),
                    &Interner::new(),
                    false,
                )
                .into_record()
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
            ClusterSnapshot::from_k8s(cluster(&format!("c{i}")), s, e, sl, &Interner::new())
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

    /// The services of a large batch are merged on every core, and the IPs and slice names
    /// then handed out in order: the result is the one-thread merge's.
    #[test]
    fn merging_on_every_core_gives_the_one_thread_merge((clusters, cfg, existing) in arb_case()) {
        let snaps = snapshots(&clusters);
        let merged = |parallel_from: usize| {
            let mut state = MergeState::new(cfg.clone(), cluster("c0"));
            state.set_parallel(parallel_from, 3);
            state.load(&snaps, &existing);
            state.output()
        };
        prop_assert_eq!(merged(0), merged(usize::MAX));
    }

    /// Every list of the plan is in its documented order: imports and slices by
    /// namespace/name, export statuses by cluster then service.
    #[test]
    fn plan_lists_are_sorted((clusters, cfg, existing) in arb_case()) {
        let snaps = snapshots(&clusters);
        let importing = cluster("c0");
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
            let (objects, _errors) = parse_documents(text, Path::new("fuzz.yaml"));
            snaps.push(snapshot(&format!("c{i}")).manifests(objects).build());
        }
        let importing = cluster("c0");
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
    let c1 = cluster("c1");
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

/// A slice defined twice, once without its Service label or with an address type that is not
/// IPv4/IPv6: the usable definition is merged, whichever comes first.
#[test]
fn a_broken_copy_of_a_slice_does_not_hide_the_good_one() {
    let c1 = cluster("c1");
    let good = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
        metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}\n\
        addressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints: [{addresses: [10.0.0.1]}]\n";
    let no_label = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
        metadata: {name: web-1, namespace: demo}\n\
        addressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints: [{addresses: [10.0.0.9]}]\n";
    let bad_type = good.replace("addressType: IPv4", "addressType: IPv5");
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\n\
        spec: {ports: [{name: http, port: 80}], ipFamilies: [IPv4]}\n---\n\
        apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceExport\n\
        metadata: {name: web, namespace: demo}\n";
    for broken in [no_label, bad_type.as_str()] {
        for pair in [[good, broken], [broken, good]] {
            let text = format!("{service}---\n{}---\n{}", pair[0], pair[1]);
            let snap = snapshot("c1").manifests(manifests(&text)).build();
            let plan = merge(&[snap], &ClusterSetConfig::default(), &c1, &[]);
            let addrs: Vec<String> = plan
                .endpoint_slices
                .iter()
                .flat_map(|s| s.endpoints.list().map(|e| e.addr.to_string()))
                .collect();
            assert_eq!(addrs, ["10.0.0.1"], "{pair:?}");
        }
    }
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
    let names: Vec<&str> = plan.endpoint_slices.iter().map(|s| &*s.name).collect();
    assert_eq!(names, vec!["web-a-c1-ipv4", "web-c1-ipv4"]);
    let imports: Vec<&str> = plan
        .service_imports
        .iter()
        .map(|s| &*s.service.name)
        .collect();
    assert_eq!(imports, vec!["web", "web-a"]);
}

mod incremental {
    //! The merge kept service by service ([`MergeState::update`]) against a full merge of the
    //! same final inputs.

    use super::*;
    use crate::merge::{MemberChange, MergeState};
    use crate::model::member::{LocalSlice, ServiceRecord};

    /// One member's objects, one per namespace/name, as an API server holds them.
    #[derive(Clone, Debug, Default)]
    struct Member {
        services: BTreeMap<String, Service>,
        exports: BTreeMap<String, ServiceExport>,
        slices: BTreeMap<String, EndpointSlice>,
    }

    fn name_of(meta: &ObjectMeta) -> String {
        meta.name.clone().unwrap_or_default()
    }

    /// One watch event in one member.
    #[derive(Clone, Debug)]
    #[allow(clippy::large_enum_variant)] // test data
    enum Event {
        Service(usize, Service),
        DeleteService(usize, usize),
        Export(usize, ServiceExport),
        DeleteExport(usize, usize),
        Slice(usize, EndpointSlice),
        /// The same slice name relabelled to another service: the slice moves.
        MoveSlice(usize, EndpointSlice),
        DeleteSlice(usize, usize),
        Withdraw(usize, bool),
        /// The hold of the nth held import ends.
        Release(usize),
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        let c = 0usize..3;
        prop_oneof![
            (c.clone(), arb_service()).prop_map(|(c, s)| Event::Service(c, s)),
            (c.clone(), any::<usize>()).prop_map(|(c, i)| Event::DeleteService(c, i)),
            (c.clone(), arb_export()).prop_map(|(c, e)| Event::Export(c, e)),
            (c.clone(), any::<usize>()).prop_map(|(c, i)| Event::DeleteExport(c, i)),
            (c.clone(), arb_slice()).prop_map(|(c, s)| Event::Slice(c, s)),
            (c.clone(), arb_slice()).prop_map(|(c, s)| Event::MoveSlice(c, s)),
            (c.clone(), any::<usize>()).prop_map(|(c, i)| Event::DeleteSlice(c, i)),
            (c, any::<bool>()).prop_map(|(c, w)| Event::Withdraw(c, w)),
            any::<usize>().prop_map(Event::Release),
        ]
    }

    /// Cluster ids that make slice names collide: service `web-a` of cluster `b` and
    /// service `web` of cluster `a-b` both want `web-a-b-ipv4`.
    fn cluster(i: usize) -> ClusterId {
        ClusterId::new(["a", "b", "a-b"][i % 3]).expect("id")
    }

    fn snapshots_of(members: &[Member], names: &Interner) -> Vec<ClusterSnapshot> {
        members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                ClusterSnapshot::from_k8s(
                    cluster(i),
                    &m.services.values().cloned().collect::<Vec<_>>(),
                    &m.exports.values().cloned().collect::<Vec<_>>(),
                    &m.slices.values().cloned().collect::<Vec<_>>(),
                    names,
                )
            })
            .collect()
    }

    fn nth_key<T>(map: &BTreeMap<String, T>, i: usize) -> Option<String> {
        map.keys().nth(i % map.len().max(1)).cloned()
    }

    fn id(namespace: &str, name: &str) -> NamespacedName {
        NamespacedName::new(namespace, name)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Any sequence of member events, each merged into only the services it touches
        /// (with the falls back to a full merge where the order of IPs or slice names
        /// matters), gives what a full merge of the final inputs gives, with the current
        /// imports as the existing ones: imports, their IPs and status, imported slices and
        /// their names, every export's conditions and the diagnostics.
        #[test]
        fn any_events_give_what_a_full_merge_of_the_final_state_gives(
            (clusters, cfg, existing) in arb_case(),
            events in prop::collection::vec(arb_event(), 1..16),
            on_every_core in any::<bool>(),
            holds in prop::collection::vec(any::<bool>(), 4),
        ) {
            let names = Interner::new();
            let mut members: Vec<Member> = (0..3).map(|_| Member::default()).collect();
            for (i, (services, exports, slices)) in clusters.iter().enumerate() {
                let m = &mut members[i];
                m.services.extend(services.iter().map(|s| (name_of(&s.metadata), s.clone())));
                m.exports.extend(exports.iter().map(|e| (name_of(&e.metadata), e.clone())));
                m.slices.extend(slices.iter().map(|s| (name_of(&s.metadata), s.clone())));
            }
            let c0 = cluster(0);
            let mut state = MergeState::new(cfg.clone(), c0.clone());
            // Updates of two services or more on threads too, where contention is an error.
            state.set_parallel(if on_every_core { 0 } else { usize::MAX }, 3);
            // Some existing imports held (as a controller holds those of members it has not
            // heard from), then released one by one or replaced by the merge's.
            let held: BTreeMap<NamespacedName, ImportRecord> = existing
                .iter()
                .zip(&holds)
                .filter(|(_, hold)| **hold)
                .map(|(i, _)| {
                    // As the controller holds them: with a status naming clusters, and a Ready
                    // message that may carry an earlier withdrawal note.
                    let mut i = i.clone();
                    i.status = Some(Box::new(crate::model::ServiceImportStatus {
                        clusters: (0..3)
                            .map(|c| crate::model::ClusterStatus { cluster: cluster(c).to_string() })
                            .collect(),
                        conditions: vec![{
                            let mut c = crate::merge::conditions::import_ready()
                                .to_k8s(crate::merge::conditions::epoch());
                            c.message.push_str(" Endpoints of cluster \"b\" are withdrawn: old.");
                            c
                        }],
                    }));
                    (i.service.clone(), i)
                })
                .collect();
            state.hold(held.values().cloned());
            state.load(&snapshots_of(&members, &names), &existing);
            let mut withdrawn = BTreeSet::new();

            for event in events {
                let mut dirty = BTreeSet::new();
                let change = match event {
                    Event::Service(c, s) => {
                        members[c].services.insert(name_of(&s.metadata), s.clone());
                        MemberChange::Service(cluster(c), Arc::new(ServiceRecord::from_k8s(&s, &names)))
                    }
                    Event::DeleteService(c, i) => {
                        let Some(k) = nth_key(&members[c].services, i) else { continue };
                        members[c].services.remove(&k);
                        MemberChange::ServiceDeleted(cluster(c), id("demo", &k))
                    }
                    Event::Export(c, e) => {
                        members[c].exports.insert(name_of(&e.metadata), e.clone());
                        MemberChange::Export(cluster(c), Arc::new(ExportRecord::from_k8s(&e, &names)))
                    }
                    Event::DeleteExport(c, i) => {
                        let Some(k) = nth_key(&members[c].exports, i) else { continue };
                        members[c].exports.remove(&k);
                        MemberChange::ExportDeleted(cluster(c), id("demo", &k))
                    }
                    Event::Slice(c, s) => {
                        members[c].slices.insert(name_of(&s.metadata), s.clone());
                        MemberChange::Slice(cluster(c), Arc::new(LocalSlice::from_k8s(&s, &names)))
                    }
                    Event::MoveSlice(c, mut s) => {
                        s.metadata.name = Some("moving".into());
                        members[c].slices.insert("moving".into(), s.clone());
                        MemberChange::Slice(cluster(c), Arc::new(LocalSlice::from_k8s(&s, &names)))
                    }
                    Event::DeleteSlice(c, i) => {
                        let Some(k) = nth_key(&members[c].slices, i) else { continue };
                        members[c].slices.remove(&k);
                        MemberChange::SliceDeleted(cluster(c), id("demo", &k))
                    }
                    Event::Withdraw(c, out) => {
                        if out { withdrawn.insert(cluster(c)); } else { withdrawn.remove(&cluster(c)); }
                        MemberChange::Withdrawn(cluster(c), out)
                    }
                    Event::Release(i) => {
                        let still: Vec<NamespacedName> =
                            state.held().map(|i| i.service.clone()).collect();
                        let Some(s) = still.get(i % still.len().max(1)) else { continue };
                        state.release(&BTreeSet::from([s.clone()]), &mut dirty);
                        state.update(&dirty);
                        continue;
                    }
                };
                state.apply(change, &mut dirty);
                state.update(&dirty);
            }

            let incremental = state.output();
            let mut full = MergeState::new(cfg, c0);
            full.hold(state.held().cloned());
            let mut ignored = BTreeSet::new();
            for c in &withdrawn {
                full.apply(MemberChange::Withdrawn(c.clone(), true), &mut ignored);
            }
            full.load(&snapshots_of(&members, &names), &incremental.service_imports);
            prop_assert_eq!(incremental, full.output());
        }
    }
}

/// Services with many ports (the API allows thousands) merge as ones with a few do: the union
/// with the oldest definition of each, per cluster slices carrying the ports that cluster
/// declares identically, at its local slices' numbers.
#[test]
fn many_ports_merge_as_a_few_do() {
    let member = |c: &str, created: &str, p7: i32, base: i32| {
        let names: Vec<String> = (1..=40).map(|n| format!("p{n}")).collect();
        let ports = (1..=40).map(|n| {
            let number = if n == 7 { p7 } else { n };
            Port::new(&names[n as usize - 1], "TCP", number)
        });
        let slice_ports = (1..=40).map(|n| Port::new(&names[n as usize - 1], "TCP", base + n));
        snapshot(c)
            .service(
                service("demo", "web")
                    .type_("ClusterIP")
                    .families(&["IPv4"])
                    .ports(ports)
                    .build(),
            )
            .export(export("demo", "web").created(created))
            .slice(
                local_slice("demo", &format!("web-{c}"), "web")
                    .ports(slice_ports)
                    .endpoint(crate::fixtures::endpoint(&format!("10.0.0.{}", base / 1000)).ready())
                    .build(),
            )
            .build()
    };
    // c2 declares p7 as 7007: it loses to c1's older p7 (7), so c2 does not serve p7.
    let snapshots = [
        member("c1", "2026-01-01T00:00:00Z", 7, 1000),
        member("c2", "2026-01-02T00:00:00Z", 7007, 2000),
    ];
    let plan = merge(
        &snapshots,
        &ClusterSetConfig::default(),
        &cluster("c1"),
        &[],
    );
    assert_eq!(plan.service_imports[0].ports.len(), 40);
    let table = crate::lb::build_records(&plan.service_imports, &plan.endpoint_slices);
    let backends = |port: u16| -> Vec<String> {
        let (_, f) = table
            .frontends
            .iter()
            .find(|(a, _)| a.port == port)
            .expect("a frontend");
        f.backends
            .iter()
            .map(|b| format!("{}/{}:{}", b.cluster, b.ip, b.port))
            .collect()
    };
    assert_eq!(backends(7), ["c1/10.0.0.1:1007"]);
    assert_eq!(backends(33), ["c1/10.0.0.1:1033", "c2/10.0.0.2:2033"]);
    assert!(
        plan.export_statuses
            .iter()
            .any(|s| s.conflict().is_some_and(|c| c.message.contains("7007"))),
        "{:?}",
        plan.export_statuses
    );
}
