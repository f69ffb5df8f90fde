//! The agent's roles (ARCHITECTURE.md §3): thin async loops that wire sources, the core and
//! sinks together.
//!
//! - [`node`]: every node's dataplane, fed by the input feed (`source::feed`);
//! - [`standalone`]: merge a ClusterSet directory and program this host, no API server;
//! - [`controller`]: the lease-elected merge and writer of a Kubernetes cluster;
//! - [`kube`]: Kubernetes mode, running the node role and/or the controller;
//! - [`namespaces`]: which local namespaces the controller writes into;
//! - [`retry`]: when the writing roles try failed writes again.

pub mod controller;
pub mod kube;
pub mod lease_guard;
pub mod namespaces;
pub mod node;
pub mod retry;
pub mod standalone;

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
