//! Keys are not stored in the index: a slot holds a fingerprint and a pointer to the KV
//! object. Whoever owns the objects (the KV layer) tells the index which candidate holds a
//! key, and what the keys of a subtable's slots are when a split rehashes them.

use std::future::Future;
use std::pin::Pin;

use dmkit_verbs::Endpoint;

use crate::error::Result;
use crate::slot::Slot;

/// A boxed future that may move between threads (the async form of a trait method).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Reads KV objects on behalf of the index.
///
/// Implementations should read all candidates in one round trip (one batch per node, posted
/// together with [`Endpoint::execute_many`]) and tag their verbs with their own tag, so the
/// index's per-operation counts stay the index's.
pub trait KeyVerifier: Send + Sync {
    /// The keys stored in the objects `slots` point to, in order. Used by splits (to rehash
    /// a subtable's entries) and by the default [`KeyVerifier::find`].
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Vec<u8>>>;

    /// Which of `candidates` (slots whose fingerprint matches the key's) holds `key`, if any.
    /// A KV layer can override this to read whole objects and keep the value it found.
    fn find(&self, ep: &Endpoint, key: &[u8], candidates: &[Slot]) -> Result<Option<usize>> {
        if candidates.is_empty() {
            return Ok(None);
        }
        Ok(self
            .keys(ep, candidates)?
            .iter()
            .position(|k| k.as_slice() == key))
    }

    /// [`KeyVerifier::find`] for async operations: a verifier that reads objects should
    /// override it with awaited reads (and may define `find` as `block_on` of it). The default
    /// runs `find` in place.
    fn find_async<'a>(
        &'a self,
        ep: &'a Endpoint,
        key: &'a [u8],
        candidates: &'a [Slot],
    ) -> BoxFuture<'a, Result<Option<usize>>> {
        Box::pin(std::future::ready(self.find(ep, key, candidates)))
    }

    /// After `find` returned a candidate: whether the object it read there may not have been
    /// published yet (its writer had not finished). Such an object can sit at an address a
    /// slot pointed to when the buckets were read and has pointed away from since — freed
    /// and handed to a new write of the same key, whose swap may still fail. The index then
    /// reads the slot word again before it trusts the find: unchanged, the object is the one
    /// the word publishes (a freed address comes back to a slot only with a new swap).
    /// Default: no (objects are final once a slot points to them).
    fn unsettled(&self) -> bool {
        false
    }
}

impl<T: KeyVerifier + ?Sized> KeyVerifier for &T {
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Vec<u8>>> {
        (**self).keys(ep, slots)
    }
    fn find(&self, ep: &Endpoint, key: &[u8], candidates: &[Slot]) -> Result<Option<usize>> {
        (**self).find(ep, key, candidates)
    }
    fn find_async<'a>(
        &'a self,
        ep: &'a Endpoint,
        key: &'a [u8],
        candidates: &'a [Slot],
    ) -> BoxFuture<'a, Result<Option<usize>>> {
        (**self).find_async(ep, key, candidates)
    }
    fn unsettled(&self) -> bool {
        (**self).unsettled()
    }
}
