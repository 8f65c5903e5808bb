//! The versioned on-media layout.
//!
//! ```text
//! 0                 superblock (one 4 KiB page; the first 128 bytes are used, crc32c-sealed)
//! log_offset        redo log: commit word, then (target, value) entries
//! table_offset      block table: one 8-byte owner word per block (0 = free)
//! class_offset      class table: one 8-byte size-class word per block (0 = none)
//! data_offset       data area: block_count blocks of block_size bytes (page-aligned)
//! ```
//!
//! The superblock is written once by `create` and only read afterwards, so it needs no update
//! protocol: a crash during `create` leaves a pool that `open` rejects with a clear error.

use crate::error::{Error, Result};

/// First 8 bytes of every pool.
pub const MAGIC: [u8; 8] = *b"DMKPOOL\0";
/// The layout version this build reads and writes.
pub const VERSION: u32 = 1;
/// Bytes reserved for the superblock (one page).
pub const SUPERBLOCK_LEN: usize = 4096;
/// Bytes of the superblock that are encoded and checksummed.
pub(crate) const SUPERBLOCK_USED: usize = 128;
const CHECKSUM_AT: usize = SUPERBLOCK_USED - 4;
/// Alignment of every region.
pub(crate) const PAGE: usize = 4096;
/// Smallest block.
pub const MIN_BLOCK_SIZE: usize = 4096;
/// Largest number of entries one redo-log transaction holds.
pub(crate) const MAX_LOG_ENTRIES: usize = 65536;
/// Offset of the first log entry from the start of the log (the commit word has its own line).
pub(crate) const LOG_ENTRIES_AT: usize = 64;
/// Bytes per log entry.
pub(crate) const LOG_ENTRY_LEN: usize = 16;

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|n| n / to * to)
}

/// Where everything is; derived from (size, block size) at create, read from the superblock at
/// open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub pool_len: usize,
    pub block_size: usize,
    pub block_count: usize,
    pub log_offset: usize,
    pub log_capacity: usize,
    pub table_offset: usize,
    pub class_offset: usize,
    pub data_offset: usize,
}

impl Geometry {
    /// Lays out metadata for `block_count` blocks; `None` on overflow.
    pub(crate) fn for_blocks(block_size: usize, block_count: usize) -> Option<Geometry> {
        let log_capacity = block_count.clamp(1, MAX_LOG_ENTRIES);
        let log_offset = SUPERBLOCK_LEN;
        let log_len = round_up(LOG_ENTRIES_AT + log_capacity * LOG_ENTRY_LEN, PAGE)?;
        let table_offset = log_offset.checked_add(log_len)?;
        let table_len = round_up(block_count.checked_mul(8)?, PAGE)?.max(PAGE);
        let class_offset = table_offset.checked_add(table_len)?;
        let data_offset = class_offset.checked_add(table_len)?;
        let pool_len = data_offset.checked_add(block_count.checked_mul(block_size)?)?;
        Some(Geometry {
            pool_len,
            block_size,
            block_count,
            log_offset,
            log_capacity,
            table_offset,
            class_offset,
            data_offset,
        })
    }

    /// The most blocks of `block_size` that fit in `size` bytes with their metadata.
    pub fn compute(size: usize, block_size: usize) -> Result<Geometry> {
        if !block_size.is_power_of_two() || block_size < MIN_BLOCK_SIZE {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "block size {block_size} must be a power of two of at least {MIN_BLOCK_SIZE}"
                ),
            });
        }
        let needed = Geometry::for_blocks(block_size, 1).expect("one block never overflows");
        let mut n = size / block_size;
        while n > 0 {
            match Geometry::for_blocks(block_size, n) {
                Some(g) if g.pool_len <= size => return Ok(g),
                Some(g) => {
                    let meta = g.data_offset;
                    n = (n - 1).min(size.saturating_sub(meta) / block_size);
                }
                None => n /= 2,
            }
        }
        Err(Error::FileTooSmall {
            pool: "<new pool>".into(),
            len: size as u64,
            needed: needed.pool_len as u64,
        })
    }

    pub fn data_len(&self) -> usize {
        self.block_count * self.block_size
    }

    #[cfg(test)]
    pub fn table_len(&self) -> usize {
        self.class_offset - self.table_offset
    }

    /// Checks a geometry read from media; `reason` on failure.
    fn validate(&self) -> std::result::Result<(), String> {
        if !self.block_size.is_power_of_two() || self.block_size < MIN_BLOCK_SIZE {
            return Err(format!(
                "block size {} is not a power of two >= 4096",
                self.block_size
            ));
        }
        if self.block_count == 0 {
            return Err("no blocks".into());
        }
        match Geometry::for_blocks(self.block_size, self.block_count) {
            Some(expected) if expected == *self => Ok(()),
            Some(expected) => Err(format!(
                "regions {self:?} differ from the layout of {} blocks of {} bytes ({expected:?})",
                self.block_count, self.block_size
            )),
            None => Err(format!(
                "{} blocks of {} bytes overflow the address space",
                self.block_count, self.block_size
            )),
        }
    }
}

/// The decoded superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub uuid: [u8; 16],
    pub geometry: Geometry,
}

fn put(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

impl Superblock {
    /// Encodes into the first [`SUPERBLOCK_USED`] bytes, checksum last.
    pub fn encode(&self) -> [u8; SUPERBLOCK_USED] {
        let g = &self.geometry;
        let mut b = [0u8; SUPERBLOCK_USED];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SUPERBLOCK_USED as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        for (i, v) in [
            g.pool_len,
            g.block_size,
            g.block_count,
            g.log_offset,
            g.log_capacity,
            g.table_offset,
            g.class_offset,
            g.data_offset,
        ]
        .into_iter()
        .enumerate()
        {
            put(&mut b, 32 + 8 * i, v as u64);
        }
        let crc = crc32c::crc32c(&b[..CHECKSUM_AT]);
        b[CHECKSUM_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and validates a superblock; `medium_len` is the size of the file or mapping.
    pub fn decode(b: &[u8], pool: &str, medium_len: u64) -> Result<Superblock> {
        let needed = (SUPERBLOCK_LEN + 3 * PAGE) as u64;
        if b.len() < SUPERBLOCK_USED || medium_len < needed {
            return Err(Error::FileTooSmall {
                pool: pool.into(),
                len: medium_len.min(b.len() as u64),
                needed,
            });
        }
        let magic: [u8; 8] = b[0..8].try_into().expect("8 bytes");
        if magic != MAGIC {
            return Err(Error::BadMagic {
                pool: pool.into(),
                found: magic,
                expected: MAGIC,
            });
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(Error::VersionMismatch {
                pool: pool.into(),
                found: version,
                supported: VERSION,
            });
        }
        let stored = u32::from_le_bytes(b[CHECKSUM_AT..SUPERBLOCK_USED].try_into().expect("4"));
        let computed = crc32c::crc32c(&b[..CHECKSUM_AT]);
        if stored != computed {
            return Err(Error::ChecksumMismatch {
                pool: pool.into(),
                what: "superblock",
                stored,
                computed,
            });
        }
        let corrupt = |reason: String| Error::CorruptSuperblock {
            pool: pool.into(),
            reason,
        };
        let used = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
        if used as usize != SUPERBLOCK_USED {
            return Err(corrupt(format!(
                "header length {used}, expected {SUPERBLOCK_USED}"
            )));
        }
        let mut field = [0usize; 8];
        for (i, f) in field.iter_mut().enumerate() {
            let v = get(b, 32 + 8 * i);
            *f = usize::try_from(v)
                .map_err(|_| corrupt(format!("field {i} ({v}) exceeds the address space")))?;
        }
        let geometry = Geometry {
            pool_len: field[0],
            block_size: field[1],
            block_count: field[2],
            log_offset: field[3],
            log_capacity: field[4],
            table_offset: field[5],
            class_offset: field[6],
            data_offset: field[7],
        };
        geometry.validate().map_err(corrupt)?;
        if (geometry.pool_len as u64) > medium_len {
            return Err(Error::FileTooSmall {
                pool: pool.into(),
                len: medium_len,
                needed: geometry.pool_len as u64,
            });
        }
        Ok(Superblock {
            uuid: b[16..32].try_into().expect("16 bytes"),
            geometry,
        })
    }
}

#[cfg(test)]
pub(crate) use dmkit_verbs::wire::hex_dump;

#[cfg(test)]
mod tests {
    use super::*;

    /// The superblock's 128 bytes for a 1 MiB pool of 4 KiB blocks with a fixed uuid. A
    /// change here is a layout change: bump [`VERSION`] (old pools must still open or be
    /// refused clearly).
    #[test]
    fn superblock_bytes_are_pinned() {
        let mut uuid = [0u8; 16];
        for (i, b) in uuid.iter_mut().enumerate() {
            *b = 0xa0 + i as u8;
        }
        let sb = Superblock {
            uuid,
            geometry: Geometry::compute(1 << 20, 4096).unwrap(),
        };
        let bytes = sb.encode();
        assert_eq!(Superblock::decode(&bytes, "p", 1 << 20).unwrap(), sb);
        insta::assert_snapshot!(format!("{:?}\n{}", sb.geometry, hex_dump(&bytes)));
    }

    fn sample() -> Superblock {
        Superblock {
            uuid: [7; 16],
            geometry: Geometry::compute(1 << 20, 4096).unwrap(),
        }
    }

    #[test]
    fn geometry_fits_the_size_and_aligns_every_region() {
        for (size, bs) in [
            (1 << 20, 4096),
            (64 << 20, 1 << 20),
            (100_000, 4096),
            (3 << 30, 2 << 20),
        ] {
            let g = Geometry::compute(size, bs).unwrap();
            assert!(g.pool_len <= size);
            assert!(
                size - g.pool_len < 2 * bs + g.data_offset,
                "wastes too much: {g:?}"
            );
            for off in [g.log_offset, g.table_offset, g.class_offset, g.data_offset] {
                assert_eq!(off % PAGE, 0);
            }
            assert!(g.table_len() >= g.block_count * 8);
            g.validate().unwrap();
        }
    }

    #[test]
    fn too_small_sizes_and_bad_block_sizes_are_rejected() {
        assert!(matches!(
            Geometry::compute(8192, 4096),
            Err(Error::FileTooSmall { .. })
        ));
        assert!(matches!(
            Geometry::compute(1 << 20, 5000),
            Err(Error::InvalidOptions { .. })
        ));
        assert!(matches!(
            Geometry::compute(1 << 20, 2048),
            Err(Error::InvalidOptions { .. })
        ));
    }

    #[test]
    fn superblock_round_trips() {
        let sb = sample();
        let bytes = sb.encode();
        assert_eq!(Superblock::decode(&bytes, "p", 1 << 20).unwrap(), sb);
    }

    #[test]
    fn every_single_byte_corruption_is_detected() {
        let bytes = sample().encode();
        for i in 0..SUPERBLOCK_USED {
            let mut bad = bytes;
            bad[i] ^= 0x40;
            assert!(Superblock::decode(&bad, "p", 1 << 20).is_err(), "byte {i}");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let mut b = sample().encode();
        b[8] = 9;
        match Superblock::decode(&b, "p", 1 << 20) {
            Err(Error::VersionMismatch {
                found: 9,
                supported: VERSION,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let b = sample().encode();
        assert!(matches!(
            Superblock::decode(&b, "p", 1 << 19),
            Err(Error::FileTooSmall { .. })
        ));
        assert!(matches!(
            Superblock::decode(&[0u8; 128], "p", 1 << 20),
            Err(Error::BadMagic { .. })
        ));
        assert!(matches!(
            Superblock::decode(&b[..16], "p", 1 << 20),
            Err(Error::FileTooSmall { .. })
        ));
    }

    #[test]
    fn a_checksummed_but_inconsistent_superblock_is_corrupt_not_a_panic() {
        let mut sb = sample();
        sb.geometry.data_offset += 8;
        let b = sb.encode();
        assert!(matches!(
            Superblock::decode(&b, "p", 1 << 20),
            Err(Error::CorruptSuperblock { .. })
        ));
        let mut sb = sample();
        sb.geometry.block_count = usize::MAX / 2;
        assert!(Superblock::decode(&sb.encode(), "p", u64::MAX).is_err());
    }
}
