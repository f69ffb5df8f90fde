//! The kernel edge: map ABI conversions, map sync, loading/pinning, inspection.

pub mod convert;
pub mod inspect;
pub mod kernel;
pub mod loader;
pub mod maps;
pub mod sync;
