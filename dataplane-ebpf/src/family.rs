//! One address family of the maps at a time: the frontend lookup and the reverse entries of
//! unconnected UDP sockets (`MCS_REVNAT4/6`, tagged with `rev_tag`), behind [`Family`], so
//! the programs' paths are written once for IPv4 and IPv6.

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg},
    ptr::read_volatile,
};

use dataplane_ebpf::{
    AF_INET, AF_INET6, Frontend, FrontendKey4, FrontendKey6, RevNatKey4, RevNatKey6, RevNatValue4,
    RevNatValue6, rev_tag,
};

use crate::{FRONTENDS4, FRONTENDS6, REVNAT4, REVNAT6, copy_checked};

/// One address family of the maps: its frontend and reverse-translation maps, and where a
/// backend's address sits in a [`Slot`]. [`V4`] also serves IPv4-mapped IPv6 destinations.
pub(crate) trait Family {
    /// An address as `bpf_sock_addr` holds it (network-order words).
    type Addr: Copy + PartialEq;
    /// [`AF_INET`] or [`AF_INET6`], as [`SockRevNat::family`] holds it.
    const FAMILY: u8;
    fn to_words(addr: Self::Addr) -> [u32; 4];
    fn from_words(words: [u32; 4]) -> Self::Addr;
    /// Whether the family's frontends may carry their backends ([`FRONTEND_F_INLINE`]): IPv4
    /// only, whose addresses fit the copies.
    const INLINE: bool;
    /// A copy of the frontend entry of (address, port, protocol) ([`copy_checked`]);
    /// `port == 0 && proto == 0` is the VIP's wildcard.
    fn frontend(addr: Self::Addr, port: u16, proto: u8) -> Option<Frontend>;
    /// Records that (socket, backend) stands for (VIP, port): written only when it is not so
    /// already.
    fn rev_record(
        cookie: u64,
        backend: Self::Addr,
        backend_port: u16,
        vip: Self::Addr,
        vip_port: u16,
    ) -> Result<(), i32>;
    /// The (VIP, port) that (socket, backend) stands for.
    fn rev_lookup(cookie: u64, backend: Self::Addr, backend_port: u16)
    -> Option<(Self::Addr, u16)>;
}

pub(crate) struct V4;
pub(crate) struct V6;

impl Family for V4 {
    type Addr = u32;
    const FAMILY: u8 = AF_INET;
    const INLINE: bool = true;

    #[inline(always)]
    fn to_words(addr: u32) -> [u32; 4] {
        [addr, 0, 0, 0]
    }

    #[inline(always)]
    fn from_words(words: [u32; 4]) -> u32 {
        words[0]
    }

    #[inline(always)]
    fn frontend(addr: u32, port: u16, proto: u8) -> Option<Frontend> {
        let key = FrontendKey4 {
            addr,
            port,
            proto,
            _pad: 0,
        };
        copy_checked(&FRONTENDS4, &key)
    }

    /// An existing entry is rewritten in place by one compare-and-swap of its aligned 8-byte
    /// value (hash map values are 8-byte aligned), which `rev_lookup` reads with one load: a
    /// reader sees the old VIP or the new one, never a mix. The entry is inserted instead when
    /// the value read is not this key's (its tag: see `rev_tag`), or when the swap fails
    /// because the value changed after it was read. A socket that sends to
    /// several VIPs served by one backend rewrites its entry on every change of VIP; an insert
    /// there would take a new LRU node and free the old one each time.
    #[inline(always)]
    fn rev_record(
        cookie: u64,
        backend: u32,
        backend_port: u16,
        vip: u32,
        vip_port: u16,
    ) -> Result<(), i32> {
        let key = RevNatKey4 {
            cookie,
            backend_addr: backend,
            backend_port,
            _pad: 0,
        };
        let value = RevNatValue4 {
            vip,
            vip_port,
            tag: rev_tag(cookie, &[backend], backend_port, &[vip], vip_port),
        };
        if let Some(entry) = REVNAT4.get_ptr_mut(&key) {
            let word = rev4_word(value);
            // SAFETY: a pointer to the entry's 8-byte, 8-byte aligned value, valid for the
            // program's run (the element may be another key's by now: see `rev_tag`).
            unsafe {
                let entry = entry as *mut u64;
                let old = read_volatile(entry);
                if old == word {
                    return Ok(());
                }
                let was = rev4_value(old);
                let ours = was.tag == 0
                    || was.tag
                        == rev_tag(cookie, &[backend], backend_port, &[was.vip], was.vip_port);
                // Swapped only while the element still holds what was read, so an element
                // evicted and given to another key meanwhile keeps that key's value.
                if ours
                    && atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                        entry, old, word,
                    )
                    .1
                {
                    return Ok(());
                }
            }
        }
        REVNAT4.insert(&key, &value, 0).map_err(|e| e as i32)
    }

    #[inline(always)]
    fn rev_lookup(cookie: u64, backend: u32, backend_port: u16) -> Option<(u32, u16)> {
        let key = RevNatKey4 {
            cookie,
            backend_addr: backend,
            backend_port,
            _pad: 0,
        };
        // SAFETY: as in `rev_record`: one load of the whole value.
        let word = unsafe { read_volatile(REVNAT4.get_ptr(&key)? as *const u64) };
        let value = rev4_value(word);
        let ours = value.tag == 0
            || value.tag
                == rev_tag(
                    cookie,
                    &[backend],
                    backend_port,
                    &[value.vip],
                    value.vip_port,
                );
        ours.then_some((value.vip, value.vip_port))
    }
}

impl Family for V6 {
    type Addr = [u32; 4];
    const FAMILY: u8 = AF_INET6;
    const INLINE: bool = false;

    #[inline(always)]
    fn to_words(addr: [u32; 4]) -> [u32; 4] {
        addr
    }

    #[inline(always)]
    fn from_words(words: [u32; 4]) -> [u32; 4] {
        words
    }

    #[inline(always)]
    fn frontend(addr: [u32; 4], port: u16, proto: u8) -> Option<Frontend> {
        let key = FrontendKey6 {
            addr,
            port,
            proto,
            _pad: 0,
        };
        copy_checked(&FRONTENDS6, &key)
    }

    /// A 20-byte value cannot be stored in one instruction: a changed entry is replaced whole
    /// (the map swaps in a new element). A reader may still copy an element while the kernel
    /// gives it to another insert; the tag, a hash of the key and the VIP, refuses such a copy
    /// (see `rev_tag`).
    #[inline(always)]
    fn rev_record(
        cookie: u64,
        backend: [u32; 4],
        backend_port: u16,
        vip: [u32; 4],
        vip_port: u16,
    ) -> Result<(), i32> {
        if Self::rev_lookup(cookie, backend, backend_port) == Some((vip, vip_port)) {
            return Ok(());
        }
        let key = RevNatKey6 {
            cookie,
            backend_addr: backend,
            backend_port,
            _pad: [0; 3],
        };
        let value = RevNatValue6 {
            vip,
            vip_port,
            tag: rev_tag(cookie, &backend, backend_port, &vip, vip_port),
        };
        REVNAT6.insert(&key, &value, 0).map_err(|e| e as i32)
    }

    #[inline(always)]
    fn rev_lookup(cookie: u64, backend: [u32; 4], backend_port: u16) -> Option<([u32; 4], u16)> {
        let key = RevNatKey6 {
            cookie,
            backend_addr: backend,
            backend_port,
            _pad: [0; 3],
        };
        // Copied, then its tag checked: a copy of an element given to another key meanwhile,
        // or torn by that, is not used (see `rev_tag`).
        let value = *unsafe { REVNAT6.get(&key) }?;
        let ours = value.tag == 0
            || value.tag == rev_tag(cookie, &backend, backend_port, &value.vip, value.vip_port);
        ours.then_some((value.vip, value.vip_port))
    }
}

/// A [`RevNatValue4`] as the one 8-byte word it is stored as.
#[inline(always)]
fn rev4_word(value: RevNatValue4) -> u64 {
    // SAFETY: two `repr(C)` types of 8 bytes, every bit pattern valid for both.
    unsafe { core::mem::transmute::<RevNatValue4, u64>(value) }
}

#[inline(always)]
fn rev4_value(word: u64) -> RevNatValue4 {
    // SAFETY: as in `rev4_word`.
    unsafe { core::mem::transmute::<u64, RevNatValue4>(word) }
}
