//! The Gengar RPCs (two-sided, served by the server's handler): alloc, free, lease,
//! report-hot, lock, unlock, stat. Every reply starts with a status and the server's free NVM
//! and DRAM bytes, which clients use for placement.

use dmkit_cache::AccessReport;
use dmkit_verbs::wire::{Reader, WireError, Writer};

pub(crate) mod tag {
    pub const ALLOC: u8 = 1;
    pub const FREE: u8 = 2;
    pub const LEASE: u8 = 3;
    pub const REPORT: u8 = 4;
    pub const LOCK: u8 = 5;
    pub const UNLOCK: u8 = 6;
    pub const STAT: u8 = 7;
}

/// ALLOC: an object of `size` payload bytes.
pub(crate) fn alloc_request(size: u32) -> Vec<u8> {
    Writer::tagged(tag::ALLOC).u32(size).finish()
}

/// FREE: the object at `offset`, if it is still at `generation`.
pub(crate) fn free_request(offset: u64, generation: u32) -> Vec<u8> {
    Writer::tagged(tag::FREE)
        .u64(offset)
        .u32(generation)
        .finish()
}

/// LEASE: a read lease for client `holder` on the object at `offset`, `generation`.
pub(crate) fn lease_request(holder: u64, offset: u64, generation: u32) -> Vec<u8> {
    Writer::tagged(tag::LEASE)
        .u64(holder)
        .u64(offset)
        .u32(generation)
        .finish()
}

/// REPORT: a client's access window (its hot objects and their counts).
pub(crate) fn report_request(rep: &AccessReport) -> Vec<u8> {
    let mut w = Writer::tagged(tag::REPORT)
        .u64(rep.client)
        .u64(rep.window)
        .u64(rep.total_accesses)
        .u32(rep.entries.len() as u32);
    for e in &rep.entries {
        w = w.u64(e.obj).u64(e.count);
    }
    w.finish()
}

/// LOCK or UNLOCK (`t`) of the object at `offset` for client `holder`.
pub(crate) fn lock_request(t: u8, holder: u64, offset: u64) -> Vec<u8> {
    debug_assert!(t == tag::LOCK || t == tag::UNLOCK);
    Writer::tagged(t).u64(holder).u64(offset).finish()
}

/// STAT: the reply head alone (free bytes).
pub(crate) fn stat_request() -> Vec<u8> {
    Writer::tagged(tag::STAT).finish()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Status {
    Ok = 0,
    /// Try again shortly (a lease is fenced for a promotion, eviction or free; a lock is held).
    Busy = 1,
    /// The object is not allocated at that generation.
    Freed = 2,
    OutOfSpace = 3,
    NotHolder = 4,
    /// Anything else; a message follows.
    Failed = 5,
}

impl Status {
    fn from_u8(v: u8) -> Result<Status, WireError> {
        Ok(match v {
            0 => Status::Ok,
            1 => Status::Busy,
            2 => Status::Freed,
            3 => Status::OutOfSpace,
            4 => Status::NotHolder,
            5 => Status::Failed,
            _ => return Err(WireError("status")),
        })
    }
}

/// The common head of every reply.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyHead {
    pub status: Status,
    pub free_nvm: u64,
    pub free_dram: u64,
}

pub(crate) fn reply(status: Status, free_nvm: u64, free_dram: u64) -> Writer {
    Writer::new().u8(status as u8).u64(free_nvm).u64(free_dram)
}

/// ALLOC's answer: the reply head, then where the object is and its generation.
pub(crate) fn alloc_ok(w: Writer, offset: u64, generation: u32) -> Writer {
    w.u64(offset).u32(generation)
}

/// ALLOC's answer, after the reply head: (offset, generation).
pub(crate) fn decode_alloc(rest: &[u8]) -> Result<(u64, u32), WireError> {
    let mut r = Reader::new(rest);
    Ok((r.u64()?, r.u32()?))
}

pub(crate) fn read_head(r: &mut Reader<'_>) -> Result<ReplyHead, WireError> {
    Ok(ReplyHead {
        status: Status::from_u8(r.u8()?)?,
        free_nvm: r.u64()?,
        free_dram: r.u64()?,
    })
}

/// Where the lease says the object's current copy is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    Nvm,
    /// Cached in DRAM at this payload offset of the DRAM region, with that slot's generation.
    Dram {
        offset: u64,
        generation: u32,
    },
}

/// A granted lease as the server describes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseGrant {
    pub size: u32,
    pub duration_ns: u64,
    pub location: Location,
}

pub(crate) fn encode_grant(w: Writer, g: &LeaseGrant) -> Writer {
    let w = w.u32(g.size).u64(g.duration_ns);
    match g.location {
        Location::Nvm => w.u8(0),
        Location::Dram { offset, generation } => w.u8(1).u64(offset).u32(generation),
    }
}

pub(crate) fn decode_grant(r: &mut Reader<'_>) -> Result<LeaseGrant, WireError> {
    let size = r.u32()?;
    let duration_ns = r.u64()?;
    let location = match r.u8()? {
        0 => Location::Nvm,
        1 => Location::Dram {
            offset: r.u64()?,
            generation: r.u32()?,
        },
        _ => return Err(WireError("location")),
    };
    Ok(LeaseGrant {
        size,
        duration_ns,
        location,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmkit_cache::HotEntry;

    use dmkit_verbs::wire::hex_dump;

    /// Every request and reply shape, as the client and server encode them. A change here is
    /// a protocol change between Gengar clients and servers.
    #[test]
    fn message_bytes_are_pinned() {
        let report = AccessReport {
            client: 5,
            window: 2,
            total_accesses: 300,
            entries: vec![
                HotEntry {
                    obj: 0x1000,
                    count: 200,
                },
                HotEntry {
                    obj: 0x2040,
                    count: 100,
                },
            ],
        };
        let head = || reply(Status::Ok, 1 << 30, 64 << 20);
        let grant = |location| LeaseGrant {
            size: 100,
            duration_ns: 2_000_000,
            location,
        };
        let messages: Vec<(&str, Vec<u8>)> = vec![
            ("ALLOC request", alloc_request(4096)),
            ("FREE request", free_request(0x1_0040, 3)),
            ("LEASE request", lease_request(9, 0x1_0040, 3)),
            ("REPORT request", report_request(&report)),
            ("LOCK request", lock_request(tag::LOCK, 9, 0x1_0040)),
            ("UNLOCK request", lock_request(tag::UNLOCK, 9, 0x1_0040)),
            ("STAT request", stat_request()),
            ("reply head (STAT, Ok)", head().finish()),
            ("ALLOC reply", alloc_ok(head(), 0x1_0040, 3).finish()),
            (
                "LEASE reply, NVM",
                encode_grant(head(), &grant(Location::Nvm)).finish(),
            ),
            (
                "LEASE reply, DRAM",
                encode_grant(
                    head(),
                    &grant(Location::Dram {
                        offset: 0x8000,
                        generation: 4,
                    }),
                )
                .finish(),
            ),
            (
                "Busy reply",
                reply(Status::Busy, 1 << 30, 64 << 20).finish(),
            ),
            (
                "Freed reply",
                reply(Status::Freed, 1 << 30, 64 << 20).finish(),
            ),
            ("OutOfSpace reply", reply(Status::OutOfSpace, 0, 0).finish()),
            (
                "NotHolder reply",
                reply(Status::NotHolder, 1 << 30, 64 << 20).finish(),
            ),
            (
                "Failed reply",
                reply(Status::Failed, 1 << 30, 64 << 20)
                    .bytes(b"no such object")
                    .finish(),
            ),
        ];
        let mut s = String::new();
        for (what, bytes) in &messages {
            s.push_str(&format!(
                "{what} ({} bytes)\n{}",
                bytes.len(),
                hex_dump(bytes)
            ));
        }
        insta::assert_snapshot!(s);
        // The decoders read back what the encoders wrote.
        let b = encode_grant(
            head(),
            &grant(Location::Dram {
                offset: 0x8000,
                generation: 4,
            }),
        )
        .finish();
        let mut r = Reader::new(&b);
        assert_eq!(read_head(&mut r).unwrap().status, Status::Ok);
        assert_eq!(
            decode_grant(&mut r).unwrap().location,
            Location::Dram {
                offset: 0x8000,
                generation: 4
            }
        );
    }
}
