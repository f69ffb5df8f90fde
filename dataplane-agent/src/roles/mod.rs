//! The agent's roles (ARCHITECTURE.md §3).

pub mod node;
pub mod standalone;
