//! Majorities: whether enough of a group's members say yes. A server whose coordinator went
//! silent renews its [`ServingLease`](crate::ServingLease) when a majority of the members
//! vouch for it; the asking (an RPC each, any transport) is the caller's, the fan-out and the
//! count are here.
//!
//! ```
//! // Five members: this one and two of the four others make three, a majority.
//! let others = [1, 2, 3, 4];
//! assert!(dmkit_lease::vouched_by_majority(5, &others, |p| *p <= 2));
//! assert!(!dmkit_lease::vouched_by_majority(5, &others, |p| *p == 1));
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};

/// Whether a majority of a group of `members` vouch for this one, which counts as one yes:
/// asks each of `others` (the other members) at once, a thread each, and waits for every
/// answer (bound `ask`'s time: a silent peer is a no once it gives up).
pub fn vouched_by_majority<P: Sync>(
    members: usize,
    others: &[P],
    ask: impl Fn(&P) -> bool + Sync,
) -> bool {
    let yes = AtomicUsize::new(1);
    std::thread::scope(|s| {
        for p in others {
            let (yes, ask) = (&yes, &ask);
            s.spawn(move || {
                if ask(p) {
                    yes.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    yes.into_inner() * 2 > members
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_strict_majority_counting_this_member_is_needed() {
        assert!(
            vouched_by_majority::<u8>(1, &[], |_| false),
            "alone: itself"
        );
        assert!(
            !vouched_by_majority(2, &[1], |_| false),
            "one of two is no majority"
        );
        assert!(vouched_by_majority(2, &[1], |_| true));
        assert!(
            !vouched_by_majority(4, &[1, 2, 3], |p| *p == 1),
            "two of four"
        );
        assert!(
            vouched_by_majority(4, &[1, 2, 3], |p| *p <= 2),
            "three of four"
        );
    }

    #[test]
    fn the_others_are_asked_at_once_each_exactly_once() {
        let asked = AtomicUsize::new(0);
        let t = Instant::now();
        let others: Vec<u32> = (0..8).collect();
        let ok = vouched_by_majority(9, &others, |_| {
            asked.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(100));
            true
        });
        assert!(ok);
        assert_eq!(asked.into_inner(), 8);
        assert!(
            t.elapsed() < Duration::from_millis(700),
            "in parallel: {:?}",
            t.elapsed()
        );
    }
}
