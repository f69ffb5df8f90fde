//! Programs that only the benchmark attaches, next to the agent's (the agent never loads
//! them): the floor of each measured hook and the frontend-lookup reference.

use core::ptr::write_volatile;

use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};

use crate::{ALLOW, V4, l4_proto, lookup};

// Do-nothing programs of each measured hook (`r0 = 1; exit`). The benchmark attaches them to
// the load's cgroup, a child of the agent's, so they run on the same calls as the agent's
// programs: their kernel run time per call is the floor a program of that type costs.

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

// Reference programs for the benchmark, never attached by the agent: the frontend lookup of
// `forward` alone (the (port, protocol) entry, else the VIP's wildcard), the least that any
// translation of a VIP must do. Attached in a child cgroup of the agent's, they run just before
// the agent's programs on the same calls, so their cost per call is that of finding the
// frontend in the maps as the caches stand when a call arrives.

#[cgroup_sock_addr(connect4)]
pub fn lookup_connect4(ctx: SockAddrContext) -> i32 {
    lookup_only4(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn lookup_sendmsg4(ctx: SockAddrContext) -> i32 {
    lookup_only4(&ctx)
}

#[inline(always)]
fn lookup_only4(ctx: &SockAddrContext) -> i32 {
    let sa = unsafe { &*ctx.sock_addr };
    if let Some(proto) = l4_proto(sa) {
        // Every field of the frontend's header, as `forward` reads them (on the cache line of
        // the element's value); the volatile store keeps the reads, which the compiler would
        // otherwise drop with their unused result.
        let found = lookup::<V4>(sa.user_ip4, sa.user_port as u16, proto).map_or(0, |fe| {
            fe.id ^ fe.base ^ fe.affinity_timeout_s ^ ((fe.count as u32) << 8) ^ fe.flags as u32
        });
        let mut sink = 0u32;
        unsafe { write_volatile(&mut sink, found) };
    }
    ALLOW
}
