//! Unit tests of the incremental merge.

use super::*;
use crate::model::Interner;

#[test]
fn slice_names_are_unique_per_namespace_and_bounded() {
    let mut n = SliceNames::default();
    let (ns, other) = (Name::from("ns"), Name::from("other"));
    let (web, web_a) = (
        NamespacedName::new("ns", "web"),
        NamespacedName::new("ns", "web-a"),
    );
    let mut claim = |ns: &Name, c: &str, salt: &str, owner: &NamespacedName| {
        let salt = salt.to_owned();
        n.claim(ns, &Name::from(c), &move || salt.clone(), owner, None)
            .expect("a full merge never meets contention")
    };
    let a = claim(&ns, "web-a-b-ipv4", "ns/web/a-b", &web);
    let b = claim(&ns, "web-a-b-ipv4", "ns/web-a/b", &web_a);
    assert_eq!(&*a, "web-a-b-ipv4");
    assert_ne!(a, b);
    assert!(b.starts_with("web-a-b-ipv4-"));
    // another namespace may reuse the name
    assert_eq!(&*claim(&other, "web-a-b-ipv4", "x", &web), "web-a-b-ipv4");
    let long = claim(&ns, &"x".repeat(400), "salt", &web);
    assert!(long.len() <= slices::MAX_NAME);
    let again = claim(&ns, &"x".repeat(400), "salt", &web_a);
    assert!(again.len() <= slices::MAX_NAME && again != long);
}

#[test]
fn an_update_meets_contention_where_the_order_decides() {
    let mut n = SliceNames::default();
    let ns = Name::from("ns");
    let (a, b) = (
        NamespacedName::new("ns", "a"),
        NamespacedName::new("ns", "b"),
    );
    let salt = || "s".to_owned();
    let name = Name::from("n");
    // b holds the name; a, earlier in order and updated alone, would get it in a full merge.
    n.claim(&ns, &name, &salt, &b, None).expect("free");
    let batch = BTreeSet::from([a.clone()]);
    assert!(n.claim(&ns, &name, &salt, &a, Some(&batch)).is_err());
    // b, later in order, gets a hashed name while a holds it, and a's release is contended.
    let mut n = SliceNames::default();
    n.claim(&ns, &name, &salt, &a, None).expect("free");
    let batch = BTreeSet::from([b.clone()]);
    let hashed = n
        .claim(&ns, &name, &salt, &b, Some(&batch))
        .expect("in order");
    assert_ne!(&*hashed, "n");
}

/// A member exporting `service` with one ready IPv4 endpoint on port http.
fn exporting(cluster: &str, service: &str, names: &Interner) -> Vec<MemberChange> {
    exporting_at(cluster, service, &["10.0.0.1"], names)
}

/// A member exporting `service` with one ready IPv4 endpoint per address on port http.
fn exporting_at(
    cluster: &str,
    service: &str,
    addresses: &[&str],
    names: &Interner,
) -> Vec<MemberChange> {
    fn yaml<T: serde::de::DeserializeOwned>(s: &str) -> T {
        serde_yaml::from_str(s).expect("yaml")
    }
    let c = ClusterId::new(cluster).expect("id");
    let svc: crate::model::Service = yaml(&format!(
        "metadata: {{name: {service}, namespace: ns}}\nspec: {{ipFamilies: [IPv4], ports: [{{name: http, port: 80}}]}}"
    ));
    let export: crate::model::ServiceExport =
        yaml(&format!("metadata: {{name: {service}, namespace: ns}}"));
    let endpoints: Vec<String> = addresses
        .iter()
        .map(|a| format!("{{addresses: [\"{a}\"]}}"))
        .collect();
    let endpoints = endpoints.join(", ");
    let slice: crate::model::EndpointSlice = yaml(&format!(
        "metadata: {{name: {service}-{cluster}, namespace: ns, labels: {{kubernetes.io/service-name: {service}}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{endpoints}]"
    ));
    vec![
        MemberChange::Service(c.clone(), Arc::new(ServiceRecord::from_k8s(&svc, names))),
        MemberChange::Export(c.clone(), Arc::new(ExportRecord::from_k8s(&export, names))),
        MemberChange::Slice(c, Arc::new(LocalSlice::from_k8s(&slice, names))),
    ]
}

fn apply_all(state: &mut MergeState, changes: Vec<MemberChange>) {
    let mut dirty = BTreeSet::new();
    for change in changes {
        state.apply(change, &mut dirty);
    }
    state.update(&dirty);
}

/// What a full merge of the same inputs gives, the current imports kept.
fn full_of(state: &MergeState, changes: Vec<MemberChange>) -> MergeOutput {
    let mut full = MergeState::new(state.config.clone(), state.importing.clone());
    let mut dirty = BTreeSet::new();
    for change in changes {
        full.apply(change, &mut dirty);
    }
    let current: Vec<ImportRecord> = state.imports().cloned().collect();
    full.merge_everything(&sticky_ips(&current));
    full.output()
}

fn slice_names(out: &MergeOutput) -> Vec<(String, String)> {
    out.endpoint_slices
        .iter()
        .map(|s| (s.service.name.to_string(), s.name.to_string()))
        .collect()
}

/// On threads too, a contended slice name goes by service order: `webN` of cluster `a-b`
/// and `webN-a` of cluster `b` both want `webN-a-b-ipv4`, for 40 pairs (so the threads' runs
/// cut between them), and `webN` comes first.
#[test]
fn threads_hand_out_contended_slice_names_in_service_order() {
    let names = Interner::new();
    let changes: Vec<MemberChange> = (0..40)
        .flat_map(|i| {
            exporting("a-b", &format!("web{i}"), &names)
                .into_iter()
                .chain(exporting("b", &format!("web{i}-a"), &names))
        })
        .collect();
    let merged = |threads: usize| {
        let mut state = MergeState::new(
            ClusterSetConfig::default(),
            ClusterId::new("a").expect("id"),
        );
        state.set_parallel(0, threads);
        apply_all(&mut state, changes.clone());
        state.output()
    };
    let one_thread = merged(1);
    let got = slice_names(&one_thread);
    assert_eq!(got.len(), 80);
    for i in 0..40 {
        let plain = format!("web{i}-a-b-ipv4");
        let of = |service: String| {
            got.iter()
                .find(|(s, _)| *s == service)
                .map(|(_, n)| n.clone())
                .expect("a slice of every service")
        };
        assert_eq!(of(format!("web{i}")), plain);
        let hashed = of(format!("web{i}-a"));
        assert!(hashed.starts_with(&format!("{plain}-")), "{hashed}");
    }
    assert_eq!(merged(4), one_thread);
}

/// `web` of cluster `a-b` and `web-a` of cluster `b` both want the slice name
/// `web-a-b-ipv4`; `web` comes first in order and gets it, whichever arrived first, and
/// `web-a` gets it back when `web` goes away.
#[test]
fn a_contended_slice_name_goes_by_order_whatever_the_events() {
    let names = Interner::new();
    let a = ClusterId::new("a").expect("id");
    let mut state = MergeState::new(ClusterSetConfig::default(), a);
    apply_all(&mut state, exporting("b", "web-a", &names));
    assert_eq!(
        slice_names(&state.output()),
        [("web-a".to_owned(), "web-a-b-ipv4".to_owned())]
    );
    apply_all(&mut state, exporting("a-b", "web", &names));
    let both: Vec<MemberChange> = exporting("b", "web-a", &names)
        .into_iter()
        .chain(exporting("a-b", "web", &names))
        .collect();
    let out = state.output();
    assert_eq!(out, full_of(&state, both));
    let got = slice_names(&out);
    assert_eq!(
        got[0],
        ("web".to_owned(), "web-a-b-ipv4".to_owned()),
        "{got:?}"
    );
    assert_ne!(got[1].1, "web-a-b-ipv4", "{got:?}");

    let mut dirty = BTreeSet::new();
    let gone = NamespacedName::new("ns", "web");
    state.apply(
        MemberChange::ExportDeleted(ClusterId::new("a-b").expect("id"), gone),
        &mut dirty,
    );
    state.update(&dirty);
    assert_eq!(
        slice_names(&state.output()),
        [("web-a".to_owned(), "web-a-b-ipv4".to_owned())]
    );
}

/// A CIDR with room for two imports: the services exported first hold its addresses, and a
/// later one waits, also through a full merge (a restart or a relist, with the imports as
/// they are), even though it comes first in name order; when a service goes, the waiting
/// one gets its IP.
#[test]
fn a_full_cidr_keeps_its_holders_and_a_freed_ip_goes_to_the_waiting_service() {
    let names = Interner::new();
    let a = ClusterId::new("a").expect("id");
    let mut config = ClusterSetConfig::default();
    config.cidrs.ipv4 = "10.9.0.0/30".parse().expect("cidr");
    let mut state = MergeState::new(config.clone(), a.clone());
    for service in ["c", "b", "a"] {
        apply_all(&mut state, exporting("a", service, &names));
    }
    let with_ips = |out: &MergeOutput| -> Vec<String> {
        out.service_imports
            .iter()
            .filter(|i| !i.ips.is_empty())
            .map(|i| i.service.name.to_string())
            .collect()
    };
    // Two usable addresses, three services: c and b came first.
    let before = state.output();
    assert_eq!(with_ips(&before), ["b", "c"]);

    let mut restarted = MergeState::new(config, a);
    let mut snapshot = Vec::new();
    for service in ["a", "b", "c"] {
        snapshot.extend(exporting("a", service, &names));
    }
    let mut ignored = BTreeSet::new();
    for change in snapshot {
        restarted.apply(change, &mut ignored);
    }
    restarted.merge_all(&before.service_imports);
    assert_eq!(restarted.output(), before);

    let mut dirty = BTreeSet::new();
    state.apply(
        MemberChange::ExportDeleted(
            ClusterId::new("a").expect("id"),
            NamespacedName::new("ns", "b"),
        ),
        &mut dirty,
    );
    state.update(&dirty);
    assert_eq!(with_ips(&state.output()), ["a", "c"]);
}

/// (source cluster, addresses) of every imported slice.
fn imported(out: &MergeOutput) -> Vec<(String, Vec<String>)> {
    out.endpoint_slices
        .iter()
        .map(|s| {
            let addrs = s.endpoints.list().map(|e| e.addr.to_string());
            (s.cluster.to_string(), addrs.collect())
        })
        .collect()
}

/// The `EndpointsRefused` condition of `cluster`'s export of `ns/web`, as (reason, message).
fn refused_condition(out: &MergeOutput, cluster: &str) -> Option<(String, String)> {
    out.export_statuses
        .iter()
        .filter(|s| s.cluster.as_str() == cluster)
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == conditions::ConditionType::EndpointsRefused)
        .map(|c| {
            assert_eq!(c.status, conditions::ConditionStatus::True);
            (c.reason.to_string(), c.message.to_string())
        })
}

/// Loopback and metadata endpoints next to a good one: only the good one is imported, the
/// export of their cluster says which were refused and why (the other cluster's does not),
/// the diagnostics name their slice; once they are gone, so is the condition.
#[test]
fn refused_endpoints_are_left_out_and_reported_on_their_export() {
    let names = Interner::new();
    let a = ClusterId::new("a").expect("id");
    let mut state = MergeState::new(ClusterSetConfig::default(), a);
    let bad = ["10.0.0.1", "127.0.0.1", "169.254.169.254"];
    let changes: Vec<MemberChange> = exporting_at("a", "web", &bad, &names)
        .into_iter()
        .chain(exporting("b", "web", &names))
        .collect();
    apply_all(&mut state, changes.clone());
    let out = state.output();
    assert_eq!(out, full_of(&state, changes), "an update is a full merge");
    let good = vec![
        ("a".to_owned(), vec!["10.0.0.1".to_owned()]),
        ("b".to_owned(), vec!["10.0.0.1".to_owned()]),
    ];
    assert_eq!(imported(&out), good);
    let (reason, message) = refused_condition(&out, "a").expect("EndpointsRefused on a");
    assert_eq!(reason, "LoopbackAddress,LinkLocalAddress");
    for part in [
        "2 endpoint(s)",
        "endpoint 127.0.0.1 of EndpointSlice ns/web-a is a loopback address",
        "endpoint 169.254.169.254 of EndpointSlice ns/web-a is a link-local address",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    assert_eq!(refused_condition(&out, "b"), None);
    let refused: Vec<String> = out.diagnostics.iter().map(|d| d.to_string()).collect();
    assert_eq!(
        refused,
        [
            "cluster a: EndpointSlice ns/web-a: endpoint 127.0.0.1 is a loopback address; not imported",
            "cluster a: EndpointSlice ns/web-a: endpoint 169.254.169.254 is a link-local address; not imported",
        ]
    );
    let web = NamespacedName::new("ns", "web");
    assert_eq!(state.service(&web).map(|o| o.refused.len()), Some(2));

    apply_all(&mut state, exporting("a", "web", &names));
    let out = state.output();
    assert_eq!(imported(&out), good);
    assert_eq!(refused_condition(&out, "a"), None);
    assert!(out.diagnostics.is_empty(), "{:?}", out.diagnostics);
}

/// A member's allow list refuses its endpoints outside it, and only that member's.
#[test]
fn the_policy_given_is_the_one_applied() {
    let names = Interner::new();
    let mut state = MergeState::new(
        ClusterSetConfig::default(),
        ClusterId::new("a").expect("id"),
    );
    let mut policy = crate::policy::AddressPolicy::default();
    policy.allowed_by_cluster.insert(
        ClusterId::new("b").expect("id"),
        vec!["10.2.0.0/16".parse().expect("cidr")],
    );
    state.set_policy(policy);
    apply_all(&mut state, exporting_at("a", "web", &["10.0.0.1"], &names));
    apply_all(
        &mut state,
        exporting_at("b", "web", &["10.0.0.1", "10.2.0.1"], &names),
    );
    let out = state.output();
    assert_eq!(
        imported(&out),
        [
            ("a".to_owned(), vec!["10.0.0.1".to_owned()]),
            ("b".to_owned(), vec!["10.2.0.1".to_owned()]),
        ]
    );
    assert_eq!(
        refused_condition(&out, "b").map(|c| c.0).as_deref(),
        Some("NotAllowedForCluster")
    );
    assert_eq!(refused_condition(&out, "a"), None);
}

/// Whether `after` holds the very records of `before` (not equal copies).
fn assert_same_records(before: &ServiceOutput, after: &ServiceOutput) {
    assert!(Arc::ptr_eq(
        before.import.as_ref().expect("an import"),
        after.import.as_ref().expect("an import")
    ));
    assert_eq!(before.slices.len(), after.slices.len());
    assert!(
        before
            .slices
            .iter()
            .zip(&after.slices)
            .all(|(x, y)| Arc::ptr_eq(x, y))
    );
}

/// A re-merge that leaves a service's output as it was keeps the very records it handed out
/// (the standalone node holds them), in an incremental update and in a full merge.
#[test]
fn a_re_merge_that_changes_nothing_keeps_the_shared_records() {
    let names = Interner::default();
    let mut state = MergeState::new(ClusterSetConfig::default(), ClusterId::new("a").unwrap());
    apply_all(&mut state, exporting("a", "web", &names));
    apply_all(&mut state, exporting("b", "web", &names));
    let web = NamespacedName::new("ns", "web");
    let before = state.service(&web).expect("web").clone();
    assert_eq!(before.slices.len(), 2);

    // b's Service sent again, unchanged: the service is re-merged to the same output.
    apply_all(&mut state, exporting("b", "web", &names));
    assert_same_records(&before, state.service(&web).expect("web"));

    // A change to b's endpoints: a's slice is kept, b's is new.
    apply_all(&mut state, exporting_at("b", "web", &["10.0.0.9"], &names));
    let changed = state.service(&web).expect("web");
    let kept = |s: &SliceInput| before.slices.iter().any(|b| Arc::ptr_eq(b, s));
    assert_eq!(changed.slices.iter().filter(|s| kept(s)).count(), 1);

    // A full merge of the same inputs keeps them too.
    let before = state.service(&web).expect("web").clone();
    let existing = sticky_ips(&state.imports().cloned().collect::<Vec<_>>());
    state.merge_everything(&existing);
    assert_same_records(&before, state.service(&web).expect("web"));
}

/// Imported slices that declare the same ports share one port list, across clusters and
/// services and across updates, and a service's list of slices has no spare room (an
/// in-place collect from the records would have kept room for twelve times as many).
#[test]
fn slices_share_their_port_lists_and_a_service_holds_no_spare_room() {
    let names = Interner::default();
    let mut state = MergeState::new(ClusterSetConfig::default(), ClusterId::new("a").unwrap());
    for (cluster, service) in [("a", "web"), ("b", "web"), ("c", "web"), ("a", "api")] {
        apply_all(&mut state, exporting(cluster, service, &names));
    }
    let slices: Vec<&ImportedSlice> = ["web", "api"]
        .iter()
        .flat_map(|s| {
            state
                .service(&NamespacedName::new("ns", *s))
                .expect(s)
                .slices()
        })
        .collect();
    assert_eq!(slices.len(), 4);
    assert!(!slices[0].ports.is_empty());
    assert!(
        slices
            .iter()
            .all(|s| Arc::ptr_eq(&s.ports, &slices[0].ports))
    );
    let web = state.service(&NamespacedName::new("ns", "web")).unwrap();
    assert_eq!(web.slices.capacity(), web.slices.len());
}

/// A state that takes back another state's records (a reload) drops its own copies of their
/// port lists: nothing holds them any more.
#[test]
fn taking_back_the_replaced_states_records_frees_this_states_port_lists() {
    let names = Interner::default();
    let merged = |names: &Interner| {
        let mut state = MergeState::new(ClusterSetConfig::default(), ClusterId::new("a").unwrap());
        apply_all(&mut state, exporting("a", "web", names));
        apply_all(&mut state, exporting("b", "web", names));
        state
    };
    let old = merged(&names);
    let mut new = merged(&names);
    assert_eq!(new.port_lists.port_list_count(), 1);
    new.keep_unchanged_records_of(&old);
    let web = NamespacedName::new("ns", "web");
    assert_same_records(old.service(&web).unwrap(), new.service(&web).unwrap());
    assert_eq!(new.port_lists.port_list_count(), 0);
}

/// A slice id defined twice in one cluster, for two services: reported once, filed under one
/// service only (the smaller definition), and gone from every service when it is deleted.
#[test]
fn a_slice_id_given_twice_for_two_services_is_one_slice() {
    let names = Interner::new();
    let c = ClusterId::new("c1").expect("id");
    let mut snap = ClusterSnapshot::empty(c.clone());
    for change in exporting("c1", "web", &names)
        .into_iter()
        .chain(exporting("c1", "api", &names))
    {
        match change {
            MemberChange::Service(_, s) => snap.services.push(s),
            MemberChange::Export(_, e) => snap.service_exports.push(e),
            _ => {}
        }
    }
    for (service, ip) in [("web", "10.0.0.1"), ("api", "10.0.0.2")] {
        let slice: crate::model::EndpointSlice = serde_yaml::from_str(&format!(
            "metadata: {{name: shared, namespace: ns, labels: {{kubernetes.io/service-name: {service}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [\"{ip}\"]}}]"
        ))
        .expect("yaml");
        snap.endpoint_slices
            .push(Arc::new(LocalSlice::from_k8s(&slice, &names)));
    }
    let mut state = MergeState::new(ClusterSetConfig::default(), c.clone());
    state.load(&[snap], &[]);
    let duplicates: Vec<String> = state
        .diagnostics()
        .into_iter()
        .filter(|d| d.message == crate::merge::DUPLICATE)
        .map(|d| d.object)
        .collect();
    assert_eq!(duplicates, ["EndpointSlice ns/shared"]);
    let imported = state.output().endpoint_slices;
    assert_eq!(imported.len(), 1, "{imported:?}");
    let mut dirty = BTreeSet::new();
    state.apply(
        MemberChange::SliceDeleted(c, NamespacedName::new("ns", "shared")),
        &mut dirty,
    );
    state.update(&dirty);
    assert_eq!(state.output().endpoint_slices, []);
}

/// A controller that never heard from member `b` holds `b`'s import of `app`: through a full
/// merge and updates it keeps its IP, which no other service gets (the CIDR has room for one
/// more import: `api` gets it, `new` waits); its slices are not held. When `b` exports `app`,
/// the merge's import takes the same IP and is what is held from then on; when it stops, the
/// import stays; a released hold whose service nobody exports ends the import and frees the
/// IP.
#[test]
fn a_held_import_keeps_its_ip_until_its_member_is_back() {
    let names = Interner::new();
    let mut config = ClusterSetConfig::default();
    config.cidrs.ipv4 = "10.9.0.0/30".parse().expect("cidr");
    let mut state = MergeState::new(config, ClusterId::new("a").expect("id"));
    let app = NamespacedName::new("ns", "app");
    let held = |ip: &str| {
        ImportRecord::from_k8s(
            &crate::fixtures::import("ns", "app").ips([ip]).build(),
            &names,
            true,
        )
        .into_record()
        .expect("an import")
    };
    state.hold([held("10.9.0.2")]);
    let a_exports = |service| exporting("a", service, &names);
    let mut snapshot = Vec::new();
    snapshot.extend(a_exports("api"));
    snapshot.extend(a_exports("new"));
    let mut dirty = BTreeSet::new();
    for change in snapshot {
        state.apply(change, &mut dirty);
    }
    state.merge_all(&[held("10.9.0.2")]);
    let ips = |state: &MergeState| -> Vec<(String, Vec<String>)> {
        state
            .output()
            .service_imports
            .iter()
            .map(|i| {
                let ips = i.ips.iter().map(ToString::to_string).collect();
                (i.service.name.to_string(), ips)
            })
            .collect()
    };
    let expected = vec![
        ("api".to_owned(), vec!["10.9.0.1".to_owned()]),
        ("app".to_owned(), vec!["10.9.0.2".to_owned()]),
        ("new".to_owned(), vec![]),
    ];
    assert_eq!(ips(&state), expected);
    assert!(state.service(&app).is_some_and(|o| o.slices.is_empty()));
    // An update of another service leaves the reservation as it is.
    apply_all(&mut state, exporting_at("a", "new", &["10.0.0.9"], &names));
    assert_eq!(ips(&state), expected);

    // b exports app: the merge's import, with the held IP, and b's endpoints; it is also
    // what is held now.
    apply_all(&mut state, exporting("b", "app", &names));
    assert_eq!(ips(&state), expected);
    assert_eq!(state.service(&app).map(|o| o.slices.len()), Some(1));
    let merged = state.service(&app).and_then(|o| o.import()).cloned();
    assert_eq!(
        state.held().next(),
        merged.as_ref(),
        "the hold follows the merge"
    );

    // b stops exporting app while the hold lasts: app keeps its last import and IP, through
    // updates and a full merge; released, the import goes and new gets the IP.
    let mut dirty = BTreeSet::new();
    state.apply(
        MemberChange::ExportDeleted(ClusterId::new("b").expect("id"), app.clone()),
        &mut dirty,
    );
    state.update(&dirty);
    assert_eq!(ips(&state), expected, "held after the export went");
    assert!(state.service(&app).is_some_and(|o| o.slices.is_empty()));
    let current: Vec<ImportRecord> = state.imports().cloned().collect();
    state.merge_all(&current);
    assert_eq!(ips(&state), expected, "held through a full merge");
    let mut dirty = BTreeSet::new();
    state.release(&BTreeSet::from([app.clone()]), &mut dirty);
    state.update(&dirty);
    let freed = vec![
        ("api".to_owned(), vec!["10.9.0.1".to_owned()]),
        ("new".to_owned(), vec!["10.9.0.2".to_owned()]),
    ];
    assert_eq!(ips(&state), freed);
}
