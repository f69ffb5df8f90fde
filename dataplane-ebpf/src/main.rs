//! Socket-level load balancing for ClusterSet IPs.
//!
//! `connect4/6` and `sendmsg4/6` rewrite a (VIP, port, protocol) destination to one backend of
//! the frontend, chosen uniformly at random over the active slot bank or by ClientIP affinity.
//! `recvmsg4/6` and `getpeername4/6` translate the backend back to the VIP, so applications see
//! the address they asked for. A known VIP on an undeclared port, or a frontend with no
//! backends, is refused with `ECONNREFUSED`. Everything else passes through untouched.
//! The map layouts and invariants are documented in `lib.rs`.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    bindings::bpf_sock_addr,
    btf_maps::{HashMap, LruHashMap, PerCpuHashMap},
    helpers::generated::{
        bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_ns,
        bpf_set_retval,
    },
    macros::{btf_map, cgroup_sock_addr},
    programs::SockAddrContext,
};
use aya_log_ebpf::debug;
use dataplane_ebpf::{
    AffinityKey, AffinityMatchKey, AffinityValue, Backend, ClusterName, Counters, ECONNREFUSED,
    FRONTEND_F_AFFINITY, FRONTEND_F_WILDCARD, Frontend, FrontendKey4, FrontendKey6, FrontendName,
    IPPROTO_TCP, IPPROTO_UDP, RevNatKey4, RevNatKey6, RevNatValue4, RevNatValue6, Slot, SlotKey,
    affinity_fresh, defaults, pick_slot,
};

/// Elements are allocated on write and freed after an RCU grace period, so a concurrent reader
/// never sees a recycled element (the aliasing hazard of preallocated hash maps).
const NO_PREALLOC: usize = 1;
const MAX_FRONTENDS: usize = defaults::MAX_FRONTENDS as usize;
const MAX_BACKENDS: usize = defaults::MAX_BACKENDS as usize;
const MAX_SLOTS: usize = defaults::MAX_SLOTS as usize;
const MAX_AFFINITY: usize = defaults::MAX_AFFINITY as usize;
const MAX_REVNAT: usize = defaults::MAX_REVNAT as usize;

// BTF-defined maps: `bpftool map dump` shows every key and value field by name. The loader pins
// each one by name (`EbpfLoader::map_pin_path`), and sizes them from the agent's flags.
#[btf_map(name = "MCS_FE4")]
static FRONTENDS4: HashMap<FrontendKey4, Frontend, MAX_FRONTENDS, NO_PREALLOC> = HashMap::new();
#[btf_map(name = "MCS_FE6")]
static FRONTENDS6: HashMap<FrontendKey6, Frontend, MAX_FRONTENDS, NO_PREALLOC> = HashMap::new();
#[btf_map(name = "MCS_SLOTS")]
static SLOTS: HashMap<SlotKey, Slot, MAX_SLOTS, NO_PREALLOC> = HashMap::new();
#[btf_map(name = "MCS_BACKENDS")]
static BACKENDS: HashMap<u32, Backend, MAX_BACKENDS, NO_PREALLOC> = HashMap::new();
#[btf_map(name = "MCS_AFFINITY")]
static AFFINITY: LruHashMap<AffinityKey, AffinityValue, MAX_AFFINITY> = LruHashMap::new();
#[btf_map(name = "MCS_AFF_MATCH")]
static AFFINITY_MATCH: HashMap<AffinityMatchKey, u32, MAX_SLOTS, NO_PREALLOC> = HashMap::new();
#[btf_map(name = "MCS_REVNAT4")]
static REVNAT4: LruHashMap<RevNatKey4, RevNatValue4, MAX_REVNAT> = LruHashMap::new();
#[btf_map(name = "MCS_REVNAT6")]
static REVNAT6: LruHashMap<RevNatKey6, RevNatValue6, MAX_REVNAT> = LruHashMap::new();
#[btf_map(name = "MCS_COUNTERS")]
static COUNTERS: PerCpuHashMap<u32, Counters, MAX_FRONTENDS, NO_PREALLOC> = PerCpuHashMap::new();
/// Names for `inspect`; only the agent reads and writes them.
#[btf_map(name = "MCS_FE_NAMES")]
static FRONTEND_NAMES: HashMap<u32, FrontendName, MAX_FRONTENDS, NO_PREALLOC> = HashMap::new();
#[btf_map(name = "MCS_CLUSTERS")]
static CLUSTER_NAMES: HashMap<u32, ClusterName, 1024, NO_PREALLOC> = HashMap::new();

/// Return values of cgroup sock_addr programs.
const ALLOW: i32 = 1;
const DENY: i32 = 0;

enum Verdict {
    /// Rewrite to this backend.
    Translate(u32, Backend),
    /// Refuse with ECONNREFUSED.
    Reject(u32),
    /// The slot or backend just read is gone: the agent switched this frontend to a new bank
    /// between our two lookups. Looking the frontend up again sees the new bank.
    Stale(u32),
}

#[inline(always)]
fn bump(frontend_id: u32, f: impl FnOnce(&mut Counters)) {
    if let Some(c) = COUNTERS.get_ptr_mut(frontend_id) {
        // Per-CPU value: no other writer on this CPU while we run.
        f(unsafe { &mut *c });
    }
}

#[inline(always)]
fn reject(ctx: &SockAddrContext, frontend_id: u32) -> i32 {
    bump(frontend_id, |c| c.rejects += 1);
    debug!(ctx, "reject frontend {}", frontend_id);
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    DENY
}

/// Chooses a backend for a frontend: the client's affinity entry if it is fresh and its backend
/// still belongs to the frontend, else a uniformly random active slot.
#[inline(always)]
fn choose(ctx: &SockAddrContext, fe: &Frontend) -> Verdict {
    if fe.flags & FRONTEND_F_WILDCARD != 0 || fe.count == 0 {
        return Verdict::Reject(fe.id);
    }
    let affinity = fe.flags & FRONTEND_F_AFFINITY != 0;
    let now = unsafe { bpf_ktime_get_ns() };
    let aff_key = AffinityKey {
        netns_cookie: if affinity {
            unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
        } else {
            0
        },
        frontend_id: fe.id,
        _pad: 0,
    };
    if affinity && let Some(entry) = unsafe { AFFINITY.get(&aff_key) } {
        let backend_id = entry.backend_id;
        let still_member = unsafe {
            AFFINITY_MATCH
                .get(&AffinityMatchKey {
                    frontend_id: fe.id,
                    backend_id,
                })
                .is_some()
        };
        if still_member
            && affinity_fresh(now, entry.last_used_ns, fe.affinity_timeout_s)
            && let Some(be) = unsafe { BACKENDS.get(&backend_id) }
        {
            let be = *be;
            let _ = AFFINITY.insert(
                &aff_key,
                &AffinityValue {
                    last_used_ns: now,
                    backend_id,
                    _pad: 0,
                },
                0,
            );
            bump(fe.id, |c| c.affinity_hits += 1);
            return Verdict::Translate(fe.id, be);
        }
    }
    let index = pick_slot(unsafe { bpf_get_prandom_u32() }, fe.count);
    let slot = SlotKey {
        frontend_id: fe.id,
        bank: fe.bank as u16,
        index,
    };
    let Some(slot) = (unsafe { SLOTS.get(&slot) }) else {
        return Verdict::Stale(fe.id);
    };
    let backend_id = slot.backend_id;
    let Some(be) = (unsafe { BACKENDS.get(&backend_id) }) else {
        return Verdict::Stale(fe.id);
    };
    if affinity {
        let _ = AFFINITY.insert(
            &aff_key,
            &AffinityValue {
                last_used_ns: now,
                backend_id,
                _pad: 0,
            },
            0,
        );
    }
    Verdict::Translate(fe.id, *be)
}

#[inline(always)]
fn l4_proto(sa: &bpf_sock_addr) -> Option<u8> {
    match sa.protocol as u8 {
        IPPROTO_TCP => Some(IPPROTO_TCP),
        IPPROTO_UDP => Some(IPPROTO_UDP),
        _ => None,
    }
}

#[inline(always)]
fn lookup4(sa: &bpf_sock_addr, proto: u8) -> Option<Frontend> {
    let addr = sa.user_ip4;
    let key = FrontendKey4 {
        addr,
        port: sa.user_port as u16,
        proto,
        _pad: 0,
    };
    if let Some(fe) = unsafe { FRONTENDS4.get(&key) } {
        return Some(*fe);
    }
    let wildcard = FrontendKey4 {
        addr,
        port: 0,
        proto: 0,
        _pad: 0,
    };
    unsafe { FRONTENDS4.get(&wildcard) }.copied()
}

#[inline(always)]
fn lookup6(sa: &bpf_sock_addr, proto: u8) -> Option<Frontend> {
    let addr = [
        sa.user_ip6[0],
        sa.user_ip6[1],
        sa.user_ip6[2],
        sa.user_ip6[3],
    ];
    let key = FrontendKey6 {
        addr,
        port: sa.user_port as u16,
        proto,
        _pad: 0,
    };
    if let Some(fe) = unsafe { FRONTENDS6.get(&key) } {
        return Some(*fe);
    }
    let wildcard = FrontendKey6 {
        addr,
        port: 0,
        proto: 0,
        _pad: 0,
    };
    unsafe { FRONTENDS6.get(&wildcard) }.copied()
}

#[inline(always)]
fn forward4(ctx: &SockAddrContext) -> i32 {
    let sa = unsafe { &mut *ctx.sock_addr };
    let Some(proto) = l4_proto(sa) else {
        return ALLOW;
    };
    let Some(fe) = lookup4(sa, proto) else {
        return ALLOW;
    };
    let verdict = match choose(ctx, &fe) {
        Verdict::Stale(id) => match lookup4(sa, proto) {
            Some(fe) => choose(ctx, &fe),
            None => Verdict::Reject(id),
        },
        v => v,
    };
    match verdict {
        Verdict::Reject(id) | Verdict::Stale(id) => reject(ctx, id),
        Verdict::Translate(id, be) => {
            let vip = sa.user_ip4;
            let vip_port = sa.user_port as u16;
            let rev_key = RevNatKey4 {
                cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
                backend_addr: be.addr[0],
                backend_port: be.port,
                _pad: 0,
            };
            let rev = RevNatValue4 {
                vip,
                vip_port,
                _pad: 0,
            };
            let _ = REVNAT4.insert(&rev_key, &rev, 0);
            sa.user_ip4 = be.addr[0];
            sa.user_port = be.port as u32;
            bump(id, |c| c.translations += 1);
            ALLOW
        }
    }
}

#[inline(always)]
fn forward6(ctx: &SockAddrContext) -> i32 {
    let sa = unsafe { &mut *ctx.sock_addr };
    let Some(proto) = l4_proto(sa) else {
        return ALLOW;
    };
    let Some(fe) = lookup6(sa, proto) else {
        return ALLOW;
    };
    let verdict = match choose(ctx, &fe) {
        Verdict::Stale(id) => match lookup6(sa, proto) {
            Some(fe) => choose(ctx, &fe),
            None => Verdict::Reject(id),
        },
        v => v,
    };
    match verdict {
        Verdict::Reject(id) | Verdict::Stale(id) => reject(ctx, id),
        Verdict::Translate(id, be) => {
            let vip = [
                sa.user_ip6[0],
                sa.user_ip6[1],
                sa.user_ip6[2],
                sa.user_ip6[3],
            ];
            let vip_port = sa.user_port as u16;
            let rev_key = RevNatKey6 {
                cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
                backend_addr: be.addr,
                backend_port: be.port,
                _pad: [0; 3],
            };
            let rev = RevNatValue6 {
                vip,
                vip_port,
                _pad: 0,
            };
            let _ = REVNAT6.insert(&rev_key, &rev, 0);
            sa.user_ip6[0] = be.addr[0];
            sa.user_ip6[1] = be.addr[1];
            sa.user_ip6[2] = be.addr[2];
            sa.user_ip6[3] = be.addr[3];
            sa.user_port = be.port as u32;
            bump(id, |c| c.translations += 1);
            ALLOW
        }
    }
}

/// Rewrites a backend source (recvmsg) or peer (getpeername) back to the VIP it stands for.
#[inline(always)]
fn reverse4(ctx: &SockAddrContext) -> i32 {
    let sa = unsafe { &mut *ctx.sock_addr };
    let key = RevNatKey4 {
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        backend_addr: sa.user_ip4,
        backend_port: sa.user_port as u16,
        _pad: 0,
    };
    if let Some(rev) = unsafe { REVNAT4.get(&key) } {
        sa.user_ip4 = rev.vip;
        sa.user_port = rev.vip_port as u32;
    }
    ALLOW
}

#[inline(always)]
fn reverse6(ctx: &SockAddrContext) -> i32 {
    let sa = unsafe { &mut *ctx.sock_addr };
    let key = RevNatKey6 {
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        backend_addr: [
            sa.user_ip6[0],
            sa.user_ip6[1],
            sa.user_ip6[2],
            sa.user_ip6[3],
        ],
        backend_port: sa.user_port as u16,
        _pad: [0; 3],
    };
    if let Some(rev) = unsafe { REVNAT6.get(&key) } {
        let vip = rev.vip;
        sa.user_ip6[0] = vip[0];
        sa.user_ip6[1] = vip[1];
        sa.user_ip6[2] = vip[2];
        sa.user_ip6[3] = vip[3];
        sa.user_port = rev.vip_port as u32;
    }
    ALLOW
}

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx)
}

#[cgroup_sock_addr(connect6)]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sendmsg4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sendmsg6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn getpeername4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn getpeername6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx)
}

// Do-nothing programs of each measured hook (`r0 = 1; exit`), never attached by the agent. The
// benchmark attaches them next to the programs above, on the same cgroup, so both run on the
// same calls: their kernel run time per call is the floor a program of that type costs.

#[cgroup_sock_addr(connect4)]
pub fn noop_connect4(_ctx: SockAddrContext) -> i32 {
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn noop_connect6(_ctx: SockAddrContext) -> i32 {
    ALLOW
}

#[cgroup_sock_addr(sendmsg4)]
pub fn noop_sendmsg4(_ctx: SockAddrContext) -> i32 {
    ALLOW
}

#[cgroup_sock_addr(recvmsg4)]
pub fn noop_recvmsg4(_ctx: SockAddrContext) -> i32 {
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
