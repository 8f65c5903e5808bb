//! The memory-node side of the `tcp` backend: a soft NIC that executes one-sided verbs against
//! the node's registered memory. No application logic runs here except the node's RPC handler.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::auth;
use super::frame::{self, Cursor, FrameError, Kind, op};
use crate::error::{AccessFault, Error, Result};
use crate::node::{MemoryNode, OpKind, Peer};

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

struct Shared {
    node: Arc<MemoryNode>,
    cfg: TcpServerConfig,
    max_frame: usize,
    stop: AtomicBool,
    paused: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
}

/// A memory node served over TCP. Dropping it (or [`TcpServer::shutdown`]) stops accepting and
/// closes every connection, as a crash would from the clients' point of view.
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
    /// Binds `addr` and starts serving `node` on background threads (one per connection).
    pub fn start(
        addr: impl ToSocketAddrs + std::fmt::Display,
        node: Arc<MemoryNode>,
        cfg: TcpServerConfig,
    ) -> Result<TcpServer> {
        let listener = TcpListener::bind(&addr).map_err(|e| Error::Listen {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?;
        let local = listener.local_addr()?;
        let shared = Arc::new(Shared {
            node,
            max_frame: cfg.max_frame.unwrap_or(DEFAULT_MAX_FRAME),
            cfg,
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name(format!("dmkit-memnode-accept-{}", s.node.id()))
            .spawn(move || accept_loop(&s, listener))?;
        tracing::info!(addr = %local, node = %shared.node.id(), "memory node serving over tcp");
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

    /// Open client connections.
    pub fn connections(&self) -> usize {
        self.shared.conns.lock().len()
    }

    /// Stops executing requests (they wait) without closing anything: a hung node, for tests
    /// of client timeouts.
    pub fn pause(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::SeqCst);
    }

    /// Stops accepting and closes every connection.
    pub fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        for (_, s) in self.shared.conns.lock().drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        match stream.try_clone() {
            Ok(c) => {
                shared.conns.lock().insert(id, c);
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "cannot track connection");
                continue;
            }
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("dmkit-memnode-conn-{id}"))
            .spawn(move || {
                let p = Peer {
                    conn_id: id,
                    addr: peer.clone(),
                };
                match serve(&s, stream, &p) {
                    Ok(()) => tracing::debug!(%peer, "connection closed"),
                    Err(e) if s.stop.load(Ordering::SeqCst) => {
                        tracing::debug!(%peer, error = %e, "connection ended at shutdown")
                    }
                    Err(e) => tracing::warn!(%peer, error = %e, "closing connection"),
                }
                if let Some(c) = s.conns.lock().remove(&id) {
                    let _ = c.shutdown(Shutdown::Both);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot spawn a connection thread");
            shared.conns.lock().remove(&id);
        }
    }
}

/// Runs one connection: handshake, then frames until EOF or a protocol violation.
fn serve(shared: &Shared, stream: TcpStream, peer: &Peer) -> std::result::Result<(), FrameError> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::with_capacity(64 << 10, stream.try_clone()?);
    let mut writer = BufWriter::with_capacity(64 << 10, stream.try_clone()?);
    let node = &shared.node;
    let mut payload = Vec::new();

    // Handshake: Hello(node, auth?, nonce) -> Auth(proof?, client nonce) -> Welcome(proof?, regions).
    stream.set_read_timeout(Some(
        shared
            .cfg
            .handshake_timeout
            .unwrap_or(Duration::from_secs(10)),
    ))?;
    let server_nonce = auth::nonce();
    let mut hello = Vec::new();
    hello.extend_from_slice(&node.id().0.to_le_bytes());
    hello.push(u8::from(shared.cfg.secret.is_some()));
    hello.extend_from_slice(&server_nonce);
    frame::write_frame(&mut writer, Kind::Hello, 0, &hello)?;
    let Some(h) = frame::read_frame(&mut reader, &mut payload, 4096)? else {
        return Ok(());
    };
    if h.kind != Kind::Auth {
        return Err(FrameError::Malformed {
            what: "handshake (expected Auth)",
        });
    }
    let mut c = Cursor::new(&payload, "Auth frame");
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
            let _ = frame::write_frame(&mut writer, Kind::Error, 0, msg.as_bytes());
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
    frame::write_frame(&mut writer, Kind::Welcome, 0, &welcome)?;
    stream.set_read_timeout(None)?;

    let mut out = Vec::with_capacity(4096);
    loop {
        let Some(h) = frame::read_frame(&mut reader, &mut payload, shared.max_frame)? else {
            return Ok(());
        };
        if shared.paused.load(Ordering::SeqCst) {
            // What was executed before the pause is answered.
            writer.flush()?;
        }
        while shared.paused.load(Ordering::SeqCst) && !shared.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if shared.stop.load(Ordering::SeqCst) {
            // A killed node executes nothing more.
            return Ok(());
        }
        out.clear();
        match h.kind {
            Kind::Batch => {
                let at = frame::encode_header(&mut out, Kind::BatchResp, h.req_id);
                execute_batch(node, &payload, &mut out, shared.max_frame)?;
                frame::finish(&mut out, at)?;
            }
            Kind::Rpc => {
                let at = frame::encode_header(&mut out, Kind::RpcResp, h.req_id);
                match node.rpc(peer, &payload) {
                    Ok(reply) => {
                        out.push(0);
                        out.extend_from_slice(&reply);
                    }
                    Err(msg) => {
                        out.push(1);
                        out.extend_from_slice(msg.as_bytes());
                    }
                }
                frame::finish(&mut out, at)?;
            }
            Kind::Regions => {
                let at = frame::encode_header(&mut out, Kind::RegionsResp, h.req_id);
                frame::encode_regions(&mut out, &node.regions());
                frame::finish(&mut out, at)?;
            }
            _ => {
                return Err(FrameError::Malformed {
                    what: "frame kind from a client",
                });
            }
        }
        writer.write_all(&out)?;
        // Frames already received are answered before the responses go out: a client with
        // many verbs in flight gets them in one write.
        if reader.buffer().is_empty() {
            writer.flush()?;
        }
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
    match hdr.kind {
        Kind::Batch => {
            let at = frame::encode_header(&mut out, Kind::BatchResp, hdr.req_id);
            execute_batch(node, payload, &mut out, max_frame)?;
            frame::finish(&mut out, at)?;
        }
        Kind::Rpc => {
            let at = frame::encode_header(&mut out, Kind::RpcResp, hdr.req_id);
            let peer = Peer {
                conn_id: 0,
                addr: "serve_frame".into(),
            };
            match node.rpc(&peer, payload) {
                Ok(r) => {
                    out.push(0);
                    out.extend_from_slice(&r);
                }
                Err(m) => {
                    out.push(1);
                    out.extend_from_slice(m.as_bytes());
                }
            }
            frame::finish(&mut out, at)?;
        }
        Kind::Regions => {
            let at = frame::encode_header(&mut out, Kind::RegionsResp, hdr.req_id);
            frame::encode_regions(&mut out, &node.regions());
            frame::finish(&mut out, at)?;
        }
        _ => {
            return Err(FrameError::Malformed {
                what: "frame kind from a client",
            });
        }
    }
    Ok(out)
}

/// Decodes and executes one batch frame, appending the response payload to `out`. The whole
/// frame is decoded and checked first: a malformed frame executes nothing. Work requests then
/// run in order; the first refused one stops the batch (the rest are not executed).
fn execute_batch(
    node: &MemoryNode,
    payload: &[u8],
    out: &mut Vec<u8>,
    max_frame: usize,
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
                let r = node.execute(kind, rkey, addr, len, &[], &mut results[start..]);
                if r.is_err() {
                    results.truncate(start);
                }
                r
            }
            _ => node
                .execute(kind, rkey, addr, len, data, &mut [])
                .inspect(|old| {
                    if matches!(kind, OpKind::Cas { .. } | OpKind::Faa { .. }) {
                        results.extend_from_slice(&old.to_le_bytes());
                    }
                }),
        };
        match r {
            Ok(_) => done += 1,
            Err(f) => {
                fault = Some((i, f));
                break;
            }
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
    Ok(())
}
