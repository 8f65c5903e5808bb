//! A Redis-protocol gateway (RESP2, and RESP3 after `HELLO 3`): Redis clients talk to a
//! key-value backend (FUSEE) through the string, key, expiry, connection, server and
//! transaction commands of [`commands::COMMANDS`] (the one list of what is served), with
//! Redis's error formats and pipelining. Read-modify-write commands read the key's entry
//! (value, deadline, version: [`KvBackend::get_entry`]) and write over exactly that entry
//! ([`KvBackend::replace_entry`], [`KvBackend::delete_entry`]), again when another writer came
//! between.
//!
//! **Expiry**: a key may carry a deadline (Unix milliseconds, the backend's clock); past it
//! the key reads as absent, and a background task deletes expired keys one backend step at
//! a time ([`RespConfig::expiry_sweep`]).
//!
//! **Transactions**: a `MULTI` block on one key is one atomic step (run on a copy of the
//! entry read, written over it with compare-and-set, run again if another writer came
//! between); `WATCH` of one key aborts `EXEC` (nil) when its entry changed. A block or a
//! `WATCH` over several keys is refused with an error and nothing applied: this store cannot
//! yet make several keys one atomic step, and never half-applies one.

pub mod codec;
pub mod commands;

use std::borrow::Cow;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use codec::{Limits, Reply, parse_command};
pub use dmkit_fusee::{SweepPacer, Swept};

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

/// What a conditional write of an entry compares: the backend's own token for one write of a
/// key (not only its bytes: a change back to the same value is a change), compared with `==`.
#[derive(Clone)]
pub struct Version(Arc<dyn Token>);

/// A backend's version token (any `PartialEq` type).
pub trait Token: Send + Sync + 'static {
    /// Whether `other` is the same token.
    fn same(&self, other: &dyn Token) -> bool;
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<T: PartialEq + Send + Sync + 'static> Token for T {
    fn same(&self, other: &dyn Token) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Version {
    pub fn new<T: PartialEq + Send + Sync + 'static>(token: T) -> Version {
        Version(Arc::new(token))
    }

    /// The token, if it is a `T` (a backend reads back its own).
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Version) -> bool {
        self.0.same(other.0.as_ref())
    }
}

impl std::fmt::Debug for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Version(..)")
    }
}

/// A key's value as read, with its deadline and its version.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub value: Vec<u8>,
    /// Unix milliseconds (the backend's clock, [`KvBackend::now_ms`]) after which the key
    /// reads as absent; `None`: never.
    pub expires_at: Option<u64>,
    /// What [`KvBackend::replace_entry`] and [`KvBackend::delete_entry`] compare.
    pub version: Version,
}

const NO_EXPIRY: &str = "this backend has no deadlines (expiry)";

/// The store behind the gateway.
///
/// Deadlines: an entry may expire ([`KvBackend::put_entry`] and
/// [`KvBackend::replace_entry`] take one); past it the key reads as absent everywhere
/// (`get`, `get_entry`, `scan`, and a `put` with [`PutMode::IfAbsent`] takes it as absent), and
/// [`KvBackend::reclaim_expired`] deletes expired keys one step at a time. `put` (and
/// `compare_and_set`) write a value without a deadline, as Redis's SET does.
pub trait KvBackend: Send + Sync {
    /// The value of `key`, if present.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String>;
    /// Stores `value` under `key` as `mode` says; whether it was written.
    fn put(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool, String>;
    /// Removes `key`; whether it was present.
    fn delete(&self, key: &[u8]) -> Result<bool, String>;
    /// Replaces `key`'s value with `value` only if it is `expected` (linearizable).
    fn compare_and_set(&self, key: &[u8], expected: &[u8], value: &[u8]) -> Result<Cas, String> {
        let _ = (key, expected, value);
        Err("this backend has no compare-and-set".into())
    }
    /// Deletes `key` only if its value is `expected` (linearizable).
    fn delete_if(&self, key: &[u8], expected: &[u8]) -> Result<Cas, String> {
        let _ = (key, expected);
        Err("this backend has no conditional delete".into())
    }
    /// [`KvBackend::compare_and_set`] as a future (see [`KvBackend::get_async`]).
    fn compare_and_set_async(
        &self,
        key: Vec<u8>,
        expected: Vec<u8>,
        value: Vec<u8>,
    ) -> Option<BoxFuture<Result<Cas, String>>> {
        let _ = (key, expected, value);
        None
    }
    /// [`KvBackend::delete_if`] as a future (see [`KvBackend::get_async`]).
    fn delete_if_async(
        &self,
        key: Vec<u8>,
        expected: Vec<u8>,
    ) -> Option<BoxFuture<Result<Cas, String>>> {
        let _ = (key, expected);
        None
    }
    /// One step of a scan over every key: some keys and the next cursor (0: done; start
    /// with 0). Every key present for the whole scan comes at least once; a key may come
    /// twice.
    fn scan(&self, cursor: u64) -> Result<ScanStep, String> {
        let _ = cursor;
        Err("this backend cannot scan its keys".into())
    }
    /// [`KvBackend::scan`] as a future (see [`KvBackend::get_async`]).
    fn scan_async(&self, cursor: u64) -> Option<BoxFuture<Result<ScanStep, String>>> {
        let _ = cursor;
        None
    }
    /// The key's entry: value, deadline and version (`None` if absent or expired). The
    /// default has no deadlines: the value is its own version.
    fn get_entry(&self, key: &[u8]) -> Result<Option<Entry>, String> {
        Ok(self.get(key)?.map(|v| Entry {
            version: Version::new(v.clone()),
            value: v,
            expires_at: None,
        }))
    }
    /// Stores `value` with deadline `expires_at` as `mode` says; whether it was written.
    fn put_entry(
        &self,
        key: &[u8],
        value: &[u8],
        expires_at: Option<u64>,
        mode: PutMode,
    ) -> Result<bool, String> {
        match expires_at {
            None => self.put(key, value, mode),
            Some(_) => Err(NO_EXPIRY.into()),
        }
    }
    /// Writes `value` and deadline `expires_at` only if `key` still holds exactly `current`
    /// (its version), linearizable.
    fn replace_entry(
        &self,
        key: &[u8],
        current: &Entry,
        value: &[u8],
        expires_at: Option<u64>,
    ) -> Result<Cas, String> {
        match (expires_at, current.version.get::<Vec<u8>>()) {
            (None, Some(v)) => self.compare_and_set(key, v, value),
            _ => Err(NO_EXPIRY.into()),
        }
    }
    /// Deletes `key` only if it still holds exactly `current`, linearizable.
    fn delete_entry(&self, key: &[u8], current: &Entry) -> Result<Cas, String> {
        match current.version.get::<Vec<u8>>() {
            Some(v) => self.delete_if(key, v),
            None => Err(NO_EXPIRY.into()),
        }
    }
    /// One step of the background sweep: deletes expired keys of one part of the store;
    /// how many, how many keys there have a deadline, and the next cursor (0: a round is
    /// done; start with 0).
    fn reclaim_expired(&self, cursor: u64) -> Result<Swept, String> {
        let _ = cursor;
        Ok(Swept::default())
    }
    /// The clock deadlines are compared with: Unix milliseconds.
    fn now_ms(&self) -> u64 {
        unix_ms()
    }
    /// The longest value a write accepts (the gateway refuses longer ones, writing nothing).
    fn max_value(&self) -> usize {
        usize::MAX
    }
    /// [`KvBackend::get_entry`] as a future (see [`KvBackend::get_async`]).
    fn get_entry_async(&self, key: Vec<u8>) -> Option<BoxFuture<Result<Option<Entry>, String>>> {
        let _ = key;
        None
    }
    /// [`KvBackend::put_entry`] as a future (see [`KvBackend::get_async`]).
    fn put_entry_async(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        expires_at: Option<u64>,
        mode: PutMode,
    ) -> Option<BoxFuture<Result<bool, String>>> {
        let _ = (key, value, expires_at, mode);
        None
    }
    /// [`KvBackend::replace_entry`] as a future (see [`KvBackend::get_async`]).
    fn replace_entry_async(
        &self,
        key: Vec<u8>,
        current: Entry,
        value: Vec<u8>,
        expires_at: Option<u64>,
    ) -> Option<BoxFuture<Result<Cas, String>>> {
        let _ = (key, current, value, expires_at);
        None
    }
    /// [`KvBackend::delete_entry`] as a future (see [`KvBackend::get_async`]).
    fn delete_entry_async(
        &self,
        key: Vec<u8>,
        current: Entry,
    ) -> Option<BoxFuture<Result<Cas, String>>> {
        let _ = (key, current);
        None
    }
    /// [`KvBackend::reclaim_expired`] as a future (see [`KvBackend::get_async`]).
    fn reclaim_expired_async(&self, cursor: u64) -> Option<BoxFuture<Result<Swept, String>>> {
        let _ = cursor;
        None
    }
    /// Lines for INFO's "# Keyspace"-like backend section (`name:value`).
    fn info(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Whether calls wait on the network (they then run on the gateway's blocking pool,
    /// many at once); a backend that answers from memory says false and runs inline.
    fn blocks(&self) -> bool {
        true
    }
    /// GET as a future, for a backend with async operations: the gateway polls it on the
    /// connection's task (no thread waits for it). `None`: the gateway calls
    /// [`KvBackend::get`] (on its blocking pool if [`KvBackend::blocks`]).
    fn get_async(&self, key: Vec<u8>) -> Option<BoxFuture<Result<Option<Vec<u8>>, String>>> {
        let _ = key;
        None
    }
    /// [`KvBackend::put`] as a future (see [`KvBackend::get_async`]).
    fn put_async(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        mode: PutMode,
    ) -> Option<BoxFuture<Result<bool, String>>> {
        let _ = (key, value, mode);
        None
    }
    /// [`KvBackend::delete`] as a future (see [`KvBackend::get_async`]).
    fn delete_async(&self, key: Vec<u8>) -> Option<BoxFuture<Result<bool, String>>> {
        let _ = key;
        None
    }
    /// The length of `key`'s value and the bytes `range` picks of it (`None`: absent) —
    /// STRLEN, GETRANGE, EXISTS, TYPE. A backend that stores large values in parts reads
    /// only the parts the range spans (FUSEE: a large value's manifest, and the chunks in
    /// the range); the default reads the whole value.
    fn get_range(&self, key: &[u8], range: ByteRange) -> Result<Option<ValueSlice>, String> {
        Ok(self.get(key)?.map(|v| {
            let r = range.of(v.len() as u64);
            (v.len() as u64, v[r.start as usize..r.end as usize].to_vec())
        }))
    }
    /// [`KvBackend::get_range`] as a future (see [`KvBackend::get_async`]).
    fn get_range_async(
        &self,
        key: Vec<u8>,
        range: ByteRange,
    ) -> Option<BoxFuture<Result<Option<ValueSlice>, String>>> {
        let _ = (key, range);
        None
    }
}

/// A value's whole length and the bytes a [`ByteRange`] picked of it.
pub type ValueSlice = (u64, Vec<u8>);

/// Which bytes of a value [`KvBackend::get_range`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// None: the length alone.
    Empty,
    /// GETRANGE's: `start` to `end` inclusive, negative from the end, clamped.
    Inclusive { start: i64, end: i64 },
}

impl ByteRange {
    /// The bytes picked of a value of `len` bytes.
    pub fn of(self, len: u64) -> std::ops::Range<u64> {
        let ByteRange::Inclusive { start, end } = self else {
            return 0..0;
        };
        let len = len.min(i64::MAX as u64) as i64;
        let norm = |i: i64| if i < 0 { (len + i).max(0) } else { i };
        let (a, b) = (norm(start), norm(end).min(len - 1));
        if len == 0 || a > b {
            return 0..0;
        }
        a as u64..b as u64 + 1
    }
}

/// The system clock: Unix milliseconds.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a conditional write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cas {
    /// Written (or deleted) over the expected value.
    Swapped,
    /// The key held another value, or none: nothing was written.
    Changed,
}

/// One step of a scan: some keys, and the cursor of the next step (0: the scan is done).
pub type ScanStep = (Vec<Vec<u8>>, u64);

/// A backend call running as a task.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// Settings of the gateway.
#[derive(Debug, Clone)]
pub struct RespConfig {
    pub limits: Limits,
    /// Connections beyond this are refused with Redis's "max number of clients" error.
    pub max_clients: usize,
    /// Threads that run connections' protocol work: 0 (the default) shares the process's
    /// I/O runtime with its memory-node connections (`dmkit_verbs::runtime`, sized by
    /// `DMKIT_IO_THREADS`), so a completion wakes the command that awaits it on the thread
    /// that read it; more gives the gateway a runtime of its own with that many workers.
    pub io_threads: usize,
    /// Backend calls running at once, at most (the blocking pool's threads).
    pub backend_threads: usize,
    /// The password of the default user (Redis's `requirepass`; `dmkit resp` sets it from
    /// `--password-file`, or to the cluster secret with `--auth-cluster-secret`): when set, a
    /// connection must `AUTH` (or `HELLO … AUTH default PASSWORD`) before any other command.
    /// It is compared in constant time and never shown (INFO, CONFIG GET, logs).
    pub password: Option<Vec<u8>>,
    /// Active expiry: every this often, one step of the backend's sweep
    /// ([`KvBackend::reclaim_expired`]: FUSEE deletes the expired keys of one index subtable)
    /// runs in the background, so that expired keys nobody reads again free their space.
    /// `None`: only reads reclaim them.
    pub expiry_sweep: Option<std::time::Duration>,
}

impl Default for RespConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            max_clients: 10_000,
            io_threads: 0,
            backend_threads: 64,
            password: None,
            expiry_sweep: Some(std::time::Duration::from_millis(100)),
        }
    }
}

struct Shared {
    backend: Arc<dyn KvBackend>,
    cfg: RespConfig,
    clients: AtomicUsize,
    commands: AtomicU64,
    /// Keys the background sweep found expired and deleted.
    expired: AtomicU64,
    started: Instant,
    stop: AtomicBool,
    /// Commands on keys, to the dispatcher (see [`dispatch`]).
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    /// Blocking backend calls running at once, at most `backend_threads`.
    blocking: tokio::sync::Semaphore,
    /// Open connections' tasks, to end them when the gateway is dropped.
    conns: parking_lot::Mutex<std::collections::HashMap<u64, tokio::task::AbortHandle>>,
    next_conn: AtomicU64,
    /// Open connections as CLIENT LIST shows them.
    clients_info: parking_lot::Mutex<std::collections::BTreeMap<u64, ClientInfo>>,
    /// Each command's metric handles (by its place in the command table; the last: commands
    /// not served), registered at its first use: the metric macros with a label look the
    /// series up in the recorder's registry every time (a label vector and a hash).
    counters: Vec<std::sync::OnceLock<metrics::Counter>>,
    latencies: Vec<std::sync::OnceLock<metrics::Histogram>>,
}

/// A connection as CLIENT LIST shows it.
#[derive(Debug, Clone)]
struct ClientInfo {
    peer: String,
    name: String,
    since: Instant,
    last_command: Cow<'static, str>,
}

impl Shared {
    /// A gateway state over `backend` that serves no connection: a transaction's commands
    /// run on it against a copy of their key (see [`exec_block`]).
    fn scratch(backend: Arc<dyn KvBackend>, cfg: &RespConfig) -> Arc<Shared> {
        let (jobs, _) = tokio::sync::mpsc::unbounded_channel();
        Arc::new(Shared::new(backend, cfg.clone(), jobs))
    }

    fn new(
        backend: Arc<dyn KvBackend>,
        cfg: RespConfig,
        jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    ) -> Shared {
        Shared {
            backend,
            blocking: tokio::sync::Semaphore::new(cfg.backend_threads.max(1)),
            cfg,
            clients: AtomicUsize::new(0),
            commands: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            started: Instant::now(),
            stop: AtomicBool::new(false),
            jobs,
            conns: parking_lot::Mutex::new(std::collections::HashMap::new()),
            next_conn: AtomicU64::new(0),
            clients_info: parking_lot::Mutex::new(std::collections::BTreeMap::new()),
            counters: (0..=commands::COMMANDS.len())
                .map(|_| Default::default())
                .collect(),
            latencies: (0..=commands::COMMANDS.len())
                .map(|_| Default::default())
                .collect(),
        }
    }

    /// `dmkit_resp_commands_total` of the command in `slot` (from [`metric_slot`]; `None`, a
    /// command not served, counts as `other`).
    fn counter_of(&self, slot: Option<(usize, &'static str)>) -> &metrics::Counter {
        let (i, label) = slot.unwrap_or((commands::COMMANDS.len(), "other"));
        self.counters[i]
            .get_or_init(|| metrics::counter!("dmkit_resp_commands_total", "command" => label))
    }

    /// `dmkit_resp_command_seconds` of the command named `name`, if it is served.
    fn latency_of(&self, name: &[u8]) -> Option<&metrics::Histogram> {
        let (i, label) = metric_slot(name)?;
        Some(
            self.latencies[i].get_or_init(
                || metrics::histogram!("dmkit_resp_command_seconds", "command" => label),
            ),
        )
    }
}

/// The place of served command `name`'s metric handles in the command table, and its label.
fn metric_slot(name: &[u8]) -> Option<(usize, &'static str)> {
    commands::lookup_indexed(name)
        .filter(|(_, c)| !c.name.contains('|'))
        .map(|(i, c)| (i, c.name))
}

/// A command's lower-case name: the command table's own (no allocation) when it is served.
fn command_name(arg: &[u8]) -> Cow<'static, str> {
    name_of(arg, metric_slot(arg))
}

/// The lower-case name of command `arg` whose [`metric_slot`] is `slot`.
fn name_of(arg: &[u8], slot: Option<(usize, &'static str)>) -> Cow<'static, str> {
    match slot {
        Some((_, name)) => Cow::Borrowed(name),
        None => Cow::Owned(String::from_utf8_lossy(arg).to_ascii_lowercase()),
    }
}

/// A command on keys that takes this long (from its submission to its reply) is logged at
/// WARN: a client waits that long for an answer.
const SLOW_COMMAND: std::time::Duration = std::time::Duration::from_millis(500);

/// A command on keys for the dispatcher, and where its reply goes.
struct Job {
    run: BoxFuture<Reply>,
    reply: tokio::sync::oneshot::Sender<Reply>,
}

/// Runs every connection's commands on keys as futures of one task, polled together under
/// doorbell batching: the verbs of concurrent commands — from any connection — share frames
/// to each memory node. A wake-up polls only the commands it concerns.
async fn dispatch(mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>) {
    use futures_util::Stream;
    let mut running = futures_util::stream::FuturesUnordered::new();
    let mut yielded = false;
    dmkit_verbs::batched(std::future::poll_fn(move |cx| {
        // Woken (a command came, a completion arrived): first let the other tasks that are
        // ready now run — connections reading their next commands, receive tasks delivering
        // completions. A task that wakes itself goes to the back of its worker's queue
        // (tokio's yield), so their commands and completions join this poll, and the verbs
        // of all of them leave in one frame per memory node instead of one each.
        if !yielded {
            yielded = true;
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        yielded = false;
        loop {
            let mut closed = false;
            while let std::task::Poll::Ready(j) = jobs.poll_recv(cx) {
                match j {
                    Some(Job { run, reply }) => running.push(async move {
                        // (A connection that went away drops its receiver: nothing to do.)
                        let _ = reply.send(run.await);
                    }),
                    None => {
                        closed = true;
                        break;
                    }
                }
            }
            let mut finished = false;
            while let std::task::Poll::Ready(Some(())) =
                std::pin::Pin::new(&mut running).poll_next(cx)
            {
                finished = true;
            }
            if closed && running.is_empty() {
                return std::task::Poll::Ready(());
            }
            // Commands that finished may have let new ones in; look once more if so.
            if !finished || closed {
                return std::task::Poll::Pending;
            }
        }
    }))
    .await
}

/// A running gateway; stops accepting when dropped (open connections finish their command).
///
/// Connections are tasks on a small tokio runtime (an idle connection costs memory, not a
/// thread). The commands of one connection's pipeline run concurrently where Redis semantics
/// allow (commands on disjoint keys); replies keep the connection's order. A backend whose
/// calls block ([`KvBackend::blocks`]) runs them on the runtime's bounded blocking pool.
pub struct RespServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Its own runtime, when `io_threads` asked for one.
    rt: Option<tokio::runtime::Runtime>,
    /// The accept loop and the dispatcher.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for RespServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RespServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl RespServer {
    /// Binds `addr` and serves on a background runtime.
    pub fn start(
        addr: &str,
        backend: Arc<dyn KvBackend>,
        cfg: RespConfig,
    ) -> std::io::Result<RespServer> {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let local = l.local_addr()?;
        let rt = if cfg.io_threads == 0 {
            None
        } else {
            Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(cfg.io_threads)
                    .max_blocking_threads(cfg.backend_threads.max(1))
                    .thread_name("resp")
                    .enable_all()
                    .build()?,
            )
        };
        let handle = rt
            .as_ref()
            .map_or_else(dmkit_verbs::runtime::io_handle, |rt| rt.handle().clone());
        let (jobs, rx) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared::new(backend, cfg, jobs));
        metrics::gauge!("dmkit_resp_connected_clients").set(0.0);
        let dispatcher = handle.spawn(dispatch(rx));
        let listener = {
            let _entered = handle.enter();
            tokio::net::TcpListener::from_std(l)?
        };
        let accept = handle.spawn(accept_loop(shared.clone(), listener));
        let mut tasks = vec![accept, dispatcher];
        if let Some(every) = shared.cfg.expiry_sweep {
            tasks.push(handle.spawn(sweep(shared.clone(), every)));
        }
        Ok(RespServer {
            addr: local,
            shared,
            rt,
            tasks,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open now.
    pub fn clients(&self) -> usize {
        self.shared.clients.load(Ordering::SeqCst)
    }
}

impl Drop for RespServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in &self.tasks {
            t.abort();
        }
        for (_, c) in self.shared.conns.lock().drain() {
            c.abort();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Active expiry: one step of the backend's sweep every `every`, round after round (a step
/// that fails is tried again at the next tick from where it was). A step reads a part of the
/// store (FUSEE: one index subtable with its objects), so its cost grows with the values
/// there: the pause after a step is at least nine times what the step took, so that the
/// sweep keeps to about a tenth of the time whatever the data — a hundredth while no key
/// with a deadline turns up ([`SweepPacer`]).
async fn sweep(s: Arc<Shared>, every: std::time::Duration) {
    let mut pacer = SweepPacer::new(every);
    loop {
        tokio::time::sleep(pacer.pause()).await;
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let started = Instant::now();
        let step = reclaim_expired(&s, pacer.cursor()).await;
        match &step {
            Ok(swept) => {
                s.expired.fetch_add(swept.deleted as u64, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!(error = %e, "expiry sweep step failed; again later"),
        }
        pacer.stepped(step.ok(), started.elapsed());
    }
}

async fn accept_loop(s: Arc<Shared>, l: tokio::net::TcpListener) {
    loop {
        match l.accept().await {
            Ok((conn, _)) => {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                let id = s.next_conn.fetch_add(1, Ordering::Relaxed);
                let s2 = s.clone();
                // The map is updated under its lock before the task can remove its entry.
                let mut conns = s.conns.lock();
                let task = tokio::spawn(async move {
                    serve(s2.clone(), conn, id).await;
                    s2.conns.lock().remove(&id);
                    s2.clients_info.lock().remove(&id);
                });
                conns.insert(id, task.abort_handle());
            }
            Err(e) => {
                // Out of descriptors and the like: back off, keep serving the others.
                tracing::warn!(error = %e, "RESP gateway cannot accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
}

/// A command of a pipeline, in reply order.
enum Running {
    Done(Reply),
    /// Runs when the connection's task polls it (with the others in flight).
    Task(BoxFuture<Reply>),
}

/// Commands of one connection in flight at once, at most.
const MAX_PIPELINE_IN_FLIGHT: usize = 64;

/// The keys a command reads or writes (`None`: it touches no key and runs inline), by its
/// key positions in the command table (a container's by its subcommand's: OBJECT ENCODING).
fn command_keys<'a>(name: &str, argv: &'a [Vec<u8>]) -> Option<Vec<&'a [u8]>> {
    if CONN_COMMANDS.contains(&name) {
        return None;
    }
    let c = served(name)?;
    let (mut first, mut last, mut step) = c.keys;
    if first == 0 {
        let sub = argv.first()?;
        (first, last, step) = commands::lookup(&[c.name.as_bytes(), b"|", sub].concat())?.keys;
        if first == 0 {
            return None;
        }
    }
    let argc = argv.len() as i64 + 1;
    let last = if last < 0 {
        argc + last
    } else {
        last.min(argc - 1)
    };
    Some(
        (first..=last)
            .step_by(step.max(1) as usize)
            .filter_map(|i| argv.get(i as usize - 1).map(Vec::as_slice))
            .collect(),
    )
}

/// A backend call: awaited in place when the backend is async, on the blocking pool when it
/// blocks, else run inline.
async fn call<T: Send + 'static>(
    s: &Arc<Shared>,
    fut: Option<BoxFuture<Result<T, String>>>,
    blocking: impl FnOnce(&dyn KvBackend) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    if let Some(f) = fut {
        return f.await;
    }
    if !s.backend.blocks() {
        return blocking(s.backend.as_ref());
    }
    let Ok(_permit) = s.blocking.acquire().await else {
        return Err("the gateway is shutting down".into());
    };
    let s = s.clone();
    tokio::task::spawn_blocking(move || blocking(s.backend.as_ref()))
        .await
        .unwrap_or_else(|e| Err(format!("internal error while running the command: {e}")))
}

/// A copy of `bytes` for the blocking call, when the backend gave no future `fut` (empty
/// otherwise): an async backend takes the key and value it was given, so a SET's value is
/// copied once, not twice.
fn for_blocking<T>(fut: &Option<T>, bytes: &[u8]) -> Vec<u8> {
    if fut.is_none() {
        bytes.to_vec()
    } else {
        Vec::new()
    }
}

async fn get(s: &Arc<Shared>, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let fut = s.backend.get_async(key.to_vec());
    let k = for_blocking(&fut, key);
    call(s, fut, move |b| b.get(&k)).await
}

/// The length of `key`'s value and the bytes `range` picks of it ([`KvBackend::get_range`]).
async fn get_range(
    s: &Arc<Shared>,
    key: &[u8],
    range: ByteRange,
) -> Result<Option<ValueSlice>, String> {
    let fut = s.backend.get_range_async(key.to_vec(), range);
    let k = for_blocking(&fut, key);
    call(s, fut, move |b| b.get_range(&k, range)).await
}

async fn put(s: &Arc<Shared>, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool, String> {
    let fut = s.backend.put_async(key.to_vec(), value.to_vec(), mode);
    let (k, v) = (for_blocking(&fut, key), for_blocking(&fut, value));
    call(s, fut, move |b| b.put(&k, &v, mode)).await
}

async fn delete(s: &Arc<Shared>, key: &[u8]) -> Result<bool, String> {
    let fut = s.backend.delete_async(key.to_vec());
    let k = for_blocking(&fut, key);
    call(s, fut, move |b| b.delete(&k)).await
}

async fn scan_step(s: &Arc<Shared>, cursor: u64) -> Result<ScanStep, String> {
    call(s, s.backend.scan_async(cursor), move |b| b.scan(cursor)).await
}

/// Every key, once each (a whole scan, deduplicated).
async fn all_keys(s: &Arc<Shared>) -> Result<Vec<Vec<u8>>, String> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut cursor = 0;
    loop {
        let (keys, next) = scan_step(s, cursor).await?;
        for k in keys {
            if seen.insert(k.clone()) {
                out.push(k);
            }
        }
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

async fn get_entry(s: &Arc<Shared>, key: &[u8]) -> Result<Option<Entry>, String> {
    let k = key.to_vec();
    call(s, s.backend.get_entry_async(k.clone()), move |b| {
        b.get_entry(&k)
    })
    .await
}

async fn put_entry(
    s: &Arc<Shared>,
    key: &[u8],
    value: &[u8],
    expires_at: Option<u64>,
    mode: PutMode,
) -> Result<bool, String> {
    let fut = s
        .backend
        .put_entry_async(key.to_vec(), value.to_vec(), expires_at, mode);
    let (k, v) = (for_blocking(&fut, key), for_blocking(&fut, value));
    call(s, fut, move |b| b.put_entry(&k, &v, expires_at, mode)).await
}

async fn replace_entry(
    s: &Arc<Shared>,
    key: &[u8],
    current: &Entry,
    value: &[u8],
    expires_at: Option<u64>,
) -> Result<Cas, String> {
    let (k, c, v) = (key.to_vec(), current.clone(), value.to_vec());
    let fut = s
        .backend
        .replace_entry_async(k.clone(), c.clone(), v.clone(), expires_at);
    call(s, fut, move |b| b.replace_entry(&k, &c, &v, expires_at)).await
}

async fn delete_entry(s: &Arc<Shared>, key: &[u8], current: &Entry) -> Result<Cas, String> {
    let (k, c) = (key.to_vec(), current.clone());
    let fut = s.backend.delete_entry_async(k.clone(), c.clone());
    call(s, fut, move |b| b.delete_entry(&k, &c)).await
}

async fn reclaim_expired(s: &Arc<Shared>, cursor: u64) -> Result<Swept, String> {
    let fut = s.backend.reclaim_expired_async(cursor);
    call(s, fut, move |b| b.reclaim_expired(cursor)).await
}

/// What a read-modify-write writes.
#[derive(Debug, Clone, PartialEq)]
enum Write {
    /// This value, with this deadline.
    Set(Vec<u8>, Option<u64>),
    Delete,
}

/// Read-modify-write of one key, linearizable: reads the entry, asks `f` what to write
/// (`None`: leave the key as it is; an error reply: stop), and writes it only over exactly
/// the entry read (compare-and-set of its version, an insert over "absent"); again if
/// another writer came between. Returns the entry read and what was written.
async fn rmw(
    s: &Arc<Shared>,
    key: &[u8],
    f: impl Fn(Option<&Entry>) -> Result<Option<Write>, Reply>,
) -> Result<(Option<Entry>, Option<Write>), Reply> {
    loop {
        let cur = get_entry(s, key).await.map_err(backend_err)?;
        let Some(w) = f(cur.as_ref())? else {
            return Ok((cur, None));
        };
        if let Write::Set(v, _) = &w {
            if v.len() > s.backend.max_value() {
                return Err(too_large());
            }
        }
        let written = match (&cur, &w) {
            (None, Write::Set(v, d)) => put_entry(s, key, v, *d, PutMode::IfAbsent).await,
            (Some(c), Write::Set(v, d)) => replace_entry(s, key, c, v, *d)
                .await
                .map(|r| r == Cas::Swapped),
            (Some(c), Write::Delete) => delete_entry(s, key, c).await.map(|r| r == Cas::Swapped),
            (None, Write::Delete) => Ok(true),
        }
        .map_err(backend_err)?;
        if written {
            return Ok((cur, Some(w)));
        }
    }
}

/// Redis's error for a value longer than the store takes (nothing is written).
fn too_large() -> Reply {
    Reply::err("string exceeds maximum allowed size (proto-max-bulk-len)")
}

fn parse_i64(v: &[u8]) -> Option<i64> {
    let t = std::str::from_utf8(v).ok()?;
    // Redis's rule: no spaces, no leading '+', no leading zeros.
    if t.is_empty() || t.starts_with('+') || t.trim() != t || (t.len() > 1 && t.starts_with('0')) {
        return None;
    }
    t.parse().ok()
}

fn parse_f64(v: &[u8]) -> Option<f64> {
    let t = std::str::from_utf8(v).ok()?;
    if t.is_empty() || t.trim() != t {
        return None;
    }
    t.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// INCRBYFLOAT's result as text: 15 significant digits (what a 64-bit float holds for any
/// decimal), without an exponent, so that everyday decimals come out as Redis prints them
/// (0.2 + 0.1 is 0.3; Redis computes in 80-bit long double and prints 17 decimals).
fn float_text(v: f64) -> String {
    let rounded: f64 = format!("{v:.14e}").parse().unwrap_or(v);
    format!("{rounded}")
}

fn not_integer() -> Reply {
    Reply::err("value is not an integer or out of range")
}

/// INCR, DECR, INCRBY, DECRBY and INCRBYFLOAT, read-modify-write on one key.
async fn incr(s: &Arc<Shared>, name: &str, argv: &[Vec<u8>]) -> Reply {
    let (key, by) = match (name, argv) {
        ("incr" | "decr", [k]) => (k, None),
        ("incrby" | "decrby" | "incrbyfloat", [k, b]) => (k, Some(b)),
        _ => return arity(name),
    };
    if name == "incrbyfloat" {
        let Some(by) = by.and_then(|b| parse_f64(b)) else {
            return Reply::err("value is not a valid float");
        };
        let r = rmw(s, key, |cur| {
            let n = match cur {
                None => 0.0,
                Some(c) => {
                    parse_f64(&c.value).ok_or_else(|| Reply::err("value is not a valid float"))?
                }
            };
            let v = n + by;
            if !v.is_finite() {
                return Err(Reply::err("increment would produce NaN or Infinity"));
            }
            // The key keeps its deadline, as in Redis.
            Ok(Some(Write::Set(
                float_text(v).into_bytes(),
                cur.and_then(|c| c.expires_at),
            )))
        })
        .await;
        return match r {
            Ok((_, Some(Write::Set(v, _)))) => Reply::Bulk(v),
            Ok(_) => Reply::Nil,
            Err(e) => e,
        };
    }
    let delta = match by {
        None => 1,
        Some(b) => match parse_i64(b) {
            Some(d) => d,
            None => return not_integer(),
        },
    };
    let delta = if name.starts_with("decr") {
        match delta.checked_neg() {
            Some(d) => d,
            None => return Reply::err("decrement would overflow"),
        }
    } else {
        delta
    };
    let r = rmw(s, key, |cur| {
        let n = match cur {
            None => 0,
            Some(c) => parse_i64(&c.value).ok_or_else(not_integer)?,
        };
        let v = n
            .checked_add(delta)
            .ok_or_else(|| Reply::err("increment or decrement would overflow"))?;
        Ok(Some(Write::Set(
            v.to_string().into_bytes(),
            cur.and_then(|c| c.expires_at),
        )))
    })
    .await;
    match r {
        Ok((_, Some(Write::Set(v, _)))) => Reply::Integer(parse_i64(&v).unwrap_or_default()),
        Ok(_) => Reply::Nil,
        Err(e) => e,
    }
}

/// The largest offset + length SETRANGE accepts (Redis's 512 MB string limit).
const MAX_STRING: usize = 512 << 20;

/// Hands a command on keys to the dispatcher; the future of its reply.
fn submit(s: &Arc<Shared>, args: Vec<Vec<u8>>) -> BoxFuture<Reply> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let s2 = s.clone();
    let started = Instant::now();
    let job = Job {
        run: Box::pin(async move {
            let reply = execute_keyed(&s2, &args).await;
            let took = started.elapsed();
            let name = args.first().map_or(&[][..], |a| a.as_slice());
            // (Only the commands on keys come here: a small, known set of labels.)
            if let Some(h) = s2.latency_of(name) {
                h.record(took.as_secs_f64());
            }
            if took >= SLOW_COMMAND {
                tracing::warn!(
                    command = %String::from_utf8_lossy(name),
                    ms = took.as_millis() as u64,
                    error = matches!(reply, Reply::Error(_)),
                    "slow command"
                );
            }
            reply
        }),
        reply: tx,
    };
    if s.jobs.send(job).is_err() {
        return Box::pin(std::future::ready(Reply::err(
            "the gateway is shutting down",
        )));
    }
    Box::pin(async move {
        rx.await
            .unwrap_or_else(|_| Reply::err("the gateway is shutting down"))
    })
}

/// Replies of everything in flight, in order, into `out` (RESP3 if `resp3`): the commands
/// run concurrently.
async fn finish(running: &mut Vec<Running>, out: &mut Vec<u8>, resp3: bool) {
    let tasks: Vec<BoxFuture<Reply>> = running
        .drain(..)
        .map(|r| match r {
            Running::Done(reply) => Box::pin(std::future::ready(reply)) as BoxFuture<Reply>,
            Running::Task(t) => t,
        })
        .collect();
    for r in dmkit_verbs::join_all(tasks).await {
        r.encode_as(out, resp3);
    }
}

/// A connection's own state: its protocol, name and open transaction.
struct ConnState {
    id: u64,
    resp3: bool,
    /// Commands queued since MULTI; `None` outside a transaction.
    multi: Option<Vec<Vec<Vec<u8>>>>,
    /// A command queued in this transaction was refused: EXEC discards it.
    multi_failed: bool,
    /// The key WATCH named and the entry it read then (`None`: absent).
    watched: Option<(Vec<u8>, Option<Entry>)>,
    /// Authenticated (always, without a password).
    authed: bool,
}

/// Commands that read or change the connection's state (or its transaction): they run in
/// order with the pipeline, after the commands before them finished.
const CONN_COMMANDS: [&str; 16] = [
    "hello",
    "auth",
    "client",
    "multi",
    "exec",
    "discard",
    "watch",
    "unwatch",
    "reset",
    "quit",
    "scan",
    "keys",
    "dbsize",
    "randomkey",
    "flushdb",
    "flushall",
];

/// Commands over every key (they run after the commands before them, as [`CONN_COMMANDS`]).
const ALL_KEYS_COMMANDS: [&str; 6] = ["scan", "keys", "dbsize", "randomkey", "flushdb", "flushall"];

/// Commands of [`CONN_COMMANDS`] that MULTI queues (Redis queues them) rather than runs: the
/// ones over every key and those on the connection's state are refused there (see
/// [`queue`]); UNWATCH is queued and does nothing at EXEC (EXEC forgets the WATCH anyway).
const QUEUED_CONN_COMMANDS: [&str; 10] = [
    "scan",
    "keys",
    "dbsize",
    "randomkey",
    "flushdb",
    "flushall",
    "hello",
    "auth",
    "client",
    "unwatch",
];

async fn serve(s: Arc<Shared>, mut conn: tokio::net::TcpStream, id: u64) {
    use std::hash::BuildHasher;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let n = s.clients.fetch_add(1, Ordering::SeqCst) + 1;
    metrics::gauge!("dmkit_resp_connected_clients").set(n as f64);
    let _guard = Guard(&s.clients);
    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    s.clients_info.lock().insert(
        id,
        ClientInfo {
            peer: peer.clone(),
            name: String::new(),
            since: Instant::now(),
            last_command: Cow::Borrowed(""),
        },
    );
    let mut st = ConnState {
        id,
        resp3: false,
        multi: None,
        multi_failed: false,
        watched: None,
        authed: s.cfg.password.is_none(),
    };
    if n > s.cfg.max_clients {
        let mut out = Vec::new();
        Reply::err("max number of clients reached").encode(&mut out);
        let _ = conn.write_all(&out).await;
        return;
    }
    let _ = conn.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4 << 10);
    let mut out: Vec<u8> = Vec::with_capacity(4 << 10);
    let mut chunk = vec![0u8; 16 << 10];
    let mut running: Vec<Running> = Vec::new();
    // Keys of the commands in flight, by hash: a collision only makes a command wait for
    // the ones before it, as if they shared its key.
    let mut busy: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let key_hash = std::collections::hash_map::RandomState::new();
    loop {
        // Start every complete command buffered; commands on keys already in flight wait
        // for those to finish (a connection sees its own writes, in order). Then send all
        // replies at once (pipelining).
        let mut used = 0;
        let mut quit = false;
        loop {
            match parse_command(&buf[used..], &s.cfg.limits) {
                Ok(Some((args, n))) => {
                    used += n;
                    if args.is_empty() {
                        continue;
                    }
                    let name = command_name(&args[0]);
                    if let Some(c) = s.clients_info.lock().get_mut(&id) {
                        if c.last_command != name {
                            c.last_command = name.clone();
                        }
                    }
                    if !st.authed && !matches!(name.as_ref(), "auth" | "hello" | "quit") {
                        running.push(Running::Done(counted_error(Reply::Error(
                            "NOAUTH Authentication required.".into(),
                        ))));
                        continue;
                    }
                    if let Some(e) = arity_error(&name, &args) {
                        // As Redis: refused before it runs (or is queued: EXEC then
                        // discards the transaction).
                        count(&s, &args);
                        if st.multi.is_some() {
                            st.multi_failed = true;
                        }
                        running.push(Running::Done(counted_error(e)));
                        continue;
                    }
                    if st.multi.is_some()
                        && (!CONN_COMMANDS.contains(&name.as_ref())
                            || QUEUED_CONN_COMMANDS.contains(&name.as_ref()))
                    {
                        running.push(Running::Done(queue(&s, &mut st, args)));
                        continue;
                    }
                    if CONN_COMMANDS.contains(&name.as_ref()) {
                        // In order: after what came before, before what comes after.
                        dmkit_verbs::batched(finish(&mut running, &mut out, st.resp3)).await;
                        busy.clear();
                        let (reply, q) = execute_conn(&s, &mut st, &args).await;
                        reply.encode_as(&mut out, st.resp3);
                        if q {
                            quit = true;
                            break;
                        }
                        continue;
                    }
                    let keys = command_keys(&name, &args[1..]);
                    let Some(keys) = keys else {
                        let (reply, q) = execute_local(&s, &args);
                        running.push(Running::Done(reply));
                        if q {
                            quit = true;
                            break;
                        }
                        continue;
                    };
                    if running.len() >= MAX_PIPELINE_IN_FLIGHT
                        || keys.iter().any(|k| busy.contains(&key_hash.hash_one(k)))
                    {
                        dmkit_verbs::batched(finish(&mut running, &mut out, st.resp3)).await;
                        busy.clear();
                    }
                    busy.extend(keys.iter().map(|k| key_hash.hash_one(k)));
                    running.push(Running::Task(submit(&s, args)));
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "closing RESP connection");
                    dmkit_verbs::batched(finish(&mut running, &mut out, st.resp3)).await;
                    Reply::err(e).encode_as(&mut out, st.resp3);
                    let _ = conn.write_all(&out).await;
                    return;
                }
            }
        }
        buf.drain(..used);
        dmkit_verbs::batched(finish(&mut running, &mut out, st.resp3)).await;
        busy.clear();
        if !out.is_empty() {
            if conn.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if quit {
            return;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

struct Guard<'a>(&'a AtomicUsize);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let n = self.0.fetch_sub(1, Ordering::SeqCst) - 1;
        metrics::gauge!("dmkit_resp_connected_clients").set(n as f64);
    }
}

fn arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

fn backend_err(e: String) -> Reply {
    Reply::err(format!("backend: {e}"))
}

/// Counts a command (and its metric); its lower-case name.
fn count(s: &Shared, args: &[Vec<u8>]) -> Cow<'static, str> {
    s.commands.fetch_add(1, Ordering::Relaxed);
    let slot = metric_slot(&args[0]);
    s.counter_of(slot).increment(1);
    name_of(&args[0], slot)
}

fn counted_error(reply: Reply) -> Reply {
    if matches!(reply, Reply::Error(_)) {
        metrics::counter!("dmkit_resp_errors_total").increment(1);
    }
    reply
}

/// Runs a command that touches no key; the flag says the connection should close after the
/// reply (QUIT).
fn execute_local(s: &Shared, args: &[Vec<u8>]) -> (Reply, bool) {
    let name = count(s, args);
    let argv = &args[1..];
    let reply = match name.as_ref() {
        "ping" => match argv {
            [] => Reply::Simple("PONG".into()),
            [m] => Reply::Bulk(m.clone()),
            _ => arity("ping"),
        },
        "echo" => match argv {
            [m] => Reply::Bulk(m.clone()),
            _ => arity("echo"),
        },
        "time" if argv.is_empty() => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Reply::Array(vec![
                Reply::Bulk(now.as_secs().to_string().into_bytes()),
                Reply::Bulk(now.subsec_micros().to_string().into_bytes()),
            ])
        }
        "time" => arity("time"),
        "del" | "unlink" | "exists" | "mget" | "mset" => arity(&name),
        "info" => Reply::Bulk(info(s, argv).into_bytes()),
        "command" => commands::command(argv),
        "config" => config(s, argv),
        // (OBJECT ENCODING runs on its key; other subcommands come here.)
        "object" => Reply::err(format!(
            "unknown subcommand '{}'. Try OBJECT HELP.",
            String::from_utf8_lossy(argv.first().map_or(&[][..], Vec::as_slice))
        )),
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
    (counted_error(reply), false)
}

/// Runs a command on keys (see [`command_keys`]); a multi-key command's keys go out
/// concurrently.
async fn execute_keyed(s: &Arc<Shared>, args: &[Vec<u8>]) -> Reply {
    let name = count(s, args);
    let argv = &args[1..];
    let reply = match name.as_ref() {
        "get" => match argv {
            [k] => match get(s, k).await {
                Ok(Some(v)) => Reply::Bulk(v),
                Ok(None) => Reply::Nil,
                Err(e) => backend_err(e),
            },
            _ => arity("get"),
        },
        "set" => set(s, argv).await,
        "setex" | "psetex" => setex(s, &name, argv).await,
        "getex" => getex(s, argv).await,
        "expire" | "pexpire" | "expireat" | "pexpireat" => expire(s, &name, argv).await,
        "ttl" | "pttl" | "expiretime" | "pexpiretime" => match argv {
            [k] => ttl(s, &name, k).await,
            _ => arity(&name),
        },
        "persist" => match argv {
            [k] => persist(s, k).await,
            _ => arity("persist"),
        },
        "object" => object(s, argv).await,
        "copy" => copy(s, argv).await,
        "rename" | "renamenx" => rename(s, &name, argv).await,
        "setnx" if argv.get(1).is_some_and(|v| v.len() > s.backend.max_value()) => too_large(),
        "setnx" => match argv {
            [k, v] => match put(s, k, v, PutMode::IfAbsent).await {
                Ok(w) => Reply::Integer(i64::from(w)),
                Err(e) => backend_err(e),
            },
            _ => arity("setnx"),
        },
        "del" | "unlink" | "exists" | "mget" | "touch" if argv.is_empty() => arity(&name),
        "del" | "unlink" => {
            let futs = distinct(argv)
                .into_iter()
                .map(|k| {
                    let s = s.clone();
                    Box::pin(async move { delete(&s, &k).await }) as BoxFuture<_>
                })
                .collect();
            count_true(dmkit_verbs::join_all(futs).await)
        }
        "exists" | "touch" => {
            // Presence alone: a large value's chunks are not read.
            let futs = argv
                .iter()
                .map(|k| {
                    let (s, k) = (s.clone(), k.clone());
                    Box::pin(async move {
                        let r = get_range(&s, &k, ByteRange::Empty).await;
                        r.map(|v| v.is_some())
                    }) as BoxFuture<_>
                })
                .collect();
            count_true(dmkit_verbs::join_all(futs).await)
        }
        "mget" => {
            let futs = argv
                .iter()
                .map(|k| {
                    let (s, k) = (s.clone(), k.clone());
                    Box::pin(async move { get(&s, &k).await }) as BoxFuture<_>
                })
                .collect();
            let got: Vec<Result<Option<Vec<u8>>, String>> = dmkit_verbs::join_all(futs).await;
            let mut items = Vec::with_capacity(got.len());
            for r in got {
                match r {
                    Ok(Some(v)) => items.push(Reply::Bulk(v)),
                    Ok(None) => items.push(Reply::Nil),
                    Err(e) => return counted_error(backend_err(e)),
                }
            }
            Reply::Array(items)
        }
        "incr" | "decr" | "incrby" | "decrby" | "incrbyfloat" => incr(s, &name, argv).await,
        "append" => match argv {
            [k, v] => match rmw(s, k, |cur| {
                let (mut b, d) =
                    cur.map_or((Vec::new(), None), |c| (c.value.clone(), c.expires_at));
                if b.len().saturating_add(v.len()) > MAX_STRING {
                    return Err(too_large());
                }
                b.extend_from_slice(v);
                Ok(Some(Write::Set(b, d)))
            })
            .await
            {
                Ok((_, Some(Write::Set(b, _)))) => Reply::Integer(b.len() as i64),
                Ok(_) => Reply::Integer(0),
                Err(e) => e,
            },
            _ => arity("append"),
        },
        "getset" => match argv {
            // The new value has no deadline, as in Redis.
            [k, v] => match rmw(s, k, |_| Ok(Some(Write::Set(v.clone(), None)))).await {
                Ok((old, _)) => old.map_or(Reply::Nil, |e| Reply::Bulk(e.value)),
                Err(e) => e,
            },
            _ => arity("getset"),
        },
        "getdel" => match argv {
            [k] => match rmw(s, k, |cur| Ok(cur.map(|_| Write::Delete))).await {
                Ok((old, _)) => old.map_or(Reply::Nil, |e| Reply::Bulk(e.value)),
                Err(e) => e,
            },
            _ => arity("getdel"),
        },
        "type" => match argv {
            [k] => match get_range(s, k, ByteRange::Empty).await {
                Ok(Some(_)) => Reply::Simple("string".into()),
                Ok(None) => Reply::Simple("none".into()),
                Err(e) => backend_err(e),
            },
            _ => arity("type"),
        },
        "strlen" => match argv {
            [k] => match get_range(s, k, ByteRange::Empty).await {
                Ok(v) => Reply::Integer(v.map_or(0, |(len, _)| len as i64)),
                Err(e) => backend_err(e),
            },
            _ => arity("strlen"),
        },
        "getrange" | "substr" => match argv {
            [k, a, b] => match (parse_i64(a), parse_i64(b)) {
                (Some(start), Some(end)) => {
                    match get_range(s, k, ByteRange::Inclusive { start, end }).await {
                        Ok(v) => Reply::Bulk(v.map(|(_, b)| b).unwrap_or_default()),
                        Err(e) => backend_err(e),
                    }
                }
                _ => not_integer(),
            },
            _ => arity(&name),
        },
        "setrange" => match argv {
            [k, off, v] => match parse_i64(off).and_then(|o| usize::try_from(o).ok()) {
                None => Reply::err("offset is out of range"),
                Some(o) if o.saturating_add(v.len()) > MAX_STRING => {
                    Reply::err("string exceeds maximum allowed size (proto-max-bulk-len)")
                }
                Some(o) => match rmw(s, k, |cur| {
                    if v.is_empty() {
                        // Redis creates nothing and changes nothing for an empty range.
                        return Ok(None);
                    }
                    let (mut b, d) =
                        cur.map_or((Vec::new(), None), |c| (c.value.clone(), c.expires_at));
                    if b.len() < o + v.len() {
                        b.resize(o + v.len(), 0);
                    }
                    b[o..o + v.len()].copy_from_slice(v);
                    Ok(Some(Write::Set(b, d)))
                })
                .await
                {
                    Ok((_, Some(Write::Set(b, _)))) => Reply::Integer(b.len() as i64),
                    Ok((cur, _)) => Reply::Integer(cur.map_or(0, |c| c.value.len() as i64)),
                    Err(e) => e,
                },
            },
            _ => arity("setrange"),
        },
        "mset" | "msetnx"
            if argv
                .iter()
                .skip(1)
                .step_by(2)
                .any(|v| v.len() > s.backend.max_value()) =>
        {
            // Checked for every value before any is written.
            too_large()
        }
        "msetnx" if argv.is_empty() || argv.len() % 2 != 0 => arity("msetnx"),
        "msetnx" if argv.len() > 2 => Reply::err(
            "MSETNX over several keys cannot be one atomic step on this store (nothing was \
             set): use SETNX key by key",
        ),
        "msetnx" => match put(s, &argv[0], &argv[1], PutMode::IfAbsent).await {
            Ok(w) => Reply::Integer(i64::from(w)),
            Err(e) => backend_err(e),
        },
        "mset" if argv.is_empty() || argv.len() % 2 != 0 => arity("mset"),
        "mset" => {
            // The last value of a key given twice wins: each key is written once.
            let mut last: Vec<(&Vec<u8>, &Vec<u8>)> = Vec::new();
            for kv in argv.chunks(2) {
                match last.iter_mut().find(|(k, _)| *k == &kv[0]) {
                    Some(e) => e.1 = &kv[1],
                    None => last.push((&kv[0], &kv[1])),
                }
            }
            let futs = last
                .into_iter()
                .map(|(k, v)| {
                    let (s, k, v) = (s.clone(), k.clone(), v.clone());
                    Box::pin(async move { put(&s, &k, &v, PutMode::Upsert).await }) as BoxFuture<_>
                })
                .collect();
            all_ok(futs).await
        }
        _ => Reply::err(format!("'{name}' is not a command on keys")),
    };
    counted_error(reply)
}

/// The keys once each, in first-seen order (DEL k k counts k once, as Redis does).
fn distinct(keys: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(keys.len());
    for k in keys {
        if !out.contains(k) {
            out.push(k.clone());
        }
    }
    out
}

/// How many calls answered true; the first failure instead, if any.
fn count_true(r: Vec<Result<bool, String>>) -> Reply {
    let mut n = 0;
    for x in r {
        match x {
            Ok(true) => n += 1,
            Ok(false) => {}
            Err(e) => return backend_err(e),
        }
    }
    Reply::Integer(n)
}

/// The served command `name` (lower case; a top-level command, not `container|sub`).
fn served(name: &str) -> Option<&'static commands::Spec> {
    commands::lookup(name.as_bytes()).filter(|c| !c.name.contains('|'))
}

/// The arity error Redis gives before running a command (its table's arity, and a
/// container's subcommand's: `'client|id'`), if `args` do not fit; checked for every command
/// as it arrives (and so when MULTI queues it, so that EXEC never starts a block it would
/// stop half-way).
fn arity_error(name: &str, args: &[Vec<u8>]) -> Option<Reply> {
    let c = served(name)?;
    if !commands::arity_fits(c.arity, args.len()) {
        return Some(arity(c.name));
    }
    // (Only a container has subcommands: a GET's key is not looked up as one.)
    if let Some(sub) = args.get(1).filter(|_| commands::is_container(c.name)) {
        let full = [c.name.as_bytes(), b"|", sub].concat();
        if let Some(s) = commands::lookup(&full) {
            if !commands::arity_fits(s.arity, args.len()) {
                return Some(arity(s.name));
            }
        }
    }
    // Pairs: Redis's own check in MSET and MSETNX.
    if matches!(name, "mset" | "msetnx") && args.len() % 2 == 0 {
        return Some(arity(name));
    }
    None
}

/// Queues a command of an open transaction: `+QUEUED`, or its error (and EXEC will then
/// discard the transaction).
fn queue(s: &Shared, st: &mut ConnState, args: Vec<Vec<u8>>) -> Reply {
    let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
    let reply = if ALL_KEYS_COMMANDS.contains(&name.as_str()) {
        Reply::err(format!(
            "{} inside MULTI is not supported by this store (a transaction is atomic on one key)",
            name.to_ascii_uppercase()
        ))
    } else if matches!(name.as_str(), "hello" | "auth" | "client") {
        Reply::err(format!(
            "{} inside MULTI is not supported by this gateway (send it before MULTI or after \
             EXEC)",
            name.to_ascii_uppercase()
        ))
    } else if served(&name).is_none() {
        let (r, _) = execute_local(s, &args);
        r
    } else {
        st.multi.get_or_insert_with(Vec::new).push(args);
        return Reply::Simple("QUEUED".into());
    };
    st.multi_failed = true;
    counted_error(reply)
}

/// Runs a command on the connection's state (see [`CONN_COMMANDS`]); the flag says the
/// connection closes after the reply (QUIT).
async fn execute_conn(s: &Arc<Shared>, st: &mut ConnState, args: &[Vec<u8>]) -> (Reply, bool) {
    let name = count(s, args);
    let argv = &args[1..];
    let upper = |a: &[u8]| a.to_ascii_uppercase();
    let reply = match name.as_ref() {
        "quit" => return (Reply::ok(), true),
        "hello" => {
            let mut resp3 = st.resp3;
            let mut rest = argv;
            if let [v, more @ ..] = argv {
                match v.as_slice() {
                    b"2" => resp3 = false,
                    b"3" => resp3 = true,
                    _ => {
                        return (
                            counted_error(Reply::Error(
                                "NOPROTO sorry, this protocol version is not supported".into(),
                            )),
                            false,
                        );
                    }
                }
                rest = more;
            }
            let mut name_to_set = None;
            let mut bad = None;
            let mut authed = st.authed;
            while let [opt, tail @ ..] = rest {
                match (upper(opt).as_slice(), tail) {
                    (b"AUTH", [user, pass, more @ ..]) => {
                        match check_auth(&s.cfg, Some(user), pass) {
                            Ok(()) => authed = true,
                            Err(e) => bad = Some(e),
                        }
                        rest = more;
                    }
                    (b"SETNAME", [n, more @ ..]) => {
                        name_to_set = Some(n.clone());
                        rest = more;
                    }
                    _ => {
                        bad = Some(Reply::err(format!(
                            "Syntax error in HELLO option '{}'",
                            String::from_utf8_lossy(opt)
                        )));
                        break;
                    }
                }
            }
            if bad.is_none() && !authed {
                bad = Some(Reply::Error(
                    "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                     the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                     client and select the RESP protocol version at the same time"
                        .into(),
                ));
            }
            if let Some(e) = bad {
                return (counted_error(e), false);
            }
            st.authed = true;
            if let Some(n) = name_to_set {
                if let Err(e) = set_name(s, st.id, &n) {
                    return (counted_error(e), false);
                }
            }
            st.resp3 = resp3;
            let bulk = |v: &str| Reply::Bulk(v.as_bytes().to_vec());
            Reply::Map(vec![
                (bulk("server"), bulk("redis")),
                (bulk("version"), bulk(REDIS_VERSION)),
                (bulk("proto"), Reply::Integer(if resp3 { 3 } else { 2 })),
                (bulk("id"), Reply::Integer(st.id as i64 + 1)),
                (bulk("mode"), bulk("standalone")),
                (bulk("role"), bulk("master")),
                (bulk("modules"), Reply::Array(Vec::new())),
            ])
        }
        "auth" => {
            let r = match argv {
                [pass] => check_auth(&s.cfg, None, pass),
                [user, pass] => check_auth(&s.cfg, Some(user), pass),
                _ => return (counted_error(arity("auth")), false),
            };
            match r {
                Ok(()) => {
                    st.authed = true;
                    Reply::ok()
                }
                Err(e) => e,
            }
        }
        "client" => client(s, st, argv),
        "multi" if st.multi.is_some() => Reply::err("MULTI calls can not be nested"),
        "multi" => {
            st.multi = Some(Vec::new());
            st.multi_failed = false;
            Reply::ok()
        }
        "discard" => match st.multi.take() {
            Some(_) => Reply::ok(),
            None => Reply::err("DISCARD without MULTI"),
        },
        "exec" => {
            let watched = st.watched.take();
            match st.multi.take() {
                None => Reply::err("EXEC without MULTI"),
                Some(_) if std::mem::take(&mut st.multi_failed) => Reply::Error(
                    "EXECABORT Transaction discarded because of previous errors.".into(),
                ),
                Some(q) => exec_block(s, q, watched).await,
            }
        }
        "watch" if st.multi.is_some() => Reply::err("WATCH inside MULTI is not allowed"),
        "watch" => match argv {
            [] => arity("watch"),
            [k] if st.watched.as_ref().is_none_or(|(w, _)| w == k) => {
                if st.watched.is_none() {
                    match get_entry(s, k).await {
                        Ok(v) => st.watched = Some((k.clone(), v)),
                        Err(e) => return (counted_error(backend_err(e)), false),
                    }
                }
                Reply::ok()
            }
            _ => Reply::err(
                "WATCH of several keys is not supported by this store (a transaction is atomic \
                 on one key)",
            ),
        },
        "unwatch" => {
            st.watched = None;
            Reply::ok()
        }
        "scan" => scan_command(s, argv).await,
        "keys" => match argv {
            [pattern] => match all_keys(s).await {
                Ok(keys) => Reply::Array(
                    keys.into_iter()
                        .filter(|k| glob_match(pattern, k))
                        .map(Reply::Bulk)
                        .collect(),
                ),
                Err(e) => backend_err(e),
            },
            _ => arity("keys"),
        },
        "dbsize" if !argv.is_empty() => arity("dbsize"),
        "dbsize" => match all_keys(s).await {
            Ok(keys) => Reply::Integer(keys.len() as i64),
            Err(e) => backend_err(e),
        },
        "randomkey" if !argv.is_empty() => arity("randomkey"),
        "randomkey" => match all_keys(s).await {
            Ok(keys) if keys.is_empty() => Reply::Nil,
            Ok(keys) => {
                let seed = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .subsec_nanos() as usize;
                Reply::Bulk(keys[(seed ^ st.id as usize) % keys.len()].clone())
            }
            Err(e) => backend_err(e),
        },
        "flushdb" | "flushall" => match argv {
            [] => flush(s).await,
            [m] if m.eq_ignore_ascii_case(b"sync") || m.eq_ignore_ascii_case(b"async") => {
                flush(s).await
            }
            _ => Reply::err("syntax error"),
        },
        "reset" => {
            st.resp3 = false;
            st.multi = None;
            st.multi_failed = false;
            st.watched = None;
            st.authed = s.cfg.password.is_none();
            if let Some(c) = s.clients_info.lock().get_mut(&st.id) {
                c.name.clear();
            }
            Reply::Simple("RESET".into())
        }
        _ => Reply::err(format!("'{name}' is not a connection command")),
    };
    (counted_error(reply), false)
}

/// Runs a transaction's block (`watched`: the key WATCH read and its entry then). A block
/// whose commands touch one key (or none) is one atomic step: its commands run against a copy
/// of the key's value, and the result is written over that value with compare-and-set (an
/// insert over "absent", a delete-if for a deleted key). When another writer came between:
/// with WATCH, EXEC answers nil (aborted, as Redis does); without, the block runs again on
/// the new value. A block over several keys is discarded: nothing applied.
async fn exec_block(
    s: &Arc<Shared>,
    q: Vec<Vec<Vec<u8>>>,
    watched: Option<(Vec<u8>, Option<Entry>)>,
) -> Reply {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for args in &q {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        for k in command_keys(&name, &args[1..]).unwrap_or_default() {
            if !keys.iter().any(|x| x.as_slice() == k) {
                keys.push(k.to_vec());
            }
        }
    }
    if let Some((w, _)) = &watched {
        if !keys.iter().any(|k| k == w) {
            keys.insert(0, w.clone());
        }
    }
    if keys.len() > 1 {
        return Reply::Error(format!(
            "EXECABORT Transaction discarded: it touches {} keys, and this store makes a \
             transaction one atomic step only on one key (nothing was applied; send the \
             commands without MULTI, e.g. a non-transactional pipeline)",
            keys.len()
        ));
    }
    let key = keys.pop();
    loop {
        // The entry the block starts from: WATCH's, or read now.
        let start = match (&watched, &key) {
            (Some((_, v)), _) => v.clone(),
            (None, Some(k)) => match get_entry(s, k).await {
                Ok(v) => v,
                Err(e) => return backend_err(e),
            },
            (None, None) => None,
        };
        // A copy of the key, on the backend's clock and limits.
        let copy = Arc::new(MemoryBackend::copying(s.backend.clone()));
        if let (Some(k), Some(e)) = (&key, &start) {
            let _ = copy.put_entry(k, &e.value, e.expires_at, PutMode::Upsert);
        }
        let scratch = Shared::scratch(copy.clone(), &s.cfg);
        let mut replies = Vec::with_capacity(q.len());
        for args in &q {
            let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
            replies.push(if command_keys(&name, &args[1..]).is_some() {
                execute_keyed(&scratch, args).await
            } else if name == "unwatch" {
                Reply::ok()
            } else {
                execute_local(&scratch, args).0
            });
        }
        s.commands
            .fetch_add(scratch.commands.load(Ordering::Relaxed), Ordering::Relaxed);
        let Some(k) = &key else {
            return Reply::Array(replies);
        };
        let end = copy
            .get_entry(k)
            .unwrap_or_default()
            .map(|e| (e.value, e.expires_at));
        let started = start.as_ref().map(|e| (e.value.clone(), e.expires_at));
        let applied = if end == started {
            // Nothing to write: with WATCH, the key must still hold exactly what it read.
            match &watched {
                Some(_) => match get_entry(s, k).await {
                    Ok(now) => now == start,
                    Err(e) => return backend_err(e),
                },
                None => true,
            }
        } else {
            let r = match (&start, end) {
                (None, Some((v, d))) => put_entry(s, k, &v, d, PutMode::IfAbsent).await,
                (Some(b), Some((v, d))) => replace_entry(s, k, b, &v, d)
                    .await
                    .map(|c| c == Cas::Swapped),
                (Some(b), None) => delete_entry(s, k, b).await.map(|c| c == Cas::Swapped),
                (None, None) => Ok(true),
            };
            match r {
                Ok(w) => w,
                Err(e) => return backend_err(e),
            }
        };
        if applied {
            return Reply::Array(replies);
        }
        if watched.is_some() {
            return Reply::NilArray;
        }
    }
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE t]: scan steps until `COUNT` keys (default
/// 10; a hint, as in Redis) or the end; the cursor is the backend's.
async fn scan_command(s: &Arc<Shared>, argv: &[Vec<u8>]) -> Reply {
    let Some(c) = argv.first() else {
        return arity("scan");
    };
    let Some(mut cursor) = std::str::from_utf8(c)
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
    else {
        return Reply::err("invalid cursor");
    };
    let (mut pattern, mut count, mut only_strings) = (None, 10usize, true);
    let mut rest = &argv[1..];
    while let [opt, v, more @ ..] = rest {
        match opt.to_ascii_uppercase().as_slice() {
            b"MATCH" => pattern = Some(v.clone()),
            b"COUNT" => match parse_i64(v).filter(|n| *n > 0) {
                Some(n) => count = n as usize,
                None => return Reply::err("syntax error"),
            },
            // Every key holds a string.
            b"TYPE" => only_strings = v.eq_ignore_ascii_case(b"string"),
            _ => return Reply::err("syntax error"),
        }
        rest = more;
    }
    if !rest.is_empty() {
        return Reply::err("syntax error");
    }
    let mut out = Vec::new();
    loop {
        let (keys, next) = match scan_step(s, cursor).await {
            Ok(r) => r,
            Err(e) => return backend_err(e),
        };
        out.extend(
            keys.into_iter()
                .filter(|k| only_strings && pattern.as_ref().is_none_or(|p| glob_match(p, k)))
                .map(Reply::Bulk),
        );
        cursor = next;
        if cursor == 0 || out.len() >= count {
            break;
        }
    }
    Reply::Array(vec![
        Reply::Bulk(cursor.to_string().into_bytes()),
        Reply::Array(out),
    ])
}

/// FLUSHDB: deletes every key (each a DELETE, so its space is reclaimed). Not one atomic
/// step: a key written while it runs may survive it.
async fn flush(s: &Arc<Shared>) -> Reply {
    let keys = match all_keys(s).await {
        Ok(k) => k,
        Err(e) => return backend_err(e),
    };
    let futs = keys
        .into_iter()
        .map(|k| {
            let s = s.clone();
            Box::pin(async move { delete(&s, &k).await }) as BoxFuture<_>
        })
        .collect();
    all_ok(futs).await
}

/// OK once every call succeeded, else the first failure.
async fn all_ok<T: Send + 'static>(futs: Vec<BoxFuture<Result<T, String>>>) -> Reply {
    match dmkit_verbs::join_all(futs)
        .await
        .into_iter()
        .find_map(Result::err)
    {
        Some(e) => backend_err(e),
        None => Reply::ok(),
    }
}

/// The version HELLO and INFO report: the Redis whose protocol (RESP3 included) this
/// gateway speaks for the commands it has.
const REDIS_VERSION: &str = "7.2.0";

/// AUTH as Redis answers it: only the default user exists; without a configured password it
/// takes any password (and `AUTH <password>` alone is an error), with one it takes that one.
fn check_auth(cfg: &RespConfig, user: Option<&Vec<u8>>, pass: &[u8]) -> Result<(), Reply> {
    let wrong =
        || Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into());
    if user.is_some_and(|u| u.as_slice() != b"default") {
        return Err(wrong());
    }
    match &cfg.password {
        None if user.is_none() => Err(Reply::err(
            "AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        )),
        None => Ok(()),
        Some(p) if same(p, pass) => Ok(()),
        Some(_) => Err(wrong()),
    }
}

/// Whether `given` is `secret`, in time that depends only on `given`'s length: not on where
/// they differ, nor on the secret's length (every byte given is compared, with the secret
/// repeated as needed; a length difference makes the answer false).
fn same(secret: &[u8], given: &[u8]) -> bool {
    let mut diff = (secret.len() ^ given.len()) as u64;
    for (i, b) in given.iter().enumerate() {
        let s = if secret.is_empty() {
            0
        } else {
            secret[i % secret.len()]
        };
        diff |= u64::from(s ^ b);
    }
    std::hint::black_box(diff) == 0
}

fn set_name(s: &Shared, id: u64, n: &[u8]) -> Result<(), Reply> {
    if n.iter().any(|b| *b <= b' ' || *b > b'~') {
        return Err(Reply::err(
            "Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    if let Some(c) = s.clients_info.lock().get_mut(&id) {
        c.name = String::from_utf8_lossy(n).into_owned();
    }
    Ok(())
}

fn client_line(id: u64, c: &ClientInfo) -> String {
    format!(
        "id={} addr={} name={} age={} db=0 cmd={}\n",
        id + 1,
        c.peer,
        c.name,
        c.since.elapsed().as_secs(),
        if c.last_command.is_empty() {
            "NULL"
        } else {
            &c.last_command
        }
    )
}

/// CLIENT ID, SETNAME, GETNAME, LIST, INFO and SETINFO.
fn client(s: &Shared, st: &ConnState, argv: &[Vec<u8>]) -> Reply {
    let Some(sub) = argv.first() else {
        return arity("client");
    };
    let sub = sub.to_ascii_lowercase();
    match (sub.as_slice(), &argv[1..]) {
        (b"id", []) => Reply::Integer(st.id as i64 + 1),
        (b"setname", [n]) => match set_name(s, st.id, n) {
            Ok(()) => Reply::ok(),
            Err(e) => e,
        },
        (b"getname", []) => match s.clients_info.lock().get(&st.id) {
            Some(c) if !c.name.is_empty() => Reply::Bulk(c.name.clone().into_bytes()),
            _ => Reply::Nil,
        },
        (b"list", filter) => {
            // Every connection is a normal one; ids as CLIENT ID gives them.
            let ids: Option<Vec<u64>> = match filter {
                [] => None,
                [t, kind] if t.eq_ignore_ascii_case(b"type") => {
                    match kind.to_ascii_lowercase().as_slice() {
                        b"normal" => None,
                        b"master" | b"replica" | b"slave" | b"pubsub" => Some(Vec::new()),
                        _ => {
                            return Reply::err(format!(
                                "Unknown client type '{}'",
                                String::from_utf8_lossy(kind)
                            ));
                        }
                    }
                }
                [t, ids @ ..] if t.eq_ignore_ascii_case(b"id") && !ids.is_empty() => {
                    let mut out = Vec::new();
                    for i in ids {
                        match parse_i64(i).filter(|n| *n > 0) {
                            Some(n) => out.push(n as u64 - 1),
                            None => return Reply::err("Invalid client ID"),
                        }
                    }
                    Some(out)
                }
                _ => return Reply::err("syntax error"),
            };
            let all = s.clients_info.lock();
            Reply::Bulk(
                all.iter()
                    .filter(|(id, _)| ids.as_ref().is_none_or(|w| w.contains(id)))
                    .map(|(id, c)| client_line(*id, c))
                    .collect::<String>()
                    .into_bytes(),
            )
        }
        (b"info", []) => match s.clients_info.lock().get(&st.id) {
            Some(c) => Reply::Bulk(client_line(st.id, c).into_bytes()),
            None => Reply::Nil,
        },
        // Client libraries announce themselves (redis-py does on connect): noted, nothing to do.
        (b"setinfo", [_, _]) => Reply::ok(),
        (b"id" | b"getname" | b"info" | b"setname" | b"setinfo", _) => Reply::err(format!(
            "wrong number of arguments for 'client|{}' command",
            String::from_utf8_lossy(&sub)
        )),
        _ => Reply::err(format!(
            "unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(&argv[0])
        )),
    }
}

/// CONFIG GET answers the settings clients and `redis-benchmark` look at (this store has
/// no persistence knobs: its durability is the memory nodes'); CONFIG SET changes nothing.
fn config(s: &Shared, argv: &[Vec<u8>]) -> Reply {
    let Some(sub) = argv.first() else {
        return arity("config");
    };
    match sub.to_ascii_lowercase().as_slice() {
        b"get" if argv.len() >= 2 => {
            let max = s.cfg.max_clients.to_string();
            let known: [(&str, &str); 6] = [
                ("save", ""),
                ("appendonly", "no"),
                ("databases", "1"),
                ("maxmemory", "0"),
                ("maxclients", &max),
                ("timeout", "0"),
            ];
            let mut out = Vec::new();
            for (k, v) in known {
                if argv[1..]
                    .iter()
                    .any(|p| glob_match(&p.to_ascii_lowercase(), k.as_bytes()))
                {
                    out.push((
                        Reply::Bulk(k.as_bytes().to_vec()),
                        Reply::Bulk(v.as_bytes().to_vec()),
                    ));
                }
            }
            Reply::Map(out)
        }
        b"get" => arity("config|get"),
        b"resetstat" => Reply::ok(),
        b"set" => Reply::err("CONFIG SET is not supported by this store"),
        _ => Reply::err(format!(
            "unknown subcommand '{}'. Try CONFIG HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

/// Redis's glob (KEYS, SCAN MATCH, CONFIG GET, COMMAND LIST): `*`, `?`, `[abc]`, `[^a-z]`
/// and `\x` for a literal `x`. Linear in the pattern times the subject (no exponential
/// backtracking on patterns like `*a*a*a*b`).
fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    // Where the last `*` was and the subject position it is retried from.
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if let Some(next) = glob_one(pat, p, s[i]) {
            p = next;
            i += 1;
            continue;
        }
        if pat.get(p) == Some(&b'*') {
            while pat.get(p) == Some(&b'*') {
                p += 1;
            }
            star = Some((p, i));
            continue;
        }
        match star {
            Some((sp, si)) => {
                p = sp;
                i = si + 1;
                star = Some((sp, si + 1));
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|c| *c == b'*')
}

/// Whether the pattern element at `p` (not `*`) matches byte `c`; where the next element
/// starts if so.
fn glob_one(pat: &[u8], p: usize, c: u8) -> Option<usize> {
    match *pat.get(p)? {
        b'*' => None,
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pat.len() => (pat[p + 1] == c).then_some(p + 2),
        b'[' => {
            let mut q = p + 1;
            let negate = pat.get(q) == Some(&b'^');
            if negate {
                q += 1;
            }
            let mut hit = false;
            loop {
                match pat.get(q) {
                    // An unterminated class: Redis ends it at the end of the pattern.
                    None => break,
                    Some(b']') => {
                        q += 1;
                        break;
                    }
                    Some(b'\\') if q + 1 < pat.len() => {
                        hit |= pat[q + 1] == c;
                        q += 2;
                    }
                    Some(&a) if pat.get(q + 1) == Some(&b'-') && q + 2 < pat.len() => {
                        let b = pat[q + 2];
                        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                        hit |= lo <= c && c <= hi;
                        q += 3;
                    }
                    Some(&a) => {
                        hit |= a == c;
                        q += 1;
                    }
                }
            }
            (hit != negate).then_some(q)
        }
        a => (a == c).then_some(p + 1),
    }
}

/// How an expiry option gives its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExpireKind {
    /// EX: seconds from now.
    Ex,
    /// PX: milliseconds from now.
    Px,
    /// EXAT: a Unix time in seconds.
    ExAt,
    /// PXAT: a Unix time in milliseconds.
    PxAt,
}

/// The options of SET (and GETEX), parsed as Redis parses them: NX/XX, GET, and one of
/// EX/PX/EXAT/PXAT/KEEPTTL (PERSIST for GETEX); an option given twice is taken once, two that
/// conflict are a syntax error.
#[derive(Debug, Default)]
struct SetOptions<'a> {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    expire: Option<(ExpireKind, &'a [u8])>,
}

fn set_options(opts: &[Vec<u8>], getex: bool) -> Result<SetOptions<'_>, Reply> {
    let mut o = SetOptions::default();
    let mut i = 0;
    while i < opts.len() {
        let opt = opts[i].to_ascii_uppercase();
        let next = opts.get(i + 1);
        let kind = match opt.as_slice() {
            b"EX" => Some(ExpireKind::Ex),
            b"PX" => Some(ExpireKind::Px),
            b"EXAT" => Some(ExpireKind::ExAt),
            b"PXAT" => Some(ExpireKind::PxAt),
            _ => None,
        };
        match (opt.as_slice(), kind) {
            (b"NX", _) if !getex && !o.xx => o.nx = true,
            (b"XX", _) if !getex && !o.nx => o.xx = true,
            (b"GET", _) if !getex => o.get = true,
            (b"KEEPTTL", _) if !getex && !o.persist && o.expire.is_none() => o.keepttl = true,
            (b"PERSIST", _) if getex && !o.keepttl && o.expire.is_none() => o.persist = true,
            (_, Some(k))
                if !o.keepttl
                    && !o.persist
                    && o.expire.is_none_or(|(e, _)| e == k)
                    && next.is_some() =>
            {
                o.expire = next.map(|n| (k, n.as_slice()));
                i += 1;
            }
            _ => return Err(Reply::err("syntax error")),
        }
        i += 1;
    }
    Ok(o)
}

fn invalid_expire(cmd: &str) -> Reply {
    Reply::err(format!("invalid expire time in '{cmd}' command"))
}

/// The deadline (Unix ms) an EX/PX/EXAT/PXAT option of `cmd` sets, with Redis's checks: an
/// integer (else "not an integer"), above zero and without overflow (else "invalid expire
/// time").
fn option_deadline(cmd: &str, kind: ExpireKind, raw: &[u8], now: u64) -> Result<u64, Reply> {
    let n = parse_i64(raw).ok_or_else(not_integer)?;
    let seconds = matches!(kind, ExpireKind::Ex | ExpireKind::ExAt);
    if n <= 0 || (seconds && n > i64::MAX / 1000) {
        return Err(invalid_expire(cmd));
    }
    let ms = if seconds { n * 1000 } else { n };
    let at = match kind {
        ExpireKind::Ex | ExpireKind::Px => ms.checked_add(now as i64),
        ExpireKind::ExAt | ExpireKind::PxAt => Some(ms),
    };
    match at {
        Some(at) if at > 0 => Ok(at as u64),
        _ => Err(invalid_expire(cmd)),
    }
}

/// SET key value [NX | XX] [GET] [EX s | PX ms | EXAT t | PXAT t | KEEPTTL]. Without KEEPTTL
/// the key's deadline is replaced (none unless given), as in Redis.
async fn set(s: &Arc<Shared>, argv: &[Vec<u8>]) -> Reply {
    let [k, v, opts @ ..] = argv else {
        return arity("set");
    };
    let o = match set_options(opts, false) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let deadline = match o.expire {
        Some((kind, raw)) => match option_deadline("set", kind, raw, s.backend.now_ms()) {
            Ok(d) => Some(d),
            Err(e) => return e,
        },
        None => None,
    };
    if v.len() > s.backend.max_value() {
        return too_large();
    }
    let mode = match (o.nx, o.xx) {
        (true, _) => PutMode::IfAbsent,
        (_, true) => PutMode::IfPresent,
        _ => PutMode::Upsert,
    };
    if o.get || o.keepttl || (mode == PutMode::IfPresent && deadline.is_some()) {
        // Read, then write over exactly what was read (SET ... GET answers the old value).
        let r = rmw(s, k, |cur| {
            Ok(match (mode, cur) {
                (PutMode::IfAbsent, Some(_)) | (PutMode::IfPresent, None) => None,
                _ => Some(Write::Set(
                    v.clone(),
                    if o.keepttl {
                        cur.and_then(|c| c.expires_at)
                    } else {
                        deadline
                    },
                )),
            })
        })
        .await;
        return match r {
            Ok((old, _)) if o.get => old.map_or(Reply::Nil, |e| Reply::Bulk(e.value)),
            Ok((_, Some(_))) => Reply::ok(),
            Ok((_, None)) => Reply::Nil,
            Err(e) => e,
        };
    }
    match put_entry(s, k, v, deadline, mode).await {
        Ok(true) => Reply::ok(),
        Ok(false) => Reply::Nil,
        Err(e) => backend_err(e),
    }
}

/// SETEX key seconds value, PSETEX key milliseconds value.
async fn setex(s: &Arc<Shared>, name: &str, argv: &[Vec<u8>]) -> Reply {
    let [k, t, v] = argv else {
        return arity(name);
    };
    let kind = if name == "setex" {
        ExpireKind::Ex
    } else {
        ExpireKind::Px
    };
    let deadline = match option_deadline(name, kind, t, s.backend.now_ms()) {
        Ok(d) => d,
        Err(e) => return e,
    };
    if v.len() > s.backend.max_value() {
        return too_large();
    }
    match put_entry(s, k, v, Some(deadline), PutMode::Upsert).await {
        Ok(_) => Reply::ok(),
        Err(e) => backend_err(e),
    }
}

/// GETEX key [EX s | PX ms | EXAT t | PXAT t | PERSIST]: the value, and the deadline
/// changed over exactly the entry read (a deadline already past deletes the key).
async fn getex(s: &Arc<Shared>, argv: &[Vec<u8>]) -> Reply {
    let [k, opts @ ..] = argv else {
        return arity("getex");
    };
    let o = match set_options(opts, true) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let now = s.backend.now_ms();
    let deadline = match o.expire {
        Some((kind, raw)) => match option_deadline("getex", kind, raw, now) {
            Ok(d) => Some(d),
            Err(e) => return e,
        },
        None => None,
    };
    let r = rmw(s, k, |cur| {
        let Some(c) = cur else { return Ok(None) };
        Ok(match deadline {
            Some(d) if d <= now => Some(Write::Delete),
            Some(d) => Some(Write::Set(c.value.clone(), Some(d))),
            None if o.persist && c.expires_at.is_some() => Some(Write::Set(c.value.clone(), None)),
            None => None,
        })
    })
    .await;
    match r {
        Ok((cur, _)) => cur.map_or(Reply::Nil, |e| Reply::Bulk(e.value)),
        Err(e) => e,
    }
}

/// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT key time [NX | XX | GT | LT], as Redis 7: 1 if the
/// deadline was set (a time already past deletes the key), 0 if the key is absent or the
/// condition fails (no deadline counts as infinite for GT and LT).
async fn expire(s: &Arc<Shared>, name: &str, argv: &[Vec<u8>]) -> Reply {
    let [k, t, opts @ ..] = argv else {
        return arity(name);
    };
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for o in opts {
        match o.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"GT" => gt = true,
            b"LT" => lt = true,
            _ => {
                return Reply::err(format!("Unsupported option {}", String::from_utf8_lossy(o)));
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Reply::err("NX and XX, GT or LT options at the same time are not compatible");
    }
    if gt && lt {
        return Reply::err("GT and LT options at the same time are not compatible");
    }
    let Some(n) = parse_i64(t) else {
        return not_integer();
    };
    let now = s.backend.now_ms();
    let seconds = matches!(name, "expire" | "expireat");
    let ms = if seconds {
        n.checked_mul(1000)
    } else {
        Some(n)
    };
    let base = if matches!(name, "expire" | "pexpire") {
        now as i64
    } else {
        0
    };
    let Some(when) = ms.and_then(|m| m.checked_add(base)) else {
        return invalid_expire(name);
    };
    let r = rmw(s, k, |cur| {
        let Some(c) = cur else { return Ok(None) };
        let ok = match c.expires_at {
            None => !(xx || gt),
            Some(d) => {
                let d = d as i64;
                let refused = nx || (gt && when <= d) || (lt && when >= d);
                !refused
            }
        };
        if !ok {
            return Ok(None);
        }
        Ok(Some(if when <= now as i64 {
            Write::Delete
        } else {
            Write::Set(c.value.clone(), Some(when as u64))
        }))
    })
    .await;
    match r {
        Ok((_, w)) => Reply::Integer(i64::from(w.is_some())),
        Err(e) => e,
    }
}

/// TTL, PTTL, EXPIRETIME, PEXPIRETIME: -2 if the key is absent, -1 if it has no deadline.
async fn ttl(s: &Arc<Shared>, name: &str, k: &[u8]) -> Reply {
    let e = match get_entry(s, k).await {
        Ok(Some(e)) => e,
        Ok(None) => return Reply::Integer(-2),
        Err(e) => return backend_err(e),
    };
    let Some(d) = e.expires_at else {
        return Reply::Integer(-1);
    };
    let d = d.min(i64::MAX as u64) as i64;
    let ms = match name {
        "ttl" | "pttl" => d.saturating_sub(s.backend.now_ms() as i64).max(0),
        _ => d,
    };
    // Seconds are rounded, as Redis does.
    Reply::Integer(match name {
        "ttl" | "expiretime" => ms.saturating_add(500) / 1000,
        _ => ms,
    })
}

/// PERSIST: 1 if the key had a deadline (now removed, over exactly the entry read).
async fn persist(s: &Arc<Shared>, k: &[u8]) -> Reply {
    let r = rmw(s, k, |cur| {
        Ok(cur
            .filter(|c| c.expires_at.is_some())
            .map(|c| Write::Set(c.value.clone(), None)))
    })
    .await;
    match r {
        Ok((_, w)) => Reply::Integer(i64::from(w.is_some())),
        Err(e) => e,
    }
}

/// OBJECT ENCODING key: how Redis would encode the string (`int`, `embstr` up to 44 bytes,
/// `raw`); nil if absent. The other OBJECT subcommands describe Redis's memory and are not
/// served.
async fn object(s: &Arc<Shared>, argv: &[Vec<u8>]) -> Reply {
    match argv {
        [sub, k] if sub.eq_ignore_ascii_case(b"encoding") => match get(s, k).await {
            Ok(Some(v)) => {
                let enc = if v.len() <= 20 && parse_i64(&v).is_some() {
                    "int"
                } else if v.len() <= 44 {
                    "embstr"
                } else {
                    "raw"
                };
                Reply::Bulk(enc.as_bytes().to_vec())
            }
            Ok(None) => Reply::Nil,
            Err(e) => backend_err(e),
        },
        [sub, ..] => Reply::err(format!(
            "unknown subcommand '{}'. Try OBJECT HELP.",
            String::from_utf8_lossy(sub)
        )),
        [] => arity("object"),
    }
}

/// COPY source destination [DB 0] [REPLACE]: the source's value and deadline as read, written
/// to the destination (an insert, or with REPLACE an overwrite). Two keys, so not one atomic
/// step: the copy is of the source as it was when read.
async fn copy(s: &Arc<Shared>, argv: &[Vec<u8>]) -> Reply {
    let [src, dst, opts @ ..] = argv else {
        return arity("copy");
    };
    let mut replace = false;
    let mut i = 0;
    while i < opts.len() {
        match opts[i].to_ascii_uppercase().as_slice() {
            b"REPLACE" => replace = true,
            b"DB" if i + 1 < opts.len() => {
                i += 1;
                match parse_i64(&opts[i]) {
                    Some(0) => {}
                    Some(_) => return Reply::err("DB index is out of range"),
                    None => return not_integer(),
                }
            }
            _ => return Reply::err("syntax error"),
        }
        i += 1;
    }
    if src == dst {
        return Reply::err("source and destination objects are the same");
    }
    let e = match get_entry(s, src).await {
        Ok(Some(e)) => e,
        Ok(None) => return Reply::Integer(0),
        Err(e) => return backend_err(e),
    };
    let mode = if replace {
        PutMode::Upsert
    } else {
        PutMode::IfAbsent
    };
    match put_entry(s, dst, &e.value, e.expires_at, mode).await {
        Ok(w) => Reply::Integer(i64::from(w)),
        Err(e) => backend_err(e),
    }
}

/// RENAME and RENAMENX: two keys, so not one atomic step on this store. The source's entry
/// is read, written to the destination (RENAMENX: only if absent), then the source is deleted
/// only if it still holds exactly what was read. A reader may see both keys in between, and a
/// gateway that dies in between leaves both: a value is never lost. A write to the source
/// in between survives there (as if it came after the rename).
async fn rename(s: &Arc<Shared>, name: &str, argv: &[Vec<u8>]) -> Reply {
    let [src, dst] = argv else {
        return arity(name);
    };
    let nx = name == "renamenx";
    let e = match get_entry(s, src).await {
        Ok(Some(e)) => e,
        Ok(None) => return Reply::err("no such key"),
        Err(e) => return backend_err(e),
    };
    if src == dst {
        return if nx { Reply::Integer(0) } else { Reply::ok() };
    }
    let mode = if nx {
        PutMode::IfAbsent
    } else {
        PutMode::Upsert
    };
    match put_entry(s, dst, &e.value, e.expires_at, mode).await {
        Ok(true) => {}
        Ok(false) => return Reply::Integer(0),
        Err(e) => return backend_err(e),
    }
    if let Err(e) = delete_entry(s, src, &e).await {
        return backend_err(e);
    }
    if nx { Reply::Integer(1) } else { Reply::ok() }
}

/// INFO [section ...]: the sections this gateway has (server, clients, stats, replication,
/// backend); none named, `default`, `all` or `everything`: all of them. An unknown section
/// gives nothing, as in Redis.
fn info(s: &Shared, wanted: &[Vec<u8>]) -> String {
    let mut sections: Vec<(&str, String)> = Vec::new();
    sections.push((
        "Server",
        format!(
            "redis_version:{REDIS_VERSION}\r\ndmkit_version:{}\r\nredis_mode:standalone\r\n\
             uptime_in_seconds:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            s.started.elapsed().as_secs()
        ),
    ));
    sections.push((
        "Clients",
        format!(
            "connected_clients:{}\r\nmaxclients:{}\r\n",
            s.clients.load(Ordering::Relaxed),
            s.cfg.max_clients
        ),
    ));
    sections.push((
        "Stats",
        format!(
            "total_commands_processed:{}\r\nexpired_keys:{}\r\n",
            s.commands.load(Ordering::Relaxed),
            s.expired.load(Ordering::Relaxed)
        ),
    ));
    sections.push((
        "Replication",
        "role:master\r\nconnected_slaves:0\r\n".into(),
    ));
    let extra = s.backend.info();
    if !extra.is_empty() {
        sections.push((
            "Backend",
            extra.iter().map(|(k, v)| format!("{k}:{v}\r\n")).collect(),
        ));
    }
    let all = wanted.is_empty()
        || wanted.iter().any(|w| {
            [&b"default"[..], b"all", b"everything"]
                .iter()
                .any(|a| w.eq_ignore_ascii_case(a))
        });
    sections
        .into_iter()
        .filter(|(name, _)| {
            all || wanted
                .iter()
                .any(|w| w.eq_ignore_ascii_case(name.as_bytes()))
        })
        .map(|(name, body)| format!("# {name}\r\n{body}"))
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// An in-memory backend: for tests of the gateway itself and for `redis-benchmark` baselines
/// of the protocol path alone. Keys may have deadlines (an expired key reads as absent and
/// is removed when met, or by [`KvBackend::reclaim_expired`]); every write gets a new version.
pub struct MemoryBackend {
    map: parking_lot::Mutex<MemoryMap>,
    /// Another backend whose clock and value limit this one takes (a transaction's copy).
    like: Option<Arc<dyn KvBackend>>,
    max_value: usize,
}

#[derive(Default)]
struct MemoryMap {
    keys: std::collections::HashMap<Vec<u8>, Stored>,
    /// The version of the next write.
    next: u64,
}

struct Stored {
    value: Vec<u8>,
    expires_at: Option<u64>,
    version: u64,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("keys", &self.map.lock().keys.len())
            .finish()
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend {
            map: parking_lot::Mutex::new(MemoryMap::default()),
            like: None,
            max_value: MAX_STRING,
        }
    }
}

impl MemoryBackend {
    /// A backend that takes values up to `max` bytes.
    pub fn with_max_value(max: usize) -> MemoryBackend {
        MemoryBackend {
            max_value: max,
            ..MemoryBackend::default()
        }
    }

    /// An empty backend on `other`'s clock and value limit.
    pub fn copying(other: Arc<dyn KvBackend>) -> MemoryBackend {
        MemoryBackend {
            max_value: other.max_value(),
            like: Some(other),
            ..MemoryBackend::default()
        }
    }

    /// The live entry of `key` (an expired one is removed).
    fn live<'a>(&self, m: &'a mut MemoryMap, key: &[u8]) -> Option<&'a mut Stored> {
        let now = self.now_ms();
        if m.keys
            .get(key)
            .is_some_and(|e| e.expires_at.is_some_and(|d| d <= now))
        {
            m.keys.remove(key);
        }
        m.keys.get_mut(key)
    }

    fn store(m: &mut MemoryMap, key: &[u8], value: &[u8], expires_at: Option<u64>) {
        m.next += 1;
        let version = m.next;
        m.keys.insert(
            key.to_vec(),
            Stored {
                value: value.to_vec(),
                expires_at,
                version,
            },
        );
    }

    fn check(&self, value: &[u8]) -> Result<(), String> {
        if value.len() > self.max_value {
            return Err(format!(
                "a value of {} bytes is over this store's maximum of {} bytes: nothing was written",
                value.len(),
                self.max_value
            ));
        }
        Ok(())
    }
}

impl KvBackend for MemoryBackend {
    fn blocks(&self) -> bool {
        false
    }
    fn now_ms(&self) -> u64 {
        self.like.as_ref().map_or_else(unix_ms, |b| b.now_ms())
    }
    fn max_value(&self) -> usize {
        self.max_value
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let mut m = self.map.lock();
        Ok(self.live(&mut m, key).map(|e| e.value.clone()))
    }
    fn put(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool, String> {
        self.put_entry(key, value, None, mode)
    }
    fn delete(&self, key: &[u8]) -> Result<bool, String> {
        let mut m = self.map.lock();
        let present = self.live(&mut m, key).is_some();
        m.keys.remove(key);
        Ok(present)
    }
    fn compare_and_set(&self, key: &[u8], expected: &[u8], value: &[u8]) -> Result<Cas, String> {
        self.check(value)?;
        let mut m = self.map.lock();
        if self.live(&mut m, key).is_some_and(|e| e.value == expected) {
            Self::store(&mut m, key, value, None);
            return Ok(Cas::Swapped);
        }
        Ok(Cas::Changed)
    }
    fn delete_if(&self, key: &[u8], expected: &[u8]) -> Result<Cas, String> {
        let mut m = self.map.lock();
        if self.live(&mut m, key).is_some_and(|e| e.value == expected) {
            m.keys.remove(key);
            return Ok(Cas::Swapped);
        }
        Ok(Cas::Changed)
    }
    fn scan(&self, cursor: u64) -> Result<ScanStep, String> {
        // One step: every live key (a copy of a map is the whole scan).
        if cursor != 0 {
            return Ok((Vec::new(), 0));
        }
        let now = self.now_ms();
        let m = self.map.lock();
        Ok((
            m.keys
                .iter()
                .filter(|(_, e)| e.expires_at.is_none_or(|d| d > now))
                .map(|(k, _)| k.clone())
                .collect(),
            0,
        ))
    }
    fn get_entry(&self, key: &[u8]) -> Result<Option<Entry>, String> {
        let mut m = self.map.lock();
        Ok(self.live(&mut m, key).map(|e| Entry {
            value: e.value.clone(),
            expires_at: e.expires_at,
            version: Version::new(e.version),
        }))
    }
    fn put_entry(
        &self,
        key: &[u8],
        value: &[u8],
        expires_at: Option<u64>,
        mode: PutMode,
    ) -> Result<bool, String> {
        self.check(value)?;
        let mut m = self.map.lock();
        let present = self.live(&mut m, key).is_some();
        let write = match mode {
            PutMode::Upsert => true,
            PutMode::IfAbsent => !present,
            PutMode::IfPresent => present,
        };
        if write {
            Self::store(&mut m, key, value, expires_at);
        }
        Ok(write)
    }
    fn replace_entry(
        &self,
        key: &[u8],
        current: &Entry,
        value: &[u8],
        expires_at: Option<u64>,
    ) -> Result<Cas, String> {
        self.check(value)?;
        let mut m = self.map.lock();
        let held = self.live(&mut m, key).map(|e| e.version);
        if held.is_some() && held.as_ref() == current.version.get::<u64>() {
            Self::store(&mut m, key, value, expires_at);
            return Ok(Cas::Swapped);
        }
        Ok(Cas::Changed)
    }
    fn delete_entry(&self, key: &[u8], current: &Entry) -> Result<Cas, String> {
        let mut m = self.map.lock();
        let held = self.live(&mut m, key).map(|e| e.version);
        if held.is_some() && held.as_ref() == current.version.get::<u64>() {
            m.keys.remove(key);
            return Ok(Cas::Swapped);
        }
        Ok(Cas::Changed)
    }
    fn reclaim_expired(&self, _cursor: u64) -> Result<Swept, String> {
        // One step: the whole map.
        let now = self.now_ms();
        let mut m = self.map.lock();
        let before = m.keys.len();
        m.keys.retain(|_, e| e.expires_at.is_none_or(|d| d > now));
        Ok(Swept {
            deleted: before - m.keys.len(),
            deadlines: m.keys.values().filter(|e| e.expires_at.is_some()).count(),
            next: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn roundtrip(server: &RespServer, input: &[u8], expect: &[u8]) {
        let mut c = TcpStream::connect(server.local_addr()).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        roundtrip_on(&mut c, input, expect);
    }

    /// Sends `input` on `c` and reads exactly `expect`.
    fn roundtrip_on(c: &mut TcpStream, input: &[u8], expect: &[u8]) {
        c.write_all(input).unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while got.len() < expect.len() {
            let Ok(n) = c.read(&mut chunk) else { break };
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
            b"FOO bar\r\nGET\r\nSET k v EX 0\r\nSET k v NX XX\r\nMSET a\r\nSELECT 3\r\n",
            b"-ERR unknown command 'FOO', with args beginning with: 'bar' \r\n-ERR wrong number of arguments for 'get' command\r\n-ERR invalid expire time in 'set' command\r\n-ERR syntax error\r\n-ERR wrong number of arguments for 'mset' command\r\n-ERR DB index is out of range\r\n",
        );
    }

    #[test]
    fn hello_switches_the_protocol_and_names_the_connection() {
        let s = server();
        roundtrip(
            &s,
            b"HELLO 4\r\nGET nope\r\nHELLO 3 SETNAME app\r\nGET nope\r\nCLIENT GETNAME\r\nHELLO 2\r\nGET nope\r\n",
            b"-NOPROTO sorry, this protocol version is not supported\r\n$-1\r\n\
              %7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:1\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n\
              _\r\n$3\r\napp\r\n\
              *14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:1\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n\
              $-1\r\n",
        );
    }

    #[test]
    fn connection_commands_answer_as_redis_does() {
        let s = server();
        roundtrip(
            &s,
            b"CLIENT SETNAME \"has space\"\r\nCLIENT SETNAME w1\r\nCLIENT GETNAME\r\nCLIENT SETINFO lib-name x\r\nCLIENT NOPE\r\nAUTH pw\r\nAUTH default pw\r\nAUTH bob pw\r\nCONFIG GET save\r\nCONFIG GET max*\r\nCONFIG SET save x\r\nTIME 1\r\nRESET\r\nCLIENT GETNAME\r\n",
            b"-ERR Client names cannot contain spaces, newlines or special characters.\r\n+OK\r\n$2\r\nw1\r\n+OK\r\n\
              -ERR unknown subcommand 'NOPE'. Try CLIENT HELP.\r\n\
              -ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n\
              +OK\r\n-WRONGPASS invalid username-password pair or user is disabled.\r\n\
              *2\r\n$4\r\nsave\r\n$0\r\n\r\n*4\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n$10\r\nmaxclients\r\n$5\r\n10000\r\n\
              -ERR CONFIG SET is not supported by this store\r\n-ERR wrong number of arguments for 'time' command\r\n\
              +RESET\r\n$-1\r\n",
        );
    }

    /// COMMAND INFO and COMMAND DOCS give what redis-server 7.0 gives for GET, byte for
    /// byte (RESP2 and RESP3); unknown names are nil (INFO) or left out (DOCS).
    #[test]
    fn command_info_and_docs_answer_as_redis_does() {
        let s = server();
        let info2 = "*10\r\n$3\r\nget\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*3\r\n+@read\r\n+@string\r\n+@fast\r\n*0\r\n\
                     *1\r\n*6\r\n$5\r\nflags\r\n*2\r\n+RO\r\n+access\r\n$12\r\nbegin_search\r\n*4\r\n$4\r\ntype\r\n$5\r\nindex\r\n$4\r\nspec\r\n*2\r\n$5\r\nindex\r\n:1\r\n\
                     $9\r\nfind_keys\r\n*4\r\n$4\r\ntype\r\n$5\r\nrange\r\n$4\r\nspec\r\n*6\r\n$7\r\nlastkey\r\n:0\r\n$7\r\nkeystep\r\n:1\r\n$5\r\nlimit\r\n:0\r\n*0\r\n";
        let docs2 = "*10\r\n$7\r\nsummary\r\n$22\r\nGet the value of a key\r\n$5\r\nsince\r\n$5\r\n1.0.0\r\n$5\r\ngroup\r\n$6\r\nstring\r\n$10\r\ncomplexity\r\n$4\r\nO(1)\r\n\
                     $9\r\narguments\r\n*1\r\n*6\r\n$4\r\nname\r\n$3\r\nkey\r\n$4\r\ntype\r\n$3\r\nkey\r\n$14\r\nkey_spec_index\r\n:0\r\n";
        let info3 = "*10\r\n$3\r\nget\r\n:2\r\n~2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n~3\r\n+@read\r\n+@string\r\n+@fast\r\n~0\r\n\
                     ~1\r\n%3\r\n$5\r\nflags\r\n~2\r\n+RO\r\n+access\r\n$12\r\nbegin_search\r\n%2\r\n$4\r\ntype\r\n$5\r\nindex\r\n$4\r\nspec\r\n%1\r\n$5\r\nindex\r\n:1\r\n\
                     $9\r\nfind_keys\r\n%2\r\n$4\r\ntype\r\n$5\r\nrange\r\n$4\r\nspec\r\n%3\r\n$7\r\nlastkey\r\n:0\r\n$7\r\nkeystep\r\n:1\r\n$5\r\nlimit\r\n:0\r\n~0\r\n";
        let count = commands::top_level().count();
        let expect = format!(
            "*2\r\n{info2}$-1\r\n*2\r\n$3\r\nget\r\n{docs2}:{count}\r\n\
             -ERR wrong number of arguments for 'command|count' command\r\n\
             *2\r\n$14\r\nclient|setname\r\n$14\r\nclient|getname\r\n*0\r\n-ERR syntax error\r\n\
             -ERR unknown subcommand 'NOPE'. Try COMMAND HELP.\r\n"
        );
        roundtrip(
            &s,
            b"COMMAND INFO get nosuch\r\nCOMMAND DOCS nosuch GET\r\nCOMMAND COUNT\r\nCOMMAND COUNT 1\r\n\
              COMMAND LIST FILTERBY pattern client|*name\r\nCOMMAND LIST FILTERBY module x\r\n\
              COMMAND LIST FILTERBY nope x\r\nCOMMAND NOPE\r\n",
            expect.as_bytes(),
        );
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.write_all(b"HELLO 3\r\nPING\r\n").unwrap();
        let mut buf = [0u8; 4096];
        let mut got = Vec::new();
        while !got.ends_with(b"+PONG\r\n") {
            let n = c.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        roundtrip_on(
            &mut c,
            b"COMMAND INFO get\r\n",
            format!("*1\r\n{info3}").as_bytes(),
        );
        // Every command of the table answers COMMAND INFO and DOCS, subcommands included.
        for cmd in commands::COMMANDS {
            let info = commands::info(cmd);
            let docs = commands::docs(cmd);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            info.encode_as(&mut a, true);
            docs.encode_as(&mut b, false);
            assert!(a.starts_with(b"*10\r\n"), "{}", cmd.name);
            assert!(b.starts_with(b"*"), "{}", cmd.name);
        }
    }

    #[test]
    fn every_command_of_the_table_is_served() {
        let s = server();
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        for cmd in commands::top_level() {
            if matches!(cmd.name, "quit" | "reset" | "multi" | "hello" | "watch") {
                continue;
            }
            let mut got = Vec::new();
            c.write_all(format!("{}\r\n", cmd.name).as_bytes()).unwrap();
            let mut buf = [0u8; 65536];
            std::thread::sleep(std::time::Duration::from_millis(5));
            let n = c.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
            let got = String::from_utf8_lossy(&got);
            assert!(!got.contains("unknown command"), "{}: {got}", cmd.name);
            // Drain what a long reply left (COMMAND, COMMAND DOCS).
            c.set_nonblocking(true).unwrap();
            while c.read(&mut buf).is_ok_and(|n| n > 0) {}
            c.set_nonblocking(false).unwrap();
        }
    }

    /// The table is the supported-command list: docs/OPERATOR.md's gateway section names
    /// every command (and subcommand) it serves.
    #[test]
    fn the_operator_guide_lists_every_command_served() {
        let guide = include_str!("../../../docs/OPERATOR.md");
        let start = guide.find("## The RESP gateway").unwrap();
        let end = guide[start..].find("\n## Runbooks").unwrap() + start;
        let section = &guide[start..end];
        let words: std::collections::HashSet<&str> = section
            .split(|c: char| !c.is_ascii_alphanumeric())
            .collect();
        for c in commands::COMMANDS {
            let name = c.name.rsplit('|').next().unwrap().to_ascii_uppercase();
            assert!(
                words.contains(name.as_str()),
                "docs/OPERATOR.md does not name {}",
                c.name
            );
        }
    }

    /// Every command of the table with arguments drawn from a pool of awkward ones (extreme
    /// numbers, options in the wrong places, empty and binary strings): each gets a reply and
    /// the connection stays up (nothing panics).
    #[test]
    fn awkward_arguments_get_replies_never_a_panic() {
        let s = server();
        let pool: [&[u8]; 34] = [
            b"",
            b"0",
            b"-1",
            b"1",
            b"2",
            b"9223372036854775807",
            b"-9223372036854775808",
            b"99999999999999999999",
            b"abc",
            b"EX",
            b"PX",
            b"EXAT",
            b"PXAT",
            b"KEEPTTL",
            b"NX",
            b"XX",
            b"GT",
            b"LT",
            b"GET",
            b"PERSIST",
            b"REPLACE",
            b"DB",
            b"MATCH",
            b"COUNT",
            b"TYPE",
            b"*",
            b"k",
            b"k2",
            b"1.5",
            b"inf",
            b"nan",
            b"\x00\xff",
            b"[",
            b"\\",
        ];
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as usize % n
        };
        let mut i = 0;
        for cmd in commands::COMMANDS {
            let words: Vec<&str> = cmd.name.split('|').collect();
            if words[0] == "quit" {
                continue;
            }
            for _ in 0..40 {
                let mut args: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
                for _ in 0..next(7) {
                    args.push(pool[next(pool.len())]);
                }
                let marker = format!("mk{i}");
                i += 1;
                let mut req = format!("*{}\r\n", args.len()).into_bytes();
                for a in &args {
                    req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                    req.extend_from_slice(a);
                    req.extend_from_slice(b"\r\n");
                }
                // Out of any transaction the command opened, then a marker to wait for.
                req.extend_from_slice(format!("DISCARD\r\nECHO {marker}\r\n").as_bytes());
                c.write_all(&req).unwrap();
                let mut got = Vec::new();
                let mut buf = [0u8; 65536];
                let want = format!("{marker}\r\n");
                while !got.ends_with(want.as_bytes()) {
                    let n = c.read(&mut buf).unwrap_or(0);
                    assert!(
                        n > 0,
                        "{args:?}: the connection closed after {:?}",
                        String::from_utf8_lossy(&got)
                    );
                    got.extend_from_slice(&buf[..n]);
                }
                assert!(
                    !String::from_utf8_lossy(&got).contains("shutting down"),
                    "{args:?}: the dispatcher is gone"
                );
            }
        }
        // The commands on keys still run (the dispatcher did not die with one of them).
        roundtrip(&s, b"SET after ok\r\nGET after\r\n", b"+OK\r\n$2\r\nok\r\n");
    }

    #[test]
    fn floats_print_as_redis_prints_everyday_decimals() {
        for (v, want) in [
            (0.2 + 0.1, "0.3"),
            (1000.3, "1000.3"),
            (0.1 + 0.7, "0.8"),
            (10.5 + 0.1, "10.6"),
            (11.0, "11"),
            (-2.5, "-2.5"),
            (1e20, "100000000000000000000"),
            (3.0e-7, "0.0000003"),
        ] {
            assert_eq!(float_text(v), want, "{v}");
        }
    }

    #[test]
    fn globs_match_as_redis_does() {
        for (p, s, want) in [
            ("*", "", true),
            ("user:*", "user:1", true),
            ("user:?", "user:12", false),
            ("h[ae]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-c]llo", "hbllo", true),
            ("h[a-c]llo", "hdllo", false),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hello", false),
            (
                "*a*a*a*a*a*a*a*a*b",
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                false,
            ),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyyd", false),
            ("[", "x", false),
        ] {
            assert_eq!(glob_match(p.as_bytes(), s.as_bytes()), want, "{p} {s}");
        }
    }

    #[test]
    fn a_transaction_applies_whole_or_not_at_all() {
        let s = server();
        roundtrip(
            &s,
            // One key: applied as one step (the block sees its own writes). Two keys:
            // discarded, nothing applied. A refused command (arity) discards the block too.
            // Then the misuse errors.
            b"MULTI\r\nSET a 1\r\nINCR a\r\nGET a\r\nEXEC\r\nMULTI\r\nSET b 1\r\nSET c 1\r\nEXEC\r\nMGET a b c\r\n\
              MULTI\r\nGET\r\nEXEC\r\nMULTI\r\nMULTI\r\nWATCH a\r\nDISCARD\r\nEXEC\r\nDISCARD\r\nWATCH a b\r\nMULTI\r\nEXEC\r\n\
              MULTI\r\nDEL a\r\nPING\r\nEXEC\r\nEXISTS a\r\n",
            b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n:2\r\n$1\r\n2\r\n\
              +OK\r\n+QUEUED\r\n+QUEUED\r\n\
              -EXECABORT Transaction discarded: it touches 2 keys, and this store makes a transaction one atomic step only on one key (nothing was applied; send the commands without MULTI, e.g. a non-transactional pipeline)\r\n\
              *3\r\n$1\r\n2\r\n$-1\r\n$-1\r\n\
              +OK\r\n-ERR wrong number of arguments for 'get' command\r\n-EXECABORT Transaction discarded because of previous errors.\r\n\
              +OK\r\n-ERR MULTI calls can not be nested\r\n-ERR WATCH inside MULTI is not allowed\r\n+OK\r\n\
              -ERR EXEC without MULTI\r\n-ERR DISCARD without MULTI\r\n\
              -ERR WATCH of several keys is not supported by this store (a transaction is atomic on one key)\r\n\
              +OK\r\n*0\r\n\
              +OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1\r\n+PONG\r\n:0\r\n",
        );
    }

    /// Every form of a transaction over several keys is refused whole: nothing it would
    /// write is written, and the connection is out of the transaction (and its WATCH).
    #[test]
    fn a_transaction_over_several_keys_is_refused_and_applies_nothing() {
        let s = server();
        let abort = |n: usize| {
            format!(
                "-EXECABORT Transaction discarded: it touches {n} keys, and this store makes a \
                 transaction one atomic step only on one key (nothing was applied; send the \
                 commands without MULTI, e.g. a non-transactional pipeline)\r\n"
            )
        };
        let several = "-ERR WATCH of several keys is not supported by this store (a transaction \
                       is atomic on one key)\r\n";
        let previous = "-EXECABORT Transaction discarded because of previous errors.\r\n";
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        // Writes on two keys; one multi-key command; a delete of two keys that exist.
        roundtrip_on(
            &mut c,
            b"MULTI\r\nSET a 1\r\nSET b 2\r\nEXEC\r\nEXISTS a b\r\n\
              MULTI\r\nMSET a 1 b 2\r\nEXEC\r\nEXISTS a b\r\n\
              SET x 1\r\nSET y 1\r\nMULTI\r\nDEL x y\r\nEXEC\r\nEXISTS x y\r\n\
              MULTI\r\nINCR x\r\nGET y\r\nEXEC\r\nMGET x y\r\n\
              MULTI\r\nMSETNX m 1 n 2\r\nEXEC\r\nEXISTS m n\r\n",
            format!(
                "+OK\r\n+QUEUED\r\n+QUEUED\r\n{a2}:0\r\n\
                 +OK\r\n+QUEUED\r\n{a2}:0\r\n\
                 +OK\r\n+OK\r\n+OK\r\n+QUEUED\r\n{a2}:2\r\n\
                 +OK\r\n+QUEUED\r\n+QUEUED\r\n{a2}*2\r\n$1\r\n1\r\n$1\r\n1\r\n\
                 +OK\r\n+QUEUED\r\n{a2}:0\r\n",
                a2 = abort(2)
            )
            .as_bytes(),
        );
        // WATCH of one key and a block on another: refused, and the WATCH is gone after.
        roundtrip_on(
            &mut c,
            b"WATCH x\r\nMULTI\r\nSET z 1\r\nEXEC\r\nEXISTS z\r\nMULTI\r\nSET z 1\r\nEXEC\r\nDEL z\r\n",
            format!(
                "+OK\r\n+OK\r\n+QUEUED\r\n{a2}:0\r\n+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n:1\r\n",
                a2 = abort(2)
            )
            .as_bytes(),
        );
        // WATCH of several keys, at once or one after the other: refused at WATCH (the
        // first stays watched).
        roundtrip_on(
            &mut c,
            b"WATCH x y\r\nWATCH x\r\nWATCH y\r\nMULTI\r\nINCR x\r\nEXEC\r\n",
            format!("{several}+OK\r\n{several}+OK\r\n+QUEUED\r\n*1\r\n:2\r\n").as_bytes(),
        );
        // Commands over every key, or on the connection, inside MULTI: refused when queued,
        // and EXEC then discards the whole block.
        roundtrip_on(
            &mut c,
            b"MULTI\r\nSET x 9\r\nFLUSHDB\r\nEXEC\r\nGET x\r\n\
              MULTI\r\nSET x 9\r\nCLIENT SETNAME t\r\nEXEC\r\nGET x\r\nCLIENT GETNAME\r\n\
              MULTI\r\nSET x 9\r\nNOSUCH\r\nEXEC\r\nGET x\r\n\
              MULTI\r\nSET x 9\r\nUNWATCH\r\nEXEC\r\nGET x\r\n",
            format!(
                "+OK\r\n+QUEUED\r\n-ERR FLUSHDB inside MULTI is not supported by this store (a transaction is atomic on one key)\r\n{previous}$1\r\n2\r\n\
                 +OK\r\n+QUEUED\r\n-ERR CLIENT inside MULTI is not supported by this gateway (send it before MULTI or after EXEC)\r\n{previous}$1\r\n2\r\n$-1\r\n\
                 +OK\r\n+QUEUED\r\n-ERR unknown command 'NOSUCH', with args beginning with: \r\n{previous}$1\r\n2\r\n\
                 +OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n+OK\r\n$1\r\n9\r\n"
            )
            .as_bytes(),
        );
        // A command that fails as it runs in a one-key block: its error, the rest applied.
        roundtrip_on(
            &mut c,
            b"MULTI\r\nSET w abc\r\nINCR w\r\nAPPEND w d\r\nEXEC\r\nGET w\r\n",
            b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n\
              *3\r\n+OK\r\n-ERR value is not an integer or out of range\r\n:4\r\n$4\r\nabcd\r\n",
        );
        // MSETNX over several keys outside MULTI: refused, nothing set.
        roundtrip_on(
            &mut c,
            b"MSETNX p 1 q 2\r\nEXISTS p q\r\n",
            b"-ERR MSETNX over several keys cannot be one atomic step on this store (nothing was set): use SETNX key by key\r\n:0\r\n",
        );
    }

    /// One reply (simple, error, integer or bulk) from `r`, as its wire text.
    fn one_reply(r: &mut impl std::io::BufRead) -> String {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if let Some(n) = line
            .strip_prefix('$')
            .and_then(|n| n.trim().parse::<usize>().ok())
        {
            let mut body = vec![0u8; n + 2];
            r.read_exact(&mut body).unwrap();
            line.push_str(&String::from_utf8_lossy(&body));
        }
        line
    }

    /// The expiry commands and their options, with what redis-server 7.0 answered to the
    /// same commands (PTTL within 50 ms of it; COPY to DB 1 differs: this store has one
    /// database).
    #[test]
    fn expiry_commands_answer_as_redis_does() {
        let s = server();
        let c = TcpStream::connect(s.local_addr()).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut w = c.try_clone().unwrap();
        let mut r = std::io::BufReader::new(c);
        for (cmd, want) in [
            ("SET k v EX 100", "+OK\r\n"),
            ("TTL k", ":100\r\n"),
            ("PTTL k", ":100000\r\n"),
            ("SET k v PX 100000 GET", "$1\r\nv\r\n"),
            ("TTL k", ":100\r\n"),
            ("SET k v2 KEEPTTL", "+OK\r\n"),
            ("TTL k", ":100\r\n"),
            ("GET k", "$2\r\nv2\r\n"),
            ("SET k v3", "+OK\r\n"),
            ("TTL k", ":-1\r\n"),
            (
                "SET k v EX 0",
                "-ERR invalid expire time in 'set' command\r\n",
            ),
            (
                "SET k v EX -1",
                "-ERR invalid expire time in 'set' command\r\n",
            ),
            (
                "SET k v EX abc",
                "-ERR value is not an integer or out of range\r\n",
            ),
            ("SET k v EX 10 PX 100", "-ERR syntax error\r\n"),
            ("SET k v KEEPTTL EX 10", "-ERR syntax error\r\n"),
            ("SET k v EX", "-ERR syntax error\r\n"),
            ("SET k v EXAT 1", "+OK\r\n"),
            ("GET k", "$-1\r\n"),
            ("SET k v EXAT 99999999999", "+OK\r\n"),
            ("EXPIRETIME k", ":99999999999\r\n"),
            ("PEXPIRETIME k", ":99999999999000\r\n"),
            ("SET k v PXAT 99999999999000 NX", "$-1\r\n"),
            ("SET k v XX EX 50", "+OK\r\n"),
            ("TTL k", ":50\r\n"),
            ("SET k v NX NX", "$-1\r\n"),
            (
                "SET k v EX 9223372036854775807",
                "-ERR invalid expire time in 'set' command\r\n",
            ),
            (
                "SET k v PX 9223372036854775807",
                "-ERR invalid expire time in 'set' command\r\n",
            ),
            ("SETEX k 100 v", "+OK\r\n"),
            ("TTL k", ":100\r\n"),
            (
                "SETEX k 0 v",
                "-ERR invalid expire time in 'setex' command\r\n",
            ),
            (
                "SETEX k x v",
                "-ERR value is not an integer or out of range\r\n",
            ),
            ("PSETEX k 100000 v", "+OK\r\n"),
            ("TTL k", ":100\r\n"),
            (
                "PSETEX k -5 v",
                "-ERR invalid expire time in 'psetex' command\r\n",
            ),
            ("PERSIST k", ":1\r\n"),
            ("PERSIST k", ":0\r\n"),
            ("TTL k", ":-1\r\n"),
            ("PERSIST nokey", ":0\r\n"),
            ("TTL nokey", ":-2\r\n"),
            ("PTTL nokey", ":-2\r\n"),
            ("EXPIRETIME nokey", ":-2\r\n"),
            ("EXPIRE k 100", ":1\r\n"),
            ("EXPIRE k 100 NX", ":0\r\n"),
            ("EXPIRE k 200 XX", ":1\r\n"),
            ("TTL k", ":200\r\n"),
            ("EXPIRE k 50 GT", ":0\r\n"),
            ("EXPIRE k 300 GT", ":1\r\n"),
            ("TTL k", ":300\r\n"),
            ("EXPIRE k 500 LT", ":0\r\n"),
            ("EXPIRE k 100 LT", ":1\r\n"),
            ("TTL k", ":100\r\n"),
            ("PERSIST k", ":1\r\n"),
            ("EXPIRE k 100 XX", ":0\r\n"),
            ("EXPIRE k 100 GT", ":0\r\n"),
            ("EXPIRE k 100 LT", ":1\r\n"),
            ("TTL k", ":100\r\n"),
            (
                "EXPIRE k 100 NX XX",
                "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n",
            ),
            (
                "EXPIRE k 100 GT LT",
                "-ERR GT and LT options at the same time are not compatible\r\n",
            ),
            ("EXPIRE k 100 FOO", "-ERR Unsupported option FOO\r\n"),
            (
                "EXPIRE k abc",
                "-ERR value is not an integer or out of range\r\n",
            ),
            (
                "EXPIRE k 9223372036854775807",
                "-ERR invalid expire time in 'expire' command\r\n",
            ),
            ("EXPIRE nokey 100", ":0\r\n"),
            ("PEXPIRE k 100000", ":1\r\n"),
            ("PTTL k", ":99997\r\n"),
            ("EXPIREAT k 99999999999", ":1\r\n"),
            ("EXPIRETIME k", ":99999999999\r\n"),
            ("PEXPIREAT k 99999999999000", ":1\r\n"),
            ("PEXPIRETIME k", ":99999999999000\r\n"),
            ("EXPIRE k -1", ":1\r\n"),
            ("EXISTS k", ":0\r\n"),
            ("SET k v", "+OK\r\n"),
            ("EXPIREAT k 1", ":1\r\n"),
            ("EXISTS k", ":0\r\n"),
            ("SET k hello EX 100", "+OK\r\n"),
            ("GETEX k", "$5\r\nhello\r\n"),
            ("GETEX k PERSIST", "$5\r\nhello\r\n"),
            ("TTL k", ":-1\r\n"),
            ("GETEX k EX 200", "$5\r\nhello\r\n"),
            ("TTL k", ":200\r\n"),
            ("GETEX k PX 300000", "$5\r\nhello\r\n"),
            ("TTL k", ":300\r\n"),
            ("GETEX k EXAT 99999999999", "$5\r\nhello\r\n"),
            ("EXPIRETIME k", ":99999999999\r\n"),
            ("GETEX k PXAT 99999999999000", "$5\r\nhello\r\n"),
            (
                "GETEX k EX 0",
                "-ERR invalid expire time in 'getex' command\r\n",
            ),
            ("GETEX k EX 10 PX 10", "-ERR syntax error\r\n"),
            ("GETEX k KEEPTTL", "-ERR syntax error\r\n"),
            ("GETEX k NX", "-ERR syntax error\r\n"),
            ("GETEX nokey EX 10", "$-1\r\n"),
            ("GETEX k EXAT 1", "$5\r\nhello\r\n"),
            ("EXISTS k", ":0\r\n"),
            ("SET n 5 EX 100", "+OK\r\n"),
            ("INCR n", ":6\r\n"),
            ("TTL n", ":100\r\n"),
            ("APPEND n 1", ":2\r\n"),
            ("TTL n", ":100\r\n"),
            ("GETSET n 7", "$2\r\n61\r\n"),
            ("TTL n", ":-1\r\n"),
            ("SET s abc EX 100", "+OK\r\n"),
            ("SETRANGE s 1 X", ":3\r\n"),
            ("TTL s", ":100\r\n"),
            ("GETDEL s", "$3\r\naXc\r\n"),
            ("TTL s", ":-2\r\n"),
            ("SET a 1 EX 100", "+OK\r\n"),
            ("COPY a b", ":1\r\n"),
            ("TTL b", ":100\r\n"),
            ("GET b", "$1\r\n1\r\n"),
            ("COPY a b", ":0\r\n"),
            ("COPY a b REPLACE", ":1\r\n"),
            (
                "COPY a a",
                "-ERR source and destination objects are the same\r\n",
            ),
            ("COPY nokey c", ":0\r\n"),
            ("COPY a c DB 1", "-ERR DB index is out of range\r\n"),
            (
                "COPY a c DB x",
                "-ERR value is not an integer or out of range\r\n",
            ),
            ("COPY a c FOO", "-ERR syntax error\r\n"),
            ("COPY a c DB 0 REPLACE", ":1\r\n"),
            ("RENAME a r", "+OK\r\n"),
            ("EXISTS a", ":0\r\n"),
            ("GET r", "$1\r\n1\r\n"),
            ("TTL r", ":100\r\n"),
            ("RENAME nokey r2", "-ERR no such key\r\n"),
            ("RENAME r r", "+OK\r\n"),
            ("RENAMENX r r", ":0\r\n"),
            ("SET t 1", "+OK\r\n"),
            ("RENAMENX r t", ":0\r\n"),
            ("RENAMENX r t2", ":1\r\n"),
            ("GET t2", "$1\r\n1\r\n"),
            ("TOUCH t t2 nokey t", ":3\r\n"),
            ("OBJECT ENCODING t", "$3\r\nint\r\n"),
            ("SET e hello", "+OK\r\n"),
            ("OBJECT ENCODING e", "$6\r\nembstr\r\n"),
            ("SET e 01", "+OK\r\n"),
            ("OBJECT ENCODING e", "$6\r\nembstr\r\n"),
            ("SET e 123456789012345678901", "+OK\r\n"),
            ("OBJECT ENCODING e", "$6\r\nembstr\r\n"),
            (
                "SET e aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                "+OK\r\n",
            ),
            ("OBJECT ENCODING e", "$3\r\nraw\r\n"),
            ("OBJECT ENCODING nokey", "$-1\r\n"),
            (
                "OBJECT FOO e",
                "-ERR unknown subcommand 'FOO'. Try OBJECT HELP.\r\n",
            ),
            (
                "OBJECT ENCODING",
                "-ERR wrong number of arguments for 'object|encoding' command\r\n",
            ),
            (
                "TTL",
                "-ERR wrong number of arguments for 'ttl' command\r\n",
            ),
            (
                "SETEX k 10",
                "-ERR wrong number of arguments for 'setex' command\r\n",
            ),
        ] {
            w.write_all(format!("{cmd}\r\n").as_bytes()).unwrap();
            let got = one_reply(&mut r);
            if cmd.starts_with("PTTL") && want.starts_with(':') {
                let n = |t: &str| t[1..].trim().parse::<i64>().unwrap();
                let (g, e) = (n(&got), n(want));
                assert!((g - e).abs() < 50, "{cmd}: {got:?}, redis-server: {want:?}");
            } else {
                assert_eq!(got, want, "{cmd}");
            }
        }
    }

    /// Deadlines pass: the key reads as absent, and the background sweep deletes it.
    #[test]
    fn expired_keys_read_as_absent_and_the_sweep_deletes_them() {
        let b = Arc::new(MemoryBackend::default());
        let s = RespServer::start(
            "127.0.0.1:0",
            b.clone(),
            RespConfig {
                expiry_sweep: Some(std::time::Duration::from_millis(10)),
                ..RespConfig::default()
            },
        )
        .unwrap();
        roundtrip(
            &s,
            b"SET a 1 PX 50\r\nSET b 2 PX 50\r\nPSETEX c 50 3\r\nSET d 4\r\nDBSIZE\r\n",
            b"+OK\r\n+OK\r\n+OK\r\n+OK\r\n:4\r\n",
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
        // Nobody read a, b or c: the sweep took them.
        assert_eq!(b.map.lock().keys.len(), 1);
        roundtrip(
            &s,
            b"GET a\r\nEXISTS a b c d\r\nDBSIZE\r\nSETNX a new\r\nGET a\r\nTTL a\r\n",
            b"$-1\r\n:1\r\n:1\r\n:1\r\n$3\r\nnew\r\n:-1\r\n",
        );
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.write_all(b"INFO\r\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let mut buf = [0u8; 4096];
        let n = c.read(&mut buf).unwrap();
        let info = String::from_utf8_lossy(&buf[..n]);
        assert!(info.contains("expired_keys:3"), "{info}");
    }

    /// A transaction keeps the key's deadline, and WATCH sees a write of the same value (the
    /// version changed).
    #[test]
    fn transactions_keep_deadlines_and_watch_compares_versions() {
        let s = server();
        let mut other = TcpStream::connect(s.local_addr()).unwrap();
        let mut tx = TcpStream::connect(s.local_addr()).unwrap();
        roundtrip_on(
            &mut tx,
            b"SET k 1 EX 100\r\nMULTI\r\nINCR k\r\nTTL k\r\nEXPIRE k 200\r\nEXEC\r\nTTL k\r\nGET k\r\n",
            b"+OK\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n:2\r\n:100\r\n:1\r\n:200\r\n$1\r\n2\r\n",
        );
        roundtrip_on(&mut tx, b"WATCH k\r\n", b"+OK\r\n");
        // The same value written again: a change all the same.
        roundtrip_on(&mut other, b"SET k 2\r\n", b"+OK\r\n");
        roundtrip_on(
            &mut tx,
            b"MULTI\r\nGET k\r\nEXEC\r\n",
            b"+OK\r\n+QUEUED\r\n*-1\r\n",
        );
        roundtrip_on(
            &mut tx,
            b"MULTI\r\nSET k v PX 1\r\nEXEC\r\n",
            b"+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n",
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        roundtrip_on(&mut tx, b"EXISTS k\r\n", b":0\r\n");
    }

    /// A value over the store's maximum is refused before anything is written, on every
    /// path that writes one (MSET and MSETNX check every value first).
    #[test]
    fn values_over_the_maximum_are_refused_whole() {
        let s = RespServer::start(
            "127.0.0.1:0",
            Arc::new(MemoryBackend::with_max_value(8)),
            RespConfig::default(),
        )
        .unwrap();
        let big = "-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n";
        roundtrip(
            &s,
            b"SET k 123456789\r\nSETNX k 123456789\r\nSETEX k 10 123456789\r\nGETSET k 123456789\r\n\
              MSET a 1 b 123456789\r\nMSETNX a 123456789\r\nEXISTS k a b\r\n\
              SET k 12345678\r\nAPPEND k 9\r\nSETRANGE k 8 9\r\nSETRANGE k 7 9\r\nGET k\r\n",
            format!(
                "{big}{big}{big}{big}{big}{big}:0\r\n+OK\r\n{big}{big}:8\r\n$8\r\n12345679\r\n"
            )
            .as_bytes(),
        );
    }

    #[test]
    fn watch_aborts_exec_when_the_key_changed_and_applies_it_otherwise() {
        let s = server();
        let mut other = TcpStream::connect(s.local_addr()).unwrap();
        let mut tx = TcpStream::connect(s.local_addr()).unwrap();
        let mut buf = [0u8; 256];
        let mut say = |c: &mut TcpStream, what: &[u8]| {
            c.write_all(what).unwrap();
            let n = c.read(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        };
        assert_eq!(say(&mut tx, b"SET k 1\r\n"), "+OK\r\n");
        assert_eq!(say(&mut tx, b"WATCH k\r\n"), "+OK\r\n");
        assert_eq!(say(&mut other, b"SET k 5\r\n"), "+OK\r\n");
        assert_eq!(say(&mut tx, b"MULTI\r\n"), "+OK\r\n");
        assert_eq!(say(&mut tx, b"INCR k\r\n"), "+QUEUED\r\n");
        assert_eq!(say(&mut tx, b"EXEC\r\n"), "*-1\r\n", "aborted: k changed");
        assert_eq!(say(&mut tx, b"GET k\r\n"), "$1\r\n5\r\n");
        // Unchanged since WATCH: applied.
        assert_eq!(say(&mut tx, b"WATCH k\r\n"), "+OK\r\n");
        assert_eq!(say(&mut tx, b"MULTI\r\n"), "+OK\r\n");
        assert_eq!(say(&mut tx, b"INCR k\r\n"), "+QUEUED\r\n");
        assert_eq!(say(&mut tx, b"EXEC\r\n"), "*1\r\n:6\r\n");
        // EXEC forgets the WATCH: the next transaction is not aborted by an old change.
        assert_eq!(say(&mut other, b"SET k 9\r\n"), "+OK\r\n");
        assert_eq!(say(&mut tx, b"MULTI\r\n"), "+OK\r\n");
        assert_eq!(say(&mut tx, b"INCR k\r\n"), "+QUEUED\r\n");
        assert_eq!(say(&mut tx, b"EXEC\r\n"), "*1\r\n:10\r\n");
    }

    #[test]
    fn read_modify_write_commands_answer_as_redis_does() {
        let s = server();
        roundtrip(
            &s,
            b"INCR n\r\nINCRBY n 10\r\nDECR n\r\nDECRBY n 3\r\nINCRBYFLOAT n 0.5\r\nINCR n\r\n\
              SET big 9223372036854775807\r\nINCR big\r\nINCRBY n x\r\n\
              APPEND s ab\r\nAPPEND s cd\r\nSTRLEN s\r\nGETRANGE s 1 -2\r\nGETRANGE s -100 100\r\n\
              SETRANGE s 6 Z\r\nGET s\r\nSETRANGE s -1 x\r\n\
              GETSET s new\r\nSET s newer GET\r\nSET nokey v NX GET\r\nGET nokey\r\n\
              GETDEL s\r\nGETDEL s\r\nEXISTS s\r\nMSETNX m1 1\r\nMSETNX m1 2\r\nMSETNX a 1 b 2\r\nEXISTS a\r\n",
            b":1\r\n:11\r\n:10\r\n:7\r\n$3\r\n7.5\r\n-ERR value is not an integer or out of range\r\n\
              +OK\r\n-ERR increment or decrement would overflow\r\n-ERR value is not an integer or out of range\r\n\
              :2\r\n:4\r\n:4\r\n$2\r\nbc\r\n$4\r\nabcd\r\n\
              :7\r\n$7\r\nabcd\x00\x00Z\r\n-ERR offset is out of range\r\n\
              $7\r\nabcd\x00\x00Z\r\n$3\r\nnew\r\n$-1\r\n$1\r\nv\r\n\
              $5\r\nnewer\r\n$-1\r\n:0\r\n:1\r\n:0\r\n\
              -ERR MSETNX over several keys cannot be one atomic step on this store (nothing was set): use SETNX key by key\r\n:0\r\n",
        );
    }

    #[test]
    fn concurrent_increments_lose_none() {
        let s = server();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let addr = s.local_addr();
                std::thread::spawn(move || {
                    let mut c = TcpStream::connect(addr).unwrap();
                    let mut buf = [0u8; 64];
                    for _ in 0..50 {
                        c.write_all(b"INCR counter\r\n").unwrap();
                        let n = c.read(&mut buf).unwrap();
                        assert_eq!(buf[0], b':', "{:?}", &buf[..n]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        roundtrip(&s, b"GET counter\r\n", b"$3\r\n200\r\n");
    }

    #[test]
    fn commands_over_every_key() {
        let s = server();
        roundtrip(
            &s,
            b"MSET user:1 a user:2 b other c\r\nDBSIZE\r\nTYPE user:1\r\nTYPE nope\r\n\
              MULTI\r\nKEYS *\r\nDISCARD\r\nEXISTS user:1\r\n\
              SCAN 0 MATCH other\r\nSCAN 0 TYPE hash\r\nSCAN x\r\nFLUSHDB\r\nDBSIZE\r\nRANDOMKEY\r\n",
            b"+OK\r\n:3\r\n+string\r\n+none\r\n\
              +OK\r\n-ERR KEYS inside MULTI is not supported by this store (a transaction is atomic on one key)\r\n+OK\r\n:1\r\n\
              *2\r\n$1\r\n0\r\n*1\r\n$5\r\nother\r\n*2\r\n$1\r\n0\r\n*0\r\n-ERR invalid cursor\r\n\
              +OK\r\n:0\r\n$-1\r\n",
        );
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.write_all(b"MSET user:1 a user:2 b other c\r\nKEYS user:*\r\n")
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut buf = [0u8; 256];
        let n = c.read(&mut buf).unwrap();
        let got = String::from_utf8_lossy(&buf[..n]);
        assert!(got.starts_with("+OK\r\n*2\r\n"), "{got}");
        assert!(got.contains("user:1") && got.contains("user:2") && !got.contains("other"));
    }

    #[test]
    fn with_a_password_nothing_runs_before_auth() {
        let s = RespServer::start(
            "127.0.0.1:0",
            Arc::new(MemoryBackend::default()),
            RespConfig {
                password: Some(b"s3cret".to_vec()),
                ..RespConfig::default()
            },
        )
        .unwrap();
        roundtrip(
            &s,
            b"SET a 1\r\nPING\r\nHELLO 3\r\nAUTH wrong\r\nAUTH bob s3cret\r\nAUTH s3cret\r\nSET a 1\r\nGET a\r\nRESET\r\nGET a\r\n",
            b"-NOAUTH Authentication required.\r\n-NOAUTH Authentication required.\r\n\
              -NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n\
              -WRONGPASS invalid username-password pair or user is disabled.\r\n\
              -WRONGPASS invalid username-password pair or user is disabled.\r\n\
              +OK\r\n+OK\r\n$1\r\n1\r\n+RESET\r\n-NOAUTH Authentication required.\r\n",
        );
        roundtrip(
            &s,
            b"HELLO 2 AUTH default s3cret\r\nGET a\r\n",
            b"*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:2\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n$1\r\n1\r\n",
        );
    }

    #[test]
    fn passwords_compare_whole() {
        assert!(same(b"secret-of-16-bytes", b"secret-of-16-bytes"));
        for wrong in [
            &b""[..],
            b"s",
            b"secret-of-16-byte",
            b"secret-of-16-bytess",
            b"secret-of-16-bytesecret-of-16-bytes",
            b"Secret-of-16-bytes",
        ] {
            assert!(!same(b"secret-of-16-bytes", wrong), "{wrong:?}");
        }
        assert!(!same(b"", b"x"));
        assert!(same(b"", b""));
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

    /// The in-memory map behind a slow network: every call takes `delay` and says it blocks.
    struct Slow {
        map: MemoryBackend,
        delay: std::time::Duration,
        running: AtomicUsize,
        most: AtomicUsize,
    }

    impl Slow {
        fn call<T>(&self, f: impl FnOnce(&MemoryBackend) -> T) -> T {
            let n = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(self.delay);
            let r = f(&self.map);
            self.running.fetch_sub(1, Ordering::SeqCst);
            r
        }
    }

    impl KvBackend for Slow {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
            self.call(|m| m.get(key))
        }
        fn put(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool, String> {
            self.call(|m| m.put(key, value, mode))
        }
        fn delete(&self, key: &[u8]) -> Result<bool, String> {
            self.call(|m| m.delete(key))
        }
    }

    fn slow_server(delay_ms: u64) -> (RespServer, Arc<Slow>) {
        let b = Arc::new(Slow {
            map: MemoryBackend::default(),
            delay: std::time::Duration::from_millis(delay_ms),
            running: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        });
        let s = RespServer::start("127.0.0.1:0", b.clone(), RespConfig::default()).unwrap();
        (s, b)
    }

    #[test]
    fn a_pipeline_on_a_blocking_backend_keeps_order_and_sees_its_own_writes() {
        let (s, _) = slow_server(2);
        roundtrip(
            &s,
            b"SET a 1\r\nGET a\r\nSET a 2\r\nGET a\r\nSET b x\r\nMSET a 3 b y\r\nMGET a b\r\nDEL a\r\nEXISTS a b\r\nPING\r\nGET a\r\n",
            b"+OK\r\n$1\r\n1\r\n+OK\r\n$1\r\n2\r\n+OK\r\n+OK\r\n*2\r\n$1\r\n3\r\n$1\r\ny\r\n:1\r\n:1\r\n+PONG\r\n$-1\r\n",
        );
    }

    #[test]
    fn pipelined_commands_on_distinct_keys_run_concurrently() {
        let (s, b) = slow_server(20);
        let mut input = Vec::new();
        let mut expect = Vec::new();
        for i in 0..40 {
            input.extend_from_slice(format!("SET k{i} v{i}\r\n").as_bytes());
            expect.extend_from_slice(b"+OK\r\n");
        }
        for i in 0..40 {
            input.extend_from_slice(format!("GET k{i}\r\n").as_bytes());
            let v = format!("v{i}");
            expect.extend_from_slice(format!("${}\r\n{v}\r\n", v.len()).as_bytes());
        }
        let t = Instant::now();
        roundtrip(&s, &input, &expect);
        // 80 calls of 20 ms one after another would take 1.6 s.
        assert!(
            b.most.load(Ordering::SeqCst) > 1,
            "commands never overlapped"
        );
        assert!(
            t.elapsed() < std::time::Duration::from_millis(1200),
            "{:?}",
            t.elapsed()
        );
    }

    /// Threads of this process now.
    fn threads() -> usize {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:").map(|n| n.trim().parse().ok()))
            })
            .flatten()
            .unwrap_or(0)
    }

    #[test]
    fn idle_connections_cost_no_threads() {
        let (s, _) = slow_server(0);
        roundtrip(&s, b"PING\r\n", b"+PONG\r\n");
        let before = threads();
        let conns: Vec<_> = (0..1000)
            .map(|_| TcpStream::connect(s.local_addr()).unwrap())
            .collect();
        let t = Instant::now();
        while s.clients() < 1000 && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(s.clients(), 1000);
        // Other tests of this binary may start threads meanwhile: allow a few, not 1000.
        assert!(threads() < before + 50, "{before} -> {} threads", threads());
        roundtrip(&s, b"PING\r\n", b"+PONG\r\n");
        drop(conns);
        let t = Instant::now();
        while s.clients() > 0 && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(s.clients(), 0, "closed connections are forgotten");
    }

    #[test]
    fn a_client_dropping_mid_pipeline_leaves_the_others_served() {
        let (s, b) = slow_server(5);
        {
            let mut c = TcpStream::connect(s.local_addr()).unwrap();
            let mut input = Vec::new();
            for i in 0..100 {
                input.extend_from_slice(format!("SET gone{i} v\r\nGET gone{i}\r\n").as_bytes());
            }
            c.write_all(&input).unwrap();
            // Gone before any reply.
        }
        roundtrip(&s, b"SET k v\r\nGET k\r\n", b"+OK\r\n$1\r\nv\r\n");
        let t = Instant::now();
        while (s.clients() > 0 || b.running.load(Ordering::SeqCst) > 0)
            && t.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(s.clients(), 0, "the dropped connection is forgotten");
        assert_eq!(
            b.running.load(Ordering::SeqCst),
            0,
            "no backend call is left running"
        );
    }
}
