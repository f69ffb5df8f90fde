//! `MCS_COUNTERS` as the agent reads it: the array memory-mapped read-only, a row of `stride`
//! entries per possible CPU, each indexed by frontend id (the map ABI in `dataplane-ebpf`).
//! Summing a frontend's counters reads `cpus` entries of memory, not `cpus` syscalls.

use std::{
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::{MapData, MapType};
use dataplane_ebpf::{BPF_F_MMAPABLE, Counters, map_names};

use super::kernel::KernelMapError;

/// The pinned counters array, mapped into this process.
pub struct CounterRows {
    map: MapData,
    /// `entries` values of [`Counters`], shared with the programs that write them.
    base: NonNull<Counters>,
    mapped_len: usize,
    entries: u32,
    stride: u32,
}

// SAFETY: the mapping is only read, through atomic loads (see `sum`), and lives as long as
// `self`; the programs write it concurrently whatever this process does.
unsafe impl Send for CounterRows {}
unsafe impl Sync for CounterRows {}

impl CounterRows {
    /// Maps `map` (the pinned `MCS_COUNTERS`) for reading, its rows `cpus` long.
    pub fn map(map: MapData, cpus: u32) -> Result<Self, KernelMapError> {
        let info = map.info().map_err(|source| KernelMapError::Read {
            name: map_names::COUNTERS,
            source,
        })?;
        let value_size = std::mem::size_of::<Counters>();
        let is_array = matches!(info.map_type(), Ok(MapType::Array));
        if !is_array
            || info.value_size() as usize != value_size
            || info.map_flags() & BPF_F_MMAPABLE == 0
        {
            return Err(KernelMapError::CounterLayout(format!(
                "expected a memory-mappable array of {value_size}-byte values (map ABI v{})",
                dataplane_ebpf::PIN_VERSION
            )));
        }
        let entries = info.max_entries();
        let stride = entries / cpus.max(1);
        if stride == 0 {
            return Err(KernelMapError::CounterLayout(format!(
                "{entries} entries cannot hold a row for each of {cpus} CPUs"
            )));
        }
        let mapped_len = entries as usize * value_size;
        // SAFETY: a fresh shared read-only mapping of the map's values (an mmapable array maps
        // them from offset 0); checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(KernelMapError::MapCounters(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(ptr.cast::<Counters>()).ok_or_else(|| {
            KernelMapError::CounterLayout("mmap returned a null mapping".to_owned())
        })?;
        Ok(CounterRows {
            map,
            base,
            mapped_len,
            entries,
            stride,
        })
    }

    /// The array's fd, for the batch writes that reset an id's entries.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.map.fd().as_fd()
    }

    /// The indexes of frontend `id`'s entries, one per CPU (none when `id` is past a row).
    pub fn entries_of(&self, id: u32) -> impl Iterator<Item = u32> + use<> {
        let (stride, entries) = (self.stride, self.entries);
        let rows = if id < stride { entries / stride } else { 0 };
        (0..rows).map(move |cpu| cpu * stride + id)
    }

    /// Frontend `id`'s counters summed over CPUs.
    pub fn sum(&self, id: u32) -> Counters {
        let mut sum = Counters::default();
        for index in self.entries_of(id) {
            // SAFETY: `index < entries`, inside the mapping; each field is an aligned u64 that
            // a program may be incrementing, so it is read atomically (a plain read would be
            // a data race).
            let fields = unsafe {
                &*self
                    .base
                    .as_ptr()
                    .add(index as usize)
                    .cast::<[AtomicU64; 4]>()
            };
            sum.translations += fields[0].load(Ordering::Relaxed);
            sum.affinity_hits += fields[1].load(Ordering::Relaxed);
            sum.rejects += fields[2].load(Ordering::Relaxed);
        }
        sum
    }
}

impl Drop for CounterRows {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped_len) };
    }
}
