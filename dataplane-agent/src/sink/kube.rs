//! Kubernetes writers: the controller's [`Action`]s (decided by
//! [`dataplane_core::reconcile`]) as API requests into the local cluster.
//!
//! Every write is a server-side apply with one field manager ([`FIELD_MANAGER`]) and `force`
//! (the controller is the only writer of these fields, and takes them back from a hand edit):
//!
//! | action | request |
//! |---|---|
//! | [`Action::ApplyImport`] | `PATCH .../serviceimports/NAME` (metadata labels/annotations and spec) |
//! | [`Action::ApplyImportStatus`] | `PATCH .../serviceimports/NAME/status` (clusters, conditions) |
//! | [`Action::ApplySlice`] | `PATCH /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices/NAME` |
//! | [`Action::ApplyExportStatus`] | `PATCH .../serviceexports/NAME/status` (`Valid`, `Ready`, `Conflict`, `EndpointsRefused`) |
//! | [`Action::DeleteImport`], [`Action::DeleteSlice`] | `DELETE`, with the observed uid as a precondition |
//! | [`Action::Event`] | an `events.k8s.io/v1` Event on the ServiceExport (kube's `Recorder`) |

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use serde_json::{Value, json};

use dataplane_core::{
    model::{
        API_VERSION_V1BETA1, Condition, EndpointSlice, FIELD_MANAGER, NamespacedName,
        ServiceExport, ServiceImport, resource_version,
    },
    reconcile::Action,
};

/// What a successful write returned: the object as the server stored it, or what was deleted.
#[derive(Clone, Debug)]
pub enum Written {
    Import(ServiceImport),
    Slice(EndpointSlice),
    Export(ServiceExport),
    /// The object is gone (or going); `resource_version` is at least the one of the deletion.
    DeletedImport {
        service: NamespacedName,
        resource_version: u64,
    },
    DeletedSlice {
        slice: NamespacedName,
        resource_version: u64,
    },
    Event,
}

#[derive(Debug, thiserror::Error)]
#[error("{kind} {object}: {op} failed: {source}")]
pub struct WriteError {
    pub kind: &'static str,
    pub op: &'static str,
    pub object: String,
    #[source]
    pub source: kube::Error,
}

/// The apply body of a ServiceImport's metadata and spec.
pub fn import_body(si: &ServiceImport) -> Value {
    let mut metadata = json!({
        "name": si.metadata.name,
        "namespace": si.metadata.namespace,
    });
    if let Some(labels) = &si.metadata.labels {
        metadata["labels"] = json!(labels);
    }
    if let Some(annotations) = &si.metadata.annotations {
        metadata["annotations"] = json!(annotations);
    }
    json!({
        "apiVersion": API_VERSION_V1BETA1,
        "kind": "ServiceImport",
        "metadata": metadata,
        "spec": si.spec,
    })
}

/// The apply body of a ServiceImport's status.
pub fn import_status_body(si: &ServiceImport) -> Value {
    json!({
        "apiVersion": API_VERSION_V1BETA1,
        "kind": "ServiceImport",
        "metadata": {"name": si.metadata.name, "namespace": si.metadata.namespace},
        "status": si.status.clone().unwrap_or_default(),
    })
}

/// The apply body of an imported EndpointSlice.
pub fn slice_body(s: &EndpointSlice) -> Value {
    let mut body = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": s.metadata.name,
            "namespace": s.metadata.namespace,
            "labels": s.metadata.labels,
        },
        "addressType": s.address_type,
        "endpoints": s.endpoints,
    });
    if let Some(ports) = &s.ports {
        body["ports"] = json!(ports);
    }
    body
}

/// The apply body of a ServiceExport's conditions.
pub fn export_status_body(service: &NamespacedName, conditions: &[Condition]) -> Value {
    json!({
        "apiVersion": API_VERSION_V1BETA1,
        "kind": "ServiceExport",
        "metadata": {"name": service.name, "namespace": service.namespace},
        "status": {"conditions": conditions},
    })
}

/// Writes into one (the local) cluster.
pub struct KubeSink {
    client: Client,
    params: PatchParams,
    recorder: Recorder,
}

impl KubeSink {
    /// `instance` names this agent in the Events it emits (the pod name).
    pub fn new(client: Client, instance: &str) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.to_owned(),
                instance: Some(instance.to_owned()),
            },
        );
        KubeSink {
            client,
            params: PatchParams::apply(FIELD_MANAGER).force(),
            recorder,
        }
    }

    fn namespaced<K>(&self, namespace: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Performs one action.
    pub async fn apply(&self, action: &Action) -> Result<Written, WriteError> {
        let (kind, op) = action.label();
        let fail = |source| WriteError {
            kind,
            op,
            object: action.object(),
            source,
        };
        let ns_name = |m: &dataplane_core::model::ObjectMeta| NamespacedName::of(m);
        match action {
            Action::ApplyImport(si) => {
                let id = ns_name(&si.metadata);
                let api: Api<ServiceImport> = self.namespaced(&id.namespace);
                api.patch(&id.name, &self.params, &Patch::Apply(import_body(si)))
                    .await
                    .map(Written::Import)
                    .map_err(fail)
            }
            Action::ApplyImportStatus(si) => {
                let id = ns_name(&si.metadata);
                let api: Api<ServiceImport> = self.namespaced(&id.namespace);
                api.patch_status(
                    &id.name,
                    &self.params,
                    &Patch::Apply(import_status_body(si)),
                )
                .await
                .map(Written::Import)
                .map_err(fail)
            }
            Action::ApplySlice(s) => {
                let id = ns_name(&s.metadata);
                let api: Api<EndpointSlice> = self.namespaced(&id.namespace);
                api.patch(&id.name, &self.params, &Patch::Apply(slice_body(s)))
                    .await
                    .map(Written::Slice)
                    .map_err(fail)
            }
            Action::ApplyExportStatus {
                service,
                conditions,
            } => {
                let api: Api<ServiceExport> = self.namespaced(&service.namespace);
                api.patch_status(
                    &service.name,
                    &self.params,
                    &Patch::Apply(export_status_body(service, conditions)),
                )
                .await
                .map(Written::Export)
                .map_err(fail)
            }
            Action::DeleteImport {
                service,
                uid,
                resource_version,
            } => {
                let api: Api<ServiceImport> = self.namespaced(&service.namespace);
                let rv = delete(&api, &service.name, uid.clone(), *resource_version)
                    .await
                    .map_err(fail)?;
                Ok(Written::DeletedImport {
                    service: service.clone(),
                    resource_version: rv,
                })
            }
            Action::DeleteSlice {
                slice,
                uid,
                resource_version,
                ..
            } => {
                let api: Api<EndpointSlice> = self.namespaced(&slice.namespace);
                let rv = delete(&api, &slice.name, uid.clone(), *resource_version)
                    .await
                    .map_err(fail)?;
                Ok(Written::DeletedSlice {
                    slice: slice.clone(),
                    resource_version: rv,
                })
            }
            Action::Event {
                export,
                uid,
                warning,
                reason,
                note,
            } => {
                let reference = ObjectReference {
                    api_version: Some(API_VERSION_V1BETA1.to_owned()),
                    kind: Some("ServiceExport".to_owned()),
                    name: Some(export.name.to_string()),
                    namespace: Some(export.namespace.to_string()),
                    uid: uid.clone(),
                    ..Default::default()
                };
                let event = Event {
                    type_: if *warning {
                        EventType::Warning
                    } else {
                        EventType::Normal
                    },
                    reason: reason.clone(),
                    note: Some(truncate(note, 1024)),
                    action: "Merge".to_owned(),
                    secondary: None,
                };
                self.recorder
                    .publish(&event, &reference)
                    .await
                    .map(|()| Written::Event)
                    .map_err(fail)
            }
        }
    }
}

/// Deletes `name` if its uid is still `uid`. A 404 counts as done. Returns a resourceVersion
/// at least as new as the deletion.
async fn delete<K>(
    api: &Api<K>,
    name: &str,
    uid: Option<String>,
    observed_rv: u64,
) -> Result<u64, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(either) => {
            let returned = either
                .left()
                .map(|o| resource_version(o.meta()))
                .unwrap_or(0);
            Ok(returned.max(observed_rv + 1))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(observed_rv + 1),
        Err(e) => Err(e),
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}
