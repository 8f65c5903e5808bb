//! Gengar's object allocator: size classes inside blocks, an 8-byte header per object slot.
//!
//! A block taken by the allocator serves one size class; its slots are `slot_size` apart and
//! each starts with a header word `allocated:1 | generation:31 | size:32`. Allocation and free
//! are one failure-atomic store of that word. Free bumps the generation, so a client holding a
//! stale `(offset, generation)` sees the mismatch when it reads the header.

use std::collections::BTreeSet;
use std::fmt;

/// Bytes of the header before each object's payload.
pub const OBJECT_HEADER_LEN: usize = 8;
/// The smallest slot (header included).
pub const MIN_SLOT_SIZE: usize = 64;

const ALLOCATED: u64 = 1 << 63;
const GENERATION_MASK: u32 = (1 << 31) - 1;

/// A size class: objects whose payload fits `slot_size - 8` bytes share slots of `slot_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeClass {
    /// Position in [`crate::Pool::size_classes`].
    pub index: usize,
    /// Bytes per slot, header included; a power of two.
    pub slot_size: usize,
}

impl SizeClass {
    /// The largest payload of this class.
    pub fn max_object_size(&self) -> usize {
        self.slot_size - OBJECT_HEADER_LEN
    }

    /// The classes of a pool with blocks of `block_size`: 64, 128, ... up to one slot per block.
    pub fn all(block_size: usize) -> Vec<SizeClass> {
        std::iter::successors(Some(MIN_SLOT_SIZE), |s| s.checked_mul(2))
            .take_while(|s| *s <= block_size)
            .enumerate()
            .map(|(index, slot_size)| SizeClass { index, slot_size })
            .collect()
    }
}

/// An allocated object: where its payload is, how big it is, and which generation it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// Offset of the payload in the data area (the header is the 8 bytes before it).
    pub offset: usize,
    /// Payload bytes asked for.
    pub size: usize,
    /// The slot's generation when allocated; it changes when the object is freed.
    pub generation: u32,
}

/// The header word of an object slot, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectHeader {
    /// Whether the slot holds a live object.
    pub allocated: bool,
    /// The live object's size (0 when free).
    pub size: u32,
    /// Bumped (mod 2^31) every time the slot is freed.
    pub generation: u32,
}

impl ObjectHeader {
    /// Decodes a header word read from the pool (e.g. by a client, over RDMA, from the 8
    /// bytes before an object's payload).
    pub fn from_word(word: u64) -> Self {
        Self::decode(word)
    }

    pub(crate) fn decode(word: u64) -> Self {
        ObjectHeader {
            allocated: word & ALLOCATED != 0,
            size: word as u32,
            generation: (word >> 32) as u32 & GENERATION_MASK,
        }
    }

    pub(crate) fn encode(&self) -> u64 {
        let alloc = if self.allocated { ALLOCATED } else { 0 };
        alloc | (u64::from(self.generation & GENERATION_MASK) << 32) | u64::from(self.size)
    }

    /// The header after this object is freed.
    pub(crate) fn freed(&self) -> Self {
        ObjectHeader {
            allocated: false,
            size: 0,
            generation: self.generation.wrapping_add(1) & GENERATION_MASK,
        }
    }

    /// Whether `obj` still names the live object in this slot.
    pub fn matches(&self, obj: &ObjectRef) -> bool {
        self.allocated && self.generation == obj.generation && self.size as usize == obj.size
    }
}

impl fmt::Display for ObjectHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allocated {
            write!(
                f,
                "live, {} bytes, generation {}",
                self.size, self.generation
            )
        } else {
            write!(f, "free, generation {}", self.generation)
        }
    }
}

/// DRAM state of the allocator, rebuilt from the headers on open.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    /// Per class: data-area offsets of free slot headers (the lowest is handed out first, so
    /// live objects stay packed).
    pub free_slots: Vec<BTreeSet<usize>>,
    /// Blocks held by the allocator.
    pub blocks: usize,
    pub live: usize,
    pub live_slot_bytes: usize,
    pub free_slot_bytes: usize,
}

impl Objects {
    pub fn new(classes: usize) -> Self {
        Objects {
            free_slots: vec![BTreeSet::new(); classes],
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8-byte header word before each object's payload (as stored, little-endian): a
    /// live object, the same slot freed, and the largest size and generation.
    #[test]
    fn object_header_bytes_are_pinned() {
        let live = ObjectHeader {
            allocated: true,
            size: 100,
            generation: 3,
        };
        let max = ObjectHeader {
            allocated: true,
            size: u32::MAX,
            generation: GENERATION_MASK,
        };
        let mut s = String::new();
        for h in [live, live.freed(), max, max.freed()] {
            assert_eq!(ObjectHeader::decode(h.encode()), h);
            s.push_str(&format!(
                "{h}\n{}",
                crate::layout::hex_dump(&h.encode().to_le_bytes())
            ));
        }
        insta::assert_snapshot!(s);
    }

    #[test]
    fn classes_double_from_64_to_the_block_size() {
        let c = SizeClass::all(4096);
        assert_eq!(
            c.iter().map(|c| c.slot_size).collect::<Vec<_>>(),
            [64, 128, 256, 512, 1024, 2048, 4096]
        );
        assert_eq!(c[6].index, 6);
        assert_eq!(c[0].max_object_size(), 56);
    }

    #[test]
    fn header_round_trips_and_free_bumps_the_generation() {
        let h = ObjectHeader {
            allocated: true,
            size: 1000,
            generation: GENERATION_MASK,
        };
        assert_eq!(ObjectHeader::decode(h.encode()), h);
        let f = h.freed();
        assert_eq!(
            f,
            ObjectHeader {
                allocated: false,
                size: 0,
                generation: 0
            }
        );
        assert_eq!(
            ObjectHeader::decode(0),
            ObjectHeader {
                allocated: false,
                size: 0,
                generation: 0
            }
        );
        let obj = ObjectRef {
            offset: 8,
            size: 1000,
            generation: GENERATION_MASK,
        };
        assert!(h.matches(&obj));
        assert!(!f.matches(&obj));
        assert_eq!(f.to_string(), "free, generation 0");
    }
}
