//! The writer when the kernel refuses writes and deletes, or the table hands VIPs between
//! services: the same checked in-memory maps as `sync_tests.rs`, which also check that an
//! address in the maps before and after a sync never goes missing on the way.

use std::{collections::BTreeSet, net::IpAddr};

use dataplane_core::{
    fixtures::backend,
    lb::{FrontendAddr, Protocol},
};

use super::tests::{Entries, ServiceSpec, adopt_and_sync, svc, sync_checked, table, v4, vip};
use super::*;
use crate::bpf::{
    desired::{self, read_back},
    maps::MemMaps,
};

/// A VIP that moves from one service to another in one sync: its entries change owner and
/// stay refusing or serving throughout, whichever service is synced first.
#[test]
fn a_vip_moving_between_services_is_handed_over() {
    let shared = vip(5);
    for order in [["a", "b"], ["b", "a"]] {
        let t1 = table(&[
            (order[0], shared, vec![(80, vec![backend("x", v4(1), 80)])]),
            (order[1], vip(6), vec![(80, vec![backend("x", v4(2), 80)])]),
        ]);
        let t2 = table(&[
            (order[1], shared, vec![(80, vec![backend("x", v4(3), 80)])]),
            (order[0], vip(6), vec![(80, vec![backend("x", v4(4), 80)])]),
        ]);
        let mut sync = MapSync::new(Capacities::default());
        let mut maps = MemMaps::new(Capacities::default());
        sync_checked(&mut sync, &mut maps, &t1);
        let report = sync_checked(&mut sync, &mut maps, &t2);
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert_eq!(read_back(&maps.contents), desired::entries(&t2));
        let again = sync_checked(&mut sync, &mut maps, &t2);
        assert_eq!(again.writes, 0);
    }
}

/// Many services in one sync go out in batches; a write that keeps failing in the middle of a
/// batch costs only the service it belongs to.
#[test]
fn one_failing_service_of_a_batch_is_reported_and_the_others_are_written() {
    let services: Vec<(String, IpAddr)> = (1..=40).map(|i| (format!("s{i}"), vip(i))).collect();
    let spec: Vec<ServiceSpec> = services
        .iter()
        .map(|(n, ip)| (n.as_str(), *ip, vec![(80, vec![backend("x", v4(1), 80)])]))
        .collect();
    let t = table(&spec);
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    maps.refuse_frontend = Some(
        FeAddr::Port(FrontendAddr {
            ip: vip(17),
            port: 80,
            protocol: Protocol::Tcp,
        })
        .key(),
    );
    let report = sync_checked(&mut sync, &mut maps, &t);
    maps.refuse_frontend = None;
    assert_eq!(report.failed.len(), 1, "{:?}", report.failed);
    assert_eq!(report.failed[0].service(), &svc("s17"));
    assert_eq!(report.changed.len(), 39);
    let of_s17: Vec<FeAddr> = read_back(&maps.contents)
        .into_keys()
        .filter(|a| a.ip() == vip(17))
        .collect();
    assert_eq!(
        of_s17,
        [FeAddr::Wildcard(vip(17))],
        "s17's VIP only refuses"
    );
    let report = sync_checked(&mut sync, &mut maps, &t);
    assert_eq!(report.changed.len(), 1);
    assert_eq!(read_back(&maps.contents), desired::entries(&t));
}

/// The port 80 entry of a VIP.
fn port80(ip: IpAddr) -> FeAddr {
    FeAddr::Port(FrontendAddr {
        ip,
        port: 80,
        protocol: Protocol::Tcp,
    })
}

/// Seven backends from `10.0.0.<first>` on (past six: the frontend reads its slots).
fn seven(first: u8) -> Vec<dataplane_core::lb::Backend> {
    (first..first + 7)
        .map(|h| backend("x", v4(h), 80))
        .collect()
}

/// Service `a` (one frontend of seven backends) written into slots that hold one such range,
/// then removed with its port entry's delete failing `failures` times.
fn a_removed_with_failing_deletes(failures: usize) -> (MapSync, MemMaps, Entries, SyncReport) {
    let caps = Capacities {
        slots: 7,
        ..Capacities::default()
    };
    let mut sync = MapSync::new(caps);
    let mut maps = MemMaps::new(caps);
    sync_checked(
        &mut sync,
        &mut maps,
        &table(&[("a", vip(1), vec![(80, seven(1))])]),
    );
    let before = read_back(&maps.contents);
    maps.fail_deletes = Some((port80(vip(1)).key(), failures));
    let report = sync_checked(&mut sync, &mut maps, &table(&[]));
    (sync, maps, before, report)
}

/// The removed frontend is gone with its name and cluster name, and its id and slots are given
/// back: the next frontend fits in the slots, which hold one frontend's range.
fn all_given_back(sync: &mut MapSync, maps: &mut MemMaps) {
    assert!(
        read_back(&maps.contents).is_empty(),
        "the removed entry is gone"
    );
    assert!(maps.contents.names.is_empty() && maps.contents.clusters.is_empty());
    let t2 = table(&[("b", vip(2), vec![(80, seven(21))])]);
    let report = sync_checked(sync, maps, &t2);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(read_back(&maps.contents), desired::entries(&t2));
}

/// A frontend delete that fails once is tried again: the entry goes, and its id, name and
/// slots are given back. The slots hold one frontend's range, so the next frontend fits only
/// in the range given back.
#[test]
fn a_frontend_delete_that_fails_once_is_tried_again() {
    let (mut sync, mut maps, _, report) = a_removed_with_failing_deletes(1);
    assert!(
        report.delete_errors.is_empty(),
        "{:?}",
        report.delete_errors
    );
    assert_eq!(
        maps.fail_deletes,
        Some((port80(vip(1)).key(), 0)),
        "it failed once"
    );
    all_given_back(&mut sync, &mut maps);
}

/// A frontend whose delete keeps failing (each sync tries it twice) still routes: it keeps its
/// old backends, and its id and slot range are not handed to the next frontend, which would
/// make the old VIP serve that one's backends. The slots hold exactly one frontend's range: a
/// second one fits only once the first is gone.
#[test]
fn a_frontend_left_by_a_failed_delete_keeps_its_id_and_slots() {
    let (mut sync, mut maps, before, report) = a_removed_with_failing_deletes(4);
    let a80 = port80(vip(1));
    let t3 = table(&[("b", vip(2), vec![(80, seven(21))])]);
    assert_eq!(report.delete_errors.len(), 1, "{:?}", report.delete_errors);
    // (Its name is deleted: `inspect` shows it without a service.)
    let backends = |e: &Entries, a: &FeAddr| e.get(a).map(|(_, d)| d.backends.clone());
    let seen = read_back(&maps.contents);
    assert_eq!(
        backends(&seen, &a80),
        backends(&before, &a80),
        "a's VIP serves its old backends"
    );

    let report = sync_checked(&mut sync, &mut maps, &t3);
    assert_eq!(
        report.failed.len(),
        1,
        "no room for b while a's range is taken"
    );
    let seen = read_back(&maps.contents);
    assert_eq!(
        backends(&seen, &a80),
        backends(&before, &a80),
        "a's VIP still serves its own backends"
    );
    assert!(
        !seen.contains_key(&port80(vip(2))),
        "b only refuses: {:?}",
        seen.get(&port80(vip(2)))
    );
    let fe = &maps.contents.frontends4;
    let ids: Vec<u32> = fe.values().map(|f| f.id).collect();
    let unique: std::collections::BTreeSet<u32> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "ids are never shared: {ids:?}");
}

/// A frontend delete that fails twice is tried again by the next sync of its service (the
/// node retries the services in `undeleted`): the entry goes, and its id, name, cluster name
/// and slots are given back.
#[test]
fn a_frontend_delete_that_fails_twice_is_tried_again_by_the_services_next_sync() {
    let (mut sync, mut maps, _, report) = a_removed_with_failing_deletes(2);
    assert_eq!(report.delete_errors.len(), 1, "{:?}", report.delete_errors);
    assert_eq!(report.undeleted, [svc("a")]);
    assert!(read_back(&maps.contents).contains_key(&port80(vip(1))));
    // What the node's retry does: sync the service alone, with the same (empty) table.
    let only: BTreeSet<NamespacedName> = [svc("a")].into();
    let empty = table(&[]);
    let report = sync.sync(
        Scope::Services(&only),
        desired::services(&empty, Some(&only)),
        &mut maps,
    );
    assert!(
        report.delete_errors.is_empty() && report.undeleted.is_empty(),
        "{report:?}"
    );
    all_given_back(&mut sync, &mut maps);
}

/// Two services swap VIPs in one batch and a write of the batch fails: the batch is undone and
/// redone service by service. Whichever write fails, neither VIP is absent on the way
/// (`sync_checked` checks after every write): not when the new owner's write is undone (the
/// old owner's entry is put back), nor between the services' own flushes (the old owner's
/// delete waits for the new owner's write).
#[test]
fn a_vip_moving_in_a_batch_redone_service_by_service_is_never_missing() {
    let t1 = table(&[
        ("a", vip(5), vec![(80, vec![backend("x", v4(1), 80)])]),
        ("b", vip(6), vec![(80, vec![backend("x", v4(2), 80)])]),
    ]);
    let t2 = table(&[
        ("b", vip(5), vec![(80, vec![backend("x", v4(3), 80)])]),
        ("a", vip(6), vec![(80, vec![backend("x", v4(4), 80)])]),
    ]);
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    sync_checked(&mut sync, &mut maps, &t1);
    let mut failed_writes = 0;
    for fail_at in 0..20 {
        maps.fail_write_in = Some(fail_at);
        let report = sync_checked(&mut sync, &mut maps, &t2);
        failed_writes += usize::from(maps.fail_write_in.is_none());
        maps.fail_write_in = None;
        // The failure costs one try: every service is written in the end.
        assert!(
            report.failed.is_empty(),
            "fail_at {fail_at}: {:?}",
            report.failed
        );
        assert_eq!(
            read_back(&maps.contents),
            desired::entries(&t2),
            "fail_at {fail_at}"
        );
        let again = sync_checked(&mut sync, &mut maps, &t2);
        assert_eq!(again.writes, 0, "fail_at {fail_at}: the mirror is the maps");
        sync_checked(&mut sync, &mut maps, &t1);
    }
    assert!(failed_writes > 5, "{failed_writes}");
}

/// A VIP that moves from a service whose change fills a batch to one written in a later
/// batch: the old owner's delete waits for the sync's end, the new owner writes the VIP over,
/// and the VIP is never absent (`sync_checked`), also when a write of the full batch fails and
/// its services are redone one at a time. A VIP nobody takes over is deleted at the sync's end.
#[test]
fn a_vip_moving_across_a_full_batch_is_never_missing() {
    // 40,000 backends on each of two ports: more slots than a batch collects.
    let many: Vec<dataplane_core::lb::Backend> = (1..=40_000)
        .map(|port| backend("x", v4(200), port))
        .collect();
    // b's change fills the batch that a's starts; c takes b's VIP 5 in the next batch.
    let t1 = table(&[
        ("a", vip(9), vec![(80, vec![backend("x", v4(6), 80)])]),
        ("b", vip(5), vec![(80, vec![backend("x", v4(1), 80)])]),
        ("b", vip(8), vec![(80, vec![backend("x", v4(5), 80)])]),
        ("c", vip(6), vec![(80, vec![backend("x", v4(2), 80)])]),
    ]);
    let t2 = table(&[
        ("a", vip(9), vec![(80, vec![backend("x", v4(7), 80)])]),
        ("b", vip(7), vec![(80, many.clone()), (81, many)]),
        ("c", vip(5), vec![(80, vec![backend("x", v4(3), 80)])]),
    ]);
    // No failure, then the full batch's first write (a's) failing: its services are redone
    // one at a time.
    for fail_at in [None, Some(0)] {
        let mut sync = MapSync::new(Capacities::default());
        let mut maps = MemMaps::new(Capacities::default());
        sync_checked(&mut sync, &mut maps, &t1);
        maps.fail_write_in = fail_at;
        let report = sync_checked(&mut sync, &mut maps, &t2);
        assert_eq!(maps.fail_write_in, None, "the write failed");
        assert!(report.failed.is_empty(), "{fail_at:?}: {:?}", report.failed);
        assert_eq!(read_back(&maps.contents), desired::entries(&t2));
        assert_eq!(sync.frontend_count(), desired::entries(&t2).len());
        assert_eq!(
            maps.contents.names.len(),
            sync.frontend_count(),
            "no name of a deleted frontend is left"
        );
        let again = sync_checked(&mut sync, &mut maps, &t2);
        assert_eq!(again.writes, 0, "{fail_at:?}: the mirror is the maps");
    }
}

/// The cluster names lost before a restart (MCS_CLUSTERS emptied): the slots name ids the
/// adopted mirror does not know. The first sync names the table's clusters again, and they
/// stay named: an id handed to a name is never also dropped as the old, unknown one.
#[test]
fn adopted_slots_naming_unknown_cluster_ids_are_named_again() {
    let t = table(&[
        ("a", vip(1), vec![(80, vec![backend("east", v4(1), 80)])]),
        (
            "b",
            vip(2),
            vec![(
                80,
                vec![backend("east", v4(2), 80), backend("west", v4(3), 80)],
            )],
        ),
    ]);
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    sync_checked(&mut sync, &mut maps, &t);
    maps.contents.clusters.clear();
    let (mut adopted, report) = adopt_and_sync(&mut maps, &t);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(
        read_back(&maps.contents),
        desired::entries(&t),
        "after the first sync"
    );
    let report = adopted.sync(Scope::All, desired::services(&t, None), &mut maps);
    assert_eq!(report.writes, 0);
    assert_eq!(
        read_back(&maps.contents),
        desired::entries(&t),
        "and after the next"
    );
}

/// Records every write it applies.
struct Recorder {
    maps: MemMaps,
    ops: Vec<MapOp>,
}

impl MapWriter for Recorder {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
        self.maps.apply(op)?;
        self.ops.push(op.clone());
        Ok(())
    }

    fn read_slots(&self, base: u32, count: u16) -> Result<Vec<abi::Slot>, MapWriteError> {
        self.maps.read_slots(base, count)
    }

    fn quiesce(&mut self) -> Result<(), MapWriteError> {
        self.maps.quiesce()
    }
}

/// An entry adopted as broken (one slot of its range names another frontend) still points at
/// its range until the first sync rewrites it: that sync writes the new backends elsewhere,
/// never into slots a reader may be using, and then gives the old range back (to quarantine,
/// then to reuse).
#[test]
fn a_broken_entry_keeps_its_range_until_it_is_rewritten() {
    let t1 = table(&[("web", vip(9), vec![(80, seven(1))])]);
    let t2 = table(&[("web", vip(9), vec![(80, seven(21))])]);
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    sync_checked(&mut sync, &mut maps, &t1);
    let key = port80(vip(9)).key();
    let old = maps
        .contents
        .frontends4
        .values()
        .find(|f| f.count == 7)
        .expect("web:80")
        .base;
    if let Some(slot) = maps.contents.slots.get_mut(&(old + 6)) {
        slot.frontend_id += 100;
    }
    let contents = maps.contents.clone();
    let (mut adopted, _) =
        MapSync::adopt(Capacities::default(), &contents, &mut maps).expect("adopted");
    let mut rec = Recorder {
        maps,
        ops: Vec::new(),
    };
    assert_eq!(
        adopted.slots.used(),
        7,
        "the broken entry's range is reserved"
    );
    let report = adopted.sync(Scope::All, desired::services(&t2, None), &mut rec);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(read_back(&rec.maps.contents), desired::entries(&t2));
    assert_eq!(
        (adopted.slots.used(), adopted.slots.quarantined()),
        (7, 7),
        "only the new range is in use; the old one waits for a grace period"
    );
    let flip = rec
        .ops
        .iter()
        .position(|op| matches!(op, MapOp::PutFrontend(k, _) if *k == key))
        .expect("the entry is rewritten");
    for op in &rec.ops[..flip] {
        if let MapOp::PutSlots(base, slots) = op {
            let end = base + slots.len() as u32;
            assert!(
                end <= old || *base >= old + 7,
                "{op:?} writes into {old}..+7 while the entry points there"
            );
        }
    }
}
