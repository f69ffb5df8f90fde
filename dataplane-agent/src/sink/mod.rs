//! Where the agent's outputs go: the Kubernetes writers of the controller role ([`kube`]) and
//! standalone mode's report file ([`report`]). (The node's maps are written by `bpf`.)

pub mod kube;
pub mod report;
