//! The 8-byte slot and the 8-byte bucket header: the only two words the index keeps in
//! remote memory besides its directory. Both layouts are defined here and nowhere else.
//!
//! Slot (one `u64`, little-endian in memory):
//!
//! | bits  | field       | meaning |
//! |-------|-------------|---------|
//! | 63    | frozen      | set only while a split moves the slot's subtable; never in a [`Slot`] |
//! | 55-62 | fingerprint | 8 bits of the key's hash (filters candidates before a key compare) |
//! | 47-54 | length class| the object's length in 64-byte units (1..=255); 0: the slot is empty |
//! | 39-46 | memory node | the node the KV object lives on (0..=255) |
//! | 0-38  | pointer     | the object's offset in its node's object area, in 64-byte units (32 TiB) |
//!
//! An empty slot is any word whose length class is 0: 0 itself (never used), or the
//! **tombstone** a DELETE leaves — the deleted slot's word with its length class cleared
//! ([`tombstone`]). A DELETE therefore never returns a slot to a word it held before, as long
//! as the deleted object's address was not handed out again: a SNAPSHOT CAS delayed across a
//! whole INSERT–DELETE cycle of the slot expects the word it saw, finds the tombstone, and
//! fails, instead of landing on a slot that only looks like the one it knew (A-B-A).
//!
//! Bucket header (the *last* word of each 64-byte bucket, so that a READ, which observes words
//! in address order, reads a bucket's slots before its header):
//!
//! | bits  | field       | meaning |
//! |-------|-------------|---------|
//! | 56-63 | tag         | `0xA5`: a formatted header (anything else is corruption) |
//! | 48    | splitting   | a split of this subtable is in progress |
//! | 8-39  | prefix      | the low `local depth` bits of the hash of every key in the subtable |
//! | 0-7   | local depth | the subtable's local depth |

use dmkit_verbs::NodeId;

use crate::error::{Error, Result};

const PTR_BITS: u32 = 39;
const PTR_MASK: u64 = (1 << PTR_BITS) - 1;
const NODE_SHIFT: u32 = 39;
const LEN_SHIFT: u32 = 47;
const FP_SHIFT: u32 = 55;
/// The frozen bit: a split holds this slot.
pub(crate) const FROZEN: u64 = 1 << 63;

/// Granularity of object pointers and length classes.
pub const OBJECT_ALIGN: u64 = 64;

/// Where a KV object lives: a memory node, an offset inside that node's object area (the
/// region the KV layer designates; 64-byte aligned) and its length class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjPtr {
    pub node: NodeId,
    /// Byte offset in the node's object area; a multiple of [`OBJECT_ALIGN`], below 32 TiB.
    pub offset: u64,
    /// The object's length in 64-byte units (1..=255).
    pub len_class: u8,
}

impl ObjPtr {
    /// The length class of an object of `len` bytes (rounded up to 64-byte units), if it fits.
    pub fn len_class_of(len: usize) -> Option<u8> {
        u8::try_from((len as u64).div_ceil(OBJECT_ALIGN).max(1)).ok()
    }
}

/// One index slot: a key's fingerprint and a pointer to its KV object. Never empty, never
/// frozen (those are states of the remote word, not values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(u64);

impl Slot {
    /// Encodes a slot. Fails if the pointer does not fit the layout.
    pub fn new(fingerprint: u8, ptr: ObjPtr) -> Result<Slot> {
        if ptr.len_class == 0 {
            return Err(Error::InvalidSlot("length class 0".into()));
        }
        if ptr.offset % OBJECT_ALIGN != 0 {
            return Err(Error::InvalidSlot(format!(
                "object offset {:#x} is not {OBJECT_ALIGN}-byte aligned",
                ptr.offset
            )));
        }
        let units = ptr.offset / OBJECT_ALIGN;
        if units > PTR_MASK {
            return Err(Error::InvalidSlot(format!(
                "object offset {:#x} beyond 32 TiB",
                ptr.offset
            )));
        }
        let node = u8::try_from(ptr.node.0).map_err(|_| {
            Error::InvalidSlot(format!("memory node {} does not fit 8 bits", ptr.node))
        })?;
        Ok(Slot(
            units
                | u64::from(node) << NODE_SHIFT
                | u64::from(ptr.len_class) << LEN_SHIFT
                | u64::from(fingerprint) << FP_SHIFT,
        ))
    }

    /// Decodes a remote word: `None` for an empty slot (0 or a tombstone). The frozen bit is
    /// ignored (a frozen slot still holds its value).
    pub fn from_raw(raw: u64) -> Result<Option<Slot>> {
        let v = raw & !FROZEN;
        if is_empty_word(v) {
            return Ok(None);
        }
        Ok(Some(Slot(v)))
    }

    /// The word as stored in remote memory.
    pub fn raw(self) -> u64 {
        self.0
    }

    pub fn fingerprint(self) -> u8 {
        (self.0 >> FP_SHIFT) as u8
    }

    pub fn len_class(self) -> u8 {
        (self.0 >> LEN_SHIFT) as u8
    }

    pub fn node(self) -> NodeId {
        NodeId(u16::from((self.0 >> NODE_SHIFT) as u8))
    }

    /// The object's byte offset in its node's object area.
    pub fn offset(self) -> u64 {
        (self.0 & PTR_MASK) * OBJECT_ALIGN
    }

    /// The object pointer.
    pub fn ptr(self) -> ObjPtr {
        ObjPtr {
            node: self.node(),
            offset: self.offset(),
            len_class: self.len_class(),
        }
    }

    /// The object's length rounded up to whole 64-byte units.
    pub fn object_len(self) -> usize {
        usize::from(self.len_class()) * OBJECT_ALIGN as usize
    }
}

/// Whether a remote slot word is empty (0 or a tombstone: length class 0). The frozen bit
/// is ignored.
pub fn is_empty_word(raw: u64) -> bool {
    (raw >> LEN_SHIFT) & 0xFF == 0
}

/// The word a DELETE of `replaced` leaves in the slot: `replaced` with its length class
/// (and frozen bit) cleared — empty, and different from every word the slot held while the
/// deleted object's address was in use.
pub fn tombstone(replaced: u64) -> u64 {
    replaced & !FROZEN & !(0xFF << LEN_SHIFT)
}

/// The word a DELETE of `replaced` leaves when its writer names itself with `mark`
/// ([`delete_mark`]): [`tombstone`]`(replaced)` with the mark folded into its fingerprint and
/// pointer bits (the length class stays 0: empty; the node bits stay the deleted object's, so
/// it is never a split marker). Distinct marks give distinct words for one `replaced`, so two
/// DELETEs of one value propose different words and SNAPSHOT picks one of them, as for any
/// two writers — with the plain tombstone both proposed the same word, counted each other's
/// backups as their own, and a failover between them could leave the key deleted with
/// neither reporting it. Mark 0 is the plain tombstone.
///
/// (A marked tombstone's pointer bits are also complemented: folding alone would give the
/// never-used word 0 for a deleter at the deleted object's offset on another node whose id
/// equals the key's fingerprint; complemented, only offsets beyond 16 TiB could.)
pub fn tombstone_by(replaced: u64, mark: u64) -> u64 {
    let mark = mark & ((0xFF << PTR_BITS) | PTR_MASK);
    if mark == 0 {
        return tombstone(replaced);
    }
    tombstone(replaced) ^ ((mark >> PTR_BITS) << FP_SHIFT) ^ (mark & PTR_MASK) ^ PTR_MASK
}

/// A DELETE writer's mark for [`tombstone_by`]: its own object's node and offset (FUSEE's
/// DELETE writes a log object per attempt, so the mark is unique among DELETEs in flight).
pub fn delete_mark(node: NodeId, offset: u64) -> u64 {
    (u64::from(node.0 & 0xFF) << PTR_BITS) | ((offset / OBJECT_ALIGN) & PTR_MASK)
}

/// The empty word a split leaves in slot word `word` of the subtable it splits (the split that
/// allocated subtable `n`): empty (length class 0) and unlike every word the slot held before
/// the split — 0, a real slot, a DELETE's tombstone (no key has fingerprint and node 0xFF
/// with this pointer unless it is one), an older split's marker (another `n`). A SNAPSHOT
/// CAS delayed across the split, expecting the empty word it saw before (0, say), then fails
/// instead of landing on a slot the split rewrote: without it a writer whose backup CASes
/// straddled a whole split won a round whose other backup the split had reset (A-B-A on 0).
pub(crate) fn split_marker(n: u32, word: usize) -> u64 {
    (0xFF << FP_SHIFT)
        | (0xFF << NODE_SHIFT)
        | ((u64::from(n) << 16 | (word as u64 & 0xFFFF)) & PTR_MASK)
}

/// Raw slot word with its frozen bit cleared, or 0.
pub(crate) fn thaw(raw: u64) -> u64 {
    raw & !FROZEN
}

pub(crate) fn is_frozen(raw: u64) -> bool {
    raw & FROZEN != 0
}

const HDR_TAG: u64 = 0xA5 << 56;
const HDR_TAG_MASK: u64 = 0xFF << 56;
const HDR_SPLITTING: u64 = 1 << 48;

/// A decoded bucket header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub local_depth: u8,
    pub prefix: u32,
    pub splitting: bool,
}

impl Header {
    pub fn normal(local_depth: u8, prefix: u32) -> Header {
        Header {
            local_depth,
            prefix,
            splitting: false,
        }
    }

    pub fn encode(self) -> u64 {
        HDR_TAG
            | u64::from(self.local_depth)
            | u64::from(self.prefix) << 8
            | if self.splitting { HDR_SPLITTING } else { 0 }
    }

    pub fn decode(raw: u64) -> Option<Header> {
        if raw & HDR_TAG_MASK != HDR_TAG
            || raw & !(HDR_TAG_MASK | HDR_SPLITTING | 0xFF_FFFF_FFFF) != 0
        {
            return None;
        }
        let h = Header {
            local_depth: raw as u8,
            prefix: (raw >> 8) as u32,
            splitting: raw & HDR_SPLITTING != 0,
        };
        if h.local_depth > 32 || (h.local_depth < 32 && u64::from(h.prefix) >> h.local_depth != 0) {
            return None;
        }
        Some(h)
    }

    /// Whether a key whose directory hash is `h` belongs to this subtable.
    pub fn covers(self, h: u64) -> bool {
        low_bits(h, self.local_depth) == u64::from(self.prefix)
    }
}

/// The low `n` bits of `h`.
pub(crate) fn low_bits(h: u64, n: u8) -> u64 {
    if n >= 64 { h } else { h & ((1u64 << n) - 1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_codec_round_trips() {
        for (fp, node, off, len) in [
            (0u8, 0u16, 0u64, 1u8),
            (0xFF, 255, ((1u64 << 39) - 1) * 64, 255),
            (0x5A, 7, 64 * 12345, 3),
        ] {
            let p = ObjPtr {
                node: NodeId(node),
                offset: off,
                len_class: len,
            };
            let s = Slot::new(fp, p).unwrap();
            assert_eq!(s.fingerprint(), fp);
            assert_eq!(s.ptr(), p);
            assert_ne!(s.raw(), 0, "a valid slot is never the empty word");
            assert!(!is_frozen(s.raw()));
            assert_eq!(Slot::from_raw(s.raw()).unwrap(), Some(s));
            assert_eq!(Slot::from_raw(s.raw() | FROZEN).unwrap(), Some(s));
        }
        assert_eq!(Slot::from_raw(0).unwrap(), None);
        assert_eq!(Slot::from_raw(FROZEN).unwrap(), None);
    }

    #[test]
    fn slot_rejects_what_does_not_fit() {
        let p = |node, offset, len_class| ObjPtr {
            node: NodeId(node),
            offset,
            len_class,
        };
        assert!(Slot::new(1, p(256, 0, 1)).is_err());
        assert!(Slot::new(1, p(0, 1 << 45, 1)).is_err());
        assert!(Slot::new(1, p(0, 65, 1)).is_err());
        assert!(Slot::new(1, p(0, 64, 0)).is_err());
    }

    #[test]
    fn tombstones_are_empty_and_differ_from_what_they_replace() {
        let s = Slot::new(
            0xAB,
            ObjPtr {
                node: NodeId(3),
                offset: 64 * 77,
                len_class: 2,
            },
        )
        .unwrap();
        let t = tombstone(s.raw());
        assert!(is_empty_word(t) && is_empty_word(0) && !is_empty_word(s.raw()));
        assert_ne!(t, 0);
        assert_ne!(t, s.raw());
        // Deterministic (recovery recomputes a crashed DELETE's proposal), frozen bit ignored.
        assert_eq!(tombstone(s.raw() | FROZEN), t);
        assert_eq!(Slot::from_raw(t).unwrap(), None);
        assert_eq!(Slot::from_raw(t | FROZEN).unwrap(), None);
        assert!(is_empty_word(t | FROZEN));
        // Marked: still empty, the plain one for mark 0, one word per mark, never a split
        // marker (the node bits are the deleted object's).
        assert_eq!(tombstone_by(s.raw(), 0), t);
        let mark_at_same_offset_elsewhere = delete_mark(NodeId(0xAB), 64 * 77);
        let zero_fp = Slot::new(
            0,
            ObjPtr {
                node: NodeId(0),
                offset: 64 * 77,
                len_class: 2,
            },
        )
        .unwrap();
        assert_ne!(
            tombstone_by(zero_fp.raw(), delete_mark(NodeId(0), 64 * 77)),
            0
        );
        assert_ne!(tombstone_by(s.raw(), mark_at_same_offset_elsewhere), 0);
        let marks = [
            delete_mark(NodeId(0), 0),
            delete_mark(NodeId(0), 64),
            delete_mark(NodeId(1), 0),
            delete_mark(NodeId(255), 64 * PTR_MASK),
        ];
        let words: std::collections::HashSet<u64> =
            marks.iter().map(|m| tombstone_by(s.raw(), *m)).collect();
        assert_eq!(words.len(), marks.len());
        for m in marks {
            let w = tombstone_by(s.raw(), m);
            assert!(is_empty_word(w) && w & FROZEN == 0);
            assert_eq!((w >> NODE_SHIFT) & 0xFF, 3);
            assert_eq!(tombstone_by(s.raw() | FROZEN, m), w);
        }
    }

    #[test]
    fn header_codec_round_trips_and_rejects_garbage() {
        for h in [
            Header::normal(0, 0),
            Header::normal(5, 0b10110),
            Header {
                local_depth: 32,
                prefix: u32::MAX,
                splitting: true,
            },
        ] {
            assert_eq!(Header::decode(h.encode()), Some(h));
        }
        assert_eq!(Header::decode(0), None);
        assert_eq!(Header::decode(u64::MAX), None);
        // A prefix with bits above the local depth.
        assert_eq!(Header::decode(HDR_TAG | 2 | 0b100 << 8), None);
    }

    #[test]
    fn header_covers_keys_by_low_bits() {
        let h = Header::normal(3, 0b101);
        assert!(h.covers(0b1101));
        assert!(!h.covers(0b1100));
        assert!(Header::normal(0, 0).covers(u64::MAX));
    }
}
