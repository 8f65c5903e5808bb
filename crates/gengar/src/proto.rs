//! The Gengar RPCs (two-sided, served by the server's handler): alloc, free, lease,
//! report-hot, lock, unlock, stat. Every reply starts with a status and the server's free NVM
//! and DRAM bytes, which clients use for placement.

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
