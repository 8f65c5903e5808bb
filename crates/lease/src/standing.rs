//! A server's own lease on serving: renewed by a coordinator's heartbeats or, while the
//! coordinator is silent, by a majority of its peers vouching for it; when it runs out the
//! server fences itself, so that a server partitioned away stops serving before the
//! coordinator repairs around it. FUSEE's memory nodes hold one (renewed by the master).
//!
//! The lease only decides; the caller does the talking (heartbeats, vouch requests) and the
//! fencing (refusing verbs).
//!
//! ```
//! use std::time::Duration;
//! use dmkit_lease::{ServingLease, Standing, VirtualClock};
//!
//! let clock = VirtualClock::new();
//! let lease = ServingLease::new(clock.clone());
//! // Without a coordinator's word the server is never fenced.
//! assert_eq!(lease.keep(|| false, || true), Standing::Serving);
//! lease.renew(Duration::from_secs(2));
//! // Past half the lease with no heartbeat, the peers are asked; a majority renews it.
//! clock.advance(Duration::from_millis(1500));
//! assert_eq!(lease.keep(|| true, || true), Standing::Serving);
//! // Silence from everyone: past the lease, the server fences itself, once.
//! clock.advance(Duration::from_millis(2100));
//! assert_eq!(lease.keep(|| false, || true), Standing::FencedNow);
//! assert_eq!(lease.keep(|| false, || true), Standing::Fenced);
//! // The coordinator's next heartbeat lifts it.
//! assert!(lease.renew(Duration::from_secs(2)));
//! assert_eq!(lease.keep(|| false, || true), Standing::Serving);
//! ```

use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{Clock, Timestamp};

/// What [`ServingLease::keep`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// The lease holds (or no coordinator ever gave one).
    Serving,
    /// The lease ran out just now and the server fenced itself.
    FencedNow,
    /// The server is fenced: by itself earlier (waiting for the coordinator), or by someone
    /// else while its lease ran out.
    Fenced,
}

#[derive(Debug, Default)]
struct State {
    renewed: Option<Timestamp>,
    length: Duration,
    self_fenced: bool,
}

/// A server's lease on serving (see the module docs).
#[derive(Debug)]
pub struct ServingLease<C: Clock> {
    clock: C,
    state: Mutex<State>,
}

impl<C: Clock> ServingLease<C> {
    /// A server no coordinator has leased yet (it serves).
    pub fn new(clock: C) -> Self {
        Self {
            clock,
            state: Mutex::new(State::default()),
        }
    }

    /// The coordinator's heartbeat: the lease runs for `length` from now. Returns true when
    /// the server had fenced itself for want of a lease (the caller lifts its fence, if the
    /// coordinator still counts it in).
    pub fn renew(&self, length: Duration) -> bool {
        let mut s = self.state.lock();
        s.renewed = Some(self.clock.now());
        s.length = length;
        std::mem::take(&mut s.self_fenced)
    }

    /// Forgets the lease (a restarted server: no coordinator's word yet).
    pub fn reset(&self) {
        *self.state.lock() = State::default();
    }

    /// Keeps the lease (call it every quarter lease or so). Before half the lease nothing
    /// happens; after it `vouch()` is asked whether a majority of the peers vouch for the
    /// server (it talks to them), which renews the lease for another length; past the whole
    /// lease without either, `fence()` fences the server ([`Standing::FencedNow`], once) and
    /// says whether it did — false when the server was fenced already for another reason (a
    /// coordinator's fence, which only the coordinator lifts: the lease then leaves it be).
    pub fn keep(&self, vouch: impl FnOnce() -> bool, fence: impl FnOnce() -> bool) -> Standing {
        let (renewed, length, fenced) = {
            let s = self.state.lock();
            match s.renewed {
                None => return Standing::Serving,
                Some(r) => (r, s.length, s.self_fenced),
            }
        };
        if fenced {
            return Standing::Fenced;
        }
        let since = self.clock.now().saturating_duration_since(renewed);
        if since < length / 2 {
            return Standing::Serving;
        }
        // (Asked without the lock: vouching talks to the peers.)
        if vouch() {
            let mut s = self.state.lock();
            if s.renewed == Some(renewed) {
                s.renewed = Some(self.clock.now());
            }
            return Standing::Serving;
        }
        let mut s = self.state.lock();
        if s.renewed != Some(renewed) {
            // A heartbeat arrived meanwhile.
            return Standing::Serving;
        }
        if self.clock.now().saturating_duration_since(renewed) > length {
            if fence() {
                s.self_fenced = true;
                return Standing::FencedNow;
            }
            return Standing::Fenced;
        }
        Standing::Serving
    }

    /// How long until [`ServingLease::keep`] has something to do: until half the lease has
    /// passed since the last renewal (zero once it has, `None` without a lease). A keeper
    /// thread sleeps that long instead of polling.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dmkit_lease::{ServingLease, VirtualClock};
    ///
    /// let clock = VirtualClock::new();
    /// let lease = ServingLease::new(clock.clone());
    /// assert_eq!(lease.next_check(), None);
    /// lease.renew(Duration::from_millis(500));
    /// clock.advance(Duration::from_millis(100));
    /// assert_eq!(lease.next_check(), Some(Duration::from_millis(150)));
    /// clock.advance(Duration::from_millis(200));
    /// assert_eq!(lease.next_check(), Some(Duration::ZERO));
    /// ```
    pub fn next_check(&self) -> Option<Duration> {
        let s = self.state.lock();
        let renewed = s.renewed?;
        let since = self.clock.now().saturating_duration_since(renewed);
        Some((s.length / 2).saturating_sub(since))
    }

    /// Whether the server fenced itself for want of a lease.
    pub fn self_fenced(&self) -> bool {
        self.state.lock().self_fenced
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VirtualClock;

    #[test]
    fn peers_are_asked_only_past_half_the_lease() {
        let clock = VirtualClock::new();
        let l = ServingLease::new(clock.clone());
        l.renew(Duration::from_millis(100));
        clock.advance(Duration::from_millis(40));
        assert_eq!(
            l.keep(|| panic!("asked too early"), || panic!()),
            Standing::Serving
        );
        clock.advance(Duration::from_millis(20));
        // No majority yet, lease not out: still serving.
        assert_eq!(l.keep(|| false, || panic!()), Standing::Serving);
        clock.advance(Duration::from_millis(41));
        // Fenced already by someone else: the lease does not claim the fence.
        assert_eq!(l.keep(|| false, || false), Standing::Fenced);
        assert!(!l.self_fenced());
        assert_eq!(l.keep(|| false, || true), Standing::FencedNow);
        assert!(l.self_fenced());
        l.reset();
        assert!(!l.self_fenced());
        assert_eq!(
            l.keep(|| panic!("no lease"), || panic!()),
            Standing::Serving
        );
    }
}
