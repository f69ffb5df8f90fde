//! Watching a directory tree for changes (inotify through `notify`), batched: each batch says
//! which paths changed, relative to the watched directory, or that everything must be read
//! again.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

/// How long to wait after a change for more changes before re-reading, so an editor's
/// write-rename-chmod sequence or a `cp -r` produces one re-sync.
pub const SETTLE: Duration = Duration::from_millis(25);

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

/// What the `notify` callback hands over: an event's paths, or `None` to rescan.
type Raw = Option<Vec<PathBuf>>;

/// Delivers [`Changes`] after changes under a directory settle.
pub struct DirWatcher {
    _watcher: notify::RecommendedWatcher,
    root: PathBuf,
    rx: mpsc::UnboundedReceiver<Raw>,
}

impl DirWatcher {
    /// Watches `dir` and everything below it.
    pub fn new(dir: &Path) -> notify::Result<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let raw = match event {
                    Ok(e) if e.kind.is_access() => return,
                    Ok(e) if e.need_rescan() || e.paths.is_empty() => None,
                    Ok(e) => Some(e.paths),
                    // An error (e.g. an inotify queue overflow) rescans: it is always safe.
                    Err(_) => None,
                };
                let _ = tx.send(raw);
            })?;
        watcher.watch(dir, RecursiveMode::Recursive)?;
        Ok(DirWatcher {
            _watcher: watcher,
            root: dir.to_owned(),
            rx,
        })
    }

    /// Waits for the next batch of changes: returns [`SETTLE`] after the first change of the
    /// batch, with every change that came in by then, so a directory that keeps changing is
    /// still re-read at least that often. `None` when the watcher stopped.
    pub async fn changed(&mut self) -> Option<Changes> {
        let first = self.rx.recv().await?;
        tokio::time::sleep(SETTLE).await;
        let mut changes = Changes::default();
        let mut next = Some(first);
        while let Some(raw) = next {
            match raw {
                Some(paths) => changes.add(&self.root, &paths),
                None => changes.rescan = true,
            }
            next = self.rx.try_recv().ok();
        }
        Some(changes)
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
        // The bound only keeps a broken watcher from hanging the test.
        let mut seen = BTreeSet::new();
        while !seen.contains(Path::new("b.yaml")) {
            let changes = tokio::time::timeout(Duration::from_secs(30), watcher.changed())
                .await
                .expect("a batch within 30 s")
                .expect("watching");
            assert!(!changes.rescan, "{changes:?}");
            seen.extend(changes.paths);
        }
        assert!(!seen.contains(Path::new("a.yaml")), "{seen:?}");
    }
}
