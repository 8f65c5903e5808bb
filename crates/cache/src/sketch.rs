//! A count-min sketch: approximate per-object counts in fixed memory.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::CacheError;

/// Approximate counts of many objects in `width × depth` counters.
///
/// Error bound (Cormode & Muthukrishnan): with `width = ⌈e/ε⌉` and `depth = ⌈ln(1/δ)⌉`, an
/// estimate is never below the true count, and exceeds it by more than `ε·N` (N = all
/// increments so far) with probability at most `δ`. Updates are *conservative* (only the
/// rows at the minimum grow), which keeps both guarantees and tightens the estimates.
#[derive(Debug, Clone)]
pub struct CountMinSketch {
    epsilon: f64,
    width: usize,
    depth: usize,
    counters: Vec<u32>,
    total: u64,
}

impl CountMinSketch {
    /// A sketch whose estimates exceed true counts by at most `epsilon · total` with
    /// probability at least `1 - delta`.
    pub fn with_error_bound(epsilon: f64, delta: f64) -> Result<Self, CacheError> {
        if !(epsilon > 0.0 && epsilon < 1.0 && delta > 0.0 && delta < 1.0) {
            return Err(CacheError::InvalidErrorBound { epsilon, delta });
        }
        let width = (std::f64::consts::E / epsilon).ceil() as usize;
        let depth = (1.0 / delta).ln().ceil().max(1.0) as usize;
        Ok(Self {
            epsilon,
            width,
            depth,
            counters: vec![0; width * depth],
            total: 0,
        })
    }

    /// Counters per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Rows (independent hash functions).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Memory held by the counters, in bytes.
    pub fn memory_bytes(&self) -> usize {
        self.counters.len() * std::mem::size_of::<u32>()
    }

    /// Sum of all increments since the last clear.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The most an estimate may exceed the true count (with probability `1 - delta`).
    pub fn error_bound(&self) -> u64 {
        (self.epsilon * self.total as f64).ceil() as u64
    }

    fn slot(&self, row: usize, obj: u64) -> usize {
        let h = xxh3_64_with_seed(&obj.to_le_bytes(), row as u64);
        row * self.width + (h % self.width as u64) as usize
    }

    /// Adds `n` to `obj`'s count and returns its new estimate.
    pub fn increment(&mut self, obj: u64, n: u64) -> u64 {
        self.total = self.total.saturating_add(n);
        let current = self.estimate(obj);
        let target = current.saturating_add(n).min(u64::from(u32::MAX)) as u32;
        for row in 0..self.depth {
            let slot = self.slot(row, obj);
            let c = &mut self.counters[slot];
            *c = (*c).max(target);
        }
        u64::from(target)
    }

    /// `obj`'s estimated count: at least the true count.
    pub fn estimate(&self, obj: u64) -> u64 {
        (0..self.depth)
            .map(|r| u64::from(self.counters[self.slot(r, obj)]))
            .min()
            .unwrap_or(0)
    }

    /// Forgets every count.
    pub fn clear(&mut self) {
        self.counters.fill(0);
        self.total = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_follow_the_error_bound() {
        let s = CountMinSketch::with_error_bound(0.01, 0.01).unwrap();
        assert_eq!(s.width(), 272);
        assert_eq!(s.depth(), 5);
        assert_eq!(s.memory_bytes(), 272 * 5 * 4);
    }

    #[test]
    fn invalid_error_bound_is_refused() {
        assert!(CountMinSketch::with_error_bound(0.0, 0.1).is_err());
        assert!(CountMinSketch::with_error_bound(0.1, 1.0).is_err());
        assert!(CountMinSketch::with_error_bound(f64::NAN, 0.1).is_err());
    }

    #[test]
    fn estimate_is_exact_without_collisions_and_cleared_to_zero() {
        let mut s = CountMinSketch::with_error_bound(0.001, 0.01).unwrap();
        assert_eq!(s.increment(5, 3), 3);
        assert_eq!(s.increment(5, 2), 5);
        assert_eq!(s.estimate(5), 5);
        s.clear();
        assert_eq!(s.estimate(5), 0);
        assert_eq!(s.total(), 0);
    }
}
