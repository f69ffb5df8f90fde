//! Unit tests of the controller's decisions.

use super::*;
use crate::fixtures::{cluster, endpoint, export, labels, local_slice, service, snapshot};
use crate::model::{FIELD_MANAGER, ObjectMeta};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::json;

fn meta(labels: &[(&str, &str)], owned: &[&str]) -> ObjectMeta {
    let fields: serde_json::Map<String, serde_json::Value> = owned
        .iter()
        .map(|k| (format!("f:{k}"), json!({})))
        .collect();
    ObjectMeta {
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        managed_fields: Some(vec![
            ManagedFieldsEntry {
                manager: Some(FIELD_MANAGER.into()),
                operation: Some("Apply".into()),
                fields_v1: Some(FieldsV1(json!({"f:metadata": {"f:labels": fields}}))),
                ..Default::default()
            },
            // Another manager's labels never count as ours.
            ManagedFieldsEntry {
                manager: Some("kubectl".into()),
                operation: Some("Apply".into()),
                fields_v1: Some(FieldsV1(
                    json!({"f:metadata": {"f:labels": {"f:team": {}}}}),
                )),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

#[test]
fn labels_agree_unless_ours_are_missing_or_stale() {
    let observed = meta(&[("a", "1"), ("team", "x")], &["a"]);
    let labels_of = |m: &ObjectMeta| OwnedMap::of(m, "labels", &Interner::new());
    let observed = labels_of(&observed);
    // Someone else's label is left alone.
    assert!(observed.agrees(&labels(&[("a", "1")])));
    // A changed or a new desired label needs a write.
    assert!(!observed.agrees(&labels(&[("a", "2")])));
    assert!(!observed.agrees(&labels(&[("a", "1"), ("b", "1")])));
    // A label we applied and no longer want needs a write (the apply removes it).
    assert!(!observed.agrees(&labels(&[])));
}

#[test]
fn transition_times_move_only_with_the_status() {
    let at = |s: &str| Time(s.parse().expect("time"));
    let cond = |t: &str, status: &str, when: &str| Condition {
        type_: t.into(),
        status: status.into(),
        reason: "R".into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: at(when),
    };
    let observed = [
        cond("Valid", "True", "2026-01-01T00:00:00Z"),
        cond("Conflict", "False", "2026-01-01T00:00:00Z"),
    ];
    let desired = [
        cond("Valid", "True", "1970-01-01T00:00:00Z"),
        cond("Conflict", "True", "1970-01-01T00:00:00Z"),
        cond("Ready", "True", "1970-01-01T00:00:00Z"),
    ];
    let now = at("2026-02-02T00:00:00Z");
    let got = with_transition_times(&desired, &observed, &now);
    let times: Vec<_> = got.iter().map(|c| c.last_transition_time.clone()).collect();
    assert_eq!(times, [at("2026-01-01T00:00:00Z"), now.clone(), now]);
}

#[test]
fn withdrawn_members_keep_their_exports_but_lose_their_endpoints() {
    let member = |id: &str, ip: &str| {
        snapshot(id)
            .service(
                service("demo", "web")
                    .families(&["IPv4"])
                    .port(("http", 80)),
            )
            .export(export("demo", "web"))
            .slice(
                local_slice("demo", "web-x", "web")
                    .endpoint(endpoint(ip))
                    .port(("http", 8080)),
            )
            .build()
    };
    let snapshots = [member("east", "10.1.0.1"), member("west", "10.2.0.1")];
    let east = cluster("east");
    let withdrawn = BTreeSet::from([cluster("west")]);
    let p = desired(
        &snapshots,
        &ClusterSetConfig::default(),
        &east,
        &[],
        &withdrawn,
        Duration::from_secs(300),
    );
    let sources: Vec<&str> = p
        .endpoint_slices
        .iter()
        .map(|s| s.cluster.as_str())
        .collect();
    assert_eq!(sources, ["east"]);
    let status = p.service_imports[0].status.as_ref().expect("status");
    assert_eq!(status.clusters.len(), 2, "west still exports");
    let ready = &status.conditions[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );
    assert!(
        ready
            .message
            .contains("Endpoints of cluster \"west\" are withdrawn")
            && ready.message.contains("300s"),
        "{}",
        ready.message
    );
}

#[test]
fn a_relist_older_than_what_is_known_takes_nothing_back() {
    use crate::fixtures::imported_slice;
    let names = crate::model::Interner::new();
    let slice = |name: &str, ip: &str, rv: u64| {
        let mut s = imported_slice("demo", name, "web", "west")
            .label(crate::model::LABEL_MANAGED_BY, crate::model::MANAGED_BY)
            .endpoints([endpoint(ip).ready()])
            .build();
        s.metadata.resource_version = Some(rv.to_string());
        ObservedSlice::from_k8s(&s, &names)
    };
    let rv_of = |index: &ObservedIndex, name: &str| {
        let service = NamespacedName::new("demo", "web");
        index
            .service(&service)
            .slices
            .iter()
            .find(|s| &*s.id.name == name)
            .map(|s| s.resource_version)
    };
    let mut index = ObservedIndex::default();
    index.replace_slices(vec![slice("a", "10.0.0.1", 5), slice("b", "10.0.0.2", 5)]);
    // Our write's answer (rv 7), then a re-list that started before it (rv 5): kept.
    index.put_slice(slice("a", "10.0.0.9", 7));
    let changed = index.replace_slices(vec![slice("a", "10.0.0.1", 5), slice("b", "10.0.0.2", 5)]);
    assert_eq!(rv_of(&index, "a"), Some(7));
    assert!(changed.is_empty(), "{changed:?}");
    // Deleted at rv 9 after a list at rv 5: the list does not bring it back, and the tombstone
    // stays for stale events; a newer version is filed.
    index.delete(ObservedKind::Slice, &NamespacedName::new("demo", "b"), 9);
    index.replace_slices(vec![slice("a", "10.0.0.9", 7), slice("b", "10.0.0.2", 5)]);
    assert_eq!(rv_of(&index, "b"), None);
    assert!(index.put_slice(slice("b", "10.0.0.2", 8)).is_empty());
    assert_eq!(rv_of(&index, "b"), None);
    index.replace_slices(vec![slice("a", "10.0.0.9", 7), slice("b", "10.0.0.3", 10)]);
    assert_eq!(rv_of(&index, "b"), Some(10));
    // A newer list wins, and what it lacks is gone.
    index.replace_slices(vec![slice("a", "10.0.0.4", 11)]);
    assert_eq!(rv_of(&index, "a"), Some(11));
    assert_eq!(rv_of(&index, "b"), None);
    // Our write's answer, then the watch's echo of the same version: the echo changes
    // nothing, so it marks no service to compare again.
    let web = NamespacedName::new("demo", "web");
    assert!(index.put_slice(slice("a", "10.0.0.5", 12)).contains(&web));
    assert!(index.put_slice(slice("a", "10.0.0.5", 12)).is_empty());
    assert!(index.put_slice(slice("a", "10.0.0.5", 13)).contains(&web));
    assert_eq!(rv_of(&index, "a"), Some(13));
}

#[test]
fn a_uid_reads_back_as_the_text_it_came_as() {
    let meta = |uid: &str| ObjectMeta {
        uid: Some(uid.to_owned()),
        ..ObjectMeta::default()
    };
    // The API server's form is held as 16 bytes; other spellings of a UUID and other text
    // are kept as they came, since a delete's precondition compares the strings.
    for (text, compact) in [
        ("0c9e1a6e-5b7f-4d2a-9a51-3f2d8e6b7c10", true),
        ("0C9E1A6E-5B7F-4D2A-9A51-3F2D8E6B7C10", false),
        ("0c9e1a6e5b7f4d2a9a513f2d8e6b7c10", false),
        ("not-a-uuid", false),
    ] {
        let uid = Uid::of(&meta(text)).unwrap();
        assert_eq!(uid.to_string(), text);
        assert_eq!(matches!(uid, Uid::Uuid(_)), compact, "{text}");
    }
    assert_eq!(Uid::of(&ObjectMeta::default()), None);
}

#[test]
fn an_observed_condition_reads_back_as_the_api_had_it() {
    let names = Interner::new();
    let condition = Condition {
        type_: "Conflict".into(),
        status: "True".into(),
        reason: "PortConflict".into(),
        message: "ports differ".into(),
        last_transition_time: Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
        ),
        observed_generation: Some(3),
    };
    let se = ServiceExport {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("demo".into()),
            ..ObjectMeta::default()
        },
        spec: Default::default(),
        status: Some(crate::model::ServiceExportStatus {
            conditions: vec![condition.clone()],
        }),
    };
    let observed = ObservedExport::from_k8s(&se, &names);
    let back: Vec<Condition> = observed.conditions.iter().map(|c| c.to_k8s()).collect();
    assert_eq!(back, vec![condition]);
}

/// The oldest cluster moves its `http` port from 80 to 81; the other still declares 80, loses
/// the port and its slice. Replaying the controller's writes one at a time, as a node watching
/// the cluster sees them, port 81 never reaches the cluster that does not declare it: the
/// slices go before the import.
#[test]
fn a_port_never_reaches_a_cluster_that_dropped_it_at_any_step_of_the_writes() {
    let snap = |c: &str, port: i32, created: i64, ip: &str| {
        snapshot(c)
            .service(
                service("demo", "web")
                    .families(&["IPv4"])
                    .port(("http", "TCP", port)),
            )
            .export(export("demo", "web").created_at(created))
            .slice(
                local_slice("demo", &format!("web-{c}"), "web")
                    .address_type("IPv4")
                    .port(("http", "TCP", 8080))
                    .endpoint(endpoint(ip).ready()),
            )
            .build()
    };
    let (c1, config) = (cluster("c1"), crate::merge::ClusterSetConfig::default());
    let before = crate::merge::merge(
        &[
            snap("c1", 80, 1_700_000_000, "10.1.0.1"),
            snap("c2", 80, 1_700_000_100, "10.2.0.1"),
        ],
        &config,
        &c1,
        &[],
    );
    let after = crate::merge::merge(
        &[
            snap("c1", 81, 1_700_000_000, "10.1.0.1"),
            snap("c2", 80, 1_700_000_100, "10.2.0.1"),
        ],
        &config,
        &c1,
        &before.service_imports,
    );
    let imports: Vec<ServiceImport> = before.service_imports.iter().map(|i| i.to_k8s()).collect();
    let slices: Vec<EndpointSlice> = before.endpoint_slices.iter().map(|s| s.to_k8s()).collect();
    let now = crate::merge::conditions::epoch();
    // The controller's own writes for the service, and those of a whole-cluster reconcile.
    let names = Interner::new();
    let observed_import = ObservedImport::from_k8s(&imports[0], &names).expect("ours");
    let observed_slices: Vec<Arc<ObservedSlice>> = slices
        .iter()
        .map(|s| Arc::new(ObservedSlice::from_k8s(s, &names)))
        .collect();
    let desired_slices: Vec<SliceInput> = after
        .endpoint_slices
        .iter()
        .map(|s| record_input(s.clone()))
        .collect();
    let of_service = reconcile_service(
        &NamespacedName::new("demo", "web"),
        DesiredService {
            import: after.service_imports.first(),
            slices: &desired_slices,
            local_export: None,
        },
        ObservedService {
            import: Some(&observed_import),
            slices: &observed_slices,
            export: None,
        },
        &now,
    );
    let observed = Observed {
        imports: imports.iter().cloned().map(Arc::new).collect(),
        slices: slices.iter().cloned().map(Arc::new).collect(),
        exports: vec![],
    };
    let whole = reconcile(&after, &c1, &observed, &now);
    for actions in [of_service, whole] {
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::DeleteSlice { .. })),
            "{actions:?}"
        );
        // A failed deletion is retried with its service's schedule, no other's.
        for a in actions
            .iter()
            .filter(|a| matches!(a, Action::DeleteSlice { .. }))
        {
            assert_eq!(
                a.service(),
                Some(NamespacedName::new("demo", "web")),
                "{a:?}"
            );
        }
        replay(&actions, imports.clone(), slices.clone());
    }
}

/// Applies `actions` one at a time to `imports` and `slices`, and checks after each that the
/// lb table routes port 81 to cluster c1 only.
fn replay(actions: &[Action], mut imports: Vec<ServiceImport>, mut slices: Vec<EndpointSlice>) {
    for (step, action) in actions.iter().enumerate() {
        match action {
            Action::ApplyImport(si) => imports = vec![si.clone()],
            Action::ApplySlice(s) => {
                slices.retain(|o| o.metadata.name != s.metadata.name);
                slices.push(s.clone());
            }
            Action::DeleteSlice { slice, .. } => {
                slices.retain(|o| o.metadata.name.as_deref() != Some(&*slice.name))
            }
            _ => {}
        }
        for (addr, fe) in &crate::lb::build(&imports, &slices).frontends {
            let clusters: Vec<&str> = fe.backends.iter().map(|b| b.cluster.as_str()).collect();
            assert!(
                addr.port != 81 || clusters.iter().all(|c| *c == "c1"),
                "after write {step} ({}): {addr} reaches {clusters:?}",
                action.label().0
            );
        }
    }
}
