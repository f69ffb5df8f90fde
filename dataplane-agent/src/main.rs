use anyhow::Context as _;
use clap::Parser as _;
use dataplane_agent::{
    bpf::{inspect, loader},
    cli::{self, Cli, Command},
    config::AgentConfig,
    model, plan,
    roles::{kube, node, standalone},
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

/// Installs the dataplane and, with `--dns-listen`, starts the DNS server fed by the node (it
/// serves until the returned server is dropped).
fn start_node(
    cfg: &loader::LoaderConfig,
    dns: &cli::DnsArgs,
) -> anyhow::Result<(node::Node, Option<dataplane_agent::dns::server::DnsServer>)> {
    let mut node = node::Node::start(cfg).context("installing the dataplane")?;
    let server = match dataplane_agent::dns::start(&dns.options())? {
        Some((zone, server)) => {
            node = node.with_dns(zone);
            Some(server)
        }
        None => None,
    };
    Ok((node, server))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Node(args) => {
            let cfg = args.dataplane.loader_config().map_err(anyhow::Error::msg)?;
            let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
            rt.block_on(async move {
                let (node, _dns) = start_node(&cfg, &args.dns)?;
                let (tx, rx) = node::channel();
                tokio::spawn(node::watch_node_dir(args.from_dir.clone(), tx));
                node::run(node, rx, node::shutdown_signal()).await;
                Ok(())
            })
        }
        Command::Run(args) => {
            let cfg = args.dataplane.loader_config().map_err(anyhow::Error::msg)?;
            if let Some(config_path) = &args.config {
                let config = AgentConfig::read(config_path)?;
                let options = kube::KubeModeOptions {
                    roles: args.roles,
                    identity: args.identity.clone().unwrap_or_else(cli::hostname),
                    lease_namespace: args.lease_namespace.clone(),
                    telemetry_address: args.metrics_address,
                    dns: args.dns.options(),
                };
                let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
                return rt
                    .block_on(kube::run(config, config_path, options, cfg))
                    .map_err(Into::into);
            }
            let Some(dir) = args.clusterset_dir.clone() else {
                anyhow::bail!("run needs --clusterset-dir or --config");
            };
            // Fail before touching the kernel when the directory cannot be merged at all.
            plan::compute(&dir, args.cluster.as_ref())
                .context("reading the clusterset directory")?;
            let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
            rt.block_on(async move {
                let (node, _dns) = start_node(&cfg, &args.dns)?;
                let (tx, rx) = node::channel();
                tokio::spawn(standalone::watch_clusterset(
                    dir,
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
        Command::Explain(args) => {
            let (ip, port, protocol) =
                dataplane_agent::cli::parse_frontend(&args.address).map_err(anyhow::Error::msg)?;
            let (imports, slices) = match (&args.from_dir, &args.clusterset_dir) {
                (Some(dir), _) => {
                    let (inputs, errors) = node::read_node_dir(dir)?;
                    for e in errors {
                        tracing::warn!("{e}");
                    }
                    (inputs.imports, inputs.slices)
                }
                (None, Some(dir)) => {
                    let plan = plan::compute(dir, args.cluster.as_ref())?;
                    (plan.merge.service_imports, plan.merge.endpoint_slices)
                }
                (None, None) => anyhow::bail!("give --from-dir or --clusterset-dir"),
            };
            let e = dataplane_agent::explain::explain(&imports, &slices, ip, port, protocol);
            if args.json {
                println!("{}", serde_json::to_string_pretty(&e)?);
            } else {
                print!("{e}");
            }
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
        Command::Crds(args) => {
            for crd in model::crds()? {
                let yaml = serde_yaml::to_string(&crd)?;
                match &args.out_dir {
                    None => println!("---\n{}", yaml.trim_end()),
                    Some(dir) => {
                        let name = crd.metadata.name.as_deref().unwrap_or("crd");
                        let path = dir.join(format!("{name}.yaml"));
                        std::fs::write(&path, format!("{}{yaml}", model::CRD_HEADER))
                            .with_context(|| format!("writing {}", path.display()))?;
                    }
                }
            }
            Ok(())
        }
    }
}
