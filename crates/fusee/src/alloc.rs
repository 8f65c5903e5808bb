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

use std::collections::{HashSet, VecDeque};

use dmkit_verbs::NodeId;

use crate::cluster::ClusterView;
use crate::error::{Error, Result};
use crate::object::Addr;

/// Object size classes, in bytes (the largest holds objects of up to 16320 bytes: index slots
/// describe lengths in 64-byte units up to 255).
pub const SIZE_CLASSES: [u64; 9] = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
/// The longest object (header, key, value and log entry).
pub const MAX_OBJECT: usize = 255 * 64;
pub(crate) const BLOCK_MAGIC: u32 = u32::from_le_bytes(*b"FBK1");
pub(crate) const BLOCK_HEADER: u64 = 64;

/// The size class index for an object of `len` bytes.
pub fn class_of(len: usize) -> Result<usize> {
    if len > MAX_OBJECT {
        return Err(Error::ObjectTooLarge(len, MAX_OBJECT));
    }
    Ok(SIZE_CLASSES
        .iter()
        .position(|c| *c >= len as u64)
        .expect("MAX_OBJECT fits the largest class"))
}

/// Where the objects of a class sit in a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockGeometry {
    pub class: usize,
    pub slot: u64,
    pub objects: u64,
    pub data_start: u64,
}

impl BlockGeometry {
    pub fn new(block_size: u64, class: usize) -> Self {
        let slot = SIZE_CLASSES[class];
        let mut n = (block_size - BLOCK_HEADER) / slot;
        loop {
            let start = (BLOCK_HEADER + n.div_ceil(64) * 8).div_ceil(64) * 64;
            if start + n * slot <= block_size {
                return Self {
                    class,
                    slot,
                    objects: n,
                    data_start: start,
                };
            }
            n -= 1;
        }
    }

    /// Offset (in the block) of object `i`.
    pub fn object_offset(&self, i: u64) -> u64 {
        self.data_start + i * self.slot
    }

    /// The object index of a block offset, if it is the start of an object.
    pub fn index_of(&self, off_in_block: u64) -> Option<u64> {
        let rel = off_in_block.checked_sub(self.data_start)?;
        (rel % self.slot == 0 && rel / self.slot < self.objects).then_some(rel / self.slot)
    }
}

/// Where the free bit of the object at `addr` (of `len` bytes) is: (bitmap word address on
/// the primary, bit mask).
pub fn free_bit(view: &ClusterView, addr: Addr, len: usize) -> Result<(Addr, u64)> {
    let class = class_of(len)?;
    let g = BlockGeometry::new(view.block_size, class);
    let block = addr.offset / view.block_size;
    let base = block * view.block_size;
    let i = g
        .index_of(addr.offset - base)
        .ok_or_else(|| Error::Corrupt(format!("{addr:?} is not an object of {len} bytes")))?;
    Ok((
        Addr {
            node: addr.node,
            offset: base + BLOCK_HEADER + (i / 64) * 8,
        },
        1u64 << (i % 64),
    ))
}

/// A free object this client may allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeObject {
    /// The primary copy.
    pub addr: Addr,
    /// The generation of the slot's last allocation (the next one gets `generation + 1`).
    pub generation: u32,
}

/// One allocation: the object, its replicas, its log-chain neighbours.
#[derive(Debug, Clone)]
pub struct Allocation {
    pub addr: Addr,
    pub replicas: Vec<Addr>,
    pub class: usize,
    pub generation: u32,
    /// The previous object of this class (packed), for the log chain.
    pub prev: u64,
    /// The object that will be allocated next in this class (packed), pre-positioned.
    pub next: u64,
    /// Where the log entry starts in the object (set once its length is known).
    pub log_offset: u64,
}

/// A block this client owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedBlock {
    pub id: u64,
    pub class: usize,
}

#[derive(Debug, Default)]
pub(crate) struct ClassState {
    pub free: VecDeque<FreeObject>,
    pub last: u64,
}

/// The local free lists (the fine-grained half of memory management).
#[derive(Debug)]
pub struct FreeLists {
    pub(crate) classes: Vec<ClassState>,
    /// Every object currently on a free list, so a late duplicate (a reclaim racing a
    /// recovery) is never listed twice.
    pub(crate) listed: HashSet<Addr>,
    pub(crate) blocks: Vec<OwnedBlock>,
}

impl Default for FreeLists {
    fn default() -> Self {
        Self {
            classes: (0..SIZE_CLASSES.len())
                .map(|_| ClassState::default())
                .collect(),
            listed: HashSet::new(),
            blocks: Vec::new(),
        }
    }
}

impl FreeLists {
    pub fn push(&mut self, class: usize, o: FreeObject) {
        if self.listed.insert(o.addr) {
            self.classes[class].free.push_back(o);
        }
    }

    pub fn len(&self, class: usize) -> usize {
        self.classes[class].free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }

    /// Takes the head of `class`'s list; the next head is the pre-positioned `next` pointer.
    pub fn pop(&mut self, view: &ClusterView, class: usize) -> Option<Allocation> {
        let st = &mut self.classes[class];
        let o = st.free.pop_front()?;
        self.listed.remove(&o.addr);
        let next = st.free.front().map(|n| n.addr.pack()).unwrap_or(0);
        let prev = std::mem::replace(&mut st.last, o.addr.pack());
        Some(Allocation {
            addr: o.addr,
            replicas: replicas_of(view, o.addr),
            class,
            generation: o.generation.wrapping_add(1).max(1),
            prev,
            next,
            log_offset: 0,
        })
    }

    /// Total free objects listed.
    pub fn total(&self) -> usize {
        self.listed.len()
    }
}

/// Every copy of the object whose primary is `addr` (same block id and offset on each data
/// replica of the block).
pub fn replicas_of(view: &ClusterView, addr: Addr) -> Vec<Addr> {
    view.block_replicas(addr.offset / view.block_size)
        .into_iter()
        .map(|node: NodeId| Addr {
            node,
            offset: addr.offset,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fits_header_bitmap_and_objects_in_the_block() {
        for bs in [64u64 << 10, 1 << 20] {
            for c in 0..SIZE_CLASSES.len() {
                let g = BlockGeometry::new(bs, c);
                assert!(g.objects >= 1);
                assert!(g.data_start >= BLOCK_HEADER + g.objects.div_ceil(64) * 8);
                assert_eq!(g.data_start % 64, 0);
                assert!(g.object_offset(g.objects - 1) + g.slot <= bs);
                assert_eq!(
                    g.index_of(g.object_offset(3.min(g.objects - 1))),
                    Some(3.min(g.objects - 1))
                );
                assert_eq!(g.index_of(g.data_start + 1), None);
            }
        }
    }

    #[test]
    fn classes_are_the_smallest_that_fit() {
        assert_eq!(class_of(1).unwrap(), 0);
        assert_eq!(class_of(64).unwrap(), 0);
        assert_eq!(class_of(65).unwrap(), 1);
        assert_eq!(class_of(16320).unwrap(), 8);
        assert!(class_of(16321).is_err());
    }
}
