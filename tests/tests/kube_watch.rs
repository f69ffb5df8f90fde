//! A member's watches against a fake API server: how their health is kept.

use std::{sync::Arc, time::Duration};

use dataplane_agent::{source::kube::MemberWatch, telemetry::metrics::Metrics};
use dataplane_core::{fixtures::cluster, model::Interner};
use tests::fake_apiserver::FakeApiServer;
use tokio::sync::{Notify, mpsc};

/// A watch whose lists keep failing stays failing since its first failure: each retry's start
/// (kube-runtime's `Init`, sent before the list request) is not taken for an answer, so the
/// failure is not cleared and restarted at every retry (nor logged as "works again").
#[tokio::test]
async fn a_watch_that_keeps_failing_stays_failing_since_its_first_failure() -> anyhow::Result<()> {
    let server = FakeApiServer::start().await?;
    server.forbid("serviceexports");
    let (tx, _rx) = mpsc::unbounded_channel();
    let watch = MemberWatch::start(
        cluster("west"),
        server.client(),
        Duration::from_secs(3600),
        Arc::new(Metrics::default()),
        Arc::new(Interner::new()),
        tx,
        Arc::new(Notify::new()),
    );
    let exports = &watch.watches[1];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(since) = exports.failing_since() {
            break since;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch never failed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The watch backs off 250 ms, 500 ms, 1 s: three retries, each failing again.
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(exports.failing_since(), Some(first));
    }
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/serviceexports") && !r.is_watch())
        .count();
    // At 0, 0.25, 0.75 and 1.75 s (every 250 ms, 9 or more, when each retry reset it).
    assert!((3..=5).contains(&lists), "{lists} lists in about 2 s");
    assert!(watch.watches[0].failing_since().is_none());

    server.allow("serviceexports");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while exports.failing_since().is_some() || !exports.listed() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch never recovered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
