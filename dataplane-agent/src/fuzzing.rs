//! The body of the cargo-fuzz targets in `fuzz/`, kept in the crate so that the test suite
//! replays their seeds and a change of the APIs they call cannot leave them broken unseen.

use std::path::Path;

use dataplane_core::{
    lb::{self, LbTable},
    merge::{self, ClusterSetConfig, ClusterSnapshot, MergeOutput},
    model::{ClusterId, Interner, records::ImportRecord},
};

use crate::source::{clusterset_dir::parse_config, manifests::parse_documents};

/// Bytes → manifests of 2-3 clusters → merge → lb table; `None` for bytes that are not UTF-8
/// text. Panics only where the merge is wrong: it must not be changed by feeding its imports
/// back as the importing cluster's current imports.
///
/// The first byte picks the number of clusters (2 or 3) and the importing cluster; the rest is
/// text split on `\n===\n` into files, file i going to cluster i mod n. A first file that
/// starts with `#clusterset` is parsed as `clusterset.yaml` instead. A ServiceImport, in any
/// file, is a current import of the importing cluster.
pub fn merge_manifests(data: &[u8]) -> Option<(MergeOutput, LbTable)> {
    let (&head, rest) = data.split_first()?;
    let text = std::str::from_utf8(rest).ok()?;
    let n = 2 + usize::from(head & 1);
    let ids: Vec<ClusterId> = ["east", "west", "north"][..n]
        .iter()
        .filter_map(|c| ClusterId::new(*c).ok())
        .collect();
    let names = Interner::new();
    let mut snapshots: Vec<ClusterSnapshot> =
        ids.iter().cloned().map(ClusterSnapshot::empty).collect();
    let mut existing: Vec<ImportRecord> = Vec::new();
    let mut config = ClusterSetConfig::default();
    for (i, file) in text.split("\n===\n").enumerate() {
        if i == 0 && file.starts_with("#clusterset") {
            if let Ok(c) = parse_config(file, Path::new("clusterset.yaml")) {
                config = c;
            }
            continue;
        }
        let (objects, _errors) = parse_documents(file, Path::new("fuzz.yaml"));
        let snapshot = &mut snapshots[i % n];
        for object in objects {
            if let Some(si) = snapshot.add_manifest(object, &names) {
                existing.extend(ImportRecord::from_k8s(&si, &names, true).into_record());
            }
        }
    }
    let importing = &ids[usize::from(head >> 1) % n];
    let plan = merge::merge(&snapshots, &config, importing, &existing);
    let table = lb::build_records(&plan.service_imports, &plan.endpoint_slices);
    let again = merge::merge(&snapshots, &config, importing, &plan.service_imports);
    assert_eq!(
        plan, again,
        "merge is not stable when its imports are fed back"
    );
    Some((plan, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed of the fuzz target merges, stably, and the seeds as a whole exercise the
    /// merge: imports with ports, frontends with backends, and conflicts.
    #[test]
    fn the_fuzz_seeds_merge_stably() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/merge");
        let mut seeds: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("entry").path())
            .collect();
        seeds.sort();
        assert!(seeds.len() >= 6, "seeds: {seeds:?}");
        let (mut imports, mut backends, mut conflicts) = (0, 0, 0);
        for seed in &seeds {
            let data = std::fs::read(seed).expect("seed");
            let (plan, table) =
                merge_manifests(&data).unwrap_or_else(|| panic!("{}: not text", seed.display()));
            imports += plan.service_imports.len();
            backends += table
                .frontends
                .values()
                .map(|f| f.backends.len())
                .sum::<usize>();
            conflicts += plan
                .export_statuses
                .iter()
                .filter(|s| s.conflict().is_some())
                .count();
        }
        assert!(
            imports > 0 && backends > 0 && conflicts > 0,
            "{imports} imports, {backends} backends, {conflicts} conflicts"
        );
        // Not text: nothing to merge.
        assert!(merge_manifests(&[0, 0xff, 0xfe]).is_none());
        assert!(merge_manifests(&[]).is_none());
    }
}
