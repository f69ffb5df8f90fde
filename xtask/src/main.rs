//! `cargo xtask`: the front door for developers and CI.
//!
//! - `setup`: installs what is missing (Debian packages, bpf-linker, nightly rust-src) and
//!   mounts bpffs. Safe to rerun.
//! - `build`: builds the eBPF object (via the agent's build.rs), the agent and the test tools.
//! - `test`: setup, then fmt, clippy, unit tests and the root-only integration tests.
//! - `run -- ARGS`: builds and runs `dataplane-agent ARGS`.
//! - `demo`: the standalone demo.
//! - `manifests [--check]`: generates `deploy/crds/` from the Rust types.
//! - `bench [--quick] [-- ARGS]`: the benchmarks, written to `target/bench/`.
//! - `kernels [PACKAGE...]`: the programs on other kernels, each in a VM (`tests/kernels/run.sh`).

mod demo;
mod manifests;
mod setup;

use std::process::Command;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xtask",
    about = "Build, test and demo tasks for the MCS dataplane"
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install missing packages, bpf-linker and rust-src; mount bpffs.
    Setup,
    /// Build the eBPF object, the agent and the test tools.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Run setup, formatting and lint checks, unit tests and the privileged integration tests.
    Test {
        /// Skip `setup` (for machines that are already set up).
        #[arg(long)]
        no_setup: bool,
        /// Extra arguments for the test harness (e.g. a test name filter).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Build and run the agent: `cargo xtask run -- plan --clusterset-dir examples/clusterset`.
    Run {
        #[arg(long)]
        release: bool,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Generate deploy/crds/*.yaml from the Rust types; with --check, fail when they differ.
    Manifests {
        #[arg(long)]
        check: bool,
    },
    /// Benchmarks: the socket LB against kube-proxy's iptables and nftables rule shapes and a
    /// direct connection, the control plane at scale, and clusterset.local DNS against NSD.
    /// Writes target/bench/report.md, report.json and datapath.png.
    Bench {
        /// A reduced run for a smoke check (under 3 minutes).
        #[arg(long)]
        quick: bool,
        /// Skip `setup` (for machines that are already set up).
        #[arg(long)]
        no_setup: bool,
        /// More arguments for `mcs-bench` (e.g. `--only datapath`, `--only dns`, `--only files`,
        /// `--services 1,1000`, `--dns-imports 1000,10000`, `--modes socket-lb,direct`,
        /// `--seconds 3`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Boot the eBPF programs on other kernels, each in a throwaway VM: load, verify, attach,
    /// and route TCP and UDP through a VIP (tests/kernels/run.sh). `test` runs it on the
    /// default kernel.
    Kernels {
        /// Debian kernel packages (default: the newest linux-image-6.1.0-*-amd64).
        packages: Vec<String>,
    },
    /// The standalone demo: three clusters in network namespaces, real traffic, a report.
    Demo {
        /// ClusterSet directory to run (default: examples/clusterset).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Probes per service, port and family.
        #[arg(long, default_value_t = 20)]
        probes: u32,
        /// Keep the demo running (and the agent serving) until Ctrl-C.
        #[arg(long)]
        wait: bool,
    },
}

/// Runs a command, echoing it, and fails when it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("+ {}", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("running {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `cargo` with the workspace root as the working directory.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}

pub fn build(release: bool) -> anyhow::Result<std::path::PathBuf> {
    let mut cmd = cargo();
    cmd.args(["build", "-p", "dataplane-agent", "-p", "tests", "--bins"]);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)?;
    Ok(workspace_root()
        .join("target")
        .join(if release { "release" } else { "debug" }))
}

/// The oldest Kubernetes version deploy/ supports (the CEL IP/CIDR library of
/// deploy/policy/clusterset-ips.yaml needs 1.31).
const OLDEST_KUBERNETES: &str = "1.31.0";

/// Validates every Kubernetes manifest in deploy/ against the oldest supported version's
/// schemas, rejecting unknown fields.
fn validate_deploy() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut files = Vec::new();
    for dir in ["", "crds", "rbac", "policy", "remote", "uninstall"] {
        for entry in std::fs::read_dir(root.join(dir)).context("reading deploy/")? {
            let path = entry?.path();
            // kustomization.yaml is kustomize's, not an API object.
            if path.extension().is_some_and(|e| e == "yaml")
                && path.file_name().is_some_and(|n| n != "kustomization.yaml")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    // Everything but remote/ (applied in the other clusters) and uninstall/ (applied after
    // it) is installed by the kustomization.
    let kustomization = std::fs::read_to_string(root.join("kustomization.yaml"))
        .context("reading deploy/kustomization.yaml")?;
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap_or(file).to_string_lossy();
        let apart = rel.starts_with("remote/") || rel.starts_with("uninstall/");
        if !apart && !kustomization.contains(&format!("- {rel}\n")) {
            bail!("deploy/kustomization.yaml does not list {rel}");
        }
    }
    // As a module: its console script may not be on PATH (pyenv shims, --user installs).
    run(Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
        .args(["-k", OLDEST_KUBERNETES])
        .args(&files))
}

fn test(no_setup: bool, args: &[String]) -> anyhow::Result<()> {
    if !no_setup {
        setup::setup()?;
    }
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "dataplane-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The eBPF crate: its host-side ABI library (the programs are linted as they are built).
    run(cargo().args([
        "clippy",
        "-p",
        "dataplane-ebpf",
        "--lib",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(cargo().args(["test", "-p", "dataplane-ebpf", "--lib"]))?;
    // The agent binary and the test tools must exist before the integration tests start them.
    build(false)?;
    // The committed CRDs must be what the Rust types generate.
    manifests::run(true)?;
    validate_deploy()?;
    // The oldest kernel the programs support (6.1), in a VM.
    kernels(&workspace_root().join("target").join("debug"), &[])?;
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--exclude", "dataplane-ebpf"])
        // Root-only tests fail instead of skipping: CI runs as root and must run them all.
        .env("MCS_REQUIRE_ROOT", "1")
        .arg("--")
        .args(args);
    run(&mut cmd)
}

/// Runs tests/kernels/run.sh on `packages` with the binaries in `bin`.
fn kernels(bin: &std::path::Path, packages: &[String]) -> anyhow::Result<()> {
    run(Command::new("sh")
        .arg(workspace_root().join("tests/kernels/run.sh"))
        .args(packages)
        .env("MCS_KERNELS_BIN", bin))
}

fn bench(quick: bool, no_setup: bool, args: &[String]) -> anyhow::Result<()> {
    if !no_setup {
        setup::setup()?;
    }
    // Release builds: the figures are for what users run.
    let dir = build(true)?;
    let out = workspace_root().join("target").join("bench");
    let mut cmd = Command::new(dir.join("mcs-bench"));
    cmd.current_dir(workspace_root())
        .arg("--out")
        .arg(&out)
        .args(quick.then_some("--quick"))
        .args(args)
        .env("MCS_AGENT_BIN", dir.join("dataplane-agent"));
    run(&mut cmd)
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Task::Setup => setup::setup(),
        Task::Build { release } => build(release).map(|_| ()),
        Task::Test { no_setup, args } => test(no_setup, &args),
        Task::Run { release, args } => {
            let dir = build(release)?;
            run(Command::new(dir.join("dataplane-agent")).args(args))
        }
        Task::Manifests { check } => manifests::run(check),
        Task::Kernels { packages } => kernels(&build(false)?, &packages),
        Task::Demo { dir, probes, wait } => demo::demo(dir, probes, wait),
        Task::Bench {
            quick,
            no_setup,
            args,
        } => bench(quick, no_setup, &args),
    }
}
