//! The node's inputs, indexed by service, and the changes the sources report.
//!
//! Sources (an API server's watch events, a directory, the standalone merge) describe what
//! changed as [`Change`]s; [`InputIndex::apply`] files each object under its service
//! (namespace plus name for an import; namespace plus the `multicluster.kubernetes.io/service-name`
//! label for a slice) and names the services it touched, so the lb table and the maps are
//! updated for those services only ([`super::LbState::update`]).
//!
//! The objects arrive converted into compact records ([`ImportRecord`], [`ImportedSlice`]),
//! shared (`Arc`), never copied: the index is the node's only store of them (in standalone
//! mode the merge's outputs hold the same records).
//! A complete list (the first list of a watch, a re-list after the watch was lost, a directory
//! read) replaces everything of its kind: objects not in it are pruned, and the services whose
//! objects differ are reported. The index is ready once it has had a complete list of both
//! kinds; until then nothing may be pruned from the maps.

use std::{collections::BTreeSet, sync::Arc};

use foldhash::{HashMap, HashMapExt as _};

use super::ServiceInputs;
use crate::model::{
    EndpointSlice, IdRef, Interner, NamespacedName, ServiceImport,
    by_id::ById,
    records::{Converted, ImportRecord, ImportedSlice},
};

/// An import as the node files it: its record and the warnings of its conversion.
pub type ImportInput = Arc<Converted<ImportRecord>>;
/// An imported slice as the node files it.
pub type SliceInput = Arc<Converted<ImportedSlice>>;

/// What changed in the node's inputs.
#[derive(Clone, Debug)]
pub enum Change {
    /// Every import and every slice (a directory read, a standalone merge).
    Snapshot {
        /// Every import.
        imports: Vec<ImportInput>,
        /// Every imported slice.
        slices: Vec<SliceInput>,
    },
    /// The complete list of imports (a watch's first list or a re-list).
    Imports(Vec<ImportInput>),
    /// The complete list of imported slices.
    Slices(Vec<SliceInput>),
    /// An import was added or modified.
    Import(ImportInput),
    /// The import with this namespace/name was deleted.
    ImportDeleted(NamespacedName),
    /// A slice was added or modified (possibly moved to another service by its label).
    Slice(SliceInput),
    /// The slice with this namespace/name was deleted.
    SliceDeleted(NamespacedName),
    /// Changes filed together, so that the node never syncs between them (one file's
    /// update: a slice renamed in it is a deletion and an addition).
    Batch(Vec<Change>),
}

impl Change {
    /// Every import and slice as one change, converted with `names` (a directory read, a
    /// merge's output).
    pub fn snapshot<'a>(
        imports: impl IntoIterator<Item = &'a ServiceImport>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
        names: &Interner,
    ) -> Change {
        Change::Snapshot {
            imports: imports
                .into_iter()
                .map(|si| import_input(si, names))
                .collect(),
            slices: slices.into_iter().map(|s| slice_input(s, names)).collect(),
        }
    }
}

/// A record the merge made, filed as the node files converted objects.
pub fn record_input<T>(record: T) -> Arc<Converted<T>> {
    Arc::new(Converted::new(record, Vec::new()))
}

/// A ServiceImport converted for the node (status, labels and annotations dropped).
pub fn import_input(si: &ServiceImport, names: &Interner) -> ImportInput {
    Arc::new(ImportRecord::from_k8s(si, names, false))
}

/// An imported EndpointSlice converted for the node.
pub fn slice_input(slice: &EndpointSlice, names: &Interner) -> SliceInput {
    Arc::new(ImportedSlice::from_k8s(slice, names))
}

/// The objects of one service.
#[derive(Clone, Debug, Default)]
struct ServiceObjects {
    imports: Vec<ImportInput>,
    /// Sorted by name, so two lists of the same slices compare equal.
    slices: Vec<SliceInput>,
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

/// The node's ServiceImports and imported EndpointSlices, by service.
#[derive(Clone, Debug, Default)]
pub struct InputIndex {
    services: HashMap<NamespacedName, ServiceObjects>,
    /// Every filed slice by namespace/name: where an update or delete finds the old version
    /// (and so the service it leaves when its label changed).
    slices: ById<SliceInput>,
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

    /// How many services have an import or a slice.
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
            Change::Batch(changes) => {
                for change in changes {
                    self.apply(change, dirty);
                }
            }
            Change::Imports(imports) => self.replace_imports(imports, dirty),
            Change::Slices(slices) => self.replace_slices(slices, dirty),
            Change::Import(si) => {
                let service = si.id().to_owned();
                let objects = self.services.entry(service.clone()).or_default();
                if !same(&objects.imports, std::slice::from_ref(&si)) {
                    objects.imports = vec![si];
                    dirty.insert(service);
                }
            }
            Change::ImportDeleted(service) => {
                if let Some(objects) = self.services.get_mut(&service)
                    && !objects.imports.is_empty()
                {
                    objects.imports.clear();
                    self.drop_if_empty(&service);
                    dirty.insert(service);
                }
            }
            Change::Slice(slice) => {
                if let Some(old) = self.slices.get(slice.id())
                    && (Arc::ptr_eq(old, &slice) || **old == *slice)
                {
                    return;
                }
                self.remove_slice(slice.id(), dirty);
                if let Some(service) = slice.service().cloned() {
                    self.slices.insert(slice.clone());
                    let slices = &mut self.services.entry(service.clone()).or_default().slices;
                    let at = slices.partition_point(|s| s.id().name <= slice.id().name);
                    slices.insert(at, slice);
                    dirty.insert(service);
                }
            }
            Change::SliceDeleted(id) => self.remove_slice(id.id_ref(), dirty),
        }
    }

    /// Unfiles the slice `id`, if filed.
    fn remove_slice(&mut self, id: IdRef<'_>, dirty: &mut BTreeSet<NamespacedName>) {
        let Some(old) = self.slices.remove(id) else {
            return;
        };
        let Some(service) = old.service().cloned() else {
            return;
        };
        if let Some(objects) = self.services.get_mut(&service) {
            objects.slices.retain(|s| s.id().name != old.id().name);
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

    fn replace_imports(&mut self, imports: Vec<ImportInput>, dirty: &mut BTreeSet<NamespacedName>) {
        self.imports_listed = true;
        let mut new: HashMap<NamespacedName, Vec<ImportInput>> =
            HashMap::with_capacity(imports.len());
        for si in imports {
            new.entry(si.id().to_owned()).or_default().push(si);
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
        for (service, mut imports) in new {
            // Duplicates (a directory defining one import twice) in a fixed order.
            if imports.len() > 1 {
                imports.sort_by_cached_key(|c| format!("{:?}", c.record()));
            }
            let objects = self.services.entry(service.clone()).or_default();
            if !same(&objects.imports, &imports) {
                dirty.insert(service);
            }
            objects.imports = imports;
        }
    }

    fn replace_slices(&mut self, slices: Vec<SliceInput>, dirty: &mut BTreeSet<NamespacedName>) {
        self.slices_listed = true;
        let mut by_name = ById::with_capacity(slices.len());
        let mut new: HashMap<NamespacedName, Vec<SliceInput>> = HashMap::new();
        for slice in slices {
            // Slices without the label belong to no service (the sources select on it).
            if let Some(service) = slice.service().cloned() {
                by_name.insert(slice.clone());
                new.entry(service).or_default().push(slice);
            }
        }
        self.slices = by_name;
        for list in new.values_mut() {
            list.sort_by(|a, b| a.id().name.cmp(b.id().name));
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
