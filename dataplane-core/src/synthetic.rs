//! Synthetic ClusterSets of a given size, for the benchmarks (`benches/`, `cargo xtask bench`).
//! Every cluster exports every service, with identical ports and families, so nothing
//! conflicts and every endpoint is routed: the merge and the maps do their full work.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::{
    merge::ClusterSnapshot,
    model::{
        ClusterId, EndpointSlice, LABEL_K8S_SERVICE_NAME, ObjectMeta, Service, ServiceExport,
        ServiceExportSpec,
    },
};

/// Namespace of every synthetic object.
pub const NAMESPACE: &str = "bench";

/// (service port, endpoint port, name) of the synthetic services' ports, in order.
pub const PORTS: [(u16, u16, &str); 2] = [(80, 8080, "http"), (9090, 9090, "metrics")];

/// How big a synthetic ClusterSet is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    pub services: usize,
    pub clusters: usize,
    /// Endpoints per service and cluster.
    pub endpoints: usize,
    /// How many of [`PORTS`] each service has (1 or 2).
    pub ports: usize,
}

impl Shape {
    /// The control-plane size: 10,000 services x 5 clusters x 10 endpoints, 2 ports.
    pub const CONTROL_PLANE: Shape = Shape {
        services: 10_000,
        clusters: 5,
        endpoints: 10,
        ports: 2,
    };

    pub fn total_endpoints(&self) -> usize {
        self.services * self.clusters * self.endpoints
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} services x {} clusters x {} endpoints, {} port(s)",
            self.services, self.clusters, self.endpoints, self.ports
        )
    }
}

/// The name of service `s`.
pub fn service_name(s: usize) -> String {
    format!("svc-{s}")
}

/// The cluster id of cluster `c`.
pub fn cluster_id(c: usize) -> ClusterId {
    ClusterId::new(format!("cluster-{c}")).expect("cluster-N is a valid cluster id")
}

/// A unique pod IP for cluster `c` and endpoint index `i` (`i` < 2^24).
pub fn pod_ip(c: usize, i: usize) -> String {
    format!(
        "{}.{}.{}.{}",
        10 + c,
        (i >> 16) & 255,
        (i >> 8) & 255,
        i & 255
    )
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(NAMESPACE.to_owned()),
        ..Default::default()
    }
}

/// Every member's Services, ServiceExports and EndpointSlices. Cluster `c`'s exports are
/// created `c` seconds after cluster 0's, so precedence is by cluster index.
pub fn member_snapshots(shape: Shape) -> Vec<ClusterSnapshot> {
    let names = crate::model::Interner::new();
    (0..shape.clusters)
        .map(|c| {
            let objects = member_objects(shape, c);
            ClusterSnapshot::from_k8s(
                cluster_id(c),
                &objects.services,
                &objects.service_exports,
                &objects.endpoint_slices,
                &names,
            )
        })
        .collect()
}

/// One member's API objects.
pub struct MemberObjects {
    /// Its Services.
    pub services: Vec<Service>,
    /// Its ServiceExports.
    pub service_exports: Vec<ServiceExport>,
    /// Its local EndpointSlices.
    pub endpoint_slices: Vec<EndpointSlice>,
}

/// Cluster `c`'s API objects.
pub fn member_objects(shape: Shape, c: usize) -> MemberObjects {
    let ports = &PORTS[..shape.ports.clamp(1, PORTS.len())];
    let mut snap = MemberObjects {
        services: Vec::with_capacity(shape.services),
        service_exports: Vec::with_capacity(shape.services),
        endpoint_slices: Vec::with_capacity(shape.services),
    };
    for s in 0..shape.services {
        let name = service_name(s);
        snap.services.push(Service {
            metadata: meta(&name),
            spec: Some(ServiceSpec {
                ports: Some(
                    ports
                        .iter()
                        .map(|&(port, _, port_name)| ServicePort {
                            name: Some(port_name.into()),
                            port: port.into(),
                            protocol: Some("TCP".into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ip_families: Some(vec!["IPv4".into()]),
                ..Default::default()
            }),
            status: None,
        });
        let mut export = ServiceExport::new(&name, ServiceExportSpec::default());
        export.metadata.namespace = Some(NAMESPACE.into());
        export.metadata.creation_timestamp =
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + c as i64)
                .ok()
                .map(Time);
        snap.service_exports.push(export);
        let mut slice_meta = meta(&format!("{name}-abcde"));
        slice_meta.labels = Some(BTreeMap::from([(
            LABEL_K8S_SERVICE_NAME.to_owned(),
            name.clone(),
        )]));
        snap.endpoint_slices.push(EndpointSlice {
            metadata: slice_meta,
            address_type: "IPv4".into(),
            ports: Some(
                ports
                    .iter()
                    .map(|&(_, target, port_name)| EndpointPort {
                        name: Some(port_name.into()),
                        port: Some(target.into()),
                        protocol: Some("TCP".into()),
                        app_protocol: None,
                    })
                    .collect(),
            ),
            endpoints: (0..shape.endpoints)
                .map(|e| ready_endpoint(pod_ip(c, s * shape.endpoints + e)))
                .collect(),
        });
    }
    snap
}

/// A ready, serving endpoint at `ip`.
pub fn ready_endpoint(ip: String) -> Endpoint {
    Endpoint {
        addresses: vec![ip],
        conditions: Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{lb, merge};

    #[test]
    fn every_endpoint_of_every_cluster_is_routed() {
        let shape = Shape {
            services: 30,
            clusters: 3,
            endpoints: 4,
            ports: 2,
        };
        let snaps = member_snapshots(shape);
        let plan = merge::merge(
            &snaps,
            &merge::ClusterSetConfig::default(),
            &cluster_id(0),
            &[],
        );
        assert_eq!(plan.service_imports.len(), 30);
        let table = lb::build_records(&plan.service_imports, &plan.endpoint_slices);
        assert_eq!(table.frontends.len(), 30 * 2);
        assert!(table.frontends.values().all(|f| f.backends.len() == 3 * 4));
        let one_port = member_snapshots(Shape { ports: 1, ..shape });
        let plan = merge::merge(
            &one_port,
            &merge::ClusterSetConfig::default(),
            &cluster_id(0),
            &[],
        );
        let table = lb::build_records(&plan.service_imports, &plan.endpoint_slices);
        assert_eq!(table.frontends.len(), 30);
    }
}
