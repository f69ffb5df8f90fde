//! IP address parsing on the hot path of the merge and the lb table: half a million endpoint
//! addresses per merge, so IPv4 takes a one-pass parser that agrees exactly with the standard
//! library's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `s` is a dotted-quad IPv4 address, exactly as `Ipv4Addr::from_str` decides (four
/// decimal octets up to 255, no leading zeros), without its generic parser: half a million
/// endpoint addresses are checked per merge.
pub fn is_ipv4(s: &str) -> bool {
    parse_ipv4(s).is_some()
}

/// `s` as an IPv4 address, exactly as `Ipv4Addr::from_str` parses it, in one pass over the
/// bytes (the standard parser is generic over v4/v6 and a few times slower).
pub fn parse_ipv4(s: &str) -> Option<Ipv4Addr> {
    let b = s.as_bytes();
    // "0.0.0.0" to "255.255.255.255".
    if !(7..=15).contains(&b.len()) {
        return None;
    }
    let digit = |i: usize| b.get(i).map(|c| c.wrapping_sub(b'0')).filter(|d| *d <= 9);
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (n, octet) in octets.iter_mut().enumerate() {
        if n > 0 {
            if b.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let mut value = u32::from(digit(i)?);
        i += 1;
        // A leading zero is the whole octet ("01" is refused); otherwise up to two more digits.
        if value != 0 {
            for _ in 0..2 {
                let Some(d) = digit(i) else { break };
                value = value * 10 + u32::from(d);
                i += 1;
            }
        }
        *octet = u8::try_from(value).ok()?;
    }
    (i == b.len()).then(|| Ipv4Addr::from(octets))
}

/// `s` as an IP address, exactly as `IpAddr::from_str` parses it, with the common IPv4 case
/// on the fast path.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    match parse_ipv4(s) {
        Some(v4) => Some(IpAddr::V4(v4)),
        None => s.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The fast IPv4 check agrees with the standard library's parser.
        #[test]
        fn is_ipv4_matches_std(s in "[0-9.]{0,16}|[0-9a-f:.]{0,20}") {
            prop_assert_eq!(is_ipv4(&s), s.parse::<std::net::Ipv4Addr>().is_ok(), "{}", s);
        }

        /// The fast parsers give what the standard library's do.
        #[test]
        fn parse_ip_matches_std(s in "[0-9.]{0,16}|[0-9a-f:.]{0,20}|\\PC{0,20}") {
            prop_assert_eq!(parse_ipv4(&s), s.parse::<Ipv4Addr>().ok(), "{}", s);
            prop_assert_eq!(parse_ip(&s), s.parse::<IpAddr>().ok(), "{}", s);
        }

        /// Near-valid quads: octets past 255, leading zeros, missing or extra octets.
        #[test]
        fn is_ipv4_matches_std_on_quads(
            o in prop::collection::vec((0u32..300, any::<bool>()), 3..6)
        ) {
            let s: Vec<String> = o
                .iter()
                .map(|(n, zero)| if *zero { format!("0{n}") } else { n.to_string() })
                .collect();
            let s = s.join(".");
            prop_assert_eq!(is_ipv4(&s), s.parse::<std::net::Ipv4Addr>().is_ok(), "{}", s);
            prop_assert_eq!(parse_ipv4(&s), s.parse::<Ipv4Addr>().ok(), "{}", s);
        }
    }

    #[test]
    fn is_ipv4_table() {
        for ok in ["0.0.0.0", "10.1.2.3", "255.255.255.255", "1.10.100.199"] {
            assert!(is_ipv4(ok), "{ok}");
        }
        for bad in [
            "",
            "1.2.3",
            "1.2.3.4.5",
            "256.0.0.1",
            "01.2.3.4",
            "1..2.3",
            "1.2.3.",
            "a.b.c.d",
            "::1",
            "1.2.3.4 ",
            "1.2.3.04",
            "1.2.3.1000",
            "255.255.255.256",
            "0.0.0.00",
            "+1.2.3.4",
        ] {
            assert!(!is_ipv4(bad), "{bad}");
        }
    }
}
