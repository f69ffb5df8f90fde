//! Where the agent's inputs come from: manifest files (standalone, node `--from-dir`) and,
//! later, Kubernetes watchers. Both produce the same plain objects.

pub mod clusterset_dir;
pub mod manifests;
pub mod watch;
