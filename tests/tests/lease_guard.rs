//! The controller's lease guard against an API server that answers slowly or not at all (a
//! tower-test mock: a request it never answers hangs, as on a half-open connection).

use std::time::Duration;

use dataplane_agent::roles::lease_guard::{LeaseTerms, guard};
use http::{Method, StatusCode};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::Api;
use serde_json::json;
use tests::fixtures::{ApiServerVerifier, ExpectedRequest, mock_client};
use tokio::sync::watch;

/// Answers the guard's next read: the Lease held by `me`, renewed at `renewed`.
async fn answer_renewed(api: &mut ApiServerVerifier, renewed: Timestamp) {
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ctl", "namespace": "mcs-system"},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 2,
                 "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}
    });
    api.expect(
        &ExpectedRequest::new(
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/mcs-system/leases/ctl",
        ),
        StatusCode::OK,
        &lease,
    )
    .await
    .expect("a lease read");
}

/// The guard of a Lease of 2 s renewed 1 s before expiry (deadline: 1.5 s after a renewal,
/// reads every 250 ms), held by `me`, and what it says.
fn start_guard() -> (
    ApiServerVerifier,
    watch::Sender<bool>,
    watch::Receiver<bool>,
    tokio::task::JoinHandle<()>,
) {
    let (client, api) = mock_client();
    let leases: Api<Lease> = Api::namespaced(client, "mcs-system");
    let terms = LeaseTerms {
        name: "ctl".into(),
        identity: "me".into(),
        duration: Duration::from_secs(2),
        renew_grace: Duration::from_secs(1),
    };
    let (manager_tx, manager) = watch::channel(true);
    let (leading_tx, leading) = watch::channel(false);
    let task = tokio::spawn(guard(leases, terms, manager, leading_tx));
    (api, manager_tx, leading, task)
}

/// A slow API server (each read answered after more than two read periods, well within the
/// deadline) keeps the leader leading: every read sees the renewal.
#[tokio::test]
async fn slow_lease_reads_keep_the_leader_leading() {
    let (mut api, _manager, mut leading, task) = start_guard();
    answer_renewed(&mut api, Timestamp::now()).await;
    tokio::time::timeout(Duration::from_secs(5), leading.wait_for(|l| *l))
        .await
        .expect("leading after the read")
        .expect("the guard runs");
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(600)).await;
        answer_renewed(&mut api, Timestamp::now()).await;
        assert!(
            *leading.borrow(),
            "stepped down while its reads are slow but in time"
        );
    }
    task.abort();
}

/// A leader whose lease read hangs steps down by its deadline (half the renew grace before the
/// Lease expires), not when the read returns: another replica may lead after the expiry.
#[tokio::test]
async fn a_hanging_lease_read_does_not_keep_the_leader_leading() {
    let (mut api, _manager, mut leading, task) = start_guard();

    let renewed = Timestamp::now();
    answer_renewed(&mut api, renewed).await;
    tokio::time::timeout(Duration::from_secs(5), leading.wait_for(|l| *l))
        .await
        .expect("leading after the read")
        .expect("the guard runs");

    // The next reads are never answered: the guard steps down at its deadline, 1.5 s after
    // the renewal it saw.
    tokio::time::timeout(Duration::from_secs(5), leading.wait_for(|l| !*l))
        .await
        .expect("stepped down while its read hangs")
        .expect("the guard runs");
    let after = Timestamp::now().duration_since(renewed);
    assert!(
        after >= k8s_openapi::jiff::SignedDuration::from_millis(1_400),
        "stepped down too early: {after:?}"
    );
    task.abort();
}
