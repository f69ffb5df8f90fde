//! Where the agent's inputs come from, all turned into the node's one input feed ([`feed`]):
//! Kubernetes watchers ([`kube`]), a node directory ([`node_dir`]), and a ClusterSet directory
//! ([`clusterset_dir`], kept file by file in [`clusterset_files`]) merged in-process for
//! standalone mode ([`clusterset_merge`]). Both directory sources keep what each file defines
//! ([`file_index`]) and re-read only the files a batch of changes ([`watch`]) names.

pub mod clusterset_dir;
pub mod clusterset_files;
pub mod clusterset_merge;
pub mod feed;
pub mod file_index;
pub mod kube;
pub mod manifests;
pub mod node_dir;
pub mod watch;
