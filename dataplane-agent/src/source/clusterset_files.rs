//! A ClusterSet directory kept cluster by cluster and file by file: the member records each
//! file of `DIR/<cluster-id>/` defines ([`FileObjects`]), so a change to a file re-reads that
//! file alone and gives the [`MemberChange`]s of what differs ([`ClusterSetFiles::update`]).
//!
//! `clusterset.yaml` changing, or a cluster directory appearing or going, reads everything
//! again ([`ClusterSetFiles::reload`]). Either way a file that cannot be read or has a YAML
//! syntax error keeps its last good objects (and its error is reported); a file with some
//! unusable documents keeps the good ones; a file that is gone deletes its objects. An object
//! defined more than once in a cluster is used in the definition the merge would pick (the
//! smallest), and reported as the merge reports it.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use dataplane_core::{
    merge::{ClusterSetConfig, ClusterSnapshot, DUPLICATE, Diagnostic, MemberChange},
    model::{
        ClusterId, IdRef, Interner,
        by_id::Identified,
        member::{ExportRecord, LocalSlice, ServiceRecord},
        records::ImportRecord,
    },
};
use tracing::debug;

use super::{
    clusterset_dir::{CONFIG_FILE, ClusterSetDirError, cluster_dirs, io, read_config},
    file_index::{Before, FileName, FileObjects, Rank},
    manifests::{Manifest, ManifestError, Reread, is_yaml_name, reread, yaml_files},
    watch::Changes,
};

/// A member object of a cluster's file, converted as it is decoded.
enum MemberObject {
    Service(Arc<ServiceRecord>),
    Export(Arc<ExportRecord>),
    Slice(Arc<LocalSlice>),
    /// The cluster's current import (sticky ClusterSet IPs).
    Import(Arc<ImportRecord>),
}

impl MemberObject {
    fn of(
        m: Manifest,
        names: &Interner,
        file: &Path,
        document: usize,
    ) -> Result<MemberObject, ManifestError> {
        Ok(match m {
            Manifest::Service(s) => {
                MemberObject::Service(Arc::new(ServiceRecord::from_k8s(&s, names)))
            }
            Manifest::ServiceExport(e) => {
                MemberObject::Export(Arc::new(ExportRecord::from_k8s(&e, names)))
            }
            Manifest::EndpointSlice(s) => {
                MemberObject::Slice(Arc::new(LocalSlice::from_k8s(&s, names)))
            }
            Manifest::ServiceImport(si) => {
                let converted = ImportRecord::from_k8s(&si, names, true);
                let id = converted.id().to_owned();
                let record = converted.into_record().ok_or_else(|| ManifestError {
                    file: file.to_owned(),
                    document,
                    object: Some(format!("ServiceImport {id}")),
                    message: "not a usable ServiceImport".into(),
                })?;
                MemberObject::Import(Arc::new(record))
            }
        })
    }
}

/// What is known of one file.
#[derive(Clone, Debug, Default)]
struct FileState {
    /// The documents of its last read that could not be used.
    errors: Vec<ManifestError>,
    /// Whether it has been parsed: whether it has last good objects to keep.
    parsed: bool,
    /// Whether it is a symlink (read again with every batch).
    symlink: bool,
}

/// The used definitions an update replaces, by kind.
#[derive(Default)]
struct Pending {
    services: Before<Arc<ServiceRecord>>,
    exports: Before<Arc<ExportRecord>>,
    slices: Before<Arc<LocalSlice>>,
    imports: Before<Arc<ImportRecord>>,
}

/// One cluster's directory, file by file.
#[derive(Clone, Debug, Default)]
struct ClusterFiles {
    path: PathBuf,
    files: BTreeMap<FileName, FileState>,
    services: FileObjects<Arc<ServiceRecord>>,
    exports: FileObjects<Arc<ExportRecord>>,
    slices: FileObjects<Arc<LocalSlice>>,
    imports: FileObjects<Arc<ImportRecord>>,
}

impl ClusterFiles {
    /// Reads one file and files what it defines now.
    fn read(&mut self, file: FileName, names: &Interner, pending: &mut Pending) {
        let has_good = self.files.get(&file).is_some_and(|f| f.parsed);
        let reading = reread(&file, has_good, |document, m| {
            MemberObject::of(m, names, &file, document)
        });
        let objects = match reading.objects {
            Reread::Forget => {
                self.forget(&file, pending);
                return;
            }
            Reread::Keep => {
                let state = self.files.entry(file).or_default();
                state.errors = reading.errors;
                state.symlink = reading.symlink;
                return;
            }
            Reread::Replace(objects) => objects,
        };
        self.files.insert(
            file.clone(),
            FileState {
                errors: reading.errors,
                parsed: true,
                symlink: reading.symlink,
            },
        );
        let (mut services, mut exports, mut slices, mut imports) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (document, object) in objects {
            match object {
                MemberObject::Service(s) => services.push((document, s)),
                MemberObject::Export(e) => exports.push((document, e)),
                MemberObject::Slice(s) => slices.push((document, s)),
                MemberObject::Import(i) => imports.push((document, i)),
            }
        }
        debug!(
            file = %file.display(),
            services = services.len(),
            exports = exports.len(),
            slices = slices.len(),
            "read a cluster file"
        );
        self.services
            .replace(&file, services, &mut pending.services);
        self.exports.replace(&file, exports, &mut pending.exports);
        self.slices.replace(&file, slices, &mut pending.slices);
        self.imports.replace(&file, imports, &mut pending.imports);
        self.services.warn_duplicates(&file, "Service");
        self.exports.warn_duplicates(&file, "ServiceExport");
        self.slices.warn_duplicates(&file, "EndpointSlice");
    }

    fn forget(&mut self, file: &FileName, pending: &mut Pending) {
        if self.files.remove(file).is_none() {
            return;
        }
        self.services
            .replace(file, Vec::new(), &mut pending.services);
        self.exports.replace(file, Vec::new(), &mut pending.exports);
        self.slices.replace(file, Vec::new(), &mut pending.slices);
        self.imports.replace(file, Vec::new(), &mut pending.imports);
        debug!(file = %file.display(), "cluster file removed; its objects are deleted");
    }

    /// Reads every file listed, and forgets the ones no longer listed.
    fn rescan(&mut self, listed: Vec<PathBuf>, names: &Interner) {
        let listed: Vec<FileName> = listed.into_iter().map(Arc::from).collect();
        let mut pending = Pending::default();
        let gone: Vec<FileName> = self
            .files
            .keys()
            .filter(|f| listed.binary_search(f).is_err())
            .cloned()
            .collect();
        for file in gone {
            self.forget(&file, &mut pending);
        }
        for file in listed {
            self.read(file, names, &mut pending);
        }
    }

    /// The member changes of an update, deletions first.
    fn changes(&self, cluster: &ClusterId, pending: Pending) -> Vec<MemberChange> {
        let mut deleted = Vec::new();
        let mut upserted = Vec::new();
        let c = || cluster.clone();
        for (id, new) in self.services.changes(pending.services) {
            match new {
                Some(v) => upserted.push(MemberChange::Service(c(), v)),
                None => deleted.push(MemberChange::ServiceDeleted(c(), id)),
            }
        }
        for (id, new) in self.exports.changes(pending.exports) {
            match new {
                Some(v) => upserted.push(MemberChange::Export(c(), v)),
                None => deleted.push(MemberChange::ExportDeleted(c(), id)),
            }
        }
        for (id, new) in self.slices.changes(pending.slices) {
            match new {
                Some(v) => upserted.push(MemberChange::Slice(c(), v)),
                None => deleted.push(MemberChange::SliceDeleted(c(), id)),
            }
        }
        deleted.extend(upserted);
        deleted
    }
}

/// What an update read.
#[derive(Debug, Default)]
pub struct FilesUpdate {
    /// The member changes, deletions first.
    pub changes: Vec<MemberChange>,
    /// The files read, in order.
    pub read: Vec<PathBuf>,
}

/// A ClusterSet directory, cluster by cluster and file by file.
#[derive(Debug)]
pub struct ClusterSetFiles {
    dir: PathBuf,
    config: ClusterSetConfig,
    clusters: BTreeMap<ClusterId, ClusterFiles>,
    /// Purged after a reload, and by itself as names come and go.
    names: Interner,
}

impl ClusterSetFiles {
    /// Reads the directory: its configuration and every cluster's files.
    pub fn load(dir: &Path) -> Result<ClusterSetFiles, ClusterSetDirError> {
        let mut files = ClusterSetFiles {
            dir: dir.to_owned(),
            config: ClusterSetConfig::default(),
            clusters: BTreeMap::new(),
            names: Interner::new(),
        };
        files.reload()?;
        Ok(files)
    }

    /// Reads the configuration, the cluster directories and every file again. Files keep
    /// their last good objects; on an error (a broken `clusterset.yaml`, a directory that
    /// is no valid cluster id or cannot be listed) nothing changes.
    pub fn reload(&mut self) -> Result<(), ClusterSetDirError> {
        let config = read_config(&self.dir)?;
        let mut listed = Vec::new();
        for (cluster, path) in cluster_dirs(&self.dir)? {
            let files = yaml_files(&path).map_err(io(&path))?;
            listed.push((cluster, path, files));
        }
        self.config = config;
        let mut old = std::mem::take(&mut self.clusters);
        for (cluster, path, files) in listed {
            let mut c = old
                .remove(&cluster)
                .filter(|c| c.path == path)
                .unwrap_or_else(|| ClusterFiles {
                    path,
                    ..Default::default()
                });
            c.rescan(files, &self.names);
            self.clusters.insert(cluster, c);
        }
        self.names.purge();
        Ok(())
    }

    /// Whether `changes` needs the whole directory read again: a rescan, `clusterset.yaml`, or
    /// a cluster directory that appeared, went or was replaced.
    pub fn needs_reload(&self, changes: &Changes) -> bool {
        changes.rescan
            || changes.paths.iter().any(|p| {
                let mut parts = p.components();
                let Some(top) = parts.next().map(|c| c.as_os_str()) else {
                    return false;
                };
                let known = top
                    .to_str()
                    .is_some_and(|t| self.clusters.keys().any(|c| c.as_str() == t));
                let hidden = top.as_encoded_bytes().starts_with(b".");
                let is_top = parts.next().is_none();
                (is_top && (top == CONFIG_FILE || known))
                    || (!known && !hidden && self.dir.join(top).is_dir())
            })
    }

    /// Reads again the files of known clusters that `changes` names, and every symlinked
    /// file; what differs as member changes. (A batch that [`needs_reload`] wants
    /// [`ClusterSetFiles::reload`] instead.)
    ///
    /// [`needs_reload`]: ClusterSetFiles::needs_reload
    pub fn update(&mut self, changes: &Changes) -> FilesUpdate {
        let mut wanted: BTreeMap<ClusterId, Vec<FileName>> = BTreeMap::new();
        for p in &changes.paths {
            let (Some(cluster), Some(name)) = (p.parent(), p.file_name()) else {
                continue;
            };
            if cluster.parent() != Some(Path::new("")) || !is_yaml_name(name) {
                continue;
            }
            let Some((id, c)) = self
                .clusters
                .iter()
                .find(|(id, _)| Path::new(id.as_str()) == cluster)
            else {
                continue;
            };
            wanted
                .entry(id.clone())
                .or_default()
                .push(Arc::from(c.path.join(name)));
        }
        for (id, c) in &self.clusters {
            let symlinked = c.files.iter().filter(|(_, s)| s.symlink);
            wanted
                .entry(id.clone())
                .or_default()
                .extend(symlinked.map(|(f, _)| f.clone()));
        }
        let mut out = FilesUpdate::default();
        for (id, mut files) in wanted {
            let Some(c) = self.clusters.get_mut(&id) else {
                continue;
            };
            files.sort();
            files.dedup();
            let mut pending = Pending::default();
            for file in files {
                out.read.push(file.to_path_buf());
                c.read(file, &self.names, &mut pending);
            }
            out.changes.extend(c.changes(&id, pending));
        }
        out
    }

    /// The configuration.
    pub fn config(&self) -> &ClusterSetConfig {
        &self.config
    }

    /// The cluster ids, sorted.
    pub fn cluster_ids(&self) -> impl Iterator<Item = &ClusterId> {
        self.clusters.keys()
    }

    /// One snapshot per cluster (sorted) with every definition, duplicates included, in file
    /// and document order: what a one-shot merge reads.
    pub fn snapshots(&self) -> Vec<ClusterSnapshot> {
        self.snapshots_of(true)
    }

    /// One snapshot per cluster with the used definition of each object only.
    pub fn used_snapshots(&self) -> Vec<ClusterSnapshot> {
        self.snapshots_of(false)
    }

    fn snapshots_of(&self, every: bool) -> Vec<ClusterSnapshot> {
        fn pick<V: Clone + PartialEq + Rank + Identified>(
            objects: &FileObjects<V>,
            every: bool,
        ) -> Vec<V> {
            if every {
                objects.all().map(|(_, v)| v.clone()).collect()
            } else {
                objects.used().map(|(_, v)| v.clone()).collect()
            }
        }
        self.clusters
            .iter()
            .map(|(id, c)| ClusterSnapshot {
                cluster: id.clone(),
                services: pick(&c.services, every),
                service_exports: pick(&c.exports, every),
                endpoint_slices: pick(&c.slices, every),
            })
            .collect()
    }

    /// The ServiceImports in `cluster`'s directory (its current imports), every definition.
    pub fn imports(&self, cluster: &ClusterId) -> Vec<ImportRecord> {
        self.clusters
            .get(cluster)
            .map(|c| {
                c.imports
                    .all()
                    .map(|(_, v)| ImportRecord::clone(v))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every document that could not be used, sorted by file and document.
    pub fn errors(&self) -> Vec<ManifestError> {
        let mut out: Vec<ManifestError> = self
            .clusters
            .values()
            .flat_map(|c| c.files.values().flat_map(|f| f.errors.iter().cloned()))
            .collect();
        out.sort_by(|a, b| {
            (&a.file, a.document, &a.message).cmp(&(&b.file, b.document, &b.message))
        });
        out
    }

    /// The file each object comes from (the smallest path when it is defined more than once),
    /// by cluster and `Kind namespace/name`.
    pub fn sources(&self) -> BTreeMap<(ClusterId, String), PathBuf> {
        let mut out = BTreeMap::new();
        for (id, c) in &self.clusters {
            let mut add = |kind: &str, files: &mut dyn Iterator<Item = (IdRef<'_>, &FileName)>| {
                for (object, file) in files {
                    out.insert((id.clone(), format!("{kind} {object}")), file.to_path_buf());
                }
            };
            add("Service", &mut c.services.first_files());
            add("ServiceExport", &mut c.exports.first_files());
            add("EndpointSlice", &mut c.slices.first_files());
            add("ServiceImport", &mut c.imports.first_files());
        }
        out
    }

    /// The member objects defined more than once in their cluster, as the merge reports them.
    pub fn duplicates(&self) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        for (id, c) in &self.clusters {
            let mut add = |kind: &str, ids: &mut dyn Iterator<Item = IdRef<'_>>| {
                for object in ids {
                    out.push(Diagnostic {
                        cluster: Some(id.clone()),
                        object: format!("{kind} {object}"),
                        message: DUPLICATE.into(),
                    });
                }
            };
            add("Service", &mut c.services.duplicates().map(|(i, _)| i));
            add("ServiceExport", &mut c.exports.duplicates().map(|(i, _)| i));
            add("EndpointSlice", &mut c.slices.duplicates().map(|(i, _)| i));
        }
        out.sort();
        out
    }
}
