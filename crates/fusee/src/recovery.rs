//! Client crash recovery: a client restarted with its id walks its log and repairs what its
//! crash left half done.
//!
//! 1. **Reconnect** to the memory nodes.
//! 2. **Metadata**: read the cluster superblock, open the index, ask every node which blocks
//!    this client owns (the persistent block tables).
//! 3. **Log walk**: read every owned block's primary copy — header, free bitmap, objects — and
//!    decode each object's embedded log entry; order unfinished entries by their log chain.
//! 4. **Redo**: every unfinished operation of every type and of every task is finished or
//!    rolled back:
//!    - *no commit record* (crashed before it became the last writer, or a loser that had not
//!      taken its object back): if its new value reached some index backups, the round is
//!      resumed on that slot (it may win it, or wait for the winner); otherwise the operation
//!      never touched the index and is redone from the start — it was never acknowledged, so
//!      either way is linearizable;
//!    - *commit record*: it was the last writer; if the primary still holds the old value the
//!      swap is done now, otherwise it had completed;
//!    - then the cleanup it may have missed: free the replaced object (only if its generation
//!      still matches and its free bit is not set — so a reused slot is never freed twice) and
//!      mark the entry finished.
//! 5. **Free lists**: every object slot of the owned blocks that is not live (not pointed to by
//!    the index) is listed free — except objects replaced by *other* clients, which come back
//!    through the free bitmap when their replacer frees them.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use dmkit_kv_index::{ResumeOutcome, Slot};
use dmkit_verbs::{Endpoint, NodeId};

use crate::alloc::{self, BlockGeometry, FreeObject, OwnedBlock};
use crate::client::{Client, ClientConfig, tags};
use crate::error::{Error, Result};
use crate::memnode::status;
use crate::object::{self, Addr, KvObject, Op};
use crate::verifier::{slot_addr, verifier};
use dmkit_pmem_pool::remote::BlockRequest;
use dmkit_pmem_pool::slabs;

/// How long each step of a recovery took (the paper's breakdown) and what it did.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub reconnect: Duration,
    pub metadata: Duration,
    pub log_walk: Duration,
    pub redo: Duration,
    pub free_lists: Duration,
    pub blocks: usize,
    pub objects_scanned: usize,
    /// Unfinished operations found in the log.
    pub unfinished: usize,
    /// Of those, completed by recovery (won, or the swap finished).
    pub completed: usize,
    /// Of those, rolled back (lost, or never in the index).
    pub rolled_back: usize,
    pub live_objects: usize,
    pub free_objects: usize,
}

impl RecoveryReport {
    pub fn total(&self) -> Duration {
        self.reconnect + self.metadata + self.log_walk + self.redo + self.free_lists
    }
}

struct Found {
    addr: Addr,
    class: usize,
    len: usize,
    obj: KvObject,
}

impl Client {
    /// Restarts a crashed client: `connect` re-establishes the connections (timed as
    /// "reconnect"), then the log is walked and repaired as the module docs say.
    pub fn recover(
        connect: impl Fn() -> Result<Endpoint>,
        nodes: &[NodeId],
        cfg: ClientConfig,
    ) -> Result<(Client, RecoveryReport)> {
        // A memory node failing meanwhile (or failed, and not yet failed over): recovery is
        // idempotent, so it runs again in the next membership.
        let deadline = Instant::now() + cfg.failover_wait;
        loop {
            let t = Instant::now();
            let ep = connect()?;
            let reconnect = t.elapsed();
            match Self::recover_on(ep, nodes, cfg.clone(), reconnect) {
                Err(e) if crate::client::needs_membership(&e) && Instant::now() < deadline => {
                    // Routine while the master fails the node over; what failed is the master's WARN.
                    tracing::info!(error = %e, "recovery hit a failed memory node; retrying");
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                r => return r,
            }
        }
    }

    fn recover_on(
        ep: Endpoint,
        nodes: &[NodeId],
        cfg: ClientConfig,
        reconnect: std::time::Duration,
    ) -> Result<(Client, RecoveryReport)> {
        let mut rep = RecoveryReport {
            reconnect,
            ..RecoveryReport::default()
        };

        let t = Instant::now();
        let (client, rx) = Client::open(ep, nodes, cfg)?;
        let inner = &client.inner;
        let view = inner.view().clone();
        let mut owned = Vec::new();
        for node in &view.members {
            let blocks = inner
                .blocks()
                .blocks_of(*node, inner.id)
                .map_err(|e| Error::block(*node, e))?;
            for b in blocks {
                // Each block is listed by all its replicas; take it from its primary.
                if view.block_replicas(b).first() == Some(node) {
                    owned.push(b);
                }
            }
        }
        rep.metadata = t.elapsed();

        // Log walk: every owned block, whole.
        let t = Instant::now();
        let bs = view.block_size;
        let mut by_node: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
        for b in &owned {
            if let Some(n) = view.block_replicas(*b).first() {
                by_node.entry(*n).or_default().push(*b);
            }
        }
        let mut blocks: Vec<(OwnedBlock, Addr, Vec<u8>)> = Vec::new();
        for (node, ids) in &by_node {
            let region = view.region(*node).ok_or(Error::Unavailable(*node))?;
            for chunk in ids.chunks(16) {
                let mut b = inner.ep.batch(*node);
                let idx: Vec<_> = chunk
                    .iter()
                    .map(|id| b.read(region.at(id * bs), bs as usize))
                    .collect();
                let mut res = inner.ep.execute(tags::RECLAIM, b)?;
                for (id, i) in chunk.iter().zip(idx) {
                    let data = res.take_buf(i).map(|b| b.into_vec()).unwrap_or_default();
                    let class = match slabs::decode_block_header(&data) {
                        Ok(Some((class, _))) => class,
                        // Taken but never formatted (crash during acquisition): all free.
                        Ok(None) => usize::MAX,
                        Err(class) => {
                            return Err(Error::Corrupt(format!(
                                "block {id} on node {node} has class {class}"
                            )));
                        }
                    };
                    blocks.push((
                        OwnedBlock { id: *id, class },
                        Addr {
                            node: *node,
                            offset: id * bs,
                        },
                        data,
                    ));
                }
            }
        }
        rep.blocks = blocks.len();
        let mut found: Vec<Found> = Vec::new();
        let mut free_now: Vec<(usize, FreeObject)> = Vec::new();
        let mut bitmaps: HashMap<(NodeId, u64), u64> = HashMap::new();
        for (blk, base, data) in &blocks {
            if blk.class == usize::MAX {
                continue;
            }
            let g = BlockGeometry::new(bs, blk.class);
            for i in 0..g.objects {
                rep.objects_scanned += 1;
                let off = g.object_offset(i) as usize;
                let addr = Addr {
                    node: base.node,
                    offset: base.offset + off as u64,
                };
                let bitmap = &data[alloc::BLOCK_HEADER as usize..];
                let freed_bit = BlockGeometry::is_freed(bitmap, i);
                let bytes = &data[off..off + g.slot as usize];
                let generation = object::decode_header(bytes)
                    .map(|h| h.generation)
                    .unwrap_or(0);
                // The block is read from its first serving replica, but its objects may carry
                // another replica's node in their slot words and commit records (the node
                // that served when they were allocated): take the address under which the
                // commit record checks out.
                let replicas = view.all_block_replicas(addr.offset / bs);
                match decode_as_written(bytes, addr, &replicas) {
                    Some((obj, addr)) if !freed_bit => {
                        let len = object::object_len(obj.key.len(), obj.value.len());
                        found.push(Found {
                            addr,
                            class: blk.class,
                            len,
                            obj,
                        });
                    }
                    _ => {
                        if freed_bit {
                            let (word, bit) = g.bit_of(i);
                            *bitmaps.entry((base.node, base.offset + word)).or_default() |= bit;
                        }
                        free_now.push((blk.class, FreeObject { addr, generation }));
                    }
                }
            }
        }
        rep.log_walk = t.elapsed();

        // Redo, in log-chain order within each class (allocation order).
        let t = Instant::now();
        let mut unfinished: Vec<&Found> = found.iter().filter(|f| !f.obj.log.finished).collect();
        let order = chain_order(&unfinished);
        unfinished.sort_by_key(|f| order.get(&f.addr).copied().unwrap_or(u64::MAX));
        rep.unfinished = unfinished.len();
        let mut taken_back = Vec::new();
        for f in unfinished {
            let op = Op::from_u8(f.obj.log.op).ok_or_else(|| {
                Error::Corrupt(format!(
                    "log entry at {:?} has opcode {}",
                    f.addr, f.obj.log.op
                ))
            })?;
            match inner.redo(f.addr, f.class, f.len, op, &f.obj)? {
                Redone::Completed => rep.completed += 1,
                Redone::RolledBack => {
                    rep.rolled_back += 1;
                    taken_back.push(f.addr);
                    free_now.push((
                        f.class,
                        FreeObject {
                            addr: f.addr,
                            generation: f.obj.generation,
                        },
                    ));
                }
            }
        }
        rep.redo = t.elapsed();

        // Free lists: what is not live. A finished DELETE's temporary object, or an object
        // that never made it into the index, is ours to reuse; a committed object stays
        // whether the index still points to it or not (one another client replaced comes
        // back through its free bit): only the first kind needs an index lookup. (Looking up
        // every object, one after another, made a gateway that had written 63 000 keys take
        // 9 s to restart.) The lookups run 64 at a time.
        let t = Instant::now();
        let taken_back: std::collections::HashSet<Addr> = taken_back.into_iter().collect();
        let candidates: Vec<&Found> = found
            .iter()
            .filter(|f| !taken_back.contains(&f.addr))
            .filter(|f| Op::from_u8(f.obj.log.op) == Some(Op::Delete) || f.obj.log.commit.is_none())
            .collect();
        let mut referenced = Vec::with_capacity(candidates.len());
        for chunk in candidates.chunks(64) {
            let looks = chunk
                .iter()
                .map(|f| Box::pin(inner.is_referenced_async(&f.obj.key, f.addr)))
                .collect();
            for r in dmkit_verbs::block_on(dmkit_verbs::join_all(looks)) {
                referenced.push(r?);
            }
        }
        let unlooked = found.len() - taken_back.len() - candidates.len();
        let mut live = unlooked;
        for (f, referenced) in candidates.into_iter().zip(referenced) {
            if referenced {
                live += 1;
                continue;
            }
            {
                inner.mark_reclaimed(f.addr)?;
                free_now.push((
                    f.class,
                    FreeObject {
                        addr: f.addr,
                        generation: f.obj.generation,
                    },
                ));
            }
        }
        // Clear the free bits of the objects listed now.
        for ((node, at), mask) in bitmaps {
            let at = view.block_acting(at).ok_or(Error::Unavailable(node))?;
            inner.ep.faa(tags::RECLAIM, at, 0u64.wrapping_sub(mask))?;
        }
        {
            let mut fl = inner.free.lock();
            for (blk, _, _) in &blocks {
                if blk.class != usize::MAX {
                    fl.slabs.blocks.push(*blk);
                }
            }
            for (class, o) in free_now {
                fl.push(class, o);
            }
            rep.free_objects = fl.total();
        }
        // Blocks taken but never formatted go back to their nodes.
        for (blk, base, _) in &blocks {
            if blk.class == usize::MAX {
                inner.release_block(blk.id, base.node)?;
            }
        }
        rep.live_objects = live;
        rep.free_lists = t.elapsed();
        client.start_worker(rx);
        metrics::histogram!("dmkit_fusee_recovery_seconds").record(rep.total().as_secs_f64());
        Ok((client, rep))
    }
}

/// Position of each object in its class's log chain (by following `prev` links).
fn chain_order(items: &[&Found]) -> HashMap<Addr, u64> {
    let by_addr: HashMap<u64, &Found> = items.iter().map(|f| (f.addr.pack(), *f)).collect();
    let mut order = HashMap::new();
    for f in items {
        let mut depth = 0u64;
        let mut cur = f.obj.log.prev;
        let mut guard = 0;
        while let Some(p) = by_addr.get(&cur) {
            depth += 1;
            cur = p.obj.log.prev;
            guard += 1;
            if guard > items.len() {
                break;
            }
        }
        order.insert(f.addr, depth);
    }
    order
}

/// Decodes an object read at `addr`'s offset under the node its writer used: the replica of
/// `replicas` under which its commit record checks out (the CRC covers the address), else
/// `addr` as it is. `None` if the bytes are not a whole object.
fn decode_as_written(bytes: &[u8], addr: Addr, replicas: &[NodeId]) -> Option<(KvObject, Addr)> {
    let first = object::decode_checked(bytes, addr)?;
    if first.log.commit.is_some() {
        return Some((first, addr));
    }
    for node in replicas.iter().filter(|n| **n != addr.node) {
        let at = Addr {
            node: *node,
            offset: addr.offset,
        };
        if let Some(o) = object::decode_checked(bytes, at).filter(|o| o.log.commit.is_some()) {
            return Some((o, at));
        }
    }
    Some((first, addr))
}

pub(crate) enum Redone {
    Completed,
    RolledBack,
}

impl crate::client::Inner {
    /// Finishes or rolls back one unfinished operation found in the log.
    fn redo(&self, addr: Addr, class: usize, len: usize, op: Op, obj: &KvObject) -> Result<Redone> {
        let alloc = crate::alloc::Allocation {
            addr,
            replicas: crate::alloc::replicas_of(&self.view(), addr),
            class,
            generation: obj.generation,
            prev: obj.log.prev,
            next: obj.log.next,
            log_offset: object::log_offset_for_len(len) as u64,
        };
        let new_raw = match op {
            Op::Delete => 0,
            _ => self.slot_of(&obj.key, &alloc, len)?.raw(),
        };
        let view = self.view();
        let v = verifier(&view);
        let hooks = self.hooks_for_redo(&alloc, op, &v);
        // The word this entry replaced may be back in the key's slot naming another object:
        // the entry swapped it out before the crash (and was acknowledged), its cleanup freed
        // the object, and its owner reused the address for the same key (same fingerprint
        // and length class: the same word). The object's generation tells: it changed.
        let holds_old = |c: &object::Commit| -> Result<(bool, bool)> {
            let probe = verifier(&view);
            let holds = match self.index().search(&probe, &obj.key)? {
                Some(s) => s.raw() == c.old,
                // Absent: a write that replaced an object's word swapped it (only the
                // round's last writer, the one with the record, swaps that word) and the
                // key was deleted since; one that filled an empty word cannot tell here.
                None => Slot::from_raw(c.old)?.is_none(),
            };
            let reused = holds && c.old != 0 && self.generation_of(c.old)? != c.old_gen;
            Ok((holds, reused))
        };
        // A committed DELETE replaced `c.old`: unless the key still holds exactly that
        // object, the swap happened and the key has moved on (deleted, maybe inserted
        // again). Resuming would delete a later incarnation of the key — an operation
        // nobody asked for (its writer may long have reported this DELETE done).
        let holds = obj.log.commit.map(|c| holds_old(&c)).transpose()?;
        let start = crate::rules::redo_start(op == Op::Delete, holds);
        if start == crate::rules::RedoStart::Superseded {
            // The key moved on past this entry's value: resuming would put the older value
            // back. Whether the value was ever swapped in is unknown, so its object is not
            // reused here: if it was, its replacer frees it (and this client's reclaim takes
            // it back); if it never was, it stays allocated (a rare, bounded leak rather than
            // a second life for an object the index may still name).
            tracing::debug!(
                client = self.id,
                ?addr,
                "recovery: the replaced word is back, naming a reused object; not resuming"
            );
            self.mark_finished(addr, len, false)?;
            return Ok(Redone::Completed);
        }
        let outcome = if start == crate::rules::RedoStart::AlreadyDone {
            ResumeOutcome::AlreadyDone
        } else {
            self.index().resume(&v, &obj.key, new_raw, &hooks)?
        };
        let commit = obj.log.commit;
        // What this operation replaced, and whether its cleanup may already have run.
        let replaced: Option<(u64, Option<u32>)> = match outcome {
            // The swap happened just now: nobody but us can have freed the old object.
            ResumeOutcome::Won { old } => Some((old, None)),
            // It happened before the crash (the commit record precedes every swap): the
            // cleanup may have run, so free only if the old object is unchanged.
            ResumeOutcome::AlreadyDone => {
                commit.map(|c| (c.old, Some(c.old_gen))).or(Some((0, None)))
            }
            // Its value is nowhere: if it is marked outdated it was swapped in and replaced
            // since (its replacer frees it); otherwise it never was (or was retracted).
            ResumeOutcome::NotStarted
                if op != Op::Delete && obj.flags & object::FLAG_OUTDATED != 0 =>
            {
                commit.map(|c| (c.old, Some(c.old_gen)))
            }
            ResumeOutcome::NotStarted | ResumeOutcome::Lost => None,
        };
        match replaced {
            Some((old, check)) => {
                if let Some(s) = Slot::from_raw(old)? {
                    match check {
                        None => self.free_object(s)?,
                        Some(old_gen) => self.free_if_unchanged(s, old_gen)?,
                    }
                }
                self.mark_finished(addr, len, op == Op::Delete)?;
                if op == Op::Delete {
                    Ok(Redone::RolledBack)
                } else {
                    Ok(Redone::Completed)
                }
            }
            None => {
                self.mark_reclaimed(addr)?;
                Ok(Redone::RolledBack)
            }
        }
    }

    /// Frees `old` unless it was freed (bit set) or reused (generation changed, reclaimed)
    /// already: recovery may be redoing a cleanup that had happened.
    fn free_if_unchanged(&self, old: Slot, old_gen: u32) -> Result<()> {
        let addr = slot_addr(old);
        let view = self.view();
        let (bit_at, mask) = alloc::free_bit(&view, addr, old.object_len())?;
        let obj = view
            .acting(addr.node, addr.offset)
            .ok_or(Error::Unavailable(addr.node))?;
        let bit = view
            .block_acting(bit_at.offset)
            .ok_or(Error::Unavailable(addr.node))?;
        let bits = self.ep.read(tags::CLEANUP, bit, 8)?;
        let hdr = self.ep.read(tags::CLEANUP, obj, object::HEADER_LEN)?;
        let word = u64::from_le_bytes(bits[..8].try_into().expect("8 bytes"));
        let h = object::decode_header(&hdr);
        let unchanged =
            h.is_some_and(|h| h.generation == old_gen && h.flags & object::FLAG_RECLAIMED == 0);
        if word & mask == 0 && unchanged {
            self.free_object(old)?;
        }
        Ok(())
    }

    /// The entry's finish mark (and, for a DELETE's temporary object, its reclaimed flag) on
    /// every data replica, as the client's cleanup writes them.
    fn mark_finished(&self, addr: Addr, len: usize, reclaim: bool) -> Result<()> {
        let mut batches = Vec::new();
        self.finish_marks(&self.view(), addr, len, reclaim, &mut batches)?;
        for r in self.ep.execute_many(tags::CLEANUP, batches) {
            r?;
        }
        Ok(())
    }

    /// Whether the index's primary slot for `key` points at the object at `addr`: the same
    /// offset, under any data replica of its block (every copy of a block sits at the same
    /// offset; a slot names the replica that served when the object was allocated).
    pub(crate) fn is_referenced(&self, key: &[u8], addr: Addr) -> Result<bool> {
        dmkit_verbs::block_on(self.is_referenced_async(key, addr))
    }

    /// [`Inner::is_referenced`], awaited (recovery keeps many in flight).
    pub(crate) async fn is_referenced_async(&self, key: &[u8], addr: Addr) -> Result<bool> {
        let view = self.view();
        let v = verifier(&view);
        let Some(s) = self.index().search_async(&v, key).await? else {
            return Ok(false);
        };
        let at = slot_addr(s);
        Ok(at.offset == addr.offset
            && view
                .all_block_replicas(addr.offset / view.block_size.max(1))
                .contains(&at.node))
    }

    fn release_block(&self, block: u64, primary: NodeId) -> Result<()> {
        let _ = primary;
        for node in self.view().block_replicas(block) {
            let req = BlockRequest::FreeBlock {
                owner: self.id,
                block,
            };
            match self.blocks().done(node, &req) {
                // (Not this client's any more: nothing to give back.)
                Err(e) if e.refusal().is_none_or(|r| r.status == status::REFUSED) => {
                    return Err(Error::block(node, e));
                }
                _ => {}
            }
        }
        Ok(())
    }
}
