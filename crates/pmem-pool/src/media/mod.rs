//! Pool media: where the bytes of a pool live and how they are made durable.
//!
//! A [`Medium`] is a mapped byte range plus a way to persist part of it. The pool writes all of
//! its metadata through [`Medium::store_u64`] and [`Medium::write`], and orders those writes with
//! [`Medium::persist`]; that narrow surface is what lets the recording medium of
//! `test_utils` replay every crash a power failure could cause.

#[cfg(feature = "libpmem")]
mod libpmem;
mod mmap;
mod region;

use std::fmt;
use std::path::Path;

#[cfg(feature = "libpmem")]
pub use libpmem::LibpmemFile;
pub use mmap::{DramMedium, MmapFile};
pub(crate) use region::Region;

use crate::error::Result;

/// Which kind of medium a pool sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MediumKind {
    /// A file mapped with libpmem (`pmem_map_file`); persisted with `pmem_persist` on real
    /// persistent memory and `pmem_msync` elsewhere.
    Libpmem,
    /// A file mapped with `mmap(MAP_SHARED)`; persisted with `msync(MS_SYNC)`.
    MmapFile,
    /// Anonymous DRAM: volatile, persist is a no-op.
    Dram,
    /// An in-memory test medium (see `test_utils`, feature `test_utils`).
    Test,
}

impl fmt::Display for MediumKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MediumKind::Libpmem => "libpmem",
            MediumKind::MmapFile => "mmap",
            MediumKind::Dram => "dram",
            MediumKind::Test => "test",
        })
    }
}

/// The bytes of a pool and the way to make them durable.
///
/// NOTE: offsets are relative to the start of the medium; word accesses need 8-aligned offsets;
/// every access out of bounds panics (it is a bug in the caller, never a consequence of bad
/// media contents, which the pool validates before using).
pub trait Medium: Send + Sync + fmt::Debug {
    /// Which kind of medium this is.
    fn kind(&self) -> MediumKind;

    /// Names the medium in errors and logs: the file path, or `<dram>`.
    fn location(&self) -> String;

    /// The file behind the medium, if there is one.
    fn path(&self) -> Option<&Path>;

    /// Start of the mapping, valid for [`Medium::len`] bytes while the medium lives; at least
    /// 8-byte aligned, page-aligned for every medium of this crate.
    fn as_ptr(&self) -> *mut u8;

    /// Length of the mapping in bytes.
    fn len(&self) -> usize;

    /// Whether the mapping is empty (never true for a usable pool).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether [`Medium::persist`] makes data survive a power failure (false for DRAM).
    fn is_persistent(&self) -> bool;

    /// Loads the little-endian 8-byte word at the 8-aligned `offset`.
    fn load_u64(&self, offset: usize) -> u64;

    /// Stores the little-endian 8-byte word at the 8-aligned `offset` with one store: after a
    /// crash the word on media is either the old or the new value, never a mix.
    fn store_u64(&self, offset: usize, value: u64);

    /// Copies `buf.len()` bytes from `offset` into `buf`.
    fn read(&self, offset: usize, buf: &mut [u8]);

    /// Copies `data` to `offset`; not durable until persisted, and only failure-atomic per
    /// aligned 8-byte word.
    fn write(&self, offset: usize, data: &[u8]);

    /// Makes `[offset, offset + len)` durable; when it returns, the bytes survive a power
    /// failure (a no-op on volatile media).
    fn persist(&self, offset: usize, len: usize) -> Result<()>;

    /// Says that `[offset, offset + len)` was written through the mapping ([`Medium::as_ptr`],
    /// e.g. by a NIC), not through [`Medium::write`]: a recording medium records the bytes it
    /// now holds as stores. A no-op for every real medium.
    fn note_write(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }

    /// Copies `data` to `offset` and persists it (libpmem does both in one call).
    fn write_persist(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.write(offset, data);
        self.persist(offset, data.len())
    }
}

/// Which file medium [`crate::Pool::create`] and [`crate::Pool::open`] use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileBackend {
    /// libpmem when the crate is built with the `libpmem` feature, mmap + msync otherwise.
    #[default]
    Auto,
    /// `mmap(MAP_SHARED)` + `msync`: pure Rust, works on any file system.
    Mmap,
    /// `pmem_map_file` + `pmem_persist`/`pmem_msync`; an error unless built with `libpmem`.
    Libpmem,
}
