//! Prometheus metrics (text format 0.0.4, served at `/metrics` by [`super::server`]).
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `mcs_frontend_translations_total` | counter | namespace, name, port_name, ip, port, protocol | connects/datagrams sent to a backend (from the map counters) |
//! | `mcs_frontend_rejects_total` | counter | same | connects refused (undeclared port, no backend) |
//! | `mcs_frontend_affinity_hits_total` | counter | same | session-affinity hits |
//! | `mcs_map_entries` / `mcs_map_capacity` | gauge | map | entries in use and `max_entries` of each pinned map |
//! | `mcs_map_sync_duration_seconds` | histogram | | one sync of the node's maps |
//! | `mcs_map_sync_failures_total` | counter | | services a sync could not write (e.g. a full map) |
//! | `mcs_reconcile_duration_seconds` | histogram | | one controller pass (merge, compare, writes) |
//! | `mcs_watch_restarts_total` | counter | cluster, resource | watch errors after which the watcher backed off and resumed or re-listed |
//! | `mcs_conflicts` | gauge | reason | local ServiceExports whose `Conflict` is True, per reason |
//! | `mcs_writes_total` / `mcs_write_errors_total` | counter | kind, op | API writes of the controller (`apply`, `apply_status`, `delete`) |
//! | `mcs_events_total` | counter | reason | Kubernetes Events emitted |
//! | `mcs_leader` | gauge | | 1 while this agent holds the controller lease |
//! | `mcs_member_reachable` | gauge | cluster | 1 while the member's API server answers |
//! | `mcs_refused_addresses` | gauge | kind, reason | addresses in the node's inputs it refuses to program (`kind`: clusterset_ip or backend; docs/security.md) |
//! | `mcs_member_withdrawn` | gauge | cluster | 1 while the member's endpoints are withdrawn (unreachable past the grace period) |
//!
//! The frontend and map metrics are read from the pinned maps at scrape time, so they are right
//! even right after an agent restart.

use std::{path::PathBuf, time::Duration};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::bpf::{inspect, kernel::KernelMaps, maps::MapKind};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    pub cluster: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: String,
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `clusterset_ip` or `backend`.
    pub kind: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

/// The agent's metrics. Cheap to update from any task; share it in an `Arc`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub map_sync_duration: Histogram,
    pub map_sync_failures: Counter,
    pub reconcile_duration: Histogram,
    pub watch_restarts: Family<WatchLabels, Counter>,
    pub conflicts: Family<ReasonLabels, Gauge>,
    pub writes: Family<WriteLabels, Counter>,
    pub write_errors: Family<WriteLabels, Counter>,
    pub events: Family<ReasonLabels, Counter>,
    pub leader: Gauge,
    pub member_reachable: Family<ClusterLabels, Gauge>,
    pub member_withdrawn: Family<ClusterLabels, Gauge>,
    pub refused_addresses: Family<RefusedLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Metrics {
    /// The metrics; with `pin_dir`, the frontend counters and map fill of the dataplane pinned
    /// there are read on every scrape.
    pub fn new(pin_dir: Option<PathBuf>) -> Self {
        let mut registry = Registry::default();
        let seconds = || Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let m = Metrics {
            map_sync_duration: seconds(),
            map_sync_failures: Counter::default(),
            reconcile_duration: seconds(),
            watch_restarts: Family::default(),
            conflicts: Family::default(),
            writes: Family::default(),
            write_errors: Family::default(),
            events: Family::default(),
            leader: Gauge::default(),
            member_reachable: Family::default(),
            member_withdrawn: Family::default(),
            refused_addresses: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "mcs_map_sync_duration_seconds",
            "Duration of one sync of the node's eBPF maps",
            m.map_sync_duration.clone(),
        );
        registry.register(
            "mcs_map_sync_failures",
            "Services a map sync could not write",
            m.map_sync_failures.clone(),
        );
        registry.register(
            "mcs_reconcile_duration_seconds",
            "Duration of one controller pass: merge, compare, writes",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "mcs_watch_restarts",
            "Watch errors after which the watcher backed off and resumed or re-listed",
            m.watch_restarts.clone(),
        );
        registry.register(
            "mcs_conflicts",
            "Local ServiceExports whose Conflict condition is True, per reason",
            m.conflicts.clone(),
        );
        registry.register(
            "mcs_writes",
            "API writes of the controller",
            m.writes.clone(),
        );
        registry.register(
            "mcs_write_errors",
            "Failed API writes of the controller",
            m.write_errors.clone(),
        );
        registry.register("mcs_events", "Kubernetes Events emitted", m.events.clone());
        registry.register(
            "mcs_leader",
            "1 while this agent holds the controller lease",
            m.leader.clone(),
        );
        registry.register(
            "mcs_member_reachable",
            "1 while the member cluster's API server answers",
            m.member_reachable.clone(),
        );
        registry.register(
            "mcs_member_withdrawn",
            "1 while the member's endpoints are withdrawn (unreachable past the grace period)",
            m.member_withdrawn.clone(),
        );
        registry.register(
            "mcs_refused_addresses",
            "Addresses in the node's inputs that it refuses to program, by kind and reason",
            m.refused_addresses.clone(),
        );
        if let Some(pin_dir) = pin_dir {
            registry.register_collector(Box::new(MapCollector { pin_dir }));
        }
        Metrics { registry, ..m }
    }

    /// Records one map sync.
    pub fn observe_map_sync(&self, elapsed: Duration, failed: usize) {
        self.map_sync_duration.observe(elapsed.as_secs_f64());
        self.map_sync_failures.inc_by(failed as u64);
    }

    /// Counts one controller write.
    pub fn write(&self, kind: &str, op: &str, ok: bool) {
        let labels = WriteLabels {
            kind: kind.to_owned(),
            op: op.to_owned(),
        };
        if ok {
            self.writes.get_or_create(&labels).inc();
        } else {
            self.write_errors.get_or_create(&labels).inc();
        }
    }

    /// Total successful writes so far, of every kind.
    pub fn writes_total(&self) -> u64 {
        let mut total = 0;
        for kind in ["ServiceImport", "EndpointSlice", "ServiceExport"] {
            for op in ["apply", "apply_status", "delete"] {
                total += self
                    .writes
                    .get(&WriteLabels {
                        kind: kind.into(),
                        op: op.into(),
                    })
                    .map_or(0, |c| c.get());
            }
        }
        total
    }

    /// Counts a watch error of `resource` in `cluster`.
    pub fn watch_restart(&self, cluster: &str, resource: &str) {
        self.watch_restarts
            .get_or_create(&WatchLabels {
                cluster: cluster.to_owned(),
                resource: resource.to_owned(),
            })
            .inc();
    }

    /// Sets the refused-address gauges to the node's current counts (others disappear).
    pub fn set_refused(
        &self,
        counts: &std::collections::BTreeMap<
            (
                dataplane_core::policy::AddressUse,
                dataplane_core::policy::Refusal,
            ),
            usize,
        >,
    ) {
        self.refused_addresses.clear();
        for ((address_use, reason), n) in counts {
            self.refused_addresses
                .get_or_create(&RefusedLabels {
                    kind: address_use.label().to_owned(),
                    reason: reason.label().to_owned(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the conflict gauges from (reason, count) pairs; reasons not given drop to 0.
    pub fn set_conflicts(&self, counts: &std::collections::BTreeMap<String, i64>) {
        for r in dataplane_core::merge::conditions::ConflictReason::ALL {
            let n = counts.get(r.as_str()).copied().unwrap_or(0);
            self.conflicts
                .get_or_create(&ReasonLabels {
                    reason: r.as_str().to_owned(),
                })
                .set(n);
        }
        for (reason, n) in counts {
            self.conflicts
                .get_or_create(&ReasonLabels {
                    reason: reason.clone(),
                })
                .set(*n);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        {
            tracing::warn!(error = %e, "encoding the metrics failed");
        }
        out
    }
}

/// Reads the pinned maps on every scrape.
#[derive(Debug)]
struct MapCollector {
    pin_dir: PathBuf,
}

const MAPS: [MapKind; 7] = MapKind::ALL;

impl Collector for MapCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // No dataplane (yet): no map metrics; the rest of the scrape still works.
        let Ok(maps) = KernelMaps::open_pinned(&self.pin_dir.join("maps")) else {
            return Ok(());
        };
        let Ok(contents) = maps.read_all() else {
            return Ok(());
        };
        let rows = inspect::rows(&contents);
        let labels: Vec<[(&str, String); 6]> = rows
            .iter()
            .map(|r| {
                [
                    ("namespace", r.namespace.clone()),
                    ("name", r.name.clone()),
                    ("port_name", r.port_name.clone()),
                    ("ip", r.ip.clone()),
                    ("port", r.port.to_string()),
                    ("protocol", r.protocol.clone()),
                ]
            })
            .collect();
        type Pick = fn(&inspect::FrontendRow) -> u64;
        let counters: [(&str, &str, Pick); 3] = [
            (
                "mcs_frontend_translations",
                "Connects and datagrams translated to a backend, per frontend",
                |r| r.translations,
            ),
            (
                "mcs_frontend_rejects",
                "Connects refused: undeclared port or no backend, per frontend",
                |r| r.rejects,
            ),
            (
                "mcs_frontend_affinity_hits",
                "Session-affinity hits, per frontend",
                |r| r.affinity_hits,
            ),
        ];
        for (name, help, pick) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (row, labels) in rows.iter().zip(&labels) {
                ConstCounter::new(pick(row)).encode(family.encode_family(labels)?)?;
            }
        }
        let capacities = maps.capacities();
        let mut entries = encoder.encode_descriptor(
            "mcs_map_entries",
            "Entries in use in each pinned map",
            None,
            MetricType::Gauge,
        )?;
        for kind in MAPS {
            let labels = [("map", kind.map_name())];
            ConstGauge::new(contents.len(kind) as i64).encode(entries.encode_family(&labels)?)?;
        }
        let mut capacity = encoder.encode_descriptor(
            "mcs_map_capacity",
            "max_entries of each pinned map",
            None,
            MetricType::Gauge,
        )?;
        for kind in MAPS {
            let labels = [("map", kind.map_name())];
            ConstGauge::new(i64::from(capacities.of(kind)))
                .encode(capacity.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_exposition_has_the_metrics() {
        let m = Metrics::new(None);
        m.write("ServiceImport", "apply", true);
        m.write("ServiceImport", "apply", true);
        m.write("EndpointSlice", "delete", false);
        m.watch_restart("west", "services");
        m.observe_map_sync(Duration::from_millis(3), 1);
        m.set_conflicts(&[("PortConflict".to_owned(), 2)].into_iter().collect());
        let text = m.encode();
        for line in [
            "mcs_writes_total{kind=\"ServiceImport\",op=\"apply\"} 2",
            "mcs_write_errors_total{kind=\"EndpointSlice\",op=\"delete\"} 1",
            "mcs_watch_restarts_total{cluster=\"west\",resource=\"services\"} 1",
            "mcs_map_sync_failures_total 1",
            "mcs_map_sync_duration_seconds_count 1",
            "mcs_conflicts{reason=\"PortConflict\"} 2",
            "mcs_conflicts{reason=\"TypeConflict\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing in:\n{text}"
            );
        }
        assert_eq!(m.writes_total(), 2);
    }
}
