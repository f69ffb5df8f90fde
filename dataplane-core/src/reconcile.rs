//! The controller's pure core (ARCHITECTURE.md §3): from the members' snapshots to the writes
//! that make the local cluster agree with the merge. No I/O: the agent's controller role
//! watches, calls these, and applies the [`Action`]s.
//!
//! - [`desired`]: the merge for the local cluster, with the endpoints of members that have
//!   been unreachable past the grace period withdrawn (and said so in the import's `Ready`
//!   message);
//! - [`reconcile`]: the merge output and the observed objects to the [`Action`]s that make
//!   them agree, and nothing when they already do.
//!
//! What "agree" means, per object (the controller is the only writer of these fields):
//! - ServiceImport: labels and annotations include the desired ones, and those this field
//!   manager applied earlier (from `managedFields`) are all still desired; `spec` is equal;
//!   `status` (clusters, conditions) is equal;
//! - imported EndpointSlice: labels as above; `addressType`, `endpoints`, `ports` equal;
//! - ServiceExport: its `Valid`, `Ready` and `Conflict` conditions equal the desired ones
//!   (conditions of other types belong to others and are left alone).
//!
//! A condition keeps its `lastTransitionTime` while its status stays the same. Only imports
//! and slices carrying our managed-by label are ever deleted.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::{
    merge::{
        ClusterSetConfig, ClusterSnapshot, MemberChange, MergeOutput, MergeState,
        conditions::{ConditionStatus, ConditionType},
    },
    model::{
        ClusterId, Condition, EndpointSlice, FIELD_MANAGER, LABEL_APP_MANAGED_BY, MANAGED_BY,
        NamespacedName, ObjectMeta, ServiceExport, ServiceImport, ServiceImportStatus,
        records::ImportRecord, resource_version,
    },
};

/// One write the controller wants.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create or update a ServiceImport's labels, annotations and spec (its status is ignored).
    ApplyImport(ServiceImport),
    /// Set a ServiceImport's status.
    ApplyImportStatus(ServiceImport),
    /// Create or update an imported EndpointSlice.
    ApplySlice(EndpointSlice),
    /// Set the `Valid`/`Ready`/`Conflict` conditions of a local ServiceExport.
    ApplyExportStatus {
        /// The ServiceExport's namespace/name.
        service: NamespacedName,
        /// Its `Valid`, `Ready` and `Conflict` conditions, transition times included.
        conditions: Vec<Condition>,
    },
    /// Delete a ServiceImport of ours that the merge no longer has.
    DeleteImport {
        /// The import's namespace/name.
        service: NamespacedName,
        /// The observed uid: the delete's precondition, so a re-created object is left alone.
        uid: Option<String>,
        /// The observed resourceVersion: the deletion's watch event comes after it.
        resource_version: u64,
    },
    /// Delete an imported EndpointSlice of ours that the merge no longer has.
    DeleteSlice {
        /// The slice's namespace/name.
        slice: NamespacedName,
        /// The observed uid: the delete's precondition, so a re-created object is left alone.
        uid: Option<String>,
        /// The observed resourceVersion: the deletion's watch event comes after it.
        resource_version: u64,
    },
    /// An Event on a ServiceExport: a conflict appeared (`Warning`) or cleared (`Normal`).
    Event {
        /// The ServiceExport's namespace/name.
        export: NamespacedName,
        /// Its uid, for the Event's reference to it.
        uid: Option<String>,
        /// `Warning` when a conflict appeared, `Normal` when it cleared.
        warning: bool,
        /// [`EVENT_CONFLICT`] or [`EVENT_RESOLVED`].
        reason: String,
        /// The conflict's reason and message, or which conflict cleared.
        note: String,
    },
}

impl Action {
    /// (kind, op) for metrics and logs.
    pub fn label(&self) -> (&'static str, &'static str) {
        match self {
            Action::ApplyImport(_) => ("ServiceImport", "apply"),
            Action::ApplyImportStatus(_) => ("ServiceImport", "apply_status"),
            Action::ApplySlice(_) => ("EndpointSlice", "apply"),
            Action::ApplyExportStatus { .. } => ("ServiceExport", "apply_status"),
            Action::DeleteImport { .. } => ("ServiceImport", "delete"),
            Action::DeleteSlice { .. } => ("EndpointSlice", "delete"),
            Action::Event { .. } => ("Event", "create"),
        }
    }

    /// The object written, as `namespace/name`.
    pub fn object(&self) -> String {
        match self {
            Action::ApplyImport(o) | Action::ApplyImportStatus(o) => {
                NamespacedName::of(&o.metadata).to_string()
            }
            Action::ApplySlice(o) => NamespacedName::of(&o.metadata).to_string(),
            Action::ApplyExportStatus { service, .. } | Action::DeleteImport { service, .. } => {
                service.to_string()
            }
            Action::DeleteSlice { slice, .. } => slice.to_string(),
            Action::Event { export, .. } => export.to_string(),
        }
    }
}

/// The condition types the controller owns on ServiceExports.
pub const EXPORT_CONDITION_TYPES: [&str; 3] = ["Valid", "Ready", "Conflict"];
/// Event reason when a conflict appears on a ServiceExport.
pub const EVENT_CONFLICT: &str = "ConflictDetected";
/// Event reason when a conflict clears.
pub const EVENT_RESOLVED: &str = "ConflictResolved";

/// The objects the controller compares against, as the local cluster has them.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// ServiceImports with our managed-by label.
    pub imports: Vec<Arc<ServiceImport>>,
    /// Imported EndpointSlices with our managed-by label.
    pub slices: Vec<Arc<EndpointSlice>>,
    /// The local cluster's ServiceExports.
    pub exports: Vec<Arc<ServiceExport>>,
}

/// What the merge for `local` wants. Members in `withdrawn` keep their Services and ServiceExports (so the
/// import's ports and conditions stay as they were) but contribute no endpoints, and the
/// `Ready` message of every import they export says so.
pub fn desired(
    snapshots: &[ClusterSnapshot],
    config: &ClusterSetConfig,
    local: &ClusterId,
    existing: &[ImportRecord],
    withdrawn: &BTreeSet<ClusterId>,
    grace: Duration,
) -> MergeOutput {
    let mut state = MergeState::new(config.clone(), local.clone());
    state.set_grace(grace);
    let mut ignored = BTreeSet::new();
    for cluster in withdrawn {
        state.apply(MemberChange::Withdrawn(cluster.clone(), true), &mut ignored);
    }
    state.load(snapshots, existing);
    state.output()
}

fn key(meta: &ObjectMeta) -> NamespacedName {
    NamespacedName::of(meta)
}

/// The label or annotation keys this field manager applied, from `managedFields`.
fn owned_keys(meta: &ObjectMeta, field: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in meta.managed_fields.iter().flatten() {
        let ours = entry.manager.as_deref() == Some(FIELD_MANAGER)
            && entry.operation.as_deref() == Some("Apply")
            && entry.subresource.as_deref().is_none_or(str::is_empty);
        let Some(fields) = entry.fields_v1.as_ref().filter(|_| ours) else {
            continue;
        };
        if let Some(map) = fields
            .0
            .pointer(&format!("/f:metadata/f:{field}"))
            .and_then(|v| v.as_object())
        {
            out.extend(
                map.keys()
                    .filter_map(|k| k.strip_prefix("f:"))
                    .map(str::to_owned),
            );
        }
    }
    out
}

/// Whether `observed` has every desired key/value and none that we applied but no longer want.
fn map_agrees(
    desired: Option<&BTreeMap<String, String>>,
    observed: &ObjectMeta,
    field: &str,
) -> bool {
    let empty = BTreeMap::new();
    let desired = desired.unwrap_or(&empty);
    let got = match field {
        "labels" => observed.labels.as_ref(),
        _ => observed.annotations.as_ref(),
    }
    .unwrap_or(&empty);
    desired.iter().all(|(k, v)| got.get(k) == Some(v))
        && owned_keys(observed, field)
            .iter()
            .all(|k| desired.contains_key(k))
}

/// `desired` with each condition's `lastTransitionTime` taken from `observed` when a condition
/// of the same type has the same status there, else `now`.
pub fn with_transition_times(
    desired: &[Condition],
    observed: &[Condition],
    now: &Time,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let ltt = observed
                .iter()
                .find(|o| o.type_ == d.type_ && o.status == d.status)
                .map_or_else(|| now.clone(), |o| o.last_transition_time.clone());
            Condition {
                last_transition_time: ltt,
                ..d.clone()
            }
        })
        .collect()
}

fn sorted(conditions: &[Condition]) -> Vec<&Condition> {
    let mut v: Vec<&Condition> = conditions.iter().collect();
    v.sort_by(|a, b| a.type_.cmp(&b.type_));
    v
}

fn conflict_true(conditions: &[Condition]) -> Option<&Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == "Conflict" && c.status == "True")
}

/// The actions that make the local cluster agree with `plan` (see the module documentation).
/// `now` is the `lastTransitionTime` of conditions that change status.
///
/// Order: imports, their status, slices, slice deletions, import deletions, then each
/// export's status followed by its Event if a conflict appeared or cleared.
///
/// ```
/// use std::sync::Arc;
///
/// use dataplane_core::merge::{MergeOutput, conditions::epoch};
/// use dataplane_core::model::{ClusterId, Interner, ServiceImport, records::ImportRecord};
/// use dataplane_core::reconcile::{Action, Observed, reconcile};
///
/// let local = ClusterId::new("c1").unwrap();
/// let mut plan = MergeOutput::default();
/// let web: ServiceImport = serde_yaml::from_str(
///     "metadata: {name: web, namespace: demo}
/// spec: {type: ClusterSetIP, ports: [{port: 80}]}",
/// )
/// .unwrap();
/// let record = ImportRecord::from_k8s(&web, &Interner::new(), true).record.unwrap();
/// plan.service_imports.push(record);
///
/// // Nothing observed yet: the import is applied, then its status.
/// let actions = reconcile(&plan, &local, &Observed::default(), &epoch());
/// let [Action::ApplyImport(_), Action::ApplyImportStatus(written)] = &actions[..] else {
///     panic!("{actions:?}");
/// };
///
/// // Once the cluster has what was written, there is nothing left to do.
/// let observed = Observed {
///     imports: vec![Arc::new(written.clone())],
///     ..Observed::default()
/// };
/// assert!(reconcile(&plan, &local, &observed, &epoch()).is_empty());
/// ```
pub fn reconcile(
    plan: &MergeOutput,
    local: &ClusterId,
    observed: &Observed,
    now: &Time,
) -> Vec<Action> {
    let mut imports = Vec::new();
    let mut statuses = Vec::new();
    let observed_imports: HashMap<NamespacedName, &ServiceImport> = observed
        .imports
        .iter()
        .map(|o| (key(&o.metadata), o.as_ref()))
        .collect();
    let mut wanted = HashSet::new();
    for si in &plan.service_imports {
        let id = si.service.clone();
        wanted.insert(id.clone());
        let mut desired = si.to_k8s();
        desired
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(LABEL_APP_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
        let current = observed_imports.get(&id).copied();
        let main_agrees = current.is_some_and(|o| {
            o.spec == desired.spec
                && map_agrees(desired.metadata.labels.as_ref(), &o.metadata, "labels")
                && map_agrees(
                    desired.metadata.annotations.as_ref(),
                    &o.metadata,
                    "annotations",
                )
        });
        let observed_status = current.and_then(|o| o.status.clone()).unwrap_or_default();
        let want_status = desired.status.clone().unwrap_or_default();
        let status = ServiceImportStatus {
            clusters: want_status.clusters,
            conditions: with_transition_times(
                &want_status.conditions,
                &observed_status.conditions,
                now,
            ),
        };
        let status_agrees = current.is_some()
            && observed_status.clusters == status.clusters
            && sorted(&observed_status.conditions) == sorted(&status.conditions);
        desired.status = Some(status);
        if !main_agrees {
            imports.push(Action::ApplyImport(desired.clone()));
        }
        if !status_agrees {
            statuses.push(Action::ApplyImportStatus(desired));
        }
    }

    let mut slices = Vec::new();
    let observed_slices: HashMap<NamespacedName, &EndpointSlice> = observed
        .slices
        .iter()
        .map(|o| (key(&o.metadata), o.as_ref()))
        .collect();
    let mut wanted_slices = HashSet::new();
    for s in &plan.endpoint_slices {
        let s = &s.to_k8s();
        let id = key(&s.metadata);
        wanted_slices.insert(id.clone());
        let agrees = observed_slices.get(&id).is_some_and(|o| {
            o.address_type == s.address_type
                && o.endpoints == s.endpoints
                && o.ports == s.ports
                && map_agrees(s.metadata.labels.as_ref(), &o.metadata, "labels")
        });
        if !agrees {
            slices.push(Action::ApplySlice(s.clone()));
        }
    }
    let mut slice_deletes: Vec<Action> = observed_slices
        .iter()
        .filter(|(id, _)| !wanted_slices.contains(*id))
        .map(|(id, o)| Action::DeleteSlice {
            slice: id.clone(),
            uid: o.metadata.uid.clone(),
            resource_version: resource_version(&o.metadata),
        })
        .collect();
    slice_deletes.sort_by_key(Action::object);
    let mut import_deletes: Vec<Action> = observed_imports
        .iter()
        .filter(|(id, _)| !wanted.contains(*id))
        .map(|(id, o)| Action::DeleteImport {
            service: id.clone(),
            uid: o.metadata.uid.clone(),
            resource_version: resource_version(&o.metadata),
        })
        .collect();
    import_deletes.sort_by_key(Action::object);

    let mut exports = Vec::new();
    let statuses_by_service: HashMap<&NamespacedName, &crate::merge::ExportStatus> = plan
        .export_statuses
        .iter()
        .filter(|s| &s.cluster == local)
        .map(|s| (&s.service, s))
        .collect();
    let mut local_exports: Vec<&Arc<ServiceExport>> = observed.exports.iter().collect();
    local_exports.sort_by_key(|e| key(&e.metadata));
    for export in local_exports {
        if export.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let id = key(&export.metadata);
        let Some(status) = statuses_by_service.get(&id) else {
            continue;
        };
        let current: Vec<Condition> = export
            .status
            .as_ref()
            .map(|s| {
                s.conditions
                    .iter()
                    .filter(|c| EXPORT_CONDITION_TYPES.contains(&c.type_.as_str()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let desired: Vec<Condition> = status
            .conditions
            .iter()
            .map(|c| c.to_k8s(now.clone()))
            .collect();
        let desired = with_transition_times(&desired, &current, now);
        if sorted(&current) == sorted(&desired) {
            continue;
        }
        let was = conflict_true(&current);
        let is = conflict_true(&desired);
        let event = match (was, is) {
            (None, Some(c)) => Some((true, EVENT_CONFLICT, format!("{}: {}", c.reason, c.message))),
            (Some(c), None) => Some((
                false,
                EVENT_RESOLVED,
                format!(
                    "The conflict ({}) cleared: the constituent Services agree.",
                    c.reason
                ),
            )),
            _ => None,
        };
        exports.push(Action::ApplyExportStatus {
            service: id.clone(),
            conditions: desired,
        });
        if let Some((warning, reason, note)) = event {
            exports.push(Action::Event {
                export: id,
                uid: export.metadata.uid.clone(),
                warning,
                reason: reason.to_owned(),
                note,
            });
        }
    }

    let mut out = imports;
    out.extend(statuses);
    out.extend(slices);
    out.extend(slice_deletes);
    out.extend(import_deletes);
    out.extend(exports);
    out
}

/// Number of local ServiceExports whose `Conflict` is True, per reason (combined reasons are
/// split), for `mcs_conflicts`.
pub fn conflict_counts(plan: &MergeOutput, local: &ClusterId) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for s in plan.export_statuses.iter().filter(|s| &s.cluster == local) {
        for c in &s.conditions {
            if c.type_ == ConditionType::Conflict && c.status == ConditionStatus::True {
                for r in c.reason.split(',') {
                    *out.entry(r.to_owned()).or_insert(0) += 1;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{cluster, endpoint, export, labels, local_slice, service, snapshot};
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
        // Someone else's label is left alone.
        assert!(map_agrees(
            Some(&labels(&[("a", "1")])),
            &observed,
            "labels"
        ));
        // A changed or a new desired label needs a write.
        assert!(!map_agrees(
            Some(&labels(&[("a", "2")])),
            &observed,
            "labels"
        ));
        assert!(!map_agrees(
            Some(&labels(&[("a", "1"), ("b", "1")])),
            &observed,
            "labels"
        ));
        // A label we applied and no longer want needs a write (the apply removes it).
        assert!(!map_agrees(Some(&labels(&[])), &observed, "labels"));
        assert!(!map_agrees(None, &observed, "labels"));
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
}
