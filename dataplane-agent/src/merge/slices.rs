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

use std::collections::{BTreeMap, BTreeSet};

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
pub struct NameAllocator {
    used: BTreeSet<(String, String)>,
}

impl NameAllocator {
    fn claim(&mut self, namespace: &str, candidate: String, salt: &str) -> String {
        let hashed = |base: &str, salt: &str| {
            let suffix = format!("-{:08x}", fnv1a(salt.as_bytes()) as u32);
            let mut end = base.len().min(MAX_NAME - suffix.len());
            while !base.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}{suffix}", &base[..end])
        };
        let mut name = if candidate.len() > MAX_NAME {
            hashed(&candidate, salt)
        } else {
            candidate.clone()
        };
        let mut n = 0u32;
        while !self.used.insert((namespace.to_owned(), name.clone())) {
            // A second try is a name collision; more are hash collisions on top of it.
            n += 1;
            let salt = if n == 1 {
                salt.to_owned()
            } else {
                format!("{salt}#{n}")
            };
            name = hashed(&candidate, &salt);
        }
        name
    }
}

/// The sort key of an imported endpoint: every field that is copied.
type EndpointKey = (
    Vec<String>,
    Option<String>,
    Option<String>,
    Option<bool>,
    Option<bool>,
    Option<bool>,
);

fn endpoint_key(ep: &Endpoint, family: IpFamily) -> Option<EndpointKey> {
    let addresses: Vec<String> = ep
        .addresses
        .iter()
        .filter(|a| usable_address(a, family))
        .cloned()
        .collect();
    if addresses.is_empty() {
        return None;
    }
    let c = ep.conditions.as_ref();
    Some((
        addresses,
        ep.hostname.clone(),
        ep.zone.clone(),
        c.and_then(|c| c.ready),
        c.and_then(|c| c.serving),
        c.and_then(|c| c.terminating),
    ))
}

fn endpoint_of(key: EndpointKey) -> Endpoint {
    let (addresses, hostname, zone, ready, serving, terminating) = key;
    let conditions = (ready.is_some() || serving.is_some() || terminating.is_some()).then_some(
        EndpointConditions {
            ready,
            serving,
            terminating,
        },
    );
    Endpoint {
        addresses,
        conditions,
        hostname,
        zone,
        ..Default::default()
    }
}

/// A port of an imported slice: (name, protocol, number, appProtocol), in merged-port order.
type SlicePort = (String, String, i32, Option<String>);

/// Builds the imported slices of one service.
pub fn build(
    service: &NamespacedName,
    contributing: &[&Export<'_>],
    routing: &ServiceRouting,
    names: &mut NameAllocator,
) -> Vec<EndpointSlice> {
    let mut out = Vec::new();
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
            // Endpoints grouped by the ports their slice gives them.
            let mut groups: BTreeMap<Vec<SlicePort>, Vec<EndpointKey>> = BTreeMap::new();
            for local in e
                .local_slices
                .iter()
                .filter(|s| s.address_type == family.address_type())
            {
                let ports: Vec<SlicePort> = declared
                    .iter()
                    .filter_map(|m| {
                        let name = m.port.name_or_empty();
                        let proto = m.port.protocol_or_tcp();
                        local.ports.iter().flatten().find_map(|lp| {
                            let number = lp.port.filter(|n| (1..=65535).contains(n))?;
                            (lp.name.as_deref().unwrap_or("") == name
                                && lp.protocol.as_deref().unwrap_or("TCP") == proto)
                                .then(|| {
                                    (
                                        name.to_owned(),
                                        proto.to_owned(),
                                        number,
                                        lp.app_protocol.clone(),
                                    )
                                })
                        })
                    })
                    .collect();
                if ports.is_empty() && !e.ports.is_empty() {
                    continue;
                }
                let group = groups.entry(ports).or_default();
                group.extend(
                    local
                        .endpoints
                        .iter()
                        .filter_map(|ep| endpoint_key(ep, *family)),
                );
            }
            let base = format!(
                "{}-{}-{}",
                service.name,
                e.cluster,
                family.address_type().to_ascii_lowercase()
            );
            let salt = format!("{service}/{}", e.cluster);
            let mut index = 0usize;
            for (ports, mut endpoints) in groups {
                endpoints.sort();
                endpoints.dedup();
                for chunk in endpoints.chunks(MAX_ENDPOINTS) {
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
    out
}

fn slice(
    service: &NamespacedName,
    e: &Export<'_>,
    family: IpFamily,
    name: String,
    ports: &[SlicePort],
    endpoints: &[EndpointKey],
) -> EndpointSlice {
    let labels = BTreeMap::from([
        (LABEL_SERVICE_NAME.to_owned(), service.name.clone()),
        (LABEL_SOURCE_CLUSTER.to_owned(), e.cluster.to_string()),
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
        endpoints: endpoints.iter().cloned().map(endpoint_of).collect(),
        ports: (!ports.is_empty()).then(|| {
            ports
                .iter()
                .map(|(name, protocol, port, app)| EndpointPort {
                    name: (!name.is_empty()).then(|| name.clone()),
                    protocol: Some(protocol.clone()),
                    port: Some(*port),
                    app_protocol: app.clone(),
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
        let a = n.claim("ns", "web-a-b-ipv4".into(), "ns/web/a-b");
        let b = n.claim("ns", "web-a-b-ipv4".into(), "ns/web-a/b");
        assert_eq!(a, "web-a-b-ipv4");
        assert_ne!(a, b);
        assert!(b.starts_with("web-a-b-ipv4-"));
        // another namespace may reuse the name
        assert_eq!(n.claim("other", "web-a-b-ipv4".into(), "x"), "web-a-b-ipv4");
        let long = n.claim("ns", "x".repeat(400), "salt");
        assert!(long.len() <= MAX_NAME);
        let again = n.claim("ns", "x".repeat(400), "salt");
        assert!(again.len() <= MAX_NAME && again != long);
    }
}
