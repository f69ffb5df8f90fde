//! Which addresses may be programmed: the trust boundary between the objects a node reads
//! and the sockets of every process on it.
//!
//! A ServiceImport or an EndpointSlice is only data that someone with write access to the API
//! (or to a directory) put there. Programmed unchecked, an import whose "ClusterSet IP" is
//! another host's address captures every connection to it (the CVE-2020-8554 class), and a
//! slice listing 127.0.0.1 or 169.254.169.254 sends clients to the node itself or to the
//! cloud's metadata service. So:
//! - a ClusterSet IP is programmed only inside the ClusterSet's ranges
//!   ([`AddressPolicy::check_vip`]);
//! - a backend is never a special-purpose address (unspecified, loopback, link-local,
//!   multicast, broadcast, IPv4-mapped), never inside the ClusterSet's ranges, never in the
//!   deny list (cloud metadata addresses by default) and, when a member has an allow list,
//!   inside it ([`AddressPolicy::check_backend`]).
//!
//! A refused backend is dropped alone: the rest of its slice is still served. The merge
//! applies the same check to the endpoints of members' local slices before it imports them
//! ([`RefusedEndpoint`]), so the controller never writes them into an imported slice and the
//! member's ServiceExport says which were refused.

use std::{collections::BTreeMap, fmt, net::IpAddr};

use ipnet::IpNet;

use crate::{
    merge::ClusterSetCidrs,
    model::{ClusterId, NamespacedName},
};

/// Well-known cloud metadata and platform addresses that are not link-local: AWS's IPv6
/// metadata endpoint, Azure's wire server, Alibaba Cloud's metadata service. (169.254.169.254,
/// used by most clouds, is link-local and refused as such.)
pub const DEFAULT_DENY_CIDRS: [&str; 3] = [
    "fd00:ec2::254/128",
    "168.63.129.16/32",
    "100.100.100.200/32",
];

/// What an address was meant to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressUse {
    /// A ClusterSet IP of an import.
    ClusterSetIp,
    /// An endpoint of an imported slice.
    Backend,
    /// An endpoint of a member's local slice, which the controller does not import.
    MemberEndpoint,
}

impl AddressUse {
    /// A short label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            AddressUse::ClusterSetIp => "clusterset_ip",
            AddressUse::Backend => "backend",
            AddressUse::MemberEndpoint => "member_endpoint",
        }
    }
}

/// Why an address is not programmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// A ClusterSet IP outside every ClusterSet range.
    OutsideClusterSet,
    /// `0.0.0.0` or `::`.
    Unspecified,
    /// `127.0.0.0/8` or `::1`: the node itself.
    Loopback,
    /// `169.254.0.0/16` or `fe80::/10` (which holds the usual metadata address).
    LinkLocal,
    /// `224.0.0.0/4` or `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `::ffff:a.b.c.d`: an IPv4 address in IPv6 clothing, which would bypass the IPv4 checks.
    V4Mapped,
    /// A backend inside a ClusterSet range: a VIP pointing at VIPs.
    InsideClusterSet,
    /// In the configured deny list.
    Denied,
    /// Outside the allow list of the endpoint's member cluster.
    NotAllowedForCluster,
}

impl Refusal {
    /// Every reason.
    pub const ALL: [Refusal; 10] = [
        Refusal::OutsideClusterSet,
        Refusal::Unspecified,
        Refusal::Loopback,
        Refusal::LinkLocal,
        Refusal::Multicast,
        Refusal::Broadcast,
        Refusal::V4Mapped,
        Refusal::InsideClusterSet,
        Refusal::Denied,
        Refusal::NotAllowedForCluster,
    ];

    /// A short label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::OutsideClusterSet => "outside_clusterset_cidrs",
            Refusal::Unspecified => "unspecified",
            Refusal::Loopback => "loopback",
            Refusal::LinkLocal => "link_local",
            Refusal::Multicast => "multicast",
            Refusal::Broadcast => "broadcast",
            Refusal::V4Mapped => "ipv4_mapped",
            Refusal::InsideClusterSet => "inside_clusterset_cidrs",
            Refusal::Denied => "denied",
            Refusal::NotAllowedForCluster => "not_allowed_for_cluster",
        }
    }
}

impl Refusal {
    /// The reason string of the `EndpointsRefused` condition (CamelCase, as condition reasons
    /// are).
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::OutsideClusterSet => "OutsideClusterSetCIDRs",
            Refusal::Unspecified => "UnspecifiedAddress",
            Refusal::Loopback => "LoopbackAddress",
            Refusal::LinkLocal => "LinkLocalAddress",
            Refusal::Multicast => "MulticastAddress",
            Refusal::Broadcast => "BroadcastAddress",
            Refusal::V4Mapped => "IPv4MappedAddress",
            Refusal::InsideClusterSet => "InsideClusterSetCIDRs",
            Refusal::Denied => "DeniedAddress",
            Refusal::NotAllowedForCluster => "NotAllowedForCluster",
        }
    }
}

/// An endpoint of a member's local EndpointSlice that the merge did not import.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RefusedEndpoint {
    /// The member cluster.
    pub cluster: ClusterId,
    /// The member's local EndpointSlice that lists it.
    pub slice: NamespacedName,
    /// The endpoint's address.
    pub addr: IpAddr,
    /// Why it was refused.
    pub why: Refusal,
}

impl fmt::Display for RefusedEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "endpoint {} of EndpointSlice {} is {}",
            self.addr, self.slice, self.why
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::OutsideClusterSet => "outside the ClusterSet's CIDRs",
            Refusal::Unspecified => "an unspecified address",
            Refusal::Loopback => "a loopback address",
            Refusal::LinkLocal => "a link-local address",
            Refusal::Multicast => "a multicast address",
            Refusal::Broadcast => "the broadcast address",
            Refusal::V4Mapped => "an IPv4-mapped IPv6 address",
            Refusal::InsideClusterSet => "inside the ClusterSet's CIDRs",
            Refusal::Denied => "in the denied CIDRs",
            Refusal::NotAllowedForCluster => "outside its cluster's allowed CIDRs",
        })
    }
}

/// The addresses a node may program, and the ones the merge may import.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Where ClusterSet IPs may be (the merge's allocation ranges by default).
    pub clusterset_cidrs: Vec<IpNet>,
    /// Backends never programmed, on top of the special-purpose ranges
    /// ([`DEFAULT_DENY_CIDRS`] by default).
    pub deny_cidrs: Vec<IpNet>,
    /// Member clusters whose backends must be inside these ranges. A cluster not listed may
    /// use any address the other rules allow.
    pub allowed_by_cluster: BTreeMap<ClusterId, Vec<IpNet>>,
}

impl Default for AddressPolicy {
    fn default() -> Self {
        AddressPolicy::for_cidrs(&ClusterSetCidrs::default())
    }
}

impl AddressPolicy {
    /// The default policy for a ClusterSet that allocates from `cidrs`.
    pub fn for_cidrs(cidrs: &ClusterSetCidrs) -> Self {
        AddressPolicy {
            clusterset_cidrs: vec![IpNet::V4(cidrs.ipv4), IpNet::V6(cidrs.ipv6)],
            deny_cidrs: default_deny_cidrs(),
            allowed_by_cluster: BTreeMap::new(),
        }
    }

    /// Whether `ip` may be programmed as a ClusterSet IP.
    pub fn check_vip(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.clusterset_cidrs.iter().any(|n| n.contains(&ip)) {
            Ok(())
        } else {
            Err(Refusal::OutsideClusterSet)
        }
    }

    /// Whether `ip`, an endpoint of member `cluster`, may be programmed as a backend.
    pub fn check_backend(&self, cluster: &ClusterId, ip: IpAddr) -> Result<(), Refusal> {
        special_purpose(ip)?;
        if self.clusterset_cidrs.iter().any(|n| n.contains(&ip)) {
            return Err(Refusal::InsideClusterSet);
        }
        if self.deny_cidrs.iter().any(|n| n.contains(&ip)) {
            return Err(Refusal::Denied);
        }
        match self.allowed_by_cluster.get(cluster) {
            Some(allowed) if !allowed.iter().any(|n| n.contains(&ip)) => {
                Err(Refusal::NotAllowedForCluster)
            }
            _ => Ok(()),
        }
    }
}

/// [`DEFAULT_DENY_CIDRS`], parsed.
pub fn default_deny_cidrs() -> Vec<IpNet> {
    DEFAULT_DENY_CIDRS
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// The ranges no backend may be in, whatever the configuration.
fn special_purpose(ip: IpAddr) -> Result<(), Refusal> {
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_unspecified() {
                Err(Refusal::Unspecified)
            } else if v4.is_loopback() {
                Err(Refusal::Loopback)
            } else if v4.is_link_local() {
                Err(Refusal::LinkLocal)
            } else if v4.is_multicast() {
                Err(Refusal::Multicast)
            } else if v4.is_broadcast() {
                Err(Refusal::Broadcast)
            } else {
                Ok(())
            }
        }
        IpAddr::V6(v6) => {
            if v6.is_unspecified() {
                Err(Refusal::Unspecified)
            } else if v6.is_loopback() {
                Err(Refusal::Loopback)
            } else if v6.is_unicast_link_local() {
                Err(Refusal::LinkLocal)
            } else if v6.is_multicast() {
                Err(Refusal::Multicast)
            } else if v6.to_ipv4_mapped().is_some() {
                Err(Refusal::V4Mapped)
            } else {
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::cluster;

    fn backend(policy: &AddressPolicy, ip: &str) -> Result<(), Refusal> {
        policy.check_backend(&cluster("c1"), ip.parse().expect("ip"))
    }

    #[test]
    fn special_purpose_backends_are_refused_and_pod_addresses_pass() {
        let p = AddressPolicy::default();
        for (ip, why) in [
            ("0.0.0.0", Refusal::Unspecified),
            ("::", Refusal::Unspecified),
            ("127.0.0.1", Refusal::Loopback),
            ("127.9.9.9", Refusal::Loopback),
            ("::1", Refusal::Loopback),
            ("169.254.169.254", Refusal::LinkLocal),
            ("fe80::1", Refusal::LinkLocal),
            ("224.0.0.1", Refusal::Multicast),
            ("ff02::1", Refusal::Multicast),
            ("255.255.255.255", Refusal::Broadcast),
            ("::ffff:10.0.0.1", Refusal::V4Mapped),
            ("241.0.0.7", Refusal::InsideClusterSet),
            ("fd00:241::7", Refusal::InsideClusterSet),
            ("fd00:ec2::254", Refusal::Denied),
            ("168.63.129.16", Refusal::Denied),
            ("100.100.100.200", Refusal::Denied),
        ] {
            assert_eq!(backend(&p, ip), Err(why), "{ip}");
        }
        for ip in [
            "10.1.0.1",
            "192.168.7.7",
            "fd00:10::5",
            "2001:db8::1",
            "100.64.0.1",
        ] {
            assert_eq!(backend(&p, ip), Ok(()), "{ip}");
        }
    }

    #[test]
    fn vips_only_from_the_clusterset_ranges() {
        let mut p = AddressPolicy::default();
        assert_eq!(p.check_vip("241.0.3.4".parse().expect("ip")), Ok(()));
        assert_eq!(p.check_vip("fd00:241::9".parse().expect("ip")), Ok(()));
        for ip in ["10.96.0.10", "8.8.8.8", "241.1.0.1", "fd00:242::1"] {
            assert_eq!(
                p.check_vip(ip.parse().expect("ip")),
                Err(Refusal::OutsideClusterSet),
                "{ip}"
            );
        }
        p.clusterset_cidrs = vec!["10.96.0.0/12".parse().expect("cidr")];
        assert_eq!(p.check_vip("10.96.0.10".parse().expect("ip")), Ok(()));
        assert_eq!(
            p.check_vip("241.0.3.4".parse().expect("ip")),
            Err(Refusal::OutsideClusterSet)
        );
    }

    #[test]
    fn a_member_allow_list_limits_only_that_member() {
        let mut p = AddressPolicy::default();
        p.allowed_by_cluster
            .insert(cluster("c1"), vec!["10.1.0.0/16".parse().expect("cidr")]);
        assert_eq!(backend(&p, "10.1.2.3"), Ok(()));
        assert_eq!(backend(&p, "10.2.2.3"), Err(Refusal::NotAllowedForCluster));
        let other = p.check_backend(&cluster("c2"), "10.2.2.3".parse().expect("ip"));
        assert_eq!(other, Ok(()));
        // The allow list cannot open what is always refused.
        p.allowed_by_cluster
            .insert(cluster("c1"), vec!["0.0.0.0/0".parse().expect("cidr")]);
        assert_eq!(backend(&p, "127.0.0.1"), Err(Refusal::Loopback));
    }
}
