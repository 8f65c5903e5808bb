//! Which objects the DRAM buffer should take in and give up: pure policy, no copying.

use std::collections::HashMap;

use crate::error::CacheError;
use crate::selector::HotObject;

/// Settings of a [`DramCachePolicy`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdmissionConfig {
    /// DRAM buffer size in bytes.
    pub capacity_bytes: u64,
    /// A newcomer displaces a resident only if its count exceeds the resident's score by
    /// this factor (0.25 = 25 % hotter), so that objects of similar heat do not swap places
    /// every window.
    pub hysteresis: f64,
    /// Weight of the latest window in a resident's smoothed score (1.0 = no memory).
    pub smoothing: f64,
    /// Windows a newly promoted object stays before it may be evicted, so that the copy
    /// into DRAM has time to pay off.
    pub min_residency_windows: u64,
}

impl AdmissionConfig {
    /// The default settings for a buffer of `capacity_bytes`.
    pub fn with_capacity(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            ..Self::default()
        }
    }
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 64 << 20,
            hysteresis: 0.25,
            smoothing: 0.5,
            min_residency_windows: 2,
        }
    }
}

/// What to do this window. Evict first (after the objects' leases expire), then promote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Objects to drop from the DRAM buffer, coldest first.
    pub evict: Vec<u64>,
    /// Objects to copy into the DRAM buffer, hottest first.
    pub promote: Vec<HotObject>,
}

impl Plan {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.evict.is_empty() && self.promote.is_empty()
    }
}

#[derive(Clone, Copy, Debug)]
struct Resident {
    size: u64,
    score: f64,
    since: u64,
    /// Taken in by [`DramCachePolicy::fill`] and not hot since.
    lukewarm: bool,
}

/// Decides, window by window, which objects the DRAM buffer holds. It assumes every
/// [`Plan`] is carried out; tell it with [`remove`](Self::remove) when one is not (promotion
/// failed) or when a resident is freed.
#[derive(Debug)]
pub struct DramCachePolicy {
    config: AdmissionConfig,
    residents: HashMap<u64, Resident>,
    used: u64,
    /// Bytes of the lukewarm residents.
    lukewarm: u64,
    window: u64,
    m_promotions: metrics::Counter,
    m_evictions: metrics::Counter,
}

impl DramCachePolicy {
    /// An empty buffer.
    pub fn new(config: AdmissionConfig) -> Result<Self, CacheError> {
        if config.capacity_bytes == 0 {
            return Err(CacheError::Zero {
                what: "capacity_bytes",
            });
        }
        if !(config.hysteresis >= 0.0 && config.hysteresis.is_finite()) {
            return Err(CacheError::OutOfRange {
                what: "hysteresis",
                value: config.hysteresis,
            });
        }
        if !(config.smoothing > 0.0 && config.smoothing <= 1.0) {
            return Err(CacheError::OutOfRange {
                what: "smoothing",
                value: config.smoothing,
            });
        }
        Ok(Self {
            config,
            residents: HashMap::new(),
            used: 0,
            lukewarm: 0,
            window: 0,
            m_promotions: metrics::counter!("dmkit_cache_promotions_total"),
            m_evictions: metrics::counter!("dmkit_cache_evictions_total"),
        })
    }

    /// Whether `obj` is (planned to be) in DRAM.
    pub fn contains(&self, obj: u64) -> bool {
        self.residents.contains_key(&obj)
    }

    /// Bytes of DRAM the residents take.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// Objects in DRAM.
    pub fn len(&self) -> usize {
        self.residents.len()
    }

    /// Whether DRAM holds nothing.
    pub fn is_empty(&self) -> bool {
        self.residents.is_empty()
    }

    /// Forgets `obj` (freed, or its promotion failed); returns whether it was resident.
    pub fn remove(&mut self, obj: u64) -> bool {
        match self.residents.remove(&obj) {
            Some(r) => {
                self.used -= r.size;
                if r.lukewarm {
                    self.lukewarm -= r.size;
                }
                true
            }
            None => false,
        }
    }

    /// The objects of `list` not in DRAM yet, hottest first, once each.
    fn newcomers(&self, list: &[HotObject]) -> Vec<HotObject> {
        let mut c: Vec<HotObject> = list
            .iter()
            .filter(|h| !self.residents.contains_key(&h.obj) && h.count > 0)
            .copied()
            .collect();
        c.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.obj.cmp(&b.obj)));
        c.dedup_by_key(|h| h.obj);
        c
    }

    /// Takes one window's hot objects (e.g. [`Selection::hot`](crate::Selection)) and decides
    /// what to promote and what to evict to make room.
    pub fn plan(&mut self, hot: &[HotObject]) -> Plan {
        self.window += 1;
        let alpha = self.config.smoothing;
        let counts: HashMap<u64, u64> = hot.iter().map(|h| (h.obj, h.count)).collect();
        for (obj, r) in self.residents.iter_mut() {
            let now = counts.get(obj).copied().unwrap_or(0) as f64;
            r.score = (1.0 - alpha) * r.score + alpha * now;
            if r.lukewarm && now > 0.0 {
                // Hot now: an ordinary resident.
                r.lukewarm = false;
                self.lukewarm -= r.size;
            }
        }

        let candidates = self.newcomers(hot);
        // Victims coldest first; the young are protected.
        let mut victims: Vec<(f64, u64, u64)> = self
            .residents
            .iter()
            .filter(|(_, r)| self.window - r.since >= self.config.min_residency_windows)
            .map(|(&obj, r)| (r.score, obj, r.size))
            .collect();
        victims.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut victims = std::collections::VecDeque::from(victims);

        let mut plan = Plan::default();
        let mut free = self.config.capacity_bytes - self.used;
        for c in candidates {
            if c.size > self.config.capacity_bytes {
                continue;
            }
            let bar = c.count as f64 / (1.0 + self.config.hysteresis);
            let mut needed = c.size.saturating_sub(free);
            let mut take = 0;
            for &(score, _, size) in victims.iter() {
                if needed == 0 || score >= bar {
                    break;
                }
                needed = needed.saturating_sub(size);
                take += 1;
            }
            if needed > 0 {
                continue;
            }
            for (_, obj, size) in victims.drain(..take) {
                free += size;
                plan.evict.push(obj);
            }
            free -= c.size;
            plan.promote.push(c);
        }

        for obj in &plan.evict {
            self.remove(*obj);
        }
        for p in &plan.promote {
            self.residents.insert(
                p.obj,
                Resident {
                    size: p.size,
                    score: p.count as f64,
                    since: self.window,
                    lukewarm: false,
                },
            );
            self.used += p.size;
        }
        self.m_evictions.increment(plan.evict.len() as u64);
        self.m_promotions.increment(plan.promote.len() as u64);
        plan
    }

    /// Takes objects that are not hot enough to displace a resident (lukewarm: seen, but
    /// under the caller's hotness bar) into the DRAM buffer's *free* bytes, hottest first,
    /// and returns the ones to promote. It never evicts: free DRAM serves some reads rather
    /// than none, and a lukewarm resident is the first victim of the next hot object (its
    /// score starts at its count and decays with every window it is not hot in). Lukewarm
    /// residents take at most half the buffer: the rest stays for hot newcomers, which must
    /// not find every slot of their size taken (a DRAM pool allocates by size class).
    pub fn fill(&mut self, lukewarm: &[HotObject]) -> Vec<HotObject> {
        let candidates = self.newcomers(lukewarm);
        let mut out = Vec::new();
        for c in candidates {
            if self.used + c.size > self.config.capacity_bytes
                || self.lukewarm + c.size > self.config.capacity_bytes / 2
            {
                continue;
            }
            self.used += c.size;
            self.lukewarm += c.size;
            self.residents.insert(
                c.obj,
                Resident {
                    size: c.size,
                    score: c.count as f64,
                    since: self.window,
                    lukewarm: true,
                },
            );
            out.push(c);
        }
        self.m_promotions.increment(out.len() as u64);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hot(items: &[(u64, u64)]) -> Vec<HotObject> {
        items
            .iter()
            .map(|&(obj, count)| HotObject {
                obj,
                count,
                size: 100,
            })
            .collect()
    }

    fn policy(capacity_bytes: u64) -> DramCachePolicy {
        DramCachePolicy::new(AdmissionConfig {
            capacity_bytes,
            hysteresis: 0.25,
            smoothing: 0.5,
            min_residency_windows: 1,
        })
        .unwrap()
    }

    #[test]
    fn lukewarm_objects_fill_free_bytes_only_and_go_first() {
        let mut p = policy(500);
        // One hot object, then lukewarm ones take what is free — never a resident's place,
        // and at most half the buffer.
        assert_eq!(p.plan(&hot(&[(1, 50)])).promote.len(), 1);
        let filled = p.fill(&hot(&[(7, 1), (8, 3), (1, 2), (9, 2)]));
        assert_eq!(filled.iter().map(|h| h.obj).collect::<Vec<_>>(), vec![8, 9]);
        assert!(
            p.fill(&hot(&[(10, 3)])).is_empty(),
            "lukewarm at their half"
        );
        assert_eq!(p.used_bytes(), 300);
        assert_eq!(p.plan(&hot(&[(1, 50), (3, 30), (4, 30)])).promote.len(), 2);
        assert_eq!(p.used_bytes(), 500, "hot newcomers take the free half");
        // A hot newcomer displaces a lukewarm resident (not seen since), not the hot one.
        p.plan(&hot(&[(1, 50)]));
        let plan = p.plan(&hot(&[(1, 50), (2, 20)]));
        assert_eq!(
            plan.promote.iter().map(|h| h.obj).collect::<Vec<_>>(),
            vec![2]
        );
        assert_eq!(plan.evict.len(), 1);
        assert!(!plan.evict.contains(&1), "{plan:?}");
    }

    #[test]
    fn hot_objects_are_promoted_while_they_fit() {
        let mut p = policy(250);
        let plan = p.plan(&hot(&[(1, 50), (2, 40), (3, 30)]));
        assert_eq!(
            plan.promote.iter().map(|h| h.obj).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert!(plan.evict.is_empty());
        assert_eq!(p.used_bytes(), 200);
    }

    #[test]
    fn a_much_hotter_object_displaces_the_coldest_resident() {
        let mut p = policy(200);
        p.plan(&hot(&[(1, 50), (2, 40)]));
        let plan = p.plan(&hot(&[(1, 50), (2, 10), (3, 90)]));
        // Object 2's score fell to (40 + 10) / 2 = 25; 90 > 25 × 1.25.
        assert_eq!(
            plan,
            Plan {
                evict: vec![2],
                promote: hot(&[(3, 90)])
            }
        );
        assert!(p.contains(3) && !p.contains(2));
    }

    #[test]
    fn objects_of_similar_heat_do_not_flap() {
        let mut p = policy(200);
        p.plan(&hot(&[(1, 100), (2, 100)]));
        let mut churn = 0;
        for w in 0..20u64 {
            // Object 3 is alternately a little hotter and a little colder than 2.
            let (two, three) = if w % 2 == 0 { (90, 105) } else { (105, 90) };
            let plan = p.plan(&hot(&[(1, 100), (2, two), (3, three)]));
            churn += plan.evict.len() + plan.promote.len();
        }
        assert_eq!(churn, 0);
        assert!(p.contains(1) && p.contains(2));
    }

    #[test]
    fn newly_promoted_objects_are_protected_for_min_residency() {
        let mut p = DramCachePolicy::new(AdmissionConfig {
            capacity_bytes: 100,
            min_residency_windows: 3,
            ..AdmissionConfig::default()
        })
        .unwrap();
        p.plan(&hot(&[(1, 10)]));
        assert!(p.plan(&hot(&[(2, 1_000)])).is_empty());
        assert!(p.plan(&hot(&[(2, 1_000)])).is_empty());
        assert_eq!(p.plan(&hot(&[(2, 1_000)])).evict, vec![1]);
    }

    #[test]
    fn eviction_frees_enough_bytes_for_a_large_object() {
        let mut p = policy(300);
        p.plan(&hot(&[(1, 10), (2, 10), (3, 50)]));
        let big = HotObject {
            obj: 9,
            count: 100,
            size: 200,
        };
        let plan = p.plan(&[big]);
        assert_eq!(plan.evict.len(), 2, "{plan:?}");
        assert_eq!(plan.promote, vec![big]);
        assert!(p.used_bytes() <= 300);
    }

    #[test]
    fn removed_objects_free_their_bytes() {
        let mut p = policy(100);
        p.plan(&hot(&[(1, 10)]));
        assert!(p.remove(1));
        assert!(!p.remove(1));
        assert_eq!(p.used_bytes(), 0);
        assert_eq!(p.plan(&hot(&[(2, 1)])).promote.len(), 1);
    }

    #[test]
    fn invalid_config_is_refused() {
        assert!(
            DramCachePolicy::new(AdmissionConfig {
                capacity_bytes: 0,
                ..AdmissionConfig::default()
            })
            .is_err()
        );
        assert!(
            DramCachePolicy::new(AdmissionConfig {
                smoothing: 0.0,
                ..AdmissionConfig::default()
            })
            .is_err()
        );
    }
}
