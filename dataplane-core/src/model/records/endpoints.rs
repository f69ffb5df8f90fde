//! A slice's endpoints in compact form: an endpoint's conditions in one byte, IPv4 endpoints in
//! 5 bytes, and the rare extras (more addresses, hostname, zone) in a side table.

use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::{Endpoint as K8sEndpoint, EndpointConditions};

use crate::model::name::Name;

/// An endpoint's `ready`, `serving` and `terminating`, each unset, false or true, in one byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Conditions(u8);

impl Conditions {
    /// Packs the three optional conditions of the API.
    pub fn new(ready: Option<bool>, serving: Option<bool>, terminating: Option<bool>) -> Self {
        let code = |v: Option<bool>| match v {
            None => 0u8,
            Some(false) => 1,
            Some(true) => 2,
        };
        Conditions(code(ready) | code(serving) << 2 | code(terminating) << 4)
    }

    fn get(self, shift: u8) -> Option<bool> {
        match (self.0 >> shift) & 3 {
            1 => Some(false),
            2 => Some(true),
            _ => None,
        }
    }

    /// `ready` as the API has it.
    pub fn ready(self) -> Option<bool> {
        self.get(0)
    }

    /// `serving` as the API has it.
    pub fn serving(self) -> Option<bool> {
        self.get(2)
    }

    /// `terminating` as the API has it.
    pub fn terminating(self) -> Option<bool> {
        self.get(4)
    }

    /// Whether no condition is set (the API's `conditions` is then absent or empty).
    pub fn is_unset(self) -> bool {
        self.0 == 0
    }

    /// Whether the endpoint takes new connections (a nil `ready` means ready).
    pub fn is_ready(self) -> bool {
        self.ready().unwrap_or(true)
    }

    /// Whether it is serving while terminating: kube-proxy's fallback when no endpoint of a
    /// frontend is ready (a nil `serving` means `ready`).
    pub fn is_serving_terminating(self) -> bool {
        self.serving().unwrap_or(self.is_ready()) && self.terminating().unwrap_or(false)
    }

    pub(super) fn of(c: Option<&EndpointConditions>) -> Self {
        c.map(|c| Conditions::new(c.ready, c.serving, c.terminating))
            .unwrap_or_default()
    }

    pub(super) fn to_k8s(self) -> Option<EndpointConditions> {
        (!self.is_unset()).then(|| EndpointConditions {
            ready: self.ready(),
            serving: self.serving(),
            terminating: self.terminating(),
        })
    }
}

/// One endpoint: its first address (the one clients are sent to) and its conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// The endpoint's address.
    pub addr: IpAddr,
    /// Its `ready`, `serving` and `terminating`.
    pub conditions: Conditions,
}

/// The parts of an endpoint that few endpoints have.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointExtra {
    /// Addresses after the first one (the API allows up to 100; they are fungible).
    pub more_addresses: Box<[IpAddr]>,
    /// The endpoint's hostname, which headless DNS answers use.
    pub hostname: Option<Name>,
    /// The endpoint's zone.
    pub zone: Option<Name>,
}

impl EndpointExtra {
    fn is_empty(&self) -> bool {
        self.more_addresses.is_empty() && self.hostname.is_none() && self.zone.is_none()
    }
}

/// One endpoint with its extras, as [`Endpoints::iter`] yields it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointRef<'a> {
    /// The address and conditions.
    pub endpoint: Endpoint,
    /// More addresses, hostname and zone, when it has any.
    pub extra: Option<&'a EndpointExtra>,
}

impl EndpointRef<'_> {
    /// Every address of the endpoint, the first one first.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        std::iter::once(self.endpoint.addr).chain(
            self.extra
                .into_iter()
                .flat_map(|e| e.more_addresses.iter().copied()),
        )
    }

    /// The hostname, when the endpoint has one.
    pub fn hostname(&self) -> Option<&str> {
        self.extra.and_then(|e| e.hostname.as_deref())
    }
}

/// An IPv4 endpoint as [`Endpoints`] stores it: 5 bytes instead of [`Endpoint`]'s 18.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Ipv4Endpoint([u8; 4], Conditions);

impl Ipv4Endpoint {
    fn widen(&self) -> Endpoint {
        Endpoint {
            addr: IpAddr::from(self.0),
            conditions: self.1,
        }
    }
}

/// The endpoints' addresses and conditions. Nearly every slice holds one family, and IPv4
/// ones are most of a cluster set's endpoints: they are stored in a third of the room.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum EndpointList {
    /// Every address is IPv4.
    Ipv4(Box<[Ipv4Endpoint]>),
    /// Any addresses.
    Any(Box<[Endpoint]>),
}

impl Default for EndpointList {
    /// What [`EndpointList::new`] makes of no endpoints, so that equal lists compare equal.
    fn default() -> Self {
        EndpointList::Ipv4(Box::default())
    }
}

impl EndpointList {
    fn new(list: Vec<Endpoint>) -> Self {
        let ipv4: Option<Box<[Ipv4Endpoint]>> = list
            .iter()
            .map(|e| match e.addr {
                IpAddr::V4(a) => Some(Ipv4Endpoint(a.octets(), e.conditions)),
                IpAddr::V6(_) => None,
            })
            .collect();
        match ipv4 {
            Some(ipv4) => EndpointList::Ipv4(ipv4),
            None => EndpointList::Any(list.into_boxed_slice()),
        }
    }

    fn iter(&self) -> EndpointIter<'_> {
        match self {
            EndpointList::Ipv4(l) => EndpointIter(EndpointIterInner::Ipv4(l.iter())),
            EndpointList::Any(l) => EndpointIter(EndpointIterInner::Any(l.iter())),
        }
    }
}

/// The endpoints of a slice, as [`Endpoints::list`] yields them.
#[derive(Clone, Debug)]
pub struct EndpointIter<'a>(EndpointIterInner<'a>);

#[derive(Clone, Debug)]
enum EndpointIterInner<'a> {
    Ipv4(std::slice::Iter<'a, Ipv4Endpoint>),
    Any(std::slice::Iter<'a, Endpoint>),
}

impl Iterator for EndpointIter<'_> {
    type Item = Endpoint;

    fn next(&mut self) -> Option<Endpoint> {
        match &mut self.0 {
            EndpointIterInner::Ipv4(i) => i.next().map(Ipv4Endpoint::widen),
            EndpointIterInner::Any(i) => i.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            EndpointIterInner::Ipv4(i) => i.size_hint(),
            EndpointIterInner::Any(i) => i.size_hint(),
        }
    }
}

impl ExactSizeIterator for EndpointIter<'_> {}

/// The endpoints of a slice, in a stable order, with the extras of the few endpoints that have
/// any in a side table (by index).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Endpoints {
    list: EndpointList,
    /// Sorted by index.
    extras: Box<[(u32, EndpointExtra)]>,
}

impl Endpoints {
    /// Collects endpoints (with their extras) in the order given.
    pub fn new(endpoints: impl IntoIterator<Item = (Endpoint, Option<EndpointExtra>)>) -> Self {
        let mut list = Vec::new();
        let mut extras = Vec::new();
        for (i, (endpoint, extra)) in endpoints.into_iter().enumerate() {
            list.push(endpoint);
            if let Some(extra) = extra.filter(|e| !e.is_empty()) {
                extras.push((u32::try_from(i).unwrap_or(u32::MAX), extra));
            }
        }
        Endpoints {
            list: EndpointList::new(list),
            extras: extras.into_boxed_slice(),
        }
    }

    /// Sorts and deduplicates endpoints (by address, extras, then conditions), so the result
    /// does not depend on the order they came in.
    pub fn sorted(endpoints: impl IntoIterator<Item = (Endpoint, Option<EndpointExtra>)>) -> Self {
        let mut all: Vec<(Endpoint, Option<EndpointExtra>)> = endpoints
            .into_iter()
            .map(|(e, x)| (e, x.filter(|x| !x.is_empty())))
            .collect();
        all.sort_unstable_by(|a, b| {
            (a.0.addr, &a.1, a.0.conditions).cmp(&(b.0.addr, &b.1, b.0.conditions))
        });
        all.dedup();
        Self::new(all)
    }

    /// The endpoints' addresses and conditions, without the extras, in order.
    pub fn list(&self) -> EndpointIter<'_> {
        self.list.iter()
    }

    /// Every endpoint with its extras, in order.
    pub fn iter(&self) -> impl Iterator<Item = EndpointRef<'_>> + '_ {
        let mut extras = self.extras.iter().peekable();
        self.list().enumerate().map(move |(i, endpoint)| {
            let extra = extras
                .next_if(|(at, _)| *at as usize == i)
                .map(|(_, extra)| extra);
            EndpointRef { endpoint, extra }
        })
    }

    /// How many endpoints there are.
    pub fn len(&self) -> usize {
        self.list().len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.list().len() == 0
    }

    /// Whether any endpoint is ready.
    pub fn any_ready(&self) -> bool {
        self.list().any(|e| e.conditions.is_ready())
    }

    /// The endpoints as the API has them.
    pub fn to_k8s(&self) -> Vec<K8sEndpoint> {
        self.iter()
            .map(|e| K8sEndpoint {
                addresses: e.addresses().map(|a| a.to_string()).collect(),
                conditions: e.endpoint.conditions.to_k8s(),
                hostname: e.hostname().map(str::to_owned),
                zone: e.extra.and_then(|x| x.zone.as_deref()).map(str::to_owned),
                ..Default::default()
            })
            .collect()
    }
}
