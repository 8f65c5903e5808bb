//! The memory node: its registered regions, its RPC handler, and the soft NIC that executes
//! one-sided verbs against them (used by the `sim` and `tcp` backends; the `rdma` backend's NIC
//! does the same checks in hardware).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use rand::RngCore;

use crate::error::{AccessFault, Error, Result};
use crate::memory::{Backing, RegionMemory};
use crate::types::{Access, Media, NodeId, RKey, RegionDesc, RegionName};

/// Who sent an RPC: a per-connection id assigned by the node, and the peer's address if known.
#[derive(Debug, Clone)]
pub struct Peer {
    pub conn_id: u64,
    pub addr: String,
}

/// The two-sided service of a memory node (block allocation, leases, ...). Runs on the node;
/// the reply travels back to the caller of [`crate::Endpoint::rpc`].
pub trait RpcHandler: Send + Sync {
    /// Handles one request. `Err` becomes an [`Error::Rpc`] at the caller with this message.
    fn call(&self, peer: &Peer, req: &[u8]) -> std::result::Result<Vec<u8>, String>;
}

impl<F> RpcHandler for F
where
    F: Fn(&Peer, &[u8]) -> std::result::Result<Vec<u8>, String> + Send + Sync,
{
    fn call(&self, peer: &Peer, req: &[u8]) -> std::result::Result<Vec<u8>, String> {
        self(peer, req)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Region {
    pub desc: RegionDesc,
    pub mem: RegionMemory,
}

/// One verb as the node executes it (local buffers already resolved to bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write { durable: bool },
    Cas { expect: u64, new: u64 },
    Faa { add: u64 },
}

impl OpKind {
    pub(crate) fn needs(self) -> (Access, &'static str) {
        match self {
            OpKind::Read => (Access::REMOTE_READ, "read"),
            OpKind::Write { .. } => (Access::REMOTE_WRITE, "write"),
            OpKind::Cas { .. } | OpKind::Faa { .. } => (Access::REMOTE_ATOMIC, "atomic"),
        }
    }
}

/// Picks the requests a handler answers at once ([`MemoryNode::set_quick_rpcs`]).
type QuickRpcs = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// A memory node: regions registered for one-sided access and an optional RPC handler.
///
/// ```
/// use std::sync::Arc;
/// use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
/// let node = MemoryNode::new(NodeId(0));
/// let region = node.register(Arc::new(DramBacking::new(4096)), Access::ALL, None).unwrap();
/// node.memory(region.rkey).unwrap().store_u64(8, 42).unwrap();
/// ```
pub struct MemoryNode {
    id: NodeId,
    regions: RwLock<HashMap<RKey, Region>>,
    handler: RwLock<Option<Arc<dyn RpcHandler>>>,
    /// Which requests the handler answers at once ([`MemoryNode::set_quick_rpcs`]).
    quick: RwLock<Option<QuickRpcs>>,
    fenced: std::sync::atomic::AtomicBool,
    /// When the node's lease on serving runs out, in nanoseconds after [`clock_base`] (0:
    /// no lease): past it every one-sided verb is refused as fenced, whether or not the
    /// thread that keeps the lease has run since (see [`MemoryNode::set_serve_until`]).
    serve_until: std::sync::atomic::AtomicU64,
    /// Seeded rkeys (deterministic simulation); `None`: the thread's random generator.
    rkey_rng: parking_lot::Mutex<Option<rand_chacha::ChaCha8Rng>>,
    /// Told after the regions or the fencing changed (see [`MemoryNode::on_change`]).
    watchers: parking_lot::Mutex<Vec<Watcher>>,
}

/// A change watcher; returns false once it is no longer interested.
type Watcher = Box<dyn Fn() -> bool + Send + Sync>;

impl std::fmt::Debug for MemoryNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryNode")
            .field("id", &self.id)
            .field("regions", &self.regions().len())
            .finish()
    }
}

/// The instant serving deadlines count from (the first use in this process).
fn clock_base() -> std::time::Instant {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(std::time::Instant::now)
}

/// Remote addresses of regions registered without an explicit base start here and are spaced
/// 1 TiB apart, so a stray pointer into one region never lands in another.
const AUTO_BASE: u64 = 1 << 40;

impl MemoryNode {
    pub fn new(id: NodeId) -> Self {
        Self {
            id,
            regions: RwLock::new(HashMap::new()),
            handler: RwLock::new(None),
            quick: RwLock::new(None),
            fenced: std::sync::atomic::AtomicBool::new(false),
            serve_until: std::sync::atomic::AtomicU64::new(0),
            rkey_rng: parking_lot::Mutex::new(None),
            watchers: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Calls `watch` after every change of the regions or of the fencing (register,
    /// deregister, rekey, set_fenced) until it returns false. Backends whose NIC checks
    /// rkeys itself (rdma) use it to drop the registrations of old rkeys at once, so that a
    /// rekey or a fence cuts peers off as it does on the other backends.
    pub fn on_change(&self, watch: impl Fn() -> bool + Send + Sync + 'static) {
        self.watchers.lock().push(Box::new(watch));
    }

    fn changed(&self) {
        self.watchers.lock().retain(|w| w());
    }

    /// Draws the rkeys of later registrations and rekeys from a generator seeded with
    /// `seed` (deterministic simulation: the same seed, the same rkeys), or again from the
    /// thread's random generator with `None`.
    pub fn seed_rkeys(&self, seed: Option<u64>) {
        use rand::SeedableRng;
        *self.rkey_rng.lock() = seed.map(rand_chacha::ChaCha8Rng::seed_from_u64);
    }

    /// A fresh rkey not in `taken` (nor `avoid`).
    fn fresh_rkey(&self, taken: &HashMap<RKey, Region>, avoid: RKey) -> RKey {
        let mut seeded = self.rkey_rng.lock();
        let mut rng = rand::rng();
        loop {
            let k = RKey(match seeded.as_mut() {
                Some(r) => r.next_u32(),
                None => rng.next_u32(),
            });
            if k.0 != 0 && k != avoid && !taken.contains_key(&k) {
                return k;
            }
        }
    }

    /// Fences the node (`true`): every one-sided verb is refused with
    /// [`AccessFault::Fenced`] until it is unfenced; RPCs still reach the handler, so the
    /// node can be told it rejoined. Verbs already executing finish.
    pub fn set_fenced(&self, fenced: bool) {
        let was = self
            .fenced
            .swap(fenced, std::sync::atomic::Ordering::SeqCst);
        if was != fenced {
            self.changed();
        }
    }

    /// Whether the node is fenced.
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The node's lease on serving runs until `until` (`None`: no lease, the default). Past
    /// it, every one-sided verb the node executes in software (`sim`, `tcp`) is refused with
    /// [`AccessFault::Fenced`], checked on the verb's own path: a lease thread held off the
    /// CPU past the lease cannot leave the node serving after its coordinator counted it out.
    /// (The `rdma` NIC executes verbs without the CPU: there the lease thread's fence is the
    /// only one.) A renewal moves it on; it does not lift a fence set by
    /// [`MemoryNode::set_fenced`].
    pub fn set_serve_until(&self, until: Option<std::time::Instant>) {
        let nanos = until.map_or(0, |t| {
            let n = t.saturating_duration_since(clock_base()).as_nanos();
            u64::try_from(n).unwrap_or(u64::MAX).max(1)
        });
        self.serve_until
            .store(nanos, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the node's lease on serving ran out ([`MemoryNode::set_serve_until`]).
    pub fn lease_ran_out(&self) -> bool {
        let until = self.serve_until.load(std::sync::atomic::Ordering::SeqCst);
        until != 0 && clock_base().elapsed().as_nanos() > u128::from(until)
    }

    /// Gives region `rkey` a fresh unpredictable rkey: verbs with the old one fail from now
    /// on (with [`AccessFault::UnknownRkey`]), so peers holding it are cut off until they
    /// learn the new descriptor. Returns it, or `None` for an unknown rkey.
    pub fn rekey(&self, rkey: RKey) -> Option<RegionDesc> {
        let desc = {
            let mut regions = self.regions.write();
            let mut r = regions.remove(&rkey)?;
            let fresh = self.fresh_rkey(&regions, rkey);
            r.desc.rkey = fresh;
            let desc = r.desc;
            regions.insert(fresh, r);
            desc
        };
        self.changed();
        Some(desc)
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Registers memory for remote access and returns its descriptor with a fresh,
    /// unpredictable rkey. `base` fixes the region's remote address (persistent pools pass a
    /// fixed base so stored pointers survive restarts); `None` picks an unused one.
    pub fn register(
        &self,
        backing: Arc<dyn Backing>,
        access: Access,
        base: Option<u64>,
    ) -> Result<RegionDesc> {
        self.register_as(RegionName::default(), backing, access, base)
    }

    /// [`MemoryNode::register`] under a name, unique on the node, by which clients find the
    /// region ([`crate::Endpoint::region_named`]).
    pub fn register_named(
        &self,
        name: &str,
        backing: Arc<dyn Backing>,
        access: Access,
        base: Option<u64>,
    ) -> Result<RegionDesc> {
        let n = RegionName::new(name)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                Error::Registration(format!(
                    "region name {name:?}: 1 to {} printable ASCII bytes",
                    RegionName::MAX
                ))
            })?;
        self.register_as(n, backing, access, base)
    }

    fn register_as(
        &self,
        name: RegionName,
        backing: Arc<dyn Backing>,
        access: Access,
        base: Option<u64>,
    ) -> Result<RegionDesc> {
        let mem = RegionMemory::new(backing)?;
        let mut regions = self.regions.write();
        if !name.is_empty() && regions.values().any(|r| r.desc.name == name) {
            return Err(Error::Registration(format!(
                "memory node {} has a region named {name} already",
                self.id
            )));
        }
        let len = mem.len() as u64;
        let base = match base {
            Some(b) => b,
            None => {
                let top = regions
                    .values()
                    .map(|r| r.desc.base + r.desc.len)
                    .max()
                    .unwrap_or(0);
                top.div_ceil(AUTO_BASE).max(1) * AUTO_BASE
            }
        };
        if base.checked_add(len).is_none() {
            return Err(Error::Registration(format!(
                "region at {base:#x} of {len} bytes overflows the address space"
            )));
        }
        if let Some(r) = regions
            .values()
            .find(|r| base < r.desc.base + r.desc.len && r.desc.base < base + len)
        {
            return Err(Error::Registration(format!(
                "region at {base:#x} overlaps region {} at {:#x}",
                r.desc.rkey, r.desc.base
            )));
        }
        let rkey = self.fresh_rkey(&regions, RKey(0));
        let desc = RegionDesc {
            node: self.id,
            name,
            rkey,
            base,
            len,
            access,
            media: mem.media(),
        };
        regions.insert(rkey, Region { desc, mem });
        drop(regions);
        metrics::gauge!("dmkit_verbs_registered_bytes", "node" => self.id.to_string())
            .increment(len as f64);
        self.changed();
        Ok(desc)
    }

    /// Removes a region; verbs with its rkey fail from now on.
    pub fn deregister(&self, rkey: RKey) -> Option<RegionDesc> {
        let r = self.regions.write().remove(&rkey)?;
        metrics::gauge!("dmkit_verbs_registered_bytes", "node" => self.id.to_string())
            .decrement(r.desc.len as f64);
        self.changed();
        Some(r.desc)
    }

    /// The descriptors of every registered region (what clients learn at connect).
    pub fn regions(&self) -> Vec<RegionDesc> {
        let mut v: Vec<_> = self.regions.read().values().map(|r| r.desc).collect();
        v.sort_by_key(|d| d.base);
        v
    }

    /// The node-local view of a region's memory (for the node's own code: copying, recovery).
    pub fn memory(&self, rkey: RKey) -> Option<RegionMemory> {
        self.regions.read().get(&rkey).map(|r| r.mem.clone())
    }

    /// Installs the RPC handler (replacing any previous one).
    pub fn set_rpc_handler(&self, handler: Arc<dyn RpcHandler>) {
        *self.handler.write() = Some(handler);
    }

    /// Marks the requests `quick` picks as ones the handler answers at once — no waiting on
    /// a disk, a lock held across I/O, another node or a timer: a backend may answer them on
    /// the thread that received them instead of handing them to its RPC worker (on `rdma`
    /// that is one thread wake-up less per request, most of what a small RPC costs on an
    /// emulated NIC). Every other request, and every request by default, goes to the worker.
    pub fn set_quick_rpcs(&self, quick: impl Fn(&[u8]) -> bool + Send + Sync + 'static) {
        *self.quick.write() = Some(Arc::new(quick));
    }

    /// Whether `req` is one of the [quick](MemoryNode::set_quick_rpcs) requests.
    pub fn is_quick_rpc(&self, req: &[u8]) -> bool {
        self.quick.read().as_ref().is_some_and(|q| q(req))
    }

    /// Runs `req` through the node's RPC handler, as a backend's server does for a request
    /// that arrived from `peer` (an `Err` travels back as [`crate::Error::Rpc`]).
    pub fn serve_rpc(&self, peer: &Peer, req: &[u8]) -> std::result::Result<Vec<u8>, String> {
        self.rpc(peer, req)
    }

    /// Executes one work request as the node's NIC would — what a backend's server calls for
    /// each request it receives. A READ fills `dst` (exactly `wr.len` bytes); an atomic
    /// returns the old value (persisted first on NVM). Every check (fencing, rkey, access,
    /// bounds, alignment) happens before memory is touched.
    pub fn execute_request(
        &self,
        wr: &crate::batch::WorkRequest<'_>,
        dst: &mut [u8],
    ) -> Result<u64, AccessFault> {
        if matches!(wr.kind, OpKind::Read) && dst.len() != wr.len as usize
            || matches!(wr.kind, OpKind::Write { .. }) && wr.data.len() != wr.len as usize
        {
            return Err(AccessFault::OutOfBounds);
        }
        self.execute(wr.kind, wr.rkey, wr.addr, wr.len, wr.data, dst, None)
    }

    /// Executes a whole batch here, in order — what an in-process backend does with a posted
    /// batch. Stops at the first refused work request with [`crate::Error::RemoteAccess`]
    /// (the requests before it took effect, as on a NIC).
    pub fn execute_batch(&self, batch: crate::Batch) -> crate::Result<crate::BatchResult> {
        let (node, ops, mut bufs) = batch.into_parts();
        let mut olds = vec![0u64; ops.len()];
        for (i, op) in ops.iter().enumerate() {
            let (data, dst) = crate::batch::op_io(op, &mut bufs);
            match self.execute(op.kind, op.rkey, op.addr, op.len, data, dst, None) {
                Ok(old) => olds[i] = old,
                Err(fault) => {
                    return Err(crate::Error::refused(node, i, op, fault));
                }
            }
        }
        let mut r = crate::BatchResult::new(node, ops, bufs);
        r.olds = olds;
        Ok(r)
    }

    pub(crate) fn rpc(&self, peer: &Peer, req: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let h = self.handler.read().clone();
        match h {
            Some(h) => h.call(peer, req),
            None => Err(format!("memory node {} serves no RPC", self.id)),
        }
    }

    fn lookup(&self, rkey: RKey, addr: u64, len: u64, op: OpKind) -> Result<Region, AccessFault> {
        if self.is_fenced() || self.lease_ran_out() {
            return Err(AccessFault::Fenced);
        }
        let regions = self.regions.read();
        let r = regions.get(&rkey).ok_or(AccessFault::UnknownRkey)?;
        let (need, what) = op.needs();
        if !r.desc.access.contains(need) {
            return Err(AccessFault::NoAccess(what));
        }
        if !r.desc.contains(addr, len) {
            return Err(AccessFault::OutOfBounds);
        }
        Ok(r.clone())
    }

    /// The medium of the region `rkey` names (for the latency model).
    pub(crate) fn media_of(&self, rkey: RKey) -> Option<crate::types::Media> {
        self.regions.read().get(&rkey).map(|r| r.desc.media)
    }

    /// The soft NIC: executes one verb. Reads fill `dst` (exactly `len` bytes); writes take
    /// `data` (exactly `len` bytes); atomics return the old value. Every check happens before
    /// memory is touched.
    ///
    /// With `defer`, what an atomic on NVM has to persist is added
    /// to it instead of persisted here — for a server that persists a batch's atomics
    /// together before it answers, as the `rdma` backend's persist request does after a
    /// batch. A durable write still persists at once, after everything deferred before it:
    /// it is durable before the batch's next verb runs ([`crate::Endpoint::durable_in_order`]),
    /// with every verb before it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn execute(
        &self,
        op: OpKind,
        rkey: RKey,
        addr: u64,
        len: u32,
        data: &[u8],
        dst: &mut [u8],
        mut defer: Option<&mut Persists>,
    ) -> Result<u64, AccessFault> {
        let r = self.lookup(rkey, addr, u64::from(len), op)?;
        let off = (addr - r.desc.base) as usize;
        // (An atomic's 8 bytes: now, or with the batch's others.)
        let persist_word = |defer: Option<&mut Persists>, off: usize| match defer {
            Some(d) => {
                d.add(rkey, &r.mem, off, 8);
                Ok(())
            }
            None => r.mem.persist(off, 8),
        };
        match op {
            OpKind::Read => {
                debug_assert_eq!(dst.len(), len as usize);
                r.mem.read(off, dst)?;
                Ok(0)
            }
            OpKind::Write { durable } => {
                debug_assert_eq!(data.len(), len as usize);
                r.mem.write(off, data)?;
                r.mem.wrote(off, data.len());
                if durable {
                    if let Some(d) = defer.as_deref_mut() {
                        std::mem::take(d).run()?;
                    }
                    r.mem.persist(off, data.len())?;
                }
                Ok(0)
            }
            // An atomic on NVM is persisted before it completes (as a read-after-write or an
            // RDMA FLUSH makes it on hardware): an index slot a client swapped, or a bitmap
            // word it freed, survives a power cut once the client has seen the old value.
            OpKind::Cas { expect, new } => {
                if len != 8 {
                    return Err(AccessFault::Misaligned);
                }
                // A failed one too: the value it returns may be another client's swap, not
                // yet persisted, that this client acts on.
                let old = r.mem.cas(off, expect, new)?;
                if old == expect {
                    r.mem.wrote(off, 8);
                }
                if r.desc.media == Media::Nvm {
                    persist_word(defer, off)?;
                }
                Ok(old)
            }
            OpKind::Faa { add } => {
                if len != 8 {
                    return Err(AccessFault::Misaligned);
                }
                let old = r.mem.faa(off, add)?;
                r.mem.wrote(off, 8);
                if r.desc.media == Media::Nvm {
                    persist_word(defer, off)?;
                }
                Ok(old)
            }
        }
    }
}

/// Ranges a batch's verbs left to persist ([`MemoryNode::execute`]).
#[derive(Default)]
pub(crate) struct Persists(Vec<(RKey, RegionMemory, usize, usize)>);

/// Ranges of one region closer than this are persisted as one (a flush is by page).
const PERSIST_MERGE_GAP: usize = 4096;

impl Persists {
    pub(crate) fn add(&mut self, rkey: RKey, mem: &RegionMemory, off: usize, len: usize) {
        // (A run of neighbouring verbs — a split's freeze, a value's chunks — extends the
        // last range instead of adding one.)
        if let Some((k, _, start, l)) = self.0.last_mut() {
            let end = *start + *l;
            if *k == rkey && off >= *start && off <= end + PERSIST_MERGE_GAP {
                *l = (off + len).max(end) - *start;
                return;
            }
        }
        self.0.push((rkey, mem.clone(), off, len));
    }

    /// Whether nothing is left to persist.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Persists every range, neighbours merged: one flush (one `msync` on a pool file) per
    /// run of nearby ranges rather than one per verb — a split's freeze of a subtable is
    /// thousands of CASes on one stretch of memory.
    pub(crate) fn run(mut self) -> Result<(), AccessFault> {
        self.0.sort_by_key(|(k, _, off, _)| (k.0, *off));
        let mut i = 0;
        while i < self.0.len() {
            let (k, mem, start, len) = &self.0[i];
            let mut end = start + len;
            let mut j = i + 1;
            while let Some((k2, _, s2, l2)) = self.0.get(j) {
                if k2 != k || *s2 > end + PERSIST_MERGE_GAP {
                    break;
                }
                end = end.max(s2 + l2);
                j += 1;
            }
            mem.persist(*start, end - start)?;
            i = j;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DramBacking;

    /// NVM that records its persist calls.
    #[derive(Debug)]
    struct Recorded {
        words: Box<[std::sync::atomic::AtomicU64]>,
        persisted: parking_lot::Mutex<Vec<(usize, usize)>>,
    }

    impl crate::Backing for Recorded {
        fn as_ptr(&self) -> *mut u8 {
            self.words.as_ptr() as *mut u8
        }
        fn len(&self) -> usize {
            self.words.len() * 8
        }
        fn media(&self) -> Media {
            Media::Nvm
        }
        fn persist(&self, offset: usize, len: usize) -> std::io::Result<()> {
            self.persisted.lock().push((offset, len));
            Ok(())
        }
    }

    /// A batch's deferred persists: thousands of neighbouring CASes (an index split's freeze)
    /// are one flush, distant ranges their own; a durable write flushes what was deferred
    /// before it, then itself, at once.
    #[test]
    fn deferred_persists_merge_neighbours_into_one_flush() {
        let n = MemoryNode::new(NodeId(1));
        let rec = Arc::new(Recorded {
            words: (0..(1 << 16)).map(|_| Default::default()).collect(),
            persisted: Default::default(),
        });
        let d = n.register(rec.clone(), Access::ALL, None).unwrap();
        let mut p = Persists::default();
        for i in 0..5376u64 {
            let cas = OpKind::Cas {
                expect: 0,
                new: i + 1,
            };
            n.execute(cas, d.rkey, d.base + 8 * i, 8, &[], &mut [], Some(&mut p))
                .unwrap();
        }
        assert!(
            rec.persisted.lock().is_empty(),
            "persisted before the batch's end"
        );
        // A durable write persists at once, after what was deferred before it (durable in
        // order); a plain one not at all.
        let w = OpKind::Write { durable: true };
        n.execute(
            w,
            d.rkey,
            d.base + 50_000,
            8,
            &[7; 8],
            &mut [],
            Some(&mut p),
        )
        .unwrap();
        let plain = OpKind::Write { durable: false };
        n.execute(
            plain,
            d.rkey,
            d.base + 200_000,
            8,
            &[1; 8],
            &mut [],
            Some(&mut p),
        )
        .unwrap();
        assert_eq!(*rec.persisted.lock(), vec![(0, 43_008), (50_000, 8)]);
        // Atomics out of order and a page apart merge; far apart they do not.
        let add = OpKind::Faa { add: 1 };
        for at in [60_000u64, 52_000, 56_000, 400_000] {
            n.execute(add, d.rkey, d.base + at, 8, &[], &mut [], Some(&mut p))
                .unwrap();
        }
        assert_eq!(rec.persisted.lock().len(), 2);
        p.run().unwrap();
        assert_eq!(rec.persisted.lock()[2..], [(52_000, 8_008), (400_000, 8)]);
        // Without deferral every verb persists at once, as before.
        n.execute(
            OpKind::Faa { add: 1 },
            d.rkey,
            d.base,
            8,
            &[],
            &mut [],
            None,
        )
        .unwrap();
        assert_eq!(rec.persisted.lock().last(), Some(&(0, 8)));
    }

    fn node_with_region() -> (MemoryNode, RegionDesc) {
        let n = MemoryNode::new(NodeId(1));
        let b = Arc::new(DramBacking::new(4096));
        let d = n.register(b, Access::ALL, None).unwrap();
        (n, d)
    }

    #[test]
    fn atomics_on_nvm_are_persisted_before_they_complete() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        for media in [Media::Nvm, Media::Dram] {
            let owner = Arc::new(vec![0u64; 64]);
            let ptr = owner.as_ptr() as *mut u8;
            let persists = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let seen = persists.clone();
            let calls = Arc::new(AtomicUsize::new(0));
            let c = calls.clone();
            // SAFETY: `owner` keeps the 512 bytes alive; only the node touches them.
            let b = unsafe {
                crate::FnBacking::new(owner, ptr, 512, media, move |off, len| {
                    c.fetch_add(1, Ordering::SeqCst);
                    seen.lock().push((off, len));
                    Ok(())
                })
            };
            let n = MemoryNode::new(NodeId(3));
            let d = n.register(Arc::new(b), Access::ALL, None).unwrap();
            let cas = OpKind::Cas { expect: 0, new: 7 };
            assert_eq!(
                n.execute(cas, d.rkey, d.base + 64, 8, &[], &mut [], None)
                    .unwrap(),
                0
            );
            // A failed CAS returns a value another client swapped in: persisted too.
            assert_eq!(
                n.execute(cas, d.rkey, d.base + 64, 8, &[], &mut [], None)
                    .unwrap(),
                7
            );
            let faa = OpKind::Faa { add: 1 };
            assert_eq!(
                n.execute(faa, d.rkey, d.base + 128, 8, &[], &mut [], None)
                    .unwrap(),
                0
            );
            if media == Media::Nvm {
                assert_eq!(*persists.lock(), vec![(64, 8), (64, 8), (128, 8)]);
            } else {
                assert_eq!(calls.load(Ordering::SeqCst), 0, "DRAM is never persisted");
            }
        }
    }

    #[test]
    fn watchers_hear_every_change_until_they_leave() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let n = MemoryNode::new(NodeId(0));
        let heard = Arc::new(AtomicUsize::new(0));
        let h = heard.clone();
        n.on_change(move || h.fetch_add(1, Ordering::SeqCst) < 4);
        let r = n
            .register(Arc::new(DramBacking::new(64)), Access::ALL, None)
            .unwrap();
        let r = n.rekey(r.rkey).unwrap();
        n.set_fenced(true);
        n.set_fenced(true); // no change: not told
        assert_eq!(heard.load(Ordering::SeqCst), 3);
        n.set_fenced(false);
        n.deregister(r.rkey).unwrap();
        // The fifth call returned false: the watcher is gone.
        n.set_fenced(true);
        assert_eq!(heard.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn a_fenced_node_refuses_every_verb_until_unfenced() {
        let (n, d) = node_with_region();
        let mut buf = [0u8; 8];
        n.set_fenced(true);
        let w = n.execute(
            OpKind::Write { durable: false },
            d.rkey,
            d.base,
            8,
            &[7; 8],
            &mut [],
            None,
        );
        assert_eq!(w, Err(AccessFault::Fenced));
        let r = n.execute(OpKind::Read, d.rkey, d.base, 8, &[], &mut buf, None);
        assert_eq!(r, Err(AccessFault::Fenced));
        assert_eq!(buf, [0; 8], "a fenced write touched nothing");
        n.set_fenced(false);
        n.execute(
            OpKind::Write { durable: false },
            d.rkey,
            d.base,
            8,
            &[7; 8],
            &mut [],
            None,
        )
        .unwrap();
        n.execute(OpKind::Read, d.rkey, d.base, 8, &[], &mut buf, None)
            .unwrap();
        assert_eq!(buf, [7; 8]);
    }

    #[test]
    fn rekeying_cuts_off_the_old_rkey_and_keeps_the_memory() {
        let (n, d) = node_with_region();
        n.execute(
            OpKind::Write { durable: false },
            d.rkey,
            d.base,
            8,
            &[9; 8],
            &mut [],
            None,
        )
        .unwrap();
        let fresh = n.rekey(d.rkey).unwrap();
        assert_ne!(fresh.rkey, d.rkey);
        assert_eq!((fresh.base, fresh.len), (d.base, d.len));
        let mut buf = [0u8; 8];
        assert_eq!(
            n.execute(OpKind::Read, d.rkey, d.base, 8, &[], &mut buf, None),
            Err(AccessFault::UnknownRkey)
        );
        n.execute(OpKind::Read, fresh.rkey, d.base, 8, &[], &mut buf, None)
            .unwrap();
        assert_eq!(buf, [9; 8]);
        assert!(n.rekey(d.rkey).is_none());
    }
}
