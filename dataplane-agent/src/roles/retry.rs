//! When failed writes are tried again, for the roles that write (the controller's API writes,
//! the node's map writes): 1 s after the first failure, then twice as long each time the retry
//! fails again, up to a minute, and from 1 s again once nothing is left to retry. A pass that
//! other work caused does not move the schedule, so steady churn elsewhere neither hammers a
//! failing write nor postpones its retry.

use std::time::Duration;

use tokio::time::Instant;

/// The first wait after a failure.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two retries.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// The retry schedule of a set of failed writes.
#[derive(Clone, Copy, Debug, Default)]
pub struct RetrySchedule {
    /// When the next retry is due, and the wait that led to it.
    next: Option<(Instant, Duration)>,
}

impl RetrySchedule {
    /// When the next retry is due (`None`: nothing to retry).
    pub fn deadline(&self) -> Option<Instant> {
        self.next.map(|(at, _)| at)
    }

    /// Whether a retry is due at `now`.
    pub fn is_due(&self, now: Instant) -> bool {
        self.next.is_some_and(|(at, _)| now >= at)
    }

    /// Records the end of a pass at `now`: whether writes are still failing (`pending`), and
    /// whether the pass was the due retry (`retried`).
    pub fn after_pass(&mut self, pending: bool, retried: bool, now: Instant) {
        self.next = match self.next {
            _ if !pending => None,
            None => Some((now + FIRST_RETRY, FIRST_RETRY)),
            Some((_, wait)) if retried => {
                let wait = (wait * 2).min(MAX_RETRY);
                Some((now + wait, wait))
            }
            kept => kept,
        };
    }
}

/// Resolves at `deadline`, or never when there is none.
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_retried_after_one_second_then_doubling_up_to_a_minute() {
        let start = Instant::now();
        let mut schedule = RetrySchedule::default();
        assert_eq!(schedule.deadline(), None);
        assert!(!schedule.is_due(start));

        schedule.after_pass(true, false, start);
        assert_eq!(schedule.deadline(), Some(start + FIRST_RETRY));
        assert!(!schedule.is_due(start));
        assert!(schedule.is_due(start + FIRST_RETRY));

        let mut now = start;
        let mut waits = Vec::new();
        for _ in 0..9 {
            now = schedule.deadline().unwrap();
            schedule.after_pass(true, true, now);
            waits.push((schedule.deadline().unwrap() - now).as_secs());
        }
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60, 60, 60]);

        // Passes caused by other changes leave the due retry where it is.
        let due = schedule.deadline();
        schedule.after_pass(true, false, now + Duration::from_secs(5));
        assert_eq!(schedule.deadline(), due);

        // Once everything is written the schedule ends, and a later failure starts at 1 s.
        schedule.after_pass(false, false, now);
        assert_eq!(schedule.deadline(), None);
        schedule.after_pass(true, false, now);
        assert_eq!(schedule.deadline(), Some(now + FIRST_RETRY));
    }
}
