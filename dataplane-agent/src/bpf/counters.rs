//! `MCS_COUNTERS` as the agent reads it: one array, a row of `stride` entries per possible CPU,
//! each indexed by frontend id (the map ABI in `dataplane-ebpf`). A snapshot reads each row's
//! used ids with one batch lookup, so it costs a syscall per CPU, not per frontend and CPU.

use std::{collections::BTreeMap, os::fd::BorrowedFd};

use aya::maps::{MapData, MapType};
use dataplane_ebpf::{Counters, PIN_VERSION};

use super::kernel::{KernelMapError, read_array};

/// The rows of `MCS_COUNTERS`: one past the highest possible CPU number (programs index the
/// rows by CPU number, and the possible CPUs need not be numbered without gaps).
pub fn possible_cpus() -> Result<u32, KernelMapError> {
    const POSSIBLE: &str = "/sys/devices/system/cpu/possible";
    let text = std::fs::read_to_string(POSSIBLE)
        .map_err(|e| KernelMapError::Cpus(format!("{POSSIBLE}: {e}")))?;
    highest_cpu(&text)
        .map(|n| n + 1)
        .ok_or_else(|| KernelMapError::Cpus(format!("{POSSIBLE}: cannot parse {text:?}")))
}

/// The highest CPU number of a CPU list (`0-3,8-11`): its last number.
fn highest_cpu(list: &str) -> Option<u32> {
    list.trim()
        .rsplit([',', '-'])
        .next()
        .and_then(|n| n.parse().ok())
}

/// The pinned counters array and its row layout.
pub struct CounterRows {
    map: MapData,
    rows: u32,
    stride: u32,
}

/// Whether a pinned counters map has this build's layout: an array of [`Counters`], a whole
/// number of rows of `cpus`. Returns its stride.
pub fn stride_of(
    map_type: Option<MapType>,
    value_size: u32,
    entries: u32,
    cpus: u32,
) -> Result<u32, String> {
    let value_size_wanted = std::mem::size_of::<Counters>() as u32;
    if map_type != Some(MapType::Array) || value_size != value_size_wanted {
        return Err(format!(
            "not an array of {value_size_wanted}-byte counters (map ABI v{PIN_VERSION}): pinned by another version of the agent"
        ));
    }
    if cpus == 0 || !entries.is_multiple_of(cpus) || entries / cpus < 2 {
        return Err(format!(
            "{entries} entries are not a row per CPU for {cpus} CPUs"
        ));
    }
    Ok(entries / cpus)
}

impl CounterRows {
    /// The pinned `MCS_COUNTERS`, its rows `cpus` long.
    pub fn new(map: MapData, cpus: u32) -> Result<Self, KernelMapError> {
        let info = map.info().map_err(|source| KernelMapError::Read {
            name: dataplane_ebpf::map_names::COUNTERS,
            source,
        })?;
        let stride = stride_of(
            info.map_type().ok(),
            info.value_size(),
            info.max_entries(),
            cpus,
        )
        .map_err(KernelMapError::CounterLayout)?;
        Ok(CounterRows {
            map,
            rows: cpus,
            stride,
        })
    }

    /// The array's fd, for the batch writes that reset an id's entries.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.map.fd().as_fd()
    }

    /// The indexes of frontend `id`'s entries, one per CPU (none when `id` is past a row).
    pub fn entries_of(&self, id: u32) -> impl Iterator<Item = u32> + use<> {
        let (stride, rows) = (self.stride, if id < self.stride { self.rows } else { 0 });
        (0..rows).map(move |cpu| cpu * stride + id)
    }

    /// The counters of `ids`, each summed over CPUs.
    pub fn sums(&self, ids: &[u32]) -> std::io::Result<BTreeMap<u32, Counters>> {
        let mut sums = BTreeMap::new();
        // Ids 1..=last of every row: ids are handed out lowest first, so the range is dense.
        let Some(last) = ids.iter().copied().filter(|&id| id < self.stride).max() else {
            return Ok(sums);
        };
        for cpu in 0..self.rows {
            let row: Vec<Counters> = read_array(self.fd(), cpu * self.stride + 1, last as usize)?;
            for &id in ids.iter().filter(|&&id| (1..=last).contains(&id)) {
                let c = row[id as usize - 1];
                let sum: &mut Counters = sums.entry(id).or_default();
                sum.translations += c.translations;
                sum.affinity_hits += c.affinity_hits;
                sum.rejects += c.rejects;
            }
        }
        Ok(sums)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_run_to_the_highest_possible_cpu() {
        assert_eq!(highest_cpu("0-3\n"), Some(3));
        assert_eq!(highest_cpu("0"), Some(0));
        assert_eq!(highest_cpu("0-3,8-11"), Some(11));
        assert_eq!(highest_cpu("0,2,5"), Some(5));
        assert_eq!(highest_cpu(""), None);
    }

    #[test]
    fn a_pinned_map_of_another_layout_is_refused() {
        let array = Some(MapType::Array);
        assert_eq!(stride_of(array, 32, 2 * 65537, 2), Ok(65537));
        // v4: a per-CPU array of 24-byte counters.
        assert!(stride_of(Some(MapType::PerCpuArray), 24, 65537, 2).is_err());
        assert!(stride_of(array, 24, 2 * 65537, 2).is_err());
        // Rows made for another number of CPUs.
        assert!(stride_of(array, 32, 3 * 65537, 2).is_err());
        assert!(stride_of(array, 32, 65537, 0).is_err());
    }
}
