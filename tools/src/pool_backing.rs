//! The glue between a persistent pool and the verbs layer: a pool's data area registered as a
//! memory region, with durable writes persisted through the pool's medium.

use std::sync::Arc;

use dmkit_pmem_pool::Pool;
use dmkit_verbs::{Backing, Media};

/// A pool's data area as verbs-registrable memory.
#[derive(Debug)]
pub struct PoolBacking(pub Arc<Pool>);

impl Backing for PoolBacking {
    fn as_ptr(&self) -> *mut u8 {
        self.0.data_ptr()
    }
    fn len(&self) -> usize {
        // Verbs regions are whole words.
        self.0.data_len() / 8 * 8
    }
    fn media(&self) -> Media {
        if self.0.is_persistent() {
            Media::Nvm
        } else {
            Media::Dram
        }
    }
    fn persist(&self, offset: usize, len: usize) -> std::io::Result<()> {
        self.0
            .persist(offset, len)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}
