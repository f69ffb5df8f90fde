//! The node role's work for one imported EndpointSlice change while 10,000 services are
//! installed (10,000 ServiceImports with two ports, 5 clusters x 1 imported slice x 10
//! endpoints each: 50,000 slices, 500,000 endpoints), from the changed object arriving to the
//! map writes (in-memory maps, `MemMaps`). Goal (issue 5): p99 well under 5 ms.
//!
//! - `before_*`: what the node did per event until the incremental node role: copy both
//!   stores into a sorted snapshot (`Store::state()`, sort, deep clone), compare it with the
//!   last one, build the whole lb table and sync every service against the mirror.
//! - `after_*`: the incremental node role: the event is filed in the input index, the lb table
//!   of the one service it touches is rebuilt and spliced in, and only that service is synced
//!   (`Node::apply` does exactly these three calls).
//!
//! The change: one endpoint of one cluster's slice of one service is another pod (a new IP),
//! and back, so every iteration is one change of both frontends of that service.
//!
//! `AYA_BUILD_SKIP=1 cargo bench -p dataplane-agent --bench node_event`

use std::{collections::BTreeSet, sync::Arc};

use criterion::{Criterion, criterion_group, criterion_main};
use dataplane_agent::bpf::{
    maps::{Capacities, MemMaps},
    sync::MapSync,
};
use dataplane_core::{
    fixtures::{
        endpoint, import, imported_slice,
        synthetic::{self, Shape},
    },
    lb::{
        self, LbState,
        inputs::{Change, InputIndex, slice_input},
    },
    model::{EndpointSlice, Interner, IpFamily, LABEL_MANAGED_BY, MANAGED_BY, ServiceImport},
};
use kube::ResourceExt as _;

/// The agent binary's allocator (see `src/main.rs`), so the bench measures what runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SHAPE: Shape = Shape::CONTROL_PLANE;

/// Service `s`'s ServiceImport, as the controller writes it.
fn service_import(s: usize) -> ServiceImport {
    import(synthetic::NAMESPACE, &synthetic::service_name(s))
        .resource_version(&s.to_string())
        .ips([synthetic::vip(s).to_string()])
        .families(&[IpFamily::IPv4])
        .ports(
            synthetic::PORTS
                .iter()
                .map(|&(port, _, name)| (name, "TCP", i32::from(port))),
        )
        .build()
}

/// Service `s`'s slice from cluster `c`; with `moved`, its first endpoint is another pod.
fn service_slice(s: usize, c: usize, moved: bool) -> EndpointSlice {
    let cluster = synthetic::cluster_id(c);
    imported_slice(
        synthetic::NAMESPACE,
        &format!("{}-{cluster}-ipv4", synthetic::service_name(s)),
        &synthetic::service_name(s),
        cluster.as_str(),
    )
    .label(LABEL_MANAGED_BY, MANAGED_BY)
    .resource_version(&(100_000 + s * SHAPE.clusters + c + usize::from(moved)).to_string())
    .ports(
        synthetic::PORTS
            .iter()
            .map(|&(_, target, name)| (name, "TCP", i32::from(target))),
    )
    .endpoints((0..SHAPE.endpoints).map(|e| {
        let i = if moved && e == 0 {
            SHAPE.services * SHAPE.endpoints + 1
        } else {
            s * SHAPE.endpoints + e
        };
        endpoint(&synthetic::pod_ip(c, i)).ready()
    }))
    .build()
}

/// Room for a million backends and slots (the kernel defaults are smaller).
const CAPS: Capacities = Capacities {
    frontends: 65_536,
    slots: 2_000_000,
    clusters: 1024,
};

/// The old source's snapshot: the store's objects, sorted by namespace and name, cloned.
fn owned_sorted<K: kube::Resource + Clone>(state: &[Arc<K>]) -> Vec<K> {
    let mut all = state.to_vec();
    all.sort_by_key(|o| (o.namespace(), o.name_any()));
    all.into_iter().map(|o| (*o).clone()).collect()
}

fn bench(c: &mut Criterion) {
    let imports: Vec<Arc<ServiceImport>> = (0..SHAPE.services)
        .map(|s| Arc::new(service_import(s)))
        .collect();
    let slices: Vec<Arc<EndpointSlice>> = (0..SHAPE.services)
        .flat_map(|s| (0..SHAPE.clusters).map(move |c| Arc::new(service_slice(s, c, false))))
        .collect();
    // The changed slice, both ways; it sits at index 0 of `slices`.
    let versions = [
        Arc::new(service_slice(0, 0, false)),
        Arc::new(service_slice(0, 0, true)),
    ];

    let mut group = c.benchmark_group("node_event");
    group.sample_size(10);

    // Before: snapshot, compare, full build, full sync.
    {
        let mut sync = MapSync::new(CAPS);
        let mut maps = MemMaps::new(CAPS);
        let mut store_slices = slices.clone();
        let mut last = (owned_sorted(&imports), owned_sorted(&store_slices));
        let first = sync.sync_table(&lb::build(&last.0, &last.1), &mut maps);
        assert!(first.failed.is_empty(), "{:?}", first.failed);
        let mut flip = 0;
        group.bench_function("before_one_slice_change_10k_services", |b| {
            b.iter(|| {
                flip = 1 - flip;
                store_slices[0] = versions[flip].clone();
                let snapshot = (owned_sorted(&imports), owned_sorted(&store_slices));
                assert!(snapshot != last);
                let table = lb::build(&snapshot.0, &snapshot.1);
                let report = sync.sync_table(&table, &mut maps);
                assert_eq!(report.changed.len(), 1);
                // The old snapshot is dropped when the new one replaces it.
                last = snapshot;
                report
            })
        });
    }

    // After: file the event, rebuild and splice one service, sync it.
    group.sample_size(100);
    {
        let mut sync = MapSync::new(CAPS);
        let mut maps = MemMaps::new(CAPS);
        let mut index = InputIndex::default();
        let mut lb = LbState::default();
        let mut dirty = BTreeSet::new();
        let names = Interner::new();
        index.apply(
            Change::snapshot(
                imports.iter().map(|i| &**i),
                slices.iter().map(|s| &**s),
                &names,
            ),
            &mut dirty,
        );
        // The watch source converts each event as it arrives.
        let versions = versions.map(|v| slice_input(&v, &names));
        lb.update(&dirty, |s| index.inputs(s));
        assert_eq!(
            lb.table(),
            &lb::build(&owned_sorted(&imports), &owned_sorted(&slices))
        );
        let first = sync.sync_table(lb.table(), &mut maps);
        assert!(first.failed.is_empty(), "{:?}", first.failed);
        let mut flip = 0;
        group.bench_function("after_one_slice_change_10k_services", |b| {
            b.iter(|| {
                flip = 1 - flip;
                let mut dirty = BTreeSet::new();
                index.apply(Change::Slice(versions[flip].clone()), &mut dirty);
                let rebuilt = lb.update(&dirty, |s| index.inputs(s));
                let report = sync.sync_table_services(lb.table(), &rebuilt, &mut maps);
                assert_eq!(report.changed.len(), 1);
                report
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
