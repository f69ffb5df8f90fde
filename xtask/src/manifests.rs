//! `cargo xtask manifests [--check]`: the CRDs in `deploy/crds/` are generated from the Rust
//! types (`dataplane-agent crds --out-dir`). `--check` fails when the committed files differ
//! from what the types give, and lists the differences.
//!
//! xtask stays compile-light: it runs the agent (`cargo run -p dataplane-agent`) instead of
//! linking it. The CRDs do not depend on the eBPF object, so with `AYA_BUILD_SKIP=1` in the
//! environment this works without the eBPF toolchain.

use std::{collections::BTreeMap, path::Path, process::Command};

use anyhow::{Context as _, bail};

use crate::workspace_root;

/// The `*.yaml` files of a directory: file name -> contents (empty when it does not exist).
fn yaml_files(dir: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(".yaml") {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            out.insert(name, text);
        }
    }
    Ok(out)
}

/// Generates the CRDs into a fresh temporary directory and reads them back.
fn generate(root: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let tmp = std::env::temp_dir().join(format!("mcs-crds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root)
        .args([
            "run",
            "--quiet",
            "--package",
            "dataplane-agent",
            "--",
            "crds",
            "--out-dir",
        ])
        .arg(&tmp)
        .status()
        .context("running `cargo run -p dataplane-agent -- crds`")?;
    if !status.success() {
        bail!("`dataplane-agent crds` failed ({status})");
    }
    let files = yaml_files(&tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    let files = files?;
    if files.is_empty() {
        bail!("`dataplane-agent crds` wrote no CRD");
    }
    Ok(files)
}

/// Writes `deploy/crds/*.yaml`, or with `check` compares them.
pub fn run(check: bool) -> anyhow::Result<()> {
    let root = workspace_root();
    let dir = root.join("deploy").join("crds");
    let want = generate(&root)?;
    let have = yaml_files(&dir)?;
    let mut diffs = Vec::new();
    for (name, text) in &want {
        match have.get(name) {
            None => diffs.push(format!("{name}: missing")),
            Some(t) if t != text => diffs.push(format!("{name}: differs from the Rust types")),
            Some(_) => {}
        }
    }
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        diffs.push(format!("{name}: not generated (stale)"));
    }
    if check {
        if diffs.is_empty() {
            println!("deploy/crds is up to date ({} CRDs)", want.len());
            return Ok(());
        }
        bail!(
            "deploy/crds is out of date; run `cargo xtask manifests`:\n  {}",
            diffs.join("\n  ")
        );
    }
    std::fs::create_dir_all(&dir)?;
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        std::fs::remove_file(dir.join(name))?;
    }
    for (name, text) in &want {
        std::fs::write(dir.join(name), text)?;
    }
    println!("wrote {} CRDs to {}", want.len(), dir.display());
    Ok(())
}
