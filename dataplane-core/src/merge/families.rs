//! The import's IP families.
//!
//! Each export's families are its Service's `ipFamilies`, else the address types of its local
//! EndpointSlices. Exports that know no family at all (no `ipFamilies`, no slices) neither
//! constrain nor extend the result, like Cilium's handling of legacy peers.
//!
//! - [`IpFamilyPolicy::Intersection`] (default): fold the exports oldest first, keeping the
//!   oldest's order. An export sharing no family with the result so far is excluded (its ports,
//!   endpoints and `status.clusters` entry are left out) and raises `IPFamilyConflict`. A partial
//!   overlap is not a conflict (see [`IpFamilyPolicy::Intersection`]).
//! - [`IpFamilyPolicy::Union`]: every family, in order of first appearance, oldest export first;
//!   `IPFamilyConflict` when the exports' sets differ. Nobody is excluded.
//!
//! The conflict is computed from the exports only, so every cluster reports the same conditions.
//! The import's `ipFamilies` as one importing cluster sees it are then the merged families that
//! the importing cluster supports (in merged order). When it supports none of them the import
//! keeps the merged families, gets no IPs and no slices, and is `Ready=False/IPFamilyNotSupported`.
//! When no export knows any family, the import gets the importing cluster's first supported
//! family, so `ipFamilies` is never empty (headless imports included: DNS needs it).

use std::collections::BTreeSet;

use super::IpFamilyPolicy;
use super::exports::Export;
use crate::model::{ClusterId, IpFamily};

/// The outcome of the family merge for one service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Families {
    /// The merged families before the importing cluster's filter (clusterset-wide).
    pub merged: Vec<IpFamily>,
    /// `ipFamilies` of the import as the importing cluster sees it; never empty.
    pub import: Vec<IpFamily>,
    /// Whether the importing cluster supports at least one merged family.
    pub supported: bool,
    /// Clusters left out of the import (Intersection only).
    pub excluded: BTreeSet<ClusterId>,
    /// The `IPFamilyConflict` message, when there is a conflict.
    pub conflict: Option<String>,
}

fn show(families: &[IpFamily]) -> String {
    let names: Vec<&str> = families.iter().map(|f| f.address_type()).collect();
    format!("[{}]", names.join(", "))
}

/// Merges the families of `exports` (oldest first). `local` are the importing cluster's
/// supported families, in its order of preference.
pub(crate) fn merge(
    exports: &[Export<'_>],
    policy: IpFamilyPolicy,
    local: &[IpFamily],
) -> Families {
    let known: Vec<&Export<'_>> = exports.iter().filter(|e| !e.families.is_empty()).collect();
    let total = exports.len();
    let mut excluded = BTreeSet::new();
    let mut merged: Vec<IpFamily> = Vec::new();
    let mut conflict = None;
    let Some(oldest) = known.first() else {
        let fallback = local.first().copied().unwrap_or(IpFamily::IPv4);
        return Families {
            merged: vec![fallback],
            import: vec![fallback],
            supported: true,
            excluded,
            conflict,
        };
    };
    match policy {
        IpFamilyPolicy::Intersection => {
            merged = oldest.families.clone();
            let mut left_out = Vec::new();
            for e in &known[1..] {
                let common: Vec<IpFamily> = merged
                    .iter()
                    .copied()
                    .filter(|f| e.families.contains(f))
                    .collect();
                if common.is_empty() {
                    excluded.insert(e.cluster.clone());
                    left_out.push(format!("\"{}\" {}", e.cluster, show(&e.families)));
                } else {
                    merged = common;
                }
            }
            if !left_out.is_empty() {
                conflict = Some(format!(
                    "Conflicting IP families. Using {} (the intersection, in the order of the \
                     oldest service export in \"{}\"); left out, having no family in common: {}. \
                     {}/{} clusters disagree.",
                    show(&merged),
                    oldest.cluster,
                    left_out.join(", "),
                    left_out.len(),
                    total
                ));
            }
        }
        IpFamilyPolicy::Union => {
            for e in &known {
                for f in &e.families {
                    if !merged.contains(f) {
                        merged.push(*f);
                    }
                }
            }
            let all: BTreeSet<IpFamily> = merged.iter().copied().collect();
            let disagree = known
                .iter()
                .filter(|e| e.families.iter().copied().collect::<BTreeSet<_>>() != all)
                .count();
            if disagree > 0 {
                conflict = Some(format!(
                    "Conflicting IP families. Using {} (the union, in the order of the oldest \
                     service export in \"{}\"); a client reaches only the clusters that support \
                     its family. {}/{} clusters disagree.",
                    show(&merged),
                    oldest.cluster,
                    disagree,
                    total
                ));
            }
        }
    }
    let import: Vec<IpFamily> = merged
        .iter()
        .copied()
        .filter(|f| local.contains(f))
        .collect();
    let supported = !import.is_empty();
    Families {
        import: if supported { import } else { merged.clone() },
        merged,
        supported,
        excluded,
        conflict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::cluster;
    use crate::merge::tests::bare_export;
    use IpFamily::{IPv4, IPv6};

    fn run(
        families: &[&[IpFamily]],
        policy: IpFamilyPolicy,
        local: &[IpFamily],
    ) -> (Vec<IpFamily>, Vec<String>, bool, bool) {
        let ids: Vec<ClusterId> = (0..families.len())
            .map(|i| cluster(&format!("c{i}")))
            .collect();
        let exports: Vec<Export<'_>> = families
            .iter()
            .zip(&ids)
            .map(|(f, id)| bare_export(id, vec![], f.to_vec()))
            .collect();
        let r = merge(&exports, policy, local);
        (
            r.import,
            r.excluded.iter().map(|c| c.to_string()).collect(),
            r.conflict.is_some(),
            r.supported,
        )
    }

    const BOTH: &[IpFamily] = &[IPv4, IPv6];
    /// Families of each export, oldest first.
    type Input<'a> = &'a [&'a [IpFamily]];

    /// Cilium's `TestIntersectIPFamilies` vectors (oldest first) plus the policy choices.
    #[test]
    fn intersection_table() {
        use IpFamilyPolicy::Intersection as I;
        let cases: &[(Input<'_>, &[IpFamily], &[&str], bool)] = &[
            // all dual-stack, orders differ: the oldest's order, no conflict
            (
                &[&[IPv4, IPv6], &[IPv6, IPv4], &[IPv4, IPv6]],
                &[IPv4, IPv6],
                &[],
                false,
            ),
            (&[&[IPv6, IPv4], &[IPv4, IPv6]], &[IPv6, IPv4], &[], false),
            // [nil, dual, v4] → [IPv4]: the legacy export does not constrain
            (&[&[], &[IPv4, IPv6], &[IPv4]], &[IPv4], &[], false),
            // [v6 (oldest), nil, dual] → [IPv6]
            (&[&[IPv6], &[], &[IPv4, IPv6]], &[IPv6], &[], false),
            // [v4, v6] → [IPv4] + conflict, v6 excluded
            (&[&[IPv4], &[IPv6]], &[IPv4], &["c1"], true),
            // [dual, v4, v6] → [IPv4] + conflict
            (&[&[IPv4, IPv6], &[IPv4], &[IPv6]], &[IPv4], &["c2"], true),
            // partial overlap is not a conflict (documented choice)
            (&[&[IPv4, IPv6], &[IPv4]], &[IPv4], &[], false),
        ];
        for (input, want, excluded, conflict) in cases {
            let (got, ex, c, _) = run(input, I, BOTH);
            assert_eq!(&got, want, "{input:?}");
            assert_eq!(ex, excluded.to_vec(), "{input:?}");
            assert_eq!(c, *conflict, "{input:?}");
        }
    }

    #[test]
    fn union_table() {
        use IpFamilyPolicy::Union as U;
        let cases: &[(Input<'_>, &[IpFamily], bool)] = &[
            (&[&[IPv4], &[IPv6]], &[IPv4, IPv6], true),
            (&[&[IPv6], &[IPv4, IPv6]], &[IPv6, IPv4], true),
            (&[&[IPv4, IPv6], &[IPv6, IPv4]], &[IPv4, IPv6], false),
            (&[&[IPv4], &[], &[IPv4]], &[IPv4], false),
        ];
        for (input, want, conflict) in cases {
            let (got, ex, c, _) = run(input, U, BOTH);
            assert_eq!(&got, want, "{input:?}");
            assert!(ex.is_empty());
            assert_eq!(c, *conflict, "{input:?}");
        }
    }

    #[test]
    fn nothing_known_falls_back_to_the_importing_clusters_first_family() {
        let (got, _, c, s) = run(&[&[], &[]], IpFamilyPolicy::Intersection, &[IPv6, IPv4]);
        assert_eq!(got, vec![IPv6]);
        assert!(!c && s);
    }

    #[test]
    fn importing_cluster_filters_and_flags_unsupported() {
        let (got, _, _, s) = run(&[&[IPv4, IPv6]], IpFamilyPolicy::Intersection, &[IPv6]);
        assert_eq!((got, s), (vec![IPv6], true));
        let (got, _, _, s) = run(&[&[IPv6]], IpFamilyPolicy::Intersection, &[IPv4]);
        assert_eq!((got, s), (vec![IPv6], false));
    }
}
