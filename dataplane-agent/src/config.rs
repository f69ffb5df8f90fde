//! The ClusterSet config file of `dataplane-agent run --config FILE` (Kubernetes mode).
//!
//! ```yaml
//! # The local cluster's id. Optional: without it the agent reads the ClusterProperty
//! # `cluster.clusterset.k8s.io` (about.k8s.io/v1alpha1, `spec.value`) of the local cluster.
//! localCluster: east
//! members:
//!   - id: east                      # the local member: no kubeconfig = in-cluster config
//!     ipFamilies: [IPv4, IPv6]      # families this cluster supports when importing (default both)
//!   - id: west
//!     kubeconfig: /etc/mcs-dataplane/members/west/kubeconfig   # read access suffices
//!     context: west-admin           # optional; default: the kubeconfig's current context
//!     ipFamilies: [IPv4]
//!     # allowUnsafeCredentials: true  # let this kubeconfig run exec/auth-provider plugins or
//!     #                               # skip TLS verification (refused by default)
//! clusterSetCIDRs: {ipv4: 241.0.0.0/16, ipv6: "fd00:241::/112"}   # defaults shown
//! ipFamilyPolicy: Intersection      # or Union
//! unreachableGracePeriod: 5m        # then an unreachable member's endpoints are withdrawn
//! memberProbeInterval: 10s          # how often each member's API server is checked
//! leaderElection:
//!   leaseName: mcs-dataplane-controller
//!   leaseDuration: 15s              # a dead leader is replaced within this
//!   renewGrace: 5s                  # the leader renews this long before expiry
//! ```
//!
//! Durations are a number with a unit `ms`, `s`, `m` or `h` (`1m30s` is not accepted; write
//! `90s`). Unknown keys are errors. `clusterSetCIDRs`, `ipFamilyPolicy` and `ipFamilies` mean
//! what they mean in a ClusterSet directory's `clusterset.yaml`
//! ([`crate::source::clusterset_dir`]) and are checked the same way.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use crate::source::clusterset_dir::{CidrsFile, cluster_families};
use dataplane_core::{
    merge::{ClusterSetConfig, IpFamilyPolicy},
    model::{ClusterId, IpFamily},
};

/// Default [`AgentConfig::unreachable_grace`].
pub const DEFAULT_UNREACHABLE_GRACE: Duration = Duration::from_secs(300);
/// Default [`AgentConfig::probe_interval`].
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// Default lease name.
pub const DEFAULT_LEASE_NAME: &str = "mcs-dataplane-controller";

/// Why a config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

/// A member cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: ClusterId,
    /// `None`: the in-cluster config (or `KUBECONFIG`); only allowed for the local member,
    /// which is checked once the local id is known ([`AgentConfig::check_local`]).
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// Whether the kubeconfig may run an `exec` or auth-provider credential plugin, or skip
    /// TLS verification (refused by default: it would run inside the controller pod).
    pub allow_unsafe_credentials: bool,
}

/// Leader election of the controller role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    pub lease_name: String,
    pub lease_duration: Duration,
    pub renew_grace: Duration,
}

impl Default for LeaderElection {
    fn default() -> Self {
        Self {
            lease_name: DEFAULT_LEASE_NAME.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_grace: Duration::from_secs(5),
        }
    }
}

/// The parsed config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// `None`: read the ClusterProperty `cluster.clusterset.k8s.io`.
    pub local_cluster: Option<ClusterId>,
    /// In file order; ids are unique.
    pub members: Vec<Member>,
    /// CIDRs, family policy and the families each member supports.
    pub clusterset: ClusterSetConfig,
    pub unreachable_grace: Duration,
    pub probe_interval: Duration,
    pub leader_election: LeaderElection,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    #[serde(default)]
    local_cluster: Option<String>,
    members: Vec<MemberFile>,
    #[serde(default, rename = "clusterSetCIDRs")]
    cluster_set_cidrs: Option<CidrsFile>,
    #[serde(default)]
    ip_family_policy: Option<IpFamilyPolicy>,
    #[serde(default)]
    unreachable_grace_period: Option<String>,
    #[serde(default)]
    member_probe_interval: Option<String>,
    #[serde(default)]
    leader_election: Option<LeaderElectionFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MemberFile {
    id: String,
    #[serde(default)]
    kubeconfig: Option<PathBuf>,
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    ip_families: Option<Vec<IpFamily>>,
    #[serde(default)]
    allow_unsafe_credentials: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LeaderElectionFile {
    #[serde(default)]
    lease_name: Option<String>,
    #[serde(default)]
    lease_duration: Option<String>,
    #[serde(default)]
    renew_grace: Option<String>,
}

/// Parses `90s`, `5m`, `250ms`, `1h` (a non-negative integer and one unit).
///
/// ```
/// use std::time::Duration;
/// use dataplane_agent::config::parse_duration;
/// assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert!(parse_duration("5").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("duration {text:?} has no unit (ms, s, m or h)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("duration {text:?} does not start with a whole number"))?;
    let d = match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        other => return Err(format!("duration {text:?}: unknown unit {other:?}")),
    };
    d.ok_or_else(|| format!("duration {text:?} is too long"))
}

impl AgentConfig {
    /// Parses the text of a config file; `path` is only used in errors.
    ///
    /// ```
    /// use dataplane_agent::config::AgentConfig;
    /// let cfg = AgentConfig::parse(
    ///     "localCluster: east\nmembers: [{id: east}, {id: west, kubeconfig: /k/west}]\n",
    ///     "c.yaml".as_ref(),
    /// ).unwrap();
    /// assert_eq!(cfg.members.len(), 2);
    /// assert_eq!(cfg.unreachable_grace.as_secs(), 300);
    /// ```
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        let raw: File = serde_yaml::from_str(text).map_err(|e| err(e.to_string()))?;
        let local_cluster = raw
            .local_cluster
            .map(|id| ClusterId::new(id).map_err(|e| err(format!("localCluster: {e}"))))
            .transpose()?;
        if raw.members.is_empty() {
            return Err(err("members: at least the local cluster is needed".into()));
        }
        let mut members = Vec::new();
        let mut families = BTreeMap::new();
        for m in raw.members {
            let id = ClusterId::new(m.id).map_err(|e| err(format!("members: {e}")))?;
            if families.contains_key(&id) {
                return Err(err(format!("members: {id} is listed twice")));
            }
            let fams = cluster_families(&id, m.ip_families).map_err(err)?;
            families.insert(id.clone(), fams);
            if m.kubeconfig
                .as_ref()
                .is_some_and(|k| k.as_os_str().is_empty())
            {
                return Err(err(format!("members.{id}.kubeconfig is empty")));
            }
            members.push(Member {
                id,
                kubeconfig: m.kubeconfig,
                context: m.context,
                allow_unsafe_credentials: m.allow_unsafe_credentials,
            });
        }
        let cidrs = raw
            .cluster_set_cidrs
            .unwrap_or_default()
            .resolve()
            .map_err(err)?;
        let duration = |field: &str, v: Option<String>, default: Duration| {
            v.map_or(Ok(default), |v| {
                parse_duration(&v).map_err(|e| err(format!("{field}: {e}")))
            })
        };
        let unreachable_grace = duration(
            "unreachableGracePeriod",
            raw.unreachable_grace_period,
            DEFAULT_UNREACHABLE_GRACE,
        )?;
        let probe_interval = duration(
            "memberProbeInterval",
            raw.member_probe_interval,
            DEFAULT_PROBE_INTERVAL,
        )?;
        if probe_interval.is_zero() {
            return Err(err("memberProbeInterval must be positive".into()));
        }
        let defaults = LeaderElection::default();
        let le = raw.leader_election.unwrap_or(LeaderElectionFile {
            lease_name: None,
            lease_duration: None,
            renew_grace: None,
        });
        let leader_election = LeaderElection {
            lease_name: le.lease_name.unwrap_or(defaults.lease_name),
            lease_duration: duration(
                "leaderElection.leaseDuration",
                le.lease_duration,
                defaults.lease_duration,
            )?,
            renew_grace: duration(
                "leaderElection.renewGrace",
                le.renew_grace,
                defaults.renew_grace,
            )?,
        };
        // The Lease holds whole seconds (an int32), and the lease manager refuses a grace
        // that is not shorter than the duration in whole seconds: checked here, not there.
        let (lease_s, grace_s) = (leader_election.lease_duration, leader_election.renew_grace);
        if lease_s.subsec_nanos() != 0
            || grace_s.subsec_nanos() != 0
            || lease_s.as_secs() < 2
            || lease_s.as_secs() > i32::MAX as u64
            || grace_s.as_secs() < 1
            || grace_s >= lease_s
        {
            return Err(err(
                "leaderElection: leaseDuration must be at least 2s and renewGrace at least 1s \
                 and shorter than leaseDuration (whole seconds)"
                    .into(),
            ));
        }
        let cfg = AgentConfig {
            local_cluster,
            members,
            clusterset: ClusterSetConfig {
                cidrs,
                ip_family_policy: raw.ip_family_policy.unwrap_or_default(),
                clusters: families,
            },
            unreachable_grace,
            probe_interval,
            leader_election,
        };
        if let Some(local) = &cfg.local_cluster {
            cfg.check_local(local).map_err(err)?;
        }
        Ok(cfg)
    }

    /// Reads and parses a config file.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Checks that `local` is a member and that every other member has a kubeconfig.
    pub fn check_local(&self, local: &ClusterId) -> Result<(), String> {
        if !self.members.iter().any(|m| &m.id == local) {
            return Err(format!(
                "the local cluster {local} is not one of the members"
            ));
        }
        if let Some(m) = self
            .members
            .iter()
            .find(|m| &m.id != local && m.kubeconfig.is_none())
        {
            return Err(format!(
                "members.{}: a remote member needs a kubeconfig",
                m.id
            ));
        }
        Ok(())
    }

    /// The member entry of `id`.
    pub fn member(&self, id: &ClusterId) -> Option<&Member> {
        self.members.iter().find(|m| &m.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_core::fixtures::cluster;
    use dataplane_core::merge::ClusterSetCidrs;

    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::parse(text, Path::new("c.yaml"))
    }

    #[test]
    fn full_file() {
        let cfg = parse(
            r#"
localCluster: east
members:
  - {id: east, ipFamilies: [IPv4]}
  - {id: west, kubeconfig: /k/west, context: w}
clusterSetCIDRs: {ipv4: 10.99.0.0/24}
ipFamilyPolicy: Union
unreachableGracePeriod: 2s
memberProbeInterval: 100ms
leaderElection: {leaseName: l, leaseDuration: 4s, renewGrace: 1s}
"#,
        )
        .expect("valid");
        let east = cluster("east");
        let west = cluster("west");
        assert_eq!(cfg.local_cluster.as_ref(), Some(&east));
        assert_eq!(
            cfg.member(&west).and_then(|m| m.kubeconfig.clone()),
            Some(PathBuf::from("/k/west"))
        );
        assert_eq!(
            cfg.member(&west).and_then(|m| m.context.as_deref()),
            Some("w")
        );
        assert_eq!(cfg.clusterset.supported_families(&east), [IpFamily::IPv4]);
        assert_eq!(
            cfg.clusterset.supported_families(&west),
            [IpFamily::IPv4, IpFamily::IPv6]
        );
        assert_eq!(cfg.clusterset.cidrs.ipv4.to_string(), "10.99.0.0/24");
        assert_eq!(cfg.clusterset.cidrs.ipv6, ClusterSetCidrs::default().ipv6);
        assert_eq!(cfg.clusterset.ip_family_policy, IpFamilyPolicy::Union);
        assert_eq!(cfg.unreachable_grace, Duration::from_secs(2));
        assert_eq!(cfg.probe_interval, Duration::from_millis(100));
        assert_eq!(cfg.leader_election.lease_name, "l");
        assert_eq!(cfg.leader_election.lease_duration, Duration::from_secs(4));
    }

    #[test]
    fn local_cluster_may_come_later() {
        let cfg = parse("members: [{id: a}, {id: b, kubeconfig: /k}]\n").expect("valid");
        assert_eq!(cfg.local_cluster, None);
        assert!(cfg.check_local(&cluster("a")).is_ok());
        let e = cfg
            .check_local(&cluster("b"))
            .expect_err("a has no kubeconfig");
        assert!(e.contains("members.a"), "{e}");
        assert!(cfg.check_local(&cluster("c")).is_err());
    }

    #[test]
    fn errors_name_the_file_and_field() {
        for (bad, needle) in [
            ("members: []\n", "members"),
            ("members: [{id: a}, {id: a}]\n", "twice"),
            ("members: [{id: A}]\n", "members"),
            ("members: [{id: a, extra: 1}]\n", "extra"),
            ("members: [{id: a, ipFamilies: []}]\n", "ipFamilies"),
            ("members: [{id: a}]\nunknown: 1\n", "unknown"),
            (
                "members: [{id: a}]\nclusterSetCIDRs: {ipv4: 10.0.0.1/24}\n",
                "host bits",
            ),
            (
                "members: [{id: a}]\nunreachableGracePeriod: 5\n",
                "unreachableGracePeriod",
            ),
            (
                "members: [{id: a}]\nmemberProbeInterval: 0s\n",
                "memberProbeInterval",
            ),
            (
                "members: [{id: a}]\nleaderElection: {leaseDuration: 5s, renewGrace: 5s}\n",
                "renewGrace",
            ),
            (
                "members: [{id: a}]\nleaderElection: {leaseDuration: 2500ms, renewGrace: 2s}\n",
                "whole seconds",
            ),
            (
                "members: [{id: a}]\nleaderElection: {leaseDuration: 1000000h}\n",
                "leaseDuration",
            ),
            (
                "localCluster: b\nmembers: [{id: a}]\n",
                "not one of the members",
            ),
            (
                "localCluster: a\nmembers: [{id: a}, {id: b}]\n",
                "members.b",
            ),
        ] {
            let e = parse(bad).expect_err(bad).to_string();
            assert!(e.starts_with("c.yaml: "), "{e}");
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../deploy/examples/clusterset-config.yaml");
        let cfg = parse(text).expect("deploy/examples/clusterset-config.yaml");
        assert_eq!(cfg.local_cluster, Some(cluster("east")));
        assert_eq!(cfg.members.len(), 2);
        assert_eq!(cfg.unreachable_grace, DEFAULT_UNREACHABLE_GRACE);
        assert_eq!(cfg.clusterset.cidrs, ClusterSetCidrs::default());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "1.5s", "-1s", "1d", "1m30s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
