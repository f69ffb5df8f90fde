//! Planning one service's change for the writer ([`super::sync::MapSync`]): the writes, in
//! phases, with their undo, and the mirror updated as if they succeeded (rolled back if they do
//! not). Ids and slot ranges are taken from the pools at once, so the plans of one batch never
//! collide; what a change frees is given back only once it is written.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use dataplane_core::model::NamespacedName;
use dataplane_ebpf::{AffinityMatchKey, ClusterName, FRONTEND_F_AFFINITY, Slot};

use super::{
    convert::{addr_words, name_bytes, port_word},
    desired::{DesiredFrontend, DesiredService, FeAddr},
    ids::SlotRange,
    maps::{FeKey, MapKind, MapOp, MapWriter},
    sync::{Change, Installed, MapSync, SyncError, SyncReport, inline_backends},
};

/// The affinity-match keys of a backend set.
fn matches(id: u32, backends: impl Iterator<Item = ([u32; 4], u16)>) -> BTreeSet<AffinityMatchKey> {
    backends
        .map(|(addr, port)| AffinityMatchKey {
            frontend_id: id,
            port,
            _pad: 0,
            addr,
        })
        .collect()
}

impl Change {
    /// The entry the change removed (or rewrote) at `key`, as it was.
    pub(super) fn removed(&self, key: FeKey) -> Option<(FeAddr, &Installed)> {
        self.was.iter().rev().find_map(|(addr, was)| {
            was.as_ref()
                .filter(|_| addr.key() == key)
                .map(|i| (*addr, i))
        })
    }

    /// A removed frontend not deleted (its delete failed, or was held back): its id and slot
    /// range stay taken, and it still counts in its map. Returns it, for the mirror.
    pub(super) fn keep_undeleted(&mut self, key: FeKey) -> Option<(FeAddr, Installed)> {
        let (addr, inst) = self.removed(key).map(|(a, i)| (a, i.clone()))?;
        self.freed_ids.retain(|i| *i != inst.id);
        self.freed_ranges.retain(|r| *r != inst.range);
        if let Some(i) = self.fe_removed.iter().position(|m| *m == key.map()) {
            self.fe_removed.swap_remove(i);
        }
        Some((addr, inst))
    }
}

impl MapSync {
    fn used_fe(&mut self, kind: MapKind) -> &mut u64 {
        match kind {
            MapKind::Frontends6 => &mut self.used_fe6,
            _ => &mut self.used_fe4,
        }
    }

    /// Counts frontend entries (one per kind listed) and affinity matches as gone.
    fn uncount(&mut self, frontends: &[MapKind], affinity: u64) {
        for kind in frontends {
            let used = self.used_fe(*kind);
            *used = used.saturating_sub(1);
        }
        self.used_affinity = self.used_affinity.saturating_sub(affinity);
    }

    fn full(&self, service: &NamespacedName, map: MapKind, needed: u64) -> SyncError {
        let capacity = self.caps.of(map);
        let used = match map {
            MapKind::Frontends4 => self.used_fe4,
            MapKind::Frontends6 => self.used_fe6,
            MapKind::AffinityMatch => self.used_affinity,
            MapKind::ClusterNames => self.clusters.len() as u64,
            MapKind::Slots => self.slots.used(),
            MapKind::Counters | MapKind::FrontendNames => self.fe_ids.used(),
        };
        SyncError::MapFull {
            service: service.clone(),
            map,
            needed,
            free: u64::from(capacity).saturating_sub(used),
            capacity,
        }
    }

    /// New entries `d` needs in the frontend maps (per family) and new cluster names: for
    /// error messages.
    fn count_new(&self, d: &DesiredService) -> (u64, u64, u64) {
        let (mut v4, mut v6) = (0, 0);
        for (addr, _) in &d.frontends {
            if !self.frontends.contains_key(addr) {
                match addr.ip() {
                    IpAddr::V4(_) => v4 += 1,
                    IpAddr::V6(_) => v6 += 1,
                }
            }
        }
        let names: BTreeSet<&str> = d
            .frontends
            .iter()
            .flat_map(|(_, f)| f.backends.iter().map(|b| &*b.cluster))
            .filter(|c| self.clusters.id(c).is_none())
            .collect();
        (v4, v6, names.len() as u64)
    }

    /// A free range of `len` slots; when none is long enough but some are in quarantine, after
    /// a grace period.
    fn alloc_slots(&mut self, len: u32, maps: &mut impl MapWriter) -> Option<SlotRange> {
        if let Some(r) = self.slots.alloc(len) {
            return Some(r);
        }
        if self.slots.quarantined() == 0 || maps.quiesce().is_err() {
            return None;
        }
        self.slots.settle();
        self.slots.alloc(len)
    }

    /// The backends (address words, port) a frontend's range holds, read from the maps.
    fn installed_backends(
        inst: &Installed,
        maps: &impl MapWriter,
        service: &NamespacedName,
    ) -> Result<Vec<([u32; 4], u16)>, SyncError> {
        let count = u16::try_from(inst.range.len).unwrap_or(u16::MAX);
        let slots = maps
            .read_slots(inst.range.base, count)
            .map_err(|source| SyncError::Write {
                service: service.clone(),
                source,
            })?;
        Ok(slots
            .iter()
            .filter(|s| s.frontend_id == inst.id)
            .map(|s| (s.addr, s.port))
            .collect())
    }

    /// Plans the writes that bring `d.service` to `d`; `None` when nothing changes. On `Err`
    /// the mirror is as it was.
    pub(super) fn plan(
        &mut self,
        d: &DesiredService,
        maps: &mut impl MapWriter,
    ) -> Result<Option<Change>, SyncError> {
        for (addr, fe) in &d.frontends {
            if fe.backends.len() > usize::from(u16::MAX) {
                return Err(SyncError::TooManyBackends {
                    service: d.service.clone(),
                    frontend: addr.to_string(),
                    count: fe.backends.len(),
                });
            }
        }
        let mut change = Change {
            service: d.service.clone(),
            ..Change::default()
        };
        match self.plan_into(d, &mut change, maps) {
            Ok(())
                if change.puts.is_empty()
                    && change.flips.is_empty()
                    && change.deletes.is_empty() =>
            {
                // Nothing to write (ownership alone may have moved): keep the mirror.
                Ok(None)
            }
            Ok(()) => Ok(Some(change)),
            Err(e) => {
                self.rollback(change);
                Err(e)
            }
        }
    }

    fn plan_into(
        &mut self,
        d: &DesiredService,
        change: &mut Change,
        maps: &mut impl MapWriter,
    ) -> Result<(), SyncError> {
        let service = &d.service;
        let owned = self.by_service.get(service).cloned();
        change.was_owned.push((service.clone(), owned.clone()));
        for (addr, fe) in &d.frontends {
            // A VIP that moved from another service: its entries change owner.
            if let Some(prev) = self
                .frontends
                .get(addr)
                .map(|i| i.service.clone())
                .filter(|p| p != service)
            {
                let list = self.by_service.get(&prev).cloned();
                change.was_owned.push((prev.clone(), list.clone()));
                let rest: Vec<FeAddr> = list.into_iter().flatten().filter(|a| a != addr).collect();
                if rest.is_empty() {
                    self.by_service.remove(&prev);
                } else {
                    self.by_service.insert(prev, rest);
                }
            }
            self.plan_frontend(d, *addr, fe, change, maps)?;
        }
        let wanted: BTreeSet<&FeAddr> = d.frontends.iter().map(|(a, _)| a).collect();
        // Ports sort before their VIP's wildcard: a VIP that goes away refuses until it is gone.
        for addr in owned.iter().flatten() {
            if !wanted.contains(addr) {
                self.plan_delete(service, addr, change, maps)?;
            }
        }
        if d.frontends.is_empty() {
            self.by_service.remove(service);
        } else {
            self.by_service.insert(
                service.clone(),
                d.frontends.iter().map(|(a, _)| *a).collect(),
            );
        }
        Ok(())
    }

    /// Plans the delete of `addr` when `service` owns it.
    fn plan_delete(
        &mut self,
        service: &NamespacedName,
        addr: &FeAddr,
        change: &mut Change,
        maps: &mut impl MapWriter,
    ) -> Result<(), SyncError> {
        let Some(inst) = self.frontends.get(addr).filter(|i| i.service == *service) else {
            return Ok(());
        };
        let inst = inst.clone();
        let key = addr.key();
        change.deletes.push(MapOp::DelFrontend(key));
        if inst.affinity() && !inst.broken {
            let old = matches(
                inst.id,
                Self::installed_backends(&inst, maps, service)?.into_iter(),
            );
            change.affinity_removed += old.len() as u64;
            change
                .deletes
                .extend(old.into_iter().map(MapOp::DelAffinityMatch));
        }
        change.deletes.push(MapOp::DelName(inst.id));
        change.freed_ids.push(inst.id);
        if inst.range.len > 0 {
            change.freed_ranges.push(inst.range);
        }
        change.fe_removed.push(key.map());
        for c in inst.clusters.iter() {
            self.clusters.drop_ref(*c);
            change.cluster_refs.push((*c, -1));
        }
        self.frontends.swap_remove(addr);
        change.was.push((*addr, Some(inst)));
        Ok(())
    }

    /// Plans the deletes of the held entries (service, entry) that their service still owns:
    /// entries a flush held back ([`MapSync::keep_entry`]) and no later change took over. A
    /// service whose deletes cannot be planned keeps them in the mirror and goes to
    /// `undeleted`, for its next sync.
    pub(super) fn plan_drops(
        &mut self,
        held: Vec<(NamespacedName, FeAddr)>,
        maps: &mut impl MapWriter,
        undeleted: &mut Vec<NamespacedName>,
    ) -> Vec<Change> {
        let mut by_service: BTreeMap<NamespacedName, BTreeSet<FeAddr>> = BTreeMap::new();
        for (service, addr) in held {
            by_service.entry(service).or_default().insert(addr);
        }
        let mut batch = Vec::new();
        // Sorted: ports before their VIP's wildcard.
        for (service, addrs) in by_service {
            let mut change = Change {
                service: service.clone(),
                ..Change::default()
            };
            let owned = self.by_service.get(&service).cloned();
            change.was_owned.push((service.clone(), owned.clone()));
            let planned = addrs
                .iter()
                .try_for_each(|a| self.plan_delete(&service, a, &mut change, maps));
            if planned.is_err() {
                self.rollback(change);
                undeleted.push(service);
                continue;
            }
            // What the service still owns: not the held entries deleted here or taken over by
            // a later change.
            let rest: Vec<FeAddr> = owned
                .into_iter()
                .flatten()
                .filter(|a| {
                    !addrs.contains(a)
                        || self.frontends.get(a).is_some_and(|i| i.service == service)
                })
                .collect();
            if rest.is_empty() {
                self.by_service.remove(&service);
            } else {
                self.by_service.insert(service.clone(), rest);
            }
            if !change.deletes.is_empty() {
                batch.push(change);
            }
        }
        batch
    }

    /// Files a removed entry that is still in the maps (its delete failed twice, or a flush
    /// held it back) as its service's again, so that a later change of the service deletes
    /// it, or of its address takes it over. Broken: its name and affinity matches may be gone,
    /// so a takeover rewrites it whole. Its id, range and cluster names stay taken meanwhile.
    pub(super) fn keep_entry(&mut self, addr: FeAddr, inst: Installed) {
        for c in inst.clusters.iter() {
            self.clusters.add_ref(*c);
        }
        let list = self.by_service.entry(inst.service.clone()).or_default();
        if let Err(i) = list.binary_search(&addr) {
            list.insert(i, addr);
        }
        self.install(
            addr,
            Installed {
                broken: true,
                ..inst
            },
        );
    }

    fn plan_frontend(
        &mut self,
        d: &DesiredService,
        addr: FeAddr,
        fe: &DesiredFrontend,
        change: &mut Change,
        maps: &mut impl MapWriter,
    ) -> Result<(), SyncError> {
        let service = &d.service;
        let digest = fe.digest();
        let old = self.frontends.get(&addr).cloned();
        if old.as_ref().is_some_and(|o| o.same_as(service, fe, digest)) {
            return Ok(());
        }
        let key = addr.key();
        let kind = key.map();
        let id = match &old {
            Some(o) => o.id,
            None => {
                let (v4, v6, _) = self.count_new(d);
                let needed = v4 + v6;
                let id = self
                    .fe_ids
                    .take_lowest()
                    .ok_or_else(|| self.full(service, MapKind::FrontendNames, needed))?;
                change.new_ids.push(id);
                if *self.used_fe(kind) >= u64::from(self.caps.frontends) {
                    let needed = if kind == MapKind::Frontends6 { v6 } else { v4 };
                    return Err(self.full(service, kind, needed));
                }
                *self.used_fe(kind) += 1;
                change.fe_added.push(kind);
                change.puts.push((MapOp::ResetCounters(id), None));
                id
            }
        };

        // Cluster ids of the backends, in slot order; names new to the maps are written.
        let mut cluster_of = Vec::with_capacity(fe.backends.len());
        for b in &fe.backends {
            let Some((cid, new)) = self.clusters.intern(&b.cluster) else {
                let (_, _, needed) = self.count_new(d);
                return Err(self.full(service, MapKind::ClusterNames, needed));
            };
            if new {
                change.new_clusters.push(cid);
                change.puts.push((
                    MapOp::PutCluster(
                        u32::from(cid),
                        ClusterName {
                            name: name_bytes(&b.cluster),
                        },
                    ),
                    Some(MapOp::DelCluster(u32::from(cid))),
                ));
            }
            cluster_of.push(cid);
        }
        let mut clusters = cluster_of.clone();
        clusters.sort_unstable();
        clusters.dedup();

        // A new backend set goes into a new range.
        let set_changed = old.as_ref().is_none_or(|o| o.broken || o.digest != digest);
        let mut range = old
            .as_ref()
            .map_or(SlotRange { base: 0, len: 0 }, |o| o.range);
        if set_changed {
            let len = fe.backends.len() as u32;
            range = self
                .alloc_slots(len, maps)
                .ok_or_else(|| SyncError::NoSlotRange {
                    service: service.clone(),
                    needed: len,
                    longest: self.slots.largest_free(),
                    free: self.slots.free(),
                    capacity: self.slots.capacity(),
                })?;
            change.new_ranges.push(range);
            if len > 0 {
                let slots = fe
                    .backends
                    .iter()
                    .zip(&cluster_of)
                    .map(|(b, c)| Slot {
                        addr: addr_words(b.ip).0,
                        port: port_word(b.port),
                        cluster: *c,
                        frontend_id: id,
                    })
                    .collect();
                change.puts.push((MapOp::PutSlots(range.base, slots), None));
            }
            // A broken entry's range is empty unless adoption reserved it.
            if let Some(o) = &old
                && o.range.len > 0
            {
                change.freed_ranges.push(o.range);
            }
        }
        let new = Installed {
            id,
            range,
            flags: fe.flags,
            affinity_timeout_s: fe.affinity_timeout_s,
            digest,
            service: service.clone(),
            port_name: Arc::from(fe.port_name.as_str()),
            clusters: clusters.into_boxed_slice(),
            broken: false,
            value_differs: false,
            inline: inline_backends(
                matches!(key, FeKey::V4(_)),
                id,
                fe.backends
                    .iter()
                    .map(|b| (addr_words(b.ip).0, port_word(b.port))),
            ),
        };
        if old
            .as_ref()
            .is_none_or(|o| o.service != new.service || o.port_name != new.port_name || o.broken)
        {
            let undo = match &old {
                Some(o) => MapOp::PutName(o.id, o.name()),
                None => MapOp::DelName(id),
            };
            change
                .puts
                .push((MapOp::PutName(id, new.name()), Some(undo)));
        }

        // Affinity matches: added backends before the flip, removed ones after.
        let was_aff = old.as_ref().is_some_and(|o| o.affinity() && !o.broken);
        let is_aff = fe.flags & FRONTEND_F_AFFINITY != 0;
        if (was_aff || is_aff) && (set_changed || was_aff != is_aff) {
            let before = match (&old, was_aff) {
                (Some(o), true) => {
                    matches(id, Self::installed_backends(o, maps, service)?.into_iter())
                }
                _ => BTreeSet::new(),
            };
            let after = if is_aff {
                matches(
                    id,
                    fe.backends
                        .iter()
                        .map(|b| (addr_words(b.ip).0, port_word(b.port))),
                )
            } else {
                BTreeSet::new()
            };
            let added = after.difference(&before).count() as u64;
            if self.used_affinity + added > u64::from(self.caps.slots) {
                return Err(self.full(service, MapKind::AffinityMatch, added));
            }
            self.used_affinity += added;
            change.affinity_added += added;
            for m in after.difference(&before) {
                change.puts.push((
                    MapOp::PutAffinityMatch(*m),
                    Some(MapOp::DelAffinityMatch(*m)),
                ));
            }
            let removed: Vec<&AffinityMatchKey> = before.difference(&after).collect();
            change.affinity_removed += removed.len() as u64;
            change
                .deletes
                .extend(removed.into_iter().map(|m| MapOp::DelAffinityMatch(*m)));
        }

        if old
            .as_ref()
            .is_none_or(|o| o.abi() != new.abi() || o.broken || o.value_differs)
        {
            let undo = match &old {
                Some(o) => MapOp::PutFrontend(key, Box::new(o.abi())),
                None => MapOp::DelFrontend(key),
            };
            change
                .flips
                .push((MapOp::PutFrontend(key, Box::new(new.abi())), undo));
        }
        for c in new.clusters.iter() {
            self.clusters.add_ref(*c);
            change.cluster_refs.push((*c, 1));
        }
        for c in old.iter().flat_map(|o| o.clusters.iter()) {
            self.clusters.drop_ref(*c);
            change.cluster_refs.push((*c, -1));
        }
        self.install(addr, new);
        change.was.push((addr, old));
        Ok(())
    }

    /// Plans the wildcard entries of the VIPs of `d` that have no entry in the maps (for a
    /// service that could not be written: its new VIPs refuse instead of passing through).
    pub(super) fn plan_refusal(
        &mut self,
        d: &DesiredService,
        maps: &mut impl MapWriter,
    ) -> Result<Option<Change>, SyncError> {
        let vips: BTreeSet<IpAddr> = d.frontends.iter().map(|(a, _)| a.ip()).collect();
        let missing: Vec<(FeAddr, DesiredFrontend)> = vips
            .into_iter()
            .map(FeAddr::Wildcard)
            .filter(|a| !self.frontends.contains_key(a))
            .map(|a| (a, DesiredFrontend::wildcard()))
            .collect();
        if missing.is_empty() {
            return Ok(None);
        }
        let refusing = DesiredService {
            service: d.service.clone(),
            frontends: missing,
        };
        let mut change = Change {
            service: d.service.clone(),
            ..Change::default()
        };
        let owned = self.by_service.get(&d.service).cloned();
        change.was_owned.push((d.service.clone(), owned.clone()));
        for (addr, fe) in &refusing.frontends {
            if let Err(e) = self.plan_frontend(&refusing, *addr, fe, &mut change, maps) {
                self.rollback(change);
                return Err(e);
            }
        }
        let mut list: Vec<FeAddr> = owned.unwrap_or_default();
        list.extend(refusing.frontends.iter().map(|(a, _)| *a));
        list.sort_unstable();
        list.dedup();
        self.by_service.insert(d.service.clone(), list);
        Ok(Some(change))
    }

    /// Takes a planned change back out of the mirror and the pools (its writes, if any, were
    /// undone already). Returns its desired entries.
    pub(super) fn rollback(&mut self, change: Change) -> DesiredService {
        for (addr, was) in change.was.into_iter().rev() {
            match was {
                Some(i) => {
                    self.install(addr, i);
                }
                None => {
                    self.frontends.swap_remove(&addr);
                }
            }
        }
        for (service, list) in change.was_owned.into_iter().rev() {
            match list {
                Some(l) => {
                    self.by_service.insert(service, l);
                }
                None => {
                    self.by_service.remove(&service);
                }
            }
        }
        // A reader may have followed a flip that was written and undone: the new ranges wait
        // for a grace period like any other.
        for r in change.new_ranges {
            self.slots.release(r);
        }
        for id in change.new_ids {
            self.fe_ids.release(id);
        }
        for (c, delta) in change.cluster_refs.into_iter().rev() {
            if delta > 0 {
                self.clusters.drop_ref(c);
            } else {
                self.clusters.add_ref(c);
            }
        }
        for c in change.new_clusters {
            self.clusters.remove(c);
        }
        self.uncount(&change.fe_added, change.affinity_added);
        change.desired.unwrap_or(DesiredService {
            service: change.service,
            frontends: Vec::new(),
        })
    }

    /// Gives back what a written change freed: its old ranges to quarantine, ids and entry
    /// counts of removed frontends.
    pub(super) fn finish(&mut self, change: Change, report: &mut SyncReport) {
        for id in change.freed_ids {
            self.fe_ids.release(id);
        }
        for r in change.freed_ranges {
            self.slots.release(r);
        }
        self.uncount(&change.fe_removed, change.affinity_removed);
        report.changed.push(change.service);
    }

    /// Deletes the cluster names no frontend uses any more and frees their ids.
    pub(super) fn collect_clusters(&mut self, maps: &mut impl MapWriter, report: &mut SyncReport) {
        for id in self.clusters.unused() {
            match maps.apply(&MapOp::DelCluster(u32::from(id))) {
                Ok(()) => {
                    report.writes += 1;
                    self.clusters.remove(id);
                }
                Err(e) => report.delete_errors.push(e),
            }
        }
    }
}
