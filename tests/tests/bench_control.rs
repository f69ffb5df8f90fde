//! The control-plane benchmark's measurements work and measure what they say: real kernel
//! maps hold the synced services, every change is timed, an EndpointSlice edit in the API
//! server reaches the node agent's maps, and a member's EndpointSlice edit reaches the
//! controller's imported slice. Small sizes: this checks the bench, it does not
//! time anything (`cargo xtask bench` does).

use dataplane_core::fixtures::synthetic::Shape;
use tests::{
    bench::control::{self, ControlOptions},
    require_root,
};

#[test]
fn control_bench_measures_real_maps_and_the_agent() {
    require_root!();
    let shape = Shape {
        services: 50,
        clusters: 3,
        endpoints: 4,
        ports: 2,
    };
    // A second shape, as the full bench adds 50,000 services: more services, fewer endpoints.
    let wide = Shape {
        services: 150,
        endpoints: 1,
        ..shape
    };
    let report = control::run(&ControlOptions {
        shape,
        merge_runs: 2,
        change_services: vec![1, 20],
        change_samples: 10,
        event_changes: 20,
        rss_shapes: vec![shape, wide],
        controller_changes: 20,
    })
    .expect("control bench");

    let merge = report.merge.expect("merge timing");
    assert_eq!(merge.runs, 2);
    assert_eq!(merge.frontends, 50 * 2);
    let full = report.full_sync.expect("full sync");
    // Two ports per service plus one per-VIP wildcard entry.
    assert_eq!(full.frontends, 50 * 3);
    assert_eq!(full.backends, 50 * 2 * 3 * 4);
    assert_eq!(report.map_change.len(), 2);
    for change in &report.map_change {
        assert_eq!(change.latency.samples, 10);
        assert!(change.latency.p50_ms > 0.0);
    }
    // Edits reach the maps at both shapes, and the agent's memory is read at both.
    let shapes: Vec<Shape> = report.event_to_map.iter().map(|e| e.shape).collect();
    assert_eq!(shapes, [shape, wide]);
    for event in &report.event_to_map {
        assert_eq!(event.timeouts, 0, "every edit reached the maps");
        assert_eq!(event.latency.samples, 20);
    }
    assert_eq!(report.rss.len(), 2);
    for rss in &report.rss {
        assert!(rss.rss_mib > 1.0 && rss.peak_mib >= rss.rss_mib);
    }
    // Both file-fed agents reached every service's frontend (checked inside) and were measured.
    let modes: Vec<_> = report.files.iter().map(|f| f.mode).collect();
    assert_eq!(modes, ["node --from-dir", "run --clusterset-dir"]);
    for f in &report.files {
        assert_eq!(f.rss.shape, shape);
        assert!(
            f.rss.rss_mib > 1.0 && f.rss.peak_mib >= f.rss.rss_mib,
            "{f:?}"
        );
    }
    // The controller role wrote every import and imported slice into member 0 (checked
    // inside), and every member's slice edit reached its imported slice there.
    let controller = report.controller.expect("controller run");
    assert_eq!(
        controller.timeouts, 0,
        "every edit reached the imported slice"
    );
    assert_eq!(controller.latency.samples, 20);
    // The core alone built each change's imported slice (it fails the run otherwise).
    assert_eq!(controller.core.samples, 20);
    assert!(controller.rss_mib > 1.0 && controller.peak_mib >= controller.rss_mib);
}
