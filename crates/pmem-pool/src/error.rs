//! The crate's one error type.

use std::path::PathBuf;

use crate::blocks::BlockId;

/// Everything that can go wrong with a pool. `pool` fields name the pool's medium (a file path,
/// `<dram>` or a test medium) so that a message read in a log says which pool it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A system call on a pool file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing (`"open"`, `"mmap"`, `"msync"`, ...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Another process (or another open of it in this process) holds the pool file: a pool is
    /// served by one owner at a time. `holder` is the holding process's pid, where the OS
    /// says (Linux `/proc/locks`).
    #[error("{path}: in use by {} (a pool file is opened by one process at a time)", match holder { Some(p) => format!("process {p}"), None => "another process".to_string() })]
    Locked {
        /// The file.
        path: PathBuf,
        /// The pid holding the lock, when known.
        holder: Option<u32>,
    },
    /// libpmem refused a call; `message` is `pmem_errormsg()`.
    #[error("libpmem {op} {path}: {message}")]
    Libpmem {
        /// The libpmem function.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// libpmem's explanation.
        message: String,
    },
    /// The medium does not start with the pool magic: it is not a dmkit pool.
    #[error("{pool}: not a dmkit pool (magic {found:02x?}, expected {expected:02x?})")]
    BadMagic {
        /// The pool's medium.
        pool: String,
        /// The first 8 bytes found.
        found: [u8; 8],
        /// The magic a pool starts with.
        expected: [u8; 8],
    },
    /// The pool was written with a layout version this build does not read.
    #[error(
        "{pool}: layout version {found} is not supported (this build reads version {supported})"
    )]
    VersionMismatch {
        /// The pool's medium.
        pool: String,
        /// The version in the superblock.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// A checksummed structure does not match its checksum.
    #[error("{pool}: {what} checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    ChecksumMismatch {
        /// The pool's medium.
        pool: String,
        /// Which structure (`"superblock"`, `"redo log"`).
        what: &'static str,
        /// The checksum on media.
        stored: u32,
        /// The checksum of the bytes on media.
        computed: u32,
    },
    /// The file (or requested size) cannot hold a pool, or is shorter than its superblock says.
    #[error("{pool}: {len} bytes is too small, the pool needs at least {needed} bytes")]
    FileTooSmall {
        /// The pool's medium.
        pool: String,
        /// The size found or requested.
        len: u64,
        /// The size needed.
        needed: u64,
    },
    /// The superblock has a valid checksum but describes an impossible layout.
    #[error("{pool}: corrupt superblock: {reason}")]
    CorruptSuperblock {
        /// The pool's medium.
        pool: String,
        /// What is inconsistent.
        reason: String,
    },
    /// Allocation metadata (block table, class table, object headers) is inconsistent in a way
    /// no crash can produce.
    #[error("{pool}: corrupt metadata: {reason}")]
    CorruptMetadata {
        /// The pool's medium.
        pool: String,
        /// What is inconsistent.
        reason: String,
    },
    /// The options given to `create` are unusable.
    #[error("invalid pool options: {reason}")]
    InvalidOptions {
        /// Why.
        reason: String,
    },
    /// Not enough free blocks.
    #[error("out of space: {requested} block(s) requested, {free} free")]
    OutOfBlocks {
        /// Blocks asked for.
        requested: usize,
        /// Blocks free.
        free: usize,
    },
    /// More blocks in one atomic request than the redo log holds.
    #[error("{requested} blocks in one request; at most {max} can be allocated atomically")]
    TooManyBlocks {
        /// Blocks asked for.
        requested: usize,
        /// The redo log's capacity.
        max: usize,
    },
    /// The owner id is reserved (`u64::MAX` marks free blocks, `u64::MAX - 1` the object
    /// allocator's own blocks).
    #[error("owner id {owner:#x} is reserved")]
    ReservedOwner {
        /// The owner given.
        owner: u64,
    },
    /// The block id is not in the pool.
    #[error("block {block} does not exist (the pool has {count} blocks)")]
    NoSuchBlock {
        /// The block given.
        block: BlockId,
        /// Blocks in the pool.
        count: u64,
    },
    /// The block is allocated to another owner.
    #[error("block {block} is owned by {owner}")]
    BlockTaken {
        /// The block asked for.
        block: BlockId,
        /// Its current owner.
        owner: u64,
    },
    /// The block is free, so it cannot be freed.
    #[error("block {block} is not allocated")]
    BlockNotAllocated {
        /// The block given.
        block: BlockId,
    },
    /// The block holds objects of the object allocator; free the objects instead.
    #[error("block {block} belongs to the object allocator")]
    ObjectBlock {
        /// The block given.
        block: BlockId,
    },
    /// The object is larger than the largest size class.
    #[error("object of {size} bytes is larger than the largest size class ({max} bytes)")]
    ObjectTooLarge {
        /// Size asked for.
        size: usize,
        /// The largest payload a size class holds.
        max: usize,
    },
    /// The offset is not the start of an object slot.
    #[error("offset {offset:#x} is not an object: {reason}")]
    NotAnObject {
        /// The data-area offset given.
        offset: usize,
        /// Why not.
        reason: &'static str,
    },
    /// The object at this offset is already free (a double free or a stale address).
    #[error("object at offset {offset:#x} is not allocated (generation {generation})")]
    ObjectNotAllocated {
        /// The data-area offset given.
        offset: usize,
        /// The slot's current generation.
        generation: u32,
    },
    /// A range outside the data area.
    #[error("range {offset:#x}+{len:#x} is outside the data area ({data_len:#x} bytes)")]
    OutOfBounds {
        /// Offset given.
        offset: usize,
        /// Length given.
        len: usize,
        /// The data area's length.
        data_len: usize,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
