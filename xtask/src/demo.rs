//! `cargo xtask demo`: sets up the machine, builds, and runs the `mcs-demo` tool on the example
//! ClusterSet (see `tests/src/bin/mcs-demo.rs` for what it does).

use std::{path::PathBuf, process::Command};

use crate::{build, run, setup, workspace_root};

pub fn demo(dir: Option<PathBuf>, probes: u32, wait: bool) -> anyhow::Result<()> {
    setup::setup()?;
    let bin = build(false)?;
    let dir = dir.unwrap_or_else(|| workspace_root().join("examples/clusterset"));
    let mut cmd = Command::new(bin.join("mcs-demo"));
    cmd.arg("--dir")
        .arg(dir)
        .arg("--probes")
        .arg(probes.to_string())
        .env("MCS_AGENT_BIN", bin.join("dataplane-agent"))
        .current_dir(workspace_root());
    if wait {
        cmd.arg("--wait");
    }
    run(&mut cmd)
}
