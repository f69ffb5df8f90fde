//! A node directory (`node --from-dir DIR`): YAML files holding the local cluster's
//! ServiceImports and imported EndpointSlices, read whole and re-read after every change.

use std::path::Path;

use dataplane_core::model::{
    EndpointSlice, Interner, LABEL_SERVICE_NAME, NamespacedName, ServiceImport,
};
use tracing::{error, warn};

use super::{
    feed::{Change, ChangeSender},
    manifests::{self, Manifest, ManifestError},
    watch::DirWatcher,
};

/// What the node role routes from, as read from a directory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInputs {
    pub imports: Vec<ServiceImport>,
    pub slices: Vec<EndpointSlice>,
}

impl NodeInputs {
    /// The whole inputs as one change, converted with `names`.
    pub fn change(&self, names: &Interner) -> Change {
        Change::snapshot(&self.imports, &self.slices, names)
    }
}

/// Reads ServiceImports and imported EndpointSlices (label
/// `multicluster.kubernetes.io/service-name`) from the YAML files in `dir`. Other objects are
/// reported and ignored.
pub fn read(dir: &Path) -> std::io::Result<(NodeInputs, Vec<ManifestError>)> {
    let (objects, mut errors) = manifests::read_dir(dir)?;
    let mut inputs = NodeInputs::default();
    for object in objects {
        match object {
            Manifest::ServiceImport(si) => inputs.imports.push(*si),
            Manifest::EndpointSlice(slice)
                if slice
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(LABEL_SERVICE_NAME)) =>
            {
                inputs.slices.push(*slice)
            }
            other => errors.push(ManifestError {
                file: dir.to_owned(),
                document: 0,
                object: Some(describe(&other)),
                message:
                    "ignored: the node role reads ServiceImports and imported EndpointSlices only"
                        .into(),
            }),
        }
    }
    Ok((inputs, errors))
}

fn describe(m: &Manifest) -> String {
    match m {
        Manifest::Service(o) => format!("Service {}", NamespacedName::of(&o.metadata)),
        Manifest::ServiceExport(o) => format!("ServiceExport {}", NamespacedName::of(&o.metadata)),
        Manifest::ServiceImport(o) => format!("ServiceImport {}", NamespacedName::of(&o.metadata)),
        Manifest::EndpointSlice(o) => format!(
            "EndpointSlice {} (no {LABEL_SERVICE_NAME} label)",
            NamespacedName::of(&o.metadata)
        ),
    }
}

/// Sends the contents of `dir` on `tx`, now and after every change, as a snapshot (the node
/// finds what differs). Stops when the node is gone.
pub async fn watch(dir: std::path::PathBuf, tx: ChangeSender) {
    let mut watcher = match DirWatcher::new(&dir) {
        Ok(w) => Some(w),
        Err(e) => {
            error!(dir = %dir.display(), error = %e, "cannot watch the directory; changes need a restart");
            None
        }
    };
    let names = Interner::new();
    loop {
        match read(&dir) {
            Ok((inputs, errors)) => {
                for e in &errors {
                    warn!("{e}");
                }
                let change = inputs.change(&names);
                names.purge();
                if tx.send(change).is_err() {
                    return;
                }
            }
            // Keep the last good snapshot: an unreadable directory must not empty the maps.
            Err(e) => error!(dir = %dir.display(), error = %e, "cannot read the directory"),
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
