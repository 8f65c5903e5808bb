//! A pool's data area as verbs memory (feature `verbs`): what a memory node registers so
//! that clients reach the pool's objects with one-sided verbs.

use std::sync::Arc;

use dmkit_verbs::{FnBacking, Media};

use crate::Pool;

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
