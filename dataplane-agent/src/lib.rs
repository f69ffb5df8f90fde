//! The MCS dataplane agent: a pure core (`merge`, `lb`) with thin edges (`bpf`, `source`,
//! `sink`) and the roles that wire them. See ARCHITECTURE.md for the data flow and the
//! routing rule.

pub mod bpf;
pub mod cli;
pub mod config;
pub mod dns;
pub mod explain;
pub mod lb;
pub mod merge;
pub mod model;
pub mod plan;
pub mod roles;
pub mod sink;
pub mod source;
#[doc(hidden)]
pub mod synthetic;
pub mod telemetry;
