//! Developer tasks: `cargo xtask <command>`.

mod manifests;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Generate deploy/crds/*.yaml from the Rust types; with --check, fail when they differ.
    Manifests {
        #[arg(long)]
        check: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Task::Manifests { check } => manifests::run(check),
    }
}
