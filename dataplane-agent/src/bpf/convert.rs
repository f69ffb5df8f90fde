//! Conversions between the agent's types and the map ABI (`dataplane_ebpf`).
//!
//! The ABI keeps addresses and ports exactly as `struct bpf_sock_addr` holds them: each 32-bit
//! word and the 16-bit port carry their bytes in network order in memory.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dataplane_core::lb::Protocol;
use dataplane_ebpf::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP};

/// The IP protocol number the maps key a protocol by.
pub fn ip_proto(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
    }
}

/// The protocol of an IP protocol number in the maps; `None` for one the LB does not translate.
pub fn protocol_of(ip_proto: u8) -> Option<Protocol> {
    match ip_proto {
        IPPROTO_TCP => Some(Protocol::Tcp),
        IPPROTO_UDP => Some(Protocol::Udp),
        _ => None,
    }
}

/// An IPv4 address as `bpf_sock_addr.user_ip4` holds it.
pub fn ip4_word(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

pub fn ip4_from_word(word: u32) -> Ipv4Addr {
    Ipv4Addr::from(word.to_ne_bytes())
}

/// An IPv6 address as `bpf_sock_addr.user_ip6` holds it.
pub fn ip6_words(ip: Ipv6Addr) -> [u32; 4] {
    let o = ip.octets();
    std::array::from_fn(|i| {
        u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

pub fn ip6_from_words(words: [u32; 4]) -> Ipv6Addr {
    let mut o = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        o[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
    }
    Ipv6Addr::from(o)
}

/// A port as the low 16 bits of `bpf_sock_addr.user_port` hold it.
pub fn port_word(port: u16) -> u16 {
    port.to_be()
}

pub fn port_from_word(word: u16) -> u16 {
    u16::from_be(word)
}

/// An address as the `Backend.addr` words, with its family.
pub fn addr_words(ip: IpAddr) -> ([u32; 4], u8) {
    match ip {
        IpAddr::V4(v4) => ([ip4_word(v4), 0, 0, 0], AF_INET),
        IpAddr::V6(v6) => (ip6_words(v6), AF_INET6),
    }
}

pub fn addr_from_words(words: [u32; 4], family: u8) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(ip4_from_word(words[0]))),
        AF_INET6 => Some(IpAddr::V6(ip6_from_words(words))),
        _ => None,
    }
}

/// A name, NUL-padded in `N` bytes. Every name the maps hold fits whole (the fields are sized
/// for Kubernetes' limits: 63 bytes for labels, 253 for object names); a longer one (which
/// Kubernetes refuses) is cut at a character boundary, never mid-character.
pub fn name_bytes<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut n = s.len().min(N.saturating_sub(1));
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

pub fn name_from_bytes(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_hold_network_order_bytes() {
        let w = ip4_word(Ipv4Addr::new(10, 1, 2, 3));
        assert_eq!(w.to_ne_bytes(), [10, 1, 2, 3]);
        assert_eq!(port_word(80).to_ne_bytes(), [0, 80]);
        let v6: Ipv6Addr = "fd00::1:2".parse().unwrap();
        assert_eq!(ip6_from_words(ip6_words(v6)), v6);
        assert_eq!(ip4_from_word(w), Ipv4Addr::new(10, 1, 2, 3));
        assert_eq!(port_from_word(port_word(8080)), 8080);
    }

    #[test]
    fn names_round_trip_whole_and_never_overflow() {
        use dataplane_ebpf::{LABEL_LEN, NAME_LEN};
        assert_eq!(name_from_bytes(&name_bytes::<LABEL_LEN>("web")), "web");
        // A ServiceImport name may be 253 bytes: kept whole.
        let long = "x".repeat(253);
        assert_eq!(name_from_bytes(&name_bytes::<NAME_LEN>(&long)), long);
        let too_long = "é".repeat(200);
        let cut = name_from_bytes(&name_bytes::<LABEL_LEN>(&too_long));
        assert_eq!(cut, "é".repeat(31), "cut at a character boundary");
    }
}
