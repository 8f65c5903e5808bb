//! Promises of the `tcp` backend beyond the shared conformance suite:
//!
//! - a malformed or hostile frame (before or after the handshake) closes *that* connection with
//!   a logged warning, executes nothing, and the node and its other connections keep serving;
//! - admission with a cluster secret works both ways and the secret never shows in `Debug`;
//! - connecting to a dead address or a black hole fails with `Error::Connect`, bounded by
//!   `connect_timeout` as a whole;
//! - a second server on a used address fails to start with a clear error;
//! - when a node with many connections shuts down, every outstanding and later verb fails with a
//!   node-failure error, promptly (by the broken stream, not by the operation timeout).

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dmkit_verbs::tcp::frame::{self, HEADER_LEN, Kind, op};
use dmkit_verbs::tcp::{TcpConnector, TcpServer, TcpServerConfig};
use dmkit_verbs::{Access, DramBacking, Endpoint, Error, MemoryNode, NodeId, RegionDesc};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

const NODE: NodeId = NodeId(7);
/// Bound on noticing that the server closed a raw connection.
const CLOSE_BOUND: Duration = Duration::from_secs(3);

// ---------------------------------------------------------------------------------------------
// Log capture: a process-wide tracing subscriber that records every event as one line.

fn logs() -> &'static Mutex<Vec<String>> {
    static LOGS: OnceLock<&'static Mutex<Vec<String>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static Mutex<Vec<String>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        tracing::subscriber::set_global_default(Capture(logs)).expect("install log capture");
        logs
    })
}

struct Capture(&'static Mutex<Vec<String>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = format!("{} ", event.metadata().level());
        event.record(&mut Fields(&mut line));
        self.0.lock().unwrap().push(line);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Waits (bounded) for a WARN line about the connection from `peer`; returns it.
fn warned_about(peer: &str) -> String {
    let needle = format!("peer={peer} ");
    let t = Instant::now();
    loop {
        if let Some(l) = logs()
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.starts_with("WARN") && l.contains(&needle))
        {
            return l.clone();
        }
        assert!(
            t.elapsed() < CLOSE_BOUND,
            "no warning logged for the connection from {peer}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures.

fn node() -> (Arc<MemoryNode>, RegionDesc) {
    let node = Arc::new(MemoryNode::new(NODE));
    let region = node
        .register(Arc::new(DramBacking::new(1 << 16)), Access::ALL, None)
        .unwrap();
    (node, region)
}

fn serve(cfg: TcpServerConfig) -> (TcpServer, RegionDesc) {
    let (node, region) = node();
    (TcpServer::start("127.0.0.1:0", node, cfg).unwrap(), region)
}

fn connector() -> TcpConnector {
    TcpConnector {
        connect_timeout: Duration::from_secs(2),
        op_timeout: Duration::from_secs(5),
        ..TcpConnector::default()
    }
}

fn connect(server: &TcpServer, c: &TcpConnector) -> Result<Endpoint, Error> {
    Endpoint::connect(c, &[(NODE, server.local_addr().to_string())])
}

/// Verbs still work end to end on `ep`: a write is read back, an FAA counts.
fn verbs_work(ep: &Endpoint, region: &RegionDesc, salt: u8) {
    let off = 4096 + u64::from(salt) * 64;
    ep.write("check", region.at(off), &[salt; 48]).unwrap();
    assert_eq!(
        ep.read("check", region.at(off), 48).unwrap(),
        vec![salt; 48]
    );
    let old = ep.faa("check", region.at(off + 48), 1).unwrap();
    assert_eq!(ep.faa("check", region.at(off + 48), 0).unwrap(), old + 1);
}

/// A raw socket to `server` that has read the node's Hello.
fn raw(server: &TcpServer) -> TcpStream {
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(CLOSE_BOUND)).unwrap();
    let mut p = Vec::new();
    let h = frame::read_frame(&mut s, &mut p, 4096).unwrap().unwrap();
    assert_eq!(h.kind, Kind::Hello);
    s
}

/// A raw socket past the handshake with a secret-less node (a well-formed Auth, a Welcome).
fn raw_admitted(server: &TcpServer) -> TcpStream {
    let mut s = raw(server);
    let mut auth = vec![0u8];
    auth.extend_from_slice(&[0x42; 32]);
    frame::write_frame(&mut s, Kind::Auth, 0, &auth).unwrap();
    let mut p = Vec::new();
    let h = frame::read_frame(&mut s, &mut p, 1 << 20).unwrap().unwrap();
    assert_eq!(h.kind, Kind::Welcome);
    s
}

/// The server closes `s`: a read sees EOF or a reset within the bound (an error frame before
/// that is allowed), never a timeout.
fn assert_closed(s: &mut TcpStream, what: &str) {
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("{what}: the node did not close the connection within {CLOSE_BOUND:?}")
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break, // reset: closed too
        }
        assert!(t.elapsed() < CLOSE_BOUND, "{what}: still open");
    }
}

fn header(kind: u8, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(&frame::MAGIC);
    h.push(frame::VERSION);
    h.push(kind);
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&9u64.to_le_bytes());
    h
}

/// A frame of `kind` around `payload`, built with the crate's own codec.
fn framed(kind: Kind, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let at = frame::encode_header(&mut out, kind, 9);
    out.extend_from_slice(payload);
    frame::finish(&mut out, at).unwrap();
    out
}

/// One work request: opcode, rkey, addr, len.
fn wr(code: u8, rkey: u32, addr: u64, len: u32) -> Vec<u8> {
    let mut v = vec![code];
    v.extend_from_slice(&rkey.to_le_bytes());
    v.extend_from_slice(&addr.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v
}

fn batch(count: u32, wrs: &[Vec<u8>]) -> Vec<u8> {
    let mut p = count.to_le_bytes().to_vec();
    for w in wrs {
        p.extend_from_slice(w);
    }
    framed(Kind::Batch, &p)
}

struct Hostile {
    name: &'static str,
    /// Sent after the handshake (true) or instead of the Auth frame (false).
    admitted: bool,
    bytes: Vec<u8>,
    /// Half-close after sending (the peer goes away mid-frame).
    eof: bool,
}

fn hostile_frames(region: &RegionDesc, max_frame: usize) -> Vec<Hostile> {
    let mut rng = ChaCha8Rng::seed_from_u64(0xBAD);
    let mut garbage = vec![0u8; 256];
    rng.fill_bytes(&mut garbage);
    garbage[0] = b'X'; // never the magic by chance
    let rkey = region.rkey.0;
    let base = region.base;
    let write_then = |tail: Vec<u8>| {
        let mut w = wr(op::WRITE, rkey, base, 8);
        w.extend_from_slice(&[0xEE; 8]);
        batch(2, &[w, tail])
    };
    let h = |name, admitted, bytes| Hostile {
        name,
        admitted,
        bytes,
        eof: false,
    };
    let mut bad_magic = header(Kind::Batch as u8, 0);
    bad_magic[0..2].copy_from_slice(b"MD");
    let mut bad_version = header(Kind::Batch as u8, 0);
    bad_version[2] = frame::VERSION + 1;
    let mut v = vec![
        h("garbage instead of Auth", false, garbage.clone()),
        h("bad magic instead of Auth", false, bad_magic.clone()),
        h("bad version instead of Auth", false, bad_version.clone()),
        h("unknown kind instead of Auth", false, header(200, 0)),
        h("Batch instead of Auth", false, batch(0, &[])),
        h("huge Auth", false, header(Kind::Auth as u8, u32::MAX)),
        h("truncated Auth", false, framed(Kind::Auth, &[1, 2, 3])),
        h("garbage", true, garbage),
        h("bad magic", true, bad_magic),
        h("bad version", true, bad_version),
        h("unknown kind", true, header(200, 0)),
        h("kind zero", true, header(0, 0)),
        h("server-only kind", true, framed(Kind::Welcome, &[0])),
        h(
            "length over max_frame",
            true,
            header(Kind::Batch as u8, max_frame as u32 + 1),
        ),
        h("length u32::MAX", true, header(Kind::Batch as u8, u32::MAX)),
        h(
            "lying op count",
            true,
            batch(5, &[wr(op::READ, rkey, base, 8)]),
        ),
        h(
            "op count over the batch limit",
            true,
            batch(u32::MAX, &[wr(op::READ, rkey, base, 8)]),
        ),
        h(
            "truncated work request",
            true,
            batch(1, &[wr(op::READ, rkey, base, 8)[..7].to_vec()]),
        ),
        h(
            "write shorter than its length",
            true,
            batch(1, &[wr(op::WRITE, rkey, base, 64)]),
        ),
        h(
            "trailing bytes after the work requests",
            true,
            batch(1, &[wr(op::READ, rkey, base, 8), vec![0; 5]]),
        ),
        h("unknown opcode", true, batch(1, &[wr(99, rkey, base, 8)])),
        h(
            "read far beyond the frame limit",
            true,
            batch(1, &[wr(op::READ, rkey, base, u32::MAX)]),
        ),
        h(
            "reads adding up beyond the frame limit",
            true,
            // Each read is in bounds; together they exceed what a reply frame may carry.
            batch(20, &vec![wr(op::READ, rkey, base, 60 << 10); 20]),
        ),
        // A valid WRITE followed by garbage: the frame is refused as a whole.
        h(
            "valid write, then unknown opcode",
            true,
            write_then(wr(77, rkey, base, 8)),
        ),
        h(
            "valid write, then truncated request",
            true,
            write_then(wr(op::FAA, rkey, base + 8, 8)),
        ),
    ];
    let mut eof = header(Kind::Batch as u8, 100);
    eof.extend_from_slice(&[0; 10]);
    v.push(Hostile {
        name: "length then EOF",
        admitted: true,
        bytes: eof,
        eof: true,
    });
    let mut eof = header(Kind::Auth as u8, 33);
    eof.extend_from_slice(&[0; 3]);
    v.push(Hostile {
        name: "Auth length then EOF",
        admitted: false,
        bytes: eof,
        eof: true,
    });
    v.push(Hostile {
        name: "half a header then EOF",
        admitted: true,
        bytes: header(Kind::Batch as u8, 0)[..7].to_vec(),
        eof: true,
    });
    v
}

#[test]
fn a_hostile_frame_closes_only_its_connection_and_the_node_keeps_serving() {
    logs();
    let max_frame = 1 << 20;
    let (server, region) = serve(TcpServerConfig {
        max_frame: Some(max_frame),
        ..TcpServerConfig::default()
    });
    let c = connector();
    let before = connect(&server, &c).unwrap();
    verbs_work(&before, &region, 1);
    let mem = server.node().memory(region.rkey).unwrap();
    for (i, case) in hostile_frames(&region, max_frame).into_iter().enumerate() {
        let mut s = if case.admitted {
            raw_admitted(&server)
        } else {
            raw(&server)
        };
        let peer = s.local_addr().unwrap().to_string();
        // The peer may already be gone when the rest arrives; only what the node does counts.
        let _ = s.write_all(&case.bytes);
        if case.eof {
            s.shutdown(Shutdown::Write).unwrap();
        }
        assert_closed(&mut s, case.name);
        let line = warned_about(&peer);
        assert!(line.contains("error="), "{}: {line}", case.name);
        // Nothing of a refused frame was executed.
        assert_eq!(
            mem.load_u64(0).unwrap(),
            0,
            "{}: memory was touched",
            case.name
        );
        assert_eq!(
            mem.load_u64(8).unwrap(),
            0,
            "{}: memory was touched",
            case.name
        );
        // The node goes on: the old connection and a new one both work.
        verbs_work(&before, &region, 2 + (i % 50) as u8);
        let after = connect(&server, &c).unwrap();
        verbs_work(&after, &region, 60 + (i % 50) as u8);
    }
    // Only the one good connection is left.
    let t = Instant::now();
    while server.connections() != 1 {
        assert!(
            t.elapsed() < CLOSE_BOUND,
            "{} connections open",
            server.connections()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_well_formed_batch_over_a_raw_socket_is_answered() {
    // The reference point for the hostile cases: the same codec, well formed, is served.
    let (server, region) = serve(TcpServerConfig::default());
    let mut s = raw_admitted(&server);
    let mut w = wr(op::WRITE, region.rkey.0, region.base, 8);
    w.extend_from_slice(&7u64.to_le_bytes());
    s.write_all(&batch(2, &[w, wr(op::READ, region.rkey.0, region.base, 8)]))
        .unwrap();
    let mut p = Vec::new();
    let h = frame::read_frame(&mut s, &mut p, 1 << 20).unwrap().unwrap();
    assert_eq!((h.kind, h.req_id), (Kind::BatchResp, 9));
    // status 0, two executed, then the read's 8 bytes.
    let mut want = vec![0u8];
    want.extend_from_slice(&2u32.to_le_bytes());
    want.extend_from_slice(&7u64.to_le_bytes());
    assert_eq!(p, want);
}

// ---------------------------------------------------------------------------------------------
// Admission.

const SECRET: &[u8] = b"hunter2-cluster-secret";

#[test]
fn a_node_with_a_secret_refuses_a_client_without_one() {
    let (server, _) = serve(TcpServerConfig {
        secret: Some(SECRET.to_vec()),
        ..TcpServerConfig::default()
    });
    let e = connect(&server, &connector()).unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(e.to_string().contains("secret"), "unclear: {e}");
}

#[test]
fn a_node_with_a_secret_refuses_a_client_with_a_wrong_one() {
    logs();
    let (server, region) = serve(TcpServerConfig {
        secret: Some(SECRET.to_vec()),
        ..TcpServerConfig::default()
    });
    let wrong = TcpConnector {
        secret: Some(b"hunter3-cluster-secret".to_vec()),
        ..connector()
    };
    let e = connect(&server, &wrong).unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(e.to_string().contains("secret"), "unclear: {e}");
    // An empty secret is a wrong secret too.
    let empty = TcpConnector {
        secret: Some(Vec::new()),
        ..connector()
    };
    assert!(matches!(connect(&server, &empty), Err(Error::Auth { .. })));
    // The right one is admitted and works.
    let right = TcpConnector {
        secret: Some(SECRET.to_vec()),
        ..connector()
    };
    verbs_work(&connect(&server, &right).unwrap(), &region, 3);
}

#[test]
fn a_raw_peer_without_the_secret_gets_no_verbs_executed() {
    logs();
    let (server, region) = serve(TcpServerConfig {
        secret: Some(SECRET.to_vec()),
        ..TcpServerConfig::default()
    });
    // Skip proving and go straight to a batch: refused, closed, nothing written.
    let mut s = raw(&server);
    let peer = s.local_addr().unwrap().to_string();
    let mut w = wr(op::WRITE, region.rkey.0, region.base, 8);
    w.extend_from_slice(&[0xEE; 8]);
    let _ = s.write_all(&batch(1, &[w]));
    assert_closed(&mut s, "batch without auth");
    warned_about(&peer);
    // An Auth without a proof: refused with an error frame, then closed.
    let mut s = raw(&server);
    let mut auth = vec![0u8];
    auth.extend_from_slice(&[1; 32]);
    frame::write_frame(&mut s, Kind::Auth, 0, &auth).unwrap();
    let mut p = Vec::new();
    let h = frame::read_frame(&mut s, &mut p, 4096).unwrap().unwrap();
    assert_eq!(h.kind, Kind::Error);
    assert!(String::from_utf8_lossy(&p).contains("secret"));
    assert_closed(&mut s, "auth without proof");
    let mem = server.node().memory(region.rkey).unwrap();
    assert_eq!(mem.load_u64(0).unwrap(), 0);
}

#[test]
fn a_client_with_a_secret_refuses_a_node_that_cannot_prove_it() {
    let (open, _) = serve(TcpServerConfig::default());
    let c = TcpConnector {
        secret: Some(SECRET.to_vec()),
        ..connector()
    };
    let e = connect(&open, &c).unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(e.to_string().contains("secret"), "unclear: {e}");
    // A node that knows another secret cannot prove ours either (and refuses us).
    let (other, _) = serve(TcpServerConfig {
        secret: Some(b"another".to_vec()),
        ..TcpServerConfig::default()
    });
    assert!(matches!(connect(&other, &c), Err(Error::Auth { .. })));
}

#[test]
fn the_right_secret_is_admitted_both_ways() {
    let (server, region) = serve(TcpServerConfig {
        secret: Some(SECRET.to_vec()),
        ..TcpServerConfig::default()
    });
    let c = TcpConnector::with_secret(SECRET);
    let ep = connect(&server, &c).unwrap();
    verbs_work(&ep, &region, 4);
    let ep2 = connect(&server, &c).unwrap();
    verbs_work(&ep2, &region, 5);
}

#[test]
fn the_secret_never_appears_in_debug_output() {
    let (server, _) = serve(TcpServerConfig {
        secret: Some(SECRET.to_vec()),
        ..TcpServerConfig::default()
    });
    let cfg = TcpServerConfig {
        secret: Some(SECRET.to_vec()),
        ..TcpServerConfig::default()
    };
    let c = TcpConnector::with_secret(SECRET);
    let ep = connect(&server, &c).unwrap();
    let as_numbers = format!("{:?}", SECRET.to_vec());
    let inner = &as_numbers[1..as_numbers.len() - 1]; // "104, 117, ..."
    for (what, dbg) in [
        ("TcpServerConfig", format!("{cfg:?}")),
        ("TcpServerConfig (pretty)", format!("{cfg:#?}")),
        ("TcpConnector", format!("{c:?}")),
        ("TcpConnector (pretty)", format!("{c:#?}")),
        ("TcpServer", format!("{server:?}")),
        ("Endpoint", format!("{ep:?}")),
    ] {
        assert!(!dbg.contains("hunter2"), "{what} shows the secret: {dbg}");
        assert!(
            !dbg.contains(inner),
            "{what} shows the secret's bytes: {dbg}"
        );
    }
    assert!(format!("{c:?}").contains("redacted"));
}

// ---------------------------------------------------------------------------------------------
// Connecting to what is not a node.

fn quick_connector() -> TcpConnector {
    TcpConnector {
        connect_timeout: Duration::from_millis(300),
        ..connector()
    }
}

#[test]
fn a_dead_address_is_a_connect_error_at_once() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }; // closed: nothing listens there now
    let t = Instant::now();
    let e = Endpoint::connect(&quick_connector(), &[(NODE, addr.to_string())]).unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );
    // An address that does not resolve is a connect error too.
    let e = Endpoint::connect(&quick_connector(), &[(NODE, "not an address".into())]).unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e}");
}

/// A listener that accepts connections and says nothing, until dropped.
struct BlackHole {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BlackHole {
    /// `speak` is run on every accepted stream (a black hole says nothing).
    fn new(speak: fn(&mut TcpStream)) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !st.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        speak(&mut s);
                        held.push(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_black_hole_is_a_connect_error_within_the_connect_timeout() {
    let hole = BlackHole::new(|_| {});
    let c = quick_connector();
    let t = Instant::now();
    let e = Endpoint::connect(&c, &[(NODE, hole.addr.to_string())]).unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, Error::Connect { .. }), "{e}");
    assert!(took >= c.connect_timeout / 2, "gave up early: {took:?}");
    assert!(
        took < c.connect_timeout + Duration::from_millis(700),
        "took {took:?} with a connect timeout of {:?}",
        c.connect_timeout
    );
}

#[test]
fn a_peer_that_dribbles_its_hello_is_cut_off_at_the_connect_timeout() {
    // Each byte comes well within the timeout, but the handshake as a whole never does.
    let hole = BlackHole::new(|s| {
        let mut hello = Vec::new();
        hello.extend_from_slice(&NODE.0.to_le_bytes());
        hello.push(0);
        hello.extend_from_slice(&[0; 32]);
        let f = framed(Kind::Hello, &hello);
        let mut s = s.try_clone().unwrap();
        std::thread::spawn(move || {
            for b in f {
                if s.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
    });
    let c = quick_connector();
    let t = Instant::now();
    let e = Endpoint::connect(&c, &[(NODE, hole.addr.to_string())]).unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, Error::Connect { .. }), "{e}");
    assert!(
        took < c.connect_timeout + Duration::from_millis(700),
        "took {took:?} with a connect timeout of {:?}",
        c.connect_timeout
    );
}

#[test]
fn a_server_on_a_used_address_fails_to_start_with_a_clear_error() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (n, _) = node();
    let e = TcpServer::start(addr.as_str(), n, TcpServerConfig::default()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains(&addr), "does not name the address: {msg}");
    assert!(msg.contains("in use"), "does not say why: {msg}");
    // Same against another node's address; the first node is unaffected.
    let (first, region) = serve(TcpServerConfig::default());
    let (n, _) = node();
    let first_addr = first.local_addr().to_string();
    assert!(TcpServer::start(first_addr.as_str(), n, TcpServerConfig::default()).is_err());
    verbs_work(&connect(&first, &connector()).unwrap(), &region, 6);
}

// ---------------------------------------------------------------------------------------------
// Shutdown under load.

const CLIENTS: usize = 16;
/// Failure must be noticed by the broken streams, well before the 5 s operation timeout.
const FAIL_BOUND: Duration = Duration::from_secs(2);

#[test]
fn many_clients_see_a_node_shutdown_as_node_failure_promptly() {
    let (mut server, region) = serve(TcpServerConfig::default());
    let c = connector();
    let eps: Vec<_> = (0..CLIENTS)
        .map(|_| connect(&server, &c).unwrap())
        .collect();
    let start = Barrier::new(CLIENTS + 1);
    let shut_at: Mutex<Option<Instant>> = Mutex::new(None);
    std::thread::scope(|s| {
        let handles: Vec<_> = eps
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                let (start, region) = (&start, &region);
                s.spawn(move || {
                    start.wait();
                    let mut ok = 0u64;
                    let err = loop {
                        let mut b = ep.batch(NODE);
                        b.faa(region.at(0), 1);
                        b.write(region.at(64 + i as u64 * 8), &ok.to_le_bytes());
                        match ep.execute("load", b) {
                            Ok(_) => ok += 1,
                            Err(e) => break e,
                        }
                    };
                    let failed_at = Instant::now();
                    // Every later verb fails as well.
                    let later: Vec<_> = (0..3)
                        .map(|_| ep.read("later", region.at(0), 8).unwrap_err())
                        .collect();
                    (ok, err, failed_at, later)
                })
            })
            .collect();
        start.wait();
        std::thread::sleep(Duration::from_millis(150));
        *shut_at.lock().unwrap() = Some(Instant::now());
        server.shutdown();
        let shut = shut_at.lock().unwrap().unwrap();
        let mut total = 0;
        for h in handles {
            let (ok, err, failed_at, later) = h.join().unwrap();
            total += ok;
            assert!(ok > 0, "a client never got going");
            assert!(err.is_node_failure(), "{err}");
            assert!(
                failed_at.saturating_duration_since(shut) < FAIL_BOUND,
                "noticed after {:?}",
                failed_at - shut
            );
            for e in later {
                assert!(e.is_node_failure(), "{e}");
            }
        }
        // Every completed batch was executed; at most one in flight per client beyond that.
        let mem = server.node().memory(region.rkey).unwrap();
        let executed = mem.load_u64(0).unwrap();
        assert!(
            (total..=total + CLIENTS as u64).contains(&executed),
            "{executed} executed, {total} completed"
        );
    });
}

#[test]
fn outstanding_verbs_fail_as_node_failure_when_the_node_shuts_down() {
    let (mut server, region) = serve(TcpServerConfig::default());
    let c = connector();
    let eps: Vec<_> = (0..CLIENTS)
        .map(|_| connect(&server, &c).unwrap())
        .collect();
    for (i, ep) in eps.iter().enumerate() {
        verbs_work(ep, &region, i as u8);
    }
    server.pause(true);
    let pending: Vec<_> = eps
        .iter()
        .map(|ep| {
            let mut b = ep.batch(NODE);
            b.faa(region.at(0), 1);
            ep.post("stuck", b)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    assert!(pending.iter().all(|p| !p.is_ready()));
    let t = Instant::now();
    server.shutdown();
    for (ep, p) in eps.iter().zip(pending) {
        let e = ep.wait(p).unwrap_err();
        assert!(e.is_node_failure(), "{e}");
        let e = ep.faa("later", region.at(0), 1).unwrap_err();
        assert!(e.is_node_failure(), "{e}");
        let conn = ep.connection(NODE).unwrap();
        assert!(!conn.is_alive());
    }
    assert!(t.elapsed() < FAIL_BOUND, "took {:?}", t.elapsed());
    // A killed node executes nothing more: none of the held FAAs ran.
    let mem = server.node().memory(region.rkey).unwrap();
    assert_eq!(mem.load_u64(0).unwrap(), 0);
    // And nothing new gets in.
    assert!(matches!(connect(&server, &c), Err(Error::Connect { .. })));
}

#[test]
fn a_batch_whose_reply_would_exceed_the_frame_limit_is_refused_locally() {
    let (server, region) = serve(TcpServerConfig::default());
    let c = TcpConnector {
        max_frame: 64 << 10,
        ..connector()
    };
    let ep = connect(&server, &c).unwrap();
    let mut b = ep.batch(NODE);
    b.read(region.at(0), 40 << 10);
    b.read(region.at(0), 40 << 10);
    let e = ep.execute("big", b).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // Nothing was sent that could break the connection.
    assert!(ep.connection(NODE).unwrap().is_alive());
    verbs_work(&ep, &region, 7);
}
