//! The `plan`: the merge and the lb table for one importing cluster, computed from a ClusterSet
//! directory (see [`crate::source::clusterset_dir`]) with no kernel and no API server.
//!
//! [`Plan::to_json`] renders (pretty, trailing newline, byte-identical for the same input):
//!
//! ```text
//! {
//!   "cluster": "<importing cluster id>",
//!   "serviceImports": [ServiceImport, ...],        full objects, sorted by namespace/name
//!   "serviceExports": [{cluster, namespace, name, conditions: [{type, status, reason, message}]}],
//!   "endpointSlices": [EndpointSlice, ...],        the imported slices, sorted by namespace/name
//!   "frontends": [{namespace, name, ip, port, protocol, portName,
//!                  backends: [{cluster, ip, port}]}],     from lb::build, as on a node
//!   "diagnostics": [{file?, cluster?, object?, message}]
//! }
//! ```
//!
//! Conditions carry no `lastTransitionTime` (the merge has no clock).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

use crate::{
    source::clusterset_dir::{self, ClusterSetDirError},
    source::manifests::ManifestError,
};
use dataplane_core::{
    lb::{self, LbTable},
    merge::{self, MergeOutput},
    model::ClusterId,
};

/// Why a plan cannot be computed at all.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Dir(#[from] ClusterSetDirError),
    #[error("{}: no cluster directory", dir.display())]
    NoClusters { dir: PathBuf },
    #[error("cluster {cluster} is neither a directory of {} nor listed in its clusterset.yaml", dir.display())]
    UnknownCluster { cluster: ClusterId, dir: PathBuf },
}

/// A merge and its lb table for one importing cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The importing cluster.
    pub cluster: ClusterId,
    pub merge: MergeOutput,
    /// The table the node role would program: `lb::build` on the plan's imports and slices.
    pub lb: LbTable,
    /// Documents of the directory that could not be used.
    pub manifest_errors: Vec<ManifestError>,
    /// Where each object came from (cluster, `Kind ns/name`) → file.
    pub sources: BTreeMap<(ClusterId, String), PathBuf>,
}

/// Reads `dir`, merges for `cluster` (default: the first cluster id in sorted order) and builds
/// the lb table. ServiceImports found in the importing cluster's directory are its existing
/// imports (their ClusterSet IPs are kept). This is what standalone mode runs.
///
/// ```no_run
/// let plan = dataplane_agent::plan::compute("clusterset".as_ref(), None)?;
/// print!("{}", plan.to_json());
/// # Ok::<(), dataplane_agent::plan::PlanError>(())
/// ```
pub fn compute(dir: &Path, cluster: Option<&ClusterId>) -> Result<Plan, PlanError> {
    compute_with(dir, cluster, None)
}

/// [`compute`], with the importing cluster's current imports given instead of read from the
/// directory (standalone mode passes its previous result, so ClusterSet IPs stay put).
pub fn compute_with(
    dir: &Path,
    cluster: Option<&ClusterId>,
    current_imports: Option<&[dataplane_core::model::ServiceImport]>,
) -> Result<Plan, PlanError> {
    let read = clusterset_dir::read(dir)?;
    let cluster = match cluster {
        Some(c) => {
            if !read.cluster_ids().contains(&c) && !read.config.clusters.contains_key(c) {
                return Err(PlanError::UnknownCluster {
                    cluster: c.clone(),
                    dir: dir.to_owned(),
                });
            }
            c.clone()
        }
        None => read
            .cluster_ids()
            .first()
            .map(|c| (*c).clone())
            .ok_or_else(|| PlanError::NoClusters {
                dir: dir.to_owned(),
            })?,
    };
    let existing = current_imports
        .unwrap_or_else(|| read.imports.get(&cluster).map(Vec::as_slice).unwrap_or(&[]));
    let merge = merge::merge(&read.snapshots, &read.config, &cluster, existing);
    let lb = lb::build(&merge.service_imports, &merge.endpoint_slices);
    Ok(Plan {
        cluster,
        merge,
        lb,
        manifest_errors: read.errors,
        sources: read.sources,
    })
}

/// Removes `lastTransitionTime` (and `observedGeneration`) from every condition under `v`.
fn strip_times(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some(Value::Array(conds)) = map.get_mut("conditions") {
                for c in conds {
                    if let Value::Object(c) = c {
                        c.remove("lastTransitionTime");
                        c.remove("observedGeneration");
                    }
                }
            }
            for (_, child) in map.iter_mut() {
                strip_times(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_times),
        _ => {}
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    // Serialising these types to a Value cannot fail (string keys only); Null keeps it total.
    let mut v = serde_json::to_value(v).unwrap_or(Value::Null);
    strip_times(&mut v);
    v
}

impl Plan {
    fn imports(&self) -> Value {
        Value::Array(self.merge.service_imports.iter().map(to_value).collect())
    }

    fn exports(&self) -> Value {
        Value::Array(
            self.merge
                .export_statuses
                .iter()
                .map(|s| {
                    json!({
                        "cluster": s.cluster,
                        "namespace": s.service.namespace,
                        "name": s.service.name,
                        "conditions": to_value(&s.conditions),
                    })
                })
                .collect(),
        )
    }

    fn frontends(&self) -> Value {
        let mut rows: Vec<_> = self.lb.frontends.iter().collect();
        rows.sort_by(|(a, fa), (b, fb)| (&fa.service, a).cmp(&(&fb.service, b)));
        Value::Array(
            rows.into_iter()
                .map(|(addr, f)| {
                    json!({
                        "namespace": f.service.namespace,
                        "name": f.service.name,
                        "ip": addr.ip.to_string(),
                        "port": addr.port,
                        "protocol": addr.protocol,
                        "portName": f.port_name,
                        "backends": f.backends.iter().map(|b| json!({
                            "cluster": b.cluster,
                            "ip": b.ip.to_string(),
                            "port": b.port,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect(),
        )
    }

    /// Every problem found: unusable documents, merge diagnostics (with the object's file when
    /// known) and lb warnings, sorted.
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        let mut out: Vec<Diagnostic> = Vec::new();
        for e in &self.manifest_errors {
            out.push(Diagnostic {
                file: Some(format!("{} (document {})", e.file.display(), e.document)),
                cluster: None,
                object: e.object.clone(),
                message: e.message.clone(),
            });
        }
        for d in &self.merge.diagnostics {
            let file = d
                .cluster
                .as_ref()
                .and_then(|c| self.sources.get(&(c.clone(), d.object.clone())))
                .map(|p| p.display().to_string());
            out.push(Diagnostic {
                file,
                cluster: d.cluster.as_ref().map(ToString::to_string),
                object: Some(d.object.clone()),
                message: d.message.clone(),
            });
        }
        for w in &self.lb.warnings {
            out.push(Diagnostic {
                file: None,
                cluster: Some(self.cluster.to_string()),
                object: Some(w.object.clone()),
                message: format!("lb: {}", w.message),
            });
        }
        out.sort();
        out.dedup();
        out
    }

    /// The plan as a JSON value (see the module documentation).
    pub fn to_value(&self) -> Value {
        json!({
            "cluster": self.cluster,
            "serviceImports": self.imports(),
            "serviceExports": self.exports(),
            "endpointSlices": Value::Array(self.merge.endpoint_slices.iter().map(to_value).collect()),
            "frontends": self.frontends(),
            "diagnostics": to_value(&self.diagnostics()),
        })
    }

    /// The plan as pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(&self.to_value()).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The standalone report: the importing cluster's ServiceImports and every export's
    /// conditions (plus diagnostics), as one YAML document.
    pub fn report_yaml(&self) -> String {
        let report = json!({
            "cluster": self.cluster,
            "serviceImports": self.imports(),
            "serviceExports": self.exports(),
            "diagnostics": to_value(&self.diagnostics()),
        });
        serde_yaml::to_string(&report).unwrap_or_default()
    }
}

/// One line of the plan's `diagnostics`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Diagnostic {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    pub message: String,
}
