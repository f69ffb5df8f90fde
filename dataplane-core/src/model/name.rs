//! Interned names: the namespaces, service names, cluster ids and port names that every record
//! repeats (a service's name appears in its import and in each member's slices) are stored once
//! and shared.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, PoisonError},
};

use super::records::SlicePort;

/// A shared, immutable name. Equal names from one [`Interner`] share one allocation; names
/// compare by content whatever their origin.
pub type Name = Arc<str>;

/// Hands out one shared [`Name`] per distinct text. Sources that convert many objects (a
/// watcher, a directory reader) share one interner; it is safe to use from several threads.
///
/// Names nothing else holds any more are dropped by [`Interner::purge`], which the sources
/// call after a complete list, so the interner never grows beyond the names in use plus one
/// list's worth of churn.
///
/// It also shares slices' port lists, which repeat across the clusters of a service and
/// across services (`http`/80 is in most of them).
#[derive(Debug, Default)]
pub struct Interner {
    names: Mutex<HashSet<Name>>,
    port_lists: Mutex<HashSet<Arc<[SlicePort]>>>,
}

impl Interner {
    /// An empty interner.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shared name for `text`.
    pub fn intern(&self, text: &str) -> Name {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(name) = names.get(text) {
            return Arc::clone(name);
        }
        let name: Name = Arc::from(text);
        names.insert(Arc::clone(&name));
        name
    }

    /// The shared list for `ports`.
    pub fn port_list(&self, ports: Vec<SlicePort>) -> Arc<[SlicePort]> {
        let mut lists = self
            .port_lists
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(list) = lists.get(&ports[..]) {
            return Arc::clone(list);
        }
        let list: Arc<[SlicePort]> = Arc::from(ports);
        lists.insert(Arc::clone(&list));
        list
    }

    /// Drops the port lists and names only the interner still holds (the lists first: they
    /// hold names).
    pub fn purge(&self) {
        let mut lists = self
            .port_lists
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        lists.retain(|l| Arc::strong_count(l) > 1);
        drop(lists);
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        names.retain(|n| Arc::strong_count(n) > 1);
    }

    /// How many names the interner holds.
    pub fn len(&self) -> usize {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// How many port lists the interner holds.
    pub fn port_list_count(&self) -> usize {
        self.port_lists
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether the interner holds no name.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_share_one_name_until_nobody_holds_it() {
        let interner = Interner::new();
        let a = interner.intern("web");
        let b = interner.intern("web");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(interner.len(), 1);
        drop((a, b));
        let _c = interner.intern("api");
        interner.purge();
        assert_eq!(interner.len(), 1, "only the held name stays");
    }

    #[test]
    fn equal_port_lists_share_one_allocation_until_nobody_holds_it() {
        let interner = Interner::new();
        let port = |n: u16| SlicePort {
            name: interner.intern("http"),
            protocol: super::super::records::PortProtocol::Tcp,
            port: n,
            app_protocol: None,
        };
        let a = interner.port_list(vec![port(80)]);
        let b = interner.port_list(vec![port(80)]);
        let c = interner.port_list(vec![port(8080)]);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(c[0].port, 8080);
        drop((a, b));
        interner.purge();
        let d = interner.port_list(vec![port(80)]);
        assert_eq!(
            Arc::strong_count(&d),
            2,
            "a fresh list: the old one was purged"
        );
        assert_eq!(Arc::strong_count(&c), 2, "the held list stays");
    }
}
