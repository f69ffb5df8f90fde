//! Interned names: the namespaces, service names, cluster ids and port names that every record
//! repeats (a service's name appears in its import and in each member's slices) are stored once
//! and shared.

use std::sync::{
    Arc, Mutex, PoisonError,
    atomic::{AtomicUsize, Ordering},
};

use foldhash::HashSet;

use super::records::SlicePort;

/// A shared, immutable name. Equal names from one [`Interner`] share one allocation; names
/// compare by content whatever their origin.
pub type Name = Arc<str>;

/// Hands out one shared [`Name`] per distinct text. Sources that convert many objects (a
/// watcher, a directory reader) share one interner; it is safe to use from several threads.
///
/// Names nothing else holds any more are dropped by [`Interner::purge`], which the sources
/// call after a complete list, and which the interner runs itself once it has taken in more
/// new entries than it kept at its last purge (at least [`Interner::PURGE_AFTER`]): a watch
/// that runs for weeks without a re-list, over namespaces and services that come and go,
/// holds at most about twice the names in use, and each purge is paid for by as many new
/// entries.
///
/// It also shares slices' port lists, which repeat across the clusters of a service and
/// across services (`http`/80 is in most of them).
#[derive(Debug, Default)]
pub struct Interner {
    names: Mutex<HashSet<Name>>,
    port_lists: Mutex<HashSet<Arc<[SlicePort]>>>,
    /// Names and lists added since the last purge.
    added: AtomicUsize,
    /// Names and lists the last purge kept.
    kept: AtomicUsize,
}

impl Interner {
    /// The fewest new entries after which the interner purges itself.
    pub const PURGE_AFTER: usize = 1024;

    /// An empty interner.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts a new entry, and purges once they outnumber what the last purge kept. Called
    /// with no lock held.
    fn added_one(&self) {
        let added = self.added.fetch_add(1, Ordering::Relaxed) + 1;
        if added > self.kept.load(Ordering::Relaxed).max(Self::PURGE_AFTER) {
            self.purge();
        }
    }

    /// The shared name for `text`.
    pub fn intern(&self, text: &str) -> Name {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(name) = names.get(text) {
            return Arc::clone(name);
        }
        let name: Name = Arc::from(text);
        names.insert(Arc::clone(&name));
        drop(names);
        self.added_one();
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
        drop(lists);
        self.added_one();
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
        let kept_lists = lists.len();
        drop(lists);
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        names.retain(|n| Arc::strong_count(n) > 1);
        self.kept.store(kept_lists + names.len(), Ordering::Relaxed);
        self.added.store(0, Ordering::Relaxed);
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

    /// Names that come and go without a complete list (a long watch) are dropped by the
    /// interner itself: it holds the names in use and at most about as many again.
    #[test]
    fn churn_without_a_purge_call_keeps_the_interner_bounded() {
        let interner = Interner::new();
        let held: Vec<Name> = (0..3000)
            .map(|i| interner.intern(&format!("kept-{i}")))
            .collect();
        let mut most = 0;
        for i in 0..100_000 {
            drop(interner.intern(&format!("gone-{i}")));
            most = most.max(interner.len());
        }
        assert!(most <= 2 * held.len() + 2, "{most}");
        assert!(held.iter().all(|n| Arc::ptr_eq(n, &interner.intern(n))));
        // Lists count the same way.
        let lists = Interner::new();
        for port in 0..20_000u16 {
            drop(lists.port_list(vec![SlicePort {
                name: lists.intern("http"),
                protocol: super::super::records::PortProtocol::Tcp,
                port,
                app_protocol: None,
            }]));
        }
        assert!(
            lists.port_list_count() <= Interner::PURGE_AFTER + 1,
            "{}",
            lists.port_list_count()
        );
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
