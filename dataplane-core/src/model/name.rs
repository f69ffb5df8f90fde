//! Interned names: the namespaces, service names, cluster ids and port names that every record
//! repeats (a service's name appears in its import and in each member's slices) are stored once
//! and shared.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, PoisonError},
};

/// A shared, immutable name. Equal names from one [`Interner`] share one allocation; names
/// compare by content whatever their origin.
pub type Name = Arc<str>;

/// Hands out one shared [`Name`] per distinct text. Sources that convert many objects (a
/// watcher, a directory reader) share one interner; it is safe to use from several threads.
///
/// Names nothing else holds any more are dropped by [`Interner::purge`], which the sources
/// call after a complete list, so the interner never grows beyond the names in use plus one
/// list's worth of churn.
#[derive(Debug, Default)]
pub struct Interner {
    names: Mutex<HashSet<Name>>,
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

    /// Drops the names only the interner still holds.
    pub fn purge(&self) {
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
}
