//! What the map writer's mirror costs in memory: the heap bytes a `MapSync` keeps after a full
//! sync, counted by this test binary's own counting allocator. The writes go to maps that keep
//! nothing, so every byte still allocated after the sync (its report dropped) is the mirror's.
//!
//! The design keeps one record per frontend entry and nothing per backend or slot, so:
//! - the bytes stay within a bound computed from the record's size (`MapSync::ENTRY_BYTES`),
//!   the hash tables' worst-case load and the few heap parts of a record;
//! - four times the endpoints (four times the slots) add no bytes beyond a small slack.
//!
//! `MIRROR_SERVICES=10000 cargo test --release -p dataplane-agent --test mirror_size -- --nocapture`
//! measures the scale (20,000 port frontends, a million slots).

use std::mem::size_of;

use dataplane_agent::bpf::{desired::FeAddr, maps::Capacities, sync::MapSync};
use dataplane_core::{
    fixtures::{
        lb_table,
        synthetic::{self, Shape},
    },
    lb::{Backend, LbTable},
    model::NamespacedName,
};

mod counting;

use counting::{NullMaps, live};

/// The synthetic ClusterSet's lb table at this shape.
fn table(shape: Shape) -> LbTable {
    let clusters: Vec<_> = (0..shape.clusters).map(synthetic::cluster_id).collect();
    let mut t = lb_table();
    for s in 0..shape.services {
        let name = NamespacedName::new(synthetic::NAMESPACE, synthetic::service_name(s));
        t = t.service(name, synthetic::vip(s));
        for (port, target, port_name) in &synthetic::PORTS[..shape.ports] {
            let mut backends = Vec::new();
            for (c, cluster) in clusters.iter().enumerate() {
                for e in 0..shape.endpoints {
                    backends.push(Backend {
                        cluster: cluster.clone(),
                        ip: synthetic::pod_addr(c, s * shape.endpoints + e),
                        port: *target,
                    });
                }
            }
            backends.sort();
            t = t.tcp(*port, port_name, backends);
        }
    }
    t.build()
}

/// What a full sync of `shape` leaves in the mirror.
struct Measured {
    bytes: usize,
    frontends: usize,
    services: usize,
    slots: u64,
}

fn measure(shape: Shape) -> Measured {
    let t = table(shape);
    let caps = Capacities {
        frontends: (shape.services * 4).max(1024) as u32,
        slots: (shape.services * shape.ports * shape.clusters * shape.endpoints).max(4096) as u32,
        clusters: 1024,
    };
    let before = live();
    let mut sync = MapSync::new(caps);
    let report = sync.sync_table(&t, &mut NullMaps);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    drop(report);
    let bytes = live().saturating_sub(before);
    let size = sync.size();
    assert_eq!(size.services, shape.services);
    assert_eq!(
        size.frontends,
        shape.services * (shape.ports + 1),
        "the ports and a wildcard per service"
    );
    assert_eq!(
        size.slots,
        (shape.services * shape.ports * shape.clusters * shape.endpoints) as u64
    );
    assert_eq!(size.clusters, shape.clusters);
    println!(
        "mirror, {shape}: {bytes} bytes for {} frontend entries and {} slots: {:.1} bytes per entry, {:.2} per slot; {} free-space runs",
        size.frontends,
        size.slots,
        bytes as f64 / size.frontends as f64,
        bytes as f64 / size.slots as f64,
        size.free_runs
    );
    drop(sync);
    Measured {
        bytes,
        frontends: size.frontends,
        services: size.services,
        slots: size.slots,
    }
}

/// The most a hash table entry of `bytes` costs: hashbrown's control byte, and up to 8/7 x 2
/// slots per entry just after it doubled (load factor 7/8).
fn hashed(bytes: usize) -> usize {
    (bytes + 1) * 16 / 7 + 1
}

/// An allocation of `bytes`, with the allocator's rounding up to 16 bytes.
fn heap(bytes: usize) -> usize {
    bytes.div_ceil(16) * 16
}

#[test]
fn the_mirror_keeps_one_record_per_frontend_and_nothing_per_slot() {
    let services: usize = std::env::var("MIRROR_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let shape = Shape {
        services,
        ..Shape::CONTROL_PLANE
    };
    let m = measure(shape);

    // The bound, from the data structure: per frontend entry its record in a hash table, its
    // port name (an Arc<str>: two counters and the text) and its sorted cluster ids; per
    // service its entry in the by-service index (the name's Arcs are shared with the table)
    // and the vector of its entries; a fixed slack for the id pools, the free-space runs and
    // the cluster names.
    let longest_port_name = synthetic::PORTS
        .iter()
        .map(|p| p.2.len())
        .max()
        .unwrap_or(0);
    let per_entry = hashed(MapSync::ENTRY_BYTES)
        + heap(2 * size_of::<usize>() + longest_port_name)
        + heap(shape.clusters * size_of::<u16>());
    let per_service = hashed(size_of::<(NamespacedName, Vec<FeAddr>)>())
        + heap(2 * (shape.ports + 1) * size_of::<FeAddr>());
    let slack = 64 * 1024;
    let bound = m.frontends * per_entry + m.services * per_service + slack;
    assert!(
        m.bytes <= bound,
        "{} bytes ({:.2} per slot), more than the {bound} its records can take ({per_entry} per entry, {per_service} per service)",
        m.bytes,
        m.bytes as f64 / m.slots as f64
    );

    // Four times the slots, the same frontends: no more bytes.
    let wide = measure(Shape {
        endpoints: shape.endpoints * 4,
        ..shape
    });
    assert_eq!(wide.frontends, m.frontends);
    assert_eq!(wide.slots, m.slots * 4);
    assert!(
        wide.bytes <= m.bytes + slack,
        "{} bytes with four times the slots, {} before: the mirror grows with the backends",
        wide.bytes,
        m.bytes
    );
}
