//! Command-line interface.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::{bpf::loader::LoaderConfig, telemetry::LogFormat};

#[derive(Parser, Debug)]
#[command(
    name = "dataplane-agent",
    version,
    about = "eBPF dataplane for Kubernetes Multi-Cluster Services (KEP-1645)"
)]
pub struct Cli {
    /// Log format on stderr. The level comes from RUST_LOG (default info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "MCS_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the agent: Kubernetes mode (--config) or standalone (--clusterset-dir DIR).
    Run(RunArgs),
    /// Node role from files: route the ServiceImports and imported EndpointSlices in DIR.
    Node(NodeArgs),
    /// Print the merge and the lb table of a ClusterSet directory as JSON (no kernel needed).
    Plan(PlanArgs),
    /// Print the live table from the pinned maps.
    Inspect(InspectArgs),
    /// Explain which clusters a ClusterSet IP and port reach, and why the others do not.
    Explain(ExplainArgs),
    /// Detach the programs and remove the pinned links and maps.
    Uninstall(PinDirArg),
    /// Print the ServiceExport and ServiceImport CRDs (YAML), or write one file per CRD.
    Crds(CrdsArgs),
}

#[derive(Args, Debug, Clone)]
pub struct PinDirArg {
    /// bpffs directory holding the pinned maps and links.
    #[arg(long, default_value_os_t = crate::bpf::loader::default_pin_dir(), env = "MCS_PIN_DIR")]
    pub pin_dir: PathBuf,
}

/// Where and how the dataplane is installed.
#[derive(Args, Debug, Clone)]
pub struct DataplaneArgs {
    #[command(flatten)]
    pub pin: PinDirArg,
    /// cgroup v2 directory to attach to (default: the cgroup2 mount root, i.e. the whole node).
    #[arg(long, env = "MCS_CGROUP")]
    pub cgroup: Option<PathBuf>,
    /// Frontends in all (a frontend is a VIP, port and protocol, or a VIP's wildcard): the
    /// capacity of each of the IPv4 and IPv6 frontend maps, and of the frontend ids both share.
    #[arg(long, default_value_t = dataplane_ebpf::defaults::MAX_FRONTENDS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_frontends: u32,
    /// Capacity of the slot array: every frontend's backends, plus room for the new backend set
    /// of the frontends being changed.
    #[arg(long, default_value_t = dataplane_ebpf::defaults::MAX_SLOTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_slots: u32,
    /// Capacity of the cluster-name map (member clusters named at once; at most 65535).
    #[arg(long, default_value_t = dataplane_ebpf::defaults::MAX_CLUSTERS,
          value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub max_clusters: u32,
    /// Capacity of the session-affinity LRU.
    #[arg(long, default_value_t = dataplane_ebpf::defaults::MAX_AFFINITY,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_affinity: u32,
    /// Capacity of each reverse-translation LRU (one entry per translated socket and backend).
    #[arg(long, default_value_t = dataplane_ebpf::defaults::MAX_REVNAT,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_revnat: u32,
    /// Entries of the connected-socket reverse map, rounded up to a power of two (48 bytes
    /// each). A translated TCP or connected UDP socket uses entry `cookie mod size`; when another
    /// open socket holds it, the socket keeps its entry in socket storage, which is slower to
    /// create. Size it well above the sockets open at once. Fixed while the map stays pinned.
    #[arg(long, default_value_t = dataplane_ebpf::defaults::MAX_CONNECTED,
          value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    pub max_connected: u32,
    /// Most verbose eBPF log level forwarded to the agent's log: 0 off, 1 error, 2 warn, 3 info, 4 debug, 5 trace.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=5))]
    pub bpf_log_level: u8,
}

impl DataplaneArgs {
    /// The loader configuration, with the cgroup defaulted to the cgroup2 root.
    pub fn loader_config(&self) -> Result<LoaderConfig, String> {
        let cgroup = match &self.cgroup {
            Some(c) => c.clone(),
            None => crate::bpf::loader::cgroup2_root()
                .ok_or("no cgroup2 mount found in /proc/self/mounts; pass --cgroup")?,
        };
        Ok(LoaderConfig {
            pin_dir: self.pin.pin_dir.clone(),
            cgroup,
            max_frontends: self.max_frontends,
            max_slots: self.max_slots,
            max_clusters: self.max_clusters,
            max_affinity: self.max_affinity,
            max_revnat: self.max_revnat,
            max_connected: self.max_connected,
            bpf_log_level: self.bpf_log_level,
        })
    }
}

/// The `clusterset.local` DNS server of the node role (docs/dns.md).
#[derive(Args, Debug, Clone)]
pub struct DnsArgs {
    /// Serve clusterset.local DNS on ADDR:PORT, UDP and TCP (repeatable, or comma-separated).
    /// Off unless given.
    #[arg(
        long = "dns-listen",
        value_name = "ADDR:PORT",
        env = "MCS_DNS_LISTEN",
        value_delimiter = ','
    )]
    pub listen: Vec<std::net::SocketAddr>,
    /// TTL of the DNS answers, in seconds.
    #[arg(long = "dns-ttl", value_name = "SECONDS", default_value_t = crate::dns::zone::DEFAULT_TTL)]
    pub ttl: u32,
    /// The most DNS-over-TCP connections open at once, over every listen address; an eighth of
    /// them (at least one) may come from one client address. Connections over the limit are
    /// closed as they come.
    #[arg(long = "dns-max-tcp-connections", value_name = "N",
          default_value_t = crate::dns::DEFAULT_MAX_TCP_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tcp_connections: u32,
}

impl DnsArgs {
    pub fn options(&self) -> crate::dns::DnsOptions {
        crate::dns::DnsOptions {
            listen: self.listen.clone(),
            ttl: self.ttl,
            max_tcp_connections: self.max_tcp_connections as usize,
        }
    }
}

/// Which ClusterSet IPs and backends the node may program (docs/security.md).
#[derive(Args, Debug, Clone, Default)]
pub struct AddressArgs {
    /// ClusterSet IPs are programmed only inside these CIDRs (comma-separated). Default: the
    /// ClusterSet CIDRs of the config file or clusterset.yaml, else 241.0.0.0/16 and
    /// fd00:241::/112. Backends inside them are refused.
    #[arg(
        long,
        value_name = "CIDR[,CIDR...]",
        env = "MCS_CLUSTERSET_CIDRS",
        value_delimiter = ','
    )]
    pub clusterset_cidrs: Vec<ipnet::IpNet>,
    /// Backends never programmed, added to the built-in refusals (loopback, link-local,
    /// multicast, ...) and the cloud metadata addresses.
    #[arg(
        long,
        value_name = "CIDR[,CIDR...]",
        env = "MCS_DENY_BACKEND_CIDRS",
        value_delimiter = ','
    )]
    pub deny_backend_cidrs: Vec<ipnet::IpNet>,
    /// Backends of member CLUSTER are programmed only inside CIDR (repeatable; a cluster
    /// without an entry may use any address the other rules allow).
    #[arg(long, value_name = "CLUSTER=CIDR", value_parser = parse_cluster_cidr)]
    pub allowed_backend_cidrs: Vec<(dataplane_core::model::ClusterId, ipnet::IpNet)>,
}

impl AddressArgs {
    /// The policy: these flags over the ClusterSet's own `cidrs`.
    pub fn policy(
        &self,
        cidrs: &dataplane_core::merge::ClusterSetCidrs,
    ) -> dataplane_core::policy::AddressPolicy {
        let mut policy = dataplane_core::policy::AddressPolicy::for_cidrs(cidrs);
        if !self.clusterset_cidrs.is_empty() {
            policy.clusterset_cidrs = self.clusterset_cidrs.clone();
        }
        policy
            .deny_cidrs
            .extend(self.deny_backend_cidrs.iter().copied());
        for (cluster, cidr) in &self.allowed_backend_cidrs {
            policy
                .allowed_by_cluster
                .entry(cluster.clone())
                .or_default()
                .push(*cidr);
        }
        policy
    }
}

/// Parses `CLUSTER=CIDR`.
fn parse_cluster_cidr(s: &str) -> Result<(dataplane_core::model::ClusterId, ipnet::IpNet), String> {
    let (cluster, cidr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not CLUSTER=CIDR"))?;
    let cluster = dataplane_core::model::ClusterId::new(cluster).map_err(|e| e.to_string())?;
    let cidr = cidr
        .parse()
        .map_err(|e| format!("{cidr:?} is not a CIDR: {e}"))?;
    Ok((cluster, cidr))
}

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// Directory of YAML files with the local cluster's ServiceImports and imported EndpointSlices.
    #[arg(long)]
    pub from_dir: PathBuf,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
    #[command(flatten)]
    pub addresses: AddressArgs,
    #[command(flatten)]
    pub dns: DnsArgs,
}

/// `run`: exactly one of `--clusterset-dir` (standalone) or `--config` (Kubernetes mode).
/// The Kubernetes-mode flags do not conflict with `--clusterset-dir` in clap: it counts a value
/// from the environment as given, and the manifests set `POD_NAME` and `POD_NAMESPACE` for
/// every pod. Given on the command line, they are refused by [`standalone_misused_flags`].
#[derive(Args, Debug)]
#[command(group(
    clap::ArgGroup::new("source")
        .required(true)
        .args(["clusterset_dir", "config"])
))]
pub struct RunArgs {
    /// Standalone: ClusterSet directory, DIR/<cluster-id>/*.yaml and an optional DIR/clusterset.yaml.
    #[arg(long)]
    pub clusterset_dir: Option<PathBuf>,
    /// Kubernetes mode: the ClusterSet config file (members, kubeconfigs, CIDRs; docs/kubernetes.md).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Standalone: the cluster this host belongs to (default: the first cluster id in sorted order).
    #[arg(long, conflicts_with = "config")]
    pub cluster: Option<dataplane_core::model::ClusterId>,
    /// Standalone: write the current ServiceImports and export conditions (YAML) here after every merge.
    #[arg(long, conflicts_with = "config")]
    pub report: Option<PathBuf>,
    /// Kubernetes mode: this agent's identity, the lease holder and Event reporter (default: the hostname).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Kubernetes mode: the namespace of the controller Lease (the agent's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "mcs-system")]
    pub lease_namespace: String,
    /// Kubernetes mode: the roles to run: `node` (route the local cluster's imports; needs only
    /// the local API server), `controller` (the lease-elected merge and writer; no eBPF) or `all`.
    #[arg(long, value_enum, default_value = "all", env = "MCS_ROLES")]
    pub roles: crate::roles::kube::Roles,
    /// Kubernetes mode: address of /metrics (this host only by default; unauthenticated, so
    /// expose it on purpose).
    #[arg(long, env = "MCS_METRICS_ADDRESS", default_value = "127.0.0.1:9090")]
    pub metrics_address: std::net::SocketAddr,
    /// Kubernetes mode, node role: also export the per-frontend counters (`mcs_frontend_*`:
    /// three series per service port and per ClusterSet IP, on every node). Off by default: at
    /// 10,000 services that is 90,000 series per node, and 3-6 MiB of each node's memory;
    /// `dataplane-agent inspect` shows the same counters.
    #[arg(long, env = "MCS_FRONTEND_METRICS")]
    pub frontend_metrics: bool,
    /// Kubernetes mode: address of /healthz and /readyz, for the kubelet's probes (every
    /// address by default: the kubelet probes the pod IP; they say only ok or why not). The
    /// same address as --metrics-address serves all three on one listener.
    #[arg(long, env = "MCS_HEALTH_ADDRESS", default_value = "0.0.0.0:9091")]
    pub health_address: std::net::SocketAddr,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
    #[command(flatten)]
    pub addresses: AddressArgs,
    #[command(flatten)]
    pub dns: DnsArgs,
}

/// This host's name (the default identity).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "dataplane-agent".to_owned())
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// ClusterSet directory: DIR/<cluster-id>/*.yaml and an optional DIR/clusterset.yaml.
    #[arg(long)]
    pub clusterset_dir: PathBuf,
    /// The importing cluster (default: the first cluster id in sorted order).
    #[arg(long)]
    pub cluster: Option<dataplane_core::model::ClusterId>,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["from_dir", "clusterset_dir"])))]
pub struct ExplainArgs {
    /// `IP:PORT` or `[IPv6]:PORT`, optionally followed by `/udp` (default TCP).
    pub address: String,
    /// A node directory of ServiceImports and imported EndpointSlices (as for `node`).
    #[arg(long)]
    pub from_dir: Option<PathBuf>,
    /// A ClusterSet directory (as for `plan`): explain the merged result.
    #[arg(long)]
    pub clusterset_dir: Option<PathBuf>,
    /// The importing cluster, with --clusterset-dir.
    #[arg(long, requires = "clusterset_dir")]
    pub cluster: Option<dataplane_core::model::ClusterId>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The node's address flags, to explain what that node programs.
    #[command(flatten)]
    pub addresses: AddressArgs,
}

/// Parses `IP:PORT[/tcp|/udp]`.
pub fn parse_frontend(
    s: &str,
) -> Result<(std::net::IpAddr, u16, dataplane_core::lb::Protocol), String> {
    let (addr, proto) = match s.rsplit_once('/') {
        Some((a, p)) => (a, p.to_ascii_uppercase()),
        None => (s, "TCP".to_owned()),
    };
    let protocol = dataplane_core::lb::Protocol::parse(Some(&proto))
        .map_err(|p| format!("protocol {p:?}: use tcp or udp"))?;
    let sock: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| format!("{addr:?} is not IP:PORT or [IPv6]:PORT: {e}"))?;
    Ok((sock.ip(), sock.port(), protocol))
}

#[derive(Args, Debug)]
pub struct CrdsArgs {
    /// Write `<crd name>.yaml` files into this directory instead of printing.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub pin: PinDirArg,
}

/// The Kubernetes-mode flags of `run` given on the command line together with
/// `--clusterset-dir` (standalone ignores them; from the environment they are fine).
pub fn standalone_misused_flags(matches: &clap::ArgMatches) -> Vec<String> {
    let Some(("run", run)) = matches.subcommand() else {
        return Vec::new();
    };
    if run.value_source("clusterset_dir").is_none() {
        return Vec::new();
    }
    let kube_only = [
        "identity",
        "lease_namespace",
        "roles",
        "metrics_address",
        "frontend_metrics",
        "health_address",
    ];
    kube_only
        .into_iter()
        .filter(|id| run.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect()
}
