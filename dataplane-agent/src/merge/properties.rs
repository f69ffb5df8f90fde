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
use crate::lb::DEFAULT_AFFINITY_TIMEOUT_S;
use crate::model::{ClientIpConfig, ClusterId, ServiceImportType, SessionAffinityConfig};

/// The normalised properties of one export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Winner {
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
pub struct Properties {
    pub winner: Winner,
    pub winner_cluster: Option<ClusterId>,
    /// (reason, message) per contested field.
    pub conflicts: Vec<(ConflictReason, String)>,
}

/// The normalised properties of an export.
pub fn of(e: &Export<'_>) -> Winner {
    let spec = e.service.spec.as_ref();
    let session_affinity = spec
        .and_then(|s| s.session_affinity.clone())
        .unwrap_or_else(|| "None".into());
    let session_affinity_config = (session_affinity == "ClientIP").then(|| {
        let timeout = spec
            .and_then(|s| s.session_affinity_config.as_ref())
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_S as i32);
        SessionAffinityConfig {
            client_ip: Some(ClientIpConfig {
                timeout_seconds: Some(timeout),
            }),
        }
    });
    Winner {
        type_: if e.headless {
            ServiceImportType::Headless
        } else {
            ServiceImportType::ClusterSetIP
        },
        session_affinity,
        session_affinity_config,
        internal_traffic_policy: spec
            .and_then(|s| s.internal_traffic_policy.clone())
            .unwrap_or_else(|| "Cluster".into()),
        traffic_distribution: spec.and_then(|s| s.traffic_distribution.clone()),
        labels: e.spec.exported_labels.clone(),
        annotations: e.spec.exported_annotations.clone(),
    }
}

fn same_distribution(a: &Option<String>, b: &Option<String>) -> bool {
    fn canon(v: &Option<String>) -> Option<&str> {
        match v.as_deref() {
            Some("PreferClose") => Some("PreferSameZone"),
            other => other,
        }
    }
    canon(a) == canon(b)
}

fn timeout(c: &Option<SessionAffinityConfig>) -> Option<i32> {
    c.as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
}

/// Merges the properties of `exports` (oldest first). Every valid export takes part in the
/// comparison, including those the family merge left out.
pub fn merge(exports: &[Export<'_>]) -> Properties {
    let all: Vec<Winner> = exports.iter().map(of).collect();
    let Some(winner) = all.first().cloned() else {
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
                     value: String,
                     differs: &dyn Fn(&Winner) -> bool| {
        let n = all.iter().filter(|w| differs(w)).count();
        if n > 0 {
            conflicts.push((
                reason,
                format!(
                    "Conflicting {field}. Using {value} from oldest service export in \"{cluster}\". \
                     {n}/{total} clusters disagree."
                ),
            ));
        }
    };
    let quoted = |s: &str| format!("\"{s}\"");
    let json = |m: &BTreeMap<String, String>| serde_json::to_string(m).unwrap_or_default();
    check(
        ConflictReason::Type,
        "type",
        quoted(&winner.type_.to_string()),
        &|w| w.type_ != winner.type_,
    );
    check(
        ConflictReason::SessionAffinity,
        "sessionAffinity",
        quoted(&winner.session_affinity),
        &|w| w.session_affinity != winner.session_affinity,
    );
    if winner.session_affinity == "ClientIP" {
        let t = timeout(&winner.session_affinity_config).unwrap_or_default();
        check(
            ConflictReason::SessionAffinityConfig,
            "sessionAffinityConfig",
            format!("clientIP.timeoutSeconds {t}"),
            &|w| w.session_affinity == "ClientIP" && timeout(&w.session_affinity_config) != Some(t),
        );
    }
    check(
        ConflictReason::InternalTrafficPolicy,
        "internalTrafficPolicy",
        quoted(&winner.internal_traffic_policy),
        &|w| w.internal_traffic_policy != winner.internal_traffic_policy,
    );
    check(
        ConflictReason::TrafficDistribution,
        "trafficDistribution",
        winner
            .traffic_distribution
            .as_deref()
            .map_or_else(|| "no trafficDistribution".to_owned(), quoted),
        &|w| !same_distribution(&w.traffic_distribution, &winner.traffic_distribution),
    );
    check(
        ConflictReason::Labels,
        "exportedLabels",
        json(&winner.labels),
        &|w| w.labels != winner.labels,
    );
    check(
        ConflictReason::Annotations,
        "exportedAnnotations",
        json(&winner.annotations),
        &|w| w.annotations != winner.annotations,
    );
    Properties {
        winner,
        winner_cluster: Some(cluster),
        conflicts,
    }
}
