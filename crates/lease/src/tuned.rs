//! A server's leases on the objects it hands out, in one piece: a [`LeaseTable`] whose
//! durations come from a [`LeaseTuner`], and the *drain* that moving an object waits for —
//! fence it, wait until every lease granted on it expired, then a grace for operations that
//! were posted under a lease but arrive late (a delayed network, a descheduled soft NIC).
//! Gengar's servers drain objects before they free, promote or evict them.
//!
//! ```
//! use std::time::Duration;
//! use dmkit_lease::{LeaseConfig, SystemClock, Tier, TunedLeases, TunerConfig};
//!
//! let grace = Duration::from_millis(1);
//! let leases = TunedLeases::new(SystemClock::new(), LeaseConfig::default(), TunerConfig::default(), grace)?;
//! let granted = leases.grant(/* holder */ 1, /* obj */ 42)?;
//! assert!(leases.is_valid(1, 42));
//! {
//!     // Promote object 42: no new lease meanwhile, and the old ones are over.
//!     let _fences = leases.drain([42]);
//!     assert!(leases.grant(2, 42).is_err());
//!     assert!(!leases.is_valid(1, 42));
//!     leases.set_tier(42, Tier::Dram);
//! }
//! assert!(leases.grant(2, 42)? > Duration::ZERO);
//! # let _ = granted;
//! # Ok::<(), dmkit_lease::LeaseError>(())
//! ```

use std::time::Duration;

use crate::clock::Clock;
use crate::error::LeaseError;
use crate::table::{Fence, LeaseConfig, LeaseTable};
use crate::tuner::{LeaseTuner, Tier, TunerConfig};

/// Leases with tuned durations, and drains (see the module docs).
#[derive(Debug)]
pub struct TunedLeases<C: Clock> {
    table: LeaseTable<C>,
    tuner: LeaseTuner,
    late_op_grace: Duration,
}

impl<C: Clock> TunedLeases<C> {
    /// Leases on `clock`; a drain waits `late_op_grace` more after the leases expired.
    pub fn new(
        clock: C,
        lease: LeaseConfig,
        tuner: TunerConfig,
        late_op_grace: Duration,
    ) -> Result<Self, LeaseError> {
        Ok(Self {
            table: LeaseTable::new(clock, lease),
            tuner: LeaseTuner::new(tuner)?,
            late_op_grace,
        })
    }

    /// The lease table.
    pub fn table(&self) -> &LeaseTable<C> {
        &self.table
    }

    /// The tuner.
    pub fn tuner(&self) -> &LeaseTuner {
        &self.tuner
    }

    /// Grants `holder` a lease on `obj` for as long as the tuner suggests (and counts the
    /// grant for the tuner); returns that duration. Refused while `obj` is fenced.
    pub fn grant(&self, holder: u64, obj: u64) -> Result<Duration, LeaseError> {
        let duration = self.tuner.duration_for(obj);
        self.table.grant(holder, obj, duration)?;
        self.tuner.record_grants(obj, 1);
        Ok(duration)
    }

    /// [`TunedLeases::grant`], then `read` what the lease protects (where the object is, say)
    /// and check that the lease still holds: a thread delayed past the lease's expiry could
    /// otherwise hand out a state newer than the lease (the object may have moved once it
    /// expired). A lease that lapsed meanwhile is [`LeaseError::NotHeld`]: ask again.
    pub fn grant_reading<T>(
        &self,
        holder: u64,
        obj: u64,
        read: impl FnOnce() -> T,
    ) -> Result<(Duration, T), LeaseError> {
        let duration = self.grant(holder, obj)?;
        let value = read();
        if !self.is_valid(holder, obj) {
            return Err(LeaseError::NotHeld { holder, obj });
        }
        Ok((duration, value))
    }

    /// Whether `holder`'s lease on `obj` is valid now (the server's view).
    pub fn is_valid(&self, holder: u64, obj: u64) -> bool {
        self.table.is_valid(holder, obj, self.table.clock().now())
    }

    /// Fences every object of `objs` at once, so their leases drain together, waits until
    /// the leases granted on them expired, then the grace once (if there was any object).
    /// When it returns, the objects may move; no lease is granted on them until the returned
    /// fences are dropped.
    pub fn drain(&self, objs: impl IntoIterator<Item = u64>) -> Vec<Fence<'_, C>> {
        let fences: Vec<_> = objs.into_iter().map(|o| self.table.fence(o)).collect();
        for f in &fences {
            f.wait_until_expired();
        }
        if !fences.is_empty() && !self.late_op_grace.is_zero() {
            std::thread::sleep(self.late_op_grace);
        }
        fences
    }

    /// Counts `n` accesses to `obj` in the current window.
    pub fn record_accesses(&self, obj: u64, n: u64) {
        self.tuner.record_accesses(obj, n);
    }

    /// Records that `obj` moved to `tier`.
    pub fn set_tier(&self, obj: u64, tier: Tier) {
        self.tuner.set_tier(obj, tier);
    }

    /// Forgets `obj`'s tuning (it was freed).
    pub fn forget(&self, obj: u64) {
        self.tuner.forget(obj);
    }

    /// Ends a window: the tuner takes its steps and expired leases are dropped.
    pub fn end_window(&self) {
        self.tuner.end_window();
        self.table.prune();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;

    #[test]
    fn a_drain_outlasts_every_lease_and_the_grace() {
        let tuner = TunerConfig::default();
        let grace = Duration::from_millis(5);
        let leases =
            TunedLeases::new(SystemClock::new(), LeaseConfig::default(), tuner, grace).unwrap();
        let d = leases.grant(1, 7).unwrap();
        leases.grant(2, 8).unwrap();
        let start = std::time::Instant::now();
        let fences = leases.drain([7, 8]);
        // The holder's lease is shorter than the server's by the skew allowance at most.
        let skew = LeaseConfig::default().skew;
        assert!(start.elapsed() + skew >= d + grace, "{:?}", start.elapsed());
        assert!(matches!(leases.grant(3, 8), Err(LeaseError::Fenced { .. })));
        drop(fences);
        assert!(leases.grant(3, 8).is_ok());
        assert!(leases.drain([]).is_empty());
        leases.end_window();
    }

    #[test]
    fn a_state_read_after_the_lease_lapsed_is_not_handed_out() {
        let clock = crate::VirtualClock::new();
        let cfg = LeaseConfig::default();
        let leases = TunedLeases::new(clock.clone(), cfg, TunerConfig::default(), Duration::ZERO);
        let leases = leases.unwrap();
        let (d, v) = leases.grant_reading(1, 7, || "dram").unwrap();
        assert_eq!((v, d), ("dram", leases.tuner().duration_for(7)));
        // Delayed past the lease's expiry between the grant and the read.
        let late = leases.grant_reading(2, 7, || clock.advance(Duration::from_secs(3600)));
        assert_eq!(late, Err(LeaseError::NotHeld { holder: 2, obj: 7 }));
        let _fence = leases.table().fence(7);
        assert!(matches!(
            leases.grant_reading(3, 7, || unreachable!("fenced: nothing is read")),
            Err(LeaseError::Fenced { .. })
        ));
    }
}
