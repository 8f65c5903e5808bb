//! Pacing the retries of an operation a remote side refused for now (a lock held elsewhere,
//! an object fenced while it moves): pauses that double up to a cap, until a deadline. The
//! pauses are awaited ([`crate::sleep`]), so a task that backs off does not hold its thread.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use dmkit_verbs::Backoff;
//!
//! let deadline = Instant::now() + Duration::from_millis(50);
//! let mut backoff = Backoff::new(Duration::from_micros(50), Duration::from_millis(1), deadline);
//! let mut tries = 1;
//! // "Busy" every time: retry until the deadline.
//! while dmkit_verbs::block_on(backoff.wait()) {
//!     tries += 1;
//! }
//! assert!(tries >= 2 && Instant::now() >= deadline);
//! ```

use std::time::{Duration, Instant};

/// Retry pacing with a deadline (see the module docs).
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
    deadline: Instant,
}

impl Backoff {
    /// Pauses from `first`, doubling up to `max`, until `deadline`.
    pub fn new(first: Duration, max: Duration, deadline: Instant) -> Self {
        Self {
            next: first,
            max,
            deadline,
        }
    }

    /// Before the deadline: waits the next pause and returns true (try again). Past it:
    /// returns false at once (give up).
    pub async fn wait(&mut self) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        crate::sleep(self.next).await;
        self.next = (self.next * 2).min(self.max);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap_and_stop_at_the_deadline() {
        let far = Instant::now() + Duration::from_secs(60);
        let mut b = Backoff::new(Duration::from_micros(1), Duration::from_micros(4), far);
        for want in [2, 4, 4] {
            assert!(crate::block_on(b.wait()));
            assert_eq!(b.next, Duration::from_micros(want));
        }
        let mut past = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(1),
            Instant::now(),
        );
        assert!(!crate::block_on(past.wait()));
    }
}
