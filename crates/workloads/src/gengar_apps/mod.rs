//! Real workloads on Gengar, written against [`GengarClient`]'s public API only: a hash-table
//! key-value store driven by YCSB ([`kv`]), a MapReduce job — TeraGen-style generation, then
//! WordCount — ([`wordcount`]) and PageRank over an R-MAT graph whose CSR arrays live in the
//! pool ([`pagerank`]).
//!
//! Every app runs as a sequence of *phases* on several worker clients (one thread each) through
//! a [`Runner`], and checks its result against a single-process computation of the same job,
//! failing with [`AppError::Mismatch`] when they differ. A [`Deployment`] starts the servers
//! in-process on `sim` (optionally with the virtual-time latency model), `tcp`, or `rdma`
//! (with this crate's `rdma` feature: served by `RdmaServer` on the first active RDMA
//! device's address, every client connected through rdma-cm).
//!
//! Timing: each phase's *wall* time is measured; its *modeled* time (sim with a latency model)
//! is the largest advance of a worker endpoint's virtual clock during the phase. Workers' clocks
//! are independent; a barrier between phases is modeled by summing the phases' makespans.
//! Modeled time covers the network and the memory media only, not the CPU work of the app.
//!
//! ```
//! use dmkit_workloads::gengar_apps::{Deployment, DeploymentConfig, WriteMode, pagerank};
//!
//! let d = Deployment::sim(&DeploymentConfig::default(), false).unwrap();
//! let cfg = pagerank::PageRankConfig { scale: 8, iterations: 3, ..Default::default() };
//! let out = pagerank::run(&d, 2, WriteMode::Proxied, &cfg).unwrap();
//! assert!(out.phases.iter().any(|p| p.name == "iterate-0"));
//! ```

pub mod kv;
pub mod micro;
pub mod pagerank;
pub mod wordcount;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dmkit_gengar::{ClientConfig, GengarClient, GengarServer, GlobalAddr, ServerConfig};
use dmkit_lease::{Clock, SystemClock};
use dmkit_pmem_pool::{DramMedium, Medium, MediumKind, Pool, PoolOptions};
use dmkit_verbs::sim::{LatencyModel, SimCluster, SimConfig};
use dmkit_verbs::tcp::{TcpConnector, TcpServer, TcpServerConfig};
use dmkit_verbs::{Endpoint, NodeId};

/// What can go wrong running an app.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Gengar(#[from] dmkit_gengar::Error),
    #[error("setup: {0}")]
    Setup(String),
    /// The pool's result differs from the single-process computation.
    #[error("result mismatch: {0}")]
    Mismatch(String),
    /// Data read from the pool does not decode.
    #[error("corrupt data in the pool: {0}")]
    Corrupt(String),
    #[error("a worker thread panicked")]
    Panicked,
}

pub type AppResult<T> = Result<T, AppError>;

/// How the apps write: synchronously (each write returns when NVM has it) or proxied (returns
/// once posted; each worker flushes at the end of every phase, and before unlocking).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    Sync,
    Proxied,
}

/// A worker's view: its client and the write mode.
#[derive(Debug)]
pub struct Worker<'a> {
    pub client: &'a GengarClient,
    pub mode: WriteMode,
    /// Index of this worker among the phase's workers.
    pub index: usize,
    pub workers: usize,
}

impl Worker<'_> {
    /// Writes in the configured mode.
    pub fn write(&self, addr: GlobalAddr, at: usize, data: &[u8]) -> AppResult<()> {
        match self.mode {
            WriteMode::Sync => self.client.write(addr, at, data)?,
            WriteMode::Proxied => {
                self.client.write_proxied(addr, at, data)?;
            }
        }
        Ok(())
    }

    /// Waits until every write of this worker is complete (a no-op for synchronous writes).
    pub fn sync(&self) -> AppResult<()> {
        if self.mode == WriteMode::Proxied {
            self.client.flush()?;
        }
        Ok(())
    }
}

/// The time one phase took.
#[derive(Debug, Clone)]
pub struct PhaseTime {
    pub name: String,
    /// The largest virtual-clock advance of a worker (zero without a latency model).
    pub modeled: Duration,
    pub wall: Duration,
}

/// What an app run reports: its phases, in order.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub phases: Vec<PhaseTime>,
    /// Operations of the timed part (app-specific: KV ops, records, edges × iterations).
    pub ops: u64,
    /// Round trips of every worker, all Gengar operations together.
    pub round_trips: u64,
    /// App-specific notes for the report (e.g. objects promoted).
    pub notes: Vec<(String, String)>,
}

impl Outcome {
    /// Modeled and wall time of the phases whose names start with `prefix` ("" for all).
    pub fn time(&self, prefix: &str) -> (Duration, Duration) {
        self.phases
            .iter()
            .filter(|p| p.name.starts_with(prefix))
            .fold((Duration::ZERO, Duration::ZERO), |(m, w), p| {
                (m + p.modeled, w + p.wall)
            })
    }
}

/// Runs phases on worker clients in parallel and records their times. Between phases each
/// client reports its hot objects and the servers run a hot-object window.
#[derive(Debug)]
pub struct Runner<'a> {
    pub deployment: &'a Deployment,
    pub clients: Vec<GengarClient>,
    pub mode: WriteMode,
    pub phases: Vec<PhaseTime>,
}

impl<'a> Runner<'a> {
    /// `workers` new clients on `d`.
    pub fn new(d: &'a Deployment, workers: usize, mode: WriteMode) -> AppResult<Self> {
        Ok(Self {
            deployment: d,
            clients: (0..workers.max(1))
                .map(|_| d.client())
                .collect::<AppResult<_>>()?,
            mode,
            phases: Vec::new(),
        })
    }

    /// Runs `f` on every worker at once (each flushes its writes at the end) and records the
    /// phase under `name` (phases of the same name add up).
    pub fn phase<T: Send>(
        &mut self,
        name: &str,
        f: impl Fn(&Worker<'_>) -> AppResult<T> + Sync,
    ) -> AppResult<Vec<T>> {
        let starts: Vec<Duration> = self
            .clients
            .iter()
            .map(|c| c.endpoint().virtual_now())
            .collect();
        let t0 = Instant::now();
        let (mode, n, f) = (self.mode, self.clients.len(), &f);
        let results: Vec<AppResult<T>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .clients
                .iter()
                .enumerate()
                .map(|(index, client)| {
                    s.spawn(move || {
                        let w = Worker {
                            client,
                            mode,
                            index,
                            workers: n,
                        };
                        let r = f(&w)?;
                        w.sync()?;
                        Ok(r)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(AppError::Panicked)))
                .collect()
        });
        let wall = t0.elapsed();
        let modeled = self
            .clients
            .iter()
            .zip(&starts)
            .map(|(c, s)| c.endpoint().virtual_now().saturating_sub(*s))
            .max()
            .unwrap_or_default();
        match self.phases.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                p.modeled += modeled;
                p.wall += wall;
            }
            None => self.phases.push(PhaseTime {
                name: name.to_string(),
                modeled,
                wall,
            }),
        }
        let out = results.into_iter().collect::<AppResult<Vec<T>>>()?;
        for c in &self.clients {
            c.report_hot()?;
        }
        self.deployment.run_windows();
        Ok(out)
    }

    /// The recorded phases as an outcome.
    pub fn outcome(&self, ops: u64) -> Outcome {
        use dmkit_gengar::tags;
        let round_trips = self
            .clients
            .iter()
            .map(|c| {
                let s = c.endpoint().stats();
                [
                    tags::READ,
                    tags::WRITE,
                    tags::ALLOC,
                    tags::FREE,
                    tags::LOCK,
                    tags::REPORT,
                ]
                .iter()
                .map(|t| s.tag(t).round_trips)
                .sum::<u64>()
            })
            .sum();
        Outcome {
            phases: self.phases.clone(),
            ops,
            round_trips,
            notes: Vec::new(),
        }
    }
}

/// Where and how to start the Gengar servers.
#[derive(Debug, Clone)]
pub struct DeploymentConfig {
    pub servers: u16,
    /// NVM pool bytes per server.
    pub nvm_bytes: usize,
    pub server: ServerConfig,
    pub client: ClientConfig,
}

impl Default for DeploymentConfig {
    fn default() -> Self {
        Self {
            servers: 2,
            nvm_bytes: 64 << 20,
            server: ServerConfig::default(),
            client: ClientConfig::default(),
        }
    }
}

/// Gengar servers started in this process, served over sim or tcp, and a client factory.
#[derive(Debug)]
pub struct Deployment {
    pub servers: Vec<Arc<GengarServer>>,
    sim: Option<SimCluster>,
    tcp: Vec<TcpServer>,
    #[cfg(feature = "rdma")]
    rdma: Option<(
        dmkit_verbs::rdma::RdmaConfig,
        Vec<dmkit_verbs::rdma::RdmaServer>,
    )>,
    clock: Arc<dyn Clock>,
    client_cfg: ClientConfig,
    next_client: AtomicU64,
}

fn setup(e: impl std::fmt::Display) -> AppError {
    AppError::Setup(e.to_string())
}

impl Deployment {
    fn servers(
        cfg: &DeploymentConfig,
        clock: &Arc<dyn Clock>,
    ) -> AppResult<Vec<Arc<GengarServer>>> {
        (0..cfg.servers)
            .map(|i| {
                let medium = EmulatedNvm(DramMedium::new(cfg.nvm_bytes).map_err(setup)?);
                let nvm = Pool::create_on(
                    Box::new(medium),
                    PoolOptions::default().block_size(64 << 10),
                )
                .map_err(setup)?;
                Ok(GengarServer::new(
                    NodeId(i),
                    nvm,
                    cfg.server.clone(),
                    clock.clone(),
                )?)
            })
            .collect()
    }

    /// Servers on the sim backend; `modeled` turns on the default latency model (virtual time).
    pub fn sim(cfg: &DeploymentConfig, modeled: bool) -> AppResult<Self> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let sim = SimCluster::new(SimConfig {
            latency: modeled.then(LatencyModel::default),
            timeout: Duration::from_secs(30),
            ..SimConfig::default()
        });
        let servers = Self::servers(cfg, &clock)?;
        for s in &servers {
            sim.add_node(s.node().clone());
        }
        Ok(Self {
            servers,
            sim: Some(sim),
            tcp: Vec::new(),
            #[cfg(feature = "rdma")]
            rdma: None,
            clock,
            // The latency model charges the writer for posting: no proxy thread on sim (its
            // hand-over would take the write out of the writer's modeled time altogether).
            client_cfg: ClientConfig {
                proxy_thread: false,
                ..cfg.client.clone()
            },
            next_client: AtomicU64::new(1),
        })
    }

    /// Servers behind tcp listeners on loopback (wall time is real).
    pub fn tcp(cfg: &DeploymentConfig) -> AppResult<Self> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let servers = Self::servers(cfg, &clock)?;
        let tcp = servers
            .iter()
            .map(|s| {
                TcpServer::start("127.0.0.1:0", s.node().clone(), TcpServerConfig::default())
                    .map_err(setup)
            })
            .collect::<AppResult<Vec<_>>>()?;
        Ok(Self {
            servers,
            sim: None,
            tcp,
            #[cfg(feature = "rdma")]
            rdma: None,
            clock,
            client_cfg: cfg.client.clone(),
            next_client: AtomicU64::new(1),
        })
    }

    /// Servers behind `RdmaServer`s on the first active RDMA device's IPv4 address (the
    /// `DMKIT_RDMA_*` settings apply); clients connect through rdma-cm. Wall time is real.
    #[cfg(feature = "rdma")]
    pub fn rdma(cfg: &DeploymentConfig) -> AppResult<Self> {
        use dmkit_verbs::rdma::{RdmaConfig, RdmaServer, first_active_device};
        let rcfg = RdmaConfig::from_env().map_err(setup)?;
        let info = first_active_device().map_err(setup)?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let servers = Self::servers(cfg, &clock)?;
        let rdma = servers
            .iter()
            .map(|s| {
                RdmaServer::start(&format!("{}:0", info.ipv4), s.node().clone(), rcfg.clone())
                    .map_err(setup)
            })
            .collect::<AppResult<Vec<_>>>()?;
        Ok(Self {
            servers,
            sim: None,
            tcp: Vec::new(),
            rdma: Some((rcfg, rdma)),
            clock,
            client_cfg: cfg.client.clone(),
            next_client: AtomicU64::new(1),
        })
    }

    /// The RDMA device and address the servers listen on (rdma deployments only).
    #[cfg(feature = "rdma")]
    pub fn rdma_addrs(&self) -> Option<Vec<String>> {
        self.rdma
            .as_ref()
            .map(|(_, servers)| servers.iter().map(|s| s.local_addr().to_string()).collect())
    }

    /// A new client with a fresh id (and, on sim, its own virtual clock).
    pub fn client(&self) -> AppResult<GengarClient> {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "rdma")]
        if let Some((cfg, servers)) = &self.rdma {
            let nodes: Vec<_> = servers
                .iter()
                .map(|s| (s.node().id(), s.local_addr().to_string()))
                .collect();
            let c = dmkit_verbs::rdma::RdmaConnector::new(cfg.clone());
            let ep = Endpoint::connect(&c, &nodes).map_err(setup)?;
            return Ok(GengarClient::new(
                ep,
                id,
                self.client_cfg.clone(),
                self.clock.clone(),
            )?);
        }
        let ep = match &self.sim {
            Some(sim) => sim.endpoint(id).map_err(setup)?,
            None => {
                let nodes: Vec<_> = self
                    .tcp
                    .iter()
                    .map(|t| (t.node().id(), t.local_addr().to_string()))
                    .collect();
                Endpoint::connect(&TcpConnector::default(), &nodes).map_err(setup)?
            }
        };
        Ok(GengarClient::new(
            ep,
            id,
            self.client_cfg.clone(),
            self.clock.clone(),
        )?)
    }

    /// One hot-object window on every server; (promoted, evicted) in all.
    pub fn run_windows(&self) -> (usize, usize) {
        self.servers.iter().fold((0, 0), |(p, e), s| {
            let (a, b) = s.run_window();
            (p + a, e + b)
        })
    }

    /// Promotions so far on every server.
    pub fn promotions(&self) -> u64 {
        self.servers
            .iter()
            .map(|s| s.stats().promotions.load(Ordering::Relaxed))
            .sum()
    }
}

/// `cfg` with every lease duration `k` times longer: the tuner's bounds and starting points,
/// the lease table's cap and the clock-skew allowance. Gengar's defaults suit round trips of
/// microseconds (a hot NVM object settles near 0.3 ms); where a round trip — above all a
/// two-sided lease RPC, which wakes server threads — takes a millisecond (SoftRoCE under
/// emulation), leases that short lapse between two accesses and every access pays the RPC.
pub fn scaled_leases(mut cfg: ServerConfig, k: u32) -> ServerConfig {
    let t = &mut cfg.tuner;
    t.min *= k;
    t.max *= k;
    t.initial_nvm *= k;
    t.initial_dram *= k;
    cfg.lease.max_duration *= k;
    cfg.lease.skew *= k;
    cfg
}

/// Memory standing in for NVM: the servers' pools are DRAM that reports itself persistent, so
/// verbs registers it as NVM and the sim latency model charges NVM costs (persisting is a
/// no-op; nothing here needs to survive the process).
#[derive(Debug)]
pub struct EmulatedNvm(pub DramMedium);

impl Medium for EmulatedNvm {
    fn kind(&self) -> MediumKind {
        self.0.kind()
    }
    fn location(&self) -> String {
        "<emulated nvm>".into()
    }
    fn path(&self) -> Option<&std::path::Path> {
        None
    }
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn is_persistent(&self) -> bool {
        true
    }
    fn load_u64(&self, offset: usize) -> u64 {
        self.0.load_u64(offset)
    }
    fn store_u64(&self, offset: usize, value: u64) {
        self.0.store_u64(offset, value)
    }
    fn read(&self, offset: usize, buf: &mut [u8]) {
        self.0.read(offset, buf)
    }
    fn write(&self, offset: usize, data: &[u8]) {
        self.0.write(offset, data)
    }
    fn persist(&self, offset: usize, len: usize) -> dmkit_pmem_pool::Result<()> {
        self.0.persist(offset, len)
    }
}

/// The largest payload that fills a 32 KiB slot of the pool exactly (the slot holds an 8-byte
/// header): arrays are split into objects of this many bytes.
pub const CHUNK_BYTES: usize = (32 << 10) - 8;

/// A fixed-width array of `len` elements of `width` bytes, split into objects of at most
/// [`CHUNK_BYTES`] bytes (whole elements each).
#[derive(Debug, Clone)]
pub struct ChunkedArray {
    pub chunks: Vec<GlobalAddr>,
    pub len: usize,
    pub width: usize,
}

impl ChunkedArray {
    pub fn per_chunk(width: usize) -> usize {
        CHUNK_BYTES / width
    }

    /// Allocates the objects (zero-filled).
    pub fn alloc(c: &GengarClient, len: usize, width: usize) -> AppResult<Self> {
        let per = Self::per_chunk(width);
        let chunks = (0..len.div_ceil(per))
            .map(|i| Ok(c.alloc((len - i * per).min(per) * width)?))
            .collect::<AppResult<_>>()?;
        Ok(Self { chunks, len, width })
    }

    /// The chunks covering elements `range`, as (chunk, byte offset in it, byte length,
    /// element index of the first).
    pub fn pieces(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (GlobalAddr, usize, usize, usize)> + '_ {
        let per = Self::per_chunk(self.width);
        let (lo, hi) = (range.start, range.end.min(self.len));
        let first = lo / per;
        let last = if hi > lo { (hi - 1) / per + 1 } else { first };
        (first..last).map(move |ci| {
            let a = lo.max(ci * per);
            let b = hi.min((ci + 1) * per);
            (
                self.chunks[ci],
                (a - ci * per) * self.width,
                (b - a) * self.width,
                a,
            )
        })
    }

    /// Reads elements `range` as raw bytes (one read per chunk).
    pub fn read(&self, c: &GengarClient, range: std::ops::Range<usize>) -> AppResult<Vec<u8>> {
        let mut out = Vec::with_capacity(range.len() * self.width);
        for (addr, at, len, _) in self.pieces(range) {
            out.extend_from_slice(&c.read_at(addr, at, len)?);
        }
        Ok(out)
    }

    /// Writes raw bytes of elements starting at `first` (one write per chunk).
    pub fn write(&self, w: &Worker<'_>, first: usize, bytes: &[u8]) -> AppResult<()> {
        let n = bytes.len() / self.width;
        for (addr, at, len, start) in self.pieces(first..first + n) {
            let off = (start - first) * self.width;
            w.write(addr, at, &bytes[off..off + len])?;
        }
        Ok(())
    }
}

/// FNV-1a over bytes (checksums and partitioning).
pub fn fnv(bytes: &[u8]) -> u64 {
    crate::ycsb::fnv1a_64(bytes)
}

/// Little-endian decoding helpers.
pub(crate) fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|x| u32::from_le_bytes(x.try_into().expect("4 bytes")))
        .collect()
}

pub(crate) fn f64s(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8)
        .map(|x| f64::from_le_bytes(x.try_into().expect("8 bytes")))
        .collect()
}

pub(crate) fn f64_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The contiguous part of `0..len` worker `i` of `n` owns.
pub fn share(len: usize, i: usize, n: usize) -> std::ops::Range<usize> {
    let (each, extra) = (len / n, len % n);
    let lo = i * each + i.min(extra);
    lo..lo + each + usize::from(i < extra)
}
