//! The lb table kept up to date service by service.
//!
//! [`build`](super::build) is a function of every import and slice, but almost all of it is
//! local to one service (namespace, name): its imports, its slices (label
//! `multicluster.kubernetes.io/service-name`), its frontends and its warnings. Services meet in
//! one place only: imports are taken in sorted order and a ClusterSet IP goes to the first one
//! that lists it. So the part of the table of a set R of services can be built alone
//! ([`build_services`]) and spliced into the table, with the same result as a full build,
//! whenever no service outside R lists an IP that a service in R lists (or listed before the
//! change).
//!
//! [`LbState::update`] makes R so: it starts from the changed services, adds every service
//! that lists an IP a changed service listed before (it may get that VIP now), and then, until
//! nothing is added, every service that lists an IP a service in R lists. In the usual case
//! every IP has one claimant and R is just the changed services, so an update costs the size
//! of the change; a contested VIP pulls in exactly the services that contend for it (and what
//! those contend for in turn), which are rebuilt together in sorted order, as the full build
//! does. A full build is the same update with every service changed.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use foldhash::HashMap;

use super::{
    Frontend, FrontendAddr, LbTable, LbWarning, Protocol, build_import, by_cluster, warnings_of,
};
use crate::model::{
    NamespacedName,
    records::{Converted, ImportRecord, ImportedSlice, PortProtocol},
};
use crate::policy::{AddressPolicy, AddressUse, Refusal};

/// One service's inputs: the ServiceImports with its namespace/name (one, unless a directory
/// defines it twice) and the imported EndpointSlices labelled with its name in its namespace,
/// as converted records with the warnings of their conversion.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServiceInputs<'a> {
    /// The imports of the service.
    pub imports: &'a [Arc<Converted<ImportRecord>>],
    /// The imported slices of the service.
    pub slices: &'a [Arc<Converted<ImportedSlice>>],
}

/// The part of the table one service makes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServicePart {
    /// The ClusterSet IPs it owns.
    pub vips: Vec<IpAddr>,
    /// Its frontends, all on those VIPs.
    pub frontends: Vec<(FrontendAddr, Frontend)>,
    /// The warnings about its imports and slices, sorted, without duplicates.
    pub warnings: Vec<LbWarning>,
    /// The addresses its inputs list that the policy refused, one entry per address.
    pub refused: Vec<(AddressUse, Refusal)>,
}

/// One import per namespace/name: of several with one namespace/name (a directory may define
/// one twice) the one whose object JSON is smallest is used and the duplicate reported, so the
/// choice does not depend on the input order.
fn unique_import<'a>(
    imports: &'a [Arc<Converted<ImportRecord>>],
    warnings: &mut Vec<LbWarning>,
) -> Option<&'a ImportRecord> {
    let mut records = imports.iter().filter_map(|c| c.record());
    let first = records.next()?;
    let rest: Vec<&ImportRecord> = records.collect();
    if rest.is_empty() {
        return Some(first);
    }
    warnings.push(LbWarning {
        object: format!("ServiceImport {}", first.service),
        message: crate::merge::DUPLICATE.into(),
    });
    let json = |r: &ImportRecord| serde_json::to_string(&r.to_k8s()).unwrap_or_default();
    std::iter::once(first).chain(rest).min_by_key(|r| json(r))
}

/// Builds the parts of `services` as [`build`](super::build) would if they were the only
/// services: in sorted order, a VIP going to the first service that lists it. That is their
/// part of the full table whenever no other service lists one of their IPs.
pub fn build_services<'a, 'n>(
    services: impl IntoIterator<Item = (&'n NamespacedName, ServiceInputs<'a>)>,
    policy: &AddressPolicy,
) -> Vec<(&'n NamespacedName, ServicePart)> {
    let mut services: Vec<_> = services.into_iter().collect();
    services.sort_unstable_by(|a, b| a.0.cmp(b.0));
    services.dedup_by(|a, b| a.0 == b.0);
    let mut builder = PartBuilder::default();
    services
        .into_iter()
        .map(|(service, inputs)| (service, builder.build(inputs, policy)))
        .collect()
}

/// Builds services' parts one at a time, in sorted order: a VIP goes to the first service
/// that lists it.
#[derive(Default)]
struct PartBuilder {
    claimed: BTreeMap<IpAddr, NamespacedName>,
}

impl PartBuilder {
    fn build(&mut self, inputs: ServiceInputs<'_>, policy: &AddressPolicy) -> ServicePart {
        let mut part = ServicePart::default();
        // The backends the policy refuses, checked once per endpoint here rather than once per
        // endpoint and port below; nearly always none.
        let mut refused_backends = Vec::new();
        for c in inputs.imports {
            part.warnings.extend(warnings_of(c, "ServiceImport"));
        }
        for c in inputs.slices {
            part.warnings.extend(warnings_of(c, "EndpointSlice"));
            if let Some(slice) = c.record() {
                for ep in slice.endpoints.list() {
                    if let Err(why) = policy.check_backend(&slice.cluster, ep.addr) {
                        refused_backends.push((slice.cluster.clone(), ep.addr));
                        part.refused.push((AddressUse::Backend, why));
                        part.warnings.push(LbWarning {
                            object: format!("EndpointSlice {}", c.id()),
                            message: format!(
                                "endpoint {} of cluster {} is {why}; not programmed",
                                ep.addr, slice.cluster
                            ),
                        });
                    }
                }
            }
            for p in c.record().iter().flat_map(|s| s.ports.iter()) {
                if p.protocol == PortProtocol::Sctp {
                    part.warnings.push(LbWarning {
                        object: format!("EndpointSlice {}", c.id()),
                        message: format!(
                            "port {:?}: protocol SCTP is not load-balanced at socket level",
                            &*p.name
                        ),
                    });
                }
            }
        }
        let slices = by_cluster(inputs.slices.iter().filter_map(|c| c.record()));
        if let Some(si) = unique_import(inputs.imports, &mut part.warnings) {
            let vips = build_import(
                si,
                &slices,
                policy,
                &refused_backends,
                &mut part.refused,
                &mut self.claimed,
                &mut part.warnings,
                &mut Vec::new(),
                |addr, fe| part.frontends.push((addr, fe)),
            );
            part.vips.extend(vips.into_iter().map(|(_, ip)| ip));
        }
        part.warnings.sort();
        part.warnings.dedup();
        part
    }
}

/// What the state remembers of one service.
#[derive(Clone, Debug, Default)]
struct ServiceState {
    /// The VIPs it owns in the table.
    vips: Box<[IpAddr]>,
    /// Every IP its imports list (sorted, unique), owned or not: the services that share one
    /// are rebuilt together.
    listed: Box<[IpAddr]>,
    /// Few services have any: one pointer for the others (a state per service at 10,000
    /// services).
    problems: Option<Box<Problems>>,
}

/// A service's warnings and refused addresses, as its last part had them.
#[derive(Clone, Debug, Default)]
struct Problems {
    warnings: Vec<LbWarning>,
    refused: Vec<(AddressUse, Refusal)>,
}

impl ServiceState {
    fn warnings(&self) -> &[LbWarning] {
        self.problems.as_ref().map_or(&[], |p| &p.warnings)
    }

    fn refused(&self) -> &[(AddressUse, Refusal)] {
        self.problems.as_ref().map_or(&[], |p| &p.refused)
    }
}

/// The VIPs `service` owns in the table, as `services` remembers them.
fn vips_of<'m>(
    services: &'m HashMap<NamespacedName, ServiceState>,
    service: &NamespacedName,
) -> &'m [IpAddr] {
    services.get(service).map(|s| &s.vips[..]).unwrap_or(&[])
}

/// Every IP the imports list, sorted, unique.
fn listed_ips(imports: &[Arc<Converted<ImportRecord>>]) -> Box<[IpAddr]> {
    let mut ips: Vec<IpAddr> = imports
        .iter()
        .filter_map(|c| c.record())
        .flat_map(|si| si.ips.iter().copied())
        .collect();
    ips.sort_unstable();
    ips.dedup();
    ips.into_boxed_slice()
}

/// An lb table maintained by service: [`LbState::update`] rebuilds the services that changed
/// (and those they contend with for a ClusterSet IP) and splices them in. The table is always
/// the one [`build`](super::build) makes from the same inputs (property-tested in
/// `lb/tests.rs`), except that slices without a service-name label have no service and so no
/// warning here.
#[derive(Clone, Debug, Default)]
pub struct LbState {
    table: LbTable,
    services: HashMap<NamespacedName, ServiceState>,
    /// IP → the services whose imports list it.
    listing: HashMap<IpAddr, Vec<NamespacedName>>,
    /// What may be programmed.
    policy: Arc<AddressPolicy>,
    /// How many addresses the policy refuses now, by use and reason.
    refused: BTreeMap<(AddressUse, Refusal), usize>,
    /// Kept by [`LbState::update_parts`]: the table has no frontends.
    parts_only: bool,
}

impl LbState {
    /// An empty state that programs only what `policy` allows.
    pub fn new(policy: Arc<AddressPolicy>) -> Self {
        LbState {
            policy,
            ..LbState::default()
        }
    }

    /// How many addresses listed by the inputs the policy refuses, by use and reason.
    pub fn refused(&self) -> &BTreeMap<(AddressUse, Refusal), usize> {
        &self.refused
    }

    /// The whole table: its VIPs and warnings, and its frontends when the state is kept by
    /// [`update`](Self::update) (none with [`update_parts`](Self::update_parts)).
    pub fn table(&self) -> &LbTable {
        &self.table
    }

    /// The whole table, by value.
    pub fn into_table(self) -> LbTable {
        self.table
    }

    /// The warnings about one service's imports and slices.
    pub fn warnings_of(&self, service: &NamespacedName) -> &[LbWarning] {
        self.services
            .get(service)
            .map(ServiceState::warnings)
            .unwrap_or(&[])
    }

    /// Brings the table up to date after the inputs of `changed` changed (were added, edited or
    /// removed); `inputs` gives any service's current inputs (empty for a service that is
    /// gone). Returns the services that were rebuilt: their entries in the table may differ
    /// (the map sync needs to look at these and no others).
    pub fn update<'a, 'n>(
        &mut self,
        changed: impl IntoIterator<Item = &'n NamespacedName>,
        inputs: impl Fn(&NamespacedName) -> ServiceInputs<'a>,
    ) -> BTreeSet<NamespacedName> {
        let mut rebuild = self.rebuild_set(changed, &inputs);
        if std::mem::take(&mut self.parts_only) {
            // Kept by update_parts until now: the table has no frontends, so every service
            // that owns a VIP is built again.
            rebuild.extend(self.services.keys().cloned());
        }
        // Every old entry of the rebuilt services goes before any new one comes in (a VIP may
        // move from one of them to another).
        for service in &rebuild {
            for ip in vips_of(&self.services, service) {
                let lo = FrontendAddr {
                    ip: *ip,
                    port: 0,
                    protocol: Protocol::Tcp,
                };
                let hi = FrontendAddr {
                    ip: *ip,
                    port: u16::MAX,
                    protocol: Protocol::Udp,
                };
                let gone: Vec<FrontendAddr> = self
                    .table
                    .frontends
                    .range(lo..=hi)
                    .map(|(a, _)| *a)
                    .collect();
                for addr in gone {
                    self.table.frontends.remove(&addr);
                }
            }
        }
        let parts: Vec<_> = Parts::new(self, rebuild.iter().cloned().collect(), inputs).collect();
        for (_, part) in parts {
            self.table.frontends.extend(part.frontends);
        }
        rebuild
    }

    /// [`update`](Self::update) for a state that keeps no frontends: the rebuilt services'
    /// parts are handed out one at a time, sorted by service (a service that is gone with an
    /// empty part), each built as it is taken, and the table keeps only its VIPs and warnings.
    /// The node uses this: the map writer keeps a digest of what it wrote, so no backend needs
    /// to stay once written, and a full sync never holds the whole table. Parts not taken are
    /// built and filed when the iterator is dropped. The first call drops the frontends an
    /// [`update`](Self::update) kept.
    pub fn update_parts<'s, 'a, 'n, F>(
        &'s mut self,
        changed: impl IntoIterator<Item = &'n NamespacedName>,
        inputs: F,
    ) -> Parts<'s, 'a, F>
    where
        F: Fn(&NamespacedName) -> ServiceInputs<'a>,
    {
        if !self.parts_only {
            self.parts_only = true;
            self.table.frontends.clear();
        }
        let rebuild = self.rebuild_set(changed, &inputs);
        Parts::new(self, rebuild.into_iter().collect(), inputs)
    }

    /// The services to rebuild after `changed` changed: those, every service that lists an
    /// IP a changed service listed before (it may get that VIP now), and then everything that
    /// shares a listed IP with what is rebuilt.
    fn rebuild_set<'a, 'n>(
        &mut self,
        changed: impl IntoIterator<Item = &'n NamespacedName>,
        inputs: &impl Fn(&NamespacedName) -> ServiceInputs<'a>,
    ) -> BTreeSet<NamespacedName> {
        let changed: BTreeSet<&NamespacedName> = changed.into_iter().collect();
        let mut rebuild: BTreeSet<NamespacedName> = changed.iter().map(|s| (*s).clone()).collect();
        let mut queue: Vec<NamespacedName> = rebuild.iter().cloned().collect();

        // What the changed services list now; the IPs they stopped listing may go to others.
        let mut released: Vec<IpAddr> = Vec::new();
        for service in &changed {
            let now = listed_ips(inputs(service).imports);
            let state = self.services.entry((*service).clone()).or_default();
            if state.listed == now {
                continue;
            }
            let old = std::mem::replace(&mut state.listed, now);
            for ip in &old {
                if let Some(list) = self.listing.get_mut(ip) {
                    list.retain(|s| s != *service);
                    if list.is_empty() {
                        self.listing.remove(ip);
                    }
                }
            }
            for ip in &state.listed {
                self.listing
                    .entry(*ip)
                    .or_default()
                    .push((*service).clone());
            }
            released.extend(old);
        }
        for ip in &released {
            for other in self.listing.get(ip).into_iter().flatten() {
                if rebuild.insert(other.clone()) {
                    queue.push(other.clone());
                }
            }
        }
        while let Some(service) = queue.pop() {
            let Some(state) = self.services.get(&service) else {
                continue;
            };
            for ip in &state.listed {
                for other in self.listing.get(ip).into_iter().flatten() {
                    if rebuild.insert(other.clone()) {
                        queue.push(other.clone());
                    }
                }
            }
        }
        rebuild
    }
}

/// The parts of the services an update rebuilds ([`LbState::update_parts`]), each built and
/// filed in the state as it is taken.
pub struct Parts<'s, 'a, F>
where
    F: Fn(&NamespacedName) -> ServiceInputs<'a>,
{
    state: &'s mut LbState,
    /// Sorted.
    services: Vec<NamespacedName>,
    /// How many of `services` were taken.
    taken: usize,
    inputs: F,
    builder: PartBuilder,
    warnings_changed: bool,
}

impl<'s, 'a, F> Parts<'s, 'a, F>
where
    F: Fn(&NamespacedName) -> ServiceInputs<'a>,
{
    fn new(state: &'s mut LbState, rebuild: Vec<NamespacedName>, inputs: F) -> Self {
        // Every old VIP of the rebuilt services goes before any new one comes in.
        for service in &rebuild {
            for ip in vips_of(&state.services, service) {
                state.table.vips.remove(ip);
            }
        }
        Parts {
            state,
            services: rebuild,
            taken: 0,
            inputs,
            builder: PartBuilder::default(),
            warnings_changed: false,
        }
    }

    /// Every service the update rebuilds, sorted.
    pub fn services(&self) -> &[NamespacedName] {
        &self.services
    }

    /// Files a service's new part: its VIPs, warnings and refusals.
    fn file(&mut self, service: &NamespacedName, part: &ServicePart) {
        let state = &mut *self.state;
        for ip in &part.vips {
            state.table.vips.insert(*ip, service.clone());
        }
        let kept = state.services.entry(service.clone()).or_default();
        self.warnings_changed |= kept.warnings() != part.warnings.as_slice();
        // Replaced only when they differ: a rebuilt service nearly always keeps its VIPs and
        // has no problems.
        if *kept.vips != *part.vips {
            kept.vips = part.vips.as_slice().into();
        }
        for key in kept.refused() {
            if let Some(n) = state.refused.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    state.refused.remove(key);
                }
            }
        }
        for key in &part.refused {
            *state.refused.entry(*key).or_default() += 1;
        }
        if kept.warnings() != part.warnings.as_slice() || kept.refused() != part.refused.as_slice()
        {
            kept.problems = (!part.warnings.is_empty() || !part.refused.is_empty()).then(|| {
                Box::new(Problems {
                    warnings: part.warnings.clone(),
                    refused: part.refused.clone(),
                })
            });
        }
        if kept.vips.is_empty() && kept.listed.is_empty() && kept.problems.is_none() {
            state.services.remove(service);
        }
    }
}

impl<'a, F> Iterator for Parts<'_, 'a, F>
where
    F: Fn(&NamespacedName) -> ServiceInputs<'a>,
{
    type Item = (NamespacedName, ServicePart);

    fn next(&mut self) -> Option<Self::Item> {
        let Some(service) = self.services.get(self.taken).cloned() else {
            if std::mem::take(&mut self.warnings_changed) {
                let mut all: Vec<LbWarning> = self
                    .state
                    .services
                    .values()
                    .flat_map(|s| s.warnings().iter().cloned())
                    .collect();
                all.sort();
                all.dedup();
                self.state.table.warnings = all;
            }
            return None;
        };
        let part = self
            .builder
            .build((self.inputs)(&service), &self.state.policy);
        self.taken += 1;
        self.file(&service, &part);
        Some((service, part))
    }
}

impl<'a, F> Drop for Parts<'_, 'a, F>
where
    F: Fn(&NamespacedName) -> ServiceInputs<'a>,
{
    fn drop(&mut self) {
        // The state must hold every rebuilt service, taken or not.
        for _ in self.by_ref() {}
    }
}
