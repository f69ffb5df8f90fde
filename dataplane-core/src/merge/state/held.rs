//! Held imports: what a controller keeps of a member it has not heard from.
//!
//! A controller that starts while a member's API server is unreachable never lists that
//! member's Services and exports. Merged without them, a service that member alone exports
//! would lose its import, and its ClusterSet IP would go to the next new service; when the
//! member came back, the service would get another IP, under clients that cached the old one.
//! So the controller holds the imports that name such a member (their `status.clusters`)
//! until it is heard from: while no member makes anything of a held service, its output is
//! the held import and its IPs are nobody else's; while one does, the merge's import is the
//! output and the one held (so that, should that member stop exporting it too, the service
//! keeps its last import and IPs). Its slices are not held (the member's endpoints are
//! withdrawn, as a running controller withdraws an unreachable member's).

use super::*;

impl MergeState {
    /// Holds `imports` (replacing any held before), from the next full merge
    /// ([`MergeState::load`], [`MergeState::merge_all`]) on, until [`MergeState::release`].
    pub fn hold(&mut self, imports: impl IntoIterator<Item = ImportRecord>) {
        self.held = imports
            .into_iter()
            .map(|i| (i.service.clone(), i))
            .collect();
    }

    /// Ends the holds of `services`, which are marked in `dirty` to be merged again.
    pub fn release(
        &mut self,
        services: &BTreeSet<NamespacedName>,
        dirty: &mut BTreeSet<NamespacedName>,
    ) {
        for service in services {
            if self.held.remove(service).is_some() {
                dirty.insert(service.clone());
            }
        }
    }

    /// The held imports (the merge's last import of each service it made one of).
    pub fn held(&self) -> impl Iterator<Item = &ImportRecord> {
        self.held.values()
    }
}

/// The held services whose imports name `cluster` among their clusters.
pub(super) fn naming<'a>(
    held: &'a HashMap<NamespacedName, ImportRecord>,
    cluster: &'a ClusterId,
) -> impl Iterator<Item = NamespacedName> + 'a {
    held.iter()
        .filter(|(_, i)| i.status_clusters().any(|c| c == cluster.as_str()))
        .map(|(s, _)| s.clone())
}

/// What a held import is output as: itself, its `Ready` message saying which of its clusters
/// are withdrawn.
pub(super) fn held_output(
    held: &ImportRecord,
    statuses: Vec<ExportStatus>,
    withdrawn: &BTreeSet<ClusterId>,
    grace: Duration,
) -> ServiceOutput {
    let mut import = held.clone();
    super::batch::withdrawn_note(&mut import, withdrawn, grace);
    ServiceOutput {
        import: Some(crate::lb::inputs::record_input(import)),
        slices: Vec::new(),
        statuses,
        refused: Vec::new(),
    }
}
