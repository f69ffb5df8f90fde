//! Bytes → manifests of 2-3 clusters → merge → lb table. Nothing may panic, and the merge must
//! be stable when its imports are fed back. The body is
//! `dataplane_agent::fuzzing::merge_manifests`, whose test replays the seeds.
//!
//! From the repository root (libFuzzer writes new inputs into the first directory, the ignored
//! `fuzz/corpus/merge`; the seeds are scenario directories flattened into one input each):
//!
//! `AYA_BUILD_SKIP=1 cargo +nightly fuzz run merge fuzz/corpus/merge fuzz/seeds/merge -- -max_total_time=60`

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = dataplane_agent::fuzzing::merge_manifests(data);
});
