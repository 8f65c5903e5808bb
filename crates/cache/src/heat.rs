//! Heat that lasts across windows: each window's merged counts are added to a history that
//! decays by a constant share per window, so objects that are moderately but steadily hot
//! rank by their rate rather than by one window's noise. [`DecayedHeat::select`] splits what
//! fits a budget into *hot* objects (heat at least a threshold, for the admission policy's
//! [`plan`](crate::DramCachePolicy::plan)) and *lukewarm* ones (at least one access, for
//! [`fill`](crate::DramCachePolicy::fill)). Gengar's servers rank objects with it.
//!
//! ```
//! use dmkit_cache::{DecayedHeat, HotObject};
//!
//! let heat = DecayedHeat::new(0.5).unwrap();
//! let seen = |obj, count| HotObject { obj, count, size: 64 };
//! heat.fold(&[seen(1, 8), seen(2, 2)]);
//! heat.fold(&[seen(2, 2)]); // object 1 not seen: its heat halves to 4
//! let (hot, lukewarm) = heat.select(1 << 10, 4, |_| Some(64));
//! assert_eq!(hot.iter().map(|h| h.obj).collect::<Vec<_>>(), vec![1]);
//! assert_eq!(lukewarm.iter().map(|h| h.obj).collect::<Vec<_>>(), vec![2]);
//! ```

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::error::CacheError;
use crate::selector::HotObject;

/// Per-object heat over windows (see the module docs).
#[derive(Debug)]
pub struct DecayedHeat {
    decay: f64,
    heat: Mutex<HashMap<u64, f64>>,
}

impl DecayedHeat {
    /// Heat keeping `decay` of itself from one window to the next (0: every window stands
    /// alone); `decay` must be in [0, 1).
    pub fn new(decay: f64) -> Result<Self, CacheError> {
        if !(0.0..1.0).contains(&decay) {
            return Err(CacheError::OutOfRange {
                what: "heat decay (in [0, 1))",
                value: decay,
            });
        }
        Ok(Self {
            decay,
            heat: Mutex::new(HashMap::new()),
        })
    }

    /// Ends a window: decays every object's heat (forgetting what fell under a quarter of an
    /// access, which bounds the table) and adds the window's counts.
    pub fn fold(&self, window: &[HotObject]) {
        let mut heat = self.heat.lock();
        heat.retain(|_, h| {
            *h *= self.decay;
            *h >= 0.25
        });
        for r in window {
            *heat.entry(r.obj).or_default() += r.count as f64;
        }
    }

    /// The objects with at least one access of heat that fit `capacity` bytes, hottest
    /// first, split at `min_hot` into (hot, lukewarm). `size_of` gives an object's size;
    /// `None` means it is gone, and it is forgotten.
    pub fn select(
        &self,
        capacity: u64,
        min_hot: u64,
        size_of: impl Fn(u64) -> Option<u64>,
    ) -> (Vec<HotObject>, Vec<HotObject>) {
        let mut ranked: Vec<(f64, u64)> = (self.heat.lock().iter())
            .filter(|(_, h)| **h >= 1.0)
            .map(|(o, h)| (*h, *o))
            .collect();
        ranked.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let (mut hot, mut lukewarm, mut bytes) = (Vec::new(), Vec::new(), 0);
        for (h, obj) in ranked {
            let Some(size) = size_of(obj) else {
                self.forget(obj);
                continue;
            };
            if bytes + size > capacity {
                continue;
            }
            bytes += size;
            let o = HotObject {
                obj,
                count: h.round() as u64,
                size,
            };
            if h >= min_hot as f64 {
                hot.push(o);
            } else {
                lukewarm.push(o);
            }
        }
        (hot, lukewarm)
    }

    /// Drops an object's heat (it went away).
    pub fn forget(&self, obj: u64) {
        self.heat.lock().remove(&obj);
    }

    /// Objects with some heat remembered.
    pub fn len(&self) -> usize {
        self.heat.lock().len()
    }

    /// Whether no object has heat.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heat_decays_is_forgotten_and_respects_the_budget() {
        assert!(DecayedHeat::new(1.0).is_err());
        let heat = DecayedHeat::new(0.5).unwrap();
        let seen = |obj, count| HotObject {
            obj,
            count,
            size: 100,
        };
        heat.fold(&[seen(1, 10), seen(2, 9), seen(3, 1)]);
        // Room for two: the third is skipped, not counted.
        let (hot, luke) = heat.select(200, 2, |_| Some(100));
        assert_eq!((hot.len(), luke.len()), (2, 0));
        // Object 2 went away: forgotten.
        let (hot, _) = heat.select(1000, 2, |o| (o != 2).then_some(100));
        assert_eq!(hot.iter().map(|h| h.obj).collect::<Vec<_>>(), vec![1]);
        assert_eq!(heat.len(), 2);
        for _ in 0..6 {
            heat.fold(&[]);
        }
        assert!(heat.is_empty());
    }
}
