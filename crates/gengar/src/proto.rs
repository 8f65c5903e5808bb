//! The Gengar RPCs (two-sided, served by the server's handler): alloc, free, lease,
//! report-hot, lock, unlock, stat. Every reply starts with a status and the server's free NVM
//! and DRAM bytes, which clients use for placement. The messages are declared once
//! ([`dmkit_verbs::wire_message!`]): the client encodes and the server decodes the same ones.

use dmkit_cache::AccessReport;
use dmkit_verbs::wire::{Reader, Wire, WireError, Writer};
use dmkit_verbs::wire_message;

wire_message! {
    /// A request: its kind (the first byte), then its fields.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) enum Request: "request kind" {
        /// An object of `size` payload bytes.
        Alloc = 1 { size: u32 },
        /// The object at `offset`, if it is still at `generation`.
        Free = 2 { offset: u64, generation: u32 },
        /// A read lease for client `holder` on the object at `offset`, `generation`.
        Lease = 3 { holder: u64, offset: u64, generation: u32 },
        /// A client's access window (its hot objects and their counts).
        Report = 4 { report: Report },
        /// The lock of the object at `offset`, for client `holder`.
        Lock = 5 { holder: u64, offset: u64 },
        Unlock = 6 { holder: u64, offset: u64 },
        /// The reply head alone (free bytes).
        Stat = 7,
    }
}

/// A REPORT's body: the access report in its own format (dmkit-cache's), to the message's end.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Report(pub AccessReport);

impl Wire for Report {
    fn put(&self, w: Writer) -> Writer {
        w.raw(&self.0.to_bytes())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let rep = AccessReport::from_bytes(r.rest()).map_err(|_| WireError("report"))?;
        Ok(Report(rep))
    }
}

wire_message! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Status: "status" {
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
}

wire_message! {
    /// The common head of every reply.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct ReplyHead {
        pub status: Status,
        pub free_nvm: u64,
        pub free_dram: u64,
    }
}

/// A reply's head, for the body to follow.
pub(crate) fn reply(status: Status, free_nvm: u64, free_dram: u64) -> Writer {
    let head = ReplyHead {
        status,
        free_nvm,
        free_dram,
    };
    Writer::new().put(&head)
}

wire_message! {
    /// ALLOC's answer, after the reply head: where the object is and its generation.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Allocated {
        pub offset: u64,
        pub generation: u32,
    }
}

wire_message! {
    /// Where the lease says the object's current copy is.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Location: "location" {
        Nvm = 0,
        /// Cached in DRAM at this payload offset of the DRAM region, with that slot's generation.
        Dram = 1 { offset: u64, generation: u32 },
    }
}

wire_message! {
    /// A granted lease as the server describes it (LEASE's answer, after the reply head).
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct LeaseGrant {
        pub size: u32,
        pub duration_ns: u64,
        pub location: Location,
    }
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
            ("ALLOC request", Request::Alloc { size: 4096 }.to_bytes()),
            (
                "FREE request",
                Request::Free {
                    offset: 0x1_0040,
                    generation: 3,
                }
                .to_bytes(),
            ),
            (
                "LEASE request",
                Request::Lease {
                    holder: 9,
                    offset: 0x1_0040,
                    generation: 3,
                }
                .to_bytes(),
            ),
            (
                "REPORT request",
                Request::Report {
                    report: Report(report.clone()),
                }
                .to_bytes(),
            ),
            (
                "LOCK request",
                Request::Lock {
                    holder: 9,
                    offset: 0x1_0040,
                }
                .to_bytes(),
            ),
            (
                "UNLOCK request",
                Request::Unlock {
                    holder: 9,
                    offset: 0x1_0040,
                }
                .to_bytes(),
            ),
            ("STAT request", Request::Stat.to_bytes()),
            ("reply head (STAT, Ok)", head().finish()),
            (
                "ALLOC reply",
                head()
                    .put(&Allocated {
                        offset: 0x1_0040,
                        generation: 3,
                    })
                    .finish(),
            ),
            (
                "LEASE reply, NVM",
                head().put(&grant(Location::Nvm)).finish(),
            ),
            (
                "LEASE reply, DRAM",
                head()
                    .put(&grant(Location::Dram {
                        offset: 0x8000,
                        generation: 4,
                    }))
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
        for (_, bytes) in &messages[..7] {
            let req = Request::from_bytes(bytes).unwrap();
            assert_eq!(&req.to_bytes(), bytes);
        }
        let b = head()
            .put(&grant(Location::Dram {
                offset: 0x8000,
                generation: 4,
            }))
            .finish();
        let mut r = Reader::new(&b);
        assert_eq!(r.get::<ReplyHead>().unwrap().status, Status::Ok);
        assert_eq!(
            r.get::<LeaseGrant>().unwrap().location,
            Location::Dram {
                offset: 0x8000,
                generation: 4
            }
        );
    }
}
