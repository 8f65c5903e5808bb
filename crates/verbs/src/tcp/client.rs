//! The client side of the `tcp` backend: a connection is a socket that posting threads write
//! to directly (taking turns through the outbox) and a receive task on the process's I/O
//! runtime ([`crate::runtime`]) that delivers completions by request id. A connection costs no
//! thread of its own.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::auth;
use super::frame::{self, Cursor, FrameError, Kind, RxBuf, op};
use super::server::DEFAULT_MAX_FRAME;
use crate::batch::{Batch, BatchResult, Op};
use crate::buf::MemBuf;
use crate::conn::{Connection, Connector, PostCtx};
use crate::error::{AccessFault, Error, Result};
use crate::node::OpKind;
use crate::pending::{Pending, Slot, TimeoutHook};
use crate::types::{NodeId, RegionDesc};

/// Settings of tcp client connections.
#[derive(Clone)]
pub struct TcpConnector {
    /// The cluster secret, when the nodes require one (or to insist that they prove it).
    pub secret: Option<Vec<u8>>,
    /// Bound on establishing a connection, handshake included.
    pub connect_timeout: Duration,
    /// Bound on waiting for any completion; past it the connection is treated as broken.
    pub op_timeout: Duration,
    /// Largest frame accepted.
    pub max_frame: usize,
}

impl Default for TcpConnector {
    fn default() -> Self {
        Self {
            secret: None,
            connect_timeout: Duration::from_secs(3),
            op_timeout: Duration::from_secs(5),
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

impl std::fmt::Debug for TcpConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConnector")
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout", &self.connect_timeout)
            .field("op_timeout", &self.op_timeout)
            .finish()
    }
}

impl TcpConnector {
    /// A connector that proves (and demands proof of) `secret`.
    pub fn with_secret(secret: impl Into<Vec<u8>>) -> Self {
        Self {
            secret: Some(secret.into()),
            ..Self::default()
        }
    }
}

impl Connector for TcpConnector {
    fn connect(&self, addr: &str) -> Result<Arc<dyn Connection>> {
        Ok(Arc::new(TcpConnection::connect(self, addr)?))
    }
}

enum Waiter {
    Batch {
        slot: Arc<Slot<BatchResult>>,
        node: NodeId,
        ops: Vec<Op>,
        bufs: Vec<MemBuf>,
    },
    Rpc(Arc<Slot<Vec<u8>>>),
    Regions(Arc<Slot<Vec<RegionDesc>>>),
}

impl Waiter {
    fn fail(self, e: Error) {
        match self {
            Waiter::Batch { slot, .. } => slot.complete(Err(e)),
            Waiter::Rpc(s) => s.complete(Err(e)),
            Waiter::Regions(s) => s.complete(Err(e)),
        }
    }
}

struct Shared {
    node: NodeId,
    peer: String,
    /// The socket, registered with the I/O runtime (reads by the receive task, writes by
    /// whoever holds the outbox's turn).
    io: tokio::net::TcpStream,
    me: Weak<Shared>,
    /// Frames posted while another thread is writing: that thread sends them with its own in
    /// one write (concurrent posters share system calls and TCP segments).
    outbox: Mutex<Outbox>,
    waiters: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    alive: AtomicBool,
    dead_reason: Mutex<Option<String>>,
    regions: Mutex<Vec<RegionDesc>>,
    op_timeout: Duration,
    max_frame: usize,
}

impl Shared {
    fn kill(&self, reason: String) {
        if self.alive.swap(false, Ordering::SeqCst) {
            tracing::debug!(node = %self.node, peer = %self.peer, %reason, "tcp connection down");
            *self.dead_reason.lock() = Some(reason.clone());
            let _ = socket2::SockRef::from(&self.io).shutdown(Shutdown::Both);
        }
        let drained: Vec<_> = self.waiters.lock().drain().map(|(_, w)| w).collect();
        for w in drained {
            w.fail(Error::Disconnected {
                node: self.node,
                reason: reason.clone(),
            });
        }
    }

    fn dead_error(&self) -> Error {
        Error::Disconnected {
            node: self.node,
            reason: self
                .dead_reason
                .lock()
                .clone()
                .unwrap_or_else(|| "connection closed".into()),
        }
    }

    /// Registers the waiter, then sends the frame: the response cannot overtake its waiter.
    /// Inside a batched poll ([`crate::batched`]) the frame waits in the outbox until the
    /// poll ends, with the frames of the other operations the poll advanced.
    fn send(
        self: &Arc<Self>,
        req_id: u64,
        frame: &[u8],
        waiter: Waiter,
    ) -> std::result::Result<(), Error> {
        if !self.alive.load(Ordering::SeqCst) {
            waiter.fail(self.dead_error());
            return Ok(());
        }
        self.waiters.lock().insert(req_id, waiter);
        let mut ob = self.outbox.lock();
        ob.queued.extend_from_slice(frame);
        if crate::doorbell::deferring() {
            drop(ob);
            crate::doorbell::defer(self.clone());
            return Ok(());
        }
        self.write_queued(ob);
        Ok(())
    }

    /// Sends the outbox, unless another thread is writing (it sends what queued meanwhile).
    /// Never blocks: when the socket is full, a task of the I/O runtime sends the rest as
    /// the node reads.
    fn write_queued<'a>(&'a self, mut ob: parking_lot::MutexGuard<'a, Outbox>) {
        if ob.writing {
            // The thread writing now sends this frame next, with whatever else queued.
            return;
        }
        ob.writing = true;
        loop {
            let mut out = std::mem::take(&mut ob.queued);
            if out.is_empty() {
                ob.writing = false;
                return;
            }
            drop(ob);
            let r = self.try_write_all(&out);
            ob = self.outbox.lock();
            match r {
                Err(e) => {
                    ob.writing = false;
                    ob.queued.clear();
                    drop(ob);
                    self.kill(format!("send failed: {e}"));
                    return;
                }
                Ok(sent) if sent < out.len() => {
                    // The rest goes first, then whatever queued meanwhile; the task keeps
                    // the turn (`writing`) until the outbox is empty.
                    let later = std::mem::take(&mut ob.queued);
                    out.drain(..sent);
                    out.extend_from_slice(&later);
                    ob.queued = out;
                    drop(ob);
                    if let Some(me) = self.me.upgrade() {
                        crate::runtime::io_runtime().spawn(drain_outbox(me));
                    }
                    return;
                }
                Ok(_) => {}
            }
            if ob.queued.is_empty() {
                // Keep the allocation for the next frames.
                out.clear();
                ob.queued = out;
            }
        }
    }

    /// Writes what the socket takes now: the bytes sent.
    fn try_write_all(&self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut sent = 0;
        while sent < bytes.len() {
            match self.io.try_write(&bytes[sent..]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }
}

/// Sends the outbox as the socket drains, then gives the turn back.
async fn drain_outbox(s: Arc<Shared>) {
    loop {
        let out = {
            let mut ob = s.outbox.lock();
            let out = std::mem::take(&mut ob.queued);
            if out.is_empty() {
                ob.writing = false;
                return;
            }
            out
        };
        if let Err(e) = frame::write_all(&s.io, &out).await {
            {
                let mut ob = s.outbox.lock();
                ob.writing = false;
                ob.queued.clear();
            }
            s.kill(format!("send failed: {e}"));
            return;
        }
    }
}

impl crate::doorbell::Doorbell for Shared {
    fn ring(&self) {
        let ob = self.outbox.lock();
        self.write_queued(ob);
    }
}

/// See [`Shared::outbox`].
#[derive(Default)]
struct Outbox {
    queued: Vec<u8>,
    /// A thread is writing and will send `queued` before it stops.
    writing: bool,
}

/// A connection to one memory node over TCP.
pub struct TcpConnection {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TcpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConnection")
            .field("node", &self.shared.node)
            .field("peer", &self.shared.peer)
            .field("alive", &self.shared.alive.load(Ordering::Relaxed))
            .finish()
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        self.shared.kill("connection closed by the client".into());
    }
}

fn connect_err(addr: &str, reason: impl std::fmt::Display) -> Error {
    Error::Connect {
        addr: addr.to_string(),
        reason: reason.to_string(),
    }
}

impl TcpConnection {
    /// Connects, runs the handshake (authenticating both ways when a secret is set) and learns
    /// the node's regions. The whole of it is bounded by `connect_timeout`.
    pub fn connect(cfg: &TcpConnector, addr: &str) -> Result<TcpConnection> {
        let deadline = Instant::now() + cfg.connect_timeout;
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| connect_err(addr, format!("cannot resolve: {e}")))?
            .collect();
        let mut last = None;
        let mut stream = None;
        for a in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                last = Some(std::io::Error::from(std::io::ErrorKind::TimedOut));
                break;
            }
            match TcpStream::connect_timeout(&a, left) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = stream.ok_or_else(|| {
            connect_err(
                addr,
                last.map_or_else(|| "no address".to_string(), |e| e.to_string()),
            )
        })?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(cfg.connect_timeout))?;
        stream.set_write_timeout(Some(cfg.connect_timeout))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut writer = stream.try_clone()?;
        // Reads of the handshake share one deadline: a peer that dribbles bytes cannot stretch
        // it (a per-read timeout alone would restart with every byte).
        let mut hs_reader = Bounded {
            r: &mut reader,
            deadline,
        };
        let hs = |e: FrameError| match e {
            FrameError::Io(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                connect_err(addr, "handshake timed out (is this a dmkit memory node?)")
            }
            e => Error::Protocol {
                peer: addr.to_string(),
                reason: e.to_string(),
            },
        };
        let mut payload = Vec::new();
        let h = frame::read_frame(&mut hs_reader, &mut payload, 4096)
            .map_err(hs)?
            .ok_or_else(|| connect_err(addr, "closed during the handshake"))?;
        if h.kind != Kind::Hello {
            return Err(Error::Protocol {
                peer: addr.to_string(),
                reason: "expected Hello".into(),
            });
        }
        let mut c = Cursor::new(&payload, "Hello frame");
        let parse = |e: FrameError| Error::Protocol {
            peer: addr.to_string(),
            reason: e.to_string(),
        };
        let node = NodeId(c.u16().map_err(parse)?);
        let auth_required = c.u8().map_err(parse)? != 0;
        let server_nonce = c.bytes(auth::NONCE_LEN).map_err(parse)?.to_vec();
        if auth_required && cfg.secret.is_none() {
            return Err(Error::Auth {
                peer: addr.to_string(),
                reason: "the memory node requires a cluster secret and none is configured".into(),
            });
        }
        let client_nonce = auth::nonce();
        let mut a = Vec::new();
        match &cfg.secret {
            Some(secret) if auth_required => {
                a.push(1);
                a.extend_from_slice(&auth::prove(secret, b"client", &server_nonce));
            }
            _ => a.push(0),
        }
        a.extend_from_slice(&client_nonce);
        frame::write_frame(&mut writer, Kind::Auth, 0, &a)?;
        let h = frame::read_frame(&mut hs_reader, &mut payload, cfg.max_frame)
            .map_err(hs)?
            .ok_or_else(|| connect_err(addr, "closed during the handshake"))?;
        if h.kind == Kind::Error {
            return Err(Error::Auth {
                peer: addr.to_string(),
                reason: String::from_utf8_lossy(&payload).into_owned(),
            });
        }
        if h.kind != Kind::Welcome {
            return Err(Error::Protocol {
                peer: addr.to_string(),
                reason: "expected Welcome".into(),
            });
        }
        let mut c = Cursor::new(&payload, "Welcome frame");
        let proven = c.u8().map_err(parse)? != 0;
        if proven {
            let proof = c.bytes(auth::MAC_LEN).map_err(parse)?;
            let ok = cfg
                .secret
                .as_ref()
                .is_some_and(|s| auth::verify(s, b"server", &client_nonce, proof));
            if !ok {
                return Err(Error::Auth {
                    peer: addr.to_string(),
                    reason: "the memory node's proof of the cluster secret is wrong".into(),
                });
            }
        } else if cfg.secret.is_some() {
            return Err(Error::Auth {
                peer: addr.to_string(),
                reason: "the memory node does not prove the cluster secret".into(),
            });
        }
        let regions = frame::decode_regions(&mut c, node).map_err(parse)?;
        c.end().map_err(parse)?;
        if !reader.buffer().is_empty() {
            return Err(Error::Protocol {
                peer: addr.to_string(),
                reason: "data after the handshake before any request".into(),
            });
        }
        drop(reader);
        drop(writer);
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(None)?;
        stream.set_nonblocking(true)?;
        let rt = crate::runtime::io_runtime();
        let io = {
            let _in = rt.enter();
            tokio::net::TcpStream::from_std(stream)?
        };
        let shared = Arc::new_cyclic(|me| Shared {
            node,
            peer: addr.to_string(),
            io,
            me: me.clone(),
            outbox: Mutex::new(Outbox::default()),
            waiters: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            dead_reason: Mutex::new(None),
            regions: Mutex::new(regions),
            op_timeout: cfg.op_timeout,
            max_frame: cfg.max_frame,
        });
        rt.spawn(receive(shared.clone()));
        Ok(TcpConnection { shared })
    }

    fn timeout_hook(&self) -> TimeoutHook {
        let s = Arc::downgrade(&self.shared);
        Arc::new(move || {
            if let Some(s) = s.upgrade() {
                s.kill(format!(
                    "no completion within {:?}: node unresponsive",
                    s.op_timeout
                ));
            }
        })
    }
}

/// A reader that fails with `TimedOut` once `deadline` has passed.
struct Bounded<'a> {
    r: &'a mut BufReader<TcpStream>,
    deadline: Instant,
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.r.get_ref().set_read_timeout(Some(left))?;
        self.r.read(buf)
    }
}

/// The receive task: delivers each response to its waiter, every frame already received
/// before the next read.
async fn receive(shared: Arc<Shared>) {
    let mut rx = RxBuf::new(16 << 10);
    loop {
        loop {
            let (h, at) = match rx.next(shared.max_frame) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return shared.kill(format!("receive failed: {e}")),
            };
            let payload = rx.bytes(at);
            if h.kind == Kind::Error {
                return shared.kill(format!(
                    "the memory node reported: {}",
                    String::from_utf8_lossy(payload)
                ));
            }
            let Some(w) = shared.waiters.lock().remove(&h.req_id) else {
                // A response to a request that timed out: ignore.
                continue;
            };
            if let Err(e) = deliver(&shared, h.kind, payload, w) {
                return shared.kill(format!("bad response: {e}"));
            }
        }
        match rx.fill(&shared.io).await {
            Ok(0) => return shared.kill("the memory node closed the connection".into()),
            Ok(_) => {}
            Err(e) => return shared.kill(format!("receive failed: {e}")),
        }
    }
}

fn deliver(
    shared: &Shared,
    kind: Kind,
    payload: &[u8],
    w: Waiter,
) -> std::result::Result<(), FrameError> {
    let bad = |what| FrameError::Malformed { what };
    match (kind, w) {
        (
            Kind::BatchResp,
            Waiter::Batch {
                slot,
                node,
                ops,
                mut bufs,
            },
        ) => {
            let mut c = Cursor::new(payload, "batch response");
            let parsed = (|| {
                let status = c.u8()?;
                let done = c.u32()? as usize;
                let fault = if status == 1 {
                    let code = c.u8()?;
                    let detail = c.u8()?;
                    let index = c.u32()? as usize;
                    let f = AccessFault::from_code(code, detail).ok_or(bad("fault code"))?;
                    Some((index, f))
                } else {
                    None
                };
                if done > ops.len() || fault.is_some_and(|(i, _)| i != done) {
                    return Err(bad("batch response count"));
                }
                let mut olds = vec![0u64; ops.len()];
                for (i, op) in ops.iter().enumerate().take(done) {
                    match (op.kind, op.buf) {
                        (OpKind::Read, Some(b)) => {
                            bufs[b].copy_from_slice(c.bytes(op.len as usize)?);
                        }
                        (OpKind::Cas { .. } | OpKind::Faa { .. }, _) => olds[i] = c.u64()?,
                        _ => {}
                    }
                }
                c.end()?;
                Ok((olds, fault))
            })();
            match parsed {
                Ok((_, Some((index, fault)))) => {
                    slot.complete(Err(Error::refused(node, index, &ops[index], fault)));
                }
                Ok((olds, None)) => {
                    let mut r = BatchResult::new(node, ops, bufs);
                    r.olds = olds;
                    slot.complete(Ok(r));
                }
                Err(e) => {
                    slot.complete(Err(Error::Protocol {
                        peer: shared.peer.clone(),
                        reason: e.to_string(),
                    }));
                    return Err(e);
                }
            }
        }
        (Kind::RpcResp, Waiter::Rpc(slot)) => {
            let Some((&status, body)) = payload.split_first() else {
                slot.complete(Err(Error::Protocol {
                    peer: shared.peer.clone(),
                    reason: "empty RPC response".into(),
                }));
                return Err(bad("RPC response"));
            };
            slot.complete(if status == 0 {
                Ok(body.to_vec())
            } else {
                Err(Error::Rpc {
                    node: shared.node,
                    reason: String::from_utf8_lossy(body).into_owned(),
                })
            });
        }
        (Kind::RegionsResp, Waiter::Regions(slot)) => {
            let mut c = Cursor::new(payload, "region table");
            match frame::decode_regions(&mut c, shared.node).and_then(|r| c.end().map(|_| r)) {
                Ok(r) => {
                    *shared.regions.lock() = r.clone();
                    slot.complete(Ok(r));
                }
                Err(e) => {
                    slot.complete(Err(Error::Protocol {
                        peer: shared.peer.clone(),
                        reason: e.to_string(),
                    }));
                    return Err(e);
                }
            }
        }
        (_, w) => {
            w.fail(Error::Protocol {
                peer: shared.peer.clone(),
                reason: "response of the wrong kind".into(),
            });
            return Err(bad("response kind"));
        }
    }
    Ok(())
}

fn encode_batch(out: &mut Vec<u8>, ops: &[Op], bufs: &[MemBuf]) {
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        let code = match op.kind {
            OpKind::Read => op::READ,
            OpKind::Write { durable: false } => op::WRITE,
            OpKind::Write { durable: true } => op::WRITE_DURABLE,
            OpKind::Cas { .. } => op::CAS,
            OpKind::Faa { .. } => op::FAA,
        };
        out.push(code);
        out.extend_from_slice(&op.rkey.0.to_le_bytes());
        out.extend_from_slice(&op.addr.to_le_bytes());
        out.extend_from_slice(&op.len.to_le_bytes());
        match op.kind {
            OpKind::Write { .. } => {
                if let Some(b) = op.buf {
                    out.extend_from_slice(&bufs[b]);
                }
            }
            OpKind::Cas { expect, new } => {
                out.extend_from_slice(&expect.to_le_bytes());
                out.extend_from_slice(&new.to_le_bytes());
            }
            OpKind::Faa { add } => out.extend_from_slice(&add.to_le_bytes()),
            OpKind::Read => {}
        }
    }
}

impl Connection for TcpConnection {
    fn node(&self) -> NodeId {
        self.shared.node
    }

    fn regions(&self) -> Vec<RegionDesc> {
        self.shared.regions.lock().clone()
    }

    fn refresh_regions(&self) -> Result<Vec<RegionDesc>> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::with_capacity(frame::HEADER_LEN);
        let at = frame::encode_header(&mut out, Kind::Regions, id);
        frame::finish(&mut out, at).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let slot = Slot::new();
        self.shared.send(id, &out, Waiter::Regions(slot.clone()))?;
        Pending::waiting(
            self.shared.node,
            slot,
            self.shared.op_timeout,
            Some(self.timeout_hook()),
        )
        .wait()
    }

    fn post(&self, batch: Batch, _ctx: PostCtx) -> Pending<BatchResult> {
        let node = self.shared.node;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (_, ops, bufs) = batch.into_parts();
        let mut out = Vec::with_capacity(frame::HEADER_LEN + 4 + ops.len() * 40);
        let at = frame::encode_header(&mut out, Kind::Batch, id);
        encode_batch(&mut out, &ops, &bufs);
        if let Err(e) = frame::finish(&mut out, at) {
            return Pending::ready(node, Err(Error::InvalidArgument(e.to_string())));
        }
        // The reply carries the read data and atomics' old values after an 11-byte status.
        let reply: u64 = 11
            + ops
                .iter()
                .map(|op| match op.kind {
                    OpKind::Read => u64::from(op.len),
                    OpKind::Cas { .. } | OpKind::Faa { .. } => 8,
                    OpKind::Write { .. } => 0,
                })
                .sum::<u64>();
        if reply > self.shared.max_frame as u64 {
            return Pending::ready(
                node,
                Err(Error::InvalidArgument(format!(
                    "batch reads {reply} bytes, more than the frame limit of {}",
                    self.shared.max_frame
                ))),
            );
        }
        if out.len() > self.shared.max_frame {
            return Pending::ready(
                node,
                Err(Error::InvalidArgument(format!(
                    "batch of {} bytes exceeds the frame limit of {}",
                    out.len(),
                    self.shared.max_frame
                ))),
            );
        }
        let slot = Slot::new();
        let w = Waiter::Batch {
            slot: slot.clone(),
            node,
            ops,
            bufs,
        };
        if let Err(e) = self.shared.send(id, &out, w) {
            return Pending::ready(node, Err(e));
        }
        Pending::waiting(
            node,
            slot,
            self.shared.op_timeout,
            Some(self.timeout_hook()),
        )
        .spinning()
    }

    fn rpc(&self, req: &[u8], _ctx: PostCtx) -> Pending<Vec<u8>> {
        let node = self.shared.node;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::with_capacity(frame::HEADER_LEN + req.len());
        let at = frame::encode_header(&mut out, Kind::Rpc, id);
        out.extend_from_slice(req);
        if let Err(e) = frame::finish(&mut out, at) {
            return Pending::ready(node, Err(Error::InvalidArgument(e.to_string())));
        }
        let slot = Slot::new();
        if let Err(e) = self.shared.send(id, &out, Waiter::Rpc(slot.clone())) {
            return Pending::ready(node, Err(e));
        }
        Pending::waiting(
            node,
            slot,
            self.shared.op_timeout,
            Some(self.timeout_hook()),
        )
        .spinning()
    }

    fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    fn close(&self) {
        self.shared.kill("connection closed by the client".into());
    }

    fn timeout(&self) -> Duration {
        self.shared.op_timeout
    }

    fn in_flight(&self) -> usize {
        self.shared.waiters.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{RKey, RemoteAddr};

    /// A batch frame with one work request of each opcode, as `post` sends it.
    #[test]
    fn batch_frame_bytes_are_pinned() {
        let at = RemoteAddr::new(NodeId(1), RKey(0xaabb_ccdd), 0x10_0000);
        let mut b = Batch::new(NodeId(1));
        b.write(at, b"hello");
        b.write_durable(at.add(8), b"dur");
        b.read(at, 5);
        b.cas(at.add(16), 1, 2);
        b.faa(at.add(24), 3);
        let (_, ops, bufs) = b.into_parts();
        let mut out = Vec::new();
        let h = frame::encode_header(&mut out, Kind::Batch, 77);
        encode_batch(&mut out, &ops, &bufs);
        frame::finish(&mut out, h).unwrap();
        insta::assert_snapshot!(frame::hex_dump(&out));
    }
}
