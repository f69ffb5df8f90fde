//! The DNS half of `cargo xtask bench` (`--only dns`): our `clusterset.local` server against NSD
//! serving the same records from a zone file, both on loopback, loaded by `dnsperf` in the same
//! run.
//!
//! For each import count N a node directory gets N imports ([`records`]: ClusterSetIP imports,
//! dual-stack, two named ports; every tenth one headless, over two clusters of two pods with
//! hostnames). Our server is the agent binary (`node --from-dir DIR --dns-listen ...`, with a
//! child cgroup and private pin directory that no process joins); NSD gets a zone file written
//! from the same [`records`], not from our server. The query file asks A, AAAA, SRV, PTR and
//! per-host names of every import, and names that do not exist. Per server: the highest rate
//! `dnsperf` reaches (`qps`), then the latency percentiles at a fixed rate of half NSD's (from
//! dnsperf's per-query output, `-v`). The two servers take turns, and the median of `rounds`
//! runs is reported. The agent's memory is read with and without `--dns-listen` over the same
//! directory.

use std::{
    fmt::Write as _,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde::Serialize;

use super::stats::{Summary, summarize};
use crate::{
    agent::Agent,
    dns::{free_port, wait_ready},
    netns::{Topology, die_with_parent},
};

/// What to measure.
#[derive(Clone, Debug)]
pub struct DnsBenchOptions {
    /// Import counts.
    pub imports: Vec<usize>,
    /// Seconds of load per dnsperf run.
    pub seconds: f64,
    /// Runs per server and measure; the median one is reported.
    pub rounds: usize,
    /// Where the zone files, the node directory and the query file go.
    pub work_dir: PathBuf,
}

/// One server at one import count.
#[derive(Clone, Debug, Serialize)]
pub struct DnsRow {
    pub imports: usize,
    pub server: String,
    /// Highest rate dnsperf reached (queries answered per second).
    pub qps: f64,
    /// Queries dnsperf sent in that run that got no answer.
    pub lost: u64,
    /// The fixed rate of the latency run (half NSD's qps).
    pub latency_rate: f64,
    pub latency: Summary,
}

/// The agent's memory with and without DNS, over the same inputs.
#[derive(Clone, Debug, Serialize)]
pub struct DnsMemory {
    pub imports: usize,
    pub rss_without_dns_mib: f64,
    pub rss_with_dns_mib: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct DnsReport {
    pub seconds: f64,
    pub rounds: usize,
    pub queries_per_file: usize,
    pub rows: Vec<DnsRow>,
    pub memory: Vec<DnsMemory>,
}

/// One import of the synthetic set.
#[derive(Clone, Debug)]
pub struct Import {
    pub name: String,
    /// `None`: headless.
    pub ips: Option<(Ipv4Addr, Ipv6Addr)>,
    /// (cluster, hostname, ip) of each ready pod (headless only).
    pub pods: Vec<(String, String, Ipv4Addr)>,
}

pub const NAMESPACE: &str = "bench";
/// The ports of every import: (name, port, target port).
const PORTS: [(&str, u16, u16); 2] = [("http", 80, 8080), ("metrics", 9090, 9090)];

/// The synthetic imports: `svc-<i>` in namespace `bench`; every tenth is headless.
pub fn records(n: usize) -> Vec<Import> {
    (0..n)
        .map(|i| {
            let headless = i % 10 == 9;
            let hi = u8::try_from(i >> 8).unwrap_or(u8::MAX);
            let lo = (i & 255) as u8;
            Import {
                name: format!("svc-{i}"),
                ips: (!headless).then(|| {
                    (
                        Ipv4Addr::new(241, 0, hi, lo),
                        Ipv6Addr::new(0xfd00, 0x241, 0, 0, 0, 0, 0, i as u16),
                    )
                }),
                pods: if headless {
                    (0..2)
                        .flat_map(|c| {
                            (0..2).map(move |p| {
                                (
                                    format!("cluster-{c}"),
                                    format!("pod-{p}"),
                                    Ipv4Addr::new(10 + c, hi, lo, p + 1),
                                )
                            })
                        })
                        .collect()
                } else {
                    Vec::new()
                },
            }
        })
        .collect()
}

fn fqdn(name: &str) -> String {
    format!("{name}.{NAMESPACE}.svc.clusterset.local.")
}

/// The node directory's YAML: every import and its imported slices.
pub fn node_yaml(imports: &[Import]) -> String {
    let mut out = String::new();
    for im in imports {
        let ports = PORTS
            .iter()
            .map(|(n, p, _)| format!("{{name: {n}, protocol: TCP, port: {p}}}"))
            .collect::<Vec<_>>()
            .join(", ");
        let slice_ports = PORTS
            .iter()
            .map(|(n, _, t)| format!("{{name: {n}, protocol: TCP, port: {t}}}"))
            .collect::<Vec<_>>()
            .join(", ");
        match im.ips {
            Some((v4, v6)) => {
                let _ = write!(
                    out,
                    "---\napiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\nmetadata: {{name: {}, namespace: {NAMESPACE}}}\nspec: {{type: ClusterSetIP, ips: [\"{v4}\", \"{v6}\"], ipFamilies: [IPv4, IPv6], ports: [{ports}]}}\n",
                    im.name
                );
            }
            None => {
                let _ = write!(
                    out,
                    "---\napiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\nmetadata: {{name: {}, namespace: {NAMESPACE}}}\nspec: {{type: Headless, ports: [{ports}]}}\n",
                    im.name
                );
                for cluster in ["cluster-0", "cluster-1"] {
                    let endpoints = im
                        .pods
                        .iter()
                        .filter(|(c, _, _)| c == cluster)
                        .map(|(_, h, ip)| format!("{{addresses: [\"{ip}\"], hostname: {h}}}"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let _ = write!(
                        out,
                        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {}-{cluster}, namespace: {NAMESPACE}, labels: {{multicluster.kubernetes.io/service-name: {}, multicluster.kubernetes.io/source-cluster: {cluster}}}}}\naddressType: IPv4\nports: [{slice_ports}]\nendpoints: [{endpoints}]\n",
                        im.name, im.name
                    );
                }
            }
        }
    }
    out
}

/// The same records as a zone file for `clusterset.local` and one for `241.in-addr.arpa`
/// (written from [`records`], as the specification spells them; not from our server).
pub fn zone_files(imports: &[Import], ttl: u32) -> (String, String) {
    let soa = |origin: &str| {
        format!(
            "$ORIGIN {origin}\n$TTL {ttl}\n@ IN SOA ns.dns.clusterset.local. hostmaster.clusterset.local. 1 7200 1800 86400 {ttl}\n@ IN NS ns.dns.clusterset.local.\n"
        )
    };
    let mut fwd = soa("clusterset.local.");
    fwd.push_str("dns-version 28800 IN TXT \"1.0.0\"\n");
    let mut rev = soa("241.in-addr.arpa.");
    for im in imports {
        let f = fqdn(&im.name);
        match im.ips {
            Some((v4, v6)) => {
                let _ = writeln!(fwd, "{f} IN A {v4}\n{f} IN AAAA {v6}");
                for (n, p, _) in PORTS {
                    let _ = writeln!(fwd, "_{n}._tcp.{f} IN SRV 0 100 {p} {f}");
                }
                let o = v4.octets();
                let _ = writeln!(
                    rev,
                    "{}.{}.{}.241.in-addr.arpa. IN PTR {f}",
                    o[3], o[2], o[1]
                );
            }
            None => {
                let weight = 100 / im.pods.len().max(1);
                for (cluster, host, ip) in &im.pods {
                    let host_name = format!("{host}.{cluster}.{f}");
                    let _ = writeln!(fwd, "{f} IN A {ip}\n{host_name} IN A {ip}");
                    for (n, _, t) in PORTS {
                        let _ = writeln!(fwd, "_{n}._tcp.{f} IN SRV 0 {weight} {t} {host_name}");
                    }
                }
            }
        }
    }
    (fwd, rev)
}

/// The dnsperf query file: for each import its A, AAAA, SRV and PTR (ClusterSetIP) or A, SRV
/// and a host's A (headless); every 20th import also a name that does not exist.
pub fn queries(imports: &[Import]) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for (i, im) in imports.iter().enumerate() {
        let f = fqdn(&im.name);
        out.push((f.clone(), "A"));
        out.push((format!("_http._tcp.{f}"), "SRV"));
        match im.ips {
            Some((v4, _)) => {
                out.push((f.clone(), "AAAA"));
                let o = v4.octets();
                out.push((
                    format!("{}.{}.{}.241.in-addr.arpa.", o[3], o[2], o[1]),
                    "PTR",
                ));
            }
            None => {
                if let Some((c, h, _)) = im.pods.first() {
                    out.push((format!("{h}.{c}.{f}"), "A"));
                }
            }
        }
        if i % 20 == 0 {
            out.push((
                format!("missing-{i}.{NAMESPACE}.svc.clusterset.local."),
                "A",
            ));
        }
    }
    out
}

/// A running NSD with the zone files in `dir`; killed on drop.
pub struct Nsd {
    child: Child,
    pub addr: SocketAddr,
}

impl Nsd {
    pub fn start(dir: &Path, imports: &[Import], ttl: u32) -> anyhow::Result<Nsd> {
        std::fs::create_dir_all(dir)?;
        let (fwd, rev) = zone_files(imports, ttl);
        std::fs::write(dir.join("clusterset.local.zone"), fwd)?;
        std::fs::write(dir.join("241.in-addr.arpa.zone"), rev)?;
        let port = free_port()?;
        let d = dir.display();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let conf = format!(
            "server:\n  ip-address: 127.0.0.1@{port}\n  port: {port}\n  username: \"\"\n  chroot: \"\"\n  zonesdir: \"{d}\"\n  database: \"\"\n  pidfile: \"{d}/nsd.pid\"\n  xfrdfile: \"{d}/xfrd.state\"\n  zonelistfile: \"{d}/zone.list\"\n  logfile: \"{d}/nsd.log\"\n  server-count: {cpus}\n  reuseport: yes\n  verbosity: 0\n  hide-version: yes\n  hide-identity: yes\nremote-control:\n  control-enable: no\nzone:\n  name: clusterset.local\n  zonefile: clusterset.local.zone\nzone:\n  name: 241.in-addr.arpa\n  zonefile: 241.in-addr.arpa.zone\n"
        );
        let conf_path = dir.join("nsd.conf");
        std::fs::write(&conf_path, conf)?;
        let child = die_with_parent(&mut Command::new("nsd"))
            .args(["-d", "-c"])
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nsd (Debian package nsd; cargo xtask setup installs it)")?;
        let nsd = Nsd {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        wait_ready(nsd.addr, "dns-version.clusterset.local.", 200)
            .with_context(|| format!("nsd did not answer; its log: {d}/nsd.log"))?;
        Ok(nsd)
    }
}

impl Drop for Nsd {
    fn drop(&mut self) {
        // SIGTERM lets NSD stop its server processes; SIGKILL if it does not exit.
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Our server: the agent binary in node mode over `dir`, with DNS on a free loopback port.
pub fn start_agent(topo: &Topology, dir: &Path, dns: bool) -> anyhow::Result<(Agent, SocketAddr)> {
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["node", "--from-dir", dir.to_str().context("utf-8 path")?];
    if dns {
        args.extend(["--dns-listen", &listen]);
    }
    let agent = Agent::start(topo, &args)?;
    Ok((agent, listen.parse()?))
}

/// What one dnsperf run reported.
#[derive(Clone, Debug, Default)]
struct Perf {
    qps: f64,
    lost: u64,
    latencies: Vec<Duration>,
}

/// Runs dnsperf against `server` for `seconds`: as fast as it can, or at `rate` with the
/// per-query latencies.
fn dnsperf(
    server: SocketAddr,
    query_file: &Path,
    seconds: f64,
    rate: Option<f64>,
) -> anyhow::Result<Perf> {
    let mut cmd = Command::new("dnsperf");
    cmd.args([
        "-s",
        &server.ip().to_string(),
        "-p",
        &server.port().to_string(),
    ])
    .arg("-d")
    .arg(query_file)
    .args([
        "-l",
        &format!("{seconds}"),
        "-c",
        "4",
        "-q",
        "200",
        "-t",
        "2",
    ]);
    if let Some(rate) = rate {
        cmd.args(["-Q", &format!("{}", rate.max(1.0) as u64), "-v"]);
    }
    let out = cmd
        .output()
        .context("running dnsperf (Debian package dnsperf; cargo xtask setup installs it)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "dnsperf failed: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_dnsperf(&text)
}

/// Reads `Queries per second:`, `Queries lost:` and, with `-v`, the latency at the end of each
/// per-query line (`> NOERROR name TYPE 0.000123`).
fn parse_dnsperf(text: &str) -> anyhow::Result<Perf> {
    let mut perf = Perf::default();
    let mut saw_qps = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("Queries per second:") {
            perf.qps = v.trim().parse().context("dnsperf's queries per second")?;
            saw_qps = true;
        } else if let Some(v) = line.strip_prefix("Queries lost:") {
            perf.lost = v
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        } else if line.starts_with("> ")
            && let Some(secs) = line.rsplit(' ').next().and_then(|s| s.parse::<f64>().ok())
        {
            perf.latencies.push(Duration::from_secs_f64(secs));
        }
    }
    if !saw_qps {
        bail!("no 'Queries per second' in dnsperf's output:\n{text}");
    }
    Ok(perf)
}

/// Writes the dnsperf query file for `imports` and returns its path and line count.
pub fn write_queries(dir: &Path, imports: &[Import]) -> anyhow::Result<(PathBuf, usize)> {
    let q = queries(imports);
    let path = dir.join("queries.txt");
    let text: String = q.iter().map(|(n, t)| format!("{n} {t}\n")).collect();
    std::fs::write(&path, text)?;
    Ok((path, q.len()))
}

/// Runs the DNS benchmark.
pub fn run(opts: &DnsBenchOptions) -> anyhow::Result<DnsReport> {
    for tool in ["dnsperf", "nsd"] {
        if !which(tool) {
            bail!(
                "{tool} is not installed (Debian package {tool}; `cargo xtask setup` installs it)"
            );
        }
    }
    let mut report = DnsReport {
        seconds: opts.seconds,
        rounds: opts.rounds,
        queries_per_file: 0,
        rows: Vec::new(),
        memory: Vec::new(),
    };
    for &n in &opts.imports {
        let dir = opts.work_dir.join(format!("dns-{n}"));
        let node_dir = dir.join("node");
        std::fs::create_dir_all(&node_dir)?;
        let imports = records(n);
        std::fs::write(node_dir.join("imports.yaml"), node_yaml(&imports))?;
        let (query_file, count) = write_queries(&dir, &imports)?;
        report.queries_per_file = count;
        let topo = Topology::new(&[])?;

        // The agent without DNS first: its memory over the same inputs.
        let (mut plain, _) = start_agent(&topo, &node_dir, false)?;
        // Every ClusterSetIP import: two families x (two ports + the per-VIP entry).
        let frontends = imports.iter().filter(|i| i.ips.is_some()).count() * 2 * (PORTS.len() + 1);
        plain.wait_for("the imports in the maps", Duration::from_secs(120), |i| {
            i.frontends.len() >= frontends
        })?;
        let rss_without = rss_of(&plain)?;
        drop(plain);
        let (mut agent, addr) = start_agent(&topo, &node_dir, true)?;
        agent.wait_for("the imports in the maps", Duration::from_secs(120), |i| {
            i.frontends.len() >= frontends
        })?;
        wait_ready(addr, "svc-0.bench.svc.clusterset.local.", 600)?;
        let rss_with = rss_of(&agent)?;
        report.memory.push(DnsMemory {
            imports: n,
            rss_without_dns_mib: rss_without,
            rss_with_dns_mib: rss_with,
        });
        let nsd = Nsd::start(
            &dir.join("nsd"),
            &imports,
            dataplane_agent::dns::zone::DEFAULT_TTL,
        )?;

        // The servers take turns, round after round (the machine is shared: the median round
        // of each is reported).
        let servers = [("ours", addr), ("nsd", nsd.addr)];
        let mut peaks: [Vec<Perf>; 2] = Default::default();
        for round in 0..opts.rounds.max(1) {
            for i in [round % 2, 1 - round % 2] {
                peaks[i].push(dnsperf(servers[i].1, &query_file, opts.seconds, None)?);
            }
        }
        let rate = median_by(&peaks[1], |p| p.qps).map_or(0.0, |p| p.qps) / 2.0;
        let mut latencies: [Vec<Summary>; 2] = Default::default();
        for round in 0..opts.rounds.max(1) {
            for i in [round % 2, 1 - round % 2] {
                let mut run = dnsperf(servers[i].1, &query_file, opts.seconds, Some(rate))?;
                latencies[i].push(summarize(&mut run.latencies));
            }
        }
        for (i, (server, _)) in servers.iter().enumerate() {
            let peak = median_by(&peaks[i], |p| p.qps).cloned().unwrap_or_default();
            report.rows.push(DnsRow {
                imports: n,
                server: (*server).into(),
                qps: peak.qps,
                lost: peak.lost,
                latency_rate: rate,
                latency: median_by(&latencies[i], |s| s.p99_ms)
                    .copied()
                    .unwrap_or_default(),
            });
        }
        drop(nsd);
        drop(agent);
        drop(topo);
    }
    Ok(report)
}

/// The middle item by `key` (the upper one of an even count).
fn median_by<T>(items: &[T], key: impl Fn(&T) -> f64) -> Option<&T> {
    let mut sorted: Vec<&T> = items.iter().collect();
    sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
    sorted.get(sorted.len() / 2).copied()
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

fn rss_of(agent: &Agent) -> anyhow::Result<f64> {
    let pid = agent.pid().context("the agent is not running")?;
    Ok(super::control::memory_of(pid)?.0)
}

/// The report's DNS section.
pub fn markdown(out: &mut String, dns: &DnsReport) {
    let _ = writeln!(
        out,
        "## clusterset.local DNS\n\nOur server (the agent, `node --from-dir --dns-listen`) and NSD with the same records from a zone file, on loopback, loaded by dnsperf ({} s per run, 4 clients, {} queries in the file: A, AAAA, SRV, PTR, per-host and missing names). `qps`: the highest rate dnsperf reached; latency: at a fixed rate of half NSD's qps. The servers take turns; each figure is the median of {} runs.\n",
        dns.seconds, dns.queries_per_file, dns.rounds
    );
    let _ = writeln!(
        out,
        "| imports | server | qps | vs NSD | lost | latency rate | p50 ms | p99 ms |\n|---:|---|---:|---:|---:|---:|---:|---:|"
    );
    for row in &dns.rows {
        let nsd = dns
            .rows
            .iter()
            .find(|r| r.imports == row.imports && r.server == "nsd")
            .map_or(0.0, |r| r.qps);
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} | {:.0} | {:.3} | {:.3} |",
            row.imports,
            row.server,
            row.qps,
            if nsd > 0.0 {
                format!("{:.2}x", row.qps / nsd)
            } else {
                "-".into()
            },
            row.lost,
            row.latency_rate,
            row.latency.p50_ms,
            row.latency.p99_ms
        );
    }
    let _ = writeln!(
        out,
        "\n| imports | agent RSS without DNS | with DNS | added |\n|---:|---:|---:|---:|"
    );
    for m in &dns.memory {
        let _ = writeln!(
            out,
            "| {} | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
            m.imports,
            m.rss_without_dns_mib,
            m.rss_with_dns_mib,
            m.rss_with_dns_mib - m.rss_without_dns_mib
        );
    }
    out.push('\n');
}
