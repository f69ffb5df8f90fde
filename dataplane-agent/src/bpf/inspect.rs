//! `inspect`: the live table read back from the pinned maps, with service and cluster names.

use std::{fmt::Write as _, path::Path};

use serde::Serialize;

use super::{
    desired::{FeAddr, read_back},
    kernel::KernelMaps,
    loader::{LoadError, PROGRAMS},
    maps::MapContents,
};

#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    pub pin_dir: String,
    pub maps: Vec<MapSummary>,
    pub links: Vec<LinkSummary>,
    pub frontends: Vec<FrontendRow>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MapSummary {
    pub name: String,
    pub id: u32,
    pub pin: String,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LinkSummary {
    pub program: String,
    pub pin: String,
    pub link_id: u32,
    pub program_id: u32,
}

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FrontendRow {
    pub namespace: String,
    pub name: String,
    pub port_name: String,
    pub ip: String,
    /// 0 for the wildcard entry that refuses undeclared ports.
    pub port: u16,
    /// `TCP`, `UDP`, or `*` for the wildcard.
    pub protocol: String,
    pub id: u32,
    pub affinity_timeout_seconds: Option<u32>,
    /// Active slots of the frontend. `backends` is shorter only when the maps changed while
    /// they were being read.
    pub count: u16,
    pub backends: Vec<BackendRow>,
    pub translations: u64,
    pub affinity_hits: u64,
    pub rejects: u64,
    /// The `clusterset.local` names of the service and port (served with `--dns-listen`).
    pub dns_names: Vec<String>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct BackendRow {
    pub cluster: String,
    pub ip: String,
    pub port: u16,
}

/// Builds the rows from map contents (frontends sorted by address, backends in slot order).
pub fn rows(contents: &MapContents) -> Vec<FrontendRow> {
    // The slot walk and the name lookups are the map sync's own reader.
    let decoded = read_back(contents);
    let mut rows = Vec::new();
    for (key, fe) in contents.frontends() {
        let Some(addr) = FeAddr::from_key(&key) else {
            continue;
        };
        let Some((service, d)) = decoded.get(&addr) else {
            continue;
        };
        let (port, protocol) = addr.port_and_protocol();
        let counters = contents.counters.get(&fe.id).copied().unwrap_or_default();
        rows.push((
            addr,
            FrontendRow {
                namespace: service.namespace.to_string(),
                name: service.name.to_string(),
                port_name: d.port_name.clone(),
                ip: addr.ip().to_string(),
                port,
                dns_names: dataplane_core::model::dns::service_port_names(
                    &service.namespace,
                    &service.name,
                    &d.port_name,
                    &protocol,
                ),
                protocol,
                id: fe.id,
                affinity_timeout_seconds: (fe.flags & dataplane_ebpf::FRONTEND_F_AFFINITY != 0)
                    .then_some(fe.affinity_timeout_s),
                count: fe.count,
                backends: d
                    .backends
                    .iter()
                    .map(|b| BackendRow {
                        cluster: b.cluster.to_string(),
                        ip: b.ip.to_string(),
                        port: b.port,
                    })
                    .collect(),
                translations: counters.translations,
                affinity_hits: counters.affinity_hits,
                rejects: counters.rejects,
            },
        ));
    }
    rows.sort_by_key(|(addr, _)| *addr);
    rows.into_iter().map(|(_, row)| row).collect()
}

/// Reads the pinned maps and links under `pin_dir`.
pub fn inspect(pin_dir: &Path) -> Result<Inspection, LoadError> {
    let maps_dir = pin_dir.join("maps");
    if !maps_dir.exists() {
        return Err(LoadError::NotInstalled(pin_dir.to_owned()));
    }
    let maps = KernelMaps::open_pinned(&maps_dir)?;
    let contents = maps.read_all()?;
    let links = links(pin_dir);
    Ok(Inspection {
        pin_dir: pin_dir.display().to_string(),
        maps: maps
            .ids
            .iter()
            .map(|(name, id)| MapSummary {
                name: (*name).to_owned(),
                id: *id,
                pin: maps_dir.join(name).display().to_string(),
            })
            .collect(),
        links,
        frontends: rows(&contents),
    })
}

/// The pinned links under `pin_dir` (every cgroup's) and the programs they run. Cheap: it
/// reads no map.
pub fn links(pin_dir: &Path) -> Vec<LinkSummary> {
    let mut links = Vec::new();
    for dir in std::fs::read_dir(pin_dir.join("links"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for name in PROGRAMS {
            let pin = dir.path().join(name);
            let Ok(link) = aya::programs::links::PinnedLink::from_pin(&pin) else {
                continue;
            };
            let fd: aya::programs::links::FdLink = link.into();
            let (link_id, program_id) = fd
                .info()
                .map(|i| (i.id(), i.program_id()))
                .unwrap_or_default();
            links.push(LinkSummary {
                program: name.to_owned(),
                pin: pin.display().to_string(),
                link_id,
                program_id,
            });
        }
    }
    links
}

/// `IP:PORT/PROTO`, `[IPv6]:PORT/PROTO`, or `IP:*` for the per-VIP entry.
fn frontend_text(f: &FrontendRow) -> String {
    let port = if f.protocol == "*" {
        "*".to_owned()
    } else {
        format!("{}/{}", f.port, f.protocol)
    };
    if f.ip.contains(':') {
        format!("[{}]:{port}", f.ip)
    } else {
        format!("{}:{port}", f.ip)
    }
}

/// A human-readable table.
pub fn render_text(i: &Inspection) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "pin dir {}", i.pin_dir);
    let _ = writeln!(
        out,
        "maps: {}",
        i.maps
            .iter()
            .map(|m| format!("{}(id {})", m.name, m.id))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(
        out,
        "links: {}",
        if i.links.is_empty() {
            "none".to_owned()
        } else {
            i.links
                .iter()
                .map(|l| format!("{}(prog {})", l.program, l.program_id))
                .collect::<Vec<_>>()
                .join(" ")
        }
    );
    let _ = writeln!(
        out,
        "{:<28} {:<30} {:>8} {:>8} {:>8}  BACKENDS",
        "FRONTEND", "SERVICE/PORT", "XLATED", "AFFINITY", "REJECTED"
    );
    for f in &i.frontends {
        let frontend = frontend_text(f);
        let service = if f.protocol == "*" {
            format!("{}/{} (other ports refused)", f.namespace, f.name)
        } else {
            format!("{}/{}:{}", f.namespace, f.name, f.port_name)
        };
        let backends = if f.protocol == "*" {
            "-".to_owned()
        } else if f.backends.is_empty() {
            "none (refused)".to_owned()
        } else {
            f.backends
                .iter()
                .map(|b| {
                    if b.ip.contains(':') {
                        format!("{}:[{}]:{}", b.cluster, b.ip, b.port)
                    } else {
                        format!("{}:{}:{}", b.cluster, b.ip, b.port)
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            out,
            "{frontend:<28} {service:<30} {:>8} {:>8} {:>8}  {backends}",
            f.translations, f.affinity_hits, f.rejects
        );
    }
    // The names clients resolve (served by a node agent with --dns-listen).
    let _ = writeln!(out, "\n{:<28} DNS NAMES", "FRONTEND");
    for f in i.frontends.iter().filter(|f| f.protocol != "*") {
        let _ = writeln!(out, "{:<28} {}", frontend_text(f), f.dns_names.join(" "));
    }
    out
}
