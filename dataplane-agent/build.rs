//! Builds the eBPF object with aya-build (nightly, `bpfel-unknown-none`) into `OUT_DIR`.
//! `MCS_EBPF_TOOLCHAIN` names another rustup toolchain for it (the image pins a dated nightly).
//!
//! With `AYA_BUILD_SKIP=1` an empty object is written instead, so `cargo check` and docs work
//! without the eBPF toolchain; the loader refuses an empty object with a clear error.
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-env-changed=MCS_EBPF_TOOLCHAIN");
    let out_dir = std::env::var("OUT_DIR").context("OUT_DIR")?;
    let skip = matches!(
        std::env::var("AYA_BUILD_SKIP").as_deref(),
        Ok("1") | Ok("true")
    );
    if skip {
        std::fs::write(format!("{out_dir}/dataplane-ebpf"), [])?;
        return Ok(());
    }
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "dataplane-ebpf")
        .ok_or_else(|| anyhow!("package dataplane-ebpf not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("dataplane-ebpf manifest has no parent directory"))?
        .as_str()
        .to_owned();
    let pinned = std::env::var("MCS_EBPF_TOOLCHAIN").unwrap_or_default();
    aya_build::build_ebpf(
        [aya_build::Package {
            name: ebpf.name.as_str(),
            root_dir: &root_dir,
            ..Default::default()
        }],
        if pinned.is_empty() {
            aya_build::Toolchain::Nightly
        } else {
            aya_build::Toolchain::Custom(&pinned)
        },
    )
}
