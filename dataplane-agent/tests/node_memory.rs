//! Where the node role's memory goes: the heap bytes each of its stores keeps once the maps are
//! synced, counted by this test binary's own counting allocator. The node's inputs arrive one
//! object at a time (as a watch delivers them), are converted into compact records and filed in
//! the input index; the lb state builds each service's part of the table from them and hands
//! it to the map writer, which keeps a digest of it in its mirror. No store holds a copy of
//! the backends: they are in the inputs (and in the maps).
//!
//! `NODE_MEMORY_SERVICES=10000 cargo test --release -p dataplane-agent --test node_memory -- --nocapture`
//! measures the scale (10,000 services x 5 clusters x 10 endpoints x 2 ports).

use std::collections::BTreeSet;

use dataplane_agent::bpf::{
    desired::DesiredService,
    maps::Capacities,
    sync::{MapSync, Scope},
};
use dataplane_core::{
    fixtures::{
        endpoint, import, imported_slice,
        synthetic::{self, Shape},
    },
    lb::{
        LbState,
        inputs::{Change, InputIndex, import_input, slice_input},
    },
    model::{Interner, IpFamily, LABEL_MANAGED_BY, MANAGED_BY},
};

mod counting;

use counting::{NullMaps, live};

/// The heap bytes of each of the node's stores at `shape`.
struct Measured {
    inputs: usize,
    lb: usize,
    mirror: usize,
    endpoints: usize,
}

fn measure(shape: Shape) -> Measured {
    let names = Interner::new();
    let started = live();
    let mut index = InputIndex::default();
    let mut dirty = BTreeSet::new();
    // One object at a time, converted on arrival, as a watch delivers them.
    let mut imports = Vec::with_capacity(shape.services);
    let mut slices = Vec::with_capacity(shape.services * shape.clusters);
    for s in 0..shape.services {
        let name = synthetic::service_name(s);
        let si = import(synthetic::NAMESPACE, &name)
            .ips([synthetic::vip(s).to_string()])
            .families(&[IpFamily::IPv4])
            .ports(
                synthetic::PORTS[..shape.ports]
                    .iter()
                    .map(|&(port, _, port_name)| (port_name, "TCP", i32::from(port))),
            )
            .build();
        imports.push(import_input(&si, &names));
        for c in 0..shape.clusters {
            let cluster = synthetic::cluster_id(c);
            let slice = imported_slice(
                synthetic::NAMESPACE,
                &format!("{name}-{cluster}-ipv4"),
                &name,
                cluster.as_str(),
            )
            .label(LABEL_MANAGED_BY, MANAGED_BY)
            .ports(
                synthetic::PORTS[..shape.ports]
                    .iter()
                    .map(|&(_, target, port_name)| (port_name, "TCP", i32::from(target))),
            )
            .endpoints(
                (0..shape.endpoints)
                    .map(|e| endpoint(&synthetic::pod_ip(c, s * shape.endpoints + e)).ready()),
            )
            .build();
            slices.push(slice_input(&slice, &names));
        }
    }
    index.apply(Change::Imports(imports), &mut dirty);
    index.apply(Change::Slices(slices), &mut dirty);
    assert!(index.is_ready());
    let inputs = live() - started;

    // As the node does: the lb state keeps no frontends, and each service's part goes to the
    // map writer as it is built, which keeps a digest of it.
    let before_sync = live();
    let mut lb = LbState::default();
    let caps = Capacities {
        frontends: (shape.services * 4).max(1024) as u32,
        slots: (shape.services * shape.ports * shape.clusters * shape.endpoints).max(4096) as u32,
        clusters: 1024,
    };
    let mut sync = MapSync::new(caps);
    let parts = lb.update_parts(index.services(), |s| index.inputs(s));
    assert_eq!(parts.services().len(), shape.services);
    let desired = parts.map(|(service, part)| DesiredService::from_part(service, part));
    let report = sync.sync(Scope::All, desired, &mut NullMaps);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(
        sync.frontend_count(),
        shape.services * (shape.ports + 1),
        "every service port and every VIP's wildcard is written"
    );
    drop(report);
    assert!(
        lb.table().frontends.is_empty(),
        "the node keeps no frontends"
    );
    // Each store is what dropping it frees. A copy is not the same size: it leaves out a
    // Vec's spare room, and a copy of an index map reserves entries up to its hash table's
    // capacity (57,344 for the mirror's 30,000).
    let left_by_sync = live() - before_sync;
    let lb_bytes = freed_by(lb);
    let mirror = freed_by(sync);
    assert_eq!(
        lb_bytes + mirror,
        left_by_sync,
        "the sync left nothing but the lb state and the mirror"
    );

    let m = Measured {
        inputs,
        lb: lb_bytes,
        mirror,
        endpoints: shape.total_endpoints(),
    };
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let per = |b: usize| b as f64 / m.endpoints as f64;
    println!(
        "node stores, {shape}: inputs {:.1} MiB ({:.1} B/endpoint), lb state {:.1} MiB ({:.1} B/endpoint), mirror {:.1} MiB ({:.1} B/endpoint), total {:.1} MiB ({:.1} B/endpoint)",
        mib(m.inputs),
        per(m.inputs),
        mib(m.lb),
        per(m.lb),
        mib(m.mirror),
        per(m.mirror),
        mib(m.inputs + m.lb + m.mirror),
        per(m.inputs + m.lb + m.mirror),
    );
    drop(index);
    m
}

/// The heap bytes that dropping `store` frees.
fn freed_by<T>(store: T) -> usize {
    let before = live();
    drop(store);
    before - live()
}

#[test]
fn the_node_keeps_no_copy_of_the_backends() {
    let services: usize = std::env::var("NODE_MEMORY_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let m = measure(Shape {
        services,
        ..Shape::CONTROL_PLANE
    });
    assert!(m.inputs > 0 && m.lb > 0 && m.mirror > 0);
    // A copy of the backends would cost at least 40 bytes per endpoint and port (cluster,
    // address, port); what the lb state keeps per service (VIPs, listed IPs) is far less.
    let per_endpoint = |b: usize| b as f64 / m.endpoints as f64;
    assert!(
        per_endpoint(m.lb) < 16.0,
        "the lb state keeps {:.1} B per endpoint: a copy of the backends?",
        per_endpoint(m.lb)
    );
    assert!(
        per_endpoint(m.mirror) < 32.0,
        "the mirror keeps {:.1} B per endpoint: more than a record per frontend?",
        per_endpoint(m.mirror)
    );
}
