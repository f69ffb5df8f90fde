//! Kubernetes manifests from YAML text: multi-document, any of the kinds the product reads.
//! Reading files is the agent's job (`source::manifests`); this is the pure decoder.
//!
//! Decoding is streaming and per document: [`Documents`] decodes one document at a time, so a
//! reader converts each object into its compact record as it comes and never holds a file's
//! objects at once. A malformed document or an unknown kind gives a [`ManifestError`] naming
//! the file, the document index and, when it can be read, the object; every other document of
//! the file is still used. A YAML syntax error ends the stream (it cannot be resynchronised),
//! and [`Documents::syntax_error`] says so: a reader may then keep what it had of the file.

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

impl Manifest {
    /// `Kind namespace/name`, the way errors and diagnostics name an object.
    pub fn describe(&self) -> String {
        let (kind, meta) = match self {
            Manifest::Service(o) => ("Service", &o.metadata),
            Manifest::ServiceExport(o) => ("ServiceExport", &o.metadata),
            Manifest::ServiceImport(o) => ("ServiceImport", &o.metadata),
            Manifest::EndpointSlice(o) => ("EndpointSlice", &o.metadata),
        };
        format!("{kind} {}", NamespacedName::of(meta))
    }
}

/// A document that could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    /// The file the document is in, as given to [`Documents::new`].
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

/// One usable document: its 0-based index in the file and its object.
pub type Document = (usize, Manifest);

/// The documents of a YAML text, decoded one at a time: each item is a usable document or the
/// error of one that is not. Empty documents (a trailing `---`) are skipped. The stream ends
/// after a YAML syntax error ([`Documents::syntax_error`]).
///
/// ```
/// use std::path::Path;
///
/// use dataplane_core::manifest::{Documents, Manifest};
///
/// let text = "apiVersion: multicluster.x-k8s.io/v1beta1
/// kind: ServiceExport
/// metadata: {name: web, namespace: demo}
/// ---
/// kind: [unclosed";
/// let mut documents = Documents::new(text, Path::new("c1/web.yaml"));
/// let first = documents.next().unwrap().unwrap();
/// assert!(matches!(first, (0, Manifest::ServiceExport(_))));
/// let second = documents.next().unwrap().unwrap_err();
/// assert!(second.message.starts_with("malformed YAML"));
/// assert!(documents.next().is_none());
/// assert!(documents.syntax_error());
/// ```
pub struct Documents<'a> {
    stream: serde_yaml::Deserializer<'a>,
    file: &'a Path,
    next: usize,
    syntax_error: bool,
}

impl<'a> Documents<'a> {
    /// The documents of `text`; `file` is only used in errors.
    pub fn new(text: &'a str, file: &'a Path) -> Self {
        Documents {
            stream: serde_yaml::Deserializer::from_str(text),
            file,
            next: 0,
            syntax_error: false,
        }
    }

    /// Whether the text has a YAML syntax error: the stream stopped there, and the documents
    /// after it were not read.
    pub fn syntax_error(&self) -> bool {
        self.syntax_error
    }
}

impl Iterator for Documents<'_> {
    type Item = Result<Document, ManifestError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.syntax_error {
            let de = self.stream.next()?;
            let document = self.next;
            self.next += 1;
            let error = |object: Option<String>, message: String| ManifestError {
                file: self.file.to_owned(),
                document,
                object,
                message,
            };
            let value = match serde_yaml::Value::deserialize(de) {
                Ok(serde_yaml::Value::Null) => continue, // empty document, e.g. a trailing `---`
                Ok(v) => v,
                Err(e) => {
                    // The YAML stream cannot be resynchronised after a syntax error.
                    self.syntax_error = true;
                    return Some(Err(error(None, format!("malformed YAML: {e}"))));
                }
            };
            return Some(
                decode(value)
                    .map(|m| (document, m))
                    .map_err(|(o, m)| error(o, m)),
            );
        }
        None
    }
}

/// Decodes one document's value into its type: `Err((object, message))` when it is no usable
/// object.
fn decode(value: serde_yaml::Value) -> Result<Manifest, (Option<String>, String)> {
    let meta = match TypeMeta::deserialize(&value) {
        Ok(m) => m,
        Err(e) => return Err((None, format!("not a Kubernetes object: {e}"))),
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
        return Err((name, "metadata.name is missing".into()));
    }
    let parsed = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => Service::deserialize(value).map(|o| Manifest::Service(Box::new(o))),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            EndpointSlice::deserialize(value).map(|o| Manifest::EndpointSlice(Box::new(o)))
        }
        (API_VERSION_V1BETA1 | API_VERSION_V1ALPHA1, "ServiceExport") => {
            ServiceExport::deserialize(as_v1beta1(value))
                .map(|o| Manifest::ServiceExport(Box::new(o)))
        }
        (API_VERSION_V1BETA1 | API_VERSION_V1ALPHA1, "ServiceImport") => {
            ServiceImport::deserialize(as_v1beta1(value))
                .map(|o| Manifest::ServiceImport(Box::new(o)))
        }
        _ => {
            return Err((
                name,
                format!("unsupported kind {kind:?} of apiVersion {api_version:?}"),
            ));
        }
    };
    parsed.map_err(|e| (name, format!("invalid {kind}: {e}")))
}

/// Parses every document of `text` at once ([`Documents`], collected). `file` is only used in
/// errors.
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
    for document in Documents::new(text, file) {
        match document {
            Ok((_, m)) => objects.push(m),
            Err(e) => errors.push(e),
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
    fn documents_come_one_at_a_time_with_their_index() {
        let text = "---\napiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\n---\n---\nkind: Nope\nmetadata: {name: b}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: c, namespace: ns}\n";
        let mut documents = Documents::new(text, Path::new("f.yaml"));
        let first = documents.next().expect("a").expect("usable");
        assert_eq!(
            (first.0, first.1.describe()),
            (0, "Service ns/a".to_owned())
        );
        // The empty document 1 is skipped; 2 is an error; 3 is still read.
        let error = documents.next().expect("b").expect_err("unusable");
        assert_eq!(error.document, 2);
        let third = documents.next().expect("c").expect("usable");
        assert_eq!(
            (third.0, third.1.describe()),
            (3, "Service ns/c".to_owned())
        );
        assert!(documents.next().is_none());
        assert!(!documents.syntax_error());
    }

    #[test]
    fn a_syntax_error_ends_the_stream_after_the_good_documents() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\n---\nmetadata: {name: [\n---\napiVersion: v1\nkind: Service\nmetadata: {name: c, namespace: ns}\n";
        let mut documents = Documents::new(text, Path::new("f.yaml"));
        assert!(documents.next().expect("a").is_ok());
        assert!(!documents.syntax_error());
        let error = documents.next().expect("b").expect_err("broken");
        assert_eq!(error.document, 1);
        assert!(error.message.starts_with("malformed YAML"), "{error}");
        assert!(documents.next().is_none(), "nothing after a syntax error");
        assert!(documents.syntax_error());
    }

    #[test]
    fn malformed_yaml_is_an_error_not_a_panic() {
        let (objects, errors) = parse_documents("a: [unclosed\n", Path::new("x.yaml"));
        assert!(objects.is_empty());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].message.contains("malformed YAML"));
    }
}
