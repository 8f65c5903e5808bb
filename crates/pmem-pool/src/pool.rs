//! The pool: create/open (with recovery), the block table and the object allocator over a
//! [`Medium`].

use std::fmt;
use std::io::Read;
use std::path::Path;

use parking_lot::Mutex;

use crate::blocks::{BlockId, BlockTable, MAX_OWNER, OBJECT_OWNER, decode_entry, encode_owner};
use crate::error::{Error, Result};
use crate::layout::{Geometry, SUPERBLOCK_LEN, SUPERBLOCK_USED, Superblock};
#[cfg(feature = "libpmem")]
use crate::media::LibpmemFile;
use crate::media::{DramMedium, FileBackend, Medium, MediumKind, MmapFile};
use crate::objects::{OBJECT_HEADER_LEN, ObjectHeader, ObjectRef, Objects, SizeClass};
use crate::redo;
use crate::stats::{PoolMetrics, PoolStats};

/// How to create a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Bytes per block: a power of two of at least 4096 (default 1 MiB).
    pub block_size: usize,
    /// Which file medium to map a pool file with (ignored by `create_dram`).
    pub backend: FileBackend,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            block_size: 1 << 20,
            backend: FileBackend::Auto,
        }
    }
}

impl PoolOptions {
    /// Sets the block size.
    pub fn block_size(mut self, block_size: usize) -> Self {
        self.block_size = block_size;
        self
    }

    /// Sets the file backend.
    pub fn backend(mut self, backend: FileBackend) -> Self {
        self.backend = backend;
        self
    }
}

/// A pool's identity, random at create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolUuid(pub [u8; 16]);

impl PoolUuid {
    /// A fresh random (version 4) uuid — never all zeros.
    pub fn random() -> Self {
        let mut b: [u8; 16] = rand::random();
        b[6] = (b[6] & 0x0f) | 0x40; // version 4
        b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
        PoolUuid(b)
    }
}

impl fmt::Display for PoolUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct State {
    blocks: BlockTable,
    objects: Objects,
}

/// A memory pool: a superblock, a crash-consistent block table with an owner per block, an
/// object allocator with size classes, and a data area to register for RDMA.
///
/// Every method takes `&self`; metadata updates are serialised by an internal lock.
pub struct Pool {
    medium: Box<dyn Medium>,
    geometry: Geometry,
    uuid: PoolUuid,
    location: String,
    classes: Vec<SizeClass>,
    state: Mutex<State>,
    metrics: PoolMetrics,
    /// The exclusive lock on the pool file (file pools only), held while the pool lives.
    _file_lock: Option<std::fs::File>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("location", &self.location)
            .field("medium", &self.medium.kind())
            .field("uuid", &self.uuid.to_string())
            .field("block_size", &self.geometry.block_size)
            .field("block_count", &self.geometry.block_count)
            .finish_non_exhaustive()
    }
}

fn backend_medium_create(path: &Path, len: usize, backend: FileBackend) -> Result<Box<dyn Medium>> {
    match backend {
        #[cfg(feature = "libpmem")]
        FileBackend::Auto | FileBackend::Libpmem => Ok(Box::new(LibpmemFile::create(path, len)?)),
        #[cfg(not(feature = "libpmem"))]
        FileBackend::Libpmem => Err(libpmem_missing()),
        _ => Ok(Box::new(MmapFile::create(path, len)?)),
    }
}

fn backend_medium_open(path: &Path, backend: FileBackend) -> Result<Box<dyn Medium>> {
    match backend {
        #[cfg(feature = "libpmem")]
        FileBackend::Auto | FileBackend::Libpmem => Ok(Box::new(LibpmemFile::open(path)?)),
        #[cfg(not(feature = "libpmem"))]
        FileBackend::Libpmem => Err(libpmem_missing()),
        _ => Ok(Box::new(MmapFile::open(path)?)),
    }
}

/// Takes the exclusive, non-blocking `flock` of the pool file at `path` on a descriptor of its
/// own (released when the returned file is dropped, or the process ends however it ends).
fn lock_file(path: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(|e| Error::io("open", path, e))?;
    // SAFETY: flock on a descriptor this function owns; LOCK_NB keeps it from blocking.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(f);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(Error::Locked {
            path: path.to_path_buf(),
            holder: lock_holder(&f),
        });
    }
    Err(Error::io("flock", path, e))
}

/// The pid holding an flock on the file behind `f`, from Linux's `/proc/locks` (`None` where
/// that is not available).
fn lock_holder(f: &std::fs::File) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let ino = f.metadata().ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.get(1) != Some(&"FLOCK") {
            return None;
        }
        let file_ino: u64 = w.get(5)?.rsplit(':').next()?.parse().ok()?;
        (file_ino == ino).then(|| w.get(4)?.parse().ok())?
    })
}

#[cfg(not(feature = "libpmem"))]
fn libpmem_missing() -> Error {
    Error::InvalidOptions {
        reason: "FileBackend::Libpmem needs dmkit-pmem-pool built with the `libpmem` feature"
            .into(),
    }
}

impl Pool {
    /// Creates a pool file of exactly `size` bytes at `path` (which must not exist) and opens
    /// it: metadata and as many blocks as fit; the tail that holds no whole block stays unused
    /// (see [`Pool::data_len`]). Opening it again finds a file of `size` bytes. The file is
    /// locked (`flock`, exclusive) while the pool lives: another [`Pool::create`] or
    /// [`Pool::open`] of it, from any process, fails with [`Error::Locked`].
    pub fn create(path: impl AsRef<Path>, size: usize, opts: PoolOptions) -> Result<Pool> {
        let path = path.as_ref();
        let geometry = Geometry::compute(size, opts.block_size).map_err(|e| match e {
            Error::FileTooSmall { len, needed, .. } => Error::FileTooSmall {
                pool: path.display().to_string(),
                len,
                needed,
            },
            e => e,
        })?;
        let medium = match backend_medium_create(path, size, opts.backend) {
            Ok(m) => m,
            Err(e) => {
                // A file this call created (it did unless creating it failed: it existed)
                // goes again, so that a full disk leaves no half-made pool behind.
                if !matches!(&e, Error::Io { op: "create", .. } | Error::Libpmem { .. }) {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e);
            }
        };
        // Locked before it is formatted: an open racing the creation is told who has it,
        // not that the file is no pool.
        let lock = lock_file(path)?;
        match Pool::format(medium, geometry) {
            Ok(mut pool) => {
                pool._file_lock = Some(lock);
                Ok(pool)
            }
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Opens the pool file at `path` (recovering it after a crash) if it exists, else creates
    /// it with `size` and `opts` (a restarted server finds its pool, a new one makes it).
    pub fn open_or_create(path: impl AsRef<Path>, size: usize, opts: PoolOptions) -> Result<Pool> {
        let path = path.as_ref();
        if path.exists() {
            Pool::open(path)
        } else {
            Pool::create(path, size, opts)
        }
    }

    /// Opens the pool file at `path` with the default backend, recovering it after a crash.
    pub fn open(path: impl AsRef<Path>) -> Result<Pool> {
        Pool::open_with(path, FileBackend::Auto)
    }

    /// Opens the pool file at `path` with a chosen backend, recovering it after a crash. The
    /// file is locked while the pool lives (see [`Pool::create`]); a held lock is
    /// [`Error::Locked`], before anything is read or recovered.
    pub fn open_with(path: impl AsRef<Path>, backend: FileBackend) -> Result<Pool> {
        let path = path.as_ref();
        let lock = lock_file(path)?;
        // Validate with plain reads before mapping, so that a truncated or foreign file is a
        // clear error rather than a SIGBUS.
        let mut file = std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", path, e))?
            .len();
        let mut head = Vec::with_capacity(SUPERBLOCK_USED);
        (&mut file)
            .take(SUPERBLOCK_USED as u64)
            .read_to_end(&mut head)
            .map_err(|e| Error::io("read", path, e))?;
        Superblock::decode(&head, &path.display().to_string(), len)?;
        drop(file);
        let mut pool = Pool::open_on(backend_medium_open(path, backend)?)?;
        pool._file_lock = Some(lock);
        Ok(pool)
    }

    /// Creates a volatile pool of at most `size` bytes in anonymous DRAM.
    pub fn create_dram(size: usize, opts: PoolOptions) -> Result<Pool> {
        let geometry = Geometry::compute(size, opts.block_size)?;
        Pool::format(Box::new(DramMedium::new(geometry.pool_len)?), geometry)
    }

    /// Formats a fresh pool on any medium (the whole medium, with `opts.block_size`).
    pub fn create_on(medium: Box<dyn Medium>, opts: PoolOptions) -> Result<Pool> {
        let geometry = Geometry::compute(medium.len(), opts.block_size).map_err(|e| match e {
            Error::FileTooSmall { len, needed, .. } => Error::FileTooSmall {
                pool: medium.location(),
                len,
                needed,
            },
            e => e,
        })?;
        Pool::format(medium, geometry)
    }

    /// Opens the pool on a medium, validating the superblock and running recovery.
    pub fn open_on(medium: Box<dyn Medium>) -> Result<Pool> {
        let location = medium.location();
        let mut head = [0u8; SUPERBLOCK_USED];
        if medium.len() < SUPERBLOCK_USED {
            return Err(Error::FileTooSmall {
                pool: location,
                len: medium.len() as u64,
                needed: SUPERBLOCK_LEN as u64,
            });
        }
        medium.read(0, &mut head);
        let sb = Superblock::decode(&head, &location, medium.len() as u64)?;
        let replayed = redo::recover(medium.as_ref(), &sb.geometry, &location)?;
        let pool = Pool::load(medium, sb)?;
        pool.metrics
            .recovered_log_entries
            .increment(replayed as u64);
        Ok(pool)
    }

    /// Writes empty metadata, then the superblock last: until the superblock is durable, `open`
    /// rejects the medium.
    fn format(medium: Box<dyn Medium>, g: Geometry) -> Result<Pool> {
        let m = medium.as_ref();
        m.store_u64(g.log_offset, 0);
        m.persist(g.log_offset, 8)?;
        let zeros = vec![0u8; 64 << 10];
        let mut at = g.table_offset;
        while at < g.data_offset {
            let n = zeros.len().min(g.data_offset - at);
            m.write(at, &zeros[..n]);
            at += n;
        }
        m.persist(g.table_offset, g.data_offset - g.table_offset)?;
        let sb = Superblock {
            uuid: PoolUuid::random().0,
            geometry: g,
        };
        m.write_persist(0, &sb.encode())?;
        Pool::load(medium, sb)
    }

    /// Builds the DRAM state from (recovered) media.
    fn load(medium: Box<dyn Medium>, sb: Superblock) -> Result<Pool> {
        let g = sb.geometry;
        let location = medium.location();
        let classes = SizeClass::all(g.block_size);
        let corrupt = |reason: String| Error::CorruptMetadata {
            pool: location.clone(),
            reason,
        };
        let entries: Vec<u64> = (0..g.block_count)
            .map(|b| medium.load_u64(g.table_offset + 8 * b))
            .collect();
        let mut objects = Objects::new(classes.len());
        for (b, entry) in entries.iter().enumerate() {
            if decode_entry(*entry) != Some(OBJECT_OWNER) {
                continue;
            }
            let word = medium.load_u64(g.class_offset + 8 * b);
            let class = word
                .checked_sub(1)
                .and_then(|c| classes.get(c as usize))
                .ok_or_else(|| corrupt(format!("object block #{b} has size class word {word}")))?;
            objects.blocks += 1;
            let start = b * g.block_size;
            let mut free = Vec::new();
            for slot in (start..start + g.block_size).step_by(class.slot_size) {
                let h = ObjectHeader::decode(medium.load_u64(g.data_offset + slot));
                if h.allocated {
                    if h.size as usize > class.max_object_size() {
                        return Err(corrupt(format!(
                            "object at {:#x} claims {} bytes in a {}-byte slot",
                            slot + OBJECT_HEADER_LEN,
                            h.size,
                            class.slot_size
                        )));
                    }
                    objects.live += 1;
                    objects.live_slot_bytes += class.slot_size;
                } else {
                    free.push(slot);
                    objects.free_slot_bytes += class.slot_size;
                }
            }
            objects.free_slots[class.index].extend(free);
        }
        let pool = Pool {
            metrics: PoolMetrics::new(
                PoolUuid(sb.uuid).to_string(),
                medium.kind() != MediumKind::Dram,
            ),
            uuid: PoolUuid(sb.uuid),
            geometry: g,
            location,
            classes,
            state: Mutex::new(State {
                blocks: BlockTable::from_entries(entries),
                objects,
            }),
            medium,
            _file_lock: None,
        };
        pool.publish();
        Ok(pool)
    }

    // ---- identity and the data area ------------------------------------------------------

    /// The pool's uuid.
    pub fn uuid(&self) -> PoolUuid {
        self.uuid
    }

    /// Which kind of medium the pool sits on.
    pub fn medium_kind(&self) -> MediumKind {
        self.medium.kind()
    }

    /// The file behind the pool, if any.
    pub fn path(&self) -> Option<&Path> {
        self.medium.path()
    }

    /// Start of the data area (page-aligned): the memory to register as an RDMA region.
    /// Valid for [`Pool::data_len`] bytes while the pool lives.
    pub fn data_ptr(&self) -> *mut u8 {
        self.medium.as_ptr().wrapping_add(self.geometry.data_offset)
    }

    /// Length of the data area in bytes (`block_count * block_size`).
    pub fn data_len(&self) -> usize {
        self.geometry.data_len()
    }

    /// Makes `[offset, offset + len)` of the data area durable (a no-op on DRAM).
    pub fn persist(&self, offset: usize, len: usize) -> Result<()> {
        self.check_data_range(offset, len)?;
        self.medium.persist(self.geometry.data_offset + offset, len)
    }

    /// Says that `[offset, offset + len)` of the data area was written through
    /// [`Pool::data_ptr`] (by a NIC, say): the crash-test medium records it; real media ignore
    /// it.
    pub fn note_data_write(&self, offset: usize, len: usize) {
        if self.check_data_range(offset, len).is_ok() {
            self.medium
                .note_write(self.geometry.data_offset + offset, len);
        }
    }

    /// Whether the pool survives power failure (false for DRAM pools).
    pub fn is_persistent(&self) -> bool {
        self.medium.is_persistent()
    }

    fn check_data_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.data_len() => Ok(()),
            _ => Err(Error::OutOfBounds {
                offset,
                len,
                data_len: self.data_len(),
            }),
        }
    }

    // ---- the block table ---------------------------------------------------------------

    /// Bytes per block.
    pub fn block_size(&self) -> usize {
        self.geometry.block_size
    }

    /// Blocks in the pool.
    pub fn block_count(&self) -> usize {
        self.geometry.block_count
    }

    /// Offset of a block in the data area (not checked against the block count).
    pub fn block_offset(&self, block: BlockId) -> usize {
        (block.0 as usize).wrapping_mul(self.geometry.block_size)
    }

    fn table_word(&self, block: u64) -> usize {
        self.geometry.table_offset + 8 * block as usize
    }

    fn check_owner(owner: u64) -> Result<()> {
        if owner > MAX_OWNER {
            return Err(Error::ReservedOwner { owner });
        }
        Ok(())
    }

    /// Allocates one block to `owner`; durable when it returns.
    pub fn alloc_block(&self, owner: u64) -> Result<BlockId> {
        Self::check_owner(owner)?;
        let mut st = self.state.lock();
        let b = self.take_block(&mut st, encode_owner(owner))?;
        drop(st);
        self.publish();
        Ok(BlockId(b))
    }

    /// Allocates the lowest free block whose id satisfies `pick` to `owner` (e.g. the stripe of
    /// block ids a node is primary for); durable when it returns.
    pub fn alloc_block_where(&self, owner: u64, pick: impl Fn(BlockId) -> bool) -> Result<BlockId> {
        Self::check_owner(owner)?;
        let mut st = self.state.lock();
        let Some(b) = st.blocks.first_free_where(|b| pick(BlockId(b))) else {
            return Err(Error::OutOfBlocks {
                requested: 1,
                free: 0,
            });
        };
        self.set_block(&mut st, b, encode_owner(owner))?;
        drop(st);
        self.publish();
        Ok(BlockId(b))
    }

    /// Allocates exactly `block` to `owner` (a replica mirroring another node's block); a
    /// no-op if `owner` has it already, [`Error::BlockTaken`] if someone else has.
    pub fn alloc_block_at(&self, block: BlockId, owner: u64) -> Result<()> {
        Self::check_owner(owner)?;
        self.check_block(block)?;
        let mut st = self.state.lock();
        match st.blocks.owner(block.0) {
            Some(o) if o == owner => return Ok(()),
            Some(o) => return Err(Error::BlockTaken { block, owner: o }),
            None => {}
        }
        self.set_block(&mut st, block.0, encode_owner(owner))?;
        drop(st);
        self.publish();
        Ok(())
    }

    /// Writes one block table entry with one durable 8-byte store.
    fn set_block(&self, st: &mut State, b: u64, entry: u64) -> Result<()> {
        let word = self.table_word(b);
        self.medium.store_u64(word, entry);
        self.medium.persist(word, 8)?;
        st.blocks.set(b, entry);
        Ok(())
    }

    /// Takes the lowest free block with one durable 8-byte store.
    fn take_block(&self, st: &mut State, entry: u64) -> Result<u64> {
        let Some(&b) = st.blocks.peek_free(1).first() else {
            return Err(Error::OutOfBlocks {
                requested: 1,
                free: 0,
            });
        };
        self.set_block(st, b, entry)?;
        Ok(b)
    }

    /// Allocates `n` blocks to `owner`, all or none (through the redo log).
    pub fn alloc_blocks(&self, owner: u64, n: usize) -> Result<Vec<BlockId>> {
        Self::check_owner(owner)?;
        if n <= 1 {
            return (0..n).map(|_| self.alloc_block(owner)).collect();
        }
        if n > self.geometry.log_capacity {
            return Err(Error::TooManyBlocks {
                requested: n,
                max: self.geometry.log_capacity,
            });
        }
        let mut st = self.state.lock();
        let free = st.blocks.free_count();
        if n > free {
            return Err(Error::OutOfBlocks { requested: n, free });
        }
        let blocks = st.blocks.peek_free(n);
        let entry = encode_owner(owner);
        let updates: Vec<_> = blocks
            .iter()
            .map(|b| (self.table_word(*b), entry))
            .collect();
        redo::transact(self.medium.as_ref(), &self.geometry, &updates)?;
        for b in &blocks {
            st.blocks.set(*b, entry);
        }
        drop(st);
        self.publish();
        Ok(blocks.into_iter().map(BlockId).collect())
    }

    fn check_block(&self, block: BlockId) -> Result<()> {
        if block.0 >= self.geometry.block_count as u64 {
            return Err(Error::NoSuchBlock {
                block,
                count: self.geometry.block_count as u64,
            });
        }
        Ok(())
    }

    /// Frees a block; durable when it returns. Blocks of the object allocator are refused.
    pub fn free_block(&self, block: BlockId) -> Result<()> {
        self.check_block(block)?;
        let mut st = self.state.lock();
        match st.blocks.owner(block.0) {
            None => return Err(Error::BlockNotAllocated { block }),
            Some(OBJECT_OWNER) => return Err(Error::ObjectBlock { block }),
            Some(_) => {}
        }
        let word = self.table_word(block.0);
        self.medium.store_u64(word, 0);
        self.medium.persist(word, 8)?;
        st.blocks.set(block.0, 0);
        drop(st);
        self.publish();
        Ok(())
    }

    /// Frees every block of `owner` (a client that went away); each batch of up to the redo
    /// log's capacity is atomic. Returns the blocks freed.
    pub fn free_blocks_owned_by(&self, owner: u64) -> Result<Vec<BlockId>> {
        Self::check_owner(owner)?;
        let mut st = self.state.lock();
        let blocks = st.blocks.owned_by(owner);
        for chunk in blocks.chunks(self.geometry.log_capacity) {
            let updates: Vec<_> = chunk.iter().map(|b| (self.table_word(b.0), 0)).collect();
            redo::transact(self.medium.as_ref(), &self.geometry, &updates)?;
            for b in chunk {
                st.blocks.set(b.0, 0);
            }
        }
        drop(st);
        self.publish();
        Ok(blocks)
    }

    /// The owner of a block; `None` when it is free or does not exist. Blocks of the object
    /// allocator report [`OBJECT_OWNER`].
    pub fn block_owner(&self, block: BlockId) -> Option<u64> {
        self.state.lock().blocks.owner(block.0)
    }

    /// Every block `owner` holds, in ascending order.
    pub fn blocks_owned_by(&self, owner: u64) -> Vec<BlockId> {
        if owner == u64::MAX {
            return Vec::new();
        }
        self.state.lock().blocks.owned_by(owner)
    }

    /// Blocks nobody owns.
    pub fn free_blocks(&self) -> usize {
        self.state.lock().blocks.free_count()
    }

    /// Free bytes: free blocks plus free object slots.
    pub fn free_bytes(&self) -> u64 {
        self.stats().free_bytes
    }

    /// Space figures in one consistent snapshot.
    pub fn stats(&self) -> PoolStats {
        let st = self.state.lock();
        let object_blocks = st.objects.blocks;
        let free_blocks = st.blocks.free_count();
        PoolStats {
            block_size: self.geometry.block_size,
            block_count: self.geometry.block_count,
            free_blocks,
            object_blocks,
            live_objects: st.objects.live,
            free_bytes: (free_blocks * self.geometry.block_size + st.objects.free_slot_bytes)
                as u64,
        }
    }

    fn publish(&self) {
        self.metrics.publish(&self.stats());
    }

    // ---- the object allocator ----------------------------------------------------------

    /// The size classes, smallest first.
    pub fn size_classes(&self) -> &[SizeClass] {
        &self.classes
    }

    /// The largest object [`Pool::alloc_object`] accepts.
    pub fn max_object_size(&self) -> usize {
        self.classes.last().map_or(0, SizeClass::max_object_size)
    }

    /// The size class an object of `size` bytes goes to.
    pub fn size_class_for(&self, size: usize) -> Result<SizeClass> {
        // Header sizes are 32-bit: blocks beyond 4 GiB still hold objects of at most 4 GiB.
        self.classes
            .iter()
            .filter(|_| u32::try_from(size).is_ok())
            .find(|c| c.max_object_size() >= size)
            .copied()
            .ok_or(Error::ObjectTooLarge {
                size,
                max: self.max_object_size(),
            })
    }

    /// Allocates an object of `size` bytes; durable when it returns.
    pub fn alloc_object(&self, size: usize) -> Result<ObjectRef> {
        let class = self.size_class_for(size)?;
        let mut st = self.state.lock();
        if st.objects.free_slots[class.index].is_empty() {
            self.grow_class(&mut st, class)?;
        }
        let slot = st.objects.free_slots[class.index]
            .pop_first()
            .expect("grow_class adds slots");
        let word = self.geometry.data_offset + slot;
        let old = ObjectHeader::decode(self.medium.load_u64(word));
        let new = ObjectHeader {
            allocated: true,
            size: size as u32,
            generation: old.generation,
        };
        self.medium.store_u64(word, new.encode());
        if let Err(e) = self.medium.persist(word, 8) {
            st.objects.free_slots[class.index].insert(slot);
            return Err(e);
        }
        st.objects.live += 1;
        st.objects.live_slot_bytes += class.slot_size;
        st.objects.free_slot_bytes -= class.slot_size;
        drop(st);
        self.metrics.object_allocs.increment(1);
        self.publish();
        Ok(ObjectRef {
            offset: slot + OBJECT_HEADER_LEN,
            size,
            generation: new.generation,
        })
    }

    /// Takes a free block for `class`: clear its slot headers, record the class, then (the
    /// commit point) the owner, each persisted before the next.
    fn grow_class(&self, st: &mut State, class: SizeClass) -> Result<()> {
        let Some(&b) = st.blocks.peek_free(1).first() else {
            return Err(Error::OutOfBlocks {
                requested: 1,
                free: 0,
            });
        };
        let g = &self.geometry;
        let start = b as usize * g.block_size;
        let slots: Vec<usize> = (start..start + g.block_size)
            .step_by(class.slot_size)
            .collect();
        for slot in &slots {
            self.medium.store_u64(g.data_offset + slot, 0);
        }
        let last = *slots.last().expect("a block holds at least one slot");
        self.medium
            .persist(g.data_offset + start, last + 8 - start)?;
        let class_word = g.class_offset + 8 * b as usize;
        self.medium.store_u64(class_word, class.index as u64 + 1);
        self.medium.persist(class_word, 8)?;
        self.take_block(st, encode_owner(OBJECT_OWNER))?;
        st.objects.blocks += 1;
        st.objects.free_slot_bytes += slots.len() * class.slot_size;
        st.objects.free_slots[class.index].extend(slots);
        Ok(())
    }

    /// Locates the slot of the object whose payload is at `offset`: (header offset, class).
    fn locate(&self, st: &State, offset: usize) -> Result<(usize, SizeClass)> {
        let not = |reason| Error::NotAnObject { offset, reason };
        if offset < OBJECT_HEADER_LEN || offset >= self.data_len() {
            return Err(not("outside the data area"));
        }
        let slot = offset - OBJECT_HEADER_LEN;
        let block = slot / self.geometry.block_size;
        if st.blocks.owner(block as u64) != Some(OBJECT_OWNER) {
            return Err(not("its block does not belong to the object allocator"));
        }
        let word = self.medium.load_u64(self.geometry.class_offset + 8 * block);
        let class = word
            .checked_sub(1)
            .and_then(|c| self.classes.get(c as usize))
            .copied()
            .ok_or(not("its block has no size class"))?;
        if (slot - block * self.geometry.block_size) % class.slot_size != 0 {
            return Err(not("not at the start of a slot"));
        }
        Ok((slot, class))
    }

    /// Frees the object whose payload is at `offset`, bumping its generation; durable when it
    /// returns. A double free is an error.
    pub fn free_object(&self, offset: usize) -> Result<()> {
        let mut st = self.state.lock();
        let (slot, class) = self.locate(&st, offset)?;
        let word = self.geometry.data_offset + slot;
        let old = ObjectHeader::decode(self.medium.load_u64(word));
        if !old.allocated {
            return Err(Error::ObjectNotAllocated {
                offset,
                generation: old.generation,
            });
        }
        self.medium.store_u64(word, old.freed().encode());
        self.medium.persist(word, 8)?;
        st.objects.free_slots[class.index].insert(slot);
        st.objects.live -= 1;
        st.objects.live_slot_bytes -= class.slot_size;
        st.objects.free_slot_bytes += class.slot_size;
        drop(st);
        self.metrics.object_frees.increment(1);
        self.publish();
        Ok(())
    }

    /// The header of the object whose payload is at `offset` if it is live at `generation`
    /// (`None`: no object there, freed, or re-allocated since).
    pub fn live_object(&self, offset: usize, generation: u32) -> Option<ObjectHeader> {
        let h = self.object_header(offset).ok()?;
        (h.allocated && h.generation == generation).then_some(h)
    }

    /// The header of the object slot whose payload is at `offset` (live or free).
    pub fn object_header(&self, offset: usize) -> Result<ObjectHeader> {
        let st = self.state.lock();
        let (slot, _) = self.locate(&st, offset)?;
        Ok(ObjectHeader::decode(
            self.medium.load_u64(self.geometry.data_offset + slot),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use super::*;

    const MIB: usize = 1 << 20;

    fn small() -> PoolOptions {
        PoolOptions::default().block_size(64 << 10)
    }

    #[test]
    fn blocks_can_be_taken_by_stripe_and_mirrored_at_a_given_id() {
        let pool = Pool::create_dram(4 * MIB, small()).unwrap();
        let b = pool.alloc_block_where(5, |b| b.0 % 3 == 2).unwrap();
        assert_eq!(b, BlockId(2));
        let b = pool.alloc_block_where(5, |b| b.0 % 3 == 2).unwrap();
        assert_eq!(b, BlockId(5));
        pool.alloc_block_at(BlockId(7), 9).unwrap();
        pool.alloc_block_at(BlockId(7), 9).unwrap();
        assert!(matches!(
            pool.alloc_block_at(BlockId(7), 8),
            Err(Error::BlockTaken { owner: 9, .. })
        ));
        assert!(pool.alloc_block_at(BlockId(1 << 40), 9).is_err());
        assert_eq!(pool.block_owner(BlockId(7)), Some(9));
        let reopened_free = pool.free_blocks();
        assert_eq!(reopened_free, pool.block_count() - 3);
    }

    #[test]
    fn file_pool_keeps_blocks_and_objects_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let (blocks, obj, uuid) = {
            let pool = Pool::create(&path, 4 * MIB, small().backend(FileBackend::Mmap)).unwrap();
            assert!(pool.is_persistent());
            assert_eq!(pool.medium_kind(), MediumKind::MmapFile);
            assert_eq!(pool.data_ptr() as usize % 4096, 0);
            assert_eq!(pool.data_len(), pool.block_count() * pool.block_size());
            let blocks = pool.alloc_blocks(3, 3).unwrap();
            let obj = pool.alloc_object(300).unwrap();
            // SAFETY: the object lies inside the data area, which lives as long as `pool`, and
            // no one else touches it in this test.
            unsafe { pool.data_ptr().add(obj.offset).write_bytes(0xab, obj.size) };
            pool.persist(obj.offset, obj.size).unwrap();
            (blocks, obj, pool.uuid())
        };
        let pool = Pool::open_with(&path, FileBackend::Mmap).unwrap();
        assert_eq!(pool.uuid(), uuid);
        assert_eq!(pool.path(), Some(path.as_path()));
        assert_eq!(pool.blocks_owned_by(3), blocks);
        assert!(pool.object_header(obj.offset).unwrap().matches(&obj));
        // SAFETY: as above; the object's bytes are initialised.
        let byte = unsafe { *pool.data_ptr().add(obj.offset + obj.size - 1) };
        assert_eq!(byte, 0xab);
        let s = pool.stats();
        assert_eq!((s.live_objects, s.object_blocks), (1, 1));
        assert_eq!(s.free_blocks, pool.block_count() - 4);
    }

    #[test]
    fn dram_pool_is_volatile_and_fully_functional() {
        let pool = Pool::create_dram(MIB, small()).unwrap();
        assert!(!pool.is_persistent());
        assert_eq!(pool.medium_kind(), MediumKind::Dram);
        assert_eq!(pool.path(), None);
        let b = pool.alloc_block(1).unwrap();
        assert_eq!(pool.block_owner(b), Some(1));
        assert_eq!(pool.block_offset(b), b.0 as usize * pool.block_size());
        pool.persist(0, pool.data_len()).unwrap();
        assert!(format!("{pool:?}").contains("Dram"));
    }

    #[test]
    fn blocks_are_exclusive_until_freed() {
        let pool = Pool::create_dram(MIB, small()).unwrap();
        let n = pool.block_count();
        let all = pool.alloc_blocks(5, n).unwrap();
        assert_eq!(all.len(), n);
        assert_eq!(pool.free_blocks(), 0);
        assert!(matches!(
            pool.alloc_block(6),
            Err(Error::OutOfBlocks { .. })
        ));
        assert!(matches!(
            pool.alloc_blocks(6, 2),
            Err(Error::OutOfBlocks {
                requested: 2,
                free: 0
            })
        ));
        pool.free_block(all[1]).unwrap();
        assert!(matches!(
            pool.free_block(all[1]),
            Err(Error::BlockNotAllocated { .. })
        ));
        assert_eq!(pool.alloc_block(6).unwrap(), all[1]);
        assert_eq!(pool.free_blocks_owned_by(5).unwrap().len(), n - 1);
        assert_eq!(pool.blocks_owned_by(5), vec![]);
        assert_eq!(pool.free_bytes(), ((n - 1) * pool.block_size()) as u64);
        assert_eq!(pool.alloc_blocks(6, 0).unwrap(), vec![]);
    }

    #[test]
    fn bad_block_and_owner_arguments_are_errors() {
        let pool = Pool::create_dram(MIB, small()).unwrap();
        let far = BlockId(pool.block_count() as u64);
        assert!(matches!(
            pool.free_block(far),
            Err(Error::NoSuchBlock { .. })
        ));
        assert_eq!(pool.block_owner(far), None);
        assert!(matches!(
            pool.alloc_block(OBJECT_OWNER),
            Err(Error::ReservedOwner { .. })
        ));
        assert!(matches!(
            pool.alloc_blocks(u64::MAX, 2),
            Err(Error::ReservedOwner { .. })
        ));
        assert!(pool.blocks_owned_by(u64::MAX).is_empty());
        assert!(matches!(
            pool.persist(pool.data_len(), 1),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            pool.persist(usize::MAX, 2),
            Err(Error::OutOfBounds { .. })
        ));
        let obj = pool.alloc_object(10).unwrap();
        let object_block = BlockId((obj.offset / pool.block_size()) as u64);
        assert!(matches!(
            pool.free_block(object_block),
            Err(Error::ObjectBlock { .. })
        ));
    }

    #[test]
    fn free_bumps_the_generation_so_stale_references_are_detected() {
        let pool = Pool::create_dram(MIB, small()).unwrap();
        let a = pool.alloc_object(40).unwrap();
        assert_eq!(a.generation, 0);
        pool.free_object(a.offset).unwrap();
        let h = pool.object_header(a.offset).unwrap();
        assert!(!h.allocated && h.generation == 1 && !h.matches(&a));
        assert!(matches!(
            pool.free_object(a.offset),
            Err(Error::ObjectNotAllocated { generation: 1, .. })
        ));
        let b = pool.alloc_object(50).unwrap();
        assert_eq!((b.offset, b.generation), (a.offset, 1));
        assert!(!pool.object_header(a.offset).unwrap().matches(&a));
    }

    #[test]
    fn objects_go_to_the_smallest_class_that_fits() {
        let pool = Pool::create_dram(4 * MIB, small()).unwrap();
        assert_eq!(pool.size_class_for(0).unwrap().slot_size, 64);
        assert_eq!(pool.size_class_for(56).unwrap().slot_size, 64);
        assert_eq!(pool.size_class_for(57).unwrap().slot_size, 128);
        let max = pool.max_object_size();
        assert_eq!(max, (64 << 10) - OBJECT_HEADER_LEN);
        assert!(pool.alloc_object(max).is_ok());
        assert!(matches!(
            pool.alloc_object(max + 1),
            Err(Error::ObjectTooLarge { .. })
        ));
        let a = pool.alloc_object(57).unwrap();
        let b = pool.alloc_object(57).unwrap();
        assert_eq!(b.offset - a.offset, 128);
        assert_eq!(a.offset % 8, 0);
        assert_eq!(pool.size_classes().len(), 11);
    }

    #[test]
    fn offsets_that_are_not_objects_are_errors() {
        let pool = Pool::create_dram(MIB, small()).unwrap();
        let obj = pool.alloc_object(10).unwrap();
        for bad in [
            0,
            3,
            obj.offset + 1,
            obj.offset + 8,
            pool.data_len(),
            usize::MAX,
        ] {
            assert!(
                matches!(pool.free_object(bad), Err(Error::NotAnObject { .. })),
                "offset {bad}"
            );
        }
        let user = pool.alloc_block(1).unwrap();
        let in_user = pool.block_offset(user) + 8;
        assert!(matches!(
            pool.object_header(in_user),
            Err(Error::NotAnObject { .. })
        ));
    }

    #[test]
    fn concurrent_allocations_never_share_a_slot() {
        let pool = Arc::new(Pool::create_dram(4 * MIB, small()).unwrap());
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..500 {
                        let obj = pool.alloc_object(8 + (i * 37 + t) % 900).unwrap();
                        if i % 3 == 0 {
                            pool.free_object(obj.offset).unwrap();
                        } else {
                            mine.push(obj.offset);
                        }
                    }
                    let block = pool.alloc_block(t as u64).unwrap();
                    (mine, block)
                })
            })
            .collect();
        let mut offsets = HashSet::new();
        let mut blocks = HashSet::new();
        for h in handles {
            let (mine, block) = h.join().unwrap();
            for o in mine {
                assert!(offsets.insert(o), "offset {o} handed out twice");
            }
            assert!(blocks.insert(block));
        }
        assert_eq!(pool.stats().live_objects, offsets.len());
    }

    #[test]
    fn a_pool_file_has_the_size_asked_for_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        // Not a multiple of the block size: the tail past the last whole block stays unused.
        let size = 5 * MIB + 12345;
        let pool = Pool::create(&path, size, small()).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size as u64);
        let data = pool.data_len();
        assert!(data > 4 * MIB && data < size, "{data}");
        drop(pool);
        let pool = Pool::open(&path).unwrap();
        assert_eq!(pool.data_len(), data);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size as u64);
    }

    #[test]
    fn a_pool_file_is_held_by_one_owner_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let pool = Pool::create(&path, 4 * MIB, small()).unwrap();
        let b = pool.alloc_block(3).unwrap();
        // A second open (here from this process; from another the same) is refused and told
        // who holds the file, before recovery could touch it.
        let err = Pool::open(&path).unwrap_err();
        match &err {
            Error::Locked { path: p, holder } => {
                assert_eq!(p, &path);
                if std::path::Path::new("/proc/locks").exists() {
                    assert_eq!(*holder, Some(std::process::id()), "{err}");
                }
            }
            e => panic!("expected Locked, got {e}"),
        }
        assert!(err.to_string().contains("in use by"), "{err}");
        assert_eq!(pool.block_owner(b), Some(3));
        // Released with the pool.
        drop(pool);
        let pool = Pool::open(&path).unwrap();
        assert_eq!(pool.block_owner(b), Some(3));
        assert!(matches!(Pool::open(&path), Err(Error::Locked { .. })));
    }

    #[test]
    fn opening_something_that_is_not_a_pool_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(
            Pool::open(&empty),
            Err(Error::FileTooSmall { .. })
        ));
        let junk = dir.path().join("junk");
        std::fs::write(&junk, vec![0x5a; 64 << 10]).unwrap();
        let err = Pool::open(&junk).unwrap_err();
        assert!(matches!(err, Error::BadMagic { .. }), "{err}");
        assert!(err.to_string().contains("junk"), "{err}");
        assert!(matches!(
            Pool::open(dir.path().join("missing")),
            Err(Error::Io { op: "open", .. })
        ));
        assert!(matches!(
            Pool::create(dir.path().join("tiny"), 8192, small()),
            Err(Error::FileTooSmall { .. })
        ));
        assert!(matches!(
            Pool::create_dram(MIB, PoolOptions::default().block_size(1000)),
            Err(Error::InvalidOptions { .. })
        ));
    }

    #[test]
    fn truncated_or_corrupted_pool_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        drop(Pool::create(&path, MIB, small().backend(FileBackend::Mmap)).unwrap());
        let bytes = std::fs::read(&path).unwrap();

        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert!(matches!(Pool::open(&path), Err(Error::FileTooSmall { .. })));

        let mut bad = bytes.clone();
        bad[40] ^= 1; // a geometry field
        std::fs::write(&path, &bad).unwrap();
        assert!(matches!(
            Pool::open(&path),
            Err(Error::ChecksumMismatch {
                what: "superblock",
                ..
            })
        ));

        let mut bad = bytes.clone();
        bad[8..12].copy_from_slice(&7u32.to_le_bytes());
        std::fs::write(&path, &bad).unwrap();
        let err = Pool::open(&path).unwrap_err();
        assert!(err.to_string().contains("version 7"), "{err}");

        // A nonsense redo log is refused rather than replayed.
        let mut bad = bytes.clone();
        bad[SUPERBLOCK_LEN..SUPERBLOCK_LEN + 8].copy_from_slice(&((1u64 << 32) | 1).to_le_bytes());
        std::fs::write(&path, &bad).unwrap();
        assert!(matches!(
            Pool::open(&path),
            Err(Error::ChecksumMismatch {
                what: "redo log",
                ..
            })
        ));

        std::fs::write(&path, &bytes).unwrap();
        assert!(Pool::open(&path).is_ok());
    }

    #[cfg(not(feature = "libpmem"))]
    #[test]
    fn the_libpmem_backend_needs_the_feature() {
        let dir = tempfile::tempdir().unwrap();
        let err = Pool::create(
            dir.path().join("p"),
            MIB,
            small().backend(FileBackend::Libpmem),
        )
        .unwrap_err();
        assert!(err.to_string().contains("libpmem"), "{err}");
    }

    #[cfg(feature = "libpmem")]
    #[test]
    fn libpmem_pool_keeps_blocks_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        {
            let pool = Pool::create(&path, 2 * MIB, small()).unwrap();
            assert_eq!(pool.medium_kind(), MediumKind::Libpmem);
            pool.alloc_blocks(9, 2).unwrap();
            pool.alloc_object(123).unwrap();
        }
        let pool = Pool::open(&path).unwrap();
        assert_eq!(pool.medium_kind(), MediumKind::Libpmem);
        assert_eq!(pool.blocks_owned_by(9).len(), 2);
        assert_eq!(pool.stats().live_objects, 1);
    }
}
