//! The holder's side of exclusive leases (locks) that a server grants by RPC: a client takes
//! an object's lock at the server for its own id, so among the threads and tasks that share
//! the client one caller at a time may hold it ([`HeldLocks`]: not re-entrant; the others wait
//! as another client would). Taking it waits — first for the other callers of this client,
//! then for the server's lock — paced and bounded by the frontend's [`LockSource`] (its RPC,
//! its retry pacing); releasing it frees the caller's claim whatever the server answers.
//!
//! ```
//! use std::future::{Future, ready};
//! use dmkit_lease::{HeldLocks, LockSource};
//!
//! /// A server where key 1 is held by someone else; gives up after three pauses.
//! struct Server;
//! impl LockSource<u64> for Server {
//!     type Error = String;
//!     type Pace = u32;
//!     fn pace(&self) -> u32 { 3 }
//!     fn pause(&self, left: &mut u32) -> impl Future<Output = bool> {
//!         *left = left.saturating_sub(1);
//!         ready(*left > 0)
//!     }
//!     fn timed_out(&self, key: &u64) -> String { format!("timed out on {key}") }
//!     fn try_lock(&self, key: &u64) -> impl Future<Output = Result<bool, String>> {
//!         ready(Ok(*key != 1))
//!     }
//!     fn unlock(&self, _: &u64) -> impl Future<Output = Result<(), String>> {
//!         ready(Ok(()))
//!     }
//! }
//!
//! # fn now<F: Future>(f: F) -> F::Output {
//! #     let mut f = std::pin::pin!(f);
//! #     match f.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
//! #         std::task::Poll::Ready(v) => v,
//! #         std::task::Poll::Pending => unreachable!("ready futures only"),
//! #     }
//! # }
//! let locks = HeldLocks::default();
//! assert_eq!(now(locks.lock(&Server, 7)), Ok(()));
//! // Another caller of the same client waits for it (here: gives up).
//! assert_eq!(now(locks.lock(&Server, 7)), Err("timed out on 7".to_string()));
//! assert_eq!(now(locks.unlock(&Server, 7)), Ok(()));
//! assert!(!locks.is_held(&7));
//! // Held at the server by another client: paced tries, then the time-out.
//! assert_eq!(now(locks.lock(&Server, 1)), Err("timed out on 1".to_string()));
//! assert!(!locks.is_held(&1));
//! ```

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;

use parking_lot::Mutex;

/// How a holder takes and releases locks at a server (see [`HeldLocks`]).
pub trait LockSource<K> {
    /// Why taking or releasing failed.
    type Error;
    /// Retry pacing state (pauses, a deadline).
    type Pace: Clone;

    /// The pacing of one lock call, from now (cloned for each of its waits: for the other
    /// callers of this client, then for the server — the same deadline for both).
    fn pace(&self) -> Self::Pace;
    /// Waits the next pause: `true` to try again, `false` to give up.
    fn pause(&self, pace: &mut Self::Pace) -> impl Future<Output = bool>;
    /// The error of a lock call that gave up.
    fn timed_out(&self, key: &K) -> Self::Error;
    /// One try at the server: `Ok(true)` taken, `Ok(false)` held by another holder.
    fn try_lock(&self, key: &K) -> impl Future<Output = Result<bool, Self::Error>>;
    /// Releases the lock at the server (after whatever must precede that, such as waiting for
    /// the holder's writes to the object).
    fn unlock(&self, key: &K) -> impl Future<Output = Result<(), Self::Error>>;
}

/// Which locks the callers of one holder hold (see the module docs).
#[derive(Debug)]
pub struct HeldLocks<K> {
    held: Mutex<HashSet<K>>,
}

impl<K> Default for HeldLocks<K> {
    fn default() -> Self {
        Self {
            held: Mutex::new(HashSet::new()),
        }
    }
}

impl<K: Hash + Eq + Clone> HeldLocks<K> {
    /// Takes `key`'s lock for this caller: first among the holder's callers, then at the
    /// server, each wait paced by `source` (which says when to give up).
    pub async fn lock<S: LockSource<K>>(&self, source: &S, key: K) -> Result<(), S::Error> {
        let pace = source.pace();
        let mut local = pace.clone();
        while !self.held.lock().insert(key.clone()) {
            if !source.pause(&mut local).await {
                return Err(source.timed_out(&key));
            }
        }
        let mut remote = pace;
        let r = loop {
            match source.try_lock(&key).await {
                Ok(true) => break Ok(()),
                Ok(false) if source.pause(&mut remote).await => {}
                Ok(false) => break Err(source.timed_out(&key)),
                Err(e) => break Err(e),
            }
        };
        if r.is_err() {
            self.held.lock().remove(&key);
        }
        r
    }

    /// Releases `key`'s lock at the server; whatever it answers, the caller no longer holds
    /// it here.
    pub async fn unlock<S: LockSource<K>>(&self, source: &S, key: K) -> Result<(), S::Error> {
        let r = source.unlock(&key).await;
        self.held.lock().remove(&key);
        r
    }

    /// Whether a caller of this holder holds `key`'s lock.
    pub fn is_held(&self, key: &K) -> bool {
        self.held.lock().contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::future::ready;

    use crate::test_util::now_or_never as now;

    /// Busy for the first `busy` tries; its unlock fails; counts pauses.
    struct Busy {
        busy: Cell<u32>,
        pauses: Cell<u32>,
    }

    impl LockSource<&'static str> for Busy {
        type Error = &'static str;
        type Pace = u32;
        fn pace(&self) -> u32 {
            10
        }
        fn pause(&self, left: &mut u32) -> impl Future<Output = bool> {
            self.pauses.set(self.pauses.get() + 1);
            *left -= 1;
            ready(*left > 0)
        }
        fn timed_out(&self, _: &&'static str) -> &'static str {
            "timed out"
        }
        fn try_lock(&self, key: &&'static str) -> impl Future<Output = Result<bool, &'static str>> {
            if *key == "broken" {
                return ready(Err("refused"));
            }
            let busy = self.busy.get();
            self.busy.set(busy.saturating_sub(1));
            ready(Ok(busy == 0))
        }
        fn unlock(&self, _: &&'static str) -> impl Future<Output = Result<(), &'static str>> {
            ready(Err("not the holder"))
        }
    }

    #[test]
    fn busy_servers_are_retried_and_claims_never_outlive_a_failure() {
        let src = Busy {
            busy: Cell::new(3),
            pauses: Cell::new(0),
        };
        let locks = HeldLocks::default();
        assert_eq!(now(locks.lock(&src, "a")), Ok(()));
        assert_eq!(src.pauses.get(), 3);
        assert!(locks.is_held(&"a"));
        // The server's error passes through and leaves no claim behind.
        assert_eq!(now(locks.lock(&src, "broken")), Err("refused"));
        assert!(!locks.is_held(&"broken"));
        // An unlock the server refuses still ends the caller's claim.
        assert_eq!(now(locks.unlock(&src, "a")), Err("not the holder"));
        assert!(!locks.is_held(&"a"));
        // Busy longer than the pacing allows: timed out, no claim.
        src.busy.set(100);
        assert_eq!(now(locks.lock(&src, "a")), Err("timed out"));
        assert!(!locks.is_held(&"a"));
    }
}
