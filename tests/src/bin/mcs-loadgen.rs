//! The datapath bench's load generator and backend server.
//!
//! `mcs-loadgen serve [--netns NAME] [--threads T] [tcp:|udp:]ADDR:PORT...`
//!   answers one short request per TCP connection with `ADDR:PORT\n`, and every UDP datagram
//!   with `ADDR:PORT\n` and the request; prints `ready` once bound.
//! `mcs-loadgen load [--netns NAME] [--cgroup DIR] [--proto tcp|udp] [--threads T]
//!   [--warmup-ms W] [--duration-ms D] [--max-conns M] --targets FILE`
//!   FILE lists one `ip:port` per line; prints one JSON `LoadResult` line.
//! Both enter the cgroup and namespace themselves, before any thread starts.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use tests::bench::datapath::load::{self, LoadSpec, Proto};

fn main() {
    if let Err(e) = real_main() {
        eprintln!("mcs-loadgen: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().unwrap_or_default();
    let mut netns = None;
    let mut cgroup = None;
    let mut threads = 4usize;
    let mut warmup = Duration::from_millis(500);
    let mut duration = Duration::from_secs(5);
    let mut max_conns = 5_000_000u64;
    let mut targets = None;
    let mut proto = Proto::Tcp;
    let mut positional = Vec::new();
    let num = |v: Option<String>, what: &str| -> anyhow::Result<u64> {
        v.with_context(|| format!("{what} needs a value"))?
            .parse::<u64>()
            .with_context(|| format!("bad {what}"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--netns" => netns = args.next(),
            "--cgroup" => cgroup = args.next().map(PathBuf::from),
            "--threads" => threads = num(args.next(), "--threads")? as usize,
            "--warmup-ms" => warmup = Duration::from_millis(num(args.next(), "--warmup-ms")?),
            "--duration-ms" => duration = Duration::from_millis(num(args.next(), "--duration-ms")?),
            "--max-conns" => max_conns = num(args.next(), "--max-conns")?,
            "--targets" => targets = args.next().map(PathBuf::from),
            "--proto" => proto = args.next().context("--proto needs a value")?.parse()?,
            _ => positional.push(a),
        }
    }
    load::enter(netns.as_deref(), cgroup.as_deref())?;
    match cmd.as_str() {
        "serve" => {
            let addrs = positional
                .iter()
                .map(|a| {
                    let (proto, addr) = match a.split_once(':') {
                        Some((p @ ("tcp" | "udp"), rest)) => (p.parse::<Proto>()?, rest),
                        _ => (Proto::Tcp, a.as_str()),
                    };
                    let addr = addr
                        .parse::<SocketAddr>()
                        .with_context(|| format!("bad {a}"))?;
                    Ok((proto, addr))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            load::serve(&addrs, threads)
        }
        "load" => {
            let file = targets.context("load needs --targets FILE")?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let targets = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    l.trim()
                        .parse::<SocketAddr>()
                        .with_context(|| format!("bad {l}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let result = load::run_load(&LoadSpec {
                proto,
                targets,
                threads,
                warmup,
                duration,
                max_conns,
            })?;
            println!("{}", serde_json::to_string(&result)?);
            Ok(())
        }
        _ => bail!("usage: mcs-loadgen serve|load ... (see the source header)"),
    }
}
