//! The memory-node side: listens with rdma-cm, registers the node's regions with the NIC,
//! accepts RC connections and serves the two-sided part (region table, RPC, persist
//! requests). One-sided verbs never reach this code: the NIC executes them.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::chan::{self, Chan, Message, kind};
use super::ffi::{CmId, Context, Cq, EventChannel, Mr, QpSizes};
use super::wire::{self, RemoteRegion, Table};
use super::{RdmaConfig, device_pd, sys};
use crate::error::{Error, Result};
use crate::memory::RegionMemory;
use crate::node::{MemoryNode, Peer};
use crate::types::{Access, RKey};

/// A region's memory registered with one device.
#[derive(Debug)]
struct NodeMr {
    mr: Mr,
    va: u64,
    // Declared after `mr`: the memory outlives its registration.
    _mem: RegionMemory,
}

struct Conn {
    id: Arc<CmId>,
    chan: Chan,
    ctx: Context,
    stop: AtomicBool,
    saved: Mutex<Option<Box<sys::ibv_qp_attr>>>,
    tx: Mutex<mpsc::Sender<Work>>,
    /// Persist requests go to a worker of their own: an RPC never queues behind a burst of
    /// durable writes' persists (nothing orders the two: a durable write completes only
    /// once its persist is answered).
    persist_tx: Mutex<mpsc::Sender<Work>>,
    peer: Peer,
}

/// What a connection's worker does next.
enum Work {
    /// Answer a request.
    Request(Message),
    /// Send a reply the poll thread computed (a quick RPC) but could not send without
    /// waiting for credits.
    Reply(Message),
    /// Nothing: the connection closes (wakes a worker blocked on its queue).
    Wake,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("peer", &self.peer).finish()
    }
}

#[derive(Debug)]
struct Shared {
    node: Arc<MemoryNode>,
    cfg: RdmaConfig,
    stop: AtomicBool,
    paused: AtomicBool,
    conns: Mutex<HashMap<usize, Arc<Conn>>>,
    mrs: Mutex<HashMap<(usize, RKey), Arc<NodeMr>>>,
    next_conn: AtomicU64,
    /// Ends the listener's wait when the server shuts down.
    waker: super::ffi::Waker,
}

/// A memory node served over RDMA. Dropping it (or [`RdmaServer::shutdown`]) disconnects
/// every client, as a crash would look to them.
#[derive(Debug)]
pub struct RdmaServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    listener: Option<JoinHandle<()>>,
}

impl RdmaServer {
    /// Listens on `addr` (an IPv4 address of an RDMA device, port 0 for any) and serves
    /// `node` on background threads.
    pub fn start(addr: &str, node: Arc<MemoryNode>, cfg: RdmaConfig) -> Result<RdmaServer> {
        let sa = addr
            .to_socket_addrs()
            .map_err(|e| Error::Connect {
                addr: addr.into(),
                reason: e.to_string(),
            })?
            .next()
            .ok_or_else(|| Error::InvalidArgument(format!("{addr}: no address")))?;
        let sa = super::ffi::v4(sa)?;
        let with_addr = |e: Error| match e {
            Error::Connect { reason, .. } => Error::Connect {
                addr: addr.into(),
                reason,
            },
            e => e,
        };
        // Fail early, with the device named, on a machine without a usable device.
        super::select_device(&cfg).map_err(with_addr)?;
        let channel = EventChannel::new().map_err(with_addr)?;
        let id = CmId::new(&channel).map_err(with_addr)?;
        id.bind(sa).map_err(with_addr)?;
        id.listen(128).map_err(with_addr)?;
        let port = super::bound_port(&id);
        let local = SocketAddr::new((*sa.ip()).into(), port);
        let shared = Arc::new(Shared {
            node,
            cfg,
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            mrs: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            waker: super::ffi::Waker::new().map_err(with_addr)?,
        });
        // A rekey, a removed region or a fence drops the NIC registrations of the rkeys
        // peers may still hold, at once: their verbs then fail at the NIC, as they are
        // refused by the node itself on the other backends.
        // Bound to one interface's address, the id knows its device: register the node's
        // memory now, so a registration the NIC or the memlock limit refuses stops the start
        // with that error, rather than each client's connection later.
        if let Some(ctx) = id.context() {
            region_table(&shared, ctx).map_err(with_addr)?;
        }
        let w = Arc::downgrade(&shared);
        shared.node.on_change(move || match w.upgrade() {
            Some(s) => {
                drop_stale_mrs(&s);
                true
            }
            None => false,
        });
        let s = shared.clone();
        let listener = std::thread::Builder::new()
            .name(format!("dmkit-rdma-listen-{}", s.node.id()))
            .spawn(move || listen_loop(&s, &channel, id))?;
        tracing::debug!(addr = %local, node = %shared.node.id(), "accepting connections over rdma");
        Ok(RdmaServer {
            shared,
            addr: local,
            listener: Some(listener),
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn node(&self) -> &Arc<MemoryNode> {
        &self.shared.node
    }

    /// Open client connections.
    pub fn connections(&self) -> usize {
        self.shared.conns.lock().len()
    }

    /// Emulates a hung node, for tests: `true` moves every connection's QP to RESET, where
    /// the NIC drops all incoming packets, so clients' one-sided verbs and RPCs go
    /// unanswered and their NICs retransmit; `false` brings the QPs back to RTS expecting the
    /// same packet sequence numbers, so the retransmissions are accepted and everything
    /// completes. (A pause longer than the clients' retry budget — ack timeout × retry
    /// count — breaks their connections, as a real hung node would.)
    pub fn pause(&self, paused: bool) {
        if self.shared.paused.swap(paused, Ordering::SeqCst) == paused {
            return;
        }
        for c in self.shared.conns.lock().values() {
            if paused {
                match c.id.suspend() {
                    Ok(a) => *c.saved.lock() = Some(a),
                    Err(e) => tracing::warn!(error = %e, "cannot suspend a QP"),
                }
            } else if let Some(a) = c.saved.lock().take() {
                let r = c.id.restore(&a).and_then(|()| {
                    c.chan.reset_credits();
                    c.chan.post_all_recvs()
                });
                if let Err(e) = r {
                    tracing::warn!(error = %e, "cannot resume a QP");
                }
            }
        }
    }

    /// Stops accepting and disconnects every client.
    pub fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        self.shared.waker.wake();
        for (_, c) in self.shared.conns.lock().drain() {
            c.close();
        }
        if let Some(h) = self.listener.take() {
            let _ = h.join();
        }
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Conn {
    fn close(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.id.disconnect();
        self.id.qp_to_error();
        // Wake both workers (they block on their queues with no timeout): each sees `stop`.
        for q in [&self.tx, &self.persist_tx] {
            let _ = q.lock().send(Work::Wake);
        }
    }
}

fn listen_loop(shared: &Arc<Shared>, channel: &Arc<EventChannel>, _listen: CmId) {
    while !shared.stop.load(Ordering::SeqCst) {
        // (A connection request wakes it, and so does `shutdown`: no timed wake-ups while
        // idle — each costs a clock read, slow in an emulated guest.)
        let Some(ev) = channel.next_or_woken(Duration::from_secs(5), Some(&shared.waker)) else {
            continue;
        };
        match ev.kind {
            sys::RDMA_CM_EVENT_CONNECT_REQUEST => {
                // SAFETY: a CONNECT_REQUEST's id is new and ours; it is on this channel.
                let id = unsafe { CmId::adopt(ev.id, channel) };
                if let Err(e) = accept(shared, id) {
                    tracing::warn!(error = %e, "rejecting an rdma connection");
                }
            }
            sys::RDMA_CM_EVENT_ESTABLISHED => {
                if let Some(c) = shared.conns.lock().get(&(ev.id as usize)) {
                    let _ = c.tx.lock().send(Work::Request(Message {
                        kind: kind::WELCOME,
                        req: 0,
                        body: Vec::new(),
                    }));
                }
            }
            sys::RDMA_CM_EVENT_DISCONNECTED
            | sys::RDMA_CM_EVENT_CONNECT_ERROR
            | sys::RDMA_CM_EVENT_UNREACHABLE
            | sys::RDMA_CM_EVENT_REJECTED => {
                if let Some(c) = shared.conns.lock().remove(&(ev.id as usize)) {
                    tracing::debug!(peer = %c.peer.addr, "rdma client disconnected");
                    c.close();
                }
            }
            _ => {}
        }
    }
}

fn access_flags(a: Access) -> u32 {
    let mut f = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if a.contains(Access::REMOTE_READ) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(Access::REMOTE_ATOMIC) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    }
    f
}

/// Drops the registrations of rkeys the node no longer has (rekeyed or removed regions), and
/// all of them while it is fenced. Verbs that still use them fail at the NIC with a remote
/// access error (which breaks the peer's connection, as RC does).
fn drop_stale_mrs(shared: &Shared) {
    let fenced = shared.node.is_fenced();
    let descs = shared.node.regions();
    let stale: Vec<Arc<NodeMr>> = {
        let mut mrs = shared.mrs.lock();
        let keys: Vec<_> = mrs
            .keys()
            .filter(|(_, rkey)| fenced || !descs.iter().any(|d| d.rkey == *rkey))
            .copied()
            .collect();
        keys.iter().filter_map(|k| mrs.remove(k)).collect()
    };
    if !stale.is_empty() {
        tracing::debug!(
            node = %shared.node.id(),
            count = stale.len(),
            fenced,
            "dropping NIC registrations of old rkeys"
        );
    }
    // Deregistered here, outside the lock (it can take a while for large regions).
    drop(stale);
}

/// Registers every region of the node with `ctx`'s device (once) and drops registrations of
/// regions the node removed; returns the table clients get. A fenced node registers nothing
/// and says so.
fn region_table(shared: &Shared, ctx: Context) -> Result<Table> {
    let pd = device_pd(ctx)?;
    loop {
        if shared.node.is_fenced() {
            drop_stale_mrs(shared);
            let regions = shared
                .node
                .regions()
                .into_iter()
                .map(|desc| RemoteRegion {
                    desc,
                    nic_rkey: 0,
                    va: 0,
                })
                .collect();
            return Ok(Table {
                regions,
                fenced: true,
            });
        }
        let descs = shared.node.regions();
        let mut mrs = shared.mrs.lock();
        let c = ctx.raw() as usize;
        mrs.retain(|(dc, rkey), _| *dc != c || descs.iter().any(|d| d.rkey == *rkey));
        let mut out = Vec::with_capacity(descs.len());
        for d in &descs {
            let key = (c, d.rkey);
            let m = match mrs.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let Some(mem) = shared.node.memory(d.rkey) else {
                        continue;
                    };
                    let ptr = mem.backing().as_ptr();
                    let len = mem.len();
                    // SAFETY: `mem` keeps the backing (and so the memory) alive as long as
                    // the NodeMr, which drops the registration first; every CPU access to
                    // registered memory goes through `RegionMemory`'s atomics, so the NIC's
                    // DMA races nothing that Rust considers non-atomic.
                    let mr = unsafe { Mr::register(&pd, ptr, len, access_flags(d.access)) }?;
                    v.insert(Arc::new(NodeMr {
                        mr,
                        va: ptr as u64,
                        _mem: mem,
                    }))
                }
            };
            out.push(RemoteRegion {
                desc: *d,
                nic_rkey: m.mr.rkey(),
                va: m.va,
            });
        }
        // A rekey or a fence that came in meanwhile may have run its drop before these
        // registrations existed: check again under the lock, and start over if so (the
        // change's own drop takes the lock after us).
        if !shared.node.is_fenced() && shared.node.regions() == descs {
            return Ok(Table {
                regions: out,
                fenced: false,
            });
        }
        drop(mrs);
        drop_stale_mrs(shared);
    }
}

fn accept(shared: &Arc<Shared>, mut id: CmId) -> Result<()> {
    let cfg = &shared.cfg;
    let ctx = match id.context() {
        Some(c) => c,
        None => {
            id.reject();
            return Err(Error::Connect {
                addr: "rdma".into(),
                reason: "connect request without a device".into(),
            });
        }
    };
    let setup = (|| {
        let pd = device_pd(ctx)?;
        let caps = ctx.caps()?;
        let cq = Cq::new(ctx, cfg.send_depth + cfg.msg_depth + 16)?;
        let inline = id.create_qp(
            &pd,
            &cq,
            QpSizes {
                send: cfg.send_depth.min(caps.max_qp_wr),
                recv: cfg.msg_depth,
                inline: cfg.max_inline,
            },
        )?;
        // Register now, so the table is ready when the connection is established.
        region_table(shared, ctx)?;
        let resources = caps.max_qp_rd_atom.clamp(1, 16) as u8;
        Ok::<_, Error>((pd, cq, inline, resources))
    })();
    let (pd, cq, inline, resources) = match setup {
        Ok(v) => v,
        Err(e) => {
            id.reject();
            return Err(e);
        }
    };
    let id = Arc::new(id);
    let chan = match Chan::new(id.clone(), &pd, cfg.msg_depth, inline) {
        Ok(c) => c,
        Err(e) => {
            id.reject();
            return Err(e);
        }
    };
    let (tx, rx) = mpsc::channel();
    let (persist_tx, persist_rx) = mpsc::channel();
    let conn_id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let conn = Arc::new(Conn {
        id: id.clone(),
        chan,
        ctx,
        stop: AtomicBool::new(false),
        saved: Mutex::new(None),
        tx: Mutex::new(tx),
        persist_tx: Mutex::new(persist_tx),
        peer: Peer {
            conn_id,
            addr: format!("rdma-conn-{conn_id}"),
        },
    });
    shared.conns.lock().insert(id.raw() as usize, conn.clone());
    let (c1, s1, c2, s2) = (conn.clone(), shared.clone(), conn.clone(), shared.clone());
    let (c3, s3) = (conn.clone(), shared.clone());
    std::thread::Builder::new()
        .name(format!("dmkit-rdma-cq-{conn_id}"))
        .spawn(move || poll_loop(&s1, &c1, &cq))?;
    std::thread::Builder::new()
        .name(format!("dmkit-rdma-srv-{conn_id}"))
        .spawn(move || worker(&s2, &c2, &rx))?;
    std::thread::Builder::new()
        .name(format!("dmkit-rdma-persist-{conn_id}"))
        .spawn(move || worker(&s3, &c3, &persist_rx))?;
    if let Err(e) = id.accept(resources) {
        shared.conns.lock().remove(&(id.raw() as usize));
        conn.close();
        return Err(e);
    }
    Ok(())
}

fn poll_loop(shared: &Shared, conn: &Conn, cq: &Cq) {
    let mut wcs = vec![sys::ibv_wc::default(); 32];
    while !conn.stop.load(Ordering::SeqCst) {
        let n = match cq.poll(&mut wcs) {
            Ok(0) => {
                // Woken by the CQ's armed events (a message, or the flush when `close`
                // moves the QP to error); the timeout is a backstop (see the client's
                // `poll_loop`: timed wake-ups are what an idle guest spends its CPU on).
                cq.wait(super::client::IDLE_WAIT);
                continue;
            }
            Ok(n) => n,
            Err(_) => break,
        };
        for wc in &wcs[..n] {
            let tag = wc.wr_id & chan::TAG_MASK;
            if tag == chan::TAG_SEND {
                conn.chan.on_send_done(wc.wr_id);
                continue;
            }
            if tag != chan::TAG_RECV || wc.status != sys::IBV_WC_SUCCESS {
                // Flushed receives (disconnect) or a reset QP: nothing to deliver.
                continue;
            }
            match conn.chan.on_recv(wc.wr_id, wc.byte_len as usize) {
                Ok(Some(m)) if m.kind == kind::PERSIST => {
                    let _ = conn.persist_tx.lock().send(Work::Request(m));
                }
                Ok(Some(m))
                    if m.kind == kind::RPC
                        && !shared.paused.load(Ordering::SeqCst)
                        && shared.node.is_quick_rpc(&m.body) =>
                {
                    // Answered here: no hand-off to the worker (its wake-up is most of what
                    // a heartbeat costs). The reply goes out now if that cannot wait, else
                    // the worker sends it: this thread must never wait for credits.
                    let (kind, body) = answer_rpc(shared, conn, &m.body);
                    let reply = Message {
                        kind,
                        req: m.req,
                        body,
                    };
                    match conn.chan.try_send(reply.kind, reply.req, &reply.body) {
                        Ok(true) => {}
                        Ok(false) => {
                            let _ = conn.tx.lock().send(Work::Reply(reply));
                        }
                        Err(e) => {
                            tracing::warn!(peer = %conn.peer.addr, error = %e, "cannot reply; closing");
                            conn.close();
                            return;
                        }
                    }
                }
                Ok(Some(m)) => {
                    let _ = conn.tx.lock().send(Work::Request(m));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(peer = %conn.peer.addr, error = %e, "closing rdma connection");
                    conn.close();
                    return;
                }
            }
            conn.chan.maybe_return_credits();
        }
    }
    // Give the QP time to flush so its buffers are not reused while the NIC might write them.
    conn.id.qp_to_error();
}

/// An RPC's reply: its kind and body.
fn answer_rpc(shared: &Shared, conn: &Conn, body: &[u8]) -> (u8, Vec<u8>) {
    match shared.node.rpc(&conn.peer, body) {
        Ok(r) => (kind::RPC_OK, r),
        Err(e) => (kind::RPC_ERR, e.into_bytes()),
    }
}

fn worker(shared: &Shared, conn: &Conn, rx: &mpsc::Receiver<Work>) {
    let timeout = shared.cfg.op_timeout;
    while !conn.stop.load(Ordering::SeqCst) {
        // Blocks until a message comes or the connection closes (`Conn::close` wakes it): an
        // idle worker takes no timer wake-ups (each reads the clock, which on a guest whose
        // clock source is an emulated HPET is a slow system call, and steals a CPU the
        // serving threads need).
        let m = match rx.recv() {
            Ok(Work::Request(m)) => m,
            Ok(Work::Reply(r)) => {
                if let Err(e) = conn.chan.send(r.kind, r.req, &r.body, timeout) {
                    tracing::warn!(peer = %conn.peer.addr, error = %e, "cannot reply; closing");
                    conn.close();
                    return;
                }
                continue;
            }
            Ok(Work::Wake) => continue,
            Err(_) => return,
        };
        if conn.stop.load(Ordering::SeqCst) {
            return;
        }
        while shared.paused.load(Ordering::SeqCst) && !conn.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (k, body) = match m.kind {
            kind::WELCOME | kind::REGIONS => {
                let k = if m.kind == kind::WELCOME {
                    kind::WELCOME
                } else {
                    kind::REGIONS_RESP
                };
                match region_table(shared, conn.ctx) {
                    Ok(t) => (k, wire::encode(shared.node.id(), &t)),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot register the node's regions");
                        conn.close();
                        return;
                    }
                }
            }
            kind::RPC => answer_rpc(shared, conn, &m.body),
            kind::PERSIST => (
                kind::PERSIST_RESP,
                vec![u8::from(!persist(shared, &m.body))],
            ),
            _ => {
                tracing::warn!(peer = %conn.peer.addr, kind = m.kind, "unexpected message");
                continue;
            }
        };
        if let Err(e) = conn.chan.send(k, m.req, &body, timeout) {
            tracing::warn!(peer = %conn.peer.addr, error = %e, "cannot reply; closing");
            conn.close();
            return;
        }
    }
}

/// Persists the ranges `(rkey u32, off u64, len u64)*` a client wrote durably; false if any
/// failed or is not a range of a region.
///
/// Neighbouring ranges are persisted as one (a batch of thousands of CASes on one stretch of
/// a pool file — an index split's freeze — is one `msync`, not thousands).
fn persist(shared: &Shared, body: &[u8]) -> bool {
    let mut ranges = crate::node::Persists::default();
    let mut last: Option<(RKey, crate::RegionMemory)> = None;
    for e in body.chunks(20) {
        if e.len() != 20 {
            return false;
        }
        let rkey = RKey(u32::from_le_bytes(e[0..4].try_into().expect("4")));
        let off = u64::from_le_bytes(e[4..12].try_into().expect("8")) as usize;
        let len = u64::from_le_bytes(e[12..20].try_into().expect("8")) as usize;
        let mem = match &last {
            Some((k, m)) if *k == rkey => m.clone(),
            _ => match shared.node.memory(rkey) {
                Some(m) => {
                    last = Some((rkey, m.clone()));
                    m
                }
                None => return false,
            },
        };
        ranges.add(rkey, &mem, off, len);
    }
    ranges.run().is_ok()
}
