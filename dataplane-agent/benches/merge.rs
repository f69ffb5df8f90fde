//! The full merge plus the lb table for 10,000 services x 5 clusters x 10 endpoints (500,000
//! endpoints), as one importing cluster computes it. Goal: under 100 ms.
//!
//! `AYA_BUILD_SKIP=1 cargo bench -p dataplane-agent --bench merge`

use criterion::{Criterion, criterion_group, criterion_main};
use dataplane_core::{
    fixtures::synthetic::{self, Shape},
    lb,
    merge::{self, ClusterSetConfig},
};

/// The agent binary's allocator (see `src/main.rs`), so the bench measures what runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SHAPE: Shape = Shape::CONTROL_PLANE;

fn bench(c: &mut Criterion) {
    let snapshots = synthetic::member_snapshots(SHAPE);
    let config = ClusterSetConfig::default();
    let importing = synthetic::cluster_id(0);
    let mut group = c.benchmark_group("merge");
    group.sample_size(10);
    // Freeing half a million endpoints is left out of the timings (iter_with_large_drop): it
    // is the allocator's cost, not the merge's, and a daemon pays it between merges.
    group.bench_function("merge_and_lb_10k_services_5_clusters_10_endpoints", |b| {
        b.iter_with_large_drop(|| {
            let plan = merge::merge(&snapshots, &config, &importing, &[]);
            let table = lb::build_records(&plan.service_imports, &plan.endpoint_slices);
            assert_eq!(table.frontends.len(), SHAPE.services * SHAPE.ports);
            (plan, table)
        })
    });
    group.bench_function("merge_only", |b| {
        b.iter_with_large_drop(|| merge::merge(&snapshots, &config, &importing, &[]))
    });
    let plan = merge::merge(&snapshots, &config, &importing, &[]);
    group.bench_function("lb_only", |b| {
        b.iter_with_large_drop(|| lb::build_records(&plan.service_imports, &plan.endpoint_slices))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
