//! What the local cluster holds of the controller's writes, as compact records: the
//! ServiceImports and imported EndpointSlices with our managed-by label, and the local
//! ServiceExports' conditions. The controller keeps them indexed by service, from its watches
//! and from the answers to its own writes.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use foldhash::{HashMap, HashSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::model::{
    Condition, EndpointSlice, FIELD_MANAGER, Interner, Name, NamespacedName, ObjectMeta,
    ServiceExport, ServiceImport,
    records::{ImportRecord, ImportedSlice},
    resource_version,
};

use super::EXPORT_CONDITION_TYPES;

/// A `metadata.uid`, kept for delete preconditions and Event references: 16 bytes when it is a
/// UUID in the API server's lowercase form (always, from a real one), else its text. Tens of
/// thousands of observed objects each held a 36-byte string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Uid {
    /// A UUID that prints back as the text it came as.
    Uuid(uuid::Uuid),
    /// Anything else, as it came.
    Text(Box<str>),
}

impl Uid {
    /// The uid of `meta`, if it has one.
    pub fn of(meta: &ObjectMeta) -> Option<Self> {
        let text = meta.uid.as_deref()?;
        let mut printed = uuid::Uuid::encode_buffer();
        Some(match uuid::Uuid::try_parse(text) {
            // Only where it reads back as the same text: the precondition compares strings.
            Ok(u) if u.hyphenated().encode_lower(&mut printed) == text => Self::Uuid(u),
            _ => Self::Text(text.into()),
        })
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Uid::Uuid(u) => u.hyphenated().fmt(f),
            Uid::Text(t) => f.write_str(t),
        }
    }
}

/// The label or annotation keys our field manager applied to an object, from `managedFields`.
pub fn owned_keys(meta: &ObjectMeta, field: &str) -> BTreeSet<String> {
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

/// Labels or annotations: the object's, and the keys of them we applied. Kept for every
/// import and imported slice the cluster holds, so in compact form: sorted lists, with interned
/// keys and label values (the same few keys, and the service and cluster names, repeat on
/// every object).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedMap {
    /// Every key and value the object has, sorted by key.
    values: Box<[(Name, Name)]>,
    /// The keys our field manager applied, sorted.
    ours: Box<[Name]>,
}

impl OwnedMap {
    /// The object's labels (`field` = `labels`) or annotations, and the keys of them our field
    /// manager applied.
    pub fn of(meta: &ObjectMeta, field: &str, names: &Interner) -> Self {
        // Label values (service and cluster names) repeat; annotation values can be unique to
        // one object (and change), and an interner entry would outlive them until a relist.
        let (values, intern_values) = match field {
            "labels" => (meta.labels.as_ref(), true),
            _ => (meta.annotations.as_ref(), false),
        };
        // From a BTreeMap: sorted by key, each key once.
        let values: Box<[(Name, Name)]> = values
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                let v = if intern_values {
                    names.intern(v)
                } else {
                    Name::from(v.as_str())
                };
                (names.intern(k), v)
            })
            .collect();
        // From a set: sorted and unique already.
        let ours = owned_keys(meta, field)
            .iter()
            .map(|k| names.intern(k))
            .collect();
        OwnedMap { values, ours }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.values
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.values[i].1)
    }

    /// Whether the object has every `desired` key and value and no key we applied that is no
    /// longer desired (a server-side apply removes those).
    pub fn agrees(&self, desired: &BTreeMap<String, String>) -> bool {
        desired.iter().all(|(k, v)| self.get(k) == Some(v.as_str()))
            && self.ours.iter().all(|k| desired.contains_key(&**k))
    }
}

/// A ServiceImport of ours as the cluster has it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedImport {
    /// Its spec, status, labels and annotations.
    pub record: ImportRecord,
    /// Its labels, with the keys we applied.
    pub labels: OwnedMap,
    /// Its annotations, with the keys we applied.
    pub annotations: OwnedMap,
    /// `metadata.uid`: deletes are conditional on it.
    pub uid: Option<Uid>,
    /// `metadata.resourceVersion`, as a number.
    pub resource_version: u64,
}

impl ObservedImport {
    /// Reads a ServiceImport.
    pub fn from_k8s(si: &ServiceImport, names: &Interner) -> Option<Self> {
        Some(ObservedImport {
            record: ImportRecord::from_k8s(si, names, true).into_record()?,
            labels: OwnedMap::of(&si.metadata, "labels", names),
            annotations: OwnedMap::of(&si.metadata, "annotations", names),
            uid: Uid::of(&si.metadata),
            resource_version: resource_version(&si.metadata),
        })
    }
}

/// An imported EndpointSlice of ours as the cluster has it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedSlice {
    /// Its namespace/name.
    pub id: NamespacedName,
    /// The service it belongs to (its namespace and service-name label), when labelled.
    pub service: Option<NamespacedName>,
    /// What it holds, when it is a well-formed imported slice.
    pub record: Option<ImportedSlice>,
    /// Its labels, with the keys we applied.
    pub labels: OwnedMap,
    /// `metadata.uid`: deletes are conditional on it.
    pub uid: Option<Uid>,
    /// `metadata.resourceVersion`, as a number.
    pub resource_version: u64,
}

impl ObservedSlice {
    /// Reads an EndpointSlice.
    pub fn from_k8s(slice: &EndpointSlice, names: &Interner) -> Self {
        let converted = ImportedSlice::from_k8s(slice, names);
        // A slice with warnings differs from anything the merge writes: it is rewritten.
        let clean = converted.warnings.is_empty();
        ObservedSlice {
            id: converted.id().to_owned(),
            service: converted.service().cloned(),
            record: converted.into_record().filter(|_| clean),
            labels: OwnedMap::of(&slice.metadata, "labels", names),
            uid: Uid::of(&slice.metadata),
            resource_version: resource_version(&slice.metadata),
        }
    }
}

/// A condition as observed: type, status and reason shared through the interner (every export
/// carries the same few). Messages are not interned: some change with the cluster's state (the
/// refused endpoints, a conflict's details), and an interner entry would outlive them until
/// the next relist.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedCondition {
    type_: Name,
    status: Name,
    reason: Name,
    message: Box<str>,
    last_transition_time: Time,
    observed_generation: Option<i64>,
}

impl ObservedCondition {
    fn of(c: &Condition, names: &Interner) -> Self {
        ObservedCondition {
            type_: names.intern(&c.type_),
            status: names.intern(&c.status),
            reason: names.intern(&c.reason),
            message: c.message.as_str().into(),
            last_transition_time: c.last_transition_time.clone(),
            observed_generation: c.observed_generation,
        }
    }

    /// The condition as the API has it.
    pub fn to_k8s(&self) -> Condition {
        Condition {
            type_: self.type_.to_string(),
            status: self.status.to_string(),
            reason: self.reason.to_string(),
            message: self.message.to_string(),
            last_transition_time: self.last_transition_time.clone(),
            observed_generation: self.observed_generation,
        }
    }
}

/// A local ServiceExport as the controller compares it: its conditions of our types.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedExport {
    /// Its namespace/name.
    pub id: NamespacedName,
    /// `metadata.uid`, for Events about it.
    pub uid: Option<Uid>,
    /// Its conditions of the types the controller owns ([`EXPORT_CONDITION_TYPES`]).
    pub conditions: Box<[ObservedCondition]>,
    /// Whether it is being deleted (its status is left alone then).
    pub deleting: bool,
    /// `metadata.resourceVersion`, as a number.
    pub resource_version: u64,
}

impl ObservedExport {
    /// Reads a ServiceExport.
    pub fn from_k8s(se: &ServiceExport, names: &Interner) -> Self {
        ObservedExport {
            id: NamespacedName::of(&se.metadata),
            uid: Uid::of(&se.metadata),
            conditions: se
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .filter(|c| EXPORT_CONDITION_TYPES.contains(&c.type_.as_str()))
                .map(|c| ObservedCondition::of(c, names))
                .collect(),
            deleting: se.metadata.deletion_timestamp.is_some(),
            resource_version: resource_version(&se.metadata),
        }
    }
}

/// One service's observed objects.
#[derive(Clone, Copy, Debug, Default)]
pub struct ObservedService<'a> {
    /// Its import of ours.
    pub import: Option<&'a ObservedImport>,
    /// Its imported slices of ours, by name.
    pub slices: &'a [Arc<ObservedSlice>],
    /// The local ServiceExport of the same namespace/name.
    pub export: Option<&'a ObservedExport>,
}

/// One kind of observed object, for [`ObservedIndex`]'s bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObservedKind {
    /// ServiceImports.
    Import,
    /// Imported EndpointSlices.
    Slice,
    /// Local ServiceExports.
    Export,
}

/// The observed objects by service. An object is replaced only by a newer version (a watch
/// event older than the answer to our own write is stale), and a deletion leaves a tombstone
/// until a newer version or a complete list arrives.
#[derive(Debug, Default)]
pub struct ObservedIndex {
    imports: HashMap<NamespacedName, Arc<ObservedImport>>,
    exports: HashMap<NamespacedName, Arc<ObservedExport>>,
    /// Slices by the service they belong to (`None`: unlabelled), sorted by name.
    slices: HashMap<Option<NamespacedName>, Vec<Arc<ObservedSlice>>>,
    /// Where each slice is filed.
    slice_homes: HashMap<NamespacedName, Option<NamespacedName>>,
    tombstones: HashMap<(ObservedKind, NamespacedName), u64>,
}

impl ObservedIndex {
    /// One service's observed objects.
    pub fn service(&self, service: &NamespacedName) -> ObservedService<'_> {
        ObservedService {
            import: self.imports.get(service).map(|a| &**a),
            slices: self
                .slices
                .get(&Some(service.clone()))
                .map(Vec::as_slice)
                .unwrap_or(&[]),
            export: self.exports.get(service).map(|a| &**a),
        }
    }

    /// Every service something is observed of.
    pub fn services(&self) -> BTreeSet<NamespacedName> {
        self.imports
            .keys()
            .chain(self.exports.keys())
            .chain(self.slices.keys().flatten())
            .cloned()
            .collect()
    }

    /// Slices of no service (no service-name label): the controller deletes them.
    pub fn unlabelled_slices(&self) -> &[Arc<ObservedSlice>] {
        self.slices.get(&None).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The imports observed, in no particular order.
    pub fn imports(&self) -> impl Iterator<Item = &ObservedImport> {
        self.imports.values().map(|a| &**a)
    }

    fn fresh(
        &self,
        kind: ObservedKind,
        id: &NamespacedName,
        rv: u64,
        current: Option<u64>,
    ) -> bool {
        current.is_none_or(|c| rv >= c)
            && self
                .tombstones
                .get(&(kind, id.clone()))
                .is_none_or(|t| rv > *t)
    }

    /// Whether `o` changes what is filed as `current`: it is newer than that and than the
    /// object's deletion, and not the same object (the watch's echo of a write whose answer
    /// is filed already changes nothing).
    fn changes<T: Versioned + PartialEq>(
        &self,
        kind: ObservedKind,
        id: &NamespacedName,
        o: &T,
        current: Option<&T>,
    ) -> bool {
        current.is_none_or(|c| c != o)
            && self.fresh(
                kind,
                id,
                o.resource_version(),
                current.map(Versioned::resource_version),
            )
    }

    /// Files an import; the service it belongs to when anything changed.
    pub fn put_import(&mut self, o: ObservedImport) -> Option<NamespacedName> {
        let id = o.record.service.clone();
        let current = self.imports.get(&id).map(|c| &**c);
        if !self.changes(ObservedKind::Import, &id, &o, current) {
            return None;
        }
        self.tombstones.remove(&(ObservedKind::Import, id.clone()));
        self.imports.insert(id.clone(), Arc::new(o));
        Some(id)
    }

    /// Files an export; its service when anything changed.
    pub fn put_export(&mut self, o: ObservedExport) -> Option<NamespacedName> {
        let id = o.id.clone();
        let current = self.exports.get(&id).map(|c| &**c);
        if !self.changes(ObservedKind::Export, &id, &o, current) {
            return None;
        }
        self.tombstones.remove(&(ObservedKind::Export, id.clone()));
        self.exports.insert(id.clone(), Arc::new(o));
        Some(id)
    }

    /// Files a slice; the services it left and joined.
    pub fn put_slice(&mut self, o: ObservedSlice) -> Vec<NamespacedName> {
        let id = o.id.clone();
        let current = self.find_slice(&id);
        if !self.changes(ObservedKind::Slice, &id, &o, current) {
            return Vec::new();
        }
        self.tombstones.remove(&(ObservedKind::Slice, id.clone()));
        let mut touched = self.unfile_slice(&id);
        let home = o.service.clone();
        let list = self.slices.entry(home.clone()).or_default();
        let at = list.partition_point(|s| s.id.name <= id.name);
        list.insert(at, Arc::new(o));
        self.slice_homes.insert(id, home.clone());
        touched.extend(home);
        touched
    }

    fn find_slice(&self, id: &NamespacedName) -> Option<&ObservedSlice> {
        let home = self.slice_homes.get(id)?;
        self.slices
            .get(home)?
            .iter()
            .find(|s| s.id == *id)
            .map(|a| &**a)
    }

    fn unfile_slice(&mut self, id: &NamespacedName) -> Vec<NamespacedName> {
        let Some(home) = self.slice_homes.remove(id) else {
            return Vec::new();
        };
        if let Some(list) = self.slices.get_mut(&home) {
            list.retain(|s| s.id != *id);
            if list.is_empty() {
                self.slices.remove(&home);
            }
        }
        home.into_iter().collect()
    }

    /// Records that an object is gone as of `resource_version`; the services it touched.
    pub fn delete(
        &mut self,
        kind: ObservedKind,
        id: &NamespacedName,
        resource_version: u64,
    ) -> Vec<NamespacedName> {
        let t = self.tombstones.entry((kind, id.clone())).or_insert(0);
        *t = (*t).max(resource_version);
        match kind {
            ObservedKind::Import => self
                .imports
                .remove(id)
                .map(|_| id.clone())
                .into_iter()
                .collect(),
            ObservedKind::Export => self
                .exports
                .remove(id)
                .map(|_| id.clone())
                .into_iter()
                .collect(),
            ObservedKind::Slice => self.unfile_slice(id),
        }
    }

    /// Replaces every object of `kind` with a complete list (a watch's first list or a
    /// re-list); the services whose objects differ.
    ///
    /// A listed object older than what is known of it (the answer to our own write, a watch
    /// event, a deletion) does not take it back: a re-list that started before our write was
    /// answered would otherwise make the write be made again.
    pub fn replace_imports(&mut self, list: Vec<ObservedImport>) -> BTreeSet<NamespacedName> {
        let old = std::mem::take(&mut self.imports);
        let mut deleted = Vec::new();
        for o in list {
            let id = o.record.service.clone();
            match self.listed(ObservedKind::Import, &id, o, old.get(&id)) {
                Listed::File(o) => {
                    self.imports.insert(id, o);
                }
                Listed::Deleted => deleted.push(id),
            }
        }
        self.keep_tombstones(ObservedKind::Import, &deleted);
        old.keys()
            .chain(self.imports.keys())
            .filter(|s| old.get(*s) != self.imports.get(*s))
            .cloned()
            .collect()
    }

    /// [`ObservedIndex::replace_imports`] for exports.
    pub fn replace_exports(&mut self, list: Vec<ObservedExport>) -> BTreeSet<NamespacedName> {
        let old = std::mem::take(&mut self.exports);
        let mut deleted = Vec::new();
        for o in list {
            let id = o.id.clone();
            match self.listed(ObservedKind::Export, &id, o, old.get(&id)) {
                Listed::File(o) => {
                    self.exports.insert(id, o);
                }
                Listed::Deleted => deleted.push(id),
            }
        }
        self.keep_tombstones(ObservedKind::Export, &deleted);
        old.keys()
            .chain(self.exports.keys())
            .filter(|s| old.get(*s) != self.exports.get(*s))
            .cloned()
            .collect()
    }

    /// [`ObservedIndex::replace_imports`] for slices.
    pub fn replace_slices(&mut self, list: Vec<ObservedSlice>) -> BTreeSet<NamespacedName> {
        let old = std::mem::take(&mut self.slices);
        let known: HashMap<&NamespacedName, &Arc<ObservedSlice>> =
            old.values().flatten().map(|s| (&s.id, s)).collect();
        let mut filed = Vec::with_capacity(list.len());
        let mut deleted = Vec::new();
        for o in list {
            let id = o.id.clone();
            match self.listed(ObservedKind::Slice, &id, o, known.get(&id).copied()) {
                Listed::File(o) => filed.push(o),
                Listed::Deleted => deleted.push(id),
            }
        }
        drop(known);
        self.keep_tombstones(ObservedKind::Slice, &deleted);
        self.slice_homes.clear();
        for o in filed {
            let home = o.service.clone();
            self.slice_homes.insert(o.id.clone(), home.clone());
            self.slices.entry(home).or_default().push(o);
        }
        for list in self.slices.values_mut() {
            list.sort_by(|a, b| a.id.name.cmp(&b.id.name));
        }
        let homes: HashSet<&Option<NamespacedName>> =
            old.keys().chain(self.slices.keys()).collect();
        homes
            .into_iter()
            .filter(|h| old.get(*h) != self.slices.get(*h))
            .filter_map(|h| h.clone())
            .collect()
    }

    /// What to file for a listed object: it, or the newer version already known; nothing
    /// when it was deleted after the version listed.
    fn listed<T: Versioned>(
        &self,
        kind: ObservedKind,
        id: &NamespacedName,
        listed: T,
        known: Option<&Arc<T>>,
    ) -> Listed<T> {
        let rv = listed.resource_version();
        if self.fresh(kind, id, rv, known.map(|k| k.resource_version())) {
            Listed::File(Arc::new(listed))
        } else {
            match known {
                Some(k) if k.resource_version() > rv => Listed::File(Arc::clone(k)),
                _ => Listed::Deleted,
            }
        }
    }

    /// Drops the tombstones of `kind` a complete list ends, all but those of `deleted` (listed,
    /// but deleted after the version listed).
    fn keep_tombstones(&mut self, kind: ObservedKind, deleted: &[NamespacedName]) {
        self.tombstones
            .retain(|(k, id), _| *k != kind || deleted.contains(id));
    }
}

/// What [`ObservedIndex::listed`] files.
enum Listed<T> {
    File(Arc<T>),
    Deleted,
}

/// An observed object's `resourceVersion`.
trait Versioned {
    fn resource_version(&self) -> u64;
}

impl Versioned for ObservedImport {
    fn resource_version(&self) -> u64 {
        self.resource_version
    }
}

impl Versioned for ObservedExport {
    fn resource_version(&self) -> u64 {
        self.resource_version
    }
}

impl Versioned for ObservedSlice {
    fn resource_version(&self) -> u64 {
        self.resource_version
    }
}
