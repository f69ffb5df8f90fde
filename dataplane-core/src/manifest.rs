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
    /// The file's line where `text` starts (1 for a whole file).
    first_line: usize,
    syntax_error: bool,
}

impl<'a> Documents<'a> {
    /// The documents of `text`; `file` is only used in errors.
    pub fn new(text: &'a str, file: &'a Path) -> Self {
        Self::part(text, 1, 0, file)
    }

    /// The documents of a part of a file that [`DocumentSplitter`] cut, which starts on line
    /// `first_line` of the file with document `first_document`: documents are numbered as in
    /// the whole file, and errors say where the part starts.
    pub fn part(text: &'a str, first_line: usize, first_document: usize, file: &'a Path) -> Self {
        Documents {
            stream: serde_yaml::Deserializer::from_str(text),
            file,
            next: first_document,
            first_line: first_line.max(1),
            syntax_error: false,
        }
    }

    /// Whether the text has a YAML syntax error: the stream stopped there, and the documents
    /// after it were not read.
    pub fn syntax_error(&self) -> bool {
        self.syntax_error
    }

    /// The index the next document of the file has.
    pub fn next_index(&self) -> usize {
        self.next
    }
}

/// Cuts a YAML stream, fed line by line, into the texts of its documents, so a reader holds
/// one document's text at a time instead of the whole file. A part ends before a `---` marker
/// line that follows a document, or before a directive (a `%` line) after a `...` marker,
/// which starts the next document. YAML forbids a `---` at the start of a line inside a
/// document's content and reads a `%` there as a directive only where a document may start,
/// so a cut never splits a document, and each part decodes, with [`Documents::part`], to
/// exactly the documents the whole text has there. Any other `%` line stays with its
/// document: text of a multi-line scalar, or an error YAML reports in that document.
#[derive(Debug, Default)]
pub struct DocumentSplitter {
    text: String,
    /// Whether `text` holds a document (a marker or content), not just directives, comments
    /// and blank lines.
    has_document: bool,
    /// Whether the last line of `text` other than comments and blank lines is a `...` marker.
    ended: bool,
    /// Lines taken so far.
    lines: usize,
    /// The file line `text` starts on.
    first_line: usize,
}

/// A part of a YAML file: the text of one document (or a few, or none but comments) and the
/// file line it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The text, line breaks included.
    pub text: String,
    /// The 1-based line of the file it starts on.
    pub first_line: usize,
}

impl DocumentSplitter {
    /// Takes the next line (with its line break, if any), and returns the part before it when
    /// it starts the next document.
    pub fn push(&mut self, line: &str) -> Option<Part> {
        self.lines += 1;
        // A line starting with a byte order mark is no marker: YAML's scanner reads it so.
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_marker = |m: &str| {
            bare.strip_prefix(m)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
        };
        let directive = bare.starts_with('%');
        // A byte order mark opening the file is no content (but still keeps a marker after
        // it from being one).
        let content = if self.lines == 1 {
            bare.trim_start_matches('\u{feff}')
        } else {
            bare
        }
        .trim_start();
        let comment_or_blank = content.is_empty() || content.starts_with('#');
        let starts_next = self.has_document && (is_marker("---") || (directive && self.ended));
        let before = if starts_next { self.finish() } else { None };
        if self.text.is_empty() {
            self.first_line = self.lines;
        }
        self.text.push_str(line);
        if !comment_or_blank {
            self.ended = is_marker("...");
            self.has_document |= !directive;
        }
        before
    }

    /// The text after the last cut, if any.
    pub fn finish(&mut self) -> Option<Part> {
        self.has_document = false;
        self.ended = false;
        if self.text.is_empty() {
            return None;
        }
        Some(Part {
            text: std::mem::take(&mut self.text),
            first_line: self.first_line,
        })
    }
}

/// Decodes a file's parts ([`DocumentSplitter`]) in order, numbering documents across them.
#[derive(Debug)]
pub struct PartDecoder<'f> {
    file: &'f Path,
    next: usize,
    syntax_error: bool,
}

impl<'f> PartDecoder<'f> {
    /// A decoder for the parts of `file` (only used in errors).
    pub fn new(file: &'f Path) -> Self {
        PartDecoder {
            file,
            next: 0,
            syntax_error: false,
        }
    }

    /// Hands each document of `part` to `each`, as [`Documents`] would in the whole file.
    /// After a YAML syntax error nothing more is decoded ([`PartDecoder::syntax_error`]).
    pub fn decode(&mut self, part: &Part, mut each: impl FnMut(Result<Document, ManifestError>)) {
        if self.syntax_error {
            return;
        }
        let mut documents = Documents::part(&part.text, part.first_line, self.next, self.file);
        for document in &mut documents {
            each(document);
        }
        self.next = documents.next_index();
        self.syntax_error = documents.syntax_error();
    }

    /// Whether a part had a YAML syntax error: decoding stopped there.
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
                    let message = if self.first_line > 1 {
                        format!(
                            "malformed YAML: {e} (lines counted from line {} of the file, where the document starts)",
                            self.first_line
                        )
                    } else {
                        format!("malformed YAML: {e}")
                    };
                    return Some(Err(error(None, message)));
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

    /// A document's index and object, or its index and error.
    type Summary = Result<(usize, String), (usize, String)>;
    /// Every document's summary, and whether decoding stopped at a syntax error.
    type Decoded = (Vec<Summary>, bool);

    /// Decodes `text` cut by [`DocumentSplitter`], line by line, as a file reader does.
    fn decode_in_parts(text: &str) -> Decoded {
        let file = Path::new("f.yaml");
        let mut splitter = DocumentSplitter::default();
        let mut decoder = PartDecoder::new(file);
        let mut out = Vec::new();
        let mut keep = |d: Result<Document, ManifestError>| out.push(summary(d));
        for line in text.split_inclusive('\n') {
            if let Some(part) = splitter.push(line) {
                decoder.decode(&part, &mut keep);
            }
        }
        if let Some(part) = splitter.finish() {
            decoder.decode(&part, &mut keep);
        }
        (out, decoder.syntax_error())
    }

    fn summary(d: Result<Document, ManifestError>) -> Summary {
        match d {
            Ok((i, m)) => Ok((i, m.describe())),
            // A syntax error's position is relative to its part; the rest is the same.
            Err(e) if e.message.starts_with("malformed YAML") => {
                Err((e.document, "malformed YAML".into()))
            }
            Err(e) => Err((e.document, format!("{:?}: {}", e.object, e.message))),
        }
    }

    fn decode_whole(text: &str) -> Decoded {
        let mut documents = Documents::new(text, Path::new("f.yaml"));
        let out = (&mut documents).map(summary).collect();
        (out, documents.syntax_error())
    }

    /// Pieces of YAML streams: documents, markers, comments, directives, a broken document.
    const PIECES: &[&str] = &[
        "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\n",
        "apiVersion: v1\r\nkind: Service\r\nmetadata:\r\n  name: crlf\r\n  namespace: ns\r\n",
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata:\n  name: b\n  namespace: ns\n  annotations:\n    note: |\n      --- not a marker\n      ... nor this\n",
        "kind: Nope\nmetadata: {name: c}\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: d, namespace: ns}\nspec: {ports: [{port: eighty}]}\n",
        "---\n",
        "--- \n",
        "--- # a comment on the marker\n",
        "...\n",
        "# a comment\n",
        "\n",
        // Directives come after an end marker (or first in the file).
        "...\n%YAML 1.2\n# a comment\n---\n",
        "metadata: {name: [\n",
        // `%` lines that are text, and one that is an unknown directive.
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: e\n  namespace: ns\n  annotations: {note: \"a\n%b\"}\n",
        "%foo\n",
        // A document right after an end marker, with no marker of its own: an error.
        "...\nkind: Nope\n",
    ];

    proptest::proptest! {
        #[test]
        fn a_file_cut_into_documents_decodes_as_the_whole_text(
            picks in proptest::collection::vec(0..PIECES.len(), 0..16),
            bom in proptest::bool::ANY,
            last_newline in proptest::bool::ANY,
        ) {
            // YAML reads a marker right after a byte order mark as text, and a directive line
            // after it as more of that text, which a cut cannot know: no mark before a marker.
            let bom = bom && !picks.first().is_some_and(|&p| PIECES[p].starts_with(['-', '.']));
            let mut text: String = if bom { "\u{feff}".into() } else { String::new() };
            for &p in &picks {
                // A document after another needs a marker between them.
                if !text.trim().is_empty() && !PIECES[p].starts_with(['-', '.', '#', '%', '\n']) {
                    text.push_str("---\n");
                }
                text.push_str(PIECES[p]);
            }
            if !last_newline {
                text.pop();
            }
            proptest::prop_assert_eq!(decode_in_parts(&text), decode_whole(&text), "{:?}", text);
        }
    }

    #[test]
    fn a_part_is_one_document_and_errors_say_where_it_starts() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\n---\n---\nmetadata: {name: [\n";
        let mut splitter = DocumentSplitter::default();
        let mut parts: Vec<Part> = text
            .split_inclusive('\n')
            .filter_map(|l| splitter.push(l))
            .collect();
        parts.extend(splitter.finish());
        let starts: Vec<usize> = parts.iter().map(|p| p.first_line).collect();
        assert_eq!(starts, [1, 4, 5]);
        let mut decoder = PartDecoder::new(Path::new("f.yaml"));
        let mut errors = Vec::new();
        for part in &parts {
            decoder.decode(part, |d| errors.extend(d.err()));
        }
        assert!(decoder.syntax_error());
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].document, 2);
        assert!(
            errors[0].message.contains("from line 5 of the file"),
            "{}",
            errors[0].message
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
