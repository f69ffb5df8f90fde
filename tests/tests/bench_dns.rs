//! The DNS benchmark compares like with like: our server (the agent) and NSD, started as the
//! benchmark starts them over the same synthetic imports, answer every name of the benchmark's
//! query file with the same response code and the same records. Small sizes, no timing (`cargo
//! xtask bench` times them).

use std::time::Duration;

use hickory_proto::{op::ResponseCode, rr::RecordType};
use tests::{
    bench::dns::{self, Nsd},
    dns::{Transport, query_blocking, wait_ready},
    netns::Topology,
    require_root,
};

#[test]
fn ours_and_nsd_answer_the_benchmark_queries_alike() {
    require_root!();
    let topo = Topology::new(&[]).unwrap();
    let imports = dns::records(40);
    let node_dir = topo.dir.join("node");
    std::fs::create_dir_all(&node_dir).unwrap();
    std::fs::write(node_dir.join("imports.yaml"), dns::node_yaml(&imports)).unwrap();
    let (mut agent, ours) = dns::start_agent(&topo, &node_dir, true).unwrap();
    agent
        .wait_for("the imports in the maps", Duration::from_secs(60), |i| {
            i.frontends.len() == 36 * 2 * 3
        })
        .unwrap();
    wait_ready(ours, "svc-0.bench.svc.clusterset.local.", 100).unwrap();
    let nsd = Nsd::start(&topo.dir.join("nsd"), &imports, 5).unwrap();

    let queries = dns::queries(&imports);
    assert!(queries.len() > 150, "{}", queries.len());
    let (mut found, mut missing) = (0, 0);
    for (name, rtype) in &queries {
        let rtype: RecordType = rtype.parse().unwrap();
        let a = query_blocking(ours, Transport::Udp, name, rtype).unwrap();
        let b = query_blocking(nsd.addr, Transport::Udp, name, rtype).unwrap();
        assert_eq!(
            (a.code, &a.answers, a.authoritative),
            (b.code, &b.answers, b.authoritative),
            "{name} {rtype}: ours {a:?}, NSD {b:?}"
        );
        // The SRV targets' addresses: NSD adds those of its zone, as we do.
        if rtype == RecordType::SRV {
            assert_eq!(a.additionals, b.additionals, "{name} SRV additionals");
        }
        match a.code {
            ResponseCode::NoError if !a.answers.is_empty() => found += 1,
            ResponseCode::NXDomain => missing += 1,
            other => panic!("{name} {rtype}: {other:?}"),
        }
    }
    // Both kinds of answer were compared, not only errors.
    assert!(
        found > 140 && missing >= 2,
        "{found} found, {missing} missing"
    );
}
