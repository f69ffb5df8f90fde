//! Prometheus metrics (text format 0.0.4, served at `/metrics` by [`super::server`]).
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `mcs_frontend_translations_total` | counter | namespace, name, port_name, ip, port, protocol | connects/datagrams sent to a backend (from the map counters; these three only with `--frontend-metrics`) |
//! | `mcs_frontend_rejects_total` | counter | same | connects refused (undeclared port, no backend) |
//! | `mcs_frontend_affinity_hits_total` | counter | same | session-affinity hits |
//! | `mcs_map_entries` / `mcs_map_capacity` | gauge | map | entries in use and `max_entries` of each map the agent writes |
//! | `mcs_map_sync_duration_seconds` | histogram | | one sync of the node's maps |
//! | `mcs_map_sync_failures_total` | counter | | service writes a sync could not make (e.g. a full map); a failing service counts on each retry |
//! | `mcs_reconcile_duration_seconds` | histogram | | one controller pass (merge, compare, writes) |
//! | `mcs_watch_restarts_total` | counter | cluster, resource | watch errors after which the watcher backed off and resumed or re-listed |
//! | `mcs_conflicts` | gauge | reason | local ServiceExports whose `Conflict` is True, per reason |
//! | `mcs_writes_total` / `mcs_write_errors_total` | counter | kind, op | API writes of the controller (`apply`, `apply_status`, `delete`) |
//! | `mcs_events_total` | counter | reason | Kubernetes Events emitted |
//! | `mcs_leader` | gauge | | 1 while this agent holds the controller lease |
//! | `mcs_member_reachable` | gauge | cluster | 1 while the member's API server answers |
//! | `mcs_refused_addresses` | gauge | kind, reason | addresses refused by the address policy (docs/security.md): in the node's inputs (`kind`: clusterset_ip or backend), or endpoints of members' slices the controller does not import (`member_endpoint`) |
//! | `mcs_member_withdrawn` | gauge | cluster | 1 while the member's endpoints are withdrawn (unreachable past the grace period) |
//!
//! The frontend and map metrics come from a snapshot of the pinned maps ([`MapSnapshot`]), not
//! from the maps themselves: the agent reads the maps after a map sync (at most once per
//! [`MAP_REFRESH_MIN_GAP`]) and every [`MAP_REFRESH_EVERY`] ([`Metrics::refresh_maps_forever`]),
//! so a scrape costs the size of its text and never walks a map, however many scrapers there
//! are. The snapshot is read from the pinned maps, so it is right even right after an agent
//! restart. The other metrics are the live values.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

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

use tokio::sync::Notify;

use crate::bpf::{
    convert::name_from_bytes,
    desired::FeAddr,
    kernel::KernelMaps,
    maps::{MapContents, MapKind},
};
use dataplane_core::{
    model::{Interner, NamespacedName, name::Name},
    policy::{AddressUse, Refusal},
};
use dataplane_ebpf::{Counters, FrontendName};

/// How often the map snapshot is taken when nothing changes (the frontend counters move with
/// traffic, not with syncs).
pub const MAP_REFRESH_EVERY: Duration = Duration::from_secs(10);
/// The shortest time between two map snapshots: syncs in between are taken together.
pub const MAP_REFRESH_MIN_GAP: Duration = Duration::from_secs(1);

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
    /// The snapshot of the pinned maps the frontend and map metrics are encoded from.
    maps: Option<Arc<MapSnapshot>>,
    /// Woken when the maps changed (a sync): the refresher takes a new snapshot.
    maps_changed: Notify,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(None, false)
    }
}

impl Metrics {
    /// The metrics; with `pin_dir`, the map fill of the dataplane pinned there, and with
    /// `frontend_series` its frontend counters too, from snapshots of its maps (see the module
    /// documentation).
    pub fn new(pin_dir: Option<PathBuf>, frontend_series: bool) -> Self {
        Self::with_maps(
            pin_dir.map(|pin_dir| {
                Box::new(PinnedMaps {
                    pin_dir,
                    frontend_rows: frontend_series,
                }) as _
            }),
            frontend_series,
        )
    }

    /// The metrics, with the map metrics from snapshots of `maps`, and the frontend counters
    /// with `frontend_series`.
    pub fn with_maps(maps: Option<Box<dyn MapSource>>, frontend_series: bool) -> Self {
        let maps = maps.map(|source| Arc::new(MapSnapshot::new(source)));
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
            maps: maps.clone(),
            maps_changed: Notify::new(),
        };
        registry.register(
            "mcs_map_sync_duration_seconds",
            "Duration of one sync of the node's eBPF maps",
            m.map_sync_duration.clone(),
        );
        registry.register(
            "mcs_map_sync_failures",
            "Service writes a map sync could not make (a service refused again on each retry counts again)",
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
        if let Some(snapshot) = maps {
            registry.register_collector(Box::new(MapCollector {
                snapshot,
                frontend_series,
            }));
        }
        Metrics { registry, ..m }
    }

    /// Records one map sync.
    pub fn observe_map_sync(&self, elapsed: Duration, failed: usize) {
        self.map_sync_duration.observe(elapsed.as_secs_f64());
        self.map_sync_failures.inc_by(failed as u64);
    }

    /// Says that the maps changed: the refresher takes a new snapshot soon (syncs in a burst
    /// are taken together).
    pub fn maps_changed(&self) {
        self.maps_changed.notify_one();
    }

    /// Takes a snapshot of the maps now (blocking: it reads every map). Without a map source,
    /// nothing.
    pub fn refresh_maps(&self) {
        if let Some(maps) = &self.maps {
            maps.refresh();
        }
    }

    /// Takes map snapshots until the task is dropped: now, after every [`Self::maps_changed`]
    /// and every `every`, never two within [`MAP_REFRESH_MIN_GAP`]. Without a map source it
    /// returns at once.
    pub async fn refresh_maps_forever(self: Arc<Self>, every: Duration) {
        if self.maps.is_none() {
            return;
        }
        loop {
            let me = self.clone();
            if tokio::task::spawn_blocking(move || me.refresh_maps())
                .await
                .is_err()
            {
                tracing::warn!("reading the maps for the metrics failed");
            }
            tokio::time::sleep(MAP_REFRESH_MIN_GAP).await;
            tokio::select! {
                () = self.maps_changed.notified() => {}
                () = tokio::time::sleep(every.saturating_sub(MAP_REFRESH_MIN_GAP)) => {}
            }
        }
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

    /// Sets the refused-address gauges of the kinds `uses` to `counts` (the node's or the
    /// controller's current counts); those of these kinds not counted disappear, those of
    /// other kinds stay.
    pub fn set_refused(
        &self,
        uses: &[AddressUse],
        counts: &std::collections::BTreeMap<(AddressUse, Refusal), usize>,
    ) {
        for &address_use in uses {
            for reason in Refusal::ALL {
                let labels = RefusedLabels {
                    kind: address_use.label().to_owned(),
                    reason: reason.label().to_owned(),
                };
                match counts.get(&(address_use, reason)) {
                    Some(&n) if n > 0 => {
                        self.refused_addresses
                            .get_or_create(&labels)
                            .set(i64::try_from(n).unwrap_or(i64::MAX));
                    }
                    _ => {
                        self.refused_addresses.remove(&labels);
                    }
                }
            }
        }
    }

    /// Drops the gauges that only the leading controller keeps (conflicts, member
    /// reachability and withdrawal, refused member endpoints): a replica that stops leading
    /// must not go on exporting its last term's values beside the new leader's.
    pub fn clear_controller_gauges(&self) {
        self.conflicts.clear();
        self.member_reachable.clear();
        self.member_withdrawn.clear();
        self.set_refused(
            &[AddressUse::MemberEndpoint],
            &std::collections::BTreeMap::new(),
        );
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

/// What the frontend and map metrics are read from.
pub trait MapSource: Send + Sync + std::fmt::Debug {
    /// Reads every map; `None` when there is no dataplane (yet).
    fn read(&self) -> Option<MapReading>;
}

/// A frontend's labels and counters, as scrapes encode them. The names are shared by the
/// frontends of a service and the address is kept as a number: at 30,000 frontends the
/// snapshot is 3 MB, where rows of strings were 9.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendMetric {
    /// The service.
    pub service: NamespacedName,
    /// The service port's name (empty for the unnamed port and the wildcard).
    pub port_name: Name,
    /// The map entry: a VIP, port and protocol, or the VIP's wildcard.
    pub addr: FeAddr,
    /// The frontend's counters, summed over CPUs.
    pub counters: Counters,
}

impl FrontendMetric {
    /// The labels of its series.
    fn labels(&self) -> [(&'static str, String); 6] {
        let (port, protocol) = self.addr.port_and_protocol();
        [
            ("namespace", self.service.namespace.to_string()),
            ("name", self.service.name.to_string()),
            ("port_name", self.port_name.to_string()),
            ("ip", self.addr.ip().to_string()),
            ("port", port.to_string()),
            ("protocol", protocol),
        ]
    }
}

/// A frontend's service and port name, as a reading labels it.
type FrontendLabel = (NamespacedName, Name);

/// The frontends of `contents` with their `labels` (by frontend id) and counters, sorted by
/// address.
fn frontend_metrics(
    contents: &MapContents,
    labels: &BTreeMap<u32, FrontendLabel>,
) -> Vec<FrontendMetric> {
    let mut out: Vec<FrontendMetric> = contents
        .frontends()
        .filter_map(|(key, fe)| {
            let addr = FeAddr::from_key(&key)?;
            let (service, port_name) = labels
                .get(&fe.id)
                .cloned()
                .unwrap_or_else(|| (NamespacedName::default(), Name::from("")));
            Some(FrontendMetric {
                service,
                port_name,
                addr,
                counters: contents.counters.get(&fe.id).copied().unwrap_or_default(),
            })
        })
        .collect();
    out.sort_by_key(|f| f.addr);
    out
}

/// The frontend counters and map fill, as one snapshot read them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MapReading {
    /// The frontends with their labels and counters.
    pub frontends: Vec<FrontendMetric>,
    /// (map name, entries in use, `max_entries`), one per pinned map.
    pub maps: Vec<(&'static str, i64, i64)>,
}

/// The maps pinned under `pin_dir`.
#[derive(Debug)]
struct PinnedMaps {
    pin_dir: PathBuf,
    /// Whether readings keep a row per frontend (3 MB at 30,000 frontends).
    frontend_rows: bool,
}

impl MapSource for PinnedMaps {
    fn read(&self) -> Option<MapReading> {
        // A failed reading drops the map series until the next one works: say why, as the
        // absent series alone would not.
        let maps = match KernelMaps::open_pinned(&self.pin_dir.join("maps")) {
            Ok(maps) => maps,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot open the pinned maps; map series left out");
                return None;
            }
        };
        // The names are shared by a service's frontends.
        let names = Interner::new();
        let name = |bytes: &[u8]| names.intern(&name_from_bytes(bytes));
        // Without frontend rows, neither names nor counters are read.
        let label = self.frontend_rows.then_some(|n: &FrontendName| {
            (
                NamespacedName::new(name(&n.namespace), name(&n.name)),
                name(&n.port_name),
            )
        });
        let read = match maps.read_for_metrics(label) {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot read the pinned maps; map series left out");
                return None;
            }
        };
        let capacities = maps.capacities();
        let frontends = if self.frontend_rows {
            frontend_metrics(&read.contents, &read.labels)
        } else {
            Vec::new()
        };
        let maps = MapKind::ALL
            .iter()
            .map(|&kind| {
                let used = match kind {
                    MapKind::AffinityMatch => read.affinity_matches,
                    MapKind::FrontendNames => read.names,
                    // A row per frontend id in use, whether its counters were read or not.
                    MapKind::Counters => read.contents.frontends().count(),
                    _ => read.contents.len(kind),
                };
                (kind.map_name(), used as i64, i64::from(capacities.of(kind)))
            })
            .collect();
        Some(MapReading { frontends, maps })
    }
}

/// The last reading of a [`MapSource`]: what scrapes encode.
#[derive(Debug)]
pub struct MapSnapshot {
    source: Box<dyn MapSource>,
    current: Mutex<Option<Arc<MapReading>>>,
}

impl MapSnapshot {
    fn new(source: Box<dyn MapSource>) -> Self {
        MapSnapshot {
            source,
            current: Mutex::new(None),
        }
    }

    /// Reads the source and keeps what it read (nothing, when it has no dataplane).
    fn refresh(&self) {
        let reading = self.source.read().map(Arc::new);
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = reading;
    }

    fn current(&self) -> Option<Arc<MapReading>> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Encodes the last map snapshot.
#[derive(Debug)]
struct MapCollector {
    snapshot: Arc<MapSnapshot>,
    /// Whether scrapes have the per-frontend counters.
    frontend_series: bool,
}

impl Collector for MapCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // No snapshot (yet): no map metrics; the rest of the scrape still works.
        let Some(reading) = self.snapshot.current() else {
            return Ok(());
        };
        let labels: Vec<[(&str, String); 6]> = reading
            .frontends
            .iter()
            .map(FrontendMetric::labels)
            .collect();
        type Pick = fn(&FrontendMetric) -> u64;
        let counters: [(&str, &str, Pick); 3] = [
            (
                "mcs_frontend_translations",
                "Connects and datagrams translated to a backend, per frontend",
                |r| r.counters.translations,
            ),
            (
                "mcs_frontend_rejects",
                "Connects refused: undeclared port or no backend, per frontend",
                |r| r.counters.rejects,
            ),
            (
                "mcs_frontend_affinity_hits",
                "Session-affinity hits, per frontend",
                |r| r.counters.affinity_hits,
            ),
        ];
        for (name, help, pick) in counters.into_iter().filter(|_| self.frontend_series) {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (row, labels) in reading.frontends.iter().zip(&labels) {
                ConstCounter::new(pick(row)).encode(family.encode_family(labels)?)?;
            }
        }
        type Fill = fn(&(&'static str, i64, i64)) -> i64;
        let gauges: [(&str, &str, Fill); 2] = [
            (
                "mcs_map_entries",
                "Entries in use in each map the agent writes",
                |m| m.1,
            ),
            (
                "mcs_map_capacity",
                "max_entries of each map the agent writes",
                |m| m.2,
            ),
        ];
        for (name, help, pick) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for m in &reading.maps {
                let labels = [("map", m.0)];
                ConstGauge::new(pick(m)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_core::lb::{FrontendAddr, Protocol};

    #[test]
    fn text_exposition_has_the_metrics() {
        let m = Metrics::new(None, false);
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

    /// A map source that counts its reads and returns what the test set.
    #[derive(Debug, Default)]
    struct FakeMaps {
        reads: std::sync::atomic::AtomicUsize,
        translations: std::sync::atomic::AtomicU64,
    }

    #[derive(Debug)]
    struct Shared(Arc<FakeMaps>);

    impl MapSource for Shared {
        fn read(&self) -> Option<MapReading> {
            use std::sync::atomic::Ordering::SeqCst;
            self.0.reads.fetch_add(1, SeqCst);
            Some(MapReading {
                frontends: vec![FrontendMetric {
                    service: NamespacedName::new("demo", "web"),
                    port_name: "http".into(),
                    addr: FeAddr::Port(FrontendAddr {
                        ip: "241.0.0.1".parse().expect("an address"),
                        port: 80,
                        protocol: Protocol::Tcp,
                    }),
                    counters: Counters {
                        translations: self.0.translations.load(SeqCst),
                        ..Counters::default()
                    },
                }],
                maps: vec![("mcs_frontends4", 1, 64)],
            })
        }
    }

    fn reads(fake: &FakeMaps) -> usize {
        fake.reads.load(std::sync::atomic::Ordering::SeqCst)
    }

    const WEB: &str = "mcs_frontend_translations_total{namespace=\"demo\",name=\"web\",port_name=\"http\",ip=\"241.0.0.1\",port=\"80\",protocol=\"TCP\"}";

    #[test]
    fn scrapes_encode_the_snapshot_and_never_read_the_maps() {
        use std::sync::atomic::Ordering::SeqCst;
        let fake = Arc::new(FakeMaps::default());
        let m = Metrics::with_maps(Some(Box::new(Shared(fake.clone()))), true);
        // No snapshot yet: no map metrics, and the scrape did not read the maps for one.
        assert!(!m.encode().contains("mcs_map_entries"));
        assert_eq!(reads(&fake), 0);

        fake.translations.store(5, SeqCst);
        m.refresh_maps();
        for _ in 0..100 {
            let text = m.encode();
            assert!(text.lines().any(|l| l == format!("{WEB} 5")), "{text}");
            assert!(
                text.lines()
                    .any(|l| l == "mcs_map_capacity{map=\"mcs_frontends4\"} 64"),
                "{text}"
            );
        }
        assert_eq!(reads(&fake), 1, "100 scrapes, one map read");

        // The maps move; scrapes show the snapshot until the next refresh.
        fake.translations.store(9, SeqCst);
        assert!(m.encode().lines().any(|l| l == format!("{WEB} 5")));
        m.refresh_maps();
        assert!(m.encode().lines().any(|l| l == format!("{WEB} 9")));
        assert_eq!(reads(&fake), 2);
    }

    /// Without `--frontend-metrics` a scrape has the maps' fill but no per-frontend series.
    #[test]
    fn frontend_series_are_left_out_unless_asked_for() {
        let fake = Arc::new(FakeMaps::default());
        let m = Metrics::with_maps(Some(Box::new(Shared(fake.clone()))), false);
        m.refresh_maps();
        let text = m.encode();
        assert!(
            text.lines()
                .any(|l| l == "mcs_map_entries{map=\"mcs_frontends4\"} 1"),
            "{text}"
        );
        assert!(!text.contains("mcs_frontend_"), "{text}");
    }

    #[tokio::test]
    async fn a_sync_makes_the_refresher_take_a_new_snapshot() {
        let fake = Arc::new(FakeMaps::default());
        let m = Arc::new(Metrics::with_maps(
            Some(Box::new(Shared(fake.clone()))),
            true,
        ));
        // Far away: only the start and the sync below can cause a read.
        let task = tokio::spawn(m.clone().refresh_maps_forever(Duration::from_secs(3600)));
        let wait_for = |n: usize| {
            let fake = fake.clone();
            async move {
                while reads(&fake) < n {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait_for(1))
            .await
            .expect("the first snapshot at start");
        fake.translations
            .store(7, std::sync::atomic::Ordering::SeqCst);
        m.maps_changed();
        tokio::time::timeout(Duration::from_secs(30), wait_for(2))
            .await
            .expect("a snapshot after the sync");
        assert!(m.encode().lines().any(|l| l == format!("{WEB} 7")));
        task.abort();
    }
}
