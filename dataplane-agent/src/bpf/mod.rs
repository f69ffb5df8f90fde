//! The kernel edge: map ABI conversions, the map writer and its parts, loading/pinning,
//! inspection.
//!
//! - [`desired`]: the map entries the lb table wants, by service (pure);
//! - [`ids`]: frontend ids, cluster ids and slot ranges;
//! - [`adopt`]: the writer's mirror rebuilt from pinned maps after a restart;
//! - [`sync`] (with [`plan`]): the one writer, `sync(scope)`;
//! - [`maps`], [`kernel`], [`sys`], [`grace`]: the maps it writes, in memory or in the kernel;
//! - [`loader`], [`inspect`], [`convert`].

pub mod adopt;
pub mod convert;
pub mod counters;
pub mod desired;
mod flush;
pub mod grace;
pub mod ids;
pub mod inspect;
pub mod kernel;
pub mod loader;
pub mod maps;
pub mod plan;
pub mod sync;
pub mod sys;
