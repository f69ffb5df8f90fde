//! Imported EndpointSlices: what the node role routes from (via [`crate::lb::build`]) and what
//! DNS answers headless queries from.
//!
//! For each contributing cluster C and family F of the import that C's Service supports, the
//! endpoints of C's local slices of address type F are imported, at most [`MAX_ENDPOINTS`] per
//! slice. A slice carries only the merged ports that C declares identically (name, protocol,
//! port); each keeps the merged port's name and protocol, with C's local slice port number
//! (the resolved targetPort). Local slices with different port numbers (a named targetPort that
//! resolves differently per pod) are imported into different slices, so a port number is never
//! applied to the wrong endpoint. When C declares ports but none of them survives the merge,
//! its endpoints are not imported (they would serve nothing); a Service without ports (headless)
//! still gets slices, for DNS.
//!
//! Endpoints keep their addresses (those of the slice's family only), `ready`/`serving`/
//! `terminating`, `hostname` and `zone`; they are sorted and deduplicated.
//!
//! Names: `<service>-<cluster>-<family>` (`ipv4`/`ipv6`), then `-2`, `-3`… when split. A name
//! already used in the namespace (two services whose names run into each other's cluster ids)
//! gets `-<8 hex digits of FNV-1a>` of the service and cluster; names are capped at 253
//! characters the same way.

use std::borrow::Cow;
use std::collections::BTreeMap;

use foldhash::{HashMap, HashSet};

use super::ServiceRouting;
use super::exports::{Export, usable_address};
use super::ips::fnv1a;
use crate::model::{
    EndpointSlice, IpFamily, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER,
    MANAGED_BY, NamespacedName, ObjectMeta,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

/// Most endpoints in one imported slice (the EndpointSlice controller's default).
pub const MAX_ENDPOINTS: usize = 100;
/// Longest object name (DNS subdomain).
pub const MAX_NAME: usize = 253;

/// Hands out unique slice names per namespace, in the order it is asked (the merge asks in
/// sorted order, so the result is deterministic).
#[derive(Debug, Default)]
pub(crate) struct NameAllocator {
    /// Names taken, per namespace.
    used: HashMap<String, HashSet<String>>,
}

impl NameAllocator {
    /// `salt` gives the text hashed into the name when it is needed (a collision or a long
    /// name); it is rarely called.
    fn claim(&mut self, namespace: &str, candidate: String, salt: &dyn Fn() -> String) -> String {
        let hashed = |base: &str, salt: &str| {
            let suffix = format!("-{:08x}", fnv1a(salt.as_bytes()) as u32);
            let mut end = base.len().min(MAX_NAME - suffix.len());
            while !base.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}{suffix}", &base[..end])
        };
        let mut name = if candidate.len() > MAX_NAME {
            hashed(&candidate, &salt())
        } else {
            candidate.clone()
        };
        let used = match self.used.get_mut(namespace) {
            Some(u) => u,
            None => self.used.entry(namespace.to_owned()).or_default(),
        };
        let mut n = 0u32;
        while used.contains(&name) {
            // A second try is a name collision; more are hash collisions on top of it.
            n += 1;
            let salt = if n == 1 {
                salt()
            } else {
                format!("{}#{n}", salt())
            };
            name = hashed(&candidate, &salt);
        }
        used.insert(name.clone());
        name
    }
}

/// What is imported of an endpoint, borrowed from the local slice: the addresses of the
/// slice's family, the conditions, hostname and zone. Ordered by every field, so sorting and
/// deduplicating make the result independent of the local slices' order. Kept small on
/// purpose: the owned `Endpoint` (hundreds of bytes) is built once, in its final place.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Imported<'a> {
    /// Borrowed as a whole from clean slices, the common case: no allocation per endpoint.
    addresses: Cow<'a, [String]>,
    hostname: Option<&'a str>,
    zone: Option<&'a str>,
    conditions: Option<(Option<bool>, Option<bool>, Option<bool>)>,
}

impl<'a> Imported<'a> {
    /// `None` when no address of `family` is left. `clean` slices were checked when indexed
    /// and need no parsing here.
    fn of(ep: &'a Endpoint, family: IpFamily, clean: bool) -> Option<Self> {
        let addresses: Cow<'a, [String]> = if clean {
            Cow::Borrowed(&ep.addresses)
        } else {
            Cow::Owned(
                ep.addresses
                    .iter()
                    .filter(|a| usable_address(a, family))
                    .cloned()
                    .collect(),
            )
        };
        if addresses.is_empty() {
            return None;
        }
        Some(Self {
            addresses,
            hostname: ep.hostname.as_deref(),
            zone: ep.zone.as_deref(),
            conditions: ep
                .conditions
                .as_ref()
                .map(|c| (c.ready, c.serving, c.terminating))
                .filter(|c| *c != (None, None, None)),
        })
    }

    fn to_endpoint(&self) -> Endpoint {
        Endpoint {
            addresses: self.addresses.to_vec(),
            conditions: self
                .conditions
                .map(|(ready, serving, terminating)| EndpointConditions {
                    ready,
                    serving,
                    terminating,
                }),
            hostname: self.hostname.map(str::to_owned),
            zone: self.zone.map(str::to_owned),
            ..Default::default()
        }
    }
}

/// A port of an imported slice: (name, protocol, number, appProtocol), in merged-port order.
type SlicePort<'a> = (&'a str, &'a str, i32, Option<&'a str>);

/// Builds the imported slices of one service, appended to `out` (the plan's list: a slice is
/// over 400 bytes, so it is built in its final place rather than moved there).
pub(crate) fn build(
    service: &NamespacedName,
    contributing: &[&Export<'_>],
    routing: &ServiceRouting,
    names: &mut NameAllocator,
    out: &mut Vec<EndpointSlice>,
) {
    let mut sorted: Vec<&&Export<'_>> = contributing.iter().collect();
    sorted.sort_by_key(|e| e.cluster);
    for e in sorted {
        let declared: Vec<&super::MergedPort> = routing
            .ports
            .iter()
            .filter(|m| m.clusters.contains(e.cluster))
            .collect();
        for (family, clusters) in &routing.families {
            if !clusters.contains(e.cluster) {
                continue;
            }
            // Endpoints grouped by the ports their slice gives them: nearly always one group,
            // so a list, sorted by ports before use.
            let mut groups: Vec<(Vec<SlicePort<'_>>, Vec<Imported<'_>>)> = Vec::new();
            for local in e
                .local_slices
                .iter()
                .filter(|s| s.slice.address_type == family.address_type())
            {
                let ports: Vec<SlicePort<'_>> = declared
                    .iter()
                    .filter_map(|m| {
                        let name = m.port.name_or_empty();
                        let proto = m.port.protocol_or_tcp();
                        local.slice.ports.iter().flatten().find_map(|lp| {
                            let number = lp.port.filter(|n| (1..=65535).contains(n))?;
                            (lp.name.as_deref().unwrap_or("") == name
                                && lp.protocol.as_deref().unwrap_or("TCP") == proto)
                                .then_some((name, proto, number, lp.app_protocol.as_deref()))
                        })
                    })
                    .collect();
                if ports.is_empty() && !e.ports.is_empty() {
                    continue;
                }
                let group = match groups.iter().position(|(p, _)| *p == ports) {
                    Some(i) => &mut groups[i].1,
                    None => {
                        groups.push((ports, Vec::new()));
                        let last = groups.len() - 1;
                        &mut groups[last].1
                    }
                };
                group.reserve(local.slice.endpoints.len());
                group.extend(
                    local
                        .slice
                        .endpoints
                        .iter()
                        .filter_map(|ep| Imported::of(ep, *family, local.clean)),
                );
            }
            let suffix = match family {
                IpFamily::IPv4 => "ipv4",
                IpFamily::IPv6 => "ipv6",
            };
            // `<service>-<cluster>-<family>`, without the formatting machinery (once per slice).
            let mut base = String::with_capacity(service.name.len() + e.cluster.as_str().len() + 6);
            for part in [service.name.as_str(), "-", e.cluster.as_str(), "-", suffix] {
                base.push_str(part);
            }
            let salt = || format!("{service}/{}", e.cluster);
            let mut index = 0usize;
            groups.sort_by(|a, b| a.0.cmp(&b.0));
            for (ports, mut endpoints) in groups {
                // Equal endpoints are identical, so an unstable sort gives the same list.
                endpoints.sort_unstable();
                endpoints.dedup();
                for chunk in endpoints.chunks(MAX_ENDPOINTS) {
                    let chunk: Vec<Endpoint> = chunk.iter().map(Imported::to_endpoint).collect();
                    index += 1;
                    let candidate = if index == 1 {
                        base.clone()
                    } else {
                        format!("{base}-{index}")
                    };
                    let name = names.claim(&service.namespace, candidate, &salt);
                    out.push(slice(service, e, *family, name, &ports, chunk));
                }
            }
        }
    }
}

fn slice(
    service: &NamespacedName,
    e: &Export<'_>,
    family: IpFamily,
    name: String,
    ports: &[SlicePort<'_>],
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    let labels = BTreeMap::from([
        (LABEL_SERVICE_NAME.to_owned(), service.name.clone()),
        (
            LABEL_SOURCE_CLUSTER.to_owned(),
            e.cluster.as_str().to_owned(),
        ),
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
    ]);
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(service.namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        address_type: family.address_type().to_owned(),
        endpoints,
        ports: (!ports.is_empty()).then(|| {
            ports
                .iter()
                .map(|(name, protocol, port, app)| EndpointPort {
                    name: (!name.is_empty()).then(|| (*name).to_owned()),
                    protocol: Some((*protocol).to_owned()),
                    port: Some(*port),
                    app_protocol: app.map(str::to_owned),
                })
                .collect()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_bounded() {
        let mut n = NameAllocator::default();
        let a = n.claim("ns", "web-a-b-ipv4".into(), &|| "ns/web/a-b".into());
        let b = n.claim("ns", "web-a-b-ipv4".into(), &|| "ns/web-a/b".into());
        assert_eq!(a, "web-a-b-ipv4");
        assert_ne!(a, b);
        assert!(b.starts_with("web-a-b-ipv4-"));
        // another namespace may reuse the name
        assert_eq!(
            n.claim("other", "web-a-b-ipv4".into(), &|| "x".into()),
            "web-a-b-ipv4"
        );
        let long = n.claim("ns", "x".repeat(400), &|| "salt".into());
        assert!(long.len() <= MAX_NAME);
        let again = n.claim("ns", "x".repeat(400), &|| "salt".into());
        assert!(again.len() <= MAX_NAME && again != long);
    }
}
