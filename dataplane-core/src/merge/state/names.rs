//! The names of imported slices: unique per namespace, handed out in service order.

use std::{borrow::Cow, collections::BTreeSet};

use foldhash::{HashMap, HashSet};

use super::Contention;
use crate::merge::slices;
use crate::model::{NamespacedName, name::Name, records::ImportedSlice};

/// The names of imported slices in use, by namespace, and which plain names more than one
/// service wanted.
#[derive(Debug, Default)]
pub(super) struct SliceNames {
    /// The names are the slices' own (shared, not copied).
    used: HashMap<Name, HashMap<Name, NamespacedName>>,
    contested: HashSet<(Name, String)>,
}

impl SliceNames {
    /// Gives `owner` a unique name for `candidate` in `namespace` (`candidate` itself when it
    /// is free and short enough). With `batch`, the update's services: a name held by a
    /// service outside it that sorts after `owner` is contention (a full merge would give
    /// `owner` that name).
    pub(super) fn claim(
        &mut self,
        namespace: &Name,
        candidate: &Name,
        salt: &dyn Fn() -> String,
        owner: &NamespacedName,
        batch: Option<&BTreeSet<NamespacedName>>,
    ) -> Result<Name, Contention> {
        let used = match self.used.get_mut(namespace) {
            Some(u) => u,
            None => self.used.entry(namespace.clone()).or_default(),
        };
        let mut name = slices::bounded(candidate, salt);
        let mut n = 0u32;
        while let Some(holder) = used.get(&*name) {
            if let Some(batch) = batch
                && owner < holder
                && !batch.contains(holder)
            {
                return Err(Contention);
            }
            self.contested
                .insert((namespace.clone(), candidate.to_string()));
            n += 1;
            name = Cow::Owned(slices::renamed(candidate, salt, n));
        }
        let name = match name {
            Cow::Borrowed(_) => Name::clone(candidate),
            Cow::Owned(other) => Name::from(other),
        };
        used.insert(Name::clone(&name), owner.clone());
        Ok(name)
    }

    /// Frees the names of `slices`. Contention when another service wanted one of them: it
    /// may get it now.
    pub(super) fn release<'s>(
        &mut self,
        slices: impl IntoIterator<Item = &'s ImportedSlice>,
    ) -> Result<(), Contention> {
        let mut contended = false;
        for s in slices {
            if let Some(used) = self.used.get_mut(&s.service.namespace) {
                used.remove(&*s.name);
            }
            contended |= self
                .contested
                .contains(&(s.service.namespace.clone(), s.name.to_string()));
        }
        if contended { Err(Contention) } else { Ok(()) }
    }
}
