//! A Redis-protocol (RESP2) gateway: Redis clients talk to a key-value backend (FUSEE) through
//! GET, SET (NX/XX), SETNX, DEL, EXISTS, MGET, MSET, PING, ECHO, INFO, COMMAND, SELECT 0 and
//! QUIT, with Redis's error formats and pipelining.

pub mod codec;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use codec::{Limits, Reply, parse_command};

/// How a SET treats an existing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Insert or overwrite.
    Upsert,
    /// Only if absent (NX).
    IfAbsent,
    /// Only if present (XX).
    IfPresent,
}

/// The store behind the gateway.
pub trait KvBackend: Send + Sync {
    /// The value of `key`, if present.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String>;
    /// Stores `value` under `key` as `mode` says; whether it was written.
    fn put(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool, String>;
    /// Removes `key`; whether it was present.
    fn delete(&self, key: &[u8]) -> Result<bool, String>;
    /// Lines for INFO's "# Keyspace"-like backend section (`name:value`).
    fn info(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// Settings of the gateway.
#[derive(Debug, Clone)]
pub struct RespConfig {
    pub limits: Limits,
    /// Connections beyond this are refused with Redis's "max number of clients" error.
    pub max_clients: usize,
}

impl Default for RespConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            max_clients: 1024,
        }
    }
}

struct Shared {
    backend: Arc<dyn KvBackend>,
    cfg: RespConfig,
    clients: AtomicUsize,
    commands: AtomicU64,
    started: Instant,
    stop: AtomicBool,
}

/// A running gateway; stops accepting when dropped (open connections finish their command).
pub struct RespServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RespServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RespServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl RespServer {
    /// Binds `addr` and serves on background threads (one per connection).
    pub fn start(
        addr: &str,
        backend: Arc<dyn KvBackend>,
        cfg: RespConfig,
    ) -> std::io::Result<RespServer> {
        let l = TcpListener::bind(addr)?;
        let local = l.local_addr()?;
        let shared = Arc::new(Shared {
            backend,
            cfg,
            clients: AtomicUsize::new(0),
            commands: AtomicU64::new(0),
            started: Instant::now(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("resp-accept".into())
            .spawn(move || {
                for conn in l.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let s2 = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("resp-conn".into())
                        .spawn(move || serve(&s2, conn));
                }
            })?;
        Ok(RespServer {
            addr: local,
            shared,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for RespServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(s: &Shared, mut conn: TcpStream) {
    let n = s.clients.fetch_add(1, Ordering::SeqCst) + 1;
    let _guard = Guard(&s.clients);
    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    if n > s.cfg.max_clients {
        let mut out = Vec::new();
        Reply::err("max number of clients reached").encode(&mut out);
        let _ = conn.write_all(&out);
        return;
    }
    let _ = conn.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut out: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        // Run every complete command buffered, then send all replies at once (pipelining).
        let mut used = 0;
        let mut quit = false;
        loop {
            match parse_command(&buf[used..], &s.cfg.limits) {
                Ok(Some((args, n))) => {
                    used += n;
                    if args.is_empty() {
                        continue;
                    }
                    let (reply, q) = execute(s, &args);
                    reply.encode(&mut out);
                    if q {
                        quit = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "closing RESP connection");
                    Reply::err(e).encode(&mut out);
                    let _ = conn.write_all(&out);
                    return;
                }
            }
        }
        buf.drain(..used);
        if !out.is_empty() {
            if conn.write_all(&out).is_err() {
                return;
            }
            out.clear();
        }
        if quit {
            return;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

struct Guard<'a>(&'a AtomicUsize);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

fn backend_err(e: String) -> Reply {
    Reply::err(format!("backend: {e}"))
}

/// Runs one command; the flag says the connection should close after the reply (QUIT).
fn execute(s: &Shared, args: &[Vec<u8>]) -> (Reply, bool) {
    s.commands.fetch_add(1, Ordering::Relaxed);
    let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
    metrics::counter!("dmkit_resp_commands_total", "command" => command_label(&name)).increment(1);
    let b = &s.backend;
    let argv = &args[1..];
    let reply = match name.as_str() {
        "ping" => match argv {
            [] => Reply::Simple("PONG".into()),
            [m] => Reply::Bulk(m.clone()),
            _ => arity("ping"),
        },
        "echo" => match argv {
            [m] => Reply::Bulk(m.clone()),
            _ => arity("echo"),
        },
        "quit" => return (Reply::ok(), true),
        "get" => match argv {
            [k] => match b.get(k) {
                Ok(Some(v)) => Reply::Bulk(v),
                Ok(None) => Reply::Nil,
                Err(e) => backend_err(e),
            },
            _ => arity("get"),
        },
        "set" => set(b.as_ref(), argv),
        "setnx" => match argv {
            [k, v] => match b.put(k, v, PutMode::IfAbsent) {
                Ok(w) => Reply::Integer(i64::from(w)),
                Err(e) => backend_err(e),
            },
            _ => arity("setnx"),
        },
        "del" | "unlink" if !argv.is_empty() => {
            let mut n = 0;
            for k in argv {
                match b.delete(k) {
                    Ok(true) => n += 1,
                    Ok(false) => {}
                    Err(e) => return (backend_err(e), false),
                }
            }
            Reply::Integer(n)
        }
        "exists" if !argv.is_empty() => {
            let mut n = 0;
            for k in argv {
                match b.get(k) {
                    Ok(Some(_)) => n += 1,
                    Ok(None) => {}
                    Err(e) => return (backend_err(e), false),
                }
            }
            Reply::Integer(n)
        }
        "mget" if !argv.is_empty() => {
            let mut items = Vec::with_capacity(argv.len());
            for k in argv {
                match b.get(k) {
                    Ok(Some(v)) => items.push(Reply::Bulk(v)),
                    Ok(None) => items.push(Reply::Nil),
                    Err(e) => return (backend_err(e), false),
                }
            }
            Reply::Array(items)
        }
        "mset" if !argv.is_empty() && argv.len() % 2 == 0 => {
            for kv in argv.chunks(2) {
                if let Err(e) = b.put(&kv[0], &kv[1], PutMode::Upsert) {
                    return (backend_err(e), false);
                }
            }
            Reply::ok()
        }
        "del" | "unlink" | "exists" | "mget" | "mset" => arity(&name),
        "info" => Reply::Bulk(info(s).into_bytes()),
        "command" => match argv.first().map(|a| a.to_ascii_lowercase()) {
            Some(c) if c == b"count" => Reply::Integer(COMMANDS.len() as i64),
            _ => Reply::Array(Vec::new()),
        },
        "config" => Reply::Array(Vec::new()),
        "select" => match argv {
            [db] if db.as_slice() == b"0" => Reply::ok(),
            [_] => Reply::err("DB index is out of range"),
            _ => arity("select"),
        },
        _ => {
            let mut m = format!(
                "unknown command '{}', with args beginning with: ",
                String::from_utf8_lossy(&args[0])
            );
            for a in argv.iter().take(8) {
                m.push_str(&format!("'{}' ", String::from_utf8_lossy(a)));
            }
            Reply::err(m)
        }
    };
    if matches!(reply, Reply::Error(_)) {
        metrics::counter!("dmkit_resp_errors_total").increment(1);
    }
    (reply, false)
}

const COMMANDS: [&str; 15] = [
    "ping", "echo", "quit", "get", "set", "setnx", "del", "unlink", "exists", "mget", "mset",
    "info", "command", "config", "select",
];

fn command_label(name: &str) -> &'static str {
    COMMANDS
        .iter()
        .find(|c| **c == name)
        .copied()
        .unwrap_or("other")
}

fn set(b: &dyn KvBackend, argv: &[Vec<u8>]) -> Reply {
    let [k, v, opts @ ..] = argv else {
        return arity("set");
    };
    let mut mode = PutMode::Upsert;
    for o in opts {
        match o.to_ascii_uppercase().as_slice() {
            b"NX" if mode == PutMode::Upsert => mode = PutMode::IfAbsent,
            b"XX" if mode == PutMode::Upsert => mode = PutMode::IfPresent,
            b"EX" | b"PX" | b"EXAT" | b"PXAT" | b"KEEPTTL" => {
                return Reply::err(
                    "expiry (EX/PX/EXAT/PXAT/KEEPTTL) is not supported by this store",
                );
            }
            b"GET" => return Reply::err("SET ... GET is not supported by this store"),
            _ => return Reply::err("syntax error"),
        }
    }
    match b.put(k, v, mode) {
        Ok(true) => Reply::ok(),
        Ok(false) => Reply::Nil,
        Err(e) => backend_err(e),
    }
}

fn info(s: &Shared) -> String {
    let mut out = String::new();
    out.push_str("# Server\r\nredis_version:7.0.0\r\ndmkit_version:");
    out.push_str(env!("CARGO_PKG_VERSION"));
    out.push_str("\r\nredis_mode:standalone\r\n");
    out.push_str(&format!(
        "uptime_in_seconds:{}\r\n",
        s.started.elapsed().as_secs()
    ));
    out.push_str("\r\n# Clients\r\n");
    out.push_str(&format!(
        "connected_clients:{}\r\n",
        s.clients.load(Ordering::Relaxed)
    ));
    out.push_str("\r\n# Stats\r\n");
    out.push_str(&format!(
        "total_commands_processed:{}\r\n",
        s.commands.load(Ordering::Relaxed)
    ));
    let extra = s.backend.info();
    if !extra.is_empty() {
        out.push_str("\r\n# Backend\r\n");
        for (k, v) in extra {
            out.push_str(&format!("{k}:{v}\r\n"));
        }
    }
    out
}

/// An in-memory backend: for tests of the gateway itself and for `redis-benchmark` baselines
/// of the protocol path alone.
#[derive(Debug, Default)]
pub struct MemoryBackend {
    map: parking_lot::Mutex<std::collections::HashMap<Vec<u8>, Vec<u8>>>,
}

impl KvBackend for MemoryBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        Ok(self.map.lock().get(key).cloned())
    }
    fn put(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool, String> {
        let mut m = self.map.lock();
        let present = m.contains_key(key);
        let write = match mode {
            PutMode::Upsert => true,
            PutMode::IfAbsent => !present,
            PutMode::IfPresent => present,
        };
        if write {
            m.insert(key.to_vec(), value.to_vec());
        }
        Ok(write)
    }
    fn delete(&self, key: &[u8]) -> Result<bool, String> {
        Ok(self.map.lock().remove(key).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(server: &RespServer, input: &[u8], expect: &[u8]) {
        let mut c = TcpStream::connect(server.local_addr()).unwrap();
        c.write_all(input).unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while got.len() < expect.len() {
            let n = c.read(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(expect)
        );
    }

    fn server() -> RespServer {
        RespServer::start(
            "127.0.0.1:0",
            Arc::new(MemoryBackend::default()),
            RespConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn pipelined_commands_answer_in_order() {
        let s = server();
        roundtrip(
            &s,
            b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\nSET b 2 NX\r\nSET b 3 NX\r\nset c 3 XX\r\nMGET a b c\r\nEXISTS a b c\r\nDEL a c\r\nGET a\r\nPING\r\n",
            b"+OK\r\n+OK\r\n$-1\r\n$-1\r\n*3\r\n$1\r\n1\r\n$1\r\n2\r\n$-1\r\n:2\r\n:1\r\n$-1\r\n+PONG\r\n",
        );
    }

    #[test]
    fn errors_use_redis_formats() {
        let s = server();
        roundtrip(
            &s,
            b"FOO bar\r\nGET\r\nSET k v EX 10\r\nSET k v NX XX\r\nMSET a\r\nSELECT 3\r\n",
            b"-ERR unknown command 'FOO', with args beginning with: 'bar' \r\n-ERR wrong number of arguments for 'get' command\r\n-ERR expiry (EX/PX/EXAT/PXAT/KEEPTTL) is not supported by this store\r\n-ERR syntax error\r\n-ERR wrong number of arguments for 'mset' command\r\n-ERR DB index is out of range\r\n",
        );
    }

    #[test]
    fn a_protocol_error_closes_only_that_connection() {
        let s = server();
        roundtrip(
            &s,
            b"*1\r\n$x\r\n",
            b"-ERR Protocol error: invalid count 'x'\r\n",
        );
        roundtrip(&s, b"PING\r\nQUIT\r\nPING\r\n", b"+PONG\r\n+OK\r\n");
    }
}
