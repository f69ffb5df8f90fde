//! Kubernetes manifests from YAML files: which files of a directory are read, and reading one
//! file safely, read and decoded document by document ([`DocumentSplitter`], [`PartDecoder`])
//! and converted object by object as it goes, so neither a file's text nor its API objects are
//! ever held at once.

use std::{
    ffi::OsStr,
    io::{BufRead as _, Read as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

pub use dataplane_core::manifest::{
    DocumentSplitter, Documents, Manifest, ManifestError, Part, PartDecoder, parse_documents,
};

/// The largest manifest file read (a larger one is an error for that file, not an
/// out-of-memory agent).
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// Whether a file name is one of a manifest (`*.yaml`, `*.yml`).
pub fn is_yaml_name(name: &OsStr) -> bool {
    matches!(
        Path::new(name).extension().and_then(|e| e.to_str()),
        Some("yaml") | Some("yml")
    )
}

/// The `*.yaml` and `*.yml` files directly in `dir`, sorted by name (entries that are not
/// regular files, following symlinks, are left out).
pub fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.file_name().is_some_and(is_yaml_name) && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// What reading one manifest file gave.
#[derive(Debug)]
pub enum FileRead<T> {
    /// The file was read: its usable documents, converted, and the errors of the others.
    Parsed {
        /// The converted objects, each with its document index, in document order.
        objects: Vec<(usize, T)>,
        /// The documents that could not be used.
        errors: Vec<ManifestError>,
        /// Whether decoding stopped at a YAML syntax error (the documents after it are
        /// missing: the file is half-written or broken).
        syntax_error: bool,
    },
    /// The path is no regular file any more: deleted, replaced by a directory or another kind
    /// of file, a dangling symlink or a symlink loop.
    Gone,
    /// The file exists but cannot be read (permissions, I/O, too large, not UTF-8).
    Unreadable(ManifestError),
}

/// Reads `path` and decodes it, calling `convert` on every usable document as it is decoded
/// (`Err` makes it an error of that document). The file is read one document at a time
/// ([`DocumentSplitter`]), so only one document's text is held, whatever the file's size. It
/// is opened without blocking (a FIFO put in its place cannot hang the reader) and must be a
/// regular file of at most [`MAX_FILE_BYTES`] of UTF-8 text.
pub fn read_file<T>(
    path: &Path,
    mut convert: impl FnMut(usize, Manifest) -> Result<T, ManifestError>,
) -> FileRead<T> {
    let unreadable = |message: String| {
        FileRead::Unreadable(ManifestError {
            file: path.to_owned(),
            document: 0,
            object: None,
            message,
        })
    };
    let (mut reader, opened) = match open_regular(path) {
        Ok(Some((file, meta))) => (
            std::io::BufReader::with_capacity(1 << 16, file.take(MAX_FILE_BYTES + 1)),
            meta,
        ),
        Ok(None) => return FileRead::Gone,
        Err(message) => return unreadable(message),
    };
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    let mut splitter = DocumentSplitter::default();
    let mut decoder = PartDecoder::new(path);
    let mut decode = |part: Part, decoder: &mut PartDecoder| {
        decoder.decode(&part, |document| {
            match document.and_then(|(index, m)| convert(index, m).map(|t| (index, t))) {
                Ok(object) => objects.push(object),
                Err(e) => errors.push(e),
            }
        })
    };
    let mut line = String::new();
    let mut read: u64 = 0;
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(n) => read += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return unreadable(format!("cannot read: not UTF-8 text ({e})"));
            }
            Err(e) => return unreadable(format!("cannot read: {e}")),
        }
        if read > MAX_FILE_BYTES {
            return unreadable(format!(
                "cannot read: larger than {MAX_FILE_BYTES} bytes; not read"
            ));
        }
        if let Some(part) = splitter.push(&line) {
            decode(part, &mut decoder);
            if decoder.syntax_error() {
                // Nothing after a syntax error is decoded: the rest need not be read.
                break;
            }
        }
    }
    if let Some(part) = splitter.finish() {
        decode(part, &mut decoder);
    }
    // The file is read over a while: one rewritten in place meanwhile (truncated, then
    // written) may have ended early at a document boundary and look complete.
    let now = reader.get_ref().get_ref().metadata();
    if now.map_or(true, |now| FileStamp::of(&now) != opened) {
        return unreadable("changed while it was read; it is read again at its next change".into());
    }
    FileRead::Parsed {
        objects,
        errors,
        syntax_error: decoder.syntax_error(),
    }
}

/// What a new read of a file means for the objects it defined.
#[derive(Debug)]
pub enum Reread<T> {
    /// They are replaced with these (document index, object).
    Replace(Vec<(usize, T)>),
    /// The last good ones are kept: the file cannot be read or has a YAML syntax error.
    Keep,
    /// The file is gone: they are deleted.
    Forget,
}

/// A read of a file a directory source keeps objects of.
#[derive(Debug)]
pub struct Reading<T> {
    /// What becomes of the file's objects.
    pub objects: Reread<T>,
    /// The documents that could not be used (or why the file could not be read).
    pub errors: Vec<ManifestError>,
    /// Whether the path is a symlink (its target may change without an event on it).
    pub symlink: bool,
}

/// Reads `path` again ([`read_file`]). `has_good`: whether it has objects from an earlier
/// read, which a file that cannot be read or has a YAML syntax error keeps (a file read for
/// the first time with a syntax error gives the documents before it). Errors are logged.
pub fn reread<T>(
    path: &Path,
    has_good: bool,
    convert: impl FnMut(usize, Manifest) -> Result<T, ManifestError>,
) -> Reading<T> {
    let symlink = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let (objects, errors) = match read_file(path, convert) {
        FileRead::Gone => (Reread::Forget, Vec::new()),
        FileRead::Unreadable(e) => {
            tracing::error!("{e}; keeping its last good objects");
            (Reread::Keep, vec![e])
        }
        FileRead::Parsed {
            objects,
            errors,
            syntax_error,
        } => {
            for e in &errors {
                tracing::warn!("{e}");
            }
            if syntax_error && has_good {
                tracing::error!(file = %path.display(), "the file has a YAML syntax error; keeping its last good objects");
                (Reread::Keep, errors)
            } else {
                (Reread::Replace(objects), errors)
            }
        }
    };
    Reading {
        objects,
        errors,
        symlink,
    }
}

/// What tells that a file changed: its size, modification and status change times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        FileStamp {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// `path` opened for reading, with its stamp, if it is a regular file; `None` when it is not
/// (any more).
fn open_regular(path: &Path) -> Result<Option<(std::fs::File, FileStamp)>, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) => {
            let gone = matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
            );
            return if gone {
                Ok(None)
            } else {
                Err(format!("cannot read: {e}"))
            };
        }
    };
    let meta = file.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Ok(None);
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "cannot read: larger than {MAX_FILE_BYTES} bytes; not read"
        ));
    }
    Ok(Some((file, FileStamp::of(&meta))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> FileRead<String> {
        read_file(path, |_, m| Ok(m.describe()))
    }

    #[test]
    fn a_file_is_read_document_by_document() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.yaml");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\n---\nkind: X\nmetadata: {name: b}\n",
        )
        .expect("write");
        match read(&path) {
            FileRead::Parsed {
                objects,
                errors,
                syntax_error,
            } => {
                assert_eq!(objects, [(0, "Service ns/a".to_owned())]);
                assert_eq!(errors.len(), 1);
                assert_eq!(errors[0].document, 1);
                assert!(!syntax_error);
            }
            other => panic!("{other:?}"),
        }
        let broken = dir.path().join("b.yaml");
        std::fs::write(&broken, "metadata: {name: [").expect("write");
        assert!(matches!(
            read(&broken),
            FileRead::Parsed {
                syntax_error: true,
                ..
            }
        ));
    }

    #[test]
    fn what_is_no_regular_file_is_gone_and_never_blocks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        assert!(matches!(read(&d.join("missing.yaml")), FileRead::Gone));
        std::fs::create_dir(d.join("dir.yaml")).expect("mkdir");
        assert!(matches!(read(&d.join("dir.yaml")), FileRead::Gone));
        std::os::unix::fs::symlink(d.join("nowhere"), d.join("dangling.yaml")).expect("link");
        assert!(matches!(read(&d.join("dangling.yaml")), FileRead::Gone));
        std::os::unix::fs::symlink(d.join("loop2.yaml"), d.join("loop1.yaml")).expect("link");
        std::os::unix::fs::symlink(d.join("loop1.yaml"), d.join("loop2.yaml")).expect("link");
        assert!(matches!(read(&d.join("loop1.yaml")), FileRead::Gone));
        // A FIFO with no writer would block a plain open forever.
        let fifo = d.join("fifo.yaml");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo reads a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(read(&fifo), FileRead::Gone));
        assert_eq!(yaml_files(d).expect("list"), Vec::<PathBuf>::new());
    }

    #[test]
    fn a_file_changed_while_it_is_read_is_unreadable_this_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.yaml");
        let doc = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\n";
        std::fs::write(&path, format!("{doc}---\n{doc}")).expect("write");
        // Rewritten in place while the first document is converted, as an editor or a
        // generator that truncates and writes may do.
        let read = read_file(&path, |_, m| {
            std::fs::write(&path, doc).expect("rewrite");
            Ok(m.describe())
        });
        match read {
            FileRead::Unreadable(e) => assert!(e.message.contains("changed while"), "{e}"),
            other => panic!("{other:?}"),
        }
        // Read again once it is still, it is whole.
        assert!(matches!(
            read_file(&path, |_, m| Ok(m.describe())),
            FileRead::Parsed { objects, .. } if objects.len() == 1
        ));
    }

    #[test]
    fn a_file_that_is_not_text_is_unreadable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bin.yaml");
        std::fs::write(&path, [0xff, 0xfe, 0x00]).expect("write");
        match read(&path) {
            FileRead::Unreadable(e) => assert!(e.message.contains("not UTF-8"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
