//! What `dataplane-agent plan` prints: the merge and the lb table for one importing cluster,
//! with every diagnostic, rendered as JSON; and the standalone report (YAML). The agent reads
//! the ClusterSet directory (`source::clusterset_dir`); this is the pure half.
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

use std::{collections::BTreeMap, path::PathBuf};

use serde_json::{Value, json};

use crate::{
    lb::{
        self, LbTable, LbWarning,
        inputs::{Change, record_input},
    },
    manifest::ManifestError,
    merge::{ClusterSetCidrs, MergeOutput},
    model::ClusterId,
    policy::AddressPolicy,
};

/// A ClusterSet merged for one importing cluster, with what could not be read: the input of
/// the plan and of the standalone report.
#[derive(Clone, Debug, PartialEq)]
pub struct Merged {
    /// The importing cluster.
    pub cluster: ClusterId,
    /// What the merge made of the ClusterSet for that cluster.
    pub merge: MergeOutput,
    /// Documents that could not be used.
    pub manifest_errors: Vec<ManifestError>,
    /// Where each object came from (cluster, `Kind ns/name`) → file.
    pub sources: BTreeMap<(ClusterId, String), PathBuf>,
    /// The ClusterSet's CIDRs: the node's address policy follows them.
    pub cidrs: ClusterSetCidrs,
}

/// A merge and its lb table for one importing cluster: what `plan` prints.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The merge.
    pub merged: Merged,
    /// The table the node role would program: `lb::build` on the merge's imports and slices.
    pub lb: LbTable,
}

impl Plan {
    /// The plan of a merge: builds its lb table.
    /// Under the address policy of the ClusterSet's CIDRs, as a node without other address
    /// flags has it.
    pub fn new(merged: Merged) -> Plan {
        let policy = AddressPolicy::for_cidrs(&merged.cidrs);
        let lb = lb::build_records_with(
            &merged.merge.service_imports,
            &merged.merge.endpoint_slices,
            &policy,
        );
        Plan { merged, lb }
    }

    /// Every problem found: unusable documents, merge diagnostics (with the object's file when
    /// known) and lb warnings, sorted.
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        self.merged.diagnostics(&self.lb.warnings)
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

    /// The plan as a JSON value (see the module documentation).
    pub fn to_value(&self) -> Value {
        let m = &self.merged;
        json!({
            "cluster": m.cluster,
            "serviceImports": m.imports(),
            "serviceExports": m.exports(),
            "endpointSlices": Value::Array(m.merge.endpoint_slices.iter().map(|s| to_value(&s.to_k8s())).collect()),
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

impl Merged {
    fn imports(&self) -> Value {
        Value::Array(
            self.merge
                .service_imports
                .iter()
                .map(|si| to_value(&si.to_k8s()))
                .collect(),
        )
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

    /// Every problem found: unusable documents, merge diagnostics (with the object's file when
    /// known) and the lb table's `lb_warnings`, sorted.
    pub fn diagnostics(&self, lb_warnings: &[LbWarning]) -> Vec<Diagnostic> {
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
        for w in lb_warnings {
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

    /// The standalone report: the importing cluster's ServiceImports and every export's
    /// conditions, plus the diagnostics (with the `lb_warnings` of the table the node built
    /// from this merge), as one YAML document.
    pub fn report_yaml(&self, lb_warnings: &[LbWarning]) -> String {
        let report = json!({
            "cluster": self.cluster,
            "serviceImports": self.imports(),
            "serviceExports": self.exports(),
            "diagnostics": to_value(&self.diagnostics(lb_warnings)),
        });
        serde_yaml::to_string(&report).unwrap_or_default()
    }

    /// The node's inputs from this merge: the importing cluster's imports and imported slices,
    /// as one complete change. The records are shared, not copied.
    pub fn change(&self) -> Change {
        Change::Snapshot {
            imports: self
                .merge
                .service_imports
                .iter()
                .cloned()
                .map(record_input)
                .collect(),
            slices: self
                .merge
                .endpoint_slices
                .iter()
                .cloned()
                .map(record_input)
                .collect(),
        }
    }
}

/// One line of the plan's `diagnostics`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Diagnostic {
    /// The file the problem is in, when known; `path (document N)` for an unusable document.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The member cluster it concerns, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The object, as `Kind namespace/name`, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// What is wrong and what was done about it; the lb table's warnings start with `lb: `.
    pub message: String,
}
