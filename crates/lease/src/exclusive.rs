//! Exclusive leases: at most one holder per key at a time, and only until its lease runs out —
//! a lock that a crashed or partitioned holder cannot keep forever. Gengar's object locks and
//! FUSEE's master claim (one master per cluster, granted by each memory node) are both this.
//!
//! A holder is named by a `token` (compared for "same holder") and carries an `info` the
//! others are told about (who holds it: a pid and an address, a client id). A holder renews by
//! acquiring again with its token; a zero-length acquire gives the lease up.
//!
//! ```
//! use std::time::Duration;
//! use dmkit_lease::{ExclusiveLeases, VirtualClock};
//!
//! let clock = VirtualClock::new();
//! let locks = ExclusiveLeases::new(clock.clone());
//! let ttl = Duration::from_secs(2);
//! assert!(locks.acquire("obj-7", 1, "client 1", ttl).is_ok());
//! // Another holder is refused, and told who holds it and for how long.
//! let held = locks.acquire("obj-7", 2, "client 2", ttl).unwrap_err();
//! assert_eq!((held.token, held.info), (1, "client 1"));
//! // Once the holder's lease ran out (it crashed), the next one gets it.
//! clock.advance(Duration::from_secs(3));
//! assert!(locks.acquire("obj-7", 2, "client 2", ttl).is_ok());
//! assert!(!locks.release(&"obj-7", 1));
//! assert!(locks.release(&"obj-7", 2));
//! ```

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{Clock, Timestamp};

/// The holder of an exclusive lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExclusiveHolder<I> {
    /// Who holds it (what [`ExclusiveLeases::acquire`] compares).
    pub token: u64,
    /// What the holder said about itself.
    pub info: I,
    /// When its lease runs out.
    pub until: Timestamp,
}

/// Exclusive leases on keys `K`, timed by the clock `C`; holders describe themselves with `I`.
#[derive(Debug)]
pub struct ExclusiveLeases<K, I, C: Clock> {
    clock: C,
    held: Mutex<HashMap<K, ExclusiveHolder<I>>>,
}

impl<K: Hash + Eq, I: Clone, C: Clock> ExclusiveLeases<K, I, C> {
    /// No key held.
    pub fn new(clock: C) -> Self {
        Self {
            clock,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// The clock the leases run on.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Takes (or, for the same `token`, renews) the lease on `key` for `ttl` from now: granted
    /// when nobody holds it, its holder's lease ran out, or `token` holds it already. A zero
    /// `ttl` gives the lease up when `token` holds it. Refused: the live holder.
    pub fn acquire(
        &self,
        key: K,
        token: u64,
        info: I,
        ttl: Duration,
    ) -> Result<ExclusiveHolder<I>, ExclusiveHolder<I>> {
        let now = self.clock.now();
        let mut held = self.held.lock();
        if let Some(h) = held.get(&key)
            && h.until > now
            && h.token != token
        {
            return Err(h.clone());
        }
        let granted = ExclusiveHolder {
            token,
            info,
            until: now.saturating_add(ttl),
        };
        if ttl.is_zero() {
            held.remove(&key);
        } else {
            held.insert(key, granted.clone());
        }
        Ok(granted)
    }

    /// Whether `token` may act on `key`: `Err` names another holder whose lease is live.
    /// (Nobody holding it, or a holder whose lease ran out, does not stop `token`.)
    pub fn check(&self, key: &K, token: u64) -> Result<(), ExclusiveHolder<I>> {
        match self.holder(key) {
            Some(h) if h.token != token => Err(h),
            _ => Ok(()),
        }
    }

    /// Gives up `token`'s lease on `key`; false if `token` does not hold it.
    pub fn release(&self, key: &K, token: u64) -> bool {
        let mut held = self.held.lock();
        match held.get(key) {
            Some(h) if h.token == token => {
                held.remove(key);
                true
            }
            _ => false,
        }
    }

    /// The live holder of `key`, if any.
    pub fn holder(&self, key: &K) -> Option<ExclusiveHolder<I>> {
        let now = self.clock.now();
        self.held.lock().get(key).filter(|h| h.until > now).cloned()
    }

    /// Drops `key`'s lease whoever holds it (the key itself went away).
    pub fn remove(&self, key: &K) {
        self.held.lock().remove(key);
    }

    /// Forgets every lease that ran out; returns how many. Call it now and then: a holder that
    /// crashed never releases.
    pub fn prune(&self) -> usize {
        let now = self.clock.now();
        let mut held = self.held.lock();
        let before = held.len();
        held.retain(|_, h| h.until > now);
        before - held.len()
    }

    /// Leases remembered (live or run out but not pruned yet).
    pub fn len(&self) -> usize {
        self.held.lock().len()
    }

    /// Whether no lease is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Time left on `holder`'s lease, as of now.
    pub fn remaining(&self, holder: &ExclusiveHolder<I>) -> Duration {
        holder.until.saturating_duration_since(self.clock.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VirtualClock;

    #[test]
    fn one_holder_until_its_lease_runs_out() {
        let clock = VirtualClock::new();
        let l = ExclusiveLeases::new(clock.clone());
        let ttl = Duration::from_millis(100);
        assert!(l.acquire(1u64, 10, "a", ttl).is_ok());
        // The holder renews; another is refused until the renewed lease runs out.
        clock.advance(Duration::from_millis(60));
        assert!(l.acquire(1, 10, "a", ttl).is_ok());
        clock.advance(Duration::from_millis(60));
        let h = l.acquire(1, 11, "b", ttl).unwrap_err();
        assert_eq!(h.token, 10);
        assert_eq!(l.remaining(&h), Duration::from_millis(40));
        assert_eq!(l.check(&1, 11).unwrap_err().info, "a");
        assert!(l.check(&1, 10).is_ok());
        clock.advance(Duration::from_millis(41));
        assert!(l.check(&1, 11).is_ok());
        assert!(l.holder(&1).is_none());
        assert!(l.acquire(1, 11, "b", ttl).is_ok());
    }

    #[test]
    fn zero_ttl_gives_up_and_prune_forgets_crashed_holders() {
        let clock = VirtualClock::new();
        let l = ExclusiveLeases::new(clock.clone());
        let ttl = Duration::from_millis(10);
        l.acquire("k", 1, (), ttl).unwrap();
        // Another's zero-length acquire is refused like any other.
        assert!(l.acquire("k", 2, (), Duration::ZERO).is_err());
        l.acquire("k", 1, (), Duration::ZERO).unwrap();
        assert!(l.is_empty());
        for k in ["a", "b", "c"] {
            l.acquire(k, 1, (), ttl).unwrap();
        }
        l.acquire("d", 1, (), ttl * 10).unwrap();
        clock.advance(ttl * 2);
        assert_eq!(l.prune(), 3);
        assert_eq!(l.len(), 1);
        l.remove(&"d");
        assert!(l.is_empty());
    }
}
