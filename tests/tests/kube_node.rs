//! The agent binary in Kubernetes mode (`run --config`) against fake API servers, with the
//! dataplane in network namespaces: its elected controller imports the exports of two member
//! clusters into the local one, its node role programs the maps from the imported slices, and
//! real connections to the ClusterSet IP reach the backends of exactly the exporting clusters.
//! Checked with `inspect --json` (the binary), with traffic, and on `/metrics` and `/readyz`.
//! Root only (see `tests::netns` for the isolation rules).

use std::{
    collections::BTreeSet,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::Path,
    time::{Duration, Instant},
};

use dataplane_core::{
    fixtures::{Port, endpoint, export, import, imported_slice, local_slice, service},
    model::{IpFamily, LABEL_MANAGED_BY, MANAGED_BY, ServiceExport, ServiceImport},
};
use serde_json::{Value, json};
use tests::{
    agent::Agent,
    fake_apiserver::FakeApiServer,
    netns::{Topology, agent_bin},
    probe::by_cluster,
    require_root,
};

const WAIT: Duration = Duration::from_secs(30);
const NS: &str = "demo";

fn seed(srv: &FakeApiServer, cluster: &str, created: &str, ips: &[String]) {
    srv.put(
        &service(NS, "web")
            .type_("ClusterIP")
            .families(&["IPv4"])
            .port(Port::new("http", "TCP", 80).target_port(8080))
            .build(),
    );
    srv.put(&export(NS, "web").created(created).build());
    put_slice(srv, cluster, ips);
}

/// `web`'s local slice in `cluster`: one ready endpoint per address.
fn put_slice(srv: &FakeApiServer, cluster: &str, ips: &[String]) {
    srv.put(
        &local_slice(NS, &format!("web-{cluster}"), "web")
            .endpoints(
                ips.iter()
                    .map(|ip| endpoint(ip).conditions((Some(true), None, None))),
            )
            .port(("http", "TCP", 8080))
            .build(),
    );
}

/// `dataplane-agent inspect --json`: (ip, port) -> backend "cluster/ip:port" set.
fn inspect_json(pin_dir: &Path) -> anyhow::Result<Vec<(String, u16, BTreeSet<String>)>> {
    let out = std::process::Command::new(agent_bin())
        .args(["inspect", "--json", "--pin-dir"])
        .arg(pin_dir)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["frontends"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|f| {
            let backends = f["backends"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|b| {
                    format!(
                        "{}/{}:{}",
                        b["cluster"].as_str().unwrap_or(""),
                        b["ip"].as_str().unwrap_or(""),
                        b["port"]
                    )
                })
                .collect();
            (
                f["ip"].as_str().unwrap_or("").to_owned(),
                f["port"].as_u64().unwrap_or(0) as u16,
                backends,
            )
        })
        .collect())
}

fn backends_of(
    rows: &[(String, u16, BTreeSet<String>)],
    ip: &str,
    port: u16,
) -> Option<BTreeSet<String>> {
    rows.iter()
        .find(|(i, p, _)| i == ip && *p == port)
        .map(|(_, _, b)| b.clone())
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Polls `inspect --json` until `pred` holds for the backends of ip:port.
fn wait_backends(
    agent: &mut Agent,
    ip: &str,
    port: u16,
    want: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let rows = inspect_json(&agent.pin_dir)?;
        if backends_of(&rows, ip, port).as_ref() == Some(want) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline && agent.running(),
            "timed out waiting for {ip}:{port} -> {want:?}; have {rows:?}; agent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A plain HTTP/1.1 GET on 127.0.0.1: (status code, body).
fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

fn wait_http(agent: &mut Agent, port: u16, path: &str, want: u16) -> anyhow::Result<String> {
    wait_http_until(agent, port, path, &format!("{path} = {want}"), |code, _| {
        code == want
    })
}

/// Gets `path` until `done(status, body)`; the body.
fn wait_http_until(
    agent: &mut Agent,
    port: u16,
    path: &str,
    what: &str,
    done: impl Fn(u16, &str) -> bool,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok((code, body)) = http_get(port, path)
            && done(code, &body)
        {
            return Ok(body);
        }
        anyhow::ensure!(
            Instant::now() < deadline && agent.running(),
            "timed out waiting for {what}; agent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The line of the translation counter of `vip`:`port` in a `/metrics` text.
fn translations_series<'m>(metrics: &'m str, vip: &str, port: u16) -> Option<&'m str> {
    metrics.lines().find(|l| {
        l.starts_with("mcs_frontend_translations_total{")
            && l.contains(&format!("ip=\"{vip}\""))
            && l.contains(&format!("port=\"{port}\""))
    })
}

/// The value at the end of a `/metrics` line.
fn value(series: &str) -> Option<u64> {
    series.rsplit(' ').next()?.parse().ok()
}

/// The value of the translation counter of `vip`:`port` in a `/metrics` text.
fn translations(metrics: &str, vip: &str, port: u16) -> Option<u64> {
    value(translations_series(metrics, vip, port)?)
}

/// `--metrics-address` and `--health-address` on two free ports of 127.0.0.1.
fn telemetry_args() -> (u16, u16, [String; 4]) {
    // Both bound at once, so they differ.
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let (a, b) = (bind(), bind());
    let port = |l: &std::net::TcpListener| l.local_addr().expect("addr").port();
    let (metrics, health) = (port(&a), port(&b));
    let args = [
        "--metrics-address".to_owned(),
        format!("127.0.0.1:{metrics}"),
        "--health-address".to_owned(),
        format!("127.0.0.1:{health}"),
    ];
    (metrics, health, args)
}

/// `run --config <config> --roles node` with the telemetry flags.
fn node_only_args(config: &Path, telemetry: &[String; 4]) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--config", config.to_str().expect("utf-8")]
        .into_iter()
        .chain(["--roles", "node"])
        .map(str::to_owned)
        .collect();
    args.extend(telemetry.iter().cloned());
    args
}

/// A ClusterSetIP import of `name` at `vip`, port http 80/TCP, as the controller writes it.
fn put_import(srv: &FakeApiServer, name: &str, vip: &str) {
    srv.put(
        &import(NS, name)
            .managed()
            .ips([vip])
            .families(&[IpFamily::IPv4])
            .port(("http", "TCP", 80))
            .build(),
    );
}

/// 7: the maps follow the imported slices through the API, and traffic follows the maps. A
/// restarted agent with its API server away keeps the maps until the initial lists are in.
#[test]
fn node_role_follows_imported_slices_from_the_api() {
    require_root!();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut topo = Topology::new(&["east", "west"]).expect("topology");
    for c in ["east", "west"] {
        topo.start_backend(c, 10, &["tcp:8080"]).expect("backend");
    }
    topo.start_backend("east", 11, &["tcp:8080"])
        .expect("backend");
    let (east_ip, east_ip2, west_ip) = (
        topo.cluster("east").v4(10).to_string(),
        topo.cluster("east").v4(11).to_string(),
        topo.cluster("west").v4(10).to_string(),
    );
    let east = rt.block_on(FakeApiServer::start()).expect("east");
    let west = rt.block_on(FakeApiServer::start()).expect("west");
    seed(
        &east,
        "east",
        "2026-01-01T00:00:00Z",
        std::slice::from_ref(&east_ip),
    );
    seed(
        &west,
        "west",
        "2026-01-02T00:00:00Z",
        std::slice::from_ref(&west_ip),
    );
    // The local cluster's id comes from its ClusterProperty.
    east.put(
        &json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
        "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": "east"}}),
    );
    rt.block_on(east.stop());

    let dir = topo.dir.join("kube");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("east.kubeconfig"), east.kubeconfig()).expect("write");
    std::fs::write(dir.join("west.kubeconfig"), west.kubeconfig()).expect("write");
    // The local member has no kubeconfig: in a pod that is the in-cluster config; here
    // KUBECONFIG points at east. West's kubeconfig path is relative to the config file.
    let leader =
        "leaderElection: {leaseDuration: 3s, renewGrace: 1s}\nmemberProbeInterval: 200ms\n";
    std::fs::write(
        dir.join("clusterset.yaml"),
        format!("members:\n- id: east\n- id: west\n  kubeconfig: west.kubeconfig\n{leader}"),
    )
    .expect("write");
    let (metrics_port, health_port, telemetry) = telemetry_args();
    let config = dir.join("clusterset.yaml");
    let east_kubeconfig = dir.join("east.kubeconfig");
    let args = [
        "run",
        "--config",
        config.to_str().expect("utf-8"),
        "--identity",
        "node-a",
        "--lease-namespace",
        "mcs-system",
        &telemetry[0],
        &telemetry[1],
        &telemetry[2],
        &telemetry[3],
        // The per-frontend counters are read below.
        "--frontend-metrics",
    ];
    let mut agent = Agent::start_with_env(
        &topo,
        &args,
        &[("KUBECONFIG", east_kubeconfig.to_str().expect("utf-8"))],
    )
    .expect("agent");

    // The local cluster's id comes from its ClusterProperty, and east's API server is away:
    // the agent waits for it, alive (the kubelet's probes see /healthz) but not ready.
    wait_http(&mut agent, health_port, "/healthz", 200).expect("alive while waiting");
    let (code, _) = http_get(health_port, "/readyz").expect("readyz");
    assert_eq!(code, 503, "ready before it knows its cluster");
    agent
        .wait_log("the ClusterProperty retries", WAIT, |log| {
            log.contains("cannot read the ClusterProperty")
        })
        .expect("waiting for the API server");
    rt.block_on(east.resume()).expect("east is back");

    // The elected controller writes the import; its ClusterSet IP is the frontend.
    rt.block_on(east.wait_until(WAIT, "the import has an IP", |s| {
        s.get::<ServiceImport>(NS, "web")
            .is_some_and(|si| !si.spec.ips.is_empty())
    }))
    .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", agent.log_text()));
    let vip = east
        .get::<ServiceImport>(NS, "web")
        .expect("import")
        .spec
        .ips[0]
        .clone();
    let both = set(&[
        &format!("east/{east_ip}:8080"),
        &format!("west/{west_ip}:8080"),
    ]);
    wait_backends(&mut agent, &vip, 80, &both).expect("both clusters in the maps");
    let hits = topo
        .probe("tcp", &format!("{vip}:80"), &["--count", "100"])
        .expect("probe");
    assert!(hits.iter().all(|a| a.ok), "{:?}", by_cluster(&hits));
    assert_eq!(
        by_cluster(&hits).into_keys().collect::<BTreeSet<_>>(),
        set(&["east", "west"]),
        "both exporting clusters serve"
    );
    wait_http(&mut agent, health_port, "/readyz", 200).expect("ready");
    // Each on its own listener: the probes' port has no metrics, the metrics port no probes.
    assert_eq!(http_get(health_port, "/metrics").expect("get").0, 404);
    assert_eq!(http_get(metrics_port, "/readyz").expect("get").0, 404);
    // The counters come from the agent's map snapshot, taken after the probes within a
    // refresh period.
    let metrics = wait_http_until(
        &mut agent,
        metrics_port,
        "/metrics",
        "100 translations in /metrics",
        |code, body| code == 200 && translations(body, &vip, 80).is_some_and(|n| n >= 100),
    )
    .expect("metrics");
    assert!(metrics.contains("mcs_leader 1"), "{metrics}");
    assert!(
        metrics.contains("mcs_map_sync_duration_seconds_count"),
        "{metrics}"
    );
    // Each series names its service, read from the name map by the frontend's id; that map
    // has one entry per frontend entry (the port and the VIP's wildcard).
    let series = translations_series(&metrics, &vip, 80).expect("a series of the VIP");
    assert!(
        series.contains(&format!("namespace=\"{NS}\",name=\"web\"")),
        "{series}"
    );
    let entries = |map: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("mcs_map_entries{{map=\"{map}\"}}")))
            .and_then(value)
    };
    assert_eq!(entries("MCS_FE_NAMES"), Some(2), "{metrics}");
    assert_eq!(entries("MCS_FE4"), Some(2), "{metrics}");

    // A new endpoint in east: the slice changes, the maps follow.
    put_slice(&east, "east", &[east_ip.clone(), east_ip2.clone()]);
    let three = set(&[
        &format!("east/{east_ip}:8080"),
        &format!("east/{east_ip2}:8080"),
        &format!("west/{west_ip}:8080"),
    ]);
    wait_backends(&mut agent, &vip, 80, &three).expect("three backends");

    // West unexports: its imported slice is deleted, its backend leaves the maps, and traffic
    // reaches only east.
    west.delete::<ServiceExport>(NS, "web");
    let east_only = set(&[
        &format!("east/{east_ip}:8080"),
        &format!("east/{east_ip2}:8080"),
    ]);
    wait_backends(&mut agent, &vip, 80, &east_only).expect("west withdrawn");
    let hits = topo
        .probe("tcp", &format!("{vip}:80"), &["--count", "50"])
        .expect("probe");
    assert!(hits.iter().all(|a| a.ok));
    assert_eq!(
        by_cluster(&hits).into_keys().collect::<BTreeSet<_>>(),
        set(&["east"])
    );

    // Restart with east's API server away: the maps stay as they are (nothing is pruned before
    // the initial lists), and traffic keeps flowing; when it is back, /readyz turns green.
    agent.kill(libc::SIGKILL);
    rt.block_on(east.stop());
    std::fs::write(
        dir.join("local.yaml"),
        format!(
            "localCluster: east\nmembers:\n- id: east\n  kubeconfig: east.kubeconfig\n- id: west\n  kubeconfig: west.kubeconfig\n{leader}"
        ),
    )
    .expect("write");
    let local_config = dir.join("local.yaml");
    let mut args2 = args;
    args2[2] = local_config.to_str().expect("utf-8");
    let mut agent = Agent::start(&topo, &args2).expect("agent again");
    let deadline = Instant::now() + WAIT;
    while !agent
        .log_text()
        .contains("waiting for the initial ServiceImports")
    {
        assert!(
            Instant::now() < deadline && agent.running(),
            "{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(http_get(health_port, "/readyz").expect("readyz").0, 503);
    let rows = inspect_json(&agent.pin_dir).expect("inspect");
    assert_eq!(
        backends_of(&rows, &vip, 80),
        Some(east_only.clone()),
        "not pruned"
    );
    let hits = topo
        .probe("tcp", &format!("{vip}:80"), &["--count", "20"])
        .expect("probe");
    assert!(
        hits.iter().all(|a| a.ok),
        "traffic flows while the API server is away"
    );
    rt.block_on(east.resume()).expect("resume");
    wait_http(&mut agent, health_port, "/readyz", 200).expect("ready again");
    wait_backends(&mut agent, &vip, 80, &east_only).expect("still east only");
}

/// An imported slice of `service` from `cluster`, as the controller would write it.
fn put_imported_slice(srv: &FakeApiServer, name: &str, service: &str, cluster: &str, ips: &[&str]) {
    srv.put(
        &imported_slice(NS, name, service, cluster)
            .annotation("unused", "x")
            .label(LABEL_MANAGED_BY, MANAGED_BY)
            .endpoints(ips.iter().map(|ip| {
                endpoint(ip)
                    .conditions((Some(true), None, None))
                    .node_name("n1")
            }))
            .port(("http", "TCP", 8080))
            .build(),
    );
}

/// `--roles node`: the node role alone routes ServiceImports and imported slices seeded
/// straight into the API server (no controller deletes them, no other member is contacted),
/// and follows edits event by event: a new endpoint, a slice moved to another service by its
/// label, a deleted slice, a deleted import.
#[test]
fn node_only_role_routes_seeded_imports() {
    require_root!();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let topo = Topology::new(&["east", "west"]).expect("topology");
    let api = rt.block_on(FakeApiServer::start()).expect("api");
    let (vip, vip2) = ("241.0.9.1", "241.0.9.2");
    for (name, ip) in [("web", vip), ("api", vip2)] {
        put_import(&api, name, ip);
    }
    put_imported_slice(&api, "web-east", "web", "east", &["10.9.0.1"]);
    put_imported_slice(&api, "web-west", "web", "west", &["10.9.1.1"]);

    let dir = topo.dir.join("kube-node");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("east.kubeconfig"), api.kubeconfig()).expect("write");
    // One file for every cluster: the local member's kubeconfig is not mounted on nodes, so
    // the agent uses its own credentials (here KUBECONFIG); west's kubeconfig does not exist
    // either, and a node-only agent must not read it.
    std::fs::write(
        dir.join("clusterset.yaml"),
        "localCluster: east\nmembers:\n- id: east\n  kubeconfig: members/east.kubeconfig\n- id: west\n  kubeconfig: missing.kubeconfig\n",
    )
    .expect("write");
    let east_kubeconfig = dir.join("east.kubeconfig");
    let config = dir.join("clusterset.yaml");
    let (metrics_port, health_port, telemetry) = telemetry_args();
    let args = node_only_args(&config, &telemetry);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // In a pod (KUBERNETES_SERVICE_HOST is set; the credentials then come from KUBECONFIG).
    let mut agent = Agent::start_with_env(
        &topo,
        &args,
        &[
            ("KUBECONFIG", east_kubeconfig.to_str().expect("utf-8")),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ],
    )
    .expect("agent");
    // Ready after the first sync.
    wait_http(&mut agent, health_port, "/readyz", 200).expect("ready");
    wait_backends(
        &mut agent,
        vip,
        80,
        &set(&["east/10.9.0.1:8080", "west/10.9.1.1:8080"]),
    )
    .expect("seeded slices routed");
    wait_backends(&mut agent, vip2, 80, &set(&[])).expect("api refuses");
    // Without --frontend-metrics: the maps' fill, no per-frontend series. The names are only
    // counted then, one per frontend entry as when they are read.
    let entries = |metrics: &str, map: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("mcs_map_entries{{map=\"{map}\"}}")))
            .and_then(value)
    };
    let metrics = wait_http_until(
        &mut agent,
        metrics_port,
        "/metrics",
        "both VIPs' frontends in mcs_map_entries",
        |code, body| code == 200 && entries(body, "MCS_FE4") == Some(4),
    )
    .expect("metrics");
    assert_eq!(entries(&metrics, "MCS_FE_NAMES"), Some(4), "{metrics}");
    assert_eq!(entries(&metrics, "MCS_COUNTERS"), Some(4), "{metrics}");
    assert!(!metrics.contains("mcs_frontend_"), "{metrics}");

    put_imported_slice(&api, "web-east", "web", "east", &["10.9.0.1", "10.9.0.2"]);
    wait_backends(
        &mut agent,
        vip,
        80,
        &set(&[
            "east/10.9.0.1:8080",
            "east/10.9.0.2:8080",
            "west/10.9.1.1:8080",
        ]),
    )
    .expect("a new endpoint");
    // West's slice moves to api by its label: it leaves web and joins api.
    put_imported_slice(&api, "web-west", "api", "west", &["10.9.1.1"]);
    wait_backends(&mut agent, vip2, 80, &set(&["west/10.9.1.1:8080"])).expect("moved in");
    wait_backends(
        &mut agent,
        vip,
        80,
        &set(&["east/10.9.0.1:8080", "east/10.9.0.2:8080"]),
    )
    .expect("moved out");
    assert!(
        api.delete_json("discovery.k8s.io/v1", "EndpointSlice", NS, "web-east")
            .is_some()
    );
    wait_backends(&mut agent, vip, 80, &set(&[])).expect("slice deleted");
    api.delete::<ServiceImport>(NS, "api");
    let deadline = Instant::now() + WAIT;
    while inspect_json(&agent.pin_dir)
        .expect("inspect")
        .iter()
        .any(|(ip, _, _)| ip == vip2)
    {
        assert!(Instant::now() < deadline, "{}", agent.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Nothing deleted the seeded objects (no controller ran).
    assert!(api.get::<ServiceImport>(NS, "web").is_some());
    // Only the local member was connected (west's kubeconfig does not even exist).
    assert!(
        agent.log_text().contains("members=1"),
        "{}",
        agent.log_text()
    );
}

/// An upgrade to a new map layout keeps VIP traffic flowing while the new agent waits for its
/// API server: the older layout's programs (attached first) keep translating from the maps it
/// left until the new agent's first full sync, and only then are they detached and their pins
/// removed.
#[test]
fn an_upgrade_keeps_the_older_layout_translating_until_the_first_sync() {
    require_root!();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut topo = Topology::new(&["a"]).expect("topology");
    topo.start_backend("a", 10, &["tcp:8080"]).expect("backend");
    let vip = "241.0.0.10";
    let input = topo
        .write_fixture(
            "input",
            "web.yaml",
            &tests::agent::one_service_yaml("web", vip, &[10]),
        )
        .expect("input");
    std::fs::create_dir_all(&topo.pin_dir).expect("pin dir");
    let old_dir = topo.pin_dir.join("v1");
    let new_dir = topo
        .pin_dir
        .join(format!("v{}", dataplane_ebpf::PIN_VERSION));
    let mut old = Agent::start_in(
        &topo,
        &old_dir,
        &["node", "--from-dir", input.to_str().expect("utf-8")],
        &[],
    )
    .expect("old agent");
    old.wait_for("the old layout's agent", WAIT, |i| !i.frontends.is_empty())
        .expect("old layout synced");
    old.kill(libc::SIGKILL);

    // The new agent's API server is away: it attaches its programs and waits for its lists.
    let api = rt.block_on(FakeApiServer::start()).expect("api");
    put_import(&api, "web", vip);
    put_imported_slice(&api, "web-a", "web", "a", &["10.99.1.10"]);
    rt.block_on(api.stop());
    let dir = topo.dir.join("kube-upgrade");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("a.kubeconfig"), api.kubeconfig()).expect("write");
    std::fs::write(
        dir.join("clusterset.yaml"),
        "localCluster: a\nmembers:\n- id: a\n  kubeconfig: a.kubeconfig\n",
    )
    .expect("write");
    let config = dir.join("clusterset.yaml");
    let (_, _, telemetry) = telemetry_args();
    let args = node_only_args(&config, &telemetry);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut new = Agent::start_in(&topo, &new_dir, &args, &[]).expect("new agent");
    new.wait_log("the programs", WAIT, |log| log.contains("dataplane ready"))
        .expect("attached");
    let probe = |what: &str, log: String| {
        let attempts = topo
            .probe("tcp", &format!("{vip}:80"), &["--count", "5"])
            .expect("probe");
        assert!(attempts.iter().all(|a| a.ok), "{what}: {attempts:?}\n{log}");
    };
    probe(
        "while the new agent waits for its API server",
        new.log_text(),
    );
    assert!(
        old_dir.exists(),
        "the old layout's pins are kept until the first sync"
    );
    assert!(!new.log_text().contains("older layout versions"));

    rt.block_on(api.resume()).expect("api is back");
    new.wait_log("the old layout retired", WAIT, |log| {
        !old_dir.exists() && log.contains("detached the links of older layout versions")
    })
    .expect("retired after the first sync");
    let progs = topo.attached_programs();
    assert_eq!(progs.get("connect4"), Some(&1), "{progs:?}");
    probe("after the new agent's first sync", new.log_text());
}
