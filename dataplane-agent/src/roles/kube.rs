//! Kubernetes mode (`run --config FILE`): what the node DaemonSet (`--roles node`) and the
//! controller Deployment (`--roles controller`) run.
//!
//! - the node role, fed by the local cluster's ServiceImports and imported EndpointSlices
//!   ([`crate::source::kube::watch_node_inputs`]);
//! - the controller role, only while this pod holds the `coordination.k8s.io` Lease
//!   ([`crate::roles::controller::run_elected`], kube-lease-manager);
//! - the telemetry servers: `/metrics` on one address, `/healthz` and `/readyz` on another
//!   ([`crate::telemetry::server`]), and the refresher of the metrics' map snapshot.
//!
//! `--roles node|controller|all` (default `all`) runs only one of the two roles: a node-only
//! agent needs just the local API server (it reads no member kubeconfig but the local one's)
//! and no lease; a controller-only agent touches no kernel state.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
    config::{KubeConfigOptions, Kubeconfig},
};
use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use tokio::sync::{Notify, watch};
use tracing::{error, info, warn};

use super::{
    controller::{self, ControllerSettings},
    lease_guard,
    node::{self, Node},
};
use crate::{
    bpf::loader::LoaderConfig,
    config::{AgentConfig, Member},
    source::kube::watch_node_inputs,
    telemetry::{
        metrics::{MAP_REFRESH_EVERY, Metrics},
        server::{self, Endpoints, Health},
    },
};
use dataplane_core::{model::ClusterId, policy::AddressUse};

/// Name of the ClusterProperty holding the cluster id (KEP-2149).
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";

#[derive(Debug, thiserror::Error)]
pub enum KubeModeError {
    #[error("member {cluster}: cannot read the kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        cluster: String,
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("cannot find the local cluster's API server (in-cluster config or KUBECONFIG): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("member {cluster}: cannot build a client: {source}")]
    Client {
        cluster: String,
        source: kube::Error,
    },
    #[error("reading the ClusterProperty {CLUSTER_ID_PROPERTY}: {0}")]
    ClusterProperty(kube::Error),
    #[error(
        "no localCluster in the config and no ClusterProperty {CLUSTER_ID_PROPERTY} (about.k8s.io/v1alpha1) with a spec.value in the local cluster"
    )]
    NoClusterId,
    #[error("ClusterProperty {CLUSTER_ID_PROPERTY}: {0}")]
    BadClusterId(#[from] dataplane_core::model::InvalidClusterId),
    #[error("{0}")]
    Config(String),
    #[error(
        "member {cluster}: the kubeconfig {} is refused: {why} (set allowUnsafeCredentials: true on the member to accept it)",
        path.display()
    )]
    UnsafeKubeconfig {
        cluster: String,
        path: PathBuf,
        why: String,
    },
    #[error("{0}; exiting so that the pod is restarted")]
    Failed(String),
    #[error("binding the telemetry server on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Node(#[from] node::NodeError),
    #[error(transparent)]
    Dns(#[from] crate::dns::server::DnsServerError),
}

/// Which roles a Kubernetes-mode agent runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Roles {
    /// The node role only: route the local cluster's imports; no lease, no member clusters.
    Node,
    /// The lease-elected controller only: merge the members and write the imports; no eBPF.
    Controller,
    /// Both (the default).
    #[default]
    All,
}

impl Roles {
    pub fn node(self) -> bool {
        matches!(self, Roles::Node | Roles::All)
    }

    pub fn controller(self) -> bool {
        matches!(self, Roles::Controller | Roles::All)
    }
}

/// The settings that come from the command line and the pod, not from the config file.
#[derive(Clone, Debug)]
pub struct KubeModeOptions {
    /// The roles to run.
    pub roles: Roles,
    /// This pod's name: the lease holder identity and the Events' reporting instance.
    pub identity: String,
    /// The namespace of the Lease (the agent's own namespace).
    pub lease_namespace: String,
    /// Where `/metrics` is served.
    pub metrics_address: SocketAddr,
    /// Whether `/metrics` has the per-frontend counters.
    pub frontend_metrics: bool,
    /// Where `/healthz` and `/readyz` are served (the same listener when equal to
    /// `metrics_address`).
    pub health_address: SocketAddr,
    /// The node role's `clusterset.local` DNS server (off without addresses).
    pub dns: crate::dns::DnsOptions,
    /// Which ClusterSet IPs and backends the node role may program, and which endpoints of
    /// the members the controller imports.
    pub policy: dataplane_core::policy::AddressPolicy,
}

impl KubeModeOptions {
    /// The node role's options are refused without the node role, rather than ignored.
    fn check_roles(&self) -> Result<(), KubeModeError> {
        if self.roles.node() {
            return Ok(());
        }
        let node_only = [
            ("--dns-listen", !self.dns.listen.is_empty()),
            ("--frontend-metrics", self.frontend_metrics),
        ];
        match node_only.iter().find(|(_, set)| *set) {
            Some((flag, _)) => Err(KubeModeError::Config(format!(
                "{flag} needs the node role (--roles node or all)"
            ))),
            None => Ok(()),
        }
    }
}

/// How long a request to an API server may go without an answer.
pub const API_READ_TIMEOUT: Duration = Duration::from_secs(295);

/// `config` with [`API_READ_TIMEOUT`]: no response at all within it (kube sets no limit)
/// fails the request, which is then retried, where a half-open connection would hang a write,
/// and the controller's loop with it, for ever. Longer than a watch request (290 s), counted
/// from the request.
fn with_read_timeout(mut config: kube::Config) -> kube::Config {
    config.read_timeout = Some(API_READ_TIMEOUT);
    config.reset_reader_on_write = true;
    config
}

/// A kube client for `member`; `relative_to` resolves a relative kubeconfig path (the config
/// file's directory).
pub async fn member_client(member: &Member, relative_to: &Path) -> Result<Client, KubeModeError> {
    let config = match &member.kubeconfig {
        Some(path) => {
            let path = relative_to.join(path);
            let fail = |source| KubeModeError::Kubeconfig {
                cluster: member.id.to_string(),
                path: path.clone(),
                source,
            };
            let kubeconfig = Kubeconfig::read_from(&path).map_err(fail)?;
            if !member.allow_unsafe_credentials {
                unsafe_credentials(&kubeconfig, member.context.as_deref()).map_err(|why| {
                    KubeModeError::UnsafeKubeconfig {
                        cluster: member.id.to_string(),
                        path: path.clone(),
                        why,
                    }
                })?;
            }
            let options = KubeConfigOptions {
                context: member.context.clone(),
                ..Default::default()
            };
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(fail)?
        }
        None => kube::Config::infer().await?,
    };
    Client::try_from(with_read_timeout(config)).map_err(|source| KubeModeError::Client {
        cluster: member.id.to_string(),
        source,
    })
}

/// `Err(why)` when the context that will be used (`context`, else the current one) runs a
/// credential plugin (`exec`, `auth-provider`: code from a file, run inside the controller pod) or
/// skips TLS verification.
pub fn unsafe_credentials(kubeconfig: &Kubeconfig, context: Option<&str>) -> Result<(), String> {
    let Some(name) = context.or(kubeconfig.current_context.as_deref()) else {
        return Ok(()); // kube's own error about the missing context follows
    };
    let Some(ctx) = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.context.as_ref())
    else {
        return Ok(());
    };
    let user = ctx.user.as_deref().and_then(|u| {
        kubeconfig
            .auth_infos
            .iter()
            .find(|a| a.name == u)
            .and_then(|a| a.auth_info.as_ref())
    });
    if user.is_some_and(|u| u.exec.is_some()) {
        return Err(format!(
            "context {name:?}: its user runs an exec credential plugin"
        ));
    }
    if user.is_some_and(|u| u.auth_provider.is_some()) {
        return Err(format!(
            "context {name:?}: its user uses an auth-provider plugin"
        ));
    }
    let insecure = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .is_some_and(|c| c.insecure_skip_tls_verify == Some(true));
    if insecure {
        return Err(format!(
            "context {name:?}: its cluster skips TLS verification"
        ));
    }
    Ok(())
}

/// The cluster id from the ClusterProperty `cluster.clusterset.k8s.io` (`spec.value`).
pub async fn cluster_id_from_property(client: Client) -> Result<ClusterId, KubeModeError> {
    let resource = ApiResource {
        group: "about.k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "about.k8s.io/v1alpha1".into(),
        kind: "ClusterProperty".into(),
        plural: "clusterproperties".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let property = api
        .get_opt(CLUSTER_ID_PROPERTY)
        .await
        .map_err(KubeModeError::ClusterProperty)?
        .ok_or(KubeModeError::NoClusterId)?;
    let value = property
        .data
        .pointer("/spec/value")
        .and_then(|v| v.as_str())
        .ok_or(KubeModeError::NoClusterId)?;
    Ok(ClusterId::new(value)?)
}

/// The local cluster id and a client for every member (the local one included), or for the
/// local member only when `only_local`.
pub async fn connect(
    config: &AgentConfig,
    config_dir: &Path,
    only_local: bool,
) -> Result<(ClusterId, Vec<(ClusterId, Client)>), KubeModeError> {
    let local = match &config.local_cluster {
        Some(id) => id.clone(),
        None => {
            let client = Client::try_from(with_read_timeout(kube::Config::infer().await?))
                .map_err(|source| KubeModeError::Client {
                    cluster: "local".into(),
                    source,
                })?;
            // An API server that is away (or slow to come up) is waited for; a missing
            // property is an error.
            let mut backoff = Duration::from_millis(500);
            let id = loop {
                match cluster_id_from_property(client.clone()).await {
                    Err(KubeModeError::ClusterProperty(e)) if !matches!(&e, kube::Error::Api(s) if s.code < 500) =>
                    {
                        warn!(error = %e, "cannot read the ClusterProperty {CLUSTER_ID_PROPERTY} yet; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(30));
                    }
                    other => break other?,
                }
            };
            info!(cluster = %id, "local cluster id from the ClusterProperty {CLUSTER_ID_PROPERTY}");
            id
        }
    };
    config.check_local(&local).map_err(KubeModeError::Config)?;
    let mut clients = Vec::new();
    for member in &config.members {
        if only_local && member.id != local {
            continue;
        }
        let client = match &member.kubeconfig {
            // One file for every cluster lists each cluster's kubeconfig, and each cluster's
            // Secret holds the others' only (the node pods mount none): in a pod, the local
            // member's missing kubeconfig means the pod's own credentials. Elsewhere a
            // missing file is an error (not whatever the current context is).
            Some(path)
                if member.id == local
                    && !config_dir.join(path).exists()
                    && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() =>
            {
                info!(cluster = %local, path = %config_dir.join(path).display(),
                    "the local member's kubeconfig is not here; using the pod's own credentials");
                let own = Member {
                    kubeconfig: None,
                    ..member.clone()
                };
                member_client(&own, config_dir).await?
            }
            _ => member_client(member, config_dir).await?,
        };
        clients.push((member.id.clone(), client));
    }
    Ok((local, clients))
}

/// Holds the lease and runs the controller while it does, until `shutdown` is notified; then
/// releases the lease. Building the lease manager is retried while the API server is away.
pub async fn elect_and_control(
    settings: Arc<ControllerSettings>,
    members: Vec<(ClusterId, Client)>,
    metrics: Arc<Metrics>,
    lease: crate::config::LeaderElection,
    lease_namespace: String,
    shutdown: Arc<Notify>,
) {
    let Some(local_client) = members
        .iter()
        .find(|(id, _)| id == &settings.local)
        .map(|(_, c)| c.clone())
    else {
        return;
    };
    let mut backoff = Duration::from_millis(500);
    loop {
        let built = LeaseManagerBuilder::new(local_client.clone(), lease.lease_name.clone())
            .with_namespace(lease_namespace.clone())
            .with_parameters(LeaseParams::new(
                settings.identity.clone(),
                lease.lease_duration.as_secs(),
                lease.renew_grace.as_secs(),
            ))
            .build()
            .await;
        let manager = match built {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, "cannot set up the controller lease; retrying");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.notified() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        backoff = Duration::from_millis(500);
        let (leader, task) = manager.watch().await;
        // The controller runs while the guard says this replica leads: while the manager holds
        // the Lease and this replica has seen its renewal in time.
        let (leading_tx, leading) = watch::channel(false);
        let guard = lease_guard::guard(
            Api::namespaced(local_client.clone(), &lease_namespace),
            lease_guard::LeaseTerms {
                name: lease.lease_name.clone(),
                identity: settings.identity.clone(),
                duration: lease.lease_duration,
                renew_grace: lease.renew_grace,
            },
            leader.clone(),
            leading_tx,
        );
        let control =
            controller::run_elected(settings.clone(), members.clone(), metrics.clone(), leading);
        tokio::select! {
            _ = async { tokio::join!(control, guard) } => {
                warn!("the lease manager stopped; setting it up again");
            }
            () = shutdown.notified() => {
                // Dropping the last receiver makes the manager release the lease.
                drop(leader);
                metrics.leader.set(0);
                match tokio::time::timeout(Duration::from_secs(5), task).await {
                    Ok(Ok(Ok(_))) => info!("released the controller lease"),
                    Ok(Ok(Err(e))) => warn!(error = %e, "releasing the controller lease failed"),
                    _ => warn!("releasing the controller lease did not finish"),
                }
                return;
            }
        }
    }
}

/// Binds and serves `/metrics` on `metrics_address` and `/healthz`, `/readyz` on
/// `health_address` (one listener for all when they are equal); the server tasks.
pub async fn serve_telemetry(
    metrics_address: SocketAddr,
    health_address: SocketAddr,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, KubeModeError> {
    let listeners = if metrics_address == health_address {
        vec![(
            metrics_address,
            "/metrics, /healthz and /readyz",
            Endpoints {
                metrics: Some(metrics.clone()),
                health: Some(health.clone()),
            },
        )]
    } else {
        vec![
            (
                metrics_address,
                "/metrics",
                Endpoints {
                    metrics: Some(metrics.clone()),
                    health: None,
                },
            ),
            (
                health_address,
                "/healthz and /readyz",
                Endpoints {
                    metrics: None,
                    health: Some(health.clone()),
                },
            ),
        ]
    };
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::with_capacity(listeners.len());
    for (addr, paths, endpoints) in listeners {
        let bound = server::bind(addr).await;
        let (listener, local) = match bound {
            Ok(b) => b,
            Err(source) => {
                for t in &tasks {
                    t.abort();
                }
                return Err(KubeModeError::Bind { addr, source });
            }
        };
        info!(addr = %local, "serving {paths}");
        tasks.push(tokio::spawn(server::serve(listener, endpoints)));
    }
    Ok(tasks)
}

/// Watches the controller task: it returns only when asked to stop (`stopping` set), so its
/// end otherwise (a panic, or a return) fails `/healthz` with the reason and wakes `fatal`,
/// and the agent exits to be restarted.
pub fn supervise_controller(
    inner: tokio::task::JoinHandle<()>,
    health: Arc<Health>,
    fatal: Arc<Notify>,
    stopping: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let outcome = inner.await;
        if !stopping.load(std::sync::atomic::Ordering::SeqCst) {
            let reason = match outcome {
                Err(e) if e.is_panic() => "the controller task panicked",
                _ => "the controller task ended",
            };
            error!("{reason}");
            health.set_failed(reason);
            fatal.notify_one();
        }
    })
}

/// Runs Kubernetes mode until SIGTERM/SIGINT: the node role and/or the elected controller
/// (`options.roles`), and telemetry.
pub async fn run(
    config: AgentConfig,
    config_path: &Path,
    options: KubeModeOptions,
    loader: Option<LoaderConfig>,
) -> Result<(), KubeModeError> {
    options.check_roles()?;
    let roles = options.roles;
    let config_dir = config_path
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."));
    // The node role's dataplane (a controller-only agent is given none, and has no maps to
    // report).
    let loader = loader.filter(|_| roles.node());
    let metrics = Arc::new(Metrics::new(
        loader.as_ref().map(|l| l.pin_dir.clone()),
        options.frontend_metrics,
    ));
    let health = Arc::new(Health::default());
    // Served before connecting: the agent waits there for the API server and the
    // ClusterProperty as long as it takes, and the kubelet's probes must see it alive.
    let telemetry = serve_telemetry(
        options.metrics_address,
        options.health_address,
        &metrics,
        &health,
    )
    .await?;
    let (local, members) = connect(&config, &config_dir, !roles.controller()).await?;
    info!(local = %local, members = members.len(), identity = %options.identity, ?roles, "kubernetes mode");
    let refresher = tokio::spawn(metrics.clone().refresh_maps_forever(MAP_REFRESH_EVERY));

    let mut dns_server = None;
    let node = if let Some(loader) = &loader {
        let mut node = Node::start(loader)?.with_policy(options.policy.clone());
        if let Some((zone, server)) = crate::dns::start(&options.dns)? {
            node = node.with_dns(zone);
            dns_server = Some(server);
        }
        Some(node)
    } else {
        None
    };
    let local_client = members
        .iter()
        .find(|(id, _)| id == &local)
        .map(|(_, c)| c.clone())
        .ok_or_else(|| KubeModeError::Config(format!("{local} is not a member")))?;

    let stop_controller = Arc::new(Notify::new());
    // Woken when a role's task dies: the agent then fails its liveness probe and exits.
    let fatal = Arc::new(Notify::new());
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let control = roles.controller().then(|| {
        let settings = Arc::new(ControllerSettings {
            local: local.clone(),
            clusterset: config.clusterset.clone(),
            unreachable_grace: config.unreachable_grace,
            probe_interval: config.probe_interval,
            identity: options.identity.clone(),
            policy: options.policy.clone(),
        });
        let inner = tokio::spawn(elect_and_control(
            settings,
            members,
            metrics.clone(),
            config.leader_election.clone(),
            options.lease_namespace.clone(),
            stop_controller.clone(),
        ));
        supervise_controller(inner, health.clone(), fatal.clone(), stopping.clone())
    });
    let shutdown_or_fatal = {
        let fatal = fatal.clone();
        async move {
            tokio::select! {
                () = super::shutdown_signal() => {}
                () = fatal.notified() => {}
            }
        }
    };

    match node {
        Some(node) => {
            let (tx, rx) = crate::source::feed::channel();
            let source = tokio::spawn(watch_node_inputs(
                local.clone(),
                local_client,
                metrics.clone(),
                tx,
            ));
            let (m, h) = (metrics.clone(), health.clone());
            let ended =
                node::run_with(node, rx, shutdown_or_fatal, move |node, report, elapsed| {
                    m.observe_map_sync(elapsed, report.failed.len());
                    m.maps_changed();
                    m.set_refused(
                        &[AddressUse::ClusterSetIp, AddressUse::Backend],
                        node.refused(),
                    );
                    h.set_ready();
                })
                .await;
            if ended == node::Ended::SourceStopped {
                health.set_failed("the ServiceImport/EndpointSlice source stopped");
            }
            source.abort();
        }
        None => {
            // Nothing to wait for before serving: the controller retries on its own.
            health.set_ready();
            shutdown_or_fatal.await;
        }
    }
    if let Some(control) = control {
        // SIGTERM: give the lease back so another pod takes over at once.
        stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        stop_controller.notify_one();
        let _ = tokio::time::timeout(Duration::from_secs(6), control).await;
    }
    for task in telemetry {
        task.abort();
    }
    refresher.abort();
    drop(dns_server);
    match health.failure() {
        Some(reason) => Err(KubeModeError::Failed(reason)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_role_flags_without_the_node_role_are_refused() {
        let options = |roles, dns: &[&str], frontend_metrics| KubeModeOptions {
            roles,
            identity: "a".into(),
            lease_namespace: "mcs-system".into(),
            metrics_address: "127.0.0.1:9090".parse().expect("addr"),
            frontend_metrics,
            health_address: "127.0.0.1:9091".parse().expect("addr"),
            dns: crate::dns::DnsOptions {
                listen: dns.iter().map(|a| a.parse().expect("addr")).collect(),
                ..Default::default()
            },
            policy: Default::default(),
        };
        let refused = |o: KubeModeOptions| match o.check_roles() {
            Err(KubeModeError::Config(why)) => why,
            other => panic!("not refused: {other:?}"),
        };
        assert!(
            refused(options(Roles::Controller, &["0.0.0.0:53"], false)).starts_with("--dns-listen")
        );
        assert!(refused(options(Roles::Controller, &[], true)).starts_with("--frontend-metrics"));
        assert!(options(Roles::Controller, &[], false).check_roles().is_ok());
        for roles in [Roles::Node, Roles::All] {
            assert!(options(roles, &["0.0.0.0:53"], true).check_roles().is_ok());
        }
    }

    fn kubeconfig(user: &str, cluster: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1
kind: Config
current-context: main
contexts:
- name: main
  context: {{cluster: c, user: u}}
- name: plain
  context: {{cluster: plain, user: token}}
clusters:
- name: c
  cluster: {{server: 'https://c.example:6443'{cluster}}}
- name: plain
  cluster: {{server: 'https://p.example:6443'}}
users:
- name: u
  user: {user}
- name: token
  user: {{token: abc}}
"
        ))
        .expect("kubeconfig")
    }

    /// (what `/healthz` answers, whether the agent was told to exit) after the controller
    /// task ends as `task` does, with `stopping` set beforehand or not.
    async fn after_controller(
        task: impl std::future::Future<Output = ()> + Send + 'static,
        stopping: bool,
    ) -> (u16, String, bool) {
        let health = Arc::new(Health::default());
        let fatal = Arc::new(Notify::new());
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(stopping));
        let watcher = supervise_controller(tokio::spawn(task), health.clone(), fatal.clone(), flag);
        watcher.await.expect("the watcher ends with the task");
        let endpoints = Endpoints {
            metrics: None,
            health: Some(health),
        };
        let res = server::respond(&hyper::Method::GET, "/healthz", &endpoints);
        let status = res.status().as_u16();
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        // `notify_one` stores a permit: a told agent finds it at once.
        let told = tokio::time::timeout(Duration::ZERO, fatal.notified())
            .await
            .is_ok();
        (status, body, told)
    }

    #[tokio::test]
    async fn an_ended_controller_task_fails_healthz_and_stops_the_agent() {
        assert_eq!(
            after_controller(async { panic!("bug") }, false).await,
            (503, "the controller task panicked\n".into(), true)
        );
        assert_eq!(
            after_controller(async {}, false).await,
            (503, "the controller task ended\n".into(), true)
        );
        // Asked to stop (SIGTERM): its end is not a failure.
        assert_eq!(
            after_controller(async {}, true).await,
            (200, "ok\n".into(), false)
        );
    }

    #[test]
    fn credential_plugins_and_skipped_tls_are_refused_and_plain_tokens_pass() {
        let exec = kubeconfig(
            "{exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh}}",
            "",
        );
        let why = unsafe_credentials(&exec, None).expect_err("exec is refused");
        assert!(why.contains("exec credential plugin"), "{why}");
        // The context that will be used is the one checked.
        assert_eq!(unsafe_credentials(&exec, Some("plain")), Ok(()));

        let provider = kubeconfig("{auth-provider: {name: oidc}}", "");
        let why = unsafe_credentials(&provider, None).expect_err("auth-provider is refused");
        assert!(why.contains("auth-provider"), "{why}");

        let insecure = kubeconfig("{token: abc}", ", insecure-skip-tls-verify: true");
        let why = unsafe_credentials(&insecure, None).expect_err("skipped TLS is refused");
        assert!(why.contains("skips TLS verification"), "{why}");

        assert_eq!(
            unsafe_credentials(&kubeconfig("{token: abc}", ""), None),
            Ok(())
        );
    }
}
