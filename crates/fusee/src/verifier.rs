//! How the index asks FUSEE which candidate slot holds a key: read the objects the candidates
//! point to (one batch per node, all in one round trip) and compare keys; keep what was found
//! (value, generation) for the operation that asked.

use dmkit_kv_index::objects::{self, ObjectLocator};
use dmkit_kv_index::{KeyVerifier, Slot};
use dmkit_verbs::{Endpoint, RemoteAddr};
use parking_lot::Mutex;

use crate::cluster::ClusterView;
use crate::object::{self, Addr, KvObject};

pub(crate) const TAG: &str = "fusee_verify";

/// The primary copy's address of the object a slot points to.
pub(crate) fn slot_addr(s: Slot) -> Addr {
    Addr {
        node: s.node(),
        offset: s.offset(),
    }
}

/// Reads the objects behind `slots` in one round trip; `None` where an object is not a
/// complete, live object.
pub(crate) fn read_objects(
    ep: &Endpoint,
    view: &ClusterView,
    slots: &[Slot],
) -> dmkit_kv_index::Result<Vec<Option<KvObject>>> {
    dmkit_verbs::block_on(read_objects_async(ep, view, slots))
}

/// Where an object is read: where it is served — its node, or (failed over) its block's
/// acting primary — then, should that node fail, its block's other serving replicas (every
/// data replica holds an object before any slot points to it, at the same offset), so a read
/// goes on while a failed node is not yet failed over.
struct Copies<'a>(&'a ClusterView);

impl ObjectLocator for Copies<'_> {
    fn copies(&self, s: &Slot) -> dmkit_kv_index::Result<Vec<RemoteAddr>> {
        let view = self.0;
        let Some(at) = view.acting(s.node(), s.offset()) else {
            return Err(dmkit_kv_index::Error::Verifier(format!(
                "slot points to memory node {}, which does not serve (nor any replica of its block)",
                s.node()
            )));
        };
        let block = s.offset() / view.block_size.max(1);
        let others = view
            .block_replicas(block)
            .into_iter()
            .filter(|n| *n != at.node)
            .filter_map(|n| view.region(n))
            .map(|r| r.at(s.offset()));
        Ok(std::iter::once(at).chain(others).collect())
    }
}

/// [`read_objects`], awaited.
pub(crate) async fn read_objects_async(
    ep: &Endpoint,
    view: &ClusterView,
    slots: &[Slot],
) -> dmkit_kv_index::Result<Vec<Option<KvObject>>> {
    let objects = objects::read_objects_async(ep, TAG, &Copies(view), slots).await?;
    Ok(objects
        .iter()
        .zip(slots)
        .map(|(b, s)| object::decode(b, slot_addr(*s)))
        .collect())
}

/// A verifier for one operation: remembers the object it matched.
#[derive(Debug)]
pub(crate) struct Verifier<'a> {
    pub view: &'a ClusterView,
    pub found: Mutex<Option<(Slot, KvObject)>>,
    /// The object the address cache named, read in the operation's first round trip beside
    /// the buckets and found whole, live and of the cached generation: when the buckets still
    /// point to it, it is the key's and needs no second read (the paper's cached write).
    pub prefetched: Mutex<Option<(Slot, KvObject)>>,
}

impl<'a> Verifier<'a> {
    pub fn new(view: &'a ClusterView) -> Self {
        Self {
            view,
            found: Mutex::new(None),
            prefetched: Mutex::new(None),
        }
    }

    pub fn take(&self) -> Option<(Slot, KvObject)> {
        self.found.lock().take()
    }
}

impl KeyVerifier for Verifier<'_> {
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> dmkit_kv_index::Result<Vec<Vec<u8>>> {
        Ok(read_objects(ep, self.view, slots)?
            .into_iter()
            .map(|o| o.map(|o| o.key).unwrap_or_default())
            .collect())
    }

    fn find(
        &self,
        ep: &Endpoint,
        key: &[u8],
        candidates: &[Slot],
    ) -> dmkit_kv_index::Result<Option<usize>> {
        dmkit_verbs::block_on(self.find_async(ep, key, candidates))
    }

    fn find_async<'b>(
        &'b self,
        ep: &'b Endpoint,
        key: &'b [u8],
        candidates: &'b [Slot],
    ) -> dmkit_kv_index::BoxFuture<'b, dmkit_kv_index::Result<Option<usize>>> {
        Box::pin(async move {
            if candidates.is_empty() {
                return Ok(None);
            }
            // (Taken: a retry after a stale candidate reads for itself.)
            let prefetched = self.prefetched.lock().take();
            if let Some((s, o)) = prefetched {
                if let Some(i) = candidates.iter().position(|c| *c == s) {
                    if o.key == key {
                        *self.found.lock() = Some((s, o));
                        return Ok(Some(i));
                    }
                }
            }
            let objs = read_objects_async(ep, self.view, candidates).await?;
            let mut gone = false;
            for (i, o) in objs.into_iter().enumerate() {
                match o {
                    Some(o) if o.key == key => {
                        *self.found.lock() = Some((candidates[i], o));
                        return Ok(Some(i));
                    }
                    Some(_) => {}
                    // Reclaimed (or reused and not yet whole): the slot has moved on since
                    // the buckets were read, maybe to this very key. Never conclude "absent"
                    // from it.
                    None => gone = true,
                }
            }
            if gone {
                return Err(dmkit_kv_index::Error::StaleCandidate);
            }
            Ok(None)
        })
    }

    fn unsettled(&self) -> bool {
        self.found
            .lock()
            .as_ref()
            .is_some_and(|(_, o)| !o.log.finished)
    }
}

/// A [`Verifier`] for a conditional write: the key's object counts as found only if its
/// value is the expected one. Otherwise the value it holds is kept ([`ValueGuard::mismatch`])
/// and the index is told the key is not there, so it writes nothing: the comparison is the
/// read of that object, and a write that goes ahead replaces exactly the word whose object
/// was compared (SNAPSHOT's CAS expects it). Without an expected value it is the verifier.
/// What a write expects of the key's object.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expect<'a> {
    /// Whatever it holds (an unconditional write).
    Any,
    /// A value whose deadline has not passed by the client's clock (the system clock plus
    /// this skew in ms, read only for a value with a deadline); an expired key counts as
    /// absent.
    Live(i64),
    /// Exactly these stored bytes (a conditional write).
    Exactly(&'a [u8]),
}

pub(crate) struct ValueGuard<'a, 'v> {
    inner: &'a Verifier<'v>,
    expected: Expect<'a>,
    mismatch: Mutex<Option<Vec<u8>>>,
}

impl<'a, 'v> ValueGuard<'a, 'v> {
    pub fn new(inner: &'a Verifier<'v>, expected: Expect<'a>) -> Self {
        Self {
            inner,
            expected,
            mismatch: Mutex::new(None),
        }
    }

    /// The value the key held instead of the expected one, when that is why it was not
    /// found (by the last verification).
    pub fn mismatch(&self) -> Option<Vec<u8>> {
        self.mismatch.lock().clone()
    }
}

impl KeyVerifier for ValueGuard<'_, '_> {
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> dmkit_kv_index::Result<Vec<Vec<u8>>> {
        self.inner.keys(ep, slots)
    }

    fn find(
        &self,
        ep: &Endpoint,
        key: &[u8],
        candidates: &[Slot],
    ) -> dmkit_kv_index::Result<Option<usize>> {
        dmkit_verbs::block_on(self.find_async(ep, key, candidates))
    }

    fn find_async<'b>(
        &'b self,
        ep: &'b Endpoint,
        key: &'b [u8],
        candidates: &'b [Slot],
    ) -> dmkit_kv_index::BoxFuture<'b, dmkit_kv_index::Result<Option<usize>>> {
        Box::pin(async move {
            let found = self.inner.find_async(ep, key, candidates).await?;
            *self.mismatch.lock() = None;
            let Some(i) = found else {
                return Ok(None);
            };
            let mut held = self.inner.found.lock();
            match (self.expected, held.as_ref()) {
                (Expect::Exactly(expected), Some((_, o))) if o.value != expected => {
                    *self.mismatch.lock() = Some(o.value.clone());
                    *held = None;
                    Ok(None)
                }
                (Expect::Live(skew), Some((_, o)))
                    if crate::value::decode(&o.value).is_ok_and(|d| {
                        d.deadline.is_some()
                            && d.expired(crate::value::now_ms().saturating_add_signed(skew))
                    }) =>
                {
                    *held = None;
                    Ok(None)
                }
                _ => Ok(Some(i)),
            }
        })
    }

    fn unsettled(&self) -> bool {
        self.inner.unsettled()
    }
}
