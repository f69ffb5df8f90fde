//! The MCS merge (KEP-1645): a pure, deterministic function from every member cluster's
//! Services, ServiceExports and EndpointSlices to what one importing cluster gets.
//!
//! The steps, each in its own file:
//! - [`exports`]: name mapping and validation of each ServiceExport against its Service
//!   (`Valid`/`Ready`), precedence (oldest `creationTimestamp`, ties by cluster id);
//! - [`families`]: the import's IP families (policy [`IpFamilyPolicy`]);
//! - [`ports`]: the union of ports, oldest definition wins, and which clusters declare each
//!   merged port identically (the routing rule of ARCHITECTURE.md §4);
//! - [`properties`]: type, session affinity, traffic policies, exported labels/annotations;
//! - [`conditions`]: the `Conflict` condition with the combined reasons and message;
//! - [`ips`]: ClusterSet IP allocation from configurable CIDRs, sticky across merges;
//! - [`slices`]: the imported EndpointSlices the node role routes from.
//!
//! The result does not depend on the order of the clusters, of the objects or of the existing
//! imports: everything is keyed and sorted before it is used.
//!
//! ```
//! use dataplane_core::merge::{self, ClusterSetConfig, ClusterSnapshot};
//! use dataplane_core::model::ClusterId;
//!
//! let c1 = ClusterId::new("c1").unwrap();
//! let snapshots = vec![ClusterSnapshot::empty(c1.clone())];
//! let plan = merge::merge(&snapshots, &ClusterSetConfig::default(), &c1, &[]);
//! assert!(plan.service_imports.is_empty());
//! ```

pub mod conditions;
pub mod exports;
pub mod families;
pub mod ips;
pub mod ports;
pub mod properties;
pub mod slices;
pub mod state;

use std::{collections::BTreeMap, sync::Arc};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use crate::manifest::Manifest;
use crate::model::{
    ClusterId, EndpointSlice, Interner, IpFamily, NamespacedName, Service, ServiceExport,
    ServiceImport, ServicePort,
    member::{ExportRecord, LocalSlice, ServiceRecord},
    records::{ImportRecord, ImportedSlice},
};

pub use conditions::{ConditionStatus, ConditionType, MergeCondition};
pub use state::{MemberChange, MergeState, ServiceOutput};

/// Everything one member cluster contributes, as records: its Services, ServiceExports and
/// local EndpointSlices (those with the label `kubernetes.io/service-name`).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSnapshot {
    /// The member cluster.
    pub cluster: ClusterId,
    /// Its Services.
    pub services: Vec<Arc<ServiceRecord>>,
    /// Its ServiceExports.
    pub service_exports: Vec<Arc<ExportRecord>>,
    /// Its local EndpointSlices.
    pub endpoint_slices: Vec<Arc<LocalSlice>>,
}

impl ClusterSnapshot {
    /// A snapshot of `cluster` with no objects.
    pub fn empty(cluster: ClusterId) -> Self {
        Self {
            cluster,
            services: Vec::new(),
            service_exports: Vec::new(),
            endpoint_slices: Vec::new(),
        }
    }

    /// Adds a member object read from a manifest, converted with `names`. A ServiceImport is
    /// not a member's input: it is handed back.
    pub fn add_manifest(&mut self, m: Manifest, names: &Interner) -> Option<Box<ServiceImport>> {
        match m {
            Manifest::Service(s) => self
                .services
                .push(Arc::new(ServiceRecord::from_k8s(&s, names))),
            Manifest::ServiceExport(e) => self
                .service_exports
                .push(Arc::new(ExportRecord::from_k8s(&e, names))),
            Manifest::EndpointSlice(s) => self
                .endpoint_slices
                .push(Arc::new(LocalSlice::from_k8s(&s, names))),
            Manifest::ServiceImport(si) => return Some(si),
        }
        None
    }

    /// A snapshot of `cluster` from API objects, converted with `names`.
    pub fn from_k8s(
        cluster: ClusterId,
        services: &[Service],
        exports: &[ServiceExport],
        slices: &[EndpointSlice],
        names: &Interner,
    ) -> Self {
        Self {
            cluster,
            services: services
                .iter()
                .map(|s| Arc::new(ServiceRecord::from_k8s(s, names)))
                .collect(),
            service_exports: exports
                .iter()
                .map(|e| Arc::new(ExportRecord::from_k8s(e, names)))
                .collect(),
            endpoint_slices: slices
                .iter()
                .map(|s| Arc::new(LocalSlice::from_k8s(s, names)))
                .collect(),
        }
    }
}

/// How the families of the exports combine into the import's `ipFamilies`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum IpFamilyPolicy {
    /// Only families every export supports, in the oldest export's order. An export with no
    /// family in common with the older ones is left out and raises `IPFamilyConflict`.
    ///
    /// A partial overlap (`[IPv4, IPv6]` and `[IPv4]` give `[IPv4]`) is **not** a conflict: the
    /// KEP asks for `IPFamilyConflict` when "traffic [may reach] only a subset of the backends
    /// depending on the IP protocol used", and over the intersection every backend of every
    /// contributing export is reachable whatever family the client uses. This is also
    /// Cilium's behaviour (`TestIntersectIPFamilies`).
    #[default]
    Intersection,
    /// Every family any export supports, ordered by the oldest export first. Raises
    /// `IPFamilyConflict` when the exports' family sets differ, since then a client of one
    /// family reaches only the exports of that family.
    Union,
}

/// Default ClusterSet IPv4 range: `241.0.0.0/16`, inside 240.0.0.0/4 ("reserved for future
/// use", RFC 1112), which no network routes, so a VIP that is not rewritten can never leave the
/// machine. 65,534 usable addresses.
pub const DEFAULT_IPV4_CIDR: &str = "241.0.0.0/16";
/// Default ClusterSet IPv6 range: `fd00:241::/112`, a unique-local (RFC 4193) range, not
/// routed on the internet. 65,534 usable addresses.
pub const DEFAULT_IPV6_CIDR: &str = "fd00:241::/112";

/// The CIDRs ClusterSet IPs are allocated from, one per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSetCidrs {
    /// Where IPv4 ClusterSet IPs come from ([`DEFAULT_IPV4_CIDR`] by default).
    pub ipv4: Ipv4Net,
    /// Where IPv6 ClusterSet IPs come from ([`DEFAULT_IPV6_CIDR`] by default).
    pub ipv6: Ipv6Net,
}

impl Default for ClusterSetCidrs {
    fn default() -> Self {
        Self {
            ipv4: Ipv4Net::new(std::net::Ipv4Addr::new(241, 0, 0, 0), 16)
                .unwrap_or_else(|_| Ipv4Net::default()),
            ipv6: Ipv6Net::new(
                std::net::Ipv6Addr::new(0xfd00, 0x241, 0, 0, 0, 0, 0, 0),
                112,
            )
            .unwrap_or_else(|_| Ipv6Net::default()),
        }
    }
}

/// ClusterSet-wide settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterSetConfig {
    /// The ranges ClusterSet IPs are allocated from.
    pub cidrs: ClusterSetCidrs,
    /// How the exports' IP families combine into the import's.
    pub ip_family_policy: IpFamilyPolicy,
    /// Families each cluster supports. A cluster that is not listed supports both.
    pub clusters: BTreeMap<ClusterId, Vec<IpFamily>>,
}

impl ClusterSetConfig {
    /// The families `cluster` supports, in its preferred order (IPv4 then IPv6 by default).
    pub fn supported_families(&self, cluster: &ClusterId) -> Vec<IpFamily> {
        match self.clusters.get(cluster) {
            Some(families) if !families.is_empty() => families.clone(),
            _ => vec![IpFamily::IPv4, IpFamily::IPv6],
        }
    }
}

/// The conditions the merge sets on one ServiceExport.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ExportStatus {
    /// The cluster of the ServiceExport.
    pub cluster: ClusterId,
    /// The ServiceExport's namespace/name, that of the Service it exports.
    pub service: NamespacedName,
    /// `Valid`, `Ready` and, for valid exports, `Conflict`.
    pub conditions: conditions::ExportConditions,
}

impl ExportStatus {
    /// Its `Conflict` condition when that is True (the reasons are in it, comma-separated).
    pub fn conflict(&self) -> Option<&conditions::MergeCondition> {
        self.conditions.iter().find(|c| {
            c.type_ == conditions::ConditionType::Conflict
                && c.status == conditions::ConditionStatus::True
        })
    }
}

/// A merged port and the clusters whose Service declares it identically (same name, protocol
/// and port; `appProtocol` is not compared, see [`ports`]). Only those clusters' endpoints
/// serve it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MergedPort {
    /// The port as the import lists it.
    pub port: ServicePort,
    /// The clusters whose endpoints serve it, sorted by id.
    pub clusters: Vec<ClusterId>,
}

/// The message of a [`Diagnostic`] (and of the lb table's warning) about an object defined
/// more than once: the smallest definition is used, whatever the order of the input.
pub const DUPLICATE: &str = "defined more than once; one definition is used";

/// Something in the input that was skipped or repaired, naming the object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Diagnostic {
    /// The member cluster the object belongs to, when there is one.
    pub cluster: Option<ClusterId>,
    /// `Kind namespace/name`, e.g. `EndpointSlice demo/web-abc`.
    pub object: String,
    /// What was wrong and what was done about it.
    pub message: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(c) = &self.cluster {
            write!(f, "cluster {c}: ")?;
        }
        write!(f, "{}: {}", self.object, self.message)
    }
}

/// The result of a merge, as one importing cluster sees it. Every list is sorted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergeOutput {
    /// The cluster this view is for; `None` only in [`MergeOutput::default`].
    pub importing_cluster: Option<ClusterId>,
    /// The ServiceImports of the importing cluster, sorted by namespace/name.
    pub service_imports: Vec<ImportRecord>,
    /// The conditions of every ServiceExport of every cluster, sorted by cluster then service.
    pub export_statuses: Vec<ExportStatus>,
    /// The imported EndpointSlices for the importing cluster, sorted by namespace/name. Their
    /// endpoints are shared with the member's local slices whenever they are the same.
    pub endpoint_slices: Vec<ImportedSlice>,
    /// What in the input was skipped or repaired, sorted, without duplicates.
    pub diagnostics: Vec<Diagnostic>,
}

/// Merges the snapshots for `importing`. `existing` are the importing cluster's current
/// ServiceImports; their ClusterSet IPs are kept while they stay valid.
///
/// Snapshots with the same cluster id are combined into one cluster (and reported in
/// [`MergeOutput::diagnostics`]); so are duplicate objects within a cluster.
///
/// ```
/// use dataplane_core::merge::{self, ClusterSetConfig, ClusterSnapshot};
/// use dataplane_core::model::{ClusterId, Interner, Service, ServiceExport};
///
/// let c1 = ClusterId::new("c1").unwrap();
/// let service = "metadata: {name: web, namespace: demo}\nspec: {ports: [{port: 80}]}";
/// let export = "metadata: {name: web, namespace: demo}";
/// let snapshot = ClusterSnapshot::from_k8s(
///     c1.clone(),
///     &[serde_yaml::from_str::<Service>(service).unwrap()],
///     &[serde_yaml::from_str::<ServiceExport>(export).unwrap()],
///     &[],
///     &Interner::new(),
/// );
///
/// let out = merge::merge(&[snapshot], &ClusterSetConfig::default(), &c1, &[]);
/// let web = &out.service_imports[0];
/// assert_eq!(web.ports[0].port, 80);
/// // No family is known, so the import gets c1's first one, IPv4, and an IP from 241.0.0.0/16.
/// assert!(web.ips[0].to_string().starts_with("241.0."));
/// ```
pub fn merge(
    snapshots: &[ClusterSnapshot],
    config: &ClusterSetConfig,
    importing: &ClusterId,
    existing: &[ImportRecord],
) -> MergeOutput {
    let mut state = MergeState::new(config.clone(), importing.clone());
    state.load(snapshots, existing);
    state.output()
}

#[cfg(test)]
mod tests;
