//! `cargo xtask bench`: the datapath against kube-proxy's rule shapes and a direct connection,
//! the control plane at scale, and `clusterset.local` DNS against NSD. Run by the `mcs-bench` binary.

pub mod control;
pub mod controller;
pub mod datapath;
pub mod dns;
pub mod plot;
pub mod report;
pub mod stats;
