//! A pool's data area as verbs memory (feature `verbs`): what a memory node registers so
//! that clients reach the pool's objects with one-sided verbs ([`verbs_backing`]), and a
//! registered pool whose objects a server hands out ([`PoolRegion`]).

use std::sync::Arc;

use dmkit_verbs::{
    Access, Batch, BatchResult, FnBacking, Media, MemoryNode, OpIdx, RegionDesc, RegionMemory,
    RemoteAddr,
};

use crate::{Error, OBJECT_HEADER_LEN, ObjectHeader, ObjectRef, Pool, Result};

/// The data area of `pool` as a verbs backing: NVM when the pool is persistent (a durable
/// write or an atomic then persists what it changed before it completes), DRAM otherwise.
/// What the NIC writes is reported to the pool's medium ([`Pool::note_data_write`]), so the
/// crash-test medium sees it.
///
/// ```
/// use std::sync::Arc;
/// use dmkit_pmem_pool::{Pool, PoolOptions, verbs::verbs_backing};
/// use dmkit_verbs::{Access, Backing, MemoryNode, NodeId};
///
/// let pool = Arc::new(Pool::create_dram(4 << 20, PoolOptions::default())?);
/// let node = MemoryNode::new(NodeId(0));
/// let region = node.register(Arc::new(verbs_backing(&pool)), Access::ALL, None)?;
/// assert_eq!(region.len as usize, pool.data_len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn verbs_backing(pool: &Arc<Pool>) -> FnBacking {
    let media = if pool.is_persistent() {
        Media::Nvm
    } else {
        Media::Dram
    };
    let persist = pool.clone();
    let recorder = pool.clone();
    // SAFETY: the data area stays mapped while the pool lives, and the backing owns an Arc of
    // the pool; once registered, the area is only accessed through the verbs layer's atomic
    // view (the pool's own metadata code does not touch the data area).
    let backing = unsafe {
        FnBacking::new(
            pool.clone(),
            pool.data_ptr(),
            pool.data_len() / 8 * 8,
            media,
            move |off, len| {
                persist
                    .persist(off, len)
                    .map_err(|e| std::io::Error::other(e.to_string()))
            },
        )
    };
    backing.with_write_hook(move |off, len| recorder.note_data_write(off, len))
}

/// A pool whose data area is registered as a region of a memory node: the region, its memory,
/// and what a server that hands out the pool's objects to clients does with them — objects
/// that come zero-filled (a reused slot's old bytes never show), and copies of objects
/// between two pools (a DRAM copy of an NVM object, say).
///
/// ```
/// use std::sync::Arc;
/// use dmkit_pmem_pool::{Pool, PoolOptions, verbs::PoolRegion};
/// use dmkit_verbs::{MemoryNode, NodeId};
///
/// let node = MemoryNode::new(NodeId(0));
/// let opts = PoolOptions::default().block_size(64 << 10);
/// let nvm = PoolRegion::register(&node, "nvm", Arc::new(Pool::create_dram(4 << 20, opts)?), None)?;
/// let dram = PoolRegion::register(&node, "dram", Arc::new(Pool::create_dram(1 << 20, opts)?), None)?;
///
/// let obj = nvm.alloc_zeroed(100)?;
/// nvm.memory().write(obj.offset, b"hot")?;
/// let copy = dram.copy_object_from(&nvm, obj.offset)?;
/// let mut buf = [0; 3];
/// dram.memory().read(copy.offset, &mut buf)?;
/// assert_eq!(&buf, b"hot");
/// assert_eq!(nvm.pool().live_object(obj.offset, obj.generation).map(|h| h.size), Some(100));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PoolRegion {
    pool: Arc<Pool>,
    region: RegionDesc,
    mem: RegionMemory,
}

impl PoolRegion {
    /// Registers `pool`'s data area on `node` as the region `name` (every access allowed), at
    /// remote base `base` (or one the node picks).
    pub fn register(
        node: &MemoryNode,
        name: &str,
        pool: Arc<Pool>,
        base: Option<u64>,
    ) -> dmkit_verbs::Result<PoolRegion> {
        let backing = Arc::new(verbs_backing(&pool));
        let region = node.register_named(name, backing, Access::ALL, base)?;
        let mem = node.memory(region.rkey).ok_or_else(|| {
            dmkit_verbs::Error::Registration(format!("region {name} vanished once registered"))
        })?;
        Ok(PoolRegion { pool, region, mem })
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The region's descriptor (what clients address).
    pub fn region(&self) -> RegionDesc {
        self.region
    }

    /// The region's memory, as the verbs layer accesses it.
    pub fn memory(&self) -> &RegionMemory {
        &self.mem
    }

    /// Allocates an object of `size` bytes, zero-filled and durable when it returns: a reused
    /// slot holds an old object's bytes, which clients must never see.
    pub fn alloc_zeroed(&self, size: usize) -> Result<ObjectRef> {
        let o = self.pool.alloc_object(size)?;
        let zeroed = self
            .write(o.offset, &vec![0u8; size])
            .and_then(|()| self.pool.persist(o.offset, size));
        if let Err(e) = zeroed {
            let _ = self.pool.free_object(o.offset);
            return Err(e);
        }
        Ok(o)
    }

    /// Copies the live object whose payload is at `offset` in `from` into a new object of
    /// this pool (not persisted: for a volatile copy). On failure nothing is left allocated.
    pub fn copy_object_from(&self, from: &PoolRegion, offset: usize) -> Result<ObjectRef> {
        let h = from.pool.object_header(offset)?;
        if !h.allocated {
            return Err(Error::ObjectNotAllocated {
                offset,
                generation: h.generation,
            });
        }
        let size = h.size as usize;
        let slot = self.pool.alloc_object(size)?;
        let mut buf = vec![0u8; size];
        let copied = from
            .read(offset, &mut buf)
            .and_then(|()| self.write(slot.offset, &buf));
        if let Err(e) = copied {
            let _ = self.pool.free_object(slot.offset);
            return Err(e);
        }
        Ok(slot)
    }

    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let len = buf.len();
        self.mem
            .read(offset, buf)
            .map_err(|_| self.out_of_bounds(offset, len))
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.mem
            .write(offset, data)
            .map_err(|_| self.out_of_bounds(offset, data.len()))
    }

    fn out_of_bounds(&self, offset: usize, len: usize) -> Error {
        Error::OutOfBounds {
            offset,
            len,
            data_len: self.pool.data_len(),
        }
    }
}

/// A one-sided read of an object of the pool's allocator (feature `verbs`): the object's
/// header word before and after the bytes asked for, in one batch, so that the reader can
/// tell whether the slot held the object it means (allocated, at its generation) all along —
/// a freed or re-allocated slot's bytes are never taken for the object's, even when the slot
/// is freed and handed out again (zero-filled) while the bytes are read. (With the header
/// read only before the bytes, a reader could return a reused slot's zeros: 1 in 40 runs of
/// Gengar's churn test under heavy load.)
#[derive(Debug, Clone, Copy)]
pub struct ObjectRead {
    header: OpIdx,
    data: OpIdx,
    header_after: OpIdx,
}

impl ObjectRead {
    /// Adds to `batch` the READs of `len` bytes at `at` inside the object whose payload is
    /// at `payload` (remote), with its header word before and after them: the verbs of a
    /// batch run in order, so a slot freed, zeroed or reused while the bytes were read shows
    /// in one of the two words (a free changes the header, whichever it does first).
    pub fn post(batch: &mut Batch, payload: RemoteAddr, at: usize, len: usize) -> Self {
        let header_at = RemoteAddr {
            addr: payload.addr - OBJECT_HEADER_LEN as u64,
            ..payload
        };
        ObjectRead {
            header: batch.read(header_at, OBJECT_HEADER_LEN),
            data: batch.read(payload.add(at as u64), len),
            header_after: batch.read(header_at, OBJECT_HEADER_LEN),
        }
    }

    /// The object's header as the batch read it (before the bytes).
    pub fn header(&self, done: &BatchResult) -> ObjectHeader {
        Self::word(done, self.header)
    }

    fn word(done: &BatchResult, at: OpIdx) -> ObjectHeader {
        let word: [u8; 8] = done.read(at).try_into().unwrap_or([0; 8]);
        ObjectHeader::from_word(u64::from_le_bytes(word))
    }

    /// The bytes read, if the slot held a live object of `generation` from before they were
    /// read until after.
    pub fn data<'a>(&self, done: &'a BatchResult, generation: u32) -> Option<&'a [u8]> {
        let live = |h: ObjectHeader| h.allocated && h.generation == generation;
        (live(self.header(done)) && live(Self::word(done, self.header_after)))
            .then(|| done.read(self.data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PoolOptions;
    use dmkit_verbs::NodeId;

    #[test]
    fn reused_slots_come_zeroed_and_failed_copies_leave_nothing() {
        let node = MemoryNode::new(NodeId(0));
        let opts = PoolOptions::default().block_size(64 << 10);
        let pool = |size| Arc::new(Pool::create_dram(size, opts).unwrap());
        let nvm = PoolRegion::register(&node, "nvm", pool(4 << 20), None).unwrap();
        let dram = PoolRegion::register(&node, "dram", pool(1 << 20), None).unwrap();
        let a = nvm.alloc_zeroed(100).unwrap();
        nvm.memory().write(a.offset, &[7; 100]).unwrap();
        nvm.pool().free_object(a.offset).unwrap();
        assert!(nvm.pool().live_object(a.offset, a.generation).is_none());
        let b = nvm.alloc_zeroed(100).unwrap();
        assert_eq!(b.offset, a.offset, "the slot is reused");
        let mut buf = [1; 100];
        nvm.memory().read(b.offset, &mut buf).unwrap();
        assert_eq!(buf, [0; 100]);
        // A freed object is not copied, and no DRAM slot stays taken.
        let live = dram.pool().stats().live_objects;
        assert!(dram.copy_object_from(&nvm, a.offset + 128).is_err());
        nvm.pool().free_object(b.offset).unwrap();
        assert!(dram.copy_object_from(&nvm, b.offset).is_err());
        assert_eq!(dram.pool().stats().live_objects, live);
    }

    #[test]
    fn a_read_tells_a_live_object_from_a_reused_slot() {
        let cluster = dmkit_verbs::sim::SimCluster::new(dmkit_verbs::sim::SimConfig::default());
        let node = Arc::new(MemoryNode::new(NodeId(0)));
        let opts = PoolOptions::default().block_size(64 << 10);
        let pool = Arc::new(Pool::create_dram(1 << 20, opts).unwrap());
        let nvm = PoolRegion::register(&node, "nvm", pool, None).unwrap();
        cluster.add_node(node);
        let ep = cluster.endpoint(1).unwrap();
        let a = nvm.alloc_zeroed(16).unwrap();
        nvm.memory().write(a.offset, b"0123456789abcdef").unwrap();
        let read = |generation| {
            let mut b = ep.batch(NodeId(0));
            let r = ObjectRead::post(&mut b, nvm.region().at(a.offset as u64), 4, 4);
            let done = ep.execute("t", b).unwrap();
            r.data(&done, generation).map(<[u8]>::to_vec)
        };
        assert_eq!(read(a.generation).as_deref(), Some(&b"4567"[..]));
        nvm.pool().free_object(a.offset).unwrap();
        let b = nvm.alloc_zeroed(16).unwrap();
        assert_ne!(b.generation, a.generation);
        assert_eq!(read(a.generation), None);
    }
}
