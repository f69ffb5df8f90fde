//! Map writes the kernel refuses: the node role tries them again on its own, without waiting
//! for a change to the inputs. Root only (see `tests::netns` for the isolation rules).

use std::time::{Duration, Instant};

use aya::maps::{HashMap, Map, MapData};
use dataplane_ebpf::{Frontend, FrontendKey4, map_names};
use tests::{
    agent::{Agent, frontend, inspect, one_service_yaml},
    netns::Topology,
    probe::by_backend,
    require_root,
};

const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// A key of the reserved range 240.0.0.0/4, which no fixture uses, for entries that only take
/// room in the map.
fn filler(i: u16) -> FrontendKey4 {
    FrontendKey4 {
        addr: u32::from(std::net::Ipv4Addr::new(240, 255, (i >> 8) as u8, i as u8)).to_be(),
        port: 9u16.to_be(),
        proto: libc::IPPROTO_TCP as u8,
        _pad: 0,
    }
}

/// The kernel refuses a service's write (here: `MCS_FE4` filled behind the agent's back, as an
/// ENOMEM would): the agent logs the failure, keeps writing other services' changes without
/// trying it again with each, and, once the kernel has room again, writes the service on its
/// own retry schedule, with no change to its inputs, and the VIP then reaches the service's
/// backends.
#[test]
fn a_write_the_kernel_refused_is_retried_without_a_change() {
    require_root!();
    let mut topo = Topology::new(&["a"]).unwrap();
    for h in 10..=12 {
        topo.start_backend("a", h, &["tcp:8080"]).unwrap();
    }
    topo.write_fixture(
        "input",
        "a.yaml",
        &one_service_yaml("a", "241.0.0.70", &[10]),
    )
    .unwrap();
    let input = topo.dir.join("input");
    let mut agent = Agent::start(
        &topo,
        &[
            "node",
            "--from-dir",
            input.to_str().unwrap(),
            "--max-frontends",
            "8",
        ],
    )
    .unwrap();
    agent
        .wait_for("service a", SYNC_TIMEOUT, |i| {
            frontend(i, "241.0.0.70", 80, "TCP").is_some()
        })
        .unwrap();

    // Fill the rest of the map from outside the agent, so the kernel refuses its next insert.
    let pin = topo.pin_dir.join("maps").join(map_names::FRONTENDS4);
    let mut map: HashMap<MapData, FrontendKey4, Frontend> =
        HashMap::try_from(Map::HashMap(MapData::from_pin(&pin).unwrap())).unwrap();
    let mut fillers = Vec::new();
    for i in 0..64u16 {
        if map.insert(filler(i), Frontend::default(), 0).is_err() {
            break;
        }
        fillers.push(filler(i));
    }
    assert!(
        !fillers.is_empty() && fillers.len() < 64,
        "{}",
        fillers.len()
    );

    topo.write_fixture(
        "input",
        "b.yaml",
        &one_service_yaml("b", "241.0.0.71", &[11, 12]),
    )
    .unwrap();
    let deadline = Instant::now() + SYNC_TIMEOUT;
    while !agent.log_text().contains("demo/b") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = agent.log_text();
    assert!(log.contains("failed=1"), "{log}");
    let i = inspect(&topo.pin_dir).unwrap();
    assert!(frontend(&i, "241.0.0.71", 80, "TCP").is_none(), "{i:?}");

    // Changes to another service are written at once, without trying b again each time: b
    // waits for its own retry schedule (its first retry is due 1 s after the failure).
    let passes = |log: &str| log.matches("maps synced").count();
    for round in 0..5u8 {
        let before = passes(&agent.log_text());
        topo.write_fixture(
            "input",
            "a.yaml",
            &one_service_yaml("a", "241.0.0.70", &[10, 11 + round % 2]),
        )
        .unwrap();
        let deadline = Instant::now() + SYNC_TIMEOUT;
        while passes(&agent.log_text()) == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let log = agent.log_text();
    assert!(
        log.matches("failed=1").count() <= 2,
        "b retried with every change to a: {log}"
    );
    topo.write_fixture(
        "input",
        "a.yaml",
        &one_service_yaml("a", "241.0.0.70", &[10]),
    )
    .unwrap();

    // The kernel has room again; the inputs do not change.
    for key in &fillers {
        map.remove(key).unwrap();
    }
    agent
        .wait_for("service b, retried", SYNC_TIMEOUT, |i| {
            frontend(i, "241.0.0.71", 80, "TCP").is_some_and(|f| f.backends.len() == 2)
        })
        .unwrap();
    let b = topo
        .probe("tcp", "241.0.0.71:80", &["--count", "10"])
        .unwrap();
    assert!(b.iter().all(|a| a.ok), "{b:?}");
    let backends = by_backend(&b);
    assert!(
        backends
            .keys()
            .all(|k| k == "a/10.99.1.11" || k == "a/10.99.1.12"),
        "{backends:?}"
    );
    let a = topo
        .probe("tcp", "241.0.0.70:80", &["--count", "5"])
        .unwrap();
    assert!(a.iter().all(|a| a.ok), "{a:?}");
    assert!(agent.running());
}
