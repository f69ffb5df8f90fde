//! The controller writes a service only where its namespace exists (KEP-1645: the
//! ServiceImport exists in every cluster where the namespace exists), against fake API
//! servers: the local one (`east`) serves Namespaces and refuses writes into a missing one, as
//! a real API server does. The controller runs in-process.

use std::{sync::Arc, time::Duration};

use dataplane_agent::{
    roles::controller::{self, ControllerSettings},
    source::kube::AbortOnDrop,
    telemetry::metrics::Metrics,
};
use dataplane_core::{
    fixtures::{Port, cluster, endpoint, export, local_slice, service},
    merge::ClusterSetConfig,
    model::{ServiceExport, ServiceImport},
    policy::AddressPolicy,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ObjectMeta;
use tests::fake_apiserver::{FakeApiServer, Options};

const WAIT: Duration = Duration::from_secs(20);

/// `name` exported from `srv` in `ns`, one ready endpoint.
fn seed(srv: &FakeApiServer, ns: &str, name: &str, ip: &str) {
    srv.put(
        &service(ns, name)
            .type_("ClusterIP")
            .cluster_ip("10.96.0.10")
            .families(&["IPv4"])
            .port(Port::new("http", "TCP", 80).target_port(8080))
            .build(),
    );
    srv.put(&export(ns, name).created("2026-01-01T00:00:00Z").build());
    srv.put(
        &local_slice(ns, &format!("{name}-local"), name)
            .endpoints([endpoint(ip).conditions((Some(true), None, None))])
            .port(("http", "TCP", 8080))
            .build(),
    );
}

fn settings() -> Arc<ControllerSettings> {
    Arc::new(ControllerSettings {
        local: cluster("east"),
        clusterset: ClusterSetConfig::default(),
        unreachable_grace: Duration::from_secs(300),
        probe_interval: Duration::from_millis(100),
        identity: "east-agent".into(),
        policy: AddressPolicy::default(),
    })
}

/// East's controller, with east and west as members.
fn start_east(east: &FakeApiServer, west: &FakeApiServer, metrics: Arc<Metrics>) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(controller::run(
        settings(),
        vec![
            (cluster("east"), east.client()),
            (cluster("west"), west.client()),
        ],
        metrics,
    )))
}

/// A fake API server that serves Namespaces and refuses writes into a missing one.
async fn with_namespaces() -> anyhow::Result<FakeApiServer> {
    FakeApiServer::start_with(Options {
        namespaces: true,
        ..Options::default()
    })
    .await
}

fn namespace(name: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// The requests that wrote (or tried to write) into namespace `ns`.
fn writes_into(srv: &FakeApiServer, ns: &str) -> Vec<String> {
    srv.requests()
        .into_iter()
        .filter(|r| r.is_write() && r.path.contains(&format!("/namespaces/{ns}/")))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

/// `west` exports `web` in `shop`, which `east` does not have, and `api` in `default`, which it
/// has. East's controller imports `api`, writes nothing into `shop` (no write that could only
/// fail, none counted as failed), and imports `web` as soon as `shop` is created there.
#[tokio::test]
async fn a_service_is_imported_only_where_its_namespace_exists() -> anyhow::Result<()> {
    let east = with_namespaces().await?;
    east.put(&namespace("default"));
    let west = FakeApiServer::start().await?;
    seed(&west, "shop", "web", "10.2.0.1");
    seed(&west, "default", "api", "10.2.0.2");
    let metrics = Arc::new(Metrics::default());
    let _controller = start_east(&east, &west, metrics.clone());

    east.wait_until(WAIT, "api is imported", |s| {
        s.get::<ServiceImport>("default", "api").is_some()
    })
    .await?;
    // One more pass of the controller's: a change in west, imported into east.
    seed(&west, "default", "api", "10.2.0.3");
    east.wait_until(WAIT, "api's new endpoint is imported", |s| {
        s.requests()
            .iter()
            .filter(|r| r.is_write() && r.path.contains("/namespaces/default/endpointslices/"))
            .count()
            >= 2
    })
    .await?;
    assert_eq!(writes_into(&east, "shop"), Vec::<String>::new());
    let text = metrics.encode();
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("mcs_write_errors_total{")),
        "{text}"
    );

    east.put(&namespace("shop"));
    east.wait_until(WAIT, "web is imported once shop exists", |s| {
        s.get::<ServiceImport>("shop", "web").is_some()
    })
    .await?;
    assert!(east.get::<ServiceExport>("shop", "web").is_none());
    Ok(())
}

/// A terminating namespace takes no new import, but the conditions of a local ServiceExport in
/// it are still written: east's own export of `web` in `shop` has no Service (`Valid=False`,
/// `NoService`), while west exports `web` with endpoints.
#[tokio::test]
async fn a_terminating_namespace_gets_export_conditions_but_no_new_import() -> anyhow::Result<()> {
    let east = with_namespaces().await?;
    let mut shop = namespace("shop");
    shop.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    // Terminating, held by a finalizer: objects in it can be written, none created.
    shop.metadata.finalizers = Some(vec!["kubernetes".into()]);
    east.put(&shop);
    east.put(
        &export("shop", "web")
            .created("2026-01-02T00:00:00Z")
            .build(),
    );
    let west = FakeApiServer::start().await?;
    seed(&west, "shop", "web", "10.2.0.1");
    let _controller = start_east(&east, &west, Arc::default());

    east.wait_until(WAIT, "east's export says it has no Service", |s| {
        s.get::<ServiceExport>("shop", "web")
            .and_then(|e| e.status)
            .is_some_and(|st| {
                st.conditions
                    .iter()
                    .any(|c| c.type_ == "Valid" && c.status == "False" && c.reason == "NoService")
            })
    })
    .await?;
    let imports: Vec<String> = writes_into(&east, "shop")
        .into_iter()
        .filter(|w| w.contains("/serviceimports/") || w.contains("/endpointslices/"))
        .collect();
    assert_eq!(imports, Vec::<String>::new());
    Ok(())
}
