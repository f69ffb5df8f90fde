//! A node directory (`node --from-dir DIR`): YAML files holding the local cluster's
//! ServiceImports and imported EndpointSlices, kept file by file.
//!
//! The first read sends one complete [`Change::Snapshot`]. After that, a batch of changes
//! re-reads only the files it names ([`NodeDir::update`]) and sends, as one
//! [`Change::Batch`], [`Change::Import`], [`Change::ImportDeleted`], [`Change::Slice`] and
//! [`Change::SliceDeleted`] for the objects whose used definition differs ([`FileObjects`]);
//! a removed file deletes its objects. A file
//! that cannot be read or has a YAML syntax error (half-written, broken) keeps its last good
//! objects (and a file still open for writing is not read until it is closed, or
//! [`super::watch::WRITE_WAIT`] has passed); a file with some unusable documents keeps the good ones. An object defined more
//! than once is used in its smallest definition and reported. A directory that cannot be
//! listed keeps everything.
//!
//! Files that are symlinks are read again with every batch: their target can change without
//! an event on their own path (a ConfigMap volume swaps its `..data` link).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use dataplane_core::{
    lb::inputs::{ImportInput, SliceInput, import_input, slice_input},
    model::{EndpointSlice, Interner, LABEL_SERVICE_NAME, ServiceImport},
};
use tracing::{debug, error};

use super::{
    feed::{Change, ChangeSender},
    file_index::{Before, FileName, FileObjects},
    manifests::{self, FileRead, Manifest, ManifestError, Reread, read_file},
    watch::{Changes, DirWatcher},
};

/// What the node role routes from, as API objects (for `explain` and tests).
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

/// A document the node reads: a ServiceImport or an imported EndpointSlice.
enum NodeManifest {
    Import(Box<ServiceImport>),
    Slice(Box<EndpointSlice>),
}

/// The objects the node reads; `Err` for the others.
fn node_manifest(m: Manifest, file: &Path, document: usize) -> Result<NodeManifest, ManifestError> {
    let mut object = m.describe();
    match m {
        Manifest::ServiceImport(si) => return Ok(NodeManifest::Import(si)),
        Manifest::EndpointSlice(s)
            if s.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(LABEL_SERVICE_NAME)) =>
        {
            return Ok(NodeManifest::Slice(s));
        }
        Manifest::EndpointSlice(_) => object.push_str(&format!(" (no {LABEL_SERVICE_NAME} label)")),
        Manifest::Service(_) | Manifest::ServiceExport(_) => {}
    }
    Err(ManifestError {
        file: file.to_owned(),
        document,
        object: Some(object),
        message: "ignored: the node role reads ServiceImports and imported EndpointSlices only"
            .into(),
    })
}

/// Reads ServiceImports and imported EndpointSlices (label
/// `multicluster.kubernetes.io/service-name`) from the YAML files in `dir`, as API objects
/// (`explain` reads them once). Other objects are reported and ignored.
pub fn read(dir: &Path) -> std::io::Result<(NodeInputs, Vec<ManifestError>)> {
    let mut inputs = NodeInputs::default();
    let mut errors = Vec::new();
    for file in manifests::yaml_files(dir)? {
        let read = read_file(&file, |document, m| node_manifest(m, &file, document));
        match read {
            FileRead::Parsed {
                objects, errors: e, ..
            } => {
                errors.extend(e);
                for (_, m) in objects {
                    match m {
                        NodeManifest::Import(si) => inputs.imports.push(*si),
                        NodeManifest::Slice(s) => inputs.slices.push(*s),
                    }
                }
            }
            FileRead::Unreadable(e) => errors.push(e),
            FileRead::Gone => {}
        }
    }
    Ok((inputs, errors))
}

/// An object of a node file, converted as it is decoded.
enum NodeObject {
    Import(ImportInput),
    Slice(SliceInput),
}

/// What one update did.
#[derive(Debug, Default)]
pub struct Update {
    /// What the node must apply, deletions first.
    pub changes: Vec<Change>,
    /// The files read, in order.
    pub read: Vec<PathBuf>,
}

/// The used definitions the current update replaces.
#[derive(Default)]
struct Pending {
    imports: Before<ImportInput>,
    slices: Before<SliceInput>,
}

/// A node directory, kept file by file.
pub struct NodeDir {
    dir: PathBuf,
    /// Purged after a load, and by itself as names come and go.
    names: Interner,
    /// The YAML files read, and whether each is a symlink.
    files: BTreeMap<FileName, bool>,
    imports: FileObjects<ImportInput>,
    slices: FileObjects<SliceInput>,
}

impl NodeDir {
    /// Reads every file of `dir`: the state, and every object as one complete change.
    pub fn load(dir: &Path) -> std::io::Result<(NodeDir, Change)> {
        let mut state = NodeDir {
            dir: dir.to_owned(),
            names: Interner::new(),
            files: BTreeMap::new(),
            imports: FileObjects::default(),
            slices: FileObjects::default(),
        };
        let mut pending = Pending::default();
        for file in manifests::yaml_files(dir)? {
            state.read(Arc::from(file), &mut pending);
        }
        state.names.purge();
        let change = Change::Snapshot {
            imports: state.imports.used().map(|(_, v)| v.clone()).collect(),
            slices: state.slices.used().map(|(_, v)| v.clone()).collect(),
        };
        Ok((state, change))
    }

    /// Reads again the files `changes` names (everything when it asks for a rescan) and the
    /// symlinked files, and returns what differs.
    pub fn update(&mut self, changes: &Changes) -> Update {
        let mut pending = Pending::default();
        let mut read = Vec::new();
        if changes.rescan {
            match manifests::yaml_files(&self.dir) {
                Ok(listed) => {
                    let listed: Vec<FileName> = listed.into_iter().map(Arc::from).collect();
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
                        read.push(file.to_path_buf());
                        self.read(file, &mut pending);
                    }
                }
                // Keep everything: an unreadable directory must not empty the maps.
                Err(e) => {
                    error!(dir = %self.dir.display(), error = %e, "cannot list the directory; keeping every object")
                }
            }
        } else {
            let mut files: Vec<FileName> = changes
                .paths
                .iter()
                .filter(|p| {
                    p.parent() == Some(Path::new(""))
                        && p.file_name().is_some_and(manifests::is_yaml_name)
                })
                .map(|p| Arc::from(self.dir.join(p)))
                .collect();
            files.extend(
                self.files
                    .iter()
                    .filter(|(_, symlink)| **symlink)
                    .map(|(f, _)| f.clone()),
            );
            files.sort();
            files.dedup();
            for file in files {
                read.push(file.to_path_buf());
                self.read(file, &mut pending);
            }
        }
        Update {
            changes: self.changes(pending),
            read,
        }
    }

    /// The node changes of an update: deletions first, then additions and modifications.
    fn changes(&self, pending: Pending) -> Vec<Change> {
        let mut deleted = Vec::new();
        let mut upserted = Vec::new();
        for (id, new) in self.imports.changes(pending.imports) {
            match new {
                Some(v) => upserted.push(Change::Import(v)),
                None => deleted.push(Change::ImportDeleted(id)),
            }
        }
        for (id, new) in self.slices.changes(pending.slices) {
            match new {
                Some(v) => upserted.push(Change::Slice(v)),
                None => deleted.push(Change::SliceDeleted(id)),
            }
        }
        deleted.extend(upserted);
        deleted
    }

    fn forget(&mut self, file: &FileName, pending: &mut Pending) {
        self.files.remove(file);
        self.imports.replace(file, Vec::new(), &mut pending.imports);
        self.slices.replace(file, Vec::new(), &mut pending.slices);
        debug!(file = %file.display(), "node file removed; its objects are deleted");
    }

    /// Reads one file and files what it defines now.
    fn read(&mut self, file: FileName, pending: &mut Pending) {
        let names = &self.names;
        let reading = manifests::reread(&file, self.files.contains_key(&file), |document, m| {
            Ok(match node_manifest(m, &file, document)? {
                NodeManifest::Import(si) => NodeObject::Import(import_input(&si, names)),
                NodeManifest::Slice(s) => NodeObject::Slice(slice_input(&s, names)),
            })
        });
        let objects = match reading.objects {
            Reread::Keep => return,
            Reread::Forget => {
                if self.files.contains_key(&file) {
                    self.forget(&file, pending);
                }
                return;
            }
            Reread::Replace(objects) => objects,
        };
        let mut imports = Vec::new();
        let mut slices = Vec::new();
        for (document, object) in objects {
            match object {
                NodeObject::Import(i) => imports.push((document, i)),
                NodeObject::Slice(s) => slices.push((document, s)),
            }
        }
        debug!(
            file = %file.display(),
            imports = imports.len(),
            slices = slices.len(),
            errors = reading.errors.len(),
            "read a node file"
        );
        self.imports.replace(&file, imports, &mut pending.imports);
        self.slices.replace(&file, slices, &mut pending.slices);
        self.imports.warn_duplicates(&file, "ServiceImport");
        self.slices.warn_duplicates(&file, "EndpointSlice");
        self.files.insert(file, reading.symlink);
    }
}

/// Sends the contents of `dir` on `tx`: one snapshot once the directory can be read, then
/// what each batch of changes changed. Stops when the node is gone.
pub async fn watch(dir: PathBuf, tx: ChangeSender) {
    let mut watcher = match DirWatcher::new(&dir) {
        Ok(w) => Some(w),
        Err(e) => {
            error!(dir = %dir.display(), error = %e, "cannot watch the directory; changes need a restart");
            None
        }
    };
    let mut state: Option<NodeDir> = None;
    loop {
        if state.is_none() {
            match NodeDir::load(&dir) {
                Ok((s, snapshot)) => {
                    if tx.send(snapshot).is_err() {
                        return;
                    }
                    state = Some(s);
                }
                Err(e) => {
                    error!(dir = %dir.display(), error = %e, "cannot read the directory; waiting for it to change")
                }
            }
        }
        let changes = match watcher.as_mut() {
            Some(w) => match w.changed().await {
                Some(c) => c,
                None => return,
            },
            None => std::future::pending().await,
        };
        if let Some(s) = state.as_mut() {
            // One message: the node never syncs half of an update (a slice renamed in a file
            // would be written without its endpoints in between).
            let update = s.update(&changes).changes;
            if !update.is_empty() && tx.send(Change::Batch(update)).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn import(name: &str, ip: &str, port: u16) -> String {
        format!(
            "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\n\
             metadata: {{name: {name}, namespace: demo}}\n\
             spec: {{type: ClusterSetIP, ips: [{ip}], ipFamilies: [IPv4], ports: [{{name: http, port: {port}}}]}}\n"
        )
    }

    fn slice(name: &str, service: &str, host: u8) -> String {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {name}, namespace: demo, labels: {{multicluster.kubernetes.io/service-name: {service}, multicluster.kubernetes.io/source-cluster: a}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.99.1.{host}]}}]\n"
        )
    }

    fn docs(parts: &[String]) -> String {
        parts.join("---\n")
    }

    /// Writes `text` to `dir/file` atomically.
    fn write(dir: &Path, file: &str, text: &str) {
        let tmp = dir.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, dir.join(file)).expect("rename");
    }

    fn batch(paths: &[&str]) -> Changes {
        Changes {
            paths: paths.iter().map(PathBuf::from).collect(),
            rescan: false,
        }
    }

    /// A change as `(kind, namespace/name, first ClusterSet IP or endpoint)`.
    fn summary(changes: &[Change]) -> Vec<(&'static str, String, String)> {
        changes
            .iter()
            .map(|c| match c {
                Change::Import(i) => {
                    let ip = i.record().and_then(|r| r.ips.first());
                    (
                        "import",
                        i.id().to_string(),
                        ip.map(|ip| ip.to_string()).unwrap_or_default(),
                    )
                }
                Change::ImportDeleted(id) => ("import deleted", id.to_string(), String::new()),
                Change::Slice(s) => {
                    let ep = s.record().and_then(|r| r.endpoints.list().next());
                    (
                        "slice",
                        s.id().to_string(),
                        ep.map(|e| e.addr.to_string()).unwrap_or_default(),
                    )
                }
                Change::SliceDeleted(id) => ("slice deleted", id.to_string(), String::new()),
                other => ("other", format!("{other:?}"), String::new()),
            })
            .collect()
    }

    fn row(kind: &'static str, id: &str, what: &str) -> (&'static str, String, String) {
        (kind, id.to_owned(), what.to_owned())
    }

    /// a.yaml: import web and its slice; b.yaml: import api.
    fn setup() -> (tempfile::TempDir, NodeDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "a.yaml",
            &docs(&[import("web", "241.0.0.10", 80), slice("web-a", "web", 10)]),
        );
        write(dir.path(), "b.yaml", &import("api", "241.0.0.20", 80));
        let (state, first) = NodeDir::load(dir.path()).expect("load");
        match first {
            Change::Snapshot { imports, slices } => {
                let ids: BTreeSet<String> = imports.iter().map(|i| i.id().to_string()).collect();
                assert_eq!(ids, BTreeSet::from(["demo/api".into(), "demo/web".into()]));
                assert_eq!(slices.len(), 1);
            }
            other => panic!("the first read is a snapshot: {other:?}"),
        }
        (dir, state)
    }

    /// The watch sends one update as one message: a slice renamed in a file (a deletion and
    /// an addition) is never filed, and synced, half.
    #[tokio::test]
    async fn the_watch_sends_one_update_as_one_message() {
        let (dir, _) = setup();
        let (tx, mut rx) = crate::source::feed::channel();
        let watch = tokio::spawn(watch(dir.path().to_owned(), tx));
        async fn next(rx: &mut crate::source::feed::ChangeReceiver) -> Change {
            let wait = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv());
            wait.await
                .expect("a message in time")
                .expect("the watch runs")
        }
        assert!(matches!(next(&mut rx).await, Change::Snapshot { .. }));
        write(
            dir.path(),
            "a.yaml",
            &docs(&[import("web", "241.0.0.10", 80), slice("web-b", "web", 10)]),
        );
        match next(&mut rx).await {
            Change::Batch(changes) => assert_eq!(
                summary(&changes),
                [
                    row("slice deleted", "demo/web-a", ""),
                    row("slice", "demo/web-b", "10.99.1.10")
                ]
            ),
            other => panic!("one batch, not {:?}", summary(&[other])),
        }
        watch.abort();
    }

    /// An object defined twice, once unusably (a slice without its source cluster, an import
    /// with a malformed IP): the usable definition is the one used.
    #[test]
    fn a_broken_copy_does_not_hide_a_good_definition() {
        let (dir, _) = setup();
        write(
            dir.path(),
            "0-copies.yaml",
            &docs(&[
                import("web", "not-an-ip", 80),
                slice("web-a", "web", 10)
                    .replace(", multicluster.kubernetes.io/source-cluster: a", ""),
            ]),
        );
        let (_, first) = NodeDir::load(dir.path()).expect("load");
        let Change::Snapshot { imports, slices } = first else {
            panic!("a snapshot");
        };
        let web = imports.iter().find(|i| i.id().to_string() == "demo/web");
        assert!(web.and_then(|i| i.record()).is_some(), "{imports:?}");
        let web_a = slices.iter().find(|s| s.id().to_string() == "demo/web-a");
        assert!(web_a.and_then(|s| s.record()).is_some(), "{slices:?}");
    }

    #[test]
    fn an_edit_re_reads_that_file_only_and_sends_what_differs() {
        let (dir, mut state) = setup();
        write(dir.path(), "b.yaml", &import("api", "241.0.0.21", 80));
        let update = state.update(&batch(&[".b.yaml.tmp", "b.yaml"]));
        assert_eq!(update.read, [dir.path().join("b.yaml")]);
        assert_eq!(
            summary(&update.changes),
            [row("import", "demo/api", "241.0.0.21")]
        );
        // Rewriting a file with the same objects changes nothing.
        write(
            dir.path(),
            "a.yaml",
            &docs(&[import("web", "241.0.0.10", 80), slice("web-a", "web", 10)]),
        );
        let update = state.update(&batch(&["a.yaml"]));
        assert_eq!(update.read, [dir.path().join("a.yaml")]);
        assert!(update.changes.is_empty(), "{:?}", update.changes);
        // Paths that are no YAML file directly in the directory are not read.
        let update = state.update(&batch(&["notes.txt", "sub/c.yaml", ".a.yaml.swp"]));
        assert!(update.read.is_empty() && update.changes.is_empty());
    }

    #[test]
    fn a_broken_or_unreadable_file_keeps_its_last_good_objects() {
        let (dir, mut state) = setup();
        // Half-written: the second document is cut.
        write(
            dir.path(),
            "a.yaml",
            &format!(
                "{}---\nmetadata: {{name: [",
                import("web", "241.0.0.99", 80)
            ),
        );
        let update = state.update(&batch(&["a.yaml"]));
        assert_eq!(update.read, [dir.path().join("a.yaml")]);
        assert!(update.changes.is_empty(), "{:?}", summary(&update.changes));
        std::fs::write(dir.path().join("a.yaml"), [0xff, 0xfe]).expect("write");
        assert!(state.update(&batch(&["a.yaml"])).changes.is_empty());
        // Fixed, and changed: the difference from the last good objects is sent.
        write(
            dir.path(),
            "a.yaml",
            &docs(&[import("web", "241.0.0.11", 80), slice("web-a", "web", 10)]),
        );
        let update = state.update(&batch(&["a.yaml"]));
        assert_eq!(
            summary(&update.changes),
            [row("import", "demo/web", "241.0.0.11")]
        );
    }

    #[test]
    fn a_bad_document_drops_its_object_and_keeps_the_good_ones() {
        let (dir, mut state) = setup();
        let bad_slice =
            slice("web-a", "web", 10).replace("addressType: IPv4", "addressType: {x: 1}");
        write(
            dir.path(),
            "a.yaml",
            &docs(&[import("web", "241.0.0.10", 80), bad_slice]),
        );
        let update = state.update(&batch(&["a.yaml"]));
        assert_eq!(
            summary(&update.changes),
            [row("slice deleted", "demo/web-a", "")]
        );
    }

    #[test]
    fn a_removed_file_deletes_its_objects_first() {
        let (dir, mut state) = setup();
        std::fs::remove_file(dir.path().join("a.yaml")).expect("remove");
        write(dir.path(), "c.yaml", &import("db", "241.0.0.30", 5432));
        let update = state.update(&batch(&["a.yaml", "c.yaml"]));
        assert_eq!(
            summary(&update.changes),
            [
                row("import deleted", "demo/web", ""),
                row("slice deleted", "demo/web-a", ""),
                row("import", "demo/db", "241.0.0.30"),
            ]
        );
    }

    #[test]
    fn what_is_no_file_any_more_deletes_its_objects_without_panicking() {
        let (dir, mut state) = setup();
        std::fs::remove_file(dir.path().join("a.yaml")).expect("remove");
        std::fs::create_dir(dir.path().join("a.yaml")).expect("mkdir");
        let update = state.update(&batch(&["a.yaml"]));
        assert_eq!(update.changes.len(), 2, "{:?}", summary(&update.changes));
        std::fs::remove_file(dir.path().join("b.yaml")).expect("remove");
        std::os::unix::fs::symlink(dir.path().join("b.yaml"), dir.path().join("b.yaml.tmp"))
            .expect("link");
        std::os::unix::fs::symlink(dir.path().join("b.yaml.tmp"), dir.path().join("b.yaml"))
            .expect("loop");
        let update = state.update(&batch(&["b.yaml"]));
        assert_eq!(
            summary(&update.changes),
            [row("import deleted", "demo/api", "")]
        );
    }

    #[test]
    fn an_object_moved_between_files_is_no_change_and_a_duplicate_uses_one_definition() {
        let (dir, mut state) = setup();
        // Moved in one batch: nothing changes for the node.
        std::fs::remove_file(dir.path().join("b.yaml")).expect("remove");
        write(dir.path(), "c.yaml", &import("api", "241.0.0.20", 80));
        let update = state.update(&batch(&["b.yaml", "c.yaml"]));
        assert!(update.changes.is_empty(), "{:?}", summary(&update.changes));
        // Moved in two batches with an edit: while both files define it, the smallest
        // definition is used; then the remaining one.
        write(dir.path(), "d.yaml", &import("api", "241.0.0.19", 80));
        let update = state.update(&batch(&["d.yaml"]));
        assert_eq!(
            summary(&update.changes),
            [row("import", "demo/api", "241.0.0.19")]
        );
        std::fs::remove_file(dir.path().join("c.yaml")).expect("remove");
        assert!(state.update(&batch(&["c.yaml"])).changes.is_empty());
        // The other way round: the larger definition added second is no change.
        write(dir.path(), "e.yaml", &import("api", "241.0.0.25", 80));
        assert!(state.update(&batch(&["e.yaml"])).changes.is_empty());
        std::fs::remove_file(dir.path().join("d.yaml")).expect("remove");
        let update = state.update(&batch(&["d.yaml"]));
        assert_eq!(
            summary(&update.changes),
            [row("import", "demo/api", "241.0.0.25")]
        );
    }

    #[test]
    fn a_rescan_reads_everything_and_an_unreadable_directory_keeps_everything() {
        let (dir, mut state) = setup();
        std::fs::remove_file(dir.path().join("b.yaml")).expect("remove");
        let update = state.update(&Changes::rescan());
        assert_eq!(update.read, [dir.path().join("a.yaml")]);
        assert_eq!(
            summary(&update.changes),
            [row("import deleted", "demo/api", "")]
        );
        let moved = dir.path().with_extension("moved");
        std::fs::rename(dir.path(), &moved).expect("move the directory away");
        let update = state.update(&Changes::rescan());
        std::fs::rename(&moved, dir.path()).expect("move it back");
        assert!(update.read.is_empty() && update.changes.is_empty());
    }

    #[test]
    fn a_symlinked_file_is_read_again_with_every_batch() {
        let (dir, mut state) = setup();
        let data = dir.path().join("..data");
        std::fs::create_dir(&data).expect("mkdir");
        std::fs::write(data.join("c.yaml"), import("db", "241.0.0.30", 5432)).expect("write");
        std::os::unix::fs::symlink(data.join("c.yaml"), dir.path().join("c.yaml")).expect("link");
        let update = state.update(&batch(&["c.yaml"]));
        assert_eq!(
            summary(&update.changes),
            [row("import", "demo/db", "241.0.0.30")]
        );
        // The target changes; the batch names only the data directory, as a ConfigMap swap.
        std::fs::write(data.join("c.yaml"), import("db", "241.0.0.31", 5432)).expect("write");
        let update = state.update(&batch(&["..data/c.yaml"]));
        assert_eq!(update.read, [dir.path().join("c.yaml")]);
        assert_eq!(
            summary(&update.changes),
            [row("import", "demo/db", "241.0.0.31")]
        );
    }
}
