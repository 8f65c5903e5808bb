//! A general object verifier, for KV layers that keep their keys inside their objects: the
//! index's slots point to objects ([`crate::ObjPtr`]: a node, an offset in that node's object
//! region, a length); [`ObjectVerifier`] reads the candidates (one batch per node, every node
//! in one round trip) and asks the layer's `key_of` where each object's key is.
//!
//! Objects kept in several copies (data replicas) are read with [`read_objects_async`] and an
//! [`ObjectLocator`] that names each object's copies: a copy whose node failed is read again
//! from the next one, so reads go on while a failed node is not yet failed over.
//!
//! For layers with no object format of their own there is one here: a *record* is
//! `key length u32 | value length u32 | key | value`, little-endian ([`encode_record`],
//! [`decode_record`]); [`ObjectVerifier::records`] verifies it.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_kv_index::objects::{ObjectVerifier, decode_record, encode_record};
//! use dmkit_kv_index::{IndexConfig, IndexReplicaSpace, InsertOutcome, ObjPtr, RaceIndex};
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
//!
//! let cluster = SimCluster::new(SimConfig::default());
//! let node = Arc::new(MemoryNode::new(NodeId(0)));
//! let index = node.register(Arc::new(DramBacking::new(4 << 20)), Access::ALL, None)?;
//! let objects = node.register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)?;
//! cluster.add_node(node);
//! let space = [IndexReplicaSpace { region: index, offset: 0, len: index.len }];
//! let ep = cluster.endpoint(1)?;
//! RaceIndex::format(&ep, &IndexConfig::default(), &space)?;
//! let idx = RaceIndex::open(&ep, &space)?;
//! let verifier = ObjectVerifier::records(vec![objects]);
//!
//! // The KV layer writes the object, then puts its pointer in the index.
//! let rec = encode_record(b"fruit", b"apple");
//! ep.write("put", objects.at(0), &rec)?;
//! let ptr = ObjPtr { node: NodeId(0), offset: 0, len_class: ObjPtr::len_class_of(rec.len()).unwrap() };
//! let out = idx.insert(&verifier, b"fruit", idx.slot_for(b"fruit", ptr)?)?;
//! assert!(matches!(out, InsertOutcome::Inserted { .. }));
//! assert_eq!(idx.search(&verifier, b"fruit")?.map(|s| s.ptr()), Some(ptr));
//! // Reading it back (objects are read whole: 64-byte units).
//! let found = idx.search(&verifier, b"fruit")?.unwrap();
//! let bytes = verifier.read(&ep, &found)?;
//! assert_eq!(decode_record(&bytes), Some((&b"fruit"[..], &b"apple"[..])));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use dmkit_verbs::{Endpoint, NodeId, OpIdx, RegionDesc, RemoteAddr};

use crate::error::{Error, Result};
use crate::slot::Slot;
use crate::verifier::{BoxFuture, KeyVerifier};

/// Tag of the verifier's reads.
pub const TAG: &str = "kv_index.objects";

/// A record: `key length u32 | value length u32 | key | value`.
pub fn encode_record(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(8 + key.len() + value.len());
    r.extend_from_slice(&(key.len() as u32).to_le_bytes());
    r.extend_from_slice(&(value.len() as u32).to_le_bytes());
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    r
}

/// The key and value of a record (`bytes` may run past its end: objects are padded).
pub fn decode_record(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let klen = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let vlen = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?) as usize;
    let key = bytes.get(8..8usize.checked_add(klen)?)?;
    let value = bytes.get(8 + klen..(8 + klen).checked_add(vlen)?)?;
    Some((key, value))
}

fn record_key(bytes: &[u8]) -> Option<&[u8]> {
    decode_record(bytes).map(|(k, _)| k)
}

/// Where the object a slot points to can be read: its copies, the one to read first first.
pub trait ObjectLocator: Sync {
    /// The copies of the object `slot` points to (at least one), in the order to try them:
    /// the next is read only when the node of the one before failed.
    fn copies(&self, slot: &Slot) -> Result<Vec<RemoteAddr>>;
}

impl<T: ObjectLocator + ?Sized> ObjectLocator for &T {
    fn copies(&self, slot: &Slot) -> Result<Vec<RemoteAddr>> {
        (**self).copies(slot)
    }
}

/// One object region per node, one copy of each object: a slot's offset in its node's region.
impl ObjectLocator for [RegionDesc] {
    fn copies(&self, s: &Slot) -> Result<Vec<RemoteAddr>> {
        let r = self
            .iter()
            .find(|r| r.node == s.node())
            .ok_or_else(|| Error::Verifier(format!("no object region on node {}", s.node())))?;
        if s.offset() + s.object_len() as u64 > r.len {
            return Err(Error::Verifier(format!(
                "slot {:#x} points outside its region",
                s.raw()
            )));
        }
        Ok(vec![r.at(s.offset())])
    }
}

/// Whether a read that failed with `e` may be read again from another copy: the node failed,
/// or there is no connection to it.
fn node_gone(e: &dmkit_verbs::Error) -> bool {
    e.is_node_failure() || matches!(e, dmkit_verbs::Error::NoSuchNode(_))
}

/// The bytes of the objects `slots` point to, in order (whole: [`Slot::object_len`] bytes
/// each), tagged `tag`: the first copy of each ([`ObjectLocator::copies`]), one batch per
/// node, all in one round trip; the objects whose node failed are read again from their next
/// copies (one more round trip per such step). When no copy of an object answers, the error
/// of its first copy's node.
pub async fn read_objects_async<L: ObjectLocator + ?Sized>(
    ep: &Endpoint,
    tag: dmkit_verbs::Tag,
    locator: &L,
    slots: &[Slot],
) -> Result<Vec<Vec<u8>>> {
    let copies = slots
        .iter()
        .map(|s| match locator.copies(s)? {
            c if c.is_empty() => Err(Error::Verifier(format!("slot {:#x}: no copy", s.raw()))),
            c => Ok(c),
        })
        .collect::<Result<Vec<_>>>()?;
    // An object still to read: (its index, which copy, the error of its first copy's node
    // once that failed).
    type Todo = (usize, usize, Option<usize>);
    let mut out = vec![Vec::new(); slots.len()];
    let mut todo: Vec<Todo> = (0..slots.len()).map(|i| (i, 0, None)).collect();
    let mut errs: Vec<Option<dmkit_verbs::Error>> = Vec::new();
    while !todo.is_empty() {
        let mut batches: Vec<(NodeId, dmkit_verbs::Batch)> = Vec::new();
        let mut plan: Vec<Vec<(Todo, OpIdx)>> = Vec::new();
        for (i, c, err) in todo.drain(..) {
            let at = copies[i][c];
            let b = match batches.iter().position(|(n, _)| *n == at.node) {
                Some(b) => b,
                None => {
                    batches.push((at.node, ep.batch(at.node)));
                    plan.push(Vec::new());
                    batches.len() - 1
                }
            };
            let op = batches[b].1.read(at, slots[i].object_len());
            plan[b].push(((i, c, err), op));
        }
        let done = ep
            .execute_many_async(tag, batches.into_iter().map(|b| b.1).collect())
            .await;
        for (res, items) in done.into_iter().zip(plan) {
            match res {
                Ok(res) => {
                    for ((i, _, _), op) in items {
                        out[i] = res.read(op).to_vec();
                    }
                }
                Err(e) if node_gone(&e) => {
                    let k = errs.len();
                    errs.push(Some(e));
                    for ((i, c, err), _) in items {
                        let err = err.unwrap_or(k);
                        if c + 1 < copies[i].len() {
                            todo.push((i, c + 1, Some(err)));
                        } else {
                            let first = errs[err].take();
                            let node = copies[i][0].node;
                            return Err(first
                                .unwrap_or(dmkit_verbs::Error::NoSuchNode(node))
                                .into());
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(out)
}

/// Reads the objects slots point to, and finds keys in them with `key_of`.
pub struct ObjectVerifier<F = fn(&[u8]) -> Option<&[u8]>> {
    regions: Vec<RegionDesc>,
    key_of: F,
    tag: dmkit_verbs::Tag,
}

impl<F> std::fmt::Debug for ObjectVerifier<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectVerifier")
            .field("regions", &self.regions)
            .finish_non_exhaustive()
    }
}

impl ObjectVerifier {
    /// A verifier of [`encode_record`] objects in `regions` (one object region per node).
    pub fn records(regions: Vec<RegionDesc>) -> Self {
        Self::new(regions, record_key)
    }
}

impl ObjectVerifier {
    /// The value of the record `slot` points to (one round trip); `None` if the object does
    /// not decode as a record.
    pub fn read_value(&self, ep: &Endpoint, slot: &Slot) -> Result<Option<Vec<u8>>> {
        Ok(decode_record(&self.read(ep, slot)?).map(|(_, v)| v.to_vec()))
    }
}

impl<F: Fn(&[u8]) -> Option<&[u8]> + Send + Sync> ObjectVerifier<F> {
    /// A verifier of objects in `regions` (one per node; a slot's offset is in its node's
    /// region) whose key `key_of` finds (`None`: the object does not decode).
    pub fn new(regions: Vec<RegionDesc>, key_of: F) -> Self {
        Self {
            regions,
            key_of,
            tag: TAG,
        }
    }

    /// The same verifier tagging its reads `tag` (their round trips then count there).
    pub fn with_tag(mut self, tag: dmkit_verbs::Tag) -> Self {
        self.tag = tag;
        self
    }

    /// The object region on `node`.
    pub fn region(&self, node: NodeId) -> Result<RegionDesc> {
        self.regions
            .iter()
            .find(|r| r.node == node)
            .copied()
            .ok_or_else(|| Error::Verifier(format!("no object region on node {node}")))
    }

    /// The bytes of the objects `slots` point to, in order: one batch per node, all in one
    /// round trip.
    pub async fn read_many_async(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Vec<u8>>> {
        read_objects_async(ep, self.tag, self.regions.as_slice(), slots).await
    }

    /// The bytes of the object `slot` points to (one round trip).
    pub fn read(&self, ep: &Endpoint, slot: &Slot) -> Result<Vec<u8>> {
        let mut v = dmkit_verbs::block_on(self.read_many_async(ep, std::slice::from_ref(slot)))?;
        Ok(v.pop().unwrap_or_default())
    }

    fn keys_of(&self, objects: Vec<Vec<u8>>) -> Vec<Option<Vec<u8>>> {
        objects
            .iter()
            .map(|o| (self.key_of)(o).map(<[u8]>::to_vec))
            .collect()
    }
}

impl<F: Fn(&[u8]) -> Option<&[u8]> + Send + Sync> KeyVerifier for ObjectVerifier<F> {
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Vec<u8>>> {
        let objects = dmkit_verbs::block_on(self.read_many_async(ep, slots))?;
        self.keys_of(objects)
            .into_iter()
            .map(|k| k.ok_or_else(|| Error::Verifier("an object does not decode".into())))
            .collect()
    }

    fn find(&self, ep: &Endpoint, key: &[u8], candidates: &[Slot]) -> Result<Option<usize>> {
        dmkit_verbs::block_on(self.find_async(ep, key, candidates))
    }

    fn find_async<'a>(
        &'a self,
        ep: &'a Endpoint,
        key: &'a [u8],
        candidates: &'a [Slot],
    ) -> BoxFuture<'a, Result<Option<usize>>> {
        Box::pin(async move {
            if candidates.is_empty() {
                return Ok(None);
            }
            let objects = self.read_many_async(ep, candidates).await?;
            // (An object that does not decode — freed and reused — holds no key.)
            Ok(self
                .keys_of(objects)
                .iter()
                .position(|k| k.as_deref() == Some(key)))
        })
    }
}

/// An object a [`Finder`] decoded: where its key is, and whether its writer may not have
/// finished with it.
pub trait KeyedObject: Send + Sync {
    /// The object's key.
    fn key(&self) -> &[u8];

    /// Whether the object may not be published yet (see [`KeyVerifier::unsettled`]).
    /// Default: no.
    fn unsettled(&self) -> bool {
        false
    }
}

/// A verifier for KV layers with an object format of their own: it reads whole candidates
/// (through an [`ObjectLocator`], so an object whose node failed is read from its next copy),
/// decodes them with the layer's `decode`, and keeps the object it found — the operation that
/// asked has the old value without reading it again ([`Finder::take`]). An object the caller
/// already read (say, in the round trip that wrote its new object) is handed in with
/// [`Finder::prefetched`] and spares the find its read.
///
/// A candidate that no longer decodes (freed and reused while the buckets were read) makes
/// the find fail with [`Error::StaleCandidate`] when no other candidate holds the key: the
/// index then reads the buckets again.
///
/// ```
/// use dmkit_kv_index::objects::{Finder, KeyedObject, decode_record, encode_record};
/// use dmkit_kv_index::{IndexConfig, IndexReplicaSpace, ObjPtr, RaceIndex, Slot};
/// use dmkit_verbs::sim::SimCluster;
///
/// struct Record { key: Vec<u8>, value: Vec<u8> }
/// impl KeyedObject for Record {
///     fn key(&self) -> &[u8] { &self.key }
/// }
/// fn decode(bytes: &[u8], _: &Slot) -> Option<Record> {
///     decode_record(bytes).map(|(k, v)| Record { key: k.to_vec(), value: v.to_vec() })
/// }
///
/// let (cluster, regions) = SimCluster::with_dram_nodes(2, 4 << 20)?;
/// let ep = cluster.endpoint(9)?;
/// let space = [IndexReplicaSpace { region: regions[0], offset: 0, len: 1 << 20 }];
/// RaceIndex::format(&ep, &IndexConfig::default(), &space)?;
/// let idx = RaceIndex::open(&ep, &space)?;
/// // Objects live on node 1 (one copy each).
/// let objects = [regions[1]];
/// let rec = encode_record(b"fruit", b"apple");
/// ep.write("put", regions[1].at(0), &rec)?;
/// let ptr = ObjPtr { node: regions[1].node, offset: 0, len_class: ObjPtr::len_class_of(rec.len()).unwrap() };
/// let finder = Finder::new(&objects[..], "demo.objects", decode);
/// idx.insert(&finder, b"fruit", idx.slot_for(b"fruit", ptr)?)?;
/// let finder = Finder::new(&objects[..], "demo.objects", decode);
/// assert!(idx.search(&finder, b"fruit")?.is_some());
/// // The search read the object: its value is kept.
/// let (_, found) = finder.take().unwrap();
/// assert_eq!(found.value, b"apple");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Finder<L, O> {
    locator: L,
    tag: dmkit_verbs::Tag,
    decode: fn(&[u8], &Slot) -> Option<O>,
    found: parking_lot::Mutex<Option<(Slot, O)>>,
    prefetched: parking_lot::Mutex<Option<(Slot, O)>>,
}

impl<L, O> std::fmt::Debug for Finder<L, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finder")
            .field("tag", &self.tag)
            .field("found", &self.found.lock().as_ref().map(|(s, _)| *s))
            .finish_non_exhaustive()
    }
}

impl<L: ObjectLocator + Send, O: KeyedObject> Finder<L, O> {
    /// A finder reading objects where `locator` says, tagging its reads `tag` (their round
    /// trips count there), decoding them with `decode` (`None`: not an object, e.g. freed).
    pub fn new(locator: L, tag: dmkit_verbs::Tag, decode: fn(&[u8], &Slot) -> Option<O>) -> Self {
        Self {
            locator,
            tag,
            decode,
            found: parking_lot::Mutex::new(None),
            prefetched: parking_lot::Mutex::new(None),
        }
    }

    /// The decoded objects `slots` point to, in order (one round trip while their nodes
    /// answer).
    pub async fn read_async(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Option<O>>> {
        let bytes = read_objects_async(ep, self.tag, &self.locator, slots).await?;
        let decoded = bytes.iter().zip(slots).map(|(b, s)| (self.decode)(b, s));
        Ok(decoded.collect())
    }

    /// An object already read at `slot`: the next find takes it instead of reading, when
    /// `slot` is among its candidates and the key matches.
    pub fn prefetched(&self, slot: Slot, object: O) {
        *self.prefetched.lock() = Some((slot, object));
    }

    /// The object the last find found, and the slot that points to it (taken: the next call
    /// returns `None`).
    pub fn take(&self) -> Option<(Slot, O)> {
        self.found.lock().take()
    }

    /// Where it reads objects.
    pub fn locator(&self) -> &L {
        &self.locator
    }

    /// Whether the last find found the key.
    pub fn has_found(&self) -> bool {
        self.found.lock().is_some()
    }

    /// `f` of the object the last find found (kept, not taken), if it found one.
    pub fn peek<R>(&self, f: impl FnOnce(&Slot, &O) -> R) -> Option<R> {
        self.found.lock().as_ref().map(|(s, o)| f(s, o))
    }
}

impl<L: ObjectLocator + Send, O: KeyedObject> KeyVerifier for Finder<L, O> {
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Vec<u8>>> {
        let objects = dmkit_verbs::block_on(self.read_async(ep, slots))?;
        let keys = objects.into_iter().map(|o| o.map(|o| o.key().to_vec()));
        Ok(keys.map(Option::unwrap_or_default).collect())
    }

    fn find(&self, ep: &Endpoint, key: &[u8], candidates: &[Slot]) -> Result<Option<usize>> {
        dmkit_verbs::block_on(self.find_async(ep, key, candidates))
    }

    fn find_async<'a>(
        &'a self,
        ep: &'a Endpoint,
        key: &'a [u8],
        candidates: &'a [Slot],
    ) -> BoxFuture<'a, Result<Option<usize>>> {
        Box::pin(async move {
            if candidates.is_empty() {
                return Ok(None);
            }
            if let Some((s, o)) = self.prefetched.lock().take()
                && let Some(i) = candidates.iter().position(|c| *c == s)
                && o.key() == key
            {
                *self.found.lock() = Some((s, o));
                return Ok(Some(i));
            }
            let mut gone = false;
            let objects = self.read_async(ep, candidates).await?;
            for (i, o) in objects.into_iter().enumerate() {
                match o {
                    Some(o) if o.key() == key => {
                        *self.found.lock() = Some((candidates[i], o));
                        return Ok(Some(i));
                    }
                    Some(_) => {}
                    None => gone = true,
                }
            }
            if gone {
                return Err(Error::StaleCandidate);
            }
            Ok(None)
        })
    }

    fn unsettled(&self) -> bool {
        let found = self.found.lock();
        found.as_ref().is_some_and(|(_, o)| o.unsettled())
    }
}

/// A [`Finder`] for conditional writes: the object it finds must also pass `check`, or the
/// key counts as not found — and what `check` said of it is kept ([`Guarded::rejection`]),
/// e.g. the value a compare-and-swap did not expect.
pub struct Guarded<'a, L, O, M, F> {
    finder: &'a Finder<L, O>,
    check: F,
    rejected: parking_lot::Mutex<Option<M>>,
}

impl<L, O, M, F> std::fmt::Debug for Guarded<'_, L, O, M, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded")
            .field("finder", self.finder)
            .finish_non_exhaustive()
    }
}

impl<'a, L, O, M, F> Guarded<'a, L, O, M, F>
where
    L: ObjectLocator + Send,
    O: KeyedObject,
    M: Send,
    F: Fn(&O) -> std::result::Result<(), M> + Send + Sync,
{
    /// `finder`, with `check` deciding whether a found object counts.
    pub fn new(finder: &'a Finder<L, O>, check: F) -> Self {
        Self {
            finder,
            check,
            rejected: parking_lot::Mutex::new(None),
        }
    }

    /// What `check` said of the object the last find rejected (taken).
    pub fn rejection(&self) -> Option<M> {
        self.rejected.lock().take()
    }
}

impl<L, O, M, F> KeyVerifier for Guarded<'_, L, O, M, F>
where
    L: ObjectLocator + Send,
    O: KeyedObject,
    M: Send,
    F: Fn(&O) -> std::result::Result<(), M> + Send + Sync,
{
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Vec<u8>>> {
        self.finder.keys(ep, slots)
    }

    fn find(&self, ep: &Endpoint, key: &[u8], candidates: &[Slot]) -> Result<Option<usize>> {
        dmkit_verbs::block_on(self.find_async(ep, key, candidates))
    }

    fn find_async<'b>(
        &'b self,
        ep: &'b Endpoint,
        key: &'b [u8],
        candidates: &'b [Slot],
    ) -> BoxFuture<'b, Result<Option<usize>>> {
        Box::pin(async move {
            let found = self.finder.find_async(ep, key, candidates).await?;
            *self.rejected.lock() = None;
            let mut held = self.finder.found.lock();
            let verdict = held.as_ref().map(|(_, o)| (self.check)(o));
            if let (Some(_), Some(Err(m))) = (found, verdict) {
                *self.rejected.lock() = Some(m);
                *held = None;
                return Ok(None);
            }
            Ok(found)
        })
    }

    fn unsettled(&self) -> bool {
        self.finder.unsettled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two copies of every object, one per node: `copies` names node 0's first.
    struct TwoCopies(Vec<RegionDesc>);

    impl ObjectLocator for TwoCopies {
        fn copies(&self, s: &Slot) -> Result<Vec<RemoteAddr>> {
            Ok(self.0.iter().map(|r| r.at(s.offset())).collect())
        }
    }

    #[test]
    fn objects_are_read_from_their_next_copy_when_a_node_fails() {
        use crate::ObjPtr;
        use dmkit_verbs::sim::SimCluster;

        let (cluster, regions) = SimCluster::with_dram_nodes(2, 1 << 16).unwrap();
        let ep = cluster.endpoint(9).unwrap();
        let slots: Vec<Slot> = [(0, b"a"), (128, b"b")]
            .iter()
            .map(|(off, v)| {
                let rec = encode_record(b"k", *v);
                for r in &regions {
                    ep.write("test", r.at(*off), &rec).unwrap();
                }
                let len_class = ObjPtr::len_class_of(rec.len()).unwrap();
                let ptr = ObjPtr {
                    node: NodeId(0),
                    offset: *off,
                    len_class,
                };
                Slot::new(1, ptr).unwrap()
            })
            .collect();
        let values = |objs: Vec<Vec<u8>>| -> Vec<Vec<u8>> {
            objs.iter()
                .map(|o| decode_record(o).unwrap().1.to_vec())
                .collect()
        };
        let locator = TwoCopies(regions.clone());
        let both =
            dmkit_verbs::block_on(read_objects_async(&ep, "test", &locator, &slots)).unwrap();
        assert_eq!(values(both), vec![b"a".to_vec(), b"b".to_vec()]);
        // Node 0 fails: both objects come from node 1.
        cluster.fail_node(NodeId(0));
        let again =
            dmkit_verbs::block_on(read_objects_async(&ep, "test", &locator, &slots)).unwrap();
        assert_eq!(values(again), vec![b"a".to_vec(), b"b".to_vec()]);
        // With one copy only, the failure is the reader's error.
        let one =
            dmkit_verbs::block_on(read_objects_async(&ep, "test", regions.as_slice(), &slots));
        assert!(
            matches!(&one, Err(Error::Verbs(e)) if e.is_node_failure()),
            "{one:?}"
        );
    }

    #[test]
    fn records_decode_and_refuse_lying_lengths() {
        let r = encode_record(b"k", b"value");
        assert_eq!(decode_record(&r), Some((&b"k"[..], &b"value"[..])));
        let mut padded = r.clone();
        padded.resize(64, 0);
        assert_eq!(decode_record(&padded), Some((&b"k"[..], &b"value"[..])));
        assert_eq!(decode_record(&r[..7]), None);
        let mut lying = r;
        lying[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_record(&lying), None);
    }

    #[derive(Debug, Clone, PartialEq)]
    struct Rec(Vec<u8>, Vec<u8>);

    impl KeyedObject for Rec {
        fn key(&self) -> &[u8] {
            &self.0
        }
    }

    fn rec(b: &[u8], _: &Slot) -> Option<Rec> {
        decode_record(b).map(|(k, v)| Rec(k.to_vec(), v.to_vec()))
    }

    #[test]
    fn a_finder_keeps_what_it_found_and_a_guard_rejects_what_its_check_refuses() {
        use crate::ObjPtr;
        use dmkit_verbs::sim::SimCluster;

        let (cluster, regions) = SimCluster::with_dram_nodes(1, 1 << 16).unwrap();
        let ep = cluster.endpoint(9).unwrap();
        let put = |off: u64, k: &[u8], v: &[u8]| {
            let r = encode_record(k, v);
            ep.write("test", regions[0].at(off), &r).unwrap();
            let len_class = ObjPtr::len_class_of(r.len()).unwrap();
            Slot::new(
                1,
                ObjPtr {
                    node: NodeId(0),
                    offset: off,
                    len_class,
                },
            )
            .unwrap()
        };
        let (a, b) = (put(0, b"a", b"1"), put(128, b"b", b"2"));
        let find = |v: &dyn KeyVerifier, key: &[u8], c: &[Slot]| v.find(&ep, key, c).unwrap();
        let f = Finder::new(regions.as_slice(), "test", rec);
        assert_eq!(find(&f, b"b", &[a, b]), Some(1));
        assert!(f.has_found());
        assert_eq!(f.peek(|s, o| (*s, o.1.clone())), Some((b, b"2".to_vec())));
        assert_eq!(f.take(), Some((b, Rec(b"b".to_vec(), b"2".to_vec()))));
        assert_eq!((f.take(), find(&f, b"c", &[a, b])), (None, None));
        // A prefetched object is taken without a read (its bytes here are not even stored).
        f.prefetched(a, Rec(b"z".to_vec(), b"9".to_vec()));
        assert_eq!(find(&f, b"z", &[b, a]), Some(1));
        assert_eq!(f.take().map(|(_, o)| o.1), Some(b"9".to_vec()));
        // A candidate that does not decode any more: stale, unless another holds the key.
        ep.write("test", regions[0].at(0), &[0xff; 16]).unwrap();
        let stale = f.find(&ep, b"x", &[a, b]);
        assert!(matches!(stale, Err(Error::StaleCandidate)), "{stale:?}");
        assert_eq!(find(&f, b"b", &[a, b]), Some(1));
        // A guard: the found object counts only if its value is "2".
        let want = |want: &'static [u8]| {
            move |o: &Rec| {
                if o.1 == want {
                    Ok(())
                } else {
                    Err(o.1.clone())
                }
            }
        };
        let g = Guarded::new(&f, want(b"2"));
        assert_eq!((find(&g, b"b", &[b]), g.rejection()), (Some(0), None));
        let g = Guarded::new(&f, want(b"3"));
        assert_eq!(find(&g, b"b", &[b]), None);
        assert!(!f.has_found());
        assert_eq!((g.rejection(), g.rejection()), (Some(b"2".to_vec()), None));
    }
}
