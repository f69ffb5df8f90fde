//! The local cluster's namespaces, as the controller sees them. A ServiceImport exists in every
//! cluster where its namespace exists (KEP-1645); where it does not, the controller creates no
//! import or imported slice (the write would only fail, again and again) and writes them once
//! the namespace is created. A namespace that terminates takes no new objects either.

use std::collections::{BTreeMap, BTreeSet};

use tracing::info;

use crate::source::kube::NamespaceChange;

/// The namespaces objects can be written into; every one until the first list.
#[derive(Debug, Default)]
pub struct LocalNamespaces {
    /// By name, whether it takes new objects (false while terminating). `None` before the
    /// first list, or when namespaces cannot be read: then every namespace is written into.
    known: Option<BTreeMap<String, bool>>,
    /// Namespaces a service was skipped for, logged once each until they can be written into.
    skipped: BTreeSet<String>,
}

impl LocalNamespaces {
    /// Whether objects can be written into `namespace`.
    pub fn writable(&self, namespace: &str) -> bool {
        self.known
            .as_ref()
            .is_none_or(|known| known.get(namespace) == Some(&true))
    }

    /// Files `change`; the namespaces that could not be written into and now can.
    pub fn apply(&mut self, change: NamespaceChange) -> Vec<String> {
        // Before the first list every namespace counted as writable: nothing becomes so.
        let listed = self.known.is_some();
        let known = self.known.get_or_insert_with(BTreeMap::new);
        let opened: Vec<String> = match change {
            NamespaceChange::List(list) => {
                let list: BTreeMap<String, bool> = list.into_iter().collect();
                let opened = (list.iter())
                    .filter(|(name, live)| **live && known.get(*name) != Some(&true))
                    .map(|(name, _)| name.clone())
                    .collect();
                *known = list;
                opened
            }
            NamespaceChange::Put(name, live) => {
                let was_live = known.insert(name.clone(), live) == Some(true);
                if live && !was_live {
                    vec![name]
                } else {
                    Vec::new()
                }
            }
            NamespaceChange::Deleted(name) => {
                known.remove(&name);
                Vec::new()
            }
        };
        if !listed {
            return Vec::new();
        }
        for name in &opened {
            if self.skipped.remove(name) {
                info!(namespace = %name, "namespace created: writing its ServiceImports");
            }
        }
        opened
    }

    /// Records that a service of `namespace` was not written; logs the first time.
    pub fn skipped(&mut self, namespace: &str) {
        if self.skipped.insert(namespace.to_owned()) {
            info!(
                namespace,
                "namespace does not exist in this cluster (or is terminating): its \
                 ServiceImports and imported EndpointSlices are written once it is created"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[(&str, bool)]) -> NamespaceChange {
        NamespaceChange::List(names.iter().map(|(n, l)| ((*n).to_owned(), *l)).collect())
    }

    #[test]
    fn every_namespace_is_writable_until_the_first_list() {
        let mut ns = LocalNamespaces::default();
        assert!(ns.writable("demo"));
        assert!(ns.apply(list(&[("default", true)])).is_empty());
        assert!(ns.writable("default"));
        assert!(!ns.writable("demo"));
    }

    #[test]
    fn a_namespace_created_or_relisted_opens_and_a_terminating_one_closes() {
        let mut ns = LocalNamespaces::default();
        ns.apply(list(&[("default", true), ("old", false)]));
        assert!(!ns.writable("old"));
        assert_eq!(
            ns.apply(NamespaceChange::Put("demo".into(), true)),
            ["demo"]
        );
        assert!(ns.writable("demo"));
        // A change that keeps it writable opens nothing.
        assert!(
            ns.apply(NamespaceChange::Put("demo".into(), true))
                .is_empty()
        );
        assert!(
            ns.apply(NamespaceChange::Put("demo".into(), false))
                .is_empty()
        );
        assert!(!ns.writable("demo"));
        assert!(ns.apply(NamespaceChange::Deleted("demo".into())).is_empty());
        assert!(!ns.writable("demo"));
        // A relist that finds namespaces created meanwhile opens them.
        assert_eq!(
            ns.apply(list(&[("default", true), ("demo", true), ("old", true)])),
            ["demo", "old"]
        );
    }
}
