//! The objects of one kind that the files of a directory define, kept file by file: what each
//! file defines, every definition of each object, and which one is used.
//!
//! A directory source re-reads only the files that changed and replaces what those files
//! define ([`FileObjects::replace`]); the objects whose used definition differs afterwards are
//! what it reports ([`FileObjects::changes`]), so a change costs the size of the file, not of
//! the directory.
//!
//! **Duplicates.** An object (namespace/name) defined more than once, in one file or in
//! several, is used in one definition: the smallest by [`Rank`], the rule the merge and the lb
//! table use for duplicates. It does not depend on file names or on the order of events, and
//! [`FileObjects::duplicates`] names the files so the source can warn.

use std::{
    cmp::Ordering,
    collections::{BTreeMap, btree_map::Entry},
    path::Path,
    sync::Arc,
};

use dataplane_core::{
    lb::inputs::{ImportInput, SliceInput},
    merge::DUPLICATE,
    model::{
        IdRef, NamespacedName,
        by_id::{ById, Identified},
        member::{ExportRecord, LocalSlice, ServiceRecord},
        records::ImportRecord,
    },
};
use smallvec::{SmallVec, smallvec};

/// The order that picks one of several definitions of an object: the smallest is used.
pub trait Rank {
    /// Compares two definitions of one object.
    fn rank(&self, other: &Self) -> Ordering;
}

/// A file, shared by every definition it holds.
pub type FileName = Arc<Path>;

#[derive(Clone, Debug)]
struct Definition<V> {
    file: FileName,
    document: usize,
    value: V,
}

/// The used definition of every object an update touched, as it was before the update.
#[derive(Debug)]
pub struct Before<V>(BTreeMap<NamespacedName, Option<V>>);

impl<V> Default for Before<V> {
    fn default() -> Self {
        Before(BTreeMap::new())
    }
}

/// The definitions of one object, never empty, sorted by file and document. Nearly every
/// object has one, kept inline: a list on the heap would cost a hundred bytes more per object,
/// which at 300,000 objects is 30 MB.
#[derive(Clone, Debug)]
struct Definitions<V>(SmallVec<[Definition<V>; 1]>);

impl<V: Identified> Identified for Definitions<V> {
    fn object_id(&self) -> IdRef<'_> {
        self.0[0].value.object_id()
    }
}

/// Objects of one kind by the file that defines them.
#[derive(Clone, Debug)]
pub struct FileObjects<V> {
    /// What each file defines, in document order (an object defined twice in a file, twice).
    files: BTreeMap<FileName, Vec<V>>,
    /// Every definition of each object, by the object's id.
    definitions: ById<Definitions<V>>,
}

impl<V> Default for FileObjects<V> {
    fn default() -> Self {
        FileObjects {
            files: BTreeMap::new(),
            definitions: ById::default(),
        }
    }
}

impl<V: Clone + PartialEq + Rank + Identified> FileObjects<V> {
    /// The used definition of `id`.
    pub fn get<'i>(&self, id: impl Into<IdRef<'i>>) -> Option<&V> {
        let definitions = self.definitions.get(id)?;
        definitions
            .0
            .iter()
            .reduce(|a, b| match b.value.rank(&a.value) {
                Ordering::Less => b,
                _ => a,
            })
            .map(|d| &d.value)
    }

    /// Replaces what `file` defines with `objects` (document index, object); an empty list
    /// forgets the file. `before` collects the used definitions the update replaces, for
    /// [`FileObjects::changes`].
    pub fn replace(&mut self, file: &FileName, objects: Vec<(usize, V)>, before: &mut Before<V>) {
        let old = match self.files.entry(file.clone()) {
            Entry::Occupied(e) if objects.is_empty() => e.remove(),
            Entry::Occupied(mut e) => {
                std::mem::replace(e.get_mut(), objects.iter().map(|o| o.1.clone()).collect())
            }
            Entry::Vacant(_) if objects.is_empty() => Vec::new(),
            Entry::Vacant(e) => {
                e.insert(objects.iter().map(|o| o.1.clone()).collect());
                Vec::new()
            }
        };
        for id in old
            .iter()
            .chain(objects.iter().map(|o| &o.1))
            .map(Identified::object_id)
        {
            if let Entry::Vacant(e) = before.0.entry(id.to_owned()) {
                e.insert(self.get(id).cloned());
            }
        }
        for id in old.iter().map(Identified::object_id) {
            // A list is never left empty in the set: its first definition names it.
            let only_this_file = match self.definitions.get_mut(id) {
                Some(list) if list.0.iter().all(|d| d.file == *file) => true,
                Some(list) => {
                    list.0.retain(|d| d.file != *file);
                    false
                }
                None => false,
            };
            if only_this_file {
                self.definitions.remove(id);
            }
        }
        for (document, value) in objects {
            let definition = Definition {
                file: file.clone(),
                document,
                value,
            };
            match self.definitions.get_mut(definition.value.object_id()) {
                Some(list) => {
                    let at = list
                        .0
                        .partition_point(|d| (&d.file, d.document) <= (file, document));
                    list.0.insert(at, definition);
                }
                None => {
                    self.definitions.insert(Definitions(smallvec![definition]));
                }
            }
        }
    }

    /// The objects whose used definition differs from the one in `before`, with the new one
    /// (`None`: no file defines it any more), in id order.
    pub fn changes(&self, before: Before<V>) -> Vec<(NamespacedName, Option<V>)> {
        before
            .0
            .into_iter()
            .filter_map(|(id, old)| {
                let new = self.get(&id);
                (new != old.as_ref()).then(|| (id.clone(), new.cloned()))
            })
            .collect()
    }

    /// Whether `file` defines anything.
    pub fn defines(&self, file: &Path) -> bool {
        self.files.contains_key(file)
    }

    /// The ids `file` defines, in document order.
    pub fn ids_of(&self, file: &Path) -> impl Iterator<Item = IdRef<'_>> {
        self.files
            .get(file)
            .into_iter()
            .flatten()
            .map(Identified::object_id)
    }

    /// How many objects are defined.
    pub fn len(&self) -> usize {
        self.definitions.len()
    }

    /// Whether no object is defined.
    pub fn is_empty(&self) -> bool {
        self.definitions.is_empty()
    }

    /// Every object with its used definition, in no particular order.
    pub fn used(&self) -> impl Iterator<Item = (IdRef<'_>, &V)> {
        self.definitions
            .iter()
            .map(Identified::object_id)
            .filter_map(|id| Some((id, self.get(id)?)))
    }

    /// Every definition, duplicates included, by file (sorted) and document.
    pub fn all(&self) -> impl Iterator<Item = (&FileName, &V)> {
        self.definitions
            .iter()
            .flat_map(|list| &list.0)
            .map(|d| ((&d.file, d.document), &d.value))
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .map(|((file, _), value)| (file, value))
    }

    /// The file of the first definition of each object (sorted), to name files in
    /// diagnostics.
    pub fn first_files(&self) -> impl Iterator<Item = (IdRef<'_>, &FileName)> {
        self.definitions
            .iter()
            .map(|list| (list.object_id(), &list.0[0].file))
    }

    /// The objects defined more than once, with the file of each definition (sorted).
    pub fn duplicates(&self) -> impl Iterator<Item = (IdRef<'_>, Vec<&FileName>)> {
        self.definitions
            .iter()
            .filter(|list| list.0.len() > 1)
            .map(|list| (list.object_id(), list.0.iter().map(|d| &d.file).collect()))
    }

    /// The files defining `id` when it is defined more than once.
    pub fn duplicate_files<'i>(&self, id: impl Into<IdRef<'i>>) -> Option<Vec<&FileName>> {
        let list = self.definitions.get(id).filter(|l| l.0.len() > 1)?;
        Some(list.0.iter().map(|d| &d.file).collect())
    }

    /// Warns about each object of `file` that is defined more than once (`kind` names it).
    pub fn warn_duplicates(&self, file: &Path, kind: &str) {
        let mut seen = std::collections::BTreeSet::new();
        for id in self.ids_of(file) {
            if !seen.insert(id) {
                continue;
            }
            if let Some(files) = self.duplicate_files(id) {
                let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
                tracing::warn!(
                    object = %format!("{kind} {id}"),
                    files = %files.join(", "),
                    "{DUPLICATE}"
                );
            }
        }
    }
}

/// The merge's rule ([`dataplane_core::merge`]): the smallest record.
impl Rank for Arc<ServiceRecord> {
    fn rank(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
}

/// The merge's rule: the smallest record.
impl Rank for Arc<ExportRecord> {
    fn rank(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
}

/// The merge's rule for slices ([`LocalSlice::duplicate_rank`]).
impl Rank for Arc<LocalSlice> {
    fn rank(&self, other: &Self) -> Ordering {
        self.duplicate_rank(other)
    }
}

/// The sticky-IP rule: the smallest IPs, then the smallest debug text.
impl Rank for Arc<ImportRecord> {
    fn rank(&self, other: &Self) -> Ordering {
        (&self.ips, format!("{self:?}")).cmp(&(&other.ips, format!("{other:?}")))
    }
}

/// The lb table's rule for imports: a usable definition before one that is not (a broken copy
/// must not hide a good one), then the smallest object JSON.
impl Rank for ImportInput {
    fn rank(&self, other: &Self) -> Ordering {
        let json = |c: &ImportInput| {
            c.record()
                .as_ref()
                .map(|r| serde_json::to_string(&r.to_k8s()).unwrap_or_default())
        };
        let key = |c: &ImportInput| (c.record().is_none(), json(c));
        key(self).cmp(&key(other))
    }
}

/// A usable definition before one that is not, then the smallest debug text.
impl Rank for SliceInput {
    fn rank(&self, other: &Self) -> Ordering {
        let key = |c: &SliceInput| (c.record().is_none(), format!("{c:?}"));
        key(self).cmp(&key(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A definition: the object's id and a value to tell definitions apart.
    #[derive(Clone, Debug, PartialEq)]
    struct Obj(NamespacedName, &'static str);

    impl Rank for Obj {
        fn rank(&self, other: &Self) -> Ordering {
            self.1.cmp(other.1)
        }
    }

    impl Identified for Obj {
        fn object_id(&self) -> IdRef<'_> {
            self.0.id_ref()
        }
    }

    fn id(name: &str) -> NamespacedName {
        NamespacedName::new("ns", name)
    }

    fn file(name: &str) -> FileName {
        Arc::from(Path::new(name))
    }

    fn replace(
        index: &mut FileObjects<Obj>,
        f: &str,
        objects: &[(&str, &'static str)],
    ) -> Vec<(NamespacedName, Option<&'static str>)> {
        let mut before = Before::default();
        let objects = objects
            .iter()
            .enumerate()
            .map(|(i, (n, v))| (i, Obj(id(n), v)))
            .collect();
        index.replace(&file(f), objects, &mut before);
        values(index.changes(before))
    }

    fn values(
        changes: Vec<(NamespacedName, Option<Obj>)>,
    ) -> Vec<(NamespacedName, Option<&'static str>)> {
        changes
            .into_iter()
            .map(|(id, o)| (id, o.map(|o| o.1)))
            .collect()
    }

    fn get(index: &FileObjects<Obj>, name: &str) -> Option<&'static str> {
        index.get(&id(name)).map(|o| o.1)
    }

    #[test]
    fn a_file_replaced_reports_only_what_differs() {
        let mut index = FileObjects::default();
        assert_eq!(
            replace(&mut index, "a.yaml", &[("x", "x1"), ("y", "y1")]),
            [(id("x"), Some("x1")), (id("y"), Some("y1"))]
        );
        assert_eq!(replace(&mut index, "b.yaml", &[("z", "z1")]).len(), 1);
        // a.yaml again: x unchanged, y changed, w new.
        assert_eq!(
            replace(
                &mut index,
                "a.yaml",
                &[("x", "x1"), ("y", "y2"), ("w", "w1")]
            ),
            [(id("w"), Some("w1")), (id("y"), Some("y2"))]
        );
        // a.yaml emptied: its objects go, b's stay.
        assert_eq!(
            replace(&mut index, "a.yaml", &[]),
            [(id("w"), None), (id("x"), None), (id("y"), None)]
        );
        assert!(!index.defines(Path::new("a.yaml")));
        assert_eq!(get(&index, "z"), Some("z1"));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn an_object_moved_between_files_in_one_update_is_no_change() {
        let mut index = FileObjects::default();
        replace(&mut index, "a.yaml", &[("x", "x1")]);
        let mut before = Before::default();
        index.replace(&file("a.yaml"), vec![], &mut before);
        index.replace(&file("b.yaml"), vec![(0, Obj(id("x"), "x1"))], &mut before);
        assert_eq!(index.changes(before), []);
        assert_eq!(
            index.ids_of(Path::new("b.yaml")).collect::<Vec<_>>(),
            [id("x").id_ref()]
        );
    }

    #[test]
    fn a_duplicate_uses_the_smallest_definition_whatever_the_order() {
        let mut one = FileObjects::default();
        replace(&mut one, "a.yaml", &[("x", "x2")]);
        assert_eq!(
            replace(&mut one, "b.yaml", &[("x", "x1")]),
            [(id("x"), Some("x1"))]
        );
        let mut two = FileObjects::default();
        replace(&mut two, "b.yaml", &[("x", "x1")]);
        assert_eq!(replace(&mut two, "a.yaml", &[("x", "x2")]), []);
        assert_eq!(get(&one, "x"), get(&two, "x"));
        let dups: Vec<_> = one.duplicates().collect();
        assert_eq!(
            dups,
            [(id("x").id_ref(), vec![&file("a.yaml"), &file("b.yaml")])]
        );
        // The smaller one's file goes: the other definition is used again.
        assert_eq!(replace(&mut one, "b.yaml", &[]), [(id("x"), Some("x2"))]);
        assert_eq!(one.duplicates().count(), 0);
        // Twice in one file: both are kept, one is used.
        replace(&mut one, "c.yaml", &[("y", "y2"), ("y", "y1")]);
        assert_eq!(get(&one, "y"), Some("y1"));
        assert_eq!(one.duplicate_files(&id("y")).map(|f| f.len()), Some(2));
        let all: Vec<_> = one
            .all()
            .map(|(f, v)| (f.to_string_lossy().into_owned(), v.1))
            .collect();
        assert_eq!(
            all,
            [
                ("a.yaml".to_owned(), "x2"),
                ("c.yaml".to_owned(), "y2"),
                ("c.yaml".to_owned(), "y1")
            ]
        );
    }
}
