//! The MCS CRD types, `ServiceExport` and `ServiceImport`, in both served versions, and the
//! CRDs generated from them (`deploy/crds/`).

use std::collections::BTreeMap;

use kube_core::CustomResourceExt as _;

/// Generates the ServiceExport and ServiceImport types of one API version. Both versions share
/// the schema, so the field list exists once.
macro_rules! mcs_version {
    ($version:literal) => {
        use std::collections::BTreeMap;

        use kube_derive::CustomResource;
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        pub use super::super::{
            ClusterStatus, IpFamily, ServiceExportStatus, ServiceImportStatus, ServiceImportType,
            ServicePort, SessionAffinityConfig,
        };

        /// Declares that the Service of the same namespace/name is exported to the ClusterSet.
        ///
        /// The derived root type is only used to generate the CRD; [`ServiceExport`] is written by
        /// hand because `spec` is optional in the MCS API and objects without it must still parse.
        #[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[kube(
            crates(kube_core = "::kube_core", k8s_openapi = "::k8s_openapi", schemars = "::schemars", serde = "::serde", serde_json = "::serde_json"),
            group = "multicluster.x-k8s.io",
            version = $version,
            kind = "ServiceExport",
            root = "ServiceExportCrd",
            namespaced,
            status = "ServiceExportStatus",
            shortname = "svcex",
            shortname = "svcexport",
            derive = "Default",
            derive = "PartialEq",
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        #[serde(rename_all = "camelCase")]
        pub struct ServiceExportSpec {
            /// Labels for the ServiceImport; the oldest export's map is used, and any difference
            /// conflicts (`LabelsConflict`).
            #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
            pub exported_labels: BTreeMap<String, String>,
            /// Annotations for the ServiceImport; the oldest export's map is used, and any
            /// difference conflicts (`AnnotationsConflict`).
            #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
            pub exported_annotations: BTreeMap<String, String>,
        }

        /// A ServiceExport; `spec` defaults to empty when absent, as the MCS API allows.
        #[derive(Clone, Debug, Default, PartialEq, Deserialize)]
        pub struct ServiceExport {
            /// Its namespace/name names the Service it exports.
            pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            /// What the import gets besides the Service: labels and annotations.
            #[serde(default)]
            pub spec: ServiceExportSpec,
            /// The controller's conditions; `None` until it has written them.
            #[serde(default)]
            pub status: Option<ServiceExportStatus>,
        }

        impl Serialize for ServiceExport {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeStruct as _;
                let mut st = s.serialize_struct("ServiceExport", 5)?;
                st.serialize_field("apiVersion", &concat!("multicluster.x-k8s.io/", $version))?;
                st.serialize_field("kind", "ServiceExport")?;
                st.serialize_field("metadata", &self.metadata)?;
                st.serialize_field("spec", &self.spec)?;
                if let Some(status) = &self.status {
                    st.serialize_field("status", status)?;
                }
                st.end()
            }
        }

        impl kube_core::Resource for ServiceExport {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;
            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                "ServiceExport".into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                "multicluster.x-k8s.io".into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                "serviceexports".into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }

        impl ServiceExport {
            /// An export of the Service `name`, without namespace or status.
            pub fn new(name: &str, spec: ServiceExportSpec) -> Self {
                Self {
                    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some(name.to_owned()),
                        ..Default::default()
                    },
                    spec,
                    status: None,
                }
            }
        }

        /// The merged view of a service exported somewhere in the ClusterSet.
        #[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[kube(
            crates(kube_core = "::kube_core", k8s_openapi = "::k8s_openapi", schemars = "::schemars", serde = "::serde", serde_json = "::serde_json"),
            group = "multicluster.x-k8s.io",
            version = $version,
            kind = "ServiceImport",
            namespaced,
            status = "ServiceImportStatus",
            shortname = "svcim",
            shortname = "svcimport",
            derive = "Default",
            derive = "PartialEq",
            printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
            printcolumn(name = "IP", type_ = "string", json_path = ".spec.ips"),
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        #[serde(rename_all = "camelCase")]
        pub struct ServiceImportSpec {
            /// The merged ports: the union of the exports' ports, the oldest definition of each
            /// winning.
            pub ports: Vec<ServicePort>,
            /// The ClusterSet IPs, `ips[i]` of family `ipFamilies[i]`; empty for headless imports
            /// and for imports that are not `Ready`.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(length(max = 2))]
            pub ips: Vec<String>,
            /// Whether clients reach the service at ClusterSet IPs or through DNS only.
            #[serde(rename = "type")]
            pub type_: ServiceImportType,
            /// `None` or `ClientIP`, taken from the oldest export's Service.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub session_affinity: Option<String>,
            /// The `ClientIP` affinity timeout; set only with `ClientIP` affinity.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub session_affinity_config: Option<SessionAffinityConfig>,
            /// The families the import serves, in order; what the merge writes is never empty.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(length(max = 2))]
            pub ip_families: Vec<IpFamily>,
            /// `Cluster` or `Local`, taken from the oldest export's Service.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub internal_traffic_policy: Option<String>,
            /// A routing preference such as `PreferClose`, taken from the oldest export's Service.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub traffic_distribution: Option<String>,
        }
    };
}

/// `multicluster.x-k8s.io/v1beta1`, the version this project reads, writes and stores.
pub mod v1beta1 {
    mcs_version!("v1beta1");
}

/// `multicluster.x-k8s.io/v1alpha1`, accepted on input and served by the CRDs.
pub mod v1alpha1 {
    mcs_version!("v1alpha1");
}

/// First lines of the generated CRD files in `deploy/crds/`.
pub const CRD_HEADER: &str =
    "# Generated from dataplane-core's model by `cargo xtask manifests`; do not edit.\n";

/// The schema of a CRD version's objects.
fn root_schema(
    version: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion,
) -> Option<&mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps>
{
    version
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
}

/// The CRDs of both kinds, serving v1alpha1 and v1beta1 and storing v1beta1.
pub fn crds() -> Result<
    Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
    kube_core::crd::MergeError,
>{
    let mut export = kube_core::crd::merge_crds(
        vec![
            v1alpha1::ServiceExportCrd::crd(),
            v1beta1::ServiceExportCrd::crd(),
        ],
        "v1beta1",
    )?;
    let mut import = kube_core::crd::merge_crds(
        vec![
            v1alpha1::ServiceImport::crd(),
            v1beta1::ServiceImport::crd(),
        ],
        "v1beta1",
    )?;
    // `spec` is optional on a ServiceExport; defaulting it lets every reader rely on it.
    for version in &mut export.spec.versions {
        if let Some(spec) = root_schema(version)
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("spec"))
        {
            spec.default = Some(
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSON(
                    serde_json::json!({}),
                ),
            );
        }
        if let Some(required) = root_schema(version).and_then(|s| s.required.as_mut()) {
            required.retain(|r| r != "spec");
        }
    }
    // Lists keyed by a field, so that server-side apply merges them entry by entry: the
    // controller's apply of its condition types leaves the conditions others set in place
    // (an atomic list would be replaced whole).
    for (crd, lists) in [
        (&mut export, &[("conditions", "type")][..]),
        (
            &mut import,
            &[("conditions", "type"), ("clusters", "cluster")][..],
        ),
    ] {
        for version in &mut crd.spec.versions {
            let Some(status) = root_schema(version)
                .and_then(|s| s.properties.as_mut())
                .and_then(|p| p.get_mut("status"))
                .and_then(|s| s.properties.as_mut())
            else {
                continue;
            };
            for (list, key) in lists {
                if let Some(list) = status.get_mut(*list) {
                    list.x_kubernetes_list_type = Some("map".into());
                    list.x_kubernetes_list_map_keys = Some(vec![(*key).into()]);
                }
            }
        }
    }
    for crd in [&mut export, &mut import] {
        let labels = crd.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(
            "multicluster.x-k8s.io/release-version".into(),
            "v0.5.0".into(),
        );
        labels.insert(
            "multicluster.x-k8s.io/crd-schema-revision".into(),
            "0".into(),
        );
    }
    Ok(vec![export, import])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Server-side apply merges the condition lists (and the import's clusters) entry by
    /// entry, so the controller's apply leaves the conditions others set in place.
    #[test]
    fn status_lists_are_keyed_for_server_side_apply() {
        for crd in crds().expect("crds merge") {
            let kind = crd.spec.names.kind.clone();
            let keyed: &[(&str, &str)] = if kind == "ServiceImport" {
                &[("conditions", "type"), ("clusters", "cluster")]
            } else {
                &[("conditions", "type")]
            };
            for version in &crd.spec.versions {
                let status = version
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .and_then(|s| s.properties.as_ref())
                    .and_then(|p| p.get("status"))
                    .and_then(|s| s.properties.as_ref())
                    .expect("a status schema");
                for (list, key) in keyed {
                    let list = &status[*list];
                    assert_eq!(
                        list.x_kubernetes_list_type.as_deref(),
                        Some("map"),
                        "{kind}"
                    );
                    assert_eq!(
                        list.x_kubernetes_list_map_keys.as_deref(),
                        Some(&[(*key).to_owned()][..]),
                        "{kind}"
                    );
                    let item = list.items.as_ref();
                    let required = match item {
                        Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(s)) => s.required.clone().unwrap_or_default(),
                        _ => Vec::new(),
                    };
                    assert!(
                        required.iter().any(|r| r == key),
                        "{kind}: {key} must be required"
                    );
                }
            }
        }
    }

    #[test]
    fn crds_serve_both_versions_and_store_v1beta1() {
        let crds = crds().expect("crds merge");
        assert_eq!(crds.len(), 2);
        for crd in &crds {
            let mut versions: Vec<_> = crd
                .spec
                .versions
                .iter()
                .map(|v| (v.name.as_str(), v.served, v.storage))
                .collect();
            versions.sort();
            assert_eq!(
                versions,
                vec![("v1alpha1", true, false), ("v1beta1", true, true)]
            );
        }
        assert_eq!(
            crds[1].metadata.name.as_deref(),
            Some("serviceimports.multicluster.x-k8s.io")
        );
    }
}
