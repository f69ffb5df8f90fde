//! Standalone mode (`run --clusterset-dir DIR`): the whole product on one host, no API server.
//!
//! One loop owns the three parts: the source keeps the member clusters' manifests of
//! `DIR/<cluster-id>/` merged file by file ([`ClusterSetMerge`]), this host's node applies the
//! changes of the importing cluster's imports and slices, and the sink rewrites the report
//! (the imports, the export conditions and every diagnostic, with the lb warnings of the
//! table the node built) from the merge, at most every [`REPORT_EVERY`]. A change to a file
//! re-reads that file and re-merges the services it touched; a batch that cannot be used keeps
//! the last good state.

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use dataplane_core::{model::ClusterId, plan::Diagnostic};
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{
    node::{self, Node, NodeError},
    retry::sleep_until,
    shutdown_signal,
};
use crate::{
    bpf::loader::LoaderConfig,
    dns::DnsOptions,
    sink::report::write_atomically,
    source::{clusterset_dir::PlanError, clusterset_merge::ClusterSetMerge, watch::DirWatcher},
};

/// The shortest time between two writes of the report: changes in between are written
/// together.
pub const REPORT_EVERY: Duration = Duration::from_millis(250);

/// Why standalone mode cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    #[error("reading the clusterset directory: {0}")]
    Merge(#[from] PlanError),
    #[error("installing the dataplane: {0}")]
    Node(#[from] NodeError),
}

/// What standalone mode runs on.
#[derive(Clone, Debug)]
pub struct Standalone {
    /// The ClusterSet directory.
    pub dir: PathBuf,
    /// The importing cluster (default: the first cluster id in sorted order).
    pub cluster: Option<ClusterId>,
    /// Where to write the report after every merge.
    pub report: Option<PathBuf>,
    /// The clusterset.local DNS server, when it listens anywhere.
    pub dns: DnsOptions,
    /// Which ClusterSet IPs and backends may be programmed, over the ClusterSet's CIDRs.
    pub addresses: crate::cli::AddressArgs,
}

/// Runs standalone mode until SIGTERM or SIGINT. The directory must merge once before the
/// kernel is touched; later failures keep the last good state. The dataplane stays in place
/// afterwards.
pub async fn run(settings: Standalone, loader: &LoaderConfig) -> Result<(), StandaloneError> {
    // Watching starts before the first read: an edit made while the programs load (seconds)
    // is in the first batch, not lost.
    let mut watcher = match DirWatcher::new(&settings.dir) {
        Ok(w) => Some(w),
        Err(e) => {
            error!(dir = %settings.dir.display(), error = %e, "cannot watch the clusterset directory; changes need a restart");
            None
        }
    };
    // From the ClusterSet CIDRs at start; a CIDR change in clusterset.yaml needs a restart.
    // The merge imports only the endpoints it allows (the others are reported on their
    // exports), and the node checks again what it is given.
    let (mut merge, first) =
        ClusterSetMerge::start(&settings.dir, settings.cluster.as_ref(), |cidrs| {
            settings.addresses.policy(cidrs)
        })?;
    let (node, _dns) = Node::start_with_dns(loader, &settings.dns)?;
    let mut node = node.with_policy(settings.addresses.policy(&merge.config().cidrs));
    if let Some(logger) = node.take_logger() {
        tokio::spawn(node::pump_bpf_logs(logger));
    }
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    node.apply([first]);
    let mut report = Report::new(settings.report.clone());
    report.write(&merge, &node);
    // Failed map writes are tried again on their own schedule, as in the node role.
    loop {
        let changed = async {
            match watcher.as_mut() {
                Some(w) => w.changed().await,
                None => std::future::pending().await,
            }
        };
        let due = report.due();
        tokio::select! {
            got = changed => {
                let Some(changes) = got else {
                    warn!("the directory watcher stopped; keeping the dataplane as it is");
                    shutdown.as_mut().await;
                    return Ok(());
                };
                match merge.update(&changes) {
                    Ok(update) => {
                        if !update.changes.is_empty() {
                            node.apply(update.changes);
                        }
                        report.pending = true;
                    }
                    // Keep routing the last good merge: a broken clusterset.yaml must not
                    // empty the maps.
                    Err(e) => error!(dir = %settings.dir.display(), "cannot merge: {e}; keeping the last good state"),
                }
            }
            () = tokio::time::sleep_until(due), if report.pending => report.write(&merge, &node),
            () = sleep_until(node.retry_deadline()) => {
                node.apply(std::iter::empty());
            }
            () = &mut shutdown => {
                info!("shutting down; the dataplane stays in place");
                return Ok(());
            }
        }
    }
}

/// The report file and what was last logged, written at most every [`REPORT_EVERY`].
struct Report {
    path: Option<PathBuf>,
    written: Option<Instant>,
    /// Changes came in since the last write.
    pending: bool,
    /// The diagnostics logged so far: only new ones are logged again.
    logged: BTreeSet<Diagnostic>,
}

impl Report {
    fn new(path: Option<PathBuf>) -> Report {
        Report {
            path,
            written: None,
            pending: false,
            logged: BTreeSet::new(),
        }
    }

    /// When the next write may happen.
    fn due(&self) -> Instant {
        self.written
            .map(|at| at + REPORT_EVERY)
            .unwrap_or_else(Instant::now)
    }

    /// Logs what is new and writes the report of the current merge.
    fn write(&mut self, merge: &ClusterSetMerge, node: &Node) {
        self.pending = false;
        self.written = Some(Instant::now());
        let merged = merge.merged();
        let lb_warnings = node.lb_warnings();
        let diagnostics: BTreeSet<Diagnostic> =
            merged.diagnostics(lb_warnings).into_iter().collect();
        for d in diagnostics.difference(&self.logged) {
            warn!(
                file = d.file.as_deref().unwrap_or(""),
                cluster = d.cluster.as_deref().unwrap_or(""),
                object = d.object.as_deref().unwrap_or(""),
                "{}",
                d.message
            );
        }
        self.logged = diagnostics;
        let conflicts = merged
            .merge
            .export_statuses
            .iter()
            .filter(|e| e.conflict().is_some())
            .count();
        info!(
            cluster = %merged.cluster,
            imports = merged.merge.service_imports.len(),
            slices = merged.merge.endpoint_slices.len(),
            exports_in_conflict = conflicts,
            "merged the clusterset"
        );
        if let Some(path) = &self.path
            && let Err(e) = write_atomically(path, &merged.report_yaml(lb_warnings))
        {
            error!(report = %path.display(), error = %e, "cannot write the report");
        }
    }
}
