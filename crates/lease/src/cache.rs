//! The holder's side of many leases: a client's table of the leases it holds, each with what
//! the lease carries (`V`: where the object is, how big it is), and early renewal.
//!
//! - A lease is valid until its holder deadline (counted from the *request*, less the skew
//!   allowance, as [`HeldLease::from_grant`] does) and only in the `epoch` it was granted in —
//!   an epoch the caller defines, say one more per reconnection to the server, so a lease of
//!   a server process that may since have restarted is never used.
//! - **Early renewal.** Past half of a lease, [`LeaseCache::valid`] says to renew it: the
//!   caller posts the renewal (`R`, any future of the reply) with [`LeaseCache::renew`] and
//!   goes on with the lease it holds; a later access finds the reply in and installs the
//!   new lease ([`LeaseCache::install`], which keeps the longer of the two). A renewal is
//!   never waited for: polled without blocking, dropped if it is not in when the lease lapsed.
//!   A lease is renewed early only while more than a lease RPC's round trip is left of it
//!   ([`LeaseCache::record_rtt`]), else the renewal would land after it lapsed anyway.
//! - [`LeaseCache::prune`] forgets lapsed leases, so a client that touched many objects once
//!   does not keep an entry for each.
//!
//! ```
//! use std::time::Duration;
//! use dmkit_lease::{Clock, LeaseCache, VirtualClock};
//!
//! let clock = VirtualClock::new();
//! // Leases on objects named by u64, carrying a location; renewals are ready futures here.
//! let cache: LeaseCache<u64, &str, std::future::Ready<Duration>> =
//!     LeaseCache::new(Duration::from_millis(1), true);
//! let t0 = clock.now();
//! cache.install(7, cache.from_grant("dram@0x40", 0, t0, Duration::from_millis(11)));
//! assert_eq!(cache.valid(&7, 0, clock.now()).map(|(l, _)| l.value), Some("dram@0x40"));
//! assert!(cache.valid(&7, 1, clock.now()).is_none()); // another epoch
//!
//! // Past half of it: renew early (the reply is in at once here) and install the new lease.
//! clock.advance(Duration::from_millis(6));
//! let (_, renew) = cache.valid(&7, 0, clock.now()).unwrap();
//! assert!(renew);
//! let now = clock.now();
//! let r = cache.renew(&7, 0, now, || Some(std::future::ready(Duration::from_millis(11))));
//! let r = r.expect("a ready reply");
//! cache.install(7, cache.from_grant("dram@0x40", r.epoch, r.requested_at, r.reply));
//! clock.advance(Duration::from_millis(8));
//! assert!(cache.valid(&7, 0, clock.now()).is_some());
//!
//! // Lapsed leases go at the next prune.
//! clock.advance(Duration::from_secs(1));
//! cache.prune(clock.now());
//! assert!(cache.is_empty());
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::Timestamp;
use crate::table::HeldLease;

/// A lease the holder keeps: what it carries, until when, and in which epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedLease<V> {
    /// What the grant said (a location, a size).
    pub value: V,
    /// The holder stops using the lease at this instant of its own clock.
    pub deadline: Timestamp,
    /// The epoch the lease was granted in.
    pub epoch: u64,
    /// Half of the lease: past this, the lease is renewed early.
    renew_at: Timestamp,
}

impl<V> CachedLease<V> {
    /// Whether the holder may still use the lease at `now`.
    pub fn is_valid(&self, now: Timestamp) -> bool {
        now < self.deadline
    }
}

/// A renewal whose reply is in.
#[derive(Debug)]
pub struct Renewed<T> {
    /// When the renewal was requested (the new lease counts from here).
    pub requested_at: Timestamp,
    /// The epoch it was requested in.
    pub epoch: u64,
    /// The reply.
    pub reply: T,
}

/// A renewal in flight.
#[derive(Debug)]
struct Renewal<R> {
    requested_at: Timestamp,
    epoch: u64,
    reply: R,
}

impl<R: Future + Unpin> Renewal<R> {
    /// Polls the reply once, without waiting.
    fn poll_once(&mut self) -> Option<R::Output> {
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut self.reply).poll(&mut cx) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }

    fn renewed(self, reply: R::Output) -> Renewed<R::Output> {
        Renewed {
            requested_at: self.requested_at,
            epoch: self.epoch,
            reply,
        }
    }
}

/// A holder's leases by key (see the module docs).
#[derive(Debug)]
pub struct LeaseCache<K, V, R> {
    skew: Duration,
    renew_early: bool,
    entries: Mutex<HashMap<K, CachedLease<V>>>,
    /// Early renewals in flight, one per key at most.
    renewing: Mutex<HashMap<K, Renewal<R>>>,
    /// A lease RPC's round trip, smoothed (ns).
    rtt_ns: AtomicU64,
}

impl<K: Hash + Eq + Clone, V: Clone, R: Future + Unpin> LeaseCache<K, V, R> {
    /// An empty cache with the lease skew allowance `skew` (the servers'); `renew_early`
    /// turns early renewal on.
    pub fn new(skew: Duration, renew_early: bool) -> Self {
        Self {
            skew,
            renew_early,
            entries: Mutex::new(HashMap::new()),
            renewing: Mutex::new(HashMap::new()),
            rtt_ns: AtomicU64::new(0),
        }
    }

    /// The lease a grant of `duration` makes, requested at `requested_at` in `epoch`.
    pub fn from_grant(
        &self,
        value: V,
        epoch: u64,
        requested_at: Timestamp,
        duration: Duration,
    ) -> CachedLease<V> {
        let usable = duration.saturating_sub(self.skew);
        CachedLease {
            value,
            deadline: HeldLease::from_grant(0, requested_at, duration, self.skew).deadline,
            epoch,
            renew_at: requested_at.saturating_add(usable / 2),
        }
    }

    /// `key`'s lease if it is valid at `now` in `epoch`, and whether to renew it early now.
    pub fn valid(&self, key: &K, epoch: u64, now: Timestamp) -> Option<(CachedLease<V>, bool)> {
        let l = self.entries.lock().get(key).cloned()?;
        if l.epoch != epoch || !l.is_valid(now) {
            return None;
        }
        let left = l.deadline.saturating_duration_since(now);
        let rtt = Duration::from_nanos(self.rtt_ns.load(Ordering::Relaxed));
        let renew = self.renew_early && now >= l.renew_at && left > rtt;
        Some((l, renew))
    }

    /// `key`'s lease, valid or not.
    pub fn get(&self, key: &K) -> Option<CachedLease<V>> {
        self.entries.lock().get(key).cloned()
    }

    /// Installs `lease` for `key`, unless the cache holds a longer one of the same epoch;
    /// returns the lease held afterwards.
    pub fn install(&self, key: K, lease: CachedLease<V>) -> CachedLease<V> {
        let mut entries = self.entries.lock();
        match entries.get(&key) {
            Some(old) if old.epoch == lease.epoch && old.deadline >= lease.deadline => old.clone(),
            _ => {
                entries.insert(key, lease.clone());
                lease
            }
        }
    }

    /// Records that a lease RPC took `took` (smoothed over the last several).
    pub fn record_rtt(&self, took: Duration) {
        let took = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        let old = self.rtt_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            took
        } else {
            old - old / 8 + took / 8
        };
        self.rtt_ns.store(new, Ordering::Relaxed);
    }

    /// Drives `key`'s early renewal without waiting: polls the one in flight, or starts one
    /// with `post` (which may decline: `None`) at `now` in `epoch` and polls it once, so its
    /// timeout runs from now. Returns the renewal whose reply is in, for the caller to turn
    /// into a lease and [`install`](LeaseCache::install).
    pub fn renew(
        &self,
        key: &K,
        epoch: u64,
        now: Timestamp,
        post: impl FnOnce() -> Option<R>,
    ) -> Option<Renewed<R::Output>> {
        let mut renewing = self.renewing.lock();
        if let Some(r) = renewing.get_mut(key) {
            let reply = r.poll_once()?;
            return Some(
                renewing
                    .remove(key)
                    .expect("polled just now")
                    .renewed(reply),
            );
        }
        let mut r = Renewal {
            requested_at: now,
            epoch,
            reply: post()?,
        };
        match r.poll_once() {
            Some(reply) => Some(r.renewed(reply)),
            None => {
                renewing.insert(key.clone(), r);
                None
            }
        }
    }

    /// Takes `key`'s renewal in flight off the cache (its lease lapsed): its reply if it is in
    /// (one still in flight is dropped — it was asked earlier, so its lease would end sooner
    /// than a fresh one).
    pub fn take_renewed(&self, key: &K) -> Option<Renewed<R::Output>> {
        let mut r = self.renewing.lock().remove(key)?;
        let reply = r.poll_once()?;
        Some(r.renewed(reply))
    }

    /// Drops `key`'s lease.
    pub fn remove(&self, key: &K) {
        self.entries.lock().remove(key);
    }

    /// Keeps only the leases (and renewals in flight) whose key passes `keep`.
    pub fn retain(&self, keep: impl Fn(&K) -> bool) {
        self.entries.lock().retain(|k, _| keep(k));
        self.renewing.lock().retain(|k, _| keep(k));
    }

    /// Forgets the leases that lapsed by `now`.
    pub fn prune(&self, now: Timestamp) {
        self.entries.lock().retain(|_, l| l.is_valid(now));
    }

    /// Leases held (valid or lapsed since the last prune).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, VirtualClock};

    type Reply = std::pin::Pin<Box<dyn Future<Output = u32> + Send>>;

    #[test]
    fn renewals_in_flight_are_polled_not_waited_for() {
        let clock = VirtualClock::new();
        let cache: LeaseCache<u64, u32, Reply> = LeaseCache::new(Duration::ZERO, true);
        let ms = Duration::from_millis;
        cache.install(1, cache.from_grant(10, 0, clock.now(), ms(10)));
        clock.advance(ms(6));
        // Far past half, but the round trip is longer than what is left: no early renewal.
        cache.record_rtt(ms(5));
        assert_eq!(cache.valid(&1, 0, clock.now()).map(|(_, r)| r), Some(false));
        cache.record_rtt(Duration::ZERO);
        cache.record_rtt(Duration::ZERO);
        cache.record_rtt(Duration::ZERO);
        assert_eq!(cache.valid(&1, 0, clock.now()).map(|(_, r)| r), Some(true));
        // A renewal that never answers stays in flight; a second access does not post again.
        let now = clock.now();
        assert!(
            cache
                .renew(&1, 0, now, || Some(Box::pin(std::future::pending())))
                .is_none()
        );
        assert!(cache.renew(&1, 0, now, || panic!("posted twice")).is_none());
        // The lease lapses: the renewal still in flight is dropped.
        clock.advance(ms(10));
        assert!(cache.valid(&1, 0, clock.now()).is_none());
        assert!(cache.take_renewed(&1).is_none());
        // A shorter lease never replaces a longer one of the same epoch; another epoch's does.
        let t = clock.now();
        cache.install(1, cache.from_grant(20, 0, t, ms(10)));
        assert_eq!(
            cache.install(1, cache.from_grant(30, 0, t, ms(5))).value,
            20
        );
        assert_eq!(
            cache.install(1, cache.from_grant(40, 1, t, ms(5))).value,
            40
        );
        cache.install(2, cache.from_grant(50, 1, t, ms(5)));
        cache.retain(|k| *k != 2);
        assert_eq!((cache.len(), cache.get(&1).map(|l| l.value)), (1, Some(40)));
    }
}
