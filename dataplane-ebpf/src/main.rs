//! Socket-level load balancing for ClusterSet IPs.
//!
//! `connect4/6` and `sendmsg4/6` rewrite a (VIP, port, protocol) destination to one backend of
//! the frontend: by ClientIP affinity when the frontend has it, else uniformly at random over
//! its backends for TCP, and by the socket's cookie for UDP (every datagram of one socket goes
//! to the same backend while the frontend's backend count stays the same). `recvmsg4/6` and `getpeername4/6` translate the backend
//! back to the VIP, so applications see the address they asked for. A known VIP on an
//! undeclared port, or a frontend with no backends, is refused with `ECONNREFUSED`; a
//! translation whose reverse entry cannot be recorded is refused too (with that error).
//! Everything else passes through untouched.
//!
//! IPv4-mapped IPv6 destinations (`::ffff:a.b.c.d`, what dual-stack AF_INET6 sockets use for
//! IPv4 peers) are looked up in the IPv4 maps and rewritten as IPv4-mapped backends; their
//! replies and peers are translated back the same way.
//!
//! The map layouts and invariants are documented in `lib.rs`.
#![no_std]
#![no_main]
// `atomic_cxchg`: the bpfel target has no `AtomicU64::compare_exchange` (its spec lists no
// CAS), but the kernel has BPF_CMPXCHG (cpu v3), which LLVM emits for the intrinsic.
#![allow(internal_features)]
#![feature(core_intrinsics)]

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg},
    ptr::{addr_of_mut, read_volatile},
};

use aya_ebpf::{
    EbpfContext,
    bindings::{bpf_sock, bpf_sock_addr},
    btf_maps::{Array, HashMap, LruHashMap, SkStorage},
    helpers::generated::{
        bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_get_socket_cookie,
        bpf_ktime_get_ns, bpf_set_retval,
    },
    macros::{btf_map, cgroup_sock, cgroup_sock_addr},
    programs::{SockAddrContext, SockContext},
};
use aya_log_ebpf::debug;
use dataplane_ebpf::{
    AffinityKey, AffinityMatchKey, AffinityValue, ClusterName, ConnRevNat, Counters, ECONNREFUSED,
    ENOMEM, FRONTEND_F_AFFINITY, FRONTEND_F_INLINE, FRONTEND_F_WILDCARD, Frontend, FrontendKey4,
    FrontendKey6, FrontendName, IPPROTO_TCP, IPPROTO_UDP, RevNatKey4, RevNatKey6, RevNatValue4,
    RevNatValue6, Slot, SockRevNat, affinity_fresh, cookie_hash, defaults, frontend_tag,
    ip6_mapped_v4, ip6_v4_mapped, pick_slot,
};

/// Programs the benchmark attaches next to these (never the agent).
mod bench_programs;
mod family;

use family::{Family, V4, V6};

/// Elements are allocated on write, so an update never rewrites the element a reader holds in
/// place. A replaced element may still be reused for another key at once (kernels 6.1 and
/// later free hash elements to a per-CPU cache, preallocated or not): readers copy a frontend
/// and check that it is still the key's ([`copy_checked`]).
const NO_PREALLOC: usize = 1;
const MAX_FRONTENDS: usize = defaults::MAX_FRONTENDS as usize;
const MAX_SLOTS: usize = defaults::MAX_SLOTS as usize;
const MAX_CLUSTERS: usize = defaults::MAX_CLUSTERS as usize;
const MAX_AFFINITY: usize = defaults::MAX_AFFINITY as usize;
const MAX_REVNAT: usize = defaults::MAX_REVNAT as usize;
const MAX_CONNECTED: usize = defaults::MAX_CONNECTED as usize;

// BTF-defined maps: `bpftool map dump` shows every key and value field by name. The loader pins
// each one by name (`EbpfLoader::map_pin_path`), and sizes them from the agent's flags.
#[btf_map(name = "MCS_FE4")]
static FRONTENDS4: HashMap<FrontendKey4, Frontend, MAX_FRONTENDS, NO_PREALLOC> = HashMap::new();
#[btf_map(name = "MCS_FE6")]
static FRONTENDS6: HashMap<FrontendKey6, Frontend, MAX_FRONTENDS, NO_PREALLOC> = HashMap::new();
/// Every frontend's backends, one range each (see the invariants in `lib.rs`).
#[btf_map(name = "MCS_SLOTS")]
static SLOTS: Array<Slot, MAX_SLOTS> = Array::new();
#[btf_map(name = "MCS_AFFINITY")]
static AFFINITY: LruHashMap<AffinityKey, AffinityValue, MAX_AFFINITY> = LruHashMap::new();
#[btf_map(name = "MCS_AFF_MATCH")]
static AFFINITY_MATCH: HashMap<AffinityMatchKey, u32, MAX_SLOTS, NO_PREALLOC> = HashMap::new();
/// Reverse translation of connected sockets, at `cookie mod MCS_CONN_SLOTS`; freed when the
/// socket is released.
#[btf_map(name = "MCS_CONN_REVNAT")]
static CONN_REVNAT: Array<ConnRevNat, MAX_CONNECTED> = Array::new();
/// The number of entries of `MCS_CONN_REVNAT`, a power of two (`.rodata`, set by the loader to
/// the map's size; read with `read_volatile` so that the compiler does not fold the default in).
#[unsafe(no_mangle)]
static MCS_CONN_SLOTS: u32 = defaults::MAX_CONNECTED;
/// The same for connected sockets whose `MCS_CONN_REVNAT` entry was held by another socket, in
/// the socket itself (freed with it).
#[btf_map(name = "MCS_SK_REVNAT")]
static SOCK_REVNAT: SkStorage<SockRevNat> = SkStorage::new();
/// Reverse translation of unconnected UDP sockets, per (socket, backend).
#[btf_map(name = "MCS_REVNAT4")]
static REVNAT4: LruHashMap<RevNatKey4, RevNatValue4, MAX_REVNAT> = LruHashMap::new();
#[btf_map(name = "MCS_REVNAT6")]
static REVNAT6: LruHashMap<RevNatKey6, RevNatValue6, MAX_REVNAT> = LruHashMap::new();
/// A row of `MCS_COUNTER_STRIDE` entries per CPU, indexed by frontend id within it (ids start at
/// 1). One cache line per call, where a per-CPU array costs two (the entry's per-CPU pointer,
/// then the value).
#[btf_map(name = "MCS_COUNTERS")]
static COUNTERS: Array<Counters, { MAX_FRONTENDS + 1 }> = Array::new();
/// The entries of one CPU's row of `MCS_COUNTERS` (`.rodata`, set by the loader from the map's
/// size; read with `read_volatile` so that the compiler does not fold the default in).
#[unsafe(no_mangle)]
static MCS_COUNTER_STRIDE: u32 = MAX_FRONTENDS as u32 + 1;
/// Names for `inspect`; only the agent reads and writes them.
#[btf_map(name = "MCS_FE_NAMES")]
static FRONTEND_NAMES: HashMap<u32, FrontendName, MAX_FRONTENDS, NO_PREALLOC> = HashMap::new();
#[btf_map(name = "MCS_CLUSTERS")]
static CLUSTER_NAMES: HashMap<u32, ClusterName, MAX_CLUSTERS, NO_PREALLOC> = HashMap::new();

/// Return values of cgroup sock_addr programs.
const ALLOW: i32 = 1;
const DENY: i32 = 0;

/// What `choose` found.
enum Choice {
    /// A backend of the frontend (id): its address words and port, as a slot holds them.
    Backend(u32, [u32; 4], u16),
    /// Refuse with ECONNREFUSED.
    Reject(u32),
    /// The slot or copy just read is not this frontend's: the agent replaced the frontend (or
    /// reused its element) while we read it. Looking the frontend up again sees the new one.
    Stale(u32),
}

#[inline(always)]
fn bump(frontend_id: u32, f: impl FnOnce(&mut Counters)) {
    // SAFETY: a plain read of a `.rodata` constant; a helper without arguments.
    let (stride, cpu) = unsafe {
        (
            read_volatile(&MCS_COUNTER_STRIDE),
            bpf_get_smp_processor_id(),
        )
    };
    // An id past the row (a pinned map made for fewer frontends) would count in the next CPU's.
    if frontend_id >= stride {
        return;
    }
    if let Some(c) = COUNTERS.get_ptr_mut(cpu.wrapping_mul(stride).wrapping_add(frontend_id)) {
        // This CPU's row (programs run with migration disabled). A program that preempts this
        // one on the same CPU may lose an increment, as with a per-CPU map.
        f(unsafe { &mut *c });
    }
}

#[inline(always)]
fn l4_proto(sa: &bpf_sock_addr) -> Option<u8> {
    match sa.protocol as u8 {
        IPPROTO_TCP => Some(IPPROTO_TCP),
        IPPROTO_UDP => Some(IPPROTO_UDP),
        _ => None,
    }
}

/// A copy of the frontend element of `key`, checked to be still the key's by looking the key
/// up again. Since kernel 6.1 a hash map reuses a freed element for the next insert at once,
/// so an element that an update replaced while this program held it may already be another
/// frontend's: the second lookup (of lines now in the cache) finds the key's current element,
/// which is copied and checked instead when it is another one. A copy torn between two
/// frontends is caught later by the slots' and the copies' frontend ids. Invariant 5 in
/// `lib.rs` says what is not caught.
#[inline(always)]
fn copy_checked<K>(
    map: &HashMap<K, Frontend, MAX_FRONTENDS, NO_PREALLOC>,
    key: &K,
) -> Option<Frontend> {
    let found = map.get_ptr(key)?;
    // SAFETY: pointers from a map lookup, valid for the program's run (RCU).
    let copy = unsafe { *found };
    let now = map.get_ptr(key)?;
    if now == found {
        return Some(copy);
    }
    // Replaced while it was copied: the same check on the element there now, once (the
    // caller then takes the wildcard).
    let copy = unsafe { *now };
    (map.get_ptr(key)? == now).then_some(copy)
}

/// The frontend of a destination: its (port, protocol) entry, else the VIP's wildcard.
#[inline(always)]
fn lookup<F: Family>(addr: F::Addr, port: u16, proto: u8) -> Option<Frontend> {
    match F::frontend(addr, port, proto) {
        Some(fe) => Some(fe),
        None => F::frontend(addr, 0, 0),
    }
}

/// Chooses a backend for a frontend: the client's affinity entry if it is fresh and its backend
/// still belongs to the frontend, else the backend picked by `draw`: from the frontend's own
/// copies when it carries them, else from its slots.
#[inline(always)]
fn choose<F: Family>(ctx: &SockAddrContext, fe: &Frontend, draw: u32) -> Choice {
    if fe.flags & FRONTEND_F_WILDCARD != 0 || fe.count == 0 {
        return Choice::Reject(fe.id);
    }
    let affinity = fe.flags & FRONTEND_F_AFFINITY != 0;
    // The clock and the client's netns cookie only matter with affinity.
    let (now, netns_cookie) = if affinity {
        unsafe { (bpf_ktime_get_ns(), bpf_get_netns_cookie(ctx.as_ptr())) }
    } else {
        (0, 0)
    };
    let aff_key = AffinityKey {
        netns_cookie,
        frontend_id: fe.id,
        _pad: 0,
    };
    if affinity && let Some(entry) = unsafe { AFFINITY.get(&aff_key) } {
        let (addr, port) = (entry.addr, entry.port);
        let still_member = unsafe {
            AFFINITY_MATCH
                .get(&AffinityMatchKey {
                    frontend_id: fe.id,
                    port,
                    _pad: 0,
                    addr,
                })
                .is_some()
        };
        if still_member && affinity_fresh(now, entry.last_used_ns, fe.affinity_timeout_s) {
            remember(&aff_key, now, addr, port);
            bump(fe.id, |c| c.affinity_hits += 1);
            return Choice::Backend(fe.id, addr, port);
        }
    }
    let index = pick_slot(draw, fe.count);
    let (addr, port) = if F::INLINE && fe.flags & FRONTEND_F_INLINE != 0 {
        // The copies were written with `count`, in the same entry; the tag catches a copy of
        // an element that was being reused for another frontend.
        let Some(b) = fe.inline.get(index as usize) else {
            return Choice::Stale(fe.id);
        };
        if b.frontend_tag != frontend_tag(fe.id) {
            return Choice::Stale(fe.id);
        }
        ([b.addr, 0, 0, 0], b.port)
    } else {
        // An index past the array or a slot of another frontend: the frontend changed under
        // us.
        let Some(slot) = SLOTS.get(fe.base.wrapping_add(index as u32)) else {
            return Choice::Stale(fe.id);
        };
        if slot.frontend_id != fe.id {
            return Choice::Stale(fe.id);
        }
        (slot.addr, slot.port)
    };
    if affinity {
        remember(&aff_key, now, addr, port);
    }
    Choice::Backend(fe.id, addr, port)
}

/// Records the backend a client used, for ClientIP affinity. An LRU map: a failed insert only
/// costs the client its stickiness.
#[inline(always)]
fn remember(key: &AffinityKey, now: u64, addr: [u32; 4], port: u16) {
    let value = AffinityValue {
        last_used_ns: now,
        addr,
        port,
        _pad: [0; 3],
    };
    let _ = AFFINITY.insert(key, &value, 0);
}

/// The `MCS_CONN_REVNAT` entry of a socket cookie (held by that socket or not).
#[inline(always)]
fn conn_entry(cookie: u64) -> Option<*mut ConnRevNat> {
    // SAFETY: a plain read of a `.rodata` constant.
    let slots = unsafe { read_volatile(&MCS_CONN_SLOTS) };
    // A mask, not a 64-bit division. Were the size not a power of two, the entries past the
    // mask would go unused, and the array's bounds check still holds.
    CONN_REVNAT.get_ptr_mut((cookie as u32) & slots.wrapping_sub(1))
}

/// Sets the cookie that holds `entry` to `to` if it is `from`, atomically; returns the cookie
/// that held it before (`from` when the swap happened).
#[inline(always)]
fn swap_holder(entry: *mut ConnRevNat, from: u64, to: u64) -> u64 {
    // SAFETY: `entry` comes from `conn_entry`, a pointer into the array's value, valid for the
    // program's run; the cookie field is only ever changed here.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
            addr_of_mut!((*entry).cookie),
            from,
            to,
        )
    }
    .0
}

/// Which hook translates: `connect` (the socket gets one peer) or `sendmsg` (one datagram of
/// an unconnected UDP socket).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hook {
    Connect,
    Sendmsg,
}

/// Records, for the reverse path, that this socket's backend `(backend, backend_port)` stands
/// for `(vip, vip_port)`: for a connect, in the cookie-indexed array (or, when another open
/// socket holds that entry, in the socket's own storage); for a datagram, in the
/// per-(socket, backend) LRU map (written only when it changes).
#[inline(always)]
fn record<F: Family>(
    ctx: &SockAddrContext,
    hook: Hook,
    cookie: u64,
    backend: F::Addr,
    backend_port: u16,
    vip: F::Addr,
    vip_port: u16,
) -> Result<(), i32> {
    if hook == Hook::Connect {
        let value = SockRevNat {
            backend: F::to_words(backend),
            vip: F::to_words(vip),
            backend_port,
            vip_port,
            family: F::FAMILY,
            _pad: [0; 3],
        };
        // The entry is this socket's once its cookie is there: claimed now, or by an earlier
        // connect of the same (UDP) socket. The socket's storage costs a kmalloc and a memcg
        // charge on every new socket, so it is the fallback only.
        if let Some(entry) = conn_entry(cookie) {
            let held_by = swap_holder(entry, 0, cookie);
            if held_by == 0 || held_by == cookie {
                // SAFETY: as above; only this socket's calls write an entry it holds.
                unsafe { (*entry).rev = value };
                return Ok(());
            }
        }
        let entry = unsafe { SOCK_REVNAT.get_or_insert_ptr_mut(ctx, None) };
        if entry.is_null() {
            return Err(-ENOMEM);
        }
        // SAFETY: a non-null pointer from bpf_sk_storage_get is this socket's value.
        unsafe { *entry = value };
        return Ok(());
    }
    F::rev_record(cookie, backend, backend_port, vip, vip_port)
}

/// The forward translation of a destination `(vip, port)` of family `F`: `write` rewrites the
/// destination to the chosen backend. Returns the program's verdict. (Each outcome returns
/// where it is decided: a verdict value carried to one exit compiled to a register that is
/// undefined on the paths that do not translate, which the verifier refuses.)
#[inline(always)]
fn forward<F: Family>(
    ctx: &SockAddrContext,
    hook: Hook,
    vip: F::Addr,
    vip_port: u16,
    write: impl FnOnce(F::Addr, u16),
) -> i32 {
    let sa = unsafe { &*ctx.sock_addr };
    // Not a VIP (or not TCP/UDP): the call is left alone.
    let Some(proto) = l4_proto(sa) else {
        return ALLOW;
    };
    let Some(fe) = lookup::<F>(vip, vip_port, proto) else {
        return ALLOW;
    };
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // TCP: a fresh draw per connection. UDP: one backend per socket, so that every datagram
    // of an unconnected socket (a QUIC handshake, a multi-datagram exchange) meets the same
    // backend.
    let draw = if proto == IPPROTO_TCP {
        unsafe { bpf_get_prandom_u32() }
    } else {
        cookie_hash(cookie)
    };
    let choice = match choose::<F>(ctx, &fe, draw) {
        Choice::Stale(id) => match lookup::<F>(vip, vip_port, proto) {
            Some(fe) => choose::<F>(ctx, &fe, draw),
            None => Choice::Reject(id),
        },
        c => c,
    };
    match choice {
        Choice::Reject(id) | Choice::Stale(id) => {
            bump(id, |c| c.rejects += 1);
            debug!(ctx, "reject frontend {}", id);
            reject(-ECONNREFUSED)
        }
        Choice::Backend(id, addr, port) => {
            let backend = F::from_words(addr);
            // Without its reverse entry the application would see the backend, not the VIP,
            // as its peer: refuse rather than translate half-way.
            if let Err(e) = record::<F>(ctx, hook, cookie, backend, port, vip, vip_port) {
                bump(id, |c| c.rejects += 1);
                debug!(ctx, "reject frontend {}: reverse entry failed {}", id, e);
                return reject(if e < 0 { e } else { -ENOMEM });
            }
            bump(id, |c| c.translations += 1);
            write(backend, port);
            ALLOW
        }
    }
}

/// The VIP that a backend peer `(addr, port)` of this socket stands for, if any: the
/// socket's connected entry (in the cookie-indexed array or the socket's storage), else, for
/// `recvmsg` of an unconnected UDP socket, the per-(socket, backend) map.
#[inline(always)]
fn reverse<F: Family>(
    ctx: &SockAddrContext,
    unconnected_too: bool,
    addr: F::Addr,
    port: u16,
) -> Option<(F::Addr, u16)> {
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if unconnected_too && !connected(ctx) {
        return F::rev_lookup(cookie, addr, port);
    }
    let entry = match conn_entry(cookie) {
        // SAFETY: a pointer into the array's value; a torn read is impossible for the socket
        // that holds the entry, as only its own calls write it.
        Some(e) if unsafe { read_volatile(addr_of_mut!((*e).cookie)) } == cookie => unsafe {
            addr_of_mut!((*e).rev)
        },
        _ => unsafe { SOCK_REVNAT.get_ptr_mut(ctx) },
    };
    if !entry.is_null() {
        // SAFETY: a non-null pointer to this socket's value, from the map or its storage.
        let e = unsafe { &*entry };
        if e.family == F::FAMILY && e.backend_port == port && F::from_words(e.backend) == addr {
            return Some((F::from_words(e.vip), e.vip_port));
        }
    }
    None
}

/// Whether the call's socket is connected (`connect` on UDP sets the TCP_ESTABLISHED state).
#[inline(always)]
fn connected(ctx: &SockAddrContext) -> bool {
    const TCP_ESTABLISHED: u32 = 1;
    let sa = unsafe { &*ctx.sock_addr };
    // SAFETY: the kernel's socket of this call, never null in sock_addr programs.
    unsafe { (*sa.__bindgen_anon_1.sk).state == TCP_ESTABLISHED }
}

/// Refuses the call with `errno` (negative): the program's return value.
#[inline(always)]
fn reject(errno: i32) -> i32 {
    unsafe { bpf_set_retval(errno) };
    DENY
}

#[inline(always)]
fn user_ip6(sa: &bpf_sock_addr) -> [u32; 4] {
    [
        sa.user_ip6[0],
        sa.user_ip6[1],
        sa.user_ip6[2],
        sa.user_ip6[3],
    ]
}

#[inline(always)]
fn set_user_ip6(sa: &mut bpf_sock_addr, addr: [u32; 4]) {
    sa.user_ip6[0] = addr[0];
    sa.user_ip6[1] = addr[1];
    sa.user_ip6[2] = addr[2];
    sa.user_ip6[3] = addr[3];
}

/// connect4, sendmsg4: an IPv4 destination.
#[inline(always)]
fn forward4(ctx: &SockAddrContext, hook: Hook) -> i32 {
    let sa = unsafe { &mut *ctx.sock_addr };
    let (vip, vip_port) = (sa.user_ip4, sa.user_port as u16);
    forward::<V4>(ctx, hook, vip, vip_port, |addr, port| {
        sa.user_ip4 = addr;
        sa.user_port = port as u32;
    })
}

/// connect6, sendmsg6: an IPv6 destination, or an IPv4-mapped one (looked up as IPv4 and
/// rewritten as an IPv4-mapped backend). Only connect6 meets mapped ones: the kernel sends a
/// datagram to `::ffff:a.b.c.d` through the IPv4 path, which runs sendmsg4.
#[inline(always)]
fn forward6(ctx: &SockAddrContext, hook: Hook) -> i32 {
    let sa = unsafe { &mut *ctx.sock_addr };
    let dst = user_ip6(sa);
    let port = sa.user_port as u16;
    if let Some(v4) = ip6_mapped_v4(dst) {
        return forward::<V4>(ctx, hook, v4, port, |addr, port| {
            set_user_ip6(sa, ip6_v4_mapped(addr));
            sa.user_port = port as u32;
        });
    }
    forward::<V6>(ctx, hook, dst, port, |addr, port| {
        set_user_ip6(sa, addr);
        sa.user_port = port as u32;
    })
}

/// recvmsg4, getpeername4: rewrites a backend source or peer back to the VIP it stands for.
/// `unconnected_too`: recvmsg, whose socket may be an unconnected UDP one.
#[inline(always)]
fn reverse4(ctx: &SockAddrContext, unconnected_too: bool) -> i32 {
    let sa = unsafe { &mut *ctx.sock_addr };
    if let Some((vip, port)) = reverse::<V4>(ctx, unconnected_too, sa.user_ip4, sa.user_port as u16)
    {
        sa.user_ip4 = vip;
        sa.user_port = port as u32;
    }
    ALLOW
}

/// recvmsg6, getpeername6: the same for IPv6 peers and IPv4-mapped ones.
#[inline(always)]
fn reverse6(ctx: &SockAddrContext, unconnected_too: bool) -> i32 {
    let sa = unsafe { &mut *ctx.sock_addr };
    let peer = user_ip6(sa);
    let port = sa.user_port as u16;
    if let Some(v4) = ip6_mapped_v4(peer) {
        if let Some((vip, vip_port)) = reverse::<V4>(ctx, unconnected_too, v4, port) {
            set_user_ip6(sa, ip6_v4_mapped(vip));
            sa.user_port = vip_port as u32;
        }
    } else if let Some((vip, vip_port)) = reverse::<V6>(ctx, unconnected_too, peer, port) {
        set_user_ip6(sa, vip);
        sa.user_port = vip_port as u32;
    }
    ALLOW
}

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx, Hook::Connect)
}

#[cgroup_sock_addr(connect6)]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx, Hook::Connect)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sendmsg4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx, Hook::Sendmsg)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sendmsg6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx, Hook::Sendmsg)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx, true)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx, true)
}

#[cgroup_sock_addr(getpeername4)]
pub fn getpeername4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx, false)
}

#[cgroup_sock_addr(getpeername6)]
pub fn getpeername6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx, false)
}

/// Socket release: frees the socket's `MCS_CONN_REVNAT` entry if it holds it (one inlined
/// array read for the sockets that do not). Socket storage frees itself.
#[cgroup_sock(sock_release)]
pub fn sock_release(ctx: SockContext) -> i32 {
    let sk: &bpf_sock = unsafe { &*ctx.sock };
    if sk.protocol as u8 != IPPROTO_TCP && sk.protocol as u8 != IPPROTO_UDP {
        return ALLOW;
    }
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if let Some(entry) = conn_entry(cookie) {
        // Frees the entry only if it is ours.
        swap_holder(entry, cookie, 0);
    }
    ALLOW
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
