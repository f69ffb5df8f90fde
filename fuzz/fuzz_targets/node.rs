//! Bytes → ServiceImports and imported EndpointSlices → the node's inputs event by event, then
//! deletes → lb table and map entries, then the DNS zone of the final inputs. Nothing may
//! panic, and the table and map entries kept event by event must be those of a full build of
//! the final objects. The body is `dataplane_agent::fuzzing::node_manifests`, whose test
//! replays the seeds.
//!
//! `AYA_BUILD_SKIP=1 cargo +nightly fuzz run node fuzz/corpus/node fuzz/seeds/node -- -max_total_time=60`

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = dataplane_agent::fuzzing::node_manifests(data);
});
