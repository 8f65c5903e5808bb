//! Registered local buffers: slabs registered once with the NIC and carved into power-of-two
//! chunks, so posting a `MemBuf` is zero-copy (its lkey travels with it). Requests larger
//! than the biggest class are registered per use.

use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;

use super::ffi::{Mr, Pd};
use super::sys;
use crate::buf::{BufAllocator, ChunkOwner, MemBuf};
use crate::error::{Error, Result};

const MIN_CLASS: usize = 64;
const MAX_CLASS: usize = 1 << 20;
const CLASSES: usize = (MAX_CLASS / MIN_CLASS).trailing_zeros() as usize + 1;
const SLAB: usize = 1 << 20;

/// Anonymous memory registered with the NIC; unregistered, then unmapped, on drop.
pub(crate) struct Slab {
    mr: Option<Mr>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the slab's memory is only reached through chunks lent exclusively (MemBuf) or by
// the NIC; the handle itself is immutable.
unsafe impl Send for Slab {}
// SAFETY: as above.
unsafe impl Sync for Slab {}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slab({} bytes)", self.len)
    }
}

impl Slab {
    /// `len` bytes of zeroed memory registered for local access (and remote ones in `access`).
    pub fn new(pd: &Arc<Pd>, len: usize, access: u32) -> Result<Slab> {
        // SAFETY: a fresh anonymous mapping; checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Registration(format!(
                "cannot map {len} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap never returns NULL on success");
        // SAFETY: the mapping lives until this Slab drops, after the MR (see Drop).
        let mr = unsafe { Mr::register(pd, ptr.as_ptr(), len, access) };
        match mr {
            Ok(mr) => Ok(Slab {
                mr: Some(mr),
                ptr,
                len,
            }),
            Err(e) => {
                // SAFETY: unmapping the mapping made above, unused.
                unsafe { libc::munmap(p, len) };
                Err(e)
            }
        }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn lkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, Mr::lkey)
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // Deregister before unmapping: the NIC must be done with the memory first.
        drop(self.mr.take());
        // SAFETY: the mapping made in `new`, no longer registered nor lent out.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[derive(Debug)]
struct Pool {
    pd: Arc<Pd>,
    free: Vec<Mutex<Vec<(usize, u32)>>>,
    slabs: Mutex<Vec<Slab>>,
    large: Mutex<Vec<Slab>>,
}

impl ChunkOwner for Pool {
    fn release(&self, ptr: NonNull<u8>, cap: usize, lkey: u32) {
        let addr = ptr.as_ptr() as usize;
        if cap > MAX_CLASS {
            self.large.lock().retain(|s| s.ptr() as usize != addr);
            return;
        }
        self.free[class_of(cap)].lock().push((addr, lkey));
    }
}

fn class_of(len: usize) -> usize {
    len.max(MIN_CLASS).next_power_of_two().trailing_zeros() as usize
        - MIN_CLASS.trailing_zeros() as usize
}

/// Hands out registered buffers of one protection domain: give it to
/// [`crate::Endpoint::with_allocator`] so every batch posts without a copy.
#[derive(Debug, Clone)]
pub struct RdmaAllocator {
    pool: Arc<Pool>,
}

impl RdmaAllocator {
    pub(crate) fn new(pd: Arc<Pd>) -> Self {
        Self {
            pool: Arc::new(Pool {
                pd,
                free: (0..CLASSES).map(|_| Mutex::new(Vec::new())).collect(),
                slabs: Mutex::new(Vec::new()),
                large: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Whether `buf` was lent by an allocator of this protection domain (so its lkey is valid
    /// on connections of this device).
    pub(crate) fn same_pd(&self, pd: &Arc<Pd>) -> bool {
        Arc::ptr_eq(&self.pool.pd, pd)
    }

    fn lend(&self, ptr: usize, len: usize, cap: usize, lkey: u32) -> MemBuf {
        let p = NonNull::new(ptr as *mut u8).expect("chunk pointers are never NULL");
        // SAFETY: the chunk is in a live registered slab, was taken off the free list (so it
        // is lent to nobody else) and is zeroed below before use; the pool (its owner) keeps
        // the slab until release.
        unsafe {
            std::ptr::write_bytes(p.as_ptr(), 0, len);
            MemBuf::from_registered(p, len, cap, lkey, self.pool.clone())
        }
    }
}

impl BufAllocator for RdmaAllocator {
    fn alloc(&self, len: usize) -> Result<MemBuf> {
        if len == 0 {
            return Ok(MemBuf::heap(0));
        }
        if len > MAX_CLASS {
            let cap = len.div_ceil(4096) * 4096;
            let slab = Slab::new(
                &self.pool.pd,
                cap,
                sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
            )?;
            let (ptr, lkey) = (slab.ptr() as usize, slab.lkey());
            self.pool.large.lock().push(slab);
            return Ok(self.lend(ptr, len, cap, lkey));
        }
        let c = class_of(len);
        let size = MIN_CLASS << c;
        loop {
            if let Some((ptr, lkey)) = self.pool.free[c].lock().pop() {
                return Ok(self.lend(ptr, len, size, lkey));
            }
            let slab = Slab::new(
                &self.pool.pd,
                SLAB.max(size),
                sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
            )?;
            let (base, lkey) = (slab.ptr() as usize, slab.lkey());
            let n = SLAB.max(size) / size;
            self.pool.slabs.lock().push(slab);
            self.pool.free[c]
                .lock()
                .extend((0..n).map(|i| (base + i * size, lkey)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::class_of;

    #[test]
    fn classes_are_powers_of_two_from_64_bytes() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(64), 0);
        assert_eq!(class_of(65), 1);
        assert_eq!(class_of(1 << 20), super::CLASSES - 1);
    }
}
