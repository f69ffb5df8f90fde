//! Restart adoption: rebuilds the writer's mirror from maps that already hold entries (an agent
//! restart, or an upgrade that kept the pins), and lists the deletes that clear what no
//! frontend can reach (names and affinity matches of ids nothing uses, cluster names nothing
//! references, entries a reader would refuse).
//!
//! Frontends themselves are kept until the first sync against complete desired entries
//! decides about them; one whose range a reader would refuse (a slot without its id, a range
//! overlapping another's or past the array) is adopted as *broken*, so that sync rewrites it
//! (its range, where it is in the array and no whole entry's, stays taken until then);
//! one whose range is whole but whose value differs from what the writer would put there (its
//! backends' copies) has its value rewritten.

use std::{collections::BTreeSet, net::IpAddr, sync::Arc};

use dataplane_core::model::NamespacedName;
use dataplane_ebpf::{AF_INET, AF_INET6, AffinityMatchKey, FRONTEND_F_AFFINITY, FRONTEND_F_INLINE};

use super::{
    convert::{addr_from_words, name_from_bytes, port_from_word},
    desired::{DesiredBackend, DesiredFrontend, FeAddr},
    ids::SlotRange,
    maps::{Capacities, MapContents, MapOp, MapWriteError, MapWriter},
    sync::{Installed, MapSync, inline_backends},
};

impl MapSync {
    /// Adopts `contents` (every map but the slots, which are read per frontend through
    /// `maps`). Returns the mirror and the cleanup deletes. Waits for a grace period first: the
    /// previous agent may have freed ranges just before it stopped.
    pub fn adopt(
        caps: Capacities,
        contents: &MapContents,
        maps: &mut impl MapWriter,
    ) -> Result<(MapSync, Vec<MapOp>), MapWriteError> {
        maps.quiesce()?;
        let mut sync = MapSync::new(caps);
        let mut cleanup = Vec::new();
        for (id, name) in &contents.clusters {
            let name: Arc<str> = name_from_bytes(&name.name).into();
            let adopted = u16::try_from(*id).is_ok_and(|id| sync.clusters.adopt(id, name));
            if !adopted {
                cleanup.push(MapOp::DelCluster(*id));
            }
        }
        let mut live_matches = BTreeSet::new();
        // The ranges of broken entries, reserved once every whole entry has its own.
        let mut broken_ranges = Vec::new();
        for (key, fe) in contents.frontends() {
            let Some(addr) = FeAddr::from_key(&key) else {
                cleanup.push(MapOp::DelFrontend(key));
                continue;
            };
            // An id out of range or used twice: the entry cannot be kept (the first sync puts
            // back whatever the table wants at that address).
            if !sync.fe_ids.take(fe.id) {
                cleanup.push(MapOp::DelFrontend(key));
                continue;
            }
            let range = SlotRange {
                base: fe.base,
                len: u32::from(fe.count),
            };
            let slots = maps.read_slots(fe.base, fe.count)?;
            let in_bounds = u64::from(fe.base) + u64::from(fe.count) <= u64::from(caps.slots);
            let whole = slots.iter().all(|s| s.frontend_id == fe.id)
                && in_bounds
                && sync.slots.reserve(range);
            if !whole && in_bounds {
                broken_ranges.push((addr, range));
            }
            let family = match addr.ip() {
                IpAddr::V4(_) => AF_INET,
                IpAddr::V6(_) => AF_INET6,
            };
            let (service, port_name) = contents
                .names
                .get(&fe.id)
                .map(|n| {
                    (
                        NamespacedName::new(
                            name_from_bytes(&n.namespace),
                            name_from_bytes(&n.name),
                        ),
                        name_from_bytes(&n.port_name),
                    )
                })
                .unwrap_or_else(|| (NamespacedName::new("", ""), String::new()));
            let mut clusters: Vec<u16> = Vec::new();
            let mut backends = Vec::new();
            if whole {
                for s in &slots {
                    let cluster = sync.clusters.name(s.cluster);
                    // A cluster id without its name (MCS_CLUSTERS lost it) is not held: the
                    // id is free for the next name, and this entry, whose digest then names
                    // no cluster, is rewritten by the first sync.
                    if cluster.is_some() {
                        clusters.push(s.cluster);
                    }
                    if let Some(ip) = addr_from_words(s.addr, family) {
                        backends.push(DesiredBackend {
                            ip,
                            port: port_from_word(s.port),
                            cluster: cluster.unwrap_or_else(|| "".into()),
                        });
                    }
                }
                if fe.flags & FRONTEND_F_AFFINITY != 0 {
                    live_matches.extend(slots.iter().map(|s| AffinityMatchKey {
                        frontend_id: fe.id,
                        port: s.port,
                        _pad: 0,
                        addr: s.addr,
                    }));
                }
            }
            clusters.sort_unstable();
            clusters.dedup();
            for c in &clusters {
                sync.clusters.add_ref(*c);
            }
            let digest = DesiredFrontend {
                port_name: String::new(),
                flags: 0,
                affinity_timeout_s: 0,
                backends,
            }
            .digest();
            match addr.ip() {
                IpAddr::V4(_) => sync.used_fe4 += 1,
                IpAddr::V6(_) => sync.used_fe6 += 1,
            }
            // The copies the entry should carry, from its slots; an entry whose copies differ
            // (or that lacks them) is rewritten by the first sync.
            let inline = if whole {
                inline_backends(
                    family == AF_INET,
                    fe.id,
                    slots.iter().map(|s| (s.addr, s.port)),
                )
            } else {
                None
            };
            let mut installed = Installed {
                id: fe.id,
                range: if whole {
                    range
                } else {
                    SlotRange { base: 0, len: 0 }
                },
                flags: fe.flags & !FRONTEND_F_INLINE,
                affinity_timeout_s: fe.affinity_timeout_s,
                digest,
                service: service.clone(),
                port_name: port_name.into(),
                clusters: clusters.into_boxed_slice(),
                broken: !whole,
                value_differs: false,
                inline,
            };
            installed.value_differs = whole && installed.abi() != *fe;
            sync.by_service.entry(service).or_default().push(addr);
            sync.install(addr, installed);
        }
        // A broken entry still points at its range until the first sync rewrites it: where
        // that range is no whole entry's, it is kept from reuse until then (and quarantined
        // after), so no new backend set is written into slots a reader may be using.
        for (addr, range) in broken_ranges {
            if sync.slots.reserve(range)
                && let Some(installed) = sync.frontends.get_mut(&addr)
            {
                installed.range = range;
            }
        }
        for list in sync.by_service.values_mut() {
            list.sort_unstable();
        }
        sync.used_affinity = live_matches.len() as u64;
        let ids: BTreeSet<u32> = sync.frontends.values().map(|f| f.id).collect();
        cleanup.extend(
            contents
                .affinity_match
                .iter()
                .filter(|m| !live_matches.contains(*m))
                .map(|m| MapOp::DelAffinityMatch(*m)),
        );
        cleanup.extend(
            contents
                .names
                .keys()
                .filter(|id| !ids.contains(id))
                .map(|id| MapOp::DelName(*id)),
        );
        for id in sync.clusters.unused() {
            cleanup.push(MapOp::DelCluster(u32::from(id)));
            sync.clusters.remove(id);
        }
        Ok((sync, cleanup))
    }
}
