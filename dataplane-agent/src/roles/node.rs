//! The node role: keeps this node's maps in step with the local cluster's ServiceImports and
//! imported EndpointSlices, wherever they come from (a directory, an API server, the
//! standalone merge). Sources publish complete snapshots on a `watch` channel; `None` means
//! "the initial lists are not complete yet", and nothing is pruned before the first snapshot.

use std::{path::Path, sync::Arc, time::Instant};

use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::{
    bpf::{
        kernel::KernelMaps,
        loader::{self, Attachment, Dataplane, LoadError, LoaderConfig},
        maps::MapWriter as _,
        sync::{MapSync, SyncReport},
    },
    lb,
    model::{EndpointSlice, LABEL_SERVICE_NAME, ServiceImport},
    source::manifests::{self, Manifest, ManifestError},
};

/// What the node role routes from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInputs {
    pub imports: Vec<ServiceImport>,
    pub slices: Vec<EndpointSlice>,
}

/// Reads ServiceImports and imported EndpointSlices (label
/// `multicluster.kubernetes.io/service-name`) from the YAML files in `dir`. Other objects are
/// reported and ignored.
pub fn read_node_dir(dir: &Path) -> std::io::Result<(NodeInputs, Vec<ManifestError>)> {
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
    use crate::model::NamespacedName;
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

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("reading the adopted maps: {0}")]
    Read(#[from] crate::bpf::kernel::KernelMapError),
}

/// The node's dataplane and the mirror of its maps.
pub struct Node {
    maps: KernelMaps,
    sync: MapSync,
    pub attachment: Attachment,
    pub program_ids: Vec<(&'static str, u32)>,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

impl Node {
    /// Installs (or adopts) the programs and maps, and rebuilds the mirror from the maps.
    pub fn start(cfg: &LoaderConfig) -> Result<Node, NodeError> {
        let Dataplane {
            mut maps,
            attachment,
            program_ids,
            logger,
        } = loader::install(cfg)?;
        let contents = maps.read_all()?;
        let (sync, cleanup) = MapSync::adopt(maps.capacities(), &contents);
        for op in &cleanup {
            if let Err(e) = maps.apply(op) {
                warn!(error = %e, "cleaning up an unreachable map entry failed");
            }
        }
        info!(
            frontends = sync.frontend_count(),
            backends = sync.backend_count(),
            cleaned = cleanup.len(),
            ?attachment,
            "dataplane ready"
        );
        Ok(Node {
            maps,
            sync,
            attachment,
            program_ids,
            logger,
        })
    }

    /// Takes the eBPF log reader, to be pumped by [`pump_bpf_logs`].
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        self.logger.take()
    }

    /// Builds the lb table from `inputs` and writes the difference into the maps.
    pub fn apply(&mut self, inputs: &NodeInputs) -> SyncReport {
        let started = Instant::now();
        let table = lb::build(&inputs.imports, &inputs.slices);
        for w in &table.warnings {
            warn!(object = %w.object, "{}", w.message);
        }
        let report = self.sync.sync(&table, &mut self.maps);
        for failure in &report.failed {
            error!("{failure}");
        }
        for e in &report.delete_errors {
            warn!(error = %e, "a map delete failed; the entry is unreachable and will be retried");
        }
        for service in &report.changed {
            debug!(service = %service, "service written to the maps");
        }
        info!(
            services = table.services().len(),
            frontends = table.frontends.len(),
            changed = report.changed.len(),
            failed = report.failed.len(),
            writes = report.writes,
            elapsed_us = started.elapsed().as_micros() as u64,
            "maps synced"
        );
        report
    }

    pub fn mirror(&self) -> &MapSync {
        &self.sync
    }
}

/// Forwards eBPF log records (aya-log) into `log`, and so into `tracing`.
pub async fn pump_bpf_logs(logger: aya_log::EbpfLogger<&'static dyn log::Log>) {
    // SAFETY: the logger owns the ring buffer's fd, which stays open and the same for as long
    // as the logger lives, and the AsyncFd owns the logger.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
    };
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            let (_, cause) = e.into_parts();
            warn!(error = %cause, "cannot watch the eBPF log buffer; eBPF logs are off");
            return;
        }
    };
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            return;
        };
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}

/// Runs the node role until `shutdown` resolves, re-syncing on every new snapshot. The
/// dataplane stays in place afterwards.
pub async fn run(
    node: Node,
    inputs: watch::Receiver<Option<Arc<NodeInputs>>>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    run_with(node, inputs, shutdown, |_, _| {}).await
}

/// [`run`], calling `on_sync` with the report and duration of every sync (for metrics and the
/// readiness probe).
pub async fn run_with(
    mut node: Node,
    mut inputs: watch::Receiver<Option<Arc<NodeInputs>>>,
    shutdown: impl std::future::Future<Output = ()>,
    mut on_sync: impl FnMut(&SyncReport, std::time::Duration),
) {
    if let Some(logger) = node.take_logger() {
        tokio::spawn(pump_bpf_logs(logger));
    }
    tokio::pin!(shutdown);
    loop {
        let snapshot = inputs.borrow_and_update().clone();
        if let Some(snapshot) = snapshot {
            let started = Instant::now();
            let report = node.apply(&snapshot);
            on_sync(&report, started.elapsed());
        } else {
            info!("waiting for the initial ServiceImports and EndpointSlices before syncing");
        }
        tokio::select! {
            changed = inputs.changed() => {
                if changed.is_err() {
                    warn!("the input source stopped; keeping the dataplane as it is");
                    shutdown.as_mut().await;
                    return;
                }
            }
            () = &mut shutdown => {
                info!("shutting down; the dataplane stays in place");
                return;
            }
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Publishes the contents of `dir` on `tx`, now and after every change.
pub async fn watch_node_dir(dir: std::path::PathBuf, tx: watch::Sender<Option<Arc<NodeInputs>>>) {
    let mut watcher = match crate::source::watch::DirWatcher::new(&dir) {
        Ok(w) => Some(w),
        Err(e) => {
            error!(dir = %dir.display(), error = %e, "cannot watch the directory; changes need a restart");
            None
        }
    };
    loop {
        match read_node_dir(&dir) {
            Ok((inputs, errors)) => {
                for e in &errors {
                    warn!("{e}");
                }
                tx.send_if_modified(|current| {
                    let changed = current.as_deref() != Some(&inputs);
                    if changed {
                        *current = Some(Arc::new(inputs));
                    }
                    changed
                });
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
