//! Watching a directory tree for changes (inotify through `notify`), batched: each batch says
//! which paths changed, relative to the watched directory, or that everything must be read
//! again.

use std::{
    collections::BTreeSet,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use notify::{
    EventKind, RecursiveMode, Watcher as _,
    event::{AccessKind, AccessMode, ModifyKind},
};
use tokio::{sync::mpsc, time::Instant};
use tracing::warn;

/// How long to wait after a change for more changes before re-reading, so an editor's
/// write-rename-chmod sequence or a `cp -r` produces one re-sync.
pub const SETTLE: Duration = Duration::from_millis(25);

/// Longest wait, from a batch's first change, for the files written in it to be closed: a
/// file rewritten in place (`generator > a.yaml`) is empty or a prefix until its writer
/// closes it, and reading it then would delete or shrink its services. A writer that keeps
/// a file open longer has it read anyway.
pub const WRITE_WAIT: Duration = Duration::from_secs(5);

/// How often the directory at the root is checked to be the one watched: a symlink swapped
/// or a directory renamed over it changes nothing that inotify sees.
const ROOT_POLL: Duration = Duration::from_secs(1);

/// A directory's identity (device, inode): what inotify watches is the inode, not the path.
fn identity(dir: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(dir)
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| (m.dev(), m.ino()))
}

/// One batch of changes under the watched directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// The paths that changed (created, written, removed, renamed from or to), relative to
    /// the watched directory.
    pub paths: BTreeSet<PathBuf>,
    /// Everything must be read again: the watcher lost events (an inotify queue overflow, an
    /// error) or the directory itself changed.
    pub rescan: bool,
}

impl Changes {
    /// A batch that asks for everything to be read again.
    pub fn rescan() -> Changes {
        Changes {
            paths: BTreeSet::new(),
            rescan: true,
        }
    }

    /// Files one event's paths: relative to `root`; the root itself or a path outside it asks
    /// for a rescan.
    fn add(&mut self, root: &Path, paths: &[PathBuf]) {
        for path in paths {
            match path.strip_prefix(root) {
                Ok(relative) if !relative.as_os_str().is_empty() => {
                    self.paths.insert(relative.to_owned());
                }
                _ => self.rescan = true,
            }
        }
    }
}

/// What the `notify` callback hands over.
enum Raw {
    /// Paths created, removed, renamed or changed in their metadata.
    Changed(Vec<PathBuf>),
    /// Files written to: open for writing until they are [`Raw::Closed`].
    Written(Vec<PathBuf>),
    /// Files closed after writing.
    Closed(Vec<PathBuf>),
    /// Everything must be read again.
    Rescan,
}

/// A batch being gathered: its changes, and the files written in it and not closed yet.
#[derive(Default)]
struct Batch {
    changes: Changes,
    writing: BTreeSet<PathBuf>,
}

impl Batch {
    fn file(&mut self, root: &Path, raw: Raw) {
        match raw {
            Raw::Changed(paths) => self.changes.add(root, &paths),
            Raw::Written(paths) => {
                self.changes.add(root, &paths);
                self.writing.extend(paths);
            }
            Raw::Closed(paths) => {
                self.changes.add(root, &paths);
                for path in &paths {
                    self.writing.remove(path);
                }
            }
            Raw::Rescan => self.changes.rescan = true,
        }
    }
}

/// Delivers [`Changes`] after changes under a directory settle.
pub struct DirWatcher {
    watcher: notify::RecommendedWatcher,
    root: PathBuf,
    /// The identity of the directory watched at `root`; `None` while there is none.
    watching: Option<(u64, u64)>,
    rx: mpsc::UnboundedReceiver<Raw>,
    /// The batch being gathered and when its first change came: kept here, so that a call of
    /// [`changed`](Self::changed) dropped in a `select!` loses nothing.
    batch: Option<(Instant, Batch)>,
}

impl DirWatcher {
    /// Watches `dir` and everything below it: the directory at that path, even when it is
    /// replaced (`mv new dir`, `rm -r dir && mkdir dir`, a symlink swapped) or missing for a
    /// while (checked every [`ROOT_POLL`]); each time the directory there is another (or
    /// gone), a batch asks to read everything again.
    pub fn new(dir: &Path) -> notify::Result<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let raw = match event {
                Ok(e) if e.need_rescan() || e.paths.is_empty() => Raw::Rescan,
                Ok(e) => match e.kind {
                    EventKind::Access(AccessKind::Close(AccessMode::Write)) => Raw::Closed(e.paths),
                    EventKind::Access(_) => return,
                    EventKind::Modify(ModifyKind::Data(_)) => Raw::Written(e.paths),
                    _ => Raw::Changed(e.paths),
                },
                // An error (e.g. an inotify queue overflow) rescans: it is always safe.
                Err(_) => Raw::Rescan,
            };
            let _ = tx.send(raw);
        })?;
        let mut out = DirWatcher {
            watcher,
            root: dir.to_owned(),
            watching: None,
            rx,
            batch: None,
        };
        out.rewatch(false)?;
        Ok(out)
    }

    /// Watches the directory at the root again when it is not the one watched (replaced,
    /// re-created, or gone), or whatever it is with `force` (an event on the root itself: a
    /// directory removed and made again may get the same inode number back). Whether the
    /// directory there changed.
    fn rewatch(&mut self, force: bool) -> notify::Result<bool> {
        let now = identity(&self.root);
        if now == self.watching && !force {
            return Ok(false);
        }
        let was = self.watching.take();
        if was.is_some() {
            // Gone with its inode, mostly; an error says only that.
            let _ = self.watcher.unwatch(&self.root);
        }
        if now.is_some() {
            self.watcher.watch(&self.root, RecursiveMode::Recursive)?;
            self.watching = now;
        }
        Ok(now != was)
    }

    /// [`rewatch`](Self::rewatch), an error logged (the next check tries again).
    fn rewatch_logged(&mut self, force: bool) -> bool {
        self.rewatch(force).unwrap_or_else(|e| {
            warn!(dir = %self.root.display(), error = %e, "cannot watch the directory again");
            false
        })
    }

    /// Waits for the next batch of changes: returns [`SETTLE`] after the first change of the
    /// batch, with every change that came in by then, so a directory that keeps changing is
    /// still re-read at least that often; but while a file written in the batch is still open
    /// for writing, it waits for it to be closed, for up to [`WRITE_WAIT`] from the first
    /// change. `None` when the watcher stopped. Cancellation-safe: a call dropped part-way
    /// leaves its batch to the next one.
    pub async fn changed(&mut self) -> Option<Changes> {
        let started = loop {
            if let Some((started, _)) = &self.batch {
                break *started;
            }
            let first = tokio::select! {
                raw = self.rx.recv() => raw?,
                () = tokio::time::sleep(ROOT_POLL) => {
                    if self.rewatch_logged(false) {
                        return Some(Changes::rescan());
                    }
                    continue;
                }
            };
            let mut batch = Batch::default();
            batch.file(&self.root, first);
            let started = Instant::now();
            self.batch = Some((started, batch));
            break started;
        };
        tokio::time::sleep_until(started + SETTLE).await;
        self.drain();
        while self
            .batch
            .as_ref()
            .is_some_and(|(_, b)| !b.writing.is_empty())
        {
            match tokio::time::timeout_at(started + WRITE_WAIT, self.rx.recv()).await {
                Ok(Some(raw)) => {
                    if let Some((_, batch)) = self.batch.as_mut() {
                        batch.file(&self.root, raw);
                    }
                }
                Ok(None) => return None,
                // Still open for writing: read as it is.
                Err(_) => break,
            }
            self.drain();
        }
        let changes = self.batch.take().map(|(_, b)| b.changes)?;
        if changes.rescan {
            // The directory itself changed: it may be another one now, or the same inode
            // number made again.
            self.rewatch_logged(true);
        }
        Some(changes)
    }

    /// Files every change already received into the batch.
    fn drain(&mut self) {
        if let Some((_, batch)) = self.batch.as_mut() {
            while let Ok(raw) = self.rx.try_recv() {
                batch.file(&self.root, raw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_relative_to_the_root_and_the_root_itself_rescans() {
        let mut c = Changes::default();
        c.add(
            Path::new("/d"),
            &[PathBuf::from("/d/a.yaml"), PathBuf::from("/d/c1/b.yaml")],
        );
        assert!(!c.rescan);
        assert_eq!(
            c.paths,
            BTreeSet::from([PathBuf::from("a.yaml"), PathBuf::from("c1/b.yaml")])
        );
        c.add(Path::new("/d"), &[PathBuf::from("/d")]);
        assert!(c.rescan);
        let mut outside = Changes::default();
        outside.add(Path::new("/d"), &[PathBuf::from("/elsewhere/a.yaml")]);
        assert!(outside.rescan && outside.paths.is_empty());
    }

    #[tokio::test]
    async fn a_batch_names_the_files_that_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.yaml"), "a").expect("write");
        let mut watcher = DirWatcher::new(dir.path()).expect("watch");
        std::fs::write(dir.path().join("b.yaml"), "b").expect("write");
        let mut seen = BTreeSet::new();
        while !seen.contains(Path::new("b.yaml")) {
            let changes = next(&mut watcher).await;
            assert!(!changes.rescan, "{changes:?}");
            seen.extend(changes.paths);
        }
        assert!(!seen.contains(Path::new("a.yaml")), "{seen:?}");
    }

    /// The next batch, within a bound that only keeps a broken watcher from hanging a test.
    async fn next(watcher: &mut DirWatcher) -> Changes {
        tokio::time::timeout(Duration::from_secs(30), watcher.changed())
            .await
            .expect("a batch within 30 s")
            .expect("watching")
    }

    /// Batches until one names `file` (or rescans), after writing it.
    async fn sees(watcher: &mut DirWatcher, dir: &Path, file: &str) {
        std::fs::write(dir.join(file), "x").expect("write");
        loop {
            let c = next(watcher).await;
            if c.rescan || c.paths.contains(Path::new(file)) {
                return;
            }
        }
    }

    /// The directory is replaced (`rm -r dir && mkdir dir`, then `mv new dir`), or is a symlink
    /// swapped to another directory: each time a batch rescans, and changes in the directory
    /// now there are still seen.
    #[tokio::test]
    async fn a_replaced_directory_is_watched_again() {
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("node");
        std::fs::create_dir(&dir).expect("mkdir");
        let mut watcher = DirWatcher::new(&dir).expect("watch");
        std::fs::remove_dir(&dir).expect("rmdir");
        std::fs::create_dir(&dir).expect("mkdir again");
        assert!(next(&mut watcher).await.rescan);
        sees(&mut watcher, &dir, "a.yaml").await;

        let staged = base.path().join("node.new");
        std::fs::create_dir(&staged).expect("mkdir");
        std::fs::remove_dir_all(&dir).expect("rm -r");
        std::fs::rename(&staged, &dir).expect("swap in");
        assert!(next(&mut watcher).await.rescan);
        sees(&mut watcher, &dir, "b.yaml").await;

        // A symlink to one directory, swapped (renamed over) to another: no event at all.
        let (one, two, link) = (
            base.path().join("one"),
            base.path().join("two"),
            base.path().join("link"),
        );
        std::fs::create_dir(&one).expect("mkdir");
        std::fs::create_dir(&two).expect("mkdir");
        std::os::unix::fs::symlink(&one, &link).expect("symlink");
        let mut watcher = DirWatcher::new(&link).expect("watch");
        let swap = base.path().join("link.new");
        std::os::unix::fs::symlink(&two, &swap).expect("symlink");
        std::fs::rename(&swap, &link).expect("swap the link");
        assert!(next(&mut watcher).await.rescan);
        sees(&mut watcher, &two, "c.yaml").await;
    }

    /// A directory missing at start is watched once it is created.
    #[tokio::test]
    async fn a_directory_missing_at_start_is_watched_once_created() {
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("later");
        let mut watcher = DirWatcher::new(&dir).expect("a watcher");
        std::fs::create_dir(&dir).expect("mkdir");
        assert!(next(&mut watcher).await.rescan);
        sees(&mut watcher, &dir, "a.yaml").await;
    }

    /// `generator > a.yaml`: the file is truncated and stays open for writing while the
    /// generator runs. No batch names it before the writer closes it; then one does, with
    /// b.yaml, written meanwhile, although the call that began the batch was dropped.
    #[tokio::test]
    async fn a_file_open_for_writing_is_handed_out_once_it_is_closed() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.yaml");
        std::fs::write(&path, "old").expect("write");
        let mut watcher = DirWatcher::new(dir.path()).expect("watch");
        std::fs::write(dir.path().join("b.yaml"), "b").expect("write");
        let mut writer = std::fs::File::create(&path).expect("truncate");
        writer.write_all(b"half").expect("write");
        let early = tokio::time::timeout(Duration::from_millis(400), watcher.changed()).await;
        assert!(early.is_err(), "a batch while a.yaml was open: {early:?}");
        writer.write_all(b" and the rest").expect("write");
        drop(writer);
        let changes = next(&mut watcher).await;
        assert!(changes.paths.contains(Path::new("a.yaml")), "{changes:?}");
        assert!(changes.paths.contains(Path::new("b.yaml")), "{changes:?}");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "half and the rest"
        );
    }
}
