//! The telemetry endpoints, used by Prometheus and by the DaemonSet's probes. They are served
//! on two listeners (one when both addresses are the same), each answering only its own paths
//! ([`Endpoints`]):
//!
//! - metrics (`--metrics-address`): `GET /metrics`, [`Metrics::encode`],
//!   `text/plain; version=0.0.4`, from the last map snapshot (a scrape reads no map);
//! - health (`--health-address`): `GET /healthz` (also `/livez`): 200 while the agent's tasks
//!   run, 503 with the reason once one has failed (the liveness probe restarts the pod);
//!   `GET /readyz`: 200 once the node role has synced the maps from the initial lists, 503
//!   before (the readiness probe; a rolling update waits for it).

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, warn};

use super::metrics::Metrics;

/// Liveness and readiness, set by the roles.
#[derive(Debug, Default)]
pub struct Health {
    ready: std::sync::atomic::AtomicBool,
    failed: Mutex<Option<String>>,
}

impl Health {
    /// Marks the agent ready (the node role's first sync is done).
    pub fn set_ready(&self) {
        self.ready.store(true, std::sync::atomic::Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the agent as broken: `/healthz` fails from now on with `reason`.
    pub fn set_failed(&self, reason: impl Into<String>) {
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason.into());
    }

    pub fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        res.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    res
}

/// What one listener serves: `/metrics` with `metrics`, `/healthz`, `/livez` and `/readyz`
/// with `health`; any other path is 404.
#[derive(Clone, Debug, Default)]
pub struct Endpoints {
    pub metrics: Option<Arc<Metrics>>,
    pub health: Option<Arc<Health>>,
}

/// The response to one request (no I/O: easy to test).
pub fn respond(method: &Method, path: &str, endpoints: &Endpoints) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "GET only\n".into());
    }
    match (path, &endpoints.metrics, &endpoints.health) {
        ("/metrics", Some(metrics), _) => text(
            StatusCode::OK,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            metrics.encode(),
        ),
        ("/healthz" | "/livez", _, Some(health)) => match health.failure() {
            None => text(StatusCode::OK, PLAIN, "ok\n".into()),
            Some(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("{reason}\n"),
            ),
        },
        ("/readyz", _, Some(health)) => match (health.failure(), health.is_ready()) {
            (Some(reason), _) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("{reason}\n"),
            ),
            (None, true) => text(StatusCode::OK, PLAIN, "ok\n".into()),
            (None, false) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                "waiting for the initial ServiceImports and EndpointSlices\n".into(),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n".into()),
    }
}

/// Binds `addr` (port 0 picks a free port; see the returned address).
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Serves `endpoints` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, endpoints: Endpoints) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "telemetry server: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let res = respond(req.method(), req.uri().path(), &endpoints);
                async move { Ok::<_, Infallible>(res) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(%peer, error = %e, "telemetry connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    async fn body(res: Response<Full<Bytes>>) -> (StatusCode, String) {
        let status = res.status();
        let bytes = res.into_body().collect().await.map(|b| b.to_bytes());
        (
            status,
            String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned(),
        )
    }

    #[tokio::test]
    async fn probes_follow_the_health_state() {
        let (m, h) = (
            Arc::new(Metrics::new(None, false)),
            Arc::new(Health::default()),
        );
        let both = Endpoints {
            metrics: Some(m),
            health: Some(h.clone()),
        };
        let get = |p: &str| respond(&Method::GET, p, &both);
        assert_eq!(body(get("/healthz")).await.0, StatusCode::OK);
        assert_eq!(
            body(get("/readyz")).await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        h.set_ready();
        assert_eq!(body(get("/readyz")).await.0, StatusCode::OK);
        let (status, text) = body(get("/metrics")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(text.contains("# TYPE mcs_leader gauge"), "{text}");
        h.set_failed("the node role stopped");
        assert_eq!(
            body(get("/healthz")).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the node role stopped\n".to_owned()
            )
        );
        assert_eq!(body(get("/nope")).await.0, StatusCode::NOT_FOUND);
        assert_eq!(
            body(respond(&Method::POST, "/metrics", &both)).await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    /// `GET path` over TCP: (status code, body).
    async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        let mut text = String::new();
        s.read_to_string(&mut text).await.expect("read");
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
        (code, body.unwrap_or_default())
    }

    #[tokio::test]
    async fn health_and_metrics_answer_on_their_own_listeners() {
        let (m, h) = (
            Arc::new(Metrics::new(None, false)),
            Arc::new(Health::default()),
        );
        let localhost = SocketAddr::from(([127, 0, 0, 1], 0));
        let (metrics_listener, metrics_addr) = bind(localhost).await.expect("bind");
        let (health_listener, health_addr) = bind(localhost).await.expect("bind");
        let metrics_only = Endpoints {
            metrics: Some(m),
            health: None,
        };
        let health_only = Endpoints {
            metrics: None,
            health: Some(h.clone()),
        };
        let tasks = [
            tokio::spawn(serve(metrics_listener, metrics_only)),
            tokio::spawn(serve(health_listener, health_only)),
        ];
        h.set_ready();
        assert_eq!(
            http_get(health_addr, "/healthz").await,
            (200, "ok\n".into())
        );
        assert_eq!(http_get(health_addr, "/readyz").await.0, 200);
        assert_eq!(http_get(health_addr, "/metrics").await.0, 404);
        let (code, text) = http_get(metrics_addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(text.contains("# TYPE mcs_leader gauge"), "{text}");
        for path in ["/healthz", "/livez", "/readyz"] {
            assert_eq!(http_get(metrics_addr, path).await.0, 404, "{path}");
        }
        h.set_failed("the controller task ended");
        assert_eq!(
            http_get(health_addr, "/healthz").await,
            (503, "the controller task ended\n".into())
        );
        for t in tasks {
            t.abort();
        }
    }
}
