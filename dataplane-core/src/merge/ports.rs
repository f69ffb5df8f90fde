//! Port merge (KEP-1645 §Service Port, after kubernetes/enhancements#5706).
//!
//! The merged ports are the union of the contributing exports' ports, walked oldest export
//! first, each export's ports in declaration order. A newer port is dropped, the older
//! definition winning, when
//! - its name (the empty name included) is already used by a different (protocol, port), or
//! - its (protocol, port) is already used under another name or another `appProtocol`.
//!
//! `PortConflict` is raised whenever any export's port set differs from the merged set, both
//! compared as sets of (name, protocol, port, appProtocol).
//!
//! Each merged port also lists the clusters that declare it **identically: same name, protocol
//! and port**. `appProtocol` is deliberately not compared there: it is a hint for L7 proxies,
//! while the socket load balancer forwards bytes at L4, so a cluster that declares `http:80/TCP`
//! with another `appProtocol` still serves port 80. (The difference still raises
//! `PortConflict`.) Only those clusters' endpoints carry the port in the imported
//! EndpointSlices, which is what restricts traffic to clusters that declare the port.

use std::collections::{HashMap, HashSet};

use super::MergedPort;
use super::exports::Export;
use crate::model::{ClusterId, ServicePort};

/// The comparison key of a port: (name, protocol, port, appProtocol), borrowed.
pub type PortKeyRef<'a> = (&'a str, &'a str, i32, Option<&'a str>);

/// The borrowed key of a normalised port.
pub fn key_ref(p: &ServicePort) -> PortKeyRef<'_> {
    (
        p.name_or_empty(),
        p.protocol_or_tcp(),
        p.port,
        p.app_protocol.as_deref(),
    )
}

/// A port as the routing rule tells ports apart: (name, protocol, number), no appProtocol.
type L4Key<'a> = (&'a str, &'a str, i32);

/// The [`L4Key`] of a port.
fn l4_key(p: &ServicePort) -> L4Key<'_> {
    (p.name_or_empty(), p.protocol_or_tcp(), p.port)
}

/// A port of a newer export that lost to an older definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dropped {
    pub port: ServicePort,
    pub cluster: ClusterId,
    /// The older port it collided with, and its cluster.
    pub winner: ServicePort,
    pub winner_cluster: ClusterId,
}

/// The merged ports of one service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MergedPorts {
    pub merged: Vec<MergedPort>,
    pub dropped: Vec<Dropped>,
}

/// Shows a port as `"name" 80/TCP` (plus the appProtocol when set).
pub fn show(p: &ServicePort) -> String {
    let mut s = format!(
        "\"{}\" {}/{}",
        p.name_or_empty(),
        p.port,
        p.protocol_or_tcp()
    );
    if let Some(a) = &p.app_protocol {
        s.push_str(&format!(" appProtocol {a}"));
    }
    s
}

/// The merged ports' positions by name and by (protocol, number).
type MergedIndex<'a> = (HashMap<&'a str, usize>, HashMap<(&'a str, i32), usize>);

/// Merges the ports of `exports` (oldest first).
pub(crate) fn merge(exports: &[&Export<'_>]) -> MergedPorts {
    let mut out = MergedPorts::default();
    // The cluster each merged port came from, for the messages.
    let mut origin: Vec<&ClusterId> = Vec::new();
    // The merged ports by name and by (protocol, number) when there are many (a Service may
    // have thousands): a scan of the merged ones for each port would be quadratic.
    let many = exports.iter().any(|e| e.ports.len() > 16);
    let mut index: Option<MergedIndex<'_>> = many.then(Default::default);
    for e in exports {
        for p in &e.ports {
            let (name, number) = (p.name_or_empty(), (p.protocol_or_tcp(), p.port));
            let (by_name, by_number) = match &index {
                Some((names, numbers)) => (names.get(name).copied(), numbers.get(&number).copied()),
                None => (
                    out.merged
                        .iter()
                        .position(|m| m.port.name_or_empty() == name),
                    out.merged
                        .iter()
                        .position(|m| (m.port.protocol_or_tcp(), m.port.port) == number),
                ),
            };
            match by_name.or(by_number) {
                Some(i) if key_ref(&out.merged[i].port) == key_ref(p) => {}
                Some(i) => out.dropped.push(Dropped {
                    port: p.clone(),
                    cluster: e.cluster.clone(),
                    winner: out.merged[i].port.clone(),
                    winner_cluster: origin[i].clone(),
                }),
                None => {
                    // The first merged port of a name (or number) is the one a scan finds.
                    if let Some((names, numbers)) = &mut index {
                        let at = out.merged.len();
                        names.entry(name).or_insert(at);
                        numbers.entry(number).or_insert(at);
                    }
                    out.merged.push(MergedPort {
                        port: p.clone(),
                        clusters: Vec::new(),
                    });
                    origin.push(e.cluster);
                }
            }
        }
    }
    // Each export's ports by (name, protocol, number), when there are many.
    let l4: Option<Vec<HashSet<L4Key<'_>>>> = many.then(|| {
        exports
            .iter()
            .map(|e| e.ports.iter().map(l4_key).collect())
            .collect()
    });
    for m in &mut out.merged {
        let key = l4_key(&m.port);
        let mut clusters: Vec<ClusterId> = exports
            .iter()
            .enumerate()
            .filter(|(i, e)| match &l4 {
                Some(sets) => sets[*i].contains(&key),
                None => e.ports.iter().any(|p| l4_key(p) == key),
            })
            .map(|(_, e)| e.cluster.clone())
            .collect();
        clusters.sort();
        clusters.dedup();
        m.clusters = clusters;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{Port, cluster};
    use crate::merge::tests::bare_export;

    fn port(spec: &str) -> ServicePort {
        // name:port/PROTO[/app]
        let (name, rest) = spec.split_once(':').expect("name:");
        let mut parts = rest.split('/');
        let port = parts.next().and_then(|p| p.parse().ok()).expect("port");
        let mut p = Port::new(name, parts.next().unwrap_or("TCP"), port);
        if let Some(app) = parts.next() {
            p = p.app_protocol(app);
        }
        p.into()
    }

    fn run(inputs: &[&[&str]]) -> (Merged, usize) {
        let ids: Vec<ClusterId> = (1..=inputs.len())
            .map(|i| cluster(&format!("c{i}")))
            .collect();
        let exports: Vec<Export<'_>> = inputs
            .iter()
            .zip(&ids)
            .map(|(ports, id)| bare_export(id, ports.iter().map(|p| port(p)).collect(), vec![]))
            .collect();
        let refs: Vec<&Export<'_>> = exports.iter().collect();
        let m = merge(&refs);
        (
            m.merged
                .iter()
                .map(|m| {
                    let mut s = format!(
                        "{}:{}/{}",
                        m.port.name_or_empty(),
                        m.port.port,
                        m.port.protocol_or_tcp()
                    );
                    if let Some(a) = &m.port.app_protocol {
                        s.push_str(&format!("/{a}"));
                    }
                    (s, m.clusters.iter().map(|c| c.to_string()).collect())
                })
                .collect(),
            m.dropped.len(),
        )
    }

    fn p(s: &str, clusters: &[&str]) -> (String, Vec<String>) {
        (
            s.to_owned(),
            clusters.iter().map(|c| c.to_string()).collect(),
        )
    }

    type Merged = Vec<(String, Vec<String>)>;

    #[test]
    fn table() {
        // (exports oldest first, merged ports with their clusters, number dropped)
        let cases: Vec<(&[&[&str]], Merged, usize)> = vec![
            // identical
            (
                &[&["http:80/TCP"], &["http:80/TCP"]],
                vec![p("http:80/TCP", &["c1", "c2"])],
                0,
            ),
            // conformance #8: union
            (
                &[
                    &["tcp:42/TCP", "udp:42/UDP"],
                    &["tcp:42/TCP", "stcp:142/SCTP"],
                ],
                vec![
                    p("tcp:42/TCP", &["c1", "c2"]),
                    p("udp:42/UDP", &["c1"]),
                    p("stcp:142/SCTP", &["c2"]),
                ],
                0,
            ),
            // conformance #9 / cilium conflict-duplicated-port-name: same name, other number
            (
                &[&["tcp:42/TCP", "udp:42/UDP"], &["tcp:43/TCP"]],
                vec![p("tcp:42/TCP", &["c1"]), p("udp:42/UDP", &["c1"])],
                1,
            ),
            // cilium conflict-port-name: same number, other name → oldest name
            (
                &[&[":4242/TCP"], &["remote:4242/TCP"]],
                vec![p(":4242/TCP", &["c1"])],
                1,
            ),
            // cilium conflict-port-appprotocol: kept, and c2 still declares it at L4
            (
                &[&["x:4242/TCP"], &["x:4242/TCP/something-else"]],
                vec![p("x:4242/TCP", &["c1", "c2"])],
                1,
            ),
            // conformance #21: different names and numbers
            (
                &[&["tcp:42/TCP"], &["tcp2:4242/TCP"]],
                vec![p("tcp:42/TCP", &["c1"]), p("tcp2:4242/TCP", &["c2"])],
                0,
            ),
            // unnamed ports: the empty name is a name
            (
                &[&[":80/TCP"], &[":8080/TCP"]],
                vec![p(":80/TCP", &["c1"])],
                1,
            ),
            // same number, other protocol: both kept
            (
                &[&["dns:53/UDP"], &["dns-tcp:53/TCP"]],
                vec![p("dns:53/UDP", &["c1"]), p("dns-tcp:53/TCP", &["c2"])],
                0,
            ),
        ];
        for (input, want, dropped) in cases {
            let (got, d) = run(input);
            assert_eq!(got, want, "{input:?}");
            assert_eq!(d, dropped, "{input:?}");
        }
    }
}
