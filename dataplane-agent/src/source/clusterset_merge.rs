//! Standalone mode's source: a ClusterSet directory merged in-process, kept up to date file by
//! file, feeding the node the changes of the services whose merge changed.
//!
//! The member records of each file ([`ClusterSetFiles`]) are fed to a [`MergeState`]; a batch
//! of file changes re-reads the files it names, applies what differs as
//! [`MemberChange`](dataplane_core::merge::MemberChange)s and
//! merges again only the services they touched ([`MergeState::update`]). The node gets
//! [`Change`]s only for the services whose output changed: their import and imported slices
//! added, changed or removed, against what it was sent. `clusterset.yaml` changing, or a
//! cluster directory appearing or going, reads and merges everything again (keeping the
//! ClusterSet IPs the imports hold).
//!
//! The importing cluster is fixed at start. Its current imports (sticky ClusterSet IPs) are
//! the ServiceImports in its directory at start, then the merge's own. A batch that cannot be
//! used (a broken `clusterset.yaml`, an invalid cluster directory, the importing cluster gone)
//! changes nothing, and the next batch tries again.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Arc,
};

use dataplane_core::{
    lb::inputs::{ImportInput, SliceInput},
    merge::{ClusterSetCidrs, MergeState},
    model::{ClusterId, NamespacedName, name::Name, records::ImportRecord},
    plan::Merged,
    policy::AddressPolicy,
};
use foldhash::HashMap;
use tracing::debug;

use super::{
    clusterset_dir::{PlanError, importing_cluster},
    clusterset_files::ClusterSetFiles,
    feed::Change,
    watch::Changes,
};

/// What the node was sent of one service.
#[derive(Debug, Default)]
struct Sent {
    import: Option<ImportInput>,
    /// By slice name: a sorted list, as a service has a slice or two per cluster.
    slices: litemap::LiteMap<Name, SliceInput>,
}

/// What an update did.
#[derive(Debug, Default)]
pub struct MergeUpdate {
    /// What the node must apply, deletions first.
    pub changes: Vec<Change>,
    /// The files read.
    pub read: Vec<PathBuf>,
    /// Whether the whole directory was read and merged again.
    pub reloaded: bool,
    /// The services whose merge changed.
    pub services: BTreeSet<NamespacedName>,
}

/// A ClusterSet directory merged for one importing cluster, file by file.
#[derive(Debug)]
pub struct ClusterSetMerge {
    dir: PathBuf,
    files: ClusterSetFiles,
    cluster: ClusterId,
    state: MergeState,
    /// Which endpoints are imported (from the configuration at start).
    policy: AddressPolicy,
    sent: HashMap<NamespacedName, Sent>,
    /// A reload failed: every batch reloads until one succeeds.
    reload_pending: bool,
}

impl ClusterSetMerge {
    /// The ClusterSet configuration in effect (clusterset.yaml).
    pub fn config(&self) -> &dataplane_core::merge::ClusterSetConfig {
        self.files.config()
    }

    /// Reads and merges `dir` for `cluster` (default: the first cluster id in sorted order),
    /// importing the endpoints `policy` of the ClusterSet's CIDRs allows (kept for the
    /// later merges); the merge and the node's first input, one complete change.
    pub fn start(
        dir: &Path,
        cluster: Option<&ClusterId>,
        policy: impl FnOnce(&ClusterSetCidrs) -> AddressPolicy,
    ) -> Result<(Self, Change), PlanError> {
        let files = ClusterSetFiles::load(dir)?;
        let cluster = importing_cluster(dir, files.cluster_ids(), files.config(), cluster)?;
        let policy = policy(&files.config().cidrs);
        let mut state = MergeState::new(files.config().clone(), cluster.clone());
        state.set_policy(policy.clone());
        state.load(&files.used_snapshots(), &files.imports(&cluster));
        let mut merge = ClusterSetMerge {
            dir: dir.to_owned(),
            files,
            cluster,
            state,
            policy,
            sent: HashMap::default(),
            reload_pending: false,
        };
        let services: Vec<NamespacedName> =
            merge.state.imports().map(|i| i.service.clone()).collect();
        // Everything is new: the changes are additions only.
        merge.node_changes(services);
        let change = Change::Snapshot {
            imports: merge
                .sent
                .values()
                .filter_map(|s| s.import.clone())
                .collect(),
            slices: merge
                .sent
                .values()
                .flat_map(|s| s.slices.values().cloned())
                .collect(),
        };
        Ok((merge, change))
    }

    /// The importing cluster.
    pub fn cluster(&self) -> &ClusterId {
        &self.cluster
    }

    /// Applies a batch of file changes. `Err` when the directory cannot be used: nothing
    /// changed, and the next batch reads everything again.
    pub fn update(&mut self, changes: &Changes) -> Result<MergeUpdate, PlanError> {
        if self.reload_pending || self.files.needs_reload(changes) {
            self.reload_pending = true;
            return self.reload();
        }
        let files = self.files.update(changes);
        let mut dirty = BTreeSet::new();
        for change in files.changes {
            self.state.apply(change, &mut dirty);
        }
        let services = self.state.update(&dirty);
        debug!(
            files = files.read.len(),
            touched = dirty.len(),
            changed = services.len(),
            "merged the changed files"
        );
        Ok(MergeUpdate {
            changes: self.node_changes(services.iter().cloned()),
            read: files.read,
            reloaded: false,
            services,
        })
    }

    /// Reads everything again and merges it, keeping the ClusterSet IPs the imports hold.
    fn reload(&mut self) -> Result<MergeUpdate, PlanError> {
        self.files.reload()?;
        let cluster = importing_cluster(
            &self.dir,
            self.files.cluster_ids(),
            self.files.config(),
            Some(&self.cluster),
        )?;
        let current: Vec<ImportRecord> = self.state.imports().cloned().collect();
        let mut state = MergeState::new(self.files.config().clone(), cluster);
        state.set_policy(self.policy.clone());
        state.load(&self.files.used_snapshots(), &current);
        // The node keeps the records it has; the new state shares those that did not change.
        state.keep_unchanged_records_of(&self.state);
        self.state = state;
        self.reload_pending = false;
        let mut services: BTreeSet<NamespacedName> = self.sent.keys().cloned().collect();
        services.extend(self.state.imports().map(|i| i.service.clone()));
        let changes = self.node_changes(services.iter().cloned());
        debug!(
            services = services.len(),
            "merged the whole directory again"
        );
        Ok(MergeUpdate {
            changes,
            read: Vec::new(),
            reloaded: true,
            services,
        })
    }

    /// The node changes that bring `services` to their merge output, deletions first.
    fn node_changes(&mut self, services: impl IntoIterator<Item = NamespacedName>) -> Vec<Change> {
        let mut deleted = Vec::new();
        let mut upserted = Vec::new();
        for service in services {
            let out = self.state.service(&service);
            let sent = self.sent.entry(service.clone()).or_default();
            // The merge's own record is what the node files (shared, not copied).
            match (out.and_then(|o| o.import.as_ref()), &sent.import) {
                (Some(new), Some(old)) if Arc::ptr_eq(new, old) || new == old => {}
                (Some(new), _) => {
                    upserted.push(Change::Import(Arc::clone(new)));
                    sent.import = Some(Arc::clone(new));
                }
                (None, Some(_)) => {
                    deleted.push(Change::ImportDeleted(service.clone()));
                    sent.import = None;
                }
                (None, None) => {}
            }
            let slices = out.map(|o| o.slices.as_slice()).unwrap_or(&[]);
            let gone: Vec<Name> = sent
                .slices
                .keys()
                .filter(|name| !slices.iter().any(|s| *s.id().name == **name))
                .cloned()
                .collect();
            for name in gone {
                sent.slices.remove(&name);
                deleted.push(Change::SliceDeleted(NamespacedName::new(
                    service.namespace.clone(),
                    name,
                )));
            }
            for slice in slices {
                let Some(record) = slice.record() else {
                    continue; // the merge's slices are all usable
                };
                if sent
                    .slices
                    .get(&record.name)
                    .is_some_and(|old| Arc::ptr_eq(old, slice) || old == slice)
                {
                    continue;
                }
                upserted.push(Change::Slice(Arc::clone(slice)));
                sent.slices.insert(record.name.clone(), Arc::clone(slice));
            }
            if sent.import.is_none() && sent.slices.is_empty() {
                self.sent.remove(&service);
            }
        }
        deleted.extend(upserted);
        deleted
    }

    /// The merge as `plan` and the report see it: the output, every unusable document, the
    /// duplicates and the file of each object.
    pub fn merged(&self) -> Merged {
        let mut merge = self.state.output();
        merge.diagnostics.extend(self.files.duplicates());
        merge.diagnostics.sort();
        merge.diagnostics.dedup();
        Merged {
            cluster: self.cluster.clone(),
            merge,
            manifest_errors: self.files.errors(),
            sources: self.files.sources(),
            cidrs: self.config().cidrs,
        }
    }

    /// The importing cluster's current imports.
    pub fn imports(&self) -> Vec<ImportRecord> {
        self.state.imports().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use dataplane_core::{lb::inputs::InputIndex, merge::ConditionType};

    use super::*;
    use crate::source::clusterset_dir;

    const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/clusterset");

    fn copy_example(to: &Path) {
        for entry in std::fs::read_dir(EXAMPLE).expect("example") {
            let path = entry.expect("entry").path();
            let target = to.join(path.file_name().expect("name"));
            if path.is_dir() {
                std::fs::create_dir_all(&target).expect("mkdir");
                for f in std::fs::read_dir(&path).expect("cluster dir") {
                    let f = f.expect("entry").path();
                    std::fs::copy(&f, target.join(f.file_name().expect("name"))).expect("copy");
                }
            } else {
                std::fs::copy(&path, &target).expect("copy");
            }
        }
    }

    /// Writes `text` to `dir/file` atomically.
    fn write(dir: &Path, file: &str, text: &str) {
        let path = dir.join(file);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
    }

    fn batch(paths: &[&str]) -> Changes {
        Changes {
            paths: paths.iter().map(PathBuf::from).collect(),
            rescan: false,
        }
    }

    /// The node's inputs by service, as text.
    fn view(index: &InputIndex) -> BTreeMap<String, String> {
        index
            .services()
            .map(|s| {
                let inputs = index.inputs(s);
                let imports: Vec<_> = inputs.imports.iter().map(|i| i.record()).collect();
                let slices: Vec<_> = inputs.slices.iter().map(|i| i.record()).collect();
                (s.to_string(), format!("{imports:?} {slices:?}"))
            })
            .collect()
    }

    /// The standalone source and the node index it feeds, checked against a one-shot merge.
    struct Run {
        dir: tempfile::TempDir,
        merge: ClusterSetMerge,
        node: InputIndex,
    }

    impl Run {
        fn start() -> Run {
            let dir = tempfile::tempdir().expect("tempdir");
            copy_example(dir.path());
            let cluster = ClusterId::new("cluster-a").expect("id");
            let (merge, first) =
                ClusterSetMerge::start(dir.path(), Some(&cluster), AddressPolicy::for_cidrs)
                    .expect("start");
            let mut node = InputIndex::default();
            node.apply(first, &mut BTreeSet::new());
            let run = Run { dir, merge, node };
            run.check();
            run
        }

        fn update(&mut self, changes: &Changes) -> MergeUpdate {
            let update = self.merge.update(changes).expect("update");
            for c in update.changes.clone() {
                self.node.apply(c, &mut BTreeSet::new());
            }
            update
        }

        /// The state equals a full merge of the directory with the current imports, and the
        /// node was sent exactly that merge's imports and slices.
        fn check(&self) {
            let full = clusterset_dir::merge(
                self.dir.path(),
                Some(self.merge.cluster()),
                Some(&self.merge.imports()),
            )
            .expect("merge");
            assert_eq!(self.merge.merged(), full);
            let mut fresh = InputIndex::default();
            fresh.apply(full.change(), &mut BTreeSet::new());
            assert_eq!(view(&self.node), view(&fresh));
        }

        fn edit(&self, file: &str, from: &str, to: &str) {
            let path = self.dir.path().join(file);
            let text = std::fs::read_to_string(&path).expect("read");
            let edited = text.replacen(from, to, 1);
            assert_ne!(text, edited, "{from:?} is in {file}");
            write(self.dir.path(), file, &edited);
        }
    }

    fn names(services: &BTreeSet<NamespacedName>) -> Vec<String> {
        services.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn an_edit_re_reads_that_file_and_re_merges_the_services_it_touched() {
        let mut run = Run::start();
        run.edit(
            "cluster-b/services.yaml",
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n",
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n  - {name: metrics, protocol: TCP, port: 9100, targetPort: 9100}\n",
        );
        // Its slice carries the port too, so cluster-b now serves web's metrics.
        run.edit(
            "cluster-b/services.yaml",
            "- {name: http, protocol: TCP, port: 8080}\nendpoints:\n- addresses: [10.99.2.10]",
            "- {name: http, protocol: TCP, port: 8080}\n- {name: metrics, protocol: TCP, port: 9100}\nendpoints:\n- addresses: [10.99.2.10]",
        );
        let update = run.update(&batch(&[
            "cluster-b/services.tmp",
            "cluster-b/services.yaml",
        ]));
        assert_eq!(
            update.read,
            [run.dir.path().join("cluster-b/services.yaml")]
        );
        assert!(!update.reloaded);
        assert_eq!(names(&update.services), ["demo/web"]);
        assert!(!update.changes.is_empty());
        run.check();
        // Unrelated paths read nothing.
        let update = run.update(&batch(&[
            "README.md",
            "cluster-b/notes.txt",
            "cluster-x/a.yaml",
        ]));
        assert!(update.read.is_empty() && update.changes.is_empty());
    }

    /// Standalone mode reports refused endpoints as the controller does: left out of the
    /// imported slice, `EndpointsRefused` on the member's export in the report, and a
    /// diagnostic naming the slice and its file; gone with them.
    #[test]
    fn refused_endpoints_are_left_out_and_reported() {
        let mut run = Run::start();
        let (good, bad) = (
            "endpoints:\n- addresses: [10.99.2.10]",
            "endpoints:\n- addresses: [127.0.0.1]\n- addresses: [10.99.2.10]",
        );
        run.edit("cluster-b/services.yaml", good, bad);
        run.update(&batch(&["cluster-b/services.yaml"]));
        run.check();
        let merged = run.merge.merged();
        let imported: Vec<String> = merged
            .merge
            .endpoint_slices
            .iter()
            .flat_map(|s| s.endpoints.list().map(|e| e.addr.to_string()))
            .collect();
        assert!(imported.contains(&"10.99.2.10".to_owned()), "{imported:?}");
        assert!(!imported.contains(&"127.0.0.1".to_owned()), "{imported:?}");
        let refused: Vec<(String, String)> = merged
            .merge
            .export_statuses
            .iter()
            .filter(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == ConditionType::EndpointsRefused)
            })
            .map(|s| (s.cluster.to_string(), s.service.to_string()))
            .collect();
        assert_eq!(refused, [("cluster-b".to_owned(), "demo/web".to_owned())]);
        let report = merged.report_yaml(&[]);
        assert!(report.contains("reason: LoopbackAddress"), "{report}");
        let diagnostics: Vec<String> = merged
            .diagnostics(&[])
            .iter()
            .filter(|d| d.message.contains("127.0.0.1"))
            .map(|d| format!("{:?} {:?} {}", d.file, d.object, d.message))
            .collect();
        assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
        assert!(
            diagnostics[0].contains("cluster-b/services.yaml")
                && diagnostics[0].contains("is a loopback address; not imported"),
            "{diagnostics:?}"
        );

        run.edit("cluster-b/services.yaml", bad, good);
        run.update(&batch(&["cluster-b/services.yaml"]));
        run.check();
        let report = run.merge.merged().report_yaml(&[]);
        assert!(!report.contains("EndpointsRefused"), "{report}");
    }

    #[test]
    fn files_added_moved_removed_and_duplicated_follow_a_full_merge() {
        let mut run = Run::start();
        let cache = "apiVersion: v1\nkind: Service\nmetadata: {name: cache, namespace: demo}\nspec: {ipFamilies: [IPv4], ports: [{name: redis, port: 6379}]}\n---\napiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceExport\nmetadata: {name: cache, namespace: demo}\n";
        write(run.dir.path(), "cluster-c/cache.yaml", cache);
        let update = run.update(&batch(&["cluster-c/cache.yaml"]));
        assert_eq!(names(&update.services), ["demo/cache"]);
        run.check();
        // Moved to another file of the cluster in one batch: no service changes.
        std::fs::remove_file(run.dir.path().join("cluster-c/cache.yaml")).expect("remove");
        write(run.dir.path(), "cluster-c/moved.yaml", cache);
        let update = run.update(&batch(&["cluster-c/cache.yaml", "cluster-c/moved.yaml"]));
        assert!(update.services.is_empty() && update.changes.is_empty());
        run.check();
        // Defined twice, differently: one definition is used and the duplicate reported.
        write(
            run.dir.path(),
            "cluster-c/again.yaml",
            &cache.replace("port: 6379", "port: 6380"),
        );
        run.update(&batch(&["cluster-c/again.yaml"]));
        run.check();
        let duplicate = run
            .merge
            .merged()
            .merge
            .diagnostics
            .into_iter()
            .any(|d| d.object == "Service demo/cache" && d.message == DUPLICATE_MESSAGE);
        assert!(duplicate);
        // Removed: the service goes.
        for f in ["moved.yaml", "again.yaml"] {
            std::fs::remove_file(run.dir.path().join("cluster-c").join(f)).expect("remove");
        }
        let update = run.update(&batch(&["cluster-c/moved.yaml", "cluster-c/again.yaml"]));
        assert_eq!(names(&update.services), ["demo/cache"]);
        assert!(
            update
                .changes
                .iter()
                .any(|c| matches!(c, Change::ImportDeleted(s) if s.name.as_ref() == "cache"))
        );
        run.check();
    }

    const DUPLICATE_MESSAGE: &str = dataplane_core::merge::DUPLICATE;

    #[test]
    fn a_half_written_file_keeps_its_last_good_objects_and_reports_the_error() {
        let mut run = Run::start();
        let before = run.merge.merged().merge;
        let path = run.dir.path().join("cluster-b/services.yaml");
        let text = std::fs::read_to_string(&path).expect("read");
        write(
            run.dir.path(),
            "cluster-b/services.yaml",
            &format!("{}\n- [unclosed", &text[..text.len() / 2]),
        );
        let update = run.update(&batch(&["cluster-b/services.yaml"]));
        assert_eq!(update.read, std::slice::from_ref(&path));
        assert!(update.changes.is_empty(), "{:?}", update.changes);
        let merged = run.merge.merged();
        assert_eq!(merged.merge, before, "the merge is the last good one");
        assert!(
            merged
                .manifest_errors
                .iter()
                .any(|e| e.file == path && e.message.starts_with("malformed YAML")),
            "{:?}",
            merged.manifest_errors
        );
        write(run.dir.path(), "cluster-b/services.yaml", &text);
        let update = run.update(&batch(&["cluster-b/services.yaml"]));
        assert!(update.changes.is_empty());
        run.check();
    }

    #[test]
    fn the_configuration_and_cluster_directories_reload_and_a_bad_one_keeps_the_last_good_state() {
        let mut run = Run::start();
        let config = std::fs::read_to_string(run.dir.path().join("clusterset.yaml")).expect("read");
        write(
            run.dir.path(),
            "clusterset.yaml",
            &config.replace("ipFamilyPolicy: Union", "ipFamilyPolicy: Intersection"),
        );
        let update = run.update(&batch(&["clusterset.yaml"]));
        assert!(update.reloaded);
        run.check();
        // Broken: nothing changes, and an edit in the meantime waits for the fix.
        let good = run.merge.merged();
        write(
            run.dir.path(),
            "clusterset.yaml",
            "ipFamilyPolicy: Majority\n",
        );
        assert!(run.merge.update(&batch(&["clusterset.yaml"])).is_err());
        run.edit(
            "cluster-b/services.yaml",
            "addresses: [10.99.2.11]",
            "addresses: [10.99.2.12]",
        );
        assert!(
            run.merge
                .update(&batch(&["cluster-b/services.yaml"]))
                .is_err()
        );
        assert_eq!(run.merge.merged().merge, good.merge);
        write(run.dir.path(), "clusterset.yaml", &config);
        let update = run.update(&batch(&["clusterset.yaml"]));
        assert!(update.reloaded && !update.changes.is_empty());
        run.check();
        // A new cluster directory, then an invalid one (kept out until it is removed).
        std::fs::create_dir(run.dir.path().join("cluster-d")).expect("mkdir");
        std::fs::copy(
            run.dir.path().join("cluster-c/services.yaml"),
            run.dir.path().join("cluster-d/services.yaml"),
        )
        .expect("copy");
        assert!(
            run.update(&batch(&["cluster-d", "cluster-d/services.yaml"]))
                .reloaded
        );
        run.check();
        std::fs::create_dir(run.dir.path().join("Not_An_Id")).expect("mkdir");
        assert!(run.merge.update(&batch(&["Not_An_Id"])).is_err());
        std::fs::remove_dir(run.dir.path().join("Not_An_Id")).expect("rmdir");
        assert!(run.update(&batch(&["Not_An_Id"])).reloaded);
        run.check();
        // The importing cluster's directory goes: it stays the importing cluster (listed in
        // clusterset.yaml), importing what the others export.
        std::fs::remove_dir_all(run.dir.path().join("cluster-a")).expect("rm");
        assert!(run.update(&batch(&["cluster-a"])).reloaded);
        run.check();
    }
}
