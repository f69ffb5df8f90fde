//! Test support for the workspace: network-namespace topologies, the agent process and the
//! probe client's reports (dataplane tests), and an in-process fake kube-apiserver with
//! tower-test fixtures (Kubernetes tests). The tests themselves live in `tests/tests/`.

pub mod agent;
pub mod bench;
pub mod clusterset;
pub mod dns;
pub mod fake_apiserver;
pub mod fixtures;
pub mod netns;
pub mod probe;
pub mod tcp_proxy;
