//! Where the agent's inputs come from, all turned into the node's one input feed ([`feed`]):
//! Kubernetes watchers ([`kube`]), a node directory ([`node_dir`]), and a ClusterSet directory
//! merged in-process for standalone mode ([`clusterset_dir`]).

pub mod clusterset_dir;
pub mod feed;
pub mod kube;
pub mod manifests;
pub mod node_dir;
pub mod watch;
