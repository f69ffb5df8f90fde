//! A test client: connects to an address and reports, per attempt, what answered.
//!
//! `mcs-probe [--netns NAME] [--cgroup DIR] [--count N] [--duration-ms D] [--interval-ms I]
//! [--one-socket] [--hold] MODE ADDR`
//! MODE is `tcp`, `udp` (unconnected: sendto/recvfrom) or `udp-connected`. ADDR may be an
//! IPv4-mapped IPv6 address (`[::ffff:241.0.0.10]:80`): the probe then uses an AF_INET6 socket,
//! as dual-stack clients do. With `--one-socket` (`udp` only) every attempt sends from the
//! same socket; otherwise each attempt opens its own. With `--hold` (`tcp` only) every connected
//! socket stays open: after the attempts the probe prints `{"holding":N}`, waits until its
//! stdin closes (so a test can look at the maps meanwhile), then reads every held socket's
//! `getpeername()` again into the last line, `{"done":true,"held_peers":[...]}`.
//! It first moves itself into the cgroup (so the socket-LB programs apply to it) and then into
//! the network namespace `/run/netns/NAME` (itself, not through `ip netns exec`, which remounts
//! /sys and would hide the cgroup), then prints one JSON line per attempt (see
//! `tests::probe::Attempt`) and `{"done":true}` at the end.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::json;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn errno(e: &std::io::Error) -> Option<i32> {
    e.raw_os_error()
}

const TIMEOUT: Duration = Duration::from_secs(2);

/// Opens an unbound UDP socket of `addr`'s family (dual-stack for IPv6, so IPv4-mapped
/// destinations work).
fn udp_socket(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().map_err(std::io::Error::other)?
    } else {
        "[::]:0".parse().map_err(std::io::Error::other)?
    };
    let s = UdpSocket::bind(bind)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    Ok(s)
}

fn attempt(
    mode: &str,
    addr: SocketAddr,
    shared: Option<&UdpSocket>,
    held: Option<&mut Vec<TcpStream>>,
) -> serde_json::Value {
    let start = now_us();
    let result: std::io::Result<(String, Option<String>, Option<String>)> = (|| match mode {
        "tcp" => {
            let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
            s.set_read_timeout(Some(TIMEOUT))?;
            let peer = s.peer_addr().ok().map(|a| a.to_string());
            let mut reply = String::new();
            s.read_to_string(&mut reply)?;
            if let Some(held) = held {
                held.push(s);
            }
            Ok((reply.trim().to_owned(), peer, None))
        }
        "udp" | "udp-connected" => {
            let own;
            let s = match shared {
                Some(s) => s,
                None => {
                    own = udp_socket(addr)?;
                    &own
                }
            };
            let mut buf = [0u8; 1500];
            if mode == "udp" {
                s.send_to(b"hello", addr)?;
                let (n, from) = s.recv_from(&mut buf)?;
                let reply = String::from_utf8_lossy(&buf[..n]).trim().to_owned();
                Ok((reply, None, Some(from.to_string())))
            } else {
                s.connect(addr)?;
                let peer = s.peer_addr().ok().map(|a| a.to_string());
                s.send(b"hello")?;
                let (n, from) = s.recv_from(&mut buf)?;
                let reply = String::from_utf8_lossy(&buf[..n]).trim().to_owned();
                Ok((reply, peer, Some(from.to_string())))
            }
        }
        other => Err(std::io::Error::other(format!("unknown mode {other}"))),
    })();
    let end = now_us();
    match result {
        Ok((reply, peer, from)) => json!({
            "ok": true, "reply": reply, "peer": peer, "from": from,
            "start_us": start, "end_us": end,
        }),
        Err(e) => json!({
            "ok": false, "errno": errno(&e), "error": e.to_string(),
            "start_us": start, "end_us": end,
        }),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut cgroup = None;
    let mut netns = None;
    let mut count: u64 = 1;
    let mut duration = None;
    let mut interval = Duration::ZERO;
    let mut one_socket = false;
    let mut hold = false;
    let mut positional = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--cgroup" => cgroup = args.next(),
            "--netns" => netns = args.next(),
            "--count" => count = args.next().and_then(|v| v.parse().ok()).unwrap_or(1),
            "--duration-ms" => {
                duration = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .map(Duration::from_millis)
            }
            "--one-socket" => one_socket = true,
            "--hold" => hold = true,
            "--interval-ms" => {
                interval =
                    Duration::from_millis(args.next().and_then(|v| v.parse().ok()).unwrap_or(0))
            }
            _ => positional.push(a),
        }
    }
    let (Some(mode), Some(addr)) = (positional.first(), positional.get(1)) else {
        eprintln!(
            "usage: mcs-probe [--cgroup DIR] [--count N] [--duration-ms D] [--interval-ms I] [--one-socket] [--hold] tcp|udp|udp-connected ADDR"
        );
        std::process::exit(2);
    };
    let addr: SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bad address {addr:?}: {e}");
            std::process::exit(2);
        }
    };
    if let Some(cg) = cgroup {
        let procs = std::path::Path::new(&cg).join("cgroup.procs");
        if let Err(e) = std::fs::write(&procs, std::process::id().to_string()) {
            eprintln!("joining cgroup {}: {e}", procs.display());
            std::process::exit(1);
        }
    }
    if let Some(ns) = netns {
        let path = format!("/run/netns/{ns}");
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("opening {path}: {e}");
                std::process::exit(1);
            }
        };
        // SAFETY: a valid namespace fd; the process is single-threaded here.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        if rc != 0 {
            eprintln!("setns {path}: {}", std::io::Error::last_os_error());
            std::process::exit(1);
        }
    }
    let shared = if one_socket && mode == "udp" {
        match udp_socket(addr) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("opening the UDP socket: {e}");
                std::process::exit(1);
            }
        }
    } else {
        None
    };
    let started = Instant::now();
    let mut out = std::io::stdout().lock();
    let mut i = 0u64;
    let mut held = Vec::new();
    // Bounded in count, and in time when a duration is given.
    while i < count && duration.is_none_or(|d| started.elapsed() < d) {
        let hold_this = (hold && mode == "tcp").then_some(&mut held);
        let mut line = attempt(mode, addr, shared.as_ref(), hold_this);
        line["i"] = json!(i);
        let _ = writeln!(out, "{line}");
        i += 1;
        if !interval.is_zero() {
            std::thread::sleep(interval);
        }
    }
    if !hold {
        let _ = writeln!(out, "{}", json!({"done": true}));
        return;
    }
    let _ = writeln!(out, "{}", json!({"holding": held.len()}));
    let _ = out.flush();
    // Until stdin closes (or anything arrives on it).
    let _ = std::io::stdin().read(&mut [0u8; 1]);
    let held_peers: Vec<Option<String>> = held
        .iter()
        .map(|s| s.peer_addr().ok().map(|a| a.to_string()))
        .collect();
    let _ = writeln!(out, "{}", json!({"done": true, "held_peers": held_peers}));
}
