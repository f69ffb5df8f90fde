//! The load generator and the backend server behind `mcs-loadgen` (the binary only parses
//! arguments): short TCP connections with one tiny request and reply each, or UDP
//! request/response datagrams sent from unconnected sockets.

use std::{
    collections::BTreeMap,
    fmt,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd as _,
    path::Path,
    str::FromStr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

/// The transport a load runs over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// One short connection per exchange: connect, request, reply, reset.
    #[default]
    Tcp,
    /// One datagram and its reply per exchange, from unconnected sockets (sendto/recvfrom).
    Udp,
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        })
    }
}

impl FromStr for Proto {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Proto> {
        match s {
            "tcp" => Ok(Proto::Tcp),
            "udp" => Ok(Proto::Udp),
            other => bail!("unknown protocol {other:?} (tcp, udp)"),
        }
    }
}

/// What one `mcs-loadgen load` run measured (printed as one JSON line on stdout).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadResult {
    /// Completed exchanges: TCP connections (connect, request, reply), or UDP request/reply
    /// datagram pairs.
    pub connections: u64,
    pub failures: u64,
    /// Measured time (after the warm-up).
    pub elapsed_secs: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Replies per answering backend (`ip:port` the backend reported).
    pub by_backend: BTreeMap<String, u64>,
    /// Failures per error text.
    pub errors: BTreeMap<String, u64>,
}

impl LoadResult {
    pub fn conns_per_sec(&self) -> f64 {
        if self.elapsed_secs > 0.0 {
            self.connections as f64 / self.elapsed_secs
        } else {
            0.0
        }
    }

    /// Several runs of the same load as one, and the median of their rates: the run with the
    /// median rate gives the percentiles; connections, time, failures, replies per backend and
    /// errors are those of every run added up.
    pub fn median_of(mut runs: Vec<LoadResult>) -> (LoadResult, f64) {
        runs.sort_by(|a, b| a.conns_per_sec().total_cmp(&b.conns_per_sec()));
        let mid = runs.len() / 2;
        let median_rate = runs.get(mid).map_or(0.0, LoadResult::conns_per_sec);
        let mut all = LoadResult::default();
        for (i, run) in runs.into_iter().enumerate() {
            if i == mid {
                all.p50_us = run.p50_us;
                all.p99_us = run.p99_us;
            }
            all.connections += run.connections;
            all.elapsed_secs += run.elapsed_secs;
            all.failures += run.failures;
            for (k, v) in run.by_backend {
                *all.by_backend.entry(k).or_default() += v;
            }
            for (k, v) in run.errors {
                *all.errors.entry(k).or_default() += v;
            }
        }
        (all, median_rate)
    }
}

/// How long a connect or a read may take before the attempt counts as failed.
const IO_TIMEOUT: Duration = Duration::from_secs(1);
/// The request every client sends; the server answers after reading it.
const REQUEST: &[u8] = b"hi\n";

/// Moves this (still single-threaded) process into a cgroup, then into `/run/netns/<netns>`
/// (the cgroup first: `ip netns exec` would remount /sys and hide it).
pub fn enter(netns: Option<&str>, cgroup: Option<&Path>) -> anyhow::Result<()> {
    if let Some(cg) = cgroup {
        let procs = cg.join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string())
            .with_context(|| format!("joining cgroup {}", procs.display()))?;
    }
    if let Some(ns) = netns {
        let path = format!("/run/netns/{ns}");
        let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        // SAFETY: a valid namespace fd; threads are spawned only afterwards.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns {path}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Closes with RST instead of FIN (SO_LINGER 0): no TIME_WAIT, so millions of short
/// connections neither exhaust ports nor pile up state on either side.
fn linger_zero(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a correctly sized option value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Serves every address. TCP: reads one request, replies `<ip:port>\n` (the address it
/// listens on, so the client can count who answered), then waits for the client to close (the
/// client resets, so this side keeps no TIME_WAIT either). UDP: answers every datagram with
/// `<ip:port>\n` followed by the request, so the client can match a reply to its request.
/// `threads` acceptors (or receivers) per address.
pub fn serve(addrs: &[(Proto, SocketAddr)], threads: usize) -> anyhow::Result<()> {
    let mut handles = Vec::new();
    for &(proto, addr) in addrs {
        if proto == Proto::Udp {
            let socket = UdpSocket::bind(addr).with_context(|| format!("bind udp {addr}"))?;
            for _ in 0..threads.max(1) {
                let s = socket.try_clone()?;
                let id = format!("{addr}\n");
                handles.push(std::thread::spawn(move || {
                    let mut buf = [0u8; 512];
                    let mut reply = Vec::with_capacity(600);
                    while let Ok((n, from)) = s.recv_from(&mut buf) {
                        reply.clear();
                        reply.extend_from_slice(id.as_bytes());
                        reply.extend_from_slice(&buf[..n]);
                        let _ = s.send_to(&reply, from);
                    }
                }));
            }
            continue;
        }
        let listener = TcpListener::bind(addr).with_context(|| format!("bind {addr}"))?;
        let reply = format!("{addr}\n");
        for _ in 0..threads.max(1) {
            let l = listener.try_clone()?;
            let reply = reply.clone();
            handles.push(std::thread::spawn(move || {
                for conn in l.incoming() {
                    let Ok(mut c) = conn else { continue };
                    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                    let _ = c.set_nodelay(true);
                    let mut buf = [0u8; 64];
                    if read_line(&mut c, &mut buf).is_ok() {
                        let _ = c.write_all(reply.as_bytes());
                        // Until the client's RST (or FIN): bounded by the read timeout.
                        while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
                    }
                }
            }));
        }
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// Reads until a newline or EOF; returns the bytes read.
fn read_line(c: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let got = c.read(&mut buf[n..])?;
        if got == 0 {
            break;
        }
        n += got;
        if buf[..n].contains(&b'\n') {
            break;
        }
    }
    Ok(n)
}

/// What a load run does.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub proto: Proto,
    pub targets: Vec<SocketAddr>,
    pub threads: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Upper bound on measured connections over all threads.
    pub max_conns: u64,
}

#[derive(Default)]
struct ThreadResult {
    latencies_us: Vec<u32>,
    failures: u64,
    by_backend: Vec<(Vec<u8>, u64)>,
    errors: BTreeMap<String, u64>,
}

/// A small xorshift PRNG per thread: target choice must be cheap and need no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One connection: connect, send the request, read the reply line, reset.
fn one(addr: &SocketAddr, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut s = TcpStream::connect_timeout(addr, IO_TIMEOUT)?;
    linger_zero(&s);
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.write_all(REQUEST)?;
    let n = read_line(&mut s, buf)?;
    if n == 0 || !buf[..n].ends_with(b"\n") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "short reply",
        ));
    }
    Ok(n - 1)
}

/// Unconnected UDP sockets of one load thread, used in turn, so that per-socket backend
/// choices (the socket LB's, or conntrack's per flow) spread like those of several clients.
const UDP_SOCKETS_PER_THREAD: usize = 8;

/// One thread's unconnected UDP sockets, per family, opened on first use.
#[derive(Default)]
struct UdpClient {
    v4: Vec<UdpSocket>,
    v6: Vec<UdpSocket>,
    next: usize,
    seq: u64,
}

impl UdpClient {
    fn socket(&mut self, addr: &SocketAddr) -> std::io::Result<&UdpSocket> {
        let (pool, any) = if addr.is_ipv4() {
            (&mut self.v4, "0.0.0.0:0")
        } else {
            (&mut self.v6, "[::]:0")
        };
        if pool.is_empty() {
            for _ in 0..UDP_SOCKETS_PER_THREAD {
                let s = UdpSocket::bind(any)?;
                s.set_read_timeout(Some(IO_TIMEOUT))?;
                pool.push(s);
            }
        }
        self.next = (self.next + 1) % UDP_SOCKETS_PER_THREAD;
        Ok(&pool[self.next])
    }

    /// One exchange: a numbered request, then datagrams until the reply that echoes it (a late
    /// reply to an earlier, timed-out request is skipped). The reply must come from `addr`
    /// itself: the socket LB shows the VIP, never the backend, to the application.
    fn exchange(&mut self, addr: &SocketAddr, buf: &mut [u8]) -> std::io::Result<usize> {
        self.seq += 1;
        let request = format!("{}\n", self.seq);
        let s = self.socket(addr)?;
        s.send_to(request.as_bytes(), addr)?;
        loop {
            let (n, from) = s.recv_from(buf)?;
            let Some(split) = buf[..n].iter().position(|b| *b == b'\n') else {
                continue;
            };
            if &buf[split + 1..n] != request.as_bytes() {
                continue;
            }
            if from != *addr {
                return Err(std::io::Error::other(
                    "the reply came from another address than the one the request went to",
                ));
            }
            return Ok(split);
        }
    }
}

fn worker(spec: &LoadSpec, seed: u64, started: Instant, per_thread_max: u64) -> ThreadResult {
    let mut rng = Rng(seed | 1);
    let mut r = ThreadResult::default();
    let mut udp = UdpClient::default();
    let mut buf = [0u8; 128];
    let measure_from = started + spec.warmup;
    let end = measure_from + spec.duration;
    let mut measured = 0u64;
    loop {
        let t0 = Instant::now();
        if t0 >= end || measured >= per_thread_max {
            break;
        }
        let addr = &spec.targets[(rng.next() % spec.targets.len() as u64) as usize];
        let result = match spec.proto {
            Proto::Tcp => one(addr, &mut buf),
            Proto::Udp => udp.exchange(addr, &mut buf),
        };
        if t0 < measure_from {
            continue;
        }
        measured += 1;
        match result {
            Ok(n) => {
                let us = t0.elapsed().as_micros().min(u32::MAX as u128) as u32;
                r.latencies_us.push(us);
                let id = &buf[..n];
                match r.by_backend.iter_mut().find(|(k, _)| k == id) {
                    Some((_, c)) => *c += 1,
                    None => r.by_backend.push((id.to_vec(), 1)),
                }
            }
            Err(e) => {
                r.failures += 1;
                *r.errors.entry(e.to_string()).or_default() += 1;
                // A refused or unreachable target fails fast; do not spin on it.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    r
}

/// The `q`-quantile (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

/// Runs `spec.threads` client threads (warm-up, then the measured period) and merges them.
pub fn run_load(spec: &LoadSpec) -> anyhow::Result<LoadResult> {
    if spec.targets.is_empty() {
        bail!("no targets");
    }
    let threads = spec.threads.max(1);
    let per_thread_max = (spec.max_conns / threads as u64).max(1);
    let started = Instant::now();
    let results: Vec<ThreadResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let seed = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(t as u64 + 1);
                scope.spawn(move || worker(spec, seed, started, per_thread_max))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let elapsed = (started.elapsed().saturating_sub(spec.warmup)).as_secs_f64();
    let mut out = LoadResult {
        elapsed_secs: elapsed,
        ..LoadResult::default()
    };
    let mut all = Vec::new();
    for r in results {
        out.failures += r.failures;
        all.extend_from_slice(&r.latencies_us);
        for (id, c) in r.by_backend {
            *out.by_backend
                .entry(String::from_utf8_lossy(&id).into_owned())
                .or_default() += c;
        }
        for (e, c) in r.errors {
            *out.errors.entry(e).or_default() += c;
        }
    }
    all.sort_unstable();
    out.connections = all.len() as u64;
    out.p50_us = quantile(&all, 0.50);
    out.p99_us = quantile(&all, 0.99);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[7], 0.99), 7.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    /// A short load of `proto` against a local server at `addr` (already answering): every
    /// reply is counted by the address that answered, and nothing fails.
    fn load_counts_every_reply(proto: Proto, addr: SocketAddr) {
        let r = run_load(&LoadSpec {
            proto,
            targets: vec![addr],
            threads: 2,
            warmup: Duration::from_millis(20),
            duration: Duration::from_millis(200),
            max_conns: 100_000,
        })
        .unwrap();
        assert!(r.connections > 0);
        assert_eq!(r.failures, 0, "{:?}", r.errors);
        assert_eq!(r.by_backend.get(&addr.to_string()), Some(&r.connections));
        assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us);
    }

    #[test]
    fn load_against_local_server_counts_backends() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        std::thread::spawn(move || serve(&[(Proto::Tcp, addr)], 2));
        // Wait for the bind.
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(addr).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        load_counts_every_reply(Proto::Tcp, addr);
    }

    /// UDP: every request gets its own reply, from the address it went to.
    #[test]
    fn udp_load_against_local_server_matches_replies() {
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        std::thread::spawn(move || serve(&[(Proto::Udp, addr)], 2));
        let mut client = UdpClient::default();
        let mut buf = [0u8; 128];
        let deadline = Instant::now() + Duration::from_secs(5);
        while client.exchange(&addr, &mut buf).is_err() && Instant::now() < deadline {}
        load_counts_every_reply(Proto::Udp, addr);
        assert_eq!("udp".parse::<Proto>().unwrap(), Proto::Udp);
        assert_eq!(Proto::Udp.to_string(), "udp");
    }
}
