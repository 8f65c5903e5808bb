//! The block allocation table: one owner per coarse block (FUSEE's memory nodes hand blocks to
//! client ids; Gengar's object allocator takes blocks for its size classes).
//!
//! On media each block has one 8-byte word: 0 when free, `owner + 1` when allocated, so a
//! zero-filled table is an empty one and every change is a single failure-atomic store.

use std::collections::BTreeSet;
use std::fmt;

/// A block of the pool's data area, numbered from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u64);

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The owner id under which the object allocator holds its blocks; user owners must be below it.
pub const OBJECT_OWNER: u64 = u64::MAX - 1;

/// The largest owner id a caller may use.
pub const MAX_OWNER: u64 = u64::MAX - 2;

/// Table word for an owner.
pub(crate) fn encode_owner(owner: u64) -> u64 {
    debug_assert!(owner != u64::MAX);
    owner + 1
}

/// Owner for a table word; `None` when free.
pub(crate) fn decode_entry(entry: u64) -> Option<u64> {
    entry.checked_sub(1)
}

/// The DRAM shadow of the table, rebuilt from media on open.
#[derive(Debug)]
pub(crate) struct BlockTable {
    entries: Vec<u64>,
    free: BTreeSet<u64>,
}

impl BlockTable {
    pub fn from_entries(entries: Vec<u64>) -> Self {
        let free = (0..entries.len() as u64)
            .filter(|b| entries[*b as usize] == 0)
            .collect();
        BlockTable { entries, free }
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// The lowest free blocks, without taking them.
    /// The lowest free block satisfying `pick`.
    pub fn first_free_where(&self, pick: impl Fn(u64) -> bool) -> Option<u64> {
        self.free.iter().copied().find(|b| pick(*b))
    }

    pub fn peek_free(&self, n: usize) -> Vec<u64> {
        self.free.iter().take(n).copied().collect()
    }

    pub fn owner(&self, block: u64) -> Option<u64> {
        self.entries
            .get(block as usize)
            .and_then(|e| decode_entry(*e))
    }

    /// Records (after it is durable) that `block` now has table word `entry`.
    pub fn set(&mut self, block: u64, entry: u64) {
        self.entries[block as usize] = entry;
        if entry == 0 {
            self.free.insert(block);
        } else {
            self.free.remove(&block);
        }
    }

    pub fn owned_by(&self, owner: u64) -> Vec<BlockId> {
        let entry = encode_owner(owner);
        (0..self.entries.len() as u64)
            .filter(|b| self.entries[*b as usize] == entry)
            .map(BlockId)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_free_and_every_owner_round_trips() {
        assert_eq!(decode_entry(0), None);
        for owner in [0, 1, 42, MAX_OWNER, OBJECT_OWNER] {
            assert_eq!(decode_entry(encode_owner(owner)), Some(owner));
        }
    }

    #[test]
    fn shadow_tracks_free_blocks_and_owners() {
        let mut t = BlockTable::from_entries(vec![0, encode_owner(7), 0, 0]);
        assert_eq!(t.free_count(), 3);
        assert_eq!(t.peek_free(2), vec![0, 2]);
        t.set(0, encode_owner(7));
        assert_eq!(t.owned_by(7), vec![BlockId(0), BlockId(1)]);
        t.set(1, 0);
        assert_eq!(t.owner(1), None);
        assert_eq!(t.owner(99), None);
        assert_eq!(t.free_count(), 3);
        assert_eq!(BlockId(3).to_string(), "#3");
    }
}
