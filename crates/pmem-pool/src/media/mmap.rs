//! Media mapped with plain `mmap`: a shared file mapping persisted with `msync`, and anonymous
//! DRAM.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::region::region_access;
use super::{Medium, MediumKind, Region};
use crate::error::{Error, Result};

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| *s > 0)
        .unwrap_or(4096)
}

/// Maps `len` bytes: shared over `file`, or private anonymous memory when `file` is `None`.
fn map(file: Option<&File>, len: usize) -> io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot map 0 bytes",
        ));
    }
    let (flags, fd) = match file {
        Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
        None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
    };
    // SAFETY: a fresh mapping at an address the kernel chooses; `fd` is open for reading and
    // writing (or -1 for an anonymous mapping); nothing else aliases the new range.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

fn unmap(region: &Region) {
    // SAFETY: the region is exactly one mapping made by `map`, and it is being dropped, so no
    // reference into it survives this call.
    let _ = unsafe { libc::munmap(region.as_ptr().cast(), region.len()) };
}

/// A pool file mapped with `mmap(MAP_SHARED)` and persisted with `msync(MS_SYNC)`.
#[derive(Debug)]
pub struct MmapFile {
    region: Region,
    path: PathBuf,
    page: usize,
    _file: File,
}

impl MmapFile {
    /// Creates `path` (it must not exist), sizes it to `len` bytes with blocks reserved on the
    /// file system, and maps it.
    pub fn create(path: &Path, len: usize) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::io("create", path, e))?;
        let size = u64::try_from(len).map_err(|_| Error::InvalidOptions {
            reason: format!("size {len} does not fit a file"),
        })?;
        file.set_len(size)
            .map_err(|e| Error::io("set_len", path, e))?;
        reserve(&file, size).map_err(|e| Error::io("fallocate", path, e))?;
        Self::map_file(file, path, len)
    }

    /// Opens and maps all of the existing file `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io("open", path, e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::io("stat", path, e))?
            .len();
        let len = usize::try_from(size).map_err(|_| {
            Error::io(
                "mmap",
                path,
                io::Error::other("file larger than the address space"),
            )
        })?;
        Self::map_file(file, path, len)
    }

    fn map_file(file: File, path: &Path, len: usize) -> Result<Self> {
        let ptr = map(Some(&file), len).map_err(|e| Error::io("mmap", path, e))?;
        // SAFETY: `map` returned a page-aligned shared mapping of `len` bytes that stays mapped
        // until `drop` unmaps it, after the region's last use.
        let region = unsafe { Region::new(ptr, len) };
        Ok(MmapFile {
            region,
            path: path.to_path_buf(),
            page: page_size(),
            _file: file,
        })
    }
}

/// Reserves the file's blocks so that a full file system fails here, not as SIGBUS later.
fn reserve(file: &File, size: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(size).map_err(|_| io::Error::other("size too large"))?;
    // SAFETY: the descriptor is open for writing; posix_fallocate only changes the file.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    match rc {
        0 => Ok(()),
        // Some file systems cannot preallocate; the sparse file still works.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

impl Drop for MmapFile {
    fn drop(&mut self) {
        unmap(&self.region);
    }
}

impl Medium for MmapFile {
    fn kind(&self) -> MediumKind {
        MediumKind::MmapFile
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
        let end = offset + len;
        if len == 0 {
            return Ok(());
        }
        // msync wants a page-aligned start.
        let start = offset - offset % self.page;
        // SAFETY: [start, end) lies inside the mapping (start is rounded down to the page of
        // an in-bounds offset, and the mapping base is page-aligned); msync does not write.
        let rc = unsafe {
            libc::msync(
                self.region.as_ptr().add(start).cast(),
                end - start,
                libc::MS_SYNC,
            )
        };
        if rc != 0 {
            return Err(Error::io("msync", &self.path, io::Error::last_os_error()));
        }
        Ok(())
    }
}

/// Anonymous DRAM: a volatile pool, for DRAM buffers and for tests. Persist is a no-op.
#[derive(Debug)]
pub struct DramMedium {
    region: Region,
}

impl DramMedium {
    /// Maps `len` bytes of zeroed anonymous memory.
    pub fn new(len: usize) -> Result<Self> {
        let ptr = map(None, len).map_err(|e| Error::io("mmap", "<dram>", e))?;
        // SAFETY: `map` returned a page-aligned private mapping of `len` bytes that stays
        // mapped until `drop` unmaps it.
        let region = unsafe { Region::new(ptr, len) };
        Ok(DramMedium { region })
    }
}

impl Drop for DramMedium {
    fn drop(&mut self) {
        unmap(&self.region);
    }
}

impl Medium for DramMedium {
    fn kind(&self) -> MediumKind {
        MediumKind::Dram
    }
    fn location(&self) -> String {
        "<dram>".to_string()
    }
    fn path(&self) -> Option<&Path> {
        None
    }
    fn is_persistent(&self) -> bool {
        false
    }
    region_access!();
    fn persist(&self, offset: usize, len: usize) -> Result<()> {
        self.region.check(offset, len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_mapping_survives_reopen_after_persist() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        {
            let m = MmapFile::create(&path, 3 * 4096).unwrap();
            assert_eq!(m.len(), 3 * 4096);
            assert_eq!(m.as_ptr() as usize % 4096, 0);
            m.store_u64(4096 + 8, 42);
            m.write(2 * 4096 + 3, b"hello");
            m.persist(4096 + 8, 8).unwrap();
            m.persist(2 * 4096 + 3, 5).unwrap();
            m.persist(0, 0).unwrap();
        }
        let m = MmapFile::open(&path).unwrap();
        assert_eq!(m.load_u64(4096 + 8), 42);
        let mut buf = [0; 5];
        m.read(2 * 4096 + 3, &mut buf);
        assert_eq!(&buf, b"hello");
        assert!(m.is_persistent());
        assert_eq!(m.path(), Some(path.as_path()));
    }

    #[test]
    fn creating_an_existing_file_is_an_io_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        std::fs::write(&path, b"x").unwrap();
        let err = MmapFile::create(&path, 4096).unwrap_err();
        assert!(matches!(err, Error::Io { op: "create", .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn opening_a_missing_file_is_an_io_error() {
        let err = MmapFile::open(Path::new("/nonexistent/dmkit/pool")).unwrap_err();
        assert!(matches!(err, Error::Io { op: "open", .. }), "{err}");
    }

    #[test]
    fn dram_is_zeroed_volatile_and_writable() {
        let m = DramMedium::new(8192).unwrap();
        assert!(!m.is_persistent());
        assert_eq!(m.load_u64(8184), 0);
        m.store_u64(8184, 7);
        m.persist(0, 8192).unwrap();
        assert_eq!(m.load_u64(8184), 7);
        assert!(DramMedium::new(0).is_err());
    }
}
