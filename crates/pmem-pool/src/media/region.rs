//! Bounds-checked access to a mapped byte range: the one place where the pool's media are
//! dereferenced.
//!
//! Metadata words are read and written as `AtomicU64` so that an 8-byte store is one
//! instruction (failure-atomic on x86 and ARM persistent memory) and so that concurrent readers
//! of the data area (RDMA, other threads) never race with a torn metadata store.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// A mapped range of `len` bytes at `ptr`, owned by a medium that unmaps it after the region is
/// gone.
#[derive(Debug)]
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is a plain address range; every access goes through atomics or through
// `&mut`-free copies done by callers that hold the pool lock, so sharing it across threads is
// as safe as sharing the mapping itself.
unsafe impl Send for Region {}
// SAFETY: see `Send`; no method hands out references into the mapping.
unsafe impl Sync for Region {}

impl Region {
    /// Wraps a mapped range.
    ///
    /// # Safety
    /// `ptr` must be 8-byte aligned and valid for reads and writes of `len` bytes for as long
    /// as the returned region (and anything holding it) lives.
    pub(crate) unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        assert_eq!(
            ptr.as_ptr() as usize % 8,
            0,
            "mapping must be 8-byte aligned"
        );
        Region { ptr, len }
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Panics unless `[offset, offset + len)` lies inside the region.
    pub(crate) fn check(&self, offset: usize, len: usize) {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "access {offset:#x}+{len:#x} outside a {:#x}-byte mapping",
            self.len
        );
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        self.check(offset, 8);
        assert_eq!(
            offset % 8,
            0,
            "metadata word at unaligned offset {offset:#x}"
        );
        // SAFETY: in bounds and 8-aligned (checked above, base is 8-aligned); the mapping is
        // valid for the region's lifetime, which bounds the returned reference; AtomicU64 has
        // the layout of u64 and every access to metadata words is atomic.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast::<u64>()) }
    }

    /// Loads the aligned little-endian word at `offset`.
    pub(crate) fn load_u64(&self, offset: usize) -> u64 {
        u64::from_le(self.word(offset).load(Ordering::Acquire))
    }

    /// Stores the aligned word at `offset` with one 8-byte store.
    pub(crate) fn store_u64(&self, offset: usize, value: u64) {
        self.word(offset).store(value.to_le(), Ordering::Release);
    }

    /// Copies bytes out of the region.
    pub(crate) fn read(&self, offset: usize, buf: &mut [u8]) {
        self.check(offset, buf.len());
        // SAFETY: the source range is in bounds (checked) and valid while `self` lives; `buf`
        // is a distinct Rust allocation, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                buf.as_mut_ptr(),
                buf.len(),
            )
        }
    }

    /// Copies bytes into the region.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: the destination range is in bounds (checked) and writable while `self`
        // lives; `data` is a distinct Rust allocation, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        }
    }
}

/// The [`super::Medium`] methods a medium of this crate answers from its region (a field named
/// `region`): pointer, length, words and byte copies.
macro_rules! region_access {
    () => {
        fn as_ptr(&self) -> *mut u8 {
            self.region.as_ptr()
        }
        fn len(&self) -> usize {
            self.region.len()
        }
        fn load_u64(&self, offset: usize) -> u64 {
            self.region.load_u64(offset)
        }
        fn store_u64(&self, offset: usize, value: u64) {
            self.region.store_u64(offset, value)
        }
        fn read(&self, offset: usize, buf: &mut [u8]) {
            self.region.read(offset, buf)
        }
        fn write(&self, offset: usize, data: &[u8]) {
            self.region.write(offset, data)
        }
    };
}
pub(crate) use region_access;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_bytes_round_trip_within_bounds() {
        let mut backing = vec![0u64; 8];
        let ptr = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `backing` is 8-aligned, 64 bytes, and outlives `region`.
        let region = unsafe { Region::new(ptr, 64) };
        region.store_u64(8, 0x0102_0304_0506_0708);
        assert_eq!(region.load_u64(8), 0x0102_0304_0506_0708);
        let mut buf = [0u8; 3];
        region.read(8, &mut buf);
        assert_eq!(buf, [8, 7, 6]);
        region.write(60, &[1, 2, 3, 4]);
        assert_eq!(region.load_u64(56) >> 32, 0x0403_0201);
        assert_eq!(region.len(), 64);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_bounds_access_panics_instead_of_touching_memory() {
        let mut backing = vec![0u64; 2];
        let ptr = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `backing` is 8-aligned, 16 bytes, and outlives `region`.
        let region = unsafe { Region::new(ptr, 16) };
        region.write(10, &[0; 8]);
    }
}
