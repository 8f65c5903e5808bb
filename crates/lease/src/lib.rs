//! Leases for disaggregated memory: a server grants clients time-bounded permission to use an
//! object's address directly, and must not free, promote or evict the object until every
//! such lease has expired. Gengar uses this to keep clients' address tables consistent
//! without broadcasts.
//!
//! - [`Clock`], with [`SystemClock`] for real deployments and [`VirtualClock`] for tests and
//!   simulations (advanced by hand, shared by cloning).
//! - [`LeaseTable`]: grant, renew, release, validity in the server's and the holder's view
//!   (a bounded clock-skew allowance apart), the latest expiry of an object, blocking and
//!   non-blocking waits for it, and [`Fence`]s that stop new grants while a server drains an
//!   object. [`HeldLease`] is the holder's side.
//! - [`LeaseCache`]: a holder's leases by key, each carrying what its grant said, valid in
//!   the epoch (connection) it was granted in, renewed early off the callers' path;
//!   [`LeaseCache::acquire`] takes a valid one — cached, renewed or asked of the server
//!   through the frontend's [`LeaseSource`].
//! - [`LeaseTuner`]: per-object durations found by hill climbing — short for hot objects still
//!   in NVM (promotion waits less), long for objects in DRAM (fewer re-grants).
//! - [`TunedLeases`]: a server's object leases in one piece — tuned durations, and the drain
//!   (fence, wait out the leases, then a grace for late operations) before an object moves.
//! - [`ExclusiveLeases`]: one holder per key until its lease runs out — locks a crashed
//!   holder cannot keep (Gengar's object locks, FUSEE's one-master-per-cluster claim).
//!   [`HeldLocks`] is the holder's side of such locks granted by RPC: one caller of a client
//!   at a time, paced tries through the frontend's [`LockSource`].
//! - [`ServingLease`]: a server's own lease on serving, renewed by a coordinator's heartbeats
//!   or a majority of its peers, and self-fencing when it runs out (FUSEE's memory nodes);
//!   [`vouched_by_majority`] asks the peers at once and counts.
//! - [`FailureDetector`]: the coordinator's side — which servers it heartbeats have failed
//!   (silent too long, or restarted) and which are back (FUSEE's master).
//!
//! ```
//! use std::time::Duration;
//! use dmkit_lease::{Clock, LeaseConfig, LeaseTable, LeaseTuner, Tier, TunerConfig, VirtualClock};
//!
//! let clock = VirtualClock::new();
//! let table = LeaseTable::new(clock.clone(), LeaseConfig::default());
//! let tuner = LeaseTuner::new(TunerConfig::default())?;
//!
//! // A client asks for a lease on object 42, for as long as the tuner suggests.
//! let lease = table.grant(/* holder */ 1, /* obj */ 42, tuner.duration_for(42))?;
//! tuner.record_grants(42, 1);
//! assert!(lease.holder_deadline < lease.server_deadline);
//! assert!(table.is_valid(1, 42, clock.now()));
//!
//! // The server wants to promote object 42: fence it, wait out the leases (here on virtual
//! // time, so advance the clock instead of blocking), then move it.
//! {
//!     let fence = table.fence(42);
//!     assert!(table.grant(2, 42, Duration::from_millis(1)).is_err());
//!     clock.advance(fence.time_until_expired());
//!     assert_eq!(table.expiry_of(42), None);
//! }
//! tuner.set_tier(42, Tier::Dram);
//! # Ok::<(), dmkit_lease::LeaseError>(())
//! ```
//!
//! `examples/adaptive_leases.rs` runs a client and a server on virtual time and prints how the
//! tuner's durations follow an object from cold to hot to promoted.

mod acquire;
mod cache;
mod clock;
mod detector;
mod error;
mod exclusive;
mod locks;
mod quorum;
mod standing;
mod table;
mod tuned;
mod tuner;

#[cfg(test)]
mod test_util;

pub use acquire::LeaseSource;
pub use cache::{CachedLease, LeaseCache, Renewed};
pub use clock::{Clock, SystemClock, Timestamp, VirtualClock};
pub use detector::{FailureDetector, Verdict};
pub use error::LeaseError;
pub use exclusive::{ExclusiveHolder, ExclusiveLeases};
pub use locks::{HeldLocks, LockSource};
pub use quorum::vouched_by_majority;
pub use standing::{ServingLease, Standing};
pub use table::{Fence, HeldLease, Lease, LeaseConfig, LeaseStats, LeaseTable};
pub use tuned::TunedLeases;
pub use tuner::{LeaseTuner, Tier, TunerConfig};
