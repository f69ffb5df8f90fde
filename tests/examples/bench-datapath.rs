//! Smoke entry for the datapath bench (root only):
//!
//! `cargo build --release -p dataplane-agent -p tests --bins --examples`
//! `sudo target/release/examples/bench-datapath [--services 1,1000] [--protos tcp,udp] [--modes socket-lb,iptables,nftables,direct]
//!   [--duration-secs 2] [--threads 4] [--change-samples 10] [--work-dir DIR] [--install-budget-secs 300]`
//! Prints one line per measurement, then the whole report as JSON.

use std::time::Duration;

use anyhow::Context as _;
use tests::bench::datapath::{self, DatapathOptions, Mode, Proto};

fn main() -> anyhow::Result<()> {
    let mut opts = DatapathOptions::quick(std::env::temp_dir().join("mcs-bench-datapath"));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--services" => {
                opts.services = v
                    .split(',')
                    .map(|n| n.parse().with_context(|| format!("bad count {n}")))
                    .collect::<anyhow::Result<_>>()?
            }
            "--modes" => {
                opts.modes = v
                    .split(',')
                    .map(|m| m.parse::<Mode>())
                    .collect::<anyhow::Result<_>>()?
            }
            "--protos" => {
                opts.protos = v
                    .split(',')
                    .map(|p| p.parse::<Proto>())
                    .collect::<anyhow::Result<_>>()?
            }
            "--duration-secs" => opts.duration = Duration::from_secs_f64(v.parse()?),
            "--threads" => opts.threads = v.parse()?,
            "--change-samples" => opts.change_samples = v.parse()?,
            "--work-dir" => opts.work_dir = v.into(),
            "--install-budget-secs" => opts.install_budget = Duration::from_secs(v.parse()?),
            other => anyhow::bail!("unknown option {other}"),
        }
    }
    let report = datapath::run(&opts)?;
    for t in &report.throughput {
        if let Some(why) = &t.skipped {
            println!(
                "{:<10} N={:<6} skipped: {why}",
                t.mode.to_string(),
                t.services
            );
            continue;
        }
        println!(
            "{:<10} {} N={:<6} {:>9.0} per s  p50 {:>7.1} us  p99 {:>8.1} us  install {:>8.3} s  conns {} failures {}  backends {:?}",
            t.mode.to_string(),
            t.proto,
            t.services,
            t.conns_per_sec,
            t.p50_us,
            t.p99_us,
            t.install_secs,
            t.connections,
            t.failures,
            t.by_backend
        );
    }
    for c in &report.change {
        println!(
            "change {:<10} N={:<6} p50 {:>9.2} ms  p99 {:>9.2} ms  ({} samples)",
            c.mode.to_string(),
            c.services,
            c.p50_ms,
            c.p99_ms,
            c.samples
        );
    }
    for h in &report.hooks {
        println!(
            "hook {:<9} N={:<6} {:>6.0} ns/call, floor {:>5.0} ns ({:.2}x) over {} calls: {}",
            h.hook,
            h.services,
            h.ns_per_call,
            h.floor_ns_per_call,
            h.ratio(),
            h.calls,
            h.calls_on
        );
    }
    for n in &report.notes {
        println!("note: {n}");
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
