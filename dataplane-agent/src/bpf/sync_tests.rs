//! The writer against in-memory maps that check the datapath invariants after every single
//! write: a reader never sees a mixed or missing backend set, and a slot range is never
//! rewritten without a grace period since a frontend last pointed at it.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use dataplane_core::{
    fixtures::{backend, lb_table},
    lb::{Backend, Frontend, FrontendAddr, LbTable, Protocol},
};
use dataplane_ebpf::{
    AffinityMatchKey, ClusterName, FRONTEND_F_WILDCARD, FrontendKey4, FrontendName, InlineBackend,
    Slot,
};
use proptest::prelude::*;

use super::*;
use crate::bpf::{
    desired::{self, read_back},
    maps::{MapContents, MemMaps},
};

pub(super) type Entries = BTreeMap<FeAddr, (NamespacedName, DesiredFrontend)>;

/// Applies writes to in-memory maps and checks, after every one, the datapath invariants,
/// that every frontend a reader can see serves its old or its new backend set, and that no
/// slot a frontend pointed at since the last grace period is written.
struct CheckedMaps {
    maps: MemMaps,
    before: Entries,
    after: Entries,
    /// Per slot: the grace-period count when a frontend last pointed at it.
    pointed: BTreeMap<u32, usize>,
    violations: Vec<String>,
    /// Addresses of `before` found absent after a write, and the write.
    absent: Vec<(FeAddr, String)>,
}

impl CheckedMaps {
    fn note_pointed(&mut self) {
        let epoch = self.maps.grace_periods;
        for (_, fe) in self.maps.contents.frontends() {
            for i in 0..u32::from(fe.count) {
                self.pointed.insert(fe.base + i, epoch);
            }
        }
    }
}

impl MapWriter for CheckedMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
        if let MapOp::PutSlots(base, slots) = op {
            for i in *base..*base + slots.len() as u32 {
                if self.pointed.get(&i) == Some(&self.maps.grace_periods) {
                    self.violations.push(format!(
                        "{op:?}: slot {i} rewritten without a grace period since it was in use"
                    ));
                }
            }
        }
        self.maps.apply(op)?;
        self.note_pointed();
        if let Err(v) = self.maps.contents.check_datapath_invariants() {
            self.violations.push(format!("after {op:?}: {v}"));
        }
        let now = read_back(&self.maps.contents);
        for addr in self.before.keys().filter(|a| !now.contains_key(*a)) {
            self.absent.push((*addr, format!("{op:?}")));
        }
        for (addr, (_, seen)) in now {
            let ok = [self.before.get(&addr), self.after.get(&addr)]
                .into_iter()
                .flatten()
                .any(|(_, d)| d.backends == seen.backends);
            if !ok {
                self.violations.push(format!(
                    "after {op:?}: {addr} serves a mixed set {:?}",
                    seen.backends
                ));
            }
        }
        Ok(())
    }

    fn read_slots(&self, base: u32, count: u16) -> Result<Vec<Slot>, MapWriteError> {
        self.maps.read_slots(base, count)
    }

    fn quiesce(&mut self) -> Result<(), MapWriteError> {
        self.maps.quiesce()
    }
}

pub(super) fn svc(name: &str) -> NamespacedName {
    NamespacedName::new("ns", name)
}

/// One service of a test table: (service, vip, [(port, [backends])]).
pub(super) type ServiceSpec<'a> = (&'a str, IpAddr, Vec<(u16, Vec<Backend>)>);

/// A table of TCP frontends named `p<port>`.
pub(super) fn table(spec: &[ServiceSpec]) -> LbTable {
    let mut t = lb_table();
    for (name, vip, ports) in spec {
        t = t.service(svc(name), *vip);
        for (port, backends) in ports {
            t = t.tcp(*port, &format!("p{port}"), backends.clone());
        }
    }
    t.build()
}

pub(super) fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

pub(super) fn vip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(241, 0, 0, last))
}

pub(super) fn sync_checked(sync: &mut MapSync, maps: &mut MemMaps, t: &LbTable) -> SyncReport {
    checked(maps, t, |m| {
        sync.sync(Scope::All, desired::services(t, None), m)
    })
}

/// `Scope::Services` under the same checks as [`sync_checked`].
fn sync_services_checked(
    sync: &mut MapSync,
    maps: &mut MemMaps,
    t: &LbTable,
    services: &[NamespacedName],
) -> SyncReport {
    let set: BTreeSet<NamespacedName> = services.iter().cloned().collect();
    checked(maps, t, |m| {
        sync.sync(Scope::Services(&set), desired::services(t, Some(&set)), m)
    })
}

fn checked(
    maps: &mut MemMaps,
    t: &LbTable,
    run: impl FnOnce(&mut CheckedMaps) -> SyncReport,
) -> SyncReport {
    let mut checked = CheckedMaps {
        before: read_back(&maps.contents),
        maps: std::mem::take(maps),
        after: desired::entries(t),
        pointed: BTreeMap::new(),
        violations: vec![],
        absent: vec![],
    };
    checked.note_pointed();
    let report = run(&mut checked);
    // An address in the maps before and after the sync never went missing on the way: a
    // connect to it would have passed through unrouted. Not when the maps were full: a
    // service that takes over a VIP may then wait for the old owner's removal to make room
    // (`retried`), or fail and refuse.
    let end = read_back(&checked.maps.contents);
    let room = report.retried == 0 && report.failed.is_empty();
    checked.violations.extend(
        checked
            .absent
            .iter()
            .filter(|(addr, _)| room && end.contains_key(addr))
            .map(|(addr, op)| format!("after {op}: {addr} is absent")),
    );
    assert!(checked.violations.is_empty(), "{:#?}", checked.violations);
    *maps = checked.maps;
    report
}

/// What a reader of the maps can see, and what the agent keeps beside it.
fn visible(
    c: &MapContents,
) -> (
    Entries,
    BTreeSet<AffinityMatchKey>,
    BTreeMap<u32, ClusterName>,
) {
    (read_back(c), c.affinity_match.clone(), c.clusters.clone())
}

/// The services whose map entries differ between two tables.
fn changed_services(a: &LbTable, b: &LbTable) -> Vec<NamespacedName> {
    let by_service = |t: &LbTable| {
        let mut out: BTreeMap<NamespacedName, Entries> = BTreeMap::new();
        for (addr, (s, d)) in desired::entries(t) {
            out.entry(s.clone()).or_default().insert(addr, (s, d));
        }
        out
    };
    let (a, b) = (by_service(a), by_service(b));
    let all: BTreeSet<&NamespacedName> = a.keys().chain(b.keys()).collect();
    all.into_iter()
        .filter(|s| a.get(*s) != b.get(*s))
        .cloned()
        .collect()
}

#[test]
fn first_sync_writes_every_frontend_and_a_wildcard_per_vip() {
    let t = table(&[(
        "web",
        vip(1),
        vec![
            (
                80,
                vec![backend("a", v4(1), 8080), backend("b", v4(2), 8080)],
            ),
            (443, vec![]),
        ],
    )]);
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    let report = sync_checked(&mut sync, &mut maps, &t);
    assert_eq!(report.changed, vec![svc("web")]);
    assert!(report.failed.is_empty());
    assert_eq!(read_back(&maps.contents), desired::entries(&t));
    assert_eq!(maps.contents.frontends4.len(), 3); // :80, :443, wildcard
    assert_eq!(maps.contents.len(MapKind::Slots), 2);
    assert_eq!(maps.contents.clusters.len(), 2);
    let FeKey::V4(k) = FeAddr::Wildcard(vip(1)).key() else {
        panic!()
    };
    assert_eq!(maps.contents.frontends4[&k].flags, FRONTEND_F_WILDCARD);
    // A second sync of the same table writes nothing.
    let again = sync_checked(&mut sync, &mut maps, &t);
    assert_eq!(again.writes, 0);
    assert!(again.changed.is_empty());
}

#[test]
fn sync_services_touches_only_the_services_named() {
    let (a, b) = (vip(1), vip(2));
    let t1 = table(&[
        ("a", a, vec![(80, vec![backend("x", v4(1), 80)])]),
        ("b", b, vec![(80, vec![backend("x", v4(2), 80)])]),
    ]);
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    sync_checked(&mut sync, &mut maps, &t1);
    let t2 = table(&[
        ("a", a, vec![(80, vec![backend("x", v4(3), 80)])]),
        ("b", b, vec![(80, vec![backend("x", v4(4), 80)])]),
    ]);
    // Only b is named: a keeps its old backends.
    let report = sync_services_checked(&mut sync, &mut maps, &t2, &[svc("b")]);
    assert_eq!(report.changed, vec![svc("b")]);
    let got = read_back(&maps.contents);
    let port = |ip| {
        FeAddr::Port(FrontendAddr {
            ip,
            port: 80,
            protocol: Protocol::Tcp,
        })
    };
    assert_eq!(got[&port(a)], desired::entries(&t1)[&port(a)]);
    assert_eq!(got[&port(b)], desired::entries(&t2)[&port(b)]);
    // A service that is gone from the table is removed when named.
    let t3 = table(&[("a", a, vec![(80, vec![backend("x", v4(3), 80)])])]);
    sync_services_checked(&mut sync, &mut maps, &t3, &[svc("a"), svc("b")]);
    assert_eq!(read_back(&maps.contents), desired::entries(&t3));
    // Naming an unchanged or unknown service writes nothing.
    let again = sync_services_checked(&mut sync, &mut maps, &t3, &[svc("a"), svc("zz")]);
    assert_eq!((again.writes, again.changed.len()), (0, 0));
}

/// A frontend belongs to the service that owns its VIP; one of another service's VIP (or of
/// no VIP) is never installed, by either scope.
#[test]
fn frontends_of_a_vip_another_service_owns_are_not_installed() {
    let a = vip(1);
    let mut t = table(&[("a", a, vec![(80, vec![backend("x", v4(1), 80)])])]);
    let stray = |ip, port| FrontendAddr {
        ip,
        port,
        protocol: Protocol::Tcp,
    };
    let fe = |name: &str| Frontend {
        service: svc(name),
        port_name: String::new(),
        affinity_timeout_s: None,
        backends: vec![backend("x", v4(9), 80)],
    };
    t.frontends.insert(stray(a, 81), fe("b"));
    t.frontends.insert(stray(vip(9), 80), fe("c"));
    assert_eq!(desired::entries(&t).len(), 2, "a:80 and a's wildcard");
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    sync_checked(&mut sync, &mut maps, &t);
    assert_eq!(read_back(&maps.contents), desired::entries(&t));
    let mut sync2 = MapSync::new(Capacities::default());
    let mut maps2 = MemMaps::new(Capacities::default());
    sync_services_checked(&mut sync2, &mut maps2, &t, &[svc("a"), svc("b"), svc("c")]);
    assert_eq!(read_back(&maps2.contents), desired::entries(&t));
}

#[test]
fn a_changed_backend_set_moves_to_a_new_range_and_the_old_one_waits_for_a_grace_period() {
    let caps = Capacities {
        slots: 4,
        ..Capacities::default()
    };
    let mut sync = MapSync::new(caps);
    let mut maps = MemMaps::new(caps);
    let t1 = table(&[(
        "web",
        vip(1),
        vec![(80, vec![backend("a", v4(1), 80), backend("a", v4(2), 80)])],
    )]);
    sync_checked(&mut sync, &mut maps, &t1);
    let t2 = table(&[(
        "web",
        vip(1),
        vec![(80, vec![backend("a", v4(2), 80), backend("b", v4(3), 80)])],
    )]);
    sync_checked(&mut sync, &mut maps, &t2);
    assert_eq!(read_back(&maps.contents), desired::entries(&t2));
    assert_eq!(maps.grace_periods, 0, "two free slots were left: no wait");
    // The third set needs the first range again: only after a grace period.
    sync_checked(&mut sync, &mut maps, &t1);
    assert_eq!(read_back(&maps.contents), desired::entries(&t1));
    assert_eq!(maps.grace_periods, 1);
    assert_eq!(
        maps.contents.clusters.len(),
        1,
        "cluster b is unused again: deleted"
    );
    // Removing the service removes everything it owned (stale slots are unreachable).
    sync_checked(&mut sync, &mut maps, &LbTable::default());
    let c = &maps.contents;
    assert!(c.frontends4.is_empty() && c.names.is_empty() && c.clusters.is_empty());
    assert_eq!(sync.size().slots, 0);
}

#[test]
fn a_full_map_refuses_the_service_whole_and_keeps_the_others() {
    let caps = Capacities {
        slots: 3,
        ..Capacities::default()
    };
    let mut sync = MapSync::new(caps);
    let mut maps = MemMaps::new(caps);
    let (a, b) = (vip(1), vip(2));
    let two = |h: u8| {
        vec![(
            80,
            vec![backend("x", v4(h), 80), backend("x", v4(h + 1), 80)],
        )]
    };
    let t1 = table(&[("a", a, two(1))]);
    sync_checked(&mut sync, &mut maps, &t1);
    let before = visible(&maps.contents);
    let t2 = table(&[("a", a, two(1)), ("b", b, two(3))]);
    let report = sync_checked(&mut sync, &mut maps, &t2);
    assert_eq!(report.failed.len(), 1);
    let msg = report.failed[0].to_string();
    assert!(
        msg.contains("MCS_SLOTS has no run of 2 free slots for service ns/b"),
        "{msg}"
    );
    // a untouched; of b only its VIP's wildcard, so that the VIP refuses instead of passing
    // through unrouted.
    let (mut seen, aff, clusters) = visible(&maps.contents);
    let wildcard = seen.remove(&FeAddr::Wildcard(b));
    assert_eq!(
        (seen, aff, clusters),
        before,
        "nothing else of b, a untouched"
    );
    assert_eq!(wildcard, Some((svc("b"), DesiredFrontend::wildcard())));
    // With room again (a shrinks), the next sync installs b.
    let t3 = table(&[("a", a, vec![(80, vec![])]), ("b", b, two(3))]);
    let report = sync_checked(&mut sync, &mut maps, &t3);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(read_back(&maps.contents), desired::entries(&t3));
}

#[test]
fn a_failed_write_is_undone_and_retried_by_the_next_sync() {
    let vip6 = IpAddr::V6("fd00::1".parse::<Ipv6Addr>().unwrap());
    let b6 = |n: u16| {
        backend(
            "c",
            IpAddr::V6(Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, n)),
            80,
        )
    };
    let t1 = table(&[("v6", vip6, vec![(80, vec![b6(1)])])]);
    let t2 = table(&[
        (
            "v6",
            vip6,
            vec![(80, vec![b6(1), b6(2), b6(3)]), (81, vec![b6(4)])],
        ),
        ("v4", vip(7), vec![(80, vec![backend("d", v4(1), 80)])]),
    ]);
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    sync_checked(&mut sync, &mut maps, &t1);
    for fail_at in 0..12 {
        let before = visible(&maps.contents);
        maps.fail_write_in = Some(fail_at);
        let report = sync_checked(&mut sync, &mut maps, &t2);
        maps.fail_write_in = None;
        if report.failed.is_empty() {
            // Past the last write: everything was written; start over from t1.
            assert_eq!(read_back(&maps.contents), desired::entries(&t2));
            sync_checked(&mut sync, &mut maps, &t1);
            continue;
        }
        assert_eq!(
            report.failed.len(),
            1,
            "fail_at {fail_at}: one service fails"
        );
        let failed = report.failed[0].service().clone();
        let after = read_back(&maps.contents);
        for (addr, (s, d)) in desired::entries(&t2) {
            if s != failed {
                assert_eq!(
                    after.get(&addr),
                    Some(&(s, d)),
                    "fail_at {fail_at}: the other one is written"
                );
            }
        }
        for (addr, entry) in &before.0 {
            if entry.0 == failed {
                assert_eq!(
                    after.get(addr),
                    Some(entry),
                    "fail_at {fail_at}: {failed} as it was"
                );
            }
        }
        // The mirror agrees with the maps: the next sync completes the table.
        let report = sync_checked(&mut sync, &mut maps, &t2);
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert_eq!(read_back(&maps.contents), desired::entries(&t2));
        sync_checked(&mut sync, &mut maps, &t1);
    }
}

#[test]
fn adoption_rebuilds_the_mirror_and_clears_unreachable_entries() {
    let mut t = table(&[(
        "web",
        vip(9),
        vec![(80, vec![backend("a", v4(1), 80), backend("b", v4(2), 81)])],
    )]);
    if let Some(fe) = t.frontends.values_mut().next() {
        fe.affinity_timeout_s = Some(30);
    }
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    sync_checked(&mut sync, &mut maps, &t);
    // Garbage an interrupted sync could leave: a name and an affinity match of an id nothing
    // uses, a cluster name nothing references.
    maps.contents.names.insert(77, FrontendName::default());
    let stray = AffinityMatchKey {
        frontend_id: 77,
        ..AffinityMatchKey::default()
    };
    maps.contents.affinity_match.insert(stray);
    maps.contents.clusters.insert(
        500,
        ClusterName {
            name: name_bytes("gone"),
        },
    );
    let contents = maps.contents.clone();
    let (mut adopted, cleanup) =
        MapSync::adopt(Capacities::default(), &contents, &mut maps).unwrap();
    assert_eq!(
        maps.grace_periods, 1,
        "adoption waits for a grace period first"
    );
    for op in [
        MapOp::DelName(77),
        MapOp::DelAffinityMatch(stray),
        MapOp::DelCluster(500),
    ] {
        assert!(cleanup.contains(&op), "{op:?} in {cleanup:?}");
    }
    assert_eq!(cleanup.len(), 3, "{cleanup:?}");
    for op in &cleanup {
        maps.apply(op).unwrap();
    }
    // The adopted mirror agrees with the maps: syncing the same table writes nothing.
    let report = sync_checked(&mut adopted, &mut maps, &t);
    assert_eq!(report.writes, 0, "{report:?}");
    assert_eq!(adopted.size(), sync.size());
}

/// Adopts what `maps` hold, as a restarted agent does, and syncs `t` over it.
pub(super) fn adopt_and_sync(maps: &mut MemMaps, t: &LbTable) -> (MapSync, SyncReport) {
    let contents = maps.contents.clone();
    let (mut adopted, _) = MapSync::adopt(Capacities::default(), &contents, maps).unwrap();
    let report = adopted.sync(Scope::All, desired::services(t, None), maps);
    (adopted, report)
}

/// A frontend whose range a reader would refuse (a slot overwritten, a crash mid-write) is
/// adopted as broken and rewritten by the next sync.
#[test]
fn adoption_marks_a_refused_range_broken_and_the_next_sync_rewrites_it() {
    let t = table(&[("web", vip(9), vec![(80, vec![backend("a", v4(1), 80)])])]);
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    sync_checked(&mut sync, &mut maps, &t);
    for slot in maps.contents.slots.values_mut() {
        slot.frontend_id += 100;
    }
    let (_, report) = adopt_and_sync(&mut maps, &t);
    assert_eq!(report.changed, [svc("web")]);
    assert_eq!(read_back(&maps.contents), desired::entries(&t));
    maps.contents.check_datapath_invariants().unwrap();
}

/// An IPv4 frontend of up to `INLINE_BACKENDS` backends carries copies of them; adoption keeps
/// such entries as they are, and rewrites one whose copies are not its slots.
#[test]
fn adoption_keeps_entries_that_carry_their_backends_and_rewrites_wrong_copies() {
    let few: Vec<Backend> = (1..=2).map(|h| backend("a", v4(h), 80)).collect();
    let many: Vec<Backend> = (1..=7).map(|h| backend("a", v4(h), 80)).collect();
    // With affinity, so that the affinity-match accounting is checked too.
    let t = lb_table()
        .service(svc("few"), vip(1))
        .tcp(80, "p80", few)
        .affinity(Some(30))
        .service(svc("many"), vip(2))
        .tcp(80, "p80", many)
        .affinity(Some(30))
        .build();
    let mut sync = MapSync::new(Capacities::default());
    let mut maps = MemMaps::new(Capacities::default());
    sync_checked(&mut sync, &mut maps, &t);
    let key = |last| match FeAddr::Port(FrontendAddr {
        ip: vip(last),
        port: 80,
        protocol: Protocol::Tcp,
    })
    .key()
    {
        FeKey::V4(k) => k,
        FeKey::V6(_) => panic!("an IPv4 VIP"),
    };
    let carries = |maps: &MemMaps, last| {
        maps.contents.frontends4[&key(last)].flags & dataplane_ebpf::FRONTEND_F_INLINE != 0
    };
    assert!(carries(&maps, 1), "2 backends: carried");
    assert!(!carries(&maps, 2), "7 backends: read from the slots");

    let (_, report) = adopt_and_sync(&mut maps, &t);
    assert!(report.changed.is_empty(), "{:?}", report.changed);

    fn copies<'m>(maps: &'m mut MemMaps, key: &FrontendKey4) -> &'m mut [InlineBackend] {
        &mut maps
            .contents
            .frontends4
            .get_mut(key)
            .expect("the entry")
            .inline
    }
    copies(&mut maps, &key(1))[1].port ^= 1;
    let (mut adopted, report) = adopt_and_sync(&mut maps, &t);
    assert_eq!(report.changed, [svc("few")]);
    assert_eq!(read_back(&maps.contents), desired::entries(&t));
    maps.contents.check_datapath_invariants().unwrap();
    // The value alone was rewritten: the ranges and affinity matches are counted once, and a
    // second sync changes nothing.
    let report = adopted.sync(Scope::All, desired::services(&t, None), &mut maps);
    assert!(report.changed.is_empty(), "{:?}", report.changed);
    assert_eq!(adopted.slots.used(), 2 + 7);
    assert_eq!(adopted.used_affinity, 2 + 7);
    assert_eq!(maps.contents.affinity_match.len(), 2 + 7);

    // A copy with the right backend and another frontend's tag is refused by the programs:
    // neither read back nor kept.
    copies(&mut maps, &key(1))[0].frontend_tag ^= 1;
    assert!(maps.contents.check_datapath_invariants().is_err());
    assert_ne!(read_back(&maps.contents), desired::entries(&t));
    let (_, report) = adopt_and_sync(&mut maps, &t);
    assert_eq!(report.changed, [svc("few")]);
    assert_eq!(read_back(&maps.contents), desired::entries(&t));
    maps.contents.check_datapath_invariants().unwrap();
}

/// Cluster ids are reference-counted: a thousand clusters coming and going one at a time fit
/// a map of four.
#[test]
fn cluster_names_that_go_away_free_their_ids() {
    let caps = Capacities {
        clusters: 4,
        ..Capacities::default()
    };
    let mut sync = MapSync::new(caps);
    let mut maps = MemMaps::new(caps);
    for i in 0..1000 {
        let t = table(&[(
            "web",
            vip(1),
            vec![(80, vec![backend(&format!("member-{i}"), v4(1), 80)])],
        )]);
        let report = sync_checked(&mut sync, &mut maps, &t);
        assert!(report.failed.is_empty(), "round {i}: {:?}", report.failed);
        assert_eq!(maps.contents.clusters.len(), 1);
    }
}

fn arb_table() -> impl Strategy<Value = LbTable> {
    // Up to 4 services, each with one VIP (v4 or v6) and up to 3 ports, each with up to 8
    // backends drawn from a small pool so sets overlap and change (and IPv4 frontends move
    // between carrying their backends, up to 6, and reading them from slots). A VIP's owner
    // is drawn too, so VIPs move between services from one table to the next. At most 4 x 2 x 8
    // backends in use: the tests' 128 slots hold them twice over (old and new ranges).
    let pooled_backend = (0u8..3, 1u8..6);
    let port = (
        prop::sample::select(vec![80u16, 443, 53]),
        prop::collection::vec(pooled_backend, 0..9),
        prop::bool::ANY,
    );
    let service = (
        0u8..6,
        0u8..3,
        prop::bool::ANY,
        prop::collection::vec(port, 1..3),
    );
    prop::collection::vec(service, 0..4).prop_map(|services| {
        let mut t = lb_table();
        let mut vips = BTreeSet::new();
        for (n, owner, v6, ports) in services {
            let vip = if v6 {
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n as u16))
            } else {
                IpAddr::V4(Ipv4Addr::new(241, 0, 0, n))
            };
            if !vips.insert(vip) {
                continue;
            }
            t = t.service(svc(&format!("s{}", (n + owner) % 6)), vip);
            for (port, backends, affinity) in ports {
                let mut bs: Vec<Backend> = backends
                    .into_iter()
                    .map(|(c, host)| {
                        let ip = if v6 {
                            IpAddr::V6(Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, host as u16))
                        } else {
                            v4(host)
                        };
                        backend(["a", "b", "c"][c as usize], ip, port)
                    })
                    .collect();
                bs.sort();
                bs.dedup();
                t = t.tcp(port, "", bs).affinity(affinity.then_some(30));
            }
        }
        t.build()
    })
}

proptest! {
    /// Naming only the services that changed gives the same maps as a full sync, with the same
    /// per-write checks.
    #[test]
    fn scope_services_of_the_changed_services_follows_any_sequence(tables in prop::collection::vec(arb_table(), 1..6)) {
        let caps = Capacities { slots: 128, ..Capacities::default() };
        let mut sync = MapSync::new(caps);
        let mut maps = MemMaps::new(caps);
        let mut prev = LbTable::default();
        for t in &tables {
            let changed = changed_services(&prev, t);
            let report = sync_services_checked(&mut sync, &mut maps, t, &changed);
            prop_assert!(report.failed.is_empty(), "{:?}", report.failed);
            prop_assert_eq!(read_back(&maps.contents), desired::entries(t));
            // Nothing is left for a full sync to do.
            let again = sync_checked(&mut sync, &mut maps, t);
            prop_assert_eq!(again.writes, 0);
            prev = t.clone();
        }
    }

    /// Any sequence of tables: after each sync the maps hold exactly the table, an adopted
    /// mirror agrees with them, and no single write along the way breaks an invariant, shows a
    /// reader a mixed set or rewrites a range a reader may still hold.
    #[test]
    fn maps_follow_any_sequence_of_tables(tables in prop::collection::vec(arb_table(), 1..6)) {
        let caps = Capacities { slots: 128, ..Capacities::default() };
        let mut sync = MapSync::new(caps);
        let mut maps = MemMaps::new(caps);
        for t in &tables {
            let report = sync_checked(&mut sync, &mut maps, t);
            prop_assert!(report.failed.is_empty(), "{:?}", report.failed);
            prop_assert_eq!(read_back(&maps.contents), desired::entries(t));
            let contents = maps.contents.clone();
            let (adopted, cleanup) = MapSync::adopt(caps, &contents, &mut maps).unwrap();
            prop_assert!(cleanup.is_empty(), "sync left garbage: {:?}", cleanup);
            prop_assert_eq!(adopted.size().slots, sync.size().slots);
            prop_assert_eq!(adopted.size().clusters, sync.size().clusters);
        }
        sync_checked(&mut sync, &mut maps, &LbTable::default());
        let c = &maps.contents;
        prop_assert!(c.frontends4.is_empty() && c.frontends6.is_empty());
        prop_assert!(c.affinity_match.is_empty() && c.names.is_empty() && c.clusters.is_empty());
    }

    /// With tight capacities some services are refused, but every service the report does
    /// not list as failed is exactly as desired, and failed ones are exactly as before.
    #[test]
    fn full_maps_refuse_whole_services_only(tables in prop::collection::vec(arb_table(), 1..6), cap in 2u32..8) {
        let caps = Capacities { slots: cap * 2, frontends: cap + 2, clusters: 2 };
        let mut sync = MapSync::new(caps);
        let mut maps = MemMaps::new(caps);
        for t in &tables {
            let before = read_back(&maps.contents);
            let report = sync_checked(&mut sync, &mut maps, t);
            let failed: BTreeSet<NamespacedName> =
                report.failed.iter().map(|e| e.service().clone()).collect();
            let after = read_back(&maps.contents);
            for (addr, (s, d)) in desired::entries(t) {
                if !failed.contains(&s) {
                    prop_assert_eq!(after.get(&addr), Some(&(s, d)));
                }
            }
            for (addr, entry) in &before {
                if failed.contains(&entry.0) && !desired::entries(t).contains_key(addr) {
                    prop_assert_eq!(after.get(addr), Some(entry));
                }
            }
        }
    }
}
