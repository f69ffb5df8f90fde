//! The datapath bench end to end (root only): every mode moves real TCP connections and UDP
//! exchanges, the VIP modes reach the backends behind the VIPs, and every socket-LB program's
//! cost is measured next to its do-nothing twin. Also checks that the generated
//! kube-proxy-shaped rules load into a throwaway namespace. `Topology` (inside `run`) holds the
//! SERIAL lock.

use std::{net::Ipv4Addr, net::SocketAddrV4, process::Command, time::Duration};

use tests::{
    bench::datapath::{self, DatapathOptions, Mode, Proto, rules},
    netns::{Topology, sh},
    require_root,
};

#[test]
fn every_mode_moves_connections_to_the_backends_behind_the_vips() {
    require_root!();
    let work = tempfile::tempdir().unwrap();
    let opts = DatapathOptions {
        services: vec![1, 100],
        protos: vec![Proto::Tcp, Proto::Udp],
        modes: Mode::ALL.to_vec(),
        duration: Duration::from_secs(1),
        threads: 2,
        change_samples: 3,
        work_dir: work.path().to_owned(),
        install_budget: Duration::from_secs(300),
    };
    let report = datapath::run(&opts).unwrap();
    assert_eq!(report.throughput.len(), 16);
    for t in &report.throughput {
        let what = format!("{} {} N={}: {t:?}", t.mode, t.proto, t.services);
        assert!(t.connections > 0, "{what}");
        assert_eq!(t.skipped, None, "{what}");
        assert_eq!(t.failures, 0, "{what}");
        assert!(t.conns_per_sec > 0.0 && t.p99_us >= t.p50_us, "{what}");
        // Every reply came from a backend the targeted services (or addresses) may reach.
        assert_eq!(t.by_backend.values().sum::<u64>(), t.connections, "{what}");
        for b in t.by_backend.keys() {
            assert!(t.expected_backends.contains(b), "{what}: {b} answered");
        }
        if t.mode != Mode::Direct {
            // Load-balanced: the one service of N=1 has two endpoints, and both answer.
            assert!(t.by_backend.len() >= 2, "{what}");
            assert!(t.install_secs > 0.0, "{what}");
        }
        if t.services == 100 {
            assert_eq!(t.targets, if t.mode == Mode::Direct { 4 } else { 100 });
            assert_eq!(t.by_backend.len(), 4, "{what}: all four backends answer");
        }
    }
    assert_eq!(
        report.throughput[0].expected_backends,
        ["10.99.1.10:8080", "10.99.1.11:8080"],
        "N=1 reaches only its service's two endpoints"
    );
    let udp = &report.throughput[4];
    assert_eq!(
        (udp.mode, udp.proto, udp.services),
        (Mode::SocketLb, Proto::Udp, 1)
    );
    assert_eq!(
        udp.expected_backends,
        ["10.99.1.10:8053", "10.99.1.11:8053"],
        "UDP goes to the UDP servers"
    );
    // Every program ran on its calls, next to its do-nothing twin, at both N; the reference
    // programs ran in a stretch of their own, before the agent's (the bench checks the order).
    for n in [1, 100] {
        let hooks: Vec<(&str, &str)> = report
            .hooks
            .iter()
            .filter(|h| h.services == n)
            .map(|h| (h.hook.as_str(), h.calls_on.as_str()))
            .collect();
        assert_eq!(
            hooks,
            [
                ("connect4", "TCP connects to VIPs"),
                (
                    "lookup_connect4",
                    "the frontend lookup alone, on TCP connects to VIPs"
                ),
                (
                    "connect4",
                    "TCP VIP connects whose frontend lookup_connect4 has just read"
                ),
                ("connect6", "TCP connects to IPv6 VIPs"),
                ("connect4", "TCP connects to addresses that are not VIPs"),
                ("sendmsg4", "UDP datagrams sent to VIPs (unconnected)"),
                ("recvmsg4", "UDP replies received from VIPs"),
                (
                    "lookup_sendmsg4",
                    "the frontend lookup alone, on UDP datagrams sent to VIPs"
                ),
                (
                    "sendmsg4",
                    "UDP VIP datagrams whose frontend lookup_sendmsg4 has just read"
                ),
            ],
            "N={n}"
        );
    }
    for h in &report.hooks {
        assert!(
            h.calls > 0 && h.ns_per_call > 0.0 && h.floor_ns_per_call > 0.0,
            "{h:?}"
        );
    }
    // A reference program and the agent's program measured after it ran on the same calls.
    for pair in report.hooks.windows(2) {
        if pair[0].hook.starts_with("lookup_") {
            assert_eq!(pair[0].calls, pair[1].calls, "{pair:?}");
            assert_eq!(format!("lookup_{}", pair[1].hook), pair[0].hook);
        }
    }
    let changes: Vec<_> = report
        .change
        .iter()
        .map(|c| (c.mode, c.services, c.samples))
        .collect();
    assert_eq!(
        changes,
        [
            (Mode::Iptables, 1, 3),
            (Mode::Nftables, 1, 3),
            (Mode::Iptables, 100, 3),
            (Mode::Nftables, 100, 3)
        ]
    );
    assert!(report.change.iter().all(|c| c.p50_ms > 0.0));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["throughput"][0]["mode"], "socket-lb");
}

/// Runs `program args` inside `ns` with `input` on stdin.
fn in_ns(ns: &str, program: &str, args: &[&str], input: &str) -> Result<(), String> {
    use std::io::Write as _;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The install text and a change for both netfilter shapes load, and the change really
/// replaces the endpoint (iptables-save / nft list show the new DNAT and not the old one).
#[test]
fn generated_rules_load_in_a_throwaway_namespace() {
    require_root!();
    let topo = Topology::new(&[]).unwrap();
    let ns = &topo.client;
    let backends: Vec<SocketAddrV4> = (10..14)
        .map(|h| SocketAddrV4::new(Ipv4Addr::new(10, 99, 1, h), 8080))
        .collect();
    let mut svcs = rules::services(2, &backends, Proto::Tcp);
    let old = svcs[0].endpoints.clone();
    svcs[0].endpoints[0] = backends[3];

    let full = rules::iptables_full(&rules::services(2, &backends, Proto::Tcp));
    in_ns(ns, "iptables-restore", &["--test"], &full).unwrap();
    in_ns(ns, "iptables-restore", &[], &full).unwrap();
    let change = rules::iptables_change(&svcs, &svcs[0], &old);
    in_ns(ns, "iptables-restore", &["--noflush"], &change).unwrap();
    let saved = sh("ip", &["netns", "exec", ns, "iptables-save", "-t", "nat"]).unwrap();
    assert!(
        saved.contains("--to-destination 10.99.1.13:8080"),
        "{saved}"
    );
    // Service 0 had .10 and .11 and now has .13 and .11; service 1 never had .10.
    assert!(
        !saved.contains("10.99.1.10:8080"),
        "the replaced endpoint's chain is gone: {saved}"
    );
    assert_eq!(saved.matches("-j DNAT").count(), 5, "{saved}");
    assert_eq!(saved.matches("-A KUBE-SERVICES").count(), 3, "{saved}");
    // Leave no iptables-nft tables behind for the nft part.
    sh("ip", &["netns", "exec", ns, "nft", "flush", "ruleset"]).unwrap();

    let full = rules::nft_full(&rules::services(2, &backends, Proto::Tcp));
    in_ns(ns, "nft", &["-c", "-f", "-"], &full).unwrap();
    in_ns(ns, "nft", &["-f", "-"], &full).unwrap();
    // Installing again replaces the table instead of failing or doubling it.
    in_ns(ns, "nft", &["-f", "-"], &full).unwrap();
    in_ns(ns, "nft", &["-f", "-"], &rules::nft_change(&svcs[0], &old)).unwrap();
    let listed = sh(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "nft",
            "list",
            "table",
            "ip",
            "kube-proxy",
        ],
    )
    .unwrap();
    assert!(listed.contains("dnat to 10.99.1.13:8080"), "{listed}");
    assert!(!listed.contains("10.99.1.10"), "{listed}");
    assert_eq!(listed.matches("dnat to").count(), 5, "{listed}");
    assert_eq!(listed.matches("numgen random mod").count(), 2, "{listed}");
}
