//! Tests of the fake API server with the real kube client, kube-runtime watchers and
//! reflectors, kube-lease-manager, and of the tower-test request verifier.

use std::{collections::BTreeMap, time::Duration};

use dataplane_core::{
    fixtures::{endpoint, export, import, labels, local_slice, service},
    model::{ServiceExport, ServiceExportSpec, ServiceExportStatus, ServiceImport, v1alpha1},
};
use futures::{Stream, StreamExt};
use http::{Method, StatusCode};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{ObjectReference, Pod, Service},
        discovery::v1::EndpointSlice,
        events::v1::Event as K8sEvent,
    },
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::{
    Api, Client, ResourceExt,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
        PostParams, WatchEvent, WatchParams,
    },
    runtime::{
        WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        reflector, watcher,
    },
};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseParams};
use serde_json::{Value, json};
use tests::{
    fake_apiserver::{FakeApiServer, Options},
    fixtures::{APPLY_PATCH, ExpectedRequest, JSON, MERGE_PATCH, eventually, mock_client},
};

const WAIT: Duration = Duration::from_secs(15);

fn api_code(res: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match res {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn condition(type_: &str, status: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: "Test".into(),
        message: String::new(),
        observed_generation: Some(1),
        last_transition_time: Time("2026-01-01T00:00:00Z".parse().expect("timestamp")),
    }
}

/// A Service with these labels and one unnamed port, 80.
fn labelled_service(ns: &str, name: &str, labels: &[(&str, &str)]) -> Service {
    service(ns, name).labels(labels).port(("", 80)).build()
}

/// A slice of `demo/<service>` with one endpoint.
fn one_endpoint_slice(name: &str, service: &str, ip: &str) -> EndpointSlice {
    local_slice("demo", name, service)
        .endpoint(endpoint(ip))
        .build()
}

fn rv(meta_rv: &Option<String>) -> u64 {
    meta_rv
        .as_deref()
        .and_then(|s| s.parse().ok())
        .expect("numeric resourceVersion")
}

async fn next<T>(stream: &mut (impl Stream<Item = T> + Unpin)) -> T {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event within the timeout")
        .expect("the stream goes on")
}

/// Next watcher event, as a short description: "Init", "InitApply(name)", "Apply(name)", ...
async fn next_watcher_event<K: kube::Resource>(
    stream: &mut (impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin),
) -> String {
    match next(stream).await.expect("no watcher error") {
        watcher::Event::Init => "Init".into(),
        watcher::Event::InitApply(o) => format!("InitApply({})", o.name_any()),
        watcher::Event::InitDone => "InitDone".into(),
        watcher::Event::Apply(o) => format!("Apply({})", o.name_any()),
        watcher::Event::Delete(o) => format!("Delete({})", o.name_any()),
    }
}

/// name -> resourceVersion of what a reflector holds and of what the server holds.
fn store_versions<K: kube::Resource<DynamicType = ()> + Clone>(
    store: &reflector::Store<K>,
) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .map(|o| (o.name_any(), o.resource_version().unwrap_or_default()))
        .collect()
}

fn server_versions<K>(srv: &FakeApiServer) -> BTreeMap<String, String>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    srv.list::<K>()
        .iter()
        .map(|o| (o.name_any(), o.resource_version().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn crud_round_trip_and_optimistic_concurrency() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    let api: Api<ServiceExport> = Api::namespaced(srv.client(), "demo");

    let mut se = ServiceExport::new("web", ServiceExportSpec::default());
    se.spec.exported_labels = labels(&[("team", "a")]);
    se.status = Some(ServiceExportStatus {
        conditions: vec![condition("Valid", "True")],
    });
    let created = api.create(&PostParams::default(), &se).await?;
    assert_eq!(
        created.metadata.namespace.as_deref(),
        Some("demo"),
        "namespace from the path"
    );
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created.status, None,
        "create ignores status of a kind with a status subresource"
    );
    assert_eq!(
        rv(&created.metadata.resource_version),
        srv.resource_version()
    );

    assert_eq!(
        api_code(api.create(&PostParams::default(), &se).await),
        (409, "AlreadyExists".into())
    );
    assert_eq!(api.get("web").await?, created);

    let mut changed = created.clone();
    changed.spec.exported_labels = labels(&[("team", "b")]);
    let replaced = api.replace("web", &PostParams::default(), &changed).await?;
    assert_eq!(
        replaced.metadata.generation,
        Some(2),
        "a spec change bumps generation"
    );
    assert!(rv(&replaced.metadata.resource_version) > rv(&created.metadata.resource_version));
    assert_eq!(replaced.metadata.uid, created.metadata.uid);
    assert_eq!(
        replaced.metadata.creation_timestamp,
        created.metadata.creation_timestamp
    );

    // `changed` still carries the old resourceVersion.
    assert_eq!(
        api_code(api.replace("web", &PostParams::default(), &changed).await),
        (409, "Conflict".into())
    );

    let deleted = api.delete("web", &DeleteParams::default()).await?;
    assert!(
        deleted.right().is_some_and(|s| s.is_success()),
        "immediate deletion returns a Success Status"
    );
    assert_eq!(api_code(api.get("web").await), (404, "NotFound".into()));
    assert_eq!(
        api_code(api.delete("web", &DeleteParams::default()).await),
        (404, "NotFound".into())
    );
    assert!(srv.get::<ServiceExport>("demo", "web").is_none());
    Ok(())
}

#[tokio::test]
async fn status_subresource_separates_spec_and_status() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    let api: Api<ServiceExport> = Api::namespaced(srv.client(), "demo");
    let created = api
        .create(
            &PostParams::default(),
            &ServiceExport::new("web", Default::default()),
        )
        .await?;

    // The main resource ignores status: writing only status there is a no-op (same version).
    let mut with_status = created.clone();
    with_status.status = Some(ServiceExportStatus {
        conditions: vec![condition("Valid", "True")],
    });
    let same = api
        .replace("web", &PostParams::default(), &with_status)
        .await?;
    assert_eq!(same.status, None);
    assert_eq!(
        same.metadata.resource_version,
        created.metadata.resource_version
    );

    // /status ignores everything but status.
    with_status.spec.exported_labels = labels(&[("ignored", "yes")]);
    let st = api
        .replace_status("web", &PostParams::default(), &with_status)
        .await?;
    assert_eq!(st.status, with_status.status);
    assert!(st.spec.exported_labels.is_empty());
    assert_eq!(
        st.metadata.generation,
        Some(1),
        "status changes do not bump generation"
    );

    let patch = json!({"status": {"conditions": [condition("Ready", "False")]}, "spec": {"exportedLabels": {"x": "y"}}});
    let st = api
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let types: Vec<_> = st
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(types, ["Ready"], "a merge patch replaces lists");
    assert!(st.spec.exported_labels.is_empty());

    let main = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": null, "spec": {"exportedLabels": {"x": "y"}}})),
        )
        .await?;
    assert_eq!(
        main.status, st.status,
        "the main resource's PATCH ignores status"
    );
    assert_eq!(main.spec.exported_labels, labels(&[("x", "y")]));
    assert_eq!(main.metadata.generation, Some(2));

    // Leases have no status subresource.
    let leases: Api<Lease> = Api::namespaced(srv.client(), "demo");
    leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "l"}}))?,
        )
        .await?;
    assert_eq!(api_code(leases.get_status("l").await).0, 404);
    Ok(())
}

#[tokio::test]
async fn server_side_apply_tracks_field_managers() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    let api: Api<Service> = Api::namespaced(srv.client(), "demo");
    let apply = |labels: Value| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "labels": labels}, "spec": {"ports": [{"port": 80}]}});
    let owners = |svc: &Service, label: &str| -> Vec<String> {
        svc.managed_fields()
            .iter()
            .filter(|m| {
                m.fields_v1.as_ref().is_some_and(|f| {
                    f.0.pointer(&format!("/f:metadata/f:labels/f:{label}"))
                        .is_some()
                })
            })
            .filter_map(|m| m.manager.clone())
            .collect()
    };

    let created = api
        .patch(
            "web",
            &PatchParams::apply("agent-a"),
            &Patch::Apply(apply(json!({"app": "web", "tier": "fe"}))),
        )
        .await?;
    assert_eq!(
        created.labels(),
        &labels(&[("app", "web"), ("tier", "fe")]),
        "apply creates a missing object"
    );
    assert_eq!(owners(&created, "app"), ["agent-a"]);
    let req = srv
        .requests()
        .into_iter()
        .find(|r| r.method == Method::PATCH)
        .expect("the apply request");
    ExpectedRequest::new(Method::PATCH, "/api/v1/namespaces/demo/services/web")
        .query("fieldManager", "agent-a")
        .content_type(APPLY_PATCH)
        .json_body(apply(json!({"app": "web", "tier": "fe"})))
        .check(&req)?;

    // Another manager changing an owned field conflicts unless forced.
    let err = api
        .patch(
            "web",
            &PatchParams::apply("agent-b"),
            &Patch::Apply(apply(json!({"app": "other"}))),
        )
        .await;
    let Err(kube::Error::Api(status)) = err else {
        panic!("expected a conflict, got {err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains("agent-a") && status.message.contains(".metadata.labels.app"),
        "{}",
        status.message
    );

    // Applying the same value is no conflict: the field becomes shared.
    let shared = api
        .patch(
            "web",
            &PatchParams::apply("agent-b"),
            &Patch::Apply(apply(json!({"app": "web"}))),
        )
        .await?;
    assert_eq!(owners(&shared, "app"), ["agent-a", "agent-b"]);

    let forced = api
        .patch(
            "web",
            &PatchParams::apply("agent-b").force(),
            &Patch::Apply(apply(json!({"app": "b"}))),
        )
        .await?;
    assert_eq!(forced.labels()["app"], "b");
    assert_eq!(
        owners(&forced, "app"),
        ["agent-b"],
        "force takes the field over"
    );
    assert_eq!(
        srv.requests()
            .last()
            .and_then(|r| r.param("force"))
            .as_deref(),
        Some("true")
    );

    // agent-a stops applying its labels: "tier" (only its own) goes, "app" (agent-b's) stays.
    let pruned = api
        .patch(
            "web",
            &PatchParams::apply("agent-a"),
            &Patch::Apply(apply(json!({}))),
        )
        .await?;
    assert_eq!(pruned.labels(), &labels(&[("app", "b")]));

    // Re-applying the same intent changes nothing: same resourceVersion, no watch event.
    let again = api
        .patch(
            "web",
            &PatchParams::apply("agent-a"),
            &Patch::Apply(apply(json!({}))),
        )
        .await?;
    assert_eq!(again.resource_version(), pruned.resource_version());
    let writes = srv.requests().iter().filter(|r| r.is_write()).count();
    assert_eq!(writes, 6, "every apply above is exactly one request");

    // Apply needs a field manager; force is for apply only.
    let raw = |ct: &str, query: &str| {
        http::Request::patch(format!("/api/v1/namespaces/demo/services/web?{query}"))
            .header(http::header::CONTENT_TYPE, ct)
            .body(serde_json::to_vec(&apply(json!({}))).expect("json"))
            .expect("request")
    };
    let client = srv.client();
    assert_eq!(
        api_code(client.request::<Value>(raw(APPLY_PATCH, "")).await).0,
        422
    );
    assert_eq!(
        api_code(
            client
                .request::<Value>(raw(MERGE_PATCH, "force=true"))
                .await
        )
        .0,
        422
    );
    Ok(())
}

#[tokio::test]
async fn merge_strategic_and_json_patches() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    srv.put(&labelled_service(
        "demo",
        "web",
        &[("app", "web"), ("old", "x")],
    ));
    let api: Api<Service> = Api::namespaced(srv.client(), "demo");

    let merged = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"old": null, "new": "y"}}})),
        )
        .await?;
    assert_eq!(merged.labels(), &labels(&[("app", "web"), ("new", "y")]));

    let strategic = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ports": [{"port": 8080}]}})),
        )
        .await?;
    let ports: Vec<i32> = strategic
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [8080]);

    let stale =
        json!({"metadata": {"resourceVersion": merged.resource_version(), "labels": {"z": "1"}}});
    assert_eq!(
        api_code(
            api.patch("web", &PatchParams::default(), &Patch::Merge(stale))
                .await
        ),
        (409, "Conflict".into())
    );

    // kube is built without its `jsonpatch` feature, so send the JSON patch by hand.
    let json_patch = |ops: Value| {
        http::Request::patch("/api/v1/namespaces/demo/services/web")
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(serde_json::to_vec(&ops).expect("json"))
            .expect("request")
    };
    let client = srv.client();
    let patched: Service = client
        .request(json_patch(
            json!([{"op": "test", "path": "/metadata/labels/app", "value": "web"},
            {"op": "replace", "path": "/metadata/labels/app", "value": "api"}]),
        ))
        .await?;
    assert_eq!(patched.labels()["app"], "api");
    let failed = client
        .request::<Service>(json_patch(
            json!([{"op": "test", "path": "/metadata/labels/app", "value": "web"}]),
        ))
        .await;
    assert_eq!(api_code(failed).0, 422);

    assert_eq!(
        api_code(
            api.patch("missing", &PatchParams::default(), &Patch::Merge(json!({})))
                .await
        )
        .0,
        404
    );
    Ok(())
}

#[tokio::test]
async fn lists_select_by_labels_fields_namespace_version_and_scope() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    srv.put(&labelled_service(
        "a",
        "web",
        &[("app", "web"), ("tier", "fe")],
    ));
    srv.put(&labelled_service("a", "db", &[("app", "db")]));
    srv.put(&labelled_service("b", "web", &[("app", "web")]));
    let client = srv.client();

    let names = |list: kube::core::ObjectList<Service>| -> Vec<String> {
        list.items
            .iter()
            .map(|s| format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()))
            .collect()
    };
    let all: Api<Service> = Api::all(client.clone());
    let in_a: Api<Service> = Api::namespaced(client.clone(), "a");
    let list = all.list(&ListParams::default()).await?;
    assert_eq!(
        list.metadata.resource_version,
        Some(srv.resource_version().to_string())
    );
    assert_eq!(names(list), ["a/db", "a/web", "b/web"]);
    assert_eq!(
        names(in_a.list(&ListParams::default()).await?),
        ["a/db", "a/web"]
    );
    for (selector, want) in [
        ("app=web", vec!["a/web", "b/web"]),
        ("app!=web", vec!["a/db"]),
        ("app==web,tier", vec!["a/web"]),
        ("!tier", vec!["a/db", "b/web"]),
        ("app in (db,web),tier notin (fe)", vec!["a/db", "b/web"]),
    ] {
        assert_eq!(
            names(all.list(&ListParams::default().labels(selector)).await?),
            want,
            "{selector}"
        );
    }
    assert_eq!(
        names(
            all.list(&ListParams::default().fields("metadata.namespace=b"))
                .await?
        ),
        ["b/web"]
    );
    assert_eq!(
        names(
            in_a.list(&ListParams::default().fields("metadata.name!=web"))
                .await?
        ),
        ["a/db"]
    );
    assert_eq!(
        api_code(all.list(&ListParams::default().labels("a b")).await),
        (400, "BadRequest".into())
    );

    // v1alpha1 and v1beta1 ServiceExports are one store, served in the version asked for.
    let beta: Api<ServiceExport> = Api::namespaced(client.clone(), "a");
    beta.create(
        &PostParams::default(),
        &ServiceExport::new("web", Default::default()),
    )
    .await?;
    let alpha: Api<v1alpha1::ServiceExport> = Api::namespaced(client.clone(), "a");
    assert_eq!(alpha.get("web").await?.name_any(), "web");
    let gvk = GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ServiceExport");
    let dynamic: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "a",
        &ApiResource::from_gvk_with_plural(&gvk, "serviceexports"),
    );
    let listed = dynamic.list(&ListParams::default()).await?;
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.items[0]
            .types
            .as_ref()
            .map(|t| t.api_version.as_str()),
        Some("multicluster.x-k8s.io/v1alpha1")
    );

    // A cluster-scoped kind: no namespace, and no namespaced paths.
    let gvk = GroupVersionKind::gvk("about.k8s.io", "v1alpha1", "ClusterProperty");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "clusterproperties");
    let props: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut prop = DynamicObject::new("cluster.clusterset.k8s.io", &ar);
    prop.data = json!({"spec": {"value": "east"}});
    let created = props.create(&PostParams::default(), &prop).await?;
    assert_eq!(created.metadata.namespace, None);
    assert_eq!(
        props.get("cluster.clusterset.k8s.io").await?.data["spec"]["value"],
        "east"
    );
    assert_eq!(
        srv.list_json("about.k8s.io/v1alpha1", "ClusterProperty")
            .len(),
        1
    );
    let namespaced: Api<DynamicObject> = Api::namespaced_with(client.clone(), "a", &ar);
    assert_eq!(
        api_code(namespaced.list(&ListParams::default()).await).0,
        404
    );

    // Kinds that are not registered are not found, like a CRD that is not installed.
    assert_eq!(
        api_code(Api::<Pod>::all(client).list(&ListParams::default()).await).0,
        404
    );
    Ok(())
}

#[tokio::test]
async fn lists_page_with_limit_and_continue() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    for name in ["a", "b", "c", "d", "e"] {
        srv.put(&labelled_service("n", name, &[]));
    }
    let api: Api<Service> = Api::all(srv.client());
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut params = ListParams::default().limit(2);
    loop {
        let page = api.list(&params).await?;
        pages += 1;
        assert!(page.items.len() <= 2, "a page holds at most `limit` items");
        seen.extend(page.items.iter().map(ResourceExt::name_any));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);
    // metadata-only lists page the same way (what the member probe sends).
    let one = api.list_metadata(&ListParams::default().limit(1)).await?;
    assert_eq!(one.items.len(), 1);
    assert_eq!(one.metadata.continue_.as_deref(), Some("n/a"));
    assert_eq!(
        api_code(api.list(&ListParams::default().continue_token("x")).await).0,
        400
    );
    Ok(())
}

#[tokio::test]
async fn watcher_sees_initial_list_then_changes() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    srv.put(&export("demo", "b").build());
    srv.put(&export("demo", "a").build());
    srv.put(&export("elsewhere", "other-ns").build());
    let listed_at = srv.resource_version().to_string();
    let api: Api<ServiceExport> = Api::namespaced(srv.client(), "demo");
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();

    for want in ["Init", "InitApply(a)", "InitApply(b)", "InitDone"] {
        assert_eq!(next_watcher_event(&mut events).await, want);
    }
    api.create(
        &PostParams::default(),
        &ServiceExport::new("c", Default::default()),
    )
    .await?;
    assert_eq!(next_watcher_event(&mut events).await, "Apply(c)");
    let status = json!({"status": {"conditions": [condition("Valid", "True")]}});
    api.patch_status("c", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    assert_eq!(next_watcher_event(&mut events).await, "Apply(c)");
    srv.put(&export("elsewhere", "x").build());
    api.delete("c", &DeleteParams::default()).await?;
    assert_eq!(
        next_watcher_event(&mut events).await,
        "Delete(c)",
        "other namespaces are filtered out"
    );

    // What the real watcher asked for: a list, then a watch from the list's version.
    let reqs = srv.requests();
    let list = reqs
        .iter()
        .find(|r| r.method == Method::GET && !r.is_watch())
        .expect("a list");
    assert_eq!(
        list.path,
        "/apis/multicluster.x-k8s.io/v1beta1/namespaces/demo/serviceexports"
    );
    assert_eq!(list.param("limit").as_deref(), Some("500"));
    let watch = reqs.iter().find(|r| r.is_watch()).expect("a watch");
    assert_eq!(watch.param("allowWatchBookmarks").as_deref(), Some("true"));
    assert_eq!(watch.param("resourceVersion"), Some(listed_at));
    Ok(())
}

#[tokio::test]
async fn streaming_list_watcher_is_supported() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    srv.put(&one_endpoint_slice("web-1", "web", "10.0.0.1"));
    srv.put(&one_endpoint_slice("db-1", "db", "10.0.0.2"));
    let api: Api<EndpointSlice> = Api::namespaced(srv.client(), "demo");
    let config = watcher::Config::default()
        .streaming_lists()
        .labels("kubernetes.io/service-name=web");
    let mut events = watcher(api, config).boxed();
    for want in ["Init", "InitApply(web-1)", "InitDone"] {
        assert_eq!(next_watcher_event(&mut events).await, want);
    }
    srv.put(&one_endpoint_slice("web-2", "web", "10.0.0.3"));
    assert_eq!(next_watcher_event(&mut events).await, "Apply(web-2)");
    let first = srv.requests().into_iter().next().expect("a request");
    assert!(first.is_watch(), "no list call with streaming lists");
    assert_eq!(first.param("sendInitialEvents").as_deref(), Some("true"));
    assert_eq!(
        first.param("resourceVersionMatch").as_deref(),
        Some("NotOlderThan")
    );
    Ok(())
}

#[tokio::test]
async fn raw_watch_protocol() -> anyhow::Result<()> {
    let options = Options {
        history_limit: 3,
        ..Options::default()
    };
    let srv = FakeApiServer::start_with(options).await?;
    let api: Api<Service> = Api::namespaced(srv.client(), "demo");
    let start = srv.resource_version().to_string();

    // Selector transitions: relabelling into the selector is ADDED, out of it DELETED, and
    // changes the watch never sees still move its version on through BOOKMARKs.
    let mut stream = api
        .watch(&WatchParams::default().labels("app=web"), &start)
        .await?
        .boxed();
    srv.put(&labelled_service("demo", "svc", &[("app", "db")]));
    let hidden = srv.resource_version();
    match next(&mut stream).await? {
        WatchEvent::Bookmark(b) => assert!(b.metadata.resource_version.parse::<u64>()? >= hidden),
        other => panic!("expected a bookmark, got {other:?}"),
    }
    api.patch(
        "svc",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await?;
    assert!(matches!(next(&mut stream).await?, WatchEvent::Added(s) if s.name_any() == "svc"));
    api.patch(
        "svc",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await?;
    match next(&mut stream).await? {
        WatchEvent::Deleted(s) => {
            assert_eq!(
                s.labels()["app"],
                "web",
                "DELETED carries the last matching content"
            );
            assert_eq!(
                s.resource_version(),
                Some(srv.resource_version().to_string())
            );
        }
        other => panic!("expected DELETED, got {other:?}"),
    }
    drop(stream);

    // Only the last 3 changes are kept: resuming from before them is 410 Gone.
    for i in 0..3 {
        srv.put(&labelled_service("demo", &format!("s{i}"), &[]));
    }
    let mut stale = api.watch(&WatchParams::default(), &start).await?.boxed();
    match next(&mut stale).await? {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
    assert!(
        tokio::time::timeout(WAIT, stale.next()).await?.is_none(),
        "the stream ends after 410"
    );

    // timeoutSeconds ends the stream.
    let rv = srv.resource_version().to_string();
    let mut short = api
        .watch(&WatchParams::default().timeout(1).disable_bookmarks(), &rv)
        .await?
        .boxed();
    assert!(tokio::time::timeout(WAIT, short.next()).await?.is_none());
    Ok(())
}

/// A reflector over `api` with the default backoff, running in the background.
struct Reflector<K: kube::Resource<DynamicType = ()> + 'static> {
    store: reflector::Store<K>,
    /// How many errors the watcher has yielded so far (it retries after each).
    errors: tokio::sync::watch::Receiver<usize>,
}

async fn start_reflector<K>(api: Api<K>, config: watcher::Config) -> anyhow::Result<Reflector<K>>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let (errors_tx, errors) = tokio::sync::watch::channel(0);
    let stream = watcher(api, config).default_backoff().reflect(writer);
    tokio::spawn(stream.for_each(move |res| {
        if res.is_err() {
            errors_tx.send_modify(|n| *n += 1);
        }
        async {}
    }));
    tokio::time::timeout(WAIT, store.wait_until_ready()).await??;
    Ok(Reflector { store, errors })
}

#[tokio::test]
async fn reflector_relists_and_converges_after_restart() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    for i in 0..5 {
        srv.put(&one_endpoint_slice(
            &format!("web-{i}"),
            "web",
            &format!("10.0.0.{i}"),
        ));
    }
    let api: Api<EndpointSlice> = Api::namespaced(srv.client(), "demo");
    let Reflector { store, mut errors } = start_reflector(
        api,
        watcher::Config::default().labels("kubernetes.io/service-name"),
    )
    .await?;
    eventually(WAIT, "the initial list is in the store", || {
        (store.state().len() == 5).then_some(())
    })
    .await?;

    srv.clear_requests();
    srv.restart().await;
    // Changes right after the restart, racing the watcher's reconnect, must not be lost.
    srv.put(&one_endpoint_slice("web-0", "web", "10.0.1.0"));
    srv.delete::<EndpointSlice>("demo", "web-1");
    srv.put(&one_endpoint_slice("web-5", "web", "10.0.0.5"));
    eventually(WAIT, "the reflector matches the server", || {
        (store_versions(&store) == server_versions::<EndpointSlice>(&srv)).then_some(())
    })
    .await?;
    assert!(
        *errors.borrow_and_update() >= 1,
        "the resumed watch got 410 Gone"
    );
    let reqs = srv.requests();
    assert!(
        reqs.iter()
            .any(|r| r.method == Method::GET && !r.is_watch()),
        "the watcher re-listed: {reqs:#?}"
    );

    // And it keeps watching afterwards.
    srv.put(&one_endpoint_slice("web-6", "web", "10.0.0.6"));
    eventually(WAIT, "web-6 arrives", || {
        store
            .state()
            .iter()
            .any(|s| s.name_any() == "web-6")
            .then_some(())
    })
    .await?;
    assert_eq!(
        store_versions(&store),
        server_versions::<EndpointSlice>(&srv)
    );
    Ok(())
}

#[tokio::test]
async fn reflector_recovers_after_stop_and_resume() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    let mut import = import("demo", "web").port(("", 80)).build();
    srv.put(&import);
    let api: Api<ServiceImport> = Api::namespaced(srv.client(), "demo");
    let Reflector { store, mut errors } =
        start_reflector(api.clone(), watcher::Config::default()).await?;
    eventually(WAIT, "web is in the store", || {
        (store.state().len() == 1).then_some(())
    })
    .await?;

    srv.stop().await;
    let down = api.list(&ListParams::default()).await;
    assert!(
        matches!(down, Err(ref e) if !matches!(e, kube::Error::Api(_))),
        "connection refused, got {down:?}"
    );
    // The cut watch cannot be re-established while the server is down.
    tokio::time::timeout(WAIT, errors.wait_for(|n| *n >= 1)).await??;
    // The store changes while the server is down.
    import.spec.ips = vec!["241.0.0.1".into()];
    srv.put(&import);
    import.metadata.name = Some("db".into());
    srv.put(&import);
    srv.clear_requests();
    srv.resume().await?;

    eventually(WAIT, "the reflector matches the server", || {
        (store_versions(&store) == server_versions::<ServiceImport>(&srv)).then_some(())
    })
    .await?;
    let web = store
        .state()
        .into_iter()
        .find(|s| s.name_any() == "web")
        .expect("web");
    assert_eq!(web.spec.ips, ["241.0.0.1"]);
    // stop() keeps the history, so the watcher resumed its watch without re-listing.
    let reqs = srv.requests();
    assert!(
        !reqs.is_empty() && reqs.iter().all(|r| r.is_watch()),
        "{reqs:#?}"
    );
    Ok(())
}

async fn lease_manager(client: Client, identity: &str) -> anyhow::Result<LeaseManager> {
    Ok(LeaseManagerBuilder::new(client, "dataplane-leader")
        .with_namespace("demo")
        .with_parameters(LeaseParams::new(identity, 3, 2))
        .build()
        .await?)
}

fn holder(srv: &FakeApiServer) -> Option<String> {
    srv.get::<Lease>("demo", "dataplane-leader")?
        .spec?
        .holder_identity
}

#[tokio::test]
async fn lease_manager_hands_over_only_after_release() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    let (mut a, a_task) = lease_manager(srv.client(), "node-a").await?.watch().await;
    tokio::time::timeout(WAIT, a.wait_for(|leader| *leader)).await??;
    assert_eq!(holder(&srv).as_deref(), Some("node-a"));

    let (mut b, b_task) = lease_manager(srv.client(), "node-b").await?.watch().await;
    // Two renewals by node-a span more than one lease duration; node-b must stay a follower.
    for round in 0..2 {
        let before = srv
            .get::<Lease>("demo", "dataplane-leader")
            .and_then(|l| l.spec?.renew_time);
        srv.wait_until(WAIT, "node-a renews", |s| {
            let lease = s
                .get::<Lease>("demo", "dataplane-leader")
                .and_then(|l| l.spec);
            lease.is_some_and(|l| {
                l.renew_time != before && l.holder_identity.as_deref() == Some("node-a")
            })
        })
        .await?;
        assert!(
            !*b.borrow(),
            "node-b must not lead while node-a holds the lease (round {round})"
        );
    }

    drop(a); // closing the channel makes the manager release the lease
    tokio::time::timeout(WAIT, a_task).await???;
    tokio::time::timeout(WAIT, b.wait_for(|leader| *leader)).await??;
    assert_eq!(holder(&srv).as_deref(), Some("node-b"));

    let applies: Vec<_> = srv
        .requests()
        .into_iter()
        .filter(|r| r.content_type.as_deref() == Some(APPLY_PATCH))
        .collect();
    let managers: Vec<_> = applies
        .iter()
        .filter_map(|r| r.param("fieldManager"))
        .collect();
    assert!(
        managers.contains(&"kube-lease-manager-node-a".to_string()),
        "{managers:?}"
    );
    assert!(
        managers.contains(&"kube-lease-manager-node-b".to_string()),
        "{managers:?}"
    );
    drop(b);
    tokio::time::timeout(WAIT, b_task).await???;
    Ok(())
}

#[tokio::test]
async fn lease_manager_takes_over_only_after_expiry() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    let (mut a, a_task) = lease_manager(srv.client(), "node-a").await?.watch().await;
    tokio::time::timeout(WAIT, a.wait_for(|leader| *leader)).await??;
    a_task.abort(); // node-a crashes without releasing
    let _ = a_task.await;
    let spec = srv
        .get::<Lease>("demo", "dataplane-leader")
        .and_then(|l| l.spec)
        .expect("lease spec");
    let renewed = spec.renew_time.expect("renewTime").0;
    let expires = std::time::SystemTime::from(renewed)
        + Duration::from_secs(spec.lease_duration_seconds.expect("duration") as u64);

    let (mut b, b_task) = lease_manager(srv.client(), "node-b").await?.watch().await;
    tokio::time::timeout(WAIT, b.wait_for(|leader| *leader)).await??;
    assert!(
        std::time::SystemTime::now() >= expires,
        "node-b led before node-a's lease expired"
    );
    assert_eq!(holder(&srv).as_deref(), Some("node-b"));
    drop(b);
    tokio::time::timeout(WAIT, b_task).await???;
    Ok(())
}

#[tokio::test]
async fn event_recorder_creates_then_patches_events() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    let reporter = Reporter {
        controller: "dataplane-agent".into(),
        instance: Some("node-a".into()),
    };
    let recorder = Recorder::new(srv.client(), reporter);
    let regarding = ObjectReference {
        api_version: Some("multicluster.x-k8s.io/v1beta1".into()),
        kind: Some("ServiceExport".into()),
        name: Some("web".into()),
        namespace: Some("demo".into()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: "Conflict".into(),
        note: Some("ports differ".into()),
        action: "Export".into(),
        secondary: None,
    };
    recorder.publish(&event, &regarding).await?;
    recorder.publish(&event, &regarding).await?;
    let events: Vec<K8sEvent> = srv.list();
    assert_eq!(
        events.len(),
        1,
        "the repeat becomes a series on the same event"
    );
    assert_eq!(events[0].series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(events[0].reason.as_deref(), Some("Conflict"));
    let methods: Vec<_> = srv
        .requests()
        .iter()
        .map(|r| r.method.to_string())
        .collect();
    assert_eq!(methods, ["POST", "PATCH"]);
    Ok(())
}

#[tokio::test]
async fn finalizers_delay_deletion() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    let api: Api<ServiceExport> = Api::namespaced(srv.client(), "demo");
    let mut se = ServiceExport::new("web", Default::default());
    se.metadata.finalizers = Some(vec!["mcs.x-k8s.io/cleanup".into()]);
    api.create(&PostParams::default(), &se).await?;
    let pending = api.delete("web", &DeleteParams::default()).await?;
    let obj = pending.left().expect("the object, still there");
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert!(api.get("web").await?.metadata.deletion_timestamp.is_some());
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    assert_eq!(
        api_code(api.get("web").await).0,
        404,
        "gone once the last finalizer is removed"
    );
    Ok(())
}

#[tokio::test]
async fn malformed_requests_get_status_errors() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    srv.put(&labelled_service("demo", "web", &[]));
    let client = srv.client();
    const SVCS: &str = "/api/v1/namespaces/demo/services";
    const WEB: &str = "/api/v1/namespaces/demo/services/web";
    const JSON_PATCH: &str = "application/json-patch+json";
    let cases: [(Method, String, &str, &str, u16); 10] = [
        (Method::POST, SVCS.into(), JSON, "{not json", 400),
        (Method::POST, SVCS.into(), JSON, "[1]", 400),
        (Method::PATCH, WEB.into(), "text/plain", "{}", 415),
        (
            Method::PATCH,
            WEB.into(),
            JSON_PATCH,
            r#"{"op":"add"}"#,
            400,
        ),
        (
            Method::PATCH,
            WEB.into(),
            JSON_PATCH,
            r#"[{"op":"add","path":"","value":1}]"#,
            422,
        ),
        (
            Method::GET,
            format!("{SVCS}?watch=true&resourceVersion=abc"),
            "",
            "",
            400,
        ),
        (
            Method::GET,
            format!("{SVCS}?watch=1&timeoutSeconds=-1"),
            "",
            "",
            400,
        ),
        (
            Method::GET,
            "/apis/nope.example/v1/things".into(),
            "",
            "",
            404,
        ),
        (Method::GET, format!("{WEB}/scale"), "", "", 404),
        (Method::DELETE, SVCS.into(), "", "", 405),
    ];
    for (method, uri, content_type, body, code) in cases {
        let what = format!("{method} {uri} {body}");
        let req = http::Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(body.as_bytes().to_vec())?;
        assert_eq!(
            api_code(client.request::<Value>(req).await).0,
            code,
            "{what}"
        );
    }
    // An absurd watch timeout is capped, not an overflow.
    let req = http::Request::get(format!("{SVCS}?watch=1&timeoutSeconds={}", u64::MAX))
        .body(kube::client::Body::empty())?;
    assert_eq!(client.send(req).await?.status(), StatusCode::OK);
    // Still serving, and the object is untouched.
    assert_eq!(
        client.apiserver_version().await?.git_version,
        "v1.33.0-fake"
    );
    assert_eq!(
        srv.get::<Service>("demo", "web").map(|s| s.labels().len()),
        Some(0)
    );
    Ok(())
}

/// The project-side code under test for the verifier demo: publish a ServiceExport condition
/// with server-side apply on the status subresource.
async fn publish_export_condition(
    client: Client,
    ns: &str,
    name: &str,
    cond: Condition,
) -> kube::Result<ServiceExport> {
    let api: Api<ServiceExport> = Api::namespaced(client, ns);
    let patch = json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "status": {"conditions": [cond]}});
    api.patch_status(
        name,
        &PatchParams::apply("dataplane-agent/node-a").force(),
        &Patch::Apply(&patch),
    )
    .await
}

#[tokio::test]
async fn verifier_checks_exact_ssa_status_patch() -> anyhow::Result<()> {
    let (client, mut verifier) = mock_client();
    let cond = condition("Valid", "True");
    let reconcile = tokio::spawn(publish_export_condition(
        client,
        "demo",
        "web",
        cond.clone(),
    ));

    let expected = ExpectedRequest::new(
        Method::PATCH,
        "/apis/multicluster.x-k8s.io/v1beta1/namespaces/demo/serviceexports/web/status",
    )
    .query("fieldManager", "dataplane-agent/node-a")
    .query("force", "true")
    .content_type(APPLY_PATCH)
    .json_body(
        json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
            "status": {"conditions": [cond]}}),
    );
    let mut answer = export("demo", "web").build();
    answer.status = Some(ServiceExportStatus {
        conditions: vec![cond.clone()],
    });
    let req = verifier
        .expect(&expected, StatusCode::OK, &serde_json::to_value(&answer)?)
        .await?;
    assert!(
        req.query.contains("fieldManager=dataplane-agent%2Fnode-a"),
        "percent-encoded on the wire"
    );

    let updated = reconcile.await??;
    assert_eq!(updated.status.map(|s| s.conditions), Some(vec![cond]));
    verifier.finish().await
}

#[tokio::test]
async fn verifier_reports_mismatches() -> anyhow::Result<()> {
    let (client, mut verifier) = mock_client();
    let reconcile = tokio::spawn(publish_export_condition(
        client,
        "demo",
        "web",
        condition("Valid", "False"),
    ));
    let expected = ExpectedRequest::new(
        Method::PATCH,
        "/apis/multicluster.x-k8s.io/v1beta1/namespaces/demo/serviceexports/web/status",
    )
    .query("fieldManager", "dataplane-agent/node-a")
    .content_type(MERGE_PATCH);
    let err = verifier
        .expect(&expected, StatusCode::OK, &json!({}))
        .await
        .expect_err("a mismatch");
    let msg = err.to_string();
    assert!(
        msg.contains("force") && msg.contains("content-type"),
        "{msg}"
    );
    // The client got a 500 Status instead of hanging.
    assert_eq!(api_code(reconcile.await?).0, 500);
    verifier.finish().await
}

#[tokio::test]
async fn typed_store_access_without_http() -> anyhow::Result<()> {
    let srv = FakeApiServer::start().await?;
    let stored = srv.put(&json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z"}, "status": {"loadBalancer": {}}}));
    assert_eq!(stored["metadata"]["namespace"], "default");
    assert_eq!(
        stored["metadata"]["creationTimestamp"], "2020-01-01T00:00:00Z",
        "kept for tests of ageing"
    );
    let svc: Service = srv.get("default", "web").expect("stored");
    assert_eq!(
        svc.metadata.resource_version,
        Some(srv.resource_version().to_string())
    );
    assert!(svc.status.is_some(), "put() writes status too");
    assert_eq!(srv.list::<Service>().len(), 1);
    assert!(srv.delete::<Service>("default", "web"));
    assert!(!srv.delete::<Service>("default", "web"));
    assert!(srv.get_json("v1", "Service", "default", "web").is_none());
    assert!(srv.requests().is_empty(), "no HTTP involved");
    Ok(())
}
