//! The KV object and its embedded operation-log entry.
//!
//! ```text
//! offset 0        16           16+klen       L = align8(16+klen+vlen)      L+40
//!        | header | key        | value       | log entry (40 bytes)         |
//! header:    key_len u16 | value_len u32 | flags u8 | reserved u8 | generation u32 | reserved u32
//!            flags: bit 0 outdated (a newer version replaced it), bit 1 reclaimed (its
//!            owner took it back: free, whatever the rest says)
//!            generation: the slot's allocation generation, at a fixed offset so an owner can read
//!            it without knowing the object's length
//! log entry: +0  next u64   the object this client will allocate next in this size class
//!            +8  prev u64   the object it allocated before this one
//!            +16 old u64    commit record: the primary slot's value before this operation
//!            +24 old_gen u32  generation of the object `old` points to (so freeing it in
//!                           recovery can tell whether the slot was reused since)
//!            +28 crc u32    crc32c over (old, old_gen, generation, op, this object's address);
//!                           never 0, so a zeroed record is always "not committed"
//!            +32 sum u32    crc32c over the object as written (header with its flags byte as 0,
//!                           key, value, padding, next, prev, op, used); never 0. A power cut
//!                           can leave any cache line of an object not yet persisted: a torn
//!                           object fails its sum and is no object at all. Only readers of
//!                           objects no slot names check it (recovery's log walk, failover's
//!                           repair: `decode_checked`): an object is durable before any slot
//!                           word names it, so one read through the index is never torn
//!            +36 finished u8  1 once the operation and its cleanup are complete
//!            +37 reserved u8
//!            +38 op u8      INSERT, UPDATE or DELETE
//!            +39 used u8    1, written last: a torn object is never "used"
//! ```
//!
//! Pointers (`next`, `prev`) pack a node id and an offset in that node's pool data area:
//! `node << 48 | offset`; 0 is "none".
//!
//! Why a committed INSERT is told apart from an uncommitted one: the reference code took
//! `old != 0` as "committed", but an INSERT's old slot value *is* 0 (the slot was empty). Here
//! the commit record carries a real checksum that covers the old value, so a committed INSERT
//! (old = 0, valid crc) and an uncommitted one (record all zero, crc 0 is never valid) differ.

use dmkit_verbs::NodeId;

use crate::error::{Error, Result};

pub const HEADER_LEN: usize = 16;
/// Offset of the flags byte in the header.
pub const FLAGS_OFF: usize = 6;
/// Offset of the generation in the header.
pub const GEN_OFF: usize = 8;
pub const LOG_LEN: usize = 40;
/// Offset of the commit record inside the log entry.
pub const COMMIT_OFF: usize = 16;
pub const COMMIT_LEN: usize = 16;
/// Offset of the object's checksum inside the log entry.
pub const SUM_OFF: usize = 32;
/// Offset of `finished` inside the log entry.
pub const FINISHED_OFF: usize = 36;
/// Flag: a newer version of the key replaced this object (cached addresses must not use it).
pub const FLAG_OUTDATED: u8 = 1;
/// Flag: the owner reclaimed this object (it is free).
pub const FLAG_RECLAIMED: u8 = 2;
/// Offset of the header's byte that marks a conditional write (compare-and-set, delete-if):
/// an unconditional UPDATE that loses its SNAPSHOT round to one cannot be linearized just
/// before it (the winner compared the value it replaced), so it writes again. Its own byte:
/// the flags byte is rewritten whole by the flag writes.
pub const CONDITIONAL_OFF: usize = 7;

/// What an operation did to the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Insert = 1,
    Update = 2,
    Delete = 3,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        match v {
            1 => Some(Op::Insert),
            2 => Some(Op::Update),
            3 => Some(Op::Delete),
            _ => None,
        }
    }
}

/// A remote object's address: node and offset in its pool data area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    pub node: NodeId,
    pub offset: u64,
}

impl Addr {
    pub fn pack(self) -> u64 {
        u64::from(self.node.0) << 48 | self.offset
    }

    pub fn unpack(v: u64) -> Option<Addr> {
        (v != 0).then_some(Addr {
            node: NodeId((v >> 48) as u16),
            offset: v & ((1 << 48) - 1),
        })
    }
}

/// Where the log entry starts in an object with this key and value.
pub fn log_offset(klen: usize, vlen: usize) -> usize {
    (HEADER_LEN + klen + vlen).div_ceil(8) * 8
}

/// Where the log entry starts in an object of `len` bytes (its whole length).
pub fn log_offset_for_len(len: usize) -> usize {
    len - LOG_LEN
}

/// The whole object's length.
pub fn object_len(klen: usize, vlen: usize) -> usize {
    log_offset(klen, vlen) + LOG_LEN
}

/// The log entry's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogEntry {
    pub next: u64,
    pub prev: u64,
    pub commit: Option<Commit>,
    pub finished: bool,
    pub op: u8,
    pub used: bool,
}

/// The commit record: written by the last writer before it swaps the primary slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Commit {
    /// The primary slot's raw value before this operation (0: the key was absent).
    pub old: u64,
    /// Generation of the object `old` points to (0 when `old` is 0).
    pub old_gen: u32,
}

fn crc(c: &Commit, generation: u32, op: u8, at: Addr) -> u32 {
    let mut b = [0u8; 8 + 4 + 4 + 1 + 8];
    b[..8].copy_from_slice(&c.old.to_le_bytes());
    b[8..12].copy_from_slice(&c.old_gen.to_le_bytes());
    b[12..16].copy_from_slice(&generation.to_le_bytes());
    b[16] = op;
    b[17..25].copy_from_slice(&at.pack().to_le_bytes());
    match crc32c::crc32c(&b) {
        0 => 1,
        v => v,
    }
}

/// The 16 bytes of a commit record for the object at `at`.
pub fn encode_commit(c: &Commit, generation: u32, op: Op, at: Addr) -> [u8; COMMIT_LEN] {
    let mut out = [0u8; COMMIT_LEN];
    out[..8].copy_from_slice(&c.old.to_le_bytes());
    out[8..12].copy_from_slice(&c.old_gen.to_le_bytes());
    out[12..16].copy_from_slice(&crc(c, generation, op as u8, at).to_le_bytes());
    out
}

/// A decoded object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvObject {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub flags: u8,
    pub generation: u32,
    pub log: LogEntry,
    /// Written by a conditional write (see [`CONDITIONAL_OFF`]).
    pub conditional: bool,
}

/// The checksum of the object `b` whose log entry starts at `lo` (see the layout above).
fn object_sum(b: &[u8], lo: usize) -> u32 {
    let mut c = crc32c::crc32c(&b[..FLAGS_OFF]);
    c = crc32c::crc32c_append(c, &[0]);
    c = crc32c::crc32c_append(c, &b[FLAGS_OFF + 1..lo + COMMIT_OFF]);
    c = crc32c::crc32c_append(c, &b[lo + 38..lo + 40]);
    match c {
        0 => 1,
        v => v,
    }
}

/// Encodes a new object (commit record empty, `used` set as the last byte).
pub fn encode(
    key: &[u8],
    value: &[u8],
    next: u64,
    prev: u64,
    generation: u32,
    op: Op,
) -> Result<Vec<u8>> {
    encode_as(key, value, next, prev, generation, op, false)
}

/// [`encode`], marking a conditional write when `conditional`.
pub fn encode_as(
    key: &[u8],
    value: &[u8],
    next: u64,
    prev: u64,
    generation: u32,
    op: Op,
    conditional: bool,
) -> Result<Vec<u8>> {
    let klen = u16::try_from(key.len()).map_err(|_| Error::KeyTooLong(key.len()))?;
    let vlen = u32::try_from(value.len()).map_err(|_| Error::ValueTooLong(value.len()))?;
    let lo = log_offset(key.len(), value.len());
    let mut out = vec![0u8; lo + LOG_LEN];
    out[0..2].copy_from_slice(&klen.to_le_bytes());
    out[2..6].copy_from_slice(&vlen.to_le_bytes());
    out[GEN_OFF..GEN_OFF + 4].copy_from_slice(&generation.to_le_bytes());
    out[CONDITIONAL_OFF] = u8::from(conditional);
    out[HEADER_LEN..HEADER_LEN + key.len()].copy_from_slice(key);
    out[HEADER_LEN + key.len()..HEADER_LEN + key.len() + value.len()].copy_from_slice(value);
    let l = &mut out[lo..];
    l[0..8].copy_from_slice(&next.to_le_bytes());
    l[8..16].copy_from_slice(&prev.to_le_bytes());
    l[38] = op as u8;
    l[39] = 1;
    let sum = object_sum(&out, lo);
    out[lo + SUM_OFF..lo + SUM_OFF + 4].copy_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// The header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub klen: usize,
    pub vlen: usize,
    pub flags: u8,
    pub generation: u32,
}

/// Reads the header, or `None` if `b` is too short.
pub fn decode_header(b: &[u8]) -> Option<Header> {
    if b.len() < HEADER_LEN {
        return None;
    }
    Some(Header {
        klen: u16::from_le_bytes([b[0], b[1]]) as usize,
        vlen: u32::from_le_bytes([b[2], b[3], b[4], b[5]]) as usize,
        flags: b[FLAGS_OFF],
        generation: u32::from_le_bytes(b[GEN_OFF..GEN_OFF + 4].try_into().expect("4 bytes")),
    })
}

/// Decodes the log entry that starts at `b[0]` for the object at `at` whose generation is
/// `generation`.
pub fn decode_log(b: &[u8], generation: u32, at: Addr) -> Option<LogEntry> {
    if b.len() < LOG_LEN {
        return None;
    }
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let op = b[38];
    let c = Commit {
        old: u64_at(16),
        old_gen: u32_at(24),
    };
    let stored = u32_at(28);
    let commit = (stored != 0 && stored == crc(&c, generation, op, at)).then_some(c);
    Some(LogEntry {
        next: u64_at(0),
        prev: u64_at(8),
        commit,
        finished: b[36] == 1,
        op,
        used: b[39] == 1,
    })
}

/// [`decode`], and the object's checksum checked: `None` for an object a power cut tore.
/// For objects no index slot may name (a log walk); one read through the index was durable
/// before the slot named it.
pub fn decode_checked(b: &[u8], at: Addr) -> Option<KvObject> {
    let o = decode(b, at)?;
    let lo = log_offset(o.key.len(), o.value.len());
    let sum = u32::from_le_bytes(
        b[lo + SUM_OFF..lo + SUM_OFF + 4]
            .try_into()
            .expect("4 bytes"),
    );
    (sum == object_sum(b, lo)).then_some(o)
}

/// Decodes a whole object read from `at` (`b` may extend past it). `None` when the bytes are
/// not a complete object (free, or garbage; a torn one only [`decode_checked`] tells).
pub fn decode(b: &[u8], at: Addr) -> Option<KvObject> {
    let Header {
        klen,
        vlen,
        flags,
        generation,
    } = decode_header(b)?;
    let lo = log_offset(klen, vlen);
    if b.len() < lo + LOG_LEN {
        return None;
    }
    let log = decode_log(&b[lo..lo + LOG_LEN], generation, at)?;
    if !log.used || flags & FLAG_RECLAIMED != 0 {
        return None;
    }
    Some(KvObject {
        key: b[HEADER_LEN..HEADER_LEN + klen].to_vec(),
        value: b[HEADER_LEN + klen..HEADER_LEN + klen + vlen].to_vec(),
        flags,
        generation,
        log,
        conditional: b[CONDITIONAL_OFF] == 1,
    })
}

#[cfg(test)]
pub(crate) use dmkit_verbs::wire::hex_dump;

#[cfg(test)]
mod tests {
    use super::*;

    const AT: Addr = Addr {
        node: NodeId(2),
        offset: 0x4_0000,
    };

    /// A whole object as a writer lays it out — header, key, value, padding, the embedded log
    /// entry — then the same object with its commit record, `finished` and the outdated flag
    /// written, as the operation's later rounds leave it. A change here is an on-media format
    /// change: old objects in existing pools would be misread.
    #[test]
    fn object_and_log_entry_bytes_are_pinned() {
        let next = Addr {
            node: NodeId(2),
            offset: 0x4_0100,
        }
        .pack();
        let prev = Addr {
            node: NodeId(2),
            offset: 0x3_ff00,
        }
        .pack();
        let mut o =
            encode_as(b"user:42", b"hello, fusee", next, prev, 7, Op::Update, true).unwrap();
        let fresh = hex_dump(&o);
        let lo = log_offset(7, 12);
        let commit = Commit {
            old: Addr {
                node: NodeId(1),
                offset: 0x2_0040,
            }
            .pack(),
            old_gen: 5,
        };
        o[lo + COMMIT_OFF..lo + COMMIT_OFF + COMMIT_LEN].copy_from_slice(&encode_commit(
            &commit,
            7,
            Op::Update,
            AT,
        ));
        o[lo + FINISHED_OFF] = 1;
        o[FLAGS_OFF] |= FLAG_OUTDATED;
        let d = decode_checked(&o, AT).unwrap();
        assert_eq!(d.log.commit, Some(commit));
        assert!(d.log.finished && d.conditional);
        insta::assert_snapshot!(format!(
            "new object ({} bytes, log entry at {lo}):\n{fresh}\ncommitted, finished, outdated (at {AT:?}):\n{}",
            o.len(),
            hex_dump(&o)
        ));
    }

    #[test]
    fn object_round_trips_and_used_is_the_last_byte() {
        let o = encode(b"key", b"value!", 11, 22, 7, Op::Update).unwrap();
        assert_eq!(o.len(), object_len(3, 6));
        assert_eq!(*o.last().unwrap(), 1);
        let d = decode(&o, AT).unwrap();
        assert_eq!(
            (d.key.as_slice(), d.value.as_slice()),
            (&b"key"[..], &b"value!"[..])
        );
        assert_eq!(
            (d.log.next, d.log.prev, d.generation, d.log.op),
            (11, 22, 7, 2)
        );
        assert_eq!(d.log.commit, None);
        assert!(!d.log.finished);
        // Torn: everything but the used byte.
        let mut torn = o.clone();
        *torn.last_mut().unwrap() = 0;
        assert!(decode(&torn, AT).is_none());
        // Torn: any byte of it stale (but the flags, the commit record and `finished`, which
        // are written after it).
        for at in [
            0,
            5,
            HEADER_LEN + 1,
            log_offset(3, 6) + 3,
            log_offset(3, 6) + 38,
        ] {
            let mut torn = o.clone();
            torn[at] ^= 0x10;
            assert!(decode_checked(&torn, AT).is_none(), "byte {at} changed");
        }
        assert!(decode_checked(&o, AT).is_some());
        let mut flagged = o.clone();
        flagged[FLAGS_OFF] |= FLAG_OUTDATED;
        assert!(decode_checked(&flagged, AT).is_some());
        // Reclaimed by its owner.
        let mut rec = o.clone();
        rec[FLAGS_OFF] |= FLAG_RECLAIMED;
        assert!(decode(&rec, AT).is_none());
    }

    #[test]
    fn a_committed_insert_is_not_mistaken_for_an_uncommitted_one() {
        let mut o = encode(b"k", b"v", 0, 0, 3, Op::Insert).unwrap();
        let lo = log_offset(1, 1);
        assert_eq!(decode(&o, AT).unwrap().log.commit, None);
        let c = Commit { old: 0, old_gen: 0 };
        o[lo + COMMIT_OFF..lo + COMMIT_OFF + COMMIT_LEN].copy_from_slice(&encode_commit(
            &c,
            3,
            Op::Insert,
            AT,
        ));
        assert_eq!(decode(&o, AT).unwrap().log.commit, Some(c));
        // A torn commit record (old value written, crc not) is not a commit.
        let mut torn = o.clone();
        torn[lo + COMMIT_OFF + 12..lo + COMMIT_OFF + 16].fill(0);
        assert_eq!(decode(&torn, AT).unwrap().log.commit, None);
        // A record copied from another address (a reused slot) does not verify.
        assert_eq!(
            decode(
                &o,
                Addr {
                    offset: 0x8_0000,
                    ..AT
                }
            )
            .unwrap()
            .log
            .commit,
            None
        );
    }

    #[test]
    fn addresses_pack() {
        assert_eq!(Addr::unpack(AT.pack()), Some(AT));
        assert_eq!(Addr::unpack(0), None);
    }
}
