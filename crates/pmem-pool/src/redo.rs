//! A small redo log for metadata updates that span more than one 8-byte word.
//!
//! Protocol (each step persisted before the next):
//! 1. write the entries `(target offset, new value)`;
//! 2. store the commit word `count << 32 | crc32c(entries, count)` — the commit point;
//! 3. apply the entries with 8-byte stores;
//! 4. store 0 in the commit word.
//!
//! Recovery (in `open`) replays a committed log and clears it. Replaying is idempotent because
//! the values are absolute, and the commit word is cleared before any later update, so an old
//! log is never replayed over newer state.

use crate::error::{Error, Result};
use crate::layout::{Geometry, LOG_ENTRIES_AT, LOG_ENTRY_LEN};
use crate::media::Medium;

fn checksum(entries: &[u8], count: u32) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(entries), &count.to_le_bytes())
}

fn commit_word(entries: &[u8], count: u32) -> u64 {
    (u64::from(count) << 32) | u64::from(checksum(entries, count))
}

/// Whether `target` is a word the log may update: inside the block or class table.
fn valid_target(g: &Geometry, target: usize) -> bool {
    target % 8 == 0 && target >= g.table_offset && target < g.data_offset
}

/// Persists the smallest span covering every entry target.
fn persist_targets(m: &dyn Medium, entries: &[(usize, u64)]) -> Result<()> {
    let lo = entries.iter().map(|e| e.0).min();
    let hi = entries.iter().map(|e| e.0 + 8).max();
    if let (Some(lo), Some(hi)) = (lo, hi) {
        m.persist(lo, hi - lo)?;
    }
    Ok(())
}

/// Applies `entries` atomically with respect to crashes.
pub(crate) fn transact(m: &dyn Medium, g: &Geometry, entries: &[(usize, u64)]) -> Result<()> {
    assert!(entries.len() <= g.log_capacity, "redo log overflow");
    assert!(
        entries.iter().all(|e| valid_target(g, e.0)),
        "redo target outside the tables"
    );
    if entries.is_empty() {
        return Ok(());
    }
    let mut bytes = Vec::with_capacity(entries.len() * LOG_ENTRY_LEN);
    for (target, value) in entries {
        bytes.extend_from_slice(&(*target as u64).to_le_bytes());
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    let at = g.log_offset + LOG_ENTRIES_AT;
    m.write(at, &bytes);
    m.persist(at, bytes.len())?;
    m.store_u64(g.log_offset, commit_word(&bytes, entries.len() as u32));
    m.persist(g.log_offset, 8)?;
    for (target, value) in entries {
        m.store_u64(*target, *value);
    }
    persist_targets(m, entries)?;
    m.store_u64(g.log_offset, 0);
    m.persist(g.log_offset, 8)
}

/// Replays a committed log, if there is one; returns how many entries were replayed.
pub(crate) fn recover(m: &dyn Medium, g: &Geometry, pool: &str) -> Result<usize> {
    let word = m.load_u64(g.log_offset);
    if word == 0 {
        return Ok(0);
    }
    let count = (word >> 32) as usize;
    let stored = word as u32;
    if count == 0 || count > g.log_capacity {
        return Err(Error::CorruptMetadata {
            pool: pool.into(),
            reason: format!(
                "redo log commit word {word:#018x} claims {count} entries (capacity {})",
                g.log_capacity
            ),
        });
    }
    let mut bytes = vec![0u8; count * LOG_ENTRY_LEN];
    m.read(g.log_offset + LOG_ENTRIES_AT, &mut bytes);
    let computed = checksum(&bytes, count as u32);
    if computed != stored {
        return Err(Error::ChecksumMismatch {
            pool: pool.into(),
            what: "redo log",
            stored,
            computed,
        });
    }
    let mut entries = Vec::with_capacity(count);
    for chunk in bytes.chunks_exact(LOG_ENTRY_LEN) {
        let target = u64::from_le_bytes(chunk[..8].try_into().expect("8 bytes"));
        let value = u64::from_le_bytes(chunk[8..].try_into().expect("8 bytes"));
        let target = usize::try_from(target)
            .ok()
            .filter(|t| valid_target(g, *t))
            .ok_or_else(|| Error::CorruptMetadata {
                pool: pool.into(),
                reason: format!("redo log entry targets {target:#x}, outside the tables"),
            })?;
        entries.push((target, value));
    }
    for (target, value) in &entries {
        m.store_u64(*target, *value);
    }
    persist_targets(m, &entries)?;
    m.store_u64(g.log_offset, 0);
    m.persist(g.log_offset, 8)?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::DramMedium;

    fn setup() -> (DramMedium, Geometry) {
        let g = Geometry::compute(256 << 10, 4096).unwrap();
        (DramMedium::new(g.pool_len).unwrap(), g)
    }

    /// The redo log at its commit point: the commit word (count << 32 | crc32c), then from
    /// byte 64 the (target, value) entries. The entries are what `transact` left in the log.
    #[test]
    fn redo_log_bytes_are_pinned() {
        let (m, g) = setup();
        let entries = [
            (g.table_offset, 0x0102_0304_0506_0708),
            (g.table_offset + 64, 6),
            (g.class_offset, 7),
        ];
        transact(&m, &g, &entries).unwrap();
        let mut log = vec![0u8; LOG_ENTRIES_AT + entries.len() * LOG_ENTRY_LEN];
        m.read(g.log_offset, &mut log);
        let word = commit_word(&log[LOG_ENTRIES_AT..], entries.len() as u32);
        log[..8].copy_from_slice(&word.to_le_bytes());
        insta::assert_snapshot!(format!(
            "table at {:#x}, classes at {:#x}\n{}",
            g.table_offset,
            g.class_offset,
            crate::layout::hex_dump(&log)
        ));
    }

    #[test]
    fn a_transaction_applies_every_entry_and_clears_the_commit_word() {
        let (m, g) = setup();
        let entries = [
            (g.table_offset, 5),
            (g.table_offset + 64, 6),
            (g.class_offset, 7),
        ];
        transact(&m, &g, &entries).unwrap();
        for (t, v) in entries {
            assert_eq!(m.load_u64(t), v);
        }
        assert_eq!(m.load_u64(g.log_offset), 0);
        assert_eq!(recover(&m, &g, "p").unwrap(), 0);
    }

    #[test]
    fn a_committed_but_unapplied_log_is_replayed_on_recovery() {
        let (m, g) = setup();
        let entries = [(g.table_offset + 8, 11u64), (g.table_offset + 16, 12)];
        let mut bytes = Vec::new();
        for (t, v) in entries {
            bytes.extend_from_slice(&(t as u64).to_le_bytes());
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        m.write(g.log_offset + LOG_ENTRIES_AT, &bytes);
        m.store_u64(g.log_offset, commit_word(&bytes, 2));
        assert_eq!(recover(&m, &g, "p").unwrap(), 2);
        assert_eq!(m.load_u64(g.table_offset + 8), 11);
        assert_eq!(m.load_u64(g.table_offset + 16), 12);
        assert_eq!(m.load_u64(g.log_offset), 0);
    }

    #[test]
    fn a_corrupt_log_is_an_error_not_a_wild_write() {
        let (m, g) = setup();
        m.store_u64(g.log_offset, (1 << 32) | 0xdead);
        assert!(matches!(
            recover(&m, &g, "p"),
            Err(Error::ChecksumMismatch { .. })
        ));
        m.store_u64(g.log_offset, u64::MAX);
        assert!(matches!(
            recover(&m, &g, "p"),
            Err(Error::CorruptMetadata { .. })
        ));
        // A checksummed entry that points at the superblock is refused.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        m.write(g.log_offset + LOG_ENTRIES_AT, &bytes);
        m.store_u64(g.log_offset, commit_word(&bytes, 1));
        assert!(matches!(
            recover(&m, &g, "p"),
            Err(Error::CorruptMetadata { .. })
        ));
        assert_eq!(m.load_u64(0), 0);
    }
}
