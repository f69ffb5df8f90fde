//! Where the agent's outputs go: the Kubernetes writers of the controller role ([`kube`]).
//! (Standalone mode's report file is written by [`crate::roles::standalone`].)

pub mod kube;
