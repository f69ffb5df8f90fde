//! `cargo xtask setup`: everything the build and the tests need, installed only when missing.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::run;

/// Debian packages: LLVM 22 for bpf-linker; iproute2 for the test namespaces; bpftool to read
/// the maps; iptables and nftables for the benchmarks' kube-proxy modes, dnsperf and NSD for the
/// DNS benchmark, a font for the benchmark plot, and qemu and a static busybox for the check on
/// older kernels (`tests/kernels/run.sh`).
const PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "iproute2",
    "bpftool",
    "iptables",
    "nftables",
    "dnsperf",
    "nsd",
    "fonts-dejavu-core",
    "qemu-system-x86",
    "busybox-static",
    // `kubernetes-validate` comes from PyPI.
    "python3-pip",
];
const BPF_LINKER_VERSION: &str = "0.13.0";

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn bpf_linker_version() -> Option<String> {
    let out = Command::new("bpf-linker").arg("--version").output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The schema validator of `cargo xtask test` (PyPI).
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

pub fn setup() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        if !is_root() {
            bail!("packages {missing:?} are missing; run `cargo xtask setup` as root");
        }
        run(Command::new("apt-get").arg("update"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }

    // Validates deploy/ against the Kubernetes schemas (PyPI).
    let validator = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--version"])
        .output();
    if !validator.is_ok_and(|o| o.status.success()) {
        let pip = |extra: &[&str]| {
            Command::new("python3")
                .args(["-m", "pip", "install", "--quiet"])
                .args(extra)
                .arg(format!(
                    "kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}"
                ))
                .status()
                .is_ok_and(|s| s.success())
        };
        // Debian's python marks its site-packages as externally managed.
        if !pip(&[]) && !pip(&["--break-system-packages"]) {
            bail!("installing kubernetes-validate with pip failed");
        }
    }

    if !bpf_linker_version().is_some_and(|v| v.contains(BPF_LINKER_VERSION)) {
        // llvm-sys finds LLVM 22 through LLVM_PREFIX; the default llvm-config may be older.
        run(Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22"))?;
    }

    let sysroot = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .context("the nightly toolchain is needed to build the eBPF programs")?;
    if !sysroot.status.success() {
        bail!("`rustup run nightly rustc` failed: the nightly toolchain is needed for eBPF");
    }
    let src = std::path::Path::new(String::from_utf8_lossy(&sysroot.stdout).trim())
        .join("lib/rustlib/src/rust/library");
    if !src.exists() {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }

    let mounted = Command::new("mountpoint")
        .args(["-q", "/sys/fs/bpf"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        if !is_root() {
            bail!("bpffs is not mounted at /sys/fs/bpf; run `cargo xtask setup` as root");
        }
        run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))?;
    }
    eprintln!(
        "setup: packages, bpf-linker {BPF_LINKER_VERSION}, nightly rust-src and bpffs are ready"
    );
    Ok(())
}
