//! Backends for a ClusterSet directory: every endpoint address of every cluster's local
//! EndpointSlices gets an echo server, in that cluster's namespace, on every slice port.
//! Used by the standalone test and by `mcs-demo`.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
};

use anyhow::{Context as _, bail};
use dataplane_agent::source::clusterset_dir;

use crate::netns::Topology;

/// The cluster ids of a ClusterSet directory, sorted (the order a topology must use so that
/// the i-th cluster owns `10.99.i.0/24` and `fd00:99:i::/64`).
pub fn cluster_ids(dir: &Path) -> anyhow::Result<Vec<String>> {
    let read = clusterset_dir::read(dir).with_context(|| format!("reading {}", dir.display()))?;
    Ok(read
        .snapshots
        .iter()
        .map(|s| s.cluster.to_string())
        .collect())
}

/// Starts one echo server per endpoint address, answering `<cluster>/<address>`.
pub fn start_backends(topo: &mut Topology, dir: &Path) -> anyhow::Result<usize> {
    let read = clusterset_dir::read(dir).with_context(|| format!("reading {}", dir.display()))?;
    let mut started = 0;
    for snapshot in &read.snapshots {
        let cluster = snapshot.cluster.to_string();
        let mut listens: BTreeMap<IpAddr, BTreeSet<String>> = BTreeMap::new();
        for slice in &snapshot.endpoint_slices {
            for ep in slice.endpoints.iter() {
                for ip in ep.addresses() {
                    let entry = listens.entry(ip).or_default();
                    for port in slice.ports.iter() {
                        let proto = port.protocol.as_deref().unwrap_or("TCP").to_lowercase();
                        if proto == "tcp" || proto == "udp" {
                            entry.insert(format!("{proto}:{}", port.port));
                        }
                    }
                }
            }
        }
        for (ip, ports) in listens {
            if ports.is_empty() {
                continue;
            }
            let index = topo.cluster(&cluster).index;
            let in_subnet = match ip {
                IpAddr::V4(v4) => v4.octets()[..3] == [10, 99, index],
                IpAddr::V6(v6) => v6.segments()[..3] == [0xfd00, 0x99, index as u16],
            };
            if !in_subnet {
                bail!(
                    "{cluster}: endpoint {ip} is outside the demo subnets of cluster #{index} (10.99.{index}.0/24, fd00:99:{index}::/64)"
                );
            }
            topo.add_address(&cluster, ip)?;
            let specs: Vec<String> = ports
                .iter()
                .map(|p| {
                    let (proto, port) = p.split_once(':').unwrap_or(("tcp", p));
                    match ip {
                        IpAddr::V4(_) => format!("{proto}:{ip}:{port}"),
                        IpAddr::V6(_) => format!("{proto}:[{ip}]:{port}"),
                    }
                })
                .collect();
            topo.start_echo(&cluster, &format!("{cluster}/{ip}"), &specs)?;
            started += 1;
        }
    }
    Ok(started)
}
