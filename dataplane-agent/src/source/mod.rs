//! Where the agent's inputs come from: manifest files (standalone, node `--from-dir`) and
//! Kubernetes watchers ([`kube`]). Both produce the same plain objects.

pub mod clusterset_dir;
pub mod kube;
pub mod manifests;
pub mod watch;
