//! The node's one input feed. Every source turns what it reads into [`Change`]s: the API
//! server's watch events one object at a time ([`super::kube::watch_node_inputs`]), a node
//! directory as whole snapshots ([`super::node_dir::watch`]), and standalone mode's merge of a
//! ClusterSet directory ([`super::clusterset_dir::Merged::change`]). The node role files them
//! in its input index and updates only the services they touch.

use tokio::sync::mpsc;

pub use dataplane_core::lb::inputs::Change;

/// Where sources send the node's input changes.
pub type ChangeSender = mpsc::UnboundedSender<Change>;
/// Where the node role reads them.
pub type ChangeReceiver = mpsc::UnboundedReceiver<Change>;

/// A feed from sources to the node role.
pub fn channel() -> (ChangeSender, ChangeReceiver) {
    mpsc::unbounded_channel()
}
