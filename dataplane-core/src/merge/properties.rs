//! Whole-service properties: the oldest export's value wins; any difference is a conflict.
//!
//! Values are normalised before they are compared, so that an unset field and its Kubernetes
//! default agree:
//! - `type`: `clusterIP: None` is `Headless`, everything else `ClusterSetIP`;
//! - `sessionAffinity`: unset is `None`;
//! - `sessionAffinityConfig`: only meaningful with `ClientIP` affinity, where an unset timeout is
//!   10800 s. It is compared only between exports that both use `ClientIP` (the winner and the
//!   other export): an export with `None` affinity already raises `SessionAffinityConflict`, and
//!   its leftover config is ignored, as the API server ignores it. The import carries a config
//!   only when its affinity is `ClientIP`;
//! - `internalTrafficPolicy`: unset is `Cluster`;
//! - `trafficDistribution`: unset differs from any value; `PreferClose` and `PreferSameZone`
//!   are the same (Kubernetes made the first the deprecated name of the second); the winner's
//!   spelling is kept;
//! - `exportedLabels` / `exportedAnnotations`: compared and taken as whole maps (no per-key
//!   merge).

use std::collections::BTreeMap;

use super::conditions::ConflictReason;
use super::exports::Export;
use crate::model::{
    ClientIpConfig, ClusterId, DEFAULT_AFFINITY_TIMEOUT_S, ServiceImportType, SessionAffinityConfig,
};

/// The normalised properties of one export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Winner {
    pub type_: ServiceImportType,
    pub session_affinity: String,
    pub session_affinity_config: Option<SessionAffinityConfig>,
    pub internal_traffic_policy: String,
    pub traffic_distribution: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The properties of one service: the winner and the contested fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Properties {
    pub winner: Winner,
    pub winner_cluster: Option<ClusterId>,
    /// (reason, message) per contested field.
    pub conflicts: Vec<(ConflictReason, String)>,
}

/// The normalised properties of an export, borrowed: the merge compares every export with
/// the winner without copying their values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct View<'a> {
    type_: ServiceImportType,
    session_affinity: &'a str,
    /// The ClientIP timeout, only with ClientIP affinity.
    timeout: Option<i32>,
    internal_traffic_policy: &'a str,
    traffic_distribution: Option<&'a str>,
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
}

fn view<'a>(e: &'a Export<'_>) -> View<'a> {
    let svc = e.service;
    let session_affinity = svc.session_affinity.as_deref().unwrap_or("None");
    let timeout = (session_affinity == "ClientIP").then(|| {
        svc.affinity_timeout
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_S as i32)
    });
    View {
        type_: if e.headless {
            ServiceImportType::Headless
        } else {
            ServiceImportType::ClusterSetIP
        },
        session_affinity,
        timeout,
        internal_traffic_policy: svc.internal_traffic_policy.as_deref().unwrap_or("Cluster"),
        traffic_distribution: svc.traffic_distribution.as_deref(),
        labels: &e.spec.exported_labels,
        annotations: &e.spec.exported_annotations,
    }
}

impl View<'_> {
    fn to_winner(self) -> Winner {
        Winner {
            type_: self.type_,
            session_affinity: self.session_affinity.to_owned(),
            session_affinity_config: self.timeout.map(|t| SessionAffinityConfig {
                client_ip: Some(ClientIpConfig {
                    timeout_seconds: Some(t),
                }),
            }),
            internal_traffic_policy: self.internal_traffic_policy.to_owned(),
            traffic_distribution: self.traffic_distribution.map(str::to_owned),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
        }
    }
}

fn same_distribution(a: Option<&str>, b: Option<&str>) -> bool {
    fn canon(v: Option<&str>) -> Option<&str> {
        match v {
            Some("PreferClose") => Some("PreferSameZone"),
            other => other,
        }
    }
    canon(a) == canon(b)
}

/// Merges the properties of `exports` (oldest first). Every valid export takes part in the
/// comparison, including those the family merge left out.
pub(crate) fn merge(exports: &[Export<'_>]) -> Properties {
    let all: Vec<View<'_>> = exports.iter().map(view).collect();
    let Some(w) = all.first().copied() else {
        return Properties {
            winner: Winner {
                type_: ServiceImportType::ClusterSetIP,
                session_affinity: "None".into(),
                session_affinity_config: None,
                internal_traffic_policy: "Cluster".into(),
                traffic_distribution: None,
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
            },
            winner_cluster: None,
            conflicts: Vec::new(),
        };
    };
    let cluster = exports[0].cluster.clone();
    let total = all.len();
    let mut conflicts = Vec::new();
    let mut check = |reason: ConflictReason,
                     field: &str,
                     value: &dyn Fn() -> String,
                     differs: &dyn Fn(&View<'_>) -> bool| {
        let n = all.iter().filter(|v| differs(v)).count();
        if n > 0 {
            conflicts.push((
                reason,
                format!(
                    "Conflicting {field}. Using {} from oldest service export in \"{cluster}\". \
                     {n}/{total} clusters disagree.",
                    value()
                ),
            ));
        }
    };
    let quoted = |s: &str| format!("\"{s}\"");
    let json = |m: &BTreeMap<String, String>| serde_json::to_string(m).unwrap_or_default();
    check(
        ConflictReason::Type,
        "type",
        &|| quoted(&w.type_.to_string()),
        &|v| v.type_ != w.type_,
    );
    check(
        ConflictReason::SessionAffinity,
        "sessionAffinity",
        &|| quoted(w.session_affinity),
        &|v| v.session_affinity != w.session_affinity,
    );
    if let Some(t) = w.timeout {
        check(
            ConflictReason::SessionAffinityConfig,
            "sessionAffinityConfig",
            &|| format!("clientIP.timeoutSeconds {t}"),
            &|v| v.timeout.is_some_and(|other| other != t),
        );
    }
    check(
        ConflictReason::InternalTrafficPolicy,
        "internalTrafficPolicy",
        &|| quoted(w.internal_traffic_policy),
        &|v| v.internal_traffic_policy != w.internal_traffic_policy,
    );
    check(
        ConflictReason::TrafficDistribution,
        "trafficDistribution",
        &|| {
            w.traffic_distribution
                .map_or_else(|| "no trafficDistribution".to_owned(), quoted)
        },
        &|v| !same_distribution(v.traffic_distribution, w.traffic_distribution),
    );
    check(
        ConflictReason::Labels,
        "exportedLabels",
        &|| json(w.labels),
        &|v| v.labels != w.labels,
    );
    check(
        ConflictReason::Annotations,
        "exportedAnnotations",
        &|| json(w.annotations),
        &|v| v.annotations != w.annotations,
    );
    Properties {
        winner: w.to_winner(),
        winner_cluster: Some(cluster),
        conflicts,
    }
}
