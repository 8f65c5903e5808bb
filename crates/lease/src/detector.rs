//! A coordinator's failure detector over the servers it heartbeats: it remembers when each
//! server last answered (and whether that answer said the server had lost its state, as a
//! restarted server does), and tells which members have failed — silent for too long, or
//! back from a restart before their silence was noticed — and which non-members are back.
//! FUSEE's master runs one over its memory nodes.
//!
//! The detector only decides; the caller sends the heartbeats, feeds their answers in
//! ([`FailureDetector::heard`]), acts on the verdict, and forgets a server it failed over
//! ([`FailureDetector::forget`]), so that the server's next answer counts afresh.
//!
//! ```
//! use std::time::Duration;
//! use dmkit_lease::{FailureDetector, VirtualClock};
//!
//! let clock = VirtualClock::new();
//! // Failed after 500 ms of silence; back when heard within the last 300 ms.
//! let d = FailureDetector::new(clock.clone(), Duration::from_millis(500), Duration::from_millis(300));
//! d.heard(1, false);
//! d.heard(2, false);
//! clock.advance(Duration::from_millis(400));
//! d.heard(1, false);
//! clock.advance(Duration::from_millis(200));
//! // Members 1 and 2; node 3 is not one.
//! let v = d.verdict([1, 2, 3], |n| *n != 3);
//! assert_eq!(v.failed, vec![2]);
//! assert!(v.back.is_empty());
//! // Node 3 answers again: it is back.
//! d.heard(3, false);
//! assert_eq!(d.verdict([1, 3], |n| *n != 3).back, vec![3]);
//! ```

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{Clock, Timestamp};

/// What [`FailureDetector::verdict`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<N> {
    /// Members that have failed: silent for the detector's `silent_for` (never heard counts
    /// from the detector's start), or answering but restarted (their state lost) before
    /// their silence was noticed.
    pub failed: Vec<N>,
    /// Non-members heard within the detector's `fresh_for`: they answer again.
    pub back: Vec<N>,
}

/// A coordinator's failure detector (see the module docs). Share it between the heartbeat
/// task and the task that acts on verdicts.
#[derive(Debug)]
pub struct FailureDetector<N, C: Clock> {
    clock: C,
    silent_for: Duration,
    fresh_for: Duration,
    /// Silence of a server never heard counts from here (the start, moved on by excuses).
    started: Mutex<Timestamp>,
    /// Each server's last answer: when, and whether it said it had restarted.
    heard: Mutex<HashMap<N, (Timestamp, bool)>>,
}

impl<N: Copy + Eq + Hash, C: Clock> FailureDetector<N, C> {
    /// A detector that fails a member silent for `silent_for` and takes a non-member heard
    /// within `fresh_for` as back. Silence counts from now for a server never heard.
    pub fn new(clock: C, silent_for: Duration, fresh_for: Duration) -> Self {
        let started = clock.now();
        Self {
            clock,
            silent_for,
            fresh_for,
            started: Mutex::new(started),
            heard: Mutex::new(HashMap::new()),
        }
    }

    /// `node` answered now; `restarted`: its answer says it lost its state.
    pub fn heard(&self, node: N, restarted: bool) {
        let now = self.clock.now();
        self.heard.lock().insert(node, (now, restarted));
    }

    /// Forgets what `node` answered (after it was failed over: its next answer counts
    /// afresh, and until then it is silent since the detector's start).
    pub fn forget(&self, node: N) {
        self.heard.lock().remove(&node);
    }

    /// The coordinator itself could not hear anyone for `stalled` just now (its process or
    /// its heartbeat tasks were held off the CPU: answers that arrived meanwhile were not
    /// read): that time counts as no server's silence. Every server's last answer, and the
    /// start, move `stalled` later (never past now). Without this, a coordinator starved for
    /// longer than `silent_for` fails every live member over when it runs again.
    pub fn excuse(&self, stalled: Duration) {
        let now = self.clock.now();
        let later = |t: Timestamp| {
            let t = t.saturating_add(stalled);
            if t > now { now } else { t }
        };
        let mut started = self.started.lock();
        *started = later(*started);
        for (t, _) in self.heard.lock().values_mut() {
            *t = later(*t);
        }
    }

    /// The members of `nodes` that failed and the non-members that are back, now.
    pub fn verdict(
        &self,
        nodes: impl IntoIterator<Item = N>,
        is_member: impl Fn(&N) -> bool,
    ) -> Verdict<N> {
        let now = self.clock.now();
        let started = *self.started.lock();
        let heard = self.heard.lock();
        let mut v = Verdict {
            failed: Vec::new(),
            back: Vec::new(),
        };
        for n in nodes {
            let last = heard.get(&n).copied();
            let since = |t: Timestamp| now.saturating_duration_since(t);
            if is_member(&n) {
                let (t, restarted) = last.unwrap_or((started, false));
                if since(t) >= self.silent_for || (last.is_some() && restarted) {
                    v.failed.push(n);
                }
            } else if last.is_some_and(|(t, _)| since(t) < self.fresh_for) {
                v.back.push(n);
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VirtualClock;

    const MS: Duration = Duration::from_millis(1);

    fn detector(clock: &VirtualClock) -> FailureDetector<u16, VirtualClock> {
        FailureDetector::new(clock.clone(), 500 * MS, 300 * MS)
    }

    #[test]
    fn a_member_never_heard_fails_once_silent_since_the_start() {
        let clock = VirtualClock::new();
        let d = detector(&clock);
        clock.advance(499 * MS);
        assert!(d.verdict([0], |_| true).failed.is_empty());
        clock.advance(MS);
        assert_eq!(d.verdict([0], |_| true).failed, vec![0]);
    }

    #[test]
    fn a_member_fails_when_silent_for_the_limit_and_not_before() {
        let clock = VirtualClock::new();
        let d = detector(&clock);
        clock.advance(1000 * MS);
        d.heard(0, false);
        clock.advance(499 * MS);
        assert!(d.verdict([0], |_| true).failed.is_empty());
        d.heard(0, false);
        clock.advance(499 * MS);
        assert!(d.verdict([0], |_| true).failed.is_empty());
        clock.advance(MS);
        assert_eq!(d.verdict([0], |_| true).failed, vec![0]);
    }

    #[test]
    fn a_member_that_restarted_fails_at_once_while_answering() {
        let clock = VirtualClock::new();
        let d = detector(&clock);
        d.heard(0, false);
        d.heard(1, true);
        assert_eq!(d.verdict([0, 1], |_| true).failed, vec![1]);
        // Answering normally again (its state is back) clears it.
        d.heard(1, false);
        assert!(d.verdict([0, 1], |_| true).failed.is_empty());
    }

    #[test]
    fn forgetting_a_failed_member_counts_its_silence_from_the_start() {
        let clock = VirtualClock::new();
        let d = detector(&clock);
        d.heard(0, true);
        assert_eq!(d.verdict([0], |_| true).failed, vec![0]);
        d.forget(0);
        // Never heard since, and the start is recent: not failed (again) yet.
        assert!(d.verdict([0], |_| true).failed.is_empty());
        clock.advance(500 * MS);
        assert_eq!(d.verdict([0], |_| true).failed, vec![0]);
    }

    #[test]
    fn a_stall_of_the_coordinator_counts_as_no_ones_silence() {
        let clock = VirtualClock::new();
        let d = detector(&clock);
        clock.advance(100 * MS);
        d.heard(0, false);
        clock.advance(50 * MS);
        d.heard(1, false);
        // The coordinator is held off the CPU for 2 s: nobody is heard meanwhile.
        clock.advance(2000 * MS);
        d.excuse(2000 * MS);
        // Outside the stall node 0 was silent 50 ms, node 1 not at all, node 2 (never heard)
        // 150 ms since the start: none failed.
        assert!(d.verdict([0, 1, 2], |_| true).failed.is_empty());
        // Silence after the stall counts again, each from where it stood.
        clock.advance(350 * MS);
        assert_eq!(d.verdict([0, 1, 2], |_| true).failed, vec![2]);
        clock.advance(100 * MS);
        assert_eq!(d.verdict([0, 1, 2], |_| true).failed, vec![0, 2]);
        clock.advance(50 * MS);
        assert_eq!(d.verdict([0, 1, 2], |_| true).failed, vec![0, 1, 2]);
        // An excuse never moves an answer past now.
        d.heard(0, false);
        d.excuse(10_000 * MS);
        clock.advance(500 * MS);
        assert_eq!(d.verdict([0], |_| true).failed, vec![0]);
    }

    #[test]
    fn a_non_member_is_back_only_while_heard_recently_and_never_fails() {
        let clock = VirtualClock::new();
        let d = detector(&clock);
        let member = |n: &u16| *n == 0;
        clock.advance(2000 * MS);
        let v = d.verdict([0, 1], member);
        assert_eq!(v.failed, vec![0], "a silent non-member is not failed");
        assert!(v.back.is_empty(), "a non-member never heard is not back");
        d.heard(0, false);
        d.heard(1, true);
        assert_eq!(
            d.verdict([0, 1], member),
            Verdict {
                failed: vec![],
                back: vec![1]
            }
        );
        clock.advance(300 * MS);
        assert!(d.verdict([0, 1], member).back.is_empty());
    }
}
