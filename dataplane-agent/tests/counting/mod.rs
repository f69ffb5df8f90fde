//! Memory accounting for the memory tests: a global allocator that counts the live heap bytes
//! of its test binary, and maps that keep nothing.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicUsize, Ordering},
};

use dataplane_agent::bpf::maps::{MapOp, MapWriteError, MapWriter};
use dataplane_ebpf::Slot;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only counts the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Maps that accept every write and keep nothing.
pub struct NullMaps;

impl MapWriter for NullMaps {
    fn apply(&mut self, _: &MapOp) -> Result<(), MapWriteError> {
        Ok(())
    }
    fn read_slots(&self, _: u32, count: u16) -> Result<Vec<Slot>, MapWriteError> {
        Ok(vec![Slot::default(); count as usize])
    }
    fn quiesce(&mut self) -> Result<(), MapWriteError> {
        Ok(())
    }
}

/// The heap bytes live now.
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}
