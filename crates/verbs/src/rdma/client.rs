//! The client side: an RC connection to one memory node, set up with rdma-cm.

use rustc_hash::FxHashMap as HashMap;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::alloc::RdmaAllocator;
use super::chan::{self, Chan, kind};
use super::ffi::{self, CmId, Cq, EventChannel, Pd, QpSizes};
use super::post::{self, Wr, WrKind};
use super::wire::{self, RemoteRegion, Table};
use super::{RdmaConfig, device_pd, select_device, sys};
use crate::batch::{Batch, BatchResult, Op};
use crate::buf::{BufAllocator, MemBuf};
use crate::conn::{Connection, Connector, Executed, PostCtx};
use crate::error::{AccessFault, Error, Result};
use crate::node::OpKind;
use crate::pending::{Pending, Progress, Slot, TimeoutHook};
use crate::types::{Media, NodeId, RegionDesc};

/// Makes rdma connections. Give endpoints [`RdmaConnector::allocator`] so their buffers are
/// registered (zero-copy); heap buffers work too, at the cost of a copy (or inline sends).
#[derive(Debug)]
pub struct RdmaConnector {
    pub config: RdmaConfig,
    alloc: OnceLock<RdmaAllocator>,
}

impl Default for RdmaConnector {
    fn default() -> Self {
        Self::new(RdmaConfig::default())
    }
}

impl RdmaConnector {
    pub fn new(config: RdmaConfig) -> Self {
        Self {
            config,
            alloc: OnceLock::new(),
        }
    }

    /// Registered buffers of the configured device (shared by every connection of it).
    pub fn allocator(&self) -> Result<RdmaAllocator> {
        if let Some(a) = self.alloc.get() {
            return Ok(a.clone());
        }
        let (ctx, _) = select_device(&self.config)?;
        let a = RdmaAllocator::new(device_pd(ctx)?);
        Ok(self.alloc.get_or_init(|| a).clone())
    }
}

impl RdmaConnector {
    /// Connects to the memory node at `addr` (the concrete connection, for its
    /// diagnostics; [`Connector::connect`] gives the same as a trait object).
    pub fn connect_rdma(&self, addr: &str) -> Result<RdmaConnection> {
        RdmaConnection::connect(self, addr).map_err(|e| match e {
            Error::Connect { reason, .. } => Error::Connect {
                addr: addr.to_string(),
                reason,
            },
            e => e,
        })
    }
}

impl Connector for RdmaConnector {
    fn connect(&self, addr: &str) -> Result<Arc<dyn Connection>> {
        Ok(Arc::new(self.connect_rdma(addr)?))
    }

    fn buf_allocator(&self) -> Result<Option<Arc<dyn crate::BufAllocator>>> {
        Ok(Some(Arc::new(self.allocator()?)))
    }
}

struct InFlight {
    slot: Arc<Slot<BatchResult>>,
    node: NodeId,
    ops: Vec<Op>,
    bufs: Vec<MemBuf>,
    signaled_left: usize,
    /// Signalled chunks in all (each returns its work requests' send-queue slots when it
    /// completes, so a batch larger than the send queue flows through it).
    chunks: usize,
    /// Work requests per chunk (the last one may have fewer).
    chunk: u32,
    wrs: u32,
    /// What only some batches need (plain verbs on registered buffers need none of it):
    /// boxed, so the common entry stays small — it is moved in and out of the map per verb.
    extra: Option<Box<Extra>>,
}

#[derive(Default)]
struct Extra {
    /// (op index, bounce buffer) for reads into unregistered buffers.
    bounce_reads: Vec<(usize, MemBuf)>,
    /// Registered memory written by the NIC or read by it for this batch: kept until done.
    _keep: Vec<MemBuf>,
    /// Atomic results: (op index, offset in `atomics`).
    atomics: Option<MemBuf>,
    fault: Option<(usize, AccessFault)>,
    persist: Vec<u8>,
}

impl InFlight {
    fn fault(&self) -> Option<(usize, AccessFault)> {
        self.extra.as_ref().and_then(|e| e.fault)
    }

    fn persist(&self) -> &[u8] {
        self.extra.as_ref().map_or(&[], |e| &e.persist)
    }
}

/// A batch checked and turned into work requests, not yet posted.
struct Built {
    id: u64,
    ops: Vec<Op>,
    bufs: Vec<MemBuf>,
    wrs: smallvec::SmallVec<[Wr; 8]>,
    extra: Option<Box<Extra>>,
}

/// The persist sender thread's queue: (request id, persist body).
type PersistQueue = std::sync::mpsc::Sender<(u64, Vec<u8>)>;

/// Who waits for a message from the node, by request id.
enum Reply {
    /// A control message (the region table).
    Message(Arc<Slot<chan::Message>>),
    /// An RPC's reply.
    Rpc(Arc<Slot<Vec<u8>>>),
    /// A batch of durable writes, done once the node says it persisted them.
    Persist(InFlight),
}

struct Shared {
    // Field order is drop order: the QP goes (with the last CmId Arc, held by `chan`) before
    // the buffers in `inflight` that the NIC might still touch.
    id: Arc<CmId>,
    chan: Chan,
    inflight: Mutex<HashMap<u64, InFlight>>,
    cm: Arc<EventChannel>,
    pd: Arc<Pd>,
    alloc: RdmaAllocator,
    node: NodeId,
    peer: String,
    regions: Mutex<Table>,
    rpcs: Mutex<HashMap<u64, Reply>>,
    /// Persist requests to send (the sender thread's queue: the poller must not block on
    /// the channel's credits).
    persist_tx: OnceLock<Mutex<PersistQueue>>,
    next_id: AtomicU64,
    sq_depth: u32,
    sq_free: Mutex<u32>,
    sq_cv: Condvar,
    alive: AtomicBool,
    /// Broke on a remote access error: the node is alive, the connection can be made again.
    healable: AtomicBool,
    reason: Mutex<Option<String>>,
    op_timeout: Duration,
    max_inline: u32,
    /// The completion queue (QPs hold their own Arc, so it outlives them either way) and who
    /// is polling it: the poll thread, or a waiter driving its own completion.
    cq: Arc<Cq>,
    /// (It guards the completion array polls fill, so no poll zeroes one.)
    poll_lock: Mutex<Box<[sys::ibv_wc; POLL_BATCH]>>,
    /// Counts the polls waiters make themselves: while it moves, the poll thread stays off
    /// the CPU instead of waking on every completion event. (A counter, not a timestamp:
    /// reading the clock on every poll costs a system call on some machines.)
    waiter_polls: AtomicU64,
    hooks: OnceLock<(Progress, TimeoutHook)>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaConnection")
            .field("node", &self.node)
            .field("peer", &self.peer)
            .field("alive", &self.alive.load(Ordering::Relaxed))
            .finish()
    }
}

/// An RC connection to one memory node (made again, transparently, after a verb broke it
/// with an rkey the node had dropped).
#[derive(Debug)]
pub struct RdmaConnection {
    current: Mutex<Arc<Shared>>,
    config: RdmaConfig,
    alloc: RdmaAllocator,
    addr: String,
}

fn cerr(reason: String) -> Error {
    Error::Connect {
        addr: String::new(),
        reason,
    }
}

impl RdmaConnection {
    fn connect(conn: &RdmaConnector, addr: &str) -> Result<Self> {
        let alloc = conn.allocator()?;
        let shared = Self::open(&conn.config, &alloc, addr)?;
        Ok(RdmaConnection {
            current: Mutex::new(shared),
            config: conn.config.clone(),
            alloc,
            addr: addr.to_string(),
        })
    }

    /// The live connection. One that broke on a remote access error (a verb used an rkey
    /// the node has dropped: a rekey, a removed region, a fence) is made again first: the
    /// node is alive, and on the other backends such a verb only fails its own batch.
    fn shared(&self) -> Arc<Shared> {
        let mut cur = self.current.lock();
        if !cur.alive.load(Ordering::Acquire) && cur.healable.load(Ordering::SeqCst) {
            match Self::open(&self.config, &self.alloc, &self.addr) {
                Ok(fresh) if fresh.node == cur.node => {
                    tracing::debug!(node = %cur.node, peer = %self.addr, "rdma connection made again after a remote access error");
                    *cur = fresh;
                }
                Ok(fresh) => {
                    cur.healable.store(false, Ordering::SeqCst);
                    *cur.reason.lock() = Some(format!(
                        "{} now answers as memory node {}",
                        self.addr, fresh.node
                    ));
                    fresh.kill("wrong node".into());
                }
                Err(e) => {
                    // Gone for good: it fails like any broken connection from now on.
                    tracing::debug!(node = %cur.node, peer = %self.addr, error = %e, "cannot make the rdma connection again");
                    cur.healable.store(false, Ordering::SeqCst);
                    *cur.reason.lock() = Some(format!(
                        "broken by a remote access error, and cannot be made again: {e}"
                    ));
                }
            }
        }
        cur.clone()
    }

    fn open(cfg: &RdmaConfig, alloc: &RdmaAllocator, addr: &str) -> Result<Arc<Shared>> {
        let alloc = alloc.clone();
        let dst = addr
            .to_socket_addrs()
            .map_err(|e| cerr(e.to_string()))?
            .next()
            .ok_or_else(|| cerr("no address".into()))?;
        let dst = ffi::v4(dst)?;
        let (want_ctx, src) = select_device(cfg)?;
        let ms = cfg.connect_timeout.as_millis().min(i32::MAX as u128) as i32;
        let cm = EventChannel::new()?;
        let mut id = CmId::new(&cm)?;
        id.set_ack_timeout(cfg.ack_timeout);
        id.resolve_addr(src.map(|ip| std::net::SocketAddrV4::new(ip, 0)), dst, ms)?;
        cm.expect(
            id.raw(),
            sys::RDMA_CM_EVENT_ADDR_RESOLVED,
            cfg.connect_timeout,
        )?;
        id.resolve_route(ms)?;
        cm.expect(
            id.raw(),
            sys::RDMA_CM_EVENT_ROUTE_RESOLVED,
            cfg.connect_timeout,
        )?;
        let ctx = id
            .context()
            .ok_or_else(|| cerr("rdma-cm bound no device".into()))?;
        if cfg.device.is_some() && ctx.raw() != want_ctx.raw() {
            return Err(cerr(format!(
                "the route to {dst} goes through RDMA device {}, not the configured {}",
                ctx.name(),
                want_ctx.name()
            )));
        }
        let pd = device_pd(ctx)?;
        let caps = ctx.caps()?;
        if !caps.atomics {
            return Err(cerr(format!(
                "RDMA device {} does not support atomic verbs (atomic_cap NONE)",
                ctx.name()
            )));
        }
        let cq = Cq::new(ctx, cfg.send_depth + cfg.msg_depth + 16)?;
        let send_depth = cfg.send_depth.min(caps.max_qp_wr);
        let max_inline = id.create_qp(
            &pd,
            &cq,
            QpSizes {
                send: send_depth,
                recv: cfg.msg_depth,
                inline: cfg.max_inline,
            },
        )?;
        let id = Arc::new(id);
        let chan = Chan::new(id.clone(), &pd, cfg.msg_depth, max_inline)?;
        id.connect(caps.max_qp_rd_atom.clamp(1, 16) as u8)?;
        cm.expect(
            id.raw(),
            sys::RDMA_CM_EVENT_ESTABLISHED,
            cfg.connect_timeout,
        )?;

        // The node's first message is its region table.
        let deadline = Instant::now() + cfg.connect_timeout;
        let mut wcs = vec![sys::ibv_wc::default(); 16];
        let welcome = 'outer: loop {
            if Instant::now() > deadline {
                return Err(cerr("the memory node sent no region table".into()));
            }
            let n = cq.poll(&mut wcs)?;
            if n == 0 {
                cq.wait(Duration::from_millis(20));
            }
            for wc in &wcs[..n] {
                if wc.status != sys::IBV_WC_SUCCESS {
                    return Err(cerr(format!(
                        "completion error {} during the handshake",
                        wc.status
                    )));
                }
                if wc.wr_id & chan::TAG_MASK == chan::TAG_SEND {
                    chan.on_send_done(wc.wr_id);
                } else if let Some(m) = chan.on_recv(wc.wr_id, wc.byte_len as usize)? {
                    if m.kind != kind::WELCOME {
                        return Err(cerr("expected the region table".into()));
                    }
                    break 'outer m;
                }
            }
        };
        let (node, regions) = wire::decode(addr, &welcome.body)?;
        let shared = Arc::new(Shared {
            id,
            chan,
            inflight: Mutex::new(HashMap::default()),
            cm,
            pd,
            alloc,
            node,
            peer: addr.to_string(),
            regions: Mutex::new(regions),
            rpcs: Mutex::new(HashMap::default()),
            persist_tx: OnceLock::new(),
            next_id: AtomicU64::new(1),
            sq_depth: send_depth,
            sq_free: Mutex::new(send_depth),
            sq_cv: Condvar::new(),
            alive: AtomicBool::new(true),
            healable: AtomicBool::new(false),
            reason: Mutex::new(None),
            op_timeout: cfg.op_timeout,
            max_inline,
            cq: cq.clone(),
            poll_lock: Mutex::new(Box::new([sys::ibv_wc::default(); POLL_BATCH])),
            waiter_polls: AtomicU64::new(0),
            hooks: OnceLock::new(),
        });
        let s = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name(format!("dmkit-rdma-cq-{node}"))
            .spawn(move || poll_loop(&s, &cq))?;
        Ok(shared)
    }
}

impl Shared {
    /// Lets a waiter poll the CQ itself (when no one else is polling it).
    fn progress(self: &Arc<Self>) -> Progress {
        self.hooks().0.clone()
    }

    fn timeout_hook(self: &Arc<Self>) -> TimeoutHook {
        self.hooks().1.clone()
    }

    /// The waiters' hooks, made once per connection (not per verb).
    fn hooks(self: &Arc<Self>) -> &(Progress, TimeoutHook) {
        self.hooks
            .get_or_init(|| (self.make_progress(), self.make_timeout_hook()))
    }

    fn make_progress(self: &Arc<Self>) -> Progress {
        let s = Arc::downgrade(self);
        Arc::new(move || {
            let Some(s) = s.upgrade() else { return false };
            s.waiter_polls.fetch_add(1, Ordering::Relaxed);
            let Some(mut wcs) = s.poll_lock.try_lock() else {
                return false;
            };
            poll_once(&s, &s.cq, &mut wcs[..], false) > 0
        })
    }

    fn make_timeout_hook(self: &Arc<Self>) -> TimeoutHook {
        let s = Arc::downgrade(self);
        Arc::new(move || {
            if let Some(s) = s.upgrade() {
                s.kill(format!(
                    "no completion within {:?}: node unresponsive",
                    s.op_timeout
                ));
            }
        })
    }

    /// Takes `n` send-queue slots (at most the queue's depth), waiting up to the operation
    /// timeout for completions to return some; false if the connection died or the time ran
    /// out. While it waits it polls the completion queue itself when nobody else does, so a
    /// batch larger than the queue needs no other thread to make progress.
    fn take_send_slots(self: &Arc<Self>, n: u32) -> bool {
        debug_assert!(n <= self.sq_depth);
        let mut deadline = None;
        loop {
            {
                let mut free = self.sq_free.lock();
                if *free >= n {
                    *free -= n;
                    return true;
                }
                if !self.alive.load(Ordering::SeqCst) {
                    return false;
                }
                // (The clock is read only when the queue is full.)
                let d = *deadline.get_or_insert_with(|| Instant::now() + self.op_timeout);
                if Instant::now() >= d {
                    return false;
                }
            }
            let polled = !IN_POLL.with(std::cell::Cell::get)
                && self
                    .poll_lock
                    .try_lock()
                    .is_some_and(|mut wcs| poll_once(self, &self.cq, &mut wcs[..], false) > 0);
            if !polled {
                let mut free = self.sq_free.lock();
                if *free < n && self.alive.load(Ordering::SeqCst) {
                    self.sq_cv.wait_for(&mut free, Duration::from_micros(200));
                }
            }
        }
    }

    /// Checks a batch against the region table and builds its work requests (allocating
    /// the registered memory they need). `Err`: the batch's result, with nothing posted (a
    /// refused verb, a dead connection, an empty batch).
    fn build(self: &Arc<Self>, batch: Batch) -> std::result::Result<Built, Result<BatchResult>> {
        let s = self;
        let node = s.node;
        if !s.alive.load(Ordering::SeqCst) {
            return Err(Err(s.dead()));
        }
        let (_, ops, mut bufs) = batch.into_parts();
        let mut fault = None;
        // (Inline storage: a verb's common case allocates nothing here.)
        let mut targets: smallvec::SmallVec<[RemoteRegion; 4]> = smallvec::SmallVec::new();
        let mut refreshed = false;
        loop {
            {
                let table = s.regions.lock();
                for (i, op) in ops.iter().enumerate().skip(targets.len()) {
                    match check(&table, op) {
                        Ok(r) => targets.push(r),
                        Err(f) => {
                            fault = Some((i, f));
                            break;
                        }
                    }
                }
            }
            // An rkey we do not know, or a fence: the node's table may have changed since we
            // learned it (a rekey, a new region, an unfence). Learn it again, once, unless
            // this thread is the one that delivers the answer.
            let stale = matches!(
                fault,
                Some((_, AccessFault::UnknownRkey | AccessFault::Fenced))
            );
            if !stale || refreshed || IN_POLL.with(std::cell::Cell::get) {
                break;
            }
            refreshed = true;
            if s.refresh_regions().is_err() {
                break;
            }
            fault = None;
            targets.clear();
        }
        let n = targets.len();
        if n == 0 {
            let r = match fault {
                Some((index, fault)) => Err(Error::refused(node, index, &ops[index], fault)),
                None => Ok(BatchResult::new(node, ops, bufs)),
            };
            return Err(r);
        }
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let alloc_err = |e: Error| Err(Err(e));
        let needs_atomics = ops[..n]
            .iter()
            .any(|o| matches!(o.kind, OpKind::Cas { .. } | OpKind::Faa { .. }));
        let atomics = if needs_atomics {
            match s.alloc.alloc(8 * n) {
                Ok(b) => Some(b),
                Err(e) => return alloc_err(e),
            }
        } else {
            None
        };
        let flush = crate::batch::flushes(ops[..n].iter().map(|o| (o.kind, o.len)));
        let mut wrs: smallvec::SmallVec<[Wr; 8]> = smallvec::SmallVec::with_capacity(n + 1);
        let mut bounce_reads = Vec::new();
        let mut keep = Vec::new();
        let mut persist = Vec::new();
        let registered = |b: &MemBuf| b.is_registered() && s.alloc.same_pd(&s.pd);
        for (i, (op, r)) in ops[..n].iter().zip(&targets).enumerate() {
            let raddr = r.va + (op.addr - r.desc.base);
            let rkey = r.nic_rkey;
            let wid = (id << 16) | (i as u64 & 0xffff);
            let mut wr = Wr {
                id: wid,
                kind: WrKind::Send,
                addr: 0,
                len: op.len,
                lkey: 0,
                signaled: false,
                inline: false,
            };
            match op.kind {
                OpKind::Read => {
                    wr.kind = WrKind::Read { raddr, rkey };
                    let b = &mut bufs[op.buf.expect("reads have a buffer")];
                    if registered(b) || op.len == 0 {
                        wr.addr = b.as_mut_ptr() as u64;
                        wr.lkey = b.lkey();
                    } else {
                        let bb = match s.alloc.alloc(op.len as usize) {
                            Ok(x) => x,
                            Err(e) => return alloc_err(e),
                        };
                        wr.addr = bb.as_ptr() as u64;
                        wr.lkey = bb.lkey();
                        bounce_reads.push((i, bb));
                    }
                }
                OpKind::Write { durable } => {
                    wr.kind = WrKind::Write { raddr, rkey };
                    let b = &bufs[op.buf.expect("writes have a buffer")];
                    if registered(b) {
                        wr.addr = b.as_ptr() as u64;
                        wr.lkey = b.lkey();
                        wr.inline = op.len <= s.max_inline;
                    } else if op.len <= s.max_inline {
                        // Inline: the NIC copies the bytes at post time, no lkey needed.
                        wr.addr = b.as_ptr() as u64;
                        wr.inline = true;
                    } else {
                        let mut bb = match s.alloc.alloc(op.len as usize) {
                            Ok(x) => x,
                            Err(e) => return alloc_err(e),
                        };
                        bb.copy_from_slice(b);
                        wr.addr = bb.as_ptr() as u64;
                        wr.lkey = bb.lkey();
                        keep.push(bb);
                    }
                    wrs.push(wr);
                    if durable && op.len > 0 {
                        // Read-after-write flush, unless a READ follows later in the batch
                        // (see `flushes`).
                        if flush[i] {
                            let mut fb = match s.alloc.alloc(8) {
                                Ok(x) => x,
                                Err(e) => return alloc_err(e),
                            };
                            let tail = u64::from(op.len.min(8));
                            wrs.push(Wr {
                                id: wid,
                                kind: WrKind::Read {
                                    raddr: raddr + u64::from(op.len) - tail,
                                    rkey,
                                },
                                addr: fb.as_mut_ptr() as u64,
                                len: tail as u32,
                                lkey: fb.lkey(),
                                signaled: false,
                                inline: false,
                            });
                            keep.push(fb);
                        }
                        if r.desc.media == Media::Nvm {
                            persist.extend_from_slice(&op.rkey.0.to_le_bytes());
                            persist.extend_from_slice(&(op.addr - r.desc.base).to_le_bytes());
                            persist.extend_from_slice(&u64::from(op.len).to_le_bytes());
                        }
                    }
                    continue;
                }
                OpKind::Cas { expect, new } => {
                    wr.kind = WrKind::Cas {
                        raddr,
                        rkey,
                        expect,
                        swap: new,
                    };
                }
                OpKind::Faa { add } => wr.kind = WrKind::Faa { raddr, rkey, add },
            }
            if matches!(op.kind, OpKind::Cas { .. } | OpKind::Faa { .. }) {
                let a = atomics.as_ref().expect("allocated above");
                wr.addr = a.as_ptr() as u64 + 8 * i as u64;
                wr.lkey = a.lkey();
                wr.len = 8;
                if r.desc.media == Media::Nvm {
                    // An atomic on persistent memory completes once the node persisted its
                    // word (the same request as durable writes', after the batch's verbs).
                    persist.extend_from_slice(&op.rkey.0.to_le_bytes());
                    persist.extend_from_slice(&(op.addr - r.desc.base).to_le_bytes());
                    persist.extend_from_slice(&8u64.to_le_bytes());
                }
            }
            wrs.push(wr);
        }
        let plain = bounce_reads.is_empty()
            && keep.is_empty()
            && atomics.is_none()
            && fault.is_none()
            && persist.is_empty();
        let extra = (!plain).then(|| {
            Box::new(Extra {
                bounce_reads,
                _keep: keep,
                atomics,
                fault,
                persist,
            })
        });
        Ok(Built {
            id,
            ops,
            bufs,
            wrs,
            extra,
        })
    }

    /// Posts a built batch; its completion is delivered through the returned [`Pending`] by
    /// whichever thread polls the completion queue.
    fn post_built(self: &Arc<Self>, b: Built) -> Pending<BatchResult> {
        let s = self;
        let node = s.node;
        let Built {
            id,
            ops,
            bufs,
            mut wrs,
            extra,
        } = b;
        // Selective signalling: one signalled WR per doorbell (per chunk of at most half the
        // send queue), the last; RC completes in order, so it implies all before it.
        let total = wrs.len() as u32;
        let sq_depth = s.sq_depth;
        let chunk = (sq_depth / 2).max(1) as usize;
        let chunks = wrs.len().div_ceil(chunk);
        for c in wrs.chunks_mut(chunk) {
            c.last_mut().expect("non-empty").signaled = true;
        }
        // The first chunk's send-queue slots before anything is in flight: failing to get them
        // fails this batch alone.
        let mut parts = wrs.chunks(chunk);
        let first = parts.next().expect("a batch has work requests");
        if !s.take_send_slots(first.len() as u32) {
            return Pending::ready(node, Err(s.dead()));
        }
        let slot = Slot::new();
        s.inflight.lock().insert(
            id,
            InFlight {
                slot: slot.clone(),
                node,
                ops,
                bufs,
                signaled_left: chunks,
                chunks,
                chunk: chunk as u32,
                wrs: total,
                extra,
            },
        );
        for (k, c) in std::iter::once(first).chain(parts).enumerate() {
            // A batch larger than the send queue (a split marks and freezes thousands of
            // slots) waits for earlier chunks to complete. Half of it is already posted, so
            // no slots in time breaks the connection (its verbs cannot be taken back).
            if k > 0 && !s.take_send_slots(c.len() as u32) {
                s.kill(format!(
                    "no send-queue slots for {} more work requests within {:?}",
                    c.len(),
                    s.op_timeout
                ));
                break;
            }
            // SAFETY: every local segment is a registered buffer now owned by the InFlight
            // entry (or an inline source read during this call); the entry is removed only
            // on the batch's last completion or a flush, and the QP is destroyed before the
            // map is dropped, so the NIC never touches freed memory.
            if let Err(e) = unsafe { post::post_send(s.id.qp(), c) } {
                s.kill(format!("post failed: {e}"));
                break;
            }
        }
        Pending::waiting(node, slot, s.op_timeout, Some(s.timeout_hook()))
            .with_progress(s.progress())
    }

    /// Posts a built batch and polls for its completion on this thread, holding the poll
    /// lock: the path of a caller that blocks on the batch anyway. No in-flight entry, no
    /// completion slot, no hand-over to a waiter — what a raw post-and-poll loop does, as
    /// `ib_read_lat` does. Completions of other work found meanwhile are delivered as usual.
    /// `Err`: posted the general way instead ([`Self::post_built`]), when another thread
    /// polls the queue, the batch needs more than one doorbell or the node's persist request,
    /// the send queue is short of slots, or this thread is delivering completions.
    fn execute_built(self: &Arc<Self>, mut b: Built) -> Executed {
        let n = b.wrs.len();
        let one_doorbell = n <= (self.sq_depth / 2).max(1) as usize;
        let simple = one_doorbell
            && b.extra.as_ref().is_none_or(|x| x.persist.is_empty())
            && !IN_POLL.with(std::cell::Cell::get);
        let Some(mut wcs) = simple.then(|| self.poll_lock.try_lock()).flatten() else {
            return Executed::Posted(self.post_built(b));
        };
        {
            let mut free = self.sq_free.lock();
            if *free < n as u32 {
                drop(free);
                drop(wcs);
                return Executed::Posted(self.post_built(b));
            }
            *free -= n as u32;
        }
        let give_back = || {
            *self.sq_free.lock() += n as u32;
            self.sq_cv.notify_all();
        };
        b.wrs
            .last_mut()
            .expect("a batch has work requests")
            .signaled = true;
        // SAFETY: every local segment is a registered buffer owned by `b` (or an inline
        // source read during this call); `b` lives until the signalled completion says the
        // NIC is done with all of them (RC completes in order), and is leaked below when that
        // completion may never come.
        if let Err(e) = unsafe { post::post_send(self.id.qp(), &b.wrs) } {
            self.kill(format!("post failed: {e}"));
            std::mem::forget(b);
            return Executed::Done(Err(e));
        }
        // (Counted as a waiter's polls: the poll thread keeps off completion events while
        // waiters drive the queue — an event per verb would wake it for nothing.)
        self.waiter_polls.fetch_add(1, Ordering::Relaxed);
        IN_POLL.with(|f| f.set(true));
        // The clock is read only after many empty polls (it can cost a system call).
        let (mut empty, mut deadline, mut timed_out) = (0u32, None, false);
        let mine = loop {
            let got = match self.cq.poll(&mut wcs[..]) {
                Ok(k) => k,
                Err(e) => {
                    self.kill(e.to_string());
                    break None;
                }
            };
            let mut mine = None;
            for wc in &wcs[..got] {
                if wc.wr_id >> 16 == b.id && wc.wr_id & chan::TAG_MASK == 0 {
                    mine = Some(*wc);
                } else {
                    deliver(self, wc);
                }
            }
            if mine.is_some() {
                break mine;
            }
            if got == 0 {
                empty = empty.wrapping_add(1);
                if empty % 4096 == 0 {
                    let d = *deadline.get_or_insert_with(|| Instant::now() + self.op_timeout);
                    if Instant::now() > d {
                        self.kill(format!(
                            "no completion within {:?}: node unresponsive",
                            self.op_timeout
                        ));
                        timed_out = true;
                        break None;
                    }
                }
                std::hint::spin_loop();
            }
        };
        IN_POLL.with(|f| f.set(false));
        drop(wcs);
        match mine {
            Some(wc) if wc.status == sys::IBV_WC_SUCCESS => {
                give_back();
                Executed::Done(completed(self.node, b.ops, b.bufs, b.extra))
            }
            Some(wc) => {
                // A failed work request: the queue pair is in error, and the rest of the
                // batch is flushed without touching memory.
                give_back();
                let e = self.wc_error(&wc, &b.ops);
                if wc.status != sys::IBV_WC_WR_FLUSH_ERR {
                    self.kill(format!("work request failed: {}", status_reason(wc.status)));
                }
                Executed::Done(Err(e))
            }
            None => {
                // No completion (timeout, a broken queue): the NIC may still use the buffers.
                std::mem::forget(b);
                Executed::Done(Err(if timed_out {
                    Error::Timeout {
                        node: self.node,
                        after: self.op_timeout,
                    }
                } else {
                    self.dead()
                }))
            }
        }
    }

    fn dead(&self) -> Error {
        Error::Disconnected {
            node: self.node,
            reason: self
                .reason
                .lock()
                .clone()
                .unwrap_or_else(|| "connection closed".into()),
        }
    }

    fn refresh_regions(self: &Arc<Self>) -> Result<Vec<RegionDesc>> {
        let m = self.message(kind::REGIONS, &[]).wait()?;
        let (_, table) = wire::decode(&self.peer, &m.body)?;
        let out = table.regions.iter().map(|r| r.desc).collect();
        *self.regions.lock() = table;
        Ok(out)
    }

    fn message(self: &Arc<Self>, k: u8, body: &[u8]) -> Pending<chan::Message> {
        let s = self;
        if !s.alive.load(Ordering::SeqCst) {
            return Pending::ready(s.node, Err(self.dead()));
        }
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Slot::new();
        s.rpcs.lock().insert(id, Reply::Message(slot.clone()));
        if let Err(e) = s.chan.send(k, id, body, s.op_timeout) {
            s.rpcs.lock().remove(&id);
            return Pending::ready(s.node, Err(e));
        }
        Pending::waiting(s.node, slot, s.op_timeout, Some(self.timeout_hook()))
    }

    /// Sends an RPC and returns at once; the reply completes the returned pending (the
    /// caller may keep many in flight).
    fn rpc_pending(self: &Arc<Self>, body: &[u8]) -> Pending<Vec<u8>> {
        if !self.alive.load(Ordering::SeqCst) {
            return Pending::ready(self.node, Err(self.dead()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Slot::new();
        self.rpcs.lock().insert(id, Reply::Rpc(slot.clone()));
        if let Err(e) = self.chan.send(kind::RPC, id, body, self.op_timeout) {
            self.rpcs.lock().remove(&id);
            return Pending::ready(self.node, Err(e));
        }
        Pending::waiting(self.node, slot, self.op_timeout, Some(self.timeout_hook()))
            .with_progress(self.progress())
    }

    /// Queues the persist request of `f` (its durable writes completed) for the sender
    /// thread; the node's answer completes `f` (see `deliver`).
    fn send_persist(self: &Arc<Self>, f: InFlight) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = f.persist().to_vec();
        self.rpcs.lock().insert(id, Reply::Persist(f));
        let tx = self.persist_tx.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<(u64, Vec<u8>)>();
            // Weak: the thread ends with the connection (its queue's sender goes with it).
            let weak = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name(format!("dmkit-rdma-persist-{}", self.node))
                .spawn(move || {
                    for (id, body) in rx {
                        let Some(s) = weak.upgrade() else { return };
                        if let Err(e) = s.chan.send(kind::PERSIST, id, &body, s.op_timeout) {
                            if let Some(Reply::Persist(f)) = s.rpcs.lock().remove(&id) {
                                f.slot.complete(Err(e));
                            }
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(node = %self.node, error = %e, "cannot start the persist sender");
            }
            Mutex::new(tx)
        });
        if tx.lock().send((id, body)).is_err() {
            if let Some(Reply::Persist(f)) = self.rpcs.lock().remove(&id) {
                f.slot.complete(Err(Error::Disconnected {
                    node: self.node,
                    reason: "the persist sender thread is gone".into(),
                }));
            }
        }
    }

    fn kill(&self, reason: String) {
        if self.alive.swap(false, Ordering::SeqCst) {
            tracing::debug!(node = %self.node, peer = %self.peer, %reason, "rdma connection down");
            *self.reason.lock() = Some(reason.clone());
            self.id.qp_to_error();
            self.id.disconnect();
        }
        let e = || Error::Disconnected {
            node: self.node,
            reason: reason.clone(),
        };
        for (_, r) in self.rpcs.lock().drain() {
            match r {
                Reply::Message(s) => s.complete(Err(e())),
                Reply::Rpc(s) => s.complete(Err(e())),
                Reply::Persist(f) => f.slot.complete(Err(e())),
            }
        }
        // Buffers stay in `inflight` until the flush completions say the NIC is done.
        for f in self.inflight.lock().values() {
            f.slot.complete(Err(e()));
        }
        self.sq_cv.notify_all();
    }

    /// The node's answer to `f`'s persist request: the batch completes (with a persist
    /// fault on its first durable write if the node could not persist).
    fn persisted(&self, mut f: InFlight, m: &chan::Message) {
        if m.kind != kind::PERSIST_RESP || m.body != [0] {
            let index = f
                .ops
                .iter()
                .position(|o| matches!(o.kind, OpKind::Write { durable: true }))
                .unwrap_or(0);
            f.extra.get_or_insert_with(Box::default).fault =
                Some((index, AccessFault::PersistFailed));
        }
        self.finish(f);
    }

    fn finish(&self, f: InFlight) {
        f.slot.complete(completed(f.node, f.ops, f.bufs, f.extra));
    }

    /// The error a failed completion `wc` of a batch of `ops` reports.
    fn wc_error(&self, wc: &sys::ibv_wc, ops: &[Op]) -> Error {
        match wc.status {
            sys::IBV_WC_RETRY_EXC_ERR => Error::Timeout {
                node: self.node,
                after: self.op_timeout,
            },
            sys::IBV_WC_REM_ACCESS_ERR => {
                self.healable.store(true, Ordering::SeqCst);
                let index = (wc.wr_id & 0xffff) as usize;
                let op = ops.get(index).unwrap_or(&ops[0]);
                // Our table said the rkey was valid: the node dropped the region.
                Error::refused(self.node, index, op, AccessFault::UnknownRkey)
            }
            _ => Error::Disconnected {
                node: self.node,
                reason: status_reason(wc.status),
            },
        }
    }

    fn on_batch_wc(self: &Arc<Self>, wc: &sys::ibv_wc) {
        let id = wc.wr_id >> 16;
        if wc.status != sys::IBV_WC_SUCCESS {
            if let Some(f) = self.inflight.lock().remove(&id) {
                f.slot.complete(Err(self.wc_error(wc, &f.ops)));
            }
            if wc.status != sys::IBV_WC_WR_FLUSH_ERR {
                self.kill(format!("work request failed: {}", status_reason(wc.status)));
            }
            return;
        }
        let (done, credit) = {
            let mut m = self.inflight.lock();
            let Some(f) = m.get_mut(&id) else { return };
            // RC completes in order: this is the next chunk's signalled (last) WR.
            let k = f.chunks - f.signaled_left;
            let credit = if k + 1 == f.chunks {
                f.wrs - f.chunk * (f.chunks as u32 - 1)
            } else {
                f.chunk
            };
            f.signaled_left -= 1;
            let done = if f.signaled_left > 0 {
                None
            } else {
                m.remove(&id)
            };
            (done, credit)
        };
        *self.sq_free.lock() += credit;
        self.sq_cv.notify_all();
        let Some(f) = done else { return };
        if f.persist().is_empty() || f.fault().is_some() {
            self.finish(f);
            return;
        }
        // Durable writes to persistent memory: the data has been flushed to the node's memory
        // by the read-after-write; now the node persists it, then the batch completes.
        self.send_persist(f);
    }
}

/// A batch's result once its last completion arrived: atomics' old values, reads through
/// bounce buffers copied out, or the fault found when it was checked.
fn completed(
    node: NodeId,
    ops: Vec<Op>,
    mut bufs: Vec<MemBuf>,
    mut extra: Option<Box<Extra>>,
) -> Result<BatchResult> {
    // (Only batches with atomics have old values: no allocation for the others.)
    let mut olds = Vec::new();
    if let Some(x) = &mut extra {
        if let Some(a) = &x.atomics {
            olds.resize(ops.len(), 0u64);
            for (i, o) in olds.iter_mut().enumerate() {
                let at = i * 8;
                if matches!(ops[i].kind, OpKind::Cas { .. } | OpKind::Faa { .. }) {
                    *o = u64::from_ne_bytes(a[at..at + 8].try_into().expect("8 bytes"));
                }
            }
        }
        for (i, b) in std::mem::take(&mut x.bounce_reads) {
            if let Some(dst) = ops[i].buf {
                bufs[dst].copy_from_slice(&b);
            }
        }
        if let Some((index, fault)) = x.fault {
            return Err(Error::refused(node, index, &ops[index], fault));
        }
    }
    let mut r = BatchResult::new(node, ops, bufs);
    r.olds = olds;
    Ok(r)
}

fn status_reason(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any status.
    let s = unsafe { std::ffi::CStr::from_ptr(sys::ibv_wc_status_str(status)) };
    format!("{} ({status})", s.to_string_lossy())
}

thread_local! {
    /// Set while this thread delivers completions: it must not wait for an RPC answer,
    /// which only a poller delivers.
    static IN_POLL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Polls the CQ once and delivers what it finds; the number of completions. Callers hold
/// `poll_lock`. `check_cm` also reads the node's disconnect notices: that costs a system
/// call, so only the poll thread does it (within 20 ms of any notice), never a spinning waiter.
fn poll_once(s: &Arc<Shared>, cq: &Cq, wcs: &mut [sys::ibv_wc], check_cm: bool) -> usize {
    IN_POLL.with(|f| f.set(true));
    let n = poll_once_inner(s, cq, wcs, check_cm);
    IN_POLL.with(|f| f.set(false));
    n
}

fn poll_once_inner(s: &Arc<Shared>, cq: &Cq, wcs: &mut [sys::ibv_wc], check_cm: bool) -> usize {
    // Disconnect notices from the node.
    while let Some(ev) = check_cm.then(|| s.cm.next(Duration::ZERO)).flatten() {
        if matches!(
            ev.kind,
            sys::RDMA_CM_EVENT_DISCONNECTED | sys::RDMA_CM_EVENT_DEVICE_REMOVAL
        ) {
            s.kill(format!(
                "the memory node disconnected ({})",
                ffi::event_name(ev.kind)
            ));
        }
    }
    let n = match cq.poll(wcs) {
        Ok(n) => n,
        Err(e) => {
            s.kill(e.to_string());
            0
        }
    };
    for wc in &wcs[..n] {
        deliver(s, wc);
    }
    n
}

/// Hands one completion to whoever waits for it.
fn deliver(s: &Arc<Shared>, wc: &sys::ibv_wc) {
    {
        let tag = wc.wr_id & chan::TAG_MASK;
        if tag == chan::TAG_SEND {
            s.chan.on_send_done(wc.wr_id);
            if wc.status != sys::IBV_WC_SUCCESS && wc.status != sys::IBV_WC_WR_FLUSH_ERR {
                s.kill(format!("send failed: {}", status_reason(wc.status)));
            }
        } else if tag == chan::TAG_RECV {
            if wc.status != sys::IBV_WC_SUCCESS {
                return;
            }
            match s.chan.on_recv(wc.wr_id, wc.byte_len as usize) {
                Ok(Some(m)) => {
                    let waiting = s.rpcs.lock().remove(&m.req);
                    match waiting {
                        Some(Reply::Message(slot)) => slot.complete(Ok(m)),
                        Some(Reply::Rpc(slot)) => slot.complete(if m.kind == kind::RPC_OK {
                            Ok(m.body)
                        } else {
                            Err(Error::Rpc {
                                node: s.node,
                                reason: String::from_utf8_lossy(&m.body).into_owned(),
                            })
                        }),
                        Some(Reply::Persist(f)) => s.persisted(f, &m),
                        None => {}
                    }
                }
                Ok(None) => {}
                Err(e) => s.kill(e.to_string()),
            }
            s.chan.maybe_return_credits();
        } else {
            s.on_batch_wc(wc);
        }
    }
}

/// The work request id of [`RdmaConnection::raw_read_latencies`]' READs (batch 0, which
/// no batch uses).
const RAW_WR_ID: u64 = 0xffff;

/// Completions taken off the CQ per poll.
const POLL_BATCH: usize = 16;

impl RdmaConnection {
    /// Diagnostics (`dmkit bench verbs` on rdma): `n` READs of `len` bytes at `at`, each
    /// posted straight on this connection's queue pair into one registered buffer and
    /// polled for on its completion queue by this thread, with nothing else of the verbs
    /// path around them: the floor this process reaches on the device, to set beside perftest
    /// and beside the full path. Returns each READ's time in `now`'s units (`now` is read
    /// before the post and after the completion). Other completions that turn up meanwhile
    /// are delivered as usual.
    #[doc(hidden)]
    pub fn raw_read_latencies(
        &self,
        at: crate::RemoteAddr,
        len: u32,
        n: usize,
        now: &dyn Fn() -> u64,
    ) -> Result<Vec<u64>> {
        let s = self.shared();
        if !s.alive.load(Ordering::SeqCst) {
            return Err(s.dead());
        }
        let op = Op {
            kind: OpKind::Read,
            rkey: at.rkey,
            addr: at.addr,
            len,
            buf: None,
        };
        let r =
            check(&s.regions.lock(), &op).map_err(|fault| Error::refused(s.node, 0, &op, fault))?;
        let mut buf = s.alloc.alloc(len as usize)?;
        let wr = Wr {
            id: RAW_WR_ID,
            kind: WrKind::Read {
                raddr: r.va + (at.addr - r.desc.base),
                rkey: r.nic_rkey,
            },
            addr: buf.as_mut_ptr() as u64,
            len,
            lkey: buf.lkey(),
            signaled: true,
            inline: false,
        };
        // The poll thread and waiters stay off the CQ meanwhile.
        let _g = s.poll_lock.lock();
        {
            let mut free = s.sq_free.lock();
            if *free == 0 {
                return Err(Error::InvalidArgument("the send queue is full".into()));
            }
            *free -= 1;
        }
        let mut out = Vec::with_capacity(n);
        let mut wcs = [sys::ibv_wc::default(); 16];
        let mut result = Ok(());
        // Whether a READ may still be outstanding when we stop (then `buf` must not be
        // reused: it is leaked, on that failure path only).
        let mut outstanding = false;
        'ops: for _ in 0..n {
            // (As a waiter: the poll thread keeps off completion events meanwhile.)
            s.waiter_polls.fetch_add(1, Ordering::Relaxed);
            let t0 = now();
            // SAFETY: `buf` is registered and owned here; each READ is waited for before
            // the next, and `buf` is leaked below if one may still be outstanding.
            if let Err(e) = unsafe { post::post_send(s.id.qp(), std::slice::from_ref(&wr)) } {
                result = Err(e);
                break;
            }
            outstanding = true;
            // The clock is read only after many empty polls (it can cost a system call).
            let (mut empty, mut deadline) = (0u32, None);
            loop {
                let got = match s.cq.poll(&mut wcs) {
                    Ok(k) => k,
                    Err(e) => {
                        result = Err(e);
                        break 'ops;
                    }
                };
                let mut mine = None;
                for wc in &wcs[..got] {
                    if wc.wr_id == RAW_WR_ID {
                        mine = Some(wc.status);
                    } else {
                        deliver(&s, wc);
                    }
                }
                match mine {
                    Some(st) if st == sys::IBV_WC_SUCCESS => break,
                    Some(st) => {
                        outstanding = false;
                        let why = format!("raw READ failed: {}", status_reason(st));
                        s.kill(why.clone());
                        result = Err(Error::Disconnected {
                            node: s.node,
                            reason: why,
                        });
                        break 'ops;
                    }
                    None if got == 0 => {
                        empty += 1;
                        if empty % 4096 == 0 {
                            let d = *deadline.get_or_insert_with(|| Instant::now() + s.op_timeout);
                            if Instant::now() > d {
                                s.kill("raw READ timed out".into());
                                result = Err(Error::Timeout {
                                    node: s.node,
                                    after: s.op_timeout,
                                });
                                break 'ops;
                            }
                        }
                        std::hint::spin_loop();
                    }
                    None => {}
                }
            }
            outstanding = false;
            out.push(now().wrapping_sub(t0));
        }
        if outstanding {
            std::mem::forget(buf);
        }
        *s.sq_free.lock() += 1;
        result.map(|()| out)
    }
}

/// One verb of [`RdmaConnection::raw_round`] (diagnostics): what, where, how long. CAS and FAA
/// compare with and add 0; WRITEs write whatever the scratch buffer holds.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct RawVerb {
    pub kind: crate::record::VerbKind,
    pub at: crate::RemoteAddr,
    pub len: u32,
}

/// A part of a raw round posted on one connection, waiting for its signalled completion.
struct RawPart<'a> {
    s: Arc<Shared>,
    _poll: parking_lot::MutexGuard<'a, Box<[sys::ibv_wc; POLL_BATCH]>>,
    buf: Option<MemBuf>,
    wrs: u32,
    done: bool,
}

impl RdmaConnection {
    /// Diagnostics (`dmkit bench fusee --workload micro` on rdma): one round trip made of
    /// `parts` — each connection's verbs posted straight on its queue pair with one doorbell
    /// (the last work request signalled, as the verbs path does) into one registered scratch
    /// buffer — then every queue's completion polled for by this thread, with nothing of the
    /// verbs path around them: the floor of the same round the full path runs. A durable
    /// WRITE gets the read-after-write READ the full path adds. Other completions that turn
    /// up meanwhile are delivered as usual. Meant for scratch memory: WRITEs overwrite it.
    #[doc(hidden)]
    pub fn raw_round(parts: &[(&RdmaConnection, &[RawVerb])]) -> Result<()> {
        // Parts on one connection are posted under one poll lock, a doorbell each.
        let mut shared: Vec<Arc<Shared>> = Vec::new();
        let mut lists: Vec<Vec<&[RawVerb]>> = Vec::new();
        for (c, verbs) in parts {
            let s = c.shared();
            match shared.iter().position(|x| Arc::ptr_eq(x, &s)) {
                Some(i) => lists[i].push(verbs),
                None => {
                    shared.push(s);
                    lists.push(vec![verbs]);
                }
            }
        }
        let mut posted: Vec<RawPart<'_>> = Vec::with_capacity(shared.len());
        let mut result = Ok(());
        for (s, verbs) in shared.iter().zip(&lists) {
            if let Err(e) = raw_post(s, verbs).map(|(g, buf, wrs)| {
                posted.push(RawPart {
                    s: s.clone(),
                    _poll: g,
                    buf,
                    wrs,
                    done: false,
                })
            }) {
                result = Err(e);
                break;
            }
        }
        let mut wcs = [sys::ibv_wc::default(); POLL_BATCH];
        for s in &shared {
            // (As a waiter: the poll thread keeps off completion events meanwhile.)
            s.waiter_polls.fetch_add(1, Ordering::Relaxed);
        }
        let deadline = Instant::now() + shared.first().map_or(Duration::ZERO, |s| s.op_timeout);
        let mut empty = 0u32;
        while posted.iter().any(|p| !p.done) {
            let mut got = 0;
            for p in posted.iter_mut().filter(|p| !p.done) {
                let n = match p.s.cq.poll(&mut wcs) {
                    Ok(n) => n,
                    Err(e) => {
                        p.s.kill(e.to_string());
                        p.done = true;
                        result = Err(e);
                        continue;
                    }
                };
                got += n;
                for wc in &wcs[..n] {
                    if wc.wr_id != RAW_WR_ID {
                        deliver(&p.s, wc);
                        continue;
                    }
                    p.done = true;
                    if wc.status != sys::IBV_WC_SUCCESS {
                        let why = format!("raw round failed: {}", status_reason(wc.status));
                        p.s.kill(why.clone());
                        result = Err(Error::Disconnected {
                            node: p.s.node,
                            reason: why,
                        });
                    }
                }
            }
            if got == 0 {
                empty += 1;
                if empty % 4096 == 0 && Instant::now() > deadline {
                    for p in posted.iter_mut().filter(|p| !p.done) {
                        p.s.kill("raw round timed out".into());
                        // The NIC may still write into the buffer: it is never reused.
                        std::mem::forget(p.buf.take());
                        p.done = true;
                    }
                    result = Err(Error::Timeout {
                        node: shared[0].node,
                        after: shared[0].op_timeout,
                    });
                }
                std::hint::spin_loop();
            }
        }
        for p in &posted {
            *p.s.sq_free.lock() += p.wrs;
            p.s.sq_cv.notify_all();
        }
        result
    }
}

/// Posts one connection's part of a raw round (holding its poll lock, so no other thread
/// takes the completion off its queue): the lock, the scratch buffer and the WR count.
#[allow(clippy::type_complexity)]
fn raw_post<'a>(
    s: &'a Arc<Shared>,
    lists: &[&[RawVerb]],
) -> Result<(
    parking_lot::MutexGuard<'a, Box<[sys::ibv_wc; POLL_BATCH]>>,
    Option<MemBuf>,
    u32,
)> {
    use crate::record::VerbKind;
    if !s.alive.load(Ordering::SeqCst) {
        return Err(s.dead());
    }
    let table = s.regions.lock().clone();
    let verbs = lists.iter().flat_map(|l| l.iter());
    let total: usize = verbs.clone().map(|v| (v.len as usize).max(8)).sum();
    let mut buf = s.alloc.alloc(total.max(8))?;
    let base = buf.as_mut_ptr() as u64;
    let mut off = 0u64;
    // One doorbell per list: where each list's work requests end.
    let mut wrs: Vec<Wr> = Vec::new();
    let mut ends = Vec::with_capacity(lists.len());
    let mut left = lists.iter().map(|l| l.len());
    let mut in_list = left.next().unwrap_or(0);
    let op_kind = |k: VerbKind| match k {
        VerbKind::Read => OpKind::Read,
        VerbKind::Write { durable } => OpKind::Write { durable },
        VerbKind::Cas => OpKind::Cas { expect: 0, new: 0 },
        VerbKind::Faa => OpKind::Faa { add: 0 },
    };
    // The flush READs the full path adds (per batch: one list is one batch).
    let flush: Vec<bool> = lists
        .iter()
        .flat_map(|l| crate::batch::flushes(l.iter().map(|v| (op_kind(v.kind), v.len))))
        .collect();
    for (i, v) in verbs.enumerate() {
        while in_list == 0 {
            ends.push(wrs.len());
            in_list = left.next().unwrap_or(usize::MAX);
        }
        in_list -= 1;
        let kind = op_kind(v.kind);
        let op = Op {
            kind,
            rkey: v.at.rkey,
            addr: v.at.addr,
            len: v.len,
            buf: None,
        };
        let r = check(&table, &op).map_err(|fault| Error::refused(s.node, i, &op, fault))?;
        let raddr = r.va + (v.at.addr - r.desc.base);
        let rkey = r.nic_rkey;
        let mut wr = Wr {
            id: RAW_WR_ID,
            kind: WrKind::Send,
            addr: base + off,
            len: v.len,
            lkey: buf.lkey(),
            signaled: false,
            inline: false,
        };
        match kind {
            OpKind::Read => wr.kind = WrKind::Read { raddr, rkey },
            OpKind::Write { durable } => {
                wr.kind = WrKind::Write { raddr, rkey };
                wr.inline = v.len <= s.max_inline;
                if durable && v.len > 0 && flush[i] {
                    wrs.push(wr);
                    let tail = v.len.min(8);
                    wr = Wr {
                        id: RAW_WR_ID,
                        kind: WrKind::Read {
                            raddr: raddr + u64::from(v.len - tail),
                            rkey,
                        },
                        addr: base + off,
                        len: tail,
                        lkey: buf.lkey(),
                        signaled: false,
                        inline: false,
                    };
                }
            }
            OpKind::Cas { .. } => {
                wr.kind = WrKind::Cas {
                    raddr,
                    rkey,
                    expect: 0,
                    swap: 0,
                };
                wr.len = 8;
            }
            OpKind::Faa { .. } => {
                wr.kind = WrKind::Faa {
                    raddr,
                    rkey,
                    add: 0,
                };
                wr.len = 8;
            }
        }
        wrs.push(wr);
        off += u64::from(v.len).max(8);
    }
    ends.push(wrs.len());
    let n = wrs.len() as u32;
    if wrs.is_empty() || n > s.sq_depth / 2 {
        return Err(Error::InvalidArgument(format!(
            "a raw round part takes 1..={} work requests, not {n}",
            s.sq_depth / 2
        )));
    }
    wrs.last_mut().expect("non-empty").signaled = true;
    let g = s.poll_lock.lock();
    if !s.take_send_slots(n) {
        return Err(s.dead());
    }
    let mut start = 0;
    for end in ends {
        if end == start {
            continue;
        }
        // SAFETY: every local segment lies in `buf`, a registered buffer the caller keeps until
        // this part's signalled completion (RC completes in order, so it implies the others) or,
        // on a timeout, leaks; the QP is alive (checked above) and its CQ is polled only by the
        // caller while it holds the poll lock returned here.
        if let Err(e) = unsafe { post::post_send(s.id.qp(), &wrs[start..end]) } {
            // Earlier lists may be in flight: the connection goes, and the buffer with it.
            s.kill(format!("raw post failed: {e}"));
            std::mem::forget(buf);
            return Err(e);
        }
        start = end;
    }
    Ok((g, Some(buf), n))
}

fn poll_loop(weak: &std::sync::Weak<Shared>, cq: &Cq) {
    let mut dead_since: Option<Instant> = None;
    // Waiter polls last seen, and for how many rounds of this loop the count stood still.
    let (mut seen, mut still) = (0u64, u32::MAX);
    // How long to sleep while waiters drive the CQ: doubles while they find everything
    // (each wake-up of this thread takes a core from them: on a two-core emulated guest a
    // millisecond tick per connection cost more than the waiters' own polling).
    let mut backoff = Duration::from_millis(1);
    loop {
        let Some(s) = weak.upgrade() else { return };
        // (A thread holding the lock is polling: it delivers what is there. Waiting for the
        // lock would only cost it a wake-up of this thread when it lets go.)
        let n = match s.poll_lock.try_lock() {
            Some(mut wcs) => poll_once(&s, cq, &mut wcs[..], true),
            None => 0,
        };
        if !s.alive.load(Ordering::SeqCst) {
            let t = *dead_since.get_or_insert_with(Instant::now);
            if s.inflight.lock().is_empty() || t.elapsed() > Duration::from_secs(2) {
                return;
            }
        }
        let polls = s.waiter_polls.load(Ordering::Relaxed);
        if polls == seen {
            still = still.saturating_add(1);
        } else {
            (seen, still) = (polls, 0);
        }
        // Waiters polled within the last few rounds (at most ~80 ms).
        let spinning = still < 5;
        // Nothing this connection waits for: the thread sleeps until the CQ signals (its
        // events are armed: a completion, or the flush of the posted receives when the QP
        // goes to error on a disconnect or a drop) — the timeout is only a backstop. Each
        // timed wake-up costs a clock read, which in an emulated guest (HPET clock source)
        // is a slow exit: at 20 ms per connection an idle r = 3 cluster kept ~70 % of a
        // SoftRoCE guest's CPU busy.
        let idle = s.inflight.lock().is_empty() && s.rpcs.lock().is_empty();
        drop(s);
        if n > 0 {
            backoff = Duration::from_millis(1);
        } else if spinning {
            // A waiter is driving the CQ: only back it up for completions nobody waits
            // for (proxied writes), without waking on each event.
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(16));
        } else if idle {
            cq.wait(IDLE_WAIT);
        } else {
            cq.wait(Duration::from_millis(20));
        }
    }
}

/// The backstop of an idle poll thread's wait on its CQ's events (see `poll_loop`).
pub(crate) const IDLE_WAIT: Duration = Duration::from_millis(1000);

/// Checks one op against the region table: the same checks, in the same order, as the soft
/// NIC (`MemoryNode::execute`).
fn check(table: &Table, op: &Op) -> Result<RemoteRegion, AccessFault> {
    if table.fenced {
        return Err(AccessFault::Fenced);
    }
    let r = table
        .regions
        .iter()
        .find(|r| r.desc.rkey == op.rkey)
        .ok_or(AccessFault::UnknownRkey)?;
    let (need, what) = op.kind.needs();
    if !r.desc.access.contains(need) {
        return Err(AccessFault::NoAccess(what));
    }
    if !r.desc.contains(op.addr, u64::from(op.len)) {
        return Err(AccessFault::OutOfBounds);
    }
    if matches!(op.kind, OpKind::Cas { .. } | OpKind::Faa { .. })
        && (op.len != 8 || (op.addr - r.desc.base) % 8 != 0)
    {
        return Err(AccessFault::Misaligned);
    }
    Ok(*r)
}

impl RdmaConnection {
    /// `f` over the node's region table as this connection knows it.
    fn region_table<R>(&self, f: impl FnOnce(&super::wire::Table) -> R) -> R {
        f(&self.current.lock().regions.lock())
    }
}

impl Connection for RdmaConnection {
    fn node(&self) -> NodeId {
        self.current.lock().node
    }

    fn regions(&self) -> Vec<RegionDesc> {
        self.region_table(|t| t.regions.iter().map(|r| r.desc).collect())
    }

    fn refresh_regions(&self) -> Result<Vec<RegionDesc>> {
        self.shared().refresh_regions()
    }

    /// A DRAM region's write is placed before the later verbs of its queue pair execute (RC
    /// order); an NVM region's is durable only once the node answers the batch's persist
    /// request, after all of them. (An unknown region: not known to be ordered.)
    fn durable_in_order(&self, rkey: crate::types::RKey) -> bool {
        self.region_table(|t| {
            t.regions
                .iter()
                .find(|r| r.desc.rkey == rkey)
                .is_some_and(|r| r.desc.media != Media::Nvm)
        })
    }

    fn post(&self, batch: Batch, _ctx: PostCtx) -> Pending<BatchResult> {
        let s = &self.shared();
        match s.build(batch) {
            Ok(b) => s.post_built(b),
            Err(r) => Pending::ready(s.node, r),
        }
    }

    fn post_blocking(&self, batch: Batch, _ctx: PostCtx) -> Executed {
        let s = &self.shared();
        match s.build(batch) {
            Ok(b) => s.execute_built(b),
            Err(r) => Executed::Done(r),
        }
    }

    fn rpc(&self, req: &[u8], _ctx: PostCtx) -> Pending<Vec<u8>> {
        self.shared().rpc_pending(req)
    }

    fn is_alive(&self) -> bool {
        let s = self.current.lock();
        s.alive.load(Ordering::SeqCst) || s.healable.load(Ordering::SeqCst)
    }

    fn close(&self) {
        let s = self.current.lock();
        s.healable.store(false, Ordering::SeqCst);
        s.kill("connection closed by the client".into());
    }

    fn timeout(&self) -> Duration {
        self.config.op_timeout
    }

    fn in_flight(&self) -> usize {
        let s = self.shared();
        s.inflight.lock().len() + s.rpcs.lock().len()
    }
}

impl Drop for RdmaConnection {
    fn drop(&mut self) {
        self.current.lock().kill("connection dropped".into());
    }
}
