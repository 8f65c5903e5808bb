//! The in-process backend: memory nodes live in this process and verbs execute on the
//! caller's thread (or, when delayed, on a timer thread), with fault injection and an optional
//! latency model in virtual time. With a [`DetScheduler`] attached
//! ([`SimCluster::set_scheduler`]) the threads registered with it run in a seeded,
//! reproducible interleaving, verb by verb (the deterministic mode, see [`sched`]).
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
//!
//! let cluster = SimCluster::new(SimConfig::default());
//! let node = Arc::new(MemoryNode::new(NodeId(0)));
//! let region = node.register(Arc::new(DramBacking::new(1 << 16)), Access::ALL, None).unwrap();
//! cluster.add_node(node);
//! let ep = cluster.endpoint(1).unwrap();
//! ep.write("demo", region.at(0), b"hi").unwrap();
//! assert_eq!(ep.read("demo", region.at(0), 2).unwrap(), b"hi");
//! cluster.fail_node(NodeId(0));
//! assert!(ep.read("demo", region.at(0), 2).unwrap_err().is_node_failure());
//! ```

mod latency;
pub mod sched;
mod timer;

/// Unit tests' cluster: one node (id 0) with one 64 KiB DRAM region, and client 1's endpoint.
#[cfg(test)]
pub(crate) fn one_node() -> (SimCluster, crate::Endpoint, crate::RegionDesc) {
    let (cluster, mut regions) = SimCluster::with_dram_nodes(1, 1 << 16).expect("a 64 KiB region");
    let ep = cluster.endpoint(1).expect("client 1's endpoint");
    (cluster, ep, regions.remove(0))
}

pub use latency::LatencyModel;
pub use sched::{
    DetConfig, DetFaults, DetScheduler, DetThread, Outcome, Trace, TraceEntry, TracedOp,
    TracedVerb, Work,
};

use latency::Calendar;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::batch::{Batch, BatchResult};
use crate::conn::{Connection, Connector, PostCtx};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::node::{MemoryNode, Peer};
use crate::pending::{Pending, Slot};
use crate::types::{NodeId, RegionDesc};

use sched::Turn;
use timer::Timer;

/// Settings of a simulated cluster.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Virtual-time latency model; `None` models nothing (virtual time stays 0).
    pub latency: Option<LatencyModel>,
    /// How long a wait may take before it is a timeout (delayed requests can hit it).
    pub timeout: Duration,
    /// Seed for probabilistic faults.
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: None,
            timeout: Duration::from_secs(5),
            seed: 0x5EED,
        }
    }
}

/// When an injected drop loses the work: before the node executes it, or after (the node
/// executed it but the completion is lost — the caller cannot tell which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropPoint {
    BeforeExecute,
    AfterExecute,
}

#[derive(Debug)]
struct DropRule {
    node: Option<NodeId>,
    remaining: Option<u64>,
    probability: f64,
    point: DropPoint,
}

#[derive(Debug)]
struct DelayRule {
    node: Option<NodeId>,
    remaining: Option<u64>,
    delay: Duration,
}

#[derive(Debug)]
struct Faults {
    drops: Vec<DropRule>,
    delays: Vec<DelayRule>,
    rng: ChaCha8Rng,
}

/// Work a paused node holds until it resumes.
type HeldJob = Box<dyn FnOnce() + Send>;

struct SimNode {
    node: Arc<MemoryNode>,
    failed: AtomicBool,
    /// When each medium (DRAM, NVM) is busy in virtual time: a loaded node queues.
    busy: Mutex<[Calendar; 2]>,
    /// While paused (a hung node), work is held here in arrival order.
    held: Mutex<Option<Vec<HeldJob>>>,
}

impl std::fmt::Debug for SimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNode")
            .field("id", &self.node.id())
            .finish()
    }
}

#[derive(Debug, Default)]
struct ClientState {
    /// Verbs this client may still post before it crashes (`None`: no crash planned).
    crash_budget: Mutex<Option<u64>>,
    crashed: AtomicBool,
    posted: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    cfg: SimConfig,
    nodes: RwLock<BTreeMap<NodeId, Arc<SimNode>>>,
    clients: Mutex<HashMap<u64, Arc<ClientState>>>,
    faults: Mutex<Faults>,
    timer: Timer,
    next_conn: AtomicU64,
    /// The deterministic mode's scheduler, when one is attached.
    sched: RwLock<Option<DetScheduler>>,
}

/// An in-process cluster of memory nodes with fault injection.
#[derive(Debug, Clone)]
pub struct SimCluster {
    inner: Arc<Inner>,
}

impl SimCluster {
    pub fn new(cfg: SimConfig) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        Self {
            inner: Arc::new(Inner {
                cfg,
                nodes: RwLock::new(BTreeMap::new()),
                clients: Mutex::new(HashMap::new()),
                faults: Mutex::new(Faults {
                    drops: Vec::new(),
                    delays: Vec::new(),
                    rng,
                }),
                timer: Timer::default(),
                next_conn: AtomicU64::new(1),
                sched: RwLock::new(None),
            }),
        }
    }

    /// Attaches a deterministic scheduler (or detaches it with `None`): from now on, batches
    /// and RPCs that threads registered with it post through this cluster run one at a time,
    /// in the order it draws from its seed, and its node failures fail nodes of this
    /// cluster. Attach it before the registered threads start posting. See [`sched`].
    pub fn set_scheduler(&self, sched: Option<DetScheduler>) {
        let mut cur = self.inner.sched.write();
        if let Some(old) = cur.take() {
            old.set_fail_hook(None);
        }
        // Rkeys drawn from now on come from the seed (failovers rotate them).
        for n in self.inner.nodes.read().values() {
            n.node
                .seed_rkeys(sched.as_ref().map(|s| s.seed() ^ u64::from(n.node.id().0)));
        }
        if let Some(s) = &sched {
            let weak = Arc::downgrade(&self.inner);
            s.set_fail_hook(Some(Arc::new(move |node| {
                if let Some(inner) = weak.upgrade() {
                    SimCluster { inner }.fail_node(node);
                }
            })));
        }
        *cur = sched;
    }

    /// The attached deterministic scheduler.
    pub fn scheduler(&self) -> Option<DetScheduler> {
        self.inner.sched.read().clone()
    }

    /// A cluster (default configuration) of `nodes` memory nodes, ids `0..nodes`, each
    /// serving one DRAM region of `len` bytes with every access: their descriptors, in node
    /// order. The usual start of a test or example on the simulator.
    ///
    /// ```
    /// let (cluster, regions) = dmkit_verbs::sim::SimCluster::with_dram_nodes(2, 4096)?;
    /// let ep = cluster.endpoint(1)?;
    /// ep.write("demo", regions[1].at(0), b"hi")?;
    /// assert_eq!(ep.read("demo", regions[1].at(0), 2)?, b"hi");
    /// # Ok::<(), dmkit_verbs::Error>(())
    /// ```
    pub fn with_dram_nodes(nodes: u16, len: usize) -> Result<(SimCluster, Vec<RegionDesc>)> {
        let cluster = SimCluster::new(SimConfig::default());
        let mut regions = Vec::with_capacity(usize::from(nodes));
        for n in 0..nodes {
            let node = Arc::new(MemoryNode::new(NodeId(n)));
            let backing = crate::DramBacking::try_new(len)?;
            regions.push(node.register(Arc::new(backing), crate::Access::ALL, None)?);
            cluster.add_node(node);
        }
        Ok((cluster, regions))
    }

    /// Adds a memory node (replacing one with the same id: a restarted node).
    pub fn add_node(&self, node: Arc<MemoryNode>) {
        self.inner.nodes.write().insert(
            node.id(),
            Arc::new(SimNode {
                node,
                failed: AtomicBool::new(false),
                busy: Mutex::new(Default::default()),
                held: Mutex::new(None),
            }),
        );
    }

    /// Removes a node entirely; connections to it fail with `NodeFailed`.
    pub fn remove_node(&self, id: NodeId) -> Option<Arc<MemoryNode>> {
        self.inner.nodes.write().remove(&id).map(|n| n.node.clone())
    }

    pub fn node(&self, id: NodeId) -> Option<Arc<MemoryNode>> {
        self.inner.nodes.read().get(&id).map(|n| n.node.clone())
    }

    pub fn node_ids(&self) -> Vec<NodeId> {
        self.inner.nodes.read().keys().copied().collect()
    }

    /// A connector for `client`: connections it makes share the client's fault state.
    pub fn connector(&self, client: u64) -> SimConnector {
        SimConnector {
            cluster: self.clone(),
            client,
        }
    }

    /// An endpoint for `client` connected to every node.
    pub fn endpoint(&self, client: u64) -> Result<Endpoint> {
        let nodes: Vec<_> = self
            .node_ids()
            .into_iter()
            .map(|n| (n, n.0.to_string()))
            .collect();
        Endpoint::connect(&self.connector(client), &nodes)
    }

    /// The node stops answering: verbs and RPCs to it fail with [`Error::NodeFailed`].
    pub fn fail_node(&self, id: NodeId) {
        if let Some(n) = self.inner.nodes.read().get(&id) {
            n.failed.store(true, Ordering::SeqCst);
        }
    }

    /// The node answers again, with its memory as it was.
    pub fn recover_node(&self, id: NodeId) {
        if let Some(n) = self.inner.nodes.read().get(&id) {
            n.failed.store(false, Ordering::SeqCst);
        }
    }

    fn client(&self, client: u64) -> Arc<ClientState> {
        self.inner.clients.lock().entry(client).or_default().clone()
    }

    /// The client crashes after posting `n` more verbs (RPCs count as one verb): the verb
    /// after them, and everything later, is not executed and fails with
    /// [`Error::ClientCrashed`]. A batch can be cut in the middle.
    pub fn crash_client_after(&self, client: u64, n: u64) {
        let c = self.client(client);
        *c.crash_budget.lock() = Some(n);
        c.crashed.store(n == 0, Ordering::SeqCst);
    }

    /// Whether the client has crashed.
    pub fn client_crashed(&self, client: u64) -> bool {
        self.client(client).crashed.load(Ordering::SeqCst)
    }

    /// The node hangs: work sent to it is held (callers time out) until [`Self::resume_node`].
    pub fn pause_node(&self, id: NodeId) {
        if let Some(n) = self.inner.nodes.read().get(&id) {
            n.held.lock().get_or_insert_with(Vec::new);
        }
    }

    /// A paused node executes what it held, in order, and answers again.
    pub fn resume_node(&self, id: NodeId) {
        let n = self.inner.nodes.read().get(&id).cloned();
        if let Some(n) = n {
            let jobs = n.held.lock().take().unwrap_or_default();
            for j in jobs {
                j();
            }
        }
    }

    /// Lets a crashed client run again (a restart: it should recover before going on).
    pub fn restart_client(&self, client: u64) {
        let c = self.client(client);
        *c.crash_budget.lock() = None;
        c.crashed.store(false, Ordering::SeqCst);
    }

    /// Verbs (and RPCs) this client has posted so far, crashed ones excluded.
    pub fn verbs_posted(&self, client: u64) -> u64 {
        self.client(client).posted.load(Ordering::SeqCst)
    }

    /// Drops the next `count` batches or RPCs to `node` (any node if `None`).
    pub fn drop_next(&self, node: Option<NodeId>, count: u64, point: DropPoint) {
        self.inner.faults.lock().drops.push(DropRule {
            node,
            remaining: Some(count),
            probability: 1.0,
            point,
        });
    }

    /// Drops each batch or RPC to `node` with probability `p` (seeded).
    pub fn drop_randomly(&self, node: Option<NodeId>, p: f64, point: DropPoint) {
        self.inner.faults.lock().drops.push(DropRule {
            node,
            remaining: None,
            probability: p.clamp(0.0, 1.0),
            point,
        });
    }

    /// Delays the next `count` batches to `node` (all, if `None`) by `delay` of real time.
    /// Later work on the same connection waits behind them (in-order execution).
    pub fn delay(&self, node: Option<NodeId>, delay: Duration, count: Option<u64>) {
        self.inner.faults.lock().delays.push(DelayRule {
            node,
            remaining: count,
            delay,
        });
    }

    /// Removes every drop and delay rule (not node failures or client crashes).
    pub fn clear_faults(&self) {
        let mut f = self.inner.faults.lock();
        f.drops.clear();
        f.delays.clear();
    }

    fn sim_node(&self, id: NodeId) -> Result<Arc<SimNode>> {
        match self.inner.nodes.read().get(&id) {
            Some(n) if !n.failed.load(Ordering::SeqCst) => Ok(n.clone()),
            _ => Err(Error::NodeFailed { node: id }),
        }
    }

    fn decide_drop(&self, node: NodeId) -> Option<DropPoint> {
        let mut f = self.inner.faults.lock();
        let Faults { drops, rng, .. } = &mut *f;
        let mut hit = None;
        for d in drops.iter_mut() {
            if d.node.is_some_and(|n| n != node) || d.remaining == Some(0) {
                continue;
            }
            if d.probability >= 1.0 || rng.random_bool(d.probability) {
                if let Some(r) = &mut d.remaining {
                    *r -= 1;
                }
                hit = Some(d.point);
                break;
            }
        }
        drops.retain(|d| d.remaining != Some(0));
        hit
    }

    fn decide_delay(&self, node: NodeId) -> Option<Duration> {
        let mut f = self.inner.faults.lock();
        let mut hit = None;
        for d in f.delays.iter_mut() {
            if d.node.is_some_and(|n| n != node) || d.remaining == Some(0) {
                continue;
            }
            if let Some(r) = &mut d.remaining {
                *r -= 1;
            }
            hit = Some(d.delay);
            break;
        }
        f.delays.retain(|d| d.remaining != Some(0));
        hit
    }
}

/// Makes sim connections for one client. Addresses are node ids (`"0"`, `"1"`, ...).
#[derive(Debug, Clone)]
pub struct SimConnector {
    cluster: SimCluster,
    client: u64,
}

impl Connector for SimConnector {
    fn connect(&self, addr: &str) -> Result<Arc<dyn Connection>> {
        let id: u16 = addr.trim().parse().map_err(|_| Error::Connect {
            addr: addr.to_string(),
            reason: "a sim address is a node id".into(),
        })?;
        let node = NodeId(id);
        let n = self.cluster.sim_node(node).map_err(|_| Error::Connect {
            addr: addr.to_string(),
            reason: format!("no live sim node {id}"),
        })?;
        Ok(Arc::new(SimConnection {
            cluster: self.cluster.clone(),
            client: self.cluster.client(self.client),
            client_id: self.client,
            node,
            conn_id: self.cluster.inner.next_conn.fetch_add(1, Ordering::Relaxed),
            regions: Mutex::new(n.node.regions()),
            alive: AtomicBool::new(true),
            order_until: Mutex::new(None),
            queued: Arc::new(AtomicU64::new(0)),
            det_line: Mutex::new(VecDeque::new()),
        }))
    }
}

#[derive(Debug)]
struct SimConnection {
    cluster: SimCluster,
    client: Arc<ClientState>,
    client_id: u64,
    node: NodeId,
    conn_id: u64,
    regions: Mutex<Vec<RegionDesc>>,
    alive: AtomicBool,
    /// Real time until which earlier (delayed) work on this connection is queued.
    order_until: Mutex<Option<Instant>>,
    /// Batches of this connection scheduled on the timer and not executed yet. While there
    /// are any, later batches go behind them (the timer may run late: time alone is no proof
    /// that they have executed).
    queued: Arc<AtomicU64>,
    /// Deterministic mode: deferred requests of this connection (by the step they were
    /// first granted at, with the step they are due at), oldest first; later requests of
    /// the connection wait behind them.
    det_line: Mutex<VecDeque<(u64, u64)>>,
}

/// Takes a deferred request out of its connection's line if its thread unwinds.
struct LineGuard<'a> {
    line: &'a Mutex<VecDeque<(u64, u64)>>,
    me: Option<u64>,
}

impl Drop for LineGuard<'_> {
    fn drop(&mut self) {
        if let Some(me) = self.me {
            self.line.lock().retain(|(p, _)| *p != me);
        }
    }
}

impl SimConnection {
    /// How many of `n` verbs the client may still post before its planned crash.
    fn admit(&self, n: u64) -> std::result::Result<u64, Error> {
        let crashed = || Error::ClientCrashed {
            client: self.client_id,
        };
        if self.client.crashed.load(Ordering::SeqCst) {
            return Err(crashed());
        }
        let mut budget = self.client.crash_budget.lock();
        let allowed = match &mut *budget {
            None => n,
            Some(b) => {
                let a = n.min(*b);
                *b -= a;
                if *b == 0 && a < n {
                    self.client.crashed.store(true, Ordering::SeqCst);
                }
                a
            }
        };
        self.client.posted.fetch_add(allowed, Ordering::SeqCst);
        if allowed == 0 && n > 0 {
            return Err(crashed());
        }
        Ok(allowed)
    }

    /// Deterministic mode: waits for the calling thread's turn (when it is registered with
    /// the attached scheduler), then serves the request's deferrals — injected ones, and
    /// delay rules as steps when `delay_rules` — and waits behind this connection's earlier
    /// deferred requests. Returns the turn under which the work executes and the scheduler's
    /// drop decision.
    fn det_turn(
        &self,
        work: impl FnOnce() -> Work,
        delay_rules: bool,
    ) -> Option<(Turn, Option<DropPoint>)> {
        let sched = self.cluster.inner.sched.read().clone()?;
        let mut turn = sched.turn(work)?;
        let dropped = turn.drop;
        let mut defer = turn.defer;
        if delay_rules {
            if let Some(d) = self.cluster.decide_delay(self.node) {
                defer += sched.steps_for(d);
            }
        }
        let me = turn.posted;
        let mut guard = LineGuard {
            line: &self.det_line,
            me: None,
        };
        loop {
            let mut line = self.det_line.lock();
            let pos = line.iter().position(|(p, _)| *p == me);
            if defer == 0 && pos.unwrap_or(line.len()) == 0 {
                if guard.me.take().is_some() {
                    line.pop_front();
                }
                break;
            }
            // Wait at least until every request ahead in line is due (then, if one of them
            // has not run yet, one step at a time).
            let ahead_due = line
                .iter()
                .take(pos.unwrap_or(line.len()))
                .map(|(_, due)| *due)
                .max()
                .unwrap_or(0);
            let k = defer.max(ahead_due.saturating_sub(turn.step + 1)).max(1);
            let due = turn.step + k + 1;
            match pos {
                Some(i) => line[i].1 = due,
                None => {
                    line.push_back((me, due));
                    guard.me = Some(me);
                }
            }
            drop_guard(line);
            turn = turn.defer(k);
            defer = 0;
        }
        Some((turn, dropped))
    }

    /// Posts a batch: at once, or (delay rules, earlier delayed work) on the timer thread.
    /// `det` is set in deterministic mode, with the scheduler's drop decision: the work then
    /// executes now, on this thread (its deferrals were served in its turn).
    fn post_work(
        &self,
        batch: Batch,
        ctx: PostCtx,
        det: Option<Option<DropPoint>>,
    ) -> Pending<BatchResult> {
        let node = self.node;
        if let Err(e) = self.check_alive() {
            return Pending::ready(node, Err(e));
        }
        let n = batch.len();
        let allowed = match self.admit(n as u64) {
            Ok(a) => a as usize,
            Err(e) => return Pending::ready(node, Err(e)),
        };
        let modeled = self.cluster.inner.cfg.latency.as_ref().and_then(|m| {
            let sn = self.cluster.sim_node(node).ok()?;
            Some(m.batch_done(&sn, ctx.virtual_now, &batch))
        });
        let rule = self.cluster.decide_drop(node);
        let drop = det.flatten().or(rule);
        if let Ok(sn) = self.cluster.sim_node(node) {
            let mut held = sn.held.lock();
            if let Some(list) = held.as_mut() {
                let slot = Slot::new();
                let s = slot.clone();
                let cluster = self.cluster.clone();
                let client = Some(self.client_id);
                list.push(Box::new(move || {
                    s.complete(run_batch(&cluster, node, batch, allowed, client, drop));
                }));
                return Pending::waiting(node, slot, self.cluster.inner.cfg.timeout, None)
                    .modeled(modeled);
            }
        }
        if det.is_some() {
            let r = run_batch(
                &self.cluster,
                node,
                batch,
                allowed,
                Some(self.client_id),
                drop,
            );
            return Pending::ready(node, r).modeled(modeled);
        }
        let delay = self.cluster.decide_delay(node);
        let now = Instant::now();
        let mut order = self.order_until.lock();
        let queued_behind = if self.queued.load(Ordering::SeqCst) > 0 {
            Some(order.unwrap_or(now))
        } else {
            None
        };
        let exec_at = match (delay, queued_behind) {
            (None, None) => None,
            (d, q) => Some((now + d.unwrap_or_default()).max(q.unwrap_or(now))),
        };
        let client = Some(self.client_id);
        match exec_at {
            None => {
                drop_guard(order);
                Pending::ready(
                    node,
                    run_batch(&self.cluster, node, batch, allowed, client, drop),
                )
                .modeled(modeled)
            }
            Some(at) => {
                *order = Some(at);
                self.queued.fetch_add(1, Ordering::SeqCst);
                drop_guard(order);
                let slot = Slot::new();
                let s = slot.clone();
                let cluster = self.cluster.clone();
                let queued = self.queued.clone();
                // Jobs at the same instant run in posting order, so this one runs after
                // every earlier one of this connection.
                self.cluster.inner.timer.schedule(at, move || {
                    let r = run_batch(&cluster, node, batch, allowed, client, drop);
                    queued.fetch_sub(1, Ordering::SeqCst);
                    s.complete(r);
                });
                Pending::waiting(node, slot, self.cluster.inner.cfg.timeout, None).modeled(modeled)
            }
        }
    }

    /// Sends an RPC, executed on this thread; `dropped` is the deterministic scheduler's drop
    /// decision.
    fn rpc_work(&self, req: &[u8], ctx: PostCtx, dropped: Option<DropPoint>) -> Pending<Vec<u8>> {
        let node = self.node;
        if let Err(e) = self.check_alive() {
            return Pending::ready(node, Err(e));
        }
        if let Err(e) = self.admit(1) {
            return Pending::ready(node, Err(e));
        }
        let sn = match self.cluster.sim_node(node) {
            Ok(n) => n,
            Err(e) => return Pending::ready(node, Err(e)),
        };
        let rule = self.cluster.decide_drop(node);
        let drop = dropped.or(rule);
        if drop == Some(DropPoint::BeforeExecute) {
            return Pending::ready(node, Err(Error::Dropped { node }));
        }
        let peer = Peer {
            conn_id: self.conn_id,
            addr: format!("sim-client-{}", self.client_id),
        };
        {
            let mut held = sn.held.lock();
            if let Some(list) = held.as_mut() {
                let slot = Slot::new();
                let s = slot.clone();
                let req = req.to_vec();
                let n2 = sn.node.clone();
                list.push(Box::new(move || {
                    s.complete(
                        n2.rpc(&peer, &req)
                            .map_err(|reason| Error::Rpc { node, reason }),
                    );
                }));
                return Pending::waiting(node, slot, self.cluster.inner.cfg.timeout, None);
            }
        }
        let r = sn
            .node
            .rpc(&peer, req)
            .map_err(|reason| Error::Rpc { node, reason });
        let r = if drop == Some(DropPoint::AfterExecute) {
            Err(Error::Dropped { node })
        } else {
            r
        };
        let modeled = self.cluster.inner.cfg.latency.as_ref().map(|m| {
            let reply = r.as_ref().map(|v| v.len()).unwrap_or(0);
            m.rpc_done(ctx.virtual_now, req.len() + reply)
        });
        Pending::ready(node, r).modeled(modeled)
    }

    fn check_alive(&self) -> Result<()> {
        if self.alive.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(Error::Disconnected {
                node: self.node,
                reason: "connection closed".into(),
            })
        }
    }
}

/// Executes the first `allowed` ops of a batch on the node.
fn run_batch(
    cluster: &SimCluster,
    node: NodeId,
    batch: Batch,
    allowed: usize,
    crash_client: Option<u64>,
    drop: Option<DropPoint>,
) -> Result<BatchResult> {
    if drop == Some(DropPoint::BeforeExecute) {
        return Err(Error::Dropped { node });
    }
    let sn = cluster.sim_node(node)?;
    let (node_id, ops, mut bufs) = batch.into_parts();
    let mut olds = vec![0u64; ops.len()];
    let tracing_on = trace::on();
    let batch_id = if tracing_on { trace::next_batch() } else { 0 };
    for (i, op) in ops.iter().enumerate().take(allowed) {
        let (data, dst) = crate::batch::op_io(op, &mut bufs);
        let written = if tracing_on && matches!(op.kind, crate::node::OpKind::Write { .. }) {
            data.to_vec()
        } else {
            Vec::new()
        };
        let r = sn
            .node
            .execute(op.kind, op.rkey, op.addr, op.len, data, dst, None);
        if tracing_on && !matches!(op.kind, crate::node::OpKind::Read) {
            trace::record(trace::Entry {
                batch: batch_id,
                client: crash_client.unwrap_or(0),
                node,
                addr: op.addr,
                len: op.len,
                kind: op.kind,
                old: *r.as_ref().unwrap_or(&0),
                written,
            });
        }
        match r {
            Ok(old) => olds[i] = old,
            Err(fault) => {
                return Err(Error::refused(node, i, op, fault));
            }
        }
    }
    if allowed < ops.len() {
        return Err(Error::ClientCrashed {
            client: crash_client.unwrap_or(0),
        });
    }
    if drop == Some(DropPoint::AfterExecute) {
        return Err(Error::Dropped { node });
    }
    let mut r = BatchResult::new(node_id, ops, bufs);
    r.olds = olds;
    Ok(r)
}

impl Connection for SimConnection {
    fn node(&self) -> NodeId {
        self.node
    }

    fn regions(&self) -> Vec<RegionDesc> {
        self.regions.lock().clone()
    }

    fn refresh_regions(&self) -> Result<Vec<RegionDesc>> {
        self.check_alive()?;
        let r = self.cluster.sim_node(self.node)?.node.regions();
        *self.regions.lock() = r.clone();
        Ok(r)
    }

    fn post(&self, batch: Batch, ctx: PostCtx) -> Pending<BatchResult> {
        match self.det_turn(|| Work::batch(self.client_id, &batch), true) {
            None => self.post_work(batch, ctx, None),
            Some((turn, dropped)) => {
                let p = self.post_work(batch, ctx, Some(dropped));
                turn.finish(outcome_of(&p, Outcome::of_batch));
                p
            }
        }
    }

    fn rpc(&self, req: &[u8], ctx: PostCtx) -> Pending<Vec<u8>> {
        match self.det_turn(|| Work::rpc(self.client_id, self.node, req), false) {
            None => self.rpc_work(req, ctx, None),
            Some((turn, dropped)) => {
                let p = self.rpc_work(req, ctx, dropped);
                turn.finish(outcome_of(&p, Outcome::of_rpc));
                p
            }
        }
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
            && self
                .cluster
                .inner
                .nodes
                .read()
                .get(&self.node)
                .is_some_and(|n| !n.failed.load(Ordering::SeqCst))
    }

    fn close(&self) {
        self.alive.store(false, Ordering::SeqCst);
    }

    fn timeout(&self) -> Duration {
        self.cluster.inner.cfg.timeout
    }

    fn in_flight(&self) -> usize {
        self.queued.load(Ordering::SeqCst) as usize
    }
}

fn drop_guard<T>(_g: T) {}

/// How posted work ended, for the deterministic trace (if it has completed already).
fn outcome_of<T: Send + 'static>(p: &Pending<T>, of: fn(&Result<T>) -> Outcome) -> Outcome {
    if !p.is_ready() {
        return Outcome::Held;
    }
    let out = Arc::new(Mutex::new(Outcome::Held));
    let o = out.clone();
    // A completed pending runs the callback at once, on this thread.
    p.on_complete(move |r| *o.lock() = of(r));
    out.lock().clone()
}

/// A trace of every modifying verb the sim executed (`DMKIT_SIM_TRACE=1`), to find who wrote
/// a word: debugging aid for protocol anomalies (never on by default).
pub mod trace {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    use parking_lot::Mutex;

    use crate::node::OpKind;
    use crate::types::NodeId;

    /// One executed WRITE, CAS or FAA.
    #[derive(Debug, Clone)]
    pub struct Entry {
        pub batch: u64,
        pub client: u64,
        pub node: NodeId,
        pub addr: u64,
        pub len: u32,
        pub kind: OpKind,
        pub old: u64,
        pub written: Vec<u8>,
    }

    fn log() -> &'static Mutex<Vec<Entry>> {
        static L: OnceLock<Mutex<Vec<Entry>>> = OnceLock::new();
        L.get_or_init(|| Mutex::new(Vec::new()))
    }

    /// Whether tracing is on (`DMKIT_SIM_TRACE` set).
    pub fn on() -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| std::env::var_os("DMKIT_SIM_TRACE").is_some())
    }

    pub(crate) fn next_batch() -> u64 {
        static N: AtomicU64 = AtomicU64::new(1);
        N.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn record(e: Entry) {
        log().lock().push(e);
    }

    /// The history of the 8-byte word at `addr` on `node`, one line per verb, oldest first.
    pub fn word_history(node: NodeId, addr: u64) -> Vec<String> {
        let l = log().lock();
        l.iter()
            .filter(|e| e.node == node && e.addr <= addr && addr + 8 <= e.addr + u64::from(e.len))
            .map(|e| match e.kind {
                OpKind::Cas { expect, new } => format!(
                    "batch {} client {:#x}: CAS {expect:#x} -> {new:#x} (old {:#x}){}",
                    e.batch,
                    e.client,
                    e.old,
                    if e.old == expect { " won" } else { "" }
                ),
                OpKind::Write { .. } => {
                    let at = (addr - e.addr) as usize;
                    let w = e
                        .written
                        .get(at..at + 8)
                        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
                    format!(
                        "batch {} client {:#x}: WRITE {} bytes at {:#x}: word {w:#x}",
                        e.batch, e.client, e.len, e.addr
                    )
                }
                OpKind::Faa { add } => {
                    format!("batch {} client {:#x}: FAA {add}", e.batch, e.client)
                }
                OpKind::Read => String::new(),
            })
            .collect()
    }
}
