//! ClusterSet IP allocation.
//!
//! One IP per family of each ClusterSetIP import (headless imports get none), from the
//! family's CIDR in [`ClusterSetCidrs`]. The network address and the last address of the CIDR
//! (broadcast in IPv4; the same rule in IPv6, for symmetry) are never handed out.
//!
//! 1. Stickiness: an IP that the importing cluster's existing import of the same service holds
//!    is kept while it stays valid: inside the CIDR, usable, of a family the import still has,
//!    and not already kept by a service earlier in namespace/name order.
//! 2. The rest are allocated in namespace/name order: FNV-1a 64 of `namespace/name` picks a
//!    start offset, then linear probing finds the first free address. Neither step depends on
//!    the order of the inputs, and feeding the result back as the existing imports changes
//!    nothing.
//!
//! When a CIDR has fewer usable addresses than imports need, the imports that hold an address
//! of each of their families are served first, then those that hold some, then the others,
//! each in namespace/name order, until it is full: a new export never takes the address of an
//! import that clients use. Those left get no IPs at all (so `ips` always aligns with
//! `ipFamilies`; one that held an address of some family gives it up), and the caller marks
//! them `Ready=False`.

use std::{
    collections::{BTreeMap, HashMap},
    hash::BuildHasher,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use foldhash::{HashSet, HashSetExt};

use super::ClusterSetCidrs;
use crate::model::{IpFamily, NamespacedName};

/// A service that needs one IP per family, in this order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    pub service: &'a NamespacedName,
    pub families: &'a [IpFamily],
}

/// FNV-1a, 64 bits: stable across Rust versions and platforms, unlike `DefaultHasher`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_parts(&[bytes])
}

/// FNV-1a of the concatenation of `parts`, without building it.
pub fn fnv1a_parts(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().copied().flatten() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The usable addresses of one CIDR: offsets `1..=usable` from the network address. The
/// addresses held outside the requests are looked up where they are kept, not copied: an
/// update of one service allocates against 10,000 held addresses.
struct Pool<'a, S> {
    family: IpFamily,
    base: u128,
    /// Number of usable offsets (0 when the CIDR is too small); capped at 2^64.
    usable: u128,
    /// Held by services outside the requests.
    held: &'a HashMap<IpAddr, NamespacedName, S>,
    /// How many of `held` are usable addresses of this pool (counted by [`allocate`]).
    held_here: u128,
    /// Given to the requests so far.
    taken: HashSet<u128>,
}

impl<'a, S: BuildHasher> Pool<'a, S> {
    fn new(
        family: IpFamily,
        base: u128,
        host_bits: u32,
        held: &'a HashMap<IpAddr, NamespacedName, S>,
    ) -> Self {
        let usable = if host_bits >= 65 {
            1u128 << 64
        } else {
            (1u128 << host_bits).saturating_sub(2)
        };
        Self {
            family,
            base,
            usable,
            held,
            held_here: 0,
            taken: HashSet::new(),
        }
    }

    /// Usable offsets nobody holds yet.
    fn free(&self) -> u128 {
        self.usable
            .saturating_sub(self.held_here + self.taken.len() as u128)
    }

    fn offset_of(&self, ip: &IpAddr) -> Option<u128> {
        let raw = match (ip, self.family) {
            (IpAddr::V4(v4), IpFamily::IPv4) => u128::from(u32::from(*v4)),
            (IpAddr::V6(v6), IpFamily::IPv6) => u128::from(*v6),
            _ => return None,
        };
        let off = raw.checked_sub(self.base)?;
        (1..=self.usable).contains(&off).then_some(off)
    }

    fn addr(&self, offset: u128) -> IpAddr {
        let raw = self.base + offset;
        match self.family {
            IpFamily::IPv4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(raw).unwrap_or(0))),
            IpFamily::IPv6 => IpAddr::V6(Ipv6Addr::from(raw)),
        }
    }

    /// Takes `ip` for a request, if it is a usable address nobody holds.
    fn claim(&mut self, ip: &IpAddr) -> bool {
        match self.offset_of(ip) {
            Some(off) => !self.held.contains_key(ip) && self.taken.insert(off),
            None => false,
        }
    }

    /// Gives back an address [`claim`](Self::claim) took.
    fn release(&mut self, ip: &IpAddr) {
        if let Some(off) = self.offset_of(ip) {
            self.taken.remove(&off);
        }
    }

    fn allocate(&mut self, service: &NamespacedName) -> Option<IpAddr> {
        if self.usable == 0 {
            return None;
        }
        // The hash of `namespace/name`.
        let hash = fnv1a_parts(&[service.namespace.as_bytes(), b"/", service.name.as_bytes()]);
        let start = u128::from(hash) % self.usable;
        // Bounded by the pool size; a full pool ends the loop without a result.
        let mut i: u128 = 0;
        while i < self.usable {
            let off = 1 + (start + i) % self.usable;
            let addr = self.addr(off);
            if !self.held.contains_key(&addr) && self.taken.insert(off) {
                return Some(addr);
            }
            i += 1;
        }
        None
    }
}

/// What [`allocate`] gave out.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Allocation {
    /// Per service whose every family got an IP, the IPs aligned with its families.
    pub ips: BTreeMap<NamespacedName, Vec<IpAddr>>,
    /// The services a CIDR had no room left for, in namespace/name order.
    pub starved: Vec<NamespacedName>,
}

/// Allocates the IPs of `requests`, keeping each service's `existing` IPs while valid and
/// never handing out an address in `taken` (held by services outside the requests).
pub(crate) fn allocate<S>(
    requests: &[Request<'_>],
    existing: &HashMap<NamespacedName, Vec<IpAddr>, S>,
    cidrs: &ClusterSetCidrs,
    taken: &HashMap<IpAddr, NamespacedName, S>,
) -> Allocation
where
    S: BuildHasher,
{
    let mut v4 = Pool::new(
        IpFamily::IPv4,
        u128::from(u32::from(cidrs.ipv4.network())),
        u32::from(32 - cidrs.ipv4.prefix_len()),
        taken,
    );
    let mut v6 = Pool::new(
        IpFamily::IPv6,
        u128::from(cidrs.ipv6.network()),
        u32::from(128 - cidrs.ipv6.prefix_len()),
        taken,
    );
    // One walk over the held addresses counts those of both pools, which only matters when
    // a pool may be too small for the requests: with room for every held address and every
    // request, nobody starves whatever the count. An update of one service skips the walk
    // over the other 10,000.
    let most_needed = taken.len() as u128 + requests.len() as u128;
    if v4.usable < most_needed || v6.usable < most_needed {
        for ip in taken.keys() {
            let pool = match ip {
                IpAddr::V4(_) => &mut v4,
                IpAddr::V6(_) => &mut v6,
            };
            if pool.offset_of(ip).is_some() {
                pool.held_here += 1;
            }
        }
    }
    // When a CIDR is too small, the services that can keep an address of every family they
    // ask for come first, then those that can keep some, then the others, each group in
    // namespace/name order: a newly exported service (or one that adds a family) waits for
    // an address rather than taking one that clients of another service use. Each service
    // claims, in name order, what it can keep (stickiness: in the pool, held by nobody
    // outside the requests, not kept by a service earlier in name order), so the first group
    // always fits, and feeding the result back cannot change who has an IP: those who got one
    // hold all of theirs, the others hold none.
    let (mut left4, mut left6) = (v4.free(), v6.free());
    let mut by_name: Vec<Request<'_>> = requests.to_vec();
    by_name.sort_by(|a, b| a.service.cmp(b.service));
    // (rank, request, the address it keeps per family), in name order.
    let mut ranked: Vec<(u8, Request<'_>, Vec<Option<IpAddr>>)> = by_name
        .into_iter()
        .map(|r| {
            let ips = existing.get(r.service).map_or(&[][..], Vec::as_slice);
            let keeps: Vec<Option<IpAddr>> = r
                .families
                .iter()
                .map(|family| {
                    let pool = match family {
                        IpFamily::IPv4 => &mut v4,
                        IpFamily::IPv6 => &mut v6,
                    };
                    ips.iter().copied().find(|ip| pool.claim(ip))
                })
                .collect();
            let rank = match keeps.iter().flatten().count() {
                0 => 2u8,
                n if n == keeps.len() => 0,
                _ => 1,
            };
            (rank, r, keeps)
        })
        .collect();
    // Stable: name order within each group.
    ranked.sort_by_key(|(rank, _, _)| *rank);
    let mut starved = Vec::new();
    ranked.retain(|(_, r, keeps)| {
        let need4 = u128::from(r.families.contains(&IpFamily::IPv4));
        let need6 = u128::from(r.families.contains(&IpFamily::IPv6));
        if left4 >= need4 && left6 >= need6 {
            left4 -= need4;
            left6 -= need6;
            true
        } else {
            // It gets no IPs at all: what it kept is free again.
            for ip in keeps.iter().flatten() {
                match ip {
                    IpAddr::V4(_) => v4.release(ip),
                    IpAddr::V6(_) => v6.release(ip),
                }
            }
            starved.push(r.service.clone());
            false
        }
    });
    let (sorted, mut chosen): (Vec<Request<'_>>, Vec<Vec<Option<IpAddr>>>) =
        ranked.into_iter().map(|(_, r, keeps)| (r, keeps)).unzip();
    let mut out = Vec::with_capacity(sorted.len());
    for (r, slots) in sorted.iter().zip(&mut chosen) {
        for (i, f) in r.families.iter().enumerate() {
            if slots[i].is_none() {
                let pool = match f {
                    IpFamily::IPv4 => &mut v4,
                    IpFamily::IPv6 => &mut v6,
                };
                slots[i] = pool.allocate(r.service);
            }
        }
        if slots.iter().all(Option::is_some) {
            out.push((r.service.clone(), slots.iter().flatten().copied().collect()));
        }
    }
    starved.sort();
    Allocation {
        ips: out.into_iter().collect(),
        starved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::import;
    use crate::model::records::ImportRecord;

    fn nn(n: &str) -> NamespacedName {
        NamespacedName::new("demo", n)
    }

    /// The record of a fixture import.
    fn record(builder: crate::fixtures::ImportBuilder) -> ImportRecord {
        ImportRecord::from_k8s(&builder.build(), &crate::model::Interner::new(), false)
            .into_record()
            .expect("an import always converts")
    }

    /// [`allocate`] with the IPs `existing` hold and nothing taken: what each service got.
    fn alloc(
        reqs: &[Request<'_>],
        existing: &[ImportRecord],
        cidrs: &ClusterSetCidrs,
    ) -> BTreeMap<NamespacedName, Vec<IpAddr>> {
        allocate_all(reqs, existing, cidrs).ips
    }

    /// [`allocate`] with the IPs `existing` hold and nothing taken, whole.
    fn allocate_all(
        reqs: &[Request<'_>],
        existing: &[ImportRecord],
        cidrs: &ClusterSetCidrs,
    ) -> Allocation {
        let existing: std::collections::HashMap<NamespacedName, Vec<IpAddr>> = existing
            .iter()
            .map(|i| (i.service.clone(), i.ips.clone()))
            .collect();
        allocate(reqs, &existing, cidrs, &std::collections::HashMap::new())
    }

    /// CIDRs whose IPv4 one has two usable addresses.
    fn two_ipv4() -> ClusterSetCidrs {
        ClusterSetCidrs {
            ipv4: "10.9.0.0/30".parse().expect("cidr"),
            ..Default::default()
        }
    }

    /// An IPv4 request for each of `services`, in order.
    fn ipv4_requests<'a>(services: &[&'a NamespacedName]) -> Vec<Request<'a>> {
        const V4: &[IpFamily] = &[IpFamily::IPv4];
        services
            .iter()
            .map(|service| Request {
                service,
                families: V4,
            })
            .collect()
    }

    /// The allocation as text, to compare with addresses written out.
    fn text(got: &BTreeMap<NamespacedName, Vec<IpAddr>>) -> BTreeMap<NamespacedName, Vec<String>> {
        got.iter()
            .map(|(s, ips)| (s.clone(), ips.iter().map(IpAddr::to_string).collect()))
            .collect()
    }

    #[test]
    fn allocates_in_range_aligned_and_skips_network_and_broadcast() {
        let cidrs = ClusterSetCidrs {
            ipv4: "10.9.0.0/30".parse().expect("cidr"),
            ipv6: "fd00::/126".parse().expect("cidr"),
        };
        let names = [nn("a"), nn("b"), nn("c")];
        let both = [IpFamily::IPv6, IpFamily::IPv4];
        let reqs: Vec<Request<'_>> = names
            .iter()
            .map(|s| Request {
                service: s,
                families: &both,
            })
            .collect();
        let got = text(&alloc(&reqs, &[], &cidrs));
        // /30 has two usable addresses: a and b get them, c gets nothing.
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(!got.contains_key(&nn("c")));
        let mut v4: Vec<&str> = got.values().map(|ips| ips[1].as_str()).collect();
        v4.sort();
        assert_eq!(v4, vec!["10.9.0.1", "10.9.0.2"]);
        for ips in got.values() {
            assert!(ips[0].starts_with("fd00::"), "{ips:?}");
            assert!(!["fd00::", "fd00::3"].contains(&ips[0].as_str()));
        }
    }

    #[test]
    fn keeps_valid_existing_ips_and_replaces_invalid_ones() {
        let cidrs = ClusterSetCidrs::default();
        let (a, b, c) = (nn("a"), nn("b"), nn("c"));
        let reqs = ipv4_requests(&[&a, &b, &c]);
        let existing = [
            record(import("demo", "a").ips(["241.0.3.4"])),
            // the same IP claimed by b: a is earlier in order and keeps it
            record(import("demo", "b").ips(["241.0.3.4"])),
            // out of range
            record(import("demo", "c").ips(["10.0.0.1"])),
        ];
        let allocated = alloc(&reqs, &existing, &cidrs);
        let got = text(&allocated);
        assert_eq!(got[&a], vec!["241.0.3.4"]);
        assert_ne!(got[&b], vec!["241.0.3.4"]);
        assert!(got[&c][0].starts_with("241.0."));
        // Stable when fed back, in any order.
        let back: Vec<ImportRecord> = got
            .iter()
            .rev()
            .map(|(s, ips)| record(import("demo", &s.name).ips(ips)))
            .collect();
        assert_eq!(alloc(&reqs, &back, &cidrs), allocated);
    }

    /// A CIDR with room for two: `c` holds one of its addresses and keeps it; of the
    /// newcomers `a` and `b`, the first in order gets the other address. An address that is
    /// not the CIDR's does not count as held.
    #[test]
    fn a_full_cidr_serves_the_services_holding_its_addresses_first() {
        let cidrs = two_ipv4();
        let (a, b, c) = (nn("a"), nn("b"), nn("c"));
        let reqs = ipv4_requests(&[&c, &a, &b]);
        let allocated = alloc(
            &reqs,
            &[record(import("demo", "c").ips(["10.9.0.1"]))],
            &cidrs,
        );
        let got = text(&allocated);
        assert_eq!(
            got,
            BTreeMap::from([
                (a.clone(), vec!["10.9.0.2".to_owned()]),
                (c.clone(), vec!["10.9.0.1".to_owned()]),
            ])
        );
        let back: Vec<ImportRecord> = got
            .iter()
            .map(|(s, ips)| record(import("demo", &s.name).ips(ips)))
            .collect();
        assert_eq!(alloc(&reqs, &back, &cidrs), allocated);

        // c's address from another CIDR: the first two in order are served.
        let elsewhere = alloc(
            &reqs,
            &[record(import("demo", "c").ips(["10.8.0.1"]))],
            &cidrs,
        );
        assert_eq!(elsewhere.keys().collect::<Vec<_>>(), vec![&a, &b]);
    }

    /// A service that holds an address of one of its families only (it added a family) comes
    /// after those that hold all of theirs: with room for two IPv4 addresses, `b` and `c`
    /// keep theirs and `a`, which holds only its IPv6 one, waits (it would have taken `c`'s).
    #[test]
    fn a_full_cidr_serves_the_services_holding_every_family_first() {
        let cidrs = two_ipv4();
        let (a, b, c) = (nn("a"), nn("b"), nn("c"));
        let dual = [IpFamily::IPv4, IpFamily::IPv6];
        let mut reqs = ipv4_requests(&[&b, &c]);
        reqs.push(Request {
            service: &a,
            families: &dual,
        });
        let existing = [
            record(import("demo", "a").ips(["fd00:241::5"])),
            record(import("demo", "b").ips(["10.9.0.1"])),
            record(import("demo", "c").ips(["10.9.0.2"])),
        ];
        let got = text(&alloc(&reqs, &existing, &cidrs));
        assert_eq!(
            got,
            BTreeMap::from([
                (b.clone(), vec!["10.9.0.1".to_owned()]),
                (c.clone(), vec!["10.9.0.2".to_owned()]),
            ])
        );
    }

    /// Addresses held by services outside the requests count against a small pool, and a
    /// pool large enough for all of them and the requests starves nobody.
    #[test]
    fn addresses_held_outside_the_requests_leave_room_only_for_the_rest() {
        let (a, b, held_by) = (nn("a"), nn("b"), nn("z"));
        let reqs = ipv4_requests(&[&a, &b]);
        let held: std::collections::HashMap<IpAddr, NamespacedName> =
            std::collections::HashMap::from([("10.9.0.2".parse().expect("ip"), held_by)]);
        let small = two_ipv4();
        let none = std::collections::HashMap::new();
        let got = allocate(&reqs, &none, &small, &held);
        assert_eq!(
            text(&got.ips),
            BTreeMap::from([(a.clone(), vec!["10.9.0.1".to_owned()])])
        );
        assert_eq!(got.starved, vec![b.clone()]);

        let got = allocate(&reqs, &none, &ClusterSetCidrs::default(), &held);
        assert_eq!(got.ips.len(), 2);
        assert!(got.starved.is_empty());
    }

    #[test]
    fn network_and_broadcast_are_never_kept() {
        let cidrs = ClusterSetCidrs::default();
        let a = nn("a");
        let v4 = [IpFamily::IPv4];
        for bad in ["241.0.0.0", "241.0.255.255"] {
            let got = alloc(
                &[Request {
                    service: &a,
                    families: &v4,
                }],
                &[record(import("demo", "a").ips([bad]))],
                &cidrs,
            );
            assert_ne!(got[&a][0].to_string(), bad);
        }
    }

    /// Two imports that list one address (stale imports read at a restart): the first in
    /// order keeps it, and the other, needing a new one, never takes the address a third
    /// import holds alone; with room for two, it waits.
    #[test]
    fn a_shared_address_does_not_make_its_second_holder_take_another_ones() {
        let (a, b, c) = (nn("a"), nn("b"), nn("c"));
        let reqs = ipv4_requests(&[&a, &b, &c]);
        let existing = [
            record(import("demo", "a").ips(["10.9.0.1"])),
            record(import("demo", "b").ips(["10.9.0.1"])),
            record(import("demo", "c").ips(["10.9.0.2"])),
        ];
        let got = allocate_all(&reqs, &existing, &two_ipv4());
        assert_eq!(
            text(&got.ips),
            BTreeMap::from([
                (a.clone(), vec!["10.9.0.1".to_owned()]),
                (c.clone(), vec!["10.9.0.2".to_owned()]),
            ])
        );
        assert_eq!(got.starved, vec![b]);
    }

    /// Addresses of two-address pools (and their network and last addresses, never usable).
    const POOL_ADDRESSES: [&str; 8] = [
        "10.9.0.0", "10.9.0.1", "10.9.0.2", "10.9.0.3", "fd00::", "fd00::1", "fd00::2", "fd00::3",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]

        /// In pools too small for everyone: a service holding, for every family it asks for,
        /// a usable address that no other service's import lists keeps exactly those; and
        /// feeding the allocation back changes nothing.
        #[test]
        fn a_sole_holder_keeps_its_addresses_and_the_result_is_stable(
            services in proptest::collection::vec(
                // Usable addresses twice as often as the others.
                (
                    0u8..3,
                    proptest::collection::vec(
                        proptest::sample::select(vec![1usize, 2, 1, 2, 5, 6, 5, 6, 0, 3, 4, 7]),
                        0..3,
                    ),
                ),
                1..6,
            ),
        ) {
            const FAMILIES: [&[IpFamily]; 3] = [
                &[IpFamily::IPv4],
                &[IpFamily::IPv6],
                &[IpFamily::IPv4, IpFamily::IPv6],
            ];
            let cidrs = ClusterSetCidrs {
                ipv4: "10.9.0.0/30".parse().expect("cidr"),
                ipv6: "fd00::/126".parse().expect("cidr"),
            };
            let names: Vec<NamespacedName> =
                (0..services.len()).map(|i| nn(&format!("s{i}"))).collect();
            let reqs: Vec<Request<'_>> = names
                .iter()
                .zip(&services)
                .map(|(service, (f, _))| Request { service, families: FAMILIES[*f as usize] })
                .collect();
            let listed: Vec<Vec<IpAddr>> = services
                .iter()
                .map(|(_, ips)| ips.iter().map(|i| POOL_ADDRESSES[*i].parse().expect("ip")).collect())
                .collect();
            let existing: Vec<ImportRecord> = names
                .iter()
                .zip(&listed)
                .map(|(n, ips)| {
                    let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
                    record(import("demo", &n.name).ips(ips))
                })
                .collect();
            let got = allocate_all(&reqs, &existing, &cidrs);
            let usable = |ip: &IpAddr| {
                ["10.9.0.1", "10.9.0.2", "fd00::1", "fd00::2"].contains(&ip.to_string().as_str())
            };
            for (i, r) in reqs.iter().enumerate() {
                let sole: Option<Vec<IpAddr>> = r
                    .families
                    .iter()
                    .map(|f| {
                        listed[i].iter().copied().find(|ip| IpFamily::of(ip) == *f && usable(ip))
                    })
                    .collect();
                let Some(sole) = sole else { continue };
                let shared = listed
                    .iter()
                    .enumerate()
                    .any(|(j, other)| j != i && other.iter().any(|ip| sole.contains(ip)));
                if !shared {
                    proptest::prop_assert_eq!(got.ips.get(r.service), Some(&sole), "{:?}", got);
                }
            }
            let back: Vec<ImportRecord> = got
                .ips
                .iter()
                .map(|(s, ips)| {
                    let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
                    record(import("demo", &s.name).ips(ips))
                })
                .collect();
            proptest::prop_assert_eq!(allocate_all(&reqs, &back, &cidrs), got);
        }
    }
}
