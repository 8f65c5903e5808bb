//! Two-level memory management, the client's half: coarse blocks come from the memory nodes
//! (one RPC per block, fetched ahead of need by the client's background task), objects are carved from
//! them locally by size class, any client frees an object with one FAA on its block's free
//! bitmap, and the owner reclaims freed objects in batches.
//!
//! Data block layout (class size `S`, block size `B`):
//!
//! ```text
//! 0    block header: magic u32 | class u8 | pad[3] | owner u64 | pad to 64
//! 64   free bitmap: one bit per object, set (by FAA) when the object is freed
//! D    objects: object i at D + i*S, D = align64(64 + bitmap bytes)
//! ```
//!
//! A data block is mirrored at the same block id on every data replica (see
//! [`crate::memnode`]); the bitmap is kept on the primary.

use dmkit_verbs::NodeId;

use dmkit_pmem_pool::slabs::SlabLists;
pub use dmkit_pmem_pool::slabs::{
    BLOCK_HEADER, BLOCK_MAGIC, BlockGeometry, MAX_OBJECT, OwnedBlock, SIZE_CLASSES,
};

use crate::cluster::ClusterView;
use crate::error::{Error, Result};
use crate::object::Addr;

/// The size class index for an object of `len` bytes.
pub fn class_of(len: usize) -> Result<usize> {
    dmkit_pmem_pool::slabs::class_of(len).ok_or(Error::ObjectTooLarge(len, MAX_OBJECT))
}

/// The free-bitmap word and bit that free the object of `len` bytes at `addr`.
pub fn free_bit(view: &ClusterView, addr: Addr, len: usize) -> Result<(Addr, u64)> {
    class_of(len)?;
    let (word, bit) = dmkit_pmem_pool::slabs::free_bit(view.block_size, addr.offset, len)
        .ok_or_else(|| Error::Corrupt(format!("{addr:?} is not an object of {len} bytes")))?;
    Ok((
        Addr {
            node: addr.node,
            offset: word,
        },
        bit,
    ))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeObject {
    pub addr: Addr,
    pub generation: u32,
}

#[derive(Debug, Clone)]
pub struct Allocation {
    pub addr: Addr,
    pub replicas: crate::cluster::Replicas<Addr>,
    pub class: usize,
    pub generation: u32,
    pub prev: u64,
    pub next: u64,
    pub log_offset: u64,
}

/// The client's free objects (pmem-pool's slabs) and, per class, the last object handed out:
/// an allocation's log entry links the previous and the next one of its class.
#[derive(Debug)]
pub struct FreeLists {
    pub(crate) slabs: SlabLists<Addr>,
    last: [u64; SIZE_CLASSES.len()],
}

impl Default for FreeLists {
    fn default() -> Self {
        Self {
            slabs: SlabLists::new(),
            last: [0; SIZE_CLASSES.len()],
        }
    }
}

impl FreeLists {
    pub fn push(&mut self, class: usize, o: FreeObject) {
        self.slabs.push(class, o.addr, o.generation);
    }

    pub fn len(&self, class: usize) -> usize {
        self.slabs.len(class)
    }

    pub fn is_empty(&self) -> bool {
        self.slabs.is_empty()
    }

    /// Takes the head of `class`'s list; the next head is the pre-positioned `next` pointer.
    pub fn pop(&mut self, view: &ClusterView, class: usize) -> Option<Allocation> {
        let (o, next) = self.slabs.pop(class)?;
        let prev = std::mem::replace(&mut self.last[class], o.addr.pack());
        Some(Allocation {
            addr: o.addr,
            replicas: replicas_of(view, o.addr),
            class,
            generation: o.generation.wrapping_add(1).max(1),
            prev,
            next: next.map(|n| n.pack()).unwrap_or(0),
            log_offset: 0,
        })
    }

    /// Total free objects listed.
    pub fn total(&self) -> usize {
        self.slabs.total()
    }
}

/// Every copy of the object whose primary is `addr` (same block id and offset on each data
/// replica of the block).
pub fn replicas_of(view: &ClusterView, addr: Addr) -> crate::cluster::Replicas<Addr> {
    view.block_replicas(addr.offset / view.block_size)
        .into_iter()
        .map(|node: NodeId| Addr {
            node,
            offset: addr.offset,
        })
        .collect()
}
