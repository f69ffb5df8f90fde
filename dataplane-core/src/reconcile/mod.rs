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
//! - ServiceExport: its `Valid`, `Ready`, `Conflict` and `EndpointsRefused` conditions equal
//!   the desired ones
//!   (conditions of other types belong to others and are left alone).
//!
//! A condition keeps its `lastTransitionTime` while its status stays the same. Only imports
//! and slices carrying our managed-by label are ever deleted.

mod observed;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

pub use observed::{
    ObservedCondition, ObservedExport, ObservedImport, ObservedIndex, ObservedKind,
    ObservedService, ObservedSlice, OwnedMap, Uid, owned_keys,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::{
    lb::inputs::{SliceInput, record_input},
    merge::{
        ClusterSetConfig, ClusterSnapshot, ExportStatus, MemberChange, MergeOutput, MergeState,
        ServiceOutput,
    },
    model::{
        ClusterId, Condition, EndpointSlice, Interner, LABEL_APP_MANAGED_BY, LABEL_SERVICE_NAME,
        MANAGED_BY, NamespacedName, ServiceExport, ServiceImport, ServiceImportStatus,
        records::{ImportRecord, ImportedSlice},
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
        /// Its conditions of the types in [`EXPORT_CONDITION_TYPES`], transition times included.
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
        /// The service it belongs to; `None` for a slice without a service-name label.
        service: Option<NamespacedName>,
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

    /// The service the action is about, when it names one (the deletion of a slice without a
    /// service-name label names none).
    pub fn service(&self) -> Option<NamespacedName> {
        match self {
            Action::ApplyImport(o) | Action::ApplyImportStatus(o) => {
                Some(NamespacedName::of(&o.metadata))
            }
            Action::ApplySlice(o) => {
                let service = o.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
                Some(NamespacedName::new(
                    crate::model::key(&o.metadata).0,
                    service.as_str(),
                ))
            }
            Action::ApplyExportStatus { service, .. } | Action::DeleteImport { service, .. } => {
                Some(service.clone())
            }
            Action::Event { export, .. } => Some(export.clone()),
            Action::DeleteSlice { service, .. } => service.clone(),
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
/// `EndpointsRefused` is set only while it holds: leaving it out of an apply removes it.
pub const EXPORT_CONDITION_TYPES: [&str; 4] = ["Valid", "Ready", "Conflict", "EndpointsRefused"];
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

/// What the merge wants of one service in the local cluster.
#[derive(Clone, Copy, Debug, Default)]
pub struct DesiredService<'a> {
    /// Its import, when it has one.
    pub import: Option<&'a ImportRecord>,
    /// Its imported slices (as the merge keeps them).
    pub slices: &'a [SliceInput],
    /// The conditions of the local cluster's export of it, when it exports it.
    pub local_export: Option<&'a ExportStatus>,
}

impl<'a> DesiredService<'a> {
    /// The local cluster's part of one service's merge.
    pub fn of(output: Option<&'a ServiceOutput>, local: &ClusterId) -> Self {
        let Some(o) = output else {
            return DesiredService::default();
        };
        DesiredService {
            import: o.import(),
            slices: &o.slices,
            local_export: o.statuses.iter().find(|s| &s.cluster == local),
        }
    }
}

/// The ordering rank of an action in a whole-cluster reconcile.
fn rank(a: &Action) -> u8 {
    match a {
        Action::DeleteSlice { .. } => 0,
        Action::ApplySlice(_) => 1,
        Action::ApplyImport(_) => 2,
        Action::ApplyImportStatus(_) => 3,
        Action::DeleteImport { .. } => 4,
        Action::ApplyExportStatus { .. } | Action::Event { .. } => 5,
    }
}

/// Whether two imports have the same spec.
fn same_spec(a: &ImportRecord, b: &ImportRecord) -> bool {
    a.type_ == b.type_
        && a.ips == b.ips
        && a.ip_families == b.ip_families
        && a.ports == b.ports
        && a.session_affinity == b.session_affinity
        && a.session_affinity_config == b.session_affinity_config
        && a.internal_traffic_policy == b.internal_traffic_policy
        && a.traffic_distribution == b.traffic_distribution
}

/// Whether an observed slice holds what `desired` holds (its endpoints compared as sets).
fn same_slice(desired: &ImportedSlice, observed: &ObservedSlice) -> bool {
    observed.record.as_ref().is_some_and(|o| {
        o.family == desired.family
            && o.cluster == desired.cluster
            && o.ports == desired.ports
            && (Arc::ptr_eq(&o.endpoints, &desired.endpoints) || o.endpoints == desired.endpoints)
    })
}

/// The actions that make one service agree with what the merge wants of it (see the module
/// documentation): the deletions of its slices that are no longer wanted, its slices, its
/// import and the import's status (or its deletion), and its local export's conditions
/// followed by an Event when a conflict appeared or cleared. `now` is the `lastTransitionTime` of conditions that change status.
pub fn reconcile_service(
    service: &NamespacedName,
    desired: DesiredService<'_>,
    observed: ObservedService<'_>,
    now: &Time,
) -> Vec<Action> {
    // The slices go first: a node that sees the import's new ports with the old slices would
    // route a port to the endpoints of a cluster that no longer declares it (a slice deleted
    // or changed after the import), where new slices under the old import serve only the
    // ports it already has.
    let mut out = slice_actions(desired.slices, observed.slices);
    if let Some(import) = desired.import {
        let mut want = import.clone();
        want.labels
            .insert(LABEL_APP_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
        let current = observed.import;
        let main_agrees = current.is_some_and(|o| {
            same_spec(&o.record, &want)
                && o.labels.agrees(&want.labels)
                && o.annotations.agrees(&want.annotations)
        });
        let observed_status = current
            .and_then(|o| o.record.status.clone())
            .unwrap_or_default();
        let want_status = want.status.clone().unwrap_or_default();
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
        want.status = Some(Box::new(status));
        // Converted only to be written: nearly every pass finds the import as it should be.
        if !(main_agrees && status_agrees) {
            let object = want.to_k8s();
            if !main_agrees {
                out.push(Action::ApplyImport(object.clone()));
            }
            if !status_agrees {
                out.push(Action::ApplyImportStatus(object));
            }
        }
    }
    if desired.import.is_none()
        && let Some(o) = observed.import
    {
        out.push(Action::DeleteImport {
            service: service.clone(),
            uid: o.uid.as_ref().map(Uid::to_string),
            resource_version: o.resource_version,
        });
    }
    if let (Some(export), Some(status)) = (observed.export, desired.local_export)
        && !export.deleting
    {
        let current: Vec<Condition> = export.conditions.iter().map(|c| c.to_k8s()).collect();
        let current = &current;
        let wanted: Vec<Condition> = status
            .conditions
            .iter()
            .map(|c| c.to_k8s(now.clone()))
            .collect();
        let wanted = with_transition_times(&wanted, current, now);
        if sorted(current) != sorted(&wanted) {
            let event = match (conflict_true(current), conflict_true(&wanted)) {
                (None, Some(c)) => {
                    Some((true, EVENT_CONFLICT, format!("{}: {}", c.reason, c.message)))
                }
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
            out.push(Action::ApplyExportStatus {
                service: service.clone(),
                conditions: wanted,
            });
            if let Some((warning, reason, note)) = event {
                out.push(Action::Event {
                    export: service.clone(),
                    uid: export.uid.as_ref().map(Uid::to_string),
                    warning,
                    reason: reason.to_owned(),
                    note,
                });
            }
        }
    }
    out
}

/// The deletions of a service's observed slices that are no longer wanted, then the applies of
/// the wanted ones that differ from what is observed.
fn slice_actions(desired: &[SliceInput], observed: &[Arc<ObservedSlice>]) -> Vec<Action> {
    let wanted: BTreeSet<&str> = desired
        .iter()
        .filter_map(|c| c.record())
        .map(|s| &*s.name)
        .collect();
    let mut out: Vec<Action> = observed
        .iter()
        .filter(|o| !wanted.contains(&*o.id.name))
        .map(|o| Action::DeleteSlice {
            slice: o.id.clone(),
            service: o.service.clone(),
            uid: o.uid.as_ref().map(Uid::to_string),
            resource_version: o.resource_version,
        })
        .collect();
    for s in desired.iter().filter_map(|c| c.record()) {
        let agrees = observed
            .iter()
            .find(|o| o.id.name == s.name)
            .is_some_and(|o| same_slice(s, o) && o.labels.agrees(&s.labels()));
        if !agrees {
            out.push(Action::ApplySlice(s.to_k8s()));
        }
    }
    out
}

/// The deletions of slices of ours that belong to no service (no service-name label).
pub fn reconcile_unlabelled(observed: &ObservedIndex) -> Vec<Action> {
    observed
        .unlabelled_slices()
        .iter()
        .map(|o| Action::DeleteSlice {
            slice: o.id.clone(),
            service: o.service.clone(),
            uid: o.uid.as_ref().map(Uid::to_string),
            resource_version: o.resource_version,
        })
        .collect()
}

/// The actions that make the local cluster agree with `plan` (see the module documentation).
/// `now` is the `lastTransitionTime` of conditions that change status.
///
/// Order: slice deletions, slices, imports, their status, import deletions, then each
/// export's status followed by its Event if a conflict appeared or cleared. (Slices before
/// imports: see [`reconcile_service`].)
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
/// let record = ImportRecord::from_k8s(&web, &Interner::new(), true).into_record().unwrap();
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
    let names = Interner::new();
    let mut index = ObservedIndex::default();
    index.replace_imports(
        observed
            .imports
            .iter()
            .filter_map(|o| ObservedImport::from_k8s(o, &names))
            .collect(),
    );
    index.replace_slices(
        observed
            .slices
            .iter()
            .map(|o| ObservedSlice::from_k8s(o, &names))
            .collect(),
    );
    index.replace_exports(
        observed
            .exports
            .iter()
            .map(|o| ObservedExport::from_k8s(o, &names))
            .collect(),
    );
    let mut imports: HashMap<&NamespacedName, &ImportRecord> = HashMap::new();
    for i in &plan.service_imports {
        imports.insert(&i.service, i);
    }
    let mut slices: HashMap<&NamespacedName, Vec<SliceInput>> = HashMap::new();
    for s in &plan.endpoint_slices {
        slices
            .entry(&s.service)
            .or_default()
            .push(record_input(s.clone()));
    }
    let mut statuses: HashMap<&NamespacedName, &ExportStatus> = HashMap::new();
    for s in plan.export_statuses.iter().filter(|s| &s.cluster == local) {
        statuses.insert(&s.service, s);
    }
    let services: BTreeSet<NamespacedName> = index
        .services()
        .into_iter()
        .chain(imports.keys().map(|s| (*s).clone()))
        .chain(slices.keys().map(|s| (*s).clone()))
        .collect();
    let mut out = Vec::new();
    for service in &services {
        let desired = DesiredService {
            import: imports.get(service).copied(),
            slices: slices.get(service).map(Vec::as_slice).unwrap_or(&[]),
            local_export: statuses.get(service).copied(),
        };
        out.extend(reconcile_service(
            service,
            desired,
            index.service(service),
            now,
        ));
    }
    out.extend(reconcile_unlabelled(&index));
    // Imports first, then statuses, slices, deletions, exports (each export's Event after it).
    out.sort_by_key(rank);
    out
}

/// Number of local ServiceExports whose `Conflict` is True, per reason (combined reasons are
/// split), for `mcs_conflicts`.
pub fn conflict_counts(plan: &MergeOutput, local: &ClusterId) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for s in plan.export_statuses.iter().filter(|s| &s.cluster == local) {
        if let Some(c) = s.conflict() {
            for r in c.reason.split(',') {
                *out.entry(r.to_owned()).or_insert(0) += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
