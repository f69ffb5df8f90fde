//! Handing freed memory back to the kernel. The agent's binary uses mimalloc, which keeps freed
//! pages for reuse and purges them only as later allocations come by. After a large sync (the
//! first full one, a relist, a re-read directory) the node goes idle with the parse's and the
//! build's transients still resident, and the kubelet counts them against the pod's limit.

/// Services rebuilt at once from which a sync is large enough to collect after.
pub const LARGE_SYNC_SERVICES: usize = 1024;

/// Returns the memory freed so far to the kernel. It costs a walk of the allocator's pages (a
/// few milliseconds), so it runs after large syncs only. With another global allocator (the
/// library's tests) it has nothing to collect.
pub fn release_freed() {
    // SAFETY: mi_collect takes no pointers and may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
