//! The datapath half of `cargo xtask bench`: short-connection (TCP) and request/response
//! datagram (UDP) throughput and latency through the socket LB, kube-proxy-shaped iptables and
//! nftables rules, and direct connections, with N services installed; for iptables and
//! nftables, the time one service change takes; and for the socket LB, what each of its
//! programs costs per call next to a do-nothing program ([`hooks`]).
//!
//! Everything runs in a [`Topology`] (its own namespaces, child cgroup and pin dir, removed on
//! drop): one backend namespace with four TCP and four UDP servers (IPv4 and IPv6), and a
//! client namespace where the load generator runs. The netfilter rules and the 241.0.0.0/8
//! route they need live only in the client namespace, which has no route off the machine.
//! Modes are measured one at a time against the same backends, TCP services first, then as
//! many UDP services.

pub mod hooks;
pub mod load;
pub mod rules;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt, fs,
    io::{BufRead as _, Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::PathBuf,
    process::{Child, Command, Stdio},
    str::FromStr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde::Serialize;

use crate::{
    agent::Agent,
    netns::{Topology, agent_bin, die_with_parent, sh, workspace_bin},
};

use super::stats::median;
use hooks::{Floor, HookCost, Reference, StatsGuard, Window};
use load::LoadResult;
pub use load::Proto;
use rules::Service;

/// How new connections reach a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The agent's cgroup connect4 program rewrites the VIP before the SYN is built.
    SocketLb,
    /// kube-proxy iptables mode: nat OUTPUT -> KUBE-SERVICES (linear) -> KUBE-SVC -> KUBE-SEP DNAT.
    Iptables,
    /// kube-proxy nftables mode: one verdict-map lookup -> service chain -> endpoint DNAT.
    Nftables,
    /// Backend addresses, no load balancing: the floor of what the topology costs.
    Direct,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::SocketLb, Mode::Iptables, Mode::Nftables, Mode::Direct];

    fn via_vip(self) -> bool {
        self != Mode::Direct
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::SocketLb => "socket-lb",
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Direct => "direct",
        })
    }
}

impl FromStr for Mode {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Mode> {
        Mode::ALL
            .into_iter()
            .find(|m| m.to_string() == s)
            .with_context(|| format!("unknown mode {s:?} (socket-lb, iptables, nftables, direct)"))
    }
}

#[derive(Clone, Debug)]
pub struct DatapathOptions {
    /// Installed service counts, measured in this order.
    pub services: Vec<usize>,
    /// Transports, measured in this order for each service count (N services of each).
    pub protos: Vec<Proto>,
    /// Modes, measured one after the other for each service count.
    pub modes: Vec<Mode>,
    /// Measured load time per (mode, N); a warm-up of a fifth of it (0.2 to 1 s) comes first.
    pub duration: Duration,
    /// Load generator threads (each runs one connection at a time).
    pub threads: usize,
    /// One-service changes timed per (iptables or nftables, N).
    pub change_samples: usize,
    /// Scratch space (agent input YAML, target lists); created if missing.
    pub work_dir: PathBuf,
    /// An iptables or nftables install predicted (quadratically, from the same mode's install
    /// at the previous N, if that had at least 1000 services and took at least 1 s) to take
    /// longer than this is not attempted: its row carries `skipped`
    /// and a note says why. nftables installs grow worse than quadratically on this kernel.
    pub install_budget: Duration,
}

impl DatapathOptions {
    /// The quick run: N in {1, 1000}, every mode, 2 s each.
    pub fn quick(work_dir: PathBuf) -> Self {
        DatapathOptions {
            services: vec![1, 1000],
            protos: vec![Proto::Tcp, Proto::Udp],
            modes: Mode::ALL.to_vec(),
            duration: Duration::from_secs(2),
            threads: 4,
            change_samples: 10,
            work_dir,
            install_budget: Duration::from_secs(300),
        }
    }

    /// The full run: N in {1, 1000, 10000, 50000}, every mode, 5 s each.
    pub fn full(work_dir: PathBuf) -> Self {
        DatapathOptions {
            services: vec![1, 1000, 10_000, 50_000],
            duration: Duration::from_secs(5),
            change_samples: 20,
            ..Self::quick(work_dir)
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Throughput {
    pub mode: Mode,
    /// TCP: one connection per exchange; UDP: one datagram and its reply per exchange.
    pub proto: Proto,
    pub services: usize,
    /// Completed exchanges (TCP: connect, request, reply; UDP: request and reply datagrams) in
    /// the measured period (all of socket-lb's runs; its rate is the median run's).
    pub connections: u64,
    pub failures: u64,
    /// Exchanges per second: connections per second for TCP, request/reply pairs for UDP.
    pub conns_per_sec: f64,
    /// Per-exchange latency, connect() (or sendto()) through the reply.
    pub p50_us: f64,
    pub p99_us: f64,
    /// Time to program all N services: socket-lb from agent start to its "maps synced" log
    /// line; iptables/nftables one `iptables-restore` / `nft -f`; direct 0.
    pub install_secs: f64,
    /// Replies per answering backend.
    pub by_backend: BTreeMap<String, u64>,
    /// The backends the targeted services (or, for direct, the targets) may reach.
    pub expected_backends: Vec<String>,
    /// How many distinct services (or backend addresses) the load was spread over.
    pub targets: usize,
    /// Failures per error text.
    pub errors: BTreeMap<String, u64>,
    /// Why this (mode, N) was not measured (then every count is 0), e.g. an install predicted
    /// to exceed `install_budget`.
    pub skipped: Option<String>,
    /// `direct` conn/s measured next to this mode, so the ratio is not skewed by the machine
    /// speeding up or slowing down between modes: for socket-lb the median of direct runs
    /// interleaved with its own runs (the programs only see the socket-lb client's cgroup);
    /// for iptables/nftables one direct run just before their rules go in (once installed,
    /// every packet of the namespace passes them).
    pub paired_direct_cps: Option<f64>,
}

impl Throughput {
    fn empty(mode: Mode, proto: Proto, services: usize) -> Self {
        Throughput {
            mode,
            proto,
            services,
            connections: 0,
            failures: 0,
            conns_per_sec: 0.0,
            p50_us: 0.0,
            p99_us: 0.0,
            install_secs: 0.0,
            by_backend: BTreeMap::new(),
            expected_backends: Vec::new(),
            targets: 0,
            errors: BTreeMap::new(),
            skipped: None,
            paired_direct_cps: None,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ChangeTime {
    pub mode: Mode,
    pub services: usize,
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub how: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DatapathReport {
    pub throughput: Vec<Throughput>,
    pub change: Vec<ChangeTime>,
    /// The socket LB's programs per call, against a do-nothing program on the same calls.
    pub hooks: Vec<HookCost>,
    pub notes: Vec<String>,
}

/// The four backends: `10.99.1.10..13` (and their IPv6 twins, see [`rules::endpoint6`]) in
/// the topology's one backend namespace, TCP on 8080 and UDP on 8053.
const BACKEND_PORT: u16 = 8080;
const UDP_BACKEND_PORT: u16 = 8053;
const BACKEND_HOSTS: [u8; 4] = [10, 11, 12, 13];
/// Services the load is spread over at most (a random subset when N is larger).
const MAX_TARGETS: usize = 1000;
/// Bound on connections per measured run, whatever the duration.
const MAX_CONNS: u64 = 5_000_000;
/// Bound on one iptables-restore or nft install (50k iptables services take a while).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(900);
/// The smallest earlier install an install-time prediction is scaled from.
const MIN_PREDICT_SERVICES: usize = 1000;
/// socket-lb and direct alternate this many times per N; the median run counts.
pub const PAIRED_ROUNDS: usize = 3;
/// Change samples of one (mode, N) stop after this much command time (at least 3 are taken).
const CHANGE_BUDGET: Duration = Duration::from_secs(90);
/// The extra socket-lb loads that only feed the per-hook costs (IPv6 VIPs, non-VIP addresses)
/// run this long at most.
const HOOK_LOAD: Duration = Duration::from_secs(2);

/// `mcs-loadgen`: `MCS_LOADGEN_BIN`, else next to the running executable.
pub fn loadgen_bin() -> PathBuf {
    std::env::var_os("MCS_LOADGEN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_bin("mcs-loadgen"))
}

/// Runs the whole datapath bench. Needs root; cleans up its namespaces, cgroup and pins on
/// return, error or panic.
pub fn run(opts: &DatapathOptions) -> anyhow::Result<DatapathReport> {
    if opts.modes.is_empty() || opts.services.is_empty() {
        bail!("nothing to measure: no modes or no service counts");
    }
    if opts.threads == 0 || opts.duration.is_zero() {
        bail!("threads and duration must be positive");
    }
    let mut needed = vec![loadgen_bin()];
    if opts.modes.contains(&Mode::SocketLb) {
        needed.push(agent_bin());
    }
    for bin in needed {
        if !bin.exists() {
            bail!(
                "{} not found (build it first, or set MCS_LOADGEN_BIN / MCS_AGENT_BIN)",
                bin.display()
            );
        }
    }
    fs::create_dir_all(&opts.work_dir)
        .with_context(|| format!("creating {}", opts.work_dir.display()))?;
    let mut bench = Bench::new(opts)?;
    let mut report = DatapathReport {
        notes: bench.environment_notes(),
        ..DatapathReport::default()
    };
    for &n in &opts.services {
        for &proto in &opts.protos {
            let svcs = rules::services(n, bench.backends(proto), proto);
            for &mode in &opts.modes {
                let tp = bench
                    .measure(mode, &svcs, &mut report)
                    .with_context(|| format!("{mode} with {n} {proto} services"))?;
                report.throughput.push(tp);
            }
        }
    }
    Ok(report)
}

/// Kills and reaps a child on drop.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Bench<'a> {
    opts: &'a DatapathOptions,
    // Field order is drop order: the server and the do-nothing programs go before the
    // topology's namespaces and cgroup.
    _server: ChildGuard,
    floor: Floor,
    /// The socket-lb client's cgroup, a child of the agent's: the do-nothing and reference
    /// programs attached here run before the agent's on the same calls.
    load_cgroup: PathBuf,
    topo: Topology,
    backends: Vec<SocketAddrV4>,
    udp_backends: Vec<SocketAddrV4>,
    /// The last measured install per netfilter mode and protocol: (N, seconds).
    last_install: BTreeMap<String, (usize, f64)>,
}

impl<'a> Bench<'a> {
    fn new(opts: &'a DatapathOptions) -> anyhow::Result<Self> {
        let topo = Topology::new(&["bench"])?;
        let at = |port| -> Vec<SocketAddrV4> {
            BACKEND_HOSTS
                .iter()
                .map(|h| SocketAddrV4::new(Ipv4Addr::new(10, 99, 1, *h), port))
                .collect()
        };
        let backends = at(BACKEND_PORT);
        let udp_backends = at(UDP_BACKEND_PORT);
        for b in &backends {
            topo.add_address("bench", (*b.ip()).into())?;
            topo.add_address("bench", (*rules::endpoint6(*b).ip()).into())?;
        }
        let netns = topo.cluster("bench").netns.clone();
        let mut listens = Vec::new();
        for (proto, list) in [("tcp", &backends), ("udp", &udp_backends)] {
            for b in list {
                listens.push(format!("{proto}:{b}"));
                listens.push(format!("{proto}:{}", rules::endpoint6(*b)));
            }
        }
        let mut cmd = Command::new(loadgen_bin());
        die_with_parent(&mut cmd)
            .args(["serve", "--netns", &netns, "--threads", "8"])
            .args(&listens)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut server = ChildGuard(cmd.spawn().context("starting mcs-loadgen serve")?);
        let mut line = String::new();
        if let Some(out) = server.0.stdout.take() {
            let _ = std::io::BufReader::new(out).read_line(&mut line);
        }
        if line.trim() != "ready" {
            bail!("mcs-loadgen serve did not start");
        }
        // Client side: every ephemeral port, and reuse of TIME_WAIT ports should any appear
        // (the client resets its connections, so normally none do). Namespaced sysctls only.
        ns_exec(
            &topo.client,
            "sh",
            &[
                "-c",
                "echo '1024 65535' > /proc/sys/net/ipv4/ip_local_port_range && echo 1 > /proc/sys/net/ipv4/tcp_tw_reuse",
            ],
        )?;
        let load_cgroup = topo.child_cgroup("load")?;
        let floor = Floor::attach(&load_cgroup)?;
        Ok(Bench {
            opts,
            _server: server,
            floor,
            load_cgroup,
            topo,
            backends,
            udp_backends,
            last_install: BTreeMap::new(),
        })
    }

    fn backends(&self, proto: Proto) -> &[SocketAddrV4] {
        match proto {
            Proto::Tcp => &self.backends,
            Proto::Udp => &self.udp_backends,
        }
    }

    fn environment_notes(&self) -> Vec<String> {
        let first_line = |p: &str, a: &[&str]| {
            sh(p, a)
                .map(|o| o.lines().next().unwrap_or_default().trim().to_owned())
                .unwrap_or_else(|e| format!("unavailable ({e})"))
        };
        let read = |p: &str| {
            fs::read_to_string(p)
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".into())
        };
        let mut notes = vec![
            format!(
                "iptables backend: {} (kube-proxy shape: nat OUTPUT -> KUBE-SERVICES, one jump per service, KUBE-SVC statistic rules, KUBE-SEP DNAT, KUBE-MARK-MASQ checks; filter KUBE-SERVICES empty)",
                first_line("iptables", &["-V"])
            ),
            format!("nft: {}", first_line("nft", &["-V"])),
            format!(
                "kernel {}, {} CPUs; load generator: {} threads, one exchange at a time each: TCP connect, 3-byte request, reply, RST close; UDP a numbered request datagram and its reply, from 8 unconnected sockets per thread used in turn",
                read("/proc/sys/kernel/osrelease"),
                std::thread::available_parallelism().map_or(0, |n| n.get()),
                self.opts.threads
            ),
            format!(
                "nf_conntrack_max {} (global); iptables and nftables modes track every connection (DNAT), socket-lb and direct do not; closed (RST) entries linger 10 s",
                read("/proc/sys/net/netfilter/nf_conntrack_max")
            ),
        ];
        if self.opts.modes.contains(&Mode::Nftables) {
            notes.push(
                "nftables install time grows about quadratically with N: every service chain's `numgen random mod k vmap { ... }` is an anonymous set, and the kernel names each new anonymous set by scanning every set of the table (nf_tables_set_alloc_name), which is kernel time (without the numgen rules the same install is near linear)".to_owned(),
            );
        }
        notes
    }

    /// Measures one mode with `svcs` (all of one protocol) installed; adds its notes, change
    /// times and hook costs to `report` and returns its throughput row.
    fn measure(
        &mut self,
        mode: Mode,
        svcs: &[Service],
        report: &mut DatapathReport,
    ) -> anyhow::Result<Throughput> {
        let n = svcs.len();
        let proto = svcs.first().map_or(Proto::Tcp, |s| s.proto);
        let (targets, expected) = self.targets(mode, proto, svcs);
        let mut paired = None;
        let mut median_rate = None;
        let (install_secs, result) = match mode {
            Mode::Direct => (0.0, self.load(proto, &targets, false, self.opts.duration)?),
            Mode::SocketLb => {
                let (install, synced_us, mut agent) = self.install_agent(svcs)?;
                report.notes.push(format!(
                    "socket-lb N={n} {proto}: agent up and all {n} services in the maps after {install:.3} s (its map sync itself: {:.3} s)",
                    synced_us as f64 / 1e6
                ));
                // The kernel counts each program's runs and run time only while some process
                // holds a stats fd; this one is dropped with the branch.
                let _stats = StatsGuard::enable()?;
                let pin = self.topo.pin_dir.clone();
                let vip_hooks: &[(&'static str, &str)] = match proto {
                    Proto::Tcp => &[("connect4", "TCP connects to VIPs")],
                    Proto::Udp => &[
                        ("sendmsg4", "UDP datagrams sent to VIPs (unconnected)"),
                        ("recvmsg4", "UDP replies received from VIPs"),
                    ],
                };
                let window = Window::open(&pin, &self.floor, n, vip_hooks)?;
                let direct_targets = self.direct_targets(proto);
                let mut rounds = Vec::with_capacity(PAIRED_ROUNDS);
                let mut direct_cps = Vec::with_capacity(PAIRED_ROUNDS);
                for _ in 0..PAIRED_ROUNDS {
                    rounds.push(self.load(proto, &targets, true, self.opts.duration)?);
                    direct_cps.push(
                        self.load(proto, &direct_targets, false, self.opts.duration)?
                            .conns_per_sec(),
                    );
                }
                report.hooks.extend(window.close());
                let hook_load = self.opts.duration.min(HOOK_LOAD);
                report
                    .hooks
                    .extend(self.measure_reference(proto, &targets, n, hook_load)?);
                if proto == Proto::Tcp {
                    let window = Window::open(
                        &pin,
                        &self.floor,
                        n,
                        &[("connect6", "TCP connects to IPv6 VIPs")],
                    )?;
                    let v6 = self.load(proto, &self.targets6(svcs), true, hook_load)?;
                    if v6.failures > 0 || v6.connections == 0 {
                        bail!("connects to the IPv6 VIPs failed: {:?}", v6.errors);
                    }
                    report.hooks.extend(window.close());
                    let window = Window::open(
                        &pin,
                        &self.floor,
                        n,
                        &[("connect4", "TCP connects to addresses that are not VIPs")],
                    )?;
                    self.load(proto, &direct_targets, true, hook_load)?;
                    report.hooks.extend(window.close());
                }
                if !agent.running() {
                    bail!("the agent exited during the run:\n{}", agent.log_text());
                }
                drop(agent);
                self.uninstall_agent();
                paired = Some(median(&mut direct_cps));
                let (all, rate) = LoadResult::median_of(rounds);
                median_rate = Some(rate);
                (install, all)
            }
            Mode::Iptables | Mode::Nftables => {
                if let Some(why) = self.over_budget(mode, proto, n) {
                    report
                        .notes
                        .push(format!("{mode} N={n} {proto}: not measured: {why}"));
                    let mut tp = Throughput::empty(mode, proto, n);
                    tp.skipped = Some(why);
                    return Ok(tp);
                }
                let direct_targets = self.direct_targets(proto);
                paired = Some(
                    self.load(proto, &direct_targets, false, self.opts.duration)?
                        .conns_per_sec(),
                );
                let mut guard = NetfilterGuard::new(&self.topo.client, mode)?;
                let text = if mode == Mode::Iptables {
                    rules::iptables_full(svcs)
                } else {
                    rules::nft_full(svcs)
                };
                let install = self.apply(mode, &text, false, INSTALL_TIMEOUT)?;
                report.notes.push(format!(
                    "{mode} N={n} {proto}: install of {} lines ({:.1} MB) took {:.3} s",
                    text.lines().count(),
                    text.len() as f64 / 1e6,
                    install.as_secs_f64()
                ));
                self.last_install
                    .insert(format!("{mode}/{proto}"), (n, install.as_secs_f64()));
                let r = self.load(proto, &targets, false, self.opts.duration)?;
                if let Some(count) = self.conntrack_count() {
                    report.notes.push(format!(
                        "{mode} N={n} {proto}: {count} conntrack entries in the client namespace after the run (expired ones included until the kernel's lazy garbage collection reaps them)"
                    ));
                }
                // A rule change costs the same whatever the protocol: timed with TCP only.
                if proto == Proto::Tcp {
                    let change = self.changes(mode, svcs, &mut report.notes)?;
                    report.change.push(change);
                }
                guard.cleanup()?;
                (install.as_secs_f64(), r)
            }
        };
        Ok(Throughput {
            mode,
            proto,
            services: n,
            connections: result.connections,
            failures: result.failures,
            conns_per_sec: median_rate.unwrap_or_else(|| result.conns_per_sec()),
            p50_us: result.p50_us,
            p99_us: result.p99_us,
            install_secs,
            by_backend: result.by_backend,
            expected_backends: expected,
            targets: targets.len(),
            errors: result.errors,
            skipped: None,
            paired_direct_cps: paired,
        })
    }

    /// Why installing `mode` at `n` services would blow the install budget, if it would.
    fn over_budget(&self, mode: Mode, proto: Proto, n: usize) -> Option<String> {
        over_budget(
            self.last_install.get(&format!("{mode}/{proto}")).copied(),
            n,
            self.opts.install_budget,
        )
    }

    /// The services the load goes to: a random subset of at most 1000 (seeded by N, so every
    /// mode and protocol hits the same services).
    fn chosen(svcs: &[Service]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..svcs.len()).collect();
        let mut rng = (svcs.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let k = svcs.len().min(MAX_TARGETS);
        for i in 0..k {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let j = i + (rng % (svcs.len() - i) as u64) as usize;
            idx.swap(i, j);
        }
        idx.truncate(k);
        idx
    }

    /// The backends' own addresses for `proto`.
    fn direct_targets(&self, proto: Proto) -> Vec<SocketAddr> {
        self.backends(proto)
            .iter()
            .map(|b| SocketAddr::V4(*b))
            .collect()
    }

    /// The addresses the load goes to and the backends that may answer: the VIPs of the
    /// [`Self::chosen`] services, or the backends.
    fn targets(
        &self,
        mode: Mode,
        proto: Proto,
        svcs: &[Service],
    ) -> (Vec<SocketAddr>, Vec<String>) {
        if !mode.via_vip() {
            let t = self.direct_targets(proto);
            let e = t.iter().map(|b| b.to_string()).collect();
            return (t, e);
        }
        let chosen = Self::chosen(svcs);
        let targets = chosen
            .iter()
            .map(|&i| SocketAddr::new(IpAddr::V4(svcs[i].vip), svcs[i].port))
            .collect();
        let expected: BTreeSet<String> = chosen
            .iter()
            .flat_map(|&i| svcs[i].endpoints.iter().map(|e| e.to_string()))
            .collect();
        (targets, expected.into_iter().collect())
    }

    /// The IPv6 VIPs of the [`Self::chosen`] services (the agent's services are dual-stack).
    fn targets6(&self, svcs: &[Service]) -> Vec<SocketAddr> {
        Self::chosen(svcs)
            .iter()
            .map(|&i| SocketAddr::new(IpAddr::V6(svcs[i].vip6()), svcs[i].port))
            .collect()
    }

    /// A stretch of VIP load with the reference program of the VIP hook (the frontend lookup
    /// alone) attached before the agent's: what finding the frontend costs per call at this N,
    /// and what the agent's program costs once that lookup has just brought the frontend's
    /// lines into the cache.
    fn measure_reference(
        &self,
        proto: Proto,
        targets: &[SocketAddr],
        n: usize,
        duration: Duration,
    ) -> anyhow::Result<Vec<HookCost>> {
        let hook = match proto {
            Proto::Tcp => (
                "connect4",
                "the frontend lookup alone, on TCP connects to VIPs",
                "TCP VIP connects whose frontend lookup_connect4 has just read",
            ),
            Proto::Udp => (
                "sendmsg4",
                "the frontend lookup alone, on UDP datagrams sent to VIPs",
                "UDP VIP datagrams whose frontend lookup_sendmsg4 has just read",
            ),
        };
        let reference = Reference::attach(&self.load_cgroup, &self.topo.pin_dir)?;
        let window =
            Window::open_with_reference(&self.topo.pin_dir, &self.floor, &reference, n, hook)?;
        let run = self.load(proto, targets, true, duration)?;
        if run.failures > 0 || run.connections == 0 {
            bail!(
                "the VIP load with the reference program attached failed: {:?}",
                run.errors
            );
        }
        Ok(window.close())
    }

    /// Runs the load generator in the client namespace (and, for socket-lb, the cgroup).
    fn load(
        &self,
        proto: Proto,
        targets: &[SocketAddr],
        in_cgroup: bool,
        duration: Duration,
    ) -> anyhow::Result<LoadResult> {
        let file = self.opts.work_dir.join("targets.txt");
        let text: String = targets.iter().map(|t| format!("{t}\n")).collect();
        fs::write(&file, text)?;
        let warmup = (duration / 5).clamp(Duration::from_millis(200), Duration::from_secs(1));
        let mut cmd = Command::new(loadgen_bin());
        die_with_parent(&mut cmd)
            .args(["load", "--netns", &self.topo.client])
            .args(["--proto", &proto.to_string()])
            .args(["--threads", &self.opts.threads.to_string()])
            .args(["--warmup-ms", &warmup.as_millis().to_string()])
            .args(["--duration-ms", &duration.as_millis().to_string()])
            .args(["--max-conns", &MAX_CONNS.to_string()])
            .arg("--targets")
            .arg(&file);
        if in_cgroup {
            cmd.arg("--cgroup").arg(&self.load_cgroup);
        }
        let timeout = warmup + duration + Duration::from_secs(30);
        let (_, out) = run_bounded(&mut cmd, None, timeout)?;
        let line = out.lines().last().unwrap_or_default();
        serde_json::from_str(line).with_context(|| format!("load generator printed {out:?}"))
    }

    /// Starts the agent on N services and waits for the sync that installed all of them.
    /// Returns (seconds from start to synced, the sync's own elapsed µs, the agent).
    fn install_agent(&self, svcs: &[Service]) -> anyhow::Result<(f64, u64, Agent)> {
        let n = svcs.len();
        self.uninstall_agent();
        let input = self.opts.work_dir.join("socket-lb-input");
        let _ = fs::remove_dir_all(&input);
        fs::create_dir_all(&input)?;
        fs::write(input.join("services.yaml"), rules::node_yaml(svcs))?;
        // Dual-stack services: per family a frontend and its refusing wildcard (counters and
        // names are shared by both families), and up to 4 slots per frontend, with room for a
        // change's second bank.
        let frontends = (4 * n + 1024).max(65_536).next_power_of_two();
        let slots = (12 * n + 1024).max(262_144);
        let input_s = input.display().to_string();
        let args = [
            "node",
            "--from-dir",
            &input_s,
            "--log-format",
            "json",
            "--max-frontends",
            &frontends.to_string(),
            "--max-slots",
            &slots.to_string(),
            "--clusterset-cidrs",
            rules::CLUSTERSET_CIDRS,
        ];
        let started = Instant::now();
        // info only: the debug level logs one line per written service.
        let mut agent = Agent::start_with_env(&self.topo, &args, &[("RUST_LOG", "info")])?;
        let deadline = started + Duration::from_secs(60) + Duration::from_millis(4 * n as u64);
        loop {
            if let Some(us) = synced(&agent.log_text(), n)? {
                let _ = fs::remove_dir_all(&input);
                return Ok((started.elapsed().as_secs_f64(), us, agent));
            }
            if Instant::now() > deadline || !agent.running() {
                bail!(
                    "the agent did not install {n} services (running: {}); log:\n{}",
                    agent.running(),
                    tail(&agent.log_text(), 4000)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn uninstall_agent(&self) {
        let pin = self.topo.pin_dir.display().to_string();
        if self.topo.pin_dir.exists() {
            let _ = sh(
                &agent_bin().display().to_string(),
                &["uninstall", "--pin-dir", &pin],
            );
        }
    }

    /// Applies netfilter input in the client namespace; returns the command's wall time.
    fn apply(
        &self,
        mode: Mode,
        text: &str,
        noflush: bool,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let (mut cmd, _ns) = match mode {
            Mode::Iptables => {
                let (mut c, f) = in_netns(&self.topo.client, "iptables-restore")?;
                c.args(["-w", "5"]);
                if noflush {
                    c.arg("--noflush");
                }
                (c, f)
            }
            _ => {
                let (mut c, f) = in_netns(&self.topo.client, "nft")?;
                c.args(["-f", "-"]);
                (c, f)
            }
        };
        let (took, _) = run_bounded(&mut cmd, Some(text.as_bytes()), timeout)
            .with_context(|| format!("{mode} rules"))?;
        Ok(took)
    }

    /// Times `change_samples` one-endpoint changes, kube-proxy style (see `how`).
    fn changes(
        &self,
        mode: Mode,
        svcs: &[Service],
        notes: &mut Vec<String>,
    ) -> anyhow::Result<ChangeTime> {
        let n = svcs.len();
        let mut state = svcs.to_vec();
        // Services with a spare backend can swap one endpoint for it.
        let candidates: Vec<usize> = (0..n)
            .filter(|&i| state[i].endpoints.len() < self.backends.len())
            .collect();
        let mut times = Vec::new();
        let mut spent = Duration::ZERO;
        let mut rng = 0x2545_f491_4f6c_dd1du64 ^ n as u64;
        for _ in 0..self.opts.change_samples {
            if candidates.is_empty() || (times.len() >= 3 && spent > CHANGE_BUDGET) {
                break;
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let i = candidates[(rng % candidates.len() as u64) as usize];
            let old = state[i].endpoints.clone();
            let spare = *self
                .backends
                .iter()
                .find(|b| !old.contains(b))
                .context("no spare backend")?;
            state[i].endpoints[0] = spare;
            let text = match mode {
                Mode::Iptables => rules::iptables_change(&state, &state[i], &old),
                _ => rules::nft_change(&state[i], &old),
            };
            let took = self.apply(mode, &text, true, INSTALL_TIMEOUT)?;
            spent += took;
            times.push(took.as_secs_f64() * 1000.0);
        }
        if times.len() < self.opts.change_samples {
            notes.push(format!(
                "{mode} N={n}: {} of {} change samples taken (stopped after {:.0} s of commands)",
                times.len(),
                self.opts.change_samples,
                spent.as_secs_f64()
            ));
        }
        let how = match mode {
            Mode::Iptables => format!(
                "one endpoint of one service replaced: `iptables-restore -w 5 --noflush` (process start included) with kube-proxy's minimized partial sync: filter KUBE-SERVICES, nat KUBE-SERVICES rewritten in full ({n} jumps), KUBE-NODEPORTS/KUBE-POSTROUTING/KUBE-MARK-MASQ, the changed KUBE-SVC chain, the new KUBE-SEP chain, -X of the old one"
            ),
            _ => "one endpoint of one service replaced: one `nft -f -` transaction (process start included): add+flush the new endpoint chain, flush and rewrite the service chain (numgen vmap), flush+delete the old endpoint chain; the service-ips map is untouched".to_owned(),
        };
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        Ok(ChangeTime {
            mode,
            services: n,
            samples: times.len(),
            p50_ms: quantile_f64(&sorted, 0.5),
            p99_ms: quantile_f64(&sorted, 0.99),
            how,
        })
    }

    fn conntrack_count(&self) -> Option<u64> {
        ns_exec(
            &self.topo.client,
            "cat",
            &["/proc/sys/net/netfilter/nf_conntrack_count"],
        )
        .ok()
        .and_then(|s| s.trim().parse().ok())
    }
}

/// The previous install of a mode, `(N, seconds)`, scaled quadratically to `n` (optimistic for
/// nftables, whose kernel-side cost per anonymous verdict map grows with the number of maps
/// already in the table); the reason to skip when that exceeds `budget`.
fn over_budget(prev: Option<(usize, f64)>, n: usize, budget: Duration) -> Option<String> {
    let (prev_n, prev_secs) = prev?;
    // Small installs are mostly process start and fixed cost: scaling them up would predict
    // nonsense, so only a sizeable earlier install is a basis.
    if prev_n < MIN_PREDICT_SERVICES || prev_secs < 1.0 || n <= prev_n {
        return None;
    }
    let predicted = prev_secs * (n as f64 / prev_n as f64).powi(2);
    (predicted > budget.as_secs_f64()).then(|| {
        format!(
            "install predicted to take {predicted:.0} s (the {prev_n}-service install took {prev_secs:.1} s, scaled quadratically), over the {:.0} s install budget",
            budget.as_secs_f64()
        )
    })
}

fn quantile_f64(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The `elapsed_us` of the agent's first "maps synced" log line that installed all `n`
/// services (JSON log lines), if it has appeared. A sync that failed some services is an error.
fn synced(log: &str, n: usize) -> anyhow::Result<Option<u64>> {
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let field = |k: &str| v.get(k).or_else(|| v.get("fields").and_then(|f| f.get(k)));
        // "maps synced (full)" for the first sync, "maps synced" for later ones.
        if !field("message")
            .and_then(|m| m.as_str())
            .is_some_and(|m| m.starts_with("maps synced"))
        {
            continue;
        }
        if field("services").and_then(|s| s.as_u64()) != Some(n as u64) {
            continue;
        }
        if let Some(failed) = field("failed").and_then(|f| f.as_u64())
            && failed > 0
        {
            bail!(
                "the agent failed to install {failed} of {n} services:\n{}",
                tail(log, 4000)
            );
        }
        return Ok(Some(
            field("elapsed_us").and_then(|e| e.as_u64()).unwrap_or(0),
        ));
    }
    Ok(None)
}

fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// A command that runs in network namespace `ns` (it enters it between fork and exec, so
/// nothing else of `ip netns exec` is paid). Keep the returned file until the spawn.
fn in_netns(ns: &str, program: &str) -> anyhow::Result<(Command, fs::File)> {
    let path = format!("/run/netns/{ns}");
    let file = fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    let fd = file.as_raw_fd();
    let mut cmd = Command::new(program);
    die_with_parent(&mut cmd);
    // SAFETY: setns is async-signal-safe; fd stays open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok((cmd, file))
}

/// Runs a short command in namespace `ns` and returns its stdout.
fn ns_exec(ns: &str, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let (mut cmd, _f) = in_netns(ns, program)?;
    cmd.args(args);
    let (_, out) = run_bounded(&mut cmd, None, Duration::from_secs(30))?;
    Ok(out)
}

/// Runs `cmd` with `stdin`, killing it after `timeout`; returns its wall time (spawn to exit)
/// and stdout, or an error with its stderr when it fails.
fn run_bounded(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> anyhow::Result<(Duration, String)> {
    let what = format!("{:?}", cmd.get_program());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = ChildGuard(cmd.spawn().with_context(|| format!("starting {what}"))?);
    let mut out = child.0.stdout.take();
    let mut err = child.0.stderr.take();
    // Readers and the writer run beside the wait, so no pipe can fill up and stall it.
    let (took, status, stdout, stderr) = std::thread::scope(|s| {
        if let (Some(input), Some(mut pipe)) = (stdin, child.0.stdin.take()) {
            s.spawn(move || {
                let _ = pipe.write_all(input);
            });
        }
        let o = s.spawn(move || {
            let mut v = String::new();
            if let Some(p) = out.as_mut() {
                let _ = p.read_to_string(&mut v);
            }
            v
        });
        let e = s.spawn(move || {
            let mut v = String::new();
            if let Some(p) = err.as_mut() {
                let _ = p.read_to_string(&mut v);
            }
            v
        });
        let status = loop {
            match child.0.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if started.elapsed() > timeout => {
                    let _ = child.0.kill();
                    let _ = child.0.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(_) => break None,
            }
        };
        let took = started.elapsed();
        (
            took,
            status,
            o.join().unwrap_or_default(),
            e.join().unwrap_or_default(),
        )
    });
    match status {
        None => bail!(
            "{what} did not finish within {timeout:?}; stderr: {}",
            tail(&stderr, 2000)
        ),
        Some(st) if !st.success() => bail!("{what} failed ({st}): {}", tail(&stderr, 2000)),
        Some(_) => Ok((took, stdout)),
    }
}

/// The 241.0.0.0/8 route the netfilter modes need (a locally generated packet is routed
/// before OUTPUT's DNAT, so the VIP must be routable; the veth leads only to the backend
/// namespace, which forwards nothing) and the removal of every rule afterwards, on drop too.
struct NetfilterGuard {
    client: String,
    mode: Mode,
    active: bool,
}

impl NetfilterGuard {
    fn new(client: &str, mode: Mode) -> anyhow::Result<Self> {
        sh(
            "ip",
            &[
                "-n",
                client,
                "route",
                "replace",
                "241.0.0.0/8",
                "dev",
                "to1",
            ],
        )?;
        Ok(NetfilterGuard {
            client: client.to_owned(),
            mode,
            active: true,
        })
    }

    /// Flushes the iptables tables (after the iptables mode only: with the legacy backend,
    /// touching a table instantiates it and its hooks for good), then every nftables table of
    /// the client namespace (with the nft backend this also drops iptables' nat base chains,
    /// so the modes measured next pay no NAT or conntrack hooks), then the route.
    fn cleanup(&mut self) -> anyhow::Result<()> {
        self.active = false;
        let r1 = if self.mode == Mode::Iptables {
            let (mut c, _f) = in_netns(&self.client, "iptables-restore")?;
            c.args(["-w", "5"]);
            run_bounded(
                &mut c,
                Some(rules::iptables_flush().as_bytes()),
                INSTALL_TIMEOUT,
            )
            .map(|_| ())
        } else {
            Ok(())
        };
        let r2 = ns_exec(&self.client, "nft", &["flush", "ruleset"]);
        let r3 = sh("ip", &["-n", &self.client, "route", "del", "241.0.0.0/8"]);
        r1?;
        r2?;
        r3?;
        Ok(())
    }
}

impl Drop for NetfilterGuard {
    fn drop(&mut self) {
        if self.active {
            let _ = self.cleanup();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_prediction_needs_a_sizeable_basis() {
        let budget = Duration::from_secs(300);
        assert_eq!(over_budget(None, 50_000, budget), None);
        // A 1-service install is process start: no basis for 1000.
        assert_eq!(over_budget(Some((1, 0.013)), 1000, budget), None);
        assert_eq!(over_budget(Some((1000, 0.5)), 10_000, budget), None);
        // 10k in 6 s -> 150 s at 50k: under budget; 10k in 40 s -> 1000 s: over.
        assert_eq!(over_budget(Some((10_000, 6.0)), 50_000, budget), None);
        let why = over_budget(Some((10_000, 40.0)), 50_000, budget).unwrap();
        assert!(why.contains("predicted to take 1000 s"), "{why}");
    }

    #[test]
    fn modes_print_and_parse() {
        for m in Mode::ALL {
            assert_eq!(m.to_string().parse::<Mode>().unwrap(), m);
            assert_eq!(
                serde_json::to_value(m).unwrap(),
                serde_json::Value::String(m.to_string())
            );
        }
        assert!("ipvs".parse::<Mode>().is_err());
    }

    #[test]
    fn agent_sync_line_is_found_by_service_count() {
        let log = concat!(
            "{\"message\":\"dataplane ready\",\"frontends\":0}\n",
            "{\"message\":\"maps synced\",\"services\":10,\"failed\":0,\"elapsed_us\":5}\n",
            "{\"message\":\"maps synced\",\"services\":20,\"failed\":0,\"elapsed_us\":7}\n",
            "{\"message\":\"maps synced (full)\",\"services\":40,\"failed\":0,\"elapsed_us\":9}\n",
        );
        assert_eq!(synced(log, 40).unwrap(), Some(9));
        assert_eq!(synced(log, 20).unwrap(), Some(7));
        assert_eq!(synced(log, 30).unwrap(), None);
        let failed = "{\"message\":\"maps synced\",\"services\":5,\"failed\":2}\n";
        assert!(synced(failed, 5).is_err());
    }
}
