//! Standalone mode end to end (root only): the agent merges a three-cluster directory
//! (`examples/clusterset`, copied) and routes it; real clients check which cluster answers
//! each port and family, and an edit to a fixture file reroutes traffic within 2 s.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tests::{
    agent::Agent,
    clusterset,
    netns::Topology,
    probe::{Attempt, by_cluster},
    require_root,
};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/clusterset");

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

fn answered(attempts: &[Attempt]) -> BTreeSet<String> {
    by_cluster(attempts).into_keys().collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The VIPs the merge gave `demo/<name>`, read from the report (IPv4 first).
fn vips(report: &Path, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(report).unwrap_or_default();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap_or_default();
    doc["serviceImports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|si| si["metadata"]["name"].as_str() == Some(name))
        .and_then(|si| si["spec"]["ips"].as_sequence().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn conflict_reason(report: &Path, cluster: &str, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(report).ok()?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).ok()?;
    doc["serviceExports"]
        .as_sequence()?
        .iter()
        .find(|e| e["cluster"].as_str() == Some(cluster) && e["name"].as_str() == Some(name))?
        ["conditions"]
        .as_sequence()?
        .iter()
        .find(|c| c["type"].as_str() == Some("Conflict"))
        .and_then(|c| c["reason"].as_str().map(str::to_owned))
}

#[test]
fn standalone_routes_each_port_and_family_and_follows_edits() {
    require_root!();
    let ids = clusterset::cluster_ids(Path::new(EXAMPLE)).unwrap();
    assert_eq!(ids, ["cluster-a", "cluster-b", "cluster-c"]);
    let mut topo = Topology::new(&["cluster-a", "cluster-b", "cluster-c"]).unwrap();
    let dir: PathBuf = topo.dir.join("clusterset");
    copy_dir(Path::new(EXAMPLE), &dir);
    clusterset::start_backends(&mut topo, &dir).unwrap();
    let report = topo.dir.join("report.yaml");
    let mut agent = Agent::start(
        &topo,
        &[
            "run",
            "--clusterset-dir",
            dir.to_str().unwrap(),
            "--cluster",
            "cluster-a",
            "--report",
            report.to_str().unwrap(),
        ],
    )
    .unwrap();
    // web: 3 ports x 2 families + 2 wildcards; dns: 1 + 1; api: 1 + 1.
    agent
        .wait_for("every frontend", Duration::from_secs(30), |i| {
            i.frontends.len() == 12
        })
        .unwrap();

    assert_eq!(
        conflict_reason(&report, "cluster-b", "web").as_deref(),
        Some("PortConflict,IPFamilyConflict")
    );
    assert_eq!(
        conflict_reason(&report, "cluster-c", "dns").as_deref(),
        Some("PortConflict")
    );
    assert_eq!(
        conflict_reason(&report, "cluster-a", "api").as_deref(),
        Some("NoConflicts")
    );
    let web = vips(&report, "web");
    assert_eq!(web.len(), 2, "web is dual-stack: {web:?}");
    let (v4, v6) = (web[0].clone(), format!("[{}]", web[1]));
    let dns = vips(&report, "dns")[0].clone();
    let api = vips(&report, "api")[0].clone();

    fn probe(topo: &Topology, mode: &str, addr: String) -> Vec<Attempt> {
        topo.probe(mode, &addr, &["--count", "30"]).unwrap()
    }
    // http is declared by all three; each family reaches only the clusters of that family.
    assert_eq!(
        answered(&probe(&topo, "tcp", format!("{v4}:80"))),
        set(&["cluster-a", "cluster-b"])
    );
    assert_eq!(
        answered(&probe(&topo, "tcp", format!("{v6}:80"))),
        set(&["cluster-a", "cluster-c"])
    );
    // metrics only in cluster-a, admin only in cluster-c (IPv6 only: refused on IPv4).
    assert_eq!(
        answered(&probe(&topo, "tcp", format!("{v4}:9100"))),
        set(&["cluster-a"])
    );
    assert_eq!(
        answered(&probe(&topo, "tcp", format!("{v6}:9100"))),
        set(&["cluster-a"])
    );
    assert_eq!(
        answered(&probe(&topo, "tcp", format!("{v6}:8443"))),
        set(&["cluster-c"])
    );
    assert_eq!(
        answered(&probe(&topo, "tcp", format!("{v4}:8443"))),
        set(&["error:111"])
    );
    // dns:5353 in cluster-c lost to the older dns:53: port 53 reaches a and b only.
    assert_eq!(
        answered(&probe(&topo, "udp", format!("{dns}:53"))),
        set(&["cluster-a", "cluster-b"])
    );
    assert_eq!(
        answered(&probe(&topo, "tcp", format!("{api}:9000"))),
        set(&["cluster-a", "cluster-b"])
    );

    // Edit cluster-b: it now declares metrics:9100 too, and its slice carries the port.
    let file = dir.join("cluster-b/services.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let edited = text
        .replacen(
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n",
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n  - {name: metrics, protocol: TCP, port: 9100, targetPort: 9100}\n",
            1,
        )
        .replacen(
            "- {name: http, protocol: TCP, port: 8080}\nendpoints:\n- addresses: [10.99.2.10]",
            "- {name: http, protocol: TCP, port: 8080}\n- {name: metrics, protocol: TCP, port: 9100}\nendpoints:\n- addresses: [10.99.2.10]",
            1,
        );
    assert_ne!(edited, text, "the edit applies to the example");
    // cluster-b's backends must listen on 9100 before the edit can be observed.
    for host in ["10.99.2.10", "10.99.2.11"] {
        topo.start_echo(
            "cluster-b",
            &format!("cluster-b/{host}"),
            &[format!("tcp:{host}:9100")],
        )
        .unwrap();
    }
    let tmp = dir.join("cluster-b/.services.yaml.tmp");
    std::fs::write(&tmp, edited).unwrap();
    let edited_at = Instant::now();
    std::fs::rename(&tmp, &file).unwrap();
    let mut rerouted = None;
    while edited_at.elapsed() < Duration::from_secs(2) {
        let seen = answered(&probe(&topo, "tcp", format!("{v4}:9100")));
        if seen == set(&["cluster-a", "cluster-b"]) {
            rerouted = Some(edited_at.elapsed());
            break;
        }
    }
    let rerouted = rerouted.unwrap_or_else(|| {
        panic!(
            "9100 was not rerouted to cluster-b within 2 s; agent log:\n{}",
            agent.log_text()
        )
    });
    eprintln!("rerouted after {rerouted:?}");
    // The IPv6 VIP still reaches cluster-a only: cluster-b has no IPv6.
    assert_eq!(
        answered(&probe(&topo, "tcp", format!("{v6}:9100"))),
        set(&["cluster-a"])
    );
}
