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
        n.claim(ns, c.into(), &move || salt.clone(), owner, None)
            .expect("a full merge never meets contention")
    };
    let a = claim(&ns, "web-a-b-ipv4", "ns/web/a-b", &web);
    let b = claim(&ns, "web-a-b-ipv4", "ns/web-a/b", &web_a);
    assert_eq!(a, "web-a-b-ipv4");
    assert_ne!(a, b);
    assert!(b.starts_with("web-a-b-ipv4-"));
    // another namespace may reuse the name
    assert_eq!(claim(&other, "web-a-b-ipv4", "x", &web), "web-a-b-ipv4");
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
    // b holds the name; a, earlier in order and updated alone, would get it in a full merge.
    n.claim(&ns, "n".into(), &salt, &b, None).expect("free");
    let batch = BTreeSet::from([a.clone()]);
    assert!(n.claim(&ns, "n".into(), &salt, &a, Some(&batch)).is_err());
    // b, later in order, gets a hashed name while a holds it, and a's release is contended.
    let mut n = SliceNames::default();
    n.claim(&ns, "n".into(), &salt, &a, None).expect("free");
    let batch = BTreeSet::from([b.clone()]);
    let hashed = n
        .claim(&ns, "n".into(), &salt, &b, Some(&batch))
        .expect("in order");
    assert_ne!(hashed, "n");
}

/// A member exporting `service` with one ready IPv4 endpoint on port http.
fn exporting(cluster: &str, service: &str, names: &Interner) -> Vec<MemberChange> {
    fn yaml<T: serde::de::DeserializeOwned>(s: &str) -> T {
        serde_yaml::from_str(s).expect("yaml")
    }
    let c = ClusterId::new(cluster).expect("id");
    let svc: crate::model::Service = yaml(&format!(
        "metadata: {{name: {service}, namespace: ns}}\nspec: {{ipFamilies: [IPv4], ports: [{{name: http, port: 80}}]}}"
    ));
    let export: crate::model::ServiceExport =
        yaml(&format!("metadata: {{name: {service}, namespace: ns}}"));
    let slice: crate::model::EndpointSlice = yaml(&format!(
        "metadata: {{name: {service}-{cluster}, namespace: ns, labels: {{kubernetes.io/service-name: {service}}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.0.0.1]}}]"
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

/// A CIDR with room for one import: the first service in order has the IP; when it goes,
/// the service waiting for one gets it.
#[test]
fn a_full_cidr_serves_in_order_and_a_freed_ip_goes_to_the_waiting_service() {
    let names = Interner::new();
    let a = ClusterId::new("a").expect("id");
    let mut config = ClusterSetConfig::default();
    config.cidrs.ipv4 = "10.9.0.0/30".parse().expect("cidr");
    let mut state = MergeState::new(config, a);
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
    // Two usable addresses, three services: a and b have them.
    assert_eq!(with_ips(&state.output()), ["a", "b"]);
    let mut dirty = BTreeSet::new();
    state.apply(
        MemberChange::ExportDeleted(
            ClusterId::new("a").expect("id"),
            NamespacedName::new("ns", "a"),
        ),
        &mut dirty,
    );
    state.update(&dirty);
    assert_eq!(with_ips(&state.output()), ["b", "c"]);
}
