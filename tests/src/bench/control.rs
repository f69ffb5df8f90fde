//! The control-plane half of `cargo xtask bench`: merge and lb build, map syncs into real
//! (pinned, kernel) maps, the latency from one imported EndpointSlice change in an API server
//! to the map write, and the agent's memory (the controller role's in `controller.rs`).
//!
//! Kernel maps are created by the agent's own loader and attached to a child cgroup that no
//! process joins; everything is removed afterwards (the [`Topology`] guard).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use dataplane_agent::bpf::{
    desired::FeAddr,
    kernel::KernelMaps,
    loader::{self, LoaderConfig},
    sync::MapSync,
};
use dataplane_core::{
    fixtures::synthetic::{self, Shape},
    lb::{self, FrontendAddr, LbTable, Protocol},
    merge::{self, ClusterSetConfig, MergeOutput, MergeState},
    model::{EndpointSlice, LABEL_APP_MANAGED_BY, MANAGED_BY, NamespacedName},
};
use serde::Serialize;

use super::{
    controller::{ControllerRun, controller_run},
    stats::{Summary, median, summarize},
};
use crate::{agent::Agent, fake_apiserver::FakeApiServer, netns::Topology};

/// What to measure.
#[derive(Clone, Debug)]
pub struct ControlOptions {
    /// Merge, full sync, event-to-map and the first RSS figure use this shape.
    pub shape: Shape,
    /// Timed repetitions of the merge and lb build.
    pub merge_runs: usize,
    /// Installed service counts for the one-change map sync (datapath service shape).
    pub change_services: Vec<usize>,
    /// Changes timed per installed service count.
    pub change_samples: usize,
    /// EndpointSlice changes timed through the API server (0 skips the agent runs).
    pub event_changes: usize,
    /// Shapes whose agent RSS is measured (the first is `shape` itself, from the event run).
    pub rss_shapes: Vec<Shape>,
    /// Member EndpointSlice changes timed through a controller-role agent (0 skips it).
    pub controller_changes: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct MergeTiming {
    pub shape: Shape,
    pub runs: usize,
    /// Median over the runs, merge and lb build together, and each part.
    pub total_ms: f64,
    pub merge_ms: f64,
    pub lb_ms: f64,
    pub frontends: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct FullSync {
    pub shape: Shape,
    pub frontends: usize,
    pub backends: usize,
    pub slots: u64,
    pub writes: usize,
    pub ms: f64,
}

/// One service changed while `services` are installed: `MapSync::sync_table_services` into the
/// kernel maps, timed in-process.
#[derive(Clone, Debug, Serialize)]
pub struct MapChange {
    pub services: usize,
    pub shape: Shape,
    pub latency: Summary,
}

#[derive(Clone, Debug, Serialize)]
pub struct EventToMap {
    pub shape: Shape,
    /// From the write into the fake API server to the frontend's new entry in the map.
    pub latency: Summary,
    pub timeouts: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Rss {
    pub shape: Shape,
    /// Resident memory after the maps are in sync, and the peak.
    pub rss_mib: f64,
    pub peak_mib: f64,
    pub startup_secs: f64,
}

/// The [`FilesRss::mode`] of `node --from-dir`.
const NODE_FROM_DIR: &str = "node --from-dir";
/// The [`FilesRss::mode`] of standalone `run --clusterset-dir`.
pub const STANDALONE: &str = "run --clusterset-dir";

/// An agent fed from files: `node --from-dir` over the merge's imports and imported slices,
/// or standalone `run --clusterset-dir` over the members' manifests.
#[derive(Clone, Debug, Serialize)]
pub struct FilesRss {
    /// `node --from-dir` or `run --clusterset-dir`.
    pub mode: &'static str,
    #[serde(flatten)]
    pub rss: Rss,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ControlReport {
    pub merge: Option<MergeTiming>,
    pub full_sync: Option<FullSync>,
    pub map_change: Vec<MapChange>,
    /// At the control shape, then at each further RSS shape.
    pub event_to_map: Vec<EventToMap>,
    pub rss: Vec<Rss>,
    pub files: Vec<FilesRss>,
    pub controller: Option<ControllerRun>,
}

/// Only the agents fed from files (`mcs-bench --only files`).
pub fn run_files(opts: &ControlOptions) -> anyhow::Result<ControlReport> {
    eprintln!("bench: agents fed from files, {}", opts.shape);
    Ok(ControlReport {
        files: files_rss(opts.shape, &plan_for(opts.shape))?,
        ..ControlReport::default()
    })
}

/// Only the node role on the API server, at the control-plane shape (`mcs-bench --only node`):
/// its memory, time to sync and event-to-map latency.
pub fn run_node(opts: &ControlOptions) -> anyhow::Result<ControlReport> {
    eprintln!(
        "bench: node role on the API, {} EndpointSlice changes, {}",
        opts.event_changes, opts.shape
    );
    let (event, rss) = event_to_map(opts.shape, &plan_for(opts.shape), opts.event_changes)?;
    Ok(ControlReport {
        event_to_map: vec![event],
        rss: vec![rss],
        ..ControlReport::default()
    })
}

/// Only the full merge and lb build (`mcs-bench --only merge`).
pub fn run_merge(opts: &ControlOptions) -> anyhow::Result<ControlReport> {
    eprintln!("bench: merge + lb build, {}", opts.shape);
    Ok(ControlReport {
        merge: Some(merge_and_build(opts.shape, opts.merge_runs).0),
        ..ControlReport::default()
    })
}

/// Only the controller role (`mcs-bench --only controller`).
pub fn run_controller(opts: &ControlOptions) -> anyhow::Result<ControlReport> {
    eprintln!(
        "bench: controller role, {} member EndpointSlice changes, {}",
        opts.controller_changes, opts.shape
    );
    Ok(ControlReport {
        controller: Some(controller_run(
            opts.shape,
            &plan_for(opts.shape),
            opts.controller_changes,
        )?),
        ..ControlReport::default()
    })
}

/// Runs every control-plane measurement.
pub fn run(opts: &ControlOptions) -> anyhow::Result<ControlReport> {
    let mut report = ControlReport::default();
    eprintln!("bench: merge + lb build, {}", opts.shape);
    let (timing, plan, table) = merge_and_build(opts.shape, opts.merge_runs);
    report.merge = Some(timing);

    eprintln!("bench: full map sync, {}", opts.shape);
    report.full_sync = Some(full_sync(opts.shape, &table)?);
    drop(table);

    for &services in &opts.change_services {
        eprintln!("bench: one-service map change with {services} services installed");
        report
            .map_change
            .push(map_change(services, opts.change_samples)?);
    }

    if opts.event_changes > 0 {
        eprintln!(
            "bench: event to map, {} EndpointSlice changes, {}",
            opts.event_changes, opts.shape
        );
        let (event, rss) = event_to_map(opts.shape, &plan, opts.event_changes)?;
        report.event_to_map.push(event);
        report.rss.push(rss);
        eprintln!("bench: agents fed from files, {}", opts.shape);
        report.files = files_rss(opts.shape, &plan)?;
        if opts.controller_changes > 0 {
            eprintln!(
                "bench: controller role, {} member EndpointSlice changes, {}",
                opts.controller_changes, opts.shape
            );
            report.controller = Some(controller_run(opts.shape, &plan, opts.controller_changes)?);
        }
        drop(plan);
        for &shape in opts.rss_shapes.iter().filter(|s| **s != opts.shape) {
            eprintln!("bench: agent memory, {shape}");
            let plan = plan_for(shape);
            let (event, rss) = event_to_map(shape, &plan, opts.event_changes)?;
            report.event_to_map.push(event);
            report.rss.push(rss);
        }
    }
    Ok(report)
}

pub(crate) fn importing() -> dataplane_core::model::ClusterId {
    synthetic::cluster_id(0)
}

fn plan_for(shape: Shape) -> MergeOutput {
    let snapshots = synthetic::member_snapshots(shape);
    merge::merge(&snapshots, &ClusterSetConfig::default(), &importing(), &[])
}

/// Times `runs` full merges and lb builds as a daemon does them: the merge state loads every
/// member's records, and the lb table is built from the records it shares with the node
/// (the copy of everything into a [`MergeOutput`], which only `plan` and the report make, is
/// left out). Returns the last plan and table too.
fn merge_and_build(shape: Shape, runs: usize) -> (MergeTiming, MergeOutput, LbTable) {
    let snapshots = synthetic::member_snapshots(shape);
    let config = ClusterSetConfig::default();
    let (mut merges, mut builds, mut totals) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..runs.max(1) {
        // The previous result is freed outside the timing, as a daemon frees it between runs.
        drop(last.take());
        let started = Instant::now();
        let mut state = MergeState::new(config.clone(), importing());
        state.load(&snapshots, &[]);
        let merged = started.elapsed();
        let (imports, slices) = state.node_inputs();
        let table = lb::build_shared(imports, slices);
        let total = started.elapsed();
        merges.push(ms(merged));
        builds.push(ms(total - merged));
        totals.push(ms(total));
        last = Some((state, table));
    }
    let (state, table) = last.expect("at least one run");
    let plan = state.output();
    let timing = MergeTiming {
        shape,
        runs: totals.len(),
        total_ms: median(&mut totals),
        merge_ms: median(&mut merges),
        lb_ms: median(&mut builds),
        frontends: table.frontends.len(),
    };
    (timing, plan, table)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Map capacities for a table: frontends (ports and per-VIP wildcards) with room to spare, and
/// slots twice over and more (make-before-break writes the new range first).
fn loader_for(topo: &Topology, frontends: usize, backends: usize) -> LoaderConfig {
    let mut cfg = LoaderConfig::new(topo.pin_dir.clone(), topo.cgroup.clone());
    cfg.max_frontends = (frontends * 2).next_power_of_two().max(1024) as u32;
    cfg.max_slots = (backends * 4).next_power_of_two().max(4096) as u32;
    cfg.bpf_log_level = 0;
    cfg
}

/// Writes the whole table into empty kernel maps.
fn full_sync(shape: Shape, table: &LbTable) -> anyhow::Result<FullSync> {
    let topo = Topology::new(&[])?;
    let cfg = loader_for(&topo, table.frontends.len(), table.backend_count());
    let mut dataplane = loader::install(&cfg)?;
    let mut sync = MapSync::new(dataplane.maps.capacities());
    let started = Instant::now();
    let report = sync.sync_table(table, &mut dataplane.maps);
    let elapsed = started.elapsed();
    if !report.failed.is_empty() {
        bail!("the full sync refused services: {:?}", report.failed);
    }
    Ok(FullSync {
        shape,
        frontends: sync.frontend_count(),
        backends: table.backend_count(),
        slots: sync.slot_count(),
        writes: report.writes,
        ms: ms(elapsed),
    })
}

/// The datapath benchmark's service shape: one port, 2 clusters x 2 endpoints.
pub fn datapath_shape(services: usize) -> Shape {
    Shape {
        services,
        clusters: 2,
        endpoints: 2,
        ports: 1,
    }
}

/// With `services` installed, replaces one endpoint of a random service `samples` times and
/// times each `sync_table_services` into the kernel maps.
fn map_change(services: usize, samples: usize) -> anyhow::Result<MapChange> {
    let shape = datapath_shape(services);
    let plan = plan_for(shape);
    let mut table = lb::build_records(&plan.service_imports, &plan.endpoint_slices);
    drop(plan);
    let topo = Topology::new(&[])?;
    let cfg = loader_for(&topo, table.frontends.len(), table.backend_count());
    let mut dataplane = loader::install(&cfg)?;
    let mut sync = MapSync::new(dataplane.maps.capacities());
    let first = sync.sync_table(&table, &mut dataplane.maps);
    if !first.failed.is_empty() {
        bail!("installing {services} services failed: {:?}", first.failed);
    }
    let addrs: Vec<FrontendAddr> = table.frontends.keys().copied().collect();
    let mut rng = fastrand::Rng::with_seed(services as u64);
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let addr = addrs[rng.usize(..addrs.len())];
        let frontend = table.frontends.get_mut(&addr).expect("listed frontend");
        // Another pod replaces the first endpoint: a new backend, one removed.
        frontend.backends[0].ip = fresh_ip(i);
        frontend.backends.sort();
        let service = frontend.service.clone();
        let started = Instant::now();
        let only = BTreeSet::from([service]);
        let report = sync.sync_table_services(&table, &only, &mut dataplane.maps);
        latencies.push(started.elapsed());
        if report.changed.len() != 1 || !report.failed.is_empty() {
            bail!("a one-service change wrote {report:?}");
        }
    }
    Ok(MapChange {
        services,
        shape,
        latency: summarize(&mut latencies),
    })
}

/// An address no synthetic endpoint has (100.64.0.0/10).
pub(crate) fn fresh_ip(i: usize) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::new(
        100,
        64 + ((i >> 16) & 63) as u8,
        (i >> 8) as u8,
        i as u8,
    ))
}

/// Reads `VmRSS` and `VmHWM` (MiB) of a process.
pub(crate) fn memory_of(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kib: f64 = line
            .split_whitespace()
            .nth(1)
            .context("malformed status line")?
            .parse()?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The first port's frontend of each service, by service.
fn first_frontends(plan: &MergeOutput) -> BTreeMap<NamespacedName, FeAddr> {
    let mut out = BTreeMap::new();
    for import in &plan.service_imports {
        let (Some(&ip), Some(port)) = (import.ips.first(), import.ports.first()) else {
            continue;
        };
        out.insert(
            import.service.clone(),
            FeAddr::Port(FrontendAddr {
                ip,
                port: port.port as u16,
                protocol: Protocol::Tcp,
            }),
        );
    }
    out
}

/// The agent's map capacities for `plan` (see [`loader_for`]), with the eBPF log off.
fn capacity_args(topo: &Topology, plan: &MergeOutput) -> Vec<String> {
    let table = lb::build_records(&plan.service_imports, &plan.endpoint_slices);
    let caps = loader_for(topo, table.frontends.len(), table.backend_count());
    [
        ("--max-frontends", caps.max_frontends),
        ("--max-slots", caps.max_slots),
        ("--bpf-log-level", 0),
    ]
    .into_iter()
    .flat_map(|(flag, v)| [flag.to_owned(), v.to_string()])
    .collect()
}

/// Objects as one YAML stream, one document each.
fn yaml_stream<T: Serialize>(objects: impl IntoIterator<Item = T>) -> anyhow::Result<String> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&o)?);
    }
    Ok(out)
}

/// Runs the agent with `args` (and the map capacities for `plan`) until the maps hold every
/// service's first frontend; its memory and time to that point.
fn file_agent(
    shape: Shape,
    plan: &MergeOutput,
    topo: &Topology,
    args: &[&str],
) -> anyhow::Result<Rss> {
    let caps = capacity_args(topo, plan);
    let mut args = args.to_vec();
    args.extend(caps.iter().map(String::as_str));
    let frontends = first_frontends(plan);
    let last = *frontends.values().last().context("no services")?;
    let started = Instant::now();
    let mut agent = Agent::start_with_env(topo, &args, &[("RUST_LOG", "warn")])?;
    let maps = wait_for_maps(&mut agent, &topo.pin_dir, &last, Duration::from_secs(600))?;
    let startup_secs = started.elapsed().as_secs_f64();
    for fe in frontends.values() {
        if maps.frontend(&fe.key())?.is_none() {
            bail!("{fe:?} is missing once the last service is in the maps");
        }
    }
    // Let the startup garbage settle before reading memory.
    std::thread::sleep(Duration::from_secs(2));
    let (rss_mib, peak_mib) = memory_of(agent.pid().context("agent exited")?)?;
    Ok(Rss {
        shape,
        rss_mib,
        peak_mib,
        startup_secs,
    })
}

/// `node --from-dir` over the plan's imports and imported slices (one file), and standalone
/// `run --clusterset-dir` over the members' manifests (one file per cluster).
fn files_rss(shape: Shape, plan: &MergeOutput) -> anyhow::Result<Vec<FilesRss>> {
    let mut out = Vec::new();
    {
        let topo = Topology::new(&[])?;
        let dir = topo.dir.join("node");
        std::fs::create_dir_all(&dir)?;
        let imports = yaml_stream(plan.service_imports.iter().map(|i| i.to_k8s()))?;
        let slices = yaml_stream(plan.endpoint_slices.iter().map(|s| s.to_k8s()))?;
        std::fs::write(dir.join("imports.yaml"), imports + &slices)?;
        let rss = file_agent(shape, plan, &topo, &["node", "--from-dir", path_str(&dir)?])?;
        out.push(FilesRss {
            mode: NODE_FROM_DIR,
            rss,
        });
    }
    let topo = Topology::new(&[])?;
    let dir = topo.dir.join("clusterset");
    for c in 0..shape.clusters {
        let member = dir.join(synthetic::cluster_id(c).as_str());
        std::fs::create_dir_all(&member)?;
        let objects = synthetic::member_objects(shape, c);
        let text = yaml_stream(&objects.services)?
            + &yaml_stream(&objects.service_exports)?
            + &yaml_stream(&objects.endpoint_slices)?;
        std::fs::write(member.join("services.yaml"), text)?;
    }
    let cluster = importing();
    let rss = file_agent(
        shape,
        plan,
        &topo,
        &[
            "run",
            "--clusterset-dir",
            path_str(&dir)?,
            "--cluster",
            cluster.as_str(),
        ],
    )?;
    out.push(FilesRss {
        mode: STANDALONE,
        rss,
    });
    Ok(out)
}

/// Seeds a fake API server with the plan's ServiceImports and imported EndpointSlices, runs
/// a node-role agent against it until its maps hold every service, reads its memory, then
/// times `changes` EndpointSlice edits from the API write to the map write.
fn event_to_map(
    shape: Shape,
    plan: &MergeOutput,
    changes: usize,
) -> anyhow::Result<(EventToMap, Rss)> {
    let topo = Topology::new(&[])?;
    let rt = tokio::runtime::Runtime::new()?;
    let server = rt.block_on(FakeApiServer::start())?;
    for import in &plan.service_imports {
        let mut import = import.to_k8s();
        // As the controller writes it: the node routes only imports with our label.
        import
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_APP_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
        server.put(&import);
    }
    for slice in &plan.endpoint_slices {
        server.put(&slice.to_k8s());
    }
    let kubeconfig_path = topo.dir.join("kubeconfig");
    std::fs::write(&kubeconfig_path, server.kubeconfig())?;
    let config = topo.dir.join("clusterset.yaml");
    std::fs::write(
        &config,
        format!(
            "localCluster: {}\nmembers:\n- id: {}\n",
            importing(),
            importing()
        ),
    )?;
    let caps = capacity_args(&topo, plan);
    let started = Instant::now();
    let mut agent = start_on_api(&topo, &config, "node", &kubeconfig_path, &caps)?;
    let frontends = first_frontends(plan);
    let last = *frontends.values().last().context("no services")?;
    let maps = wait_for_maps(&mut agent, &topo.pin_dir, &last, Duration::from_secs(600))?;
    let startup_secs = started.elapsed().as_secs_f64();
    // Let the startup garbage settle before reading memory.
    std::thread::sleep(Duration::from_secs(2));
    let pid = agent.pid().context("agent exited")?;
    let (rss_mib, peak_mib) = memory_of(pid)?;
    let rss = Rss {
        shape,
        rss_mib,
        peak_mib,
        startup_secs,
    };

    // Imported slices by (service, source cluster); each change edits one of them.
    let mut slices: Vec<(NamespacedName, EndpointSlice)> = plan
        .endpoint_slices
        .iter()
        .map(|s| (s.service.clone(), s.to_k8s()))
        .collect();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut latencies = Vec::with_capacity(changes);
    let mut timeouts = 0;
    for i in 0..changes {
        let pick = rng.usize(..slices.len());
        let (service, slice) = &mut slices[pick];
        let key = frontends
            .get(service)
            .context("slice of an unknown service")?
            .key();
        let before = maps.frontend(&key)?;
        let endpoint = slice.endpoints.first_mut().context("empty slice")?;
        endpoint.addresses = vec![fresh_ip(i).to_string()];
        let t0 = Instant::now();
        server.put(&*slice);
        let deadline = t0 + Duration::from_secs(5);
        loop {
            if maps.frontend(&key)? != before {
                latencies.push(t0.elapsed());
                break;
            }
            if Instant::now() > deadline {
                timeouts += 1;
                break;
            }
            // Polls cost a syscall; a short pause leaves the cores to the agent.
            std::thread::sleep(Duration::from_micros(50));
        }
        if !agent.running() {
            bail!("the agent exited; log:\n{}", agent.log_text());
        }
    }
    let latency = summarize(&mut latencies);
    drop(agent);
    drop(server);
    Ok((
        EventToMap {
            shape,
            latency,
            timeouts,
        },
        rss,
    ))
}

/// Starts `run --config CONFIG --roles ROLE` (and `extra`), its local cluster's API server
/// the one of `kubeconfig`, with free metrics and health ports.
pub(crate) fn start_on_api(
    topo: &Topology,
    config: &Path,
    role: &str,
    kubeconfig: &Path,
    extra: &[String],
) -> anyhow::Result<Agent> {
    let metrics = format!("127.0.0.1:{}", free_port()?);
    let health = format!("127.0.0.1:{}", free_port()?);
    let mut args = vec![
        "run",
        "--config",
        path_str(config)?,
        "--roles",
        role,
        "--identity",
        "bench",
        "--metrics-address",
        &metrics,
        "--health-address",
        &health,
    ];
    args.extend(extra.iter().map(String::as_str));
    Agent::start_with_env(
        topo,
        &args,
        &[("KUBECONFIG", path_str(kubeconfig)?), ("RUST_LOG", "warn")],
    )
}

pub(crate) fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("non-UTF-8 path")
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Opens the agent's pinned maps once it has written `last` (the last service's frontend).
fn wait_for_maps(
    agent: &mut Agent,
    pin_dir: &Path,
    last: &FeAddr,
    timeout: Duration,
) -> anyhow::Result<KernelMaps> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(maps) = KernelMaps::open_pinned(&pin_dir.join("maps"))
            && maps.frontend(&last.key())?.is_some()
        {
            return Ok(maps);
        }
        if Instant::now() > deadline || !agent.running() {
            bail!(
                "the agent did not install the services (running: {}); log:\n{}",
                agent.running(),
                agent.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
