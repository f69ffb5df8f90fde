//! Watching a directory tree for changes (inotify through `notify`), batched into one signal.

use std::{path::Path, time::Duration};

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

/// How long to wait after a change for more changes before re-reading, so an editor's
/// write-rename-chmod sequence or a `cp -r` produces one re-sync.
pub const SETTLE: Duration = Duration::from_millis(25);

/// Delivers `()` after changes under a directory settle.
pub struct DirWatcher {
    _watcher: notify::RecommendedWatcher,
    rx: mpsc::UnboundedReceiver<()>,
}

impl DirWatcher {
    /// Watches `dir` and everything below it.
    pub fn new(dir: &Path) -> notify::Result<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // Errors (e.g. an inotify queue overflow) also trigger a re-read: it is always safe.
                if event.as_ref().map(|e| !e.kind.is_access()).unwrap_or(true) {
                    let _ = tx.send(());
                }
            })?;
        watcher.watch(dir, RecursiveMode::Recursive)?;
        Ok(DirWatcher {
            _watcher: watcher,
            rx,
        })
    }

    /// Waits for the next batch of changes: returns [`SETTLE`] after the first change of the
    /// batch, however many follow, so a directory that keeps changing is still re-read at
    /// least that often. `None` when the watcher stopped.
    pub async fn changed(&mut self) -> Option<()> {
        self.rx.recv().await?;
        tokio::time::sleep(SETTLE).await;
        while let Ok(()) = self.rx.try_recv() {}
        Some(())
    }
}
