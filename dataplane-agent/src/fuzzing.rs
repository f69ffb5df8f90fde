//! The bodies of the cargo-fuzz targets in `fuzz/`, kept in the crate so that the test suite
//! replays their seeds and a change of the APIs they call cannot leave them broken unseen.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use dataplane_core::{
    lb::{
        self, LbState, LbTable,
        inputs::{Change, InputIndex, import_input, slice_input},
    },
    manifest::Manifest,
    merge::{self, ClusterSetConfig, ClusterSnapshot, MergeOutput},
    model::{
        ClusterId, EndpointSlice, Interner, NamespacedName, ServiceImport, records::ImportRecord,
    },
    policy::AddressPolicy,
};
use hickory_proto::rr::{LowerName, RecordType};

use crate::bpf::desired::{self, DesiredService};
use crate::dns::{DnsZone, zone::service_fqdn};
use crate::source::{clusterset_dir::parse_config, manifests::parse_documents};

/// Bytes → manifests of 2-3 clusters → merge → lb table; `None` for no bytes, or bytes that
/// are not UTF-8 text. Panics only where the merge is wrong: it must not be changed by feeding its imports
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

/// What a node made of fuzzed manifests.
#[derive(Debug)]
pub struct NodeOutcome {
    /// The lb table of the final objects.
    pub table: LbTable,
    /// The map entries the node would have written, service by service.
    pub entries: usize,
    /// The (service name, record type) queries, of A, AAAA and SRV, answered with records.
    pub answered: usize,
}

/// Bytes → ServiceImports and imported EndpointSlices → the node's inputs, one watch event per
/// object in order, then deletes → lb table and map entries → DNS zone; `None` for bytes that
/// are not UTF-8 text. The deletes come after every write: of the final objects of each kind,
/// sorted by namespace/name, the second of every three. Panics only where the node is wrong:
/// after the last event, the table kept event by event and the map entries handed out service
/// by service must be those of a full build of the final objects. The DNS zone is built from
/// the final inputs and queried, which must not panic; its answers are not compared.
pub fn node_manifests(data: &[u8]) -> Option<NodeOutcome> {
    let text = std::str::from_utf8(data).ok()?;
    let (objects, _errors) = parse_documents(text, Path::new("fuzz.yaml"));
    let names = Interner::new();
    // The objects as an API server holds them: one per kind and namespace/name, the last write.
    let mut imports: BTreeMap<NamespacedName, ServiceImport> = BTreeMap::new();
    let mut slices: BTreeMap<NamespacedName, EndpointSlice> = BTreeMap::new();
    let mut changes = Vec::new();
    for object in objects {
        match object {
            Manifest::ServiceImport(si) => {
                changes.push(Change::Import(import_input(&si, &names)));
                imports.insert(NamespacedName::of(&si.metadata), *si);
            }
            Manifest::EndpointSlice(slice) => {
                changes.push(Change::Slice(slice_input(&slice, &names)));
                slices.insert(NamespacedName::of(&slice.metadata), *slice);
            }
            Manifest::Service(_) | Manifest::ServiceExport(_) => {}
        }
    }
    // The second of every three, so that an input of one object keeps it.
    let deleted_imports: Vec<NamespacedName> = imports.keys().skip(1).step_by(3).cloned().collect();
    let deleted_slices: Vec<NamespacedName> = slices.keys().skip(1).step_by(3).cloned().collect();
    for id in &deleted_imports {
        imports.remove(id);
        changes.push(Change::ImportDeleted(id.clone()));
    }
    for id in &deleted_slices {
        slices.remove(id);
        changes.push(Change::SliceDeleted(id.clone()));
    }

    let mut index = InputIndex::default();
    let mut kept = LbState::default();
    let mut lean = LbState::default();
    let mut written: BTreeMap<desired::FeAddr, (NamespacedName, desired::DesiredFrontend)> =
        BTreeMap::new();
    for change in changes {
        let mut dirty = BTreeSet::new();
        index.apply(change, &mut dirty);
        kept.update(&dirty, |s| index.inputs(s));
        // As the map writer takes them: a rebuilt service's entries replace its old ones.
        for (service, part) in lean.update_parts(&dirty, |s| index.inputs(s)) {
            written.retain(|_, (owner, _)| *owner != service);
            let d = DesiredService::from_part(service, part);
            for (addr, frontend) in d.frontends {
                written.insert(addr, (d.service.clone(), frontend));
            }
        }
    }
    let imports: Vec<ServiceImport> = imports.into_values().collect();
    let slices: Vec<EndpointSlice> = slices.into_values().collect();
    let full = lb::build(&imports, &slices);
    assert_eq!(
        kept.table().frontends,
        full.frontends,
        "frontends kept by events"
    );
    assert_eq!(kept.table().vips, full.vips, "VIPs kept by events");
    assert_eq!(lean.table().vips, full.vips, "VIPs kept by parts");
    assert_eq!(
        written,
        desired::entries(&full),
        "map entries written by parts"
    );

    let zone = DnsZone::new(30);
    zone.sync(
        index.services(),
        |s| index.inputs(s),
        &AddressPolicy::default(),
        &full.vips,
        true,
    );
    let mut answered = 0;
    for service in index.services() {
        let Some(fqdn) = service_fqdn(&service.namespace, &service.name) else {
            continue;
        };
        for rtype in [RecordType::A, RecordType::AAAA, RecordType::SRV] {
            let answer = zone.read().answer(&LowerName::from(&fqdn), rtype);
            answered += usize::from(!answer.answers().is_empty());
        }
    }
    Some(NodeOutcome {
        entries: written.len(),
        table: full,
        answered,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeds(target: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/seeds")
            .join(target);
        let mut seeds: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("entry").path())
            .collect();
        seeds.sort();
        seeds
            .into_iter()
            .map(|path| {
                let data = std::fs::read(&path).expect("seed");
                (path, data)
            })
            .collect()
    }

    /// Every seed of the node target goes through the events, and the seeds as a whole reach
    /// the maps and the DNS zone.
    #[test]
    fn the_node_fuzz_seeds_give_the_full_build() {
        let seeds = seeds("node");
        assert!(seeds.len() >= 5, "{} seeds", seeds.len());
        let (mut backends, mut entries, mut answered) = (0, 0, 0);
        for (path, data) in &seeds {
            let outcome =
                node_manifests(data).unwrap_or_else(|| panic!("{}: not text", path.display()));
            backends += outcome.table.backend_count();
            entries += outcome.entries;
            answered += outcome.answered;
        }
        assert!(
            backends > 0 && entries > 0 && answered > 0,
            "{backends} backends, {entries} entries, {answered} answers"
        );
        assert!(node_manifests(&[0xff, 0xfe]).is_none());
    }

    /// Every seed of the fuzz target merges, stably, and the seeds as a whole exercise the
    /// merge: imports with ports, frontends with backends, and conflicts.
    #[test]
    fn the_fuzz_seeds_merge_stably() {
        let seeds = seeds("merge");
        assert!(seeds.len() >= 6, "{} seeds", seeds.len());
        let (mut imports, mut backends, mut conflicts) = (0, 0, 0);
        for (path, data) in &seeds {
            let (plan, table) =
                merge_manifests(data).unwrap_or_else(|| panic!("{}: not text", path.display()));
            imports += plan.service_imports.len();
            backends += table.backend_count();
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
