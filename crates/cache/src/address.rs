//! A client's bounded cache of remote addresses, bypassed while it does not pay.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// The shards' hasher: seeded per cache (keys may come from users: no fixed seed to collide
/// against), and several times faster than SipHash on short keys.
type Hasher = foldhash::fast::RandomState;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::CacheError;

/// Settings of an [`AddressCache`].
#[derive(Clone, Debug, PartialEq)]
pub struct AddressCacheConfig {
    /// Entries held at most (over all shards).
    pub capacity: usize,
    /// Independently locked parts.
    pub shards: usize,
    /// Lookups per measurement window of the miss ratio.
    pub window: u32,
    /// Bypass starts when a window's miss ratio exceeds this.
    pub bypass_above: f64,
    /// Bypass ends when a window's miss ratio falls below this (at most `bypass_above`; the
    /// gap keeps the cache from toggling on a ratio that hovers at the threshold).
    pub resume_below: f64,
    /// While bypassing, one call of [`AddressCache::should_bypass`] in this many says
    /// "probe" instead, so that the miss ratio keeps being measured.
    pub probe_every: u32,
    /// Value of the `cache` label on this cache's metrics.
    pub name: &'static str,
}

impl Default for AddressCacheConfig {
    fn default() -> Self {
        Self {
            capacity: 1 << 16,
            shards: 8,
            window: 1024,
            bypass_above: 0.8,
            resume_below: 0.6,
            probe_every: 16,
            name: "address",
        }
    }
}

/// What an [`AddressCache`] has done since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AddressCacheStats {
    /// Lookups that found an entry.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Hits the caller later found out of date ([`AddressCache::report_stale`]).
    pub stale: u64,
    /// Entries pushed out to make room.
    pub evictions: u64,
    /// Operations the cache told its caller to skip it for.
    pub bypassed: u64,
    /// Probes made while bypassing.
    pub probes: u64,
    /// Whether the cache is currently bypassed.
    pub bypassing: bool,
    /// Miss ratio (stale hits counting as misses) of the last complete window.
    pub recent_miss_ratio: f64,
}

#[derive(Debug)]
struct Slot<K, V> {
    key: K,
    value: V,
    referenced: bool,
}

/// One shard, replaced by CLOCK (second chance): near-LRU hit ratios without reordering a
/// list on every hit.
#[derive(Debug)]
struct ClockShard<K, V> {
    slots: Vec<Slot<K, V>>,
    index: HashMap<K, usize, Hasher>,
    hand: usize,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> ClockShard<K, V> {
    fn get<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let &i = self.index.get(key)?;
        let slot = &mut self.slots[i];
        slot.referenced = true;
        Some(slot.value.clone())
    }

    /// Inserts or replaces; returns whether an entry was evicted to make room.
    fn insert(&mut self, key: K, value: V) -> bool {
        if let Some(&i) = self.index.get(&key) {
            self.slots[i].value = value;
            self.slots[i].referenced = true;
            return false;
        }
        if self.slots.len() < self.capacity {
            self.index.insert(key.clone(), self.slots.len());
            self.slots.push(Slot {
                key,
                value,
                referenced: false,
            });
            return false;
        }
        loop {
            let slot = &mut self.slots[self.hand];
            if slot.referenced {
                slot.referenced = false;
                self.hand = (self.hand + 1) % self.slots.len();
                continue;
            }
            let old = std::mem::replace(
                slot,
                Slot {
                    key: key.clone(),
                    value,
                    referenced: false,
                },
            );
            self.index.remove(&old.key);
            self.index.insert(key, self.hand);
            self.hand = (self.hand + 1) % self.slots.len();
            return true;
        }
    }

    fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let i = self.index.remove(key)?;
        let slot = self.slots.swap_remove(i);
        if let Some(moved) = self.slots.get(i) {
            if let Some(at) = self.index.get_mut::<K>(&moved.key) {
                *at = i;
            }
        }
        if self.hand >= self.slots.len() {
            self.hand = 0;
        }
        Some(slot.value)
    }
}

const COUNT_BITS: u32 = 32;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

#[derive(Debug)]
struct Metrics {
    hits: metrics::Counter,
    misses: metrics::Counter,
    stale: metrics::Counter,
    evictions: metrics::Counter,
    bypassed: metrics::Counter,
}

/// A bounded, thread-safe map from keys to remote addresses (or anything cheap to clone),
/// with hit/miss statistics and an adaptive bypass.
///
/// A cached address saves a round trip only if it is there and still right; when most
/// lookups miss (a working set larger than the cache, or addresses that keep moving) the
/// lookup is pure overhead. The cache measures its miss ratio per window of lookups and,
/// while it is high, answers [`should_bypass`](Self::should_bypass) with `true`, except for
/// one probe in `probe_every`, whose lookups keep measuring so that the bypass ends when
/// the ratio drops. Callers should keep inserting what they learn while bypassing.
#[derive(Debug)]
pub struct AddressCache<K, V> {
    config: AddressCacheConfig,
    hasher: Hasher,
    shards: Box<[Mutex<ClockShard<K, V>>]>,
    /// Misses in the high 32 bits, lookups in the low 32, of the current window: one word,
    /// so that a window is closed exactly once.
    window: AtomicU64,
    bypassing: AtomicBool,
    recent_miss_ratio: AtomicU64,
    bypass_calls: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    stale: AtomicU64,
    evictions: AtomicU64,
    bypassed: AtomicU64,
    probes: AtomicU64,
    metrics: Metrics,
}

impl<K: Hash + Eq + Clone, V: Clone> AddressCache<K, V> {
    /// An empty cache.
    pub fn new(config: AddressCacheConfig) -> Result<Self, CacheError> {
        if config.capacity == 0 {
            return Err(CacheError::Zero { what: "capacity" });
        }
        if config.window == 0 || config.probe_every == 0 {
            return Err(CacheError::Zero {
                what: "window and probe_every",
            });
        }
        for (what, value) in [
            ("bypass_above", config.bypass_above),
            ("resume_below", config.resume_below),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(CacheError::OutOfRange { what, value });
            }
        }
        if config.resume_below > config.bypass_above {
            return Err(CacheError::OutOfRange {
                what: "resume_below (above bypass_above)",
                value: config.resume_below,
            });
        }
        let n = config.shards.clamp(1, config.capacity);
        let shards = (0..n)
            .map(|i| {
                // Spread the remainder so that the shards' capacities sum to exactly `capacity`.
                let capacity = config.capacity / n + usize::from(i < config.capacity % n);
                Mutex::new(ClockShard {
                    slots: Vec::new(),
                    index: HashMap::with_hasher(Hasher::default()),
                    hand: 0,
                    capacity,
                })
            })
            .collect();
        let label = [("cache", config.name)];
        let metrics = Metrics {
            hits: metrics::counter!("dmkit_cache_address_hits_total", &label),
            misses: metrics::counter!("dmkit_cache_address_misses_total", &label),
            stale: metrics::counter!("dmkit_cache_address_stale_total", &label),
            evictions: metrics::counter!("dmkit_cache_address_evictions_total", &label),
            bypassed: metrics::counter!("dmkit_cache_address_bypassed_total", &label),
        };
        Ok(Self {
            config,
            hasher: Hasher::default(),
            shards,
            window: AtomicU64::new(0),
            bypassing: AtomicBool::new(false),
            recent_miss_ratio: AtomicU64::new(0f64.to_bits()),
            bypass_calls: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            bypassed: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            metrics,
        })
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> &Mutex<ClockShard<K, V>> {
        let h = self.hasher.hash_one(key);
        &self.shards[(h % self.shards.len() as u64) as usize]
    }

    /// The cached value for `key`, counting a hit or a miss.
    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let found = self.shard(key).lock().get(key);
        if found.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            self.metrics.hits.increment(1);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            self.metrics.misses.increment(1);
        }
        self.observe(1, u64::from(found.is_none()));
        found
    }

    /// Whether `key` is cached, without counting a lookup or marking it used (to choose how
    /// to go about an operation before doing it).
    pub fn contains<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.shard(key).lock().index.contains_key(key)
    }

    /// Caches `value` for `key`, evicting an entry not used recently if the shard is full.
    pub fn insert(&self, key: K, value: V) {
        if self.shard(&key).lock().insert(key, value) {
            self.evictions.fetch_add(1, Ordering::Relaxed);
            self.metrics.evictions.increment(1);
        }
    }

    /// Drops `key`'s entry.
    pub fn remove<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.shard(key).lock().remove(key)
    }

    /// The value [`get`](Self::get) returned for `key` turned out wrong (the object moved):
    /// drops it and counts that lookup as a miss after all.
    pub fn report_stale<Q: Hash + Eq + ?Sized>(&self, key: &Q)
    where
        K: Borrow<Q>,
    {
        self.remove(key);
        self.stale.fetch_add(1, Ordering::Relaxed);
        self.metrics.stale.increment(1);
        self.observe(0, 1);
    }

    /// Whether the caller should skip the cache for its next operation (go to the remote
    /// index directly). While the cache is bypassed, one call in `probe_every` still says
    /// `false`: a probe whose lookup keeps the miss ratio measured.
    pub fn should_bypass(&self) -> bool {
        if !self.bypassing.load(Ordering::Relaxed) {
            return false;
        }
        let n = self.bypass_calls.fetch_add(1, Ordering::Relaxed);
        if n % u64::from(self.config.probe_every) == u64::from(self.config.probe_every) - 1 {
            self.probes.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.bypassed.fetch_add(1, Ordering::Relaxed);
        self.metrics.bypassed.increment(1);
        true
    }

    fn observe(&self, lookups: u64, misses: u64) {
        let mut cur = self.window.load(Ordering::Relaxed);
        loop {
            let l = (cur & COUNT_MASK) + lookups;
            let m = (cur >> COUNT_BITS) + misses;
            let closes = l >= u64::from(self.config.window);
            let next = if closes {
                0
            } else {
                (m.min(l) << COUNT_BITS) | l
            };
            match self
                .window
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) if closes => return self.close_window(m.min(l) as f64 / l as f64),
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    fn close_window(&self, ratio: f64) {
        self.recent_miss_ratio
            .store(ratio.to_bits(), Ordering::Relaxed);
        if ratio > self.config.bypass_above {
            self.bypassing.store(true, Ordering::Relaxed);
        } else if ratio < self.config.resume_below {
            self.bypassing.store(false, Ordering::Relaxed);
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slots.len()).sum()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries held at most.
    pub fn capacity(&self) -> usize {
        self.config.capacity
    }

    /// What the cache has done so far.
    pub fn stats(&self) -> AddressCacheStats {
        AddressCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bypassed: self.bypassed.load(Ordering::Relaxed),
            probes: self.probes.load(Ordering::Relaxed),
            bypassing: self.bypassing.load(Ordering::Relaxed),
            recent_miss_ratio: f64::from_bits(self.recent_miss_ratio.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte-string keys are looked up, checked and dropped by slice (no owned key per
    /// lookup), across shards. (Room for every key in any one shard: the hash is seeded per
    /// cache, so which shard a key lands in changes from run to run.)
    #[test]
    fn owned_keys_are_found_by_their_borrowed_form() {
        let c: AddressCache<Vec<u8>, u32> = AddressCache::new(AddressCacheConfig {
            capacity: 8 * 32,
            shards: 8,
            ..AddressCacheConfig::default()
        })
        .unwrap();
        for i in 0..32u32 {
            c.insert(format!("key-{i}").into_bytes(), i);
        }
        for i in 0..32u32 {
            let k = format!("key-{i}");
            assert_eq!(c.get(k.as_bytes()), Some(i));
            assert!(c.contains(k.as_bytes()));
        }
        assert_eq!(c.remove(b"key-7".as_slice()), Some(7));
        assert_eq!(c.get(b"key-7".as_slice()), None);
        c.report_stale(b"key-8".as_slice());
        assert!(!c.contains(b"key-8".as_slice()));
        assert_eq!(c.get(b"key-9".as_slice()), Some(9), "the others stay");
    }

    fn cache(capacity: usize) -> AddressCache<u64, u64> {
        AddressCache::new(AddressCacheConfig {
            capacity,
            shards: 1,
            window: 100,
            probe_every: 4,
            ..AddressCacheConfig::default()
        })
        .unwrap()
    }

    /// One operation as a caller does it: consult the cache unless told to bypass it, and
    /// insert what the remote lookup returned.
    fn access(c: &AddressCache<u64, u64>, key: u64) {
        if c.should_bypass() || c.get(&key).is_none() {
            c.insert(key, key * 10);
        }
    }

    #[test]
    fn inserted_value_is_returned_and_counted_as_a_hit() {
        let c = cache(4);
        assert_eq!(c.get(&1), None);
        c.insert(1, 10);
        assert_eq!(c.get(&1), Some(10));
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (1, 1));
    }

    #[test]
    fn contains_counts_no_lookup() {
        let c = cache(64);
        c.insert(1, 10);
        assert!(c.contains(&1));
        assert!(!c.contains(&2));
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (0, 0));
    }

    #[test]
    fn capacity_is_never_exceeded() {
        let c = AddressCache::new(AddressCacheConfig {
            capacity: 10,
            shards: 3,
            ..AddressCacheConfig::default()
        })
        .unwrap();
        for k in 0..1_000u64 {
            c.insert(k, k);
        }
        assert_eq!(c.len(), 10);
        assert_eq!(c.stats().evictions, 990);
    }

    #[test]
    fn recently_used_entries_survive_eviction() {
        let c = cache(3);
        for k in 1..=3 {
            c.insert(k, k);
        }
        c.get(&1);
        c.insert(4, 4);
        assert_eq!(
            c.get(&1),
            Some(1),
            "the referenced entry had a second chance"
        );
        assert_eq!(c.get(&2), None, "the unreferenced one went");
    }

    #[test]
    fn removal_keeps_the_index_consistent() {
        let c = cache(3);
        for k in 1..=3 {
            c.insert(k, k);
        }
        assert_eq!(c.remove(&1), Some(1));
        assert_eq!(c.get(&3), Some(3));
        c.insert(5, 5);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&5), Some(5));
        assert_eq!(c.get(&2), Some(2));
    }

    #[test]
    fn high_miss_ratio_turns_bypass_on_and_a_low_one_turns_it_off() {
        let c = cache(10);
        // A scan over far more keys than the cache holds: almost every lookup misses.
        for k in 0..100 {
            access(&c, k);
        }
        assert!(c.should_bypass() || c.stats().bypassing);
        assert!(c.stats().recent_miss_ratio > 0.8);
        // While bypassed, most operations skip the cache and a few probe it.
        let before = c.stats();
        for _ in 0..40 {
            access(&c, 1_000_000);
        }
        let after = c.stats();
        assert_eq!(after.probes - before.probes, 10);
        assert_eq!(after.hits + after.misses - before.hits - before.misses, 10);
        // The workload now fits: probes hit, the ratio falls, the bypass ends.
        for i in 0..1_000 {
            access(&c, i % 5);
        }
        let s = c.stats();
        assert!(!s.bypassing, "{s:?}");
        assert!(s.recent_miss_ratio < 0.6);
        assert!(!c.should_bypass());
    }

    #[test]
    fn stale_hits_count_as_misses() {
        let c = cache(10);
        c.insert(1, 10);
        for _ in 0..100 {
            if c.get(&1).is_some() {
                c.report_stale(&1);
                c.insert(1, 10);
            }
        }
        let s = c.stats();
        assert_eq!(s.stale, 100);
        assert!(s.recent_miss_ratio >= 0.95, "{s:?}");
        assert!(s.bypassing);
    }

    #[test]
    fn invalid_config_is_refused() {
        let bad = |c: AddressCacheConfig| AddressCache::<u64, u64>::new(c).is_err();
        assert!(bad(AddressCacheConfig {
            capacity: 0,
            ..AddressCacheConfig::default()
        }));
        assert!(bad(AddressCacheConfig {
            bypass_above: 0.5,
            resume_below: 0.7,
            ..AddressCacheConfig::default()
        }));
        assert!(bad(AddressCacheConfig {
            bypass_above: 1.5,
            ..AddressCacheConfig::default()
        }));
    }

    #[test]
    fn cache_is_shareable_across_threads() {
        let c: AddressCache<u64, u64> = AddressCache::new(AddressCacheConfig {
            capacity: 64,
            ..AddressCacheConfig::default()
        })
        .unwrap();
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let c = &c;
                s.spawn(move || {
                    for k in 0..2_000u64 {
                        access(c, (k * 7 + t) % 100);
                    }
                });
            }
        });
        let s = c.stats();
        assert!(c.len() <= 64);
        assert_eq!(s.hits + s.misses + s.bypassed, 4_000);
    }
}
