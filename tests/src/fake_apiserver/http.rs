//! HTTP/1.1 front end: accept loop, routing of Kubernetes REST paths, and watch streams.
//!
//! Paths: `/api/v1/...` (core group) and `/apis/{group}/{version}/...`, then either
//! `{plural}[/{name}[/status]]` (cluster-scoped, or all namespaces for lists and watches) or
//! `namespaces/{ns}/{plural}[/{name}[/status]]`. Any version of a registered group/plural is
//! served from the same store; responses carry the apiVersion of the request path.

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{
    net::TcpListener,
    sync::{oneshot, watch},
    task::JoinSet,
    time::Instant,
};

use super::{
    RecordedRequest, ResourceType, Shared,
    select::{FieldSelector, LabelSelector},
    store::{ApiError, Deletion, EventType, PatchKind, Record, Scope},
};

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Accepts connections until `shutdown` fires (or its sender is dropped), then closes the
/// listener and aborts every open connection, watches included.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of file descriptors or similar; do not spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                // As kube-apiserver (Go) does: a watch event is written as a chunk header and
                // a body, and with Nagle the second write waits ~40 ms for a delayed ACK.
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    // Errors here are client disconnects; nothing to report.
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}

fn full(status: StatusCode, v: &Value) -> Response<Body> {
    let mut res = Response::new(Full::new(Bytes::from(v.to_string())).boxed_unsync());
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    res
}

fn error(e: &ApiError) -> Response<Body> {
    full(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.status(),
    )
}

/// The object as served at `api_version` (objects are stored version-less).
pub(crate) fn present(obj: &Value, api_version: &str) -> Value {
    let mut obj = obj.clone();
    if obj.is_object() {
        obj["apiVersion"] = json!(api_version);
    }
    obj
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(error(&ApiError::bad_request(format!(
                "reading the request body: {e}"
            ))));
        }
    };
    let header = |h| {
        parts
            .headers
            .get(h)
            .and_then(|v: &header::HeaderValue| v.to_str().ok())
    };
    let rec = RecordedRequest {
        method: parts.method.clone(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or("").to_owned(),
        content_type: header(header::CONTENT_TYPE).map(str::to_owned),
        body: body.to_vec(),
    };
    // Kubernetes names the default field manager after the user agent's product.
    let agent = header(header::USER_AGENT)
        .and_then(|ua| ua.split('/').next())
        .unwrap_or("unknown")
        .to_owned();
    shared.record(rec.clone());
    Ok(route(&shared, &rec, &agent).unwrap_or_else(|e| error(&e)))
}

/// What a request path addresses.
struct Target {
    rt: ResourceType,
    api_version: String,
    /// "" for cluster-scoped objects and all-namespaces collections.
    ns: String,
    all_namespaces: bool,
    name: Option<String>,
    scope: Scope,
}

fn target(shared: &Shared, path: &str) -> Result<Target, ApiError> {
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    };
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(not_found()),
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(*n), None),
        [p, n, s] => (*p, Some(*n), Some(*s)),
        _ => return Err(not_found()),
    };
    let rt = shared
        .state()
        .resource(group, plural)
        .ok_or_else(not_found)?;
    let scope_ok = match (rt.namespaced, ns) {
        (true, None) => name.is_none(),
        (true, Some(_)) => true,
        (false, ns) => ns.is_none(),
    };
    let scope = match sub {
        None => Scope::Main,
        Some("status") if rt.status_subresource => Scope::Status,
        Some(_) => return Err(not_found()),
    };
    if !scope_ok || name.is_some_and(str::is_empty) {
        return Err(not_found());
    }
    Ok(Target {
        api_version: if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        },
        ns: ns.unwrap_or("").to_owned(),
        all_namespaces: rt.namespaced && ns.is_none(),
        name: name.map(str::to_owned),
        rt,
        scope,
    })
}

fn json_body(rec: &RecordedRequest) -> Result<Value, ApiError> {
    serde_json::from_slice(&rec.body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

fn route(
    shared: &Arc<Shared>,
    rec: &RecordedRequest,
    agent: &str,
) -> Result<Response<Body>, ApiError> {
    if rec.path == "/version" {
        return Ok(full(
            StatusCode::OK,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "platform": "linux/amd64"}),
        ));
    }
    let t = target(shared, &rec.path)?;
    if shared.is_forbidden(&t.rt.plural, rec.is_watch()) {
        return Err(ApiError::new(
            403,
            "Forbidden",
            format!("{} is forbidden (fake RBAC)", t.rt.plural),
        ));
    }
    let param = |k: &str| rec.param(k);
    if param("dryRun").is_some() {
        return Err(ApiError::bad_request(
            "dryRun is not supported by the fake API server",
        ));
    }
    let manager = param("fieldManager").unwrap_or_else(|| agent.to_owned());
    let (rt, ns, av) = (&t.rt, t.ns.as_str(), t.api_version.as_str());
    let writes = [Method::POST, Method::PUT, Method::PATCH].contains(&rec.method);
    if shared.namespaces && rt.namespaced && !t.all_namespaces && writes {
        let namespaces = ResourceType::namespace();
        shared.state().get(&namespaces, "", ns)?;
    }
    let ok = |v: &Value| full(StatusCode::OK, &present(v, av));
    match (&rec.method, t.name.as_deref()) {
        (&Method::GET, None) if rec.is_watch() => watch(shared, &t, rec),
        (&Method::GET, None) => {
            let (labels, fields) = selectors(rec)?;
            let st = shared.state();
            let (after, limit) = page_params(rec)?;
            let matching = st
                .iter_after(rt, (!t.all_namespaces).then_some(ns), after)
                .filter(|(_, o)| labels.matches(o) && fields.matches(o));
            let (page, next) = page(matching, limit, |o| present(o, av));
            let mut metadata = json!({"resourceVersion": st.rv.to_string()});
            if let Some((namespace, name)) = next {
                metadata["continue"] = json!(format!("{namespace}/{name}"));
            }
            let list = json!({"apiVersion": av, "kind": format!("{}List", rt.kind),
                "metadata": metadata, "items": page});
            Ok(full(StatusCode::OK, &list))
        }
        (&Method::POST, None) if !t.all_namespaces => {
            let obj = shared
                .state()
                .create(rt, ns, av, json_body(rec)?, &manager)?;
            Ok(full(StatusCode::CREATED, &present(&obj, av)))
        }
        (&Method::GET, Some(name)) => Ok(ok(&shared.state().get(rt, ns, name)?)),
        (&Method::PUT, Some(name)) => Ok(ok(&shared.state().update(
            rt,
            ns,
            name,
            t.scope,
            av,
            json_body(rec)?,
            &manager,
        )?)),
        (&Method::PATCH, Some(name)) => {
            let media = rec
                .content_type
                .as_deref()
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim();
            let kind = match media {
                "application/apply-patch+yaml" => PatchKind::Apply,
                "application/merge-patch+json" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                "application/json-patch+json" => PatchKind::Json,
                other => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!("the body of the request was in an unknown format ({other:?})"),
                    ));
                }
            };
            let force = matches!(param("force").as_deref(), Some("true" | "1"));
            if kind == PatchKind::Apply && param("fieldManager").is_none_or(|m| m.is_empty()) {
                return Err(ApiError::invalid(
                    "fieldManager: Required value: is required for apply patch",
                ));
            }
            if kind != PatchKind::Apply && force {
                return Err(ApiError::invalid(
                    "force: Forbidden: may not be specified for non-apply patch",
                ));
            }
            let patch = match kind {
                // Apply bodies are YAML; JSON is YAML too, but try the strict parser first.
                PatchKind::Apply => serde_json::from_slice(&rec.body)
                    .or_else(|_| serde_yaml::from_slice(&rec.body))
                    .map_err(|e| ApiError::bad_request(format!("invalid apply patch: {e}")))?,
                _ => json_body(rec)?,
            };
            let (obj, created) = shared
                .state()
                .patch(rt, ns, name, t.scope, av, kind, patch, &manager, force)?;
            Ok(full(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                &present(&obj, av),
            ))
        }
        (&Method::DELETE, Some(name)) if t.scope == Scope::Main => {
            let opts = if rec.body.is_empty() {
                Value::Null
            } else {
                json_body(rec)?
            };
            match shared.state().delete(rt, ns, name, &opts)? {
                Deletion::Pending(obj) => Ok(ok(&obj)),
                Deletion::Gone(obj) => Ok(full(
                    StatusCode::OK,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": obj.pointer("/metadata/uid")}}),
                )),
            }
        }
        (m, _) => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{m} is not supported on {}", rec.path),
        )),
    }
}

/// An object's (namespace, name): the store's key.
type ObjectKey = (String, String);

/// Where a list page starts and how long it is: the `continue` token is the namespace/name of
/// the last object of the previous page (a page is not a consistent snapshot with the pages
/// before it, unlike etcd's), and `limit` the most items.
fn page_params(rec: &RecordedRequest) -> Result<(Option<ObjectKey>, Option<usize>), ApiError> {
    let after = match rec.param("continue").filter(|v| !v.is_empty()) {
        None => None,
        Some(token) => match token.split_once('/') {
            Some((namespace, name)) => Some((namespace.to_owned(), name.to_owned())),
            None => {
                return Err(ApiError::bad_request(format!("invalid continue {token:?}")));
            }
        },
    };
    let limit = rec
        .param("limit")
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {v:?}")))
        })
        .transpose()?
        .filter(|&l| l > 0);
    Ok((after, limit))
}

/// One page of a list: at most `limit` of `items`, and the key of its last item when more
/// follow. Only the page is copied, and a page starts where the last one ended, so a client
/// paging through a large list costs a walk of the store once, not once per page.
fn page<'v>(
    items: impl Iterator<Item = (&'v ObjectKey, &'v Value)>,
    limit: Option<usize>,
    present: impl Fn(&Value) -> Value,
) -> (Vec<Value>, Option<ObjectKey>) {
    let mut items = items.peekable();
    let mut page = Vec::new();
    let mut last = None;
    while let Some((key, obj)) = items.next_if(|_| limit.is_none_or(|l| page.len() < l)) {
        page.push(present(obj));
        last = Some(key);
    }
    let next = items.peek().is_some().then(|| last.cloned()).flatten();
    (page, next)
}

fn selectors(rec: &RecordedRequest) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(&rec.param("labelSelector").unwrap_or_default());
    let fields = FieldSelector::parse(&rec.param("fieldSelector").unwrap_or_default());
    Ok((
        labels.map_err(ApiError::bad_request)?,
        fields.map_err(ApiError::bad_request)?,
    ))
}

/// The state of one watch response body.
struct Watch {
    shared: Arc<Shared>,
    group: String,
    plural: String,
    kind: String,
    api_version: String,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    /// Every change up to this resourceVersion has been sent or filtered out.
    cursor: u64,
    /// The resourceVersion the client last heard of (event or bookmark).
    last_sent: u64,
    bookmarks: bool,
    next_bookmark: Instant,
    deadline: Instant,
    epoch: u64,
    changes: watch::Receiver<u64>,
    pending: Option<String>,
    done: bool,
}

fn watch(
    shared: &Arc<Shared>,
    t: &Target,
    rec: &RecordedRequest,
) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = selectors(rec)?;
    let flag = |k: &str| matches!(rec.param(k).as_deref(), Some("true" | "1"));
    // Like kube-apiserver, 0 or no timeout means the server's default (here 30 minutes);
    // anything is capped at a day.
    let timeout = match rec.param("timeoutSeconds") {
        Some(s) => s
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {s:?}")))?,
        None => 0,
    };
    let timeout = if timeout == 0 {
        1800
    } else {
        timeout.min(86_400)
    };
    let rv = rec.param("resourceVersion").unwrap_or_default();
    let send_initial = flag("sendInitialEvents");
    let st = shared.state();
    let mut w = Watch {
        shared: shared.clone(),
        group: t.rt.group.clone(),
        plural: t.rt.plural.clone(),
        kind: t.rt.kind.clone(),
        api_version: t.api_version.clone(),
        ns: (!t.all_namespaces && t.rt.namespaced).then(|| t.ns.clone()),
        labels,
        fields,
        cursor: st.rv,
        last_sent: st.rv,
        bookmarks: flag("allowWatchBookmarks"),
        next_bookmark: Instant::now() + shared.bookmark_interval,
        deadline: Instant::now() + Duration::from_secs(timeout),
        epoch: st.epoch,
        changes: st.changes.subscribe(),
        pending: None,
        done: false,
    };
    if send_initial || rv.is_empty() || rv == "0" {
        // "Start at most recent": synthetic ADDED events for the current state first.
        let mut lines = String::new();
        for obj in st
            .list(&t.rt, w.ns.as_deref())
            .iter()
            .filter(|o| w.matches(o))
        {
            lines.push_str(&line("ADDED", &present(obj, &w.api_version)));
        }
        if send_initial {
            // Streaming lists: a bookmark annotated as the end of the initial events.
            lines.push_str(&w.bookmark(Some("k8s.io/initial-events-end")));
        }
        w.pending = Some(lines).filter(|l| !l.is_empty());
    } else {
        w.cursor = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?;
        w.last_sent = w.cursor;
    }
    drop(st);
    let body = futures::stream::unfold(w, |mut w| async move {
        let chunk = w.next().await?;
        Some((Ok(Frame::data(Bytes::from(chunk))), w))
    });
    let mut res = Response::new(StreamBody::new(body).boxed_unsync());
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(res)
}

fn line(event: &str, obj: &Value) -> String {
    format!("{}\n", json!({"type": event, "object": obj}))
}

impl Watch {
    fn matches(&self, obj: &Value) -> bool {
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        self.ns.as_deref().is_none_or(|want| ns == Some(want))
            && self.labels.matches(obj)
            && self.fields.matches(obj)
    }

    fn bookmark(&self, annotation: Option<&str>) -> String {
        let annotations = annotation.map_or_else(|| json!({}), |a| json!({a: "true"}));
        line(
            "BOOKMARK",
            &json!({"kind": self.kind, "apiVersion": self.api_version,
            "metadata": {"resourceVersion": self.cursor.to_string(), "annotations": annotations}}),
        )
    }

    /// The event a change means for this watch: selector transitions turn a modification into
    /// ADDED or DELETED, as the Kubernetes watch cache does.
    fn event(&self, rec: &Record) -> Option<String> {
        if rec.group != self.group || rec.plural != self.plural {
            return None;
        }
        let now = self.matches(&rec.obj);
        let before = rec.prev.as_ref().is_some_and(|p| self.matches(p));
        let (kind, obj) = match (rec.kind, before, now) {
            (EventType::Added, _, true) => ("ADDED", rec.obj.clone()),
            (EventType::Deleted, _, true) => ("DELETED", rec.obj.clone()),
            (EventType::Modified, true, true) => ("MODIFIED", rec.obj.clone()),
            (EventType::Modified, false, true) => ("ADDED", rec.obj.clone()),
            (EventType::Modified, true, false) => {
                // The previous content with the new resourceVersion.
                let mut prev = rec.prev.clone().unwrap_or_default();
                prev["metadata"]["resourceVersion"] = json!(rec.rv.to_string());
                ("DELETED", prev)
            }
            _ => return None,
        };
        Some(line(kind, &present(&obj, &self.api_version)))
    }

    /// The next chunk of newline-delimited events, or None to end the response.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(chunk) = self.pending.take() {
                return Some(chunk);
            }
            if self.done {
                return None;
            }
            let mut out = String::new();
            {
                let st = self.shared.state();
                if st.epoch != self.epoch {
                    return None; // restart(): drop the watch
                }
                if self.cursor < st.compacted_rv {
                    self.done = true;
                    let gone = ApiError::new(
                        410,
                        "Expired",
                        format!(
                            "too old resource version: {} ({})",
                            self.cursor, st.compacted_rv
                        ),
                    );
                    out = line("ERROR", &gone.status());
                } else {
                    // The history is in resourceVersion order: start after the cursor
                    // rather than scan all of it (10,000 records) on every wake.
                    let start = st.history.partition_point(|r| r.rv <= self.cursor);
                    for rec in st.history.range(start..) {
                        out.extend(self.event(rec));
                    }
                    self.cursor = self.cursor.max(st.rv);
                }
                // Marked seen under the lock: any later change wakes `changed()` below.
                self.changes.borrow_and_update();
            }
            if !out.is_empty() {
                self.last_sent = self.cursor;
                return Some(out);
            }
            let (deadline, next_bookmark) = (self.deadline, self.next_bookmark);
            let bookmark_due = self.bookmarks && self.cursor > self.last_sent;
            tokio::select! {
                changed = self.changes.changed() => changed.ok()?,
                () = tokio::time::sleep_until(deadline) => return None,
                () = tokio::time::sleep_until(next_bookmark), if bookmark_due => {
                    self.next_bookmark = Instant::now() + self.shared.bookmark_interval;
                    self.last_sent = self.cursor;
                    return Some(self.bookmark(None));
                }
            }
        }
    }
}
