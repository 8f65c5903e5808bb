//! Keys are not stored in the index: a slot holds a fingerprint and a pointer to the KV
//! object. Whoever owns the objects (the KV layer) tells the index which candidate holds a
//! key, and what the keys of a subtable's slots are when a split rehashes them.

use dmkit_verbs::Endpoint;

use crate::error::Result;
use crate::slot::Slot;

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
}

impl<T: KeyVerifier + ?Sized> KeyVerifier for &T {
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Vec<u8>>> {
        (**self).keys(ep, slots)
    }
    fn find(&self, ep: &Endpoint, key: &[u8], candidates: &[Slot]) -> Result<Option<usize>> {
        (**self).find(ep, key, candidates)
    }
}
