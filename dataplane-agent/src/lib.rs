//! The MCS dataplane agent: a pure core (`merge`, `lb`) with thin edges (`bpf`, `source`,
//! `sink`). See ARCHITECTURE.md for the data flow and the routing rule.

pub mod lb;
pub mod merge;
pub mod model;
pub mod plan;
pub mod source;
