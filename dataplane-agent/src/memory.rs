//! Handing freed memory back to the kernel. The agent's binary uses mimalloc, which keeps freed
//! pages for reuse and purges them only as later allocations come by. After a large sync (the
//! first full one, a relist, a re-read directory) the node, like the controller after a large
//! pass, goes idle with the parse's and the build's transients still resident, and the kubelet
//! counts them against the pod's limit.

use std::{
    cell::Cell,
    sync::atomic::{AtomicU64, Ordering},
};

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (include/mimalloc.h), which the
/// bindings do not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes the allocator return freed pages to the kernel at once instead of after a delay (a
/// second by default, counted only while the thread keeps allocating, so an idle agent kept
/// them). The cost is a few more `madvise` calls while a large sync frees its transients.
/// `MIMALLOC_PURGE_DELAY` in the environment still decides, for whoever wants to tune it.
pub fn configure() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an option's value; no pointers involved.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
    }
}

/// Services rebuilt at once from which a sync is large enough to collect after.
pub const LARGE_SYNC_SERVICES: usize = 1024;

/// Bumped by every [`release_freed`]: each runtime worker collects once per bump.
static COLLECTIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last [`COLLECTIONS`] this thread has collected for.
    static COLLECTED: Cell<u64> = const { Cell::new(0) };
}

fn collect_this_thread() {
    // SAFETY: mi_collect takes no pointers and may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Returns the memory freed so far to the kernel. It costs a walk of the allocator's pages (a
/// few milliseconds), so it runs after large syncs only. With another global allocator (the
/// library's tests) it has nothing to collect.
///
/// mimalloc's pages belong to the thread that allocated from them: what this thread frees of
/// another thread's objects (the records a watcher task converted on a runtime worker) waits
/// in that page until its owner collects. So every runtime worker is asked to collect too, the
/// next time it goes idle ([`on_worker_idle`]).
pub fn release_freed() {
    collect_this_thread();
    COLLECTIONS.fetch_add(1, Ordering::Release);
}

/// For the runtime's `on_thread_park`: collects this worker's pages once after each
/// [`release_freed`]; otherwise one atomic load.
pub fn on_worker_idle() {
    let wanted = COLLECTIONS.load(Ordering::Acquire);
    if COLLECTED.get() != wanted {
        COLLECTED.set(wanted);
        collect_this_thread();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_purge_delay_option_is_the_one_configured() {
        // The bindings give the option no name: check the number against mimalloc 3's
        // default for it (1,000 ms, src/options.c) and that setting it reads back.
        // SAFETY: reads and sets an option's value; no pointers involved.
        unsafe {
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                assert_eq!(
                    libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY),
                    1000
                );
            }
            super::configure();
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                assert_eq!(
                    libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY),
                    0
                );
            }
        }
    }
}
