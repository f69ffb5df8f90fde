//! Latency summaries.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of durations, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Summarizes `samples` (sorted in place); all zero when there are none.
pub fn summarize(samples: &mut [Duration]) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    samples.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| ms(samples[percentile_index(samples.len(), q)]);
    let total: Duration = samples.iter().sum();
    Summary {
        samples: samples.len(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        max_ms: ms(samples[samples.len() - 1]),
        mean_ms: ms(total) / samples.len() as f64,
    }
}

/// The middle value (the upper one of an even count), sorting `v` in place; 0 when empty.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Nearest-rank percentile: the smallest sample with at least `q` of the samples at or below it.
fn percentile_index(len: usize, q: f64) -> usize {
    ((q * len as f64).ceil() as usize).clamp(1, len) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let s = summarize(&mut v);
        assert_eq!(s.samples, 100);
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p99_ms, 99.0);
        assert_eq!(s.max_ms, 100.0);
        assert!((s.mean_ms - 50.5).abs() < 1e-9);
        let mut one = vec![Duration::from_micros(1500)];
        assert_eq!(summarize(&mut one).p99_ms, 1.5);
        assert_eq!(summarize(&mut []), Summary::default());
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut []), 0.0);
    }
}
