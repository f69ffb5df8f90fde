//! Standalone mode end to end (root only): the agent merges a three-cluster directory
//! (`examples/clusterset`, copied) and routes it; real clients check which cluster answers
//! each port and family, and an edit to a fixture file reroutes traffic within 2 s. A member
//! file of its own is followed through the maps and the report: edited, half written, removed.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use dataplane_agent::bpf::inspect::Inspection;
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

/// Starts `run --clusterset-dir dir` importing into cluster-a, writing `report`.
fn start_standalone(topo: &Topology, dir: &Path, report: &Path) -> Agent {
    Agent::start(
        topo,
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
    .unwrap()
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
    let mut agent = start_standalone(&topo, &dir, &report);
    // web: 3 ports x 2 families + 2 wildcards; dns: 1 + 1; api: 1 + 1.
    agent
        .wait_for("every frontend", Duration::from_secs(30), |i| {
            i.frontends.len() == 12
        })
        .unwrap();
    // The report is written after the maps.
    wait_for_report(&agent, "the first merge", || report.exists());

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

/// Each frontend of `inspection` (`namespace/name ip:port/protocol`) with its backends.
fn table(i: &Inspection) -> BTreeMap<String, Vec<String>> {
    i.frontends
        .iter()
        .map(|f| {
            (
                format!(
                    "{}/{} {}:{}/{}",
                    f.namespace, f.name, f.ip, f.port, f.protocol
                ),
                f.backends
                    .iter()
                    .map(|b| format!("{} {}:{}", b.cluster, b.ip, b.port))
                    .collect(),
            )
        })
        .collect()
}

/// The table without `demo/<name>`'s frontends.
fn others(table: &BTreeMap<String, Vec<String>>, name: &str) -> BTreeMap<String, Vec<String>> {
    let own = format!("demo/{name} ");
    table
        .iter()
        .filter(|(k, _)| !k.starts_with(&own))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The report's diagnostics that name `file`, as text.
fn diagnostics_of(report: &Path, file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(report).unwrap_or_default();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap_or_default();
    let file = file.display().to_string();
    doc["diagnostics"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|d| d["file"].as_str().is_some_and(|f| f.starts_with(&file)))
        .map(|d| format!("{:?}", d))
        .collect()
}

/// Waits (bounded) until `pred` holds for what the report says.
fn wait_for_report(agent: &Agent, what: &str, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if pred() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the report never showed {what}; agent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

const CACHE: &str = "\
apiVersion: v1
kind: Service
metadata: {name: cache, namespace: demo}
spec:
  ipFamilies: [IPv4]
  ports: [{name: redis, protocol: TCP, port: 6379, targetPort: 6379}]
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata: {name: cache, namespace: demo, creationTimestamp: \"2026-02-01T00:00:00Z\"}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: cache-ipv4
  namespace: demo
  labels: {kubernetes.io/service-name: cache}
addressType: IPv4
ports: [{name: redis, protocol: TCP, port: 6379}]
endpoints:
- addresses: [10.99.2.30]
";

/// Writes `text` to `path` through a temporary file in the same directory.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A member file of its own (`cluster-b/cache.yaml`, one service) followed through the maps
/// and the report: an edit changes that service's frontends only, a half-written version keeps
/// the last good one and is reported with its file, and removing the file withdraws the service.
#[test]
fn standalone_follows_one_member_file_keeps_a_half_written_one_and_withdraws_a_removed_one() {
    require_root!();
    let topo = Topology::new(&["cluster-a", "cluster-b", "cluster-c"]).unwrap();
    let dir: PathBuf = topo.dir.join("clusterset");
    copy_dir(Path::new(EXAMPLE), &dir);
    let cache = dir.join("cluster-b/cache.yaml");
    std::fs::write(&cache, CACHE).unwrap();
    let report = topo.dir.join("report.yaml");
    let mut agent = start_standalone(&topo, &dir, &report);
    let has_cache = |i: &Inspection| {
        i.frontends.iter().any(|f| {
            f.name == "cache" && f.port == 6379 && f.backends.iter().any(|b| b.ip == "10.99.2.30")
        })
    };
    // The example's 12 frontends, and cache's port and wildcard.
    let first = agent
        .wait_for("every frontend", Duration::from_secs(30), |i| {
            i.frontends.len() == 14 && has_cache(i)
        })
        .unwrap();
    let first = table(&first);

    // An edit to the file: cache's backend changes, every other frontend stays as it was.
    replace(&cache, &CACHE.replace("10.99.2.30", "10.99.2.31"));
    let edited = agent
        .wait_for("cache's new backend", Duration::from_secs(30), |i| {
            i.frontends.iter().any(|f| {
                f.name == "cache"
                    && f.port == 6379
                    && f.backends.iter().any(|b| b.ip == "10.99.2.31")
            })
        })
        .unwrap();
    let edited = table(&edited);
    assert_eq!(others(&edited, "cache"), others(&first, "cache"));
    assert_eq!(edited.len(), first.len());

    // Half written: the last good version stays in the maps, and the report names the file.
    let good = CACHE.replace("10.99.2.30", "10.99.2.31");
    replace(&cache, &format!("{}\n- [unclosed", &good[..good.len() / 2]));
    wait_for_report(&agent, "the half-written file's error", || {
        diagnostics_of(&report, &cache)
            .iter()
            .any(|d| d.contains("malformed YAML"))
    });
    assert_eq!(
        table(&tests::agent::inspect(&topo.pin_dir).unwrap()),
        edited
    );
    assert!(
        agent.log_text().contains("malformed YAML"),
        "the error is logged; agent log:\n{}",
        agent.log_text()
    );

    // Fixed again, then removed: the error goes, then cache's frontends are withdrawn and the
    // rest stays as it was.
    replace(&cache, &good);
    wait_for_report(&agent, "no error for the fixed file", || {
        diagnostics_of(&report, &cache).is_empty()
    });
    std::fs::remove_file(&cache).unwrap();
    let removed = agent
        .wait_for("cache withdrawn", Duration::from_secs(30), |i| {
            !i.frontends.iter().any(|f| f.name == "cache")
        })
        .unwrap();
    assert_eq!(table(&removed), others(&first, "cache"));
    wait_for_report(&agent, "cache's import gone", || {
        vips(&report, "cache").is_empty()
    });
    assert!(
        agent.running(),
        "the agent survived; log:\n{}",
        agent.log_text()
    );
}
