//! The node's inputs, indexed by service, and the changes the sources report.
//!
//! Sources (an API server's watch events, a directory, the standalone merge) describe what
//! changed as [`Change`]s; [`InputIndex::apply`] files each object under its service
//! (namespace plus name for an import; namespace plus the `multicluster.kubernetes.io/service-name`
//! label for a slice) and names the services it touched, so the lb table and the maps are
//! updated for those services only ([`super::LbState::update`]).
//!
//! Objects are shared (`Arc`), never copied: the index is the only store of the node's inputs.
//! A complete list (the first list of a watch, a re-list after the watch was lost, a directory
//! read) replaces everything of its kind: objects not in it are pruned, and the services whose
//! objects differ are reported. The index is ready once it has had a complete list of both
//! kinds; until then nothing may be pruned from the maps.

use std::{
    collections::{BTreeSet, HashSet},
    hash::{Hash, Hasher},
    sync::Arc,
};

use foldhash::{HashMap, HashMapExt as _};

use super::ServiceInputs;
use crate::{
    merge::exports::key,
    model::{EndpointSlice, LABEL_SERVICE_NAME, NamespacedName, ServiceImport},
};

/// What changed in the node's inputs.
#[derive(Clone, Debug)]
pub enum Change {
    /// Every import and every slice (a directory read, a standalone merge).
    Snapshot {
        imports: Vec<Arc<ServiceImport>>,
        slices: Vec<Arc<EndpointSlice>>,
    },
    /// The complete list of imports (a watch's first list or a re-list).
    Imports(Vec<Arc<ServiceImport>>),
    /// The complete list of imported slices.
    Slices(Vec<Arc<EndpointSlice>>),
    /// An import was added or modified.
    Import(Arc<ServiceImport>),
    /// An import was deleted (its last state).
    ImportDeleted(Arc<ServiceImport>),
    /// A slice was added or modified (possibly moved to another service by its label).
    Slice(Arc<EndpointSlice>),
    /// A slice was deleted (its last state).
    SliceDeleted(Arc<EndpointSlice>),
}

/// An import's service.
pub fn import_service(si: &ServiceImport) -> NamespacedName {
    NamespacedName::of(&si.metadata)
}

/// A slice's service, from its namespace and service-name label; `None` without the label.
pub fn slice_service(slice: &EndpointSlice) -> Option<NamespacedName> {
    let service = slice.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
    Some(NamespacedName::new(
        key(&slice.metadata).0,
        service.as_str(),
    ))
}

/// A slice, hashed and compared by namespace/name: finds the slice an event replaces.
#[derive(Clone, Debug)]
struct ByName(Arc<EndpointSlice>);

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        key(&self.0.metadata) == key(&other.0.metadata)
    }
}

impl Eq for ByName {}

impl Hash for ByName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        key(&self.0.metadata).hash(state)
    }
}

/// The objects of one service.
#[derive(Clone, Debug, Default)]
struct ServiceObjects {
    imports: Vec<Arc<ServiceImport>>,
    /// Sorted by name, so two lists of the same slices compare equal.
    slices: Vec<Arc<EndpointSlice>>,
}

impl ServiceObjects {
    fn is_empty(&self) -> bool {
        self.imports.is_empty() && self.slices.is_empty()
    }
}

fn same<T: PartialEq>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| Arc::ptr_eq(x, y) || **x == **y)
}

fn slice_name(slice: &EndpointSlice) -> &str {
    slice.metadata.name.as_deref().unwrap_or("")
}

/// The node's ServiceImports and imported EndpointSlices, by service.
#[derive(Clone, Debug, Default)]
pub struct InputIndex {
    services: HashMap<NamespacedName, ServiceObjects>,
    /// Every filed slice by namespace/name: where an update or delete finds the old version
    /// (and so the service it leaves when its label changed).
    slices: HashSet<ByName, foldhash::fast::RandomState>,
    imports_listed: bool,
    slices_listed: bool,
}

impl InputIndex {
    /// Whether complete lists of both kinds have come in.
    pub fn is_ready(&self) -> bool {
        self.imports_listed && self.slices_listed
    }

    /// Every service with an import or a slice.
    pub fn services(&self) -> impl Iterator<Item = &NamespacedName> {
        self.services.keys()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// A service's inputs (empty when it has none).
    pub fn inputs(&self, service: &NamespacedName) -> ServiceInputs<'_> {
        self.services
            .get(service)
            .map(|o| ServiceInputs {
                imports: &o.imports,
                slices: &o.slices,
            })
            .unwrap_or_default()
    }

    /// Applies `change`, adding the services whose inputs changed to `dirty`.
    pub fn apply(&mut self, change: Change, dirty: &mut BTreeSet<NamespacedName>) {
        match change {
            Change::Snapshot { imports, slices } => {
                self.replace_imports(imports, dirty);
                self.replace_slices(slices, dirty);
            }
            Change::Imports(imports) => self.replace_imports(imports, dirty),
            Change::Slices(slices) => self.replace_slices(slices, dirty),
            Change::Import(si) => {
                let service = import_service(&si);
                let objects = self.services.entry(service.clone()).or_default();
                if !same(&objects.imports, std::slice::from_ref(&si)) {
                    objects.imports = vec![si];
                    dirty.insert(service);
                }
            }
            Change::ImportDeleted(si) => {
                let service = import_service(&si);
                if let Some(objects) = self.services.get_mut(&service)
                    && !objects.imports.is_empty()
                {
                    objects.imports.clear();
                    self.drop_if_empty(&service);
                    dirty.insert(service);
                }
            }
            Change::Slice(slice) => {
                if let Some(old) = self.slices.get(&ByName(slice.clone()))
                    && (Arc::ptr_eq(&old.0, &slice) || *old.0 == *slice)
                {
                    return;
                }
                self.remove_slice(&slice, dirty);
                if let Some(service) = slice_service(&slice) {
                    self.slices.insert(ByName(slice.clone()));
                    let slices = &mut self.services.entry(service.clone()).or_default().slices;
                    let at = slices.partition_point(|s| slice_name(s) <= slice_name(&slice));
                    slices.insert(at, slice);
                    dirty.insert(service);
                }
            }
            Change::SliceDeleted(slice) => self.remove_slice(&slice, dirty),
        }
    }

    /// Unfiles the slice with `slice`'s namespace/name, if filed.
    fn remove_slice(&mut self, slice: &Arc<EndpointSlice>, dirty: &mut BTreeSet<NamespacedName>) {
        let Some(ByName(old)) = self.slices.take(&ByName(slice.clone())) else {
            return;
        };
        let Some(service) = slice_service(&old) else {
            return;
        };
        if let Some(objects) = self.services.get_mut(&service) {
            objects.slices.retain(|s| slice_name(s) != slice_name(&old));
            self.drop_if_empty(&service);
        }
        dirty.insert(service);
    }

    fn drop_if_empty(&mut self, service: &NamespacedName) {
        if self
            .services
            .get(service)
            .is_some_and(ServiceObjects::is_empty)
        {
            self.services.remove(service);
        }
    }

    fn replace_imports(
        &mut self,
        imports: Vec<Arc<ServiceImport>>,
        dirty: &mut BTreeSet<NamespacedName>,
    ) {
        self.imports_listed = true;
        let mut new: HashMap<NamespacedName, Vec<Arc<ServiceImport>>> =
            HashMap::with_capacity(imports.len());
        for si in imports {
            new.entry(import_service(&si)).or_default().push(si);
        }
        let gone: Vec<NamespacedName> = self
            .services
            .iter()
            .filter(|(s, o)| !o.imports.is_empty() && !new.contains_key(*s))
            .map(|(s, _)| s.clone())
            .collect();
        for service in gone {
            if let Some(objects) = self.services.get_mut(&service) {
                objects.imports.clear();
            }
            self.drop_if_empty(&service);
            dirty.insert(service);
        }
        for (service, imports) in new {
            let objects = self.services.entry(service.clone()).or_default();
            if !same(&objects.imports, &imports) {
                dirty.insert(service);
            }
            objects.imports = imports;
        }
    }

    fn replace_slices(
        &mut self,
        slices: Vec<Arc<EndpointSlice>>,
        dirty: &mut BTreeSet<NamespacedName>,
    ) {
        self.slices_listed = true;
        let mut by_name = HashSet::with_capacity_and_hasher(slices.len(), Default::default());
        let mut new: HashMap<NamespacedName, Vec<Arc<EndpointSlice>>> = HashMap::new();
        for slice in slices {
            // Slices without the label belong to no service (the sources select on it).
            if let Some(service) = slice_service(&slice) {
                by_name.insert(ByName(slice.clone()));
                new.entry(service).or_default().push(slice);
            }
        }
        self.slices = by_name;
        for list in new.values_mut() {
            list.sort_by(|a, b| slice_name(a).cmp(slice_name(b)));
        }
        let gone: Vec<NamespacedName> = self
            .services
            .iter()
            .filter(|(s, o)| !o.slices.is_empty() && !new.contains_key(*s))
            .map(|(s, _)| s.clone())
            .collect();
        for service in gone {
            if let Some(objects) = self.services.get_mut(&service) {
                objects.slices.clear();
            }
            self.drop_if_empty(&service);
            dirty.insert(service);
        }
        for (service, slices) in new {
            let objects = self.services.entry(service.clone()).or_default();
            if !same(&objects.slices, &slices) {
                dirty.insert(service);
            }
            // The new objects even when equal: the index by name holds these.
            objects.slices = slices;
        }
    }
}

/// Keeps only what identifies an object and what the lb table reads of its metadata: name,
/// namespace, resourceVersion and the two MCS labels. Everything else (managedFields, other
/// labels, annotations, owners) is dropped before an object is stored, to keep the node small.
fn strip_meta(meta: &mut crate::model::ObjectMeta) {
    use crate::model::LABEL_SOURCE_CLUSTER;
    let labels = meta.labels.take().map(|mut labels| {
        labels.retain(|k, _| k == LABEL_SERVICE_NAME || k == LABEL_SOURCE_CLUSTER);
        labels
    });
    *meta = crate::model::ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        resource_version: meta.resource_version.take(),
        labels: labels.filter(|l| !l.is_empty()),
        ..Default::default()
    };
}

/// Drops what the lb table does not read from a ServiceImport (its status, most metadata):
/// `build` gives the same table with or without it.
pub fn strip_import(si: &mut ServiceImport) {
    strip_meta(&mut si.metadata);
    si.status = None;
}

/// Drops what neither the lb table nor DNS reads from an EndpointSlice (most metadata;
/// endpoints' node, zone, hints and target): `build` gives the same table with or without it.
/// The hostname stays: headless imports answer `<hostname>.<cluster>.<svc>...` with it.
pub fn strip_slice(slice: &mut EndpointSlice) {
    strip_meta(&mut slice.metadata);
    for ep in &mut slice.endpoints {
        ep.deprecated_topology = None;
        ep.hints = None;
        ep.node_name = None;
        ep.target_ref = None;
        ep.zone = None;
    }
}
