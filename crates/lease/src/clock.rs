//! Time sources for lease expiry: the real monotonic clock and a hand-driven virtual clock.

use std::fmt::Debug;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// A point in time on a [`Clock`], in nanoseconds since that clock's origin.
///
/// Timestamps from different clocks are not comparable; within one process every
/// [`SystemClock`] shares one origin, and clones of a [`VirtualClock`] share theirs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The clock's origin.
    pub const ZERO: Self = Self(0);

    /// The timestamp `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + d`, saturating at the end of time rather than wrapping.
    pub fn saturating_add(self, d: Duration) -> Self {
        Self(self.0.saturating_add(duration_nanos(d)))
    }

    /// `self - d`, saturating at the origin.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(duration_nanos(d)))
    }

    /// The time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A monotonic time source. Lease decisions take time from a `Clock` so that tests and
/// simulations can run on virtual time and production on the real clock, with the same code.
pub trait Clock: Send + Sync + Debug {
    /// The current time; never earlier than a value returned before.
    fn now(&self) -> Timestamp;

    /// Blocks the calling thread until `now() >= deadline`; returns at once if it already is.
    fn sleep_until(&self, deadline: Timestamp);
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }

    fn sleep_until(&self, deadline: Timestamp) {
        (**self).sleep_until(deadline)
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Timestamp {
        (**self).now()
    }

    fn sleep_until(&self, deadline: Timestamp) {
        (**self).sleep_until(deadline)
    }
}

/// The operating system's monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl SystemClock {
    /// The real clock.
    pub fn new() -> Self {
        Self
    }

    fn origin() -> Instant {
        // One origin per process, so timestamps from any two `SystemClock`s compare.
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(Instant::now)
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp(duration_nanos(Self::origin().elapsed()))
    }

    fn sleep_until(&self, deadline: Timestamp) {
        // `thread::sleep` may wake early on some platforms; loop until the deadline is real.
        loop {
            let now = self.now();
            if now >= deadline {
                return;
            }
            std::thread::sleep(deadline.saturating_duration_since(now));
        }
    }
}

/// A clock that only moves when told to. Clones share the same time, so a test can hand one
/// clone to the code under test and advance another; threads blocked in
/// [`Clock::sleep_until`] wake when the time they wait for is reached.
#[derive(Clone, Debug, Default)]
pub struct VirtualClock {
    inner: Arc<VirtualInner>,
}

#[derive(Debug, Default)]
struct VirtualInner {
    now: Mutex<u64>,
    advanced: Condvar,
}

impl VirtualClock {
    /// A virtual clock at its origin.
    pub fn new() -> Self {
        Self::default()
    }

    /// A virtual clock that starts at `t`.
    pub fn starting_at(t: Timestamp) -> Self {
        let clock = Self::new();
        *clock.inner.now.lock() = t.0;
        clock
    }

    /// Moves time forward by `by` and returns the new time.
    pub fn advance(&self, by: Duration) -> Timestamp {
        let mut now = self.inner.now.lock();
        *now = now.saturating_add(duration_nanos(by));
        self.inner.advanced.notify_all();
        Timestamp(*now)
    }

    /// Moves time forward to `t` (never backwards) and returns the new time.
    pub fn advance_to(&self, t: Timestamp) -> Timestamp {
        let mut now = self.inner.now.lock();
        *now = (*now).max(t.0);
        self.inner.advanced.notify_all();
        Timestamp(*now)
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Timestamp {
        Timestamp(*self.inner.now.lock())
    }

    fn sleep_until(&self, deadline: Timestamp) {
        let mut now = self.inner.now.lock();
        while *now < deadline.0 {
            self.inner.advanced.wait(&mut now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_clones_share_time() {
        let a = VirtualClock::new();
        let b = a.clone();
        a.advance(Duration::from_millis(3));
        assert_eq!(b.now(), Timestamp::from_nanos(3_000_000));
    }

    #[test]
    fn virtual_clock_never_goes_backwards() {
        let c = VirtualClock::starting_at(Timestamp::from_nanos(100));
        assert_eq!(
            c.advance_to(Timestamp::from_nanos(50)),
            Timestamp::from_nanos(100)
        );
    }

    #[test]
    fn virtual_sleep_wakes_when_time_is_advanced() {
        let clock = VirtualClock::new();
        let sleeper = clock.clone();
        let handle = std::thread::spawn(move || {
            sleeper.sleep_until(Timestamp::from_nanos(10));
            sleeper.now()
        });
        clock.advance(Duration::from_nanos(4));
        clock.advance(Duration::from_nanos(6));
        assert!(handle.join().unwrap() >= Timestamp::from_nanos(10));
    }

    #[test]
    fn system_clock_is_monotonic_and_sleeps_past_deadline() {
        let clock = SystemClock::new();
        let start = clock.now();
        let deadline = start.saturating_add(Duration::from_millis(1));
        clock.sleep_until(deadline);
        assert!(clock.now() >= deadline);
    }

    #[test]
    fn timestamp_arithmetic_saturates() {
        let t = Timestamp::from_nanos(5);
        assert_eq!(t.saturating_sub(Duration::from_nanos(10)), Timestamp::ZERO);
        assert_eq!(t.saturating_add(Duration::MAX).as_nanos(), u64::MAX);
        assert_eq!(Timestamp::ZERO.saturating_duration_since(t), Duration::ZERO);
    }
}
