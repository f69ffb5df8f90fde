//! Bytes → manifests of 2-3 clusters → merge → lb table. Nothing may panic.
//!
//! The first byte picks the number of clusters (2 or 3) and the importing cluster; the rest is
//! text split on `\n===\n` into files, file i going to cluster i mod n. A first file that
//! starts with `#clusterset` is parsed as `clusterset.yaml` instead.
//!
//! From the repository root (libFuzzer writes new inputs into the first directory, the ignored
//! `fuzz/corpus/merge`; the seeds are scenario directories flattened into one input each):
//!
//! `AYA_BUILD_SKIP=1 cargo +nightly fuzz run merge fuzz/corpus/merge fuzz/seeds/merge -- -max_total_time=60`

#![no_main]

use std::path::Path;

use dataplane_agent::source::{clusterset_dir::parse_config, manifests::parse_documents};
use dataplane_core::{
    fixtures::{add_manifest, cluster},
    lb,
    merge::{self, ClusterSetConfig, ClusterSnapshot},
    model::{ClusterId, ServiceImport},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let n = 2 + usize::from(head & 1);
    let ids: Vec<ClusterId> = ["east", "west", "north"][..n]
        .iter()
        .map(|c| cluster(c))
        .collect();
    let mut snapshots: Vec<ClusterSnapshot> =
        ids.iter().cloned().map(ClusterSnapshot::empty).collect();
    let mut existing: Vec<ServiceImport> = Vec::new();
    let mut config = ClusterSetConfig::default();
    for (i, file) in text.split("\n===\n").enumerate() {
        if i == 0 && file.starts_with("#clusterset") {
            if let Ok(c) = parse_config(file, Path::new("clusterset.yaml")) {
                config = c;
            }
            continue;
        }
        let (objects, _errors) = parse_documents(file, Path::new("fuzz.yaml"));
        let snap = &mut snapshots[i % n];
        // A ServiceImport, in any file, is an existing import of the importing cluster.
        existing.extend(objects.into_iter().filter_map(|m| add_manifest(snap, m)));
    }
    let importing = &ids[usize::from(head >> 1) % n];
    let plan = merge::merge(&snapshots, &config, importing, &existing);
    let table = lb::build(&plan.service_imports, &plan.endpoint_slices);
    // Feeding the imports back must be stable, as the property tests check on small inputs.
    let again = merge::merge(&snapshots, &config, importing, &plan.service_imports);
    assert_eq!(
        plan, again,
        "merge is not stable when its imports are fed back"
    );
    let _ = table;
});
