//! The object store: objects as JSON, a global resourceVersion counter, the watch history,
//! server-managed metadata, patch algorithms and server-side-apply field ownership.
//!
//! Everything here is synchronous and runs under the server's state mutex; the HTTP layer
//! (`http.rs`) only parses requests and renders results.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    ops::Bound,
};

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::ResourceType;

/// A field path, as object keys from the root (lists are atomic leaves).
pub(crate) type Path = Vec<String>;

/// Which part of an object a request writes: the main resource or its `/status` subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    Main,
    Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Apply,
    Merge,
    Strategic,
    Json,
}

/// An API error, rendered as a `meta/v1 Status` with `status: Failure`.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Value,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: Value::Null,
        }
    }
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }
    fn for_object(
        code: u16,
        reason: &'static str,
        rt: &ResourceType,
        name: &str,
        msg: &str,
    ) -> Self {
        let mut e = Self::new(code, reason, format!("{} \"{name}\" {msg}", rt.qualified()));
        e.details = json!({"name": name, "group": rt.group, "kind": rt.plural});
        e
    }
    pub(crate) fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::for_object(404, "NotFound", rt, name, "not found")
    }
    fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        let mut e = Self::for_object(409, "Conflict", rt, name, "");
        e.message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            rt.qualified()
        );
        e
    }
    pub(crate) fn status(&self) -> Value {
        let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code});
        if !self.details.is_null() {
            s["details"] = self.details.clone();
        }
        s
    }
}

pub(crate) type Result<T> = std::result::Result<T, ApiError>;

/// One `metadata.managedFields` entry: which fields a manager owns, and through which operation.
#[derive(Debug, Clone, PartialEq)]
struct Managed {
    manager: String,
    apply: bool,
    scope: Scope,
    time: String,
    fields: BTreeSet<Path>,
}

#[derive(Debug, Clone)]
struct Stored {
    obj: Value,
    managed: Vec<Managed>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, kept for watches that resume from an older resourceVersion.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub rv: u64,
    pub group: String,
    pub plural: String,
    pub kind: EventType,
    /// The object before the change (for MODIFIED), so selector transitions can be computed.
    pub prev: Option<Value>,
    pub obj: Value,
}

pub(crate) enum Deletion {
    /// The object is gone.
    Gone(Value),
    /// The object has finalizers: it got a deletionTimestamp and stays until they are removed.
    Pending(Value),
}

pub(crate) struct State {
    types: Vec<ResourceType>,
    /// (group, plural) -> (namespace or "", name) -> object. The version is not part of the key,
    /// so v1alpha1 and v1beta1 paths of one group see the same objects.
    objects: BTreeMap<(String, String), BTreeMap<(String, String), Stored>>,
    pub rv: u64,
    /// Watches from a resourceVersion below this get 410 Gone: their events were dropped.
    pub compacted_rv: u64,
    /// Bumped by `restart()`; open watch streams end when they see a new epoch.
    pub epoch: u64,
    pub history: VecDeque<Record>,
    history_limit: usize,
    serial: u64,
    /// Carries the current resourceVersion; watch streams wait on it.
    pub changes: watch::Sender<u64>,
}

pub(crate) fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn value_at<'a>(v: &'a Value, p: &[String]) -> Option<&'a Value> {
    p.iter().try_fold(v, |v, k| v.get(k))
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn remove_path(v: &mut Value, p: &[String]) {
    if let Some((last, parent)) = p.split_last() {
        let parent = parent.iter().try_fold(v, |v, k| v.get_mut(k));
        if let Some(Value::Object(m)) = parent {
            m.remove(last);
        }
    }
}

fn set_or_remove(obj: &mut Value, key: &str, value: Option<Value>) {
    if let Value::Object(m) = obj {
        match value {
            Some(v) => m.insert(key.to_owned(), v),
            None => m.remove(key),
        };
    }
}

/// Leaf paths of an object: scalars and (atomic) lists. Maps are never leaves, so an empty map
/// owns nothing and cannot conflict with keys other managers set in it. Nulls delete.
fn leaves(v: &Value) -> Vec<Path> {
    fn walk(v: &Value, prefix: &mut Path, out: &mut Vec<Path>) {
        match v {
            Value::Object(m) => {
                for (k, c) in m.iter().filter(|(_, c)| !c.is_null()) {
                    prefix.push(k.clone());
                    walk(c, prefix, out);
                    prefix.pop();
                }
            }
            _ if !prefix.is_empty() => out.push(prefix.clone()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// Fields the server owns; no field manager ever owns them.
fn server_field(p: &[String]) -> bool {
    match p {
        [k] => k == "apiVersion" || k == "kind",
        [m, k, ..] if m == "metadata" => matches!(
            k.as_str(),
            "name"
                | "namespace"
                | "uid"
                | "resourceVersion"
                | "generation"
                | "creationTimestamp"
                | "managedFields"
                | "deletionTimestamp"
                | "selfLink"
        ),
        _ => false,
    }
}

fn in_scope(rt: &ResourceType, scope: Scope, p: &[String]) -> bool {
    let status = p.first().is_some_and(|k| k == "status");
    !server_field(p)
        && match scope {
            Scope::Main => !(rt.status_subresource && status),
            Scope::Status => status,
        }
}

/// Applies the subresource rules to a full candidate object: the main resource of a kind with a
/// status subresource keeps the old status; the status subresource changes only `status`.
fn scope_to(rt: &ResourceType, scope: Scope, old: Option<&Value>, mut candidate: Value) -> Value {
    let old_status = || old.and_then(|o| o.get("status")).cloned();
    match scope {
        Scope::Main if rt.status_subresource => {
            set_or_remove(&mut candidate, "status", old_status());
            candidate
        }
        Scope::Main => candidate,
        Scope::Status => {
            let mut out = old.cloned().unwrap_or_else(|| json!({}));
            set_or_remove(&mut out, "status", candidate.get("status").cloned());
            out
        }
    }
}

/// RFC 7386 JSON merge patch. With `strategic`, `$`-directives are dropped; lists are replaced.
fn merge(target: &mut Value, patch: &Value, strategic: bool) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if strategic && k.starts_with('$') {
                continue;
            }
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v, strategic);
            }
        }
    }
}

/// RFC 6902 JSON patch: add, remove, replace, move, copy, test.
fn json_patch(doc: &mut Value, ops: &Value) -> Result<()> {
    fn split(ptr: &str) -> Result<(String, String)> {
        let (parent, last) = ptr
            .rsplit_once('/')
            .ok_or_else(|| ApiError::bad_request(format!("bad JSON pointer {ptr:?}")))?;
        Ok((
            parent.to_owned(),
            last.replace("~1", "/").replace("~0", "~"),
        ))
    }
    fn missing(ptr: &str) -> ApiError {
        ApiError::invalid(format!("JSON patch path {ptr:?} does not exist"))
    }
    fn remove(doc: &mut Value, ptr: &str) -> Result<Value> {
        let (parent, last) = split(ptr)?;
        match doc.pointer_mut(&parent) {
            Some(Value::Object(m)) => m.remove(&last).ok_or_else(|| missing(ptr)),
            Some(Value::Array(a)) => match last.parse::<usize>() {
                Ok(i) if i < a.len() => Ok(a.remove(i)),
                _ => Err(missing(ptr)),
            },
            _ => Err(missing(ptr)),
        }
    }
    fn add(doc: &mut Value, ptr: &str, v: Value) -> Result<()> {
        if ptr.is_empty() {
            *doc = v;
            return Ok(());
        }
        let (parent, last) = split(ptr)?;
        match doc.pointer_mut(&parent) {
            Some(Value::Object(m)) => {
                m.insert(last, v);
                Ok(())
            }
            Some(Value::Array(a)) => {
                let i = if last == "-" {
                    a.len()
                } else {
                    last.parse::<usize>().map_err(|_| missing(ptr))?
                };
                if i > a.len() {
                    return Err(missing(ptr));
                }
                a.insert(i, v);
                Ok(())
            }
            _ => Err(missing(ptr)),
        }
    }
    let ops = ops
        .as_array()
        .ok_or_else(|| ApiError::bad_request("a JSON patch must be a list of operations"))?;
    for op in ops {
        let field = |k: &str| {
            str_at(op, &format!("/{k}")).ok_or_else(|| {
                ApiError::bad_request(format!("JSON patch operation without {k:?}: {op}"))
            })
        };
        let path = field("path")?;
        let value = || {
            op.get("value").cloned().ok_or_else(|| {
                ApiError::bad_request(format!("JSON patch operation without \"value\": {op}"))
            })
        };
        match field("op")? {
            "add" => add(doc, path, value()?)?,
            "remove" => drop(remove(doc, path)?),
            "replace" => {
                remove(doc, path)?;
                add(doc, path, value()?)?;
            }
            "move" => {
                let v = remove(doc, field("from")?)?;
                add(doc, path, v)?;
            }
            "copy" => {
                let v = doc
                    .pointer(field("from")?)
                    .cloned()
                    .ok_or_else(|| missing(path))?;
                add(doc, path, v)?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(ApiError::invalid(format!(
                        "JSON patch test failed at {path:?}"
                    )));
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown JSON patch operation {other:?}"
                )));
            }
        }
    }
    Ok(())
}

/// The entry of `manager` for one operation and scope, created if missing.
fn entry<'a>(
    managed: &'a mut Vec<Managed>,
    manager: &str,
    apply: bool,
    scope: Scope,
) -> &'a mut Managed {
    let pos = managed
        .iter()
        .position(|m| m.manager == manager && m.apply == apply && m.scope == scope);
    let i = pos.unwrap_or_else(|| {
        managed.push(Managed {
            manager: manager.to_owned(),
            apply,
            scope,
            time: now(),
            fields: BTreeSet::new(),
        });
        managed.len() - 1
    });
    &mut managed[i]
}

/// Ownership after a non-apply write: fields the write changed move to `manager` (or become
/// unowned for direct store writes).
fn take_changed(
    rt: &ResourceType,
    scope: Scope,
    managed: &mut Vec<Managed>,
    old: Option<&Value>,
    new: &Value,
    manager: Option<&str>,
) {
    // A direct store write (no manager) may change any field, status included.
    let relevant = |p: &Path| {
        if manager.is_some() {
            in_scope(rt, scope, p)
        } else {
            !server_field(p)
        }
    };
    let changed: BTreeSet<Path> = leaves(new)
        .into_iter()
        .filter(|p| relevant(p) && old.and_then(|o| value_at(o, p)) != value_at(new, p))
        .collect();
    if changed.is_empty() {
        return;
    }
    for m in managed.iter_mut() {
        m.fields.retain(|q| !changed.iter().any(|p| overlaps(p, q)));
    }
    if let Some(manager) = manager {
        let e = entry(managed, manager, false, scope);
        e.fields.extend(changed);
        e.time = now();
    }
}

fn fields_v1(fields: &BTreeSet<Path>) -> Value {
    fn insert(node: &mut Map<String, Value>, p: &[String]) {
        if let Some((k, rest)) = p.split_first()
            && let Value::Object(child) = node.entry(format!("f:{k}")).or_insert_with(|| json!({}))
        {
            insert(child, rest);
        }
    }
    let mut root = Map::new();
    for p in fields {
        insert(&mut root, p);
    }
    Value::Object(root)
}

fn without_meta_and_status(v: &Value) -> Value {
    let mut v = v.clone();
    set_or_remove(&mut v, "metadata", None);
    set_or_remove(&mut v, "status", None);
    v
}

/// Checks an optimistic-concurrency precondition: a non-empty `metadata.resourceVersion` in the
/// request body must equal the stored one.
fn check_rv(rt: &ResourceType, name: &str, body: &Value, old: &Value) -> Result<()> {
    match str_at(body, "/metadata/resourceVersion").filter(|s| !s.is_empty()) {
        Some(rv) if Some(rv) != str_at(old, "/metadata/resourceVersion") => {
            Err(ApiError::conflict(
                rt,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ))
        }
        _ => Ok(()),
    }
}

fn check_identity(rt: &ResourceType, ns: &str, name: Option<&str>, body: &Value) -> Result<()> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    if let (Some(want), Some(got)) = (name, str_at(body, "/metadata/name"))
        && want != got
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({got}) does not match the name on the URL ({want})"
        )));
    }
    match str_at(body, "/metadata/namespace") {
        Some(got) if rt.namespaced && !got.is_empty() && got != ns => {
            Err(ApiError::bad_request(format!(
                "the namespace of the provided object ({got}) does not match the namespace sent on the request ({ns})"
            )))
        }
        _ => Ok(()),
    }
}

impl State {
    pub(crate) fn new(types: Vec<ResourceType>, history_limit: usize) -> Self {
        Self {
            types,
            objects: BTreeMap::new(),
            rv: 1,
            compacted_rv: 0,
            epoch: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            serial: 0,
            changes: watch::channel(1).0,
        }
    }

    pub(crate) fn register(&mut self, rt: ResourceType) {
        self.types
            .retain(|t| !(t.group == rt.group && t.plural == rt.plural));
        self.types.push(rt);
    }

    pub(crate) fn resource(&self, group: &str, plural: &str) -> Option<ResourceType> {
        self.types
            .iter()
            .find(|t| t.group == group && t.plural == plural)
            .cloned()
    }

    pub(crate) fn resource_by_kind(&self, group: &str, kind: &str) -> Option<ResourceType> {
        self.types
            .iter()
            .find(|t| t.group == group && t.kind == kind)
            .cloned()
    }

    fn bucket(&self, rt: &ResourceType) -> Option<&BTreeMap<(String, String), Stored>> {
        self.objects.get(&(rt.group.clone(), rt.plural.clone()))
    }

    fn stored(&self, rt: &ResourceType, ns: &str, name: &str) -> Option<Stored> {
        self.bucket(rt)?
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
    }

    pub(crate) fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value> {
        self.stored(rt, ns, name)
            .map(|s| s.obj)
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// Objects of a resource, in one namespace or all, ordered by namespace and name.
    pub(crate) fn list(&self, rt: &ResourceType, ns: Option<&str>) -> Vec<Value> {
        self.iter(rt, ns).cloned().collect()
    }

    /// [`State::list`] without copying: a list request presents only the page it returns.
    pub(crate) fn iter<'s>(
        &'s self,
        rt: &ResourceType,
        ns: Option<&'s str>,
    ) -> impl Iterator<Item = &'s Value> + 's {
        self.iter_after(rt, ns, None).map(|(_, obj)| obj)
    }

    /// The objects after the (namespace, name) `after` in key order, with their keys: where a
    /// list page continues without walking the pages before it.
    pub(crate) fn iter_after<'s>(
        &'s self,
        rt: &ResourceType,
        ns: Option<&'s str>,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = (&'s (String, String), &'s Value)> + 's {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.bucket(rt)
            .into_iter()
            .flat_map(move |bucket| bucket.range((from.clone(), Bound::Unbounded)))
            .filter(move |((n, _), _)| ns.is_none_or(|ns| ns == n))
            .map(|(key, s)| (key, &s.obj))
    }

    /// Appends a change to the history (dropping the oldest beyond the limit) and wakes watches.
    fn record(&mut self, rt: &ResourceType, kind: EventType, prev: Option<Value>, obj: Value) {
        self.history.push_back(Record {
            rv: self.rv,
            group: rt.group.clone(),
            plural: rt.plural.clone(),
            kind,
            prev,
            obj,
        });
        while self.history.len() > self.history_limit {
            if let Some(r) = self.history.pop_front() {
                self.compacted_rv = r.rv;
            }
        }
        self.changes.send_replace(self.rv);
    }

    /// Fills server-managed metadata. `direct` (store writes from tests) keeps uid,
    /// creationTimestamp and generation when the object brings them.
    fn finish_meta(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        old: Option<&Value>,
        new: &mut Value,
        direct: bool,
    ) {
        let mut generation = old
            .and_then(|o| o.pointer("/metadata/generation"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if old.is_none_or(|o| without_meta_and_status(o) != without_meta_and_status(new)) {
            generation += 1;
        }
        if !new.is_object() {
            *new = json!({});
        }
        new["kind"] = json!(rt.kind);
        if !new["metadata"].is_object() {
            new["metadata"] = json!({});
        }
        let incoming = new["metadata"].clone();
        let Value::Object(meta) = &mut new["metadata"] else {
            return;
        };
        meta.insert("name".into(), json!(name));
        if rt.namespaced {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        for k in ["managedFields", "selfLink", "resourceVersion"] {
            meta.remove(k);
        }
        let keep = |k: &str| {
            if direct {
                incoming.get(k).cloned()
            } else {
                None
            }
        };
        let from_old = |k: &str| old.and_then(|o| o["metadata"].get(k)).cloned();
        self.serial += 1;
        let fresh_uid = json!(format!("00000000-0000-4000-8000-{:012x}", self.serial));
        meta.insert(
            "uid".into(),
            keep("uid").or_else(|| from_old("uid")).unwrap_or(fresh_uid),
        );
        let created = keep("creationTimestamp")
            .or_else(|| from_old("creationTimestamp"))
            .unwrap_or_else(|| json!(now()));
        meta.insert("creationTimestamp".into(), created);
        meta.insert(
            "generation".into(),
            keep("generation").unwrap_or_else(|| json!(generation)),
        );
        match from_old("deletionTimestamp") {
            Some(ts) => meta.insert("deletionTimestamp".into(), ts),
            None if !direct => meta.remove("deletionTimestamp"),
            None => None,
        };
        if let Some(rv) = from_old("resourceVersion") {
            meta.insert("resourceVersion".into(), rv);
        }
    }

    /// Stores `new` (with metadata already finished) unless it equals the stored object: a no-op
    /// write keeps the resourceVersion and sends no watch event, as in Kubernetes. An object
    /// being deleted whose finalizers are all gone is removed.
    fn commit(
        &mut self,
        rt: &ResourceType,
        old: Option<Stored>,
        mut new: Value,
        mut managed: Vec<Managed>,
    ) -> Value {
        for m in managed.iter_mut() {
            m.fields.retain(|p| value_at(&new, p).is_some());
        }
        managed.retain(|m| !m.fields.is_empty());
        let api_version = new["apiVersion"].clone();
        let rendered: Vec<Value> = managed
            .iter()
            .map(|m| {
                let mut e = json!({"manager": m.manager, "operation": if m.apply { "Apply" } else { "Update" },
                    "apiVersion": api_version, "time": m.time, "fieldsType": "FieldsV1", "fieldsV1": fields_v1(&m.fields)});
                if m.scope == Scope::Status {
                    e["subresource"] = json!("status");
                }
                e
            })
            .collect();
        if !rendered.is_empty() {
            new["metadata"]["managedFields"] = Value::Array(rendered);
        }
        if let Some(old) = &old
            && old.obj == new
        {
            return new;
        }
        let key = (
            str_at(&new, "/metadata/namespace").unwrap_or("").to_owned(),
            str_at(&new, "/metadata/name").unwrap_or("").to_owned(),
        );
        self.rv += 1;
        new["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let finalized = new.pointer("/metadata/deletionTimestamp").is_some()
            && new
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
        let bucket = self
            .objects
            .entry((rt.group.clone(), rt.plural.clone()))
            .or_default();
        if finalized {
            bucket.remove(&key);
            self.record(rt, EventType::Deleted, old.map(|o| o.obj), new.clone());
        } else {
            bucket.insert(
                key,
                Stored {
                    obj: new.clone(),
                    managed,
                },
            );
            let kind = if old.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            };
            self.record(rt, kind, old.map(|o| o.obj), new.clone());
        }
        new
    }

    /// Finishes metadata, moves ownership of changed fields to `manager` and commits.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        scope: Scope,
        old: Option<Stored>,
        mut new: Value,
        manager: Option<&str>,
        direct: bool,
    ) -> Value {
        let old_obj = old.as_ref().map(|s| &s.obj);
        self.finish_meta(rt, ns, name, old_obj, &mut new, direct);
        let mut managed = old.as_ref().map(|s| s.managed.clone()).unwrap_or_default();
        take_changed(rt, scope, &mut managed, old_obj, &new, manager);
        self.commit(rt, old, new, managed)
    }

    pub(crate) fn create(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        api_version: &str,
        mut body: Value,
        manager: &str,
    ) -> Result<Value> {
        check_identity(rt, ns, None, &body)?;
        let name = match (
            str_at(&body, "/metadata/name").filter(|n| !n.is_empty()),
            str_at(&body, "/metadata/generateName"),
        ) {
            (Some(n), _) => n.to_owned(),
            (None, Some(prefix)) => format!("{prefix}{:05x}", self.serial + 1),
            (None, None) => {
                return Err(ApiError::invalid(
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        };
        if self.stored(rt, ns, &name).is_some() {
            return Err(ApiError::for_object(
                409,
                "AlreadyExists",
                rt,
                &name,
                "already exists",
            ));
        }
        body["apiVersion"] = json!(api_version);
        let new = scope_to(rt, Scope::Main, None, body);
        Ok(self.write(rt, ns, &name, Scope::Main, None, new, Some(manager), false))
    }

    /// PUT of the object or its status.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn update(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        scope: Scope,
        api_version: &str,
        mut body: Value,
        manager: &str,
    ) -> Result<Value> {
        check_identity(rt, ns, Some(name), &body)?;
        let old = self
            .stored(rt, ns, name)
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        check_rv(rt, name, &body, &old.obj)?;
        body["apiVersion"] = json!(api_version);
        let new = scope_to(rt, scope, Some(&old.obj), body);
        Ok(self.write(rt, ns, name, scope, Some(old), new, Some(manager), false))
    }

    /// PATCH of the object or its status. Returns the object and whether it was created (apply).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn patch(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        scope: Scope,
        api_version: &str,
        kind: PatchKind,
        patch: Value,
        manager: &str,
        force: bool,
    ) -> Result<(Value, bool)> {
        if kind == PatchKind::Apply {
            return self.apply(rt, ns, name, scope, api_version, patch, manager, force);
        }
        let old = self
            .stored(rt, ns, name)
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        let mut candidate = old.obj.clone();
        match kind {
            PatchKind::Json => json_patch(&mut candidate, &patch)?,
            _ => {
                check_identity(rt, ns, Some(name), &patch)?;
                check_rv(rt, name, &patch, &old.obj)?;
                merge(&mut candidate, &patch, kind == PatchKind::Strategic);
            }
        }
        if !candidate.is_object() {
            return Err(ApiError::invalid("the patched object is not a JSON object"));
        }
        let new = scope_to(rt, scope, Some(&old.obj), candidate);
        Ok((
            self.write(rt, ns, name, scope, Some(old), new, Some(manager), false),
            false,
        ))
    }

    /// Server-side apply: merge-patch semantics plus field ownership. Fields the manager applied
    /// before and omits now are removed (unless another manager owns them); changing a field
    /// another manager owns is a 409 Conflict unless `force`, which takes the field over.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        scope: Scope,
        api_version: &str,
        patch: Value,
        manager: &str,
        force: bool,
    ) -> Result<(Value, bool)> {
        check_identity(rt, ns, Some(name), &patch)?;
        if str_at(&patch, "/apiVersion").is_none() || str_at(&patch, "/kind").is_none() {
            return Err(ApiError::bad_request(
                "apply patches must set apiVersion and kind",
            ));
        }
        let old = self.stored(rt, ns, name);
        if old.is_none() && scope == Scope::Status {
            return Err(ApiError::not_found(rt, name));
        }
        let mut obj = old.as_ref().map_or_else(
            || json!({"apiVersion": api_version, "metadata": {}}),
            |s| s.obj.clone(),
        );
        let mut managed = old.as_ref().map(|s| s.managed.clone()).unwrap_or_default();
        let applied: BTreeSet<Path> = leaves(&patch)
            .into_iter()
            .filter(|p| in_scope(rt, scope, p))
            .collect();
        let differs = |p: &Path| value_at(&obj, p) != value_at(&patch, p);
        let is_me = |m: &Managed| m.manager == manager && m.apply && m.scope == scope;
        let mut conflicts = BTreeSet::new();
        for m in managed.iter().filter(|m| !is_me(m)) {
            for q in &m.fields {
                if applied.iter().any(|p| overlaps(p, q) && differs(p)) {
                    conflicts.insert((m.manager.clone(), q.join(".")));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            let list: Vec<String> = conflicts
                .iter()
                .map(|(m, f)| format!("conflict with \"{m}\": .{f}"))
                .collect();
            let mut e = ApiError::conflict(rt, name, "");
            e.message = format!(
                "Apply failed with {} conflict(s): {}",
                list.len(),
                list.join(", ")
            );
            e.details["causes"] = conflicts
                .iter()
                .map(|(m, f)| json!({"type": "FieldManagerConflict", "message": format!("conflict with \"{m}\""), "field": format!(".{f}")}))
                .collect();
            return Err(e);
        }
        for m in managed.iter_mut().filter(|m| !is_me(m)) {
            m.fields
                .retain(|q| !applied.iter().any(|p| overlaps(p, q) && differs(p)));
        }
        let previous = managed
            .iter()
            .find(|m| is_me(m))
            .map(|m| m.fields.clone())
            .unwrap_or_default();
        for r in previous.difference(&applied) {
            if !managed
                .iter()
                .filter(|m| !is_me(m))
                .any(|m| m.fields.iter().any(|q| overlaps(q, r)))
            {
                remove_path(&mut obj, r);
            }
        }
        let mut scoped = patch.clone();
        match scope {
            Scope::Main if rt.status_subresource => set_or_remove(&mut scoped, "status", None),
            Scope::Main => {}
            Scope::Status => {
                scoped = json!({"status": patch.get("status").cloned().unwrap_or(Value::Null)})
            }
        }
        merge(&mut obj, &scoped, false);
        obj["apiVersion"] = json!(api_version);
        let me = entry(&mut managed, manager, true, scope);
        if me.fields != applied {
            me.fields = applied;
            me.time = now();
        }
        let old_obj = old.as_ref().map(|s| s.obj.clone());
        self.finish_meta(rt, ns, name, old_obj.as_ref(), &mut obj, false);
        // Fields the apply deleted (explicit nulls) leave every entry in `commit`.
        let created = old.is_none();
        Ok((self.commit(rt, old, obj, managed), created))
    }

    /// DELETE, honouring `preconditions` in the DeleteOptions body and finalizers.
    pub(crate) fn delete(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &Value,
    ) -> Result<Deletion> {
        let old = self
            .stored(rt, ns, name)
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        for (field, pointer) in [
            ("resourceVersion", "/metadata/resourceVersion"),
            ("uid", "/metadata/uid"),
        ] {
            if let Some(want) = str_at(opts, &format!("/preconditions/{field}"))
                && Some(want) != str_at(&old.obj, pointer)
            {
                return Err(ApiError::conflict(
                    rt,
                    name,
                    &format!("Precondition failed: {field} in precondition: {want}"),
                ));
            }
        }
        let has_finalizers = old
            .obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if old.obj.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(Deletion::Pending(old.obj));
            }
            let mut new = old.obj.clone();
            new["metadata"]["deletionTimestamp"] = json!(now());
            let managed = old.managed.clone();
            return Ok(Deletion::Pending(self.commit(rt, Some(old), new, managed)));
        }
        Ok(Deletion::Gone(self.remove(rt, ns, name).unwrap_or(old.obj)))
    }

    /// Removes an object at once (no finalizers), sending DELETED with a new resourceVersion.
    pub(crate) fn remove(&mut self, rt: &ResourceType, ns: &str, name: &str) -> Option<Value> {
        let key = (rt.group.clone(), rt.plural.clone());
        let stored = self
            .objects
            .get_mut(&key)?
            .remove(&(ns.to_owned(), name.to_owned()))?;
        self.rv += 1;
        let mut obj = stored.obj.clone();
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(rt, EventType::Deleted, Some(stored.obj), obj.clone());
        Some(obj)
    }

    /// A direct write from a test: creates or replaces, without field manager or subresource rules.
    pub(crate) fn put(&mut self, rt: &ResourceType, ns: &str, name: &str, obj: Value) -> Value {
        let old = self.stored(rt, ns, name);
        self.write(rt, ns, name, Scope::Main, old, obj, None, true)
    }

    /// Simulates an API server restart: open watches end, history is dropped and the
    /// resourceVersion moves on, so every watch resuming from an old version gets 410 Gone.
    pub(crate) fn restart(&mut self) {
        self.epoch += 1;
        self.rv += 1;
        self.compacted_rv = self.rv;
        self.history.clear();
        self.changes.send_replace(self.rv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_patch_ops() {
        let mut doc = json!({"a": {"b": 1}, "l": [1, 2]});
        let ops = json!([
            {"op": "add", "path": "/a/c", "value": 2},
            {"op": "replace", "path": "/a/b", "value": 3},
            {"op": "add", "path": "/l/-", "value": 4},
            {"op": "remove", "path": "/l/0"},
            {"op": "move", "from": "/a/c", "path": "/d"},
            {"op": "copy", "from": "/d", "path": "/e~1f"},
            {"op": "test", "path": "/d", "value": 2}
        ]);
        json_patch(&mut doc, &ops).expect("patch applies");
        assert_eq!(doc, json!({"a": {"b": 3}, "l": [2, 4], "d": 2, "e/f": 2}));
        let err = json_patch(&mut doc, &json!([{"op": "test", "path": "/d", "value": 9}]))
            .expect_err("test fails");
        assert_eq!(err.code, 422);
        assert_eq!(
            json_patch(&mut doc, &json!([{"op": "remove", "path": "/nope"}])).map_err(|e| e.code),
            Err(422)
        );
    }

    #[test]
    fn merge_patch_semantics() {
        let mut t = json!({"a": 1, "m": {"x": 1, "y": 2}, "l": [1, 2]});
        merge(
            &mut t,
            &json!({"a": null, "m": {"y": 3}, "l": [9], "$retainKeys": ["m"]}),
            true,
        );
        assert_eq!(t, json!({"m": {"x": 1, "y": 3}, "l": [9]}));
    }

    #[test]
    fn leaves_and_fields_v1() {
        let v = json!({"apiVersion": "v1", "metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"l": [1], "e": {}, "n": null}});
        let rt = ResourceType::namespaced("", "ConfigMap", "configmaps");
        let owned: BTreeSet<Path> = leaves(&v)
            .into_iter()
            .filter(|p| in_scope(&rt, Scope::Main, p))
            .collect();
        assert_eq!(
            fields_v1(&owned),
            json!({"f:metadata": {"f:labels": {"f:x": {}}}, "f:spec": {"f:l": {}}})
        );
    }
}
