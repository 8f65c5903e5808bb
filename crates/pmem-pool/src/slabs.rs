//! Client-side slabs: the second level of two-level memory management. A client owns whole
//! blocks (from a memory node's block service, the `remote` module, feature `verbs`), carves
//! each into objects of one size class itself, and keeps the free ones in [`SlabLists`]; any
//! client frees an object with one fetch-and-add on its block's free bitmap ([`free_bit`]),
//! and the owner reclaims freed objects in batches by reading the bitmaps.
//!
//! Block layout (class size `S`, block size `B`):
//!
//! ```text
//! 0    block header: magic u32 | class u8 | pad[3] | owner u64 | pad to 64   (block_header)
//! 64   free bitmap: one bit per object, set (by FAA) when the object is freed
//! D    objects: object i at D + i*S, D = align64(64 + bitmap bytes)
//! ```
//!
//! ```
//! use dmkit_pmem_pool::slabs::{BlockGeometry, SlabLists, class_of, free_bit};
//!
//! let block_size = 64 << 10;
//! let class = class_of(100).unwrap(); // 128-byte objects
//! let g = BlockGeometry::new(block_size, class);
//! // Block 3's objects, listed free (addresses here are pool offsets).
//! let mut free: SlabLists<u64> = SlabLists::new();
//! for i in 0..g.objects {
//!     free.push(class, 3 * block_size + g.object_offset(i), 0);
//! }
//! let (obj, _next) = free.pop(class).unwrap();
//! // Freeing it: one FAA of `bit` on the bitmap word at `word`.
//! let (word, bit) = free_bit(block_size, obj.addr, 100).unwrap();
//! assert_eq!((word, bit), (3 * block_size + 64, 1));
//! ```

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;

/// Object size classes, in bytes (the largest holds objects of up to [`MAX_OBJECT`] bytes).
pub const SIZE_CLASSES: [u64; 9] = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
/// The longest object a slab holds (255 units of 64 bytes: what an index slot can describe).
pub const MAX_OBJECT: usize = 255 * 64;
/// The magic of a slab block's header.
pub const BLOCK_MAGIC: u32 = u32::from_le_bytes(*b"FBK1");
/// Bytes of a slab block's header (before the free bitmap).
pub const BLOCK_HEADER: u64 = 64;

/// The size class of an object of `len` bytes; `None` above [`MAX_OBJECT`].
pub fn class_of(len: usize) -> Option<usize> {
    if len > MAX_OBJECT {
        return None;
    }
    SIZE_CLASSES.iter().position(|c| *c >= len as u64)
}

/// The header a slab block of `class` owned by `owner` starts with.
pub fn block_header(class: usize, owner: u64) -> [u8; BLOCK_HEADER as usize] {
    let mut h = [0u8; BLOCK_HEADER as usize];
    h[0..4].copy_from_slice(&BLOCK_MAGIC.to_le_bytes());
    h[4] = class as u8;
    h[8..16].copy_from_slice(&owner.to_le_bytes());
    h
}

/// The class and owner a slab block's header records ([`block_header`]); `Ok(None)` when
/// `header` is no slab block's (no magic: a block taken but never formatted); the class byte
/// as the error when it names no size class (a corrupt header).
pub fn decode_block_header(header: &[u8]) -> Result<Option<(usize, u64)>, u8> {
    if header.len() < 16 || header[0..4] != BLOCK_MAGIC.to_le_bytes() {
        return Ok(None);
    }
    let class = header[4];
    if usize::from(class) >= SIZE_CLASSES.len() {
        return Err(class);
    }
    let owner = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    Ok(Some((usize::from(class), owner)))
}

/// Where the objects of a class sit in a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockGeometry {
    pub class: usize,
    /// Bytes per object slot (the class size).
    pub slot: u64,
    /// Objects per block.
    pub objects: u64,
    /// Offset of object 0 in the block.
    pub data_start: u64,
}

impl BlockGeometry {
    /// The geometry of `class` in blocks of `block_size` bytes.
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

    /// Offset of object `i` in its block.
    pub fn object_offset(&self, i: u64) -> u64 {
        self.data_start + i * self.slot
    }

    /// Bytes of the block's free bitmap (at [`BLOCK_HEADER`]: one bit per object, whole
    /// 8-byte words).
    pub fn bitmap_len(&self) -> usize {
        (self.objects.div_ceil(64) * 8) as usize
    }

    /// The objects word `w` of the free bitmap marks freed, when the word holds `word`.
    pub fn freed_in_word(&self, w: usize, word: u64) -> impl Iterator<Item = u64> + use<> {
        let objects = self.objects;
        (0..64u64)
            .filter(move |bit| word & (1 << bit) != 0)
            .map(move |bit| w as u64 * 64 + bit)
            .filter(move |i| *i < objects)
    }

    /// The free-bitmap word (its offset in the block) and bit of object `i`.
    pub fn bit_of(&self, i: u64) -> (u64, u64) {
        (BLOCK_HEADER + (i / 64) * 8, 1u64 << (i % 64))
    }

    /// Whether `bitmap` (the free bitmap's bytes) marks object `i` freed.
    pub fn is_freed(bitmap: &[u8], i: u64) -> bool {
        let byte = (i / 8) as usize;
        bitmap.get(byte).is_some_and(|b| b & (1 << (i % 8)) != 0)
    }

    /// Which object starts at `off_in_block`, if one does.
    pub fn index_of(&self, off_in_block: u64) -> Option<u64> {
        let rel = off_in_block.checked_sub(self.data_start)?;
        (rel % self.slot == 0 && rel / self.slot < self.objects).then_some(rel / self.slot)
    }
}

/// The free-bitmap word (its offset, in the same address space as `offset`) and bit that
/// free the object of `len` bytes at `offset`; `None` when no object of that size starts
/// there.
pub fn free_bit(block_size: u64, offset: u64, len: usize) -> Option<(u64, u64)> {
    let g = BlockGeometry::new(block_size, class_of(len)?);
    let base = offset / block_size * block_size;
    let (word, bit) = g.bit_of(g.index_of(offset - base)?);
    Some((base + word, bit))
}

/// A free object: where it is, and the generation it was last used at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FreeSlot<A> {
    pub addr: A,
    pub generation: u32,
}

/// A block the client owns, and its class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedBlock {
    pub id: u64,
    pub class: usize,
}

/// A client's free objects per size class (first in, first out), each listed once, and the
/// blocks it owns. `A` names an object (an address).
#[derive(Debug, Clone)]
pub struct SlabLists<A> {
    classes: Vec<VecDeque<FreeSlot<A>>>,
    listed: HashSet<A>,
    /// The blocks the objects come from.
    pub blocks: Vec<OwnedBlock>,
}

impl<A> Default for SlabLists<A> {
    fn default() -> Self {
        Self {
            classes: (0..SIZE_CLASSES.len()).map(|_| VecDeque::new()).collect(),
            listed: HashSet::new(),
            blocks: Vec::new(),
        }
    }
}

impl<A: Copy + Eq + Hash> SlabLists<A> {
    /// Empty lists.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lists `addr` free in `class` (once: an object listed already is not listed again).
    pub fn push(&mut self, class: usize, addr: A, generation: u32) {
        if self.listed.insert(addr) {
            self.classes[class].push_back(FreeSlot { addr, generation });
        }
    }

    /// The oldest free object of `class`, and the one that will follow it (if any).
    pub fn pop(&mut self, class: usize) -> Option<(FreeSlot<A>, Option<A>)> {
        let q = &mut self.classes[class];
        let o = q.pop_front()?;
        self.listed.remove(&o.addr);
        Some((o, q.front().map(|n| n.addr)))
    }

    /// Whether `addr` is listed free.
    pub fn contains(&self, addr: &A) -> bool {
        self.listed.contains(addr)
    }

    /// Free objects of `class`.
    pub fn len(&self, class: usize) -> usize {
        self.classes[class].len()
    }

    /// Free objects of every class.
    pub fn total(&self) -> usize {
        self.listed.len()
    }

    /// Whether no object is listed.
    pub fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }

    /// Takes on a fresh `block` (of `block_size` bytes): records it and lists each of its
    /// objects free (generation 0), `addr` naming the object at an offset in the pool.
    pub fn add_block(&mut self, block_size: u64, block: OwnedBlock, addr: impl Fn(u64) -> A) {
        let g = BlockGeometry::new(block_size, block.class);
        self.blocks.push(block);
        for i in 0..g.objects {
            let offset = block.id * block_size + g.object_offset(i);
            self.push(block.class, addr(offset), 0);
        }
    }
}

/// A fresh block's whole image: its header ([`block_header`]), an empty free bitmap, zeroed
/// objects.
pub fn block_image(block_size: u64, class: usize, owner: u64) -> Vec<u8> {
    let mut image = vec![0u8; block_size as usize];
    image[..BLOCK_HEADER as usize].copy_from_slice(&block_header(class, owner));
    image
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
                let i = 3.min(g.objects - 1);
                assert_eq!(g.index_of(g.object_offset(i)), Some(i));
                assert_eq!(g.index_of(g.object_offset(i) + 8), None);
            }
        }
        assert_eq!(class_of(0), Some(0));
        assert_eq!(class_of(MAX_OBJECT), Some(SIZE_CLASSES.len() - 1));
        assert_eq!(class_of(MAX_OBJECT + 1), None);
    }

    #[test]
    fn headers_and_free_bitmaps_decode() {
        assert_eq!(decode_block_header(&block_header(3, 42)), Ok(Some((3, 42))));
        assert_eq!(decode_block_header(&[0u8; 64]), Ok(None));
        assert_eq!(decode_block_header(&block_header(3, 42)[..8]), Ok(None));
        let mut bad = block_header(3, 42);
        bad[4] = 200;
        assert_eq!(decode_block_header(&bad), Err(200));
        let g = BlockGeometry::new(64 << 10, 8);
        assert_eq!(g.bitmap_len() as u64 * 8 / 64, g.objects.div_ceil(64));
        // Objects 1 and 65 freed (bits set as FAA on little-endian words sets them).
        let mut bitmap = vec![0u8; g.bitmap_len().max(16)];
        let (w0, w1) = (1u64 << 1, 1u64 << 1);
        bitmap[0..8].copy_from_slice(&w0.to_le_bytes());
        bitmap[8..16].copy_from_slice(&w1.to_le_bytes());
        assert!(BlockGeometry::is_freed(&bitmap, 1) && BlockGeometry::is_freed(&bitmap, 65));
        assert_eq!(g.bit_of(65), (BLOCK_HEADER + 8, 1 << 1));
        assert!(!BlockGeometry::is_freed(&bitmap, 0) && !BlockGeometry::is_freed(&bitmap, 1 << 20));
        let big = BlockGeometry::new(1 << 20, 0);
        assert_eq!(
            big.freed_in_word(1, w1 | 1 << 63).collect::<Vec<_>>(),
            vec![65, 127]
        );
        // Bits past the last object are no objects.
        let last = g.objects - 1;
        let w = (last / 64) as usize;
        assert_eq!(g.freed_in_word(w, u64::MAX).last(), Some(last));
    }

    #[test]
    fn lists_are_fifo_and_list_an_object_once() {
        let mut l = SlabLists::new();
        l.push(1, 10u64, 0);
        l.push(1, 20, 3);
        l.push(1, 10, 9);
        assert_eq!(l.total(), 2);
        let (a, next) = l.pop(1).unwrap();
        assert_eq!((a.addr, a.generation, next), (10, 0, Some(20)));
        assert!(!l.contains(&10));
        assert_eq!(l.pop(1).unwrap().1, None);
        assert!(l.is_empty());
        assert!(free_bit(64 << 10, 5, 64).is_none());
    }

    #[test]
    fn a_fresh_block_lists_every_object_and_its_image_is_a_bare_header() {
        let (bs, class) = (64u64 << 10, class_of(512).unwrap());
        let g = BlockGeometry::new(bs, class);
        let mut l: SlabLists<u64> = SlabLists::new();
        l.add_block(bs, OwnedBlock { id: 5, class }, |off| off);
        assert_eq!((l.len(class), l.blocks.len()), (g.objects as usize, 1));
        assert_eq!(l.pop(class).unwrap().0.addr, 5 * bs + g.data_start);
        let image = block_image(bs, class, 7);
        assert_eq!(image.len() as u64, bs);
        assert_eq!(decode_block_header(&image), Ok(Some((class, 7))));
        assert!(image[BLOCK_HEADER as usize..].iter().all(|b| *b == 0));
    }
}
