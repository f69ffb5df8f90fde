//! Shared test support for the workspace: an in-process fake kube-apiserver and kube fixtures.

pub mod fake_apiserver;
pub mod fixtures;
