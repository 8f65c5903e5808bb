//! Memory that a node registers: the [`Backing`] trait, the DRAM implementation, and the
//! word-atomic view through which every verb touches it.
//!
//! All access to registered memory — by the soft NIC, by the node's own code, by other
//! connections — goes through `AtomicU64` words. That is what makes 8-aligned words untearable
//! and atomics atomic across connections without a lock, and it keeps the data race that a real
//! NIC's DMA would be (a write landing while the CPU reads) defined behaviour in Rust.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{AccessFault, Result};
use crate::types::Media;

/// Memory a memory node can register as a region: DRAM, a mapped pmem pool, ...
///
/// Implementations live where the memory lives (the glue between `dmkit-pmem-pool` and verbs is
/// in the frontends), so this crate never depends on a pool.
pub trait Backing: Send + Sync + std::fmt::Debug {
    /// The first byte. Must be 8-byte aligned and stay valid (and mapped) while `self` lives.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes; a multiple of 8.
    fn len(&self) -> usize;
    /// Whether `len()` is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Which medium this is; `Nvm` means `persist` makes data durable.
    fn media(&self) -> Media;
    /// Makes `[offset, offset + len)` durable. A no-op for volatile memory.
    fn persist(&self, offset: usize, len: usize) -> std::io::Result<()>;
    /// Told after a verb changed `[offset, offset + len)` (a write, a swap, an add): a
    /// backing that records its stores (a power-failure test medium) records them. Nothing,
    /// by default.
    fn wrote(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }
}

/// Anonymous, zero-filled, volatile memory, mapped lazily (pages are committed on first
/// touch) and page-aligned, as NIC registration prefers.
#[derive(Debug)]
pub struct DramBacking {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value and only accessed through atomics
// (`RegionMemory`) or by the NIC; moving or sharing the owner across threads is fine.
unsafe impl Send for DramBacking {}
// SAFETY: as above.
unsafe impl Sync for DramBacking {}

impl DramBacking {
    /// `len` bytes of zeroed DRAM, rounded up to a multiple of 8.
    ///
    /// # Panics
    /// If the memory cannot be mapped; use [`DramBacking::try_new`] to get an error instead.
    pub fn new(len: usize) -> Self {
        Self::try_new(len).expect("map anonymous memory")
    }

    /// `len` bytes of zeroed DRAM, or an error if the system refuses the mapping.
    pub fn try_new(len: usize) -> crate::Result<Self> {
        let len = len.max(8).div_ceil(8) * 8;
        // SAFETY: an anonymous private mapping with no address hint touches no existing
        // memory; the result is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(crate::Error::Registration(format!(
                "cannot map {len} bytes of memory: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for DramBacking {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `try_new`, unmapped once here;
        // every `RegionMemory` view holds an `Arc` to this backing, so none outlives it.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

impl Backing for DramBacking {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn media(&self) -> Media {
        Media::Dram
    }
    fn persist(&self, _offset: usize, _len: usize) -> std::io::Result<()> {
        Ok(())
    }
}

type PersistFn = Box<dyn Fn(usize, usize) -> std::io::Result<()> + Send + Sync>;
type WroteFn = Box<dyn Fn(usize, usize) + Send + Sync>;

/// Memory owned elsewhere (a mapped pool, say), registered through a pointer, a length and a
/// persist function. The owner is kept alive for as long as the backing is.
///
/// ```
/// use std::sync::Arc;
/// use dmkit_verbs::{Backing, FnBacking, Media};
/// let owner = Arc::new(vec![0u64; 512]);
/// let ptr = owner.as_ptr() as *mut u8;
/// // SAFETY (of the example): `owner` keeps the 4096 bytes alive and is only accessed through
/// // the verbs layer from now on.
/// let b = unsafe { FnBacking::new(owner, ptr, 4096, Media::Dram, |_, _| Ok(())) };
/// assert_eq!(b.len(), 4096);
/// ```
pub struct FnBacking {
    _owner: Arc<dyn std::any::Any + Send + Sync>,
    ptr: *mut u8,
    len: usize,
    media: Media,
    persist: PersistFn,
    wrote: Option<WroteFn>,
}

// SAFETY: the memory is owned by `_owner` (Send + Sync) and only accessed through atomics or
// the NIC; the persist function is Send + Sync.
unsafe impl Send for FnBacking {}
// SAFETY: as above.
unsafe impl Sync for FnBacking {}

impl FnBacking {
    /// Wraps `len` bytes at `ptr`, owned by `owner`; `persist(offset, len)` makes a range
    /// durable.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for as long as `owner` lives, and must not be accessed
    /// other than through atomics (or by the NIC) while registered.
    pub unsafe fn new(
        owner: Arc<dyn std::any::Any + Send + Sync>,
        ptr: *mut u8,
        len: usize,
        media: Media,
        persist: impl Fn(usize, usize) -> std::io::Result<()> + Send + Sync + 'static,
    ) -> Self {
        Self {
            _owner: owner,
            ptr,
            len,
            media,
            persist: Box::new(persist),
            wrote: None,
        }
    }

    /// Calls `wrote(offset, len)` after every verb that changes the memory (see
    /// [`Backing::wrote`]).
    pub fn with_write_hook(mut self, wrote: impl Fn(usize, usize) + Send + Sync + 'static) -> Self {
        self.wrote = Some(Box::new(wrote));
        self
    }
}

impl std::fmt::Debug for FnBacking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnBacking")
            .field("len", &self.len)
            .field("media", &self.media)
            .finish()
    }
}

impl Backing for FnBacking {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn media(&self) -> Media {
        self.media
    }
    fn persist(&self, offset: usize, len: usize) -> std::io::Result<()> {
        (self.persist)(offset, len)
    }
    fn wrote(&self, offset: usize, len: usize) {
        if let Some(f) = &self.wrote {
            f(offset, len);
        }
    }
}

/// A word-atomic view of a [`Backing`]. Cloning shares the memory.
#[derive(Debug, Clone)]
pub struct RegionMemory {
    backing: Arc<dyn Backing>,
    // Derived from `backing`, which outlives it because we hold the Arc.
    ptr: *const AtomicU64,
    words: usize,
}

// SAFETY: the memory is only ever accessed through `AtomicU64`, which is Sync; the backing is
// Send + Sync and kept alive by the Arc.
unsafe impl Send for RegionMemory {}
// SAFETY: as above.
unsafe impl Sync for RegionMemory {}

impl RegionMemory {
    /// Wraps a backing. Fails when it is misaligned or its length is not a multiple of 8.
    pub fn new(backing: Arc<dyn Backing>) -> Result<Self> {
        let ptr = backing.as_ptr();
        let len = backing.len();
        if ptr.is_null() || (ptr as usize) % 8 != 0 {
            return Err(crate::Error::Registration(format!(
                "memory at {ptr:p} is not 8-byte aligned"
            )));
        }
        if len % 8 != 0 {
            return Err(crate::Error::Registration(format!(
                "length {len} is not a multiple of 8"
            )));
        }
        Ok(Self {
            ptr: ptr as *const AtomicU64,
            words: len / 8,
            backing,
        })
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `Backing::as_ptr` promises `len()` valid bytes for as long as the backing
        // lives (we hold it); the pointer is 8-aligned (checked in `new`); AtomicU64 has the
        // size and alignment of u64 and every access to this memory is atomic, so shared
        // references are sound even with concurrent writers (including other processes or a
        // NIC, whose accesses are outside the Rust abstract machine).
        unsafe { std::slice::from_raw_parts(self.ptr, self.words) }
    }

    pub fn len(&self) -> usize {
        self.words * 8
    }

    pub fn is_empty(&self) -> bool {
        self.words == 0
    }

    pub fn media(&self) -> Media {
        self.backing.media()
    }

    pub fn backing(&self) -> &Arc<dyn Backing> {
        &self.backing
    }

    /// Tells the backing a verb changed `[off, off + len)` ([`Backing::wrote`]).
    pub fn wrote(&self, off: usize, len: usize) {
        self.backing.wrote(off, len);
    }

    fn check(&self, off: usize, len: usize) -> Result<(), AccessFault> {
        if off.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(AccessFault::OutOfBounds);
        }
        Ok(())
    }

    fn check_atomic(&self, off: usize) -> Result<&AtomicU64, AccessFault> {
        self.check(off, 8)?;
        if off % 8 != 0 {
            return Err(AccessFault::Misaligned);
        }
        Ok(&self.words()[off / 8])
    }

    /// Copies `out.len()` bytes from `off`. Whole aligned words are read atomically.
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<(), AccessFault> {
        self.check(off, out.len())?;
        let words = self.words();
        // A partial first word, then whole words (a fixed-size copy each), then a partial
        // last word.
        let skip = off % 8;
        let head = if skip == 0 {
            0
        } else {
            let n = (8 - skip).min(out.len());
            let w = words[off / 8].load(Ordering::Acquire).to_le_bytes();
            out[..n].copy_from_slice(&w[skip..skip + n]);
            n
        };
        let first = (off + head) / 8;
        let mut whole = out[head..].chunks_exact_mut(8);
        let mut i = first;
        for chunk in &mut whole {
            chunk.copy_from_slice(&words[i].load(Ordering::Acquire).to_le_bytes());
            i += 1;
        }
        let tail = whole.into_remainder();
        if !tail.is_empty() {
            let w = words[i].load(Ordering::Acquire).to_le_bytes();
            tail.copy_from_slice(&w[..tail.len()]);
        }
        Ok(())
    }

    /// Copies `data` to `off`. Whole aligned words are stored atomically; partial words are
    /// merged with a CAS loop so neighbouring bytes written concurrently are never lost.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<(), AccessFault> {
        self.check(off, data.len())?;
        let words = self.words();
        let mut pos = 0;
        while pos < data.len() {
            let at = off + pos;
            let skip = at % 8;
            let n = (8 - skip).min(data.len() - pos);
            let word = &words[at / 8];
            if n == 8 {
                let v = u64::from_le_bytes(data[pos..pos + 8].try_into().expect("8 bytes"));
                word.store(v, Ordering::Release);
            } else {
                let mut cur = word.load(Ordering::Acquire);
                loop {
                    let mut b = cur.to_le_bytes();
                    b[skip..skip + n].copy_from_slice(&data[pos..pos + n]);
                    match word.compare_exchange_weak(
                        cur,
                        u64::from_le_bytes(b),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => break,
                        Err(now) => cur = now,
                    }
                }
            }
            pos += n;
        }
        Ok(())
    }

    /// Compare-and-swap on the 8-aligned word at `off`; returns the old value.
    pub fn cas(&self, off: usize, expect: u64, new: u64) -> Result<u64, AccessFault> {
        let w = self.check_atomic(off)?;
        Ok(
            match w.compare_exchange(expect, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Fetch-and-add on the 8-aligned word at `off` (wrapping); returns the old value.
    pub fn faa(&self, off: usize, add: u64) -> Result<u64, AccessFault> {
        Ok(self.check_atomic(off)?.fetch_add(add, Ordering::AcqRel))
    }

    /// Atomically loads the 8-aligned word at `off`.
    pub fn load_u64(&self, off: usize) -> Result<u64, AccessFault> {
        Ok(self.check_atomic(off)?.load(Ordering::Acquire))
    }

    /// Atomically stores the 8-aligned word at `off`.
    pub fn store_u64(&self, off: usize, v: u64) -> Result<(), AccessFault> {
        self.check_atomic(off)?.store(v, Ordering::Release);
        Ok(())
    }

    /// Makes a range durable (no-op on DRAM).
    pub fn persist(&self, off: usize, len: usize) -> Result<(), AccessFault> {
        self.check(off, len)?;
        self.backing
            .persist(off, len)
            .map_err(|_| AccessFault::PersistFailed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(len: usize) -> RegionMemory {
        RegionMemory::new(Arc::new(DramBacking::new(len))).unwrap()
    }

    #[test]
    fn unaligned_write_preserves_neighbouring_bytes() {
        let m = mem(64);
        m.write(0, &[0xAA; 24]).unwrap();
        m.write(3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap();
        let mut out = [0u8; 24];
        m.read(0, &mut out).unwrap();
        assert_eq!(&out[..3], &[0xAA; 3]);
        assert_eq!(&out[3..13], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(&out[13..], &[0xAA; 11]);
    }

    #[test]
    fn reads_at_every_offset_and_length_return_the_bytes_written() {
        let m = mem(48);
        let bytes: Vec<u8> = (1..=48).collect();
        m.write(0, &bytes).unwrap();
        for off in 0..48 {
            for len in 0..=48 - off {
                let mut out = vec![0u8; len];
                m.read(off, &mut out).unwrap();
                assert_eq!(out, &bytes[off..off + len], "read({off}, {len})");
            }
        }
    }

    #[test]
    fn out_of_bounds_is_refused_without_touching_memory() {
        let m = mem(16);
        assert_eq!(m.write(10, &[1; 8]), Err(AccessFault::OutOfBounds));
        assert_eq!(m.write(usize::MAX, &[1; 8]), Err(AccessFault::OutOfBounds));
        let mut out = [9u8; 16];
        m.read(0, &mut out).unwrap();
        assert_eq!(out, [0; 16]);
    }

    #[test]
    fn dram_is_zeroed_page_aligned_and_huge_requests_fail_cleanly() {
        let d = DramBacking::new(100);
        assert_eq!(d.len(), 104);
        assert_eq!(d.as_ptr() as usize % 4096, 0);
        let m = RegionMemory::new(Arc::new(d)).unwrap();
        let mut out = [1u8; 104];
        m.read(0, &mut out).unwrap();
        assert_eq!(out, [0; 104]);
        assert!(DramBacking::try_new(usize::MAX / 2).is_err());
    }

    #[test]
    fn misaligned_atomic_is_refused() {
        let m = mem(16);
        assert_eq!(m.cas(4, 0, 1), Err(AccessFault::Misaligned));
        assert_eq!(m.faa(12, 1), Err(AccessFault::OutOfBounds));
        assert_eq!(m.faa(8, 5), Ok(0));
        assert_eq!(m.cas(8, 5, 7), Ok(5));
        assert_eq!(m.load_u64(8), Ok(7));
    }
}
