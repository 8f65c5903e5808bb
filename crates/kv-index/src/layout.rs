//! Where everything lives inside a replica space, and how a key hashes to its candidates.
//!
//! A replica space (`[offset, offset + len)` of a registered region) holds:
//!
//! ```text
//! +0     space header, 64 bytes (8 words):
//!          0 magic "DMKRACE1"   1 params (groups log2 | max depth << 8 | replicas << 16 | version << 24)
//!          2 hash seed          3 global depth
//!          4 bump: next free subtable index (FAA on the primary only)
//!          5 split lock (CAS on the primary only; 0 = free)
//!          6 subtable capacity  7 split record (the lock holder's split, for a next holder)
//! +64    directory: 2^max_depth entries of 8 bytes (subtable index | local depth << 32 | valid << 63)
//! +A     subtable area (64-aligned): subtable i at A + i * subtable_bytes
//! ```
//!
//! A subtable is `groups` bucket groups of three 64-byte buckets `[main 0][overflow][main 1]`;
//! the combined bucket of side 0 is `main 0 + overflow` (128 contiguous bytes), of side 1
//! `overflow + main 1`. Every replica has the same layout, so a subtable index names the same
//! place on every replica.

use dmkit_verbs::{RegionDesc, RemoteAddr};

use crate::error::{Error, Result};
use crate::slot::low_bits;

pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"DMKRACE1");
pub(crate) const VERSION: u64 = 1;
pub(crate) const HDR_PARAMS: u64 = 8;
pub(crate) const HDR_SEED: u64 = 16;
pub(crate) const HDR_GLOBAL_DEPTH: u64 = 24;
pub(crate) const HDR_BUMP: u64 = 32;
pub(crate) const HDR_LOCK: u64 = 40;
pub(crate) const HDR_CAPACITY: u64 = 48;
pub(crate) const HDR_SPLIT: u64 = 56;
pub(crate) const DIR_OFFSET: u64 = 64;

pub(crate) const BUCKET_BYTES: u64 = 64;
pub(crate) const SLOTS_PER_BUCKET: usize = 7;
pub(crate) const HEADER_WORD: usize = 7;
pub(crate) const GROUP_BYTES: u64 = 3 * BUCKET_BYTES;
pub(crate) const COMBINED_BYTES: u64 = 2 * BUCKET_BYTES;

const DIR_VALID: u64 = 1 << 63;

/// Where one replica of the index lives: `len` bytes at `offset` inside a registered region
/// (with read, write and atomic access) of one memory node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexReplicaSpace {
    pub region: RegionDesc,
    /// Offset of the space in the region; 64-byte aligned.
    pub offset: u64,
    pub len: u64,
}

impl IndexReplicaSpace {
    /// The `len` bytes at `offset` of `region`.
    pub const fn new(region: RegionDesc, offset: u64, len: u64) -> Self {
        Self {
            region,
            offset,
            len,
        }
    }

    pub(crate) fn at(&self, off: u64) -> RemoteAddr {
        self.region.at(self.offset + off)
    }
}

/// The fixed geometry of a formatted index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub groups_log2: u8,
    pub max_depth: u8,
    pub replicas: u8,
    pub seed: u64,
    pub capacity: u64,
}

impl Layout {
    pub fn params_word(&self) -> u64 {
        u64::from(self.groups_log2)
            | u64::from(self.max_depth) << 8
            | u64::from(self.replicas) << 16
            | VERSION << 24
    }

    pub fn groups(&self) -> u64 {
        1 << self.groups_log2
    }

    pub fn buckets(&self) -> u64 {
        3 * self.groups()
    }

    pub fn subtable_bytes(&self) -> u64 {
        self.groups() * GROUP_BYTES
    }

    pub fn dir_entries(&self) -> u64 {
        1 << self.max_depth
    }

    pub fn area_offset(&self) -> u64 {
        (DIR_OFFSET + 8 * self.dir_entries()).div_ceil(64) * 64
    }

    /// How many subtables a space of `len` bytes holds.
    pub fn capacity_of(&self, len: u64) -> u64 {
        len.saturating_sub(self.area_offset()) / self.subtable_bytes()
    }

    pub fn subtable_off(&self, st: u32) -> u64 {
        self.area_offset() + u64::from(st) * self.subtable_bytes()
    }

    pub fn bucket_off(&self, st: u32, bucket: u64) -> u64 {
        self.subtable_off(st) + bucket * BUCKET_BYTES
    }

    pub fn slot_off(&self, pos: SlotPos) -> u64 {
        self.bucket_off(pos.subtable, pos.bucket) + 8 * u64::from(pos.slot)
    }

    pub fn dir_off(&self, i: u64) -> u64 {
        DIR_OFFSET + 8 * i
    }
}

/// One slot's place: the same on every replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotPos {
    pub subtable: u32,
    /// Bucket index within the subtable (group * 3 + 0..3).
    pub bucket: u64,
    /// Slot within the bucket (0..7).
    pub slot: u8,
}

/// A directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirEntry {
    pub subtable: u32,
    pub local_depth: u8,
}

impl DirEntry {
    pub fn encode(self) -> u64 {
        DIR_VALID | u64::from(self.subtable) | u64::from(self.local_depth) << 32
    }

    pub fn decode(raw: u64) -> Option<DirEntry> {
        if raw & DIR_VALID == 0 || raw & !(DIR_VALID | 0xFF_FFFF_FFFF) != 0 {
            return None;
        }
        Some(DirEntry {
            subtable: raw as u32,
            local_depth: (raw >> 32) as u8,
        })
    }
}

/// A key's hashes: the directory bits, the fingerprint and its two combined buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyHash {
    /// Directory hash: the low bits pick the subtable (extendible hashing).
    pub dir: u64,
    pub fp: u8,
    /// (group, side) of the two candidate combined buckets.
    pub cands: [(u64, u8); 2],
}

const SEED2_XOR: u64 = 0x9E37_79B9_7F4A_7C15;

impl KeyHash {
    pub fn new(key: &[u8], seed: u64, groups_log2: u8) -> KeyHash {
        let h1 = xxhash_rust::xxh64::xxh64(key, seed);
        let h2 = xxhash_rust::xxh64::xxh64(key, seed ^ SEED2_XOR);
        let g1 = low_bits(h1 >> 40, groups_log2);
        let mut g2 = low_bits(h2 >> 40, groups_log2);
        if g2 == g1 && groups_log2 > 0 {
            g2 ^= 1;
        }
        let side1 = (h2 & 1) as u8;
        KeyHash {
            dir: low_bits(h1, 32),
            fp: (h1 >> 32) as u8,
            cands: [(g1, side1), (g2, 1 - side1)],
        }
    }

    /// The directory index of this key at global depth `g`.
    pub fn dir_index(&self, g: u8) -> u64 {
        low_bits(self.dir, g)
    }
}

/// First bucket index of a combined bucket (the side-0 main bucket or the overflow bucket).
pub(crate) fn combined_first_bucket(group: u64, side: u8) -> u64 {
    group * 3 + u64::from(side)
}

/// Validates a space set: 1..=5 replicas on distinct nodes, 64-aligned, inside their regions.
pub(crate) fn check_spaces(spaces: &[IndexReplicaSpace]) -> Result<()> {
    if spaces.is_empty() || spaces.len() > 5 {
        return Err(Error::InvalidConfig(format!(
            "{} replica spaces; the index takes 1 to 5",
            spaces.len()
        )));
    }
    for (i, s) in spaces.iter().enumerate() {
        if s.offset % 64 != 0 {
            return Err(Error::InvalidConfig(format!(
                "replica {i}: offset {:#x} is not 64-byte aligned",
                s.offset
            )));
        }
        if s.offset
            .checked_add(s.len)
            .is_none_or(|end| end > s.region.len)
        {
            return Err(Error::InvalidConfig(format!(
                "replica {i}: space [{:#x}, +{:#x}) is outside its region of {:#x} bytes",
                s.offset, s.len, s.region.len
            )));
        }
        if spaces[..i].iter().any(|o| o.region.node == s.region.node) {
            return Err(Error::InvalidConfig(format!(
                "replicas must live on distinct memory nodes; node {} appears twice",
                s.region.node
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_entry_round_trips() {
        let e = DirEntry {
            subtable: 77,
            local_depth: 9,
        };
        assert_eq!(DirEntry::decode(e.encode()), Some(e));
        assert_eq!(DirEntry::decode(0), None);
        assert_eq!(DirEntry::decode(u64::MAX), None);
    }

    #[test]
    fn candidates_are_distinct_combined_buckets() {
        for k in 0..10_000u64 {
            let h = KeyHash::new(&k.to_le_bytes(), 1, 4);
            assert_ne!(h.cands[0], h.cands[1]);
            assert!(h.cands.iter().all(|(g, s)| *g < 16 && *s < 2));
        }
    }
}
