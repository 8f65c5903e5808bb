//! A holder taking its leases: [`LeaseCache::acquire`] gives a lease valid now in the current
//! epoch — the cached one (renewing it early when due), a renewal whose reply is in, or a new
//! one asked of the server — and never one granted by a connection that was replaced while
//! it was asked. The frontend says how to ask, as a [`LeaseSource`] (its RPC, its epochs, its
//! clock); the lease layer decides when.
//!
//! ```
//! use std::future::{Future, Ready, ready};
//! use std::time::Duration;
//! use dmkit_lease::{Clock, LeaseCache, LeaseSource, Timestamp, VirtualClock};
//!
//! /// Grants 10 ms leases on any key, carrying the key doubled; counts the requests.
//! struct Server(VirtualClock, std::cell::Cell<u32>);
//! impl LeaseSource<u64> for Server {
//!     type Value = u64;
//!     type Error = String;
//!     type Renewal = Ready<u64>;
//!     fn epoch(&self, _: &u64) -> Result<u64, String> { Ok(0) }
//!     fn known_epoch(&self, _: &u64) -> Option<u64> { Some(0) }
//!     fn now(&self) -> Timestamp { self.0.now() }
//!     fn post_renewal(&self, k: &u64) -> Option<Ready<u64>> { Some(ready(*k)) }
//!     fn renewal_grant(&self, _: &u64, k: u64) -> Option<(u64, Duration)> {
//!         Some((k * 2, Duration::from_millis(10)))
//!     }
//!     fn request(&self, k: &u64) -> impl Future<Output = Result<(u64, Duration), String>> {
//!         self.1.set(self.1.get() + 1);
//!         ready(Ok((k * 2, Duration::from_millis(10))))
//!     }
//! }
//!
//! let server = Server(VirtualClock::new(), Default::default());
//! let cache = LeaseCache::new(Duration::ZERO, true);
//! let lease = now_or_never(cache.acquire(&server, &21))?;
//! assert_eq!((lease.value, server.1.get()), (42, 1));
//! // Cached: no request. Past half of it, renewed early, still without a request.
//! server.0.advance(Duration::from_millis(6));
//! now_or_never(cache.acquire(&server, &21))?;
//! server.0.advance(Duration::from_millis(6));
//! assert!(now_or_never(cache.acquire(&server, &21))?.is_valid(server.0.now()));
//! assert_eq!(server.1.get(), 1);
//! # fn now_or_never<F: Future>(f: F) -> F::Output {
//! #     let mut f = std::pin::pin!(f);
//! #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! #     match f.as_mut().poll(&mut cx) {
//! #         std::task::Poll::Ready(v) => v,
//! #         std::task::Poll::Pending => unreachable!("ready futures only"),
//! #     }
//! # }
//! # Ok::<(), String>(())
//! ```

use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use crate::cache::{CachedLease, LeaseCache, Renewed};
use crate::clock::Timestamp;

/// How a holder asks a server for leases on keys `K` (see [`LeaseCache::acquire`]).
pub trait LeaseSource<K> {
    /// What a grant carries (where the object is, how big it is).
    type Value;
    /// Why asking failed (the server is down; the key is gone — the source drops the cached
    /// lease then, see [`LeaseCache::remove`]).
    type Error;
    /// An early renewal in flight: a future of its reply.
    type Renewal: Future + Unpin;

    /// The epoch of the connection to `key`'s server, making sure of that connection (it may
    /// reconnect: a new epoch).
    fn epoch(&self, key: &K) -> Result<u64, Self::Error>;
    /// The epoch as last known, without checking the connection (`None`: no such server).
    fn known_epoch(&self, key: &K) -> Option<u64>;
    /// The holder's clock.
    fn now(&self) -> Timestamp;
    /// Posts an early renewal of `key`'s lease without waiting (`None`: could not post).
    fn post_renewal(&self, key: &K) -> Option<Self::Renewal>;
    /// What a renewal's reply granted (`None`: nothing usable; the lease lapses and is asked
    /// for again).
    fn renewal_grant(
        &self,
        key: &K,
        reply: <Self::Renewal as Future>::Output,
    ) -> Option<(Self::Value, Duration)>;
    /// Asks for a lease on `key`, retrying while the server is busy with it: the grant's
    /// value and duration.
    fn request(
        &self,
        key: &K,
    ) -> impl Future<Output = Result<(Self::Value, Duration), Self::Error>>;
}

impl<K, V, R> LeaseCache<K, V, R>
where
    K: Hash + Eq + Clone,
    V: Clone,
    R: Future + Unpin,
{
    /// A lease on `key` valid now, in the epoch current for its server: the cached one (past
    /// half of it, an early renewal is posted or installed, never waited for), else a renewal
    /// whose reply is in, else one requested from `source` — one more round trip — and
    /// installed, unless the connection it came from was replaced meanwhile (then asked again).
    /// The round trip of each request is recorded ([`LeaseCache::record_rtt`]).
    pub async fn acquire<S>(&self, source: &S, key: &K) -> Result<CachedLease<V>, S::Error>
    where
        S: LeaseSource<K, Value = V, Renewal = R>,
    {
        let epoch = source.epoch(key)?;
        if let Some((l, renew)) = self.valid(key, epoch, source.now()) {
            if renew {
                let posted = self.renew(key, epoch, source.now(), || source.post_renewal(key));
                if let Some(r) = posted {
                    self.install_renewal(source, key, r);
                }
            }
            return Ok(l);
        }
        // Lapsed: a renewal whose reply is already in gives the new lease at once.
        if let Some(r) = self.take_renewed(key)
            && let Some(l) = self.install_renewal(source, key, r)
            && l.epoch == epoch
            && l.is_valid(source.now())
        {
            return Ok(l);
        }
        loop {
            let requested_at = source.now();
            let epoch = source.epoch(key)?;
            let (value, duration) = source.request(key).await?;
            self.record_rtt(source.now().saturating_duration_since(requested_at));
            let l = self.from_grant(value, epoch, requested_at, duration);
            if source.known_epoch(key) == Some(epoch) {
                return Ok(self.install(key.clone(), l));
            }
            // Granted by a connection that has since been replaced: ask again.
        }
    }

    /// Whether `lease`, `key`'s, was granted in an epoch other than `epoch` (the current one
    /// of its server, as the holder knows it): its connection was replaced since, and the
    /// node behind the new one may have restarted with other memory — the lease is dropped,
    /// for the next [`LeaseCache::acquire`] to take a new one. Holders check this before they
    /// use what a lease says with the addresses of the current connection, and after an
    /// access fails as if they had not.
    pub fn outdated(&self, key: &K, lease: &CachedLease<V>, epoch: u64) -> bool {
        let outdated = lease.epoch != epoch;
        if outdated {
            self.remove(key);
        }
        outdated
    }

    /// Installs an early renewal's lease (unless the cache holds a longer one, or the
    /// connection it came from was replaced). A reply that grants nothing is dropped: the
    /// access that finds the lease lapsed asks again.
    fn install_renewal<S>(
        &self,
        source: &S,
        key: &K,
        r: Renewed<R::Output>,
    ) -> Option<CachedLease<V>>
    where
        S: LeaseSource<K, Value = V, Renewal = R>,
    {
        let (value, duration) = source.renewal_grant(key, r.reply)?;
        let l = self.from_grant(value, r.epoch, r.requested_at, duration);
        (source.known_epoch(key)? == r.epoch).then(|| self.install(key.clone(), l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, VirtualClock};
    use std::cell::Cell;
    use std::future::{Ready, ready};

    use crate::test_util::now_or_never;

    /// A server whose epoch moves on at the n-th request, and which refuses renewals.
    struct Flaky {
        clock: VirtualClock,
        epoch: Cell<u64>,
        requests: Cell<u32>,
        bump_at: u32,
    }

    impl LeaseSource<u64> for Flaky {
        type Value = u64;
        type Error = &'static str;
        type Renewal = Ready<Option<u64>>;
        fn epoch(&self, _: &u64) -> Result<u64, &'static str> {
            Ok(self.epoch.get())
        }
        fn known_epoch(&self, _: &u64) -> Option<u64> {
            Some(self.epoch.get())
        }
        fn now(&self) -> Timestamp {
            self.clock.now()
        }
        fn post_renewal(&self, _: &u64) -> Option<Self::Renewal> {
            Some(ready(None))
        }
        fn renewal_grant(&self, _: &u64, reply: Option<u64>) -> Option<(u64, Duration)> {
            reply.map(|v| (v, Duration::from_millis(10)))
        }
        fn request(&self, k: &u64) -> impl Future<Output = Result<(u64, Duration), &'static str>> {
            self.requests.set(self.requests.get() + 1);
            if self.requests.get() == self.bump_at {
                // The connection is replaced while this request is out.
                self.epoch.set(self.epoch.get() + 1);
            }
            let r = if *k == 0 {
                Err("gone")
            } else {
                Ok((*k, Duration::from_millis(10)))
            };
            ready(r)
        }
    }

    #[test]
    fn grants_of_a_replaced_connection_are_asked_again_and_failures_pass_through() {
        let src = Flaky {
            clock: VirtualClock::new(),
            epoch: Cell::new(0),
            requests: Cell::new(0),
            bump_at: 1,
        };
        let cache = LeaseCache::new(Duration::ZERO, true);
        let l = now_or_never(cache.acquire(&src, &5)).unwrap();
        assert_eq!((l.value, l.epoch, src.requests.get()), (5, 1, 2));
        // Renewals that grant nothing: the lease lapses, then is requested again.
        src.clock.advance(Duration::from_millis(6));
        now_or_never(cache.acquire(&src, &5)).unwrap();
        assert_eq!(src.requests.get(), 2);
        src.clock.advance(Duration::from_millis(6));
        now_or_never(cache.acquire(&src, &5)).unwrap();
        assert_eq!(src.requests.get(), 3);
        // A lease of another epoch is not used.
        src.epoch.set(7);
        assert_eq!(now_or_never(cache.acquire(&src, &5)).unwrap().epoch, 7);
        assert_eq!(src.requests.get(), 4);
        assert_eq!(now_or_never(cache.acquire(&src, &0)), Err("gone"));
    }

    #[test]
    fn a_lease_of_another_epoch_is_outdated_and_dropped() {
        let src = Flaky {
            clock: VirtualClock::new(),
            epoch: Cell::new(3),
            requests: Cell::new(0),
            bump_at: 0,
        };
        let cache = LeaseCache::new(Duration::ZERO, true);
        let l = now_or_never(cache.acquire(&src, &5)).unwrap();
        assert!(!cache.outdated(&5, &l, 3));
        assert_eq!(cache.len(), 1);
        assert!(cache.outdated(&5, &l, 4));
        assert!(cache.get(&5).is_none());
        // Taken again, in the epoch of the connection that replaced it.
        src.epoch.set(4);
        assert_eq!(now_or_never(cache.acquire(&src, &5)).unwrap().epoch, 4);
        assert_eq!(src.requests.get(), 2);
    }
}
