//! The map ABI shared by the eBPF programs (`src/main.rs`) and the agent.
//!
//! Every key and value is `#[repr(C)]` with explicit padding, so the layout is the same in the
//! kernel and in userspace. The maps are BTF-defined, so `bpftool map dump` prints every field
//! by name. Addresses and ports are kept
//! in network byte order, exactly as `struct bpf_sock_addr` holds them, so the datapath never
//! converts. Change any layout here and bump [`PIN_VERSION`].
//!
//! # Datapath invariants (kept by the agent's map sync, relied on by the programs)
//!
//! 1. A frontend's slots live under its *active bank*: `SlotKey { frontend_id, bank, index }` for
//!    `index < count`. The agent writes a whole new backend set into the other bank, then flips
//!    `bank` and `count` in one frontend update, then deletes the old bank. A reader therefore
//!    sees either the old set or the new set, never a mix and never a missing slot.
//! 2. Every slot of an active bank names a backend id that is present in `BACKENDS`. Backends are
//!    written before the slots that point at them, and deleted only after no slot does.
//! 3. A frontend with `count == 0`, and a wildcard frontend (`port == 0 && proto == 0`, flag
//!    [`FRONTEND_F_WILDCARD`]), reject the connection with `ECONNREFUSED`.
//! 4. `AFFINITY_MATCH` holds `(frontend, backend)` while the backend is in the frontend's set, so
//!    a stale affinity entry is never followed to a removed backend.
#![no_std]

/// Version of the map layout. Pins live under `<pin root>/v{PIN_VERSION}`.
pub const PIN_VERSION: u32 = 1;

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;
pub const ECONNREFUSED: i32 = 111;
pub const ENOMEM: i32 = 12;

/// The frontend rejects every connection (a known VIP on a port it does not serve).
pub const FRONTEND_F_WILDCARD: u8 = 1;
/// The frontend has ClientIP session affinity; `affinity_timeout_s` applies.
pub const FRONTEND_F_AFFINITY: u8 = 2;

/// Map names, as they appear in the object, in `bpftool map list` and as pin file names.
pub mod map_names {
    pub const FRONTENDS4: &str = "MCS_FE4";
    pub const FRONTENDS6: &str = "MCS_FE6";
    pub const SLOTS: &str = "MCS_SLOTS";
    pub const BACKENDS: &str = "MCS_BACKENDS";
    pub const AFFINITY: &str = "MCS_AFFINITY";
    pub const AFFINITY_MATCH: &str = "MCS_AFF_MATCH";
    pub const REVNAT4: &str = "MCS_REVNAT4";
    pub const REVNAT6: &str = "MCS_REVNAT6";
    pub const COUNTERS: &str = "MCS_COUNTERS";
    pub const FRONTEND_NAMES: &str = "MCS_FE_NAMES";
    pub const CLUSTER_NAMES: &str = "MCS_CLUSTERS";
    pub const SOCK_REVNAT: &str = "MCS_SK_REVNAT";
    /// Every map the agent owns, in the order `inspect` and `uninstall` walk them.
    pub const ALL: [&str; 12] = [
        FRONTENDS4,
        FRONTENDS6,
        SLOTS,
        BACKENDS,
        AFFINITY,
        AFFINITY_MATCH,
        REVNAT4,
        REVNAT6,
        COUNTERS,
        FRONTEND_NAMES,
        CLUSTER_NAMES,
        SOCK_REVNAT,
    ];
}

/// The do-nothing programs in the object (`r0 = 1; exit`), by the hook they stand in for. The
/// agent never loads them; the benchmark attaches them next to the real programs to measure the
/// floor of a program run on the same calls.
pub const FLOOR_PROGRAMS: [(&str, &str); 4] = [
    ("connect4", "noop_connect4"),
    ("connect6", "noop_connect6"),
    ("sendmsg4", "noop_sendmsg4"),
    ("recvmsg4", "noop_recvmsg4"),
];

/// Default capacities, overridable at load time.
pub mod defaults {
    pub const MAX_FRONTENDS: u32 = 65536;
    pub const MAX_BACKENDS: u32 = 65536;
    /// Slots are (frontend, backend) pairs; a backend usually serves a few ports.
    pub const MAX_SLOTS: u32 = 262144;
    pub const MAX_AFFINITY: u32 = 65536;
    pub const MAX_REVNAT: u32 = 131072;
}

/// Frontend key for IPv4: (VIP, port, protocol). `port == 0 && proto == 0` is the per-VIP
/// wildcard that rejects undeclared ports.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey4 {
    /// VIP, network byte order.
    pub addr: u32,
    /// Port, network byte order.
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
}

/// Frontend key for IPv6.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey6 {
    /// VIP as four network-order words, as in `bpf_sock_addr.user_ip6`.
    pub addr: [u32; 4],
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
}

/// The master entry of a frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frontend {
    /// Frontend id, `1..max_frontends`; keys `SLOTS`, `COUNTERS`, `AFFINITY`, `FRONTEND_NAMES`.
    pub id: u32,
    /// Number of slots in the active bank. 0 rejects.
    pub count: u16,
    /// Active slot bank, 0 or 1.
    pub bank: u8,
    pub flags: u8,
    /// ClientIP affinity timeout in seconds (with [`FRONTEND_F_AFFINITY`]).
    pub affinity_timeout_s: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    pub frontend_id: u32,
    pub bank: u16,
    pub index: u16,
}

/// The value of a slot: which backend it points at.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub backend_id: u32,
}

/// A backend endpoint. IPv4 addresses use `addr[0]` and leave the rest zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend {
    pub addr: [u32; 4],
    /// Port, network byte order.
    pub port: u16,
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u8,
    pub proto: u8,
    /// Index into `CLUSTER_NAMES`: which cluster the endpoint comes from.
    pub cluster: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    /// Network-namespace cookie of the client: at socket level the client is its netns.
    pub netns_cookie: u64,
    pub frontend_id: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    /// `bpf_ktime_get_ns` of the last use.
    pub last_used_ns: u64,
    pub backend_id: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AffinityMatchKey {
    pub frontend_id: u32,
    pub backend_id: u32,
}

/// Reverse translation for a socket: which VIP a (socket, backend) pair stands for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RevNatKey4 {
    pub cookie: u64,
    pub backend_addr: u32,
    pub backend_port: u16,
    pub _pad: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevNatValue4 {
    pub vip: u32,
    pub vip_port: u16,
    pub _pad: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RevNatKey6 {
    pub cookie: u64,
    pub backend_addr: [u32; 4],
    pub backend_port: u16,
    pub _pad: [u16; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevNatValue6 {
    pub vip: [u32; 4],
    pub vip_port: u16,
    pub _pad: u16,
}

/// The reverse translation of a connected socket (TCP, or UDP after `connect`), kept in the
/// socket's own storage (`MCS_SK_REVNAT`, socket-local storage: it goes with the socket). A
/// connected socket has one peer, so one entry answers `getpeername` and the socket's
/// `recvmsg`. Addresses as in [`Backend`]: IPv4 in word 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockRevNat {
    pub backend: [u32; 4],
    pub vip: [u32; 4],
    /// Port, network byte order.
    pub backend_port: u16,
    pub vip_port: u16,
    /// [`AF_INET`] (also for IPv4-mapped peers of dual-stack sockets) or [`AF_INET6`]; 0: empty.
    pub family: u8,
    pub _pad: [u8; 3],
}

/// Per-CPU counters of one frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub translations: u64,
    pub affinity_hits: u64,
    pub rejects: u64,
}

/// Length of the fixed name fields; Kubernetes names and labels fit in 63 bytes.
pub const NAME_LEN: usize = 64;

/// Service identity of a frontend, for `inspect`. Written by the agent only.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrontendName {
    pub namespace: [u8; NAME_LEN],
    pub name: [u8; NAME_LEN],
    pub port_name: [u8; NAME_LEN],
}

impl Default for FrontendName {
    fn default() -> Self {
        Self {
            namespace: [0; NAME_LEN],
            name: [0; NAME_LEN],
            port_name: [0; NAME_LEN],
        }
    }
}

/// A cluster id, NUL-padded. Written by the agent only.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterName {
    pub name: [u8; NAME_LEN],
}

impl Default for ClusterName {
    fn default() -> Self {
        Self {
            name: [0; NAME_LEN],
        }
    }
}

/// Picks the slot index for a random draw. `count` must be non-zero.
#[inline(always)]
pub fn pick_slot(random: u32, count: u16) -> u16 {
    (random % count as u32) as u16
}

/// A well-spread 32-bit draw from a socket cookie (cookies count up from 1), so that the
/// sockets of one client spread over the backends like random draws would.
#[inline(always)]
pub fn cookie_hash(cookie: u64) -> u32 {
    (cookie.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// The third word of an IPv4-mapped IPv6 address (`::ffff:0:0/96`) as `user_ip6` holds it.
const V4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The IPv4 address (as `user_ip4` holds it) of an IPv4-mapped IPv6 address
/// `::ffff:a.b.c.d` (as `user_ip6` holds it), or `None` for any other address.
#[inline(always)]
pub fn ip6_mapped_v4(addr: [u32; 4]) -> Option<u32> {
    (addr[0] == 0 && addr[1] == 0 && addr[2] == V4_MAPPED_WORD).then_some(addr[3])
}

/// `::ffff:a.b.c.d` for an IPv4 address, in `user_ip6` form.
#[inline(always)]
pub fn ip6_v4_mapped(v4: u32) -> [u32; 4] {
    [0, 0, V4_MAPPED_WORD, v4]
}

/// Whether an affinity entry last used at `last_used_ns` is still valid at `now_ns`.
#[inline(always)]
pub fn affinity_fresh(now_ns: u64, last_used_ns: u64, timeout_s: u32) -> bool {
    now_ns.saturating_sub(last_used_ns) < (timeout_s as u64) * 1_000_000_000
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    macro_rules! pod {
        ($($t:ty),*) => { $(unsafe impl aya::Pod for $t {})* };
    }
    pod!(
        FrontendKey4,
        FrontendKey6,
        Frontend,
        SlotKey,
        Slot,
        Backend,
        AffinityKey,
        AffinityValue,
        AffinityMatchKey,
        RevNatKey4,
        RevNatValue4,
        RevNatKey6,
        RevNatValue6,
        Counters,
        FrontendName,
        ClusterName,
        SockRevNat
    );
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::*;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<FrontendKey4>(), 8);
        assert_eq!(size_of::<FrontendKey6>(), 20);
        assert_eq!(size_of::<Frontend>(), 16);
        assert_eq!(size_of::<SlotKey>(), 8);
        assert_eq!(size_of::<Backend>(), 24);
        assert_eq!(size_of::<AffinityKey>(), 16);
        assert_eq!(size_of::<AffinityValue>(), 16);
        assert_eq!(size_of::<RevNatKey4>(), 16);
        assert_eq!(size_of::<RevNatValue4>(), 8);
        assert_eq!(size_of::<RevNatKey6>(), 32);
        assert_eq!(size_of::<RevNatValue6>(), 20);
        assert_eq!(size_of::<Counters>(), 24);
        assert_eq!(size_of::<SockRevNat>(), 40);
        assert_eq!(size_of::<FrontendName>(), 3 * NAME_LEN);
    }

    #[test]
    fn pick_slot_stays_in_range() {
        for count in [1u16, 2, 3, 7, 65535] {
            for r in [0u32, 1, 12345, u32::MAX] {
                assert!(pick_slot(r, count) < count);
            }
        }
    }

    #[test]
    fn v4_mapped_addresses_round_trip() {
        let word = |o: [u8; 4]| u32::from_ne_bytes(o);
        let mapped = [0, 0, word([0, 0, 0xff, 0xff]), word([241, 0, 0, 10])];
        assert_eq!(ip6_mapped_v4(mapped), Some(word([241, 0, 0, 10])));
        assert_eq!(ip6_v4_mapped(word([241, 0, 0, 10])), mapped);
        // ::ffff:0:0/96 only: not IPv4-compatible (::a.b.c.d), not ::1, not fd00::ffff:...
        assert_eq!(ip6_mapped_v4([0, 0, 0, word([241, 0, 0, 10])]), None);
        assert_eq!(ip6_mapped_v4([0, 0, 0, word([0, 0, 0, 1])]), None);
        assert_eq!(
            ip6_mapped_v4([word([0xfd, 0, 0, 0]), 0, mapped[2], mapped[3]]),
            None
        );
    }

    #[test]
    fn cookie_draws_spread_consecutive_cookies() {
        // 4000 consecutive cookies over 4 slots: each slot gets close to a quarter.
        let mut per_slot = [0u32; 4];
        for cookie in 1..=4000u64 {
            per_slot[pick_slot(cookie_hash(cookie), 4) as usize] += 1;
        }
        assert!(
            per_slot.iter().all(|n| (900..=1100).contains(n)),
            "{per_slot:?}"
        );
        // The same socket always draws the same.
        assert_eq!(cookie_hash(77), cookie_hash(77));
    }

    #[test]
    fn affinity_expires_after_timeout() {
        let s = 1_000_000_000u64;
        assert!(affinity_fresh(10 * s, 5 * s, 10));
        assert!(!affinity_fresh(20 * s, 5 * s, 10));
        // A clock that went backwards (never with ktime) must not count as fresh forever.
        assert!(affinity_fresh(4 * s, 5 * s, 10));
    }
}
