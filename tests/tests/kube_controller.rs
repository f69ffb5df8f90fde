//! The controller role against fake API servers, one per member cluster (`east`, `west`): the
//! real kube-runtime watchers, the merge, the server-side-apply writers, leader election with
//! kube-lease-manager. The controllers run in-process. Also the exact HTTP requests of the
//! writers, with a tower-test mock.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use dataplane_agent::{
    config::LeaderElection,
    roles::{
        controller::{self, ControllerSettings},
        kube::elect_and_control,
    },
    sink::kube::KubeSink,
    source::kube::AbortOnDrop,
    telemetry::metrics::Metrics,
};
use dataplane_core::{
    fixtures::{
        Port, cluster, endpoint, endpoint_slice, export, import, local_slice, service, snapshot,
    },
    merge::ClusterSetConfig,
    model::{
        EndpointSlice, FIELD_MANAGER, LABEL_APP_MANAGED_BY, LABEL_MANAGED_BY, LABEL_SERVICE_NAME,
        LABEL_SOURCE_CLUSTER, MANAGED_BY, Service, ServiceExport, ServiceImport,
    },
    policy::AddressPolicy,
    reconcile::{self, Action, EVENT_CONFLICT, EVENT_RESOLVED, Observed},
};
use http::{Method, StatusCode};
use k8s_openapi::{
    api::{coordination::v1::Lease, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::ResourceExt as _;
use serde_json::json;
use tests::{
    fake_apiserver::{FakeApiServer, RecordedRequest},
    fixtures::{APPLY_PATCH, ExpectedRequest, JSON, eventually, mock_client},
    tcp_proxy::TcpProxy,
};
use tokio::sync::Notify;

const WAIT: Duration = Duration::from_secs(20);
const NS: &str = "demo";

/// A ClusterIP Service `name` with one port, `http`, to 8080.
fn http_service(name: &str, port: i32) -> Service {
    service(NS, name)
        .type_("ClusterIP")
        .cluster_ip("10.96.0.10")
        .families(&["IPv4"])
        .port(Port::new("http", "TCP", port).target_port(8080))
        .build()
}

/// `service`'s local slice in `cluster`: one ready endpoint per address, port `http` 8080.
fn ready_slice(service: &str, cluster: &str, ips: &[&str]) -> EndpointSlice {
    local_slice(NS, &format!("{service}-{cluster}-local"), service)
        .endpoints(
            ips.iter()
                .map(|ip| endpoint(ip).conditions((Some(true), None, None))),
        )
        .port(("http", "TCP", 8080))
        .build()
}

/// `web` exported from `cluster` with one endpoint per address.
fn seed(srv: &FakeApiServer, cluster: &str, created: &str, ips: &[&str]) {
    srv.put(&http_service("web", 80));
    srv.put(&export(NS, "web").created(created).build());
    srv.put(&ready_slice("web", cluster, ips));
}

/// A controller running in-process for `local`.
struct Controller {
    metrics: Arc<Metrics>,
    _task: AbortOnDrop,
}

fn settings(local: &str, grace: Duration) -> Arc<ControllerSettings> {
    Arc::new(ControllerSettings {
        local: cluster(local),
        clusterset: ClusterSetConfig::default(),
        unreachable_grace: grace,
        probe_interval: Duration::from_millis(100),
        identity: format!("{local}-agent"),
        policy: AddressPolicy::default(),
    })
}

fn start(local: &str, members: &[(&str, &FakeApiServer)], grace: Duration) -> Controller {
    let metrics = Arc::new(Metrics::default());
    let members = members
        .iter()
        .map(|(n, s)| (cluster(n), s.client()))
        .collect();
    let task = tokio::spawn(controller::run(
        settings(local, grace),
        members,
        metrics.clone(),
    ));
    Controller {
        metrics,
        _task: AbortOnDrop(task),
    }
}

fn condition<'a>(conds: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

fn export_conditions(srv: &FakeApiServer, name: &str) -> Vec<Condition> {
    srv.get::<ServiceExport>(NS, name)
        .and_then(|e| e.status)
        .map(|s| s.conditions)
        .unwrap_or_default()
}

/// (type, status, reason) of a ServiceExport's conditions, sorted.
fn export_summary(srv: &FakeApiServer, name: &str) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = export_conditions(srv, name)
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason))
        .collect();
    v.sort();
    v
}

fn summary(items: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = items
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    v.sort();
    v
}

fn no_conflict() -> Vec<(String, String, String)> {
    summary(&[
        ("Conflict", "False", "NoConflicts"),
        ("Ready", "True", "Ready"),
        ("Valid", "True", "Valid"),
    ])
}

/// The imported slices of `service` in a cluster: source cluster -> sorted addresses.
fn imported(srv: &FakeApiServer, service: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in srv.list::<EndpointSlice>() {
        let labels = s.labels();
        if labels.get(LABEL_SERVICE_NAME).map(String::as_str) != Some(service) {
            continue;
        }
        let cluster = labels
            .get(LABEL_SOURCE_CLUSTER)
            .cloned()
            .unwrap_or_default();
        let ips = out.entry(cluster).or_default();
        ips.extend(s.endpoints.iter().flat_map(|e| e.addresses.clone()));
        ips.sort();
    }
    out
}

fn expect_imported(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(c, ips)| (c.to_string(), ips.iter().map(|s| s.to_string()).collect()))
        .collect()
}

fn ready_import(srv: &FakeApiServer, name: &str) -> Option<ServiceImport> {
    srv.get::<ServiceImport>(NS, name).filter(|si| {
        si.status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "Ready"))
            .is_some_and(|c| c.status == "True")
    })
}

/// Writes of the controller (not the lease, not events): SSA patches and deletes of imports,
/// slices and exports.
fn controller_writes(srv: &FakeApiServer) -> Vec<RecordedRequest> {
    srv.requests()
        .into_iter()
        .filter(|r| {
            r.is_write()
                && ["/serviceimports/", "/endpointslices/", "/serviceexports/"]
                    .iter()
                    .any(|p| r.path.contains(p))
        })
        .collect()
}

fn describe(reqs: &[RecordedRequest]) -> Vec<String> {
    reqs.iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

fn events(srv: &FakeApiServer) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = srv
        .list::<Event>()
        .into_iter()
        .map(|e| {
            (
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Waits until both clusters import `web` from both, with no conflict.
async fn converged(
    east: &FakeApiServer,
    west: &FakeApiServer,
    east_ips: &[&str],
    west_ips: &[&str],
) -> anyhow::Result<()> {
    let want = expect_imported(&[("east", east_ips), ("west", west_ips)]);
    for srv in [east, west] {
        srv.wait_until(WAIT, "web is imported from both clusters", |s| {
            ready_import(s, "web").is_some()
                && imported(s, "web") == want
                && export_summary(s, "web") == no_conflict()
        })
        .await?;
    }
    Ok(())
}

const T_EAST: &str = "2026-01-01T00:00:00Z";
const T_WEST: &str = "2026-01-02T00:00:00Z";

/// 1: an export in two clusters gives the ServiceImport and imported slices in both clusters,
/// and the conditions on both exports, all written by server-side apply with one field manager.
#[tokio::test]
async fn export_in_two_clusters_is_imported_into_both() -> anyhow::Result<()> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&east, "east", T_EAST, &["10.1.0.1", "10.1.0.2"]);
    seed(&west, "west", T_WEST, &["10.2.0.1"]);
    let members = [("east", &east), ("west", &west)];
    let _e = start("east", &members, Duration::from_secs(300));
    let _w = start("west", &members, Duration::from_secs(300));
    converged(&east, &west, &["10.1.0.1", "10.1.0.2"], &["10.2.0.1"]).await?;

    for (srv, name) in [(&east, "east"), (&west, "west")] {
        let si = srv.get::<ServiceImport>(NS, "web").expect("import");
        assert_eq!(si.spec.type_.to_string(), "ClusterSetIP", "{name}");
        assert_eq!(si.spec.ports.len(), 1);
        assert_eq!(
            (si.spec.ports[0].name.as_deref(), si.spec.ports[0].port),
            (Some("http"), 80)
        );
        assert_eq!(si.spec.ips.len(), 1, "one IPv4 ClusterSet IP");
        assert!(si.spec.ips[0].starts_with("241.0."), "{:?}", si.spec.ips);
        let status = si.status.as_ref().expect("status");
        let clusters: Vec<&str> = status.clusters.iter().map(|c| c.cluster.as_str()).collect();
        assert_eq!(clusters, ["east", "west"]);
        assert_eq!(
            si.labels().get(LABEL_APP_MANAGED_BY).map(String::as_str),
            Some(MANAGED_BY)
        );
        for s in srv.list::<EndpointSlice>() {
            if s.labels().contains_key(LABEL_SERVICE_NAME) {
                assert_eq!(
                    s.labels().get(LABEL_MANAGED_BY).map(String::as_str),
                    Some(MANAGED_BY)
                );
                let port = &s.ports.as_ref().expect("ports")[0];
                assert_eq!(
                    (port.name.as_deref(), port.port),
                    (Some("http"), Some(8080))
                );
            }
        }
        // Every write is a forced server-side apply (or a delete) with the one field manager.
        let writes = controller_writes(srv);
        assert!(!writes.is_empty());
        for w in &writes {
            assert_eq!(w.method, Method::PATCH, "{w:?}");
            assert_eq!(w.content_type.as_deref(), Some(APPLY_PATCH));
            assert_eq!(w.param("fieldManager").as_deref(), Some(FIELD_MANAGER));
            assert_eq!(w.param("force").as_deref(), Some("true"));
        }
        assert!(
            writes.iter().any(|w| w.path
                == format!(
                    "/apis/multicluster.x-k8s.io/v1beta1/namespaces/{NS}/serviceexports/web/status"
                )),
            "conditions go through the status subresource: {:?}",
            describe(&writes)
        );
        // Each object was written once: the controller compares before it applies.
        let mut paths = describe(&writes);
        let n = paths.len();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), n, "a write repeated: {:?}", describe(&writes));
    }
    Ok(())
}

/// 2: changing one cluster's port raises PortConflict on both exports, with an Event; reverting
/// clears it, with an Event; lastTransitionTime moves only for the condition that changed.
#[tokio::test]
async fn port_conflict_appears_on_both_exports_and_clears() -> anyhow::Result<()> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&east, "east", T_EAST, &["10.1.0.1"]);
    seed(&west, "west", T_WEST, &["10.2.0.1"]);
    let members = [("east", &east), ("west", &west)];
    let _e = start("east", &members, Duration::from_secs(300));
    let _w = start("west", &members, Duration::from_secs(300));
    converged(&east, &west, &["10.1.0.1"], &["10.2.0.1"]).await?;
    let valid_before = condition(&export_conditions(&east, "web"), "Valid")
        .expect("Valid")
        .last_transition_time
        .clone();

    west.put(&http_service("web", 81));
    let conflicted = summary(&[
        ("Conflict", "True", "PortConflict"),
        ("Ready", "True", "Ready"),
        ("Valid", "True", "Valid"),
    ]);
    for srv in [&east, &west] {
        srv.wait_until(WAIT, "PortConflict on the export", |s| {
            export_summary(s, "web") == conflicted
                && events(s).contains(&("web".into(), "Warning".into(), EVENT_CONFLICT.into()))
        })
        .await?;
        let conds = export_conditions(srv, "web");
        let message = &condition(&conds, "Conflict").expect("Conflict").message;
        assert!(message.contains("\"west\""), "names the cluster: {message}");
    }
    // The oldest definition (east's :80) wins in both clusters; west's :81 is dropped.
    for srv in [&east, &west] {
        let si = srv.get::<ServiceImport>(NS, "web").expect("import");
        let ports: Vec<i32> = si.spec.ports.iter().map(|p| p.port).collect();
        assert_eq!(ports, [80]);
    }
    assert_eq!(
        condition(&export_conditions(&east, "web"), "Valid")
            .expect("Valid")
            .last_transition_time,
        valid_before,
        "Valid did not change status, so its lastTransitionTime stays"
    );

    west.put(&http_service("web", 80));
    for srv in [&east, &west] {
        srv.wait_until(WAIT, "the conflict clears", |s| {
            export_summary(s, "web") == no_conflict()
                && events(s).contains(&("web".into(), "Normal".into(), EVENT_RESOLVED.into()))
        })
        .await?;
        assert_eq!(
            events(srv),
            vec![
                ("web".into(), "Normal".into(), EVENT_RESOLVED.into()),
                ("web".into(), "Warning".into(), EVENT_CONFLICT.into()),
            ],
            "one event when the conflict appears and one when it clears"
        );
    }
    converged(&east, &west, &["10.1.0.1"], &["10.2.0.1"]).await?;
    Ok(())
}

/// 3: unexporting everywhere deletes the import and the imported slices, and only ours.
#[tokio::test]
async fn unexporting_everywhere_deletes_import_and_slices() -> anyhow::Result<()> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&east, "east", T_EAST, &["10.1.0.1"]);
    seed(&west, "west", T_WEST, &["10.2.0.1"]);
    // Someone else's import and imported slice, without our managed-by label.
    east.put(&import(NS, "theirs").port(("", 1)).build());
    east.put(
        &endpoint_slice(NS, "theirs-x")
            .label(LABEL_SERVICE_NAME, "theirs")
            .label(LABEL_MANAGED_BY, "someone-else")
            .build(),
    );
    let members = [("east", &east), ("west", &west)];
    let _e = start("east", &members, Duration::from_secs(300));
    let _w = start("west", &members, Duration::from_secs(300));
    converged(&east, &west, &["10.1.0.1"], &["10.2.0.1"]).await?;

    // One export left: the import stays, with only east's endpoints.
    west.delete::<ServiceExport>(NS, "web");
    for srv in [&east, &west] {
        srv.wait_until(WAIT, "only east is imported", |s| {
            imported(s, "web") == expect_imported(&[("east", &["10.1.0.1"])])
                && s.get::<ServiceImport>(NS, "web").is_some_and(|si| {
                    si.status.is_some_and(|st| {
                        st.clusters
                            .iter()
                            .map(|c| c.cluster.as_str())
                            .collect::<Vec<_>>()
                            == ["east"]
                    })
                })
        })
        .await?;
    }
    east.delete::<ServiceExport>(NS, "web");
    for srv in [&east, &west] {
        srv.wait_until(WAIT, "the import and its slices are gone", |s| {
            s.get::<ServiceImport>(NS, "web").is_none() && imported(s, "web").is_empty()
        })
        .await?;
    }
    assert!(
        east.get::<ServiceImport>(NS, "theirs").is_some(),
        "not ours: kept"
    );
    assert!(
        east.get::<EndpointSlice>(NS, "theirs-x").is_some(),
        "not ours: kept"
    );
    let deletes: Vec<String> = controller_writes(&east)
        .into_iter()
        .filter(|r| r.method == Method::DELETE)
        .map(|r| r.path)
        .collect();
    assert_eq!(
        deletes,
        [
            format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/web-west-ipv4"),
            format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/web-east-ipv4"),
            format!("/apis/multicluster.x-k8s.io/v1beta1/namespaces/{NS}/serviceimports/web"),
        ]
    );
    Ok(())
}

/// 4: the API servers restart mid-watch (watch cache lost: 410 Gone, re-list). The controllers
/// converge on a change made during the restart, writing only what changed, once.
#[tokio::test]
async fn api_server_restart_converges_without_duplicate_writes() -> anyhow::Result<()> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&east, "east", T_EAST, &["10.1.0.1"]);
    seed(&west, "west", T_WEST, &["10.2.0.1"]);
    let members = [("east", &east), ("west", &west)];
    let e = start("east", &members, Duration::from_secs(300));
    let _w = start("west", &members, Duration::from_secs(300));
    converged(&east, &west, &["10.1.0.1"], &["10.2.0.1"]).await?;

    east.clear_requests();
    west.clear_requests();
    east.restart().await;
    west.restart().await;
    // A change racing the re-lists: a second endpoint in west.
    west.put(&ready_slice("web", "west", &["10.2.0.1", "10.2.0.2"]));
    converged(&east, &west, &["10.1.0.1"], &["10.2.0.1", "10.2.0.2"]).await?;
    // A later, unrelated change that both controllers must see: when it is done, every write
    // caused by the restart and the first change has been made.
    west.put(&http_service("db", 5432));
    west.put(&export(NS, "db").created(T_WEST).build());
    for srv in [&east, &west] {
        srv.wait_until(WAIT, "db is imported", |s| ready_import(s, "db").is_some())
            .await?;
    }
    for (srv, name) in [(&east, "east"), (&west, "west")] {
        let reqs = srv.requests();
        assert!(
            reqs.iter().any(|r| r.method == Method::GET
                && !r.is_watch()
                && r.path.ends_with("/endpointslices")),
            "{name}: the watchers re-listed after 410 Gone"
        );
        let web: Vec<String> = describe(&controller_writes(srv))
            .into_iter()
            .filter(|w| w.contains("/web"))
            .collect();
        assert_eq!(
            web,
            [format!(
                "PATCH /apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/web-west-ipv4"
            )],
            "{name}: only west's imported slice changed, and it is written once"
        );
    }
    // (Not the namespaces watch: this fake API server does not serve namespaces.)
    assert!(
        e.metrics.encode().lines().any(|l| {
            l.starts_with("mcs_watch_restarts_total{cluster=\"east\"")
                && !l.contains("resource=\"namespaces\"")
        }),
        "the 410s are counted"
    );
    Ok(())
}

/// The `mcs_refused_addresses` lines of the controller's endpoints, sorted.
fn refused_metrics(m: &Metrics) -> Vec<String> {
    let mut v: Vec<String> = m
        .encode()
        .lines()
        .filter(|l| l.starts_with("mcs_refused_addresses{kind=\"member_endpoint\""))
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

/// 4b: loopback and metadata endpoints in a member's slice, next to a good one: neither
/// cluster imports them (the slice is imported with the good one), both controllers count
/// them, and the member's own ServiceExport says which were refused; once they are gone from
/// the slice, the condition and the counts go too.
#[tokio::test]
async fn refused_endpoints_are_dropped_and_reported_on_the_members_export() -> anyhow::Result<()> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&east, "east", T_EAST, &["10.1.0.1"]);
    seed(
        &west,
        "west",
        T_WEST,
        &["10.2.0.1", "127.0.0.1", "169.254.169.254"],
    );
    let members = [("east", &east), ("west", &west)];
    let e = start("east", &members, Duration::from_secs(300));
    let w = start("west", &members, Duration::from_secs(300));
    let refused = summary(&[
        ("Conflict", "False", "NoConflicts"),
        (
            "EndpointsRefused",
            "True",
            "LoopbackAddress,LinkLocalAddress",
        ),
        ("Ready", "True", "Ready"),
        ("Valid", "True", "Valid"),
    ]);
    let want = expect_imported(&[("east", &["10.1.0.1"]), ("west", &["10.2.0.1"])]);
    west.wait_until(WAIT, "west's export says its endpoints are refused", |s| {
        export_summary(s, "web") == refused
    })
    .await?;
    for srv in [&east, &west] {
        srv.wait_until(WAIT, "web is imported without the refused endpoints", |s| {
            ready_import(s, "web").is_some() && imported(s, "web") == want
        })
        .await?;
    }
    let message = condition(&export_conditions(&west, "web"), "EndpointsRefused")
        .expect("EndpointsRefused")
        .message
        .clone();
    for part in [
        "endpoint 127.0.0.1 of EndpointSlice demo/web-west-local is a loopback address",
        "endpoint 169.254.169.254 of EndpointSlice demo/web-west-local is a link-local address",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    // East's own endpoints are fine: its export has no such condition.
    assert_eq!(export_summary(&east, "web"), no_conflict());
    for (name, c) in [("east", &e), ("west", &w)] {
        assert_eq!(
            refused_metrics(&c.metrics),
            [
                "mcs_refused_addresses{kind=\"member_endpoint\",reason=\"link_local\"} 1",
                "mcs_refused_addresses{kind=\"member_endpoint\",reason=\"loopback\"} 1",
            ],
            "{name}"
        );
    }

    // The bad endpoints leave the slice: the condition clears and nothing is counted.
    west.put(&ready_slice("web", "west", &["10.2.0.1"]));
    converged(&east, &west, &["10.1.0.1"], &["10.2.0.1"]).await?;
    for c in [&e, &w] {
        // The export's condition is cleared by the same pass that counted.
        assert_eq!(refused_metrics(&c.metrics), Vec::<String>::new());
    }
    Ok(())
}

/// An agent of the east cluster with leader election, reaching east through a proxy that the
/// test can cut (pod loss: nothing is released).
struct ElectedAgent {
    name: String,
    metrics: Arc<Metrics>,
    proxy: TcpProxy,
    task: AbortOnDrop,
}

async fn elected(
    name: &str,
    east: &FakeApiServer,
    west: &FakeApiServer,
) -> anyhow::Result<ElectedAgent> {
    let target: SocketAddr = east.url().trim_start_matches("http://").parse()?;
    let proxy = TcpProxy::start(target).await?;
    let metrics = Arc::new(Metrics::default());
    let mut s = (*settings("east", Duration::from_secs(300))).clone();
    s.identity = name.to_owned();
    let task = tokio::spawn(elect_and_control(
        Arc::new(s),
        vec![
            (cluster("east"), proxy.client()),
            (cluster("west"), west.client()),
        ],
        metrics.clone(),
        LeaderElection {
            lease_name: "mcs-dataplane-controller".into(),
            lease_duration: Duration::from_secs(3),
            renew_grace: Duration::from_secs(1),
        },
        "mcs-system".into(),
        Arc::new(Notify::new()),
    ));
    Ok(ElectedAgent {
        name: name.to_owned(),
        metrics,
        proxy,
        task: AbortOnDrop(task),
    })
}

fn leader_gauge(m: &Metrics) -> i64 {
    m.leader.get()
}

fn holder(srv: &FakeApiServer) -> Option<String> {
    srv.get::<Lease>("mcs-system", "mcs-dataplane-controller")?
        .spec?
        .holder_identity
}

/// Two members of one service and two elected agents for east, once `web` is imported: the
/// servers, then the lease holder and the other agent.
async fn two_elected_agents()
-> anyhow::Result<(FakeApiServer, FakeApiServer, ElectedAgent, ElectedAgent)> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&east, "east", T_EAST, &["10.1.0.1"]);
    seed(&west, "west", T_WEST, &["10.2.0.1"]);
    let a = elected("agent-a", &east, &west).await?;
    let b = elected("agent-b", &east, &west).await?;
    east.wait_until(WAIT, "web is imported", |s| {
        ready_import(s, "web").is_some()
            && imported(s, "web")
                == expect_imported(&[("east", &["10.1.0.1"]), ("west", &["10.2.0.1"])])
            && export_summary(s, "web") == no_conflict()
    })
    .await?;
    let leader_name = holder(&east).expect("a lease holder");
    let (leader, follower) = if leader_name == a.name {
        (a, b)
    } else {
        (b, a)
    };
    Ok((east, west, leader, follower))
}

/// 5: with two agents only the lease holder writes; when it is lost (its network cut, nothing
/// released), the other takes over within the lease duration and carries on.
#[tokio::test]
async fn only_the_leader_writes_and_leadership_moves_on_pod_loss() -> anyhow::Result<()> {
    let (east, west, leader, follower) = two_elected_agents().await?;
    assert_eq!(leader_gauge(&leader.metrics), 1);
    assert_eq!(leader_gauge(&follower.metrics), 0);
    // Every write the server saw is the leader's (its counter catches up right after the
    // responses), and the follower made none.
    eventually(
        WAIT,
        "the leader counted every write the server saw",
        || (leader.metrics.writes_total() == controller_writes(&east).len() as u64).then_some(()),
    )
    .await?;
    assert!(leader.metrics.writes_total() >= 4);
    assert_eq!(follower.metrics.writes_total(), 0, "the follower wrote");

    // Pod loss: the leader's connections die and it never releases the lease.
    let lost_at = tokio::time::Instant::now();
    leader.proxy.cut();
    drop(leader.task);
    let follower_name = follower.name.clone();
    east.wait_until(WAIT, "the follower holds the lease", |s| {
        holder(s).as_deref() == Some(follower_name.as_str())
    })
    .await?;
    assert!(
        lost_at.elapsed() < Duration::from_secs(3) + Duration::from_secs(3),
        "handed over within the lease duration (plus the renew interval): {:?}",
        lost_at.elapsed()
    );
    eventually(WAIT, "the new leader runs the controller", || {
        (leader_gauge(&follower.metrics) == 1).then_some(())
    })
    .await?;
    // The new leader writes what changes from now on.
    west.put(&ready_slice("web", "west", &["10.2.0.1", "10.2.0.9"]));
    east.wait_until(WAIT, "the new leader imports the new endpoint", |s| {
        imported(s, "web")
            == expect_imported(&[("east", &["10.1.0.1"]), ("west", &["10.2.0.1", "10.2.0.9"])])
    })
    .await?;
    eventually(WAIT, "the new leader counted its write", || {
        (follower.metrics.writes_total() >= 1).then_some(())
    })
    .await?;
    Ok(())
}

/// 5b: a leader cut off from its API server (nothing released, the pod still running) steps
/// down on its own before the other agent may take the Lease, and, once the partition heals,
/// writes nothing while the other holds it. (The lease manager alone reports the loss only
/// when it reaches the API server again.)
#[tokio::test]
async fn a_partitioned_leader_steps_down_and_stays_down_after_the_heal() -> anyhow::Result<()> {
    let (east, west, old, new) = two_elected_agents().await?;
    eventually(WAIT, "the leader leads", || {
        (leader_gauge(&old.metrics) == 1).then_some(())
    })
    .await?;

    eventually(WAIT, "the leader reports its members", || {
        let text = old.metrics.encode();
        text.contains("mcs_member_reachable{cluster=\"west\"} 1")
            .then_some(())
    })
    .await?;
    let cut_at = tokio::time::Instant::now();
    old.proxy.block(true);
    // The lease lasts 3 s with a renew grace of 1 s: the old leader stops by 2.5 s after its
    // last renewal, before the other agent may take the Lease.
    eventually(WAIT, "the partitioned leader steps down", || {
        (leader_gauge(&old.metrics) == 0).then_some(())
    })
    .await?;
    // Its members' gauges go with it: only the leader reports them.
    eventually(WAIT, "the old leader's member gauges are gone", || {
        let text = old.metrics.encode();
        (!text.contains("mcs_member_reachable{") && !text.contains("mcs_conflicts{")).then_some(())
    })
    .await?;
    assert!(
        cut_at.elapsed() < Duration::from_secs(3),
        "stepped down {:?} after the cut",
        cut_at.elapsed()
    );
    let new_name = new.name.clone();
    east.wait_until(WAIT, "the other agent holds the lease", |s| {
        holder(s).as_deref() == Some(new_name.as_str())
    })
    .await?;

    old.proxy.block(false);
    let before = old.metrics.writes_total();
    for i in 0..12u8 {
        let ip = format!("10.2.0.{}", 20 + i);
        west.put(&ready_slice("web", "west", &["10.2.0.1", &ip]));
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(leader_gauge(&old.metrics), 0, "the old leader leads again");
    }
    assert_eq!(
        old.metrics.writes_total(),
        before,
        "the old leader wrote while the other agent held the lease"
    );
    east.wait_until(WAIT, "the new leader imports the last endpoint", |s| {
        imported(s, "web")
            == expect_imported(&[
                ("east", &["10.1.0.1"]),
                ("west", &["10.2.0.1", "10.2.0.31"]),
            ])
    })
    .await?;
    Ok(())
}

/// A write that keeps failing (here the export's status: the local API server forbids it)
/// is retried after 1 s, then 2 s, ..., not on every event of an unrelated service.
#[tokio::test]
async fn a_failing_write_is_retried_with_backoff_not_on_every_event() -> anyhow::Result<()> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&east, "east", T_EAST, &["10.1.0.1"]);
    seed(&west, "west", T_WEST, &["10.2.0.1"]);
    let _c = start(
        "east",
        &[("east", &east), ("west", &west)],
        Duration::from_secs(300),
    );
    east.wait_until(WAIT, "web is imported", |s| {
        ready_import(s, "web").is_some() && export_summary(s, "web") == no_conflict()
    })
    .await?;
    east.forbid("serviceexports");
    east.clear_requests();
    // A port conflict: east's export status must change, and that write fails.
    west.put(&http_service("web", 81));
    // Churn elsewhere: an unrelated exported service changes every 50 ms for 3 s.
    west.put(&export(NS, "noise").created(T_WEST).build());
    for i in 0..60 {
        west.put(&ready_slice(
            "noise",
            "west",
            &[&format!("10.2.1.{}", 1 + i)],
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attempts = east
        .requests()
        .iter()
        .filter(|r| r.is_write() && r.path.contains("/serviceexports/web/status"))
        .count();
    // At once, then after 1 s and 2 s: three in 3 s (one more for timing).
    assert!(
        (1..=4).contains(&attempts),
        "{attempts} attempts of a failing write in 3 s"
    );
    Ok(())
}

/// 6: a member unreachable past the grace period has its endpoints withdrawn and the import's
/// Ready message says so; before that, nothing changes; when it is back, they return.
#[tokio::test]
async fn unreachable_member_is_withdrawn_after_the_grace_period() -> anyhow::Result<()> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&east, "east", T_EAST, &["10.1.0.1"]);
    seed(&west, "west", T_WEST, &["10.2.0.1"]);
    let grace = Duration::from_millis(1500);
    let e = start("east", &[("east", &east), ("west", &west)], grace);
    east.wait_until(WAIT, "web is imported from both", |s| {
        ready_import(s, "web").is_some()
            && imported(s, "web")
                == expect_imported(&[("east", &["10.1.0.1"]), ("west", &["10.2.0.1"])])
    })
    .await?;

    east.clear_requests();
    let stopped = tokio::time::Instant::now();
    west.stop().await;
    // The slices are written first, then the import's status.
    east.wait_until(WAIT, "west's endpoints are withdrawn", |s| {
        imported(s, "web") == expect_imported(&[("east", &["10.1.0.1"])])
            && s.get::<ServiceImport>(NS, "web").is_some_and(|si| {
                si.status
                    .as_ref()
                    .and_then(|st| condition(&st.conditions, "Ready"))
                    .is_some_and(|c| c.message.contains("withdrawn"))
            })
    })
    .await?;
    assert!(
        stopped.elapsed() >= grace,
        "withdrawn after {:?}, before the grace period",
        stopped.elapsed()
    );
    let si = east
        .get::<ServiceImport>(NS, "web")
        .expect("the import stays");
    let status = si.status.expect("status");
    let ready = condition(&status.conditions, "Ready").expect("Ready");
    assert!(
        ready
            .message
            .contains("Endpoints of cluster \"west\" are withdrawn"),
        "{}",
        ready.message
    );
    assert_eq!(si.spec.ports.len(), 1, "the ports stay as they were");
    assert!(
        e.metrics
            .encode()
            .contains("mcs_member_withdrawn{cluster=\"west\"} 1")
    );

    west.resume().await?;
    east.wait_until(WAIT, "west is back", |s| {
        imported(s, "web") == expect_imported(&[("east", &["10.1.0.1"]), ("west", &["10.2.0.1"])])
            && s.get::<ServiceImport>(NS, "web").is_some_and(|si| {
                si.status.is_some_and(|st| {
                    condition(&st.conditions, "Ready")
                        .is_some_and(|c| !c.message.contains("withdrawn"))
                })
            })
    })
    .await?;
    Ok(())
}

/// 6c: a controller that starts while a member is down (a restart, a failover) never lists
/// it. The imports that member alone exports are kept, with their ClusterSet IPs, its
/// endpoints withdrawn; once it is back, its endpoints return under the same IP, and an
/// import it stopped exporting meanwhile goes.
#[tokio::test]
async fn a_controller_started_during_a_member_outage_keeps_its_imports() -> anyhow::Result<()> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&west, "west", T_WEST, &["10.2.0.1"]);
    west.put(&http_service("api", 80));
    west.put(&export(NS, "api").created(T_WEST).build());
    west.put(&ready_slice("api", "west", &["10.2.0.2"]));
    let grace = Duration::from_millis(1500);
    let members = [("east", &east), ("west", &west)];
    let first = start("east", &members, grace);
    east.wait_until(WAIT, "web and api are imported from west", |s| {
        ready_import(s, "web").is_some()
            && ready_import(s, "api").is_some()
            && imported(s, "web") == expect_imported(&[("west", &["10.2.0.1"])])
    })
    .await?;
    let ips =
        |s: &FakeApiServer, name: &str| s.get::<ServiceImport>(NS, name).map(|si| si.spec.ips);
    let (web_ips, api_ips) = (ips(&east, "web"), ips(&east, "api"));
    drop(first);

    west.stop().await;
    assert!(
        west.delete::<ServiceExport>(NS, "api"),
        "west stops exporting api meanwhile"
    );
    let started = tokio::time::Instant::now();
    let _second = start("east", &members, grace);
    // A service of east's own starts with it and wants an IP too.
    seed(&east, "east", T_EAST, &["10.1.0.1"]);
    east.put(&http_service("new", 80));
    east.put(&export(NS, "new").created(T_EAST).build());
    east.wait_until(
        WAIT,
        "west's endpoints are withdrawn, its imports kept",
        |s| {
            imported(s, "web") == expect_imported(&[("east", &["10.1.0.1"])])
                && ready_import(s, "new").is_some()
                && s.get::<ServiceImport>(NS, "api").is_some_and(|si| {
                    si.status
                        .and_then(|st| condition(&st.conditions, "Ready").cloned())
                        .is_some_and(|c| {
                            c.message
                                .contains("Endpoints of cluster \"west\" are withdrawn")
                        })
                })
        },
    )
    .await?;
    assert!(started.elapsed() >= grace, "merged before the grace period");
    // A few passes later, still there with the same IPs, and the new service has another.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ips(&east, "web"), web_ips);
    assert_eq!(ips(&east, "api"), api_ips);
    assert!(
        imported(&east, "api").is_empty(),
        "west's endpoints are not held"
    );
    let new_ips = ips(&east, "new").expect("new is imported");
    assert!(
        new_ips
            .iter()
            .all(|ip| !web_ips.iter().chain(&api_ips).flatten().any(|o| o == ip)),
        "{new_ips:?} against {web_ips:?} and {api_ips:?}"
    );

    west.resume().await?;
    east.wait_until(WAIT, "west is back", |s| {
        imported(s, "web") == expect_imported(&[("east", &["10.1.0.1"]), ("west", &["10.2.0.1"])])
            && s.get::<ServiceImport>(NS, "api").is_none()
    })
    .await?;
    assert_eq!(ips(&east, "web"), web_ips);
    Ok(())
}

/// 6b: a member whose API server answers `/version` but no longer lets us read what we watch
/// (revoked RBAC; open watches go on) is unreachable too: withdrawn after the grace period,
/// back when access returns.
#[tokio::test]
async fn member_that_forbids_our_reads_is_withdrawn() -> anyhow::Result<()> {
    withdrawn_while(|west| west.forbid("endpointslices")).await
}

/// 6c: the same when lists are still allowed but watches are not (RBAC without `watch`, or a
/// proxy that cuts streams): the member's state would otherwise stay as last listed for good.
#[tokio::test]
async fn member_that_forbids_our_watches_is_withdrawn() -> anyhow::Result<()> {
    withdrawn_while(|west| west.forbid_watches("endpointslices")).await
}

/// West's endpoints are withdrawn from east's import `grace` after `forbid` takes effect, and
/// come back once everything is allowed again.
async fn withdrawn_while(forbid: impl FnOnce(&FakeApiServer)) -> anyhow::Result<()> {
    let (east, west) = (FakeApiServer::start().await?, FakeApiServer::start().await?);
    seed(&east, "east", T_EAST, &["10.1.0.1"]);
    seed(&west, "west", T_WEST, &["10.2.0.1"]);
    let grace = Duration::from_millis(1500);
    let _e = start("east", &[("east", &east), ("west", &west)], grace);
    let both = expect_imported(&[("east", &["10.1.0.1"]), ("west", &["10.2.0.1"])]);
    east.wait_until(WAIT, "web is imported from both", |s| {
        imported(s, "web") == both
    })
    .await?;

    forbid(&west);
    assert!(
        west.client().apiserver_version().await.is_ok(),
        "/version still answers"
    );
    let forbidden = tokio::time::Instant::now();
    east.wait_until(WAIT, "west's endpoints are withdrawn", |s| {
        imported(s, "web") == expect_imported(&[("east", &["10.1.0.1"])])
    })
    .await?;
    assert!(
        forbidden.elapsed() >= grace,
        "withdrawn before the grace period"
    );

    west.allow("endpointslices");
    east.wait_until(WAIT, "west is back", |s| imported(s, "web") == both)
        .await?;
    Ok(())
}

/// The controller's reconcile and writers, with the exact HTTP requests checked by a tower-test
/// verifier: server-side apply, one field manager, `force`, the status subresource, and the
/// Event when a conflict appears.
#[tokio::test]
async fn reconcile_sends_exact_server_side_apply_requests() -> anyhow::Result<()> {
    let mut east_export = export(NS, "web").created(T_EAST).build();
    east_export.metadata.uid = Some("uid-east-web".into());
    let snapshots = vec![
        snapshot("east")
            .service(http_service("web", 80))
            .export(east_export.clone())
            .slice(ready_slice("web", "east", &["10.1.0.1"]))
            .build(),
        snapshot("west")
            .service(http_service("web", 81))
            .export(export(NS, "web").created(T_WEST))
            .slice(ready_slice("web", "west", &["10.2.0.1"]))
            .build(),
    ];
    let plan = reconcile::desired(
        &snapshots,
        &ClusterSetConfig::default(),
        &cluster("east"),
        &[],
        &Default::default(),
        Duration::from_secs(300),
    );
    let now = Time("2026-03-01T12:00:00Z".parse()?);
    let observed = Observed {
        exports: vec![Arc::new(east_export)],
        ..Default::default()
    };
    let actions = reconcile::reconcile(&plan, &cluster("east"), &observed, &now);
    let labels: Vec<(&str, &str)> = actions.iter().map(Action::label).collect();
    assert_eq!(
        labels,
        [
            ("EndpointSlice", "apply"),
            ("ServiceImport", "apply"),
            ("ServiceImport", "apply_status"),
            ("ServiceExport", "apply_status"),
            ("Event", "create"),
        ]
    );
    let si = plan.service_imports[0].to_k8s();
    let ip = si.spec.ips[0].clone();

    let (client, mut verifier) = mock_client();
    let run = tokio::spawn(async move {
        let sink = KubeSink::new(client, "agent-a");
        let mut results = Vec::new();
        for a in &actions {
            results.push(sink.apply(a).await.map(|_| ()).map_err(|e| e.to_string()));
        }
        results
    });
    let ssa = |path: &str| {
        ExpectedRequest::new(Method::PATCH, path)
            .query("fieldManager", FIELD_MANAGER)
            .query("force", "true")
            .content_type(APPLY_PATCH)
    };
    // The slice first: a node must not see the import's ports with old slices. Only east's
    // slice: west declares :81, not the merged :80, so none of its endpoints serve anything
    // and none are imported.
    let name = "web-east-ipv4";
    verifier
        .expect(
            &ssa(&format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/{name}")).json_body(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": NS, "labels": {
                    LABEL_SERVICE_NAME: "web", LABEL_SOURCE_CLUSTER: "east", LABEL_MANAGED_BY: MANAGED_BY}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": true}}],
                "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
            })),
            StatusCode::OK,
            &json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": NS}, "addressType": "IPv4", "endpoints": []}),
        )
        .await?;
    let import_path =
        format!("/apis/multicluster.x-k8s.io/v1beta1/namespaces/{NS}/serviceimports/web");
    let import_obj = json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
        "metadata": {"name": "web", "namespace": NS, "resourceVersion": "1"}, "spec": {"type": "ClusterSetIP", "ports": []}});
    verifier
        .expect(
            &ssa(&import_path).json_body(json!({
                "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
                "metadata": {"name": "web", "namespace": NS, "labels": {LABEL_APP_MANAGED_BY: MANAGED_BY}},
                "spec": {"type": "ClusterSetIP", "ips": [ip], "ipFamilies": ["IPv4"],
                         "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
                         "sessionAffinity": "None", "internalTrafficPolicy": "Cluster"},
            })),
            StatusCode::OK,
            &import_obj,
        )
        .await?;
    let req = verifier
        .expect(
            &ssa(&format!("{import_path}/status")),
            StatusCode::OK,
            &import_obj,
        )
        .await?;
    let body = req.json().expect("json");
    assert_eq!(
        body["status"]["clusters"],
        json!([{"cluster": "east"}, {"cluster": "west"}])
    );
    assert_eq!(body["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(
        body["status"]["conditions"][0]["lastTransitionTime"], "2026-03-01T12:00:00Z",
        "a new condition transitions now"
    );
    assert!(
        body.get("spec").is_none(),
        "the status apply carries only status"
    );
    let export_path =
        format!("/apis/multicluster.x-k8s.io/v1beta1/namespaces/{NS}/serviceexports/web/status");
    let req = verifier
        .expect(
            &ssa(&export_path),
            StatusCode::OK,
            &json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
                "metadata": {"name": "web", "namespace": NS}}),
        )
        .await?;
    let body = req.json().expect("json");
    assert_eq!(body["metadata"], json!({"name": "web", "namespace": NS}));
    let conds: Vec<(String, String, String)> = body["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap_or("").to_owned(),
                c["status"].as_str().unwrap_or("").to_owned(),
                c["reason"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        conds,
        [
            ("Valid".into(), "True".into(), "Valid".into()),
            ("Ready".into(), "True".into(), "Ready".into()),
            ("Conflict".into(), "True".into(), "PortConflict".into()),
        ]
    );
    let req = verifier
        .expect(
            &ExpectedRequest::new(Method::POST, &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"))
                .content_type(JSON),
            StatusCode::CREATED,
            &json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "web.1", "namespace": NS}, "eventTime": "2026-03-01T12:00:00.000000Z"}),
        )
        .await?;
    let event = req.json().expect("json");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], EVENT_CONFLICT);
    assert_eq!(event["regarding"]["kind"], "ServiceExport");
    assert_eq!(event["regarding"]["uid"], "uid-east-web");
    assert_eq!(event["reportingController"], FIELD_MANAGER);
    assert!(
        event["note"]
            .as_str()
            .unwrap_or("")
            .starts_with("PortConflict: ")
    );
    let results = tokio::time::timeout(WAIT, run).await??;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    verifier.finish().await?;

    // Fed back what it wrote, the reconcile wants nothing more.
    let mut written = si;
    written.metadata.labels =
        Some([(LABEL_APP_MANAGED_BY.to_owned(), MANAGED_BY.to_owned())].into());
    let status = written.status.as_mut().expect("status");
    status.conditions = reconcile::with_transition_times(&status.conditions, &[], &now);
    let mut export_after = export(NS, "web").created(T_EAST).build();
    export_after.status = Some(dataplane_core::model::ServiceExportStatus {
        conditions: plan.export_statuses[0]
            .conditions
            .iter()
            .map(|c| c.to_k8s(now.clone()))
            .collect(),
    });
    let observed = Observed {
        imports: vec![Arc::new(written)],
        slices: plan
            .endpoint_slices
            .iter()
            .map(|s| Arc::new(s.to_k8s()))
            .collect(),
        exports: vec![Arc::new(export_after)],
    };
    let later = Time("2026-03-01T13:00:00Z".parse()?);
    assert_eq!(
        reconcile::reconcile(&plan, &cluster("east"), &observed, &later),
        []
    );
    Ok(())
}

/// The local cluster id from the ClusterProperty `cluster.clusterset.k8s.io` (KEP-2149), and a
/// clear error when there is none.
#[tokio::test]
async fn cluster_id_comes_from_the_cluster_property() -> anyhow::Result<()> {
    use dataplane_agent::roles::kube::{KubeModeError, cluster_id_from_property};
    let srv = FakeApiServer::start().await?;
    assert!(matches!(
        cluster_id_from_property(srv.client()).await,
        Err(KubeModeError::NoClusterId)
    ));
    srv.put(
        &json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
        "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": "east"}}),
    );
    assert_eq!(
        cluster_id_from_property(srv.client()).await?,
        cluster("east")
    );
    srv.put(
        &json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
        "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": "Not_A_Label"}}),
    );
    assert!(matches!(
        cluster_id_from_property(srv.client()).await,
        Err(KubeModeError::BadClusterId(_))
    ));
    Ok(())
}
