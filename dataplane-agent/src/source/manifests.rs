//! Kubernetes manifests from YAML files: every `*.yaml`/`*.yml` file of a directory, decoded
//! document by document with [`dataplane_core::manifest::parse_documents`].

use std::path::{Path, PathBuf};

pub use dataplane_core::manifest::{Manifest, ManifestError, parse_documents};

/// The `*.yaml` and `*.yml` files directly in `dir`, sorted by name.
pub fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let is_yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml") | Some("yml")
        );
        if is_yaml && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Reads and parses every YAML file directly in `dir`. A file that cannot be read is an error
/// for that file only.
pub fn read_dir(dir: &Path) -> std::io::Result<(Vec<Manifest>, Vec<ManifestError>)> {
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for file in yaml_files(dir)? {
        match std::fs::read_to_string(&file) {
            Ok(text) => {
                let (o, e) = parse_documents(&text, &file);
                objects.extend(o);
                errors.extend(e);
            }
            Err(e) => errors.push(ManifestError {
                file: file.clone(),
                document: 0,
                object: None,
                message: format!("cannot read: {e}"),
            }),
        }
    }
    Ok((objects, errors))
}
