//! Id allocation for the maps: frontend ids, cluster ids (reference-counted) and slot ranges.
//!
//! Free ids and free slots are kept as ranges, so the bookkeeping costs per run of free space,
//! not per id or slot, whatever the capacities; every bound is checked (no id past the map's
//! capacity is ever handed out or adopted, and no arithmetic wraps).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use foldhash::{HashMap, HashMapExt};

/// What one insert into a [`RangeSet`] did: the runs `(start, len)` it absorbed and the run they
/// became.
type Merged = (Vec<(u32, u32)>, (u32, u32));

/// A set of `u32`s kept as disjoint, coalesced runs `start..start + len`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    runs: BTreeMap<u32, u32>,
    total: u64,
}

impl RangeSet {
    /// `start..start + len` (nothing when `len` is 0 or the run would pass `u32::MAX`).
    pub fn with(start: u32, len: u32) -> Self {
        let mut s = RangeSet::default();
        s.insert(start, len);
        s
    }

    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Number of runs (what the set costs in memory).
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    pub fn first(&self) -> Option<u32> {
        self.runs.keys().next().copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.runs.iter().map(|(s, l)| (*s, *l))
    }

    /// Whether all of `start..start + len` is in the set.
    pub fn contains(&self, start: u32, len: u32) -> bool {
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        self.runs
            .range(..=start)
            .next_back()
            .is_some_and(|(s, l)| u64::from(*s) + u64::from(*l) >= u64::from(end))
    }

    /// Adds `start..start + len`, merging with neighbours. Parts already present are not
    /// counted twice. Returns false (and adds nothing) when the run passes `u32::MAX`.
    pub fn insert(&mut self, start: u32, len: u32) -> bool {
        self.merge(start, len).is_some()
    }

    /// [`RangeSet::insert`], returning the runs it absorbed and the run they became.
    fn merge(&mut self, start: u32, len: u32) -> Option<Merged> {
        if len == 0 {
            return Some((Vec::new(), (start, 0)));
        }
        let end = start.checked_add(len)?;
        let (mut lo, mut hi) = (start, end);
        // Absorb every run that touches or overlaps [lo, hi).
        let touching: Vec<(u32, u32)> = self
            .runs
            .range(..=hi)
            .rev()
            .take_while(|(s, l)| u64::from(**s) + u64::from(**l) >= u64::from(lo))
            .map(|(s, l)| (*s, *l))
            .collect();
        for &(s, l) in &touching {
            self.runs.remove(&s);
            self.total -= u64::from(l);
            lo = lo.min(s);
            hi = hi.max(s + l);
        }
        self.runs.insert(lo, hi - lo);
        self.total += u64::from(hi - lo);
        Some((touching, (lo, hi - lo)))
    }

    /// Removes `start..start + len`, which must be in the set; false (nothing removed) if not.
    pub fn remove(&mut self, start: u32, len: u32) -> bool {
        if len == 0 {
            return true;
        }
        if !self.contains(start, len) {
            return false;
        }
        let Some((&s, &l)) = self.runs.range(..=start).next_back() else {
            return false;
        };
        self.runs.remove(&s);
        if s < start {
            self.runs.insert(s, start - s);
        }
        let (end, run_end) = (start + len, s + l);
        if end < run_end {
            self.runs.insert(end, run_end - end);
        }
        self.total -= u64::from(len);
        true
    }
}

/// Ids `1..=max`, lowest free first.
#[derive(Clone, Debug)]
pub struct IdPool {
    free: RangeSet,
    max: u32,
}

impl IdPool {
    /// Ids `1..=max` (`max` is capped at `u32::MAX - 1`, so no id computation can wrap).
    pub fn new(max: u32) -> Self {
        let max = max.min(u32::MAX - 1);
        IdPool {
            free: RangeSet::with(1, max),
            max,
        }
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    /// Ids still free.
    pub fn available(&self) -> u64 {
        self.free.len()
    }

    /// Ids in use.
    pub fn used(&self) -> u64 {
        u64::from(self.max) - self.free.len()
    }

    /// Takes the lowest free id.
    pub fn take_lowest(&mut self) -> Option<u32> {
        let id = self.free.first()?;
        self.free.remove(id, 1);
        Some(id)
    }

    /// Takes a given id (adoption); false when it is out of range or already taken.
    pub fn take(&mut self, id: u32) -> bool {
        self.free.remove(id, 1)
    }

    /// Gives an id back; ids out of range are ignored.
    pub fn release(&mut self, id: u32) {
        if (1..=self.max).contains(&id) {
            self.free.insert(id, 1);
        }
    }
}

/// A run of slots: `base..base + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotRange {
    pub base: u32,
    pub len: u32,
}

/// The slot array's free space. A range a frontend stops using goes to quarantine first: it
/// is free for good only after an RCU grace period ([`SlotSpace::settle`], once the maps have
/// quiesced), so no program can still be reading it when it is written again.
#[derive(Clone, Debug)]
pub struct SlotSpace {
    free: RangeSet,
    /// The free runs by (length, start): best fit.
    by_len: BTreeSet<(u32, u32)>,
    quarantine: RangeSet,
    capacity: u32,
}

impl SlotSpace {
    pub fn new(capacity: u32) -> Self {
        let mut s = SlotSpace {
            free: RangeSet::default(),
            by_len: BTreeSet::new(),
            quarantine: RangeSet::default(),
            capacity,
        };
        s.add_free(0, capacity);
        s
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slots free now.
    pub fn free(&self) -> u64 {
        self.free.len()
    }

    /// Slots waiting for a grace period.
    pub fn quarantined(&self) -> u64 {
        self.quarantine.len()
    }

    /// Slots in use (neither free nor in quarantine).
    pub fn used(&self) -> u64 {
        u64::from(self.capacity) - self.free.len() - self.quarantine.len()
    }

    /// Free runs (the allocator's memory cost).
    pub fn runs(&self) -> usize {
        self.free.runs() + self.quarantine.runs()
    }

    /// The longest free run.
    pub fn largest_free(&self) -> u32 {
        self.by_len.iter().next_back().map_or(0, |(l, _)| *l)
    }

    fn add_free(&mut self, start: u32, len: u32) {
        // Merging may join neighbours: re-index the runs the new one absorbed.
        if let Some((absorbed, (s, l))) = self.free.merge(start, len)
            && l > 0
        {
            for (s, l) in absorbed {
                self.by_len.remove(&(l, s));
            }
            self.by_len.insert((l, s));
        }
    }

    /// A free run of `len` slots (best fit, lowest start among equals); `None` when no free
    /// run is long enough. `len == 0` gets the empty range at 0.
    pub fn alloc(&mut self, len: u32) -> Option<SlotRange> {
        if len == 0 {
            return Some(SlotRange { base: 0, len: 0 });
        }
        let &(run_len, start) = self.by_len.range((len, 0)..).next()?;
        self.by_len.remove(&(run_len, start));
        self.free.remove(start, len);
        if run_len > len {
            self.by_len.insert((run_len - len, start + len));
        }
        Some(SlotRange { base: start, len })
    }

    /// Marks a range in use (adoption); false when it is not wholly free.
    pub fn reserve(&mut self, r: SlotRange) -> bool {
        if r.len == 0 {
            return true;
        }
        let Some((&s, &l)) = self.free.runs.range(..=r.base).next_back() else {
            return false;
        };
        if !self.free.remove(r.base, r.len) {
            return false;
        }
        self.by_len.remove(&(l, s));
        if s < r.base {
            self.by_len.insert((r.base - s, s));
        }
        let (end, run_end) = (r.base + r.len, s + l);
        if end < run_end {
            self.by_len.insert((run_end - end, end));
        }
        true
    }

    /// A range no frontend entry points at any more: free after the next grace period.
    pub fn release(&mut self, r: SlotRange) {
        self.quarantine.insert(r.base, r.len);
    }

    /// Gives back an allocation that was never pointed at: free at once.
    pub fn unalloc(&mut self, r: SlotRange) {
        self.add_free(r.base, r.len);
    }

    /// Everything in quarantine becomes free: call only after the maps quiesced (a grace
    /// period has passed since the ranges were released).
    pub fn settle(&mut self) {
        let q = std::mem::take(&mut self.quarantine);
        for (s, l) in q.iter() {
            self.add_free(s, l);
        }
    }
}

/// Cluster-name ids, reference-counted by the frontends whose slots name them: an id no
/// frontend uses is deleted and freed, so clusters that come and go never fill the map.
#[derive(Clone, Debug)]
pub struct Clusters {
    by_name: HashMap<Arc<str>, (u16, u32)>,
    names: HashMap<u16, Arc<str>>,
    ids: IdPool,
}

impl Clusters {
    /// Ids `1..=capacity` (the slots hold a `u16`).
    pub fn new(capacity: u32) -> Self {
        Clusters {
            by_name: HashMap::new(),
            names: HashMap::new(),
            ids: IdPool::new(capacity.min(u32::from(u16::MAX))),
        }
    }

    /// The name of an id, shared.
    pub fn name(&self, id: u16) -> Option<Arc<str>> {
        self.names.get(&id).cloned()
    }

    pub fn id(&self, name: &str) -> Option<u16> {
        self.by_name.get(name).map(|(id, _)| *id)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn capacity(&self) -> u32 {
        self.ids.max()
    }

    /// Ids still free.
    pub fn available(&self) -> u64 {
        self.ids.available()
    }

    /// The id of `name`, taking a new one (with no references yet) if it has none; `None`
    /// when every id is taken.
    pub fn intern(&mut self, name: &Arc<str>) -> Option<(u16, bool)> {
        if let Some((id, _)) = self.by_name.get(name) {
            return Some((*id, false));
        }
        let id = u16::try_from(self.ids.take_lowest()?).ok()?;
        self.by_name.insert(name.clone(), (id, 0));
        self.names.insert(id, name.clone());
        Some((id, true))
    }

    /// Adopts a pinned `id → name`; false (nothing taken) if the id is out of range or taken,
    /// or the name already has an id.
    pub fn adopt(&mut self, id: u16, name: Arc<str>) -> bool {
        if self.by_name.contains_key(&name) || !self.ids.take(u32::from(id)) {
            return false;
        }
        self.by_name.insert(name.clone(), (id, 0));
        self.names.insert(id, name);
        true
    }

    pub fn add_ref(&mut self, id: u16) {
        if let Some(name) = self.names.get(&id)
            && let Some((_, refs)) = self.by_name.get_mut(name)
        {
            *refs = refs.saturating_add(1);
        }
    }

    pub fn drop_ref(&mut self, id: u16) {
        if let Some(name) = self.names.get(&id)
            && let Some((_, refs)) = self.by_name.get_mut(name)
        {
            *refs = refs.saturating_sub(1);
        }
    }

    /// The ids nothing references, sorted.
    pub fn unused(&self) -> Vec<u16> {
        let mut ids: Vec<u16> = self
            .by_name
            .values()
            .filter(|(_, refs)| *refs == 0)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Forgets an id and frees it.
    pub fn remove(&mut self, id: u16) {
        if let Some(name) = self.names.remove(&id) {
            self.by_name.remove(&name);
            self.ids.release(u32::from(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_sets_coalesce_and_split() {
        let mut s = RangeSet::default();
        assert!(s.insert(10, 5));
        assert!(s.insert(20, 5));
        assert_eq!(s.runs(), 2);
        assert!(s.insert(15, 5), "bridges the gap");
        assert_eq!((s.runs(), s.len()), (1, 15));
        assert!(s.remove(12, 3));
        assert_eq!(s.iter().collect::<Vec<_>>(), [(10, 2), (15, 10)]);
        assert!(!s.remove(11, 3), "not wholly present");
        assert!(!s.insert(u32::MAX, 2), "never wraps");
        assert!(
            s.insert(0, 3) && s.insert(1, 1),
            "overlaps are not counted twice"
        );
        assert_eq!(s.len(), 15);
    }

    #[test]
    fn id_pools_are_bounded_and_never_wrap() {
        let mut p = IdPool::new(3);
        assert_eq!(
            (
                p.take_lowest(),
                p.take_lowest(),
                p.take_lowest(),
                p.take_lowest()
            ),
            (Some(1), Some(2), Some(3), None)
        );
        p.release(2);
        p.release(0);
        p.release(4);
        assert_eq!(p.available(), 1);
        assert_eq!(p.take_lowest(), Some(2));
        // Adoption refuses ids past the capacity instead of growing to them.
        let mut p = IdPool::new(u32::MAX);
        assert_eq!(p.max(), u32::MAX - 1);
        assert!(!p.take(u32::MAX), "past the capacity");
        assert!(p.take(u32::MAX - 1));
        assert!(!p.take(u32::MAX - 1), "taken twice");
        assert!(!p.take(0));
        assert_eq!(p.take_lowest(), Some(1));
        assert_eq!(p.used(), 2);
    }

    #[test]
    fn slot_space_fits_best_and_quarantines_what_it_frees() {
        let mut s = SlotSpace::new(100);
        let a = s.alloc(10).unwrap();
        let b = s.alloc(20).unwrap();
        assert_eq!((a.base, b.base), (0, 10));
        s.release(a);
        assert_eq!(s.quarantined(), 10);
        assert_eq!(
            s.alloc(71),
            None,
            "70 free, the quarantined 10 are not usable yet"
        );
        s.settle();
        let c = s.alloc(5).unwrap();
        assert_eq!(
            c.base, 0,
            "best fit: the 10-slot hole, not the 70-slot tail"
        );
        assert!(s.reserve(SlotRange { base: 50, len: 10 }));
        assert!(!s.reserve(SlotRange { base: 55, len: 10 }), "overlaps");
        assert_eq!(s.used(), 5 + 20 + 10);
        s.unalloc(c);
        assert_eq!(s.largest_free(), 40, "60..100");
        assert_eq!(s.alloc(0), Some(SlotRange { base: 0, len: 0 }));
    }

    #[test]
    fn clusters_are_freed_when_unreferenced() {
        let mut c = Clusters::new(2);
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let (ida, new) = c.intern(&a).unwrap();
        assert!(new);
        let (idb, _) = c.intern(&b).unwrap();
        assert_eq!(c.intern(&"c".into()), None, "full");
        c.add_ref(ida);
        assert_eq!(c.unused(), [idb]);
        c.remove(idb);
        assert_eq!(
            c.intern(&"c".into()),
            Some((idb, true)),
            "the freed id is reused"
        );
        c.drop_ref(ida);
        assert_eq!(c.unused(), [ida, idb]);
    }
}
