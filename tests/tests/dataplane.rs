//! The socket load balancer end to end: the agent's node role programs the maps from YAML
//! fixtures, and real TCP/UDP clients in a test namespace and child cgroup reach real backends
//! in per-cluster namespaces. Each test asserts which backend answered. Root only (see
//! `tests::netns` for the isolation rules).

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader},
    path::Path,
    time::{Duration, Instant},
};

use aya::maps::{Array, Map, MapData};
use dataplane_ebpf::{
    ConnRevNat, RevNatKey4, RevNatKey6, RevNatValue4, RevNatValue6, map_names, rev_tag,
};
use tests::{
    agent::{Agent, frontend, inspect, one_service_yaml},
    netns::Topology,
    probe::{self, Attempt, by_backend, by_cluster},
    require_root,
};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/dataplane");
const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// Copies a fixture directory into the topology's input dir and returns that dir.
fn input_dir(topo: &Topology, fixture: &str) -> std::path::PathBuf {
    for entry in std::fs::read_dir(Path::new(FIXTURES).join(fixture)).expect("fixture dir") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("fixture");
        topo.write_fixture("input", &path.file_name().unwrap().to_string_lossy(), &text)
            .expect("write fixture");
    }
    topo.dir.join("input")
}

fn start_node(topo: &Topology, input: &Path, extra: &[&str]) -> Agent {
    let mut args = vec!["node", "--from-dir", input.to_str().unwrap()];
    args.extend_from_slice(extra);
    Agent::start(topo, &args).expect("start agent")
}

/// Starts the agent on a fixture and waits until the maps hold its `frontends` entries.
fn node_on(topo: &Topology, fixture: &str, frontends: usize) -> Agent {
    node_on_with(topo, fixture, frontends, &[])
}

/// [`node_on`] with extra agent flags.
fn node_on_with(topo: &Topology, fixture: &str, frontends: usize, extra: &[&str]) -> Agent {
    let input = input_dir(topo, fixture);
    let mut agent = start_node(topo, &input, extra);
    agent
        .wait_for(
            &format!("the {fixture} fixture in the maps"),
            SYNC_TIMEOUT,
            |i| i.frontends.len() == frontends,
        )
        .unwrap();
    agent
}

fn clusters(attempts: &[Attempt]) -> BTreeSet<String> {
    by_cluster(attempts).into_keys().collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `count` unconnected UDP exchanges with `vip`: all answered by backends of `clusters`, every
/// reply from the VIP (`recvfrom` reports it).
fn udp_from_vip(topo: &Topology, vip: &str, count: usize, clusters_: &[&str]) -> Vec<Attempt> {
    let attempts = topo
        .probe("udp", vip, &["--count", &count.to_string()])
        .unwrap();
    assert!(all_ok(&attempts), "{attempts:?}");
    assert_eq!(clusters(&attempts), set(clusters_));
    assert!(
        attempts.iter().all(|a| a.from.as_deref() == Some(vip)),
        "recvfrom must report the VIP {vip}: {:?}",
        attempts
            .iter()
            .map(|a| a.from.clone())
            .collect::<BTreeSet<_>>()
    );
    attempts
}

/// Every entry of the pinned LRU hash `name`.
fn lru_entries<K: aya::Pod, V: aya::Pod>(pin_dir: &Path, name: &str) -> Vec<(K, V)> {
    let data = MapData::from_pin(pin_dir.join("maps").join(name)).expect("the map's pin");
    let map: aya::maps::HashMap<MapData, K, V> =
        aya::maps::HashMap::try_from(Map::LruHashMap(data)).expect("an LRU hash");
    map.iter().map(|e| e.unwrap()).collect()
}

fn all_ok(attempts: &[Attempt]) -> bool {
    attempts.iter().all(|a| a.ok)
}

/// 1 and 5: a port declared by both clusters reaches both; a port declared by one cluster
/// reaches only it; the conformance #20/#21 port conflicts route per port; getpeername reports
/// the VIP.
#[test]
fn ports_reach_only_clusters_that_declare_them() {
    require_root!();
    let (topo, _agent) = ports_topology();

    let http = topo
        .probe("tcp", "241.0.0.10:80", &["--count", "200"])
        .unwrap();
    assert!(all_ok(&http), "{:?}", by_cluster(&http));
    assert_eq!(
        clusters(&http),
        set(&["a", "b"]),
        "port 80 is declared by both"
    );
    assert_eq!(by_backend(&http).len(), 4, "all four backends serve :80");
    assert!(
        http.iter()
            .all(|a| a.peer.as_deref() == Some("241.0.0.10:80")),
        "getpeername must report the VIP"
    );

    let admin = topo
        .probe("tcp", "241.0.0.10:9000", &["--count", "200"])
        .unwrap();
    assert!(all_ok(&admin), "{:?}", by_cluster(&admin));
    assert_eq!(clusters(&admin), set(&["a"]), "only a declares admin:9000");
    assert!(
        admin
            .iter()
            .all(|a| a.reply.as_deref().unwrap().ends_with(":9090"))
    );

    let same_name = topo
        .probe("tcp", "241.0.0.20:42", &["--count", "50"])
        .unwrap();
    assert!(all_ok(&same_name));
    assert_eq!(
        clusters(&same_name),
        set(&["a"]),
        "#20: b's tcp is 4242, not 42"
    );

    let p42 = topo
        .probe("tcp", "241.0.0.21:42", &["--count", "50"])
        .unwrap();
    let p4242 = topo
        .probe("tcp", "241.0.0.21:4242", &["--count", "50"])
        .unwrap();
    assert!(all_ok(&p42) && all_ok(&p4242));
    assert_eq!(clusters(&p42), set(&["a"]), "#21: 42 is a's");
    assert_eq!(clusters(&p4242), set(&["b"]), "#21: 4242 is b's");

    let i = inspect(&topo.pin_dir).unwrap();
    let row = frontend(&i, "241.0.0.10", 9000, "TCP").unwrap();
    assert_eq!(row.translations, 200, "per-frontend counter");
    assert_eq!(row.port_name, "admin");
}

/// 2: the IPv6 VIP reaches only IPv6 endpoints of clusters that declare IPv6, the IPv4 VIP
/// only IPv4 endpoints of clusters that declare IPv4, over TCP; and the IPv6 VIP the same over
/// unconnected UDP, whose replies come from it (the IPv6 reverse entries, each with its tag).
#[test]
fn each_family_reaches_only_clusters_of_that_family() {
    require_root!();
    let mut topo = Topology::new(&["a", "b", "c"]).unwrap();
    for c in ["a", "b", "c"] {
        topo.start_backend(c, 10, &["tcp:8080", "udp:5353"])
            .unwrap();
    }
    let _agent = node_on(&topo, "dualstack", 6);

    let v4 = topo
        .probe("tcp", "241.0.0.30:80", &["--count", "100"])
        .unwrap();
    assert!(all_ok(&v4), "{:?}", by_cluster(&v4));
    assert_eq!(clusters(&v4), set(&["a", "b"]));
    assert!(
        v4.iter()
            .all(|a| a.reply.as_deref().unwrap().contains(" 10.99."))
    );

    let v6 = topo
        .probe("tcp", "[fd00:241::30]:80", &["--count", "100"])
        .unwrap();
    assert!(all_ok(&v6), "{:?}", by_cluster(&v6));
    assert_eq!(clusters(&v6), set(&["a", "c"]));
    assert!(
        v6.iter()
            .all(|a| a.reply.as_deref().unwrap().contains(" [fd00:99:")),
        "IPv6 VIP must reach IPv6 endpoints only"
    );
    assert!(
        v6.iter()
            .all(|a| a.peer.as_deref() == Some("[fd00:241::30]:80"))
    );

    udp_from_vip(&topo, "[fd00:241::30]:53", 40, &["a", "c"]);
    let entries: Vec<(RevNatKey6, RevNatValue6)> = lru_entries(&topo.pin_dir, map_names::REVNAT6);
    assert!(!entries.is_empty());
    for (key, value) in &entries {
        let tag = rev_tag(
            key.cookie,
            &key.backend_addr,
            key.backend_port,
            &value.vip,
            value.vip_port,
        );
        assert_eq!(value.tag, tag, "{key:?} -> {value:?}");
    }
}

/// 3: an undeclared port on a known VIP, and a frontend whose backends are all gone, are
/// refused at once; an unknown address is left alone (and, with no route, unreachable).
#[test]
fn undeclared_ports_and_empty_frontends_are_refused() {
    require_root!();
    let mut topo = Topology::new(&["a"]).unwrap();
    topo.start_backend("a", 10, &["tcp:8080", "udp:5353"])
        .unwrap();
    let _agent = node_on(&topo, "refuse", 7);

    let ok = topo.probe("tcp", "241.0.0.10:80", &[]).unwrap();
    assert!(all_ok(&ok));
    for (mode, addr) in [
        ("tcp", "241.0.0.10:81"),
        ("tcp", "[fd00:241::10]:443"),
        ("udp", "241.0.0.10:53"),
        ("tcp", "241.0.0.40:80"),
        ("udp", "241.0.0.40:53"),
        ("udp-connected", "241.0.0.40:53"),
    ] {
        let r = topo.probe(mode, addr, &["--count", "3"]).unwrap();
        assert!(
            r.iter()
                .all(|a| !a.ok && a.errno == Some(libc::ECONNREFUSED)),
            "{mode} {addr}: {r:?}"
        );
    }
    let other = topo.probe("tcp", "241.0.0.99:80", &[]).unwrap();
    assert_eq!(other[0].errno, Some(libc::ENETUNREACH), "{other:?}");

    let i = inspect(&topo.pin_dir).unwrap();
    assert_eq!(frontend(&i, "241.0.0.10", 0, "*").unwrap().rejects, 6);
    assert_eq!(frontend(&i, "241.0.0.40", 80, "TCP").unwrap().rejects, 3);
    assert!(
        frontend(&i, "241.0.0.40", 80, "TCP")
            .unwrap()
            .backends
            .is_empty()
    );
}

/// One service, `name` at `vip`:80, served by a's host 10 on 8080.
fn one_service(name: &str, vip: &str) -> String {
    one_service_yaml(name, vip, &[10])
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t owned here, filled by the kernel; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Runs `f` with this thread (and the processes it starts) pinned to `cpu`.
fn on_cpu<T>(cpu: usize, f: impl FnOnce() -> T) -> T {
    // SAFETY: plain libc calls on zeroed cpu_set_t values owned here; pid 0 is this thread.
    unsafe {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut all: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, size, &mut all), 0);
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        assert_eq!(
            libc::sched_setaffinity(0, size, &one),
            0,
            "pin to CPU {cpu}"
        );
        let out = f();
        assert_eq!(libc::sched_setaffinity(0, size, &all), 0);
        out
    }
}

/// The counters: connects made on different CPUs add up in one frontend's row, and a frontend
/// id that is freed and given to another frontend starts again from zero on every CPU.
#[test]
fn counters_sum_over_cpus_and_a_reused_frontend_id_starts_from_zero() {
    require_root!();
    let mut topo = Topology::new(&["a"]).unwrap();
    topo.start_backend("a", 10, &["tcp:8080"]).unwrap();
    let input = topo
        .write_fixture("input", "svc.yaml", &one_service("web", "241.0.0.10"))
        .unwrap();
    let mut agent = start_node(&topo, &input, &[]);
    agent
        .wait_for("web in the maps", SYNC_TIMEOUT, |i| i.frontends.len() == 2)
        .unwrap();

    // Two CPUs where the test may use two (one only checks the reset).
    let cpus: Vec<usize> = allowed_cpus().into_iter().take(2).collect();
    if cpus.len() < 2 {
        eprintln!("only one CPU allowed: the sum over CPUs is not exercised");
    }
    for &cpu in &cpus {
        let r = on_cpu(cpu, || {
            topo.probe("tcp", "241.0.0.10:80", &["--count", "20"])
                .unwrap()
        });
        assert!(all_ok(&r), "CPU {cpu}: {r:?}");
    }
    let i = inspect(&topo.pin_dir).unwrap();
    let web = frontend(&i, "241.0.0.10", 80, "TCP").unwrap();
    assert_eq!(
        web.translations,
        20 * cpus.len() as u64,
        "summed over CPUs {cpus:?}"
    );

    // Take web away, then bring another service: it gets web's (lowest free) ids.
    std::fs::remove_file(input.join("svc.yaml")).unwrap();
    agent
        .wait_for("web gone", SYNC_TIMEOUT, |i| i.frontends.is_empty())
        .unwrap();
    topo.write_fixture("input", "svc.yaml", &one_service("api", "241.0.0.11"))
        .unwrap();
    agent
        .wait_for("api in the maps", SYNC_TIMEOUT, |i| i.frontends.len() == 2)
        .unwrap();
    let i = inspect(&topo.pin_dir).unwrap();
    let api = frontend(&i, "241.0.0.11", 80, "TCP").unwrap();
    assert_eq!(api.id, web.id, "the freed id is reused");
    assert_eq!(
        (api.translations, api.rejects),
        (0, 0),
        "a reused id starts at 0"
    );

    let r = on_cpu(cpus[cpus.len() - 1], || {
        topo.probe("tcp", "241.0.0.11:80", &["--count", "3"])
            .unwrap()
    });
    assert!(all_ok(&r), "{r:?}");
    let i = inspect(&topo.pin_dir).unwrap();
    assert_eq!(
        frontend(&i, "241.0.0.11", 80, "TCP").unwrap().translations,
        3
    );
}

/// 4: UDP, connected and unconnected: replies come from (and getpeername reports) the VIP.
#[test]
fn udp_replies_come_from_the_vip() {
    require_root!();
    let (topo, _agent) = ports_topology();

    udp_from_vip(&topo, "241.0.0.10:53", 100, &["a", "b"]);
    let connected = topo
        .probe("udp-connected", "241.0.0.10:53", &["--count", "100"])
        .unwrap();
    assert!(all_ok(&connected), "{connected:?}");
    assert_eq!(clusters(&connected), set(&["a", "b"]));
    assert!(
        connected
            .iter()
            .all(|a| a.peer.as_deref() == Some("241.0.0.10:53"))
    );
    assert!(
        connected
            .iter()
            .all(|a| a.from.as_deref() == Some("241.0.0.10:53"))
    );
}

/// Starts four backends (a and b, hosts 10 and 11) on every port of the `ports` fixture and the
/// agent on it, and waits for its 9 frontends.
fn ports_topology() -> (Topology, Agent) {
    ports_topology_with(&[])
}

fn ports_topology_with(extra: &[&str]) -> (Topology, Agent) {
    let mut topo = Topology::new(&["a", "b"]).unwrap();
    for c in ["a", "b"] {
        for h in [10, 11] {
            topo.start_backend(c, h, &["tcp:8080", "tcp:9090", "tcp:8042", "udp:5353"])
                .unwrap();
        }
    }
    let agent = node_on_with(&topo, "ports", 9, extra);
    (topo, agent)
}

/// Every entry of the pinned `MCS_CONN_REVNAT` array.
fn connected_entries(pin_dir: &Path) -> Vec<ConnRevNat> {
    let pin = pin_dir.join("maps").join(map_names::CONN_REVNAT);
    let data = MapData::from_pin(&pin).expect("MCS_CONN_REVNAT pin");
    let array: Array<MapData, ConnRevNat> = Array::try_from(Map::Array(data)).expect("an array");
    (0..array.len())
        .map(|i| array.get(&i, 0).expect("entry"))
        .collect()
}

/// More connected sockets open at once than `MCS_CONN_REVNAT` has entries: the ones whose
/// entry another socket holds keep their translation in socket storage, so every socket,
/// read again after all of them are open, still reports the VIP; the held entries carry the
/// VIP; and `sock_release` frees every entry once the sockets are closed.
#[test]
fn connected_sockets_past_their_map_entry_keep_the_vip_and_release_frees_it() {
    require_root!();
    let (topo, _agent) = ports_topology_with(&["--max-connected", "3"]);
    let vip = u32::from_ne_bytes([241, 0, 0, 10]);
    let port = 80u16.to_be();
    assert_eq!(
        connected_entries(&topo.pin_dir).len(),
        4,
        "--max-connected is rounded up to a power of two"
    );

    let mut probe = topo
        .probe_command("tcp", "241.0.0.10:80", &["--count", "20", "--hold"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("spawn mcs-probe");
    let mut stdout = BufReader::new(probe.stdout.take().expect("stdout"));
    let mut out = String::new();
    while !out.contains("\"holding\"") {
        let before = out.len();
        stdout.read_line(&mut out).expect("probe output");
        assert!(out.len() > before, "mcs-probe exited early: {out}");
    }
    let held: Vec<ConnRevNat> = connected_entries(&topo.pin_dir)
        .into_iter()
        .filter(|e| e.cookie != 0)
        .collect();
    drop(probe.stdin.take());
    std::io::Read::read_to_string(&mut stdout, &mut out).expect("probe output");
    let status = probe.wait().expect("probe exit");
    assert!(status.success(), "{out}");

    assert!(
        !held.is_empty(),
        "20 open sockets claim an entry of a 4-entry map"
    );
    for e in &held {
        assert_eq!(
            (e.rev.vip[0], e.rev.vip_port, e.rev.family),
            (vip, port, dataplane_ebpf::AF_INET),
            "a held entry translates back to the VIP: {e:?}"
        );
    }
    let attempts = probe::parse(&out, "").unwrap();
    assert_eq!(attempts.len(), 20);
    assert!(all_ok(&attempts), "{:?}", by_cluster(&attempts));
    assert!(
        attempts
            .iter()
            .all(|a| a.peer.as_deref() == Some("241.0.0.10:80")),
        "getpeername right after connect must report the VIP"
    );
    let peers = probe::held_peers(&out).unwrap();
    assert_eq!(peers.len(), 20);
    assert!(
        peers.iter().all(|p| p.as_deref() == Some("241.0.0.10:80")),
        "getpeername with all sockets open must report the VIP: {peers:?}"
    );
    assert!(
        connected_entries(&topo.pin_dir)
            .iter()
            .all(|e| e.cookie == 0),
        "sock_release frees every entry"
    );
}

/// Dual-stack sockets (AF_INET6, as Java and .NET open them) reach an IPv4 VIP through its
/// IPv4-mapped address `::ffff:241.0.0.10`: balanced over the same backends, refused on an
/// undeclared port, getpeername reports the mapped VIP, and UDP replies come from it.
#[test]
fn v4_mapped_destinations_of_dual_stack_sockets_are_load_balanced() {
    require_root!();
    let (topo, _agent) = ports_topology();

    let tcp = topo
        .probe("tcp", "[::ffff:241.0.0.10]:80", &["--count", "100"])
        .unwrap();
    assert!(all_ok(&tcp), "{:?}", by_cluster(&tcp));
    assert_eq!(clusters(&tcp), set(&["a", "b"]));
    assert_eq!(by_backend(&tcp).len(), 4, "{:?}", by_backend(&tcp));
    assert!(
        tcp.iter()
            .all(|a| a.peer.as_deref() == Some("[::ffff:241.0.0.10]:80")),
        "getpeername must report the mapped VIP: {:?}",
        tcp.iter().map(|a| a.peer.clone()).collect::<BTreeSet<_>>()
    );
    assert!(
        tcp.iter()
            .all(|a| a.reply.as_deref().unwrap().contains(" 10.99.")),
        "the backends were reached over IPv4"
    );

    let refused = topo
        .probe("tcp", "[::ffff:241.0.0.10]:81", &["--count", "3"])
        .unwrap();
    assert!(
        refused
            .iter()
            .all(|a| !a.ok && a.errno == Some(libc::ECONNREFUSED)),
        "{refused:?}"
    );

    for mode in ["udp", "udp-connected"] {
        let udp = topo
            .probe(mode, "[::ffff:241.0.0.10]:53", &["--count", "40"])
            .unwrap();
        assert!(all_ok(&udp), "{mode}: {udp:?}");
        assert_eq!(clusters(&udp), set(&["a", "b"]), "{mode}");
        assert!(
            udp.iter()
                .all(|a| a.from.as_deref() == Some("[::ffff:241.0.0.10]:53")),
            "{mode}: replies must come from the mapped VIP: {:?}",
            udp.iter().map(|a| a.from.clone()).collect::<BTreeSet<_>>()
        );
        if mode == "udp-connected" {
            assert!(
                udp.iter()
                    .all(|a| a.peer.as_deref() == Some("[::ffff:241.0.0.10]:53"))
            );
        }
    }

    let i = inspect(&topo.pin_dir).unwrap();
    assert_eq!(
        frontend(&i, "241.0.0.10", 80, "TCP").unwrap().translations,
        100
    );
    assert_eq!(frontend(&i, "241.0.0.10", 0, "*").unwrap().rejects, 3);
    assert_eq!(
        frontend(&i, "241.0.0.10", 53, "UDP").unwrap().translations,
        80
    );
}

/// Unconnected UDP picks the backend by socket: every datagram of one socket reaches the same
/// backend (a handshake that spans datagrams stays whole), over IPv4 and IPv4-mapped IPv6;
/// sockets spread over all the backends. Each (socket, backend) reverse entry carries the tag
/// of its key and VIP, which `recvmsg4` checks before it uses the entry.
#[test]
fn unconnected_udp_sticks_to_one_backend_per_socket() {
    require_root!();
    let (topo, _agent) = ports_topology();
    for addr in ["241.0.0.10:53", "[::ffff:241.0.0.10]:53"] {
        for _ in 0..3 {
            let one = topo
                .probe("udp", addr, &["--count", "50", "--one-socket"])
                .unwrap();
            assert!(all_ok(&one), "{one:?}");
            assert_eq!(by_backend(&one).len(), 1, "{addr}: {:?}", by_backend(&one));
        }
    }
    let many = topo
        .probe("udp", "241.0.0.10:53", &["--count", "200"])
        .unwrap();
    assert!(all_ok(&many));
    assert_eq!(by_backend(&many).len(), 4, "{:?}", by_backend(&many));

    let entries: Vec<(RevNatKey4, RevNatValue4)> = lru_entries(&topo.pin_dir, map_names::REVNAT4);
    // The one-socket runs and the 200 sockets of the last run (the LRU keeps closed ones).
    assert!(entries.len() >= 200, "{} reverse entries", entries.len());
    for (key, value) in &entries {
        assert_eq!(
            value.tag,
            rev_tag(
                key.cookie,
                &[key.backend_addr],
                key.backend_port,
                &[value.vip],
                value.vip_port
            ),
            "{key:?} -> {value:?}"
        );
    }
}

/// 6: with ClientIP affinity, 50 connects from one namespace hit one backend; without it
/// they spread over the backends.
#[test]
fn client_ip_affinity_sticks_and_no_affinity_spreads() {
    require_root!();
    let mut topo = Topology::new(&["a"]).unwrap();
    for h in 10..=13 {
        topo.start_backend("a", h, &["tcp:8080"]).unwrap();
    }
    let _agent = node_on(&topo, "affinity", 4);

    let sticky = topo
        .probe("tcp", "241.0.0.50:80", &["--count", "50"])
        .unwrap();
    assert!(all_ok(&sticky));
    assert_eq!(by_backend(&sticky).len(), 1, "{:?}", by_backend(&sticky));
    let spread = topo
        .probe("tcp", "241.0.0.51:80", &["--count", "400"])
        .unwrap();
    assert!(all_ok(&spread));
    // Uniform over 4 backends: each expects 100 of 400; 50 is over 5 standard deviations off.
    let counts = by_backend(&spread);
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(counts.values().all(|n| *n >= 50), "not uniform: {counts:?}");
    eprintln!("spread: {counts:?}");

    let i = inspect(&topo.pin_dir).unwrap();
    let row = frontend(&i, "241.0.0.50", 80, "TCP").unwrap();
    assert_eq!(row.affinity_timeout_seconds, Some(300));
    assert_eq!(
        row.affinity_hits, 49,
        "every connect after the first is an affinity hit"
    );

    // The metrics' count of affinity matches (batched) is the map's number of keys.
    let maps_dir = topo.pin_dir.join("maps");
    let data = MapData::from_pin(maps_dir.join(map_names::AFFINITY_MATCH)).unwrap();
    let keys = aya::maps::HashMap::<_, dataplane_ebpf::AffinityMatchKey, u32>::try_from(
        Map::HashMap(data),
    )
    .unwrap()
    .keys()
    .count();
    let maps = dataplane_agent::bpf::kernel::KernelMaps::open_pinned(&maps_dir).unwrap();
    let read = maps
        .read_for_metrics(None::<fn(&dataplane_ebpf::FrontendName)>)
        .unwrap();
    assert!(keys > 0);
    assert_eq!(read.affinity_matches, keys);
}

/// 7: the agent is killed with SIGKILL while a client runs 1000 connects: every connect
/// succeeds, and the restarted agent adopts the same maps (same ids).
#[test]
fn connections_survive_an_agent_sigkill_and_restart_adopts_the_maps() {
    require_root!();
    let mut topo = Topology::new(&["a", "b"]).unwrap();
    for c in ["a", "b"] {
        for h in [10, 11] {
            topo.start_backend(c, h, &["tcp:8080", "tcp:9090", "tcp:8042", "udp:5353"])
                .unwrap();
        }
    }
    let input = input_dir(&topo, "ports");
    let mut agent = start_node(&topo, &input, &[]);
    let before = agent
        .wait_for("the ports fixture", SYNC_TIMEOUT, |i| {
            i.frontends.len() == 9
        })
        .unwrap();

    let mut client = topo
        .probe_command(
            "tcp",
            "241.0.0.10:80",
            &["--count", "1000", "--interval-ms", "2"],
        )
        .spawn()
        .unwrap();
    // Kill the agent once the client is well under way.
    let stdout = client.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut out = String::new();
    for line in lines.by_ref().take(100) {
        out.push_str(&line.unwrap());
        out.push('\n');
    }
    agent.kill(libc::SIGKILL);
    assert!(!agent.running());
    for line in lines {
        out.push_str(&line.unwrap());
        out.push('\n');
    }
    client.wait().unwrap();
    let attempts = probe::parse(&out, "").unwrap();
    assert_eq!(attempts.len(), 1000);
    assert!(all_ok(&attempts), "{:?}", by_cluster(&attempts));
    assert_eq!(clusters(&attempts), set(&["a", "b"]));

    let mut restarted = start_node(&topo, &input, &[]);
    restarted
        .wait_for("the restarted agent's first sync", SYNC_TIMEOUT, |_| true)
        .unwrap();
    let deadline = Instant::now() + SYNC_TIMEOUT;
    while !restarted.log_text().contains("maps synced") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = restarted.log_text();
    assert!(
        log.contains("adopted the pinned programs and links"),
        "{log}"
    );
    assert!(
        log.contains("writes=0"),
        "an adopting agent rewrites nothing: {log}"
    );
    let after = inspect(&topo.pin_dir).unwrap();
    assert_eq!(before.maps, after.maps, "same maps, same ids");
    assert_eq!(before.links, after.links, "same links and programs");
}

fn churn_yaml(hosts: &[u8]) -> String {
    let endpoints: Vec<String> = hosts
        .iter()
        .map(|h| format!("- addresses: [10.99.1.{h}]"))
        .collect();
    format!(
        "apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {{name: churn, namespace: demo}}
spec:
  type: ClusterSetIP
  ips: [241.0.0.70]
  ipFamilies: [IPv4]
  ports: [{{name: http, protocol: TCP, port: 80}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: churn-a-ipv4
  namespace: demo
  labels: {{multicluster.kubernetes.io/service-name: churn, multicluster.kubernetes.io/source-cluster: a}}
addressType: IPv4
ports: [{{name: http, protocol: TCP, port: 8080}}]
endpoints:
{}
",
        endpoints.join("\n")
    )
}

/// 8: backends churn every 50 ms for 10 s while a client connects in a loop, the frontend
/// moving each time between carrying its backends and reading them from slots. No connect fails
/// (one backend is always up), and no connect that started after a backend's removal was
/// written to the maps (as seen by polling them) reaches that backend.
#[test]
fn backend_churn_never_fails_a_connect_or_reaches_a_removed_backend() {
    require_root!();
    let mut topo = Topology::new(&["a"]).unwrap();
    let stable = 10u8;
    let churners: Vec<u8> = (20..26).collect();
    topo.start_backend("a", stable, &["tcp:8080"]).unwrap();
    for h in &churners {
        topo.start_backend("a", *h, &["tcp:8080"]).unwrap();
    }
    let input = topo
        .write_fixture("input", "churn.yaml", &churn_yaml(&[stable]))
        .unwrap();
    let mut agent = start_node(&topo, &input, &[]);
    agent
        .wait_for("the churn service", SYNC_TIMEOUT, |i| {
            frontend(i, "241.0.0.70", 80, "TCP").is_some_and(|f| f.backends.len() == 1)
        })
        .unwrap();

    let client = topo
        .probe_command(
            "tcp",
            "241.0.0.70:80",
            &["--duration-ms", "10000", "--count", "1000000"],
        )
        .spawn()
        .unwrap();
    // Drain the client's output as it comes: a full pipe would stall the client.
    let client = std::thread::spawn(move || client.wait_with_output());

    // Poll the maps. A sample is (read started, read finished, backends present), in µs.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let pin_dir = topo.pin_dir.clone();
    let monitor = std::thread::spawn(move || {
        let mut samples: Vec<Sample> = Vec::new();
        while stop_rx.try_recv().is_err() {
            let t0 = now_us();
            // Map reads are not atomic: a sample taken while a frontend flips can miss a slot,
            // and a slow read can straddle two syncs. Such samples are dropped rather than
            // mistaken for a removal.
            if let Ok(i) = inspect(&pin_dir)
                && let Some(f) = frontend(&i, "241.0.0.70", 80, "TCP")
                && f.backends.len() == f.count as usize
            {
                let t1 = now_us();
                if t1 - t0 < 10_000 {
                    let present = f.backends.iter().map(|b| format!("a/{}", b.ip)).collect();
                    samples.push(Sample { t0, t1, present });
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        samples
    });

    let started = Instant::now();
    let mut step = 0usize;
    while started.elapsed() < Duration::from_secs(10) {
        // Every 50 ms, in turn: the stable backend with two churners, rotating (a frontend
        // that carries its 3 backends in its entry), and with all six (7 backends, read from
        // the slots). Every step removes backends and moves the frontend between the two.
        let a = churners[step % churners.len()];
        let b = churners[(step + 1) % churners.len()];
        let set: Vec<u8> = if step.is_multiple_of(2) {
            vec![stable, a, b]
        } else {
            std::iter::once(stable)
                .chain(churners.iter().copied())
                .collect()
        };
        topo.write_fixture("input", "churn.yaml", &churn_yaml(&set))
            .unwrap();
        step += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = client.join().unwrap().unwrap();
    stop_tx.send(()).unwrap();
    let samples = monitor.join().unwrap();
    let attempts = probe::parse(
        &String::from_utf8_lossy(&output.stdout),
        &String::from_utf8_lossy(&output.stderr),
    )
    .unwrap();

    assert!(attempts.len() > 500, "the client ran: {}", attempts.len());
    let failures: Vec<&Attempt> = attempts.iter().filter(|a| !a.ok).collect();
    assert!(
        failures.is_empty(),
        "{} connects failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let reached: BTreeMap<String, usize> = by_backend(&attempts);
    assert!(reached.len() > 2, "churned backends were used: {reached:?}");
    assert!(samples.len() > 100, "the monitor sampled the maps");
    let transitions = samples
        .windows(2)
        .filter(|w| w[0].present != w[1].present)
        .count();
    assert!(
        transitions >= 50,
        "the maps must have followed the churn, saw {transitions} changes of the backend set"
    );

    // A connect [start, end] reaching X is wrong if a sample read entirely before the start and
    // a sample read entirely after the end both lack X, no sample in between has X, and the two
    // samples are less than 30 ms apart: X was out of the maps for the whole connect (once
    // written, a backend stays in the maps for at least one 50 ms churn step).
    let mut violations = Vec::new();
    for a in &attempts {
        let Some(backend) = a.backend() else { continue };
        let Some(p) = samples.iter().rev().find(|s| s.t1 < a.start_us) else {
            continue;
        };
        let Some(q) = samples.iter().find(|s| s.t0 > a.end_us) else {
            continue;
        };
        let seen_between = samples
            .iter()
            .filter(|s| s.t1 >= p.t1 && s.t0 <= q.t0)
            .any(|s| s.present.contains(backend));
        if q.t0 - p.t1 < 30_000 && !seen_between {
            violations.push((a.i, backend.to_owned()));
        }
    }
    assert!(
        violations.is_empty(),
        "{} connects reached a backend already removed from the maps: {:?}",
        violations.len(),
        &violations[..violations.len().min(5)]
    );
    eprintln!(
        "churn: {} connects, {} map samples, {} file changes, {transitions} map changes, backends reached {reached:?}",
        attempts.len(),
        samples.len(),
        step
    );
}

/// One read of the churn frontend's backends from the maps.
struct Sample {
    t0: u64,
    t1: u64,
    present: BTreeSet<String>,
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// 9: a full map refuses the service that does not fit, with a clear error, and the services
/// already installed keep working. The refused service's VIP refuses connects (its wildcard
/// entry is written): it never passes through unrouted.
#[test]
fn a_full_map_refuses_one_service_and_keeps_the_others() {
    require_root!();
    let mut topo = Topology::new(&["a"]).unwrap();
    for h in 10..=14 {
        topo.start_backend("a", h, &["tcp:8080", "tcp:8081"])
            .unwrap();
    }
    let input = input_dir(&topo, "capacity");
    let mut agent = start_node(&topo, &input, &["--max-slots", "4"]);
    agent
        .wait_for("service a", SYNC_TIMEOUT, |i| {
            frontend(i, "241.0.0.60", 80, "TCP").is_some_and(|f| f.backends.len() == 2)
        })
        .unwrap();
    let deadline = Instant::now() + SYNC_TIMEOUT;
    while !agent.log_text().contains("free slots") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = agent.log_text();
    assert!(
        log.contains(
            "MCS_SLOTS has no run of 3 free slots for service demo/b (the longest is 2; 2 of 4 are free)"
        ),
        "{log}"
    );
    let a = topo
        .probe("tcp", "241.0.0.60:80", &["--count", "20"])
        .unwrap();
    assert!(all_ok(&a), "{a:?}");
    let i = inspect(&topo.pin_dir).unwrap();
    assert!(
        frontend(&i, "241.0.0.61", 80, "TCP").is_none(),
        "b's port was not written"
    );
    assert!(
        frontend(&i, "241.0.0.61", 0, "*").is_some(),
        "but its VIP's refusing wildcard was"
    );
    // b's VIP is known and refused at once; it is never dialled unrouted.
    let b = topo
        .probe("tcp", "241.0.0.61:80", &["--count", "3"])
        .unwrap();
    assert!(
        b.iter()
            .all(|a| !a.ok && a.errno == Some(libc::ECONNREFUSED)),
        "{b:?}"
    );
    assert!(agent.running(), "the agent keeps running");
}

/// Two agents never share a pin directory: the second one stops with a clear error (the first
/// holds the directory's lock), and the first keeps serving.
#[test]
fn a_second_agent_on_the_same_pin_directory_is_refused() {
    require_root!();
    let mut topo = Topology::new(&["a"]).unwrap();
    topo.start_backend("a", 10, &["tcp:8080", "udp:5353"])
        .unwrap();
    let _first = node_on(&topo, "refuse", 7);
    let mut second = start_node(&topo, &topo.dir.join("input"), &[]);
    let deadline = Instant::now() + SYNC_TIMEOUT;
    while second.running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!second.running(), "the second agent must stop");
    let log = second.log_text();
    assert!(log.contains("is in use by another agent"), "{log}");
    let ok = topo
        .probe("tcp", "241.0.0.10:80", &["--count", "5"])
        .unwrap();
    assert!(all_ok(&ok), "{ok:?}");
}

/// A pin directory that holds an older layout's counters map (v4's per-CPU array, left by an
/// older agent in a pin directory without the version in its path) is refused before any
/// program is attached, and the error says how to clear it.
#[test]
fn a_pinned_counters_map_of_an_older_layout_is_refused_before_attaching() {
    require_root!();
    let topo = Topology::new(&["a"]).unwrap();
    let maps = topo.pin_dir.join("maps");
    std::fs::create_dir_all(&maps).unwrap();
    let pin = maps.join(map_names::COUNTERS);
    tests::netns::sh(
        "bpftool",
        &[
            "map",
            "create",
            pin.to_str().unwrap(),
            "type",
            "percpu_array",
            "key",
            "4",
            "value",
            "24",
            "entries",
            "65537",
            "name",
            "MCS_COUNTERS",
        ],
    )
    .unwrap();
    let input = topo
        .write_fixture("input", "svc.yaml", &one_service("web", "241.0.0.10"))
        .unwrap();
    let mut agent = start_node(&topo, &input, &[]);
    let deadline = Instant::now() + SYNC_TIMEOUT;
    while agent.running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !agent.running(),
        "the agent must exit: {}",
        agent.log_text()
    );
    let log = agent.log_text();
    assert!(
        log.contains("pinned map MCS_COUNTERS") && log.contains("dataplane-agent uninstall"),
        "{log}"
    );
    assert!(
        topo.attached_programs().is_empty(),
        "attached: {:?}",
        topo.attached_programs()
    );
}

/// After a layout version bump the new agent detaches the links of older versions (which,
/// attached first, would keep translating from frozen maps) and removes their pins.
#[test]
fn an_upgrade_detaches_the_links_of_older_layout_versions() {
    require_root!();
    let mut topo = Topology::new(&["a"]).unwrap();
    topo.start_backend("a", 10, &["tcp:8080", "udp:5353"])
        .unwrap();
    let input = input_dir(&topo, "refuse");
    let input = input.to_str().unwrap();
    std::fs::create_dir_all(&topo.pin_dir).unwrap();
    let old_dir = topo.pin_dir.join("v1");
    let new_dir = topo
        .pin_dir
        .join(format!("v{}", dataplane_ebpf::PIN_VERSION));
    assert_ne!(old_dir, new_dir);
    let args = ["node", "--from-dir", input];
    let mut old = Agent::start_in(&topo, &old_dir, &args, &[]).unwrap();
    old.wait_for("the old layout's agent", SYNC_TIMEOUT, |i| {
        i.frontends.len() == 7
    })
    .unwrap();
    old.kill(libc::SIGKILL);
    assert_eq!(topo.attached_programs().get("connect4"), Some(&1));

    let mut new = Agent::start_in(&topo, &new_dir, &args, &[]).unwrap();
    new.wait_for("the new layout's agent", SYNC_TIMEOUT, |i| {
        i.frontends.len() == 7
    })
    .unwrap();
    // After its first full sync, which the maps show a moment before.
    new.wait_log("the old layout retired", SYNC_TIMEOUT, |log| {
        !old_dir.exists() && log.contains("detached the links of older layout versions")
    })
    .unwrap();
    let progs = topo.attached_programs();
    assert_eq!(progs.get("connect4"), Some(&1), "{progs:?}");
    assert_eq!(progs.values().sum::<usize>(), 9, "{progs:?}");
    let ok = topo
        .probe("tcp", "241.0.0.10:80", &["--count", "5"])
        .unwrap();
    assert!(all_ok(&ok), "{ok:?}");
}

/// A restarted agent adopts pinned links only when their programs use the pinned maps. With a
/// map pin removed (its map recreated), it attaches programs that use the new map, and traffic
/// follows what it writes.
#[test]
fn adoption_reattaches_when_a_map_pin_was_removed() {
    require_root!();
    let mut topo = Topology::new(&["a"]).unwrap();
    for h in [10, 20] {
        topo.start_backend("a", h, &["tcp:8080"]).unwrap();
    }
    let input = topo
        .write_fixture("input", "churn.yaml", &churn_yaml(&[10]))
        .unwrap();
    let one = |host: &'static str| {
        move |i: &dataplane_agent::bpf::inspect::Inspection| {
            frontend(i, "241.0.0.70", 80, "TCP")
                .is_some_and(|f| f.backends.len() == 1 && f.backends[0].ip == host)
        }
    };
    let mut first = start_node(&topo, &input, &[]);
    first
        .wait_for("the churn service", SYNC_TIMEOUT, one("10.99.1.10"))
        .unwrap();
    first.kill(libc::SIGKILL);
    // The frontend map: the programs read it on every connect (this frontend carries its one
    // backend, so they never read the slots).
    std::fs::remove_file(topo.pin_dir.join("maps").join("MCS_FE4")).unwrap();

    let mut second = start_node(&topo, &input, &[]);
    second
        .wait_for(
            "the restarted agent's sync",
            SYNC_TIMEOUT,
            one("10.99.1.10"),
        )
        .unwrap();
    let log = second.log_text();
    assert!(log.contains("attached the socket-LB programs"), "{log}");
    assert!(!log.contains("adopted the pinned programs"), "{log}");
    topo.write_fixture("input", "churn.yaml", &churn_yaml(&[20]))
        .unwrap();
    second
        .wait_for("the new backend", SYNC_TIMEOUT, one("10.99.1.20"))
        .unwrap();
    let after = topo
        .probe("tcp", "241.0.0.70:80", &["--count", "20"])
        .unwrap();
    assert!(all_ok(&after), "{after:?}");
    assert_eq!(
        by_backend(&after).into_keys().collect::<Vec<_>>(),
        ["a/10.99.1.20"],
        "the programs read the maps the agent writes"
    );
}
