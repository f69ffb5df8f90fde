//! Why a frontend reaches the clusters it reaches: for a ClusterSet IP, port and protocol, each
//! cluster of the import is eligible or not, with the reason (ARCHITECTURE.md §4 read
//! backwards). A pure function of the same inputs as [`crate::lb::build`].

use std::{collections::BTreeMap, fmt, net::IpAddr};

use serde::Serialize;

use crate::{
    lb::{self, Protocol},
    model::{
        EndpointSlice, IpFamily, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, NamespacedName,
        ServiceImport,
    },
    policy::{AddressPolicy, Refusal},
};

/// The verdict for one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterVerdict {
    /// The id of the cluster the verdict is about.
    pub cluster: String,
    /// Whether connections to the address may reach this cluster's endpoints.
    pub eligible: bool,
    /// Why, in words: how many backends it gives, or what keeps it out.
    pub reason: String,
}

/// The explanation for one address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The address explained, as `ip:port/PROTOCOL` (`[ip]:port/PROTOCOL` for IPv6).
    pub address: String,
    /// The import owning the VIP, when there is one.
    pub service: Option<String>,
    /// What a client connecting there gets.
    pub outcome: String,
    /// One verdict per cluster the import lists or that has slices of its service, sorted by
    /// id; empty when the address is not a port of an import.
    pub clusters: Vec<ClusterVerdict>,
    /// The `clusterset.local` names of the service and port (served with `--dns-listen`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {}", self.address, self.outcome)?;
        for c in &self.clusters {
            let mark = if c.eligible {
                "eligible"
            } else {
                "not eligible"
            };
            writeln!(f, "  {:<20} {mark:<13} {}", c.cluster, c.reason)?;
        }
        if !self.dns_names.is_empty() {
            writeln!(f, "  DNS: {}", self.dns_names.join(" "))?;
        }
        Ok(())
    }
}

/// Explains `ip:port/protocol` against the imports and imported slices of a node.
///
/// ```
/// use dataplane_core::{explain::explain, lb::Protocol, model::ServiceImport};
///
/// let import: ServiceImport = serde_yaml::from_str(
///     "metadata: {name: web, namespace: demo}
/// spec: {type: ClusterSetIP, ips: [241.0.0.10], ports: [{port: 80}]}
/// status: {clusters: [{cluster: c1}]}",
/// )
/// .unwrap();
/// let e = explain(&[import], &[], "241.0.0.10".parse().unwrap(), 80, Protocol::Tcp);
/// assert_eq!(e.service.as_deref(), Some("demo/web"));
/// // c1 is listed, but no imported EndpointSlice of it is given: it has no backend here.
/// assert_eq!((e.clusters[0].cluster.as_str(), e.clusters[0].eligible), ("c1", false));
/// ```
pub fn explain(
    imports: &[ServiceImport],
    slices: &[EndpointSlice],
    ip: IpAddr,
    port: u16,
    protocol: Protocol,
) -> Explanation {
    explain_with(
        imports,
        slices,
        ip,
        port,
        protocol,
        &AddressPolicy::default(),
    )
}

/// [`explain`] on a node whose address policy is `policy` (its ClusterSet CIDRs and backend
/// rules): VIPs outside its CIDRs pass through, refused backends are named as such. An
/// IPv4-mapped IPv6 address is the IPv4 one, as the datapath looks it up.
pub fn explain_with(
    imports: &[ServiceImport],
    slices: &[EndpointSlice],
    ip: IpAddr,
    port: u16,
    protocol: Protocol,
    policy: &AddressPolicy,
) -> Explanation {
    let ip = ip.to_canonical();
    let address = lb::FrontendAddr { ip, port, protocol }.to_string();
    let table = lb::build_with(imports, slices, policy);
    let Some(owner) = table.vips.get(&ip) else {
        return Explanation {
            address,
            service: None,
            outcome: "not a ClusterSet IP on this node: traffic passes through untouched".into(),
            clusters: Vec::new(),
            dns_names: Vec::new(),
        };
    };
    let Some(si) = imports
        .iter()
        .find(|si| NamespacedName::of(&si.metadata) == *owner)
    else {
        return Explanation {
            address,
            service: Some(owner.to_string()),
            outcome: "the import owning this VIP is gone".into(),
            clusters: Vec::new(),
            dns_names: Vec::new(),
        };
    };
    let family = IpFamily::of(&ip);
    let declared = si.spec.ports.iter().find(|p| {
        u16::try_from(p.port).ok() == Some(port)
            && Protocol::parse(p.protocol.as_deref()).ok() == Some(protocol)
    });
    let frontend = table
        .frontends
        .get(&lb::FrontendAddr { ip, port, protocol });
    let Some(declared) = declared else {
        let served: Vec<String> = si
            .spec
            .ports
            .iter()
            .map(|p| format!("{}/{}", p.port, p.protocol_or_tcp()))
            .collect();
        return Explanation {
            address,
            service: Some(owner.to_string()),
            outcome: format!(
                "refused (ECONNREFUSED): {owner} serves {} only",
                served.join(", ")
            ),
            clusters: Vec::new(),
            dns_names: Vec::new(),
        };
    };
    let port_name = declared.name_or_empty().to_owned();
    let shown_name = if port_name.is_empty() {
        "the unnamed port".to_owned()
    } else {
        format!("port {port_name:?}")
    };

    // Every cluster the import lists, and every cluster with a slice of the service.
    let mut clusters: BTreeMap<String, Vec<&EndpointSlice>> = si
        .status
        .iter()
        .flat_map(|s| s.clusters.iter())
        .map(|c| (c.cluster.clone(), Vec::new()))
        .collect();
    for slice in slices {
        let labels = slice.metadata.labels.clone().unwrap_or_default();
        if labels.get(LABEL_SERVICE_NAME).map(String::as_str) != Some(&*owner.name)
            || slice.metadata.namespace.as_deref().unwrap_or("default") != &*owner.namespace
        {
            continue;
        }
        if let Some(c) = labels.get(LABEL_SOURCE_CLUSTER) {
            clusters.entry(c.clone()).or_default().push(slice);
        }
    }
    let backends_of = |cluster: &str| {
        frontend
            .map(|f| {
                f.backends
                    .iter()
                    .filter(|b| b.cluster.as_str() == cluster)
                    .count()
            })
            .unwrap_or(0)
    };
    let mut verdicts = Vec::new();
    for (cluster, own) in &clusters {
        let n = backends_of(cluster);
        let reason = if n > 0 {
            format!("{n} backend(s) on the slices' {shown_name}")
        } else if own.is_empty() {
            "no imported EndpointSlices from this cluster: it declares none of the merged ports identically, its family does not match, or it has no endpoints".to_owned()
        } else if !own.iter().any(|s| s.address_type == family.address_type()) {
            format!("does not serve {family} (no {family} EndpointSlices)")
        } else if !own.iter().any(|s| {
            s.address_type == family.address_type()
                && s.ports.iter().flatten().any(|p| {
                    p.name.as_deref().unwrap_or("") == port_name
                        && Protocol::parse(p.protocol.as_deref()).ok() == Some(protocol)
                })
        }) {
            format!(
                "does not declare {shown_name} as {port}/{protocol} (its Service's port differs or is missing)"
            )
        } else if let Some(why) = all_refused(own, family, cluster, policy) {
            format!(
                "every endpoint of its {family} EndpointSlices is refused by the address policy ({})",
                why.label()
            )
        } else {
            "no ready endpoints (terminating ones are used only when no cluster has ready ones)"
                .to_owned()
        };
        verdicts.push(ClusterVerdict {
            cluster: cluster.clone(),
            eligible: n > 0,
            reason,
        });
    }
    let outcome = match frontend {
        Some(f) if !f.backends.is_empty() => format!(
            "{owner} {shown_name}: {} backend(s), {}{}",
            f.backends.len(),
            match protocol {
                Protocol::Udp =>
                    "one per socket (a hash of its cookie), the same for every datagram",
                _ => "chosen uniformly at random per connection",
            },
            if f.affinity_timeout_s.is_some() {
                ", with ClientIP affinity"
            } else {
                ""
            }
        ),
        _ => format!("{owner} {shown_name}: no backends, refused (ECONNREFUSED)"),
    };
    Explanation {
        address,
        service: Some(owner.to_string()),
        outcome,
        clusters: verdicts,
        dns_names: crate::model::dns::service_port_names(
            &owner.namespace,
            &owner.name,
            &port_name,
            &protocol.to_string(),
        ),
    }
}

/// The refusal of the first endpoint, when the address policy refuses every endpoint of
/// `cluster`'s slices of `family` (and there is at least one).
fn all_refused(
    slices: &[&EndpointSlice],
    family: IpFamily,
    cluster: &str,
    policy: &AddressPolicy,
) -> Option<Refusal> {
    let cluster = crate::model::ClusterId::new(cluster).ok()?;
    let mut first = None;
    let addresses = slices
        .iter()
        .filter(|s| s.address_type == family.address_type())
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.iter()));
    for address in addresses {
        let ip: IpAddr = address.parse().ok()?;
        match policy.check_backend(&cluster, ip) {
            Ok(()) => return None,
            Err(why) => {
                first.get_or_insert(why);
            }
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::manifests;
    use crate::manifest::Manifest;

    const INPUT: &str = r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: web, namespace: demo}
spec:
  type: ClusterSetIP
  ips: [241.0.0.10, "fd00:241::10"]
  ipFamilies: [IPv4, IPv6]
  ports: [{name: http, protocol: TCP, port: 80}, {name: admin, protocol: TCP, port: 9000}]
status:
  clusters: [{cluster: a}, {cluster: b}, {cluster: c}, {cluster: d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-a
  namespace: demo
  labels: {multicluster.kubernetes.io/service-name: web, multicluster.kubernetes.io/source-cluster: a}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}, {name: admin, protocol: TCP, port: 9090}]
endpoints: [{addresses: [10.0.0.1]}, {addresses: [10.0.0.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-b
  namespace: demo
  labels: {multicluster.kubernetes.io/service-name: web, multicluster.kubernetes.io/source-cluster: b}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: [10.1.0.1]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-c
  namespace: demo
  labels: {multicluster.kubernetes.io/service-name: web, multicluster.kubernetes.io/source-cluster: c}
addressType: IPv6
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["fd00::1"]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-d
  namespace: demo
  labels: {multicluster.kubernetes.io/service-name: web, multicluster.kubernetes.io/source-cluster: d}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: [10.3.0.1], conditions: {ready: false}}]
"#;

    fn inputs() -> (Vec<ServiceImport>, Vec<EndpointSlice>) {
        let mut imports = Vec::new();
        let mut slices = Vec::new();
        for o in manifests(INPUT) {
            match o {
                Manifest::ServiceImport(si) => imports.push(*si),
                Manifest::EndpointSlice(s) => slices.push(*s),
                _ => {}
            }
        }
        (imports, slices)
    }

    fn verdicts(e: &Explanation) -> Vec<(&str, bool, &str)> {
        e.clusters
            .iter()
            .map(|c| (c.cluster.as_str(), c.eligible, c.reason.as_str()))
            .collect()
    }

    /// A node's policy decides: a VIP outside its CIDRs passes through, a refused backend is
    /// named as refused, an IPv4-mapped VIP is the IPv4 one, UDP is per socket.
    #[test]
    fn the_nodes_address_policy_decides() {
        let (imports, mut slices) = inputs();
        let vip: IpAddr = "241.0.0.10".parse().unwrap();
        let outside = AddressPolicy::for_cidrs(&crate::merge::ClusterSetCidrs {
            ipv4: "10.255.0.0/24".parse().unwrap(),
            ipv6: "fd12::/120".parse().unwrap(),
        });
        let e = explain_with(&imports, &slices, vip, 80, Protocol::Tcp, &outside);
        assert_eq!(e.service, None, "{e}");
        assert!(e.outcome.starts_with("not a ClusterSet IP"), "{e}");

        // b's only endpoint is on loopback: refused, and said so.
        slices[1].endpoints[0].addresses = vec!["127.0.0.1".into()];
        let e = explain_with(
            &imports,
            &slices,
            vip,
            80,
            Protocol::Tcp,
            &Default::default(),
        );
        let b = e.clusters.iter().find(|c| c.cluster == "b").unwrap();
        assert!(!b.eligible);
        assert!(
            b.reason
                .contains("refused by the address policy (loopback)"),
            "{}",
            b.reason
        );

        let mapped: IpAddr = "::ffff:241.0.0.10".parse().unwrap();
        let e = explain(&imports, &slices, mapped, 80, Protocol::Tcp);
        assert_eq!(e.address, "241.0.0.10:80/TCP");
        assert_eq!(e.service.as_deref(), Some("demo/web"));
        assert!(e.outcome.contains("at random per connection"), "{e}");
    }

    #[test]
    fn each_cluster_gets_its_reason() {
        let (imports, slices) = inputs();
        let e = explain(
            &imports,
            &slices,
            "241.0.0.10".parse().unwrap(),
            9000,
            Protocol::Tcp,
        );
        assert!(e.outcome.contains("2 backend(s)"), "{e}");
        assert_eq!(
            e.dns_names,
            [
                "web.demo.svc.clusterset.local.",
                "_admin._tcp.web.demo.svc.clusterset.local."
            ]
        );
        assert!(
            e.to_string()
                .contains("\n  DNS: web.demo.svc.clusterset.local. _admin._tcp.")
        );
        let v = verdicts(&e);
        assert_eq!(
            v[0],
            ("a", true, "2 backend(s) on the slices' port \"admin\"")
        );
        assert!(
            !v[1].1 && v[1].2.starts_with("does not declare port \"admin\""),
            "{e}"
        );
        assert!(
            !v[2].1 && v[2].2 == "does not serve IPv4 (no IPv4 EndpointSlices)",
            "{e}"
        );
        assert!(!v[3].1 && v[3].2.starts_with("does not declare"), "{e}");

        let http = explain(
            &imports,
            &slices,
            "241.0.0.10".parse().unwrap(),
            80,
            Protocol::Tcp,
        );
        let v = verdicts(&http);
        assert_eq!(
            v.iter().filter(|c| c.1).map(|c| c.0).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(v[3].2.starts_with("no ready endpoints"), "{http}");

        let v6 = explain(
            &imports,
            &slices,
            "fd00:241::10".parse().unwrap(),
            80,
            Protocol::Tcp,
        );
        assert_eq!(
            verdicts(&v6)
                .iter()
                .filter(|c| c.1)
                .map(|c| c.0)
                .collect::<Vec<_>>(),
            ["c"]
        );
    }

    #[test]
    fn undeclared_ports_and_unknown_addresses_say_what_happens() {
        let (imports, slices) = inputs();
        let udp = explain(
            &imports,
            &slices,
            "241.0.0.10".parse().unwrap(),
            80,
            Protocol::Udp,
        );
        assert_eq!(
            udp.outcome,
            "refused (ECONNREFUSED): demo/web serves 80/TCP, 9000/TCP only"
        );
        let other = explain(
            &imports,
            &slices,
            "241.0.0.99".parse().unwrap(),
            80,
            Protocol::Tcp,
        );
        assert!(other.outcome.starts_with("not a ClusterSet IP"));
        assert!(other.service.is_none());
    }
}
