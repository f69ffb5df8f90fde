//! Pure generators for what each mode installs: kube-proxy-shaped iptables-restore and nft
//! input, and the agent's ServiceImport/EndpointSlice YAML. Written from the documented rule
//! shapes (kube-proxy's iptables and nftables proxiers), not from their code.

use std::{
    fmt::Write as _,
    net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6},
};

use super::load::Proto;

/// The namespace every bench service lives in.
pub const NAMESPACE: &str = "bench";
/// The service port every TCP bench service exposes.
pub const SERVICE_PORT: u16 = 80;
/// The ranges the bench's VIPs come from ([`vip`], [`vip6`]): wider than the agent's default
/// ClusterSet CIDRs, so the agent is told (`--clusterset-cidrs`).
pub const CLUSTERSET_CIDRS: &str = "241.0.0.0/8,fd00:241::/64";

/// The service port every UDP bench service exposes.
pub const UDP_SERVICE_PORT: u16 = 53;
/// Source range treated as "pod traffic", as kube-proxy's `--cluster-cidr`: the client is in
/// it, so the masquerade-mark rules are evaluated but do not fire (the pod-to-service path).
pub const CLUSTER_CIDR: &str = "10.99.0.0/16";
/// kube-proxy's default masquerade mark bit.
const MASQ_MARK: &str = "0x4000";

/// One ClusterSet-IP service with its endpoints, all of one protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub index: usize,
    pub proto: Proto,
    pub vip: Ipv4Addr,
    pub port: u16,
    pub endpoints: Vec<SocketAddrV4>,
}

impl Service {
    pub fn name(&self) -> String {
        match self.proto {
            Proto::Tcp => format!("svc-{}", self.index),
            Proto::Udp => format!("udp-{}", self.index),
        }
    }

    fn port_label(&self) -> &'static str {
        match self.proto {
            Proto::Tcp => "http",
            Proto::Udp => "dns",
        }
    }

    /// `namespace/name:port-name`, the service-port name kube-proxy hashes and comments with.
    fn port_name(&self) -> String {
        format!("{NAMESPACE}/{}:{}", self.name(), self.port_label())
    }

    /// The service's IPv6 VIP (the agent's services are dual-stack; see [`vip6`]).
    pub fn vip6(&self) -> Ipv6Addr {
        vip6(self.index, self.proto)
    }
}

/// The VIP of service `index`: 241.0.0.1 upwards for TCP, 241.128.0.1 upwards for UDP
/// (241.0.0.0/8; 50k services span one /16 and a bit of the next).
pub fn vip(index: usize, proto: Proto) -> Ipv4Addr {
    let base = match proto {
        Proto::Tcp => Ipv4Addr::new(241, 0, 0, 1),
        Proto::Udp => Ipv4Addr::new(241, 128, 0, 1),
    };
    Ipv4Addr::from(u32::from(base) + index as u32)
}

/// The IPv6 VIP of service `index`: `fd00:241::1` upwards for TCP, `fd00:241::8000:1`
/// upwards for UDP.
pub fn vip6(index: usize, proto: Proto) -> Ipv6Addr {
    let base: u128 = match proto {
        Proto::Tcp => 0xfd00_0241 << 96 | 1,
        Proto::Udp => 0xfd00_0241 << 96 | 0x8000_0001,
    };
    Ipv6Addr::from(base + index as u128)
}

/// The IPv6 twin of an IPv4 endpoint `10.99.c.h:p`: `[fd00:99:c::h]:p`, with `c` and `h`
/// written in decimal digits (as `tests::netns` numbers the test addresses).
pub fn endpoint6(ep: SocketAddrV4) -> SocketAddrV6 {
    let [_, _, c, h] = ep.ip().octets();
    let ip = format!("fd00:99:{c}::{h}")
        .parse::<Ipv6Addr>()
        .unwrap_or(Ipv6Addr::UNSPECIFIED);
    SocketAddrV6::new(ip, ep.port(), 0, 0)
}

/// `n` services of `proto` over `backends`: service `i` gets 2, 3 or 4 endpoints (`i % 3`),
/// starting at backend `i % len`, so every backend serves many services.
pub fn services(n: usize, backends: &[SocketAddrV4], proto: Proto) -> Vec<Service> {
    (0..n)
        .map(|i| {
            let k = (2 + i % 3).min(backends.len());
            let endpoints = (0..k).map(|j| backends[(i + j) % backends.len()]).collect();
            Service {
                index: i,
                proto,
                vip: vip(i, proto),
                port: match proto {
                    Proto::Tcp => SERVICE_PORT,
                    Proto::Udp => UDP_SERVICE_PORT,
                },
                endpoints,
            }
        })
        .collect()
}

/// FNV-1a, 64 bits: a stable short hash for chain names (kube-proxy hashes the service-port
/// name the same way in spirit; the exact function does not matter, only stability).
fn hash(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// `KUBE-SVC-<16 hex>` (25 characters; iptables allows 28).
pub fn svc_chain(s: &Service) -> String {
    format!(
        "KUBE-SVC-{:016X}",
        hash(&[&s.port_name(), &s.proto.to_string()])
    )
}

/// `KUBE-SEP-<16 hex>`, per service port and endpoint.
pub fn sep_chain(s: &Service, ep: SocketAddrV4) -> String {
    format!(
        "KUBE-SEP-{:016X}",
        hash(&[&s.port_name(), &s.proto.to_string(), &ep.to_string()])
    )
}

/// The probability kube-proxy gives endpoint `j` of `k`: 1/(k-j), so each of the k endpoints
/// is picked with 1/k overall by the chain of `statistic` rules.
fn probability(j: usize, k: usize) -> String {
    format!("{:.10}", 1.0 / (k - j) as f64)
}

/// The chains kube-proxy declares (and so flushes) on every sync, full or partial.
fn nat_common(out: &mut String) {
    for chain in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ] {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
}

fn nat_common_rules(out: &mut String) {
    let _ = writeln!(out, "-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}");
    let _ = writeln!(
        out,
        "-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"
    );
    let _ = writeln!(out, "-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}");
    let _ = writeln!(
        out,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
    );
}

/// KUBE-SERVICES: one jump per service (the linear list every new connection walks), then
/// the node-port catch-all kube-proxy always keeps last.
fn services_chain_rules(out: &mut String, svcs: &[Service]) {
    for s in svcs {
        let p = s.proto;
        let _ = writeln!(
            out,
            "-A KUBE-SERVICES -m comment --comment \"{} cluster IP\" -m {p} -p {p} -d {}/32 --dport {} -j {}",
            s.port_name(),
            s.vip,
            s.port,
            svc_chain(s)
        );
    }
    let _ = writeln!(
        out,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
}

fn svc_rules(out: &mut String, s: &Service) {
    let svc = svc_chain(s);
    let name = s.port_name();
    let _ = writeln!(
        out,
        "-A {svc} -m comment --comment \"{name} cluster IP\" -m {p} -p {p} -d {}/32 --dport {} ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ",
        s.vip,
        s.port,
        p = s.proto
    );
    let k = s.endpoints.len();
    for (j, ep) in s.endpoints.iter().enumerate() {
        let statistic = if j + 1 < k {
            format!(
                " -m statistic --mode random --probability {}",
                probability(j, k)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "-A {svc} -m comment --comment \"{name} -> {ep}\"{statistic} -j {}",
            sep_chain(s, *ep)
        );
    }
}

fn sep_rules(out: &mut String, s: &Service, ep: SocketAddrV4) {
    let sep = sep_chain(s, ep);
    let name = s.port_name();
    // Hairpin: an endpoint reaching itself through the VIP is masqueraded.
    let _ = writeln!(
        out,
        "-A {sep} -m comment --comment \"{name}\" -s {}/32 -j KUBE-MARK-MASQ",
        ep.ip()
    );
    let _ = writeln!(
        out,
        "-A {sep} -m comment --comment \"{name}\" -m {p} -p {p} -j DNAT --to-destination {ep}",
        p = s.proto
    );
}

/// The filter-table part kube-proxy always writes (its KUBE-SERVICES there only rejects
/// services without endpoints, none here, so it stays empty but is still jumped to).
fn filter_table(out: &mut String, with_jumps: bool) {
    out.push_str("*filter\n:KUBE-SERVICES - [0:0]\n");
    if with_jumps {
        out.push_str(
            "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
        );
    }
    out.push_str("COMMIT\n");
}

/// A full `iptables-restore` input (no `--noflush`): every chain of every service.
pub fn iptables_full(svcs: &[Service]) -> String {
    let mut out = String::with_capacity(svcs.len() * 1400 + 4096);
    filter_table(&mut out, true);
    out.push_str("*nat\n");
    nat_common(&mut out);
    for s in svcs {
        let _ = writeln!(out, ":{} - [0:0]", svc_chain(s));
        for ep in &s.endpoints {
            let _ = writeln!(out, ":{} - [0:0]", sep_chain(s, *ep));
        }
    }
    out.push_str(
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
    );
    out.push_str(
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n",
    );
    nat_common_rules(&mut out);
    services_chain_rules(&mut out, svcs);
    for s in svcs {
        svc_rules(&mut out, s);
        for ep in &s.endpoints {
            sep_rules(&mut out, s, *ep);
        }
    }
    out.push_str("COMMIT\n");
    out
}

/// kube-proxy's minimized partial sync for one changed service (`iptables-restore --noflush`):
/// the always-written chains (KUBE-SERVICES in full, with all N jumps), the changed service's
/// KUBE-SVC chain, its new KUBE-SEP chains, and `-X` for the endpoint chains that went away.
/// The endpoints `changed` has that `old` lacked, and those it no longer has.
fn endpoint_diff<'a>(
    changed: &'a Service,
    old: &'a [SocketAddrV4],
) -> (Vec<&'a SocketAddrV4>, Vec<&'a SocketAddrV4>) {
    let added = changed
        .endpoints
        .iter()
        .filter(|e| !old.contains(e))
        .collect();
    let gone = old
        .iter()
        .filter(|e| !changed.endpoints.contains(e))
        .collect();
    (added, gone)
}

/// `changed` is the service after the change, `old` its endpoints before.
pub fn iptables_change(svcs: &[Service], changed: &Service, old: &[SocketAddrV4]) -> String {
    let mut out = String::with_capacity(svcs.len() * 200 + 4096);
    filter_table(&mut out, false);
    out.push_str("*nat\n");
    nat_common(&mut out);
    let _ = writeln!(out, ":{} - [0:0]", svc_chain(changed));
    let (added, gone) = endpoint_diff(changed, old);
    for ep in &added {
        let _ = writeln!(out, ":{} - [0:0]", sep_chain(changed, **ep));
    }
    for ep in &gone {
        let _ = writeln!(out, ":{} - [0:0]", sep_chain(changed, **ep));
    }
    nat_common_rules(&mut out);
    services_chain_rules(&mut out, svcs);
    svc_rules(&mut out, changed);
    for ep in &added {
        sep_rules(&mut out, changed, **ep);
    }
    for ep in &gone {
        let _ = writeln!(out, "-X {}", sep_chain(changed, **ep));
    }
    out.push_str("COMMIT\n");
    out
}

/// Removes every rule and chain the iptables modes installed (nat and filter tables).
pub fn iptables_flush() -> &'static str {
    "*filter\nCOMMIT\n*nat\nCOMMIT\n"
}

/// The nft table kube-proxy's nftables mode owns.
pub const NFT_TABLE: &str = "ip kube-proxy";

fn nft_service_chain(s: &Service) -> String {
    format!(
        "service-{:08X}-{NAMESPACE}/{}/{}/{}",
        hash(&[&s.port_name(), &s.proto.to_string()]) as u32,
        s.name(),
        s.proto,
        s.port_label()
    )
}

fn nft_endpoint_chain(s: &Service, ep: SocketAddrV4) -> String {
    format!(
        "endpoint-{:08X}-{NAMESPACE}/{}/tcp/http__{}/{}",
        hash(&[&s.port_name(), &s.proto.to_string(), &ep.to_string()]) as u32,
        s.name(),
        ep.ip(),
        ep.port()
    )
}

/// The rules of a service chain: the masquerade check, then one `numgen` verdict map that
/// spreads new connections evenly over the endpoint chains.
fn nft_service_rules(out: &mut String, s: &Service) {
    let chain = nft_service_chain(s);
    let _ = writeln!(
        out,
        "add rule {NFT_TABLE} {chain} ip daddr {} {} dport {} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade",
        s.vip, s.proto, s.port
    );
    let arms: Vec<String> = s
        .endpoints
        .iter()
        .enumerate()
        .map(|(j, ep)| format!("{j} : goto {}", nft_endpoint_chain(s, *ep)))
        .collect();
    let _ = writeln!(
        out,
        "add rule {NFT_TABLE} {chain} numgen random mod {} vmap {{ {} }}",
        s.endpoints.len(),
        arms.join(" , ")
    );
}

fn nft_endpoint_rules(out: &mut String, s: &Service, ep: SocketAddrV4) {
    let chain = nft_endpoint_chain(s, ep);
    let _ = writeln!(
        out,
        "add rule {NFT_TABLE} {chain} ip saddr {} jump mark-for-masquerade",
        ep.ip()
    );
    let _ = writeln!(
        out,
        "add rule {NFT_TABLE} {chain} meta l4proto {} dnat to {ep}",
        s.proto
    );
}

/// One `nft -f` transaction installing the kube-proxy nftables shape for `svcs`: the
/// `service-ips` verdict map (one lookup per new connection whatever N is), per-service
/// chains with a `numgen` vmap, per-endpoint chains with `dnat`.
pub fn nft_full(svcs: &[Service]) -> String {
    let mut out = String::with_capacity(svcs.len() * 1200 + 4096);
    let t = NFT_TABLE;
    let _ = writeln!(out, "add table {t}");
    // Start from an empty table, so a rerun replaces instead of appending.
    let _ = writeln!(out, "delete table {t}");
    let _ = writeln!(out, "add table {t}");
    let _ = writeln!(out, "add chain {t} mark-for-masquerade");
    let _ = writeln!(
        out,
        "add rule {t} mark-for-masquerade mark set mark or {MASQ_MARK}"
    );
    let _ = writeln!(
        out,
        "add chain {t} masquerading {{ type nat hook postrouting priority 100 ; policy accept ; }}"
    );
    let _ = writeln!(
        out,
        "add rule {t} masquerading mark and {MASQ_MARK} == 0 return"
    );
    let _ = writeln!(
        out,
        "add rule {t} masquerading mark set mark xor {MASQ_MARK}"
    );
    let _ = writeln!(out, "add rule {t} masquerading masquerade fully-random");
    for s in svcs {
        let _ = writeln!(out, "add chain {t} {}", nft_service_chain(s));
        for ep in &s.endpoints {
            let _ = writeln!(out, "add chain {t} {}", nft_endpoint_chain(s, *ep));
        }
    }
    for s in svcs {
        nft_service_rules(&mut out, s);
        for ep in &s.endpoints {
            nft_endpoint_rules(&mut out, s, *ep);
        }
    }
    let _ = writeln!(
        out,
        "add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}"
    );
    // Elements in batches: one statement per 1000 keeps nft's parser stack small.
    for chunk in svcs.chunks(1000) {
        let elems: Vec<String> = chunk
            .iter()
            .map(|s| {
                format!(
                    "{} . {} . {} : goto {}",
                    s.vip,
                    s.proto,
                    s.port,
                    nft_service_chain(s)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "add element {t} service-ips {{ {} }}",
            elems.join(" , ")
        );
    }
    let _ = writeln!(out, "add chain {t} services");
    let _ = writeln!(
        out,
        "add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips"
    );
    let _ = writeln!(
        out,
        "add chain {t} nat-output {{ type nat hook output priority -100 ; policy accept ; }}"
    );
    let _ = writeln!(out, "add rule {t} nat-output jump services");
    out
}

/// One `nft -f` transaction for one changed service, as kube-proxy's nftables mode writes it:
/// the service chain flushed and rewritten, new endpoint chains added, and the endpoint chains
/// that went away flushed and deleted. The `service-ips` element is unchanged (same chain).
pub fn nft_change(changed: &Service, old: &[SocketAddrV4]) -> String {
    let mut out = String::new();
    let t = NFT_TABLE;
    let svc = nft_service_chain(changed);
    let (added, gone) = endpoint_diff(changed, old);
    for ep in &added {
        let c = nft_endpoint_chain(changed, **ep);
        let _ = writeln!(out, "add chain {t} {c}");
        let _ = writeln!(out, "flush chain {t} {c}");
    }
    let _ = writeln!(out, "flush chain {t} {svc}");
    nft_service_rules(&mut out, changed);
    for ep in &added {
        nft_endpoint_rules(&mut out, changed, **ep);
    }
    for ep in &gone {
        let c = nft_endpoint_chain(changed, **ep);
        let _ = writeln!(out, "flush chain {t} {c}");
        let _ = writeln!(out, "delete chain {t} {c}");
    }
    out
}

/// The agent's node-role input: one dual-stack ServiceImport (the IPv4 VIP of [`vip`] and the
/// IPv6 one of [`vip6`]) and one imported EndpointSlice per family (source cluster `bench`,
/// IPv6 endpoints from [`endpoint6`]) per service, flow-style YAML documents.
pub fn node_yaml(svcs: &[Service]) -> String {
    let mut out = String::with_capacity(svcs.len() * 1200);
    for s in svcs {
        let name = s.name();
        let proto = s.proto.to_string().to_uppercase();
        let label = s.port_label();
        let _ = write!(
            out,
            "---\napiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\n\
             metadata: {{name: {name}, namespace: {NAMESPACE}}}\n\
             spec: {{type: ClusterSetIP, ips: [{}, \"{}\"], ipFamilies: [IPv4, IPv6], ports: [{{name: {label}, protocol: {proto}, port: {}}}]}}\n",
            s.vip,
            s.vip6(),
            s.port
        );
        // One slice port per distinct endpoint port (all bench backends share one).
        let port = s.endpoints.first().map(|e| e.port()).unwrap_or(0);
        for (family, addrs) in [
            (
                "IPv4",
                s.endpoints
                    .iter()
                    .map(|e| e.ip().to_string())
                    .collect::<Vec<_>>(),
            ),
            (
                "IPv6",
                s.endpoints
                    .iter()
                    .map(|e| format!("\"{}\"", endpoint6(*e).ip()))
                    .collect(),
            ),
        ] {
            let eps: Vec<String> = addrs
                .iter()
                .map(|a| format!("{{addresses: [{a}]}}"))
                .collect();
            let _ = write!(
                out,
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                 metadata: {{name: {name}-bench-{}, namespace: {NAMESPACE}, labels: {{multicluster.kubernetes.io/service-name: {name}, multicluster.kubernetes.io/source-cluster: bench}}}}\n\
                 addressType: {family}\nports: [{{name: {label}, protocol: {proto}, port: {port}}}]\nendpoints: [{}]\n",
                family.to_lowercase(),
                eps.join(", ")
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends() -> Vec<SocketAddrV4> {
        (10..14)
            .map(|h| SocketAddrV4::new(Ipv4Addr::new(10, 99, 1, h), 8080))
            .collect()
    }

    #[test]
    fn services_spread_over_all_backends() {
        let svcs = services(12, &backends(), Proto::Tcp);
        assert_eq!(svcs[0].vip, Ipv4Addr::new(241, 0, 0, 1));
        assert_eq!(vip(65535, Proto::Tcp), Ipv4Addr::new(241, 1, 0, 0));
        assert_eq!(vip(0, Proto::Udp), Ipv4Addr::new(241, 128, 0, 1));
        assert_eq!(
            vip6(0x10, Proto::Tcp),
            "fd00:241::11".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            vip6(0, Proto::Udp),
            "fd00:241::8000:1".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(endpoint6(backends()[0]).to_string(), "[fd00:99:1::10]:8080");
        assert_eq!(
            svcs.iter().map(|s| s.endpoints.len()).collect::<Vec<_>>(),
            [2, 3, 4, 2, 3, 4, 2, 3, 4, 2, 3, 4]
        );
        for b in backends() {
            assert!(svcs.iter().any(|s| s.endpoints.contains(&b)));
        }
        for s in &svcs {
            let mut e = s.endpoints.clone();
            e.dedup();
            assert_eq!(e.len(), s.endpoints.len(), "no duplicate endpoint");
        }
    }

    #[test]
    fn iptables_full_has_kube_proxy_shape() {
        let svcs = services(2, &backends(), Proto::Tcp);
        let text = iptables_full(&svcs);
        let lines: Vec<&str> = text.lines().collect();
        // One jump per service plus the node-port rule.
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.starts_with("-A KUBE-SERVICES "))
                .count(),
            3
        );
        let svc0 = svc_chain(&svcs[0]);
        let svc_rules: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("-A {svc0} ")))
            .collect();
        // Masquerade check, then 2 endpoints: one 1/2 statistic rule and a fallthrough.
        assert_eq!(svc_rules.len(), 3);
        assert!(svc_rules[1].contains("--probability 0.5000000000"));
        assert!(!svc_rules[2].contains("statistic"));
        // Three endpoints for service 1: 1/3, 1/2, rest.
        assert!(text.contains("--probability 0.3333333333"));
        assert_eq!(
            lines.iter().filter(|l| l.contains("-j DNAT")).count(),
            2 + 3
        );
        assert!(text.contains("-d 241.0.0.1/32 --dport 80 -j KUBE-SVC-"));
        assert!(text.contains("--to-destination 10.99.1.10:8080"));
        for l in &lines {
            if let Some(chain) = l.strip_prefix(':') {
                let name = chain.split(' ').next().unwrap();
                assert!(name.len() <= 28, "{name} too long for iptables");
            }
        }
        assert_eq!(text.matches("COMMIT").count(), 2);
    }

    #[test]
    fn iptables_change_rewrites_services_and_one_service() {
        let mut svcs = services(3, &backends(), Proto::Tcp);
        let old = svcs[1].endpoints.clone();
        let gone = old[0];
        svcs[1].endpoints[0] = backends()[0];
        let text = iptables_change(&svcs, &svcs[1], &old);
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("-A KUBE-SERVICES "))
                .count(),
            4,
            "KUBE-SERVICES is always rewritten in full"
        );
        assert!(text.contains(&format!("-X {}", sep_chain(&svcs[1], gone))));
        assert!(text.contains(&format!(":{} - [0:0]", sep_chain(&svcs[1], backends()[0]))));
        // Only the changed service's own chains besides the common ones.
        assert!(!text.contains(&svc_chain(&svcs[0]).replace("KUBE-SVC", ":KUBE-SVC")));
        assert_eq!(text.lines().filter(|l| l.contains("-j DNAT")).count(), 1);
    }

    #[test]
    fn nft_text_has_kube_proxy_shape() {
        let mut svcs = services(2, &backends(), Proto::Tcp);
        let text = nft_full(&svcs);
        assert!(text.contains(
            "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }"
        ));
        assert!(text.contains("241.0.0.1 . tcp . 80 : goto service-"));
        assert!(text.contains("numgen random mod 3 vmap { 0 : goto endpoint-"));
        assert!(text.contains("dnat to 10.99.1.10:8080"));
        assert!(text.contains("ip daddr . meta l4proto . th dport vmap @service-ips"));
        let old = svcs[0].endpoints.clone();
        svcs[0].endpoints[1] = backends()[3];
        let change = nft_change(&svcs[0], &old);
        assert!(change.contains(&format!(
            "delete chain ip kube-proxy {}",
            nft_endpoint_chain(&svcs[0], old[1])
        )));
        assert!(change.contains(&format!(
            "add chain ip kube-proxy {}",
            nft_endpoint_chain(&svcs[0], backends()[3])
        )));
        assert!(change.contains("dnat to 10.99.1.13:8080"));
        assert!(!change.contains("service-ips"));
    }

    #[test]
    fn node_yaml_parses_as_imports_and_slices() {
        let svcs = services(2, &backends(), Proto::Tcp);
        let text = node_yaml(&svcs);
        let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
            .map(serde_yaml::Value::deserialize)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(docs.len(), 6);
        assert_eq!(docs[0]["spec"]["ips"][0].as_str(), Some("241.0.0.1"));
        assert_eq!(docs[0]["spec"]["ips"][1].as_str(), Some("fd00:241::1"));
        assert_eq!(
            docs[1]["metadata"]["labels"]["multicluster.kubernetes.io/service-name"].as_str(),
            Some("svc-0")
        );
        assert_eq!(docs[2]["addressType"].as_str(), Some("IPv6"));
        assert_eq!(
            docs[2]["endpoints"][0]["addresses"][0].as_str(),
            Some("fd00:99:1::10")
        );
        assert_eq!(docs[4]["endpoints"].as_sequence().unwrap().len(), 3);
        let udp = node_yaml(&services(1, &backends(), Proto::Udp));
        assert!(
            udp.contains("ports: [{name: dns, protocol: UDP, port: 53}]"),
            "{udp}"
        );
        assert!(udp.contains("name: udp-0,"), "{udp}");
    }

    #[test]
    fn udp_rules_match_udp() {
        let svcs = services(1, &backends(), Proto::Udp);
        let ipt = iptables_full(&svcs);
        assert!(ipt.contains("-m udp -p udp -d 241.128.0.1/32 --dport 53 -j KUBE-SVC-"));
        assert!(ipt.contains("-m udp -p udp -j DNAT --to-destination 10.99.1.10:8080"));
        assert!(!ipt.contains("-p tcp"));
        let nft = nft_full(&svcs);
        assert!(nft.contains("241.128.0.1 . udp . 53 : goto service-"));
        assert!(nft.contains("meta l4proto udp dnat to 10.99.1.10:8080"));
        assert!(nft.contains("ip daddr 241.128.0.1 udp dport 53"));
    }

    use serde::Deserialize as _;
}
