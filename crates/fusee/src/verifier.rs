//! How the index asks FUSEE which candidate slot holds a key: kv-index's [`Finder`] reads the
//! objects the candidates point to (one batch per node, all in one round trip; an object on a
//! failed node from its block's next replica) and compares keys, keeping what was found
//! (value, generation) for the operation that asked. FUSEE adds where an object's copies are
//! ([`Copies`]), how it decodes, and what a conditional write expects of it ([`Expect`]).

use dmkit_kv_index::Slot;
use dmkit_kv_index::objects::{Finder, Guarded, KeyedObject, ObjectLocator};
use dmkit_verbs::{Endpoint, RemoteAddr};

use crate::cluster::ClusterView;
use crate::object::{self, Addr, KvObject};

/// Tag of the verifier's reads.
pub(crate) const TAG: &str = "fusee_verify";

/// The verifier of one operation: FUSEE's objects, read where `view` serves them.
pub(crate) type Verifier<'a> = Finder<Copies<'a>, KvObject>;

pub(crate) fn slot_addr(s: Slot) -> Addr {
    Addr {
        node: s.node(),
        offset: s.offset(),
    }
}

/// Every copy of a slot's object: where it is served (its node, or its block's acting
/// primary when that node failed), then its block's other replicas.
#[derive(Debug)]
pub(crate) struct Copies<'a>(pub(crate) &'a ClusterView);

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

impl KeyedObject for KvObject {
    fn key(&self) -> &[u8] {
        &self.key
    }

    /// Its writer had not finished (the log entry is not marked): it may not be published.
    fn unsettled(&self) -> bool {
        !self.log.finished
    }
}

fn decode(bytes: &[u8], s: &Slot) -> Option<KvObject> {
    object::decode(bytes, slot_addr(*s))
}

/// A verifier of FUSEE's objects as `view` serves them.
pub(crate) fn verifier(view: &ClusterView) -> Verifier<'_> {
    Finder::new(Copies(view), TAG, decode)
}

/// The objects `slots` point to (`None`: no object there, e.g. freed and reused), in order.
pub(crate) async fn read_objects_async(
    ep: &Endpoint,
    view: &ClusterView,
    slots: &[Slot],
) -> dmkit_kv_index::Result<Vec<Option<KvObject>>> {
    verifier(view).read_async(ep, slots).await
}

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

impl Expect<'_> {
    /// Whether `o` is what the write expects; if not, the value it holds when a comparison
    /// failed (an expired key is just absent).
    fn check(self, o: &KvObject) -> Result<(), Option<Vec<u8>>> {
        match self {
            Expect::Exactly(expected) if o.value != expected => Err(Some(o.value.clone())),
            Expect::Live(skew)
                if crate::value::decode(&o.value).is_ok_and(|d| {
                    d.deadline.is_some()
                        && d.expired(crate::value::now_ms().saturating_add_signed(skew))
                }) =>
            {
                Err(None)
            }
            _ => Ok(()),
        }
    }
}

/// `v` for a conditional write: the key's object counts as found only if it is what
/// `expected` says. Otherwise the value it holds is kept (the guard's `rejection`) and the
/// index is told the key is not there, so it writes nothing: the comparison is the read of
/// that object, and a write that goes ahead replaces exactly the word whose object was
/// compared (SNAPSHOT's CAS expects it). With [`Expect::Any`] it is `v`.
#[allow(clippy::type_complexity)] // (the closure's type can only be named as `impl Fn`)
pub(crate) fn guard<'a, 'v>(
    v: &'a Verifier<'v>,
    expected: Expect<'a>,
) -> Guarded<
    'a,
    Copies<'v>,
    KvObject,
    Option<Vec<u8>>,
    impl Fn(&KvObject) -> Result<(), Option<Vec<u8>>> + Send + Sync + 'a,
> {
    Guarded::new(v, move |o: &KvObject| expected.check(o))
}
