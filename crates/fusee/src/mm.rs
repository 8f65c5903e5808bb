//! The client's memory work that runs off the critical path: fetching blocks, reclaiming
//! freed objects, cleaning up after won writes.

use dmkit_kv_index::Slot;
use dmkit_verbs::Batch;

use crate::alloc::{self, FreeObject, OwnedBlock};
use crate::client::{Inner, tags};
use crate::cluster::ClusterView;
use crate::error::{Error, Result};
use crate::memnode::status;
use crate::object::{self, Addr, Op};
use crate::verifier::slot_addr;
use dmkit_pmem_pool::remote::{
    BlockClient, BlockRequest, ReclaimMark, ReplyError, RequestError, reclaim_async,
};
use dmkit_pmem_pool::slabs::block_image;

impl Inner {
    /// The memory nodes' block services, as this client asks them.
    pub(crate) fn blocks(&self) -> BlockClient<'_> {
        BlockClient::new(&self.ep, tags::BLOCKS)
    }

    /// Fetches a block for `class` (stripe of the next node in turn), mirrors it on the data
    /// replicas, writes its header and zeroes it there, and lists its objects as free.
    ///
    /// `reserve`: the block may come from the blocks memory nodes keep back for DELETEs (a
    /// full cluster still takes deletes, which make room).
    pub(crate) async fn acquire_block(&self, class: usize, reserve: bool) -> Result<()> {
        let mut turn = self.block_lock.lock().await;
        let enough = if reserve {
            2
        } else {
            2.max(self.cfg_prefetch_below())
        };
        if self.free.lock().len(class) >= enough {
            return Ok(());
        }
        let view = self.view();
        let n = view.nodes.len();
        let mut last_err = None;
        for attempt in 0..n {
            let pos = ((*turn as usize) + self.id as usize + attempt) % n;
            let node = view.node_at(pos);
            if !view.is_member(node) {
                // A failed node's stripe waits for it to rejoin.
                continue;
            }
            let req = BlockRequest::AllocStripe {
                owner: self.id,
                stride: n as u16,
                rem: pos as u16,
                min: view.first_data_block(),
                reserve,
            };
            let block = match self.blocks().alloc_async(node, &req).await {
                Ok(b) => b,
                // Out of blocks (or refused otherwise): the next node in turn may have some.
                Err(RequestError::Reply(ReplyError::Refused(r))) if r.status != status::REFUSED => {
                    last_err = Some(Error::OutOfMemory(format!(
                        "memory node {node}: {}",
                        r.message
                    )));
                    continue;
                }
                Err(e @ RequestError::Reply(ReplyError::Malformed(_))) => {
                    return Err(Error::block(node, e));
                }
                Err(e) => {
                    last_err = Some(Error::block(node, e));
                    continue;
                }
            };
            *turn += 1;
            return self.install_block(block, class, reserve).await;
        }
        Err(last_err.unwrap_or_else(|| Error::OutOfMemory("no memory nodes".into())))
    }

    fn cfg_prefetch_below(&self) -> usize {
        self.cfg().prefetch_below
    }

    async fn install_block(&self, block: u64, class: usize, reserve: bool) -> Result<()> {
        // One epoch throughout: if the membership changes meanwhile, the writes below are
        // refused (rotated rkeys) instead of missing a node that rejoined.
        let view = self.view();
        let replicas = view.block_replicas(block);
        for (k, node) in replicas.iter().enumerate().skip(1) {
            let req = BlockRequest::AllocAt {
                owner: self.id,
                block,
                reserve,
            };
            match self.blocks().done_async(*node, &req).await {
                Ok(()) => {}
                Err(e) if e.refusal().is_some_and(|r| r.status == status::TAKEN) => {
                    // The replica's table holds the block for another owner: a node that came
                    // back with an older table (restarted, being refilled), seen in an epoch
                    // that is ending. Give the block back where this client took it, and let
                    // the operation retry in the next membership.
                    for n in &replicas[..k] {
                        let req = BlockRequest::FreeBlock {
                            owner: self.id,
                            block,
                        };
                        let _ = self.blocks().done_async(*n, &req).await;
                    }
                    tracing::debug!(node = %node, block, "mirror taken on a replica; retrying in the next membership");
                    return Err(Error::Refused(*node));
                }
                Err(e) => return Err(Error::block(*node, e)),
            }
        }
        let image = block_image(view.block_size, class, self.id);
        let batches = replicas
            .iter()
            .filter_map(|node| {
                let region = view.region(*node)?;
                let mut b = self.ep.batch(*node);
                b.write_durable(region.at(block * view.block_size), &image);
                Some(b)
            })
            .collect();
        for r in self.ep.execute_many_async(tags::BLOCKS, batches).await {
            r?;
        }
        let node = replicas[0];
        let owned = OwnedBlock { id: block, class };
        let addr = |offset| Addr { node, offset };
        (self.free.lock().slabs).add_block(view.block_size, owned, addr);
        metrics::counter!("dmkit_fusee_blocks_acquired_total").increment(1);
        Ok(())
    }

    /// Reads the free bitmaps of this client's blocks and takes the freed objects back
    /// (pmem-pool's [`reclaim_async`]): marks each reclaimed (so a crash cannot resurrect it),
    /// learns its generation, clears its bit. Three round trips for all blocks. Returns how
    /// many objects came back.
    pub(crate) async fn reclaim(&self) -> Result<usize> {
        let blocks = self.free.lock().slabs.blocks.clone();
        let view = self.view();
        // Each block is read where its bitmap is: its first serving replica (blocks with none
        // wait for their nodes to rejoin).
        let at: Vec<_> = blocks
            .into_iter()
            .filter_map(|b| Some((view.region(*view.block_replicas(b.id).first()?)?, b)))
            .collect();
        if at.is_empty() {
            return Ok(0);
        }
        let mark = ReclaimMark {
            offset: object::FLAGS_OFF as u64,
            byte: object::FLAG_RECLAIMED,
            read_len: object::HEADER_LEN,
        };
        let back = reclaim_async(&self.ep, tags::RECLAIM, view.block_size, &at, mark).await?;
        let mut f = self.free.lock();
        for r in &back {
            let generation = object::decode_header(&r.head).map_or(0, |h| h.generation);
            let addr = Addr {
                node: r.node,
                offset: r.offset,
            };
            f.push(r.class, FreeObject { addr, generation });
        }
        if !back.is_empty() {
            metrics::counter!("dmkit_fusee_reclaimed_objects_total").increment(back.len() as u64);
        }
        Ok(back.len())
    }

    /// Frees `old` (the object a won write replaced): sets its outdated flag for cached
    /// readers (where readers read it) and its bit in its block's bitmap (on the block's
    /// acting primary, where the owner reclaims), in one round trip.
    pub(crate) fn free_object(&self, old: Slot) -> Result<()> {
        let mut batches = Vec::new();
        self.add_free(&self.view(), old, &mut batches)?;
        for r in self.ep.execute_many(tags::CLEANUP, batches) {
            r?;
        }
        Ok(())
    }

    /// [`Self::free_object`]'s verbs, added to `into` (one batch per node).
    fn add_free(&self, view: &ClusterView, old: Slot, into: &mut Vec<Batch>) -> Result<()> {
        let addr = slot_addr(old);
        let (bit_at, mask) = alloc::free_bit(view, addr, old.object_len())?;
        let flag = view
            .acting(addr.node, addr.offset + object::FLAGS_OFF as u64)
            .ok_or(Error::Unavailable(addr.node))?;
        let bit = view
            .block_acting(bit_at.offset)
            .ok_or(Error::Unavailable(addr.node))?;
        let i = self.ep.batch_for(into, flag.node);
        into[i].write(flag, &[object::FLAG_OUTDATED]);
        let i = self.ep.batch_for(into, bit.node);
        into[i].faa(bit, mask);
        Ok(())
    }

    /// [`Self::cleanup`] for several won writes at once: every replaced object marked and
    /// freed in one round trip (one batch per node), then every log entry marked finished in
    /// a second — each entry still after its own free.
    pub(crate) async fn cleanup_many(&self, items: &[CleanupItem]) -> Result<()> {
        let view = self.view();
        let mut frees: Vec<Batch> = Vec::new();
        let mut finishes: Vec<Batch> = Vec::new();
        for it in items {
            if let Some(old) = it.old {
                self.add_free(&view, old, &mut frees)?;
            }
            self.finish_marks(
                &view,
                it.ours,
                it.ours_len,
                it.op == Op::Delete,
                &mut finishes,
            )?;
        }
        if !frees.is_empty() {
            for r in self.ep.execute_many_async(tags::CLEANUP, frees).await {
                r?;
            }
        }
        for r in self.ep.execute_many_async(tags::CLEANUP, finishes).await {
            r?;
        }
        let mut free = self.free.lock();
        for it in items.iter().filter(|it| it.op == Op::Delete) {
            free.push(
                it.class,
                FreeObject {
                    addr: it.ours,
                    generation: it.generation,
                },
            );
        }
        Ok(())
    }

    /// The log entry's finish mark (and, with `reclaim`, a DELETE's temporary object's
    /// reclaimed flag) on every data replica: a failover that lost the one copy would leave
    /// recovery an unfinished entry to redo.
    pub(crate) fn finish_marks(
        &self,
        view: &ClusterView,
        addr: Addr,
        len: usize,
        reclaim: bool,
        into: &mut Vec<Batch>,
    ) -> Result<()> {
        let log = object::log_offset_for_len(len) as u64;
        let before = into.iter().map(Batch::len).sum::<usize>();
        self.mark_replicas(view, addr, log + object::FINISHED_OFF as u64, 1, into);
        if reclaim {
            self.mark_replicas(
                view,
                addr,
                object::FLAGS_OFF as u64,
                object::FLAG_RECLAIMED,
                into,
            );
        }
        if into.iter().map(Batch::len).sum::<usize>() == before {
            return Err(Error::Unavailable(addr.node));
        }
        Ok(())
    }
}

/// One won write's cleanup, for [`Inner::cleanup_many`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CleanupItem {
    pub ours: Addr,
    pub ours_len: usize,
    pub op: Op,
    pub old: Option<Slot>,
    pub class: usize,
    pub generation: u32,
}
