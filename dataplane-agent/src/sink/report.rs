//! Standalone mode's report file: the importing cluster's ServiceImports and every export's
//! conditions (`dataplane_core::plan::report_yaml`), replaced whole on every merge.

use std::path::Path;

/// Writes `text` to `path` atomically (a reader never sees half a report).
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
