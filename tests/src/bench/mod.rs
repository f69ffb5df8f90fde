//! `cargo xtask bench`: the datapath against kube-proxy's rule shapes and a direct connection,
//! and the control plane at scale. Run by the `mcs-bench` binary.

pub mod control;
pub mod datapath;
pub mod plot;
pub mod report;
pub mod stats;
