//! Windowed per-object access counting in bounded memory, and the reports clients send.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::CacheError;
use crate::sketch::CountMinSketch;

/// An object and how often it was accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HotEntry {
    /// The object.
    pub obj: u64,
    /// Its (estimated) accesses in the window.
    pub count: u64,
}

/// What one client saw in one window: its hottest objects, hottest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessReport {
    /// The reporting client.
    pub client: u64,
    /// The client's window number (counts from 0).
    pub window: u64,
    /// All accesses the client counted in the window, hot or not.
    pub total_accesses: u64,
    /// The top objects, at most `top_k`, by estimated count, hottest first.
    pub entries: Vec<HotEntry>,
}

impl AccessReport {
    /// Bytes of the fixed part: client, window, total accesses, entry count.
    const HEAD: usize = 8 + 8 + 8 + 4;

    /// The report's bytes, as clients send it to servers (the caller carries them): client,
    /// window and total accesses (u64 each), the entry count (u32), then each entry's object
    /// and count (u64 each), all little-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::HEAD + 16 * self.entries.len());
        b.extend_from_slice(&self.client.to_le_bytes());
        b.extend_from_slice(&self.window.to_le_bytes());
        b.extend_from_slice(&self.total_accesses.to_le_bytes());
        let n = u32::try_from(self.entries.len()).expect("at most u32::MAX entries");
        b.extend_from_slice(&n.to_le_bytes());
        for e in &self.entries {
            b.extend_from_slice(&e.obj.to_le_bytes());
            b.extend_from_slice(&e.count.to_le_bytes());
        }
        b
    }

    /// The report of exactly these bytes, the form [`AccessReport::to_bytes`] writes (the bytes come from the network:
    /// short, long or lying input is an error, never a panic or a huge allocation).
    pub fn from_bytes(b: &[u8]) -> Result<Self, CacheError> {
        let malformed = |what| CacheError::Malformed { what };
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        if b.len() < Self::HEAD {
            return Err(malformed("truncated"));
        }
        let n = u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")) as usize;
        let body = b.len() - Self::HEAD;
        if body % 16 != 0 || body / 16 != n {
            return Err(malformed("entry count"));
        }
        let entries = (0..n)
            .map(|i| HotEntry {
                obj: word(Self::HEAD + 16 * i),
                count: word(Self::HEAD + 16 * i + 8),
            })
            .collect();
        Ok(AccessReport {
            client: word(0),
            window: word(8),
            total_accesses: word(16),
            entries,
        })
    }
}

/// Settings of an [`AccessCounter`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CounterConfig {
    /// Relative error of the counts (see [`CountMinSketch`]).
    pub epsilon: f64,
    /// Probability that a count exceeds the error bound.
    pub delta: f64,
    /// Objects kept and reported per window.
    pub top_k: usize,
    /// Independently locked parts (each a sketch of its own).
    pub shards: usize,
}

impl Default for CounterConfig {
    fn default() -> Self {
        Self {
            epsilon: 0.001,
            delta: 0.01,
            top_k: 128,
            shards: 4,
        }
    }
}

/// The `k` objects with the highest estimates seen so far.
#[derive(Debug, Default)]
struct TopK {
    k: usize,
    counts: HashMap<u64, u64>,
    order: BTreeSet<(u64, u64)>,
}

impl TopK {
    fn offer(&mut self, obj: u64, count: u64) {
        if let Some(old) = self.counts.get_mut(&obj) {
            self.order.remove(&(*old, obj));
            *old = count;
            self.order.insert((count, obj));
            return;
        }
        if self.counts.len() < self.k {
            self.counts.insert(obj, count);
            self.order.insert((count, obj));
            return;
        }
        let Some(&(min, min_obj)) = self.order.first() else {
            return;
        };
        if count > min {
            self.order.pop_first();
            self.counts.remove(&min_obj);
            self.counts.insert(obj, count);
            self.order.insert((count, obj));
        }
    }

    fn entries(&self) -> impl Iterator<Item = HotEntry> + '_ {
        self.order
            .iter()
            .rev()
            .map(|&(count, obj)| HotEntry { obj, count })
    }

    fn clear(&mut self) {
        self.counts.clear();
        self.order.clear();
    }
}

#[derive(Debug)]
struct CounterShard {
    sketch: CountMinSketch,
    top: TopK,
}

/// Per-object access counts over a window, in memory independent of the number of objects:
/// a count-min sketch estimates every object's count and a top-k set keeps the hottest.
///
/// Each of the `shards` holds a sketch of the objects hashed to it, so memory is
/// `shards × width × depth × 4` bytes plus `top_k` entries per shard, and an estimate exceeds
/// the true count by at most `epsilon ×` (that shard's accesses) with probability `1 - delta`.
/// An object whose true count beats the k-th largest by more than that bound is reported.
#[derive(Debug)]
pub struct AccessCounter {
    config: CounterConfig,
    shards: Box<[Mutex<CounterShard>]>,
    window: AtomicU64,
    m_accesses: metrics::Counter,
}

impl AccessCounter {
    /// A counter at window 0.
    pub fn new(config: CounterConfig) -> Result<Self, CacheError> {
        if config.top_k == 0 {
            return Err(CacheError::Zero { what: "top_k" });
        }
        let shards = (0..config.shards.max(1))
            .map(|_| {
                let sketch = CountMinSketch::with_error_bound(config.epsilon, config.delta)?;
                Ok(Mutex::new(CounterShard {
                    sketch,
                    top: TopK {
                        k: config.top_k,
                        ..TopK::default()
                    },
                }))
            })
            .collect::<Result<_, CacheError>>()?;
        Ok(Self {
            config,
            shards,
            window: AtomicU64::new(0),
            m_accesses: metrics::counter!("dmkit_cache_accesses_total"),
        })
    }

    /// The counter's settings.
    pub fn config(&self) -> &CounterConfig {
        &self.config
    }

    fn shard(&self, obj: u64) -> &Mutex<CounterShard> {
        let h = obj.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        &self.shards[(h % self.shards.len() as u64) as usize]
    }

    /// Counts one access to `obj`.
    pub fn record(&self, obj: u64) {
        self.record_n(obj, 1)
    }

    /// Counts `n` accesses to `obj`.
    pub fn record_n(&self, obj: u64, n: u64) {
        let mut shard = self.shard(obj).lock();
        let estimate = shard.sketch.increment(obj, n);
        shard.top.offer(obj, estimate);
    }

    /// `obj`'s estimated accesses in the current window (never below the truth).
    pub fn estimate(&self, obj: u64) -> u64 {
        self.shard(obj).lock().sketch.estimate(obj)
    }

    /// The largest amount by which a current estimate may exceed the truth (with
    /// probability `1 - delta`).
    pub fn error_bound(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().sketch.error_bound())
            .max()
            .unwrap_or(0)
    }

    /// Accesses counted in the current window.
    pub fn total(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().sketch.total()).sum()
    }

    /// Memory held by the sketches, in bytes.
    pub fn memory_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().sketch.memory_bytes())
            .sum()
    }

    /// The hottest objects of the current window so far, hottest first.
    pub fn top(&self) -> Vec<HotEntry> {
        let mut all: Vec<HotEntry> = self
            .shards
            .iter()
            .flat_map(|s| s.lock().top.entries().collect::<Vec<_>>())
            .collect();
        all.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.obj.cmp(&b.obj)));
        all.truncate(self.config.top_k);
        all
    }

    /// Closes the window: returns `client`'s report of it and starts the next from zero.
    pub fn end_window(&self, client: u64) -> AccessReport {
        // Lock every shard for the cut so that no access is counted in neither window.
        let mut guards: Vec<_> = self.shards.iter().map(|s| s.lock()).collect();
        let total_accesses = guards.iter().map(|g| g.sketch.total()).sum();
        let mut entries: Vec<HotEntry> = guards.iter().flat_map(|g| g.top.entries()).collect();
        entries.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.obj.cmp(&b.obj)));
        entries.truncate(self.config.top_k);
        for g in guards.iter_mut() {
            g.sketch.clear();
            g.top.clear();
        }
        drop(guards);
        self.m_accesses.increment(total_accesses);
        let window = self.window.fetch_add(1, Ordering::Relaxed);
        AccessReport {
            client,
            window,
            total_accesses,
            entries,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn reports_round_trip_through_their_bytes() {
        let rep = AccessReport {
            client: 5,
            window: 2,
            total_accesses: 300,
            entries: vec![
                HotEntry {
                    obj: 0x1000,
                    count: 200,
                },
                HotEntry {
                    obj: 0x2040,
                    count: 100,
                },
            ],
        };
        let b = rep.to_bytes();
        assert_eq!(b.len(), 28 + 2 * 16);
        assert_eq!(&b[..8], &5u64.to_le_bytes());
        assert_eq!(&b[24..28], &2u32.to_le_bytes());
        assert_eq!(&b[28..36], &0x1000u64.to_le_bytes());
        assert_eq!(AccessReport::from_bytes(&b), Ok(rep));
        // Short, long, and a count that lies: errors.
        let long = [b.as_slice(), &[0]].concat();
        for bad in [&b[..27], &b[..b.len() - 1], &long[..]] {
            assert!(AccessReport::from_bytes(bad).is_err());
        }
        let mut lying = b.clone();
        lying[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            AccessReport::from_bytes(&lying),
            Err(CacheError::Malformed {
                what: "entry count"
            })
        );
    }

    /// Draws from a Zipf distribution over `0..n` with exponent `s`, by inverting its CDF.
    pub(crate) struct Zipf {
        cdf: Vec<f64>,
    }

    impl Zipf {
        pub(crate) fn new(n: usize, s: f64) -> Self {
            let mut acc = 0.0;
            let mut cdf: Vec<f64> = (1..=n)
                .map(|i| {
                    acc += 1.0 / (i as f64).powf(s);
                    acc
                })
                .collect();
            for c in cdf.iter_mut() {
                *c /= acc;
            }
            Self { cdf }
        }

        pub(crate) fn sample(&self, rng: &mut impl Rng) -> u64 {
            let u: f64 = rng.random();
            self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u64
        }
    }

    fn zipf_stream(n: usize, len: usize, seed: u64) -> Vec<u64> {
        let zipf = Zipf::new(n, 0.99);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Scatter ranks over the id space so that hot objects are not neighbours.
        (0..len)
            .map(|_| zipf.sample(&mut rng).wrapping_mul(0x2545_F491_4F6C_DD1D))
            .collect()
    }

    #[test]
    fn estimates_respect_the_count_min_bound_on_a_zipfian_stream() {
        let config = CounterConfig {
            epsilon: 0.002,
            delta: 0.01,
            top_k: 32,
            shards: 2,
        };
        let counter = AccessCounter::new(config).unwrap();
        let stream = zipf_stream(20_000, 200_000, 1);
        let mut exact: HashMap<u64, u64> = HashMap::new();
        for &obj in &stream {
            counter.record(obj);
            *exact.entry(obj).or_default() += 1;
        }
        let bound = counter.error_bound();
        assert!(bound <= (0.002 * stream.len() as f64).ceil() as u64);
        let mut beyond = 0;
        for (&obj, &truth) in &exact {
            let est = counter.estimate(obj);
            assert!(est >= truth, "count-min never underestimates");
            if est - truth > bound {
                beyond += 1;
            }
        }
        let allowed = (config.delta * exact.len() as f64).ceil() as usize;
        assert!(
            beyond <= allowed,
            "{beyond} of {} estimates beyond the bound",
            exact.len()
        );
        // Memory is the sketches', whatever the number of distinct objects.
        assert_eq!(counter.memory_bytes(), 2 * 1360 * 5 * 4);
    }

    #[test]
    fn top_k_holds_every_object_clearly_hotter_than_the_kth() {
        let k = 32;
        let counter = AccessCounter::new(CounterConfig {
            epsilon: 0.002,
            delta: 0.01,
            top_k: k,
            shards: 2,
        })
        .unwrap();
        let stream = zipf_stream(20_000, 200_000, 2);
        let mut exact: HashMap<u64, u64> = HashMap::new();
        for &obj in &stream {
            counter.record(obj);
            *exact.entry(obj).or_default() += 1;
        }
        let mut truth: Vec<(u64, u64)> = exact.iter().map(|(&o, &c)| (c, o)).collect();
        truth.sort_unstable_by(|a, b| b.cmp(a));
        let kth = truth[k - 1].0;
        let bound = counter.error_bound();
        let reported: HashMap<u64, u64> = counter
            .top()
            .into_iter()
            .map(|e| (e.obj, e.count))
            .collect();
        assert_eq!(reported.len(), k);
        for &(count, obj) in truth.iter().take_while(|(c, _)| *c > kth + bound) {
            let est = reported.get(&obj).copied();
            assert!(
                est.is_some_and(|e| e >= count && e - count <= bound),
                "object with {count} accesses: {est:?}"
            );
        }
        let recall = truth[..k]
            .iter()
            .filter(|(_, o)| reported.contains_key(o))
            .count();
        assert!(recall >= k * 9 / 10, "recall {recall}/{k}");
    }

    #[test]
    fn window_report_is_sorted_and_the_next_window_starts_empty() {
        let counter = AccessCounter::new(CounterConfig {
            top_k: 2,
            ..CounterConfig::default()
        })
        .unwrap();
        counter.record_n(1, 5);
        counter.record_n(2, 9);
        counter.record_n(3, 1);
        let report = counter.end_window(77);
        assert_eq!(report.client, 77);
        assert_eq!(report.window, 0);
        assert_eq!(report.total_accesses, 15);
        assert_eq!(
            report.entries,
            vec![HotEntry { obj: 2, count: 9 }, HotEntry { obj: 1, count: 5 }]
        );
        assert_eq!(counter.estimate(2), 0);
        assert_eq!(counter.end_window(77).window, 1);
    }

    #[test]
    fn counter_is_shareable_across_threads() {
        let counter = AccessCounter::new(CounterConfig::default()).unwrap();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| (0..1_000).for_each(|i| counter.record(i % 10)));
            }
        });
        assert_eq!(counter.total(), 2_000);
        assert_eq!(counter.estimate(3), 200);
    }
}
