//! Latencies of one run and the report line printed for it.

use std::time::Duration;

/// What the clients of one run measured.
#[derive(Default)]
pub struct Stats {
    latencies: Vec<Duration>,
    pub errors: u64,
    /// Compare-and-swap attempts that lost to another writer (not errors).
    pub conflicts: u64,
    /// Keys or events seen (lists, watches), where the workload counts them.
    pub items: u64,
}

impl Stats {
    pub fn record(&mut self, latency: Duration) {
        self.latencies.push(latency);
    }

    pub fn merge(&mut self, other: Stats) {
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
        self.conflicts += other.conflicts;
        self.items += other.items;
    }

    pub fn ops(&self) -> usize {
        self.latencies.len()
    }

    /// The `p`-quantile (0..=1) of the latencies, in milliseconds.
    pub fn percentile_ms(&mut self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        self.latencies.sort_unstable();
        let i = ((self.latencies.len() as f64 * p).ceil() as usize).clamp(1, self.latencies.len()) - 1;
        self.latencies[i].as_secs_f64() * 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut s = Stats::default();
        for ms in 1..=1000 {
            s.record(Duration::from_millis(ms));
        }
        assert_eq!((s.percentile_ms(0.5), s.percentile_ms(0.99), s.percentile_ms(0.999)), (500.0, 990.0, 999.0));
        assert_eq!(Stats::default().percentile_ms(0.5), 0.0);
    }
}
