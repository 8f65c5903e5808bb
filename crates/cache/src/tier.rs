//! A DRAM tier in one piece: counting ([`AccessCounter`]), selection ([`GlobalSelector`]),
//! admission ([`DramCachePolicy`]) and residency (the copies themselves) for a process that
//! keeps hot objects' bytes in its own memory. Reads go through [`HotTier::get`] (which counts
//! them); [`HotTier::window`] ends a window, drops what the policy evicts and loads what it
//! promotes.
//!
//! ```
//! use dmkit_cache::{AdmissionConfig, HotTier};
//!
//! let tier: HotTier<Vec<u8>> = HotTier::new(AdmissionConfig { capacity_bytes: 1024, ..Default::default() })?;
//! for _ in 0..50 {
//!     assert!(tier.get(7).is_none()); // a miss, counted: the caller reads object 7 remotely
//! }
//! tier.get(8);
//! // End of the window: object 7 (64 bytes) is hot enough to copy in.
//! let (promoted, evicted) = tier.window(|_obj| Some(64), |obj| Some(vec![obj as u8; 64]));
//! assert_eq!((promoted, evicted), (1, 0));
//! assert_eq!(tier.get(7), Some(vec![7; 64]));
//! assert_eq!(tier.hits(), 1);
//! # Ok::<(), dmkit_cache::CacheError>(())
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::admission::{AdmissionConfig, DramCachePolicy};
use crate::counter::{AccessCounter, CounterConfig};
use crate::error::CacheError;
use crate::selector::GlobalSelector;

/// Hot objects' copies in this process's DRAM, chosen window by window (see the module docs).
#[derive(Debug)]
pub struct HotTier<V> {
    capacity: u64,
    counter: AccessCounter,
    selector: GlobalSelector,
    policy: Mutex<DramCachePolicy>,
    resident: Mutex<HashMap<u64, V>>,
    hits: AtomicU64,
}

impl<V: Clone> HotTier<V> {
    /// A tier of `config.capacity_bytes` (objects count as hot from 2 accesses a window).
    pub fn new(config: AdmissionConfig) -> Result<Self, CacheError> {
        Ok(Self {
            capacity: config.capacity_bytes,
            counter: AccessCounter::new(CounterConfig::default())?,
            selector: GlobalSelector::new(2),
            policy: Mutex::new(DramCachePolicy::new(config)?),
            resident: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
        })
    }

    /// Counts an access to `obj` and returns its copy if it is resident.
    pub fn get(&self, obj: u64) -> Option<V> {
        self.counter.record(obj);
        let v = self.resident.lock().get(&obj).cloned();
        if v.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        v
    }

    /// Drops `obj`'s copy (it changed or went away).
    pub fn invalidate(&self, obj: u64) {
        self.resident.lock().remove(&obj);
        self.policy.lock().remove(obj);
    }

    /// Ends a window: selects the hottest objects that fit (`size_of` their sizes), evicts
    /// what the policy says and loads each promoted object with `load` (`None`: it is gone, not
    /// promoted). Returns (promoted, evicted).
    pub fn window(
        &self,
        size_of: impl Fn(u64) -> Option<u64>,
        mut load: impl FnMut(u64) -> Option<V>,
    ) -> (usize, usize) {
        self.selector.merge(&self.counter.end_window(0));
        let selection = self.selector.finish_window(self.capacity, size_of);
        let mut policy = self.policy.lock();
        let plan = policy.plan(&selection.hot);
        let mut resident = self.resident.lock();
        for obj in &plan.evict {
            resident.remove(obj);
        }
        let mut promoted = 0;
        for h in &plan.promote {
            match load(h.obj) {
                Some(v) => {
                    resident.insert(h.obj, v);
                    promoted += 1;
                }
                None => {
                    policy.remove(h.obj);
                }
            }
        }
        (promoted, plan.evict.len())
    }

    /// Copies resident now.
    pub fn len(&self) -> usize {
        self.resident.lock().len()
    }

    /// Whether nothing is resident.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Accesses served from a resident copy so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_objects_leave_and_gone_ones_are_not_promoted() {
        let tier: HotTier<u64> = HotTier::new(AdmissionConfig {
            capacity_bytes: 128,
            min_residency_windows: 0,
            ..Default::default()
        })
        .unwrap();
        for _ in 0..10 {
            tier.get(1);
            tier.get(2);
        }
        // Object 2 vanished before it could be loaded.
        let (p, _) = tier.window(|_| Some(64), |o| (o == 1).then_some(10));
        assert_eq!((p, tier.len()), (1, 1));
        // A new hot set: 3 and 4 displace 1.
        for _ in 0..40 {
            tier.get(3);
            tier.get(4);
        }
        tier.window(|_| Some(64), Some);
        assert_eq!(tier.get(1), None);
        assert_eq!(tier.get(3), Some(3));
        tier.invalidate(3);
        assert_eq!(tier.get(3), None);
    }
}
