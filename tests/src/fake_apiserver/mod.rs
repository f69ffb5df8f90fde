//! An in-process fake kube-apiserver on 127.0.0.1 for tests of kube-rs clients, watchers,
//! reflectors, controllers and leader election, where no real API server can run.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use tests::fake_apiserver::FakeApiServer;
//! let server = FakeApiServer::start().await?;
//! let client = server.client();
//! // ... run the code under test with `client`, then assert on the store:
//! let svc: Option<k8s_openapi::api::core::v1::Service> = server.get("demo", "web");
//! // ... or on the exact requests it made:
//! assert!(server.requests().iter().all(|r| r.param("fieldManager").is_some() || !r.is_write()));
//! # Ok(()) }
//! ```
//!
//! What it implements: list (label and field selectors), watch (resourceVersion, bookmarks,
//! 410 Gone after compaction or `restart()`, `timeoutSeconds`, `sendInitialEvents` streaming
//! lists), get, create, update with optimistic concurrency, delete (preconditions, finalizers),
//! the `/status` subresource, merge / strategic-merge (as merge) / JSON patches and server-side
//! apply with field ownership (conflicts, `force`, removal of fields a manager stops applying).
//! [`FakeApiServer`] lists what it does not implement.

mod http;
mod select;
mod store;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use anyhow::Context as _;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};

use store::State;

/// A kind of object the server serves, addressed by group and plural (any version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    pub group: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    /// With a status subresource, writes to the main resource ignore `status` and writes to
    /// `/status` change only `status`.
    pub status_subresource: bool,
}

impl ResourceType {
    pub fn namespaced(group: &str, kind: &str, plural: &str) -> Self {
        Self {
            group: group.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
            status_subresource: false,
        }
    }

    pub fn cluster_scoped(group: &str, kind: &str, plural: &str) -> Self {
        Self {
            namespaced: false,
            ..Self::namespaced(group, kind, plural)
        }
    }

    pub fn with_status(self) -> Self {
        Self {
            status_subresource: true,
            ..self
        }
    }

    /// `plural.group`, as in API error messages.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The kinds served out of the box: what the MCS dataplane reads and writes.
    pub fn builtins() -> Vec<Self> {
        vec![
            Self::namespaced("", "Service", "services").with_status(),
            Self::namespaced("", "ConfigMap", "configmaps"),
            Self::namespaced("", "Event", "events"),
            Self::namespaced("discovery.k8s.io", "EndpointSlice", "endpointslices"),
            Self::namespaced("multicluster.x-k8s.io", "ServiceExport", "serviceexports")
                .with_status(),
            Self::namespaced("multicluster.x-k8s.io", "ServiceImport", "serviceimports")
                .with_status(),
            Self::namespaced("coordination.k8s.io", "Lease", "leases"),
            Self::namespaced("events.k8s.io", "Event", "events"),
            Self::cluster_scoped("about.k8s.io", "ClusterProperty", "clusterproperties"),
        ]
    }

    /// Namespaces, served with [`Options::namespaces`].
    pub fn namespace() -> Self {
        Self::cluster_scoped("", "Namespace", "namespaces")
    }
}

/// One HTTP request as the server received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: ::http::Method,
    pub path: String,
    /// The raw (percent-encoded) query string; see [`RecordedRequest::param`].
    pub query: String,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl RecordedRequest {
    /// The decoded value of a query parameter.
    pub fn param(&self, key: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    }

    /// All decoded query parameters, in order.
    pub fn params(&self) -> Vec<(String, String)> {
        form_urlencoded::parse(self.query.as_bytes())
            .into_owned()
            .collect()
    }

    /// The body parsed as JSON (apply bodies are JSON when sent by kube-rs).
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    pub fn is_watch(&self) -> bool {
        self.method == ::http::Method::GET
            && matches!(self.param("watch").as_deref(), Some("true" | "1"))
    }

    /// POST, PUT, PATCH or DELETE.
    pub fn is_write(&self) -> bool {
        use ::http::Method;
        [Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(&self.method)
    }
}

/// Tunables; `Options::default()` is what [`FakeApiServer::start`] uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many changes are kept for watches resuming from an older resourceVersion; a watch
    /// from before the oldest kept change gets 410 Gone.
    pub history_limit: usize,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK when changes it did
    /// not see (filtered out) moved the resourceVersion on.
    pub bookmark_interval: Duration,
    /// Serve Namespaces, and refuse writes into a namespace that has no Namespace object
    /// (404, as a real API server does). Off by default: namespaces are then not served at
    /// all (404 on their list), and any namespace takes objects.
    pub namespaces: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            history_limit: 10_000,
            bookmark_interval: Duration::from_millis(200),
            namespaces: false,
        }
    }
}

pub(crate) struct Shared {
    state: Mutex<State>,
    requests: Mutex<Vec<RecordedRequest>>,
    bookmark_interval: Duration,
    /// Plurals whose new requests get 403 Forbidden (see [`FakeApiServer::forbid`]).
    forbidden: Mutex<BTreeSet<String>>,
    /// Whether writes need their namespace to exist ([`Options::namespaces`]).
    pub(crate) namespaces: bool,
}

impl Shared {
    /// The state lock. A panic while holding it cannot leave the store half-written in a way
    /// that matters for tests, so a poisoned lock is simply taken over.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn is_forbidden(&self, plural: &str, watch: bool) -> bool {
        let forbidden = self
            .forbidden
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        forbidden.contains(plural) || (watch && forbidden.contains(&watch_key(plural)))
    }

    fn record(&self, rec: RecordedRequest) {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(rec);
    }
}

struct Serving {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The fake API server. Dropping it stops serving.
///
/// Not implemented: API discovery (`/api`, `/apis`; only `/version`), authentication and RBAC,
/// admission and schema validation or defaulting, consistent pagination (`limit`/`continue`
/// page by offset; later pages show the store as it is then), `resourceVersionMatch`/exact-version reads (lists and gets are
/// always current), strategic-merge list merging (lists are replaced; lists are atomic for
/// apply, which matches CRDs without `x-kubernetes-list-type`), `dryRun` (rejected with 400),
/// delete-collection, create-on-update for PUT, garbage collection / owner references,
/// namespace deletion (namespaces are objects only with [`Options::namespaces`], which refuses
/// writes into a namespace without one), version conversion beyond rewriting `apiVersion`, and protobuf / table
/// output. core/v1 and events.k8s.io/v1 Events are separate stores here.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    serving: Mutex<Option<Serving>>,
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    // So that resume() can take the same port back while old connections sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// How [`FakeApiServer::forbid_watches`] files a plural among the forbidden ones.
fn watch_key(plural: &str) -> String {
    format!("watch {plural}")
}

fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

impl FakeApiServer {
    /// Starts serving the [`ResourceType::builtins`] on `127.0.0.1` at a free port.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> anyhow::Result<Self> {
        let listener =
            bind(SocketAddr::from(([127, 0, 0, 1], 0))).context("binding 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let mut kinds = ResourceType::builtins();
        if options.namespaces {
            kinds.push(ResourceType::namespace());
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(kinds, options.history_limit)),
            requests: Mutex::new(Vec::new()),
            bookmark_interval: options.bookmark_interval,
            forbidden: Mutex::new(BTreeSet::new()),
            namespaces: options.namespaces,
        });
        let server = Self {
            shared,
            addr,
            serving: Mutex::new(None),
        };
        server.serve(listener);
        Ok(server)
    }

    fn serve(&self, listener: TcpListener) {
        let (shutdown, rx) = oneshot::channel();
        let task = tokio::spawn(http::serve(listener, self.shared.clone(), rx));
        *self.serving.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Serving { shutdown, task });
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig file's text pointing at this server (for agent processes).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{}\"}}\n\
             contexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\ncurrent-context: fake\n\
             users:\n- name: fake\n  user: {{}}\n",
            self.url()
        )
    }

    /// A kube client for this server, with default namespace `default`.
    pub fn client(&self) -> kube::Client {
        let url = self.url().parse().expect("the server URL is a valid URI");
        kube::Client::try_from(kube::Config::new(url)).expect("a plain-HTTP kube client builds")
    }

    /// Serves another group/plural (for example a CRD the project adds), any version.
    pub fn register(&self, resource: ResourceType) {
        self.shared.state().register(resource);
    }

    /// Simulates an API server restart that lost its watch cache: every open watch ends, the
    /// change history is dropped and the resourceVersion moves on, so a watcher resuming from
    /// its last version gets 410 Gone and must re-list. Objects are kept.
    pub async fn restart(&self) {
        self.shared.state().restart();
    }

    /// Simulates the API server going away: the port is closed (new connections are refused)
    /// and every open connection, watches included, is cut. Objects and history are kept; the
    /// store can still be changed directly while stopped.
    pub async fn stop(&self) {
        let serving = self
            .serving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(Serving { shutdown, task }) = serving {
            let _ = shutdown.send(());
            let _ = task.await;
        }
    }

    /// Serves again on the same address after [`stop`](Self::stop). Watches can resume from
    /// their last resourceVersion as long as it is still in the history.
    pub async fn resume(&self) -> anyhow::Result<()> {
        if self
            .serving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
        {
            return Ok(());
        }
        let listener = bind(self.addr).with_context(|| format!("re-binding {}", self.addr))?;
        self.serve(listener);
        Ok(())
    }

    /// Simulates revoked RBAC: new requests for `plural` (any group) get 403 Forbidden, while
    /// `/version` still answers. Like a real API server, watches already open go on.
    pub fn forbid(&self, plural: &str) {
        self.shared
            .forbidden
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(plural.to_owned());
    }

    /// Simulates RBAC (or a proxy) that allows lists of `plural` but not watches: new watch
    /// requests get 403 Forbidden.
    pub fn forbid_watches(&self, plural: &str) {
        self.forbid(&watch_key(plural));
    }

    /// Undoes [`forbid`](Self::forbid) and [`forbid_watches`](Self::forbid_watches).
    pub fn allow(&self, plural: &str) {
        let mut forbidden = self
            .shared
            .forbidden
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        forbidden.remove(plural);
        forbidden.remove(&watch_key(plural));
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn clear_requests(&self) {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The current (global) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.state().rv
    }

    fn resource(&self, api_version: &str, kind: &str) -> ResourceType {
        let (group, _) = split_api_version(api_version);
        self.shared
            .state()
            .resource_by_kind(group, kind)
            .unwrap_or_else(|| {
                panic!(
                    "{kind} in {api_version} is not served by the fake API server; register() it"
                )
            })
    }

    /// Creates or replaces an object directly in the store (no HTTP, no field manager, no
    /// subresource rules), sending the watch event a real write would. The object needs
    /// apiVersion, kind and metadata.name; a namespaced object without a namespace goes to
    /// `default`. A creationTimestamp, uid or generation it brings is kept. Returns the stored
    /// object.
    ///
    /// # Panics
    /// On an object without those fields or of a kind that is not served: a broken test setup.
    pub fn put<T: Serialize>(&self, obj: &T) -> Value {
        let obj = serde_json::to_value(obj).expect("the object serializes to JSON");
        let field = |p: &str| {
            obj.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("put(): the object has no {p}: {obj}"))
        };
        let rt = self.resource(field("/apiVersion"), field("/kind"));
        let ns = match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
            _ if !rt.namespaced => "",
            Some(ns) => ns,
            None => "default",
        };
        let (ns, name) = (ns.to_owned(), field("/metadata/name").to_owned());
        let api_version = field("/apiVersion").to_owned();
        http::present(&self.shared.state().put(&rt, &ns, &name, obj), &api_version)
    }

    /// An object as served at `api_version`; `namespace` is "" for cluster-scoped kinds.
    pub fn get_json(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        let rt = self.resource(api_version, kind);
        self.shared
            .state()
            .get(&rt, namespace, name)
            .ok()
            .map(|o| http::present(&o, api_version))
    }

    /// All objects of a kind, in every namespace, ordered by namespace and name.
    pub fn list_json(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let rt = self.resource(api_version, kind);
        self.shared
            .state()
            .list(&rt, None)
            .iter()
            .map(|o| http::present(o, api_version))
            .collect()
    }

    /// Removes an object at once (finalizers are not honoured), sending DELETED. Returns the
    /// removed object.
    pub fn delete_json(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        let rt = self.resource(api_version, kind);
        self.shared
            .state()
            .remove(&rt, namespace, name)
            .map(|o| http::present(&o, api_version))
    }

    /// Typed [`get_json`](Self::get_json).
    pub fn get<K: kube::Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<K> {
        let v = self.get_json(&K::api_version(&()), &K::kind(&()), namespace, name)?;
        Some(serde_json::from_value(v).expect("the stored object deserializes as K"))
    }

    /// Typed [`list_json`](Self::list_json).
    pub fn list<K: kube::Resource<DynamicType = ()> + DeserializeOwned>(&self) -> Vec<K> {
        let items = self.list_json(&K::api_version(&()), &K::kind(&()));
        items
            .into_iter()
            .map(|v| serde_json::from_value(v).expect("the stored object deserializes as K"))
            .collect()
    }

    /// Typed [`delete_json`](Self::delete_json); true if the object existed.
    pub fn delete<K: kube::Resource<DynamicType = ()>>(&self, namespace: &str, name: &str) -> bool {
        self.delete_json(&K::api_version(&()), &K::kind(&()), namespace, name)
            .is_some()
    }

    /// Waits until `condition` holds for the server, re-checking after every change to the
    /// store (no polling). Fails after `timeout`, naming `what`.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        mut condition: impl FnMut(&Self) -> bool,
    ) -> anyhow::Result<()> {
        let mut changes = self.shared.state().changes.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.borrow_and_update();
            if condition(self) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    anyhow::bail!("the fake API server is gone while waiting until {what}")
                }
                Err(_) => anyhow::bail!("timed out after {timeout:?} waiting until {what}"),
            }
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(serving) = self
            .serving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = serving.shutdown.send(());
        }
    }
}
