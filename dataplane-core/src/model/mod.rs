//! Kubernetes and MCS (KEP-1645) types.
//!
//! `ServiceExport` and `ServiceImport` follow `multicluster.x-k8s.io` v1beta1 (the storage
//! version). v1alpha1 has the same schema and is accepted on input; both are generated from the
//! one field list below so they cannot drift. Services and EndpointSlices come from k8s-openapi.

use std::{fmt, str::FromStr, sync::Arc};

pub use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The MCS API group of ServiceExport and ServiceImport.
pub const GROUP: &str = "multicluster.x-k8s.io";
/// The apiVersion ServiceExports and ServiceImports are read as, written in and stored in.
pub const API_VERSION_V1BETA1: &str = "multicluster.x-k8s.io/v1beta1";
/// The older apiVersion: the same schema, accepted on input and read as v1beta1.
pub(crate) const API_VERSION_V1ALPHA1: &str = "multicluster.x-k8s.io/v1alpha1";

/// Label on imported EndpointSlices: the ServiceImport they belong to.
pub const LABEL_SERVICE_NAME: &str = "multicluster.kubernetes.io/service-name";
/// Label on imported EndpointSlices: the cluster id the endpoints come from.
pub const LABEL_SOURCE_CLUSTER: &str = "multicluster.kubernetes.io/source-cluster";
/// Standard EndpointSlice label naming the controller that manages the slice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Our value of [`LABEL_MANAGED_BY`] (never `endpointslice-controller.k8s.io`).
pub const MANAGED_BY: &str = "mcs-dataplane.x-k8s.io";
/// Recommended Kubernetes label naming the tool that manages an object; the controller puts it
/// (with [`MANAGED_BY`]) on the ServiceImports it writes, and only ever deletes those.
pub const LABEL_APP_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The one server-side-apply field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "mcs-dataplane";
/// Standard EndpointSlice label naming the Service of a local slice.
pub const LABEL_K8S_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// An IP family, as in `Service.spec.ipFamilies` and `ServiceImport.spec.ipFamilies`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum IpFamily {
    /// 32-bit addresses: EndpointSlices of `addressType: IPv4`, ClusterSet IPs from the IPv4 CIDR.
    IPv4,
    /// 128-bit addresses: EndpointSlices of `addressType: IPv6`, ClusterSet IPs from the IPv6 CIDR.
    IPv6,
}

impl IpFamily {
    /// The EndpointSlice `addressType` carrying this family.
    pub fn address_type(self) -> &'static str {
        match self {
            IpFamily::IPv4 => "IPv4",
            IpFamily::IPv6 => "IPv6",
        }
    }

    /// The family an address belongs to.
    pub fn of(ip: &std::net::IpAddr) -> Self {
        match ip {
            std::net::IpAddr::V4(_) => IpFamily::IPv4,
            std::net::IpAddr::V6(_) => IpFamily::IPv6,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.address_type())
    }
}

impl FromStr for IpFamily {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "IPv4" => Ok(IpFamily::IPv4),
            "IPv6" => Ok(IpFamily::IPv6),
            other => Err(format!(
                "unknown IP family {other:?} (expected IPv4 or IPv6)"
            )),
        }
    }
}

/// `ServiceImport.spec.type`.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum ServiceImportType {
    /// Reached at the ClusterSet IPs the merge allocates, which the nodes load-balance.
    #[default]
    ClusterSetIP,
    /// No ClusterSet IP: clients find the endpoints through DNS (`clusterIP: None` Services).
    Headless,
}

impl fmt::Display for ServiceImportType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServiceImportType::ClusterSetIP => "ClusterSetIP",
            ServiceImportType::Headless => "Headless",
        })
    }
}

/// A port of a ServiceImport: the externally visible part of a Service port.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// DNS_LABEL, unique within the ports; matches EndpointPort.name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// TCP, UDP or SCTP; TCP when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// A hint for L7 proxies; not compared for routing, though a difference still conflicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    /// The port clients connect to, 1..=65535.
    pub port: i32,
}

impl ServicePort {
    /// The name with `None` and `""` treated alike (both are the unnamed port).
    pub fn name_or_empty(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    /// The protocol with Kubernetes' default applied.
    pub fn protocol_or_tcp(&self) -> &str {
        self.protocol.as_deref().unwrap_or("TCP")
    }
}

/// `sessionAffinityConfig`, as in core/v1.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinityConfig {
    /// `clientIP` in the API (camelCase would give `clientIp`).
    #[serde(
        default,
        rename = "clientIP",
        alias = "clientIp",
        skip_serializing_if = "Option::is_none"
    )]
    pub client_ip: Option<ClientIpConfig>,
}

/// `ClientIP` session-affinity settings, as `clientIPConfig` in core/v1.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    /// How long a client keeps its backend, in seconds; unset means 10800 (3 hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
}

/// One entry of `ServiceImport.status.clusters`.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub struct ClusterStatus {
    /// The id of a member cluster whose export makes up the import.
    pub cluster: String,
}

/// `ServiceExport.status`: what the controller found of the export.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServiceExportStatus {
    /// `Valid`, `Ready`, `Conflict` and `EndpointsRefused`, set by the controller, and any condition others set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// `ServiceImport.status`: where the import comes from and whether it is ready.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServiceImportStatus {
    /// The member clusters whose exports make up the import, sorted by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterStatus>,
    /// The import's `Ready` condition, set by the controller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

pub mod by_id;
mod crd;
pub mod dns;
mod ip;
pub mod member;
pub mod name;
pub mod records;

pub use crd::{CRD_HEADER, crds, v1alpha1, v1beta1};
pub use ip::{is_ipv4, parse_ip, parse_ipv4};
pub use name::{Interner, Name};
pub use v1beta1::{ServiceExport, ServiceExportSpec, ServiceImport, ServiceImportSpec};

/// A cluster id: an RFC-1123 DNS label (lowercase alphanumerics and '-', 1..=63 characters,
/// starting and ending with an alphanumeric). It names a member cluster in `status.clusters`
/// and in the `source-cluster` label.
///
/// Shared (`Arc<str>`): the merge and the lb table copy a cluster id into every export status,
/// merged port and backend, and a copy is then a reference count, not an allocation.
#[derive(Clone, Debug, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClusterId(Arc<str>);

impl std::hash::Hash for ClusterId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

// Compared by content, with copies of one id (the common case when sorting backends) equal at
// once without reading the text.
impl PartialEq for ClusterId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Ord for ClusterId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            std::cmp::Ordering::Equal
        } else {
            self.0.cmp(&other.0)
        }
    }
}

impl PartialOrd for ClusterId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Why a text cannot be a [`ClusterId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cluster id {id:?}: {why} (cluster ids are RFC-1123 DNS labels)")]
pub struct InvalidClusterId {
    /// The text that was refused.
    pub id: String,
    /// The rule it breaks.
    pub why: &'static str,
}

impl ClusterId {
    /// Checks `id` against the rules of a cluster id (an RFC-1123 DNS label).
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidClusterId> {
        let id = id.into();
        let why = if id.is_empty() {
            Some("empty")
        } else if id.len() > 63 {
            Some("longer than 63 characters")
        } else if !id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            Some("only lowercase letters, digits and '-' are allowed")
        } else if id.starts_with('-') || id.ends_with('-') {
            Some("must start and end with a letter or digit")
        } else {
            None
        };
        match why {
            Some(why) => Err(InvalidClusterId { id, why }),
            None => Ok(ClusterId(id.into())),
        }
    }

    /// The id's text, as in `status.clusters` and the `source-cluster` label.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The same id, sharing `names`' allocation of its text.
    pub fn interned(self, names: &Interner) -> ClusterId {
        ClusterId(names.intern(&self.0))
    }

    /// The id's text, shared: map sync keeps it per backend without copying it.
    pub fn shared(&self) -> Arc<str> {
        Arc::clone(&self.0)
    }
}

impl TryFrom<String> for ClusterId {
    type Error = InvalidClusterId;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        ClusterId::new(s)
    }
}

impl From<ClusterId> for String {
    fn from(c: ClusterId) -> String {
        c.0.as_ref().to_owned()
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ClusterId {
    type Err = InvalidClusterId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ClusterId::new(s)
    }
}

/// (namespace, name) borrowed from an object, the namespace defaulting to `default` as in
/// [`NamespacedName::of`]: looking objects up by it allocates nothing.
pub type Key<'a> = (&'a str, &'a str);

/// The [`Key`] of an object.
pub fn key(meta: &ObjectMeta) -> Key<'_> {
    (
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or(""),
    )
}

/// The numeric value of an object's resourceVersion (etcd revisions are increasing integers; 0
/// when it is missing or not a number): what tells a write from the watch event it causes.
pub fn resource_version(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Kubernetes' default ClientIP session-affinity timeout (3 hours), used when an import has
/// `ClientIP` affinity without a timeout.
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10800;

/// Namespace and name of a namespaced object.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NamespacedName {
    /// The object's namespace.
    pub namespace: Name,
    /// The object's name, unique in its namespace for its kind.
    pub name: Name,
}

/// A copy sharing the names, for maps that clone a key only to insert it.
impl From<&NamespacedName> for NamespacedName {
    fn from(id: &NamespacedName) -> Self {
        id.clone()
    }
}

impl NamespacedName {
    /// The namespace/name of the given parts, taken as they are (no defaulting).
    pub fn new(namespace: impl Into<Name>, name: impl Into<Name>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The two names, borrowed.
    pub fn id_ref(&self) -> IdRef<'_> {
        IdRef {
            namespace: &self.namespace,
            name: &self.name,
        }
    }

    /// The namespace/name of an object, with the namespace defaulted to `default`.
    pub fn of(meta: &ObjectMeta) -> Self {
        let (namespace, name) = key(meta);
        Self::new(namespace, name)
    }
}

/// A namespace/name as two borrowed names: what a record that keeps them apart (an imported
/// slice keeps its service's namespace and its own name) gives without building a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IdRef<'a> {
    /// The object's namespace.
    pub namespace: &'a Name,
    /// The object's name.
    pub name: &'a Name,
}

impl IdRef<'_> {
    /// The owned namespace/name, sharing the names.
    pub fn to_owned(self) -> NamespacedName {
        NamespacedName::new(self.namespace.clone(), self.name.clone())
    }
}

impl fmt::Display for IdRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl<'a> From<&'a NamespacedName> for IdRef<'a> {
    fn from(id: &'a NamespacedName) -> Self {
        id.id_ref()
    }
}

impl PartialEq<NamespacedName> for IdRef<'_> {
    fn eq(&self, other: &NamespacedName) -> bool {
        *self.namespace == other.namespace && *self.name == other.name
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.id_ref().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_are_dns_labels() {
        for ok in ["a", "cluster-1", "east1", "x".repeat(63).as_str()] {
            assert!(ClusterId::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", "x".repeat(64).as_str()] {
            assert!(ClusterId::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn service_import_round_trips_with_type_field() {
        let yaml = r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: web, namespace: demo}
spec:
  type: ClusterSetIP
  ips: [241.0.0.10, "fd00::10"]
  ipFamilies: [IPv4, IPv6]
  ports: [{name: http, protocol: TCP, port: 80}]
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
"#;
        let si: ServiceImport = serde_yaml::from_str(yaml).expect("parse");
        assert_eq!(si.spec.type_, ServiceImportType::ClusterSetIP);
        let timeout = si
            .spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref());
        assert_eq!(timeout.and_then(|c| c.timeout_seconds), Some(60));
        assert_eq!(si.spec.ip_families, vec![IpFamily::IPv4, IpFamily::IPv6]);
        let back = serde_json::to_value(&si).expect("serialize");
        assert_eq!(back["spec"]["type"], "ClusterSetIP");
        assert_eq!(back["spec"]["ipFamilies"][1], "IPv6");
    }

    #[test]
    fn endpoints_keep_their_addresses_and_order_in_either_form() {
        use records::{Conditions, Endpoint, Endpoints};
        let ep = |a: &str, ready| {
            let endpoint = Endpoint {
                addr: a.parse().expect("an address"),
                conditions: Conditions::new(Some(ready), None, None),
            };
            (endpoint, None)
        };
        let v4 = Endpoints::new([ep("10.0.0.2", true), ep("10.0.0.1", false)]);
        let mixed = Endpoints::new([ep("10.0.0.2", true), ep("fd00::1", false)]);
        let addrs = |e: &Endpoints| e.list().map(|e| e.addr.to_string()).collect::<Vec<_>>();
        assert_eq!(addrs(&v4), ["10.0.0.2", "10.0.0.1"]);
        assert_eq!(addrs(&mixed), ["10.0.0.2", "fd00::1"]);
        assert_eq!(v4.list().len(), 2);
        assert!(
            v4.list()
                .nth(1)
                .is_some_and(|e| e.conditions.ready() == Some(false))
        );
        assert!(v4.any_ready() && mixed.any_ready());
        assert_eq!(Endpoints::default(), Endpoints::new([]));
        assert!(Endpoints::default().is_empty());
    }

    #[test]
    fn a_converted_slice_names_its_object_from_the_record_or_alone_when_unusable() {
        use crate::fixtures::imported_slice;
        use records::{Converted, ImportedSlice};
        let names = Interner::new();
        let usable = ImportedSlice::from_k8s(
            &imported_slice("ns", "web-east-ipv4", "web", "east").build(),
            &names,
        );
        assert!(usable.record().is_some());
        assert_eq!(usable.id(), NamespacedName::new("ns", "web-east-ipv4"));
        assert_eq!(usable.service(), Some(&NamespacedName::new("ns", "web")));
        let mut unlabelled = imported_slice("ns", "stray", "web", "east").build();
        unlabelled.metadata.labels = None;
        let unusable = ImportedSlice::from_k8s(&unlabelled, &names);
        assert!(unusable.record().is_none());
        assert_eq!(unusable.id(), NamespacedName::new("ns", "stray"));
        assert_eq!(unusable.service(), None);
        // The record names its object itself: a shared converted slice (with its two
        // reference counts) is one 128-byte allocation, not 192 as with a copy of the names.
        assert!(std::mem::size_of::<Converted<ImportedSlice>>() <= 112);
    }

    #[test]
    fn an_import_without_labels_annotations_or_status_keeps_no_room_for_them() {
        use std::collections::BTreeMap;

        use records::{ImportRecord, StringMap};
        let names = Interner::new();
        let mut si = crate::fixtures::import("ns", "web").build();
        si.metadata.labels = Some(BTreeMap::from([("team".into(), "a".into())]));
        let node = ImportRecord::from_k8s(&si, &names, false)
            .into_record()
            .expect("record");
        let controller = ImportRecord::from_k8s(&si, &names, true)
            .into_record()
            .expect("record");
        assert!(node.labels.is_empty() && node.status.is_none());
        assert_eq!(controller.labels.get("team").map(String::as_str), Some("a"));
        // No map and an empty one are the same labels.
        assert_eq!(StringMap::default(), StringMap::from(BTreeMap::new()));
        assert_ne!(node.labels, controller.labels);
        // Labels, annotations and status: a pointer each (they were 24, 24 and 48 bytes).
        assert!(std::mem::size_of::<ImportRecord>() <= 200);
    }
}
