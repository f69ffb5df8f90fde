//! Records by the object id they carry ([`ById`]): a set whose buckets are the records
//! themselves (shared pointers, 8 bytes), where a map keyed by a copy of the id costs 40 bytes
//! a bucket. At 250,000 slices a hash table has 524,288 buckets, so the difference is 17 MB.

use std::{fmt, hash::BuildHasher as _, sync::Arc};

use foldhash::fast::RandomState;
use hashbrown::{HashTable, hash_table::Entry};

use super::{
    IdRef,
    member::{ExportRecord, LocalSlice, ServiceRecord},
    records::{Converted, ImportRecord, Record},
};

/// A record that names the object it stands for.
pub trait Identified {
    /// The object's namespace/name.
    fn object_id(&self) -> IdRef<'_>;
}

impl<T: Record> Identified for Arc<Converted<T>> {
    fn object_id(&self) -> IdRef<'_> {
        self.id()
    }
}

/// `Identified` for shared records of types that keep their id in a field.
macro_rules! identified_by_field {
    ($($record:ty => $field:ident),* $(,)?) => {$(
        impl Identified for Arc<$record> {
            fn object_id(&self) -> IdRef<'_> {
                self.$field.id_ref()
            }
        }
    )*};
}

// A ServiceImport is named after its service.
identified_by_field!(
    ServiceRecord => id,
    ExportRecord => id,
    LocalSlice => id,
    ImportRecord => service,
);

/// Records by the id they carry, one per id.
#[derive(Clone)]
pub struct ById<T> {
    table: HashTable<T>,
    /// Seeded per set, as the standard maps are: the ids come from other clusters' objects.
    hasher: RandomState,
}

impl<T> Default for ById<T> {
    fn default() -> Self {
        ById {
            table: HashTable::new(),
            hasher: RandomState::default(),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for ById<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.table.iter()).finish()
    }
}

impl<T: Identified> ById<T> {
    /// An empty set with room for `n` records.
    pub fn with_capacity(n: usize) -> Self {
        ById {
            table: HashTable::with_capacity(n),
            hasher: RandomState::default(),
        }
    }

    fn hash(hasher: &RandomState, id: IdRef<'_>) -> u64 {
        hasher.hash_one(id)
    }

    /// The record of `id`.
    pub fn get<'i>(&self, id: impl Into<IdRef<'i>>) -> Option<&T> {
        let id = id.into();
        self.table
            .find(Self::hash(&self.hasher, id), |r| r.object_id() == id)
    }

    /// The record of `id`, to change in place (its id must stay the same).
    pub fn get_mut<'i>(&mut self, id: impl Into<IdRef<'i>>) -> Option<&mut T> {
        let id = id.into();
        self.table
            .find_mut(Self::hash(&self.hasher, id), |r| r.object_id() == id)
    }

    /// Files `record`; returns the one it replaces.
    pub fn insert(&mut self, record: T) -> Option<T> {
        let hasher = &self.hasher;
        let hash = Self::hash(hasher, record.object_id());
        match self.table.entry(
            hash,
            |r| r.object_id() == record.object_id(),
            |r| Self::hash(hasher, r.object_id()),
        ) {
            Entry::Occupied(mut e) => Some(std::mem::replace(e.get_mut(), record)),
            Entry::Vacant(e) => {
                e.insert(record);
                None
            }
        }
    }

    /// Unfiles the record of `id`.
    pub fn remove<'i>(&mut self, id: impl Into<IdRef<'i>>) -> Option<T> {
        let id = id.into();
        self.table
            .find_entry(Self::hash(&self.hasher, id), |r| r.object_id() == id)
            .ok()
            .map(|e| e.remove().0)
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Every record, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.table.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NamespacedName;

    #[derive(Clone, Debug, PartialEq)]
    struct Rec(NamespacedName, u32);

    impl Identified for Rec {
        fn object_id(&self) -> IdRef<'_> {
            self.0.id_ref()
        }
    }

    fn id(name: &str) -> NamespacedName {
        NamespacedName::new("ns", name)
    }

    #[test]
    fn records_are_found_replaced_and_removed_by_the_id_they_carry() {
        let mut set = ById::default();
        assert_eq!(set.insert(Rec(id("a"), 1)), None);
        assert_eq!(set.insert(Rec(id("b"), 2)), None);
        assert_eq!(set.insert(Rec(id("a"), 3)), Some(Rec(id("a"), 1)));
        assert_eq!(set.len(), 2);
        assert_eq!(set.get(&id("a")), Some(&Rec(id("a"), 3)));
        set.get_mut(&id("b")).expect("filed").1 = 4;
        assert_eq!(set.remove(&id("b")), Some(Rec(id("b"), 4)));
        assert_eq!(set.remove(&id("b")), None);
        assert_eq!(set.get(&id("c")), None);
        let left: Vec<_> = set.iter().cloned().collect();
        assert_eq!(left, [Rec(id("a"), 3)]);
    }

    #[test]
    fn many_records_survive_the_table_growing() {
        let mut set = ById::with_capacity(4);
        for n in 0..10_000 {
            set.insert(Rec(id(&format!("s{n}")), n));
        }
        assert_eq!(set.len(), 10_000);
        assert!((0..10_000).all(|n| set.get(&id(&format!("s{n}"))).map(|r| r.1) == Some(n)));
    }
}
