//! A ClusterSet as a directory of manifests (standalone mode, `plan`, tests).
//!
//! ```text
//! DIR/
//!   clusterset.yaml        optional, see below
//!   <cluster-id>/*.yaml    multi-document manifests: Services, ServiceExports, local
//!                          EndpointSlices (label kubernetes.io/service-name), and optionally
//!                          the cluster's current ServiceImports (used for IP stickiness)
//! ```
//!
//! Every sub-directory whose name does not start with `.` is a cluster and its name must be a
//! valid cluster id; files at the top other than `clusterset.yaml` are ignored. `clusterset.yaml`:
//!
//! ```yaml
//! clusterSetCIDRs: {ipv4: 241.0.0.0/16, ipv6: "fd00:241::/112"}   # defaults shown
//! ipFamilyPolicy: Intersection                                     # or Union
//! clusters:
//!   east: {ipFamilies: [IPv4]}                                    # default: [IPv4, IPv6]
//! ```
//!
//! Unknown keys are errors. A CIDR must have no host bits set and leave at least two usable
//! addresses (IPv4 /30 or shorter, IPv6 /126 or shorter).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Deserialize;

use super::{clusterset_files::ClusterSetFiles, manifests::ManifestError};
use dataplane_core::{
    merge::{self, ClusterSetCidrs, ClusterSetConfig, ClusterSnapshot, IpFamilyPolicy},
    model::{ClusterId, InvalidClusterId, IpFamily, records::ImportRecord},
    plan::{Merged, Plan},
};

/// The optional configuration file at the top of the directory.
pub const CONFIG_FILE: &str = "clusterset.yaml";

/// Why a ClusterSet directory cannot be used at all. Problems with single documents are not
/// errors: they are [`ManifestError`]s in [`ClusterSetDir::errors`].
#[derive(Debug, thiserror::Error)]
pub enum ClusterSetDirError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: the directory name is not a valid cluster id: {source}", path.display())]
    InvalidClusterDir {
        path: PathBuf,
        source: InvalidClusterId,
    },
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConfigFile {
    #[serde(default, rename = "clusterSetCIDRs")]
    cluster_set_cidrs: Option<CidrsFile>,
    #[serde(default)]
    ip_family_policy: Option<IpFamilyPolicy>,
    #[serde(default)]
    clusters: BTreeMap<String, ClusterFile>,
}

/// `clusterSetCIDRs` as written in a file; also used by the agent's ClusterSet config
/// ([`crate::config`]).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CidrsFile {
    #[serde(default)]
    pub(crate) ipv4: Option<Ipv4Net>,
    #[serde(default)]
    pub(crate) ipv6: Option<Ipv6Net>,
}

impl CidrsFile {
    /// The CIDRs, defaulted and checked: no host bits, at least two usable addresses.
    pub(crate) fn resolve(self) -> Result<ClusterSetCidrs, String> {
        let mut cidrs = ClusterSetCidrs::default();
        if let Some(v4) = self.ipv4 {
            if v4.network() != v4.addr() {
                return Err(format!(
                    "clusterSetCIDRs.ipv4 {v4} has host bits set (use {})",
                    v4.trunc()
                ));
            }
            if v4.prefix_len() > 30 {
                return Err(format!(
                    "clusterSetCIDRs.ipv4 {v4} is too small (at most /30)"
                ));
            }
            cidrs.ipv4 = v4;
        }
        if let Some(v6) = self.ipv6 {
            if v6.network() != v6.addr() {
                return Err(format!(
                    "clusterSetCIDRs.ipv6 {v6} has host bits set (use {})",
                    v6.trunc()
                ));
            }
            if v6.prefix_len() > 126 {
                return Err(format!(
                    "clusterSetCIDRs.ipv6 {v6} is too small (at most /126)"
                ));
            }
            cidrs.ipv6 = v6;
        }
        Ok(cidrs)
    }
}

/// A cluster's `ipFamilies`, defaulted to both and checked.
pub(crate) fn cluster_families(
    cluster: &ClusterId,
    families: Option<Vec<IpFamily>>,
) -> Result<Vec<IpFamily>, String> {
    let families = families.unwrap_or_else(|| vec![IpFamily::IPv4, IpFamily::IPv6]);
    if families.is_empty()
        || families.len() > 2
        || (families.len() == 2 && families[0] == families[1])
    {
        return Err(format!(
            "clusters.{cluster}.ipFamilies must list IPv4 and/or IPv6 once each, got {families:?}"
        ));
    }
    Ok(families)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClusterFile {
    #[serde(default)]
    ip_families: Option<Vec<IpFamily>>,
}

/// Parses `clusterset.yaml`. `file` is only used in errors.
///
/// ```
/// use dataplane_agent::source::clusterset_dir::parse_config;
/// let cfg = parse_config("ipFamilyPolicy: Union\n", "clusterset.yaml".as_ref()).unwrap();
/// assert_eq!(cfg.ip_family_policy, dataplane_core::merge::IpFamilyPolicy::Union);
/// ```
pub fn parse_config(text: &str, file: &Path) -> Result<ClusterSetConfig, ClusterSetDirError> {
    let err = |message: String| ClusterSetDirError::Config {
        path: file.to_owned(),
        message,
    };
    // An empty file is the default configuration.
    let raw: Option<ConfigFile> =
        serde_yaml::from_str(text).map_err(|e| err(format!("invalid {CONFIG_FILE}: {e}")))?;
    let raw = raw.unwrap_or(ConfigFile {
        cluster_set_cidrs: None,
        ip_family_policy: None,
        clusters: BTreeMap::new(),
    });
    let cidrs = raw
        .cluster_set_cidrs
        .unwrap_or_default()
        .resolve()
        .map_err(err)?;
    let mut clusters = BTreeMap::new();
    for (id, c) in raw.clusters {
        let cluster = ClusterId::new(id).map_err(|e| err(format!("clusters: {e}")))?;
        let families = cluster_families(&cluster, c.ip_families).map_err(err)?;
        clusters.insert(cluster, families);
    }
    Ok(ClusterSetConfig {
        cidrs,
        ip_family_policy: raw.ip_family_policy.unwrap_or_default(),
        clusters,
    })
}

/// Everything read from a ClusterSet directory.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSetDir {
    pub config: ClusterSetConfig,
    /// One per cluster directory, sorted by cluster id.
    pub snapshots: Vec<ClusterSnapshot>,
    /// ServiceImports found in each cluster's directory (that cluster's current imports).
    pub imports: BTreeMap<ClusterId, Vec<ImportRecord>>,
    /// Documents that could not be used, sorted by file and document.
    pub errors: Vec<ManifestError>,
    /// The file each object came from, keyed by cluster and `Kind namespace/name` (the
    /// smallest path when an object is defined twice), to name files in diagnostics.
    pub sources: BTreeMap<(ClusterId, String), PathBuf>,
}

impl ClusterSetDir {
    /// The cluster ids, sorted.
    pub fn cluster_ids(&self) -> Vec<&ClusterId> {
        self.snapshots.iter().map(|s| &s.cluster).collect()
    }
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ClusterSetDirError + '_ {
    move |source| ClusterSetDirError::Io {
        path: path.to_owned(),
        source,
    }
}

/// `DIR/clusterset.yaml`, or the default configuration when there is none.
pub(crate) fn read_config(dir: &Path) -> Result<ClusterSetConfig, ClusterSetDirError> {
    let config_path = dir.join(CONFIG_FILE);
    if !config_path.is_file() {
        return Ok(ClusterSetConfig::default());
    }
    let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
    parse_config(&text, &config_path)
}

/// The cluster directories of `dir` (every sub-directory not starting with `.`), sorted.
pub(crate) fn cluster_dirs(dir: &Path) -> Result<Vec<(ClusterId, PathBuf)>, ClusterSetDirError> {
    let mut cluster_dirs = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        if !path.is_dir() {
            continue;
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        let cluster =
            ClusterId::new(name).map_err(|source| ClusterSetDirError::InvalidClusterDir {
                path: path.clone(),
                source,
            })?;
        cluster_dirs.push((cluster, path));
    }
    cluster_dirs.sort();
    Ok(cluster_dirs)
}

/// Reads a ClusterSet directory. The result does not depend on the order in which the file
/// system lists files.
///
/// ```no_run
/// let dir = dataplane_agent::source::clusterset_dir::read("clusterset".as_ref())?;
/// for e in &dir.errors { eprintln!("{e}"); }
/// # Ok::<(), dataplane_agent::source::clusterset_dir::ClusterSetDirError>(())
/// ```
pub fn read(dir: &Path) -> Result<ClusterSetDir, ClusterSetDirError> {
    let files = ClusterSetFiles::load(dir)?;
    Ok(ClusterSetDir {
        config: files.config().clone(),
        snapshots: files.snapshots(),
        imports: files
            .cluster_ids()
            .map(|c| (c.clone(), files.imports(c)))
            .filter(|(_, imports)| !imports.is_empty())
            .collect(),
        errors: files.errors(),
        sources: files.sources(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_core::fixtures::cluster;

    #[test]
    fn config_defaults_and_errors() {
        let cfg = parse_config("", Path::new("c.yaml")).expect("empty is default");
        assert_eq!(cfg, ClusterSetConfig::default());
        let cfg = parse_config(
            "clusterSetCIDRs: {ipv4: 10.99.0.0/24}\nclusters: {east: {ipFamilies: [IPv6]}, west: {}}\n",
            Path::new("c.yaml"),
        )
        .expect("valid");
        assert_eq!(cfg.cidrs.ipv4.to_string(), "10.99.0.0/24");
        assert_eq!(cfg.cidrs.ipv6, ClusterSetCidrs::default().ipv6);
        let east = cluster("east");
        let west = cluster("west");
        assert_eq!(cfg.supported_families(&east), vec![IpFamily::IPv6]);
        assert_eq!(
            cfg.supported_families(&west),
            vec![IpFamily::IPv4, IpFamily::IPv6]
        );
        for bad in [
            "unknown: 1\n",
            "clusterSetCIDRs: {ipv4: 10.0.0.1/24}\n",
            "clusterSetCIDRs: {ipv4: 10.0.0.0/31}\n",
            "clusterSetCIDRs: {ipv4: nonsense}\n",
            "clusterSetCIDRs: {ipv5: 10.0.0.0/8}\n",
            "ipFamilyPolicy: Majority\n",
            "clusters: {Bad_Id: {}}\n",
            "clusters: {a: {ipFamilies: []}}\n",
            "clusters: {a: {ipFamilies: [IPv4, IPv4]}}\n",
            "clusters: {a: {ipFamilies: [IPv4], extra: 1}}\n",
        ] {
            let e = parse_config(bad, Path::new("c.yaml")).expect_err(bad);
            assert!(e.to_string().starts_with("c.yaml: "), "{e}");
        }
    }
}

/// Why a ClusterSet directory cannot be merged at all.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Dir(#[from] ClusterSetDirError),
    #[error("{}: no cluster directory", dir.display())]
    NoClusters { dir: PathBuf },
    #[error("cluster {cluster} is neither a directory of {} nor listed in its clusterset.yaml", dir.display())]
    UnknownCluster { cluster: ClusterId, dir: PathBuf },
}

/// Reads `dir`, merges for `cluster` (default: the first cluster id in sorted order) and builds
/// the lb table: what `plan` prints. ServiceImports found in the importing cluster's directory
/// are its existing imports (their ClusterSet IPs are kept).
///
/// ```no_run
/// let plan = dataplane_agent::source::clusterset_dir::plan("clusterset".as_ref(), None)?;
/// print!("{}", plan.to_json());
/// # Ok::<(), dataplane_agent::source::clusterset_dir::PlanError>(())
/// ```
pub fn plan(dir: &Path, cluster: Option<&ClusterId>) -> Result<Plan, PlanError> {
    Ok(Plan::new(merge(dir, cluster, None)?))
}

/// Reads `dir` and merges it for `cluster` (default: the first cluster id in sorted order).
/// `current_imports` are the importing cluster's current imports, whose ClusterSet IPs are kept
/// (standalone mode passes its previous result); by default the ServiceImports found in that
/// cluster's directory.
pub fn merge(
    dir: &Path,
    cluster: Option<&ClusterId>,
    current_imports: Option<&[ImportRecord]>,
) -> Result<Merged, PlanError> {
    let read = read(dir)?;
    let cluster = importing_cluster(dir, read.cluster_ids(), &read.config, cluster)?;
    let existing = current_imports
        .unwrap_or_else(|| read.imports.get(&cluster).map(Vec::as_slice).unwrap_or(&[]));
    let merge = merge::merge(&read.snapshots, &read.config, &cluster, existing);
    Ok(Merged {
        cluster,
        merge,
        manifest_errors: read.errors,
        sources: read.sources,
        cidrs: read.config.cidrs,
    })
}

/// The importing cluster: `cluster`, which must be a cluster directory or listed in the
/// configuration, or by default the first cluster id in sorted order.
pub(crate) fn importing_cluster<'a>(
    dir: &Path,
    cluster_ids: impl IntoIterator<Item = &'a ClusterId>,
    config: &ClusterSetConfig,
    cluster: Option<&ClusterId>,
) -> Result<ClusterId, PlanError> {
    let mut ids = cluster_ids.into_iter();
    match cluster {
        Some(c) if ids.any(|id| id == c) || config.clusters.contains_key(c) => Ok(c.clone()),
        Some(c) => Err(PlanError::UnknownCluster {
            cluster: c.clone(),
            dir: dir.to_owned(),
        }),
        None => ids.next().cloned().ok_or_else(|| PlanError::NoClusters {
            dir: dir.to_owned(),
        }),
    }
}
