//! The full merge plus the lb table for 10,000 services x 5 clusters x 10 endpoints (500,000
//! endpoints), as one importing cluster computes it. Goal: under 100 ms.
//!
//! `AYA_BUILD_SKIP=1 cargo bench -p dataplane-agent --bench merge`

use std::collections::BTreeMap;

use criterion::{Criterion, criterion_group, criterion_main};
use dataplane_agent::{
    lb,
    merge::{self, ClusterSetConfig, ClusterSnapshot},
    model::{
        ClusterId, EndpointSlice, LABEL_K8S_SERVICE_NAME, ObjectMeta, Service, ServiceExport,
        ServiceExportSpec,
    },
};
use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The agent binary's allocator (see `src/main.rs`), so the bench measures what runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SERVICES: usize = 10_000;
const CLUSTERS: usize = 5;
const ENDPOINTS: usize = 10;

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some("bench".to_owned()),
        ..Default::default()
    }
}

/// A unique pod IP per cluster and endpoint index.
fn addr(c: usize, i: usize) -> String {
    format!(
        "{}.{}.{}.{}",
        10 + c,
        (i >> 16) & 255,
        (i >> 8) & 255,
        i & 255
    )
}

fn snapshot(c: usize) -> ClusterSnapshot {
    let cluster = ClusterId::new(format!("cluster-{c}")).expect("valid id");
    let mut snap = ClusterSnapshot::empty(cluster);
    for s in 0..SERVICES {
        let name = format!("svc-{s}");
        snap.services.push(Service {
            metadata: meta(&name),
            spec: Some(ServiceSpec {
                ports: Some(vec![
                    ServicePort {
                        name: Some("http".into()),
                        port: 80,
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    },
                    ServicePort {
                        name: Some("metrics".into()),
                        port: 9090,
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    },
                ]),
                ip_families: Some(vec!["IPv4".into()]),
                ..Default::default()
            }),
            status: None,
        });
        let mut se = ServiceExport::new(&name, ServiceExportSpec::default());
        se.metadata.namespace = Some("bench".into());
        se.metadata.creation_timestamp =
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + c as i64)
                .ok()
                .map(Time);
        snap.service_exports.push(se);
        let mut slice_meta = meta(&format!("{name}-abcde"));
        slice_meta.labels = Some(BTreeMap::from([(
            LABEL_K8S_SERVICE_NAME.to_owned(),
            name.clone(),
        )]));
        snap.endpoint_slices.push(EndpointSlice {
            metadata: slice_meta,
            address_type: "IPv4".into(),
            ports: Some(vec![
                EndpointPort {
                    name: Some("http".into()),
                    port: Some(8080),
                    protocol: Some("TCP".into()),
                    app_protocol: None,
                },
                EndpointPort {
                    name: Some("metrics".into()),
                    port: Some(9090),
                    protocol: Some("TCP".into()),
                    app_protocol: None,
                },
            ]),
            endpoints: (0..ENDPOINTS)
                .map(|e| Endpoint {
                    addresses: vec![addr(c, s * ENDPOINTS + e)],
                    conditions: Some(EndpointConditions {
                        ready: Some(true),
                        serving: Some(true),
                        terminating: Some(false),
                    }),
                    ..Default::default()
                })
                .collect(),
        });
    }
    snap
}

fn bench(c: &mut Criterion) {
    let snapshots: Vec<ClusterSnapshot> = (0..CLUSTERS).map(snapshot).collect();
    let config = ClusterSetConfig::default();
    let importing = ClusterId::new("cluster-0").expect("valid id");
    let mut group = c.benchmark_group("merge");
    group.sample_size(10);
    // Freeing half a million endpoints is left out of the timings (iter_with_large_drop): it
    // is the allocator's cost, not the merge's, and a daemon pays it between merges.
    group.bench_function("merge_and_lb_10k_services_5_clusters_10_endpoints", |b| {
        b.iter_with_large_drop(|| {
            let plan = merge::merge(&snapshots, &config, &importing, &[]);
            let table = lb::build(&plan.service_imports, &plan.endpoint_slices);
            assert_eq!(table.frontends.len(), SERVICES * 2);
            (plan, table)
        })
    });
    group.bench_function("merge_only", |b| {
        b.iter_with_large_drop(|| merge::merge(&snapshots, &config, &importing, &[]))
    });
    let plan = merge::merge(&snapshots, &config, &importing, &[]);
    group.bench_function("lb_only", |b| {
        b.iter_with_large_drop(|| lb::build(&plan.service_imports, &plan.endpoint_slices))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
