//! Merging one batch of services: validation, the per-service merge steps, IP allocation and
//! the imported slices, for the services [`MergeState`] marked.

use std::sync::{
    Mutex, PoisonError,
    atomic::{AtomicUsize, Ordering},
};

use super::held::held_output;
use super::*;
use crate::lb::inputs::record_input;

/// How the `Ready` message of an import names its withdrawn clusters.
const WITHDRAWN_NOTE: &str = " Endpoints of cluster ";

/// Batches of at least this many services (a full merge, a large relist) are merged on every
/// core; smaller ones (an event's update) stay on the caller's thread, where starting threads
/// would cost more than their merge.
pub(crate) const PARALLEL_FROM: usize = 512;

/// Runs per thread of [`map_in_order`]: enough for a thread that finishes early to take over
/// work, few enough that each run is many services.
const RUNS_PER_THREAD: usize = 4;

/// `f` of each item, in order: on `threads` threads (this one and `threads - 1` more), or all
/// on this thread when `threads` is 1. The same `f` either way, so the result does not depend
/// on the choice.
///
/// The items are cut into a few contiguous runs per thread, taken by whichever thread is free
/// (services differ in size). The threads live for this call only, so no idle thread keeps
/// memory the allocator gave it; one that cannot be started leaves its share to the others.
fn map_in_order<T: Send, U: Send>(
    items: Vec<T>,
    threads: usize,
    f: impl Fn(T) -> U + Sync,
) -> Vec<U> {
    if threads < 2 || items.len() < 2 {
        return items.into_iter().map(f).collect();
    }
    let len = items.len();
    let per_run = len.div_ceil(threads * RUNS_PER_THREAD);
    let mut runs: Vec<Mutex<Vec<T>>> = Vec::with_capacity(threads * RUNS_PER_THREAD);
    let mut items = items.into_iter();
    loop {
        // Moved once each: no run is split off a copy of the rest.
        let run: Vec<T> = items.by_ref().take(per_run).collect();
        if run.is_empty() {
            break;
        }
        runs.push(Mutex::new(run));
    }
    let mapped: Vec<Mutex<Vec<U>>> = runs.iter().map(|_| Mutex::new(Vec::new())).collect();
    let next = AtomicUsize::new(0);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let (Some(run), Some(out)) = (runs.get(i), mapped.get(i)) else {
                break;
            };
            let run = std::mem::take(&mut *run.lock().unwrap_or_else(PoisonError::into_inner));
            let done: Vec<U> = run.into_iter().map(&f).collect();
            *out.lock().unwrap_or_else(PoisonError::into_inner) = done;
        }
    };
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads.min(runs.len()))
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("merge".into())
                    .spawn_scoped(scope, work)
                    .ok()
            })
            .collect();
        work();
        for helper in helpers {
            if let Err(panic) = helper.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    let mut out = Vec::with_capacity(len);
    for m in mapped {
        out.extend(m.into_inner().unwrap_or_else(PoisonError::into_inner));
    }
    out
}

/// A service merged up to its slice names, which are still the candidates.
struct Unnamed {
    statuses: Vec<ExportStatus>,
    merged: Option<(ImportRecord, Vec<ImportedSlice>, Vec<RefusedEndpoint>)>,
}

impl MergeState {
    /// Merges the services of `batch` in order. `strict` (an update): contention is an error
    /// instead of being resolved in order.
    ///
    /// Everything but the two shared things (ClusterSet IPs and slice names) is a function of
    /// one service, so the services are merged in any order (on every core for a large batch),
    /// and then the IPs and names are handed out one service at a time, in batch order.
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
            held,
            ip_owners,
            starved,
            names,
            port_lists,
            parallel_from,
            threads,
            ..
        } = self;
        let threads = if batch.len() >= *parallel_from {
            threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        } else {
            1
        };
        let (local_families, policy, port_lists, withdrawn, grace) = (
            &*local_families,
            &*policy,
            &*port_lists,
            &*withdrawn,
            *grace,
        );
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
        let validated: Vec<(Vec<ExportStatus>, Vec<exports::Export<'_>>)> =
            map_in_order(inputs.iter().collect(), threads, |(service, members)| {
                validate_members(service, members)
            });
        let (mut statuses, valid): (Vec<_>, Vec<_>) = validated.into_iter().unzip();
        let drafts: Vec<Option<Draft<'_>>> = map_in_order(
            inputs.iter().zip(&valid).zip(&mut statuses).collect(),
            threads,
            |(((service, _), exports), statuses)| {
                draft(service, exports, statuses, config, local_families)
            },
        );

        // Held imports: one whose service the members make nothing of keeps its IPs from
        // everyone else (a service they make something of asks for its IPs as any other).
        // Two held imports with one address (imports that were wrong already): the first in
        // order keeps it, the other is not held.
        for (draft, service) in drafts.iter().zip(batch) {
            let Some(import) = held.get(service) else {
                continue;
            };
            if draft.is_some() {
                continue;
            }
            let taken = |ip: &IpAddr| ip_owners.get(ip).is_some_and(|o| o != service);
            if import.ips.iter().any(taken) {
                held.remove(service);
            } else {
                for ip in &import.ips {
                    ip_owners.insert(*ip, service.clone());
                }
            }
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

        let unnamed: Vec<Unnamed> = map_in_order(
            statuses.into_iter().zip(drafts).collect(),
            threads,
            |(statuses, draft)| {
                let Some(d) = draft else {
                    return Unnamed {
                        statuses,
                        merged: None,
                    };
                };
                let mut ready = if d.families.supported {
                    conditions::import_ready()
                } else {
                    conditions::import_family_not_supported(&d.families.import, local_families)
                };
                let mut ips_out = Vec::new();
                if d.needs_ips() {
                    match allocation.ips.get(d.service) {
                        Some(ips) => ips_out = ips.clone(),
                        None => ready = conditions::import_no_ip(&d.families.import),
                    }
                }
                let mut slices = Vec::new();
                let mut refused = Vec::new();
                if d.families.supported {
                    slices::build(
                        &d.contributing,
                        d.service,
                        &d.ports.merged,
                        &d.families.import,
                        policy,
                        port_lists,
                        &mut slices,
                        &mut refused,
                    );
                }
                refused.sort();
                let mut statuses = statuses;
                refused_conditions(&mut statuses, &refused);
                let mut import = d.import(ips_out, ready);
                withdrawn_note(&mut import, withdrawn, grace);
                Unnamed {
                    statuses,
                    merged: Some((import, slices, refused)),
                }
            },
        );

        // The shared things, in batch order: the import's IPs, then its slices' names.
        let claim_batch = strict.then_some(batch);
        let mut named = Vec::with_capacity(unnamed.len());
        for (service, mut u) in batch.iter().zip(unnamed) {
            if let Some((import, slices, _)) = &mut u.merged {
                for ip in &import.ips {
                    ip_owners.insert(*ip, service.clone());
                }
                // A held service keeps the merge's last import (and its IPs) to fall back on
                // while the hold lasts.
                if let Some(kept) = held.get_mut(service) {
                    kept.clone_from(import);
                }
                for slice in slices {
                    slice.name = names.claim(
                        &service.namespace,
                        &slice.name,
                        &|| slices::salt(service, &slice.cluster),
                        service,
                        claim_batch,
                    )?;
                }
            }
            named.push((service, u));
        }

        let held = &*held;
        Ok(map_in_order(named, threads, |(service, u)| {
            let output = match u.merged {
                Some((import, slices, refused)) => {
                    // Not an in-place collect: that would keep the records' buffer, 12 times
                    // the size.
                    let mut shared = Vec::with_capacity(slices.len());
                    shared.extend(slices.into_iter().map(record_input));
                    Some(ServiceOutput {
                        import: Some(record_input(import)),
                        slices: shared,
                        statuses: u.statuses,
                        refused,
                    })
                }
                None => match held.get(service) {
                    Some(import) => Some(held_output(import, u.statuses, withdrawn, grace)),
                    None => (!u.statuses.is_empty()).then(|| ServiceOutput {
                        statuses: u.statuses,
                        ..Default::default()
                    }),
                },
            };
            (service.clone(), output)
        }))
    }
}

/// A service's members' exports that are valid, by precedence, and the statuses of those
/// that are not.
fn validate_members<'a>(
    service: &NamespacedName,
    members: &[MemberInputs<'a>],
) -> (Vec<ExportStatus>, Vec<exports::Export<'a>>) {
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
                service: service.clone(),
                conditions: conditions::invalid_export(&reason, &message),
            }),
        }
    }
    ok.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
    (out, ok)
}

/// The merge steps of one service with valid `exports` (none: `None`), whose statuses are
/// added to `statuses`.
fn draft<'a>(
    service: &'a NamespacedName,
    exports: &'a [exports::Export<'a>],
    statuses: &mut Vec<ExportStatus>,
    config: &ClusterSetConfig,
    local_families: &[IpFamily],
) -> Option<Draft<'a>> {
    if exports.is_empty() {
        return None;
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
            service: service.clone(),
            conditions: shared.clone(),
        });
    }
    statuses.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    Some(Draft {
        service,
        contributing,
        families: fams,
        ports,
        props,
    })
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
pub(super) fn withdrawn_note(
    import: &mut ImportRecord,
    withdrawn: &BTreeSet<ClusterId>,
    grace: Duration,
) {
    let Some(status) = import.status.as_mut() else {
        return;
    };
    // A held import's message may carry an earlier note: replaced (or dropped), not repeated.
    for c in status.conditions.iter_mut().filter(|c| c.type_ == "Ready") {
        if let Some(at) = c.message.find(WITHDRAWN_NOTE) {
            c.message.truncate(at);
        }
    }
    if withdrawn.is_empty() {
        return;
    }
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
            "{}{WITHDRAWN_NOTE}{} are withdrawn: its API server has been unreachable \
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
