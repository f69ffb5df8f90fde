//! Standalone mode (`run --clusterset-dir DIR`): the whole product on one host, no API server.
//! It merges the member clusters' manifests from `DIR/<cluster-id>/`, hands the importing
//! cluster's ServiceImports and EndpointSlices to the node role in-process, writes the imports
//! and export conditions to a report file, and does it again whenever DIR changes.

use std::path::{Path, PathBuf};

use tracing::{error, info, warn};

use super::node::{ChangeSender, NodeInputs};
use crate::{
    plan::{self, Plan},
    source::watch::DirWatcher,
};
use dataplane_core::{
    merge::conditions::{ConditionStatus, ConditionType},
    model::{ClusterId, ServiceImport},
};

/// Writes `text` to `path` atomically (a reader never sees half a report).
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Merges once: logs the diagnostics, writes the report, and returns the plan.
pub fn merge_once(
    dir: &Path,
    cluster: Option<&ClusterId>,
    previous: Option<&[ServiceImport]>,
    report: Option<&Path>,
) -> Result<Plan, plan::PlanError> {
    let plan = plan::compute_with(dir, cluster, previous)?;
    for d in plan.diagnostics() {
        warn!(
            file = d.file.as_deref().unwrap_or(""),
            cluster = d.cluster.as_deref().unwrap_or(""),
            object = d.object.as_deref().unwrap_or(""),
            "{}",
            d.message
        );
    }
    let conflicts = plan
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
        cluster = %plan.cluster,
        imports = plan.merge.service_imports.len(),
        slices = plan.merge.endpoint_slices.len(),
        exports_in_conflict = conflicts,
        "merged the clusterset"
    );
    if let Some(report) = report
        && let Err(e) = write_atomically(report, &plan.report_yaml())
    {
        error!(report = %report.display(), error = %e, "cannot write the report");
    }
    Ok(plan)
}

/// Re-merges on every change of `dir` and sends the result to the node role on `tx`, as a
/// snapshot (the node finds the services that differ). Stops when the node is gone.
pub async fn watch_clusterset(
    dir: PathBuf,
    cluster: Option<ClusterId>,
    report: Option<PathBuf>,
    tx: ChangeSender,
) {
    let mut watcher = match DirWatcher::new(&dir) {
        Ok(w) => Some(w),
        Err(e) => {
            error!(dir = %dir.display(), error = %e, "cannot watch the clusterset directory; changes need a restart");
            None
        }
    };
    let mut previous: Option<Vec<ServiceImport>> = None;
    loop {
        match merge_once(
            &dir,
            cluster.as_ref(),
            previous.as_deref(),
            report.as_deref(),
        ) {
            Ok(plan) => {
                let inputs = NodeInputs {
                    imports: plan.merge.service_imports.clone(),
                    slices: plan.merge.endpoint_slices,
                };
                previous = Some(plan.merge.service_imports);
                if tx.send(inputs.into_change()).is_err() {
                    return;
                }
            }
            // Keep routing the last good merge: a broken clusterset.yaml must not empty the maps.
            Err(e) => {
                error!(dir = %dir.display(), "cannot merge: {e}; keeping the last good state")
            }
        }
        match watcher.as_mut() {
            Some(w) => {
                if w.changed().await.is_none() {
                    return;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}
