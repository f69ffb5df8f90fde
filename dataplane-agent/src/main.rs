use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser as _;
use dataplane_agent::{
    bpf::{inspect, loader},
    cli::{Cli, Command},
    model, plan,
    roles::{node, standalone},
    telemetry,
};

/// mimalloc: a merge builds and frees millions of small objects (half a million endpoints,
/// their addresses, labels), where it is several times cheaper than the system allocator. The
/// library itself does not choose an allocator; the benches use this one too.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Node(args) => {
            let cfg = args.dataplane.loader_config().map_err(anyhow::Error::msg)?;
            let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
            rt.block_on(async move {
                let node = node::Node::start(&cfg).context("installing the dataplane")?;
                let (tx, rx) = tokio::sync::watch::channel(None::<Arc<node::NodeInputs>>);
                tokio::spawn(node::watch_node_dir(args.from_dir.clone(), tx));
                node::run(node, rx, node::shutdown_signal()).await;
                Ok(())
            })
        }
        Command::Run(args) => {
            let cfg = args.dataplane.loader_config().map_err(anyhow::Error::msg)?;
            // Fail before touching the kernel when the directory cannot be merged at all.
            plan::compute(&args.clusterset_dir, args.cluster.as_ref())
                .context("reading the clusterset directory")?;
            let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
            rt.block_on(async move {
                let node = node::Node::start(&cfg).context("installing the dataplane")?;
                let (tx, rx) = tokio::sync::watch::channel(None::<Arc<node::NodeInputs>>);
                tokio::spawn(standalone::watch_clusterset(
                    args.clusterset_dir.clone(),
                    args.cluster.clone(),
                    args.report.clone(),
                    tx,
                ));
                node::run(node, rx, node::shutdown_signal()).await;
                Ok(())
            })
        }
        Command::Plan(args) => {
            let plan = plan::compute(&args.clusterset_dir, args.cluster.as_ref())?;
            print!("{}", plan.to_json());
            Ok(())
        }
        Command::Inspect(args) => {
            let inspection = inspect::inspect(&args.pin.pin_dir)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&inspection)?);
            } else {
                print!("{}", inspect::render_text(&inspection));
            }
            Ok(())
        }
        Command::Uninstall(args) => {
            let done = loader::uninstall(&args.pin_dir)?;
            println!(
                "removed {} links and {} map pins from {}",
                done.links,
                done.maps,
                args.pin_dir.display()
            );
            Ok(())
        }
        Command::Crds => {
            for crd in model::crds()? {
                println!("---\n{}", serde_yaml::to_string(&crd)?.trim_end());
            }
            Ok(())
        }
    }
}
