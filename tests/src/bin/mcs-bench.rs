//! `mcs-bench`: the benchmarks behind `cargo xtask bench` (root; network namespaces, a child
//! cgroup and a private bpffs directory, all removed afterwards). Writes `report.md`,
//! `report.json` and `datapath.png` into `--out`.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::Parser;
use dataplane_core::fixtures::synthetic::Shape;
use tests::bench::{
    control::{self, ControlOptions},
    datapath::{self, DatapathOptions, Mode, Proto},
    dns::{self, DnsBenchOptions},
    plot,
    report::{self, BenchReport, RunInfo},
};

/// The agent's allocator, so in-process figures (merge, map sync) match the agent's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Datapath and control-plane benchmarks of the MCS dataplane")]
struct Args {
    /// A reduced run (N = 1 and 1,000, short loads, 1,000-service control plane): a smoke check.
    #[arg(long)]
    quick: bool,
    /// Output directory.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Run only the datapath, the control-plane or the DNS part, or of the control plane only
    /// the agents fed from files (`node --from-dir`, `run --clusterset-dir`), the node role on
    /// the API server, the controller role, or the full merge + lb build.
    #[arg(long, value_parser = ["datapath", "control", "dns", "files", "node", "controller", "merge"])]
    only: Option<String>,
    /// Import counts for the DNS part (comma-separated).
    #[arg(long, value_delimiter = ',')]
    dns_imports: Option<Vec<usize>>,
    /// Datapath modes (comma-separated: socket-lb, iptables, nftables, direct).
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<Mode>>,
    /// Datapath transports (comma-separated: tcp, udp).
    #[arg(long, value_delimiter = ',')]
    protos: Option<Vec<Proto>>,
    /// Installed service counts for the datapath (comma-separated).
    #[arg(long, value_delimiter = ',')]
    services: Option<Vec<usize>>,
    /// Seconds of load per mode and N.
    #[arg(long)]
    seconds: Option<f64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let started = Instant::now();
    let started_at = tests::netns::sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
        .unwrap_or_default()
        .trim()
        .to_owned();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let work_dir = std::env::temp_dir().join(format!("mcs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work_dir)?;

    let services = args.services.clone().unwrap_or(if args.quick {
        vec![1, 1_000]
    } else {
        vec![1, 1_000, 10_000, 50_000]
    });
    let mut datapath_opts = if args.quick {
        DatapathOptions::quick(work_dir.clone())
    } else {
        DatapathOptions::full(work_dir.clone())
    };
    datapath_opts.services = services.clone();
    if let Some(modes) = &args.modes {
        datapath_opts.modes = modes.clone();
    }
    if let Some(protos) = &args.protos {
        datapath_opts.protos = protos.clone();
    }
    if let Some(seconds) = args.seconds {
        datapath_opts.duration = Duration::from_secs_f64(seconds);
    }
    let control_shape = if args.quick {
        Shape {
            services: 1_000,
            ..Shape::CONTROL_PLANE
        }
    } else {
        Shape::CONTROL_PLANE
    };
    let control_opts = ControlOptions {
        shape: control_shape,
        merge_runs: if args.quick { 2 } else { 5 },
        change_services: services,
        change_samples: if args.quick { 50 } else { 200 },
        event_changes: if args.quick { 100 } else { 1_000 },
        controller_changes: if args.quick { 100 } else { 1_000 },
        rss_shapes: if args.quick {
            vec![control_shape]
        } else {
            // 50,000 services with the control-plane shape would need 2.5 million backends
            // (several GiB of preallocated kernel maps); 2 endpoints per cluster keeps the
            // total endpoint count of the 10,000-service figure.
            vec![
                control_shape,
                Shape {
                    services: 50_000,
                    clusters: 5,
                    endpoints: 2,
                    ports: 2,
                },
            ]
        },
    };

    let wanted = |part: &str| args.only.as_deref().is_none_or(|only| only == part);
    let datapath = match wanted("datapath") {
        false => None,
        true => Some(datapath::run(&datapath_opts).context("datapath benchmark")?),
    };
    let control = match (wanted("control"), args.only.as_deref()) {
        (true, _) => Some(control::run(&control_opts).context("control-plane benchmark")?),
        (false, Some("files")) => {
            Some(control::run_files(&control_opts).context("file-fed agents benchmark")?)
        }
        (false, Some("node")) => {
            Some(control::run_node(&control_opts).context("node role benchmark")?)
        }
        (false, Some("merge")) => {
            Some(control::run_merge(&control_opts).context("merge + lb benchmark")?)
        }
        (false, Some("controller")) => {
            Some(control::run_controller(&control_opts).context("controller benchmark")?)
        }
        (false, _) => None,
    };
    let dns_opts = DnsBenchOptions {
        imports: args.dns_imports.clone().unwrap_or(if args.quick {
            vec![1_000]
        } else {
            vec![1_000, 10_000]
        }),
        seconds: args.seconds.unwrap_or(if args.quick { 2.0 } else { 5.0 }),
        rounds: if args.quick { 1 } else { 3 },
        work_dir: work_dir.clone(),
    };
    let dns = match wanted("dns") {
        false => None,
        true => Some(dns::run(&dns_opts).context("DNS benchmark")?),
    };
    let _ = std::fs::remove_dir_all(&work_dir);

    // What the user typed: xtask adds `--out DIR` itself.
    let mut shown = Vec::new();
    let mut args_iter = std::env::args().skip(1);
    while let Some(a) = args_iter.next() {
        if a == "--out" {
            args_iter.next();
        } else if !a.starts_with("--out=") {
            shown.push(a);
        }
    }
    let command = std::iter::once("cargo xtask bench".to_owned())
        .chain(shown)
        .collect::<Vec<_>>()
        .join(" ");
    let report = BenchReport {
        run: RunInfo {
            command,
            started: started_at,
            kernel: tests::netns::sh("uname", &["-r"])
                .unwrap_or_default()
                .trim()
                .to_owned(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: cpu_model(),
            memory_gib: memory_gib(),
            seconds: started.elapsed().as_secs_f64(),
        },
        datapath,
        control,
        dns,
    };
    if let Some(dp) = &report.datapath {
        plot::datapath(&args.out.join("datapath.png"), &dp.throughput)?;
    }
    let markdown = report::markdown(&report);
    std::fs::write(args.out.join("report.md"), &markdown)?;
    std::fs::write(
        args.out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("{markdown}");
    eprintln!(
        "bench: wrote {} (report.md, report.json{})",
        args.out.display(),
        if report.datapath.is_some() {
            ", datapath.png"
        } else {
            ""
        }
    );
    Ok(())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn memory_gib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0)
}
