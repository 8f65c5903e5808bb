//! The server's lease table: who may use which object's cached address, and until when.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{Clock, Timestamp};
use crate::error::LeaseError;

/// A lease as the server granted it. The holder must stop using it at `holder_deadline`;
/// the server honours it until `server_deadline`, `skew` later, so that a holder whose clock
/// runs slightly behind never uses an address the server has already reclaimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The leased object.
    pub obj: u64,
    /// Who holds it.
    pub holder: u64,
    /// When the server granted (or last extended) it, on the server's clock.
    pub granted_at: Timestamp,
    /// The server must not free, promote or evict the object before this instant.
    pub server_deadline: Timestamp,
    /// The holder must not use the lease from this instant on (server clock; see
    /// [`HeldLease::from_grant`] for the holder's own clock).
    pub holder_deadline: Timestamp,
}

impl Lease {
    /// Whether the server still honours the lease at `now`.
    pub fn is_valid_for_server(&self, now: Timestamp) -> bool {
        now < self.server_deadline
    }

    /// Whether the holder may still use the lease at `now`.
    pub fn is_valid_for_holder(&self, now: Timestamp) -> bool {
        now < self.holder_deadline
    }
}

/// The holder's side of a lease, on the holder's own clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldLease {
    /// The leased object.
    pub obj: u64,
    /// The holder stops using the lease at this instant of its own clock.
    pub deadline: Timestamp,
}

impl HeldLease {
    /// The holder's view of a lease of `duration` that it *requested* at `requested_at` on its
    /// own clock. Counting from the request (which precedes the grant) and subtracting the
    /// skew allowance keeps the holder's deadline before the server's whatever the message
    /// delay, as long as the clocks' rates differ by less than `skew` over one lease.
    pub fn from_grant(
        obj: u64,
        requested_at: Timestamp,
        duration: Duration,
        skew: Duration,
    ) -> Self {
        let deadline = requested_at.saturating_add(duration.saturating_sub(skew));
        Self { obj, deadline }
    }

    /// Whether the holder may still use the lease at `now` (its own clock).
    pub fn is_valid(&self, now: Timestamp) -> bool {
        now < self.deadline
    }
}

/// Settings of a [`LeaseTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How much earlier than the server a holder considers its lease expired.
    pub skew: Duration,
    /// Longer requests are cut to this, which bounds how long a free, promotion or eviction
    /// can ever wait.
    pub max_duration: Duration,
    /// Independently locked parts of the table (at least one).
    pub shards: usize,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            skew: Duration::from_micros(50),
            max_duration: Duration::from_secs(1),
            shards: 16,
        }
    }
}

/// Counters of what a [`LeaseTable`] did since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Leases granted (new or re-granted).
    pub grants: u64,
    /// Live leases extended by renewal.
    pub renewals: u64,
    /// Leases given back before they expired.
    pub releases: u64,
    /// Grants and renewals refused (fenced object, dead lease).
    pub refused: u64,
    /// Expired entries dropped from memory.
    pub pruned: u64,
    /// Entries currently held in memory, including expired ones not yet pruned.
    pub entries: u64,
}

#[derive(Debug)]
struct Counters {
    grants: AtomicU64,
    renewals: AtomicU64,
    releases: AtomicU64,
    refused: AtomicU64,
    pruned: AtomicU64,
    m_grants: metrics::Counter,
    m_renewals: metrics::Counter,
    m_releases: metrics::Counter,
    m_refused: metrics::Counter,
    m_pruned: metrics::Counter,
    m_wait: metrics::Histogram,
}

impl Counters {
    fn new() -> Self {
        Self {
            grants: AtomicU64::new(0),
            renewals: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            pruned: AtomicU64::new(0),
            m_grants: metrics::counter!("dmkit_lease_grants_total"),
            m_renewals: metrics::counter!("dmkit_lease_renewals_total"),
            m_releases: metrics::counter!("dmkit_lease_releases_total"),
            m_refused: metrics::counter!("dmkit_lease_refused_total"),
            m_pruned: metrics::counter!("dmkit_lease_pruned_total"),
            m_wait: metrics::histogram!("dmkit_lease_expiry_wait_seconds"),
        }
    }

    fn bump(counter: &AtomicU64, metric: &metrics::Counter, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
            metric.increment(n);
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct HolderEntry {
    holder: u64,
    granted_at: Timestamp,
    server_deadline: Timestamp,
}

#[derive(Debug, Default)]
struct ObjectLeases {
    holders: Vec<HolderEntry>,
    fences: u32,
}

impl ObjectLeases {
    /// Drops expired holders; returns how many.
    fn prune(&mut self, now: Timestamp) -> usize {
        let before = self.holders.len();
        self.holders.retain(|h| h.server_deadline > now);
        before - self.holders.len()
    }

    fn latest_deadline(&self, now: Timestamp) -> Option<Timestamp> {
        self.holders
            .iter()
            .map(|h| h.server_deadline)
            .filter(|&d| d > now)
            .max()
    }

    fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.fences == 0
    }
}

/// Fewest entries a shard holds before a full sweep is considered.
const MIN_SWEEP: usize = 64;

#[derive(Debug)]
struct Shard {
    objects: HashMap<u64, ObjectLeases>,
    entries: usize,
    sweep_above: usize,
}

impl Shard {
    fn new() -> Self {
        Self {
            objects: HashMap::new(),
            entries: 0,
            sweep_above: MIN_SWEEP,
        }
    }

    fn sweep(&mut self, now: Timestamp) -> usize {
        let mut pruned = 0;
        self.objects.retain(|_, o| {
            pruned += o.prune(now);
            !o.is_empty()
        });
        self.entries -= pruned;
        // Doubling the threshold after each sweep keeps sweeping amortised O(1) per grant and
        // the shard's memory within twice its live entries (plus MIN_SWEEP).
        self.sweep_above = (2 * self.entries).max(MIN_SWEEP);
        pruned
    }
}

/// The server's lease table, keyed by object and holder.
///
/// Memory stays bounded by the live leases: expired entries of an object are dropped whenever
/// it is touched, and each shard is swept whenever it has doubled since its last sweep.
#[derive(Debug)]
pub struct LeaseTable<C: Clock> {
    clock: C,
    config: LeaseConfig,
    shards: Box<[Mutex<Shard>]>,
    counters: Counters,
}

impl<C: Clock> LeaseTable<C> {
    /// An empty table that reads time from `clock`.
    pub fn new(clock: C, config: LeaseConfig) -> Self {
        let shards = (0..config.shards.max(1))
            .map(|_| Mutex::new(Shard::new()))
            .collect();
        Self {
            clock,
            config,
            shards,
            counters: Counters::new(),
        }
    }

    /// The table's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The table's settings.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    fn shard(&self, obj: u64) -> &Mutex<Shard> {
        // Fibonacci hashing spreads sequential object ids over the shards.
        let h = obj.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        &self.shards[(h % self.shards.len() as u64) as usize]
    }

    fn lease_of(&self, obj: u64, e: &HolderEntry) -> Lease {
        let holder_deadline = e
            .server_deadline
            .saturating_sub(self.config.skew)
            .max(e.granted_at);
        Lease {
            obj,
            holder: e.holder,
            granted_at: e.granted_at,
            server_deadline: e.server_deadline,
            holder_deadline,
        }
    }

    /// Grants `holder` a lease on `obj` for `duration` (cut to `max_duration`). An existing
    /// lease is extended, never shortened: the holder may rely on the deadline it was given.
    pub fn grant(&self, holder: u64, obj: u64, duration: Duration) -> Result<Lease, LeaseError> {
        self.extend(holder, obj, duration, false)
    }

    /// Extends a lease the server still honours; fails with [`LeaseError::NotHeld`] if it
    /// has expired, so the holder knows to re-validate what it cached.
    pub fn renew(&self, holder: u64, obj: u64, duration: Duration) -> Result<Lease, LeaseError> {
        self.extend(holder, obj, duration, true)
    }

    fn extend(
        &self,
        holder: u64,
        obj: u64,
        duration: Duration,
        renewal: bool,
    ) -> Result<Lease, LeaseError> {
        let duration = duration.min(self.config.max_duration);
        if duration <= self.config.skew {
            return Err(LeaseError::TooShort {
                duration,
                skew: self.config.skew,
            });
        }
        let refuse = |e: LeaseError| {
            Counters::bump(&self.counters.refused, &self.counters.m_refused, 1);
            Err(e)
        };
        let now = self.clock.now();
        let deadline = now.saturating_add(duration);
        let mut shard = self.shard(obj).lock();
        let shard = &mut *shard;
        let entry = shard.objects.entry(obj).or_default();
        let pruned = entry.prune(now);
        shard.entries -= pruned;
        Counters::bump(
            &self.counters.pruned,
            &self.counters.m_pruned,
            pruned as u64,
        );
        if entry.fences > 0 {
            return refuse(LeaseError::Fenced { obj });
        }
        let lease = match entry.holders.iter_mut().find(|h| h.holder == holder) {
            Some(h) => {
                h.granted_at = now;
                h.server_deadline = h.server_deadline.max(deadline);
                *h
            }
            None if renewal => {
                if entry.is_empty() {
                    shard.objects.remove(&obj);
                }
                return refuse(LeaseError::NotHeld { holder, obj });
            }
            None => {
                let h = HolderEntry {
                    holder,
                    granted_at: now,
                    server_deadline: deadline,
                };
                entry.holders.push(h);
                shard.entries += 1;
                h
            }
        };
        if renewal {
            Counters::bump(&self.counters.renewals, &self.counters.m_renewals, 1);
        } else {
            Counters::bump(&self.counters.grants, &self.counters.m_grants, 1);
        }
        if shard.entries > shard.sweep_above {
            let swept = shard.sweep(now);
            Counters::bump(&self.counters.pruned, &self.counters.m_pruned, swept as u64);
        }
        Ok(self.lease_of(obj, &lease))
    }

    /// Gives a lease back early; returns whether the server still honoured it.
    pub fn release(&self, holder: u64, obj: u64) -> bool {
        let now = self.clock.now();
        let mut shard = self.shard(obj).lock();
        let Some(entry) = shard.objects.get_mut(&obj) else {
            return false;
        };
        let Some(i) = entry.holders.iter().position(|h| h.holder == holder) else {
            return false;
        };
        let live = entry.holders.swap_remove(i).server_deadline > now;
        let empty = entry.is_empty();
        shard.entries -= 1;
        if empty {
            shard.objects.remove(&obj);
        }
        if live {
            Counters::bump(&self.counters.releases, &self.counters.m_releases, 1);
        }
        live
    }

    /// The lease `holder` has on `obj`, if the server still honours it at the current time.
    pub fn lease(&self, holder: u64, obj: u64) -> Option<Lease> {
        let now = self.clock.now();
        let shard = self.shard(obj).lock();
        let e = shard
            .objects
            .get(&obj)?
            .holders
            .iter()
            .find(|h| h.holder == holder && h.server_deadline > now)?;
        Some(self.lease_of(obj, e))
    }

    /// Whether the server honours `holder`'s lease on `obj` at `now` (the server's view: the
    /// object may not be reclaimed while this holds).
    pub fn is_valid(&self, holder: u64, obj: u64, now: Timestamp) -> bool {
        self.find(holder, obj)
            .is_some_and(|l| l.is_valid_for_server(now))
    }

    /// Whether `holder` may still use its lease on `obj` at `now` (the holder's view, `skew`
    /// earlier than the server's).
    pub fn is_valid_for_holder(&self, holder: u64, obj: u64, now: Timestamp) -> bool {
        self.find(holder, obj)
            .is_some_and(|l| l.is_valid_for_holder(now))
    }

    fn find(&self, holder: u64, obj: u64) -> Option<Lease> {
        let shard = self.shard(obj).lock();
        let e = shard
            .objects
            .get(&obj)?
            .holders
            .iter()
            .find(|h| h.holder == holder)?;
        Some(self.lease_of(obj, e))
    }

    /// The latest server deadline over all live leases on `obj`: the server must not free,
    /// promote or evict it before then. `None` when no lease on it is live.
    pub fn expiry_of(&self, obj: u64) -> Option<Timestamp> {
        let now = self.clock.now();
        self.shard(obj)
            .lock()
            .objects
            .get(&obj)?
            .latest_deadline(now)
    }

    /// How long until every lease on `obj` has expired (zero if none is live). Callers on
    /// virtual time advance their clock by this much instead of blocking.
    pub fn time_until_expired(&self, obj: u64) -> Duration {
        let now = self.clock.now();
        self.expiry_of(obj)
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// Blocks until every lease on `obj` has expired. Leases granted or renewed meanwhile are
    /// waited for too; [`fence`](Self::fence) the object first so that this terminates.
    pub fn wait_until_expired(&self, obj: u64) {
        let start = self.clock.now();
        while let Some(deadline) = self.expiry_of(obj) {
            self.clock.sleep_until(deadline);
        }
        let waited = self.clock.now().saturating_duration_since(start);
        self.counters.m_wait.record(waited.as_secs_f64());
    }

    /// Stops new grants and renewals on `obj` until the returned guard is dropped, so that the
    /// server can wait for the existing leases to drain before freeing, promoting or evicting.
    pub fn fence(&self, obj: u64) -> Fence<'_, C> {
        self.shard(obj)
            .lock()
            .objects
            .entry(obj)
            .or_default()
            .fences += 1;
        Fence { table: self, obj }
    }

    fn lift_fence(&self, obj: u64) {
        let mut shard = self.shard(obj).lock();
        if let Some(entry) = shard.objects.get_mut(&obj) {
            entry.fences -= 1;
            if entry.is_empty() {
                shard.objects.remove(&obj);
            }
        }
    }

    /// Drops every expired entry now; returns how many. Not needed for bounded memory (that
    /// happens on its own) but useful before taking statistics.
    pub fn prune(&self) -> usize {
        let now = self.clock.now();
        let pruned: usize = self.shards.iter().map(|s| s.lock().sweep(now)).sum();
        Counters::bump(
            &self.counters.pruned,
            &self.counters.m_pruned,
            pruned as u64,
        );
        pruned
    }

    /// Entries in memory, including expired ones not yet pruned.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().entries).sum()
    }

    /// Whether the table holds no entries at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the table has done so far.
    pub fn stats(&self) -> LeaseStats {
        let c = &self.counters;
        LeaseStats {
            grants: c.grants.load(Ordering::Relaxed),
            renewals: c.renewals.load(Ordering::Relaxed),
            releases: c.releases.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            pruned: c.pruned.load(Ordering::Relaxed),
            entries: self.len() as u64,
        }
    }
}

/// Keeps an object fenced (no new grants or renewals) while it lives; see
/// [`LeaseTable::fence`].
#[derive(Debug)]
#[must_use = "the fence is lifted as soon as it is dropped"]
pub struct Fence<'a, C: Clock> {
    table: &'a LeaseTable<C>,
    obj: u64,
}

impl<C: Clock> Fence<'_, C> {
    /// The fenced object.
    pub fn obj(&self) -> u64 {
        self.obj
    }

    /// Blocks until the leases granted before the fence have expired.
    pub fn wait_until_expired(&self) {
        self.table.wait_until_expired(self.obj)
    }

    /// How long until the leases granted before the fence have expired.
    pub fn time_until_expired(&self) -> Duration {
        self.table.time_until_expired(self.obj)
    }
}

impl<C: Clock> Drop for Fence<'_, C> {
    fn drop(&mut self) {
        self.table.lift_fence(self.obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::VirtualClock;

    const MS: Duration = Duration::from_millis(1);

    fn table(skew: Duration) -> (VirtualClock, LeaseTable<VirtualClock>) {
        let clock = VirtualClock::new();
        let config = LeaseConfig {
            skew,
            max_duration: Duration::from_secs(1),
            shards: 4,
        };
        (clock.clone(), LeaseTable::new(clock, config))
    }

    #[test]
    fn granted_lease_is_valid_until_its_deadline() {
        let (clock, t) = table(Duration::ZERO);
        let lease = t.grant(7, 1, 10 * MS).unwrap();
        assert_eq!(
            lease.server_deadline,
            Timestamp::ZERO.saturating_add(10 * MS)
        );
        assert!(t.is_valid(7, 1, clock.now()));
        assert!(
            !t.is_valid(8, 1, clock.now()),
            "another holder has no lease"
        );
        clock.advance(10 * MS - Duration::from_nanos(1));
        assert!(t.is_valid(7, 1, clock.now()));
    }

    #[test]
    fn expired_lease_is_not_valid() {
        let (clock, t) = table(Duration::ZERO);
        t.grant(7, 1, 10 * MS).unwrap();
        clock.advance(10 * MS);
        assert!(!t.is_valid(7, 1, clock.now()));
        assert_eq!(t.lease(7, 1), None);
        assert_eq!(t.expiry_of(1), None);
    }

    #[test]
    fn holder_deadline_is_skew_before_server_deadline() {
        let (clock, t) = table(2 * MS);
        let lease = t.grant(7, 1, 10 * MS).unwrap();
        assert_eq!(
            lease
                .server_deadline
                .saturating_duration_since(lease.holder_deadline),
            2 * MS
        );
        clock.advance(9 * MS);
        assert!(
            !t.is_valid_for_holder(7, 1, clock.now()),
            "the holder has already stopped"
        );
        assert!(
            t.is_valid(7, 1, clock.now()),
            "the server still protects the object"
        );
    }

    #[test]
    fn held_lease_counts_from_the_request_and_subtracts_skew() {
        let held = HeldLease::from_grant(
            1,
            Timestamp::from_nanos(1_000),
            Duration::from_nanos(500),
            Duration::from_nanos(100),
        );
        assert_eq!(held.deadline, Timestamp::from_nanos(1_400));
        assert!(held.is_valid(Timestamp::from_nanos(1_399)));
        assert!(!held.is_valid(Timestamp::from_nanos(1_400)));
    }

    #[test]
    fn lease_not_longer_than_skew_is_refused() {
        let (_, t) = table(2 * MS);
        assert_eq!(
            t.grant(1, 1, 2 * MS),
            Err(LeaseError::TooShort {
                duration: 2 * MS,
                skew: 2 * MS
            })
        );
    }

    #[test]
    fn requests_beyond_max_duration_are_cut() {
        let (_, t) = table(Duration::ZERO);
        let lease = t.grant(1, 1, Duration::from_secs(60)).unwrap();
        assert_eq!(
            lease.server_deadline,
            Timestamp::ZERO.saturating_add(Duration::from_secs(1))
        );
    }

    #[test]
    fn regrant_extends_but_never_shortens() {
        let (clock, t) = table(Duration::ZERO);
        t.grant(7, 1, 100 * MS).unwrap();
        clock.advance(10 * MS);
        let shorter = t.grant(7, 1, 5 * MS).unwrap();
        assert_eq!(
            shorter.server_deadline,
            Timestamp::ZERO.saturating_add(100 * MS)
        );
        let longer = t.renew(7, 1, 200 * MS).unwrap();
        assert_eq!(
            longer.server_deadline,
            Timestamp::ZERO.saturating_add(210 * MS)
        );
        assert_eq!(t.len(), 1, "one entry per (holder, object)");
    }

    #[test]
    fn renewing_an_expired_lease_fails() {
        let (clock, t) = table(Duration::ZERO);
        t.grant(7, 1, 10 * MS).unwrap();
        clock.advance(10 * MS);
        assert_eq!(
            t.renew(7, 1, 10 * MS),
            Err(LeaseError::NotHeld { holder: 7, obj: 1 })
        );
        assert_eq!(
            t.renew(8, 2, 10 * MS),
            Err(LeaseError::NotHeld { holder: 8, obj: 2 })
        );
        assert_eq!(t.len(), 0, "the failed renewals left nothing behind");
    }

    #[test]
    fn released_lease_no_longer_delays_expiry() {
        let (_, t) = table(Duration::ZERO);
        t.grant(7, 1, 10 * MS).unwrap();
        t.grant(8, 1, 50 * MS).unwrap();
        assert!(t.release(8, 1));
        assert!(!t.release(8, 1));
        assert_eq!(
            t.expiry_of(1),
            Some(Timestamp::ZERO.saturating_add(10 * MS))
        );
        assert_eq!(t.stats().releases, 1);
    }

    #[test]
    fn expiry_is_the_latest_over_all_holders() {
        let (clock, t) = table(Duration::ZERO);
        t.grant(1, 9, 30 * MS).unwrap();
        t.grant(2, 9, 10 * MS).unwrap();
        clock.advance(5 * MS);
        t.grant(3, 9, 20 * MS).unwrap();
        assert_eq!(
            t.expiry_of(9),
            Some(Timestamp::ZERO.saturating_add(30 * MS))
        );
        assert_eq!(t.time_until_expired(9), 25 * MS);
        clock.advance(25 * MS);
        assert_eq!(t.time_until_expired(9), Duration::ZERO);
    }

    #[test]
    fn fence_refuses_grants_until_dropped() {
        let (clock, t) = table(Duration::ZERO);
        t.grant(1, 9, 10 * MS).unwrap();
        {
            let fence = t.fence(9);
            assert_eq!(t.grant(2, 9, 10 * MS), Err(LeaseError::Fenced { obj: 9 }));
            assert_eq!(t.renew(1, 9, 10 * MS), Err(LeaseError::Fenced { obj: 9 }));
            assert_eq!(fence.time_until_expired(), 10 * MS);
            clock.advance(fence.time_until_expired());
            assert_eq!(fence.time_until_expired(), Duration::ZERO);
        }
        assert!(t.grant(2, 9, 10 * MS).is_ok());
        assert_eq!(t.stats().refused, 2);
    }

    #[test]
    fn wait_until_expired_blocks_until_virtual_time_passes_the_deadline() {
        let (clock, t) = table(Duration::ZERO);
        let t = std::sync::Arc::new(t);
        t.grant(1, 9, 10 * MS).unwrap();
        t.grant(2, 9, 20 * MS).unwrap();
        let waiter = {
            let t = t.clone();
            std::thread::spawn(move || {
                let fence = t.fence(9);
                fence.wait_until_expired();
                t.clock().now()
            })
        };
        // Step in small increments so the waiter sees intermediate deadlines pass too.
        while !waiter.is_finished() {
            clock.advance(MS);
            std::thread::yield_now();
        }
        assert!(waiter.join().unwrap() >= Timestamp::ZERO.saturating_add(20 * MS));
    }

    #[test]
    fn wait_until_expired_works_on_the_real_clock() {
        let t = LeaseTable::new(
            crate::SystemClock,
            LeaseConfig {
                skew: Duration::ZERO,
                ..LeaseConfig::default()
            },
        );
        let lease = t.grant(1, 9, 2 * MS).unwrap();
        t.wait_until_expired(9);
        assert!(t.clock().now() >= lease.server_deadline);
        assert_eq!(t.expiry_of(9), None);
    }

    #[test]
    fn memory_stays_bounded_by_live_leases() {
        let (clock, t) = table(Duration::ZERO);
        for round in 0..50u64 {
            for obj in 0..1_000u64 {
                t.grant(round, obj + round * 1_000, MS + MS).unwrap();
            }
            clock.advance(2 * MS);
        }
        // 1,000 live entries at most after each round; sweeps keep at most about twice that
        // per shard (plus a small constant), never the 50,000 ever granted.
        assert!(t.len() <= 2 * 1_000 + 4 * MIN_SWEEP, "len = {}", t.len());
        assert!(t.stats().pruned >= 45_000);
        clock.advance(2 * MS);
        t.prune();
        assert!(t.is_empty());
    }

    #[test]
    fn table_is_shareable_across_threads() {
        let (_, t) = table(Duration::ZERO);
        std::thread::scope(|s| {
            for holder in 0..2u64 {
                let t = &t;
                s.spawn(move || {
                    for obj in 0..500 {
                        t.grant(holder, obj, 10 * MS).unwrap();
                    }
                });
            }
        });
        assert_eq!(t.len(), 1_000);
        assert_eq!(t.stats().grants, 1_000);
    }
}
