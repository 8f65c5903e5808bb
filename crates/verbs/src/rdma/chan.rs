//! Two-sided messages over SEND/RECV on a connection's QP: pre-posted receive buffers,
//! credit-based flow control (a sender never sends more than the receiver has buffers
//! posted), and fragmentation of messages larger than one buffer.
//!
//! Each side posts `depth` receive buffers of `MSG` bytes and starts with `depth` credits.
//! Every chunk carries the credits its sender gives back (buffers it has reposted since);
//! when one side has given back nothing for a while it sends a bare CREDIT message. The last
//! credit is reserved for CREDIT messages, so credit returns can never deadlock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::alloc::Slab;
use super::ffi::{CmId, Pd};
use super::post::{self, Wr, WrKind};
use super::sys;
use crate::error::{Error, Result};

/// Size of one receive buffer (and of one message chunk, header included).
pub(crate) const MSG: usize = 4096;
const HDR: usize = 16;

/// A send asks for a completion at most every this many sends (see `Chan::posted`).
const SIGNAL_EVERY: u32 = 16;

/// wr_id tags: the top bits say what completed.
pub(crate) const TAG_RECV: u64 = 1 << 62;
pub(crate) const TAG_SEND: u64 = 1 << 61;
pub(crate) const TAG_MASK: u64 = 0b111 << 61;

pub(crate) mod kind {
    pub const WELCOME: u8 = 1;
    pub const RPC: u8 = 2;
    pub const RPC_OK: u8 = 3;
    pub const RPC_ERR: u8 = 4;
    pub const REGIONS: u8 = 5;
    pub const REGIONS_RESP: u8 = 6;
    pub const PERSIST: u8 = 7;
    pub const PERSIST_RESP: u8 = 8;
    pub const CREDIT: u8 = 9;
}

/// A whole message, reassembled.
#[derive(Debug)]
pub(crate) struct Message {
    pub kind: u8,
    pub req: u64,
    pub body: Vec<u8>,
}

#[derive(Debug, Default)]
struct Credits {
    /// Receive buffers the peer has posted that we may consume.
    avail: u32,
    /// Buffers we reposted and have not told the peer about yet.
    owed: u32,
}

#[derive(Debug)]
struct Partial {
    kind: u8,
    req: u64,
    total: usize,
    body: Vec<u8>,
}

/// The messaging state of one connection.
#[derive(Debug)]
pub(crate) struct Chan {
    id: Arc<CmId>,
    depth: u32,
    recv: Slab,
    send: Slab,
    free_send: Mutex<Vec<u32>>,
    /// Send slots posted and not yet known complete, in posting order. Only every
    /// [`SIGNAL_EVERY`]th send asks for a completion (a completion wakes the connection's
    /// poll thread: on an emulated NIC the wake-up, not the packet, is what a small message
    /// costs); its completion returns its slot and every slot posted before it, as a
    /// signalled completion implies that every earlier work request of the queue is done.
    posted: Mutex<std::collections::VecDeque<u32>>,
    send_cv: Condvar,
    credits: Mutex<Credits>,
    credit_cv: Condvar,
    send_lock: Mutex<()>,
    partial: Mutex<Option<Partial>>,
    max_inline: u32,
}

impl Chan {
    /// Registers the buffers and posts every receive (call before connect/accept).
    pub fn new(id: Arc<CmId>, pd: &Arc<Pd>, depth: u32, max_inline: u32) -> Result<Chan> {
        let recv = Slab::new(
            pd,
            MSG * depth as usize,
            sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
        )?;
        let send = Slab::new(
            pd,
            MSG * depth as usize,
            sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
        )?;
        let c = Chan {
            id,
            depth,
            recv,
            send,
            free_send: Mutex::new((0..depth).collect()),
            posted: Mutex::new(std::collections::VecDeque::with_capacity(depth as usize)),
            send_cv: Condvar::new(),
            credits: Mutex::new(Credits {
                avail: depth,
                owed: 0,
            }),
            credit_cv: Condvar::new(),
            send_lock: Mutex::new(()),
            partial: Mutex::new(None),
            max_inline,
        };
        c.post_all_recvs()?;
        Ok(c)
    }

    /// (Re)posts every receive buffer: at start, and after the QP was reset (which drops them).
    pub fn post_all_recvs(&self) -> Result<()> {
        for i in 0..self.depth {
            self.repost(i)?;
        }
        *self.partial.lock() = None;
        Ok(())
    }

    fn repost(&self, i: u32) -> Result<()> {
        let addr = self.recv.ptr() as u64 + u64::from(i) * MSG as u64;
        // SAFETY: buffer `i` lies inside the registered receive slab, which lives as long as
        // this Chan (and the QP is destroyed before the Chan, see the connection types); it
        // is not read again until its receive completion is polled.
        unsafe {
            post::post_recv(
                self.id.qp(),
                TAG_RECV | u64::from(i),
                addr,
                MSG as u32,
                self.recv.lkey(),
            )
        }
    }

    /// Sends a message, in chunks, waiting for credits and send slots up to `timeout`.
    pub fn send(&self, kind: u8, req: u64, body: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let _g = self.send_lock.lock();
        let room = MSG - HDR;
        let mut off = 0;
        loop {
            let n = (body.len() - off).min(room);
            let last = off + n == body.len();
            self.send_chunk(
                kind,
                req,
                body.len(),
                &body[off..off + n],
                last,
                Some(deadline),
            )?;
            off += n;
            if last {
                return Ok(());
            }
        }
    }

    /// Sends a message only if that cannot wait — the send path is free and the credits and
    /// send slots for all its chunks are there now — else returns `false` and sends nothing.
    /// For the thread that polls the completion queue: it must never wait for credits, as
    /// only it delivers them.
    pub fn try_send(&self, kind: u8, req: u64, body: &[u8]) -> Result<bool> {
        let room = MSG - HDR;
        let chunks = body.len().div_ceil(room).max(1);
        let Some(_g) = self.send_lock.try_lock() else {
            return Ok(false);
        };
        // Holding `send_lock`, nobody else takes credits or slots: they can only grow.
        // (One credit stays reserved for CREDIT messages, as in `send_chunk`.)
        if (self.credits.lock().avail as usize) < chunks + 1 || self.free_send.lock().len() < chunks
        {
            return Ok(false);
        }
        let mut off = 0;
        loop {
            let n = (body.len() - off).min(room);
            let last = off + n == body.len();
            self.send_chunk(kind, req, body.len(), &body[off..off + n], last, None)?;
            off += n;
            if last {
                return Ok(true);
            }
        }
    }

    /// Gives credits back with a bare message if we owe many and a credit and a slot are
    /// free right now (never blocks: called from the completion poller).
    pub fn maybe_return_credits(&self) {
        if self.credits.lock().owed < self.depth / 4 {
            return;
        }
        if let Some(_g) = self.send_lock.try_lock() {
            let _ = self.send_chunk(kind::CREDIT, 0, 0, &[], true, None);
        }
    }

    fn send_chunk(
        &self,
        kind: u8,
        req: u64,
        total: usize,
        chunk: &[u8],
        last: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let reserve = u32::from(kind != kind::CREDIT);
        let give = {
            let mut c = self.credits.lock();
            while c.avail <= reserve {
                match deadline {
                    None => return Ok(()),
                    Some(d) => {
                        if self.credit_cv.wait_until(&mut c, d).timed_out() {
                            return Err(Error::Io(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                "no receive credits from the peer",
                            )));
                        }
                    }
                }
            }
            c.avail -= 1;
            std::mem::take(&mut c.owed)
        };
        let slot = {
            let mut f = self.free_send.lock();
            loop {
                if let Some(s) = f.pop() {
                    break s;
                }
                match deadline {
                    Some(d) if !self.send_cv.wait_until(&mut f, d).timed_out() => {}
                    _ => {
                        // Undo: nothing was sent.
                        let mut c = self.credits.lock();
                        c.avail += 1;
                        c.owed += give;
                        return Err(Error::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no free send buffer",
                        )));
                    }
                }
            }
        };
        let base = self.send.ptr() as usize + slot as usize * MSG;
        let len = HDR + chunk.len();
        let mut hdr = [0u8; HDR];
        hdr[0] = kind;
        hdr[1] = u8::from(last);
        hdr[2..4].copy_from_slice(&(give.min(u32::from(u16::MAX)) as u16).to_le_bytes());
        hdr[4..8].copy_from_slice(&(total as u32).to_le_bytes());
        hdr[8..16].copy_from_slice(&req.to_le_bytes());
        // SAFETY: send slot `slot` is ours (taken off the free list) until its completion
        // returns it; it lies inside the registered send slab and holds MSG >= len bytes.
        unsafe {
            let p = base as *mut u8;
            std::ptr::copy_nonoverlapping(hdr.as_ptr(), p, HDR);
            std::ptr::copy_nonoverlapping(chunk.as_ptr(), p.add(HDR), chunk.len());
        }
        // (Posted under `send_lock`, so `posted` is in the queue's order.)
        let mut posted = self.posted.lock();
        let signaled = self.wants_signal(posted.len() as u32);
        let wr = Wr {
            id: TAG_SEND | u64::from(slot),
            kind: WrKind::Send,
            addr: base as u64,
            len: len as u32,
            lkey: self.send.lkey(),
            signaled,
            inline: len as u32 <= self.max_inline,
        };
        // SAFETY: the slot stays valid and untouched until a completion at or after it
        // (see above and `on_send_done`).
        let r = unsafe { post::post_send(self.id.qp(), &[wr]) };
        match r {
            Ok(()) => posted.push_back(slot),
            Err(_) => {
                drop(posted);
                self.free_send.lock().push(slot);
                self.send_cv.notify_one();
            }
        }
        r
    }

    /// Whether the next send asks for a completion, with `unknown` sends posted and not yet
    /// known complete: every [`SIGNAL_EVERY`]th, and every one once a quarter of the slots
    /// (or fewer) is left free — so that a sender short of slots is never left waiting on
    /// sends nobody will report.
    fn wants_signal(&self, unknown: u32) -> bool {
        wants_signal(self.depth, unknown)
    }

    /// A send completed (successfully or flushed): its slot, and every slot posted before it
    /// (unsignalled sends complete in order before it), are free again. A completion of a
    /// slot no longer listed (an unsignalled send flushed after a later one returned it) is
    /// ignored.
    pub fn on_send_done(&self, wr_id: u64) {
        let slot = (wr_id & !TAG_MASK) as u32;
        let mut posted = self.posted.lock();
        if !release_through(&mut posted, slot, &mut self.free_send.lock()) {
            return;
        }
        drop(posted);
        self.send_cv.notify_all();
    }

    /// A receive completed with `len` bytes: takes the chunk, reposts the buffer, and returns
    /// the message if this chunk completed one.
    pub fn on_recv(&self, wr_id: u64, len: usize) -> Result<Option<Message>> {
        let i = (wr_id & !TAG_MASK) as u32;
        let bad = |what: &str| Error::Protocol {
            peer: "rdma peer".into(),
            reason: what.into(),
        };
        if i >= self.depth || !(HDR..=MSG).contains(&len) {
            return Err(bad("bad receive completion"));
        }
        let mut chunk = vec![0u8; len];
        // SAFETY: the receive completed, so the NIC is done with buffer `i` and `len` bytes
        // of it are initialised; nobody else reads it until we repost it below.
        unsafe {
            let p = (self.recv.ptr() as usize + i as usize * MSG) as *const u8;
            std::ptr::copy_nonoverlapping(p, chunk.as_mut_ptr(), len);
        }
        self.repost(i)?;
        let kind = chunk[0];
        let last = chunk[1] != 0;
        let give = u16::from_le_bytes([chunk[2], chunk[3]]);
        let total = u32::from_le_bytes(chunk[4..8].try_into().expect("4 bytes")) as usize;
        let req = u64::from_le_bytes(chunk[8..16].try_into().expect("8 bytes"));
        {
            let mut c = self.credits.lock();
            c.avail += u32::from(give);
            c.owed += 1;
        }
        self.credit_cv.notify_all();
        if kind == kind::CREDIT {
            return Ok(None);
        }
        let mut p = self.partial.lock();
        let part = p.get_or_insert_with(|| Partial {
            kind,
            req,
            total,
            body: Vec::with_capacity(total.min(64 << 20)),
        });
        if part.kind != kind || part.req != req || part.body.len() + len - HDR > part.total {
            *p = None;
            return Err(bad("interleaved or oversized message chunks"));
        }
        part.body.extend_from_slice(&chunk[HDR..]);
        if !last {
            return Ok(None);
        }
        let part = p.take().expect("present");
        if part.body.len() != part.total {
            return Err(bad("message shorter than announced"));
        }
        Ok(Some(Message {
            kind: part.kind,
            req: part.req,
            body: part.body,
        }))
    }

    /// After a QP reset the peer's view of our buffers restarts too: reset the credits.
    pub fn reset_credits(&self) {
        let mut posted = self.posted.lock();
        posted.clear();
        let mut f = self.free_send.lock();
        *f = (0..self.depth).collect();
        let mut c = self.credits.lock();
        c.owed = 0;
        self.send_cv.notify_all();
    }
}

/// [`Chan::wants_signal`] for `depth` send slots.
fn wants_signal(depth: u32, unknown: u32) -> bool {
    let every = SIGNAL_EVERY.min(depth / 2).max(1);
    (unknown + 1) % every == 0 || depth.saturating_sub(unknown + 1) <= depth / 4
}

/// A completion of `slot`: moves it and every slot posted before it from `posted` to `free`;
/// false (nothing moved) when `slot` is not listed.
fn release_through(
    posted: &mut std::collections::VecDeque<u32>,
    slot: u32,
    free: &mut Vec<u32>,
) -> bool {
    let Some(at) = posted.iter().position(|s| *s == slot) else {
        return false;
    };
    free.extend(posted.drain(..=at));
    true
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// Sends with completions only for the signalled ones, delivered late: a sender never
    /// runs out of slots for good, at most `SIGNAL_EVERY - 1` sends in a row go unsignalled,
    /// and every slot comes back exactly once.
    #[test]
    fn unsignalled_sends_always_get_their_slots_back() {
        for depth in [1u32, 2, 4, 16, 64] {
            let mut free: Vec<u32> = (0..depth).collect();
            let mut posted = VecDeque::new();
            let mut due: VecDeque<u32> = VecDeque::new(); // signalled, not yet completed
            let mut in_a_row = 0;
            for i in 0..10_000u32 {
                // Completions arrive two sends late (or at once when nothing else is free).
                while due.len() > 2 || (free.is_empty() && !due.is_empty()) {
                    let s = due.pop_front().unwrap();
                    assert!(release_through(&mut posted, s, &mut free));
                }
                let slot = free.pop().unwrap_or_else(|| {
                    panic!("depth {depth}: no slot at send {i}, nothing signalled")
                });
                if wants_signal(depth, posted.len() as u32) {
                    due.push_back(slot);
                    in_a_row = 0;
                } else {
                    in_a_row += 1;
                    assert!(in_a_row < SIGNAL_EVERY);
                }
                posted.push_back(slot);
            }
            while let Some(s) = due.pop_front() {
                release_through(&mut posted, s, &mut free);
            }
            // What is left are the unsignalled sends after the last signalled one (the next
            // signalled send returns them): fewer than a signalling period.
            assert!(
                posted.len() < SIGNAL_EVERY as usize,
                "depth {depth}: {posted:?}"
            );
            free.extend(posted.drain(..));
            free.sort_unstable();
            assert_eq!(free, (0..depth).collect::<Vec<_>>());
            // A completion of a slot already returned is ignored.
            assert!(!release_through(&mut posted, 0, &mut free));
        }
    }
}
