//! One service reduced to the records its answers need (names checked once, ports and
//! endpoints grouped per DNS question), so a query is a lookup.

use super::*;

/// Reduces one service to what its answers need. An error means the service has no usable DNS
/// name (a namespace or name that is not a lowercase DNS label); it is then left out of the
/// zone. Ports and endpoints with bad names are left out alone, and listed in `skipped`.
pub fn build_service(svc: &DnsService) -> Result<ServiceRecords, ZoneError> {
    let bad = |what: &'static str, value: &str| ZoneError::BadLabel {
        namespace: svc.namespace.clone(),
        name: svc.name.clone(),
        what,
        value: value.to_owned(),
    };
    // Lowercase only, as Kubernetes names are: the zone's names are case-insensitive, so
    // `Web` and `web` (possible in hand-written files) would take each other's records.
    let lower_label = |s: &str| is_label(s) && !s.bytes().any(|b| b.is_ascii_uppercase());
    if !lower_label(&svc.namespace) {
        return Err(bad("namespace", &svc.namespace));
    }
    if !lower_label(&svc.name) {
        return Err(bad("name", &svc.name));
    }
    let fqdn = service_fqdn(&svc.namespace, &svc.name).ok_or_else(|| ZoneError::NameTooLong {
        namespace: svc.namespace.clone(),
        name: svc.name.clone(),
    })?;
    let mut skipped = Vec::new();
    // Named ports, each (name, protocol) once, in order.
    let mut named: Vec<SrvPort> = Vec::new();
    for p in &svc.ports {
        let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        if !is_label(n) {
            skipped.push(format!(
                "port name {n:?} is not a DNS label: no SRV records"
            ));
            continue;
        }
        let label: Box<str> = format!("_{}", n.to_ascii_lowercase()).into();
        if !named
            .iter()
            .any(|m| m.label == label && m.protocol == p.protocol)
        {
            named.push(SrvPort {
                label,
                protocol: p.protocol,
                port: p.port,
            });
        }
    }
    let kind = match &svc.kind {
        DnsKind::ClusterSetIp { ips } => {
            let v4 = ips.iter().find_map(|ip| match ip {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            });
            let v6 = ips.iter().find_map(|ip| match ip {
                IpAddr::V6(v6) => Some(*v6),
                IpAddr::V4(_) => None,
            });
            Kind::ClusterSetIp {
                v4,
                v6,
                ports: named.into(),
            }
        }
        DnsKind::Headless => {
            let mut clusters: Vec<Arc<str>> = Vec::new();
            let mut hosts: BTreeMap<(Arc<str>, String), Host> = BTreeMap::new();
            let ready = svc.endpoints.iter().filter(|e| e.ready);
            for ep in ready.clone() {
                if !is_label(&ep.cluster) {
                    skipped.push(format!(
                        "endpoint {}: cluster id {:?} is not a DNS label; left out",
                        ep.ip, ep.cluster
                    ));
                    continue;
                }
                let cluster = match clusters.iter().find(|c| ***c == *ep.cluster) {
                    Some(c) => c.clone(),
                    None => {
                        let c: Arc<str> = ep.cluster.to_ascii_lowercase().into();
                        clusters.push(c.clone());
                        c
                    }
                };
                let label = host_label(ep.hostname.as_deref(), ep.ip);
                let host = hosts
                    .entry((cluster.clone(), label.clone()))
                    .or_insert_with(|| Host {
                        cluster,
                        label: label.into(),
                        v4: Vec::new(),
                        v6: Vec::new(),
                    });
                match ep.ip {
                    IpAddr::V4(v4) if !host.v4.contains(&v4) => host.v4.push(v4),
                    IpAddr::V6(v6) if !host.v6.contains(&v6) => host.v6.push(v6),
                    _ => {}
                }
            }
            let hosts: Vec<Host> = hosts
                .into_values()
                .map(|mut h| {
                    h.v4.sort_unstable();
                    h.v6.sort_unstable();
                    h
                })
                .collect();
            // Each host's index, and each port's targets seen: a lookup per endpoint, not a
            // scan (a headless service may have thousands of endpoints).
            let host_index: std::collections::HashMap<(&str, &str), u32> = hosts
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    (
                        (&*h.cluster, &*h.label),
                        u32::try_from(i).unwrap_or(u32::MAX),
                    )
                })
                .collect();
            let mut ports = Vec::new();
            for p in named {
                let name = &p.label[1..];
                let mut targets: Vec<(u32, u16)> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                for ep in ready.clone() {
                    let Some(number) = ep
                        .ports
                        .iter()
                        // The label is lowercase; the slice's port name may not be.
                        .find(|q| {
                            q.protocol == p.protocol
                                && q.name
                                    .as_deref()
                                    .is_some_and(|n| n.eq_ignore_ascii_case(name))
                        })
                        .map(|q| q.port)
                    else {
                        continue;
                    };
                    let label = host_label(ep.hostname.as_deref(), ep.ip);
                    let Some(&i) = host_index.get(&(&*ep.cluster, &*label)) else {
                        continue;
                    };
                    if seen.insert(i) {
                        targets.push((i, number));
                    }
                }
                if !targets.is_empty() {
                    targets.sort_unstable();
                    ports.push(HeadlessPort {
                        label: p.label,
                        protocol: p.protocol,
                        targets,
                    });
                }
            }
            ports.sort_by(|a, b| (&a.label, a.protocol).cmp(&(&b.label, b.protocol)));
            let mut v4: Vec<_> = hosts.iter().flat_map(|h| h.v4.iter().copied()).collect();
            let mut v6: Vec<_> = hosts.iter().flat_map(|h| h.v6.iter().copied()).collect();
            v4.sort_unstable();
            v4.dedup();
            v6.sort_unstable();
            v6.dedup();
            Kind::Headless {
                hosts: hosts.into(),
                v4: v4.into(),
                v6: v6.into(),
                ports: ports.into(),
            }
        }
    };
    Ok(ServiceRecords {
        fqdn,
        kind,
        skipped,
    })
}
