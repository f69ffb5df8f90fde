//! The MCS dataplane agent: the edges around the pure core (`dataplane-core`: model, merge,
//! lb) and the roles that wire them. `source` (watchers, directories) feeds changes in, `sink`
//! (kube writers, report files) and `bpf` (loader, map sync) write results out. See
//! ARCHITECTURE.md for the data flow and the routing rule.

pub mod bpf;
pub mod cli;
pub mod config;
pub mod dns;
pub mod fuzzing;
pub mod memory;
pub mod roles;
pub mod sink;
pub mod source;
pub mod telemetry;
