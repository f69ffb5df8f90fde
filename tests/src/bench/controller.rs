//! The controller role under load: five member clusters, each an in-process fake API server
//! holding its Services, ServiceExports and EndpointSlices at the control-plane shape, and a
//! controller-role agent (a separate process, as deployed) importing into member 0. Measured:
//! its memory once it has written every ServiceImport and imported EndpointSlice, and the
//! time from one member's EndpointSlice write to the imported slice's write in member 0
//! (the member's watch, the incremental merge of that service, the server-side apply).

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use dataplane_core::{
    fixtures::synthetic::{self, Shape},
    merge::{ClusterSetConfig, MemberChange, MergeOutput, MergeState},
    model::{EndpointSlice, Interner, ServiceImport, member::LocalSlice},
    reconcile::{Action, DesiredService, ObservedIndex, reconcile_service},
};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::Resource as _;
use serde::Serialize;
use serde_json::Value;

use super::{
    control::{fresh_ip, importing, memory_of, path_str, start_on_api},
    stats::{Summary, summarize},
};
use crate::{fake_apiserver::FakeApiServer, netns::Topology};

/// What the controller run measured.
#[derive(Clone, Debug, Serialize)]
pub struct ControllerRun {
    pub shape: Shape,
    /// Resident memory once every import and imported slice is written, and the peak.
    pub rss_mib: f64,
    pub peak_mib: f64,
    /// From the agent's start until member 0 holds every import and imported slice.
    pub startup_secs: f64,
    /// From a member's EndpointSlice write to the imported slice's write in member 0.
    pub latency: Summary,
    pub timeouts: usize,
    /// The same change through the controller's core alone, in process ([`controller_core`]).
    pub core: Summary,
}

const SLICE_API: &str = "discovery.k8s.io/v1";

/// What the controller's core does for one member's EndpointSlice change, in process: the
/// slice converted, filed in the merge state, its service merged again and compared with
/// what member 0 holds, until the action that writes the imported slice is built. No API
/// server, watch, JSON or write: [`controller_run`] measures those on top. Member 0's objects
/// are left unobserved, so each change builds every object of its service (the import, its
/// status, every imported slice), where the running controller builds only what differs: an
/// upper bound of the comparison.
pub fn controller_core(shape: Shape, changes: usize) -> anyhow::Result<Summary> {
    let names = Interner::new();
    let local = importing();
    let mut state = MergeState::new(ClusterSetConfig::default(), local.clone());
    state.load(&synthetic::member_snapshots(shape), &[]);
    let observed = ObservedIndex::default();
    let now = Time(Timestamp::now());
    let mut member_slices: Vec<Vec<EndpointSlice>> = (0..shape.clusters)
        .map(|c| synthetic::member_objects(shape, c).endpoint_slices)
        .collect();
    let mut rng = fastrand::Rng::with_seed(11);
    let mut latencies = Vec::with_capacity(changes);
    let mut dirty = BTreeSet::new();
    for i in 0..changes {
        let (c, s, fresh) = next_change(&mut rng, shape, &mut member_slices, i)?;
        let t0 = Instant::now();
        let record = Arc::new(LocalSlice::from_k8s(&member_slices[c][s], &names));
        state.apply(
            MemberChange::Slice(synthetic::cluster_id(c), record),
            &mut dirty,
        );
        let merged = state.update(&std::mem::take(&mut dirty));
        let built = merged.iter().any(|service| {
            let desired = DesiredService::of(state.service(service), &local);
            reconcile_service(service, desired, observed.service(service), &now)
                .iter()
                .any(|a| matches!(a, Action::ApplySlice(s) if slice_lists(s, fresh)))
        });
        latencies.push(t0.elapsed());
        ensure!(
            built,
            "change {i}: no imported slice with {fresh} was built"
        );
    }
    Ok(summarize(&mut latencies))
}

/// The `i`th change of a run, the same in both measures: one endpoint of a remote member's
/// slice (member 0's own when it is alone) given a fresh address. Returns the member, the
/// service's index and the address.
fn next_change(
    rng: &mut fastrand::Rng,
    shape: Shape,
    member_slices: &mut [Vec<EndpointSlice>],
    i: usize,
) -> anyhow::Result<(usize, usize, IpAddr)> {
    let c = if shape.clusters > 1 {
        1 + rng.usize(..shape.clusters - 1)
    } else {
        0
    };
    let s = rng.usize(..shape.services);
    let fresh = fresh_ip(i);
    member_slices[c][s]
        .endpoints
        .first_mut()
        .context("empty slice")?
        .addresses = vec![fresh.to_string()];
    Ok((c, s, fresh))
}

/// Whether an EndpointSlice lists `addr` among its endpoints' addresses.
fn slice_lists(slice: &EndpointSlice, addr: IpAddr) -> bool {
    let addr = addr.to_string();
    slice.endpoints.iter().any(|e| e.addresses.contains(&addr))
}

/// Whether an EndpointSlice (as served) lists `addr` among its endpoints' addresses.
fn lists_address(slice: &Value, addr: &str) -> bool {
    slice
        .pointer("/endpoints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.pointer("/addresses").and_then(Value::as_array))
        .flatten()
        .any(|a| a.as_str() == Some(addr))
}

/// Seeds one fake API server per member with [`synthetic::member_objects`], runs
/// `run --roles controller` for member 0 until it has written `plan`'s imports and imported
/// slices, reads its memory, then times `changes` member EndpointSlice edits.
pub fn controller_run(
    shape: Shape,
    plan: &MergeOutput,
    changes: usize,
) -> anyhow::Result<ControllerRun> {
    let topo = Topology::new(&[])?;
    let rt = tokio::runtime::Runtime::new()?;
    let mut servers = Vec::with_capacity(shape.clusters);
    let mut member_slices: Vec<Vec<EndpointSlice>> = Vec::with_capacity(shape.clusters);
    for c in 0..shape.clusters {
        let server = rt.block_on(FakeApiServer::start())?;
        let objects = synthetic::member_objects(shape, c);
        for s in &objects.services {
            server.put(s);
        }
        for e in &objects.service_exports {
            server.put(e);
        }
        for s in &objects.endpoint_slices {
            server.put(s);
        }
        member_slices.push(objects.endpoint_slices);
        servers.push(server);
    }
    let local = importing();
    let mut config = format!("localCluster: {local}\nmembers:\n- id: {local}\n");
    for (c, server) in servers.iter().enumerate().skip(1) {
        let path = topo.dir.join(format!("kubeconfig-{c}"));
        std::fs::write(&path, server.kubeconfig())?;
        config += &format!(
            "- id: {}\n  kubeconfig: {}\n",
            synthetic::cluster_id(c),
            path_str(&path)?
        );
    }
    let local_kubeconfig = topo.dir.join("kubeconfig-0");
    std::fs::write(&local_kubeconfig, servers[0].kubeconfig())?;
    let config_path = topo.dir.join("clusterset.yaml");
    std::fs::write(&config_path, config)?;
    let started = Instant::now();
    let mut agent = start_on_api(&topo, &config_path, "controller", &local_kubeconfig, &[])?;

    // Member 0 holds everything once the last import and slice the merge makes are there
    // (walked in order, so each is looked up once it exists).
    let import_api = ServiceImport::api_version(&());
    let mut next_import = 0;
    let mut next_slice = 0;
    let synced = rt.block_on(servers[0].wait_until(
        Duration::from_secs(600),
        "member 0 holds every import and imported slice",
        |s| {
            while let Some(i) = plan.service_imports.get(next_import) {
                let id = &i.service;
                if s.get_json(&import_api, "ServiceImport", &id.namespace, &id.name)
                    .is_none()
                {
                    return false;
                }
                next_import += 1;
            }
            while let Some(sl) = plan.endpoint_slices.get(next_slice) {
                if s.get_json(SLICE_API, "EndpointSlice", &sl.service.namespace, &sl.name)
                    .is_none()
                {
                    return false;
                }
                next_slice += 1;
            }
            true
        },
    ));
    if let Err(e) = synced {
        bail!(
            "{e} ({next_import} of {} imports, {next_slice} of {} slices; agent running: {}); log:\n{}",
            plan.service_imports.len(),
            plan.endpoint_slices.len(),
            agent.running(),
            agent.log_text()
        );
    }
    let startup_secs = started.elapsed().as_secs_f64();
    // Let the startup garbage settle before reading memory.
    std::thread::sleep(Duration::from_secs(2));
    let (rss_mib, peak_mib) = memory_of(agent.pid().context("agent exited")?)?;

    // The imported slice of each (service, source cluster).
    let imported: HashMap<(&str, &str), (&str, &str)> = plan
        .endpoint_slices
        .iter()
        .map(|s| {
            (
                (&*s.service.name, s.cluster.as_str()),
                (&*s.service.namespace, &*s.name),
            )
        })
        .collect();
    let mut rng = fastrand::Rng::with_seed(11);
    let mut latencies = Vec::with_capacity(changes);
    let mut timeouts = 0;
    for i in 0..changes {
        // A remote member's slice when there is one: its own watch carries the change.
        let (c, s, fresh) = next_change(&mut rng, shape, &mut member_slices, i)?;
        let fresh = fresh.to_string();
        let service = synthetic::service_name(s);
        let cluster = synthetic::cluster_id(c);
        let &(namespace, name) = imported
            .get(&(service.as_str(), cluster.as_str()))
            .with_context(|| format!("no imported slice of {service} from {cluster}"))?;
        let t0 = Instant::now();
        servers[c].put(&member_slices[c][s]);
        let written = rt.block_on(servers[0].wait_until(
            Duration::from_secs(5),
            "the imported slice has the new address",
            |srv| {
                srv.get_json(SLICE_API, "EndpointSlice", namespace, name)
                    .is_some_and(|v| lists_address(&v, &fresh))
            },
        ));
        match written {
            Ok(()) => latencies.push(t0.elapsed()),
            Err(_) => timeouts += 1,
        }
        if !agent.running() {
            bail!("the agent exited; log:\n{}", agent.log_text());
        }
    }
    // Then the core alone, once the agent and the servers are gone (its state is the bench's).
    drop((agent, servers, rt));
    Ok(ControllerRun {
        shape,
        rss_mib,
        peak_mib,
        startup_secs,
        latency: summarize(&mut latencies),
        timeouts,
        core: controller_core(shape, changes)?,
    })
}
