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
//! `terminating`, `hostname` and `zone`; they are sorted and deduplicated. An endpoint whose
//! address the [`AddressPolicy`] refuses (loopback, link-local, ...: see [`crate::policy`]) is
//! left out, and reported as a [`RefusedEndpoint`]; the rest of its slice is imported. A
//! cluster's single local slice of a family, the common case, is imported without copying its
//! endpoints when none is refused.
//!
//! Names: `<service>-<cluster>-<family>` (`ipv4`/`ipv6`), then `-2`, `-3`… when split. A name
//! already used in the namespace (two services whose names run into each other's cluster ids)
//! gets `-<8 hex digits of FNV-1a>` of the service and cluster; names are capped at 253
//! characters the same way.

use std::{borrow::Cow, collections::HashMap, sync::Arc};

use super::MergedPort;
use super::exports::Export;
use super::ips::fnv1a;
use crate::model::{
    ClusterId, Interner, IpFamily, NamespacedName,
    member::{LocalSlice, LocalSlicePort},
    name::Name,
    records::{Endpoint, EndpointExtra, Endpoints, ImportedSlice, PortProtocol, SlicePort},
};
use crate::policy::{AddressPolicy, RefusedEndpoint};

/// Most endpoints in one imported slice (the EndpointSlice controller's default).
pub const MAX_ENDPOINTS: usize = 100;
/// Longest object name (DNS subdomain).
pub const MAX_NAME: usize = 253;

/// `candidate`, or, when it is longer than [`MAX_NAME`], its start with a hash of `salt()`.
pub(crate) fn bounded<'c>(candidate: &'c str, salt: &dyn Fn() -> String) -> Cow<'c, str> {
    if candidate.len() > MAX_NAME {
        Cow::Owned(hashed(candidate, &salt()))
    } else {
        Cow::Borrowed(candidate)
    }
}

/// The `n`th other name for `candidate` when it is taken: hashed with `salt()` (and `n`, after
/// the first: a second try is a name collision; more are hash collisions on top of it).
pub(crate) fn renamed(candidate: &str, salt: &dyn Fn() -> String, n: u32) -> String {
    let salt = if n == 1 {
        salt()
    } else {
        format!("{}#{n}", salt())
    };
    hashed(candidate, &salt)
}

/// `base` cut to leave room for `-<8 hex digits of FNV-1a of salt>`, and that suffix.
fn hashed(base: &str, salt: &str) -> String {
    let suffix = format!("-{:08x}", fnv1a(salt.as_bytes()) as u32);
    let mut end = base.len().min(MAX_NAME - suffix.len());
    while !base.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &base[..end])
}

/// The salt of a slice's hashed name: its service and cluster.
pub(crate) fn salt(service: &NamespacedName, cluster: &ClusterId) -> String {
    format!("{service}/{cluster}")
}

/// Builds the imported slices of `service`, appended to `out`: for each contributing cluster
/// (by id) and each of the import's `families` its Service supports (in family order), the
/// endpoints of its local slices with the merged `ports` it declares. Each is named with its
/// candidate name, which the caller claims in the namespace (names are handed out in service
/// order, so services can be built in any order and named afterwards); their port lists and
/// port names are shared through `port_lists`; the endpoints `policy` refuses are left out and
/// appended to `refused`.
#[allow(clippy::too_many_arguments)] // the service's merge facts and the build's scratch state
pub(crate) fn build(
    contributing: &[&Export<'_>],
    service: &NamespacedName,
    ports: &[MergedPort],
    families: &[IpFamily],
    policy: &AddressPolicy,
    port_lists: &Interner,
    out: &mut Vec<ImportedSlice>,
    refused: &mut Vec<RefusedEndpoint>,
) {
    let mut families = families.to_vec();
    families.sort_unstable();
    families.dedup();
    // A declared port's name is the local slice's own (already shared by its source); the
    // unnamed port's is this one.
    let unnamed = port_lists.intern("");
    let mut sorted: Vec<&&Export<'_>> = contributing.iter().collect();
    sorted.sort_by_key(|e| e.cluster);
    for e in sorted {
        let declared: Vec<&MergedPort> = ports
            .iter()
            .filter(|m| m.clusters.contains(e.cluster))
            .collect();
        for family in families.iter().filter(|f| e.families.contains(f)) {
            // The local slices grouped by the ports they give their endpoints: nearly always
            // one group, so a list, sorted by ports before use.
            let mut groups: Vec<(Vec<SlicePort>, Vec<Arc<Endpoints>>)> = Vec::new();
            for local in e
                .local_slices
                .iter()
                .filter(|s| s.ip_family() == Some(*family))
            {
                // The slice's ports by (name, protocol) when it has many (a Service may have
                // thousands): a scan for each declared port would be quadratic.
                let by_key: Option<HashMap<(&str, &str), &LocalSlicePort>> =
                    (local.ports.len() > 16).then(|| {
                        let mut map = HashMap::with_capacity(local.ports.len());
                        for lp in local.ports.iter() {
                            map.entry(port_key(lp)).or_insert(lp);
                        }
                        map
                    });
                let ports: Vec<SlicePort> = declared
                    .iter()
                    .filter_map(|m| {
                        let wanted = (m.port.name_or_empty(), m.port.protocol_or_tcp());
                        let lp = match &by_key {
                            Some(map) => map.get(&wanted).copied(),
                            None => local.ports.iter().find(|lp| port_key(lp) == wanted),
                        }?;
                        Some(SlicePort {
                            name: lp.name.clone().unwrap_or_else(|| unnamed.clone()),
                            protocol: PortProtocol::parse(Some(wanted.1))
                                .unwrap_or(PortProtocol::Tcp),
                            port: lp.port,
                            app_protocol: lp.app_protocol.clone(),
                        })
                    })
                    .collect();
                if ports.is_empty() && !e.ports.is_empty() {
                    continue;
                }
                let endpoints = allowed(local, e.cluster, policy, refused);
                match groups.iter_mut().find(|(p, _)| *p == ports) {
                    Some((_, group)) => group.push(endpoints),
                    None => groups.push((ports, vec![endpoints])),
                }
            }
            let suffix = match family {
                IpFamily::IPv4 => "ipv4",
                IpFamily::IPv6 => "ipv6",
            };
            // `<service>-<cluster>-<family>`, without the formatting machinery (once per slice).
            let mut base = String::with_capacity(service.name.len() + e.cluster.as_str().len() + 6);
            for part in [&*service.name, "-", e.cluster.as_str(), "-", suffix] {
                base.push_str(part);
            }
            let mut index = 0usize;
            groups.sort_by(|a, b| a.0.cmp(&b.0));
            for (ports, locals) in groups {
                let ports = port_lists.port_list(ports);
                for endpoints in chunks(&locals) {
                    index += 1;
                    let name = if index == 1 {
                        Name::from(base.as_str())
                    } else {
                        Name::from(format!("{base}-{index}"))
                    };
                    out.push(ImportedSlice {
                        name,
                        service: service.clone(),
                        cluster: e.cluster.clone(),
                        family: *family,
                        ports: ports.clone(),
                        endpoints,
                    });
                }
            }
        }
    }
}

/// A local slice port's (name, protocol), as a merged port's are compared with it.
fn port_key(lp: &LocalSlicePort) -> (&str, &str) {
    (
        lp.name.as_deref().unwrap_or(""),
        lp.protocol.as_deref().unwrap_or("TCP"),
    )
}

/// The endpoints of `local` that `policy` allows for `cluster`, the others appended to
/// `refused`: the slice's own list when none is refused.
fn allowed(
    local: &LocalSlice,
    cluster: &ClusterId,
    policy: &AddressPolicy,
    refused: &mut Vec<RefusedEndpoint>,
) -> Arc<Endpoints> {
    let before = refused.len();
    for ep in local.endpoints.list() {
        if let Err(why) = policy.check_backend(cluster, ep.addr) {
            refused.push(RefusedEndpoint {
                cluster: cluster.clone(),
                slice: local.id.clone(),
                addr: ep.addr,
                why,
            });
        }
    }
    if refused.len() == before {
        return Arc::clone(&local.endpoints);
    }
    Arc::new(Endpoints::new(
        local
            .endpoints
            .iter()
            .filter(|e| policy.check_backend(cluster, e.endpoint.addr).is_ok())
            .map(|e| (e.endpoint, e.extra.cloned())),
    ))
}

/// The endpoints of a group of local slices, sorted and deduplicated, in chunks of at most
/// [`MAX_ENDPOINTS`]. A group of one slice of at most that many endpoints (the common case)
/// hands its endpoints on as they are: they are sorted and deduplicated already.
fn chunks(locals: &[Arc<Endpoints>]) -> Vec<Arc<Endpoints>> {
    if let [one] = locals
        && one.len() <= MAX_ENDPOINTS
    {
        return if one.is_empty() {
            Vec::new()
        } else {
            vec![Arc::clone(one)]
        };
    }
    let all = Endpoints::sorted(
        locals
            .iter()
            .flat_map(|l| l.iter().map(|e| (e.endpoint, e.extra.cloned()))),
    );
    let all: Vec<(Endpoint, Option<EndpointExtra>)> =
        all.iter().map(|e| (e.endpoint, e.extra.cloned())).collect();
    all.chunks(MAX_ENDPOINTS)
        .map(|chunk| Arc::new(Endpoints::new(chunk.iter().cloned())))
        .collect()
}
