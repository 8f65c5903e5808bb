//! The memory-node side of the `tcp` backend: a soft NIC that executes one-sided verbs against
//! the node's registered memory. No application logic runs here except the node's RPC handler.

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;

use super::auth;
use super::frame::{self, Cursor, FrameError, Kind, RxBuf, op};
use crate::error::{AccessFault, Error, Result};
use crate::node::{MemoryNode, OpKind, Peer};
use crate::runtime;

/// Settings of a tcp memory node.
#[derive(Clone, Default)]
pub struct TcpServerConfig {
    /// When set, only peers that prove they know it are admitted.
    pub secret: Option<Vec<u8>>,
    /// Largest frame accepted or produced, in bytes (default 64 MiB).
    pub max_frame: Option<usize>,
    /// How long a peer may take to finish the handshake (default 10 s).
    pub handshake_timeout: Option<Duration>,
}

impl std::fmt::Debug for TcpServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpServerConfig")
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("max_frame", &self.max_frame)
            .finish()
    }
}

pub(crate) const DEFAULT_MAX_FRAME: usize = 64 << 20;

/// Bytes a connection reads at a time.
const RX_CHUNK: usize = 16 << 10;

/// Verbs served, for `dmkit_memnode_verbs_served_total{op}`.
struct Served {
    read: metrics::Counter,
    write: metrics::Counter,
    cas: metrics::Counter,
    faa: metrics::Counter,
    rpc: metrics::Counter,
}

impl Served {
    fn new() -> Self {
        let c =
            |op: &'static str| metrics::counter!("dmkit_memnode_verbs_served_total", "op" => op);
        Self {
            read: c("read"),
            write: c("write"),
            cas: c("cas"),
            faa: c("faa"),
            rpc: c("rpc"),
        }
    }

    fn add(&self, t: &Tally) {
        for (c, n) in [
            (&self.read, t.read),
            (&self.write, t.write),
            (&self.cas, t.cas),
            (&self.faa, t.faa),
            (&self.rpc, t.rpc),
        ] {
            if n > 0 {
                c.increment(n);
            }
        }
    }
}

/// Verbs executed, by kind.
#[derive(Default)]
struct Tally {
    read: u64,
    write: u64,
    cas: u64,
    faa: u64,
    rpc: u64,
}

struct Shared {
    node: Arc<MemoryNode>,
    cfg: TcpServerConfig,
    max_frame: usize,
    stop: AtomicBool,
    paused: AtomicBool,
    /// Open connections: a handle on each socket (to close it at once at shutdown) and its task.
    conns: Mutex<HashMap<u64, (Arc<tokio::net::TcpStream>, tokio::task::AbortHandle)>>,
    next_conn: AtomicU64,
    served: Served,
    /// Request frames executed, all connections.
    frames: AtomicU64,
    /// Socket reads that brought requests, and writes of responses, all connections.
    reads: AtomicU64,
    writes: AtomicU64,
}

/// What a tcp memory node received and sent, over all its connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpTraffic {
    /// Request frames executed (a batch of verbs, an RPC or a region query is one frame).
    pub frames: u64,
    /// Socket reads that brought request bytes (frames a client sent in one write mostly
    /// arrive in one read).
    pub reads: u64,
    /// Writes of responses (the responses to the frames of one read go out in one write).
    pub writes: u64,
}

/// A memory node served over TCP. Connections are tasks on the process's I/O runtime
/// ([`crate::runtime`]): an idle connection costs a socket and a little memory, no thread.
/// Dropping it (or [`TcpServer::shutdown`]) stops accepting and closes every connection, as a
/// crash would from the clients' point of view.
pub struct TcpServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpServer")
            .field("addr", &self.addr)
            .field("node", &self.shared.node.id())
            .finish()
    }
}

impl TcpServer {
    /// Binds `addr` and starts serving `node` (a task per connection on the I/O runtime).
    pub fn start(
        addr: impl ToSocketAddrs + std::fmt::Display,
        node: Arc<MemoryNode>,
        cfg: TcpServerConfig,
    ) -> Result<TcpServer> {
        let listen_err = |e: std::io::Error| Error::Listen {
            addr: addr.to_string(),
            reason: e.to_string(),
        };
        let listener = std::net::TcpListener::bind(&addr).map_err(listen_err)?;
        listener.set_nonblocking(true).map_err(listen_err)?;
        let local = listener.local_addr()?;
        let rt = runtime::io_runtime();
        let listener = {
            let _in = rt.enter();
            tokio::net::TcpListener::from_std(listener).map_err(listen_err)?
        };
        let shared = Arc::new(Shared {
            node,
            max_frame: cfg.max_frame.unwrap_or(DEFAULT_MAX_FRAME),
            cfg,
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            served: Served::new(),
            frames: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        });
        let accept = rt.spawn(accept_loop(shared.clone(), listener));
        tracing::debug!(addr = %local, node = %shared.node.id(), "accepting connections over tcp");
        Ok(TcpServer {
            shared,
            addr: local,
            accept: Some(accept),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn node(&self) -> &Arc<MemoryNode> {
        &self.shared.node
    }

    /// Frames, reads and writes so far, over all connections: with
    /// [`crate::Endpoint::stats`], how well the verbs of concurrent operations share system
    /// calls and segments.
    pub fn traffic(&self) -> TcpTraffic {
        TcpTraffic {
            frames: self.shared.frames.load(Ordering::Relaxed),
            reads: self.shared.reads.load(Ordering::Relaxed),
            writes: self.shared.writes.load(Ordering::Relaxed),
        }
    }

    /// Open client connections.
    pub fn connections(&self) -> usize {
        self.shared.conns.lock().len()
    }

    /// Stops executing requests (they wait) without closing anything: a hung node, for tests
    /// of client timeouts.
    pub fn pause(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::SeqCst);
    }

    /// Stops accepting and closes every connection. When it returns the port is free and no
    /// further request is executed.
    pub fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(h) = self.accept.take() {
            h.abort();
            // The listener closes when its task is dropped.
            let _ = runtime::blocking(|| crate::block_on(h));
        }
        for (_, (s, task)) in self.shared.conns.lock().drain() {
            let _ = socket2::SockRef::from(&*s).shutdown(Shutdown::Both);
            task.abort();
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: tokio::net::TcpListener) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors or a connection reset before it was accepted: go on.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let stream = Arc::new(stream);
        let handle = stream.clone();
        let s = shared.clone();
        // The task waits for its entry before it serves, so it always finds it to remove.
        let (go, ready) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = ready.await;
            let p = Peer {
                conn_id: id,
                addr: peer.to_string(),
            };
            match serve(&s, &stream, &p).await {
                Ok(()) => tracing::debug!(%peer, "connection closed"),
                Err(e) if s.stop.load(Ordering::SeqCst) => {
                    tracing::debug!(%peer, error = %e, "connection ended at shutdown")
                }
                Err(e) => tracing::warn!(%peer, error = %e, "closing connection"),
            }
            if let Some((c, _)) = s.conns.lock().remove(&id) {
                let _ = socket2::SockRef::from(&*c).shutdown(Shutdown::Both);
            }
        });
        shared
            .conns
            .lock()
            .insert(id, (handle, task.abort_handle()));
        let _ = go.send(());
    }
}

/// Reads the next whole frame (waiting for it) within the handshake.
async fn handshake_frame(
    rx: &mut RxBuf,
    stream: &tokio::net::TcpStream,
    max: usize,
) -> std::result::Result<Option<(frame::Header, std::ops::Range<usize>)>, FrameError> {
    loop {
        if let Some(f) = rx.next(max)? {
            return Ok(Some(f));
        }
        if rx.fill(stream).await? == 0 {
            return if rx.partial() {
                Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into())
            } else {
                Ok(None)
            };
        }
    }
}

/// Runs one connection: handshake, then frames until EOF or a protocol violation.
async fn serve(
    shared: &Shared,
    stream: &tokio::net::TcpStream,
    peer: &Peer,
) -> std::result::Result<(), FrameError> {
    stream.set_nodelay(true)?;
    let node = &shared.node;
    let mut rx = RxBuf::new(RX_CHUNK);

    // Handshake: Hello(node, auth?, nonce) -> Auth(proof?, client nonce) -> Welcome(proof?, regions).
    let limit = shared
        .cfg
        .handshake_timeout
        .unwrap_or(Duration::from_secs(10));
    let handshake = async {
        let server_nonce = auth::nonce();
        let mut hello = Vec::new();
        hello.extend_from_slice(&node.id().0.to_le_bytes());
        hello.push(u8::from(shared.cfg.secret.is_some()));
        hello.extend_from_slice(&server_nonce);
        frame::write_all(stream, &frame::encode_frame(Kind::Hello, 0, &hello)).await?;
        let Some((h, at)) = handshake_frame(&mut rx, stream, 4096).await? else {
            return Ok(false);
        };
        if h.kind != Kind::Auth {
            return Err(FrameError::Malformed {
                what: "handshake (expected Auth)",
            });
        }
        let payload = rx.bytes(at);
        let mut c = Cursor::new(payload, "Auth frame");
        let has_proof = c.u8()? != 0;
        let proof = if has_proof {
            Some(c.bytes(auth::MAC_LEN)?)
        } else {
            None
        };
        let client_nonce = c.bytes(auth::NONCE_LEN)?;
        c.end()?;
        let mut welcome = Vec::new();
        if let Some(secret) = &shared.cfg.secret {
            let ok = proof.is_some_and(|p| auth::verify(secret, b"client", &server_nonce, p));
            if !ok {
                let msg = "authentication failed: this memory node requires the cluster secret";
                let _ =
                    frame::write_all(stream, &frame::encode_frame(Kind::Error, 0, msg.as_bytes()))
                        .await;
                return Err(FrameError::Malformed {
                    what: "client proof (peer does not know the cluster secret)",
                });
            }
            welcome.push(1);
            welcome.extend_from_slice(&auth::prove(secret, b"server", client_nonce));
        } else {
            welcome.push(0);
        }
        frame::encode_regions(&mut welcome, &node.regions());
        frame::write_all(stream, &frame::encode_frame(Kind::Welcome, 0, &welcome)).await?;
        Ok(true)
    };
    match tokio::time::timeout(limit, handshake).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => return Ok(()),
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("handshake not finished within {limit:?}"),
            )
            .into());
        }
    }

    let mut out = Vec::with_capacity(4096);
    loop {
        // Every frame already received is executed, and the responses go out together: a
        // client with many verbs in flight gets them in one write.
        while let Some((h, at)) = rx.next(shared.max_frame)? {
            if shared.paused.load(Ordering::SeqCst) {
                // What was executed before the pause is answered.
                frame::write_all(stream, &out).await?;
                out.clear();
                while shared.paused.load(Ordering::SeqCst) && !shared.stop.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            if shared.stop.load(Ordering::SeqCst) {
                // A killed node executes nothing more.
                return Ok(());
            }
            let payload = rx.bytes(at);
            shared.frames.fetch_add(1, Ordering::Relaxed);
            let mut tally = Tally::default();
            respond(
                node,
                peer,
                h,
                payload,
                &mut out,
                shared.max_frame,
                &mut tally,
            )?;
            shared.served.add(&tally);
        }
        if !out.is_empty() {
            frame::write_all(stream, &out).await?;
            shared.writes.fetch_add(1, Ordering::Relaxed);
            out.clear();
            if out.capacity() > 4 * RX_CHUNK {
                out.shrink_to(4096);
            }
        }
        if rx.fill(stream).await? == 0 {
            if rx.partial() {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            return Ok(());
        }
        shared.reads.fetch_add(1, Ordering::Relaxed);
    }
}

/// Serves one client frame (header and payload, as it arrives on a connection) against
/// `node` and returns the response frame — what a connection does per frame, without a
/// socket. Refuses what a connection would close on. For fuzzing and tests.
pub fn serve_frame(
    node: &MemoryNode,
    bytes: &[u8],
    max_frame: usize,
) -> std::result::Result<Vec<u8>, FrameError> {
    let h: [u8; frame::HEADER_LEN] = bytes
        .get(..frame::HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(FrameError::Malformed {
            what: "short header",
        })?;
    let hdr = frame::decode_header(&h, max_frame)?;
    let payload = bytes
        .get(frame::HEADER_LEN..frame::HEADER_LEN + hdr.len as usize)
        .ok_or(FrameError::Malformed {
            what: "short payload",
        })?;
    let mut out = Vec::new();
    let peer = Peer {
        conn_id: 0,
        addr: "serve_frame".into(),
    };
    respond(
        node,
        &peer,
        hdr,
        payload,
        &mut out,
        max_frame,
        &mut Tally::default(),
    )?;
    Ok(out)
}

/// Executes one request frame and appends its response frame to `out` (what a connection
/// does per frame, and [`serve_frame`] without a socket).
fn respond(
    node: &MemoryNode,
    peer: &Peer,
    h: frame::Header,
    payload: &[u8],
    out: &mut Vec<u8>,
    max_frame: usize,
    tally: &mut Tally,
) -> std::result::Result<(), FrameError> {
    match h.kind {
        Kind::Batch => {
            let at = frame::encode_header(out, Kind::BatchResp, h.req_id);
            execute_batch(node, payload, out, max_frame, tally)?;
            frame::finish(out, at)
        }
        Kind::Rpc => {
            let at = frame::encode_header(out, Kind::RpcResp, h.req_id);
            tally.rpc += 1;
            // A handler may wait (a lease to expire, a grace period): not on a worker.
            match runtime::blocking(|| node.rpc(peer, payload)) {
                Ok(reply) => {
                    out.push(0);
                    out.extend_from_slice(&reply);
                }
                Err(msg) => {
                    out.push(1);
                    out.extend_from_slice(msg.as_bytes());
                }
            }
            frame::finish(out, at)
        }
        Kind::Regions => {
            let at = frame::encode_header(out, Kind::RegionsResp, h.req_id);
            frame::encode_regions(out, &node.regions());
            frame::finish(out, at)
        }
        _ => Err(FrameError::Malformed {
            what: "frame kind from a client",
        }),
    }
}

/// Decodes and executes one batch frame, appending the response payload to `out`. The whole
/// frame is decoded and checked first: a malformed frame executes nothing. Work requests then
/// run in order; the first refused one stops the batch (the rest are not executed).
fn execute_batch(
    node: &MemoryNode,
    payload: &[u8],
    out: &mut Vec<u8>,
    max_frame: usize,
    tally: &mut Tally,
) -> std::result::Result<(), FrameError> {
    let mut c = Cursor::new(payload, "batch frame");
    let count = c.u32()? as usize;
    if count > frame::MAX_BATCH_OPS {
        return Err(FrameError::Malformed {
            what: "batch (too many work requests)",
        });
    }
    // Each work request takes at least 17 bytes: refuse counts the payload cannot hold.
    if count > c.remaining() / 17 {
        return Err(FrameError::Malformed {
            what: "batch (op count exceeds the frame)",
        });
    }
    let mut wrs = Vec::with_capacity(count);
    // The reply: status, executed count, a fault, read data and atomics' old values.
    let mut reply_len = 1 + 4 + 6u64;
    for _ in 0..count {
        let code = c.u8()?;
        let rkey = crate::types::RKey(c.u32()?);
        let addr = c.u64()?;
        let len = c.u32()?;
        let (kind, data): (OpKind, &[u8]) = match code {
            op::READ => (OpKind::Read, &[]),
            op::WRITE | op::WRITE_DURABLE => (
                OpKind::Write {
                    durable: code == op::WRITE_DURABLE,
                },
                c.bytes(len as usize)?,
            ),
            op::CAS => (
                OpKind::Cas {
                    expect: c.u64()?,
                    new: c.u64()?,
                },
                &[],
            ),
            op::FAA => (OpKind::Faa { add: c.u64()? }, &[]),
            _ => {
                return Err(FrameError::Malformed {
                    what: "work request opcode",
                });
            }
        };
        reply_len += match kind {
            OpKind::Read => u64::from(len),
            OpKind::Cas { .. } | OpKind::Faa { .. } => 8,
            OpKind::Write { .. } => 0,
        };
        if reply_len > max_frame as u64 {
            return Err(FrameError::Malformed {
                what: "batch (reads exceed the frame limit)",
            });
        }
        wrs.push((kind, rkey, addr, len, data));
    }
    c.end()?;
    // Persisting (msync on a pool file, a flush on NVM) may take milliseconds on a busy
    // disk: such a batch runs off the I/O workers, so the connections behind it — the
    // master's heartbeats and the peers' vouches among them — are served meanwhile.
    // (On DRAM a durable write persists nothing: it runs here.)
    let persists = wrs.iter().any(|&(kind, rkey, ..)| {
        let may_persist = match kind {
            OpKind::Write { durable } => durable,
            OpKind::Cas { .. } | OpKind::Faa { .. } => true,
            OpKind::Read => false,
        };
        may_persist && node.media_of(rkey) == Some(crate::types::Media::Nvm)
    });
    if persists {
        let t = std::time::Instant::now();
        runtime::blocking(|| run_batch(node, &wrs, out, tally, true));
        let took = t.elapsed();
        if took >= SLOW_PERSIST {
            // Every request behind it on this connection waited as long.
            let count = |f: fn(&OpKind) -> bool| wrs.iter().filter(|w| f(&w.0)).count();
            tracing::warn!(
                node = %node.id(),
                ms = took.as_millis() as u64,
                requests = wrs.len(),
                durable_writes = count(|k| matches!(k, OpKind::Write { durable: true })),
                atomics = count(|k| matches!(k, OpKind::Cas { .. } | OpKind::Faa { .. })),
                bytes = wrs.iter().map(|w| u64::from(w.3)).sum::<u64>(),
                "a durable batch took long to persist (a pool file's msync on a busy disk?)"
            );
        }
    } else {
        run_batch(node, &wrs, out, tally, false);
    }
    Ok(())
}

/// A batch that persists for this long is logged at WARN (with its time).
const SLOW_PERSIST: std::time::Duration = std::time::Duration::from_millis(300);

/// A decoded work request of a batch frame: kind, rkey, address, length, data.
type WorkRequest<'a> = (OpKind, crate::types::RKey, u64, u32, &'a [u8]);

/// Executes a decoded batch in order, appending its response payload to `out`. With
/// `persist_at_end`, its atomics on NVM are persisted together (ranges merged) before the
/// answer — as on `rdma`, where the batch's persist request follows it — or before its next
/// durable write, which persists at once: a batch of thousands of CASes on one stretch of a
/// pool file (an index split's freeze) is one `msync`, not thousands.
fn run_batch(
    node: &MemoryNode,
    wrs: &[WorkRequest<'_>],
    out: &mut Vec<u8>,
    tally: &mut Tally,
    persist_at_end: bool,
) {
    let mut persists = persist_at_end.then(crate::node::Persists::default);
    let status_at = out.len();
    out.push(0); // status
    out.extend_from_slice(&0u32.to_le_bytes()); // executed count
    let mut fault: Option<(usize, AccessFault)> = None;
    let mut done = 0u32;
    let mut results = Vec::new();
    for (i, &(kind, rkey, addr, len, data)) in wrs.iter().enumerate() {
        let r = match kind {
            OpKind::Read => {
                let start = results.len();
                results.resize(start + len as usize, 0);
                let r = node.execute(kind, rkey, addr, len, &[], &mut results[start..], None);
                if r.is_err() {
                    results.truncate(start);
                }
                r
            }
            _ => node
                .execute(kind, rkey, addr, len, data, &mut [], persists.as_mut())
                .inspect(|old| {
                    if matches!(kind, OpKind::Cas { .. } | OpKind::Faa { .. }) {
                        results.extend_from_slice(&old.to_le_bytes());
                    }
                }),
        };
        match r {
            Ok(_) => {
                done += 1;
                match kind {
                    OpKind::Read => tally.read += 1,
                    OpKind::Write { .. } => tally.write += 1,
                    OpKind::Cas { .. } => tally.cas += 1,
                    OpKind::Faa { .. } => tally.faa += 1,
                }
            }
            Err(f) => {
                fault = Some((i, f));
                break;
            }
        }
    }
    if let Some(p) = persists.filter(|p| !p.is_empty()) {
        if let Err(f) = p.run() {
            // Nothing of the batch is known durable: it failed at its first request (as a
            // batch whose first verb's flush failed; its effects, as then, stay in memory).
            done = 0;
            results.clear();
            fault = Some((0, f));
        }
    }
    out[status_at + 1..status_at + 5].copy_from_slice(&done.to_le_bytes());
    if let Some((i, f)) = fault {
        out[status_at] = 1;
        out.push(f.code());
        out.push(f.detail());
        out.extend_from_slice(&(i as u32).to_le_bytes());
    }
    out.extend_from_slice(&results);
}
