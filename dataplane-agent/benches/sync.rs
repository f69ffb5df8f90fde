//! Map sync for one EndpointSlice change while 10,000 services are installed (each with two
//! ports and 5 clusters x 10 endpoints, as in the merge bench: 30,000 frontend entries, a
//! million slots), into in-memory maps (`MemMaps`). Goal: well under 1 ms for the change.
//!
//! The change: one endpoint of one cluster of one service is replaced by another pod (a new
//! IP), so both frontends of that service get a new backend set. Each iteration flips between
//! the two tables, so every iteration is exactly that one change.
//!
//! `AYA_BUILD_SKIP=1 cargo bench -p dataplane-agent --bench sync`

use criterion::{Criterion, criterion_group, criterion_main};
use dataplane_agent::bpf::{
    maps::{Capacities, MemMaps},
    sync::MapSync,
};
use dataplane_core::{
    fixtures::{
        lb_table,
        synthetic::{self, Shape},
    },
    lb::{Backend, LbTable},
    model::{ClusterId, NamespacedName},
};

/// The agent binary's allocator (see `src/main.rs`), so the bench measures what runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SHAPE: Shape = Shape::CONTROL_PLANE;

fn service(s: usize) -> NamespacedName {
    NamespacedName::new(synthetic::NAMESPACE, synthetic::service_name(s))
}

/// The table; with `changed`, service 0's first endpoint in cluster 0 is another pod.
fn table(clusters: &[ClusterId], changed: bool) -> LbTable {
    let mut t = lb_table();
    for s in 0..SHAPE.services {
        t = t.service(service(s), synthetic::vip(s));
        for (port, target, port_name) in synthetic::PORTS {
            let mut backends = Vec::with_capacity(SHAPE.clusters * SHAPE.endpoints);
            for (c, cluster) in clusters.iter().enumerate() {
                for e in 0..SHAPE.endpoints {
                    let ip = if changed && s == 0 && c == 0 && e == 0 {
                        synthetic::pod_addr(c, SHAPE.services * SHAPE.endpoints + 1)
                    } else {
                        synthetic::pod_addr(c, s * SHAPE.endpoints + e)
                    };
                    // The cluster's one id, shared by its backends.
                    backends.push(Backend {
                        cluster: cluster.clone(),
                        ip,
                        port: target,
                    });
                }
            }
            backends.sort();
            t = t.tcp(port, port_name, backends);
        }
    }
    t.build()
}

fn bench(c: &mut Criterion) {
    let clusters: Vec<ClusterId> = (0..SHAPE.clusters).map(synthetic::cluster_id).collect();
    let tables = [table(&clusters, false), table(&clusters, true)];
    let changed = std::collections::BTreeSet::from([service(0)]);
    // Room for a million backends and slots (the kernel defaults are smaller).
    let caps = Capacities {
        frontends: 65_536,
        slots: 2_000_000,
        clusters: 1024,
    };
    let mut group = c.benchmark_group("sync");

    let mut sync = MapSync::new(caps);
    let mut maps = MemMaps::new(caps);
    let first = sync.sync_table(&tables[0], &mut maps);
    assert!(first.failed.is_empty(), "{:?}", first.failed);
    let mut flip = 0;
    group.bench_function("sync_one_change_10k_services", |b| {
        b.iter(|| {
            flip = 1 - flip;
            let report = sync.sync_table(&tables[flip], &mut maps);
            assert_eq!(report.changed.len(), 1);
            report
        })
    });
    group.bench_function("sync_services_one_change_10k_services", |b| {
        b.iter(|| {
            flip = 1 - flip;
            let report = sync.sync_table_services(&tables[flip], &changed, &mut maps);
            assert_eq!(report.changed.len(), 1);
            report
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
