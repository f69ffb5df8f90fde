//! Standalone mode's report file: the importing cluster's ServiceImports and every export's
//! conditions (`dataplane_core::plan::report_yaml`), replaced whole on every merge.

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

/// The report's mode: readable by everyone (it holds no secret), written by the agent.
pub const REPORT_MODE: u32 = 0o644;

/// How many fresh temporary names are tried before giving up.
const ATTEMPTS: usize = 16;

/// Writes `text` to `path` atomically and durably: a reader sees the old report or the new one,
/// never half of one, and after a crash the file holds one of them.
///
/// The text goes to a new temporary file in the same directory, created with
/// `O_CREAT|O_EXCL|O_NOFOLLOW` under a unique name (so nothing already there, a symlink
/// included, is ever written through), `fsync`ed, renamed over `path` (which replaces a
/// symlink at `path` itself, never its target), and the directory is `fsync`ed so the rename
/// lasts. On an error the temporary file is removed.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let tmp = temp_path(path)?;
        match write_via(&tmp, path, text) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            result => return result,
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary name")))
}

/// A temporary name next to `path`, unique to this process and call:
/// `.<file name>.<pid>.<counter>.<nanoseconds>.tmp`.
fn temp_path(path: &Path) -> std::io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} has no file name", path.display()),
        )
    })?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let unique = format!(
        ".{}.{}.{}.{nanos}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    Ok(path.with_file_name(unique))
}

/// Writes `text` to the new file `tmp`, syncs it and renames it over `path`.
fn write_via(tmp: &Path, path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(REPORT_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(tmp)?;
    let written = file
        .write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(tmp, path));
    drop(file);
    if let Err(e) = written {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    sync_dir(path)
}

/// `fsync`s the directory holding `path`, so a rename into it survives a crash.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};

    use super::*;

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    #[test]
    fn writes_replace_the_report_whole_and_leave_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = dir.path().join("report.yaml");
        write_atomically(&report, "one\n").expect("write");
        write_atomically(&report, "two\n").expect("write");
        assert_eq!(std::fs::read_to_string(&report).expect("read"), "two\n");
        assert_eq!(leftovers(dir.path()), Vec::<String>::new());
        let mode = std::fs::metadata(&report)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o022, 0, "never group or world writable: {mode:o}");
        assert_eq!(mode & 0o600, 0o600);
    }

    #[test]
    fn temporary_names_are_unique_and_next_to_the_report() {
        let report = Path::new("/some/dir/report.yaml");
        let a = temp_path(report).expect("name");
        let b = temp_path(report).expect("name");
        assert_ne!(a, b);
        assert_eq!(a.parent(), report.parent());
        let name = a.file_name().expect("name").to_string_lossy().into_owned();
        assert!(
            name.starts_with(".report.yaml.") && name.ends_with(".tmp"),
            "{name}"
        );
        assert!(temp_path(Path::new("/")).is_err());
    }

    #[test]
    fn a_symlinked_temporary_path_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("write");
        let report = dir.path().join("report.yaml");
        let tmp = dir.path().join(".report.yaml.planted.tmp");
        symlink(&victim, &tmp).expect("symlink");
        let e = write_via(&tmp, &report, "evil").expect_err("refused");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
        assert!(!report.exists());
        // A dangling symlink is refused too (O_EXCL), and nothing is created at its target.
        let nowhere = dir.path().join("nowhere");
        let dangling = dir.path().join(".report.yaml.dangling.tmp");
        symlink(&nowhere, &dangling).expect("symlink");
        assert!(write_via(&dangling, &report, "evil").is_err());
        assert!(!nowhere.exists());
    }

    #[test]
    fn an_existing_temporary_file_is_never_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = dir.path().join("report.yaml");
        let tmp = dir.path().join(".report.yaml.taken.tmp");
        std::fs::write(&tmp, "someone else's").expect("write");
        let inode = std::fs::metadata(&tmp).expect("stat").ino();
        assert!(write_via(&tmp, &report, "mine").is_err());
        assert_eq!(
            std::fs::read_to_string(&tmp).expect("read"),
            "someone else's"
        );
        assert_eq!(std::fs::metadata(&tmp).expect("stat").ino(), inode);
        // write_atomically picks a fresh name and succeeds.
        write_atomically(&report, "mine").expect("write");
        assert_eq!(std::fs::read_to_string(&report).expect("read"), "mine");
    }

    #[test]
    fn a_symlink_at_the_report_path_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("write");
        let report = dir.path().join("report.yaml");
        symlink(&victim, &report).expect("symlink");
        write_atomically(&report, "report").expect("write");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
        let meta = std::fs::symlink_metadata(&report).expect("stat");
        assert!(meta.file_type().is_file(), "the link itself was replaced");
        assert_eq!(std::fs::read_to_string(&report).expect("read"), "report");
    }

    #[test]
    fn a_failed_rename_removes_the_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A non-empty directory at the report's path: the rename fails.
        let report = dir.path().join("report.yaml");
        std::fs::create_dir(&report).expect("mkdir");
        std::fs::write(report.join("x"), "x").expect("write");
        assert!(write_atomically(&report, "text").is_err());
        assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn concurrent_writers_leave_one_whole_report() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = dir.path().join("report.yaml");
        let texts: Vec<String> = (0..8).map(|i| format!("{i}\n").repeat(10_000)).collect();
        std::thread::scope(|s| {
            for t in &texts {
                let report = &report;
                s.spawn(move || {
                    for _ in 0..10 {
                        write_atomically(report, t).expect("write");
                    }
                });
            }
        });
        let got = std::fs::read_to_string(&report).expect("read");
        assert!(texts.contains(&got), "a report mixes writers");
        assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    }
}
