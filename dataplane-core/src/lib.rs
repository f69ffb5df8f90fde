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
//! - [`explain`]: why a ClusterSet IP and port reach the clusters they do.
//!
//! Nothing here talks to an API server, the kernel, the file system or the network: those are
//! the agent's edges (`dataplane-agent`), and the crate's dependencies keep it so.

pub mod explain;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod lb;
pub mod manifest;
pub mod merge;
pub mod model;
pub mod plan;
pub mod reconcile;
