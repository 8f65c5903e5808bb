//! Residency for a DRAM buffer that is filled by someone else: the cache decides, window by
//! window, which objects to promote into DRAM and which to demote, and remembers which are
//! resident and where; the caller does the copying (and whatever must happen first, such as
//! waiting out the objects' leases). A plan/apply split:
//!
//! 1. during a window, [`Residency::report`] merges the clients' [`AccessReport`]s;
//! 2. [`Residency::plan`] ends it: the merged counts are folded into a decayed heat
//!    ([`DecayedHeat`]); the hottest objects that fit the buffer (its free bytes plus what
//!    residents take) displace colder residents, and free room also takes lukewarm objects
//!    ([`DramCachePolicy::plan`] and [`fill`](DramCachePolicy::fill), with hysteresis and a
//!    minimum residency);
//! 3. the caller applies the [`Plan`] with [`Residency::apply`], which hands it each evicted
//!    resident's slot to free and asks it for a copy of each promoted object (the steps are
//!    also there one by one: [`Residency::evict`], [`Residency::promoted`],
//!    [`Residency::not_promoted`]).
//!
//! Gengar's servers keep their hot objects in a DRAM buffer this way; [`crate::HotTier`] is
//! the same for a process that keeps the copies itself.
//!
//! ```
//! use dmkit_cache::{AccessReport, AdmissionConfig, HotEntry, Residency, ResidencyConfig};
//!
//! // A 4 KiB buffer; every object takes a 1 KiB slot; slots are named by their offset here.
//! let dram: Residency<u64> = Residency::new(ResidencyConfig {
//!     admission: AdmissionConfig { capacity_bytes: 4096, smoothing: 1.0, ..Default::default() },
//!     ..ResidencyConfig::default()
//! })?;
//! let entries = vec![HotEntry { obj: 7, count: 50 }, HotEntry { obj: 8, count: 2 }];
//! dram.report(&AccessReport { client: 1, window: 0, total_accesses: 52, entries });
//!
//! let plan = dram.plan(4096, |_obj| Some(1024));
//! assert_eq!(plan.promote.iter().map(|h| h.obj).collect::<Vec<_>>(), vec![7, 8]);
//! for (i, h) in plan.promote.iter().enumerate() {
//!     // ... copy object h.obj into the slot at i * 1024, then:
//!     dram.promoted(h.obj, h.size, i as u64 * 1024);
//! }
//! assert_eq!(dram.get(8), Some(1024));
//! // Object 8 was freed: its slot is the caller's to free.
//! assert_eq!(dram.forget(8), Some(1024));
//! assert_eq!(dram.len(), 1);
//! # Ok::<(), dmkit_cache::CacheError>(())
//! ```

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::admission::{AdmissionConfig, DramCachePolicy, Plan};
use crate::counter::AccessReport;
use crate::error::CacheError;
use crate::heat::DecayedHeat;
use crate::selector::GlobalSelector;

/// Settings of a [`Residency`].
#[derive(Debug, Clone)]
pub struct ResidencyConfig {
    /// The buffer's capacity and the admission policy's settings (the heat handed to the
    /// policy is already smoothed over windows: leave `smoothing` at 1).
    pub admission: AdmissionConfig,
    /// Objects need a heat of at least this many accesses to be hot (to displace residents);
    /// free room also takes lukewarm objects (a heat of at least one access).
    pub min_hot: u64,
    /// Share of an object's heat kept from one window to the next, in [0, 1).
    pub history_decay: f64,
    /// Off, windows still fold the reports into the heat but never plan a move (a buffer of
    /// no bytes).
    pub enabled: bool,
}

impl Default for ResidencyConfig {
    fn default() -> Self {
        Self {
            admission: AdmissionConfig {
                smoothing: 1.0,
                ..AdmissionConfig::default()
            },
            min_hot: 4,
            history_decay: 0.75,
            enabled: true,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Resident<S> {
    slot: S,
    bytes: u64,
}

/// What [`Residency::apply`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Objects copied in (or already resident).
    pub promoted: usize,
    /// Residents whose slot was freed.
    pub evicted: usize,
    /// Planned promotions that got no copy.
    pub skipped: usize,
}

/// Which objects are resident in a DRAM buffer, and which should be (see the module docs).
/// `S` names a resident copy's slot (an offset, a generation).
#[derive(Debug)]
pub struct Residency<S> {
    selector: GlobalSelector,
    heat: DecayedHeat,
    policy: Mutex<DramCachePolicy>,
    resident: Mutex<HashMap<u64, Resident<S>>>,
    min_hot: u64,
    enabled: bool,
}

impl<S: Copy> Residency<S> {
    /// Nothing resident yet.
    pub fn new(config: ResidencyConfig) -> Result<Self, CacheError> {
        Ok(Self {
            // Every reported access counts towards the heat; `min_hot` applies to it.
            selector: GlobalSelector::new(1),
            heat: DecayedHeat::new(config.history_decay)?,
            policy: Mutex::new(DramCachePolicy::new(config.admission)?),
            resident: Mutex::new(HashMap::new()),
            min_hot: config.min_hot,
            enabled: config.enabled,
        })
    }

    /// Merges a client's report of the window.
    pub fn report(&self, report: &AccessReport) {
        self.selector.merge(report);
    }

    /// Ends the window and plans it: what to evict, then what to promote, hottest first.
    /// `free_bytes` is what the buffer has free besides its residents; `size_of` gives the
    /// bytes an object's copy would take there (`None`: it is gone, or too large for the
    /// buffer, and is forgotten).
    pub fn plan(&self, free_bytes: u64, size_of: impl Fn(u64) -> Option<u64>) -> Plan {
        let reported = self.selector.finish_window(u64::MAX, &size_of).hot;
        self.heat.fold(&reported);
        let sizes: HashMap<u64, u64> = reported.iter().map(|r| (r.obj, r.size)).collect();
        let capacity = free_bytes + self.resident_bytes();
        let (hot, lukewarm) = self.heat.select(capacity, self.min_hot, |obj| {
            sizes.get(&obj).copied().or_else(|| size_of(obj))
        });
        if !self.enabled {
            return Plan::default();
        }
        // The hot objects first (they may displace colder residents); then what is free
        // takes the lukewarm ones, which displace nothing.
        let mut policy = self.policy.lock();
        let mut plan = policy.plan(&hot);
        plan.promote.extend(policy.fill(&lukewarm));
        plan
    }

    /// Applies `plan` (once whatever must come first is done — Gengar drains the objects'
    /// leases): each planned eviction of a resident ends its residency and hands its slot to
    /// `free`; each promotion of an object not resident yet asks `copy` for a copy, which
    /// becomes resident with the bytes the plan counted for it — or, when `copy` gives none
    /// (the object went away, no slot was free), is skipped and leaves the policy.
    pub fn apply(
        &self,
        plan: &Plan,
        mut free: impl FnMut(u64, S),
        mut copy: impl FnMut(u64) -> Option<S>,
    ) -> Applied {
        let mut done = Applied::default();
        for &obj in &plan.evict {
            if let Some(slot) = self.evict(obj) {
                free(obj, slot);
                done.evicted += 1;
            }
        }
        for h in &plan.promote {
            if self.get(h.obj).is_none() {
                let Some(slot) = copy(h.obj) else {
                    self.not_promoted(h.obj);
                    done.skipped += 1;
                    continue;
                };
                self.promoted(h.obj, h.size, slot);
            }
            done.promoted += 1;
        }
        done
    }

    /// Records that `obj` was copied in: its copy, of `bytes`, is in `slot`.
    pub fn promoted(&self, obj: u64, bytes: u64, slot: S) {
        self.resident.lock().insert(obj, Resident { slot, bytes });
    }

    /// A planned promotion of `obj` was not carried out (the object went away, no slot was
    /// free): the policy no longer counts it resident.
    pub fn not_promoted(&self, obj: u64) {
        self.policy.lock().remove(obj);
    }

    /// Ends `obj`'s residency (a planned eviction): the slot of its copy, for the caller to
    /// free, if it was resident.
    pub fn evict(&self, obj: u64) -> Option<S> {
        self.resident.lock().remove(&obj).map(|r| r.slot)
    }

    /// Forgets `obj` altogether (it was freed): its residency, its place in the policy and its
    /// heat. Returns the slot of its copy, for the caller to free, if it was resident.
    pub fn forget(&self, obj: u64) -> Option<S> {
        let slot = self.evict(obj);
        self.policy.lock().remove(obj);
        self.heat.forget(obj);
        slot
    }

    /// Where `obj`'s copy is, if it is resident.
    pub fn get(&self, obj: u64) -> Option<S> {
        self.resident.lock().get(&obj).map(|r| r.slot)
    }

    /// Bytes the resident copies take.
    pub fn resident_bytes(&self) -> u64 {
        self.resident.lock().values().map(|r| r.bytes).sum()
    }

    /// Objects resident.
    pub fn len(&self) -> usize {
        self.resident.lock().len()
    }

    /// Whether nothing is resident.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counter::HotEntry;

    fn report(counts: &[(u64, u64)]) -> AccessReport {
        AccessReport {
            client: 1,
            window: 0,
            total_accesses: counts.iter().map(|c| c.1).sum(),
            entries: counts
                .iter()
                .map(|&(obj, count)| HotEntry { obj, count })
                .collect(),
        }
    }

    fn residency(enabled: bool) -> Residency<u32> {
        Residency::new(ResidencyConfig {
            admission: AdmissionConfig {
                capacity_bytes: 200,
                hysteresis: 0.0,
                min_residency_windows: 0,
                smoothing: 1.0,
            },
            history_decay: 0.0,
            enabled,
            ..ResidencyConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn residents_count_against_the_room_and_cold_ones_are_demoted() {
        let r = residency(true);
        r.report(&report(&[(1, 50), (2, 40), (3, 30)]));
        // Room for two objects of 100 bytes.
        let plan = r.plan(200, |_| Some(100));
        let objs: Vec<_> = plan.promote.iter().map(|h| h.obj).collect();
        assert_eq!(objs, vec![1, 2]);
        let done = r.apply(&plan, |_, _| unreachable!(), |o| (o == 1).then_some(10));
        assert_eq!((done.promoted, done.skipped), (1, 1));
        assert_eq!((r.len(), r.resident_bytes(), r.get(1)), (1, 100, Some(10)));
        // Next window 3 and 4 are hot and 1 is cold: 1 makes room (the buffer's 100 free
        // bytes plus its 100), 3 and 4 come in.
        r.report(&report(&[(3, 90), (4, 80)]));
        let plan = r.plan(100, |_| Some(100));
        assert_eq!(plan.evict, vec![1]);
        let mut freed = vec![];
        let done = r.apply(&plan, |o, s| freed.push((o, s)), |o| Some(o as u32));
        assert_eq!((done.evicted, done.promoted, freed), (1, 2, vec![(1, 10)]));
        // Gone objects are forgotten.
        r.report(&report(&[(5, 90)]));
        assert!(r.plan(200, |o| (o != 5).then_some(100)).promote.is_empty());
    }

    #[test]
    fn off_it_plans_nothing() {
        let r = residency(false);
        r.report(&report(&[(1, 50)]));
        assert!(r.plan(200, |_| Some(100)).is_empty());
        assert!(r.forget(1).is_none());
    }
}
