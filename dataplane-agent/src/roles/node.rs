//! The node role: keeps this node's maps in step with the local cluster's ServiceImports and
//! imported EndpointSlices, wherever they come from (a directory, an API server, the
//! standalone merge).
//!
//! Sources send [`Change`]s on the input feed ([`crate::source::feed`]): an API server's watch
//! events one object at a time, a directory or a merge as one snapshot and then object by
//! object. The node files them in its [`InputIndex`] (the one store of its inputs, shared
//! `Arc`s), rebuilds the lb table's parts of the services they touched
//! ([`LbState::update_parts`]) and hands each part to the map writer as it is built
//! ([`MapSync::sync`]), so an event costs the size of the service it changes, not of the table,
//! and no copy of the table is kept (the writer keeps a digest per frontend). Nothing is written before the index has complete lists of both kinds (nothing is
//! pruned after a restart until the initial lists are in); the first sync is a full one, which
//! prunes whatever the adopted maps hold that the inputs no longer have.

use std::{collections::BTreeSet, path::PathBuf, sync::Arc, time::Instant};

use tracing::{debug, error, info, warn};

use super::{
    retry::{Retries, sleep_until},
    shutdown_signal,
};
use crate::{
    bpf::{
        desired::DesiredService,
        kernel::KernelMaps,
        loader::{self, Attachment, Dataplane, LoadError, LoaderConfig},
        maps::MapWriter as _,
        sync::{MapSync, Scope, SyncReport},
    },
    dns::{DnsOptions, DnsZone, server::DnsServer},
    source::{
        feed::{self, Change, ChangeReceiver},
        node_dir,
    },
};
use dataplane_core::{
    lb::{LbState, LbWarning, inputs::InputIndex},
    model::NamespacedName,
    policy::{AddressPolicy, AddressUse, Refusal},
};

/// Why the node role cannot start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("reading the adopted maps: {0}")]
    Read(#[from] crate::bpf::kernel::KernelMapError),
    #[error("adopting the pinned maps: {0}")]
    Adopt(#[from] crate::bpf::maps::MapWriteError),
    #[error(transparent)]
    Dns(#[from] crate::dns::server::DnsServerError),
    #[error("the input source stopped; the maps keep their last state until the agent restarts")]
    SourceStopped,
}

/// The node's dataplane and the mirror of its maps.
pub struct Node {
    maps: KernelMaps,
    sync: MapSync,
    inputs: InputIndex,
    lb: LbState,
    /// Whether the first (full) sync has run.
    synced: bool,
    /// The pin directory, whose older layout versions are retired after the first sync.
    pin_dir: PathBuf,
    /// Services whose last write failed (a full map, a kernel error): tried again on their
    /// own schedule ([`run_with`]), or with a change of their own.
    retry: Retries<NamespacedName>,
    /// The `clusterset.local` zone, when this node serves DNS: updated with the maps.
    dns: Option<DnsZone>,
    /// Which ClusterSet IPs and backends may be programmed.
    policy: Arc<AddressPolicy>,
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
        let contents = maps.read_entries()?;
        let (sync, cleanup) = MapSync::adopt(maps.capacities(), &contents, &mut maps)?;
        for op in &cleanup {
            if let Err(e) = maps.apply(op) {
                warn!(error = %e, "cleaning up an unreachable map entry failed");
            }
        }
        info!(
            frontends = sync.frontend_count(),
            slots = sync.slot_count(),
            cleaned = cleanup.len(),
            ?attachment,
            "dataplane ready"
        );
        Ok(Node {
            maps,
            sync,
            inputs: InputIndex::default(),
            lb: LbState::default(),
            policy: Arc::default(),
            synced: false,
            pin_dir: cfg.pin_dir.clone(),
            retry: Retries::default(),
            dns: None,
            attachment,
            program_ids,
            logger,
        })
    }

    /// Programs only the ClusterSet IPs and backends `policy` allows (the default policy
    /// otherwise). Takes effect from the first sync.
    pub fn with_policy(mut self, policy: AddressPolicy) -> Node {
        self.policy = Arc::new(policy);
        self.lb = LbState::new(self.policy.clone());
        self
    }

    /// Addresses the inputs list that the policy refuses, by use and reason.
    pub fn refused(&self) -> &std::collections::BTreeMap<(AddressUse, Refusal), usize> {
        self.lb.refused()
    }

    /// Keeps `zone` up to date with the inputs, from the first complete lists on (until then
    /// it answers SERVFAIL).
    pub fn with_dns(mut self, zone: DnsZone) -> Node {
        self.dns = Some(zone);
        self
    }

    /// [`Node::start`] and, with `dns.listen` set, the DNS server the node feeds (it serves
    /// until the returned server is dropped).
    pub fn start_with_dns(
        cfg: &LoaderConfig,
        dns: &DnsOptions,
    ) -> Result<(Node, Option<DnsServer>), NodeError> {
        let mut node = Node::start(cfg)?;
        let server = match crate::dns::start(dns)? {
            Some((zone, server)) => {
                node = node.with_dns(zone);
                Some(server)
            }
            None => None,
        };
        Ok((node, server))
    }

    /// Takes the eBPF log reader, to be pumped by [`pump_bpf_logs`].
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        self.logger.take()
    }

    /// Files `changes` and, once the initial lists are complete, writes what they changed into
    /// the maps: everything the first time, then the services they touched and those whose
    /// retry is due ([`Node::retry_deadline`]). `None` when nothing was synced (still waiting
    /// for the initial lists, or nothing changed).
    pub fn apply(&mut self, changes: impl IntoIterator<Item = Change>) -> Option<SyncReport> {
        let started = Instant::now();
        let mut dirty = BTreeSet::new();
        for change in changes {
            self.inputs.apply(change, &mut dirty);
        }
        if !self.inputs.is_ready() {
            return None;
        }
        // The first sync is a full one: it prunes what adopted maps hold that the inputs do
        // not. Later ones rebuild and write only the services that changed. The lb state keeps
        // no frontends: each rebuilt service's part goes to the writer, which keeps a digest.
        let full = !self.synced;
        let inputs = &self.inputs;
        let inputs_of = |s: &NamespacedName| inputs.inputs(s);
        let parts = if full {
            self.lb = LbState::new(self.policy.clone());
            self.lb.update_parts(inputs.services(), inputs_of)
        } else {
            dirty.extend(self.retry.take_due(tokio::time::Instant::now()));
            if dirty.is_empty() {
                return None;
            }
            self.lb.update_parts(&dirty, inputs_of)
        };
        let rebuilt: BTreeSet<NamespacedName> = parts.services().iter().cloned().collect();
        // Each part is built as the writer takes it and freed once written.
        let desired = parts.map(|(service, part)| DesiredService::from_part(service, part));
        let scope = if full {
            Scope::All
        } else {
            Scope::Services(&rebuilt)
        };
        let report = self.sync.sync(scope, desired, &mut self.maps);
        // The zone follows the rebuilt services (those whose ClusterSet IPs may have moved
        // between them too), after the lb table has said which service owns each VIP.
        if let Some(dns) = &self.dns {
            let inputs = &self.inputs;
            let vips = &self.lb.table().vips;
            dns.sync(&rebuilt, |s| inputs.inputs(s), &self.policy, vips, full);
        }
        for service in &rebuilt {
            for w in self.lb.warnings_of(service) {
                warn!(object = %w.object, "{}", w.message);
            }
        }
        self.synced = true;
        if full {
            // The older layout's programs translated from its maps until now.
            let retired = loader::retire_older_versions(&self.pin_dir);
            if retired > 0 {
                info!(
                    links = retired,
                    "detached the links of older layout versions"
                );
            }
        }
        info!(
            services = rebuilt.len(),
            frontends = self.sync.frontend_count(),
            changed = report.changed.len(),
            failed = report.failed.len(),
            writes = report.writes,
            elapsed_us = started.elapsed().as_micros() as u64,
            "{}",
            if full {
                "maps synced (full)"
            } else {
                "maps synced"
            }
        );
        // Every rebuilt service was tried: those that failed before and fail again wait longer.
        for service in &rebuilt {
            self.retry.attempt(service);
        }
        let now = tokio::time::Instant::now();
        for failure in &report.failed {
            error!("{failure}");
            self.retry.failed(failure.service().clone(), now);
        }
        // A frontend whose delete failed twice is deleted by its service's next sync.
        for service in &report.undeleted {
            self.retry.failed(service.clone(), now);
        }
        self.retry.end_pass();
        for e in &report.delete_errors {
            warn!(
                error = %e,
                "a map delete failed twice; a frontend left this way keeps its old backends, id \
                 and slots until its service's retry deletes it, other entries are unreachable"
            );
        }
        for service in &report.changed {
            debug!(service = %service, "service written to the maps");
        }
        if full || rebuilt.len() >= crate::memory::LARGE_SYNC_SERVICES {
            crate::memory::release_freed();
        }
        Some(report)
    }

    /// When the retry of a failed write is next due: [`Node::apply`], with no changes then,
    /// tries it again.
    pub fn retry_deadline(&self) -> Option<tokio::time::Instant> {
        self.retry.deadline()
    }

    /// The lb table's warnings about the node's inputs (bad imports and slices it skipped).
    pub fn lb_warnings(&self) -> &[LbWarning] {
        &self.lb.table().warnings
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

/// `node --from-dir DIR`: the node role fed by a node directory, until SIGTERM or SIGINT.
pub async fn run_from_dir(
    dir: PathBuf,
    loader: &LoaderConfig,
    dns: &DnsOptions,
    policy: AddressPolicy,
) -> Result<(), NodeError> {
    let (node, _dns) = Node::start_with_dns(loader, dns)?;
    let node = node.with_policy(policy);
    let (tx, rx) = feed::channel();
    tokio::spawn(node_dir::watch(dir, tx));
    match run(node, rx, shutdown_signal()).await {
        Ended::Shutdown => Ok(()),
        Ended::SourceStopped => Err(NodeError::SourceStopped),
    }
}

/// Why the node role returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// `shutdown` resolved.
    Shutdown,
    /// Every sender of the input feed is gone: nothing will update the maps any more, so the
    /// caller should fail (and be restarted) rather than serve a frozen dataplane as healthy.
    SourceStopped,
}

/// Runs the node role until `shutdown` resolves or the input source stops, syncing after
/// every batch of changes, and trying failed writes again on their [`Retries`] schedule (a kernel
/// error such as ENOMEM on an update would otherwise wait for a change that may never come).
/// The dataplane stays in place afterwards.
pub async fn run(
    node: Node,
    changes: ChangeReceiver,
    shutdown: impl std::future::Future<Output = ()>,
) -> Ended {
    run_with(node, changes, shutdown, |_, _, _| {}).await
}

/// [`run`], calling `on_sync` with the report and duration of every sync (for metrics and the
/// readiness probe).
pub async fn run_with(
    mut node: Node,
    mut changes: ChangeReceiver,
    shutdown: impl std::future::Future<Output = ()>,
    mut on_sync: impl FnMut(&Node, &SyncReport, std::time::Duration),
) -> Ended {
    if let Some(logger) = node.take_logger() {
        tokio::spawn(pump_bpf_logs(logger));
    }
    tokio::pin!(shutdown);
    info!("waiting for the initial ServiceImports and EndpointSlices before syncing");
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            received = changes.recv_many(&mut batch, 4096) => {
                if received == 0 {
                    error!("the input source stopped; the maps keep their last state");
                    return Ended::SourceStopped;
                }
                // Everything queued is filed before the sync: a burst costs one sync.
                while let Ok(change) = changes.try_recv() {
                    batch.push(change);
                }
                let started = Instant::now();
                if let Some(report) = node.apply(batch.drain(..)) {
                    on_sync(&node, &report, started.elapsed());
                }
            }
            () = sleep_until(node.retry_deadline()) => {
                let started = Instant::now();
                if let Some(report) = node.apply(std::iter::empty()) {
                    on_sync(&node, &report, started.elapsed());
                }
            }
            () = &mut shutdown => {
                info!("shutting down; the dataplane stays in place");
                return Ended::Shutdown;
            }
        }
    }
}
