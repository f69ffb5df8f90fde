//! Kubernetes manifests from YAML text: multi-document, any of the kinds the product reads.
//! Reading files is the agent's job (`source::manifests`); this is the pure decoder.
//!
//! Parsing is per document: a malformed document or an unknown kind gives a [`ManifestError`]
//! naming the file, the document index and, when it can be read, the object; every other
//! document of the file is still used.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::model::{
    API_VERSION_V1ALPHA1, API_VERSION_V1BETA1, EndpointSlice, NamespacedName, Service,
    ServiceExport, ServiceImport,
};

/// One object read from a manifest.
#[derive(Clone, Debug, PartialEq)]
pub enum Manifest {
    /// A `v1` Service.
    Service(Box<Service>),
    /// A ServiceExport of either MCS version, read as v1beta1.
    ServiceExport(Box<ServiceExport>),
    /// A ServiceImport of either MCS version, read as v1beta1.
    ServiceImport(Box<ServiceImport>),
    /// A `discovery.k8s.io/v1` EndpointSlice, local or imported.
    EndpointSlice(Box<EndpointSlice>),
}

/// A document that could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    /// The file the document is in, as given to [`parse_documents`].
    pub file: PathBuf,
    /// 0-based index of the YAML document in the file.
    pub document: usize,
    /// `Kind ns/name` when the document got that far.
    pub object: Option<String>,
    /// What is wrong with the document.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (document {})", self.file.display(), self.document)?;
        if let Some(object) = &self.object {
            write!(f, " {object}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Only what is needed to route a document to its type.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<crate::model::ObjectMeta>,
}

/// Parses every document of `text`. `file` is only used in errors.
///
/// ```
/// use std::path::Path;
///
/// use dataplane_core::manifest::{Manifest, parse_documents};
///
/// let text = "apiVersion: multicluster.x-k8s.io/v1alpha1
/// kind: ServiceExport
/// metadata: {name: web, namespace: demo}
/// ---
/// apiVersion: apps/v1
/// kind: Deployment
/// metadata: {name: web, namespace: demo}";
/// let (objects, errors) = parse_documents(text, Path::new("c1/web.yaml"));
/// assert!(matches!(&objects[..], [Manifest::ServiceExport(_)]));
/// assert_eq!(errors[0].document, 1);
/// assert_eq!(errors[0].object.as_deref(), Some("Deployment demo/web"));
/// ```
pub fn parse_documents(text: &str, file: &Path) -> (Vec<Manifest>, Vec<ManifestError>) {
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for (document, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let error = |object: Option<String>, message: String| ManifestError {
            file: file.to_owned(),
            document,
            object,
            message,
        };
        let value = match serde_yaml::Value::deserialize(de) {
            Ok(serde_yaml::Value::Null) => continue, // empty document, e.g. a trailing `---`
            Ok(v) => v,
            Err(e) => {
                errors.push(error(None, format!("malformed YAML: {e}")));
                // The YAML stream cannot be resynchronised after a syntax error.
                break;
            }
        };
        let meta: TypeMeta = match serde_yaml::from_value(value.clone()) {
            Ok(m) => m,
            Err(e) => {
                errors.push(error(None, format!("not a Kubernetes object: {e}")));
                continue;
            }
        };
        let kind = meta.kind.unwrap_or_default();
        let api_version = meta.api_version.unwrap_or_default();
        let name = meta
            .metadata
            .as_ref()
            .map(NamespacedName::of)
            .map(|n| format!("{kind} {n}"));
        if meta
            .metadata
            .as_ref()
            .and_then(|m| m.name.as_ref())
            .is_none()
        {
            errors.push(error(name, "metadata.name is missing".into()));
            continue;
        }
        let parsed = match (api_version.as_str(), kind.as_str()) {
            ("v1", "Service") => serde_yaml::from_value(value).map(Manifest::Service),
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                serde_yaml::from_value(value).map(Manifest::EndpointSlice)
            }
            (API_VERSION_V1BETA1 | API_VERSION_V1ALPHA1, "ServiceExport") => {
                serde_yaml::from_value(as_v1beta1(value)).map(Manifest::ServiceExport)
            }
            (API_VERSION_V1BETA1 | API_VERSION_V1ALPHA1, "ServiceImport") => {
                serde_yaml::from_value(as_v1beta1(value)).map(Manifest::ServiceImport)
            }
            _ => {
                errors.push(error(
                    name,
                    format!("unsupported kind {kind:?} of apiVersion {api_version:?}"),
                ));
                continue;
            }
        };
        match parsed {
            Ok(m) => objects.push(m),
            Err(e) => errors.push(error(name, format!("invalid {kind}: {e}"))),
        }
    }
    (objects, errors)
}

/// v1alpha1 has the v1beta1 schema; reading it as v1beta1 is lossless.
fn as_v1beta1(mut value: serde_yaml::Value) -> serde_yaml::Value {
    if let Some(map) = value.as_mapping_mut() {
        map.insert("apiVersion".into(), API_VERSION_V1BETA1.into());
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_good_document_and_reports_the_bad_ones() {
        let text = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: web, namespace: demo}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
---
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: demo}
spec: {ports: [{port: "eighty"}]}
---
kind: Service
apiVersion: v1
metadata: {namespace: demo}
---
"#;
        let (objects, errors) = parse_documents(text, Path::new("c1/web.yaml"));
        assert_eq!(objects.len(), 2, "{objects:?}");
        assert!(matches!(objects[0], Manifest::Service(_)));
        match &objects[1] {
            Manifest::ServiceExport(se) => {
                assert_eq!(se.metadata.name.as_deref(), Some("web"))
            }
            other => panic!("expected a ServiceExport, got {other:?}"),
        }
        let summary: Vec<_> = errors
            .iter()
            .map(|e| (e.document, e.object.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            summary,
            vec![
                (2, "Deployment demo/web".to_owned()),
                (3, "Service demo/bad".to_owned()),
                (4, "Service demo/".to_owned()),
            ]
        );
        assert!(
            errors[0]
                .to_string()
                .starts_with("c1/web.yaml (document 2)")
        );
    }

    #[test]
    fn malformed_yaml_is_an_error_not_a_panic() {
        let (objects, errors) = parse_documents("a: [unclosed\n", Path::new("x.yaml"));
        assert!(objects.is_empty());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].message.contains("malformed YAML"));
    }
}
