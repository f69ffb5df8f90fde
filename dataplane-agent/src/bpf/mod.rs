//! The kernel edge: map ABI conversions, map sync, loading/pinning, inspection.

pub mod convert;
pub mod maps;
pub mod sync;
