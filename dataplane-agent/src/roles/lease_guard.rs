//! The controller's hold on its Lease, checked. kube-lease-manager reports a lost lease only
//! once it reaches the API server again: a leader cut off from it would go on merging, and
//! once back, writing, while another replica holds the Lease. Like client-go's renew deadline,
//! the leader here steps down on its own when it has not seen its own renewal in time, and
//! takes up again when it sees one.

use std::time::Duration;

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::Api;
use tokio::sync::watch;
use tracing::{info, warn};

/// What the guard needs to know of the Lease.
pub struct LeaseTerms {
    /// The Lease's name (in the `leases` Api's namespace).
    pub name: String,
    /// This replica's holder identity.
    pub identity: String,
    /// How long a renewal holds the Lease.
    pub duration: Duration,
    /// How long before the Lease expires the manager renews it.
    pub renew_grace: Duration,
}

impl LeaseTerms {
    /// The last moment this replica leads after a renewal at `renewed`: half the renew grace
    /// before the Lease expires, so the controller has stopped before another replica may take
    /// it (the manager renews a whole grace before, so a working leader never gets there).
    fn deadline(&self, renewed: Timestamp) -> Timestamp {
        let margin = self.duration.saturating_sub(self.renew_grace / 2);
        let margin = i64::try_from(margin.as_millis()).unwrap_or(i64::MAX);
        renewed
            .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(margin))
            .unwrap_or(renewed)
    }

    /// How often the Lease is read while leading: four times per renew grace, so a renewal is
    /// seen well before the deadline.
    fn check_every(&self) -> Duration {
        (self.renew_grace / 4).max(Duration::from_millis(100))
    }
}

/// Forwards the lease manager's `manager` (whether it holds the Lease) to `leading`, except
/// that while the manager says it holds the Lease, `leading` is true only until the deadline of
/// the last renewal this replica saw in the Lease (read every [`LeaseTerms::check_every`]).
/// Returns when `manager` closes.
pub async fn guard(
    leases: Api<Lease>,
    terms: LeaseTerms,
    mut manager: watch::Receiver<bool>,
    leading: watch::Sender<bool>,
) {
    let mut deadline: Option<Timestamp> = None;
    let mut stepped_down = false;
    loop {
        let held = *manager.borrow_and_update();
        if !held {
            deadline = None;
            leading.send_if_modified(|l| std::mem::replace(l, false));
            if manager.changed().await.is_err() {
                return;
            }
            continue;
        }
        // On acquiring it the manager has just written the Lease: a deadline from now until
        // the Lease is read.
        let now = Timestamp::now();
        let deadline_now = deadline.get_or_insert_with(|| terms.deadline(now));
        // A read that hangs (a half-open connection, a stuck API server) must not keep this
        // replica leading past its deadline: it is given until then. Once past it (stepped
        // down, nothing left to protect), a slow read gets a whole lease duration, so that a
        // slow API server still lets it see a renewal and lead again.
        let time_limit = std::time::Duration::try_from(deadline_now.duration_since(now))
            .ok()
            .filter(|d| !d.is_zero())
            .unwrap_or(terms.duration);
        match tokio::time::timeout(time_limit, leases.get_opt(&terms.name)).await {
            Err(_) => warn!("reading the controller lease timed out"),
            Ok(Ok(Some(lease))) => {
                let spec = lease.spec.unwrap_or_default();
                if spec.holder_identity.as_deref() != Some(terms.identity.as_str()) {
                    // Another replica holds it: the manager will say so once it looks.
                    *deadline_now = now;
                } else if let Some(renewed) = spec.renew_time {
                    *deadline_now = (*deadline_now).max(terms.deadline(renewed.0));
                }
            }
            Ok(Ok(None)) => *deadline_now = now,
            Ok(Err(e)) => warn!(error = %e, "cannot read the controller lease"),
        }
        let lead = Timestamp::now() < *deadline_now;
        let changed = leading.send_if_modified(|l| std::mem::replace(l, lead) != lead);
        if changed && !lead {
            stepped_down = true;
            warn!("no renewal of the controller lease seen in time; stepping down until one is");
        } else if changed && stepped_down {
            stepped_down = false;
            info!("the controller lease is renewed again; leading");
        }
        tokio::select! {
            () = tokio::time::sleep(terms.check_every()) => {}
            c = manager.changed() => if c.is_err() { return },
        }
    }
}
