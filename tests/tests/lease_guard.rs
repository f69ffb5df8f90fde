//! The controller's lease guard against an API server that stops answering (a tower-test mock:
//! a request it never answers hangs, as on a half-open connection).

use std::time::Duration;

use dataplane_agent::roles::lease_guard::{LeaseTerms, guard};
use http::{Method, StatusCode};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::Api;
use serde_json::json;
use tests::fixtures::{ExpectedRequest, mock_client};
use tokio::sync::watch;

/// A leader whose lease read hangs steps down by its deadline (half the renew grace before the
/// Lease expires), not when the read returns: another replica may lead after the expiry.
#[tokio::test]
async fn a_hanging_lease_read_does_not_keep_the_leader_leading() {
    let (client, mut api) = mock_client();
    let leases: Api<Lease> = Api::namespaced(client, "mcs-system");
    let terms = LeaseTerms {
        name: "ctl".into(),
        identity: "me".into(),
        duration: Duration::from_secs(2),
        renew_grace: Duration::from_secs(1),
    };
    let (_manager_tx, manager) = watch::channel(true);
    let (leading_tx, mut leading) = watch::channel(false);
    let task = tokio::spawn(guard(leases, terms, manager, leading_tx));

    let renewed = Timestamp::now();
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
    .expect("the first read");
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
