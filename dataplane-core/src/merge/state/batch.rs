//! Merging one batch of services: validation, the per-service merge steps, IP allocation and
//! the imported slices, for the services [`MergeState`] marked.

use super::*;
use crate::lb::inputs::record_input;

impl MergeState {
    /// Merges the services of `batch` in order. `strict` (an update): contention is an error
    /// instead of being resolved in order.
    pub(super) fn merge_batch(
        &mut self,
        batch: &BTreeSet<NamespacedName>,
        existing: &HashMap<NamespacedName, Vec<IpAddr>>,
        strict: bool,
    ) -> Result<Vec<(NamespacedName, Option<ServiceOutput>)>, Contention> {
        let MergeState {
            config,
            importing: _,
            local_families,
            grace,
            policy,
            services,
            withdrawn,
            ip_owners,
            starved,
            names,
            port_lists,
            ..
        } = self;
        let empty = Members::new();
        // Each member's local slices, withdrawn members' left out; borrowed by the drafts.
        let inputs: Vec<(&NamespacedName, Vec<MemberInputs<'_>>)> = batch
            .iter()
            .map(|s| {
                let members = services.get(s).unwrap_or(&empty);
                let list = members
                    .iter()
                    .map(|(c, m)| {
                        let slices: &[Arc<LocalSlice>] = if withdrawn.contains(c) {
                            &[]
                        } else {
                            &m.slices
                        };
                        (c, m, slices)
                    })
                    .collect();
                (s, list)
            })
            .collect();
        let mut statuses: Vec<Vec<ExportStatus>> = Vec::with_capacity(inputs.len());
        let mut valid: Vec<Vec<exports::Export<'_>>> = Vec::with_capacity(inputs.len());
        for (service, members) in &inputs {
            let mut out = Vec::new();
            let mut ok = Vec::new();
            for (cluster, member, slices) in members {
                let Some(export) = member.export.as_deref() else {
                    continue;
                };
                match exports::validate(cluster, member.service.as_deref(), export, slices) {
                    Ok(e) => ok.push(e),
                    Err((reason, message)) => out.push(ExportStatus {
                        cluster: (*cluster).clone(),
                        service: (*service).clone(),
                        conditions: conditions::invalid_export(&reason, &message),
                    }),
                }
            }
            ok.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
            statuses.push(out);
            valid.push(ok);
        }
        let mut drafts: Vec<Option<Draft<'_>>> = Vec::with_capacity(inputs.len());
        for (((service, _), exports), statuses) in inputs.iter().zip(&valid).zip(&mut statuses) {
            if exports.is_empty() {
                drafts.push(None);
                continue;
            }
            let fams = families::merge(exports, config.ip_family_policy, local_families);
            let contributing: Vec<&exports::Export<'_>> = exports
                .iter()
                .filter(|e| !fams.excluded.contains(e.cluster))
                .collect();
            let ports = ports::merge(&contributing);
            let props = properties::merge(exports);
            let conflict = conditions::conflict(exports, &fams, &ports, &props);
            let shared = conditions::valid_export(conflict);
            for e in exports {
                statuses.push(ExportStatus {
                    cluster: e.cluster.clone(),
                    service: (*service).clone(),
                    conditions: shared.clone(),
                });
            }
            statuses.sort_by(|a, b| a.cluster.cmp(&b.cluster));
            drafts.push(Some(Draft {
                service,
                contributing,
                families: fams,
                ports,
                props,
            }));
        }

        let requests: Vec<ips::Request<'_>> = drafts
            .iter()
            .flatten()
            .filter(|d| d.needs_ips())
            .map(|d| ips::Request {
                service: d.service,
                families: &d.families.import,
            })
            .collect();
        let allocation = ips::allocate(&requests, existing, &config.cidrs, ip_owners);
        if strict && !allocation.starved.is_empty() {
            return Err(Contention);
        }
        starved.extend(allocation.starved.iter().cloned());

        let mut out = Vec::with_capacity(drafts.len());
        for ((service, statuses), draft) in batch.iter().zip(statuses).zip(drafts) {
            let Some(d) = draft else {
                let output = (!statuses.is_empty()).then(|| ServiceOutput {
                    statuses,
                    ..Default::default()
                });
                out.push((service.clone(), output));
                continue;
            };
            let mut ready = if d.families.supported {
                conditions::import_ready()
            } else {
                conditions::import_family_not_supported(&d.families.import, local_families)
            };
            let mut ips_out = Vec::new();
            if d.needs_ips() {
                match allocation.ips.get(service) {
                    Some(ips) => ips_out = ips.clone(),
                    None => ready = conditions::import_no_ip(&d.families.import),
                }
            }
            for ip in &ips_out {
                ip_owners.insert(*ip, service.clone());
            }
            let mut slices = Vec::new();
            let mut refused = Vec::new();
            if d.families.supported {
                let batch = strict.then_some(batch);
                slices::build(
                    &d.contributing,
                    service,
                    &d.ports.merged,
                    &d.families.import,
                    policy,
                    port_lists,
                    &mut slices,
                    &mut refused,
                    &mut |ns, c, salt| names.claim(ns, c, salt, service, batch),
                )?;
            }
            refused.sort();
            let mut statuses = statuses;
            refused_conditions(&mut statuses, &refused);
            let mut import = d.import(ips_out, ready);
            withdrawn_note(&mut import, withdrawn, *grace);
            // Not an in-place collect: that would keep the records' buffer, 12 times the size.
            let mut shared = Vec::with_capacity(slices.len());
            shared.extend(slices.into_iter().map(record_input));
            out.push((
                service.clone(),
                Some(ServiceOutput {
                    import: Some(record_input(import)),
                    slices: shared,
                    statuses,
                    refused,
                }),
            ));
        }
        Ok(out)
    }
}

/// Adds `EndpointsRefused` to the status of each export whose cluster has endpoints in
/// `refused` (sorted).
fn refused_conditions(statuses: &mut [ExportStatus], refused: &[RefusedEndpoint]) {
    if refused.is_empty() {
        return;
    }
    for status in statuses {
        let of_cluster: Vec<&RefusedEndpoint> = refused
            .iter()
            .filter(|r| r.cluster == status.cluster)
            .collect();
        if !of_cluster.is_empty() {
            let mut own = status.conditions.to_vec();
            own.push(conditions::endpoints_refused(&of_cluster));
            status.conditions = own.into();
        }
    }
}

/// Says in an import's `Ready` message which of its clusters have their endpoints withdrawn.
fn withdrawn_note(import: &mut ImportRecord, withdrawn: &BTreeSet<ClusterId>, grace: Duration) {
    if withdrawn.is_empty() {
        return;
    }
    let Some(status) = import.status.as_mut() else {
        return;
    };
    let gone: Vec<String> = status
        .clusters
        .iter()
        .filter(|c| withdrawn.iter().any(|w| w.as_str() == c.cluster))
        .map(|c| format!("\"{}\"", c.cluster))
        .collect();
    if gone.is_empty() {
        return;
    }
    for c in status.conditions.iter_mut().filter(|c| c.type_ == "Ready") {
        c.message = format!(
            "{} Endpoints of cluster {} are withdrawn: its API server has been unreachable \
             for longer than the grace period ({}s).",
            c.message,
            gone.join(", "),
            grace.as_secs_f64()
        );
    }
}

/// One service between the merge steps and the output.
struct Draft<'a> {
    service: &'a NamespacedName,
    contributing: Vec<&'a exports::Export<'a>>,
    families: families::Families,
    ports: ports::MergedPorts,
    props: properties::Properties,
}

impl Draft<'_> {
    fn needs_ips(&self) -> bool {
        self.props.winner.type_ == ServiceImportType::ClusterSetIP && self.families.supported
    }

    fn import(&self, ips: Vec<IpAddr>, ready: conditions::MergeCondition) -> ImportRecord {
        let w = &self.props.winner;
        let mut clusters: Vec<ClusterStatus> = self
            .contributing
            .iter()
            .map(|e| ClusterStatus {
                cluster: e.cluster.to_string(),
            })
            .collect();
        clusters.sort();
        clusters.dedup();
        ImportRecord {
            service: self.service.clone(),
            type_: w.type_,
            ips,
            ip_families: self.families.import.clone(),
            ports: self.ports.merged.iter().map(|p| p.port.clone()).collect(),
            session_affinity: Some(Name::from(w.session_affinity.as_str())),
            session_affinity_config: w.session_affinity_config.clone(),
            internal_traffic_policy: Some(Name::from(w.internal_traffic_policy.as_str())),
            traffic_distribution: w.traffic_distribution.as_deref().map(Name::from),
            labels: w.labels.clone().into(),
            annotations: w.annotations.clone().into(),
            status: Some(Box::new(ServiceImportStatus {
                clusters,
                conditions: vec![ready.to_k8s(conditions::epoch())],
            })),
        }
    }
}
