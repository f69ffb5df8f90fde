//! Conditions on ServiceExports and ServiceImports, with the MCS API's reason strings.
//!
//! - valid export: `Valid=True/Valid`, `Ready=True/Ready`, and `Conflict=True/<reasons>` or
//!   `Conflict=False/NoConflicts`;
//! - invalid export: `Valid=False/<reason>` (see [`super::exports`]), `Ready=False/Pending`, no
//!   `Conflict`;
//! - valid export some of whose endpoints the address policy refuses ([`crate::policy`]):
//!   also `EndpointsRefused=True/<reasons>` (a condition type of this project; absent while
//!   none is refused);
//! - import: `Ready=True/Ready`, `Ready=False/IPFamilyNotSupported` when the importing cluster
//!   supports none of its families, or `Ready=False/NoClusterSetIPAvailable` when the ClusterSet
//!   CIDR of a family is full.
//!
//! `Conflict` is the same on every valid export of a service. Its reason joins every reason
//! present with commas and no spaces, in the fixed order of [`ConflictReason`], which matches
//! the CRD's pattern `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`. Its message is one sentence
//! group per contested field, in the same order, each naming the winning value, the cluster of
//! the oldest export and how many clusters disagree.

use std::{
    borrow::Cow,
    sync::{Arc, LazyLock},
};

use serde::Serialize;

use super::exports::Export;
use super::families::Families;
use super::ports::{self, MergedPorts};
use super::properties::Properties;
use crate::model::{Condition, IpFamily};

/// A condition's `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ConditionType {
    /// Whether the export can take part in the merge: its Service exists and can be exported.
    Valid,
    /// Whether the export is in the ClusterSet; on an import, whether it can be used.
    Ready,
    /// Whether the valid exports of the service disagree on something.
    Conflict,
    /// Some endpoints of the export's cluster are not imported: the address policy refuses
    /// them (this project's condition type, set only while it holds).
    EndpointsRefused,
}

impl ConditionType {
    /// The `type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::Valid => "Valid",
            ConditionType::Ready => "Ready",
            ConditionType::Conflict => "Conflict",
            ConditionType::EndpointsRefused => "EndpointsRefused",
        }
    }
}

/// A condition's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
}

/// A condition without a timestamp: the merge has no clock. [`MergeCondition::to_k8s`] adds one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct MergeCondition {
    /// Which condition this is.
    #[serde(rename = "type")]
    pub type_: ConditionType,
    /// Whether it holds.
    pub status: ConditionStatus,
    /// Static for the fixed conditions, so 50,000 exports do not each allocate them.
    pub reason: Cow<'static, str>,
    /// The explanation for people, at most [`MAX_MESSAGE`] bytes (a longer one is cut and
    /// ends in `...`).
    pub message: Cow<'static, str>,
}

/// The Kubernetes limit on a condition message.
pub const MAX_MESSAGE: usize = 32768;

impl MergeCondition {
    fn new(
        type_: ConditionType,
        status: ConditionStatus,
        reason: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        let mut message = message.into();
        if message.len() > MAX_MESSAGE {
            let message = message.to_mut();
            let mut end = MAX_MESSAGE - 3;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str("...");
        }
        Self {
            type_,
            status,
            reason: reason.into(),
            message,
        }
    }

    /// As a `metav1.Condition` with the given `lastTransitionTime`.
    ///
    /// ```
    /// # use dataplane_core::merge::conditions::{import_ready, epoch};
    /// let c = import_ready().to_k8s(epoch());
    /// assert_eq!((c.type_.as_str(), c.status.as_str()), ("Ready", "True"));
    /// ```
    pub fn to_k8s(
        &self,
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    ) -> Condition {
        let status = match self.status {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
        };
        let type_ = self.type_.as_str();
        Condition {
            last_transition_time,
            message: self.message.to_string(),
            observed_generation: None,
            reason: self.reason.to_string(),
            status: status.into(),
            type_: type_.into(),
        }
    }
}

/// The placeholder `lastTransitionTime` (the Unix epoch) the pure merge writes into
/// `ServiceImport.status.conditions`; writers replace it with the real transition time.
pub fn epoch() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// The `Conflict` reasons, in the order they are joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConflictReason {
    /// The exports' port sets differ (`PortConflict`).
    Port,
    /// The exports' IP families do not agree under the [`IpFamilyPolicy`](super::IpFamilyPolicy)
    /// (`IPFamilyConflict`).
    IpFamily,
    /// Some exported Services are headless and some are not (`TypeConflict`).
    Type,
    /// The Services' `sessionAffinity` differ (`SessionAffinityConflict`).
    SessionAffinity,
    /// The `ClientIP` affinity timeouts differ (`SessionAffinityConfigConflict`).
    SessionAffinityConfig,
    /// The Services' `internalTrafficPolicy` differ (`InternalTrafficPolicyConflict`).
    InternalTrafficPolicy,
    /// The Services' `trafficDistribution` differ (`TrafficDistributionConflict`).
    TrafficDistribution,
    /// The exports' `exportedLabels` differ (`LabelsConflict`).
    Labels,
    /// The exports' `exportedAnnotations` differ (`AnnotationsConflict`).
    Annotations,
}

impl ConflictReason {
    /// Every reason, in the order they are joined.
    pub const ALL: [ConflictReason; 9] = [
        ConflictReason::Port,
        ConflictReason::IpFamily,
        ConflictReason::Type,
        ConflictReason::SessionAffinity,
        ConflictReason::SessionAffinityConfig,
        ConflictReason::InternalTrafficPolicy,
        ConflictReason::TrafficDistribution,
        ConflictReason::Labels,
        ConflictReason::Annotations,
    ];

    /// The MCS API reason string.
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictReason::Port => "PortConflict",
            ConflictReason::IpFamily => "IPFamilyConflict",
            ConflictReason::Type => "TypeConflict",
            ConflictReason::SessionAffinity => "SessionAffinityConflict",
            ConflictReason::SessionAffinityConfig => "SessionAffinityConfigConflict",
            ConflictReason::InternalTrafficPolicy => "InternalTrafficPolicyConflict",
            ConflictReason::TrafficDistribution => "TrafficDistributionConflict",
            ConflictReason::Labels => "LabelsConflict",
            ConflictReason::Annotations => "AnnotationsConflict",
        }
    }
}

/// The combined `Conflict` (reason, message) of a service, `None` when nothing conflicts.
pub(crate) fn conflict(
    exports: &[Export<'_>],
    families: &Families,
    ports: &MergedPorts,
    props: &Properties,
) -> Option<(String, String)> {
    let mut parts: Vec<(ConflictReason, String)> = Vec::new();
    // Both sides hold each key once (an export's ports are validated, merged ports are
    // unique), so the sets are equal when the sizes are and one side is in the other.
    let merged: Vec<ports::PortKeyRef<'_>> = ports
        .merged
        .iter()
        .map(|m| ports::key_ref(&m.port))
        .collect();
    // A scan of the merged ports for the usual handful, a set for many.
    let merged_set: Option<std::collections::HashSet<ports::PortKeyRef<'_>>> =
        (merged.len() > 16).then(|| merged.iter().copied().collect());
    let disagree: Vec<&Export<'_>> = exports
        .iter()
        .filter(|e| {
            e.ports.len() != merged.len()
                || !e.ports.iter().all(|p| {
                    let key = ports::key_ref(p);
                    match &merged_set {
                        Some(set) => set.contains(&key),
                        None => merged.contains(&key),
                    }
                })
        })
        .collect();
    if !disagree.is_empty() {
        let oldest = exports
            .first()
            .map(|e| e.cluster.to_string())
            .unwrap_or_default();
        let mut msg = format!(
            "Conflicting ports. Using the union of the ports, the oldest definition of each \
             winning (oldest service export in \"{oldest}\")."
        );
        const SHOWN: usize = 10;
        for d in ports.dropped.iter().take(SHOWN) {
            msg.push_str(&format!(
                " Dropped {} from \"{}\": {} from \"{}\" is used.",
                ports::show(&d.port),
                d.cluster,
                ports::show(&d.winner),
                d.winner_cluster
            ));
        }
        if ports.dropped.len() > SHOWN {
            msg.push_str(&format!(
                " {} more ports dropped.",
                ports.dropped.len() - SHOWN
            ));
        }
        let named: Vec<String> = disagree
            .iter()
            .take(SHOWN)
            .map(|e| format!("\"{}\"", e.cluster))
            .collect();
        msg.push_str(&format!(
            " Ports differing from the merged ports in: {}{}.",
            named.join(", "),
            if disagree.len() > SHOWN { ", ..." } else { "" }
        ));
        msg.push_str(&format!(
            " {}/{} clusters disagree.",
            disagree.len(),
            exports.len()
        ));
        parts.push((ConflictReason::Port, msg));
    }
    if let Some(msg) = &families.conflict {
        parts.push((ConflictReason::IpFamily, msg.clone()));
    }
    parts.extend(props.conflicts.iter().cloned());
    if parts.is_empty() {
        return None;
    }
    parts.sort_by_key(|(r, _)| *r);
    let reason: Vec<&str> = parts.iter().map(|(r, _)| r.as_str()).collect();
    let message: Vec<&str> = parts.iter().map(|(_, m)| m.as_str()).collect();
    Some((reason.join(","), message.join(" ")))
}

/// The conditions of one ServiceExport, shared: every export of a service has the same ones
/// (and every export without a conflict the same as all others), so 50,000 exports hold a few
/// lists, not 50,000.
pub type ExportConditions = Arc<[MergeCondition]>;

/// The conditions of a valid export, given its service's conflict.
pub fn valid_export(conflict: Option<(String, String)>) -> ExportConditions {
    static NO_CONFLICT: LazyLock<ExportConditions> = LazyLock::new(|| valid_export_with(None));
    match conflict {
        None => NO_CONFLICT.clone(),
        conflict => valid_export_with(conflict),
    }
}

fn valid_export_with(conflict: Option<(String, String)>) -> ExportConditions {
    use ConditionStatus::*;
    use ConditionType::*;
    let conflict = match conflict {
        Some((reason, message)) => MergeCondition::new(Conflict, True, reason, message),
        None => MergeCondition::new(
            Conflict,
            False,
            "NoConflicts",
            "ServiceExport has no conflicts.",
        ),
    };
    Arc::new([
        MergeCondition::new(
            Valid,
            True,
            "Valid",
            "The ServiceExport and its Service are exportable.",
        ),
        MergeCondition::new(
            Ready,
            True,
            "Ready",
            "The service is exported to the ClusterSet.",
        ),
        conflict,
    ])
}

/// The conditions of an invalid export: no `Conflict`, since it takes no part in the merge.
pub fn invalid_export(reason: &str, message: &str) -> ExportConditions {
    use ConditionStatus::*;
    use ConditionType::*;
    Arc::new([
        MergeCondition::new(Valid, False, reason.to_owned(), message.to_owned()),
        MergeCondition::new(Ready, False, "Pending", "The ServiceExport is not valid."),
    ])
}

/// How many refused endpoints an `EndpointsRefused` message lists by address.
pub const REFUSED_LISTED: usize = 20;

/// `EndpointsRefused=True` for the refused endpoints of one export's cluster (not empty,
/// sorted): the reasons joined with commas in [`Refusal`](crate::policy::Refusal) order, and
/// the first [`REFUSED_LISTED`] endpoints with their slice and reason.
pub fn endpoints_refused(refused: &[&crate::policy::RefusedEndpoint]) -> MergeCondition {
    let mut reasons: Vec<crate::policy::Refusal> = refused.iter().map(|r| r.why).collect();
    reasons.sort();
    reasons.dedup();
    let reason: Vec<&str> = reasons.iter().map(|r| r.reason()).collect();
    let listed: Vec<String> = refused
        .iter()
        .take(REFUSED_LISTED)
        .map(|r| r.to_string())
        .collect();
    let more = refused.len().saturating_sub(REFUSED_LISTED);
    let mut message = format!(
        "{} endpoint(s) are not imported by the address policy: {}",
        refused.len(),
        listed.join("; ")
    );
    if more > 0 {
        message.push_str(&format!("; and {more} more"));
    }
    message.push('.');
    MergeCondition::new(
        ConditionType::EndpointsRefused,
        ConditionStatus::True,
        reason.join(","),
        message,
    )
}

/// `Ready=True/Ready` of an import.
pub fn import_ready() -> MergeCondition {
    MergeCondition::new(
        ConditionType::Ready,
        ConditionStatus::True,
        "Ready",
        "The ServiceImport is ready.",
    )
}

fn show(families: &[IpFamily]) -> String {
    let names: Vec<&str> = families.iter().map(|f| f.address_type()).collect();
    format!("[{}]", names.join(", "))
}

/// `Ready=False/IPFamilyNotSupported` of an import.
pub fn import_family_not_supported(import: &[IpFamily], local: &[IpFamily]) -> MergeCondition {
    MergeCondition::new(
        ConditionType::Ready,
        ConditionStatus::False,
        "IPFamilyNotSupported",
        format!(
            "The importing cluster supports {} and none of the ServiceImport's IP families {}.",
            show(local),
            show(import)
        ),
    )
}

/// `Ready=False/NoClusterSetIPAvailable`: a ClusterSet CIDR has no free address.
pub fn import_no_ip(import: &[IpFamily]) -> MergeCondition {
    MergeCondition::new(
        ConditionType::Ready,
        ConditionStatus::False,
        "NoClusterSetIPAvailable",
        format!(
            "No free ClusterSet IP for every family of {}; enlarge clusterSetCIDRs.",
            show(import)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::ConflictReason;

    #[test]
    fn every_reason_is_listed_once_in_join_order() {
        // The derived order is the declaration order, which is the join order.
        assert!(ConflictReason::ALL.windows(2).all(|w| w[0] < w[1]));
        let names: std::collections::BTreeSet<&str> =
            ConflictReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), ConflictReason::ALL.len());
        assert_eq!(ConflictReason::ALL[0].as_str(), "PortConflict");
        assert_eq!(ConflictReason::ALL[8].as_str(), "AnnotationsConflict");
    }
}
