//! Majorities: whether enough of a group's members say yes. A server whose coordinator went
//! silent renews its [`ServingLease`](crate::ServingLease) when a majority of the members
//! vouch for it; the asking (an RPC each, any transport) is the caller's, the fan-out and the
//! count are here.
//!
//! ```
//! // Five members: this one and two of the four others make three, a majority.
//! use std::sync::Arc;
//! let others = vec![1, 2, 3, 4];
//! assert!(dmkit_lease::vouched_by_majority(5, others.clone(), Arc::new(|p: &i32| *p <= 2)));
//! assert!(!dmkit_lease::vouched_by_majority(5, others, Arc::new(|p: &i32| *p == 1)));
//! ```

use std::sync::Arc;
use std::sync::mpsc;

/// Whether a majority of a group of `members` vouch for this one, which counts as one yes:
/// asks each of `others` (the other members) at once, a thread each, and returns as soon as
/// the answers decide it — a majority of yes, or too many no for one — without waiting for
/// the slowest peer (a dead one may take its connect timeout to say nothing; the lease that
/// waits on this answer may not have that long). Answers after the decision are dropped.
pub fn vouched_by_majority<P: Send + 'static>(
    members: usize,
    others: Vec<P>,
    ask: Arc<dyn Fn(&P) -> bool + Send + Sync>,
) -> bool {
    let need = members / 2 + 1;
    let (mut yes, mut no) = (1usize, 0usize);
    if yes >= need {
        return true;
    }
    let (tx, rx) = mpsc::channel();
    for p in others {
        let (tx, ask) = (tx.clone(), ask.clone());
        let spawned = std::thread::Builder::new()
            .name("dmkit-vouch".into())
            .spawn(move || {
                let _ = tx.send(ask(&p));
            });
        // A thread that cannot start is a peer that did not vouch.
        no += usize::from(spawned.is_err());
    }
    drop(tx);
    // Until decided; every answer in (each asking thread dropped its sender) ends it too.
    while yes < need && members.saturating_sub(no) >= need {
        match rx.recv() {
            Ok(true) => yes += 1,
            Ok(false) => no += 1,
            Err(_) => break,
        }
    }
    yes >= need
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    fn by<P: 'static>(
        f: impl Fn(&P) -> bool + Send + Sync + 'static,
    ) -> Arc<dyn Fn(&P) -> bool + Send + Sync> {
        Arc::new(f)
    }

    #[test]
    fn a_strict_majority_counting_this_member_is_needed() {
        assert!(
            vouched_by_majority::<u8>(1, vec![], by(|_| false)),
            "alone: itself"
        );
        assert!(
            !vouched_by_majority(2, vec![1], by(|_: &u8| false)),
            "one of two is no majority"
        );
        assert!(vouched_by_majority(2, vec![1], by(|_: &u8| true)));
        assert!(
            !vouched_by_majority(4, vec![1, 2, 3], by(|p: &u8| *p == 1)),
            "two of four"
        );
        assert!(
            vouched_by_majority(4, vec![1, 2, 3], by(|p: &u8| *p <= 2)),
            "three of four"
        );
    }

    #[test]
    fn the_others_are_asked_at_once_each_exactly_once() {
        let asked = Arc::new(AtomicUsize::new(0));
        let t = Instant::now();
        let others: Vec<u32> = (0..8).collect();
        let a = asked.clone();
        let ok = vouched_by_majority(
            9,
            others,
            by(move |_: &u32| {
                a.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
                true
            }),
        );
        assert!(ok);
        assert!(
            t.elapsed() < Duration::from_millis(700),
            "in parallel: {:?}",
            t.elapsed()
        );
        // Every peer was asked, once (the answers after the decision come in later).
        let deadline = Instant::now() + Duration::from_secs(5);
        while asked.load(Ordering::Relaxed) < 8 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(asked.load(Ordering::Relaxed), 8);
    }

    /// A dead peer's ask may hang for its connect timeout: the answer comes at the majority,
    /// not after the slowest peer (the lease that waits on it runs out meanwhile).
    #[test]
    fn the_answer_comes_at_the_majority_not_after_the_slowest_peer() {
        let t = Instant::now();
        let slow = |p: &u32| {
            if *p == 0 {
                std::thread::sleep(Duration::from_secs(3));
            }
            *p != 3
        };
        // Five members: this one, 1 and 2 vouch at once; 0 hangs, 3 says no.
        assert!(vouched_by_majority(5, vec![0, 1, 2, 3], by(slow)));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // And a no that is decided early: 1, 2 and 3 say no, 0 hangs.
        let t = Instant::now();
        assert!(!vouched_by_majority(
            5,
            vec![0, 1, 2, 3],
            by(|p: &u32| {
                if *p == 0 {
                    std::thread::sleep(Duration::from_secs(3));
                }
                false
            })
        ));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
}
