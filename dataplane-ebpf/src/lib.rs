//! The map ABI shared by the eBPF programs (`src/main.rs`) and the agent.
//!
//! Every key and value is `#[repr(C)]` with explicit padding, so the layout is the same in the
//! kernel and in userspace. The maps are BTF-defined, so `bpftool map dump` prints every field
//! by name. Addresses and ports are kept in network byte order, exactly as `struct
//! bpf_sock_addr` holds them, so the datapath never converts. Change any layout here and bump
//! [`PIN_VERSION`].
//!
//! # The maps
//!
//! | map | type | key → value | written by |
//! |---|---|---|---|
//! | `MCS_FE4`, `MCS_FE6` | hash | [`FrontendKey4`] / [`FrontendKey6`] → [`Frontend`] | agent |
//! | `MCS_SLOTS` | array | slot index → [`Slot`] (the backend itself) | agent |
//! | `MCS_COUNTERS` | array | `cpu × stride + frontend id` → [`Counters`] | programs (the agent resets an id's entries before reusing it) |
//! | `MCS_AFFINITY` | LRU hash | [`AffinityKey`] → [`AffinityValue`] | programs |
//! | `MCS_AFF_MATCH` | hash | [`AffinityMatchKey`] → 1 | agent |
//! | `MCS_CONN_REVNAT` | array | socket cookie mod size → [`ConnRevNat`] | programs (connect claims; `sock_release` frees) |
//! | `MCS_SK_REVNAT` | socket storage | socket → [`SockRevNat`] | programs (connect, when the socket's `MCS_CONN_REVNAT` entry is taken) |
//! | `MCS_REVNAT4/6` | LRU hash | [`RevNatKey4`] / [`RevNatKey6`] → VIP, with the [`rev_tag`] of the key and the VIP (0 in entries of programs before it, which readers accept; no new pin version) | programs (sendmsg) |
//! | `MCS_FE_NAMES` | hash | frontend id → [`FrontendName`] | agent (for `inspect`) |
//! | `MCS_CLUSTERS` | hash | cluster id → [`ClusterName`] | agent (for `inspect`) |
//!
//! A connect looks its destination up in the frontend map (on a miss, the VIP's wildcard
//! entry), picks an index in `0..count` (a random draw for TCP, the socket cookie's hash for
//! UDP) and reads one slot: `MCS_SLOTS[base + index]`, which holds the backend's address and
//! port. Two lookups, one of them an array read. An IPv4 frontend of at most
//! [`INLINE_BACKENDS`] backends also carries copies of its slots' addresses and ports in its
//! own entry ([`Frontend::inline`], flag [`FRONTEND_F_INLINE`]), and the programs read the
//! backend there: one lookup, and no cache line of the slots array, which is a cache miss on
//! nearly every call when calls spread over many services.
//!
//! A translated connect (TCP, or UDP `connect`) then records the socket's reverse entry, which
//! `getpeername` and a connected socket's `recvmsg` read back. Its place is fixed by the
//! socket's cookie: entry `cookie mod size` of the array `MCS_CONN_REVNAT` (the size is a power
//! of two, held in a `.rodata` constant that the loader sets from the map's). The connect claims the entry with one
//! compare-and-swap of its `cookie` field from 0 to the socket's cookie, then writes the
//! translation; readers use the entry only when its cookie is theirs; the `sock_release`
//! program swaps the cookie back to 0. An array lookup is inlined by the verifier and takes no
//! lock or allocation, which is why this is the first tier. Cookies are never reused while the
//! system runs, so an entry is never read by another socket. When the entry is held by another
//! live socket (whose cookie is congruent modulo the size), the translation goes into the
//! socket's own storage instead (`MCS_SK_REVNAT`, exact too, but an allocation and memcg
//! charge per socket). No entry is evicted either way: a translated socket reports its VIP for
//! as long as it lives. An entry of a socket closed while no `sock_release` program was
//! attached stays claimed; it only sends the sockets that share its index to socket storage.

//! # Datapath invariants (kept by the agent's map sync, relied on by the programs)
//!
//! 1. A frontend's backends are the slots `base..base + count` of `MCS_SLOTS`, and each of them
//!    carries the frontend's id in [`Slot::frontend_id`]. To change the set, the agent writes
//!    the new set into a free range, then replaces the frontend entry (`base` and `count`
//!    together, one hash update), and only then frees the old range. A reader therefore sees
//!    the old set or the new set, never a mix and never a missing slot.
//! 2. A freed range is reused only after an RCU grace period (`membarrier(MEMBARRIER_CMD_GLOBAL)`,
//!    which waits for every running program), so no program that read the old frontend entry
//!    can still be reading that range when another frontend's backends are written into it.
//!    The programs also check [`Slot::frontend_id`]: a slot that does not carry the frontend's
//!    id is never followed; the frontend is looked up again, once, and the call is refused if
//!    it still does not match.
//!    A frontend with [`FRONTEND_F_INLINE`] holds its backends' copies in the same entry as
//!    `base` and `count`, written by the same update, each tagged with [`frontend_tag`] of
//!    its id.
//! 3. A frontend with `count == 0`, and a wildcard frontend (`port == 0 && proto == 0`, flag
//!    [`FRONTEND_F_WILDCARD`]), reject the connection with `ECONNREFUSED`.
//! 4. `AFFINITY_MATCH` holds `(frontend, backend)` while the backend is in the frontend's set, so
//!    a stale affinity entry is never followed to a removed backend.
//! 5. The kernel may reuse a replaced frontend element for the next insert at once (kernels
//!    6.1 and later, preallocated or not), so a program may find another frontend's entry in
//!    the element it looked up. The programs copy the entry and look its key up again; when
//!    another element is there now, they copy that one and check it the same way, and when
//!    the key's element changes twice in that time they take the VIP's wildcard entry
//!    (refuse). A copy torn between two frontends fails the slot's or the copy's id check.
//!    Not caught: an element that leaves the key and returns to it while it is copied (two
//!    updates of that key within the copy), and a copy torn between two versions of one
//!    frontend, which can yield a backend that it had recently.
#![no_std]

/// Version of the map layout. Pins live under `<pin root>/v{PIN_VERSION}`.
///
/// - 1: slots keyed by (frontend, bank, index) pointing at a backend id in `MCS_BACKENDS`.
/// - 2: slots in one array holding the backend itself, per-frontend ranges; per-CPU array
///   counters; full (untruncated) names; socket-local reverse entries for connected sockets.
/// - 3: connected sockets' reverse entries in a hash by socket cookie (`MCS_CONN_REVNAT`),
///   deleted by the `sock_release` program; socket storage only when that map is full.
/// - 4: `MCS_CONN_REVNAT` is an array indexed by `cookie mod size`, claimed by compare-and-swap
///   ([`ConnRevNat`]); socket storage when the socket's entry is held by another socket.
///   A `.rodata` constant (`MCS_CONN_SLOTS`) holds the array's size.
/// - 5: counters in one plain array, a row of `stride` entries per possible CPU (index
///   `cpu × stride + frontend id`), which the agent reads with one batch lookup per row;
///   [`Counters`] padded to 32 bytes (two per cache line). A `.rodata` constant
///   (`MCS_COUNTER_STRIDE`) holds the stride.
/// - 6: an IPv4 [`Frontend`] of at most [`INLINE_BACKENDS`] backends carries copies of them
///   ([`Frontend::inline`], [`FRONTEND_F_INLINE`]), tagged with its id; the value is 64
///   bytes.
pub const PIN_VERSION: u32 = 6;

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
/// The frontend's backends are also in [`Frontend::inline`] (its first `count` entries), and
/// the programs read them there.
pub const FRONTEND_F_INLINE: u8 = 4;
/// Most backends a frontend entry carries itself: as many as fill the 64-byte value, which the
/// kernel's allocator places on one cache line of its own (the element's header and key take
/// the line before it).
pub const INLINE_BACKENDS: usize = 6;

/// Map names, as they appear in the object, in `bpftool map list` and as pin file names.
pub mod map_names {
    pub const FRONTENDS4: &str = "MCS_FE4";
    pub const FRONTENDS6: &str = "MCS_FE6";
    pub const SLOTS: &str = "MCS_SLOTS";
    pub const AFFINITY: &str = "MCS_AFFINITY";
    pub const AFFINITY_MATCH: &str = "MCS_AFF_MATCH";
    pub const REVNAT4: &str = "MCS_REVNAT4";
    pub const REVNAT6: &str = "MCS_REVNAT6";
    pub const COUNTERS: &str = "MCS_COUNTERS";
    pub const FRONTEND_NAMES: &str = "MCS_FE_NAMES";
    pub const CLUSTER_NAMES: &str = "MCS_CLUSTERS";
    pub const SOCK_REVNAT: &str = "MCS_SK_REVNAT";
    pub const CONN_REVNAT: &str = "MCS_CONN_REVNAT";
    /// Every map the agent owns, in the order `inspect` and `uninstall` walk them.
    pub const ALL: [&str; 12] = [
        FRONTENDS4,
        FRONTENDS6,
        SLOTS,
        AFFINITY,
        AFFINITY_MATCH,
        REVNAT4,
        REVNAT6,
        COUNTERS,
        FRONTEND_NAMES,
        CLUSTER_NAMES,
        SOCK_REVNAT,
        CONN_REVNAT,
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

/// The benchmark's reference programs in the object, by the hook they stand in for: the
/// frontend lookup of `connect4`/`sendmsg4` alone, on the pinned `MCS_FE4`. The agent never
/// loads them.
pub const LOOKUP_PROGRAMS: [(&str, &str); 2] = [
    ("connect4", "lookup_connect4"),
    ("sendmsg4", "lookup_sendmsg4"),
];

/// Default capacities, overridable at load time.
pub mod defaults {
    /// Frontend entries per family map; frontend ids run `1..=MAX_FRONTENDS`, so the counters
    /// array has one more entry (id 0 is never used).
    pub const MAX_FRONTENDS: u32 = 65536;
    /// Slots: backends of all frontends together, plus room for the new range of the frontends
    /// being changed.
    pub const MAX_SLOTS: u32 = 262144;
    pub const MAX_AFFINITY: u32 = 65536;
    pub const MAX_REVNAT: u32 = 131072;
    /// Entries of `MCS_CONN_REVNAT`, one per `cookie mod size` (the loader rounds the size up
    /// to a power of two). A connected translated socket
    /// whose entry is held by another open socket keeps its translation in socket storage
    /// (slower to create, never refused); so size it well above the connected sockets open at
    /// once on the node.
    pub const MAX_CONNECTED: u32 = 65536;
    /// Member clusters the cluster-name map can name at once (ids `1..=MAX_CLUSTERS`, kept in
    /// a `u16` in every slot).
    pub const MAX_CLUSTERS: u32 = 1024;
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
    /// Frontend id, `1..=max_frontends`; keys `COUNTERS`, `AFFINITY`, `FRONTEND_NAMES` and tags
    /// the frontend's slots.
    pub id: u32,
    /// First slot of the frontend's backends in `MCS_SLOTS`.
    pub base: u32,
    /// Number of backends (slots `base..base + count`). 0 rejects.
    pub count: u16,
    pub flags: u8,
    pub _pad: u8,
    /// ClientIP affinity timeout in seconds (with [`FRONTEND_F_AFFINITY`]).
    pub affinity_timeout_s: u32,
    /// With [`FRONTEND_F_INLINE`] (IPv4 frontends of `1..=INLINE_BACKENDS` backends only): the
    /// address and port of slots `base..base + count`, in order; the rest zero.
    pub inline: [InlineBackend; INLINE_BACKENDS],
}

/// An IPv4 backend's copy in its frontend's entry (see [`Frontend::inline`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InlineBackend {
    /// Address, network byte order.
    pub addr: u32,
    /// Port, network byte order.
    pub port: u16,
    /// [`frontend_tag`] of the frontend's id: a program that copied an entry while the kernel
    /// reused its element for another frontend finds another tag (or 0, in an unused copy)
    /// and looks the frontend up again.
    pub frontend_tag: u16,
}

/// The tag of frontend `id`'s copies ([`InlineBackend::frontend_tag`]): never 0, the tag of
/// an unused copy. Ids 65,535 apart share a tag (ids 1 and 65,536 at the default
/// `MAX_FRONTENDS`), which only weakens the check of a copy torn between those two.
#[inline(always)]
pub fn frontend_tag(id: u32) -> u16 {
    (id % 0xffff) as u16 + 1
}

/// One backend of a frontend, in the frontend's range of `MCS_SLOTS`. IPv4 addresses use
/// `addr[0]` and leave the rest zero (the frontend's family tells which).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Slot {
    pub addr: [u32; 4],
    /// Port, network byte order.
    pub port: u16,
    /// `MCS_CLUSTERS` id of the cluster the endpoint comes from (0: none).
    pub cluster: u16,
    /// The frontend this slot belongs to; 0 in a slot that was never written.
    pub frontend_id: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    /// Network-namespace cookie of the client: at socket level the client is its netns.
    pub netns_cookie: u64,
    pub frontend_id: u32,
    pub _pad: u32,
}

/// The backend a client last used, by ClientIP affinity.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    /// `bpf_ktime_get_ns` of the last use.
    pub last_used_ns: u64,
    pub addr: [u32; 4],
    /// Port, network byte order.
    pub port: u16,
    pub _pad: [u16; 3],
}

/// A backend of an affinity frontend's current set: an affinity entry naming a backend that
/// has no match is not followed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AffinityMatchKey {
    pub frontend_id: u32,
    /// Port, network byte order.
    pub port: u16,
    pub _pad: u16,
    pub addr: [u32; 4],
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

/// The VIP that (socket, IPv4 backend) stands for. Exactly 8 bytes: the programs write and read
/// it as one aligned 8-byte word, so a changed VIP is rewritten in place without a torn read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevNatValue4 {
    pub vip: u32,
    pub vip_port: u16,
    /// [`rev_tag`] of the key and the VIP.
    pub tag: u16,
}

/// A check of a reverse entry, kept in its value: a hash of its key and of the VIP it holds.
/// The kernel gives an LRU element it evicts (or replaces) to the next insert at once, so a
/// program holding a pointer to an element may find it another key's by the time it reads or
/// rewrites it, or copy it while it is rewritten. A reader uses a value only when its tag is
/// that of its own key and the VIP it read (or 0: an entry of older programs, written before
/// tags), so such a copy is refused but for one chance in 65,535; an IPv4 rewrite is a
/// compare-and-swap that fails once the element holds another key's value. Never 0.
#[inline(always)]
pub fn rev_tag(cookie: u64, backend: &[u32], backend_port: u16, vip: &[u32], vip_port: u16) -> u16 {
    // A multiply after each word, not only at the end: with xors and rotations alone, two keys
    // whose differences cancel (cookies and ports or addresses differing in the same bits)
    // would always share a tag. murmur3's finaliser spreads the last word over every bit.
    let mut h: u32 = 0x811c_9dc5;
    h = rev_mix(h, cookie as u32);
    h = rev_mix(h, (cookie >> 32) as u32);
    h = rev_mix(h, backend_port as u32);
    // Two loops, not a chained iterator: each unrolls into straight code for the verifier.
    for word in backend {
        h = rev_mix(h, *word);
    }
    for word in vip {
        h = rev_mix(h, *word);
    }
    h = rev_mix(h, vip_port as u32);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    match (h >> 16) as u16 {
        0 => 1,
        tag => tag,
    }
}

/// One word into [`rev_tag`]'s hash.
#[inline(always)]
fn rev_mix(h: u32, word: u32) -> u32 {
    (h ^ word).wrapping_mul(0x9e37_79b1).rotate_left(13)
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
    /// [`rev_tag`] of the key and the VIP.
    pub tag: u16,
}

/// The reverse translation of a connected socket (TCP, or UDP after `connect`), kept in its
/// [`ConnRevNat`] entry of `MCS_CONN_REVNAT` (or, when that entry is held by another socket, in
/// the socket's own storage, `MCS_SK_REVNAT`). A connected socket has one peer, so one entry answers `getpeername` and
/// the socket's `recvmsg`. Addresses as in [`Slot`]: IPv4 in word 0.
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

/// One entry of `MCS_CONN_REVNAT`, at index `cookie mod size`: free when `cookie == 0`, else the
/// reverse translation of the open socket with that cookie (cookies start at 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnRevNat {
    /// Claimed by `connect` with a compare-and-swap from 0, set back to 0 by `sock_release`.
    pub cookie: u64,
    pub rev: SockRevNat,
}

/// Name of the `.rodata` constant that holds the number of entries of `MCS_CONN_REVNAT`; the
/// loader sets it to the map's size, so the programs index exactly the entries that exist.
pub const CONN_SLOTS_GLOBAL: &str = "MCS_CONN_SLOTS";

/// One frontend's counters on one CPU. 32 bytes, so an entry never straddles two cache lines
/// (a call touches one line for its counters).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub translations: u64,
    pub affinity_hits: u64,
    pub rejects: u64,
    pub _pad: u64,
}

/// Name of the `.rodata` constant that holds the stride of `MCS_COUNTERS`: the entries of one
/// CPU's row, one more than the highest frontend id (ids start at 1). The loader sets it from
/// the map's size (a pinned map keeps the stride it was created with).
pub const COUNTER_STRIDE_GLOBAL: &str = "MCS_COUNTER_STRIDE";

/// Length of the namespace, port-name and cluster-name fields: DNS labels, at most 63 bytes,
/// NUL-padded.
pub const LABEL_LEN: usize = 64;
/// Length of the service-name field: ServiceImport names are DNS subdomains, at most 253
/// bytes, NUL-padded.
pub const NAME_LEN: usize = 256;

/// Service identity of a frontend, for `inspect`. Written by the agent only. Every field holds
/// the whole name (Kubernetes limits them to 63, 253 and 63 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrontendName {
    pub namespace: [u8; LABEL_LEN],
    pub name: [u8; NAME_LEN],
    pub port_name: [u8; LABEL_LEN],
}

impl Default for FrontendName {
    fn default() -> Self {
        Self {
            namespace: [0; LABEL_LEN],
            name: [0; NAME_LEN],
            port_name: [0; LABEL_LEN],
        }
    }
}

/// A cluster id (a DNS label, at most 63 bytes), NUL-padded. Written by the agent only.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterName {
    pub name: [u8; LABEL_LEN],
}

impl Default for ClusterName {
    fn default() -> Self {
        Self {
            name: [0; LABEL_LEN],
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
        Slot,
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
        SockRevNat,
        ConnRevNat
    );
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::*;

    /// Keys whose differences would cancel in a hash of xors and rotations (cookies differing
    /// in the bits their ports or backend addresses differ in, as each word is mixed in) get
    /// different tags.
    #[test]
    fn reverse_tags_of_related_keys_differ() {
        let v4 = |cookie: u64, backend: u32, port: u16| rev_tag(cookie, &[backend], port, &[7], 53);
        assert_ne!(v4(0x2000, 9, 5353), v4(0x2000 ^ 1, 9, 5353 ^ 1));
        let (a, b) = (
            u32::from_be_bytes([10, 99, 1, 10]),
            u32::from_be_bytes([10, 99, 2, 10]),
        );
        let delta = u64::from((a ^ b).rotate_right(5));
        assert_ne!(v4(0x4000, a, 80), v4(0x4000 ^ delta, b, 80));
        let v6 = |cookie: u64, last: u32| rev_tag(cookie, &[1, 2, 3, last], 80, &[5, 6, 7, 8], 53);
        let delta = u64::from((0x10u32 ^ 0x11).rotate_right(20));
        assert_ne!(v6(0x40, 0x10), v6(0x40 ^ delta, 0x11));
        // Over many neighbouring keys, tags collide about as often as chance says (1 in 65,535
        // per pair): of 4,096 consecutive cookies, far fewer than 1% share a neighbour's tag.
        let same = (0..4096u64)
            .filter(|c| v4(*c, a, 80) == v4(*c + 1, a, 80) || v4(*c, a, 80) == v4(*c ^ 1, b, 81))
            .count();
        assert!(same < 5, "{same} of 4,096");
        assert!((0..4096u64).all(|c| v4(c, a, 80) != 0));
    }

    #[test]
    fn frontend_tags_are_never_those_of_unused_copies_and_differ_for_nearby_ids() {
        let mut seen = [false; 0x1_0000];
        for id in 1..=0xffff {
            let tag = frontend_tag(id);
            assert_ne!(tag, 0, "id {id}");
            assert!(!seen[tag as usize], "id {id}: tag {tag} given twice");
            seen[tag as usize] = true;
        }
        assert_ne!(frontend_tag(0x1_0000), 0);
    }

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<FrontendKey4>(), 8);
        assert_eq!(size_of::<FrontendKey6>(), 20);
        assert_eq!(size_of::<Frontend>(), 64);
        assert_eq!(size_of::<InlineBackend>(), 8);
        assert_eq!(size_of::<Slot>(), 24);
        assert_eq!(size_of::<AffinityKey>(), 16);
        assert_eq!(size_of::<AffinityValue>(), 32);
        assert_eq!(size_of::<AffinityMatchKey>(), 24);
        assert_eq!(size_of::<RevNatKey4>(), 16);
        assert_eq!(size_of::<RevNatValue4>(), 8);
        // The programs read the tag as bits 48-63 of the value's one 8-byte word.
        assert_eq!(core::mem::offset_of!(RevNatValue4, tag), 6);
        assert_eq!(size_of::<RevNatKey6>(), 32);
        assert_eq!(size_of::<RevNatValue6>(), 20);
        assert_eq!(size_of::<Counters>(), 32);
        assert_eq!(size_of::<SockRevNat>(), 40);
        assert_eq!(size_of::<ConnRevNat>(), 48);
        assert_eq!(size_of::<FrontendName>(), 2 * LABEL_LEN + NAME_LEN);
        assert_eq!(size_of::<ClusterName>(), LABEL_LEN);
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
