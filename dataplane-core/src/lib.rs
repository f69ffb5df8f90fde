//! The functional core of the MCS dataplane: pure functions of plain data.
//!
//! - [`model`]: the MCS (KEP-1645) and Kubernetes vocabulary: CRD types, cluster ids, names,
//!   IP families, labels, address parsing.
//! - [`manifest`]: YAML text to objects, document by document.
//! - [`merge`]: every member cluster's exports to what one importing cluster gets.
//! - [`lb`]: the routing rule (ARCHITECTURE.md §4): imports and imported slices to frontends
//!   and their ordered backends, whole or service by service.
//! - [`reconcile`]: the controller's decisions: the merge output against the observed objects
//!   to the writes that make them agree.
//! - [`plan`]: what `dataplane-agent plan` prints, and the standalone report.
//! - [`policy`]: which ClusterSet IPs and backends may be programmed at all.
//! - [`explain`]: why a ClusterSet IP and port reach the clusters they do.
//!
//! Nothing here talks to an API server, the kernel, the file system or the network: those are
//! the agent's edges (`dataplane-agent`), and the crate's dependencies keep it so.
//!
//! ```
//! use std::path::Path;
//!
//! use dataplane_core::manifest::parse_documents;
//! use dataplane_core::merge::{self, ClusterSetConfig, ClusterSnapshot};
//! use dataplane_core::{lb, model::{ClusterId, Interner}};
//!
//! // Member cluster c1 exports demo/web.
//! let text = "apiVersion: v1
//! kind: Service
//! metadata: {name: web, namespace: demo}
//! spec: {ports: [{port: 80}]}
//! ---
//! apiVersion: multicluster.x-k8s.io/v1beta1
//! kind: ServiceExport
//! metadata: {name: web, namespace: demo}";
//! let c1 = ClusterId::new("c1").unwrap();
//! let mut snapshot = ClusterSnapshot::empty(c1.clone());
//! let (objects, errors) = parse_documents(text, Path::new("c1/web.yaml"));
//! assert!(errors.is_empty());
//! // Sources convert what they read into compact records, sharing names.
//! let names = Interner::new();
//! for object in objects {
//!     snapshot.add_manifest(object, &names);
//! }
//!
//! // What c1 imports, and the frontend a node of c1 programs for it: the ClusterSet IP on
//! // port 80, with no backends yet (c1 has no EndpointSlices), so connections are refused.
//! let out = merge::merge(&[snapshot], &ClusterSetConfig::default(), &c1, &[]);
//! let table = lb::build_records(&out.service_imports, &out.endpoint_slices);
//! let (addr, frontend) = table.frontends.iter().next().unwrap();
//! assert_eq!(addr.port, 80);
//! assert!(frontend.backends.is_empty());
//! ```

#![deny(missing_docs)]

pub mod explain;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod lb;
pub mod manifest;
pub mod merge;
pub mod model;
pub mod plan;
pub mod policy;
pub mod reconcile;
