//! A pool file mapped with libpmem (feature `libpmem`).

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::region::region_access;
use super::{Medium, MediumKind, Region};
use crate::error::{Error, Result};

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn,
    missing_debug_implementations,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/libpmem_sys.rs"));
}

fn last_error() -> String {
    // SAFETY: pmem_errormsg returns a pointer to a thread-local NUL-terminated string (never
    // null per its manual; checked anyway), valid until the next libpmem call on this thread.
    unsafe {
        let msg = sys::pmem_errormsg();
        if msg.is_null() {
            "unknown libpmem error".to_string()
        } else {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        }
    }
}

/// A pool file mapped with `pmem_map_file`, persisted with `pmem_persist` when the mapping is
/// real persistent memory (`pmem_is_pmem`) and with `pmem_msync` otherwise.
#[derive(Debug)]
pub struct LibpmemFile {
    region: Region,
    path: PathBuf,
    is_pmem: bool,
}

impl LibpmemFile {
    /// Creates `path` (it must not exist) with `len` bytes and maps it.
    pub fn create(path: &Path, len: usize) -> Result<Self> {
        let flags = (sys::PMEM_FILE_CREATE | sys::PMEM_FILE_EXCL) as i32;
        Self::map(path, len, flags, 0o666)
    }

    /// Maps all of the existing file `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::map(path, 0, 0, 0)
    }

    fn map(path: &Path, len: usize, flags: i32, mode: libc::mode_t) -> Result<Self> {
        use std::os::unix::ffi::OsStrExt;
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| Error::Libpmem {
            op: "pmem_map_file",
            path: path.to_path_buf(),
            message: "path contains a NUL byte".into(),
        })?;
        let mut mapped_len: usize = 0;
        let mut is_pmem: i32 = 0;
        // SAFETY: `cpath` is a valid NUL-terminated string; the out-pointers point to live
        // locals; libpmem returns a fresh mapping or null.
        let ptr = unsafe {
            sys::pmem_map_file(
                cpath.as_ptr(),
                len,
                flags,
                mode,
                &mut mapped_len,
                &mut is_pmem,
            )
        };
        let Some(ptr) = NonNull::new(ptr.cast::<u8>()) else {
            return Err(Error::Libpmem {
                op: "pmem_map_file",
                path: path.to_path_buf(),
                message: last_error(),
            });
        };
        // SAFETY: pmem_map_file returned a page-aligned mapping of `mapped_len` bytes that
        // stays mapped until `drop` calls pmem_unmap.
        let region = unsafe { Region::new(ptr, mapped_len) };
        Ok(LibpmemFile {
            region,
            path: path.to_path_buf(),
            is_pmem: is_pmem != 0,
        })
    }

    /// Whether libpmem found the mapping to be real persistent memory (flushes from user space).
    pub fn is_pmem(&self) -> bool {
        self.is_pmem
    }
}

impl Drop for LibpmemFile {
    fn drop(&mut self) {
        // SAFETY: the region is exactly the mapping pmem_map_file made; it is being dropped,
        // so no reference into it survives.
        let _ = unsafe { sys::pmem_unmap(self.region.as_ptr().cast(), self.region.len()) };
    }
}

impl Medium for LibpmemFile {
    fn kind(&self) -> MediumKind {
        MediumKind::Libpmem
    }
    fn location(&self) -> String {
        self.path.display().to_string()
    }
    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }
    fn is_persistent(&self) -> bool {
        true
    }
    region_access!();
    fn persist(&self, offset: usize, len: usize) -> Result<()> {
        self.region.check(offset, len);
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range is inside the mapping (checked); both calls only flush it.
        unsafe {
            let addr = self.region.as_ptr().add(offset).cast::<std::ffi::c_void>();
            if self.is_pmem {
                sys::pmem_persist(addr, len);
            } else if sys::pmem_msync(addr, len) != 0 {
                return Err(Error::Libpmem {
                    op: "pmem_msync",
                    path: self.path.clone(),
                    message: last_error(),
                });
            }
        }
        Ok(())
    }
    fn write_persist(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.region.check(offset, data.len());
        if !self.is_pmem {
            self.write(offset, data);
            return self.persist(offset, data.len());
        }
        // SAFETY: the destination is inside the mapping (checked); `data` is a separate Rust
        // allocation, so the ranges do not overlap.
        unsafe {
            sys::pmem_memcpy_persist(
                self.region.as_ptr().add(offset).cast(),
                data.as_ptr().cast(),
                data.len(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpmem_file_round_trips_through_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        {
            let m = LibpmemFile::create(&path, 8192).unwrap();
            assert_eq!(m.len(), 8192);
            m.store_u64(64, 99);
            m.persist(64, 8).unwrap();
            m.write_persist(128, b"durable!").unwrap();
        }
        let m = LibpmemFile::open(&path).unwrap();
        assert_eq!(m.load_u64(64), 99);
        let mut buf = [0; 8];
        m.read(128, &mut buf);
        assert_eq!(&buf, b"durable!");
        // tmpfs is not pmem; whichever it is, persist must have worked.
        let _ = m.is_pmem();
    }

    #[test]
    fn libpmem_create_refuses_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        std::fs::write(&path, b"x").unwrap();
        let err = LibpmemFile::create(&path, 8192).unwrap_err();
        assert!(matches!(err, Error::Libpmem { .. }), "{err}");
    }
}
