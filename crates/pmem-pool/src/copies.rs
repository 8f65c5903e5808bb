//! Copies of one pool's objects in another: a DRAM pool that holds copies of an NVM pool's
//! hot objects (Gengar's servers) asks what a copy would take before it plans one;
//! `verbs::PoolRegion::copy_object_from` (feature `verbs`) makes the copy.

use crate::pool::Pool;

impl Pool {
    /// The bytes a copy of `from`'s object at payload offset `offset` would take in this
    /// pool: the slot of the size class its payload needs here (the allocator gives objects
    /// power-of-two slots, so this is what the copy takes of the pool's free bytes). `None`
    /// when there is no allocated object at `offset`, or no slot here is that large.
    pub fn copy_footprint(&self, from: &Pool, offset: usize) -> Option<u64> {
        let h = from.object_header(offset).ok()?;
        if !h.allocated {
            return None;
        }
        let class = self.size_class_for(h.size as usize).ok()?;
        Some(class.slot_size as u64)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Pool, PoolOptions};

    #[test]
    fn a_copy_takes_its_slot_and_gone_or_too_large_objects_take_none() {
        let opts = || PoolOptions::default().block_size(64 << 10);
        let nvm = Pool::create_dram(4 << 20, opts()).unwrap();
        let dram = Pool::create_dram(1 << 20, PoolOptions::default().block_size(4 << 10)).unwrap();
        let small = nvm.alloc_object(100).unwrap();
        let slot = dram.size_class_for(100).unwrap().slot_size as u64;
        assert_eq!(dram.copy_footprint(&nvm, small.offset), Some(slot));
        assert!(slot >= 100);
        // Larger than any slot of the DRAM pool's 4 KiB blocks.
        let large = nvm.alloc_object(16 << 10).unwrap();
        assert_eq!(dram.copy_footprint(&nvm, large.offset), None);
        assert!(nvm.copy_footprint(&nvm, large.offset).is_some());
        nvm.free_object(small.offset).unwrap();
        assert_eq!(dram.copy_footprint(&nvm, small.offset), None);
        // Not an object's payload at all.
        assert_eq!(dram.copy_footprint(&nvm, usize::MAX / 2), None);
    }
}
