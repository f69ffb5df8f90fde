use anyhow::Context as _;
use clap::{CommandFactory as _, FromArgMatches as _};
use dataplane_agent::{
    bpf::{inspect, loader},
    cli::{self, Cli, Command},
    config::AgentConfig,
    roles::{kube, node, standalone},
    source::{clusterset_dir, node_dir},
    telemetry,
};
use dataplane_core::{explain, model};

/// mimalloc: a merge builds and frees millions of small objects (half a million endpoints,
/// their addresses, labels), where it is several times cheaper than the system allocator. The
/// library itself does not choose an allocator; the benches use this one too.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    dataplane_agent::memory::configure();
    let matches = Cli::command().get_matches();
    let misused = cli::standalone_misused_flags(&matches);
    if !misused.is_empty() {
        Cli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "{}: Kubernetes mode only (--config), not with --clusterset-dir",
                    misused.join(", ")
                ),
            )
            .exit();
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let log_format = cli.log_format;
    telemetry::init(log_format);
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Once, on stderr: a JSON log line where logs are parsed, else plain text.
            // (Unless RUST_LOG filters errors out: then as text all the same.)
            match log_format {
                telemetry::LogFormat::Json if tracing::enabled!(tracing::Level::ERROR) => {
                    tracing::error!("{}", error_text(&e))
                }
                _ => eprintln!("error: {}", error_text(&e)),
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes, joined by ": ", leaving out a cause that the message before it
/// already quotes (most of the agent's errors name their source in their own message).
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Runs an async role on a fresh tokio runtime.
fn block_on<T>(role: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(dataplane_agent::memory::on_worker_idle)
        .build()
        .context("starting the tokio runtime")?;
    Ok(rt.block_on(role))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if matches!(
        cli.command,
        Command::Plan(_) | Command::Explain(_) | Command::Inspect(_) | Command::Crds(_)
    ) {
        // Commands that print for a pipe (`plan ... | head`) end quietly when it closes, as
        // other command-line tools do; Rust ignores SIGPIPE, and `print!` would panic instead.
        // SAFETY: setting a signal's disposition to the default; no handler runs our code.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cli.command {
        Command::Node(args) => {
            let cfg = args.dataplane.loader_config().map_err(anyhow::Error::msg)?;
            let policy = args
                .addresses
                .policy(&dataplane_core::merge::ClusterSetCidrs::default());
            block_on(node::run_from_dir(
                args.from_dir,
                &cfg,
                &args.dns.options(),
                policy,
            ))?
            .context("node role")
        }
        Command::Run(args) => {
            let loader_config = || args.dataplane.loader_config().map_err(anyhow::Error::msg);
            if let Some(config_path) = &args.config {
                // A controller-only agent loads nothing: it needs no cgroup2 mount.
                let cfg = if args.roles.node() {
                    Some(loader_config()?)
                } else {
                    None
                };
                let config = AgentConfig::read(config_path)?;
                let options = kube::KubeModeOptions {
                    roles: args.roles,
                    identity: args.identity.clone().unwrap_or_else(cli::hostname),
                    lease_namespace: args.lease_namespace.clone(),
                    metrics_address: args.metrics_address,
                    frontend_metrics: args.frontend_metrics,
                    health_address: args.health_address,
                    dns: args.dns.options(),
                    policy: args.addresses.policy(&config.clusterset.cidrs),
                };
                return Ok(block_on(kube::run(config, config_path, options, cfg))??);
            }
            let Some(dir) = args.clusterset_dir.clone() else {
                anyhow::bail!("run needs --clusterset-dir or --config");
            };
            let cfg = loader_config()?;
            let settings = standalone::Standalone {
                dir,
                cluster: args.cluster.clone(),
                report: args.report.clone(),
                dns: args.dns.options(),
                addresses: args.addresses.clone(),
            };
            Ok(block_on(standalone::run(settings, &cfg))??)
        }
        Command::Plan(args) => {
            let plan = clusterset_dir::plan(&args.clusterset_dir, args.cluster.as_ref())?;
            print!("{}", plan.to_json());
            Ok(())
        }
        Command::Explain(args) => {
            let (ip, port, protocol) =
                cli::parse_frontend(&args.address).map_err(anyhow::Error::msg)?;
            // The node's policy: the flags over the ClusterSet's CIDRs (a node directory
            // carries none: the defaults, or --clusterset-cidrs).
            let (imports, slices, policy) = match (&args.from_dir, &args.clusterset_dir) {
                (Some(dir), _) => {
                    let (inputs, errors) = node_dir::read(dir)
                        .with_context(|| format!("reading {}", dir.display()))?;
                    for e in errors {
                        tracing::warn!("{e}");
                    }
                    let policy = args.addresses.policy(&Default::default());
                    (inputs.imports, inputs.slices, policy)
                }
                (None, Some(dir)) => {
                    let merged = clusterset_dir::merge(dir, args.cluster.as_ref(), None)?;
                    let policy = args.addresses.policy(&merged.cidrs);
                    let m = merged.merge;
                    (
                        m.service_imports.iter().map(|r| r.to_k8s()).collect(),
                        m.endpoint_slices.iter().map(|s| s.to_k8s()).collect(),
                        policy,
                    )
                }
                (None, None) => anyhow::bail!("give --from-dir or --clusterset-dir"),
            };
            let e = explain::explain_with(&imports, &slices, ip, port, protocol, &policy);
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
            let own_root = loader::default_pin_dir();
            let own_root = own_root.parent().unwrap_or(std::path::Path::new("/"));
            let done = match loader::uninstall_every_version(&args.pin_dir, own_root) {
                Err(e @ loader::LoadError::Busy(_)) => {
                    return Err(anyhow::Error::new(e)
                        .context("an agent is running on this pin directory; stop it first"));
                }
                other => other?,
            };
            if done == loader::Uninstalled::default() && !args.pin_dir.exists() {
                println!("nothing installed under {}", args.pin_dir.display());
            } else {
                println!(
                    "removed {} links and {} map pins from {}",
                    done.links,
                    done.maps,
                    args.pin_dir.display()
                );
            }
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
