//! How a value is stored in an object's value bytes: a kind byte, an optional deadline, then
//! the value itself or — for a value too large for one object — a manifest of its chunks.
//!
//! ```text
//! kind u8 | deadline u64 (if kind & EXPIRES) | value bytes          (kind & LARGE == 0)
//!                                            | manifest (44 bytes)  (kind & LARGE != 0)
//! manifest: len u64 | chunk_len u32 | chunks u32 | created_ms u64 | writer u64 | seq u64 | crc u32 ... (see `Manifest`)
//! ```
//!
//! **Expiry**: the deadline is a Unix time in milliseconds, by the writer's clock; a reader
//! compares it with its own ([`now_ms`]). A key whose deadline has passed reads as absent,
//! is replaced by an INSERT as if absent, and is deleted by whoever meets it (a conditional
//! delete of exactly that version, so a concurrent write is never lost) and by the
//! background sweep ([`crate::Client::reclaim_expired`]). Clocks of clients skew: a key
//! written with a deadline `d` by one client is seen as expired by another whose clock is
//! `s` ms ahead at (true) time `d - s`. The bound: a key expires, for every client, within
//! the clients' largest clock skew of its deadline.
//!
//! **Large values** are split into chunks, each stored under a key of its own in the
//! reserved key space ([`CHUNK_PREFIX`]), with the ordinary INSERT (so every chunk is as
//! crash-consistent as any object: logged, replicated, recovered). The chunks are written
//! first; then the key's manifest is written by one SNAPSHOT round, exactly as a small
//! value: a reader sees the whole new value or the whole old one, never a mix. Chunks are
//! immutable; the write that replaces or deletes a manifest deletes its chunks afterwards.
//! Chunks left by a writer that crashed before its manifest (or after, before deleting the
//! chunks it replaced) are found by the background sweep: a chunk older than the grace
//! period whose key's manifest does not name it is deleted. A writer that took longer than
//! half the grace period to write its chunks gives up (deletes them) rather than name chunks
//! the sweep may have taken — which is safe while clocks skew less than half the grace.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// Kind bit: a deadline follows the kind byte.
pub const EXPIRES: u8 = 1;
/// Kind bit: the value is a manifest of chunks.
pub const LARGE: u8 = 2;
/// Keys of chunks start with this (user keys may not).
pub const CHUNK_PREFIX: &[u8] = b"\xffdmkit:chunk\x00";
/// Length of a manifest.
pub const MANIFEST_LEN: usize = 8 + 4 + 4 + 8 + 8 + 8 + 4;

/// The client's clock: milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Where a large value's chunks are and how to check them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Manifest {
    /// The whole value's length.
    pub len: u64,
    /// Bytes per chunk (the last may be shorter).
    pub chunk_len: u32,
    pub chunks: u32,
    /// When the writer started writing the chunks (its clock).
    pub created_ms: u64,
    /// The writing client's id and its sequence number: with `created_ms`, unique.
    pub writer: u64,
    pub seq: u64,
    /// crc32c of the whole value.
    pub crc: u32,
}

impl Manifest {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.chunk_len.to_le_bytes());
        out.extend_from_slice(&self.chunks.to_le_bytes());
        out.extend_from_slice(&self.created_ms.to_le_bytes());
        out.extend_from_slice(&self.writer.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Option<Manifest> {
        if b.len() != MANIFEST_LEN {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let m = Manifest {
            len: u64_at(0),
            chunk_len: u32_at(8),
            chunks: u32_at(12),
            created_ms: u64_at(16),
            writer: u64_at(24),
            seq: u64_at(32),
            crc: u32_at(40),
        };
        let ok = m.chunk_len > 0 && u64::from(m.chunks) == m.len.div_ceil(u64::from(m.chunk_len));
        ok.then_some(m)
    }

    /// The key of chunk `i` of `key`'s value.
    pub fn chunk_key(&self, key: &[u8], i: u32) -> Vec<u8> {
        let mut k = Vec::with_capacity(CHUNK_PREFIX.len() + 28 + key.len());
        k.extend_from_slice(CHUNK_PREFIX);
        k.extend_from_slice(&self.created_ms.to_be_bytes());
        k.extend_from_slice(&self.writer.to_be_bytes());
        k.extend_from_slice(&self.seq.to_be_bytes());
        k.extend_from_slice(&i.to_be_bytes());
        k.extend_from_slice(key);
        k
    }

    /// The byte range of chunk `i` in the value.
    pub fn range(&self, i: u32) -> std::ops::Range<usize> {
        let start = u64::from(i) * u64::from(self.chunk_len);
        let end = (start + u64::from(self.chunk_len)).min(self.len);
        start as usize..end as usize
    }
}

/// A chunk key's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkKey<'a> {
    pub created_ms: u64,
    pub writer: u64,
    pub seq: u64,
    pub index: u32,
    /// The key whose value the chunk is part of.
    pub key: &'a [u8],
}

/// The parts of a chunk key, or `None` for any other key.
pub fn parse_chunk_key(k: &[u8]) -> Option<ChunkKey<'_>> {
    let rest = k.strip_prefix(CHUNK_PREFIX)?;
    if rest.len() < 28 {
        return None;
    }
    let u64_at = |o: usize| u64::from_be_bytes(rest[o..o + 8].try_into().expect("8 bytes"));
    Some(ChunkKey {
        created_ms: u64_at(0),
        writer: u64_at(8),
        seq: u64_at(16),
        index: u32::from_be_bytes(rest[24..28].try_into().expect("4 bytes")),
        key: &rest[28..],
    })
}

/// Whether `key` is in the reserved key space (chunks).
pub fn is_reserved(key: &[u8]) -> bool {
    key.starts_with(CHUNK_PREFIX)
}

/// What a stored value holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body<'a> {
    Inline(&'a [u8]),
    Large(Manifest),
}

/// A stored value, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// Unix milliseconds after which the key is absent.
    pub deadline: Option<u64>,
    pub body: Body<'a>,
}

impl Decoded<'_> {
    /// Whether the deadline has passed at `now` (Unix milliseconds).
    pub fn expired(&self, now: u64) -> bool {
        self.deadline.is_some_and(|d| d <= now)
    }
}

fn header(kind: u8, deadline: Option<u64>, cap: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8 + cap);
    match deadline {
        Some(d) => {
            out.push(kind | EXPIRES);
            out.extend_from_slice(&d.to_le_bytes());
        }
        None => out.push(kind),
    }
    out
}

/// The stored bytes of a value kept in the object itself.
pub fn encode_inline(value: &[u8], deadline: Option<u64>) -> Vec<u8> {
    let mut out = header(0, deadline, value.len());
    out.extend_from_slice(value);
    out
}

/// The stored bytes of a large value's manifest.
pub fn encode_large(m: &Manifest, deadline: Option<u64>) -> Vec<u8> {
    let mut out = header(LARGE, deadline, MANIFEST_LEN);
    m.encode(&mut out);
    out
}

/// The stored bytes' length for an inline value of `len` bytes.
pub fn inline_len(len: usize, deadline: Option<u64>) -> usize {
    1 + if deadline.is_some() { 8 } else { 0 } + len
}

/// Decodes stored bytes.
pub fn decode(raw: &[u8]) -> Result<Decoded<'_>> {
    let bad = |why: &str| Error::Corrupt(format!("stored value: {why}"));
    let (&kind, rest) = raw.split_first().ok_or_else(|| bad("empty"))?;
    if kind & !(EXPIRES | LARGE) != 0 {
        return Err(bad(&format!("unknown kind {kind:#x}")));
    }
    let (deadline, rest) = if kind & EXPIRES != 0 {
        if rest.len() < 8 {
            return Err(bad("deadline cut short"));
        }
        let (d, rest) = rest.split_at(8);
        (
            Some(u64::from_le_bytes(d.try_into().expect("8 bytes"))),
            rest,
        )
    } else {
        (None, rest)
    };
    let body = if kind & LARGE != 0 {
        Body::Large(Manifest::decode(rest).ok_or_else(|| bad("bad manifest"))?)
    } else {
        Body::Inline(rest)
    };
    Ok(Decoded { deadline, body })
}

/// Whether stored bytes say the key expired at `now` (undecodable bytes: no).
pub fn expired(raw: &[u8], now: u64) -> bool {
    decode(raw).is_ok_and(|d| d.expired(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_with_and_without_deadline() {
        let raw = encode_inline(b"v", None);
        assert_eq!(raw, b"\0v");
        let d = decode(&raw).unwrap();
        assert_eq!((d.deadline, d.body), (None, Body::Inline(b"v")));
        let raw = encode_inline(b"", Some(77));
        assert_eq!(raw.len(), inline_len(0, Some(77)));
        let d = decode(&raw).unwrap();
        assert_eq!((d.deadline, d.body.clone()), (Some(77), Body::Inline(b"")));
        assert!(d.expired(77) && !d.expired(76));
        assert!(expired(&raw, 100) && !expired(&encode_inline(b"x", None), u64::MAX));
    }

    #[test]
    fn manifests_round_trip_and_name_their_chunks() {
        let m = Manifest {
            len: 100_001,
            chunk_len: 1000,
            chunks: 101,
            created_ms: 5,
            writer: 9,
            seq: 3,
            crc: 42,
        };
        let raw = encode_large(&m, Some(1));
        let d = decode(&raw).unwrap();
        assert_eq!(d.body, Body::Large(m));
        assert_eq!(m.range(100), 100_000..100_001);
        let k = m.chunk_key(b"user", 7);
        let p = parse_chunk_key(&k).unwrap();
        assert_eq!(
            (p.created_ms, p.writer, p.seq, p.index, p.key),
            (5, 9, 3, 7, &b"user"[..])
        );
        assert!(is_reserved(&k) && !is_reserved(b"user"));
        assert!(parse_chunk_key(b"user").is_none());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for raw in [
            &b""[..],
            b"\x01abc",
            b"\x02short",
            b"\x80",
            b"\x03\0\0\0\0\0\0\0\0",
        ] {
            assert!(decode(raw).is_err(), "{raw:?}");
        }
        // A manifest whose chunk count does not match its lengths.
        let mut raw = encode_large(
            &Manifest {
                len: 10,
                chunk_len: 5,
                chunks: 2,
                created_ms: 0,
                writer: 0,
                seq: 0,
                crc: 0,
            },
            None,
        );
        raw[13] = 9; // chunks: 9, not 2
        assert!(decode(&raw).is_err());
    }
}
