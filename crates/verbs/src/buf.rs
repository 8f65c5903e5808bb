//! Registered local buffers: the memory that verbs read from and write into on the client.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::Result;

/// A local buffer registered with the NIC. Verbs take it by value while in flight and hand it
/// back in the result, so the real RDMA backend can DMA into it without a copy and without
/// aliasing a buffer the program is still using.
///
/// A buffer is either plain heap memory (the software backends; `lkey` 0) or a chunk of memory
/// registered with a NIC and lent by its owner (a slab allocator of the rdma backend), which
/// gets it back when the buffer is dropped.
pub struct MemBuf {
    data: Storage,
    lkey: u32,
}

enum Storage {
    Heap(Vec<u8>),
    Registered(Chunk),
}

/// A chunk of registered memory lent to exactly one [`MemBuf`].
struct Chunk {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    owner: Arc<dyn ChunkOwner>,
}

/// Who lends registered memory to [`MemBuf`]s (an allocator of a backend whose NIC needs
/// registration) and takes each chunk back when its buffer is dropped.
pub trait ChunkOwner: Send + Sync + fmt::Debug {
    /// Takes back the chunk `[ptr, ptr + cap)` that was handed out under `lkey` with
    /// [`MemBuf::from_registered`].
    fn release(&self, ptr: NonNull<u8>, cap: usize, lkey: u32);
}

// SAFETY: a `Chunk` is the only handle to its memory (the owner lent it exclusively, see
// `MemBuf::from_registered`), so moving it to another thread moves the only access; `&MemBuf`
// only gives `&[u8]`, which is safe to share.
unsafe impl Send for MemBuf {}
// SAFETY: as above: shared access is read-only through `Deref`.
unsafe impl Sync for MemBuf {}

impl MemBuf {
    /// A zeroed buffer on the heap: registered memory for the software backends.
    pub fn heap(len: usize) -> Self {
        Self {
            data: Storage::Heap(vec![0; len]),
            lkey: 0,
        }
    }

    /// A heap buffer holding `data`.
    pub fn from_vec(data: Vec<u8>) -> Self {
        Self {
            data: Storage::Heap(data),
            lkey: 0,
        }
    }

    /// A buffer of `len` bytes at `ptr`, registered with the NIC under `lkey`, lent by
    /// `owner`, which gets `(ptr, cap, lkey)` back through [`ChunkOwner::release`] when the buffer
    /// is dropped.
    ///
    /// # Safety
    /// `[ptr, ptr + cap)` must be valid for reads and writes, initialised, not accessed by
    /// anyone else until it is released, and stay valid (and registered) until `owner`
    /// releases it; `len <= cap`.
    pub unsafe fn from_registered(
        ptr: NonNull<u8>,
        len: usize,
        cap: usize,
        lkey: u32,
        owner: Arc<dyn ChunkOwner>,
    ) -> Self {
        debug_assert!(len <= cap);
        Self {
            data: Storage::Registered(Chunk {
                ptr,
                len,
                cap,
                owner,
            }),
            lkey,
        }
    }

    /// Whether this buffer is registered memory lent by a [`ChunkOwner`] (so a NIC can DMA
    /// to and from it directly), rather than heap memory.
    pub fn is_registered(&self) -> bool {
        matches!(self.data, Storage::Registered(_))
    }

    /// The local key the NIC knows this buffer by (0 for the software backends).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Consumes the buffer, returning its bytes.
    ///
    /// Registered memory is copied out (and the chunk goes back to its owner).
    pub fn into_vec(mut self) -> Vec<u8> {
        match &mut self.data {
            Storage::Heap(v) => std::mem::take(v),
            Storage::Registered(_) => self.to_vec(),
        }
    }
}

impl Deref for MemBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.data {
            Storage::Heap(v) => v,
            // SAFETY: the chunk is valid, initialised and exclusively ours for `len` bytes
            // until it is released (the contract of `from_registered`).
            Storage::Registered(c) => unsafe { std::slice::from_raw_parts(c.ptr.as_ptr(), c.len) },
        }
    }
}

impl DerefMut for MemBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.data {
            Storage::Heap(v) => v,
            // SAFETY: as in `deref`; `&mut self` makes this the only reference.
            Storage::Registered(c) => unsafe {
                std::slice::from_raw_parts_mut(c.ptr.as_ptr(), c.len)
            },
        }
    }
}

impl Drop for MemBuf {
    fn drop(&mut self) {
        if let Storage::Registered(c) = &self.data {
            c.owner.release(c.ptr, c.cap, self.lkey);
        }
    }
}

impl fmt::Debug for MemBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBuf")
            .field("len", &self.len())
            .field("lkey", &self.lkey)
            .field("registered", &self.is_registered())
            .finish()
    }
}

/// Where an endpoint gets its registered buffers. A backend whose NIC needs registration
/// (rdma) provides one that carves buffers from registered slabs.
pub trait BufAllocator: Send + Sync + fmt::Debug {
    /// A zeroed registered buffer of exactly `len` bytes.
    fn alloc(&self, len: usize) -> Result<MemBuf>;
}

/// Plain heap memory: what the `sim` and `tcp` backends use.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeapAllocator;

impl BufAllocator for HeapAllocator {
    fn alloc(&self, len: usize) -> Result<MemBuf> {
        Ok(MemBuf::heap(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Debug, Default)]
    struct Lender {
        released: Mutex<Vec<(usize, usize)>>,
    }

    impl ChunkOwner for Lender {
        fn release(&self, ptr: NonNull<u8>, cap: usize, _lkey: u32) {
            self.released.lock().push((ptr.as_ptr() as usize, cap));
        }
    }

    #[test]
    fn registered_buffers_go_back_to_their_owner_once() {
        let mut slab = vec![0u8; 64];
        let ptr = NonNull::new(slab.as_mut_ptr()).unwrap();
        let lender = Arc::new(Lender::default());
        // SAFETY: `slab` outlives the buffer and nothing else touches it meanwhile.
        let mut b = unsafe { MemBuf::from_registered(ptr, 10, 64, 77, lender.clone()) };
        assert!(b.is_registered());
        assert_eq!((b.len(), b.lkey()), (10, 77));
        b.copy_from_slice(b"0123456789");
        assert_eq!(b.clone_into_vec(), b"0123456789");
        assert_eq!(b.into_vec(), b"0123456789");
        assert_eq!(
            lender.released.lock().as_slice(),
            &[(ptr.as_ptr() as usize, 64)]
        );
        assert_eq!(&slab[..3], b"012");
    }

    #[test]
    fn heap_buffers_round_trip() {
        let b = MemBuf::from_vec(vec![1, 2, 3]);
        assert!(!b.is_registered());
        assert_eq!(b.lkey(), 0);
        assert_eq!(b.into_vec(), vec![1, 2, 3]);
    }

    impl MemBuf {
        fn clone_into_vec(&self) -> Vec<u8> {
            self.to_vec()
        }
    }
}
