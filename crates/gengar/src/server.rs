//! The Gengar server: an NVM pool and a DRAM buffer registered with verbs, the RPCs that hand
//! out objects, leases and locks, and the window step that promotes hot objects into DRAM and
//! evicts cold ones.
//!
//! Invariants:
//! - The NVM copy of every object is always current (write-through: clients write DRAM *and*
//!   NVM for a cached object, NVM only otherwise), so eviction just drops the DRAM copy.
//! - An object's location only changes (promotion, eviction, free) while its leases are fenced
//!   and after every lease granted on it has expired, plus `late_op_grace` for operations
//!   posted under a lease that arrive late: a client holding a valid lease never uses a stale
//!   location, and a write posted under one never lands after its object moved.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dmkit_cache::{AccessReport, AdmissionConfig, Residency, ResidencyConfig, WindowThread};
use dmkit_lease::{
    Clock, ExclusiveLeases, LeaseConfig, LeaseError, Tier, TunedLeases, TunerConfig,
};
use dmkit_pmem_pool::verbs::PoolRegion;
use dmkit_pmem_pool::{ObjectRef, Pool, PoolOptions};
use dmkit_verbs::wire::WireError;
use dmkit_verbs::{MemoryNode, NodeId, Peer, RegionDesc};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::proto::{self, Allocated, LeaseGrant, Location, Request, Status};

/// The remote base of the DRAM buffer region (the same on every server and every start).
pub const DRAM_BASE: u64 = 1 << 40;
/// The remote base of the NVM pool's data area.
pub const NVM_BASE: u64 = 1 << 44;
/// The names of the NVM pool's and the DRAM buffer's regions (clients find them by them).
pub const NVM_REGION: &str = "gengar.nvm";
pub const DRAM_REGION: &str = "gengar.dram";

/// Settings of a Gengar server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Bytes of DRAM buffer for hot objects; 0 turns the DRAM cache off (every object stays
    /// in NVM: windows still merge reports and tune leases, but never promote).
    pub dram_bytes: usize,
    pub lease: LeaseConfig,
    pub tuner: TunerConfig,
    /// Objects need a heat of at least this many accesses to be considered hot (the heat is
    /// the window's count plus the decayed heat of earlier windows, see `history_decay`).
    /// Only hot objects displace DRAM residents; DRAM that is free also takes lukewarm
    /// objects (a heat of at least one access; at most half the buffer), which the next hot
    /// object displaces.
    pub min_hot_count: u64,
    /// Share of an object's heat kept from one window to the next (0 = every window is
    /// judged alone). Short windows see only a few accesses of all but the hottest objects;
    /// carrying the heat over lets the window rank the moderately hot ones by their rate
    /// rather than by one window's luck.
    pub history_decay: f64,
    /// Promotion hysteresis (see `dmkit_cache::AdmissionConfig`).
    pub hysteresis: f64,
    /// A lock not released within this time is considered abandoned (its holder died).
    pub lock_ttl: Duration,
    /// How long after an object's last lease expired a one-sided operation posted under it
    /// may still arrive (a delayed network, a descheduled soft NIC). Free, promotion and
    /// eviction wait this much more, so a late write never lands in a re-used slot or after
    /// the NVM copy was taken for DRAM.
    pub late_op_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            dram_bytes: 16 << 20,
            lease: LeaseConfig::default(),
            tuner: TunerConfig::default(),
            min_hot_count: 4,
            history_decay: 0.75,
            hysteresis: 0.2,
            lock_ttl: Duration::from_secs(30),
            late_op_grace: Duration::from_millis(10),
        }
    }
}

/// What a server has done.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub promotions: AtomicU64,
    /// Promotions planned but not carried out (the object was freed meanwhile, or the DRAM
    /// pool had no slot of its size class).
    pub promotions_skipped: AtomicU64,
    pub evictions: AtomicU64,
    pub leases: AtomicU64,
    pub windows: AtomicU64,
}

/// A Gengar server. Serve its [`GengarServer::node`] with any verbs backend.
pub struct GengarServer {
    node: Arc<MemoryNode>,
    nvm: PoolRegion,
    dram: PoolRegion,
    leases: TunedLeases<Arc<dyn Clock>>,
    /// Which objects have a DRAM copy (an object of the DRAM pool), and which should, window
    /// by window.
    cached: Residency<ObjectRef>,
    /// Object locks: exclusive leases, so a crashed holder's lock runs out.
    locks: ExclusiveLeases<u64, (), Arc<dyn Clock>>,
    window: Mutex<()>,
    cfg: ServerConfig,
    stats: ServerStats,
}

impl std::fmt::Debug for GengarServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GengarServer")
            .field("node", &self.node.id())
            .field("nvm_free", &self.nvm.pool().free_bytes())
            .finish()
    }
}

impl GengarServer {
    /// A server on `nvm` (a persistent pool, or a DRAM pool for tests) with a fresh DRAM buffer.
    /// Registers both regions on a new memory node `id` and installs the RPC handler.
    pub fn new(
        id: NodeId,
        nvm: Pool,
        cfg: ServerConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>> {
        let setup = |e: &dyn std::fmt::Display| Error::Setup(e.to_string());
        let dram = Pool::create_dram(
            cfg.dram_bytes.max(1 << 20),
            PoolOptions::default().block_size(64 << 10),
        )
        .map_err(|e| setup(&e))?;
        let node = Arc::new(MemoryNode::new(id));
        let nvm = PoolRegion::register(&node, NVM_REGION, Arc::new(nvm), Some(NVM_BASE));
        let nvm = nvm.map_err(|e| setup(&e))?;
        let dram = PoolRegion::register(&node, DRAM_REGION, Arc::new(dram), Some(DRAM_BASE));
        let dram = dram.map_err(|e| setup(&e))?;
        let cached = Residency::new(ResidencyConfig {
            admission: AdmissionConfig {
                capacity_bytes: dram.pool().free_bytes(),
                hysteresis: cfg.hysteresis,
                // The heat handed to the policy is already smoothed over windows.
                smoothing: 1.0,
                ..AdmissionConfig::default()
            },
            min_hot: cfg.min_hot_count,
            history_decay: cfg.history_decay,
            enabled: cfg.dram_bytes > 0,
        })
        .map_err(|e| setup(&e))?;
        let leases = TunedLeases::new(clock.clone(), cfg.lease, cfg.tuner, cfg.late_op_grace);
        let leases = leases.map_err(|e| setup(&e))?;
        let server = Arc::new(GengarServer {
            leases,
            cached,
            locks: ExclusiveLeases::new(clock),
            window: Mutex::new(()),
            node: node.clone(),
            nvm,
            dram,
            cfg,
            stats: ServerStats::default(),
        });
        node.serve_messages(&server, "the Gengar server", Self::handle);
        Ok(server)
    }

    /// The memory node to serve (sim, tcp or rdma).
    pub fn node(&self) -> &Arc<MemoryNode> {
        &self.node
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Free NVM and DRAM bytes.
    pub fn free(&self) -> (u64, u64) {
        (self.nvm.pool().free_bytes(), self.dram.pool().free_bytes())
    }

    /// Objects currently cached in DRAM.
    pub fn cached_objects(&self) -> usize {
        self.cached.len()
    }

    /// Whether the object whose NVM payload is at `offset` is cached in DRAM.
    pub fn is_cached(&self, offset: u64) -> bool {
        self.cached.get(offset).is_some()
    }

    fn head(&self, st: Status) -> dmkit_verbs::wire::Writer {
        let (n, d) = self.free();
        proto::reply(st, n, d)
    }

    /// A reply that is no answer: the status, then why (a message).
    fn refuse(&self, st: Status, why: impl std::fmt::Display) -> dmkit_verbs::wire::Writer {
        self.head(st).put(&why.to_string())
    }

    fn handle(&self, peer: &Peer, req: std::result::Result<Request, WireError>) -> Vec<u8> {
        let req = match req {
            Ok(req) => req,
            Err(e) => {
                tracing::warn!(peer = %peer.addr, error = %e, "malformed Gengar request");
                return self.refuse(Status::Failed, e).finish();
            }
        };
        let out = match req {
            Request::Alloc { size } => self.alloc(size as usize),
            Request::Free { offset, generation } => self.free_object(offset, generation),
            Request::Lease {
                holder,
                offset,
                generation,
            } => self.lease(holder, offset, generation),
            Request::Report { report } => self.report(report.0),
            Request::Lock { holder, offset } => self.lock(holder, offset),
            Request::Unlock { holder, offset } => self.unlock(holder, offset),
            Request::Stat => self.head(Status::Ok),
        };
        out.finish()
    }

    fn live(&self, off: u64, want_gen: u32) -> Option<u32> {
        let h = self.nvm.pool().live_object(off as usize, want_gen)?;
        Some(h.size)
    }

    fn alloc(&self, size: usize) -> dmkit_verbs::wire::Writer {
        if size == 0 {
            return self.refuse(Status::Failed, "objects must have at least one byte");
        }
        match self.nvm.alloc_zeroed(size) {
            Ok(o) => self.head(Status::Ok).put(&Allocated {
                offset: o.offset as u64,
                generation: o.generation,
            }),
            Err(dmkit_pmem_pool::Error::OutOfBlocks { .. }) => self.head(Status::OutOfSpace),
            Err(e @ dmkit_pmem_pool::Error::ObjectTooLarge { .. }) => {
                self.refuse(Status::OutOfSpace, e)
            }
            Err(e) => self.refuse(Status::Failed, e),
        }
    }

    fn lease(&self, holder: u64, off: u64, want_gen: u32) -> dmkit_verbs::wire::Writer {
        let Some(size) = self.live(off, want_gen) else {
            return self.head(Status::Freed);
        };
        // The location can only change after this lease expires (see the module invariants);
        // a location read after it expired is not handed out: the client retries.
        let location = || match self.cached.get(off) {
            Some(c) => Location::Dram {
                offset: c.offset as u64,
                generation: c.generation,
            },
            None => Location::Nvm,
        };
        let (duration, location) = match self.leases.grant_reading(holder, off, location) {
            Ok(granted) => granted,
            Err(LeaseError::Fenced { .. } | LeaseError::NotHeld { .. }) => {
                return self.head(Status::Busy);
            }
            Err(e) => return self.refuse(Status::Failed, e),
        };
        self.stats.leases.fetch_add(1, Ordering::Relaxed);
        self.head(Status::Ok).put(&LeaseGrant {
            size,
            duration_ns: duration.as_nanos() as u64,
            location,
        })
    }

    fn free_object(&self, off: u64, want_gen: u32) -> dmkit_verbs::wire::Writer {
        let _w = self.window.lock();
        if self.live(off, want_gen).is_none() {
            return self.head(Status::Freed);
        }
        let fence = self.leases.drain([off]);
        if let Some(copy) = self.cached.forget(off) {
            self.free_copy(off, copy);
        }
        self.leases.forget(off);
        self.locks.remove(&off);
        let r = self.nvm.pool().free_object(off as usize);
        drop(fence);
        match r {
            Ok(()) => self.head(Status::Ok),
            Err(e) => self.refuse(Status::Failed, e),
        }
    }

    fn report(&self, report: AccessReport) -> dmkit_verbs::wire::Writer {
        for e in &report.entries {
            self.leases.record_accesses(e.obj, e.count);
        }
        self.cached.report(&report);
        self.head(Status::Ok)
    }

    fn lock(&self, holder: u64, off: u64) -> dmkit_verbs::wire::Writer {
        match self.locks.acquire(off, holder, (), self.cfg.lock_ttl) {
            Ok(_) => self.head(Status::Ok),
            Err(h) => self.head(Status::Busy).u64(h.token),
        }
    }

    fn unlock(&self, holder: u64, off: u64) -> dmkit_verbs::wire::Writer {
        if self.locks.release(&off, holder) {
            self.head(Status::Ok)
        } else {
            self.head(Status::NotHolder)
        }
    }

    /// Frees the DRAM copy of the object at `off`.
    fn free_copy(&self, off: u64, copy: ObjectRef) {
        if let Err(e) = self.dram.pool().free_object(copy.offset) {
            tracing::warn!(error = %e, "freeing a DRAM copy failed");
        }
        self.leases.set_tier(off, Tier::Nvm);
    }

    /// One window of the hot-object cache: merge the clients' reports, select the globally
    /// hottest objects that fit the DRAM buffer, evict and promote (each after the object's
    /// leases expired). Returns (promoted, evicted).
    pub fn run_window(&self) -> (usize, usize) {
        let _w = self.window.lock();
        // Locks of holders that crashed ran out: forget them.
        self.locks.prune();
        // What an object would take of the DRAM buffer: its slot there, not its payload (the
        // pool gives objects power-of-two slots). Objects too large for a DRAM slot are no
        // candidates.
        let (nvm, dram) = (self.nvm.pool(), self.dram.pool());
        let size_of = |obj: u64| dram.copy_footprint(nvm, obj as usize);
        let plan = self.cached.plan(dram.free_bytes(), size_of);
        // Every object that moves, drained at once (see the module invariants).
        let moving = plan.promote.iter().map(|h| h.obj);
        let fences = self.leases.drain(plan.evict.iter().copied().chain(moving));
        let copy = |obj| {
            let c = self.promote(obj);
            c.inspect_err(|e| tracing::debug!(obj, error = %e, "promotion skipped"))
                .ok()
        };
        let done = self.cached.apply(&plan, |o, c| self.free_copy(o, c), copy);
        let st = &self.stats;
        if done.skipped > 0 {
            // (Registered only once there is one: the metric names are pinned.)
            let metric = "dmkit_gengar_promotions_skipped_total";
            count(&st.promotions_skipped, metric, done.skipped);
        }
        drop(fences);
        self.leases.end_window();
        st.windows.fetch_add(1, Ordering::Relaxed);
        count(
            &st.promotions,
            "dmkit_gengar_promotions_total",
            done.promoted,
        );
        count(&st.evictions, "dmkit_gengar_evictions_total", done.evicted);
        (done.promoted, done.evicted)
    }

    /// Copies the object NVM → DRAM; the DRAM copy then holds the real data (the module
    /// invariants say why that is safe). The caller holds the object's fence, its leases
    /// expired and the grace for late operations passed.
    fn promote(&self, obj: u64) -> dmkit_pmem_pool::Result<ObjectRef> {
        let slot = self.dram.copy_object_from(&self.nvm, obj as usize)?;
        self.leases.set_tier(obj, Tier::Dram);
        Ok(slot)
    }

    /// Runs [`GengarServer::run_window`] every `every` on a background thread until the
    /// returned handle (or the server) is dropped.
    pub fn spawn_windows(self: &Arc<Self>, every: Duration) -> WindowThread {
        let step = |s: &Self| {
            s.run_window();
        };
        WindowThread::spawn("gengar-window", every, self, step)
            .expect("spawn the Gengar window thread")
    }

    /// The NVM region's descriptor.
    pub fn nvm_region(&self) -> RegionDesc {
        self.nvm.region()
    }
}

/// Adds `n` to a server statistic and to its Prometheus counter `metric`.
fn count(stat: &AtomicU64, metric: &'static str, n: usize) {
    stat.fetch_add(n as u64, Ordering::Relaxed);
    metrics::counter!(metric).increment(n as u64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClientConfig, GengarClient};
    use dmkit_lease::SystemClock;
    use dmkit_verbs::sim::{SimCluster, SimConfig};

    fn hot_reads_then_window(dram_bytes: usize) -> (usize, bool) {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let cluster = SimCluster::new(SimConfig::default());
        let nvm = Pool::create_dram(4 << 20, PoolOptions::default().block_size(64 << 10)).unwrap();
        let cfg = ServerConfig {
            dram_bytes,
            ..ServerConfig::default()
        };
        let server = GengarServer::new(NodeId(0), nvm, cfg, clock.clone()).unwrap();
        cluster.add_node(server.node().clone());
        let c = GengarClient::new(
            cluster.endpoint(1).unwrap(),
            1,
            ClientConfig::default(),
            clock,
        )
        .unwrap();
        let obj = c.alloc(512).unwrap();
        c.write(obj, 0, &[1; 512]).unwrap();
        for _ in 0..100 {
            c.read(obj).unwrap();
        }
        c.report_hot().unwrap();
        let (promoted, _) = server.run_window();
        (promoted, server.is_cached(obj.offset))
    }

    #[test]
    fn zero_dram_bytes_turns_the_cache_off() {
        assert_eq!(hot_reads_then_window(1 << 20), (1, true));
        assert_eq!(hot_reads_then_window(0), (0, false));
    }
}
