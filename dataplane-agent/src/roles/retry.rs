//! When failed writes are tried again, for the roles that write (the controller's API writes,
//! the node's map writes). Each service has its own schedule: 1 s after its first failure,
//! then twice as long each time a try of it fails again, up to a minute, and none once a try
//! succeeds. A service that keeps failing (its namespace does not exist in this cluster) thus
//! never delays another's retry, and steady churn elsewhere neither hammers a failing write
//! nor postpones its retry.

use std::{collections::BTreeMap, time::Duration};

use tokio::time::Instant;

/// The first wait after a failure.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two retries.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// The failed writes of a role, by key (a service), each on its own schedule. A pass tells it
/// which keys it tries ([`Retries::take_due`], [`Retries::attempt`]) and which of them failed
/// ([`Retries::failed`]), then ends ([`Retries::end_pass`]).
#[derive(Debug)]
pub struct Retries<K> {
    /// Keys whose last try failed: when their retry is due, and the wait before it.
    waiting: BTreeMap<K, (Instant, Duration)>,
    /// Keys that had failed and are tried in the current pass, with the wait before this try.
    trying: BTreeMap<K, Duration>,
}

impl<K> Default for Retries<K> {
    fn default() -> Self {
        Self {
            waiting: BTreeMap::new(),
            trying: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> Retries<K> {
    /// When the next retry is due (`None`: nothing to retry). A scan: a handful of keys fail
    /// at a time.
    pub fn deadline(&self) -> Option<Instant> {
        self.waiting.values().map(|(at, _)| *at).min()
    }

    /// The keys whose retry is due at `now`, tried in this pass.
    pub fn take_due(&mut self, now: Instant) -> Vec<K> {
        let due: Vec<K> = self
            .waiting
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in &due {
            self.attempt(key);
        }
        due
    }

    /// `key` is tried in this pass (its retry, or a change of its own): a failure now counts
    /// as a failed retry.
    pub fn attempt(&mut self, key: &K) {
        if let Some((_, wait)) = self.waiting.remove(key) {
            self.trying.insert(key.clone(), wait);
        }
    }

    /// A write of `key` failed at `now`. A try that fails again doubles the wait; a key that
    /// already waits (it failed earlier in this pass, or was not tried) keeps its schedule.
    pub fn failed(&mut self, key: K, now: Instant) {
        if self.waiting.contains_key(&key) {
            return;
        }
        let wait = match self.trying.remove(&key) {
            Some(wait) => (wait * 2).min(MAX_RETRY),
            None => FIRST_RETRY,
        };
        self.waiting.insert(key, (now + wait, wait));
    }

    /// Ends a pass: the keys tried in it that did not fail are written.
    pub fn end_pass(&mut self) {
        self.trying.clear();
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

    /// One pass at `now` that tries the due keys and fails those in `failing`; the due keys.
    fn pass(
        retries: &mut Retries<&'static str>,
        now: Instant,
        failing: &[&'static str],
    ) -> Vec<&'static str> {
        let due = retries.take_due(now);
        for key in failing {
            retries.failed(key, now);
        }
        retries.end_pass();
        due
    }

    #[test]
    fn a_failure_is_retried_after_one_second_then_doubling_up_to_a_minute() {
        let start = Instant::now();
        let mut retries = Retries::default();
        assert_eq!(retries.deadline(), None);
        assert!(pass(&mut retries, start, &[]).is_empty());

        pass(&mut retries, start, &["a"]);
        assert_eq!(retries.deadline(), Some(start + FIRST_RETRY));
        assert!(retries.take_due(start).is_empty());

        let mut now = start;
        let mut waits = Vec::new();
        for _ in 0..9 {
            now = retries.deadline().unwrap();
            assert_eq!(pass(&mut retries, now, &["a"]), ["a"]);
            waits.push((retries.deadline().unwrap() - now).as_secs());
        }
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60, 60, 60]);

        // Passes of other work, and a second failure of "a" within one pass, leave its retry
        // where it is.
        let due = retries.deadline();
        pass(&mut retries, now + Duration::from_secs(5), &["a"]);
        assert_eq!(retries.deadline(), due);

        // A try that succeeds ends the schedule, and a later failure starts at 1 s.
        now = due.unwrap();
        assert_eq!(pass(&mut retries, now, &[]), ["a"]);
        assert_eq!(retries.deadline(), None);
        pass(&mut retries, now, &["a"]);
        assert_eq!(retries.deadline(), Some(now + FIRST_RETRY));
    }

    #[test]
    fn a_write_that_keeps_failing_never_delays_another_ones_retry() {
        let mut now = Instant::now();
        let mut retries = Retries::default();
        pass(&mut retries, now, &["missing-namespace"]);
        for _ in 0..8 {
            now = retries.deadline().unwrap();
            pass(&mut retries, now, &["missing-namespace"]);
        }
        assert_eq!(retries.deadline(), Some(now + MAX_RETRY));

        // Another service fails once: it is retried 1 s later, alone, and is done.
        now += Duration::from_secs(3);
        pass(&mut retries, now, &["web"]);
        assert_eq!(retries.deadline(), Some(now + FIRST_RETRY));
        assert_eq!(pass(&mut retries, now + FIRST_RETRY, &[]), ["web"]);
        assert_eq!(
            retries.deadline(),
            Some(now - Duration::from_secs(3) + MAX_RETRY)
        );
    }

    #[test]
    fn a_change_of_its_own_tries_a_failed_key_before_its_retry_is_due() {
        let now = Instant::now();
        let mut retries = Retries::default();
        pass(&mut retries, now, &["a"]);
        pass(&mut retries, now + FIRST_RETRY, &["a"]);
        assert_eq!(retries.deadline(), Some(now + FIRST_RETRY * 3));

        // Its own change is written in a pass before the retry: success ends the schedule.
        let later = now + FIRST_RETRY * 2;
        assert!(retries.take_due(later).is_empty());
        retries.attempt(&"a");
        retries.end_pass();
        assert_eq!(retries.deadline(), None);

        // Failing that way counts as a failed try: the wait doubles.
        pass(&mut retries, later, &["a"]);
        retries.attempt(&"a");
        retries.failed("a", later);
        retries.end_pass();
        assert_eq!(retries.deadline(), Some(later + FIRST_RETRY * 2));
    }
}
