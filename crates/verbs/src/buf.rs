//! Registered local buffers: the memory that verbs read from and write into on the client.

use std::fmt;
use std::ops::{Deref, DerefMut};

use crate::error::Result;

/// A local buffer registered with the NIC. Verbs take it by value while in flight and hand it
/// back in the result, so the real RDMA backend can DMA into it without a copy and without
/// aliasing a buffer the program is still using.
pub struct MemBuf {
    data: Vec<u8>,
    lkey: u32,
}

impl MemBuf {
    /// A zeroed buffer on the heap: registered memory for the software backends.
    pub fn heap(len: usize) -> Self {
        Self {
            data: vec![0; len],
            lkey: 0,
        }
    }

    /// A heap buffer holding `data`.
    pub fn from_vec(data: Vec<u8>) -> Self {
        Self { data, lkey: 0 }
    }

    /// The local key the NIC knows this buffer by (0 for the software backends).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Consumes the buffer, returning its bytes.
    pub fn into_vec(self) -> Vec<u8> {
        self.data
    }
}

impl Deref for MemBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl DerefMut for MemBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }
}

impl fmt::Debug for MemBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBuf")
            .field("len", &self.data.len())
            .field("lkey", &self.lkey)
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
