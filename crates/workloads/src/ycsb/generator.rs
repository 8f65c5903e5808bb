//! The number generators of YCSB core: FNV-64 key hashing, the zipfian generator of Gray et al.
//! (as YCSB's `ZipfianGenerator`), its scrambled variant, the skewed-latest generator and the
//! acknowledged insert counter.
//!
//! Every generator takes the random source as an argument so that a [`super::Workload`] owns
//! one seeded stream and stays deterministic.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;
use rand::Rng;

/// The FNV-1a 64-bit offset basis (YCSB `Utils.FNV_OFFSET_BASIS_64`).
pub const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
/// The FNV 64-bit prime (YCSB `Utils.FNV_PRIME_64`).
pub const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// The zipfian constant YCSB uses everywhere unless told otherwise.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// The size of the item space the scrambled zipfian draws from before hashing
/// (YCSB `ScrambledZipfianGenerator.ITEM_COUNT`).
pub const SCRAMBLED_ITEM_COUNT: i64 = 10_000_000_000;

/// zeta(`SCRAMBLED_ITEM_COUNT`, 0.99) as YCSB precomputed it (`ScrambledZipfianGenerator.ZETAN`).
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// Item counts above this use the Euler–Maclaurin form of zeta instead of a direct sum (a direct
/// sum over 10^10 terms, which YCSB does for a non-default constant, takes minutes).
const DIRECT_ZETA_LIMIT: u64 = 1 << 24;

/// FNV-1a, 64 bits, over `bytes`.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS_64, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME_64)
    })
}

/// YCSB's `Utils.fnvhash64`: FNV-1a over the eight little-endian bytes of `val`, made
/// non-negative with a two's-complement absolute value (so, as in Java, `i64::MIN` stays
/// negative; no key number reaches it in practice).
pub fn fnvhash64(val: i64) -> i64 {
    (fnv1a_64(&val.to_le_bytes()) as i64).wrapping_abs()
}

/// The sum over `i` in `st..n` of `1 / (i + 1)^theta`, added to `initial` (YCSB
/// `ZipfianGenerator.zetastatic(st, n, theta, initialsum)`).
pub fn zeta_from(st: u64, n: u64, theta: f64, initial: f64) -> f64 {
    (st..n).fold(initial, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// zeta(n, theta) = the sum over `i` in `1..=n` of `1 / i^theta`.
///
/// Exact summation (as YCSB) up to 2^24 items; above that, the first 10^4 terms are summed and
/// the rest is the Euler–Maclaurin tail, which agrees with the direct sum to about 1e-12
/// relative while taking microseconds instead of minutes.
pub fn zeta(n: u64, theta: f64) -> f64 {
    if n <= DIRECT_ZETA_LIMIT {
        return zeta_from(0, n, theta, 0.0);
    }
    let m = 10_000_u64;
    let head = zeta_from(0, m - 1, theta, 0.0);
    let (mf, nf) = (m as f64, n as f64);
    let f = |x: f64| x.powf(-theta);
    let df = |x: f64| -theta * x.powf(-theta - 1.0);
    let d3f = |x: f64| -theta * (theta + 1.0) * (theta + 2.0) * x.powf(-theta - 3.0);
    let integral = if (theta - 1.0).abs() < f64::EPSILON {
        nf.ln() - mf.ln()
    } else {
        (nf.powf(1.0 - theta) - mf.powf(1.0 - theta)) / (1.0 - theta)
    };
    head + integral + (f(mf) + f(nf)) / 2.0 + (df(nf) - df(mf)) / 12.0 - (d3f(nf) - d3f(mf)) / 720.0
}

/// YCSB's `ZipfianGenerator`: item `min` is the most popular, `min + 1` the next, and so on, with
/// probability of rank `r` proportional to `1 / (r + 1)^theta`.
///
/// The item count may grow between draws ([`Zipfian::next_in`]); zeta is then extended
/// incrementally, and, as in YCSB, `eta` keeps using the item count given at construction.
#[derive(Debug, Clone)]
pub struct Zipfian {
    items: u64,
    base: i64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    count_for_zeta: u64,
}

impl Zipfian {
    /// Items `min..=max` with constant `theta`, computing zeta for `max - min + 1` items.
    pub fn new(min: i64, max: i64, theta: f64) -> Self {
        let items = item_count(min, max);
        Self::with_zetan(min, max, theta, zeta(items, theta))
    }

    /// Items `min..=max` with constant `theta` and a precomputed zeta for that item count.
    pub fn with_zetan(min: i64, max: i64, theta: f64, zetan: f64) -> Self {
        let items = item_count(min, max);
        let zeta2theta = zeta(2, theta);
        Self {
            items,
            base: min,
            theta,
            zeta2theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: Self::eta(items, theta, zeta2theta, zetan),
            count_for_zeta: items,
        }
    }

    fn eta(items: u64, theta: f64, zeta2theta: f64, zetan: f64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan)
    }

    /// The number of items given at construction.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// The zeta value currently in use (for the largest item count seen so far).
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// Draws from the item count given at construction.
    pub fn next(&mut self, rng: &mut impl Rng) -> i64 {
        self.next_in(rng, self.items)
    }

    /// Draws from `base..base + itemcount`; a larger `itemcount` than before extends zeta
    /// incrementally, a smaller one keeps the old zeta (YCSB's default, which never recomputes
    /// from scratch).
    pub fn next_in(&mut self, rng: &mut impl Rng, itemcount: u64) -> i64 {
        if itemcount > self.count_for_zeta {
            self.zetan = zeta_from(self.count_for_zeta, itemcount, self.theta, self.zetan);
            self.count_for_zeta = itemcount;
            self.eta = Self::eta(self.items, self.theta, self.zeta2theta, self.zetan);
        }
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5_f64.powf(self.theta) {
            return self.base + 1;
        }
        // A saturating float-to-int conversion, like Java's `(long)` cast.
        self.base + (itemcount as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as i64
    }
}

fn item_count(min: i64, max: i64) -> u64 {
    u64::try_from(max.saturating_sub(min).saturating_add(1)).unwrap_or(0)
}

/// YCSB's `ScrambledZipfianGenerator`: a zipfian over 10^10 items whose draws are hashed with
/// [`fnvhash64`] into `min..=max`, so the popular items are scattered over the key space.
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    min: i64,
    itemcount: i64,
    zipf: Zipfian,
}

impl ScrambledZipfian {
    /// Items `min..=max` with constant `theta`. For 0.99 the zeta constant is YCSB's
    /// precomputed one; for any other constant it is computed (see [`zeta`]).
    pub fn new(min: i64, max: i64, theta: f64) -> Self {
        #[allow(clippy::float_cmp)] // YCSB switches on exact equality with its constant.
        let zetan = if theta == ZIPFIAN_CONSTANT {
            SCRAMBLED_ZETAN
        } else {
            zeta(SCRAMBLED_ITEM_COUNT as u64 + 1, theta)
        };
        Self {
            min,
            itemcount: max.saturating_sub(min).saturating_add(1).max(1),
            zipf: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, theta, zetan),
        }
    }

    /// Draws one item.
    pub fn next(&mut self, rng: &mut impl Rng) -> i64 {
        self.min + fnvhash64(self.zipf.next(rng)) % self.itemcount
    }
}

/// YCSB's `SkewedLatestGenerator`: a zipfian over the distance from the newest acknowledged
/// item, so the most recent inserts are the most popular.
#[derive(Debug, Clone)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// A generator whose newest item is currently `last` (the counter's last acknowledged
    /// value).
    pub fn new(last: i64, theta: f64) -> Self {
        Self {
            zipfian: Zipfian::new(0, last - 1, theta),
        }
    }

    /// Draws one item given the newest acknowledged item `last`: `last` itself is the most
    /// popular, then `last - 1`, and so on.
    pub fn next(&mut self, rng: &mut impl Rng, last: i64) -> i64 {
        let count = u64::try_from(last).unwrap_or(0);
        last - self.zipfian.next_in(rng, count)
    }
}

/// YCSB's `AcknowledgedCounterGenerator`: hands out increasing insert numbers and reports as
/// "last" only the end of the contiguous run of numbers whose inserts were acknowledged, so
/// readers never ask for a key whose insert has not finished.
///
/// Shared by all the per-thread generators of one workload (behind an `Arc`).
#[derive(Debug)]
pub struct AcknowledgedCounter {
    next: AtomicI64,
    limit: AtomicI64,
    pending: Mutex<BTreeSet<i64>>,
}

impl AcknowledgedCounter {
    /// A counter whose first value is `start` and whose last acknowledged value is `start - 1`.
    pub fn new(start: i64) -> Self {
        Self {
            next: AtomicI64::new(start),
            limit: AtomicI64::new(start - 1),
            pending: Mutex::new(BTreeSet::new()),
        }
    }

    /// Hands out the next number.
    pub fn next_value(&self) -> i64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The highest number `n` such that every number up to `n` has been acknowledged.
    pub fn last_value(&self) -> i64 {
        self.limit.load(Ordering::Acquire)
    }

    /// The number the next call to [`AcknowledgedCounter::next_value`] would return.
    pub fn peek_next(&self) -> i64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Marks `value`'s insert as done. Values already covered, or acknowledged twice, are
    /// ignored.
    pub fn acknowledge(&self, value: i64) {
        let mut pending = self.pending.lock();
        let mut limit = self.limit.load(Ordering::Acquire);
        if value <= limit {
            return;
        }
        pending.insert(value);
        while pending.remove(&(limit + 1)) {
            limit += 1;
        }
        self.limit.store(limit, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn fnv1a_64_matches_published_test_vectors() {
        // From the FNV reference test suite (Noll, "FNV-1a 64 bit" vectors).
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn fnvhash64_matches_ycsb_key_numbers() {
        // Key names printed by real YCSB load runs for key numbers 0, 1 and 2
        // (`INSERT usertable user6284781860667377211 ...`).
        assert_eq!(fnvhash64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnvhash64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnvhash64(2), 1_820_151_046_732_198_393);
    }

    fn direct_zeta(n: u64, theta: f64) -> f64 {
        let mut sum = 0.0;
        let mut i = 1_u64;
        while i <= n {
            sum += (i as f64).powf(-theta);
            i += 1;
        }
        sum
    }

    #[test]
    fn zeta_matches_direct_summation_for_small_n() {
        assert_eq!(zeta(1, 0.99), 1.0);
        assert!((zeta(2, 0.99) - (1.0 + 2_f64.powf(-0.99))).abs() < 1e-15);
        for n in [3_u64, 10, 100, 1000] {
            let want = direct_zeta(n, 0.99);
            assert!((zeta(n, 0.99) - want).abs() < 1e-9, "n={n}");
        }
    }

    #[test]
    fn large_n_zeta_agrees_with_direct_sum_and_ycsb_constant() {
        // Euler–Maclaurin against the direct sum just above the switch-over.
        let n = DIRECT_ZETA_LIMIT + 12_345;
        let want = direct_zeta(n, 0.8);
        assert!(((zeta(n, 0.8) - want) / want).abs() < 1e-11);
        // And against YCSB's precomputed zeta(10^10, 0.99).
        let z = zeta(SCRAMBLED_ITEM_COUNT as u64, 0.99);
        assert!((z - SCRAMBLED_ZETAN).abs() < 1e-6, "{z}");
    }

    #[test]
    fn zipfian_rank_frequencies_match_theory() {
        let n = 1000_u64;
        let z = direct_zeta(n, 0.99);
        let mut g = Zipfian::new(0, n as i64 - 1, 0.99);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let draws = 200_000;
        let mut counts = vec![0_u64; n as usize];
        for _ in 0..draws {
            let v = g.next(&mut rng);
            assert!((0..n as i64).contains(&v));
            counts[v as usize] += 1;
        }
        // Ranks 0 and 1 are exact in Gray's method: p(r) = 1/((r+1)^θ ζ(n)).
        for (rank, &count) in counts.iter().enumerate().take(2) {
            let p = 1.0 / (((rank + 1) as f64).powf(0.99) * z);
            let expect = p * draws as f64;
            let sd = (draws as f64 * p * (1.0 - p)).sqrt();
            let got = count as f64;
            assert!(
                (got - expect).abs() < 5.0 * sd,
                "rank {rank}: {got} vs {expect}"
            );
        }
        // The head of the distribution holds about as much mass as theory says.
        let head: f64 = (1..=10).map(|i| (i as f64).powf(-0.99) / z).sum();
        let got: u64 = counts[..10].iter().sum();
        assert!((got as f64 / draws as f64 - head).abs() < 0.02);
    }

    #[test]
    fn scrambled_zipfian_scatters_hot_keys() {
        let mut g = ScrambledZipfian::new(0, 9_999, 0.99);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = vec![0_u32; 10_000];
        for _ in 0..100_000 {
            let v = g.next(&mut rng);
            counts[v as usize] += 1;
        }
        let mut ranked: Vec<usize> = (0..counts.len()).collect();
        ranked.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
        // The hottest item is the hash of rank 0, computed independently from the FNV vector.
        assert_eq!(ranked[0] as i64, 6_284_781_860_667_377_211 % 10_000);
        // The ten hottest keys are spread out, not a contiguous block.
        let mut top: Vec<usize> = ranked[..10].to_vec();
        top.sort_unstable();
        assert!(top[9] - top[0] > 1000, "{top:?}");
        let adjacent = top.windows(2).filter(|w| w[1] - w[0] == 1).count();
        assert!(adjacent < 3, "{top:?}");
    }

    #[test]
    fn skewed_latest_prefers_the_newest_acknowledged_item() {
        let counter = AcknowledgedCounter::new(1000);
        let mut g = SkewedLatest::new(counter.last_value(), 0.99);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let count_top = |g: &mut SkewedLatest, rng: &mut ChaCha8Rng, last: i64| {
            let mut counts = std::collections::HashMap::<i64, u32>::new();
            for _ in 0..20_000 {
                let v = g.next(rng, last);
                assert!(v <= last && v >= 0);
                *counts.entry(v).or_default() += 1;
            }
            let mut v: Vec<_> = counts.into_iter().collect();
            v.sort_by_key(|&(k, c)| (std::cmp::Reverse(c), k));
            v
        };
        let top = count_top(&mut g, &mut rng, counter.last_value());
        assert_eq!(top[0].0, 999);
        assert_eq!(top[1].0, 998);
        for _ in 0..50 {
            let v = counter.next_value();
            counter.acknowledge(v);
        }
        assert_eq!(counter.last_value(), 1049);
        let top = count_top(&mut g, &mut rng, counter.last_value());
        assert_eq!(top[0].0, 1049);
    }

    #[test]
    fn acknowledged_counter_reports_only_contiguous_acknowledgements() {
        let c = AcknowledgedCounter::new(10);
        assert_eq!(c.last_value(), 9);
        let (a, b, d) = (c.next_value(), c.next_value(), c.next_value());
        assert_eq!((a, b, d), (10, 11, 12));
        c.acknowledge(b);
        c.acknowledge(d);
        assert_eq!(c.last_value(), 9, "10 is still in flight");
        c.acknowledge(a);
        assert_eq!(c.last_value(), 12);
        c.acknowledge(a);
        assert_eq!(c.last_value(), 12);
    }
}
