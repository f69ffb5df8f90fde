//! The agent's roles (ARCHITECTURE.md §3).

pub mod controller;
pub mod kube;
pub mod node;
pub mod standalone;
