//! Kube test fixtures: a tower-test mock API server that checks the exact HTTP requests of the
//! code under test (method, path, query, content type, JSON body) and answers them, in the
//! style of kube-rs/controller-rs's `ApiServerVerifier`, plus a bounded wait helper.
//!
//! Use it for reconcile logic where the exact writes matter; use
//! [`FakeApiServer`](crate::fake_apiserver::FakeApiServer) where watches, state and
//! concurrency matter.

use std::time::Duration;

use anyhow::{Context as _, bail};
use http::{Method, StatusCode};
use kube::client::Body;
use serde_json::Value;

use crate::fake_apiserver::RecordedRequest;

pub const APPLY_PATCH: &str = "application/apply-patch+yaml";
pub const MERGE_PATCH: &str = "application/merge-patch+json";
pub const JSON: &str = "application/json";

/// How long the verifier waits for the next request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What a request must look like. The query is compared as a set of decoded pairs (order does
/// not matter) and must match exactly: no missing and no extra parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedRequest {
    pub method: Method,
    pub path: String,
    pub query: Vec<(String, String)>,
    /// Not checked when None.
    pub content_type: Option<String>,
    /// Not checked when None; otherwise the body must parse as this JSON value.
    pub body: Option<Value>,
}

impl ExpectedRequest {
    pub fn new(method: Method, path: &str) -> Self {
        Self {
            method,
            path: path.to_owned(),
            query: Vec::new(),
            content_type: None,
            body: None,
        }
    }

    pub fn query(mut self, key: &str, value: &str) -> Self {
        self.query.push((key.to_owned(), value.to_owned()));
        self
    }

    pub fn content_type(mut self, content_type: &str) -> Self {
        self.content_type = Some(content_type.to_owned());
        self
    }

    pub fn json_body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    /// Ok if `req` matches; otherwise an error listing every difference. Works on requests
    /// recorded by the fake API server too.
    pub fn check(&self, req: &RecordedRequest) -> anyhow::Result<()> {
        let mut diffs = Vec::new();
        if req.method != self.method {
            diffs.push(format!(
                "method: expected {}, got {}",
                self.method, req.method
            ));
        }
        if req.path != self.path {
            diffs.push(format!("path: expected {}, got {}", self.path, req.path));
        }
        let (mut want, mut got) = (self.query.clone(), req.params());
        want.sort();
        got.sort();
        if want != got {
            diffs.push(format!("query: expected {want:?}, got {got:?}"));
        }
        if let Some(ct) = &self.content_type
            && req.content_type.as_deref() != Some(ct.as_str())
        {
            diffs.push(format!(
                "content-type: expected {ct}, got {:?}",
                req.content_type
            ));
        }
        if let Some(body) = &self.body {
            match req.json() {
                Some(got) if got == *body => {}
                Some(got) => diffs.push(format!("body: expected {body}, got {got}")),
                None => diffs.push(format!(
                    "body: expected {body}, got non-JSON {:?}",
                    String::from_utf8_lossy(&req.body)
                )),
            }
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            bail!(
                "unexpected {} {}:\n  {}",
                req.method,
                req.path,
                diffs.join("\n  ")
            )
        }
    }
}

/// The server side of a [`mock_client`]: receives each request of the client in turn.
pub struct ApiServerVerifier {
    handle: tower_test::mock::Handle<http::Request<Body>, http::Response<Body>>,
}

/// A kube client (default namespace `default`) whose requests go to the returned verifier.
pub fn mock_client() -> (kube::Client, ApiServerVerifier) {
    let (svc, handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
    (
        kube::Client::new(svc, "default"),
        ApiServerVerifier { handle },
    )
}

impl ApiServerVerifier {
    /// Waits for the next request, checks it against `expected` and answers `status` with the
    /// JSON `response`. On a mismatch the client gets a 500 Status (so it does not hang) and
    /// this returns the differences. Returns the request for further asserts.
    pub async fn expect(
        &mut self,
        expected: &ExpectedRequest,
        status: StatusCode,
        response: &Value,
    ) -> anyhow::Result<RecordedRequest> {
        let (req, send) = tokio::time::timeout(REQUEST_TIMEOUT, self.handle.next_request())
            .await
            .with_context(|| {
                format!(
                    "no request within {REQUEST_TIMEOUT:?}; expected {} {}",
                    expected.method, expected.path
                )
            })?
            .context("the client was dropped before sending the expected request")?;
        let (parts, body) = req.into_parts();
        let body = body
            .collect_bytes()
            .await
            .context("reading the request body")?;
        let rec = RecordedRequest {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().unwrap_or("").to_owned(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body: body.to_vec(),
        };
        let checked = expected.check(&rec);
        let (status, response) = match &checked {
            Ok(()) => (status, response.clone()),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "reason": "InternalError", "code": 500, "message": format!("ApiServerVerifier: {e}")}),
            ),
        };
        let res = http::Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&response)?))?;
        send.send_response(res);
        checked.map(|()| rec)
    }

    /// Waits until the client is dropped; fails if it sends any further request.
    pub async fn finish(mut self) -> anyhow::Result<()> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.handle.next_request()).await {
            Ok(None) => Ok(()),
            Ok(Some((req, _))) => bail!("unexpected extra request {} {}", req.method(), req.uri()),
            Err(_) => bail!("the client was not dropped within {REQUEST_TIMEOUT:?}"),
        }
    }
}

/// Re-evaluates `probe` every 20 ms until it yields a value; fails after `timeout`, naming
/// `what`. For conditions that cannot be awaited directly (for example a reflector store's
/// contents).
pub async fn eventually<T>(
    timeout: Duration,
    what: &str,
    mut probe: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
