//! Standalone mode (`run --clusterset-dir DIR`): the whole product on one host, no API server.
//!
//! One loop owns the three parts: the source merges the member clusters' manifests from
//! `DIR/<cluster-id>/` ([`clusterset_dir::merge`]), this host's node applies the importing
//! cluster's imports and slices as one [`Change`](crate::source::feed::Change), and the sink
//! writes the imports, the export conditions and every diagnostic to the report file (with
//! the lb warnings of the table the node built, so the table is built once). It does it again
//! whenever DIR changes, and keeps the last good state when DIR cannot be merged.

use std::path::{Path, PathBuf};

use dataplane_core::{
    merge::conditions::{ConditionStatus, ConditionType},
    model::{ClusterId, records::ImportRecord},
    plan::Merged,
};
use tracing::{error, info, warn};

use super::{
    node::{self, Node, NodeError},
    shutdown_signal,
};
use crate::{
    bpf::loader::LoaderConfig,
    dns::DnsOptions,
    sink::report::write_atomically,
    source::{
        clusterset_dir::{self, PlanError},
        watch::DirWatcher,
    },
};

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
}

/// Runs standalone mode until SIGTERM or SIGINT. The directory must merge once before the
/// kernel is touched; later failures keep the last good state. The dataplane stays in place
/// afterwards.
pub async fn run(settings: Standalone, loader: &LoaderConfig) -> Result<(), StandaloneError> {
    let first = clusterset_dir::merge(&settings.dir, settings.cluster.as_ref(), None)?;
    let (mut node, _dns) = Node::start_with_dns(loader, &settings.dns)?;
    if let Some(logger) = node.take_logger() {
        tokio::spawn(node::pump_bpf_logs(logger));
    }
    let mut watcher = match DirWatcher::new(&settings.dir) {
        Ok(w) => Some(w),
        Err(e) => {
            error!(dir = %settings.dir.display(), error = %e, "cannot watch the clusterset directory; changes need a restart");
            None
        }
    };
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut merged = Ok(first);
    let mut previous: Option<Vec<ImportRecord>> = None;
    loop {
        match merged {
            Ok(m) => {
                apply(&mut node, &m, settings.report.as_deref());
                previous = Some(m.merge.service_imports);
            }
            // Keep routing the last good merge: a broken clusterset.yaml must not empty the maps.
            Err(e) => {
                error!(dir = %settings.dir.display(), "cannot merge: {e}; keeping the last good state")
            }
        }
        let changed = async {
            match watcher.as_mut() {
                Some(w) => w.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            got = changed => if got.is_none() {
                warn!("the directory watcher stopped; keeping the dataplane as it is");
                shutdown.as_mut().await;
                return Ok(());
            },
            () = &mut shutdown => {
                info!("shutting down; the dataplane stays in place");
                return Ok(());
            }
        }
        merged = clusterset_dir::merge(
            &settings.dir,
            settings.cluster.as_ref(),
            previous.as_deref(),
        );
    }
}

/// Hands one merge to the node and writes the report.
fn apply(node: &mut Node, merged: &Merged, report: Option<&Path>) {
    node.apply([merged.change()]);
    let lb_warnings = node.lb_warnings();
    for d in merged.diagnostics(lb_warnings) {
        warn!(
            file = d.file.as_deref().unwrap_or(""),
            cluster = d.cluster.as_deref().unwrap_or(""),
            object = d.object.as_deref().unwrap_or(""),
            "{}",
            d.message
        );
    }
    let conflicts = merged
        .merge
        .export_statuses
        .iter()
        .filter(|e| {
            e.conditions
                .iter()
                .any(|c| c.type_ == ConditionType::Conflict && c.status == ConditionStatus::True)
        })
        .count();
    info!(
        cluster = %merged.cluster,
        imports = merged.merge.service_imports.len(),
        slices = merged.merge.endpoint_slices.len(),
        exports_in_conflict = conflicts,
        "merged the clusterset"
    );
    if let Some(report) = report
        && let Err(e) = write_atomically(report, &merged.report_yaml(lb_warnings))
    {
        error!(report = %report.display(), error = %e, "cannot write the report");
    }
}
