//! The client side: an [`Endpoint`] holds one connection per memory node, posts batches (one
//! round trip each, or one for a group of batches to different nodes), RPCs, and proxied
//! writes with write confirms under bounded staging.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::batch::{Batch, BatchResult};
use crate::buf::{BufAllocator, HeapAllocator, MemBuf};
use crate::conn::{Connection, Connector, Executed, PostCtx};
use crate::error::{Error, Result};
use crate::pending::Pending;
use crate::stats::{Stats, Tag};
use crate::types::{NodeId, RegionDesc, RemoteAddr};

/// Settings of an endpoint.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// The most bytes proxied writes may hold staged before writers wait (back-pressure).
    pub staging_bytes: usize,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            staging_bytes: 8 << 20,
        }
    }
}

/// Each proxied write is charged at least this many staging bytes, so the number of
/// outstanding confirms is bounded too.
const MIN_STAGE_CHARGE: usize = 64;

#[derive(Debug)]
struct Inner {
    conns: RwLock<BTreeMap<NodeId, Arc<dyn Connection>>>,
    stats: Stats,
    alloc: Arc<dyn BufAllocator>,
    staging: Staging,
}

/// A client's connections to the memory nodes, with accounting.
///
/// Clones share connections, accounting and staging, and the virtual clock of the sim latency
/// model; [`Endpoint::fork`] gives a handle with a clock of its own (one per client task).
#[derive(Debug, Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
    clock: Arc<AtomicU64>,
}

impl Default for Endpoint {
    fn default() -> Self {
        Self::new(EndpointConfig::default())
    }
}

impl Endpoint {
    /// An endpoint with no connections yet.
    pub fn new(cfg: EndpointConfig) -> Self {
        Self::with_allocator(cfg, Arc::new(HeapAllocator))
    }

    /// An endpoint whose buffers come from `alloc` (the rdma backend's registered slabs).
    pub fn with_allocator(cfg: EndpointConfig, alloc: Arc<dyn BufAllocator>) -> Self {
        Self {
            inner: Arc::new(Inner {
                conns: RwLock::new(BTreeMap::new()),
                stats: Stats::default(),
                alloc,
                staging: Staging::new(cfg.staging_bytes),
            }),
            clock: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Connects to every `(expected id, address)` with `connector`. Fails on the first node
    /// that cannot be reached or that reports another id.
    pub fn connect(connector: &dyn Connector, nodes: &[(NodeId, String)]) -> Result<Self> {
        let ep = match connector.buf_allocator()? {
            Some(a) => Self::with_allocator(EndpointConfig::default(), a),
            None => Self::default(),
        };
        for (id, addr) in nodes {
            let c = connector.connect(addr)?;
            if c.node() != *id {
                c.close();
                return Err(Error::Connect {
                    addr: addr.clone(),
                    reason: format!("expected memory node {id}, found node {}", c.node()),
                });
            }
            ep.add_connection(c);
        }
        Ok(ep)
    }

    /// Adds (or replaces) the connection to its node.
    pub fn add_connection(&self, conn: Arc<dyn Connection>) {
        if let Some(old) = self.inner.conns.write().insert(conn.node(), conn) {
            old.close();
        }
    }

    /// Drops the connection to `node`, closing it.
    pub fn remove_connection(&self, node: NodeId) {
        if let Some(c) = self.inner.conns.write().remove(&node) {
            c.close();
        }
    }

    /// The connected nodes, in id order.
    pub fn nodes(&self) -> Vec<NodeId> {
        self.inner.conns.read().keys().copied().collect()
    }

    /// The connection to `node`.
    pub fn connection(&self, node: NodeId) -> Result<Arc<dyn Connection>> {
        self.inner
            .conns
            .read()
            .get(&node)
            .cloned()
            .ok_or(Error::NoSuchNode(node))
    }

    /// Whether a durable WRITE to `remote` is durable before the later verbs of its batch
    /// execute ([`Connection::durable_in_order`]); false for a node this endpoint has no
    /// connection to.
    pub fn durable_in_order(&self, remote: RemoteAddr) -> bool {
        self.connection(remote.node)
            .is_ok_and(|c| c.durable_in_order(remote.rkey))
    }

    /// The regions `node` registered, as learned at connect.
    pub fn regions(&self, node: NodeId) -> Result<Vec<RegionDesc>> {
        Ok(self.connection(node)?.regions())
    }

    /// The region `node` registered as `name` ([`crate::MemoryNode::register_named`]), as
    /// learned at connect or at the last refresh.
    pub fn region_named(&self, node: NodeId, name: &str) -> Result<RegionDesc> {
        self.regions(node)?
            .into_iter()
            .find(|r| r.name.as_str() == name && !r.name.is_empty())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("memory node {node} has no region named {name:?}"))
            })
    }

    /// A handle sharing everything but the virtual clock, which starts at this one's time.
    pub fn fork(&self) -> Endpoint {
        Endpoint {
            inner: self.inner.clone(),
            clock: Arc::new(AtomicU64::new(self.clock.load(Ordering::Relaxed))),
        }
    }

    /// The accounting of this endpoint (and its clones).
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// Modeled time of this handle (sim with a latency model; zero otherwise).
    pub fn virtual_now(&self) -> Duration {
        Duration::from_nanos(self.clock.load(Ordering::Relaxed))
    }

    fn advance(&self, to: Option<u64>) {
        if let Some(t) = to {
            self.clock.fetch_max(t, Ordering::Relaxed);
        }
    }

    fn ctx(&self) -> PostCtx {
        PostCtx {
            virtual_now: self.clock.load(Ordering::Relaxed),
        }
    }

    /// A registered buffer of `len` zeroed bytes.
    pub fn buf(&self, len: usize) -> Result<MemBuf> {
        self.inner.alloc.alloc(len)
    }

    /// An empty batch for `node` using this endpoint's registered buffers.
    pub fn batch(&self, node: NodeId) -> Batch {
        Batch::with_allocator(node, self.inner.alloc.clone())
    }

    fn post_uncounted(&self, tag: Tag, batch: Batch) -> Pending<BatchResult> {
        self.post_counting(tag, batch, 0)
    }

    /// Posts `batch`, counting its verbs and `round_trips` for `tag` (one lookup of the
    /// tag's counters per post).
    fn post_counting(&self, tag: Tag, batch: Batch, round_trips: u64) -> Pending<BatchResult> {
        match self.counted_connection(tag, &batch, round_trips) {
            Ok(conn) => crate::record::timed("verbs.post", || conn.post(batch, self.ctx())),
            Err(e) => Pending::ready(batch.node(), Err(e)),
        }
    }

    /// The connection to post `batch` on, its verbs and `round_trips` counted for `tag`; a
    /// batch that cannot be posted counts its round trips and fails.
    fn counted_connection(
        &self,
        tag: Tag,
        batch: &Batch,
        round_trips: u64,
    ) -> Result<Arc<dyn Connection>> {
        let conn = batch
            .validate()
            .and_then(|()| self.connection(batch.node()));
        match conn {
            Ok(conn) => {
                self.inner.stats.ops(tag, &batch.ops, round_trips);
                Ok(conn)
            }
            Err(e) => {
                if round_trips > 0 {
                    self.inner.stats.round_trip(tag);
                }
                Err(e)
            }
        }
    }

    /// Posts a batch (one doorbell) and counts one round trip for `tag`. Wait on the result
    /// with [`Endpoint::wait`] so the modeled clock advances.
    pub fn post(&self, tag: Tag, batch: Batch) -> Pending<BatchResult> {
        if crate::record::enabled() {
            crate::record::round(tag, [&batch]);
        }
        self.post_counting(tag, batch, 1)
    }

    /// Waits for a completion, advancing this handle's modeled clock.
    pub fn wait<T: Send + 'static>(&self, p: Pending<T>) -> Result<T> {
        let at = p.modeled_done;
        let r = crate::record::timed("verbs.wait", || p.wait());
        self.advance(at);
        r
    }

    /// Posts a batch and waits for it: one round trip.
    pub fn execute(&self, tag: Tag, batch: Batch) -> Result<BatchResult> {
        if crate::record::enabled() {
            crate::record::round(tag, [&batch]);
        }
        // (Off a runtime's workers a backend may run it to completion right here.)
        if crate::runtime::on_worker() {
            let p = self.post_counting(tag, batch, 1);
            return self.wait(p);
        }
        let conn = self.counted_connection(tag, &batch, 1)?;
        // Nothing may wait on verbs this thread still holds back.
        crate::doorbell::ring_deferred();
        let posted = crate::record::timed("verbs.post", || conn.post_blocking(batch, self.ctx()));
        match posted {
            Executed::Done(r) => r,
            Executed::Posted(p) => self.wait(p),
        }
    }

    /// Posts batches to several nodes at once, then waits for all: one round trip in all.
    /// Results come back in the order of `batches`.
    pub fn execute_many(&self, tag: Tag, batches: Vec<Batch>) -> Vec<Result<BatchResult>> {
        let pending = self.post_many(tag, batches);
        pending.into_iter().map(|p| self.wait(p)).collect()
    }

    /// Posts batches to several nodes at once, counting one round trip in all.
    pub fn post_many(&self, tag: Tag, batches: Vec<Batch>) -> Vec<Pending<BatchResult>> {
        self.inner.stats.round_trip(tag);
        if crate::record::enabled() {
            crate::record::round(tag, &batches);
        }
        batches
            .into_iter()
            .map(|b| self.post_uncounted(tag, b))
            .collect()
    }

    /// Awaits a completion, advancing this handle's modeled clock: [`Endpoint::wait`] for
    /// async callers. Many such awaits may be in flight on one thread.
    pub async fn wait_async<T: Send + 'static>(&self, p: Pending<T>) -> Result<T> {
        let at = p.modeled_done;
        let r = crate::record::timed_async("verbs.wait", p).await;
        self.advance(at);
        r
    }

    /// [`Endpoint::execute`], awaited: one round trip.
    pub async fn execute_async(&self, tag: Tag, batch: Batch) -> Result<BatchResult> {
        let p = self.post(tag, batch);
        self.wait_async(p).await
    }

    /// [`Endpoint::execute_many`], awaited: one round trip in all.
    pub async fn execute_many_async(
        &self,
        tag: Tag,
        batches: Vec<Batch>,
    ) -> Vec<Result<BatchResult>> {
        let pending = self.post_many(tag, batches);
        let mut out = Vec::with_capacity(pending.len());
        // Everything is in flight already: awaiting in order costs no extra round trip.
        for p in pending {
            out.push(self.wait_async(p).await);
        }
        out
    }

    /// [`Endpoint::read`], awaited.
    pub async fn read_async(&self, tag: Tag, remote: RemoteAddr, len: usize) -> Result<Vec<u8>> {
        let mut b = self.batch(remote.node);
        let i = b.read(remote, len);
        let mut r = self.execute_async(tag, b).await?;
        Ok(r.take_buf(i).map(MemBuf::into_vec).unwrap_or_default())
    }

    /// [`Endpoint::write`], awaited.
    pub async fn write_async(&self, tag: Tag, remote: RemoteAddr, data: &[u8]) -> Result<()> {
        let mut b = self.batch(remote.node);
        b.write(remote, data);
        self.execute_async(tag, b).await.map(drop)
    }

    /// [`Endpoint::cas`], awaited.
    pub async fn cas_async(
        &self,
        tag: Tag,
        remote: RemoteAddr,
        expect: u64,
        new: u64,
    ) -> Result<u64> {
        let mut b = self.batch(remote.node);
        let i = b.cas(remote, expect, new);
        Ok(self.execute_async(tag, b).await?.old(i))
    }

    /// [`Endpoint::faa`], awaited.
    pub async fn faa_async(&self, tag: Tag, remote: RemoteAddr, add: u64) -> Result<u64> {
        let mut b = self.batch(remote.node);
        let i = b.faa(remote, add);
        Ok(self.execute_async(tag, b).await?.old(i))
    }

    /// [`Endpoint::rpc`], awaited.
    pub async fn rpc_async(&self, tag: Tag, node: NodeId, req: &[u8]) -> Result<Vec<u8>> {
        let conn = self.connection(node)?;
        self.inner.stats.round_trip(tag);
        self.inner.stats.rpc(tag, req.len());
        let p = conn.rpc(req, self.ctx());
        let r = self.wait_async(p).await?;
        self.inner.stats.rpc_reply(tag, r.len());
        Ok(r)
    }

    /// Posts an RPC to the node's handler and returns at once: the reply is the returned
    /// [`Pending`], for work off the caller's path (a lease renewed before it lapses, say).
    /// One round trip, counted under `tag`. Unlike [`Endpoint::rpc_async`], awaiting it does
    /// not advance this endpoint's modeled clock: on a latency model, nobody waited for it.
    pub fn post_rpc(&self, tag: Tag, node: NodeId, req: &[u8]) -> Result<Pending<Vec<u8>>> {
        let conn = self.connection(node)?;
        self.inner.stats.round_trip(tag);
        self.inner.stats.rpc(tag, req.len());
        Ok(conn.rpc(req, self.ctx()))
    }

    /// Work posted on this endpoint's connections and not yet completed (see
    /// [`Connection::in_flight`]).
    pub fn in_flight(&self) -> usize {
        self.inner
            .conns
            .read()
            .values()
            .map(|c| c.in_flight())
            .sum()
    }

    /// READ `len` bytes: one round trip.
    pub fn read(&self, tag: Tag, remote: RemoteAddr, len: usize) -> Result<Vec<u8>> {
        let mut b = self.batch(remote.node);
        let i = b.read(remote, len);
        let mut r = self.execute(tag, b)?;
        Ok(r.take_buf(i).map(MemBuf::into_vec).unwrap_or_default())
    }

    /// WRITE `data`: one round trip.
    pub fn write(&self, tag: Tag, remote: RemoteAddr, data: &[u8]) -> Result<()> {
        let mut b = self.batch(remote.node);
        b.write(remote, data);
        self.execute(tag, b).map(drop)
    }

    /// WRITE that is durable when it returns: one round trip.
    pub fn write_durable(&self, tag: Tag, remote: RemoteAddr, data: &[u8]) -> Result<()> {
        let mut b = self.batch(remote.node);
        b.write_durable(remote, data);
        self.execute(tag, b).map(drop)
    }

    /// CAS: one round trip; returns the old value (the swap happened iff it equals `expect`).
    pub fn cas(&self, tag: Tag, remote: RemoteAddr, expect: u64, new: u64) -> Result<u64> {
        let mut b = self.batch(remote.node);
        let i = b.cas(remote, expect, new);
        Ok(self.execute(tag, b)?.old(i))
    }

    /// FAA: one round trip; returns the old value.
    pub fn faa(&self, tag: Tag, remote: RemoteAddr, add: u64) -> Result<u64> {
        let mut b = self.batch(remote.node);
        let i = b.faa(remote, add);
        Ok(self.execute(tag, b)?.old(i))
    }

    /// Two-sided RPC to the node's handler: one round trip.
    pub fn rpc(&self, tag: Tag, node: NodeId, req: &[u8]) -> Result<Vec<u8>> {
        let conn = self.connection(node)?;
        self.inner.stats.round_trip(tag);
        self.inner.stats.rpc(tag, req.len());
        let p = conn.rpc(req, self.ctx());
        let r = self.wait(p)?;
        self.inner.stats.rpc_reply(tag, r.len());
        Ok(r)
    }

    /// Proxied write: stages `data` in registered memory, posts the WRITE and returns at once.
    /// The returned confirm fires when the node has executed it. When staging is full the
    /// caller waits for earlier writes to complete (back-pressure).
    pub fn proxied_write(
        &self,
        tag: Tag,
        remote: RemoteAddr,
        data: &[u8],
        durable: bool,
    ) -> Result<WriteConfirm> {
        let charge = self.staging_charge(data.len())?;
        let staging = &self.inner.staging;
        staging.reserve(charge)?;
        self.stage_and_post(tag, remote, data, durable, charge)
    }

    /// [`Endpoint::proxied_write`] for async callers: under back-pressure the task awaits
    /// earlier writes' completions instead of blocking its thread.
    pub async fn proxied_write_async(
        &self,
        tag: Tag,
        remote: RemoteAddr,
        data: &[u8],
        durable: bool,
    ) -> Result<WriteConfirm> {
        let charge = self.staging_charge(data.len())?;
        let staging = &self.inner.staging;
        while !staging.try_reserve(charge) {
            match staging.pop_oldest() {
                Some(Tracked { state, pending }) => {
                    let r = pending.await;
                    settle_tracked(&state, r);
                }
                // Someone else's write holds the room and is not tracked yet: look again soon.
                None => crate::pending::timer::sleep(Duration::from_millis(1)).await,
            }
        }
        self.stage_and_post(tag, remote, data, durable, charge)
    }

    /// The staging charge of a proxied write of `len` bytes (refused if it can never fit).
    fn staging_charge(&self, len: usize) -> Result<usize> {
        let charge = len.max(MIN_STAGE_CHARGE);
        let capacity = self.inner.staging.capacity;
        if charge > capacity {
            return Err(Error::InvalidArgument(format!(
                "proxied write of {len} bytes exceeds the staging capacity of {capacity} bytes"
            )));
        }
        Ok(charge)
    }

    /// Stages `data` (its `charge` already reserved) and posts the WRITE.
    fn stage_and_post(
        &self,
        tag: Tag,
        remote: RemoteAddr,
        data: &[u8],
        durable: bool,
        charge: usize,
    ) -> Result<WriteConfirm> {
        let staging = &self.inner.staging;
        let mut buf = match self.buf(data.len()) {
            Ok(b) => b,
            Err(e) => {
                staging.release(charge);
                return Err(e);
            }
        };
        buf.copy_from_slice(data);
        let mut b = self.batch(remote.node);
        b.write_buf(remote, buf, durable);
        let pending = self.post(tag, b);
        let state = Arc::new(ConfirmState {
            result: Mutex::new(None),
            cv: Condvar::new(),
            waker: Mutex::new(None),
            modeled_done: pending.modeled_done,
        });
        let st = state.clone();
        let stg = self.inner.clone();
        // Staging is released by whoever delivers the completion (the backend's thread), so
        // the bound holds even if nobody ever waits on the confirm.
        pending.on_complete(move |r| {
            // Release first: whoever sees the confirm must also see the staging freed.
            stg.staging.release(charge);
            st.settle(match r {
                Ok(_) => Ok(()),
                Err(e) => Err(e.clone_shallow()),
            });
        });
        staging.track(state.clone(), pending);
        Ok(WriteConfirm {
            state,
            clock: self.clock.clone(),
        })
    }

    /// Waits until every proxied write posted so far is confirmed; returns the first failure.
    pub fn flush(&self) -> Result<()> {
        self.inner.staging.flush(&self.clock)
    }

    /// [`Endpoint::flush`] for async callers.
    pub async fn flush_async(&self) -> Result<()> {
        self.inner.staging.flush_async(&self.clock).await
    }

    /// Bytes currently staged by proxied writes.
    pub fn staging_in_use(&self) -> usize {
        *self.inner.staging.used.lock()
    }

    /// The most bytes ever staged at once.
    pub fn staging_high_water(&self) -> usize {
        self.inner.staging.high_water.load(Ordering::Relaxed)
    }

    /// The staging capacity.
    pub fn staging_capacity(&self) -> usize {
        self.inner.staging.capacity
    }
}

#[derive(Debug)]
struct ConfirmState {
    result: Mutex<Option<Result<()>>>,
    cv: Condvar,
    /// The task awaiting [`WriteConfirm::confirmed`].
    waker: Mutex<Option<std::task::Waker>>,
    modeled_done: Option<u64>,
}

impl ConfirmState {
    /// Records the outcome (the first one wins) and wakes every waiter.
    fn settle(&self, r: Result<()>) {
        {
            let mut g = self.result.lock();
            if g.is_some() {
                return;
            }
            *g = Some(r);
            self.cv.notify_all();
        }
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }
}

/// Delivers an awaited tracked completion's failure (a timeout) to its confirm.
fn settle_tracked(state: &ConfirmState, r: Result<BatchResult>) {
    if let Err(e) = r {
        state.settle(Err(e));
    }
}

/// Fires when a proxied write has really completed at the memory node.
#[derive(Debug)]
pub struct WriteConfirm {
    state: Arc<ConfirmState>,
    clock: Arc<AtomicU64>,
}

impl WriteConfirm {
    /// Whether the write has completed (successfully or not).
    pub fn is_confirmed(&self) -> bool {
        self.state.result.lock().is_some()
    }

    /// Blocks until the write completed at the node; its outcome.
    pub fn wait(&self) -> Result<()> {
        let r = wait_confirm(&self.state);
        if let Some(t) = self.state.modeled_done {
            self.clock.fetch_max(t, Ordering::Relaxed);
        }
        r
    }

    /// Completes when the write completed at the node: [`WriteConfirm::wait`] for async
    /// callers.
    pub async fn confirmed(&self) -> Result<()> {
        let r = std::future::poll_fn(|cx| {
            if let Some(r) = self.state.result.lock().as_ref() {
                return std::task::Poll::Ready(match r {
                    Ok(()) => Ok(()),
                    Err(e) => Err(e.clone_shallow()),
                });
            }
            *self.state.waker.lock() = Some(cx.waker().clone());
            // Settled between the check and the registration: do not miss it.
            match self.state.result.lock().as_ref() {
                Some(Ok(())) => std::task::Poll::Ready(Ok(())),
                Some(Err(e)) => std::task::Poll::Ready(Err(e.clone_shallow())),
                None => std::task::Poll::Pending,
            }
        })
        .await;
        if let Some(t) = self.state.modeled_done {
            self.clock.fetch_max(t, Ordering::Relaxed);
        }
        r
    }
}

fn wait_confirm(state: &ConfirmState) -> Result<()> {
    crate::doorbell::ring_deferred();
    let mut g = state.result.lock();
    loop {
        if let Some(r) = g.as_ref() {
            return match r {
                Ok(()) => Ok(()),
                Err(e) => Err(e.clone_shallow()),
            };
        }
        state.cv.wait(&mut g);
    }
}

/// Bounded staging for proxied writes.
#[derive(Debug)]
struct Staging {
    capacity: usize,
    used: Mutex<usize>,
    cv: Condvar,
    high_water: AtomicUsize,
    /// Outstanding confirms with their completions, oldest first; a pending is waited here
    /// (which enforces its timeout) by writers under back-pressure and by flush.
    outstanding: Mutex<VecDeque<Tracked>>,
    /// `dmkit_verbs_staging_bytes`: staging in use, summed over the process's endpoints.
    in_use: metrics::Gauge,
}

/// A proxied write in flight: its confirm and its completion.
#[derive(Debug)]
struct Tracked {
    state: Arc<ConfirmState>,
    pending: Pending<BatchResult>,
}

impl Staging {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            used: Mutex::new(0),
            cv: Condvar::new(),
            high_water: AtomicUsize::new(0),
            outstanding: Mutex::new(VecDeque::new()),
            in_use: metrics::gauge!("dmkit_verbs_staging_bytes"),
        }
    }

    fn reserve(&self, n: usize) -> Result<()> {
        loop {
            if self.try_reserve(n) {
                return Ok(());
            }
            // Full: wait for the oldest outstanding write (its timeout bounds the wait).
            if !self.wait_oldest() {
                let mut u = self.used.lock();
                if *u + n > self.capacity {
                    self.cv.wait_for(&mut u, Duration::from_millis(10));
                }
            }
        }
    }

    /// Reserves `n` bytes if they are free now.
    fn try_reserve(&self, n: usize) -> bool {
        let mut u = self.used.lock();
        if *u + n <= self.capacity {
            *u += n;
            self.high_water.fetch_max(*u, Ordering::Relaxed);
            self.in_use.increment(n as f64);
            true
        } else {
            false
        }
    }

    /// Takes the oldest write still in flight off the queue (to be waited on by the caller).
    fn pop_oldest(&self) -> Option<Tracked> {
        let mut q = self.outstanding.lock();
        loop {
            match q.pop_front() {
                None => return None,
                Some(t) if t.state.result.lock().is_some() => continue,
                Some(t) => return Some(t),
            }
        }
    }

    fn release(&self, n: usize) {
        let mut u = self.used.lock();
        self.in_use.decrement(n.min(*u) as f64);
        *u = u.saturating_sub(n);
        self.cv.notify_all();
    }

    fn track(&self, state: Arc<ConfirmState>, pending: Pending<BatchResult>) {
        let mut q = self.outstanding.lock();
        // Forget confirmed ones at the front so the queue stays as short as what is in flight.
        while q.front().is_some_and(|t| t.state.result.lock().is_some()) {
            q.pop_front();
        }
        q.push_back(Tracked { state, pending });
    }

    /// Waits for the oldest outstanding write; false if there is none.
    fn wait_oldest(&self) -> bool {
        let Some(Tracked { state, pending }) = self.pop_oldest() else {
            return false;
        };
        settle_tracked(&state, pending.wait());
        true
    }

    fn flush(&self, clock: &AtomicU64) -> Result<()> {
        let mut first_err = None;
        loop {
            let item = self.outstanding.lock().pop_front();
            let Some(Tracked { state, pending }) = item else {
                break;
            };
            let _ = pending.wait();
            flushed(&state, clock, &mut first_err);
        }
        first_err.map_or(Ok(()), Err)
    }

    async fn flush_async(&self, clock: &AtomicU64) -> Result<()> {
        let mut first_err = None;
        loop {
            let item = self.outstanding.lock().pop_front();
            let Some(Tracked { state, pending }) = item else {
                break;
            };
            let _ = pending.await;
            flushed(&state, clock, &mut first_err);
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// After a flush waited on a write: its modeled time, and its failure if it is the first.
fn flushed(state: &ConfirmState, clock: &AtomicU64, first_err: &mut Option<Error>) {
    let g = state.result.lock();
    if let Some(t) = state.modeled_done {
        clock.fetch_max(t, Ordering::Relaxed);
    }
    if let Some(Err(e)) = g.as_ref() {
        first_err.get_or_insert_with(|| e.clone_shallow());
    }
}
