//! Persistent (and DRAM) memory pools for disaggregated memory nodes: a crash-consistent block
//! table that hands coarse blocks to client ids (FUSEE), an object allocator with size classes
//! and generations (Gengar), and a data area to register as an RDMA memory region.
//!
//! ```
//! use dmkit_pmem_pool::{Pool, PoolOptions};
//!
//! # fn main() -> dmkit_pmem_pool::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("node0.pool");
//! let opts = PoolOptions::default().block_size(64 << 10);
//! {
//!     let pool = Pool::create(&path, 4 << 20, opts)?;
//!     // FUSEE: a memory node hands coarse blocks to client 7.
//!     let blocks = pool.alloc_blocks(7, 2)?;
//!     // Gengar: objects by size class, each with a generation.
//!     let obj = pool.alloc_object(100)?;
//!     // Clients write the payload over RDMA; the memory node persists it.
//!     pool.persist(obj.offset, obj.size)?;
//!     assert_eq!(pool.blocks_owned_by(7), blocks);
//! }
//! // Reopening runs recovery; everything that completed is still there.
//! let pool = Pool::open(&path)?;
//! assert_eq!(pool.blocks_owned_by(7).len(), 2);
//! assert_eq!(pool.stats().live_objects, 1);
//! println!("{} bytes free", pool.free_bytes());
//! # Ok(())
//! # }
//! ```
//!
//! Media ([`Medium`]): a file mapped with libpmem (feature `libpmem`, needs Debian's
//! `libpmem-dev` and `libclang-dev`), a file mapped with `mmap` and persisted with `msync` (the
//! default, pure Rust), or anonymous DRAM ([`Pool::create_dram`], volatile). The layout and the
//! crash-consistency protocol are described in the `layout`, `redo`, `blocks` and `objects`
//! modules; `test_utils` (feature `test_utils`) has the recording medium that replays every
//! crash image a power failure could leave. See `examples/memnode_pool.rs`.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod blocks;
mod copies;
mod error;
mod layout;
mod media;
mod objects;
mod pool;
mod redo;
mod stats;

#[cfg(feature = "verbs")]
#[cfg_attr(docsrs, doc(cfg(feature = "verbs")))]
pub mod remote;
pub mod slabs;
#[cfg(any(test, feature = "test_utils"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test_utils")))]
pub mod test_utils;
#[cfg(feature = "verbs")]
#[cfg_attr(docsrs, doc(cfg(feature = "verbs")))]
pub mod verbs;

#[cfg(test)]
mod crash_tests;

pub use blocks::{BlockId, MAX_OWNER, OBJECT_OWNER};
pub use error::{Error, Result};
pub use layout::{MAGIC, MIN_BLOCK_SIZE, VERSION};
#[cfg(feature = "libpmem")]
pub use media::LibpmemFile;
pub use media::{DramMedium, FileBackend, Medium, MediumKind, MmapFile};
pub use objects::{OBJECT_HEADER_LEN, ObjectHeader, ObjectRef, SizeClass};
pub use pool::{Pool, PoolOptions, PoolUuid};
pub use stats::PoolStats;
